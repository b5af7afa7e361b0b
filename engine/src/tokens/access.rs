//! How a corpus's index files and headers are read at start, before the
//! reader stack exists: a local file is mapped (or read in ranges); a
//! remote object is fetched with `If-Match` on its listed ETag and a few
//! retries, whole into the token cache directory (then mapped) or in
//! ranges into memory. The window bytes themselves are never read here:
//! the loader's readers do that, with their cache and retries.

use std::ffi::OsStr;
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use object_store::{GetOptions, GetRange};

use super::column::Backing;
use super::TokenError;
use crate::manifest::{digest_bytes, ObjectNames};
use crate::source::private_dir::open_private_dir;
use crate::source::{LocalSource, RemoteSource};

/// Attempts of one remote read before it fails.
pub const ATTEMPTS_MAX: u32 = 4;
/// First backoff between attempts; doubles each time.
pub const BACKOFF_MS: u64 = 100;
/// Remote ranges read at once (chunk and shard headers).
pub const RANGES_IN_FLIGHT: usize = 64;
/// Most bytes of an index read into memory when there is no token cache
/// directory to keep it in (a 10-million-document `.idx` is 200 MB).
pub const IN_MEMORY_INDEX_BYTES_MAX: u64 = 1 << 30;

/// One object of a corpus's source: its key under the root or prefix,
/// its size and, remotely, its ETag as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    /// Key relative to the source's root or prefix.
    pub key: Vec<u8>,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Remote only: the ETag reads insist on.
    pub etag: Option<String>,
}

/// Where a corpus's objects are.
#[derive(Clone, Debug)]
pub enum Access {
    /// Files under a local directory.
    Local(LocalSource),
    /// Objects under a remote prefix.
    Remote(Arc<RemoteSource>),
}

impl Access {
    /// Object `key` as messages name it.
    pub fn name(&self, key: &[u8]) -> String {
        match self {
            Access::Local(l) => l.object_name(key).display().to_string(),
            Access::Remote(r) => r.object_name(key).display().to_string(),
        }
    }

    /// The source as messages name it.
    pub fn source_name(&self) -> String {
        match self {
            Access::Local(l) => l.source_name().display().to_string(),
            Access::Remote(r) => r.source_name().display().to_string(),
        }
    }

    fn fail(&self, obj: &Object, problem: impl std::fmt::Display) -> TokenError {
        TokenError::Read {
            name: self.name(&obj.key),
            problem: problem.to_string(),
        }
    }

    /// All of `obj`: a local file mapped in place; a remote object fetched
    /// into `keep` (a private directory of the token cache, where the next
    /// start finds it by the object's URL, size and ETag) and mapped, or
    /// into memory when there is none.
    pub fn whole(&self, obj: &Object, keep: Option<&Path>) -> Result<Arc<Backing>, TokenError> {
        match self {
            Access::Local(local) => {
                let file = open_regular(&local.path_of(&obj.key)).map_err(|e| self.fail(obj, e))?;
                let len = file.metadata().map_err(|e| self.fail(obj, e))?.len();
                if len != obj.size_bytes {
                    return Err(self.fail(
                        obj,
                        format!("it is {len} bytes, but was listed at {}: it changed since it was listed; start again with --manifest-cache refresh", obj.size_bytes),
                    ));
                }
                Backing::map(&file)
                    .map(Arc::new)
                    .map_err(|e| self.fail(obj, e))
            }
            Access::Remote(remote) => match keep {
                Some(dir) => self.fetch_kept(remote, obj, dir),
                None => {
                    if obj.size_bytes > IN_MEMORY_INDEX_BYTES_MAX {
                        return Err(self.fail(obj, format!("it is {} bytes, too many to hold in memory without a cache directory to keep it in; pass --cache-dir", obj.size_bytes)));
                    }
                    let bytes = self.range(obj, 0..obj.size_bytes)?;
                    Ok(Arc::new(Backing::Owned(bytes)))
                }
            },
        }
    }

    /// Bytes `range` of `obj`.
    pub fn range(&self, obj: &Object, range: Range<u64>) -> Result<Vec<u8>, TokenError> {
        let mut out = self.ranges(std::slice::from_ref(obj), &[(0, range)])?;
        Ok(out.pop().unwrap_or_default())
    }

