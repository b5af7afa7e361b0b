//! `Decoder`: one per decode thread. Bytes in, exactly `h * w * 3` uint8 RGB
//! out, cropped, resized (antialiased bilinear, as torchvision's
//! `antialias=True` and Pillow's BILINEAR), flipped and laid out as the spec
//! says. A decode's memory is taken from a `MemoryBudget` before anything is
//! allocated, sized from the image's headers; its pixel buffers go back to
//! the budget as spares, so the steady state allocates no pixel buffer (the
//! format decoders still make their own per-image state; docs/images.md).

use std::sync::Arc;

use fast_image_resize::images::{CroppedImage, Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use crate::budget::{MemoryBudget, TakeError, DEFAULT_MEMORY_BUDGET};
use crate::crop::{crop_box, CropBox};
use crate::error::{DecodeError, Format};
use crate::formats::{decode_source, probe, sniff};
use crate::probe::Probe;
use crate::spec::{ImageSpec, Layout};

/// What `decode_into` found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageInfo {
    /// The source's format, from its magic bytes.
    pub format: Format,
    /// The source's width in pixels.
    pub width: u32,
    /// The source's height in pixels.
    pub height: u32,
    /// The box that became the output (see `CropBox` for its frame).
    pub crop: CropBox,
    /// The bytes of the memory budget this decode held: its headers' bound
    /// on what the decode allocates at once.
    pub memory_bytes: u64,
}

/// Decodes images into fixed-shape outputs. Its memory comes from a
/// `MemoryBudget` (its own, `DEFAULT_MEMORY_BUDGET`, or one shared with
/// other decoders): a decode takes what its headers say it needs before
/// it allocates, and its buffers go back to the budget for reuse.
pub struct Decoder {
    budget: Arc<MemoryBudget>,
    resizer: Resizer,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::new()
    }
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

/// The resizer's errors are unreachable with the sizes checked before it
/// runs; kept an error, never a panic.
fn resize_error(format: Format) -> impl Fn(&dyn std::fmt::Display) -> DecodeError {
    move |what| DecodeError::Unsupported {
        format,
        what: format!("resize: {what}"),
    }
}

/// Source pixels a crop box reads (in the source's frame).
fn source_box(crop: &CropBox, width: u32, height: u32) -> (u64, u64) {
    match crop.resized {
        None => (u64::from(crop.w), u64::from(crop.h)),
        Some((rw, rh)) => (
            (u64::from(crop.w) * u64::from(width)).div_ceil(u64::from(rw.max(1))) + 2,
            (u64::from(crop.h) * u64::from(height)).div_ceil(u64::from(rh.max(1))) + 2,
        ),
    }
}

/// The resizer's own memory for `crop` into `spec`'s output: its
/// intermediate image (vertical pass first: the box's columns by the
/// output's rows, RGB8) and the filter coefficients of both passes.
fn resize_bytes(spec: &ImageSpec, crop: &CropBox, width: u32, height: u32) -> u64 {
    let (bw, bh) = source_box(crop, width, height);
    let (ow, oh) = (u64::from(spec.width()), u64::from(spec.height()));
    let taps = |from: u64, to: u64| to * (2 * from.div_ceil(to.max(1)) + 3) * 16;
    (bw + 1) * oh * 3 + taps(bw, ow) + taps(bh, oh) + (64 << 10)
}

impl Decoder {
    /// A decoder with a budget of its own (`DEFAULT_MEMORY_BUDGET`).
    pub fn new() -> Decoder {
        Decoder::with_budget(Arc::new(MemoryBudget::new(DEFAULT_MEMORY_BUDGET)))
    }

    /// A decoder whose decodes take their memory from `budget`, shared
    /// with any other decoder given it: all of them together never hold
    /// more than `budget.total()`.
    pub fn with_budget(budget: Arc<MemoryBudget>) -> Decoder {
        Decoder {
            budget,
            resizer: Resizer::new(),
        }
    }

    /// The budget this decoder takes from.
    pub fn budget(&self) -> &Arc<MemoryBudget> {
        &self.budget
    }

    /// Decodes `bytes` (JPEG, PNG or WebP) and writes sample `index` of
    /// `epoch` (seeded `seed`) into `out` as `spec` says: exactly
    /// `spec.output_len()` bytes, every one written on success. On error
    /// `out` holds unspecified bytes (use `zero_fill` to stand in a zero image).
    pub fn decode_into(
        &mut self,
        bytes: &[u8],
        spec: &ImageSpec,
        seed: u64,
        epoch: u64,
        index: u64,
        out: &mut [u8],
    ) -> Result<ImageInfo, DecodeError> {
        self.decode_into_unless(bytes, spec, seed, epoch, index, out, &|| false)
    }

    /// `decode_into`, giving up with `DecodeError::Stopped` if `stopped()`
    /// becomes true while the decode waits for memory.
    #[allow(clippy::too_many_arguments)]
    pub fn decode_into_unless(
        &mut self,
        bytes: &[u8],
        spec: &ImageSpec,
        seed: u64,
        epoch: u64,
        index: u64,
        out: &mut [u8],
        stopped: &dyn Fn() -> bool,
    ) -> Result<ImageInfo, DecodeError> {
        if out.len() != spec.output_len() {
            return Err(DecodeError::OutputSize {
                expected: spec.output_len(),
                got: out.len(),
            });
        }
        let format = sniff(bytes)?;
        let probe = probe(format, bytes, spec.max_pixels())?;
        let crop = crop_box(spec, seed, epoch, index, probe.width, probe.height);
        let result = self.decode_probed(format, bytes, spec, &probe, crop, out, stopped);
        // The intermediate image was counted in this decode's grant only.
        self.resizer.reset_internal_buffers();
        result
    }

