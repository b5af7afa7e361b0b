//! Whether a cached listing of a local directory still describes it.
//!
//! - **Valid** only when every stamped directory still has the same device,
//!   inode, mtime and ctime (read through an open descriptor, which makes
//!   NFS ask the server), and every link still points to a file of the same
//!   size, or still to no file. Adding, removing or renaming a name anywhere
//!   in the tree changes its directory's times; ctime cannot be set back
//!   from user space (`rsync -a` and `touch -d` set mtime only).
//! - A link whose target lies outside the root was left out of the listing
//!   (unless links out of the root are followed): it must still lie outside,
//!   and a listed link must still lie inside.
//! - With at most `stat_files_max` files, each file's size is checked too
//!   (a few milliseconds). Above that, a file changed in place (same path,
//!   new size) is found when it is read (`ReadError::ChangedSize` / `Grew`),
//!   and the loader then removes the entry.
//! - **Not stored** when a directory's ctime is less than `racy_window`
//!   before the listing began (a change within the same clock tick as the
//!   stamp would leave its times equal), or when the tree is on a FUSE file
//!   system (object-store mounts make directory times up).

use std::fs::{self, Metadata};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::manifest::{FileList, FileRef};
use crate::source::{Checked, DirStamp, LinkStamp};

/// `statfs` type of FUSE file systems (s3fs, gcsfuse, mountpoint-s3,
/// virtiofs): their directory times need not follow their contents.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// The stamp of directory `rel_path` whose metadata is `meta`.
pub(crate) fn stamp_of(rel_path: PathBuf, meta: &Metadata) -> DirStamp {
    // The kernel keeps nanoseconds below 10^9.
    let nanos = |n: i64| n.clamp(0, 999_999_999) as u32;
    DirStamp {
        rel_path,
        dev: meta.dev(),
        ino: meta.ino(),
        mtime: (meta.mtime(), nanos(meta.mtime_nsec())),
        ctime: (meta.ctime(), nanos(meta.ctime_nsec())),
    }
}

/// True when the link (or file) at `path` resolves to a place outside the
/// tree at `canonical_root` (or cannot be resolved).
pub(crate) fn is_outside(canonical_root: &Path, path: &Path) -> bool {
    fs::canonicalize(path).map_or(true, |target| !target.starts_with(canonical_root))
}

/// Checks a cached listing of the tree at `canonical_root`: every directory
/// and link, and every file's size when there are at most `stat_files_max`.
/// `follow_outside`: links out of the tree were listed.
pub(crate) fn check_tree(
    canonical_root: &Path,
    files: &FileList,
    dirs: &[DirStamp],
    links: &[LinkStamp],
    follow_outside: bool,
    stat_files_max: usize,
    threads: usize,
) -> Result<Checked, String> {
    let check_files = files.len() <= stat_files_max;
    let mut checks: Vec<Check<'_>> =
        Vec::with_capacity(dirs.len() + links.len() + if check_files { files.len() } else { 0 });
    checks.extend(dirs.iter().map(Check::Dir));
    checks.extend(links.iter().map(Check::Link));
    if check_files {
        checks.extend(files.iter().map(Check::File));
    }
    if let Some(why) = first_failure(canonical_root, follow_outside, &checks, threads) {
        return Err(why);
    }
    Ok(Checked {
        dirs_checked: dirs.len(),
        files_checked: if check_files { files.len() } else { 0 },
    })
}

/// Why a listing of `canonical_root` that began at `listed_at` must not be
/// stored, if it must not: a directory changed within `racy_window` of it,
/// or the tree is on FUSE.
pub(crate) fn why_not_stored(
    canonical_root: &Path,
    dirs: &[DirStamp],
    listed_at: SystemTime,
    racy_window: Duration,
) -> Option<String> {
    let racy_after = listed_at.checked_sub(racy_window).unwrap_or(UNIX_EPOCH);
    // ctime only: every change sets it to the current time, while mtime
    // may lie in the future (archives unpacked from a skewed clock).
    if let Some(stamp) = dirs.iter().find(|d| time_of(d.ctime) >= racy_after) {
        return Some(format!(
            "directory {} changed less than {:.0?} before the listing began, so a change made in the same clock tick \
             could not be told apart; the next start lists it again",
            canonical_root.join(&stamp.rel_path).display(),
            racy_window
        ));
    }
    on_fuse(canonical_root, dirs).map(|dir| {
        format!(
            "{} is on a FUSE file system (an object-store mount such as s3fs, gcsfuse or mountpoint-s3 \
             need not change a directory's times when its contents change), so every start lists it",
            dir.display()
        )
    })
}

