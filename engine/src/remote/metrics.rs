//! What the remote engine is doing, as plain atomics anyone can read, and
//! the wrapper around object_store's HTTP service that sees every attempt.
//!
//! object_store retries 5xx and 429 inside its client and reports only the
//! final error, so per-attempt status and time to response headers are
//! visible only here: [`CountingConnector`] wraps the reqwest client that
//! object_store would have built, counts each attempt's outcome, and tells
//! the fetch task that made it (through a task-local) the status of its last
//! attempt, which is how the fetch engine classifies an error as retryable,
//! and its range headers, which say how a server answered a ranged GET.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpService,
    ReqwestConnector,
};
use object_store::ClientOptions;

use super::admission::LimitFigures;
use super::error::RetryCause;

/// Buckets of a latency histogram: bucket i holds values in
/// [2^i, 2^(i+1)) microseconds (bucket 0 also holds 0), up to about 2^39 µs.
pub const LATENCY_BUCKETS: usize = 40;

/// A lock-free histogram of durations in microseconds, in powers of two.
#[derive(Debug)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; LATENCY_BUCKETS],
}

impl Default for LatencyHistogram {
    fn default() -> LatencyHistogram {
        LatencyHistogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl LatencyHistogram {
    /// Counts one duration.
    pub fn record_us(&self, us: u64) {
        let i = (63 - us.max(1).leading_zeros() as usize).min(LATENCY_BUCKETS - 1);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
    }

    /// How many durations were counted.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// The upper bound of the bucket holding the `q` quantile (0.0 to 1.0),
    /// in microseconds; 0 when nothing was counted. Within a factor of two.
    pub fn quantile_us(&self, q: f64) -> u64 {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return 1u64 << (i + 1);
            }
        }
        1u64 << LATENCY_BUCKETS
    }
}

/// Counters of one remote source. Every field is a relaxed atomic: the
/// figures are for display, and nothing synchronizes through them.
#[derive(Debug, Default)]
pub struct RemoteMetrics {
    /// GETs (parts of reads) in flight now.
    pub gets_in_flight: AtomicU64,
    /// GETs that delivered their whole range.
    pub gets_ok: AtomicU64,
    /// Reads completed successfully / with an error.
    pub reads_ok: AtomicU64,
    /// Reads that failed for good.
    pub reads_failed: AtomicU64,
    /// Body bytes received (retried ranges and hedges count again).
    pub bytes_received: AtomicU64,
    /// Body bytes written into destinations: a retry writes its range
    /// again, a hedge that wins writes only what the GET it hedged had not,
    /// so with no retry this is the bytes of the reads exactly.
    pub bytes_landed: AtomicU64,
    /// Hedges sent: GETs asked again because the first was slow.
    pub hedges: AtomicU64,
    /// Hedges whose answer came first and was used.
    pub hedges_won: AtomicU64,
    /// The store's admission limits (set when a fetch engine starts).
    pub limits: OnceLock<Arc<LimitFigures>>,
    /// HTTP attempts made by object_store (every request, every retry).
    pub attempts: AtomicU64,
    /// Attempts answered 2xx / 3xx.
    pub status_ok: AtomicU64,
    /// Attempts answered 4xx other than 429.
    pub status_4xx: AtomicU64,
    /// Attempts answered 429 or 503.
    pub status_throttled: AtomicU64,
    /// Attempts answered another 5xx.
    pub status_5xx: AtomicU64,
    /// Attempts that got no response (connect error, reset, timeout).
    pub transport_errors: AtomicU64,
    /// Retries of the fetch engine, by `RetryCause::index`.
    pub retries: [AtomicU64; RetryCause::ALL.len()],
    /// Time from an attempt's start to its response headers.
    pub ttfb: LatencyHistogram,
    /// Time from a GET's first attempt to its last byte (retries included).
    pub get_latency: LatencyHistogram,
    /// Keys listed so far (listing progress).
    pub keys_listed: AtomicU64,
}

/// A copy of the figures at one moment, for printing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// GETs in flight.
    pub gets_in_flight: u64,
    /// The window (most GETs in flight).
    pub window: u64,
    /// The rate limit, GETs/s (0: none: the store never throttled).
    pub rate_limit_per_s: u64,
    /// Times a throttle cut the rate limit.
    pub rate_cuts: u64,
    /// Hedges sent.
    pub hedges: u64,
    /// Hedges that won.
    pub hedges_won: u64,
    /// Body bytes received.
    pub bytes_received: u64,
    /// HTTP attempts.
    pub attempts: u64,
    /// Retries by `RetryCause::index`.
    pub retries: [u64; RetryCause::ALL.len()],
    /// Attempts answered 429/503.
    pub status_throttled: u64,
    /// Attempts answered another 5xx.
    pub status_5xx: u64,
    /// Median GET latency, µs (within a factor of two).
    pub get_latency_us_p50: u64,
    /// 99th percentile GET latency, µs.
    pub get_latency_us_p99: u64,
    /// Median time to response headers, µs.
    pub ttfb_us_p50: u64,
    /// 99th percentile time to response headers, µs.
    pub ttfb_us_p99: u64,
}

