//! Futexes on words inside the shared mapping (never FUTEX_PRIVATE: the
//! waiter and the waker are different processes).
//!
//! Every wait takes a timeout; callers loop and re-check liveness between
//! waits, so a lost wake-up costs at most one timeout, never a hang.

use std::time::Duration;

use crate::sync::AtomicU32;

/// Most futexes in one `futex_waitv` call (the kernel's FUTEX_WAITV_MAX).
pub const WAITV_MAX: usize = 128;

fn timespec(d: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    }
}

/// Sleeps while `*word == expected`, for at most `timeout`. Returns early on a
/// wake, a changed value, a signal or the timeout; the caller re-checks.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = timespec(timeout);
    // SAFETY: `word` is a live, 4-byte-aligned u32 (AtomicU32 guarantees both)
    // and `ts` outlives the call. FUTEX_WAIT only reads them.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const AtomicU32,
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every process sleeping on `word`.
pub fn wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE does not write memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const AtomicU32,
            libc::FUTEX_WAKE,
            i32::MAX,
            0usize,
            0usize,
            0u32,
        );
    }
}

#[repr(C)]
struct FutexWaitv {
    val: u64,
    uaddr: u64,
    flags: u32,
    reserved: u32,
}

const FUTEX2_SIZE_U32: u32 = 0x02;
const SYS_FUTEX_WAITV: libc::c_long = 449;

/// Sleeps until any of `words` differs from its expected value, a wake, or the
/// timeout. Uses `futex_waitv` (Linux 5.16+); on older kernels it sleeps on the
/// first word only, for at most a millisecond at a time, which is still
/// correct because every caller re-checks all conditions after waking.
pub fn wait_any(words: &[(&AtomicU32, u32)], timeout: Duration) {
    debug_assert!(!words.is_empty() && words.len() <= WAITV_MAX);
    let waiters: Vec<FutexWaitv> = words
        .iter()
        .map(|(w, v)| FutexWaitv {
            val: u64::from(*v),
            uaddr: *w as *const AtomicU32 as u64,
            flags: FUTEX2_SIZE_U32,
            reserved: 0,
        })
        .collect();
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid out-pointer for clock_gettime.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let deadline = Duration::new(now.tv_sec as u64, now.tv_nsec as u32) + timeout;
    let abs = timespec(deadline);
    // SAFETY: `waiters` holds valid, aligned u32 addresses of live atomics and
    // outlives the call; `abs` is a valid timespec; the kernel only reads both.
    let rc = unsafe {
        libc::syscall(
            SYS_FUTEX_WAITV,
            waiters.as_ptr(),
            waiters.len() as u32,
            0u32,
            &abs as *const libc::timespec,
            libc::CLOCK_MONOTONIC,
        )
    };
    if rc < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
        if let Some((word, value)) = words.first() {
            wait(word, *value, timeout.min(Duration::from_millis(1)));
        }
    }
}
