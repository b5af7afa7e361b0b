//! Benchmark behind docs/images.md's decoder choice: full RGB decode of one
//! JPEG with zune-jpeg and with jpeg-decoder (also at its DCT-scaled 1/2),
//! then the whole stage (decode + RandomResizedCrop(224) + flip) through
//! `Decoder`. Prints µs per image, the best of 5 rounds of N.
//!
//! cargo run --release -p ringfeed-decode --example jpeg_decoders -- IMAGE.jpg [N [DUMP_PREFIX]]

use std::time::Instant;

use ringfeed_decode::{Crop, Decoder, ImageSpec, Layout, DEFAULT_MAX_PIXELS};
use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;

fn best_us(n: u32, mut f: impl FnMut(u32) -> usize) -> f64 {
    let mut best = f64::MAX;
    let mut sink = 0usize;
    for _ in 0..5 {
        let t = Instant::now();
        for i in 0..n {
            sink = sink.wrapping_add(f(i));
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e6 / f64::from(n));
    }
    std::hint::black_box(sink);
    best
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: jpeg_decoders IMAGE.jpg [N]")?;
    let n: u32 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(100);
    let bytes = std::fs::read(&path)?;
    // A third argument: write each decoder's full RGB to PREFIX.{zune,jd}.rgb
    // (for comparing their pixels with Pillow's).
    if let Some(prefix) = args.next() {
        let opts = DecoderOptions::default().jpeg_set_out_colorspace(ColorSpace::RGB);
        let zune = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(&bytes), opts).decode()?;
        std::fs::write(format!("{prefix}.zune.rgb"), zune)?;
        std::fs::write(
            format!("{prefix}.jd.rgb"),
            jpeg_decoder::Decoder::new(&bytes[..]).decode()?,
        )?;
    }
    let mut buf = Vec::new();
    let zune = best_us(n, |_| {
        let opts = DecoderOptions::default().jpeg_set_out_colorspace(ColorSpace::RGB);
        let mut d = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(&bytes), opts);
        let _ = d.decode_headers();
        buf.resize(d.output_buffer_size().unwrap_or(0), 0);
        let _ = d.decode_into(&mut buf);
        buf.len()
    });
    let jd = best_us(n, |_| {
        let mut d = jpeg_decoder::Decoder::new(&bytes[..]);
        d.decode().map(|v| v.len()).unwrap_or(0)
    });
    let jd_half = best_us(n, |_| {
        let mut d = jpeg_decoder::Decoder::new(&bytes[..]);
        let _ = d.read_info();
        let (w, h) = d.info().map(|i| (i.width, i.height)).unwrap_or((0, 0));
        let _ = d.scale(w / 2, h / 2);
        d.decode().map(|v| v.len()).unwrap_or(0)
    });
    let spec = ImageSpec::new(
        224,
        224,
        Layout::Chw,
        Crop::RANDOM_RESIZED_DEFAULT,
        true,
        DEFAULT_MAX_PIXELS,
    )?;
    let mut decoder = Decoder::new();
    let mut out = vec![0u8; spec.output_len()];
    let stage = best_us(n, |i| {
        decoder
            .decode_into(&bytes, &spec, 0, 0, u64::from(i), &mut out)
            .map(|_| out[0] as usize)
            .unwrap_or(0)
    });
    println!(
        "{path}: {} bytes, µs per image (best of 5 x {n}):",
        bytes.len()
    );
    println!("  zune-jpeg decode             {zune:8.0}");
    println!("  jpeg-decoder decode          {jd:8.0}");
    println!("  jpeg-decoder decode at 1/2   {jd_half:8.0}");
    println!("  ringfeed-decode stage (zune + RandomResizedCrop(224) + flip, CHW) {stage:8.0}");
    Ok(())
}
