//! A feed across fork(): the child gives up its copies of the rank locks at
//! once, and a consumer tells that it was attached by its parent.

use std::sync::atomic::AtomicI32;

/// Forks this process has been through: raised in the child by a
/// `pthread_atfork` handler, so a consumer tells with one load that it was
/// attached by the parent of this process.
pub(super) static FORKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Most feeds of one process whose rank lock a forked child gives up.
const LOCK_FDS_MAX: usize = 64;

/// The descriptors of this process's feeds, each holding its rank's lock
/// (-1: free entry). A rank lock is an OFD lock: it lasts while any
/// descriptor of its open file description is open, and a forked child gets
/// copies of them all. A child that outlived its trainer (an orphaned
/// multiprocessing worker, say) would keep the rank locked, so no new trainer
/// could attach to it and the loader would never reclaim its slots: the
/// child closes its copies at once, in the atfork handler. (The ring is
/// mapped through another open file description, `segment::map_apart`, so
/// the child's mapping, which it keeps, holds no lock.)
pub(super) static LOCK_FDS: [AtomicI32; LOCK_FDS_MAX] =
    [const { AtomicI32::new(-1) }; LOCK_FDS_MAX];

extern "C" fn in_forked_child() {
    FORKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    for entry in &LOCK_FDS {
        let fd = entry.swap(-1, std::sync::atomic::Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: the child's copy of a feed's descriptor; its Consumer
            // knows (`lock_entry`) not to close it again. close is
            // async-signal-safe, as a handler after fork requires.
            unsafe { libc::close(fd) };
        }
    }
}

/// Records `fd` for `in_forked_child`; None when the table is full (a child
/// then keeps its copy until it exits, as before the table existed).
pub(super) fn register_lock_fd(fd: i32) -> Option<usize> {
    use std::sync::atomic::Ordering::Relaxed;
    LOCK_FDS
        .iter()
        .position(|entry| entry.compare_exchange(-1, fd, Relaxed, Relaxed).is_ok())
}

/// The number of forks so far, registering the counter on first use.
pub(super) fn forks_so_far() -> u64 {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    REGISTER.call_once(|| {
        // SAFETY: the handler only touches atomics and calls close, which
        // is allowed in a child after fork. A failure (ENOMEM) leaves forks
        // undetected, as before this check existed.
        unsafe { libc::pthread_atfork(None, None, Some(in_forked_child)) };
    });
    FORKS.load(std::sync::atomic::Ordering::Relaxed)
}
