//! Metrics for Prometheus: `ringfeed serve --metrics ADDR` answers
//! `GET /metrics` with the text exposition format 0.0.4.
//!
//! Two sources make one response:
//! - the ring's own counters ([`ring`]), read from the segment the way
//!   `ringfeed stat` reads them: per-rank waits, batches and bytes
//!   delivered, queue depths, reads in flight;
//! - the loader's in-process figures ([`registry`]), declared below
//!   in `catalog!` (listed in [`IN_PROCESS`]), one line each, and updated
//!   with one relaxed atomic.
//!
//! [`http`] is a small HTTP/1.1 responder on its own thread (connections
//! served concurrently, each with a deadline); it only reads
//! atomics, so it can never block or slow the loader's loop. Every metric is
//! documented in docs/metrics.md (a test checks that none is missing).

pub mod cache;
pub mod http;
pub mod registry;
pub mod remote;
pub mod ring;
pub mod text;

pub use cache::{watch_cache, CacheFigure};
pub use http::{BindError, MetricsServer};
pub use registry::{Collect, Counter, CounterVec, Gauge, Histogram, LATENCY_BUCKETS_SECONDS};
pub use remote::{watch_remote, RemoteFigure};

use crate::ring::observer::Snapshot;
use text::Exposition;

/// Declares the in-process metrics: each entry is one `static`, and the
/// list [`IN_PROCESS`] that a scrape writes out gets it too, so adding a
/// figure is one line here plus its updates where it happens.
macro_rules! catalog {
    ($($(#[$doc:meta])* $vis:vis static $id:ident: $ty:ty = $init:expr;)*) => {
        $($(#[$doc])* $vis static $id: $ty = $init;)*
        /// Every in-process metric, in exposition order.
        pub static IN_PROCESS: &[&dyn Collect] = &[$(&$id),*];
    };
}

/// Status codes the endpoint answers with, as `code` label values.
pub const HTTP_CODES: [&str; 6] = ["200", "400", "404", "405", "408", "431"];

// More figures come here, one line each. The remote source's (`RemoteFigure`) are read at scrape time from its
// `RemoteMetrics`, registered with `watch_remote`.
catalog! {
    /// Requests the metrics endpoint answered, by status code.
    pub static HTTP_REQUESTS_TOTAL: CounterVec<6> = CounterVec::new("ringfeed_metrics_requests_total", "Requests the metrics endpoint answered, by HTTP status code.", "code", HTTP_CODES);
    /// Remote source: GETs in flight now.
    pub static REMOTE_GETS_IN_FLIGHT: RemoteFigure = RemoteFigure::gauge("ringfeed_remote_gets_in_flight", "GETs (parts of reads) of the remote source in flight now.", |s| s.gets_in_flight as f64);
    /// Remote source: the fetch window.
    pub static REMOTE_WINDOW: RemoteFigure = RemoteFigure::gauge("ringfeed_remote_window", "Most GETs the remote fetch engine lets be in flight now (its adaptive window).", |s| s.window as f64);
    /// Remote source: body bytes received.
    pub static REMOTE_BYTES_TOTAL: RemoteFigure = RemoteFigure::counter("ringfeed_remote_received_bytes_total", "Body bytes received from the remote source (a retried range counts again).", |s| s.bytes_received as f64);
    /// Remote source: HTTP attempts.
    pub static REMOTE_ATTEMPTS_TOTAL: RemoteFigure = RemoteFigure::counter("ringfeed_remote_requests_total", "HTTP requests made to the remote source, every attempt and retry.", |s| s.attempts as f64);
    /// Remote source: retries by cause.
    pub static REMOTE_RETRIES_TOTAL: RemoteFigure = RemoteFigure::retries("ringfeed_remote_retries_total", "Ranges the remote fetch engine fetched again, by cause.");
    /// Remote source: median GET latency.
    pub static REMOTE_GET_P50: RemoteFigure = RemoteFigure::gauge("ringfeed_remote_get_p50_seconds", "Median time of a GET, first attempt to last byte (within a factor of two).", |s| remote::seconds_of_us(s.get_latency_us_p50));
    /// Remote source: 99th percentile GET latency.
    pub static REMOTE_GET_P99: RemoteFigure = RemoteFigure::gauge("ringfeed_remote_get_p99_seconds", "99th percentile time of a GET, first attempt to last byte (within a factor of two).", |s| remote::seconds_of_us(s.get_latency_us_p99));
    /// Data cache: reads served from it.
    pub static CACHE_HITS_TOTAL: CacheFigure = CacheFigure::counter("ringfeed_cache_hits_total", "Reads served from the disk data cache.", |s| &s.hits);
    /// Data cache: reads served from remote.
    pub static CACHE_MISSES_TOTAL: CacheFigure = CacheFigure::counter("ringfeed_cache_misses_total", "Reads of a cached remote source served from the remote store (not in the cache).", |s| &s.misses);
    /// Data cache: bytes read from it.
    pub static CACHE_READ_BYTES_TOTAL: CacheFigure = CacheFigure::counter("ringfeed_cache_read_bytes_total", "Bytes read from the disk data cache.", |s| &s.bytes_from_cache);
    /// Data cache: bytes read from remote.
    pub static CACHE_MISS_BYTES_TOTAL: CacheFigure = CacheFigure::counter("ringfeed_cache_miss_bytes_total", "Bytes of a cached remote source read from the remote store.", |s| &s.bytes_from_remote);
    /// Data cache: bytes used.
    pub static CACHE_USED_BYTES: CacheFigure = CacheFigure::gauge("ringfeed_cache_size_bytes", "Bytes the data cache directory holds, all loaders sharing it together.", |s| &s.used_bytes);
    /// Data cache: this loader's limit.
    pub static CACHE_LIMIT_BYTES: CacheFigure = CacheFigure::gauge("ringfeed_cache_limit_bytes", "Most bytes this loader lets the data cache hold (--cache-size or its default).", |s| &s.limit_bytes);
    /// Data cache: full.
    pub static CACHE_FULL: CacheFigure = CacheFigure::gauge("ringfeed_cache_full", "1 once the data cache refused an object for want of room (it keeps what it holds), else 0.", |s| &s.fill_complete);
    /// Data cache: entries written.
    pub static CACHE_WRITTEN_TOTAL: CacheFigure = CacheFigure::counter("ringfeed_cache_entries_written_total", "Entries this loader wrote to the data cache.", |s| &s.entries_written);
    /// Data cache: corrupt entries refetched.
    pub static CACHE_CORRUPT_TOTAL: CacheFigure = CacheFigure::counter("ringfeed_cache_corrupt_total", "Cache entries whose bytes failed their CRC32C, removed and refetched from remote.", |s| &s.corrupt_refetched);
    /// Data cache: writes stopped.
    pub static CACHE_WRITES_STOPPED: CacheFigure = CacheFigure::gauge("ringfeed_cache_writes_stopped", "1 once a write to the data cache failed (disk full, permissions) and caching stopped for the run, else 0.", |s| &s.writes_stopped);
}

/// The whole response body for loader `name`: the ring's families from
/// `snapshot` (None before the ring exists), then the in-process ones.
pub fn render(name: &str, snapshot: Option<&Snapshot>) -> String {
    let mut out = Exposition::new();
    ring::collect(name, snapshot, &mut out);
    for m in IN_PROCESS {
        m.collect(&mut out);
    }
    out.into_string()
}

/// Every family name a response can hold.
pub fn family_names() -> Vec<&'static str> {
    let mut names = ring::family_names();
    names.extend(IN_PROCESS.iter().map(|m| m.name()));
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_name_follows_prometheus_conventions() {
        let names = family_names();
        for name in &names {
            assert!(text::is_metric_name(name), "{name}");
            assert!(name.starts_with("ringfeed_"), "{name} lacks the prefix");
            // Units are base units, never ms or MB.
            for bad in ["_ms", "_millis", "_mb", "_kb", "_ns", "_us"] {
                assert!(!name.contains(bad), "{name}: use seconds or bytes");
            }
        }
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "a family name twice: {names:?}");
    }

    #[test]
    fn counters_and_only_counters_end_in_total() {
        let body = render(
            "x",
            Some(&Snapshot {
                ranks: vec![Default::default()],
                ..Snapshot::default()
            }),
        );
        for line in body.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
            let (name, kind) = line.split_once(' ').unwrap_or((line, ""));
            assert_eq!(name.ends_with("_total"), kind == "counter", "{line}");
        }
    }

    #[test]
    fn every_metric_is_documented_in_docs_metrics_md() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md");
        let docs = std::fs::read_to_string(path).unwrap_or_default();
        for name in family_names() {
            assert!(
                docs.contains(&format!("`{name}`")),
                "{name} is not in {path}"
            );
        }
    }

    #[test]
    fn a_response_starts_with_the_ring_and_ends_with_the_in_process_figures() {
        let body = render("x", None);
        assert!(body.starts_with("# HELP ringfeed_loader_state "));
        assert!(body.contains("# TYPE ringfeed_metrics_requests_total counter\n"));
        assert!(body.ends_with('\n'));
    }
}
