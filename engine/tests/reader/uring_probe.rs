//! io_uring's own: choosing a backend with `IoChoice::Auto` probes io_uring
//! and falls back to pread with a warning that names the reason, and
//! `IoChoice::Uring` refuses instead. What either engine does once open is
//! the conformance suite's.

use std::path::PathBuf;
use std::sync::Arc;

use ringfeed::reader::{open_engine, IoChoice, ReadError, ReaderConfig, IO_URING_DISABLE_ENV};

use crate::support::{
    check_bytes, in_child, make_files, ops_into, run_all, run_child_test, table, CHILD_MARKER,
};

#[test]
fn auto_with_io_uring_disabled_falls_back_to_pread_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, contents) = make_files(dir.path(), &[3000]);
    let cfg = ReaderConfig {
        disable_io_uring: true,
        ..ReaderConfig::default()
    };
    let opened = open_engine(IoChoice::Auto, table(&paths, &[3000], false), &cfg).unwrap();
    assert_eq!(opened.engine.backend_name(), "pread");
    let warning = opened.fallback_warning.expect("a fallback warning");
    assert!(
        warning.contains("io_uring") && warning.contains("disable_io_uring"),
        "{warning}"
    );
    let mut engine = opened.engine;
    let mut buf = vec![0u8; 3000];
    let ops = ops_into(&mut buf, &[(0, 0, 3000)]);
    assert!(run_all(engine.as_mut(), &ops).0[&0].is_ok());
    drop(engine);
    check_bytes(&buf, &[(0, 0, 3000)], &contents);
}

#[test]
fn uring_choice_with_io_uring_disabled_is_an_error_suggesting_pread() {
    let cfg = ReaderConfig {
        disable_io_uring: true,
        ..ReaderConfig::default()
    };
    let paths = vec![PathBuf::from("/ringfeed-test-unused")];
    match open_engine(IoChoice::Uring, table(&paths, &[1], false), &cfg) {
        Err(e @ ReadError::UringUnavailable { .. }) => {
            let message = e.to_string();
            assert!(
                message.contains("--io pread") && message.contains("seccomp"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn auto_without_a_disable_uses_io_uring_where_it_works() {
    let paths = vec![PathBuf::from("/ringfeed-test-unused")];
    let opened = open_engine(
        IoChoice::Auto,
        table(&paths, &[1], false),
        &ReaderConfig::default(),
    )
    .unwrap();
    match &opened.fallback_warning {
        None => assert_eq!(opened.engine.backend_name(), "io_uring"),
        Some(warning) => eprintln!("io_uring unavailable here: {warning}"),
    }
}

#[test]
fn auto_falls_back_when_the_environment_variable_disables_io_uring() {
    run_child_test(
        "uring_probe::env_disable_child",
        &[(IO_URING_DISABLE_ENV, "1")],
    );
}

#[test]
#[ignore = "run in a child process by auto_falls_back_when_the_environment_variable_disables_io_uring"]
fn env_disable_child() {
    if !in_child() {
        return;
    }
    let paths = vec![PathBuf::from("/ringfeed-test-unused")];
    let files = table(&paths, &[1], false);
    let opened = open_engine(IoChoice::Auto, Arc::clone(&files), &ReaderConfig::default()).unwrap();
    assert_eq!(opened.engine.backend_name(), "pread");
    let warning = opened.fallback_warning.expect("a fallback warning");
    assert!(
        warning.contains(&format!("{IO_URING_DISABLE_ENV}=1")),
        "{warning}"
    );
    let refused = open_engine(IoChoice::Uring, files, &ReaderConfig::default());
    assert!(
        matches!(&refused, Err(ReadError::UringUnavailable { reason }) if reason.contains(IO_URING_DISABLE_ENV))
    );
    println!("{CHILD_MARKER}");
}
