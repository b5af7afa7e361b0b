//! Where a ring's ranks sit in the training job, and where its run started.

use crate::resume::Tail;

/// Where a ring's ranks sit in the training job. A job spread over several
/// machines has one loader per machine; each serves a contiguous run of the
/// job's ranks, so ring rank r is job rank `first_rank + r`, and the sampler
/// splits every step over all `job_world_size` ranks. On one machine,
/// `first_rank` is 0 and `job_world_size` is the ring's world size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Job {
    /// Job rank of ring rank 0.
    pub first_rank: u32,
    /// Ranks of the whole job.
    pub job_world_size: u32,
    /// Digest of what the loader serves: the dataset's manifest and the
    /// flags that decide the order (seed, shuffle, batch size, world size,
    /// epochs, resume state). Loaders of one job on several machines must
    /// agree on it; trainers can compare it across ranks. 0: not known.
    pub plan_digest: u64,
    /// Where the loader started (its `--resume`). None: not known (a loader
    /// that predates the fields, or a test producer).
    pub start: Option<RunStart>,
    /// What, besides the dataset's sample count, decides the order of every
    /// epoch. None: not known (as for `start`).
    pub order: Option<RunOrder>,
    /// Every sample is a decoded image of one fixed shape (`serve --decode
    /// image`), with the batch's labels and bad-sample flags beside them in
    /// the slot. None: samples are the objects' bytes.
    pub images: Option<ImageFormat>,
    /// Every sample is a window of `L + 1` tokens (`serve --seq-len`), with
    /// the batch's document starts beside them in the slot. None: samples
    /// are the objects' bytes.
    pub tokens: Option<super::TokenFormat>,
    /// The loader waits for its ranks' start requests (`--resume auto`,
    /// [`super::flags::AWAITS_START`]): `start` holds the dataset's sample count and
    /// the loader's own start, but the header says START_KNOWN only once the
    /// ranks agreed (see [`crate::start`]).
    pub awaits_start: bool,
    /// Where each slot keeps its samples' keys ([`super::flags::KEYS_KNOWN`]).
    /// None: a loader that keeps none (one that predates the field).
    pub keys: Option<super::KeyArea>,
    /// Where slot 0 keeps the class names of the labels
    /// ([`super::flags::CLASS_NAMES_KNOWN`]). None: no names known.
    pub class_names: Option<super::ClassNames>,
    /// How every epoch ends (`serve --tail`, [`super::flags::TAIL_KNOWN`]):
    /// [`Tail::Drop`] from a loader that predates the field, which always
    /// dropped it.
    pub tail: Tail,
}

/// The flags that decide the sample order of an epoch, with the sample count
/// ([`RunStart::dataset_samples`]; docs/sampler.md): a resume state holds only
/// under the order it was saved under, and a trainer can compare them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunOrder {
    /// `--seed`.
    pub seed: u64,
    /// False with `--no-shuffle` (`--shuffle none`).
    pub shuffled: bool,
    /// `--shuffle-block` of a block order (`--shuffle block`), 0 for the
    /// exact shuffle or none.
    pub block_samples: u32,
    /// `--shuffle-window` of a block order, 0 for the exact shuffle or none.
    pub window_blocks: u32,
}

/// The shape of a run's decoded images, and where a slot keeps the batch's
/// labels and bad-sample flags ([`super::flags::IMAGES_KNOWN`]). Sample i of
/// a batch is image i: `height × width × 3` uint8 at `i × image_bytes()` of
/// the payload (the sample table says so too).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImageFormat {
    /// Pixels high.
    pub height: u32,
    /// Pixels wide.
    pub width: u32,
    /// Channel-first (3, H, W) when true, else (H, W, 3).
    pub chw: bool,
    /// Classes the labels index (0: no labels known; the label array then
    /// holds -1).
    pub classes: u32,
    /// Payload offset of the batch's labels: one little-endian int64 per
    /// sample (8-byte aligned).
    pub labels_offset: u64,
    /// Payload offset of the batch's bad-sample flags: one byte per sample,
    /// 1 where the sample could not be decoded and is a zero image
    /// (`--on-bad-sample zero`).
    pub bad_offset: u64,
}

impl ImageFormat {
    /// Bytes of one image.
    pub fn image_bytes(&self) -> u64 {
        // Saturating: a format read from a header is hostile until `check`.
        u64::from(self.height)
            .saturating_mul(u64::from(self.width))
            .saturating_mul(3)
    }

