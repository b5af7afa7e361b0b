//! The loop: claim a free slot of a rank, plan its batch, hand the reads to
//! the engine, publish the batch once every read has landed.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::stack::open_engine_for;
use crate::images::{DecodeStage, IdleWatch, StageError};
use crate::planner::{self, BatchPlan, Tier};
use crate::reader::{Completion, ReadEngine, ReadError, ReadOp};
use crate::ring::segment::human_bytes;
use crate::ring::{CreateError, Producer};

use super::pending::{Pending, RankCursor};
use super::watch::WATCH_EVERY;
use super::{Plan, RunError, ServeReport, StartError, StopToken};

/// How often the loader rewrites the counters block in the ring header
/// (counters.rs).
pub(super) const COUNTERS_EVERY: Duration = Duration::from_millis(100);
/// How often the loader looks for ranks whose consumer died.
const RECLAIM_EVERY: Duration = Duration::from_millis(100);
/// Longest wait for a read completion before looking at the ring again.
const REAP_WAIT: Duration = Duration::from_millis(10);
/// Fewest reads in flight while first batches are outstanding (see
/// `Loader::submit_queued`); otherwise one batch's worth.
const WARM_UP_IN_FLIGHT_MIN: usize = 32;
/// How the planner merges local reads: not at all. A local read costs one
/// SQE or one pread, and the engine spreads a batch's reads over its rings
/// or threads; one merged read of a whole batch would copy it on one core.
const LOCAL_COALESCE: Option<planner::Coalesce> = None;
/// How it merges remote reads, where each request costs a round trip:
/// byte-adjacent pieces of one object that also sit next to each other in
/// the slot become one ranged GET (a batch of neighbouring tar samples under
/// `--shuffle block`). No gap is read and dropped (0): every merged byte
/// lands in the payload, so a merged read is one destination. Up to one GET
/// part's default size; the fetch engine splits longer reads into parts.
const REMOTE_COALESCE: Option<planner::Coalesce> = Some(planner::Coalesce {
    gap_bytes_max: 0,
    read_bytes_max: 8 << 20,
});
/// How long a stopping loader waits for the reads under way.
const READS_GRACE: Duration = Duration::from_secs(5);

/// A running loader.
pub struct Loader {
    pub(super) plan: Plan,
    // Declared before `producer` so it drops first: its drop waits for reads
    // under way, which write into the ring the producer maps.
    pub(super) reader: Box<dyn ReadEngine>,
    pub(super) producer: Producer,
    pub(super) cursors: Vec<RankCursor>,
    pub(super) pending: Pending,
    pub(super) queued: VecDeque<ReadOp>,
    pub(super) completions: Vec<Completion>,
    /// The plan of the batch being claimed (reused: no allocation per batch).
    pub(super) batch_plan: BatchPlan,
    pub(super) report: ServeReport,
    pub(super) started: Instant,
    /// Rank the next fill pass starts at (round-robin across calls).
    pub(super) next_rank: u32,
    /// Some rank still waits for its first batch (see `fill_ranks`); false
    /// from the moment `rank_started` counts the last one.
    pub(super) warming: bool,
    /// Most reads in flight while `warming`.
    pub(super) warm_up_in_flight: usize,
    /// `Producer::reserve_rest` was called.
    pub(super) reserving: bool,
    /// Ranks whose first batch of this run was published.
    pub(super) ranks_started: u32,
    /// Bytes of the first batches published so far.
    pub(super) first_step_bytes: u64,
    /// When a read last completed, or reads were last idle (see `watch_stall`).
    pub(super) reads_moved: Instant,
    /// `reads_moved` when `probe_stalled_files` last started a probe.
    pub(super) stall_probed: Option<Instant>,
    /// The probe under way, on its own thread: its outcome comes here.
    pub(super) stall_probe: Option<std::sync::mpsc::Receiver<Result<(), ReadError>>>,
    /// The last stall warning.
    pub(super) stall_warned: Option<Instant>,
    /// The ring's name in /dev/shm was found removed (warned once).
    pub(super) name_lost: bool,
    /// The decode stage (`--decode image`): a batch's images are made in
    /// its slot just before it is published.
    pub(super) decode: Option<DecodeStage>,
    /// `--idle-timeout`: when a trainer was last attached.
    pub(super) idle: super::idle::IdleWatch,
    /// `--resume auto`: the ranks have not all said where the run starts.
    pub(super) awaiting_start: bool,
    /// "waiting for N trainer(s) to attach" was said (it is said once).
    pub(super) said_waiting: bool,
    /// The run's shape is in the header (`write_progress`).
    pub(super) shape_published: bool,
}

