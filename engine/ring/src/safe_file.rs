//! Files beside the ring, opened as if another user were on the machine.
//!
//! The loader often runs as root on a node it shares with other users, and
//! keeps a few files outside the ring: outcome files in world-writable
//! `/dev/shm`, cache entries and locks, pack's temporaries, tar indexes. Any of
//! those names can be planted in advance by someone else: a symlink to a root
//! file (a write would go through it), a FIFO (an open would block forever), a
//! regular file of theirs (its bytes would be believed, or a secret written
//! into a file they can read). Every open here therefore:
//! - goes through a directory fd, with `O_NOFOLLOW | O_CLOEXEC` (a link is
//!   never followed, in the last component);
//! - reads with `O_NONBLOCK` (a FIFO or device answers at once, and is then
//!   refused because it is not a regular file);
//! - creates with `O_CREAT | O_EXCL` under an unpredictable name (nothing that
//!   exists is ever reused), mode 0600, and publishes by `renameat` (which
//!   replaces a planted name itself, never what it points to);
//! - trusts what it reads only if it is a regular file owned by the current
//!   effective uid (or by root).
//!
//! Nothing here depends on `fs.protected_symlinks` or `fs.protected_regular`:
//! many hosts and containers have them off.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Why a file found beside the ring is not trusted.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// It is a symlink, FIFO, socket, device or directory.
    #[error("{path} is not a regular file (a {kind}): it was not made by ringfeed; remove it")]
    NotRegular {
        /// The path, for the message.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// It belongs to another user.
    #[error("{path} belongs to uid {uid}, not to this user (uid {euid}): not trusted; remove it (as root or its owner)")]
    NotOwned {
        /// The path, for the message.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// This process's effective uid.
        euid: u32,
    },
    /// It is larger than the caller will read.
    #[error("{path} is {len} bytes, more than the {max} expected: not read; remove it")]
    TooLarge {
        /// The path, for the message.
        path: PathBuf,
        /// Its size.
        len: u64,
        /// The caller's limit.
        max: u64,
    },
    /// The open or read failed.
    #[error("{path}: {source}")]
    Io {
        /// The path, for the message.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
}

impl TrustError {
    /// The I/O error behind it, if it is one (`NotFound` tells "absent").
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            TrustError::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }

    /// True when the file simply does not exist.
    pub fn is_not_found(&self) -> bool {
        self.io_kind() == Some(io::ErrorKind::NotFound)
    }
}

/// This process's effective uid.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// True when `uid` may own files this process trusts: itself, or root.
pub fn trusted_owner(uid: u32) -> bool {
    uid == euid() || uid == 0
}

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// A single path component: no `/`, not empty, not `.` or `..`.
pub(crate) fn component(name: &OsStr) -> io::Result<CString> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a file name"),
        ));
    }
    cstr(name)
}

pub(crate) fn kind_of(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFLNK => "symlink",
        libc::S_IFIFO => "FIFO",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        libc::S_IFDIR => "directory",
        libc::S_IFREG => "regular file",
        _ => "special file",
    }
}

/// A directory opened once, through which its files are opened by name.
#[derive(Debug)]
pub struct Dir {
    pub(crate) fd: OwnedFd,
    pub(crate) path: PathBuf,
}

