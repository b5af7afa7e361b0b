//! One ranged GET, retried until its whole range has landed in its
//! destination or it fails for good.
//!
//! A retry rewrites the part's whole range from its first byte, so a fault
//! never leaves a torn sample: the destination holds either all of one
//! attempt's bytes or the read completes with an error.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use object_store::{GetOptions, GetRange};

use super::error::{RemoteError, RetryCause};
use super::metrics::{AttemptOutcome, LastAttempt, LAST_ATTEMPT};
use super::store::StoreHandle;
use super::{FetchConfig, RemoteObject};

/// A destination pointer that may cross to a runtime thread.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DestPtr(pub(crate) *mut u8);

// SAFETY: the pointer is written only by the one part task that owns its
// range, and `FetchEngine::submit`'s contract keeps the memory valid and
// untouched by anyone else until the read's completion is reaped.
unsafe impl Send for DestPtr {}
// SAFETY: as above; `DestPtr` is never dereferenced through a shared reference.
unsafe impl Sync for DestPtr {}

/// One ranged GET of one read.
#[derive(Debug)]
pub(crate) struct Part {
    /// The read this part belongs to (engine-internal id).
    pub(crate) read_id: u64,
    /// Index into the object table.
    pub(crate) object: u32,
    /// Byte range in the object.
    pub(crate) range: Range<u64>,
    /// Where `range.start` goes.
    pub(crate) dest: DestPtr,
    /// Keep the body's chunks (refcounted, no copy) for the completion.
    pub(crate) keep: bool,
}

/// Everything a part task needs, shared by all of them.
#[derive(Debug)]
pub(crate) struct PartContext {
    pub(crate) store: StoreHandle,
    pub(crate) objects: Arc<Vec<RemoteObject>>,
    pub(crate) cfg: FetchConfig,
    pub(crate) jitter: RandomState,
}

/// How one attempt failed.
enum Failure {
    Retry(RetryCause, String),
    Permanent(RemoteError),
}

/// What a finished part reports to the dispatcher.
pub(crate) struct PartDone {
    pub(crate) read_id: u64,
    pub(crate) len_bytes: u64,
    pub(crate) result: Result<(), RemoteError>,
    /// The body's chunks in order, when the part asked to keep them and
    /// succeeded; else empty.
    pub(crate) chunks: Vec<Bytes>,
}

/// Fetches `part`, retrying with exponential backoff and jitter.
pub(crate) async fn fetch_part(ctx: Arc<PartContext>, part: Part) -> PartDone {
    let len_bytes = part.range.end - part.range.start;
    let started = Instant::now();
    let last = Arc::new(LastAttempt::default());
    let mut attempts: u32 = 0;
    let result = loop {
        attempts += 1;
        let outcome = LAST_ATTEMPT
            .scope(Arc::clone(&last), attempt_once(&ctx, &part, &last))
            .await;
        match outcome {
            Ok(chunks) => break Ok(chunks),
            Err(Failure::Permanent(e)) => break Err(e),
            Err(Failure::Retry(cause, detail)) => {
                if attempts > ctx.cfg.retries_max {
                    let object = &ctx.objects[part.object as usize];
                    break Err(RemoteError::RetriesExhausted {
                        key: object.key.clone(),
                        store: ctx.store.display.clone(),
                        attempts,
                        cause,
                        detail,
                    });
                }
                ctx.store.metrics.add_retry(cause);
                tracing::debug!(
                    "retrying bytes {:?} of object #{} after {cause}: {detail}",
                    part.range,
                    part.object
                );
                tokio::time::sleep(backoff(&ctx, attempts, part.read_id)).await;
            }
        }
    };
    if result.is_ok() {
        let m = &ctx.store.metrics;
        m.gets_ok.fetch_add(1, Ordering::Relaxed);
        m.get_latency
            .record_us(started.elapsed().as_micros() as u64);
    }
    let (result, chunks) = match result {
        Ok(chunks) => (Ok(()), chunks),
        Err(e) => (Err(e), Vec::new()),
    };
    PartDone {
        read_id: part.read_id,
        len_bytes,
        result,
        chunks,
    }
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

/// One GET of `part`; the body's chunks when `part.keep` (a retry starts
/// a fresh list).
async fn attempt_once(
    ctx: &PartContext,
    part: &Part,
    last: &LastAttempt,
) -> Result<Vec<Bytes>, Failure> {
    let object = &ctx.objects[part.object as usize];
    let store = &ctx.store;
    let stall = Duration::from_millis(ctx.cfg.stall_timeout_ms);
    let len_bytes = part.range.end - part.range.start;
    last.reset();
    let options = GetOptions {
        range: Some(GetRange::Bounded(part.range.clone())),
        if_match: object.etag.clone(),
        ..GetOptions::default()
    };
    let path = store.path_of(&object.key);
    let got = match tokio::time::timeout(stall, store.fetch.get_opts(&path, options)).await {
        Err(_) => {
            return Err(Failure::Retry(
                RetryCause::Stall,
                format!("no response headers within {} ms", ctx.cfg.stall_timeout_ms),
            ))
        }
        Ok(Err(e)) => return Err(classify(ctx, object, e, last.get())),
        Ok(Ok(got)) => got,
    };
    check_unchanged(ctx, object, &got.meta)?;
    if got.range != part.range {
        return Err(Failure::Permanent(RemoteError::Permanent {
            key: object.key.clone(),
            store: store.display.clone(),
            status: 0,
            detail: format!(
                "asked for bytes {:?}, the store sent {:?}; the server does not honour Range requests",
                part.range, got.range
            ),
        }));
    }
    let mut stream = got.into_stream();
    let mut written: u64 = 0;
    let mut kept = Vec::new();
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
        // SAFETY: `dest` is valid for `len_bytes` writes and only this task
        // writes this part's range (FetchEngine::submit's contract), and
        // `written + n <= len_bytes` was checked above. This is the one copy:
        // from the response chunk straight into slot memory.
        unsafe {
            std::ptr::copy_nonoverlapping(
                chunk.as_ptr(),
                part.dest.0.add(written as usize),
                chunk.len(),
            );
        }
        written += n;
        store.metrics.bytes_received.fetch_add(n, Ordering::Relaxed);
        if part.keep {
            kept.push(chunk);
        }
    }
    if written < len_bytes {
        return Err(Failure::Retry(
            RetryCause::BodyInterrupted,
            format!("the body ended after {written} of {len_bytes} bytes"),
        ));
    }
    Ok(kept)
}

