//! Errors of the remote engine: each names the URL or key, what the store
//! said (status, cause) and the one thing to do about it.

use std::fmt;

use super::scheme::Scheme;

/// Why a retryable attempt failed (the retry counters are kept per cause).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RetryCause {
    /// HTTP 429, or 503 (S3's SlowDown): the store asks us to slow down.
    Throttled,
    /// Another 5xx status.
    ServerError,
    /// The connection could not be made, or was reset before a response.
    Connect,
    /// No response headers, or no body bytes, for the stall limit; or a
    /// body slower than the minimum throughput.
    Stall,
    /// The body broke off (reset, early end, decode error) mid-transfer.
    BodyInterrupted,
    /// A timeout reported by the HTTP client itself.
    Timeout,
    /// A store error that carried no status (in-process stores).
    Other,
}

impl RetryCause {
    /// Every cause, in the order of `RemoteMetrics::retries`.
    pub const ALL: [RetryCause; 7] = [
        RetryCause::Throttled,
        RetryCause::ServerError,
        RetryCause::Connect,
        RetryCause::Stall,
        RetryCause::BodyInterrupted,
        RetryCause::Timeout,
        RetryCause::Other,
    ];

    /// Index into `RemoteMetrics::retries`.
    pub fn index(self) -> usize {
        self as usize
    }

    /// A short name for messages and `stat`.
    pub fn name(self) -> &'static str {
        match self {
            RetryCause::Throttled => "throttled (429/503)",
            RetryCause::ServerError => "server error (5xx)",
            RetryCause::Connect => "connect/reset",
            RetryCause::Stall => "stall",
            RetryCause::BodyInterrupted => "body interrupted",
            RetryCause::Timeout => "timeout",
            RetryCause::Other => "other",
        }
    }
}

