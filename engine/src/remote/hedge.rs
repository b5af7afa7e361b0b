//! When a GET is slow enough to ask again: the recent latency of GETs of
//! about its size, and a budget that keeps hedges to a few percent.
//!
//! A GET whose attempt has run past `HEDGE_MULTIPLE` times the recent 95th
//! percentile of answered attempts of its size class (at least
//! `HEDGE_AFTER_MIN_MS`), and that `HEDGE_OVERTAKEN_MIN` GETs sent after it
//! have overtaken (or that has run `HEDGE_LONE_MULTIPLE` times that long),
//! is asked again; the first complete answer wins and the
//! other is cancelled (the dispatcher, `dispatch.rs`, does this). A
//! class needs `HEDGE_SAMPLES_MIN` answers before it hedges at all, and
//! each hedge spends one token of a budget that earns `HEDGE_FRACTION` of
//! a token per answered GET (at most `HEDGE_BURST` kept): hedges stay
//! under about 5% of GETs whatever the latency does.

use std::time::Duration;

/// Latencies kept per size class: the recent distribution.
pub const LATENCY_SAMPLES: usize = 256;
/// Answers a size class needs before its GETs are hedged.
pub const HEDGE_SAMPLES_MIN: usize = 32;
/// A GET is hedged after this multiple of its class's recent p95...
pub const HEDGE_MULTIPLE: f64 = 2.0;
/// ...and never sooner than this.
pub const HEDGE_AFTER_MIN_MS: u64 = 25;
/// Tokens of the hedge budget earned per answered GET.
pub const HEDGE_FRACTION: f64 = 0.05;
/// Most tokens the budget keeps (hedges in a burst).
pub const HEDGE_BURST: f64 = 16.0;
/// A GET is hedged only once at least this many GETs sent after it have
/// been answered: when every GET is slow (the store, the link, this
/// machine), none is an outlier, and asking again would only add load.
pub const HEDGE_OVERTAKEN_MIN: u64 = 8;
/// A GET that nothing sent after it could overtake (the last of a run) is
/// hedged after this multiple of its wait instead.
pub const HEDGE_LONE_MULTIPLE: u32 = 4;
/// Hedges of one GET at most (the k-th after k times the wait).
pub const HEDGES_PER_GET_MAX: u32 = 2;
/// Parts longer than this are not hedged (a hedge holds its body in memory
/// until it wins or loses).
pub const HEDGE_PART_BYTES_MAX: u64 = 8 << 20;
/// Bytes of hedges in flight at most.
pub const HEDGE_BYTES_IN_FLIGHT_MAX: u64 = 64 << 20;
/// Recompute a class's threshold after this many new samples.
const RECOMPUTE_EVERY: u32 = 16;
/// Size classes: parts up to 16 KiB, then each 4 times larger.
const CLASSES: usize = 10;

/// The size class of a part of `len_bytes`.
pub fn size_class(len_bytes: u64) -> usize {
    let mut class = 0;
    let mut bound: u64 = 16 << 10;
    while len_bytes > bound && class + 1 < CLASSES {
        bound = bound.saturating_mul(4);
        class += 1;
    }
    class
}

/// The last `LATENCY_SAMPLES` answered attempts of one size class.
#[derive(Clone, Debug, Default)]
struct Class {
    samples_us: Vec<u32>,
    next: usize,
    since_recompute: u32,
    hedge_after_us: Option<u64>,
}

impl Class {
    fn record(&mut self, us: u64) {
        let us = us.min(u64::from(u32::MAX)) as u32;
        if self.samples_us.len() < LATENCY_SAMPLES {
            self.samples_us.push(us);
        } else {
            self.samples_us[self.next] = us;
        }
        self.next = (self.next + 1) % LATENCY_SAMPLES;
        self.since_recompute += 1;
        if self.samples_us.len() >= HEDGE_SAMPLES_MIN
            && (self.hedge_after_us.is_none() || self.since_recompute >= RECOMPUTE_EVERY)
        {
            self.since_recompute = 0;
            let mut sorted = self.samples_us.clone();
            sorted.sort_unstable();
            let p95 = u64::from(sorted[(sorted.len() - 1) * 95 / 100]);
            let after = ((p95 as f64) * HEDGE_MULTIPLE) as u64;
            self.hedge_after_us = Some(after.max(HEDGE_AFTER_MIN_MS * 1000));
        }
    }
}

