//! Admission of GETs to one store (one endpoint and bucket): how many may
//! be in flight (the window) and how fast new ones may start (the rate
//! limit), both adaptive, shared by every fetch engine of the process that
//! reads that store.
//!
//! - **The window** starts at `SLOW_START_WINDOW` and grows by one per GET
//!   answered up to `FetchConfig::window_initial` (slow start: it doubles
//!   each round trip), then by about 1/16 per window of answers up to
//!   `window_max`. A connection refused halves it (at most once per round
//!   trip: a refusal of a GET sent before the last cut does not cut again).
//! - **The rate limit** is off until the store throttles (HTTP 503 SlowDown
//!   or 429). The first throttle sets it to `RATE_ANCHOR_FACTOR` times the
//!   goodput the store gave this loader over the last `GOODPUT_WINDOW_MS`:
//!   just under its share of what the store admits now, however many other
//!   loaders share it (the 503s of GETs sent before that are the same
//!   storm, and do not cut again). Then it is AIMD per answer: each GET
//!   answered while the limit binds adds `RATE_STEP_PER_ANSWER` GETs/s,
//!   each throttle takes `RATE_CUT_PER_THROTTLE` of it (never below
//!   `RATE_FLOOR_OF_GOODPUT` of the goodput). Loaders of one store see the
//!   same fraction of 503s, so they settle at the same rate, with the store
//!   kept just over its limit: busy, refusing a few GETs in a hundred. New
//!   GETs, retries and hedges all take a token, paced with a burst of
//!   `PACING_BURST_MS` of the rate: a throttled GET is retried from this
//!   budget, not on top of it.
//! - **Retry-After** on a throttle pauses every new GET of the store until
//!   then (at most `RETRY_AFTER_MAX_MS`), plus a jitter of up to a tenth,
//!   so loaders that were told the same time do not come back at once.
//!
//! Why a rate and not only a window: S3 throttles a prefix by requests per
//! second (5,500 GETs), and a loader's share of that is small: 64 loaders
//! get 86 GETs/s each, 1.7 in flight at 20 ms. A window moves in steps of
//! one GET, 60% of that share; a rate moves smoothly. docs/remote.md,
//! "Many loaders, one store", has the simulation (bench/admission_sim.rs).
//!
//! [`Controller`] is the logic, with time passed in (a simulation drives
//! it with its own clock); [`Admission`] shares one behind a lock and wakes
//! dispatchers waiting for room.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// The window a store's first GETs start from (slow start up to
/// `FetchConfig::window_initial`): a loader that starts against a throttled
/// store sends this many GETs in its first round trip, not hundreds.
pub const SLOW_START_WINDOW: usize = 32;
/// The first throttle sets the rate limit to this fraction of the goodput
/// measured (what the store gave this loader over `GOODPUT_WINDOW_MS`).
pub const RATE_ANCHOR_FACTOR: f64 = 0.9;
/// Each later throttle cuts the rate limit by this fraction...
pub const RATE_CUT_PER_THROTTLE: f64 = 0.1;
/// ...but never below this fraction of the goodput measured: a burst of
/// 503s (another loader started) does not cut it to nothing.
pub const RATE_FLOOR_OF_GOODPUT: f64 = 0.7;
/// Each GET answered while the rate limit binds raises it by this many
/// GETs/s. Every loader of a store sees the same fraction of 503s, so all
/// settle at the same rate, about `RATE_STEP_PER_ANSWER / (fraction
/// refused * RATE_CUT_PER_THROTTLE)`: fair shares, with about 6 requests of
/// 100 refused at a share of 86 GETs/s (64 loaders on one S3 prefix) and 1
/// in 100 at 400.
pub const RATE_STEP_PER_ANSWER: f64 = 0.5;
/// The window goodput is measured over (shorter at the start of a run).
pub const GOODPUT_WINDOW_MS: u64 = 500;
/// The rate limit never goes below this (requests/s).
pub const RATE_MIN_PER_S: f64 = 1.0;
/// Tokens of the rate limit kept for a burst: this long of the rate (at
/// least two GETs), so a dispatcher woken a millisecond late catches up.
pub const PACING_BURST_MS: u64 = 20;
/// The longest Retry-After honoured; a longer one is cut to this.
pub const RETRY_AFTER_MAX_MS: u64 = 60_000;
/// A connection refused multiplies the window by this.
pub const WINDOW_CUT_FACTOR: f64 = 0.5;
/// The rate limit counts as binding this long after a GET waited for it.
const BOUND_RECENTLY_MS: u64 = 100;
/// Buckets of the goodput measure (`GOODPUT_WINDOW_MS` / this = bucket length).
const GOODPUT_BUCKETS: usize = 50;

