//! The one door: [`build`] turns a checked [`JobConfig`] into a running
//! ring, entering each stage of the data path once and in its order
//! (source → listing → manifest or tar index → sampler → slots → reader
//! stack → ring); [`Built::finish`] runs it and applies the after-run
//! policy. `serve` and `demo` both come through here.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::relisting::{CachedRemote, Relisting};
use super::said;
use super::{
    signals, DataCachePolicy, JobConfig, Loader, Plan, PlanError, RunError, SampleFormat,
    ServeReport, StartError, StopToken,
};
use crate::cache::{CacheConfig, CacheStats};
use crate::manifest::{Manifest, ManifestError, ManifestOptions, ManifestOrigin};
use crate::metrics::http::{BindError, METRICS_PATH};
use crate::metrics::MetricsServer;
use crate::say::say_err;
use crate::source::published::{self, Published, PublishedError, Publishing};
use crate::source::{ManifestCache, OpenedSource};

/// Why a job could not be built (nothing was served).
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The metrics address cannot be served.
    #[error(transparent)]
    Metrics(#[from] BindError),
    /// The source cannot be opened, listed or indexed.
    #[error(transparent)]
    Listing(#[from] ManifestError),
    /// The job's published manifest cannot be had (node 0's, or publishing it).
    #[error(transparent)]
    Published(#[from] PublishedError),
    /// The run cannot be planned.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The run starts at its end: there is nothing to serve.
    #[error("{0}")]
    NothingToServe(String),
    /// The ring cannot be made, or its reader opened.
    #[error(transparent)]
    Start(#[from] StartError),
}

/// Why a run that was built did not end well.
#[derive(Debug, thiserror::Error)]
pub enum FinishError {
    /// The run failed or was stopped.
    #[error(transparent)]
    Run(Box<RunError>),
    /// The run failed in a way that proves its cached listing stale, which
    /// is now removed.
    #[error("{run}; this run's manifest {came} the cache {}, which is now removed, so the next start lists the dataset again", path.display())]
    ListingForgotten {
        /// What failed.
        run: Box<RunError>,
        /// "came from" or "was stored in".
        came: &'static str,
        /// The cache file.
        path: PathBuf,
    },
    /// As `ListingForgotten`, but the file could not be removed.
    #[error("{run}; this run's manifest {came} the cache {}, which cannot be removed ({rm}): remove it, or start the next run with --manifest-cache refresh", path.display())]
    ListingNotRemoved {
        /// What failed.
        run: Box<RunError>,
        /// "came from" or "was stored in".
        came: &'static str,
        /// The cache file.
        path: PathBuf,
        /// Why it stays.
        rm: io::Error,
    },
    /// Every batch was served, but the background re-list found the
    /// source changed.
    #[error("{0} (every batch had been served, from the cached listing: the trainers saw the dataset as it was when that listing was made)")]
    ChangedAfterServing(String),
}

impl FinishError {
    /// Whether the run stopped because no trainer was attached for
    /// `--idle-timeout`.
    pub fn is_idle(&self) -> bool {
        matches!(self, FinishError::Run(run) if matches!(**run, RunError::Idle { .. }))
    }

    /// The signal that stopped the run, if one did.
    pub fn signal(&self) -> Option<u32> {
        match self {
            FinishError::Run(run) => match **run {
                RunError::Signal(sig) => Some(sig),
                _ => None,
            },
            _ => None,
        }
    }
}

/// A job built and serving: its ring exists and trainers may attach.
pub struct Built {
    loader: Loader,
    /// Kept for the run: the server stops when it is dropped.
    _metrics: Option<MetricsServer>,
    origin: Option<ManifestOrigin>,
    relisting: Option<Relisting>,
    cache_stats: Option<Arc<CacheStats>>,
    source: String,
    /// The job's published manifest this run serves, if any.
    published: Option<Arc<Published>>,
}

/// The job's published manifest, as `plan` found it.
#[derive(Default)]
struct Shared {
    published: Option<Arc<Published>>,
    /// The manifest line's words for it.
    words: Option<String>,
}

/// What a run that ended well did.
pub struct Finished {
    /// The loader's report.
    pub report: ServeReport,
    /// The data cache's counters, if one was opened.
    pub cache_stats: Option<Arc<CacheStats>>,
}

/// Builds `job`: every stage once, in data-path order. `stop` is the run's
/// token; when it listens to signals, their handlers are installed just
/// before the ring is made (until then a signal ends the process at once:
/// there is nothing to clean up).
pub fn build(job: &JobConfig, stop: &StopToken) -> Result<Built, BuildError> {
    let cfg = &job.serve;
    // Bound before a listing that can take minutes, so that a taken port is
    // said at once; until the ring exists a scrape says "starting".
    let metrics = match &job.metrics {
        Some(addr) => {
            let server = MetricsServer::start(addr, &cfg.name)?;
            say_err!(
                "ringfeed: metrics at http://{}{METRICS_PATH}",
                server.local_addr()
            );
            Some(server)
        }
        None => None,
    };
    let started = Instant::now();
    let (plan, origin, cached_remote, cache_stats, shared) = if cfg.tokens.is_some() {
        // A token run opens each of its sources itself (a Megatron PREFIX
        // or one file is no directory), through the same listing cache.
        let plan = super::tokens::plan_tokens(job)?;
        let stats = plan.cache_stats().cloned();
        let shared = Shared {
            published: None,
            words: Some("windows of the corpora's documents".to_owned()),
        };
        (plan, None, None, stats, shared)
    } else {
        let source = cfg
            .source
            .open()?
            .follow_links_outside(job.listing.follow_links_outside);
        if let OpenedSource::Remote(remote) = &source {
            crate::metrics::watch_remote(Arc::clone(&remote.store().metrics));
        }
        let data_cache = data_cache(job, &source);
        let (plan, origin, shared) = plan(job, &source, data_cache.clone())?;
        let cached_remote = CachedRemote::of(&source, origin.as_ref(), job.listing.cache.as_ref())
            .map(|c| c.published(shared.published.clone()));
        (
            plan,
            origin,
            cached_remote,
            data_cache.map(|c| c.stats),
            shared,
        )
    };
    // A token run: each corpus said where its listing and index came from.
    let how = match (&shared.words, &origin) {
        (Some(words), Some(_)) => format!(
            "{}; {words}",
            said::origin_words(origin.as_ref(), cached_remote.as_ref(), job)
        ),
        (Some(words), None) => words.clone(),
        (None, _) => said::origin_words(origin.as_ref(), cached_remote.as_ref(), job),
    };
    say_err!(
        "ringfeed: manifest: {} samples in {} files ({}), {how}, planned in {:.2} s",
        plan.manifest().len(),
        plan.manifest().files().len(),
        crate::ring::segment::human_bytes(plan.manifest().total_bytes()),
        started.elapsed().as_secs_f64()
    );
    if plan.batches_per_rank() == 0 {
        // A trainer would wait for a loader that never appears.
        return Err(BuildError::NothingToServe(said::nothing_to_serve(
            &plan, cfg,
        )));
    }
    said::warn_of_a_fixed_tail(&plan, cfg);
    if stop.listens_to_signals() {
        // From here on SIGINT/SIGTERM/SIGHUP only set a flag that the loader
        // acts on, so that it removes its segment and tells the trainers.
        signals::install();
    }
    let mut loader = Loader::start(plan)?;
    loader.set_idle_timeout(job.idle_timeout);
    let relisting = cached_remote.and_then(|c| c.relist_in_background(stop));
    if let Some(server) = &metrics {
        server.watch_ring(&cfg.name);
    }
    said::serving_line(&loader, cfg);
    Ok(Built {
        loader,
        _metrics: metrics,
        origin,
        relisting,
        cache_stats,
        source: cfg.source.to_string(),
        published: shared.published,
    })
}

/// The data cache `job` asks for in front of `source`'s reads (said when
/// off); None for a local source, which is read in place.
fn data_cache(job: &JobConfig, source: &OpenedSource) -> Option<CacheConfig> {
    let DataCachePolicy::On {
        root,
        size,
        size_given,
    } = &job.data_cache
    else {
        if matches!(source, OpenedSource::Remote(_)) {
            say_err!(
                "ringfeed: data cache off (--cache off): every epoch reads from {}",
                job.serve.source
            );
        }
        return None;
    };
    if let OpenedSource::Local(_) = source {
        if *size_given {
            tracing::warn!(
                "--cache-size is ignored: {} is a local directory, read in place and never cached",
                job.serve.source
            );
        }
        return None;
    }
    let Some(root) = root else {
        tracing::warn!("no data cache: neither RINGFEED_CACHE_DIR, XDG_CACHE_HOME nor HOME is set (pass --cache-dir)");
        return None;
    };
    let stats = Arc::new(CacheStats::default());
    crate::metrics::watch_cache(Arc::clone(&stats));
    Some(CacheConfig {
        root: root.clone(),
        size: *size,
        stats,
    })
}

/// Lists `source` (through the manifest cache, if on), indexes tar shards,
/// and plans the run. A plan that a cached listing's sizes may have failed
/// (past 4,096 files the cache's checks cannot see every size) is made
/// again over a fresh listing before the error is reported.
fn plan(
    job: &JobConfig,
    source: &OpenedSource,
    data_cache: Option<CacheConfig>,
) -> Result<(Plan, Option<ManifestOrigin>, Shared), BuildError> {
    let cfg = &job.serve;
    let cache = job.listing.cache.as_ref();
    let opts = ManifestOptions {
        record_bytes: cfg.record_bytes,
        threads: 0,
        progress: cfg.progress,
    };
    let shared = std::cell::RefCell::new(Shared::default());
    let list = |refresh: bool| -> Result<(Manifest, Option<ManifestOrigin>), BuildError> {
        if let (Some(p), OpenedSource::Remote(remote)) = (&job.listing.publishing, source) {
            let p = Publishing {
                refresh: p.refresh || refresh,
                ..p.clone()
            };
            let got = published::obtain(remote, &opts, cache, &p)?;
            *shared.borrow_mut() = Shared {
                published: got.published,
                words: got.words,
            };
            return Ok((
                sample_manifest(job, source, got.manifest, cache)?,
                got.origin,
            ));
        }
        let (listed, origin) = match cache {
            Some(cache) => {
                let (m, origin) = source.build_manifest_cached(&opts, cache, refresh)?;
                (m, Some(origin))
            }
            None => (source.build_manifest(&opts)?, None),
        };
        Ok((sample_manifest(job, source, listed, cache)?, origin))
    };
    let (manifest, origin) = list(job.listing.refresh)?;
    let planned = Plan::with_source(
        cfg.clone(),
        source.clone(),
        Arc::new(manifest),
        data_cache.clone(),
    );
    match (planned, &origin) {
        (Ok(plan), _) => Ok((plan, origin, shared.into_inner())),
        (Err(err), Some(ManifestOrigin::Cached { path, .. }))
            if cfg.record_bytes.is_some() || err.depends_on_sizes() =>
        {
            tracing::info!(
                "the manifest from the cache {} cannot be planned ({err}); listing {} again",
                path.display(),
                cfg.source
            );
            let (manifest, origin) = list(true)?;
            let plan =
                Plan::with_source(cfg.clone(), source.clone(), Arc::new(manifest), data_cache)?;
            Ok((plan, origin, shared.into_inner()))
        }
        (Err(err), _) => Err(err.into()),
    }
}

/// The manifest to serve: `listed` itself, or, for tar shards (`--format
/// tar`, or every object a `.tar`), the manifest of their samples, indexed
/// through the index cache beside `cache`.
fn sample_manifest(
    job: &JobConfig,
    source: &OpenedSource,
    listed: Manifest,
    cache: Option<&ManifestCache>,
) -> Result<Manifest, ManifestError> {
    let tar = match job.format {
        SampleFormat::Tar => true,
        SampleFormat::Auto => {
            job.serve.record_bytes.is_none() && crate::tar::is_tar_listing(listed.files())
        }
        SampleFormat::Files | SampleFormat::Records => false,
    };
    if !tar {
        return Ok(listed);
    }
    if job.format == SampleFormat::Auto {
        say_err!(
            "ringfeed: every object is a .tar shard: serving WebDataset samples (consecutive members sharing a key); \
             --format files serves each .tar whole"
        );
    }
    let index_cache = cache.map(|c| crate::tar::IndexCache::beside(&c.dir));
    crate::tar::tar_manifest(source, &listed, index_cache.as_ref())
}

impl Built {
    /// The loader (its ring, its plan).
    pub fn loader(&self) -> &Loader {
        &self.loader
    }

    /// Serves the run to its end, then applies the after-run policy: a run
    /// served from a cached listing is done once a background re-list
    /// confirmed it; a failure that proves the listing stale (a 404 or a
    /// 412, a local file changed) forgets its cache file, and nothing else
    /// does.
    pub fn finish(self, stop: &StopToken) -> Result<Finished, FinishError> {
        let Built {
            loader,
            _metrics,
            origin,
            relisting,
            cache_stats,
            source,
            published,
        } = self;
        match loader.run(stop) {
            Ok(report) => {
                // A small dataset can be served before the re-list ends,
                // from the data cache without a read that would have seen
                // the change.
                if let Some(relisting) = relisting {
                    if !relisting.handle.is_finished() {
                        say_err!("ringfeed: every batch served; waiting for the background re-list of {source} to confirm the cached listing");
                    }
                    let _ = relisting.handle.join();
                    if let Some(why) = stop.reason() {
                        return Err(FinishError::ChangedAfterServing(why));
                    }
                }
                Ok(Finished {
                    report,
                    cache_stats,
                })
            }
            Err(run) => Err(forget_if_stale(
                run,
                origin.as_ref(),
                relisting.as_ref(),
                published.as_deref(),
            )),
        }
    }
}

/// The error `run` ends the job with, after forgetting the cached listing
/// it proves stale.
fn forget_if_stale(
    run: RunError,
    origin: Option<&ManifestOrigin>,
    relisting: Option<&Relisting>,
    published: Option<&Published>,
) -> FinishError {
    let cached = matches!(origin, Some(ManifestOrigin::Cached { .. }));
    if let Some(published) = published {
        // A listing a node proved stale is not the job's to share any more.
        if run.says_the_listing_is_stale(true) {
            say_err!(
                "ringfeed: the job's manifest {} is stale: {}",
                published.describe(),
                published.withdraw()
            );
        }
    }
    let run = Box::new(run);
    let Some(path) = origin.and_then(ManifestOrigin::cache_file) else {
        return FinishError::Run(run);
    };
    if !run.says_the_listing_is_stale(cached) {
        return FinishError::Run(run);
    }
    let came = if cached { "came from" } else { "was stored in" };
    // Through the re-list's entry when one runs: it then never writes the
    // file back.
    let forgot = match relisting {
        Some(relisting) => relisting.entry.forget(),
        None => ManifestCache::forget_file(path),
    };
    let path = path.to_path_buf();
    match forgot {
        Ok(true) => FinishError::ListingForgotten { run, came, path },
        Ok(false) => FinishError::Run(run),
        Err(rm) => FinishError::ListingNotRemoved {
            run,
            came,
            path,
            rm,
        },
    }
}
