//! One attempt of one ranged GET (the dispatcher, `dispatch.rs`, decides
//! when to ask again: retries after a failure, hedges after a slow answer).
//!
//! A part has at most one attempt writing its destination at a time (a
//! `Direct` one); a hedge keeps its body in refcounted chunks (`Buffer`),
//! and only the dispatcher copies them in, after the writer has returned.
//! A retry rewrites the part's whole range from its first byte, so a fault
//! never leaves a torn sample: the destination holds either all of one
//! answer's bytes or the read completes with an error.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use object_store::{GetOptions, GetRange};

use super::admission::Outcome;
use super::answer::{check_unchanged, classify, range_not_honoured, Failure};
use super::error::{RemoteError, RetryCause};
use super::metrics::{LastAttempt, LAST_ATTEMPT};
use super::store::StoreHandle;
use super::{FetchConfig, RemoteObject, HEADER_TIMEOUT_MAX_MS};

/// Shortest time between two warnings of one engine about a slow server
/// (headers late, a body under the minimum throughput); the others go to
/// the debug log, so a window of slow GETs warns once, not hundreds of times.
pub const SLOW_WARNING_INTERVAL_MS: u64 = 10_000;

/// A destination pointer that may cross to a runtime thread.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DestPtr(pub(crate) *mut u8);

// SAFETY: the pointer is written only by the one part task that owns its
// range, and `FetchEngine::submit`'s contract keeps the memory valid and
// untouched by anyone else until the read's completion is reaped.
unsafe impl Send for DestPtr {}
// SAFETY: as above; `DestPtr` is never dereferenced through a shared reference.
unsafe impl Sync for DestPtr {}

/// Everything a part task needs, shared by all of them.
#[derive(Debug)]
pub(crate) struct PartContext {
    pub(crate) store: StoreHandle,
    pub(crate) objects: Arc<Vec<RemoteObject>>,
    pub(crate) cfg: FetchConfig,
    pub(crate) jitter: RandomState,
    pub(crate) warnings: WarningLimiter,
}

/// Lets one warning through per `SLOW_WARNING_INTERVAL_MS`.
#[derive(Debug)]
pub(crate) struct WarningLimiter {
    started: Instant,
    /// Milliseconds after `started` before which no warning goes out.
    next_ms: AtomicU64,
}

impl WarningLimiter {
    pub(crate) fn new() -> WarningLimiter {
        WarningLimiter {
            started: Instant::now(),
            next_ms: AtomicU64::new(0),
        }
    }

    /// Warns with `text` if no warning went out in the interval, else logs
    /// it at debug level.
    fn warn(&self, text: &str) {
        let now_ms = self.started.elapsed().as_millis() as u64;
        let next_ms = self.next_ms.load(Ordering::Relaxed);
        let allowed = now_ms >= next_ms
            && self
                .next_ms
                .compare_exchange(
                    next_ms,
                    now_ms + SLOW_WARNING_INTERVAL_MS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok();
        if allowed {
            tracing::warn!("{text} (RINGFEED_LOG=debug names every slow GET)");
        } else {
            tracing::debug!("{text}");
        }
    }
}

/// Where an attempt's body goes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Sink {
    /// Straight into the read's destination (the part's one writer).
    Direct(DestPtr),
    /// Into refcounted chunks only (a hedge: it must not touch the
    /// destination, which the GET it hedges may be writing).
    Buffer,
}

/// One attempt of one part.
#[derive(Debug)]
pub(crate) struct AttemptJob {
    /// The dispatcher's id of this attempt.
    pub(crate) id: u64,
    /// Index into the object table.
    pub(crate) object: u32,
    /// Byte range in the object.
    pub(crate) range: Range<u64>,
    /// Where its body goes.
    pub(crate) sink: Sink,
    /// Keep the body's chunks (refcounted, no copy) in the answer; a
    /// `Buffer` attempt always keeps them.
    pub(crate) keep: bool,
    /// How long to wait for the response headers.
    pub(crate) headers_wait_ms: u64,
}

/// What a finished attempt reports to the dispatcher.
pub(crate) struct AttemptDone {
    pub(crate) id: u64,
    /// The body's chunks in order when kept (see `AttemptJob::keep`).
    pub(crate) result: Result<Vec<Bytes>, Failure>,
    /// Bytes this attempt wrote into the destination (a `Direct` one),
    /// however it ended: a hedge that wins copies only the rest.
    pub(crate) written: u64,
    /// From its start to its end.
    pub(crate) took: Duration,
    /// What the store's admission controller learns from it.
    pub(crate) outcome: Outcome,
}

