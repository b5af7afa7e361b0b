//! Small reads served from large ranged reads: a [`ReadEngine`] in front of
//! another (the remote engine) that fetches an object's aligned chunk of
//! `chunk_bytes` once and copies each small read that falls inside it out
//! of that chunk, so that a 4 KiB sample costs a share of a 1 MiB GET
//! instead of a round trip of its own.
//!
//! It pays only where reads cluster: under `--shuffle block` the samples of
//! a window of blocks sit in a few byte ranges of a few shards, and each
//! chunk serves a block's worth of samples. Under the exact order a chunk
//! would be fetched for one sample and dropped, so the loader turns this on
//! only with the block order (see `loader::plan`).
//!
//! - A read is *small* when it is at most `small_read_max` bytes and lies
//!   inside one chunk (chunk `i` of an object is its bytes
//!   `i * chunk_bytes .. min((i + 1) * chunk_bytes, size)`). Every other
//!   read goes to the inner engine unchanged.
//! - A small read whose chunk is resident is copied at once (its completion
//!   comes from the next `reap`); one whose chunk is on its way waits for
//!   it; otherwise its chunk is fetched, as one read of the inner engine.
//! - Resident chunks stay while their bytes and those of chunks on their way
//!   fit in `budget_bytes`; past it the least recently used resident ones
//!   go. Chunks on their way are never dropped, so a burst of misses can
//!   pass the budget by the reads in flight (each at most `chunk_bytes`).
//! - A chunk read that fails fails every read waiting on it (the first
//!   with the inner error, the others with its message), and the chunk is
//!   forgotten: the next read of it fetches it again.
//! - The buffer of a dropped chunk is kept for the next chunk that fits in
//!   it, up to half the budget: a chunk fetched is then no new
//!   allocation (at 256 KiB a fresh `mmap`, a page fault per 4 KiB sample
//!   when the GET's bytes land, and an `munmap` when it goes).

use std::collections::{HashMap, VecDeque};
use std::mem::MaybeUninit;
use std::time::Duration;

use super::{Completion, ReadEngine, ReadError, ReadOp};

/// Where an object's chunks begin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChunkGeometry {
    /// Chunk `i` of an object is its bytes `i * chunk_bytes .. (i + 1) *
    /// chunk_bytes` (clipped to its size).
    Aligned {
        /// Size of a chunk (clamped to `CHUNK_BYTES_MIN..=CHUNK_BYTES_MAX`).
        chunk_bytes: u64,
    },
    /// Chunks begin at these (object, offset) points, sorted, and run to the
    /// next point of the same object or its end: the byte ranges of the
    /// block order's blocks, so a window of blocks is one GET per block.
    /// An object with no point is not chunked; neither is a chunk longer
    /// than `CHUNK_BYTES_MAX`.
    Starts(std::sync::Arc<[(u32, u64)]>),
    /// As `Starts`, but each chunk runs `tail_bytes` past the next point
    /// (within its object): token windows overlap their neighbours by a
    /// token, so a block of windows ends a token into the next block.
    Overlapping {
        /// The (object, offset) points, sorted.
        starts: std::sync::Arc<[(u32, u64)]>,
        /// How far each chunk runs past the next point.
        tail_bytes: u64,
    },
}

impl ChunkGeometry {
    /// The chunks of `Starts` as (object, offset, length), the ranges the
    /// chunk layer reads whole (what the data cache keeps as range
    /// entries); `sizes` are the objects' sizes. Empty for `Aligned`,
    /// whose chunks follow no order's blocks.
    pub fn ranges(&self, sizes: &[u64]) -> Vec<(u32, u64, u64)> {
        let (starts, tail) = match self {
            ChunkGeometry::Starts(starts) => (starts, 0),
            ChunkGeometry::Overlapping { starts, tail_bytes } => (starts, *tail_bytes),
            ChunkGeometry::Aligned { .. } => return Vec::new(),
        };
        let mut out = Vec::with_capacity(starts.len());
        for (i, &(object, start)) in starts.iter().enumerate() {
            let Some(&size) = sizes.get(object as usize) else {
                continue;
            };
            let end = match starts.get(i + 1) {
                Some(&(next_object, next)) if next_object == object => {
                    next.saturating_add(tail).min(size)
                }
                _ => size,
            };
            if end > start && end - start <= CHUNK_BYTES_MAX {
                out.push((object, start, end - start));
            }
        }
        out
    }
}

