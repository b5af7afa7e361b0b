//! Bytes land where asked: many files, big ranges, records of kept files,
//! nested paths, reads split into chunks, and nothing written past a range.

use std::fs;
use std::sync::Arc;

use ringfeed::reader::{FileTable, ReadError, ReadOp, ReaderConfig, READ_CHUNK_BYTES_MAX};

use super::{open, EngineFactory};
use crate::support::{
    check_bytes, make_files, ops_into, ops_into_with, pattern, run_all, table, Lcg,
};

/// 5000 small files of 0 to 6000 bytes and three large ones, read whole and
/// in 300 ranges, interleaved, with at least 256 reads in flight at once.
/// Also run by `lifecycle::reads_complete_under_an_rlimit_nofile_of_48`.
pub fn many_files_and_large_ranges_land_byte_exact<E: EngineFactory>(keep_open: bool) {
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
    let Some(mut engine) = open::<E>(table(&paths, &sizes, keep_open), &cfg) else {
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

/// See `many_files_and_large_ranges_land_byte_exact`; files opened per read.
pub fn reads_many_small_files_and_large_ranges_byte_exact<E: EngineFactory>() {
    many_files_and_large_ranges_land_byte_exact::<E>(false);
}

/// See `many_files_and_large_ranges_land_byte_exact`; files kept open (16
/// at most, the rest opened per read).
pub fn reads_many_small_files_and_large_ranges_byte_exact_in_keep_open_mode<E: EngineFactory>() {
    many_files_and_large_ranges_land_byte_exact::<E>(true);
}

/// Record mode: few big files, many small records, hundreds of reads of one
/// file issued before it has even been opened.
pub fn reads_records_of_kept_open_files_byte_exact<E: EngineFactory>() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = vec![4 << 20, 2 << 20];
    let (paths, contents) = make_files(dir.path(), &sizes);
    let cfg = ReaderConfig {
        queue_depth: 1024,
        ..ReaderConfig::default()
    };
    let Some(mut engine) = open::<E>(table(&paths, &sizes, true), &cfg) else {
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

/// More files than may be kept open: the rest open, read and close.
pub fn reads_files_past_the_keep_open_limit<E: EngineFactory>() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = vec![10_000u64; 40];
    let (paths, contents) = make_files(dir.path(), &sizes);
    let cfg = ReaderConfig {
        keep_open_files_max: 3,
        ..ReaderConfig::default()
    };
    let Some(mut engine) = open::<E>(table(&paths, &sizes, true), &cfg) else {
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

/// A table relative to a root directory (what the loader builds): files in
/// nested directories read byte-exact through openat from the root, and a
/// vanished file is reported with its full path.
pub fn reads_files_under_a_root_byte_exact_and_errors_name_the_full_path<E: EngineFactory>() {
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
    let Some(mut engine) = open::<E>(Arc::new(files), &ReaderConfig::default()) else {
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

/// A read that ends at the end of an unchanged file never writes its spare
/// byte: the bytes between ranges keep their sentinel, and every range is
/// the file's. Files read and closed, then kept open.
pub fn spare_byte_is_untouched_when_the_file_did_not_change<E: EngineFactory>() {
    for keep_open in [false, true] {
        spare_byte_is_untouched::<E>(keep_open);
    }
}

fn spare_byte_is_untouched<E: EngineFactory>(keep_open: bool) {
    let dir = tempfile::tempdir().unwrap();
    let sizes: Vec<u64> = (0..200u64).map(|i| 1 + i * 997 % 20_000).collect();
    let (paths, contents) = make_files(dir.path(), &sizes);
    let Some(mut engine) = open::<E>(table(&paths, &sizes, keep_open), &ReaderConfig::default())
    else {
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
            "read {i} (keep open: {keep_open}): {:?}",
            results[&(i as u64)]
        );
        let (o, n) = (op.offset_bytes as usize, op.len_bytes as usize);
        assert!(
            buf[at..at + n] == contents[i][o..o + n],
            "read {i} (keep open: {keep_open}): bytes differ from the file"
        );
        assert_eq!(
            buf[at + n],
            SENTINEL,
            "read {i} (keep open: {keep_open}) wrote its spare byte"
        );
        at += n + 1;
    }
}

/// A zero-length read inside its file succeeds without I/O: even the file's
/// absence is not seen.
pub fn zero_length_read_completes_without_io<E: EngineFactory>() {
    let paths = vec![std::path::PathBuf::from(
        "/nonexistent/ringfeed-test/never-there.bin",
    )];
    let Some(mut engine) = open::<E>(table(&paths, &[10], false), &ReaderConfig::default()) else {
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

static ZEROS: [u8; 1 << 16] = [0; 1 << 16];

/// A read longer than one read system call allows is split, and its tail
/// lands where it belongs, its spare byte untouched. The file is sparse:
/// zeros, then a marked tail. Grown by a byte, the last chunk's probe finds
/// it, with the spare byte and with the engine's own probe buffer.
pub fn read_longer_than_one_chunk_is_split<E: EngineFactory>() {
    use std::io::Write;
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
    let Some(mut engine) = open::<E>(table(&[path], &[size], false), &cfg) else {
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
