//! The loader's own figures, kept in process: counters, gauges, counters by
//! one label, histograms. Each is a `static` built by a `const fn` and
//! updated with one relaxed atomic operation, from any thread (the loader's
//! loop, a tokio worker), never a lock or an allocation; a scrape reads them
//! through [`Collect`]. Adding one is one line in `metrics::catalog!`.
//!
//! They use `std`'s atomics, not the ring's `sync` facade: loom's cannot be
//! built in a `const fn`, and nothing here is a protocol loom must check
//! (each figure is one independent cell, read with no ordering promise).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::metrics::text::{write_f64, Exposition, Kind};

/// Something a scrape writes out: one family, HELP and TYPE included.
pub trait Collect: Sync {
    /// The family's name.
    fn name(&self) -> &'static str;
    /// Writes the family into `out`.
    fn collect(&self, out: &mut Exposition);
}

/// A count that only goes up.
#[derive(Debug)]
pub struct Counter {
    name: &'static str,
    help: &'static str,
    value: AtomicU64,
}

impl Counter {
    /// A counter at 0. `name` ends in `_total`.
    pub const fn new(name: &'static str, help: &'static str) -> Counter {
        Counter {
            name,
            help,
            value: AtomicU64::new(0),
        }
    }

    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }

    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.value.fetch_add(n, Ordering::Relaxed);
    }

    /// The count now.
    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

impl Collect for Counter {
    fn name(&self) -> &'static str {
        self.name
    }

    fn collect(&self, out: &mut Exposition) {
        out.family(self.name, Kind::Counter, self.help);
        out.sample(self.name, &[], self.get());
    }
}

/// A value now: requests in flight, bytes held.
#[derive(Debug)]
pub struct Gauge {
    name: &'static str,
    help: &'static str,
    value: AtomicI64,
}

impl Gauge {
    /// A gauge at 0.
    pub const fn new(name: &'static str, help: &'static str) -> Gauge {
        Gauge {
            name,
            help,
            value: AtomicI64::new(0),
        }
    }

    /// Adds `n` (negative to lower it).
    pub fn add(&self, n: i64) {
        self.value.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds one (a request starts).
    pub fn inc(&self) {
        self.add(1);
    }

    /// Takes one away (a request ends).
    pub fn dec(&self) {
        self.add(-1);
    }

    /// Sets it.
    pub fn set(&self, v: i64) {
        self.value.store(v, Ordering::Relaxed);
    }

    /// The value now.
    pub fn get(&self) -> i64 {
        self.value.load(Ordering::Relaxed)
    }
}

impl Collect for Gauge {
    fn name(&self) -> &'static str {
        self.name
    }

    fn collect(&self, out: &mut Exposition) {
        out.family(self.name, Kind::Gauge, self.help);
        out.sample(self.name, &[], self.get());
    }
}

/// The label value a [`CounterVec`] counts what it was not declared with
/// under, so that a count is never lost (a bug, caught in debug builds).
pub const OTHER_LABEL_VALUE: &str = "other";

/// Counters by one label whose values are known up front (retries by
/// cause, responses by status code): `N` cells, no map, no lock.
#[derive(Debug)]
pub struct CounterVec<const N: usize> {
    name: &'static str,
    help: &'static str,
    label: &'static str,
    values: [&'static str; N],
    counts: [AtomicU64; N],
    other: AtomicU64,
}

impl<const N: usize> CounterVec<N> {
    /// Counters at 0, one per value of `label`.
    pub const fn new(
        name: &'static str,
        help: &'static str,
        label: &'static str,
        values: [&'static str; N],
    ) -> CounterVec<N> {
        CounterVec {
            name,
            help,
            label,
            values,
            counts: [const { AtomicU64::new(0) }; N],
            other: AtomicU64::new(0),
        }
    }

    /// Adds `n` to the counter of label value `value`.
    pub fn add(&self, value: &str, n: u64) {
        let cell = match self.values.iter().position(|v| *v == value) {
            Some(i) => &self.counts[i],
            None => {
                debug_assert!(
                    false,
                    "{}: {value:?} is not a declared {} value",
                    self.name, self.label
                );
                &self.other
            }
        };
        cell.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds one to the counter of `value`.
    pub fn inc(&self, value: &str) {
        self.add(value, 1);
    }

    /// The count of `value` now (of [`OTHER_LABEL_VALUE`]: what came under
    /// no declared value).
    pub fn get(&self, value: &str) -> u64 {
        match self.values.iter().position(|v| *v == value) {
            Some(i) => self.counts[i].load(Ordering::Relaxed),
            None if value == OTHER_LABEL_VALUE => self.other.load(Ordering::Relaxed),
            None => 0,
        }
    }
}

impl<const N: usize> Collect for CounterVec<N> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn collect(&self, out: &mut Exposition) {
        out.family(self.name, Kind::Counter, self.help);
        // Every declared value, zeros too: a series that appears only on
        // its first event makes rate() miss that event.
        for (value, count) in self.values.iter().zip(&self.counts) {
            out.sample(
                self.name,
                &[(self.label, value)],
                count.load(Ordering::Relaxed),
            );
        }
        let other = self.other.load(Ordering::Relaxed);
        if other > 0 {
            out.sample(self.name, &[(self.label, OTHER_LABEL_VALUE)], other);
        }
    }
}

/// Bucket bounds for request latencies, in seconds: 1 ms to 30 s.
pub const LATENCY_BUCKETS_SECONDS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
];

/// Durations counted in buckets of increasing upper bounds, in seconds.
/// Each bucket cell counts only its own range; the cumulative `le` counts
/// are summed at scrape time, and `_count` is their sum with the overflow
/// cell, so the +Inf bucket always equals `_count` even mid-update.
#[derive(Debug)]
pub struct Histogram<const B: usize> {
    name: &'static str,
    help: &'static str,
    bounds_seconds: [f64; B],
    buckets: [AtomicU64; B],
    overflow: AtomicU64,
    sum_ns: AtomicU64,
}

impl<const B: usize> Histogram<B> {
    /// An empty histogram. `name` ends in `_seconds`; `bounds_seconds`
    /// increase (a test of the catalog checks it).
    pub const fn new(
        name: &'static str,
        help: &'static str,
        bounds_seconds: [f64; B],
    ) -> Histogram<B> {
        Histogram {
            name,
            help,
            bounds_seconds,
            buckets: [const { AtomicU64::new(0) }; B],
            overflow: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }

    /// Counts one duration.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let cell = match self.bounds_seconds.iter().position(|b| secs <= *b) {
            Some(i) => &self.buckets[i],
            None => &self.overflow,
        };
        cell.fetch_add(1, Ordering::Relaxed);
        // Past u64::MAX ns (584 years in all) the sum saturates, not wraps.
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .sum_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                Some(s.saturating_add(ns))
            });
    }

    /// Whether the bounds strictly increase and are finite.
    pub fn bounds_are_valid(&self) -> bool {
        self.bounds_seconds.iter().all(|b| b.is_finite())
            && self.bounds_seconds.windows(2).all(|w| w[0] < w[1])
    }
}

