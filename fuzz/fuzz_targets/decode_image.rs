//! Arbitrary bytes are an image sample: the decode stage
//! (`ringfeed_decode::Decoder::decode_into`) must write a full output or
//! return a `DecodeError`, never panic, and never hold more memory than it
//! took from its budget (issue 36). Each input goes through a random-resized
//! crop with flip into CHW and a centre crop into HWC; the pixel limit is low
//! (4 Mpx) and the budget small (64 MiB) so the fuzzer explores headers near
//! both quickly. The heap is counted here: a decode whose peak passes what
//! its headers promised (`ImageInfo::memory_bytes`) is a failure, and so is
//! any run past fuzz/run.sh's -rss_limit_mb / -malloc_limit_mb.
#![no_main]

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use ringfeed_decode::{Crop, DecodeError, Decoder, ImageSpec, Layout, MemoryBudget};

const MAX_PIXELS: u64 = 4 << 20;
const BUDGET_BYTES: u64 = 64 << 20;

/// The system allocator, counting the bytes held and their high-water mark.
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize, extra_peak: usize) {
    let now = HELD.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now + extra_peak, Ordering::Relaxed);
}

// SAFETY: every call goes to System with the same arguments; the counters
// are only statistics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size(), 0);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: AllocLayout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size(), 0);
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
                // A realloc that moves holds both blocks for a moment.
                grew(new_size - layout.size(), layout.size());
            } else {
                HELD.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fuzz_target!(|data: &[u8]| {
    let (Ok(train), Ok(eval)) = (
        ImageSpec::new(24, 32, Layout::Chw, Crop::RANDOM_RESIZED_DEFAULT, true, MAX_PIXELS),
        ImageSpec::new(16, 16, Layout::Hwc, Crop::Center { resize: 18 }, false, MAX_PIXELS),
    ) else {
        return;
    };
    let budget = Arc::new(MemoryBudget::new(BUDGET_BYTES));
    let mut decoder = Decoder::with_budget(Arc::clone(&budget));
    for (spec, index) in [(train, 3), (eval, 0)] {
        let mut out = vec![0u8; spec.output_len()];
        let held = HELD.load(Ordering::Relaxed);
        PEAK.store(held, Ordering::Relaxed);
        let result = decoder.decode_into(data, &spec, 7, 1, index, &mut out);
        let peak = PEAK.load(Ordering::Relaxed).saturating_sub(held) as u64;
        match result {
            Ok(info) => {
                let c = info.crop;
                let (fw, fh) = c.resized.unwrap_or((info.width, info.height));
                assert!(c.w >= 1 && c.h >= 1 && c.x + c.w <= fw && c.y + c.h <= fh, "{info:?}");
                assert!(u64::from(info.width) * u64::from(info.height) <= MAX_PIXELS);
                assert!(info.memory_bytes <= BUDGET_BYTES, "{info:?}");
                assert!(
                    peak <= info.memory_bytes,
                    "the decode held {peak} bytes, more than the {} its headers promised: {info:?}",
                    info.memory_bytes
                );
            }
            Err(DecodeError::OutputSize { .. }) => panic!("the output buffer was the spec's size"),
            Err(DecodeError::Stopped) => panic!("nothing stops this decode"),
            Err(e) => {
                assert!(!e.to_string().is_empty());
                // A refused or failed decode held no more than the budget.
                assert!(peak <= BUDGET_BYTES, "{peak} bytes held for a failed decode: {e}");
            }
        }
    }
    assert!(budget.peak() <= BUDGET_BYTES);
});