    /// Takes the decode's memory from the budget, decodes, crops and resizes.
    #[allow(clippy::too_many_arguments)]
    fn decode_probed(
        &mut self,
        format: Format,
        bytes: &[u8],
        spec: &ImageSpec,
        probe: &Probe,
        crop: CropBox,
        out: &mut [u8],
        stopped: &dyn Fn() -> bool,
    ) -> Result<ImageInfo, DecodeError> {
        let need = probe.need;
        let hwc_len = match spec.layout() {
            Layout::Hwc => 0,
            Layout::Chw => spec.output_len(),
        };
        let others =
            need.decoder_bytes
                .saturating_add(resize_bytes(spec, &crop, probe.width, probe.height));
        let memory_bytes = others
            .saturating_add(need.source_bytes)
            .saturating_add(hwc_len as u64);
        if memory_bytes > self.budget.total() {
            return Err(DecodeError::OverBudget {
                format,
                width: probe.width,
                height: probe.height,
                needed: memory_bytes,
                budget: self.budget.total(),
            });
        }
        let source_len =
            usize::try_from(need.source_bytes).map_err(|_| DecodeError::OutOfMemory {
                bytes: need.source_bytes,
            })?;
        let mut grant = self
            .budget
            .take(others, &[source_len, hwc_len], stopped)
            .map_err(|TakeError::Stopped| DecodeError::Stopped)?;
        let (source, hwc) = grant
            .buffers2((source_len, hwc_len))
            .map_err(|len| DecodeError::OutOfMemory { bytes: len as u64 })?;
        decode_source(format, bytes, probe, source)?;
        let rgb_len = probe.width as usize * probe.height as usize * 3;
        let src = ImageRef::new(
            probe.width,
            probe.height,
            &source[..rgb_len],
            PixelType::U8x3,
        )
        .map_err(|e| resize_error(format)(&e))?;
        let dst: &mut [u8] = match spec.layout() {
            Layout::Hwc => &mut *out,
            Layout::Chw => &mut *hwc,
        };
        resize_crop(&mut self.resizer, &src, &crop, spec, dst, format)?;
        if crop.flip {
            flip_rows(dst, spec.width() as usize);
        }
        if spec.layout() == Layout::Chw {
            let pixels = spec.width() as usize * spec.height() as usize;
            hwc_to_chw(hwc, out, pixels);
        }
        Ok(ImageInfo {
            format,
            width: probe.width,
            height: probe.height,
            crop,
            memory_bytes,
        })
    }
}

/// Resizes `crop` of `source` into `dst` (HWC RGB8, the spec's size).
fn resize_crop(
    resizer: &mut Resizer,
    source: &ImageRef<'_>,
    crop: &CropBox,
    spec: &ImageSpec,
    dst: &mut [u8],
    format: Format,
) -> Result<(), DecodeError> {
    let mut dst = Image::from_slice_u8(spec.width(), spec.height(), dst, PixelType::U8x3)
        .map_err(|e| resize_error(format)(&e))?;
    let bilinear = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
    match crop.resized {
        // RandomResizedCrop: crop, then resize the crop alone (the filter
        // sees nothing outside the box, as torchvision's crop followed by
        // resize).
        None => {
            let view = CroppedImage::new(source, crop.x, crop.y, crop.w, crop.h)
                .map_err(|e| resize_error(format)(&e))?;
            resizer
                .resize(&view, &mut dst, &bilinear)
                .map_err(|e| resize_error(format)(&e))
        }
        // Resize then CenterCrop, done as one resize of the box mapped back
        // to the source: the same filter taps as resizing the whole image
        // and cropping, for the output pixels only.
        Some((rw, rh)) => {
            let sx = f64::from(source.width()) / f64::from(rw);
            let sy = f64::from(source.height()) / f64::from(rh);
            let options = bilinear.crop(
                f64::from(crop.x) * sx,
                f64::from(crop.y) * sy,
                f64::from(crop.w) * sx,
                f64::from(crop.h) * sy,
            );
            resizer
                .resize(source, &mut dst, &options)
                .map_err(|e| resize_error(format)(&e))
        }
    }
}

/// Mirrors each row of an RGB8 HWC image left to right, in place.
fn flip_rows(hwc: &mut [u8], width: usize) {
    for row in hwc.chunks_exact_mut(width * 3) {
        let (mut l, mut r) = (0, width.saturating_sub(1));
        while l < r {
            for c in 0..3 {
                row.swap(l * 3 + c, r * 3 + c);
            }
            l += 1;
            r -= 1;
        }
    }
}

/// HWC RGB8 to three planes.
fn hwc_to_chw(hwc: &[u8], chw: &mut [u8], pixels: usize) {
    let (r, rest) = chw.split_at_mut(pixels);
    let (g, b) = rest.split_at_mut(pixels);
    for (((px, r), g), b) in hwc.chunks_exact(3).zip(r).zip(g).zip(b) {
        *r = px[0];
        *g = px[1];
        *b = px[2];
    }
}

/// Writes the zero image (every byte 0) that `--on-bad-sample zero` stands
/// in for a sample that did not decode.
pub fn zero_fill(out: &mut [u8]) {
    out.fill(0);
}

#[cfg(test)]
#[path = "decoder_tests.rs"]
mod tests;