impl Loader {
    /// Creates the ring and opens the reader. Consumers may attach from now on.
    pub fn start(plan: Plan) -> Result<Loader, StartError> {
        let cfg = &plan.cfg;
        let geometry = plan.geometry;
        let opened = open_engine_for(cfg.io, &plan.target, &cfg.reader)?;
        if let Some(w) = &opened.fallback_warning {
            tracing::warn!("{w}");
        }
        let created =
            Producer::create_with_class_names(&cfg.name, geometry, plan.job, plan.class_names());
        let producer = match created {
            Err(e @ CreateError::ShmTooSmall { .. }) => {
                // The ring layer does not know the flags.
                let advice = plan.smaller_ring_advice(&e);
                return Err(StartError::RingDoesNotFit { source: e, advice });
            }
            other => other?,
        };
        // Under --resume auto the count is known once the ranks said where
        // the run starts (await_start).
        let per_rank = if plan.job.awaits_start {
            u64::MAX
        } else {
            plan.batches_per_rank()
        };
        if !plan.job.awaits_start {
            for r in 0..cfg.world_size {
                producer.set_batches_expected(r, per_rank);
            }
        }
        producer.set_reader_info(opened.engine.backend_name(), 0);
        let cursors = (0..cfg.world_size)
            .map(|_| RankCursor::new(&plan.sampler))
            .collect();
        let decode = plan.decode.as_ref().zip(cfg.decode.as_ref()).map(|(p, d)| {
            let (threads, words) = d.threads_for(cfg.world_size);
            crate::say::say_err!(
                "ringfeed: decoding images to {}x{} {} on {words} thread(s) sharing {} MiB (--decode-memory); {}",
                d.spec.height(),
                d.spec.width(),
                if p.format.chw {
                    "(3, H, W)"
                } else {
                    "(H, W, 3)"
                },
                d.memory_bytes >> 20,
                p.labels.words()
            );
            DecodeStage::new(
                d,
                p.format,
                p.staging_base,
                cfg.seed,
                Arc::clone(&p.labels),
                p.tar,
                threads,
            )
        });
        let decode = decode.transpose().map_err(StartError::DecodeThreads)?;
        let report = ServeReport {
            backend: opened.engine.backend_name(),
            ..Default::default()
        };
        let plan_awaits_start = plan.job.awaits_start;
        let max_in_flight = opened.engine.max_in_flight();
        let warm_up_in_flight = (cfg.batch_size as usize)
            .clamp(WARM_UP_IN_FLIGHT_MIN.min(max_in_flight), max_in_flight);
        let mut loader = Loader {
            plan,
            reader: opened.engine,
            producer,
            cursors,
            pending: Pending::default(),
            queued: VecDeque::new(),
            completions: Vec::new(),
            batch_plan: BatchPlan::default(),
            report,
            started: Instant::now(),
            next_rank: 0,
            warming: per_rank > 0,
            warm_up_in_flight,
            reserving: false,
            ranks_started: 0,
            first_step_bytes: 0,
            reads_moved: Instant::now(),
            stall_probed: None,
            stall_probe: None,
            stall_warned: None,
            name_lost: false,
            decode,
            idle: super::idle::IdleWatch::new(None),
            awaiting_start: plan_awaits_start,
            said_waiting: false,
            shape_published: false,
        };
        // The run's shape, for trainers attaching from now on.
        loader.write_progress();
        Ok(loader)
    }