/// How the chunk layer is set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkConfig {
    /// Where chunks begin and end.
    pub geometry: ChunkGeometry,
    /// Reads longer than this go to the inner engine.
    pub small_read_max: u64,
    /// Most bytes of chunks kept (see the module's notes).
    pub budget_bytes: u64,
}

/// Fewest bytes of a chunk: below this a chunk saves too few round trips.
pub const CHUNK_BYTES_MIN: u64 = 64 << 10;
/// Most bytes of a chunk (one GET part of the fetch engine by default).
pub const CHUNK_BYTES_MAX: u64 = 8 << 20;
/// Reads accepted per read slot of the inner engine: waiting on a chunk
/// costs no GET, so the caller may queue this many more (reads past the
/// inner engine's room wait in `deferred`). A chunk of the block order
/// serves a block of samples (64 by default), each a read of its own: at 8
/// per slot the loader's default queue depth of 256 let 2,048 small reads
/// (32 batches of 64, about 32 chunk GETs) be in flight, which bounded 4
/// KiB samples at 85k/s on a 20 ms path whatever the slots (issue 29). At
/// 64, one full block per inner slot: the loader's slots bound the
/// lookahead, not this. A waiting read costs one `ReadOp` (40 bytes).
const WAITERS_PER_INNER_SLOT: usize = 64;

/// A chunk's buffer: never zeroed (the inner read writes its bytes before
/// any is read), so a chunk costs no `memset` of its length.
type Buf = Box<[MaybeUninit<u8>]>;

enum Chunk {
    /// Its read is with the inner engine; these small reads wait for it.
    Fetching { buf: Buf, waiters: Vec<ReadOp> },
    /// Its bytes (the first `len` of `buf`: its read wrote them), and when
    /// a read last used it.
    Resident { buf: Buf, used: u64 },
}

/// What an inner read is for.
enum Origin {
    /// The caller's read, passed through: its `user_data`.
    Pass(u64),
    /// The chunk (object, first byte) of the map.
    Chunk(u32, u64),
}

/// See the module documentation.
pub struct ChunkedEngine {
    inner: Box<dyn ReadEngine>,
    /// Each object's size, by index (chunks are clipped to it).
    sizes: Vec<u64>,
    cfg: ChunkConfig,
    chunks: HashMap<(u32, u64), Chunk>,
    /// Bytes of every chunk in `chunks`.
    held_bytes: u64,
    /// Inner read tag → what it is for.
    origins: HashMap<u64, Origin>,
    next_tag: u64,
    /// Completions of small reads copied out, waiting to be reaped.
    ready: VecDeque<Completion>,
    /// Small reads waiting on chunks on their way.
    waiting: usize,
    /// Passed-through reads with the inner engine.
    passed: usize,
    clock: u64,
    inner_out: Vec<Completion>,
    /// Inner reads (tagged) not handed to the inner engine yet: it was full.
    deferred: VecDeque<ReadOp>,
    /// Buffers of dropped chunks, for the next chunks (see the module notes).
    spare: Vec<Buf>,
    /// Bytes of `spare`.
    spare_bytes: u64,
    /// Chunk buffers allocated so far (not taken from `spare`).
    allocated: u64,
}

// SAFETY: the raw pointers it keeps (in the ReadOps waiting on chunks and
// in `deferred`) point into the caller's read destinations, valid under
// `submit`'s contract until reaped, or into this engine's own chunk buffers.
// Moving the engine to another thread moves none of that memory, and the
// engine is used by one thread at a time (`ReadEngine: Send`, not `Sync`).
unsafe impl Send for ChunkedEngine {}

