//! Loom models of the slot handoff in `ring::protocol`: the exact functions
//! the loader and the trainers run, on blocks built on the heap, with every
//! interleaving (up to a preemption bound) explored.
//!
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p ringfeed --release --test loom_handoff`
//!
//! Each slot's payload is a `loom::cell::UnsafeCell`, so a read of a slot by
//! the consumer that is not ordered before the loader's next write into it
//! (or the reverse) is reported as a data race, not just a wrong value.
#![cfg(loom)]

use std::sync::atomic::AtomicUsize as StdAtomicUsize;
use std::sync::atomic::Ordering as StdOrdering;

use loom::cell::UnsafeCell;
use loom::sync::atomic::{fence, AtomicU32, Ordering};
use loom::sync::Arc;
use loom::thread;

use ringfeed_ring::layout::{RankBlock, SlotMeta};
use ringfeed_ring::protocol;

/// Slots per rank in the models.
const K: u64 = 2;

/// One rank of a ring: its control block, its K slots with their payloads,
/// and the header's `producer_sleeping` word.
struct Rank {
    block: RankBlock,
    slots: Vec<SlotMeta>,
    payloads: Vec<UnsafeCell<u64>>,
    producer_sleeping: AtomicU32,
}

impl Rank {
    fn new() -> Rank {
        Rank {
            block: RankBlock::new_for_model(),
            slots: (0..K).map(|_| SlotMeta::new_for_model()).collect(),
            payloads: (0..K).map(|_| UnsafeCell::new(u64::MAX)).collect(),
            producer_sleeping: AtomicU32::new(0),
        }
    }

    fn slot(&self, seq: u64) -> &SlotMeta {
        &self.slots[(seq % K) as usize]
    }

    fn payload(&self, seq: u64) -> &UnsafeCell<u64> {
        &self.payloads[(seq % K) as usize]
    }

    /// The loader's side of one batch: wait for the slot, fill it, publish.
    fn produce(&self, seq: u64) {
        let generation = generation_of(seq);
        while !protocol::slot_is_free(self.slot(seq), generation) {
            thread::yield_now();
        }
        // SAFETY (model): loom checks that this write is ordered after every
        // read of the slot's previous generation.
        self.payload(seq).with_mut(|p| unsafe { *p = seq });
        protocol::publish(&self.block, self.slot(seq), seq, generation);
    }

    /// The trainer's `next`: wait for batch `seq`, check it, read it. Records
    /// `consumed` as `Consumer::try_next` does.
    fn take(&self, seq: u64) {
        while protocol::published_for(&self.block) <= seq {
            thread::yield_now();
        }
        let slot = self.slot(seq);
        assert_eq!(
            slot.generation.load(Ordering::Relaxed),
            generation_of(seq),
            "batch {seq} visible with a stale generation"
        );
        // SAFETY (model): loom checks that this read is ordered after the write.
        let value = self.payload(seq).with(|p| unsafe { *p });
        assert_eq!(value, seq, "batch {seq} read with another batch's payload");
        self.block.consumed.store(seq + 1, Ordering::Release);
    }

    fn give_back(&self, seq: u64) {
        let released = protocol::release(
            &self.block,
            self.slot(seq),
            generation_of(seq),
            &self.producer_sleeping,
        );
        assert!(
            released.is_ok(),
            "release of batch {seq} refused: {released:?}"
        );
    }
}

fn generation_of(seq: u64) -> u64 {
    seq / K + 1
}

/// Explores `f` with a preemption bound of 5 (LOOM_MAX_PREEMPTIONS overrides; more than every two-party
/// handoff here, and what keeps each model well under a minute), and prints
/// how many interleavings were run.
fn check(name: &str, f: impl Fn() + Sync + Send + 'static) {
    // A counter per model: the tests run in parallel threads.
    let iterations = std::sync::Arc::new(StdAtomicUsize::new(0));
    let counter = iterations.clone();
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(5);
    }
    let start = std::time::Instant::now();
    builder.check(move || {
        counter.fetch_add(1, StdOrdering::Relaxed);
        f();
    });
    eprintln!(
        "{name}: {} interleavings in {:.1?}",
        iterations.load(StdOrdering::Relaxed),
        start.elapsed()
    );
}

#[test]
fn four_batches_through_two_slots_are_read_whole_and_never_raced() {
    check("handoff", || {
        let rank = Arc::new(Rank::new());
        let loader = {
            let rank = rank.clone();
            thread::spawn(move || (0..4).for_each(|seq| rank.produce(seq)))
        };
        for seq in 0..4 {
            rank.take(seq);
            rank.give_back(seq);
        }
        loader.join().unwrap();
        assert_eq!(protocol::published_for(&rank.block), 4);
    });
}

#[test]
fn consumer_that_dies_holding_a_slot_gets_it_reclaimed_and_reused_without_a_race() {
    check("reclaim", || {
        let rank = Arc::new(Rank::new());
        // The loader fills four batches; the fourth reuses slot 1, which only
        // the reclaim can free.
        let loader = {
            let rank = rank.clone();
            thread::spawn(move || (0..4).for_each(|seq| rank.produce(seq)))
        };
        // The trainer takes and releases batch 0, takes batch 1, and dies
        // holding it.
        let trainer = {
            let rank = rank.clone();
            thread::spawn(move || {
                rank.take(0);
                rank.give_back(0);
                rank.take(1);
            })
        };
        // Its death drops its rank lock; whoever takes the lock next (the
        // loader's reclaim) is ordered after everything it did. In one
        // process, that edge is the join.
        trainer.join().unwrap();
        let slots: Vec<&SlotMeta> = rank.slots.iter().collect();
        let (reclaimed, _wake) = protocol::reclaim(&rank.block, &slots, &rank.producer_sleeping);
        assert_eq!(
            reclaimed, 1,
            "exactly the batch the dead trainer held is reclaimed"
        );
        // A second reclaim (the next trainer's attach) finds nothing left.
        assert_eq!(
            protocol::reclaim(&rank.block, &slots, &rank.producer_sleeping).0,
            0
        );
        loader.join().unwrap();
        assert_eq!(protocol::published_for(&rank.block), 4);
    });
}

#[test]
fn consumer_going_to_sleep_never_misses_a_publish() {
    check("consumer sleep", || {
        let rank = Arc::new(Rank::new());
        let loader = {
            let rank = rank.clone();
            thread::spawn(move || {
                rank.payload(0).with_mut(|p| unsafe { *p = 0 });
                protocol::publish(&rank.block, rank.slot(0), 0, 1)
            })
        };
        // The trainer's sleep path (Consumer::sleep): announce, fence, re-check.
        rank.block.consumer_sleeping.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let will_sleep =
            protocol::published_for(&rank.block) == 0 && !protocol::finished(&rank.block);
        let loader_saw_sleeping = loader.join().unwrap();
        assert!(
            !will_sleep || loader_saw_sleeping,
            "lost wake-up: the trainer sleeps and the loader does not wake it"
        );
    });
}

#[test]
fn loader_going_to_sleep_never_misses_a_release() {
    check("loader sleep", || {
        let rank = Arc::new(Rank::new());
        // Batch 0 is published and taken; batch 2 (same slot) waits on its release.
        rank.block.published.store(1, Ordering::Relaxed);
        rank.slot(0).generation.store(1, Ordering::Relaxed);
        let trainer = {
            let rank = rank.clone();
            thread::spawn(move || {
                protocol::release(&rank.block, rank.slot(0), 1, &rank.producer_sleeping).unwrap()
            })
        };
        // The loader's sleep path (Producer::wait_for_release): announce,
        // fence, re-check that the slot is still not free.
        rank.producer_sleeping.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let will_sleep = !protocol::slot_is_free(rank.slot(0), 2);
        let trainer_saw_sleeping = trainer.join().unwrap();
        assert!(
            !will_sleep || trainer_saw_sleeping,
            "lost wake-up: the loader sleeps and the trainer does not wake it"
        );
    });
}
