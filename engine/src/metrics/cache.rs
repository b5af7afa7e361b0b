//! The disk data cache's figures in a scrape: read at scrape time from the
//! `CacheStats` of the loader's cache ([`watch_cache`]). A loader with no
//! data cache (a local source, `--cache off`) writes none of these families.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use super::figure::{single, Kind};
use crate::cache::CacheStats;

/// The data cache's counters, once a loader registered them.
static WATCHED: OnceLock<Arc<CacheStats>> = OnceLock::new();

/// Makes scrapes show `stats`. The first call wins: one loader per process.
pub fn watch_cache(stats: Arc<CacheStats>) {
    // A second cache in one process keeps the first one's figures.
    let _ = WATCHED.set(stats);
}

/// One family: a field of the watched `CacheStats`.
struct CacheFigure {
    name: &'static str,
    kind: Kind,
    help: &'static str,
    read: fn(&CacheStats) -> &AtomicU64,
}

/// The data cache's families, in exposition order. One line each to add.
#[rustfmt::skip]
const FIGURES: &[CacheFigure] = &[
    CacheFigure { name: "ringfeed_cache_hits_total", kind: Kind::Counter, help: "Reads served from the disk data cache.", read: |s| &s.hits },
    CacheFigure { name: "ringfeed_cache_misses_total", kind: Kind::Counter, help: "Reads of a cached remote source served from the remote store (not in the cache).", read: |s| &s.misses },
    CacheFigure { name: "ringfeed_cache_read_bytes_total", kind: Kind::Counter, help: "Bytes read from the disk data cache.", read: |s| &s.bytes_from_cache },
    CacheFigure { name: "ringfeed_cache_miss_bytes_total", kind: Kind::Counter, help: "Bytes of a cached remote source read from the remote store.", read: |s| &s.bytes_from_remote },
    CacheFigure { name: "ringfeed_cache_size_bytes", kind: Kind::Gauge, help: "Bytes the data cache directory holds, all loaders sharing it together.", read: |s| &s.used_bytes },
    CacheFigure { name: "ringfeed_cache_limit_bytes", kind: Kind::Gauge, help: "Most bytes this loader lets the data cache hold (--cache-size or its default).", read: |s| &s.limit_bytes },
    CacheFigure { name: "ringfeed_cache_full", kind: Kind::Gauge, help: "1 once the data cache refused an object for want of room (it keeps what it holds), else 0.", read: |s| &s.fill_complete },
    CacheFigure { name: "ringfeed_cache_entries_written_total", kind: Kind::Counter, help: "Entries this loader wrote to the data cache.", read: |s| &s.entries_written },
    CacheFigure { name: "ringfeed_cache_corrupt_total", kind: Kind::Counter, help: "Cache entries whose bytes failed their CRC32C, removed and refetched from remote.", read: |s| &s.corrupt_refetched },
    CacheFigure { name: "ringfeed_cache_writes_stopped", kind: Kind::Gauge, help: "1 once a write to the data cache failed (disk full, permissions) and caching stopped for the run, else 0.", read: |s| &s.writes_stopped },
];

/// Every family name [`CacheFigures`] can write, for the tests and the docs.
pub fn family_names() -> impl Iterator<Item = &'static str> {
    FIGURES.iter().map(|f| f.name)
}

/// The data cache's families, read at each scrape from the watched
/// `CacheStats` (none while no cache is watched).
#[derive(Debug)]
pub struct CacheFigures;

impl Collector for CacheFigures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let Some(stats) = WATCHED.get() else {
            return Ok(());
        };
        for f in FIGURES {
            let value = (f.read)(stats).load(Ordering::Relaxed);
            single(&mut encoder, f.name, f.help, f.kind, value)?;
        }
        Ok(())
    }
}
