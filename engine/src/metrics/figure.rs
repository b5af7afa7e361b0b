//! One family read at scrape time, written through prometheus-client's
//! encoder: the ring's, the remote source's and the data cache's figures
//! live in their owners' atomics and are read when a scrape comes (a
//! [`Collector`](prometheus_client::collector::Collector)), never copied per
//! batch, so they are written as the crate's constant counters and gauges.
//! The crate writes the `# HELP` and `# TYPE` lines, the escaping and the
//! numbers.

use std::fmt;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// What a family's samples mean, its `# TYPE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only ever goes up (it restarts from 0 with the process); its name
    /// ends in `_total`.
    Counter,
    /// A value now, up or down.
    Gauge,
}

/// A sample's value. Counts are written as integers, exactly (an f64 would
/// round counters past 2^53).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    /// A count, a size, a flag.
    Count(u64),
    /// Seconds, ratios: anything fractional.
    Real(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::Count(v)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::Count(u64::from(v))
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Count(u64::from(v))
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Real(v)
    }
}

/// The name to register a family under: prometheus-client writes a
/// counter's `_total` itself, so a counter's exposed name is given without
/// it (else it would be written `_total_total`).
pub fn registered_name(name: &str, kind: Kind) -> &str {
    match kind {
        Kind::Counter => name.strip_suffix("_total").unwrap_or(name),
        Kind::Gauge => name,
    }
}

/// The help text to register a metric with: `Registry::register` ends
/// every help text with a `.` of its own, so one that ends in `.` is given
/// without it (else it would be written `..`). A collector's family, written
/// by [`family`], keeps its help text as it is.
pub fn registered_help(help: &str) -> &str {
    help.strip_suffix('.').unwrap_or(help)
}

/// Starts family `name` (its exposed name: a counter's ends in `_total`):
/// its `# HELP` and `# TYPE` lines. Its samples follow with [`sample`].
pub fn family<'a>(
    encoder: &'a mut DescriptorEncoder<'_>,
    name: &'a str,
    help: &str,
    kind: Kind,
) -> Result<MetricEncoder<'a>, fmt::Error> {
    let metric_type = match kind {
        Kind::Counter => MetricType::Counter,
        Kind::Gauge => MetricType::Gauge,
    };
    encoder.encode_descriptor(registered_name(name, kind), help, None, metric_type)
}

/// Writes one sample of a family of `kind` into `encoder` (the family's,
/// or one label set's from `MetricEncoder::encode_family`).
pub fn sample(encoder: MetricEncoder<'_>, kind: Kind, value: Value) -> fmt::Result {
    match (kind, value) {
        (Kind::Counter, Value::Count(v)) => ConstCounter::new(v).encode(encoder),
        (Kind::Counter, Value::Real(v)) => ConstCounter::new(v).encode(encoder),
        (Kind::Gauge, Value::Count(v)) => ConstGauge::new(v).encode(encoder),
        (Kind::Gauge, Value::Real(v)) => ConstGauge::new(v).encode(encoder),
    }
}

/// A family of one sample: `name value`.
pub fn single(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    kind: Kind,
    value: impl Into<Value>,
) -> fmt::Result {
    sample(family(encoder, name, help, kind)?, kind, value.into())
}
