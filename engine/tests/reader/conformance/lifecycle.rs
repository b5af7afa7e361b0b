//! The engine's own life: `submit` is all or none, `reap` polls, waits and
//! times out, reads from disk show up in a poll, drop waits for reads under
//! way, and a small descriptor limit slows reads but fails none.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ringfeed::reader::{ReadError, ReaderConfig};

use super::bytes::many_files_and_large_ranges_land_byte_exact;
use super::{open, EngineFactory};
use crate::support::{check_bytes, evict_from_page_cache, make_files, ops_into, run_all, table};

/// Submit is all or nothing: over the limit is `Busy`, a bad range is
/// `InvalidOp`, and neither starts a read.
pub fn submit_refuses_too_many_or_invalid_reads<E: EngineFactory>() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, _) = make_files(dir.path(), &[1000]);
    let cfg = ReaderConfig {
        queue_depth: 4,
        ..ReaderConfig::default()
    };
    let Some(mut engine) = open::<E>(table(&paths, &[1000], false), &cfg) else {
        return;
    };
    // The queue depth, or a multiple of it for an engine that takes more
    // reads than it starts at once (the chunk layer).
    let max = engine.max_in_flight();
    assert!(
        max >= 4 && max % 4 == 0,
        "max_in_flight {max} for queue depth 4"
    );
    let mut buf = vec![0u8; 1000 * (max + 1)];
    let ops = ops_into(&mut buf, &vec![(0, 0, 1000); max + 1]);
    // SAFETY: regions of `buf`, which outlives the engine.
    let busy = unsafe { engine.submit(&ops) };
    assert!(
        matches!(
            busy,
            Err(ReadError::Busy {
                in_flight: 0,
                requested,
                max_in_flight,
            }) if requested == max + 1 && max_in_flight == max
        ),
        "{busy:?}"
    );
    let mut bad = ops[0];
    bad.offset_bytes = 1;
    // SAFETY: as above.
    let invalid = unsafe { engine.submit(&[ops[1], bad]) };
    assert!(
        matches!(invalid, Err(ReadError::InvalidOp { user_data: 0, .. })),
        "{invalid:?}"
    );
    let mut missing_file = ops[0];
    missing_file.file = 1;
    // SAFETY: as above.
    assert!(matches!(
        unsafe { engine.submit(&[missing_file]) },
        Err(ReadError::InvalidOp { .. })
    ));
    assert_eq!(engine.in_flight(), 0);
    let mut out = Vec::new();
    assert_eq!(engine.reap(&mut out, 1, Some(Duration::ZERO)).unwrap(), 0);
    // Still works after the refusals.
    let (results, _) = run_all(engine.as_mut(), &ops[..4]);
    assert!(results.values().all(Result::is_ok));
}

/// With nothing in flight, `reap` returns at once, with or without a
/// timeout, however many completions it was asked to wait for.
pub fn reap_returns_when_nothing_is_in_flight_or_the_timeout_passes<E: EngineFactory>() {
    let paths = vec![PathBuf::from("/ringfeed-test-unused")];
    let Some(mut engine) = open::<E>(table(&paths, &[1], false), &ReaderConfig::default()) else {
        return;
    };
    let mut out = Vec::new();
    assert_eq!(engine.reap(&mut out, 10, None).unwrap(), 0);
    assert_eq!(
        engine
            .reap(&mut out, 10, Some(Duration::from_millis(1)))
            .unwrap(),
        0
    );
}

/// Dropping an engine with reads in flight waits for them: the buffer is
/// freed only after, and nothing crashes.
pub fn drop_with_reads_in_flight_waits_for_them<E: EngineFactory>() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = vec![200_000u64; 64];
    let (paths, _) = make_files(dir.path(), &sizes);
    let Some(mut engine) = open::<E>(table(&paths, &sizes, false), &ReaderConfig::default()) else {
        return;
    };
    let mut buf = vec![0u8; 64 * 200_000];
    let ranges: Vec<(u32, u64, u64)> = (0..64).map(|f| (f, 0, 200_000)).collect();
    let ops = ops_into(&mut buf, &ranges);
    // SAFETY: `buf` outlives the engine, whose drop waits for the reads.
    unsafe { engine.submit(&ops) }.unwrap();
    drop(engine);
    drop(buf);
}

/// An event loop may only poll (`min_complete` 0, zero timeout). Reads that
/// wait for the disk finish off the engine's thread; their completions must
/// still show up in a poll, never only in a blocking reap. `threads` is the
/// number of io_uring rings and of pread threads.
fn poll_only_reaping_sees_reads_from_disk<E: EngineFactory>(threads: usize) {
    let dir = tempfile::tempdir().unwrap();
    let sizes = vec![256u64 << 10; 32];
    let (paths, contents) = make_files(dir.path(), &sizes);
    paths.iter().for_each(|p| evict_from_page_cache(p));
    let cfg = ReaderConfig {
        uring_threads: threads,
        pread_threads: threads,
        ..ReaderConfig::default()
    };
    let Some(mut engine) = open::<E>(table(&paths, &sizes, false), &cfg) else {
        return;
    };
    let ranges: Vec<(u32, u64, u64)> = (0..32).map(|f| (f, 0, 256 << 10)).collect();
    let mut buf = vec![0u8; 32 << 18];
    let ops = ops_into(&mut buf, &ranges);
    // SAFETY: regions of `buf`, which outlives the engine.
    unsafe { engine.submit(&ops) }.unwrap();
    let (start, mut out) = (Instant::now(), Vec::new());
    while out.len() < ops.len() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{} of {} completions after 30 s of polling ({threads} threads)",
            out.len(),
            ops.len()
        );
        engine.reap(&mut out, 0, Some(Duration::ZERO)).unwrap();
        // Spin rather than sleep, so that no system call of this thread
        // other than the engine's own helps completions along.
        let spin_start = Instant::now();
        while spin_start.elapsed() < Duration::from_millis(1) {
            std::hint::spin_loop();
        }
    }
    assert!(out.iter().all(|c| c.result.is_ok()), "{out:?}");
    drop(engine);
    check_bytes(&buf, &ranges, &contents);
}

/// See `poll_only_reaping_sees_reads_from_disk`: one ring or thread.
pub fn poll_only_reaping_sees_completions_of_reads_from_disk_with_one_thread<E: EngineFactory>() {
    poll_only_reaping_sees_reads_from_disk::<E>(1);
}

/// See `poll_only_reaping_sees_reads_from_disk`: three rings or threads.
pub fn poll_only_reaping_sees_completions_of_reads_from_disk_with_three_threads<
    E: EngineFactory,
>() {
    poll_only_reaping_sees_reads_from_disk::<E>(3);
}

/// Run in a child process (the limit is process-wide): under
/// `RLIMIT_NOFILE` 48, far below the queue depth of 512, the 5000-file read
/// of `many_files_and_large_ranges_land_byte_exact` still lands byte-exact,
/// files opened per read and kept open.
pub fn reads_complete_under_an_rlimit_nofile_of_48<E: EngineFactory>() {
    let limit = libc::rlimit {
        rlim_cur: 48,
        rlim_max: 48,
    };
    // SAFETY: a valid rlimit; this child process runs this one test alone.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    for keep_open in [false, true] {
        many_files_and_large_ranges_land_byte_exact::<E>(keep_open);
    }
}
