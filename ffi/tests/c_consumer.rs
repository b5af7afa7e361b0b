//! The C ABI from real C programs that see nothing but include/ringfeed.h and
//! libringfeed.so (sources in tests/c/):
//! - `consumer.c` reads one rank of a `ringfeed ring-test-producer` beside the
//!   Rust `ring-test-consumer` on the other rank, checking every byte;
//! - `header_only.c` proves the header compiles warning-free as C11 and as
//!   C++ and that its `_Static_assert`s hold;
//! - `attach_errors.c` checks RF_TIMEOUT, RF_E_RANK and RF_E_INVALID;
//! - `held_and_fork.c` checks RF_E_HELD and RF_E_FORKED, and that neither
//!   loses or repeats a batch;
//! - `exit_handlers.c` calls the library from an `atexit` handler and a
//!   thread-local destructor, after an earlier failure on the same thread;
//! - `epoch_counts.c` reads each rank of a `ringfeed serve --tail keep`: the
//!   same step count for every rank, short and empty last batches, every
//!   sample once an epoch.
//!
//! Needs a C compiler (`cc`, or `$CC`) and the `ringfeed` binary built in the
//! same target directory as this test (`cargo build -p ringfeed`, with
//! `--release` for release tests; `cargo test --workspace` builds it too).
//! libringfeed.so is the one this `cargo test` built beside the test binary.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Longest any child may run before the test kills it and fails.
const HANG: Duration = Duration::from_secs(60);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// target/<profile>: this test runs from target/<profile>/deps/.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("the test binary lies in target/<profile>/deps")
        .to_path_buf()
}

fn profile_name() -> String {
    profile_dir()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn built(file: &str, package: &str) -> PathBuf {
    let path = profile_dir().join(file);
    let release = if profile_name() == "release" {
        " --release"
    } else {
        ""
    };
    assert!(
        path.exists(),
        "{} is missing: build it first with `cargo build -p {package}{release}`",
        path.display()
    );
    path
}

/// `cargo test -p ringfeed-ffi` builds the cdylib beside this test, in deps/,
/// fresh from the sources under test; `cargo build` puts it in target/<profile>.
fn libringfeed_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("the test binary lies in a directory");
    if deps.join("libringfeed.so").exists() {
        return deps.to_path_buf();
    }
    built("libringfeed.so", "ringfeed-ffi");
    profile_dir()
}

fn ringfeed_bin() -> PathBuf {
    built("ringfeed", "ringfeed")
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_string())
}

fn tmp_dir() -> PathBuf {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("c-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the build directory for the C tests");
    dir
}

/// Runs a compiler command; panics with its output if it fails.
fn compile(mut cmd: Command, what: &str) {
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) => {
            panic!("cannot run the C compiler for {what} ({cmd:?}): {e}; install one or set $CC")
        }
    };
    assert!(
        out.status.success(),
        "{what} does not compile:\n{cmd:?}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds tests/c/NAME.c against the header and libringfeed.so; returns the executable.
fn build_c_program(name: &str) -> PathBuf {
    let lib_dir = libringfeed_dir();
    let exe = tmp_dir().join(name);
    let mut cmd = Command::new(cc());
    cmd.args(["-Wall", "-Werror", "-std=c11", "-I"])
        .arg(repo_root().join("include"))
        .arg(repo_root().join(format!("tests/c/{name}.c")))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&lib_dir)
        .arg("-lringfeed")
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()));
    compile(cmd, &format!("tests/c/{name}.c"));
    exe
}

/// Waits for a child within `HANG`, killing it on a timeout.
fn finish(mut child: Child, what: &str) -> Output {
    let deadline = Instant::now() + HANG;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("reap");
            panic!(
                "{what} hung for {HANG:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("collect output")
}

fn assert_printed(out: &Output, what: &str, want: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.lines().any(|l| l.trim() == want),
        "{what}: exit {:?}, expected a line {want:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn unique_name(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("c-{tag}-{}-{nanos}", std::process::id())
}

/// Kills and reaps a child if the test fails before it ends; removes the segment.
struct Cleanup {
    children: Vec<Child>,
    name: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(format!("/dev/shm/ringfeed-{}", self.name));
    }
}

