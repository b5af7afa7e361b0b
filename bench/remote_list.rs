//! Listing benchmark (issue 21, point 5): the same prefix listed once with
//! one sequential paginated listing (`remote::list`) and once with the
//! parallel listing over key ranges (`remote::list_parallel`), timed.
//!
//! ```text
//! cargo build --release --example remote_list
//! target/release/examples/remote_list s3://bucket/prefix/ --workers 64
//! ```
//! Credentials and the endpoint come from the environment as for `ringfeed
//! serve` (AWS_ENDPOINT_URL, AWS_ALLOW_HTTP=true, ...); point
//! AWS_ENDPOINT_URL at a latency proxy to time a slow path.

use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use ringfeed::remote::{list, list_parallel, RemoteRuntime, StoreHandle};

#[derive(Parser)]
struct Args {
    /// s3://, gs://, az:// source (a prefix of many keys).
    url: String,
    /// Parallel listing workers.
    #[arg(long, default_value_t = 64)]
    workers: usize,
    /// Runtime threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Skip the sequential listing (when it is known to take minutes).
    #[arg(long)]
    skip_sequential: bool,
    /// Skip the parallel listing (to measure the server's CPU under the
    /// sequential one alone).
    #[arg(long)]
    skip_parallel: bool,
    /// Print the parallel listing's keys and ranges done as they change.
    #[arg(long)]
    progress: bool,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let rt = Arc::new(RemoteRuntime::new(args.threads)?);
    let store = StoreHandle::open(&args.url)?;
    let mut seq_s = None;
    let mut seq_keys = Vec::new();
    if !args.skip_sequential {
        let t = Instant::now();
        seq_keys = rt.block_on(list(&store, None))?;
        let secs = t.elapsed().as_secs_f64();
        println!(
            "sequential: {} keys in {secs:.2} s ({:.0} keys/s)",
            seq_keys.len(),
            seq_keys.len() as f64 / secs
        );
        seq_s = Some(secs);
    }
    if args.skip_parallel {
        return Ok(());
    }
    let t = Instant::now();
    let started = Instant::now();
    let trace = |p: ringfeed::remote::ListProgress| {
        eprintln!(
            "  {:7.3} s: {} keys, {} ranges done",
            started.elapsed().as_secs_f64(),
            p.keys,
            p.ranges_done
        )
    };
    let progress: Option<&ringfeed::remote::ProgressFn<'_>> =
        if args.progress { Some(&trace) } else { None };
    let par_keys = rt.block_on(list_parallel(&store, args.workers, progress))?;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "parallel ({} workers): {} keys in {secs:.2} s ({:.0} keys/s)",
        args.workers,
        par_keys.len(),
        par_keys.len() as f64 / secs
    );
    if let Some(seq) = seq_s {
        let same = seq_keys.len() == par_keys.len()
            && seq_keys
                .iter()
                .zip(&par_keys)
                .all(|(a, b)| a.key == b.key && a.size == b.size);
        if !same {
            return Err(format!(
                "the listings differ: sequential {} keys, parallel {} keys; \
                 a bug in list_parallel's ranges (rerun with --workers 1 to compare)",
                seq_keys.len(),
                par_keys.len()
            )
            .into());
        }
        println!("speedup: {:.1}x (identical listings)", seq / secs);
    }
    Ok(())
}
