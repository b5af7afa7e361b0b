//! A minimal HTTP/1.1 responder for `GET /metrics`, on its own thread.
//!
//! The thread runs a single-threaded tokio runtime: every connection is a
//! task of its own, so an idle or slow client holds only itself, never the
//! other scrapes. Each connection has [`REQUEST_DEADLINE_MS`] to send its
//! request head and [`WRITE_TIMEOUT_MS`] to take the whole response, then
//! it is closed; at most [`MAX_CONNECTIONS`] are open at once (the next ones
//! wait in the kernel's queue until one ends), so memory stays bounded.
//! One peer address holds at most [`MAX_CONNECTIONS_PER_PEER`] of them (the
//! next are closed at once), and once more than [`BUSY_CONNECTIONS`] are
//! open a new one has only [`BUSY_REQUEST_DEADLINE_MS`] for its head: 700
//! idle connections from one peer slowed every other peer's scrape to
//! seconds (issue 36), now they cost it nothing.
//! One request per connection (`Connection: close`); requests past
//! [`MAX_REQUEST_BYTES`] get 431. The thread reads the ring's atomics and
//! nothing else of the loader's, so a slow or hostile client never slows
//! the loader.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, Semaphore};
use tokio::time::timeout;

pub use crate::metrics::peers::MAX_CONNECTIONS_PER_PEER;
use crate::metrics::peers::{PeerPlace, Peers};
use crate::metrics::{Metrics, CONTENT_TYPE};
use crate::ring::observer::Observer;

/// The most bytes of request head read: a scraper's is a few hundred.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// Time a client has to send its whole request head.
pub const REQUEST_DEADLINE_MS: u64 = 2_000;
/// Time a client has to take the whole response.
pub const WRITE_TIMEOUT_MS: u64 = 2_000;
/// The most connections served at once; each holds at most
/// [`MAX_REQUEST_BYTES`] of request and one response.
pub const MAX_CONNECTIONS: usize = 512;
/// Open connections past which the server counts as saturated.
pub const BUSY_CONNECTIONS: usize = MAX_CONNECTIONS / 4;
/// Time a client has to send its request head while the server is
/// saturated (a scraper sends it at once).
pub const BUSY_REQUEST_DEADLINE_MS: u64 = 250;
/// The accept queue's length asked of the kernel.
const LISTEN_BACKLOG: libc::c_int = 4096;
/// How long the accept loop waits after the kernel refused an accept (out
/// of descriptors, say) before trying again.
pub const ACCEPT_RETRY_MS: u64 = 100;
/// How long a refused request's leftover bytes are read before closing.
const DRAIN_MS: u64 = 100;
/// The most leftover bytes read before closing.
const DRAIN_MAX_BYTES: usize = 64 * 1024;
/// The path served.
pub const METRICS_PATH: &str = "/metrics";

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The text is not HOST:PORT.
    #[error("--metrics {addr:?} is not an address ({why}): give HOST:PORT, e.g. 127.0.0.1:9464, 0.0.0.0:9464 for every interface, or port 0 for a free one")]
    NotAnAddress {
        /// As given.
        addr: String,
        /// What the resolver said.
        why: String,
    },
    /// Another process listens there.
    #[error("--metrics {addr}: the address is already in use (another loader or exporter listens there): pick another port, or port 0 for a free one")]
    InUse {
        /// As given.
        addr: String,
    },
    /// The host is none of this machine's addresses.
    #[error("--metrics {addr}: this machine has no such address: use 127.0.0.1, 0.0.0.0 (every interface) or one of its own addresses")]
    NotLocal {
        /// As given.
        addr: String,
    },
    /// A port below 1024 without the privilege.
    #[error("--metrics {addr}: permission denied (ports below 1024 need privileges): use a port from 1024 up, e.g. 9464")]
    Denied {
        /// As given.
        addr: String,
    },
    /// Anything else the kernel refused.
    #[error("--metrics {addr}: cannot listen: {source}; fix the address or leave --metrics out")]
    Other {
        /// As given.
        addr: String,
        /// The error.
        source: io::Error,
    },
}

/// A running metrics endpoint. Dropping it stops its thread.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<Notify>,
    ring: Arc<OnceLock<Observer>>,
    thread: Option<JoinHandle<()>>,
}

