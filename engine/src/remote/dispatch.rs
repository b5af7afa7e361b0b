//! The dispatcher of a fetch engine: one task that owns the engine's state
//! (reads under way, parts not started, retries waiting, attempts in
//! flight), so nothing but the store's admission controller is locked.
//!
//! Each part of a read is fetched by attempts, each a task of its own
//! (`part::attempt`), each admitted by the store's controller
//! (`admission.rs`): new parts, retries and hedges all take a slot of its
//! window and a token of its rate limit, retries first (their reads are
//! the oldest), then hedges, then new parts in the order they came.
//!
//! Who writes a destination: at most one attempt of a part at a time, its
//! writer (`Sink::Direct`). A hedge (`Sink::Buffer`) keeps its body in
//! refcounted chunks. When a hedge answers first, the writer is cancelled
//! and the read completes only after the writer has returned: then the
//! hedge's bytes past what the writer wrote are copied in (those before it
//! are compared, not written again). So no byte lands after a completion,
//! and none is written twice by a hedge.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use super::admission::{Admission, Admit};
use super::answer::Failure;
use super::error::RemoteError;
use super::hedge::{
    size_class, Hedging, HEDGES_PER_GET_MAX, HEDGE_BYTES_IN_FLIGHT_MAX, HEDGE_LONE_MULTIPLE,
    HEDGE_OVERTAKEN_MIN,
};
use super::part::{attempt, AttemptDone, AttemptJob, DestPtr, Next, PartContext, Sink, Tries};
use super::FetchConfig;

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

/// A read on its way to the dispatcher (its pointer wrapped to cross threads).
pub(super) enum Command {
    Read {
        id: u64,
        object: u32,
        range: Range<u64>,
        dest: DestPtr,
        tag: u64,
        keep: bool,
    },
}

/// A GET due for a hedge but not yet overtaken is looked at again after this.
const HEDGE_RECHECK: Duration = Duration::from_millis(5);

/// No hedges while the store throttled this recently: a hedge is one more
/// request to a store that asks for fewer.
const NO_HEDGE_AFTER_THROTTLE_MS: u64 = 5_000;

/// A read until its last part is done.
struct ReadState {
    tag: u64,
    parts_left: u64,
    error: Option<RemoteError>,
    chunks: Vec<Bytes>,
}

/// A part until it completes.
struct PartState {
    read_id: u64,
    object: u32,
    range: Range<u64>,
    dest: DestPtr,
    keep: bool,
    tries: Tries,
    first_sent: Option<Instant>,
    /// The attempt writing the destination, while one runs.
    writer: Option<u64>,
    /// Hedges sent for the current writer.
    hedges_sent: u32,
    /// Hedges running (any writer).
    hedge_ids: Vec<u64>,
    /// A hedge's complete body, waiting for the writer to return.
    won: Option<Vec<Bytes>>,
    /// Bytes the last writer that failed left in the destination (the
    /// first bytes of the range, from the same version of the object).
    partial: u64,
}

/// An attempt in flight.
struct AttemptInfo {
    part: u64,
    hedge: bool,
    sent_at: Instant,
    len_bytes: u64,
    /// GETs answered, and GETs in flight, when it was sent: once more than
    /// that many more are answered, some sent after it were.
    answered_at_send: u64,
    in_flight_at_send: u64,
    /// Sending (or dropping) cancels it.
    cancel: Option<oneshot::Sender<()>>,
}

/// What the admission pass found it could not start yet.
#[derive(Default)]
struct Blocked {
    /// Wake at this time (a token, a Retry-After, a retry or hedge due).
    until: Option<Instant>,
    /// The window is full: wake when any GET of the store ends.
    full: bool,
}

/// What goes next, in priority order.
enum Next2 {
    Retry(u64),
    Hedge(u64),
    New(u64),
}

pub(super) struct Dispatcher {
    ctx: Arc<PartContext>,
    cfg: FetchConfig,
    admission: Arc<Admission>,
    done: crossbeam_channel::Sender<FetchCompletion>,
    reads: HashMap<u64, ReadState>,
    parts: HashMap<u64, PartState>,
    next_part: u64,
    pending: VecDeque<u64>,
    retries: BinaryHeap<Reverse<(Instant, u64)>>,
    /// (when, writer attempt id) of hedges due.
    hedges_due: BinaryHeap<Reverse<(Instant, u64)>>,
    attempts: HashMap<u64, AttemptInfo>,
    next_attempt: u64,
    tasks: JoinSet<AttemptDone>,
    bytes_in_flight: u64,
    hedge_bytes_in_flight: u64,
    hedging: Hedging,
    /// Attempts answered so far.
    answered: u64,
}