    /// The plan being served.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The ring's producer (for tests and stats).
    pub fn producer(&self) -> &Producer {
        &self.producer
    }

    /// Serves every batch, then waits until all are released. `stop` ends it early
    /// (a signal, its caller, a changed source).
    ///
    /// On a stop or an error the trainers are told and the ring's name is
    /// removed at once. A read that does not return within `READS_GRACE`
    /// after that is left under way, and so are the ring's mapping, its
    /// memory, its descriptor and the reader's threads, until the process
    /// exits: the caller should exit soon after an error.
    pub fn run(mut self, stop: &StopToken) -> Result<ServeReport, RunError> {
        let result = self.run_inner(stop);
        if let Err(err) = &result {
            // Trainers learn it now, and the name is free for a new loader,
            // whether or not the reads under way ever return.
            // The loader's own words (what failed, the fix) reach every
            // trainer, not just this process's log.
            let code = if let RunError::Signal(sig) = err {
                *sig
            } else {
                0
            };
            // Scrubbed: it is read by every trainer and by `ringfeed stat`.
            self.producer
                .abort_with(code, &crate::remote::scrub(&err.to_string()));
            self.producer.remove_name();
        }
        self.report.elapsed = self.started.elapsed();
        self.report.images = self.decode.as_ref().map(|d| (d.decoded, d.bad));
        let report = self.report.clone();
        self.shut_down(READS_GRACE);
        result.map(|()| report)
    }

    /// Drops the reader, then the ring. A read that does not return (a hung
    /// network filesystem, a FIFO put in place of a file) would block its
    /// drop, and a stop, forever: after `grace` the ring's mapping is left
    /// in place (the read may still write into it) and this returns; the
    /// process is expected to exit.
    fn shut_down(self, grace: Duration) {
        let decodes = self.decode.as_ref().map(DecodeStage::idle_watch);
        let Loader {
            reader, producer, ..
        } = self;
        let producer = RingAfterDecodes::new(producer, decodes);
        let in_flight = reader.in_flight();
        if in_flight == 0 {
            drop(reader);
            drop(producer);
            return;
        }
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("ringfeed-reader-stop".into())
            .spawn(move || {
                drop(reader);
                let _ = done_tx.send(());
            });
        // A thread that could not start dropped the reader in this one.
        let waited = if spawned.is_err() {
            Ok(())
        } else {
            done_rx.recv_timeout(grace)
        };
        match waited {
            Ok(()) => {
                drop(producer);
                return;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => tracing::error!(
                "{in_flight} read(s) still under way {:.0} s after the loader stopped (a hung network filesystem, or a FIFO or device in place of a dataset file?); \
                 leaving them: the trainers were told and the segment's name is removed (its memory is freed when this process exits)",
                grace.as_secs_f64()
            ),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                tracing::error!("the reader panicked while stopping, with {in_flight} read(s) under way; leaving the ring mapped until this process exits");
            }
        }
        // The reads may still write into the ring: never unmap it.
        std::mem::forget(producer);
    }

