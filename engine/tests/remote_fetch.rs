//! The remote fetch engine against object_store's in-memory store and a
//! small local HTTP server with faults injected (remote_common).

mod remote_common;

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use remote_common::{bytes_for, TestServer};
use ringfeed::remote::{
    list, list_parallel, list_webdav, read_keys_file, FetchCompletion, FetchConfig, FetchEngine,
    FetchRead, RemoteError, RemoteObject, RemoteRuntime, RetryCause, StoreHandle,
};

fn runtime() -> Arc<RemoteRuntime> {
    Arc::new(RemoteRuntime::new(2).unwrap())
}

fn quick_config() -> FetchConfig {
    FetchConfig {
        part_bytes: 64 << 10,
        backoff_base_ms: 5,
        backoff_max_ms: 50,
        stall_timeout_ms: 400,
        ..FetchConfig::default()
    }
}

/// The buffer, where each read landed in it, and the results by tag.
type Fetched = (Vec<u8>, Vec<usize>, BTreeMap<u64, Result<(), RemoteError>>);

/// Reads every `(object, range)` into one buffer, all submitted at once;
/// returns the buffer, where each range landed, and the completions by tag.
fn fetch_all(engine: &mut FetchEngine, reads: &[(u32, Range<u64>)]) -> Fetched {
    let total: u64 = reads.iter().map(|(_, r)| r.end - r.start).sum();
    let mut buf = vec![0u8; total as usize];
    let mut at = Vec::new();
    let mut ops = Vec::new();
    let mut off = 0usize;
    for (i, (object, range)) in reads.iter().enumerate() {
        at.push(off);
        ops.push(FetchRead {
            object: *object,
            range: range.clone(),
            // SAFETY: `off + len <= total`, inside `buf`.
            dest: unsafe { buf.as_mut_ptr().add(off) },
            tag: i as u64,
        });
        off += (range.end - range.start) as usize;
    }
    // SAFETY: each dest is a disjoint range of `buf`, which outlives the reads
    // (every completion is reaped below before `buf` is touched).
    unsafe { engine.submit(&ops).unwrap() };
    let mut done: Vec<FetchCompletion> = Vec::new();
    while engine.outstanding() > 0 {
        engine.reap(&mut done, 1, Duration::from_secs(60));
    }
    let results = done.into_iter().map(|c| (c.tag, c.result)).collect();
    (buf, at, results)
}

async fn put_all(store: &Arc<dyn ObjectStore>, prefix: &str, objects: &BTreeMap<String, Vec<u8>>) {
    for (k, v) in objects {
        store
            .put(
                &Path::from(format!("{prefix}/{k}")),
                PutPayload::from(v.clone()),
            )
            .await
            .unwrap();
    }
}

fn dataset(n: usize) -> BTreeMap<String, Vec<u8>> {
    (0..n)
        .map(|i| {
            let len = match i % 5 {
                0 => 0,
                1 => 1,
                2 => 4096,
                3 => 100_000,
                _ => 300_000, // several 64 KiB parts
            };
            (
                format!("dir{}/sample-{i:05}.bin", i % 3),
                bytes_for(i as u64, len),
            )
        })
        .collect()
}

#[test]
fn many_reads_in_flight_from_memory_store_land_byte_exact() {
    let rt = runtime();
    let mem: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let data = dataset(300);
    rt.block_on(put_all(&mem, "train", &data));
    // Noise outside the prefix, and a directory marker-like empty object.
    rt.block_on(mem.put(&Path::from("trainx/other"), PutPayload::from_static(b"no")))
        .unwrap();
    let store = StoreHandle::from_store(Arc::clone(&mem), "train", "memory:///train");
    let objects = rt.block_on(list(&store, None)).unwrap();
    let keys: Vec<&str> = objects.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(keys, data.keys().map(String::as_str).collect::<Vec<_>>());
    let objects = Arc::new(objects);
    let mut engine =
        FetchEngine::start(Arc::clone(&rt), store, Arc::clone(&objects), quick_config()).unwrap();
    let mut reads: Vec<(u32, Range<u64>)> = (0..objects.len() as u32)
        .map(|i| (i, 0..objects[i as usize].size))
        .collect();
    // Ranged reads: the middle of each large object, and a one-byte tail.
    for (i, o) in objects.iter().enumerate() {
        if o.size > 10 {
            reads.push((i as u32, o.size / 3..o.size - 1));
            reads.push((i as u32, o.size - 1..o.size));
        }
    }
    let (buf, at, results) = fetch_all(&mut engine, &reads);
    assert_eq!(results.len(), reads.len());
    for (tag, (object, range)) in reads.iter().enumerate() {
        assert!(
            results[&(tag as u64)].is_ok(),
            "{:?}",
            results[&(tag as u64)]
        );
        let want = &data[&objects[*object as usize].key][range.start as usize..range.end as usize];
        assert_eq!(
            &buf[at[tag]..at[tag] + want.len()],
            want,
            "read {tag} of {:?}",
            objects[*object as usize].key
        );
    }
    let m = engine.metrics();
    assert_eq!(m.retries_total(), 0);
    assert_eq!(m.gets_in_flight.load(Ordering::Relaxed), 0);
    assert!(m.get_latency.count() > 300);
}

