//! A local directory as a source: its regular files are the objects.
//!
//! - The objects are the *regular files* under the root, recursively; a
//!   file's key is its path relative to the root (`OsStr` bytes, `/`
//!   separators), and the order is byte-wise on keys.
//! - Symbolic links: a link to a regular file is that file (listed under the
//!   link's own path, with the target's size); a link to a directory is not
//!   followed (no cycles, no file listed twice); a dangling link is an error.
//!   A link to a file *outside* the root (once every link is resolved) is
//!   left out with one warning, unless [`LocalSource::follow_links_outside`]:
//!   a link planted by another user must not show their victim's files.
//!   Sockets, FIFOs and devices are skipped. The root itself may be a link.
//! - Listing is a parallel, work-stealing directory walk (`walk`), then one
//!   sort; the result does not depend on the thread count.
//! - A cached listing is valid while the tree's directories are unchanged
//!   (`check`).

mod check;
mod walk;

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::cache::ManifestCache;
use super::{Checked, LinkStamp, Listing, ObjectMeta, Source, Validity, VersionTag};
use crate::manifest::{
    FileList, Manifest, ManifestError, ManifestOptions, ManifestOrigin, ObjectNames,
    AUTO_LIST_THREADS_MAX, MAX_LIST_THREADS,
};

/// A local directory whose regular files are a dataset's objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalSource {
    /// The directory, as given.
    root: PathBuf,
    /// List links to files outside the root too.
    follow_outside: bool,
}

impl LocalSource {
    /// The directory `root`, checked to be one (a link to one is fine).
    pub fn open(root: &Path) -> Result<LocalSource, ManifestError> {
        check_root(root)?;
        Ok(LocalSource::at(root))
    }

    /// The directory `root`, unchecked (a manifest of it was built).
    pub fn at(root: &Path) -> LocalSource {
        LocalSource {
            root: root.to_path_buf(),
            follow_outside: false,
        }
    }

    /// This source, listing links to files outside its root too (when
    /// `follow`: `--follow-links-outside`).
    pub fn follow_links_outside(self, follow: bool) -> LocalSource {
        LocalSource {
            follow_outside: follow,
            ..self
        }
    }

    /// The directory, as given.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `root/key`: where object `key` is.
    pub fn path_of(&self, key: &[u8]) -> PathBuf {
        self.root.join(OsStr::from_bytes(key))
    }

    /// The root with every link resolved, or why it cannot be.
    fn canonical(&self) -> Result<PathBuf, String> {
        std::fs::canonicalize(&self.root)
            .map_err(|err| format!("cannot resolve {}: {err}", self.root.display()))
    }
}

impl ObjectNames for LocalSource {
    fn source_name(&self) -> PathBuf {
        self.root.clone()
    }

    fn object_name(&self, key: &[u8]) -> PathBuf {
        self.path_of(key)
    }
}

impl Source for LocalSource {
    fn list(&self, opts: &ManifestOptions) -> Result<Listing, ManifestError> {
        let listing = walk::list_files(
            &self.root,
            list_threads(opts.threads),
            opts.progress,
            self.follow_outside,
        )?;
        Ok(Listing {
            objects: listing.files,
            versions: None,
            validity: Validity::LocalTree {
                dirs: listing.dirs,
                links: listing.links,
            },
        })
    }

    fn head(&self, key: &[u8]) -> Result<ObjectMeta, ManifestError> {
        let path = self.path_of(key);
        // Follows a link, as the listing does.
        let meta =
            std::fs::metadata(&path).map_err(|source| ManifestError::Metadata { path, source })?;
        let stamp = check::stamp_of(PathBuf::new(), &meta);
        Ok(ObjectMeta {
            key: key.to_vec(),
            size_bytes: meta.len(),
            version: Some(VersionTag::Local {
                dev: stamp.dev,
                ino: stamp.ino,
                mtime: stamp.mtime,
            }),
        })
    }

    fn cache_identity(&self) -> Result<Vec<u8>, String> {
        self.canonical()
            .map(|canonical| canonical.into_os_string().into_encoded_bytes())
    }

    fn why_not_cacheable(
        &self,
        validity: &Validity,
        listed_at: SystemTime,
        cache: &ManifestCache,
    ) -> Option<String> {
        let Validity::LocalTree { dirs, .. } = validity else {
            return Some("not a local directory's listing".to_owned());
        };
        match self.canonical() {
            Ok(canonical) => check::why_not_stored(&canonical, dirs, listed_at, cache.racy_window),
            Err(why) => Some(why),
        }
    }

