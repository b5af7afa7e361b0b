//! A directory of ringfeed's cache (`CACHE_DIR/data`, `CACHE_DIR/tar-index`,
//! `CACHE_DIR/manifests`),
//! opened only if no other user can have put anything in it: the cache
//! directory is ours (or root's) and not writable by others unless sticky,
//! and the subdirectory itself is ours, not a link, and made 0700 (an older,
//! 0755 one tightened). Below the cache, the tar index and the source
//! floors can all use it.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;

use crate::ring::safe_file::{self, Dir, TrustError};

/// Mode of the cache's directories.
pub const DIR_MODE: u32 = 0o700;

/// A file or directory of the cache that is not ours, as an I/O error.
pub(crate) fn untrusted(e: TrustError) -> io::Error {
    match e {
        TrustError::Io { source, .. } => source,
        other => io::Error::new(io::ErrorKind::PermissionDenied, other.to_string()),
    }
}

/// Opens the directory `root` (`<cache dir>/NAME`), making it (0700) and its
/// parent if missing; refuses a cache directory another user owns or may
/// write to (unless it is sticky), and a `root` that is a link or another
/// user's.
pub fn open_private_dir(root: &Path) -> io::Result<Dir> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(cache_dir_of(root))?;
    let (base, name) = checked_cache_dir(root)?;
    let dir = base.make_dir(name, DIR_MODE).map_err(untrusted)?;
    let (owner, mode) = dir.owner_and_mode()?;
    if owner == safe_file::euid() && mode & 0o077 != 0 {
        // Made by an older version (0755): its entries were readable by
        // every user.
        dir.set_mode(DIR_MODE)?;
    }
    Ok(dir)
}

/// Opens the directory `root` (`<cache dir>/NAME`) under the rule of
/// [`open_private_dir`], making nothing (for `ringfeed gc`, which cleans
/// it): `Ok(None)` when it or the cache directory does not exist.
pub fn open_existing_private_dir(root: &Path) -> io::Result<Option<Dir>> {
    let absent = |e: &io::Error| e.kind() == io::ErrorKind::NotFound;
    let (base, name) = match checked_cache_dir(root) {
        Ok(found) => found,
        Err(e) if absent(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    match base.open_dir(name) {
        Ok(dir) => Ok(Some(dir)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(untrusted(e)),
    }
}

/// The cache directory `root` is in.
fn cache_dir_of(root: &Path) -> &Path {
    match root.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// The cache directory of `root` (opened, once judged: ours or root's, and
/// not writable by others unless sticky) and `root`'s name in it.
fn checked_cache_dir(root: &Path) -> io::Result<(Dir, &std::ffi::OsStr)> {
    // The cache directory may be a link the user made (to a bigger disk):
    // followed, and then judged.
    let base = fs::canonicalize(cache_dir_of(root))?;
    let meta = fs::metadata(&base)?;
    let mode = meta.mode() & 0o7777;
    if !safe_file::trusted_owner(meta.uid()) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the cache directory {} belongs to uid {}, not to this user (uid {}): its files are not trusted; pass a --cache-dir of your own",
                base.display(),
                meta.uid(),
                safe_file::euid()
            ),
        ));
    }
    if mode & 0o002 != 0 && mode & 0o1000 == 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the cache directory {} is writable by every user and not sticky (mode {mode:04o}): anyone could replace its entries; pass a --cache-dir of your own",
                base.display()
            ),
        ));
    }
    let Some(name) = root.file_name() else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} names no directory inside the cache directory; pass a --cache-dir that is a plain path",
                root.display()
            ),
        ));
    };
    Ok((Dir::open(&base)?, name))
}
