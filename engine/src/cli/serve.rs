//! `ringfeed serve`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::{bail, Result};

use crate::cli::say::say_err;
use crate::cli::serve_remote::CachedRemote;
use crate::loader::{signals, Loader, Plan, ServeConfig, ServeError};
use crate::manifest::{Manifest, ManifestOptions, ManifestOrigin};
use crate::metrics::http::METRICS_PATH;
use crate::metrics::MetricsServer;
use crate::reader::ReadError;
use crate::ring::outcome::{Outcome, OutcomeKind};
use crate::ring::segment::human_bytes;
use crate::source::ManifestCache;
use crate::source::OpenedSource;

pub use super::serve_args::*;

/// Without a shuffle every epoch drops the same tail, the last samples of
/// the manifest's order: they are never served in any whole epoch. Say so,
/// naming the first of them, so that it is a choice and not a surprise.
fn warn_of_a_fixed_tail(plan: &Plan, cfg: &ServeConfig) {
    let (n, step) = (plan.manifest().len(), plan.sampler().step_samples());
    let tail = n % step;
    // Only a run with a whole epoch after its start: a resumed epoch drops
    // its own tail, which is this one anyway, and says nothing more.
    if cfg.order.is_shuffled()
        || tail == 0
        || cfg
            .start
            .epoch
            .saturating_add(u64::from(cfg.start.samples_consumed > 0))
            >= cfg.epochs
    {
        return;
    }
    let first = n - tail;
    let loc = plan.manifest().sample(first);
    let at = match plan.manifest().record_bytes() {
        Some(_) => format!(
            "from record {first} on, byte {} of {}",
            loc.offset_bytes,
            plan.object_name(loc.file).display()
        ),
        None => format!("from {} on", plan.object_name(loc.file).display()),
    };
    let which = if tail == 1 {
        format!("sample {first}")
    } else {
        format!("samples {first} to {}", n - 1)
    };
    say_err!(
        "ringfeed: warning: with --no-shuffle every epoch drops the same last {tail} of the {n} samples ({which}, {at}), \
         so they are never served: a step takes world size × batch size = {step} samples and {n} is not a multiple of it. \
         Shuffle, or pick a batch size that makes the step divide {n}, if they should be trained on"
    );
}

/// Runs a loader until every batch was delivered and released. Returns the
/// exit code: 0, or 128 + signal when stopped by SIGINT, SIGTERM or SIGHUP.
///
/// Whatever the end, it leaves the loader's last word for trainers that
/// attach later (`ring::outcome`): they report it at once instead of waiting
/// out their timeout for a loader that is not coming.
pub fn run(args: &ServeArgs) -> Result<u8> {
    signals::unignore_stop_signals();
    let cfg = args.config()?;
    // A previous loader's word, or its segment if it died, is stale once a
    // new loader of the name starts: trainers now wait for this one.
    Outcome::remove(&cfg.name);
    if let Err(e) = crate::ring::Producer::remove_dead_segment(&cfg.name) {
        tracing::debug!("a dead loader's segment stays until the ring is made: {e}");
    }
    // A panic anywhere (any thread) still leaves the outcome, so trainers
    // fail at once with the message instead of waiting out their timeout.
    let name = cfg.name.clone();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        let message = format!("the loader panicked, a bug of ringfeed (please report it): {info}");
        let _ = Outcome::now(OutcomeKind::Failed, &crate::remote::scrub(&message)).write(&name);
    }));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_configured(args, cfg.clone())
    }))
    .unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("(no message)");
        Err(anyhow::anyhow!(
            "the loader panicked, a bug of ringfeed (please report it): {what}"
        ))
    });
    let outcome = match &result {
        Ok(0) => Outcome::now(OutcomeKind::Ended, "it served its whole run and exited"),
        Ok(code) => Outcome::now(
            OutcomeKind::Failed,
            &format!("it was stopped by signal {}", code.saturating_sub(128)),
        ),
        Err(e) => Outcome::now(
            OutcomeKind::Failed,
            &crate::remote::scrub(&format!("{e:#}")),
        ),
    };
    if let Err(e) = outcome.write(&cfg.name) {
        tracing::debug!("cannot leave the loader's outcome for its trainers: {e}");
    }
    result
}

/// The manifest to serve: `listed` itself, or, for tar shards (`--format
/// tar`, or every object a `.tar`), the manifest of their samples, indexed
/// through the index cache beside `cache`.
fn sample_manifest(
    args: &ServeArgs,
    source: &OpenedSource,
    listed: Manifest,
    cache: Option<&ManifestCache>,
) -> Result<Manifest> {
    let tar = match args.format {
        Some(format) => format == SampleFormat::Tar,
        None => args.record_bytes.is_none() && crate::tar::is_tar_listing(listed.files()),
    };
    if !tar {
        return Ok(listed);
    }
    if args.format.is_none() {
        say_err!(
            "ringfeed: every object is a .tar shard: serving WebDataset samples (consecutive members sharing a key); \
             --format files serves each .tar whole"
        );
    }
    let index_cache = cache.map(|c| crate::tar::IndexCache::beside(&c.dir));
    Ok(crate::tar::tar_manifest(
        source,
        &listed,
        index_cache.as_ref(),
    )?)
}

