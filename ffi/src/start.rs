//! Where the run starts when the trainers say (`ringfeed serve --resume
//! auto`, which `ringfeed run` uses): a trainer resuming from its checkpoint
//! asks for the checkpoint's state before its first batch.

use crate::{fail, guard, rf_feed, RF_E_INVALID, RF_OK};
use ring::{StartError, StartMode};

/// The loader starts where its `--resume` says (or at the beginning); the
/// trainers cannot move it.
pub const RF_START_FIXED: u32 = 0;
/// The loader waits for every rank's rf_request_start (or first batch).
pub const RF_START_AWAITING: u32 = 1;
/// The loader waited for its ranks and started where they agreed.
pub const RF_START_DECIDED: u32 = 2;

/// Fills `*mode` with how the loader decides where its run starts: one of
/// `RF_START_FIXED`, `RF_START_AWAITING`, `RF_START_DECIDED`.
///
/// # Safety
/// `feed` comes from rf_attach and was not detached; `mode` is writable.
#[no_mangle]
pub unsafe extern "C" fn rf_get_start_mode(feed: *const rf_feed, mode: *mut u32) -> i32 {
    guard(|| {
        if feed.is_null() || mode.is_null() {
            return fail(
                RF_E_INVALID,
                "rf_get_start_mode: feed and mode must not be NULL",
            );
        }
        // SAFETY: a live feed from rf_attach.
        let consumer = unsafe { &(*feed).consumer };
        let m = match consumer.start_mode() {
            StartMode::Fixed => RF_START_FIXED,
            StartMode::Awaiting => RF_START_AWAITING,
            StartMode::Decided => RF_START_DECIDED,
        };
        // SAFETY: non-NULL and writable by contract.
        unsafe { *mode = m };
        RF_OK
    })
}

/// Asks the loader to start this rank's run at the resume state `(epoch,
/// samples)` of a checkpoint (`has_state` non-zero), or where the loader
/// starts (`has_state` 0: a fresh run; a first rf_next says the same). Call
/// it before the first rf_next. The loader serves once every rank has asked,
/// and stops with an error naming each rank's request (what rf_next then
/// reports) when they differ. RF_E_INVALID, saying why, when the loader does
/// not wait for its ranks (`RF_START_FIXED`: check its start with
/// rf_get_start instead) or has already started elsewhere.
///
/// # Safety
/// `feed` comes from rf_attach and was not detached.
#[no_mangle]
pub unsafe extern "C" fn rf_request_start(
    feed: *mut rf_feed,
    has_state: i32,
    epoch: u64,
    samples: u64,
) -> i32 {
    guard(|| {
        if feed.is_null() {
            return fail(RF_E_INVALID, "rf_request_start: feed must not be NULL");
        }
        // SAFETY: a live feed from rf_attach, used by one thread at a time.
        let consumer = unsafe { &mut (*feed).consumer };
        let at = (has_state != 0).then_some((epoch, samples));
        match consumer.request_start(at) {
            Ok(()) => RF_OK,
            Err(e @ (StartError::NotAwaited { .. } | StartError::AlreadyStarted { .. })) => {
                fail(RF_E_INVALID, e)
            }
        }
    })
}