/// Runs one attempt until it ends or `cancel` fires (a sent value or a
/// dropped sender): cancelled, it stops at its next await, so no byte
/// lands in the destination after it has returned.
pub(crate) async fn attempt(
    ctx: Arc<PartContext>,
    job: AttemptJob,
    mut cancel: tokio::sync::oneshot::Receiver<()>,
) -> AttemptDone {
    let started = Instant::now();
    let last = Arc::new(LastAttempt::default());
    let written = AtomicU64::new(0);
    let result = {
        let body = LAST_ATTEMPT.scope(Arc::clone(&last), attempt_once(&ctx, &job, &last, &written));
        tokio::select! {
            biased;
            _ = &mut cancel => Err(Failure::Cancelled),
            r = body => r,
        }
    };
    let outcome = match &result {
        Ok(_) => Outcome::Answered,
        Err(Failure::Cancelled) => Outcome::Cancelled,
        Err(Failure::Retry(RetryCause::Throttled, _)) => Outcome::Throttled {
            retry_after: last.retry_after(),
        },
        Err(Failure::Retry(RetryCause::Connect, _))
            if last.get() == super::metrics::AttemptOutcome::Connect =>
        {
            Outcome::Refused
        }
        Err(_) => Outcome::Failed,
    };
    AttemptDone {
        id: job.id,
        result,
        written: written.load(Ordering::Relaxed),
        took: started.elapsed(),
        outcome,
    }
}

/// What to do after a part's attempt failed.
pub(crate) enum Next {
    /// Ask again after this wait (its cause counted as a retry).
    Retry(Duration),
    /// Give up with this error.
    Fail(RemoteError),
}

/// The retry bookkeeping of one part: attempts that failed, the wait for
/// headers (longer after each time they came late).
#[derive(Debug)]
pub(crate) struct Tries {
    pub(crate) failures: u32,
    pub(crate) headers_wait_ms: u64,
}

impl Tries {
    pub(crate) fn new(cfg: &FetchConfig) -> Tries {
        Tries {
            failures: 0,
            headers_wait_ms: cfg.stall_timeout_ms,
        }
    }

    /// After an attempt of bytes `range` of `object` failed with `failure`:
    /// warn (rate-limited) and retry with backoff and jitter (at least the
    /// store's Retry-After), or fail once the retries are used up.
    pub(crate) fn after_failure(
        &mut self,
        ctx: &PartContext,
        object: u32,
        range: &Range<u64>,
        failure: Failure,
        retry_after: Option<Duration>,
        salt: u64,
    ) -> Next {
        self.failures += 1;
        let attempts = self.failures;
        let obj = &ctx.objects[object as usize];
        let (cause, detail, too_slow) = match failure {
            Failure::Permanent(e) => return Next::Fail(e),
            Failure::Cancelled => (RetryCause::Other, "cancelled".to_string(), None),
            Failure::Retry(cause, detail) => (cause, detail, None),
            Failure::HeadersLate => {
                let waited_ms = self.headers_wait_ms;
                let detail = format!("no response headers within {waited_ms} ms");
                self.headers_wait_ms =
                    next_headers_wait_ms(self.headers_wait_ms, ctx.cfg.stall_timeout_ms);
                if attempts <= ctx.cfg.retries_max {
                    ctx.warnings.warn(&format!(
                        "{}: {:?} (bytes {}-{}) sent no response headers within {:.1} s (attempt {attempts}); \
                         the server is slow to answer: waiting up to {:.1} s on the next attempt",
                        ctx.store.display,
                        obj.key,
                        range.start,
                        range.end.saturating_sub(1),
                        waited_ms as f64 / 1000.0,
                        self.headers_wait_ms as f64 / 1000.0,
                    ));
                }
                (RetryCause::Stall, detail, None)
            }
            Failure::TooSlow {
                received_bytes,
                elapsed_ms,
            } => {
                let detail = format!(
                    "{received_bytes} body bytes in {elapsed_ms} ms, under {} bytes/s",
                    ctx.cfg.min_bytes_per_s
                );
                if attempts <= ctx.cfg.retries_max {
                    ctx.warnings.warn(&format!(
                        "{}: {:?} (bytes {}-{}) came at {} bytes/s ({received_bytes} bytes in {elapsed_ms} ms, \
                         attempt {attempts}), under the minimum of {} bytes/s: asking again",
                        ctx.store.display,
                        obj.key,
                        range.start,
                        range.end.saturating_sub(1),
                        received_bytes.saturating_mul(1000) / elapsed_ms.max(1),
                        ctx.cfg.min_bytes_per_s,
                    ));
                }
                (
                    RetryCause::Stall,
                    detail,
                    Some((received_bytes, elapsed_ms)),
                )
            }
        };
        if attempts > ctx.cfg.retries_max {
            return Next::Fail(match too_slow {
                Some((received_bytes, elapsed_ms)) => RemoteError::TooSlow {
                    key: obj.key.clone(),
                    store: ctx.store.display.clone(),
                    attempts,
                    received_bytes,
                    elapsed_ms,
                    min_bytes_per_s: ctx.cfg.min_bytes_per_s,
                    window_ms: ctx.cfg.throughput_window_ms,
                },
                None => RemoteError::RetriesExhausted {
                    key: obj.key.clone(),
                    store: ctx.store.display.clone(),
                    attempts,
                    cause,
                    detail,
                },
            });
        }
        ctx.store.metrics.add_retry(cause);
        tracing::debug!("retrying bytes {range:?} of object #{object} after {cause}: {detail}");
        let wait = backoff(ctx, attempts, salt);
        Next::Retry(retry_after.map_or(wait, |r| r.max(wait)))
    }
}