    fn run_inner(&mut self, stop: &StopToken) -> Result<(), RunError> {
        let world = self.plan.cfg.world_size;
        let mut last_reclaim = Instant::now();
        let mut last_progress = Instant::now();
        let mut last_counters = Instant::now();
        let mut batch = Vec::with_capacity(self.plan.cfg.batch_size as usize);
        if self.plan.job.awaits_start {
            self.await_start(stop)?;
        }
        loop {
            stop.check()?;
            let blocked = self.fill_ranks(&mut batch)?;
            self.submit_queued()?;
            if !self.warming && !self.reserving {
                // Every rank has its first batch: take the rest of the ring
                // from /dev/shm now, in the background.
                self.producer.reserve_rest();
                self.reserving = true;
            }
            let in_flight = self.reader.in_flight();
            self.producer
                .set_reader_info(self.reader.backend_name(), in_flight as u32);
            if in_flight > 0 {
                // Everything claimable was claimed and everything that fits was
                // submitted: wait for a completion. The bound lets a release
                // that frees a slot be noticed while long reads are under way.
                self.completions.clear();
                self.reader
                    .reap(&mut self.completions, 1, Some(REAP_WAIT))?;
                self.complete()?;
                self.probe_stalled_files()?;
            }
            self.publish_ready(stop)?;
            if self.all_claimed() && self.pending.is_empty() && self.queued.is_empty() {
                break;
            }
            if last_reclaim.elapsed() >= RECLAIM_EVERY {
                self.reclaim();
                self.check_idle()?;
                last_reclaim = Instant::now();
            }
            if last_counters.elapsed() >= COUNTERS_EVERY {
                self.write_counters();
                last_counters = Instant::now();
            }
            if last_progress.elapsed() >= WATCH_EVERY {
                self.log_unattached(&blocked, "");
                self.watch_stall();
                self.watch_name();
                last_progress = Instant::now();
            }
            let idle = self.reader.in_flight() == 0 && self.queued.is_empty();
            if idle && !blocked.is_empty() {
                // For `stat`: the count above was taken before the reap.
                self.producer.set_reader_info(self.reader.backend_name(), 0);
                let cursors = &self.cursors;
                self.producer
                    .wait_for_release(&blocked, RECLAIM_EVERY, |p| {
                        blocked
                            .iter()
                            .all(|&r| cursors[r as usize].done() || !p.can_claim(r))
                    });
            }
        }
        // What `stat` shows from here on: the count above was taken before
        // the last completions were reaped.
        self.producer
            .set_reader_info(self.reader.backend_name(), self.reader.in_flight() as u32);
        self.write_counters();
        self.producer.finish();
        tracing::debug!("every batch published; waiting for the trainers to release the last ones");
        let all: Vec<u32> = (0..world).collect();
        while !self.producer.all_released() {
            stop.check()?;
            if last_reclaim.elapsed() >= RECLAIM_EVERY {
                self.reclaim();
                self.check_idle()?;
                last_reclaim = Instant::now();
            }
            if last_counters.elapsed() >= COUNTERS_EVERY {
                self.write_counters();
                last_counters = Instant::now();
            }
            if last_progress.elapsed() >= WATCH_EVERY {
                let undrained: Vec<u32> = all
                    .iter()
                    .copied()
                    .filter(|&r| !self.producer.rank_drained(r))
                    .collect();
                self.log_unattached(&undrained, "every batch is published; ");
                self.watch_name();
                last_progress = Instant::now();
            }
            self.producer
                .wait_for_release(&all, RECLAIM_EVERY, |p| !p.all_released());
        }
        // The last steps taken, for whoever watches the run to its end.
        self.write_counters();
        Ok(())
    }

    fn all_claimed(&self) -> bool {
        self.cursors.iter().all(RankCursor::done)
    }

