//! The loader's side of the ring: create the segment, fill slots in place,
//! publish them in order, reclaim slots of consumers that died, end the run.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::futex;
use crate::layout::{
    state, GeometryError, Job, Layout, RingGeometry, ABI_VERSION, HEADER_BYTES, MAGIC, PAGE_BYTES,
};
use crate::protocol;
use crate::segment::{self, human_bytes, NameError, LOADER_LOCK_BYTE};
use crate::sync::Ordering;
use crate::view::View;
use crate::SampleEntry;

/// Why a ring could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The name is not allowed.
    #[error(transparent)]
    Name(#[from] NameError),
    /// The geometry is out of range.
    #[error("cannot build a ring of this shape: {0}")]
    Geometry(#[from] GeometryError),
    /// The ring's ranks do not lie inside the job (`create_in_job`).
    #[error("cannot build a ring whose ranks are not all in the job: {0}")]
    Job(String),
    /// Another live loader has this name.
    #[error("a loader named {name:?} is already running ({}); stop it or choose another --name", running_pid(*pid))]
    AlreadyRunning {
        /// The name.
        name: String,
        /// Its pid, as recorded in its segment (0: not recorded yet).
        pid: u32,
    },
    /// /dev/shm has not enough room.
    #[error(
        "/dev/shm is too small for the ring {path}: it needs {} ({needed_bytes} bytes) but only {}{}. \
         Give shared memory more room: `docker run --shm-size={}`, or in Kubernetes mount an `emptyDir` with `medium: Memory` \
         (and a sizeLimit of at least {}) at /dev/shm; or make the ring smaller",
        human_bytes(*needed_bytes), room_left(room), others_clause(room), docker_size(*suggest_mib), kubernetes_size(*suggest_mib)
    )]
    ShmTooSmall {
        /// The segment path.
        path: String,
        /// Bytes the segment needs.
        needed_bytes: u64,
        /// /dev/shm's free bytes, and the other live loaders' rings that
        /// will still take part of them as their slots are first claimed.
        room: segment::Room,
        /// A size of /dev/shm to suggest, in MiB: what it holds now, the
        /// rings promised and this one, and a quarter more.
        suggest_mib: u64,
    },
    /// /dev/shm filled up after the ring was created: a slot could not be
    /// allocated.
    #[error(
        "/dev/shm filled up while the loader ran: slot {slot} of the ring {path} ({slot_size}) could not be allocated, \
         {free} ({free_bytes} bytes) are free. Something else is using /dev/shm (another loader? see `df -h /dev/shm` and \
         `ringfeed gc`); give shared memory more room (`docker run --shm-size=...`, or a Kubernetes `emptyDir` with \
         `medium: Memory`), or make the ring smaller (--slots-per-rank, --batch-size)"
    )]
    ShmFull {
        /// The segment path.
        path: String,
        /// The slot.
        slot: u32,
        /// Human-readable slot size.
        slot_size: String,
        /// Bytes free in /dev/shm.
        free_bytes: u64,
        /// Human-readable free.
        free: String,
    },
    /// The name is taken by something ringfeed did not make.
    #[error("{path} is {what}, not a ringfeed segment: ringfeed leaves it alone, since something else made it; remove it if nothing uses it, or choose another --name")]
    NotASegment {
        /// The segment path.
        path: String,
        /// What it is.
        what: String,
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

/// The other loader's pid in words: 0 means it is still creating its segment.
fn running_pid(pid: u32) -> String {
    if pid == 0 {
        "it is creating its segment right now".to_string()
    } else {
        format!("pid {pid}")
    }
}

/// A slot claimed for filling: the loader owns its payload until `publish`.
#[derive(Debug)]
pub struct SlotClaim {
    rank: u32,
    seq: u64,
    slot: u32,
    generation: u64,
    payload: *mut u8,
    payload_bytes: u64,
}

// SAFETY: a claim is an exclusive right to one slot's payload; the pointer
// stays valid for as long as the Producer (which outlives claims by API
// contract: publish takes both) and nothing else writes there until publish.
unsafe impl Send for SlotClaim {}

impl SlotClaim {
    /// The rank the batch goes to.
    pub fn rank(&self) -> u32 {
        self.rank
    }
    /// The batch's sequence number within its rank.
    pub fn seq(&self) -> u64 {
        self.seq
    }
    /// Global slot index.
    pub fn slot(&self) -> u32 {
        self.slot
    }
    /// Start of the slot's payload (page-aligned), writable until publish.
    pub fn payload_ptr(&self) -> *mut u8 {
        self.payload
    }
    /// Size of the payload.
    pub fn payload_bytes(&self) -> u64 {
        self.payload_bytes
    }
    /// The payload as a slice, for filling it from Rust.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        // SAFETY: the claim grants exclusive access to `payload_bytes` bytes at
        // `payload` (the consumer released the slot and cannot see it again
        // before publish); `&mut self` keeps this slice unique.
        unsafe { std::slice::from_raw_parts_mut(self.payload, self.payload_bytes as usize) }
    }
}

