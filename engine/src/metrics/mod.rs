//! Metrics for Prometheus: `ringfeed serve --metrics ADDR` answers
//! `GET /metrics` with the text exposition format 0.0.4, written by the
//! Prometheus project's Rust client, `prometheus-client` (its
//! `prometheus_text` encoder).
//!
//! [`Metrics`] is the crate's `Registry`, built once per endpoint:
//! - the ring's own counters ([`ring`]), read from the segment the way
//!   `ringfeed stat` reads them: per-rank waits, batches and bytes
//!   delivered, queue depths, reads in flight;
//! - the endpoint's own requests by status code ([`Requests`]), a
//!   `Family` of the crate's counters;
//! - the remote source's and the data cache's figures ([`remote`],
//!   [`cache`]), read from their atomics when a scrape comes.
//!
//! Each of the first and the last is a `Collector` that reads its figures
//! at scrape time ([`figure`]), so nothing is copied per batch.
//! [`http`] is a small HTTP/1.1 responder on its own thread (connections
//! served concurrently, each with a deadline); it only reads atomics, so it
//! can never block or slow the loader's loop. Every metric is documented in
//! docs/metrics.md (a test checks that none is missing).

pub mod cache;
pub mod figure;
pub mod http;
mod peers;
pub mod remote;
pub mod ring;

pub use cache::watch_cache;
pub use http::{BindError, MetricsServer};
pub use remote::watch_remote;

use std::fmt;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::ring::observer::Snapshot;
use figure::{registered_help, registered_name, Kind};

/// The Content-Type of a response: the text exposition format 0.0.4, which
/// every Prometheus (and the Python client's parser) reads.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Status codes the endpoint answers with, as `code` label values: each is
/// written from the first scrape on, at 0 until it happens.
pub const HTTP_CODES: [&str; 6] = ["200", "400", "404", "405", "408", "431"];

/// The family of [`Requests`].
pub const REQUESTS_NAME: &str = "ringfeed_metrics_requests_total";
const REQUESTS_HELP: &str = "Requests the metrics endpoint answered, by HTTP status code.";

/// One `code` label.
type CodeLabel = [(&'static str, &'static str); 1];

/// Requests the metrics endpoint answered, by status code. Clones count
/// into the same counters.
#[derive(Clone, Debug)]
pub struct Requests(Family<CodeLabel, Counter>);

impl Requests {
    /// Counters at 0, one for each of [`HTTP_CODES`].
    pub fn new() -> Requests {
        let family = Family::default();
        for code in HTTP_CODES {
            // Every declared code, zeros too: a series that appears only on
            // its first event makes rate() miss that event.
            let _ = family.get_or_create(&[("code", code)]);
        }
        Requests(family)
    }

    /// Counts one answer with status `code`.
    pub fn inc(&self, code: &'static str) {
        self.0.get_or_create(&[("code", code)]).inc();
    }

    /// The count of answers with status `code` now.
    pub fn get(&self, code: &'static str) -> u64 {
        self.0.get_or_create(&[("code", code)]).get()
    }
}

impl Default for Requests {
    fn default() -> Requests {
        Requests::new()
    }
}

/// Everything a scrape of one loader writes: a prometheus-client
/// `Registry`, built once.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Requests,
}

impl Metrics {
    /// The registry of loader `name`, whose ring `read_ring` snapshots
    /// (None before the ring exists: the state says `starting`).
    pub fn new(
        name: &str,
        read_ring: impl Fn() -> Option<Snapshot> + Send + Sync + 'static,
    ) -> Metrics {
        let requests = Requests::new();
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ring::RingFigures::new(name, read_ring)));
        // A registry writes its own metrics before its collectors: the rest
        // go in a sub-registry (no prefix, no labels) so that the ring's
        // families come first, as in `ringfeed stat`.
        let rest = registry.sub_registry_with_labels(std::iter::empty());
        rest.register(
            registered_name(REQUESTS_NAME, Kind::Counter),
            registered_help(REQUESTS_HELP),
            requests.0.clone(),
        );
        rest.register_collector(Box::new(remote::RemoteFigures));
        rest.register_collector(Box::new(cache::CacheFigures));
        Metrics { registry, requests }
    }

    /// The endpoint's requests, counted by status code.
    pub fn requests(&self) -> &Requests {
        &self.requests
    }

    /// The whole response body now. An error is a collector's that failed
    /// to write (writing to a `String` itself cannot fail).
    pub fn render(&self) -> Result<String, fmt::Error> {
        let mut out = String::new();
        prometheus_text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Every family name a response can hold, as exposed.
pub fn family_names() -> Vec<&'static str> {
    let mut names = ring::family_names();
    names.push(REQUESTS_NAME);
    names.extend(remote::family_names());
    names.extend(cache::family_names());
    names
}

/// The exposition of `collector` alone, for the tests.
#[cfg(test)]
pub(crate) fn text_of(collector: impl prometheus_client::collector::Collector) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(collector));
    let mut out = String::new();
    let written = prometheus_text::encode(&mut out, &registry);
    assert!(written.is_ok(), "{written:?}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `name` is a valid metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
    fn is_metric_name(name: &str) -> bool {
        let mut chars = name.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }

    fn body(snapshot: Option<Snapshot>) -> String {
        let m = Metrics::new("x", move || snapshot.clone());
        let out = m.render();
        assert!(out.is_ok(), "{out:?}");
        out.unwrap_or_default()
    }

    #[test]
    fn every_family_name_follows_prometheus_conventions() {
        let names = family_names();
        for name in &names {
            assert!(is_metric_name(name), "{name}");
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
        let body = body(Some(Snapshot {
            ranks: vec![Default::default()],
            ..Snapshot::default()
        }));
        let mut types = 0;
        for line in body.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
            let (name, kind) = line.split_once(' ').unwrap_or((line, ""));
            assert_eq!(name.ends_with("_total"), kind == "counter", "{line}");
            types += 1;
        }
        assert!(types > 20, "{body}");
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
        let body = body(None);
        assert!(body.starts_with("# HELP ringfeed_loader_state "), "{body}");
        assert!(body.contains("# TYPE ringfeed_metrics_requests_total counter\n"));
        assert!(!body.contains("EOF"), "{body}");
        assert!(body.ends_with('\n'));
    }

    #[test]
    fn every_status_code_is_written_from_the_start_and_counts() {
        let m = Metrics::new("x", || None);
        m.requests().inc("404");
        m.requests().inc("404");
        assert_eq!(m.requests().get("404"), 2);
        let body = m.render().unwrap_or_default();
        assert!(body.contains("# HELP ringfeed_metrics_requests_total Requests the metrics endpoint answered, by HTTP status code.\n"), "{body}");
        for code in HTTP_CODES {
            let n = if code == "404" { 2 } else { 0 };
            let line = format!("ringfeed_metrics_requests_total{{code=\"{code}\"}} {n}\n");
            assert!(body.contains(&line), "no {line:?} in\n{body}");
        }
    }

    #[test]
    fn the_content_type_is_the_classic_text_format() {
        assert_eq!(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
    }
}
