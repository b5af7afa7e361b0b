//! How an epoch ends and how many steps it has (`ringfeed serve --tail`):
//! what a trainer needs for its steps per epoch (an LR schedule, a progress
//! bar, `len()` of a DataLoader) and for an evaluation loop whose last
//! batches are short or empty. The figures come from the resume rule
//! (`ring::resume`), the one place the loader's sampler takes them from too.

use crate::{fail, guard, rf_feed, RF_E_INVALID, RF_E_VERSION, RF_OK};
use ring::resume::{self, Tail};

/// Every epoch drops the samples that do not fill a whole step (the
/// default, training): every batch is full.
pub const RF_TAIL_DROP: u32 = 0;
/// Every sample is served once an epoch (`--tail keep`, evaluation): the
/// last steps' batches are short or empty (`rf_batch.n_samples` 0 to B).
pub const RF_TAIL_KEEP: u32 = 1;

/// How every epoch of a feed's loader ends, and its size.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct rf_epoch {
    /// `RF_TAIL_DROP` or `RF_TAIL_KEEP`.
    pub tail: u32,
    /// Zero (padding).
    pub reserved: u32,
    /// Steps every rank takes in a whole epoch: the same for every rank, so
    /// collectives line up. A run resumed mid-epoch serves fewer in its
    /// first epoch (`rf_epoch_steps` with the loader's start).
    pub steps_per_epoch: u64,
    /// Samples a whole epoch serves, all ranks of the job together: the
    /// dataset's under `RF_TAIL_KEEP`; less its dropped tail (fewer than
    /// one step's) under `RF_TAIL_DROP`.
    pub samples_per_epoch: u64,
    /// Samples in the dataset (the same as `rf_get_start`'s).
    pub dataset_samples: u64,
}

/// The tail a C caller names, or None after setting the error.
pub(crate) fn tail_of(word: u32, what: &str) -> Option<Tail> {
    let tail = Tail::from_word(u64::from(word));
    if tail.is_none() {
        fail(
            RF_E_INVALID,
            format!("{what}: tail {word} is neither RF_TAIL_DROP (0) nor RF_TAIL_KEEP (1)"),
        );
    }
    tail
}

/// Fills `*epoch` with how every epoch of the feed's loader ends and how
/// many steps and samples it has. A loader that predates `--tail` drops the
/// tail: `RF_TAIL_DROP`. RF_E_VERSION if the loader does not say how many
/// samples it serves (an older loader).
///
/// # Safety
/// `feed` comes from rf_attach and was not detached; `epoch` is writable.
#[no_mangle]
pub unsafe extern "C" fn rf_get_epoch(feed: *const rf_feed, epoch: *mut rf_epoch) -> i32 {
    guard(|| {
        if feed.is_null() || epoch.is_null() {
            return fail(
                RF_E_INVALID,
                "rf_get_epoch: feed and epoch must not be NULL",
            );
        }
        // SAFETY: a live feed from rf_attach.
        let consumer = unsafe { &(*feed).consumer };
        let job = consumer.job();
        let batch_size = consumer.layout().geometry.max_samples_per_slot;
        let figures = consumer.dataset_samples().and_then(|n| {
            let per_step = job.step_samples(batch_size)?;
            Some((
                n,
                consumer.steps_per_epoch()?,
                resume::samples_in_epoch(n, per_step, job.tail)?,
            ))
        });
        let Some((dataset_samples, steps_per_epoch, samples_per_epoch)) = figures else {
            return fail(
                RF_E_VERSION,
                format!("the loader of {:?} does not say how many samples it serves (an older ringfeed serve); restart it with this version", consumer.name()),
            );
        };
        let out = rf_epoch {
            tail: job.tail.word() as u32,
            reserved: 0,
            steps_per_epoch,
            samples_per_epoch,
            dataset_samples,
        };
        // SAFETY: non-NULL and writable by contract.
        unsafe { *epoch = out };
        RF_OK
    })
}

/// Fills `*steps` with the steps every rank takes in an epoch of
/// `dataset_samples` samples whose first `start_samples` were consumed
/// before (a loader's `--resume` in the epoch it starts in, 0 in later
/// ones), `samples_per_step` (`W × B`) a step, under `tail`:
/// `floor((n − c) / step)` with `RF_TAIL_DROP`, `ceil((n − c) / step)` with
/// `RF_TAIL_KEEP`. RF_E_INVALID for another tail, a step of 0 samples, or
/// `start_samples > dataset_samples`.
///
/// # Safety
/// `steps` is writable.
#[no_mangle]
pub unsafe extern "C" fn rf_epoch_steps(
    dataset_samples: u64,
    start_samples: u64,
    samples_per_step: u64,
    tail: u32,
    steps: *mut u64,
) -> i32 {
    guard(|| {
        if steps.is_null() {
            return fail(RF_E_INVALID, "rf_epoch_steps: steps must not be NULL");
        }
        let Some(tail) = tail_of(tail, "rf_epoch_steps") else {
            return RF_E_INVALID;
        };
        let Some(n) =
            resume::steps_in_epoch(dataset_samples, start_samples, samples_per_step, tail)
        else {
            return fail(
                RF_E_INVALID,
                format!("rf_epoch_steps: no epoch of {dataset_samples} samples from {start_samples} in steps of {samples_per_step}"),
            );
        };
        // SAFETY: non-NULL and writable by contract.
        unsafe { *steps = n };
        RF_OK
    })
}
