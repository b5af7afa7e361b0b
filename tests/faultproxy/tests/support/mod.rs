//! The test's own HTTP/1.1 server, a blocking client that times each response,
//! and the proxy binary as a child process.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Every socket read in these tests gives up after this, so a hang fails.
pub const READ_TIMEOUT_S: u64 = 20;
/// How long the proxy may take to start and write its port file.
pub const START_TIMEOUT_S: u64 = 20;

/// Byte `i` of every body the test server sends.
pub fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// A keep-alive HTTP/1.1 server: `GET /bytes/N` sends N pattern bytes,
/// `GET /chunked/N` the same in chunked coding, HEAD the head alone, PUT reads
/// the body and answers `got N`. It counts the requests it served.
pub struct Upstream {
    pub port: u16,
    pub requests: Arc<AtomicU64>,
}

impl Upstream {
    pub fn start() -> Upstream {
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

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

pub fn serve_upstream_connection(stream: TcpStream, requests: &AtomicU64) -> io::Result<()> {
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
pub struct Proxy {
    child: Option<Child>,
    pub port: u16,
    pub status_port: u16,
    _dir: tempfile::TempDir,
}

impl Proxy {
    pub fn start(upstream: &str, flags: &[&str]) -> Proxy {
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

    pub fn connect(&self) -> Client {
        Client::connect(self.port)
    }

    /// The counters from the status endpoint, as `"name":value` text.
    pub fn status(&self) -> String {
        let mut client = Client::connect(self.status_port);
        let response = client.request("GET", "/", b"").unwrap();
        String::from_utf8(response.body).unwrap()
    }

    pub fn counter(&self, name: &str) -> u64 {
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
    pub fn stop(mut self) -> String {
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

pub struct Response {
    pub status: u16,
    /// Header names lower-cased, values trimmed.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub head_after: Duration,
    pub done_after: Duration,
}

/// A blocking HTTP/1.1 client on one keep-alive connection.
pub struct Client {
    reader: BufReader<TcpStream>,
}

impl Client {
    pub fn connect(port: u16) -> Client {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(READ_TIMEOUT_S)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            reader: BufReader::with_capacity(1 << 20, stream),
        }
    }

    pub fn get(&mut self, path: &str) -> io::Result<Response> {
        self.request("GET", path, b"")
    }

    /// Sends one request and reads its response, which may be cut short.
    pub fn request(&mut self, method: &str, path: &str, body: &[u8]) -> io::Result<Response> {
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
        let mut headers = Vec::new();
        loop {
            let mut header = String::new();
            self.reader.read_line(&mut header)?;
            let lower = header.to_ascii_lowercase();
            if let Some((name, value)) = header.split_once(':') {
                headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
            }
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
            headers,
            body,
            head_after,
            done_after: started.elapsed(),
        })
    }
}

impl Response {
    /// The value of header `name` (lower case), if it came.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

pub fn expected_body(n: usize) -> Vec<u8> {
    (0..n).map(pattern).collect()
}

/// The fastest of several timings: load on the machine only ever adds to a
/// round trip, so the minimum is the figure that noise disturbs least.
pub fn fastest(values: impl Iterator<Item = Duration>) -> Duration {
    values.min().unwrap()
}

/// Held by the tests that time round trips, so that they do not run beside
/// each other (or beside the 48 MiB transfer) on a 2-core machine.
pub static TIMING: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn timing_alone() -> std::sync::MutexGuard<'static, ()> {
    TIMING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
