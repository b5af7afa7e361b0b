//! One listing per job: a remote prefix's listing published where every
//! node of a job can read it, so that node 0 lists (or `ringfeed manifest
//! build` lists ahead of the job) and the other nodes read the result in
//! one GET instead of each listing the prefix again (docs/manifest.md,
//! "One listing per job").
//!
//! - A **manifest** is the listing (keys, sizes, ETags) in the manifest
//!   cache's own format, kind "remote", stamped with no time: the same
//!   listing always has the same bytes. It is named by the SHA-256 of its
//!   bytes, `manifest-<sha256>.rfm`, and a reader refuses it unless its bytes
//!   hash to that (a changed, tampered or stale copy is refused by its hash).
//! - A **head** (`head.rs`) says which manifest a source uses, when it was
//!   listed and by whom: `head-<source>.txt` for the source's latest listing,
//!   `head-<source>-job-<job>.txt` for one job's, written create-only (the
//!   store's conditional put), so that a job's nodes agree on one manifest
//!   even if its node 0 restarts.
//! - The **board** (`board.rs`) is where they live: beside the data under
//!   `PREFIX/.ringfeed/` (listings skip keys with a `.ringfeed` segment), or
//!   a URL or directory the user gives.
//! - `job.rs` is who does what: node 0 publishes, the others wait for it.

mod board;
mod head;
mod job;

use std::path::PathBuf;
use std::time::Duration;

pub use board::{Board, BoardError, Created};
pub use head::{
    hex, manifest_name, Head, HEAD_BYTES_MAX, HEAD_MAGIC_LINE, JOB_ID_BYTES_MAX, MANIFEST_BYTES_MAX,
};
pub use job::{build_and_publish, head_name, obtain, Obtained, Published, Role};

use crate::manifest::ManifestError;

pub use crate::source::remote::{is_ringfeed_key, BOARD_SEGMENT};
/// Default of `--job-manifest-wait`: how long a node waits for node 0's
/// manifest before it lists itself (auto) or fails (a place given).
pub const DEFAULT_WAIT: Duration = Duration::from_secs(600);
/// First pause between two looks at a head; it grows to `POLL_MAX`.
pub const POLL_FIRST: Duration = Duration::from_millis(200);
/// Longest pause between two looks at a head.
pub const POLL_MAX: Duration = Duration::from_secs(2);

/// Where a job's manifest is published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// Beside the data: `PREFIX/.ringfeed/` of the source's own store.
    Beside,
    /// Under this URL (`s3://`, `gs://`, `az://`, `http(s)://`).
    Url(String),
    /// In this directory, on a file system every node mounts.
    Dir(PathBuf),
}

impl Place {
    /// A `--job-manifest` value that names a place: a URL or a directory.
    pub fn parse(value: &str) -> Place {
        if crate::source::remote::is_remote_url(value) {
            return Place::Url(value.to_owned());
        }
        Place::Dir(PathBuf::from(
            value.strip_prefix("file://").unwrap_or(value),
        ))
    }
}

/// How a loader takes part in publishing its job's manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publishing {
    /// Where the manifest is published.
    pub place: Place,
    /// The place was given (`--job-manifest PLACE`): a node that waits in
    /// vain fails, and a publish that fails is an error. Otherwise (auto) it
    /// lists itself, and a failed publish is a warning.
    pub explicit: bool,
    /// Node 0: lists and publishes; the other nodes wait and read.
    pub role: Role,
    /// The job's id (`--job-id`), if one is known: its nodes then agree on
    /// the job's own head, whatever other jobs publish.
    pub job: Option<String>,
    /// How long a reading node waits for the publisher.
    pub wait: Duration,
    /// A published listing older than this is listed again (node 0), or not
    /// taken without a job id (the others): `--manifest-max-age`.
    pub max_age: Duration,
    /// `--manifest-cache refresh`: node 0 lists, whatever was published.
    pub refresh: bool,
}

/// Why a job's manifest could not be had.
#[derive(Debug, thiserror::Error)]
pub enum PublishedError {
    /// Listing (or reading the local cache) failed.
    #[error(transparent)]
    Listing(#[from] ManifestError),
    /// The place cannot be read or written.
    #[error("the job's manifest of {source_shown}: {error}; {fix}")]
    Board {
        /// The source, as shown.
        source_shown: String,
        /// What failed where.
        error: BoardError,
        /// What to do.
        fix: &'static str,
    },
    /// A head or a manifest was refused (its hash, size, format or source).
    #[error("the published manifest of {source_shown} is refused: {at}: {why}; {fix}")]
    Refused {
        /// The source, as shown.
        source_shown: String,
        /// The object or file.
        at: String,
        /// Why.
        why: String,
        /// What to do.
        fix: String,
    },
    /// Node 0 did not publish in time.
    #[error("node 0 did not publish the manifest of {source_shown} at {at} within {waited_s} s{job}: is node 0's loader running (its log says why it did not publish)? Start it, run `ringfeed manifest build {source_shown}` once ahead of the job, raise --job-manifest-wait, or pass --job-manifest off (every node lists)")]
    Timeout {
        /// The source, as shown.
        source_shown: String,
        /// The head waited for.
        at: String,
        /// Seconds waited.
        waited_s: u64,
        /// " (job ID)" or "".
        job: String,
    },
    /// The source has no listing a job could share (a `--keys` file).
    #[error("--job-manifest {0}")]
    NotShareable(String),
}
