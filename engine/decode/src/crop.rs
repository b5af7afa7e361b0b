//! Seeded crop boxes: torchvision's `RandomResizedCrop.get_params` and
//! `Resize` + `CenterCrop`, driven by a counter-based generator keyed by
//! (seed, epoch, sample index), so a box never depends on the thread, the
//! order or the world size that asked for it. docs/images.md specifies the
//! algorithm; changing a draw changes every box of every run, so don't.

use crate::spec::{Crop, ImageSpec};

/// Where the output comes from in its frame, and whether it is mirrored.
///
/// The frame is the source image for `Crop::RandomResized` (`resized` is
/// `None`), and the source resized to `resized` = (width, height) for
/// `Crop::Center`. `x`/`w` run along the width, `y`/`h` along the height.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CropBox {
    /// Left edge (torchvision's `j`).
    pub x: u32,
    /// Top edge (torchvision's `i`).
    pub y: u32,
    /// Width of the box.
    pub w: u32,
    /// Height of the box.
    pub h: u32,
    /// Mirror the output left to right (after the resize).
    pub flip: bool,
    /// `Some((width, height))`: the box is in the source resized to this
    /// size (`Crop::Center`); `None`: the box is in the source itself.
    pub resized: Option<(u32, u32)>,
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
/// "ringfeed" in ASCII: keeps seed 0 away from splitmix64's own zero state.
const DOMAIN: u64 = 0x7269_6E67_6665_6564;
/// Draws per try of RandomResizedCrop: scale, ratio, top, left.
const DRAWS_PER_TRY: u64 = 4;
const TRIES: u64 = 10;
/// The flip's draw comes after every try's, whatever the tries did.
const FLIP_DRAW: u64 = TRIES * DRAWS_PER_TRY;

/// splitmix64's output function: a bijection on u64 that mixes every bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A counter-based stream: draw `n` is a pure function of the key and `n`.
#[derive(Clone, Copy, Debug)]
struct Stream {
    key: u64,
}

impl Stream {
    fn new(seed: u64, epoch: u64, index: u64) -> Stream {
        let key = mix(mix(mix(seed ^ DOMAIN) ^ epoch) ^ index);
        Stream { key }
    }

    /// splitmix64 started at `key`: its `n`-th output (0-based).
    fn draw(&self, n: u64) -> u64 {
        mix(self
            .key
            .wrapping_add(n.wrapping_add(1).wrapping_mul(GOLDEN)))
    }

    /// Uniform in [0, 1) from the top 53 bits.
    fn unit(&self, n: u64) -> f64 {
        (self.draw(n) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [lo, hi) (torchvision's `uniform_`).
    fn uniform(&self, n: u64, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit(n)
    }

    /// Uniform integer in [0, count), count >= 1: multiply-shift, no loop.
    fn below(&self, n: u64, count: u64) -> u64 {
        ((u128::from(self.draw(n)) * u128::from(count)) >> 64) as u64
    }
}

/// Python's `int(round(v))` for the non-negative finite values used here
/// (round half to even), saturated into u32.
fn py_round(v: f64) -> u64 {
    let r = v.round_ties_even();
    if r.is_nan() || r <= 0.0 {
        0
    } else if r >= u64::MAX as f64 {
        u64::MAX
    } else {
        r as u64
    }
}

/// The crop box and flip of sample `index` in `epoch` of a run seeded `seed`,
/// for a source of `img_w` x `img_h` pixels (each at least 1).
pub fn crop_box(
    spec: &ImageSpec,
    seed: u64,
    epoch: u64,
    index: u64,
    img_w: u32,
    img_h: u32,
) -> CropBox {
    let stream = Stream::new(seed, epoch, index);
    let flip = spec.flip() && stream.draw(FLIP_DRAW) >> 63 == 1;
    let (img_w, img_h) = (img_w.max(1), img_h.max(1));
    match spec.crop() {
        Crop::RandomResized { scale, ratio } => {
            let (x, y, w, h) = random_resized(&stream, scale, ratio, img_w, img_h);
            CropBox {
                x,
                y,
                w,
                h,
                flip,
                resized: None,
            }
        }
        Crop::Center { resize } => {
            let (rw, rh) = resized_shorter_side(img_w, img_h, resize);
            let (w, h) = (spec.width(), spec.height());
            // torchvision's CenterCrop: int(round((size_in - size_out) / 2.0)).
            // The spec guarantees resize >= both output sides, so no padding.
            let x = py_round(f64::from(rw.saturating_sub(w)) / 2.0) as u32;
            let y = py_round(f64::from(rh.saturating_sub(h)) / 2.0) as u32;
            CropBox {
                x,
                y,
                w: w.min(rw),
                h: h.min(rh),
                flip,
                resized: Some((rw, rh)),
            }
        }
    }
}

/// torchvision `Resize(int)`: the shorter side becomes `size`, the longer
/// `int(size * long / short)` (truncated). Returns (width, height).
pub(crate) fn resized_shorter_side(img_w: u32, img_h: u32, size: u32) -> (u32, u32) {
    let (short, long) = if img_w <= img_h {
        (img_w, img_h)
    } else {
        (img_h, img_w)
    };
    let new_long = (u64::from(size) * u64::from(long) / u64::from(short)).min(u64::from(u32::MAX));
    let new_long = new_long as u32;
    if img_w <= img_h {
        (size, new_long)
    } else {
        (new_long, size)
    }
}

/// torchvision `RandomResizedCrop.get_params`: returns (x, y, w, h).
fn random_resized(
    stream: &Stream,
    scale: (f64, f64),
    ratio: (f64, f64),
    img_w: u32,
    img_h: u32,
) -> (u32, u32, u32, u32) {
    let (width, height) = (u64::from(img_w), u64::from(img_h));
    let area = (width * height) as f64;
    let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
    for t in 0..TRIES {
        let base = t * DRAWS_PER_TRY;
        let target_area = area * stream.uniform(base, scale.0, scale.1);
        let aspect = stream.uniform(base + 1, log_lo, log_hi).exp();
        let w = py_round((target_area * aspect).sqrt());
        let h = py_round((target_area / aspect).sqrt());
        if 0 < w && w <= width && 0 < h && h <= height {
            let y = stream.below(base + 2, height - h + 1);
            let x = stream.below(base + 3, width - w + 1);
            return (x as u32, y as u32, w as u32, h as u32);
        }
    }
    // The fallback: a centre crop clamped to the ratio bounds.
    let in_ratio = width as f64 / height as f64;
    let (w, h) = if in_ratio < ratio.0 {
        (width, py_round(width as f64 / ratio.0).clamp(1, height))
    } else if in_ratio > ratio.1 {
        (py_round(height as f64 * ratio.1).clamp(1, width), height)
    } else {
        (width, height)
    };
    (
        ((width - w) / 2) as u32,
        ((height - h) / 2) as u32,
        w as u32,
        h as u32,
    )
}

#[cfg(test)]
#[path = "crop_tests.rs"]
mod tests;
