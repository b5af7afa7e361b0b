//! One io_uring and the reads in it, driven by one shard thread.
//!
//! `accept` queues the SQEs of new reads; `reap` submits them, waits, and
//! handles CQEs (`ops.rs`) until reads finish or the shard's wake-up eventfd
//! fires. Reads whose data is in the page cache run inline in
//! `io_uring_enter`, on this thread: one `io_uring_enter` opens, reads and
//! closes a whole batch of files.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

use io_uring::{opcode, squeue, types, IoUring};

use super::probe::{open_ring, NOP_USER_DATA};
use super::wake::Wake;
use super::BACKEND;
use crate::reader::files::KeptFiles;
use crate::reader::{Completion, FileTable, ReadError, ReadOp, ReaderConfig};

/// A CQE result not received yet.
pub(super) const PENDING: i32 = i32::MIN;
/// Most tries of one submission that the kernel answers with EAGAIN/EBUSY.
const SUBMIT_RETRIES_MAX: u32 = 1000;

/// What an SQE was, kept in the low byte of its `user_data`; the index (of
/// an op, a slot or a file) is in the bits above.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Kind {
    ChainOpen = 1,
    ChainRead = 2,
    ChainClose = 3,
    FdRead = 5,
    CleanupClose = 6,
    Wake = 7,
}

impl Kind {
    pub(super) fn tag(self, index: u32) -> u64 {
        (u64::from(index) << 8) | self as u64
    }

    pub(super) fn untag(user_data: u64) -> Option<(Kind, u32)> {
        let kind = match user_data & 0xff {
            1 => Kind::ChainOpen,
            2 => Kind::ChainRead,
            3 => Kind::ChainClose,
            5 => Kind::FdRead,
            6 => Kind::CleanupClose,
            7 => Kind::Wake,
            _ => return None,
        };
        Some((kind, u32::try_from(user_data >> 8).ok()?))
    }
}

/// What part of an op is in the kernel.
#[derive(Clone, Copy, Debug)]
pub(super) enum Attempt {
    /// Nothing: waiting for a transient slot.
    Waiting,
    /// An OPENAT → READ → CLOSE chain on transient slot `slot`.
    Chain {
        slot: u32,
        chunk_bytes: u32,
        open_res: i32,
        read_res: i32,
        close_res: i32,
    },
    /// A READ on a process descriptor (keep-open mode).
    Fd { chunk_bytes: u32 },
}

pub(super) struct OpState {
    pub(super) op: ReadOp,
    /// The op's range ends at the recorded end of its file, so its last
    /// attempt also reads one probe byte past it (see `ops::read_sqe`).
    pub(super) ends_at_eof: bool,
    /// The buffers of that READV: the rest of the range, then the probe
    /// byte. The kernel reads them while the SQE is in flight; `ops` is a
    /// boxed slice, so they stay where they are.
    pub(super) iov: [libc::iovec; 2],
    pub(super) done_bytes: u64,
    pub(super) short_reads: u32,
    pub(super) attempt: Attempt,
}

/// One ring and its reads.
pub(super) struct Ring {
    pub(super) ring: IoUring,
    pub(super) files: Arc<FileTable>,
    /// Ops accepted and not finished, indexed by the op index in `user_data`.
    pub(super) ops: Box<[Option<OpState>]>,
    pub(super) free_ops: Vec<u32>,
    /// Transient slots not in use.
    pub(super) free_slots: Vec<u32>,
    /// Ops waiting for a transient slot, first come first served.
    pub(super) slot_waiters: VecDeque<u32>,
    /// Keep-open mode's descriptors, shared by the engine's rings.
    pub(super) kept: Arc<KeptFiles>,
    /// Finished ops, waiting to be reaped.
    pub(super) ready: VecDeque<Completion>,
    /// CQEs taken off the ring and not handled yet.
    pub(super) cqes: Vec<(u64, i32)>,
    /// Ops in `ops`.
    pub(super) active: usize,
    /// SQEs pushed whose CQE has not been taken off the ring.
    pub(super) cqes_expected: usize,
    /// The shard's wake-up eventfd, which always has a READ in the ring.
    pub(super) wake: Arc<Wake>,
    /// Where that READ puts the eventfd's counter.
    pub(super) wake_buf: Box<u64>,
    /// Where probe bytes land: read past the recorded end of a file to find
    /// out it grew. Never read by us; concurrent reads may all write it.
    pub(super) probe_buf: Box<u8>,
    /// The wake-up READ completed since the last `reap`.
    pub(super) woken: bool,
}

