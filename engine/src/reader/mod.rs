//! Readers: byte ranges of files and objects land straight in caller-owned
//! memory.
//!
//! The loader owns slot memory in the shared-memory ring and asks a
//! [`ReadEngine`] to fill it: "read `len_bytes` at `offset_bytes` of file F
//! into `dest`". The bytes go from the page cache (or the disk, or the
//! network) into `dest` with no buffer in between. Behind the one trait:
//! two local backends (below), the remote engine (`remote.rs`: object_store
//! GETs on tokio, response chunks streamed into `dest`), and the chunk layer
//! (`chunked.rs`: small reads served out of larger ranged reads). The data
//! cache (`crate::cache`) wraps an engine from above; this module builds no
//! wrapper (`crate::loader`'s stack does). The local backends:
//!
//! - `io_uring` (`uring/`): up to `queue_depth` reads in flight, spread over
//!   `uring_threads` rings, each driven by a thread of its own. A read opens,
//!   reads and closes its file inside the kernel, as one linked chain
//!   OPENAT → READ → CLOSE on a direct descriptor, so a warm-cache read
//!   costs no system call of its own and no process file descriptor, and one
//!   `io_uring_enter` serves a whole batch. In keep-open mode
//!   ([`FileTable::new`]) each file is opened once for all rings, and reads
//!   are single READs on its descriptor instead.
//! - `pread` (`pread.rs`): a fixed pool of threads doing open/pread/close;
//!   completions come back through a channel. Used where io_uring is
//!   unavailable.
//!
//! [`open_engine`] picks one. `IoChoice::Auto` probes io_uring (the ring can
//! be created, the opcodes exist, a sparse file table can be registered, a NOP
//! completes) and falls back to `pread` with a warning that names the reason;
//! `IoChoice::Uring` fails with that reason instead. Setting the environment
//! variable `RINGFEED_IO_URING_DISABLE=1` (any value but empty or `0`), or
//! `ReaderConfig::disable_io_uring`, makes the probe fail on purpose, so CI
//! can run the fallback path: `RINGFEED_IO_URING_DISABLE=1 ringfeed serve ..`
//! reads with pread and prints the warning.
//!
//! Semantics shared by both backends:
//! - A read is checked against the [`FileTable`] before it starts: a range
//!   past the recorded size is `ReadError::InvalidOp`.
//! - A read that meets end of file early is never accepted: the remainder is
//!   read again (a regular file returns fewer bytes than asked only at end of
//!   file), and a read that then returns 0 bytes is
//!   `ReadError::ChangedSize`, naming the path and both sizes.
//! - A read whose range ends at the recorded end of the file also asks for
//!   one byte past it, with no extra operation: into `dest[len_bytes]` when
//!   `ReadOp::spare_byte` allows, else into a probe buffer of the engine's
//!   (READV or `preadv` with a second, one-byte buffer). If that byte
//!   arrives the file grew, and the read is `ReadError::Grew`. A change
//!   that keeps the size goes unnoticed.
//! - A read longer than `READ_CHUNK_BYTES_MAX` is split into several reads
//!   (io_uring lengths are 32-bit, and Linux caps one read at about 2 GiB).
//! - A zero-length read inside its file completes successfully without I/O;
//!   one at the end of its file (an empty file's) reads that one probe byte.
//! - `submit` refuses a call that would put more than `max_in_flight()` reads
//!   in flight (`ReadError::Busy`), starting none of them.
//! - Dropping an engine waits for every read the kernel or a thread is still
//!   doing, so no byte is written into `dest` after the drop returns.

pub mod chunked;
mod error;
pub(crate) mod files;
mod pread;
pub mod remote;
pub mod routed;

mod uring;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

pub use error::ReadError;
pub use files::FileTable;
pub use remote::{RemoteReadEngine, REMOTE_BACKEND};

/// Environment variable that, set to `1` (any value but empty or `0`), makes
/// the io_uring probe fail, so `--io auto` takes the pread fallback (for CI)
/// and `--io uring` errors.
pub const IO_URING_DISABLE_ENV: &str = "RINGFEED_IO_URING_DISABLE";

