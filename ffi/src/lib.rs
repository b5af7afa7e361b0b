//! The C ABI of ringfeed (`libringfeed.so`, `libringfeed.a`), described by the
//! generated header `include/ringfeed.h`.
//!
//! A thin layer: every function converts arguments, calls the ring crate's
//! consumer, and turns errors into a negative code plus a thread-local message
//! (`rf_last_error`). No logic lives here. Panics never cross the boundary.
#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_camel_case_types)]

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

mod epoch;
mod names;
mod progress;
mod resume;
mod start;
mod tar;
mod tokens;
pub use epoch::{rf_epoch, rf_epoch_steps, rf_get_epoch, RF_TAIL_DROP, RF_TAIL_KEEP};
pub use names::{rf_batch_key, rf_get_class_count, rf_get_class_name, rf_key};
pub use progress::{rf_get_run_shape, rf_run_shape};
pub use resume::{
    rf_resume_advance, rf_resume_advance_tail, rf_resume_after, rf_resume_after_tail,
    rf_resume_normal, rf_resume_normal_tail,
};
pub use start::{rf_get_start_mode, rf_request_start};
pub use tar::{rf_tar_field, rf_tar_field_next};
pub use tokens::{rf_get_token_format, rf_token_format};

use ring::{AttachError, AttachOptions, Consumer, Next, NextError, ReleaseError, SampleEntry};

/// What every `rf_*` call that can fail returns (as an `int`): `RF_OK` (0) and the other
/// non-negative codes are outcomes, a negative `RF_E_*` code is an error whose message
/// `rf_last_error()` gives. An enum in C, so no macro needs parentheses.
#[allow(non_camel_case_types)]
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum rf_status {
    /// Success.
    RF_OK = 0,
    /// The run is over: every batch of this rank was delivered.
    RF_END = 1,
    /// Nothing happened within the timeout (rf_next), or no loader appeared (rf_attach).
    RF_TIMEOUT = 2,
    /// A bad argument: NULL pointer, invalid name or UTF-8.
    RF_E_INVALID = -1,
    /// The segment is corrupt, truncated, or not a ringfeed segment.
    RF_E_CORRUPT = -2,
    /// The segment was made by another ABI version of ringfeed.
    RF_E_VERSION = -3,
    /// The rank is negative or not below the loader's world size.
    RF_E_RANK = -4,
    /// Another live process is attached to this rank (or this one already is).
    RF_E_BUSY = -5,
    /// The loader died.
    RF_E_LOADER_GONE = -6,
    /// The loader stopped early (signal or error).
    RF_E_ABORTED = -7,
    /// A release of a batch that is not (or no longer) held.
    RF_E_STALE = -8,
    /// An operating-system call failed.
    RF_E_IO = -9,
    /// A bug inside ringfeed (a panic was caught); the message says where.
    RF_E_INTERNAL = -10,
    /// rf_next: the next batch goes into a slot that still holds a batch this
    /// feed took and did not release, so no wait could end. Nothing was taken;
    /// release that batch and call again.
    RF_E_HELD = -11,
    /// The feed was attached by the parent of this (forked) process: a child
    /// cannot take or release the parent's batches. Attach in the child instead.
    /// rf_detach in the child only unmaps its copy.
    RF_E_FORKED = -12,
    /// rf_attach: the loader's segment belongs to a user this process does not
    /// trust (not itself, not root, not in RINGFEED_TRUST_UID): another user's
    /// loader holds the name. Returned at once; the message names the owner.
    /// Also: the segment under the name is another loader's ring (a hard link:
    /// its header records another name), or no loader of the name runs and its
    /// outcome's place holds what no loader makes (a directory, link or FIFO).
    RF_E_UNTRUSTED = -13,
}