/// Latency by size class and the hedge budget of one fetch engine.
#[derive(Clone, Debug)]
pub struct Hedging {
    classes: Vec<Class>,
    tokens: f64,
}

impl Default for Hedging {
    fn default() -> Hedging {
        Hedging {
            classes: vec![Class::default(); CLASSES],
            tokens: 0.0,
        }
    }
}

impl Hedging {
    /// An attempt of a part of `len_bytes` was answered in `took`: it
    /// joins its class's recent latencies and earns the budget its share.
    pub fn answered(&mut self, len_bytes: u64, took: Duration) {
        self.classes[size_class(len_bytes)].record(took.as_micros() as u64);
        self.tokens = (self.tokens + HEDGE_FRACTION).min(HEDGE_BURST);
    }

    /// How long an attempt of a part of `len_bytes` may run before it is
    /// hedged; `None` while its class has too few answers, or for a part
    /// too long to hedge.
    pub fn hedge_after(&self, len_bytes: u64) -> Option<Duration> {
        if len_bytes > HEDGE_PART_BYTES_MAX {
            return None;
        }
        self.classes[size_class(len_bytes)]
            .hedge_after_us
            .map(Duration::from_micros)
    }

    /// Spends one token if there is one.
    pub fn try_spend(&mut self) -> bool {
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Gives back a token spent on a hedge that could not start.
    pub fn refund(&mut self) {
        self.tokens = (self.tokens + 1.0).min(HEDGE_BURST);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_grow_by_four() {
        assert_eq!(size_class(0), 0);
        assert_eq!(size_class(16 << 10), 0);
        assert_eq!(size_class((16 << 10) + 1), 1);
        assert_eq!(size_class(64 << 10), 1);
        assert_eq!(size_class(8 << 20), 5);
        assert_eq!(size_class(u64::MAX), CLASSES - 1);
    }

    #[test]
    fn a_class_hedges_after_twice_its_p95_once_it_has_enough_answers() {
        let mut h = Hedging::default();
        for i in 0..(HEDGE_SAMPLES_MIN - 1) as u64 {
            h.answered(8192, Duration::from_millis(10 + i % 10));
        }
        assert_eq!(h.hedge_after(8192), None, "too few answers yet");
        h.answered(8192, Duration::from_millis(12));
        let after = h.hedge_after(8192).unwrap();
        assert!(
            (Duration::from_millis(36)..=Duration::from_millis(40)).contains(&after),
            "{after:?}"
        );
        // Another class knows nothing yet; a long part is never hedged.
        assert_eq!(h.hedge_after(1 << 20), None);
        assert_eq!(h.hedge_after(HEDGE_PART_BYTES_MAX + 1), None);
        // Fast answers: the floor.
        for _ in 0..LATENCY_SAMPLES {
            h.answered(100, Duration::from_micros(300));
        }
        assert_eq!(
            h.hedge_after(100),
            Some(Duration::from_millis(HEDGE_AFTER_MIN_MS))
        );
    }

    #[test]
    fn the_budget_allows_one_hedge_per_twenty_answers_after_its_burst() {
        let mut h = Hedging::default();
        assert!(!h.try_spend(), "no hedge before any answer");
        for _ in 0..10_000 {
            h.answered(8192, Duration::from_millis(10));
        }
        let burst = std::iter::from_fn(|| h.try_spend().then_some(())).count();
        assert_eq!(burst, HEDGE_BURST as usize);
        let mut hedges = 0;
        for _ in 0..1000 {
            h.answered(8192, Duration::from_millis(10));
            if h.try_spend() {
                hedges += 1;
            }
        }
        assert!((49..=50).contains(&hedges), "{hedges}");
    }
}
