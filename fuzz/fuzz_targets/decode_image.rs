//! Arbitrary bytes are an image sample: the decode stage
//! (`ringfeed_decode::Decoder::decode_into`) must write a full output or
//! return a `DecodeError`, never panic, and never allocate for a header's
//! claimed size beyond the pixel limit (libFuzzer's -rss_limit_mb catches
//! that). Each input goes through a random-resized crop with flip into CHW
//! and a centre crop into HWC; the pixel limit is low (4 Mpx) so the fuzzer
//! explores headers near it quickly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringfeed_decode::{Crop, DecodeError, Decoder, ImageSpec, Layout};

const MAX_PIXELS: u64 = 4 << 20;

fuzz_target!(|data: &[u8]| {
    let (Ok(train), Ok(eval)) = (
        ImageSpec::new(24, 32, Layout::Chw, Crop::RANDOM_RESIZED_DEFAULT, true, MAX_PIXELS),
        ImageSpec::new(16, 16, Layout::Hwc, Crop::Center { resize: 18 }, false, MAX_PIXELS),
    ) else {
        return;
    };
    let mut decoder = Decoder::new();
    for (spec, index) in [(train, 3), (eval, 0)] {
        let mut out = vec![0u8; spec.output_len()];
        match decoder.decode_into(data, &spec, 7, 1, index, &mut out) {
            Ok(info) => {
                let c = info.crop;
                let (fw, fh) = c.resized.unwrap_or((info.width, info.height));
                assert!(c.w >= 1 && c.h >= 1 && c.x + c.w <= fw && c.y + c.h <= fh, "{info:?}");
                assert!(u64::from(info.width) * u64::from(info.height) <= MAX_PIXELS);
            }
            Err(DecodeError::OutputSize { .. }) => panic!("the output buffer was the spec's size"),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
});