/// The window's limits, from `FetchConfig`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowLimits {
    /// The end of slow start.
    pub initial: usize,
    /// Never below this (a refusal halves it down to here).
    pub min: usize,
    /// Never above this.
    pub max: usize,
}

/// Whether a GET may start now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Yes: it took a slot (and a token); end it with [`Controller::done`].
    Go,
    /// The window is full: ask again when a GET ends.
    Full,
    /// Not before this (the rate limit's next token, or a Retry-After).
    Until(Instant),
}

/// How a GET that was admitted ended, as the controller sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Answered: a status other than 429/503 came back (its body landed, or
    /// it failed for another reason the store is not to blame for).
    Answered,
    /// HTTP 503 or 429, with its Retry-After if it had one.
    Throttled {
        /// The wait the store asked for.
        retry_after: Option<Duration>,
    },
    /// The connection could not be made (refused, or reset before a response).
    Refused,
    /// It failed in another way (5xx, a stall, a broken body).
    Failed,
    /// It was cancelled (a hedge lost, or the engine stopped).
    Cancelled,
}

/// The limits now, for `stat` and /metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Limits {
    /// Most GETs in flight.
    pub window: usize,
    /// Most GETs started per second; `None` until the store throttles.
    pub rate_per_s: Option<f64>,
    /// GETs in flight now.
    pub in_flight: usize,
    /// Times a throttle cut the rate limit.
    pub rate_cuts: u64,
    /// Times a refusal cut the window.
    pub window_cuts: u64,
}

/// Successes per bucket of time, over the last `GOODPUT_WINDOW_MS`.
#[derive(Clone, Debug)]
struct Goodput {
    bucket_us: u64,
    counts: [u32; GOODPUT_BUCKETS],
    /// Absolute bucket number of the newest bucket.
    newest: u64,
}

impl Goodput {
    fn new() -> Goodput {
        Goodput {
            bucket_us: GOODPUT_WINDOW_MS * 1000 / GOODPUT_BUCKETS as u64,
            counts: [0; GOODPUT_BUCKETS],
            newest: 0,
        }
    }

    fn advance(&mut self, bucket: u64) {
        if bucket <= self.newest {
            return;
        }
        let steps = (bucket - self.newest).min(GOODPUT_BUCKETS as u64);
        for k in 1..=steps {
            let slot = ((self.newest + k) % GOODPUT_BUCKETS as u64) as usize;
            self.counts[slot] = 0;
        }
        self.newest = bucket;
    }

    fn add(&mut self, since_start: Duration) {
        let bucket = since_start.as_micros() as u64 / self.bucket_us;
        self.advance(bucket);
        let slot = (self.newest % GOODPUT_BUCKETS as u64) as usize;
        self.counts[slot] = self.counts[slot].saturating_add(1);
    }

    /// Successes per second over the window, or over the time since the
    /// start if that is shorter.
    fn per_s(&mut self, since_start: Duration) -> f64 {
        let bucket = since_start.as_micros() as u64 / self.bucket_us;
        self.advance(bucket);
        let total: u64 = self.counts.iter().map(|&c| u64::from(c)).sum();
        let span_us =
            (since_start.as_micros() as u64).clamp(self.bucket_us, GOODPUT_WINDOW_MS * 1000);
        total as f64 * 1e6 / span_us as f64
    }
}