impl Dispatcher {
    pub(super) fn new(
        ctx: Arc<PartContext>,
        admission: Arc<Admission>,
        done: crossbeam_channel::Sender<FetchCompletion>,
    ) -> Dispatcher {
        Dispatcher {
            cfg: ctx.cfg.clone(),
            ctx,
            admission,
            done,
            reads: HashMap::new(),
            parts: HashMap::new(),
            next_part: 0,
            pending: VecDeque::new(),
            retries: BinaryHeap::new(),
            hedges_due: BinaryHeap::new(),
            attempts: HashMap::new(),
            next_attempt: 0,
            tasks: JoinSet::new(),
            bytes_in_flight: 0,
            hedge_bytes_in_flight: 0,
            hedging: Hedging::default(),
            answered: 0,
        }
    }

    /// Runs until the engine is dropped (its command channel closes).
    pub(super) async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let admission = Arc::clone(&self.admission);
        loop {
            // Made before the admission pass, so a GET of another engine
            // that ends between the pass and the wait still wakes us.
            let room = admission.changed();
            tokio::pin!(room);
            room.as_mut().enable();
            let blocked = self.admit();
            let sleep = async {
                match blocked.until {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                cmd = commands.recv() => match cmd {
                    Some(Command::Read { id, object, range, dest, tag, keep }) => {
                        self.split(id, object, range, dest, tag, keep);
                    }
                    None => {
                        self.stop().await;
                        return;
                    }
                },
                Some(joined) = self.tasks.join_next(), if !self.tasks.is_empty() => match joined {
                    Ok(done) => self.attempt_done(done),
                    Err(join_error) => {
                        self.panicked(join_error, &mut commands).await;
                        return;
                    }
                },
                _ = sleep => {}
                _ = room, if blocked.full => {}
            }
        }
    }

    /// Stops every attempt and waits for each to be gone, so no byte lands
    /// in a destination after the engine's drop returns.
    async fn stop(&mut self) {
        self.pending.clear();
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        let now = Instant::now();
        for (_, info) in self.attempts.drain() {
            self.admission
                .done(now, info.sent_at, super::admission::Outcome::Cancelled);
        }
        self.ctx
            .store
            .metrics
            .gets_in_flight
            .store(0, Ordering::Relaxed);
    }

    /// An attempt task panicked: nothing can say which read it was. Stop
    /// every GET, then fail every read under way, so the loader sees an
    /// error instead of waiting.
    async fn panicked(
        &mut self,
        join_error: tokio::task::JoinError,
        commands: &mut mpsc::UnboundedReceiver<Command>,
    ) {
        tracing::error!("remote fetch task failed: {join_error}");
        self.stop().await;
        let stopped = |tag| FetchCompletion {
            tag,
            result: Err(RemoteError::Stopped {
                reason: format!("a fetch task failed ({join_error}); restart the loader"),
            }),
            chunks: Vec::new(),
        };
        for (_, state) in self.reads.drain() {
            let _ = self.done.send(stopped(state.tag));
        }
        // Reads still in the channel, and any sent until the engine
        // notices: each gets its completion too.
        commands.close();
        while let Some(Command::Read { tag, .. }) = commands.recv().await {
            let _ = self.done.send(stopped(tag));
        }
    }

    /// Splits a read into parts of at most `part_bytes` and queues them.
    fn split(
        &mut self,
        id: u64,
        object: u32,
        range: Range<u64>,
        dest: DestPtr,
        tag: u64,
        keep: bool,
    ) {
        let len = range.end - range.start;
        if len == 0 {
            let _ = self.done.send(FetchCompletion {
                tag,
                result: Ok(()),
                chunks: Vec::new(),
            });
            return;
        }
        let parts = len.div_ceil(self.cfg.part_bytes);
        self.reads.insert(
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
            let end = (start + self.cfg.part_bytes).min(range.end);
            // SAFETY (pointer arithmetic only): `start - range.start < len`,
            // and `dest` is valid for `len` bytes by `submit`'s contract.
            let part_dest = unsafe { dest.0.add((start - range.start) as usize) };
            let part = self.next_part;
            self.next_part += 1;
            self.parts.insert(
                part,
                PartState {
                    read_id: id,
                    object,
                    range: start..end,
                    dest: DestPtr(part_dest),
                    keep: keep && parts == 1,
                    tries: Tries::new(&self.cfg),
                    first_sent: None,
                    writer: None,
                    hedges_sent: 0,
                    hedge_ids: Vec::new(),
                    won: None,
                    partial: 0,
                },
            );
            self.pending.push_back(part);
            start = end;
        }
    }

