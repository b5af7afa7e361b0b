//! Indexing a local shard: `pread` hops from header to header through a
//! read-ahead window, so shards of small members cost one read per window
//! and shards of large members one read per header.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::index::TarIndex;
use super::scan::{ScanError, Scanner, Want};

/// Bytes read at a time while hopping between headers.
pub const READ_WINDOW_BYTES: usize = 64 * 1024;

/// Why a local shard could not be indexed.
#[derive(Debug)]
pub enum LocalScanError {
    /// The file could not be opened or read.
    Io(io::Error),
    /// The tar is malformed.
    Scan(ScanError),
}

/// Scans the shard at `path`, `shard_bytes` long as listed.
pub fn scan_file(path: &Path, shard_bytes: u64) -> Result<TarIndex, LocalScanError> {
    let file = File::open(path).map_err(LocalScanError::Io)?;
    let mut scanner = Scanner::new(shard_bytes);
    let mut window = vec![0u8; READ_WINDOW_BYTES];
    // window[..window_len] holds the shard's bytes from window_start.
    let (mut window_start, mut window_len) = (0u64, 0usize);
    loop {
        match scanner.want().map_err(LocalScanError::Scan)? {
            Want::Done => return Ok(scanner.finish()),
            Want::Skip(n) => scanner.skip(n),
            Want::Bytes(n) => {
                let at = scanner.position();
                let inside =
                    at >= window_start && at + n as u64 <= window_start + window_len as u64;
                if inside {
                    let from = (at - window_start) as usize;
                    scanner
                        .take(&window[from..from + n])
                        .map_err(LocalScanError::Scan)?;
                    continue;
                }
                // want() checked that the n bytes lie inside the shard.
                let len = (shard_bytes - at).min(READ_WINDOW_BYTES.max(n) as u64) as usize;
                if window.len() < len {
                    window.resize(len, 0);
                }
                file.read_exact_at(&mut window[..len], at)
                    .map_err(LocalScanError::Io)?;
                (window_start, window_len) = (at, len);
                scanner.take(&window[..n]).map_err(LocalScanError::Scan)?;
            }
        }
    }
}