// SAFETY: the fields that are not Send are the `dest` pointers inside the
// ReadOps and the iovecs that repeat them. The ring never dereferences
// them; it only hands them to the kernel, which writes through them
// whichever thread drives the ring, and `accept`'s contract keeps that
// memory valid and unshared until the
// completion is reaped. A ring is moved once, to its shard thread, before it
// holds any read (the kernel ties a request to the thread that submitted it).
unsafe impl Send for Ring {}

impl Ring {
    /// Probes io_uring and builds a ring for up to `cfg.queue_depth` reads;
    /// `UringUnavailable` says why not.
    pub(super) fn open(
        files: Arc<FileTable>,
        kept: Arc<KeptFiles>,
        cfg: &ReaderConfig,
        wake: Arc<Wake>,
    ) -> Result<Ring, ReadError> {
        let mut probed = open_ring(cfg).map_err(|reason| ReadError::UringUnavailable { reason })?;
        let max_ops = cfg.queue_depth as usize;
        let cq_entries = probed.ring.completion().capacity();
        tracing::debug!(
            transient_slots = probed.transient_slots,
            "io_uring reader ring ready"
        );
        Ok(Ring {
            ring: probed.ring,
            files,
            ops: (0..max_ops).map(|_| None).collect(),
            free_ops: (0..max_ops as u32).rev().collect(),
            free_slots: (0..probed.transient_slots).rev().collect(),
            slot_waiters: VecDeque::with_capacity(max_ops),
            kept,
            ready: VecDeque::with_capacity(max_ops),
            cqes: Vec::with_capacity(cq_entries),
            active: 0,
            cqes_expected: 0,
            wake,
            wake_buf: Box::new(0),
            probe_buf: Box::new(0),
            woken: false,
        })
    }

    pub(super) fn engine_error(op: &'static str, source: io::Error) -> ReadError {
        ReadError::Engine {
            backend: BACKEND,
            op,
            source,
        }
    }

    /// Reads accepted and not yet reaped.
    pub(super) fn in_flight(&self) -> usize {
        self.active + self.ready.len()
    }

