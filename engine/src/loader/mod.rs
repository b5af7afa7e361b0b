//! The loader: manifest → sampler → readers → ring.
//!
//! One thread drives everything. Each rank advances on its own: whenever one
//! of its slots is free, the loader claims it, asks the reader to put the
//! batch's samples straight into the slot's payload, and publishes it once
//! every read has landed (batches of a rank are published in order). A rank
//! whose trainer is slow, or dead, never holds the other ranks back.

//!
//! Three rooms: `plan` (the configuration, slot sizing, the run's plan),
//! `run` (the loop: claim, read, publish) and `watch` (stalls, trainers
//! that do not come, progress).

mod chunks;
mod counters;
mod pending;
mod plan;
mod run;
pub mod signals;
mod stack;
mod start;
mod watch;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::manifest::ManifestError;
use crate::reader::ReadError;
use crate::ring::{CreateError, PublishError};
use crate::sampler::SamplerError;

pub use counters::write_remote_counters;
pub use plan::{
    auto_slots_per_rank, Plan, ServeConfig, AUTO_RANK_BYTES_MAX, AUTO_SLOTS_FLOOR, AUTO_SLOTS_MAX,
    AUTO_SLOTS_MIN,
};
pub use run::Loader;
pub use stack::{open_engine_for, ReadTarget, RemoteTarget};

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The dataset could not be listed.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The run cannot be planned.
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    /// The ranks asked for different starts (`--resume auto`).
    #[error("{0}")]
    StartDisagreement(String),
    /// The ring could not be made.
    #[error(transparent)]
    Ring(#[from] CreateError),
    /// /dev/shm is too small for the ring; `advice` names the flag and
    /// value that would make one fit, where one would.
    #[error("{source}{advice}")]
    RingDoesNotFit {
        /// The ring's error, with its /dev/shm advice.
        source: CreateError,
        /// "; or ..." naming a flag and a value, or empty.
        advice: String,
    },
    /// A read failed: the sample is named, nothing is skipped.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// A sample is larger than the given slot size.
    #[error("sample {index} ({path}, {len} bytes) does not fit a slot of --slot-bytes {slot_bytes}; raise --slot-bytes to {derived}, or leave it out to size slots from the data")]
    SlotTooSmall {
        /// Sample index.
        index: u64,
        /// Its file.
        path: String,
        /// Its length.
        len: u64,
        /// The given slot size.
        slot_bytes: u64,
        /// The slot size derived from the data.
        derived: u64,
    },
    /// The given slot size is below the batch-size largest samples together:
    /// a batch that draws them would stop the run wherever it comes.
    #[error("--slot-bytes {slot_bytes} is smaller than the {batch_size} largest samples together ({derived} bytes), which a batch may draw; raise --slot-bytes to {derived}, or leave it out to size slots from the data")]
    SlotSmallerThanBatch {
        /// The given slot size.
        slot_bytes: u64,
        /// Samples per batch.
        batch_size: u32,
        /// The batch-size largest samples together.
        derived: u64,
    },
    /// A batch does not fit a slot of the given size (checked at the start:
    /// only a manifest that lied about sizes gets here).
    #[error("sample {index} ({path}, {len} bytes) does not fit: batch {epoch}:{step} of rank {rank} needs {needed} bytes, --slot-bytes is {slot_bytes}; raise it, or leave it out to size slots from the data")]
    SampleTooLarge {
        /// Sample index.
        index: u64,
        /// Its file.
        path: String,
        /// Its length.
        len: u64,
        /// Where.
        epoch: u64,
        /// Where.
        step: u64,
        /// Where.
        rank: u32,
        /// Bytes the batch needs.
        needed: u64,
        /// Slot payload size.
        slot_bytes: u64,
    },
    /// The ring these flags and this dataset ask for cannot be built.
    #[error("cannot build the ring: {0}")]
    Shape(String),
    /// Internal protocol misuse (a bug).
    #[error("internal error: {0}")]
    Publish(#[from] PublishError),
    /// Stopped by a signal.
    #[error("stopped by signal {0}")]
    Signal(u32),
    /// Stopped by its caller (`stop` set to [`STOP_NOT_A_SIGNAL`]).
    #[error("stopped by its caller")]
    Stopped,
    /// The source changed under the run (a remote prefix's background
    /// re-list, `signals::stop_with`): what changed and the fix.
    #[error("{0}")]
    SourceChanged(String),
}

/// A `stop` value that is not a signal: the caller (the demo, when one of
/// its consumers failed) ends the run; trainers see "stopped on an error".
pub const STOP_NOT_A_SIGNAL: u32 = u32::MAX;

/// What a finished run did.
#[derive(Clone, Debug, Default)]
pub struct ServeReport {
    /// Batches published, all ranks.
    pub batches: u64,
    /// Samples published.
    pub samples: u64,
    /// Payload bytes published.
    pub bytes: u64,
    /// Time from ring creation to the last release.
    pub elapsed: Duration,
    /// Time from ring creation to the first publish.
    pub first_publish: Option<Duration>,
    /// Time from ring creation until every rank had its first batch.
    pub all_first_published: Option<Duration>,
    /// Reader backend used.
    pub backend: &'static str,
}

pub(crate) fn check_stop(stop: &AtomicU32) -> Result<(), ServeError> {
    match stop.load(Ordering::Relaxed) {
        0 => Ok(()),
        STOP_NOT_A_SIGNAL => Err(signals::stopped_error(stop)),
        sig => Err(ServeError::Signal(sig)),
    }
}
