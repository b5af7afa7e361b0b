//! Properties of the planner (engine/src/planner.rs), against a simple
//! model: sample i's bytes are its object's bytes at its range, and the
//! payload holds the batch's samples end to end in batch order.
//!
//! Objects here are synthetic: byte k of object o is `content(o, k)`, so a
//! plan can be "executed" without a file system, and two plans compared by
//! the payloads they produce.

use std::path::PathBuf;

use proptest::prelude::*;
use ringfeed::manifest::{FileList, Manifest, ObjectNames};
use ringfeed::planner::{plan_batch, BatchPlan, Coalesce, PlanError, Tier};

/// Objects named `o0000`, `o0001`... under a source that does not exist.
struct Synthetic;

impl ObjectNames for Synthetic {
    fn source_name(&self) -> PathBuf {
        PathBuf::from("/synthetic")
    }

    fn object_name(&self, key: &[u8]) -> PathBuf {
        PathBuf::from("/synthetic").join(String::from_utf8_lossy(key).into_owned())
    }
}

fn manifest(sizes: &[u64], record_bytes: Option<u64>) -> Manifest {
    let mut files = FileList::new();
    for (i, &size) in sizes.iter().enumerate() {
        files.push(format!("o{i:04}").as_bytes(), size);
    }
    Manifest::from_objects(files, record_bytes, &Synthetic).unwrap()
}

/// Byte `at` of object `object`: differs between neighbours in an object
/// and between objects, so a byte from the wrong place shows.
fn content(object: u32, at: u64) -> u8 {
    (at.wrapping_mul(31) ^ u64::from(object).wrapping_mul(0x9E37_79B9) ^ (at >> 8)) as u8
}

/// Filler of payload bytes no sample covers.
const FILLER: u8 = 0xEE;

/// The model: each sample's bytes, end to end in batch order.
fn model_payload(m: &Manifest, batch: &[u64], payload_bytes: u64) -> Vec<u8> {
    let mut payload = vec![FILLER; payload_bytes as usize];
    let mut at = 0usize;
    for &index in batch {
        let loc = m.sample(index);
        for k in 0..loc.len_bytes {
            payload[at] = content(loc.file, loc.offset_bytes + k);
            at += 1;
        }
    }
    payload
}

/// What an engine does with the plan: each read fetches its range once,
/// and each piece is copied from it to its destination.
fn execute(plan: &BatchPlan, payload_bytes: u64) -> Vec<u8> {
    let mut payload = vec![FILLER; payload_bytes as usize];
    for read in &plan.reads {
        let fetched: Vec<u8> = (0..read.len_bytes)
            .map(|k| content(read.object, read.offset_bytes + k))
            .collect();
        for p in &plan.pieces[read.pieces.clone()] {
            let from = (p.offset_bytes - read.offset_bytes) as usize;
            let to = p.dest_offset_bytes as usize;
            payload[to..to + p.len_bytes as usize]
                .copy_from_slice(&fetched[from..from + p.len_bytes as usize]);
        }
    }
    payload
}

/// What a local engine does with the plan: each of a read's spans is one
/// contiguous read into one destination.
fn execute_spans(plan: &BatchPlan, payload_bytes: u64) -> Vec<u8> {
    let mut payload = vec![FILLER; payload_bytes as usize];
    for read in &plan.reads {
        for span in read.spans(&plan.pieces) {
            let to = span.dest_offset_bytes as usize;
            for k in 0..span.len_bytes {
                payload[to + k as usize] = content(read.object, span.offset_bytes + k);
            }
        }
    }
    payload
}

