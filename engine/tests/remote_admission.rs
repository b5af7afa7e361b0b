//! The fetch engine under a store that throttles and one whose answers are
//! sometimes slow (remote_common's test server): the rate limit a 503 sets,
//! Retry-After, hedged GETs, and what they must never do to a destination
//! (a byte written twice, a byte landing after the read completed).

mod remote_common;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use remote_common::{bytes_for, TestServer};
use ringfeed::remote::hedge::{HEDGE_BURST, HEDGE_FRACTION};
use ringfeed::remote::{
    list_webdav, FetchCompletion, FetchConfig, FetchEngine, FetchRead, RemoteObject, RemoteRuntime,
    RetryCause, StoreHandle,
};

const OBJECT_BYTES: usize = 8192;

fn objects(n: usize) -> BTreeMap<String, Vec<u8>> {
    (0..n)
        .map(|i| {
            (
                format!("o{i:04}.bin"),
                bytes_for(7000 + i as u64, OBJECT_BYTES),
            )
        })
        .collect()
}

fn config() -> FetchConfig {
    FetchConfig {
        backoff_base_ms: 5,
        backoff_max_ms: 50,
        stall_timeout_ms: 5_000,
        ..FetchConfig::default()
    }
}

fn engine(server: &TestServer, cfg: FetchConfig) -> (FetchEngine, Arc<Vec<RemoteObject>>) {
    let rt = Arc::new(RemoteRuntime::new(2).unwrap());
    let store = StoreHandle::open(&server.url).unwrap();
    let objects = Arc::new(rt.block_on(list_webdav(&store)).unwrap());
    let engine = FetchEngine::start(rt, store, Arc::clone(&objects), cfg).unwrap();
    (engine, objects)
}

/// Reads objects `which` whole, each into a buffer of its own; checks every
/// read succeeded with the server's bytes, and returns the buffers.
fn read_whole(
    engine: &mut FetchEngine,
    objects: &[RemoteObject],
    server: &TestServer,
    which: std::ops::Range<usize>,
) -> Vec<Vec<u8>> {
    let mut bufs: Vec<Vec<u8>> = which
        .clone()
        .map(|i| vec![0u8; objects[i].size as usize])
        .collect();
    let reads: Vec<FetchRead> = which
        .clone()
        .zip(bufs.iter_mut())
        .map(|(i, b)| FetchRead {
            object: i as u32,
            range: 0..b.len() as u64,
            dest: b.as_mut_ptr(),
            tag: i as u64,
        })
        .collect();
    // SAFETY: each buffer outlives its read: every completion is reaped below.
    unsafe { engine.submit(&reads).unwrap() };
    let mut done: Vec<FetchCompletion> = Vec::new();
    while engine.outstanding() > 0 {
        engine.reap(&mut done, 1, Duration::from_secs(60));
    }
    assert_eq!(done.len(), which.len(), "one completion per read");
    let data = server.objects.lock().unwrap().clone();
    for c in &done {
        let i = c.tag as usize;
        assert!(c.result.is_ok(), "read {i}: {:?}", c.result);
        let want = &data[&objects[i].key];
        assert!(
            bufs[i - which.start] == *want,
            "object {} differs",
            objects[i].key
        );
    }
    bufs
}

#[test]
fn throttles_cut_the_rate_limit_and_every_read_still_lands_exactly_once() {
    let server = TestServer::start(objects(240));
    let (mut engine, objects) = engine(&server, config());
    read_whole(&mut engine, &objects, &server, 0..40);
    let before = engine.metrics().snapshot();
    assert_eq!(
        (before.rate_limit_per_s, before.rate_cuts),
        (0, 0),
        "no limit before a throttle"
    );
    server.faults.status_503.store(60, Ordering::SeqCst);
    read_whole(&mut engine, &objects, &server, 40..240);
    let after = engine.metrics().snapshot();
    assert!(after.rate_cuts >= 1, "503s cut nothing: {after:?}");
    assert!(
        after.rate_limit_per_s > 0,
        "503s set no rate limit: {after:?}"
    );
    assert_eq!(
        after.retries[RetryCause::Throttled.index()],
        60,
        "each 503 retried once"
    );
    let landed = engine.metrics().bytes_landed.load(Ordering::Relaxed);
    assert_eq!(
        landed,
        240 * OBJECT_BYTES as u64,
        "a byte landed twice, or was lost"
    );
}

