//! The POSIX shared-memory object behind a ring, and the kernel locks that
//! tell who is alive.
//!
//! Liveness follows iceoryx2: a token the kernel drops when a process dies.
//! Here the tokens are open-file-description (OFD) byte locks on the segment's
//! own file: the loader holds byte 0 for as long as it runs; the consumer of
//! rank r holds byte 1 + r. A dead process's locks vanish with its file
//! descriptions, so "is the loader alive" is one `fcntl(F_OFD_GETLK)`. Pids
//! stored in the segment are for error messages only.
//!
//! - `locks`: those liveness locks, and reading them from /proc/locks.
//! - `room`: the room /dev/shm has for a new ring, and the lock on /dev/shm
//!   that makes the check and the sizing one step.
//! - `watch`: waking when a segment appears in /dev/shm.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use memmap2::{MmapOptions, MmapRaw};

mod locks;
mod room;
pub mod trust;
mod watch;

pub use locks::{byte_is_locked, rank_lock_byte, try_lock_byte, unlock_byte, LOADER_LOCK_BYTE};
pub use room::{
    free_bytes, promised_to_other_rings, room_of, shm_room_for, Promised, Room, ShmDirLock,
};
pub use watch::ShmWatch;

/// Longest loader name.
pub const NAME_MAX_BYTES: usize = 64;
/// Prefix of every segment in /dev/shm.
pub const SEGMENT_PREFIX: &str = "ringfeed-";
/// Where POSIX shared memory lives on Linux.
pub const SHM_DIR: &str = "/dev/shm";

/// A loader name that is not 1–64 of `A-Za-z0-9._-`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid loader name {name:?}: use 1 to {NAME_MAX_BYTES} characters from A-Z a-z 0-9 . _ - (not starting with '.')")]
pub struct NameError {
    /// The refused name.
    pub name: String,
}

/// Checks a loader name.
pub fn validate_name(name: &str) -> Result<(), NameError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    let ok = !name.is_empty()
        && name.len() <= NAME_MAX_BYTES
        && name.chars().all(ok_char)
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(NameError {
            name: name.to_string(),
        })
    }
}

/// `/ringfeed-NAME`, the name given to shm_open.
pub fn shm_name(name: &str) -> CString {
    // A validated name has no NUL byte; an unvalidated one is rejected by the
    // callers before this point, so the fallback is unreachable in practice.
    CString::new(format!("/{SEGMENT_PREFIX}{name}")).unwrap_or_default()
}

/// `/dev/shm/ringfeed-NAME`, for messages and listing.
pub fn shm_path(name: &str) -> PathBuf {
    PathBuf::from(format!("{SHM_DIR}/{SEGMENT_PREFIX}{name}"))
}

