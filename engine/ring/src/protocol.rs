//! The slot handoff, on the shared blocks alone: no syscalls, no mapping, so
//! that the loom model in `tests/loom_handoff.rs` runs exactly this code.
//!
//! Per rank, batches have sequence numbers 0, 1, 2, …; batch `seq` lives in
//! the rank's slot `seq % K` with generation `g = seq / K + 1`.
//! - The loader may fill that slot once the slot's `released` is `g - 1`
//!   (the previous batch in it was released), then publishes by raising the
//!   rank's `published` to `seq + 1`.
//! - The consumer takes batch `consumed` once `published > consumed`, and
//!   releases it by storing `g` into the slot's `released`.
//!
//! Every field has one writer: `published`, `generation` and the batch
//! contents are the loader's; `consumed` and `released` belong to the holder
//! of the rank lock (the consumer, or the loader while reclaiming a dead one).

use crate::layout::{RankBlock, SlotMeta};
use crate::sync::{fence, AtomicU32, Ordering};

/// True when the slot may be filled with generation `generation`.
pub fn slot_is_free(slot: &SlotMeta, generation: u64) -> bool {
    // SYNC POINT: Acquire pairs with the Release in `release`/`reclaim`: once
    // the previous generation reads as released, every read the consumer made
    // of this slot's payload and sample table happened before, so the loader
    // may overwrite them.
    // Saturating: `released` is written by another process, and an
    // overflow would panic a debug build (a release build would wrap and
    // stall the rank for good).
    slot.released.load(Ordering::Acquire).saturating_add(1) >= generation
}

/// Publishes a filled slot as the rank's `seq`-th batch. The caller has
/// written the payload, the sample table and the slot's fields. Returns true
/// when the consumer is asleep and must be woken with a futex wake on
/// `publish_futex`.
pub fn publish(rank: &RankBlock, slot: &SlotMeta, seq: u64, generation: u64) -> bool {
    debug_assert_eq!(
        rank.published.load(Ordering::Relaxed),
        seq,
        "batches are published in order"
    );
    slot.generation.store(generation, Ordering::Relaxed);
    // SYNC POINT: Release pairs with the consumer's Acquire load of
    // `published` in `published_for`: a consumer that sees `seq + 1` sees the
    // whole batch (payload, sample table, epoch, step, generation).
    rank.published.store(seq + 1, Ordering::Release);
    rank.publish_futex
        .store((seq + 1) as u32, Ordering::Release);
    // SYNC POINT: SeqCst fence against the consumer's fence in its sleep path
    // (Dekker): either we see `consumer_sleeping` set, or it sees the new
    // `published` before it sleeps.
    fence(Ordering::SeqCst);
    rank.consumer_sleeping.load(Ordering::Relaxed) != 0
}

/// Marks the rank as finished: nothing more will be published to it. Returns
/// true when the consumer is asleep and must be woken.
pub fn finish(rank: &RankBlock) -> bool {
    // SYNC POINT: Release pairs with the consumer's Acquire of `finished`,
    // after which its load of `published` is final.
    rank.finished.store(1, Ordering::Release);
    rank.publish_futex.fetch_add(1, Ordering::Release);
    fence(Ordering::SeqCst);
    rank.consumer_sleeping.load(Ordering::Relaxed) != 0
}

/// The consumer's view of how many batches are published.
pub fn published_for(rank: &RankBlock) -> u64 {
    // SYNC POINT: Acquire pairs with the Release in `publish`: batches below
    // the value read are complete and visible.
    rank.published.load(Ordering::Acquire)
}

/// True once the loader finished the rank. Read `published` after this.
pub fn finished(rank: &RankBlock) -> bool {
    // SYNC POINT: Acquire pairs with the Release in `finish`.
    rank.finished.load(Ordering::Acquire) != 0
}

/// Why a release was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseRefusal {
    /// The slot now holds another generation: this handle is stale.
    Stale {
        /// Generation in the slot now.
        current: u64,
    },
    /// This generation was already released.
    AlreadyReleased,
}