fn bind_error(addr: &str, e: io::Error) -> BindError {
    let addr = addr.to_owned();
    match e.kind() {
        io::ErrorKind::AddrInUse => BindError::InUse { addr },
        io::ErrorKind::AddrNotAvailable => BindError::NotLocal { addr },
        io::ErrorKind::PermissionDenied => BindError::Denied { addr },
        _ => BindError::Other { addr, source: e },
    }
}

/// The addresses `addr` names. A missing port or a bad number is said here
/// in words rather than as the resolver's "invalid socket address".
fn resolve(addr: &str) -> Result<Vec<SocketAddr>, BindError> {
    let not = |why: String| BindError::NotAnAddress {
        addr: addr.to_owned(),
        why,
    };
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err(not("no :PORT".into()));
    };
    if host.is_empty() {
        return Err(not("no host before the port".into()));
    }
    if port.parse::<u16>().is_err() {
        return Err(not(format!(
            "port {port:?} is not a number from 0 to 65535"
        )));
    }
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| not(e.to_string()))?
        .collect();
    if addrs.is_empty() {
        return Err(not("the host name has no address".into()));
    }
    Ok(addrs)
}

impl MetricsServer {
    /// Listens on `addr` (HOST:PORT; port 0 picks a free one) and serves
    /// the metrics of loader `name` from a thread of its own. Until
    /// [`MetricsServer::watch`] is given the ring, a scrape says `starting`.
    pub fn start(addr: &str, name: &str) -> Result<MetricsServer, BindError> {
        let addrs = resolve(addr)?;
        let listener = TcpListener::bind(&addrs[..]).map_err(|e| bind_error(addr, e))?;
        let other = |source| BindError::Other {
            addr: addr.to_owned(),
            source,
        };
        let bound = listener.local_addr().map_err(other)?;
        // A deeper accept queue than std's 128: a burst of connections (the
        // next ones are taken at once, or close idle ones) must not make the
        // kernel drop a scraper's SYN, which it would retry only after 1 s.
        // SAFETY: a listening socket's descriptor; listen again only sets
        // its backlog (capped by net.core.somaxconn).
        if unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&listener), LISTEN_BACKLOG) } != 0
        {
            return Err(other(io::Error::last_os_error()));
        }
        // tokio needs a non-blocking socket.
        listener.set_nonblocking(true).map_err(other)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(other)?;
        let listener = {
            let _in_runtime = runtime.enter();
            tokio::net::TcpListener::from_std(listener).map_err(other)?
        };
        let stop = Arc::new(Notify::new());
        let ring = Arc::new(OnceLock::<Observer>::new());
        let read_ring = {
            let ring = ring.clone();
            move || ring.get().map(Observer::snapshot)
        };
        let metrics = Arc::new(Metrics::new(name, read_ring));
        let t_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ringfeed-metrics".into())
            .spawn(move || {
                block_stop_signals();
                runtime.block_on(accept_loop(listener, t_stop, metrics));
                // Dropping the runtime here drops every connection still open.
            })
            .map_err(other)?;
        Ok(MetricsServer {
            addr: bound,
            stop,
            ring,
            thread: Some(thread),
        })
    }

    /// The address it listens on (with the port chosen for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves the figures of this ring from now on. A second call changes
    /// nothing: a loader has one ring.
    pub fn watch(&self, observer: Observer) {
        let _ = self.ring.set(observer);
    }

    /// Opens loader `name`'s ring read-only, as `ringfeed stat` does, and
    /// serves its figures. If it cannot be opened the loader serves on, and
    /// a warning says that the metrics lack the ring's figures.
    pub fn watch_ring(&self, name: &str) {
        match Observer::open(name) {
            Ok(observer) => self.watch(observer),
            Err(e) => tracing::warn!(
                "metrics endpoint: cannot read the ring {name:?} ({e}); /metrics serves no ring figures, the loader goes on"
            ),
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        // Kept until the loop next waits, if it is not waiting now.
        self.stop.notify_one();
        if let Some(t) = self.thread.take() {
            // The loop ends at once; the runtime's end drops the
            // connections still open.
            let _ = t.join();
        }
    }
}

