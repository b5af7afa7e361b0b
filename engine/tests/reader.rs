//! The readers, both backends forced in turn, against files in a temporary
//! directory.
//!
//! io_uring tests skip (with a message) where the kernel or a seccomp filter
//! refuses io_uring, unless `RINGFEED_TEST_REQUIRE_URING=1` makes that a
//! failure.
//!
//! The figures asked of the readers come from the ignored `bench_*` tests,
//! which print them (they assert nothing about speed):
//!
//! ```text
//! RINGFEED_BENCH_BACKENDS=uring,uring:threads=1,pread \
//!   cargo test --release -p ringfeed --test reader -- --ignored --nocapture bench
//! ```
//!
//! Knobs: `RINGFEED_BENCH_BACKENDS` (see `bench_backends`), `RINGFEED_BENCH_PASSES`
//! (10), `RINGFEED_BENCH_BATCH` (64 reads per submit and reap), `RINGFEED_BENCH_QD`
//! (256), `RINGFEED_BENCH_THREADS` (16 pread threads), `RINGFEED_BENCH_FILES`
//! (20,000), `RINGFEED_BENCH_DIR` (keep the files between runs). Passes of the
//! backends are interleaved, so that load from elsewhere on the machine hits
//! them alike; the CPU column is user + system time of every thread per GB.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringfeed::reader::{
    open_engine, Completion, FileTable, IoChoice, ReadEngine, ReadError, ReadOp, ReaderConfig,
    IO_URING_DISABLE_ENV, READ_CHUNK_BYTES_MAX,
};

const REAP_TIMEOUT: Duration = Duration::from_secs(60);

/// The byte at `offset` of test file `file`: neighbours differ, and so do files.
fn pattern_byte(file: u32, offset: u64) -> u8 {
    (u64::from(file).wrapping_mul(131) ^ offset.wrapping_mul(7) ^ (offset >> 9)) as u8
}

fn pattern(file: u32, len: u64) -> Vec<u8> {
    (0..len).map(|o| pattern_byte(file, o)).collect()
}

/// Writes `sizes.len()` files of the given sizes with their patterns;
/// returns their paths and contents.
fn make_files(dir: &Path, sizes: &[u64]) -> (Vec<PathBuf>, Vec<Vec<u8>>) {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            let path = dir.join(format!("f{i:06}.bin"));
            let content = pattern(i as u32, size);
            fs::write(&path, &content).unwrap();
            (path, content)
        })
        .unzip()
}

fn table(paths: &[PathBuf], sizes: &[u64], keep_open: bool) -> Arc<FileTable> {
    Arc::new(FileTable::new(paths.to_vec(), sizes.to_vec(), keep_open).unwrap())
}

/// The engine for `choice`, or None (skip) where io_uring is refused.
fn engine(
    choice: IoChoice,
    files: Arc<FileTable>,
    cfg: &ReaderConfig,
) -> Option<Box<dyn ReadEngine>> {
    match open_engine(choice, files, cfg) {
        Ok(opened) => {
            assert!(
                opened.fallback_warning.is_none(),
                "{:?}",
                opened.fallback_warning
            );
            Some(opened.engine)
        }
        Err(ReadError::UringUnavailable { reason })
            if choice == IoChoice::Uring
                && std::env::var_os("RINGFEED_TEST_REQUIRE_URING").is_none() =>
        {
            eprintln!("skipping the io_uring case: {reason}");
            None
        }
        Err(e) => panic!("open_engine({choice}): {e}"),
    }
}

/// Runs every op, keeping the engine as full as it allows. Returns the
/// completions by user_data and the most reads seen in flight.
fn run_all(
    engine: &mut dyn ReadEngine,
    ops: &[ReadOp],
) -> (HashMap<u64, Result<(), ReadError>>, usize) {
    let mut results = HashMap::with_capacity(ops.len());
    let mut out: Vec<Completion> = Vec::new();
    let (mut next, mut peak) = (0, 0);
    while results.len() < ops.len() {
        let room = engine.max_in_flight() - engine.in_flight();
        let n = room.min(ops.len() - next);
        if n > 0 {
            // SAFETY: every test gives each op its own region of a buffer
            // that outlives the engine's use of it and is not touched until
            // every completion is reaped.
            unsafe { engine.submit(&ops[next..next + n]) }.unwrap();
            next += n;
            peak = peak.max(engine.in_flight());
        }
        out.clear();
        engine.reap(&mut out, 1, Some(REAP_TIMEOUT)).unwrap();
        for c in out.drain(..) {
            assert!(
                results.insert(c.user_data, c.result).is_none(),
                "two completions for {}",
                c.user_data
            );
        }
    }
    assert_eq!(engine.in_flight(), 0);
    (results, peak)
}

/// Lays `ranges` (file, offset, len) out one after another in `buf`.
/// Each op has a spare byte where one lies inside `buf` (as the loader's do:
/// the next range's first byte, or room after the last).
fn ops_into(buf: &mut [u8], ranges: &[(u32, u64, u64)]) -> Vec<ReadOp> {
    ops_into_with(buf, ranges, true)
}

/// `ops_into`, with spare bytes only if `spare`.
fn ops_into_with(buf: &mut [u8], ranges: &[(u32, u64, u64)], spare: bool) -> Vec<ReadOp> {
    let buf_len = buf.len();
    let mut at = 0usize;
    let base = buf.as_mut_ptr();
    ranges
        .iter()
        .enumerate()
        .map(|(i, &(file, offset_bytes, len_bytes))| {
            let dest = base.wrapping_add(at);
            at += len_bytes as usize;
            assert!(at <= buf.len());
            ReadOp {
                file,
                offset_bytes,
                len_bytes,
                dest,
                spare_byte: spare && at < buf_len,
                user_data: i as u64,
            }
        })
        .collect()
}

/// Checks that `buf` holds `ranges` laid out by `ops_into`, against the
/// files' contents as written.
fn check_bytes(buf: &[u8], ranges: &[(u32, u64, u64)], contents: &[Vec<u8>]) {
    let mut at = 0usize;
    for &(file, offset, len) in ranges {
        let (offset, len) = (offset as usize, len as usize);
        let want = &contents[file as usize][offset..offset + len];
        if buf[at..at + len] != *want {
            let k = (0..len).find(|&k| buf[at + k] != want[k]).unwrap_or(0);
            panic!(
                "file {file} byte {}: got {}, want {} (range at {offset}, {len} bytes)",
                offset + k,
                buf[at + k],
                want[k]
            );
        }
        at += len;
    }
}

/// Cheap deterministic numbers for test layouts.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

