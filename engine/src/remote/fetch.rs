//! The fetch engine: reads of object ranges, many GETs in flight on the
//! remote runtime, completions into a channel the loader thread drains.
//!
//! One dispatcher task owns all the engine's state (the window, the queue of
//! parts not started, the reads under way), so nothing is locked: the loader
//! sends reads in through a channel, part tasks report back through their
//! `JoinSet`, and completions go out through a crossbeam channel. The loader
//! thread never blocks on tokio: `submit` is a channel send, `try_reap` a
//! channel poll, and `reap` waits on the crossbeam channel with a timeout.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::error::RemoteError;
use super::part::{fetch_part, DestPtr, Part, PartContext, PartDone, WarningLimiter};
use super::store::StoreHandle;
use super::{FetchConfig, RemoteObject, RemoteRuntime};

/// One read: `range` of object `object` (an index into the engine's object
/// table) into `dest`.
#[derive(Clone, Debug)]
pub struct FetchRead {
    /// Index into the object table given to `FetchEngine::start`.
    pub object: u32,
    /// Bytes of the object; must lie within its listed size.
    pub range: Range<u64>,
    /// Where `range.start` goes; valid for `range.end - range.start` writes.
    pub dest: *mut u8,
    /// Returned in the completion, untouched.
    pub tag: u64,
}

/// The outcome of one `FetchRead`.
#[derive(Debug)]
pub struct FetchCompletion {
    /// The read's `tag`.
    pub tag: u64,
    /// `Ok` when every byte of the range landed in `dest`.
    pub result: Result<(), RemoteError>,
    /// For a read submitted with `keep` that was fetched in one GET and
    /// succeeded: the response body's chunks, in order (refcounted views
    /// of the receive buffers, no copy), e.g. for the data cache. Else empty.
    pub chunks: Vec<bytes::Bytes>,
}

/// A read as the dispatcher keeps it until its last part is done.
struct ReadState {
    tag: u64,
    parts_left: u64,
    error: Option<RemoteError>,
    chunks: Vec<bytes::Bytes>,
}

/// A read on its way to the dispatcher (its pointer wrapped to cross threads).
enum Command {
    Read {
        id: u64,
        object: u32,
        range: Range<u64>,
        dest: DestPtr,
        tag: u64,
        keep: bool,
    },
}

/// Reads object ranges into caller memory over HTTP; driven by one thread.
pub struct FetchEngine {
    runtime: Arc<RemoteRuntime>,
    commands: Option<mpsc::UnboundedSender<Command>>,
    completions: crossbeam_channel::Receiver<FetchCompletion>,
    stopped: Option<std::sync::mpsc::Receiver<()>>,
    objects: Arc<Vec<RemoteObject>>,
    store: StoreHandle,
    outstanding: usize,
    next_id: u64,
    queued_reads_max: usize,
}

impl std::fmt::Debug for FetchEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FetchEngine")
            .field("store", &self.store.display)
            .field("objects", &self.objects.len())
            .field("outstanding", &self.outstanding)
            .finish()
    }
}

impl FetchEngine {
    /// Starts the engine's dispatcher on `runtime` over `objects` (the
    /// source's listing: keys relative to `store`'s prefix, sizes, ETags).
    pub fn start(
        runtime: Arc<RemoteRuntime>,
        store: StoreHandle,
        objects: Arc<Vec<RemoteObject>>,
        cfg: FetchConfig,
    ) -> Result<FetchEngine, RemoteError> {
        cfg.validate()?;
        if objects.len() > u32::MAX as usize {
            return Err(RemoteError::InvalidConfig {
                reason: format!("{} objects, at most {}", objects.len(), u32::MAX),
            });
        }
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let (stopped_tx, stopped_rx) = std::sync::mpsc::channel();
        let ctx = Arc::new(PartContext {
            store: store.clone(),
            objects: Arc::clone(&objects),
            cfg: cfg.clone(),
            jitter: std::collections::hash_map::RandomState::new(),
            warnings: WarningLimiter::new(),
        });
        runtime.handle().spawn(async move {
            dispatch(ctx, cmd_rx, done_tx).await;
            // The receiver may be gone if the engine was leaked; nothing to do then.
            let _ = stopped_tx.send(());
        });
        Ok(FetchEngine {
            runtime,
            commands: Some(cmd_tx),
            completions: done_rx,
            stopped: Some(stopped_rx),
            objects,
            store,
            outstanding: 0,
            next_id: 0,
            queued_reads_max: cfg.queued_reads_max,
        })
    }

