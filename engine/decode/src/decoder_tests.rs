use super::*;
use crate::budget::MemoryBudget;
use crate::spec::{Crop, DEFAULT_MAX_PIXELS};

/// A `w` x `h` PNG of `channels` (1 gray, 3 RGB, 4 RGBA) at `depth` bits,
/// samples given big-endian as PNG stores them.
fn png(w: u32, h: u32, color: png::ColorType, depth: png::BitDepth, data: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut enc = png::Encoder::new(&mut bytes, w, h);
    enc.set_color(color);
    enc.set_depth(depth);
    let mut writer = enc.write_header().unwrap();
    writer.write_image_data(data).unwrap();
    writer.finish().unwrap();
    bytes
}

/// A gradient RGB image whose every pixel differs from its neighbours.
fn gradient(w: u32, h: u32) -> Vec<u8> {
    let mut v = Vec::new();
    for y in 0..h {
        for x in 0..w {
            v.extend_from_slice(&[(x * 5) as u8, (y * 7) as u8, (x * 3 + y * 11) as u8]);
        }
    }
    v
}

fn rgb_png(w: u32, h: u32) -> (Vec<u8>, Vec<u8>) {
    let pixels = gradient(w, h);
    (
        png(w, h, png::ColorType::Rgb, png::BitDepth::Eight, &pixels),
        pixels,
    )
}

fn spec(h: u32, w: u32, layout: Layout, crop: Crop, flip: bool) -> ImageSpec {
    ImageSpec::new(h, w, layout, crop, flip, DEFAULT_MAX_PIXELS).unwrap()
}

/// A crop that takes the whole 40x30 image at scale 1 (area 1, ratio 4/3).
const WHOLE: Crop = Crop::RandomResized {
    scale: (1.0, 1.0),
    ratio: (4.0 / 3.0, 4.0 / 3.0),
};

#[test]
fn a_whole_image_crop_at_scale_one_is_the_source_exactly() {
    let (bytes, pixels) = rgb_png(40, 30);
    let mut out = vec![0u8; 40 * 30 * 3];
    let info = Decoder::new()
        .decode_into(
            &bytes,
            &spec(30, 40, Layout::Hwc, WHOLE, false),
            0,
            0,
            0,
            &mut out,
        )
        .unwrap();
    assert_eq!(
        (info.format, info.width, info.height),
        (Format::Png, 40, 30)
    );
    assert_eq!(
        (info.crop.x, info.crop.y, info.crop.w, info.crop.h),
        (0, 0, 40, 30)
    );
    assert!(out == pixels, "the output differs from the source");
}

#[test]
fn chw_holds_the_same_pixels_as_hwc_in_planes() {
    let (bytes, _) = rgb_png(97, 61);
    let crop = Crop::RANDOM_RESIZED_DEFAULT;
    let (mut hwc, mut chw) = (vec![0u8; 32 * 48 * 3], vec![0u8; 32 * 48 * 3]);
    let mut d = Decoder::new();
    d.decode_into(
        &bytes,
        &spec(32, 48, Layout::Hwc, crop, true),
        5,
        1,
        9,
        &mut hwc,
    )
    .unwrap();
    d.decode_into(
        &bytes,
        &spec(32, 48, Layout::Chw, crop, true),
        5,
        1,
        9,
        &mut chw,
    )
    .unwrap();
    let plane = 32 * 48;
    for i in 0..plane {
        for c in 0..3 {
            assert_eq!(chw[c * plane + i], hwc[i * 3 + c], "pixel {i} channel {c}");
        }
    }
    assert_ne!(hwc, chw);
}

#[test]
fn a_flipped_sample_is_the_unflipped_one_mirrored() {
    let (bytes, _) = rgb_png(80, 60);
    let crop = Crop::RANDOM_RESIZED_DEFAULT;
    let flipped = spec(24, 24, Layout::Hwc, crop, true);
    let index = (0..100)
        .find(|&i| crop_box(&flipped, 1, 0, i, 80, 60).flip)
        .unwrap();
    let (mut a, mut b) = (vec![0u8; 24 * 24 * 3], vec![0u8; 24 * 24 * 3]);
    let mut d = Decoder::new();
    let info = d
        .decode_into(&bytes, &flipped, 1, 0, index, &mut a)
        .unwrap();
    assert!(info.crop.flip);
    d.decode_into(
        &bytes,
        &spec(24, 24, Layout::Hwc, crop, false),
        1,
        0,
        index,
        &mut b,
    )
    .unwrap();
    for y in 0..24 {
        for x in 0..24 {
            let (l, r) = ((y * 24 + x) * 3, (y * 24 + 23 - x) * 3);
            assert_eq!(a[l..l + 3], b[r..r + 3], "row {y} column {x}");
        }
    }
}