impl RemoteMetrics {
    /// Counts one retry.
    pub fn add_retry(&self, cause: RetryCause) {
        self.retries[cause.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// All retries, every cause.
    pub fn retries_total(&self) -> u64 {
        self.retries.iter().map(|r| r.load(Ordering::Relaxed)).sum()
    }

    /// The figures now.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MetricsSnapshot {
            gets_in_flight: load(&self.gets_in_flight),
            window: self.limits.get().map_or(0, |l| load(&l.window)),
            rate_limit_per_s: self.limits.get().map_or(0, |l| load(&l.rate_per_s)),
            rate_cuts: self.limits.get().map_or(0, |l| load(&l.rate_cuts)),
            hedges: load(&self.hedges),
            hedges_won: load(&self.hedges_won),
            bytes_received: load(&self.bytes_received),
            attempts: load(&self.attempts),
            retries: std::array::from_fn(|i| load(&self.retries[i])),
            status_throttled: load(&self.status_throttled),
            status_5xx: load(&self.status_5xx),
            get_latency_us_p50: self.get_latency.quantile_us(0.5),
            get_latency_us_p99: self.get_latency.quantile_us(0.99),
            ttfb_us_p50: self.ttfb.quantile_us(0.5),
            ttfb_us_p99: self.ttfb.quantile_us(0.99),
        }
    }
}

/// The outcome of the last HTTP attempt a fetch task made: the outcome as
/// one word (0 none yet, 100..=599 the status, `TRANSPORT_BASE + kind` a
/// transport error), and the response's range headers, which say how a
/// server answered a ranged GET where object_store's error does not.
#[derive(Debug, Default)]
pub struct LastAttempt {
    outcome: AtomicU32,
    head: Mutex<RangeHeaders>,
    /// A 429/503's Retry-After in ms, plus one (0: none).
    retry_after_ms: AtomicU64,
}

/// Longest header value kept from a response (network input, bounded).
pub const HEADER_VALUE_KEPT_MAX: usize = 128;

/// The range headers of a response, as sent (each cut to
/// `HEADER_VALUE_KEPT_MAX` bytes); `None` where a header was absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeHeaders {
    /// `Content-Range`.
    pub content_range: Option<String>,
    /// `Content-Length`.
    pub content_length: Option<String>,
}

impl RangeHeaders {
    fn of(headers: &http::HeaderMap) -> RangeHeaders {
        let kept = |name| {
            headers.get(name).map(|v: &http::HeaderValue| {
                let bytes = &v.as_bytes()[..v.len().min(HEADER_VALUE_KEPT_MAX)];
                String::from_utf8_lossy(bytes).into_owned()
            })
        };
        RangeHeaders {
            content_range: kept(http::header::CONTENT_RANGE),
            content_length: kept(http::header::CONTENT_LENGTH),
        }
    }
}

const TRANSPORT_BASE: u32 = 1000;

/// What the last attempt of a task ended with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// No attempt was seen (an in-process store).
    None,
    /// An HTTP status.
    Status(u16),
    /// No response: a connect error.
    Connect,
    /// No response: a timeout.
    Timeout,
    /// No response: the request broke off (reset, closed).
    Interrupted,
    /// No response: another transport error.
    Transport,
}

impl LastAttempt {
    /// Clears it before an attempt.
    pub fn reset(&self) {
        self.outcome.store(0, Ordering::Relaxed);
        self.retry_after_ms.store(0, Ordering::Relaxed);
        self.set_head(RangeHeaders::default());
    }

    fn set(&self, v: u32) {
        self.outcome.store(v, Ordering::Relaxed);
    }

    fn set_head(&self, head: RangeHeaders) {
        // Poisoned only if a holder panicked, and no holder can: take it anyway.
        *self.head.lock().unwrap_or_else(|p| p.into_inner()) = head;
    }

    /// The range headers of the last response (empty if none came).
    pub fn head(&self) -> RangeHeaders {
        self.head.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The Retry-After of the last response, if it was a 429/503 with one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.retry_after_ms.load(Ordering::Relaxed) {
            0 => None,
            v => Some(Duration::from_millis(v - 1)),
        }
    }

    /// The outcome recorded last.
    pub fn get(&self) -> AttemptOutcome {
        match self.outcome.load(Ordering::Relaxed) {
            0 => AttemptOutcome::None,
            s @ 1..=999 => AttemptOutcome::Status(s as u16),
            v if v == TRANSPORT_BASE => AttemptOutcome::Connect,
            v if v == TRANSPORT_BASE + 1 => AttemptOutcome::Timeout,
            v if v == TRANSPORT_BASE + 2 => AttemptOutcome::Interrupted,
            _ => AttemptOutcome::Transport,
        }
    }
}

tokio::task_local! {
    /// Set by a fetch task around its requests; the counting service writes
    /// each attempt's outcome into it.
    pub static LAST_ATTEMPT: Arc<LastAttempt>;
}

