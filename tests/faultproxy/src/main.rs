//! faultproxy: a TCP forwarder for ringfeed's remote-source tests. In front of
//! an object-store or WebDAV server on 127.0.0.1 it adds a round-trip time
//! without capping throughput, and injects HTTP faults (503, 429, resets
//! mid-body, stalls after the headers, trickles) into a chosen fraction of
//! requests, the same ones for the same `--seed` and traffic. See
//! tests/servers/README.md.

mod conn;
mod delay;
mod faults;
mod http;
mod stats;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

use crate::faults::FaultPlan;
use crate::stats::Stats;

/// How often the status file is rewritten.
const STATUS_FILE_INTERVAL_MS: u64 = 200;
/// Largest request read by the status endpoint.
const STATUS_REQUEST_BYTES_MAX: usize = 8192;
/// Pause after a failed accept (out of file descriptors), so as not to spin.
const ACCEPT_RETRY_MS: u64 = 50;
/// Worker threads of the runtime: the machines it runs on have 2 cores.
const WORKER_THREADS: usize = 2;

/// Forward TCP connections to an HTTP/1.1 server, adding latency and faults.
#[derive(Parser, Debug)]
#[command(name = "faultproxy", version)]
struct Args {
    /// Address to listen on (port 0: a free one, printed and written to --port-file).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// The server behind the proxy, HOST:PORT.
    #[arg(long)]
    upstream: String,
    /// Round-trip time added, in ms: each piece of data in each direction is
    /// held half of it (pieces do not wait for each other), and a new
    /// connection costs one more round trip, as its handshake would.
    #[arg(long, default_value_t = 0)]
    rtt_ms: u64,
    /// Fraction of requests the proxy answers 503 SlowDown itself.
    #[arg(long, default_value_t = 0.0)]
    error_503: f64,
    /// Fraction of requests the proxy answers 429 itself.
    #[arg(long, default_value_t = 0.0)]
    error_429: f64,
    /// Fraction of responses whose connection is reset (RST) after half the body.
    #[arg(long, default_value_t = 0.0)]
    reset: f64,
    /// Fraction of responses that stall for --stall-ms after their headers.
    #[arg(long, default_value_t = 0.0)]
    stall: f64,
    /// How long a stalled response waits after its headers, in ms.
    #[arg(long, default_value_t = 10_000)]
    stall_ms: u64,
    /// Fraction of responses whose body is sent at --trickle-bytes-per-s.
    #[arg(long, default_value_t = 0.0)]
    trickle: f64,
    /// Rate of a trickled body, in bytes per second.
    #[arg(long, default_value_t = 16_384)]
    trickle_bytes_per_s: u64,
    /// Admit at most this many requests per second, all connections together
    /// (a token bucket, as S3 throttles a prefix), answering the rest
    /// `503 SlowDown` after one round trip without forwarding them; 0: no limit.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Tokens the --rate bucket holds (a burst it lets through at once);
    /// default: a tenth of a second of the rate, at least 1.
    #[arg(long)]
    rate_burst: Option<f64>,
    /// Seconds sent as `Retry-After` on the 503s of --rate (default: none, as S3).
    #[arg(long)]
    retry_after_s: Option<u64>,
    /// Apply faults only to these methods (comma-separated, e.g. GET,HEAD); default: all.
    #[arg(long, value_delimiter = ',')]
    methods: Vec<String>,
    /// Seed of the fault draws: the same seed and traffic give the same faults.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also serve the counters as JSON over HTTP on this address (port 0: a free one).
    #[arg(long)]
    status_listen: Option<String>,
    /// Keep the counters as JSON in this file (rewritten every 200 ms and at exit).
    #[arg(long)]
    status_file: Option<PathBuf>,
    /// Write the listening port (and the status port on a second line) to this file.
    #[arg(long)]
    port_file: Option<PathBuf>,
    /// Print why each connection ended.
    #[arg(long)]
    verbose: bool,
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .enable_all()
        .build();
    let result = match runtime {
        Ok(runtime) => runtime.block_on(run(args)),
        Err(e) => Err(anyhow!("cannot start the tokio runtime: {e}")),
    };
    if let Err(e) = result {
        eprintln!("faultproxy: {e:#}");
        std::process::exit(2);
    }
}

