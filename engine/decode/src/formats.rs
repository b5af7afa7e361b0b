//! Bytes to a full-size RGB8 image: format by magic bytes, dimensions from
//! the header and the pixel limit checked before any pixel buffer exists,
//! then the format's decoder (zune-jpeg, png, image-webp; docs/images.md
//! says why these).

use std::io::Cursor;

use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;
use zune_jpeg::errors::DecodeErrors;
use zune_jpeg::JpegDecoder;

use crate::error::{hex_prefix, DecodeError, Format};

const JPEG_MAGIC: &[u8] = &[0xFF, 0xD8, 0xFF];
const PNG_MAGIC: &[u8] = &[0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];
/// JPEG sides are 16-bit; let zune accept all of them so that `max_pixels`
/// alone decides (zune's own default is 16,384 a side).
const JPEG_MAX_SIDE: usize = 65_535;

/// Which format `bytes` start as.
pub(crate) fn sniff(bytes: &[u8]) -> Result<Format, DecodeError> {
    if bytes.starts_with(JPEG_MAGIC) {
        return Ok(Format::Jpeg);
    }
    if bytes.starts_with(PNG_MAGIC) {
        return Ok(Format::Png);
    }
    if bytes.len() >= 12 && &bytes[0..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        return Ok(Format::WebP);
    }
    // A prefix of a magic is an image cut short, not a stranger.
    let nonempty_prefix_of = |magic: &[u8]| !bytes.is_empty() && magic.starts_with(bytes);
    if nonempty_prefix_of(JPEG_MAGIC) {
        return Err(DecodeError::Truncated {
            format: Format::Jpeg,
        });
    }
    if nonempty_prefix_of(PNG_MAGIC) {
        return Err(DecodeError::Truncated {
            format: Format::Png,
        });
    }
    if bytes.len() < 12 && b"RIFF".starts_with(&bytes[..bytes.len().min(4)]) && !bytes.is_empty() {
        return Err(DecodeError::Truncated {
            format: Format::WebP,
        });
    }
    Err(DecodeError::NotAnImage {
        first_bytes: hex_prefix(bytes),
    })
}

/// Refuses `width * height > limit`, and a zero side (corrupt).
pub(crate) fn check_pixels(
    format: Format,
    width: u64,
    height: u64,
    limit: u64,
) -> Result<(), DecodeError> {
    if width == 0 || height == 0 {
        return Err(DecodeError::Corrupt {
            format,
            what: format!("header says {width}x{height} pixels"),
        });
    }
    if width.saturating_mul(height) > limit {
        return Err(DecodeError::TooManyPixels {
            width,
            height,
            limit,
        });
    }
    Ok(())
}

/// `buf[..len]`, growing `buf` only when it is shorter (steady state: no
/// allocation and no clearing; the decoder overwrites every byte).
pub(crate) fn scratch(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buf.len() < len {
        buf.resize(len, 0);
    }
    &mut buf[..len]
}

/// A decoded image in `rgb[..w * h * 3]`.
pub(crate) struct Decoded {
    pub(crate) width: u32,
    pub(crate) height: u32,
}

/// Decodes `bytes` (already sniffed as `format`) into `rgb`, using `raw` for
/// sources with other channel counts.
pub(crate) fn decode_rgb(
    format: Format,
    bytes: &[u8],
    max_pixels: u64,
    rgb: &mut Vec<u8>,
    raw: &mut Vec<u8>,
) -> Result<Decoded, DecodeError> {
    match format {
        Format::Jpeg => decode_jpeg(bytes, max_pixels, rgb),
        Format::Png => decode_png(bytes, max_pixels, rgb, raw),
        Format::WebP => decode_webp(bytes, max_pixels, rgb, raw),
    }
}

fn jpeg_error(e: DecodeErrors) -> DecodeError {
    let format = Format::Jpeg;
    match e {
        DecodeErrors::ExhaustedData | DecodeErrors::IoErrors(_) => {
            DecodeError::Truncated { format }
        }
        DecodeErrors::Unsupported(scheme) => DecodeError::Unsupported {
            format,
            what: format!("{scheme:?}"),
        },
        other => DecodeError::Corrupt {
            format,
            what: jpeg_what(&other),
        },
    }
}

