//! A token run's plan (`serve --seq-len L`, docs/tokens.md): every
//! `--source` opened and its index read into a corpus (`crate::tokens`),
//! the corpora end to end as the manifest's windows, their mixture (with
//! `--weights`, several sources or `--samples-per-epoch`), the readers of
//! each corpus's place (one engine, or one per place behind a router), and
//! the ring's token format: windows of `L + 1` tokens, then each window's
//! document starts.

use std::path::PathBuf;
use std::sync::Arc;

use super::stack::{ReadTarget, RemoteTarget};
use super::token_run::TokenRun;
use super::{DataCachePolicy, JobConfig, Plan, PlanError, ServeConfig};
use crate::cache::{CacheConfig, CacheStats};
use crate::manifest::{FileList, Manifest, ObjectNames, Windows};
use crate::reader::chunked::ChunkConfig;
use crate::reader::FileTable;
use crate::remote::FetchConfig;
use crate::ring::layout::{Job, RunStart, TokenFormat, MAX_DOC_STARTS};
use crate::ring::{Layout, RingGeometry};
use crate::sampler::{Mixture, SampleOrder, Sampler, SamplerConfig};
use crate::say::say_err;
use crate::tokens::access::Access;
use crate::tokens::open::DataLocation;
use crate::tokens::Corpus;
use crate::tokens::{open_corpus, OpenedCorpus, TokenError, TokenOptions, TokenSet};

/// Names a token run's objects: their keys are their names already.
struct Named(String);

impl ObjectNames for Named {
    fn source_name(&self) -> PathBuf {
        PathBuf::from(&self.0)
    }
    fn object_name(&self, key: &[u8]) -> PathBuf {
        PathBuf::from(String::from_utf8_lossy(key).into_owned())
    }
}

/// Opens every corpus of `job` and plans the run.
pub(super) fn plan_tokens(job: &JobConfig) -> Result<Plan, PlanError> {
    let cfg = &job.serve;
    let t = cfg
        .tokens
        .as_ref()
        .ok_or_else(|| PlanError::Shape("not a token run".into()))?;
    let opts = TokenOptions {
        seq_len: t.seq_len,
        dtype: t.dtype,
        eos: t.eos,
        keep_dir: t.keep_dir.clone(),
        manifest_cache: job.listing.cache.clone(),
        refresh: job.listing.refresh,
        follow_links_outside: job.listing.follow_links_outside,
        progress: cfg.progress,
    };
    let opened = open_all(&t.corpora, &opts)?;
    let dtype = opened[0].corpus.dtype();
    let target = read_target(job, &opened)?;
    let first_access = opened[0].access.clone();
    let mut files = FileList::new();
    let mut names = Vec::new();
    let mut per_corpus = Vec::with_capacity(opened.len());
    let mut corpora = Vec::with_capacity(opened.len());
    for o in opened {
        per_corpus.push(o.names.len() as u32);
        for (name, &size) in o.names.iter().zip(&o.sizes) {
            files.push(name.as_bytes(), size);
        }
        names.extend(o.names);
        corpora.push(o.corpus);
    }
    let set = Arc::new(TokenSet::new(corpora, &per_corpus));
    let manifest = Manifest::from_windows(
        files,
        Arc::clone(&set) as Arc<dyn Windows>,
        &Named(cfg.source.to_string()),
    )?;
    let mixture = if t.mixes() {
        let sizes: Vec<u64> = set.corpora().iter().map(|c| c.windows()).collect();
        let bases: Vec<u64> = (0..sizes.len()).map(|c| set.first_window(c)).collect();
        Some(Arc::new(Mixture::new(
            t.weights.as_deref(),
            &sizes,
            &bases,
            t.samples_per_epoch,
            cfg.order,
            cfg.seed,
        )?))
    } else {
        None
    };
    let mut format = TokenFormat::plan(
        dtype.typestr(),
        t.seq_len,
        dtype.item_bytes(),
        cfg.batch_size,
        t.doc_starts_max,
    )
    .ok_or_else(|| PlanError::Shape(format!("windows of --seq-len {} + 1 tokens of {dtype}, {} a batch, are more bytes than a slot can hold", t.seq_len, cfg.batch_size)))?;
    format.eos_token = t.eos;
    format.corpora = set.corpora().len() as u32;
    let run = TokenRun {
        set,
        mixture,
        format,
        names,
        overflow_said: Default::default(),
    };
    let source = match first_access {
        Access::Local(l) => crate::source::OpenedSource::Local(l),
        Access::Remote(r) => crate::source::OpenedSource::Remote(r),
    };
    Plan::with_tokens(cfg.clone(), source, Arc::new(manifest), target, run)
}

