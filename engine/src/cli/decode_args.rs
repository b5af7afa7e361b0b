//! `ringfeed serve`'s image flags (`--decode image` and its shape, crop and
//! policy), and the decode configuration they make (docs/images.md).

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use ringfeed_decode::{
    max_pixels_within, Crop, ImageSpec, Layout, DEFAULT_MAX_PIXELS, DEFAULT_MEMORY_BUDGET,
};

use crate::images::{DecodeConfig, LabelChoice, OnBadSample, TarFields};

/// The decode stage's flags, part of [`ServeArgs`](super::serve::ServeArgs).
#[derive(Args, Debug, Clone)]
pub struct DecodeArgs {
    /// Decode every sample in the loader: `image` (JPEG, PNG, WebP) into a
    /// fixed-shape uint8 RGB image per sample, with the batch's labels.
    #[arg(long, value_enum)]
    pub decode: Option<DecodeFlag>,
    /// The crop, torchvision's: random-resized:SIZE (RandomResizedCrop,
    /// training) or center:SIZE (Resize then CenterCrop, evaluation); SIZE
    /// is N or HxW.
    #[arg(long, default_value = "random-resized:224")]
    pub crop: String,
    /// With --crop center: the shorter side after the resize (default
    /// SIZE × 256/224, torchvision's evaluation recipe).
    #[arg(long)]
    pub resize: Option<u32>,
    /// A horizontal flip with probability 1/2 (RandomHorizontalFlip),
    /// seeded like the crop.
    #[arg(long)]
    pub flip: bool,
    /// The images' layout: chw (3, H, W: what a torch model eats) or hwc.
    #[arg(long, value_enum, default_value_t = LayoutFlag::Chw)]
    pub layout: LayoutFlag,
    /// Decode threads (default: one per core the ranks leave, at least 1;
    /// said at start).
    #[arg(long, default_value_t = 0)]
    pub decode_threads: usize,
    /// An image that cannot be decoded: error (stop, naming it) or zero (a
    /// zero image, flagged in the batch's bad mask and counted).
    #[arg(long, value_enum, default_value_t = BadFlag::Error)]
    pub on_bad_sample: BadFlag,
    /// Labels: dirs (the first directory of each key, as torchvision's
    /// ImageFolder), none (-1), auto (dirs when every image is in one).
    #[arg(long, value_enum, default_value_t = LabelsFlag::Auto)]
    pub labels: LabelsFlag,
    /// Tar samples (--format tar): the field (extension) of the image member
    /// (default: the first jpg, jpeg, png or webp).
    #[arg(long, value_name = "EXT")]
    pub image_field: Option<String>,
    /// Tar samples: the field of the label member, a decimal class index
    /// (WebDataset's cls); a sample without one has label -1.
    #[arg(long, value_name = "EXT", default_value = "cls")]
    pub label_field: String,
    /// Most pixels an image may have before it is refused unread (a
    /// decompression bomb); at most what --decode-memory holds at 3 bytes
    /// a pixel.
    #[arg(long, default_value_t = DEFAULT_MAX_PIXELS)]
    pub max_pixels: u64,
    /// The decode stage's memory budget, for all its threads together
    /// (e.g. 256MiB, 1GiB): an image whose decode needs more is a bad
    /// sample, refused from its headers.
    #[arg(long, value_name = "SIZE", value_parser = super::pack::parse_size, default_value = "256MiB")]
    pub decode_memory: u64,
}

/// `--decode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DecodeFlag {
    /// JPEG, PNG and WebP images.
    Image,
}

/// `--layout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LayoutFlag {
    /// Channel, height, width.
    Chw,
    /// Height, width, channel.
    Hwc,
}

/// `--on-bad-sample`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BadFlag {
    /// Stop the run, naming the sample.
    Error,
    /// A zero image, flagged.
    Zero,
}

/// `--labels`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LabelsFlag {
    /// dirs when every image is inside a directory, else none.
    Auto,
    /// The first directory of each key.
    Dirs,
    /// No labels.
    None,
}

/// A field name as tar samples give it: the extension, lowercased, without
/// a leading dot.
fn field(ext: &str) -> String {
    ext.trim_start_matches('.').to_ascii_lowercase()
}

