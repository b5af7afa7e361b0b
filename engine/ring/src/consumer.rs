//! A trainer's side of the ring: attach to rank r, take batches in order
//! without copying their bytes, release them.
//!
//! Nothing in the segment is trusted. Attach recomputes the layout from the
//! header's counts and compares it with the stored offsets and the mapping's
//! real size; `next` copies each batch's sample table into private memory and
//! bounds-checks every entry there, so a hostile writer cannot change an entry
//! after it was checked.

use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::AtomicI32;
use std::time::{Duration, Instant};

use crate::futex;
use crate::layout::{
    state, Job, Layout, RingGeometry, ABI_VERSION, HEADER_BYTES, MAGIC, PAGE_BYTES,
};
use crate::protocol::{self, ReleaseRefusal};
use crate::segment::{self, NameError, LOADER_LOCK_BYTE};
use crate::sync::Ordering;
use crate::view::View;
use crate::SampleEntry;

/// How long `next` spins before it sleeps. A futex wake costs 35–40 µs here,
/// so a batch arriving within this window is taken with no system call.
pub const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(50);
/// Longest single sleep; liveness of the loader is re-checked after each.
pub const WAIT_SLICE: Duration = Duration::from_millis(100);
/// Longest pause of an attach that waits for a segment to appear (it is
/// woken at once by the /dev/shm watch; this bounds a missed event), or that
/// waits without a watch.
const ATTACH_POLL: Duration = Duration::from_millis(10);
/// First pause of an attach that waits for a segment to be finished or a
/// rank to be freed; it doubles up to `ATTACH_POLL`.
const ATTACH_RETRY_FIRST: Duration = Duration::from_micros(200);

/// Forks this process has been through: raised in the child by a
/// `pthread_atfork` handler, so a consumer tells with one load that it was
/// attached by the parent of this process.
static FORKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Most feeds of one process whose rank lock a forked child gives up.
const LOCK_FDS_MAX: usize = 64;

/// The descriptors of this process's feeds, each holding its rank's lock
/// (-1: free entry). A rank lock is an OFD lock: it lasts while any
/// descriptor of its open file description is open, and a forked child gets
/// copies of them all. A child that outlived its trainer (an orphaned
/// multiprocessing worker, say) would keep the rank locked, so no new trainer
/// could attach to it and the loader would never reclaim its slots: the
/// child closes its copies at once, in the atfork handler. (The ring is
/// mapped through another open file description, `segment::map_apart`, so
/// the child's mapping, which it keeps, holds no lock.)
static LOCK_FDS: [AtomicI32; LOCK_FDS_MAX] = [const { AtomicI32::new(-1) }; LOCK_FDS_MAX];

extern "C" fn in_forked_child() {
    FORKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    for entry in &LOCK_FDS {
        let fd = entry.swap(-1, std::sync::atomic::Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: the child's copy of a feed's descriptor; its Consumer
            // knows (`lock_entry`) not to close it again. close is
            // async-signal-safe, as a handler after fork requires.
            unsafe { libc::close(fd) };
        }
    }
}

/// Records `fd` for `in_forked_child`; None when the table is full (a child
/// then keeps its copy until it exits, as before the table existed).
fn register_lock_fd(fd: i32) -> Option<usize> {
    use std::sync::atomic::Ordering::Relaxed;
    LOCK_FDS
        .iter()
        .position(|entry| entry.compare_exchange(-1, fd, Relaxed, Relaxed).is_ok())
}

/// The number of forks so far, registering the counter on first use.
fn forks_so_far() -> u64 {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    REGISTER.call_once(|| {
        // SAFETY: the handler only touches atomics and calls close, which
        // is allowed in a child after fork. A failure (ENOMEM) leaves forks
        // undetected, as before this check existed.
        unsafe { libc::pthread_atfork(None, None, Some(in_forked_child)) };
    });
    FORKS.load(std::sync::atomic::Ordering::Relaxed)
}

/// A feed used in a child forked from the process that attached it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("this feed of {name:?} rank {rank} was attached by process {attached_by}, and this process is a fork of it: a forked child cannot take or give back that process's batches (the parent would see batches twice, or have a batch overwritten under its views). Take batches in the process that attached (a torch DataLoader over a feed needs num_workers=0: the loader does the reading), or attach in the child itself, and not in the parent")]
pub struct Forked {
    /// The loader's name.
    pub name: String,
    /// The rank.
    pub rank: u32,
    /// Pid of the process that attached.
    pub attached_by: u32,
}

