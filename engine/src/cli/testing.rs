//! Hidden subcommands that drive the ring on its own, for the multi-process
//! tests in C, Python and Rust (tests/, engine/tests/). Not part of the
//! public CLI; their contract is written in tests/README.md.
//!
//! Pattern: batch s of rank r holds B samples; sample j has index
//! `(s·W + r)·B + j`, lies at offset `j·L`, and its byte p is
//! `(index·7 + p) mod 251`.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::ring::{AttachOptions, Consumer, Next, Producer, RingGeometry, SampleEntry};

/// Byte `p` of sample `index` in the test pattern.
pub fn pattern_byte(index: u64, p: u64) -> u8 {
    ((index.wrapping_mul(7).wrapping_add(p)) % 251) as u8
}

/// Arguments of `ring-test-producer`.
#[derive(Args, Debug)]
pub struct ProducerArgs {
    #[arg(long)]
    name: String,
    #[arg(long, default_value_t = 1)]
    world_size: u32,
    #[arg(long)]
    batches: u64,
    #[arg(long, default_value_t = 4)]
    batch_size: u32,
    #[arg(long, default_value_t = 64)]
    sample_bytes: u64,
    #[arg(long, default_value_t = 4)]
    slots_per_rank: u32,
}

/// Publishes `batches` batches to every rank, serving ranks independently (a
/// rank whose consumer is slow or dead never holds the others back), then
/// waits until every batch is released.
pub fn run_producer(a: &ProducerArgs) -> Result<()> {
    let payload = a.sample_bytes * u64::from(a.batch_size);
    let geometry = RingGeometry {
        world_size: a.world_size,
        slots_per_rank: a.slots_per_rank,
        max_samples_per_slot: a.batch_size,
        slot_payload_bytes: payload.max(1),
    };
    let mut p = Producer::create(&a.name, geometry)?;
    for r in 0..a.world_size {
        p.set_batches_expected(r, a.batches);
    }
    println!("ready");
    std::io::stdout().flush()?;
    let mut samples = Vec::with_capacity(a.batch_size as usize);
    let mut last_reclaim = Instant::now();
    loop {
        let mut progressed = false;
        let mut blocked = Vec::new();
        for r in 0..a.world_size {
            if p.published(r) >= a.batches {
                continue;
            }
            let Some(mut claim) = p.try_claim(r) else {
                blocked.push(r);
                continue;
            };
            let s = claim.seq();
            samples.clear();
            let buf = claim.payload_mut();
            for j in 0..u64::from(a.batch_size) {
                let index = (s * u64::from(a.world_size) + u64::from(r)) * u64::from(a.batch_size) + j;
                let off = j * a.sample_bytes;
                for q in 0..a.sample_bytes {
                    buf[(off + q) as usize] = pattern_byte(index, q);
                }
                samples.push(SampleEntry { offset: off, len: a.sample_bytes, index });
            }
            p.publish(claim, 0, s, &samples)?;
            progressed = true;
        }
        let done = (0..a.world_size).all(|r| p.published(r) >= a.batches);
        if done {
            break;
        }
        if !progressed {
            if last_reclaim.elapsed() >= Duration::from_millis(100) {
                p.reclaim_dead_consumers();
                last_reclaim = Instant::now();
            }
            let slots = |p: &Producer, r: u32| p.published(r) < a.batches;
            p.wait_for_release(&blocked, Duration::from_millis(100), |p| blocked.iter().all(|&r| slots(p, r)));
        }
    }
    p.finish();
    while !p.all_released() {
        p.reclaim_dead_consumers();
        let all: Vec<u32> = (0..a.world_size).collect();
        p.wait_for_release(&all, Duration::from_millis(100), |p| !p.all_released());
    }
    Ok(())
}

/// Arguments of `ring-test-consumer`.
#[derive(Args, Debug)]
pub struct ConsumerArgs {
    #[arg(long)]
    name: String,
    #[arg(long)]
    rank: u32,
    #[arg(long, default_value_t = 1)]
    world_size: u32,
    #[arg(long, default_value_t = 4)]
    batch_size: u32,
    #[arg(long, default_value_t = 64)]
    sample_bytes: u64,
    /// Batches expected before END (checked).
    #[arg(long)]
    expect_batches: Option<u64>,
    /// Take this many batches without releasing them, print "holding", then
    /// sleep until killed.
    #[arg(long)]
    take_and_hang: Option<u64>,
    /// Attach timeout in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
}

/// Takes and checks every batch of one rank; prints "ok N" at the end.
pub fn run_consumer(a: &ConsumerArgs) -> Result<()> {
    let mut c = Consumer::attach(&a.name, a.rank, AttachOptions { timeout: Some(Duration::from_millis(a.timeout_ms)) })?;
    if let Some(n) = a.take_and_hang {
        for _ in 0..n {
            match c.next(None)? {
                Next::Batch(_) => {}
                other => bail!("expected a batch to hold, got {other:?}"),
            }
        }
        println!("holding");
        std::io::stdout().flush()?;
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    let mut n = 0u64;
    loop {
        let b = match c.next(None)? {
            Next::Batch(b) => b,
            Next::End => break,
            Next::Timeout => bail!("unexpected timeout"),
        };
        check_batch(&b, a.rank, a.world_size, a.batch_size, a.sample_bytes).with_context(|| format!("batch {n} of rank {}", a.rank))?;
        c.release(b.slot, b.generation)?;
        n += 1;
    }
    if let Some(expected) = a.expect_batches {
        if n != expected {
            bail!("rank {} got {n} batches, expected {expected}", a.rank);
        }
    }
    println!("ok {n}");
    Ok(())
}

/// Checks one batch against the test pattern.
pub fn check_batch(b: &crate::ring::BatchRef, rank: u32, world_size: u32, batch_size: u32, sample_bytes: u64) -> Result<()> {
    if b.n_samples != batch_size {
        bail!("{} samples, expected {batch_size}", b.n_samples);
    }
    for j in 0..batch_size as usize {
        // SAFETY: the batch is held (not released) and its consumer attached.
        let (entry, bytes) = unsafe { (b.sample_table()[j], b.sample_bytes(j)) };
        let index = (b.step * u64::from(world_size) + u64::from(rank)) * u64::from(batch_size) + j as u64;
        if entry.index != index || entry.len != sample_bytes {
            bail!("sample {j}: index {} len {}, expected index {index} len {sample_bytes}", entry.index, entry.len);
        }
        if b.step != b.seq {
            bail!("step {} delivered as the rank's batch {}", b.step, b.seq);
        }
        if let Some(p) = (0..sample_bytes).find(|&p| bytes[p as usize] != pattern_byte(index, p)) {
            bail!("sample {index} byte {p} is wrong");
        }
    }
    Ok(())
}
