//! A trainer's side of the ring: attach to rank r, take batches in order
//! without copying their bytes, release them.
//!
//! Nothing in the segment is trusted. Attach recomputes the layout from the
//! header's counts and compares it with the stored offsets and the mapping's
//! real size; `next` copies each batch's sample table into private memory and
//! bounds-checks every entry there, so a hostile writer cannot change an entry
//! after it was checked.

use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::futex;
use crate::layout::{
    state, Job, Layout, RingGeometry, ABI_VERSION, HEADER_BYTES, LOADER_RELEASE_BYTES,
    LOADER_RELEASE_OFFSET, MAGIC, PAGE_BYTES,
};
use crate::protocol::{self, ReleaseRefusal};
use crate::segment::{self, LOADER_LOCK_BYTE};
use crate::sync::Ordering;
use crate::view::View;
use crate::SampleEntry;

mod attach;
mod errors;
mod fork;
mod names;
mod start;

pub(crate) use attach::check_owner;
pub use attach::validate_header;
use attach::HeldHere;
pub use errors::{AttachError, Forked, NextError, ReleaseError};
use fork::{forks_so_far, FORKS, LOCK_FDS};
pub use names::{ClassNameError, KeyError};
pub use start::{StartError, StartMode};

/// How long `next` spins before it sleeps. A futex wake costs 35–40 µs here,
/// so a batch arriving within this window is taken with no system call.
pub const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(50);
/// Longest single sleep; liveness of the loader is re-checked after each.
pub const WAIT_SLICE: Duration = Duration::from_millis(100);

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
    /// This consumer made its start request, or found none needed.
    start_requested: bool,
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

impl Consumer {
    /// The rank this consumer serves.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Where the ring's ranks sit in the training job: this consumer is job
    /// rank `job().first_rank + rank()` of `job().job_world_size`.
    pub fn job(&self) -> Job {
        Job {
            start: self.start_now(),
            ..self.job
        }
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

    /// The run's shape (epochs, steps in a whole epoch, batch size), once
    /// the loader said it: None from a loader that predates it, or one that
    /// still waits for its ranks to say where the run starts.
    pub fn run_shape(&self) -> Option<crate::layout::RunShape> {
        crate::layout::RunShape::read(self.view.header())
    }

    /// The resume state once every rank has taken its batch of `step` in
    /// `epoch` (see [`Job::resume_state_after`]): what `serve --resume`
    /// takes to go on with the next step.
    pub fn resume_state_after(&self, epoch: u64, step: u64) -> Option<(u64, u64)> {
        self.job()
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

    /// Steps every rank takes in a whole epoch (the same for every rank; a
    /// resumed run's first epoch may have fewer), by the resume rule under
    /// the loader's tail; None from a loader that does not say how many
    /// samples it serves.
    pub fn steps_per_epoch(&self) -> Option<u64> {
        self.job.steps_per_epoch(
            self.layout().geometry.max_samples_per_slot,
            self.dataset_samples()?,
        )
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
        if !self.start_requested {
            self.request_start_if_unasked();
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
            let reason = match (code, crate::message::read_abort_message(header)) {
                (_, Some(message)) => message,
                (0, None) => "it stopped on an error; see its log".to_string(),
                (c, None) => format!("it received signal {c}"),
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
