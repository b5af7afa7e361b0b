//! The block order (`serve --shuffle block`): a permutation for every shape,
//! a function of (seed, epoch, n, B, W) only, local in blocks, and the test
//! vectors of docs/sampler.md, section 4.

use std::collections::HashSet;

use proptest::prelude::*;
use ringfeed::sampler::{BlockShape, EpochOrder, ResumeState, SampleOrder, Sampler, SamplerConfig};

fn block_order(seed: u64, epoch: u64, n: u64, block: u32, window: u32) -> EpochOrder {
    let shape = BlockShape::new(block, window).expect("the tests use shapes inside the limits");
    EpochOrder::of(SampleOrder::Block(shape), seed, epoch, n)
}

fn sampler(n: u64, batch_size: u32, world_size: u32, start: ResumeState) -> Sampler {
    Sampler::new(SamplerConfig {
        n_samples: n,
        batch_size,
        world_size,
        seed: 11,
        order: SampleOrder::Block(BlockShape::new(16, 4).unwrap()),
        epochs: 2,
        start,
        tail: ringfeed::sampler::Tail::Drop,
    })
    .unwrap()
}

/// Rows `| seed | epoch | n | B | W | order(0), … |` of the block order's
/// table in docs/sampler.md, and its `order(p) = v` lines.
/// A table row: `(seed, epoch, n, B, W, first positions' indices)`.
type Row = (u64, u64, u64, u32, u32, Vec<u64>);

fn documented_vectors() -> (Vec<Row>, Vec<[u64; 7]>) {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/sampler.md"))
        .expect("docs/sampler.md is in the repository");
    let section = doc
        .split("### 4.3 Test vectors")
        .nth(1)
        .expect("docs/sampler.md has section 4.3, the block order's test vectors");
    let section = section.split("\n## ").next().unwrap_or(section);
    let number = |s: &str| -> u64 { s.trim().replace(' ', "").parse().unwrap() };
    let mut rows = Vec::new();
    let mut points = Vec::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() == 8
            && cells[1].chars().all(|c| c.is_ascii_digit() || c == ' ')
            && !cells[1].is_empty()
        {
            let values: Vec<u64> = cells[6]
                .split(',')
                .map(str::trim)
                .filter(|v| *v != "…")
                .map(number)
                .collect();
            rows.push((
                number(cells[1]),
                number(cells[2]),
                number(cells[3]),
                number(cells[4]) as u32,
                number(cells[5]) as u32,
                values,
            ));
        }
        // `(seed, epoch, n, B, W)`: `order(p) = v`
        if let Some(rest) = line.strip_prefix("- `(") {
            let (args, tail) = rest.split_once(")`").unwrap();
            let a: Vec<u64> = args.split(',').map(number).collect();
            let (p, v) = tail
                .split_once("order(")
                .and_then(|(_, t)| t.split_once(") = "))
                .unwrap();
            let v = v.trim_end_matches(['`', '.', ' ']);
            points.push([a[0], a[1], a[2], a[3], a[4], number(p), number(v)]);
        }
    }
    (rows, points)
}

#[test]
fn the_block_orders_match_the_test_vectors_of_the_documentation() {
    let (rows, points) = documented_vectors();
    assert!(
        rows.len() >= 5 && points.len() >= 2,
        "{} rows, {} points",
        rows.len(),
        points.len()
    );
    for (seed, epoch, n, block, window, values) in rows {
        let order = block_order(seed, epoch, n, block, window);
        let got: Vec<u64> = (0..values.len() as u64).map(|p| order.at(p)).collect();
        assert_eq!(
            got, values,
            "seed {seed} epoch {epoch} n {n} B {block} W {window}"
        );
    }
    for [seed, epoch, n, block, window, p, v] in points {
        let order = block_order(seed, epoch, n, block as u32, window as u32);
        assert_eq!(
            order.at(p),
            v,
            "seed {seed} epoch {epoch} n {n} B {block} W {window} p {p}"
        );
    }
}

