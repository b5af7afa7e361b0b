//! Properties of the epoch order and of the per-rank batches, and the test
//! vectors of docs/sampler.md.

use std::collections::HashSet;

use proptest::prelude::*;
use ringfeed::sampler::{
    EpochOrder, ResumeState, SampleOrder, Sampler, SamplerConfig, SamplerError, Tail,
};

/// Everything the ranks received in one epoch.
struct Delivered {
    /// Indices in (step, rank, slot) order: the order's positions as served.
    concatenated: Vec<u64>,
    /// Samples each rank received.
    per_rank: Vec<usize>,
}

fn deliver_epoch(sampler: &Sampler, epoch: u64) -> Delivered {
    let world_size = sampler.config().world_size;
    let mut delivered = Delivered {
        concatenated: Vec::new(),
        per_rank: vec![0; world_size as usize],
    };
    let mut batch = Vec::new();
    for step in 0..sampler.steps_in_epoch(epoch) {
        for rank in 0..world_size {
            sampler.batch_into(epoch, step, rank, &mut batch);
            delivered.per_rank[rank as usize] += batch.len();
            delivered.concatenated.extend_from_slice(&batch);
        }
    }
    delivered
}

fn sampler(
    n_samples: u64,
    batch_size: u32,
    world_size: u32,
    seed: u64,
    start: ResumeState,
) -> Sampler {
    Sampler::new(SamplerConfig {
        n_samples,
        batch_size,
        world_size,
        seed,
        order: SampleOrder::Exact,
        epochs: 3,
        start,
        tail: Tail::Drop,
    })
    .expect("the strategies only build valid configurations")
}

fn order_positions(order: &EpochOrder, positions: std::ops::Range<u64>) -> Vec<u64> {
    positions.map(|p| order.at(p)).collect()
}

/// `(seed, epoch, n, first positions' indices)`: the table of docs/sampler.md.
const TEST_VECTORS: &[(u64, u64, u64, &[u64])] = &[
    (0, 0, 1, &[0]),
    (0, 0, 10, &[0, 7, 6, 1, 9, 2, 3, 4, 8, 5]),
    (42, 0, 10, &[0, 1, 4, 9, 7, 2, 8, 3, 6, 5]),
    (42, 1, 10, &[9, 3, 4, 5, 6, 1, 0, 8, 2, 7]),
    (42, 0, 1000, &[475, 407, 465, 166, 367, 492, 348, 478]),
    (
        12345,
        7,
        1_000_000_000,
        &[
            287250353, 357404382, 227000526, 775987678, 375872268, 794586502,
        ],
    ),
];

#[test]
fn the_orders_match_the_test_vectors_of_the_documentation() {
    for &(seed, epoch, n, expected) in TEST_VECTORS {
        let order = EpochOrder::new(seed, epoch, n, true);
        let got = order_positions(&order, 0..expected.len() as u64);
        assert_eq!(got, expected, "seed {seed}, epoch {epoch}, n {n}");
    }
    let billion = EpochOrder::new(12345, 7, 1_000_000_000, true);
    assert_eq!(billion.at(999_999_999), 620497535);
}

#[test]
fn every_order_of_up_to_2000_samples_is_a_permutation_for_several_seeds() {
    let mut seen = Vec::new();
    for (seed, epoch) in [(0, 0), (42, 5), (u64::MAX, u64::MAX)] {
        for n in 1..=2000u64 {
            let order = EpochOrder::new(seed, epoch, n, true);
            seen.clear();
            seen.resize(n as usize, false);
            for position in 0..n {
                let index = order.at(position);
                assert!(
                    index < n && !seen[index as usize],
                    "seed {seed}, n {n}: {index} twice or out of range"
                );
                seen[index as usize] = true;
            }
        }
    }
}

#[test]
fn a_shuffled_order_moves_samples_far_and_changes_with_the_epoch_and_the_seed() {
    let n = 100_000u64;
    let epoch0 = EpochOrder::new(9, 0, n, true);
    let epoch1 = EpochOrder::new(9, 1, n, true);
    let other_seed = EpochOrder::new(10, 0, n, true);

    // A uniform permutation moves a sample n/3 on average.
    let displacement: u64 = (0..n).map(|p| epoch0.at(p).abs_diff(p)).sum();
    let mean_fraction = displacement as f64 / n as f64 / n as f64;
    assert!(
        (0.30..0.37).contains(&mean_fraction),
        "mean displacement {mean_fraction} of n"
    );

    // Two independent uniform permutations agree at about one position.
    let same_as_next_epoch = (0..n).filter(|&p| epoch0.at(p) == epoch1.at(p)).count();
    let same_as_other_seed = (0..n).filter(|&p| epoch0.at(p) == other_seed.at(p)).count();
    assert!(
        same_as_next_epoch < 20,
        "{same_as_next_epoch} positions equal across epochs"
    );
    assert!(
        same_as_other_seed < 20,
        "{same_as_other_seed} positions equal across seeds"
    );

    // Neighbours in the order are not neighbours in the manifest.
    let adjacent = (1..n)
        .filter(|&p| epoch0.at(p).abs_diff(epoch0.at(p - 1)) == 1)
        .count();
    assert!(
        adjacent < 20,
        "{adjacent} adjacent pairs survived the shuffle"
    );
}

