//! The plan of a run: the configuration, the manifest and sampler, the
//! slots' size and number, and the ring's shape, all settled before the
//! ring is made.

use std::sync::Arc;

use super::stack::{ReadTarget, RemoteTarget};
use crate::images::Labels;
use crate::manifest::{Manifest, ManifestOptions};
use crate::reader::{FileTable, IoChoice, ReaderConfig};
use crate::remote::FetchConfig;
use crate::ring::layout::{GeometryError, ImageFormat, Job, RunOrder, RunStart};
use crate::ring::segment::{self, human_bytes};
use crate::ring::{CreateError, Layout, RingGeometry};
use crate::sampler::{ResumeState, SampleOrder, Sampler, SamplerConfig, Tail};
use crate::source::{LocalSource, OpenedSource, SourceSpec};

use super::slots::{auto_slots_per_rank, fit_auto_slots, AUTO_SLOTS_FLOOR};
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
    /// How every epoch ends (`--tail`): its tail shorter than a step
    /// dropped (training), or kept in short last batches (evaluation).
    pub tail: Tail,
    /// Log progress: while listing, and when every rank has its first batch.
    pub progress: bool,
    /// Decode every sample as an image (`--decode image`) into fixed-shape
    /// slots; None: serve the objects' bytes.
    pub decode: Option<crate::images::DecodeConfig>,
    /// Serve windows of tokens (`--seq-len`, docs/tokens.md); None: samples.
    pub tokens: Option<super::token_run::TokensConfig>,
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
    pub(super) derived_slot_bytes: u64,
    pub(super) slots_per_rank: u32,
    /// The ring's shape, settled once.
    pub(super) geometry: RingGeometry,
    /// The decode stage's layout of a slot, with `--decode image`.
    pub(super) decode: Option<DecodePlan>,
    /// The manifest's objects as the readers open them: a local file table,
    /// or the remote store and its objects.
    pub(super) target: ReadTarget,
    /// `cfg.job` with its [`Job::plan_digest`], as the header holds it.
    pub(super) job: Job,
    /// A token run's windows, mixture and slot layout (`--seq-len`).
    pub(super) tokens: Option<Arc<super::token_run::TokenRun>>,
}