#[test]
fn print_the_block_orders_vectors() {
    // `cargo test --test sampler_block print -- --nocapture` prints the rows
    // of docs/sampler.md, section 4.3 (the other test checks them).
    for (seed, epoch, n, block, window, count) in [
        (0u64, 0u64, 10u64, 3u32, 2u32, 10u64),
        (42, 0, 20, 4, 2, 20),
        (42, 1, 20, 4, 2, 20),
        (42, 0, 1000, 256, 8, 8),
        (7, 3, 1000, 10, 1, 12),
        (9, 2, 30, 4, 3, 30),
        (1, 1, 1001, 10, 4, 12),
        (12345, 7, 1_000_000_000, 256, 8, 6),
    ] {
        let order = block_order(seed, epoch, n, block, window);
        let values: Vec<String> = (0..count).map(|p| order.at(p).to_string()).collect();
        println!(
            "| {seed} | {epoch} | {n} | {block} | {window} | {} |",
            values.join(", ")
        );
    }
    let order = block_order(12345, 7, 1_000_000_000, 256, 8);
    println!("order(999999999) = {}", order.at(999_999_999));
    println!("order(500000000) = {}", order.at(500_000_000));
    let order = block_order(1, 1, 1001, 10, 4);
    println!("order(990) = {}", order.at(990));
}

#[test]
fn a_block_order_is_the_same_every_time_and_changes_with_seed_and_epoch() {
    let n = 5000;
    let first: Vec<u64> = (0..n).map(|p| block_order(3, 4, n, 64, 4).at(p)).collect();
    let again: Vec<u64> = (0..n).map(|p| block_order(3, 4, n, 64, 4).at(p)).collect();
    assert_eq!(first, again);
    for (seed, epoch) in [(4, 4), (3, 5)] {
        let other: Vec<u64> = (0..n)
            .map(|p| block_order(seed, epoch, n, 64, 4).at(p))
            .collect();
        let same = first.iter().zip(&other).filter(|(a, b)| a == b).count();
        assert!(
            same < 50,
            "seed {seed} epoch {epoch}: {same} of {n} positions agree"
        );
    }
}

#[test]
fn consecutive_positions_stay_within_a_few_blocks() {
    let (n, block, window) = (100_000u64, 256u32, 8u32);
    let order = block_order(1, 0, n, block, window);
    let b = u64::from(block);
    let stretch = b * u64::from(window);
    // Any W·B consecutive positions read at most 2·W blocks (two windows);
    // the exact order would touch ~W·B blocks.
    for start in (0..n - stretch).step_by(997) {
        let blocks: HashSet<u64> = (start..start + stretch).map(|p| order.at(p) / b).collect();
        assert!(
            blocks.len() <= 2 * window as usize,
            "{} blocks from {start}",
            blocks.len()
        );
    }
    // A window of one block keeps a block's samples together: all but the
    // seams between blocks are neighbours within one block.
    let order = block_order(1, 0, n, block, 1);
    let same = (1..n)
        .filter(|&p| order.at(p) / b == order.at(p - 1) / b)
        .count() as u64;
    assert!(
        same >= (n - 1) - n / b,
        "{same} of {} pairs in one block",
        n - 1
    );
    // The blocks themselves are shuffled: the first of them is not block 0, 1, 2, ….
    let firsts: Vec<u64> = (0..8).map(|i| order.at(i * b) / b).collect();
    assert_ne!(firsts, (0..8).collect::<Vec<_>>());
}

#[test]
fn a_batch_of_the_block_order_reads_from_few_blocks_and_the_exact_order_from_many() {
    // 64-sample batches of 10,000 samples in blocks of 256: what the planner
    // sees as separate reads (docs/sampler.md, section 4.4).
    let (n, batch, block) = (10_000u64, 64u64, 256u64);
    let exact = EpochOrder::of(SampleOrder::Exact, 1, 0, n);
    let blocky = block_order(1, 0, n, block as u32, 8);
    let mean_blocks = |order: &EpochOrder| {
        let batches = n / batch;
        let total: usize = (0..batches)
            .map(|i| {
                (i * batch..(i + 1) * batch)
                    .map(|p| order.at(p) / block)
                    .collect::<HashSet<_>>()
                    .len()
            })
            .sum();
        total as f64 / batches as f64
    };
    let (e, k) = (mean_blocks(&exact), mean_blocks(&blocky));
    assert!(
        k <= 8.5 && e > 25.0,
        "blocks per batch: block order {k}, exact {e}"
    );
}

