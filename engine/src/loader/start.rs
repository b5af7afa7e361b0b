//! `serve --resume auto`: before serving, wait for every rank to say where
//! the run starts (a trainer's `load_state_dict`, or its first batch for a
//! fresh run), and start there (see `ring::start`).

use std::time::{Duration, Instant};

use crate::ring::layout::RunStart;
use crate::ring::start::{agree, StartRequest};
use crate::sampler::{ResumeState, Sampler, SamplerConfig};

use super::pending::RankCursor;
use super::run::Loader;
use super::watch::WATCH_EVERY;
use super::{RunError, StopToken};

/// How often the loader looks at the ranks' requests while it waits: a
/// trainer's first batch waits for this at most, once every rank asked.
const START_POLL: Duration = Duration::from_millis(2);

impl Loader {
    /// Waits until every rank made its start request, then starts the run
    /// where they agree, or fails naming each rank's request. Before any
    /// batch is claimed; trainers may take minutes to come (imports, model
    /// set-up), so there is no time limit, only the stop signals.
    pub(super) fn await_start(&mut self, stop: &StopToken) -> Result<(), RunError> {
        let waiting_since = Instant::now();
        let mut last_note = Instant::now();
        let mut said_start_wait = false;
        let requests = loop {
            stop.check()?;
            let requests = self.producer.start_requests();
            let missing: Vec<u32> = requests
                .iter()
                .filter(|(_, r)| r.is_none())
                .map(|(rank, _)| *rank)
                .collect();
            if missing.is_empty() {
                break requests
                    .into_iter()
                    .filter_map(|(rank, r)| r.map(|r| (rank, r)))
                    .collect::<Vec<(u32, StartRequest)>>();
            }
            self.check_idle()?;
            if last_note.elapsed() >= WATCH_EVERY {
                // Said once: trainers take their time to load a model and a
                // checkpoint, and that is no trouble.
                let attached: Vec<u32> = missing
                    .iter()
                    .copied()
                    .filter(|&r| self.producer.consumer_attached(r))
                    .collect();
                if !said_start_wait && !attached.is_empty() {
                    said_start_wait = true;
                    tracing::info!(
                        "waiting for rank(s) {attached:?} to say where the run starts (--resume auto: a trainer's load_state_dict, or its first batch), {:.0} s so far",
                        waiting_since.elapsed().as_secs_f64()
                    );
                }
                self.log_unattached(&missing, "");
                last_note = Instant::now();
            }
            std::thread::sleep(START_POLL);
        };
        let own = self.plan.cfg.start;
        let (epoch, samples_consumed) = agree(&requests, (own.epoch, own.samples_consumed))
            .map_err(RunError::StartDisagreement)?;
        let start = ResumeState {
            epoch,
            samples_consumed,
        };
        if start != own {
            self.restart_at(start)?;
            tracing::info!(
                "the trainers start at epoch {epoch}, {samples_consumed} samples consumed (their checkpoint)"
            );
        }
        let per_rank = self.plan.batches_per_rank();
        for r in 0..self.plan.cfg.world_size {
            self.producer.set_batches_expected(r, per_rank);
        }
        self.warming = per_rank > 0;
        self.awaiting_start = false;
        self.producer.publish_start(RunStart {
            epoch,
            samples_consumed,
            dataset_samples: self.plan.sampler.config().n_samples,
        });
        self.write_progress();
        Ok(())
    }

    /// Serves from `start` instead of the plan's start: a new sampler (which
    /// checks the state against the dataset and the epochs) and cursors.
    fn restart_at(&mut self, start: ResumeState) -> Result<(), RunError> {
        let sampler = Sampler::new(SamplerConfig {
            start,
            ..*self.plan.sampler.config()
        })?;
        self.cursors = (0..self.plan.cfg.world_size)
            .map(|_| RankCursor::new(&sampler))
            .collect();
        self.plan.sampler = sampler;
        self.plan.cfg.start = start;
        Ok(())
    }
}
