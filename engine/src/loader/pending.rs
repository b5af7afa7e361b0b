//! Batches between claim and publish, and each rank's place in the run.

use std::collections::VecDeque;

use crate::ring::{SampleEntry, SlotClaim};
use crate::sampler::Sampler;

/// Where a rank is in the run: the (epoch, step) of its next batch.
pub(super) struct RankCursor {
    epoch: u64,
    step: u64,
    steps_in_epoch: u64,
    epochs_end: u64,
}

impl RankCursor {
    pub(super) fn new(s: &Sampler) -> RankCursor {
        let mut c = RankCursor {
            epoch: s.first_epoch(),
            step: 0,
            steps_in_epoch: s.steps_in_epoch(s.first_epoch()),
            epochs_end: s.epochs_end(),
        };
        c.skip_empty_epochs(s);
        c
    }

    fn skip_empty_epochs(&mut self, s: &Sampler) {
        while self.epoch < self.epochs_end && self.step >= self.steps_in_epoch {
            self.epoch += 1;
            self.step = 0;
            self.steps_in_epoch = s.steps_in_epoch(self.epoch);
        }
    }

    pub(super) fn done(&self) -> bool {
        self.epoch >= self.epochs_end
    }

    /// Returns the next (epoch, step) and moves past it.
    pub(super) fn advance(&mut self, s: &Sampler) -> (u64, u64) {
        debug_assert!(!self.done());
        let at = (self.epoch, self.step);
        self.step += 1;
        self.skip_empty_epochs(s);
        at
    }
}

struct Entry {
    claim: SlotClaim,
    epoch: u64,
    step: u64,
    samples: Vec<SampleEntry>,
    reads_left: u32,
}

/// A batch whose every read has landed.
pub(super) struct Done {
    pub(super) claim: SlotClaim,
    pub(super) epoch: u64,
    pub(super) step: u64,
    pub(super) samples: Vec<SampleEntry>,
}

/// Claimed batches waiting for their reads, by id; per rank in claim order.
#[derive(Default)]
pub(super) struct Pending {
    entries: Vec<Option<Entry>>,
    free: Vec<usize>,
    by_rank: Vec<VecDeque<usize>>,
    spare_tables: Vec<Vec<SampleEntry>>,
}

impl Pending {
    pub(super) fn add(&mut self, claim: SlotClaim, epoch: u64, step: u64) -> usize {
        let rank = claim.rank() as usize;
        if self.by_rank.len() <= rank {
            self.by_rank.resize_with(rank + 1, VecDeque::new);
        }
        let mut samples = self.spare_tables.pop().unwrap_or_default();
        samples.clear();
        let entry = Entry {
            claim,
            epoch,
            step,
            samples,
            reads_left: 0,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.entries[id] = Some(entry);
                id
            }
            None => {
                self.entries.push(Some(entry));
                self.entries.len() - 1
            }
        };
        self.by_rank[rank].push_back(id);
        id
    }

    fn entry(&mut self, id: usize) -> &mut Entry {
        // Ids come only from `add` and stay valid until `pop_ready`: a missing
        // entry is a loader bug, so failing loudly is right.
        self.entries[id].as_mut().expect("pending batch id is live")
    }

    /// Adds a sample at `offset` of the batch's payload.
    pub(super) fn sample(&mut self, id: usize, offset: u64, len: u64, index: u64) {
        let e = self.entry(id);
        debug_assert!(offset + len <= e.claim.payload_bytes());
        e.samples.push(SampleEntry { offset, len, index });
    }

    /// Where `len` bytes at `offset` of the batch's payload go.
    ///
    /// # Panics
    /// If they pass the end of the payload (the planner keeps every piece
    /// within the slot, which the payload covers: a loader bug).
    pub(super) fn dest(&mut self, id: usize, offset: u64, len: u64) -> *mut u8 {
        let e = self.entry(id);
        assert!(
            offset
                .checked_add(len)
                .is_some_and(|end| end <= e.claim.payload_bytes()),
            "a read of {len} bytes at {offset} passes a payload of {} bytes",
            e.claim.payload_bytes()
        );
        // SAFETY: offset + len <= payload_bytes (asserted above), so the
        // pointer stays inside the claimed slot's payload.
        unsafe { e.claim.payload_ptr().add(offset as usize) }
    }

    pub(super) fn expect_read(&mut self, id: usize) {
        self.entry(id).reads_left += 1;
    }

    pub(super) fn read_done(&mut self, id: usize) {
        let e = self.entry(id);
        debug_assert!(e.reads_left > 0);
        e.reads_left -= 1;
    }

    /// The rank's oldest batch, if all its reads landed and it is next in order.
    pub(super) fn pop_ready(&mut self, rank: u32, published: u64) -> Option<Done> {
        let queue = self.by_rank.get_mut(rank as usize)?;
        let &id = queue.front()?;
        let e = self.entries[id].as_ref()?;
        if e.reads_left > 0 || e.claim.seq() != published {
            return None;
        }
        queue.pop_front();
        let e = self.entries[id].take()?;
        self.free.push(id);
        Some(Done {
            claim: e.claim,
            epoch: e.epoch,
            step: e.step,
            samples: e.samples,
        })
    }

    /// The samples of every batch still waiting for a read (some of them
    /// may have landed: a batch does not count its reads by sample).
    pub(super) fn samples_waiting(&self) -> impl Iterator<Item = &SampleEntry> {
        self.entries
            .iter()
            .flatten()
            .filter(|e| e.reads_left > 0)
            .flat_map(|e| e.samples.iter())
    }

    pub(super) fn recycle(&mut self, table: Vec<SampleEntry>) {
        self.spare_tables.push(table);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.by_rank.iter().all(VecDeque::is_empty)
    }
}