/// Every structural property of one plan of `batch` in a payload of
/// `payload_bytes`.
fn check_plan(
    m: &Manifest,
    batch: &[u64],
    plan: &BatchPlan,
    payload_bytes: u64,
    rule: Option<Coalesce>,
) -> Result<(), TestCaseError> {
    // Places: batch order, end to end from 0.
    prop_assert_eq!(plan.places.len(), batch.len());
    let mut at = 0;
    for (place, &index) in plan.places.iter().zip(batch) {
        prop_assert_eq!(place.index, index);
        prop_assert_eq!(place.offset_bytes, at);
        prop_assert_eq!(place.len_bytes, m.sample(index).len_bytes);
        at += place.len_bytes;
    }
    prop_assert_eq!(plan.used_bytes, at);
    // Every piece belongs to exactly one read, in order.
    let mut next_piece = 0;
    for read in &plan.reads {
        prop_assert_eq!(read.pieces.start, next_piece);
        prop_assert!(read.pieces.end > read.pieces.start, "a read with no piece");
        next_piece = read.pieces.end;
        prop_assert_eq!(read.tier, Tier::Local);
        // A read lies inside one object: never across a file boundary.
        let object_bytes = m.files().size_bytes(read.object as usize);
        prop_assert!(read.offset_bytes + read.len_bytes <= object_bytes);
        if let Some(rule) = rule {
            prop_assert!(
                read.len_bytes <= rule.read_bytes_max || read.pieces.len() == 1,
                "a merged read of {} bytes passes {}",
                read.len_bytes,
                rule.read_bytes_max
            );
        } else {
            prop_assert_eq!(read.pieces.len(), 1);
        }
        for p in &plan.pieces[read.pieces.clone()] {
            prop_assert!(p.offset_bytes >= read.offset_bytes);
            prop_assert!(p.offset_bytes + p.len_bytes <= read.offset_bytes + read.len_bytes);
            // The piece is its sample's bytes, from its sample's object.
            let loc = m.sample(batch[p.sample as usize]);
            prop_assert_eq!(loc.file, read.object);
            prop_assert_eq!(loc.offset_bytes, p.offset_bytes);
            prop_assert_eq!(loc.len_bytes, p.len_bytes);
            prop_assert_eq!(
                plan.places[p.sample as usize].offset_bytes,
                p.dest_offset_bytes
            );
        }
    }
    prop_assert_eq!(next_piece, plan.pieces.len());
    // Destinations: inside the payload, no two overlapping, lengths adding
    // up to the samples' lengths, each sample exactly once.
    let mut dests: Vec<(u64, u64)> = plan
        .pieces
        .iter()
        .map(|p| (p.dest_offset_bytes, p.dest_offset_bytes + p.len_bytes))
        .collect();
    dests.sort_unstable();
    for &(start, end) in &dests {
        prop_assert!(
            end <= payload_bytes,
            "{start}..{end} passes {payload_bytes}"
        );
    }
    for pair in dests.windows(2) {
        prop_assert!(
            pair[0].1 <= pair[1].0,
            "{:?} overlaps {:?}",
            pair[0],
            pair[1]
        );
    }
    let total: u64 = plan.pieces.iter().map(|p| p.len_bytes).sum();
    let expected: u64 = batch.iter().map(|&i| m.sample(i).len_bytes).sum();
    prop_assert_eq!(total, expected);
    let mut samples: Vec<u32> = plan.pieces.iter().map(|p| p.sample).collect();
    samples.sort_unstable();
    prop_assert_eq!(samples, (0..batch.len() as u32).collect::<Vec<_>>());
    Ok(())
}

/// A dataset (object sizes, record size or None) and a batch of distinct
/// sample indices from it.
fn dataset_and_batch() -> impl Strategy<Value = (Vec<u64>, Option<u64>, Vec<u64>)> {
    let whole = proptest::collection::vec(0u64..64, 1..12).prop_map(|sizes| (sizes, None));
    // Record mode: each object a whole number of records, some empty, so
    // batches straddle object boundaries.
    let records = (1u64..9, proptest::collection::vec(0u64..6, 1..10)).prop_map(|(n, counts)| {
        let mut counts = counts;
        if counts.iter().all(|&c| c == 0) {
            counts[0] = 1;
        }
        (counts.iter().map(|c| c * n).collect(), Some(n))
    });
    prop_oneof![whole, records].prop_flat_map(|(sizes, record_bytes)| {
        let m = manifest(&sizes, record_bytes);
        let n = m.len();
        let batch = Just((0..n).collect::<Vec<u64>>())
            .prop_shuffle()
            .prop_flat_map(move |all| {
                let len = all.len();
                (Just(all), 1..=len).prop_map(|(all, take)| all[..take].to_vec())
            });
        (Just(sizes), Just(record_bytes), batch)
    })
}

