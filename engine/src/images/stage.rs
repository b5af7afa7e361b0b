//! The decode stage proper: a batch's raw samples, in its slot's staging
//! area, become images at the slot's start, on the stage's threads.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::RecvTimeoutError;
use ringfeed_decode::{zero_fill, MemoryBudget};

use super::pool::{IdleWatch, Pool, SampleError, SampleJob};
use super::tar::{label_only, tar_parts, TarFields};
use super::Labels;
use crate::ring::layout::ImageFormat;
use crate::ring::SampleEntry;

/// `--on-bad-sample`: what an image that cannot be decoded does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnBadSample {
    /// Stop the run, naming the sample (the default).
    Error,
    /// Serve a zero image in its place, flagged in the batch's bad mask.
    Zero,
}

/// Why a batch was not decoded.
#[derive(Debug)]
pub enum StageError {
    /// A sample could not be decoded, under `--on-bad-sample error`.
    Bad(BadSample),
    /// The run was stopped while the batch was being decoded: the batch is
    /// abandoned, not published.
    Stopped,
}

/// How often a batch's wait for its samples looks at the run's stop.
const STOP_POLL: Duration = Duration::from_millis(20);

/// An image that cannot be decoded, under `--on-bad-sample error`.
#[derive(Debug, thiserror::Error)]
#[error("sample {index} ({key}) cannot be decoded: {why}; fix or remove it, or pass --on-bad-sample zero to serve a zero image in its place (flagged in batch.bad)")]
pub struct BadSample {
    /// The sample's index.
    pub index: u64,
    /// Its object, as messages name it.
    pub key: String,
    /// What was wrong.
    pub why: String,
}

/// Allocations of this size and more are their own mappings, returned to
/// the system when freed (`return_large_blocks_to_the_system`).
#[cfg(target_env = "gnu")]
const MMAP_THRESHOLD_BYTES: i32 = 4 << 20;

/// Makes glibc map every block of `MMAP_THRESHOLD_BYTES` or more on its own
/// and unmap it when freed. By default glibc raises that threshold to the
/// size of any such block freed (up to 32 MiB), after which a decoder's
/// large per-image buffers come from per-thread heaps that keep their pages
/// after the decode: the process's memory would then follow the largest
/// image each thread ever saw, not the budget.
fn return_large_blocks_to_the_system() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a tuning parameter of the allocator; a
    // fixed threshold is always valid.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
    }
}

/// The decode stage of a run.
pub struct DecodeStage {
    format: ImageFormat,
    staging_base: u64,
    on_bad: OnBadSample,
    labels: Arc<Labels>,
    tar: Option<TarFields>,
    pool: Pool,
    budget: Arc<MemoryBudget>,
    /// Images decoded so far.
    pub decoded: u64,
    /// Samples served as zero images so far (`--on-bad-sample zero`).
    pub bad: u64,
}

impl DecodeStage {
    /// A stage writing `format`'s images as `cfg` says (its tar fields
    /// when `tar`), reading raw samples at or after `staging_base` of the
    /// payload, on `threads` threads sharing `cfg.memory_bytes` of memory.
    pub fn new(
        cfg: &super::DecodeConfig,
        format: ImageFormat,
        staging_base: u64,
        seed: u64,
        labels: Arc<Labels>,
        tar: bool,
        threads: usize,
    ) -> std::io::Result<DecodeStage> {
        let tar = tar.then(|| cfg.tar.clone());
        return_large_blocks_to_the_system();
        let budget = Arc::new(MemoryBudget::new(cfg.memory_bytes));
        let pool = Pool::start(threads, cfg.spec, seed, tar.clone(), &budget)?;
        Ok(DecodeStage {
            format,
            staging_base,
            on_bad: cfg.on_bad,
            labels,
            tar,
            pool,
            budget,
            decoded: 0,
            bad: 0,
        })
    }

    /// The most memory the stage's decodes held at once so far, in bytes.
    pub fn memory_peak_bytes(&self) -> u64 {
        self.budget.peak()
    }

    /// Waits for the stage's threads to hold no sample: the ring they
    /// write into may be unmapped once this says so.
    pub fn idle_watch(&self) -> IdleWatch {
        self.pool.idle_watch()
    }

