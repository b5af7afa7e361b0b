//! The byte layout of a ring segment, version 1 (docs/ring-layout.md).
//!
//! ```text
//! offset 0                 Header (4096 bytes)
//! HEADER_BYTES             RankBlock × W            (256 bytes each)
//! slot_table_offset        SlotMeta  × W·K          (slot_meta_bytes each; page-aligned start)
//! payload_offset           payload   × W·K          (slot_payload_bytes each; page-aligned)
//! ```
//! Slot `r·K + i` is the i-th slot of rank r. Every offset is recomputed
//! from the header's counts with checked arithmetic (`Layout::compute`), by
//! the loader when it creates a segment and by every consumer when it attaches;
//! no stored offset is ever used without being compared to the recomputed one.

use crate::sync::{AtomicU32, AtomicU64};

/// "RINGFEED" read as a little-endian u64: the first 8 bytes of every segment.
pub const MAGIC: u64 = u64::from_le_bytes(*b"RINGFEED");
/// Version of this byte layout and protocol. A consumer refuses any other.
pub const ABI_VERSION: u32 = 1;
/// Page size the layout aligns to. Payloads start on such a boundary so that a
/// trainer can pin them (`cudaHostRegister`) and DMA straight from the ring.
pub const PAGE_BYTES: u64 = 4096;
/// Size of the header region at offset 0.
pub const HEADER_BYTES: u64 = 4096;
/// Size of one rank's control block.
pub const RANK_BLOCK_BYTES: u64 = 256;
/// Fixed part of one slot's metadata, before its sample table.
pub const SLOT_META_FIXED_BYTES: u64 = 128;
/// One entry of a slot's sample table: offset, length, sample index.
pub const SAMPLE_ENTRY_BYTES: u64 = 24;
/// Most ranks one loader serves. 128 is also the most futexes one
/// `futex_waitv` call waits on, which the loader uses to sleep on all ranks.
pub const MAX_RANKS: u32 = 128;
/// Most slots per rank.
pub const MAX_SLOTS_PER_RANK: u32 = 1024;
/// Most samples in one batch slot.
pub const MAX_SAMPLES_PER_SLOT: u32 = 1 << 20;
/// Largest payload of one slot (64 GiB).
pub const MAX_SLOT_PAYLOAD_BYTES: u64 = 1 << 36;
/// Largest whole segment (16 TiB): far above any machine's memory, low
/// enough that no sum of in-range fields can overflow u64.
pub const MAX_SEGMENT_BYTES: u64 = 1 << 44;

/// Loader states, in `Header::state`. Only the loader writes it.
pub mod state {
    /// The loader is still building the segment: not yet valid to read.
    pub const CREATING: u32 = 0;
    /// Open for consumers.
    pub const READY: u32 = 1;
    /// Every batch of the run was published (per-rank `finished` says so too).
    pub const ENDED: u32 = 2;
    /// The loader stopped before the end (`abort_code` says why).
    pub const ABORTED: u32 = 3;
}

/// Bits of [`Header::flags`].
pub mod flags {
    /// `start_epoch`, `start_samples` and `dataset_samples` hold the
    /// loader's [`RunStart`](super::RunStart).
    pub const START_KNOWN: u32 = 1;
    /// `order_seed` and `order_shuffled` hold the loader's
    /// [`RunOrder`](super::RunOrder).
    pub const ORDER_KNOWN: u32 = 2;
    /// The loader waits for every rank's start request before it serves
    /// (`serve --resume auto`); `START_KNOWN` follows once they agree.
    pub const AWAITS_START: u32 = 4;
    /// Samples are decoded images: `image_shape`, `image_flags`,
    /// `labels_offset` and `bad_offset` hold the loader's
    /// [`ImageFormat`](super::ImageFormat).
    pub const IMAGES_KNOWN: u32 = 8;
    /// Each slot keeps its samples' keys: `key_area_offset` and
    /// `key_stride` hold the loader's [`KeyArea`](super::KeyArea).
    pub const KEYS_KNOWN: u32 = 1 << 6;
    /// Slot 0's payload holds the class names: `class_names_offset`,
    /// `class_names_bytes` and `class_names_count` hold the loader's
    /// [`ClassNames`](super::ClassNames).
    pub const CLASS_NAMES_KNOWN: u32 = 1 << 7;
    /// `tail_mode` and `steps_per_epoch` hold how an epoch ends
    /// ([`Tail`](crate::resume::Tail)) and the steps of a whole epoch; set
    /// with `dataset_samples`. Clear: the tail is dropped (every loader
    /// that predates the field dropped it).
    pub const TAIL_KNOWN: u32 = 16;
    /// `run_epochs`, `epoch_steps` and `run_batch_size` hold the loader's
    /// [`RunShape`](super::RunShape), and the counters block's `Progress*`
    /// words are live (bit 8). Set once, after READY, with a Release
    /// read-modify-write: a reader that sees it (Acquire) sees the fields.
    pub const PROGRESS_KNOWN: u32 = 256;
    /// Samples are token windows: the header's `tokens` words hold the
    /// loader's [`TokenFormat`](super::TokenFormat) (docs/tokens.md).
    pub const TOKENS_KNOWN: u32 = 32;
}

