//! The remote engine (`RemoteReadEngine` over `remote::FetchEngine`) in the
//! conformance suite, over object_store's in-memory store.
//!
//! The factory uploads the table's files, as they are when the engine is
//! opened, to an in-memory store, one object per file (key: its index), and
//! opens the remote engine over them with the table's recorded sizes. The
//! behaviours of the `changes` group change files on disk after that (or
//! expect local error variants: `Vanished`, `ChangedSize`, `Grew`,
//! `SizeAtOpen`); the store never sees those changes, so they are skipped
//! here, saying why. The remote engine's own checks of changed objects
//! (ETag, size, 404) are in engine/tests/remote_fetch.rs.

use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use ringfeed::reader::{FileTable, ReadEngine, ReaderConfig, RemoteReadEngine, REMOTE_BACKEND};
use ringfeed::remote::{FetchConfig, RemoteObject, RemoteRuntime, StoreHandle};

use crate::conformance::EngineFactory;

/// The remote engine over an in-memory copy of the files.
pub struct RemoteMemory;

impl EngineFactory for RemoteMemory {
    const BACKEND: &'static str = REMOTE_BACKEND;

    fn open(files: Arc<FileTable>, cfg: &ReaderConfig) -> Option<Box<dyn ReadEngine>> {
        Some(Box::new(open_remote(&files, cfg).0))
    }

    fn skip(group: &str, behaviour: &str) -> Option<&'static str> {
        match (group, behaviour) {
            (
                "bytes",
                "reads_files_under_a_root_byte_exact_and_errors_name_the_full_path"
                | "read_longer_than_one_chunk_is_split",
            ) => Some(
                "its second half removes or appends to a file after the engine opened, and the \
                 in-memory copy does not change with it",
            ),
            ("changes", _) => Some(
                "files are copied into the in-memory store when the engine opens, so changes made \
                 on disk afterwards are not seen (remote_fetch.rs tests changed objects)",
            ),
            _ => None,
        }
    }
}

/// The remote engine over an in-memory copy of `files` (key: the index,
/// zero-padded), and the objects it reads, as a manifest lists them.
pub fn open_remote(
    files: &FileTable,
    cfg: &ReaderConfig,
) -> (RemoteReadEngine, Arc<Vec<RemoteObject>>) {
    let runtime = Arc::new(RemoteRuntime::new(2).expect("a runtime of 2 threads"));
    let mem: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let mut objects = Vec::with_capacity(files.len());
    for i in 0..files.len() as u32 {
        let key = format!("{i:08}");
        // A file gone already is an object never uploaded: its reads 404.
        if let Some(content) = files.path(i).and_then(|p| std::fs::read(p).ok()) {
            runtime
                .block_on(mem.put(&Path::from(format!("t/{key}")), PutPayload::from(content)))
                .expect("a put into the in-memory store");
        }
        objects.push(RemoteObject {
            key,
            size: files.size_bytes(i).unwrap_or(0),
            etag: None,
        });
    }
    let objects = Arc::new(objects);
    let store = StoreHandle::from_store(mem, "t", "memory:///t");
    let fetch = FetchConfig {
        window_max: (cfg.queue_depth as usize).max(8),
        window_initial: (cfg.queue_depth as usize).max(8),
        ..FetchConfig::default()
    };
    let engine = RemoteReadEngine::start(
        runtime,
        store,
        Arc::clone(&objects),
        fetch,
        cfg.queue_depth as usize,
    )
    .expect("the remote engine starts");
    (engine, objects)
}

/// The chunk layer (`reader::chunked`) in front of the remote engine over the
/// in-memory store: small reads served out of 64 KiB chunks, with a budget
/// of four chunks so that chunks are dropped and fetched again mid-suite.
pub struct ChunkedMemory;

impl EngineFactory for ChunkedMemory {
    const BACKEND: &'static str = REMOTE_BACKEND;

    fn open(files: Arc<FileTable>, cfg: &ReaderConfig) -> Option<Box<dyn ReadEngine>> {
        let sizes = (0..files.len() as u32)
            .map(|i| files.size_bytes(i).unwrap_or(0))
            .collect();
        let inner = RemoteMemory::open(files, cfg)?;
        let chunk = ringfeed::reader::chunked::ChunkConfig {
            geometry: ringfeed::reader::chunked::ChunkGeometry::Aligned {
                chunk_bytes: 64 << 10,
            },
            small_read_max: 16 << 10,
            budget_bytes: 256 << 10,
        };
        Some(Box::new(ringfeed::reader::chunked::ChunkedEngine::new(
            inner, sizes, chunk,
        )))
    }

    fn skip(group: &str, behaviour: &str) -> Option<&'static str> {
        RemoteMemory::skip(group, behaviour)
    }
}

/// Counts the reads a chunk layer hands to the engine under it.
struct CountingInner {
    inner: Box<dyn ReadEngine>,
    reads: Arc<std::sync::atomic::AtomicUsize>,
    bytes: Arc<std::sync::atomic::AtomicU64>,
}

