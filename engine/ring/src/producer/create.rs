//! Creating a ring: the name, the /dev/shm room check and sizing, the
//! header, and the removal of a segment whose loader died.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use super::backing::Backing;
use super::errors::{alloc_error, open_existing_error, shm_too_small};
use super::{CreateError, Producer};
use crate::layout::{
    state, Job, Layout, RingGeometry, ABI_VERSION, HEADER_BYTES, LOADER_RELEASE_BYTES, MAGIC,
    PAGE_BYTES,
};
use crate::segment::{self, LOADER_LOCK_BYTE};
use crate::sync::Ordering;
use crate::view::View;

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
        Self::create_with_class_names(name, geometry, job, &[])
    }

    /// [`Producer::create_in_job`] that also writes `class_names` where
    /// `job.class_names` says (slot 0's payload, before READY), so that a
    /// trainer has them from attach on. `job.class_names` must be the
    /// region [`ClassNames::plan`](crate::layout::ClassNames::plan) sized
    /// for these names.
    pub fn create_with_class_names(
        name: &str,
        geometry: RingGeometry,
        job: Job,
        class_names: &[String],
    ) -> Result<Producer, CreateError> {
        segment::validate_name(name)?;
        check_job(&job, geometry)?;
        let names_region = names_region(&job, class_names)?;
        let layout = Layout::compute(geometry)?;
        let path = segment::shm_path(name).display().to_string();
        let io_err = |what, source| CreateError::Io {
            what,
            path: path.clone(),
            source,
        };
        // Held from before the name is looked at to its publication: another
        // loader (or `ringfeed gc`) judges the name as it is, and the room
        // check and the sizing are one step against loaders starting at once.
        let shm_lock = segment::ShmDirLock::take();
        // A dead loader's segment of this name goes first (its memory with it,
        // before the room check); a live one's is AlreadyRunning.
        Self::remove_if_dead(name)?;
        // Made without a name, locked and sized, then named: a segment under
        // a ring's name always has its loader's lock, so an unlocked one there
        // is a dead loader's, never one still being made (which a trainer
        // or `gc` would take for dead).
        let fd = segment::create_unnamed().map_err(|e| io_err("cannot create", e))?;
        pause_for_tests();
        lock_loader_byte(&fd).map_err(|e| io_err("cannot lock", e))?;
        // Room for the whole ring must be free now, less what other loaders'
        // rings will still allocate; the payloads themselves are allocated
        // slot by slot (see `Backing`).
        if let Some(room) = segment::shm_room_for(name) {
            if room.left() < layout.segment_bytes {
                return Err(shm_too_small(&path, layout.segment_bytes, room));
            }
        }
        segment::set_len(&fd, layout.segment_bytes).map_err(|e| io_err("cannot size", e))?;
        match segment::publish(&fd, name) {
            Ok(()) => {}
            // Taken meanwhile (only by a loader that went on without the
            // /dev/shm lock): judged again, as before.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                Self::remove_if_dead(name)?;
                segment::publish(&fd, name).map_err(|e| io_err("cannot create", e))?;
            }
            Err(e) => return Err(io_err("cannot create", e)),
        }
        let created = CreatedGuard { name };
        drop(shm_lock);
        segment::allocate(&fd, 0, layout.payload_offset)
            .map_err(|e| alloc_error(&path, &fd, layout.segment_bytes, e))?;
        let map = segment::map(&fd, layout.segment_bytes).map_err(|e| io_err("cannot map", e))?;
        let view = View::new(map, layout);
        Self::write_header(&view, job);
        crate::name_tag::write(&view, name);
        let w = layout.geometry.world_size as usize;
        let backing = Arc::new(Backing {
            allocated: (0..layout.slot_count())
                .map(|_| AtomicBool::new(false))
                .collect(),
            stop: AtomicBool::new(false),
        });
        let mut producer = Producer {
            name: name.to_string(),
            path,
            fd,
            view,
            next_claim: vec![0; w],
            images: job.images,
            tokens: job.tokens,
            published: vec![0; w],
            abandoned: false,
            name_removed: false,
            backing,
            reserver: None,
        };
        if let Some((region, bytes)) = names_region {
            producer.write_class_names(region, &bytes)?;
        }
        // SYNC POINT: Release pairs with the consumer's Acquire of `state` in
        // attach: a consumer that reads READY sees every header field (and
        // the class names in slot 0).
        producer
            .view
            .header()
            .state
            .store(state::READY, Ordering::Release);
        std::mem::forget(created);
        Ok(producer)
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
            let owner = segment::trust::owner_of(&fd).unwrap_or(u32::MAX);
            return Err(CreateError::AlreadyRunning {
                name: name.to_string(),
                pid,
                owner,
            });
        }
        // Unlocked: a loader names its segment only once it holds its lock
        // (see `create`), so this one's loader is dead.
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
        let mut release = [0u8; LOADER_RELEASE_BYTES];
        let version = env!("CARGO_PKG_VERSION").as_bytes();
        let n = version.len().min(LOADER_RELEASE_BYTES);
        release[..n].copy_from_slice(&version[..n]);
        for (word, bytes) in h.loader_release.iter().zip(release.chunks_exact(8)) {
            let mut le = [0u8; 8];
            le.copy_from_slice(bytes);
            word.store(u64::from_le_bytes(le), r);
        }
        h.created_unix_ms.store(now_unix_ms(), r);
        h.job_world_size.store(job.job_world_size, r);
        h.first_rank.store(job.first_rank, r);
        h.plan_digest.store(job.plan_digest, r);
        if let Some(start) = job.start {
            h.dataset_samples.store(start.dataset_samples, r);
            if job.awaits_start {
                // The ranks say where the run starts (crate::start): the
                // loader writes it, with START_KNOWN, once they agree.
                h.flags.fetch_or(crate::layout::flags::AWAITS_START, r);
            } else {
                h.start_epoch.store(start.epoch, r);
                h.start_samples.store(start.samples_consumed, r);
                h.flags.fetch_or(crate::layout::flags::START_KNOWN, r);
            }
        }
        if let Some(start) = job.start {
            // How an epoch ends, and its steps: for the trainers' len() and
            // resume states. A job whose steps overflow writes neither.
            if let Some(steps) = job.steps_per_epoch(g.max_samples_per_slot, start.dataset_samples)
            {
                h.tail_mode.store(job.tail.word(), r);
                h.steps_per_epoch.store(steps, r);
                h.flags.fetch_or(crate::layout::flags::TAIL_KNOWN, r);
            }
        }
        if let Some(order) = job.order {
            h.order_seed.store(order.seed, r);
            h.order_shuffled.store(u64::from(order.shuffled), r);
            h.order_block.store(
                (u64::from(order.block_samples) << 32) | u64::from(order.window_blocks),
                r,
            );
            h.flags.fetch_or(crate::layout::flags::ORDER_KNOWN, r);
        }
        if let Some(images) = job.images {
            h.image_shape.store(
                (u64::from(images.height) << 32) | u64::from(images.width),
                r,
            );
            h.image_flags
                .store((u64::from(images.classes) << 32) | u64::from(images.chw), r);
            h.labels_offset.store(images.labels_offset, r);
            h.bad_offset.store(images.bad_offset, r);
            h.flags.fetch_or(crate::layout::flags::IMAGES_KNOWN, r);
        }
        if let Some(keys) = job.keys {
            h.key_area_offset.store(keys.offset, r);
            h.key_stride.store(keys.stride, r);
            h.flags.fetch_or(crate::layout::flags::KEYS_KNOWN, r);
        }
        if let Some(names) = job.class_names {
            h.class_names_offset.store(names.offset, r);
            h.class_names_bytes.store(names.bytes, r);
            h.class_names_count.store(u64::from(names.count), r);
            h.flags.fetch_or(crate::layout::flags::CLASS_NAMES_KNOWN, r);
        }
        if let Some(tokens) = job.tokens {
            for (word, value) in h.tokens.iter().zip(tokens.to_words()) {
                word.store(value, r);
            }
            h.flags.fetch_or(crate::layout::flags::TOKENS_KNOWN, r);
        }
        for rank in 0..g.world_size {
            view.rank(rank).batches_expected.store(u64::MAX, r);
        }
        for slot in 0..l.slot_count() {
            view.slot(slot).rank.store(slot / g.slots_per_rank, r);
        }
    }
}