    /// The next candidate, dropping stale ones (a part that completed, a
    /// hedge no longer wanted); `None` with what to wait for otherwise.
    fn next_candidate(&mut self, now: Instant, blocked: &mut Blocked) -> Option<Next2> {
        while let Some(&Reverse((due, part))) = self.retries.peek() {
            if !self.parts.contains_key(&part) {
                self.retries.pop();
                continue;
            }
            if due <= now {
                return Some(Next2::Retry(part));
            }
            blocked.until = Some(due);
            break;
        }
        while let Some(&Reverse((due, writer))) = self.hedges_due.peek() {
            if !self.hedge_wanted(writer) {
                self.hedges_due.pop();
                continue;
            }
            if due <= now {
                if self.overtaken(writer, now) {
                    return Some(Next2::Hedge(writer));
                }
                // Slow, but so is everything sent since: look again soon.
                self.hedges_due.pop();
                self.hedges_due.push(Reverse((now + HEDGE_RECHECK, writer)));
                continue;
            }
            blocked.until = Some(blocked.until.map_or(due, |t| t.min(due)));
            break;
        }
        while let Some(&part) = self.pending.front() {
            if self.parts.contains_key(&part) {
                return Some(Next2::New(part));
            }
            self.pending.pop_front();
        }
        None
    }

    /// Whether at least `HEDGE_OVERTAKEN_MIN` GETs sent after `writer` were
    /// answered (counted as: more answers since it was sent than GETs
    /// were in flight then, by that many): it is an outlier, not one of a
    /// store, a link or a machine that is slow for every GET.
    /// With nothing sent after it (the last reads of a run), a GET running
    /// `HEDGE_LONE_MULTIPLE` times its hedge wait counts as overtaken too.
    fn overtaken(&self, writer: u64, now: Instant) -> bool {
        self.attempts.get(&writer).is_some_and(|a| {
            let overtaken = self.answered.saturating_sub(a.answered_at_send)
                >= a.in_flight_at_send + HEDGE_OVERTAKEN_MIN;
            let lone = self.hedging.hedge_after(a.len_bytes).is_some_and(|after| {
                now.saturating_duration_since(a.sent_at) >= after * HEDGE_LONE_MULTIPLE
            });
            overtaken || lone
        })
    }

    /// Whether writer `writer` is still running, unanswered by a hedge,
    /// with hedges left to send.
    fn hedge_wanted(&self, writer: u64) -> bool {
        let Some(info) = self.attempts.get(&writer) else {
            return false;
        };
        self.parts.get(&info.part).is_some_and(|p| {
            p.writer == Some(writer) && p.won.is_none() && p.hedges_sent < HEDGES_PER_GET_MAX
        })
    }

    /// Starts what the window, the rate limit and the byte budget allow.
    fn admit(&mut self) -> Blocked {
        let mut blocked = Blocked::default();
        loop {
            let now = Instant::now();
            let Some(next) = self.next_candidate(now, &mut blocked) else {
                return blocked;
            };
            let part_id = match next {
                Next2::Retry(p) | Next2::New(p) => p,
                // `next_candidate` checked that the writer runs.
                Next2::Hedge(writer) => self.attempts.get(&writer).map_or(u64::MAX, |a| a.part),
            };
            let Some(len) = self
                .parts
                .get(&part_id)
                .map(|p| p.range.end - p.range.start)
            else {
                debug_assert!(false, "a candidate of no part");
                return blocked;
            };
            if let Next2::Hedge(writer) = next {
                if !self.hedge_allowed(len) {
                    tracing::debug!(
                        "no hedge of attempt {writer}: over its budget, or the store throttled"
                    );
                    self.hedges_due.pop();
                    continue;
                }
            }
            let room =
                self.tasks.is_empty() || self.bytes_in_flight + len <= self.cfg.bytes_in_flight_max;
            if !room {
                return blocked;
            }
            match self.admission.try_admit(now) {
                Admit::Go => {}
                Admit::Full => {
                    blocked.full = true;
                    if let Next2::Hedge(_) = next {
                        self.hedging.refund();
                    }
                    return blocked;
                }
                Admit::Until(t) => {
                    blocked.until = Some(blocked.until.map_or(t, |u| u.min(t)));
                    if let Next2::Hedge(_) = next {
                        self.hedging.refund();
                    }
                    return blocked;
                }
            }
            match next {
                Next2::Retry(_) => {
                    self.retries.pop();
                    self.spawn(part_id, false, now);
                }
                Next2::New(_) => {
                    self.pending.pop_front();
                    self.spawn(part_id, false, now);
                }
                Next2::Hedge(writer) => {
                    self.hedges_due.pop();
                    if let Some(a) = self.attempts.get(&writer) {
                        tracing::debug!(
                            "hedging attempt {writer} (part {part_id}, {len} bytes) after {:?}",
                            now.saturating_duration_since(a.sent_at)
                        );
                    }
                    self.spawn(part_id, true, now);
                    self.ctx
                        .store
                        .metrics
                        .hedges
                        .fetch_add(1, Ordering::Relaxed);
                    // The next hedge of the same GET, after as long again.
                    let sent = self.attempts.get(&writer).map(|a| a.sent_at);
                    let k = self.parts.get(&part_id).map(|p| p.hedges_sent + 1);
                    if let (Some(after), Some(sent), Some(k)) =
                        (self.hedging.hedge_after(len), sent, k)
                    {
                        self.hedges_due.push(Reverse((sent + after * k, writer)));
                    }
                }
            }
        }
    }

