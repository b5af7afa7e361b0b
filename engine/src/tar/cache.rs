//! The index cache: each shard's index on local disk, so that the next
//! start reads no headers. One file per shard under ringfeed's cache
//! directory (`tar-index/`, beside `manifests/`), named by a 128-bit digest
//! of the shard's identity (source, key, size, and mtime+inode or ETag);
//! its content is the sidecar format itself (`index.rs`), whose
//! `shard_bytes` and CRC are checked again on read. Written to a temporary
//! file and renamed; a file that does not parse is a miss.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::index::TarIndex;
use crate::manifest::digest_bytes;

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
        let bytes = fs::read(&path).ok()?;
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
        fs::create_dir_all(&self.dir)?;
        let path = self.path_of(identity);
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        let mut out = std::io::BufWriter::new(fs::File::create(&tmp)?);
        let written = index.write(&mut out).and_then(|()| out.flush());
        drop(out);
        match written.and_then(|()| fs::rename(&tmp, &path)) {
            Ok(()) => Ok(()),
            Err(err) => {
                let _ = fs::remove_file(&tmp);
                Err(err)
            }
        }
    }
}
