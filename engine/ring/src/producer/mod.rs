//! The loader's side of the ring: create the segment, fill slots in place,
//! publish them in order, reclaim slots of consumers that died, end the run.
//!
//! - `create`: creation, sizing against /dev/shm's room, the header, and the
//!   removal of a dead loader's segment.
//! - `backing`: allocation of the slot payloads, by claim or in the background.
//! - `reclaim`: the consumers' liveness, reclaim, and waiting for releases.
//! - `errors`: [`CreateError`] and [`PublishError`].

use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::futex;
use crate::layout::{state, Layout};
use crate::protocol;
use crate::segment;
use crate::sync::Ordering;
use crate::view::View;
use crate::SampleEntry;

mod backing;
mod create;
mod errors;
mod reclaim;
mod start;

use backing::Backing;
#[doc(hidden)]
pub use create::TEST_PAUSE_IN_CREATE_MS;
pub use errors::{CreateError, PublishError};
pub use reclaim::Reclaimed;

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

/// The loader's handle on a ring it created. Dropping it marks the ring
/// aborted (if it had not ended) and removes the name from /dev/shm.
pub struct Producer {
    name: String,
    path: String,
    fd: OwnedFd,
    view: View,
    next_claim: Vec<u64>,
    /// The decoded images' format: a batch's labels and flags are part of
    /// what it uses of its payload.
    images: Option<crate::layout::ImageFormat>,
    /// The token format: a batch's document starts are part of its
    /// payload in use.
    tokens: Option<crate::layout::TokenFormat>,
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

impl Producer {
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

    /// Records the run's shape for progress (`ringfeed stat`, `ls`, the
    /// loader's progress line, `feed.progress`), and says from now on that
    /// the counters block's progress words are live.
    pub fn publish_run_shape(&self, shape: crate::layout::RunShape) {
        shape.publish(self.view.header());
    }

    /// Batches `rank`'s trainers have taken in the run (display figure).
    pub fn consumed(&self, rank: u32) -> u64 {
        self.view.rank(rank).consumed.load(Ordering::Relaxed)
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

    /// Writes one word of the header's counters block (for `ringfeed
    /// stat`; Relaxed, display only). Call [`Producer::stamp_counters`]
    /// after a round of writes, so stat knows the block is live.
    pub fn set_counter(&self, counter: crate::layout::Counter, value: u64) {
        self.view.header().counters[counter.index()].store(value, Ordering::Relaxed);
    }

    /// Marks the counters block as written now (Unix ms).
    pub fn stamp_counters(&self) {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_millis().max(1) as u64);
        self.set_counter(crate::layout::Counter::UpdatedUnixMs, now_ms);
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
        if let Some(images) = self.images {
            // The labels and flags after the images (checked against the
            // payload when the ring was made).
            used_bytes =
                used_bytes.max(images.batch_bytes(samples.len() as u32).min(payload_bytes));
        }
        if let Some(tokens) = self.tokens {
            // The document starts after the tokens (checked against the
            // payload when the ring was made).
            used_bytes =
                used_bytes.max(tokens.batch_bytes(samples.len() as u32).min(payload_bytes));
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
