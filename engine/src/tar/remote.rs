//! Indexing a remote shard: one streaming GET, headers parsed as the bytes
//! go by, data skipped in memory (never kept); the GET is dropped at the
//! end-of-archive block.

use futures::StreamExt;
use object_store::GetOptions;

use super::index::TarIndex;
use super::scan::{ScanError, Scanner, Want};
use crate::remote::StoreHandle;

/// Why a remote shard could not be indexed.
#[derive(Debug)]
pub enum RemoteScanError {
    /// The GET failed (or the body ended early): the store's words.
    Get(String),
    /// The tar is malformed.
    Scan(ScanError),
}

/// Scans shard `key` (relative to the store's prefix) of `shard_bytes`
/// bytes, insisting on `etag` when the listing gave one.
pub async fn scan_object(
    store: &StoreHandle,
    key: &str,
    shard_bytes: u64,
    etag: Option<&str>,
) -> Result<TarIndex, RemoteScanError> {
    let opts = GetOptions {
        if_match: etag.map(str::to_owned),
        ..GetOptions::default()
    };
    let got = store
        .fetch
        .get_opts(&store.path_of(key), opts)
        .await
        .map_err(|e| RemoteScanError::Get(e.to_string()))?;
    let mut body = got.into_stream();
    let mut scanner = Scanner::new(shard_bytes);
    // Bytes of a header (or pax block) split across chunks.
    let mut partial: Vec<u8> = Vec::new();
    loop {
        // Before asking for bytes: the shard may be done already.
        if scanner.want().map_err(RemoteScanError::Scan)? == Want::Done {
            return Ok(scanner.finish());
        }
        let chunk = match body.next().await {
            Some(Ok(chunk)) => chunk,
            Some(Err(e)) => return Err(RemoteScanError::Get(e.to_string())),
            None => {
                let received = scanner.position() + partial.len() as u64;
                if received < shard_bytes {
                    return Err(RemoteScanError::Get(format!(
                        "the body ended at byte {received} of {shard_bytes}"
                    )));
                }
                // All of the shard came: whether it was whole tar is the scanner's.
                scanner.end_of_shard();
                return match scanner.want().map_err(RemoteScanError::Scan)? {
                    Want::Done => Ok(scanner.finish()),
                    _ => Err(RemoteScanError::Scan(ScanError {
                        offset: scanner.position(),
                        fault: super::scan::Fault::TruncatedHeader { shard_bytes },
                    })),
                };
            }
        };
        let mut rest: &[u8] = &chunk;
        while !rest.is_empty() {
            match scanner.want().map_err(RemoteScanError::Scan)? {
                Want::Done => return Ok(scanner.finish()),
                Want::Skip(n) => {
                    let k = (n.min(rest.len() as u64)) as usize;
                    scanner.skip(k as u64);
                    rest = &rest[k..];
                }
                Want::Bytes(n) => {
                    if partial.is_empty() && rest.len() >= n {
                        scanner.take(&rest[..n]).map_err(RemoteScanError::Scan)?;
                        rest = &rest[n..];
                        continue;
                    }
                    let k = (n - partial.len()).min(rest.len());
                    partial.extend_from_slice(&rest[..k]);
                    rest = &rest[k..];
                    if partial.len() == n {
                        scanner.take(&partial).map_err(RemoteScanError::Scan)?;
                        partial.clear();
                    }
                }
            }
        }
    }
}

/// The whole of a small object (a sidecar index).
pub async fn read_object(store: &StoreHandle, key: &str) -> Result<Vec<u8>, String> {
    let got = object_store::ObjectStoreExt::get(store.meta.as_ref(), &store.path_of(key))
        .await
        .map_err(|e| e.to_string())?;
    got.bytes()
        .await
        .map(|b| b.to_vec())
        .map_err(|e| e.to_string())
}

/// The version of object `key` by a HEAD: its ETag, else its last-modified
/// time; None when the HEAD fails.
pub async fn version_of(store: &StoreHandle, key: &str) -> Option<String> {
    let meta = object_store::ObjectStoreExt::head(store.meta.as_ref(), &store.path_of(key))
        .await
        .ok()?;
    meta.e_tag
        .or_else(|| Some(format!("modified {}", meta.last_modified.to_rfc3339())))
}
