//! Which samples form rank r's batch at step s of epoch e, and how to resume.
//!
//! The order of an epoch is a keyed permutation of `[0, n)` that depends on
//! `(seed, epoch, n)` only, never on the world size or the batch size, so a
//! job can stop with one world size and continue with another. The
//! permutation is a Feistel network over the smallest power-of-two domain
//! that holds `n` (at least 4), with cycle-walking back into `[0, n)`: any
//! position is computed in O(1) expected time and O(1) memory, which matters
//! for datasets of 10^9 samples. docs/sampler.md specifies every constant;
//! the algorithm is a stable contract, and `tests/sampler_props.rs` checks
//! the test vectors printed there.
//!
//! Steps: each step takes the next `W × B` positions of the order, and rank
//! `r` gets positions `[s·W·B + r·B, + B)` counted from the epoch's start
//! position (0, or the resume offset in the first epoch). Every rank takes
//! the same number of steps, so DDP never hangs on unequal counts. How an
//! epoch ends is its [`Tail`]: by default the tail that does not fill a whole
//! step is dropped (training); with [`Tail::Keep`] every sample is served
//! once, and the last step's batches are short or empty (evaluation). The
//! steps of an epoch are `ring::resume::steps_in_epoch`, the one rule the
//! trainers' `len()` and resume states use too.
//!
//! `SampleOrder::Block` (`serve --shuffle block`, `block.rs`) is a
//! shard-aware order built from the same permutation: blocks of consecutive
//! samples permuted, samples shuffled within windows of blocks; still a
//! function of `(seed, epoch, n)` and its shape only (docs/sampler.md,
//! section 4).
//!
//! The sampler never does I/O; it only maps (epoch, step, rank) to indices.

use thiserror::Error;

pub use crate::ring::resume::Tail;

mod block;
mod feistel;
mod mixture;
pub use block::{BlockShape, BlockShapeError, MAX_BLOCK_SAMPLES, MAX_WINDOW_BLOCKS};
use feistel::Feistel;
pub use feistel::{mix64, FEISTEL_ROUNDS};
pub use mixture::{Mixture, MixtureError, MAX_CORPORA};

/// Most ranks in a job, all machines together (one loader serves at most
/// the ring's `MAX_RANKS` of them).
pub const MAX_WORLD_SIZE: u32 = 1 << 20;

/// Most samples in one batch. A batch's index list is built on every step,
/// so it is bounded like everything else on the hot path.
pub const MAX_BATCH_SIZE: u32 = 1 << 20;

/// Most samples in one dataset (2^60). Far beyond any real corpus; it keeps
/// every `position + W·B` sum of this module well inside `u64`.
pub const MAX_SAMPLES: u64 = 1 << 60;

/// Where a run stands: `samples_consumed` positions of epoch `epoch`'s order
/// were delivered to the ranks (all ranks together), earlier epochs are done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ResumeState {
    /// The epoch to continue.
    pub epoch: u64,
    /// Positions of that epoch's order already delivered (all ranks together).
    pub samples_consumed: u64,
}

/// Which order every epoch serves its samples in (`serve --shuffle`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SampleOrder {
    /// Manifest order, every epoch (`--shuffle none`, `--no-shuffle`).
    None,
    /// A uniformly keyed permutation of all samples (the default).
    #[default]
    Exact,
    /// Blocks of consecutive samples permuted, then samples shuffled within
    /// windows of blocks (`--shuffle block`): reads stay within a few
    /// blocks of a shard at a time (docs/sampler.md, section 4).
    Block(BlockShape),
}

impl SampleOrder {
    /// Whether the order is shuffled at all (false: the identity).
    pub fn is_shuffled(self) -> bool {
        self != SampleOrder::None
    }

    /// The block shape of a block order, None for the others.
    pub fn block_shape(self) -> Option<BlockShape> {
        match self {
            SampleOrder::Block(shape) => Some(shape),
            _ => None,
        }
    }
}

