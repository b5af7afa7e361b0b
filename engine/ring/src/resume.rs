//! The resume rule and the steps of an epoch, written once.
//!
//! A resume state is `(epoch, samples consumed in that epoch)` (docs/sampler.md).
//! Each step consumes `W × B` samples of the epoch's order (`per_step`). How an
//! epoch of `n` samples ends is its [`Tail`]:
//!
//! - [`Tail::Drop`] (training, the default): the epoch ends when less than a
//!   step is left, and that tail is dropped, not carried over. So the state
//!   after an epoch's last step is `(epoch + 1, 0)`, and a state with less
//!   than a step left of its epoch *is* the next epoch's start.
//! - [`Tail::Keep`] (evaluation): the epoch ends when every sample was
//!   served; its last steps are short or empty for some ranks. A state with
//!   no sample left of its epoch is the next epoch's start.
//!
//! The sampler (which steps the loader serves), the ring's [`crate::layout::Job`]
//! (the state after a batch a trainer took), the C ABI's `rf_resume_*` and
//! `rf_epoch_steps`, and through them the Python binding (`len(feed)`,
//! `Batch.resume_state`), all apply these functions, so they cannot drift.
//! Every function returns None rather than overflow or divide by zero.

/// A resume state: `(epoch, samples consumed in it)`.
pub type State = (u64, u64);

/// How an epoch ends when its samples do not fill a whole last step
/// (`serve --tail`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Tail {
    /// The tail shorter than a step is left out of the epoch: every batch is
    /// full (training; the default).
    #[default]
    Drop,
    /// Every sample is served once an epoch: the last step's batches are
    /// short or empty, and every rank still takes the same number of steps
    /// (evaluation).
    Keep,
}

impl Tail {
    /// The word the ring's header stores (`tail_mode`): 0 drop, 1 keep.
    pub fn word(self) -> u64 {
        match self {
            Tail::Drop => 0,
            Tail::Keep => 1,
        }
    }

    /// The tail a header word names; None for any other value.
    pub fn from_word(word: u64) -> Option<Tail> {
        match word {
            0 => Some(Tail::Drop),
            1 => Some(Tail::Keep),
            _ => None,
        }
    }

    /// `drop` or `keep`, as the flag says it.
    pub fn name(self) -> &'static str {
        match self {
            Tail::Drop => "drop",
            Tail::Keep => "keep",
        }
    }
}

/// Steps of an epoch of `n` samples whose first `start_samples` were consumed
/// before (a loader's `--resume` in the epoch it starts in, 0 in later
/// epochs): `floor((n − c) / per_step)` under [`Tail::Drop`],
/// `ceil((n − c) / per_step)` under [`Tail::Keep`]. Every rank takes this
/// many. None for `per_step == 0` or `start_samples > n`.
pub fn steps_in_epoch(n: u64, start_samples: u64, per_step: u64, tail: Tail) -> Option<u64> {
    if per_step == 0 {
        return None;
    }
    let left = n.checked_sub(start_samples)?;
    Some(match tail {
        Tail::Drop => left / per_step,
        Tail::Keep => left.div_ceil(per_step),
    })
}

/// Samples of one whole epoch of `n` samples that its steps serve, all ranks
/// together: `n` under [`Tail::Keep`], `n` less the dropped tail under
/// [`Tail::Drop`]. None for `per_step == 0`.
pub fn samples_in_epoch(n: u64, per_step: u64, tail: Tail) -> Option<u64> {
    match tail {
        Tail::Keep => (per_step > 0).then_some(n),
        Tail::Drop => steps_in_epoch(n, 0, per_step, tail)?.checked_mul(per_step),
    }
}

/// The state a loader goes on from: one whose epoch has no step left (less
/// than a step left under [`Tail::Drop`], no sample left under
/// [`Tail::Keep`]) is the start of the next epoch. None for `per_step == 0`
/// or on overflow.
pub fn normal(state: State, n: u64, per_step: u64, tail: Tail) -> Option<State> {
    let (epoch, samples) = state;
    if per_step == 0 {
        return None;
    }
    let epoch_over = match tail {
        Tail::Drop => samples.checked_add(per_step)? > n,
        Tail::Keep => samples >= n,
    };
    if epoch_over {
        return Some((epoch.checked_add(1)?, 0));
    }
    Some((epoch, samples))
}

/// The state once `steps_done` steps of `epoch` were consumed, where
/// `start_samples` samples of that epoch were consumed before its step 0
/// (the loader's `--resume` in its first epoch, 0 in later ones).
pub fn after_steps(
    epoch: u64,
    start_samples: u64,
    steps_done: u64,
    n: u64,
    per_step: u64,
    tail: Tail,
) -> Option<State> {
    let done = steps_done
        .checked_mul(per_step)?
        .checked_add(start_samples)?;
    normal((epoch, done), n, per_step, tail)
}

