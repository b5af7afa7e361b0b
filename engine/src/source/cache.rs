//! The manifest cache on local disk: a source's listing kept in a file, so
//! that the next loader over the same source starts without listing it.
//!
//! This is the I/O: where the files live, how one is written atomically,
//! read back without trusting it, and removed. The bytes inside are
//! `crate::manifest::format`'s; whether a cached listing is still valid is
//! the source's to say ([`Source::check_cached`]). docs/manifest.md explains
//! the rules at length:
//!
//! - One file per source, named by a hash of its identity (a directory's
//!   canonical path), which is stored inside (a collision is a miss).
//! - A cache file that is missing, unreadable, corrupt (CRC-32 over the whole
//!   file), of another format version or of another source is a miss, never
//!   an error. One that cannot be written is a warning. Files are written
//!   under a unique temporary name and renamed, so a loader never reads half
//!   of one.
//! - A file of a source found changed while it is read is removed by the
//!   loader ([`ManifestCache::forget_file`]), so the next start lists.

use std::fs;
use std::io::{self, BufReader, BufWriter};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use crate::manifest::format::NotACacheFile;
use crate::manifest::format::{self, IO_CHUNK_BYTES, RESERVE_BYTES_MAX};
use crate::manifest::FileList;

use super::{Checked, Source, Validity};

/// Temporary files older than this are left by a writer that died.
pub const TMP_STALE_AFTER: Duration = Duration::from_secs(600);

/// Default of [`ManifestCache::racy_window`]: generous against clock steps
/// and coarse file-system timestamps.
pub const DEFAULT_RACY_WINDOW: Duration = Duration::from_secs(2);
/// Default of [`ManifestCache::stat_files_max`]: about 4 ms of `stat` calls
/// on the test VM.
pub const DEFAULT_STAT_FILES_MAX: usize = 4_096;
/// Default of [`ManifestCache::remote_max_age`] (`--manifest-max-age`): a
/// remote listing older than this is listed again before serving.
pub const DEFAULT_REMOTE_MAX_AGE: Duration = Duration::from_secs(3_600);

/// Where cached manifests live, and how they are checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestCache {
    /// The directory holding the cache files (created on first store, 0700).
    pub dir: PathBuf,
    /// A listing is not stored when one of its directories' ctime is less
    /// than this before the listing began.
    pub racy_window: Duration,
    /// Check every file's size on a hit when there are at most this many.
    pub stat_files_max: usize,
    /// A remote listing is used from the cache while it is younger than
    /// this (and listed again in the background); zero: always list.
    pub remote_max_age: Duration,
}

