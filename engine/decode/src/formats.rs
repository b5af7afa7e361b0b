//! Bytes to a full-size RGB8 image: format by magic bytes, dimensions and
//! cost from the headers (`probe`) with the pixel limit checked before any
//! pixel buffer exists, then the format's decoder (zune-jpeg, png,
//! image-webp; docs/images.md says why these) into a buffer the memory
//! budget lent.

use std::io::Cursor;

use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;
use zune_jpeg::errors::DecodeErrors;
use zune_jpeg::JpegDecoder;

use crate::error::{hex_prefix, DecodeError, Format};
use crate::probe::{
    check_pixels, jpeg_frame, jpeg_need, png_probe, webp_probe, JpegFrame, Probe, PNG_METADATA_MAX,
};

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

/// An image's dimensions and cost from its headers, the pixel limit
/// checked (and every WebP frame against its canvas), before any decode.
pub(crate) fn probe(format: Format, bytes: &[u8], max_pixels: u64) -> Result<Probe, DecodeError> {
    match format {
        Format::Jpeg => probe_jpeg(bytes, max_pixels),
        Format::Png => {
            let p = png_probe(bytes)?;
            check_pixels(Format::Png, p.width.into(), p.height.into(), max_pixels)?;
            Ok(p)
        }
        Format::WebP => webp_probe(bytes, max_pixels),
    }
}

fn probe_jpeg(bytes: &[u8], max_pixels: u64) -> Result<Probe, DecodeError> {
    let frame = match jpeg_frame(bytes) {
        Some(f) => f,
        // Our walk found no frame: zune says what is wrong, or where the
        // frame is (then counted as the costliest kind: progressive, four
        // full-resolution components).
        None => {
            let mut decoder = JpegDecoder::new_with_options(ZCursor::new(bytes), jpeg_options());
            decoder.decode_headers().map_err(jpeg_error)?;
            let Some((w, h)) = decoder.dimensions() else {
                return Err(DecodeError::Corrupt {
                    format: Format::Jpeg,
                    what: "no frame header".into(),
                });
            };
            JpegFrame {
                width: w as u32,
                height: h as u32,
                progressive: true,
                components: 4,
                factors: [(1, 1); 4],
                first_scan_components: 4,
            }
        }
    };
    check_pixels(
        Format::Jpeg,
        frame.width.into(),
        frame.height.into(),
        max_pixels,
    )?;
    Ok(Probe {
        width: frame.width,
        height: frame.height,
        need: jpeg_need(&frame, bytes.len()),
    })
}