fn run_configured(args: &ServeArgs, cfg: ServeConfig) -> Result<u8> {
    args.check_before_listing(&cfg)?;
    // Bound before a listing that can take minutes, so that a taken port is
    // said at once; until the ring exists a scrape says "starting".
    let metrics = match &args.metrics {
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
    let listing = std::time::Instant::now();
    let cache = args.manifest_cache();
    let opts = ManifestOptions {
        record_bytes: cfg.record_bytes,
        threads: 0,
        progress: cfg.progress,
    };
    let relist = args.manifest_cache == CacheUse::Refresh;
    let source = cfg
        .source
        .open()?
        .follow_links_outside(args.follow_links_outside);
    if let OpenedSource::Remote(remote) = &source {
        crate::metrics::watch_remote(std::sync::Arc::clone(&remote.store().metrics));
    }
    let (manifest, mut origin) = match &cache {
        Some(cache) => {
            let (manifest, origin) = source.build_manifest_cached(&opts, cache, relist)?;
            (manifest, Some(origin))
        }
        None => (source.build_manifest(&opts)?, None),
    };
    let manifest = sample_manifest(args, &source, manifest, cache.as_ref())?;
    let mut plan = match (
        Plan::with_source(cfg.clone(), source.clone(), Arc::new(manifest)),
        &cache,
        &origin,
    ) {
        (Ok(plan), _, _) => plan,
        // A size the cache's checks could not see (past 4,096 files) may be
        // what failed: plan again over a fresh listing before reporting.
        // Sizes set the slot size, and with --record-bytes the number of
        // samples too.
        (Err(err), Some(cache), Some(ManifestOrigin::Cached { path, .. }))
            if cfg.record_bytes.is_some()
                || matches!(
                    err,
                    ServeError::SlotTooSmall { .. }
                        | ServeError::SlotSmallerThanBatch { .. }
                        | ServeError::Shape(_)
                ) =>
        {
            tracing::info!(
                "the manifest from the cache {} cannot be planned ({err}); listing {} again",
                path.display(),
                cfg.source
            );
            let (manifest, listed) = source.build_manifest_cached(&opts, cache, true)?;
            let manifest = sample_manifest(args, &source, manifest, Some(cache))?;
            origin = Some(listed);
            Plan::with_source(cfg.clone(), source.clone(), Arc::new(manifest))?
        }
        (Err(err), _, _) => return Err(err.into()),
    };
    let cached_remote = CachedRemote::of(&source, origin.as_ref(), cache.as_ref());
    let how = match &origin {
        Some(ManifestOrigin::Cached { .. }) if cached_remote.is_some() => cached_remote
            .as_ref()
            .map_or_else(String::new, |c| c.words(args.manifest_max_age)),
        Some(ManifestOrigin::Cached {
            path,
            dirs_checked,
            files_checked,
        }) => {
            let files = if *files_checked > 0 {
                format!(" and {files_checked} file sizes")
            } else {
                String::new()
            };
            format!(
                "from the cache {} ({dirs_checked} directories{files} unchanged)",
                path.display()
            )
        }
        Some(ManifestOrigin::Listed {
            path,
            cache_miss,
            not_stored,
        }) => {
            tracing::info!("manifest cache not used: {cache_miss}");
            match (path, not_stored) {
                (_, Some(why)) => format!("listed (not cached: {why})"),
                (Some(path), None) => format!("listed (cached in {})", path.display()),
                (None, None) => "listed".to_owned(),
            }
        }
        None => "listed (manifest cache off)".to_owned(),
    };
    say_err!(
        "ringfeed: manifest: {} samples in {} files ({}), {how}, planned in {:.2} s",
        plan.manifest().len(),
        plan.manifest().files().len(),
        human_bytes(plan.manifest().total_bytes()),
        listing.elapsed().as_secs_f64()
    );
    if plan.batches_per_rank() == 0 {
        // A trainer would wait for a loader that never appears.
        let start = cfg.start;
        let (n, step) = (plan.manifest().len() as u64, plan.sampler().step_samples());
        if start.epoch < cfg.epochs {
            // Inside the last epoch, with less than a step left: the tail
            // that every epoch drops.
            bail!(
                "nothing to serve: the run starts at epoch {}, {} samples consumed, and the {} samples left of that epoch \
                 are fewer than one step (world size × batch size = {step}), the tail every epoch drops; that is the end \
                 of a run of --epochs {}, so the run is complete and there is nothing to restart. To train on, raise \
                 --epochs and keep this --resume",
                start.epoch,
                start.samples_consumed,
                n.saturating_sub(start.samples_consumed),
                cfg.epochs
            );
        }
        bail!(
            "nothing to serve: the run starts at epoch {}, {} samples consumed, which is the end of a run of --epochs {}, \
             so the run is complete and there is nothing to restart. To train on, raise --epochs and keep this --resume",
            start.epoch,
            start.samples_consumed,
            cfg.epochs
        );
    }
    warn_of_a_fixed_tail(&plan, &cfg);
    let cache_stats = args.attach_data_cache(&mut plan);
    // From here on SIGINT/SIGTERM/SIGHUP only set a flag that the loader acts on,
    // so that it removes its segment and tells the trainers. Before, during
    // a listing that may take minutes, they end the process at once: there
    // is nothing to clean up yet.
    signals::install();
    let loader = Loader::start(plan)?;
    let relisting = cached_remote.and_then(CachedRemote::relist_in_background);
    if let Some(server) = &metrics {
        server.watch_ring(&cfg.name);
    }
    let layout = *loader.producer().layout();
    let plan = loader.plan();
    say_err!(
        "ringfeed: serving {} samples ({}) from {} as {:?} to {}: batch {}, {} batches per rank, {} slots/rank of {}, ring {} in /dev/shm/ringfeed-{}",
        plan.manifest().len(),
        human_bytes(plan.manifest().total_bytes()),
        cfg.source,
        cfg.name,
        ranks_words(cfg.world_size, plan.job()),
        cfg.batch_size,
        plan.batches_per_rank(),
        layout.geometry.slots_per_rank,
        human_bytes(layout.geometry.slot_payload_bytes),
        human_bytes(layout.segment_bytes),
        cfg.name,
    );
    match loader.run(&signals::STOP) {
        Ok(report) => {
            // A run served from a cached listing is done once that listing
            // is confirmed: a small dataset can be served before the
            // background re-list ends, from the data cache without a read
            // that would have seen the change.
            if let Some(relist) = relisting {
                if !relist.is_finished() {
                    say_err!("ringfeed: every batch served; waiting for the background re-list of {} to confirm the cached listing", cfg.source);
                }
                let _ = relist.join();
                if let Some(why) = signals::stop_reason() {
                    bail!("{why} (every batch had been served, from the cached listing: the trainers saw the dataset as it was when that listing was made)");
                }
            }
            let secs = report.elapsed.as_secs_f64();
            say_err!(
                "ringfeed: done: {} batches, {} samples, {} in {:.2} s ({:.2} GB/s, reader {})",
                report.batches,
                report.samples,
                human_bytes(report.bytes),
                secs,
                report.bytes as f64 / secs.max(1e-9) / 1e9,
                report.backend
            );
            if let Some(line) = crate::metrics::remote::summary_line() {
                say_err!("ringfeed: {line}");
            }
            // A cache that could not be opened said so at start.
            if let Some(stats) = cache_stats
                .as_ref()
                .filter(|s| s.opened.load(Ordering::Relaxed) > 0)
            {
                say_err!("ringfeed: {}", crate::cache::summary_line(stats));
            }
            Ok(0)
        }
        Err(ServeError::Signal(sig)) => {
            say_err!("ringfeed: stopped by signal {sig}: trainers were told (once they have taken what was published, next fails with \"stopped before the end of the run\"), segment removed");
            Ok(128u8.saturating_add(sig as u8))
        }
        Err(err)
            if matches!(
                err,
                ServeError::Read(
                    ReadError::Vanished { .. }
                        | ReadError::ChangedSize { .. }
                        | ReadError::Grew { .. }
                        | ReadError::SizeAtOpen { .. }
                        | ReadError::NotRegular { .. }
                )
            ) || matches!(
                (&err, &origin),
                (
                    // A remote object that changed (412) or went (404), or
                    // one larger than its listing said: a cached listing may
                    // be what is stale. A refused credential (403), a server
                    // that failed or a stall says nothing of the listing.
                    ServeError::SampleTooLarge { .. },
                    Some(ManifestOrigin::Cached { .. })
                )
            ) || matches!(
                (&err, &origin),
                (ServeError::Read(ReadError::Remote { cause, .. }), Some(ManifestOrigin::Cached { .. }))
                    if cause.says_the_listing_is_stale()
            ) =>
        {
            // A file changed since it was listed (or, from the cache, may
            // have): the cached manifest, if this run used or wrote one, is
            // stale, so the next start lists.
            let Some(file) = origin.as_ref().and_then(ManifestOrigin::cache_file) else {
                return Err(err.into());
            };
            let came = if matches!(origin, Some(ManifestOrigin::Cached { .. })) {
                "came from"
            } else {
                "was stored in"
            };
            match ManifestCache::forget_file(file) {
                Ok(true) => bail!("{err}; this run's manifest {came} the cache {}, which is now removed, so the next start lists the dataset again", file.display()),
                Ok(false) => Err(err.into()),
                Err(rm) => bail!(
                    "{err}; this run's manifest {came} the cache {}, which cannot be removed ({rm}): remove it, or start the next run with --manifest-cache refresh",
                    file.display()
                ),
            }
        }
        Err(e) => Err(e.into()),
    }
}