    /// A hedge of a part of `len` bytes may go: the budget has a token
    /// (spent here), the bytes fit, the store has not throttled lately.
    fn hedge_allowed(&mut self, len: u64) -> bool {
        if self.hedge_bytes_in_flight + len > HEDGE_BYTES_IN_FLIGHT_MAX
            || self
                .admission
                .throttled_within(Duration::from_millis(NO_HEDGE_AFTER_THROTTLE_MS))
        {
            return false;
        }
        self.hedging.try_spend()
    }

    /// Starts an attempt of `part_id` (admitted at `now`).
    fn spawn(&mut self, part_id: u64, hedge: bool, now: Instant) {
        let Some(p) = self.parts.get_mut(&part_id) else {
            debug_assert!(false, "spawn of an unknown part");
            return;
        };
        let id = self.next_attempt;
        self.next_attempt += 1;
        let len = p.range.end - p.range.start;
        let (cancel_tx, cancel_rx) = oneshot::channel();
        let job = AttemptJob {
            id,
            object: p.object,
            range: p.range.clone(),
            sink: if hedge {
                Sink::Buffer
            } else {
                Sink::Direct(p.dest)
            },
            keep: p.keep,
            headers_wait_ms: p.tries.headers_wait_ms,
        };
        p.first_sent.get_or_insert(now);
        if hedge {
            p.hedges_sent += 1;
            p.hedge_ids.push(id);
            self.hedge_bytes_in_flight += len;
        } else {
            debug_assert!(p.writer.is_none(), "two writers of one part");
            p.writer = Some(id);
            p.hedges_sent = 0;
            if let Some(after) = self.hedging.hedge_after(len) {
                self.hedges_due.push(Reverse((now + after, id)));
            }
        }
        let in_flight_at_send = self.attempts.len() as u64;
        self.attempts.insert(
            id,
            AttemptInfo {
                part: part_id,
                hedge,
                sent_at: now,
                len_bytes: len,
                answered_at_send: self.answered,
                in_flight_at_send,
                cancel: Some(cancel_tx),
            },
        );
        self.bytes_in_flight += len;
        self.ctx
            .store
            .metrics
            .gets_in_flight
            .fetch_add(1, Ordering::Relaxed);
        self.tasks
            .spawn(attempt(Arc::clone(&self.ctx), job, cancel_rx));
    }

    /// An attempt ended: tell the controller, then settle its part.
    fn attempt_done(&mut self, done: AttemptDone) {
        let now = Instant::now();
        let Some(info) = self.attempts.remove(&done.id) else {
            debug_assert!(false, "an unknown attempt {}", done.id);
            return;
        };
        self.ctx
            .store
            .metrics
            .gets_in_flight
            .fetch_sub(1, Ordering::Relaxed);
        self.bytes_in_flight -= info.len_bytes;
        if info.hedge {
            self.hedge_bytes_in_flight -= info.len_bytes;
        }
        self.admission.done(now, info.sent_at, done.outcome);
        if done.result.is_ok() {
            self.answered += 1;
            let knew = self.hedging.hedge_after(info.len_bytes).is_some();
            self.hedging.answered(info.len_bytes, done.took);
            if !knew {
                self.schedule_first_hedges(info.len_bytes);
            }
        }
        if !self.parts.contains_key(&info.part) {
            // A hedge of a part already complete: nothing to do.
            return;
        }
        if info.hedge {
            self.hedge_done(info.part, done);
        } else {
            self.writer_done(info.part, done, now);
        }
    }