mod counters;
mod job;
mod names;
mod progress;
mod tokens;
pub use counters::{Counter, Counters, COUNTERS_OFFSET, COUNTER_WORDS};
pub use job::{ImageFormat, Job, RunOrder, RunStart};
pub use names::{
    ClassNames, KeyArea, SampleKey, CLASS_NAMES_BYTES_MAX, CLASS_NAMES_MAX, KEY_BYTES_MAX,
    KEY_HEAD_BYTES, NOT_A_RECORD,
};
pub use progress::{Progress, RunShape, PROGRESS_OFFSET};
pub use tokens::{TokenFormat, MAX_DOC_STARTS, TOKENS_OFFSET, TOKEN_WORDS};

/// Segment header at offset 0. Fields up to `plan_digest` are written once
/// by the loader before `state` becomes READY and never again.
#[repr(C)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: AtomicU64,
    /// [`ABI_VERSION`].
    pub abi_version: AtomicU32,
    /// [`HEADER_BYTES`].
    pub header_bytes: AtomicU32,
    /// W: number of ranks.
    pub world_size: AtomicU32,
    /// K: slots per rank.
    pub slots_per_rank: AtomicU32,
    /// M: capacity of each slot's sample table.
    pub max_samples_per_slot: AtomicU32,
    /// [`PAGE_BYTES`].
    pub page_bytes: AtomicU32,
    /// S: payload bytes of each slot, a multiple of the page size.
    pub slot_payload_bytes: AtomicU64,
    /// Total size of the segment in bytes.
    pub segment_bytes: AtomicU64,
    /// Offset of the rank table (always HEADER_BYTES in v1).
    pub rank_table_offset: AtomicU64,
    /// Offset of the slot table.
    pub slot_table_offset: AtomicU64,
    /// Offset of the first slot payload.
    pub payload_offset: AtomicU64,
    /// Stride of the slot table.
    pub slot_meta_bytes: AtomicU64,
    /// Loader's pid, for messages only (liveness is the kernel lock).
    pub loader_pid: AtomicU32,
    /// [`flags`] bits (0 from a loader that predates them).
    pub flags: AtomicU32,
    /// Wall-clock creation time.
    pub created_unix_ms: AtomicU64,
    /// Ranks of the whole training job, all machines (0 from a loader that
    /// predates the field: then `world_size`). See [`Job`].
    pub job_world_size: AtomicU32,
    /// Job rank of this ring's rank 0 (0 from a loader that predates the
    /// field). See [`Job`].
    pub first_rank: AtomicU32,
    /// [`Job::plan_digest`] (0: not known).
    pub plan_digest: AtomicU64,
    /// [`RunStart::epoch`] (valid with [`flags::START_KNOWN`]).
    pub start_epoch: AtomicU64,
    /// [`RunStart::samples_consumed`] (valid with [`flags::START_KNOWN`]).
    pub start_samples: AtomicU64,
    // --- offset 128: written by the loader while it runs ---
    /// One of [`state`].
    pub state: AtomicU32,
    /// Why the loader aborted: a signal number, or 0 for an error.
    pub abort_code: AtomicU32,
    /// Non-zero while the loader sleeps waiting for a release (consumers wake it).
    pub producer_sleeping: AtomicU32,
    /// Reads the loader has in flight (for `ringfeed stat`).
    pub reads_in_flight: AtomicU32,
    /// Batches published since start, all ranks.
    pub batches_published: AtomicU64,
    /// Payload bytes published since start, all ranks.
    pub bytes_published: AtomicU64,
    /// Reader backend name, ASCII, NUL-padded (for `ringfeed stat`).
    pub reader_backend: [AtomicU64; 2],
    /// [`RunStart::dataset_samples`] (valid with [`flags::START_KNOWN`]):
    /// written once before READY, like the fields before offset 128.
    pub dataset_samples: AtomicU64,
    /// [`RunOrder::seed`] (valid with [`flags::ORDER_KNOWN`]): written once
    /// before READY.
    pub order_seed: AtomicU64,
    /// [`RunOrder::shuffled`], 1 or 0 (valid with [`flags::ORDER_KNOWN`]):
    /// written once before READY.
    pub order_shuffled: AtomicU64,
    /// A block order's shape (valid with [`flags::ORDER_KNOWN`]):
    /// [`RunOrder::block_samples`] in the high 32 bits,
    /// [`RunOrder::window_blocks`] in the low 32; 0 for the exact shuffle or
    /// none (and from a loader that predates the field). Written once
    /// before READY.
    pub order_block: AtomicU64,
    /// [`ImageFormat`]'s height in the high 32 bits and width in the low 32
    /// (valid with [`flags::IMAGES_KNOWN`]): written once before READY.
    pub image_shape: AtomicU64,
    /// [`ImageFormat`]'s classes in the high 32 bits; bit 0: channel-first
    /// (valid with [`flags::IMAGES_KNOWN`]): written once before READY.
    pub image_flags: AtomicU64,
    /// [`ImageFormat::labels_offset`] (valid with [`flags::IMAGES_KNOWN`]).
    pub labels_offset: AtomicU64,
    /// [`ImageFormat::bad_offset`] (valid with [`flags::IMAGES_KNOWN`]).
    pub bad_offset: AtomicU64,
    /// [`Tail::word`](crate::resume::Tail::word): 0 drop, 1 keep (valid
    /// with [`flags::TAIL_KNOWN`]): written once before READY.
    pub tail_mode: AtomicU64,
    /// Steps every rank takes in a whole epoch, `resume::steps_in_epoch(n,
    /// 0, job W × M, tail)` (valid with [`flags::TAIL_KNOWN`]): written once
    /// before READY; a consumer refuses a header where it is not that.
    pub steps_per_epoch: AtomicU64,
    // --- offset 256: the loader's last word, written before ABORTED ---
    /// Bytes of `abort_message` in use (0: none; a loader that predates the
    /// field leaves it 0).
    pub abort_message_bytes: AtomicU64,
    /// Why the loader stopped, UTF-8, [`ABORT_MESSAGE_MAX_BYTES`] at most:
    /// what trainers report instead of "see its log". See [`crate::message`].
    pub abort_message: [AtomicU64; ABORT_MESSAGE_WORDS],
    // --- offset 1288: the loader's counters, rewritten every ~100 ms ---
    /// Figures for `ringfeed stat`, one word per [`Counter`]; Relaxed.
    pub counters: [AtomicU64; COUNTER_WORDS],
    // --- offset 1544 to 1608: the token format (issue 38) ---
    /// [`TokenFormat`] as [`TokenFormat::to_words`] writes it (valid with
    /// [`flags::TOKENS_KNOWN`]): written once before READY.
    pub tokens: [AtomicU64; TOKEN_WORDS],
    // --- offset 1608: keys and class names, written once before READY ---
    /// [`KeyArea::offset`] (valid with [`flags::KEYS_KNOWN`]).
    pub key_area_offset: AtomicU64,
    /// [`KeyArea::stride`] (valid with [`flags::KEYS_KNOWN`]).
    pub key_stride: AtomicU64,
    /// [`ClassNames::offset`] (valid with [`flags::CLASS_NAMES_KNOWN`]).
    pub class_names_offset: AtomicU64,
    /// [`ClassNames::bytes`] (valid with [`flags::CLASS_NAMES_KNOWN`]).
    pub class_names_bytes: AtomicU64,
    /// [`ClassNames::count`] (valid with [`flags::CLASS_NAMES_KNOWN`]).
    pub class_names_count: AtomicU64,
    _names_reserved: [AtomicU64; 3],
    // --- offset 1672: the run's shape, for progress (flags::PROGRESS_KNOWN) ---
    /// [`RunShape::epochs`]: the run's `--epochs` (valid with
    /// [`flags::PROGRESS_KNOWN`]).
    pub run_epochs: AtomicU64,
    /// [`RunShape::epoch_steps`]: steps each rank gets in a whole epoch
    /// (valid with [`flags::PROGRESS_KNOWN`]).
    pub epoch_steps: AtomicU64,
    /// [`RunShape::batch_size`]: samples per rank per step (valid with
    /// [`flags::PROGRESS_KNOWN`]).
    pub run_batch_size: AtomicU64,
    _progress_reserved: [AtomicU64; 5],
    // --- offset 1736 to 4064: reserved ---
    _reserved3: [AtomicU64; 291],
    // --- offset 4064: the loader's release, here in every ABI version ---
    /// The loader's ringfeed release (its package version, as `ringfeed
    /// --version` says it), UTF-8, NUL-padded, [`LOADER_RELEASE_BYTES`] at
    /// most: at [`LOADER_RELEASE_OFFSET`] in every ABI version, so that a
    /// trainer of another ABI can name it. All zero from a loader that
    /// predates the field.
    pub loader_release: [AtomicU64; LOADER_RELEASE_BYTES / 8],
}