    /// Claims free slots round-robin, one batch per rank per pass, so that
    /// every rank's first batch is read early (time to first batch does not
    /// grow with the number of ranks). Stops once a full queue depth of reads
    /// waits to be submitted. Returns the unfinished ranks with no free slot.
    fn fill_ranks(&mut self, batch: &mut Vec<u64>) -> Result<Vec<u32>, RunError> {
        let world = self.plan.cfg.world_size;
        let mut blocked = vec![false; world as usize];
        // Warm-up: until every rank has its first batch published, claim only
        // first batches, so prefetch never competes with a rank's first batch
        // (time to first batch must not grow with the number of ranks), and
        // claim one batch ahead of the reads in flight only: a claim may
        // allocate its slot first, and the loop must get back to publishing.
        let warming = self.warming;
        let ahead = if warming {
            self.warm_up_in_flight
        } else {
            self.reader.max_in_flight()
        };
        let full = |l: &Loader| l.queued.len() >= ahead;
        // Each pass gives every open rank one batch, starting where the last
        // call stopped, so no rank waits behind another's prefetch.
        loop {
            let mut claimed = false;
            for i in 0..world {
                let r = (self.next_rank + i) % world;
                if blocked[r as usize]
                    || self.cursors[r as usize].done()
                    || (warming && self.producer.claimed(r) > 0)
                {
                    continue;
                }
                if full(self) {
                    self.next_rank = r;
                    return Ok(blocked_ranks(&blocked));
                }
                if self.fill_one(r, batch)? {
                    claimed = true;
                    // Start this batch's reads now, not after the whole pass:
                    // the next claim may first allocate its slot (about 1.6 ms
                    // per 6 MiB), and the reads should not wait for that.
                    self.submit_queued()?;
                } else {
                    blocked[r as usize] = true;
                }
            }
            if !claimed {
                return Ok(blocked_ranks(&blocked));
            }
        }
    }

    /// Claims one free slot of rank r, plans its batch (`planner`) and
    /// queues the plan's reads. Returns false when the rank has no free slot.
    fn fill_one(&mut self, r: u32, batch: &mut Vec<u64>) -> Result<bool, RunError> {
        let Some(claim) = self.producer.try_claim(r)? else {
            return Ok(false);
        };
        // Page-rounded, so at least slot_bytes: room for spare bytes.
        let payload_bytes = claim.payload_bytes();
        let (epoch, step) = self.cursors[r as usize].advance(&self.plan.sampler);
        self.plan
            .sampler
            .batch_into(epoch, step, self.plan.cfg.job.first_rank + r, batch);
        if let Some(mixture) = self.plan.tokens.as_ref().and_then(|t| t.mixture.as_ref()) {
            // A mixture's sampler gives positions of the epoch; the mixture
            // says which corpus's window each one is.
            mixture.map_batch(epoch, batch);
        }
        let id = self.pending.add(claim, epoch, step);
        let planned = planner::plan_batch(
            batch,
            &self.plan.manifest,
            self.plan.slot_bytes,
            Tier::Local,
            if self.plan.is_remote() {
                REMOTE_COALESCE
            } else {
                LOCAL_COALESCE
            },
            &mut self.batch_plan,
        );
        if let Err(planner::PlanError::SampleTooLarge {
            index,
            object,
            len_bytes,
            needed_bytes,
            slot_bytes,
        }) = planned
        {
            return Err(RunError::SampleTooLarge {
                index,
                path: self.plan.object_name(object).display().to_string(),
                len: len_bytes,
                epoch,
                step,
                rank: r,
                needed: needed_bytes,
                slot_bytes,
            });
        }
        let plan = &self.batch_plan;
        // With the decode stage the raw bytes land after the images.
        let base = self.plan.decode.as_ref().map_or(0, |d| d.staging_base);
        for place in &plan.places {
            self.pending
                .sample(id, base + place.offset_bytes, place.len_bytes, place.index);
        }
        for read in &plan.reads {
            // The local engines read into one destination per op: a read
            // whose pieces scatter (coalesced over gaps or out of batch
            // order) becomes one op per piece, which costs little locally.
            for span in read.spans(&plan.pieces) {
                let end = base + span.dest_offset_bytes + span.len_bytes;
                // The byte after this read is the next sample's first or
                // unused room in this slot's payload, and a failed read stops
                // the run before the slot is published (`complete`); only a
                // batch that fills its payload exactly has no such byte. An
                // empty sample is read too: one byte, to see that its file is
                // still empty.
                self.queued.push_back(ReadOp {
                    file: read.object,
                    offset_bytes: span.offset_bytes,
                    len_bytes: span.len_bytes,
                    dest: self
                        .pending
                        .dest(id, base + span.dest_offset_bytes, span.len_bytes),
                    spare_byte: end < payload_bytes,
                    user_data: id as u64,
                });
                self.pending.expect_read(id);
            }
        }
        if let Some(run) = &self.plan.tokens {
            super::token_run::write_extras(run, &self.batch_plan, &mut self.pending, id);
        }
        Ok(true)
    }

