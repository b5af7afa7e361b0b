use super::*;

/// A RIFF chunk: fourcc, little-endian size, payload padded to even.
fn chunk(kind: &[u8; 4], payload: &[u8]) -> Vec<u8> {
    let mut c = kind.to_vec();
    c.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    c.extend_from_slice(payload);
    if payload.len() % 2 == 1 {
        c.push(0);
    }
    c
}

fn riff(chunks: &[Vec<u8>]) -> Vec<u8> {
    let body: Vec<u8> = chunks.concat();
    let mut b = b"RIFF".to_vec();
    b.extend_from_slice(&(4 + body.len() as u32).to_le_bytes());
    b.extend_from_slice(b"WEBP");
    b.extend_from_slice(&body);
    b
}

fn le24(v: u32) -> [u8; 3] {
    let b = v.to_le_bytes();
    [b[0], b[1], b[2]]
}

fn vp8x(flags: u8, w: u32, h: u32) -> Vec<u8> {
    let mut p = vec![flags, 0, 0, 0];
    p.extend_from_slice(&le24(w - 1));
    p.extend_from_slice(&le24(h - 1));
    chunk(b"VP8X", &p)
}

/// A VP8 key frame header of `w` x `h` and a few bytes of nothing.
fn vp8(w: u16, h: u16) -> Vec<u8> {
    let mut p = vec![0x10, 0x02, 0x00, 0x9D, 0x01, 0x2A];
    p.extend_from_slice(&w.to_le_bytes());
    p.extend_from_slice(&h.to_le_bytes());
    p.extend_from_slice(&[0; 16]);
    chunk(b"VP8 ", &p)
}

fn vp8l(w: u32, h: u32, alpha: bool) -> Vec<u8> {
    let mut p = vec![0x2F];
    p.extend_from_slice(&((w - 1) | (h - 1) << 14 | u32::from(alpha) << 28).to_le_bytes());
    p.extend_from_slice(&[0; 8]);
    chunk(b"VP8L", &p)
}

fn anmf(x: u32, y: u32, w: u32, h: u32, frame: Vec<u8>) -> Vec<u8> {
    let mut p = Vec::new();
    for v in [x / 2, y / 2, w - 1, h - 1, 100] {
        p.extend_from_slice(&le24(v));
    }
    p.push(0);
    p.extend_from_slice(&frame);
    chunk(b"ANMF", &p)
}

const LIMIT: u64 = 1_000_000;

#[test]
fn a_webp_frame_larger_than_its_canvas_is_refused_before_decoding() {
    // Issue 36: a VP8X canvas of 1x1 around a 16383x8000 VP8 frame passed a
    // 1 Mpx limit and was decoded (212 MB) before image-webp compared sizes.
    let bomb = riff(&[vp8x(0, 1, 1), vp8(16383, 8000)]);
    assert_eq!(
        webp_probe(&bomb, LIMIT).unwrap_err(),
        DecodeError::TooManyPixels {
            width: 16383,
            height: 8000,
            limit: LIMIT
        }
    );
    // Under the limit but still not its canvas: corrupt.
    let err = webp_probe(&riff(&[vp8x(0, 1, 1), vp8(900, 900)]), LIMIT).unwrap_err();
    assert!(
        err.to_string().contains("900x900") && err.to_string().contains("1x1"),
        "{err}"
    );
    let err = webp_probe(&riff(&[vp8x(0x10, 64, 64), vp8l(65, 64, true)]), LIMIT).unwrap_err();
    assert!(matches!(err, DecodeError::Corrupt { .. }), "{err}");
    // The same frame, right-sized, passes.
    let ok = webp_probe(&riff(&[vp8x(0, 900, 900), vp8(900, 900)]), LIMIT).unwrap();
    assert_eq!((ok.width, ok.height), (900, 900));
}

#[test]
fn every_animation_frame_is_checked_against_the_canvas() {
    let canvas = vp8x(0x02 | 0x10, 100, 100);
    let anim = chunk(b"ANIM", &[0; 6]);
    let good = anmf(0, 0, 100, 100, vp8l(100, 100, true));
    let p = webp_probe(&riff(&[canvas.clone(), anim.clone(), good.clone()]), LIMIT).unwrap();
    assert_eq!((p.width, p.height), (100, 100));
    // The second frame lies outside the canvas; the third's bitstream is
    // larger than its own rectangle; the fourth is over the pixel limit.
    for (bad, says) in [
        (anmf(50, 50, 60, 60, vp8l(60, 60, true)), "does not fit"),
        (anmf(0, 0, 10, 10, vp8(4000, 4000)), "4000x4000"),
        (anmf(0, 0, 10, 10, vp8(1100, 1100)), "over the limit"),
    ] {
        let err = webp_probe(
            &riff(&[canvas.clone(), anim.clone(), good.clone(), bad]),
            LIMIT,
        )
        .unwrap_err();
        assert!(err.to_string().contains(says), "{err} (wanted {says:?})");
    }
}

#[test]
fn a_canvas_past_image_webps_u32_size_is_refused_whatever_the_limit() {
    // image-webp sizes a canvas as width * height * 4 in u32: 2^30 pixels
    // and more would wrap.
    let big = riff(&[
        vp8x(0x02, 1 << 16, 1 << 14),
        chunk(b"ANIM", &[0; 6]),
        anmf(0, 0, 16, 16, vp8l(16, 16, false)),
    ]);
    let err = webp_probe(&big, u64::MAX).unwrap_err();
    assert!(
        matches!(err, DecodeError::Unsupported { .. }) && err.to_string().contains("2^30"),
        "{err}"
    );
}