/// Where the loader's release sits in the header, in every ABI version.
pub const LOADER_RELEASE_OFFSET: usize = 4064;
/// Bytes the header gives the loader's release.
pub const LOADER_RELEASE_BYTES: usize = 32;

/// Longest abort message the header holds, in bytes.
pub const ABORT_MESSAGE_MAX_BYTES: usize = 1024;
/// [`ABORT_MESSAGE_MAX_BYTES`] in the header's 8-byte words.
pub const ABORT_MESSAGE_WORDS: usize = ABORT_MESSAGE_MAX_BYTES / 8;

/// One rank's control block. The first cache line is the loader's, the second
/// belongs to whichever process holds the rank's lock (its consumer, or the
/// loader while it reclaims a dead consumer's slots).
#[repr(C)]
pub struct RankBlock {
    /// Batches published to this rank so far (loader).
    pub published: AtomicU64,
    /// Low 32 bits of `published`: the futex a sleeping consumer waits on (loader).
    pub publish_futex: AtomicU32,
    /// Non-zero once the loader will publish nothing more to this rank (loader).
    pub finished: AtomicU32,
    /// Batches this rank gets in the whole run, or u64::MAX if unknown (loader).
    pub batches_expected: AtomicU64,
    _loader_pad: [AtomicU64; 5],
    // --- offset 64: the rank lock holder's line ---
    /// Batches taken by `next` so far (consumer).
    pub consumed: AtomicU64,
    /// Bumped on every release: the futex the loader sleeps on (consumer).
    pub release_futex: AtomicU32,
    /// Non-zero while the consumer sleeps waiting for a batch (consumer).
    pub consumer_sleeping: AtomicU32,
    /// Pid of the attached consumer, 0 if none (messages only).
    pub consumer_pid: AtomicU32,
    /// Attaches to this rank so far.
    pub attach_count: AtomicU32,
    /// Nanoseconds the consumer spent waiting inside `next` (for `stat`).
    pub wait_ns_total: AtomicU64,
    /// Batches released so far (for `stat`).
    pub released_total: AtomicU64,
    /// Payload bytes of the batches taken by `next` so far (for `stat`).
    pub bytes_consumed: AtomicU64,
    _consumer_pad: [AtomicU64; 2],
    // --- offset 128: the rank's start request (consumer), see crate::start ---
    /// 0 none yet; 1 from the loader's own start; 2 at `requested_*`.
    pub start_request: AtomicU32,
    _start_pad: AtomicU32,
    /// Epoch of the requested start (with `start_request` 2).
    pub requested_epoch: AtomicU64,
    /// Samples of that epoch consumed before it (with `start_request` 2).
    pub requested_samples: AtomicU64,
    // --- offset 152 to 256: reserved ---
    _reserved: [AtomicU64; 13],
}