#[test]
fn an_unshuffled_sampler_serves_the_manifest_order() {
    let cfg = SamplerConfig {
        n_samples: 10,
        batch_size: 2,
        world_size: 2,
        seed: 1,
        order: SampleOrder::None,
        epochs: 1,
        start: ResumeState::default(),
        tail: Tail::Drop,
    };
    let sampler = Sampler::new(cfg).unwrap();
    let mut batch = Vec::new();
    sampler.batch_into(0, 1, 1, &mut batch);
    assert_eq!(batch, [6, 7]);
    assert_eq!(
        deliver_epoch(&sampler, 0).concatenated,
        (0..8).collect::<Vec<u64>>()
    );
}

/// `(world_size, batch_size, n_samples)` with at least one full step.
fn shape(max_world_size: u32) -> impl Strategy<Value = (u32, u32, u64)> {
    (1..=max_world_size, 1..=16u32)
        .prop_flat_map(|(w, b)| (Just(w), Just(b), u64::from(w * b)..=2000))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn an_epoch_serves_exactly_the_orders_positions_once_with_equal_counts_per_rank(
        (w, b, n) in shape(8),
        seed in any::<u64>(),
        epoch in 0..3u64,
    ) {
        let sampler = sampler(n, b, w, seed, ResumeState::default());
        let delivered = deliver_epoch(&sampler, epoch);
        let steps = sampler.steps_in_epoch(epoch);
        let step_samples = u64::from(w * b);

        let unique: HashSet<u64> = delivered.concatenated.iter().copied().collect();
        prop_assert_eq!(unique.len(), delivered.concatenated.len(), "a sample came twice");
        let order = EpochOrder::new(seed, epoch, n, true);
        prop_assert_eq!(&delivered.concatenated, &order_positions(&order, 0..steps * step_samples));
        prop_assert!(n - steps * step_samples < step_samples, "the dropped tail is a whole step or more");
        prop_assert!(delivered.per_rank.iter().all(|&count| count as u64 == steps * u64::from(b)));
    }

    #[test]
    fn the_served_order_does_not_depend_on_the_world_size(
        b in 1..=16u32,
        extra in 0..2000u64,
        seed in any::<u64>(),
    ) {
        let n = 3 * u64::from(b) + extra;
        let alone = deliver_epoch(&sampler(n, b, 1, seed, ResumeState::default()), 1).concatenated;
        let three = deliver_epoch(&sampler(n, b, 3, seed, ResumeState::default()), 1).concatenated;
        // Only where the tail is cut differs: the shorter is a prefix.
        prop_assert!(three.len() <= alone.len());
        prop_assert_eq!(&alone[..three.len()], &three[..]);
    }

    #[test]
    fn resuming_from_any_point_with_any_world_size_serves_exactly_the_rest_of_the_epoch(
        (_, b, n) in shape(8),
        new_w in 1..=8u32,
        seed in any::<u64>(),
        epoch in 0..3u64,
        consumed_fraction in 0.0..=1.0f64,
    ) {
        prop_assume!(n >= u64::from(new_w * b));
        let consumed = ((n as f64 * consumed_fraction) as u64).min(n);
        let start = ResumeState { epoch, samples_consumed: consumed };
        let resumed = sampler(n, b, new_w, seed, start);
        let new_step = u64::from(new_w * b);

        let order = EpochOrder::new(seed, epoch, n, true);
        let mut served: Vec<u64> = order_positions(&order, 0..consumed);
        served.extend(deliver_epoch(&resumed, epoch).concatenated);
        let unique: HashSet<u64> = served.iter().copied().collect();
        prop_assert_eq!(unique.len(), served.len(), "a sample came twice");
        prop_assert_eq!(&served, &order_positions(&order, 0..served.len() as u64));
        prop_assert!(n - (served.len() as u64) < new_step, "more than a step left undelivered");

        for later in epoch + 1..resumed.epochs_end() {
            let delivered = deliver_epoch(&resumed, later);
            prop_assert_eq!(delivered.concatenated.len() as u64, n / new_step * new_step);
        }
        prop_assert_eq!(resumed.steps_in_epoch(resumed.epochs_end()), 0);
    }

    #[test]
    fn a_state_saved_mid_epoch_resumes_where_the_old_world_size_stopped(
        (w, b, n) in shape(8),
        new_w in 1..=8u32,
        seed in any::<u64>(),
        steps_fraction in 0.0..=1.0f64,
    ) {
        prop_assume!(n >= u64::from(new_w * b));
        let before = sampler(n, b, w, seed, ResumeState::default());
        let steps_done = (before.steps_in_epoch(1) as f64 * steps_fraction) as u64;
        let mut served: Vec<u64> = Vec::new();
        let mut batch = Vec::new();
        for step in 0..steps_done {
            for rank in 0..w {
                before.batch_into(1, step, rank, &mut batch);
                served.extend_from_slice(&batch);
            }
        }
        let state = before.state_after(1, steps_done);

        let after = sampler(n, b, new_w, seed, state);
        for epoch in after.first_epoch()..after.epochs_end() {
            if epoch == 1 {
                served.extend(deliver_epoch(&after, epoch).concatenated);
            }
        }

        let order = EpochOrder::new(seed, 1, n, true);
        prop_assert_eq!(&served, &order_positions(&order, 0..served.len() as u64));
        let tail = n - served.len() as u64;
        // A finished epoch rolls over with the old tail; otherwise the new one.
        let step = if state.epoch == 2 { u64::from(w * b) } else { u64::from(new_w * b) };
        prop_assert!(tail < step, "{} samples left undelivered", tail);
    }
}

