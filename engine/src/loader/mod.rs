//! The loader: manifest → sampler → readers → ring.
//!
//! One thread drives everything. Each rank advances on its own: whenever one
//! of its slots is free, the loader claims it, asks the reader to put the
//! batch's samples straight into the slot's payload, and publishes it once
//! every read has landed (batches of a rank are published in order). A rank
//! whose trainer is slow, or dead, never holds the other ranks back.

mod pending;
pub mod signals;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::TryRecvError;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::manifest::{Manifest, ManifestError, ManifestOptions};
use crate::reader::{
    open_engine, Completion, FileTable, IoChoice, ReadEngine, ReadError, ReadOp, ReaderConfig,
};
use crate::ring::layout::{GeometryError, Job, RunOrder, RunStart};
use crate::ring::segment::{self, human_bytes};
use crate::ring::{CreateError, Layout, Producer, PublishError, RingGeometry};
use crate::sampler::{ResumeState, Sampler, SamplerConfig, SamplerError};

use pending::{Pending, RankCursor};

/// How often the loader looks for ranks whose consumer died.
const RECLAIM_EVERY: Duration = Duration::from_millis(100);
/// Longest wait for a read completion before looking at the ring again.
const REAP_WAIT: Duration = Duration::from_millis(10);
/// Fewest reads in flight while first batches are outstanding (see
/// `Loader::submit_queued`); otherwise one batch's worth.
const WARM_UP_IN_FLIGHT_MIN: usize = 32;
/// How often a progress line is logged.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// How long a stopping loader waits for the reads under way.
const READS_GRACE: Duration = Duration::from_secs(5);
/// Reads in flight with no completion for this long get a warning.
const READS_STALLED: Duration = Duration::from_secs(30);
/// No read completed for this long: see `Loader::probe_stalled_files`.
const STALL_PROBE: Duration = Duration::from_secs(1);
/// Most files one stall probe looks at.
const STALL_PROBE_FILES_MAX: usize = 4096;

