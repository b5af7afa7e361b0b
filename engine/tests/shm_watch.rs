//! The /dev/shm watch of a waiting attach closes its inotify descriptor on a
//! thread of its own (closing one can wait 10 ms or more for the kernel): this
//! checks that every descriptor is still closed. One test in its own binary,
//! so that no other test opens or closes inotify descriptors meanwhile.

use std::time::{Duration, Instant};

use ringfeed::ring::segment::ShmWatch;

/// inotify descriptors this process holds.
fn inotify_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().contains("inotify"))
        .count()
}

#[test]
fn dropped_watches_close_their_descriptors() {
    let before = inotify_fds();
    let watches: Vec<ShmWatch> = (0..16).map(|_| ShmWatch::new().expect("inotify on /dev/shm")).collect();
    assert_eq!(inotify_fds(), before + 16);
    drop(watches);
    let t = Instant::now();
    while inotify_fds() > before {
        assert!(t.elapsed() < Duration::from_secs(10), "{} inotify descriptors still open 10 s after the drop", inotify_fds() - before);
        std::thread::sleep(Duration::from_millis(5));
    }
}