/// The admission logic of one store, with time passed in.
#[derive(Clone, Debug)]
pub struct Controller {
    limits: WindowLimits,
    started: Instant,
    window: f64,
    ssthresh: f64,
    in_flight: usize,
    window_cut_at: Instant,
    rate: Option<f64>,
    tokens: f64,
    refilled_at: Instant,
    rate_cut_at: Instant,
    /// When the first throttle set the rate limit.
    anchored_at: Instant,
    bound_at: Option<Instant>,
    paused_until: Option<Instant>,
    goodput: Goodput,
    rate_cuts: u64,
    window_cuts: u64,
    jitter_state: u64,
}

impl Controller {
    /// A controller at `now`, its jitter drawn from `seed`.
    pub fn new(limits: WindowLimits, now: Instant, seed: u64) -> Controller {
        let min = limits.min.max(1);
        let max = limits.max.max(min);
        let initial = limits.initial.clamp(min, max);
        let limits = WindowLimits { initial, min, max };
        Controller {
            limits,
            started: now,
            window: SLOW_START_WINDOW.clamp(min, initial) as f64,
            ssthresh: initial as f64,
            in_flight: 0,
            window_cut_at: now,
            rate: None,
            tokens: 0.0,
            refilled_at: now,
            rate_cut_at: now,
            anchored_at: now,
            bound_at: None,
            paused_until: None,
            goodput: Goodput::new(),
            rate_cuts: 0,
            window_cuts: 0,
            jitter_state: seed,
        }
    }

    /// Whether a GET may start at `now`; `Go` takes a slot and a token.
    pub fn try_admit(&mut self, now: Instant) -> Admit {
        if let Some(until) = self.paused_until {
            if now < until {
                return Admit::Until(until);
            }
            self.paused_until = None;
        }
        if self.in_flight >= self.window as usize {
            return Admit::Full;
        }
        if let Some(rate) = self.rate {
            self.refill(now, rate);
            if self.tokens < 1.0 {
                self.bound_at = Some(now);
                let wait_s = (1.0 - self.tokens) / rate;
                return Admit::Until(now + Duration::from_secs_f64(wait_s.min(1.0)));
            }
            self.tokens -= 1.0;
        }
        self.in_flight += 1;
        Admit::Go
    }

    fn refill(&mut self, now: Instant, rate: f64) {
        let dt = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        let burst = (rate * PACING_BURST_MS as f64 / 1000.0).max(2.0);
        self.tokens = (self.tokens + dt * rate).min(burst);
        self.refilled_at = now;
    }

    /// A GET admitted at `sent_at` ended at `now` with `outcome`.
    pub fn done(&mut self, now: Instant, sent_at: Instant, outcome: Outcome) {
        self.in_flight = self.in_flight.saturating_sub(1);
        match outcome {
            Outcome::Answered => self.answered(now),
            Outcome::Throttled { retry_after } => self.throttled(now, sent_at, retry_after),
            Outcome::Refused => {
                if sent_at >= self.window_cut_at {
                    self.window = (self.window * WINDOW_CUT_FACTOR).max(self.limits.min as f64);
                    self.ssthresh = self.window;
                    self.window_cut_at = now;
                    self.window_cuts += 1;
                }
            }
            Outcome::Failed | Outcome::Cancelled => {}
        }
    }

    fn answered(&mut self, now: Instant) {
        self.goodput
            .add(now.saturating_duration_since(self.started));
        let max = self.limits.max as f64;
        if self.window < self.ssthresh {
            self.window = (self.window + 1.0).min(self.ssthresh);
        } else {
            self.window = (self.window + (self.window / 16.0).max(1.0) / self.window).min(max);
        }
        let Some(rate) = self.rate else {
            return;
        };
        let bound = self.bound_at.is_some_and(|t| {
            now.saturating_duration_since(t).as_millis() < u128::from(BOUND_RECENTLY_MS)
        });
        if bound {
            self.rate = Some(rate + RATE_STEP_PER_ANSWER);
        }
    }