impl ServeConfig {
    /// What decides which samples each job rank gets, over `n_samples`.
    pub fn sampler_config(&self, n_samples: u64) -> SamplerConfig {
        SamplerConfig {
            n_samples,
            batch_size: self.batch_size,
            world_size: self.job.job_world_size,
            seed: self.seed,
            order: self.order,
            epochs: self.epochs,
            start: self.start,
            tail: self.tail,
        }
    }

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
        let sampler = Sampler::new(cfg.sampler_config(manifest.len()))?;
        let (slot_bytes, derived) = slot_bytes(&cfg, &source, &manifest)?;
        let decode = match &cfg.decode {
            Some(d) => Some(decode_plan(d, &manifest, cfg.batch_size)?),
            None => None,
        };
        // The samples (after any images), their keys, the class names.
        let names = SlotNames::plan(slot_bytes, &manifest, cfg.batch_size, decode.as_ref());
        let payload_bytes = names.end;
        let batches_per_rank = sampler.total_steps().unwrap_or(u64::MAX);
        if cfg.slots_per_rank == Some(1) && batches_per_rank > 1 {
            tracing::warn!(
                "--slots-per-rank 1: the loader cannot read ahead, and a trainer can hold only one batch, so \
                 `for batch in feed` (which holds the last batch while it asks for the next) raises AllSlotsHeldError \
                 at the second batch unless each batch is released first (batch.release()); 2 or more avoids both"
            );
        }
        // The ring's one geometry: its slot count is settled below.
        let unsized_geometry = RingGeometry {
            world_size: cfg.world_size,
            slots_per_rank: 0,
            max_samples_per_slot: cfg.batch_size,
            slot_payload_bytes: payload_bytes,
        };
        let slots_per_rank = cfg.slots_per_rank.unwrap_or_else(|| {
            let k = auto_slots_per_rank(cfg.batch_size, cfg.reader.queue_depth, payload_bytes);
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
                slots_per_rank: k,
                ..unsized_geometry
            };
            fit_auto_slots(g, segment::shm_room_for(&cfg.name).map(|room| room.left()))
        });
        let geometry = RingGeometry {
            slots_per_rank,
            ..unsized_geometry
        };
        if let Err(e) = Layout::compute(geometry) {
            return Err(PlanError::Shape(shape_problem(
                &cfg,
                geometry,
                manifest.max_sample_bytes(),
                &e,
            )));
        }
        let target = read_target(&cfg, &source, &manifest, &sampler, data_cache)?;
        let job = Job {
            images: decode.as_ref().map(|d| d.format),
            keys: Some(names.keys),
            class_names: names.classes,
            plan_digest: plan_digest(&cfg, &manifest),
            start: Some(RunStart {
                epoch: cfg.start.epoch,
                samples_consumed: cfg.start.samples_consumed,
                dataset_samples: sampler.config().n_samples,
            }),
            order: Some(run_order(&cfg)),
            tail: cfg.tail,
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
            geometry,
            decode,
            target,
            job,
            tokens: None,
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
        let bytes = |k| {
            Layout::compute(RingGeometry {
                slots_per_rank: k,
                ..self.geometry
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
        if let Some(name) = self
            .tokens
            .as_ref()
            .and_then(|t| t.names.get(file as usize))
        {
            return std::path::PathBuf::from(name);
        }
        self.source
            .source()
            .object_name(self.manifest.files().path_bytes(file as usize))
    }

    /// The data cache's counters, when one is in front of the reads (for
    /// the ring's counter block and `stat`).
    pub fn cache_stats(&self) -> Option<&Arc<crate::cache::CacheStats>> {
        fn stats_of(t: &ReadTarget) -> Option<&Arc<crate::cache::CacheStats>> {
            match t {
                ReadTarget::Remote(remote) => remote.cache.as_ref().map(|c| &c.stats),
                ReadTarget::Files(_) => None,
                ReadTarget::Routed(routes) => routes.iter().find_map(|(_, t)| stats_of(t)),
            }
        }
        stats_of(&self.target)
    }

    /// Whether the source is remote (and so may be cached).
    pub fn is_remote(&self) -> bool {
        match &self.target {
            ReadTarget::Remote(_) => true,
            ReadTarget::Files(_) => false,
            ReadTarget::Routed(routes) => routes
                .iter()
                .any(|(_, t)| matches!(t, ReadTarget::Remote(_))),
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

    /// A token run's windows, mixture and slot layout (`--seq-len`).
    pub fn tokens(&self) -> Option<&super::token_run::TokenRun> {
        self.tokens.as_deref()
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

    /// The class names the ring records (`Job::class_names`), in class
    /// order; empty when none are known.
    pub fn class_names(&self) -> &[String] {
        match (&self.decode, self.job.class_names) {
            (Some(d), Some(_)) => &d.labels.classes,
            _ => &[],
        }
    }
}

/// Where a slot keeps its samples' keys and slot 0 the class names: after
/// every other region of the payload (the samples' `slot_bytes`, after the
/// decode stage's images when there is one).
struct SlotNames {
    keys: crate::ring::layout::KeyArea,
    classes: Option<crate::ring::layout::ClassNames>,
    /// The payload's size with them.
    end: u64,
}

impl SlotNames {
    fn plan(
        slot_bytes: u64,
        manifest: &Manifest,
        batch_size: u32,
        decode: Option<&DecodePlan>,
    ) -> SlotNames {
        use crate::ring::layout::{ClassNames, KeyArea};
        let data_end = decode.map_or(slot_bytes, |d| d.staging_base + slot_bytes);
        let keys = KeyArea::plan(data_end, manifest.key_bytes_max());
        let after_keys = keys.end(batch_size);
        let classes = decode.and_then(|d| ClassNames::plan(after_keys, &d.labels.classes));
        if decode.is_some_and(|d| !d.labels.classes.is_empty()) && classes.is_none() {
            tracing::warn!(
                "the class names are more than a ring records ({} names at most, {} bytes): trainers get labels and their count, not the names",
                crate::ring::layout::CLASS_NAMES_MAX,
                crate::ring::layout::CLASS_NAMES_BYTES_MAX
            );
        }
        SlotNames {
            keys,
            classes,
            end: classes.map_or(after_keys, |c| c.end()),
        }
    }
}

/// What, besides the sample count, decides the order of every epoch, as
/// the ring's header records it.
pub(super) fn run_order(cfg: &ServeConfig) -> RunOrder {
    let block = cfg.order.block_shape();
    RunOrder {
        seed: cfg.seed,
        shuffled: cfg.order.is_shuffled(),
        block_samples: block.map_or(0, |b| b.block_samples()),
        window_blocks: block.map_or(0, |b| b.window_blocks()),
    }
}

/// How the decode stage lays out a slot: the images, labels and flags
/// (`format`), then the raw samples from `staging_base` on.
#[derive(Clone, Debug)]
pub(super) struct DecodePlan {
    pub(super) format: ImageFormat,
    pub(super) staging_base: u64,
    pub(super) labels: Arc<Labels>,
    /// Samples are tar samples: the image and label are members of each.
    pub(super) tar: bool,
}

/// The decode stage's plan over `manifest`: its labels, and the slot's
/// image area before the raw samples.
fn decode_plan(
    d: &crate::images::DecodeConfig,
    manifest: &Manifest,
    batch_size: u32,
) -> Result<DecodePlan, PlanError> {
    if manifest.record_bytes().is_some() {
        return Err(PlanError::Decode(
            "--decode image decodes an image per object or tar sample; fixed-size records (--record-bytes) are not images".into(),
        ));
    }
    // Tar samples carry their labels in a member (or their keys'
    // directories); a tree's come from its directories.
    let tar = manifest.sample_ranges().is_some();
    let labels =
        Labels::of(manifest, d.labels, &d.tar.label, d.num_classes).map_err(PlanError::Decode)?;
    let classes = labels.count;
    let spec = &d.spec;
    let format = ImageFormat::plan(
        spec.height(),
        spec.width(),
        spec.layout() == ringfeed_decode::Layout::Chw,
        classes,
        batch_size,
    );
    // Raw samples start on a cache line of their own.
    let staging_base = format.batch_bytes(batch_size).div_ceil(64) * 64;
    Ok(DecodePlan {
        format,
        staging_base,
        labels: Arc::new(labels),
        tar,
    })
}

/// The slot size (given, or the batch-size largest samples together) and
/// the one the data needs; refuses a given size that a sample, or a batch
/// of the largest samples, does not fit: said now, not after the ring is
/// made and hours of training.
fn slot_bytes(
    cfg: &ServeConfig,
    source: &OpenedSource,
    manifest: &Manifest,
) -> Result<(u64, u64), PlanError> {
    let derived = manifest
        .largest_samples_total_bytes(cfg.batch_size as usize)
        .max(1);
    let slot_bytes = cfg.slot_bytes.unwrap_or(derived);
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
    Ok((slot_bytes, derived))
}

/// What the readers read: the local file table over the manifest's file
/// list, or the remote objects with the data cache and chunk layer.
fn read_target(
    cfg: &ServeConfig,
    source: &OpenedSource,
    manifest: &Arc<Manifest>,
    sampler: &Sampler,
    data_cache: Option<crate::cache::CacheConfig>,
) -> Result<ReadTarget, PlanError> {
    Ok(match source {
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
            chunk: super::chunks::block_chunks(manifest, sampler.config().order),
        })),
    })
}

/// [`Job::plan_digest`] of a run: the manifest's digest and every flag that
/// decides which samples job rank r gets at (epoch, step). Never 0 (0 means
/// "not known" in the header).
pub(super) fn plan_digest(cfg: &ServeConfig, manifest: &Manifest) -> u64 {
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
    // A kept tail adds a word; a dropped one keeps the digest it always had.
    let keep = (c.tail == Tail::Keep).then_some(u64::from_le_bytes(*b"tailkeep"));
    let words = words
        .into_iter()
        .chain(block.into_iter().flatten())
        .chain(keep);
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
            tail: Tail::Drop,
            progress: false,
            decode: None,
            tokens: None,
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
            tail: Tail::Drop,
            progress: false,
            decode: None,
            tokens: None,
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
}