impl Dir {
    /// Opens directory `path` (`O_DIRECTORY | O_NOFOLLOW` on its last
    /// component: a symlink in its place is refused).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let c = cstr(path.as_os_str())?;
        // SAFETY: `c` is a valid NUL-terminated path; open has no other preconditions.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Dir {
            // SAFETY: open returned a new descriptor that nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            path: path.to_path_buf(),
        })
    }

    /// The directory's path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory's owner and mode bits.
    pub fn owner_and_mode(&self) -> io::Result<(u32, u32)> {
        let st = fstat(&self.fd)?;
        Ok((st.st_uid, st.st_mode & 0o7777))
    }

    /// Sets the directory's mode bits (`fchmod` on its descriptor: the
    /// directory opened, whatever its path names now).
    pub fn set_mode(&self, mode: u32) -> io::Result<()> {
        // SAFETY: valid descriptor; fchmod has no memory arguments.
        if unsafe { libc::fchmod(self.fd.as_raw_fd(), mode as libc::mode_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn join(&self, name: &OsStr) -> PathBuf {
        self.path.join(name)
    }

    fn openat(&self, name: &OsStr, flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
        let c = component(name)?;
        // SAFETY: the dirfd is open for our lifetime and `c` is NUL-terminated.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                libc::c_uint::from(mode),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: openat returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Creates `name`, which must not exist (`O_EXCL`), with `mode`, for
    /// writing. A planted symlink, FIFO or file of that name is an
    /// `AlreadyExists` error; nothing is opened through it.
    pub fn create_new(&self, name: &OsStr, mode: u32) -> io::Result<File> {
        let fd = self.openat(
            name,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            mode as libc::mode_t,
        )?;
        // fchmod: the umask may have taken bits off; never adds any beyond `mode`.
        // SAFETY: fd is a valid open descriptor.
        if unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(File::from(fd))
    }

    /// Creates a new file under an unpredictable name `PREFIX.<random>.tmp`,
    /// mode `mode`; returns it with its name. Planted names cannot collide with
    /// it, and one that does (astronomically unlikely) is retried.
    pub fn create_temp(&self, prefix: &str, mode: u32) -> io::Result<(File, String)> {
        let mut last = io::Error::from(io::ErrorKind::AlreadyExists);
        for _ in 0..16 {
            let name = format!("{prefix}.{}.tmp", random_hex(12)?);
            match self.create_new(OsStr::new(&name), mode) {
                Ok(f) => return Ok((f, name)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// Renames `from` to `to` inside this directory. A symlink at `to` is
    /// replaced itself, never followed.
    pub fn rename(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        let (a, b) = (component(from)?, component(to)?);
        let d = self.fd.as_raw_fd();
        // SAFETY: valid dirfd and NUL-terminated names.
        if unsafe { libc::renameat(d, a.as_ptr(), d, b.as_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Removes the name `name` (a link is removed itself, never followed).
    pub fn remove(&self, name: &OsStr) -> io::Result<()> {
        let c = component(name)?;
        // SAFETY: valid dirfd and NUL-terminated name.
        if unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Writes `bytes` as `name` whole: a new temporary (`O_EXCL`, `mode`),
    /// written, synced when `sync`, then renamed over `name`. A reader sees
    /// the old file or the new one, and nothing planted is written through.
    pub fn write_atomic(
        &self,
        name: &OsStr,
        bytes: &[u8],
        mode: u32,
        sync: bool,
    ) -> io::Result<()> {
        let prefix = format!(".{}", name.to_string_lossy());
        let (mut file, tmp) = self.create_temp(&prefix, mode)?;
        let written = file
            .write_all(bytes)
            .and_then(|()| if sync { file.sync_all() } else { Ok(()) });
        drop(file);
        let done = written.and_then(|()| self.rename(OsStr::new(&tmp), name));
        if done.is_err() {
            let _ = self.remove(OsStr::new(&tmp));
        }
        done
    }

    /// Opens `name` for reading if it is a regular file owned by this user
    /// (or root); anything else is a [`TrustError`]. Never follows a link,
    /// never blocks on a FIFO.
    pub fn open_trusted(&self, name: &OsStr) -> Result<File, TrustError> {
        self.open_trusted_with(name, libc::O_RDONLY)
    }

    /// As [`Dir::open_trusted`], opened for reading and writing (a lock file,
    /// a usage file updated in place).
    pub fn open_trusted_rw(&self, name: &OsStr) -> Result<File, TrustError> {
        self.open_trusted_with(name, libc::O_RDWR)
    }

    fn open_trusted_with(&self, name: &OsStr, access: libc::c_int) -> Result<File, TrustError> {
        self.open_trusted_by(name, access, &trusted_owner)
    }

    /// As [`Dir::open_trusted`], with the caller's rule for who may own the
    /// file (`owner_ok(uid)`), for files whose trusted owner is not simply
    /// this user or root (a loader's outcome: see `ring::segment::trust`).
    /// `access` is `O_RDONLY` or `O_RDWR`.
    pub fn open_trusted_by(
        &self,
        name: &OsStr,
        access: libc::c_int,
        owner_ok: &dyn Fn(u32) -> bool,
    ) -> Result<File, TrustError> {
        let path = self.join(name);
        let io_err = |source: io::Error| TrustError::Io {
            path: path.clone(),
            source,
        };
        let fd = match self.openat(name, access | libc::O_NONBLOCK, 0) {
            Ok(fd) => fd,
            // ELOOP: the name is a symlink (O_NOFOLLOW).
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(TrustError::NotRegular {
                    path,
                    kind: "symlink",
                })
            }
            // ENXIO: a FIFO with no writer opened for writing, or a socket.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                return Err(TrustError::NotRegular {
                    path,
                    kind: "FIFO or socket",
                })
            }
            Err(e) => return Err(io_err(e)),
        };
        check_trusted(&fd, &path, owner_ok)?;
        clear_nonblock(&fd).map_err(io_err)?;
        Ok(File::from(fd))
    }

    /// Reads `name` whole if it is trusted and at most `max_bytes` long.
    pub fn read_trusted(&self, name: &OsStr, max_bytes: u64) -> Result<Vec<u8>, TrustError> {
        self.read_trusted_by(name, max_bytes, &trusted_owner)
    }

    /// As [`Dir::read_trusted`], with the caller's rule for who may own it.
    pub fn read_trusted_by(
        &self,
        name: &OsStr,
        max_bytes: u64,
        owner_ok: &dyn Fn(u32) -> bool,
    ) -> Result<Vec<u8>, TrustError> {
        let file = self.open_trusted_by(name, libc::O_RDONLY, owner_ok)?;
        read_bounded(file, &self.join(name), max_bytes)
    }

    /// Makes subdirectory `name` with mode `mode` if it does not exist, and
    /// opens it. An existing one must be a real directory (not a link) owned
    /// by this user (or root); its mode is left as it is, for the caller to
    /// judge with [`Dir::owner_and_mode`].
    pub fn make_dir(&self, name: &OsStr, mode: u32) -> Result<Dir, TrustError> {
        let path = self.join(name);
        let c = component(name).map_err(|source| TrustError::Io {
            path: path.clone(),
            source,
        })?;
        // SAFETY: valid dirfd and NUL-terminated name.
        let made = unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), mode as libc::mode_t) };
        if made != 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::AlreadyExists {
                return Err(TrustError::Io { path, source: e });
            }
        }
        let fd = self
            .openat(name, libc::O_RDONLY | libc::O_DIRECTORY, 0)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) | Some(libc::ENOTDIR) => TrustError::NotRegular {
                    path: path.clone(),
                    kind: "symlink or non-directory",
                },
                _ => TrustError::Io {
                    path: path.clone(),
                    source: e,
                },
            })?;
        let st = fstat(&fd).map_err(|source| TrustError::Io {
            path: path.clone(),
            source,
        })?;
        if !trusted_owner(st.st_uid) {
            return Err(TrustError::NotOwned {
                path,
                uid: st.st_uid,
                euid: euid(),
            });
        }
        if made == 0 {
            // SAFETY: valid descriptor; takes off what the umask left on.
            unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) };
        }
        Ok(Dir { fd, path })
    }
}