fn many_files_and_large_ranges_land_byte_exact(choice: IoChoice, keep_open: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Lcg(42);
    // 5000 small files of 0 to 6000 bytes, then three large ones.
    let mut sizes: Vec<u64> = (0..5000).map(|_| rng.next() % 6000).collect();
    sizes.extend([8 << 20, 3 << 20, (5 << 20) + 123]);
    let (paths, contents) = make_files(dir.path(), &sizes);
    let cfg = ReaderConfig {
        queue_depth: 512,
        keep_open_files_max: 16,
        ..ReaderConfig::default()
    };
    let Some(mut engine) = engine(choice, table(&paths, &sizes, keep_open), &cfg) else {
        return;
    };

    // Every small file whole, and 300 ranges of the large ones, in an
    // interleaved order.
    let mut ranges: Vec<(u32, u64, u64)> = (0..5000).map(|f| (f, 0, sizes[f as usize])).collect();
    for i in 0..300u64 {
        let file = 5000 + (i % 3) as u32;
        let size = sizes[file as usize];
        let len = rng.next() % (300 << 10);
        let offset = rng.next() % (size - len);
        ranges.insert((i * 17 % 5000) as usize, (file, offset, len));
    }
    // One range that is a whole large file.
    ranges.push((5000, 0, sizes[5000]));
    let total: u64 = ranges.iter().map(|r| r.2).sum();
    let mut buf = vec![0u8; total as usize];
    let ops = ops_into(&mut buf, &ranges);

    let (results, peak) = run_all(engine.as_mut(), &ops);
    for (user_data, result) in &results {
        assert!(result.is_ok(), "read {user_data}: {result:?}");
    }
    assert_eq!(results.len(), ranges.len());
    assert!(peak >= 256, "at most {peak} reads were in flight");
    drop(engine);
    check_bytes(&buf, &ranges, &contents);
}

#[test]
fn uring_reads_5000_small_files_and_large_ranges_byte_exact() {
    many_files_and_large_ranges_land_byte_exact(IoChoice::Uring, false);
}

#[test]
fn pread_reads_5000_small_files_and_large_ranges_byte_exact() {
    many_files_and_large_ranges_land_byte_exact(IoChoice::Pread, false);
}

#[test]
fn uring_in_keep_open_mode_reads_the_same_byte_exact() {
    many_files_and_large_ranges_land_byte_exact(IoChoice::Uring, true);
}

#[test]
fn pread_in_keep_open_mode_reads_the_same_byte_exact() {
    many_files_and_large_ranges_land_byte_exact(IoChoice::Pread, true);
}

/// Record mode: few big files, many small records, hundreds of reads of one
/// file issued before it has even been opened.
fn records_of_few_kept_files_land_byte_exact(choice: IoChoice) {
    let dir = tempfile::tempdir().unwrap();
    let sizes = vec![4 << 20, 2 << 20];
    let (paths, contents) = make_files(dir.path(), &sizes);
    let cfg = ReaderConfig {
        queue_depth: 1024,
        ..ReaderConfig::default()
    };
    let Some(mut engine) = engine(choice, table(&paths, &sizes, true), &cfg) else {
        return;
    };
    let record_bytes = 1000u64;
    let ranges: Vec<(u32, u64, u64)> = (0..3000u64)
        .map(|i| {
            (
                (i % 2) as u32,
                (i * 7919 % 2000) * record_bytes,
                record_bytes,
            )
        })
        .collect();
    let mut buf = vec![0u8; (ranges.len() as u64 * record_bytes) as usize];
    let ops = ops_into(&mut buf, &ranges);
    let (results, peak) = run_all(engine.as_mut(), &ops);
    assert!(results.values().all(Result::is_ok), "{results:?}");
    assert!(peak >= 1000);
    drop(engine);
    check_bytes(&buf, &ranges, &contents);
}

#[test]
fn uring_reads_records_of_kept_open_files_byte_exact() {
    records_of_few_kept_files_land_byte_exact(IoChoice::Uring);
}

#[test]
fn pread_reads_records_of_kept_open_files_byte_exact() {
    records_of_few_kept_files_land_byte_exact(IoChoice::Pread);
}

/// More files than may be kept open: the rest open, read and close.
fn files_past_the_keep_open_limit_are_still_read(choice: IoChoice) {
    let dir = tempfile::tempdir().unwrap();
    let sizes = vec![10_000u64; 40];
    let (paths, contents) = make_files(dir.path(), &sizes);
    let cfg = ReaderConfig {
        keep_open_files_max: 3,
        ..ReaderConfig::default()
    };
    let Some(mut engine) = engine(choice, table(&paths, &sizes, true), &cfg) else {
        return;
    };
    let ranges: Vec<(u32, u64, u64)> = (0..200u64)
        .map(|i| ((i % 40) as u32, i * 13, 5000))
        .collect();
    let mut buf = vec![0u8; 200 * 5000];
    let ops = ops_into(&mut buf, &ranges);
    let (results, _) = run_all(engine.as_mut(), &ops);
    assert!(results.values().all(Result::is_ok), "{results:?}");
    drop(engine);
    check_bytes(&buf, &ranges, &contents);
}

#[test]
fn uring_reads_files_past_the_keep_open_limit() {
    files_past_the_keep_open_limit_are_still_read(IoChoice::Uring);
}

#[test]
fn pread_reads_files_past_the_keep_open_limit() {
    files_past_the_keep_open_limit_are_still_read(IoChoice::Pread);
}

/// A file deleted after the table was built fails its read, and only it,
/// with `Vanished` naming its path.
fn vanished_file_is_an_error_that_names_it(choice: IoChoice, keep_open: bool) {
    let dir = tempfile::tempdir().unwrap();
    let sizes = vec![4096u64; 10];
    let (paths, _) = make_files(dir.path(), &sizes);
    let Some(mut engine) = engine(
        choice,
        table(&paths, &sizes, keep_open),
        &ReaderConfig::default(),
    ) else {
        return;
    };
    fs::remove_file(&paths[3]).unwrap();
    // Three reads of the vanished file, so keep-open mode fails every
    // waiter of the one open.
    let ranges: Vec<(u32, u64, u64)> = (0..10).chain([3, 3]).map(|f| (f, 0, 4096)).collect();
    let mut buf = vec![0u8; ranges.len() * 4096];
    let ops = ops_into(&mut buf, &ranges);
    let (results, _) = run_all(engine.as_mut(), &ops);
    for (i, &(file, _, _)) in ranges.iter().enumerate() {
        match (&results[&(i as u64)], file) {
            (Err(ReadError::Vanished { path, .. }), 3) => {
                assert_eq!(path, &paths[3]);
                let message = results[&(i as u64)].as_ref().unwrap_err().to_string();
                assert!(
                    message.contains(&paths[3].display().to_string())
                        && message.contains("vanished"),
                    "{message}"
                );
            }
            (Ok(()), f) if f != 3 => {}
            (other, f) => panic!("read of file {f}: {other:?}"),
        }
    }
}