impl<const B: usize> Collect for Histogram<B> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn collect(&self, out: &mut Exposition) {
        out.family(self.name, Kind::Histogram, self.help);
        let bucket = format!("{}_bucket", self.name);
        let mut cumulative = 0u64;
        let mut le = String::new();
        for (bound, cell) in self.bounds_seconds.iter().zip(&self.buckets) {
            cumulative = cumulative.saturating_add(cell.load(Ordering::Relaxed));
            le.clear();
            write_f64(&mut le, *bound);
            out.sample(&bucket, &[("le", &le)], cumulative);
        }
        let count = cumulative.saturating_add(self.overflow.load(Ordering::Relaxed));
        out.sample(&bucket, &[("le", "+Inf")], count);
        let sum_seconds = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        out.sample(&format!("{}_sum", self.name), &[], sum_seconds);
        out.sample(&format!("{}_count", self.name), &[], count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(c: &dyn Collect) -> String {
        let mut e = Exposition::new();
        c.collect(&mut e);
        e.into_string()
    }

    #[test]
    fn a_counter_counts_and_writes_its_total() {
        let c = Counter::new("t_total", "Things.");
        c.inc();
        c.add(41);
        assert_eq!(c.get(), 42);
        assert_eq!(
            text(&c),
            "# HELP t_total Things.\n# TYPE t_total counter\nt_total 42\n"
        );
    }

    #[test]
    fn a_gauge_goes_up_and_down_below_zero_too() {
        let g = Gauge::new("g", "Now.");
        g.inc();
        g.inc();
        g.dec();
        assert_eq!(g.get(), 1);
        g.set(-3);
        assert!(text(&g).ends_with("\ng -3\n"));
    }

    #[test]
    fn a_counter_vec_writes_every_declared_value_zeros_included() {
        let c = CounterVec::new("r_total", "Retries.", "cause", ["timeout", "throttled"]);
        c.add("throttled", 2);
        assert_eq!(c.get("throttled"), 2);
        assert_eq!(
            text(&c),
            "# HELP r_total Retries.\n# TYPE r_total counter\nr_total{cause=\"timeout\"} 0\nr_total{cause=\"throttled\"} 2\n"
        );
    }

    #[test]
    #[cfg(not(debug_assertions))]
    fn a_counter_vec_counts_an_undeclared_value_under_other_in_release() {
        let c = CounterVec::new("r_total", "Retries.", "cause", ["timeout"]);
        c.inc("typo");
        assert_eq!(c.get(OTHER_LABEL_VALUE), 1);
        assert!(text(&c).ends_with("r_total{cause=\"other\"} 1\n"));
    }

    #[test]
    fn a_histogram_writes_cumulative_buckets_sum_and_count() {
        let h = Histogram::new("l_seconds", "Latency.", [0.01, 0.1, 1.0]);
        assert!(h.bounds_are_valid());
        for ms in [5, 10, 50, 2_000] {
            h.observe(Duration::from_millis(ms));
        }
        assert_eq!(
            text(&h),
            "# HELP l_seconds Latency.\n# TYPE l_seconds histogram\n\
             l_seconds_bucket{le=\"0.01\"} 2\n\
             l_seconds_bucket{le=\"0.1\"} 3\n\
             l_seconds_bucket{le=\"1\"} 3\n\
             l_seconds_bucket{le=\"+Inf\"} 4\n\
             l_seconds_sum 2.065\n\
             l_seconds_count 4\n"
        );
    }

    #[test]
    fn histogram_bounds_that_do_not_increase_are_caught() {
        assert!(!Histogram::new("h", "", [0.1, 0.1]).bounds_are_valid());
        assert!(!Histogram::new("h", "", [1.0, f64::INFINITY]).bounds_are_valid());
        assert!(Histogram::new("h", "", LATENCY_BUCKETS_SECONDS).bounds_are_valid());
    }

    #[test]
    fn figures_updated_from_many_threads_lose_nothing() {
        static C: Counter = Counter::new("c_total", "");
        static H: Histogram<2> = Histogram::new("h_seconds", "", [0.001, 1.0]);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        C.inc();
                        H.observe(Duration::from_micros(10));
                    }
                });
            }
        });
        assert_eq!(C.get(), 40_000);
        assert!(text(&H).contains("h_seconds_count 40000\n"));
    }
}