/// Why attach failed.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The name is not allowed.
    #[error(transparent)]
    Name(#[from] NameError),
    /// No loader of that name appeared in time.
    #[error("no loader named {name:?} appeared within {waited_ms} ms (looked for {path}); start one with `ringfeed serve --name {name} ...` (a loader that has served its whole run exits and removes it), or check RINGFEED_NAME")]
    Timeout {
        /// The name.
        name: String,
        /// The segment path.
        path: String,
        /// How long we waited.
        waited_ms: u64,
    },
    /// The segment exists but is not a ring, or is corrupt.
    #[error("{path} is not a valid ringfeed segment: {what}")]
    Corrupt {
        /// The segment path.
        path: String,
        /// What is wrong.
        what: String,
    },
    /// The segment was made by another version of ringfeed.
    #[error("{path} uses ring ABI version {found}, this library speaks version {expected}; use the same ringfeed version for the loader and the trainers")]
    AbiMismatch {
        /// The segment path.
        path: String,
        /// Version found.
        found: u32,
        /// Version expected.
        expected: u32,
    },
    /// Rank outside 0..W.
    #[error("rank {rank} is out of range: loader {name:?} serves {world_size} rank(s) on this machine (ranks 0 to {last}); check LOCAL_RANK, and the loader's --world-size (the whole job) and --nnodes", last = .world_size.saturating_sub(1))]
    RankOutOfRange {
        /// The name.
        name: String,
        /// Requested rank.
        rank: u32,
        /// W.
        world_size: u32,
    },
    /// Another live process holds the rank.
    #[error("rank {rank} of loader {name:?} already has a consumer attached (pid {pid}); each rank takes one consumer at a time")]
    RankBusy {
        /// The name.
        name: String,
        /// The rank.
        rank: u32,
        /// The holder's pid.
        pid: u32,
    },
    /// This very process holds the rank: an attachment of it that was
    /// never detached. Waiting would wait on itself, so attach fails at once.
    #[error("rank {rank} of loader {name:?} is already attached by this process (pid {pid}) and not detached: an earlier rf_attach of this rank without rf_detach, or in Python an earlier Feed of it, or a batch or array of one, still alive; keep using that attachment, or detach it before attaching again")]
    RankHeldByThisProcess {
        /// The name.
        name: String,
        /// The rank.
        rank: u32,
        /// This process's pid.
        pid: u32,
    },
    /// The loader that made the segment is dead.
    #[error("the loader of {name:?} (pid {pid}) is gone; restart `ringfeed serve` (and run `ringfeed gc` to remove its segment)")]
    LoaderGone {
        /// The name.
        name: String,
        /// Its last pid.
        pid: u32,
    },
    /// An OS call failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The segment path.
        path: String,
        /// The OS error.
        source: io::Error,
    },
}

/// Why `next` failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NextError {
    /// The loader died.
    #[error("the loader of {name:?} (pid {pid}) is gone: it died or was killed before the end of the run; restart `ringfeed serve` (with --resume EPOCH:SAMPLES, the resume_state of the last batch in your checkpoint, to go on where it stopped) and attach again")]
    LoaderGone {
        /// The name.
        name: String,
        /// Its pid.
        pid: u32,
    },
    /// The loader stopped early on purpose.
    #[error("the loader of {name:?} stopped before the end of the run ({reason})")]
    Aborted {
        /// The name.
        name: String,
        /// Why, in words.
        reason: String,
    },
    /// The segment broke the protocol.
    #[error("the ring of {name:?} is corrupt: {what}")]
    Corrupt {
        /// The name.
        name: String,
        /// What is wrong.
        what: String,
    },
    /// The next batch goes into a slot that still holds a batch this
    /// consumer took and did not release: no wait can end until it does.
    #[error("the next batch of rank {rank} of {name:?} goes into slot {slot}, which still holds the batch of epoch {epoch} step {step} that this process took and has not given back: the loader cannot publish until it is. A rank's batches take its {slots_per_rank} slot(s) in turn, so batch n + {slots_per_rank} waits for batch n to be given back. Give that batch back first (nothing was taken by this call), or start the loader with more --slots-per-rank")]
    SlotHeld {
        /// The name.
        name: String,
        /// The rank.
        rank: u32,
        /// The slot the next batch needs.
        slot: u32,
        /// Epoch of the batch still in it.
        epoch: u64,
        /// Step of the batch still in it.
        step: u64,
        /// K.
        slots_per_rank: u32,
    },
    /// Used in a forked child.
    #[error(transparent)]
    Forked(#[from] Forked),
}

/// Why a release was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseError {
    /// The handle does not name one of this rank's slots.
    #[error("slot {slot} does not belong to rank {rank}")]
    NotOurs {
        /// Slot given.
        slot: u32,
        /// Our rank.
        rank: u32,
    },
    /// The slot was already released and reused.
    #[error("stale batch handle: slot {slot} generation {generation} was released already (the slot now holds generation {current})")]
    Stale {
        /// Slot.
        slot: u32,
        /// Generation in the handle.
        generation: u64,
        /// Generation in the slot.
        current: u64,
    },
    /// The handle names a batch this consumer never took with `next`.
    #[error("slot {slot} generation {generation} was never taken by next(); only batches returned by next() can be released")]
    NotTaken {
        /// Slot.
        slot: u32,
        /// Generation in the handle.
        generation: u64,
    },
    /// The batch was released already.
    #[error("batch in slot {slot} (generation {generation}) was already released")]
    AlreadyReleased {
        /// Slot.
        slot: u32,
        /// Generation.
        generation: u64,
    },
    /// The handle's payload pointer is not this consumer's slot: the batch
    /// came from another feed (another loader, or an earlier attach).
    #[error("the batch's data pointer is not slot {slot} of this feed: it was returned by another feed (another loader or rank, or an earlier attach); release a batch on the feed that returned it")]
    OtherFeed {
        /// Slot given.
        slot: u32,
    },
    /// Used in a forked child.
    #[error(transparent)]
    Forked(#[from] Forked),
}

