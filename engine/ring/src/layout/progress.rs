//! How far a run has come: its shape in the header (offset 1672,
//! [`flags::PROGRESS_KNOWN`](super::flags::PROGRESS_KNOWN)) and where its
//! trainers are in the counters block (`Counter::Progress*`), for `ringfeed
//! stat` and `ls`, the loader's progress line, `/metrics` and a trainer's
//! `feed.progress`. Display figures: nothing synchronizes through them but
//! the flag that says they are there.

use super::{flags, Counter, Counters, Header};
use crate::sync::Ordering;

/// Where the run's shape sits in the header (bytes 1672 to 1735 are
/// progress's; docs/ring-layout.md).
pub const PROGRESS_OFFSET: usize = 1672;

/// The run's shape, written once by the loader: enough to put a step in
/// its epoch and the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunShape {
    /// The run's `--epochs`: it ends before epoch `epochs`.
    pub epochs: u64,
    /// Steps each rank gets in a whole epoch (the first epoch of a resumed
    /// run may have fewer).
    pub epoch_steps: u64,
    /// Samples per rank per step (`--batch-size`).
    pub batch_size: u64,
}

impl RunShape {
    /// Writes the shape, then sets [`flags::PROGRESS_KNOWN`].
    pub fn publish(self, header: &Header) {
        let r = Ordering::Relaxed;
        header.run_epochs.store(self.epochs, r);
        header.epoch_steps.store(self.epoch_steps, r);
        header.run_batch_size.store(self.batch_size, r);
        // SYNC POINT: Release pairs with `read`'s Acquire load of the flags:
        // a reader that sees PROGRESS_KNOWN sees the three fields above.
        header
            .flags
            .fetch_or(flags::PROGRESS_KNOWN, Ordering::Release);
    }

    /// The shape, once the loader published it (None from a loader that
    /// predates it, or before it did).
    pub fn read(header: &Header) -> Option<RunShape> {
        // SYNC POINT: Acquire pairs with `publish`'s Release.
        if header.flags.load(Ordering::Acquire) & flags::PROGRESS_KNOWN == 0 {
            return None;
        }
        let r = Ordering::Relaxed;
        Some(RunShape {
            epochs: header.run_epochs.load(r),
            epoch_steps: header.epoch_steps.load(r),
            batch_size: header.run_batch_size.load(r),
        })
    }
}

/// Where a run's trainers are, as the loader last wrote it (every ~100 ms).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// The run's shape.
    pub shape: RunShape,
    /// The epoch of the next step the slowest rank takes (`shape.epochs`
    /// once every rank took its last batch).
    pub epoch: u64,
    /// Steps of that epoch every rank has taken.
    pub step: u64,
    /// Steps each rank gets in that epoch.
    pub epoch_steps: u64,
    /// Steps every rank has taken in the run (the fewest any rank took).
    pub steps_done: u64,
}

impl Progress {
    /// The progress `counters` hold under `shape`.
    pub fn of(shape: RunShape, counters: &Counters) -> Progress {
        Progress {
            shape,
            epoch: counters.get(Counter::ProgressEpoch),
            step: counters.get(Counter::ProgressStep),
            epoch_steps: counters.get(Counter::ProgressEpochSteps),
            steps_done: counters.get(Counter::ProgressStepsDone),
        }
    }

    /// "epoch 1 (of 3) step 120/390" (epochs count from 0, as a batch's
    /// do), or "every step taken" once past the last epoch.
    pub fn words(&self) -> String {
        if self.shape.epochs > 0 && self.epoch >= self.shape.epochs {
            return "every step taken".to_owned();
        }
        format!(
            "epoch {} (of {}) step {}/{}",
            self.epoch, self.shape.epochs, self.step, self.epoch_steps
        )
    }
}
