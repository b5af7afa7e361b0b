//! The proxy binary in front of a small HTTP/1.1 keep-alive server of the
//! test's own, driven by a blocking client that records when the head and the
//! body of each response arrived.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Every socket read in these tests gives up after this, so a hang fails.
const READ_TIMEOUT_S: u64 = 20;
/// How long the proxy may take to start and write its port file.
const START_TIMEOUT_S: u64 = 20;

/// Byte `i` of every body the test server sends.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// A keep-alive HTTP/1.1 server: `GET /bytes/N` sends N pattern bytes,
/// `GET /chunked/N` the same in chunked coding, HEAD the head alone, PUT reads
/// the body and answers `got N`. It counts the requests it served.
struct Upstream {
    port: u16,
    requests: Arc<AtomicU64>,
}

impl Upstream {
    fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicU64::new(0));
        let counter = requests.clone();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let counter = counter.clone();
                thread::spawn(move || {
                    let _ = serve_upstream_connection(stream, &counter);
                });
            }
        });
        Upstream { port, requests }
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

fn serve_upstream_connection(stream: TcpStream, requests: &AtomicU64) -> io::Result<()> {
    // Without it a head and a body written apart wait 40 ms for a delayed ACK.
    stream.set_nodelay(true)?;
    let mut writer = io::BufWriter::with_capacity(1 << 16, stream.try_clone()?);
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let (method, path) = (words[0].to_string(), words[1].to_string());
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header)?;
            if header == "\r\n" {
                break;
            }
            if let Some(value) = header.to_ascii_lowercase().strip_prefix("content-length:") {
                length = value.trim().parse().unwrap();
            }
        }
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body)?;
        requests.fetch_add(1, Ordering::Relaxed);
        let n: usize = path
            .rsplit('/')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let data: Vec<u8> = (0..n).map(pattern).collect();
        match (method.as_str(), path.starts_with("/chunked/")) {
            ("PUT", _) => {
                let reply = format!("got {length}");
                write!(
                    writer,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{reply}",
                    reply.len()
                )?;
            }
            ("HEAD", _) => write!(writer, "HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n")?,
            (_, true) => {
                write!(
                    writer,
                    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                )?;
                for part in data.chunks(n.div_ceil(3).max(1)) {
                    write!(writer, "{:x}\r\n", part.len())?;
                    writer.write_all(part)?;
                    writer.write_all(b"\r\n")?;
                }
                writer.write_all(b"0\r\n\r\n")?;
            }
            _ => {
                write!(writer, "HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n")?;
                writer.write_all(&data)?;
            }
        }
        writer.flush()?;
    }
}

/// The proxy binary, stopped with SIGTERM when dropped.
struct Proxy {
    child: Option<Child>,
    port: u16,
    status_port: u16,
    _dir: tempfile::TempDir,
}

impl Proxy {
    fn start(upstream: &str, flags: &[&str]) -> Proxy {
        let dir = tempfile::tempdir().unwrap();
        let port_file: PathBuf = dir.path().join("port");
        let child = Command::new(env!("CARGO_BIN_EXE_faultproxy"))
            .args([
                "--upstream",
                upstream,
                "--status-listen",
                "127.0.0.1:0",
                "--port-file",
            ])
            .arg(&port_file)
            .args(flags)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(START_TIMEOUT_S);
        let ports = loop {
            if let Ok(text) = std::fs::read_to_string(&port_file) {
                break text;
            }
            assert!(
                Instant::now() < deadline,
                "faultproxy wrote no port file in {START_TIMEOUT_S} s"
            );
            thread::sleep(Duration::from_millis(10));
        };
        let ports: Vec<u16> = ports.lines().map(|l| l.parse().unwrap()).collect();
        Proxy {
            child: Some(child),
            port: ports[0],
            status_port: ports[1],
            _dir: dir,
        }
    }

    fn connect(&self) -> Client {
        Client::connect(self.port)
    }

    /// The counters from the status endpoint, as `"name":value` text.
    fn status(&self) -> String {
        let mut client = Client::connect(self.status_port);
        let response = client.request("GET", "/", b"").unwrap();
        String::from_utf8(response.body).unwrap()
    }

