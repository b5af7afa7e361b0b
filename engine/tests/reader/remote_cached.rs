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

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringfeed::cache::engine::{with_cache, CACHED_BACKEND};
use ringfeed::cache::entry::Identity;
use ringfeed::cache::{CacheConfig, CacheSize, CacheStats, DataCache};
use ringfeed::reader::{Completion, FileTable, ReadEngine, ReadError, ReadOp, ReaderConfig};
use ringfeed::remote::RemoteObject;

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

/// A cached engine just opened, with an empty cache.
struct Opened {
    engine: Box<dyn ReadEngine>,
    stats: Arc<CacheStats>,
    objects: Arc<Vec<RemoteObject>>,
    /// The dataset's directory of entries.
    dataset_dir: PathBuf,
    dir: tempfile::TempDir,
}

/// The remote engine over an in-memory copy of `files`, behind an empty
/// data cache in a new temporary directory.
fn open_cached(files: &FileTable, cfg: &ReaderConfig) -> Opened {
    let (remote, objects) = open_remote(files, cfg);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let stats = Arc::new(CacheStats::default());
    let cache_cfg = CacheConfig {
        root: dir.path().join("data"),
        size: CacheSize::Bytes(64 << 30),
        stats: Arc::clone(&stats),
    };
    let cache = DataCache::open(&cache_cfg, "memory:///t", Arc::clone(&objects))
        .expect("the data cache opens");
    let dataset_dir = cache.dir().to_path_buf();
    let engine = with_cache(remote, Some(cache), cfg).expect("the cached engine opens");
    assert_eq!(engine.backend_name(), CACHED_BACKEND);
    Opened {
        engine,
        stats,
        objects,
        dataset_dir,
        dir,
    }
}

