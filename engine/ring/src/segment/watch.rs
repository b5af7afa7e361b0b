//! Waking when an entry appears in /dev/shm, through inotify.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use super::SHM_DIR;

/// Watches /dev/shm for new entries, so that a consumer started before its
/// loader attaches the moment the segment appears instead of at its next
/// poll (a 10 ms poll put 5 ms on average on every such first batch).
///
/// Closing an inotify descriptor waits for an SRCU grace period in the
/// kernel (fsnotify_destroy_group): 0.1 ms on an idle machine, 9 to 25 ms
/// measured on the 2-core test VM while a loader fills its ring. A watch is
/// dropped on the attach path, right before the trainer asks for its first
/// batch, so the descriptor is never closed: dropping a watch removes it from
/// /dev/shm (inotify_rm_watch, under 0.1 ms) and keeps the descriptor for the
/// next attach of this process (`IDLE_WATCHES`; one per attach running at once).
pub struct ShmWatch {
    /// None only inside `drop`.
    fd: Option<OwnedFd>,
    /// The watch descriptor of /dev/shm on `fd`.
    wd: libc::c_int,
}

/// inotify descriptors with no watch, kept for the next `ShmWatch`.
static IDLE_WATCHES: std::sync::Mutex<Vec<OwnedFd>> = std::sync::Mutex::new(Vec::new());

fn idle_watches() -> std::sync::MutexGuard<'static, Vec<OwnedFd>> {
    IDLE_WATCHES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Drop for ShmWatch {
    fn drop(&mut self) {
        let Some(fd) = self.fd.take() else {
            return;
        };
        // SAFETY: `fd` is an inotify descriptor and `wd` its watch.
        if unsafe { libc::inotify_rm_watch(fd.as_raw_fd(), self.wd) } == 0 {
            idle_watches().push(fd);
        }
        // Else the watch is in an unknown state: let the descriptor go
        // (closing it here costs this caller the grace period, once).
    }
}

impl ShmWatch {
    /// Starts watching. Fails where inotify is unavailable (callers poll).
    pub fn new() -> io::Result<ShmWatch> {
        let idle = idle_watches().pop();
        let fd = match idle {
            Some(fd) => fd,
            None => {
                // SAFETY: plain syscall; the result is checked.
                let raw = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
                if raw < 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: inotify_init1 returned a fresh descriptor nobody else owns.
                unsafe { OwnedFd::from_raw_fd(raw) }
            }
        };
        let dir = CString::new(SHM_DIR).unwrap_or_default();
        // SAFETY: `fd` is an inotify descriptor and `dir` a valid C string.
        let wd = unsafe {
            libc::inotify_add_watch(
                fd.as_raw_fd(),
                dir.as_ptr(),
                libc::IN_CREATE | libc::IN_MOVED_TO,
            )
        };
        if wd < 0 {
            let e = io::Error::last_os_error();
            idle_watches().push(fd);
            return Err(e);
        }
        let watch = ShmWatch { fd: Some(fd), wd };
        // A kept descriptor may hold events of its last use.
        watch.drain();
        Ok(watch)
    }

    fn raw_fd(&self) -> libc::c_int {
        self.fd.as_ref().map_or(-1, |fd| fd.as_raw_fd())
    }

    /// Waits until an entry was created in /dev/shm since the last call (any
    /// entry: the caller looks for its own), or `timeout`. Returns true when
    /// one was.
    pub fn wait(&self, timeout: Duration) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: `pfd` is one valid pollfd.
        let ready = unsafe { libc::poll(&mut pfd, 1, ms) } > 0;
        self.drain();
        ready
    }

    /// Reads every queued event; their names do not matter.
    fn drain(&self) {
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: `buf` is valid for `buf.len()` bytes of writes.
            let n = unsafe { libc::read(self.raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::shm_path;

    #[test]
    fn the_shm_watch_wakes_on_a_new_entry_and_times_out_without_one() {
        // Twice: the second watch reuses the first one's descriptor.
        for round in 0..2 {
            wakes_on_a_new_entry_and_times_out_without_one(round);
        }
    }

    fn wakes_on_a_new_entry_and_times_out_without_one(round: u32) {
        let watch = ShmWatch::new().expect("inotify on /dev/shm");
        let path = shm_path(&format!("watch-test-{}-{round}", std::process::id()));
        let creator = std::thread::spawn({
            let path = path.clone();
            move || {
                std::thread::sleep(Duration::from_millis(50));
                std::fs::write(&path, b"x").unwrap();
            }
        });
        // Other tests may create entries too: wait until ours is there. Each
        // wait must end with an event, long before its 10 s run out.
        let t = std::time::Instant::now();
        while !path.exists() {
            assert!(
                watch.wait(Duration::from_secs(10)),
                "no event for {}",
                path.display()
            );
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "woke after {:?}",
            t.elapsed()
        );
        creator.join().unwrap();
        std::fs::remove_file(&path).unwrap();
        // A wait with nothing to report ends at its timeout.
        let t = std::time::Instant::now();
        watch.wait(Duration::from_millis(50));
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "returned after {:?}",
            t.elapsed()
        );
    }
}
