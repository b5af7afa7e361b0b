//! What every test of the readers uses: test files with known bytes, ops laid
//! out in one buffer, a loop that runs ops to completion, the checks of the
//! bytes that landed, and child processes for process-wide state.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ringfeed::reader::{
    open_engine, Completion, FileTable, IoChoice, ReadEngine, ReadError, ReadOp, ReaderConfig,
};

/// Longest a test waits for one completion before it calls the engine hung.
const REAP_TIMEOUT: Duration = Duration::from_secs(60);

/// Set (to any value) to make a refused io_uring a failure instead of a skip.
pub const REQUIRE_URING_ENV: &str = "RINGFEED_TEST_REQUIRE_URING";

/// The byte at `offset` of test file `file`: neighbours differ, and so do files.
pub fn pattern_byte(file: u32, offset: u64) -> u8 {
    (u64::from(file).wrapping_mul(131) ^ offset.wrapping_mul(7) ^ (offset >> 9)) as u8
}

/// The first `len` bytes of test file `file`.
pub fn pattern(file: u32, len: u64) -> Vec<u8> {
    (0..len).map(|o| pattern_byte(file, o)).collect()
}

/// Writes `sizes.len()` files of the given sizes with their patterns;
/// returns their paths and contents.
pub fn make_files(dir: &Path, sizes: &[u64]) -> (Vec<PathBuf>, Vec<Vec<u8>>) {
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

/// A table of absolute `paths` with their recorded `sizes`.
pub fn table(paths: &[PathBuf], sizes: &[u64], keep_open: bool) -> Arc<FileTable> {
    Arc::new(FileTable::new(paths.to_vec(), sizes.to_vec(), keep_open).unwrap())
}

/// The engine `open_engine` gives for `choice` (never a fallback), or None
/// (skip, saying why) where io_uring is refused and
/// `RINGFEED_TEST_REQUIRE_URING` is unset.
pub fn open_choice(
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
            if choice == IoChoice::Uring && std::env::var_os(REQUIRE_URING_ENV).is_none() =>
        {
            eprintln!("skipping the io_uring case: {reason}");
            None
        }
        Err(e) => panic!("open_engine({choice}): {e}"),
    }
}

/// Runs every op, keeping the engine as full as it allows. Returns the
/// completions by user_data and the most reads seen in flight.
pub fn run_all(
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
pub fn ops_into(buf: &mut [u8], ranges: &[(u32, u64, u64)]) -> Vec<ReadOp> {
    ops_into_with(buf, ranges, true)
}

/// `ops_into`, with spare bytes only if `spare`.
pub fn ops_into_with(buf: &mut [u8], ranges: &[(u32, u64, u64)], spare: bool) -> Vec<ReadOp> {
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
pub fn check_bytes(buf: &[u8], ranges: &[(u32, u64, u64)], contents: &[Vec<u8>]) {
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
pub struct Lcg(pub u64);

impl Lcg {
    /// The next number, 31 bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// Drops `path`'s pages from the page cache, so reading it goes to the disk.
pub fn evict_from_page_cache(path: &Path) {
    use std::os::fd::AsRawFd;
    let file = fs::File::open(path).unwrap();
    file.sync_all().unwrap();
    // SAFETY: plain system call on an open descriptor.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0);
}

/// Printed by a child test once it has done its checks.
pub const CHILD_MARKER: &str = "child-checks-done";
/// Set for child tests, which do nothing without it.
const CHILD_ENV: &str = "RINGFEED_TEST_CHILD";

/// Runs the ignored test `name` (its full path in this binary, such as
/// `uring::low_nofile_child`) in a child process with `env` set, and checks
/// that it passed. Used for process-wide state (the environment, rlimits)
/// that must not race the other tests.
pub fn run_child_test(name: &str, env: &[(&str, &str)]) {
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

/// Whether this process is a child started by `run_child_test`.
pub fn in_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}