/// An `HttpConnector` that builds object_store's usual reqwest client and
/// wraps it in [`CountingService`].
#[derive(Debug)]
pub struct CountingConnector {
    metrics: Arc<RemoteMetrics>,
}

impl CountingConnector {
    /// Counts into `metrics`.
    pub fn new(metrics: Arc<RemoteMetrics>) -> CountingConnector {
        CountingConnector { metrics }
    }
}

impl HttpConnector for CountingConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(CountingService {
            inner,
            metrics: Arc::clone(&self.metrics),
        }))
    }
}

/// Counts every attempt's outcome and time to headers, then passes the
/// response on untouched (the body streams through without a copy).
#[derive(Debug)]
pub struct CountingService {
    inner: HttpClient,
    metrics: Arc<RemoteMetrics>,
}

#[async_trait::async_trait]
impl HttpService for CountingService {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let m = &self.metrics;
        let start = Instant::now();
        m.attempts.fetch_add(1, Ordering::Relaxed);
        let result = self.inner.execute(req).await;
        let mut head = None;
        let mut retry_after = None;
        let code = match &result {
            Ok(resp) => {
                head = Some(resp.headers());
                if matches!(resp.status().as_u16(), 429 | 503) {
                    retry_after = parse_retry_after(resp.headers(), std::time::SystemTime::now());
                }
                m.ttfb.record_us(start.elapsed().as_micros() as u64);
                let status = resp.status().as_u16();
                let counter = match status {
                    429 | 503 => &m.status_throttled,
                    500..=599 => &m.status_5xx,
                    400..=499 => &m.status_4xx,
                    _ => &m.status_ok,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                u32::from(status)
            }
            Err(e) => {
                m.transport_errors.fetch_add(1, Ordering::Relaxed);
                TRANSPORT_BASE
                    + match e.kind() {
                        HttpErrorKind::Connect => 0,
                        HttpErrorKind::Timeout => 1,
                        HttpErrorKind::Interrupted | HttpErrorKind::Request => 2,
                        _ => 3,
                    }
            }
        };
        // Outside a fetch task (listing, HEAD) there is no task-local: fine.
        let _ = LAST_ATTEMPT.try_with(|last| {
            last.set(code);
            if let Some(wait) = retry_after {
                let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX - 1);
                last.retry_after_ms
                    .store(ms.saturating_add(1), Ordering::Relaxed);
            }
            if let Some(headers) = head {
                last.set_head(RangeHeaders::of(headers));
            }
        });
        result
    }
}

/// Longest Retry-After header value read (network input, bounded).
const RETRY_AFTER_BYTES_MAX: usize = 64;

/// A response's `Retry-After`: delay-seconds, or an HTTP-date (a date in
/// the past is no wait). `None` when absent or unreadable. The admission
/// controller caps what it honours (`RETRY_AFTER_MAX_MS`).
pub fn parse_retry_after(
    headers: &http::HeaderMap,
    now: std::time::SystemTime,
) -> Option<Duration> {
    let value = headers.get(http::header::RETRY_AFTER)?.as_bytes();
    if value.len() > RETRY_AFTER_BYTES_MAX {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Some(Duration::from_secs(secs.min(86_400)));
    }
    let when = chrono::DateTime::parse_from_rfc2822(text).ok()?;
    let now_s = now.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs() as i64;
    let wait_s = (when.timestamp() - now_s).clamp(0, 86_400);
    Some(Duration::from_secs(wait_s as u64))
}

#[cfg(test)]
mod tests {
    use super::LatencyHistogram;

    #[test]
    fn retry_after_reads_seconds_and_http_dates_and_refuses_junk() {
        use super::parse_retry_after;
        use std::time::{Duration, UNIX_EPOCH};
        let with = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_str(v).unwrap(),
            );
            h
        };
        // 2015-10-21 07:28:00 UTC.
        let now = UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(
            parse_retry_after(&with("3"), now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            parse_retry_after(&with("Wed, 21 Oct 2015 07:28:05 GMT"), now),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            parse_retry_after(&with("Wed, 21 Oct 2015 07:27:00 GMT"), now),
            Some(Duration::ZERO),
            "a date in the past is no wait"
        );
        assert_eq!(parse_retry_after(&with("soon"), now), None);
        assert_eq!(parse_retry_after(&with(&"9".repeat(100)), now), None);
        assert_eq!(parse_retry_after(&http::HeaderMap::new(), now), None);
        assert_eq!(
            parse_retry_after(&with("99999999999"), now),
            Some(Duration::from_secs(86_400))
        );
    }

    #[test]
    fn quantiles_come_within_a_factor_of_two() {
        let h = LatencyHistogram::default();
        for us in 1..=1000u64 {
            h.record_us(us * 10);
        }
        let (p50, p99) = (h.quantile_us(0.5), h.quantile_us(0.99));
        assert!((5_000..=10_000 * 2).contains(&p50), "{p50}");
        assert!((9_900..=9_990 * 2).contains(&p99), "{p99}");
        assert_eq!(LatencyHistogram::default().quantile_us(0.5), 0);
    }
}