/// A batch that cannot be published as described.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// Batches of a rank must be published in claim order.
    #[error("rank {rank}: batch {seq} published before batch {expected}")]
    OutOfOrder {
        /// Rank.
        rank: u32,
        /// Seq of this claim.
        seq: u64,
        /// Seq expected next.
        expected: u64,
    },
    /// More samples than the slot's table holds.
    #[error("batch has {n} samples but a slot holds at most {max}")]
    TooManySamples {
        /// Samples given.
        n: usize,
        /// Capacity.
        max: u32,
    },
    /// A sample lies outside the payload.
    #[error("sample {i} (offset {offset}, {len} bytes) lies outside the {payload_bytes}-byte slot payload")]
    SampleOutOfBounds {
        /// Position in the batch.
        i: usize,
        /// Its offset.
        offset: u64,
        /// Its length.
        len: u64,
        /// Payload size.
        payload_bytes: u64,
    },
}

/// Batches given back for a consumer that went away without releasing them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reclaimed {
    /// The rank.
    pub rank: u32,
    /// How many batches it still held.
    pub batches: u64,
    /// It had taken every batch of the run: a trainer that exits after its
    /// last batch, still holding it, is normal, not a crash.
    pub took_every_batch: bool,
}

/// The loader's handle on a ring it created. Dropping it marks the ring
/// aborted (if it had not ended) and removes the name from /dev/shm.
pub struct Producer {
    name: String,
    path: String,
    fd: OwnedFd,
    view: View,
    next_claim: Vec<u64>,
    published: Vec<u64>,
    /// Set by `abandon`: drop leaves the ring as a dead process would.
    abandoned: bool,
    /// `remove_name` ran: the name in /dev/shm is no longer ours.
    name_removed: bool,
    /// Per slot: its payload is allocated in /dev/shm (see `Backing`).
    backing: Arc<Backing>,
    /// The thread `reserve_rest` started; Drop stops and joins it.
    reserver: Option<std::thread::JoinHandle<()>>,
}

/// Which slot payloads are allocated in /dev/shm. `create` checks that the
/// whole ring fits and allocates the header and tables only; each payload is
/// allocated by its first claim, or earlier by `reserve_rest`. The loader thus
/// never writes a page /dev/shm could refuse (no SIGBUS), and a large ring
/// serves its first batches without first spending 100 ms per 400 MiB in
/// fallocate (a 6 MiB slot costs its first claim about 1.6 ms).
struct Backing {
    /// Per slot: allocated (Release after the fallocate).
    allocated: Vec<AtomicBool>,
    /// Tells the `reserve_rest` thread to stop.
    stop: AtomicBool,
}

impl Backing {
    /// Allocates slot `slot`'s payload in /dev/shm unless that was done (by
    /// the claim or by the `reserve_rest` thread; doing it twice is harmless).
    fn allocate_slot(&self, fd: &OwnedFd, layout: &Layout, slot: u32) -> io::Result<()> {
        use std::sync::atomic::Ordering as O;
        let flag = &self.allocated[slot as usize];
        if flag.load(O::Acquire) {
            return Ok(());
        }
        segment::allocate(
            fd,
            layout.payload_offset_of(slot),
            layout.geometry.slot_payload_bytes,
        )?;
        flag.store(true, O::Release);
        Ok(())
    }
}

/// The `reserve_rest` thread.
fn reserve_slots(fd: &OwnedFd, backing: &Backing, layout: &Layout) {
    let g = layout.geometry;
    for k in 0..g.slots_per_rank {
        for r in 0..g.world_size {
            if backing.stop.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            let slot = r * g.slots_per_rank + k;
            if let Err(e) = backing.allocate_slot(fd, layout, slot) {
                tracing::debug!("reserving the ring stopped at slot {slot}: {e}");
                return;
            }
        }
    }
}

/// `ShmTooSmall` for a ring of `needed_bytes` with only `room`.
fn shm_too_small(path: &str, needed_bytes: u64, room: segment::Room) -> CreateError {
    let suggest_mib = suggest_shm_mib(needed_bytes, &room);
    CreateError::ShmTooSmall {
        path: path.to_string(),
        needed_bytes,
        room,
        suggest_mib,
    }
}

/// A /dev/shm size in MiB: what it holds now, the rings promised, this
/// ring, and a quarter more (NCCL keeps buffers there too); in steps of
/// 256 MiB below 4 GiB, of 1 GiB above.
fn suggest_shm_mib(needed_bytes: u64, room: &segment::Room) -> u64 {
    let (mib, gib) = (1u64 << 20, 1u64 << 30);
    let used = room.size_bytes.saturating_sub(room.free_bytes);
    let want = used
        .saturating_add(room.promised_bytes())
        .saturating_add(needed_bytes);
    let want = want.saturating_add(want / 4);
    if want < 4 * gib {
        want.div_ceil(256 * mib).max(1) * 256
    } else {
        want.div_ceil(gib) * 1024
    }
}

/// `mib` as `docker run --shm-size` takes it ("768m", "6g").
fn docker_size(mib: u64) -> String {
    if mib.is_multiple_of(1024) {
        format!("{}g", mib / 1024)
    } else {
        format!("{mib}m")
    }
}

/// `mib` as a Kubernetes quantity ("768Mi", "6Gi"): there "m" is a
/// thousandth, and "768m" would be under one byte.
fn kubernetes_size(mib: u64) -> String {
    if mib.is_multiple_of(1024) {
        format!("{}Gi", mib / 1024)
    } else {
        format!("{mib}Mi")
    }
}