/// Opens every corpus, saying what each holds; they must share a dtype.
fn open_all(
    specs: &[crate::tokens::CorpusSpec],
    opts: &TokenOptions,
) -> Result<Vec<OpenedCorpus>, PlanError> {
    let mut opened = Vec::with_capacity(specs.len());
    for spec in specs {
        let started = std::time::Instant::now();
        let o = open_corpus(spec, opts)?;
        let c = &o.corpus;
        say_err!(
            "ringfeed: tokens: {} ({}): {} documents, {} tokens of {} in {} part(s), {} windows of {} + 1, read in {:.2} s",
            c.name(),
            o.format.name(),
            c.docs(),
            c.tokens(),
            c.dtype(),
            c.parts().len(),
            c.windows(),
            c.seq_len(),
            started.elapsed().as_secs_f64()
        );
        opened.push(o);
    }
    let dtype = opened[0].corpus.dtype();
    if let Some(other) = opened.iter().find(|o| o.corpus.dtype() != dtype) {
        return Err(TokenError::Mixture(format!(
            "{} holds {} tokens and {} holds {dtype}: the corpora of one run share a token dtype (one slot array); convert one of them",
            other.corpus.name(),
            other.corpus.dtype(),
            opened[0].corpus.name()
        ))
        .into());
    }
    Ok(opened)
}

/// The readers of `opened`'s data: one file table over every local corpus
/// (absolute paths), one remote target per remote corpus (each with the
/// data cache), routed by object index when there are several.
fn read_target(job: &JobConfig, opened: &[OpenedCorpus]) -> Result<ReadTarget, PlanError> {
    let stats = Arc::new(CacheStats::default());
    let mut routes: Vec<(u32, ReadTarget)> = Vec::new();
    let mut local_paths: Vec<PathBuf> = Vec::new();
    let mut local_sizes: Vec<u64> = Vec::new();
    let mut local_first: Option<u32> = None;
    let mut next = 0u32;
    let flush = |routes: &mut Vec<(u32, ReadTarget)>,
                 paths: &mut Vec<PathBuf>,
                 sizes: &mut Vec<u64>,
                 first: &mut Option<u32>|
     -> Result<(), PlanError> {
        if let Some(f) = first.take() {
            let table = FileTable::new(std::mem::take(paths), std::mem::take(sizes), true)?;
            routes.push((f, ReadTarget::Files(Arc::new(table))));
        }
        Ok(())
    };
    for o in opened {
        match &o.data {
            DataLocation::Local(paths) => {
                local_first.get_or_insert(next);
                local_paths.extend(paths.iter().cloned());
                local_sizes.extend(o.sizes.iter().copied());
            }
            DataLocation::Remote { source, objects } => {
                flush(
                    &mut routes,
                    &mut local_paths,
                    &mut local_sizes,
                    &mut local_first,
                )?;
                crate::metrics::watch_remote(Arc::clone(&source.store().metrics));
                routes.push((
                    next,
                    ReadTarget::Remote(Box::new(RemoteTarget {
                        runtime: Arc::clone(source.runtime()),
                        store: source.store().clone(),
                        objects: Arc::new(objects.clone()),
                        fetch: FetchConfig::default(),
                        cache: data_cache(job, &stats),
                        chunk: block_chunks(&o.corpus, job.serve.order),
                    })),
                ));
            }
        }
        next += o.names.len() as u32;
    }
    flush(
        &mut routes,
        &mut local_paths,
        &mut local_sizes,
        &mut local_first,
    )?;
    Ok(if routes.len() == 1 {
        routes.remove(0).1
    } else {
        ReadTarget::Routed(routes)
    })
}