#[test]
fn center_crop_at_scale_one_is_the_middle_of_the_source() {
    let (bytes, pixels) = rgb_png(40, 30);
    let mut out = vec![0u8; 30 * 30 * 3];
    let info = Decoder::new()
        .decode_into(
            &bytes,
            &spec(30, 30, Layout::Hwc, Crop::Center { resize: 30 }, false),
            0,
            0,
            0,
            &mut out,
        )
        .unwrap();
    assert_eq!(
        (info.crop.x, info.crop.y, info.crop.resized),
        (5, 0, Some((40, 30)))
    );
    for y in 0..30 {
        let src = &pixels[(y * 40 + 5) * 3..(y * 40 + 35) * 3];
        assert_eq!(&out[y * 90..(y + 1) * 90], src, "row {y}");
    }
}

#[test]
fn sixteen_bit_samples_keep_their_high_byte() {
    let data: Vec<u8> = [0x1234u16, 0xABCD, 0x00FF, 0xFF00, 0x8080, 0x7F7F]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect();
    let bytes = png(2, 1, png::ColorType::Rgb, png::BitDepth::Sixteen, &data);
    let mut out = vec![0u8; 6];
    let whole = Crop::RandomResized {
        scale: (1.0, 1.0),
        ratio: (2.0, 2.0),
    };
    Decoder::new()
        .decode_into(
            &bytes,
            &spec(1, 2, Layout::Hwc, whole, false),
            0,
            0,
            0,
            &mut out,
        )
        .unwrap();
    assert_eq!(out, [0x12, 0xAB, 0x00, 0xFF, 0x80, 0x7F]);
}

#[test]
fn gray_and_alpha_sources_become_rgb_with_alpha_dropped() {
    let whole = Crop::RandomResized {
        scale: (1.0, 1.0),
        ratio: (2.0, 2.0),
    };
    let s = spec(1, 2, Layout::Hwc, whole, false);
    let mut out = vec![0u8; 6];
    let mut d = Decoder::new();
    let gray = png(
        2,
        1,
        png::ColorType::Grayscale,
        png::BitDepth::Eight,
        &[10, 200],
    );
    d.decode_into(&gray, &s, 0, 0, 0, &mut out).unwrap();
    assert_eq!(out, [10, 10, 10, 200, 200, 200]);
    let ga = png(
        2,
        1,
        png::ColorType::GrayscaleAlpha,
        png::BitDepth::Eight,
        &[10, 0, 200, 255],
    );
    d.decode_into(&ga, &s, 0, 0, 0, &mut out).unwrap();
    assert_eq!(out, [10, 10, 10, 200, 200, 200]);
    let rgba = png(
        2,
        1,
        png::ColorType::Rgba,
        png::BitDepth::Eight,
        &[1, 2, 3, 0, 4, 5, 6, 128],
    );
    d.decode_into(&rgba, &s, 0, 0, 0, &mut out).unwrap();
    assert_eq!(out, [1, 2, 3, 4, 5, 6]);
}

/// A PNG signature and an IHDR claiming `w` x `h`; nothing after it.
fn png_header_only(w: u32, h: u32) -> Vec<u8> {
    let mut b = vec![0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A, 0, 0, 0, 13];
    b.extend_from_slice(b"IHDR");
    b.extend_from_slice(&w.to_be_bytes());
    b.extend_from_slice(&h.to_be_bytes());
    b.extend_from_slice(&[8, 2, 0, 0, 0, 0, 0, 0, 0]);
    b
}

#[test]
fn a_pixel_bomb_is_refused_from_its_header_before_any_buffer_grows() {
    let mut d = Decoder::new();
    let mut out = vec![0u8; 224 * 224 * 3];
    let s = spec(224, 224, Layout::Chw, Crop::RANDOM_RESIZED_DEFAULT, false);
    let err = d
        .decode_into(&png_header_only(30_000, 30_000), &s, 0, 0, 0, &mut out)
        .unwrap_err();
    assert_eq!(
        err,
        DecodeError::TooManyPixels {
            width: 30_000,
            height: 30_000,
            limit: DEFAULT_MAX_PIXELS
        }
    );
    assert_eq!(d.budget().peak(), 0, "memory was taken for it");
}

