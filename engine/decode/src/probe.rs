//! What an image will cost before any of it is decoded: its dimensions and
//! the most memory its decode can hold at once (`Need`), read from its
//! headers with no allocation. Every frame of a WebP is checked against its
//! canvas and the pixel limit here, so no decoder is handed a frame larger
//! than the header that was checked (issue 36, item 8).
//!
//! The per-format figures below are upper bounds of what the decoders
//! (zune-jpeg, png, image-webp) allocate, from reading their sources;
//! `tests/python/test_decode_memory.py` measures real peaks against them.

use crate::error::{DecodeError, Format};

/// A PNG's metadata chunks the decoder keeps (eXIf, PLTE, tRNS...) may
/// take at most this much (the rest, iCCP and text, are skipped unread).
pub(crate) const PNG_METADATA_MAX: u64 = 1 << 20;

/// Fixed allowance per decode: tables, headers, small vectors.
const FIXED_BYTES: u64 = 512 << 10;

/// A lossless WebP stream decides how many Huffman tables image-webp
/// builds (up to 65,536 groups of five); each costs at most this many
/// bytes of memory per byte of the stream that describes it.
const WEBP_LOSSLESS_BYTES_PER_STREAM_BYTE: u64 = 640;

/// The most memory one decode holds at once: its source buffer (lent by
/// the budget) and everything else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Need {
    /// The decoded source, `width * height * source_bpp` bytes.
    pub(crate) source_bytes: u64,
    /// Bytes per pixel of the source buffer: 3 (RGB), or 4 where the
    /// format gives RGBA (converted to RGB in place).
    pub(crate) source_bpp: u8,
    /// What the format's decoder allocates on its own, at most.
    pub(crate) decoder_bytes: u64,
}

/// An image's dimensions and cost, from its headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Probe {
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) need: Need,
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

fn need(width: u32, height: u32, source_bpp: u8, decoder_bytes: u64) -> Need {
    // Saturating: a PNG's header is probed before its pixel limit is
    // checked, and 2^32 x 2^32 x 4 does not fit (found by decode_image).
    let pixels = u64::from(width) * u64::from(height);
    Need {
        source_bytes: pixels.saturating_mul(u64::from(source_bpp)),
        source_bpp,
        decoder_bytes: decoder_bytes.saturating_add(FIXED_BYTES),
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn le24(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at + 3)?;
    Some(u32::from(s[0]) | u32::from(s[1]) << 8 | u32::from(s[2]) << 16)
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

// ---------------------------------------------------------------- JPEG

/// A JPEG's frame header (SOF) and how its first scan is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct JpegFrame {
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) progressive: bool,
    /// Components (1 gray, 3 YCbCr/RGB, 4 CMYK/YCCK).
    pub(crate) components: usize,
    /// Each component's (horizontal, vertical) sampling factors.
    pub(crate) factors: [(u8, u8); 4],
    /// Components in the first scan (all of them: one interleaved scan).
    pub(crate) first_scan_components: usize,
}

impl JpegFrame {
    /// The largest sampling factors: an MCU is 8·h_max × 8·v_max pixels.
    pub(crate) fn max_factors(&self) -> (u32, u32) {
        // A SOF may claim up to 255 components; only four are kept (found by
        // decode_image: 84 components panicked here).
        let f = &self.factors[..self.components.clamp(1, 4)];
        let h = f.iter().map(|c| u32::from(c.0)).max().unwrap_or(1);
        let v = f.iter().map(|c| u32::from(c.1)).max().unwrap_or(1);
        (h.max(1), v.max(1))
    }
}

/// Walks a JPEG's markers to its frame header and first scan header; None
/// when they cannot be found (zune-jpeg then says what is wrong).
pub(crate) fn jpeg_frame(bytes: &[u8]) -> Option<JpegFrame> {
    let mut pos = 2;
    let mut frame: Option<JpegFrame> = None;
    loop {
        // Fill bytes before a marker.
        while *bytes.get(pos)? == 0xFF && *bytes.get(pos + 1)? == 0xFF {
            pos += 1;
        }
        if *bytes.get(pos)? != 0xFF {
            return None;
        }
        let marker = *bytes.get(pos + 1)?;
        pos += 2;
        match marker {
            0x01 | 0xD0..=0xD8 => continue,
            0xD9 => return None,
            _ => {}
        }
        let len = usize::from(be16(bytes, pos)?);
        let seg = bytes.get(pos + 2..pos + len.max(2))?;
        match marker {
            0xC0..=0xCF if !matches!(marker, 0xC4 | 0xC8 | 0xCC) => {
                let n = usize::from(*seg.get(5)?);
                let mut factors = [(1u8, 1u8); 4];
                for (i, f) in factors.iter_mut().enumerate().take(n.min(4)) {
                    let hv = *seg.get(6 + i * 3 + 1)?;
                    *f = ((hv >> 4).clamp(1, 4), (hv & 15).clamp(1, 4));
                }
                frame = Some(JpegFrame {
                    width: u32::from(be16(seg, 3)?),
                    height: u32::from(be16(seg, 1)?),
                    progressive: matches!(marker, 0xC2 | 0xC6 | 0xCA | 0xCE),
                    components: n,
                    factors,
                    first_scan_components: n,
                });
            }
            0xDA => {
                let mut f = frame?;
                f.first_scan_components = usize::from(*seg.first()?);
                return Some(f);
            }
            _ => {}
        }
        pos += len;
    }
}