#[test]
fn uring_vanished_file_is_an_error_that_names_it() {
    vanished_file_is_an_error_that_names_it(IoChoice::Uring, false);
}

#[test]
fn uring_vanished_kept_open_file_is_an_error_that_names_it() {
    vanished_file_is_an_error_that_names_it(IoChoice::Uring, true);
}

#[test]
fn pread_vanished_file_is_an_error_that_names_it() {
    vanished_file_is_an_error_that_names_it(IoChoice::Pread, false);
}

#[test]
fn pread_vanished_kept_open_file_is_an_error_that_names_it() {
    vanished_file_is_an_error_that_names_it(IoChoice::Pread, true);
}

/// Two files of 100,000 bytes in a table, an engine over it, then `change`
/// applied to the first file. In keep-open mode both files are read once
/// before the change, so that they are kept open when it happens (a change
/// before a kept file's first read is `SizeAtOpen`, see
/// `a_kept_file_changed_before_its_first_read_is_refused_at_open`). None
/// where io_uring is refused.
fn two_files_then_change(
    choice: IoChoice,
    keep_open: bool,
    change: impl FnOnce(&Path),
) -> Option<(tempfile::TempDir, Vec<PathBuf>, Box<dyn ReadEngine>)> {
    let dir = tempfile::tempdir().unwrap();
    let sizes = vec![100_000u64, 100_000];
    let (paths, _) = make_files(dir.path(), &sizes);
    let mut engine = engine(
        choice,
        table(&paths, &sizes, keep_open),
        &ReaderConfig::default(),
    )?;
    if keep_open {
        let mut buf = [0u8; 2];
        let (results, _) = run_all(
            engine.as_mut(),
            &ops_into(&mut buf, &[(0, 10, 1), (1, 10, 1)]),
        );
        assert!(results.values().all(Result::is_ok), "{results:?}");
    }
    change(&paths[0]);
    Some((dir, paths, engine))
}

/// Asserts that `result` is the size error for `path` (`Grew` if `grew`,
/// else `ChangedSize`) with both sizes, and that its message names them.
fn assert_size_error(
    result: &Result<(), ReadError>,
    path: &Path,
    expected: u64,
    actual: u64,
    grew: bool,
) {
    let fields = match result {
        Err(ReadError::ChangedSize {
            path,
            expected_bytes,
            actual_bytes,
            ..
        }) if !grew => (path, *expected_bytes, *actual_bytes),
        Err(ReadError::Grew {
            path,
            expected_bytes,
            actual_bytes,
        }) if grew => (path, *expected_bytes, *actual_bytes),
        other => panic!("expected a size error (grew: {grew}), got {other:?}"),
    };
    assert_eq!(fields, (&path.to_path_buf(), expected, actual));
    let message = result.as_ref().unwrap_err().to_string();
    for part in [
        path.display().to_string(),
        expected.to_string(),
        actual.to_string(),
    ] {
        assert!(message.contains(&part), "{message} lacks {part}");
    }
    assert_eq!(message.contains("grew"), grew, "{message}");
}

/// A file truncated after the table was built: a read past the new end,
/// and one that straddles it, both fail with `ChangedSize`.
fn truncated_file_is_a_changed_size_error(choice: IoChoice, keep_open: bool) {
    let truncate = |path: &Path| {
        fs::OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(60_000)
            .unwrap()
    };
    let Some((_dir, paths, mut engine)) = two_files_then_change(choice, keep_open, truncate) else {
        return;
    };
    // Whole file (short read, then 0), past the new end, inside what is left, the other file.
    let ranges = [
        (0u32, 0u64, 100_000u64),
        (0, 70_000, 1000),
        (0, 1000, 5000),
        (1, 0, 100_000),
    ];
    let mut buf = vec![0u8; 206_000];
    let ops = ops_into(&mut buf, &ranges);
    let (results, _) = run_all(engine.as_mut(), &ops);
    for user_data in [0u64, 1] {
        assert_size_error(&results[&user_data], &paths[0], 100_000, 60_000, false);
    }
    assert!(results[&2].is_ok() && results[&3].is_ok(), "{results:?}");
}

/// A file appended to after the table was built: every read that reaches
/// the recorded end fails with `Grew`, naming the path and both sizes; reads
/// that stop short of it, and the other file, still succeed. The probe byte
/// goes to the caller's spare byte (a longer READ or pread), then to the
/// engine's own (READV or preadv).
fn grown_file_is_a_grew_error(choice: IoChoice, keep_open: bool) {
    for spare in [true, false] {
        let append = |path: &Path| {
            fs::OpenOptions::new()
                .append(true)
                .open(path)
                .unwrap()
                .write_all(&[7u8; 5000])
                .unwrap()
        };
        let Some((_dir, paths, mut engine)) = two_files_then_change(choice, keep_open, append)
        else {
            return;
        };
        // Whole file, its last record, a middle range, a range ending one
        // byte before the recorded end, the other file whole.
        let ranges = [
            (0u32, 0u64, 100_000u64),
            (0, 99_000, 1000),
            (0, 1000, 5000),
            (0, 50_000, 49_999),
            (1, 0, 100_000),
        ];
        let mut buf = vec![0u8; 256_000];
        let ops = ops_into_with(&mut buf, &ranges, spare);
        let (results, _) = run_all(engine.as_mut(), &ops);
        for user_data in [0u64, 1] {
            assert_size_error(&results[&user_data], &paths[0], 100_000, 105_000, true);
        }
        for user_data in [2u64, 3, 4] {
            assert!(
                results[&user_data].is_ok(),
                "read {user_data} (spare byte {spare}): {results:?}"
            );
        }
        // The bytes of the reads that succeeded are the file's, unchanged.
        let file1 = fs::read(&paths[1]).unwrap();
        let at = (100_000 + 1000 + 5000 + 49_999) as usize;
        assert_eq!(&buf[at..at + 100_000], &file1[..]);
    }
}

