//! The loader: the run's one door and its run loop.
//!
//! [`build`] turns a [`JobConfig`] into a running ring, entering each stage
//! of the data path once and in its order: source → listing (with its cache
//! policy) → manifest or tar index → sampler → slots → reader stack → ring.
//! [`Built::finish`] runs it and applies the after-run policy (wait for a
//! background re-list, forget a cached listing that a 404 or a 412 proved
//! stale).
//!
//! The run loop: one thread drives everything. Each rank advances on its
//! own: whenever one of its slots is free, the loader claims it, asks the
//! reader to put the batch's samples straight into the slot's payload, and
//! publishes it once every read has landed (batches of a rank are published
//! in order). A rank whose trainer is slow, or dead, never holds the other
//! ranks back.
//!
//! Rooms: `job` (the configuration), `build` (composition), `plan` (slot
//! sizing, the run's plan), `slots` (how many per rank), `stack` (the reader stack), `relisting` (the
//! background re-list), `run`, `pending`, `chunks`, `start` (the loop:
//! claim, read, publish), `keys` (each batch's sample keys), `watch` (stalls, trainers that do not come),
//! `idle` (`--idle-timeout`), `progress` (where the trainers are),
//! `stop` and `signals` (what ends a run), `errors` (one enum per
//! operation).

mod build;
mod chunks;
mod counters;
mod errors;
mod idle;
mod job;
mod keys;
mod pending;
mod plan;
mod progress;
mod relisting;
mod run;
mod said;
pub mod signals;
mod slots;
mod stack;
mod start;
mod stop;
mod token_run;
mod tokens;
mod watch;

use std::time::Duration;

pub use build::{build, BuildError, Built, FinishError, Finished};
pub use counters::write_remote_counters;
pub use errors::{PlanError, RunError, StartError};
pub use job::{DataCachePolicy, JobConfig, ListingPolicy, SampleFormat};
pub use plan::{Plan, ServeConfig};
pub use run::Loader;
pub use slots::{
    auto_slots_per_rank, AUTO_RANK_BYTES_MAX, AUTO_SLOTS_FLOOR, AUTO_SLOTS_MAX, AUTO_SLOTS_MIN,
};
pub use stack::{open_engine_for, ReadTarget, RemoteTarget};
pub use stop::StopToken;
pub use token_run::{TokenRun, TokensConfig, DEFAULT_DOC_STARTS_MAX};

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
    /// With the decode stage: images decoded, and of those served as zero
    /// images (`--on-bad-sample zero`).
    pub images: Option<(u64, u64)>,
}