/// Releases generation `generation` of `slot`, then bumps the rank's release
/// futex. Returns whether the loader is asleep and must be woken on
/// `release_futex`.
pub fn release(
    rank: &RankBlock,
    slot: &SlotMeta,
    generation: u64,
    producer_sleeping: &AtomicU32,
) -> Result<bool, ReleaseRefusal> {
    let current = slot.generation.load(Ordering::Relaxed);
    if current != generation {
        return Err(ReleaseRefusal::Stale { current });
    }
    if slot.released.load(Ordering::Relaxed) >= generation {
        return Err(ReleaseRefusal::AlreadyReleased);
    }
    // SYNC POINT: Release pairs with the Acquire in `slot_is_free`: all our
    // reads of the payload happen before the loader overwrites it.
    slot.released.store(generation, Ordering::Release);
    Ok(bump_release_futex(rank, producer_sleeping))
}

fn bump_release_futex(rank: &RankBlock, producer_sleeping: &AtomicU32) -> bool {
    let v = rank.release_futex.load(Ordering::Relaxed);
    rank.release_futex
        .store(v.wrapping_add(1), Ordering::Release);
    // SYNC POINT: SeqCst fence against the loader's fence in its sleep path.
    fence(Ordering::SeqCst);
    producer_sleeping.load(Ordering::Relaxed) != 0
}

/// Releases every batch the rank's previous consumer took and never released.
/// Only the holder of the rank lock may call this (it writes the consumer's
/// fields). `slots` are the rank's K slots in order. Returns how many batches
/// were reclaimed and whether the loader must be woken.
pub fn reclaim(
    rank: &RankBlock,
    slots: &[&SlotMeta],
    producer_sleeping: &AtomicU32,
) -> (u64, bool) {
    let k = slots.len() as u64;
    // A consumer can only have taken what was published: a larger `consumed`
    // (a process that wrote over the segment) must not release batches
    // nobody took, which the loader would then overwrite unread.
    let consumed = rank
        .consumed
        .load(Ordering::Acquire)
        .min(rank.published.load(Ordering::Acquire));
    let mut reclaimed = 0;
    for seq in consumed.saturating_sub(k)..consumed {
        let slot = slots[(seq % k) as usize];
        let generation = seq / k + 1;
        if slot.released.load(Ordering::Relaxed) < generation {
            // SYNC POINT: as in `release`; the dead consumer reads nothing more.
            slot.released.store(generation, Ordering::Release);
            reclaimed += 1;
        }
    }
    if reclaimed == 0 {
        return (0, false);
    }
    (reclaimed, bump_release_futex(rank, producer_sleeping))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::layout::{RankBlock, SlotMeta};

    /// `consumed` and `released` are written by another process: values no
    /// correct consumer writes must not make the loader overwrite batches
    /// nobody took, nor read as free a slot that is not.
    #[test]
    fn fields_a_consumer_could_not_have_written_release_nothing_unpublished() {
        let rank = RankBlock::new_for_model();
        let slots: Vec<SlotMeta> = (0..2).map(|_| SlotMeta::new_for_model()).collect();
        let slots: Vec<&SlotMeta> = slots.iter().collect();
        let sleeping = AtomicU32::new(0);
        // Batches 0 and 1 published (generation 1 in both slots), none taken,
        // but `consumed` says a million.
        for seq in 0..2 {
            assert!(!publish(&rank, slots[seq as usize], seq, 1));
        }
        rank.consumed.store(1_000_000, Ordering::Relaxed);
        let (reclaimed, _) = reclaim(&rank, &slots, &sleeping);
        assert_eq!(
            reclaimed, 2,
            "only the two published batches can have been taken"
        );
        assert!(slots
            .iter()
            .all(|s| s.released.load(Ordering::Relaxed) == 1));
        // A `released` of all ones neither overflows nor wraps to "not free".
        slots[0].released.store(u64::MAX, Ordering::Relaxed);
        assert!(slot_is_free(slots[0], u64::MAX));
        slots[1].released.store(0, Ordering::Relaxed);
        assert!(!slot_is_free(slots[1], 2));
    }
}
