//! `ringfeed demo`: the whole path on an embedded default, no setup.
//!
//! Makes a synthetic dataset in a temporary directory (files of varied sizes
//! whose bytes are a function of their sample index), serves it, runs one
//! consumer process per rank, and checks that every rank received exactly the
//! batches the sampler assigns it, every sample exactly once per epoch, with
//! the right bytes. Prints throughput and time to first batch, then cleans up.

use std::collections::HashSet;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::cli::say::say_out;
use crate::cli::testing::{pattern_fill, pattern_mismatch};
use crate::loader::{build, signals, JobConfig, ServeConfig, StopToken};
use crate::reader::{IoChoice, ReaderConfig};
use crate::ring::layout::Job;
use crate::ring::segment::human_bytes;
use crate::ring::{AttachOptions, Consumer, Next};
use crate::sampler::{mix64, ResumeState};

/// Arguments of `ringfeed demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Number of sample files.
    #[arg(long, default_value_t = 2000)]
    files: u64,
    /// Largest sample in bytes (sizes vary between 1/4 of it and it).
    #[arg(long, default_value_t = 128 * 1024)]
    max_sample_bytes: u64,
    /// Consumer processes (ranks).
    #[arg(long, default_value_t = 2)]
    world_size: u32,
    /// Samples per rank per step.
    #[arg(long, default_value_t = 32)]
    batch_size: u32,
    /// Epochs.
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    /// Batch slots per rank (default: as `serve` picks them).
    #[arg(long)]
    slots_per_rank: Option<u32>,
    /// Reader backend.
    #[arg(long, default_value = "auto")]
    io: IoChoice,
    /// Keep the dataset directory.
    #[arg(long)]
    keep: bool,
}

/// Size of demo sample `index`.
pub fn demo_sample_bytes(index: u64, max: u64) -> u64 {
    let min = (max / 4).max(1);
    min + mix64(index) % (max - min + 1)
}

/// Arguments of the hidden `demo-consumer`.
#[derive(Args, Debug)]
pub struct DemoConsumerArgs {
    #[arg(long)]
    name: String,
    #[arg(long)]
    rank: u32,
    #[arg(long)]
    max_sample_bytes: u64,
    /// Where to write the (epoch, step, index) triples received, little-endian u64s.
    #[arg(long)]
    out: PathBuf,
}

/// One demo rank: take every batch, check every byte, record what arrived.
pub fn run_consumer(a: &DemoConsumerArgs) -> Result<()> {
    // A trainer's time to first batch: it starts before the loader has its
    // ring, so the wait in attach counts.
    let started = Instant::now();
    let mut c = Consumer::attach(
        &a.name,
        a.rank,
        AttachOptions {
            timeout: Some(Duration::from_secs(30)),
        },
    )?;
    let mut out = Vec::new();
    let mut first_batch: Option<Duration> = None;
    let (mut batches, mut bytes) = (0u64, 0u64);
    loop {
        let b = match c.next(Some(Duration::from_secs(60)))? {
            Next::Batch(b) => b,
            Next::End => break,
            Next::Timeout => bail!("rank {}: no batch for 60 s", a.rank),
        };
        first_batch.get_or_insert_with(|| started.elapsed());
        // SAFETY: the batch is held until the release below.
        let table = unsafe { b.sample_table() };
        for (j, s) in table.iter().enumerate() {
            // SAFETY: as above.
            let data = unsafe { b.sample_bytes(j) };
            let want = demo_sample_bytes(s.index, a.max_sample_bytes);
            if s.len != want {
                bail!(
                    "rank {}: sample {} has {} bytes, its file has {want}",
                    a.rank,
                    s.index,
                    s.len
                );
            }
            if let Some(p) = pattern_mismatch(s.index, data) {
                bail!(
                    "rank {}: sample {} byte {p} differs from its file",
                    a.rank,
                    s.index
                );
            }
            for v in [b.epoch, b.step, s.index] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            bytes += s.len;
        }
        c.release(b.slot, b.generation)?;
        batches += 1;
    }
    fs::write(&a.out, out).with_context(|| format!("cannot write {}", a.out.display()))?;
    say_out!(
        "{batches} {bytes} {}",
        first_batch.unwrap_or_default().as_micros()
    );
    Ok(())
}

