//! The io_uring backend: many reads in flight from one thread.
//!
//! A read of a file that is not kept open is one linked chain of three SQEs
//! on a direct descriptor (a slot of the ring's registered file table, never
//! a process file descriptor):
//!
//! ```text
//! OPENAT(file_index = slot) --IO_LINK--> READ(Fixed(slot)) --IO_HARDLINK--> CLOSE(Fixed(slot))
//! ```
//!
//! If the open fails, the kernel cancels READ and CLOSE (-ECANCELED) and the
//! open's errno is the reported cause (ENOENT: the file vanished). The read
//! hard-links to the close so that a failed or short read still closes the
//! slot. A slot is reused only after all three CQEs of its chain arrived; if
//! a close did not succeed after a successful open, a lone CLOSE cleans the
//! slot first.
//!
//! In keep-open mode a file's first read issues a lone OPENAT into a slot of
//! its own; reads of that file wait for it, then are single READ SQEs. Kept
//! slots are never given back (keep-all up to the limit); files past the
//! limit use chains.
//!
//! A read that returns fewer bytes than asked (end of file: the file shrank)
//! is retried for the remainder as a new attempt; an attempt that reads 0
//! bytes is `ChangedSize`. Reads longer than `READ_CHUNK_BYTES_MAX` go as
//! several attempts, one after the other.
//!
//! Threads: the engine may be moved to another thread, but the kernel ties a
//! request to the thread that submitted it (it is cancelled if that thread
//! exits), so move it only while nothing is in flight.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{squeue, types, IoUring};

use probe::{open_ring, NOP_USER_DATA};

use super::{Completion, FileTable, ReadEngine, ReadError, ReadOp, ReaderConfig};

mod ops;
mod probe;

const BACKEND: &str = "io_uring";
/// No op, in the intrusive list of ops waiting for a kept file to open.
const NONE: u32 = u32::MAX;
/// A CQE result not received yet.
const PENDING: i32 = i32::MIN;
/// Most tries of one submission that the kernel answers with EAGAIN/EBUSY.
const SUBMIT_RETRIES_MAX: u32 = 1000;

/// What an SQE was, kept in the low byte of its `user_data`; the index (of
/// an op, a slot or a file) is in the bits above.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    ChainOpen = 1,
    ChainRead = 2,
    ChainClose = 3,
    KeptOpen = 4,
    KeptRead = 5,
    CleanupClose = 6,
}

impl Kind {
    fn tag(self, index: u32) -> u64 {
        (u64::from(index) << 8) | self as u64
    }

    fn untag(user_data: u64) -> Option<(Kind, u32)> {
        let kind = match user_data & 0xff {
            1 => Kind::ChainOpen,
            2 => Kind::ChainRead,
            3 => Kind::ChainClose,
            4 => Kind::KeptOpen,
            5 => Kind::KeptRead,
            6 => Kind::CleanupClose,
            _ => return None,
        };
        Some((kind, u32::try_from(user_data >> 8).ok()?))
    }
}

/// What part of an op is in the kernel.
#[derive(Clone, Copy, Debug)]
enum Attempt {
    /// Nothing: waiting for a transient slot or for its kept file to open.
    Waiting,
    /// An OPENAT → READ → CLOSE chain on transient slot `slot`.
    Chain {
        slot: u32,
        chunk_bytes: u32,
        open_res: i32,
        read_res: i32,
        close_res: i32,
    },
    /// A READ on a kept file.
    Kept { chunk_bytes: u32 },
}

struct OpState {
    op: ReadOp,
    done_bytes: u64,
    short_reads: u32,
    attempt: Attempt,
    /// Next op waiting for the same kept file to open, or NONE.
    next_waiter: u32,
}

#[derive(Clone, Copy, Debug)]
enum KeptFile {
    Closed,
    Opening { slot: u32, first_waiter: u32 },
    Open { slot: u32 },
}

/// The io_uring engine behind `ReadEngine`.
pub(crate) struct UringEngine {
    ring: IoUring,
    files: Arc<FileTable>,
    /// Ops accepted and not finished, indexed by the op index in `user_data`.
    ops: Vec<Option<OpState>>,
    free_ops: Vec<u32>,
    /// Transient slots not in use.
    free_slots: Vec<u32>,
    /// Ops waiting for a transient slot, first come first served.
    slot_waiters: VecDeque<u32>,
    /// Per file in keep-open mode, else empty.
    kept: Vec<KeptFile>,
    kept_next_slot: u32,
    kept_end_slot: u32,
    /// Kept slots whose open failed, ready for another file.
    kept_free_slots: Vec<u32>,
    /// Finished ops, waiting to be reaped.
    ready: VecDeque<Completion>,
    /// CQEs taken off the ring and not handled yet.
    cqes: Vec<(u64, i32)>,
    /// Ops in `ops`.
    active: usize,
    /// SQEs pushed whose CQE has not been taken off the ring.
    cqes_expected: usize,
    max_in_flight: usize,
    /// Reads of at least this many bytes go to io-wq (`read_flags`).
    async_min_bytes: u64,
    exp_every: u32,
    exp_count: u32,
}