#[test]
fn retry_after_holds_the_store_back_that_long() {
    let server = TestServer::start(objects(4));
    let (mut engine, objects) = engine(&server, config());
    server.faults.retry_after_s.store(1, Ordering::SeqCst);
    server.faults.status_503.store(1, Ordering::SeqCst);
    let started = Instant::now();
    read_whole(&mut engine, &objects, &server, 0..1);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1),
        "retried after {took:?}, inside Retry-After: 1"
    );
    assert_eq!(engine.metrics().snapshot().rate_cuts, 1);
}

#[test]
fn a_slow_get_is_hedged_the_first_answer_wins_and_no_byte_lands_twice_or_late() {
    let server = TestServer::start(objects(600));
    let (mut engine, objects) = engine(&server, config());
    // Answers for the size class to learn its latency from, and for the
    // hedge budget to fill (one hedge per 20 answers, 16 at most kept).
    read_whole(&mut engine, &objects, &server, 0..320);
    let hold_ms = 1500;
    server.faults.hold_ms.store(hold_ms, Ordering::SeqCst);
    // The held GETs send half their body, then wait: their writers have
    // landed those bytes when the hedges win.
    server.faults.hold_after_half.store(1, Ordering::SeqCst);
    server.faults.hold.store(4, Ordering::SeqCst);
    let started = Instant::now();
    let mut bufs = read_whole(&mut engine, &objects, &server, 320..600);
    let took = started.elapsed();
    let m = engine.metrics().snapshot();
    println!(
        "280 reads with 4 held {hold_ms} ms: {took:?}, hedges {} ({} won)",
        m.hedges, m.hedges_won
    );
    assert!(
        m.hedges_won >= 1,
        "no hedge won against GETs held {hold_ms} ms: {m:?}"
    );
    assert!(m.hedges_won <= m.hedges, "{m:?}");
    let landed = engine.metrics().bytes_landed.load(Ordering::Relaxed);
    assert_eq!(
        landed,
        600 * OBJECT_BYTES as u64,
        "the bytes landed are not the reads' bytes: a hedge wrote what its writer had written"
    );
    // The held bodies come after the hold: none may land in a buffer whose
    // read has completed.
    for b in &mut bufs {
        b.fill(0xEE);
    }
    std::thread::sleep(Duration::from_millis(hold_ms as u64 + 500));
    let changed: usize = bufs
        .iter()
        .map(|b| b.iter().filter(|&&x| x != 0xEE).count())
        .sum();
    assert_eq!(
        changed, 0,
        "a cancelled GET's body landed after its read completed"
    );
}

#[test]
fn hedges_stay_within_their_budget_when_every_get_is_slow() {
    let server = TestServer::start(objects(300));
    let (mut engine, objects) = engine(&server, config());
    read_whole(&mut engine, &objects, &server, 0..64);
    server.faults.hold_ms.store(200, Ordering::SeqCst);
    server.faults.hold.store(100_000, Ordering::SeqCst);
    read_whole(&mut engine, &objects, &server, 64..300);
    let m = engine.metrics().snapshot();
    let answered = engine.metrics().gets_ok.load(Ordering::Relaxed) as f64;
    println!(
        "every GET held 200 ms: {} hedges ({} won) for {answered} GETs",
        m.hedges, m.hedges_won
    );
    assert!(
        (m.hedges as f64) <= HEDGE_BURST + HEDGE_FRACTION * answered * 2.0 + 1.0,
        "{} hedges for {answered} GETs: over the budget",
        m.hedges
    );
}

#[test]
fn engines_of_one_store_share_one_admission_controller() {
    let server = TestServer::start(objects(8));
    let (mut a, objects) = engine(&server, config());
    let (b, _) = engine(&server, config());
    let (la, lb) = (
        a.metrics().limits.get().unwrap(),
        b.metrics().limits.get().unwrap(),
    );
    assert!(Arc::ptr_eq(la, lb), "two controllers for one store");
    let other = TestServer::start(objects_for_other());
    let (c, _) = engine(&other, config());
    assert!(!Arc::ptr_eq(la, c.metrics().limits.get().unwrap()));
    // A throttle seen by one engine limits the other.
    server.faults.status_503.store(1, Ordering::SeqCst);
    read_whole(&mut a, &objects, &server, 0..8);
    assert!(b.metrics().snapshot().rate_limit_per_s > 0);
}

fn objects_for_other() -> BTreeMap<String, Vec<u8>> {
    objects(2)
}