#[test]
fn the_block_sampler_serves_the_same_sequence_for_any_world_size_and_resumes_anywhere() {
    let n = 1000;
    let full = sampler(n, 5, 1, ResumeState::default());
    let mut reference = Vec::new();
    let mut batch = Vec::new();
    for step in 0..full.steps_in_epoch(0) {
        full.batch_into(0, step, 0, &mut batch);
        reference.extend_from_slice(&batch);
    }
    assert_eq!(reference.len(), 1000);
    for (world_size, resume_at) in [(3u32, 0u64), (4, 40), (7, 355)] {
        let s = sampler(
            n,
            5,
            world_size,
            ResumeState {
                epoch: 0,
                samples_consumed: resume_at,
            },
        );
        let mut served = Vec::new();
        for step in 0..s.steps_in_epoch(0) {
            for rank in 0..world_size {
                s.batch_into(0, step, rank, &mut batch);
                served.extend_from_slice(&batch);
            }
        }
        let from = resume_at as usize;
        assert_eq!(
            served,
            reference[from..from + served.len()],
            "W {world_size} from {resume_at}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_block_order_is_a_permutation(
        n in 1u64..4000,
        block in 1u32..300,
        window in 1u32..20,
        seed in any::<u64>(),
        epoch in 0u64..1000,
    ) {
        let order = block_order(seed, epoch, n, block, window);
        let mut seen = vec![false; n as usize];
        for p in 0..n {
            let i = order.at(p);
            prop_assert!(i < n, "index {} of {}", i, n);
            prop_assert!(!seen[i as usize], "index {} twice", i);
            seen[i as usize] = true;
        }
    }

    #[test]
    fn the_block_order_at_a_position_does_not_depend_on_what_was_asked_before(
        n in 1u64..1_000_000_000,
        block in 1u32..5000,
        window in 1u32..64,
        p in any::<u64>(),
    ) {
        let p = p % n;
        let fresh = block_order(5, 6, n, block, window).at(p);
        let order = block_order(5, 6, n, block, window);
        let _ = order.at((p + 1) % n);
        prop_assert_eq!(order.at(p), fresh);
        prop_assert!(fresh < n);
    }
}

#[test]
fn print_what_each_order_costs() {
    // `cargo test --release --test sampler_block print_what -- --nocapture`:
    // the figures of docs/sampler.md, section 4.4. On a tar-like layout
    // (sample i+1 stored right after sample i), a batch costs one read per
    // run of consecutive indices once adjacent reads are merged.
    let (n, batch) = (1_000_000u64, 64u64);
    let orders = [
        ("exact", SampleOrder::Exact),
        (
            "block 256x8",
            SampleOrder::Block(BlockShape::new(256, 8).unwrap()),
        ),
        (
            "block 256x1",
            SampleOrder::Block(BlockShape::new(256, 1).unwrap()),
        ),
        (
            "block 1024x4",
            SampleOrder::Block(BlockShape::new(1024, 4).unwrap()),
        ),
        ("none", SampleOrder::None),
    ];
    for (name, kind) in orders {
        let order = EpochOrder::of(kind, 1, 0, n);
        let t = std::time::Instant::now();
        let mut runs = 0u64;
        let mut spans = 0u64;
        let mut indices = Vec::with_capacity(batch as usize);
        for b in 0..n / batch {
            indices.clear();
            indices.extend((b * batch..(b + 1) * batch).map(|p| order.at(p)));
            indices.sort_unstable();
            runs += 1 + indices.windows(2).filter(|w| w[1] != w[0] + 1).count() as u64;
            spans += indices.windows(2).filter(|w| w[1] - w[0] > 64).count() as u64 + 1;
        }
        let ns = t.elapsed().as_nanos() as f64 / n as f64;
        let batches = (n / batch) as f64;
        println!(
            "| {name} | {:.1} | {:.1} | {ns:.0} |",
            runs as f64 / batches,
            spans as f64 / batches
        );
    }
}

/// Objects of the planner measurement, named only in errors.
struct Shards;

impl ringfeed::manifest::ObjectNames for Shards {
    fn source_name(&self) -> std::path::PathBuf {
        "/shards".into()
    }

    fn object_name(&self, key: &[u8]) -> std::path::PathBuf {
        std::path::Path::new("/shards").join(String::from_utf8_lossy(key).into_owned())
    }
}

#[test]
fn print_the_planners_reads_per_batch_on_a_shard_layout() {
    // `cargo test --release -p ringfeed --test sampler_block print_the_planners -- --nocapture`:
    // docs/sampler.md, section 4.4. 1,000,000 samples of 4 KiB stored back
    // to back in 256 MiB shards (record mode: the layout of a tar shard's
    // samples, headers aside), batches of 64, planned by the loader's own
    // planner with coalescing.
    use ringfeed::manifest::{FileList, Manifest};
    use ringfeed::planner::{plan_batch, BatchPlan, Coalesce, Tier};
    let (sample, per_shard, n, batch) = (4096u64, 65_536u64, 1_000_000u64, 64u64);
    let mut files = FileList::new();
    for s in 0..n.div_ceil(per_shard) {
        let records = per_shard.min(n - s * per_shard);
        files.push(format!("shard-{s:06}.tar").as_bytes(), records * sample);
    }
    let manifest = Manifest::from_objects(files, Some(sample), &Shards).unwrap();
    let orders = [
        ("exact", SampleOrder::Exact),
        (
            "block 64x4",
            SampleOrder::Block(BlockShape::new(64, 4).unwrap()),
        ),
        (
            "block 32x8",
            SampleOrder::Block(BlockShape::new(32, 8).unwrap()),
        ),
        (
            "block 128x4",
            SampleOrder::Block(BlockShape::new(128, 4).unwrap()),
        ),
        (
            "block 64x8",
            SampleOrder::Block(BlockShape::new(64, 8).unwrap()),
        ),
        (
            "block 256x8",
            SampleOrder::Block(BlockShape::new(256, 8).unwrap()),
        ),
        (
            "block 64x1",
            SampleOrder::Block(BlockShape::new(64, 1).unwrap()),
        ),
        ("none", SampleOrder::None),
    ];
    let mut plan = BatchPlan::default();
    for (name, kind) in orders {
        let order = EpochOrder::of(kind, 1, 0, n);
        let mut cells = Vec::new();
        for gap in [0u64, 64 << 10, 1 << 20] {
            let rule = Coalesce {
                gap_bytes_max: gap,
                read_bytes_max: 16 << 20,
            };
            let (mut reads, mut bytes) = (0u64, 0u64);
            let batches = 2000u64;
            for b in 0..batches {
                let indices: Vec<u64> = (b * batch..(b + 1) * batch).map(|p| order.at(p)).collect();
                plan_batch(
                    &indices,
                    &manifest,
                    batch * sample,
                    Tier::Local,
                    Some(rule),
                    &mut plan,
                )
                .unwrap();
                reads += plan.reads.len() as u64;
                bytes += plan.reads.iter().map(|r| r.len_bytes).sum::<u64>();
            }
            cells.push(format!(
                "{:.1} ({:.2}x)",
                reads as f64 / batches as f64,
                bytes as f64 / (batches * batch * sample) as f64
            ));
        }
        println!("| {name} | {} |", cells.join(" | "));
    }
}

#[test]
fn the_planner_merges_a_batch_of_the_default_block_order_into_about_w_reads() {
    use ringfeed::manifest::{FileList, Manifest};
    use ringfeed::planner::{plan_batch, BatchPlan, Coalesce, Tier};
    let (sample, n, batch) = (4096u64, 100_000u64, 64u64);
    let mut files = FileList::new();
    files.push(b"shard-000000.tar", n * sample);
    let manifest = Manifest::from_objects(files, Some(sample), &Shards).unwrap();
    let rule = Coalesce {
        gap_bytes_max: 64 << 10,
        read_bytes_max: 16 << 20,
    };
    let default_shape = BlockShape::new(
        BlockShape::DEFAULT_BLOCK_SAMPLES,
        BlockShape::DEFAULT_WINDOW_BLOCKS,
    )
    .unwrap();
    let mut plan = BatchPlan::default();
    let mut mean_reads = |kind| {
        let order = EpochOrder::of(kind, 3, 1, n);
        let batches = 300u64;
        let mut reads = 0;
        for b in 0..batches {
            let indices: Vec<u64> = (b * batch..(b + 1) * batch).map(|p| order.at(p)).collect();
            plan_batch(
                &indices,
                &manifest,
                batch * sample,
                Tier::Local,
                Some(rule),
                &mut plan,
            )
            .unwrap();
            reads += plan.reads.len();
        }
        reads as f64 / batches as f64
    };
    let exact = mean_reads(SampleOrder::Exact);
    let block = mean_reads(SampleOrder::Block(default_shape));
    assert!(exact > 60.0, "exact order: {exact} reads per batch");
    assert!(
        block <= 6.0,
        "block order: {block} reads per batch of 64, W = 4"
    );
}
