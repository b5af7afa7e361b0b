//! The whole configuration of a job, made once from the command line
//! (`ServeArgs::into_config`) with every flag checked, and read by
//! [`build`](super::build): nothing after it sees a flag.

use std::path::PathBuf;

use super::ServeConfig;
use crate::cache::CacheSize;
use crate::source::ManifestCache;

/// What a sample is (`--format`, with `--record-bytes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleFormat {
    /// Records when [`ServeConfig::record_bytes`] is set, tar samples when
    /// every object is a `.tar`, else whole files (no `--format`).
    Auto,
    /// Each object is one sample (`--format files`).
    Files,
    /// Fixed-size records (`--format records` or `--record-bytes` alone;
    /// the size is [`ServeConfig::record_bytes`]).
    Records,
    /// WebDataset tar shards (`--format tar`).
    Tar,
}

/// Where a listing comes from and goes to.
#[derive(Clone, Debug)]
pub struct ListingPolicy {
    /// The manifest cache (with its remote max age); None: off, or no
    /// cache directory is known.
    pub cache: Option<ManifestCache>,
    /// List even when a cached listing is valid, and store it
    /// (`--manifest-cache refresh`).
    pub refresh: bool,
    /// A local source: also read files that links point to outside it.
    pub follow_links_outside: bool,
    /// One listing per job: this node's part in publishing a remote
    /// source's manifest (`--job-manifest`); None: it lists alone.
    pub publishing: Option<crate::source::published::Publishing>,
}

/// The disk data cache of a remote source (`--cache`, `--cache-size`).
#[derive(Clone, Debug)]
pub enum DataCachePolicy {
    /// `--cache off`: every epoch reads from the source.
    Off,
    /// Cache under `root` (None: no cache directory is known), at most `size`.
    On {
        /// The cache's data/ directory.
        root: Option<PathBuf>,
        /// Its limit.
        size: CacheSize,
        /// Whether the size was given (a local source says it is ignored).
        size_given: bool,
    },
}

/// Everything a job needs, checked.
#[derive(Clone, Debug)]
pub struct JobConfig {
    /// The run's shape: source, ranks, order, slots, reader.
    pub serve: ServeConfig,
    /// What a sample is.
    pub format: SampleFormat,
    /// Where the listing comes from.
    pub listing: ListingPolicy,
    /// The data cache.
    pub data_cache: DataCachePolicy,
    /// Serve Prometheus metrics at this address (`--metrics`).
    pub metrics: Option<String>,
    /// Stop once no trainer has been attached for this long
    /// (`--idle-timeout`; None: wait for ever).
    pub idle_timeout: Option<std::time::Duration>,
}

impl JobConfig {
    /// A job over `serve` with no cache of any kind, no metrics and the
    /// format told by the data: what the demo and tests run.
    pub fn plain(serve: ServeConfig) -> JobConfig {
        JobConfig {
            serve,
            format: SampleFormat::Auto,
            listing: ListingPolicy {
                cache: None,
                refresh: false,
                follow_links_outside: false,
                publishing: None,
            },
            data_cache: DataCachePolicy::Off,
            metrics: None,
            idle_timeout: None,
        }
    }
}
