//! The resume rule as pure functions of the C ABI (`ring::resume`), so that
//! the Python binding applies the loader's own rule instead of a copy of it.
//! They need no feed: a state is saved after a batch that may outlive its
//! feed's attachment.

use crate::{fail, guard, RF_E_INVALID, RF_OK};
use ring::resume::{self, State};

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
        let state = resume::normal((in_epoch, in_samples), dataset_samples, samples_per_step);
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
        );
        // SAFETY: forwarded contract.
        unsafe { put("rf_resume_advance", state, epoch, samples) }
    })
}
