//! The fetch engine: reads of object ranges, many GETs in flight on the
//! remote runtime, completions into a channel the loader thread drains.
//!
//! One dispatcher task (`dispatch.rs`) owns the engine's state (the queue
//! of parts not started, retries, hedges, the reads under way): the loader
//! sends reads in through a channel, attempt tasks report back through
//! their `JoinSet`, and completions go out through a crossbeam channel. The
//! loader thread never blocks on tokio: `submit` is a channel send,
//! `try_reap` a channel poll, and `reap` waits on the crossbeam channel with
//! a timeout. How many GETs go, and how fast, is the store's admission
//! controller's to say (`admission.rs`), shared by every engine of the
//! process reading that store.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::admission::{Admission, WindowLimits};
pub use super::dispatch::FetchCompletion;
use super::dispatch::{Command, Dispatcher};
use super::error::RemoteError;
use super::part::{DestPtr, PartContext, WarningLimiter};
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
        let admission = Admission::for_store(
            &store.admission_key(),
            WindowLimits {
                initial: cfg.window_initial,
                min: cfg.window_min,
                max: cfg.window_max,
            },
        );
        // The first engine of a store gives its figures to `stat`.
        let _ = store.metrics.limits.set(Arc::clone(&admission.figures));
        let ctx = Arc::new(PartContext {
            store: store.clone(),
            objects: Arc::clone(&objects),
            cfg: cfg.clone(),
            jitter: std::collections::hash_map::RandomState::new(),
            warnings: WarningLimiter::new(),
        });
        runtime.handle().spawn(async move {
            Dispatcher::new(ctx, admission, done_tx).run(cmd_rx).await;
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