/// Fixed part of a slot's metadata; the sample table follows at offset 128.
#[repr(C)]
pub struct SlotMeta {
    /// Generation of the batch in this slot: seq / K + 1 for the seq-th batch
    /// of the rank (loader, written before `published`).
    pub generation: AtomicU64,
    /// Epoch of the batch (loader).
    pub epoch: AtomicU64,
    /// Step of the batch within its epoch (loader).
    pub step: AtomicU64,
    /// Samples in the batch (loader).
    pub n_samples: AtomicU32,
    /// Rank the slot belongs to, a redundant check (loader).
    pub rank: AtomicU32,
    /// Payload bytes in use (loader).
    pub payload_used_bytes: AtomicU64,
    _loader_pad: [AtomicU64; 3],
    // --- offset 64: the rank lock holder's line ---
    /// Last generation released (consumer); the slot is free when it equals `generation`.
    pub released: AtomicU64,
    _consumer_pad: [AtomicU64; 7],
}

/// One entry of a slot's sample table, as stored in the segment.
#[repr(C)]
pub struct SampleEntryCell {
    /// Offset of the sample's bytes from the start of the slot payload.
    pub offset: AtomicU64,
    /// Length of the sample in bytes.
    pub len: AtomicU64,
    /// The sample's index in the manifest.
    pub index: AtomicU64,
}