/// Keep-open mode (record datasets), both backends, with files kept and
/// with the kept limit at 0 (every read opens its file): a file replaced by
/// one of another size, or changed in place, before its first read fails
/// every read of it with `SizeAtOpen`, naming both sizes, before a byte of
/// it lands, even a record in its middle that the new file also has. A
/// replaced file of the same size is read (that change is not caught).
fn a_kept_file_changed_before_its_first_read_is_refused_at_open(choice: IoChoice) {
    for keep_open_files_max in [4096, 0] {
        let dir = tempfile::tempdir().unwrap();
        let sizes = vec![100_000u64; 4];
        let (paths, contents) = make_files(dir.path(), &sizes);
        let cfg = ReaderConfig {
            keep_open_files_max,
            ..ReaderConfig::default()
        };
        let Some(mut engine) = engine(choice, table(&paths, &sizes, true), &cfg) else {
            return;
        };
        // 0: replaced by a larger file; 1: by a smaller one; 2: truncated in
        // place; 3: replaced by a file of the same size.
        let replace = |path: &Path, bytes: Vec<u8>| {
            let tmp = path.with_extension("new");
            fs::write(&tmp, bytes).unwrap();
            fs::rename(&tmp, path).unwrap();
        };
        replace(&paths[0], vec![1u8; 150_000]);
        replace(&paths[1], vec![2u8; 60_000]);
        fs::OpenOptions::new()
            .write(true)
            .open(&paths[2])
            .unwrap()
            .set_len(80_000)
            .unwrap();
        replace(&paths[3], vec![3u8; 100_000]);
        const SENTINEL: u8 = 0xA5;
        let ranges: Vec<(u32, u64, u64)> = (0..4u32)
            .flat_map(|f| [(f, 1000, 1000), (f, 50_000, 2000)])
            .collect();
        let mut buf = vec![SENTINEL; 12_000];
        let ops = ops_into_with(&mut buf, &ranges, false);
        let (results, _) = run_all(engine.as_mut(), &ops);
        for (i, &(file, _, _)) in ranges.iter().enumerate() {
            let result = &results[&(i as u64)];
            let actual = [150_000u64, 60_000, 80_000][..].get(file as usize).copied();
            match (result, actual) {
                (
                    Err(ReadError::SizeAtOpen {
                        path,
                        expected_bytes: 100_000,
                        actual_bytes,
                    }),
                    Some(a),
                ) => {
                    assert_eq!((path, *actual_bytes), (&paths[file as usize], a));
                    let message = result.as_ref().unwrap_err().to_string();
                    for part in [
                        paths[file as usize].display().to_string(),
                        "100000".into(),
                        a.to_string(),
                        "when it was opened".into(),
                    ] {
                        assert!(message.contains(&part), "{message} lacks {part}");
                    }
                }
                (Ok(()), None) => {}
                (other, _) => panic!(
                    "read {i} of file {file} (kept at most {keep_open_files_max}): {other:?}"
                ),
            }
        }
        drop(engine);
        assert!(
            buf[..9000].iter().all(|&b| b == SENTINEL),
            "a refused file's bytes landed (kept at most {keep_open_files_max})"
        );
        assert!(
            buf[9000..].iter().all(|&b| b == 3),
            "the same-size replacement is read"
        );
        drop(contents);
    }
}

#[test]
fn uring_a_kept_file_changed_before_its_first_read_is_refused_at_open() {
    a_kept_file_changed_before_its_first_read_is_refused_at_open(IoChoice::Uring);
}

#[test]
fn pread_a_kept_file_changed_before_its_first_read_is_refused_at_open() {
    a_kept_file_changed_before_its_first_read_is_refused_at_open(IoChoice::Pread);
}

/// Keep-open mode: once a file has been read, every later read of it, in
/// any of the engine's threads or rings, reads that same file, even after
/// its path is replaced by a file of another size or deleted.
fn a_kept_file_is_read_as_it_was_opened_by_every_shard(choice: IoChoice) {
    let dir = tempfile::tempdir().unwrap();
    let sizes = vec![100_000u64; 2];
    let (paths, contents) = make_files(dir.path(), &sizes);
    // Three rings or threads; many reads, so every one of them gets some.
    let cfg = ReaderConfig {
        uring_threads: 3,
        pread_threads: 3,
        ..ReaderConfig::default()
    };
    let Some(mut engine) = engine(choice, table(&paths, &sizes, true), &cfg) else {
        return;
    };
    let mut first = [0u8; 2];
    let (results, _) = run_all(
        engine.as_mut(),
        &ops_into(&mut first, &[(0, 0, 1), (1, 0, 1)]),
    );
    assert!(results.values().all(Result::is_ok), "{results:?}");
    let tmp = paths[0].with_extension("new");
    fs::write(&tmp, vec![9u8; 150_000]).unwrap();
    fs::rename(&tmp, &paths[0]).unwrap();
    fs::remove_file(&paths[1]).unwrap();
    let ranges: Vec<(u32, u64, u64)> = (0..600u64)
        .map(|i| ((i % 2) as u32, (i * 997) % 99_000, 1000))
        .collect();
    let mut buf = vec![0u8; 600 * 1000];
    let ops = ops_into_with(&mut buf, &ranges, false);
    let (results, _) = run_all(engine.as_mut(), &ops);
    for (i, result) in &results {
        assert!(result.is_ok(), "read {i}: {result:?}");
    }
    drop(engine);
    check_bytes(&buf, &ranges, &contents);
}

#[test]
fn uring_a_kept_file_is_read_as_it_was_opened_by_every_shard() {
    a_kept_file_is_read_as_it_was_opened_by_every_shard(IoChoice::Uring);
}

#[test]
fn pread_a_kept_file_is_read_as_it_was_opened_by_every_shard() {
    a_kept_file_is_read_as_it_was_opened_by_every_shard(IoChoice::Pread);
}

/// A read that ends at the end of an unchanged file never writes its spare
/// byte: the bytes between ranges keep their sentinel, and every range is
/// the file's.
fn spare_byte_is_untouched_when_the_file_did_not_change(choice: IoChoice, keep_open: bool) {
    let dir = tempfile::tempdir().unwrap();
    let sizes: Vec<u64> = (0..200u64).map(|i| 1 + i * 997 % 20_000).collect();
    let (paths, contents) = make_files(dir.path(), &sizes);
    let Some(mut engine) = engine(
        choice,
        table(&paths, &sizes, keep_open),
        &ReaderConfig::default(),
    ) else {
        return;
    };
    const SENTINEL: u8 = 0xA5;
    let total: u64 = sizes.iter().map(|s| s + 1).sum();
    let mut buf = vec![SENTINEL; total as usize];
    let base = buf.as_mut_ptr();
    let mut at = 0usize;
    let mut ops = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        // Whole files, and every third one its second half alone: both end
        // at end of file.
        let offset_bytes = if i % 3 == 0 { size / 2 } else { 0 };
        let len_bytes = size - offset_bytes;
        ops.push(ReadOp {
            file: i as u32,
            offset_bytes,
            len_bytes,
            dest: base.wrapping_add(at),
            spare_byte: true,
            user_data: i as u64,
        });
        at += len_bytes as usize + 1;
    }
    let (results, _) = run_all(engine.as_mut(), &ops);
    let mut at = 0usize;
    for (i, op) in ops.iter().enumerate() {
        assert!(
            results[&(i as u64)].is_ok(),
            "read {i}: {:?}",
            results[&(i as u64)]
        );
        let (o, n) = (op.offset_bytes as usize, op.len_bytes as usize);
        assert!(
            buf[at..at + n] == contents[i][o..o + n],
            "read {i}: bytes differ from the file"
        );
        assert_eq!(buf[at + n], SENTINEL, "read {i} wrote its spare byte");
        at += n + 1;
    }
}