/// Everything `ringfeed serve` needs.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Local dataset directory.
    pub source: PathBuf,
    /// Loader name (the ring is /dev/shm/ringfeed-NAME).
    pub name: String,
    /// Samples per rank per step.
    pub batch_size: u32,
    /// Ranks this loader serves (its ring's world size).
    pub world_size: u32,
    /// Where they sit in the job: the sampler splits each step over
    /// `job.job_world_size` ranks, and ring rank r gets job rank
    /// `job.first_rank + r`'s batches. `Job::single(world_size)` on one
    /// machine. Its `plan_digest` is left 0: the plan computes it
    /// ([`Plan::job`]).
    pub job: Job,
    /// Total epochs of the run.
    pub epochs: u64,
    /// Seed of the shuffle.
    pub seed: u64,
    /// Shuffle every epoch (false: manifest order, `--no-shuffle`).
    pub shuffle: bool,
    /// Fixed-size records instead of whole files.
    pub record_bytes: Option<u64>,
    /// Slots per rank (prefetch depth); None: [`auto_slots_per_rank`].
    pub slots_per_rank: Option<u32>,
    /// Payload bytes per slot; derived from the manifest when None.
    pub slot_bytes: Option<u64>,
    /// Reader backend.
    pub io: IoChoice,
    /// Reader tuning.
    pub reader: ReaderConfig,
    /// Where to start.
    pub start: ResumeState,
    /// Log progress: while listing, and when every rank has its first batch.
    pub progress: bool,
}

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The dataset could not be listed.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The run cannot be planned.
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    /// The ring could not be made.
    #[error(transparent)]
    Ring(#[from] CreateError),
    /// /dev/shm is too small for the ring; `advice` names the flag and
    /// value that would make one fit, where one would.
    #[error("{source}{advice}")]
    RingDoesNotFit {
        /// The ring's error, with its /dev/shm advice.
        source: CreateError,
        /// "; or ..." naming a flag and a value, or empty.
        advice: String,
    },
    /// A read failed: the sample is named, nothing is skipped.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// A sample is larger than the given slot size.
    #[error("sample {index} ({path}, {len} bytes) does not fit a slot: it is larger than --slot-bytes {slot_bytes}; raise --slot-bytes to {derived} (the batch-size largest samples together) or leave it out to size slots from the data")]
    SlotTooSmall {
        /// Sample index.
        index: u64,
        /// Its file.
        path: String,
        /// Its length.
        len: u64,
        /// The given slot size.
        slot_bytes: u64,
        /// The slot size derived from the data.
        derived: u64,
    },
    /// The given slot size is below the batch-size largest samples together:
    /// a batch that draws them would stop the run wherever it comes.
    #[error("--slot-bytes {slot_bytes} is smaller than the {batch_size} largest samples together ({derived} bytes): a batch that draws them would not fit, and the run would stop there, hours in perhaps; raise --slot-bytes to {derived}, or leave it out to size slots from the data")]
    SlotSmallerThanBatch {
        /// The given slot size.
        slot_bytes: u64,
        /// Samples per batch.
        batch_size: u32,
        /// The batch-size largest samples together.
        derived: u64,
    },
    /// A batch does not fit a slot of the given size (checked at the start:
    /// only a manifest that lied about sizes gets here).
    #[error("sample {index} ({path}, {len} bytes) does not fit: batch (epoch {epoch}, step {step}, rank {rank}) needs {needed} bytes but --slot-bytes is {slot_bytes}; raise --slot-bytes or leave it out to size slots from the data")]
    SampleTooLarge {
        /// Sample index.
        index: u64,
        /// Its file.
        path: String,
        /// Its length.
        len: u64,
        /// Where.
        epoch: u64,
        /// Where.
        step: u64,
        /// Where.
        rank: u32,
        /// Bytes the batch needs.
        needed: u64,
        /// Slot payload size.
        slot_bytes: u64,
    },
    /// The ring these flags and this dataset ask for cannot be built.
    #[error("cannot build the ring: {0}")]
    Shape(String),
    /// Internal protocol misuse (a bug).
    #[error("internal error: {0}")]
    Publish(#[from] PublishError),
    /// Stopped by a signal.
    #[error("stopped by signal {0}")]
    Signal(u32),
    /// Stopped by its caller (`stop` set to [`STOP_NOT_A_SIGNAL`]).
    #[error("stopped by its caller")]
    Stopped,
}

/// A `stop` value that is not a signal: the caller (the demo, when one of
/// its consumers failed) ends the run; trainers see "stopped on an error".
pub const STOP_NOT_A_SIGNAL: u32 = u32::MAX;

/// What a finished run did.
#[derive(Clone, Debug, Default)]
pub struct ServeReport {
    /// Batches published, all ranks.
    pub batches: u64,
    /// Samples published.
    pub samples: u64,
    /// Payload bytes published.
    pub bytes: u64,
    /// Time from ring creation to the last release.
    pub elapsed: Duration,
    /// Time from ring creation to the first publish.
    pub first_publish: Option<Duration>,
    /// Time from ring creation until every rank had its first batch.
    pub all_first_published: Option<Duration>,
    /// Reader backend used.
    pub backend: &'static str,
}

/// A prepared run: manifest listed, sampler planned, the readers' file table
/// built. Separate from [`Loader::start`] so callers can time the first batch
/// without the listing.
pub struct Plan {
    cfg: ServeConfig,
    manifest: Arc<Manifest>,
    sampler: Sampler,
    slot_bytes: u64,
    /// The slot size the data needs: the batch-size largest samples together.
    derived_slot_bytes: u64,
    slots_per_rank: u32,
    /// The manifest's files as the readers open them.
    files: Arc<FileTable>,
    /// `cfg.job` with its [`Job::plan_digest`], as the header holds it.
    job: Job,
}

/// Fewest slots per rank the default falls back to when /dev/shm is short.
pub const AUTO_SLOTS_FLOOR: u32 = 2;

/// The default K, lowered (with a warning) while the ring would not fit in
/// `free_bytes` of /dev/shm, down to `AUTO_SLOTS_FLOOR`: a default that fits
/// beats one that fails. A ring that does not fit even then is left to
/// `Producer::create`, which says how much room it needs.
fn fit_auto_slots(geometry: RingGeometry, free_bytes: Option<u64>) -> u32 {
    let Some(free) = free_bytes else {
        return geometry.slots_per_rank;
    };
    let bytes = |k| {
        Layout::compute(RingGeometry {
            slots_per_rank: k,
            ..geometry
        })
        .map_or(u64::MAX, |l| l.segment_bytes)
    };
    let want = geometry.slots_per_rank;
    let mut k = want;
    while k > AUTO_SLOTS_FLOOR && bytes(k) > free {
        k -= 1;
    }
    if k < want && bytes(k) <= free {
        tracing::warn!(
            "/dev/shm has {} of room (free, less what other running loaders' rings will still take), too little for the default {want} slots per rank ({}): using {k} ({}); \
             give shared memory more room for more prefetch, or pass --slots-per-rank",
            human_bytes(free),
            human_bytes(bytes(want)),
            human_bytes(bytes(k))
        );
        k
    } else {
        want
    }
}

/// Fewest slots per rank chosen by default.
pub const AUTO_SLOTS_MIN: u32 = 4;
/// Most slots per rank chosen by default.
pub const AUTO_SLOTS_MAX: u32 = 16;
/// Payload bytes per rank above which the default stops adding slots past
/// `AUTO_SLOTS_MIN`.
pub const AUTO_RANK_BYTES_MAX: u64 = 256 << 20;

/// The default slots per rank: enough that a full queue depth of reads can be
/// in flight twice over while a rank's trainer holds a batch and another
/// waits to be taken, i.e. 2·queue_depth/B, at least 4 and at most 16, and,
/// where a rank's slots would pass 256 MiB, only as many as fit in it (but
/// still at least 4). A batch is published
/// only when its last read lands; with fewer slots the queue drains at every
/// batch boundary. Measured on 2 cores, 100 KB files, B=64, queue depth 256:
/// 4 slots 5.1 GB/s, 6 slots 5.9, 8 slots 6.2–6.6 (bench/RESULTS.md).
pub fn auto_slots_per_rank(batch_size: u32, queue_depth: u32, slot_bytes: u64) -> u32 {
    let want = (2 * u64::from(queue_depth)).div_ceil(u64::from(batch_size.max(1)));
    let mut k = want.clamp(u64::from(AUTO_SLOTS_MIN), u64::from(AUTO_SLOTS_MAX)) as u32;
    let fit = AUTO_RANK_BYTES_MAX / slot_bytes.max(1);
    if u64::from(k) > fit {
        k = fit.clamp(u64::from(AUTO_SLOTS_MIN), u64::from(k)) as u32;
    }
    k
}

impl ServeConfig {
    /// Checks the ring flags that need no dataset (`--slots-per-rank`,
    /// `--slot-bytes`) against the ring's limits, naming the flag.
    pub fn check_ring_flags(&self) -> Result<(), ServeError> {
        use crate::ring::layout::{MAX_SLOTS_PER_RANK, MAX_SLOT_PAYLOAD_BYTES};
        let bad = |m: String| Err(ServeError::Shape(m));
        match self.slots_per_rank {
            Some(0) => return bad("--slots-per-rank 0: each rank needs at least 1 slot (2 or more lets the loader read ahead)".into()),
            Some(k) if k > MAX_SLOTS_PER_RANK => return bad(format!("--slots-per-rank {k}: a rank can have at most {MAX_SLOTS_PER_RANK} slots")),
            _ => {}
        }
        match self.slot_bytes {
            Some(0) => bad("--slot-bytes 0: a slot must hold at least one byte; leave it out to size slots from the data".into()),
            Some(b) if b > MAX_SLOT_PAYLOAD_BYTES => {
                bad(format!("--slot-bytes {b}: a slot can hold at most {MAX_SLOT_PAYLOAD_BYTES} bytes ({})", human_bytes(MAX_SLOT_PAYLOAD_BYTES)))
            }
            _ => Ok(()),
        }
    }
}

impl Plan {
    /// Lists the dataset and plans the run.
    pub fn new(cfg: ServeConfig) -> Result<Plan, ServeError> {
        let manifest = Manifest::build(
            &cfg.source,
            &ManifestOptions {
                record_bytes: cfg.record_bytes,
                threads: 0,
                progress: cfg.progress,
            },
        )?;
        Self::with_manifest(cfg, Arc::new(manifest))
    }

    /// Plans the run over an already built manifest.
    pub fn with_manifest(cfg: ServeConfig, manifest: Arc<Manifest>) -> Result<Plan, ServeError> {
        cfg.check_ring_flags()?;
        let sampler = Sampler::new(SamplerConfig {
            n_samples: manifest.len(),
            batch_size: cfg.batch_size,
            world_size: cfg.job.job_world_size,
            seed: cfg.seed,
            shuffle: cfg.shuffle,
            epochs: cfg.epochs,
            start: cfg.start,
        })?;
        let derived = manifest
            .largest_samples_total_bytes(cfg.batch_size as usize)
            .max(1);
        let slot_bytes = cfg.slot_bytes.unwrap_or(derived);
        // A sample larger than a slot fails whichever batch it lands in:
        // say so now, not after the ring is made and hours of training.
        if manifest.max_sample_bytes() > slot_bytes {
            if let Some(index) =
                (0..manifest.len()).find(|&i| manifest.sample(i).len_bytes > slot_bytes)
            {
                let loc = manifest.sample(index);
                return Err(ServeError::SlotTooSmall {
                    index,
                    path: manifest.abs_path(loc.file).display().to_string(),
                    len: loc.len_bytes,
                    slot_bytes,
                    derived,
                });
            }
        }
        if slot_bytes < derived {
            return Err(ServeError::SlotSmallerThanBatch {
                slot_bytes,
                batch_size: cfg.batch_size,
                derived,
            });
        }
        let batches_per_rank = sampler.total_steps().unwrap_or(u64::MAX);
        if cfg.slots_per_rank == Some(1) && batches_per_rank > 1 {
            tracing::warn!(
                "--slots-per-rank 1: the loader cannot read ahead, and a trainer can hold only one batch, so \
                 `for batch in feed` (which holds the last batch while it asks for the next) raises AllSlotsHeldError \
                 at the second batch unless each batch is released first (batch.release()); 2 or more avoids both"
            );
        }
        let slots_per_rank = cfg.slots_per_rank.unwrap_or_else(|| {
            let k = auto_slots_per_rank(cfg.batch_size, cfg.reader.queue_depth, slot_bytes);
            // Slots past the batches a rank gets are never used; 2 keeps
            // `for batch in feed` (one batch held, one asked for) working.
            let k = u32::try_from(batches_per_rank.max(2)).map_or(k, |most| k.min(most));
            let g = RingGeometry {
                world_size: cfg.world_size,
                slots_per_rank: k,
                max_samples_per_slot: cfg.batch_size,
                slot_payload_bytes: slot_bytes,
            };
            fit_auto_slots(g, segment::shm_room_for(&cfg.name).map(|room| room.left()))
        });
        let geometry = RingGeometry {
            world_size: cfg.world_size,
            slots_per_rank,
            max_samples_per_slot: cfg.batch_size,
            slot_payload_bytes: slot_bytes,
        };
        if let Err(e) = Layout::compute(geometry) {
            return Err(ServeError::Shape(shape_problem(
                &cfg,
                geometry,
                manifest.max_sample_bytes(),
                &e,
            )));
        }
        let files = Arc::new(FileTable::over(
            manifest.root(),
            Arc::clone(manifest.files()),
            cfg.record_bytes.is_some(),
        )?);
        let start = Some(RunStart {
            epoch: cfg.start.epoch,
            samples_consumed: cfg.start.samples_consumed,
            dataset_samples: sampler.config().n_samples,
        });
        let order = Some(RunOrder {
            seed: cfg.seed,
            shuffled: cfg.shuffle,
        });
        let job = Job {
            plan_digest: plan_digest(&cfg, &manifest),
            start,
            order,
            ..cfg.job
        };
        Ok(Plan {
            cfg,
            manifest,
            sampler,
            slot_bytes,
            derived_slot_bytes: derived,
            slots_per_rank,
            files,
            job,
        })
    }

    /// What would make the ring fit the room `e` (a `ShmTooSmall`) found:
    /// "; or ..." with a flag and its value, or empty.
    fn smaller_ring_advice(&self, e: &CreateError) -> String {
        let CreateError::ShmTooSmall { room, .. } = e else {
            return String::new();
        };
        if self.slot_bytes > self.derived_slot_bytes {
            return format!(
                "; lower --slot-bytes {} to {} (the batch-size largest samples together), or leave it out to size slots from the data",
                self.slot_bytes, self.derived_slot_bytes
            );
        }
        let left = room.left();
        let geometry = RingGeometry {
            world_size: self.cfg.world_size,
            slots_per_rank: self.slots_per_rank,
            max_samples_per_slot: self.cfg.batch_size,
            slot_payload_bytes: self.slot_bytes,
        };
        let bytes = |k| {
            Layout::compute(RingGeometry {
                slots_per_rank: k,
                ..geometry
            })
            .map_or(u64::MAX, |l| l.segment_bytes)
        };
        // Fewer than two slots would stall `for batch in feed` (one batch
        // held while the next is asked for).
        match (AUTO_SLOTS_FLOOR..self.slots_per_rank).rev().find(|&k| bytes(k) <= left) {
            Some(k) => format!(
                ": --slots-per-rank {k} fits ({}, less prefetch than {})",
                human_bytes(bytes(k)),
                self.slots_per_rank
            ),
            None => format!(
                ": even {AUTO_SLOTS_FLOOR} slots per rank take {} (a slot holds a batch's {} largest samples, {}); lower --batch-size",
                human_bytes(bytes(AUTO_SLOTS_FLOOR)),
                self.cfg.batch_size,
                human_bytes(self.slot_bytes)
            ),
        }
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The sampler.
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// Batches each rank gets in the whole run.
    pub fn batches_per_rank(&self) -> u64 {
        // Sampler::new refused runs whose count does not fit a u64.
        self.sampler.total_steps().unwrap_or(u64::MAX)
    }

    /// Where the served ranks sit in the job, and the plan's digest.
    pub fn job(&self) -> Job {
        self.job
    }

    /// Payload bytes of each slot.
    pub fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    /// Slots per rank: given, or [`auto_slots_per_rank`] lowered to fit the
    /// room free in /dev/shm when the plan was made.
    pub fn slots_per_rank(&self) -> u32 {
        self.slots_per_rank
    }
}

/// A running loader.
pub struct Loader {
    plan: Plan,
    // Declared before `producer` so it drops first: its drop waits for reads
    // under way, which write into the ring the producer maps.
    reader: Box<dyn ReadEngine>,
    producer: Producer,
    cursors: Vec<RankCursor>,
    pending: Pending,
    queued: VecDeque<ReadOp>,
    completions: Vec<Completion>,
    report: ServeReport,
    started: Instant,
    /// Rank the next fill pass starts at (round-robin across calls).
    next_rank: u32,
    /// Some rank still waits for its first batch (see `fill_ranks`); false
    /// from the moment `rank_started` counts the last one.
    warming: bool,
    /// Most reads in flight while `warming`.
    warm_up_in_flight: usize,
    /// `Producer::reserve_rest` was called.
    reserving: bool,
    /// Ranks whose first batch of this run was published.
    ranks_started: u32,
    /// Bytes of the first batches published so far.
    first_step_bytes: u64,
    /// When a read last completed, or reads were last idle (see `watch_stall`).
    reads_moved: Instant,
    /// `reads_moved` when `probe_stalled_files` last started a probe.
    stall_probed: Option<Instant>,
    /// The probe under way, on its own thread: its outcome comes here.
    stall_probe: Option<std::sync::mpsc::Receiver<Result<(), ReadError>>>,
    /// The last stall warning.
    stall_warned: Option<Instant>,
    /// The ring's name in /dev/shm was found removed (warned once).
    name_lost: bool,
}

impl Loader {
    /// Creates the ring and opens the reader. Consumers may attach from now on.
    pub fn start(plan: Plan) -> Result<Loader, ServeError> {
        let cfg = &plan.cfg;
        let geometry = RingGeometry {
            world_size: cfg.world_size,
            slots_per_rank: plan.slots_per_rank,
            max_samples_per_slot: cfg.batch_size,
            slot_payload_bytes: plan.slot_bytes,
        };
        let opened = open_engine(cfg.io, Arc::clone(&plan.files), &cfg.reader)?;
        if let Some(w) = &opened.fallback_warning {
            tracing::warn!("{w}");
        }
        let producer = match Producer::create_in_job(&cfg.name, geometry, plan.job) {
            Err(e @ CreateError::ShmTooSmall { .. }) => {
                // The ring layer does not know the flags.
                let advice = plan.smaller_ring_advice(&e);
                return Err(ServeError::RingDoesNotFit { source: e, advice });
            }
            other => other?,
        };
        let per_rank = plan.batches_per_rank();
        for r in 0..cfg.world_size {
            producer.set_batches_expected(r, per_rank);
        }
        producer.set_reader_info(opened.engine.backend_name(), 0);
        let cursors = (0..cfg.world_size)
            .map(|_| RankCursor::new(&plan.sampler))
            .collect();
        let report = ServeReport {
            backend: opened.engine.backend_name(),
            ..Default::default()
        };
        let max_in_flight = opened.engine.max_in_flight();
        let warm_up_in_flight = (cfg.batch_size as usize)
            .clamp(WARM_UP_IN_FLIGHT_MIN.min(max_in_flight), max_in_flight);
        Ok(Loader {
            plan,
            reader: opened.engine,
            producer,
            cursors,
            pending: Pending::default(),
            queued: VecDeque::new(),
            completions: Vec::new(),
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
        })
    }

    /// The plan being served.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The ring's producer (for tests and stats).
    pub fn producer(&self) -> &Producer {
        &self.producer
    }

    /// Serves every batch, then waits until all are released. `stop` holds a
    /// signal number once the process was asked to stop.
    ///
    /// On a stop or an error the trainers are told and the ring's name is
    /// removed at once. A read that does not return within `READS_GRACE`
    /// after that is left under way, and so are the ring's mapping, its
    /// memory, its descriptor and the reader's threads, until the process
    /// exits: the caller should exit soon after an error.
    pub fn run(mut self, stop: &AtomicU32) -> Result<ServeReport, ServeError> {
        let result = self.run_inner(stop);
        if let Err(err) = &result {
            // Trainers learn it now, and the name is free for a new loader,
            // whether or not the reads under way ever return.
            // The loader's own words (what failed, the fix) reach every
            // trainer, not just this process's log.
            let code = if let ServeError::Signal(sig) = err {
                *sig
            } else {
                0
            };
            self.producer.abort_with(code, &err.to_string());
            self.producer.remove_name();
        }
        self.report.elapsed = self.started.elapsed();
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
        let Loader {
            reader, producer, ..
        } = self;
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

    fn run_inner(&mut self, stop: &AtomicU32) -> Result<(), ServeError> {
        let world = self.plan.cfg.world_size;
        let mut last_reclaim = Instant::now();
        let mut last_progress = Instant::now();
        let mut progress_base = (0u64, Instant::now());
        let mut batch = Vec::with_capacity(self.plan.cfg.batch_size as usize);
        loop {
            check_stop(stop)?;
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
            self.publish_ready()?;
            if self.all_claimed() && self.pending.is_empty() && self.queued.is_empty() {
                break;
            }
            if last_reclaim.elapsed() >= RECLAIM_EVERY {
                self.reclaim();
                last_reclaim = Instant::now();
            }
            if last_progress.elapsed() >= PROGRESS_EVERY {
                self.log_progress(&mut progress_base);
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
        self.producer.finish();
        tracing::debug!("every batch published; waiting for the trainers to release the last ones");
        let all: Vec<u32> = (0..world).collect();
        while !self.producer.all_released() {
            check_stop(stop)?;
            if last_reclaim.elapsed() >= RECLAIM_EVERY {
                self.reclaim();
                last_reclaim = Instant::now();
            }
            if last_progress.elapsed() >= PROGRESS_EVERY {
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
        Ok(())
    }

    fn all_claimed(&self) -> bool {
        self.cursors.iter().all(RankCursor::done)
    }

    /// Claims free slots round-robin, one batch per rank per pass, so that
    /// every rank's first batch is read early (time to first batch does not
    /// grow with the number of ranks). Stops once a full queue depth of reads
    /// waits to be submitted. Returns the unfinished ranks with no free slot.
    fn fill_ranks(&mut self, batch: &mut Vec<u64>) -> Result<Vec<u32>, ServeError> {
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

    /// Claims one free slot of rank r and queues the reads of its batch.
    /// Returns false when the rank has no free slot.
    fn fill_one(&mut self, r: u32, batch: &mut Vec<u64>) -> Result<bool, ServeError> {
        {
            let Some(claim) = self.producer.try_claim(r)? else {
                return Ok(false);
            };
            // Page-rounded, so at least slot_bytes: room for spare bytes.
            let payload_bytes = claim.payload_bytes();
            let (epoch, step) = self.cursors[r as usize].advance(&self.plan.sampler);
            self.plan
                .sampler
                .batch_into(epoch, step, self.plan.cfg.job.first_rank + r, batch);
            let id = self.pending.add(claim, epoch, step);
            let mut offset = 0u64;
            for &index in batch.iter() {
                let loc = self.plan.manifest.sample(index);
                let end = offset + loc.len_bytes;
                let slot_bytes = self.plan.slot_bytes;
                if end > slot_bytes {
                    return Err(ServeError::SampleTooLarge {
                        index,
                        path: self.plan.manifest.abs_path(loc.file).display().to_string(),
                        len: loc.len_bytes,
                        epoch,
                        step,
                        rank: r,
                        needed: batch
                            .iter()
                            .map(|&i| self.plan.manifest.sample(i).len_bytes)
                            .sum(),
                        slot_bytes,
                    });
                }
                let dest = self.pending.sample(id, offset, loc.len_bytes, index);
                // The byte after this sample is the next sample's first or
                // unused room in this slot's payload, and a failed read
                // stops the run before the slot is published (`complete`);
                // only a batch that fills its payload exactly has no such
                // byte. An empty sample is read too: one byte, to see that
                // its file is still empty.
                let spare_byte = end < payload_bytes;
                self.queued.push_back(ReadOp {
                    file: loc.file,
                    offset_bytes: loc.offset_bytes,
                    len_bytes: loc.len_bytes,
                    dest,
                    spare_byte,
                    user_data: id as u64,
                });
                self.pending.expect_read(id);
                offset = end;
            }
        }
        Ok(true)
    }

    fn submit_queued(&mut self) -> Result<(), ServeError> {
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

    fn complete(&mut self) -> Result<(), ServeError> {
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

    fn publish_ready(&mut self) -> Result<(), ServeError> {
        for r in 0..self.plan.cfg.world_size {
            while let Some(done) = self.pending.pop_ready(r, self.producer.published(r)) {
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

    /// Names the ranks among `waiting` that no trainer is attached to: a
    /// trainer that crashed before attaching, or a rank-count typo, would
    /// otherwise look like a loader that hangs in silence.
    fn log_unattached(&self, waiting: &[u32], context: &str) {
        let missing: Vec<u32> = waiting
            .iter()
            .copied()
            .filter(|&r| !self.producer.consumer_attached(r))
            .collect();
        if missing.is_empty() {
            return;
        }
        let w = self.plan.cfg.world_size;
        let line = format!(
            "{context}waiting for rank(s) {missing:?}: no trainer is attached to them (the loader serves ranks 0 to {last}; each trainer \
             attaches with LOCAL_RANK set to its rank, and this machine needs {w} trainer(s), LOCAL_RANK 0 to {last})",
            last = w.saturating_sub(1)
        );
        if (0..w).any(|r| self.producer.ever_attached(r)) {
            // Some trainers came and these did not: a crash or a rank mismatch.
            tracing::warn!("{line}");
        } else {
            // None yet: trainers still starting (torchrun, imports) is normal.
            tracing::info!("{line}");
        }
    }

    /// Once no read has completed for `STALL_PROBE`, checks that the files
    /// of the reads in flight are regular files: a FIFO put in place of one
    /// (after the listing) blocks an io_uring open until a writer comes,
    /// which may be never. Fails with `NotRegular` naming it, instead of a
    /// loader that waits in silence. Once per stall, on a thread of its own:
    /// on a hung network filesystem the stats block too, and this thread
    /// must go on acting on a stop.
    fn probe_stalled_files(&mut self) -> Result<(), ServeError> {
        if let Some(outcome) = &self.stall_probe {
            match outcome.try_recv() {
                Ok(found) => {
                    self.stall_probe = None;
                    found?;
                }
                // Still at it (perhaps stuck itself): no second one.
                Err(TryRecvError::Empty) => return Ok(()),
                Err(TryRecvError::Disconnected) => self.stall_probe = None,
            }
        }
        if self.reads_moved.elapsed() < STALL_PROBE || self.stall_probed == Some(self.reads_moved) {
            return Ok(());
        }
        self.stall_probed = Some(self.reads_moved);
        // The files of the waiting batches' reads, less those still queued
        // (per file: a file may be read by several ops); some that already
        // landed are counted in, which costs a stat each.
        let manifest = &self.plan.manifest;
        let mut reads: HashMap<u32, i64> = HashMap::new();
        for sample in self.pending.samples_waiting() {
            *reads.entry(manifest.sample(sample.index).file).or_default() += 1;
        }
        for op in &self.queued {
            *reads.entry(op.file).or_default() -= 1;
        }
        let mut files: Vec<u32> = reads
            .into_iter()
            .filter(|&(_, n)| n > 0)
            .map(|(file, _)| file)
            .collect();
        files.sort_unstable();
        files.truncate(STALL_PROBE_FILES_MAX);
        let table = Arc::clone(&self.plan.files);
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("ringfeed-stall-probe".into())
            .spawn(move || {
                let _ = tx.send(
                    files
                        .iter()
                        .try_for_each(|&file| table.check_still_regular(file)),
                );
            });
        match spawned {
            Ok(_) => self.stall_probe = Some(rx),
            Err(e) => {
                tracing::debug!("cannot start a thread to look at the files of stalled reads: {e}")
            }
        }
        Ok(())
    }

    /// Warns, every `READS_STALLED`, while reads are in flight and none has
    /// completed for that long: otherwise a read that never returns looks
    /// like a loader that hangs in silence.
    fn watch_stall(&mut self) {
        let in_flight = self.reader.in_flight();
        if in_flight == 0 {
            self.reads_moved = Instant::now();
            return;
        }
        let still = self.reads_moved.elapsed();
        let quiet = self
            .stall_warned
            .is_none_or(|t| t.elapsed() >= READS_STALLED);
        if still >= READS_STALLED && quiet {
            tracing::warn!(
                "no read has completed for {:.0} s, with {in_flight} in flight (a hung network filesystem, or a FIFO or device in place of a dataset file under {}?)",
                still.as_secs_f64(),
                self.plan.cfg.source.display()
            );
            self.stall_warned = Some(Instant::now());
        }
    }

    /// Warns, once, when the ring's name is no longer in /dev/shm (removed by
    /// `rm /dev/shm/*` or systemd's RemoveIPC): trainers attached go on, but
    /// none can attach any more, and a rank waiting for one waits for ever.
    fn watch_name(&mut self) {
        if self.name_lost || self.producer.name_is_ours() {
            return;
        }
        self.name_lost = true;
        tracing::warn!(
            "{} was removed from /dev/shm while this loader runs (by hand, a cleanup script, or systemd's RemoveIPC=yes at logout): \
             trainers already attached go on, but no trainer can attach any more; stop this loader (Ctrl-C) and start it again \
             (--resume to go on where the trainers are), and keep /dev/shm/ringfeed-* out of cleanups",
            self.producer.path()
        );
    }

    fn log_progress(&self, base: &mut (u64, Instant)) {
        let secs = base.1.elapsed().as_secs_f64();
        let mb = (self.report.bytes - base.0) as f64 / 1e6;
        let total = self
            .plan
            .batches_per_rank()
            .saturating_mul(u64::from(self.plan.cfg.world_size));
        // The epochs of the ranks still going: a rank that is done sits past
        // the last epoch, and ranks whose trainers differ in speed can be
        // in different epochs.
        let epochs = self
            .cursors
            .iter()
            .filter(|c| !c.done())
            .map(|c| c.position().0);
        let epoch = match (epochs.clone().min(), epochs.max()) {
            (Some(lo), Some(hi)) if lo < hi => format!("epochs {lo} to {hi}"),
            (Some(e), _) => format!("epoch {e}"),
            _ => "last epoch".to_owned(),
        };
        tracing::info!(
            "{epoch}: {}/{} batches published, {:.1} MB/s",
            self.report.batches,
            total,
            mb / secs.max(1e-9)
        );
        *base = (self.report.bytes, Instant::now());
    }
}

/// Says which property of the data, or which flags together, make `g`
/// impossible (each flag alone passed `ServeConfig::check_ring_flags`).
/// [`Job::plan_digest`] of a run: the manifest's digest and every flag that
/// decides which samples job rank r gets at (epoch, step). Never 0 (0 means
/// "not known" in the header).
fn plan_digest(cfg: &ServeConfig, manifest: &Manifest) -> u64 {
    let t = std::time::Instant::now();
    let c = cfg;
    let words = [
        u64::from(c.shuffle),
        c.seed,
        c.batch_size.into(),
        c.job.job_world_size.into(),
        c.epochs,
        c.start.epoch,
        c.start.samples_consumed,
    ];
    let digest = crate::manifest::digest_words(manifest.digest(), words).max(1);
    tracing::debug!(
        "plan digest {digest:016x} in {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    digest
}

fn shape_problem(
    cfg: &ServeConfig,
    g: RingGeometry,
    largest_sample: u64,
    e: &GeometryError,
) -> String {
    use crate::ring::layout::{MAX_SEGMENT_BYTES, MAX_SLOT_PAYLOAD_BYTES};
    match e {
        GeometryError::OutOfRange { field: "slot_payload_bytes", .. } if largest_sample > MAX_SLOT_PAYLOAD_BYTES => format!(
            "a sample of {} is more than the {} a slot can hold; split such files, or serve them as fixed-size records with --record-bytes",
            human_bytes(largest_sample),
            human_bytes(MAX_SLOT_PAYLOAD_BYTES)
        ),
        GeometryError::OutOfRange { field: "slot_payload_bytes", value, .. } => format!(
            "a slot must hold the {} largest samples together, {}, more than the {} a slot can hold; lower --batch-size",
            cfg.batch_size,
            human_bytes(*value),
            human_bytes(MAX_SLOT_PAYLOAD_BYTES)
        ),
        // --slot-bytes is named only when it was given: a slot sized from
        // the data cannot be made smaller with it (and demo has no such flag).
        GeometryError::TooLarge { .. } => format!(
            "{} rank(s) x {} slots of {} would be more than {} of shared memory; lower --slots-per-rank{}",
            g.world_size,
            g.slots_per_rank,
            human_bytes(g.slot_payload_bytes),
            human_bytes(MAX_SEGMENT_BYTES),
            if cfg.slot_bytes.is_some() { ", --batch-size or --slot-bytes" } else { " or --batch-size" }
        ),
        other => format!("{other} ({} rank(s) on this machine, --batch-size {})", g.world_size, g.max_samples_per_slot),
    }
}

fn check_stop(stop: &AtomicU32) -> Result<(), ServeError> {
    match stop.load(Ordering::Relaxed) {
        0 => Ok(()),
        STOP_NOT_A_SIGNAL => Err(ServeError::Stopped),
        sig => Err(ServeError::Signal(sig)),
    }
}

fn blocked_ranks(blocked: &[bool]) -> Vec<u32> {
    (0..blocked.len() as u32)
        .filter(|&r| blocked[r as usize])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_slots_cover_twice_the_queue_depth_within_bounds() {
        let mb = 1_000_000;
        // 2·256/64 = 8 slots of 6.4 MB.
        assert_eq!(auto_slots_per_rank(64, 256, 64 * 100_000), 8);
        // Large batches: never fewer than 4.
        assert_eq!(auto_slots_per_rank(256, 256, 256 * 4096), 4);
        // Tiny batches: at most 16.
        assert_eq!(auto_slots_per_rank(1, 256, 4096), 16);
        // 2·256/48 = 10.67, rounded up.
        assert_eq!(auto_slots_per_rank(48, 256, mb), 11);
        // 64 MB slots: 8 would be 512 MB per rank; 4 is the floor.
        assert_eq!(auto_slots_per_rank(64, 256, 64 * mb), 4);
        // 40 MB slots: 6 fit in 256 MiB.
        assert_eq!(auto_slots_per_rank(32, 256, 40 * mb), 6);
        // Degenerate inputs do not panic.
        assert_eq!(auto_slots_per_rank(0, 1, 0), 4);
    }

    #[test]
    fn the_readers_share_the_manifests_file_list() {
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in [("a", 3), ("b", 5)] {
            std::fs::write(dir.path().join(name), vec![7; bytes]).unwrap();
        }
        let cfg = ServeConfig {
            source: dir.path().to_path_buf(),
            name: "unused".into(),
            batch_size: 1,
            world_size: 1,
            job: Job::single(1),
            epochs: 1,
            seed: 0,
            shuffle: false,
            record_bytes: None,
            slots_per_rank: None,
            slot_bytes: None,
            io: IoChoice::Pread,
            reader: ReaderConfig::default(),
            start: ResumeState::default(),
            progress: false,
        };
        let plan = Plan::new(cfg).unwrap();
        // One copy of the paths for a million files is 16 MB: never two.
        assert!(Arc::ptr_eq(plan.manifest().files(), plan.files.files()));
        assert_eq!(plan.files.size_bytes(1), Some(5));
    }

    fn plan_over(
        samples: usize,
        batch_size: u32,
        world_size: u32,
        epochs: u64,
        slots_per_rank: Option<u32>,
    ) -> Plan {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..samples {
            std::fs::write(dir.path().join(format!("{i:04}")), [7u8; 16]).unwrap();
        }
        let cfg = ServeConfig {
            source: dir.path().to_path_buf(),
            name: "unused".into(),
            batch_size,
            world_size,
            job: Job::single(world_size),
            epochs,
            seed: 0,
            shuffle: true,
            record_bytes: None,
            slots_per_rank,
            slot_bytes: None,
            io: IoChoice::Pread,
            reader: ReaderConfig::default(),
            start: ResumeState::default(),
            progress: false,
        };
        Plan::new(cfg).unwrap()
    }

    #[test]
    fn the_default_slots_are_no_more_than_the_batches_a_rank_gets_nor_fewer_than_two() {
        // 200 samples, W=128, B=1: one batch per rank per epoch. 16 slots of
        // each of 128 ranks would never be used.
        assert_eq!(plan_over(200, 1, 128, 1, None).slots_per_rank(), 2);
        assert_eq!(plan_over(200, 1, 128, 5, None).slots_per_rank(), 5);
        assert_eq!(plan_over(200, 1, 1, 1, None).slots_per_rank(), 16);
        // A given K is kept as given.
        assert_eq!(plan_over(200, 1, 128, 1, Some(9)).slots_per_rank(), 9);
    }

    #[test]
    fn the_default_slots_shrink_to_fit_dev_shm_down_to_two() {
        let g = RingGeometry {
            world_size: 8,
            slots_per_rank: 8,
            max_samples_per_slot: 64,
            slot_payload_bytes: 1 << 20,
        };
        let size = |k| {
            Layout::compute(RingGeometry {
                slots_per_rank: k,
                ..g
            })
            .unwrap()
            .segment_bytes
        };
        assert_eq!(fit_auto_slots(g, None), 8, "unknown or unlimited /dev/shm");
        assert_eq!(fit_auto_slots(g, Some(size(8))), 8);
        assert_eq!(fit_auto_slots(g, Some(size(8) - 1)), 7);
        assert_eq!(fit_auto_slots(g, Some(size(3) + 100)), 3);
        // Not even 2 fit: keep the default and let create say how much is needed.
        assert_eq!(fit_auto_slots(g, Some(size(2) - 1)), 8);
    }
}