impl ReadEngine for CountingInner {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
    fn max_in_flight(&self) -> usize {
        self.inner.max_in_flight()
    }
    unsafe fn submit(
        &mut self,
        ops: &[ringfeed::reader::ReadOp],
    ) -> Result<(), ringfeed::reader::ReadError> {
        use std::sync::atomic::Ordering::Relaxed;
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.inner.submit(ops) }?;
        self.reads.fetch_add(ops.len(), Relaxed);
        self.bytes
            .fetch_add(ops.iter().map(|op| op.len_bytes).sum(), Relaxed);
        Ok(())
    }
    fn reap(
        &mut self,
        out: &mut Vec<ringfeed::reader::Completion>,
        min_complete: usize,
        timeout: Option<std::time::Duration>,
    ) -> Result<usize, ringfeed::reader::ReadError> {
        self.inner.reap(out, min_complete, timeout)
    }
}

#[test]
fn small_reads_of_neighbouring_ranges_cost_one_remote_read_per_chunk_and_land_byte_exact() {
    use crate::support::{check_bytes, make_files, ops_into, run_all, table};
    use std::sync::atomic::Ordering::Relaxed;
    let dir = tempfile::tempdir().unwrap();
    // One "shard" of 1 MiB + 100 bytes: 17 chunks of 64 KiB, the last short.
    let size = (1 << 20) + 100;
    let (paths, contents) = make_files(dir.path(), &[size]);
    let files = table(&paths, &[size], false);
    let cfg = ReaderConfig {
        queue_depth: 8,
        ..ReaderConfig::default()
    };
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let bytes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let inner = CountingInner {
        inner: RemoteMemory::open(Arc::clone(&files), &cfg).unwrap(),
        reads: Arc::clone(&reads),
        bytes: Arc::clone(&bytes),
    };
    let chunk = ringfeed::reader::chunked::ChunkConfig {
        geometry: ringfeed::reader::chunked::ChunkGeometry::Aligned {
            chunk_bytes: 64 << 10,
        },
        small_read_max: 8 << 10,
        // Room for every chunk: each is fetched once.
        budget_bytes: 4 << 20,
    };
    let mut engine =
        ringfeed::reader::chunked::ChunkedEngine::new(Box::new(inner), vec![size], chunk);
    // 4 KiB samples back to back, in a shuffled order (as a window of
    // blocks gives them), then one 20 KiB read (too large: passed through)
    // and one 4 KiB read across a chunk boundary (passed through too).
    let mut ranges: Vec<(u32, u64, u64)> = (0..256u64).map(|i| (0, i * 4096, 4096)).collect();
    let mut state = 7u64;
    for i in (1..ranges.len()).rev() {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ranges.swap(i, (state >> 33) as usize % (i + 1));
    }
    ranges.push((0, 100_000, 20_000));
    ranges.push((0, (64 << 10) - 2048, 4096));
    let total: u64 = ranges.iter().map(|r| r.2).sum();
    let mut buf = vec![0u8; total as usize];
    let ops = ops_into(&mut buf, &ranges);
    let (results, _) = run_all(&mut engine, &ops);
    assert!(results.values().all(Result::is_ok), "{results:?}");
    check_bytes(&buf, &ranges, &contents);
    // 16 chunks cover the 256 samples; plus the two passed-through reads.
    assert_eq!(reads.load(Relaxed), 16 + 2);
    assert_eq!(bytes.load(Relaxed), (16 << 16) + 20_000 + 4096);
}

#[test]
fn a_chunk_layer_over_budget_drops_old_chunks_and_fetches_them_again_byte_exact() {
    use crate::support::{check_bytes, make_files, ops_into, run_all, table};
    use std::sync::atomic::Ordering::Relaxed;
    let dir = tempfile::tempdir().unwrap();
    let size = 512 << 10;
    let (paths, contents) = make_files(dir.path(), &[size]);
    let files = table(&paths, &[size], false);
    let cfg = ReaderConfig {
        queue_depth: 4,
        ..ReaderConfig::default()
    };
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let inner = CountingInner {
        inner: RemoteMemory::open(Arc::clone(&files), &cfg).unwrap(),
        reads: Arc::clone(&reads),
        bytes: Arc::new(std::sync::atomic::AtomicU64::new(0)),
    };
    let chunk = ringfeed::reader::chunked::ChunkConfig {
        geometry: ringfeed::reader::chunked::ChunkGeometry::Aligned {
            chunk_bytes: 64 << 10,
        },
        small_read_max: 4096,
        budget_bytes: 128 << 10,
    };
    let mut engine =
        ringfeed::reader::chunked::ChunkedEngine::new(Box::new(inner), vec![size], chunk);
    // Two passes over 8 chunks, a 4 KiB read in each, with room for two.
    let ranges: Vec<(u32, u64, u64)> = (0..16u64)
        .map(|i| (0, (i % 8) * (64 << 10), 4096))
        .collect();
    let mut buf = vec![0u8; 16 * 4096];
    let ops = ops_into(&mut buf, &ranges);
    for op in ops.chunks(2) {
        let (results, _) = run_all(&mut engine, op);
        assert!(results.values().all(Result::is_ok));
    }
    check_bytes(&buf, &ranges, &contents);
    assert_eq!(
        reads.load(Relaxed),
        16,
        "every chunk fetched again in the second pass"
    );
}