impl std::fmt::Debug for ChunkedEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkedEngine")
            .field("cfg", &self.cfg)
            .field("chunks", &self.chunks.len())
            .field("held_bytes", &self.held_bytes)
            .finish()
    }
}

impl ChunkedEngine {
    /// The chunk layer over `inner`, whose objects have `sizes`.
    pub fn new(inner: Box<dyn ReadEngine>, sizes: Vec<u64>, cfg: ChunkConfig) -> ChunkedEngine {
        let geometry = match cfg.geometry {
            ChunkGeometry::Aligned { chunk_bytes } => ChunkGeometry::Aligned {
                chunk_bytes: chunk_bytes.clamp(CHUNK_BYTES_MIN, CHUNK_BYTES_MAX),
            },
            starts => starts,
        };
        ChunkedEngine {
            inner,
            sizes,
            cfg: ChunkConfig { geometry, ..cfg },
            chunks: HashMap::new(),
            held_bytes: 0,
            origins: HashMap::new(),
            next_tag: 0,
            ready: VecDeque::new(),
            waiting: 0,
            passed: 0,
            clock: 0,
            inner_out: Vec::new(),
            deferred: VecDeque::new(),
            spare: Vec::new(),
            spare_bytes: 0,
            allocated: 0,
        }
    }

    /// Chunk buffers allocated so far: a chunk fetched into the buffer of
    /// a dropped one allocates none.
    pub fn buffers_allocated(&self) -> u64 {
        self.allocated
    }

    /// A buffer of at least `len` bytes for a chunk: a spare one that fits
    /// (and is at most twice as long), else a new one.
    fn buffer(&mut self, len: usize) -> Buf {
        let fits = self
            .spare
            .iter()
            .position(|b| b.len() >= len && b.len() / 2 <= len);
        if let Some(i) = fits {
            let buf = self.spare.swap_remove(i);
            self.spare_bytes -= buf.len() as u64;
            return buf;
        }
        self.allocated += 1;
        Box::new_uninit_slice(len)
    }

    /// Keeps the buffer of a chunk that no read writes any more for a next
    /// chunk, while the spares stay within half the budget (a quarter let
    /// most evicted chunks go: a profile of the block order showed the
    /// loader zeroing new chunks and the remote threads faulting their
    /// pages in, a tenth of the CPU of 4 KiB samples).
    fn keep_spare(&mut self, buf: Buf) {
        let len = buf.len() as u64;
        if self.spare_bytes + len <= self.cfg.budget_bytes / 2 {
            self.spare_bytes += len;
            self.spare.push(buf);
        }
    }

    /// The chunk holding `op` (its byte range in the object) when `op` is
    /// small, else None.
    fn chunk_of(&self, op: &ReadOp) -> Option<std::ops::Range<u64>> {
        if op.len_bytes == 0 || op.len_bytes > self.cfg.small_read_max {
            return None;
        }
        let size = *self.sizes.get(op.file as usize)?;
        let range = match &self.cfg.geometry {
            ChunkGeometry::Aligned { chunk_bytes } => {
                let start = op.offset_bytes / chunk_bytes * chunk_bytes;
                start..start.saturating_add(*chunk_bytes).min(size)
            }
            ChunkGeometry::Starts(_) | ChunkGeometry::Overlapping { .. } => {
                let (starts, tail) = match &self.cfg.geometry {
                    ChunkGeometry::Overlapping { starts, tail_bytes } => (starts, *tail_bytes),
                    ChunkGeometry::Starts(starts) => (starts, 0),
                    ChunkGeometry::Aligned { .. } => return None,
                };
                let at = starts.partition_point(|&p| p <= (op.file, op.offset_bytes));
                let &(object, start) = starts.get(at.checked_sub(1)?)?;
                if object != op.file {
                    return None;
                }
                let end = match starts.get(at) {
                    Some(&(next_object, next)) if next_object == op.file => {
                        next.saturating_add(tail)
                    }
                    _ => size,
                };
                if end - start > CHUNK_BYTES_MAX {
                    return None;
                }
                start..end.min(size)
            }
        };
        (op.offset_bytes.checked_add(op.len_bytes)? <= range.end).then_some(range)
    }

