//! Bytes used by the data cache, shared by every loader on the machine.
//!
//! `<data dir>/usage` holds the bytes of every entry and of every entry
//! being written (its reservation), as decimal text. Every change happens
//! under an exclusive `flock` of `<data dir>/lock`, held for a few system
//! calls: a writer reserves an entry's bytes and creates its temporary file
//! in one locked step (refused when the total would pass the writer's
//! limit), and publishes (link, unlink) in another; a publish that finds the
//! entry already there (another loader wrote it first) releases the
//! reservation, so an entry is never counted twice.
//!
//! A loader killed while writing leaves its temporary file, and its
//! reservation in the file. So at start [`Usage::rescan`] derives the total
//! again under the lock: the sizes entry names state, plus the reservations
//! of temporary files whose writer still holds their `flock` (the kernel
//! drops it when the writer dies); a temporary file whose lock can be taken
//! was left by a dead writer and is removed.
//!
//! The cache may sit where other users can write (`--cache-dir` on a shared
//! disk): its directory must belong to this user (or root) and be writable
//! by nobody else unless sticky; `data/` and everything below it is this
//! user's, directories 0700 and files 0600 (a looser `data/` left by an
//! older version is tightened). `lock`, `usage` and temporary files are
//! opened through a directory descriptor, never through a link, never
//! blocking on a FIFO, and only if they are regular files of this user.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::entry::file_bytes_of_name;
use crate::ring::safe_file::Dir;
use crate::source::private_dir::untrusted;

/// Mode of the cache's directories.
pub const DIR_MODE: u32 = crate::source::private_dir::DIR_MODE;
/// Mode of the cache's files.
pub const FILE_MODE: u32 = 0o600;

/// Bytes of the usage file: a right-aligned decimal u64 and a newline.
const USAGE_FILE_BYTES: usize = 21;

/// Prefix of a temporary entry file: `.tmp.<reserved bytes>.<pid>.<seq>`.
pub const TMP_PREFIX: &str = ".tmp.";

/// The shared usage counter of one data directory.
#[derive(Debug)]
pub struct Usage {
    root: PathBuf,
    /// `root`, opened.
    dir: Dir,
    lock: File,
    usage: File,
}

/// What [`Usage::rescan`] found.
#[derive(Debug, Default, Clone, Copy)]
pub struct Scan {
    /// Bytes of entries and live reservations.
    pub used_bytes: u64,
    /// Entries found.
    pub entries: u64,
    /// Temporary files of dead writers removed.
    pub stale_tmps_removed: u64,
}

/// Takes `flock(op)` on `file`; false when `LOCK_NB` was asked and it is held.
pub fn flock(file: &File, op: libc::c_int) -> io::Result<bool> {
    loop {
        // SAFETY: a valid descriptor owned by `file`; flock has no memory arguments.
        let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
        if rc == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => return Ok(false),
            _ => return Err(e),
        }
    }
}

/// Unlocks `file` when dropped.
struct Held<'a>(&'a File);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // Closing the file would drop it too; an unlock error leaves it to that.
        let _ = flock(self.0, libc::LOCK_UN);
    }
}

/// Opens the data directory `root` (`<cache dir>/data`), making it (0700)
/// and its parent if missing; refuses a cache directory another user owns
/// or may write to (unless it is sticky), and a `data/` that is a link or
/// another user's (`source::private_dir`).
pub fn open_data_dir(root: &Path) -> io::Result<Dir> {
    crate::source::private_dir::open_private_dir(root)
}

