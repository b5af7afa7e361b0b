//! The resume rule, written once: where a run goes on after some steps.
//!
//! A resume state is `(epoch, samples consumed in that epoch)` (docs/sampler.md).
//! Each step consumes `W × B` samples of the epoch's order (`per_step`); an
//! epoch of `n` samples ends when less than a step is left, and its tail is
//! dropped, not carried over. So the state after an epoch's last step is
//! `(epoch + 1, 0)`, and a state with less than a step left of its epoch *is*
//! the next epoch's start.
//!
//! The sampler (which steps the loader serves), the ring's [`crate::layout::Job`]
//! (the state after a batch a trainer took) and the Python binding (through
//! `rf_resume_*` in the C ABI) all apply these functions, so they cannot drift.
//! Every function returns None rather than overflow or divide by zero.

/// A resume state: `(epoch, samples consumed in it)`.
pub type State = (u64, u64);

/// The state a loader goes on from: one with less than a step left of its
/// epoch is the start of the next epoch. None for `per_step == 0` or on
/// overflow.
pub fn normal(state: State, n: u64, per_step: u64) -> Option<State> {
    let (epoch, samples) = state;
    if per_step == 0 {
        return None;
    }
    if samples.checked_add(per_step)? > n {
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
) -> Option<State> {
    let done = steps_done
        .checked_mul(per_step)?
        .checked_add(start_samples)?;
    normal((epoch, done), n, per_step)
}

/// The state `steps` steps after `start`, across epochs. None when an epoch
/// holds no step (`per_step > n`) or on overflow.
pub fn advance(start: State, steps: u64, n: u64, per_step: u64) -> Option<State> {
    if per_step == 0 || per_step > n {
        return None;
    }
    let (epoch, samples) = normal(start, n, per_step)?;
    // With per_step <= n, normal() leaves at least one step in the epoch:
    // samples + per_step <= n.
    let left = (n - samples) / per_step;
    if steps < left {
        return after_steps(epoch, samples, steps, n, per_step);
    }
    let per_epoch = n / per_step;
    let rest = steps - left;
    let epoch = epoch.checked_add(1)?.checked_add(rest / per_epoch)?;
    Some((epoch, (rest % per_epoch) * per_step))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_with_less_than_a_step_left_is_the_next_epochs_start() {
        assert_eq!(normal((2, 96), 100, 8), Some((3, 0)));
        assert_eq!(normal((2, 92), 100, 8), Some((2, 92)));
        assert_eq!(normal((2, 0), 100, 0), None, "no step size");
        assert_eq!(normal((u64::MAX, 99), 100, 8), None, "overflow");
    }

    #[test]
    fn the_state_after_steps_counts_from_the_epochs_start() {
        assert_eq!(after_steps(1, 40, 3, 1000, 64), Some((1, 232)));
        assert_eq!(after_steps(1, 40, 15, 1000, 64), Some((2, 0)));
        assert_eq!(after_steps(1, 0, u64::MAX, 1000, 64), None);
    }

    #[test]
    fn advancing_crosses_epochs_and_drops_each_tail() {
        // n = 100, 8 per step: 12 steps an epoch, a tail of 4 dropped.
        assert_eq!(advance((0, 0), 0, 100, 8), Some((0, 0)));
        assert_eq!(advance((0, 0), 11, 100, 8), Some((0, 88)));
        assert_eq!(advance((0, 0), 12, 100, 8), Some((1, 0)));
        assert_eq!(advance((0, 40), 7, 100, 8), Some((1, 0)));
        assert_eq!(advance((0, 40), 8, 100, 8), Some((1, 8)));
        assert_eq!(
            advance((0, 96), 1, 100, 8),
            Some((1, 8)),
            "a tail state is the next epoch"
        );
        assert_eq!(advance((0, 0), 30, 100, 8), Some((2, 48)));
        assert_eq!(advance((0, 0), 1, 4, 8), None, "no step fits an epoch");
    }

    #[test]
    fn advancing_one_step_at_a_time_agrees_with_advancing_all_at_once() {
        for (n, per_step) in [(100, 8), (64, 64), (1000, 24), (7, 3)] {
            for start in [(0, 0), (1, 5), (2, n - 1)] {
                let mut state = normal(start, n, per_step).unwrap();
                for steps in 0..50 {
                    assert_eq!(
                        advance(start, steps, n, per_step),
                        Some(state),
                        "n {n} per step {per_step} start {start:?} steps {steps}"
                    );
                    state = after_steps(state.0, state.1, 1, n, per_step).unwrap();
                }
            }
        }
    }
}
