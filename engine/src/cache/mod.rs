//! The disk data cache: objects of a remote source kept on local disk
//! across epochs and runs, read back through the local engine (io_uring).
//!
//! Not to be confused with the *manifest* cache (`source::cache`), which
//! keeps listings. This one keeps object bytes, under
//! `<cache dir>/data/<dataset id>/` (docs/cache.md has the layout, the
//! admission argument and the failure rules):
//!
//! - `entry`: one file per object version, its bytes then a checked footer.
//! - `usage`: the bytes used, shared by every loader of the machine under a
//!   file lock, so that none passes its limit and none counts an entry twice.
//! - `writer`: the thread that writes entries from bytes already fetched.
//! - `engine`: a `ReadEngine` that sends each read to the cache or to the
//!   remote engine, checks hits, and hands misses to the writer.
//!
//! Admission is "fill until full, then keep": under a fresh random order
//! each epoch, no policy can hit more than C/N of an epoch, and a fixed
//! subset does; LRU thrashes (docs/cache.md).

pub mod engine;
pub mod entry;
pub mod usage;
mod verify;
mod writer;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::manifest::FileList;
use crate::reader::{FileTable, ReadError};
use crate::remote::RemoteObject;
use crate::ring;
use crate::ring::segment::human_bytes;
use crate::say::say_err;

pub use engine::CachedEngine;
use entry::{fnv1a64, Identity};
use usage::Usage;

/// An object with no entry (or one not yet checked, or removed).
pub const STATE_ABSENT: u8 = 0;
/// An object whose entry is published and whose CRC is in `crc`.
pub const STATE_CACHED: u8 = 1;
/// An object handed to the writer.
pub const STATE_WRITING: u8 = 2;

/// Bytes of fetched objects waiting for the writer; past it, an object is
/// not admitted now (it gets another chance next epoch).
pub const WRITE_QUEUE_BYTES_MAX: u64 = 64 << 20;
/// Room the default size leaves free on the cache's file system:
/// [`RESERVE_PERCENT`] of it, at least this much...
pub const RESERVE_BYTES_MIN: u64 = 1 << 30;
/// ...and at most this much: 10% of a 252 GiB disk is 25 GiB, more than the
/// 21 GiB a nearly full one had free, which left a default size of 0 B.
pub const RESERVE_BYTES_MAX: u64 = 5 << 30;
/// Share of the file system the default size leaves free, in percent.
pub const RESERVE_PERCENT: u64 = 10;
/// Longest wait at start for the check of existing entries; the rest is
/// checked in the background (unchecked objects are read from remote).
pub const VERIFY_WAIT_AT_START: Duration = Duration::from_secs(2);

/// `--cache-size`: a number of bytes, or the default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CacheSize {
    /// min(dataset bytes, free space less a reserve).
    #[default]
    Auto,
    /// This many bytes at most.
    Bytes(u64),
}

/// Parses `100M`, `2G`, `1.5T`, `64MiB`, `512k`, `1000`: k/M/G/T are powers
/// of 1024 (as are KiB/MiB/GiB/TiB), a bare number is bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "size {text:?}: unknown unit {other:?}; write bytes with k, M, G or T (e.g. 200G)"
            ))
        }
    };
    let value: f64 = num
        .parse()
        .map_err(|_| format!("size {text:?} is not a number of bytes (e.g. 200G or 1.5T)"))?;
    let bytes = value * (1u64 << shift) as f64;
    if !(0.0..1.8e19).contains(&bytes) {
        return Err(format!("size {text:?} is out of range"));
    }
    Ok(bytes as u64)
}

/// Counters of one loader's cache, read by metrics and `stat`.
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Reads served from cache entries.
    pub hits: AtomicU64,
    /// Reads served from the remote store.
    pub misses: AtomicU64,
    /// Bytes read from cache entries.
    pub bytes_from_cache: AtomicU64,
    /// Bytes read from the remote store.
    pub bytes_from_remote: AtomicU64,
    /// Bytes used by the cache directory (all loaders sharing it).
    pub used_bytes: AtomicU64,
    /// This loader's limit.
    pub limit_bytes: AtomicU64,
    /// 1 once the cache refused an entry for want of room (it keeps what it has).
    pub fill_complete: AtomicU64,
    /// Entries this loader wrote.
    pub entries_written: AtomicU64,
    /// Entries found corrupt (CRC mismatch) and refetched.
    pub corrupt_refetched: AtomicU64,
    /// 1 once a write failed and writes stopped.
    pub writes_stopped: AtomicU64,
    /// 1 once the cache opened (0: off, or it could not be opened).
    pub opened: AtomicU64,
}