fn keeping(
    n: u64,
    batch_size: u32,
    world_size: u32,
    order: SampleOrder,
    start: ResumeState,
) -> Sampler {
    Sampler::new(SamplerConfig {
        n_samples: n,
        batch_size,
        world_size,
        seed: 5,
        order,
        epochs: 3,
        start,
        tail: Tail::Keep,
    })
    .expect("the strategies only build valid configurations")
}

proptest! {
    /// `--tail keep`: for any n (a step larger than the dataset included),
    /// every sample once an epoch, every rank the same step count
    /// ceil(n / (W·B)), only the last step short or empty; and a run stopped
    /// after any step and resumed with another world size serves the rest
    /// of the epoch once, still in equal steps.
    #[test]
    fn a_kept_tail_serves_every_sample_once_and_resumes_with_any_world_size(
        n in 1u64..700,
        batch_size in 1u32..20,
        world_size in 1u32..9,
        later_world_size in 1u32..9,
        stop_at in 0u64..100,
        block in any::<bool>(),
    ) {
        let order = if block {
            SampleOrder::Block(ringfeed::sampler::BlockShape::new(4, 3).unwrap())
        } else {
            SampleOrder::Exact
        };
        let first = keeping(n, batch_size, world_size, order, ResumeState::default());
        let step = u64::from(batch_size) * u64::from(world_size);
        prop_assert_eq!(first.steps_in_epoch(1), n.div_ceil(step));
        let whole = deliver_epoch(&first, 1);
        let mut sorted = whole.concatenated.clone();
        sorted.sort_unstable();
        prop_assert_eq!(sorted, (0..n).collect::<Vec<u64>>());
        // Rank r's samples: whole steps, then what the last step leaves it.
        let last = n - (first.steps_in_epoch(1) - 1) * step;
        for (rank, &got) in whole.per_rank.iter().enumerate() {
            let in_last = last.saturating_sub(rank as u64 * u64::from(batch_size)).min(u64::from(batch_size));
            prop_assert_eq!(got as u64, (first.steps_in_epoch(1) - 1) * u64::from(batch_size) + in_last);
        }
        // Stop after some steps of epoch 0, go on with another world size.
        let stop_at = stop_at.min(first.steps_in_epoch(0));
        let mut served = Vec::new();
        let mut batch = Vec::new();
        for s in 0..stop_at {
            for rank in 0..world_size {
                first.batch_into(0, s, rank, &mut batch);
                served.extend_from_slice(&batch);
            }
        }
        let state = first.state_after(0, stop_at);
        let second = keeping(n, batch_size, later_world_size, order, state);
        served.extend(deliver_epoch(&second, 0).concatenated);
        if state.epoch == 0 {
            served.sort_unstable();
            prop_assert_eq!(served, (0..n).collect::<Vec<u64>>());
        } else {
            prop_assert_eq!(stop_at, first.steps_in_epoch(0), "only a finished epoch moves on");
        }
    }
}

