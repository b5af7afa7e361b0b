//! SIGINT, SIGTERM and SIGHUP (the terminal of an ssh session closing) turn
//! into a flag the loader polls, so it can tell the trainers, remove its
//! segment and exit instead of dying mid-write.

use std::sync::atomic::{AtomicU32, Ordering};

/// The signal number received, or 0.
pub static STOP: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(sig as u32, Ordering::Relaxed);
}

/// Installs the handlers for SIGINT, SIGTERM and SIGHUP.
pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
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