/// The line a loader prints at its end: the run's hits and misses.
pub fn summary_line(stats: &CacheStats) -> String {
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    format!(
        "data cache: {} hits, {} misses, {} bytes from cache, {} bytes from remote, {} entries written, {} corrupt refetched, {} of {} bytes used{}{}",
        get(&stats.hits),
        get(&stats.misses),
        get(&stats.bytes_from_cache),
        get(&stats.bytes_from_remote),
        get(&stats.entries_written),
        get(&stats.corrupt_refetched),
        get(&stats.used_bytes),
        get(&stats.limit_bytes),
        if get(&stats.fill_complete) > 0 { ", full" } else { "" },
        if get(&stats.writes_stopped) > 0 { ", writes stopped" } else { "" },
    )
}

/// What a loader needs to open its cache.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// The data directory: `<cache dir>/data`.
    pub root: PathBuf,
    /// The size limit.
    pub size: CacheSize,
    /// The counters the cache updates (made by the caller, which shows them).
    pub stats: Arc<CacheStats>,
}

/// Why the cache could not be opened (the run goes on without it).
#[derive(Debug, thiserror::Error)]
#[error("cannot use the data cache at {}: {source}", path.display())]
pub struct OpenError {
    /// What failed.
    pub path: PathBuf,
    /// How.
    pub source: std::io::Error,
}

/// State shared by the engine, the writer and the checker.
pub(crate) struct Shared {
    pub(crate) dataset_dir: PathBuf,
    pub(crate) usage: Usage,
    pub(crate) objects: Arc<Vec<RemoteObject>>,
    /// Range entries, after the objects' (entry `objects.len() + i` is
    /// range `i`): (object, offset, length), the chunks the chunk layer
    /// reads under the block order, each cached as an entry of its own
    /// tied to the object's key, ETag and the range.
    pub(crate) ranges: Vec<(u32, u64, u64)>,
    /// (object, offset) → entry index of the range starting there.
    pub(crate) range_index: std::collections::HashMap<(u32, u64), usize>,
    /// One `STATE_*` per entry (objects, then ranges).
    pub(crate) state: Box<[AtomicU8]>,
    /// CRC32C of a `STATE_CACHED` entry's bytes.
    pub(crate) crc: Box<[AtomicU32]>,
    pub(crate) limit_bytes: u64,
    pub(crate) stats: Arc<CacheStats>,
    /// Set once an entry did not fit: nothing more is admitted.
    pub(crate) full: AtomicBool,
    /// Set once a write failed: nothing more is written.
    pub(crate) stopped: AtomicBool,
    /// Bytes queued for the writer.
    pub(crate) queued_bytes: AtomicU64,
    /// The bodies queued for the writer, by entry (refcounted: the same
    /// bytes as the queue's, no copy), so that a read of an entry being
    /// written is served from memory instead of fetched again. The writer
    /// removes an entry's body when it is done with it.
    pub(crate) pending: std::sync::Mutex<std::collections::HashMap<usize, Vec<bytes::Bytes>>>,
}

impl Shared {
    /// Object `index`'s version. An object listed without an ETag (some
    /// S3-compatible servers, WebDAV) is tied to its key and size alone,
    /// as the remote reads check it.
    pub(crate) fn identity(&self, index: usize) -> Option<Identity> {
        if let Some(o) = self.objects.get(index) {
            return Some(Identity::of(
                &o.key,
                o.etag.as_deref().unwrap_or(""),
                o.size,
            ));
        }
        let &(object, offset, len) = self.ranges.get(index - self.objects.len())?;
        let o = self.objects.get(object as usize)?;
        Some(Identity::of(
            &range_key(&o.key, offset, len),
            o.etag.as_deref().unwrap_or(""),
            len,
        ))
    }