    fn submit_queued(&mut self) -> Result<(), RunError> {
        // While first batches are outstanding, keep about one batch of reads
        // in flight, so that they complete one rank after the other: with a
        // full queue depth the kernel interleaves the reads of several
        // batches and all of them land at the end together (measured with 8
        // ranks: the first rank's batch came 3x later than with this cap).
        let cap = if self.warming {
            self.warm_up_in_flight
        } else {
            self.reader.max_in_flight()
        };
        let room = cap.saturating_sub(self.reader.in_flight());
        let n = room.min(self.queued.len());
        if n == 0 {
            return Ok(());
        }
        let ops: Vec<ReadOp> = self.queued.drain(..n).collect();
        if self.reader.in_flight() == 0 {
            // A stall is counted from here, not from the last completion
            // before the loader sat idle (waiting for trainers to release).
            self.reads_moved = Instant::now();
        }
        // SAFETY: each dest lies inside a slot payload claimed by this loader
        // and not yet published: no consumer can see it, and the Producer
        // (which owns the mapping) outlives the reader (dropped first in run).
        // A spare byte is the next sample's first byte or room in the same
        // payload; it is written only by a read that fails with Grew, and
        // `complete` stops the run on that failure, before the slot can be
        // published (it needs every one of its reads to succeed).
        unsafe { self.reader.submit(&ops) }?;
        Ok(())
    }

    fn complete(&mut self) -> Result<(), RunError> {
        if !self.completions.is_empty() {
            self.reads_moved = Instant::now();
        }
        for c in self.completions.drain(..) {
            // Every failed read ends the run, and the failed read's slot is
            // never published. `ReadOp::spare_byte` relies on it: the read
            // that finds a grown file may have overwritten the first byte of
            // the next sample in its slot. An option to skip bad samples
            // would have to drop the whole batch, not the sample.
            c.result?;
            self.pending.read_done(c.user_data as usize);
        }
        Ok(())
    }

    fn publish_ready(&mut self, stop: &StopToken) -> Result<(), RunError> {
        for r in 0..self.plan.cfg.world_size {
            while let Some(mut done) = self.pending.pop_ready(r, self.producer.published(r)) {
                if let Some(area) = self.plan.job.keys {
                    let payload = done.claim.payload_mut();
                    super::keys::write_keys(area, payload, &done.samples, &self.plan.manifest);
                }
                if let Some(stage) = &mut self.decode {
                    let (manifest, plan) = (&self.plan.manifest, &self.plan);
                    let decoded = stage.decode_batch(
                        done.claim.payload_mut(),
                        done.epoch,
                        &mut done.samples,
                        |i| manifest.sample(i).file,
                        |i| {
                            plan.object_name(manifest.sample(i).file)
                                .display()
                                .to_string()
                        },
                        &|| stop.code() != 0,
                    );
                    match decoded {
                        Ok(()) => {}
                        Err(StageError::Bad(bad)) => return Err(bad.into()),
                        // Abandoned, never published: the stop's own error.
                        Err(StageError::Stopped) => {
                            stop.check()?;
                            return Err(RunError::Stopped);
                        }
                    }
                }
                let n = done.samples.len() as u64;
                let bytes: u64 = done.samples.iter().map(|s| s.len).sum();
                let rank_starts = self.producer.published(r) == 0;
                self.producer
                    .publish(done.claim, done.epoch, done.step, &done.samples)?;
                self.pending.recycle(done.samples);
                self.report.batches += 1;
                self.report.samples += n;
                self.report.bytes += bytes;
                let at = self.started.elapsed();
                self.report.first_publish.get_or_insert(at);
                if rank_starts {
                    self.rank_started(r, bytes, at);
                }
                if self.producer.published(r) == self.plan.batches_per_rank() {
                    // Its last batch is out: its trainer ends its loop once
                    // it has taken it, without waiting for slower ranks.
                    self.producer.finish_rank(r);
                }
            }
        }
        Ok(())
    }