/// Under the block order, a remote corpus's windows are read through the
/// chunk layer: one chunk per block of windows (from its first window's
/// first byte, a token into the next block, since windows overlap by one),
/// so a window of blocks is a few ranged GETs, which the data cache keeps
/// as entries of their own; each object's start is a chunk point too, for
/// the tail of a window that runs into it. None under the other orders:
/// each window is then a GET of its own.
fn block_chunks(corpus: &Corpus, order: SampleOrder) -> Option<ChunkConfig> {
    use crate::reader::chunked::{ChunkGeometry, CHUNK_BYTES_MAX};
    let shape = order.block_shape()?;
    let block = u64::from(shape.block_samples());
    let item = corpus.dtype().item_bytes();
    let (mut parts, mut starts_scratch) = (Vec::new(), Vec::new());
    let mut starts: Vec<(u32, u64)> = corpus.parts().iter().map(|p| (p.object, 0)).collect();
    let mut j = 0;
    while j < corpus.windows() {
        parts.clear();
        starts_scratch.clear();
        corpus.window(j, 0, &mut parts, &mut starts_scratch);
        let first = parts.iter().find_map(|p| match *p {
            crate::manifest::WindowPart::Read {
                object,
                offset_bytes,
                ..
            } => Some((object, offset_bytes)),
            crate::manifest::WindowPart::Token(_) => None,
        });
        starts.extend(first);
        j += block;
    }
    starts.sort_unstable();
    starts.dedup();
    let block_bytes = (block * corpus.seq_len() + 1).saturating_mul(item);
    let budget = (4 * u64::from(shape.window_blocks()) * block_bytes.min(CHUNK_BYTES_MAX)).clamp(
        super::chunks::CHUNK_BUDGET_BYTES_MIN,
        super::chunks::CHUNK_BUDGET_BYTES_MAX,
    );
    Some(ChunkConfig {
        geometry: ChunkGeometry::Overlapping {
            starts: starts.into(),
            tail_bytes: item,
        },
        small_read_max: CHUNK_BYTES_MAX,
        budget_bytes: budget,
    })
}

/// The data cache `job` asks for in front of a remote corpus, its counters
/// shared by every corpus of the run.
fn data_cache(job: &JobConfig, stats: &Arc<CacheStats>) -> Option<CacheConfig> {
    let DataCachePolicy::On {
        root: Some(root),
        size,
        ..
    } = &job.data_cache
    else {
        return None;
    };
    crate::metrics::watch_cache(Arc::clone(stats));
    Some(CacheConfig {
        root: root.clone(),
        size: *size,
        stats: Arc::clone(stats),
    })
}

/// Whether any remote target of `t` reads through the chunk layer.
fn chunked_target(t: &ReadTarget) -> bool {
    match t {
        ReadTarget::Remote(r) => r.chunk.is_some(),
        ReadTarget::Files(_) => false,
        ReadTarget::Routed(routes) => routes.iter().any(|(_, t)| chunked_target(t)),
    }
}

/// Slots per rank by default: the loader's rule (`slots.rs`), raised for a
/// chunked run to a lookahead of windows of blocks (as `chunks.rs` does),
/// never past the batches a rank gets (nor below 2), fitted to the room in
/// /dev/shm.
fn auto_slots(
    cfg: &ServeConfig,
    payload_bytes: u64,
    batches_per_rank: u64,
    chunked: bool,
    bare: RingGeometry,
) -> u32 {
    let k =
        super::slots::auto_slots_per_rank(cfg.batch_size, cfg.reader.queue_depth, payload_bytes);
    let k = match (chunked, cfg.order.block_shape()) {
        (true, Some(shape)) => {
            let window = u64::from(shape.block_samples()) * u64::from(shape.window_blocks());
            let want =
                (super::chunks::LOOKAHEAD_WINDOWS * window).div_ceil(u64::from(cfg.batch_size));
            let fit = super::slots::AUTO_RANK_BYTES_MAX / payload_bytes.max(1);
            let most = u64::from(crate::ring::layout::MAX_SLOTS_PER_RANK);
            k.max(want.min(fit).min(most) as u32)
        }
        _ => k,
    };
    let k = u32::try_from(batches_per_rank.max(2)).map_or(k, |most| k.min(most));
    let room = crate::ring::segment::shm_room_for(&cfg.name).map(|room| room.left());
    super::slots::fit_auto_slots(
        RingGeometry {
            slots_per_rank: k,
            ..bare
        },
        room,
    )
}

