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

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::entry::file_bytes_of_name;

/// Bytes of the usage file: a right-aligned decimal u64 and a newline.
const USAGE_FILE_BYTES: usize = 21;

/// Prefix of a temporary entry file: `.tmp.<reserved bytes>.<pid>.<seq>`.
pub const TMP_PREFIX: &str = ".tmp.";

/// The shared usage counter of one data directory.
#[derive(Debug)]
pub struct Usage {
    root: PathBuf,
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

impl Usage {
    /// Opens (creating) the counter of the data directory `root`.
    pub fn open(root: &Path) -> io::Result<Usage> {
        fs::create_dir_all(root)?;
        let open = |name: &str| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(root.join(name))
        };
        Ok(Usage {
            root: root.to_path_buf(),
            lock: open("lock")?,
            usage: open("usage")?,
        })
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
                    scan_dataset(&dataset.path(), &mut scan)?;
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

fn scan_dataset(dir: &Path, scan: &mut Scan) -> io::Result<()> {
    for item in read_dir_or_empty(dir)? {
        let item = item?;
        let name = item.file_name();
        let name = name.to_string_lossy();
        if let Some(reserved) = tmp_reserved_bytes(&name) {
            let path = item.path();
            let Ok(file) = File::open(&path) else {
                continue; // published or removed meanwhile
            };
            if flock(&file, libc::LOCK_EX | libc::LOCK_NB)? {
                // Its writer died: nobody holds the lock it held while writing.
                fs::remove_file(&path)?;
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
}