/// Two epochs of the exact order over `n_samples`, `world_size` ranks of
/// `batch_size`, dropping the tail.
fn two_epochs(n_samples: u64, batch_size: u32, world_size: u32) -> SamplerConfig {
    SamplerConfig {
        n_samples,
        batch_size,
        world_size,
        seed: 7,
        order: SampleOrder::Exact,
        epochs: 2,
        start: ResumeState::default(),
        tail: Tail::Drop,
    }
}

#[test]
fn a_kept_tail_serves_every_sample_once_in_the_same_steps_for_every_rank() {
    // 1003 samples, 3 ranks of 16: 20 whole steps and one of 43 (ranks 0
    // and 1 get 16, rank 2 gets 11), over two epochs.
    let sampler = Sampler::new(SamplerConfig {
        tail: Tail::Keep,
        ..two_epochs(1003, 16, 3)
    })
    .unwrap();
    assert_eq!(sampler.steps_per_epoch(), 21);
    assert_eq!(sampler.total_steps(), Some(42));
    assert_eq!(sampler.samples_dropped_per_epoch(), 0);
    let mut batch = Vec::new();
    for epoch in 0..2 {
        let mut seen = vec![0u32; 1003];
        for step in 0..21 {
            for rank in 0..3 {
                sampler.batch_into(epoch, step, rank, &mut batch);
                let want = if step < 20 {
                    16
                } else {
                    [16, 16, 11][rank as usize]
                };
                assert_eq!(batch.len(), want, "epoch {epoch} step {step} rank {rank}");
                batch.iter().for_each(|&i| seen[i as usize] += 1);
            }
        }
        assert!(seen.iter().all(|&c| c == 1), "epoch {epoch}");
    }
    // 1000 samples, 5 ranks of 250: one step, in which rank 4's batch is
    // empty (still a step: collectives line up).
    let sampler = Sampler::new(SamplerConfig {
        tail: Tail::Keep,
        ..two_epochs(1000, 250, 5)
    })
    .unwrap();
    assert_eq!(sampler.steps_per_epoch(), 1);
    sampler.batch_into(0, 0, 4, &mut batch);
    assert!(batch.is_empty());
    assert_eq!(
        sampler.state_after(0, 1),
        ResumeState {
            epoch: 1,
            samples_consumed: 0
        }
    );
    // Dropping, the same data cannot fill a step.
    assert!(matches!(
        Sampler::new(two_epochs(1000, 250, 5)),
        Err(SamplerError::DatasetSmallerThanStep { .. })
    ));
    assert!(Sampler::new(SamplerConfig {
        tail: Tail::Keep,
        ..two_epochs(0, 1, 1)
    })
    .is_err());
}

#[test]
fn a_resumed_kept_tail_goes_on_with_any_world_size_and_serves_the_rest_once() {
    // Epoch 0 of 1003: 5 steps of 3 x 16 (240 samples), then 7 ranks of
    // 16 (112 a step) serve the 763 left in 7 steps, the last of 91.
    let first = Sampler::new(SamplerConfig {
        tail: Tail::Keep,
        ..two_epochs(1003, 16, 3)
    })
    .unwrap();
    let at = first.state_after(0, 5);
    assert_eq!(
        at,
        ResumeState {
            epoch: 0,
            samples_consumed: 240
        }
    );
    let second = Sampler::new(SamplerConfig {
        tail: Tail::Keep,
        start: at,
        ..two_epochs(1003, 16, 7)
    })
    .unwrap();
    assert_eq!(second.steps_in_epoch(0), 7);
    assert_eq!(
        second.steps_in_epoch(1),
        9,
        "a whole epoch: ceil(1003 / 112)"
    );
    let mut seen = vec![0u32; 1003];
    let mut batch = Vec::new();
    for step in 0..5 {
        for rank in 0..3 {
            first.batch_into(0, step, rank, &mut batch);
            batch.iter().for_each(|&i| seen[i as usize] += 1);
        }
    }
    for step in 0..7 {
        for rank in 0..7 {
            second.batch_into(0, step, rank, &mut batch);
            batch.iter().for_each(|&i| seen[i as usize] += 1);
        }
    }
    assert!(seen.iter().all(|&c| c == 1));
    assert_eq!(
        second.state_after(0, 7),
        ResumeState {
            epoch: 1,
            samples_consumed: 0
        }
    );
}
