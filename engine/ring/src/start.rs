//! Where a run starts, when the trainers say (`serve --resume auto`).
//!
//! A job resumed from its checkpoint should not need the loader restarted
//! with `--resume E:S` copied from a log. With `--resume auto` the loader sets
//! [`flags::AWAITS_START`] before READY and serves nothing until every rank
//! has made a start request in its rank block: "at `(epoch, samples)`" (a
//! trainer's `load_state_dict`), or "from the loader's own start" (a trainer
//! that takes its first batch without one: a fresh run). Once all agree, the
//! loader writes the start into the header with [`flags::START_KNOWN`] and
//! serves from there; if they disagree, it stops with an error naming each
//! rank's request, which every trainer reports.
//!
//! The request fields are the rank lock holder's, like the rest of its line;
//! the loader only reads them.

use crate::layout::{flags, Header, RankBlock, RunStart};
use crate::sync::Ordering;

/// `RankBlock::start_request`: no request yet.
pub const REQUEST_NONE: u32 = 0;
/// `RankBlock::start_request`: from the loader's own start (a fresh run).
pub const REQUEST_LOADERS: u32 = 1;
/// `RankBlock::start_request`: at `requested_epoch`, `requested_samples`.
pub const REQUEST_AT: u32 = 2;

/// A rank's start request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartRequest {
    /// Wherever the loader starts (0:0 unless it was given a state).
    LoadersStart,
    /// At this resume state `(epoch, samples consumed in it)`.
    At(u64, u64),
}

/// Whether the loader of `header` waits for its ranks' start requests.
pub fn awaits_start(header: &Header) -> bool {
    header.flags.load(Ordering::Relaxed) & flags::AWAITS_START != 0
}

/// Whether the loader has fixed its start (the header's `start_*` fields).
pub fn start_known(header: &Header) -> bool {
    // SYNC POINT: Acquire pairs with the Release in `publish_start`: the
    // start fields written before it are visible.
    header.flags.load(Ordering::Acquire) & flags::START_KNOWN != 0
}

/// Consumer: records this rank's request. The caller holds the rank lock.
pub fn request(block: &RankBlock, req: StartRequest) {
    let (kind, epoch, samples) = match req {
        StartRequest::LoadersStart => (REQUEST_LOADERS, 0, 0),
        StartRequest::At(e, s) => (REQUEST_AT, e, s),
    };
    block.requested_epoch.store(epoch, Ordering::Relaxed);
    block.requested_samples.store(samples, Ordering::Relaxed);
    // SYNC POINT: Release pairs with the loader's Acquire in `requested`:
    // the epoch and samples above are visible with the kind.
    block.start_request.store(kind, Ordering::Release);
}

/// The rank's request, if it made one (None for an unknown kind too: a
/// hostile value is not a request).
pub fn requested(block: &RankBlock) -> Option<StartRequest> {
    // SYNC POINT: Acquire pairs with the Release in `request`.
    match block.start_request.load(Ordering::Acquire) {
        REQUEST_LOADERS => Some(StartRequest::LoadersStart),
        REQUEST_AT => Some(StartRequest::At(
            block.requested_epoch.load(Ordering::Relaxed),
            block.requested_samples.load(Ordering::Relaxed),
        )),
        _ => None,
    }
}

/// Loader: writes the agreed start, then [`flags::START_KNOWN`].
pub fn publish_start(header: &Header, start: RunStart) {
    header.start_epoch.store(start.epoch, Ordering::Relaxed);
    header
        .start_samples
        .store(start.samples_consumed, Ordering::Relaxed);
    header
        .dataset_samples
        .store(start.dataset_samples, Ordering::Relaxed);
    // SYNC POINT: Release pairs with the Acquire in `start_known`.
    header.flags.fetch_or(flags::START_KNOWN, Ordering::Release);
}

/// The start every rank asked for, where `loaders` is the loader's own
/// start; or the error naming each rank's request when they disagree.
/// `requests` holds `(rank, request)` for every rank.
pub fn agree(requests: &[(u32, StartRequest)], loaders: (u64, u64)) -> Result<(u64, u64), String> {
    let state = |r: &StartRequest| match *r {
        StartRequest::LoadersStart => loaders,
        StartRequest::At(e, s) => (e, s),
    };
    let Some((_, first)) = requests.first() else {
        return Ok(loaders);
    };
    let want = state(first);
    if requests.iter().all(|(_, r)| state(r) == want) {
        return Ok(want);
    }
    let each: Vec<String> = requests
        .iter()
        .map(|(rank, r)| match r {
            StartRequest::LoadersStart => {
                format!("rank {rank} a fresh start ({}:{})", loaders.0, loaders.1)
            }
            StartRequest::At(e, s) => format!("rank {rank} {e}:{s}"),
        })
        .collect();
    Err(format!(
        "the ranks ask to start at different places: {}; every rank must load the same checkpoint (or none)",
        each.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_that_agree_give_their_start_and_a_fresh_rank_means_the_loaders() {
        let at = StartRequest::At(2, 64);
        assert_eq!(agree(&[(0, at), (1, at)], (0, 0)), Ok((2, 64)));
        assert_eq!(
            agree(
                &[
                    (0, StartRequest::LoadersStart),
                    (1, StartRequest::LoadersStart)
                ],
                (0, 0)
            ),
            Ok((0, 0))
        );
        assert_eq!(
            agree(
                &[(0, StartRequest::LoadersStart), (1, StartRequest::At(0, 0))],
                (0, 0)
            ),
            Ok((0, 0))
        );
    }

    #[test]
    fn ranks_that_disagree_are_each_named() {
        let e = agree(
            &[
                (0, StartRequest::At(2, 64)),
                (1, StartRequest::LoadersStart),
            ],
            (0, 0),
        )
        .unwrap_err();
        assert!(
            e.contains("rank 0 2:64") && e.contains("rank 1 a fresh start (0:0)"),
            "{e}"
        );
    }

    #[test]
    fn a_request_reads_back_and_garbage_is_no_request() {
        let block = RankBlock::new_for_model();
        assert_eq!(requested(&block), None);
        request(&block, StartRequest::At(3, 9));
        assert_eq!(requested(&block), Some(StartRequest::At(3, 9)));
        request(&block, StartRequest::LoadersStart);
        assert_eq!(requested(&block), Some(StartRequest::LoadersStart));
        block.start_request.store(77, Ordering::Relaxed);
        assert_eq!(requested(&block), None);
    }
}