fn make_dataset(dir: &Path, files: u64, max: u64) -> Result<u64> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut total = 0;
    let mut buf = Vec::new();
    for i in 0..files {
        let sig = signals::STOP.load(Ordering::Relaxed);
        if sig != 0 {
            bail!("stopped by signal {sig} while writing the dataset ({i} of {files} files written); nothing was served");
        }
        let len = demo_sample_bytes(i, max);
        buf.resize(len as usize, 0);
        pattern_fill(i, &mut buf);
        // Zero-padded names sort in index order, so file i is sample i.
        let path = dir.join(format!("sample-{i:08}.bin"));
        fs::write(&path, &buf).with_context(|| format!("cannot write {}", path.display()))?;
        total += len;
    }
    Ok(total)
}

struct RankResult {
    child: Child,
    out: PathBuf,
}

/// Runs the demo.
pub fn run(a: &DemoArgs) -> Result<()> {
    signals::unignore_stop_signals();
    signals::install();
    let tmp = std::env::temp_dir();
    if !tmp.is_dir() {
        // create_dir_all below would make it, outside any temporary area.
        anyhow::bail!("the temporary directory {} does not exist (TMPDIR?); set TMPDIR to an existing directory", tmp.display());
    }
    let dir = tmp.join(format!("ringfeed-demo-{}", std::process::id()));
    let result = run_in(a, &dir);
    if !a.keep {
        let _ = fs::remove_dir_all(&dir);
    }
    result
}

/// The demo's arguments checked before anything is written.
fn check(a: &DemoArgs) -> Result<()> {
    const MAX_SAMPLE_BYTES_LIMIT: u64 = 64 << 20;
    if !(1..=MAX_SAMPLE_BYTES_LIMIT).contains(&a.max_sample_bytes) {
        anyhow::bail!(
            "--max-sample-bytes {}: must be from 1 to {MAX_SAMPLE_BYTES_LIMIT}",
            a.max_sample_bytes
        );
    }
    if a.world_size > crate::ring::layout::MAX_RANKS {
        anyhow::bail!(
            "--world-size {}: a loader serves at most {} ranks",
            a.world_size,
            crate::ring::layout::MAX_RANKS
        );
    }
    if a.world_size == 0 || a.batch_size == 0 || a.epochs == 0 {
        anyhow::bail!(
            "--world-size {}, --batch-size {}, --epochs {}: each must be at least 1",
            a.world_size,
            a.batch_size,
            a.epochs
        );
    }
    let step = u64::from(a.world_size) * u64::from(a.batch_size);
    if a.files < step {
        anyhow::bail!(
            "--files {} cannot fill one step of W×B = {step} samples; give at least {step} files",
            a.files
        );
    }
    Ok(())
}