/// Bytes as a --decode-memory value would say them (MiB, rounded up).
fn human(bytes: u64) -> String {
    format!("{}MiB", bytes.div_ceil(1 << 20))
}

/// `N` or `HxW`, each 1 or more.
fn parse_size(flag: &str, s: &str) -> Result<(u32, u32)> {
    let bad = || anyhow::anyhow!("{flag}: size {s:?} is not N or HxW (e.g. 224 or 256x192)");
    let side = |t: &str| t.parse::<u32>().ok().filter(|&n| n > 0).ok_or_else(bad);
    match s.split_once('x') {
        Some((h, w)) => Ok((side(h)?, side(w)?)),
        None => side(s).map(|n| (n, n)),
    }
}

impl DecodeArgs {
    /// The decode stage these flags ask for; None without `--decode`, when
    /// every other image flag must be at its default.
    pub fn config(&self) -> Result<Option<DecodeConfig>> {
        if self.decode.is_none() {
            let given = [
                (self.crop != "random-resized:224", "--crop"),
                (self.resize.is_some(), "--resize"),
                (self.flip, "--flip"),
                (self.layout != LayoutFlag::Chw, "--layout"),
                (self.decode_threads != 0, "--decode-threads"),
                (self.on_bad_sample != BadFlag::Error, "--on-bad-sample"),
                (self.labels != LabelsFlag::Auto, "--labels"),
                (self.max_pixels != DEFAULT_MAX_PIXELS, "--max-pixels"),
                (
                    self.decode_memory != DEFAULT_MEMORY_BUDGET,
                    "--decode-memory",
                ),
                (self.image_field.is_some(), "--image-field"),
                (self.label_field != "cls", "--label-field"),
            ];
            if let Some((_, flag)) = given.iter().find(|(g, _)| *g) {
                bail!("{flag} shapes the decode stage; add --decode image, or drop it");
            }
            return Ok(None);
        }
        let (kind, size) = self
            .crop
            .split_once(':')
            .unwrap_or((self.crop.as_str(), ""));
        let (height, width) = parse_size(&format!("--crop {}", self.crop), size)?;
        let crop = match kind {
            "random-resized" => {
                if self.resize.is_some() {
                    bail!("--resize sizes --crop center only; RandomResizedCrop resizes its own box");
                }
                Crop::RANDOM_RESIZED_DEFAULT
            }
            "center" => Crop::Center {
                resize: self
                    .resize
                    .unwrap_or_else(|| (u64::from(height.max(width)) * 256).div_ceil(224) as u32),
            },
            other => bail!(
                "--crop {}: {other:?} is not a crop; use random-resized:SIZE (training) or center:SIZE (evaluation)",
                self.crop
            ),
        };
        let holds = max_pixels_within(self.decode_memory);
        if self.max_pixels > holds {
            bail!(
                "--max-pixels {} is more than the decode memory budget holds ({} at 3 bytes a pixel: {holds} pixels); lower --max-pixels to {holds} or less, or raise --decode-memory to {} or more",
                self.max_pixels,
                human(self.decode_memory),
                human(self.max_pixels.saturating_mul(3)),
            );
        }
        let layout = match self.layout {
            LayoutFlag::Chw => Layout::Chw,
            LayoutFlag::Hwc => Layout::Hwc,
        };
        let spec = ImageSpec::new(height, width, layout, crop, self.flip, self.max_pixels)
            .map_err(|e| {
                anyhow::anyhow!(
                    "--crop {} --resize {:?} --max-pixels {}: {e}",
                    self.crop,
                    self.resize,
                    self.max_pixels
                )
            })?;
        Ok(Some(DecodeConfig {
            spec,
            threads: self.decode_threads,
            memory_bytes: self.decode_memory,
            on_bad: match self.on_bad_sample {
                BadFlag::Error => OnBadSample::Error,
                BadFlag::Zero => OnBadSample::Zero,
            },
            labels: match self.labels {
                LabelsFlag::Auto => LabelChoice::Auto,
                LabelsFlag::Dirs => LabelChoice::Dirs,
                LabelsFlag::None => LabelChoice::None,
            },
            tar: TarFields {
                image: self.image_field.as_deref().map(field),
                label: field(&self.label_field),
            },
        }))
    }
}
