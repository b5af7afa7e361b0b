//! The decode stage (`serve --decode image`): between a batch's bytes
//! landing in its slot and the batch's publish, each sample is decoded,
//! cropped and resized (crate `ringfeed-decode`) into a fixed-shape uint8
//! image at its place in the same slot, with the batch's labels and
//! bad-sample flags beside the images (`ring::layout::ImageFormat`).
//!
//! The raw bytes land in the slot's staging area, after the images; the
//! stage runs on threads of its own (`--decode-threads`), which share one
//! memory budget (`--decode-memory`): more threads never hold more. A sample's crop and
//! flip are a function of (seed, epoch, sample index) alone, so a resumed
//! run, another world size or another thread count gives the same pixels.

mod labels;
mod pool;
mod stage;
mod tar;

pub use labels::{LabelChoice, Labels};
pub use pool::IdleWatch;
pub use stage::{BadSample, DecodeStage, OnBadSample, StageError};
pub use tar::TarFields;

use ringfeed_decode::ImageSpec;

/// What `--decode image` and its flags ask for.
#[derive(Clone, Debug)]
pub struct DecodeConfig {
    /// Output shape, crop, flip, pixel limit.
    pub spec: ImageSpec,
    /// Decode threads; 0: one per core the ranks leave (at least 1).
    pub threads: usize,
    /// The stage's memory budget in bytes: every decode of every thread
    /// together holds at most this much (`--decode-memory`).
    pub memory_bytes: u64,
    /// What an image that cannot be decoded does to the run.
    pub on_bad: OnBadSample,
    /// Where labels come from (a tree of files).
    pub labels: LabelChoice,
    /// A tar shard sample's image and label fields (`--format tar`).
    pub tar: TarFields,
}

impl DecodeConfig {
    /// The threads to decode on: `threads`, or the cores left once each of
    /// `ranks` trainers has one (at least 1), and the words that say so.
    pub fn threads_for(&self, ranks: u32) -> (usize, String) {
        if self.threads > 0 {
            return (self.threads, format!("{} (--decode-threads)", self.threads));
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let left = cores.saturating_sub(ranks as usize).max(1);
        (
            left,
            format!("{left} ({cores} core(s) less one per rank; --decode-threads sets it)"),
        )
    }
}