    /// Entry `index` in words: the object's key, and the range for a
    /// range entry.
    pub(crate) fn describe(&self, index: usize) -> String {
        if let Some(o) = self.objects.get(index) {
            return o.key.clone();
        }
        match self
            .ranges
            .get(index.wrapping_sub(self.objects.len()))
            .and_then(|&(object, offset, len)| {
                Some((self.objects.get(object as usize)?, offset, len))
            }) {
            Some((o, offset, len)) => format!("{} (bytes {offset}..{})", o.key, offset + len),
            None => "?".to_owned(),
        }
    }

    /// Bytes of entry `index` (an object's, or a range's).
    pub(crate) fn entry_size(&self, index: usize) -> Option<u64> {
        match self.objects.get(index) {
            Some(o) => Some(o.size),
            None => Some(self.ranges.get(index - self.objects.len())?.2),
        }
    }

    pub(crate) fn entry_path(&self, index: usize) -> Option<PathBuf> {
        Some(self.dataset_dir.join(self.identity(index)?.rel_path()))
    }

    /// Whether a fetched whole object may go to the writer now.
    pub(crate) fn admits(&self) -> bool {
        !self.full.load(Ordering::Relaxed) && !self.stopped.load(Ordering::Relaxed)
    }
}

/// The key a range entry's identity hashes: the object's key, a NUL (no
/// listed key holds one: XML cannot carry it) and the range, so that no
/// object's entry and no other range's can share it.
fn range_key(key: &str, offset: u64, len: u64) -> String {
    format!("{key}\0{offset}+{len}")
}

/// A loader's data cache over one remote dataset.
pub struct DataCache {
    shared: Arc<Shared>,
    files: Arc<FileTable>,
    writer: writer::Writer,
}

impl fmt::Debug for DataCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataCache")
            .field("dir", &self.shared.dataset_dir)
            .field("limit_bytes", &self.shared.limit_bytes)
            .finish()
    }
}

/// The directory of the dataset whose source is `source_display` under the
/// data directory `root`.
pub fn dataset_dir(root: &Path, source_display: &str) -> PathBuf {
    root.join(format!("{:016x}", fnv1a64(source_display.as_bytes())))
}

/// `<cache dir>/data` for ringfeed's cache directory `base` (or the default
/// one, as the manifest cache finds it).
pub fn data_root(base: Option<&Path>) -> Option<PathBuf> {
    let manifests = crate::source::cache::ManifestCache::dir_under(base)?;
    Some(manifests.parent()?.join("data"))
}

impl DataCache {
    /// Opens the cache of `objects` (the manifest's, in order) of the
    /// source `source_display`: accounts the directory again, picks the
    /// size, checks which entries exist (waiting up to
    /// [`VERIFY_WAIT_AT_START`]), starts the writer. Logs what it chose.
    pub fn open(
        cfg: &CacheConfig,
        source_display: &str,
        objects: Arc<Vec<RemoteObject>>,
    ) -> Result<DataCache, OpenError> {
        Self::open_with_ranges(cfg, source_display, objects, Vec::new())
    }

