//! Creating the io_uring and proving that it works, or saying in words why not.
//!
//! Like tokio's io_uring driver, the reader asks the kernel instead of
//! guessing from its version: the ring is created, the opcodes the reader uses
//! are looked up with `IORING_REGISTER_PROBE`, the sparse file table for
//! direct descriptors is registered (Linux 5.19), and one NOP must complete
//! (a seccomp filter may allow `io_uring_setup` and deny `io_uring_enter`).
//! Any failure is a reason string; `open_engine` turns it into a fallback
//! warning (`Auto`) or `ReadError::UringUnavailable` (`Uring`).

use std::io;
use std::time::Duration;

use io_uring::{opcode, types, IoUring, Probe};

use crate::reader::{nofile_limit, ReaderConfig, IO_URING_DISABLE_ENV};

/// Most entries io_uring accepts for a submission queue.
const SQ_ENTRIES_MAX: u32 = 32_768;
/// How long the start-up NOP may take.
const NOP_TIMEOUT: Duration = Duration::from_secs(2);
/// `user_data` of the start-up NOP.
pub(crate) const NOP_USER_DATA: u64 = u64::MAX;

/// A ring that passed the probe, and the size of its registered file table.
pub(crate) struct ProbedRing {
    pub(crate) ring: IoUring,
    /// Slots `0..transient_slots` serve open/read/close chains. (Keep-open
    /// mode's files are process descriptors, not slots: see `ops.rs`.)
    pub(crate) transient_slots: u32,
}

/// Creates and checks a ring for `cfg`; `Err` is the reason, in words.
pub(crate) fn open_ring(cfg: &ReaderConfig) -> Result<ProbedRing, String> {
    if cfg.disable_io_uring {
        return Err("disabled by ReaderConfig::disable_io_uring".to_string());
    }
    if let Some(value) = std::env::var_os(IO_URING_DISABLE_ENV) {
        if !value.is_empty() && value != "0" {
            return Err(format!(
                "disabled by the environment variable {IO_URING_DISABLE_ENV}={}",
                value.to_string_lossy()
            ));
        }
    }
    // A read takes at most 3 SQEs at a time; 4 per read leaves room for the
    // clean-up closes, so a full queue of reads fits in one submission.
    let sq_entries = (cfg.queue_depth.saturating_mul(4))
        .next_power_of_two()
        .min(SQ_ENTRIES_MAX);
    let ring = build_ring(sq_entries)?;
    if !ring.params().is_feature_nodrop() || !ring.params().is_feature_ext_arg() {
        return Err(
            "the kernel's io_uring lacks IORING_FEAT_NODROP or IORING_FEAT_EXT_ARG (Linux 5.11+)"
                .to_string(),
        );
    }
    check_opcodes(&ring)?;
    let table_slots = transient_slots(cfg)?;
    ring.submitter().register_files_sparse(table_slots).map_err(|e| {
        format!("registering a sparse table of {table_slots} direct descriptors failed ({e}); it needs Linux 5.19+")
    })?;
    let mut ring = ring;
    run_nop(&mut ring)?;
    Ok(ProbedRing {
        ring,
        transient_slots: table_slots,
    })
}

fn build_ring(sq_entries: u32) -> Result<IoUring, String> {
    let cq_entries = sq_entries.saturating_mul(2);
    // COOP_TASKRUN: no interrupt of the reader thread for each completion;
    // SUBMIT_ALL: one bad SQE does not hold back the rest of a batch.
    let tuned = IoUring::builder()
        .setup_cqsize(cq_entries)
        .setup_submit_all()
        .setup_coop_taskrun()
        .setup_taskrun_flag()
        .build(sq_entries);
    match tuned {
        Ok(ring) => Ok(ring),
        // Kernels before 5.19 refuse the flags; try once without them.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => IoUring::builder()
            .setup_cqsize(cq_entries)
            .build(sq_entries)
            .map_err(|e| describe_setup_error(&e)),
        Err(e) => Err(describe_setup_error(&e)),
    }
}

