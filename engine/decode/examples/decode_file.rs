//! Test tool for tests/python/test_decode_pixels.py and the figures in
//! docs/images.md: decodes one image file as a spec says, writes the raw
//! output bytes to OUT and prints the result as one line of JSON.
//!
//! decode_file IMAGE OUT [--size H W] [--layout hwc|chw] [--crop random|center]
//!     [--resize N] [--scale LO HI] [--ratio LO HI] [--flip] [--seed S]
//!     [--epoch E] [--index I] [--max-pixels N] [--repeat N] [--memory BYTES]
//!
//! `--repeat N` decodes N times (index, index+1, ...) with one Decoder and
//! adds "us_per_image" to the JSON. `--memory` sets the decoder's memory
//! budget (default: the stage's, 256 MiB). The JSON also says the budget the
//! decode took ("memory_bytes") and the most heap the process held during
//! the decodes beyond what it held before ("heap_peak_bytes", counted by
//! this tool's allocator). Exit status: 0 decoded, 1 a DecodeError (its kind
//! and message in the JSON), 2 bad arguments.

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ringfeed_decode::{
    Crop, DecodeError, Decoder, ImageSpec, Layout, MemoryBudget, DEFAULT_MAX_PIXELS,
    DEFAULT_MEMORY_BUDGET,
};

/// The system allocator, counting the bytes held and their high-water mark.
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to System with the same arguments; the counters
// are only statistics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = HELD.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: AllocLayout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            let now = HELD.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: AllocLayout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) };
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: AllocLayout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                let grew = new_size - layout.size();
                let now = HELD.fetch_add(grew, Ordering::Relaxed) + grew;
                // A realloc that moves holds both blocks for a moment.
                PEAK.fetch_max(now + layout.size(), Ordering::Relaxed);
            } else {
                HELD.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

struct Args {
    image: String,
    out: String,
    spec: ImageSpec,
    seed: u64,
    epoch: u64,
    index: u64,
    repeat: u64,
    memory: u64,
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
    let mut memory = DEFAULT_MEMORY_BUDGET;
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
            "--memory" => memory = num(it.next(), "--memory")?,
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
        memory,
    })
}

fn kind(e: &DecodeError) -> &'static str {
    match e {
        DecodeError::Truncated { .. } => "Truncated",
        DecodeError::Corrupt { .. } => "Corrupt",
        DecodeError::NotAnImage { .. } => "NotAnImage",
        DecodeError::TooManyPixels { .. } => "TooManyPixels",
        DecodeError::Unsupported { .. } => "Unsupported",
        DecodeError::OverBudget { .. } => "OverBudget",
        DecodeError::OutOfMemory { .. } => "OutOfMemory",
        DecodeError::Stopped => "Stopped",
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
    let mut decoder = Decoder::with_budget(Arc::new(MemoryBudget::new(args.memory)));
    let mut out = vec![0u8; args.spec.output_len()];
    let held_before = HELD.load(Ordering::Relaxed);
    PEAK.store(held_before, Ordering::Relaxed);
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
    let heap_peak = PEAK.load(Ordering::Relaxed).saturating_sub(held_before);
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
                "{{\"ok\":true,\"format\":\"{}\",\"width\":{},\"height\":{},\"crop\":{{\"x\":{},\"y\":{},\"w\":{},\"h\":{},\"flip\":{},\"resized\":{}}},\"us_per_image\":{:.1},\"memory_bytes\":{},\"heap_peak_bytes\":{}}}",
                info.format, info.width, info.height, c.x, c.y, c.w, c.h, c.flip, resized, us,
                info.memory_bytes, heap_peak
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!(
                "{{\"ok\":false,\"kind\":\"{}\",\"error\":{},\"heap_peak_bytes\":{}}}",
                kind(&e),
                json_string(&e.to_string()),
                heap_peak
            );
            ExitCode::from(1)
        }
    }
}
