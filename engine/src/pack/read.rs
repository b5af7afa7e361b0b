//! Reading the objects `pack` writes into shards: small ones read whole,
//! many at once, ahead of the writer; large ones streamed in chunks at
//! their turn, so memory stays bounded whatever the input holds.

use std::io::Read as _;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use object_store::{GetOptions, ObjectStore};

use crate::remote::StoreHandle;

use super::dest::ShardWriter;

/// Objects larger than this are streamed at their turn, not read ahead.
pub const STREAM_OBJECT_BYTES: u64 = 64 << 20;

/// Chunk of a streamed local file.
const STREAM_CHUNK_BYTES: usize = 8 << 20;

/// Where the objects are read from.
pub enum Input {
    /// A local directory.
    Local(PathBuf),
    /// A remote prefix.
    Remote(StoreHandle),
}

/// What each object must still be when it is read, as listed: a local
/// file's mtime word ([`mtime_word`]), a remote object's ETag (sent as
/// If-Match). A file changed in place between listing and reading fails
/// the run instead of landing in a shard the plan does not describe.
pub struct Expected {
    /// Local: per object, its mtime word (empty for a remote input).
    pub mtimes: Vec<u64>,
    /// Remote: per object, its ETag where the listing gave one.
    pub etags: Vec<Option<String>>,
}

/// A local file's mtime as one word.
pub fn mtime_word(meta: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    (meta.mtime() as u64).wrapping_mul(1_000_000_007) ^ meta.mtime_nsec() as u64
}

/// Fails if the local file at `path` is not the one listed (`want`, its
/// mtime word).
fn check_local_unchanged(name: &str, path: &std::path::Path, want: Option<u64>) -> Result<()> {
    let Some(want) = want else {
        return Ok(());
    };
    let meta = std::fs::metadata(path).with_context(|| format!("cannot stat {name}"))?;
    if mtime_word(&meta) != want {
        bail!("{name} changed while packing (its mtime moved since it was listed); pack again once the input is settled, into a new DEST: this one's plan is of the old input");
    }
    Ok(())
}

/// An object on its way: read whole on the runtime, or to be streamed.
pub enum Pending {
    /// A read of the whole object.
    Whole(tokio::task::JoinHandle<Result<bytes::Bytes>>),
    /// A large object, streamed by [`Input::stream_into`] at its turn.
    Stream,
}

impl Input {
    fn name(&self, key: &[u8]) -> String {
        match self {
            Input::Local(root) => root.join(os(key)).display().to_string(),
            Input::Remote(store) => format!(
                "{}/{}",
                store.display.trim_end_matches('/'),
                String::from_utf8_lossy(key)
            ),
        }
    }

    /// Starts reading object `i`, `key` of `size` bytes.
    pub fn start(&self, i: usize, key: &[u8], size: u64, expected: &Expected) -> Pending {
        if size > STREAM_OBJECT_BYTES {
            return Pending::Stream;
        }
        let name = self.name(key);
        match self {
            Input::Local(root) => {
                let path = root.join(os(key));
                let want = expected.mtimes.get(i).copied();
                Pending::Whole(tokio::task::spawn_blocking(move || {
                    let data =
                        std::fs::read(&path).with_context(|| format!("cannot read {name}"))?;
                    check_local_unchanged(&name, &path, want)?;
                    Ok(bytes::Bytes::from(data))
                }))
            }
            Input::Remote(store) => {
                let store = store.clone();
                let path = store.path_of(&String::from_utf8_lossy(key));
                let options = GetOptions {
                    if_match: expected.etags.get(i).cloned().flatten(),
                    ..GetOptions::default()
                };
                Pending::Whole(tokio::spawn(async move {
                    let got = store
                        .meta
                        .get_opts(&path, options)
                        .await
                        .map_err(|e| changed_or(e, &name))?;
                    got.bytes()
                        .await
                        .with_context(|| format!("reading {name} failed"))
                }))
            }
        }
    }

    /// Writes object `key` into `writer` chunk by chunk; fails if it does
    /// not hold exactly `size` bytes.
    pub async fn stream_into(
        &self,
        i: usize,
        key: &[u8],
        size: u64,
        expected: &Expected,
        writer: &mut ShardWriter,
    ) -> Result<()> {
        let name = self.name(key);
        let mut copied = 0u64;
        match self {
            Input::Local(root) => {
                let mut file = std::fs::File::open(root.join(os(key)))
                    .with_context(|| format!("cannot open {name}"))?;
                let mut chunk = vec![0u8; STREAM_CHUNK_BYTES];
                loop {
                    let n = file
                        .read(&mut chunk)
                        .with_context(|| format!("cannot read {name}"))?;
                    if n == 0 {
                        break;
                    }
                    copied += n as u64;
                    if copied > size {
                        break;
                    }
                    writer.write(&chunk[..n]).await?;
                }
                check_local_unchanged(&name, &root.join(os(key)), expected.mtimes.get(i).copied())?;
            }
            Input::Remote(store) => {
                let path = store.path_of(&String::from_utf8_lossy(key));
                let options = GetOptions {
                    if_match: expected.etags.get(i).cloned().flatten(),
                    ..GetOptions::default()
                };
                let mut stream = store
                    .meta
                    .get_opts(&path, options)
                    .await
                    .map_err(|e| changed_or(e, &name))?
                    .into_stream();
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk.with_context(|| format!("reading {name} failed"))?;
                    copied += chunk.len() as u64;
                    if copied > size {
                        break;
                    }
                    writer.write(&chunk).await?;
                }
            }
        }
        check_size(&name, size, copied)
    }
}

/// The error for an object that changed size since it was listed.
pub fn check_size(name: &str, listed: u64, read: u64) -> Result<()> {
    if read != listed {
        bail!(
            "{name} changed while packing: listed with {listed} bytes, read {}{read} bytes; pack again once the input is settled (into a new DEST: this one's plan is of the old input)",
            if read > listed { "at least " } else { "" }
        );
    }
    Ok(())
}

/// A failed GET as an error: a failed If-Match says the object changed.
fn changed_or(e: object_store::Error, name: &str) -> anyhow::Error {
    match e {
        object_store::Error::Precondition { .. } => anyhow::anyhow!(
            "{name} changed while packing (its ETag no longer matches the listing's); pack again once the input is settled, into a new DEST: this one's plan is of the old input"
        ),
        e => anyhow::Error::new(e).context(format!("cannot GET {name}")),
    }
}

fn os(key: &[u8]) -> &std::ffi::OsStr {
    <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(key)
}