    /// Queues the SQEs of `ops` (checked, and not `needs_no_io`); `reap`
    /// submits them.
    ///
    /// # Safety
    /// As `ReadEngine::submit`: each `dest` valid for `len_bytes` writes
    /// (`len_bytes + 1` with `spare_byte`, the last one written only on
    /// `Grew`) and unshared until its completion is reaped or the ring
    /// dropped.
    pub(super) unsafe fn accept(&mut self, ops: &[ReadOp]) -> Result<(), ReadError> {
        for op in ops {
            debug_assert!(!self.files.needs_no_io(op));
            // The engine keeps each ring under queue_depth reads, the number
            // of op indices, so this fails only on a bug.
            let Some(idx) = self.free_ops.pop() else {
                return Err(Self::engine_error(
                    "accept",
                    io::Error::other("no free read index"),
                ));
            };
            let empty = libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            };
            let state = OpState {
                op: *op,
                ends_at_eof: self.files.ends_at_eof(op),
                iov: [empty, empty],
                done_bytes: 0,
                short_reads: 0,
                attempt: Attempt::Waiting,
            };
            self.ops[idx as usize] = Some(state);
            self.active += 1;
            self.start_attempt(idx)?;
        }
        Ok(())
    }

    /// Submits, then appends completions to `out` until at least
    /// `min_complete` were appended, nothing is in flight, or the wake-up
    /// eventfd fired. Returns how many were appended.
    pub(super) fn reap(
        &mut self,
        out: &mut Vec<Completion>,
        min_complete: usize,
    ) -> Result<usize, ReadError> {
        let mut appended = 0;
        loop {
            self.handle_completions()?;
            appended += self.ready.len();
            out.extend(self.ready.drain(..));
            if appended >= min_complete || self.active == 0 || std::mem::take(&mut self.woken) {
                break;
            }
            // Every op in flight has an SQE in the ring or waits behind one,
            // and the wake-up READ is always there: this many CQEs will come.
            let want = (min_complete - appended).min(self.cqes_expected).max(1);
            self.wait(want)?;
        }
        // Let the attempts started while handling CQEs run meanwhile.
        self.flush()?;
        Ok(appended)
    }

    /// Puts the wake-up READ (8 bytes of the eventfd) in the ring. Called
    /// first on the shard thread, which must be the one to submit it.
    pub(super) fn arm_wake(&mut self) -> Result<(), ReadError> {
        let buf: *mut u64 = &mut *self.wake_buf;
        let read = opcode::Read::new(types::Fd(self.wake.raw_fd()), buf.cast::<u8>(), 8)
            .build()
            .user_data(Kind::Wake.tag(0));
        self.push(&[read])
    }

    /// Pushes SQEs that must stay together (a chain), submitting first if
    /// the queue lacks room.
    pub(super) fn push(&mut self, entries: &[squeue::Entry]) -> Result<(), ReadError> {
        loop {
            // SAFETY: every SQE built here points at (a) a path owned by
            // `self.files`, which the ring keeps alive, (b) `dest` memory
            // (and its spare byte) that `accept`'s contract keeps valid until
            // the op's completion is reaped, (c) an op's `iov`, inside
            // `ops`, a boxed slice that never moves, rewritten only between
            // attempts and dropped in `finish`, after the op's last CQE, or
            // (d) `wake_buf` or `probe_buf`, owned by the ring. An op
            // completes only after all CQEs of its SQEs arrived, and drop
            // waits for every CQE, so none of it is freed under the kernel.
            let pushed = unsafe { self.ring.submission().push_multiple(entries) };
            if pushed.is_ok() {
                self.cqes_expected += entries.len();
                return Ok(());
            }
            self.flush()?;
        }
    }

    /// Hands every queued SQE to the kernel.
    pub(super) fn flush(&mut self) -> Result<(), ReadError> {
        let mut retries = 0;
        while !self.ring.submission().is_empty() {
            match self.ring.submitter().submit() {
                Ok(n) if n > 0 => {}
                // Nothing taken (cannot happen without SQPOLL): count it as a retry.
                Ok(_) if retries < SUBMIT_RETRIES_MAX => retries += 1,
                Ok(_) => {
                    let source = io::Error::other("the kernel takes no SQE");
                    return Err(Self::engine_error("io_uring_enter (submit)", source));
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

    /// With COOP_TASKRUN the kernel may hold completions finished off this
    /// thread (reads that waited for the disk, the eventfd) until this
    /// thread enters it; IORING_SQ_TASKRUN says some are waiting, and
    /// `submit` then enters with GETEVENTS.
    pub(super) fn run_task_work(&mut self) -> Result<(), ReadError> {
        if !self.ring.submission().taskrun() {
            return Ok(());
        }
        Self::entered(self.ring.submitter().submit(), "io_uring_enter (task work)")
    }

    pub(super) fn collect_cqes(&mut self) {
        for cqe in self.ring.completion() {
            self.cqes.push((cqe.user_data(), cqe.result()));
        }
    }

    /// Submits what is queued and waits for `want` CQEs.
    fn wait(&mut self, want: usize) -> Result<(), ReadError> {
        // On a transient error: handle the CQEs there are, then wait again.
        Self::entered(
            self.ring.submitter().submit_and_wait(want),
            "io_uring_enter (wait)",
        )
    }

    /// An `io_uring_enter` result: interrupted, or out of room for now
    /// (EINTR, EAGAIN, EBUSY), is fine, the caller's loop comes back; any
    /// other error is the engine failing.
    fn entered(result: std::io::Result<usize>, what: &'static str) -> Result<(), ReadError> {
        match result {
            Err(e)
                if !matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) =>
            {
                Err(Self::engine_error(what, e))
            }
            _ => Ok(()),
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // The kernel may still write into `dest` memory (and `wake_buf`) for
        // SQEs in flight: wait for every CQE before that memory can be
        // freed. Queued SQEs are submitted by the wait and waited for too.
        // The wake-up READ completes once the eventfd is written.
        self.wake.poke();
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