/// "R (r bytes) are free" (or "left", when other rings take part of the
/// free bytes) for `ShmTooSmall`.
fn room_left(room: &segment::Room) -> String {
    let left = room.left();
    format!(
        "{} ({left} bytes) are {}",
        human_bytes(left),
        if room.promised.is_empty() {
            "free"
        } else {
            "left"
        }
    )
}

/// Empty, or the clause of `ShmTooSmall` that says where the free bytes
/// went: the rings other loaders will still allocate.
fn others_clause(room: &segment::Room) -> String {
    if room.promised.is_empty() {
        return String::new();
    }
    let rings: Vec<String> = room
        .promised
        .iter()
        .map(|p| format!("{} {}", p.path.display(), human_bytes(p.bytes)))
        .collect();
    format!(
        ": {} are free, of which {} are promised to the rings of other running loaders, allocated as their slots fill ({})",
        human_bytes(room.free_bytes),
        human_bytes(room.promised_bytes()),
        rings.join(", ")
    )
}

/// The error for a failed allocation of part of the segment.
fn alloc_error(path: &str, fd: &OwnedFd, needed_bytes: u64, e: io::Error) -> CreateError {
    if e.raw_os_error() == Some(libc::ENOSPC) {
        let room = segment::room_of(fd).unwrap_or(segment::Room {
            size_bytes: 0,
            free_bytes: 0,
            promised: Vec::new(),
        });
        shm_too_small(path, needed_bytes, room)
    } else {
        CreateError::Io {
            what: "cannot allocate",
            path: path.to_string(),
            source: e,
        }
    }
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Producer {
    /// Creates the segment `/ringfeed-NAME` (mode 0600, O_EXCL, every byte
    /// allocated now) and opens it to consumers. A segment of that name left by
    /// a dead loader is replaced; one whose loader lives is an error.
    pub fn create(name: &str, geometry: RingGeometry) -> Result<Producer, CreateError> {
        Self::create_in_job(name, geometry, Job::single(geometry.world_size))
    }

    /// [`Producer::create`] for a loader that serves part of a job spread
    /// over several machines: its ranks are the job's `job.first_rank..`.
    pub fn create_in_job(
        name: &str,
        geometry: RingGeometry,
        job: Job,
    ) -> Result<Producer, CreateError> {
        segment::validate_name(name)?;
        if let Err(e) = Job::from_header(
            job.first_rank,
            job.job_world_size,
            geometry.world_size,
            job.plan_digest,
            job.start,
        ) {
            return Err(CreateError::Job(e));
        }
        let layout = Layout::compute(geometry)?;
        let path = segment::shm_path(name).display().to_string();
        let io_err = |what, source| CreateError::Io {
            what,
            path: path.clone(),
            source,
        };
        // Held from before the name is taken to the sizing: another loader
        // (or `ringfeed gc`) never sees this segment between its shm_open and
        // its lock, where it would look dead, and the room check below and
        // the sizing are one step against loaders starting at once.
        let shm_lock = segment::ShmDirLock::take();
        let fd = match segment::shm_open(name, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o600) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                Self::remove_if_dead(name)?;
                segment::shm_open(name, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o600)
                    .map_err(|e| io_err("cannot create", e))?
            }
            Err(e) => return Err(io_err("cannot create", e)),
        };
        let created = CreatedGuard { name };
        match segment::try_lock_byte(&fd, LOADER_LOCK_BYTE) {
            Ok(true) => {}
            Ok(false) => {
                return Err(io_err(
                    "cannot lock",
                    io::Error::from_raw_os_error(libc::EAGAIN),
                ))
            }
            Err(e) => return Err(io_err("cannot lock", e)),
        }
        // Room for the whole ring must be free now, less what other loaders'
        // rings will still allocate; the payloads themselves are allocated
        // slot by slot (see `Backing`).
        if let Some(room) = segment::shm_room_for(name) {
            if room.left() < layout.segment_bytes {
                return Err(shm_too_small(&path, layout.segment_bytes, room));
            }
        }
        segment::set_len(&fd, layout.segment_bytes).map_err(|e| io_err("cannot size", e))?;
        drop(shm_lock);
        segment::allocate(&fd, 0, layout.payload_offset)
            .map_err(|e| alloc_error(&path, &fd, layout.segment_bytes, e))?;
        let map = segment::map(&fd, layout.segment_bytes).map_err(|e| io_err("cannot map", e))?;
        let view = View::new(map, layout);
        Self::write_header(&view, job);
        let w = layout.geometry.world_size as usize;
        let backing = Arc::new(Backing {
            allocated: (0..layout.slot_count())
                .map(|_| AtomicBool::new(false))
                .collect(),
            stop: AtomicBool::new(false),
        });
        let producer = Producer {
            name: name.to_string(),
            path,
            fd,
            view,
            next_claim: vec![0; w],
            published: vec![0; w],
            abandoned: false,
            name_removed: false,
            backing,
            reserver: None,
        };
        // SYNC POINT: Release pairs with the consumer's Acquire of `state` in
        // attach: a consumer that reads READY sees every header field.
        producer
            .view
            .header()
            .state
            .store(state::READY, Ordering::Release);
        std::mem::forget(created);
        Ok(producer)
    }

    /// Allocates slot `slot`'s payload in /dev/shm unless that was done.
    fn ensure_allocated(&mut self, slot: u32) -> Result<(), CreateError> {
        let l = self.view.layout();
        self.backing.allocate_slot(&self.fd, l, slot).map_err(|e| {
            if matches!(e.raw_os_error(), Some(libc::ENOSPC)) {
                let free_bytes = segment::free_bytes(&self.fd).unwrap_or(0);
                CreateError::ShmFull {
                    path: self.path.clone(),
                    slot,
                    slot_size: human_bytes(l.geometry.slot_payload_bytes),
                    free_bytes,
                    free: human_bytes(free_bytes),
                }
            } else {
                CreateError::Io {
                    what: "cannot allocate",
                    path: self.path.clone(),
                    source: e,
                }
            }
        })
    }

    /// Allocates, on a thread of its own, every slot payload not allocated
    /// yet, in claim order (every rank's next slot, then the one after, ...).
    /// The loader calls it once every rank has its first batch: from then on
    /// the whole ring is taken from /dev/shm within about 0.1 s per 400 MiB,
    /// charged to the loader, so that a full /dev/shm shows up at once and a
    /// trainer that pins the payload region (`cudaHostRegister`) finds the
    /// pages there. A slot it has not reached is allocated by its claim; an
    /// error stops it quietly and the claim that needs the slot reports it.
    pub fn reserve_rest(&mut self) {
        if self.reserver.is_some() {
            return;
        }
        let Ok(fd) = self.fd.try_clone() else {
            return;
        };
        let backing = Arc::clone(&self.backing);
        let layout = *self.view.layout();
        self.reserver = std::thread::Builder::new()
            .name("ringfeed-reserve".into())
            .spawn(move || reserve_slots(&fd, &backing, &layout))
            .ok();
    }

    /// Stops and joins the thread `reserve_rest` started: a stopping loader
    /// allocates no more of the ring.
    fn stop_reserving(&mut self) {
        self.backing
            .stop
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.reserver.take() {
            let _ = t.join();
        }
    }

    /// Fails with AlreadyRunning if a live loader holds `name`: for a check
    /// before the listing, which can take minutes. A dead loader's segment
    /// passes (create replaces it). `name` has passed `segment::validate_name`.
    pub fn check_name_free(name: &str) -> Result<(), CreateError> {
        Self::dead_segment_there(name).map(|_| ())
    }

    /// Ok(true) if a dead loader's segment holds `name`, Ok(false) if no
    /// segment does; AlreadyRunning if a live loader (or one creating its
    /// segment right now) holds it.
    fn dead_segment_there(name: &str) -> Result<bool, CreateError> {
        let path = segment::shm_path(name).display().to_string();
        let fd = match segment::shm_open(name, libc::O_RDWR, 0) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(false),
            Err(_) if segment::is_a_directory(name) => {
                return Err(CreateError::NotASegment {
                    path,
                    what: "a directory".into(),
                })
            }
            Err(e) => return Err(open_existing_error(&path, e)),
        };
        if let Some(what) = segment::not_a_segment(&fd) {
            return Err(CreateError::NotASegment { path, what });
        }
        if segment::byte_is_locked(&fd, LOADER_LOCK_BYTE).map_err(|source| CreateError::Io {
            what: "cannot check",
            path,
            source,
        })? {
            let pid = read_loader_pid(&fd).unwrap_or(0);
            return Err(CreateError::AlreadyRunning {
                name: name.to_string(),
                pid,
            });
        }
        if segment::is_fresh_and_empty(&fd) {
            // A loader that could not take the /dev/shm lock, between its
            // shm_open and its own lock.
            return Err(CreateError::AlreadyRunning {
                name: name.to_string(),
                pid: 0,
            });
        }
        Ok(true)
    }

    /// Removes the segment of loader `name` if its loader is dead, so that
    /// trainers attaching while a new loader of the name lists its dataset
    /// wait for it instead of reporting the dead one. A live loader's
    /// segment, or none, is left as it is.
    pub fn remove_dead_segment(name: &str) -> Result<(), CreateError> {
        // Under the /dev/shm lock, as in `create`: a loader between its
        // shm_open and its lock is never taken for a dead one.
        let _shm_lock = segment::ShmDirLock::take();
        Self::remove_if_dead(name)
    }

    fn remove_if_dead(name: &str) -> Result<(), CreateError> {
        if !Self::dead_segment_there(name)? {
            return Ok(()); // gone meanwhile: the caller creates it anew
        }
        let path = segment::shm_path(name).display().to_string();
        tracing::warn!("removing {path}, left behind by a loader that died");
        segment::shm_unlink(name).map_err(|source| CreateError::Io {
            what: "cannot remove stale",
            path,
            source,
        })
    }

    fn write_header(view: &View, job: Job) {
        let l = view.layout();
        let g = l.geometry;
        let h = view.header();
        let r = Ordering::Relaxed;
        h.magic.store(MAGIC, r);
        h.abi_version.store(ABI_VERSION, r);
        h.header_bytes.store(HEADER_BYTES as u32, r);
        h.world_size.store(g.world_size, r);
        h.slots_per_rank.store(g.slots_per_rank, r);
        h.max_samples_per_slot.store(g.max_samples_per_slot, r);
        h.page_bytes.store(PAGE_BYTES as u32, r);
        h.slot_payload_bytes.store(g.slot_payload_bytes, r);
        h.segment_bytes.store(l.segment_bytes, r);
        h.rank_table_offset.store(l.rank_table_offset, r);
        h.slot_table_offset.store(l.slot_table_offset, r);
        h.payload_offset.store(l.payload_offset, r);
        h.slot_meta_bytes.store(l.slot_meta_bytes, r);
        h.loader_pid.store(std::process::id(), r);
        h.created_unix_ms.store(now_unix_ms(), r);
        h.job_world_size.store(job.job_world_size, r);
        h.first_rank.store(job.first_rank, r);
        h.plan_digest.store(job.plan_digest, r);
        if let Some(start) = job.start {
            h.start_epoch.store(start.epoch, r);
            h.start_samples.store(start.samples_consumed, r);
            h.dataset_samples.store(start.dataset_samples, r);
            h.flags.fetch_or(crate::layout::flags::START_KNOWN, r);
        }
        if let Some(order) = job.order {
            h.order_seed.store(order.seed, r);
            h.order_shuffled.store(u64::from(order.shuffled), r);
            h.flags.fetch_or(crate::layout::flags::ORDER_KNOWN, r);
        }
        for rank in 0..g.world_size {
            view.rank(rank).batches_expected.store(u64::MAX, r);
        }
        for slot in 0..l.slot_count() {
            view.slot(slot).rank.store(slot / g.slots_per_rank, r);
        }
    }

    /// The loader's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The ring's layout.
    pub fn layout(&self) -> &Layout {
        self.view.layout()
    }

    /// Records how many batches `rank` gets in the whole run (for progress).
    pub fn set_batches_expected(&self, rank: u32, batches: u64) {
        self.view
            .rank(rank)
            .batches_expected
            .store(batches, Ordering::Relaxed);
    }

    /// Records the reader backend and reads in flight (for `ringfeed stat`).
    pub fn set_reader_info(&self, backend: &str, in_flight: u32) {
        let h = self.view.header();
        let mut bytes = [0u8; 16];
        let n = backend.len().min(16);
        bytes[..n].copy_from_slice(&backend.as_bytes()[..n]);
        for (i, cell) in h.reader_backend.iter().enumerate() {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            cell.store(u64::from_le_bytes(word), Ordering::Relaxed);
        }
        h.reads_in_flight.store(in_flight, Ordering::Relaxed);
    }

    /// Claims rank's next slot if its previous batch was released: `Ok(None)`
    /// while it is still held. The first claim of a slot allocates its
    /// payload in /dev/shm unless `reserve_rest` already did; that fails with
    /// `ShmFull` when /dev/shm filled up since `create`.
    pub fn try_claim(&mut self, rank: u32) -> Result<Option<SlotClaim>, CreateError> {
        let l = *self.view.layout();
        let seq = self.next_claim[rank as usize];
        let slot = l.slot_of(rank, seq);
        let generation = l.generation_of(seq);
        if !protocol::slot_is_free(self.view.slot(slot), generation) {
            return Ok(None);
        }
        self.ensure_allocated(slot)?;
        self.next_claim[rank as usize] = seq + 1;
        Ok(Some(SlotClaim {
            rank,
            seq,
            slot,
            generation,
            payload: self.view.payload(slot),
            payload_bytes: l.geometry.slot_payload_bytes,
        }))
    }

    /// True when rank's next slot is free (`try_claim` would take it, unless
    /// allocating it fails).
    pub fn can_claim(&self, rank: u32) -> bool {
        let l = self.view.layout();
        let seq = self.next_claim[rank as usize];
        protocol::slot_is_free(self.view.slot(l.slot_of(rank, seq)), l.generation_of(seq))
    }

    /// Number of batches claimed for `rank` so far (the next claim's seq).
    pub fn claimed(&self, rank: u32) -> u64 {
        self.next_claim[rank as usize]
    }

    /// Number of batches published to `rank` so far.
    pub fn published(&self, rank: u32) -> u64 {
        self.published[rank as usize]
    }

    /// Publishes a filled slot. `samples` give each sample's place in the
    /// payload and its manifest index. Claims of one rank publish in order.
    pub fn publish(
        &mut self,
        claim: SlotClaim,
        epoch: u64,
        step: u64,
        samples: &[SampleEntry],
    ) -> Result<(), PublishError> {
        let l = *self.view.layout();
        let r = claim.rank as usize;
        if claim.seq != self.published[r] {
            return Err(PublishError::OutOfOrder {
                rank: claim.rank,
                seq: claim.seq,
                expected: self.published[r],
            });
        }
        if samples.len() > l.geometry.max_samples_per_slot as usize {
            return Err(PublishError::TooManySamples {
                n: samples.len(),
                max: l.geometry.max_samples_per_slot,
            });
        }
        let payload_bytes = l.geometry.slot_payload_bytes;
        let mut used_bytes = 0;
        for (i, s) in samples.iter().enumerate() {
            let end = s
                .offset
                .checked_add(s.len)
                .filter(|&end| end <= payload_bytes);
            let Some(end) = end else {
                return Err(PublishError::SampleOutOfBounds {
                    i,
                    offset: s.offset,
                    len: s.len,
                    payload_bytes,
                });
            };
            used_bytes = used_bytes.max(end);
            let cell = self.view.sample_cell(claim.slot, i as u32);
            cell.offset.store(s.offset, Ordering::Relaxed);
            cell.len.store(s.len, Ordering::Relaxed);
            cell.index.store(s.index, Ordering::Relaxed);
        }
        let meta = self.view.slot(claim.slot);
        meta.epoch.store(epoch, Ordering::Relaxed);
        meta.step.store(step, Ordering::Relaxed);
        meta.n_samples
            .store(samples.len() as u32, Ordering::Relaxed);
        meta.payload_used_bytes.store(used_bytes, Ordering::Relaxed);
        let rank = self.view.rank(claim.rank);
        if protocol::publish(rank, meta, claim.seq, claim.generation) {
            futex::wake_all(&rank.publish_futex);
        }
        self.published[r] = claim.seq + 1;
        let h = self.view.header();
        h.batches_published.fetch_add(1, Ordering::Relaxed);
        h.bytes_published.fetch_add(used_bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Tells `rank`'s consumer that nothing more comes; it sees END once it has
    /// taken every published batch.
    pub fn finish_rank(&self, rank: u32) {
        let block = self.view.rank(rank);
        if protocol::finish(block) {
            futex::wake_all(&block.publish_futex);
        }
    }

    /// Finishes every rank and marks the run ended.
    pub fn finish(&self) {
        for rank in 0..self.view.layout().geometry.world_size {
            self.finish_rank(rank);
        }
        self.view
            .header()
            .state
            .store(state::ENDED, Ordering::Release);
    }

    /// Stops the run early: consumers get an "aborted" error once they have
    /// taken what was already published. `code` is a signal number, or 0.
    pub fn abort(&self, code: u32) {
        self.abort_with(code, "");
    }

    /// [`Producer::abort`], leaving `message` (the loader's own error: what
    /// failed and the fix) for every trainer to report. Empty: none.
    pub fn abort_with(&self, code: u32, message: &str) {
        let h = self.view.header();
        if !message.is_empty() {
            crate::message::write_abort_message(h, message);
        }
        h.abort_code.store(code, Ordering::Relaxed);
        // SYNC POINT: Release pairs with the consumer's Acquire of `state`.
        h.state.store(state::ABORTED, Ordering::Release);
        for rank in 0..self.view.layout().geometry.world_size {
            let block = self.view.rank(rank);
            block.publish_futex.fetch_add(1, Ordering::Release);
            futex::wake_all(&block.publish_futex);
        }
    }

    /// Reclaims the slots of every rank whose consumer is not attached (it
    /// died, or detached without releasing), one entry for each rank where
    /// something was reclaimed.
    pub fn reclaim_dead_consumers(&self) -> Vec<Reclaimed> {
        let mut out = Vec::new();
        for rank in 0..self.view.layout().geometry.world_size {
            let byte = segment::rank_lock_byte(rank);
            // Holding the rank lock makes us the writer of the consumer's fields;
            // a consumer attaching meanwhile waits for it.
            if !matches!(segment::try_lock_byte(&self.fd, byte), Ok(true)) {
                continue;
            }
            let block = self.view.rank(rank);
            let slots = self.view.rank_slots(rank);
            let (n, _) = protocol::reclaim(block, &slots, &self.view.header().producer_sleeping);
            block.consumer_pid.store(0, Ordering::Relaxed);
            let _ = segment::unlock_byte(&self.fd, byte);
            if n > 0 {
                let expected = block.batches_expected.load(Ordering::Relaxed);
                let took_every_batch =
                    expected != u64::MAX && block.consumed.load(Ordering::Relaxed) >= expected;
                out.push(Reclaimed {
                    rank,
                    batches: n,
                    took_every_batch,
                });
            }
        }
        out
    }

    /// True when `rank` has a consumer attached.
    pub fn consumer_attached(&self, rank: u32) -> bool {
        segment::byte_is_locked(&self.fd, segment::rank_lock_byte(rank)).unwrap_or(false)
    }

    /// True once any consumer has attached to `rank` in this run.
    pub fn ever_attached(&self, rank: u32) -> bool {
        self.view.rank(rank).attach_count.load(Ordering::Relaxed) > 0
    }

    /// Pid last recorded by `rank`'s consumer (messages only), 0 if none.
    pub fn consumer_pid(&self, rank: u32) -> u32 {
        self.view.rank(rank).consumer_pid.load(Ordering::Relaxed)
    }

    /// True when every batch published to `rank` has been released.
    pub fn rank_drained(&self, rank: u32) -> bool {
        let l = self.view.layout();
        let published = self.published[rank as usize];
        let k = u64::from(l.geometry.slots_per_rank);
        (published.saturating_sub(k)..published).all(|seq| {
            let slot = self.view.slot(l.slot_of(rank, seq));
            slot.released.load(Ordering::Acquire) >= l.generation_of(seq)
        })
    }

    /// True when every published batch of every rank has been released.
    pub fn all_released(&self) -> bool {
        (0..self.view.layout().geometry.world_size).all(|r| self.rank_drained(r))
    }

    /// Sleeps until a consumer of one of `ranks` releases a slot, or `timeout`.
    /// `still_blocked` is re-checked after announcing the sleep, so a release
    /// that raced with it is never missed.
    pub fn wait_for_release(
        &self,
        ranks: &[u32],
        timeout: Duration,
        still_blocked: impl Fn(&Self) -> bool,
    ) {
        let h = self.view.header();
        let words: Vec<_> = ranks
            .iter()
            .take(futex::WAITV_MAX)
            .map(|&r| {
                let word = &self.view.rank(r).release_futex;
                (word, word.load(Ordering::Acquire))
            })
            .collect();
        if words.is_empty() {
            std::thread::sleep(timeout);
            return;
        }
        h.producer_sleeping.store(1, Ordering::Relaxed);
        // SYNC POINT: SeqCst fence against the consumer's fence after its
        // release (Dekker): either it sees us sleeping and wakes us, or we see
        // its release here.
        crate::sync::fence(Ordering::SeqCst);
        if still_blocked(self) {
            futex::wait_any(&words, timeout);
        }
        h.producer_sleeping.store(0, Ordering::Relaxed);
    }

    /// Simulates a loader that dies at the worst moment: the segment and its
    /// lock are left exactly as they are, with no end or abort written. For
    /// crash tests in one process (the lock is dropped with the descriptor).
    pub fn abandon(mut self) {
        self.abandoned = true;
    }

    /// True while the ring's name in /dev/shm still names this ring.
    pub fn name_is_ours(&self) -> bool {
        segment::same_file(&self.fd, &segment::shm_path(&self.name)).unwrap_or(false)
    }

    /// The ring's path in /dev/shm.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Removes the segment's name from /dev/shm now, rather than at drop: a
    /// loader that stops tells its trainers (`abort`) and frees the name at
    /// once, even while a read it cannot cancel still writes into the ring
    /// (the mapping stays until drop). Later calls, and drop, do nothing
    /// more, so a new loader that took the name meanwhile keeps it.
    pub fn remove_name(&mut self) {
        self.stop_reserving();
        if !self.name_removed {
            // Only if the name is still this ring's: someone may have removed
            // it (`rm /dev/shm/*`, systemd's RemoveIPC) and another loader
            // taken it since. Under the /dev/shm lock, which that loader's
            // create takes, so the name cannot change between look and unlink.
            let _shm_lock = segment::ShmDirLock::take();
            match segment::same_file(&self.fd, &segment::shm_path(&self.name)) {
                Ok(true) => match segment::shm_unlink(&self.name) {
                    Ok(()) => self.name_removed = true,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => self.name_removed = true,
                    // Left for drop to try again.
                    Err(e) => tracing::debug!("cannot remove {} yet: {e}", self.path),
                },
                Ok(false) => {
                    self.name_removed = true;
                    tracing::warn!(
                        "{} is no longer this loader's ring (it was removed while the loader ran, and another loader may use the name now): left as it is",
                        self.path
                    );
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => self.name_removed = true,
                // Not known to be gone (EMFILE, ...): drop tries again, after
                // the readers have closed their descriptors.
                Err(e) => tracing::debug!("cannot check {} yet: {e}", self.path),
            }
        }
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.stop_reserving();
        if self.abandoned {
            return;
        }
        let state_now = self.view.header().state.load(Ordering::Relaxed);
        if state_now != state::ENDED && state_now != state::ABORTED {
            self.abort(0);
        }
        self.remove_name();
    }
}

/// Removes a half-created segment if `create` fails after shm_open.
struct CreatedGuard<'a> {
    name: &'a str,
}

impl Drop for CreatedGuard<'_> {
    fn drop(&mut self) {
        let _ = segment::shm_unlink(self.name);
    }
}

