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
//! [`http`] is a small HTTP/1.1 responder on its own thread; it only reads
//! atomics, so it can never block or slow the loader's loop. Every metric is
//! documented in docs/metrics.md (a test checks that none is missing).

pub mod http;
pub mod registry;
pub mod ring;
pub mod text;

pub use http::{BindError, MetricsServer};
pub use registry::{Collect, Counter, CounterVec, Gauge, Histogram, LATENCY_BUCKETS_SECONDS};

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

// The remote figures come here, one line each, e.g.:
//   pub static REMOTE_GETS_IN_FLIGHT: Gauge = Gauge::new("ringfeed_remote_gets_in_flight", "...");
//   pub static REMOTE_RETRIES_TOTAL: CounterVec<4> = CounterVec::new("ringfeed_remote_retries_total", "...", "cause", ["timeout", "throttled", "server_error", "connection"]);
//   pub static CACHE_HITS_TOTAL: Counter = Counter::new("ringfeed_cache_hits_total", "...");
//   pub static REMOTE_GET_SECONDS: Histogram<12> = Histogram::new("ringfeed_remote_get_seconds", "...", LATENCY_BUCKETS_SECONDS);
catalog! {
    /// Requests the metrics endpoint answered, by status code.
    pub static HTTP_REQUESTS_TOTAL: CounterVec<6> = CounterVec::new("ringfeed_metrics_requests_total", "Requests the metrics endpoint answered, by HTTP status code.", "code", HTTP_CODES);
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