fn rules() -> impl Strategy<Value = Coalesce> {
    (0u64..24, 1u64..96).prop_map(|(gap_bytes_max, read_bytes_max)| Coalesce {
        gap_bytes_max,
        read_bytes_max,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Uncoalesced and coalesced plans both hold every property, and put
    /// the same bytes in the payload as the model does.
    #[test]
    fn coalesced_and_uncoalesced_plans_put_the_models_bytes_in_the_payload(
        (sizes, record_bytes, batch) in dataset_and_batch(),
        rule in rules(),
        spare in 0u64..16,
    ) {
        let m = manifest(&sizes, record_bytes);
        let needed: u64 = batch.iter().map(|&i| m.sample(i).len_bytes).sum();
        let payload_bytes = needed + spare;
        let model = model_payload(&m, &batch, payload_bytes);

        let mut plain = BatchPlan::default();
        plan_batch(&batch, &m, payload_bytes, Tier::Local, None, &mut plain).unwrap();
        check_plan(&m, &batch, &plain, payload_bytes, None)?;
        prop_assert_eq!(plain.reads.len(), batch.len());
        prop_assert!(execute(&plain, payload_bytes) == model, "uncoalesced payload differs from the model");

        let mut merged = BatchPlan::default();
        plan_batch(&batch, &m, payload_bytes, Tier::Local, Some(rule), &mut merged).unwrap();
        check_plan(&m, &batch, &merged, payload_bytes, Some(rule))?;
        prop_assert!(merged.reads.len() <= plain.reads.len());
        prop_assert!(execute(&merged, payload_bytes) == model, "coalesced payload differs from the model");
        // As the local engines run it: a span per read, or per piece.
        prop_assert!(execute_spans(&merged, payload_bytes) == model, "coalesced spans differ from the model");
        prop_assert!(execute_spans(&plain, payload_bytes) == model, "uncoalesced spans differ from the model");
        for read in &merged.reads {
            let spans = read.spans(&merged.pieces).count();
            let expected = if read.is_contiguous(&merged.pieces) { 1 } else { read.pieces.len() };
            prop_assert_eq!(spans, expected);
        }
        prop_assert_eq!(&merged.places, &plain.places);
    }

    /// Adjacent records of one object in batch order, with no gap allowed
    /// and no size limit, make one read per object run, and each such read
    /// lands in one piece of the payload.
    #[test]
    fn in_order_records_merge_into_one_read_per_object(
        record_bytes in 1u64..9,
        counts in proptest::collection::vec(0u64..6, 1..10),
    ) {
        prop_assume!(counts.iter().any(|&c| c > 0));
        let sizes: Vec<u64> = counts.iter().map(|c| c * record_bytes).collect();
        let m = manifest(&sizes, Some(record_bytes));
        let batch: Vec<u64> = (0..m.len()).collect();
        let rule = Coalesce { gap_bytes_max: 0, read_bytes_max: u64::MAX };
        let mut plan = BatchPlan::default();
        plan_batch(&batch, &m, m.total_bytes(), Tier::Local, Some(rule), &mut plan).unwrap();
        let non_empty = counts.iter().filter(|&&c| c > 0).count();
        prop_assert_eq!(plan.reads.len(), non_empty);
        for read in &plan.reads {
            prop_assert!(read.is_contiguous(&plan.pieces));
            prop_assert_eq!(read.len_bytes, m.files().size_bytes(read.object as usize));
        }
    }

    /// A slot one byte short of the batch names the first sample that does
    /// not fit, and the whole batch's need.
    #[test]
    fn a_slot_too_small_names_the_first_sample_past_it(
        (sizes, record_bytes, batch) in dataset_and_batch(),
    ) {
        let m = manifest(&sizes, record_bytes);
        let needed: u64 = batch.iter().map(|&i| m.sample(i).len_bytes).sum();
        prop_assume!(needed > 0);
        let mut plan = BatchPlan::default();
        let err = plan_batch(&batch, &m, needed - 1, Tier::Local, None, &mut plan).unwrap_err();
        let PlanError::SampleTooLarge { index, needed_bytes, slot_bytes, .. } = err;
        prop_assert_eq!(needed_bytes, needed);
        prop_assert_eq!(slot_bytes, needed - 1);
        // The last sample with bytes is the one that ends past the slot.
        let last = batch.iter().rev().find(|&&i| m.sample(i).len_bytes > 0).copied();
        prop_assert_eq!(Some(index), last);
    }
}