/// Blocks built on the heap for the loom model (tests/loom_handoff.rs) and
/// the unit tests of `protocol.rs`. In
/// the product they only ever exist inside a mapping; under loom the atomics
/// are model objects, not plain integers, so the model needs real values.
#[cfg(any(loom, test))]
mod model {
    use super::{RankBlock, SlotMeta};
    use crate::sync::{AtomicU32, AtomicU64};

    fn zeros<const N: usize>() -> [AtomicU64; N] {
        std::array::from_fn(|_| AtomicU64::new(0))
    }

    impl RankBlock {
        /// An all-zero rank block, as the loader's fallocate leaves it.
        pub fn new_for_model() -> RankBlock {
            RankBlock {
                published: AtomicU64::new(0),
                publish_futex: AtomicU32::new(0),
                finished: AtomicU32::new(0),
                batches_expected: AtomicU64::new(u64::MAX),
                _loader_pad: zeros(),
                consumed: AtomicU64::new(0),
                release_futex: AtomicU32::new(0),
                consumer_sleeping: AtomicU32::new(0),
                consumer_pid: AtomicU32::new(0),
                attach_count: AtomicU32::new(0),
                wait_ns_total: AtomicU64::new(0),
                released_total: AtomicU64::new(0),
                bytes_consumed: AtomicU64::new(0),
                _consumer_pad: zeros(),
                start_request: AtomicU32::new(0),
                _start_pad: AtomicU32::new(0),
                requested_epoch: AtomicU64::new(0),
                requested_samples: AtomicU64::new(0),
                _reserved: zeros(),
            }
        }
    }

    impl SlotMeta {
        /// An all-zero slot (generation 0, released 0: free for generation 1).
        pub fn new_for_model() -> SlotMeta {
            SlotMeta {
                generation: AtomicU64::new(0),
                epoch: AtomicU64::new(0),
                step: AtomicU64::new(0),
                n_samples: AtomicU32::new(0),
                rank: AtomicU32::new(0),
                payload_used_bytes: AtomicU64::new(0),
                _loader_pad: zeros(),
                released: AtomicU64::new(0),
                _consumer_pad: zeros(),
            }
        }
    }
}