#[test]
fn uring_spare_byte_is_untouched_when_the_file_did_not_change() {
    spare_byte_is_untouched_when_the_file_did_not_change(IoChoice::Uring, false);
    spare_byte_is_untouched_when_the_file_did_not_change(IoChoice::Uring, true);
}

#[test]
fn pread_spare_byte_is_untouched_when_the_file_did_not_change() {
    spare_byte_is_untouched_when_the_file_did_not_change(IoChoice::Pread, false);
    spare_byte_is_untouched_when_the_file_did_not_change(IoChoice::Pread, true);
}

#[test]
fn uring_grown_file_is_a_grew_error() {
    grown_file_is_a_grew_error(IoChoice::Uring, false);
}

#[test]
fn uring_grown_kept_open_file_is_a_grew_error() {
    grown_file_is_a_grew_error(IoChoice::Uring, true);
}

#[test]
fn pread_grown_file_is_a_grew_error() {
    grown_file_is_a_grew_error(IoChoice::Pread, false);
}

#[test]
fn pread_grown_kept_open_file_is_a_grew_error() {
    grown_file_is_a_grew_error(IoChoice::Pread, true);
}

#[test]
fn uring_truncated_file_is_a_changed_size_error() {
    truncated_file_is_a_changed_size_error(IoChoice::Uring, false);
}

#[test]
fn uring_truncated_kept_open_file_is_a_changed_size_error() {
    truncated_file_is_a_changed_size_error(IoChoice::Uring, true);
}

#[test]
fn pread_truncated_file_is_a_changed_size_error() {
    truncated_file_is_a_changed_size_error(IoChoice::Pread, false);
}

#[test]
fn pread_truncated_kept_open_file_is_a_changed_size_error() {
    truncated_file_is_a_changed_size_error(IoChoice::Pread, true);
}

/// A zero-length read inside its file succeeds without I/O: even the file's
/// absence is not seen.
fn zero_length_read_completes_without_io(choice: IoChoice) {
    let paths = vec![PathBuf::from("/nonexistent/ringfeed-test/never-there.bin")];
    let Some(mut engine) = engine(
        choice,
        table(&paths, &[10], false),
        &ReaderConfig::default(),
    ) else {
        return;
    };
    let ops = [ReadOp {
        file: 0,
        offset_bytes: 4,
        len_bytes: 0,
        dest: std::ptr::null_mut(),
        spare_byte: false,
        user_data: 7,
    }];
    let (results, _) = run_all(engine.as_mut(), &ops);
    assert!(matches!(results[&7], Ok(())), "{results:?}");
}

/// An empty file is read for one byte: unchanged it succeeds, grown it is
/// `Grew`, gone it is `Vanished`; with and without a spare byte.
fn empty_file_is_probed(choice: IoChoice, keep_open: bool) {
    let dir = tempfile::tempdir().unwrap();
    let sizes = vec![0u64, 0, 0, 0, 0, 0];
    let (paths, _) = make_files(dir.path(), &sizes);
    let Some(mut engine) = engine(
        choice,
        table(&paths, &sizes, keep_open),
        &ReaderConfig::default(),
    ) else {
        return;
    };
    for i in [2, 3] {
        fs::write(&paths[i], b"now with bytes").unwrap();
    }
    fs::remove_file(&paths[4]).unwrap();
    let mut buf = [0xA5u8; 8];
    let base = buf.as_mut_ptr();
    let ops: Vec<ReadOp> = (0..6u32)
        .map(|i| ReadOp {
            file: i,
            offset_bytes: 0,
            len_bytes: 0,
            dest: if i % 2 == 0 {
                base.wrapping_add(i as usize)
            } else {
                std::ptr::null_mut()
            },
            spare_byte: i % 2 == 0,
            user_data: u64::from(i),
        })
        .collect();
    let (results, _) = run_all(engine.as_mut(), &ops);
    for i in [0u64, 1, 5] {
        assert!(results[&i].is_ok(), "empty file {i}: {:?}", results[&i]);
    }
    for i in [2u64, 3] {
        // Kept open, the grown file is found when it is opened.
        let ok = if keep_open {
            matches!(
                &results[&i],
                Err(ReadError::SizeAtOpen {
                    expected_bytes: 0,
                    actual_bytes: 14,
                    ..
                })
            )
        } else {
            matches!(
                &results[&i],
                Err(ReadError::Grew {
                    expected_bytes: 0,
                    actual_bytes: 14,
                    ..
                })
            )
        };
        assert!(
            ok,
            "grown file {i} (keep open: {keep_open}): {:?}",
            results[&i]
        );
    }
    assert!(
        matches!(&results[&4], Err(ReadError::Vanished { .. })),
        "{:?}",
        results[&4]
    );
    assert_eq!(
        buf[0], 0xA5,
        "an unchanged empty file's probe wrote its spare byte"
    );
}

#[test]
fn uring_empty_file_is_probed() {
    empty_file_is_probed(IoChoice::Uring, false);
    empty_file_is_probed(IoChoice::Uring, true);
}

#[test]
fn pread_empty_file_is_probed() {
    empty_file_is_probed(IoChoice::Pread, false);
    empty_file_is_probed(IoChoice::Pread, true);
}

#[test]
fn uring_zero_length_read_completes_without_io() {
    zero_length_read_completes_without_io(IoChoice::Uring);
}

#[test]
fn pread_zero_length_read_completes_without_io() {
    zero_length_read_completes_without_io(IoChoice::Pread);
}

static ZEROS: [u8; 1 << 16] = [0; 1 << 16];

/// A read longer than one read system call allows is split, and its tail
/// lands where it belongs, its spare byte untouched. The file is sparse:
/// zeros, then a marked tail. Grown by a byte, the last chunk's probe finds
/// it, with the spare byte and with the engine's own probe buffer.
fn read_longer_than_one_chunk_is_split(choice: IoChoice) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.bin");
    let tail = pattern(9, 5000);
    let size = READ_CHUNK_BYTES_MAX + 3000;
    {
        use std::os::unix::fs::FileExt;
        let file = fs::File::create(&path).unwrap();
        file.set_len(size).unwrap();
        file.write_all_at(&tail, size - tail.len() as u64).unwrap();
    }
    let cfg = ReaderConfig::default();
    let Some(mut engine) = engine(choice, table(&[path], &[size], false), &cfg) else {
        return;
    };
    let mut buf = vec![1u8; size as usize + 1];
    let ops = ops_into(&mut buf, &[(0, 0, size)]);
    assert!(ops[0].spare_byte);
    let (results, _) = run_all(engine.as_mut(), &ops);
    assert!(results[&0].is_ok(), "{results:?}");
    assert_eq!(buf.pop(), Some(1), "the spare byte was written");
    let (head, end) = buf.split_at(buf.len() - tail.len());
    assert!(
        head.chunks(1 << 16).all(|c| c == &ZEROS[..c.len()]),
        "the sparse head is not all zeros"
    );
    assert_eq!(end, &tail[..]);
    fs::OpenOptions::new()
        .append(true)
        .open(dir.path().join("big.bin"))
        .unwrap()
        .write_all(b"+")
        .unwrap();
    buf.push(1);
    for spare in [true, false] {
        let ops = ops_into_with(&mut buf, &[(0, 0, size)], spare);
        assert_eq!(ops[0].spare_byte, spare);
        let (results, _) = run_all(engine.as_mut(), &ops);
        assert!(
            matches!(&results[&0], Err(ReadError::Grew { actual_bytes, .. }) if *actual_bytes == size + 1),
            "spare byte {spare}: {results:?}"
        );
    }
}