// The same codes as `i32`s, for the functions that return a C `int` (not
// exported to the header: the enum names them there).
#[doc(hidden)]
pub const RF_OK: i32 = rf_status::RF_OK as i32;
#[doc(hidden)]
pub const RF_END: i32 = rf_status::RF_END as i32;
#[doc(hidden)]
pub const RF_TIMEOUT: i32 = rf_status::RF_TIMEOUT as i32;
#[doc(hidden)]
pub const RF_E_INVALID: i32 = rf_status::RF_E_INVALID as i32;
#[doc(hidden)]
pub const RF_E_CORRUPT: i32 = rf_status::RF_E_CORRUPT as i32;
#[doc(hidden)]
pub const RF_E_VERSION: i32 = rf_status::RF_E_VERSION as i32;
#[doc(hidden)]
pub const RF_E_RANK: i32 = rf_status::RF_E_RANK as i32;
#[doc(hidden)]
pub const RF_E_BUSY: i32 = rf_status::RF_E_BUSY as i32;
#[doc(hidden)]
pub const RF_E_LOADER_GONE: i32 = rf_status::RF_E_LOADER_GONE as i32;
#[doc(hidden)]
pub const RF_E_ABORTED: i32 = rf_status::RF_E_ABORTED as i32;
#[doc(hidden)]
pub const RF_E_STALE: i32 = rf_status::RF_E_STALE as i32;
#[doc(hidden)]
pub const RF_E_IO: i32 = rf_status::RF_E_IO as i32;
#[doc(hidden)]
pub const RF_E_INTERNAL: i32 = rf_status::RF_E_INTERNAL as i32;
#[doc(hidden)]
pub const RF_E_HELD: i32 = rf_status::RF_E_HELD as i32;
#[doc(hidden)]
pub const RF_E_FORKED: i32 = rf_status::RF_E_FORKED as i32;
#[doc(hidden)]
pub const RF_E_UNTRUSTED: i32 = rf_status::RF_E_UNTRUSTED as i32;

/// The ring ABI version this header describes; `rf_abi_version()` gives the
/// library's, and a loader of another one is refused with `RF_E_VERSION`.
pub const RF_ABI_VERSION: u32 = 1;
const _: () = assert!(RF_ABI_VERSION == ring::layout::ABI_VERSION);

/// One sample of a batch. Its bytes are `batch.data + offset .. + len`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct rf_sample {
    /// Offset of the sample's first byte from `rf_batch.data`.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Index of the sample in the dataset's manifest.
    pub index: u64,
}

/// What a loader serving decoded images (`serve --decode image`) puts in
/// each batch: sample i is image i, `height × width × 3` uint8 (channel-first
/// when `chw` is 1, else height, width, channel); the batch's labels and
/// bad-sample flags sit at fixed offsets of the payload.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct rf_image_format {
    /// 1: samples are decoded images as below; 0: samples are the objects'
    /// bytes (and the other fields are 0).
    pub is_image: u32,
    /// Pixels high.
    pub height: u32,
    /// Pixels wide.
    pub width: u32,
    /// 1: (3, height, width); 0: (height, width, 3).
    pub chw: u32,
    /// Classes the labels index (0: the labels are -1, none known).
    pub classes: u32,
    /// Zero (padding).
    pub reserved: u32,
    /// `batch.data + labels_offset`: `n_samples` little-endian int64 labels.
    pub labels_offset: u64,
    /// `batch.data + bad_offset`: `n_samples` bytes, 1 where the sample could
    /// not be decoded and is a zero image (`--on-bad-sample zero`).
    pub bad_offset: u64,
}

const _: () = {
    assert!(std::mem::size_of::<rf_sample>() == std::mem::size_of::<SampleEntry>());
    assert!(std::mem::offset_of!(rf_sample, len) == std::mem::offset_of!(SampleEntry, len));
    assert!(std::mem::offset_of!(rf_sample, index) == std::mem::offset_of!(SampleEntry, index));
};