/// The state `steps` steps after `start`, across epochs. None when an epoch
/// holds no step (`per_step > n` under [`Tail::Drop`], `n == 0`) or on
/// overflow.
pub fn advance(start: State, steps: u64, n: u64, per_step: u64, tail: Tail) -> Option<State> {
    let per_epoch = steps_in_epoch(n, 0, per_step, tail)?;
    if per_epoch == 0 {
        return None;
    }
    let (epoch, samples) = normal(start, n, per_step, tail)?;
    // normal() leaves at least one step in the epoch (samples < n, and
    // under Drop samples + per_step <= n).
    let left = steps_in_epoch(n, samples, per_step, tail)?;
    if steps < left {
        return after_steps(epoch, samples, steps, n, per_step, tail);
    }
    let rest = steps - left;
    let epoch = epoch.checked_add(1)?.checked_add(rest / per_epoch)?;
    Some((epoch, (rest % per_epoch) * per_step))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_with_less_than_a_step_left_is_the_next_epochs_start() {
        assert_eq!(normal((2, 96), 100, 8, Tail::Drop), Some((3, 0)));
        assert_eq!(normal((2, 92), 100, 8, Tail::Drop), Some((2, 92)));
        assert_eq!(normal((2, 0), 100, 0, Tail::Drop), None, "no step size");
        assert_eq!(normal((u64::MAX, 99), 100, 8, Tail::Drop), None, "overflow");
    }

    #[test]
    fn the_state_after_steps_counts_from_the_epochs_start() {
        assert_eq!(after_steps(1, 40, 3, 1000, 64, Tail::Drop), Some((1, 232)));
        assert_eq!(after_steps(1, 40, 15, 1000, 64, Tail::Drop), Some((2, 0)));
        assert_eq!(after_steps(1, 0, u64::MAX, 1000, 64, Tail::Drop), None);
    }

    #[test]
    fn advancing_crosses_epochs_and_drops_each_tail() {
        // n = 100, 8 per step: 12 steps an epoch, a tail of 4 dropped.
        assert_eq!(advance((0, 0), 0, 100, 8, Tail::Drop), Some((0, 0)));
        assert_eq!(advance((0, 0), 11, 100, 8, Tail::Drop), Some((0, 88)));
        assert_eq!(advance((0, 0), 12, 100, 8, Tail::Drop), Some((1, 0)));
        assert_eq!(advance((0, 40), 7, 100, 8, Tail::Drop), Some((1, 0)));
        assert_eq!(advance((0, 40), 8, 100, 8, Tail::Drop), Some((1, 8)));
        assert_eq!(
            advance((0, 96), 1, 100, 8, Tail::Drop),
            Some((1, 8)),
            "a tail state is the next epoch"
        );
        assert_eq!(advance((0, 0), 30, 100, 8, Tail::Drop), Some((2, 48)));
        assert_eq!(
            advance((0, 0), 1, 4, 8, Tail::Drop),
            None,
            "no step fits an epoch"
        );
    }

    #[test]
    fn advancing_one_step_at_a_time_agrees_with_advancing_all_at_once() {
        for (n, per_step) in [(100, 8), (64, 64), (1000, 24), (7, 3)] {
            for start in [(0, 0), (1, 5), (2, n - 1)] {
                for tail in [Tail::Drop, Tail::Keep] {
                    let mut state = normal(start, n, per_step, tail).unwrap();
                    for steps in 0..50 {
                        assert_eq!(
                            advance(start, steps, n, per_step, tail),
                            Some(state),
                            "n {n} per step {per_step} start {start:?} steps {steps} {tail:?}"
                        );
                        state = after_steps(state.0, state.1, 1, n, per_step, tail).unwrap();
                    }
                }
            }
        }
    }

    #[test]
    fn a_kept_tail_adds_one_short_step_and_ends_the_epoch_only_when_every_sample_was_served() {
        // n = 100, 8 per step: 12 whole steps and a step of 4.
        assert_eq!(steps_in_epoch(100, 0, 8, Tail::Drop), Some(12));
        assert_eq!(steps_in_epoch(100, 0, 8, Tail::Keep), Some(13));
        assert_eq!(steps_in_epoch(96, 0, 8, Tail::Keep), Some(12), "no tail");
        assert_eq!(steps_in_epoch(100, 40, 8, Tail::Keep), Some(8));
        assert_eq!(steps_in_epoch(100, 100, 8, Tail::Keep), Some(0));
        assert_eq!(
            steps_in_epoch(5, 0, 8, Tail::Keep),
            Some(1),
            "fewer samples than a step"
        );
        assert_eq!(steps_in_epoch(5, 0, 8, Tail::Drop), Some(0));
        assert_eq!(steps_in_epoch(100, 101, 8, Tail::Keep), None);
        assert_eq!(steps_in_epoch(100, 0, 0, Tail::Keep), None);
        assert_eq!(samples_in_epoch(100, 8, Tail::Drop), Some(96));
        assert_eq!(samples_in_epoch(100, 8, Tail::Keep), Some(100));
        assert_eq!(
            normal((2, 96), 100, 8, Tail::Keep),
            Some((2, 96)),
            "4 left: a short step"
        );
        assert_eq!(normal((2, 100), 100, 8, Tail::Keep), Some((3, 0)));
        assert_eq!(after_steps(2, 0, 12, 100, 8, Tail::Keep), Some((2, 96)));
        assert_eq!(
            after_steps(2, 0, 13, 100, 8, Tail::Keep),
            Some((3, 0)),
            "the short step ends it"
        );
        assert_eq!(advance((0, 0), 13, 100, 8, Tail::Keep), Some((1, 0)));
        assert_eq!(advance((0, 0), 14, 100, 8, Tail::Keep), Some((1, 8)));
        assert_eq!(
            advance((0, 0), 1, 4, 8, Tail::Keep),
            Some((1, 0)),
            "one short step an epoch"
        );
        assert_eq!(
            advance((0, 0), 1, 0, 8, Tail::Keep),
            None,
            "no sample at all"
        );
    }

    #[test]
    fn the_tail_word_reads_back_and_any_other_word_is_no_tail() {
        for tail in [Tail::Drop, Tail::Keep] {
            assert_eq!(Tail::from_word(tail.word()), Some(tail));
        }
        assert_eq!(Tail::from_word(2), None);
    }
}