impl std::fmt::Display for SampleOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SampleOrder::None => f.write_str("no shuffle"),
            SampleOrder::Exact => f.write_str("the exact shuffle"),
            SampleOrder::Block(shape) => write!(
                f,
                "the block shuffle (blocks of {} samples, windows of {} blocks)",
                shape.block_samples(),
                shape.window_blocks()
            ),
        }
    }
}

/// The order of one epoch: a permutation of `[0, n)` for `(seed, epoch, n)`
/// (and the block shape of a block order), or the identity when shuffling
/// is off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochOrder {
    n: u64,
    kind: OrderKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum OrderKind {
    Identity,
    Exact(Feistel),
    Block(block::BlockOrder),
}

impl EpochOrder {
    /// The order of epoch `epoch` of a dataset of `n` samples under `seed`.
    /// With `shuffle == false` it is the identity (manifest order).
    pub fn new(seed: u64, epoch: u64, n: u64, shuffle: bool) -> Self {
        let order = if shuffle {
            SampleOrder::Exact
        } else {
            SampleOrder::None
        };
        EpochOrder::of(order, seed, epoch, n)
    }

    /// The order of epoch `epoch` of `n` samples under `seed`, of kind `order`.
    pub fn of(order: SampleOrder, seed: u64, epoch: u64, n: u64) -> Self {
        let kind = match order {
            SampleOrder::None => OrderKind::Identity,
            SampleOrder::Exact => OrderKind::Exact(Feistel::new(seed, epoch, n)),
            SampleOrder::Block(shape) => {
                OrderKind::Block(block::BlockOrder::new(shape, seed, epoch, n))
            }
        };
        EpochOrder { n, kind }
    }

    /// Number of samples `n`.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// True when the dataset has no samples (then `at` has no valid input).
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Whether this order is shuffled (false: the identity).
    pub fn is_shuffled(&self) -> bool {
        self.kind != OrderKind::Identity
    }

    /// The sample index at `position` of the order.
    ///
    /// # Panics
    /// If `position >= n`: there is no such position, and cycle-walking from
    /// outside the Feistel domain would never come back.
    #[inline]
    pub fn at(&self, position: u64) -> u64 {
        assert!(
            position < self.n,
            "position {position} is outside an epoch of {} samples",
            self.n
        );
        match &self.kind {
            OrderKind::Identity => position,
            OrderKind::Exact(feistel) => feistel.at(position),
            OrderKind::Block(order) => order.at(position),
        }
    }
}

/// Everything that decides which samples each rank gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SamplerConfig {
    /// Number of samples in the manifest (`n`).
    pub n_samples: u64,
    /// Samples per rank per step (`B`).
    pub batch_size: u32,
    /// Number of ranks (`W`).
    pub world_size: u32,
    /// Seed of the epoch permutations.
    pub seed: u64,
    /// The order of every epoch (exact shuffle, block shuffle or none).
    pub order: SampleOrder,
    /// Total epochs of the run, counted from 0; the loader serves
    /// `start.epoch..epochs`.
    pub epochs: u64,
    /// Where to start (`ResumeState::default()` for a fresh run).
    pub start: ResumeState,
    /// How every epoch ends (`serve --tail`): the tail shorter than a step
    /// dropped, or kept in short last batches.
    pub tail: Tail,
}