pub(crate) fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor and a valid out pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn check_trusted(
    fd: &OwnedFd,
    path: &Path,
    owner_ok: &dyn Fn(u32) -> bool,
) -> Result<(), TrustError> {
    let st = fstat(fd).map_err(|source| TrustError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(TrustError::NotRegular {
            path: path.to_path_buf(),
            kind: kind_of(st.st_mode),
        });
    }
    if !owner_ok(st.st_uid) {
        return Err(TrustError::NotOwned {
            path: path.to_path_buf(),
            uid: st.st_uid,
            euid: euid(),
        });
    }
    Ok(())
}

fn clear_nonblock(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: valid descriptor; F_GETFL/F_SETFL have no memory arguments.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn read_bounded(file: File, path: &Path, max_bytes: u64) -> Result<Vec<u8>, TrustError> {
    let io_err = |source: io::Error| TrustError::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = file.metadata().map_err(io_err)?.len();
    if len > max_bytes {
        return Err(TrustError::TooLarge {
            path: path.to_path_buf(),
            len,
            max: max_bytes,
        });
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // take(): the file may grow after the fstat; never read past the limit.
    file.take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(io_err)?;
    if bytes.len() as u64 > max_bytes {
        return Err(TrustError::TooLarge {
            path: path.to_path_buf(),
            len: bytes.len() as u64,
            max: max_bytes,
        });
    }
    Ok(bytes)
}

/// Splits `path` into its directory (opened) and its last component.
pub fn split(path: &Path) -> io::Result<(Dir, &OsStr)> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        )
    })?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Ok((Dir::open(parent)?, name))
}