/// Milliseconds `create` waits between making its segment and locking it:
/// a test hook that holds open the moment where, before segments were made
/// unnamed, a trainer or `gc` could take a starting loader for a dead one.
/// 0 (the default) does not wait.
#[doc(hidden)]
pub static TEST_PAUSE_IN_CREATE_MS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

fn pause_for_tests() {
    let ms = TEST_PAUSE_IN_CREATE_MS.load(std::sync::atomic::Ordering::Relaxed);
    if ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Removes a segment if `create` fails after naming it.
struct CreatedGuard<'a> {
    name: &'a str,
}

impl Drop for CreatedGuard<'_> {
    fn drop(&mut self) {
        let _ = segment::shm_unlink(self.name);
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

/// Refuses a job that leaves no room for the ring's ranks, or whose image
/// or token format does not fit its slots.
fn check_job(job: &Job, geometry: RingGeometry) -> Result<(), CreateError> {
    Job::from_header(
        job.first_rank,
        job.job_world_size,
        geometry.world_size,
        job.plan_digest,
        job.start,
    )
    .map_err(CreateError::Job)?;
    if let Some(images) = &job.images {
        images
            .check(geometry.max_samples_per_slot, geometry.slot_payload_bytes)
            .map_err(CreateError::Job)?;
    }
    if let Some(keys) = &job.keys {
        keys.check(geometry.max_samples_per_slot, geometry.slot_payload_bytes)
            .map_err(CreateError::Job)?;
    }
    if let Some(names) = &job.class_names {
        names
            .check(geometry.slot_payload_bytes)
            .map_err(CreateError::Job)?;
    }
    if let Some(tokens) = &job.tokens {
        tokens
            .check(geometry.max_samples_per_slot, geometry.slot_payload_bytes)
            .map_err(CreateError::Job)?;
    }
    Ok(())
}

/// The class names region `job` plans, and its bytes for `class_names`.
fn names_region(
    job: &Job,
    class_names: &[String],
) -> Result<Option<(crate::layout::ClassNames, Vec<u8>)>, CreateError> {
    let Some(region) = job.class_names else {
        return Ok(None);
    };
    let bytes = crate::layout::ClassNames::encode(class_names);
    if bytes.len() as u64 != region.bytes || class_names.len() != region.count as usize {
        return Err(CreateError::Job(format!(
            "the class names region {region:?} was not planned for these {} names",
            class_names.len()
        )));
    }
    Ok(Some((region, bytes)))
}

impl Producer {
    /// Writes the class names region into slot 0's payload (allocated
    /// first), before READY: no consumer can see it yet, and no batch ever
    /// writes that range (the loader plans every other region below it).
    fn write_class_names(
        &mut self,
        region: crate::layout::ClassNames,
        bytes: &[u8],
    ) -> Result<(), CreateError> {
        self.ensure_allocated(0)?;
        let payload = self.view.payload(0);
        // `check_job` put the region inside a slot payload.
        let at = region.offset as usize;
        // SAFETY: slot 0's payload is `slot_payload_bytes` long, mapped and
        // allocated; [at, at + bytes.len()) lies in it (check_job, and the
        // length was compared with the region's); the ring is not READY, so
        // nobody else reads or writes it.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), payload.add(at), bytes.len());
        }
        Ok(())
    }
}

/// Takes the loader's lock byte of a segment made a moment ago (unnamed:
/// nobody else can hold it, but a failure is said, never ignored).
fn lock_loader_byte(fd: &std::os::fd::OwnedFd) -> io::Result<()> {
    match segment::try_lock_byte(fd, LOADER_LOCK_BYTE)? {
        true => Ok(()),
        false => Err(io::Error::from_raw_os_error(libc::EAGAIN)),
    }
}