/// The wait for headers after one ran out: doubled, up to
/// `HEADER_TIMEOUT_MAX_MS` (or the stall timeout, if that is longer).
fn next_headers_wait_ms(wait_ms: u64, stall_timeout_ms: u64) -> u64 {
    wait_ms
        .saturating_mul(2)
        .min(HEADER_TIMEOUT_MAX_MS.max(stall_timeout_ms))
}

/// `backoff_base_ms * 2^(attempt-1)`, capped, then a uniform draw from its
/// upper half ("equal jitter"), so retries of many parts spread out.
fn backoff(ctx: &PartContext, attempt: u32, salt: u64) -> Duration {
    let exp = attempt.saturating_sub(1).min(20);
    let ceiling_ms = ctx
        .cfg
        .backoff_base_ms
        .saturating_mul(1u64 << exp)
        .min(ctx.cfg.backoff_max_ms)
        .max(1);
    let mut h = ctx.jitter.build_hasher();
    h.write_u64(salt);
    h.write_u32(attempt);
    let half = ceiling_ms / 2;
    Duration::from_millis(half + h.finish() % (ceiling_ms - half + 1))
}

/// One GET of `part`, waiting up to `part.headers_wait_ms` for its
/// response headers; the body's chunks when kept (`AttemptJob::keep`).
/// `landed` counts the bytes written into a `Direct` destination, each
/// time right after the copy (no await between them).
async fn attempt_once(
    ctx: &PartContext,
    part: &AttemptJob,
    last: &LastAttempt,
    landed: &AtomicU64,
) -> Result<Vec<Bytes>, Failure> {
    let headers_wait_ms = part.headers_wait_ms;
    let object = &ctx.objects[part.object as usize];
    let store = &ctx.store;
    last.reset();
    let options = GetOptions {
        range: Some(GetRange::Bounded(part.range.clone())),
        if_match: object.etag.clone(),
        ..GetOptions::default()
    };
    let path = store.path_of(&object.key);
    let headers_wait = Duration::from_millis(headers_wait_ms);
    let got = match tokio::time::timeout(headers_wait, store.fetch.get_opts(&path, options)).await {
        Err(_) => return Err(Failure::HeadersLate),
        Ok(Err(e)) => return Err(classify(&ctx.store, object, &part.range, e, last)),
        Ok(Ok(got)) => got,
    };
    // A changed object first: its answer is another range too.
    check_unchanged(&ctx.store, object, &got.meta)?;
    if got.range != part.range {
        // object_store checks this itself; kept for a store that does not.
        return Err(Failure::Permanent(range_not_honoured(
            &ctx.store,
            object,
            &part.range,
            format!(
                "bytes {}-{}",
                got.range.start,
                got.range.end.saturating_sub(1)
            ),
        )));
    }
    stream_body(ctx, part, got.into_stream(), landed).await
}

