//! A shard's wake-up: an eventfd the shard's ring always has a READ on, and
//! the flag the shard sets before it sleeps in the kernel. The engine
//! (`mod.rs`) pokes it, the shard (`shard.rs`) sleeps on it, and its ring
//! (`ring.rs`) keeps the READ queued: a room of its own, below all three.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// A shard's wake-up eventfd and its "about to sleep" flag.
pub(super) struct Wake {
    fd: OwnedFd,
    /// Set by the shard before it sleeps in the kernel.
    pub(super) sleeping: AtomicBool,
    /// Set by the engine's drop: stop taking batches.
    pub(super) closing: AtomicBool,
}

impl Wake {
    pub(super) fn new() -> io::Result<Wake> {
        // Blocking on purpose: io_uring then polls it instead of failing
        // the READ with EAGAIN.
        // SAFETY: plain system call without pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: eventfd just returned this descriptor and nobody else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Wake {
            fd,
            sleeping: AtomicBool::new(false),
            closing: AtomicBool::new(false),
        })
    }

    pub(super) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Completes the shard's pending eventfd READ.
    pub(super) fn poke(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from `one`, which lives for the call, to an
        // eventfd we own. It can only fail if the counter would overflow,
        // and then a READ is already due.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Called by the engine after it sent a batch.
    pub(super) fn poke_if_sleeping(&self) {
        // SYNC POINT: SeqCst pairs with the shard's store of `sleeping`
        // before it looks at its channel: either the shard sees our batch,
        // or we see `sleeping` and wake it.
        if self.sleeping.swap(false, Ordering::SeqCst) {
            self.poke();
        }
    }

    /// Called by the engine's drop before it closes the channels.
    pub(super) fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.poke();
    }
}
