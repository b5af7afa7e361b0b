//! The output an image becomes: size, layout, crop and flip, checked once
//! when it is made (`ImageSpec::new`), so the hot path trusts it.

use std::fmt;

/// The most pixels a decoded source image may have, by default: Pillow's
/// `Image.MAX_IMAGE_PIXELS` (its `DecompressionBombWarning` threshold; Pillow
/// refuses at twice this), which is what the default memory budget
/// (`DEFAULT_MEMORY_BUDGET`, 256 MiB) holds at 3 bytes a pixel.
pub const DEFAULT_MAX_PIXELS: u64 = 89_478_485;

/// The longest output side accepted: outputs are slots of a ring, and a side
/// beyond this is a mistake (a 8192×8192×3 image is 192 MiB).
pub const MAX_OUTPUT_SIDE: u32 = 8192;

/// How the output's three channels are laid out in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Height, width, channel: `out[(y * w + x) * 3 + c]` (what PIL and numpy give).
    Hwc,
    /// Channel, height, width: `out[(c * h + y) * w + x]` (what a torch model eats).
    Chw,
}

/// Which part of the source becomes the output, torchvision's names and semantics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Crop {
    /// `RandomResizedCrop(size, scale, ratio, antialias=True)`: a seeded box of
    /// `scale` of the area and an aspect ratio in `ratio` (log-uniform), 10 tries,
    /// then torchvision's centre-crop fallback; resized to the output size.
    RandomResized {
        /// Area fraction bounds, torchvision's default `(0.08, 1.0)`.
        scale: (f64, f64),
        /// Aspect ratio (w/h) bounds, torchvision's default `(3/4, 4/3)`.
        ratio: (f64, f64),
    },
    /// Evaluation: `Resize(resize)` (the shorter side becomes `resize`, the
    /// longer one `int(resize * long / short)`), then `CenterCrop(output size)`.
    Center {
        /// The shorter side after the resize; at least the output's longer side.
        resize: u32,
    },
}

impl Crop {
    /// `RandomResizedCrop`'s defaults: scale (0.08, 1.0), ratio (3/4, 4/3).
    pub const RANDOM_RESIZED_DEFAULT: Crop = Crop::RandomResized {
        scale: (0.08, 1.0),
        ratio: (3.0 / 4.0, 4.0 / 3.0),
    };
}

/// The decode stage's configuration, valid by construction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ImageSpec {
    height: u32,
    width: u32,
    layout: Layout,
    crop: Crop,
    flip: bool,
    max_pixels: u64,
}

/// Why an `ImageSpec` was refused.
#[derive(Clone, Debug, PartialEq)]
pub enum SpecError {
    /// An output side is 0 or over `MAX_OUTPUT_SIDE`.
    OutputSize {
        /// Requested height.
        height: u32,
        /// Requested width.
        width: u32,
    },
    /// `scale` is not `0 < lo <= hi` (finite).
    Scale(f64, f64),
    /// `ratio` is not `0 < lo <= hi` (finite).
    Ratio(f64, f64),
    /// `Center`'s `resize` is smaller than the output's longer side, so the
    /// centre crop would need padding.
    ResizeTooSmall {
        /// The shorter side after the resize.
        resize: u32,
        /// The output's longer side it must reach.
        needed: u32,
    },
    /// `max_pixels` is 0.
    MaxPixels,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpecError::OutputSize { height, width } => write!(
                f,
                "output size {height}x{width} (h x w): each side must be 1..={MAX_OUTPUT_SIDE}"
            ),
            SpecError::Scale(lo, hi) => write!(
                f,
                "crop scale ({lo}, {hi}): needs 0 < lo <= hi, e.g. (0.08, 1.0)"
            ),
            SpecError::Ratio(lo, hi) => write!(
                f,
                "crop ratio ({lo}, {hi}): needs 0 < lo <= hi, e.g. (0.75, 1.3333)"
            ),
            SpecError::ResizeTooSmall { resize, needed } => write!(
                f,
                "resize {resize} is smaller than the centre crop's side {needed}: use a resize of at least {needed}"
            ),
            SpecError::MaxPixels => write!(f, "max_pixels is 0: give a positive pixel limit"),
        }
    }
}

impl std::error::Error for SpecError {}

fn valid_range(lo: f64, hi: f64) -> bool {
    lo.is_finite() && hi.is_finite() && lo > 0.0 && lo <= hi
}

impl ImageSpec {
    /// Checks and makes a spec: output `height` x `width`, 3 uint8 channels.
    pub fn new(
        height: u32,
        width: u32,
        layout: Layout,
        crop: Crop,
        flip: bool,
        max_pixels: u64,
    ) -> Result<Self, SpecError> {
        let side_ok = |s: u32| (1..=MAX_OUTPUT_SIDE).contains(&s);
        if !side_ok(height) || !side_ok(width) {
            return Err(SpecError::OutputSize { height, width });
        }
        match crop {
            Crop::RandomResized { scale, ratio } => {
                if !valid_range(scale.0, scale.1) {
                    return Err(SpecError::Scale(scale.0, scale.1));
                }
                if !valid_range(ratio.0, ratio.1) {
                    return Err(SpecError::Ratio(ratio.0, ratio.1));
                }
            }
            Crop::Center { resize } => {
                let needed = height.max(width);
                if resize < needed {
                    return Err(SpecError::ResizeTooSmall { resize, needed });
                }
            }
        }
        if max_pixels == 0 {
            return Err(SpecError::MaxPixels);
        }
        Ok(ImageSpec {
            height,
            width,
            layout,
            crop,
            flip,
            max_pixels,
        })
    }

    /// Output height in pixels.
    pub fn height(&self) -> u32 {
        self.height
    }
    /// Output width in pixels.
    pub fn width(&self) -> u32 {
        self.width
    }
    /// Output channel layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }
    /// The crop.
    pub fn crop(&self) -> Crop {
        self.crop
    }
    /// Whether a seeded horizontal flip (p = 0.5) is applied.
    pub fn flip(&self) -> bool {
        self.flip
    }
    /// The most pixels a source image may have.
    pub fn max_pixels(&self) -> u64 {
        self.max_pixels
    }
    /// Bytes of one output image: `height * width * 3`.
    pub fn output_len(&self) -> usize {
        self.height as usize * self.width as usize * 3
    }
}
