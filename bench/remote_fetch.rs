//! The raw-client baseline of the remote engine: fetch N objects of a
//! source with W GETs in flight and print MB/s.
//!
//! ```text
//! cargo run --release --example remote_fetch -- s3://bucket/prefix --objects 10000 --in-flight 256
//! cargo run --release --example remote_fetch -- http://127.0.0.1:8080/data --in-flight 64
//! ```
//! Credentials and endpoints come from the environment as for `ringfeed
//! serve` (AWS_ENDPOINT_URL, AWS_ALLOW_HTTP=true, ...). http(s):// sources are
//! listed by WebDAV PROPFIND depth 1, the others with a parallel listing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use ringfeed::remote::{
    list_parallel, list_webdav, read_keys_file, FetchConfig, FetchEngine, FetchRead, RemoteRuntime,
    Scheme, StoreHandle,
};

#[derive(Parser)]
struct Args {
    /// s3://, gs://, az://, http(s):// source.
    url: String,
    /// Objects to fetch (the first N keys of the listing; 0: all).
    #[arg(long, default_value_t = 0)]
    objects: usize,
    /// GETs in flight (the window, held fixed).
    #[arg(long, default_value_t = 256)]
    in_flight: usize,
    /// Passes over the objects.
    #[arg(long, default_value_t = 1)]
    passes: usize,
    /// Runtime threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// A key list instead of listing (`KEY` or `KEY<TAB>SIZE` per line).
    #[arg(long)]
    keys: Option<std::path::PathBuf>,
    /// Listing workers (non-http sources).
    #[arg(long, default_value_t = 16)]
    list_workers: usize,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let rt = Arc::new(RemoteRuntime::new(args.threads)?);
    let store = StoreHandle::open(&args.url)?;
    let t = Instant::now();
    let mut objects = match (&args.keys, store.scheme) {
        (Some(file), _) => rt.block_on(read_keys_file(&store, file))?,
        (None, Scheme::Http) => rt.block_on(list_webdav(&store))?,
        (None, _) => rt.block_on(list_parallel(&store, args.list_workers, None))?,
    };
    println!(
        "listed {} objects in {:.2} s",
        objects.len(),
        t.elapsed().as_secs_f64()
    );
    if args.objects > 0 {
        objects.truncate(args.objects);
    }
    let total_bytes: u64 = objects.iter().map(|o| o.size).sum();
    let objects = Arc::new(objects);
    let cfg = FetchConfig {
        window_initial: args.in_flight,
        window_min: args.in_flight,
        window_max: args.in_flight,
        queued_reads_max: objects.len().max(1),
        ..FetchConfig::default()
    };
    let mut engine = FetchEngine::start(Arc::clone(&rt), store, Arc::clone(&objects), cfg)?;
    // One buffer for all objects, like slot memory: every object lands at its own offset.
    let mut buf = vec![0u8; total_bytes as usize];
    for pass in 0..args.passes {
        let mut off = 0usize;
        let reads: Vec<FetchRead> = objects
            .iter()
            .enumerate()
            .map(|(i, o)| {
                // SAFETY: offsets stay within `buf` (their sum is total_bytes).
                let dest = unsafe { buf.as_mut_ptr().add(off) };
                off += o.size as usize;
                FetchRead {
                    object: i as u32,
                    range: 0..o.size,
                    dest,
                    tag: i as u64,
                }
            })
            .collect();
        let t = Instant::now();
        // SAFETY: disjoint ranges of `buf`, untouched until every completion is reaped.
        unsafe { engine.submit(&reads)? };
        let mut done = Vec::with_capacity(reads.len());
        while engine.outstanding() > 0 {
            engine.reap(&mut done, 1, Duration::from_secs(1));
        }
        let secs = t.elapsed().as_secs_f64();
        if let Some(err) = done.iter().find_map(|c| c.result.as_ref().err()) {
            return Err(err.to_string().into());
        }
        let s = engine.metrics().snapshot();
        println!(
            "pass {pass}: {} objects, {:.1} MB in {secs:.2} s: {:.1} MB/s, {:.0} objects/s; \
             in flight {}, GET p50 {} us, p99 {} us, ttfb p50 {} us, retries {:?}",
            reads.len(),
            total_bytes as f64 / 1e6,
            total_bytes as f64 / 1e6 / secs,
            reads.len() as f64 / secs,
            args.in_flight,
            s.get_latency_us_p50,
            s.get_latency_us_p99,
            s.ttfb_us_p50,
            s.retries,
        );
    }
    Ok(())
}