/// Streams the body of `part`'s answer where its sink says, checking its
/// length, the stall timeout and the minimum throughput.
async fn stream_body(
    ctx: &PartContext,
    part: &AttemptJob,
    mut stream: futures::stream::BoxStream<'static, object_store::Result<Bytes>>,
    landed: &AtomicU64,
) -> Result<Vec<Bytes>, Failure> {
    let object = &ctx.objects[part.object as usize];
    let store = &ctx.store;
    let stall = Duration::from_millis(ctx.cfg.stall_timeout_ms);
    let len_bytes = part.range.end - part.range.start;
    let mut written: u64 = 0;
    let mut kept = Vec::new();
    let mut throughput = Throughput::new(&ctx.cfg);
    loop {
        let chunk = match tokio::time::timeout(stall, stream.next()).await {
            Err(_) => {
                return Err(Failure::Retry(
                    RetryCause::Stall,
                    format!(
                        "no body bytes for {} ms after {written} of {len_bytes}",
                        ctx.cfg.stall_timeout_ms
                    ),
                ))
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return Err(Failure::Retry(
                    RetryCause::BodyInterrupted,
                    format!("after {written} of {len_bytes} bytes: {e}"),
                ))
            }
            Ok(Some(Ok(chunk))) => chunk,
        };
        let n = chunk.len() as u64;
        if written + n > len_bytes {
            return Err(Failure::Permanent(RemoteError::Permanent {
                key: object.key.clone(),
                store: store.display.clone(),
                status: 0,
                detail: format!(
                    "the body of bytes {:?} is longer than the {len_bytes} bytes asked",
                    part.range
                ),
            }));
        }
        if let Sink::Direct(dest) = part.sink {
            // SAFETY: `dest` is valid for `len_bytes` writes and only this
            // task writes this part's range: the dispatcher runs one `Direct`
            // attempt of a part at a time and completes the read only after
            // it returned (FetchEngine::submit's contract keeps the memory
            // valid until then); `written + n <= len_bytes` was checked
            // above. This is the one copy: from the response chunk straight
            // into slot memory.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    chunk.as_ptr(),
                    dest.0.add(written as usize),
                    chunk.len(),
                );
            }
            landed.store(written + n, Ordering::Relaxed);
            store.metrics.bytes_landed.fetch_add(n, Ordering::Relaxed);
        }
        written += n;
        store.metrics.bytes_received.fetch_add(n, Ordering::Relaxed);
        if part.keep || matches!(part.sink, Sink::Buffer) {
            kept.push(chunk);
        }
        throughput.check(written)?;
    }
    if written < len_bytes {
        return Err(Failure::Retry(
            RetryCause::BodyInterrupted,
            format!("the body ended after {written} of {len_bytes} bytes"),
        ));
    }
    Ok(kept)
}

/// The minimum throughput of one attempt's body: over each window of
/// `throughput_window_ms` (counted from the response headers), at least
/// `min_bytes_per_s` on average. Checked as chunks arrive: a body with no
/// chunk at all for the stall timeout is the stall timeout's.
struct Throughput {
    min_bytes_per_s: u64,
    window: Duration,
    window_start: Instant,
    window_start_bytes: u64,
}

impl Throughput {
    fn new(cfg: &FetchConfig) -> Throughput {
        Throughput {
            min_bytes_per_s: cfg.min_bytes_per_s,
            window: Duration::from_millis(cfg.throughput_window_ms),
            window_start: Instant::now(),
            window_start_bytes: 0,
        }
    }

    /// After `written` body bytes in all: a window that has ended below
    /// the minimum is a failure; one above it starts the next window.
    fn check(&mut self, written: u64) -> Result<(), Failure> {
        let elapsed = self.window_start.elapsed();
        if self.min_bytes_per_s == 0 || elapsed < self.window {
            return Ok(());
        }
        let received_bytes = written - self.window_start_bytes;
        let elapsed_ms = elapsed.as_millis() as u64;
        if received_bytes.saturating_mul(1000) < self.min_bytes_per_s.saturating_mul(elapsed_ms) {
            return Err(Failure::TooSlow {
                received_bytes,
                elapsed_ms,
            });
        }
        self.window_start = Instant::now();
        self.window_start_bytes = written;
        Ok(())
    }
}