impl Plan {
    /// Plans a token run: its sampler (over the mixture's positions, or
    /// the windows), its slots (`B` windows, then their document starts),
    /// and the ring's shape.
    fn with_tokens(
        cfg: ServeConfig,
        source: crate::source::OpenedSource,
        manifest: Arc<Manifest>,
        target: ReadTarget,
        run: TokenRun,
    ) -> Result<Plan, PlanError> {
        cfg.check_ring_flags()?;
        if let Some(b) = cfg.slot_bytes {
            return Err(PlanError::Shape(format!("--slot-bytes {b}: a token run's slot is its batch of windows and their document starts, sized from --seq-len and --batch-size; leave it out")));
        }
        if run.format.doc_starts_max > MAX_DOC_STARTS {
            return Err(PlanError::Shape(format!(
                "--max-doc-starts {} is above the limit of {MAX_DOC_STARTS}",
                run.format.doc_starts_max
            )));
        }
        let (n_samples, order) = match &run.mixture {
            Some(m) => (m.samples_per_epoch(), SampleOrder::None),
            None => (manifest.len(), cfg.order),
        };
        let sampler = Sampler::new(SamplerConfig {
            n_samples,
            batch_size: cfg.batch_size,
            world_size: cfg.job.job_world_size,
            seed: cfg.seed,
            order,
            epochs: cfg.epochs,
            start: cfg.start,
            tail: cfg.tail,
        })?;
        let slot_bytes = manifest.largest_samples_total_bytes(cfg.batch_size as usize);
        let payload_bytes = run.format.batch_bytes(cfg.batch_size);
        let batches_per_rank = sampler.total_steps().unwrap_or(u64::MAX);
        let bare = RingGeometry {
            world_size: cfg.world_size,
            slots_per_rank: 0,
            max_samples_per_slot: cfg.batch_size,
            slot_payload_bytes: payload_bytes,
        };
        let slots_per_rank = cfg.slots_per_rank.unwrap_or_else(|| {
            auto_slots(
                &cfg,
                payload_bytes,
                batches_per_rank,
                chunked_target(&target),
                bare,
            )
        });
        let geometry = RingGeometry {
            slots_per_rank,
            ..bare
        };
        if let Err(e) = Layout::compute(geometry) {
            return Err(PlanError::Shape(format!(
                "{e} (a slot of {} windows of {} bytes and their document starts)",
                cfg.batch_size,
                manifest.max_sample_bytes()
            )));
        }
        let mut digest = super::plan::plan_digest(&cfg, &manifest);
        if let Some(m) = &run.mixture {
            let words = [m.samples_per_epoch()]
                .into_iter()
                .chain(m.weights().iter().copied());
            digest = crate::manifest::digest_words(digest, words).max(1);
        }
        let job = Job {
            plan_digest: digest,
            start: Some(RunStart {
                epoch: cfg.start.epoch,
                samples_consumed: cfg.start.samples_consumed,
                dataset_samples: n_samples,
            }),
            order: Some(super::plan::run_order(&cfg)),
            tokens: Some(run.format),
            tail: cfg.tail,
            ..cfg.job
        };
        Ok(Plan {
            derived_slot_bytes: slot_bytes,
            slot_bytes,
            slots_per_rank,
            geometry,
            decode: None,
            target,
            job,
            sampler,
            manifest,
            source,
            cfg,
            tokens: Some(Arc::new(run)),
        })
    }
}