/// A batch taken by `rf_next`: zero-copy views into the ring, valid until
/// `rf_release` (or `rf_detach`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rf_batch {
    /// Start of the slot payload (page-aligned).
    pub data: *const u8,
    /// `n_samples` checked entries; every one lies inside `data_len`.
    pub samples: *const rf_sample,
    /// Number of samples: the batch size, or 0 to it in an epoch's last
    /// step under `--tail keep` (`rf_get_epoch`); an empty batch is still a
    /// step, released like any other.
    pub n_samples: u32,
    /// Slot index (for rf_release).
    pub slot: u32,
    /// Epoch of the batch.
    pub epoch: u64,
    /// Step of the batch within its epoch, counted from the loader's start
    /// (its `--resume`) in the epoch it started in: `rf_resume_state` turns
    /// it into the state to resume from.
    pub step: u64,
    /// Generation of the slot (for rf_release).
    pub generation: u64,
    /// Bytes of `data` in use.
    pub data_len: u64,
}

/// Shape of the ring a feed is attached to.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rf_info {
    /// Number of ranks the loader serves.
    pub world_size: u32,
    /// This feed's rank.
    pub rank: u32,
    /// Slots per rank.
    pub slots_per_rank: u32,
    /// Most samples in one batch.
    pub max_samples_per_slot: u32,
    /// Payload bytes of one slot (a multiple of 4096).
    pub slot_payload_bytes: u64,
    /// Start of the payload region of all slots: pin it once with
    /// cudaHostRegister to copy batches to the GPU by DMA.
    pub payload_region: *const u8,
    /// Length of that region.
    pub payload_region_bytes: u64,
    /// Batches this rank gets in the whole run, or UINT64_MAX if unknown.
    pub batches_expected: u64,
}

/// An attached trainer (opaque). A feed is used by one thread at a time:
/// calls on the same feed from several threads must be serialised by the
/// caller (a mutex), releases included. Different feeds are independent.
/// After fork(), only the process that attached may use it.
pub struct rf_feed {
    consumer: Consumer,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    /// The message of a call failed after LAST_ERROR was destroyed: from an
    /// `atexit` handler, or a thread-local destructor of the caller's, which
    /// run after Rust's thread-locals. No destructor, so it is there to the
    /// end; the last one is leaked when the thread ends.
    static LATE_ERROR: Cell<*const c_char> = const { Cell::new(std::ptr::null()) };
}

/// What `rf_last_error` gives once this thread's storage is gone and no call
/// failed since.
const GONE: &CStr = c"the message of the last failed call was freed with this thread's storage (the thread or the process is exiting)";

fn set_error(message: impl std::fmt::Display) {
    let text = message.to_string().replace('\0', " ");
    let c = CString::new(text).unwrap_or_default();
    if LAST_ERROR.try_with(|_| ()).is_ok() {
        LAST_ERROR.with(|e| *e.borrow_mut() = c);
        return;
    }
    // This thread's storage is gone (an atexit handler, a thread-local
    // destructor): LATE_ERROR, which has no destructor, keeps it.
    let late = c.into_raw().cast_const();
    if let Ok(old) = LATE_ERROR.try_with(|l| l.replace(late)) {
        if !old.is_null() {
            // SAFETY: `old` came from CString::into_raw above; the pointer
            // rf_last_error gave for it is valid only until this call.
            drop(unsafe { CString::from_raw(old.cast_mut()) });
        }
    }
}

fn fail(code: i32, message: impl std::fmt::Display) -> i32 {
    set_error(message);
    code
}

/// Runs `f`, turning a panic into RF_E_INTERNAL.
fn guard(f: impl FnOnce() -> i32) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(rc) => rc,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            fail(
                RF_E_INTERNAL,
                format!("internal error in ringfeed (please report): {what}"),
            )
        }
    }
}

