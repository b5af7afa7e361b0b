//! The disk data cache's figures in a scrape: read at scrape time from the
//! `CacheStats` of the loader's cache ([`watch_cache`]). A loader with no
//! data cache (a local source, `--cache off`) writes none of these families.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::registry::Collect;
use super::text::{Exposition, Kind};
use crate::cache::CacheStats;

/// The data cache's counters, once a loader registered them.
static WATCHED: OnceLock<Arc<CacheStats>> = OnceLock::new();

/// Makes scrapes show `stats`. The first call wins: one loader per process.
pub fn watch_cache(stats: Arc<CacheStats>) {
    // A second cache in one process keeps the first one's figures.
    let _ = WATCHED.set(stats);
}

/// One family read from the watched `CacheStats`.
pub struct CacheFigure {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    read: fn(&CacheStats) -> &AtomicU64,
}

impl CacheFigure {
    /// A gauge of one field.
    pub const fn gauge(
        name: &'static str,
        help: &'static str,
        read: fn(&CacheStats) -> &AtomicU64,
    ) -> CacheFigure {
        CacheFigure {
            name,
            help,
            kind: Kind::Gauge,
            read,
        }
    }

    /// A counter (its name ends in `_total`) of one field.
    pub const fn counter(
        name: &'static str,
        help: &'static str,
        read: fn(&CacheStats) -> &AtomicU64,
    ) -> CacheFigure {
        CacheFigure {
            name,
            help,
            kind: Kind::Counter,
            read,
        }
    }
}

impl Collect for CacheFigure {
    fn name(&self) -> &'static str {
        self.name
    }

    fn collect(&self, out: &mut Exposition) {
        let Some(stats) = WATCHED.get() else {
            return;
        };
        out.family(self.name, self.kind, self.help);
        let value = (self.read)(stats).load(Ordering::Relaxed);
        out.sample(self.name, &[], value as f64);
    }
}
