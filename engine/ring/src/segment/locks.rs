//! The liveness locks: OFD byte locks on the segment's own file, which the
//! kernel drops with a dead process's file descriptions; and the same locks
//! as /proc/locks lists them, for a segment this process cannot open.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// Byte of the segment file whose lock is the loader's liveness token.
pub const LOADER_LOCK_BYTE: i64 = 0;

/// Byte whose lock marks rank `rank`'s consumer as attached.
pub fn rank_lock_byte(rank: u32) -> i64 {
    1 + i64::from(rank)
}

fn flock_of(byte: i64, kind: libc::c_short) -> libc::flock {
    // SAFETY: flock is plain old data; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = byte;
    fl.l_len = 1;
    fl
}

/// Takes an exclusive OFD lock on one byte without waiting. Ok(false) if
/// another open file description holds it.
pub fn try_lock_byte(fd: &OwnedFd, byte: i64) -> io::Result<bool> {
    let fl = flock_of(byte, libc::F_WRLCK as libc::c_short);
    // SAFETY: `fd` is open and `fl` is a valid flock for the duration of the call.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(err),
    }
}

/// Drops an OFD lock taken through `fd`.
pub fn unlock_byte(fd: &OwnedFd, byte: i64) -> io::Result<()> {
    let fl = flock_of(byte, libc::F_UNLCK as libc::c_short);
    // SAFETY: as in `try_lock_byte`.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// True if some other open file description holds a lock on `byte`.
pub fn byte_is_locked(fd: &OwnedFd, byte: i64) -> io::Result<bool> {
    let mut fl = flock_of(byte, libc::F_WRLCK as libc::c_short);
    // SAFETY: `fd` is open; F_OFD_GETLK writes only into `fl`.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// A file as /proc/locks names it: device major and minor, inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct FileId {
    pub(super) major: u32,
    pub(super) minor: u32,
    pub(super) inode: u64,
}

/// The files of /proc/locks text (`ID: OFDLCK ADVISORY WRITE -1
/// MAJ:MIN:INODE START END`, major and minor in hex) on which an OFD lock
/// starts at byte 0, a loader's liveness token. Waiters (`ID: -> ...`) hold
/// nothing and are left out.
pub(super) fn ofd_locks_at_byte_zero(text: &str) -> std::collections::HashSet<FileId> {
    let parse = |line: &str| -> Option<FileId> {
        let mut fields = line.split_whitespace().skip(1);
        if fields.next()? != "OFDLCK" {
            return None;
        }
        let file = fields.nth(3)?;
        if fields.next()? != "0" {
            return None;
        }
        let mut parts = file.split(':');
        let major = u32::from_str_radix(parts.next()?, 16).ok()?;
        let minor = u32::from_str_radix(parts.next()?, 16).ok()?;
        let inode = parts.next()?.parse().ok()?;
        Some(FileId {
            major,
            minor,
            inode,
        })
    };
    text.lines().filter_map(parse).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::{shm_open, shm_path, shm_unlink};

    #[test]
    fn proc_locks_names_the_files_whose_byte_zero_is_held_under_an_ofd_lock() {
        let text = "1: OFDLCK ADVISORY  WRITE -1 00:1a:4242 0 0\n\
                    2: OFDLCK ADVISORY  WRITE -1 00:1a:4243 1 1\n\
                    3: POSIX  ADVISORY  WRITE 77 00:1a:4244 0 0\n\
                    3: -> OFDLCK ADVISORY  WRITE -1 00:1a:4245 0 0\n\
                    4: OFDLCK ADVISORY  READ -1 fe:10:99 0 EOF\n\
                    garbage\n";
        let ids = ofd_locks_at_byte_zero(text);
        let want: std::collections::HashSet<FileId> = [
            FileId {
                major: 0,
                minor: 0x1a,
                inode: 4242,
            },
            FileId {
                major: 0xfe,
                minor: 0x10,
                inode: 99,
            },
        ]
        .into_iter()
        .collect();
        assert_eq!(ids, want);

        // The kernel's own text, for a segment whose byte 0 this process locks.
        use std::os::unix::fs::MetadataExt;
        let name = format!("proc-locks-{}", std::process::id());
        let fd = shm_open(&name, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o600).unwrap();
        let meta = std::fs::metadata(shm_path(&name)).unwrap();
        let id = FileId {
            major: libc::major(meta.dev()),
            minor: libc::minor(meta.dev()),
            inode: meta.ino(),
        };
        let locked = || {
            ofd_locks_at_byte_zero(&std::fs::read_to_string("/proc/locks").unwrap()).contains(&id)
        };
        assert!(try_lock_byte(&fd, rank_lock_byte(0)).unwrap());
        assert!(!locked(), "a rank's lock is not the loader's");
        assert!(try_lock_byte(&fd, LOADER_LOCK_BYTE).unwrap());
        assert!(locked());
        shm_unlink(&name).unwrap();
    }
}