/// Keeps the stop signals (SIGINT, SIGTERM, SIGHUP) away from this thread,
/// so that they interrupt the loader's thread, which acts on them.
fn block_stop_signals() {
    // SAFETY: sigset_t is plain old data, initialised by sigemptyset before
    // use; pthread_sigmask only changes this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Accepts connections until `stop`, each served by a task of its own while
/// at most [`MAX_CONNECTIONS`] are open, [`MAX_CONNECTIONS_PER_PEER`] of
/// them from one peer address.
async fn accept_loop(listener: tokio::net::TcpListener, stop: Arc<Notify>, metrics: Arc<Metrics>) {
    let open = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let peers: Peers = Arc::new(Mutex::new(HashMap::new()));
    let mut next_id: u64 = 0;
    let mut warned = false;
    loop {
        // A place first, then the connection: while all are taken, the next
        // clients wait in the listen queue rather than in memory here.
        let place = tokio::select! {
            _ = stop.notified() => return,
            place = open.clone().acquire_owned() => match place {
                Ok(place) => place,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            _ = stop.notified() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                // One peer's idle connections never take the others' places:
                // past its share it is closed at once.
                next_id += 1;
                let Some(peer_place) = PeerPlace::take(&peers, peer.ip().to_canonical(), next_id)
                else {
                    let _ = stream.try_write(TOO_MANY_FROM_PEER);
                    continue;
                };
                let busy = MAX_CONNECTIONS - open.available_permits() > BUSY_CONNECTIONS;
                let deadline_ms = if busy {
                    BUSY_REQUEST_DEADLINE_MS
                } else {
                    REQUEST_DEADLINE_MS
                };
                let metrics = metrics.clone();
                tokio::spawn(async move {
                    // A client that vanishes mid-request costs it only itself.
                    let _ = answer(stream, &metrics, &peer_place, deadline_ms).await;
                    drop(peer_place);
                    drop(place);
                });
            }
            Err(e) => {
                // Out of descriptors, say: wait a little and go on.
                if !warned {
                    tracing::warn!("metrics endpoint: cannot accept a connection ({e}); scrapes fail until it can");
                    warned = true;
                }
                drop(place);
                tokio::time::sleep(Duration::from_millis(ACCEPT_RETRY_MS)).await;
            }
        }
    }
}

/// What to answer a request head with.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Metrics,
    Status(&'static str, &'static str),
}

const BAD_REQUEST: Reply = Reply::Status("400", "Bad Request");
const NOT_FOUND: Reply = Reply::Status("404", "Not Found");
const NOT_ALLOWED: Reply = Reply::Status("405", "Method Not Allowed");
const TIMEOUT: Reply = Reply::Status("408", "Request Timeout");
const TOO_LARGE: Reply = Reply::Status("431", "Request Header Fields Too Large");
/// What a connection past its peer's share is told before it is closed.
const TOO_MANY_FROM_PEER: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

/// Reads a request head (up to the blank line) within `deadline_ms` and the
/// size bound: Ok(Ok(head)), or Ok(Err(reply)) for a request too slow or too
/// large. Err: the connection failed, or closed before a whole head.
async fn read_head(stream: &mut TcpStream, deadline_ms: u64) -> io::Result<Result<Vec<u8>, Reply>> {
    let deadline = Duration::from_millis(deadline_ms);
    match timeout(deadline, read_head_untimed(stream)).await {
        Ok(read) => read,
        Err(_) => Ok(Err(TIMEOUT)),
    }
}

/// [`read_head`] without its deadline.
async fn read_head_untimed(stream: &mut TcpStream) -> io::Result<Result<Vec<u8>, Reply>> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = find_head_end(&head) {
            head.truncate(end);
            return Ok(Ok(head));
        }
        if head.len() >= MAX_REQUEST_BYTES {
            return Ok(Err(TOO_LARGE));
        }
    }
}

/// Where the head ends: at the first blank line (CRLF CRLF, or LF LF from
/// a lenient client).
fn find_head_end(head: &[u8]) -> Option<usize> {
    let crlf = head.windows(4).position(|w| w == b"\r\n\r\n");
    let lf = head.windows(2).position(|w| w == b"\n\n");
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The reply to a request head.
fn route(head: &[u8]) -> Reply {
    let Ok(head) = std::str::from_utf8(head) else {
        return BAD_REQUEST;
    };
    let line = head.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return BAD_REQUEST;
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return BAD_REQUEST;
    }
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    if path != METRICS_PATH {
        return NOT_FOUND;
    }
    if method != "GET" {
        return NOT_ALLOWED;
    }
    Reply::Metrics
}