#[cfg(not(loom))]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<Header>() as u64 == HEADER_BYTES);
    assert!(offset_of!(Header, loader_release) == LOADER_RELEASE_OFFSET);
    assert!(LOADER_RELEASE_OFFSET + LOADER_RELEASE_BYTES == HEADER_BYTES as usize);
    assert!(offset_of!(Header, abi_version) == 8);
    assert!(offset_of!(Header, world_size) == 16);
    assert!(offset_of!(Header, slots_per_rank) == 20);
    assert!(offset_of!(Header, max_samples_per_slot) == 24);
    assert!(offset_of!(Header, page_bytes) == 28);
    assert!(offset_of!(Header, slot_payload_bytes) == 32);
    assert!(offset_of!(Header, segment_bytes) == 40);
    assert!(offset_of!(Header, rank_table_offset) == 48);
    assert!(offset_of!(Header, slot_table_offset) == 56);
    assert!(offset_of!(Header, payload_offset) == 64);
    assert!(offset_of!(Header, slot_meta_bytes) == 72);
    assert!(offset_of!(Header, loader_pid) == 80);
    assert!(offset_of!(Header, created_unix_ms) == 88);
    assert!(offset_of!(Header, job_world_size) == 96);
    assert!(offset_of!(Header, first_rank) == 100);
    assert!(offset_of!(Header, plan_digest) == 104);
    assert!(offset_of!(Header, start_epoch) == 112);
    assert!(offset_of!(Header, start_samples) == 120);
    assert!(offset_of!(Header, state) == 128);
    assert!(offset_of!(Header, abort_code) == 132);
    assert!(offset_of!(Header, producer_sleeping) == 136);
    assert!(offset_of!(Header, reads_in_flight) == 140);
    assert!(offset_of!(Header, batches_published) == 144);
    assert!(offset_of!(Header, bytes_published) == 152);
    assert!(offset_of!(Header, reader_backend) == 160);
    assert!(offset_of!(Header, dataset_samples) == 176);
    assert!(offset_of!(Header, order_seed) == 184);
    assert!(offset_of!(Header, order_shuffled) == 192);
    assert!(offset_of!(Header, order_block) == 200);
    assert!(offset_of!(Header, image_shape) == 208);
    assert!(offset_of!(Header, image_flags) == 216);
    assert!(offset_of!(Header, labels_offset) == 224);
    assert!(offset_of!(Header, bad_offset) == 232);
    assert!(offset_of!(Header, tail_mode) == 240);
    assert!(offset_of!(Header, steps_per_epoch) == 248);
    assert!(offset_of!(Header, abort_message_bytes) == 256);
    assert!(offset_of!(Header, abort_message) == 264);
    assert!(offset_of!(Header, counters) == 264 + ABORT_MESSAGE_MAX_BYTES);
    assert!(offset_of!(Header, counters) == COUNTERS_OFFSET);
    assert!(offset_of!(Header, tokens) == COUNTERS_OFFSET + COUNTER_WORDS * 8);
    assert!(offset_of!(Header, tokens) == TOKENS_OFFSET);
    assert!(offset_of!(Header, key_area_offset) == TOKENS_OFFSET + TOKEN_WORDS * 8);
    assert!(offset_of!(Header, key_area_offset) == 1608);
    assert!(offset_of!(Header, key_stride) == 1616);
    assert!(offset_of!(Header, class_names_offset) == 1624);
    assert!(offset_of!(Header, class_names_bytes) == 1632);
    assert!(offset_of!(Header, class_names_count) == 1640);
    assert!(offset_of!(Header, run_epochs) == PROGRESS_OFFSET);
    assert!(offset_of!(Header, epoch_steps) == PROGRESS_OFFSET + 8);
    assert!(offset_of!(Header, run_batch_size) == PROGRESS_OFFSET + 16);
    assert!(offset_of!(Header, _reserved3) == PROGRESS_OFFSET + 64);
    assert!(size_of::<RankBlock>() as u64 == RANK_BLOCK_BYTES);
    assert!(offset_of!(RankBlock, publish_futex) == 8);
    assert!(offset_of!(RankBlock, finished) == 12);
    assert!(offset_of!(RankBlock, batches_expected) == 16);
    assert!(offset_of!(RankBlock, consumed) == 64);
    assert!(offset_of!(RankBlock, release_futex) == 72);
    assert!(offset_of!(RankBlock, consumer_sleeping) == 76);
    assert!(offset_of!(RankBlock, consumer_pid) == 80);
    assert!(offset_of!(RankBlock, attach_count) == 84);
    assert!(offset_of!(RankBlock, wait_ns_total) == 88);
    assert!(offset_of!(RankBlock, released_total) == 96);
    assert!(offset_of!(RankBlock, bytes_consumed) == 104);
    assert!(offset_of!(RankBlock, start_request) == 128);
    assert!(offset_of!(RankBlock, requested_epoch) == 136);
    assert!(offset_of!(RankBlock, requested_samples) == 144);
    assert!(offset_of!(RankBlock, _reserved) == 152);
    assert!(size_of::<SlotMeta>() as u64 == SLOT_META_FIXED_BYTES);
    assert!(offset_of!(SlotMeta, epoch) == 8);
    assert!(offset_of!(SlotMeta, step) == 16);
    assert!(offset_of!(SlotMeta, n_samples) == 24);
    assert!(offset_of!(SlotMeta, rank) == 28);
    assert!(offset_of!(SlotMeta, payload_used_bytes) == 32);
    assert!(offset_of!(SlotMeta, released) == 64);
    assert!(size_of::<SampleEntryCell>() as u64 == SAMPLE_ENTRY_BYTES);
    assert!(HEADER_BYTES.is_multiple_of(PAGE_BYTES));
};

