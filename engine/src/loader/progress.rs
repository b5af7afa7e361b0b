//! Where the trainers are in the run, for `ringfeed stat` and `ls`, the
//! progress line, `/metrics` and `feed.progress`: the run's shape in the
//! ring header once, then the slowest rank's place in the counters block
//! with the other counters (`ring::layout::Progress`).

use super::Loader;
use crate::ring::layout::{Counter, RunShape};

impl Loader {
    /// The run's shape: epochs, steps in a whole epoch, batch size.
    pub(super) fn run_shape(&self) -> RunShape {
        RunShape {
            epochs: self.plan.sampler.epochs_end(),
            epoch_steps: self.plan.sampler.steps_per_epoch(),
            batch_size: u64::from(self.plan.cfg.batch_size),
        }
    }

    /// Writes where the trainers are, then (the first time) the run's shape,
    /// which says from then on that these words are live. Before the run
    /// starts (`--resume auto` still waiting) nothing is said.
    pub(super) fn write_progress(&mut self) {
        if self.awaiting_start {
            return;
        }
        let world = self.plan.cfg.world_size;
        let done = (0..world)
            .map(|r| self.producer.consumed(r))
            .min()
            .unwrap_or(0);
        let sampler = &self.plan.sampler;
        let (epoch, step) = sampler.position_after(done);
        let p = &self.producer;
        p.set_counter(Counter::ProgressEpoch, epoch);
        p.set_counter(Counter::ProgressStep, step);
        p.set_counter(Counter::ProgressEpochSteps, sampler.steps_in_epoch(epoch));
        p.set_counter(Counter::ProgressStepsDone, done);
        if !self.shape_published {
            self.producer.publish_run_shape(self.run_shape());
            self.shape_published = true;
        }
    }
}