/// zune-jpeg's memory for `f`, besides the RGB output: whole-image
/// coefficients (i16) for a progressive JPEG or one whose first scan
/// holds fewer than all components, per-component MCU-row buffers, and
/// its copies of the metadata segments (ICC, EXIF, XMP: at most the file).
pub(crate) fn jpeg_need(f: &JpegFrame, file_bytes: usize) -> Need {
    let (hmax, vmax) = f.max_factors();
    let mcus_x = u64::from(f.width.div_ceil(8 * hmax));
    let mcus_y = u64::from(f.height.div_ceil(8 * vmax));
    let components = f.components.clamp(1, 4);
    let mut coefficients = 0u64;
    let mut rows = 0u64;
    for &(h, v) in &f.factors[..components] {
        let stride = mcus_x * 8 * u64::from(h);
        coefficients += stride * mcus_y * 8 * u64::from(v) * 2;
        // An MCU row of i16 samples, its upsampled copy (up to 4x), the
        // row above and below for upsampling.
        rows += stride * 8 * u64::from(vmax) * 2 * 12;
    }
    let whole = f.progressive || f.first_scan_components < components;
    let decoder = if whole { coefficients } else { 0 } + rows + 2 * file_bytes as u64;
    need(f.width, f.height, 3, decoder)
}

// ---------------------------------------------------------------- PNG

/// A PNG's header: dimensions, and the channels once palette and low bit
/// depths are expanded and 16-bit samples stripped (`formats::decode_png`).
pub(crate) fn png_probe(bytes: &[u8]) -> Result<Probe, DecodeError> {
    let format = Format::Png;
    if bytes.len() < 33 {
        return Err(DecodeError::Truncated { format });
    }
    if &bytes[12..16] != b"IHDR" {
        return Err(DecodeError::Corrupt {
            format,
            what: "first chunk is not IHDR".into(),
        });
    }
    let (width, height) = (be32(bytes, 16).unwrap_or(0), be32(bytes, 20).unwrap_or(0));
    let (depth, color) = (u64::from(bytes[24]), bytes[25]);
    // tRNS before the image data adds an alpha channel on expansion.
    let mut transparency = false;
    let mut pos = 8usize;
    while let (Some(len), Some(kind)) = (be32(bytes, pos), bytes.get(pos + 4..pos + 8)) {
        match kind {
            b"tRNS" => transparency = true,
            b"IDAT" | b"IEND" => break,
            _ => {}
        }
        pos = pos.saturating_add(12).saturating_add(len as usize);
    }
    let (samples, channels) = match color {
        0 => (1, 1 + u64::from(transparency)),
        2 => (3, 3 + u64::from(transparency)),
        3 => (1, 3 + u64::from(transparency)),
        4 => (2, 2),
        _ => (4, 4),
    };
    let w = u64::from(width);
    // The raw row at its own depth and the output row; the inflater keeps
    // a 32 KiB window and its own state; kept metadata chunks (and a copy
    // of eXIf) up to the cap.
    let raw_row = (w * samples * depth).div_ceil(8) + 1;
    let out_row = w * channels;
    let decoder = (16 * raw_row + 4 * out_row).saturating_add((512 << 10) + 2 * PNG_METADATA_MAX);
    let source_bpp = if channels == 4 { 4 } else { 3 };
    Ok(Probe {
        width,
        height,
        need: need(width, height, source_bpp, decoder),
    })
}

// ---------------------------------------------------------------- WebP

/// What a WebP holds: its canvas, and the first frame's kind and size
/// (what image-webp decodes for `read_image`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct WebpLayout {
    canvas: (u32, u32),
    alpha: bool,
    animated: bool,
    /// The first frame: (width, height, lossless, its stream's bytes).
    first: Option<(u32, u32, bool, u64)>,
    /// The first frame's ALPH chunk: (lossless-compressed, bytes).
    alph: Option<(bool, u64)>,
}