/// Waits until the writer has published `n` entries.
fn wait_written(stats: &CacheStats, n: u64) {
    let started = Instant::now();
    while stats.entries_written.load(Ordering::Relaxed) < n {
        assert!(
            started.elapsed() < FILL_WAIT,
            "the writer published {} of {n} entries",
            stats.entries_written.load(Ordering::Relaxed),
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The remote engine over an in-memory copy of the files, behind a data
/// cache holding every other file.
pub struct CachedMemory;

impl EngineFactory for CachedMemory {
    const BACKEND: &'static str = CACHED_BACKEND;

    fn open(files: Arc<FileTable>, cfg: &ReaderConfig) -> Option<Box<dyn ReadEngine>> {
        let Opened {
            mut engine,
            stats,
            objects,
            dir,
            ..
        } = open_cached(&files, cfg);
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
        wait_written(&stats, ranges.len() as u64);
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

/// Reads files 0 and 1 whole, twice: the first pass fills the cache, then
/// `spoil` changes entry files, then the second pass, whose bytes are
/// checked against the files. Returns the stats once the engine (and its
/// writer) stopped, and whether each entry file is still there.
fn fill_spoil_and_read_again(spoil: impl Fn(&[PathBuf])) -> (Arc<CacheStats>, Vec<bool>) {
    use crate::support::{check_bytes, make_files, ops_into_with, run_all, table};
    let dir = tempfile::tempdir().unwrap();
    let sizes = [100_000u64, 70_000];
    let (paths, contents) = make_files(dir.path(), &sizes);
    let files = table(&paths, &sizes, false);
    let cfg = ReaderConfig {
        queue_depth: 4,
        ..ReaderConfig::default()
    };
    let mut opened = open_cached(&files, &cfg);
    let ranges: Vec<(u32, u64, u64)> = vec![(0, 0, sizes[0]), (1, 0, sizes[1])];
    let mut buf = vec![0u8; (sizes[0] + sizes[1]) as usize];
    let ops = ops_into_with(&mut buf, &ranges, false);
    let (results, _) = run_all(opened.engine.as_mut(), &ops);
    assert!(results.values().all(Result::is_ok), "{results:?}");
    wait_written(&opened.stats, 2);
    let entries: Vec<PathBuf> = opened
        .objects
        .iter()
        .map(|o| {
            opened
                .dataset_dir
                .join(Identity::of(&o.key, "", o.size).rel_path())
        })
        .collect();
    spoil(&entries);
    let mut again = vec![0u8; buf.len()];
    let ops = ops_into_with(&mut again, &ranges, false);
    let (results, _) = run_all(opened.engine.as_mut(), &ops);
    assert!(results.values().all(Result::is_ok), "{results:?}");
    check_bytes(&again, &ranges, &contents);
    drop(opened.engine);
    let kept = entries.iter().map(|e| e.exists()).collect();
    drop(opened.dir);
    (opened.stats, kept)
}

#[test]
fn a_flipped_byte_in_an_entry_is_a_corrupt_fault_that_never_reaches_the_reader() {
    let (stats, kept) = fill_spoil_and_read_again(|entries| {
        let mut bytes = std::fs::read(&entries[0]).unwrap();
        bytes[1234] ^= 0x40;
        std::fs::write(&entries[0], bytes).unwrap();
    });
    assert_eq!(stats.corrupt_refetched.load(Ordering::Relaxed), 1);
    // Pass 1: two misses; pass 2: one hit, one refetch.
    assert_eq!(stats.misses.load(Ordering::Relaxed), 3);
    assert_eq!(stats.hits.load(Ordering::Relaxed), 1);
    assert_eq!(kept, [false, true], "the corrupt entry is removed");
}

#[test]
fn a_failed_entry_read_is_an_io_fault_read_from_remote_and_not_counted_corrupt() {
    let (stats, kept) = fill_spoil_and_read_again(|entries| {
        // Shorter than the table's size: the local engine's read fails.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&entries[1])
            .unwrap();
        f.set_len(10).unwrap();
    });
    assert_eq!(stats.corrupt_refetched.load(Ordering::Relaxed), 0);
    assert_eq!(stats.misses.load(Ordering::Relaxed), 3);
    assert_eq!(stats.hits.load(Ordering::Relaxed), 1);
    // Not removed as corrupt: the object is only marked absent.
    assert_eq!(kept, [true, true], "no entry is removed for a failed read");
}

#[test]
fn a_read_of_an_entry_still_being_written_is_served_from_the_queued_body_not_fetched_again() {
    use crate::support::{check_bytes, make_files, ops_into_with, run_all, table};
    let dir = tempfile::tempdir().unwrap();
    let sizes = vec![100_000u64; 200];
    let (paths, contents) = make_files(dir.path(), &sizes);
    let files = table(&paths, &sizes, false);
    let cfg = ReaderConfig {
        queue_depth: 32,
        ..ReaderConfig::default()
    };
    let mut opened = open_cached(&files, &cfg);
    let ranges: Vec<(u32, u64, u64)> = (0..200u32).map(|i| (i, 0, 100_000)).collect();
    let mut first = vec![0u8; 200 * 100_000];
    let ops = ops_into_with(&mut first, &ranges, false);
    let (results, _) = run_all(opened.engine.as_mut(), &ops);
    assert!(results.values().all(Result::is_ok), "{results:?}");
    // At once, while the writer is still behind: each object is written,
    // being written (its body queued), or was given up (written again).
    let mut again = vec![0u8; first.len()];
    let ops = ops_into_with(&mut again, &ranges, false);
    let (results, _) = run_all(opened.engine.as_mut(), &ops);
    assert!(results.values().all(Result::is_ok), "{results:?}");
    check_bytes(&again, &ranges, &contents);
    let written = {
        drop(opened.engine);
        opened.stats.entries_written.load(Ordering::Relaxed)
    };
    assert_eq!(written, 200, "every object was written once");
    assert_eq!(
        opened.stats.misses.load(Ordering::Relaxed),
        200,
        "no object fetched twice"
    );
    assert_eq!(opened.stats.hits.load(Ordering::Relaxed), 200);
}