// SAFETY: the fields that are not Send are the `dest` pointers inside the
// ReadOps. The engine never dereferences them; it only hands them to the
// kernel, which writes through them no matter which thread drives the ring.
// `ReadEngine::submit`'s contract keeps the memory valid and unshared until
// the completion is reaped, whichever thread reaps it.
unsafe impl Send for UringEngine {}

impl UringEngine {
    /// Probes io_uring and builds the engine; `UringUnavailable` says why not.
    pub(crate) fn open(
        files: Arc<FileTable>,
        cfg: &ReaderConfig,
    ) -> Result<UringEngine, ReadError> {
        let mut probed = open_ring(cfg, files.keep_open())
            .map_err(|reason| ReadError::UringUnavailable { reason })?;
        let max_in_flight = cfg.queue_depth as usize;
        let cq_entries = probed.ring.completion().capacity();
        let kept = if files.keep_open() {
            vec![KeptFile::Closed; files.len()]
        } else {
            Vec::new()
        };
        tracing::debug!(
            transient_slots = probed.transient_slots,
            kept_slots = probed.kept_slots,
            "io_uring reader ready"
        );
        Ok(UringEngine {
            ring: probed.ring,
            files,
            ops: (0..max_in_flight).map(|_| None).collect(),
            free_ops: (0..max_in_flight as u32).rev().collect(),
            free_slots: (0..probed.transient_slots).rev().collect(),
            slot_waiters: VecDeque::with_capacity(max_in_flight),
            kept,
            kept_next_slot: probed.transient_slots,
            kept_end_slot: probed.transient_slots + probed.kept_slots,
            kept_free_slots: Vec::new(),
            ready: VecDeque::with_capacity(max_in_flight),
            cqes: Vec::with_capacity(cq_entries),
            active: 0,
            cqes_expected: 0,
            max_in_flight,
            async_min_bytes: cfg.uring_async_min_bytes,
            exp_every: std::env::var("EXP_EVERY").ok().and_then(|v| v.parse().ok()).unwrap_or(1),
            exp_count: 0,
        })
    }

    fn engine_error(op: &'static str, source: io::Error) -> ReadError {
        ReadError::Engine {
            backend: BACKEND,
            op,
            source,
        }
    }

    fn state(&mut self, idx: u32) -> Result<&mut OpState, ReadError> {
        match self.ops.get_mut(idx as usize).and_then(Option::as_mut) {
            Some(state) => Ok(state),
            None => Err(Self::engine_error(
                "match a completion",
                io::Error::other(format!("no read with index {idx}")),
            )),
        }
    }

    /// Pushes SQEs that must stay together (a chain), submitting first if
    /// the queue lacks room.
    fn push(&mut self, entries: &[squeue::Entry]) -> Result<(), ReadError> {
        loop {
            // SAFETY: every SQE built here points at (a) a path owned by
            // `self.files`, which the engine keeps alive, and (b) `dest`
            // memory that `submit`'s contract keeps valid until the op's
            // completion is reaped; an op completes only after all CQEs of
            // its SQEs arrived, and drop waits for every CQE.
            let pushed = unsafe { self.ring.submission().push_multiple(entries) };
            if pushed.is_ok() {
                self.cqes_expected += entries.len();
                return Ok(());
            }
            self.flush()?;
        }
    }