/// A batch taken by `next`. Its pointers stay valid until it is released or
/// the consumer detaches.
#[derive(Debug, Clone, Copy)]
pub struct BatchRef {
    /// Global slot index.
    pub slot: u32,
    /// Generation of the slot, for the release check.
    pub generation: u64,
    /// Epoch.
    pub epoch: u64,
    /// Step within the epoch.
    pub step: u64,
    /// The batch's sequence number within its rank.
    pub seq: u64,
    /// Start of the slot payload (page-aligned).
    pub data: *const u8,
    /// Bytes of the payload in use (every sample lies below this).
    pub data_len: u64,
    /// Checked private copy of the sample table.
    pub samples: *const SampleEntry,
    /// Number of samples.
    pub n_samples: u32,
}

impl BatchRef {
    /// The checked sample table.
    ///
    /// # Safety
    /// The batch must not be released and its consumer must be attached.
    pub unsafe fn sample_table(&self) -> &[SampleEntry] {
        // SAFETY: `samples` points at n_samples entries of the consumer's private
        // table for this slot, untouched until the slot is taken again.
        unsafe { std::slice::from_raw_parts(self.samples, self.n_samples as usize) }
    }

    /// The bytes of sample `i`, zero-copy.
    ///
    /// # Safety
    /// As for [`BatchRef::sample_table`].
    pub unsafe fn sample_bytes(&self, i: usize) -> &[u8] {
        // SAFETY: forwarded contract.
        let s = unsafe { self.sample_table() }[i];
        // SAFETY: `next` checked offset + len <= data_len <= slot payload size.
        unsafe { std::slice::from_raw_parts(self.data.add(s.offset as usize), s.len as usize) }
    }
}

/// What `next` found.
#[derive(Debug, Clone, Copy)]
pub enum Next {
    /// A batch.
    Batch(BatchRef),
    /// The run is over: every batch for this rank was taken.
    End,
    /// Nothing arrived within the timeout.
    Timeout,
}

/// Options of a consumer.
#[derive(Clone, Copy, Debug)]
pub struct AttachOptions {
    /// How long attach waits for the loader to appear and the rank to be free.
    /// None waits forever.
    pub timeout: Option<Duration>,
}

/// A trainer attached to one rank of a ring.
pub struct Consumer {
    /// This attachment's entry in the ranks this process holds (removed
    /// when dropped).
    _held: HeldHere,
    name: String,
    rank: u32,
    /// Closed in Drop, unless a forked child's atfork handler already did.
    fd: ManuallyDrop<OwnedFd>,
    /// This feed's entry in `LOCK_FDS`.
    lock_entry: Option<usize>,
    view: View,
    loader_pid: u32,
    /// Where the ring's ranks sit in the training job.
    job: Job,
    consumed: u64,
    /// Private checked copies of the sample table, one per slot of our rank.
    tables: Vec<Vec<SampleEntry>>,
    /// Set by `abandon`: drop leaves the ring as a dead process would.
    abandoned: bool,
    /// `forks_so_far()` at attach: a different count now means this is a
    /// forked child, which must not touch the rank's shared state.
    forks_at_attach: u64,
    /// Pid of the attaching process (messages).
    pid: u32,
    /// When the loader was last seen alive, across calls: a caller polling
    /// with no timeout still learns of its death within a wait slice.
    last_liveness: Option<Instant>,
}

// SAFETY: a Consumer owns its mapping and descriptor; moving it to another
// thread moves all access with it.
unsafe impl Send for Consumer {}

fn corrupt(path: &str, what: impl Into<String>) -> AttachError {
    AttachError::Corrupt {
        path: path.to_string(),
        what: what.into(),
    }
}

/// Validates a mapped header against the mapping's real size and returns the
/// layout recomputed from its counts, and where its ranks sit in the job.
/// Exposed for the fuzz target.
pub fn validate_header(bytes: &[u8], path: &str) -> Result<(Layout, Job), AttachError> {
    if (bytes.len() as u64) < HEADER_BYTES {
        return Err(corrupt(
            path,
            format!(
                "it is {} bytes, smaller than a ring header ({HEADER_BYTES})",
                bytes.len()
            ),
        ));
    }
    let u32_at =
        |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
    let u64_at = |o: usize| u64::from(u32_at(o)) | (u64::from(u32_at(o + 4)) << 32);
    if u64_at(0) != MAGIC {
        return Err(corrupt(path, "bad magic (not made by ringfeed)"));
    }
    let abi = u32_at(8);
    if abi != ABI_VERSION {
        return Err(AttachError::AbiMismatch {
            path: path.to_string(),
            found: abi,
            expected: ABI_VERSION,
        });
    }
    if u64::from(u32_at(12)) != HEADER_BYTES || u64::from(u32_at(28)) != PAGE_BYTES {
        return Err(corrupt(
            path,
            "header or page size differs from this version's",
        ));
    }
    let geometry = RingGeometry {
        world_size: u32_at(16),
        slots_per_rank: u32_at(20),
        max_samples_per_slot: u32_at(24),
        slot_payload_bytes: u64_at(32),
    };
    let layout = Layout::compute(geometry).map_err(|e| corrupt(path, format!("geometry: {e}")))?;
    if layout.geometry.slot_payload_bytes != geometry.slot_payload_bytes {
        return Err(corrupt(path, "slot payload size is not page-aligned"));
    }
    let stored = [u64_at(40), u64_at(48), u64_at(56), u64_at(64), u64_at(72)];
    let computed = [
        layout.segment_bytes,
        layout.rank_table_offset,
        layout.slot_table_offset,
        layout.payload_offset,
        layout.slot_meta_bytes,
    ];
    if stored != computed {
        return Err(corrupt(
            path,
            format!(
                "stored offsets {stored:?} differ from those computed from its counts {computed:?}"
            ),
        ));
    }
    if layout.segment_bytes != bytes.len() as u64 {
        return Err(corrupt(
            path,
            format!(
                "header says {} bytes but the segment is {} bytes (truncated?)",
                layout.segment_bytes,
                bytes.len()
            ),
        ));
    }
    let start =
        (u32_at(84) & crate::layout::flags::START_KNOWN != 0).then(|| crate::layout::RunStart {
            epoch: u64_at(112),
            samples_consumed: u64_at(120),
            dataset_samples: u64_at(176),
        });
    let order =
        (u32_at(84) & crate::layout::flags::ORDER_KNOWN != 0).then(|| crate::layout::RunOrder {
            seed: u64_at(184),
            shuffled: u64_at(192) != 0,
        });
    let job = Job::from_header(
        u32_at(100),
        u32_at(96),
        geometry.world_size,
        u64_at(104),
        start,
    )
    .map_err(|e| corrupt(path, e))?;
    let job = Job { order, ..job };
    Ok((layout, job))
}