    fn throttled(&mut self, now: Instant, sent_at: Instant, retry_after: Option<Duration>) {
        let in_flight_then = (self.in_flight + 1) as f64;
        if let Some(wait) = retry_after {
            let wait = wait.min(Duration::from_millis(RETRY_AFTER_MAX_MS));
            let jitter = wait.mul_f64(self.draw_unit() / 10.0);
            let until = now + wait + jitter;
            self.paused_until = Some(self.paused_until.map_or(until, |p| p.max(until)));
        }
        let since_start = now.saturating_duration_since(self.started);
        let goodput = self.goodput.per_s(since_start);
        let rate = match self.rate {
            // The first throttle: just under what the store gave us lately.
            None => {
                let base = if goodput > 0.0 {
                    goodput
                } else {
                    // Nothing answered yet: what was in flight over this
                    // GET's round trip, halved (the next cuts correct it).
                    let rtt_s = now
                        .saturating_duration_since(sent_at)
                        .as_secs_f64()
                        .max(1e-3);
                    in_flight_then / rtt_s * 0.5
                };
                base * RATE_ANCHOR_FACTOR
            }
            // Answers to GETs sent before the first cut were sent without a
            // limit and say nothing of it.
            Some(_) if sent_at < self.anchored_at => return,
            Some(rate) => (rate * (1.0 - RATE_CUT_PER_THROTTLE))
                .max(goodput * RATE_FLOOR_OF_GOODPUT)
                .min(rate),
        };
        let rate = rate.max(RATE_MIN_PER_S);
        if self.rate.is_none() {
            self.anchored_at = now;
            self.refilled_at = now;
            self.tokens = self.tokens.min(1.0);
        }
        self.rate_cut_at = now;
        self.rate = Some(rate);
        self.rate_cuts += 1;
        // The window is left alone: GETs in flight follow the rate (rate x
        // latency), and a window cut here would bind when answers are slow
        // (a loaded machine), below what the rate allows.
    }

    /// A uniform draw in [0, 1) (SplitMix64).
    fn draw_unit(&mut self) -> f64 {
        self.jitter_state = self.jitter_state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.jitter_state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The limits now.
    pub fn limits(&self) -> Limits {
        Limits {
            window: self.window as usize,
            rate_per_s: self.rate,
            in_flight: self.in_flight,
            rate_cuts: self.rate_cuts,
            window_cuts: self.window_cuts,
        }
    }

    /// Whether the store throttled since `now - within`.
    pub fn throttled_within(&self, now: Instant, within: Duration) -> bool {
        self.rate_cuts > 0 && now.saturating_duration_since(self.rate_cut_at) < within
    }
}

/// The limits as atomics, for `stat` and /metrics (read from any thread).
#[derive(Debug, Default)]
pub struct LimitFigures {
    /// Most GETs in flight.
    pub window: AtomicU64,
    /// The rate limit in requests/s, rounded up; 0: none (never throttled).
    pub rate_per_s: AtomicU64,
    /// Times a throttle cut the rate limit.
    pub rate_cuts: AtomicU64,
    /// Times a refused connection cut the window.
    pub window_cuts: AtomicU64,
}

impl LimitFigures {
    fn publish(&self, l: &Limits) {
        self.window.store(l.window as u64, Ordering::Relaxed);
        let rate = l.rate_per_s.map_or(0, |r| r.ceil().max(1.0) as u64);
        self.rate_per_s.store(rate, Ordering::Relaxed);
        self.rate_cuts.store(l.rate_cuts, Ordering::Relaxed);
        self.window_cuts.store(l.window_cuts, Ordering::Relaxed);
    }
}

/// One store's controller, shared by every fetch engine reading it.
#[derive(Debug)]
pub struct Admission {
    /// What the store is (`scheme://endpoint/bucket`), for messages.
    pub key: String,
    state: Mutex<Controller>,
    /// Woken when a GET ends (room in the window for another engine).
    changed: tokio::sync::Notify,
    /// The limits, for `stat` and /metrics.
    pub figures: Arc<LimitFigures>,
}

impl Admission {
    /// A controller of its own (not in the registry).
    pub fn new(key: &str, limits: WindowLimits) -> Admission {
        let seed = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write(key.as_bytes());
            h.finish()
        };
        let controller = Controller::new(limits, Instant::now(), seed);
        let figures = Arc::new(LimitFigures::default());
        figures.publish(&controller.limits());
        Admission {
            key: key.to_string(),
            state: Mutex::new(controller),
            changed: tokio::sync::Notify::new(),
            figures,
        }
    }