/// Most reads one engine may have in flight.
pub const QUEUE_DEPTH_MAX: u32 = 4096;
/// Most threads of the pread pool.
pub const PREAD_THREADS_MAX: usize = 256;
/// Most io_uring rings (and their threads).
pub const URING_THREADS_MAX: usize = 64;
/// Most files kept open in keep-open mode.
pub const KEEP_OPEN_FILES_MAX: u32 = 65_536;
/// Longest single read system call or SQE; longer reads are split.
pub const READ_CHUNK_BYTES_MAX: u64 = 1 << 30;
/// Most short (non-zero) reads one `ReadOp` may take before it is an error.
pub(crate) const SHORT_READS_MAX: u32 = 8;

/// The soft RLIMIT_NOFILE (1024 if it cannot be read): the most process
/// descriptors, and the most slots of an io_uring registered file table.
pub(crate) fn nofile_limit() -> u32 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit for getrlimit to fill.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if rc == 0 {
        u32::try_from(limit.rlim_cur).unwrap_or(u32::MAX)
    } else {
        1024
    }
}

/// Which backend reads local files (`--io auto|uring|pread`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoChoice {
    /// io_uring where it works, else the pread pool with a warning.
    #[default]
    Auto,
    /// io_uring or an error that says why not.
    Uring,
    /// The pread thread pool.
    Pread,
}

/// A string that is not `auto`, `uring` (or `io_uring`) or `pread`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown I/O backend {0:?}: expected auto, uring or pread")]
pub struct ParseIoChoiceError(pub String);

impl FromStr for IoChoice {
    type Err = ParseIoChoiceError;

    fn from_str(s: &str) -> Result<IoChoice, ParseIoChoiceError> {
        match s {
            "auto" => Ok(IoChoice::Auto),
            "uring" | "io_uring" => Ok(IoChoice::Uring),
            "pread" => Ok(IoChoice::Pread),
            _ => Err(ParseIoChoiceError(s.to_string())),
        }
    }
}

impl fmt::Display for IoChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IoChoice::Auto => "auto",
            IoChoice::Uring => "uring",
            IoChoice::Pread => "pread",
        })
    }
}

/// Tuning of the readers.
#[derive(Clone, Debug)]
pub struct ReaderConfig {
    /// Most reads in flight (`max_in_flight()` of either backend), 1 to
    /// `QUEUE_DEPTH_MAX`.
    pub queue_depth: u32,
    /// Threads of the pread pool, 1 to `PREAD_THREADS_MAX`.
    pub pread_threads: usize,
    /// Most files kept open when the table is in keep-open mode, 0 to
    /// `KEEP_OPEN_FILES_MAX`, and at most half of `RLIMIT_NOFILE` (they
    /// are process descriptors, shared by the engine's threads or rings).
    pub keep_open_files_max: u32,
    /// Rings of the io_uring backend, each driven by a thread of its own,
    /// 1 to `URING_THREADS_MAX`. A ring copies page-cache data on one core,
    /// so this is how many cores io_uring reads may use.
    pub uring_threads: usize,
    /// Make the io_uring probe fail, as `RINGFEED_IO_URING_DISABLE=1` does
    /// (lets a test exercise the fallback without touching the environment).
    pub disable_io_uring: bool,
}

impl Default for ReaderConfig {
    fn default() -> ReaderConfig {
        ReaderConfig {
            queue_depth: 256,
            pread_threads: 16,
            keep_open_files_max: 4096,
            // One more ring than cores (up to 4): while one shard waits for
            // its next batch another copies. Measured on 2 cores: 3 rings
            // beat 2 by about 15% on 100 KB files and 25% on 4 KiB files.
            uring_threads: std::thread::available_parallelism().map_or(3, |n| (n.get() + 1).min(4)),
            disable_io_uring: false,
        }
    }
}