/// Why a `SamplerConfig` was refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SamplerError {
    /// `batch_size == 0`.
    #[error("batch size is 0; pass --batch-size of at least 1")]
    ZeroBatchSize,
    /// `batch_size > MAX_BATCH_SIZE`.
    #[error(
        "batch size {batch_size} is above the limit of {max} samples per rank; lower --batch-size"
    )]
    BatchSizeTooLarge {
        /// The requested batch size.
        batch_size: u32,
        /// `MAX_BATCH_SIZE`.
        max: u32,
    },
    /// More steps over the run than a u64 counts (an absurd `--epochs`).
    #[error(
        "{epochs} epochs of {steps_per_epoch} steps each is more than 2^64 steps; lower --epochs"
    )]
    TooManySteps {
        /// The requested epochs.
        epochs: u64,
        /// Steps in a whole epoch.
        steps_per_epoch: u64,
    },
    /// `world_size == 0`.
    #[error(
        "world size is 0; pass --world-size of at least 1 (or fix LOCAL_WORLD_SIZE or WORLD_SIZE)"
    )]
    ZeroWorldSize,
    /// `world_size > MAX_WORLD_SIZE`.
    #[error("world size {world_size} is above the limit of {max} ranks; lower --world-size")]
    WorldSizeTooLarge {
        /// The requested world size.
        world_size: u32,
        /// `MAX_WORLD_SIZE`.
        max: u32,
    },
    /// `n_samples > MAX_SAMPLES`.
    #[error(
        "dataset of {n_samples} samples is above the limit of {max}; split it into several runs"
    )]
    TooManySamples {
        /// The dataset's sample count.
        n_samples: u64,
        /// `MAX_SAMPLES`.
        max: u64,
    },
    /// Not even one step fits in an epoch (or, with `--tail keep`, the
    /// dataset is empty).
    #[error("dataset of {n_samples} samples cannot fill one step of W×B = {world_size}×{batch_size} = {step_samples}; lower --batch-size or --world-size, or pass --tail keep to serve it in short batches")]
    DatasetSmallerThanStep {
        /// The dataset's sample count.
        n_samples: u64,
        /// `W`.
        world_size: u32,
        /// `B`.
        batch_size: u32,
        /// `W × B`.
        step_samples: u64,
    },
    /// The resume state counts more samples than an epoch has.
    #[error("resume state {epoch}:{samples_consumed} is past the dataset's {n_samples} samples: it belongs to another dataset; serve the one it was saved with, or start over without --resume")]
    StartBeyondDataset {
        /// The resume state's epoch.
        epoch: u64,
        /// The resume state's consumed count.
        samples_consumed: u64,
        /// The dataset's sample count.
        n_samples: u64,
    },
    /// The resume state lies after the run's last epoch.
    #[error("resume state is at epoch {epoch} with {samples_consumed} samples consumed, but the run has only {epochs} epoch(s), the last being epoch {}; raise --epochs to continue training", .epochs.saturating_sub(1))]
    StartBeyondEpochs {
        /// The resume state's epoch.
        epoch: u64,
        /// The resume state's consumed count.
        samples_consumed: u64,
        /// The run's epoch count.
        epochs: u64,
    },
}

/// Maps (epoch, step, rank) to the sample indices of that rank's batch.
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    /// `W × B`, the positions one step consumes.
    step_samples: u64,
}

/// Checks B and W alone, before any dataset is known (so that `serve`
/// reports a bad flag before a long listing).
pub fn check_shape(batch_size: u32, world_size: u32) -> Result<(), SamplerError> {
    if batch_size == 0 {
        return Err(SamplerError::ZeroBatchSize);
    }
    if batch_size > MAX_BATCH_SIZE {
        return Err(SamplerError::BatchSizeTooLarge {
            batch_size,
            max: MAX_BATCH_SIZE,
        });
    }
    if world_size == 0 {
        return Err(SamplerError::ZeroWorldSize);
    }
    if world_size > MAX_WORLD_SIZE {
        return Err(SamplerError::WorldSizeTooLarge {
            world_size,
            max: MAX_WORLD_SIZE,
        });
    }
    Ok(())
}