    /// Each `(object, range)` of `reads` (objects index `objects`), in
    /// order; remotely up to [`RANGES_IN_FLIGHT`] at a time.
    pub fn ranges(
        &self,
        objects: &[Object],
        reads: &[(usize, Range<u64>)],
    ) -> Result<Vec<Vec<u8>>, TokenError> {
        for (i, r) in reads {
            let obj = &objects[*i];
            if r.start > r.end || r.end > obj.size_bytes {
                return Err(self.fail(obj, format!("bytes {}..{} lie outside its {} bytes: it is truncated or its index is corrupt", r.start, r.end, obj.size_bytes)));
            }
        }
        match self {
            Access::Local(local) => reads
                .iter()
                .map(|(i, r)| {
                    let obj = &objects[*i];
                    let file =
                        open_regular(&local.path_of(&obj.key)).map_err(|e| self.fail(obj, e))?;
                    let mut buf = vec![0u8; (r.end - r.start) as usize];
                    file.read_exact_at(&mut buf, r.start)
                        .map_err(|e| self.fail(obj, e))?;
                    Ok(buf)
                })
                .collect(),
            Access::Remote(remote) => {
                let got = remote.runtime().block_on(async {
                    futures::stream::iter(reads.iter().map(|(i, r)| {
                        let obj = &objects[*i];
                        async move { get_with_retries(remote, obj, Some(r.clone())).await }
                    }))
                    .buffered(RANGES_IN_FLIGHT)
                    .collect::<Vec<_>>()
                    .await
                });
                got.into_iter()
                    .zip(reads)
                    .map(|(g, (i, _))| g.map_err(|e| self.fail(&objects[*i], e)))
                    .collect()
            }
        }
    }

    fn fetch_kept(
        &self,
        remote: &RemoteSource,
        obj: &Object,
        dir: &Path,
    ) -> Result<Arc<Backing>, TokenError> {
        let identity = format!(
            "{}\0{}\0{}\0{}",
            remote.store().display,
            String::from_utf8_lossy(&obj.key),
            obj.size_bytes,
            obj.etag.as_deref().unwrap_or("")
        );
        let name = kept_name(identity.as_bytes());
        let keep_dir = open_private_dir(dir).map_err(|e| TokenError::CacheDir {
            dir: dir.to_path_buf(),
            cause: e.to_string(),
        })?;
        // A copy is kept only under an ETag: without one, a changed object
        // of the same size would be taken for the old one.
        if obj.etag.is_some() {
            if let Ok(file) = keep_dir.open_trusted(OsStr::new(&name)) {
                if file.metadata().map(|m| m.len()).ok() == Some(obj.size_bytes) {
                    tracing::debug!("token index {} from the cache", self.name(&obj.key));
                    return Backing::map(&file)
                        .map(Arc::new)
                        .map_err(|e| self.fail(obj, e));
                }
            }
        }
        let (mut file, tmp) = keep_dir
            .create_temp(&format!(".{name}"), 0o600)
            .map_err(|e| self.fail(obj, format!("cannot keep a copy in {}: {e}", dir.display())))?;
        let fetched = remote.runtime().block_on(download(remote, obj, &mut file));
        let done = fetched.and_then(|()| {
            keep_dir
                .rename(OsStr::new(&tmp), OsStr::new(&name))
                .map_err(|e| e.to_string())
        });
        if let Err(e) = done {
            let _ = keep_dir.remove(OsStr::new(&tmp));
            return Err(self.fail(obj, e));
        }
        let file = keep_dir
            .open_trusted(OsStr::new(&name))
            .map_err(|e| self.fail(obj, e))?;
        Backing::map(&file)
            .map(Arc::new)
            .map_err(|e| self.fail(obj, e))
    }
}

/// The name a kept copy of the object `identity` has in the token cache.
fn kept_name(identity: &[u8]) -> String {
    let a = digest_bytes(0x746f_6b65_6e69_0001, identity);
    let b = digest_bytes(0x746f_6b65_6e69_0002, identity);
    format!("{a:016x}{b:016x}.idx")
}

