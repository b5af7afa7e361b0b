//! A `ReadEngine` over a remote source with a data cache: each read goes to
//! the local engine (io_uring or pread over the cache's entry files) when
//! its object is cached, else to the remote engine; one batch may mix both.
//!
//! The tier is picked per read at `submit` from the object's state byte,
//! so the loader, its one thread and its one completion loop stay as they
//! are. The first whole hit of an entry in a run is checked against the
//! CRC32C its footer holds before its completion is handed out (by a
//! checking thread, `verify`, for reads past 16 KiB), and later
//! whole hits of it in the same run are not (once per entry per run: a
//! byte flipped on disk before the entry's first read back in a run never
//! reaches a trainer; one flipped after it, within the run, is not
//! caught until the next run). A mismatch (or any failed
//! cache read) is a warning, the entry is removed, and the read goes to the
//! remote engine instead: never an error, never bad bytes. For a remote
//! read of a whole object the cache may take, the fetch engine keeps the
//! response body's chunks (refcounted `Bytes`, no copy) beside the bytes it
//! wrote into the slot; on completion they go to the writer thread, which
//! writes the entry off the publishing path. The queue is bounded by
//! `WRITE_QUEUE_BYTES_MAX`.
//!
//! Partial ranges (record mode) are read from a cached entry unchecked
//! (the entry was published whole, after its checksum and footer were
//! written, and its footer was checked at start); they never fill it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::verify::{Check, Outcome, Verifier, INLINE_CHECK_BYTES_MAX};
use super::writer::Job;
use super::{DataCache, Shared, STATE_ABSENT, STATE_CACHED, STATE_WRITING, WRITE_QUEUE_BYTES_MAX};
use crate::reader::{Completion, ReadEngine, ReadError, ReadOp, RemoteReadEngine};

/// `backend_name` of an engine reading through the cache.
pub const CACHED_BACKEND: &str = "remote+cache";
/// Longest wait on one engine while the other also has reads in flight.
const BOTH_WAIT_SLICE: Duration = Duration::from_millis(1);
/// Longest the loader waits for room in the writer's queue before it lets
/// a fetched object go uncached. An object let go is fetched again next
/// epoch, at least a round trip (20 ms on the benchmarks' path) and the
/// bytes again; a writer that cannot finish one entry in this long is on a
/// disk slower than the remote path, and the run does not wait for it.
const QUEUE_WAIT_MAX: Duration = Duration::from_millis(20);
/// Longest wait on the verifier while reads are also in flight.
const CHECK_WAIT_SLICE: Duration = Duration::from_micros(200);
/// Sleep between looks at the writer's queue while waiting for room.
const QUEUE_WAIT_STEP: Duration = Duration::from_micros(100);

/// Where a read in flight went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tier {
    Cache,
    Remote,
}

/// Why a cache read was not handed out: the policy differs by kind (a
/// corrupt entry is removed; a failed read only makes the object absent).
#[derive(Debug, thiserror::Error)]
enum CacheFault {
    /// The entry's bytes do not match the CRC32C its footer holds.
    #[error("CRC32C {found:08x} where its footer says {expected:08x}")]
    Corrupt {
        /// The CRC32C of the bytes read.
        found: u32,
        /// The CRC32C the entry's footer holds.
        expected: u32,
    },
    /// Reading the entry failed.
    #[error("{0}")]
    Io(ReadError),
}

/// A read in flight: the caller's op, where it went, and the cache entry
/// it reads or may fill (see `CachedEngine::entry_of`).
struct InFlight(ReadOp, Tier, Entry);

/// The cache entry a read maps to.
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// Index of the entry (an object's, or a range's after the objects).
    index: usize,
    /// Offset of the read in the entry.
    offset: u64,
    /// The read is the whole entry: checked on a hit, may fill on a miss.
    whole: bool,
}

// SAFETY: the op's `dest` is only written by the engine that reads it and
// only read by this engine's owner thread after that read completed
// (`ReadEngine::submit`'s contract); the pointer itself is plain data.
unsafe impl Send for InFlight {}

