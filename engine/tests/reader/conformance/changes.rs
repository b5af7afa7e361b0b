//! Files that change under the engine: vanished, truncated, grown, empty,
//! replaced before or after keep-open mode opened them. Each change is an
//! error that names the file (and both sizes), on the reads it touches only.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use ringfeed::reader::{ReadEngine, ReadError, ReadOp, ReaderConfig};

use super::{open, EngineFactory};
use crate::support::{check_bytes, make_files, ops_into, ops_into_with, run_all, table};

/// A file deleted after the table was built fails its read, and only it,
/// with `Vanished` naming its path.
fn vanished_file_fails_only_its_reads<E: EngineFactory>(keep_open: bool) {
    let dir = tempfile::tempdir().unwrap();
    let sizes = vec![4096u64; 10];
    let (paths, _) = make_files(dir.path(), &sizes);
    let Some(mut engine) = open::<E>(table(&paths, &sizes, keep_open), &ReaderConfig::default())
    else {
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

/// See `vanished_file_fails_only_its_reads`; files opened per read.
pub fn vanished_file_is_an_error_that_names_it<E: EngineFactory>() {
    vanished_file_fails_only_its_reads::<E>(false);
}

/// See `vanished_file_fails_only_its_reads`; files kept open.
pub fn vanished_kept_open_file_is_an_error_that_names_it<E: EngineFactory>() {
    vanished_file_fails_only_its_reads::<E>(true);
}

/// Two files of 100,000 bytes in a table, an engine over it, then `change`
/// applied to the first file. In keep-open mode both files are read once
/// before the change, so that they are kept open when it happens (a change
/// before a kept file's first read is `SizeAtOpen`, see
/// `a_kept_file_changed_before_its_first_read_is_refused_at_open`). None
/// where the engine cannot run here.
fn two_files_then_change<E: EngineFactory>(
    keep_open: bool,
    change: impl FnOnce(&Path),
) -> Option<(tempfile::TempDir, Vec<PathBuf>, Box<dyn ReadEngine>)> {
    let dir = tempfile::tempdir().unwrap();
    let sizes = vec![100_000u64, 100_000];
    let (paths, _) = make_files(dir.path(), &sizes);
    let mut engine = open::<E>(table(&paths, &sizes, keep_open), &ReaderConfig::default())?;
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
fn truncated_file_fails_reads_past_its_new_end<E: EngineFactory>(keep_open: bool) {
    let truncate = |path: &Path| {
        fs::OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(60_000)
            .unwrap()
    };
    let Some((_dir, paths, mut engine)) = two_files_then_change::<E>(keep_open, truncate) else {
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

/// See `truncated_file_fails_reads_past_its_new_end`; files opened per read.
pub fn truncated_file_is_a_changed_size_error<E: EngineFactory>() {
    truncated_file_fails_reads_past_its_new_end::<E>(false);
}

/// See `truncated_file_fails_reads_past_its_new_end`; files kept open.
pub fn truncated_kept_open_file_is_a_changed_size_error<E: EngineFactory>() {
    truncated_file_fails_reads_past_its_new_end::<E>(true);
}

/// A file appended to after the table was built: every read that reaches
/// the recorded end fails with `Grew`, naming the path and both sizes; reads
/// that stop short of it, and the other file, still succeed. The probe byte
/// goes to the caller's spare byte (a longer READ or pread), then to the
/// engine's own (READV or preadv).
fn grown_file_fails_reads_to_its_recorded_end<E: EngineFactory>(keep_open: bool) {
    for spare in [true, false] {
        let append = |path: &Path| {
            fs::OpenOptions::new()
                .append(true)
                .open(path)
                .unwrap()
                .write_all(&[7u8; 5000])
                .unwrap()
        };
        let Some((_dir, paths, mut engine)) = two_files_then_change::<E>(keep_open, append) else {
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

/// See `grown_file_fails_reads_to_its_recorded_end`; files opened per read.
pub fn grown_file_is_a_grew_error<E: EngineFactory>() {
    grown_file_fails_reads_to_its_recorded_end::<E>(false);
}

/// See `grown_file_fails_reads_to_its_recorded_end`; files kept open.
pub fn grown_kept_open_file_is_a_grew_error<E: EngineFactory>() {
    grown_file_fails_reads_to_its_recorded_end::<E>(true);
}

/// An empty file is read for one byte: unchanged it succeeds, grown it is
/// `Grew` (kept open: `SizeAtOpen`), gone it is `Vanished`; with and
/// without a spare byte. Files opened per read, then kept open.
pub fn empty_file_is_probed<E: EngineFactory>() {
    for keep_open in [false, true] {
        empty_files_probed::<E>(keep_open);
    }
}

fn empty_files_probed<E: EngineFactory>(keep_open: bool) {
    let dir = tempfile::tempdir().unwrap();
    let sizes = vec![0u64, 0, 0, 0, 0, 0];
    let (paths, _) = make_files(dir.path(), &sizes);
    let Some(mut engine) = open::<E>(table(&paths, &sizes, keep_open), &ReaderConfig::default())
    else {
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

/// Keep-open mode (record datasets), with files kept and with the kept
/// limit at 0 (every read opens its file): a file replaced by one of
/// another size, or changed in place, before its first read fails every
/// read of it with `SizeAtOpen`, naming both sizes, before a byte of it
/// lands, even a record in its middle that the new file also has. A
/// replaced file of the same size is read (that change is not caught).
pub fn a_kept_file_changed_before_its_first_read_is_refused_at_open<E: EngineFactory>() {
    for keep_open_files_max in [4096, 0] {
        let dir = tempfile::tempdir().unwrap();
        let sizes = vec![100_000u64; 4];
        let (paths, contents) = make_files(dir.path(), &sizes);
        let cfg = ReaderConfig {
            keep_open_files_max,
            ..ReaderConfig::default()
        };
        let Some(mut engine) = open::<E>(table(&paths, &sizes, true), &cfg) else {
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

/// Keep-open mode: once a file has been read, every later read of it, in
/// any of the engine's threads (io_uring's rings, pread's workers), reads
/// that same file, even after its path is replaced by a file of another
/// size or deleted.
pub fn a_kept_file_is_read_as_it_was_opened_by_every_thread<E: EngineFactory>() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = vec![100_000u64; 2];
    let (paths, contents) = make_files(dir.path(), &sizes);
    // Three rings or threads; many reads, so every one of them gets some.
    let cfg = ReaderConfig {
        uring_threads: 3,
        pread_threads: 3,
        ..ReaderConfig::default()
    };
    let Some(mut engine) = open::<E>(table(&paths, &sizes, true), &cfg) else {
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