#[test]
fn c_consumer_and_rust_consumer_each_read_2000_intact_batches() {
    let consumer = build_c_program("consumer");
    let bin = ringfeed_bin();
    let name = unique_name("pair");
    let batches = "2000";
    let mut cleanup = Cleanup {
        children: Vec::new(),
        name: name.clone(),
    };
    let producer = Command::new(&bin)
        .args([
            "ring-test-producer",
            "--name",
            &name,
            "--world-size",
            "2",
            "--batches",
            batches,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the producer");
    // Default pattern: 4 samples of 64 bytes per batch (tests/README.md).
    let c_rank0 = Command::new(&consumer)
        .args([name.as_str(), "0", "2", "4", "64", batches])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the C consumer");
    let rust_rank1 = Command::new(&bin)
        .args([
            "ring-test-consumer",
            "--name",
            &name,
            "--rank",
            "1",
            "--world-size",
            "2",
            "--expect-batches",
            batches,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the Rust consumer");
    let c_out = finish(c_rank0, "the C consumer on rank 0");
    let rust_out = finish(rust_rank1, "the Rust consumer on rank 1");
    let producer_out = finish(producer, "the producer");
    cleanup.children.clear();
    assert_printed(&c_out, "C consumer, rank 0", "ok 2000");
    assert_printed(&rust_out, "Rust consumer, rank 1", "ok 2000");
    assert_printed(&producer_out, "producer", "ready");
}

#[test]
fn header_compiles_alone_as_c99_c11_cxx11_and_cxx17_and_its_static_asserts_hold() {
    let include = repo_root().join("include");
    let source = repo_root().join("tests/c/header_only.c");
    for std in ["c99", "c11"] {
        let mut c = Command::new(cc());
        c.args(["-Wall", "-Wextra", "-Werror", "-pedantic"])
            .arg(format!("-std={std}"))
            .arg("-I")
            .arg(&include)
            .arg("-c")
            .arg(&source)
            .arg("-o")
            .arg(tmp_dir().join(format!("header_only_{std}.o")));
        compile(
            c,
            &format!("include/ringfeed.h as {std} (tests/c/header_only.c)"),
        );
    }
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".to_string());
    if Command::new(&cxx)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("CI=true but there is no C++ compiler ({cxx}) to check the header with");
        }
        eprintln!("no C++ compiler ({cxx}): skipping the C++ check of the header");
        return;
    }
    for std in ["c++11", "c++17"] {
        let mut cpp = Command::new(&cxx);
        cpp.args([
            "-x",
            "c++",
            "-fsyntax-only",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
        ])
        .arg(format!("-std={std}"))
        .arg("-I")
        .arg(&include)
        .arg(&source);
        compile(
            cpp,
            &format!("include/ringfeed.h as {std} (tests/c/header_only.c)"),
        );
    }
}

#[test]
fn attach_errors_from_c_say_what_went_wrong() {
    let exe = build_c_program("attach_errors");
    let name = unique_name("never");
    let child = Command::new(&exe)
        .arg(&name)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn attach_errors");
    let out = finish(child, "attach_errors");
    assert_printed(&out, "attach_errors", "ok");
}

#[test]
fn calls_from_exit_handlers_after_an_earlier_failure_return_their_code_instead_of_aborting() {
    let exe = build_c_program("exit_handlers");
    let child = Command::new(&exe)
        .arg(unique_name("exit"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn exit_handlers");
    let out = finish(child, "exit_handlers");
    assert_printed(&out, "exit_handlers", "thread-local destructor ok");
    assert_printed(&out, "exit_handlers", "atexit ok");
}

#[test]
fn a_held_slot_and_a_forked_child_get_clear_codes_from_c_and_lose_nothing() {
    let exe = build_c_program("held_and_fork");
    let name = unique_name("held");
    let mut cleanup = Cleanup {
        children: Vec::new(),
        name: name.clone(),
    };
    let producer = Command::new(ringfeed_bin())
        .args([
            "ring-test-producer",
            "--name",
            &name,
            "--world-size",
            "1",
            "--batches",
            "6",
            "--slots-per-rank",
            "2",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the producer");
    cleanup.children.push(producer);
    let child = Command::new(&exe)
        .arg(&name)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn held_and_fork");
    let out = finish(child, "held_and_fork");
    let producer = cleanup.children.pop().expect("the producer");
    let producer_out = finish(producer, "the producer");
    assert_printed(&out, "held_and_fork", "ok");
    assert_printed(&producer_out, "producer", "ready");
}

/// Batches as `(epoch, step, indices)`.
type Batches = Vec<(u64, u64, Vec<u64>)>;

/// Parses epoch_counts's output: its `epoch` figures and each batch.
fn epoch_counts_output(out: &Output, what: &str) -> (Vec<u64>, Batches) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what}: exit {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let words = |l: &str| -> Vec<u64> {
        l.split_whitespace()
            .skip(1)
            .map(|w| w.parse().expect("a number"))
            .collect()
    };
    let figures = stdout
        .lines()
        .find(|l| l.starts_with("epoch "))
        .map(words)
        .unwrap_or_default();
    let batches = stdout
        .lines()
        .filter(|l| l.starts_with("batch "))
        .map(|l| {
            let w = words(l);
            assert_eq!(w.len() as u64, 3 + w[2], "{what}: {l}");
            (w[0], w[1], w[3..].to_vec())
        })
        .collect();
    (figures, batches)
}

#[test]
fn a_kept_tail_gives_c_every_rank_the_same_steps_with_short_and_empty_last_batches() {
    // 50 files, 3 ranks x 4: 5 steps an epoch, the last of 2 samples (rank 0
    // gets 2, ranks 1 and 2 an empty batch), in manifest order.
    let exe = build_c_program("epoch_counts");
    let data = tmp_dir().join("tail-keep-data");
    std::fs::create_dir_all(&data).expect("make the data directory");
    for i in 0..50u8 {
        std::fs::write(data.join(format!("{i:03}")), [i; 8]).expect("write a sample file");
    }
    let name = unique_name("tail");
    let mut cleanup = Cleanup {
        children: Vec::new(),
        name: name.clone(),
    };
    let loader = Command::new(ringfeed_bin())
        .args(["serve", "--source"])
        .arg(&data)
        .args(["--name", &name, "--world-size", "3", "--batch-size", "4"])
        .args(["--epochs", "2", "--tail", "keep", "--shuffle", "none"])
        .args(["--manifest-cache", "off"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ringfeed serve");
    cleanup.children.push(loader);
    let ranks: Vec<Child> = (0..3)
        .map(|rank| {
            Command::new(&exe)
                .args([&name, &rank.to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn epoch_counts")
        })
        .collect();
    let mut served: Vec<Vec<u64>> = vec![Vec::new(); 2];
    for (rank, child) in ranks.into_iter().enumerate() {
        let (figures, batches) =
            epoch_counts_output(&finish(child, "epoch_counts"), "epoch_counts");
        assert_eq!(
            figures,
            [1, 5, 50, 50],
            "rank {rank}: tail keep, 5 steps, 50 samples"
        );
        assert_eq!(
            batches.len(),
            10,
            "rank {rank}: 5 steps in each of 2 epochs"
        );
        for (epoch, step, indices) in batches {
            let want = if step < 4 { 4 } else { [2, 0, 0][rank] };
            assert_eq!(indices.len(), want, "rank {rank} epoch {epoch} step {step}");
            // Manifest order: position step·12 + rank·4 + i.
            let first = step * 12 + rank as u64 * 4;
            assert_eq!(indices, (first..first + want as u64).collect::<Vec<u64>>());
            served[epoch as usize].extend(indices);
        }
    }
    for mut epoch in served {
        epoch.sort_unstable();
        assert_eq!(
            epoch,
            (0..50).collect::<Vec<u64>>(),
            "every sample once an epoch"
        );
    }
    let loader = cleanup.children.pop().expect("the loader");
    let out = finish(loader, "ringfeed serve");
    assert!(
        out.status.success(),
        "the loader: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
