//! include/ringfeed.h is generated from this crate by cbindgen and committed.
//! This test regenerates it and fails on any difference, so the header can
//! never drift from the Rust source. RINGFEED_BLESS=1 rewrites it instead.

use std::path::PathBuf;

#[test]
fn committed_header_equals_the_generated_one() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("header is UTF-8");
    let path = crate_dir.join("../include/ringfeed.h");
    if std::env::var_os("RINGFEED_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write include/ringfeed.h");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/ringfeed.h differs from what cbindgen generates from ffi/src/lib.rs.\n\
         Regenerate it with: RINGFEED_BLESS=1 cargo test -p ringfeed-ffi --test header\n\
         --- generated ---\n{generated}"
    );
}