impl Consumer {
    /// Attaches to rank `rank` of loader `name`, waiting for the loader to
    /// appear and the rank to be free for at most `opts.timeout`.
    pub fn attach(name: &str, rank: u32, opts: AttachOptions) -> Result<Consumer, AttachError> {
        segment::validate_name(name)?;
        let path = segment::shm_path(name).display().to_string();
        let start = Instant::now();
        let expired = || opts.timeout.is_some_and(|t| start.elapsed() >= t);
        let timeout_err = || AttachError::Timeout {
            name: name.to_string(),
            path: path.clone(),
            waited_ms: start.elapsed().as_millis() as u64,
        };
        let remaining = || {
            opts.timeout.map_or(ATTACH_POLL, |t| {
                t.saturating_sub(start.elapsed()).min(ATTACH_POLL)
            })
        };
        // Made on the first miss; None after that if inotify is unavailable.
        let mut watch: Option<Option<segment::ShmWatch>> = None;
        let mut retry_pause = ATTACH_RETRY_FIRST;
        loop {
            let fd = match segment::shm_open(name, libc::O_RDWR, 0) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    if expired() {
                        return Err(timeout_err());
                    }
                    match &watch {
                        // Watch first, then look again: a segment created in
                        // between is found by that second look.
                        None => watch = Some(segment::ShmWatch::new().ok()),
                        Some(Some(w)) => {
                            w.wait(remaining());
                        }
                        Some(None) => std::thread::sleep(remaining()),
                    }
                    continue;
                }
                Err(_) if segment::is_a_directory(name) => {
                    return Err(corrupt(&path, "it is a directory"))
                }
                Err(e) => {
                    return Err(AttachError::Io {
                        what: "cannot open",
                        path,
                        source: e,
                    })
                }
            };
            if let Some(kind) = segment::not_regular(&fd) {
                // Not a file at all: no loader will ever make this one ready.
                return Err(corrupt(&path, format!("it is {kind}")));
            }
            match Self::attach_fd(fd, name, rank) {
                // A loader still building its segment, or a rank whose previous
                // consumer is still detaching: wait and retry within the timeout.
                Err(Retry::Later(e)) => {
                    if expired() {
                        return Err(e.unwrap_or_else(timeout_err));
                    }
                    std::thread::sleep(retry_pause.min(remaining()));
                    retry_pause = (retry_pause * 2).min(ATTACH_POLL);
                }
                Err(Retry::Never(e)) => return Err(e),
                Ok(c) => return Ok(c),
            }
        }
    }

    /// Attaches through an already open segment descriptor (tests, fuzzing).
    pub fn attach_to_fd(fd: OwnedFd, name: &str, rank: u32) -> Result<Consumer, AttachError> {
        Self::attach_fd(fd, name, rank).map_err(|r| match r {
            Retry::Later(Some(e)) | Retry::Never(e) => e,
            Retry::Later(None) => corrupt(name, "the loader has not finished creating the segment"),
        })
    }

    fn attach_fd(fd: OwnedFd, name: &str, rank: u32) -> Result<Consumer, Retry> {
        let path = segment::shm_path(name).display().to_string();
        let io_err = |what, source| {
            Retry::Never(AttachError::Io {
                what,
                path: path.clone(),
                source,
            })
        };
        let size = segment::file_size(&fd).map_err(|e| io_err("cannot stat", e))?;
        if size < HEADER_BYTES {
            // Either a loader between shm_open and fallocate, or garbage. An
            // empty segment with no lock is also a loader between its
            // shm_open and its lock (the object and the lock cannot be made
            // in one step), so it is retried too; garbage still fails at
            // the timeout, with this message.
            let alive = segment::byte_is_locked(&fd, LOADER_LOCK_BYTE).unwrap_or(false);
            let e = corrupt(
                &path,
                format!("it is {size} bytes, smaller than a ring header ({HEADER_BYTES})"),
            );
            return Err(if alive || size == 0 {
                Retry::Later(Some(e))
            } else {
                Retry::Never(e)
            });
        }
        // Not through `fd`: the rank lock taken on `fd` below must end when
        // the descriptor is closed, even in a forked child that keeps the
        // mapping (see `LOCK_FDS`).
        let map = segment::map_apart(&fd, size).map_err(|e| io_err("cannot map", e))?;
        // SAFETY: the mapping is `size` bytes long and stays alive for this
        // borrow. Racing writes by another process can only make validation
        // fail; the copy taken by validate_header is what we keep.
        let bytes = unsafe { std::slice::from_raw_parts(map.as_ptr(), size as usize) };
        // SAFETY: as above; Header is made of atomics and HEADER_BYTES <= size.
        let header = unsafe { &*(map.as_ptr() as *const crate::layout::Header) };
        // SYNC POINT: Acquire pairs with the loader's Release store of READY:
        // every header field written before it is visible now.
        let st = header.state.load(Ordering::Acquire);
        // A loader still creating the segment has written no magic yet; any
        // other magic is a foreign file, refused at once.
        let magic = header.magic.load(Ordering::Relaxed);
        if magic != 0 && magic != MAGIC {
            return Err(Retry::Never(corrupt(
                &path,
                "bad magic (not made by ringfeed)",
            )));
        }
        if st == state::CREATING {
            let alive = segment::byte_is_locked(&fd, LOADER_LOCK_BYTE).unwrap_or(false);
            let e = corrupt(
                &path,
                "the loader died before it finished creating the segment",
            );
            return Err(if alive {
                Retry::Later(None)
            } else {
                Retry::Never(e)
            });
        }
        let (layout, job) = validate_header(bytes, &path).map_err(Retry::Never)?;
        let world_size = layout.geometry.world_size;
        if rank >= world_size {
            return Err(Retry::Never(AttachError::RankOutOfRange {
                name: name.to_string(),
                rank,
                world_size,
            }));
        }
        let view = View::new(map, layout);
        let loader_pid = view.header().loader_pid.load(Ordering::Relaxed);
        if !segment::byte_is_locked(&fd, LOADER_LOCK_BYTE)
            .map_err(|e| io_err("cannot check the loader lock of", e))?
        {
            // A dead loader's segment: a loader restarted under the same
            // name replaces it, so wait for that within the timeout, as for
            // a loader not started yet.
            return Err(Retry::Later(Some(AttachError::LoaderGone {
                name: name.to_string(),
                pid: loader_pid,
            })));
        }
        let block = view.rank(rank);
        match segment::try_lock_byte(&fd, segment::rank_lock_byte(rank)) {
            Ok(true) => {}
            Ok(false) => {
                let pid = block.consumer_pid.load(Ordering::Relaxed);
                // The pid alone could be another PID namespace's process (a
                // trainer in another container sharing /dev/shm), or the dead
                // consumer whose pid we were given again while the loader
                // reclaims its slots: only an attachment on record here is ours.
                if pid == std::process::id() && held_here(&fd, rank) {
                    return Err(Retry::Never(AttachError::RankHeldByThisProcess {
                        name: name.to_string(),
                        rank,
                        pid,
                    }));
                }
                return Err(Retry::Later(Some(AttachError::RankBusy {
                    name: name.to_string(),
                    rank,
                    pid,
                })));
            }
            Err(e) => return Err(io_err("cannot lock", e)),
        }
        // We hold the rank lock: we are now the writer of the consumer fields.
        // Give back whatever a previous consumer of this rank took and never
        // released, then continue with the next batch it did not take.
        let slots = view.rank_slots(rank);
        let (_, wake) = protocol::reclaim(block, &slots, &view.header().producer_sleeping);
        if wake {
            futex::wake_all(&block.release_futex);
        }
        let consumed = block.consumed.load(Ordering::Relaxed);
        block
            .consumer_pid
            .store(std::process::id(), Ordering::Relaxed);
        block.attach_count.fetch_add(1, Ordering::Relaxed);
        block.consumer_sleeping.store(0, Ordering::Relaxed);
        let k = layout.geometry.slots_per_rank as usize;
        let held = HeldHere::record(&fd, rank);
        Ok(Consumer {
            _held: held,
            name: name.to_string(),
            rank,
            job,
            lock_entry: register_lock_fd(fd.as_raw_fd()),
            fd: ManuallyDrop::new(fd),
            view,
            loader_pid,
            consumed,
            tables: vec![Vec::new(); k],
            abandoned: false,
            forks_at_attach: forks_so_far(),
            pid: std::process::id(),
            last_liveness: None,
        })
    }

    /// The rank this consumer serves.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Where the ring's ranks sit in the training job: this consumer is job
    /// rank `job().first_rank + rank()` of `job().job_world_size`.
    pub fn job(&self) -> Job {
        self.job
    }

    /// Batches this rank has taken in the run, by this process and by the
    /// ones attached to it before (a trainer that crashed): the number of
    /// the batch the next `next` returns, counted from 0.
    pub fn taken(&self) -> u64 {
        self.consumed
    }

    /// The loader's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The resume state once every rank has taken its batch of `step` in
    /// `epoch` (see [`Job::resume_state_after`]): what `serve --resume`
    /// takes to go on with the next step.
    pub fn resume_state_after(&self, epoch: u64, step: u64) -> Option<(u64, u64)> {
        self.job
            .resume_state_after(self.layout().geometry.max_samples_per_slot, epoch, step)
    }

    /// The ring's layout (world size, slot sizes).
    pub fn layout(&self) -> &Layout {
        self.view.layout()
    }

    /// Start and length of the payload region of every slot: the range a
    /// trainer pins once with `cudaHostRegister`.
    pub fn payload_region(&self) -> (*const u8, u64) {
        let l = self.view.layout();
        // SAFETY: payload_offset < segment_bytes = mapping length.
        let start = unsafe { self.view.base().add(l.payload_offset as usize) };
        (start, l.segment_bytes - l.payload_offset)
    }

    /// Batches this rank gets in the whole run, if the loader said.
    pub fn batches_expected(&self) -> Option<u64> {
        let v = self
            .view
            .rank(self.rank)
            .batches_expected
            .load(Ordering::Relaxed);
        (v != u64::MAX).then_some(v)
    }

    fn forked(&self) -> Option<Forked> {
        (FORKS.load(std::sync::atomic::Ordering::Relaxed) != self.forks_at_attach).then(|| Forked {
            name: self.name.clone(),
            rank: self.rank,
            attached_by: self.pid,
        })
    }

    /// Takes the next batch if one is published, with no system call.
    pub fn try_next(&mut self) -> Result<Option<BatchRef>, NextError> {
        if let Some(f) = self.forked() {
            return Err(f.into());
        }
        let block = self.view.rank(self.rank);
        let published = protocol::published_for(block);
        if published <= self.consumed {
            return Ok(None);
        }
        let k = u64::from(self.view.layout().geometry.slots_per_rank);
        if published - self.consumed > k {
            return Err(self.corrupt(format!(
                "{published} batches published but only {} taken and {k} slots",
                self.consumed
            )));
        }
        let batch = self.read_slot(self.consumed)?;
        self.consumed += 1;
        let block = self.view.rank(self.rank);
        // Only the rank's holder writes it; `stat` reads it.
        block.bytes_consumed.store(
            block
                .bytes_consumed
                .load(Ordering::Relaxed)
                .wrapping_add(batch.data_len),
            Ordering::Relaxed,
        );
        block.consumed.store(self.consumed, Ordering::Release);
        Ok(Some(batch))
    }

    fn corrupt(&self, what: String) -> NextError {
        NextError::Corrupt {
            name: self.name.clone(),
            what,
        }
    }

    /// Copies and checks the sample table of batch `seq`.
    fn read_slot(&mut self, seq: u64) -> Result<BatchRef, NextError> {
        let l = *self.view.layout();
        let slot = l.slot_of(self.rank, seq);
        let generation = l.generation_of(seq);
        let meta = self.view.slot(slot);
        let found = meta.generation.load(Ordering::Relaxed);
        if found != generation {
            return Err(self.corrupt(format!(
                "slot {slot} holds generation {found}, expected {generation}"
            )));
        }
        let n = meta.n_samples.load(Ordering::Relaxed);
        let used = meta.payload_used_bytes.load(Ordering::Relaxed);
        let payload_bytes = l.geometry.slot_payload_bytes;
        if n > l.geometry.max_samples_per_slot || used > payload_bytes {
            return Err(self.corrupt(format!(
                "slot {slot} claims {n} samples and {used} bytes, beyond its capacity"
            )));
        }
        let local = (slot - self.rank * l.geometry.slots_per_rank) as usize;
        let mut table = std::mem::take(&mut self.tables[local]);
        table.clear();
        table.reserve(n as usize);
        for i in 0..n {
            let cell = self.view.sample_cell(slot, i);
            let s = SampleEntry {
                offset: cell.offset.load(Ordering::Relaxed),
                len: cell.len.load(Ordering::Relaxed),
                index: cell.index.load(Ordering::Relaxed),
            };
            if s.offset.checked_add(s.len).is_none_or(|end| end > used) {
                self.tables[local] = table;
                return Err(self.corrupt(format!(
                    "slot {slot} sample {i} (offset {}, {} bytes) lies outside its {used} bytes",
                    s.offset, s.len
                )));
            }
            table.push(s);
        }
        let batch = BatchRef {
            slot,
            generation,
            epoch: meta.epoch.load(Ordering::Relaxed),
            step: meta.step.load(Ordering::Relaxed),
            seq,
            data: self.view.payload(slot),
            data_len: used,
            samples: table.as_ptr(),
            n_samples: n,
        };
        self.tables[local] = table;
        Ok(batch)
    }

    fn loader_alive(&self) -> bool {
        // An error from fcntl itself is treated as alive: we only declare the
        // loader gone on the kernel's positive word that its lock is free.
        segment::byte_is_locked(&self.fd, LOADER_LOCK_BYTE).unwrap_or(true)
    }

    fn end_or_abort(&self) -> Option<Result<Next, NextError>> {
        let block = self.view.rank(self.rank);
        if protocol::finished(block) && protocol::published_for(block) <= self.consumed {
            return Some(Ok(Next::End));
        }
        // SYNC POINT: Acquire pairs with the Release of ABORTED in `abort`.
        let header = self.view.header();
        if header.state.load(Ordering::Acquire) == state::ABORTED
            && protocol::published_for(block) <= self.consumed
        {
            let code = header.abort_code.load(Ordering::Relaxed);
            let reason = match code {
                0 => "it stopped on an error; see its log".to_string(),
                c => format!("it received signal {c}"),
            };
            return Some(Err(NextError::Aborted {
                name: self.name.clone(),
                reason,
            }));
        }
        None
    }

    /// Takes the next batch, waiting at most `timeout` (None: no limit). A
    /// ready batch costs no system call; otherwise it spins for
    /// [`SPIN_BEFORE_SLEEP`], then sleeps on the rank's futex in slices of
    /// [`WAIT_SLICE`], re-checking the loader's liveness after each.
    pub fn next(&mut self, timeout: Option<Duration>) -> Result<Next, NextError> {
        if let Some(b) = self.try_next()? {
            return Ok(Next::Batch(b));
        }
        let start = Instant::now();
        let mut counted = start;
        let result = self.wait_next(start, timeout, &mut counted);
        self.count_wait(&mut counted);
        result
    }

    /// Adds the time since `counted` to the rank's wait total (`ringfeed
    /// stat`) and moves `counted` to now: after every wait slice, so that a
    /// trainer starved for minutes shows it while it waits, not once its
    /// batch comes.
    fn count_wait(&self, counted: &mut Instant) {
        let now = Instant::now();
        let waited = now.duration_since(*counted).as_nanos() as u64;
        self.view
            .rank(self.rank)
            .wait_ns_total
            .fetch_add(waited, Ordering::Relaxed);
        *counted = now;
    }

    fn wait_next(
        &mut self,
        start: Instant,
        timeout: Option<Duration>,
        counted: &mut Instant,
    ) -> Result<Next, NextError> {
        let deadline = timeout.map(|t| start + t);
        let spin_until = start + SPIN_BEFORE_SLEEP;
        if let Some(r) = self.end_or_abort() {
            return r;
        }
        // Checked once: only this consumer can free that slot, and it is in
        // this call (a feed is used by one thread at a time).
        if let Some(e) = self.next_slot_held() {
            // A dead loader is the bigger news, and ends the run anyway.
            if !self.loader_alive() {
                return Err(NextError::LoaderGone {
                    name: self.name.clone(),
                    pid: self.loader_pid,
                });
            }
            return Err(e);
        }
        let mut checked_this_call = false;
        loop {
            if let Some(b) = self.try_next()? {
                return Ok(Next::Batch(b));
            }
            if let Some(r) = self.end_or_abort() {
                return r;
            }
            let now = Instant::now();
            let out_of_time = deadline.is_some_and(|d| now >= d);
            if now < spin_until && !out_of_time {
                std::hint::spin_loop();
                continue;
            }
            // Liveness is checked before the first sleep of a call, so a
            // consumer that calls `next` after the loader died learns it at
            // once, and at least once a wait slice across calls, so one that
            // polls with no timeout (and never sleeps) learns it too.
            let first_sleep = !checked_this_call && !out_of_time;
            if first_sleep
                || self
                    .last_liveness
                    .is_none_or(|t| now.duration_since(t) >= WAIT_SLICE)
            {
                checked_this_call = true;
                if !self.loader_alive() {
                    // One more look: a loader that published its last batch and
                    // exited cleanly leaves those batches for us to take.
                    if let Some(b) = self.try_next()? {
                        return Ok(Next::Batch(b));
                    }
                    if let Some(r) = self.end_or_abort() {
                        return r;
                    }
                    return Err(NextError::LoaderGone {
                        name: self.name.clone(),
                        pid: self.loader_pid,
                    });
                }
                self.last_liveness = Some(now);
            }
            if out_of_time {
                return Ok(Next::Timeout);
            }
            let slice = deadline.map_or(WAIT_SLICE, |d| {
                d.saturating_duration_since(now).min(WAIT_SLICE)
            });
            self.sleep(slice);
            self.count_wait(counted);
        }
    }

    /// The error for a wait that cannot end: the slot of the next batch
    /// still holds an earlier batch of ours, which only we can give back
    /// (a feed is used by one thread at a time, so nothing frees it while
    /// we wait). None when that slot is free, when the next batch is the
    /// rank's first use of it, or when there is no next batch (the wait
    /// ends with the end of the run).
    fn next_slot_held(&self) -> Option<NextError> {
        if self.batches_expected().is_some_and(|n| self.consumed >= n) {
            return None;
        }
        let l = self.view.layout();
        let k = u64::from(l.geometry.slots_per_rank);
        let previous = self.consumed.checked_sub(k)?;
        let slot = l.slot_of(self.rank, previous);
        let meta = self.view.slot(slot);
        // Batch `previous` was taken by this consumer (attach gave back all a
        // predecessor held), so an unreleased generation there is ours.
        if meta.released.load(Ordering::Acquire) >= l.generation_of(previous) {
            return None;
        }
        Some(NextError::SlotHeld {
            name: self.name.clone(),
            rank: self.rank,
            slot,
            epoch: meta.epoch.load(Ordering::Relaxed),
            step: meta.step.load(Ordering::Relaxed),
            slots_per_rank: l.geometry.slots_per_rank,
        })
    }

    fn sleep(&self, slice: Duration) {
        let block = self.view.rank(self.rank);
        let seen = block.publish_futex.load(Ordering::Acquire);
        block.consumer_sleeping.store(1, Ordering::Relaxed);
        // SYNC POINT: SeqCst fence against the loader's fence in `publish`
        // (Dekker): either it sees us sleeping and wakes us, or we see its
        // batch in the re-check below and do not sleep.
        crate::sync::fence(Ordering::SeqCst);
        // An abort bumps `publish_futex` after storing ABORTED: if that bump
        // came before our load of `seen`, no wake is coming, and the futex
        // value would not stop the wait either; its state stops it here.
        let ready = protocol::published_for(block) > self.consumed
            || protocol::finished(block)
            || self.view.header().state.load(Ordering::Acquire) == state::ABORTED;
        if !ready {
            futex::wait(&block.publish_futex, seen, slice);
        }
        block.consumer_sleeping.store(0, Ordering::Relaxed);
    }

    /// Releases a batch taken by `next`; its slot may be refilled at once.
    pub fn release(&mut self, slot: u32, generation: u64) -> Result<(), ReleaseError> {
        self.release_checked(slot, generation, None)
    }

    /// [`Consumer::release`] of a batch handle that also carries its payload
    /// pointer (the C API's `rf_batch`): a handle of another feed, whose slot
    /// and generation may well name a batch this feed holds, is refused
    /// (`OtherFeed`) instead of giving that batch back.
    pub fn release_handle(
        &mut self,
        slot: u32,
        generation: u64,
        data: *const u8,
    ) -> Result<(), ReleaseError> {
        self.release_checked(slot, generation, Some(data))
    }

    fn release_checked(
        &mut self,
        slot: u32,
        generation: u64,
        data: Option<*const u8>,
    ) -> Result<(), ReleaseError> {
        if let Some(f) = self.forked() {
            return Err(f.into());
        }
        let k = self.view.layout().geometry.slots_per_rank;
        if slot / k != self.rank || slot >= self.view.layout().slot_count() {
            return Err(ReleaseError::NotOurs {
                slot,
                rank: self.rank,
            });
        }
        if data.is_some_and(|d| d != self.view.payload(slot)) {
            return Err(ReleaseError::OtherFeed { slot });
        }
        // Releasing a published batch that `next` has not handed out would let
        // the loader overwrite it unseen: the batch would be lost.
        let local = u64::from(slot % k);
        let taken = generation
            .checked_sub(1)
            .and_then(|g| g.checked_mul(u64::from(k)))
            .and_then(|s| s.checked_add(local));
        if taken.is_none_or(|seq| seq >= self.consumed) {
            return Err(ReleaseError::NotTaken { slot, generation });
        }
        let block = self.view.rank(self.rank);
        let header = self.view.header();
        match protocol::release(
            block,
            self.view.slot(slot),
            generation,
            &header.producer_sleeping,
        ) {
            Ok(wake) => {
                block.released_total.fetch_add(1, Ordering::Relaxed);
                if wake {
                    futex::wake_all(&block.release_futex);
                }
                Ok(())
            }
            Err(ReleaseRefusal::Stale { current }) => Err(ReleaseError::Stale {
                slot,
                generation,
                current,
            }),
            Err(ReleaseRefusal::AlreadyReleased) => {
                Err(ReleaseError::AlreadyReleased { slot, generation })
            }
        }
    }

    /// Simulates a consumer that dies at the worst moment: nothing is released
    /// and no field is cleaned up; only the kernel's part (the lock going away
    /// with the descriptor) happens. For crash tests in one process.
    pub fn abandon(mut self) {
        self.abandoned = true;
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        // A forked child's copy shares the parent's descriptor and rank lock:
        // it unmaps and closes its own copies only, and leaves the rank's
        // fields and slots to the parent.
        let forked = self.forked().is_some();
        if !self.abandoned && !forked {
            // Detach: give back what we hold so the loader need not wait for
            // its periodic reclaim, then let closing the descriptor drop our
            // lock.
            let block = self.view.rank(self.rank);
            let slots = self.view.rank_slots(self.rank);
            let (_, wake) = protocol::reclaim(block, &slots, &self.view.header().producer_sleeping);
            if wake {
                futex::wake_all(&block.release_futex);
            }
            block.consumer_pid.store(0, Ordering::Relaxed);
        }
        match self.lock_entry {
            // The atfork handler closed the child's copy; its number may
            // belong to another file by now.
            Some(_) if forked => return,
            Some(entry) => LOCK_FDS[entry].store(-1, std::sync::atomic::Ordering::Relaxed),
            None => {}
        }
        // SAFETY: the descriptor is not used after this.
        unsafe { ManuallyDrop::drop(&mut self.fd) };
    }
}