    fn tag(&mut self, origin: Origin) -> u64 {
        let tag = self.next_tag;
        self.next_tag += 1;
        self.origins.insert(tag, origin);
        tag
    }

    /// Copies `op`'s bytes out of a chunk starting at object offset
    /// `chunk_start` and queues its completion.
    fn copy_out(ready: &mut VecDeque<Completion>, buf: &Buf, chunk_start: u64, op: &ReadOp) {
        let at = (op.offset_bytes - chunk_start) as usize;
        let len = op.len_bytes as usize;
        let src = buf[at..at + len].as_ptr().cast::<u8>();
        // SAFETY: `chunk_of` put the range inside the chunk, so `at + len`
        // is within the bytes the chunk's completed read wrote (and within
        // `buf`): they are initialized; `submit`'s caller made `dest` valid
        // for `len_bytes` writes until its completion is reaped, which is
        // after this copy.
        unsafe { std::ptr::copy_nonoverlapping(src, op.dest, len) };
        ready.push_back(Completion {
            user_data: op.user_data,
            result: Ok(()),
        });
    }

    /// Hands deferred reads to the inner engine as far as it has room.
    fn pump(&mut self) -> Result<(), ReadError> {
        let room = self
            .inner
            .max_in_flight()
            .saturating_sub(self.inner.in_flight());
        let n = room.min(self.deferred.len());
        if n == 0 {
            return Ok(());
        }
        let batch: Vec<ReadOp> = self.deferred.drain(..n).collect();
        // SAFETY: a passed-through read's `dest` is the caller's, under the
        // caller's contract of `submit`; a chunk's is its boxed buffer in
        // `chunks` (a Box's heap bytes do not move when the map does), kept
        // there until the inner completion for it is settled, or until the
        // engine drops: `inner`, declared first, drops first and waits for
        // its reads. Every read was checked against its object's size.
        unsafe { self.inner.submit(&batch) }
    }

    /// Drops least recently used resident chunks while over budget.
    fn trim(&mut self) {
        while self.held_bytes > self.cfg.budget_bytes {
            let oldest = self
                .chunks
                .iter()
                .filter_map(|(k, c)| match c {
                    Chunk::Resident { used, .. } => Some((*used, *k)),
                    Chunk::Fetching { .. } => None,
                })
                .min();
            let Some((_, key)) = oldest else { return };
            if let Some(Chunk::Resident { buf, .. }) = self.chunks.remove(&key) {
                self.held_bytes -= buf.len() as u64;
                // Resident: its read is settled, nothing writes it.
                self.keep_spare(buf);
            }
        }
    }

    /// Turns the inner engine's completions into the caller's.
    fn settle(&mut self, out: &mut Vec<Completion>) {
        for c in std::mem::take(&mut self.inner_out) {
            match self.origins.remove(&c.user_data) {
                Some(Origin::Pass(user_data)) => {
                    self.passed -= 1;
                    out.push(Completion {
                        user_data,
                        result: c.result,
                    });
                }
                Some(Origin::Chunk(object, start)) => {
                    let Some(Chunk::Fetching { buf, waiters }) =
                        self.chunks.remove(&(object, start))
                    else {
                        continue;
                    };
                    self.waiting -= waiters.len();
                    match c.result {
                        Ok(()) => {
                            for op in &waiters {
                                Self::copy_out(&mut self.ready, &buf, start, op);
                            }
                            self.clock += 1;
                            let used = self.clock;
                            self.chunks
                                .insert((object, start), Chunk::Resident { buf, used });
                        }
                        Err(e) => {
                            self.held_bytes -= buf.len() as u64;
                            // Its read is settled (failed): nothing writes it.
                            self.keep_spare(buf);
                            // Every read that waited on the chunk fails with
                            // its error: the remote cause shared whole, any
                            // other as the chunk layer's failure naming it.
                            let again = |e: &ReadError| match e {
                                ReadError::Remote { key, cause } => ReadError::Remote {
                                    key: key.clone(),
                                    cause: std::sync::Arc::clone(cause),
                                },
                                other => ReadError::Engine {
                                    backend: "chunk",
                                    op: "the chunk this read waited on",
                                    source: std::io::Error::other(other.to_string()),
                                },
                            };
                            let copy = again(&e);
                            let mut first = Some(e);
                            for op in waiters {
                                let result = Err(first.take().unwrap_or_else(|| again(&copy)));
                                self.ready.push_back(Completion {
                                    user_data: op.user_data,
                                    result,
                                });
                            }
                        }
                    }
                }
                // Every inner tag came from `tag`.
                None => {}
            }
        }
        self.trim();
        out.extend(self.ready.drain(..));
    }
}