/// The numbers a ring is made from. Everything else is derived from these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingGeometry {
    /// W: ranks.
    pub world_size: u32,
    /// K: slots per rank.
    pub slots_per_rank: u32,
    /// M: most samples per batch.
    pub max_samples_per_slot: u32,
    /// S: payload bytes per slot; rounded up to a page by [`Layout::compute`].
    pub slot_payload_bytes: u64,
}

/// Offsets and sizes of every region, derived from a [`RingGeometry`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The geometry, with `slot_payload_bytes` page-aligned.
    pub geometry: RingGeometry,
    /// Offset of the rank table.
    pub rank_table_offset: u64,
    /// Offset of the slot table.
    pub slot_table_offset: u64,
    /// Stride of the slot table.
    pub slot_meta_bytes: u64,
    /// Offset of the first payload.
    pub payload_offset: u64,
    /// Size of the whole segment.
    pub segment_bytes: u64,
}

/// Why a geometry cannot make a ring.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GeometryError {
    /// A count is zero or above its maximum.
    #[error("{field} = {value} is out of range (must be 1..={max})")]
    OutOfRange {
        /// Which field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// Its maximum.
        max: u64,
    },
    /// The payload size is not a multiple of the page size.
    #[error("slot_payload_bytes = {0} is not a multiple of the page size ({PAGE_BYTES})")]
    Unaligned(u64),
    /// The segment would be larger than [`MAX_SEGMENT_BYTES`] (or overflow).
    #[error("the ring would need more than {MAX_SEGMENT_BYTES} bytes ({what})")]
    TooLarge {
        /// Which computation overflowed.
        what: &'static str,
    },
}

fn in_range(field: &'static str, value: u64, max: u64) -> Result<(), GeometryError> {
    if value == 0 || value > max {
        return Err(GeometryError::OutOfRange { field, value, max });
    }
    Ok(())
}

fn round_up(value: u64, to: u64) -> Option<u64> {
    debug_assert!(to.is_power_of_two());
    Some(value.checked_add(to - 1)? & !(to - 1))
}

impl Layout {
    /// Computes the layout of `g`, rounding the payload size up to a page.
    /// Every range is checked before any arithmetic uses it, so no input can
    /// overflow or panic.
    pub fn compute(g: RingGeometry) -> Result<Layout, GeometryError> {
        in_range("world_size", g.world_size.into(), MAX_RANKS.into())?;
        in_range(
            "slots_per_rank",
            g.slots_per_rank.into(),
            MAX_SLOTS_PER_RANK.into(),
        )?;
        in_range(
            "max_samples_per_slot",
            g.max_samples_per_slot.into(),
            MAX_SAMPLES_PER_SLOT.into(),
        )?;
        in_range(
            "slot_payload_bytes",
            g.slot_payload_bytes,
            MAX_SLOT_PAYLOAD_BYTES,
        )?;
        let too_large = |what| GeometryError::TooLarge { what };
        let slot_payload_bytes =
            round_up(g.slot_payload_bytes, PAGE_BYTES).ok_or(too_large("payload"))?;
        let slots = u64::from(g.world_size) * u64::from(g.slots_per_rank);
        let rank_table_offset = HEADER_BYTES;
        let rank_table_bytes = u64::from(g.world_size) * RANK_BLOCK_BYTES;
        let slot_table_offset = round_up(rank_table_offset + rank_table_bytes, PAGE_BYTES)
            .ok_or(too_large("rank table"))?;
        let samples_bytes = u64::from(g.max_samples_per_slot) * SAMPLE_ENTRY_BYTES;
        let slot_meta_bytes =
            round_up(SLOT_META_FIXED_BYTES + samples_bytes, 64).ok_or(too_large("slot meta"))?;
        let slot_table_bytes = slots
            .checked_mul(slot_meta_bytes)
            .ok_or(too_large("slot table"))?;
        let payload_offset = slot_table_offset
            .checked_add(slot_table_bytes)
            .and_then(|end| round_up(end, PAGE_BYTES))
            .ok_or(too_large("slot table"))?;
        let payloads_bytes = slots
            .checked_mul(slot_payload_bytes)
            .ok_or(too_large("payloads"))?;
        let segment_bytes = payload_offset
            .checked_add(payloads_bytes)
            .ok_or(too_large("payloads"))?;
        if segment_bytes > MAX_SEGMENT_BYTES {
            return Err(too_large("segment"));
        }
        Ok(Layout {
            geometry: RingGeometry {
                slot_payload_bytes,
                ..g
            },
            rank_table_offset,
            slot_table_offset,
            slot_meta_bytes,
            payload_offset,
            segment_bytes,
        })
    }

