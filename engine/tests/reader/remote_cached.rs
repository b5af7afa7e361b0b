//! The cached engine (`cache::CachedEngine`: the remote engine over the
//! in-memory store, with a data cache in a temporary directory in front)
//! in the conformance suite.
//!
//! So that both tiers are checked, the factory fills the cache first: it
//! reads every other file whole through the engine and waits until the
//! writer has published those entries. The suite then reads a mix of hits
//! (served by the local engine over the entry files, checked against
//! their CRC32C) and misses (the remote engine, filling the cache as it
//! goes). What the in-memory store cannot follow (files changed on disk
//! after the engine opened) is skipped as for the remote line.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringfeed::cache::engine::{with_cache, CACHED_BACKEND};
use ringfeed::cache::{CacheConfig, CacheSize, CacheStats, DataCache};
use ringfeed::reader::{Completion, FileTable, ReadEngine, ReadError, ReadOp, ReaderConfig};

use crate::conformance::EngineFactory;
use crate::remote_memory::{open_remote, RemoteMemory};

/// Longest the factory waits for the writer to publish the entries it fills.
const FILL_WAIT: Duration = Duration::from_secs(30);

/// The cached engine, and the directory its cache lives in (removed after
/// the engine is dropped).
struct WithDir {
    engine: Box<dyn ReadEngine>,
    _dir: tempfile::TempDir,
}

impl ReadEngine for WithDir {
    fn backend_name(&self) -> &'static str {
        self.engine.backend_name()
    }
    fn in_flight(&self) -> usize {
        self.engine.in_flight()
    }
    fn max_in_flight(&self) -> usize {
        self.engine.max_in_flight()
    }
    unsafe fn submit(&mut self, ops: &[ReadOp]) -> Result<(), ReadError> {
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.engine.submit(ops) }
    }
    fn reap(
        &mut self,
        out: &mut Vec<Completion>,
        min_complete: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, ReadError> {
        self.engine.reap(out, min_complete, timeout)
    }
}

/// The remote engine over an in-memory copy of the files, behind a data
/// cache holding every other file.
pub struct CachedMemory;

impl EngineFactory for CachedMemory {
    const BACKEND: &'static str = CACHED_BACKEND;

    fn open(files: Arc<FileTable>, cfg: &ReaderConfig) -> Option<Box<dyn ReadEngine>> {
        let (remote, objects) = open_remote(&files, cfg);
        let dir = tempfile::tempdir().expect("a temporary directory");
        let stats = Arc::new(CacheStats::default());
        let cache_cfg = CacheConfig {
            root: dir.path().join("data"),
            size: CacheSize::Bytes(64 << 30),
            stats: Arc::clone(&stats),
        };
        let cache = DataCache::open(&cache_cfg, "memory:///t", Arc::clone(&objects))
            .expect("the data cache opens");
        let mut engine = with_cache(remote, Some(cache), cfg).expect("the cached engine opens");
        assert_eq!(engine.backend_name(), CACHED_BACKEND);
        // Fill: every other file that exists and is not empty, read whole.
        let ranges: Vec<(u32, u64, u64)> = (0..files.len() as u32)
            .step_by(2)
            .filter(|&i| files.path(i).is_some_and(|p| p.exists()))
            .map(|i| (i, 0, objects[i as usize].size))
            .filter(|r| r.2 > 0)
            .collect();
        let total: u64 = ranges.iter().map(|r| r.2).sum();
        let mut buf = vec![0u8; total as usize];
        let ops = crate::support::ops_into_with(&mut buf, &ranges, false);
        let (results, _) = crate::support::run_all(engine.as_mut(), &ops);
        assert!(results.values().all(Result::is_ok), "{results:?}");
        let started = Instant::now();
        while stats.entries_written.load(Ordering::Relaxed) < ranges.len() as u64 {
            assert!(
                started.elapsed() < FILL_WAIT,
                "the writer published {} of {} entries",
                stats.entries_written.load(Ordering::Relaxed),
                ranges.len()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        // The filled files now come from the cache, byte exact.
        let hits = stats.hits.load(Ordering::Relaxed);
        let mut again = vec![0u8; total as usize];
        let ops = crate::support::ops_into_with(&mut again, &ranges, false);
        let (results, _) = crate::support::run_all(engine.as_mut(), &ops);
        assert!(results.values().all(Result::is_ok), "{results:?}");
        assert_eq!(again, buf, "the cached files' bytes");
        assert_eq!(
            stats.hits.load(Ordering::Relaxed) - hits,
            ranges.len() as u64,
            "every filled file is a hit"
        );
        Some(Box::new(WithDir { engine, _dir: dir }))
    }

    fn skip(group: &str, behaviour: &str) -> Option<&'static str> {
        RemoteMemory::skip(group, behaviour)
    }
}
