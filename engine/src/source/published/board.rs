//! Where published manifests and their heads live: under a prefix of an
//! object store (beside the data, `PREFIX/.ringfeed/`, or a URL the user
//! gives), or in a directory of a file system every node mounts.
//!
//! Every read is bounded before it starts: a head by `HEAD_BYTES_MAX`, a
//! manifest by the size its head states (and `MANIFEST_BYTES_MAX`). A
//! directory's files are read only if they are regular files of this user
//! (or root), never through a link or a FIFO; the directory is made 0700
//! and refused if another user could write to it. Writes are whole: a store
//! PUT, or a private temporary renamed (or linked, for create-only) into
//! place.

use std::ffi::OsStr;
use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path as StorePath;
use object_store::{GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::remote::{RemoteRuntime, StoreHandle};
use crate::ring::safe_file::Dir;

/// Bytes of a manifest above which a store PUT is a multipart upload.
const SINGLE_PUT_BYTES_MAX: usize = 64 << 20;
/// Part size of a multipart upload of a manifest.
const PART_BYTES: usize = 16 << 20;
/// Mode of a published file in a directory.
const FILE_MODE: u32 = 0o600;

/// Why the board could not be read or written (the location, and what went
/// wrong there).
#[derive(Debug, thiserror::Error)]
#[error("{at}: {detail}")]
pub struct BoardError {
    /// The object or file, as shown.
    pub at: String,
    /// What went wrong.
    pub detail: String,
}

/// What `Board::open` reads with.
pub type Reader = Box<dyn Read + Send>;

/// How a create-only write ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Created {
    /// Written.
    Written,
    /// Another writer's object was there first; nothing was written.
    Exists,
}

/// A place published manifests live.
pub enum Board {
    /// Under `prefix` of an object store.
    Store {
        /// The store (its listing and HEAD client, with object_store's retries).
        store: Arc<dyn ObjectStore>,
        /// Where the board's objects start.
        prefix: StorePath,
        /// The runtime its requests run on.
        runtime: Arc<RemoteRuntime>,
        /// `scheme://bucket/prefix/`, for messages.
        shown: String,
    },
    /// A directory (0700, ours).
    Dir(Dir),
}

impl std::fmt::Debug for Board {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe(""))
    }
}

impl Board {
    /// The board at `store`'s prefix, or under `sub` of it.
    pub fn in_store(store: &StoreHandle, sub: Option<&str>, runtime: Arc<RemoteRuntime>) -> Board {
        let (prefix, shown) = match sub {
            Some(sub) => (
                store.path_of(sub),
                format!("{}/{sub}/", store.display.trim_end_matches('/')),
            ),
            None => (
                store.prefix.clone(),
                format!("{}/", store.display.trim_end_matches('/')),
            ),
        };
        Board::Store {
            store: Arc::clone(&store.meta),
            shown,
            prefix,
            runtime,
        }
    }

    /// The board in directory `dir`, made 0700 if missing (and its parent);
    /// refused when another user owns it or could write to its parent.
    pub fn in_dir(dir: PathBuf) -> Result<Board, BoardError> {
        crate::source::private_dir::open_private_dir(&dir)
            .map(Board::Dir)
            .map_err(|e| BoardError {
                at: dir.display().to_string(),
                detail: format!("cannot use it as the place of published manifests: {e}"),
            })
    }

    /// Where `name` is, for messages (the board itself for "").
    pub fn describe(&self, name: &str) -> String {
        match self {
            Board::Store { shown, .. } => format!("{shown}{name}"),
            Board::Dir(dir) => dir.path().join(name).display().to_string(),
        }
    }

    fn err(&self, name: &str, detail: impl std::fmt::Display) -> BoardError {
        BoardError {
            at: self.describe(name),
            detail: detail.to_string(),
        }
    }

    fn path(prefix: &StorePath, name: &str) -> StorePath {
        prefix.clone().join(name)
    }

    /// Reads `name` whole if it is at most `max_bytes`; None when it does not exist.
    pub fn get_small(&self, name: &str, max_bytes: u64) -> Result<Option<Vec<u8>>, BoardError> {
        let Some((mut reader, _)) = self.open(name, max_bytes)? else {
            return Ok(None);
        };
        let mut bytes = Vec::new();
        (&mut reader)
            .take(max_bytes + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| self.err(name, e))?;
        Ok(Some(bytes))
    }

    /// Opens `name` to read it, with its length, refusing it past
    /// `max_bytes`; None when it does not exist. The reader never yields
    /// more than that length.
    pub fn open(&self, name: &str, max_bytes: u64) -> Result<Option<(Reader, u64)>, BoardError> {
        let check_len = |len: u64| -> Result<(), BoardError> {
            if len > max_bytes {
                return Err(self.err(
                    name,
                    format!("it is {len} bytes, more than the {max_bytes} allowed: not what ringfeed writes there"),
                ));
            }
            Ok(())
        };
        match self {
            Board::Dir(dir) => {
                let file = match dir.open_trusted(OsStr::new(name)) {
                    Ok(file) => file,
                    Err(e) if e.is_not_found() => return Ok(None),
                    Err(e) => return Err(self.err(name, e)),
                };
                let len = file.metadata().map_err(|e| self.err(name, e))?.len();
                check_len(len)?;
                Ok(Some((Box::new(file.take(len)), len)))
            }
            Board::Store {
                store,
                prefix,
                runtime,
                ..
            } => {
                let path = Self::path(prefix, name);
                let got = runtime.block_on(store.get_opts(&path, GetOptions::default()));
                let got = match got {
                    Ok(got) => got,
                    Err(object_store::Error::NotFound { .. }) => return Ok(None),
                    Err(e) => return Err(self.err(name, crate::remote::scrub(&e.to_string()))),
                };
                let len = got.meta.size;
                check_len(len)?;
                let reader = StreamReader {
                    stream: got.into_stream(),
                    runtime: Arc::clone(runtime),
                    chunk: bytes::Bytes::new(),
                    left: len,
                };
                Ok(Some((Box::new(reader), len)))
            }
        }
    }

