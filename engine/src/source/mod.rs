//! Sources: WHERE a dataset's objects live. The only layer that knows
//! paths, listing, URLs and (through `crate::remote`) credentials.
//!
//! A [`Source`] lists its objects, says whether a listing kept in the
//! manifest cache still describes it, and names itself and its objects in
//! messages. Everything above (manifest, sampler, planner, loader) sees
//! objects only: a **key** (the object's path relative to the source's root
//! or prefix, `/`-separated, in byte-wise order), a **size**, and the
//! evidence a cache needs to trust an old listing.
//!
//! - `local`: a directory on a local (or network) file system, listed by a
//!   parallel walk; a cached listing is valid while every directory's
//!   (device, inode, mtime, ctime) and every link's target are unchanged.
//! - `remote`: a remote prefix (S3, GCS, Azure, HTTP): keys from a parallel,
//!   paginated listing; its evidence the listing time (an age limit) and the
//!   objects' ETags ([`Validity::Remote`]), with a re-list in the background
//!   (`relist`) that stops the run when the prefix changed.
//!
//! [`build_manifest`] and [`build_manifest_cached`] turn any source into a
//! [`Manifest`]; `cache` keeps listings on local disk.

pub(crate) mod cache;
pub mod local;
pub(crate) mod private_dir;
pub mod published;
pub mod relist;
pub mod remote;
mod spec;

use std::path::PathBuf;
use std::time::SystemTime;

use crate::manifest::{
    FileList, Manifest, ManifestError, ManifestOptions, ManifestOrigin, ObjectNames,
};

/// The evidence a listing keeps of directories and links: the manifest's
/// cache format stores it, so it lives there; the local source makes it.
pub use crate::manifest::{DirStamp, LinkStamp};
pub use cache::{
    is_stale_tmp, ManifestCache, NotACacheFile, DEFAULT_RACY_WINDOW, DEFAULT_REMOTE_MAX_AGE,
    DEFAULT_STAT_FILES_MAX, TMP_STALE_AFTER,
};
pub use local::LocalSource;
pub use remote::RemoteSource;
pub use spec::{OpenedSource, SourceSpec};

/// What tells one version of an object from the next, where the source
/// has such a tag: a fetch can insist on the version the manifest was
/// built from (`If-Match`), and a cache can tell a changed object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionTag {
    /// A local file: its inode and mtime.
    Local {
        /// Device of the file.
        dev: u64,
        /// Inode of the file.
        ino: u64,
        /// (seconds, nanoseconds) since the Unix epoch.
        mtime: (i64, u32),
    },
    /// A remote object's ETag, as the store sent it.
    ETag(Box<str>),
}

/// One object as its source describes it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectMeta {
    /// Path relative to the source's root or prefix.
    pub key: Vec<u8>,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Its version, where the source has one.
    pub version: Option<VersionTag>,
}

/// What a listing recorded so that a later start can tell whether it still
/// describes the source (kept in the manifest cache beside the objects).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Validity {
    /// A local directory tree: valid while every directory and link is
    /// unchanged (see `local`).
    LocalTree {
        /// Every directory listed, the root included (empty relative path).
        dirs: Vec<DirStamp>,
        /// Every symbolic link met, and what it pointed to.
        links: Vec<LinkStamp>,
    },
    /// A remote prefix's listing: used from the cache while younger than
    /// `ManifestCache::remote_max_age`, and listed again in the background
    /// (`remote::relist`); a read insists on each object's ETag.
    Remote {
        /// When the listing began.
        listed_at: SystemTime,
        /// Each object's ETag and a NUL, in manifest order (empty where the
        /// store gave none).
        etags: Vec<u8>,
    },
    /// A listing with no evidence a later start could check (a `--keys`
    /// file's): never kept in the manifest cache.
    Unchecked,
}

/// What a source's listing found.
#[derive(Debug)]
pub struct Listing {
    /// The objects: keys in byte-wise order (strictly increasing), sizes.
    pub objects: FileList,
    /// Each object's version, in the same order, where the listing has them
    /// at no extra cost (a remote listing's ETags). None for a local tree:
    /// 20 bytes a file would be a third of the manifest's memory, and local
    /// reads check sizes instead (see `reader`).
    pub versions: Option<Vec<VersionTag>>,
    /// The evidence a cache keeps to check the listing later.
    pub validity: Validity,
}

/// What checking a cached listing looked at, for the log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checked {
    /// Directories (or, remotely, prefixes) found unchanged.
    pub dirs_checked: usize,
    /// Objects whose size was checked.
    pub files_checked: usize,
}

/// Where objects live: listing, validity of a cached listing, names.
pub trait Source: ObjectNames + Send + Sync {
    /// Lists every object (keys in byte-wise order, sizes), showing
    /// progress as `opts.progress` asks, with up to `opts.threads` listing
    /// threads (0: the source's default).
    fn list(&self, opts: &ManifestOptions) -> Result<Listing, ManifestError>;

    /// Object `key` as it is now (a `stat`; a `HEAD`): its size and
    /// version. An object that is gone is an error naming it.
    fn head(&self, key: &[u8]) -> Result<ObjectMeta, ManifestError>;