    /// [`DataCache::open`], with range entries too: `ranges` (object,
    /// offset, length) are the chunks the chunk layer reads under the
    /// block order (`ChunkGeometry::ranges`). A read of exactly one of
    /// them is served from, and fills, an entry of its own, keyed by the
    /// object's key, its ETag and the range: under the block order each
    /// epoch reads the same ranges, so the admission argument for whole
    /// objects holds for them (a fixed subset).
    pub fn open_with_ranges(
        cfg: &CacheConfig,
        source_display: &str,
        objects: Arc<Vec<RemoteObject>>,
        ranges: Vec<(u32, u64, u64)>,
    ) -> Result<DataCache, OpenError> {
        let err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| OpenError { path, source }
        };
        let usage = Usage::open(&cfg.root).map_err(err(&cfg.root))?;
        let dir = open_dataset_dir(&usage, &cfg.root, source_display)?;
        let scan = usage.rescan().map_err(err(&cfg.root))?;
        let dataset_bytes: u64 = objects
            .iter()
            .map(|o| o.size.saturating_add(entry::FOOTER_BYTES))
            .sum();
        let (limit_bytes, why) = match cfg.size {
            CacheSize::Bytes(n) => (n, "--cache-size".to_owned()),
            CacheSize::Auto => auto_size(&cfg.root, dataset_bytes, scan.used_bytes),
        };
        let stats = Arc::clone(&cfg.stats);
        stats.limit_bytes.store(limit_bytes, Ordering::Relaxed);
        stats.used_bytes.store(scan.used_bytes, Ordering::Relaxed);
        let no_etag = objects.iter().filter(|o| o.etag.is_none()).count();
        let ranges: Vec<(u32, u64, u64)> = ranges
            .into_iter()
            .filter(|&(o, off, len)| {
                len > 0
                    && objects
                        .get(o as usize)
                        .is_some_and(|ob| off.checked_add(len).is_some_and(|end| end <= ob.size))
            })
            .collect();
        let entries = objects.len() + ranges.len();
        let state: Box<[AtomicU8]> = (0..entries).map(|_| AtomicU8::new(STATE_ABSENT)).collect();
        let crc = (0..entries).map(|_| AtomicU32::new(0)).collect();
        let range_index = ranges
            .iter()
            .enumerate()
            .map(|(i, &(o, off, _))| ((o, off), objects.len() + i))
            .collect();
        let list = entry_files(&objects, &ranges);
        let files =
            FileTable::over(&dir, Arc::new(list), false).map_err(|e: ReadError| OpenError {
                path: dir.clone(),
                source: std::io::Error::other(e.to_string()),
            })?;
        let full = scan.used_bytes >= limit_bytes;
        let shared = Arc::new(Shared {
            dataset_dir: dir.clone(),
            usage,
            objects,
            ranges,
            range_index,
            state,
            crc,
            limit_bytes,
            stats: Arc::clone(&stats),
            full: AtomicBool::new(full),
            stopped: AtomicBool::new(false),
            queued_bytes: AtomicU64::new(0),
            pending: std::sync::Mutex::default(),
        });
        let found = writer::check_existing(&shared, VERIFY_WAIT_AT_START);
        if full {
            stats.fill_complete.store(1, Ordering::Relaxed);
        }
        let writer = writer::Writer::start(Arc::clone(&shared));
        stats.opened.store(1, Ordering::Relaxed);
        say_err!(
            "ringfeed: data cache {} : limit {} ({why}); {} used by {} entries of all datasets{}; {found} of this dataset's {} objects cached{}{}",
            dir.display(),
            human_bytes(limit_bytes),
            human_bytes(scan.used_bytes),
            scan.entries,
            if scan.stale_tmps_removed > 0 {
                format!(", {} unfinished writes of dead loaders removed", scan.stale_tmps_removed)
            } else {
                String::new()
            },
            shared.objects.len(),
            if full { "; full: keeping what it holds" } else { "" },
            if no_etag > 0 {
                format!("; {no_etag} objects were listed without an ETag: their entries are tied to key and size only")
            } else {
                String::new()
            }
        );
        Ok(DataCache {
            shared,
            files: Arc::new(files),
            writer,
        })
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<CacheStats> {
        &self.shared.stats
    }

    /// Objects whose entries are known good now.
    pub fn cached_count(&self) -> usize {
        self.shared
            .state
            .iter()
            .filter(|s| s.load(Ordering::Relaxed) == STATE_CACHED)
            .count()
    }

    /// The dataset's directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dataset_dir
    }

    /// The entry files, indexed as the manifest's objects, then the ranges.
    pub(crate) fn files(&self) -> &Arc<FileTable> {
        &self.files
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub(crate) fn writer(&self) -> &writer::Writer {
        &self.writer
    }
}

/// The default size: the dataset, or what the file system can spare.
fn auto_size(root: &Path, dataset_bytes: u64, used_bytes: u64) -> (u64, String) {
    let Some((total, free)) = fs_space(root) else {
        return (
            0,
            "the free space of its file system cannot be read; pass --cache-size".to_owned(),
        );
    };
    let (reserve, room) = room_of(total, free, used_bytes);
    if dataset_bytes <= room {
        (
            dataset_bytes,
            "default: the whole dataset, which fits".to_owned(),
        )
    } else {
        (
            room,
            format!(
                "default: the dataset needs {} but its file system has {} free, less a reserve of {}; pass --cache-size to choose",
                human_bytes(dataset_bytes),
                human_bytes(free),
                human_bytes(reserve)
            ),
        )
    }
}

