//! The POSIX shared-memory object behind a ring, and the kernel locks that
//! tell who is alive.
//!
//! Liveness follows iceoryx2: a token the kernel drops when a process dies.
//! Here the tokens are open-file-description (OFD) byte locks on the segment's
//! own file: the loader holds byte 0 for as long as it runs; the consumer of
//! rank r holds byte 1 + r. A dead process's locks vanish with its file
//! descriptions, so "is the loader alive" is one `fcntl(F_OFD_GETLK)`. Pids
//! stored in the segment are for error messages only.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use memmap2::{MmapOptions, MmapRaw};

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

/// A file as /proc/locks names it: device major and minor, inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FileId {
    major: u32,
    minor: u32,
    inode: u64,
}

/// The files of /proc/locks text (`ID: OFDLCK ADVISORY WRITE -1
/// MAJ:MIN:INODE START END`, major and minor in hex) on which an OFD lock
/// starts at byte 0, a loader's liveness token. Waiters (`ID: -> ...`) hold
/// nothing and are left out.
fn ofd_locks_at_byte_zero(text: &str) -> std::collections::HashSet<FileId> {
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

/// How long an empty segment with no loader lock is presumed to be in
/// creation: a loader between its `shm_open` and its lock.
const CREATION_GRACE: Duration = Duration::from_secs(5);

/// True for an empty segment younger than `CREATION_GRACE`: a loader may be
/// about to lock it, so it must not be taken for a dead loader's.
pub fn is_fresh_and_empty(fd: &OwnedFd) -> bool {
    let Ok(st) = fstat(fd) else {
        return false;
    };
    let modified = std::time::UNIX_EPOCH
        + Duration::new(
            st.st_mtime.max(0) as u64,
            st.st_mtime_nsec.clamp(0, 999_999_999) as u32,
        );
    let age = modified.elapsed().ok();
    st.st_size == 0 && age.is_some_and(|a| a < CREATION_GRACE)
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