    /// Decodes one batch of `epoch` in `payload`: `samples` hold the raw
    /// samples' places (in the staging area) and become the images' places;
    /// the labels (`file_of` maps a sample to its object) and the bad mask
    /// are written beside them. `key_of` names a sample in an error. A
    /// `stopped()` that becomes true abandons the batch within about
    /// `STOP_POLL` (queued samples skipped; one under way is left to finish
    /// in its own time, see `idle_watch`).
    pub fn decode_batch(
        &mut self,
        payload: &mut [u8],
        epoch: u64,
        samples: &mut [SampleEntry],
        file_of: impl Fn(u64) -> u32,
        key_of: impl Fn(u64) -> String,
        stopped: &dyn Fn() -> bool,
    ) -> Result<(), StageError> {
        let n = samples.len();
        let image = self.format.image_bytes() as usize;
        let base = self.staging_base as usize;
        // The planner put every sample inside the staging area, after the
        // images, labels and flags; a place outside it reads as empty.
        let payload_len = payload.len();
        let raw_range = |e: &SampleEntry| -> (usize, usize) {
            let start = (e.offset as usize).max(base);
            let end = (e.offset as usize).saturating_add(e.len as usize);
            if end <= payload_len && start <= end {
                (start, end - start)
            } else {
                (base, 0)
            }
        };
        assert!(
            n * image <= self.format.labels_offset as usize && base <= payload_len,
            "the slot layout holds the batch's images before its staging area"
        );
        let ptr = payload.as_mut_ptr();
        let jobs: Vec<SampleJob> = samples
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let (start, len) = raw_range(e);
                // SAFETY: `payload` is this claimed, unpublished slot's
                // payload (borrowed mutably for this whole call, which
                // returns only once every job's result is in or the batch
                // is abandoned: then the loader keeps the mapping until the
                // pool is idle). Inputs lie in the staging area at or after
                // `base`, images i*image..(i+1)*image before it (asserted),
                // one per job.
                unsafe { SampleJob::new(e.index, ptr.add(start), len, ptr.add(i * image)) }
            })
            .collect();
        let results = self.pool.submit(epoch, jobs);
        let mut outcome: Vec<Option<Result<Option<i64>, String>>> = (0..n).map(|_| None).collect();
        let mut got = 0;
        while got < n {
            if stopped() {
                self.pool.stop();
                return Err(StageError::Stopped);
            }
            match results.recv_timeout(STOP_POLL) {
                Ok((i, result)) => {
                    got += 1;
                    outcome[i] = Some(match result {
                        Ok(label) => Ok(label),
                        Err(SampleError::Bad(why)) => Err(why),
                        Err(SampleError::Stopped) => {
                            self.pool.stop();
                            return Err(StageError::Stopped);
                        }
                        // A decoder that panicked is a bug of ringfeed: it
                        // goes on up.
                        Err(SampleError::Panicked(panic)) => std::panic::resume_unwind(panic),
                    });
                }
                Err(RecvTimeoutError::Timeout) => {}
                // The pool keeps every batch's sender until its last job.
                Err(RecvTimeoutError::Disconnected) => return Err(StageError::Stopped),
            }
        }
        self.finish_batch(payload, samples, outcome, file_of, key_of)
            .map_err(StageError::Bad)
    }

    /// Writes a decoded batch's labels and bad flags, zero images for its
    /// bad samples, and its samples' new places.
    fn finish_batch(
        &mut self,
        payload: &mut [u8],
        samples: &mut [SampleEntry],
        outcome: Vec<Option<Result<Option<i64>, String>>>,
        file_of: impl Fn(u64) -> u32,
        key_of: impl Fn(u64) -> String,
    ) -> Result<(), BadSample> {
        let n = samples.len();
        let image = self.format.image_bytes() as usize;
        let base = self.staging_base as usize;
        let (head, staging) = payload.split_at_mut(base);
        let staging: &[u8] = staging;
        let (images, rest) = head.split_at_mut(self.format.labels_offset as usize);
        let (labels, rest) =
            rest.split_at_mut((self.format.bad_offset - self.format.labels_offset) as usize);
        let bad = &mut rest[..n];
        let raw = |e: &SampleEntry| -> &[u8] {
            let start = (e.offset as usize).saturating_sub(base);
            staging
                .get(start..start + e.len as usize)
                .unwrap_or_default()
        };
        for (i, result) in outcome.into_iter().enumerate() {
            let index = samples[i].index;
            let mut tar_label = None;
            // Every sample's result came in (decode_batch waits for all).
            let result = result.unwrap_or_else(|| Err("not decoded".into()));
            let flag = match result {
                Ok(label) => {
                    tar_label = label;
                    0
                }
                Err(why) if self.on_bad == OnBadSample::Error => {
                    return Err(BadSample {
                        index,
                        key: key_of(index),
                        why,
                    })
                }
                Err(why) => {
                    tracing::debug!(
                        "sample {index} ({}) served as a zero image: {why}",
                        key_of(index)
                    );
                    zero_fill(&mut images[i * image..(i + 1) * image]);
                    self.bad += 1;
                    1
                }
            };
            bad[i] = flag;
            let label = match &self.tar {
                // A bad sample's label is still its own, where it has one.
                Some(fields) => tar_label
                    .or_else(|| {
                        tar_parts(raw(&samples[i]), fields)
                            .ok()
                            .and_then(|(_, l)| l)
                    })
                    .or_else(|| label_only(raw(&samples[i]), fields))
                    .unwrap_or(-1),
                None => self.labels.of_file(file_of(index)),
            };
            labels[i * 8..(i + 1) * 8].copy_from_slice(&label.to_le_bytes());
            samples[i].offset = (i * image) as u64;
            samples[i].len = image as u64;
        }
        self.decoded += n as u64;
        Ok(())
    }
}