/// What happened when a cached manifest was looked for.
#[derive(Debug)]
pub(crate) enum Lookup {
    /// Valid: the files, in manifest order.
    Hit {
        files: FileList,
        /// What the listing recorded (to say again what it left out).
        validity: Validity,
        checked: Checked,
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
            remote_max_age: DEFAULT_REMOTE_MAX_AGE,
        }
    }

    /// The manifests directory under ringfeed's cache directory `base`, or
    /// under the default one: `$RINGFEED_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/ringfeed` (if absolute), else
    /// `~/.cache/ringfeed` (the home of `crate::home`: never the working
    /// directory). None when there is none.
    pub fn dir_under(base: Option<&Path>) -> Option<PathBuf> {
        let nonempty = |var: &str| {
            std::env::var_os(var)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let base = match base {
            Some(base) => base.to_path_buf(),
            None => nonempty("RINGFEED_CACHE_DIR")
                .or_else(|| crate::home::xdg("XDG_CACHE_HOME").map(|d| d.join("ringfeed")))
                .or_else(|| crate::home::file(".cache/ringfeed"))?,
        };
        Some(base.join("manifests"))
    }

    /// The cache file of the directory whose canonical path is `canonical_root`.
    pub fn entry_path(&self, canonical_root: &Path) -> PathBuf {
        self.entry_path_of(canonical_root.as_os_str().as_bytes())
    }

    /// The cache file of the source whose identity is `identity`
    /// ([`Source::cache_identity`]).
    pub fn entry_path_of(&self, identity: &[u8]) -> PathBuf {
        self.dir
            .join(format!("{:016x}.manifest", fnv1a64(identity)))
    }

    /// Looks for a valid cached manifest of `source` (whose identity is
    /// `identity`), checking with up to `threads` threads.
    pub(crate) fn lookup(&self, source: &dyn Source, identity: &[u8], threads: usize) -> Lookup {
        let path = self.entry_path_of(identity);
        if self.dir.exists() {
            // Not from a directory another user may write to (issue 32).
            if let Err(err) = super::private_dir::open_private_dir(&self.dir) {
                return Lookup::Miss(format!("cannot use {}: {err}", self.dir.display()));
            }
        }
        let (file, len) = match open_cache_file(&path) {
            Ok((file, meta)) => (file, meta.len()),
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                return Lookup::Miss("no cached manifest".into())
            }
            Err(err) => return Lookup::Miss(format!("cannot read {}: {err}", path.display())),
        };
        let decoded = match format::decode_from(
            BufReader::with_capacity(IO_CHUNK_BYTES, file),
            len,
            identity,
        ) {
            Ok(decoded) => decoded,
            Err(why) => return Lookup::Miss(format!("{} is not usable: {why}", path.display())),
        };
        let validity = match decoded.etags {
            Some(etags) => Validity::Remote {
                listed_at: decoded.listed_at,
                etags,
            },
            None => Validity::LocalTree {
                dirs: decoded.dirs,
                links: decoded.links,
            },
        };
        match source.check_cached(&decoded.files, &validity, self, threads) {
            Ok(checked) => Lookup::Hit {
                files: decoded.files,
                validity,
                checked,
            },
            Err(why) => Lookup::Miss(why),
        }
    }

    /// Stores a listing of `source` (identity `identity`) that began at
    /// `listed_at`. `Ok(None)`: stored; `Ok(Some(why))`: deliberately not
    /// stored (the source said why).
    pub(crate) fn store(
        &self,
        source: &dyn Source,
        identity: &[u8],
        listed_at: SystemTime,
        validity: &Validity,
        files: &FileList,
    ) -> io::Result<Option<String>> {
        if let Some(why) = source.why_not_cacheable(validity, listed_at, self) {
            return Ok(Some(why));
        }
        if let Validity::Unchecked = validity {
            return Ok(Some(
                "the listing has nothing a later start could check".to_owned(),
            ));
        }
        // Made 0700, and refused if another user may write to it (issue 32).
        super::private_dir::open_private_dir(&self.dir)?;
        let path = self.entry_path_of(identity);
        // Unique among processes, hosts sharing the directory and threads.
        static STORES: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let mut tmp_name = path.clone().into_os_string();
        tmp_name.push(format!(
            ".tmp.{}.{nanos}.{}",
            std::process::id(),
            STORES.fetch_add(1, Ordering::Relaxed)
        ));
        let tmp = PathBuf::from(tmp_name);
        let written = (|| {
            let file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            let mut out = BufWriter::with_capacity(IO_CHUNK_BYTES, file);
            match validity {
                Validity::LocalTree { dirs, links } => {
                    format::encode_to(&mut out, identity, listed_at, dirs, links, files)?
                }
                Validity::Remote { etags, .. } => {
                    format::encode_remote_to(&mut out, identity, listed_at, files, etags)?
                }
                // Refused above; never an empty file.
                Validity::Unchecked => {
                    return Err(io::Error::other("a listing with nothing to check"))
                }
            }
            out.into_inner().map_err(io::IntoInnerError::into_error)?;
            fs::rename(&tmp, &path)
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written.map(|()| None)
    }

    /// Removes the cached manifest of `canonical_root`, if any: a file of it
    /// was found changed, so the next start must list again. `Ok(true)`: it
    /// was there and is gone.
    pub fn forget(&self, canonical_root: &Path) -> io::Result<bool> {
        forget_entry(&self.entry_path(canonical_root))
    }

    /// Removes the cache file `path` (from [`ManifestOrigin::cache_file`](crate::manifest::ManifestOrigin::cache_file)).
    /// `Ok(true)`: it was there and is gone; `Ok(false)`: it was not there.
    pub fn forget_file(path: &Path) -> io::Result<bool> {
        forget_entry(path)
    }

    /// The root recorded in a cache file (for `gc`), once the whole file
    /// was read and found valid. A newer format's file is told apart by its
    /// header and its CRC-32, so a damaged file whose version field reads
    /// high is still `Unusable`.
    pub fn root_of(path: &Path) -> Result<PathBuf, NotACacheFile> {
        let (file, meta) =
            open_cache_file(path).map_err(|err| NotACacheFile::Unusable(err.to_string()))?;
        Self::root_of_open(file, &meta)
    }

    /// [`ManifestCache::root_of`] for a cache file already opened (a
    /// regular file of ours, `meta` its metadata): `gc` opens it through
    /// its directory's descriptor.
    pub fn root_of_open(file: fs::File, meta: &fs::Metadata) -> Result<PathBuf, NotACacheFile> {
        format::root_of(
            BufReader::with_capacity(IO_CHUNK_BYTES, file),
            meta.len(),
            || {
                // A newer file's CRC is checked by reading it all; a file
                // whose length is mostly holes would take that long for
                // nothing.
                if meta.len() > RESERVE_BYTES_MAX
                    && meta.blocks().saturating_mul(512) < meta.len() / 8
                {
                    return Err(format!(
                        "{} bytes long but {} on disk: not a file ringfeed wrote",
                        meta.len(),
                        meta.blocks() * 512
                    ));
                }
                Ok(())
            },
        )
    }
}

/// Removes the cache file `path`. `Ok(true)`: it was there and is gone.
pub(crate) fn forget_entry(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        // ENOTDIR: a part of the path is a file, so there is no cache file.
        Err(err)
            if err.kind() == io::ErrorKind::NotFound
                || err.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            Ok(false)
        }
        Err(err) => Err(err),
    }
}