    fn counter(&self, name: &str) -> u64 {
        let status = self.status();
        let key = format!("\"{name}\":");
        let start = status
            .find(&key)
            .unwrap_or_else(|| panic!("{name} not in {status}"))
            + key.len();
        let digits: String = status[start..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        digits.parse().unwrap()
    }

    /// Sends SIGTERM and returns what the proxy printed.
    fn stop(mut self) -> String {
        let mut child = self.child.take().unwrap();
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert!(child.wait().unwrap().success());
        out
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

struct Response {
    status: u16,
    body: Vec<u8>,
    head_after: Duration,
    done_after: Duration,
}

/// A blocking HTTP/1.1 client on one keep-alive connection.
struct Client {
    reader: BufReader<TcpStream>,
}

impl Client {
    fn connect(port: u16) -> Client {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(READ_TIMEOUT_S)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            reader: BufReader::with_capacity(1 << 20, stream),
        }
    }

    fn get(&mut self, path: &str) -> io::Result<Response> {
        self.request("GET", path, b"")
    }

    /// Sends one request and reads its response, which may be cut short.
    fn request(&mut self, method: &str, path: &str, body: &[u8]) -> io::Result<Response> {
        let started = Instant::now();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let stream = self.reader.get_mut();
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)?;
        let mut status_line = String::new();
        if self.reader.read_line(&mut status_line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed before a response",
            ));
        }
        let status: u16 = status_line.split(' ').nth(1).unwrap().parse().unwrap();
        let (mut length, mut chunked) = (0usize, false);
        loop {
            let mut header = String::new();
            self.reader.read_line(&mut header)?;
            let lower = header.to_ascii_lowercase();
            if let Some(value) = lower.strip_prefix("content-length:") {
                length = value.trim().parse().unwrap();
            }
            chunked |= lower.starts_with("transfer-encoding: chunked");
            if header == "\r\n" {
                break;
            }
        }
        let head_after = started.elapsed();
        let mut body = Vec::new();
        if method == "HEAD" {
        } else if chunked {
            loop {
                let mut size = String::new();
                self.reader.read_line(&mut size)?;
                let n = usize::from_str_radix(size.trim(), 16).unwrap();
                let mut part = vec![0u8; n + 2];
                self.reader.read_exact(&mut part)?;
                body.extend_from_slice(&part[..n]);
                if n == 0 {
                    break;
                }
            }
        } else {
            body.resize(length, 0);
            let mut filled = 0;
            while filled < length {
                match self.reader.read(&mut body[filled..])? {
                    0 => {
                        let message = format!("body cut at {filled} of {length} bytes");
                        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, message));
                    }
                    n => filled += n,
                }
            }
        }
        Ok(Response {
            status,
            body,
            head_after,
            done_after: started.elapsed(),
        })
    }
}

fn expected_body(n: usize) -> Vec<u8> {
    (0..n).map(pattern).collect()
}

/// The fastest of several timings: load on the machine only ever adds to a
/// round trip, so the minimum is the figure that noise disturbs least.
fn fastest(values: impl Iterator<Item = Duration>) -> Duration {
    values.min().unwrap()
}

/// Held by the tests that time round trips, so that they do not run beside
/// each other (or beside the 48 MiB transfer) on a 2-core machine.
static TIMING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn timing_alone() -> std::sync::MutexGuard<'static, ()> {
    TIMING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[test]
fn bodies_pass_byte_for_byte_on_one_keep_alive_connection() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&upstream.addr(), &[]);
    let mut client = proxy.connect();
    let big = client.get("/bytes/3000000").unwrap();
    assert_eq!((big.status, big.body.len()), (200, 3_000_000));
    assert!(
        big.body == expected_body(3_000_000),
        "a forwarded body differs from the upstream's"
    );
    assert_eq!(
        client.get("/chunked/100000").unwrap().body,
        expected_body(100_000)
    );
    assert_eq!(
        client
            .request("HEAD", "/bytes/5000", b"")
            .unwrap()
            .body
            .len(),
        0
    );
    assert_eq!(
        client.request("PUT", "/k", &[7u8; 70_000]).unwrap().body,
        b"got 70000"
    );
    assert_eq!(client.get("/bytes/0").unwrap().body.len(), 0);
    assert_eq!(proxy.counter("connections"), 1);
    assert_eq!(proxy.counter("requests"), 5);
    assert_eq!(proxy.counter("responses"), 5);
}

#[test]
fn rtt_of_20_ms_adds_about_20_ms_per_round_trip() {
    let upstream = Upstream::start();
    let round_trips = |proxy: &Proxy| {
        let mut client = proxy.connect();
        client.get("/bytes/100").unwrap(); // the connection's own extra round trip
        fastest((0..15).map(|_| client.get("/bytes/100").unwrap().done_after))
    };
    let _alone = timing_alone();
    let plain = round_trips(&Proxy::start(&upstream.addr(), &[]));
    let delayed = round_trips(&Proxy::start(&upstream.addr(), &["--rtt-ms", "20"]));
    let added_ms = delayed.saturating_sub(plain).as_secs_f64() * 1e3;
    println!(
        "fastest round trip: {plain:?} without, {delayed:?} with --rtt-ms 20: +{added_ms:.1} ms"
    );
    assert!(
        (19.0..35.0).contains(&added_ms),
        "--rtt-ms 20 added {added_ms:.1} ms per round trip"
    );
}