    /// The runtime the engine's GETs run on.
    pub fn runtime(&self) -> &Arc<RemoteRuntime> {
        &self.runtime
    }

    /// The counters of this engine's store.
    pub fn metrics(&self) -> &Arc<super::RemoteMetrics> {
        &self.store.metrics
    }

    /// Reads submitted whose completion has not been reaped yet.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Most reads outstanding; `submit` refuses to go past it.
    pub fn max_outstanding(&self) -> usize {
        self.queued_reads_max
    }

    /// Queues the reads, all or none: when one is invalid (`InvalidRead`) or
    /// they would put more than `max_outstanding()` outstanding (`Busy`),
    /// none is queued. Each queued read yields exactly one completion.
    ///
    /// # Safety
    /// Each `dest` must be valid for `range.end - range.start` writes, and
    /// nobody else may read or write it until the read's completion has been
    /// reaped or the engine dropped (drop waits for every GET under way).
    pub unsafe fn submit(&mut self, reads: &[FetchRead]) -> Result<(), RemoteError> {
        // SAFETY: the caller's contract is `submit_keeping`'s.
        unsafe { self.submit_keeping(reads, &[]) }
    }

    /// `submit`, where `keep[i]` (false past its end) asks for read i's
    /// body chunks in its completion (`FetchCompletion::chunks`); only a
    /// read fetched in one GET (at most `part_bytes`) gets them.
    ///
    /// # Safety
    /// As for `submit`.
    pub unsafe fn submit_keeping(
        &mut self,
        reads: &[FetchRead],
        keep: &[bool],
    ) -> Result<(), RemoteError> {
        if self.outstanding + reads.len() > self.queued_reads_max {
            return Err(RemoteError::Busy {
                queued: self.outstanding,
                max_queued: self.queued_reads_max,
            });
        }
        for read in reads {
            self.check(read)?;
        }
        let commands = self.commands.as_ref().ok_or_else(|| RemoteError::Stopped {
            reason: "the engine is shutting down".to_string(),
        })?;
        for (i, read) in reads.iter().enumerate() {
            let id = self.next_id;
            self.next_id += 1;
            commands
                .send(Command::Read {
                    id,
                    object: read.object,
                    range: read.range.clone(),
                    dest: DestPtr(read.dest),
                    tag: read.tag,
                    keep: keep.get(i).copied().unwrap_or(false),
                })
                .map_err(|_| RemoteError::Stopped {
                    reason: "the dispatcher task ended (its runtime was shut down)".to_string(),
                })?;
            self.outstanding += 1;
        }
        Ok(())
    }

    fn check(&self, read: &FetchRead) -> Result<(), RemoteError> {
        let invalid = |reason: String| Err(RemoteError::InvalidRead { reason });
        let Some(object) = self.objects.get(read.object as usize) else {
            return invalid(format!(
                "object #{} is not in the table of {}",
                read.object,
                self.objects.len()
            ));
        };
        if read.range.start > read.range.end || read.range.end > object.size {
            return invalid(format!(
                "bytes {:?} of {:?} are outside its {} bytes",
                read.range, object.key, object.size
            ));
        }
        if read.dest.is_null() && read.range.start != read.range.end {
            return invalid(format!(
                "a null destination for bytes {:?} of {:?}",
                read.range, object.key
            ));
        }
        Ok(())
    }

    /// One completion if one is ready; never blocks.
    pub fn try_reap(&mut self) -> Option<FetchCompletion> {
        let c = self.completions.try_recv().ok()?;
        self.outstanding -= 1;
        Some(c)
    }

    /// Appends completions to `out` and returns how many: waits until
    /// `min_complete` arrived, `timeout` passed, or nothing is outstanding.
    pub fn reap(
        &mut self,
        out: &mut Vec<FetchCompletion>,
        min_complete: usize,
        timeout: Duration,
    ) -> usize {
        let deadline = Instant::now() + timeout;
        let mut got = 0;
        while self.outstanding > 0 {
            let next = if got >= min_complete {
                self.completions.try_recv().ok()
            } else {
                self.completions.recv_deadline(deadline).ok()
            };
            let Some(c) = next else { break };
            self.outstanding -= 1;
            out.push(c);
            got += 1;
        }
        got
    }
}

