//! Figures asked of the readers (ignored: they print, and assert nothing
//! about speed). Run with
//!
//! ```text
//! RINGFEED_BENCH_BACKENDS=uring,uring:threads=1,pread \
//!   cargo test --release -p ringfeed --test reader -- --ignored --nocapture bench
//! ```
//!
//! Knobs: `RINGFEED_BENCH_BACKENDS` (see `bench_backends`), `RINGFEED_BENCH_PASSES`
//! (10), `RINGFEED_BENCH_BATCH` (64 reads per submit and reap), `RINGFEED_BENCH_QD`
//! (256), `RINGFEED_BENCH_THREADS` (16 pread threads), `RINGFEED_BENCH_FILES`
//! (20,000), `RINGFEED_BENCH_DIR` (keep the files between runs). Passes of the
//! backends are interleaved, so that load from elsewhere on the machine hits
//! them alike; the CPU column is user + system time of every thread per GB.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ringfeed::reader::{IoChoice, ReadEngine, ReadOp, ReaderConfig};

use crate::support::{make_files, open_choice, ops_into, pattern, table};

/// User plus system CPU time of this process, every thread (io_uring's
/// io-wq workers are threads of the process too).
fn cpu_seconds() -> f64 {
    // SAFETY: all-zero is a valid rusage, which getrusage fills.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is valid for writes for the call.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn bench_env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One backend under measurement.
struct BenchRun {
    name: String,
    engine: Box<dyn ReadEngine>,
    seconds: Vec<f64>,
    cpu_seconds: f64,
}

/// One pass: every op, keeping the engine full, submitting and reaping in
/// batches of `batch`. Returns the seconds it took.
fn bench_pass(engine: &mut dyn ReadEngine, ops: &[ReadOp], batch: usize) -> f64 {
    let start = Instant::now();
    let mut out = Vec::with_capacity(engine.max_in_flight());
    let (mut next, mut done) = (0, 0);
    while done < ops.len() {
        let room = engine.max_in_flight() - engine.in_flight();
        if next < ops.len() && room >= batch.min(ops.len() - next) {
            let n = room.min(ops.len() - next);
            // SAFETY: disjoint regions of the bench's buffer, untouched until reaped.
            unsafe { engine.submit(&ops[next..next + n]) }.unwrap();
            next += n;
        }
        out.clear();
        done += engine
            .reap(&mut out, batch.min(engine.in_flight()), None)
            .unwrap();
        assert!(out.iter().all(|c| c.result.is_ok()), "{out:?}");
    }
    start.elapsed().as_secs_f64()
}

/// Reads every file whole into its own region of one buffer with each
/// backend of `RINGFEED_BENCH_BACKENDS`, passes interleaved so that load from
/// elsewhere hits all alike; prints best and median pass and CPU time.
fn bench_whole_files(label: &str, paths: &[PathBuf], size: u64) {
    let batch = bench_env("RINGFEED_BENCH_BATCH", 64);
    println!(
        "{label}: {} files, submitted and reaped in batches of {batch}",
        paths.len()
    );
    let sizes = vec![size; paths.len()];
    let mut runs: Vec<BenchRun> = bench_backends()
        .into_iter()
        .filter_map(|(name, choice, cfg)| {
            let engine = open_choice(choice, table(paths, &sizes, false), &cfg)?;
            Some(BenchRun {
                name,
                engine,
                seconds: Vec::new(),
                cpu_seconds: 0.0,
            })
        })
        .collect();
    let mut buf = vec![0u8; paths.len() * size as usize];
    buf.iter_mut().step_by(4096).for_each(|b| *b = 1); // fault the pages in before timing
    let ranges: Vec<(u32, u64, u64)> = (0..paths.len() as u32).map(|f| (f, 0, size)).collect();
    let ops = ops_into(&mut buf, &ranges);
    // One untimed pass puts every file in the page cache.
    if let Some(run) = runs.first_mut() {
        bench_pass(run.engine.as_mut(), &ops, batch);
    }
    for _ in 0..bench_env("RINGFEED_BENCH_PASSES", 10) {
        for run in runs.iter_mut() {
            let cpu_start = cpu_seconds();
            run.seconds
                .push(bench_pass(run.engine.as_mut(), &ops, batch));
            run.cpu_seconds += cpu_seconds() - cpu_start;
        }
    }
    let bytes = (paths.len() as u64 * size) as f64;
    for run in runs.iter_mut() {
        run.seconds.sort_by(f64::total_cmp);
        let (best, median) = (run.seconds[0], run.seconds[run.seconds.len() / 2]);
        println!(
            "  {:<22} best {:>5.2} GB/s {:>7.0} files/s | median {:>5.2} GB/s {:>7.0} files/s | {:>5.2} CPU s/GB",
            run.name,
            bytes / best / 1e9,
            paths.len() as f64 / best,
            bytes / median / 1e9,
            paths.len() as f64 / median,
            run.cpu_seconds / run.seconds.len() as f64 / (bytes / 1e9),
        );
    }
    drop(runs);
    assert!(
        buf[..size as usize] == pattern(0, size)[..],
        "file 0 arrived wrong"
    );
}

/// Backends to measure, from `RINGFEED_BENCH_BACKENDS`: a comma-separated
/// list of `uring`, `pread`, with options after colons: `uring:qd=512`,
/// `uring:threads=1` (`uring_threads`), `pread:threads=8`
/// (`pread_threads`). Default `uring,pread`.
fn bench_backends() -> Vec<(String, IoChoice, ReaderConfig)> {
    let list =
        std::env::var("RINGFEED_BENCH_BACKENDS").unwrap_or_else(|_| "uring,pread".to_string());
    list.split(',')
        .map(|spec| {
            let mut words = spec.split(':');
            let choice: IoChoice = words.next().unwrap().parse().unwrap();
            let mut cfg = bench_config();
            for option in words {
                let (key, value) = option.split_once('=').unwrap();
                let number = || value.parse::<usize>().unwrap();
                match key {
                    "qd" => cfg.queue_depth = number() as u32,
                    "threads" if choice == IoChoice::Pread => cfg.pread_threads = number(),
                    "threads" => cfg.uring_threads = number(),
                    _ => panic!("unknown bench option {key}"),
                }
            }
            (spec.to_string(), choice, cfg)
        })
        .collect()
}

fn bench_config() -> ReaderConfig {
    ReaderConfig {
        queue_depth: bench_env("RINGFEED_BENCH_QD", 256) as u32,
        pread_threads: bench_env("RINGFEED_BENCH_THREADS", 16),
        ..ReaderConfig::default()
    }
}

#[test]
#[ignore = "prints figures; run with --release --ignored --nocapture bench"]
fn bench_20000_files_of_100_kb_from_warm_page_cache() {
    bench_files_of("100 KB files", 100_000);
}

#[test]
#[ignore = "prints figures; run with --release --ignored --nocapture bench"]
fn bench_20000_files_of_4_kib_from_warm_page_cache() {
    bench_files_of("4 KiB files", 4096);
}

/// `RINGFEED_BENCH_FILES` (20,000) files of `size` bytes, in a temporary
/// directory, or kept between runs in `RINGFEED_BENCH_DIR` if set.
fn bench_files_of(label: &str, size: u64) {
    let count = bench_env("RINGFEED_BENCH_FILES", 20_000);
    let temp = tempfile::tempdir().unwrap();
    let dir = match std::env::var_os("RINGFEED_BENCH_DIR") {
        Some(root) => Path::new(&root).join(format!("{count}x{size}")),
        None => temp.path().to_path_buf(),
    };
    let paths: Vec<PathBuf> = (0..count)
        .map(|i| dir.join(format!("f{i:06}.bin")))
        .collect();
    if !paths
        .iter()
        .all(|p| fs::metadata(p).is_ok_and(|m| m.len() == size))
    {
        fs::create_dir_all(&dir).unwrap();
        make_files(&dir, &vec![size; count]);
    }
    bench_whole_files(label, &paths, size);
}