fn timeout_of(ms: i64) -> Option<Duration> {
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

fn attach_code(e: &AttachError) -> i32 {
    match e {
        AttachError::Name(_) => RF_E_INVALID,
        AttachError::Timeout { .. } => RF_TIMEOUT,
        AttachError::Corrupt { .. } => RF_E_CORRUPT,
        AttachError::AbiMismatch { .. } => RF_E_VERSION,
        AttachError::RankOutOfRange { .. } => RF_E_RANK,
        AttachError::RankBusy { .. } | AttachError::RankHeldByThisProcess { .. } => RF_E_BUSY,
        AttachError::LoaderGone { .. }
        | AttachError::LoaderFailed { .. }
        | AttachError::LoaderEnded { .. } => RF_E_LOADER_GONE,
        AttachError::Untrusted { .. }
        | AttachError::NameMismatch { .. }
        | AttachError::OutcomePlanted { .. } => RF_E_UNTRUSTED,
        AttachError::Io { .. } => RF_E_IO,
    }
}

fn next_code(e: &NextError) -> i32 {
    match e {
        NextError::LoaderGone { .. } => RF_E_LOADER_GONE,
        NextError::Aborted { .. } => RF_E_ABORTED,
        NextError::Corrupt { .. } => RF_E_CORRUPT,
        NextError::SlotHeld { .. } => RF_E_HELD,
        NextError::Forked(_) => RF_E_FORKED,
    }
}

/// Attaches to rank `rank` of the loader `name`, waiting up to `timeout_ms`
/// for it to appear (-1, or any negative value: forever; 0: no wait). On
/// RF_OK, `*out` is the feed.
/// Returns RF_TIMEOUT if no loader appeared, or a negative RF_E_* code. A rank
/// held by another process and a dead loader's segment (which a restarted
/// loader replaces) are waited on until the timeout, then RF_E_BUSY and
/// RF_E_LOADER_GONE; a rank this process holds is RF_E_BUSY at once.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rf_attach(
    name: *const c_char,
    rank: i32,
    timeout_ms: i64,
    out: *mut *mut rf_feed,
) -> i32 {
    guard(|| {
        if name.is_null() || out.is_null() {
            return fail(RF_E_INVALID, "rf_attach: name and out must not be NULL");
        }
        // SAFETY: the caller passes a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(name) };
        let Ok(name) = name.to_str() else {
            return fail(RF_E_INVALID, "rf_attach: the name is not valid UTF-8");
        };
        let Ok(rank) = u32::try_from(rank) else {
            return fail(RF_E_RANK, format!("rf_attach: rank {rank} is negative"));
        };
        match Consumer::attach(
            name,
            rank,
            AttachOptions {
                timeout: timeout_of(timeout_ms),
            },
        ) {
            Ok(consumer) => {
                let feed = Box::into_raw(Box::new(rf_feed { consumer }));
                // SAFETY: `out` is non-NULL and writable by contract.
                unsafe { *out = feed };
                RF_OK
            }
            Err(e) => fail(attach_code(&e), e),
        }
    })
}

/// Takes the next batch of this rank into `*batch`, waiting up to
/// `timeout_ms` (-1, or any negative value: forever; 0: no wait). A batch
/// that is ready is taken without a system call. Returns RF_OK, RF_END (run
/// over), RF_TIMEOUT (no batch in time; no message is set), or a negative
/// RF_E_* code (rf_last_error says why): RF_E_HELD at once, whatever
/// the timeout, when the next batch's slot still holds a batch this feed has
/// not released (a rank's batches take its K slots in turn). A dead loader is
/// reported within about 100 ms, also to a caller polling with timeout 0.
///
/// # Safety
/// `feed` comes from rf_attach and was not detached; `batch` is writable.
#[no_mangle]
pub unsafe extern "C" fn rf_next(feed: *mut rf_feed, batch: *mut rf_batch, timeout_ms: i64) -> i32 {
    guard(|| {
        if feed.is_null() || batch.is_null() {
            return fail(RF_E_INVALID, "rf_next: feed and batch must not be NULL");
        }
        // SAFETY: a live feed from rf_attach, used by one thread at a time.
        let feed = unsafe { &mut *feed };
        match feed.consumer.next(timeout_of(timeout_ms)) {
            Ok(Next::Batch(b)) => {
                let out = rf_batch {
                    data: b.data,
                    samples: b.samples as *const rf_sample,
                    n_samples: b.n_samples,
                    slot: b.slot,
                    epoch: b.epoch,
                    step: b.step,
                    generation: b.generation,
                    data_len: b.data_len,
                };
                // SAFETY: `batch` is non-NULL and writable by contract.
                unsafe { *batch = out };
                RF_OK
            }
            Ok(Next::End) => RF_END,
            Ok(Next::Timeout) => RF_TIMEOUT,
            Err(e) => fail(next_code(&e), e),
        }
    })
}