impl Drop for FetchEngine {
    fn drop(&mut self) {
        // Closing the command channel makes the dispatcher abort its GETs and
        // wait for every part task to be gone before it signals, so no byte
        // lands in a destination after this returns.
        self.commands = None;
        if let Some(stopped) = self.stopped.take() {
            // Err: the runtime is already shut down, so no task runs any more.
            let _ = stopped.recv_timeout(Duration::from_secs(60));
        }
    }
}

/// The dispatcher: admits parts while the window and byte budget allow,
/// gathers their outcomes, and completes reads.
async fn dispatch(
    ctx: Arc<PartContext>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    done: crossbeam_channel::Sender<FetchCompletion>,
) {
    let cfg = ctx.cfg.clone();
    let metrics = Arc::clone(&ctx.store.metrics);
    let mut window = Window::new(&cfg);
    metrics.window.store(window.size as u64, Ordering::Relaxed);
    let mut pending: VecDeque<Part> = VecDeque::new();
    let mut reads: HashMap<u64, ReadState> = HashMap::new();
    let mut tasks: JoinSet<PartDone> = JoinSet::new();
    let mut bytes_in_flight: u64 = 0;
    loop {
        // Admit what the window and the byte budget allow.
        while let Some(part) = pending.front() {
            let len = part.range.end - part.range.start;
            let room = tasks.len() < window.size
                && (tasks.is_empty() || bytes_in_flight + len <= cfg.bytes_in_flight_max);
            if !room {
                break;
            }
            let Some(part) = pending.pop_front() else {
                break;
            };
            if reads.get(&part.read_id).is_some_and(|r| r.error.is_some()) {
                // A sibling already failed: do not fetch the rest.
                finish_part(&mut reads, part.read_id, Ok(()), Vec::new(), &done);
                continue;
            }
            bytes_in_flight += len;
            metrics.gets_in_flight.fetch_add(1, Ordering::Relaxed);
            tasks.spawn(fetch_part(Arc::clone(&ctx), part));
        }
        tokio::select! {
            cmd = commands.recv() => match cmd {
                Some(Command::Read { id, object, range, dest, tag, keep }) => {
                    split(id, object, range, dest, tag, keep, &cfg, &mut pending, &mut reads, &done);
                }
                None => {
                    // The engine was dropped: stop everything and wait for it.
                    pending.clear();
                    tasks.abort_all();
                    while tasks.join_next().await.is_some() {}
                    metrics.gets_in_flight.store(0, Ordering::Relaxed);
                    return;
                }
            },
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                metrics.gets_in_flight.fetch_sub(1, Ordering::Relaxed);
                match joined {
                    Ok(part) => {
                        bytes_in_flight -= part.len_bytes;
                        window.after_get(&metrics, part.result.is_ok());
                        finish_part(&mut reads, part.read_id, part.result, part.chunks, &done);
                    }
                    Err(join_error) => {
                        // A part task panicked: nothing can say which read it
                        // was. Stop every GET, then fail every read under way,
                        // so the loader sees an error instead of waiting.
                        tracing::error!("remote fetch task failed: {join_error}");
                        tasks.abort_all();
                        while tasks.join_next().await.is_some() {}
                        metrics.gets_in_flight.store(0, Ordering::Relaxed);
                        let stopped = |tag| FetchCompletion {
                            tag,
                            result: Err(RemoteError::Stopped {
                                reason: format!("a fetch task failed ({join_error}); restart the loader"),
                            }),
                            chunks: Vec::new(),
                        };
                        for (_, state) in reads.drain() {
                            let _ = done.send(stopped(state.tag));
                        }
                        // Reads still in the channel, and any sent until the
                        // engine notices: each gets its completion too.
                        commands.close();
                        while let Some(Command::Read { tag, .. }) = commands.recv().await {
                            let _ = done.send(stopped(tag));
                        }
                        return;
                    }
                }
            }
        }
    }
}

