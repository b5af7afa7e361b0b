//! The fetch engine against a server that is slow or broken in ways a
//! retry loop alone does not handle: a body that trickles (never a stall,
//! never done), Range ignored or answered with another range, response
//! headers that come later than the stall timeout. A real HTTP server on
//! 127.0.0.1 (remote_common) with small thresholds, so each test takes a
//! second or two.

mod remote_common;

use std::collections::BTreeMap;
use std::io::Write;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use remote_common::{bytes_for, TestServer};
use ringfeed::remote::{
    list_webdav, FetchCompletion, FetchConfig, FetchEngine, FetchRead, RemoteError, RemoteObject,
    RemoteRuntime, RetryCause, StoreHandle,
};

/// Longest a test waits for a read's completion: far past what each test
/// needs, far short of "forever", which is what the old code took.
const COMPLETION_WAIT: Duration = Duration::from_secs(15);

fn objects() -> BTreeMap<String, Vec<u8>> {
    (0..4)
        .map(|i| (format!("o{i}.bin"), bytes_for(7 + i as u64, 20_000)))
        .collect()
}

/// A quick engine: 400 ms stall timeout, a body slower than 1 KiB/s over
/// 500 ms is a stall, two retries.
fn config() -> FetchConfig {
    FetchConfig {
        part_bytes: 64 << 10,
        backoff_base_ms: 5,
        backoff_max_ms: 50,
        stall_timeout_ms: 400,
        min_bytes_per_s: 1024,
        throughput_window_ms: 500,
        retries_max: 2,
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

/// Reads `range` of object 0; the bytes and the result, or a panic naming
/// how long it waited when no completion came within `COMPLETION_WAIT`.
fn read(mut engine: FetchEngine, range: Range<u64>) -> (Vec<u8>, Result<(), RemoteError>) {
    let mut buf = vec![0u8; (range.end - range.start) as usize];
    let op = FetchRead {
        object: 0,
        range,
        dest: buf.as_mut_ptr(),
        tag: 0,
    };
    // SAFETY: `buf` outlives the engine, which is dropped (waiting for
    // every GET) before `buf` is read or freed.
    unsafe { engine.submit(&[op]).unwrap() };
    let started = Instant::now();
    let mut done: Vec<FetchCompletion> = Vec::new();
    engine.reap(&mut done, 1, COMPLETION_WAIT);
    drop(engine);
    let Some(c) = done.pop() else {
        panic!(
            "no completion after {:?}: the GET neither finished nor failed",
            started.elapsed()
        );
    };
    (buf, c.result)
}

#[test]
fn a_body_that_trickles_is_retried_as_a_stall_and_then_lands_exact() {
    let server = TestServer::start(objects());
    let (engine, _) = engine(&server, config());
    // 1 byte every 100 ms: never 400 ms without a byte, 10 bytes/s.
    server.faults.trickle_gap_ms.store(100, Ordering::SeqCst);
    server.faults.trickle.store(1, Ordering::SeqCst);
    let metrics = Arc::clone(engine.metrics());
    let (buf, result) = read(engine, 0..20_000);
    result.unwrap();
    assert!(buf == server.objects.lock().unwrap()["o0.bin"]);
    assert_eq!(
        metrics.retries[RetryCause::Stall.index()].load(Ordering::Relaxed),
        1
    );
}

#[test]
fn a_body_that_always_trickles_fails_naming_the_object_the_rate_and_the_fix() {
    let server = TestServer::start(objects());
    let (engine, _) = engine(&server, config());
    server.faults.trickle_gap_ms.store(100, Ordering::SeqCst);
    server.faults.trickle.store(1000, Ordering::SeqCst);
    let started = Instant::now();
    let (_, result) = read(engine, 0..20_000);
    let e = result.unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, RemoteError::TooSlow { attempts: 3, .. }),
        "{e:?}"
    );
    assert!(
        text.contains("\"o0.bin\"")
            && text.contains("bytes/s) where at least 1024 bytes/s")
            && text.contains("--queue-depth"),
        "{text}"
    );
    // Three windows of 500 ms and a little backoff.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_server_that_ignores_range_is_a_permanent_error_at_once_naming_its_answer() {
    let server = TestServer::start(objects());
    let (engine, _) = engine(&server, config());
    let metrics = Arc::clone(engine.metrics());
    server.faults.ignore_range.store(1000, Ordering::SeqCst);
    let (_, result) = read(engine, 1000..2000);
    let text = result.unwrap_err().to_string();
    assert!(
        text.contains("\"o0.bin\"")
            && text.contains("asked for bytes 1000-1999")
            && text.contains("HTTP 200 with Content-Range none and Content-Length \"20000\"")
            && text.contains("supports Range requests"),
        "{text}"
    );
    assert_eq!(
        metrics.retries_total(),
        0,
        "an ignored Range is not retried"
    );
    assert_eq!(server.faults.gets.load(Ordering::SeqCst), 1);
}

#[test]
fn a_server_that_sends_another_range_is_a_permanent_error_naming_its_content_range() {
    let server = TestServer::start(objects());
    let (engine, _) = engine(&server, config());
    let metrics = Arc::clone(engine.metrics());
    server.faults.wrong_range.store(1000, Ordering::SeqCst);
    let (_, result) = read(engine, 1000..2000);
    let text = result.unwrap_err().to_string();
    assert!(
        text.contains("\"o0.bin\"")
            && text.contains("HTTP 206 with Content-Range \"bytes 0-999/20000\"")
            && text.contains("Content-Length \"1000\""),
        "{text}"
    );
    assert_eq!(metrics.retries_total(), 0, "a wrong range is not retried");
}

/// Every warning any test's engine logs (one global subscriber per binary).
fn logged() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&log);
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || LogWriter(Arc::clone(&sink)))
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        log
    })
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_server_slow_to_send_headers_gets_a_longer_wait_on_each_retry_and_a_warning() {
    let log = logged();
    let server = TestServer::start(objects());
    let (engine, _) = engine(&server, config());
    let metrics = Arc::clone(engine.metrics());
    // Headers after 700 ms on every GET: past the first 400 ms wait, within
    // the second (800 ms).
    server.faults.header_delay_ms.store(700, Ordering::SeqCst);
    let (buf, result) = read(engine, 0..20_000);
    result.unwrap();
    assert!(buf == server.objects.lock().unwrap()["o0.bin"]);
    assert_eq!(
        metrics.retries[RetryCause::Stall.index()].load(Ordering::Relaxed),
        1
    );
    let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    assert!(
        text.contains("\"o0.bin\" (bytes 0-19999) sent no response headers within 0.4 s")
            && text.contains("waiting up to 0.8 s on the next attempt"),
        "{text}"
    );
}