    /// The controller of the store `key` in this process: the one already
    /// made, if an engine still holds it, else a new one with `limits`.
    pub fn for_store(key: &str, limits: WindowLimits) -> Arc<Admission> {
        static STORES: OnceLock<Mutex<HashMap<String, Weak<Admission>>>> = OnceLock::new();
        let stores = STORES.get_or_init(|| Mutex::new(HashMap::new()));
        // Poisoned only if a holder panicked; the map stays usable.
        let mut map = stores.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, weak| weak.strong_count() > 0);
        if let Some(found) = map.get(key).and_then(Weak::upgrade) {
            return found;
        }
        let made = Arc::new(Admission::new(key, limits));
        map.insert(key.to_string(), Arc::downgrade(&made));
        made
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Controller> {
        // Nothing panics while holding it (plain arithmetic).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `Controller::try_admit` now.
    pub fn try_admit(&self, now: Instant) -> Admit {
        let mut c = self.lock();
        let admit = c.try_admit(now);
        if admit == Admit::Go {
            self.figures.publish(&c.limits());
        }
        admit
    }

    /// `Controller::done`, and wakes engines waiting for room.
    pub fn done(&self, now: Instant, sent_at: Instant, outcome: Outcome) {
        {
            let mut c = self.lock();
            c.done(now, sent_at, outcome);
            self.figures.publish(&c.limits());
        }
        self.changed.notify_waiters();
    }

    /// The limits now.
    pub fn limits(&self) -> Limits {
        self.lock().limits()
    }

    /// Whether the store throttled in the last `within`.
    pub fn throttled_within(&self, within: Duration) -> bool {
        self.lock().throttled_within(Instant::now(), within)
    }

    /// A future that completes when a GET of this store ends; create it
    /// before `try_admit` says `Full`, so no wake-up is lost between them.
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: WindowLimits = WindowLimits {
        initial: 256,
        min: 8,
        max: 1024,
    };

    fn ms(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn the_window_slow_starts_from_32_and_doubles_per_round_to_the_initial_window() {
        let t0 = Instant::now();
        let mut c = Controller::new(LIMITS, t0, 1);
        let mut admitted = 0;
        while c.try_admit(t0) == Admit::Go {
            admitted += 1;
        }
        assert_eq!(admitted, SLOW_START_WINDOW);
        for _ in 0..admitted {
            c.done(ms(t0, 10), t0, Outcome::Answered);
        }
        assert_eq!(c.limits().window, 2 * SLOW_START_WINDOW);
        let round = |c: &mut Controller, k: u64| {
            let w = c.limits().window;
            for _ in 0..w {
                assert_eq!(c.try_admit(ms(t0, 10 * k)), Admit::Go);
            }
            for _ in 0..w {
                c.done(ms(t0, 10 * k + 10), t0, Outcome::Answered);
            }
        };
        round(&mut c, 1);
        round(&mut c, 2);
        assert_eq!(c.limits().window, 256, "slow start ends at window_initial");
        round(&mut c, 3);
        assert_eq!(c.limits().window, 256 + 16, "then a 16th per round");
        assert_eq!(
            c.limits().rate_per_s,
            None,
            "no rate limit before a throttle"
        );
    }

    #[test]
    fn a_throttle_sets_the_rate_just_under_the_goodput_and_one_round_cuts_once() {
        let t0 = Instant::now();
        let mut c = Controller::new(LIMITS, t0, 1);
        // 400 answers/s for a second.
        for i in 0..400u64 {
            assert_eq!(c.try_admit(t0 + Duration::from_micros(i * 2500)), Admit::Go);
            c.done(
                t0 + Duration::from_micros(i * 2500 + 1000),
                t0,
                Outcome::Answered,
            );
        }
        let now = ms(t0, 1000);
        c.done(now, ms(t0, 990), Outcome::Throttled { retry_after: None });
        let rate = c.limits().rate_per_s.unwrap();
        assert!((330.0..=370.0).contains(&rate), "{rate}");
        // Answers to GETs sent before the cut do not cut again.
        for k in 0..20 {
            c.done(
                ms(t0, 1001 + k),
                ms(t0, 995),
                Outcome::Throttled { retry_after: None },
            );
        }
        assert_eq!(c.limits().rate_cuts, 1);
        assert_eq!(c.limits().rate_per_s, Some(rate));
        // One sent after it does.
        c.done(
            ms(t0, 1030),
            ms(t0, 1010),
            Outcome::Throttled { retry_after: None },
        );
        assert_eq!(c.limits().rate_cuts, 2);
        assert!(c.limits().rate_per_s.unwrap() < rate);
    }

    #[test]
    fn the_rate_limit_paces_gets_and_grows_only_while_it_binds() {
        let t0 = Instant::now();
        let mut c = Controller::new(LIMITS, t0, 1);
        c.done(ms(t0, 5), t0, Outcome::Answered);
        c.try_admit(t0);
        c.done(
            ms(t0, 10),
            ms(t0, 1),
            Outcome::Throttled { retry_after: None },
        );
        let rate = c.limits().rate_per_s.unwrap();
        // Over one second of asking all the time, about `rate` GETs go.
        let mut went = 0u32;
        let mut t = ms(t0, 10);
        while t < ms(t0, 1010) {
            match c.try_admit(t) {
                Admit::Go => {
                    went += 1;
                    c.done(t, t, Outcome::Answered);
                }
                Admit::Until(next) => t = next.max(t + Duration::from_micros(100)),
                Admit::Full => panic!("the window is not full"),
            }
        }
        let grown = c.limits().rate_per_s.unwrap();
        assert!(grown > rate, "it binds, so it grows: {rate} -> {grown}");
        assert!(
            (went as f64) < grown + 5.0 && (went as f64) > rate * 0.9,
            "{went} vs {rate}..{grown}"
        );
        // Idle for a second: no growth while nothing waits for it.
        c.done(ms(t0, 2500), ms(t0, 2400), Outcome::Answered);
        c.done(ms(t0, 3500), ms(t0, 3400), Outcome::Answered);
        assert_eq!(c.limits().rate_per_s.unwrap(), grown);
    }

    #[test]
    fn retry_after_pauses_the_store_and_a_refusal_halves_the_window() {
        let t0 = Instant::now();
        let mut c = Controller::new(LIMITS, t0, 7);
        assert_eq!(c.try_admit(t0), Admit::Go);
        let retry_after = Some(Duration::from_secs(2));
        c.done(ms(t0, 10), t0, Outcome::Throttled { retry_after });
        match c.try_admit(ms(t0, 20)) {
            Admit::Until(until) => {
                let wait = until - ms(t0, 10);
                assert!(
                    wait >= Duration::from_secs(2) && wait <= Duration::from_millis(2200),
                    "{wait:?}"
                );
            }
            other => panic!("{other:?}"),
        }
        // A year's Retry-After is cut to the maximum.
        c.done(
            ms(t0, 30),
            t0,
            Outcome::Throttled {
                retry_after: Some(Duration::from_secs(365 * 86400)),
            },
        );
        match c.try_admit(ms(t0, 40)) {
            Admit::Until(until) => {
                assert!(until - ms(t0, 30) <= Duration::from_millis(RETRY_AFTER_MAX_MS * 11 / 10))
            }
            other => panic!("{other:?}"),
        }
        let before = c.limits().window;
        c.done(ms(t0, 50), ms(t0, 45), Outcome::Refused);
        c.done(ms(t0, 51), ms(t0, 45), Outcome::Refused);
        assert_eq!(c.limits().window, before / 2, "one cut per round");
        assert_eq!(c.limits().window_cuts, 1);
    }

    #[test]
    fn engines_of_one_store_share_its_controller() {
        let a = Admission::for_store("http://x.test:1/bucket-a", LIMITS);
        let b = Admission::for_store("http://x.test:1/bucket-a", LIMITS);
        let other = Admission::for_store("http://x.test:1/bucket-b", LIMITS);
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &other));
        assert_eq!(a.try_admit(Instant::now()), Admit::Go);
        assert_eq!(b.limits().in_flight, 1);
    }
}
