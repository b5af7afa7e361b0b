//! The resume rule as pure functions of the C ABI (`ring::resume`), so that
//! the Python binding applies the loader's own rule instead of a copy of it.
//! They need no feed: a state is saved after a batch that may outlive its
//! feed's attachment. The first three are the rule of a dropped tail (every
//! loader before `--tail keep`); the `_tail` ones take the tail.

use crate::epoch::tail_of;
use crate::{fail, guard, RF_E_INVALID, RF_OK};
use ring::resume::{self, State, Tail};

/// Writes `state` through `epoch` and `samples`, or fails naming `what`.
///
/// # Safety
/// `epoch` and `samples` are NULL or writable.
unsafe fn put(what: &str, state: Option<State>, epoch: *mut u64, samples: *mut u64) -> i32 {
    if epoch.is_null() || samples.is_null() {
        return fail(
            RF_E_INVALID,
            format!("{what}: epoch and samples must not be NULL"),
        );
    }
    let Some((e, n)) = state else {
        return fail(
            RF_E_INVALID,
            format!("{what}: no state: a step of 0 samples, a step larger than the dataset, or an overflow"),
        );
    };
    // SAFETY: both non-NULL and writable by contract.
    unsafe {
        *epoch = e;
        *samples = n;
    }
    RF_OK
}

/// The state a loader goes on from, given a state `(in_epoch, in_samples)`
/// of a dataset of `dataset_samples` samples served `samples_per_step`
/// (`W × B`) a step: one with less than a step left of its epoch is the next
/// epoch's start (docs/sampler.md). RF_E_INVALID for a step of 0 samples.
///
/// # Safety
/// `epoch` and `samples` are writable.
#[no_mangle]
pub unsafe extern "C" fn rf_resume_normal(
    in_epoch: u64,
    in_samples: u64,
    dataset_samples: u64,
    samples_per_step: u64,
    epoch: *mut u64,
    samples: *mut u64,
) -> i32 {
    guard(|| {
        let state = resume::normal(
            (in_epoch, in_samples),
            dataset_samples,
            samples_per_step,
            Tail::Drop,
        );
        // SAFETY: forwarded contract.
        unsafe { put("rf_resume_normal", state, epoch, samples) }
    })
}

/// The state once `steps_done` steps of `in_epoch` were consumed, where
/// `start_samples` samples of that epoch were consumed before its first step
/// (a loader's `--resume` in the epoch it started in, 0 in later epochs).
/// A batch of step `s` gives the state after `s + 1` steps.
///
/// # Safety
/// `epoch` and `samples` are writable.
#[no_mangle]
pub unsafe extern "C" fn rf_resume_after(
    in_epoch: u64,
    start_samples: u64,
    steps_done: u64,
    dataset_samples: u64,
    samples_per_step: u64,
    epoch: *mut u64,
    samples: *mut u64,
) -> i32 {
    guard(|| {
        let state = resume::after_steps(
            in_epoch,
            start_samples,
            steps_done,
            dataset_samples,
            samples_per_step,
            Tail::Drop,
        );
        // SAFETY: forwarded contract.
        unsafe { put("rf_resume_after", state, epoch, samples) }
    })
}

/// The state `steps` steps after the state `(in_epoch, in_samples)`, across
/// epochs (each epoch's tail dropped).
///
/// # Safety
/// `epoch` and `samples` are writable.
#[no_mangle]
pub unsafe extern "C" fn rf_resume_advance(
    in_epoch: u64,
    in_samples: u64,
    steps: u64,
    dataset_samples: u64,
    samples_per_step: u64,
    epoch: *mut u64,
    samples: *mut u64,
) -> i32 {
    guard(|| {
        let state = resume::advance(
            (in_epoch, in_samples),
            steps,
            dataset_samples,
            samples_per_step,
            Tail::Drop,
        );
        // SAFETY: forwarded contract.
        unsafe { put("rf_resume_advance", state, epoch, samples) }
    })
}

/// `rf_resume_normal` under the tail `tail` (`RF_TAIL_DROP` or
/// `RF_TAIL_KEEP`, `rf_get_epoch`): with `RF_TAIL_KEEP` a state is the next
/// epoch's start only when no sample of its epoch is left. RF_E_INVALID for
/// another tail or a step of 0 samples.
///
/// # Safety
/// `epoch` and `samples` are writable.
#[no_mangle]
pub unsafe extern "C" fn rf_resume_normal_tail(
    in_epoch: u64,
    in_samples: u64,
    dataset_samples: u64,
    samples_per_step: u64,
    tail: u32,
    epoch: *mut u64,
    samples: *mut u64,
) -> i32 {
    guard(|| {
        let Some(tail) = tail_of(tail, "rf_resume_normal_tail") else {
            return RF_E_INVALID;
        };
        let state = resume::normal(
            (in_epoch, in_samples),
            dataset_samples,
            samples_per_step,
            tail,
        );
        // SAFETY: forwarded contract.
        unsafe { put("rf_resume_normal_tail", state, epoch, samples) }
    })
}

/// `rf_resume_after` under the tail `tail`: with `RF_TAIL_KEEP` the epoch's
/// last (short) step gives `in_epoch + 1` and 0.
///
/// # Safety
/// `epoch` and `samples` are writable.
#[no_mangle]
pub unsafe extern "C" fn rf_resume_after_tail(
    in_epoch: u64,
    start_samples: u64,
    steps_done: u64,
    dataset_samples: u64,
    samples_per_step: u64,
    tail: u32,
    epoch: *mut u64,
    samples: *mut u64,
) -> i32 {
    guard(|| {
        let Some(tail) = tail_of(tail, "rf_resume_after_tail") else {
            return RF_E_INVALID;
        };
        let state = resume::after_steps(
            in_epoch,
            start_samples,
            steps_done,
            dataset_samples,
            samples_per_step,
            tail,
        );
        // SAFETY: forwarded contract.
        unsafe { put("rf_resume_after_tail", state, epoch, samples) }
    })
}

/// `rf_resume_advance` under the tail `tail`.
///
/// # Safety
/// `epoch` and `samples` are writable.
#[no_mangle]
pub unsafe extern "C" fn rf_resume_advance_tail(
    in_epoch: u64,
    in_samples: u64,
    steps: u64,
    dataset_samples: u64,
    samples_per_step: u64,
    tail: u32,
    epoch: *mut u64,
    samples: *mut u64,
) -> i32 {
    guard(|| {
        let Some(tail) = tail_of(tail, "rf_resume_advance_tail") else {
            return RF_E_INVALID;
        };
        let state = resume::advance(
            (in_epoch, in_samples),
            steps,
            dataset_samples,
            samples_per_step,
            tail,
        );
        // SAFETY: forwarded contract.
        unsafe { put("rf_resume_advance_tail", state, epoch, samples) }
    })
}