#[test]
fn bad_inputs_get_their_kind_of_error() {
    let mut d = Decoder::new();
    let s = spec(8, 8, Layout::Hwc, Crop::RANDOM_RESIZED_DEFAULT, false);
    let mut out = vec![0u8; s.output_len()];
    let (good, _) = rgb_png(40, 30);
    let mut run = |bytes: &[u8]| d.decode_into(bytes, &s, 0, 0, 0, &mut out).unwrap_err();
    assert_eq!(
        run(b""),
        DecodeError::NotAnImage {
            first_bytes: String::new()
        }
    );
    assert_eq!(
        run(b"hello world"),
        DecodeError::NotAnImage {
            first_bytes: "68 65 6c 6c 6f 20 77 6f".into()
        }
    );
    assert_eq!(
        run(&good[..5]),
        DecodeError::Truncated {
            format: Format::Png
        }
    );
    assert_eq!(
        run(&good[..good.len() - 20]),
        DecodeError::Truncated {
            format: Format::Png
        }
    );
    assert_eq!(
        run(&[0xFF, 0xD8]),
        DecodeError::Truncated {
            format: Format::Jpeg
        }
    );
    let mut corrupt = good.clone();
    corrupt[12..16].copy_from_slice(b"IHDX");
    assert!(matches!(
        run(&corrupt),
        DecodeError::Corrupt {
            format: Format::Png,
            ..
        }
    ));
    let mut wrong = vec![0u8; 5];
    assert_eq!(
        d.decode_into(&good, &s, 0, 0, 0, &mut wrong).unwrap_err(),
        DecodeError::OutputSize {
            expected: 192,
            got: 5
        }
    );
}

#[test]
fn the_steady_state_reuses_the_decoders_buffers() {
    let (bytes, _) = rgb_png(64, 48);
    let s = spec(32, 32, Layout::Chw, Crop::RANDOM_RESIZED_DEFAULT, true);
    let mut out = vec![0u8; s.output_len()];
    let mut d = Decoder::new();
    d.decode_into(&bytes, &s, 0, 0, 0, &mut out).unwrap();
    // The source and HWC buffers stay with the budget as spares.
    let before = (d.budget().in_use(), d.budget().spares());
    assert_eq!(before.1.len(), 2, "{before:?}");
    for i in 1..50 {
        d.decode_into(&bytes, &s, 0, 0, i, &mut out).unwrap();
    }
    let after = (d.budget().in_use(), d.budget().spares());
    let sorted = |mut v: Vec<(usize, usize)>| {
        v.sort_unstable();
        v
    };
    assert_eq!(
        (after.0, sorted(after.1)),
        (before.0, sorted(before.1)),
        "the same two buffers, reused"
    );
}