impl ReaderConfig {
    /// Checks every field against its limit, naming the flag to fix.
    pub fn validate(&self) -> Result<(), ReadError> {
        let invalid = |reason: String| Err(ReadError::InvalidConfig { reason });
        if !(1..=QUEUE_DEPTH_MAX).contains(&self.queue_depth) {
            return invalid(format!(
                "queue_depth {} is not in 1..={QUEUE_DEPTH_MAX}",
                self.queue_depth
            ));
        }
        if !(1..=PREAD_THREADS_MAX).contains(&self.pread_threads) {
            return invalid(format!(
                "pread_threads {} is not in 1..={PREAD_THREADS_MAX}",
                self.pread_threads
            ));
        }
        if !(1..=URING_THREADS_MAX).contains(&self.uring_threads) {
            return invalid(format!(
                "uring_threads {} is not in 1..={URING_THREADS_MAX}",
                self.uring_threads
            ));
        }
        if self.keep_open_files_max > KEEP_OPEN_FILES_MAX {
            return invalid(format!(
                "keep_open_files_max {} is more than {KEEP_OPEN_FILES_MAX}",
                self.keep_open_files_max
            ));
        }
        Ok(())
    }
}

/// One read: `len_bytes` at `offset_bytes` of file `file` into `dest`.
#[derive(Clone, Copy, Debug)]
pub struct ReadOp {
    /// Index into the `FileTable`.
    pub file: u32,
    /// Where the range starts in the file.
    pub offset_bytes: u64,
    /// How many bytes; `offset_bytes + len_bytes` must not pass the recorded size.
    pub len_bytes: u64,
    /// Where the bytes go; valid for `len_bytes` writes (see `ReadEngine::submit`).
    pub dest: *mut u8,
    /// `dest[len_bytes]`, the byte after the range, may be written too, but
    /// only by a read that then fails with `ReadError::Grew`. The caller
    /// sets it where that byte is valid memory whose contents it throws
    /// away when this read fails (the start of the next sample of the same
    /// batch, or spare room in the slot). It makes the growth check of a
    /// range that ends at the end of its file one plain read of
    /// `len_bytes + 1`, instead of a vectored read with a probe buffer
    /// (measured: 8 to 12% of the throughput of 4 KiB files).
    pub spare_byte: bool,
    /// Returned in the completion, untouched.
    pub user_data: u64,
}

/// The outcome of one `ReadOp`.
#[derive(Debug)]
pub struct Completion {
    /// The read's `user_data`.
    pub user_data: u64,
    /// `Ok` when all `len_bytes` landed in `dest`.
    pub result: Result<(), ReadError>,
}

/// A backend that reads file ranges into caller memory. Driven by one thread.
pub trait ReadEngine: Send {
    /// `"io_uring"` or `"pread"`.
    fn backend_name(&self) -> &'static str;

    /// Reads accepted by `submit` whose completion has not been reaped yet.
    fn in_flight(&self) -> usize;

    /// Most reads in flight; `submit` refuses to go past it.
    fn max_in_flight(&self) -> usize;

    /// Starts the reads, all or none: when one is invalid (`InvalidOp`) or
    /// they would put more than `max_in_flight()` in flight (`Busy`), none is
    /// started. Each accepted read yields exactly one `Completion` from `reap`.
    ///
    /// # Safety
    /// Each `dest` must be valid for `len_bytes` writes, and nobody else may
    /// read or write it until its completion has been reaped (or the engine
    /// dropped: drop waits for reads under way). Where `spare_byte` is set,
    /// `dest` must be valid for `len_bytes + 1` writes; that last byte may
    /// belong to another read's range, and is written only when this read
    /// completes with `ReadError::Grew` (the caller then discards both).
    unsafe fn submit(&mut self, ops: &[ReadOp]) -> Result<(), ReadError>;

