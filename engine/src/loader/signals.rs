//! SIGINT, SIGTERM and SIGHUP (the terminal of an ssh session closing, unless
//! started under `nohup`) turn into a flag the loader polls, so it can tell
//! the trainers, remove its segment and exit instead of dying mid-write.

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Mutex;

use super::{ServeError, STOP_NOT_A_SIGNAL};

/// The signal number received, or 0.
pub static STOP: AtomicU32 = AtomicU32::new(0);

/// Why [`stop_with`] stopped the run (the trainers are told this).
static STOP_REASON: Mutex<Option<String>> = Mutex::new(None);

/// Stops the loader serving on [`STOP`] with an error of its own (a
/// background check found the dataset changed): the run ends as on a
/// signal, but the trainers and the exit are told `reason`. A signal that
/// came first wins.
pub fn stop_with(reason: String) {
    if let Ok(mut slot) = STOP_REASON.lock() {
        slot.get_or_insert(reason);
    }
    // SYNC POINT: Release; the reason above is visible to a loader whose
    // relaxed load of STOP saw this store and then took the Acquire fence
    // in `stopped_error`.
    let _ = STOP.compare_exchange(0, STOP_NOT_A_SIGNAL, Ordering::Release, Ordering::Relaxed);
}

/// The reason given to [`stop_with`], if [`STOP`] holds one (and no signal
/// came first): for a check that ends after the loader has served its last
/// batch.
pub fn stop_reason() -> Option<String> {
    if STOP.load(Ordering::Relaxed) != STOP_NOT_A_SIGNAL {
        return None;
    }
    match stopped_error(&STOP) {
        ServeError::SourceChanged(reason) => Some(reason),
        _ => None,
    }
}

/// The error for a `stop` found at STOP_NOT_A_SIGNAL: the reason given to
/// [`stop_with`] when `stop` is [`STOP`], else a plain stop.
pub(crate) fn stopped_error(stop: &AtomicU32) -> ServeError {
    if !std::ptr::eq(stop, &STOP) {
        return ServeError::Stopped;
    }
    // SYNC POINT: Acquire; pairs with the Release store in `stop_with`.
    fence(Ordering::Acquire);
    match STOP_REASON.lock().ok().and_then(|r| r.clone()) {
        Some(reason) => ServeError::SourceChanged(reason),
        None => ServeError::Stopped,
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(sig as u32, Ordering::Relaxed);
}

/// Undoes an inherited "ignore" of SIGINT and SIGTERM, first thing: a
/// non-interactive shell starts `ringfeed serve &` with SIGINT ignored, so
/// a Ctrl-C or `kill -INT` during the listing was dropped while the same
/// signal a moment later stopped the loader. With the default back, both
/// stop it. SIGHUP is left alone: an ignored SIGHUP is `nohup`'s request.
pub fn unignore_stop_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        if is_ignored(sig) {
            // SAFETY: resetting a disposition to the default is always sound.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
}

fn is_ignored(sig: libc::c_int) -> bool {
    // SAFETY: a null new action only reads the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// Installs the handlers for SIGINT, SIGTERM and SIGHUP; SIGHUP only if it
/// is not ignored: under `nohup` the loader outlives its terminal.
pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        if sig == libc::SIGHUP && is_ignored(sig) {
            continue;
        }
        // SAFETY: sigaction is plain old data; the handler only stores to an
        // atomic, which is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}
