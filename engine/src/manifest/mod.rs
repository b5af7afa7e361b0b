//! Which samples exist, and where each one's bytes are (object, offset,
//! length): a source's objects in key order plus the sample index over them.
//!
//! The manifest knows no file system and talks to no network: a [`Source`]
//! lists the objects (`crate::source`), and [`Manifest::from_objects`]
//! makes the index. (A listing's failure is a [`ManifestError`], which may
//! carry the remote layer's error as its cause: the only name it takes
//! from `crate::remote`.) Its cache file's format is `format`; storing and checking it is
//! the source layer's (`crate::source::cache`).
//!
//! Contract (stable; docs/manifest.md says it at length):
//! - The objects are in byte-wise lexicographic order of their keys (paths
//!   relative to the source's root, with `/` separators: raw bytes, no
//!   locale, no Unicode folding). So `"a.b"` (0x2E) comes before `"a/b"`
//!   (0x2F), and `"B"` before `"a"`. A local directory's objects are its
//!   regular files (see `crate::source::local` for links and special files).
//! - Whole-object mode (`record_bytes == None`): sample i is object i, all
//!   of it. An empty object is a sample of length 0: dropping it would shift
//!   every later index, and the trainer decides what an empty sample means.
//! - Record mode (`record_bytes == Some(N)`): every object is a
//!   concatenation of N-byte records and sample i is the i-th record across
//!   the objects in manifest order. A size that is not a multiple of N is an
//!   error; an empty object holds 0 records.
//! - Ranges mode ([`Manifest::from_ranges`]): each sample is a listed byte
//!   range of one object (a tar shard's samples, `crate::tar`), in the order
//!   given: shards in key order, samples in tar order within a shard.
//! - Windows mode ([`Manifest::from_windows`]): each sample is a window of
//!   tokens cut from a corpus's documents, in parts of one or more objects
//!   (`crate::tokens`, docs/tokens.md).
//!
//! [`Source`]: crate::source::Source

mod file_list;
pub(crate) mod format;
pub mod keys;
mod ranges;
mod stamps;
mod windows;

pub use file_list::{FileList, FileRef};
pub use keys::KeyFacts;
pub use ranges::SampleRanges;
pub use stamps::{DirStamp, LinkStamp};
pub use windows::{WindowPart, Windows};

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;

/// Most files in one manifest: a file index is a `u32`, and `u32::MAX` is
/// kept free as a "no file" marker for the layers above.
pub const MAX_FILES: u64 = u32::MAX as u64 - 1;

/// Most listing threads, whatever `ManifestOptions::threads` asks for.
pub const MAX_LIST_THREADS: usize = 64;

/// Listing threads when `ManifestOptions::threads == 0`:
/// `min(AUTO_LIST_THREADS_MAX, 2 × available_parallelism)`. Listing waits on
/// the file system, so a few more threads than cores help; beyond 8 a local
/// disk gains little.
pub const AUTO_LIST_THREADS_MAX: usize = 8;

/// How to build a manifest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ManifestOptions {
    /// `Some(N)`: files are concatenations of N-byte records, one sample per
    /// record. `None`: one sample per file.
    pub record_bytes: Option<u64>,
    /// Listing threads; 0 picks `min(8, 2 × available_parallelism)`. Capped
    /// at `MAX_LIST_THREADS`.
    pub threads: usize,
    /// Show a spinner on stderr (when it is a terminal) if listing takes
    /// more than about a second; otherwise log progress with `tracing`.
    pub progress: bool,
}

/// Where a manifest from [`Manifest::build_cached`] came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ManifestOrigin {
    /// Read from the cache file `path`; `dirs_checked` directories (and
    /// `files_checked` files, 0 past `ManifestCache::stat_files_max`) were
    /// found unchanged.
    Cached {
        /// The cache file.
        path: PathBuf,
        /// Directories found unchanged.
        dirs_checked: usize,
        /// Files whose size was checked.
        files_checked: usize,
    },
    /// Listed. `cache_miss` says why the cache was not used; `not_stored`
    /// why the listing was not stored in `path` (None: it was).
    Listed {
        /// The cache file of this directory (written unless `not_stored`).
        path: Option<PathBuf>,
        /// Why the cache was not used.
        cache_miss: String,
        /// Why no cache file was written (a warning when it is an error).
        not_stored: Option<String>,
    },
}