impl Sampler {
    /// Checks `cfg` and builds a sampler.
    pub fn new(cfg: SamplerConfig) -> Result<Sampler, SamplerError> {
        let SamplerConfig {
            n_samples,
            batch_size,
            world_size,
            start,
            epochs,
            tail,
            ..
        } = cfg;
        check_shape(batch_size, world_size)?;
        if n_samples > MAX_SAMPLES {
            return Err(SamplerError::TooManySamples {
                n_samples,
                max: MAX_SAMPLES,
            });
        }
        // Both factors were bounded above: W·B <= 2^20 · 2^20, no overflow.
        let step_samples = u64::from(world_size) * u64::from(batch_size);
        // A kept tail serves any dataset that has a sample, in short batches.
        let too_small = match tail {
            Tail::Drop => n_samples < step_samples,
            Tail::Keep => n_samples == 0,
        };
        if too_small {
            return Err(SamplerError::DatasetSmallerThanStep {
                n_samples,
                world_size,
                batch_size,
                step_samples,
            });
        }
        if start.samples_consumed > n_samples {
            return Err(SamplerError::StartBeyondDataset {
                epoch: start.epoch,
                samples_consumed: start.samples_consumed,
                n_samples,
            });
        }
        // (epochs, 0) is the state after the last step of the run: valid, and
        // it serves nothing.
        let past_end =
            start.epoch > epochs || (start.epoch == epochs && start.samples_consumed > 0);
        if past_end {
            return Err(SamplerError::StartBeyondEpochs {
                epoch: start.epoch,
                samples_consumed: start.samples_consumed,
                epochs,
            });
        }
        let sampler = Sampler { cfg, step_samples };
        if sampler.total_steps().is_none() {
            return Err(SamplerError::TooManySteps {
                epochs,
                steps_per_epoch: sampler.steps_per_epoch(),
            });
        }
        Ok(sampler)
    }

    /// Steps each rank is served over the whole run (from the start state to
    /// the end of the last epoch), in constant time; None where that passes
    /// 2^64 (`new` refuses such a run).
    pub fn total_steps(&self) -> Option<u64> {
        let first = self.first_epoch();
        if first >= self.epochs_end() {
            return Some(0);
        }
        let full_epochs = self.epochs_end() - first - 1;
        self.steps_per_epoch()
            .checked_mul(full_epochs)?
            .checked_add(self.steps_in_epoch(first))
    }

    /// Steps every rank takes in a whole epoch (one that starts at position
    /// 0): `floor(n / (W·B))` dropping the tail, `ceil(n / (W·B))` keeping
    /// it. The resumed first epoch of a run may have fewer
    /// ([`Sampler::steps_in_epoch`]).
    pub fn steps_per_epoch(&self) -> u64 {
        // W·B >= 1, checked in `new`.
        crate::ring::resume::steps_in_epoch(self.cfg.n_samples, 0, self.step_samples, self.cfg.tail)
            .unwrap_or(0)
    }

    /// How every epoch ends.
    pub fn tail(&self) -> Tail {
        self.cfg.tail
    }

    /// Samples a whole epoch leaves out: the tail shorter than a step when
    /// it is dropped, 0 when it is kept.
    pub fn samples_dropped_per_epoch(&self) -> u64 {
        match self.cfg.tail {
            Tail::Drop => self.cfg.n_samples % self.step_samples,
            Tail::Keep => 0,
        }
    }

    /// The configuration this sampler was built from.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// `W × B`: positions of the order consumed by one step.
    pub fn step_samples(&self) -> u64 {
        self.step_samples
    }

    /// The first epoch served (`start.epoch`).
    pub fn first_epoch(&self) -> u64 {
        self.cfg.start.epoch
    }

    /// One past the last epoch served: the loader serves
    /// `first_epoch()..epochs_end()`, i.e. `start.epoch..epochs`.
    pub fn epochs_end(&self) -> u64 {
        self.cfg.epochs
    }

    /// The order of `epoch` (served or not).
    pub fn epoch_order(&self, epoch: u64) -> EpochOrder {
        EpochOrder::of(self.cfg.order, self.cfg.seed, epoch, self.cfg.n_samples)
    }

    /// Position of the order where `epoch`'s first step starts: the resume
    /// offset in the first epoch, 0 in later ones.
    pub fn start_position(&self, epoch: u64) -> u64 {
        if epoch == self.cfg.start.epoch {
            self.cfg.start.samples_consumed
        } else {
            0
        }
    }

    /// Steps served in `epoch`: `floor((n - start_position) / (W·B))`
    /// dropping the tail, `ceil(..)` keeping it, or 0 for an epoch outside
    /// `first_epoch()..epochs_end()`.
    pub fn steps_in_epoch(&self, epoch: u64) -> u64 {
        if !(self.first_epoch()..self.epochs_end()).contains(&epoch) {
            return 0;
        }
        // start_position <= n and W·B >= 1 were checked in `new`.
        crate::ring::resume::steps_in_epoch(
            self.cfg.n_samples,
            self.start_position(epoch),
            self.step_samples,
            self.cfg.tail,
        )
        .unwrap_or(0)
    }