async fn run(args: Args) -> Result<()> {
    let plan = FaultPlan {
        error_503: args.error_503,
        error_429: args.error_429,
        reset: args.reset,
        stall: args.stall,
        trickle: args.trickle,
        stall_time: Duration::from_millis(args.stall_ms),
        trickle_bytes_per_s: args.trickle_bytes_per_s,
        methods: args
            .methods
            .iter()
            .map(|m| m.trim().to_ascii_uppercase())
            .collect(),
        seed: args.seed,
    };
    plan.validate().map_err(|e| anyhow!(e))?;
    let bucket = faults::Bucket::new(args.rate, args.rate_burst).map_err(|e| anyhow!(e))?;
    let upstream: SocketAddr = tokio::net::lookup_host(&args.upstream)
        .await
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| {
            anyhow!(
                "cannot resolve --upstream {:?}: give HOST:PORT, e.g. 127.0.0.1:9000",
                args.upstream
            )
        })?;
    let listener = TcpListener::bind(&args.listen).await.with_context(|| {
        format!(
            "cannot listen on --listen {}: pick a free port or 127.0.0.1:0",
            args.listen
        )
    })?;
    let port = listener.local_addr()?.port();
    let stats = Arc::new(Stats::default());

    let mut status_port = None;
    if let Some(addr) = &args.status_listen {
        let status_listener = TcpListener::bind(addr).await.with_context(|| {
            format!("cannot listen on --status-listen {addr}: pick a free port or 127.0.0.1:0")
        })?;
        status_port = Some(status_listener.local_addr()?.port());
        tokio::spawn(serve_status(status_listener, stats.clone()));
    }
    if let Some(path) = &args.port_file {
        let text = match status_port {
            Some(status) => format!("{port}\n{status}\n"),
            None => format!("{port}\n"),
        };
        write_atomically(path, &text)
            .with_context(|| format!("cannot write --port-file {}", path.display()))?;
    }
    if let Some(path) = args.status_file.clone() {
        tokio::spawn(keep_status_file(path, stats.clone()));
    }
    let status_text = status_port
        .map(|p| format!(", status http://127.0.0.1:{p}/"))
        .unwrap_or_default();
    println!("faultproxy listening on 127.0.0.1:{port}, forwarding to {upstream}{status_text}");
    let _ = std::io::stdout().flush();

    let shared = Arc::new(conn::Shared {
        plan,
        stats: stats.clone(),
        upstream,
        rtt: Duration::from_millis(args.rtt_ms),
        bucket,
        retry_after_s: args.retry_after_s,
        verbose: args.verbose,
    });
    let mut terminate =
        signal(SignalKind::terminate()).context("cannot install a SIGTERM handler")?;
    let mut interrupt =
        signal(SignalKind::interrupt()).context("cannot install a SIGINT handler")?;
    let mut connection = 0u64;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    tokio::spawn(conn::serve(client, connection, shared.clone()));
                    connection += 1;
                }
                // Out of file descriptors and the like: say so, wait a little
                // (connections may close meanwhile), go on.
                Err(e) => {
                    eprintln!("faultproxy: accept failed: {e}; retrying in {ACCEPT_RETRY_MS} ms");
                    tokio::time::sleep(Duration::from_millis(ACCEPT_RETRY_MS)).await;
                }
            },
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }
    println!("{}", stats.summary_line());
    let _ = std::io::stdout().flush();
    if let Some(path) = &args.status_file {
        write_atomically(path, &stats.to_json())
            .with_context(|| format!("cannot write --status-file {}", path.display()))?;
    }
    Ok(())
}

/// Answers every request on the status listener with the counters as JSON.
async fn serve_status(listener: TcpListener, stats: Arc<Stats>) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            continue;
        };
        let stats = stats.clone();
        tokio::spawn(async move {
            let mut request = Vec::with_capacity(1024);
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n")
                && request.len() < STATUS_REQUEST_BYTES_MAX
            {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let body = stats.to_json() + "\n";
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        });
    }
}

/// Rewrites the status file while the proxy runs.
async fn keep_status_file(path: PathBuf, stats: Arc<Stats>) {
    let mut last = String::new();
    loop {
        let json = stats.to_json();
        if json != last {
            if let Err(e) = write_atomically(&path, &json) {
                eprintln!(
                    "faultproxy: cannot write --status-file {}: {e}",
                    path.display()
                );
            }
            last = json;
        }
        tokio::time::sleep(Duration::from_millis(STATUS_FILE_INTERVAL_MS)).await;
    }
}

/// Writes `text` to a temporary file beside `path` and renames it over `path`,
/// so a reader never sees half a file.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}
