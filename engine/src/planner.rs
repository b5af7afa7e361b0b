//! The planner: a batch's sample indices → where each sample sits in the
//! slot's payload, and the reads that put it there. Pure: no I/O, no clock,
//! no ring; the loader hands the reads to an engine.
//!
//! - **Places.** Samples sit end to end in the payload in batch order, the
//!   first at offset 0 (a trainer's `batch.array(..)` views fixed-size
//!   samples as one array, so the order and the packing are a contract). A
//!   sample that would end past `slot_bytes` is [`PlanError::SampleTooLarge`].
//! - **Reads.** Each read is (tier, object, byte range of the object) and the
//!   pieces of that range that land in the payload, each at a destination
//!   offset. Without coalescing every sample is one read of one piece.
//! - **Coalescing.** With [`Coalesce`], the pieces of one object are sorted
//!   by offset and merged into one read while the next piece starts at most
//!   `gap_bytes_max` past the read's end and the read stays within
//!   `read_bytes_max`: one request instead of many, whose bytes are split
//!   back into each sample's place (a gap's bytes are read and dropped).
//!   Reads never span two objects, so in record mode a batch whose records
//!   straddle a file boundary gets one read on each side.
//!
//! The properties (every destination inside the payload, no two overlapping,
//! lengths adding up, the same payload bytes coalesced or not) are tested in
//! engine/tests/planner_props.rs against a simple model.

use std::ops::Range;

use crate::manifest::{Manifest, WindowPart};

mod windows;

/// Where a read's bytes come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// A local file, read by the local engine (io_uring or pread).
    Local,
}

/// How far reads of one object may be merged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coalesce {
    /// Most bytes between two pieces that one read may span (read and
    /// dropped); 0 merges only adjacent pieces.
    pub gap_bytes_max: u64,
    /// A read grows past this only when one piece alone is larger.
    pub read_bytes_max: u64,
}

/// One sample's place in the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// The sample's index in the manifest.
    pub index: u64,
    /// Offset of its first byte in the payload.
    pub offset_bytes: u64,
    /// Its length.
    pub len_bytes: u64,
}

/// A part of a read's range and where in the payload it lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Offset of the part in the object.
    pub offset_bytes: u64,
    /// Its length.
    pub len_bytes: u64,
    /// Where it lands in the payload.
    pub dest_offset_bytes: u64,
    /// The sample it is: its position in the batch.
    pub sample: u32,
}

/// One request: a byte range of one object, split into pieces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Read {
    /// Where the bytes come from.
    pub tier: Tier,
    /// Index of the object in the manifest's objects.
    pub object: u32,
    /// Offset of the range in the object.
    pub offset_bytes: u64,
    /// Length of the range (pieces and the gaps between them).
    pub len_bytes: u64,
    /// Its pieces: a range of [`BatchPlan::pieces`], sorted by offset.
    pub pieces: Range<usize>,
}

/// The plan of one batch. Reused from batch to batch: [`plan_batch`] clears
/// it, so the loader allocates only while batches grow.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchPlan {
    /// Each sample's place, in batch order.
    pub places: Vec<Place>,
    /// The reads, in the order to issue them.
    pub reads: Vec<Read>,
    /// Every read's pieces, end to end.
    pub pieces: Vec<Piece>,
    /// Bytes of the payload the samples take.
    pub used_bytes: u64,
    /// Windows mode: tokens the loader writes itself (the separators).
    pub fills: Vec<Fill>,
    /// Windows mode: every window's document starts, end to end.
    pub doc_starts: Vec<u32>,
    /// Windows mode: where each window's starts end in `doc_starts`.
    pub doc_starts_end: Vec<usize>,
    /// Windows mode: scratch for one window's parts.
    pub window_parts: Vec<WindowPart>,
}

/// A token the loader writes into the payload (windows mode's separator).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fill {
    /// Where it lands in the payload.
    pub dest_offset_bytes: u64,
    /// The token, written little-endian in the windows' item bytes.
    pub token: u64,
}

/// Why a batch cannot be planned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The samples up to `index` do not fit `slot_bytes`.
    #[error("sample {index} ({len_bytes} bytes) does not fit: the batch needs {needed_bytes} bytes but a slot holds {slot_bytes}")]
    SampleTooLarge {
        /// The sample's index in the manifest.
        index: u64,
        /// Its object.
        object: u32,
        /// Its length.
        len_bytes: u64,
        /// Bytes the whole batch needs.
        needed_bytes: u64,
        /// Bytes a slot holds.
        slot_bytes: u64,
    },
}

/// One contiguous transfer: `len_bytes` at `offset_bytes` of the object
/// into the payload at `dest_offset_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Offset in the object.
    pub offset_bytes: u64,
    /// Length.
    pub len_bytes: u64,
    /// Offset in the payload.
    pub dest_offset_bytes: u64,
}