/// Gives a batch back to the loader. Batches may be released in any order.
/// A second release of the same batch, or a release of a batch that another
/// feed still attached returned, returns RF_E_STALE. A batch of a feed
/// already detached must not be released through another feed: once its
/// mapping is gone, a new feed's ring of the same shape may be mapped at the
/// same address, and the handle can then name one of that feed's batches.
///
/// # Safety
/// `feed` comes from rf_attach and was not detached; `batch` is readable.
#[no_mangle]
pub unsafe extern "C" fn rf_release(feed: *mut rf_feed, batch: *const rf_batch) -> i32 {
    guard(|| {
        if feed.is_null() || batch.is_null() {
            return fail(RF_E_INVALID, "rf_release: feed and batch must not be NULL");
        }
        // SAFETY: a live feed from rf_attach; `batch` readable by contract.
        let (feed, batch) = unsafe { (&mut *feed, &*batch) };
        match feed
            .consumer
            .release_handle(batch.slot, batch.generation, batch.data)
        {
            Ok(()) => RF_OK,
            Err(e @ ReleaseError::Forked(_)) => fail(RF_E_FORKED, e),
            Err(
                e @ (ReleaseError::NotOurs { .. }
                | ReleaseError::NotTaken { .. }
                | ReleaseError::Stale { .. }
                | ReleaseError::AlreadyReleased { .. }
                | ReleaseError::OtherFeed { .. }),
            ) => fail(RF_E_STALE, e),
        }
    })
}

/// Fills `*info` with the shape of the ring.
///
/// # Safety
/// `feed` comes from rf_attach and was not detached; `info` is writable.
#[no_mangle]
pub unsafe extern "C" fn rf_get_info(feed: *const rf_feed, info: *mut rf_info) -> i32 {
    guard(|| {
        if feed.is_null() || info.is_null() {
            return fail(RF_E_INVALID, "rf_get_info: feed and info must not be NULL");
        }
        // SAFETY: a live feed from rf_attach.
        let consumer = unsafe { &(*feed).consumer };
        let g = consumer.layout().geometry;
        let (payload_region, payload_region_bytes) = consumer.payload_region();
        let out = rf_info {
            world_size: g.world_size,
            rank: consumer.rank(),
            slots_per_rank: g.slots_per_rank,
            max_samples_per_slot: g.max_samples_per_slot,
            slot_payload_bytes: g.slot_payload_bytes,
            payload_region,
            payload_region_bytes,
            batches_expected: consumer.batches_expected().unwrap_or(u64::MAX),
        };
        // SAFETY: `info` is non-NULL and writable by contract.
        unsafe { *info = out };
        RF_OK
    })
}

/// Where the feed's ranks sit in the training job, and what its loader
/// serves (`rf_get_job`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rf_job {
    /// Job rank of the loader's rank 0: this feed is job rank
    /// `first_rank + rank` (torchrun's RANK).
    pub first_rank: u32,
    /// Ranks of the whole job, all machines (torchrun's WORLD_SIZE).
    pub job_world_size: u32,
    /// Digest of the dataset's manifest and of the flags that decide the
    /// order (seed, shuffle, batch size, world size, epochs, resume state);
    /// 0 if the loader did not say. Equal on every rank of a job whose
    /// loaders were started alike over the same files.
    pub plan_digest: u64,
}

