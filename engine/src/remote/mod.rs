//! Remote objects: S3, GCS, Azure and HTTP(S) through `object_store`, on a
//! tokio runtime of the engine's own, bytes straight into slot memory.
//!
//! The pieces, in the order a loader uses them:
//! - [`RemoteRuntime`]: the tokio runtime (threads of its own). Listing and
//!   fetching of one store must share it: the HTTP connection pool lives on it.
//! - [`StoreHandle::open`]: a store from a URL (`s3://BUCKET/PREFIX`,
//!   `gs://`, `az://` / `abfs://`, `http(s)://`), endpoints from the cloud's
//!   usual environment (object_store's `from_env`), credentials found as the
//!   cloud's CLI finds them (AWS profiles and the SDK chain, `az login`; see
//!   docs/remote.md), one start line naming their source, and errors that
//!   name the variable to set.
//! - [`list`], [`list_parallel`], [`list_webdav`], [`read_keys_file`]: the
//!   objects under the prefix as `(key relative to the prefix, size, ETag)`,
//!   directory markers skipped, in byte-wise order of keys.
//! - [`FetchEngine`]: reads of object ranges into caller memory, hundreds of
//!   GETs in flight, completions into a channel the loader thread drains
//!   without ever blocking on tokio; how many GETs and how fast is the
//!   store's [`admission`] controller's to say (a window and a rate limit,
//!   AIMD on throttles and refusals, shared by the process's engines of one
//!   store), and a GET slower than its size's recent p95 is asked again
//!   ([`hedge`]).
//! - [`RemoteMetrics`]: counters as plain atomics (GETs in flight, bytes,
//!   retries by cause, latency p50/p99), readable from any thread.
//!
//! Facts of object_store 0.14 this design rests on: its default 30 s
//! timeout covers the whole body and kills long downloads that are still
//! progressing (turned off; connect and per-read timeouts plus our stall
//! detector instead: a wait for headers that grows on each retry, a
//! per-chunk stall timeout and a minimum throughput per GET); a ranged GET
//! answered 200 or with another range is an error it does not tell apart
//! (the counting connector keeps the answer's range headers, and the engine
//! fails such a read at once, naming them); it retries 5xx/429 inside and hides them (turned off
//! for reads: the engine retries whole ranges and counts every cause, and
//! [`metrics::CountingConnector`] sees each attempt's status);
//! `get_range(..)` and `.bytes()` concatenate multi-chunk bodies, a second
//! copy (reads stream `get_opts(..).into_stream()` chunks into the slot).

pub mod admission;
mod answer;
mod credentials;
mod dispatch;
mod error;
mod fetch;
pub mod hedge;
mod key;
mod list;
pub mod metrics;
mod page;
mod part;
mod redact;
mod scheme;
mod split;
mod store;
mod webdav;

use std::future::Future;

pub use credentials::{CREDENTIALS_LOAD_TIMEOUT_MS, CREDENTIALS_REFRESH_BEFORE_MS};
pub use error::{RemoteError, RetryCause};
pub use fetch::{FetchCompletion, FetchEngine, FetchRead};
pub use key::check_key;
pub use list::{
    list, list_parallel, read_keys_file, ListProgress, ProgressFn, HEADS_IN_FLIGHT,
    LIST_SPLIT_AFTER_KEYS, LIST_WORKERS_MAX,
};
pub use metrics::{MetricsSnapshot, RemoteMetrics};
pub use page::s3_page_keys;
pub use part::SLOW_WARNING_INTERVAL_MS;
pub use redact::{redact_url, remember_env_secrets, remember_secrets, scrub, REDACTED};
pub use store::{
    Scheme, StoreHandle, CONNECT_TIMEOUT_MS, POOL_IDLE_PER_HOST_MAX, SOCKET_READ_TIMEOUT_MS,
};
pub use webdav::{
    list_webdav, webdav_answer_keys, PROPFIND_BYTES_MAX, PROPFIND_ENTRIES_MAX,
    PROPFIND_FIELD_BYTES_MAX,
};

/// Most GETs in flight the window may ever reach.
pub const WINDOW_MAX_LIMIT: usize = 4096;
/// Longest part of a read fetched by one GET.
pub const PART_BYTES_MAX: u64 = 64 << 20;
/// Shortest part (smaller parts would be request overhead only).
pub const PART_BYTES_MIN: u64 = 64 << 10;
/// Most attempts of one part after the first.
pub const RETRIES_MAX_LIMIT: u32 = 100;
/// Most threads of the remote runtime.
pub const RUNTIME_THREADS_MAX: usize = 64;
/// Most reads outstanding in one engine.
pub const QUEUED_READS_LIMIT: usize = 1 << 22;
/// Slowest body a GET may send, averaged over `THROUGHPUT_WINDOW_MS`, before
/// it counts as a stall (the default of `FetchConfig::min_bytes_per_s`): a
/// body trickling a byte every few seconds never trips the stall timeout.
pub const MIN_BYTES_PER_S: u64 = 1024;
/// The window a body's throughput is averaged over (the default of
/// `FetchConfig::throughput_window_ms`).
pub const THROUGHPUT_WINDOW_MS: u64 = 30_000;
/// Longest wait for a GET's response headers: the wait starts at
/// `FetchConfig::stall_timeout_ms` and doubles on each retry of a GET whose
/// headers did not come in time, up to this (a slow gateway, or a server
/// hashing a large object before it answers, gets its time).
pub const HEADER_TIMEOUT_MAX_MS: u64 = 60_000;

/// One object of a remote source.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RemoteObject {
    /// The key relative to the source's prefix (no leading `/`).
    pub key: String,
    /// Its size in bytes when listed.
    pub size: u64,
    /// Its ETag when listed, if the store gives one; reads send it as
    /// `If-Match` and compare it with the response's.
    pub etag: Option<String>,
}