impl ManifestOrigin {
    /// The cache file that holds this manifest now, if any.
    pub fn cache_file(&self) -> Option<&Path> {
        match self {
            ManifestOrigin::Cached { path, .. } => Some(path),
            ManifestOrigin::Listed {
                path: Some(path),
                not_stored: None,
                ..
            } => Some(path),
            ManifestOrigin::Listed { .. } => None,
        }
    }
}

/// Where one sample's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleLoc {
    /// Index into `Manifest::files()`.
    pub file: u32,
    /// Byte offset of the sample in that file.
    pub offset_bytes: u64,
    /// Length of the sample.
    pub len_bytes: u64,
}

/// Why a manifest could not be built.
#[derive(Debug, Error)]
pub enum ManifestError {
    /// The source path does not exist.
    #[error("source {path} does not exist; --source must name an existing directory")]
    SourceMissing {
        /// The source as given.
        path: PathBuf,
    },
    /// The source exists but is not a directory.
    #[error("source {path} is not a directory; --source must name a directory (its regular files are the samples)")]
    NotADirectory {
        /// The source as given.
        path: PathBuf,
    },
    /// The source holds no regular file (whole-file mode) or no record.
    #[error("source {path} contains no regular files (a remote prefix: no keys; or, with --record-bytes, only empty ones); put the dataset's files under it or fix --source")]
    Empty {
        /// The source as given.
        path: PathBuf,
    },
    /// A directory could not be read.
    #[error("cannot read directory {path}: {source}; check that it exists and that this user may list it")]
    ReadDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A file's (or the source's) metadata could not be read. For a symbolic
    /// link this usually means it dangles.
    #[error("cannot read the metadata of {path}: {source}; check that it exists (a symbolic link must point to an existing file) and that this user may read it")]
    Metadata {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// `record_bytes == Some(0)`.
    #[error("--record-bytes is 0; give the size of one record in bytes (at least 1), or leave it out for one sample per file")]
    ZeroRecordBytes,
    /// A file is not a whole number of records.
    #[error("file {path} is {size_bytes} bytes, not a multiple of --record-bytes {record_bytes} ({remainder_bytes} bytes left over); fix the file or pass the record size that divides every file")]
    NotWholeRecords {
        /// The file.
        path: PathBuf,
        /// Its size.
        size_bytes: u64,
        /// The record size asked for.
        record_bytes: u64,
        /// `size_bytes % record_bytes`.
        remainder_bytes: u64,
    },
    /// More files than `MAX_FILES`.
    #[error("source directory {path} holds more than {max} files; split the dataset or pack small files into record files (--record-bytes)")]
    TooManyFiles {
        /// The source as given.
        path: PathBuf,
        /// `MAX_FILES`.
        max: u64,
    },
    /// The sizes add up beyond `u64` (only a corrupt file system does this).
    #[error("the file sizes under {path} add up to more than 2^64 bytes; the file system reports impossible sizes")]
    TotalTooLarge {
        /// The source as given.
        path: PathBuf,
    },
    /// A listing thread could not be started.
    #[error("cannot start a listing thread: {source}; lower the thread count or raise the process limit (ulimit -u)")]
    ThreadSpawn {
        /// The OS error.
        source: io::Error,
    },
    /// A sample's range (ranges mode) lies outside its object.
    #[error("sample {index}: bytes {offset_bytes}..+{len_bytes} lie outside {path}; the object changed since it was indexed: list again (--manifest-cache refresh)")]
    RangeOutside {
        /// The sample.
        index: u64,
        /// Its offset.
        offset_bytes: u64,
        /// Its length.
        len_bytes: u64,
        /// Its object (the source, when the object index is out of range).
        path: PathBuf,
    },
    /// A tar shard could not be indexed (malformed, unreadable); the
    /// message names the shard and the byte offset.
    #[error("{0}")]
    Shard(String),
    /// A remote source could not be opened or listed; the remote error
    /// names the URL, the status and the fix.
    #[error(transparent)]
    Remote(#[from] crate::remote::RemoteError),
}

/// How messages name a source and its objects: a directory's path and
/// `root/key` for a local source, later a URL. Implemented by every
/// [`Source`](crate::source::Source); the manifest needs only this of one,
/// to say which object is at fault.
pub trait ObjectNames {
    /// The source as messages name it.
    fn source_name(&self) -> PathBuf;
    /// Object `key` (relative to the source's root) as messages name it.
    fn object_name(&self, key: &[u8]) -> PathBuf;
}

/// The samples of a source: its objects and the sample index over them.
/// Immutable once built.
#[derive(Clone, Debug)]
pub struct Manifest {
    /// Keys (paths relative to the source's root) and sizes, in manifest
    /// order; shared with the readers.
    files: Arc<FileList>,
    record_bytes: Option<u64>,
    /// Record mode: the index of each file's first record, then the total
    /// record count (`files.len() + 1` entries). Empty in whole-file mode.
    first_record: Vec<u64>,
    /// Ranges mode: every sample's range.
    ranges: Option<Arc<SampleRanges>>,
    /// Ranges mode: what indexing learnt of the samples' keys.
    key_facts: Option<Arc<KeyFacts>>,
    /// Windows mode: the corpora's token windows.
    windows: Option<Arc<dyn Windows>>,
    len: u64,
    total_bytes: u64,
    max_sample_bytes: u64,
}

impl Manifest {
    /// Builds the manifest of `files`, a source's objects already in
    /// manifest order (keys strictly increasing), named in errors by
    /// `names`. Refused: no object (or no record), more than `MAX_FILES`
    /// objects, sizes past 2^64 in all, `record_bytes` of 0 or not dividing
    /// an object's size.
    pub fn from_objects(
        files: FileList,
        record_bytes: Option<u64>,
        names: &dyn ObjectNames,
    ) -> Result<Manifest, ManifestError> {
        if record_bytes == Some(0) {
            return Err(ManifestError::ZeroRecordBytes);
        }
        let empty = || ManifestError::Empty {
            path: names.source_name(),
        };
        if files.is_empty() {
            return Err(empty());
        }
        // The walk stops at MAX_FILES already; this is the other side of
        // that boundary.
        if files.len() as u64 > MAX_FILES {
            return Err(ManifestError::TooManyFiles {
                path: names.source_name(),
                max: MAX_FILES,
            });
        }
        let total_bytes = files
            .sizes()
            .iter()
            .try_fold(0u64, |sum, &size| sum.checked_add(size))
            .ok_or_else(|| ManifestError::TotalTooLarge {
                path: names.source_name(),
            })?;
        let mut manifest = Manifest {
            files: Arc::new(files),
            record_bytes,
            first_record: Vec::new(),
            ranges: None,
            key_facts: None,
            windows: None,
            len: 0,
            total_bytes,
            max_sample_bytes: 0,
        };
        match record_bytes {
            None => {
                manifest.len = manifest.files.len() as u64;
                manifest.max_sample_bytes =
                    manifest.files.sizes().iter().copied().max().unwrap_or(0);
            }
            Some(record_bytes) => {
                manifest.first_record = manifest.record_starts(record_bytes, names)?;
                // first_record has files.len() + 1 >= 2 entries.
                manifest.len = manifest.first_record.last().copied().unwrap_or(0);
                manifest.max_sample_bytes = record_bytes;
            }
        }
        if manifest.len == 0 {
            return Err(empty());
        }
        Ok(manifest)
    }

    /// Prefix sums of the record counts, checking every file is whole records.
    fn record_starts(
        &self,
        record_bytes: u64,
        names: &dyn ObjectNames,
    ) -> Result<Vec<u64>, ManifestError> {
        let mut starts = Vec::with_capacity(self.files.len() + 1);
        let mut next = 0u64;
        for (file, &size_bytes) in self.files.sizes().iter().enumerate() {
            let remainder_bytes = size_bytes % record_bytes;
            if remainder_bytes != 0 {
                return Err(ManifestError::NotWholeRecords {
                    path: names.object_name(self.files.path_bytes(file)),
                    size_bytes,
                    record_bytes,
                    remainder_bytes,
                });
            }
            starts.push(next);
            // No overflow: the record count is at most total_bytes.
            next += size_bytes / record_bytes;
        }
        starts.push(next);
        Ok(starts)
    }

    /// The objects (keys relative to the source's root, and sizes), in
    /// manifest order. Shared: the loader's readers open files from this
    /// same list.
    pub fn files(&self) -> &Arc<FileList> {
        &self.files
    }

    /// `Some(N)` in record mode.
    pub fn record_bytes(&self) -> Option<u64> {
        self.record_bytes
    }

    /// Number of samples (at least 1 for a built manifest).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when there are no samples; never for a manifest `build` returned.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where sample `index` is: O(1) in whole-file mode, O(log files) in
    /// record mode (binary search of the record prefix sums).
    ///
    /// # Panics
    /// If `index >= len()`.
    #[inline]
    pub fn sample(&self, index: u64) -> SampleLoc {
        assert!(
            index < self.len,
            "sample {index} is outside a manifest of {} samples",
            self.len
        );
        if let Some(ranges) = &self.ranges {
            // index < len == ranges.len() <= usize::MAX.
            return ranges.get(index as usize);
        }
        if let Some(windows) = &self.windows {
            return Manifest::window_loc(windows.as_ref(), index);
        }
        match self.record_bytes {
            None => SampleLoc {
                // index < len <= MAX_FILES < u32::MAX.
                file: index as u32,
                offset_bytes: 0,
                len_bytes: self.files.size_bytes(index as usize),
            },
            Some(record_bytes) => {
                // The last file whose first record is <= index. Empty files
                // share their start with the next file, so the last such file
                // is the non-empty one that holds the record.
                let starts = &self.first_record[..self.files.len()];
                let file = starts.partition_point(|&start| start <= index) - 1;
                SampleLoc {
                    file: file as u32,
                    offset_bytes: (index - starts[file]) * record_bytes,
                    len_bytes: record_bytes,
                }
            }
        }
    }

    /// A 64-bit digest of which samples this manifest holds: every relative
    /// path and size, in order, and the record size. The root is left out,
    /// so copies of a dataset on two machines agree when they hold the same
    /// files; contents are not read. Not stable across ringfeed versions.
    pub fn digest(&self) -> u64 {
        let names = digest_bytes(0x6d61_6e69_6665_7374, self.files.names());
        let sizes = digest_words(names, self.files.sizes().iter().copied());
        let whole = digest_words(
            sizes,
            [self.files.len() as u64, self.record_bytes.unwrap_or(0)],
        );
        if let Some(windows) = &self.windows {
            return digest_words(whole ^ 0x746f_6b65_6e73, [windows.digest()]);
        }
        match &self.ranges {
            None => whole,
            Some(ranges) => {
                let objects = ranges.objects().iter().map(|&o| u64::from(o));
                let places = objects
                    .chain(ranges.offsets_bytes().iter().copied())
                    .chain(ranges.lens_bytes().iter().copied());
                digest_words(whole ^ 0x7461_725f_7261_6e67, places)
            }
        }
    }

    /// Sum of every file's size (ranges mode: of every sample's length).
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// Sum of the `count` largest sample sizes (all samples when `count >=
    /// len()`), to size a batch slot. In record mode `min(count, len) × N`.
    /// O(files × log count) in whole-file mode.
    pub fn largest_samples_total_bytes(&self, count: usize) -> u64 {
        let count = (count as u64).min(self.len);
        if let Some(record_bytes) = self.record_bytes {
            return count.saturating_mul(record_bytes);
        }
        if self.windows.is_some() {
            return count.saturating_mul(self.max_sample_bytes);
        }
        if count == self.len {
            return self.total_bytes;
        }
        match &self.ranges {
            Some(ranges) => largest_total(ranges.lens_bytes(), count),
            None => largest_total(self.files.sizes(), count),
        }
    }

    /// Size of the largest sample (N in record mode).
    pub fn max_sample_bytes(&self) -> u64 {
        self.max_sample_bytes
    }

    /// This manifest with `facts` about its samples' keys (ranges mode).
    pub fn with_key_facts(mut self, facts: KeyFacts) -> Manifest {
        self.key_facts = Some(Arc::new(facts));
        self
    }

    /// What indexing learnt of the samples' keys (tar shards); None for a
    /// manifest of whole objects or records, whose keys are its objects'.
    pub fn key_facts(&self) -> Option<&KeyFacts> {
        self.key_facts.as_deref()
    }

    /// Bytes of the longest sample key: a tar sample's key, else an
    /// object's (O(objects)).
    pub fn key_bytes_max(&self) -> u64 {
        match &self.key_facts {
            Some(facts) => facts.key_bytes_max,
            None => self
                .files
                .paths_bytes()
                .map(|k| k.len() as u64)
                .max()
                .unwrap_or(0),
        }
    }
}

/// Sum of the `count` largest of `sizes` (`count < sizes.len()`).
fn largest_total(sizes: &[u64], count: u64) -> u64 {
    // A min-heap of the `count` largest sizes seen so far.
    let mut largest: BinaryHeap<Reverse<u64>> = BinaryHeap::with_capacity(count as usize + 1);
    for &size_bytes in sizes {
        if largest.len() as u64 == count {
            // Full: only a size above the smallest kept gets in (most
            // datasets have many equal sizes; this skips them cheaply).
            match largest.peek() {
                Some(&Reverse(smallest)) if size_bytes > smallest => {
                    largest.pop();
                }
                _ => continue,
            }
        }
        largest.push(Reverse(size_bytes));
    }
    // Each is a sample's size; saturating, as ranges may overlap.
    largest
        .into_iter()
        .fold(0u64, |sum, Reverse(size)| sum.saturating_add(size))
}

/// Folds `words` into `seed`, four independent lanes (for speed: about 1 ms
/// per 100,000 paths) joined at the end. Not a cryptographic hash: it tells
/// different datasets apart by accident, not against an adversary.
pub fn digest_words(seed: u64, words: impl IntoIterator<Item = u64>) -> u64 {
    use crate::sampler::mix64;
    let mut lanes = [
        seed,
        seed ^ 0x9E37_79B9_7F4A_7C15,
        seed ^ 0x3C6E_F372_FE94_F82A,
        seed ^ 0xDAA6_6D2C_7DDF_743F,
    ];
    let mut count = 0u64;
    for w in words {
        let lane = &mut lanes[(count % 4) as usize];
        *lane = mix64(*lane ^ w);
        count += 1;
    }
    lanes.iter().fold(mix64(seed ^ count), |h, &l| mix64(h ^ l))
}

/// [`digest_words`] of `bytes` read as little-endian words, the last one
/// zero-padded, and their length.
pub fn digest_bytes(seed: u64, bytes: &[u8]) -> u64 {
    let chunks = bytes.chunks_exact(8);
    let tail = chunks.remainder();
    let mut last = [0u8; 8];
    last[..tail.len()].copy_from_slice(tail);
    let words = chunks.map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")));
    digest_words(
        seed ^ bytes.len() as u64,
        words.chain(std::iter::once(u64::from_le_bytes(last))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names objects under a root that need not exist.
    struct At(&'static str);

    impl ObjectNames for At {
        fn source_name(&self) -> PathBuf {
            PathBuf::from(self.0)
        }
        fn object_name(&self, key: &[u8]) -> PathBuf {
            Path::new(self.0).join(std::str::from_utf8(key).unwrap())
        }
    }

    fn manifest(sizes: &[u64], record_bytes: Option<u64>) -> Result<Manifest, ManifestError> {
        let mut files = FileList::new();
        for (i, &size_bytes) in sizes.iter().enumerate() {
            files.push(format!("f{i:03}").as_bytes(), size_bytes);
        }
        Manifest::from_objects(files, record_bytes, &At("/data"))
    }

    #[test]
    fn the_digest_tells_datasets_apart_but_not_where_they_lie() {
        let base = manifest(&[8, 0, 12, 4], Some(4)).unwrap().digest();
        let mut elsewhere = FileList::new();
        for (i, size) in [8, 0, 12, 4].into_iter().enumerate() {
            elsewhere.push(format!("f{i:03}").as_bytes(), size);
        }
        // Another machine's copy, under another root: the same digest.
        assert_eq!(
            Manifest::from_objects(elsewhere, Some(4), &At("/mnt/copy"))
                .unwrap()
                .digest(),
            base
        );
        // A size, a file, or the record size changed: another digest.
        assert_ne!(manifest(&[8, 0, 12, 8], Some(4)).unwrap().digest(), base);
        assert_ne!(manifest(&[8, 0, 12, 4, 0], Some(4)).unwrap().digest(), base);
        assert_ne!(manifest(&[8, 0, 12, 4], Some(2)).unwrap().digest(), base);
        let mut renamed = FileList::new();
        for (i, size) in [8, 0, 12, 4].into_iter().enumerate() {
            renamed.push(format!("g{i:03}").as_bytes(), size);
        }
        assert_ne!(
            Manifest::from_objects(renamed, Some(4), &At("/data"))
                .unwrap()
                .digest(),
            base
        );
        // Paths that only move bytes between names still differ.
        assert_ne!(digest_bytes(1, b"ab\0c\0"), digest_bytes(1, b"a\0bc\0"));
    }

    #[test]
    fn records_skip_over_empty_files() {
        let m = manifest(&[0, 8, 0, 0, 4, 0], Some(4)).unwrap();
        assert_eq!(m.len(), 3);
        let files: Vec<u32> = (0..3).map(|i| m.sample(i).file).collect();
        assert_eq!(files, [1, 1, 4]);
        assert_eq!(m.sample(1).offset_bytes, 4);
    }

    #[test]
    fn a_file_that_is_not_whole_records_is_named_under_its_source() {
        match manifest(&[8, 6], Some(4)) {
            Err(ManifestError::NotWholeRecords { path, .. }) => {
                assert_eq!(path, Path::new("/data/f001"))
            }
            other => panic!("expected NotWholeRecords, got {other:?}"),
        }
    }

    #[test]
    fn only_empty_files_in_record_mode_is_an_empty_source() {
        assert!(matches!(
            manifest(&[0, 0], Some(4)),
            Err(ManifestError::Empty { .. })
        ));
    }

    #[test]
    fn empty_files_are_samples_of_length_zero_in_whole_file_mode() {
        let m = manifest(&[0, 5], None).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(
            m.sample(0),
            SampleLoc {
                file: 0,
                offset_bytes: 0,
                len_bytes: 0
            }
        );
    }

    #[test]
    fn largest_samples_total_sums_the_biggest_files() {
        let m = manifest(&[5, 1, 9, 3, 9], None).unwrap();
        assert_eq!(m.largest_samples_total_bytes(0), 0);
        assert_eq!(m.largest_samples_total_bytes(2), 18);
        assert_eq!(m.largest_samples_total_bytes(3), 23);
        assert_eq!(m.largest_samples_total_bytes(99), 27);
        assert_eq!(m.max_sample_bytes(), 9);
        let records = manifest(&[8, 4], Some(4)).unwrap();
        assert_eq!(records.largest_samples_total_bytes(2), 8);
        assert_eq!(records.largest_samples_total_bytes(10), 12);
    }

    proptest::proptest! {
        /// Against the obvious answer: sort, take the largest `count`.
        #[test]
        fn largest_samples_total_is_the_sum_of_the_largest(
            sizes in proptest::collection::vec(0u64..20, 1..60),
            count in 0usize..70,
        ) {
            let m = manifest(&sizes, None).unwrap();
            let mut sorted = sizes.clone();
            sorted.sort_unstable_by(|a, b| b.cmp(a));
            let expected: u64 = sorted.iter().take(count).sum();
            proptest::prop_assert_eq!(m.largest_samples_total_bytes(count), expected);
        }
    }
}