    /// Where a rank stands after taking `steps_done` steps of this run: the
    /// epoch of its next step and the steps of that epoch it took;
    /// `(epochs_end(), 0)` once it took every step. In constant time.
    pub fn position_after(&self, steps_done: u64) -> (u64, u64) {
        let first = self.first_epoch();
        if first >= self.epochs_end() {
            return (self.epochs_end(), 0);
        }
        let in_first = self.steps_in_epoch(first);
        if steps_done < in_first {
            return (first, steps_done);
        }
        // n >= W·B was checked in `new`: a whole epoch has a step at least.
        let whole = self.steps_per_epoch().max(1);
        let after = steps_done - in_first;
        let epoch = (first + 1).saturating_add(after / whole);
        if epoch >= self.epochs_end() {
            return (self.epochs_end(), 0);
        }
        (epoch, after % whole)
    }

    /// Sample indices of rank `rank`'s batch at `step` of `epoch`, written
    /// into `out` (cleared first): positions
    /// `start_position(epoch) + step·W·B + rank·B .. + B` of the order, cut
    /// at `n` (with a kept tail, the last step's batches are short or empty).
    ///
    /// # Panics
    /// In debug builds, if `step >= steps_in_epoch(epoch)` or
    /// `rank >= world_size`; in release builds an out-of-range position
    /// panics in `EpochOrder::at`.
    pub fn batch_into(&self, epoch: u64, step: u64, rank: u32, out: &mut Vec<u64>) {
        debug_assert!(
            step < self.steps_in_epoch(epoch),
            "step {step} of epoch {epoch} is not served"
        );
        debug_assert!(
            rank < self.cfg.world_size,
            "rank {rank} >= world size {}",
            self.cfg.world_size
        );
        out.clear();
        let order = self.epoch_order(epoch);
        let batch_size = u64::from(self.cfg.batch_size);
        // No overflow: every term is bounded by n <= MAX_SAMPLES (2^60) for
        // a served step, and the sum by n + W·B.
        let first =
            self.start_position(epoch) + step * self.step_samples + u64::from(rank) * batch_size;
        let end = (first + batch_size).min(self.cfg.n_samples);
        out.extend((first..end).map(|position| order.at(position)));
    }

