//! One error enum per operation of the loader: planning a run
//! ([`PlanError`]), making its ring ([`StartError`]) and running it
//! ([`RunError`]). Policies match on variants (and on the
//! [`RemoteError`](crate::remote::RemoteError) a read failure keeps), never
//! on a message.

use crate::manifest::ManifestError;
use crate::reader::ReadError;
use crate::ring::{CreateError, PublishError};
use crate::sampler::SamplerError;

/// Why a run cannot be planned (before the ring exists).
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The dataset could not be listed.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The order cannot be planned.
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    /// The readers' file table could not be built.
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
    /// The ring these flags and this dataset ask for cannot be built.
    #[error("cannot build the ring: {0}")]
    Shape(String),
    /// The decode stage cannot serve this dataset (`--decode image`).
    #[error("{0}")]
    Decode(String),
    /// A token corpus cannot be read or cut into windows (`--seq-len`).
    #[error(transparent)]
    Tokens(#[from] crate::tokens::TokenError),
    /// The corpora cannot be mixed as asked (`--weights`).
    #[error(transparent)]
    Mixture(#[from] crate::sampler::MixtureError),
}

impl PlanError {
    /// Whether a fresh listing could plan where this one failed: the sizes
    /// a cached listing holds set the slot size (and, with records, the
    /// number of samples).
    pub fn depends_on_sizes(&self) -> bool {
        matches!(
            self,
            PlanError::SlotTooSmall { .. }
                | PlanError::SlotSmallerThanBatch { .. }
                | PlanError::Shape(_)
        )
    }
}

/// Why the ring could not be made, or its reader opened.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The reader could not be opened.
    #[error(transparent)]
    Read(#[from] ReadError),
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
    /// The decode stage's threads could not be started.
    #[error("cannot start the decode threads: {0}; lower --decode-threads")]
    DecodeThreads(std::io::Error),
}

/// Why a run that had started stopped before its end.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A read failed: the sample is named, nothing is skipped.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The ranks asked for different starts (`--resume auto`).
    #[error("{0}")]
    StartDisagreement(String),
    /// The start the ranks asked for cannot be planned.
    #[error(transparent)]
    Sampler(#[from] SamplerError),
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
    /// Internal protocol misuse (a bug).
    #[error("internal error: {0}")]
    Publish(#[from] PublishError),
    /// The ring refused a claim.
    #[error(transparent)]
    Ring(#[from] CreateError),
    /// An image cannot be decoded (`--on-bad-sample error`).
    #[error(transparent)]
    BadSample(#[from] crate::images::BadSample),
    /// Stopped by a signal.
    #[error("stopped by signal {0}")]
    Signal(u32),
    /// Stopped by its caller ([`StopToken::stop`](super::StopToken::stop)).
    #[error("stopped by its caller")]
    Stopped,
    /// The source changed under the run (a remote prefix's background
    /// re-list): what changed and the fix.
    #[error("{0}")]
    SourceChanged(String),
    /// No trainer was attached for `--idle-timeout` (none came since the
    /// loader started, or none since the last one left).
    #[error("{} (--idle-timeout {}): the loader stopped; start it again when the trainers are ready, or give a longer --idle-timeout (off: wait for ever)",
        super::idle::idle_words(*.since_start, *.limit), super::idle::duration_words(*.limit))]
    Idle {
        /// The limit.
        limit: std::time::Duration,
        /// No trainer ever attached in this run.
        since_start: bool,
    },
}

impl RunError {
    /// Whether this failure says a listing of the source may be stale, so
    /// that a cached one must be forgotten: a local file that changed since
    /// it was listed; from a cached listing, a remote object that went (404)
    /// or changed (412), or one larger than its listing said. A refused
    /// credential (403), a server that failed or a stall says nothing of it.
    pub fn says_the_listing_is_stale(&self, listing_was_cached: bool) -> bool {
        match self {
            RunError::Read(
                ReadError::Vanished { .. }
                | ReadError::ChangedSize { .. }
                | ReadError::Grew { .. }
                | ReadError::SizeAtOpen { .. }
                | ReadError::NotRegular { .. },
            ) => true,
            RunError::SampleTooLarge { .. } => listing_was_cached,
            RunError::Read(ReadError::Remote { cause, .. }) => {
                listing_was_cached && cause.says_the_listing_is_stale()
            }
            _ => false,
        }
    }
}
