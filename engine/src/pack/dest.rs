//! Where `ringfeed pack` writes: a local directory (each file written as a
//! temporary name, synced, then renamed: a name that exists is whole) or a
//! remote prefix (each shard a multipart upload with parts in flight, which
//! the store makes visible only once complete).

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

use crate::remote::{Scheme, StoreHandle};

/// Bytes of one multipart part (S3 needs at least 5 MiB but for the last).
pub const PART_BYTES: usize = 16 << 20;

/// Parts of one shard uploading at once.
pub const PARTS_IN_FLIGHT: usize = 8;

/// Bytes a local shard is written through.
const LOCAL_BUFFER_BYTES: usize = 1 << 20;

/// DEST.
pub enum Dest {
    /// A local directory.
    Local(PathBuf),
    /// A remote prefix.
    Remote(StoreHandle),
}

/// A shard being written.
pub enum ShardWriter {
    /// To `tmp`, renamed to `path` when done.
    Local {
        /// The open temporary file.
        file: BufWriter<File>,
        /// Its name.
        tmp: PathBuf,
        /// The shard's name.
        path: PathBuf,
    },
    /// A multipart upload.
    Multipart(Box<WriteMultipart>, String),
    /// A store without multipart uploads (WebDAV): the shard is kept in
    /// memory and PUT whole.
    Buffered(Vec<u8>, String),
}

impl Dest {
    /// DEST as the user wrote it, for messages.
    pub fn display(&self) -> String {
        match self {
            Dest::Local(dir) => dir.display().to_string(),
            Dest::Remote(store) => store.display.trim_end_matches('/').to_string(),
        }
    }

    /// The bytes of `name` in DEST, None if there is no such file or object.
    pub async fn read(&self, name: &str) -> Result<Option<Vec<u8>>> {
        match self {
            Dest::Local(dir) => match fs::read(dir.join(name)) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => {
                    Err(e).with_context(|| format!("cannot read {}", dir.join(name).display()))
                }
            },
            Dest::Remote(store) => match store.meta.get(&store.path_of(name)).await {
                Ok(got) => Ok(Some(
                    got.bytes()
                        .await
                        .with_context(|| format!("cannot read {}/{name}", self.display()))?
                        .to_vec(),
                )),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e).with_context(|| format!("cannot read {}/{name}", self.display())),
            },
        }
    }

    /// The size of `name` in DEST, None if there is none.
    pub async fn size_of(&self, name: &str) -> Result<Option<u64>> {
        match self {
            Dest::Local(dir) => match fs::metadata(dir.join(name)) {
                Ok(meta) => Ok(Some(meta.len())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => {
                    Err(e).with_context(|| format!("cannot stat {}", dir.join(name).display()))
                }
            },
            Dest::Remote(store) => match store.meta.head(&store.path_of(name)).await {
                Ok(meta) => Ok(Some(meta.size)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e).with_context(|| format!("cannot HEAD {}/{name}", self.display())),
            },
        }
    }

    /// Names of the shards (`shard-*.tar`) DEST holds now.
    pub async fn shard_names(&self) -> Result<Vec<String>> {
        let is_shard = |n: &str| n.starts_with("shard-") && n.ends_with(".tar");
        match self {
            Dest::Local(dir) => {
                let entries =
                    fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
                Ok(entries
                    .flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| is_shard(n))
                    .collect())
            }
            Dest::Remote(store) => {
                let prefix = store.path_of("");
                let prefix = (!prefix.as_ref().is_empty()).then_some(prefix);
                let listed = store
                    .meta
                    .list_with_delimiter(prefix.as_ref())
                    .await
                    .with_context(|| format!("cannot list {}", self.display()))?;
                Ok(listed
                    .objects
                    .iter()
                    .filter_map(|o| o.location.filename().map(str::to_string))
                    .filter(|n| is_shard(n))
                    .collect())
            }
        }
    }

    /// Removes `name` from DEST (gone already is fine).
    pub async fn remove(&self, name: &str) -> Result<()> {
        match self {
            Dest::Local(dir) => match fs::remove_file(dir.join(name)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(e).with_context(|| format!("cannot remove {}", dir.join(name).display()))
                }
                _ => Ok(()),
            },
            Dest::Remote(store) => match store.meta.delete(&store.path_of(name)).await {
                Err(e) if !matches!(e, object_store::Error::NotFound { .. }) => {
                    Err(e).with_context(|| format!("cannot delete {}/{name}", self.display()))
                }
                _ => Ok(()),
            },
        }
    }

    /// Writes a small file whole (the plan, an index).
    pub async fn put_small(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        match self {
            Dest::Local(dir) => {
                let tmp = dir.join(format!(".{name}.tmp"));
                let write = || -> std::io::Result<()> {
                    let mut f = File::create(&tmp)?;
                    f.write_all(&bytes)?;
                    f.sync_all()?;
                    fs::rename(&tmp, dir.join(name))
                };
                write().with_context(|| {
                    format!(
                        "cannot write {} (check that DEST is writable and has room)",
                        dir.join(name).display()
                    )
                })
            }
            Dest::Remote(store) => {
                store
                    .meta
                    .put(&store.path_of(name), PutPayload::from(bytes))
                    .await
                    .with_context(|| {
                        format!(
                            "cannot upload {}/{name} ({})",
                            self.display(),
                            store.scheme.permission_fix()
                        )
                    })?;
                Ok(())
            }
        }
    }

    /// Starts shard `name`.
    pub async fn start_shard(&self, name: &str) -> Result<ShardWriter> {
        match self {
            Dest::Local(dir) => {
                let tmp = dir.join(format!(".{name}.tmp"));
                let file = File::create(&tmp).with_context(|| {
                    format!(
                        "cannot create {} (check that DEST is writable)",
                        tmp.display()
                    )
                })?;
                Ok(ShardWriter::Local {
                    file: BufWriter::with_capacity(LOCAL_BUFFER_BYTES, file),
                    tmp,
                    path: dir.join(name),
                })
            }
            Dest::Remote(store) if store.scheme == Scheme::Http => {
                Ok(ShardWriter::Buffered(Vec::new(), name.to_string()))
            }
            Dest::Remote(store) => {
                let upload = store
                    .meta
                    .put_multipart(&store.path_of(name))
                    .await
                    .with_context(|| {
                        format!(
                            "cannot start the upload of {}/{name} ({})",
                            self.display(),
                            store.scheme.permission_fix()
                        )
                    })?;
                Ok(ShardWriter::Multipart(
                    Box::new(WriteMultipart::new_with_chunk_size(upload, PART_BYTES)),
                    name.to_string(),
                ))
            }
        }
    }
}