/// The cache engine and the remote engine behind one `ReadEngine`.
pub struct CachedEngine {
    local: Box<dyn ReadEngine>,
    remote: RemoteReadEngine,
    cache: DataCache,
    /// Internal id → the caller's op and where it went.
    ops: HashMap<u64, InFlight>,
    next_id: u64,
    max_in_flight: usize,
    scratch: Vec<Completion>,
    /// A failed cache read was warned of (once per run).
    read_error_warned: bool,
    /// Per object: its entry was read back whole and matched its CRC32C
    /// in this run, so later whole reads of it skip the check (once per
    /// entry per run). Cleared whenever the object goes to remote.
    verified: Vec<bool>,
    /// Completions of reads served from bodies queued for the writer, to
    /// hand out at the next `reap`.
    ready: Vec<Completion>,
    /// Threads that check first whole hits off this thread (None: checked
    /// here).
    verifier: Option<Verifier>,
    /// Reads whose bytes are being checked by the verifier, by internal id.
    checking: HashMap<u64, InFlight>,
    /// Checks done, between `Verifier::outcomes` and their completions.
    outcomes: Vec<Outcome>,
}

impl std::fmt::Debug for CachedEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedEngine")
            .field("cache", &self.cache)
            .field("in_flight", &self.ops.len())
            .finish()
    }
}