fn run_in(a: &DemoArgs, dir: &Path) -> Result<()> {
    check(a)?;
    let data_dir = dir.join("data");
    let name = format!("demo-{}", std::process::id());
    let cfg = demo_config(a, &data_dir, &name);
    // `serve`'s own check of its ring flags, before anything is written.
    cfg.check_ring_flags()?;
    let t = Instant::now();
    let total = make_dataset(&data_dir, a.files, a.max_sample_bytes)?;
    say_out!(
        "demo: wrote {} files ({}) to {} in {:.2} s",
        a.files,
        human_bytes(total),
        data_dir.display(),
        t.elapsed().as_secs_f64()
    );
    // The same door as `serve`: the ring is up when this returns, and the
    // consumers attach to it.
    let stop = StopToken::new();
    let built = build(&JobConfig::plain(cfg), &stop)?;
    let loader = built.loader();
    let sampler = loader.plan().sampler().clone();
    let mut ranks = spawn_consumers(a, dir, &name)?;
    let ring_bytes = loader.producer().layout().segment_bytes;
    // A consumer that fails (its byte check, a crash) would leave the loader
    // waiting for a new trainer on its rank forever: a watcher stops the run.
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (stop, done) = (stop.clone(), Arc::clone(&done));
        let pids: Vec<u32> = ranks.iter().map(|r| r.child.id()).collect();
        std::thread::spawn(move || watch_consumers(&pids, &stop, &done))
    };
    let result = built.finish(&stop);
    done.store(true, Ordering::Relaxed);
    let failed = watcher.join().unwrap_or(None);
    let report = match (result, failed) {
        (Ok(finished), _) => finished.report,
        (Err(e), failed) => {
            let mut failed_status = None;
            for (r, rank) in ranks.iter_mut().enumerate() {
                let _ = rank.child.kill();
                let status = rank.child.wait();
                if Some(r as u32) == failed {
                    failed_status = status.ok();
                }
            }
            let (Some(r), Some(status)) = (failed, failed_status) else {
                return Err(e.into());
            };
            let said = if status.code().is_some() {
                "; its message is above"
            } else {
                ""
            };
            bail!("the consumer of rank {r} failed ({status}){said}; the loader stopped");
        }
    };
    let first_batch_us = consumer_results(&mut ranks)?;
    check_exactly_once(&sampler, &ranks)?;
    let secs = report.elapsed.as_secs_f64();
    say_out!(
        "demo: exactly-once check passed: {} ranks × {} epochs, every sample of every epoch delivered once (tail of {} dropped per epoch), bytes equal to the files",
        a.world_size,
        a.epochs,
        sampler.config().n_samples % sampler.step_samples()
    );
    say_out!(
        "demo: delivered {} batches, {} samples, {} in {:.3} s: {:.2} GB/s, {:.0} samples/s (reader {}, ring {} in /dev/shm)",
        report.batches,
        report.samples,
        human_bytes(report.bytes),
        secs,
        report.bytes as f64 / secs.max(1e-9) / 1e9,
        report.samples as f64 / secs.max(1e-9),
        report.backend,
        human_bytes(ring_bytes),
    );
    let fb = first_batch_us
        .iter()
        .map(|us| format!("{:.1} ms", *us as f64 / 1e3))
        .collect::<Vec<_>>()
        .join(", ");
    say_out!("demo: time to first batch per rank, from its consumer's start (waiting in attach for the ring included): {fb}");
    if let (Some(first), Some(all)) = (report.first_publish, report.all_first_published) {
        say_out!(
            "demo: the loader published the first rank's first batch {:.1} ms after creating the ring, and every rank's by {:.1} ms (the consumers were started just after it)",
            first.as_secs_f64() * 1e3,
            all.as_secs_f64() * 1e3
        );
    }
    std::io::stdout().flush()?;
    Ok(())
}

/// The run `demo` serves: its dataset, every rank on this machine.
fn demo_config(a: &DemoArgs, data_dir: &Path, name: &str) -> ServeConfig {
    ServeConfig {
        source: data_dir.to_path_buf().into(),
        name: name.to_string(),
        batch_size: a.batch_size,
        world_size: a.world_size,
        job: Job::single(a.world_size),
        epochs: a.epochs,
        seed: 42,
        order: crate::sampler::SampleOrder::Exact,
        record_bytes: None,
        slots_per_rank: a.slots_per_rank,
        slot_bytes: None,
        io: a.io,
        reader: ReaderConfig::default(),
        start: ResumeState::default(),
        tail: crate::sampler::Tail::Drop,
        progress: false,
        decode: None,
        tokens: None,
    }
}

/// Starts one consumer process per rank; on a failure, stops those started.
fn spawn_consumers(a: &DemoArgs, dir: &Path, name: &str) -> Result<Vec<RankResult>> {
    let exe = std::env::current_exe().context("cannot find the ringfeed executable")?;
    let mut ranks = Vec::new();
    for r in 0..a.world_size {
        let out = dir.join(format!("rank{r}.bin"));
        let spawned = Command::new(&exe)
            .args([
                "demo-consumer",
                "--name",
                name,
                "--rank",
                &r.to_string(),
                "--max-sample-bytes",
                &a.max_sample_bytes.to_string(),
                "--out",
            ])
            .arg(&out)
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start a consumer process");
        match spawned {
            Ok(child) => ranks.push(RankResult { child, out }),
            Err(e) => {
                // Do not leave the started consumers waiting.
                for rank in &mut ranks {
                    let _ = rank.child.kill();
                    let _ = rank.child.wait();
                }
                return Err(e);
            }
        }
    }
    Ok(ranks)
}