#[test]
fn a_new_connection_pays_one_more_round_trip_like_a_handshake() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&upstream.addr(), &["--rtt-ms", "40"]);
    let _alone = timing_alone();
    let (first, later): (Vec<Duration>, Vec<Duration>) = (0..3)
        .map(|_| {
            let mut client = proxy.connect();
            let first = client.get("/bytes/10").unwrap().done_after;
            (first, client.get("/bytes/10").unwrap().done_after)
        })
        .unzip();
    let (first, later) = (fastest(first.into_iter()), fastest(later.into_iter()));
    assert!(
        first >= Duration::from_millis(80),
        "first request on a connection took {first:?}"
    );
    assert!(
        later >= Duration::from_millis(40),
        "second request took {later:?}"
    );
    assert!(
        first >= later + Duration::from_millis(30),
        "first {first:?}, second {later:?}"
    );
}

#[test]
fn throughput_of_a_large_body_is_not_capped_by_the_rtt() {
    const BODY_BYTES: usize = 48 << 20;
    let upstream = Upstream::start();
    let fetch = |proxy: &Proxy| {
        let mut client = proxy.connect();
        client.get("/bytes/1").unwrap();
        let response = client.get(&format!("/bytes/{BODY_BYTES}")).unwrap();
        assert_eq!(response.body.len(), BODY_BYTES);
        response.done_after
    };
    let _alone = timing_alone();
    let plain = fetch(&Proxy::start(&upstream.addr(), &[]));
    let delayed = fetch(&Proxy::start(&upstream.addr(), &["--rtt-ms", "20"]));
    let mib_per_s = |t: Duration| BODY_BYTES as f64 / (1 << 20) as f64 / t.as_secs_f64();
    println!(
        "48 MiB: {plain:?} ({:.0} MiB/s) without, {delayed:?} ({:.0} MiB/s) with --rtt-ms 20",
        mib_per_s(plain),
        mib_per_s(delayed)
    );
    // Pieces of at most 64 KiB waiting 10 ms one after another would take >= 7.7 s.
    assert!(
        delayed < plain * 2 + Duration::from_millis(500),
        "{delayed:?} with the rtt, {plain:?} without"
    );
    assert!(
        delayed < Duration::from_secs(4),
        "{delayed:?}: the delay line serialises its pieces"
    );
}

#[test]
fn fraction_of_503s_is_close_to_the_requested_one_and_connections_stay_open() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&upstream.addr(), &["--error-503", "0.1", "--seed", "1"]);
    let mut injected = 0;
    for _ in 0..4 {
        let mut client = proxy.connect();
        for _ in 0..250 {
            let response = client.get("/bytes/1000").unwrap();
            if response.status == 503 {
                assert!(String::from_utf8_lossy(&response.body).contains("<Code>SlowDown</Code>"));
                injected += 1;
            } else {
                assert_eq!((response.status, response.body), (200, expected_body(1000)));
            }
        }
    }
    assert!(
        (70..=130).contains(&injected),
        "{injected} of 1000 requests got 503 at --error-503 0.1"
    );
    assert_eq!(proxy.counter("injected_503"), injected);
    assert_eq!(
        upstream.requests.load(Ordering::Relaxed),
        1000 - injected,
        "a 503'd request reached the upstream"
    );
    assert_eq!(proxy.counter("connections"), 4);
    let printed = proxy.stop();
    let summary = printed.lines().last().unwrap();
    assert!(summary.starts_with("faultproxy summary: "), "{printed}");
    assert!(
        summary.contains(&format!(" injected_503={injected} ")),
        "{summary}"
    );
}

#[test]
fn every_request_gets_429_at_fraction_one_and_head_gets_no_body() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&upstream.addr(), &["--error-429", "1"]);
    let mut client = proxy.connect();
    assert_eq!(client.get("/bytes/10").unwrap().status, 429);
    let head = client.request("HEAD", "/bytes/10", b"").unwrap();
    assert_eq!(head.status, 429);
    assert_eq!(
        client.request("PUT", "/k", &[1u8; 5000]).unwrap().status,
        429
    );
    assert_eq!(
        client.get("/bytes/10").unwrap().status,
        429,
        "the PUT body was not skipped"
    );
    assert_eq!(upstream.requests.load(Ordering::Relaxed), 0);
    assert_eq!(proxy.counter("injected_429"), 4);
}