impl CachedEngine {
    /// Puts `cache` (read with `local`, an engine over `cache`'s entry
    /// files) in front of `remote`.
    pub fn new(local: Box<dyn ReadEngine>, remote: RemoteReadEngine, cache: DataCache) -> Self {
        let max_in_flight = local.max_in_flight().min(remote.max_in_flight()).max(1);
        let entries = cache.shared().state.len();
        // One checking thread per two cores, so that the loader's own core
        // is left to it on a small machine.
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get() / 2);
        CachedEngine {
            verified: vec![false; entries],
            ready: Vec::new(),
            verifier: Verifier::start(threads),
            checking: HashMap::new(),
            outcomes: Vec::new(),
            local,
            remote,
            cache,
            ops: HashMap::new(),
            next_id: 0,
            max_in_flight,
            scratch: Vec::new(),
            read_error_warned: false,
        }
    }

    fn shared(&self) -> &Arc<Shared> {
        self.cache.shared()
    }

    /// The entry `op` reads: the whole object's; else a range entry that
    /// is exactly `op`'s bytes; else (a part of an object) the object's
    /// entry at `op`'s offset, read unchecked and never filled.
    fn entry_of(&self, op: &ReadOp) -> Entry {
        let shared = self.shared();
        let file = op.file as usize;
        let object_size = shared.objects.get(file).map(|o| o.size);
        if op.offset_bytes == 0 && object_size == Some(op.len_bytes) {
            return Entry {
                index: file,
                offset: 0,
                whole: true,
            };
        }
        if let Some(&index) = shared.range_index.get(&(op.file, op.offset_bytes)) {
            if shared.entry_size(index) == Some(op.len_bytes) {
                return Entry {
                    index,
                    offset: 0,
                    whole: true,
                };
            }
        }
        Entry {
            index: file,
            offset: op.offset_bytes,
            whole: false,
        }
    }

    /// Serves `op` (a whole entry being written) from the body queued for
    /// the writer, copying it into `op.dest`; false when the body is no
    /// longer queued (the read goes on as a miss).
    ///
    /// # Safety
    /// `op.dest` is valid for `op.len_bytes` writes (`submit`'s contract).
    unsafe fn serve_pending(&mut self, shared: &Shared, entry: Entry, op: &ReadOp) -> bool {
        let pending = shared
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(chunks) = pending.get(&entry.index) else {
            return false;
        };
        if chunks.iter().map(|c| c.len() as u64).sum::<u64>() != op.len_bytes {
            return false;
        }
        let mut at = 0usize;
        for c in chunks {
            // SAFETY: the chunks sum to `len_bytes`, so each copy lands
            // inside `dest`, which the caller keeps valid and untouched
            // until this read's completion is reaped; a chunk is never
            // the caller's memory.
            unsafe { std::ptr::copy_nonoverlapping(c.as_ptr(), op.dest.add(at), c.len()) };
            at += c.len();
        }
        drop(pending);
        let stats = &shared.stats;
        stats.hits.fetch_add(1, Ordering::Relaxed);
        stats
            .bytes_from_cache
            .fetch_add(op.len_bytes, Ordering::Relaxed);
        self.ready.push(Completion {
            user_data: op.user_data,
            result: Ok(()),
        });
        true
    }

    /// Sends op `id` to the remote engine (a miss, or a failed hit).
    fn send_to_remote(&mut self, id: u64, op: ReadOp, entry: Entry) -> Result<(), ReadError> {
        let inner = ReadOp {
            user_data: id,
            spare_byte: false,
            ..op
        };
        // SAFETY: the caller's contract on `op.dest` holds until its
        // completion is reaped, which has not happened yet.
        unsafe { self.remote.submit(std::slice::from_ref(&inner)) }?;
        self.ops.insert(id, InFlight(op, Tier::Remote, entry));
        if let Some(v) = self.verified.get_mut(entry.index) {
            *v = false;
        }
        Ok(())
    }

    /// A cache read finished: check it (here, or on the verifier's
    /// thread: its completion then waits for the check), or send it to
    /// remote.
    fn cache_done(
        &mut self,
        id: u64,
        (op, entry): (ReadOp, Entry),
        result: Result<(), ReadError>,
        out: &mut Vec<Completion>,
    ) {
        let index = entry.index;
        let trouble = match result {
            Ok(()) if entry.whole && self.verified.get(index) == Some(&true) => None,
            Ok(()) if entry.whole => {
                let expected = self.shared().crc[index].load(Ordering::Relaxed);
                // SAFETY: the read completed, so `dest` holds its
                // `len_bytes` bytes, and the caller keeps it valid and
                // untouched until we hand its completion out, which waits
                // for this check's outcome.
                let check = unsafe { Check::new(id, op.dest, op.len_bytes, expected) };
                let check = match &mut self.verifier {
                    Some(v) if op.len_bytes > INLINE_CHECK_BYTES_MAX => match v.send(check) {
                        Ok(()) => {
                            self.checking.insert(id, InFlight(op, Tier::Cache, entry));
                            return;
                        }
                        Err(check) => check,
                    },
                    _ => check,
                };
                self.checked(Verifier::check_here(&check), index)
            }
            Ok(()) => None,
            Err(e) => Some(CacheFault::Io(e)),
        };
        self.cache_outcome(id, (op, entry), trouble, out);
    }

    /// What a check of entry `index` found: nothing wrong (it is now
    /// verified for the run), or a mismatch (counted).
    fn checked(&mut self, outcome: Outcome, index: usize) -> Option<CacheFault> {
        let (found, expected) = (outcome.found, outcome.expected);
        if found == expected {
            if let Some(v) = self.verified.get_mut(index) {
                *v = true;
            }
            return None;
        }
        self.shared()
            .stats
            .corrupt_refetched
            .fetch_add(1, Ordering::Relaxed);
        Some(CacheFault::Corrupt { found, expected })
    }

    /// Hands out the completions of the checks the verifier finished,
    /// waiting up to `wait` for one.
    fn drain_checks(&mut self, out: &mut Vec<Completion>, wait: Duration) -> usize {
        let Some(v) = &mut self.verifier else {
            return 0;
        };
        if v.pending() == 0 {
            return 0;
        }
        let before = out.len();
        let mut outcomes = std::mem::take(&mut self.outcomes);
        v.outcomes(&mut outcomes, wait);
        for outcome in outcomes.drain(..) {
            let id = outcome.user_data;
            let Some(InFlight(op, _, entry)) = self.checking.remove(&id) else {
                continue;
            };
            let trouble = self.checked(outcome, entry.index);
            self.cache_outcome(id, (op, entry), trouble, out);
        }
        self.outcomes = outcomes;
        out.len() - before
    }

    /// A cache read's end: its completion, or (a fault) a warning and the
    /// read sent to remote.
    fn cache_outcome(
        &mut self,
        id: u64,
        (op, entry): (ReadOp, Entry),
        trouble: Option<CacheFault>,
        out: &mut Vec<Completion>,
    ) {
        let index = entry.index;
        match trouble {
            None => {
                let stats = &self.shared().stats;
                stats.hits.fetch_add(1, Ordering::Relaxed);
                stats
                    .bytes_from_cache
                    .fetch_add(op.len_bytes, Ordering::Relaxed);
                out.push(Completion {
                    user_data: op.user_data,
                    result: Ok(()),
                });
            }
            Some(fault) => {
                let shared = Arc::clone(self.shared());
                let path = shared.entry_path(index).unwrap_or_default();
                let key = shared.describe(index);
                match &fault {
                    CacheFault::Corrupt { .. } => {
                        tracing::warn!(
                        "data cache: entry {} of {key} is corrupt ({fault}); removed, refetching from remote",
                        path.display()
                    );
                        shared.state[index].store(STATE_WRITING, Ordering::Relaxed);
                        if !self.cache.writer().send(Job::Remove { index }) {
                            shared.state[index].store(STATE_ABSENT, Ordering::Relaxed);
                        }
                    }
                    CacheFault::Io(_) => {
                        if !self.read_error_warned {
                            self.read_error_warned = true;
                            tracing::warn!(
                            "data cache: reading entry {} of {key} failed ({fault}); reading it from remote (further failed cache reads are not logged)",
                            path.display()
                        );
                        }
                        shared.state[index].store(STATE_ABSENT, Ordering::Relaxed);
                    }
                }
                if let Err(e) = self.send_to_remote(id, op, entry) {
                    out.push(Completion {
                        user_data: op.user_data,
                        result: Err(e),
                    });
                }
            }
        }
    }

    /// A remote read finished: count it, and offer a whole object's body
    /// (kept by the fetch engine) to the writer.
    fn remote_done(
        &mut self,
        id: u64,
        (op, entry): (ReadOp, Entry),
        result: Result<(), ReadError>,
        out: &mut Vec<Completion>,
    ) {
        let shared = Arc::clone(self.shared());
        let chunks = self.remote.take_kept(id);
        if result.is_ok() {
            shared.stats.misses.fetch_add(1, Ordering::Relaxed);
            shared
                .stats
                .bytes_from_remote
                .fetch_add(op.len_bytes, Ordering::Relaxed);
            if let Some(chunks) = chunks.filter(|_| entry.whole && shared.admits()) {
                self.offer(&shared, entry.index, chunks);
            }
        }
        out.push(Completion {
            user_data: op.user_data,
            result,
        });
    }

    fn offer(&self, shared: &Shared, index: usize, chunks: Vec<bytes::Bytes>) {
        let n: u64 = chunks.iter().map(|c| c.len() as u64).sum();
        if !reserve_queue(shared, n) {
            // The writer is far behind: this object gets another chance next epoch.
            return;
        }
        if shared.state[index]
            .compare_exchange(
                STATE_ABSENT,
                STATE_WRITING,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_err()
        {
            shared.queued_bytes.fetch_sub(n, Ordering::Relaxed);
            return;
        }
        shared
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(index, chunks.clone());
        if !self.cache.writer().send(Job::Write { index, chunks }) {
            shared
                .pending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&index);
            shared.state[index].store(STATE_ABSENT, Ordering::Relaxed);
            shared.queued_bytes.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// Moves the completions in `scratch` of `tier` to `out` (or to remote).
    fn drain(&mut self, tier: Tier, out: &mut Vec<Completion>) -> usize {
        let before = out.len();
        let mut done = std::mem::take(&mut self.scratch);
        for c in done.drain(..) {
            // Every id came from `submit`; another is not ours to report.
            let Some(InFlight(op, went, entry)) = self.ops.remove(&c.user_data) else {
                continue;
            };
            debug_assert_eq!(went, tier, "a completion came from the other engine");
            match tier {
                Tier::Cache => self.cache_done(c.user_data, (op, entry), c.result, out),
                Tier::Remote => self.remote_done(c.user_data, (op, entry), c.result, out),
            }
        }
        self.scratch = done;
        out.len() - before
    }

    fn in_flight_of(&self, tier: Tier) -> usize {
        match tier {
            Tier::Cache => self.local.in_flight(),
            Tier::Remote => self.remote.in_flight(),
        }
    }

    /// Reaps from one engine, waiting up to `wait` for one completion.
    fn reap_tier(
        &mut self,
        tier: Tier,
        out: &mut Vec<Completion>,
        wait: Duration,
    ) -> Result<usize, ReadError> {
        if self.in_flight_of(tier) == 0 {
            return Ok(0);
        }
        let min = usize::from(!wait.is_zero());
        let mut scratch = std::mem::take(&mut self.scratch);
        let r = match tier {
            Tier::Cache => self.local.reap(&mut scratch, min, Some(wait)),
            Tier::Remote => self.remote.reap(&mut scratch, min, Some(wait)),
        };
        self.scratch = scratch;
        r?;
        Ok(self.drain(tier, out))
    }
}

impl ReadEngine for CachedEngine {
    fn backend_name(&self) -> &'static str {
        CACHED_BACKEND
    }

    fn in_flight(&self) -> usize {
        self.ops.len() + self.ready.len() + self.checking.len()
    }

    fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    unsafe fn submit(&mut self, ops: &[ReadOp]) -> Result<(), ReadError> {
        let shared = Arc::clone(self.shared());
        crate::reader::admit_sized(
            self.ops.len() + self.ready.len() + self.checking.len(),
            self.max_in_flight,
            ops,
            |i| shared.objects.get(i as usize).map(|o| o.size),
            shared.objects.len(),
        )?;
        let mut local = Vec::new();
        let mut remote = Vec::new();
        let mut keep = Vec::new();
        let admits = shared.admits();
        let ready_before = self.ready.len();
        for op in ops {
            let id = self.next_id;
            self.next_id += 1;
            // SYNC POINT: Acquire pairs with the writer's (or the check's)
            // Release store of CACHED: the CRC it stored first is seen.
            let entry = self.entry_of(op);
            let mut state = shared.state[entry.index].load(Ordering::Acquire);
            if state == STATE_WRITING && entry.whole {
                // SAFETY: the caller's contract on `op.dest`.
                if unsafe { self.serve_pending(&shared, entry, op) } {
                    continue;
                }
                // The writer finished between the load above and the look
                // in `pending`: it stores the outcome (CACHED, or ABSENT
                // after a failed write) before it removes the body, and the
                // `pending` lock orders that store before this load. Read
                // again, so a just-published entry is a hit, not a second
                // fetch (a CI run saw 201 fetches of 200 objects).
                state = shared.state[entry.index].load(Ordering::Acquire);
            }
            let cached = state == STATE_CACHED;
            let inner = ReadOp {
                user_data: id,
                spare_byte: false,
                ..*op
            };
            if cached {
                // The entry's file, at the read's offset in it.
                local.push(ReadOp {
                    file: entry.index as u32,
                    offset_bytes: entry.offset,
                    ..inner
                });
                self.ops.insert(id, InFlight(*op, Tier::Cache, entry));
            } else {
                if let Some(v) = self.verified.get_mut(entry.index) {
                    *v = false;
                }
                // Ask the fetch engine to keep the body of a whole entry
                // the cache may take: the fill needs no copy of its own.
                keep.push(admits && state == STATE_ABSENT && entry.whole);
                remote.push(inner);
                self.ops.insert(id, InFlight(*op, Tier::Remote, entry));
            }
        }
        // SAFETY: the caller's contract on every `dest` is passed on as is;
        // both engines are ours and dropped before the caller's memory.
        let submitted = unsafe { self.local.submit(&local) }
            // SAFETY: as above.
            .and_then(|()| unsafe { self.remote.submit_keeping(&remote, &keep) });
        if let Err(e) = submitted {
            // Checked above, with room in both: only a broken engine fails here.
            for op in local.iter().chain(&remote) {
                self.ops.remove(&op.user_data);
            }
            // All or none: the reads served from memory are not reported.
            self.ready.truncate(ready_before);
            return Err(e);
        }
        Ok(())
    }

    fn reap(
        &mut self,
        out: &mut Vec<Completion>,
        min_complete: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, ReadError> {
        let started = Instant::now();
        let mut got = self.ready.len();
        out.append(&mut self.ready);
        loop {
            got += self.drain_checks(out, Duration::ZERO);
            got += self.reap_tier(Tier::Cache, out, Duration::ZERO)?;
            got += self.reap_tier(Tier::Remote, out, Duration::ZERO)?;
            if got >= min_complete || (self.ops.is_empty() && self.checking.is_empty()) {
                return Ok(got);
            }
            let left = match timeout {
                Some(t) => match t.checked_sub(started.elapsed()) {
                    Some(left) if !left.is_zero() => left,
                    _ => return Ok(got),
                },
                None => Duration::from_secs(3600),
            };
            if !self.checking.is_empty() {
                // A check takes microseconds: wait for it in short slices,
                // looking at the engines between them.
                let wait = if self.ops.is_empty() {
                    left
                } else {
                    left.min(CHECK_WAIT_SLICE)
                };
                got += self.drain_checks(out, wait);
                continue;
            }
            let (cache, remote) = (self.local.in_flight(), self.remote.in_flight());
            let (tier, wait) = match (cache > 0, remote > 0) {
                (true, true) => (Tier::Cache, left.min(BOTH_WAIT_SLICE)),
                (true, false) => (Tier::Cache, left),
                (false, _) => (Tier::Remote, left),
            };
            got += self.reap_tier(tier, out, wait)?;
        }
    }
}

/// Counts `n` bytes into the writer's queue, waiting up to
/// [`QUEUE_WAIT_MAX`] for room (the writer frees one entry's bytes at a
/// time). Without the wait, a writer a little slower than the remote path
/// (it creates a file per entry, on cores shared with the fetch) let every
/// object it fell behind on go, and the run's next epoch fetched them all
/// again: the filling run's cached epochs ran at a fraction of the next
/// run's. False when there is still no room, or caching stopped.
fn reserve_queue(shared: &Shared, n: u64) -> bool {
    let mut started = None;
    loop {
        if shared.queued_bytes.fetch_add(n, Ordering::Relaxed) + n <= WRITE_QUEUE_BYTES_MAX {
            return true;
        }
        shared.queued_bytes.fetch_sub(n, Ordering::Relaxed);
        let since = *started.get_or_insert_with(Instant::now);
        if !shared.admits() || since.elapsed() >= QUEUE_WAIT_MAX {
            return false;
        }
        std::thread::sleep(QUEUE_WAIT_STEP);
    }
}

/// The data cache's engine for the loader, or the remote engine alone.
pub fn with_cache(
    remote: RemoteReadEngine,
    cache: Option<DataCache>,
    reader: &crate::reader::ReaderConfig,
) -> Result<Box<dyn ReadEngine>, ReadError> {
    let Some(cache) = cache else {
        return Ok(Box::new(remote));
    };
    let local = crate::reader::open_engine(
        crate::reader::IoChoice::Auto,
        Arc::clone(cache.files()),
        reader,
    )?;
    if let Some(w) = &local.fallback_warning {
        tracing::warn!("data cache reads: {w}");
    }
    Ok(Box::new(CachedEngine::new(local.engine, remote, cache)))
}
