//! Where `ringfeed pack` writes: a local directory (each file written as a
//! temporary name, synced, then renamed: a name that exists is whole) or a
//! remote prefix (each shard a multipart upload with parts in flight, which
//! the store makes visible only once complete).
//!
//! A local DEST may be shared with other users (a sticky scratch directory):
//! every file in it is opened through the directory's descriptor, never
//! through a link; temporaries are created `O_EXCL` under names nobody can
//! guess, and published with `renameat` (which replaces a planted name
//! itself, never what it points to); what is read back (the plan, indexes,
//! the size of a shard found there) is trusted only if it is a regular file
//! of this user (or root). A DEST every user may write to without the
//! sticky bit is refused: anyone could swap a published shard.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

use crate::remote::{Scheme, StoreHandle};
use crate::ring::safe_file::{Dir, TrustError};

/// Bytes of one multipart part (S3 needs at least 5 MiB but for the last).
pub const PART_BYTES: usize = 16 << 20;

/// Parts of one shard uploading at once.
pub const PARTS_IN_FLIGHT: usize = 8;

/// Bytes a local shard is written through.
const LOCAL_BUFFER_BYTES: usize = 1 << 20;

/// Most bytes of a small file (the plan, an index) read back from a local
/// DEST.
const SMALL_FILE_BYTES_MAX: u64 = 1 << 30;

/// Mode of the plan file (pack's own, removed at the end).
const PLAN_MODE: u32 = 0o600;

/// A local DEST, opened.
pub struct LocalDest {
    /// The directory, through which every file is opened.
    dir: Dir,
    /// Mode of the shards and their indexes.
    mode: u32,
}

/// DEST.
pub enum Dest {
    /// A local directory.
    Local(LocalDest),
    /// A remote prefix.
    Remote(StoreHandle),
}

/// A shard being written.
pub enum ShardWriter {
    /// To the temporary `tmp`, renamed to `name` when done.
    Local {
        /// The open temporary file.
        file: BufWriter<File>,
        /// Its name in DEST.
        tmp: String,
        /// The shard's name.
        name: String,
    },
    /// A multipart upload.
    Multipart(Box<WriteMultipart>, String),
    /// A store without multipart uploads (WebDAV): the shard is kept in
    /// memory and PUT whole.
    Buffered(Vec<u8>, String),
}

impl LocalDest {
    /// Opens the existing directory `path` (canonical) for shards of mode
    /// `mode`; refuses one every user may write to without the sticky bit.
    pub fn open(path: &Path, mode: u32) -> Result<LocalDest> {
        let dir =
            Dir::open(path).with_context(|| format!("cannot open --dest {}", path.display()))?;
        let (_, dir_mode) = dir
            .owner_and_mode()
            .with_context(|| format!("cannot stat --dest {}", path.display()))?;
        if dir_mode & 0o002 != 0 && dir_mode & 0o1000 == 0 {
            bail!(
                "--dest {} is writable by every user and not sticky (mode {dir_mode:04o}): anyone could replace the shards pack writes there; pick a DEST only you can write to, or make it sticky (chmod +t) or not world-writable (chmod o-w)",
                path.display()
            );
        }
        Ok(LocalDest { dir, mode })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn join(&self, name: &str) -> PathBuf {
        self.path().join(name)
    }

    /// `name` opened if it is a trusted file, None if there is none.
    fn open_trusted(&self, name: &str) -> Result<Option<File>> {
        match self.dir.open_trusted(OsStr::new(name)) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(trust_error(e)),
        }
    }

    fn read(&self, name: &str) -> Result<Option<Vec<u8>>> {
        match self
            .dir
            .read_trusted(OsStr::new(name), SMALL_FILE_BYTES_MAX)
        {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(trust_error(e)),
        }
    }
}

/// A file of DEST that is not pack's: the error, naming it and the fix.
fn trust_error(e: TrustError) -> anyhow::Error {
    match e {
        TrustError::Io { path, source } => {
            anyhow::Error::new(source).context(format!("cannot read {}", path.display()))
        }
        other => anyhow::anyhow!("--dest: {other}"),
    }
}