/// zune's messages, first line, bounded (some carry input-derived text).
fn jpeg_what(e: &DecodeErrors) -> String {
    let text = format!("{e:?}");
    let line = text.lines().next().unwrap_or("");
    line.chars().take(120).collect()
}

/// libjpeg and Pillow call a JPEG whose last scan has no end-of-image
/// marker after it truncated; zune fills the missing rows instead. The
/// last `FF D9` (end of image) must exist with no `FF DA` (start of scan)
/// after it: an EXIF thumbnail's own end marker comes before the main
/// image's scans. Searched from the end, so a whole JPEG costs a few bytes.
pub(crate) fn jpeg_has_end(bytes: &[u8]) -> bool {
    let is = |w: &[u8], marker: u8| w[0] == 0xFF && w[1] == marker;
    match bytes.windows(2).rposition(|w| is(w, 0xD9)) {
        Some(eoi) => !bytes[eoi..].windows(2).any(|w| is(w, 0xDA)),
        None => false,
    }
}

fn decode_jpeg(bytes: &[u8], max_pixels: u64, rgb: &mut Vec<u8>) -> Result<Decoded, DecodeError> {
    let options = DecoderOptions::default()
        .jpeg_set_out_colorspace(ColorSpace::RGB)
        .set_max_width(JPEG_MAX_SIDE)
        .set_max_height(JPEG_MAX_SIDE);
    let mut decoder = JpegDecoder::new_with_options(ZCursor::new(bytes), options);
    decoder.decode_headers().map_err(jpeg_error)?;
    let Some((w, h)) = decoder.dimensions() else {
        return Err(DecodeError::Corrupt {
            format: Format::Jpeg,
            what: "no frame header".into(),
        });
    };
    check_pixels(Format::Jpeg, w as u64, h as u64, max_pixels)?;
    if !jpeg_has_end(bytes) {
        return Err(DecodeError::Truncated {
            format: Format::Jpeg,
        });
    }
    if decoder.output_colorspace() != Some(ColorSpace::RGB) {
        let what = format!("{:?} output", decoder.input_colorspace());
        return Err(DecodeError::Unsupported {
            format: Format::Jpeg,
            what,
        });
    }
    let out = scratch(rgb, w * h * 3);
    decoder.decode_into(out).map_err(jpeg_error)?;
    Ok(Decoded {
        width: w as u32,
        height: h as u32,
    })
}

/// (width, height) from the IHDR chunk, which PNG requires first.
fn png_header_dims(bytes: &[u8]) -> Result<(u64, u64), DecodeError> {
    let format = Format::Png;
    if bytes.len() < 24 {
        return Err(DecodeError::Truncated { format });
    }
    if &bytes[12..16] != b"IHDR" {
        return Err(DecodeError::Corrupt {
            format,
            what: "first chunk is not IHDR".into(),
        });
    }
    let be = |b: &[u8]| u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    Ok((be(&bytes[16..20]), be(&bytes[20..24])))
}

fn png_error(e: png::DecodingError) -> DecodeError {
    let format = Format::Png;
    match e {
        png::DecodingError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            DecodeError::Truncated { format }
        }
        png::DecodingError::LimitsExceeded => DecodeError::Unsupported {
            format,
            what: "needs more memory than the pixel limit allows".into(),
        },
        other => {
            let text = other.to_string();
            DecodeError::Corrupt {
                format,
                what: text.chars().take(120).collect(),
            }
        }
    }
}