/// Opens a file of a local source for reading: followed if a link, as the
/// listing did, but never a FIFO's endless wait; a regular file only.
pub fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "it is not a regular file",
        ));
    }
    Ok(file)
}

/// One GET of `range` (None: all) of `obj`, with retries and backoff.
async fn get_with_retries(
    remote: &RemoteSource,
    obj: &Object,
    range: Option<Range<u64>>,
) -> Result<Vec<u8>, String> {
    let mut attempt = 1;
    loop {
        match get_once(remote, obj, range.clone()).await {
            Err(e) if attempt < ATTEMPTS_MAX => {
                tracing::debug!(
                    "reading {} failed ({e}); attempt {} of {ATTEMPTS_MAX}",
                    String::from_utf8_lossy(&obj.key),
                    attempt + 1
                );
                tokio::time::sleep(Duration::from_millis(BACKOFF_MS << attempt)).await;
                attempt += 1;
            }
            done => return done,
        }
    }
}

async fn get_once(
    remote: &RemoteSource,
    obj: &Object,
    range: Option<Range<u64>>,
) -> Result<Vec<u8>, String> {
    let want = range.as_ref().map_or(obj.size_bytes, |r| r.end - r.start);
    if want == 0 {
        return Ok(Vec::new());
    }
    let store = remote.store();
    let opts = GetOptions {
        if_match: obj.etag.clone(),
        range: range.map(GetRange::Bounded),
        ..GetOptions::default()
    };
    let key = String::from_utf8_lossy(&obj.key);
    let got = store
        .fetch
        .get_opts(&store.path_of(&key), opts)
        .await
        .map_err(|e| e.to_string())?;
    let mut body = got.into_stream();
    let mut out = Vec::with_capacity(want as usize);
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| e.to_string())?;
        if out.len() as u64 + chunk.len() as u64 > want {
            return Err(format!(
                "the store sent more than the {want} bytes asked for"
            ));
        }
        out.extend_from_slice(&chunk);
    }
    if out.len() as u64 != want {
        return Err(format!("the body ended at byte {} of {want}", out.len()));
    }
    Ok(out)
}

/// Fetches all of `obj` into `file`, with retries (each attempt from the
/// start of the file).
async fn download(
    remote: &RemoteSource,
    obj: &Object,
    file: &mut std::fs::File,
) -> Result<(), String> {
    let mut attempt = 1;
    loop {
        let got = download_once(remote, obj, file).await;
        match got {
            Err(e) if attempt < ATTEMPTS_MAX => {
                tracing::debug!(
                    "fetching {} failed ({e}); again",
                    String::from_utf8_lossy(&obj.key)
                );
                tokio::time::sleep(Duration::from_millis(BACKOFF_MS << attempt)).await;
                attempt += 1;
            }
            done => return done,
        }
    }
}

async fn download_once(
    remote: &RemoteSource,
    obj: &Object,
    file: &mut std::fs::File,
) -> Result<(), String> {
    use std::io::Seek;
    file.set_len(0).map_err(|e| e.to_string())?;
    file.rewind().map_err(|e| e.to_string())?;
    if obj.size_bytes == 0 {
        return Ok(());
    }
    let store = remote.store();
    let opts = GetOptions {
        if_match: obj.etag.clone(),
        ..GetOptions::default()
    };
    let key = String::from_utf8_lossy(&obj.key);
    let got = store
        .fetch
        .get_opts(&store.path_of(&key), opts)
        .await
        .map_err(|e| e.to_string())?;
    let mut body = got.into_stream();
    let mut written = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| e.to_string())?;
        written += chunk.len() as u64;
        if written > obj.size_bytes {
            return Err(format!(
                "the store sent more than the {} bytes listed",
                obj.size_bytes
            ));
        }
        file.write_all(&chunk).map_err(|e| e.to_string())?;
    }
    if written != obj.size_bytes {
        return Err(format!(
            "the body ended at byte {written} of {}",
            obj.size_bytes
        ));
    }
    file.flush().map_err(|e| e.to_string())
}

/// The token cache directory under a ringfeed cache directory whose
/// manifests go to `manifests_dir`.
pub fn token_dir_beside(manifests_dir: &Path) -> PathBuf {
    manifests_dir.with_file_name("tokens")
}