fn webp_corrupt(what: String) -> DecodeError {
    DecodeError::Corrupt {
        format: Format::WebP,
        what,
    }
}

/// The dimensions a VP8 (lossy) or VP8L (lossless) bitstream's own header
/// gives; None when the chunk is too short to say (image-webp then reports
/// the truncation).
fn bitstream_dims(kind: &[u8], data: &[u8]) -> Option<(u32, u32)> {
    match kind {
        b"VP8 " => {
            if data.get(3..6)? != [0x9D, 0x01, 0x2A] {
                return None;
            }
            let w = u32::from(u16::from_le_bytes([*data.get(6)?, *data.get(7)?]) & 0x3FFF);
            let h = u32::from(u16::from_le_bytes([*data.get(8)?, *data.get(9)?]) & 0x3FFF);
            Some((w, h))
        }
        b"VP8L" => {
            if *data.first()? != 0x2F {
                return None;
            }
            let bits = le32(data, 1)?;
            Some(((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1))
        }
        _ => None,
    }
}

/// The chunks of `data` (RIFF layout: fourcc, little-endian size, payload
/// padded to even): (fourcc, payload), payloads cut at the data's end.
fn chunks(data: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        let kind = data.get(pos..pos + 4)?;
        let size = le32(data, pos + 4)? as usize;
        let start = pos + 8;
        let end = start.saturating_add(size).min(data.len());
        let payload = data.get(start..end)?;
        pos = start.saturating_add(size).saturating_add(size & 1);
        Some((kind, payload))
    })
}

/// Checks one frame of `w` x `h` at (`x`, `y`) against the canvas and the
/// pixel limit, and its bitstream's own header against `w` x `h`.
fn check_frame(
    canvas: (u32, u32),
    (x, y, w, h): (u32, u32, u32, u32),
    kind: &[u8],
    data: &[u8],
    limit: u64,
) -> Result<(), DecodeError> {
    check_pixels(Format::WebP, u64::from(w), u64::from(h), limit)?;
    if u64::from(x) + u64::from(w) > u64::from(canvas.0)
        || u64::from(y) + u64::from(h) > u64::from(canvas.1)
    {
        return Err(webp_corrupt(format!(
            "a {w}x{h} frame at ({x}, {y}) does not fit its {}x{} canvas",
            canvas.0, canvas.1
        )));
    }
    if let Some((bw, bh)) = bitstream_dims(kind, data) {
        if (bw, bh) != (w, h) {
            check_pixels(Format::WebP, u64::from(bw), u64::from(bh), limit)?;
            return Err(webp_corrupt(format!(
                "a frame's {} bitstream is {bw}x{bh}, its header says {w}x{h}",
                String::from_utf8_lossy(kind).trim_end()
            )));
        }
    }
    Ok(())
}

/// Reads every chunk of a WebP and checks every frame (a still image's
/// VP8/VP8L, each ANMF and the bitstreams inside it) before any decode.
fn webp_layout(bytes: &[u8], limit: u64) -> Result<WebpLayout, DecodeError> {
    let body = bytes.get(12..).unwrap_or_default();
    let mut all = chunks(body);
    let Some((kind, data)) = all.next() else {
        return Err(DecodeError::Truncated {
            format: Format::WebP,
        });
    };
    let mut layout = WebpLayout::default();
    if kind == b"VP8 " || kind == b"VP8L" {
        let Some((w, h)) = bitstream_dims(kind, data) else {
            return Err(DecodeError::Truncated {
                format: Format::WebP,
            });
        };
        check_pixels(Format::WebP, u64::from(w), u64::from(h), limit)?;
        let lossless = kind == b"VP8L";
        layout.canvas = (w, h);
        layout.alpha = lossless && le32(data, 1).is_some_and(|b| (b >> 28) & 1 == 1);
        layout.first = Some((w, h, lossless, data.len() as u64));
        return Ok(layout);
    }
    if kind != b"VP8X" {
        return Err(webp_corrupt(format!(
            "first chunk is {:?}, not VP8, VP8L or VP8X",
            String::from_utf8_lossy(kind)
        )));
    }
    let (Some(flags), Some(cw), Some(ch)) = (data.first(), le24(data, 4), le24(data, 7)) else {
        return Err(DecodeError::Truncated {
            format: Format::WebP,
        });
    };
    layout.canvas = (cw + 1, ch + 1);
    layout.alpha = flags & 0x10 != 0;
    layout.animated = flags & 0x02 != 0;
    check_pixels(
        Format::WebP,
        u64::from(layout.canvas.0),
        u64::from(layout.canvas.1),
        limit,
    )?;
    let canvas = layout.canvas;
    for (kind, data) in all {
        match kind {
            b"VP8 " | b"VP8L" => {
                // A still image's bitstream is its canvas, exactly.
                check_frame(canvas, (0, 0, canvas.0, canvas.1), kind, data, limit)?;
                let lossless = kind == b"VP8L";
                layout
                    .first
                    .get_or_insert((canvas.0, canvas.1, lossless, data.len() as u64));
            }
            b"ALPH" if layout.alph.is_none() => {
                let lossless = data.first().is_some_and(|b| b & 3 == 1);
                layout.alph = Some((lossless, data.len() as u64));
            }
            b"ANMF" => anmf(&mut layout, data, limit)?,
            _ => {}
        }
    }
    Ok(layout)
}