/// The error for a segment of this name that cannot be opened: for
/// another user's, who owns it and what to do.
fn open_existing_error(path: &str, e: io::Error) -> CreateError {
    use std::os::unix::fs::MetadataExt;
    if e.raw_os_error() == Some(libc::EACCES) {
        if let Ok(meta) = std::fs::metadata(path) {
            return CreateError::Io {
                what: "cannot open existing",
                path: path.to_string(),
                source: io::Error::new(
                    e.kind(),
                    format!(
                        "{e}: it belongs to user id {} (this process runs as {}); choose another --name, or run as that user (or have them run `ringfeed gc` if their loader is gone)",
                        meta.uid(),
                        // SAFETY: getuid has no preconditions.
                        unsafe { libc::getuid() }
                    ),
                ),
            };
        }
    }
    CreateError::Io {
        what: "cannot open existing",
        path: path.to_string(),
        source: e,
    }
}

/// Reads the loader pid of an existing segment, if it is big enough to hold one.
pub(crate) fn read_loader_pid(fd: &OwnedFd) -> Option<u32> {
    if segment::file_size(fd).ok()? < HEADER_BYTES {
        return None;
    }
    let map = segment::map(fd, HEADER_BYTES).ok()?;
    // SAFETY: the mapping is HEADER_BYTES long; the header is made of atomics.
    let header = unsafe { &*(map.as_ptr() as *const crate::layout::Header) };
    Some(header.loader_pid.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// Bytes of the file actually allocated (st_blocks).
    fn allocated_bytes(fd: &OwnedFd) -> u64 {
        // SAFETY: stat is plain old data; fstat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open and `st` a valid out-pointer.
        assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
        st.st_blocks as u64 * 512
    }

    #[test]
    fn the_suggested_shm_size_holds_what_is_there_the_promised_rings_and_this_one_with_room_to_spare(
    ) {
        let mib = 1u64 << 20;
        let room = |size_bytes, free_bytes, promised: &[u64]| segment::Room {
            size_bytes,
            free_bytes,
            promised: promised
                .iter()
                .map(|&bytes| segment::Promised {
                    path: "/dev/shm/ringfeed-x".into(),
                    bytes,
                })
                .collect(),
        };
        let both = |needed, room| {
            let mib = suggest_shm_mib(needed, &room);
            (docker_size(mib), kubernetes_size(mib))
        };
        // Docker's default 64 MiB, 60 of them used: an 8 MiB ring needs 68, and a quarter more.
        assert_eq!(
            both(8 * mib, room(64 * mib, 4 * mib, &[])),
            ("256m".into(), "256Mi".into())
        );
        // A 700 MiB ring, 200 MiB promised: 900 x 1.25 = 1125 MiB, 1280 in steps of 256.
        assert_eq!(
            both(700 * mib, room(64 * mib, 64 * mib, &[200 * mib])),
            ("1280m".into(), "1280Mi".into())
        );
        assert_eq!(
            both(3 << 30, room(1 << 30, 0, &[])),
            ("5g".into(), "5Gi".into())
        );
        // 1 GiB exactly, in steps of 256 MiB: said in GiB.
        assert_eq!(
            both(800 * mib, room(0, 0, &[])),
            ("1g".into(), "1Gi".into())
        );
        // Unknown room (a failed statvfs): the ring alone.
        assert_eq!(
            both(8 * mib, room(0, 0, &[])),
            ("256m".into(), "256Mi".into())
        );
    }

    #[test]
    fn slot_payloads_are_allocated_by_their_first_claim_and_the_rest_on_request() {
        // 4 MiB slots, a multiple of a huge page: the figures below hold on a
        // tmpfs with huge pages too, give or take one 2 MiB page.
        let slot = 4u64 << 20;
        let slack = 2u64 << 20;
        let g = RingGeometry {
            world_size: 2,
            slots_per_rank: 3,
            max_samples_per_slot: 4,
            slot_payload_bytes: slot,
        };
        let mut p = Producer::create(&format!("lazy-alloc-{}", std::process::id()), g).unwrap();
        let l = *p.layout();
        assert_eq!(segment::file_size(&p.fd).unwrap(), l.segment_bytes);
        let base = allocated_bytes(&p.fd);
        assert!(
            base >= l.payload_offset && base <= l.payload_offset + slack,
            "{base} bytes allocated at create"
        );
        let c0 = p.try_claim(0).unwrap().unwrap();
        let c1 = p.try_claim(1).unwrap().unwrap();
        let two = allocated_bytes(&p.fd);
        assert!(
            two >= base + 2 * slot - slack && two <= base + 2 * slot + slack,
            "{two} after two claims"
        );
        p.publish(c0, 0, 0, &[]).unwrap();
        p.publish(c1, 0, 0, &[]).unwrap();
        // The rest of the ring, on request, in the background.
        p.reserve_rest();
        let t = std::time::Instant::now();
        while allocated_bytes(&p.fd) < l.segment_bytes && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            allocated_bytes(&p.fd) >= l.segment_bytes,
            "{} of {} bytes allocated",
            allocated_bytes(&p.fd),
            l.segment_bytes
        );
        // Claims of slots the reserver allocated allocate nothing more.
        let mut c0 = p.try_claim(0).unwrap().unwrap();
        c0.payload_mut().fill(7);
    }

    #[test]
    fn a_ring_not_yet_allocated_counts_against_the_room_of_the_next_until_it_is_or_its_loader_dies()
    {
        let slot = 4u64 << 20;
        let slack = 2u64 << 20;
        let g = RingGeometry {
            world_size: 2,
            slots_per_rank: 3,
            max_samples_per_slot: 4,
            slot_payload_bytes: slot,
        };
        let name = format!("promised-{}", std::process::id());
        let path = segment::shm_path(&name);
        let promised = || {
            segment::promised_to_other_rings("some-other-loader")
                .into_iter()
                .find(|p| p.path == path)
        };
        let mut p = Producer::create(&name, g).unwrap();
        let holes = promised().expect("a live ring with holes is listed").bytes;
        assert!(
            holes + slack >= 6 * slot && holes <= 6 * slot,
            "{holes} bytes promised"
        );
        assert!(
            segment::promised_to_other_rings(&name)
                .iter()
                .all(|p| p.path != path),
            "a ring is not promised to itself"
        );
        let c = p.try_claim(0).unwrap().unwrap();
        p.publish(c, 0, 0, &[]).unwrap();
        let after_claim = promised().unwrap().bytes;
        assert!(
            after_claim + slack >= 5 * slot && after_claim <= 5 * slot,
            "{after_claim} bytes promised after a claim"
        );
        // A dead loader's ring never grows: it is not counted.
        p.abandon();
        assert!(path.exists());
        assert_eq!(promised(), None);
        segment::shm_unlink(&name).unwrap();
        // A ring wholly reserved promises nothing.
        let mut p = Producer::create(&name, g).unwrap();
        p.reserve_rest();
        let t = std::time::Instant::now();
        while promised().is_some() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(promised(), None);
    }
}
