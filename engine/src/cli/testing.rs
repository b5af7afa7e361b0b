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

/// The pattern repeats every 251 bytes: a table of 0..251 repeated lets
/// fill and check run as memcpy/memcmp over windows of it.
const PERIOD: usize = 251;
const TABLE_BYTES: usize = PERIOD * 64;

fn table() -> &'static [u8; TABLE_BYTES] {
    static TABLE: std::sync::OnceLock<[u8; TABLE_BYTES]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|i| (i % PERIOD) as u8))
}

/// Calls `f(window, start)` over `len` bytes of sample `index`'s pattern, in chunks.
fn for_pattern_chunks(index: u64, len: usize, mut f: impl FnMut(&[u8], usize) -> bool) -> bool {
    let t = table();
    let chunk = TABLE_BYTES - PERIOD;
    let mut p = 0;
    while p < len {
        let phase = (index.wrapping_mul(7).wrapping_add(p as u64) % PERIOD as u64) as usize;
        let n = chunk.min(len - p);
        if !f(&t[phase..phase + n], p) {
            return false;
        }
        p += n;
    }
    true
}

/// Writes sample `index`'s pattern into `out`.
pub fn pattern_fill(index: u64, out: &mut [u8]) {
    let len = out.len();
    for_pattern_chunks(index, len, |w, p| {
        out[p..p + w.len()].copy_from_slice(w);
        true
    });
}

/// Position of the first byte of `data` that differs from sample `index`'s pattern.
pub fn pattern_mismatch(index: u64, data: &[u8]) -> Option<usize> {
    let mut bad = None;
    for_pattern_chunks(index, data.len(), |w, p| {
        if data[p..p + w.len()] == *w {
            return true;
        }
        bad = (0..w.len()).find(|&i| data[p + i] != w[i]).map(|i| p + i);
        false
    });
    bad
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

/// How often the test producer reclaims the slots of dead consumers while a
/// rank is blocked.
const RECLAIM_EVERY: Duration = Duration::from_millis(100);

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
            let Some(mut claim) = p.try_claim(r)? else {
                blocked.push(r);
                continue;
            };
            let s = claim.seq();
            samples.clear();
            let buf = claim.payload_mut();
            for j in 0..u64::from(a.batch_size) {
                let index =
                    (s * u64::from(a.world_size) + u64::from(r)) * u64::from(a.batch_size) + j;
                let off = j * a.sample_bytes;
                pattern_fill(
                    index,
                    &mut buf[off as usize..(off + a.sample_bytes) as usize],
                );
                samples.push(SampleEntry {
                    offset: off,
                    len: a.sample_bytes,
                    index,
                });
            }
            p.publish(claim, 0, s, &samples)?;
            progressed = true;
        }
        let done = (0..a.world_size).all(|r| p.published(r) >= a.batches);
        if done {
            break;
        }
        // Reclaim on a timer whenever a rank is blocked, even while other
        // ranks progress: a busy rank must not delay a dead one's reclaim.
        if !blocked.is_empty() && last_reclaim.elapsed() >= RECLAIM_EVERY {
            p.reclaim_dead_consumers();
            last_reclaim = Instant::now();
        }
        if !progressed {
            // Sleep no later than the next reclaim is due. The re-check asks
            // whether a slot came free, so a release that landed after the
            // failed claim but before the sleep is not missed.
            let until_reclaim = RECLAIM_EVERY
                .saturating_sub(last_reclaim.elapsed())
                .max(Duration::from_millis(1));
            p.wait_for_release(&blocked, until_reclaim, |p| {
                blocked.iter().all(|&r| !p.can_claim(r))
            });
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
    let mut c = Consumer::attach(
        &a.name,
        a.rank,
        AttachOptions {
            timeout: Some(Duration::from_millis(a.timeout_ms)),
        },
    )?;
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
        check_batch(&b, a.rank, a.world_size, a.batch_size, a.sample_bytes)
            .with_context(|| format!("batch {n} of rank {}", a.rank))?;
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
pub fn check_batch(
    b: &crate::ring::BatchRef,
    rank: u32,
    world_size: u32,
    batch_size: u32,
    sample_bytes: u64,
) -> Result<()> {
    if b.n_samples != batch_size {
        bail!("{} samples, expected {batch_size}", b.n_samples);
    }
    for j in 0..batch_size as usize {
        // SAFETY: the batch is held (not released) and its consumer attached.
        let (entry, bytes) = unsafe { (b.sample_table()[j], b.sample_bytes(j)) };
        let index =
            (b.step * u64::from(world_size) + u64::from(rank)) * u64::from(batch_size) + j as u64;
        if entry.index != index || entry.len != sample_bytes {
            bail!(
                "sample {j}: index {} len {}, expected index {index} len {sample_bytes}",
                entry.index,
                entry.len
            );
        }
        if b.step != b.seq {
            bail!("step {} delivered as the rank's batch {}", b.step, b.seq);
        }
        if let Some(p) = pattern_mismatch(index, bytes) {
            bail!("sample {index} byte {p} is wrong");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_pattern_equals_the_definition() {
        // The largest index whose `index·7 + p` stays below 2^64 for these
        // 40 000 bytes: past it `pattern_byte` wraps and the two differ, but no
        // manifest comes near 2^61 samples.
        for index in [0u64, 1, 250, 251, 12345, (u64::MAX - 40_000) / 7] {
            let mut v = vec![0u8; 40_000];
            pattern_fill(index, &mut v);
            assert!(v
                .iter()
                .enumerate()
                .all(|(p, &b)| b == pattern_byte(index, p as u64)));
            assert_eq!(pattern_mismatch(index, &v), None);
            v[39_999] ^= 1;
            assert_eq!(pattern_mismatch(index, &v), Some(39_999));
        }
    }
}