/// Opens `/ringfeed-NAME` with the given flags.
pub fn shm_open(name: &str, oflag: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
    let cname = shm_name(name);
    // SAFETY: `cname` is a valid NUL-terminated string.
    let fd = unsafe { libc::shm_open(cname.as_ptr(), oflag | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: shm_open returned a fresh descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A new segment with no name yet: an unnamed file in /dev/shm (`O_TMPFILE`,
/// mode 0600), open for reading and writing. Nobody can open it until
/// [`publish`] gives it its name, so a loader locks and sizes it first: a
/// segment under a ring's name is never one still being made, and an empty
/// or unlocked one there was left by a loader that died.
pub fn create_unnamed() -> io::Result<OwnedFd> {
    let dir = CString::new(SHM_DIR).unwrap_or_default();
    // SAFETY: `dir` is a valid NUL-terminated string.
    let fd = unsafe {
        libc::open(
            dir.as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open returned a fresh descriptor that nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // The umask cannot add bits; fchmod makes it 0600 whatever it was.
    // SAFETY: `fd` is open.
    if unsafe { libc::fchmod(fd.as_raw_fd(), 0o600) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Gives the unnamed segment `fd` ([`create_unnamed`]) the name
/// `/dev/shm/ringfeed-NAME`, unless that name exists (`AlreadyExists`:
/// nothing there is replaced).
pub fn publish(fd: &OwnedFd, name: &str) -> io::Result<()> {
    let target = CString::new(shm_path(name).into_os_string().into_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; /proc/self/fd/N, followed,
    // names the same file for anyone.
    // SAFETY: `fd` is open; the paths are NUL-terminated.
    let rc = unsafe {
        libc::linkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let first = io::Error::last_os_error();
    if !matches!(first.raw_os_error(), Some(libc::ENOENT | libc::EPERM)) {
        return Err(first);
    }
    let proc_path = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: both paths are NUL-terminated.
    let rc = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            proc_path.as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Removes `/ringfeed-NAME`.
pub fn shm_unlink(name: &str) -> io::Result<()> {
    let cname = shm_name(name);
    // SAFETY: `cname` is a valid NUL-terminated string.
    if unsafe { libc::shm_unlink(cname.as_ptr()) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Size of the open file.
pub fn file_size(fd: &OwnedFd) -> io::Result<u64> {
    Ok(fstat(fd)?.st_size as u64)
}

/// True when `/dev/shm/ringfeed-NAME` is a directory: shm_open of one fails
/// with EINVAL or EISDIR, which alone would not say so.
pub fn is_a_directory(name: &str) -> bool {
    std::fs::symlink_metadata(shm_path(name)).is_ok_and(|m| m.is_dir())
}

/// What the object open on `fd` is, unless it is a regular file (or cannot
/// be told).
pub fn not_regular(fd: &OwnedFd) -> Option<&'static str> {
    not_regular_mode(fstat(fd).ok()?.st_mode)
}

/// Why the object open on `fd` is not a ringfeed segment, if it cannot be
/// one: not a regular file (a FIFO, a directory), or a file whose first 8
/// bytes are neither ringfeed's magic nor zeros. Zeros and an empty file may
/// be a loader's segment before its header (one in creation, or one that
/// died there), so they pass. Such a foreign object under a ringfeed name is
/// never removed: something else made it, and may still use it.
pub fn not_a_segment(fd: &OwnedFd) -> Option<String> {
    let st = fstat(fd).ok()?;
    if let Some(kind) = not_regular_mode(st.st_mode) {
        return Some(kind.into());
    }
    let mut magic = [0u8; 8];
    // SAFETY: `fd` is open; `magic` is 8 writable bytes.
    let n = unsafe { libc::pread(fd.as_raw_fd(), magic.as_mut_ptr().cast(), magic.len(), 0) };
    if n != 8 {
        return None; // shorter than a magic: a segment being sized, or empty
    }
    let found = u64::from_le_bytes(magic);
    (found != 0 && found != crate::layout::MAGIC).then(|| format!("a file of {} bytes that ringfeed did not write (its first bytes are not a ringfeed header)", st.st_size))
}

/// `fstat` of `fd`, without a second descriptor: with the descriptor table
/// full (EMFILE, the very failure a stopping loader may be reporting), a
/// `dup` for `File::metadata` would fail, and the segment's name be left.
fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain old data; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `st` a valid out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Device and inode of the file open as `fd`.
pub fn file_id(fd: &OwnedFd) -> io::Result<(u64, u64)> {
    let st = fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// True if `path` names the file open as `fd` (same device and inode).
pub fn same_file(fd: &OwnedFd, path: &Path) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let named = std::fs::metadata(path)?;
    Ok((named.dev(), named.ino()) == file_id(fd)?)
}

/// Sets the file's size (its bytes are holes until allocated).
pub fn set_len(fd: &OwnedFd, bytes: u64) -> io::Result<()> {
    let len =
        libc::off_t::try_from(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: `fd` is open; ftruncate touches only the file.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Allocates `len` bytes of the file at `offset` now, so that a full /dev/shm
/// is an error here and never a SIGBUS when the range is written later.
/// Allocating a range twice is harmless.
pub fn allocate(fd: &OwnedFd, offset: u64, len: u64) -> io::Result<()> {
    let (Ok(off), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    };
    loop {
        // SAFETY: `fd` is open; posix_fallocate touches only the file.
        let rc = unsafe { libc::posix_fallocate(fd.as_raw_fd(), off, len) };
        match rc {
            0 => return Ok(()),
            // tmpfs stops a fallocate when a signal arrives (SIGINT/SIGTERM
            // have no SA_RESTART): go on; the stop flag decides.
            libc::EINTR => continue,
            _ => return Err(io::Error::from_raw_os_error(rc)),
        }
    }
}

/// Maps `len` bytes of `fd`, shared, read-write.
pub fn map(fd: &OwnedFd, len: u64) -> io::Result<MmapRaw> {
    let len = usize::try_from(len).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "segment larger than the address space",
        )
    })?;
    // Borrow the descriptor as a File without taking ownership of it.
    let dup = fd.try_clone()?;
    let file = File::from(dup);
    MmapOptions::new().len(len).map_raw(&file)
}

/// Maps `len` bytes of the file behind `fd` through a new open file
/// description of it (reopened through /proc/self/fd), so that the mapping
/// holds no reference to `fd`'s description. An OFD lock taken on `fd` then
/// lasts only while a descriptor of it is open: a forked child that closes
/// its copy of `fd` but keeps the mapping (and the views into it) does not
/// keep the lock. Without /proc, maps through `fd` itself.
pub fn map_apart(fd: &OwnedFd, len: u64) -> io::Result<MmapRaw> {
    let reopened = File::options()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(OwnedFd::from);
    map(reopened.as_ref().unwrap_or(fd), len)
}

/// Bytes formatted for people: 1.5 GiB.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// What a file of mode `mode` is, in words, unless it is a regular file.
pub fn not_regular_mode(mode: libc::mode_t) -> Option<&'static str> {
    match mode & libc::S_IFMT {
        libc::S_IFREG => None,
        libc::S_IFDIR => Some("a directory"),
        libc::S_IFIFO => Some("a FIFO"),
        libc::S_IFCHR => Some("a character device"),
        libc::S_IFBLK => Some("a block device"),
        libc::S_IFSOCK => Some("a socket"),
        _ => Some("not a regular file"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_outside_the_allowed_alphabet_are_refused() {
        for ok in ["job1", "a", "A.b_c-9", &"x".repeat(64)] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a/b",
            "..",
            ".hidden",
            "sp ace",
            "é",
            &"x".repeat(65),
            "a\0b",
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }
}
