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

use io_uring::{opcode, squeue, types, IoUring};

use super::probe::{open_ring, NOP_USER_DATA};
use super::{
    Completion, FileTable, ReadEngine, ReadError, ReadOp, ReaderConfig, READ_CHUNK_BYTES_MAX,
    SHORT_READS_MAX,
};

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

    /// Starts the next part of op `idx`: its first read, the rest after a
    /// short read, or the next chunk of a long one.
    fn start_attempt(&mut self, idx: u32) -> Result<(), ReadError> {
        let file = self.state(idx)?.op.file;
        if let Some(&kept) = self.kept.get(file as usize) {
            match kept {
                KeptFile::Open { slot } => return self.push_kept_read(idx, slot),
                KeptFile::Opening { slot, first_waiter } => {
                    let state = self.state(idx)?;
                    state.attempt = Attempt::Waiting;
                    state.next_waiter = first_waiter;
                    self.kept[file as usize] = KeptFile::Opening {
                        slot,
                        first_waiter: idx,
                    };
                    return Ok(());
                }
                KeptFile::Closed => {
                    if let Some(slot) = self.take_kept_slot() {
                        let state = self.state(idx)?;
                        state.attempt = Attempt::Waiting;
                        state.next_waiter = NONE;
                        self.kept[file as usize] = KeptFile::Opening {
                            slot,
                            first_waiter: idx,
                        };
                        let open = self
                            .open_sqe(file, slot)?
                            .user_data(Kind::KeptOpen.tag(file));
                        return self.push(&[open]);
                    }
                }
            }
        }
        match self.free_slots.pop() {
            Some(slot) => self.push_chain(idx, slot),
            None => {
                self.state(idx)?.attempt = Attempt::Waiting;
                self.slot_waiters.push_back(idx);
                Ok(())
            }
        }
    }

    fn take_kept_slot(&mut self) -> Option<u32> {
        if let Some(slot) = self.kept_free_slots.pop() {
            return Some(slot);
        }
        if self.kept_next_slot < self.kept_end_slot {
            self.kept_next_slot += 1;
            return Some(self.kept_next_slot - 1);
        }
        None
    }

    fn open_sqe(&self, file: u32, slot: u32) -> Result<squeue::Entry, ReadError> {
        let dest_slot = types::DestinationSlot::try_from_slot_target(slot).map_err(|_| {
            Self::engine_error(
                "open",
                io::Error::other(format!("slot {slot} out of range")),
            )
        })?;
        // No O_CLOEXEC: the kernel refuses it for direct descriptors, which
        // are never inherited anyway.
        Ok(
            opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), self.files.c_path(file).as_ptr())
                .file_index(Some(dest_slot))
                .flags(libc::O_RDONLY)
                .build(),
        )
    }

    /// The next read of op `idx`: where it lands, where it reads, how long.
    fn next_read(&mut self, idx: u32) -> Result<(*mut u8, u64, u32), ReadError> {
        let state = self.state(idx)?;
        let chunk_bytes = (state.op.len_bytes - state.done_bytes).min(READ_CHUNK_BYTES_MAX);
        // wrapping_add is plain address arithmetic; done_bytes < len_bytes
        // keeps the address inside `dest`.
        let dest = state.op.dest.wrapping_add(state.done_bytes as usize);
        // READ_CHUNK_BYTES_MAX is 1 GiB, so the chunk fits u32.
        Ok((
            dest,
            state.op.offset_bytes + state.done_bytes,
            chunk_bytes as u32,
        ))
    }

    /// IOSQE_ASYNC for reads long enough that copying them on io-wq worker
    /// threads, several cores at once, beats copying inline on this thread.
    fn read_flags(&self, chunk_bytes: u32) -> squeue::Flags {
        if u64::from(chunk_bytes) >= self.async_min_bytes {
            squeue::Flags::ASYNC
        } else {
            squeue::Flags::empty()
        }
    }

    fn push_chain(&mut self, idx: u32, slot: u32) -> Result<(), ReadError> {
        let file = self.state(idx)?.op.file;
        let (dest, offset_bytes, chunk_bytes) = self.next_read(idx)?;
        let open = self
            .open_sqe(file, slot)?
            .flags(squeue::Flags::IO_LINK)
            .user_data(Kind::ChainOpen.tag(idx));
        let read = opcode::Read::new(types::Fixed(slot), dest, chunk_bytes)
            .offset(offset_bytes)
            .build()
            .flags(squeue::Flags::IO_HARDLINK | self.read_flags(chunk_bytes))
            .user_data(Kind::ChainRead.tag(idx));
        let close = opcode::Close::new(types::Fixed(slot))
            .build()
            .user_data(Kind::ChainClose.tag(idx));
        self.state(idx)?.attempt = Attempt::Chain {
            slot,
            chunk_bytes,
            open_res: PENDING,
            read_res: PENDING,
            close_res: PENDING,
        };
        self.push(&[open, read, close])
    }

    fn push_kept_read(&mut self, idx: u32, slot: u32) -> Result<(), ReadError> {
        let (dest, offset_bytes, chunk_bytes) = self.next_read(idx)?;
        let read = opcode::Read::new(types::Fixed(slot), dest, chunk_bytes)
            .offset(offset_bytes)
            .build()
            .flags(self.read_flags(chunk_bytes))
            .user_data(Kind::KeptRead.tag(idx));
        self.state(idx)?.attempt = Attempt::Kept { chunk_bytes };
        self.push(&[read])
    }

    /// Handles every CQE on the ring, and those they lead to, until the ring
    /// has none.
    fn handle_completions(&mut self) -> Result<(), ReadError> {
        loop {
            self.run_task_work()?;
            self.collect_cqes();
            if self.cqes.is_empty() {
                return Ok(());
            }
            let mut batch = std::mem::take(&mut self.cqes);
            for &(user_data, result) in &batch {
                self.cqes_expected -= 1;
                self.handle(user_data, result)?;
            }
            batch.clear();
            if self.cqes.is_empty() {
                self.cqes = batch;
            }
        }
    }

    fn handle(&mut self, user_data: u64, result: i32) -> Result<(), ReadError> {
        let Some((kind, index)) = Kind::untag(user_data) else {
            let source = io::Error::other(format!("unknown user_data {user_data:#x}"));
            return Err(Self::engine_error("match a completion", source));
        };
        match kind {
            Kind::ChainOpen | Kind::ChainRead | Kind::ChainClose => {
                self.on_chain_cqe(index, kind, result)
            }
            Kind::KeptOpen => self.on_kept_open(index, result),
            Kind::KeptRead => self.on_kept_read(index, result),
            Kind::CleanupClose => {
                if result < 0 {
                    tracing::warn!(slot = index, error = %io::Error::from_raw_os_error(-result), "closing an io_uring direct descriptor failed");
                }
                self.release_slot(index)
            }
        }
    }

    fn on_chain_cqe(&mut self, idx: u32, kind: Kind, result: i32) -> Result<(), ReadError> {
        let state = self.state(idx)?;
        let Attempt::Chain {
            slot,
            chunk_bytes,
            mut open_res,
            mut read_res,
            mut close_res,
        } = state.attempt
        else {
            let source = io::Error::other(format!(
                "{kind:?} completion for read {idx}, which has no chain in flight"
            ));
            return Err(Self::engine_error("match a completion", source));
        };
        match kind {
            Kind::ChainOpen => open_res = result,
            Kind::ChainRead => read_res = result,
            _ => close_res = result,
        }
        state.attempt = Attempt::Chain {
            slot,
            chunk_bytes,
            open_res,
            read_res,
            close_res,
        };
        if open_res == PENDING || read_res == PENDING || close_res == PENDING {
            return Ok(());
        }
        // The whole chain is done; the slot first.
        if open_res >= 0 && close_res < 0 {
            let close = opcode::Close::new(types::Fixed(slot))
                .build()
                .user_data(Kind::CleanupClose.tag(slot));
            self.push(&[close])?;
        } else {
            self.release_slot(slot)?;
        }
        let file = self.state(idx)?.op.file;
        if open_res < 0 {
            // READ and CLOSE were cancelled; the open's errno is the cause.
            return self.finish(
                idx,
                Err(ReadError::from_errno(
                    self.files.path_buf(file),
                    "open",
                    -open_res,
                )),
            );
        }
        if read_res < 0 {
            return self.finish(
                idx,
                Err(ReadError::from_errno(
                    self.files.path_buf(file),
                    "read",
                    -read_res,
                )),
            );
        }
        self.advance(idx, read_res as u32, chunk_bytes)
    }

    fn on_kept_open(&mut self, file: u32, result: i32) -> Result<(), ReadError> {
        let Some(&KeptFile::Opening { slot, first_waiter }) = self.kept.get(file as usize) else {
            let source = io::Error::other(format!(
                "open completion for file {file}, which is not opening"
            ));
            return Err(Self::engine_error("match a completion", source));
        };
        if result >= 0 {
            self.kept[file as usize] = KeptFile::Open { slot };
        } else {
            self.kept[file as usize] = KeptFile::Closed;
            self.kept_free_slots.push(slot);
        }
        let mut waiter = first_waiter;
        while waiter != NONE {
            let next = self.state(waiter)?.next_waiter;
            if result >= 0 {
                self.push_kept_read(waiter, slot)?;
            } else {
                self.finish(
                    waiter,
                    Err(ReadError::from_errno(
                        self.files.path_buf(file),
                        "open",
                        -result,
                    )),
                )?;
            }
            waiter = next;
        }
        Ok(())
    }

    fn on_kept_read(&mut self, idx: u32, result: i32) -> Result<(), ReadError> {
        let state = self.state(idx)?;
        let Attempt::Kept { chunk_bytes } = state.attempt else {
            let source = io::Error::other(format!(
                "read completion for read {idx}, which has no kept read in flight"
            ));
            return Err(Self::engine_error("match a completion", source));
        };
        if result < 0 {
            let file = state.op.file;
            let path = self.files.path_buf(file);
            return self.finish(idx, Err(ReadError::from_errno(path, "read", -result)));
        }
        self.advance(idx, result as u32, chunk_bytes)
    }

    /// Gives a transient slot to the first op waiting for one, or back to the pool.
    fn release_slot(&mut self, slot: u32) -> Result<(), ReadError> {
        match self.slot_waiters.pop_front() {
            Some(idx) => self.push_chain(idx, slot),
            None => {
                self.free_slots.push(slot);
                Ok(())
            }
        }
    }

    /// Counts `read_bytes` of an attempt that asked `chunk_bytes`, then
    /// finishes the op or starts its next attempt.
    fn advance(&mut self, idx: u32, read_bytes: u32, chunk_bytes: u32) -> Result<(), ReadError> {
        debug_assert!(read_bytes <= chunk_bytes);
        let state = self.state(idx)?;
        state.done_bytes += u64::from(read_bytes);
        if read_bytes < chunk_bytes && read_bytes > 0 {
            state.short_reads += 1;
        }
        let (op, done_bytes, short_reads) = (state.op, state.done_bytes, state.short_reads);
        if done_bytes == op.len_bytes {
            return self.finish(idx, Ok(()));
        }
        let path = || self.files.path_buf(op.file);
        if read_bytes == 0 {
            let expected = self.files.size_bytes(op.file).unwrap_or(0);
            let error = ReadError::changed_size(
                path(),
                expected,
                op.offset_bytes,
                op.len_bytes,
                done_bytes,
            );
            return self.finish(idx, Err(error));
        }
        if short_reads > SHORT_READS_MAX {
            let source = io::Error::other(format!("{short_reads} short reads"));
            return self.finish(
                idx,
                Err(ReadError::Io {
                    path: path(),
                    op: "read",
                    source,
                }),
            );
        }
        self.start_attempt(idx)
    }

    fn finish(&mut self, idx: u32, result: Result<(), ReadError>) -> Result<(), ReadError> {
        let Some(state) = self.ops.get_mut(idx as usize).and_then(Option::take) else {
            let source = io::Error::other(format!("finishing read {idx}, which is not in flight"));
            return Err(Self::engine_error("finish a read", source));
        };
        self.free_ops.push(idx);
        self.active -= 1;
        self.ready.push_back(Completion {
            user_data: state.op.user_data,
            result,
        });
        Ok(())
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