async fn answer(
    mut stream: TcpStream,
    metrics: &Metrics,
    place: &PeerPlace,
    deadline_ms: u64,
) -> io::Result<()> {
    // A head already sent is read before an eviction is looked at.
    let head = tokio::select! {
        biased;
        head = read_head(&mut stream, deadline_ms) => head?,
        () = place.evicted() => return Ok(()),
    };
    place.answering();
    let reply = match head {
        Ok(head) => route(&head),
        Err(reply) => reply,
    };
    let (code, reason, content_type, body) = match reply {
        Reply::Metrics => {
            // Counted before rendering, so the response includes itself.
            metrics.requests().inc("200");
            // Writing to a String cannot fail; a collector that did is a
            // bug, said as such rather than as half a response.
            let plain = "text/plain; charset=utf-8";
            match metrics.render() {
                // A URL in a label (a source, an endpoint) shows redacted,
                // as on stderr.
                Ok(body) => match crate::remote::scrub(&body) {
                    std::borrow::Cow::Borrowed(_) => ("200", "OK", CONTENT_TYPE, body),
                    std::borrow::Cow::Owned(scrubbed) => ("200", "OK", CONTENT_TYPE, scrubbed),
                },
                Err(_) => (
                    "500",
                    "Internal Server Error",
                    plain,
                    "a bug in ringfeed: the metrics could not be written\n".into(),
                ),
            }
        }
        Reply::Status(code, reason) => {
            metrics.requests().inc(code);
            let body = match code {
                "404" => format!("not found: the metrics are at {METRICS_PATH}\n"),
                "405" => format!("{METRICS_PATH} answers GET only\n"),
                _ => format!("{reason}\n"),
            };
            (code, reason, "text/plain; charset=utf-8", body)
        }
    };
    let allow = if code == "405" { "Allow: GET\r\n" } else { "" };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        body.len()
    );
    let send = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.flush().await?;
        // Say we are done sending, so that the client sees the end of the
        // body even if it is still writing (a too-large request) when we
        // close.
        stream.shutdown().await
    };
    match timeout(Duration::from_millis(WRITE_TIMEOUT_MS), send).await {
        Ok(sent) => sent?,
        Err(_) => return Err(io::ErrorKind::TimedOut.into()),
    }
    if code != "200" {
        drain(&mut stream).await;
    }
    Ok(())
}