/// [`Dir::open_trusted`] by path.
pub fn open_trusted(path: &Path) -> Result<File, TrustError> {
    let (dir, name) = split(path).map_err(|source| TrustError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    dir.open_trusted(name)
}

/// [`Dir::read_trusted`] by path.
pub fn read_trusted(path: &Path, max_bytes: u64) -> Result<Vec<u8>, TrustError> {
    let (dir, name) = split(path).map_err(|source| TrustError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    dir.read_trusted(name, max_bytes)
}

/// [`Dir::write_atomic`] by path, mode 0600, not synced.
pub fn write_private_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let (dir, name) = split(path)?;
    dir.write_atomic(name, bytes, 0o600, false)
}

/// `n` random bytes from the kernel, as 2n hex digits (for names nobody can
/// guess ahead of time).
pub fn random_hex(n: usize) -> io::Result<String> {
    let mut buf = vec![0u8; n];
    let mut filled = 0;
    while filled < n {
        // SAFETY: the pointer and length describe the unfilled tail of `buf`.
        let got = unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), n - filled, 0) };
        if got < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += got as usize;
    }
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_planted_symlink_is_neither_written_through_nor_read() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, d.path().join("out")).unwrap();
        let dir = Dir::open(d.path()).unwrap();
        let e = dir.create_new(OsStr::new("out"), 0o600).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert!(matches!(
            dir.open_trusted(OsStr::new("out")),
            Err(TrustError::NotRegular {
                kind: "symlink",
                ..
            })
        ));
        dir.write_atomic(OsStr::new("out"), b"outcome", 0o600, false)
            .unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        let meta = std::fs::symlink_metadata(d.path().join("out")).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(read_trusted(&d.path().join("out"), 64).unwrap(), b"outcome");
    }

    #[test]
    fn a_fifo_is_refused_at_once_instead_of_blocking() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: valid path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        assert!(matches!(
            open_trusted(&fifo),
            Err(TrustError::NotRegular { kind: "FIFO", .. })
        ));
        let dir = Dir::open(d.path()).unwrap();
        assert!(matches!(
            dir.open_trusted_rw(OsStr::new("fifo")),
            Err(TrustError::NotRegular { .. })
        ));
    }

    #[test]
    fn another_users_file_is_not_trusted_and_a_long_one_not_read() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("theirs");
        std::fs::write(&p, b"forged").unwrap();
        if euid() == 0 {
            std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
            assert!(matches!(
                open_trusted(&p),
                Err(TrustError::NotOwned { uid: 65534, .. })
            ));
        }
        let q = d.path().join("long");
        std::fs::write(&q, vec![0u8; 100]).unwrap();
        assert!(matches!(
            read_trusted(&q, 99),
            Err(TrustError::TooLarge { len: 100, .. })
        ));
        assert!(read_trusted(&d.path().join("absent"), 10)
            .unwrap_err()
            .is_not_found());
    }

    #[test]
    fn temporary_names_are_unpredictable_and_private() {
        let d = tempfile::tempdir().unwrap();
        let dir = Dir::open(d.path()).unwrap();
        let (_, a) = dir.create_temp(".x", 0o600).unwrap();
        let (_, b) = dir.create_temp(".x", 0o600).unwrap();
        assert_ne!(a, b);
        assert!(a.len() > ".x..tmp".len() + 20);
        let m = std::fs::metadata(d.path().join(&a)).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        let sub = dir.make_dir(OsStr::new("sub"), 0o700).unwrap();
        assert_eq!(sub.owner_and_mode().unwrap().1, 0o700);
        std::os::unix::fs::symlink("/", d.path().join("link")).unwrap();
        assert!(dir.make_dir(OsStr::new("link"), 0o700).is_err());
        assert!(dir.create_new(OsStr::new("../escape"), 0o600).is_err());
    }
}
