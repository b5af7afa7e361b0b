//! The /dev/shm watch of a waiting attach never closes its inotify descriptor
//! (closing one can wait 10 ms or more for the kernel): a dropped watch is
//! removed and its descriptor kept for the next attach. This checks that the
//! descriptors are reused, not piled up, and hold no watch while idle. One
//! test in its own binary, so that no other test makes watches meanwhile.

use std::path::PathBuf;

use ringfeed_ring::segment::ShmWatch;

/// This process's inotify descriptors.
fn inotify_fds() -> Vec<PathBuf> {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| {
            let path = e.ok()?.path();
            std::fs::read_link(&path)
                .ok()?
                .to_string_lossy()
                .contains("inotify")
                .then_some(path)
        })
        .collect()
}

/// Watches held by the inotify descriptor at /proc/self/fd/N.
fn watches_of(fd_path: &std::path::Path) -> usize {
    let info = fd_path.to_string_lossy().replace("/fd/", "/fdinfo/");
    std::fs::read_to_string(info).map_or(0, |text| {
        text.lines()
            .filter(|l| l.starts_with("inotify wd:"))
            .count()
    })
}

#[test]
fn dropped_watches_keep_their_descriptors_for_the_next_without_a_watch() {
    let before = inotify_fds().len();
    let watches: Vec<ShmWatch> = (0..16)
        .map(|_| ShmWatch::new().expect("inotify on /dev/shm"))
        .collect();
    let held = inotify_fds();
    assert_eq!(held.len(), before + 16);
    assert!(held.iter().all(|fd| watches_of(fd) <= 1));
    assert_eq!(
        held.iter().map(|fd| watches_of(fd)).sum::<usize>(),
        16,
        "one watch per ShmWatch"
    );
    drop(watches);
    // Kept, not closed, and watching nothing.
    let idle = inotify_fds();
    assert_eq!(idle.len(), before + 16);
    assert_eq!(
        idle.iter().map(|fd| watches_of(fd)).sum::<usize>(),
        0,
        "an idle descriptor still watches /dev/shm"
    );
    // Reused: new watches make no new descriptors.
    for _ in 0..3 {
        let again: Vec<ShmWatch> = (0..16)
            .map(|_| ShmWatch::new().expect("inotify on /dev/shm"))
            .collect();
        assert_eq!(inotify_fds().len(), before + 16);
        drop(again);
    }
    let one = ShmWatch::new().expect("inotify on /dev/shm");
    assert_eq!(
        inotify_fds().iter().map(|fd| watches_of(fd)).sum::<usize>(),
        1
    );
    drop(one);
}
