//! Arbitrary bytes are one WebDAV PROPFIND answer (a `207 Multi-Status`
//! body) for the directory `/ds/`; the listing's parser and key checks
//! (`ringfeed::remote::webdav_answer_keys`) must return keys or an error,
//! never panic, and every key they return must pass `check_key` (no NUL, no
//! control character, no empty, `.` or `..` segment) or be a directory
//! (`…/`) whose name passes it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringfeed::remote::{check_key, webdav_answer_keys};

fuzz_target!(|data: &[u8]| {
    if let Ok(keys) = webdav_answer_keys(data, "/ds/") {
        for key in keys {
            assert!(check_key(key.trim_end_matches('/')).is_ok(), "{key:?}");
        }
    }
});
