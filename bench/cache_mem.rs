//! Memory of the data cache per object (issue 22, point 4): opens a
//! `DataCache` over N synthetic remote objects (all cached, so the state
//! array, the CRCs and the entry file table are all in use) and prints the
//! process's resident memory before and after.
//!
//!     cargo run --release -p ringfeed --example cache_mem -- [N] [DIR]
//!
//! N defaults to 1,000,000; DIR (default: a fresh temp dir) gets the cache.
//! The objects' own table (keys, sizes, ETags) belongs to the remote source
//! and is made before the first figure.

use std::sync::Arc;

use ringfeed::cache::entry::{encode_footer, Identity};
use ringfeed::cache::{CacheConfig, CacheSize, CacheStats, DataCache};
use ringfeed::remote::RemoteObject;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let tmp;
    let root = match args.next() {
        Some(d) => std::path::PathBuf::from(d),
        None => {
            tmp = std::env::temp_dir().join(format!("rf-cache-mem-{}", std::process::id()));
            tmp.clone()
        }
    };
    let objects: Vec<RemoteObject> = (0..n)
        .map(|i| RemoteObject {
            key: format!("shard{:03}/sample{i:09}.bin", i % 1000),
            size: 16,
            etag: Some(format!("\"{i:032x}\"")),
        })
        .collect();
    let objects = Arc::new(objects);
    let source = "s3://bench/cache-mem/";
    let dir = ringfeed::cache::dataset_dir(&root.join("data"), source);
    // Every object cached: tiny entries, written directly in the format.
    let t = std::time::Instant::now();
    for o in objects.iter() {
        let id = Identity::of(&o.key, o.etag.as_deref().unwrap_or(""), o.size);
        let path = dir.join(id.rel_path());
        if !path.exists() {
            std::fs::create_dir_all(path.parent().ok_or("no parent")?)?;
            let mut bytes = vec![7u8; o.size as usize];
            bytes.extend_from_slice(&encode_footer(
                &id,
                crc32c::crc32c(&bytes[..o.size as usize]),
            ));
            std::fs::write(&path, bytes)?;
        }
    }
    eprintln!("{n} entries on disk in {:.1} s", t.elapsed().as_secs_f64());
    let before = rss_kib();
    let cfg = CacheConfig {
        root: root.join("data"),
        size: CacheSize::Auto,
        stats: Arc::new(CacheStats::default()),
    };
    let t = std::time::Instant::now();
    let cache = DataCache::open(&cfg, source, Arc::clone(&objects))?;
    // Wait for the background check to find every entry.
    while cache.cached_count() < n && t.elapsed().as_secs() < 600 {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let after = rss_kib();
    println!(
        "{n} objects, {} found cached in {:.1} s: RSS {} KiB before the cache, {} KiB after: {:.1} bytes per object",
        cache.cached_count(),
        t.elapsed().as_secs_f64(),
        before,
        after,
        (after.saturating_sub(before) * 1024) as f64 / n as f64
    );
    Ok(())
}
