//! The one error type of the readers, and the mapping from an OS error to it.

use std::io;
use std::path::PathBuf;

/// Why a read, or the reader itself, failed.
///
/// Every variant about a file names its path, so the loader can report the
/// sample that could not be delivered instead of losing it silently.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The file is gone (ENOENT or ENOTDIR on open) although the manifest lists it.
    #[error("{}: file vanished since the manifest was built ({source})", path.display())]
    Vanished {
        /// The file.
        path: PathBuf,
        /// The OS error of the open.
        source: io::Error,
    },
    /// The file exists but may not be opened (EACCES, EPERM, ELOOP, ...).
    #[error("{}: cannot open it: {source} (check the permissions of the file and of every directory above it)", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The OS error of the open.
        source: io::Error,
    },
    /// A read ended early at end of file: the file shrank since the manifest
    /// recorded its size.
    #[error(
        "{}: file changed size since the manifest was built: expected {expected_bytes} bytes, \
         found {actual_bytes} (a read of {len_bytes} bytes at offset {offset_bytes} reached end \
         of file after {read_bytes} bytes)",
        path.display()
    )]
    ChangedSize {
        /// The file.
        path: PathBuf,
        /// Size the file table says the file has.
        expected_bytes: u64,
        /// Size the file has now (from `stat`; where that failed, the offset
        /// at which the read met end of file).
        actual_bytes: u64,
        /// Start of the failed read.
        offset_bytes: u64,
        /// Length of the failed read.
        len_bytes: u64,
        /// Bytes that did arrive.
        read_bytes: u64,
    },
    /// A read that ended at the recorded end of the file found more bytes
    /// there: the file grew since the manifest recorded its size.
    #[error(
        "{}: file changed size since the manifest was built: expected {expected_bytes} bytes, \
         found {actual_bytes} (it grew; restart the loader to list the dataset again, or leave \
         its files unchanged while it runs)",
        path.display()
    )]
    Grew {
        /// The file.
        path: PathBuf,
        /// Size the file table says the file has.
        expected_bytes: u64,
        /// Size the file has now, from `stat`, but at least one byte more
        /// than expected, which is what the read saw (the file may have
        /// changed again before the `stat`).
        actual_bytes: u64,
    },
    /// A file kept open (record mode) had another size than the manifest
    /// recorded when it was opened: it was replaced, truncated or appended
    /// to since the listing. Found before any of its bytes are read.
    #[error(
        "{}: file changed size since the manifest was built: expected {expected_bytes} bytes, \
         found {actual_bytes} when it was opened (replaced, truncated or appended to; restart the \
         loader to list the dataset again, or leave its files unchanged while it runs)",
        path.display()
    )]
    SizeAtOpen {
        /// The file.
        path: PathBuf,
        /// Size the file table says the file has.
        expected_bytes: u64,
        /// Size of the file that was opened.
        actual_bytes: u64,
    },
    /// The path of a listed file now names something else: a directory,
    /// a FIFO, a device (replaced since the listing). Refused at open, so
    /// a FIFO with no writer cannot block the reader.
    #[error(
        "{}: is now {kind}, not the regular file the manifest listed (replaced since the listing; restart \
         the loader to list the dataset again, or leave its files unchanged while it runs)",
        path.display()
    )]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is now, in words ("a FIFO").
        kind: &'static str,
    },
    /// Any other OS error while opening or reading a file.
    #[error("{}: {op} failed: {source}{}", path.display(), fd_limit_hint(source))]
    Io {
        /// The file.
        path: PathBuf,
        /// `"open"` or `"read"`.
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// io_uring cannot be used here; only `IoChoice::Uring` returns this.
    #[error(
        "io_uring is unavailable: {reason}. Use `--io pread` to read with a thread pool instead{}",
        blocked_hint(reason)
    )]
    UringUnavailable {
        /// What the probe found, in words.
        reason: String,
    },
    /// Accepting the reads would put more than `max_in_flight` in flight;
    /// none of them was started. Reap completions, then submit again.
    #[error(
        "reader busy: {in_flight} reads in flight plus {requested} new would exceed the limit of \
         {max_in_flight}; none was started"
    )]
    Busy {
        /// Reads accepted and not yet reaped.
        in_flight: usize,
        /// Reads in the refused call.
        requested: usize,
        /// The engine's limit.
        max_in_flight: usize,
    },
    /// A read that cannot be valid for the file table (a caller bug); none of
    /// the reads in the call was started.
    #[error("invalid read (user_data {user_data}): {reason}")]
    InvalidOp {
        /// The refused read's `user_data`.
        user_data: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// `FileTable::new` refused its input.
    #[error("invalid file table: {reason}")]
    InvalidFileTable {
        /// What is wrong with it.
        reason: String,
    },
    /// `ReaderConfig` out of its limits.
    #[error("invalid reader configuration: {reason}")]
    InvalidConfig {
        /// What is wrong with it.
        reason: String,
    },
    /// A read of a remote object failed for good (a 403, a 404, a changed
    /// object, retries exhausted). Its message is the remote engine's: it
    /// names the key, the store, the HTTP status and the fix. The cause is
    /// kept whole, so a policy can tell a stale listing (404, 412) from a
    /// refused credential (403); shared, since one chunk's failure is every
    /// waiting read's.
    #[error("{cause}")]
    Remote {
        /// The object's key, relative to the source's prefix.
        key: String,
        /// What the remote engine said.
        cause: std::sync::Arc<crate::remote::RemoteError>,
    },
    /// The engine itself failed (io_uring_enter, spawning a thread). The
    /// engine should be dropped after this.
    #[error("{backend} reader failed: {op}: {source}{}", fd_limit_hint(source))]
    Engine {
        /// `"io_uring"` or `"pread"`.
        backend: &'static str,
        /// What it was doing.
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
}

/// Where io_uring is commonly blocked, unless the probe found another reason
/// (no descriptor free, a sysctl, memory) that says what to change itself.
fn blocked_hint(reason: &str) -> &'static str {
    if reason.contains("ulimit") || reason.contains("sysctl") || reason.contains("fs.file-max") {
        ""
    } else {
        " (Docker's default seccomp profile and gVisor block io_uring)"
    }
}

