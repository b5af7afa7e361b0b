//! Watching the consumers: reclaiming the slots of those that died, and
//! waiting for releases.

use std::time::Duration;

use super::Producer;
use crate::futex;
use crate::protocol;
use crate::segment;
use crate::sync::Ordering;

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

impl Producer {
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

    /// Attaches to `rank` so far in this run.
    pub fn attach_count(&self, rank: u32) -> u64 {
        u64::from(self.view.rank(rank).attach_count.load(Ordering::Relaxed))
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
}