    fn check_cached(
        &self,
        objects: &FileList,
        validity: &Validity,
        cache: &ManifestCache,
        threads: usize,
    ) -> Result<Checked, String> {
        let Validity::LocalTree { dirs, links } = validity else {
            return Err("the cached listing is not a local directory's".to_owned());
        };
        check::check_tree(
            &self.canonical()?,
            objects,
            dirs,
            links,
            self.follow_outside,
            cache.stat_files_max,
            threads,
        )
    }

    fn warn_again(&self, validity: &Validity) {
        // Sockets, FIFOs and devices are not kept in the cache: only the
        // listing names those.
        let Validity::LocalTree { links, .. } = validity else {
            return;
        };
        // A link left out is to a non-file, or (the check found it still
        // so) to a file outside the root.
        let (outside, not_files): (Vec<LinkStamp>, Vec<LinkStamp>) = links
            .iter()
            .filter(|l| l.file_size.is_none())
            .cloned()
            .partition(|l| {
                std::fs::metadata(self.root.join(&l.rel_path)).is_ok_and(|m| m.is_file())
            });
        walk::warn_outside(
            &self.root,
            outside.into_iter().map(|l| l.rel_path).collect(),
        );
        walk::warn_left_out(
            &self.root,
            walk::links_not_followed(&self.root, &not_files)
                .into_iter()
                .collect(),
        );
    }
}

impl Manifest {
    /// Lists the directory `root` and builds its manifest.
    pub fn build(root: &Path, opts: &ManifestOptions) -> Result<Manifest, ManifestError> {
        if opts.record_bytes == Some(0) {
            return Err(ManifestError::ZeroRecordBytes);
        }
        super::build_manifest(&LocalSource::open(root)?, opts)
    }

    /// Like [`Manifest::build`], through the manifest cache
    /// ([`build_manifest_cached`](super::build_manifest_cached)).
    pub fn build_cached(
        root: &Path,
        opts: &ManifestOptions,
        cache: &ManifestCache,
        relist: bool,
    ) -> Result<(Manifest, ManifestOrigin), ManifestError> {
        if opts.record_bytes == Some(0) {
            return Err(ManifestError::ZeroRecordBytes);
        }
        super::build_manifest_cached(&LocalSource::open(root)?, opts, cache, relist)
    }
}

/// Listing threads for a requested count (0 = auto).
pub(crate) fn list_threads(requested: usize) -> usize {
    let threads = if requested == 0 {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores * 2).min(AUTO_LIST_THREADS_MAX)
    } else {
        requested
    };
    threads.clamp(1, MAX_LIST_THREADS)
}

/// The root must be an existing directory (a link to one is fine).
fn check_root(root: &Path) -> Result<(), ManifestError> {
    match std::fs::metadata(root) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(ManifestError::NotADirectory {
            path: root.to_path_buf(),
        }),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Err(ManifestError::SourceMissing {
            path: root.to_path_buf(),
        }),
        Err(source) => Err(ManifestError::Metadata {
            path: root.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_thread_count_is_bounded() {
        assert!((1..=AUTO_LIST_THREADS_MAX).contains(&list_threads(0)));
        assert_eq!(list_threads(1000), MAX_LIST_THREADS);
        assert_eq!(list_threads(3), 3);
    }

    #[test]
    fn head_gives_a_files_size_and_a_version_that_moves_when_it_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), b"12345").unwrap();
        let source = LocalSource::open(dir.path()).unwrap();
        let first = source.head(b"a").unwrap();
        assert_eq!((first.key.as_slice(), first.size_bytes), (&b"a"[..], 5));
        // Replaced by a new file of the same size (a new inode).
        std::fs::write(dir.path().join("b"), b"54321").unwrap();
        std::fs::rename(dir.path().join("b"), dir.path().join("a")).unwrap();
        let second = source.head(b"a").unwrap();
        assert_eq!(second.size_bytes, 5);
        assert_ne!(first.version, second.version);
        match source.head(b"gone") {
            Err(ManifestError::Metadata { path, .. }) => assert_eq!(path, dir.path().join("gone")),
            other => panic!("expected Metadata naming the file, got {other:?}"),
        }
    }

    #[test]
    fn an_object_is_named_under_the_root_as_given() {
        let source = LocalSource::at(Path::new("/data/set"));
        assert_eq!(
            source.object_name(b"a/b.bin"),
            Path::new("/data/set/a/b.bin")
        );
        assert_eq!(source.source_name(), Path::new("/data/set"));
    }
}
