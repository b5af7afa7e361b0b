//! One client connection: its own upstream connection, two delay lines, and
//! two tasks that parse HTTP/1.1 framing on the way through. The request side
//! draws each request's fault and tells the response side, in order, what to
//! expect: a response to forward (with its fault) or one to make up.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::delay::{DelayLine, Ended, Item};
use crate::faults::{Bucket, Draws, Fault, FaultPlan};
use crate::http::{response_body, Body, BodyReader, Inbound, READ_CHUNK_BYTES};
use crate::stats::Stats;

/// A trickled body is sent in pieces this far apart.
const TRICKLE_INTERVAL_MS: u64 = 100;

/// What every connection shares.
pub struct Shared {
    /// The faults and their fractions.
    pub plan: FaultPlan,
    /// The counters.
    pub stats: Arc<Stats>,
    /// Where connections are forwarded.
    pub upstream: SocketAddr,
    /// The round trip added: each direction holds its pieces half of it.
    pub rtt: Duration,
    /// The `--rate` bucket.
    pub bucket: Bucket,
    /// `Retry-After` of the bucket's 503s.
    pub retry_after_s: Option<u64>,
    /// Print why each connection ended.
    pub verbose: bool,
}

/// What the response side does next, in request order.
enum Expected {
    /// Parse a response from the upstream to a `method` request and apply `fault`.
    Forwarded { method: String, fault: Fault },
    /// Send a made-up response with this status; `close`: then close.
    /// `rate_limited`: the --rate bucket was empty (answered after the
    /// whole round trip, as the store itself would).
    Made {
        method: String,
        status: u16,
        close: bool,
        rate_limited: bool,
    },
    /// The connection is not HTTP: forward the rest raw.
    Raw,
}

/// Serves one accepted client connection until both sides are done, it is
/// reset by a fault, or either side fails.
pub async fn serve(client: TcpStream, connection: u64, shared: Arc<Shared>) {
    Stats::add(&shared.stats.connections, 1);
    let upstream = match TcpStream::connect(shared.upstream).await {
        Ok(upstream) => upstream,
        Err(e) => return refuse(client, &shared, e).await,
    };
    // Small requests must not wait for Nagle: the delay is ours to add.
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (upstream_read, upstream_write) = upstream.into_split();
    let half_rtt = shared.rtt / 2;
    let (to_client, client_writer) =
        DelayLine::new(client_write, half_rtt, shared.stats.clone(), false);
    let (to_upstream, upstream_writer) =
        DelayLine::new(upstream_write, half_rtt, shared.stats.clone(), true);
    let (expect_tx, expect_rx) = mpsc::unbounded_channel();

    let mut tasks = JoinSet::new();
    tasks.spawn(async move { ("client writer", client_writer.await) });
    tasks.spawn(async move { ("upstream writer", upstream_writer.await) });
    let requests_shared = shared.clone();
    tasks.spawn(async move {
        let result = requests(
            Inbound::new(client_read),
            to_upstream,
            expect_tx,
            connection,
            &requests_shared,
        )
        .await;
        ("requests", result)
    });
    let responses_shared = shared.clone();
    tasks.spawn(async move {
        (
            "responses",
            responses(
                Inbound::new(upstream_read),
                to_client,
                expect_rx,
                &responses_shared,
            )
            .await,
        )
    });

    while let Some(joined) = tasks.join_next().await {
        let (task, result) = match joined {
            Ok(done) => done,
            // Aborted by us below: nothing to say.
            Err(e) if e.is_cancelled() => continue,
            Err(e) => {
                eprintln!("faultproxy: connection {connection}: a task panicked: {e}");
                tasks.abort_all();
                continue;
            }
        };
        let connection_over = match &result {
            Err(e) => {
                if shared.verbose {
                    eprintln!("faultproxy: connection {connection}: {task}: {e}");
                }
                true
            }
            // The client-bound direction closing (or resetting) ends the connection;
            // dropping the other tasks drops the read halves, which closes the sockets.
            Ok(_) => task == "client writer",
        };
        if connection_over {
            tasks.abort_all();
        }
    }
}