/// Splits a read into parts of at most `part_bytes` and queues them.
#[allow(clippy::too_many_arguments)] // the dispatcher's state, passed apart on purpose
fn split(
    id: u64,
    object: u32,
    range: Range<u64>,
    dest: DestPtr,
    tag: u64,
    keep: bool,
    cfg: &FetchConfig,
    pending: &mut VecDeque<Part>,
    reads: &mut HashMap<u64, ReadState>,
    done: &crossbeam_channel::Sender<FetchCompletion>,
) {
    let len = range.end - range.start;
    if len == 0 {
        let _ = done.send(FetchCompletion {
            tag,
            result: Ok(()),
            chunks: Vec::new(),
        });
        return;
    }
    let parts = len.div_ceil(cfg.part_bytes);
    reads.insert(
        id,
        ReadState {
            tag,
            parts_left: parts,
            error: None,
            chunks: Vec::new(),
        },
    );
    let mut start = range.start;
    while start < range.end {
        let end = (start + cfg.part_bytes).min(range.end);
        // SAFETY (pointer arithmetic only): `start - range.start < len`, and
        // `dest` is valid for `len` bytes by `submit`'s contract.
        let part_dest = unsafe { dest.0.add((start - range.start) as usize) };
        pending.push_back(Part {
            read_id: id,
            object,
            range: start..end,
            dest: DestPtr(part_dest),
            keep: keep && parts == 1,
        });
        start = end;
    }
}

/// Counts one part of a read done; completes the read after its last part.
/// The first error of a read is the one reported.
fn finish_part(
    reads: &mut HashMap<u64, ReadState>,
    read_id: u64,
    result: Result<(), RemoteError>,
    chunks: Vec<bytes::Bytes>,
    done: &crossbeam_channel::Sender<FetchCompletion>,
) {
    let Some(state) = reads.get_mut(&read_id) else {
        debug_assert!(false, "a part of an unknown read {read_id}");
        return;
    };
    if let Err(e) = result {
        state.error.get_or_insert(e);
    }
    // Only a read of one part keeps chunks, so these are all of them.
    state.chunks = chunks;
    state.parts_left -= 1;
    if state.parts_left == 0 {
        if let Some(state) = reads.remove(&read_id) {
            let result = match state.error {
                Some(e) => Err(e),
                None => Ok(()),
            };
            // The engine may have been dropped already; then nobody waits.
            let chunks = if result.is_ok() {
                state.chunks
            } else {
                Vec::new()
            };
            let _ = done.send(FetchCompletion {
                tag: state.tag,
                result,
                chunks,
            });
        }
    }
}

/// The adaptive window: additive increase while GETs succeed, halved (at
/// most once per `WINDOW_CUT_INTERVAL_MS`) when the store throttles.
struct Window {
    size: usize,
    min: usize,
    max: usize,
    successes: usize,
    throttled_seen: u64,
    last_cut: Instant,
}

/// Shortest time between two cuts of the window: one burst of 503s from a
/// full window must not cut it to the minimum at once.
pub const WINDOW_CUT_INTERVAL_MS: u64 = 500;

impl Window {
    fn new(cfg: &FetchConfig) -> Window {
        Window {
            size: cfg.window_initial,
            min: cfg.window_min,
            max: cfg.window_max,
            successes: 0,
            throttled_seen: 0,
            last_cut: Instant::now(),
        }
    }

    fn after_get(&mut self, metrics: &super::RemoteMetrics, ok: bool) {
        let throttled =
            metrics.retries[super::RetryCause::Throttled.index()].load(Ordering::Relaxed);
        if throttled > self.throttled_seen {
            self.throttled_seen = throttled;
            if self.last_cut.elapsed() >= Duration::from_millis(WINDOW_CUT_INTERVAL_MS) {
                self.size = (self.size / 2).max(self.min);
                self.last_cut = Instant::now();
                self.successes = 0;
                metrics.window_cuts.fetch_add(1, Ordering::Relaxed);
            }
        } else if ok {
            self.successes += 1;
            if self.successes >= self.size {
                self.successes = 0;
                self.size = (self.size + (self.size / 16).max(1)).min(self.max);
            }
        }
        metrics.window.store(self.size as u64, Ordering::Relaxed);
    }
}