/// Fills `*job` with where the feed's ranks sit in the training job. A job
/// on several machines has one loader on each, serving a run of the job's
/// ranks; on one machine `first_rank` is 0 and `job_world_size` the loader's
/// world size. Compare them with the job's own rank and size to catch a
/// loader started with the wrong `--node-rank` or without `--nnodes`, and
/// `plan_digest` across ranks to catch loaders started with other flags or
/// over other files: either would feed two machines the same samples.
///
/// # Safety
/// `feed` comes from rf_attach and was not detached; `job` is writable.
#[no_mangle]
pub unsafe extern "C" fn rf_get_job(feed: *const rf_feed, job: *mut rf_job) -> i32 {
    guard(|| {
        if feed.is_null() || job.is_null() {
            return fail(RF_E_INVALID, "rf_get_job: feed and job must not be NULL");
        }
        // SAFETY: a live feed from rf_attach.
        let j = unsafe { &(*feed).consumer }.job();
        let out = rf_job {
            first_rank: j.first_rank,
            job_world_size: j.job_world_size,
            plan_digest: j.plan_digest,
        };
        // SAFETY: `job` is non-NULL and writable by contract.
        unsafe { *job = out };
        RF_OK
    })
}

/// Fills `*epoch` and `*samples` with the state the loader started at: its
/// `--resume EPOCH:SAMPLES`, or 0 and 0 without one; and `*dataset_samples`
/// with the samples of the dataset (those of one epoch, dropped tail
/// included). `rf_batch.step` counts from the start in that epoch.
/// RF_E_VERSION if the loader does not record them (an older loader).
/// RF_TIMEOUT while a loader under `--resume auto` waits for its ranks to say
/// where the run starts (rf_request_start): then only `*dataset_samples` is
/// set; the start is known once the rank has its first batch.
///
/// # Safety
/// `feed` comes from rf_attach and was not detached; `epoch`, `samples` and
/// `dataset_samples` are writable.
#[no_mangle]
pub unsafe extern "C" fn rf_get_start(
    feed: *const rf_feed,
    epoch: *mut u64,
    samples: *mut u64,
    dataset_samples: *mut u64,
) -> i32 {
    guard(|| {
        if feed.is_null() || epoch.is_null() || samples.is_null() || dataset_samples.is_null() {
            return fail(
                RF_E_INVALID,
                "rf_get_start: feed, epoch, samples and dataset_samples must not be NULL",
            );
        }
        // SAFETY: a live feed from rf_attach.
        let consumer = unsafe { &(*feed).consumer };
        let Some(start) = consumer.job().start else {
            if consumer.start_mode() == ring::StartMode::Awaiting {
                // Not decided yet (--resume auto): the sample count is known.
                // SAFETY: all three non-NULL and writable by contract.
                unsafe {
                    *epoch = 0;
                    *samples = 0;
                    *dataset_samples = consumer.dataset_samples().unwrap_or(0);
                }
                return RF_TIMEOUT;
            }
            return fail(RF_E_VERSION, not_recorded(consumer.name()));
        };
        // SAFETY: all three non-NULL and writable by contract.
        unsafe {
            *epoch = start.epoch;
            *samples = start.samples_consumed;
            *dataset_samples = start.dataset_samples;
        }
        RF_OK
    })
}

/// Fills `*taken` with the batches this rank has taken in the run: by this
/// process, and by the processes attached to the rank before it (a trainer
/// that crashed and was restarted continues with batch number `*taken`,
/// counted from 0). After a restart of every rank (torchrun
/// `--max-restarts`), the ranks may differ by a batch: one had taken the
/// batch of the next step when another died. Data-parallel ranks must train
/// on the same step, so compare `*taken` across the job (an all-reduce MAX)
/// and have each rank behind take and release the batches it lacks before
/// training; the Python binding's `check_same_plan` does this.
///
/// # Safety
/// `feed` comes from rf_attach and was not detached; `taken` is writable.
#[no_mangle]
pub unsafe extern "C" fn rf_get_taken(feed: *const rf_feed, taken: *mut u64) -> i32 {
    guard(|| {
        if feed.is_null() || taken.is_null() {
            return fail(
                RF_E_INVALID,
                "rf_get_taken: feed and taken must not be NULL",
            );
        }
        // SAFETY: a live feed from rf_attach; `taken` is non-NULL and
        // writable by contract.
        unsafe { *taken = (*feed).consumer.taken() };
        RF_OK
    })
}

