//! The plan of a run: the configuration, the manifest and sampler, the
//! slots' size and number, and the ring's shape, all settled before the
//! ring is made.

use std::sync::Arc;

use super::stack::{ReadTarget, RemoteTarget};
use crate::manifest::{Manifest, ManifestOptions};
use crate::reader::{FileTable, IoChoice, ReaderConfig};
use crate::remote::FetchConfig;
use crate::ring::layout::{GeometryError, Job, RunOrder, RunStart};
use crate::ring::segment::{self, human_bytes};
use crate::ring::{CreateError, Layout, RingGeometry};
use crate::sampler::{ResumeState, SampleOrder, Sampler, SamplerConfig};
use crate::source::{LocalSource, OpenedSource, SourceSpec};

use super::PlanError;

/// Everything `ringfeed serve` needs.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The dataset: a local directory or a remote prefix (`--source`, `--keys`).
    pub source: SourceSpec,
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
    /// The order of every epoch (`--shuffle`; `--no-shuffle` is `None`).
    pub order: SampleOrder,
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

/// A prepared run: manifest listed, sampler planned, the readers' file table
/// built. Separate from [`Loader::start`](super::Loader::start) so callers
/// can time the first batch without the listing.
pub struct Plan {
    pub(super) cfg: ServeConfig,
    /// Where the objects are (`cfg.source`): names them in messages.
    pub(super) source: OpenedSource,
    pub(super) manifest: Arc<Manifest>,
    pub(super) sampler: Sampler,
    pub(super) slot_bytes: u64,
    /// The slot size the data needs: the batch-size largest samples together.
    derived_slot_bytes: u64,
    pub(super) slots_per_rank: u32,
    /// The manifest's objects as the readers open them: a local file table,
    /// or the remote store and its objects.
    pub(super) target: ReadTarget,
    /// `cfg.job` with its [`Job::plan_digest`], as the header holds it.
    pub(super) job: Job,
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
    pub fn check_ring_flags(&self) -> Result<(), PlanError> {
        use crate::ring::layout::{MAX_SLOTS_PER_RANK, MAX_SLOT_PAYLOAD_BYTES};
        let bad = |m: String| Err(PlanError::Shape(m));
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
    pub fn new(cfg: ServeConfig) -> Result<Plan, PlanError> {
        let source = cfg.source.open()?;
        let manifest = source.build_manifest(&ManifestOptions {
            record_bytes: cfg.record_bytes,
            threads: 0,
            progress: cfg.progress,
        })?;
        Self::with_source(cfg, source, Arc::new(manifest), None)
    }

    /// Plans the run over an already built manifest of `cfg.source`.
    pub fn with_manifest(cfg: ServeConfig, manifest: Arc<Manifest>) -> Result<Plan, PlanError> {
        let source = match &cfg.source {
            SourceSpec::Local(path) => OpenedSource::Local(LocalSource::at(path)),
            remote => remote.open()?,
        };
        Self::with_source(cfg, source, manifest, None)
    }

    /// Plans the run over a manifest built from `source` (which reads it:
    /// a remote source's runtime serves listing and fetching alike), with
    /// `data_cache` in front of a remote source's reads (a local one is
    /// never cached).
    pub fn with_source(
        cfg: ServeConfig,
        source: OpenedSource,
        manifest: Arc<Manifest>,
        data_cache: Option<crate::cache::CacheConfig>,
    ) -> Result<Plan, PlanError> {
        cfg.check_ring_flags()?;
        let sampler = Sampler::new(SamplerConfig {
            n_samples: manifest.len(),
            batch_size: cfg.batch_size,
            world_size: cfg.job.job_world_size,
            seed: cfg.seed,
            order: cfg.order,
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
                return Err(PlanError::SlotTooSmall {
                    index,
                    path: source
                        .source()
                        .object_name(manifest.files().path_bytes(loc.file as usize))
                        .display()
                        .to_string(),
                    len: loc.len_bytes,
                    slot_bytes,
                    derived,
                });
            }
        }
        if slot_bytes < derived {
            return Err(PlanError::SlotSmallerThanBatch {
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
            let k = match &source {
                OpenedSource::Remote(_) => super::chunks::lookahead_slots(
                    &manifest,
                    sampler.config().order,
                    cfg.batch_size,
                    slot_bytes,
                )
                .map_or(k, |ahead| k.max(ahead)),
                OpenedSource::Local(_) => k,
            };
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
            return Err(PlanError::Shape(shape_problem(
                &cfg,
                geometry,
                manifest.max_sample_bytes(),
                &e,
            )));
        }
        let target = match &source {
            OpenedSource::Local(local) => ReadTarget::Files(Arc::new(FileTable::over(
                local.root(),
                Arc::clone(manifest.files()),
                cfg.record_bytes.is_some() || manifest.sample_ranges().is_some(),
            )?)),
            OpenedSource::Remote(remote) => ReadTarget::Remote(Box::new(RemoteTarget {
                runtime: Arc::clone(remote.runtime()),
                store: remote.store().clone(),
                objects: Arc::new(remote.objects_for(manifest.files())),
                fetch: FetchConfig::default(),
                cache: data_cache,
                chunk: super::chunks::block_chunks(&manifest, sampler.config().order),
            })),
        };
        let start = Some(RunStart {
            epoch: cfg.start.epoch,
            samples_consumed: cfg.start.samples_consumed,
            dataset_samples: sampler.config().n_samples,
        });
        let block = cfg.order.block_shape();
        let order = Some(RunOrder {
            seed: cfg.seed,
            shuffled: cfg.order.is_shuffled(),
            block_samples: block.map_or(0, |b| b.block_samples()),
            window_blocks: block.map_or(0, |b| b.window_blocks()),
        });
        let job = Job {
            plan_digest: plan_digest(&cfg, &manifest),
            start,
            order,
            ..cfg.job
        };
        Ok(Plan {
            cfg,
            source,
            manifest,
            sampler,
            slot_bytes,
            derived_slot_bytes: derived,
            slots_per_rank,
            target,
            job,
        })
    }

    /// What would make the ring fit the room `e` (a `ShmTooSmall`) found:
    /// "; or ..." with a flag and its value, or empty.
    pub(super) fn smaller_ring_advice(&self, e: &CreateError) -> String {
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

    /// Object `file` of the manifest as messages name it (`root/key`).
    pub fn object_name(&self, file: u32) -> std::path::PathBuf {
        self.source
            .source()
            .object_name(self.manifest.files().path_bytes(file as usize))
    }

    /// The data cache's counters, when one is in front of the reads (for
    /// the ring's counter block and `stat`).
    pub fn cache_stats(&self) -> Option<&Arc<crate::cache::CacheStats>> {
        match &self.target {
            ReadTarget::Remote(remote) => remote.cache.as_ref().map(|c| &c.stats),
            ReadTarget::Files(_) => None,
        }
    }

    /// Whether the source is remote (and so may be cached).
    pub fn is_remote(&self) -> bool {
        matches!(self.target, ReadTarget::Remote(_))
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

/// [`Job::plan_digest`] of a run: the manifest's digest and every flag that
/// decides which samples job rank r gets at (epoch, step). Never 0 (0 means
/// "not known" in the header).
fn plan_digest(cfg: &ServeConfig, manifest: &Manifest) -> u64 {
    let t = std::time::Instant::now();
    let c = cfg;
    // A block order adds its shape; the exact and no shuffle keep the
    // digest they always had.
    let block = c
        .order
        .block_shape()
        .map(|b| [u64::from(b.block_samples()), u64::from(b.window_blocks())]);
    let words = [
        u64::from(c.order.is_shuffled()),
        c.seed,
        c.batch_size.into(),
        c.job.job_world_size.into(),
        c.epochs,
        c.start.epoch,
        c.start.samples_consumed,
    ];
    let words = words.into_iter().chain(block.into_iter().flatten());
    let digest = crate::manifest::digest_words(manifest.digest(), words).max(1);
    tracing::debug!(
        "plan digest {digest:016x} in {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    digest
}

/// Says which property of the data, or which flags together, make `g`
/// impossible (each flag alone passed `ServeConfig::check_ring_flags`).
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
            source: dir.path().into(),
            name: "unused".into(),
            batch_size: 1,
            world_size: 1,
            job: Job::single(1),
            epochs: 1,
            seed: 0,
            order: SampleOrder::None,
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
        assert!(Arc::ptr_eq(
            plan.manifest().files(),
            plan.target.files().unwrap().files()
        ));
        assert_eq!(plan.target.files().unwrap().size_bytes(1), Some(5));
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
            source: dir.path().into(),
            name: "unused".into(),
            batch_size,
            world_size,
            job: Job::single(world_size),
            epochs,
            seed: 0,
            order: SampleOrder::Exact,
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