/// Waits for every consumer; each one's time to its first batch, in µs.
fn consumer_results(ranks: &mut [RankResult]) -> Result<Vec<u64>> {
    let mut first_batch_us = Vec::new();
    for (r, rank) in ranks.iter_mut().enumerate() {
        let stdout = rank.child.stdout.take().context("consumer stdout")?;
        let line = BufReader::new(stdout)
            .lines()
            .next()
            .transpose()?
            .unwrap_or_default();
        let status = rank.child.wait()?;
        if !status.success() {
            bail!("consumer of rank {r} failed ({status})");
        }
        let fields: Vec<u64> = line
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        first_batch_us.push(fields.get(2).copied().unwrap_or(0));
    }
    Ok(first_batch_us)
}

/// Polls the consumers until `done`; on the first that exits with an error
/// or a signal, sets `stop` and returns its rank. A consumer that exits 0 has
/// taken its last batch. `waitid(WNOWAIT)` leaves the child to be reaped by
/// its `Child`.
fn watch_consumers(pids: &[u32], stop: &StopToken, done: &AtomicBool) -> Option<u32> {
    while !done.load(Ordering::Relaxed) {
        let sig = signals::STOP.load(Ordering::Relaxed);
        if sig != 0 {
            stop.stop_by_signal(sig);
            return None;
        }
        for (r, &pid) in pids.iter().enumerate() {
            // SAFETY: waitid writes only into `info`; WNOWAIT reaps nothing.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            let rc = unsafe {
                libc::waitid(
                    libc::P_PID,
                    pid,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                )
            };
            // SAFETY: after a successful waitid the pid and status fields are set.
            let (exited, failed) = unsafe {
                (
                    info.si_pid() != 0,
                    info.si_code != libc::CLD_EXITED || info.si_status() != 0,
                )
            };
            if rc == 0 && exited && failed {
                // The others would only report the loader's stop: end them first.
                for &other in pids.iter().filter(|&&p| p != pid) {
                    // SAFETY: a signal to our own child, not yet reaped.
                    unsafe { libc::kill(other as libc::pid_t, libc::SIGKILL) };
                }
                stop.stop();
                return Some(r as u32);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn check_exactly_once(sampler: &crate::sampler::Sampler, ranks: &[RankResult]) -> Result<()> {
    let mut expected = Vec::new();
    let mut per_epoch: Vec<HashSet<u64>> = vec![HashSet::new(); sampler.epochs_end() as usize];
    for (r, rank) in ranks.iter().enumerate() {
        let raw =
            fs::read(&rank.out).with_context(|| format!("cannot read {}", rank.out.display()))?;
        let got: Vec<u64> = raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect();
        let mut want = Vec::new();
        for epoch in sampler.first_epoch()..sampler.epochs_end() {
            for step in 0..sampler.steps_in_epoch(epoch) {
                sampler.batch_into(epoch, step, r as u32, &mut expected);
                for &i in &expected {
                    want.extend_from_slice(&[epoch, step, i]);
                }
            }
        }
        if got != want {
            bail!(
                "rank {r} received {} samples, not the {} the sampler assigns it in order",
                got.len() / 3,
                want.len() / 3
            );
        }
        for t in got.chunks_exact(3) {
            if !per_epoch[t[0] as usize].insert(t[2]) {
                bail!("sample {} delivered twice in epoch {}", t[2], t[0]);
            }
        }
    }
    for (epoch, seen) in per_epoch
        .iter()
        .enumerate()
        .skip(sampler.first_epoch() as usize)
    {
        let want = sampler.steps_in_epoch(epoch as u64) * sampler.step_samples();
        if seen.len() as u64 != want {
            bail!(
                "epoch {epoch}: {} distinct samples delivered, expected {want}",
                seen.len()
            );
        }
    }
    Ok(())
}