fn check_unchanged(
    ctx: &PartContext,
    object: &RemoteObject,
    meta: &object_store::ObjectMeta,
) -> Result<(), Failure> {
    let changed = |what: String| {
        Err(Failure::Permanent(RemoteError::Changed {
            key: object.key.clone(),
            store: ctx.store.display.clone(),
            what,
        }))
    };
    if meta.size != object.size {
        return changed(format!("size {} bytes, now {}", object.size, meta.size));
    }
    if let (Some(listed), Some(now)) = (&object.etag, &meta.e_tag) {
        if !same_etag(listed, now) {
            return changed(format!("ETag {listed}, now {now}"));
        }
    }
    Ok(())
}

/// Whether two ETags name the same version: Azure lists them bare
/// (`0x1FE9...`) and sends them quoted in a GET's header (`"0x1FE9..."`), so
/// quotes and a weak `W/` mark are not part of the comparison.
fn same_etag(listed: &str, now: &str) -> bool {
    let bare = |tag: &str| {
        tag.trim()
            .trim_start_matches("W/")
            .trim_matches('"')
            .to_owned()
    };
    bare(listed) == bare(now)
}

/// Sorts a store error into retry or give up, using the status of the last
/// HTTP attempt where object_store's error hides it.
fn classify(
    ctx: &PartContext,
    object: &RemoteObject,
    e: object_store::Error,
    last: AttemptOutcome,
) -> Failure {
    use object_store::Error as E;
    let key = object.key.clone();
    let store = ctx.store.display.clone();
    let denied = |status| {
        Failure::Permanent(RemoteError::Denied {
            key: key.clone(),
            store: store.clone(),
            status,
            scheme: ctx.store.scheme,
        })
    };
    match e {
        E::NotFound { .. } => Failure::Permanent(RemoteError::NotFound { key, store }),
        E::PermissionDenied { .. } => denied(403),
        E::Unauthenticated { .. } => denied(401),
        E::Precondition { .. } => Failure::Permanent(RemoteError::Changed {
            key,
            store,
            what: format!(
                "ETag {} no longer matches (If-Match failed)",
                object.etag.as_deref().unwrap_or("?")
            ),
        }),
        other => {
            let detail = super::error::with_cause(&other);
            match last {
                AttemptOutcome::Status(429 | 503) => Failure::Retry(RetryCause::Throttled, detail),
                AttemptOutcome::Status(500..=599) => {
                    Failure::Retry(RetryCause::ServerError, detail)
                }
                AttemptOutcome::Status(404) => {
                    Failure::Permanent(RemoteError::NotFound { key, store })
                }
                AttemptOutcome::Status(s @ (401 | 403)) => denied(s),
                AttemptOutcome::Status(412) => Failure::Permanent(RemoteError::Changed {
                    key,
                    store,
                    what: "If-Match failed (HTTP 412)".to_string(),
                }),
                AttemptOutcome::Status(status @ 400..=499) => {
                    Failure::Permanent(RemoteError::Permanent {
                        key,
                        store,
                        status,
                        detail,
                    })
                }
                AttemptOutcome::Connect | AttemptOutcome::Interrupted => {
                    Failure::Retry(RetryCause::Connect, detail)
                }
                AttemptOutcome::Timeout => Failure::Retry(RetryCause::Timeout, detail),
                AttemptOutcome::Status(_) | AttemptOutcome::Transport | AttemptOutcome::None => {
                    Failure::Retry(RetryCause::Other, detail)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_etag_listed_bare_is_the_same_as_the_quoted_one_a_get_sends() {
        assert!(super::same_etag("0x1FE9", "\"0x1FE9\""));
        assert!(super::same_etag("W/\"ab\"", "\"ab\""));
        assert!(!super::same_etag("0x1FE9", "\"0x1FEA\""));
    }
}