    /// A size class just learned when to hedge: the GETs of its size
    /// already running (the first of a run) get their hedge too.
    fn schedule_first_hedges(&mut self, len_bytes: u64) {
        let Some(after) = self.hedging.hedge_after(len_bytes) else {
            return;
        };
        let class = size_class(len_bytes);
        for (&id, info) in &self.attempts {
            if !info.hedge && size_class(info.len_bytes) == class {
                self.hedges_due.push(Reverse((info.sent_at + after, id)));
            }
        }
    }

    fn hedge_done(&mut self, part_id: u64, done: AttemptDone) {
        let Some(p) = self.parts.get_mut(&part_id) else {
            return;
        };
        p.hedge_ids.retain(|&h| h != done.id);
        // A hedge that failed is not retried: its writer goes on.
        let Ok(chunks) = done.result else {
            return;
        };
        if p.won.is_some() {
            return;
        }
        match p.writer {
            Some(writer) => {
                tracing::debug!("hedge {} of part {part_id} answered first", done.id);
                // First complete answer: stop the writer, finish when it returned.
                p.won = Some(chunks);
                if let Some(cancel) = self.attempts.get_mut(&writer).and_then(|a| a.cancel.take()) {
                    let _ = cancel.send(());
                }
            }
            // The writer failed and waits for its retry: the hedge's answer
            // is the whole range (past what the failed writer left).
            None => {
                let partial = p.partial;
                self.finish_with_hedge(part_id, partial, chunks);
            }
        }
    }

    fn writer_done(&mut self, part_id: u64, done: AttemptDone, now: Instant) {
        let Some(p) = self.parts.get_mut(&part_id) else {
            return;
        };
        if done.took > Duration::from_secs(1) {
            tracing::debug!(
                "attempt {} of part {part_id} ended after {:?} ({} hedges sent, ok {}, a hedge won: {})",
                done.id,
                done.took,
                p.hedges_sent,
                done.result.is_ok(),
                p.won.is_some()
            );
        }
        p.writer = None;
        p.partial = done.written;
        if let Some(chunks) = p.won.take() {
            match done.result {
                // It finished before it saw the cancel: its bytes are all there.
                Ok(own) => self.finish_part(part_id, Ok(()), own, now),
                Err(_) => self.finish_with_hedge(part_id, done.written, chunks),
            }
            return;
        }
        match done.result {
            Ok(chunks) => self.finish_part(part_id, Ok(()), chunks, now),
            Err(failure) => {
                let retry_after = match done.outcome {
                    super::admission::Outcome::Throttled { retry_after } => retry_after,
                    _ => None,
                };
                let failure = match failure {
                    Failure::Cancelled => Failure::Permanent(RemoteError::Stopped {
                        reason: "a GET was cancelled with no answer to take its place".to_string(),
                    }),
                    f => f,
                };
                let (object, range) = (p.object, p.range.clone());
                match p.tries.after_failure(
                    &self.ctx,
                    object,
                    &range,
                    failure,
                    retry_after,
                    part_id,
                ) {
                    Next::Retry(wait) => self.retries.push(Reverse((now + wait, part_id))),
                    Next::Fail(e) => self.finish_part(part_id, Err(e), Vec::new(), now),
                }
            }
        }
    }

    /// A hedge's answer completes `part_id`, whose writer has returned
    /// after writing `written` bytes of it: the hedge's bytes before that
    /// must equal them (they are not written again), the rest is copied in.
    fn finish_with_hedge(&mut self, part_id: u64, written: u64, chunks: Vec<Bytes>) {
        let now = Instant::now();
        let Some(p) = self.parts.get(&part_id) else {
            return;
        };
        let result = land_hedge(p, written, &chunks, &self.ctx);
        if result.is_ok() {
            self.ctx
                .store
                .metrics
                .hedges_won
                .fetch_add(1, Ordering::Relaxed);
        }
        let kept = if p.keep { chunks } else { Vec::new() };
        self.finish_part(part_id, result, kept, now);
    }