    /// The bytes that name this source's manifest cache entry (a directory's
    /// canonical path; a bucket and prefix), or why it can have none.
    fn cache_identity(&self) -> Result<Vec<u8>, String>;

    /// `None` when a listing that began at `listed_at` may be kept in the
    /// cache; otherwise why not (said in the log: the next start lists).
    fn why_not_cacheable(
        &self,
        validity: &Validity,
        listed_at: SystemTime,
        cache: &ManifestCache,
    ) -> Option<String>;

    /// Whether a cached listing (`objects` and the `validity` recorded with
    /// them) still describes the source: what was checked, or what changed.
    fn check_cached(
        &self,
        objects: &FileList,
        validity: &Validity,
        cache: &ManifestCache,
        threads: usize,
    ) -> Result<Checked, String>;

    /// Says again, at a start from the cache, what the listing warned of
    /// (what it left out), so that a cached start is not quieter.
    fn warn_again(&self, _validity: &Validity) {}
}

/// Lists `source` and builds its manifest.
pub fn build_manifest(
    source: &dyn Source,
    opts: &ManifestOptions,
) -> Result<Manifest, ManifestError> {
    if opts.record_bytes == Some(0) {
        return Err(ManifestError::ZeroRecordBytes);
    }
    let listing = source.list(opts)?;
    Manifest::from_objects(listing.objects, opts.record_bytes, &NamesOf(source))
}

/// Like [`build_manifest`], but takes the manifest from `cache` when the
/// cached one of `source` is still valid, and stores a new listing there.
/// `relist` lists even when the cache is valid (and stores the result). A
/// cache that cannot be read or written never fails the build: the listing
/// is the fallback, and `ManifestOrigin` says why.
pub fn build_manifest_cached(
    source: &dyn Source,
    opts: &ManifestOptions,
    cache: &ManifestCache,
    relist: bool,
) -> Result<(Manifest, ManifestOrigin), ManifestError> {
    if opts.record_bytes == Some(0) {
        return Err(ManifestError::ZeroRecordBytes);
    }
    let identity = match source.cache_identity() {
        Ok(identity) => identity,
        Err(why) => {
            let manifest = build_manifest(source, opts)?;
            return Ok((
                manifest,
                ManifestOrigin::Listed {
                    path: None,
                    cache_miss: why.clone(),
                    not_stored: Some(why),
                },
            ));
        }
    };
    let entry = cache.entry_path_of(&identity);
    let cache_miss = if relist {
        "asked to list again".to_owned()
    } else {
        match cache.lookup(source, &identity, local::list_threads(opts.threads)) {
            cache::Lookup::Hit {
                files,
                validity,
                checked,
            } => match Manifest::from_objects(files, opts.record_bytes, &NamesOf(source)) {
                Ok(manifest) => {
                    // The listing said it once; say it at every start.
                    source.warn_again(&validity);
                    return Ok((
                        manifest,
                        ManifestOrigin::Cached {
                            path: entry,
                            dirs_checked: checked.dirs_checked,
                            files_checked: checked.files_checked,
                        },
                    ));
                }
                // Sizes the checks could not see may be stale: a listing
                // decides.
                Err(err) => format!("the cached files do not make a manifest ({err})"),
            },
            cache::Lookup::Miss(why) => why,
        }
    };
    let listed_at = SystemTime::now();
    let listing = source.list(opts)?;
    // Check the objects before storing them: a listing that is not a
    // manifest is not cached.
    let manifest = Manifest::from_objects(listing.objects, opts.record_bytes, &NamesOf(source))?;
    let not_stored = match cache.store(
        source,
        &identity,
        listed_at,
        &listing.validity,
        manifest.files(),
    ) {
        Ok(None) => None,
        Ok(Some(why)) => Some(why),
        Err(err) => {
            tracing::warn!(
                "cannot write the manifest cache in {}: {err}; every start will list {} again \
                 (make it writable, point RINGFEED_CACHE_DIR or --cache-dir elsewhere, or pass --manifest-cache off)",
                cache.dir.display(),
                source.source_name().display()
            );
            Some(format!("cannot write in {}: {err}", cache.dir.display()))
        }
    };
    if not_stored.is_some() {
        // An older entry must not outlive a listing that replaced it.
        if let Err(err) = cache::forget_entry(&entry) {
            tracing::warn!(
                "cannot remove the stale manifest cache {}: {err}; remove it by hand",
                entry.display()
            );
        }
    }
    Ok((
        manifest,
        ManifestOrigin::Listed {
            path: Some(entry),
            cache_miss,
            not_stored,
        },
    ))
}

/// A source seen as the names it gives (a `&dyn Source` as a
/// `&dyn ObjectNames`, without trait upcasting, which is newer than this
/// crate's minimum Rust).
struct NamesOf<'a>(&'a dyn Source);

impl ObjectNames for NamesOf<'_> {
    fn source_name(&self) -> PathBuf {
        self.0.source_name()
    }

    fn object_name(&self, key: &[u8]) -> PathBuf {
        self.0.object_name(key)
    }
}