impl ReadEngine for ChunkedEngine {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }

    fn in_flight(&self) -> usize {
        self.passed + self.waiting + self.ready.len()
    }

    fn max_in_flight(&self) -> usize {
        self.inner.max_in_flight() * WAITERS_PER_INNER_SLOT
    }

    unsafe fn submit(&mut self, ops: &[ReadOp]) -> Result<(), ReadError> {
        // All or none: every read is checked before any is taken.
        let sizes = &self.sizes;
        super::admit_sized(
            self.in_flight(),
            self.max_in_flight(),
            ops,
            |i| sizes.get(i as usize).copied(),
            sizes.len(),
        )?;
        for op in ops {
            let Some(range) = self.chunk_of(op) else {
                let tag = self.tag(Origin::Pass(op.user_data));
                self.deferred.push_back(ReadOp {
                    user_data: tag,
                    ..*op
                });
                self.passed += 1;
                continue;
            };
            self.clock += 1;
            let clock = self.clock;
            let key = (op.file, range.start);
            match self.chunks.get_mut(&key) {
                Some(Chunk::Resident { buf, used }) => {
                    *used = clock;
                    Self::copy_out(&mut self.ready, buf, range.start, op);
                }
                Some(Chunk::Fetching { waiters, .. }) => {
                    waiters.push(*op);
                    self.waiting += 1;
                }
                None => {
                    // A spare may be longer: the read fills its first bytes.
                    let mut buf = self.buffer((range.end - range.start) as usize);
                    let tag = self.tag(Origin::Chunk(op.file, range.start));
                    self.deferred.push_back(ReadOp {
                        file: op.file,
                        offset_bytes: range.start,
                        len_bytes: range.end - range.start,
                        dest: buf.as_mut_ptr().cast::<u8>(),
                        spare_byte: false,
                        user_data: tag,
                    });
                    self.held_bytes += buf.len() as u64;
                    self.chunks.insert(
                        key,
                        Chunk::Fetching {
                            buf,
                            waiters: vec![*op],
                        },
                    );
                    self.waiting += 1;
                }
            }
        }
        self.pump()
    }

    fn reap(
        &mut self,
        out: &mut Vec<Completion>,
        min_complete: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, ReadError> {
        let before = out.len();
        loop {
            self.pump()?;
            let got = out.len() - before + self.ready.len();
            let need = min_complete.saturating_sub(got);
            // Copies are ready now: do not block on the inner engine for them.
            let wait = if need == 0 || self.inner.in_flight() == 0 {
                Some(Duration::ZERO)
            } else {
                timeout
            };
            let mut inner_out = std::mem::take(&mut self.inner_out);
            self.inner.reap(&mut inner_out, need.min(1), wait)?;
            self.inner_out = inner_out;
            self.settle(out);
            let got = out.len() - before;
            if got >= min_complete || timeout.is_some() || self.in_flight() == 0 {
                self.pump()?;
                return Ok(got);
            }
        }
    }
}
