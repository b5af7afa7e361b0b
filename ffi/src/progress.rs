//! The run's shape, for a trainer's progress (`feed.progress` in Python):
//! epochs, steps in a whole epoch, samples per step.

use crate::{fail, guard, rf_feed, RF_E_INVALID, RF_E_VERSION, RF_OK};

/// The shape of the loader's run: with a batch's epoch and step, where that
/// batch stands in its epoch and in the run.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct rf_run_shape {
    /// The run's `--epochs`: it ends before epoch `epochs` (epochs count
    /// from 0).
    pub epochs: u64,
    /// Steps each rank gets in a whole epoch; the first epoch of a resumed
    /// run has fewer (`rf_info.batches_expected` less the later epochs').
    pub epoch_steps: u64,
    /// Samples per rank per step (`--batch-size`).
    pub batch_size: u64,
}

/// Fills `*shape` with the shape of the loader's run. RF_E_VERSION when the
/// loader does not say it (an older loader, or, under `--resume auto`, one
/// that still waits for its ranks to say where the run starts: ask again
/// after the first batch).
///
/// # Safety
/// `feed` comes from rf_attach and was not detached; `shape` is writable.
#[no_mangle]
pub unsafe extern "C" fn rf_get_run_shape(feed: *const rf_feed, shape: *mut rf_run_shape) -> i32 {
    guard(|| {
        if feed.is_null() || shape.is_null() {
            return fail(
                RF_E_INVALID,
                "rf_get_run_shape: feed and shape must not be NULL",
            );
        }
        // SAFETY: a live feed from rf_attach.
        let consumer = unsafe { &(*feed).consumer };
        let Some(s) = consumer.run_shape() else {
            return fail(
                RF_E_VERSION,
                format!(
                    "the loader of {:?} does not say its run's shape (an older ringfeed serve, or one still waiting for its ranks to say where the run starts)",
                    consumer.name()
                ),
            );
        };
        // SAFETY: non-NULL and writable by contract.
        unsafe {
            *shape = rf_run_shape {
                epochs: s.epochs,
                epoch_steps: s.epoch_steps,
                batch_size: s.batch_size,
            }
        };
        RF_OK
    })
}