#[test]
fn faults_apply_only_to_the_methods_named() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(
        &upstream.addr(),
        &["--error-503", "1", "--methods", "GET,HEAD"],
    );
    let mut client = proxy.connect();
    assert_eq!(client.request("PUT", "/k", b"abc").unwrap().status, 200);
    assert_eq!(client.get("/bytes/3").unwrap().status, 503);
}

#[test]
fn resets_cut_responses_mid_body_with_an_rst() {
    const BODY_BYTES: usize = 200_000;
    let upstream = Upstream::start();
    let proxy = Proxy::start(&upstream.addr(), &["--reset", "0.3", "--seed", "3"]);
    let mut resets = 0;
    for _ in 0..40 {
        let mut client = proxy.connect();
        match client.get(&format!("/bytes/{BODY_BYTES}")) {
            Ok(response) => assert_eq!(response.body, expected_body(BODY_BYTES)),
            Err(e) => {
                assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
                resets += 1;
            }
        }
    }
    assert!(
        (3..=24).contains(&resets),
        "{resets} of 40 responses reset at --reset 0.3"
    );
    assert_eq!(proxy.counter("resets"), resets);
}

#[test]
fn a_reset_response_delivers_its_headers_and_at_most_half_its_body() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&upstream.addr(), &["--reset", "1"]);
    let stream = TcpStream::connect(("127.0.0.1", proxy.port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(READ_TIMEOUT_S)))
        .unwrap();
    (&stream)
        .write_all(b"GET /bytes/100000 HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut received = Vec::new();
    let mut buf = [0u8; 65536];
    let error = loop {
        match (&stream).read(&mut buf) {
            Ok(0) => panic!(
                "the connection closed with FIN, not RST, after {} bytes",
                received.len()
            ),
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) => break e,
        }
    };
    assert_eq!(error.kind(), io::ErrorKind::ConnectionReset);
    let text = String::from_utf8_lossy(&received);
    // The kernel may drop unread bytes when the RST lands, so only an upper bound holds.
    if !received.is_empty() {
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text:.40}");
    }
    assert!(
        received.len() < 50_000 + 100,
        "{} bytes arrived before the reset",
        received.len()
    );
}

#[test]
fn stalls_hold_the_body_after_the_headers() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&upstream.addr(), &["--stall", "1", "--stall-ms", "600"]);
    let mut client = proxy.connect();
    let response = client.get("/bytes/1000").unwrap();
    assert_eq!(response.body, expected_body(1000));
    assert!(
        response.head_after < Duration::from_millis(400),
        "headers after {:?}",
        response.head_after
    );
    let held = response.done_after - response.head_after;
    assert!(
        held >= Duration::from_millis(590),
        "body held only {held:?} after the headers"
    );
    assert_eq!(proxy.counter("stalls"), 1);
}

#[test]
fn trickles_send_the_body_at_the_given_rate() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(
        &upstream.addr(),
        &["--trickle", "1", "--trickle-bytes-per-s", "20000"],
    );
    let mut client = proxy.connect();
    let response = client.get("/bytes/10000").unwrap();
    assert_eq!(response.body, expected_body(10_000));
    // 2,000 bytes every 100 ms: the fifth piece leaves at 400 ms.
    assert!(
        response.done_after >= Duration::from_millis(400),
        "10 kB took {:?}",
        response.done_after
    );
    assert_eq!(proxy.counter("trickles"), 1);
}

#[test]
fn the_same_seed_injects_the_same_faults() {
    let upstream = Upstream::start();
    let statuses = |seed: &str| -> Vec<u16> {
        let proxy = Proxy::start(&upstream.addr(), &["--error-503", "0.5", "--seed", seed]);
        let mut client = proxy.connect();
        (0..40)
            .map(|_| client.get("/bytes/10").unwrap().status)
            .collect()
    };
    let first = statuses("5");
    assert_eq!(first, statuses("5"));
    assert_ne!(first, statuses("6"));
}

#[test]
fn an_upstream_that_is_down_is_answered_502_naming_it() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let upstream = format!("127.0.0.1:{port}");
    let proxy = Proxy::start(&upstream, &[]);
    let response = proxy.connect().get("/x").unwrap();
    assert_eq!(response.status, 502);
    let text = String::from_utf8_lossy(&response.body);
    assert!(
        text.contains(&format!("cannot connect to the upstream {upstream}")),
        "{text}"
    );
    assert_eq!(proxy.counter("upstream_connect_errors"), 1);
}

#[test]
fn a_fraction_out_of_range_is_refused_naming_the_flag() {
    let output = Command::new(env!("CARGO_BIN_EXE_faultproxy"))
        .args(["--upstream", "127.0.0.1:1", "--error-503", "1.5"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--error-503 1.5 is not a fraction"),
        "{stderr}"
    );
}