/// Answers a client whose upstream connection failed with a 502 that names it.
async fn refuse(mut client: TcpStream, shared: &Shared, error: io::Error) {
    Stats::add(&shared.stats.upstream_connect_errors, 1);
    let body = format!(
        "faultproxy: cannot connect to the upstream {}: {error}; start the server behind the proxy or fix --upstream\n",
        shared.upstream
    );
    let response = format!(
        "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.write_all(response.as_bytes()).await;
    let _ = client.shutdown().await;
}

/// The request side: parses each request, draws its fault, tells the response
/// side, and forwards it unless the proxy answers it itself.
async fn requests(
    mut inbound: Inbound,
    to_upstream: DelayLine,
    expect: mpsc::UnboundedSender<Expected>,
    connection: u64,
    shared: &Shared,
) -> io::Result<Ended> {
    let gone = || io::Error::new(io::ErrorKind::BrokenPipe, "the response side has ended");
    let mut draws = Draws::for_connection(shared.plan.seed, connection);
    let mut requests_seen = 0u64;
    // A new connection costs one more round trip, as a TCP handshake does on a real link.
    if !shared.rtt.is_zero() {
        tokio::time::sleep(shared.rtt).await;
    }
    loop {
        let head = match inbound.read_head(true).await {
            Ok(Some(head)) => head,
            Ok(None) => {
                to_upstream.send(Item::Shutdown).await?;
                return Ok(Ended::Closed);
            }
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                if shared.verbose {
                    eprintln!("faultproxy: connection {connection}: {e}; forwarding it raw");
                }
                Stats::add(&shared.stats.not_http_connections, 1);
                expect.send(Expected::Raw).map_err(|_| gone())?;
                return forward_raw(inbound, &to_upstream).await;
            }
            Err(e) => return Err(e),
        };
        Stats::add(&shared.stats.requests, 1);
        if requests_seen > 0 {
            Stats::add(&shared.stats.requests_on_reused_connections, 1);
        }
        requests_seen += 1;
        let method = head.method.clone();
        let mut body = BodyReader::new(head.body);
        // The draw is made for every request, so the faults of a seed do not
        // depend on which requests the bucket refused.
        let drawn = shared.plan.pick(&method, draws.next_unit());
        let applies = shared.plan.methods.is_empty()
            || shared
                .plan
                .methods
                .iter()
                .any(|m| m.eq_ignore_ascii_case(&method));
        let rate_limited = applies && !shared.bucket.admit();
        let fault = if rate_limited {
            Fault::Status(503)
        } else {
            drawn
        };
        match fault {
            Fault::Status(status) => {
                // A client waiting for 100-continue may never send the body it
                // announced, so its framing is lost: answer and close.
                let close = head.expect_continue && head.body != Body::Empty;
                expect
                    .send(Expected::Made {
                        method,
                        status,
                        close,
                        rate_limited,
                    })
                    .map_err(|_| gone())?;
                if close {
                    to_upstream.send(Item::Shutdown).await?;
                    return Ok(Ended::Closed);
                }
                while body.next_piece(&mut inbound).await?.is_some() {}
            }
            fault => {
                expect
                    .send(Expected::Forwarded { method, fault })
                    .map_err(|_| gone())?;
                to_upstream.send(Item::Data(head.raw)).await?;
                while let Some(piece) = body.next_piece(&mut inbound).await? {
                    to_upstream.send(Item::Data(piece)).await?;
                }
            }
        }
    }
}

/// Forwards everything left on `inbound` as it comes, then shuts the line down.
async fn forward_raw(mut inbound: Inbound, line: &DelayLine) -> io::Result<Ended> {
    let rest = inbound.take_buffered();
    if !rest.is_empty() {
        line.send(Item::Data(rest)).await?;
    }
    loop {
        let piece = inbound.take_some(READ_CHUNK_BYTES).await?;
        if piece.is_empty() {
            line.send(Item::Shutdown).await?;
            return Ok(Ended::Closed);
        }
        line.send(Item::Data(piece)).await?;
    }
}