/// Opens a cache file without following a link, without blocking on a FIFO
/// and only if it is a regular file of this user (or root); returns it and
/// its metadata.
fn open_cache_file(path: &Path) -> io::Result<(fs::File, fs::Metadata)> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    // Another user's file in a shared cache directory is not believed.
    if !crate::ring::safe_file::trusted_owner(meta.uid()) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "it belongs to uid {}, not to this user: not trusted; remove it",
                meta.uid()
            ),
        ));
    }
    Ok((file, meta))
}

/// FNV-1a, 64 bits: the cache file name of a source (collisions are caught
/// by the identity stored inside).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Whether a temporary cache file (`NAME.manifest.tmp.*`) was left by a
/// writer long gone: older than [`TMP_STALE_AFTER`].
pub fn is_stale_tmp(meta: &fs::Metadata) -> bool {
    let modified = UNIX_EPOCH + Duration::new(meta.mtime().max(0) as u64, 0);
    SystemTime::now()
        .duration_since(modified)
        .is_ok_and(|age| age > TMP_STALE_AFTER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Duration;

    use crate::manifest::format::{encode, FORMAT_VERSION};

    fn sample_bytes(root: &[u8]) -> Vec<u8> {
        let mut files = FileList::new();
        files.push(b"a", 1);
        let dirs = vec![super::super::DirStamp {
            rel_path: PathBuf::new(),
            dev: 1,
            ino: 2,
            mtime: (1, 0),
            ctime: (1, 0),
        }];
        encode(root, SystemTime::now(), &dirs, &[], &files)
    }

    #[test]
    fn a_valid_file_on_disk_gives_its_root_and_a_newer_one_is_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.manifest");
        fs::write(&path, sample_bytes(b"/data/set")).unwrap();
        assert_eq!(
            ManifestCache::root_of(&path),
            Ok(PathBuf::from("/data/set"))
        );
        let mut bytes = sample_bytes(b"/r");
        bytes.truncate(bytes.len() - 4);
        bytes[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        fs::write(&path, &bytes).unwrap();
        assert_eq!(
            ManifestCache::root_of(&path),
            Err(NotACacheFile::NewerVersion(FORMAT_VERSION + 1))
        );
    }

    /// A newer format is kept only once its CRC is read and checked: a
    /// file that is mostly holes is refused without reading them.
    #[test]
    fn a_sparse_newer_format_file_is_refused_without_reading_it() {
        let mut head = sample_bytes(b"/r");
        head[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.manifest");
        let file = fs::File::create(&path).unwrap();
        (&file).write_all(&head).unwrap();
        file.set_len(1 << 40).unwrap();
        let started = std::time::Instant::now();
        match ManifestCache::root_of(&path) {
            Err(NotACacheFile::Unusable(why)) => assert!(why.contains("on disk"), "{why}"),
            other => panic!("expected unusable, got {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "read the holes"
        );
    }
}