    /// Number of slots in the ring (W·K).
    pub fn slot_count(&self) -> u32 {
        self.geometry.world_size * self.geometry.slots_per_rank
    }

    /// Global index of rank `rank`'s slot for its `seq`-th batch.
    pub fn slot_of(&self, rank: u32, seq: u64) -> u32 {
        let k = self.geometry.slots_per_rank;
        // The remainder is < K <= MAX_SLOTS_PER_RANK, so it fits in u32.
        rank * k + (seq % u64::from(k)) as u32
    }

    /// Generation of rank's `seq`-th batch in its slot.
    pub fn generation_of(&self, seq: u64) -> u64 {
        seq / u64::from(self.geometry.slots_per_rank) + 1
    }

    /// Offset of rank `rank`'s control block.
    pub fn rank_offset(&self, rank: u32) -> u64 {
        self.rank_table_offset + u64::from(rank) * RANK_BLOCK_BYTES
    }

    /// Offset of slot `slot`'s metadata.
    pub fn slot_meta_offset(&self, slot: u32) -> u64 {
        self.slot_table_offset + u64::from(slot) * self.slot_meta_bytes
    }

    /// Offset of slot `slot`'s payload.
    pub fn payload_offset_of(&self, slot: u32) -> u64 {
        self.payload_offset + u64::from(slot) * self.geometry.slot_payload_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_and_tables_start_on_page_boundaries() {
        let l = Layout::compute(geometry(3, 5, 7, 1000)).unwrap();
        assert_eq!(l.geometry.slot_payload_bytes, 4096);
        assert_eq!(l.slot_table_offset % PAGE_BYTES, 0);
        assert_eq!(l.payload_offset % PAGE_BYTES, 0);
        // round_up(128 + 7·24 = 296, 64): the stride is a whole number of cache lines.
        assert_eq!(l.slot_meta_bytes, 320);
        assert_eq!(l.segment_bytes, l.payload_offset + 15 * 4096);
        assert_eq!(l.payload_offset_of(14) + 4096, l.segment_bytes);
    }

    #[test]
    fn out_of_range_counts_are_refused_before_any_arithmetic() {
        assert!(Layout::compute(geometry(0, 1, 1, 1)).is_err());
        assert!(Layout::compute(geometry(MAX_RANKS + 1, 1, 1, 1)).is_err());
        assert!(Layout::compute(geometry(1, 0, 1, 1)).is_err());
        assert!(Layout::compute(geometry(1, 1, u32::MAX, 1)).is_err());
        assert!(Layout::compute(geometry(1, 1, 1, u64::MAX)).is_err());
        let huge = Layout::compute(geometry(
            MAX_RANKS,
            MAX_SLOTS_PER_RANK,
            MAX_SAMPLES_PER_SLOT,
            MAX_SLOT_PAYLOAD_BYTES,
        ));
        assert!(matches!(huge, Err(GeometryError::TooLarge { .. })));
    }

    fn geometry(w: u32, k: u32, m: u32, s: u64) -> RingGeometry {
        RingGeometry {
            world_size: w,
            slots_per_rank: k,
            max_samples_per_slot: m,
            slot_payload_bytes: s,
        }
    }
}
