//! The room /dev/shm has for a new ring: its free bytes less what other
//! live loaders' rings will still allocate, and the lock on /dev/shm under
//! which a loader checks that room and sizes its ring.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use super::locks::{byte_is_locked, ofd_locks_at_byte_zero, FileId, LOADER_LOCK_BYTE};
use super::{shm_open, SEGMENT_PREFIX, SHM_DIR};

/// Free bytes in the filesystem holding `fd`; None when unknown or unlimited
/// (a tmpfs mounted with `size=0` reports no blocks at all).
pub fn free_bytes(fd: &OwnedFd) -> Option<u64> {
    room_of(fd).map(|room| room.free_bytes)
}

/// The room of the filesystem holding `fd`, counting no other ring.
pub fn room_of(fd: &OwnedFd) -> Option<Room> {
    // SAFETY: `fd` is open and `sv` is a valid out-pointer.
    let (size_bytes, free_bytes) = space_of(|sv| unsafe { libc::fstatvfs(fd.as_raw_fd(), sv) })?;
    Some(Room {
        size_bytes,
        free_bytes,
        promised: Vec::new(),
    })
}

/// The room /dev/shm has for a new ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Room {
    /// Size of the file system.
    pub size_bytes: u64,
    /// Free bytes of the file system.
    pub free_bytes: u64,
    /// Other live loaders' rings that will still take part of them.
    pub promised: Vec<Promised>,
}

impl Room {
    /// Bytes the other rings will still take.
    pub fn promised_bytes(&self) -> u64 {
        self.promised
            .iter()
            .fold(0u64, |sum, p| sum.saturating_add(p.bytes))
    }

    /// Bytes a new ring may take: free less promised.
    pub fn left(&self) -> u64 {
        self.free_bytes.saturating_sub(self.promised_bytes())
    }
}

/// Room in /dev/shm for the ring `/ringfeed-NAME`: its free bytes and what
/// other loaders' rings will still allocate of them
/// ([`promised_to_other_rings`]); None when unknown or unlimited.
pub fn shm_room_for(name: &str) -> Option<Room> {
    let dir = CString::new(SHM_DIR).ok()?;
    // The holes first: other rings only fill them, so reading the free bytes
    // after can only make the room smaller, never larger, than the truth.
    let promised = promised_to_other_rings(name);
    // SAFETY: `dir` is NUL-terminated and `sv` a valid out-pointer.
    let (size_bytes, free_bytes) = space_of(|sv| unsafe { libc::statvfs(dir.as_ptr(), sv) })?;
    Some(Room {
        size_bytes,
        free_bytes,
        promised,
    })
}

/// (size, free bytes) from a statvfs call; None when it failed or reports
/// no blocks.
fn space_of(stat: impl FnOnce(&mut libc::statvfs) -> libc::c_int) -> Option<(u64, u64)> {
    // SAFETY: statvfs is plain old data.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    if stat(&mut sv) != 0 || sv.f_blocks == 0 {
        return None;
    }
    let frsize = sv.f_frsize as u64;
    Some((sv.f_blocks as u64 * frsize, sv.f_bavail as u64 * frsize))
}

/// Another live loader's ring that is not wholly allocated yet: the bytes
/// it will still take from /dev/shm as its slots are first claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Promised {
    /// The segment's path.
    pub path: PathBuf,
    /// Its size less the bytes already allocated.
    pub bytes: u64,
}

/// The rings in /dev/shm, other than `/ringfeed-EXCEPT`, whose loader may
/// still allocate part of them. A ring is sized whole at create and its
/// payloads allocated slot by slot, so /dev/shm's free bytes overstate the
/// room a new ring has by what these rings still hold as holes. A segment
/// whose loader is dead never grows and is left out; so is one removed
/// while this looks. Another user's ring (mode 0600) is judged by
/// /proc/locks, and counted when that cannot be read.
pub fn promised_to_other_rings(except: &str) -> Vec<Promised> {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(SHM_DIR) else {
        return Vec::new();
    };
    let mut others_locks: Option<Option<std::collections::HashSet<FileId>>> = None;
    let mut promised = Vec::new();
    for entry in entries.filter_map(Result::ok) {
        let file_name = entry.file_name();
        let Some(name) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(SEGMENT_PREFIX))
        else {
            continue;
        };
        if name == except {
            continue;
        }
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        let bytes = meta.len().saturating_sub(meta.blocks().saturating_mul(512));
        if bytes == 0 || !meta.is_file() {
            continue;
        }
        let alive = match shm_open(name, libc::O_RDONLY, 0) {
            Ok(fd) => byte_is_locked(&fd, LOADER_LOCK_BYTE).unwrap_or(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(_) => {
                let id = FileId {
                    major: libc::major(meta.dev()),
                    minor: libc::minor(meta.dev()),
                    inode: meta.ino(),
                };
                match others_locks.get_or_insert_with(|| {
                    std::fs::read_to_string("/proc/locks")
                        .ok()
                        .map(|t| ofd_locks_at_byte_zero(&t))
                }) {
                    Some(locked) => locked.contains(&id),
                    None => true,
                }
            }
        };
        if alive {
            promised.push(Promised {
                path: entry.path(),
                bytes,
            });
        }
    }
    promised.sort_by(|a, b| a.path.cmp(&b.path));
    promised
}

/// An exclusive `flock` on the /dev/shm directory. A loader holds it from
/// before its shm_open to the ftruncate that sizes its ring, so that of two
/// loaders starting at once the second sees the first's ring (see
/// [`promised_to_other_rings`]) and both never pass a check only one fits,
/// and so that no other loader, nor `ringfeed gc`, sees its segment before
/// it is locked (it would look dead). Dropping it unlocks.
pub struct ShmDirLock {
    _dir: File,
}

impl ShmDirLock {
    /// Longest wait for the lock (it is held for microseconds).
    const PATIENCE: Duration = Duration::from_secs(2);

    /// Takes the lock, waiting at most `PATIENCE`. None when /dev/shm cannot
    /// be opened or a holder keeps it longer (a stopped process): the caller
    /// then goes on unlocked, as it would where the lock did not exist.
    pub fn take() -> Option<ShmDirLock> {
        let patience = Self::PATIENCE;
        let dir = File::open(SHM_DIR).ok()?;
        let deadline = std::time::Instant::now() + patience;
        loop {
            // SAFETY: `dir` is an open descriptor; flock touches only its lock.
            if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Some(ShmDirLock { _dir: dir });
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                tracing::debug!("going on without the lock on {SHM_DIR}: {err}");
                return None;
            }
            if std::time::Instant::now() >= deadline {
                tracing::warn!(
                    "another process has held the lock on {SHM_DIR} for {patience:?}; going on without it \
                     (a loader starting at this moment may be missed)"
                );
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}
