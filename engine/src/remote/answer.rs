//! What a store's answer to one GET means: a changed object, a range the
//! server did not honour, or an error to retry or give up on.

use super::error::{RemoteError, RetryCause};
use super::metrics::{AttemptOutcome, LastAttempt, RangeHeaders};
use std::ops::Range;

use super::store::StoreHandle;
use super::RemoteObject;

/// How one attempt failed.
pub(crate) enum Failure {
    Retry(RetryCause, String),
    /// No response headers within the attempt's wait: retried (as a stall)
    /// with a longer wait.
    HeadersLate,
    /// The body came slower than `min_bytes_per_s` over a window: retried
    /// as a stall.
    TooSlow {
        received_bytes: u64,
        elapsed_ms: u64,
    },
    Permanent(RemoteError),
    /// Cancelled by the dispatcher: a hedge of it won, or it lost to one.
    Cancelled,
}

/// The error for a ranged GET answered with something else than the range.
pub(super) fn range_not_honoured(
    store: &StoreHandle,
    object: &RemoteObject,
    range: &Range<u64>,
    answer: String,
) -> RemoteError {
    RemoteError::RangeNotHonoured {
        key: object.key.clone(),
        store: store.display.clone(),
        first: range.start,
        last: range.end.saturating_sub(1),
        answer,
    }
}

/// Whether a 2xx answer to `part`'s ranged GET (which object_store refused)
/// was another range or the whole object: a permanent error naming the
/// answer. `None` for a 206 that does give the range asked.
fn range_answer_error(
    store: &StoreHandle,
    object: &RemoteObject,
    range: &Range<u64>,
    status: u16,
    head: &RangeHeaders,
) -> Option<RemoteError> {
    let asked = format!("bytes {}-{}/", range.start, range.end.saturating_sub(1));
    let range_ok = head
        .content_range
        .as_deref()
        .is_some_and(|r| r.trim().starts_with(&asked));
    if status == 206 && range_ok {
        return None;
    }
    // `bytes A-B/SIZE` of another size: the object changed (it shrank
    // under the range asked), not a server that ignores Range.
    let total = head
        .content_range
        .as_deref()
        .and_then(|r| r.trim().rsplit_once('/'))
        .and_then(|(_, size)| size.parse::<u64>().ok());
    if let Some(total) = total.filter(|t| status == 206 && *t != object.size) {
        return Some(RemoteError::Changed {
            key: object.key.clone(),
            store: store.display.clone(),
            what: format!("size {} bytes, now {total}", object.size),
        });
    }
    let shown = |v: &Option<String>| match v {
        Some(v) => format!("{v:?}"),
        None => "none".to_string(),
    };
    let answer = format!(
        "HTTP {status} with Content-Range {} and Content-Length {}",
        shown(&head.content_range),
        shown(&head.content_length)
    );
    Some(range_not_honoured(store, object, range, answer))
}

pub(super) fn check_unchanged(
    store: &StoreHandle,
    object: &RemoteObject,
    meta: &object_store::ObjectMeta,
) -> Result<(), Failure> {
    let changed = |what: String| {
        Err(Failure::Permanent(RemoteError::Changed {
            key: object.key.clone(),
            store: store.display.clone(),
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
pub(super) fn classify(
    store: &StoreHandle,
    object: &RemoteObject,
    range: &Range<u64>,
    e: object_store::Error,
    attempt: &LastAttempt,
) -> Failure {
    use object_store::Error as E;
    let last = attempt.get();
    let key = object.key.clone();
    let scheme = store.scheme;
    let handle = store;
    let store = store.display.clone();
    let denied = |status| {
        Failure::Permanent(RemoteError::Denied {
            key: key.clone(),
            store: store.clone(),
            status,
            scheme,
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
            if let AttemptOutcome::Status(status @ 200..=299) = last {
                // A success status with an error: object_store refused the
                // answer, and for a ranged GET that is a range it did not ask for.
                if let Some(e) = range_answer_error(handle, object, range, status, &attempt.head())
                {
                    return Failure::Permanent(e);
                }
            }
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
