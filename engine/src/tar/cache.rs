//! The index cache: each shard's index on local disk, so that the next
//! start reads no headers. One file per shard under ringfeed's cache
//! directory (`tar-index/`, beside `manifests/`), named by a 128-bit digest
//! of the shard's identity (source, key, size, and mtime+inode or ETag);
//! its content is the sidecar format itself (`index.rs`), whose
//! `shard_bytes` and CRC are checked again on read. Written to a temporary
//! file (`O_EXCL`, 0600, a random name) and renamed, in a directory made
//! 0700; a file that does not parse is a miss. Read only if it is a regular
//! file of this user (or root), never through a link, never blocking on a
//! FIFO, and at most [`INDEX_FILE_BYTES_MAX`] bytes: a link to `/dev/zero`
//! there once took the loader's memory. The directory is used only if no
//! other user may write to it or to the cache directory above it (unless
//! sticky), as the data cache's (`source::private_dir`): an index names no
//! shard inside it, so one of another shard of the same size, renamed into
//! place by whoever controls the directory, would be believed.

use std::path::{Path, PathBuf};

use super::index::TarIndex;
use crate::manifest::digest_bytes;
use crate::source::private_dir::open_private_dir;

/// Most bytes of an index file read (from the cache, or a sidecar): far
/// past a real index (about 80 bytes a member); a longer file is a miss and
/// the shard is indexed from its headers.
pub const INDEX_FILE_BYTES_MAX: u64 = 1 << 30;

/// The directory's name under ringfeed's cache directory.
pub const INDEX_CACHE_DIR: &str = "tar-index";

/// Where shard indexes are kept.
#[derive(Clone, Debug)]
pub struct IndexCache {
    dir: PathBuf,
}

impl IndexCache {
    /// The index cache beside the manifest cache directory `manifests_dir`.
    pub fn beside(manifests_dir: &Path) -> IndexCache {
        IndexCache {
            dir: manifests_dir.with_file_name(INDEX_CACHE_DIR),
        }
    }

    /// The directory the indexes are kept in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of the shard whose identity is `identity`.
    pub fn path_of(&self, identity: &[u8]) -> PathBuf {
        let a = digest_bytes(0x7461_7269_6478_0001, identity);
        let b = digest_bytes(0x7461_7269_6478_0002, identity);
        self.dir.join(format!("{a:016x}{b:016x}.idx"))
    }

    /// The cached index of a shard of `shard_bytes` bytes, if a valid one is kept.
    pub fn get(&self, identity: &[u8], shard_bytes: u64) -> Option<TarIndex> {
        let path = self.path_of(identity);
        if !self.dir.exists() {
            return None;
        }
        // Never from a directory another user could have put files in
        // (theirs, or theirs to write): a root-owned index of another shard
        // of the same size, renamed there, would be believed.
        let dir = match open_private_dir(&self.dir) {
            Ok(dir) => dir,
            Err(e) => {
                tracing::debug!(
                    "tar index cache {}: {e}; the shard is indexed again",
                    self.dir.display()
                );
                return None;
            }
        };
        let name = path.file_name().unwrap_or_default();
        let bytes = match dir.read_trusted(name, INDEX_FILE_BYTES_MAX) {
            Ok(bytes) => bytes,
            Err(e) if e.is_not_found() => return None,
            Err(e) => {
                tracing::warn!("tar index cache: ignoring {e}; the shard is indexed again");
                return None;
            }
        };
        match TarIndex::parse(&bytes) {
            Ok(index) if index.shard_bytes == shard_bytes => Some(index),
            Ok(_) => None,
            Err(err) => {
                tracing::debug!(
                    "tar index cache {} is not valid ({err}); the shard is indexed again",
                    path.display()
                );
                None
            }
        }
    }

    /// Keeps `index` for the shard `identity` (temporary file, then rename).
    pub fn put(&self, identity: &[u8], index: &TarIndex) -> std::io::Result<()> {
        let dir = open_private_dir(&self.dir)?;
        let mut bytes = Vec::new();
        index.write(&mut bytes)?;
        let path = self.path_of(identity);
        dir.write_atomic(path.file_name().unwrap_or_default(), &bytes, 0o600, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn an_index_linked_to_dev_zero_or_too_long_is_a_miss_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let cache = IndexCache {
            dir: dir.path().join("tar-index"),
        };
        fs::create_dir(cache.dir()).unwrap();
        std::os::unix::fs::symlink("/dev/zero", cache.path_of(b"a")).unwrap();
        assert!(cache.get(b"a", 1024).is_none());
        let long = fs::File::create(cache.path_of(b"b")).unwrap();
        long.set_len(INDEX_FILE_BYTES_MAX + 1).unwrap();
        assert!(cache.get(b"b", 1024).is_none());
    }

    #[test]
    fn an_index_is_kept_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let cache = IndexCache::beside(&dir.path().join("manifests"));
        let shard = TarIndex {
            shard_bytes: 1024,
            members: Vec::new(),
            classes: Vec::new(),
        };
        cache.put(b"x", &shard).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(cache.dir()), 0o700);
        assert_eq!(mode(&cache.path_of(b"x")), 0o600);
        assert_eq!(cache.get(b"x", 1024), Some(shard));
    }

    // Issue 32, item 6: the tar-index directory was used whoever owned it
    // and whoever could write to it; only its files were checked. An index
    // names no shard inside it: one of another shard of the same size,
    // renamed into place there, was believed.
    #[test]
    fn an_index_in_a_directory_another_user_may_write_is_not_believed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let cache = IndexCache::beside(&dir.path().join("manifests"));
        let shard = TarIndex {
            shard_bytes: 1024,
            members: Vec::new(),
            classes: Vec::new(),
        };
        cache.put(b"x", &shard).unwrap();
        let set_mode =
            |p: &Path, m: u32| fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
        set_mode(dir.path(), 0o777);
        assert_eq!(cache.get(b"x", 1024), None);
        let e = cache.put(b"y", &shard).unwrap_err();
        assert!(e.to_string().contains("not sticky"), "{e}");
        set_mode(dir.path(), 0o1777);
        assert_eq!(cache.get(b"x", 1024), Some(shard.clone()));
        if crate::ring::safe_file::euid() == 0 {
            std::os::unix::fs::chown(cache.dir(), Some(65534), Some(65534)).unwrap();
            assert_eq!(cache.get(b"x", 1024), None);
            assert!(cache.put(b"y", &shard).is_err());
        }
    }
}