/// (reserve, room) on a file system of `total` bytes with `free` bytes free
/// and `used_bytes` of entries: the reserve is [`RESERVE_PERCENT`] of it,
/// between [`RESERVE_BYTES_MIN`] and [`RESERVE_BYTES_MAX`].
fn room_of(total: u64, free: u64, used_bytes: u64) -> (u64, u64) {
    let reserve = (total / 100 * RESERVE_PERCENT).clamp(RESERVE_BYTES_MIN, RESERVE_BYTES_MAX);
    // Entries already there are ours to keep: they count as room.
    let room = free.saturating_add(used_bytes).saturating_sub(reserve);
    (reserve, room)
}

/// (size, bytes free to unprivileged users) of the file system of `path`.
fn fs_space(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: all-zero is a valid statvfs for the call to fill.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` valid for writes; rc is checked.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let frsize = st.f_frsize;
    Some((
        st.f_blocks.saturating_mul(frsize),
        st.f_bavail.saturating_mul(frsize),
    ))
}

/// The dataset's directory under the cache, made if it is not there (0700),
/// with its `source` file naming the source (for `ringfeed cache list`).
fn open_dataset_dir(
    usage: &Usage,
    root: &Path,
    source_display: &str,
) -> Result<PathBuf, OpenError> {
    let dir = dataset_dir(root, source_display);
    let dataset = match dir.file_name() {
        Some(name) => usage.dir().make_dir(name, usage::DIR_MODE),
        None => Err(ring::safe_file::TrustError::Io {
            path: dir.clone(),
            source: std::io::ErrorKind::InvalidInput.into(),
        }),
    }
    .map_err(|e| OpenError {
        path: dir.clone(),
        source: std::io::Error::new(std::io::ErrorKind::PermissionDenied, e.to_string()),
    })?;
    let source_file = dir.join("source");
    match dataset.open_trusted(std::ffi::OsStr::new("source")) {
        Ok(_) => {}
        Err(e) if e.is_not_found() => dataset
            .write_atomic(
                std::ffi::OsStr::new("source"),
                format!("{source_display}\n").as_bytes(),
                usage::FILE_MODE,
                false,
            )
            .map_err(|source| OpenError {
                path: source_file.clone(),
                source,
            })?,
        Err(e) => {
            return Err(OpenError {
                path: source_file,
                source: std::io::Error::new(std::io::ErrorKind::PermissionDenied, e.to_string()),
            })
        }
    }
    Ok(dir)
}

/// The entries' relative paths and sizes: every object's, then every
/// range's.
fn entry_files(objects: &[RemoteObject], ranges: &[(u32, u64, u64)]) -> FileList {
    let entries = objects.len() + ranges.len();
    // Built in place, one buffer for every path: no string per object.
    // `hh/` + 16 hex + `-` + the file's size in decimal.
    let sizes = objects
        .iter()
        .map(|o| o.size)
        .chain(ranges.iter().map(|r| r.2));
    let path_bytes = sizes
        .map(|size| 20 + size.saturating_add(entry::FOOTER_BYTES).to_string().len())
        .sum();
    let mut list = FileList::with_capacity(entries, path_bytes);
    for o in objects.iter() {
        let id = Identity::of(&o.key, o.etag.as_deref().unwrap_or(""), o.size);
        list.push(id.rel_path().as_bytes(), id.file_bytes());
    }
    for &(object, offset, len) in ranges {
        let o = &objects[object as usize];
        let id = Identity::of(
            &range_key(&o.key, offset, len),
            o.etag.as_deref().unwrap_or(""),
            len,
        );
        list.push(id.rel_path().as_bytes(), id.file_bytes());
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1.5T"), Ok(3 << 39));
        assert!(parse_size("12 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_size("G").is_err());
    }

    #[test]
    fn the_default_leaves_at_most_5_gib_free_on_a_big_nearly_full_disk() {
        const GIB: u64 = 1 << 30;
        // Issue 32: 21 GiB free on a 252 GiB disk gave 0 B.
        assert_eq!(room_of(252 * GIB, 21 * GIB, 0), (5 * GIB, 16 * GIB));
        let (reserve, room) = room_of(20 * GIB, 10 * GIB, 0);
        assert_eq!((reserve, room), (20 * GIB / 100 * 10, 10 * GIB - reserve));
        assert_eq!(room_of(4 * GIB, 3 * GIB, GIB), (GIB, 3 * GIB));
        assert_eq!(room_of(4 * GIB, 0, 0).1, 0);
    }
}
