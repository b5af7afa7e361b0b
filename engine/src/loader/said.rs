//! What building a job says: where the manifest came from, the tail a
//! fixed order drops, why there is nothing to serve, and what is served.

use super::relisting::CachedRemote;
use super::{JobConfig, Loader, Plan, ServeConfig};
use crate::manifest::ManifestOrigin;
use crate::ring::layout::Job;
use crate::ring::segment::human_bytes;
use crate::say::say_err;

/// How the manifest line says where the manifest came from.
pub(super) fn origin_words(
    origin: Option<&ManifestOrigin>,
    cached_remote: Option<&CachedRemote>,
    job: &JobConfig,
) -> String {
    match origin {
        Some(ManifestOrigin::Cached { .. }) if cached_remote.is_some() => {
            let max_age = job
                .listing
                .cache
                .as_ref()
                .map(|c| c.remote_max_age)
                .unwrap_or_default();
            cached_remote.map_or_else(String::new, |c| c.words(max_age))
        }
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
    }
}

/// Why a plan with no batch per rank has nothing to serve, and the fix.
pub(super) fn nothing_to_serve(plan: &Plan, cfg: &ServeConfig) -> String {
    let start = cfg.start;
    let (n, step) = (plan.manifest().len(), plan.sampler().step_samples());
    if start.epoch < cfg.epochs && cfg.tail == crate::sampler::Tail::Keep {
        // Inside the last epoch, with no sample left of it.
        return format!(
            "nothing to serve: the run starts at epoch {}, {} samples consumed, every sample of that epoch, the last \
             of a run of --epochs {}, so the run is complete and there is nothing to restart. To go on, raise \
             --epochs and keep this --resume",
            start.epoch, start.samples_consumed, cfg.epochs
        );
    }
    if start.epoch < cfg.epochs {
        // Inside the last epoch, with less than a step left: the tail
        // that every epoch drops.
        return format!(
            "nothing to serve: the run starts at epoch {}, {} samples consumed, and the {} samples left of that epoch \
             are fewer than one step (world size × batch size = {step}), the tail every epoch drops (--tail drop); that is the end \
             of a run of --epochs {}, so the run is complete and there is nothing to restart. To train on, raise \
             --epochs and keep this --resume",
            start.epoch,
            start.samples_consumed,
            n.saturating_sub(start.samples_consumed),
            cfg.epochs
        );
    }
    format!(
        "nothing to serve: the run starts at epoch {}, {} samples consumed, which is the end of a run of --epochs {}, \
         so the run is complete and there is nothing to restart. To train on, raise --epochs and keep this --resume",
        start.epoch, start.samples_consumed, cfg.epochs
    )
}

/// What a dropped tail leaves out of every whole epoch, said once at start
/// when it leaves any out, with `--tail keep` as the way to serve it. Under
/// a shuffle the samples left out change every epoch (a line for the
/// record); without one every epoch drops the same last samples of the
/// manifest's order, so they are never served: a warning naming the first
/// of them, so that it is a choice and not a surprise.
pub(super) fn warn_of_a_fixed_tail(plan: &Plan, cfg: &ServeConfig) {
    let (n, step) = (plan.manifest().len(), plan.sampler().step_samples());
    let tail = plan.sampler().samples_dropped_per_epoch();
    // Only a run with a whole epoch after its start: a resumed epoch drops
    // its own tail, which is this one anyway, and says nothing more.
    if tail == 0
        || cfg
            .start
            .epoch
            .saturating_add(u64::from(cfg.start.samples_consumed > 0))
            >= cfg.epochs
    {
        return;
    }
    if cfg.order.is_shuffled() {
        say_err!(
            "ringfeed: each epoch serves {} of the {n} samples in {} steps and leaves out {tail}, a different {tail} every epoch \
             (a step takes world size × batch size = {step} samples, and the tail shorter than a step is dropped); \
             --tail keep serves every sample once an epoch, in short last batches (for evaluation)",
            n - tail,
            plan.sampler().steps_per_epoch()
        );
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
         Shuffle, pick a batch size that makes the step divide {n}, or pass --tail keep (every sample once an epoch, \
         in short last batches), if they should be trained on"
    );
}

/// The line that says the ring is up: what is served, to whom, in what.
pub(super) fn serving_line(loader: &Loader, cfg: &ServeConfig) {
    let layout = *loader.producer().layout();
    let plan = loader.plan();
    say_err!(
        "ringfeed: serving {} samples ({}) from {} as {:?} to {}: batch {}, {} batches per rank ({} steps an epoch{}), {} slots/rank of {}, ring {} in /dev/shm/ringfeed-{}",
        plan.manifest().len(),
        human_bytes(plan.manifest().total_bytes()),
        cfg.source,
        cfg.name,
        ranks_words(cfg.world_size, plan.job()),
        cfg.batch_size,
        plan.batches_per_rank(),
        plan.sampler().steps_per_epoch(),
        match plan.sampler().tail() {
            crate::sampler::Tail::Keep => ", tail kept: every sample once, the last batches short",
            crate::sampler::Tail::Drop => "",
        },
        layout.geometry.slots_per_rank,
        human_bytes(layout.geometry.slot_payload_bytes),
        human_bytes(layout.segment_bytes),
        cfg.name,
    );
}

/// "8 rank(s)", or for a job on several machines which of its ranks.
pub(super) fn ranks_words(world_size: u32, job: Job) -> String {
    if job.is_single_machine(world_size) {
        return format!("{world_size} rank(s)");
    }
    let (first, nnodes) = (job.first_rank, job.job_world_size / world_size);
    format!(
        "{world_size} rank(s), job ranks {first} to {} of {} (machine {} of {nnodes}; LOCAL_RANK r is job rank {first} + r; plan {:016x}, the same on every machine)",
        first + world_size - 1,
        job.job_world_size,
        first / world_size,
        job.plan_digest
    )
}