/// The ranks this process has attached and not detached, by segment file
/// (device, inode) and rank: what tells "this process holds the rank" from
/// an equal pid in another PID namespace.
static HELD_HERE: std::sync::Mutex<Vec<(u64, u64, u32)>> = std::sync::Mutex::new(Vec::new());

fn held_here_list() -> std::sync::MutexGuard<'static, Vec<(u64, u64, u32)>> {
    HELD_HERE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// True if this process attached `rank` of the segment open as `fd` and has
/// not detached it.
fn held_here(fd: &OwnedFd, rank: u32) -> bool {
    segment::file_id(fd).is_ok_and(|(dev, ino)| held_here_list().contains(&(dev, ino, rank)))
}

/// A consumer's entry in [`HELD_HERE`], removed when it is dropped.
struct HeldHere(Option<(u64, u64, u32)>);

impl HeldHere {
    fn record(fd: &OwnedFd, rank: u32) -> HeldHere {
        let entry = segment::file_id(fd).ok().map(|(dev, ino)| (dev, ino, rank));
        if let Some(e) = entry {
            held_here_list().push(e);
        }
        HeldHere(entry)
    }
}

impl Drop for HeldHere {
    fn drop(&mut self) {
        if let Some(e) = self.0 {
            let mut list = held_here_list();
            if let Some(i) = list.iter().position(|&x| x == e) {
                list.swap_remove(i);
            }
        }
    }
}

enum Retry {
    /// Not yet: retry until the timeout, then report this error (or a timeout).
    Later(Option<AttachError>),
    /// Final.
    Never(AttachError),
}