/// The response side: for each request in order, forwards the upstream's
/// response with its fault applied, or sends the made-up one.
async fn responses(
    mut inbound: Inbound,
    to_client: DelayLine,
    mut expect: mpsc::UnboundedReceiver<Expected>,
    shared: &Shared,
) -> io::Result<Ended> {
    loop {
        let expected = tokio::select! {
            biased;
            expected = expect.recv() => expected,
            read = inbound.fill() => {
                if read? == 0 {
                    // The upstream closed an idle connection: so does the proxy.
                    None
                } else {
                    // Bytes before their request was seen stay buffered for it.
                    continue;
                }
            }
        };
        let close_after = match expected {
            None => true,
            Some(Expected::Raw) => return forward_raw(inbound, &to_client).await,
            Some(Expected::Made {
                method,
                status,
                close,
                rate_limited,
            }) => {
                let counter = match (rate_limited, status) {
                    (true, _) => &shared.stats.rate_limited,
                    (false, 503) => &shared.stats.injected_503,
                    (false, _) => &shared.stats.injected_429,
                };
                Stats::add(counter, 1);
                let (retry_after, extra) = match rate_limited {
                    true => (shared.retry_after_s, shared.rtt / 2),
                    false => (None, Duration::ZERO),
                };
                let response = made_up_response(&method, status, close, retry_after);
                to_client.send_after(Item::Data(response), extra).await?;
                close
            }
            Some(Expected::Forwarded { method, fault }) => {
                match forward_response(&mut inbound, &to_client, &method, fault, shared).await? {
                    Forwarded::Reset => return Ok(Ended::Reset),
                    Forwarded::Done { close } => close,
                }
            }
        };
        if close_after {
            to_client.send(Item::Shutdown).await?;
            return Ok(Ended::Closed);
        }
    }
}

/// How forwarding one response ended.
enum Forwarded {
    /// Complete; `close`: the upstream said it closes the connection after it.
    Done { close: bool },
    /// The client connection was reset mid-body (a fault).
    Reset,
}

async fn forward_response(
    inbound: &mut Inbound,
    to_client: &DelayLine,
    method: &str,
    fault: Fault,
    shared: &Shared,
) -> io::Result<Forwarded> {
    let stats = &shared.stats;
    let head = loop {
        let Some(head) = inbound.read_head(false).await? else {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the upstream closed without answering a request",
            ));
        };
        // Interim responses (100 Continue) go through; the final one follows.
        if (100..200).contains(&head.status) && head.status != 101 {
            to_client.send(Item::Data(head.raw)).await?;
            continue;
        }
        break head;
    };
    Stats::add(&stats.responses, 1);
    let body_framing = response_body(method, &head);
    let close = head.close || body_framing == Body::UntilClose;
    to_client.send(Item::Data(head.raw)).await?;
    let mut body = BodyReader::new(body_framing);
    match fault {
        Fault::StallAfterHeaders => {
            Stats::add(&stats.stalls, 1);
            tokio::time::sleep(shared.plan.stall_time).await;
        }
        Fault::Trickle => Stats::add(&stats.trickles, 1),
        Fault::ResetMidBody => {
            Stats::add(&stats.resets, 1);
            let mut left = match body_framing {
                Body::Length(n) => Some(n / 2),
                _ => None,
            };
            while left != Some(0) {
                let Some(piece) = body.next_piece(inbound).await? else {
                    break;
                };
                // Half of a fixed-length body, else half of its first piece.
                let take = left.map_or(piece.len() / 2, |n| n.min(piece.len() as u64) as usize);
                to_client.send(Item::Data(piece[..take].to_vec())).await?;
                left = Some(left.map_or(0, |n| n - take as u64));
            }
            to_client.send(Item::Reset).await?;
            return Ok(Forwarded::Reset);
        }
        Fault::None | Fault::Status(_) => {}
    }
    let trickle_piece_bytes =
        (shared.plan.trickle_bytes_per_s * TRICKLE_INTERVAL_MS / 1000).max(1) as usize;
    while let Some(piece) = body.next_piece(inbound).await? {
        if fault != Fault::Trickle {
            to_client.send(Item::Data(piece)).await?;
            continue;
        }
        for part in piece.chunks(trickle_piece_bytes) {
            to_client.send(Item::Data(part.to_vec())).await?;
            tokio::time::sleep(Duration::from_millis(TRICKLE_INTERVAL_MS)).await;
        }
    }
    Ok(Forwarded::Done { close })
}

/// The response the proxy sends for an injected status: an S3-style error body,
/// none for HEAD, and `Retry-After` when given.
fn made_up_response(method: &str, status: u16, close: bool, retry_after_s: Option<u64>) -> Vec<u8> {
    let (reason, code) = if status == 503 {
        ("Service Unavailable", "SlowDown")
    } else {
        ("Too Many Requests", "TooManyRequests")
    };
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>Please reduce your request rate (injected by faultproxy).</Message></Error>\n"
    );
    let connection = if close { "Connection: close\r\n" } else { "" };
    let retry_after = retry_after_s.map_or(String::new(), |s| format!("Retry-After: {s}\r\n"));
    let mut response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n{connection}{retry_after}\r\n",
        body.len()
    );
    if method != "HEAD" {
        response.push_str(&body);
    }
    response.into_bytes()
}