impl ShardWriter {
    /// Appends `bytes` to the shard.
    pub async fn write(&mut self, bytes: &[u8]) -> Result<()> {
        match self {
            ShardWriter::Local { file, tmp, .. } => file
                .write_all(bytes)
                .with_context(|| format!("cannot write {} (is DEST full?)", tmp.display())),
            ShardWriter::Multipart(upload, name) => {
                upload
                    .wait_for_capacity(PARTS_IN_FLIGHT)
                    .await
                    .with_context(|| format!("uploading a part of {name} failed"))?;
                upload.write(bytes);
                Ok(())
            }
            ShardWriter::Buffered(buffer, _) => {
                buffer.extend_from_slice(bytes);
                Ok(())
            }
        }
    }

    /// Completes the shard: synced and renamed, or its upload completed.
    pub async fn finish(self, dest: &Dest) -> Result<()> {
        match self {
            ShardWriter::Local { file, tmp, path } => {
                let file = file
                    .into_inner()
                    .map_err(|e| e.into_error())
                    .with_context(|| format!("cannot write {} (is DEST full?)", tmp.display()))?;
                file.sync_all()
                    .with_context(|| format!("cannot sync {}", tmp.display()))?;
                fs::rename(&tmp, &path).with_context(|| {
                    format!("cannot rename {} to {}", tmp.display(), path.display())
                })?;
                Ok(())
            }
            ShardWriter::Multipart(upload, name) => {
                upload.finish().await.with_context(|| {
                    format!("completing the upload of {}/{name} failed", dest.display())
                })?;
                Ok(())
            }
            ShardWriter::Buffered(buffer, name) => {
                let Dest::Remote(store) = dest else {
                    anyhow::bail!("internal: a buffered shard for a local DEST");
                };
                store
                    .meta
                    .put(&store.path_of(&name), PutPayload::from(buffer))
                    .await
                    .with_context(|| {
                        format!(
                            "cannot upload {}/{name} ({})",
                            dest.display(),
                            store.scheme.permission_fix()
                        )
                    })?;
                Ok(())
            }
        }
    }

    /// Gives the shard up (an error elsewhere): removes the temporary file,
    /// aborts the upload.
    pub async fn abandon(self) {
        match self {
            ShardWriter::Local { tmp, .. } => {
                let _ = fs::remove_file(tmp);
            }
            ShardWriter::Multipart(upload, _) => {
                let _ = upload.abort().await;
            }
            ShardWriter::Buffered(..) => {}
        }
    }
}

/// Removes temporary files an interrupted run left in a local DEST.
pub fn remove_stale_tmp(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        // `.shard-NNNNNN.tar.tmp`, `.shard-NNNNNN.tar.idx.tmp`, `..ringfeed-pack.plan.tmp`.
        let ours = name.starts_with(".shard-") || name.starts_with("..ringfeed-pack");
        if ours && name.ends_with(".tmp") {
            let _ = fs::remove_file(entry.path());
        }
    }
}