/// Fills `*seed` with the loader's `--seed` and `*shuffled` with 1, or 0
/// under `--no-shuffle`: with the dataset's sample count (`rf_get_start`),
/// what decides the order of every epoch (docs/sampler.md), whatever the
/// world size and batch size. A resume state holds only under the order it
/// was saved under: save these with it, and before training from a
/// checkpoint compare them, and the loader's start with the saved state
/// (the Python binding's `check_resume` does). RF_E_VERSION if the loader
/// does not record them (an older loader).
///
/// # Safety
/// `feed` comes from rf_attach and was not detached; `seed` and `shuffled`
/// are writable.
#[no_mangle]
pub unsafe extern "C" fn rf_get_order(
    feed: *const rf_feed,
    seed: *mut u64,
    shuffled: *mut u32,
) -> i32 {
    guard(|| {
        if feed.is_null() || seed.is_null() || shuffled.is_null() {
            return fail(
                RF_E_INVALID,
                "rf_get_order: feed, seed and shuffled must not be NULL",
            );
        }
        // SAFETY: a live feed from rf_attach.
        let consumer = unsafe { &(*feed).consumer };
        let Some(order) = consumer.job().order else {
            return fail(
                RF_E_VERSION,
                format!("the loader of {:?} does not record its --seed and shuffle (an older ringfeed serve); restart it with this version", consumer.name()),
            );
        };
        // SAFETY: both non-NULL and writable by contract.
        unsafe {
            *seed = order.seed;
            *shuffled = u32::from(order.shuffled);
        }
        RF_OK
    })
}

/// Fills `*block_samples` and `*window_blocks` with the loader's
/// `--shuffle-block` and `--shuffle-window` under `--shuffle block`, and
/// both with 0 under the exact shuffle or none (`rf_get_order` says which):
/// a block order is part of what decides the order of every epoch
/// (docs/sampler.md, section 4), so save these with `rf_get_order`'s and
/// compare them too. RF_E_VERSION if the loader does not record its order.
/// A loader that predates the block order records 0 and 0, rightly: it
/// serves only the others.
///
/// # Safety
/// `feed` comes from rf_attach and was not detached; `block_samples` and
/// `window_blocks` are writable.
#[no_mangle]
pub unsafe extern "C" fn rf_get_order_block(
    feed: *const rf_feed,
    block_samples: *mut u32,
    window_blocks: *mut u32,
) -> i32 {
    guard(|| {
        if feed.is_null() || block_samples.is_null() || window_blocks.is_null() {
            return fail(
                RF_E_INVALID,
                "rf_get_order_block: feed, block_samples and window_blocks must not be NULL",
            );
        }
        // SAFETY: a live feed from rf_attach.
        let consumer = unsafe { &(*feed).consumer };
        let Some(order) = consumer.job().order else {
            return fail(
                RF_E_VERSION,
                format!("the loader of {:?} does not record its --seed and shuffle (an older ringfeed serve); restart it with this version", consumer.name()),
            );
        };
        // SAFETY: both non-NULL and writable by contract.
        unsafe {
            *block_samples = order.block_samples;
            *window_blocks = order.window_blocks;
        }
        RF_OK
    })
}

/// Fills `*format` with the shape of the loader's decoded images, or with
/// `is_image` 0 when its samples are the objects' bytes. The same for every
/// batch of the run.
///
/// # Safety
/// `feed` comes from rf_attach and was not detached; `format` is writable.
#[no_mangle]
pub unsafe extern "C" fn rf_get_image_format(
    feed: *const rf_feed,
    format: *mut rf_image_format,
) -> i32 {
    guard(|| {
        if feed.is_null() || format.is_null() {
            return fail(
                RF_E_INVALID,
                "rf_get_image_format: feed and format must not be NULL",
            );
        }
        // SAFETY: a live feed from rf_attach.
        let consumer = unsafe { &(*feed).consumer };
        let out = match consumer.job().images {
            Some(i) => rf_image_format {
                is_image: 1,
                height: i.height,
                width: i.width,
                chw: u32::from(i.chw),
                classes: i.classes,
                reserved: 0,
                labels_offset: i.labels_offset,
                bad_offset: i.bad_offset,
            },
            None => rf_image_format::default(),
        };
        // SAFETY: non-NULL and writable by contract.
        unsafe { *format = out };
        RF_OK
    })
}