    /// Resume state after all ranks consumed `steps_done` steps of `epoch`.
    ///
    /// When `steps_done` completes the epoch, the state is `(epoch + 1, 0)`:
    /// a dropped tail is not carried over, so a restart with a smaller
    /// world size does not serve it late. After the run's last step this is
    /// `(epochs, 0)`, which `new` accepts and which serves nothing.
    pub fn state_after(&self, epoch: u64, steps_done: u64) -> ResumeState {
        let steps = self.steps_in_epoch(epoch);
        debug_assert!(
            steps_done <= steps,
            "{steps_done} steps done of {steps} in epoch {epoch}"
        );
        if steps_done >= steps {
            // Also an epoch this run serves nothing of.
            return ResumeState {
                epoch: epoch.saturating_add(1),
                samples_consumed: 0,
            };
        }
        // The one resume rule (ring::resume). It cannot overflow here: a
        // served position is bounded by n <= MAX_SAMPLES, checked in `new`.
        let (epoch, samples_consumed) = crate::ring::resume::after_steps(
            epoch,
            self.start_position(epoch),
            steps_done,
            self.cfg.n_samples,
            self.step_samples,
            self.cfg.tail,
        )
        .unwrap_or((epoch.saturating_add(1), 0));
        ResumeState {
            epoch,
            samples_consumed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(n_samples: u64, batch_size: u32, world_size: u32) -> SamplerConfig {
        SamplerConfig {
            n_samples,
            batch_size,
            world_size,
            seed: 7,
            order: SampleOrder::Exact,
            epochs: 2,
            start: ResumeState::default(),
            tail: Tail::Drop,
        }
    }

    #[test]
    fn every_order_up_to_300_samples_is_a_permutation() {
        for n in 1..=300u64 {
            let order = EpochOrder::new(3, 1, n, true);
            let mut seen = vec![false; n as usize];
            for position in 0..n {
                let index = order.at(position) as usize;
                assert!(!seen[index], "n={n}: index {index} twice");
                seen[index] = true;
            }
        }
    }

    #[test]
    fn unshuffled_order_is_the_identity() {
        let order = EpochOrder::new(3, 1, 1000, false);
        assert!((0..1000).all(|p| order.at(p) == p));
    }

    #[test]
    fn config_errors_name_the_fix() {
        let message = Sampler::new(config(10, 4, 3)).unwrap_err().to_string();
        assert!(
            message.contains("10 samples") && message.contains("3×4 = 12"),
            "{message}"
        );
        assert!(message.contains("--batch-size"), "{message}");
        assert_eq!(
            Sampler::new(config(10, 0, 1)).unwrap_err(),
            SamplerError::ZeroBatchSize
        );
        assert_eq!(
            Sampler::new(config(10, 1, 0)).unwrap_err(),
            SamplerError::ZeroWorldSize
        );
        // A job of 129 ranks is fine (one loader serves up to 128 of them);
        // one beyond MAX_WORLD_SIZE is not.
        assert!(Sampler::new(config(1000, 1, 129)).is_ok());
        assert!(matches!(
            Sampler::new(config(1 << 21, 1, MAX_WORLD_SIZE + 1)),
            Err(SamplerError::WorldSizeTooLarge {
                world_size,
                ..
            }) if world_size == MAX_WORLD_SIZE + 1
        ));
        let mut beyond = config(10, 1, 1);
        beyond.start = ResumeState {
            epoch: 0,
            samples_consumed: 11,
        };
        assert!(matches!(
            Sampler::new(beyond),
            Err(SamplerError::StartBeyondDataset { .. })
        ));
        beyond.start = ResumeState {
            epoch: 2,
            samples_consumed: 1,
        };
        assert!(matches!(
            Sampler::new(beyond),
            Err(SamplerError::StartBeyondEpochs { .. })
        ));
        beyond.start = ResumeState {
            epoch: 2,
            samples_consumed: 0,
        };
        assert_eq!(Sampler::new(beyond).map(|s| s.steps_in_epoch(2)), Ok(0));
    }

    #[test]
    fn state_after_the_last_step_moves_to_the_next_epoch() {
        let sampler = Sampler::new(config(10, 2, 2)).unwrap();
        assert_eq!(sampler.steps_in_epoch(0), 2);
        assert_eq!(
            sampler.state_after(0, 1),
            ResumeState {
                epoch: 0,
                samples_consumed: 4
            }
        );
        assert_eq!(
            sampler.state_after(0, 2),
            ResumeState {
                epoch: 1,
                samples_consumed: 0
            }
        );
        assert_eq!(
            sampler.state_after(1, 2),
            ResumeState {
                epoch: 2,
                samples_consumed: 0
            }
        );
    }

    #[test]
    fn the_position_after_some_steps_walks_a_resumed_first_epoch_then_whole_ones() {
        // 10 samples, 2 a step: 5 steps an epoch; resumed 4 samples into
        // epoch 0 of 3, which keeps 3 steps.
        let mut cfg = config(10, 2, 1);
        cfg.epochs = 3;
        cfg.start = ResumeState {
            epoch: 0,
            samples_consumed: 4,
        };
        let s = Sampler::new(cfg).unwrap();
        assert_eq!(s.steps_per_epoch(), 5);
        let walked: Vec<(u64, u64)> = (0..=13).map(|d| s.position_after(d)).collect();
        let mut expected = Vec::new();
        let mut at = (0, 0);
        for d in 0..=13u64 {
            expected.push(at);
            if d < 13 {
                at.1 += 1;
                if at.1 == s.steps_in_epoch(at.0) {
                    at = (at.0 + 1, 0);
                }
            }
        }
        assert_eq!(walked, expected);
        assert_eq!(s.position_after(13), (3, 0));
        assert_eq!(s.position_after(u64::MAX), (3, 0));
    }
}