/// The metadata of directory `path`, read through an open descriptor: on
/// NFS, opening makes the client ask the server instead of answering from
/// its attribute cache. Links are not followed unless `follow`.
pub(crate) fn dir_metadata(path: &Path, follow: bool) -> io::Result<fs::Metadata> {
    let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | nofollow)
        .open(path)?
        .metadata()
}

/// One thing a lookup must find unchanged.
enum Check<'a> {
    Dir(&'a DirStamp),
    Link(&'a LinkStamp),
    File(FileRef<'a>),
}

impl Check<'_> {
    /// None when unchanged; else what changed.
    fn failure(&self, root: &Path, follow_outside: bool) -> Option<String> {
        match self {
            Check::Dir(stamp) => {
                let abs = root.join(&stamp.rel_path);
                match dir_metadata(&abs, false) {
                    Ok(meta) => {
                        let now = stamp_of(stamp.rel_path.clone(), &meta);
                        let changed: Vec<&str> = [
                            ("device", now.dev != stamp.dev),
                            ("inode", now.ino != stamp.ino),
                            ("mtime", now.mtime != stamp.mtime),
                            ("ctime", now.ctime != stamp.ctime),
                        ]
                        .iter()
                        .filter(|(_, differs)| *differs)
                        .map(|(field, _)| *field)
                        .collect();
                        (!changed.is_empty()).then(|| {
                            format!(
                                "directory {} changed since it was listed ({})",
                                abs.display(),
                                changed.join(", ")
                            )
                        })
                    }
                    Err(err) => Some(format!("directory {}: {err}", abs.display())),
                }
            }
            Check::Link(link) => {
                let abs = root.join(&link.rel_path);
                let now = fs::metadata(&abs);
                // Resolved only where it decides: a link to a file.
                let outside = || !follow_outside && is_outside(root, &abs);
                let same = match (&now, link.file_size) {
                    (Ok(meta), Some(size)) => meta.is_file() && meta.len() == size && !outside(),
                    (Ok(meta), None) => !meta.is_file() || outside(),
                    (Err(_), _) => false,
                };
                (!same).then(|| {
                    format!(
                        "the target of link {} changed since it was listed",
                        abs.display()
                    )
                })
            }
            Check::File(file) => {
                let abs = root.join(file.rel_path);
                // Follows a link, as the listing did.
                match fs::metadata(&abs) {
                    Ok(meta) if meta.is_file() && meta.len() == file.size_bytes => None,
                    Ok(meta) => Some(format!(
                        "file {} changed since it was listed ({} bytes then, {} now)",
                        abs.display(),
                        file.size_bytes,
                        meta.len()
                    )),
                    Err(err) => Some(format!("file {}: {err}", abs.display())),
                }
            }
        }
    }
}

/// The first failed check in order, or None; the checks are split among
/// up to `threads` threads when there are enough of them to pay.
fn first_failure(
    root: &Path,
    follow_outside: bool,
    checks: &[Check<'_>],
    threads: usize,
) -> Option<String> {
    const PER_THREAD_MIN: usize = 256;
    let threads = threads.clamp(1, checks.len().div_ceil(PER_THREAD_MIN).max(1));
    if threads == 1 {
        return checks.iter().find_map(|c| c.failure(root, follow_outside));
    }
    let chunk = checks.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = checks
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || part.iter().find_map(|c| c.failure(root, follow_outside)))
            })
            .collect();
        // A thread that cannot be joined panicked: a bug, carried on.
        handles.into_iter().find_map(|h| {
            h.join()
                .unwrap_or_else(|payload| std::panic::resume_unwind(payload))
        })
    })
}

/// A directory of the listing on a FUSE file system, if any (one `statfs`
/// for each device).
fn on_fuse(root: &Path, dirs: &[DirStamp]) -> Option<PathBuf> {
    let mut seen = Vec::new();
    for stamp in dirs {
        if seen.contains(&stamp.dev) {
            continue;
        }
        seen.push(stamp.dev);
        let abs = root.join(&stamp.rel_path);
        let Ok(c_path) = std::ffi::CString::new(abs.as_os_str().as_bytes()) else {
            continue;
        };
        // SAFETY: a NUL-terminated path and a zeroed statfs to fill.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statfs(c_path.as_ptr(), &mut st) } == 0
            && st.f_type as i64 == FUSE_SUPER_MAGIC
        {
            return Some(abs);
        }
    }
    None
}

/// (seconds, nanoseconds) since the epoch as a `SystemTime`.
fn time_of((secs, nanos): (i64, u32)) -> SystemTime {
    let since_epoch = Duration::new(secs.unsigned_abs(), nanos);
    if secs >= 0 {
        UNIX_EPOCH + since_epoch
    } else {
        UNIX_EPOCH.checked_sub(since_epoch).unwrap_or(UNIX_EPOCH)
    }
}
