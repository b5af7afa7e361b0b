//! The decode stage proper: a batch's raw samples, in its slot's staging
//! area, become images at the slot's start, on the stage's threads.

use std::sync::Arc;

use ringfeed_decode::{zero_fill, Decoder, ImageSpec};

use super::labels::Sample;
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

/// An image that cannot be decoded, under `--on-bad-sample error`.
#[derive(Debug, thiserror::Error)]
#[error("sample {index} ({key}) {why}; fix or remove it, or pass --on-bad-sample zero to serve a zero image in its place (flagged in batch.bad)")]
pub struct BadSample {
    /// The sample's index.
    pub index: u64,
    /// Its object, as messages name it.
    pub key: String,
    /// What was wrong: "cannot be decoded: …", or its label's fault.
    pub why: String,
}

/// Which members of a tar sample (`--format tar`) are its image and its
/// label, by field name (the extension, lowercased).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TarFields {
    /// The image's field (`--image-field`); None: the first of jpg, jpeg,
    /// png, webp.
    pub image: Option<String>,
    /// The label's field (`--label-field`, default cls): a decimal integer
    /// (read by `Labels`).
    pub label: String,
}

/// Fields an image is found in when `--image-field` is not given.
const IMAGE_FIELDS: [&[u8]; 4] = [b"jpg", b"jpeg", b"png", b"webp"];

/// A tar sample's image bytes.
fn tar_image<'a>(sample: &'a [u8], fields: &TarFields) -> Result<&'a [u8], String> {
    let mut cursor = 0;
    while let Some(f) = crate::ring::tar_fields::next_field(sample, &mut cursor)
        .map_err(|e| format!("its tar members cannot be read: {e}"))?
    {
        let name = f.field_name();
        let wanted = match &fields.image {
            Some(want) => name.as_ref() == want.as_bytes(),
            None => IMAGE_FIELDS.contains(&name.as_ref()),
        };
        if wanted {
            return Ok(f.data);
        }
    }
    Err(match &fields.image {
        Some(want) => format!("it has no .{want} member (--image-field)"),
        None => {
            "it has no .jpg, .jpeg, .png or .webp member; name the image's field with --image-field"
                .to_string()
        }
    })
}

/// The decode stage of a run.
pub struct DecodeStage {
    spec: ImageSpec,
    format: ImageFormat,
    staging_base: u64,
    seed: u64,
    on_bad: OnBadSample,
    labels: Arc<Labels>,
    tar: Option<TarFields>,
    decoders: Vec<Decoder>,
    /// Images decoded so far.
    pub decoded: u64,
    /// Samples served as zero images so far (`--on-bad-sample zero`).
    pub bad: u64,
}

impl DecodeStage {
    /// A stage writing `format`'s images as `cfg` says (its tar fields
    /// when `tar`), reading raw samples at or after `staging_base` of the
    /// payload, on `threads` threads.
    pub fn new(
        cfg: &super::DecodeConfig,
        format: ImageFormat,
        staging_base: u64,
        seed: u64,
        labels: Arc<Labels>,
        tar: bool,
        threads: usize,
    ) -> DecodeStage {
        DecodeStage {
            spec: cfg.spec,
            format,
            staging_base,
            seed,
            on_bad: cfg.on_bad,
            labels,
            tar: tar.then(|| cfg.tar.clone()),
            decoders: (0..threads.max(1)).map(|_| Decoder::new()).collect(),
            decoded: 0,
            bad: 0,
        }
    }

    /// Decodes one batch of `epoch` in `payload`: `samples` hold the raw
    /// samples' places (in the staging area) and become the images' places;
    /// the labels (`file_of` maps a sample to its object) and the bad mask
    /// are written beside them. `key_of` names a sample in an error.
    pub fn decode_batch(
        &mut self,
        payload: &mut [u8],
        epoch: u64,
        samples: &mut [SampleEntry],
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
            // The planner put every sample inside the staging area.
            let start = (e.offset as usize).saturating_sub(base);
            staging
                .get(start..start + e.len as usize)
                .unwrap_or_default()
        };
        let outs: Vec<&mut [u8]> = images.chunks_exact_mut(image).take(n).collect();
        let results = run_parallel(&mut self.decoders, outs, |decoder, i, out| {
            let e = &samples[i];
            let bytes = match &self.tar {
                Some(fields) => tar_image(raw(e), fields)?,
                None => raw(e),
            };
            decoder
                .decode_into(bytes, &self.spec, self.seed, epoch, e.index, out)
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        for (i, result) in results.into_iter().enumerate() {
            let index = samples[i].index;
            let sample = match &self.tar {
                Some(_) => Sample::Tar(raw(&samples[i])),
                None => Sample::File(file_of(index)),
            };
            // A label the trainer cannot use is a bad sample too
            // (labels.rs); a sample that cannot be decoded says that first.
            let label = self.labels.label(sample);
            let result = match (result, &label) {
                (Err(why), _) => Err(format!("cannot be decoded: {why}")),
                (Ok(()), Err(why)) => Err(why.clone()),
                (Ok(()), Ok(_)) => Ok(()),
            };
            let flag = match result {
                Ok(()) => 0,
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
            // A bad sample's label is still its own, where it is usable.
            let label = label.unwrap_or(-1);
            labels[i * 8..(i + 1) * 8].copy_from_slice(&label.to_le_bytes());
            samples[i].offset = (i * image) as u64;
            samples[i].len = image as u64;
        }
        self.decoded += n as u64;
        Ok(())
    }
}

/// Runs `work(decoder, i, out)` for every `outs[i]`, sample i on decoder
/// `i % decoders.len()`, one thread per decoder (the caller's thread when
/// there is one). The results in sample order.
fn run_parallel<'a>(
    decoders: &mut [Decoder],
    outs: Vec<&'a mut [u8]>,
    work: impl Fn(&mut Decoder, usize, &mut [u8]) -> Result<(), String> + Sync,
) -> Vec<Result<(), String>> {
    let n = outs.len();
    let threads = decoders.len().min(n).max(1);
    if threads == 1 {
        let decoder = &mut decoders[0];
        return outs
            .into_iter()
            .enumerate()
            .map(|(i, out)| work(decoder, i, out))
            .collect();
    }
    let mut buckets: Vec<Vec<(usize, &'a mut [u8])>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, out) in outs.into_iter().enumerate() {
        buckets[i % threads].push((i, out));
    }
    let mut results: Vec<Option<Result<(), String>>> = (0..n).map(|_| None).collect();
    std::thread::scope(|scope| {
        let work = &work;
        let handles: Vec<_> = decoders
            .iter_mut()
            .zip(buckets)
            .map(|(decoder, bucket)| {
                scope.spawn(move || {
                    bucket
                        .into_iter()
                        .map(|(i, out)| (i, work(decoder, i, out)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for handle in handles {
            // A decoder that panicked is a bug of ringfeed: it goes on up.
            let done = handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            for (i, result) in done {
                results[i] = Some(result);
            }
        }
    });
    // Every sample was in one bucket, so every result is there.
    results.into_iter().flatten().collect()
}