    /// Bytes of a slot's payload a batch of `samples` images takes: the
    /// images, the labels, the flags (the layout the loader plans).
    pub fn batch_bytes(&self, samples: u32) -> u64 {
        self.bad_offset.saturating_add(u64::from(samples))
    }

    /// The layout of a batch of up to `samples` images: labels after the
    /// images (8-byte aligned), flags after the labels.
    pub fn plan(height: u32, width: u32, chw: bool, classes: u32, samples: u32) -> ImageFormat {
        let image = u64::from(height) * u64::from(width) * 3;
        let labels_offset = (image * u64::from(samples)).div_ceil(8) * 8;
        ImageFormat {
            height,
            width,
            chw,
            classes,
            labels_offset,
            bad_offset: labels_offset + 8 * u64::from(samples),
        }
    }

    /// Checks a format read from a header against the slots it describes:
    /// every region of a batch of `max_samples` inside `payload_bytes`.
    pub fn check(&self, max_samples: u32, payload_bytes: u64) -> Result<(), String> {
        let n = u64::from(max_samples);
        let images = self.image_bytes().checked_mul(n);
        let labels_end = n
            .checked_mul(8)
            .and_then(|b| b.checked_add(self.labels_offset));
        let bad_end = self.bad_offset.checked_add(n);
        match (images, labels_end, bad_end) {
            (Some(images), Some(labels_end), Some(bad_end))
                if self.height > 0
                    && self.width > 0
                    && images <= self.labels_offset
                    && self.labels_offset.is_multiple_of(8)
                    && labels_end <= self.bad_offset
                    && bad_end <= payload_bytes => Ok(()),
            _ => Err(format!("its image format {self:?} does not fit slots of {payload_bytes} bytes and {max_samples} samples")),
        }
    }
}

/// The state a loader started at, and what it needs to say the state after
/// any of its steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunStart {
    /// Epoch of its `--resume` (0 without one).
    pub epoch: u64,
    /// Samples of that epoch consumed before it started (0 without `--resume`).
    pub samples_consumed: u64,
    /// Samples in the dataset (n): every epoch has that many.
    pub dataset_samples: u64,
}

impl Job {
    /// A job that is all on this machine: ring ranks are job ranks.
    pub fn single(world_size: u32) -> Job {
        Job {
            first_rank: 0,
            job_world_size: world_size,
            plan_digest: 0,
            start: None,
            order: None,
            images: None,
            tokens: None,
            awaits_start: false,
            keys: None,
            class_names: None,
            tail: Tail::Drop,
        }
    }

    /// Samples one step of the job consumes: `job_world_size × batch_size`
    /// (None on overflow).
    pub fn step_samples(&self, batch_size: u32) -> Option<u64> {
        u64::from(self.job_world_size).checked_mul(u64::from(batch_size))
    }

    /// Steps every rank takes in a whole epoch of `dataset_samples`
    /// ([`crate::resume::steps_in_epoch`] from 0 under this job's tail).
    pub fn steps_per_epoch(&self, batch_size: u32, dataset_samples: u64) -> Option<u64> {
        crate::resume::steps_in_epoch(
            dataset_samples,
            0,
            self.step_samples(batch_size)?,
            self.tail,
        )
    }

    /// The resume state once every rank of the job has taken its batch of
    /// `step` in `epoch`: `(epoch, samples consumed in it)`, what `serve
    /// --resume` takes to go on with the step after. Steps count from the
    /// loader's start in the epoch it started in (its `--resume`), from 0
    /// in later ones. As in `Sampler::state_after`, the state after an
    /// epoch's last step is `(epoch + 1, 0)`: a dropped tail is not carried
    /// over. None if the start is not known, or for an epoch before it (not
    /// a batch of this loader), or on overflow.
    pub fn resume_state_after(&self, batch_size: u32, epoch: u64, step: u64) -> Option<(u64, u64)> {
        let start = self.start?;
        let before = match epoch.cmp(&start.epoch) {
            std::cmp::Ordering::Less => return None,
            std::cmp::Ordering::Equal => start.samples_consumed,
            std::cmp::Ordering::Greater => 0,
        };
        crate::resume::after_steps(
            epoch,
            before,
            step.checked_add(1)?,
            start.dataset_samples,
            self.step_samples(batch_size)?,
            self.tail,
        )
    }

    /// Whether the ring's ranks are the whole job.
    pub fn is_single_machine(&self, world_size: u32) -> bool {
        self.first_rank == 0 && self.job_world_size == world_size
    }

