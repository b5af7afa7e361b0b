//! Test tool for tests/python/test_decode_pixels.py and the figures in
//! docs/images.md: decodes one image file as a spec says, writes the raw
//! output bytes to OUT and prints the result as one line of JSON.
//!
//! decode_file IMAGE OUT [--size H W] [--layout hwc|chw] [--crop random|center]
//!     [--resize N] [--scale LO HI] [--ratio LO HI] [--flip] [--seed S]
//!     [--epoch E] [--index I] [--max-pixels N] [--repeat N]
//!
//! `--repeat N` decodes N times (index, index+1, ...) with one Decoder and
//! adds "us_per_image" to the JSON. Exit status: 0 decoded, 1 a DecodeError
//! (its kind and message in the JSON), 2 bad arguments.

use std::process::ExitCode;
use std::time::Instant;

use ringfeed_decode::{Crop, DecodeError, Decoder, ImageSpec, Layout, DEFAULT_MAX_PIXELS};

struct Args {
    image: String,
    out: String,
    spec: ImageSpec,
    seed: u64,
    epoch: u64,
    index: u64,
    repeat: u64,
}

fn parse() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let image = it.next().ok_or("missing IMAGE")?;
    let out = it.next().ok_or("missing OUT")?;
    let (mut h, mut w, mut layout, mut center, mut resize) =
        (224u32, 224u32, Layout::Hwc, false, 256u32);
    let (mut scale, mut ratio) = ((0.08, 1.0), (3.0 / 4.0, 4.0 / 3.0));
    let (mut flip, mut seed, mut epoch, mut index, mut max_pixels, mut repeat) =
        (false, 0u64, 0u64, 0u64, DEFAULT_MAX_PIXELS, 1u64);
    fn num<T: std::str::FromStr>(v: Option<String>, name: &str) -> Result<T, String> {
        v.ok_or(format!("{name} needs a value"))?
            .parse()
            .map_err(|_| format!("{name}: not a number"))
    }
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--size" => (h, w) = (num(it.next(), "--size")?, num(it.next(), "--size")?),
            "--layout" => {
                layout = match it.next().as_deref() {
                    Some("hwc") => Layout::Hwc,
                    Some("chw") => Layout::Chw,
                    _ => return Err("--layout hwc|chw".into()),
                }
            }
            "--crop" => {
                center = match it.next().as_deref() {
                    Some("random") => false,
                    Some("center") => true,
                    _ => return Err("--crop random|center".into()),
                }
            }
            "--resize" => resize = num(it.next(), "--resize")?,
            "--scale" => scale = (num(it.next(), "--scale")?, num(it.next(), "--scale")?),
            "--ratio" => ratio = (num(it.next(), "--ratio")?, num(it.next(), "--ratio")?),
            "--flip" => flip = true,
            "--seed" => seed = num(it.next(), "--seed")?,
            "--epoch" => epoch = num(it.next(), "--epoch")?,
            "--index" => index = num(it.next(), "--index")?,
            "--max-pixels" => max_pixels = num(it.next(), "--max-pixels")?,
            "--repeat" => repeat = num::<u64>(it.next(), "--repeat")?.max(1),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let crop = if center {
        Crop::Center { resize }
    } else {
        Crop::RandomResized { scale, ratio }
    };
    let spec = ImageSpec::new(h, w, layout, crop, flip, max_pixels).map_err(|e| e.to_string())?;
    Ok(Args {
        image,
        out,
        spec,
        seed,
        epoch,
        index,
        repeat,
    })
}

fn kind(e: &DecodeError) -> &'static str {
    match e {
        DecodeError::Truncated { .. } => "Truncated",
        DecodeError::Corrupt { .. } => "Corrupt",
        DecodeError::NotAnImage { .. } => "NotAnImage",
        DecodeError::TooManyPixels { .. } => "TooManyPixels",
        DecodeError::Unsupported { .. } => "Unsupported",
        DecodeError::OutputSize { .. } => "OutputSize",
    }
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("decode_file: {e}");
            return ExitCode::from(2);
        }
    };
    let bytes = match std::fs::read(&args.image) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("decode_file: reading {}: {e}", args.image);
            return ExitCode::from(2);
        }
    };
    let mut decoder = Decoder::new();
    let mut out = vec![0u8; args.spec.output_len()];
    let start = Instant::now();
    let mut result = decoder.decode_into(
        &bytes, &args.spec, args.seed, args.epoch, args.index, &mut out,
    );
    for i in 1..args.repeat {
        if result.is_err() {
            break;
        }
        result = decoder.decode_into(
            &bytes,
            &args.spec,
            args.seed,
            args.epoch,
            args.index + i,
            &mut out,
        );
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / args.repeat as f64;
    match result {
        Ok(info) => {
            if let Err(e) = std::fs::write(&args.out, &out) {
                eprintln!("decode_file: writing {}: {e}", args.out);
                return ExitCode::from(2);
            }
            let c = info.crop;
            let resized = match c.resized {
                Some((rw, rh)) => format!("[{rw},{rh}]"),
                None => "null".into(),
            };
            println!(
                "{{\"ok\":true,\"format\":\"{}\",\"width\":{},\"height\":{},\"crop\":{{\"x\":{},\"y\":{},\"w\":{},\"h\":{},\"flip\":{},\"resized\":{}}},\"us_per_image\":{:.1}}}",
                info.format, info.width, info.height, c.x, c.y, c.w, c.h, c.flip, resized, us
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!(
                "{{\"ok\":false,\"kind\":\"{}\",\"error\":{}}}",
                kind(&e),
                json_string(&e.to_string())
            );
            ExitCode::from(1)
        }
    }
}