/// Reads what a refused client still sends (a little, briefly), so that
/// closing with unread bytes does not reset the connection and lose the
/// reply before the client reads it.
async fn drain(stream: &mut TcpStream) {
    let mut buf = [0u8; 4096];
    let read = async {
        let mut left = DRAIN_MAX_BYTES;
        while left > 0 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = timeout(Duration::from_millis(DRAIN_MS), read).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Instant;

    #[test]
    fn only_get_of_the_metrics_path_is_served() {
        assert_eq!(route(b"GET /metrics HTTP/1.1\r\nHost: x"), Reply::Metrics);
        assert_eq!(route(b"GET /metrics?x=1 HTTP/1.0"), Reply::Metrics);
        assert_eq!(route(b"GET / HTTP/1.1"), NOT_FOUND);
        assert_eq!(route(b"GET /metricsx HTTP/1.1"), NOT_FOUND);
        assert_eq!(route(b"POST /metrics HTTP/1.1"), NOT_ALLOWED);
        assert_eq!(route(b"HEAD /metrics HTTP/1.1"), NOT_ALLOWED);
        assert_eq!(route(b"GET /metrics"), BAD_REQUEST);
        assert_eq!(route(b"GET /metrics SPDY/3"), BAD_REQUEST);
        assert_eq!(route(b"\xff\xfe"), BAD_REQUEST);
    }

    #[test]
    fn the_head_ends_at_the_first_blank_line() {
        assert_eq!(
            find_head_end(b"GET / HTTP/1.1\r\nA: b\r\n\r\nbody"),
            Some(20)
        );
        assert_eq!(find_head_end(b"GET / HTTP/1.1\n\n"), Some(14));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n"), None);
    }

    #[test]
    fn addresses_are_checked_before_binding() {
        for bad in [
            "9464",
            ":9464",
            "127.0.0.1:99999",
            "127.0.0.1:x",
            "nonsense",
        ] {
            let e = MetricsServer::start(bad, "x").err();
            assert!(
                matches!(e, Some(BindError::NotAnAddress { .. })),
                "{bad}: {e:?}"
            );
        }
    }

    #[test]
    fn a_port_in_use_is_named_with_the_fix() {
        let taken = TcpListener::bind("127.0.0.1:0").map(|l| (l.local_addr(), l));
        let Ok((Ok(addr), _keep)) = taken else {
            panic!("cannot bind a test port");
        };
        let e = MetricsServer::start(&addr.to_string(), "x").err();
        let text = e.as_ref().map(ToString::to_string).unwrap_or_default();
        assert!(matches!(e, Some(BindError::InUse { .. })), "{text}");
        assert!(
            text.contains(&addr.to_string()) && text.contains("port 0"),
            "{text}"
        );
    }

    fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(request);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn a_real_socket_gets_the_exposition_and_the_right_statuses() {
        let server = MetricsServer::start("127.0.0.1:0", "t").unwrap();
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0);
        let ok = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
        let (head, body) = ok.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("Content-Length: {}\r\n", body.len())));
        assert!(body.contains("ringfeed_loader_state{state=\"starting\"} 1\n"));
        let missing = exchange(addr, b"GET /other HTTP/1.1\r\n\r\n");
        assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");
        let post = exchange(addr, b"POST /metrics HTTP/1.1\r\n\r\n");
        assert!(
            post.starts_with("HTTP/1.1 405 ") && post.contains("Allow: GET\r\n"),
            "{post}"
        );
        let huge = vec![b'a'; MAX_REQUEST_BYTES + 10];
        let big = exchange(addr, &huge);
        assert!(big.starts_with("HTTP/1.1 431 "), "{big}");
    }

    #[test]
    fn a_client_that_sends_nothing_is_dropped_after_the_deadline_and_others_are_served() {
        let server = MetricsServer::start("127.0.0.1:0", "t").unwrap();
        let addr = server.local_addr();
        let started = Instant::now();
        let _silent = TcpStream::connect(addr).unwrap();
        let ok = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 "), "{ok}");
        assert!(started.elapsed() < Duration::from_millis(REQUEST_DEADLINE_MS * 3));
    }

    #[test]
    fn dropping_the_server_stops_its_thread_and_frees_the_port() {
        let server = MetricsServer::start("127.0.0.1:0", "t").unwrap();
        let addr = server.local_addr();
        drop(server);
        assert!(TcpListener::bind(addr).is_ok());
    }

    #[test]
    fn a_scrape_answers_within_a_second_while_200_idle_connections_are_held_open() {
        let server = MetricsServer::start("127.0.0.1:0", "t").unwrap();
        let addr = server.local_addr();
        let idle: Vec<TcpStream> = (0..200)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        // Some of them half-way through a request, too.
        for s in idle.iter().step_by(2) {
            let mut s = s;
            s.write_all(b"GET /metr").unwrap();
        }
        let started = Instant::now();
        let ok = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        let took = started.elapsed();
        assert!(ok.starts_with("HTTP/1.1 200 "), "{ok}");
        assert!(took < Duration::from_secs(1), "the scrape took {took:?}");
        drop(idle);
    }

    #[test]
    fn a_client_that_sends_half_a_request_and_stops_is_cut_off_at_the_deadline() {
        let server = MetricsServer::start("127.0.0.1:0", "t").unwrap();
        let mut slow = TcpStream::connect(server.local_addr()).unwrap();
        slow.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let started = Instant::now();
        slow.write_all(b"GET /metrics HTTP/1.1\r\nHo").unwrap();
        let mut out = Vec::new();
        // Ends when the server closes the connection (or fails after 10 s).
        slow.read_to_end(&mut out).unwrap();
        let took = started.elapsed();
        let out = String::from_utf8_lossy(&out);
        assert!(out.starts_with("HTTP/1.1 408 "), "{out}");
        let deadline = Duration::from_millis(REQUEST_DEADLINE_MS);
        assert!(
            took >= deadline && took < deadline + Duration::from_secs(3),
            "cut off after {took:?}"
        );
    }

    #[test]
    fn connections_past_the_cap_wait_their_turn_and_are_then_served() {
        let server = MetricsServer::start("127.0.0.1:0", "t").unwrap();
        let addr = server.local_addr();
        let started = Instant::now();
        let idle: Vec<TcpStream> = (0..MAX_CONNECTIONS)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        // Every place is taken until the idle ones reach their deadline.
        let ok = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 "), "{ok}");
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(REQUEST_DEADLINE_MS * 3),
            "served after {took:?}"
        );
        drop(idle);
    }
}
