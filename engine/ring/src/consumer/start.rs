//! A trainer's side of `serve --resume auto` (see `crate::start`): ask the
//! loader to start where a checkpoint goes on, or let the first batch say
//! "from the loader's start".

use super::Consumer;
use crate::layout::RunStart;
use crate::start::{self, StartRequest};
use crate::sync::Ordering;

/// How the loader decides where its run starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartMode {
    /// At its own `--resume` (or the beginning): trainers cannot move it.
    Fixed,
    /// It waits for every rank's request (`--resume auto`), none decided yet.
    Awaiting,
    /// It waited for the ranks' requests and started where they agreed.
    Decided,
}

/// Why a start request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    /// The loader does not wait for its trainers' start.
    #[error("the loader of {name:?} does not wait for its trainers to say where to start; start it with `ringfeed run` (or `serve --resume auto`), or give it the checkpoint's --resume")]
    NotAwaited {
        /// The name.
        name: String,
    },
    /// The loader already started elsewhere (a trainer restarted while the
    /// loader ran on).
    #[error("the loader of {name:?} already serves from epoch {epoch}, {samples} samples consumed, not from the requested {want_epoch}:{want_samples}; a start is asked before the first batch of the run")]
    AlreadyStarted {
        /// The name.
        name: String,
        /// Where it started.
        epoch: u64,
        /// Samples consumed before it started.
        samples: u64,
        /// The requested epoch.
        want_epoch: u64,
        /// The requested samples.
        want_samples: u64,
    },
}

impl Consumer {
    /// How the loader decides its start.
    pub fn start_mode(&self) -> StartMode {
        let header = self.view.header();
        match (start::awaits_start(header), start::start_known(header)) {
            (false, _) => StartMode::Fixed,
            (true, false) => StartMode::Awaiting,
            (true, true) => StartMode::Decided,
        }
    }

    /// The loader's start as the header holds it now: known at attach, or
    /// once the ranks' requests were agreed (`--resume auto`).
    pub(super) fn start_now(&self) -> Option<RunStart> {
        if self.job.start.is_some() {
            return self.job.start;
        }
        let header = self.view.header();
        start::start_known(header).then(|| RunStart {
            epoch: header.start_epoch.load(Ordering::Relaxed),
            samples_consumed: header.start_samples.load(Ordering::Relaxed),
            dataset_samples: header.dataset_samples.load(Ordering::Relaxed),
        })
    }

    /// Samples in the dataset, known before the start is (`--resume auto`
    /// writes them before READY); None from a loader that does not say.
    pub fn dataset_samples(&self) -> Option<u64> {
        if let Some(s) = self.start_now() {
            return Some(s.dataset_samples);
        }
        let header = self.view.header();
        start::awaits_start(header).then(|| header.dataset_samples.load(Ordering::Relaxed))
    }

    /// Asks the loader to start this rank's run at resume state `at`
    /// (`(epoch, samples consumed in it)`, a checkpoint's), or None for the
    /// loader's own start. Call it before the first batch. The loader serves
    /// once every rank asked, and stops with an error naming each rank's
    /// request if they differ.
    pub fn request_start(&mut self, at: Option<(u64, u64)>) -> Result<(), StartError> {
        let req = at.map_or(StartRequest::LoadersStart, |(e, s)| StartRequest::At(e, s));
        match self.start_mode() {
            StartMode::Fixed => Err(StartError::NotAwaited {
                name: self.name.clone(),
            }),
            StartMode::Decided => {
                let Some(s) = self.start_now() else {
                    return Ok(());
                };
                let started = (s.epoch, s.samples_consumed);
                match at {
                    None => Ok(()),
                    Some(want) if want == started => Ok(()),
                    Some((want_epoch, want_samples)) => Err(StartError::AlreadyStarted {
                        name: self.name.clone(),
                        epoch: started.0,
                        samples: started.1,
                        want_epoch,
                        want_samples,
                    }),
                }
            }
            StartMode::Awaiting => {
                start::request(self.view.rank(self.rank), req);
                self.start_requested = true;
                Ok(())
            }
        }
    }

    /// Before a first batch with no request made: this rank starts wherever
    /// the loader does (a fresh run), so a loader under `--resume auto` is not
    /// left waiting for it. A request of an earlier consumer of the rank (a
    /// restarted trainer) stands.
    pub(super) fn request_start_if_unasked(&mut self) {
        self.start_requested = true;
        let header = self.view.header();
        if !start::awaits_start(header) || start::start_known(header) {
            return;
        }
        let block = self.view.rank(self.rank);
        if start::requested(block).is_none() {
            start::request(block, StartRequest::LoadersStart);
        }
    }
}
