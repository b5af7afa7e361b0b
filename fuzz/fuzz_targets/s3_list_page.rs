//! Arbitrary bytes are the answer to an S3 `ListObjectsV2` request: they go
//! through object_store's page parser and ringfeed's listing
//! (`ringfeed::remote::s3_page_keys`, no network), which must return keys or
//! an error, never panic; every key returned passes `check_key`, and keys
//! come sorted byte-wise with no duplicate.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringfeed::remote::{check_key, s3_page_keys};

fuzz_target!(|data: &[u8]| {
    if let Ok(keys) = s3_page_keys(data) {
        for key in &keys {
            assert!(check_key(key).is_ok(), "{key:?}");
        }
        assert!(keys.windows(2).all(|w| w[0].as_bytes() < w[1].as_bytes()));
    }
});
