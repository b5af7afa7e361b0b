//! The remote engine's figures in a scrape: read at scrape time from the
//! `RemoteMetrics` of the loader's remote source ([`watch_remote`]), so the
//! fetch engine counts with its own relaxed atomics and nothing is copied
//! per batch. A loader of a local directory writes none of these families.

use std::fmt;
use std::sync::{Arc, OnceLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use super::figure::{family, sample, Kind, Value};
use crate::remote::{MetricsSnapshot, RemoteMetrics, RetryCause};

/// The remote source's counters, once a loader of one registered them.
static WATCHED: OnceLock<Arc<RemoteMetrics>> = OnceLock::new();

/// Makes scrapes show `metrics` (a loader's remote source). The first call
/// wins: one loader process serves one source.
pub fn watch_remote(metrics: Arc<RemoteMetrics>) {
    // A second source in one process keeps the first one's figures.
    let _ = WATCHED.set(metrics);
}

/// The figures now, if a remote source is watched.
pub fn remote_snapshot() -> Option<MetricsSnapshot> {
    WATCHED.get().map(|m| m.snapshot())
}

/// How a figure is read from a snapshot.
#[derive(Clone, Copy)]
enum Read {
    /// One value.
    One(fn(&MetricsSnapshot) -> Value),
    /// Retries, one sample per `RetryCause`, labelled `cause`.
    Retries,
}

/// One family read from the watched `RemoteMetrics`.
struct RemoteFigure {
    name: &'static str,
    kind: Kind,
    help: &'static str,
    read: Read,
}

/// The remote source's families, in exposition order. One line each to add.
#[rustfmt::skip]
const FIGURES: &[RemoteFigure] = &[
    RemoteFigure { name: "ringfeed_remote_gets_in_flight", kind: Kind::Gauge, help: "GETs (parts of reads) of the remote source in flight now.", read: Read::One(|s| s.gets_in_flight.into()) },
    RemoteFigure { name: "ringfeed_remote_window", kind: Kind::Gauge, help: "Most GETs the remote fetch engine lets be in flight now (its adaptive window).", read: Read::One(|s| s.window.into()) },
    RemoteFigure { name: "ringfeed_remote_received_bytes_total", kind: Kind::Counter, help: "Body bytes received from the remote source (a retried range counts again).", read: Read::One(|s| s.bytes_received.into()) },
    RemoteFigure { name: "ringfeed_remote_requests_total", kind: Kind::Counter, help: "HTTP requests made to the remote source, every attempt and retry.", read: Read::One(|s| s.attempts.into()) },
    RemoteFigure { name: "ringfeed_remote_retries_total", kind: Kind::Counter, help: "Ranges the remote fetch engine fetched again, by cause.", read: Read::Retries },
    RemoteFigure { name: "ringfeed_remote_get_p50_seconds", kind: Kind::Gauge, help: "Median time of a GET, first attempt to last byte (within a factor of two).", read: Read::One(|s| seconds_of_us(s.get_latency_us_p50).into()) },
    RemoteFigure { name: "ringfeed_remote_rate_limit", kind: Kind::Gauge, help: "Most GETs per second the store's admission controller lets start now (0: no limit, the store has not throttled).", read: Read::One(|s| s.rate_limit_per_s.into()) },
    RemoteFigure { name: "ringfeed_remote_rate_cuts_total", kind: Kind::Counter, help: "Times the store throttled (503 SlowDown or 429) and the rate limit was cut.", read: Read::One(|s| s.rate_cuts.into()) },
    RemoteFigure { name: "ringfeed_remote_hedges_total", kind: Kind::Counter, help: "GETs asked again because the first was slower than twice the recent p95 of its size (hedged requests).", read: Read::One(|s| s.hedges.into()) },
    RemoteFigure { name: "ringfeed_remote_hedges_won_total", kind: Kind::Counter, help: "Hedged requests whose answer came first and was used (the slow GET was cancelled).", read: Read::One(|s| s.hedges_won.into()) },
    RemoteFigure { name: "ringfeed_remote_get_p99_seconds", kind: Kind::Gauge, help: "99th percentile time of a GET, first attempt to last byte (within a factor of two).", read: Read::One(|s| seconds_of_us(s.get_latency_us_p99).into()) },
];

/// Every family name [`RemoteFigures`] can write, for the tests and the docs.
pub fn family_names() -> impl Iterator<Item = &'static str> {
    FIGURES.iter().map(|f| f.name)
}

/// The remote source's families, read at each scrape from the watched
/// `RemoteMetrics` (none while no remote source is watched).
#[derive(Debug)]
pub struct RemoteFigures;

impl Collector for RemoteFigures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let Some(snapshot) = remote_snapshot() else {
            return Ok(());
        };
        for f in FIGURES {
            let mut fam = family(&mut encoder, f.name, f.help, f.kind)?;
            match f.read {
                Read::One(read) => sample(fam, f.kind, read(&snapshot))?,
                Read::Retries => {
                    for cause in RetryCause::ALL {
                        let n = snapshot.retries[cause.index()];
                        let labels = [("cause", cause_label(cause))];
                        sample(fam.encode_family(&labels)?, f.kind, n.into())?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// A retry cause as a label value (Prometheus style: no spaces).
fn cause_label(cause: RetryCause) -> &'static str {
    match cause {
        RetryCause::Throttled => "throttled",
        RetryCause::ServerError => "server_error",
        RetryCause::Connect => "connect",
        RetryCause::Stall => "stall",
        RetryCause::BodyInterrupted => "body_interrupted",
        RetryCause::Timeout => "timeout",
        RetryCause::Other => "other",
    }
}

/// Microseconds as seconds.
pub fn seconds_of_us(us: u64) -> f64 {
    us as f64 / 1e6
}

/// One line of the watched remote source's figures for the loader's last
/// words, or None for a local source.
pub fn summary_line() -> Option<String> {
    let s = remote_snapshot()?;
    let retries: Vec<String> = RetryCause::ALL
        .iter()
        .filter(|c| s.retries[c.index()] > 0)
        .map(|&c| format!("{} {}", cause_label(c), s.retries[c.index()]))
        .collect();
    Some(format!(
        "remote: {} requests, {} received, retries: {}, GET p50 {:.1} ms, p99 {:.1} ms{}{}",
        s.attempts,
        crate::ring::segment::human_bytes(s.bytes_received),
        if retries.is_empty() {
            "none".to_owned()
        } else {
            retries.join(", ")
        },
        s.get_latency_us_p50 as f64 / 1e3,
        s.get_latency_us_p99 as f64 / 1e3,
        throttle_words(&s),
        hedge_words(&s),
    ))
}

/// `, rate limit N GETs/s (cut K times)` once the store throttled, else nothing.
pub fn throttle_words(s: &MetricsSnapshot) -> String {
    if s.rate_cuts == 0 {
        return String::new();
    }
    format!(
        ", rate limit {} GETs/s (cut {} times)",
        s.rate_limit_per_s, s.rate_cuts
    )
}

/// `, hedges N (K won)` once a GET was hedged, else nothing.
pub fn hedge_words(s: &MetricsSnapshot) -> String {
    if s.hedges == 0 {
        return String::new();
    }
    format!(", hedges {} ({} won)", s.hedges, s.hedges_won)
}