/// Opens `name` in `dir` for reading and writing if it is a regular file of
/// ours, creating it (0600) if it does not exist.
pub fn open_or_create(dir: &Dir, name: &str) -> io::Result<File> {
    let name = OsStr::new(name);
    for _ in 0..2 {
        match dir.open_trusted_rw(name) {
            Ok(f) => return Ok(f),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(untrusted(e)),
        }
        match dir.create_new(name, FILE_MODE) {
            Ok(_) => {}
            // Another loader made it meanwhile: open theirs.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    dir.open_trusted_rw(name).map_err(untrusted)
}

impl Usage {
    /// Opens (creating) the counter of the data directory `root` (see the
    /// module docs for what is refused).
    pub fn open(root: &Path) -> io::Result<Usage> {
        let dir = open_data_dir(root)?;
        Ok(Usage {
            root: root.to_path_buf(),
            lock: open_or_create(&dir, "lock")?,
            usage: open_or_create(&dir, "usage")?,
            dir,
        })
    }

    /// The data directory, opened.
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// The data directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Runs `f` on the used bytes under the lock, storing what it leaves.
    pub fn locked<T>(&self, f: impl FnOnce(&mut u64) -> io::Result<T>) -> io::Result<T> {
        flock(&self.lock, libc::LOCK_EX)?;
        let _held = Held(&self.lock);
        let before = self.read()?;
        let mut used = before;
        let out = f(&mut used)?;
        if used != before {
            self.write(used)?;
        }
        Ok(out)
    }

    /// The used bytes now.
    pub fn used_bytes(&self) -> io::Result<u64> {
        self.locked(|used| Ok(*used))
    }

    fn read(&self) -> io::Result<u64> {
        let mut buf = [0u8; USAGE_FILE_BYTES];
        let mut got = 0;
        while got < buf.len() {
            match self.usage.read_at(&mut buf[got..], got as u64)? {
                0 => break,
                n => got += n,
            }
        }
        // An empty or unreadable counter is rebuilt by the next rescan.
        let text = std::str::from_utf8(&buf[..got]).unwrap_or("");
        Ok(text.trim().parse().unwrap_or(0))
    }

    /// One `pwrite` of a fixed-width line: the writer takes the lock twice
    /// per entry, so this is on its path.
    fn write(&self, used: u64) -> io::Result<()> {
        let text = format!("{used:>20}\n");
        debug_assert_eq!(text.len(), USAGE_FILE_BYTES);
        self.usage.write_all_at(text.as_bytes(), 0)
    }

    /// Derives the used bytes again from the directory (see the module
    /// docs), removing temporary files of dead writers, under the lock.
    pub fn rescan(&self) -> io::Result<Scan> {
        self.locked(|used| {
            let mut scan = Scan::default();
            for dataset in read_dir_or_empty(&self.root)? {
                let dataset = dataset?;
                if dataset.file_type()?.is_dir() {
                    scan_dataset(&self.dir, &dataset.file_name(), &mut scan)?;
                }
            }
            *used = scan.used_bytes;
            Ok(scan)
        })
    }
}

fn read_dir_or_empty(dir: &Path) -> io::Result<Box<dyn Iterator<Item = io::Result<fs::DirEntry>>>> {
    match fs::read_dir(dir) {
        Ok(it) => Ok(Box::new(it)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Box::new(std::iter::empty())),
        Err(e) => Err(e),
    }
}

/// The reservation a temporary file's name states.
pub fn tmp_reserved_bytes(name: &str) -> Option<u64> {
    name.strip_prefix(TMP_PREFIX)?
        .split('.')
        .next()?
        .parse()
        .ok()
}

fn scan_dataset(data: &Dir, name: &OsStr, scan: &mut Scan) -> io::Result<()> {
    let dir = match data.make_dir(name, DIR_MODE) {
        Ok(dir) => dir,
        Err(e) => {
            tracing::warn!(
                "data cache: skipping {}: {e}",
                data.path().join(name).display()
            );
            return Ok(());
        }
    };
    for item in read_dir_or_empty(dir.path())? {
        let item = item?;
        let file_name = item.file_name();
        let name = file_name.to_string_lossy();
        if let Some(reserved) = tmp_reserved_bytes(&name) {
            // Never blocks (a FIFO), never follows a link.
            let file = match dir.open_trusted(&file_name) {
                Ok(file) => file,
                Err(e) if e.is_not_found() => continue, // published or removed meanwhile
                Err(e) => {
                    tracing::warn!("data cache: ignoring {e}");
                    continue;
                }
            };
            if flock(&file, libc::LOCK_EX | libc::LOCK_NB)? {
                // Its writer died: nobody holds the lock it held while writing.
                dir.remove(&file_name)?;
                scan.stale_tmps_removed += 1;
            } else {
                scan.used_bytes = scan.used_bytes.saturating_add(reserved);
            }
        } else if item.file_type()?.is_dir() {
            for entry in read_dir_or_empty(&item.path())? {
                let entry = entry?;
                if let Some(bytes) = file_bytes_of_name(&entry.file_name().to_string_lossy()) {
                    scan.used_bytes = scan.used_bytes.saturating_add(bytes);
                    scan.entries += 1;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rescan_counts_entries_and_live_tmps_and_removes_dead_ones() {
        let dir = tempfile::tempdir().unwrap();
        let usage = Usage::open(dir.path()).unwrap();
        let ds = dir.path().join("0123456789abcdef");
        fs::create_dir_all(ds.join("ab")).unwrap();
        fs::write(ds.join("ab/ab00000000000000-164"), vec![0; 164]).unwrap();
        fs::write(ds.join("source"), b"s3://b/p/").unwrap();
        // A live writer holds its tmp's lock; a dead one's lock is free.
        let live = ds.join(".tmp.1000.1.1");
        let live_file = File::create(&live).unwrap();
        assert!(flock(&live_file, libc::LOCK_EX).unwrap());
        let dead = ds.join(".tmp.500.2.1");
        File::create(&dead).unwrap();
        usage
            .locked(|u| {
                *u = 99_999;
                Ok(())
            })
            .unwrap();
        let scan = usage.rescan().unwrap();
        assert_eq!(scan.used_bytes, 164 + 1000);
        assert_eq!(scan.entries, 1);
        assert_eq!(scan.stale_tmps_removed, 1);
        assert!(live.exists() && !dead.exists());
        assert_eq!(usage.used_bytes().unwrap(), 1164);
    }

    #[test]
    fn two_handles_on_one_directory_see_each_others_changes() {
        let dir = tempfile::tempdir().unwrap();
        let a = Usage::open(dir.path()).unwrap();
        let b = Usage::open(dir.path()).unwrap();
        a.locked(|u| {
            *u += 10;
            Ok(())
        })
        .unwrap();
        b.locked(|u| {
            *u += 5;
            Ok(())
        })
        .unwrap();
        assert_eq!(a.used_bytes().unwrap(), 15);
    }

    fn mkfifo(path: &Path) {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    }

    #[test]
    fn planted_usage_and_lock_links_are_refused_and_their_targets_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"root's file").unwrap();
        for name in ["usage", "lock"] {
            let data = dir.path().join(format!("data-{name}"));
            fs::create_dir(&data).unwrap();
            std::os::unix::fs::symlink(&victim, data.join(name)).unwrap();
            let e = Usage::open(&data).unwrap_err();
            assert!(e.to_string().contains("symlink"), "{e}");
            assert_eq!(fs::read(&victim).unwrap(), b"root's file");
        }
    }

    #[test]
    fn a_fifo_named_like_a_temporary_file_is_passed_over_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let usage = Usage::open(dir.path()).unwrap();
        let ds = dir.path().join("0123456789abcdef");
        fs::create_dir(&ds).unwrap();
        mkfifo(&ds.join(".tmp.1000.1.1"));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(usage.rescan().map(|s| s.used_bytes));
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the rescan hung on a FIFO");
        assert_eq!(got.unwrap(), 0);
    }

    #[test]
    fn the_data_dir_is_made_private_and_an_old_open_one_is_closed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("new-base");
        let data = base.join("data");
        let _usage = Usage::open(&data).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&base), 0o700);
        assert_eq!(mode(&data), 0o700);
        assert_eq!(mode(&data.join("usage")), 0o600);
        assert_eq!(mode(&data.join("lock")), 0o600);
        fs::set_permissions(&data, fs::Permissions::from_mode(0o755)).unwrap();
        let _usage = Usage::open(&data).unwrap();
        assert_eq!(mode(&data), 0o700);
    }

    #[test]
    fn a_cache_dir_others_may_write_or_own_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let e = Usage::open(&open.join("data")).unwrap_err();
        assert!(
            e.to_string()
                .contains("writable by every user and not sticky"),
            "{e}"
        );
        fs::set_permissions(&open, fs::Permissions::from_mode(0o1777)).unwrap();
        Usage::open(&open.join("data")).unwrap();
        if crate::ring::safe_file::euid() == 0 {
            let theirs = dir.path().join("theirs");
            fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            let e = Usage::open(&theirs.join("data")).unwrap_err();
            assert!(e.to_string().contains("belongs to uid 65534"), "{e}");
            // In a sticky shared directory, a data/ made by another user.
            let planted = open.join("planted");
            fs::create_dir(&planted).unwrap();
            fs::create_dir(planted.join("data")).unwrap();
            std::os::unix::fs::chown(planted.join("data"), Some(65534), Some(65534)).unwrap();
            assert!(Usage::open(&planted.join("data")).is_err());
        }
    }
}