    /// Notes rank r's first batch. Once every rank has one, logs how long
    /// that took after the ring was created: the time to first batch on the
    /// loader's side, before any trainer is scheduled to take it. It
    /// follows the bytes of those first batches, each of which lands in
    /// ring pages touched for the first time.
    fn rank_started(&mut self, r: u32, bytes: u64, at: Duration) {
        self.ranks_started += 1;
        self.first_step_bytes += bytes;
        tracing::debug!(
            "rank {r}: first batch published {:.1} ms after the ring was created",
            at.as_secs_f64() * 1e3
        );
        if self.ranks_started == self.plan.cfg.world_size {
            self.warming = false;
            self.report.all_first_published = Some(at);
            let first = self.report.first_publish.unwrap_or(at);
            let line = format!(
                "first batch of every rank published: the first {:.1} ms after the ring was created, all {} after {:.1} ms ({} read into the ring)",
                first.as_secs_f64() * 1e3,
                self.ranks_started,
                at.as_secs_f64() * 1e3,
                human_bytes(self.first_step_bytes)
            );
            if self.plan.cfg.progress {
                tracing::info!("{line}");
            } else {
                tracing::debug!("{line}");
            }
        }
    }

    fn reclaim(&self) {
        for r in self.producer.reclaim_dead_consumers() {
            let (rank, n) = (r.rank, r.batches);
            if r.took_every_batch {
                // A loop variable still bound to the last batch at exit.
                tracing::debug!("rank {rank}: its trainer exited holding {n} of its last batches, after taking every batch of the run; reclaimed them");
            } else {
                tracing::warn!("rank {rank}: its trainer went away holding {n} batch(es); reclaimed them, waiting for a trainer to attach to rank {rank}");
            }
        }
    }
}

/// How long a stopping loader waits for a decode under way before leaving
/// the ring mapped for it (see `RingAfterDecodes`).
const DECODE_GRACE: Duration = Duration::from_millis(300);

/// The ring, unmapped on drop only once no decode thread can be inside one
/// of its slots: at once when the decode stage is idle (always, after a run
/// that ended); after a stop, once the decode under way ends, or, if it
/// takes longer than `DECODE_GRACE`, never (as for a read that does not
/// return: the process is expected to exit, and a stop must not wait for a
/// long decode).
struct RingAfterDecodes {
    producer: std::mem::ManuallyDrop<Producer>,
    decodes: Option<IdleWatch>,
}

impl RingAfterDecodes {
    fn new(producer: Producer, decodes: Option<IdleWatch>) -> Self {
        RingAfterDecodes {
            producer: std::mem::ManuallyDrop::new(producer),
            decodes,
        }
    }
}

impl Drop for RingAfterDecodes {
    fn drop(&mut self) {
        let idle = self
            .decodes
            .as_ref()
            .is_none_or(|d| d.wait(Some(DECODE_GRACE)));
        if idle {
            // SAFETY: dropped once, here, and never used again.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.producer) };
        } else {
            tracing::debug!("a decode still under way as the loader stops: its ring stays mapped until the process exits");
        }
    }
}

fn blocked_ranks(blocked: &[bool]) -> Vec<u32> {
    (0..blocked.len() as u32)
        .filter(|&r| blocked[r as usize])
        .collect()
}
