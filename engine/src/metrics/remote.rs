//! The remote engine's figures in a scrape: read at scrape time from the
//! `RemoteMetrics` of the loader's remote source ([`watch_remote`]), so the
//! fetch engine counts with its own relaxed atomics and nothing is copied
//! per batch. A loader of a local directory writes none of these families.

use std::sync::{Arc, OnceLock};

use super::registry::Collect;
use super::text::{Exposition, Kind};
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
    One(fn(&MetricsSnapshot) -> f64),
    /// Retries, one sample per `RetryCause`.
    Retries,
}

/// One family read from the watched `RemoteMetrics`.
pub struct RemoteFigure {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    read: Read,
}

impl RemoteFigure {
    /// A gauge: `read` of the snapshot.
    pub const fn gauge(
        name: &'static str,
        help: &'static str,
        read: fn(&MetricsSnapshot) -> f64,
    ) -> RemoteFigure {
        RemoteFigure {
            name,
            help,
            kind: Kind::Gauge,
            read: Read::One(read),
        }
    }

    /// A counter (its name ends in `_total`): `read` of the snapshot.
    pub const fn counter(
        name: &'static str,
        help: &'static str,
        read: fn(&MetricsSnapshot) -> f64,
    ) -> RemoteFigure {
        RemoteFigure {
            name,
            help,
            kind: Kind::Counter,
            read: Read::One(read),
        }
    }

    /// The retries of the fetch engine, labelled `cause`.
    pub const fn retries(name: &'static str, help: &'static str) -> RemoteFigure {
        RemoteFigure {
            name,
            help,
            kind: Kind::Counter,
            read: Read::Retries,
        }
    }
}

impl Collect for RemoteFigure {
    fn name(&self) -> &'static str {
        self.name
    }

    fn collect(&self, out: &mut Exposition) {
        let Some(snapshot) = remote_snapshot() else {
            return;
        };
        out.family(self.name, self.kind, self.help);
        match self.read {
            Read::One(read) => out.sample(self.name, &[], read(&snapshot)),
            Read::Retries => {
                for cause in RetryCause::ALL {
                    out.sample(
                        self.name,
                        &[("cause", cause_label(cause))],
                        snapshot.retries[cause.index()],
                    );
                }
            }
        }
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
        "remote: {} requests, {} received, retries: {}, GET p50 {:.1} ms, p99 {:.1} ms",
        s.attempts,
        crate::ring::segment::human_bytes(s.bytes_received),
        if retries.is_empty() {
            "none".to_owned()
        } else {
            retries.join(", ")
        },
        s.get_latency_us_p50 as f64 / 1e3,
        s.get_latency_us_p99 as f64 / 1e3
    ))
}