#[test]
fn uring_read_longer_than_one_chunk_is_split() {
    read_longer_than_one_chunk_is_split(IoChoice::Uring);
}

#[test]
fn pread_read_longer_than_one_chunk_is_split() {
    read_longer_than_one_chunk_is_split(IoChoice::Pread);
}

/// Submit is all or nothing: over the limit is `Busy`, a bad range is
/// `InvalidOp`, and neither starts a read.
fn submit_refuses_too_many_or_invalid_reads(choice: IoChoice) {
    let dir = tempfile::tempdir().unwrap();
    let (paths, _) = make_files(dir.path(), &[1000]);
    let cfg = ReaderConfig {
        queue_depth: 4,
        ..ReaderConfig::default()
    };
    let Some(mut engine) = engine(choice, table(&paths, &[1000], false), &cfg) else {
        return;
    };
    let mut buf = vec![0u8; 5000];
    let ops = ops_into(&mut buf, &[(0, 0, 1000); 5]);
    // SAFETY: regions of `buf`, which outlives the engine.
    let busy = unsafe { engine.submit(&ops) };
    assert!(
        matches!(
            busy,
            Err(ReadError::Busy {
                in_flight: 0,
                requested: 5,
                max_in_flight: 4
            })
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

#[test]
fn uring_submit_refuses_too_many_or_invalid_reads() {
    submit_refuses_too_many_or_invalid_reads(IoChoice::Uring);
}

#[test]
fn pread_submit_refuses_too_many_or_invalid_reads() {
    submit_refuses_too_many_or_invalid_reads(IoChoice::Pread);
}

/// Dropping an engine with reads in flight waits for them: the buffer is
/// freed only after, and nothing crashes.
fn drop_with_reads_in_flight_waits_for_them(choice: IoChoice) {
    let dir = tempfile::tempdir().unwrap();
    let sizes = vec![200_000u64; 64];
    let (paths, _) = make_files(dir.path(), &sizes);
    let Some(mut engine) = engine(
        choice,
        table(&paths, &sizes, false),
        &ReaderConfig::default(),
    ) else {
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

#[test]
fn uring_drop_with_reads_in_flight_waits_for_them() {
    drop_with_reads_in_flight_waits_for_them(IoChoice::Uring);
}

#[test]
fn pread_drop_with_reads_in_flight_waits_for_them() {
    drop_with_reads_in_flight_waits_for_them(IoChoice::Pread);
}

/// Drops `path`'s pages from the page cache, so reading it goes to the disk.
fn evict_from_page_cache(path: &Path) {
    use std::os::fd::AsRawFd;
    let file = fs::File::open(path).unwrap();
    file.sync_all().unwrap();
    // SAFETY: plain system call on an open descriptor.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0);
}

/// An event loop may only poll (`min_complete` 0, zero timeout). Reads that
/// wait for the disk finish off the engine's thread; their completions must
/// still show up in a poll, never only in a blocking reap.
fn poll_only_reaping_sees_completions_of_reads_from_disk(choice: IoChoice, uring_threads: usize) {
    let dir = tempfile::tempdir().unwrap();
    let sizes = vec![256u64 << 10; 32];
    let (paths, contents) = make_files(dir.path(), &sizes);
    paths.iter().for_each(|p| evict_from_page_cache(p));
    let cfg = ReaderConfig {
        uring_threads,
        ..ReaderConfig::default()
    };
    let Some(mut engine) = engine(choice, table(&paths, &sizes, false), &cfg) else {
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
            "{} of {} completions after 30 s of polling",
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

#[test]
fn uring_poll_only_reaping_sees_completions_of_reads_from_disk() {
    poll_only_reaping_sees_completions_of_reads_from_disk(IoChoice::Uring, 1);
}

#[test]
fn uring_with_three_rings_poll_only_reaping_sees_completions_of_reads_from_disk() {
    poll_only_reaping_sees_completions_of_reads_from_disk(IoChoice::Uring, 3);
}

#[test]
fn pread_poll_only_reaping_sees_completions_of_reads_from_disk() {
    poll_only_reaping_sees_completions_of_reads_from_disk(IoChoice::Pread, 1);
}

#[test]
fn reap_returns_when_nothing_is_in_flight_or_the_timeout_passes() {
    let paths = vec![PathBuf::from("/ringfeed-test-unused")];
    for choice in [IoChoice::Uring, IoChoice::Pread] {
        let Some(mut engine) = engine(choice, table(&paths, &[1], false), &ReaderConfig::default())
        else {
            continue;
        };
        let mut out = Vec::new();
        assert_eq!(engine.reap(&mut out, 10, None).unwrap(), 0, "{choice}");
        assert_eq!(
            engine
                .reap(&mut out, 10, Some(Duration::from_millis(1)))
                .unwrap(),
            0,
            "{choice}"
        );
    }
}

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

/// Printed by a child test once it has done its checks.
const CHILD_MARKER: &str = "child-checks-done";
/// Set for child tests, which do nothing without it.
const CHILD_ENV: &str = "RINGFEED_TEST_CHILD";

/// Runs the ignored test `name` of this same binary in a child process with
/// `env` set, and checks that it passed. Used for process-wide state (the
/// environment, rlimits) that must not race the other tests.
fn run_child_test(name: &str, env: &[(&str, &str)]) {
    let exe = std::env::current_exe().unwrap();
    let output = std::process::Command::new(exe)
        .args([
            "--exact",
            name,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "child {name} failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains(CHILD_MARKER) || stderr.contains(CHILD_MARKER),
        "child {name} did not run its checks:\n{stdout}\n{stderr}"
    );
}

fn in_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

#[test]
fn auto_falls_back_when_the_environment_variable_disables_io_uring() {
    run_child_test("env_disable_child", &[(IO_URING_DISABLE_ENV, "1")]);
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

/// The kernel caps a registered file table at RLIMIT_NOFILE. Under a low
/// limit io_uring gets fewer open/read/close slots than reads in flight, and
/// reads queue for a slot; pread keeps fewer files open.
#[test]
fn reads_still_complete_when_rlimit_nofile_is_below_the_queue_depth() {
    run_child_test("low_nofile_child", &[]);
}

#[test]
#[ignore = "run in a child process by reads_still_complete_when_rlimit_nofile_is_below_the_queue_depth"]
fn low_nofile_child() {
    if !in_child() {
        return;
    }
    let limit = libc::rlimit {
        rlim_cur: 48,
        rlim_max: 48,
    };
    // SAFETY: a valid rlimit; this child process runs this one test alone.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    for (choice, keep_open) in [
        (IoChoice::Uring, false),
        (IoChoice::Uring, true),
        (IoChoice::Pread, true),
    ] {
        many_files_and_large_ranges_land_byte_exact(choice, keep_open);
    }
    println!("{CHILD_MARKER}");
}

#[test]
fn io_choice_parses_the_command_line_words() {
    assert_eq!("auto".parse::<IoChoice>().unwrap(), IoChoice::Auto);
    assert_eq!("uring".parse::<IoChoice>().unwrap(), IoChoice::Uring);
    assert_eq!("io_uring".parse::<IoChoice>().unwrap(), IoChoice::Uring);
    assert_eq!("pread".parse::<IoChoice>().unwrap(), IoChoice::Pread);
    let e = "mmap".parse::<IoChoice>().unwrap_err().to_string();
    assert!(
        e.contains("mmap") && e.contains("auto, uring or pread"),
        "{e}"
    );
    assert_eq!(IoChoice::Uring.to_string(), "uring");
}

#[test]
fn file_table_refuses_relative_paths_and_mismatched_sizes() {
    let relative = FileTable::new(vec![PathBuf::from("data/a.bin")], vec![1], false);
    assert!(matches!(relative, Err(ReadError::InvalidFileTable { .. })));
    let mismatched = FileTable::new(
        vec![PathBuf::from("/a"), PathBuf::from("/b")],
        vec![1],
        false,
    );
    assert!(matches!(
        mismatched,
        Err(ReadError::InvalidFileTable { .. })
    ));
    let ok = FileTable::new(vec![PathBuf::from("/a")], vec![5], true).unwrap();
    assert_eq!(
        (ok.len(), ok.size_bytes(0), ok.path(0), ok.keep_open()),
        (1, Some(5), Some(PathBuf::from("/a")), true)
    );
}

#[test]
fn config_out_of_its_limits_is_refused() {
    let paths = vec![PathBuf::from("/ringfeed-test-unused")];
    for cfg in [
        ReaderConfig {
            queue_depth: 0,
            ..ReaderConfig::default()
        },
        ReaderConfig {
            queue_depth: 1 << 20,
            ..ReaderConfig::default()
        },
        ReaderConfig {
            pread_threads: 0,
            ..ReaderConfig::default()
        },
    ] {
        let result = open_engine(IoChoice::Pread, table(&paths, &[1], false), &cfg);
        assert!(
            matches!(result, Err(ReadError::InvalidConfig { .. })),
            "{cfg:?}"
        );
    }
}

// ---- figures (ignored: run with --release --ignored --nocapture bench) ----

/// User plus system CPU time of this process, every thread (io_uring's
/// io-wq workers are threads of the process too).
fn cpu_seconds() -> f64 {
    // SAFETY: all-zero is a valid rusage, which getrusage fills.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is valid for writes for the call.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn bench_env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One backend under measurement.
struct BenchRun {
    name: String,
    engine: Box<dyn ReadEngine>,
    seconds: Vec<f64>,
    cpu_seconds: f64,
}

/// One pass: every op, keeping the engine full, submitting and reaping in
/// batches of `batch`. Returns the seconds it took.
fn bench_pass(engine: &mut dyn ReadEngine, ops: &[ReadOp], batch: usize) -> f64 {
    let start = Instant::now();
    let mut out = Vec::with_capacity(engine.max_in_flight());
    let (mut next, mut done) = (0, 0);
    while done < ops.len() {
        let room = engine.max_in_flight() - engine.in_flight();
        if next < ops.len() && room >= batch.min(ops.len() - next) {
            let n = room.min(ops.len() - next);
            // SAFETY: disjoint regions of the bench's buffer, untouched until reaped.
            unsafe { engine.submit(&ops[next..next + n]) }.unwrap();
            next += n;
        }
        out.clear();
        done += engine
            .reap(&mut out, batch.min(engine.in_flight()), None)
            .unwrap();
        assert!(out.iter().all(|c| c.result.is_ok()), "{out:?}");
    }
    start.elapsed().as_secs_f64()
}

/// Reads every file whole into its own region of one buffer with each
/// backend of `RINGFEED_BENCH_BACKENDS`, passes interleaved so that load from
/// elsewhere hits all alike; prints best and median pass and CPU time.
fn bench_whole_files(label: &str, paths: &[PathBuf], size: u64) {
    let batch = bench_env("RINGFEED_BENCH_BATCH", 64);
    println!(
        "{label}: {} files, submitted and reaped in batches of {batch}",
        paths.len()
    );
    let sizes = vec![size; paths.len()];
    let mut runs: Vec<BenchRun> = bench_backends()
        .into_iter()
        .filter_map(|(name, choice, cfg)| {
            let engine = engine(choice, table(paths, &sizes, false), &cfg)?;
            Some(BenchRun {
                name,
                engine,
                seconds: Vec::new(),
                cpu_seconds: 0.0,
            })
        })
        .collect();
    let mut buf = vec![0u8; paths.len() * size as usize];
    buf.iter_mut().step_by(4096).for_each(|b| *b = 1); // fault the pages in before timing
    let ranges: Vec<(u32, u64, u64)> = (0..paths.len() as u32).map(|f| (f, 0, size)).collect();
    let ops = ops_into(&mut buf, &ranges);
    // One untimed pass puts every file in the page cache.
    if let Some(run) = runs.first_mut() {
        bench_pass(run.engine.as_mut(), &ops, batch);
    }
    for _ in 0..bench_env("RINGFEED_BENCH_PASSES", 10) {
        for run in runs.iter_mut() {
            let cpu_start = cpu_seconds();
            run.seconds
                .push(bench_pass(run.engine.as_mut(), &ops, batch));
            run.cpu_seconds += cpu_seconds() - cpu_start;
        }
    }
    let bytes = (paths.len() as u64 * size) as f64;
    for run in runs.iter_mut() {
        run.seconds.sort_by(f64::total_cmp);
        let (best, median) = (run.seconds[0], run.seconds[run.seconds.len() / 2]);
        println!(
            "  {:<22} best {:>5.2} GB/s {:>7.0} files/s | median {:>5.2} GB/s {:>7.0} files/s | {:>5.2} CPU s/GB",
            run.name,
            bytes / best / 1e9,
            paths.len() as f64 / best,
            bytes / median / 1e9,
            paths.len() as f64 / median,
            run.cpu_seconds / run.seconds.len() as f64 / (bytes / 1e9),
        );
    }
    drop(runs);
    assert!(
        buf[..size as usize] == pattern(0, size)[..],
        "file 0 arrived wrong"
    );
}

/// Backends to measure, from `RINGFEED_BENCH_BACKENDS`: a comma-separated
/// list of `uring`, `pread`, with options after colons: `uring:qd=512`,
/// `uring:threads=1` (`uring_threads`), `pread:threads=8`
/// (`pread_threads`). Default `uring,pread`.
fn bench_backends() -> Vec<(String, IoChoice, ReaderConfig)> {
    let list =
        std::env::var("RINGFEED_BENCH_BACKENDS").unwrap_or_else(|_| "uring,pread".to_string());
    list.split(',')
        .map(|spec| {
            let mut words = spec.split(':');
            let choice: IoChoice = words.next().unwrap().parse().unwrap();
            let mut cfg = bench_config();
            for option in words {
                let (key, value) = option.split_once('=').unwrap();
                let number = || value.parse::<usize>().unwrap();
                match key {
                    "qd" => cfg.queue_depth = number() as u32,
                    "threads" if choice == IoChoice::Pread => cfg.pread_threads = number(),
                    "threads" => cfg.uring_threads = number(),
                    _ => panic!("unknown bench option {key}"),
                }
            }
            (spec.to_string(), choice, cfg)
        })
        .collect()
}

fn bench_config() -> ReaderConfig {
    ReaderConfig {
        queue_depth: bench_env("RINGFEED_BENCH_QD", 256) as u32,
        pread_threads: bench_env("RINGFEED_BENCH_THREADS", 16),
        ..ReaderConfig::default()
    }
}

#[test]
#[ignore = "prints figures; run with --release --ignored --nocapture bench"]
fn bench_20000_files_of_100_kb_from_warm_page_cache() {
    bench_files_of("100 KB files", 100_000);
}

#[test]
#[ignore = "prints figures; run with --release --ignored --nocapture bench"]
fn bench_20000_files_of_4_kib_from_warm_page_cache() {
    bench_files_of("4 KiB files", 4096);
}

/// `RINGFEED_BENCH_FILES` (20,000) files of `size` bytes, in a temporary
/// directory, or kept between runs in `RINGFEED_BENCH_DIR` if set.
fn bench_files_of(label: &str, size: u64) {
    let count = bench_env("RINGFEED_BENCH_FILES", 20_000);
    let temp = tempfile::tempdir().unwrap();
    let dir = match std::env::var_os("RINGFEED_BENCH_DIR") {
        Some(root) => Path::new(&root).join(format!("{count}x{size}")),
        None => temp.path().to_path_buf(),
    };
    let paths: Vec<PathBuf> = (0..count)
        .map(|i| dir.join(format!("f{i:06}.bin")))
        .collect();
    if !paths
        .iter()
        .all(|p| fs::metadata(p).is_ok_and(|m| m.len() == size))
    {
        fs::create_dir_all(&dir).unwrap();
        make_files(&dir, &vec![size; count]);
    }
    bench_whole_files(label, &paths, size);
}

/// A table relative to a root directory (what the loader builds): files in
/// nested directories read byte-exact through openat from the root, and a
/// vanished file is reported with its full path.
fn files_under_a_root_read_byte_exact_and_errors_name_the_full_path(choice: IoChoice) {
    let dir = tempfile::tempdir().unwrap();
    let rels = ["a/b/one.bin", "a/two.bin", "three.bin", "a/b/c/four.bin"];
    let sizes: Vec<u64> = vec![5000, 1, 70_000, 4096];
    let mut contents = Vec::new();
    for (i, rel) in rels.iter().enumerate() {
        let path = dir.path().join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let content = pattern(i as u32, sizes[i]);
        fs::write(&path, &content).unwrap();
        contents.push(content);
    }
    let files = FileTable::under_root(
        dir.path(),
        rels.iter().map(|r| r.as_bytes()),
        sizes.clone(),
        false,
    )
    .unwrap();
    assert_eq!(files.path(3), Some(dir.path().join("a/b/c/four.bin")));
    let Some(mut engine) = engine(choice, Arc::new(files), &ReaderConfig::default()) else {
        return;
    };
    let ranges: Vec<(u32, u64, u64)> = (0..4u32)
        .map(|f| (f, 0, sizes[f as usize]))
        .chain([(2, 1000, 5000)])
        .collect();
    let total: u64 = ranges.iter().map(|r| r.2).sum();
    let mut buf = vec![0u8; total as usize];
    let ops = ops_into(&mut buf, &ranges);
    let (results, _) = run_all(engine.as_mut(), &ops);
    assert!(results.values().all(Result::is_ok), "{results:?}");
    check_bytes(&buf, &ranges, &contents);

    fs::remove_file(dir.path().join("a/two.bin")).unwrap();
    let mut one = [0u8; 1];
    let ops = ops_into(&mut one, &[(1, 0, 1)]);
    let (results, _) = run_all(engine.as_mut(), &ops);
    let message = results[&0].as_ref().unwrap_err().to_string();
    let full = dir.path().join("a/two.bin").display().to_string();
    assert!(
        message.contains(&full) && message.contains("vanished"),
        "{message}"
    );
}

#[test]
fn uring_reads_files_under_a_root_byte_exact() {
    files_under_a_root_read_byte_exact_and_errors_name_the_full_path(IoChoice::Uring);
}

#[test]
fn pread_reads_files_under_a_root_byte_exact() {
    files_under_a_root_read_byte_exact_and_errors_name_the_full_path(IoChoice::Pread);
}

#[test]
fn a_table_under_a_root_refuses_bad_paths_and_a_missing_root() {
    let dir = tempfile::tempdir().unwrap();
    let bad = |rels: &[&[u8]]| {
        let e = FileTable::under_root(dir.path(), rels.iter().copied(), vec![1; rels.len()], false)
            .unwrap_err();
        assert!(matches!(e, ReadError::InvalidFileTable { .. }), "{e:?}");
        e.to_string()
    };
    assert!(bad(&[b"/etc/passwd"]).contains("not a path relative to"));
    assert!(bad(&[b""]).contains("not a path relative to"));
    assert!(bad(&[b"a\0b"]).contains("NUL"));
    let e = FileTable::under_root(dir.path(), [b"a".as_slice()].into_iter(), vec![1, 2], false)
        .unwrap_err();
    assert!(e.to_string().contains("1 paths but 2 sizes"), "{e}");
    let missing = dir.path().join("not-there");
    let e =
        FileTable::under_root(&missing, std::iter::empty::<&[u8]>(), vec![], false).unwrap_err();
    assert!(
        e.to_string().contains(&missing.display().to_string()),
        "{e}"
    );
}