    /// Reads the header's fields for a ring of `world_size` ranks: zeros
    /// (a loader that predates them) mean [`Job::single`]. Refuses a
    /// run of ranks that does not lie inside the job.
    pub fn from_header(
        first_rank: u32,
        job_world_size: u32,
        world_size: u32,
        plan_digest: u64,
        start: Option<RunStart>,
    ) -> Result<Job, String> {
        if job_world_size == 0 && first_rank == 0 {
            return Ok(Job {
                plan_digest,
                start,
                ..Job::single(world_size)
            });
        }
        let end = u64::from(first_rank) + u64::from(world_size);
        if end > u64::from(job_world_size) {
            return Err(format!(
                "it serves job ranks {first_rank} to {} of a job of {job_world_size} ranks",
                end - 1
            ));
        }
        Ok(Job {
            first_rank,
            job_world_size,
            plan_digest,
            start,
            order: None,
            images: None,
            tokens: None,
            awaits_start: false,
            keys: None,
            class_names: None,
            tail: Tail::Drop,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hostile_image_format_is_refused_without_overflow() {
        // Found by the attach_next fuzzer: height × width × 3 overflowed.
        for (h, w, labels, bad) in [
            (u32::MAX, u32::MAX, 0, 0),
            (u32::MAX, u32::MAX, u64::MAX, u64::MAX),
            (1, 1, u64::MAX - 3, u64::MAX),
        ] {
            let f = ImageFormat {
                height: h,
                width: w,
                chw: true,
                classes: 0,
                labels_offset: labels,
                bad_offset: bad,
            };
            assert!(f.check(4, 1 << 20).is_err(), "{f:?}");
            let _ = f.batch_bytes(u32::MAX);
        }
        assert!(ImageFormat::plan(4, 4, true, 3, 4).check(4, 4096).is_ok());
    }

    #[test]
    fn the_resume_state_after_a_step_adds_the_loaders_start_in_its_first_epoch_only() {
        // Two machines of 4 ranks, B = 8: a step is 64 samples of the job;
        // 1000 samples: epoch 2 from 100 has 14 steps, later ones 15.
        let start = RunStart {
            epoch: 2,
            samples_consumed: 100,
            dataset_samples: 1000,
        };
        let job = Job {
            first_rank: 4,
            job_world_size: 8,
            plan_digest: 0,
            start: Some(start),
            order: None,
            images: None,
            tokens: None,
            awaits_start: false,
            keys: None,
            class_names: None,
            tail: Tail::Drop,
        };
        assert_eq!(job.resume_state_after(8, 2, 0), Some((2, 164)));
        assert_eq!(job.resume_state_after(8, 2, 3), Some((2, 356)));
        assert_eq!(job.resume_state_after(8, 2, 12), Some((2, 932)));
        assert_eq!(
            job.resume_state_after(8, 2, 13),
            Some((3, 0)),
            "the last step of an epoch: its tail of 4 is not carried over"
        );
        assert_eq!(job.resume_state_after(8, 3, 0), Some((3, 64)));
        assert_eq!(job.resume_state_after(8, 3, 13), Some((3, 896)));
        assert_eq!(job.resume_state_after(8, 3, 14), Some((4, 0)));
        assert_eq!(
            job.resume_state_after(8, 1, 0),
            None,
            "an epoch before the start is not this loader's"
        );
        assert_eq!(job.resume_state_after(8, 2, u64::MAX), None, "overflow");
        assert_eq!(
            Job { start: None, ..job }.resume_state_after(8, 2, 0),
            None,
            "start not known"
        );
    }

    #[test]
    fn with_a_kept_tail_the_epoch_ends_after_its_short_step() {
        // 3 ranks, B = 4: a step is 12 samples; 1003 samples: 83 whole
        // steps and one of 7.
        let job = Job {
            start: Some(RunStart {
                epoch: 0,
                samples_consumed: 0,
                dataset_samples: 1003,
            }),
            tail: Tail::Keep,
            ..Job::single(3)
        };
        assert_eq!(job.steps_per_epoch(4, 1003), Some(84));
        assert_eq!(job.resume_state_after(4, 0, 82), Some((0, 996)));
        assert_eq!(job.resume_state_after(4, 0, 83), Some((1, 0)));
        let dropping = Job {
            tail: Tail::Drop,
            ..job
        };
        assert_eq!(dropping.steps_per_epoch(4, 1003), Some(83));
        assert_eq!(dropping.resume_state_after(4, 0, 82), Some((1, 0)));
    }
}