#[test]
fn a_chunk_fetched_after_one_was_dropped_lands_in_its_buffer_byte_exact() {
    use crate::support::{check_bytes, make_files, ops_into, run_all, table};
    use std::sync::atomic::Ordering::Relaxed;
    let dir = tempfile::tempdir().unwrap();
    // 32 chunks of 64 KiB, with room for 8 (spares: half of it, 4 buffers).
    let size = 32 << 16;
    let (paths, contents) = make_files(dir.path(), &[size]);
    let files = table(&paths, &[size], false);
    let cfg = ReaderConfig {
        queue_depth: 4,
        ..ReaderConfig::default()
    };
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let inner = CountingInner {
        inner: RemoteMemory::open(Arc::clone(&files), &cfg).unwrap(),
        reads: Arc::clone(&reads),
        bytes: Arc::new(std::sync::atomic::AtomicU64::new(0)),
    };
    let chunk = ringfeed::reader::chunked::ChunkConfig {
        geometry: ringfeed::reader::chunked::ChunkGeometry::Aligned {
            chunk_bytes: 64 << 10,
        },
        small_read_max: 4096,
        budget_bytes: 512 << 10,
    };
    let mut engine =
        ringfeed::reader::chunked::ChunkedEngine::new(Box::new(inner), vec![size], chunk);
    // Two reads in each chunk, at its start and at its end, two chunks at
    // a time: the later chunks reuse the buffers of the first ones.
    let ranges: Vec<(u32, u64, u64)> = (0..64u64)
        .map(|i| (0, (i / 2) * (64 << 10) + (i % 2) * (60 << 10), 4096))
        .collect();
    let mut buf = vec![0u8; 64 * 4096];
    let ops = ops_into(&mut buf, &ranges);
    for op in ops.chunks(4) {
        let (results, _) = run_all(&mut engine, op);
        assert!(results.values().all(Result::is_ok));
    }
    check_bytes(&buf, &ranges, &contents);
    assert_eq!(reads.load(Relaxed), 32, "each chunk fetched once");
    let allocated = engine.buffers_allocated();
    assert!(
        allocated <= 8 + 2 + 2,
        "{allocated} chunk buffers allocated for 32 chunks with room for 8 and 4 spares"
    );
}

#[test]
fn a_chunk_layer_takes_a_whole_block_of_small_reads_per_read_slot_of_its_inner_engine() {
    use crate::support::{check_bytes, make_files, ops_into, run_all, table};
    use std::sync::atomic::Ordering::Relaxed;
    let dir = tempfile::tempdir().unwrap();
    let size = 256 << 10;
    let (paths, contents) = make_files(dir.path(), &[size]);
    let files = table(&paths, &[size], false);
    // One read slot below: at 8 small reads per slot (the old cap) a block
    // of 64 could not even be submitted, and the loader kept 2,048 small
    // reads (32 batches of 64) in flight whatever its slots.
    let cfg = ReaderConfig {
        queue_depth: 1,
        ..ReaderConfig::default()
    };
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let inner = CountingInner {
        inner: RemoteMemory::open(Arc::clone(&files), &cfg).unwrap(),
        reads: Arc::clone(&reads),
        bytes: Arc::new(std::sync::atomic::AtomicU64::new(0)),
    };
    let chunk = ringfeed::reader::chunked::ChunkConfig {
        geometry: ringfeed::reader::chunked::ChunkGeometry::Aligned {
            chunk_bytes: 256 << 10,
        },
        small_read_max: 4096,
        budget_bytes: 1 << 20,
    };
    let mut engine =
        ringfeed::reader::chunked::ChunkedEngine::new(Box::new(inner), vec![size], chunk);
    assert!(engine.max_in_flight() >= 64, "{}", engine.max_in_flight());
    // 64 samples of 4 KiB, one chunk, submitted at once.
    let ranges: Vec<(u32, u64, u64)> = (0..64u64).map(|i| (0, (63 - i) * 4096, 4096)).collect();
    let mut buf = vec![0u8; 64 * 4096];
    let ops = ops_into(&mut buf, &ranges);
    let (results, peak) = run_all(&mut engine, &ops);
    assert_eq!(peak, 64, "the whole block in flight at once");
    assert!(results.values().all(Result::is_ok), "{results:?}");
    check_bytes(&buf, &ranges, &contents);
    assert_eq!(reads.load(Relaxed), 1, "one GET for the block");
}