/// What to change when the process ran out of file descriptors.
fn fd_limit_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EMFILE) => " (the loader ran out of file descriptors: raise `ulimit -n`, or lower --queue-depth, the reads in flight)",
        Some(libc::ENFILE) => " (the system's table of open files is full: see `sysctl fs.file-nr` and fs.file-max)",
        _ => "",
    }
}

impl ReadError {
    /// The error for `op` ("open" or "read") on `path` failing with `errno`.
    pub(crate) fn from_errno(path: PathBuf, op: &'static str, errno: i32) -> ReadError {
        let source = io::Error::from_raw_os_error(errno);
        match errno {
            libc::ENOENT | libc::ENOTDIR => ReadError::Vanished { path, source },
            libc::EACCES | libc::EPERM | libc::ELOOP => ReadError::Unreadable { path, source },
            _ => ReadError::Io { path, op, source },
        }
    }

    /// The error for a read of `len_bytes` at `offset_bytes` that met end of
    /// file after `read_bytes`. Looks at the file's size now (error path only).
    pub(crate) fn changed_size(
        path: PathBuf,
        expected_bytes: u64,
        offset_bytes: u64,
        len_bytes: u64,
        read_bytes: u64,
    ) -> ReadError {
        let eof_at = offset_bytes.saturating_add(read_bytes);
        let actual_bytes = std::fs::metadata(&path).map_or(eof_at, |m| m.len());
        ReadError::ChangedSize {
            path,
            expected_bytes,
            actual_bytes,
            offset_bytes,
            len_bytes,
            read_bytes,
        }
    }

    /// The error for a read that found bytes past the recorded end of the
    /// file (`expected_bytes`). Looks at the file's size now (error path only).
    pub(crate) fn grew(path: PathBuf, expected_bytes: u64) -> ReadError {
        let seen_bytes = expected_bytes + 1;
        let actual_bytes = std::fs::metadata(&path).map_or(seen_bytes, |m| m.len().max(seen_bytes));
        ReadError::Grew {
            path,
            expected_bytes,
            actual_bytes,
        }
    }
}