fn decode_png(
    bytes: &[u8],
    max_pixels: u64,
    rgb: &mut Vec<u8>,
    raw: &mut Vec<u8>,
) -> Result<Decoded, DecodeError> {
    let (w, h) = png_header_dims(bytes)?;
    check_pixels(Format::Png, w, h, max_pixels)?;
    // Bounded by the pixel limit: the decoder's own buffers (rows, zlib
    // window, palette) come well under 8 bytes per allowed pixel.
    let limit_bytes = usize::try_from(max_pixels.saturating_mul(8)).unwrap_or(usize::MAX);
    let mut decoder =
        png::Decoder::new_with_limits(Cursor::new(bytes), png::Limits { bytes: limit_bytes });
    // Palette and low bit depths become 8-bit samples, 16-bit samples keep
    // their high byte (as Pillow's RGB;16B unpacker does).
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().map_err(png_error)?;
    let (color, _) = reader.output_color_type();
    let Some(len) = reader.output_buffer_size() else {
        return Err(DecodeError::TooManyPixels {
            width: w,
            height: h,
            limit: max_pixels,
        });
    };
    let pixels = (w * h) as usize;
    if color == png::ColorType::Rgb {
        reader.next_frame(scratch(rgb, len)).map_err(png_error)?;
    } else {
        let src = scratch(raw, len);
        reader.next_frame(src).map_err(png_error)?;
        let channels = match color {
            png::ColorType::Grayscale => 1,
            png::ColorType::GrayscaleAlpha => 2,
            png::ColorType::Rgba => 4,
            other => {
                let what = format!("{other:?} output after expansion");
                return Err(DecodeError::Unsupported {
                    format: Format::Png,
                    what,
                });
            }
        };
        to_rgb(
            &src[..pixels * channels],
            channels,
            scratch(rgb, pixels * 3),
        );
    }
    Ok(Decoded {
        width: w as u32,
        height: h as u32,
    })
}

/// Gray, gray+alpha or RGBA samples to RGB: gray is copied to the three
/// channels and alpha is dropped, as Pillow's `convert("RGB")` does.
fn to_rgb(src: &[u8], channels: usize, dst: &mut [u8]) {
    match channels {
        1 => {
            for (d, &g) in dst.chunks_exact_mut(3).zip(src) {
                d.fill(g);
            }
        }
        2 => {
            for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(2)) {
                d.fill(s[0]);
            }
        }
        _ => {
            for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(4)) {
                d.copy_from_slice(&s[..3]);
            }
        }
    }
}

fn webp_error(e: image_webp::DecodingError) -> DecodeError {
    let format = Format::WebP;
    match e {
        image_webp::DecodingError::IoError(io)
            if io.kind() == std::io::ErrorKind::UnexpectedEof =>
        {
            DecodeError::Truncated { format }
        }
        image_webp::DecodingError::UnsupportedFeature(what) => {
            DecodeError::Unsupported { format, what }
        }
        other => {
            let text = other.to_string();
            DecodeError::Corrupt {
                format,
                what: text.chars().take(120).collect(),
            }
        }
    }
}

fn decode_webp(
    bytes: &[u8],
    max_pixels: u64,
    rgb: &mut Vec<u8>,
    raw: &mut Vec<u8>,
) -> Result<Decoded, DecodeError> {
    let mut decoder = image_webp::WebPDecoder::new(Cursor::new(bytes)).map_err(webp_error)?;
    let (w, h) = decoder.dimensions();
    let (w64, h64) = (u64::from(w), u64::from(h));
    check_pixels(Format::WebP, w64, h64, max_pixels)?;
    decoder.set_memory_limit(usize::try_from(max_pixels.saturating_mul(8)).unwrap_or(usize::MAX));
    let Some(len) = decoder.output_buffer_size() else {
        return Err(DecodeError::TooManyPixels {
            width: w64,
            height: h64,
            limit: max_pixels,
        });
    };
    let pixels = w as usize * h as usize;
    if decoder.has_alpha() {
        let src = scratch(raw, len);
        decoder.read_image(src).map_err(webp_error)?;
        to_rgb(&src[..pixels * 4], 4, scratch(rgb, pixels * 3));
    } else {
        decoder.read_image(scratch(rgb, len)).map_err(webp_error)?;
    }
    Ok(Decoded {
        width: w,
        height: h,
    })
}
