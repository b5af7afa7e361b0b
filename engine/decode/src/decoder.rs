//! `Decoder`: one per decode thread. Bytes in, exactly `h * w * 3` uint8 RGB
//! out, cropped, resized (antialiased bilinear, as torchvision's
//! `antialias=True` and Pillow's BILINEAR), flipped and laid out as the spec
//! says. Its buffers are kept between images, so the steady state allocates
//! nothing of its own (the format decoders still make their small per-image
//! tables; docs/images.md).

use fast_image_resize::images::{CroppedImage, Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use crate::crop::{crop_box, CropBox};
use crate::error::{DecodeError, Format};
use crate::formats::{decode_rgb, scratch, sniff};
use crate::spec::{ImageSpec, Layout};

/// A buffer over this many bytes is released after the image that grew it,
/// so one huge source does not pin its memory in every thread for the run.
const KEEP_BYTES_MAX: usize = 64 << 20;

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
}

/// Decodes images into fixed-shape outputs, reusing its buffers.
pub struct Decoder {
    /// The full decoded source, RGB8.
    rgb: Vec<u8>,
    /// The source in its own channels (gray, gray+alpha, RGBA) before RGB.
    raw: Vec<u8>,
    /// The resized output in HWC, when the output is CHW.
    hwc: Vec<u8>,
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
            .field("rgb_bytes", &self.rgb.len())
            .field("raw_bytes", &self.raw.len())
            .field("hwc_bytes", &self.hwc.len())
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

impl Decoder {
    /// A decoder with empty buffers; they grow to the largest image seen
    /// (up to `KEEP_BYTES_MAX` kept).
    pub fn new() -> Decoder {
        Decoder {
            rgb: Vec::new(),
            raw: Vec::new(),
            hwc: Vec::new(),
            resizer: Resizer::new(),
        }
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
        if out.len() != spec.output_len() {
            return Err(DecodeError::OutputSize {
                expected: spec.output_len(),
                got: out.len(),
            });
        }
        let format = sniff(bytes)?;
        let result = self.decode_sniffed(format, bytes, spec, seed, epoch, index, out);
        self.release_if_huge();
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn decode_sniffed(
        &mut self,
        format: Format,
        bytes: &[u8],
        spec: &ImageSpec,
        seed: u64,
        epoch: u64,
        index: u64,
        out: &mut [u8],
    ) -> Result<ImageInfo, DecodeError> {
        let src = decode_rgb(
            format,
            bytes,
            spec.max_pixels(),
            &mut self.rgb,
            &mut self.raw,
        )?;
        let crop = crop_box(spec, seed, epoch, index, src.width, src.height);
        let (out_w, out_h) = (spec.width(), spec.height());
        let src_len = src.width as usize * src.height as usize * 3;
        let source = ImageRef::new(src.width, src.height, &self.rgb[..src_len], PixelType::U8x3)
            .map_err(|e| resize_error(format)(&e))?;
        let hwc: &mut [u8] = match spec.layout() {
            Layout::Hwc => out,
            Layout::Chw => scratch(&mut self.hwc, spec.output_len()),
        };
        let mut dst = Image::from_slice_u8(out_w, out_h, hwc, PixelType::U8x3)
            .map_err(|e| resize_error(format)(&e))?;
        let bilinear =
            ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
        match crop.resized {
            // RandomResizedCrop: crop, then resize the crop alone (the
            // filter sees nothing outside the box, as torchvision's crop
            // followed by resize).
            None => {
                let view = CroppedImage::new(&source, crop.x, crop.y, crop.w, crop.h)
                    .map_err(|e| resize_error(format)(&e))?;
                self.resizer
                    .resize(&view, &mut dst, &bilinear)
                    .map_err(|e| resize_error(format)(&e))?;
            }
            // Resize then CenterCrop, done as one resize of the box mapped
            // back to the source: the same filter taps as resizing the whole
            // image and cropping, for the output pixels only.
            Some((rw, rh)) => {
                let sx = f64::from(src.width) / f64::from(rw);
                let sy = f64::from(src.height) / f64::from(rh);
                let options = bilinear.crop(
                    f64::from(crop.x) * sx,
                    f64::from(crop.y) * sy,
                    f64::from(crop.w) * sx,
                    f64::from(crop.h) * sy,
                );
                self.resizer
                    .resize(&source, &mut dst, &options)
                    .map_err(|e| resize_error(format)(&e))?;
            }
        }
        let hwc = dst.buffer_mut();
        if crop.flip {
            flip_rows(hwc, out_w as usize);
        }
        if spec.layout() == Layout::Chw {
            hwc_to_chw(
                &self.hwc[..spec.output_len()],
                out,
                out_w as usize * out_h as usize,
            );
        }
        Ok(ImageInfo {
            format,
            width: src.width,
            height: src.height,
            crop,
        })
    }

    fn release_if_huge(&mut self) {
        for buf in [&mut self.rgb, &mut self.raw] {
            if buf.capacity() > KEEP_BYTES_MAX {
                *buf = Vec::new();
            }
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