#[test]
fn parallel_listing_gives_the_same_objects_as_one_listing() {
    let rt = runtime();
    let mem: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let data: BTreeMap<String, Vec<u8>> = (0..5000)
        .map(|i| (format!("shard-{i:06}.bin"), vec![i as u8; i % 7]))
        .collect();
    rt.block_on(put_all(&mem, "p", &data));
    let store = StoreHandle::from_store(Arc::clone(&mem), "p", "memory:///p");
    let one = rt.block_on(list(&store, None)).unwrap();
    let ranges = std::sync::atomic::AtomicU64::new(0);
    let progress = |p: ringfeed::remote::ListProgress| {
        ranges.fetch_max(p.ranges_done, Ordering::Relaxed);
    };
    let paced = StoreHandle::from_store(paced_listing(mem), "p", "memory:///p");
    let many = rt
        .block_on(list_parallel(&paced, 8, Some(&progress)))
        .unwrap();
    assert_eq!(one.len(), 5000);
    assert_eq!(one, many);
    assert!(
        ranges.load(Ordering::Relaxed) > 1,
        "the key space was never split"
    );
}

/// `mem` whose listings take about a millisecond an entry, as a real
/// store's pages take their round trips: an in-memory listing never waits,
/// so on a loaded machine one worker could list every range before the
/// others were scheduled (and rightly take them: `reaches`), and the test
/// of the splits would depend on the scheduler.
fn paced_listing(mem: Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore> {
    let config = object_store::throttle::ThrottleConfig {
        wait_list_per_entry: Duration::from_micros(100),
        ..Default::default()
    };
    Arc::new(object_store::throttle::ThrottledStore::new(mem, config))
}

/// Decimal counters, hex hashes, two levels of directories, and keys
/// whose digits cross a prefix of letters: the parallel listing's cuts
/// follow each shape (reading keys in the alphabet they use), and whatever
/// the cuts, the listing is the sequential one's.
#[test]
fn parallel_listing_is_exact_and_splits_over_every_key_shape() {
    let rt = runtime();
    type KeyOf = fn(usize) -> String;
    let shapes: [(&str, KeyOf); 4] = [
        ("decimal", |i| format!("obj-{i:06}")),
        ("hex", |i| {
            format!("{:016x}", (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        }),
        ("dirs", |i| format!("d{:04}/f{i:06}.bin", i / 1000)),
        ("letters", |i| format!("{}{i}", ["a", "b", "zz"][i % 3])),
    ];
    for (shape, key) in shapes {
        let mem: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let data: BTreeMap<String, Vec<u8>> = (0..6000).map(|i| (key(i), vec![1; i % 3])).collect();
        rt.block_on(put_all(&mem, "p", &data));
        let store = StoreHandle::from_store(Arc::clone(&mem), "p", "memory:///p");
        let one = rt.block_on(list(&store, None)).unwrap();
        let ranges = std::sync::atomic::AtomicU64::new(0);
        let progress = |p: ringfeed::remote::ListProgress| {
            ranges.fetch_max(p.ranges_done, Ordering::Relaxed);
        };
        let paced = StoreHandle::from_store(paced_listing(mem), "p", "memory:///p");
        let many = rt
            .block_on(list_parallel(&paced, 16, Some(&progress)))
            .unwrap();
        assert_eq!(one.len(), 6000, "{shape}");
        assert_eq!(one, many, "{shape}");
        // Ranges are whole four-page units (4,000 keys, `RANGE_PAGES`): 6,000
        // keys split at least once.
        if shape != "letters" {
            assert!(
                ranges.load(Ordering::Relaxed) >= 2,
                "{shape}: only {} ranges",
                ranges.load(Ordering::Relaxed)
            );
        }
    }
}

#[test]
fn an_object_changed_after_listing_is_an_error_naming_its_key() {
    let rt = runtime();
    let mem: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let data = dataset(10);
    rt.block_on(put_all(&mem, "d", &data));
    let store = StoreHandle::from_store(Arc::clone(&mem), "d", "memory:///d");
    let objects = Arc::new(rt.block_on(list(&store, None)).unwrap());
    let (same_size, other_size) = (3usize, 4usize);
    for (i, content) in [
        (same_size, vec![7u8; objects[same_size].size as usize]),
        (other_size, vec![1u8; 5]),
    ] {
        let path = Path::from(format!("d/{}", objects[i].key));
        rt.block_on(mem.put(&path, PutPayload::from(content)))
            .unwrap();
    }
    let mut engine =
        FetchEngine::start(Arc::clone(&rt), store, Arc::clone(&objects), quick_config()).unwrap();
    let reads = [
        (same_size as u32, 0..objects[same_size].size),
        (other_size as u32, 0..objects[other_size].size),
    ];
    let (_, _, results) = fetch_all(&mut engine, &reads);
    for (tag, i) in [(0u64, same_size), (1, other_size)] {
        let err = results[&tag].as_ref().unwrap_err();
        assert!(matches!(err, RemoteError::Changed { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains(&objects[i].key) && text.contains("changed since it was listed"),
            "{text}"
        );
    }
}

#[test]
fn a_deleted_object_is_a_404_error_naming_its_key_and_the_fix() {
    let rt = runtime();
    let mem: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    rt.block_on(put_all(&mem, "d", &dataset(4)));
    let store = StoreHandle::from_store(Arc::clone(&mem), "d", "memory:///d");
    let objects = Arc::new(rt.block_on(list(&store, None)).unwrap());
    rt.block_on(mem.delete(&Path::from(format!("d/{}", objects[2].key))))
        .unwrap();
    let mut engine =
        FetchEngine::start(Arc::clone(&rt), store, Arc::clone(&objects), quick_config()).unwrap();
    let (_, _, results) = fetch_all(
        &mut engine,
        &[(2, 0..objects[2].size), (3, 0..objects[3].size)],
    );
    let text = results[&0].as_ref().unwrap_err().to_string();
    assert!(
        text.contains(&objects[2].key) && text.contains("HTTP 404") && text.contains("re-list"),
        "{text}"
    );
    assert!(results[&1].is_ok());
}

#[test]
fn submit_refuses_reads_outside_an_object_or_past_the_queue_limit() {
    let rt = runtime();
    let mem: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    rt.block_on(put_all(&mem, "d", &dataset(4)));
    let store = StoreHandle::from_store(mem, "d", "memory:///d");
    let objects = Arc::new(rt.block_on(list(&store, None)).unwrap());
    let cfg = FetchConfig {
        queued_reads_max: 2,
        ..quick_config()
    };
    let mut engine = FetchEngine::start(Arc::clone(&rt), store, Arc::clone(&objects), cfg).unwrap();
    let mut buf = vec![0u8; 8192];
    let dest = buf.as_mut_ptr();
    let read = |object, range| FetchRead {
        object,
        range,
        dest,
        tag: 0,
    };
    // SAFETY: refused reads start nothing.
    let past_end = unsafe { engine.submit(&[read(2, 0..4097)]) };
    assert!(
        matches!(past_end, Err(RemoteError::InvalidRead { .. })),
        "{past_end:?}"
    );
    let no_object = unsafe { engine.submit(&[read(9, 0..1)]) };
    assert!(
        matches!(no_object, Err(RemoteError::InvalidRead { .. })),
        "{no_object:?}"
    );
    let three = [read(2, 0..1), read(2, 1..2), read(2, 2..3)];
    let busy = unsafe { engine.submit(&three) };
    assert!(matches!(busy, Err(RemoteError::Busy { .. })), "{busy:?}");
    assert_eq!(
        engine.outstanding(),
        0,
        "a refused batch must start none of its reads"
    );
}

fn server_objects() -> BTreeMap<String, Vec<u8>> {
    (0..40)
        .map(|i| {
            (
                format!("{}/s{i:03}.bin", ["a", "b/c", "b"][i % 3]),
                bytes_for(1000 + i as u64, 50_000 + i * 1000),
            )
        })
        .collect()
}

fn http_engine(
    server: &TestServer,
    rt: &Arc<RemoteRuntime>,
) -> (FetchEngine, Arc<Vec<RemoteObject>>) {
    let store = StoreHandle::open(&server.url).unwrap();
    let objects = Arc::new(rt.block_on(list_webdav(&store)).unwrap());
    let engine =
        FetchEngine::start(Arc::clone(rt), store, Arc::clone(&objects), quick_config()).unwrap();
    (engine, objects)
}

fn check_all(server: &TestServer, engine: &mut FetchEngine, objects: &[RemoteObject]) {
    let reads: Vec<(u32, Range<u64>)> = (0..objects.len() as u32)
        .map(|i| (i, 0..objects[i as usize].size))
        .collect();
    let (buf, at, results) = fetch_all(engine, &reads);
    let data = server.objects.lock().unwrap();
    for (tag, (i, _)) in reads.iter().enumerate() {
        assert!(
            results[&(tag as u64)].is_ok(),
            "{:?}",
            results[&(tag as u64)]
        );
        let want = &data[&objects[*i as usize].key];
        assert!(
            &buf[at[tag]..at[tag] + want.len()] == want.as_slice(),
            "bytes of {}",
            objects[*i as usize].key
        );
    }
}

#[test]
fn webdav_depth_one_walk_lists_every_file_of_the_tree() {
    let server = TestServer::start(server_objects());
    let rt = runtime();
    let (mut engine, objects) = http_engine(&server, &rt);
    let keys: Vec<&String> = objects.iter().map(|o| &o.key).collect();
    let data = server.objects.lock().unwrap().clone();
    assert_eq!(keys, data.keys().collect::<Vec<_>>());
    check_all(&server, &mut engine, &objects);
}

#[test]
fn injected_503s_are_retried_and_counted_and_the_bytes_stay_exact() {
    let server = TestServer::start(server_objects());
    let rt = runtime();
    let (mut engine, objects) = http_engine(&server, &rt);
    server.faults.status_503.store(25, Ordering::SeqCst);
    check_all(&server, &mut engine, &objects);
    let m = engine.metrics();
    assert_eq!(server.faults.status_503.load(Ordering::SeqCst), 0);
    assert_eq!(
        m.retries[RetryCause::Throttled.index()].load(Ordering::Relaxed),
        25
    );
    assert_eq!(m.status_throttled.load(Ordering::Relaxed), 25);
}

#[test]
fn bodies_cut_mid_way_and_stalls_after_headers_are_retried_whole() {
    let server = TestServer::start(server_objects());
    let rt = runtime();
    let (mut engine, objects) = http_engine(&server, &rt);
    server.faults.cut_body.store(5, Ordering::SeqCst);
    server.faults.stall_ms.store(3000, Ordering::SeqCst);
    server.faults.stall.store(3, Ordering::SeqCst);
    check_all(&server, &mut engine, &objects);
    let m = engine.metrics();
    let cut = m.retries[RetryCause::BodyInterrupted.index()].load(Ordering::Relaxed);
    let stalled = m.retries[RetryCause::Stall.index()].load(Ordering::Relaxed);
    assert_eq!(cut, 5, "retries by cause: {:?}", m.snapshot().retries);
    // A stalled GET is retried after the stall timeout, unless a hedge of
    // it answered first (then it is cancelled, not retried).
    let won = m.hedges_won.load(Ordering::Relaxed);
    assert!(
        stalled <= 3 && stalled + won >= 3,
        "3 stalls, {stalled} retried, {won} hedges won; retries by cause: {:?}",
        m.snapshot().retries
    );
}

#[test]
fn a_403_is_an_error_naming_the_key_status_and_permission() {
    let server = TestServer::start(server_objects());
    let rt = runtime();
    let (mut engine, objects) = http_engine(&server, &rt);
    server
        .faults
        .forbidden
        .lock()
        .unwrap()
        .insert(objects[5].key.clone());
    let (_, _, results) = fetch_all(&mut engine, &[(5, 0..objects[5].size)]);
    let text = results[&0].as_ref().unwrap_err().to_string();
    assert!(
        text.contains(&objects[5].key)
            && text.contains("HTTP 403")
            && text.contains("access rules"),
        "{text}"
    );
    assert_eq!(engine.metrics().retries_total(), 0, "a 403 is not retried");
}

#[test]
fn retries_run_out_with_an_error_naming_key_attempts_and_cause() {
    let server = TestServer::start(server_objects());
    let rt = runtime();
    let store = StoreHandle::open(&server.url).unwrap();
    let objects = Arc::new(rt.block_on(list_webdav(&store)).unwrap());
    let cfg = FetchConfig {
        retries_max: 3,
        ..quick_config()
    };
    let mut engine = FetchEngine::start(Arc::clone(&rt), store, Arc::clone(&objects), cfg).unwrap();
    server.faults.status_503.store(1000, Ordering::SeqCst);
    let (_, _, results) = fetch_all(&mut engine, &[(0, 0..objects[0].size)]);
    let text = results[&0].as_ref().unwrap_err().to_string();
    assert!(
        text.contains(&objects[0].key) && text.contains("4 times") && text.contains("429/503"),
        "{text}"
    );
}

#[test]
fn a_keys_file_takes_sizes_given_and_heads_the_rest() {
    let server = TestServer::start(server_objects());
    let rt = runtime();
    let store = StoreHandle::open(&server.url).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys.txt");
    std::fs::write(&file, "# keys\nb/s002.bin\na/s000.bin\t50000\n\n").unwrap();
    let objects = rt.block_on(read_keys_file(&store, &file)).unwrap();
    assert_eq!(objects.len(), 2);
    assert_eq!(
        (objects[0].key.as_str(), objects[0].size),
        ("a/s000.bin", 50_000)
    );
    assert_eq!(
        (objects[1].key.as_str(), objects[1].size),
        ("b/s002.bin", 52_000)
    );
    std::fs::write(&file, "a/s000.bin\tmany\n").unwrap();
    let text = rt
        .block_on(read_keys_file(&store, &file))
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("line 1") && text.contains("\"many\""),
        "{text}"
    );
}

#[test]
fn bad_urls_and_missing_credentials_say_what_to_set() {
    let text = StoreHandle::open("ftp://x/y").unwrap_err().to_string();
    assert!(
        text.contains("ftp") && text.contains("s3://BUCKET/PREFIX"),
        "{text}"
    );
    let text = StoreHandle::open("s3://").unwrap_err().to_string();
    assert!(text.contains("no bucket"), "{text}");
}

#[test]
fn dropping_the_engine_with_gets_stalled_in_flight_returns_promptly() {
    let server = TestServer::start(server_objects());
    let rt = runtime();
    let store = StoreHandle::open(&server.url).unwrap();
    let objects = Arc::new(rt.block_on(list_webdav(&store)).unwrap());
    let cfg = FetchConfig {
        stall_timeout_ms: 10_000,
        ..quick_config()
    };
    let mut engine = FetchEngine::start(Arc::clone(&rt), store, Arc::clone(&objects), cfg).unwrap();
    server.faults.stall_ms.store(5_000, Ordering::SeqCst);
    server.faults.stall.store(1000, Ordering::SeqCst);
    let mut bufs: Vec<Vec<u8>> = objects.iter().map(|o| vec![0u8; o.size as usize]).collect();
    let reads: Vec<FetchRead> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, b)| FetchRead {
            object: i as u32,
            range: 0..b.len() as u64,
            dest: b.as_mut_ptr(),
            tag: i as u64,
        })
        .collect();
    // SAFETY: the buffers outlive the engine, whose drop waits for every GET.
    unsafe { engine.submit(&reads).unwrap() };
    while server.faults.gets.load(Ordering::SeqCst) < 10 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let t = std::time::Instant::now();
    drop(engine);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "drop took {:?}",
        t.elapsed()
    );
    drop(bufs);
}