impl Dest {
    /// DEST as the user wrote it, for messages.
    pub fn display(&self) -> String {
        match self {
            Dest::Local(local) => local.path().display().to_string(),
            Dest::Remote(store) => store.display.trim_end_matches('/').to_string(),
        }
    }

    /// The bytes of `name` in DEST, None if there is no such file or object.
    pub async fn read(&self, name: &str) -> Result<Option<Vec<u8>>> {
        match self {
            Dest::Local(local) => local.read(name),
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
            Dest::Local(local) => match local.open_trusted(name)? {
                Some(file) => Ok(Some(
                    file.metadata()
                        .with_context(|| format!("cannot stat {}", local.join(name).display()))?
                        .len(),
                )),
                None => Ok(None),
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
            Dest::Local(local) => {
                let dir = local.path();
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
            Dest::Local(local) => match local.dir.remove(OsStr::new(name)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(e).with_context(|| format!("cannot remove {}", local.join(name).display()))
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
            Dest::Local(local) => {
                let mode = if name == super::PLAN_FILE {
                    PLAN_MODE
                } else {
                    local.mode
                };
                local
                    .dir
                    .write_atomic(OsStr::new(name), &bytes, mode, true)
                    .with_context(|| {
                        format!(
                            "cannot write {} (check that DEST is writable and has room)",
                            local.join(name).display()
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
            Dest::Local(local) => {
                let (file, tmp) = local
                    .dir
                    .create_temp(&format!(".{name}"), local.mode)
                    .with_context(|| {
                        format!(
                            "cannot create a temporary file for {} (check that DEST is writable)",
                            local.join(name).display()
                        )
                    })?;
                Ok(ShardWriter::Local {
                    file: BufWriter::with_capacity(LOCAL_BUFFER_BYTES, file),
                    tmp,
                    name: name.to_string(),
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
                .with_context(|| format!("cannot write {tmp} (is DEST full?)")),
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
            ShardWriter::Local { file, tmp, name } => {
                let Dest::Local(local) = dest else {
                    bail!("internal: a local shard for a remote DEST");
                };
                let file = file
                    .into_inner()
                    .map_err(|e| e.into_error())
                    .with_context(|| format!("cannot write {tmp} (is DEST full?)"))?;
                file.sync_all()
                    .with_context(|| format!("cannot sync {tmp}"))?;
                drop(file);
                let renamed = local.dir.rename(OsStr::new(&tmp), OsStr::new(&name));
                if renamed.is_err() {
                    let _ = local.dir.remove(OsStr::new(&tmp));
                }
                renamed.with_context(|| {
                    format!("cannot rename {tmp} to {}", local.join(&name).display())
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
    pub async fn abandon(self, dest: &Dest) {
        match self {
            ShardWriter::Local { tmp, file, .. } => {
                drop(file);
                if let Dest::Local(local) = dest {
                    let _ = local.dir.remove(OsStr::new(&tmp));
                }
            }
            ShardWriter::Multipart(upload, _) => {
                let _ = upload.abort().await;
            }
            ShardWriter::Buffered(..) => {}
        }
    }
}

/// Removes temporary files an interrupted run left in a local DEST: only
/// regular files of this user (another user's name, or a link, is left).
pub fn remove_stale_tmp(local: &LocalDest) {
    let Ok(entries) = fs::read_dir(local.path()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let text = name.to_string_lossy();
        // `.shard-NNNNNN.tar.<random>.tmp`, `.shard-NNNNNN.tar.idx.<random>.tmp`,
        // `..ringfeed-pack.plan.<random>.tmp` (and the fixed names of older versions).
        let ours = text.starts_with(".shard-") || text.starts_with("..ringfeed-pack");
        if ours && text.ends_with(".tmp") && local.dir.open_trusted(&name).is_ok() {
            let _ = local.dir.remove(&name);
        }
    }
}