fn not_recorded(name: &str) -> String {
    format!("the loader of {name:?} does not record the state it started at (an older ringfeed serve); restart it with this version, or count samples yourself from its --resume")
}

/// Fills `*epoch` and `*samples` with the resume state after `batch`: once
/// every rank of the job has trained on its batch of this step, a loader
/// restarted with `ringfeed serve ... --resume EPOCH:SAMPLES` (same dataset,
/// seed, batch size, any world size) goes on with the next step. Save it in
/// your checkpoint. `batch.step` counts from the loader's own `--resume`
/// point in the epoch it started in, so `(step + 1) * W * B` alone is the
/// state only for a loader started at the beginning of an epoch. After an
/// epoch's last step the state is `EPOCH + 1` and 0: a dropped tail is not
/// carried over, and under `--tail keep` the last step is the short one.
/// RF_E_VERSION if the loader does not record where it started (an older
/// loader); RF_E_INVALID if `batch` is from an epoch before it.
///
/// # Safety
/// `feed` comes from rf_attach and was not detached; `batch` is readable;
/// `epoch` and `samples` are writable.
#[no_mangle]
pub unsafe extern "C" fn rf_resume_state(
    feed: *const rf_feed,
    batch: *const rf_batch,
    epoch: *mut u64,
    samples: *mut u64,
) -> i32 {
    guard(|| {
        if feed.is_null() || batch.is_null() || epoch.is_null() || samples.is_null() {
            return fail(
                RF_E_INVALID,
                "rf_resume_state: feed, batch, epoch and samples must not be NULL",
            );
        }
        // SAFETY: a live feed from rf_attach; `batch` is readable by contract.
        let (consumer, b) = unsafe { (&(*feed).consumer, &*batch) };
        let Some(start) = consumer.job().start else {
            return fail(RF_E_VERSION, not_recorded(consumer.name()));
        };
        let Some((e, n)) = consumer.resume_state_after(b.epoch, b.step) else {
            return fail(RF_E_INVALID, format!("rf_resume_state: batch of epoch {} step {} is not one of this loader, which started in epoch {}", b.epoch, b.step, start.epoch));
        };
        // SAFETY: both non-NULL and writable by contract.
        unsafe {
            *epoch = e;
            *samples = n;
        }
        RF_OK
    })
}

/// Detaches: batches still held are given back, and every pointer from this
/// feed becomes invalid. NULL is ignored.
///
/// # Safety
/// `feed` comes from rf_attach and is not used again.
#[no_mangle]
pub unsafe extern "C" fn rf_detach(feed: *mut rf_feed) {
    if feed.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: ownership returns from the caller, who will not use it again.
        drop(unsafe { Box::from_raw(feed) });
    }));
}

/// The message of the last failed call on this thread ("" if none failed
/// yet); a successful call does not clear it. Valid until the next ringfeed
/// call on this thread. Called while the thread or the process exits (an
/// `atexit` handler, a thread-local destructor), after ringfeed's own
/// thread storage is gone, it gives the message of a call failed since, or
/// one saying the earlier message was freed.
#[no_mangle]
pub extern "C" fn rf_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|e| e.borrow().as_ptr())
        .unwrap_or_else(|_| {
            let late = LATE_ERROR.try_with(Cell::get).unwrap_or(std::ptr::null());
            if late.is_null() {
                GONE.as_ptr()
            } else {
                late
            }
        })
}

/// Version of the ring ABI this library speaks.
#[no_mangle]
pub extern "C" fn rf_abi_version() -> u32 {
    RF_ABI_VERSION
}