    /// Appends completions to `out` and returns how many. Blocks until at
    /// least `min_complete` were appended, `timeout` passed (`None`: no
    /// limit) or nothing is in flight any more, whichever is first; a timeout
    /// is not an error. An `Err` means the engine itself failed.
    fn reap(
        &mut self,
        out: &mut Vec<Completion>,
        min_complete: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, ReadError>;
}

/// The all-or-none admission check both backends run at the top of
/// `submit`: room for every read, and every read valid for the file table.
pub(crate) fn admit(
    in_flight: usize,
    max_in_flight: usize,
    ops: &[ReadOp],
    files: &FileTable,
) -> Result<(), ReadError> {
    if in_flight + ops.len() > max_in_flight {
        return Err(ReadError::Busy {
            in_flight,
            requested: ops.len(),
            max_in_flight,
        });
    }
    ops.iter().try_for_each(|op| files.check_op(op))
}

/// The all-or-none admission check of the engines over objects of known
/// sizes (the remote engine, the disk cache in front of it, the chunk
/// layer): room for every read, and every read inside its object, where
/// `size_of(object)` is None for an object not in the table.
pub(crate) fn admit_sized(
    in_flight: usize,
    max_in_flight: usize,
    ops: &[ReadOp],
    size_of: impl Fn(u32) -> Option<u64>,
    objects: usize,
) -> Result<(), ReadError> {
    if in_flight + ops.len() > max_in_flight {
        return Err(ReadError::Busy {
            in_flight,
            requested: ops.len(),
            max_in_flight,
        });
    }
    for op in ops {
        let size = size_of(op.file);
        let fits = size.is_some_and(|size| {
            op.offset_bytes
                .checked_add(op.len_bytes)
                .is_some_and(|end| end <= size)
        });
        if !fits {
            return Err(ReadError::InvalidOp {
                user_data: op.user_data,
                reason: match size {
                    Some(size) => format!(
                        "{} bytes at offset {} of object #{} pass its {size} bytes",
                        op.len_bytes, op.offset_bytes, op.file
                    ),
                    None => format!("object #{} is not in the table of {objects}", op.file),
                },
            });
        }
    }
    Ok(())
}

/// An engine, and the warning to print once if `Auto` fell back to pread.
pub struct OpenedEngine {
    /// The engine.
    pub engine: Box<dyn ReadEngine>,
    /// Set when `IoChoice::Auto` could not use io_uring; names the reason.
    pub fallback_warning: Option<String>,
}

impl fmt::Debug for OpenedEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenedEngine")
            .field("backend", &self.engine.backend_name())
            .field("fallback_warning", &self.fallback_warning)
            .finish()
    }
}

/// Opens the backend `choice` asks for over `files`.
pub fn open_engine(
    choice: IoChoice,
    files: Arc<FileTable>,
    cfg: &ReaderConfig,
) -> Result<OpenedEngine, ReadError> {
    cfg.validate()?;
    let pread = |files| -> Result<Box<dyn ReadEngine>, ReadError> {
        Ok(Box::new(pread::PreadEngine::start(files, cfg)?))
    };
    match choice {
        IoChoice::Pread => Ok(OpenedEngine {
            engine: pread(files)?,
            fallback_warning: None,
        }),
        IoChoice::Uring => {
            let engine = uring::UringEngine::open(files, cfg)?;
            Ok(OpenedEngine {
                engine: Box::new(engine),
                fallback_warning: None,
            })
        }
        IoChoice::Auto => match uring::UringEngine::open(Arc::clone(&files), cfg) {
            Ok(engine) => Ok(OpenedEngine {
                engine: Box::new(engine),
                fallback_warning: None,
            }),
            Err(ReadError::UringUnavailable { reason }) => {
                let warning = format!(
                    "io_uring is unavailable ({reason}); reading local files with {} pread threads \
                     instead (pass `--io pread` to choose that explicitly)",
                    cfg.pread_threads
                );
                tracing::debug!("{warning}");
                Ok(OpenedEngine {
                    engine: pread(files)?,
                    fallback_warning: Some(warning),
                })
            }
            Err(other) => Err(other),
        },
    }
}