/// Decodes `bytes` (already sniffed as `format` and probed as `probe`)
/// into `source`: `width * height * source_bpp` bytes, of which the first
/// `width * height * 3` hold the image as RGB8 on success.
pub(crate) fn decode_source(
    format: Format,
    bytes: &[u8],
    probe: &Probe,
    source: &mut [u8],
) -> Result<(), DecodeError> {
    match format {
        Format::Jpeg => decode_jpeg(bytes, probe, source),
        Format::Png => decode_png(bytes, probe, source),
        Format::WebP => decode_webp(bytes, probe, source),
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

fn jpeg_options() -> DecoderOptions {
    DecoderOptions::default()
        .jpeg_set_out_colorspace(ColorSpace::RGB)
        .set_max_width(JPEG_MAX_SIDE)
        .set_max_height(JPEG_MAX_SIDE)
}

fn decode_jpeg(bytes: &[u8], probe: &Probe, source: &mut [u8]) -> Result<(), DecodeError> {
    if !jpeg_has_end(bytes) {
        return Err(DecodeError::Truncated {
            format: Format::Jpeg,
        });
    }
    let mut decoder = JpegDecoder::new_with_options(ZCursor::new(bytes), jpeg_options());
    decoder.decode_headers().map_err(jpeg_error)?;
    if decoder.dimensions() != Some((probe.width as usize, probe.height as usize)) {
        // Our walk and zune's disagree about which frame counts: refuse
        // rather than decode dimensions nobody checked.
        return Err(DecodeError::Corrupt {
            format: Format::Jpeg,
            what: "its frame headers disagree about its size".into(),
        });
    }
    if decoder.output_colorspace() != Some(ColorSpace::RGB) {
        let what = format!("{:?} output", decoder.input_colorspace());
        return Err(DecodeError::Unsupported {
            format: Format::Jpeg,
            what,
        });
    }
    let len = probe.width as usize * probe.height as usize * 3;
    decoder
        .decode_into(&mut source[..len])
        .map_err(jpeg_error)?;
    Ok(())
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

fn decode_png(bytes: &[u8], probe: &Probe, source: &mut [u8]) -> Result<(), DecodeError> {
    let format = Format::Png;
    let width = probe.width as usize;
    // The decoder's own allocations besides the image: a row, and the
    // metadata chunks it keeps (eXIf, palette) up to a cap. ICC profiles
    // and text are skipped unread: a 1x1 PNG whose iCCP inflates to 700 MB
    // costs nothing (issue 36).
    let limits = png::Limits {
        bytes: width * 8 + PNG_METADATA_MAX as usize,
    };
    let mut decoder = png::Decoder::new_with_limits(Cursor::new(bytes), limits);
    decoder.set_ignore_iccp_chunk(true);
    decoder.set_ignore_text_chunk(true);
    // Palette and low bit depths become 8-bit samples, 16-bit samples keep
    // their high byte (as Pillow's RGB;16B unpacker does).
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().map_err(png_error)?;
    let (color, _) = reader.output_color_type();
    let channels = match color {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => {
            let what = format!("{other:?} output after expansion");
            return Err(DecodeError::Unsupported { format, what });
        }
    };
    let pixels = width * probe.height as usize;
    let len = reader.output_buffer_size();
    if len != Some(pixels * channels) || source.len() < pixels * channels.max(3) {
        // The chunks before the image data changed what the header said.
        return Err(DecodeError::Corrupt {
            format,
            what: "its chunks disagree about its layout".into(),
        });
    }
    reader
        .next_frame(&mut source[..pixels * channels])
        .map_err(png_error)?;
    to_rgb_in_place(source, pixels, channels);
    Ok(())
}

/// Gray, gray+alpha or RGBA samples in `buf[..pixels * channels]` to RGB
/// in `buf[..pixels * 3]`, in place: gray is copied to the three channels
/// and alpha is dropped, as Pillow's `convert("RGB")` does. Widening runs
/// from the last pixel back, narrowing from the first on, so no sample is
/// overwritten before it is read.
fn to_rgb_in_place(buf: &mut [u8], pixels: usize, channels: usize) {
    match channels {
        1 => {
            for i in (0..pixels).rev() {
                let g = buf[i];
                buf[i * 3..i * 3 + 3].fill(g);
            }
        }
        2 => {
            for i in (0..pixels).rev() {
                let g = buf[i * 2];
                buf[i * 3..i * 3 + 3].fill(g);
            }
        }
        4 => {
            for i in 0..pixels {
                buf.copy_within(i * 4..i * 4 + 3, i * 3);
            }
        }
        _ => {}
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

fn decode_webp(bytes: &[u8], probe: &Probe, source: &mut [u8]) -> Result<(), DecodeError> {
    let mut decoder = image_webp::WebPDecoder::new(Cursor::new(bytes)).map_err(webp_error)?;
    if decoder.dimensions() != (probe.width, probe.height) {
        return Err(DecodeError::Corrupt {
            format: Format::WebP,
            what: "its headers disagree about its size".into(),
        });
    }
    // Metadata (ICC, EXIF, XMP) is never asked for, so never read.
    decoder.set_memory_limit(PNG_METADATA_MAX as usize);
    let pixels = probe.width as usize * probe.height as usize;
    let channels = if decoder.has_alpha() { 4 } else { 3 };
    if decoder.output_buffer_size() != Some(pixels * channels) || source.len() < pixels * channels {
        return Err(DecodeError::Corrupt {
            format: Format::WebP,
            what: "its headers disagree about its channels".into(),
        });
    }
    decoder
        .read_image(&mut source[..pixels * channels])
        .map_err(webp_error)?;
    to_rgb_in_place(source, pixels, channels);
    Ok(())
}
