//! A trainer's reads of the names beside its batches (layout/names.rs): a
//! held batch's sample keys, and the run's class names. Each read checks
//! the batch is held by this feed and every length and end against the
//! regions attach checked, so a hostile loader's bytes give an error, never
//! a read outside the mapping.

use super::*;
use crate::layout::{ClassNames, KeyArea, SampleKey};

/// Why a sample's key cannot be read (`Consumer::sample_key`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The loader keeps no keys in its slots.
    #[error("the loader of {name:?} keeps no sample keys (a ringfeed serve older than keys); restart it with this version")]
    NotKept {
        /// The loader's name.
        name: String,
    },
    /// The batch is not one this feed holds now.
    #[error("slot {slot} generation {generation} is not a batch this feed holds (released already, never taken, or another rank's or feed's): read keys before releasing the batch")]
    NotHeld {
        /// The handle's slot.
        slot: u32,
        /// The handle's generation.
        generation: u64,
    },
    /// No such sample in the batch.
    #[error("sample {i} is out of range: the batch has {n} samples")]
    OutOfRange {
        /// The sample asked for.
        i: u32,
        /// The batch's samples.
        n: u32,
    },
    /// The entry's length does not fit its stride.
    #[error("the loader of {name:?} wrote a corrupt key for sample {i} of slot {slot} (its length runs past its entry)")]
    Corrupt {
        /// The loader's name.
        name: String,
        /// The slot.
        slot: u32,
        /// The sample.
        i: u32,
    },
}

/// Why a class name cannot be read (`Consumer::class_name`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the loader of {name:?} wrote a corrupt class names region (the end of name {i} does not lie after the one before it, inside the region)")]
pub struct ClassNameError {
    /// The loader's name.
    pub name: String,
    /// The name asked for.
    pub i: u32,
}

impl Consumer {
    /// The key of sample `i` of the held batch (`slot`, `generation`): a
    /// view of its slot, valid until the batch is released. `data`, where
    /// given (the C API's `rf_batch.data`), must be the slot's payload, so
    /// a handle of another feed is refused.
    pub fn sample_key(
        &self,
        slot: u32,
        generation: u64,
        data: Option<*const u8>,
        i: u32,
    ) -> Result<SampleKey<'_>, KeyError> {
        let Some(area) = self.job.keys else {
            return Err(KeyError::NotKept {
                name: self.name.clone(),
            });
        };
        let n = self.held_samples(slot, generation, data)?;
        if i >= n {
            return Err(KeyError::OutOfRange { i, n });
        }
        let entry = self.key_entry(area, slot, i);
        KeyArea::read(entry).ok_or_else(|| KeyError::Corrupt {
            name: self.name.clone(),
            slot,
            i,
        })
    }

    /// The samples of the batch (`slot`, `generation`) when this feed holds
    /// it: taken by `next`, not released.
    fn held_samples(
        &self,
        slot: u32,
        generation: u64,
        data: Option<*const u8>,
    ) -> Result<u32, KeyError> {
        let not_held = KeyError::NotHeld { slot, generation };
        let l = self.view.layout();
        let k = l.geometry.slots_per_rank;
        if slot >= l.slot_count() || slot / k != self.rank {
            return Err(not_held);
        }
        if data.is_some_and(|d| d != self.view.payload(slot).cast_const()) {
            return Err(not_held);
        }
        let local = slot % k;
        let taken = generation
            .checked_sub(1)
            .and_then(|g| g.checked_mul(u64::from(k)))
            .and_then(|s| s.checked_add(u64::from(local)));
        let meta = self.view.slot(slot);
        // `released` is ours to write; `generation` the loader's, which it
        // does not change while the batch is held.
        let held = taken.is_some_and(|seq| seq < self.consumed)
            && meta.released.load(Ordering::Relaxed) < generation
            && meta.generation.load(Ordering::Relaxed) == generation;
        if !held {
            return Err(not_held);
        }
        // The private table of the slot's last take: this batch's.
        Ok(self.tables[local as usize].len() as u32)
    }

    /// Entry `i` of `slot`'s key area (attach checked the area of every
    /// sample lies inside the slot payload).
    fn key_entry(&self, area: KeyArea, slot: u32, i: u32) -> &[u8] {
        let start = area.offset + u64::from(i) * area.stride;
        // SAFETY: attach checked offset + M·stride <= slot_payload_bytes and
        // i < n <= M, so the entry lies inside this slot's payload, which is
        // mapped for as long as `self` lives.
        unsafe {
            std::slice::from_raw_parts(
                self.view.payload(slot).add(start as usize),
                area.stride as usize,
            )
        }
    }

    /// How many class names the loader recorded (0: none).
    pub fn class_count(&self) -> u32 {
        self.job.class_names.map_or(0, |n| n.count)
    }

    /// Class name `i` (a view of the ring, valid while attached), None past
    /// the last; the bytes as the loader wrote them (UTF-8 from ringfeed).
    pub fn class_name(&self, i: u32) -> Result<Option<&[u8]>, ClassNameError> {
        let Some(names) = self.job.class_names else {
            return Ok(None);
        };
        if i >= names.count {
            return Ok(None);
        }
        // SAFETY: attach checked offset + bytes <= slot_payload_bytes: the
        // region lies inside slot 0's payload, mapped while `self` lives.
        let region = unsafe {
            std::slice::from_raw_parts(
                self.view.payload(0).add(names.offset as usize),
                names.bytes as usize,
            )
        };
        ClassNames::name(region, names.count, i)
            .map(Some)
            .ok_or_else(|| ClassNameError {
                name: self.name.clone(),
                i,
            })
    }
}