impl Read {
    /// The read as contiguous transfers, for an engine that cannot scatter
    /// one response (the local engines): the whole read when its pieces
    /// land end to end, else one transfer per piece (gap bytes unread).
    pub fn spans<'a>(&'a self, pieces: &'a [Piece]) -> impl Iterator<Item = Span> + 'a {
        let own = &pieces[self.pieces.clone()];
        let whole = self.is_contiguous(pieces);
        let take = if whole { own.len().min(1) } else { own.len() };
        own[..take].iter().map(move |p| {
            if whole {
                Span {
                    offset_bytes: self.offset_bytes,
                    len_bytes: self.len_bytes,
                    dest_offset_bytes: p.dest_offset_bytes,
                }
            } else {
                Span {
                    offset_bytes: p.offset_bytes,
                    len_bytes: p.len_bytes,
                    dest_offset_bytes: p.dest_offset_bytes,
                }
            }
        })
    }

    /// True when the pieces tile the range in order and land end to end in
    /// the payload: the read can go straight into one destination.
    pub fn is_contiguous(&self, pieces: &[Piece]) -> bool {
        let pieces = &pieces[self.pieces.clone()];
        let Some(first) = pieces.first() else {
            return false;
        };
        let mut offset = self.offset_bytes;
        let mut dest = first.dest_offset_bytes;
        for p in pieces {
            if p.offset_bytes != offset || p.dest_offset_bytes != dest {
                return false;
            }
            offset += p.len_bytes;
            dest += p.len_bytes;
        }
        offset == self.offset_bytes + self.len_bytes
    }
}

/// Plans the batch `indices` of `manifest` into `plan` (cleared first):
/// places end to end within `slot_bytes`, reads of `tier`, merged as
/// `coalesce` allows (None: one read per sample, in batch order).
///
/// # Panics
/// If an index is not in the manifest, or the batch has more than
/// `u32::MAX` samples (a slot holds far fewer).
pub fn plan_batch(
    indices: &[u64],
    manifest: &Manifest,
    slot_bytes: u64,
    tier: Tier,
    coalesce: Option<Coalesce>,
    plan: &mut BatchPlan,
) -> Result<(), PlanError> {
    plan.places.clear();
    plan.reads.clear();
    plan.pieces.clear();
    plan.used_bytes = 0;
    plan.fills.clear();
    plan.doc_starts.clear();
    plan.doc_starts_end.clear();
    if let Some(windows) = manifest.windows() {
        // Windows never merge: a window's parts are whole runs already, and
        // neighbours overlap by one token rather than touch.
        return windows::plan_windows(indices, windows.as_ref(), slot_bytes, tier, plan);
    }
    let mut offset = 0u64;
    for (position, &index) in indices.iter().enumerate() {
        let loc = manifest.sample(index);
        // No overflow: each length is at most the manifest's total bytes,
        // and `offset` stays within slot_bytes.
        let end = offset + loc.len_bytes;
        if end > slot_bytes {
            return Err(PlanError::SampleTooLarge {
                index,
                object: loc.file,
                len_bytes: loc.len_bytes,
                needed_bytes: indices
                    .iter()
                    .map(|&i| manifest.sample(i).len_bytes)
                    .fold(0u64, u64::saturating_add),
                slot_bytes,
            });
        }
        plan.places.push(Place {
            index,
            offset_bytes: offset,
            len_bytes: loc.len_bytes,
        });
        plan.pieces.push(Piece {
            offset_bytes: loc.offset_bytes,
            len_bytes: loc.len_bytes,
            dest_offset_bytes: offset,
            sample: u32::try_from(position).expect("a batch holds fewer than 2^32 samples"),
        });
        offset = end;
    }
    plan.used_bytes = offset;
    match coalesce {
        None => {
            for (i, p) in plan.pieces.iter().enumerate() {
                plan.reads.push(Read {
                    tier,
                    object: manifest.sample(plan.places[i].index).file,
                    offset_bytes: p.offset_bytes,
                    len_bytes: p.len_bytes,
                    pieces: i..i + 1,
                });
            }
        }
        Some(rule) => merge(manifest, tier, rule, plan),
    }
    Ok(())
}