    /// Writes `bytes` as `name`. `create_only`: only if no `name` exists
    /// ([`Created::Exists`] otherwise; a store without conditional writes,
    /// plain HTTP, checks first, which two writers could race).
    pub fn put(
        &self,
        name: &str,
        bytes: Vec<u8>,
        create_only: bool,
    ) -> Result<Created, BoardError> {
        match self {
            Board::Dir(dir) => self.put_in_dir(dir, name, &bytes, create_only),
            Board::Store {
                store,
                prefix,
                runtime,
                ..
            } => {
                let path = Self::path(prefix, name);
                if bytes.len() > SINGLE_PUT_BYTES_MAX {
                    if create_only {
                        return Err(self.err(name, "a create-only write of a large object"));
                    }
                    return runtime
                        .block_on(put_multipart(store.as_ref(), &path, bytes))
                        .map(|()| Created::Written)
                        .map_err(|e| self.err(name, crate::remote::scrub(&e.to_string())));
                }
                let mode = if create_only {
                    PutMode::Create
                } else {
                    PutMode::Overwrite
                };
                let payload = PutPayload::from(bytes);
                let put = |mode: PutMode, payload: PutPayload| {
                    runtime.block_on(store.put_opts(
                        &path,
                        payload,
                        PutOptions {
                            mode,
                            ..PutOptions::default()
                        },
                    ))
                };
                match put(mode, payload.clone()) {
                    Ok(_) => Ok(Created::Written),
                    Err(object_store::Error::AlreadyExists { .. }) => Ok(Created::Exists),
                    Err(object_store::Error::NotImplemented { .. }) if create_only => {
                        // No conditional write here (a WebDAV server): look first.
                        if runtime.block_on(store.head(&path)).is_ok() {
                            return Ok(Created::Exists);
                        }
                        put(PutMode::Overwrite, payload)
                            .map(|_| Created::Written)
                            .map_err(|e| self.err(name, crate::remote::scrub(&e.to_string())))
                    }
                    Err(e) => Err(self.err(name, crate::remote::scrub(&e.to_string()))),
                }
            }
        }
    }

    fn put_in_dir(
        &self,
        dir: &Dir,
        name: &str,
        bytes: &[u8],
        create_only: bool,
    ) -> Result<Created, BoardError> {
        use std::io::Write;
        let (mut file, tmp) = dir
            .create_temp(&format!(".{name}"), FILE_MODE)
            .map_err(|e| self.err(name, e))?;
        let written = file.write_all(bytes).and_then(|()| file.sync_all());
        drop(file);
        let tmp = OsStr::new(&tmp);
        let done = written.and_then(|()| {
            if create_only {
                // link() never replaces: the first writer's file stays.
                match std::fs::hard_link(dir.path().join(tmp), dir.path().join(name)) {
                    Ok(()) => Ok(Created::Written),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(Created::Exists),
                    Err(e) => Err(e),
                }
            } else {
                dir.rename(tmp, OsStr::new(name)).map(|()| Created::Written)
            }
        });
        // After a link (or a failure) the temporary is left; after a
        // rename it is gone (NotFound, ignored).
        let _ = dir.remove(tmp);
        done.map_err(|e| self.err(name, e))
    }

    /// Removes `name`; one that is not there is no error.
    pub fn delete(&self, name: &str) -> Result<(), BoardError> {
        match self {
            Board::Dir(dir) => match dir.remove(OsStr::new(name)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(self.err(name, e)),
                _ => Ok(()),
            },
            Board::Store {
                store,
                prefix,
                runtime,
                ..
            } => match runtime.block_on(store.delete(&Self::path(prefix, name))) {
                Err(e) if !matches!(e, object_store::Error::NotFound { .. }) => {
                    Err(self.err(name, crate::remote::scrub(&e.to_string())))
                }
                _ => Ok(()),
            },
        }
    }
}

async fn put_multipart(
    store: &dyn ObjectStore,
    path: &StorePath,
    bytes: Vec<u8>,
) -> object_store::Result<()> {
    let upload = store.put_multipart(path).await?;
    let mut write = object_store::WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
    write.write(&bytes);
    write.finish().await.map(|_| ())
}

/// A GET's body as a `Read`, pulled chunk by chunk on the runtime, never
/// more than `left` bytes (the length the caller accepted).
struct StreamReader {
    stream: BoxStream<'static, object_store::Result<bytes::Bytes>>,
    runtime: Arc<RemoteRuntime>,
    chunk: bytes::Bytes,
    left: u64,
}

impl Read for StreamReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.chunk.is_empty() {
            match self.runtime.block_on(self.stream.next()) {
                None => return Ok(0),
                Some(Ok(chunk)) => self.chunk = chunk,
                Some(Err(e)) => return Err(io::Error::other(crate::remote::scrub(&e.to_string()))),
            }
        }
        if self.chunk.len() as u64 > self.left {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the object is longer than it said it was",
            ));
        }
        let n = out.len().min(self.chunk.len());
        out[..n].copy_from_slice(&self.chunk[..n]);
        self.chunk = self.chunk.slice(n..);
        self.left -= n as u64;
        Ok(n)
    }
}