/// Tuning of the fetch engine.
#[derive(Clone, Debug)]
pub struct FetchConfig {
    /// GETs in flight at the start, `window_min..=window_max`.
    pub window_initial: usize,
    /// The window never shrinks below this (1 or more).
    pub window_min: usize,
    /// The window never grows past this (up to `WINDOW_MAX_LIMIT`).
    pub window_max: usize,
    /// Bytes of ranges being fetched at once; a part bigger than the budget
    /// still goes, alone.
    pub bytes_in_flight_max: u64,
    /// Reads longer than this are split into parallel ranged GETs,
    /// `PART_BYTES_MIN..=PART_BYTES_MAX`.
    pub part_bytes: u64,
    /// Reads outstanding (queued, in flight or unreaped) at most.
    pub queued_reads_max: usize,
    /// Retries of one part before it fails, up to `RETRIES_MAX_LIMIT`.
    pub retries_max: u32,
    /// First backoff; doubles per retry.
    pub backoff_base_ms: u64,
    /// Longest backoff.
    pub backoff_max_ms: u64,
    /// No body bytes for this long, or no response headers on a GET's first
    /// attempt: cancel, retry (the wait for headers doubles on each retry,
    /// up to `HEADER_TIMEOUT_MAX_MS`).
    pub stall_timeout_ms: u64,
    /// A body slower than this, averaged over `throughput_window_ms`, is a
    /// stall: cancel, retry. 0: no minimum.
    pub min_bytes_per_s: u64,
    /// The window of `min_bytes_per_s`.
    pub throughput_window_ms: u64,
}

impl Default for FetchConfig {
    fn default() -> FetchConfig {
        FetchConfig {
            window_initial: 256,
            window_min: 8,
            window_max: 1024,
            bytes_in_flight_max: 1 << 30,
            part_bytes: 8 << 20,
            queued_reads_max: 1 << 16,
            retries_max: 10,
            backoff_base_ms: 100,
            backoff_max_ms: 10_000,
            stall_timeout_ms: 5_000,
            min_bytes_per_s: MIN_BYTES_PER_S,
            throughput_window_ms: THROUGHPUT_WINDOW_MS,
        }
    }
}

impl FetchConfig {
    fn validate(&self) -> Result<(), RemoteError> {
        let bad = |reason: String| Err(RemoteError::InvalidConfig { reason });
        if !(1..=WINDOW_MAX_LIMIT).contains(&self.window_max) {
            return bad(format!(
                "window_max {} is not in 1..={WINDOW_MAX_LIMIT}",
                self.window_max
            ));
        }
        if self.window_min == 0 || self.window_min > self.window_max {
            return bad(format!(
                "window_min {} is not in 1..=window_max ({})",
                self.window_min, self.window_max
            ));
        }
        if !(self.window_min..=self.window_max).contains(&self.window_initial) {
            return bad(format!(
                "window_initial {} is not in {}..={}",
                self.window_initial, self.window_min, self.window_max
            ));
        }
        if !(PART_BYTES_MIN..=PART_BYTES_MAX).contains(&self.part_bytes) {
            return bad(format!(
                "part_bytes {} is not in {PART_BYTES_MIN}..={PART_BYTES_MAX}",
                self.part_bytes
            ));
        }
        if self.bytes_in_flight_max == 0 {
            return bad("bytes_in_flight_max is 0".to_string());
        }
        if !(1..=QUEUED_READS_LIMIT).contains(&self.queued_reads_max) {
            return bad(format!(
                "queued_reads_max {} is not in 1..={QUEUED_READS_LIMIT}",
                self.queued_reads_max
            ));
        }
        if self.retries_max > RETRIES_MAX_LIMIT {
            return bad(format!(
                "retries_max {} is over {RETRIES_MAX_LIMIT}",
                self.retries_max
            ));
        }
        if self.stall_timeout_ms == 0 || self.backoff_max_ms < self.backoff_base_ms {
            return bad(format!(
                "stall_timeout_ms {} must be over 0 and backoff_max_ms {} at least backoff_base_ms {}",
                self.stall_timeout_ms, self.backoff_max_ms, self.backoff_base_ms
            ));
        }
        if self.min_bytes_per_s > 0 && self.throughput_window_ms == 0 {
            return bad(format!(
                "throughput_window_ms is 0 with min_bytes_per_s {}: give a window, or 0 bytes/s for no minimum",
                self.min_bytes_per_s
            ));
        }
        Ok(())
    }
}

/// The tokio runtime of the remote engine: worker threads of its own, so the
/// loader thread stays one thread and never runs tokio itself.
#[derive(Debug)]
pub struct RemoteRuntime {
    runtime: tokio::runtime::Runtime,
}

impl RemoteRuntime {
    /// A multi-threaded runtime of `threads` workers (1 to `RUNTIME_THREADS_MAX`).
    pub fn new(threads: usize) -> Result<RemoteRuntime, RemoteError> {
        if !(1..=RUNTIME_THREADS_MAX).contains(&threads) {
            return Err(RemoteError::InvalidConfig {
                reason: format!("runtime threads {threads} is not in 1..={RUNTIME_THREADS_MAX}"),
            });
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("ringfeed-remote")
            .enable_all()
            .build()
            .map_err(|e| RemoteError::Stopped {
                reason: format!("cannot start the remote runtime's {threads} threads: {e}"),
            })?;
        Ok(RemoteRuntime { runtime })
    }

    /// A handle to spawn on.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        self.runtime.handle()
    }

    /// Runs `f` to its end on the runtime, blocking the calling thread (which
    /// must not be one of the runtime's: listing calls this from the loader's
    /// start, before any batch is served).
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }
}