/// One animation frame: its rectangle, then its ALPH/VP8/VP8L chunks.
fn anmf(layout: &mut WebpLayout, data: &[u8], limit: u64) -> Result<(), DecodeError> {
    let (Some(x), Some(y), Some(w), Some(h)) =
        (le24(data, 0), le24(data, 3), le24(data, 6), le24(data, 9))
    else {
        return Err(DecodeError::Truncated {
            format: Format::WebP,
        });
    };
    let rect = (x * 2, y * 2, w + 1, h + 1);
    let first = layout.first.is_none();
    for (kind, sub) in chunks(data.get(16..).unwrap_or_default()) {
        match kind {
            b"VP8 " | b"VP8L" => {
                check_frame(layout.canvas, rect, kind, sub, limit)?;
                if first {
                    layout
                        .first
                        .get_or_insert((rect.2, rect.3, kind == b"VP8L", sub.len() as u64));
                }
            }
            b"ALPH" if first && layout.alph.is_none() => {
                let lossless = sub.first().is_some_and(|b| b & 3 == 1);
                layout.alph = Some((lossless, sub.len() as u64));
            }
            _ => {}
        }
    }
    if layout.first.is_none() {
        // A frame with no image chunk: still bounded by its rectangle.
        check_frame(layout.canvas, rect, b"", &[], limit)?;
    }
    Ok(())
}

/// A lossless stream's decode: its ARGB image (4 bytes a pixel), the
/// transforms' and meta-code sub-images (at most 1.5 more), the Huffman
/// tables its bytes describe.
fn lossless_bytes(pixels: u64, stream_bytes: u64) -> u64 {
    pixels * 4 + pixels * 3 / 2 + stream_bytes * WEBP_LOSSLESS_BYTES_PER_STREAM_BYTE
}

/// A WebP's dimensions (its canvas) and cost, every frame checked first.
/// image-webp computes a canvas's size as `width * height * 4` in u32:
/// refused here past that, whatever the pixel limit.
pub(crate) fn webp_probe(bytes: &[u8], limit: u64) -> Result<Probe, DecodeError> {
    let layout = webp_layout(bytes, limit)?;
    let (cw, ch) = layout.canvas;
    let canvas_px = u64::from(cw) * u64::from(ch);
    if canvas_px * 4 > u64::from(u32::MAX) {
        return Err(DecodeError::Unsupported {
            format: Format::WebP,
            what: format!("a {cw}x{ch} canvas (over 2^30 pixels)"),
        });
    }
    let Some((fw, fh, lossless, stream)) = layout.first else {
        return Err(webp_corrupt("no VP8 or VP8L image chunk".into()));
    };
    let frame_px = u64::from(fw) * u64::from(fh);
    // A lossy frame: Y, U, V planes padded to 16-pixel macroblocks, plus
    // per-macroblock state.
    let yuv = u64::from(fw.div_ceil(16) * 16) * u64::from(fh.div_ceil(16) * 16) * 3 / 2
        + u64::from(fw.div_ceil(16)) * 4096;
    let mut decoder = if lossless {
        lossless_bytes(frame_px, stream)
    } else {
        yuv
    };
    if let Some((alph_lossless, alph_bytes)) = layout.alph {
        // The alpha plane, and when compressed its own ARGB decode.
        decoder += frame_px
            + if alph_lossless {
                lossless_bytes(frame_px, alph_bytes)
            } else {
                0
            };
    }
    if layout.animated {
        // read_frame's frame buffer (RGB or RGBA) and its canvas (RGBA).
        decoder += frame_px * 4 + canvas_px * 4;
    }
    Ok(Probe {
        width: cw,
        height: ch,
        need: need(cw, ch, if layout.alpha { 4 } else { 3 }, decoder),
    })
}

#[cfg(test)]
#[path = "probe_tests.rs"]
mod tests;
