//! The manifest cache: a listed directory's manifest kept on local disk, so
//! that the next loader over the same directory starts without listing it.
//!
//! Kept per directory, under a name derived from its canonical path: the
//! files in manifest order with their sizes, and a stamp of every directory
//! listed (device, inode, mtime, ctime), taken before that directory's
//! entries were read. docs/manifest.md explains the rules at length:
//!
//! - **Used** only when every stamped directory still has the same device,
//!   inode, mtime and ctime. Adding, removing or renaming a name anywhere in
//!   the tree changes its directory's times; ctime cannot be set back from
//!   user space (`rsync -a` and `touch -d` set mtime only).
//! - With at most `stat_files_max` files, each file's size is checked too
//!   (a few milliseconds). Above that, a file changed in place (same path,
//!   new size) is found when it is read (`ReadError::ChangedSize` / `Grew`),
//!   and the loader then removes the entry ([`ManifestCache::forget`]).
//! - **Not stored** when a directory changed less than `racy_window` before
//!   the listing began: a change within the same clock tick as the stamp
//!   would leave its times equal.
//! - A cache file that is missing, unreadable, corrupt (CRC-32 over the whole
//!   file), of another format version or of another path is a miss, never an
//!   error. One that cannot be written is a warning. Files are written under
//!   a temporary name and renamed, so a loader never reads half of one.
//!
//! Format version 1, little-endian:
//!
//! ```text
//! "RFMANIF\0"  u32 version  u32 0  i64 listed-at (Unix seconds)
//! u32 len, root bytes (canonical path)   u64 directories   u64 files
//! directories: u32 len, path, u64 dev, u64 ino, i64 mtime s, u32 mtime ns, i64 ctime s, u32 ctime ns
//! files:       u32 len, path, u64 size           (strictly increasing paths)
//! u32 CRC-32 of everything before it
//! ```

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{DirStamp, FileEntry, MAX_FILES};

const MAGIC: &[u8; 8] = b"RFMANIF\0";
const FORMAT_VERSION: u32 = 1;
/// Bytes of one directory record besides its path.
const DIR_FIXED_BYTES: u64 = 4 + 8 + 8 + 8 + 4 + 8 + 4;
/// Bytes of one file record besides its path.
const FILE_FIXED_BYTES: u64 = 4 + 8;

/// Default of [`ManifestCache::racy_window`]: generous against clock steps
/// and coarse file-system timestamps.
pub const DEFAULT_RACY_WINDOW: Duration = Duration::from_secs(2);
/// Default of [`ManifestCache::stat_files_max`]: about 4 ms of `stat` calls
/// on the test VM.
pub const DEFAULT_STAT_FILES_MAX: usize = 4_096;

/// Where cached manifests live, and how they are checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestCache {
    /// The directory holding the cache files (created on first store, 0700).
    pub dir: PathBuf,
    /// A listing is not stored when one of its directories changed less
    /// than this before the listing began.
    pub racy_window: Duration,
    /// Check every file's size on a hit when there are at most this many.
    pub stat_files_max: usize,
}

/// What happened when a cached manifest was looked for.
#[derive(Debug)]
pub(crate) enum Lookup {
    /// Valid: the files, in manifest order.
    Hit {
        files: Vec<FileEntry>,
        dirs_checked: usize,
        files_checked: usize,
    },
    /// Not usable; the reason, for the log.
    Miss(String),
}

impl ManifestCache {
    /// A cache in `dir` with the default checks.
    pub fn at(dir: PathBuf) -> ManifestCache {
        ManifestCache {
            dir,
            racy_window: DEFAULT_RACY_WINDOW,
            stat_files_max: DEFAULT_STAT_FILES_MAX,
        }
    }

    /// The manifests directory under ringfeed's cache directory:
    /// `$RINGFEED_CACHE_DIR`, else `$XDG_CACHE_HOME/ringfeed`, else
    /// `$HOME/.cache/ringfeed`; then `/manifests`. None when none is set.
    pub fn default_dir() -> Option<PathBuf> {
        let nonempty = |var: &str| std::env::var_os(var).filter(|v| !v.is_empty()).map(PathBuf::from);
        let base = nonempty("RINGFEED_CACHE_DIR")
            .or_else(|| nonempty("XDG_CACHE_HOME").map(|d| d.join("ringfeed")))
            .or_else(|| nonempty("HOME").map(|d| d.join(".cache").join("ringfeed")))?;
        Some(base.join("manifests"))
    }

    /// The cache file of the directory whose canonical path is `canonical_root`.
    pub fn entry_path(&self, canonical_root: &Path) -> PathBuf {
        self.dir.join(format!("{:016x}.manifest", fnv1a64(canonical_root.as_os_str().as_bytes())))
    }