    /// Completes a part: cancels its hedges (they write nothing), counts
    /// it, and completes its read after its last part. When the read has
    /// failed, its parts not under way are dropped, not fetched.
    fn finish_part(
        &mut self,
        part_id: u64,
        result: Result<(), RemoteError>,
        chunks: Vec<Bytes>,
        now: Instant,
    ) {
        let Some(read_id) = self.settle_part(part_id, result, chunks, now) else {
            return;
        };
        if self.reads.get(&read_id).is_some_and(|r| r.error.is_some()) {
            let idle: Vec<u64> = self
                .parts
                .iter()
                .filter(|(_, q)| {
                    q.read_id == read_id && q.writer.is_none() && q.hedge_ids.is_empty()
                })
                .map(|(&id, _)| id)
                .collect();
            for id in idle {
                self.settle_part(id, Ok(()), Vec::new(), now);
            }
        }
    }

    /// `finish_part` of one part; its read's id if that read is still
    /// under way.
    fn settle_part(
        &mut self,
        part_id: u64,
        result: Result<(), RemoteError>,
        chunks: Vec<Bytes>,
        now: Instant,
    ) -> Option<u64> {
        let p = self.parts.remove(&part_id)?;
        debug_assert!(p.writer.is_none(), "a part completed while its writer runs");
        for h in &p.hedge_ids {
            // Dropping the sender cancels the hedge.
            if let Some(info) = self.attempts.get_mut(h) {
                info.cancel = None;
            }
        }
        if result.is_ok() && p.first_sent.is_some() {
            let m = &self.ctx.store.metrics;
            m.gets_ok.fetch_add(1, Ordering::Relaxed);
            if let Some(first) = p.first_sent {
                m.get_latency
                    .record_us(now.saturating_duration_since(first).as_micros() as u64);
            }
        }
        let Some(state) = self.reads.get_mut(&p.read_id) else {
            debug_assert!(false, "a part of an unknown read {}", p.read_id);
            return None;
        };
        if let Err(e) = result {
            state.error.get_or_insert(e);
        }
        // Only a read of one part keeps chunks, so these are all of them.
        state.chunks = chunks;
        state.parts_left -= 1;
        if state.parts_left > 0 {
            return Some(p.read_id);
        }
        let state = self.reads.remove(&p.read_id)?;
        let (result, chunks) = match state.error {
            Some(e) => (Err(e), Vec::new()),
            None => (Ok(()), state.chunks),
        };
        // The engine may have been dropped already; then nobody waits.
        let _ = self.done.send(FetchCompletion {
            tag: state.tag,
            result,
            chunks,
        });
        None
    }
}

/// Checks a winning hedge's `chunks` against the `written` bytes its
/// part's writer left in the destination, and copies in the rest.
fn land_hedge(
    p: &PartState,
    written: u64,
    chunks: &[Bytes],
    ctx: &PartContext,
) -> Result<(), RemoteError> {
    let len = p.range.end - p.range.start;
    let total: u64 = chunks.iter().map(|c| c.len() as u64).sum();
    if total != len || written > len {
        return Err(RemoteError::Permanent {
            key: ctx.objects[p.object as usize].key.clone(),
            store: ctx.store.display.clone(),
            status: 0,
            detail: format!(
                "a hedged GET of bytes {:?} brought {total} bytes, {written} already written",
                p.range
            ),
        });
    }
    let mut at: u64 = 0;
    for chunk in chunks {
        let end = at + chunk.len() as u64;
        // The part of this chunk the writer already wrote: compare.
        let same_end = end.min(written);
        if at < same_end {
            let n = (same_end - at) as usize;
            // SAFETY: the writer has returned (its task's end was joined), so
            // nobody writes `dest` now; `at + n <= written <= len`, inside the
            // part's destination, which `submit`'s contract keeps valid.
            let have = unsafe { std::slice::from_raw_parts(p.dest.0.add(at as usize), n) };
            if have != &chunk[..n] {
                return Err(RemoteError::Changed {
                    key: ctx.objects[p.object as usize].key.clone(),
                    store: ctx.store.display.clone(),
                    what: format!(
                        "two answers for bytes {:?} differ at or after byte {}",
                        p.range,
                        p.range.start + at
                    ),
                });
            }
        }
        // The rest: copy.
        let from = at.max(written);
        if from < end {
            let skip = (from - at) as usize;
            let src = &chunk[skip..];
            // SAFETY: as above, and `from + src.len() == end <= len`.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), p.dest.0.add(from as usize), src.len());
            }
            ctx.store
                .metrics
                .bytes_landed
                .fetch_add(src.len() as u64, Ordering::Relaxed);
        }
        at = end;
    }
    Ok(())
}
