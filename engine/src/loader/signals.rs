//! SIGINT, SIGTERM and SIGHUP (the terminal of an ssh session closing, unless
//! started under `nohup`) turn into a flag the loader polls, so it can tell
//! the trainers, remove its segment and exit instead of dying mid-write.

use std::sync::atomic::{AtomicU32, Ordering};

/// The signal number received, or 0 (read by a run through its
/// [`StopToken::on_signals`](super::StopToken::on_signals)).
pub static STOP: AtomicU32 = AtomicU32::new(0);

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