/// Sorts the pieces by (object, offset) and merges runs into reads.
fn merge(manifest: &Manifest, tier: Tier, rule: Coalesce, plan: &mut BatchPlan) {
    let object_of =
        |p: &Piece, places: &[Place]| manifest.sample(places[p.sample as usize].index).file;
    let places = &plan.places;
    // The object of each piece, computed once (a record-mode lookup is a
    // binary search).
    let mut keyed: Vec<(u32, Piece)> = plan
        .pieces
        .iter()
        .map(|p| (object_of(p, places), *p))
        .collect();
    keyed.sort_by_key(|&(object, p)| (object, p.offset_bytes, p.dest_offset_bytes));
    plan.pieces.clear();
    let mut run: Option<Read> = None;
    for (object, p) in keyed {
        let end = p.offset_bytes + p.len_bytes;
        let at = plan.pieces.len();
        if let Some(read) = run.as_mut() {
            let read_end = read.offset_bytes + read.len_bytes;
            let new_len = end.max(read_end) - read.offset_bytes;
            let joins = read.object == object
                && p.offset_bytes <= read_end.saturating_add(rule.gap_bytes_max)
                && new_len <= rule.read_bytes_max;
            if joins {
                read.len_bytes = new_len;
                read.pieces.end = at + 1;
                plan.pieces.push(p);
                continue;
            }
        }
        if let Some(done) = run.take() {
            plan.reads.push(done);
        }
        run = Some(Read {
            tier,
            object,
            offset_bytes: p.offset_bytes,
            len_bytes: p.len_bytes,
            pieces: at..at + 1,
        });
        plan.pieces.push(p);
    }
    plan.reads.extend(run);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{FileList, ObjectNames};
    use std::path::PathBuf;

    struct Nowhere;
    impl ObjectNames for Nowhere {
        fn source_name(&self) -> PathBuf {
            PathBuf::from("/nowhere")
        }
        fn object_name(&self, key: &[u8]) -> PathBuf {
            PathBuf::from(String::from_utf8_lossy(key).into_owned())
        }
    }

    fn records(sizes: &[u64], record_bytes: u64) -> Manifest {
        let mut files = FileList::new();
        for (i, &size) in sizes.iter().enumerate() {
            files.push(format!("f{i:02}").as_bytes(), size);
        }
        Manifest::from_objects(files, Some(record_bytes), &Nowhere).unwrap()
    }

    #[test]
    fn consecutive_records_of_one_file_become_one_read_and_a_file_boundary_splits_it() {
        // Records 0..4 in f00, 4..6 in f01.
        let m = records(&[16, 8], 4);
        let mut plan = BatchPlan::default();
        let adjacent = Coalesce {
            gap_bytes_max: 0,
            read_bytes_max: u64::MAX,
        };
        plan_batch(
            &[2, 3, 4, 5],
            &m,
            64,
            Tier::Local,
            Some(adjacent),
            &mut plan,
        )
        .unwrap();
        let reads: Vec<(u32, u64, u64)> = plan
            .reads
            .iter()
            .map(|r| (r.object, r.offset_bytes, r.len_bytes))
            .collect();
        assert_eq!(reads, [(0, 8, 8), (1, 0, 8)]);
        assert!(plan.reads.iter().all(|r| r.is_contiguous(&plan.pieces)));
        assert_eq!(plan.used_bytes, 16);
    }

    #[test]
    fn without_coalescing_every_sample_is_its_own_read_in_batch_order() {
        let m = records(&[16, 8], 4);
        let mut plan = BatchPlan::default();
        plan_batch(&[5, 0, 1], &m, 64, Tier::Local, None, &mut plan).unwrap();
        let reads: Vec<(u32, u64)> = plan
            .reads
            .iter()
            .map(|r| (r.object, r.offset_bytes))
            .collect();
        assert_eq!(reads, [(1, 4), (0, 0), (0, 4)]);
        let places: Vec<u64> = plan.places.iter().map(|p| p.offset_bytes).collect();
        assert_eq!(places, [0, 4, 8]);
    }

    #[test]
    fn records_out_of_order_merge_into_one_read_split_back_into_their_places() {
        let m = records(&[16], 4);
        let mut plan = BatchPlan::default();
        let rule = Coalesce {
            gap_bytes_max: 4,
            read_bytes_max: 1 << 20,
        };
        // Records 3, 0 and 1: 0 and 1 adjacent, 3 past a gap of one record.
        plan_batch(&[3, 0, 1], &m, 64, Tier::Local, Some(rule), &mut plan).unwrap();
        assert_eq!(plan.reads.len(), 1);
        let r = &plan.reads[0];
        assert_eq!((r.offset_bytes, r.len_bytes), (0, 16));
        assert!(!r.is_contiguous(&plan.pieces));
        let dests: Vec<(u64, u64)> = plan.pieces[r.pieces.clone()]
            .iter()
            .map(|p| (p.offset_bytes, p.dest_offset_bytes))
            .collect();
        assert_eq!(dests, [(0, 4), (4, 8), (12, 0)]);
    }

    #[test]
    fn a_batch_past_the_slot_names_the_sample_that_does_not_fit() {
        let m = records(&[16], 4);
        let mut plan = BatchPlan::default();
        let err = plan_batch(&[0, 1, 2], &m, 10, Tier::Local, None, &mut plan).unwrap_err();
        assert_eq!(
            err,
            PlanError::SampleTooLarge {
                index: 2,
                object: 0,
                len_bytes: 4,
                needed_bytes: 12,
                slot_bytes: 10
            }
        );
    }
}