#[test]
fn a_webp_costs_what_its_first_frame_and_canvas_need() {
    // Issue 36: a lossless 9000x9000 in a few bytes took 563 MB per thread;
    // its need says so before any decode, and the budget refuses it.
    let p = webp_probe(&riff(&[vp8l(9000, 9000, false)]), u64::MAX).unwrap();
    let total = p.need.source_bytes + p.need.decoder_bytes;
    assert!(total > 81_000_000 * 7, "{total}");
    let lossy = webp_probe(&riff(&[vp8(1000, 1000)]), u64::MAX).unwrap();
    assert_eq!(lossy.need.source_bpp, 3);
    assert!(lossy.need.decoder_bytes < 3_000_000, "{:?}", lossy.need);
}

fn sof(marker: u8, w: u16, h: u16, factors: &[u8]) -> Vec<u8> {
    let mut b = vec![0xFF, 0xD8, 0xFF, 0xE0, 0, 4, 0, 0, 0xFF, marker];
    b.extend_from_slice(&(8 + 3 * factors.len() as u16).to_be_bytes());
    b.push(8);
    b.extend_from_slice(&h.to_be_bytes());
    b.extend_from_slice(&w.to_be_bytes());
    b.push(factors.len() as u8);
    for (i, &f) in factors.iter().enumerate() {
        b.extend_from_slice(&[i as u8 + 1, f, 0]);
    }
    b
}

fn sos(components: u8) -> Vec<u8> {
    let mut b = vec![0xFF, 0xDA, 0, 6 + 2 * components, components];
    for i in 0..components {
        b.extend_from_slice(&[i + 1, 0]);
    }
    b.extend_from_slice(&[0, 63, 0]);
    b
}

#[test]
fn a_jpegs_frame_and_first_scan_decide_its_cost() {
    let baseline = [sof(0xC0, 1000, 800, &[0x22, 0x11, 0x11]), sos(3)].concat();
    let f = jpeg_frame(&baseline).unwrap();
    assert_eq!(
        (f.width, f.height, f.progressive, f.components),
        (1000, 800, false, 3)
    );
    assert_eq!(f.max_factors(), (2, 2));
    let progressive = [sof(0xC2, 1000, 800, &[0x22, 0x11, 0x11]), sos(1)].concat();
    let p = jpeg_frame(&progressive).unwrap();
    assert!(p.progressive);
    let (b, p) = (jpeg_need(&f, 0), jpeg_need(&p, 0));
    // 4:2:0 coefficients: 1.5 samples of 2 bytes a pixel, padded to MCUs.
    assert!(
        p.decoder_bytes >= b.decoder_bytes + 1008 * 800 * 3,
        "{b:?} {p:?}"
    );
    // A baseline JPEG whose first scan is one component keeps every
    // component's coefficients too (zune-jpeg's non-interleaved path).
    let split = [sof(0xC0, 1000, 800, &[0x11, 0x11, 0x11]), sos(1)].concat();
    let s = jpeg_need(&jpeg_frame(&split).unwrap(), 0);
    assert!(s.decoder_bytes >= 1000 * 800 * 6, "{s:?}");
    assert_eq!(
        jpeg_frame(&sof(0xC0, 10, 10, &[0x11])),
        None,
        "no scan header"
    );
}

#[test]
fn a_pngs_transparency_chunk_makes_its_source_four_bytes_a_pixel() {
    let ihdr = |color: u8| {
        let mut b = vec![0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A, 0, 0, 0, 13];
        b.extend_from_slice(b"IHDR");
        b.extend_from_slice(&100u32.to_be_bytes());
        b.extend_from_slice(&50u32.to_be_bytes());
        b.extend_from_slice(&[8, color, 0, 0, 0, 0, 0, 0, 0]);
        b
    };
    let png_chunk = |kind: &[u8; 4], data: &[u8]| {
        let mut c = (data.len() as u32).to_be_bytes().to_vec();
        c.extend_from_slice(kind);
        c.extend_from_slice(data);
        c.extend_from_slice(&[0; 4]);
        c
    };
    let rgb = png_probe(&[ihdr(2), png_chunk(b"IDAT", &[0])].concat()).unwrap();
    assert_eq!(rgb.need.source_bpp, 3);
    let keyed = [
        ihdr(2),
        png_chunk(b"tRNS", &[0, 0, 0, 0, 0, 0]),
        png_chunk(b"IDAT", &[0]),
    ];
    assert_eq!(png_probe(&keyed.concat()).unwrap().need.source_bpp, 4);
    assert_eq!(
        png_probe(&[ihdr(6), png_chunk(b"IDAT", &[0])].concat())
            .unwrap()
            .need
            .source_bytes,
        100 * 50 * 4
    );
}

#[test]
fn a_frame_claiming_more_than_four_components_is_no_panic() {
    let frame = JpegFrame {
        width: 16,
        height: 16,
        progressive: false,
        components: 84,
        factors: [(1, 1); 4],
        first_scan_components: 84,
    };
    assert_eq!(frame.max_factors(), (1, 1));
    assert!(jpeg_need(&frame, 100).decoder_bytes > 0);
}