fn describe_setup_error(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOSYS) => format!(
            "io_uring_setup(2) is not implemented ({e}): the kernel is older than 5.1 or built without \
             io_uring, or this is gVisor, or a seccomp filter answers ENOSYS"
        ),
        Some(libc::EPERM) => match std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").as_deref().map(str::trim) {
            Ok("2") => format!("io_uring is switched off by the sysctl kernel.io_uring_disabled=2 ({e})"),
            Ok("1") => format!(
                "io_uring is restricted by the sysctl kernel.io_uring_disabled=1 to the group \
                 kernel.io_uring_group, and this process is not in it ({e})"
            ),
            _ => format!("io_uring_setup(2) was denied ({e}), most likely by a seccomp filter such as Docker's default profile"),
        },
        Some(libc::ENFILE) => format!(
            "io_uring_setup(2) found the system's table of open files full ({e}): see `sysctl fs.file-nr` and fs.file-max"
        ),
        Some(libc::EMFILE) => format!(
            "io_uring_setup(2) found no file descriptor free for the ring ({e}; ulimit -n is {}): raise `ulimit -n`",
            nofile_limit()
        ),
        Some(libc::ENOMEM) => format!(
            "io_uring_setup(2) could not allocate the ring ({e}); before Linux 5.12 it counts against \
             RLIMIT_MEMLOCK (`ulimit -l`), or lower the queue depth"
        ),
        _ => format!("io_uring_setup(2) failed: {e}"),
    }
}

fn check_opcodes(ring: &IoUring) -> Result<(), String> {
    let mut probe = Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|e| format!("IORING_REGISTER_PROBE failed ({e}); it needs Linux 5.6+"))?;
    let needed = [
        (opcode::Nop::CODE, "NOP"),
        (opcode::OpenAt::CODE, "OPENAT"),
        (opcode::Read::CODE, "READ"),
        (opcode::Readv::CODE, "READV"),
        (opcode::Close::CODE, "CLOSE"),
    ];
    let missing: Vec<&str> = needed
        .iter()
        .filter(|(code, _)| !probe.is_supported(*code))
        .map(|(_, name)| *name)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the kernel's io_uring lacks the opcodes {}",
            missing.join(", ")
        ))
    }
}

/// Slots of the registered file table: one per read in flight, for its
/// open/read/close chain, under RLIMIT_NOFILE, which the kernel applies to
/// the table's size.
fn transient_slots(cfg: &ReaderConfig) -> Result<u32, String> {
    let slots = cfg.queue_depth.min(nofile_limit());
    if slots == 0 {
        return Err(
            "RLIMIT_NOFILE is 0, which leaves no room for a registered file table".to_string(),
        );
    }
    Ok(slots)
}

fn run_nop(ring: &mut IoUring) -> Result<(), String> {
    let nop = opcode::Nop::new().build().user_data(NOP_USER_DATA);
    // SAFETY: a NOP references no memory.
    unsafe { ring.submission().push(&nop) }
        .map_err(|_| "the new ring's submission queue is full".to_string())?;
    let timeout = types::Timespec::from(NOP_TIMEOUT);
    let args = types::SubmitArgs::new().timespec(&timeout);
    loop {
        match ring.submitter().submit_with_args(1, &args) {
            Ok(_) => break,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) if e.raw_os_error() == Some(libc::ETIME) => {
                return Err(format!("a NOP did not complete within {NOP_TIMEOUT:?}"));
            }
            Err(e) => {
                return Err(format!(
                    "io_uring_enter(2) failed ({e}), most likely denied by a seccomp filter"
                ))
            }
        }
    }
    match ring.completion().next() {
        Some(cqe) if cqe.user_data() == NOP_USER_DATA && cqe.result() == 0 => Ok(()),
        Some(cqe) => Err(format!(
            "a NOP completed with {}",
            io::Error::from_raw_os_error(-cqe.result())
        )),
        None => Err("a NOP reported no completion".to_string()),
    }
}