    /// Hands every queued SQE to the kernel.
    fn flush(&mut self) -> Result<(), ReadError> {
        let mut retries = 0;
        while !self.ring.submission().is_empty() {
            match self.ring.submitter().submit() {
                Ok(n) if n > 0 => {}
                // Nothing taken (cannot happen without SQPOLL): count it as a retry.
                Ok(_) if retries < SUBMIT_RETRIES_MAX => retries += 1,
                Ok(_) => {
                    return Err(Self::engine_error(
                        "io_uring_enter (submit)",
                        io::Error::other("the kernel takes no SQE"),
                    ))
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                // The kernel is short of memory or has completions to post
                // first: take the CQEs off the ring, then try again.
                Err(e)
                    if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY))
                        && retries < SUBMIT_RETRIES_MAX =>
                {
                    retries += 1;
                    self.collect_cqes();
                    std::thread::yield_now();
                }
                Err(e) => return Err(Self::engine_error("io_uring_enter (submit)", e)),
            }
        }
        Ok(())
    }

    /// With COOP_TASKRUN the kernel posts some completions (those finished
    /// off the submitting thread, like reads that waited for the disk) only
    /// when this thread enters it; IORING_SQ_TASKRUN says some are waiting.
    /// `submit` enters with GETEVENTS when that flag is up.
    fn run_task_work(&mut self) -> Result<(), ReadError> {
        if !self.ring.submission().taskrun() {
            return Ok(());
        }
        match self.ring.submitter().submit() {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(Self::engine_error("io_uring_enter (task work)", e)),
        }
    }

    fn collect_cqes(&mut self) {
        for cqe in self.ring.completion() {
            self.cqes.push((cqe.user_data(), cqe.result()));
        }
    }

    /// Submits what is queued and waits for `want` CQEs or the deadline.
    /// Returns false when the deadline had passed.
    fn wait(&mut self, want: usize, deadline: Option<Instant>) -> Result<bool, ReadError> {
        let submitter = self.ring.submitter();
        let result = match deadline {
            None => submitter.submit_and_wait(want),
            Some(deadline) => {
                let now = Instant::now();
                if now >= deadline {
                    return Ok(false);
                }
                let timeout = types::Timespec::from(deadline - now);
                submitter.submit_with_args(want, &types::SubmitArgs::new().timespec(&timeout))
            }
        };
        match result {
            Ok(_) => Ok(true),
            // ETIME: the loop looks at the deadline again. EINTR, EAGAIN,
            // EBUSY: handle the CQEs there are, then wait again.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) =>
            {
                Ok(true)
            }
            Err(e) => Err(Self::engine_error("io_uring_enter (wait)", e)),
        }
    }

    fn take_ready(&mut self, out: &mut Vec<Completion>) -> usize {
        let n = self.ready.len();
        out.extend(self.ready.drain(..));
        n
    }
}

impl ReadEngine for UringEngine {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    fn in_flight(&self) -> usize {
        self.active + self.ready.len()
    }

    fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    unsafe fn submit(&mut self, ops: &[ReadOp]) -> Result<(), ReadError> {
        let in_flight = self.in_flight();
        if in_flight + ops.len() > self.max_in_flight {
            return Err(ReadError::Busy {
                in_flight,
                requested: ops.len(),
                max_in_flight: self.max_in_flight,
            });
        }
        for op in ops {
            self.files.check_op(op)?;
        }
        for op in ops {
            if op.len_bytes == 0 {
                self.ready.push_back(Completion {
                    user_data: op.user_data,
                    result: Ok(()),
                });
                continue;
            }
            // in_flight stays under max_in_flight, the number of op indices.
            let Some(idx) = self.free_ops.pop() else {
                return Err(Self::engine_error(
                    "submit",
                    io::Error::other("no free read index"),
                ));
            };
            let state = OpState {
                op: *op,
                done_bytes: 0,
                short_reads: 0,
                attempt: Attempt::Waiting,
                next_waiter: NONE,
            };
            self.ops[idx as usize] = Some(state);
            self.active += 1;
            self.start_attempt(idx)?;
        }
        self.flush()
    }

    fn reap(
        &mut self,
        out: &mut Vec<Completion>,
        min_complete: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, ReadError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut appended = 0;
        loop {
            self.handle_completions()?;
            appended += self.take_ready(out);
            if appended >= min_complete || self.active == 0 {
                break;
            }
            // Every op in flight has an SQE in the ring or waits behind
            // one, so at least this many CQEs are certain to come.
            debug_assert!(self.cqes_expected > 0);
            let want = (min_complete - appended).min(self.cqes_expected).max(1);
            if !self.wait(want, deadline)? {
                break;
            }
        }
        // Let the attempts started while handling CQEs run meanwhile.
        self.flush()?;
        Ok(appended)
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        // The kernel may still write into `dest` memory for reads in flight:
        // wait for every CQE before the caller can free that memory. SQEs
        // still queued are submitted by the wait and waited for too.
        self.cqes_expected -= self.cqes.len().min(self.cqes_expected);
        loop {
            let seen = self
                .ring
                .completion()
                .filter(|cqe| cqe.user_data() != NOP_USER_DATA)
                .count();
            self.cqes_expected = self.cqes_expected.saturating_sub(seen);
            if self.cqes_expected == 0 {
                return;
            }
            if let Err(e) = self.ring.submitter().submit_and_wait(1) {
                if !matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY | libc::ETIME)
                ) {
                    tracing::error!(error = %e, pending = self.cqes_expected, "io_uring reader could not wait for its reads at drop");
                    return;
                }
            }
        }
    }
}