    /// Looks for a valid cached manifest of `canonical_root`.
    pub(crate) fn lookup(&self, canonical_root: &Path) -> Lookup {
        let path = self.entry_path(canonical_root);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Lookup::Miss("no cached manifest".into()),
            Err(err) => return Lookup::Miss(format!("cannot read {}: {err}", path.display())),
        };
        let decoded = match decode(&bytes, canonical_root.as_os_str().as_bytes()) {
            Ok(decoded) => decoded,
            Err(why) => return Lookup::Miss(format!("{} is not usable: {why}", path.display())),
        };
        for stamp in &decoded.dirs {
            let abs = canonical_root.join(&stamp.rel_path);
            match fs::symlink_metadata(&abs) {
                Ok(meta) if meta.is_dir() && DirStamp::of(stamp.rel_path.clone(), &meta) == *stamp => {}
                Ok(_) => return Lookup::Miss(format!("directory {} changed since it was listed", abs.display())),
                Err(err) => return Lookup::Miss(format!("directory {}: {err}", abs.display())),
            }
        }
        let mut files_checked = 0;
        if decoded.files.len() <= self.stat_files_max {
            for file in &decoded.files {
                let abs = canonical_root.join(&file.rel_path);
                // Follows a link, as the listing did.
                match fs::metadata(&abs) {
                    Ok(meta) if meta.is_file() && meta.len() == file.size_bytes => {}
                    Ok(meta) => {
                        return Lookup::Miss(format!(
                            "file {} changed since it was listed ({} bytes then, {} now)",
                            abs.display(),
                            file.size_bytes,
                            meta.len()
                        ))
                    }
                    Err(err) => return Lookup::Miss(format!("file {}: {err}", abs.display())),
                }
            }
            files_checked = decoded.files.len();
        }
        Lookup::Hit {
            dirs_checked: decoded.dirs.len(),
            files_checked,
            files: decoded.files,
        }
    }

    /// Stores a listing of `canonical_root` that began at `listed_at`.
    /// `Ok(None)`: stored; `Ok(Some(why))`: deliberately not stored.
    pub(crate) fn store(
        &self,
        canonical_root: &Path,
        listed_at: SystemTime,
        dirs: &[DirStamp],
        files: &[FileEntry],
    ) -> io::Result<Option<String>> {
        let racy_after = listed_at.checked_sub(self.racy_window).unwrap_or(UNIX_EPOCH);
        if let Some(stamp) = dirs.iter().find(|d| d.changed_at() >= racy_after) {
            return Ok(Some(format!(
                "directory {} changed less than {:.0?} before the listing began, so a change made in the same clock tick \
                 could not be told apart; the next start lists it again",
                canonical_root.join(&stamp.rel_path).display(),
                self.racy_window
            )));
        }
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&self.dir)?;
        let path = self.entry_path(canonical_root);
        let bytes = encode(canonical_root.as_os_str().as_bytes(), listed_at, dirs, files);
        let mut tmp_name = path.clone().into_os_string();
        tmp_name.push(format!(".tmp.{}", std::process::id()));
        let tmp = PathBuf::from(tmp_name);
        let written = (|| {
            let mut file = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
            file.write_all(&bytes)?;
            fs::rename(&tmp, &path)
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written.map(|()| None)
    }

    /// Removes the cached manifest of `canonical_root`, if any: a file of it
    /// was found changed, so the next start must list again.
    pub fn forget(&self, canonical_root: &Path) -> io::Result<bool> {
        match fs::remove_file(self.entry_path(canonical_root)) {
            Ok(()) => Ok(true),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// The root recorded in a cache file, if it is one (for `gc`).
    pub fn root_of(path: &Path) -> Option<PathBuf> {
        let bytes = fs::read(path).ok()?;
        let mut r = Reader { bytes: checked_body(&bytes).ok()?, at: 0 };
        r.header().ok()
    }
}

impl DirStamp {
    /// The later of the two times, as a `SystemTime`.
    fn changed_at(&self) -> SystemTime {
        let at = |(secs, nanos): (i64, u32)| {
            let since_epoch = Duration::new(secs.unsigned_abs(), nanos);
            if secs >= 0 {
                UNIX_EPOCH + since_epoch
            } else {
                UNIX_EPOCH.checked_sub(since_epoch).unwrap_or(UNIX_EPOCH)
            }
        };
        at(self.mtime).max(at(self.ctime))
    }
}

/// What a cache file holds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Decoded {
    pub dirs: Vec<DirStamp>,
    pub files: Vec<FileEntry>,
}

/// FNV-1a, 64 bits: the cache file name of a path (collisions are caught by
/// the root stored inside).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The bytes of a cache file.
pub(crate) fn encode(root: &[u8], listed_at: SystemTime, dirs: &[DirStamp], files: &[FileEntry]) -> Vec<u8> {
    let paths: usize = dirs.iter().map(|d| d.rel_path.as_os_str().len()).sum::<usize>()
        + files.iter().map(|f| f.rel_path.as_os_str().len()).sum::<usize>();
    let mut out = Vec::with_capacity(64 + root.len() + paths + dirs.len() * DIR_FIXED_BYTES as usize + files.len() * FILE_FIXED_BYTES as usize);
    let listed_secs = listed_at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&listed_secs.to_le_bytes());
    put_bytes(&mut out, root);
    out.extend_from_slice(&(dirs.len() as u64).to_le_bytes());
    out.extend_from_slice(&(files.len() as u64).to_le_bytes());
    for d in dirs {
        put_bytes(&mut out, d.rel_path.as_os_str().as_bytes());
        out.extend_from_slice(&d.dev.to_le_bytes());
        out.extend_from_slice(&d.ino.to_le_bytes());
        out.extend_from_slice(&d.mtime.0.to_le_bytes());
        out.extend_from_slice(&d.mtime.1.to_le_bytes());
        out.extend_from_slice(&d.ctime.0.to_le_bytes());
        out.extend_from_slice(&d.ctime.1.to_le_bytes());
    }
    for f in files {
        put_bytes(&mut out, f.rel_path.as_os_str().as_bytes());
        out.extend_from_slice(&f.size_bytes.to_le_bytes());
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    // Paths come from the file system: PATH_MAX-bounded, far below u32::MAX.
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Reads a cache file made by `encode` for `root`. Any bytes give `Ok` or an
/// `Err` naming what is wrong, never a panic or an allocation larger than
/// the input warrants.
pub(crate) fn decode(bytes: &[u8], root: &[u8]) -> Result<Decoded, String> {
    let mut r = Reader { bytes: checked_body(bytes)?, at: 0 };
    let stored_root = r.header()?;
    if stored_root.as_os_str().as_bytes() != root {
        return Err(format!("it is the cache of {}", stored_root.display()));
    }
    let n_dirs = r.u64()?;
    let n_files = r.u64()?;
    let left = r.left() as u64;
    // Every record takes at least its fixed bytes: counts past that are lies.
    if n_dirs == 0 || n_dirs > left / DIR_FIXED_BYTES {
        return Err(format!("{n_dirs} directories cannot fit in {left} bytes"));
    }
    if n_files == 0 || n_files > MAX_FILES || n_files > left / FILE_FIXED_BYTES {
        return Err(format!("{n_files} files cannot fit in {left} bytes"));
    }
    let mut dirs = Vec::with_capacity(n_dirs as usize);
    for _ in 0..n_dirs {
        let rel_path = r.rel_path(true)?;
        dirs.push(DirStamp {
            rel_path,
            dev: r.u64()?,
            ino: r.u64()?,
            mtime: (r.i64()?, r.nanos()?),
            ctime: (r.i64()?, r.nanos()?),
        });
    }
    let mut files: Vec<FileEntry> = Vec::with_capacity(n_files as usize);
    for _ in 0..n_files {
        let rel_path = r.rel_path(false)?;
        if let Some(prev) = files.last() {
            if prev.rel_path.as_os_str().as_bytes() >= rel_path.as_os_str().as_bytes() {
                return Err(format!("files out of order at {}", rel_path.display()));
            }
        }
        files.push(FileEntry { rel_path, size_bytes: r.u64()? });
    }
    if r.left() != 0 {
        return Err(format!("{} bytes after the last file", r.left()));
    }
    Ok(Decoded { dirs, files })
}

/// The bytes before the CRC, if the CRC matches.
fn checked_body(bytes: &[u8]) -> Result<&[u8], String> {
    let Some(split) = bytes.len().checked_sub(4) else {
        return Err(format!("{} bytes is too short", bytes.len()));
    };
    let (body, crc) = bytes.split_at(split);
    let stored = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
    if crc32fast::hash(body) != stored {
        return Err("its checksum does not match (a torn or damaged file)".into());
    }
    Ok(body)
}

/// A bounds-checked cursor.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        if n > self.left() {
            return Err(format!("it ends early, at byte {}", self.bytes.len()));
        }
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self) -> Result<u32, String> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, String> {
        self.array().map(u64::from_le_bytes)
    }

    fn i64(&mut self) -> Result<i64, String> {
        self.array().map(i64::from_le_bytes)
    }

    fn nanos(&mut self) -> Result<u32, String> {
        match self.u32()? {
            n if n < 1_000_000_000 => Ok(n),
            n => Err(format!("{n} nanoseconds is not a time")),
        }
    }

    /// Magic, version, reserved, listed-at; returns the root.
    fn header(&mut self) -> Result<PathBuf, String> {
        if self.take(MAGIC.len())? != MAGIC {
            return Err("it is not a ringfeed manifest cache file".into());
        }
        let version = self.u32()?;
        if version != FORMAT_VERSION {
            return Err(format!("format version {version}, this build reads {FORMAT_VERSION}"));
        }
        self.u32()?;
        self.i64()?;
        let len = self.u32()? as usize;
        Ok(PathBuf::from(OsStr::from_bytes(self.take(len)?)))
    }

    /// A relative path of plain components; empty only if `may_be_empty`
    /// (the root's own directory stamp).
    fn rel_path(&mut self, may_be_empty: bool) -> Result<PathBuf, String> {
        let len = self.u32()? as usize;
        let bytes = self.take(len)?;
        // Components split on '/' rule out a leading, trailing or doubled
        // '/' (an empty component) as well as "." and "..".
        let plain = !bytes.contains(&0) && bytes.split(|&b| b == b'/').all(|c| !c.is_empty() && c != b"." && c != b"..");
        if !(plain || may_be_empty && bytes.is_empty()) {
            return Err(format!("{:?} is not a plain relative path", String::from_utf8_lossy(bytes)));
        }
        Ok(PathBuf::from(OsStr::from_bytes(bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> (Vec<DirStamp>, Vec<FileEntry>) {
        let dirs = vec![
            DirStamp { rel_path: PathBuf::new(), dev: 1, ino: 2, mtime: (1_700_000_000, 5), ctime: (1_700_000_001, 999_999_999) },
            DirStamp { rel_path: "a/b".into(), dev: 1, ino: 3, mtime: (-3, 0), ctime: (0, 1) },
        ];
        let files = ["a/b/c", "a/b/d", "z", "é"]
            .iter()
            .enumerate()
            .map(|(i, p)| FileEntry { rel_path: p.into(), size_bytes: i as u64 * 1000 })
            .collect();
        (dirs, files)
    }

    #[test]
    fn a_cache_file_reads_back_as_written() {
        let (dirs, files) = sample();
        let bytes = encode(b"/data/set", SystemTime::now(), &dirs, &files);
        assert_eq!(decode(&bytes, b"/data/set"), Ok(Decoded { dirs, files }));
    }

    #[test]
    fn another_roots_cache_file_is_refused_by_name() {
        let (dirs, files) = sample();
        let bytes = encode(b"/data/set", SystemTime::now(), &dirs, &files);
        let err = decode(&bytes, b"/data/other").unwrap_err();
        assert!(err.contains("/data/set"), "{err}");
    }

    #[test]
    fn paths_that_leave_the_root_or_come_out_of_order_are_refused() {
        let (dirs, _) = sample();
        for bad in [&["a", "../etc/passwd"][..], &["/etc/passwd"], &["b", "a"], &["a", "a"], &["a//b"], &["a/./b"], &[""], &["a/"]] {
            let files: Vec<FileEntry> = bad.iter().map(|p| FileEntry { rel_path: p.into(), size_bytes: 1 }).collect();
            let bytes = encode(b"/r", SystemTime::now(), &dirs, &files);
            assert!(decode(&bytes, b"/r").is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_refused() {
        let (dirs, files) = sample();
        let bytes = encode(b"/r", SystemTime::now(), &dirs, &files);
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len], b"/r").is_err(), "truncated to {len} accepted");
        }
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert!(decode(&bad, b"/r").is_err(), "flip at {at} accepted");
        }
    }

    proptest! {
        /// Arbitrary bodies with a valid CRC: the parser itself must refuse
        /// or accept without panicking or over-allocating.
        #[test]
        fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512), splice in any::<bool>()) {
            let (dirs, files) = sample();
            let mut bytes = if splice {
                let mut b = encode(b"/r", SystemTime::now(), &dirs, &files);
                b.truncate(b.len() - 4);
                let at = body.len().min(b.len());
                b.splice(b.len() - at.min(b.len() / 2).., body.iter().copied());
                b
            } else {
                body
            };
            let crc = crc32fast::hash(&bytes);
            bytes.extend_from_slice(&crc.to_le_bytes());
            let _ = decode(&bytes, b"/r");
        }
    }
}