#[test]
fn decoders_sharing_a_budget_never_hold_more_than_it() {
    // Each decode of this 300x200 RGB PNG takes its source (180,000 bytes)
    // and the decoder's allowance: a budget of one and a half decodes lets
    // only one run at a time, whatever the number of threads.
    let (bytes, _) = rgb_png(300, 200);
    let s = spec(32, 32, Layout::Hwc, Crop::RANDOM_RESIZED_DEFAULT, false);
    let one = Decoder::new()
        .decode_into(&bytes, &s, 0, 0, 0, &mut vec![0u8; s.output_len()])
        .unwrap()
        .memory_bytes;
    let budget = Arc::new(MemoryBudget::new(one * 3 / 2));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (bytes, budget) = (bytes.clone(), Arc::clone(&budget));
            std::thread::spawn(move || {
                let mut d = Decoder::with_budget(budget);
                let mut out = vec![0u8; s.output_len()];
                for i in 0..25 {
                    d.decode_into(&bytes, &s, 1, 0, t * 100 + i, &mut out)
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(
        budget.peak() <= budget.total(),
        "{} > {}",
        budget.peak(),
        budget.total()
    );
    // Too big for this budget at all: refused, not waited for.
    let small = Arc::new(MemoryBudget::new(one / 2));
    let err = Decoder::with_budget(small)
        .decode_into(&bytes, &s, 0, 0, 0, &mut vec![0u8; s.output_len()])
        .unwrap_err();
    assert!(
        matches!(err, DecodeError::OverBudget { width: 300, height: 200, needed, budget, .. } if needed == one && budget == one / 2),
        "{err:?}"
    );
}

#[test]
fn zero_fill_zeroes_every_byte() {
    let mut out = vec![7u8; 300];
    zero_fill(&mut out);
    assert!(out.iter().all(|&b| b == 0));
}

#[test]
fn a_jpeg_is_whole_only_with_an_end_marker_after_its_last_scan() {
    use crate::formats::jpeg_has_end;
    assert!(jpeg_has_end(&[0xFF, 0xD8, 0xFF, 0xDA, 1, 2, 0xFF, 0xD9]));
    assert!(
        jpeg_has_end(&[0xFF, 0xD8, 0xFF, 0xDA, 1, 2, 0xFF, 0xD9, 0, 0, 7]),
        "trailing bytes"
    );
    assert!(
        !jpeg_has_end(&[0xFF, 0xD8, 0xFF, 0xDA, 1, 2, 0xFF]),
        "cut before the end marker"
    );
    // An EXIF thumbnail ends before the main image's scan, which is cut short.
    let thumb_then_cut = [
        0xFF, 0xD8, 0xFF, 0xE1, 0xFF, 0xD8, 0xFF, 0xDA, 0, 0xFF, 0xD9, 0xFF, 0xDA, 1, 2, 3,
    ];
    assert!(!jpeg_has_end(&thumb_then_cut));
}

/// A JPEG with a frame header claiming `w` x `h` (3 components, 4:2:0),
/// a scan header, and no entropy data.
fn jpeg_header_only(w: u16, h: u16) -> Vec<u8> {
    let mut b = vec![0xFF, 0xD8, 0xFF, 0xC0, 0, 17, 8];
    b.extend_from_slice(&h.to_be_bytes());
    b.extend_from_slice(&w.to_be_bytes());
    b.extend_from_slice(&[3, 1, 0x22, 0, 2, 0x11, 0, 3, 0x11, 0]);
    b.extend_from_slice(&[0xFF, 0xDA, 0, 12, 3, 1, 0, 2, 0x11, 3, 0x11, 0, 63, 0]);
    b
}

/// A WebP (VP8X canvas, then a VP8L image header) claiming `w` x `h`, with
/// no image data.
fn webp_header_only(w: u32, h: u32) -> Vec<u8> {
    let mut vp8x = vec![0u8; 4];
    vp8x.extend_from_slice(&(w - 1).to_le_bytes()[..3]);
    vp8x.extend_from_slice(&(h - 1).to_le_bytes()[..3]);
    let mut vp8l = vec![0x2F];
    vp8l.extend_from_slice(&((w - 1) | (h - 1) << 14).to_le_bytes());
    let mut b = b"RIFF".to_vec();
    b.extend_from_slice(&(4 + 8 + 10 + 8 + 6u32).to_le_bytes());
    b.extend_from_slice(b"WEBPVP8X");
    b.extend_from_slice(&10u32.to_le_bytes());
    b.extend_from_slice(&vp8x);
    b.extend_from_slice(b"VP8L");
    b.extend_from_slice(&5u32.to_le_bytes());
    b.extend_from_slice(&vp8l);
    b.push(0);
    b
}

#[test]
fn jpeg_and_webp_bombs_are_refused_before_any_buffer_grows() {
    let s = spec(224, 224, Layout::Chw, Crop::RANDOM_RESIZED_DEFAULT, false);
    let mut out = vec![0u8; s.output_len()];
    for (name, bytes, w, h) in [
        (
            "jpeg",
            jpeg_header_only(60_000, 60_000),
            60_000u64,
            60_000u64,
        ),
        ("webp", webp_header_only(16_000, 16_000), 16_000, 16_000),
    ] {
        let mut d = Decoder::new();
        let err = d.decode_into(&bytes, &s, 0, 0, 0, &mut out).unwrap_err();
        assert_eq!(
            err,
            DecodeError::TooManyPixels {
                width: w,
                height: h,
                limit: DEFAULT_MAX_PIXELS
            },
            "{name}"
        );
        assert_eq!(d.budget().peak(), 0, "{name}: memory was taken for it");
    }
}

#[test]
fn threads_decoding_in_different_orders_give_byte_identical_samples() {
    let (bytes, _) = rgb_png(120, 90);
    let s = spec(32, 32, Layout::Chw, Crop::RANDOM_RESIZED_DEFAULT, true);
    let decode_all = |order: Vec<u64>| {
        let (bytes, s) = (bytes.clone(), s);
        std::thread::spawn(move || {
            let mut d = Decoder::new();
            let mut by_index = vec![Vec::new(); order.len()];
            for i in order {
                let mut out = vec![0u8; s.output_len()];
                d.decode_into(&bytes, &s, 77, 4, i, &mut out).unwrap();
                by_index[i as usize] = out;
            }
            by_index
        })
    };
    let forward = decode_all((0..64).collect()).join().unwrap();
    let backward = decode_all((0..64).rev().collect()).join().unwrap();
    let strided = decode_all((0..64).map(|i| (i * 37) % 64).collect())
        .join()
        .unwrap();
    assert!(forward == backward && forward == strided);
    let distinct: std::collections::HashSet<_> = forward.iter().collect();
    assert!(distinct.len() > 60, "samples should differ by index");
}