impl fmt::Display for RetryCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What went wrong in the remote engine.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The source URL cannot name a store.
    #[error(
        "source URL {url:?} is not usable: {reason}; expected s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, \
         az://CONTAINER/PREFIX, abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX or http(s)://HOST/PATH"
    )]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No credentials, or an incomplete set, in the environment.
    #[error("{url}: {reason}; set {fix}")]
    MissingCredentials {
        /// The source URL.
        url: String,
        /// What is missing.
        reason: String,
        /// The environment variables to set.
        fix: String,
    },
    /// A credential source was found but could not give credentials (a
    /// failing `credential_process`, an expired SSO session, a broken profile).
    #[error("{url}: AWS credentials from {tried} could not be loaded: {detail}; {fix}")]
    CredentialSource {
        /// The source URL.
        url: String,
        /// Which source was tried.
        tried: String,
        /// What it said.
        detail: String,
        /// What to do about it.
        fix: String,
    },
    /// object_store refused to build the store.
    #[error("{url}: cannot configure the {scheme} store: {detail}; check {fix}")]
    Config {
        /// The source URL.
        url: String,
        /// Which kind of store.
        scheme: Scheme,
        /// object_store's message.
        detail: String,
        /// The environment variables that configure it.
        fix: &'static str,
    },
    /// Listing failed.
    #[error("listing {url} failed: {detail}{}", hint_suffix(*scheme, *status))]
    Listing {
        /// The source URL (or prefix being listed).
        url: String,
        /// The HTTP status of the last attempt, 0 when none.
        status: u16,
        /// Which kind of store.
        scheme: Scheme,
        /// What the store said.
        detail: String,
    },
    /// A `--keys` file line that cannot be read.
    #[error("keys file {path}, line {line}: {reason}; expected `KEY` or `KEY<TAB>SIZE` per line")]
    KeysFile {
        /// The file.
        path: String,
        /// 1-based line number (0: the file as a whole).
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The object is not there (HTTP 404).
    #[error(
        "object {key:?} was not found in {store} (HTTP 404); it was deleted or renamed after listing, \
         or the prefix is wrong: re-list the source (remove the cached manifest) or fix the prefix"
    )]
    NotFound {
        /// The key, relative to the source prefix.
        key: String,
        /// The store's display name.
        store: String,
    },
    /// The credentials may not read the object (HTTP 401/403).
    #[error("reading {key:?} from {store} was refused (HTTP {status}): {}", scheme.permission_fix())]
    Denied {
        /// The key.
        key: String,
        /// The store's display name.
        store: String,
        /// 401 or 403.
        status: u16,
        /// Which kind of store (chooses the fix).
        scheme: Scheme,
    },
    /// The object changed between listing and reading.
    #[error(
        "object {key:?} in {store} changed since it was listed ({what}); a dataset must not change \
         under a run: restore it, or re-list the source (remove the cached manifest) and restart"
    )]
    Changed {
        /// The key.
        key: String,
        /// The store's display name.
        store: String,
        /// Which property changed, with both values.
        what: String,
    },
    /// Every retry failed.
    #[error(
        "reading {key:?} from {store} failed {attempts} times, the last with {cause} ({detail}); \
         check that the endpoint is reachable and healthy, or raise the retry limit"
    )]
    RetriesExhausted {
        /// The key.
        key: String,
        /// The store's display name.
        store: String,
        /// Attempts made.
        attempts: u32,
        /// Cause of the last failure.
        cause: RetryCause,
        /// Its detail (status, error text).
        detail: String,
    },
    /// Every attempt's body came slower than the minimum throughput (the
    /// last attempt's figures given).
    #[error(
        "reading {key:?} from {store} failed {attempts} times: the server sent the body too slowly, \
         {received_bytes} bytes in {elapsed_ms} ms ({} bytes/s) where at least {min_bytes_per_s} bytes/s \
         averaged over {window_ms} ms are needed; the server or the network to it is overloaded or \
         throttling this client: check them, or lower --queue-depth so fewer GETs share the link",
        received_bytes.saturating_mul(1000) / (*elapsed_ms).max(1)
    )]
    TooSlow {
        /// The key.
        key: String,
        /// The store's display name.
        store: String,
        /// Attempts made.
        attempts: u32,
        /// Body bytes of the last attempt's slow window.
        received_bytes: u64,
        /// How long that window lasted.
        elapsed_ms: u64,
        /// The minimum (`FetchConfig::min_bytes_per_s`).
        min_bytes_per_s: u64,
        /// The window (`FetchConfig::throughput_window_ms`).
        window_ms: u64,
    },
    /// The server answered a ranged GET with another range, or with the
    /// whole object: it does not honour HTTP Range, and asking again will
    /// not change that.
    #[error(
        "reading {key:?} from {store}: asked for bytes {first}-{last} (HTTP Range), the server answered \
         {answer}; it does not honour ranged GETs, which the loader needs: serve the data from a \
         server or proxy that supports Range requests (S3, GCS, Azure, nginx, Apache, Caddy do), or \
         turn off what strips the Range header on the way (a cache or proxy in between)"
    )]
    RangeNotHonoured {
        /// The key.
        key: String,
        /// The store's display name.
        store: String,
        /// The first byte asked for.
        first: u64,
        /// The last byte asked for (inclusive, as in the Range header).
        last: u64,
        /// What came back: status, Content-Range, Content-Length.
        answer: String,
    },
    /// A permanent failure that is none of the above (another 4xx, a bad range).
    #[error("reading {key:?} from {store} failed (HTTP {status}): {detail}")]
    Permanent {
        /// The key.
        key: String,
        /// The store's display name.
        store: String,
        /// The HTTP status (0: none).
        status: u16,
        /// What the store said.
        detail: String,
    },
    /// A read that cannot be started as given.
    #[error("invalid remote read: {reason}")]
    InvalidRead {
        /// What is wrong with it.
        reason: String,
    },
    /// The engine's queue is full; the caller should drain completions first.
    #[error(
        "remote engine busy: {queued} reads queued, at most {max_queued}; reap completions first"
    )]
    Busy {
        /// Reads queued or in flight.
        queued: usize,
        /// The limit.
        max_queued: usize,
    },
    /// The engine's runtime is gone (it was shut down or panicked).
    #[error("the remote engine has stopped: {reason}")]
    Stopped {
        /// Why.
        reason: String,
    },
    /// A configuration value out of its limits.
    #[error("invalid remote engine configuration: {reason}")]
    InvalidConfig {
        /// Which value and its limits.
        reason: String,
    },
}

impl RemoteError {
    /// True for the answers that say a listing is out of date: the object
    /// is gone (404) or changed since it was listed (412, another size). A
    /// refused credential, a failing server or a stall says nothing of it.
    pub fn says_the_listing_is_stale(&self) -> bool {
        matches!(
            self,
            RemoteError::NotFound { .. } | RemoteError::Changed { .. }
        )
    }
}

fn hint_suffix(scheme: Scheme, status: u16) -> String {
    match status {
        401 | 403 => format!("; {}", scheme.permission_fix()),
        404 => "; check that the bucket (container) exists and the URL names it".to_string(),
        // No answer at all: a wrong or unreachable endpoint.
        0 => format!(
            "; check that the endpoint is reachable and the URL is right (configured by {})",
            scheme.env_fix()
        ),
        _ => String::new(),
    }
}

/// An error's text with its root cause: object_store's "HTTP error: error
/// sending request" says nothing of why, its source chain ends in what the
/// user can act on ("Connection refused (os error 111)", a DNS failure).
pub(crate) fn with_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let text = e.to_string();
    let mut root: Option<&(dyn std::error::Error + 'static)> = None;
    let mut next = e.source();
    while let Some(s) = next {
        root = Some(s);
        next = s.source();
    }
    match root.map(|r| r.to_string()) {
        Some(cause) if !cause.is_empty() && !text.contains(&cause) => format!("{text}: {cause}"),
        _ => text,
    }
}
