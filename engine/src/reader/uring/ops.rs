//! The life of one read in the ring: starting its attempts (a chain, a read
//! on a process descriptor in keep-open mode, or a wait for a slot) and
//! handling their CQEs until the read is finished.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use io_uring::{opcode, squeue, types};

use super::ring::{Attempt, Kind, OpState, Ring, PENDING};
use crate::reader::{Completion, ReadError, READ_CHUNK_BYTES_MAX, SHORT_READS_MAX};

/// The file a READ reads: a direct descriptor (a chain's slot) or a process
/// descriptor (keep-open mode).
#[derive(Clone, Copy, Debug)]
enum Target {
    Fixed(u32),
    Fd(RawFd),
}

impl Ring {
    pub(super) fn state(&mut self, idx: u32) -> Result<&mut OpState, ReadError> {
        match self.ops.get_mut(idx as usize).and_then(Option::as_mut) {
            Some(state) => Ok(state),
            None => Err(Self::engine_error(
                "match a completion",
                io::Error::other(format!("no read with index {idx}")),
            )),
        }
    }

    /// Starts the next part of op `idx`: its first read, the rest after a
    /// short read, or the next chunk of a long one.
    ///
    /// In keep-open mode a read goes through the file's kept descriptor, a
    /// process descriptor shared by the engine's rings and opened (and
    /// checked against the recorded size) by the first read of the file in
    /// any of them: a plain `openat` on this thread, once per file. Past the
    /// kept limit, a file is opened and checked for each read, and its
    /// descriptor put in a transient slot (`push_chain`).
    pub(super) fn start_attempt(&mut self, idx: u32) -> Result<(), ReadError> {
        if self.files.keep_open() {
            let file = self.state(idx)?.op.file;
            match self.kept.kept(&self.files, file) {
                Ok(Some(fd)) => return self.push_fd_read(idx, fd.as_raw_fd()),
                Ok(None) => {}
                Err(e) => return self.finish(idx, Err(e)),
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

    fn open_sqe(&self, file: u32, slot: u32) -> Result<squeue::Entry, ReadError> {
        let dest_slot = types::DestinationSlot::try_from_slot_target(slot).map_err(|_| {
            Self::engine_error(
                "open",
                io::Error::other(format!("slot {slot} out of range")),
            )
        })?;
        // No O_CLOEXEC: the kernel refuses it for direct descriptors, which
        // are never inherited anyway.
        Ok(opcode::OpenAt::new(
            types::Fd(self.files.dir_fd()),
            self.files.c_path(file).as_ptr(),
        )
        .file_index(Some(dest_slot))
        .flags(libc::O_RDONLY)
        .build())
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

    /// The SQE of op `idx`'s next read from the file in direct slot `slot`,
    /// and the bytes it asks.
    ///
    /// The read that reaches the recorded end of the file asks for one byte
    /// more: if the kernel delivers it, the file grew since the manifest was
    /// built (`Grew`, in `advance`). Without it a grown file would be read
    /// to its old size and the change missed. That byte lands in
    /// `dest[chunk_bytes]` when the op has a spare byte (a plain READ one
    /// byte longer), else in the ring's probe byte (a READV of two
    /// buffers). It costs no extra SQE.
    fn read_sqe(&mut self, idx: u32, target: Target) -> Result<(squeue::Entry, u32), ReadError> {
        let probe: *mut u8 = &mut *self.probe_buf;
        let (dest, offset_bytes, chunk_bytes) = self.next_read(idx)?;
        let state = self.state(idx)?;
        let last = state.done_bytes + u64::from(chunk_bytes) == state.op.len_bytes;
        let probe_len = u32::from(state.ends_at_eof && last);
        if probe_len == 0 || state.op.spare_byte {
            // With a spare byte the probe lands at dest[chunk_bytes], which
            // the op allows only when the read then fails (`Grew`).
            let len = chunk_bytes + probe_len;
            let read = match target {
                Target::Fixed(slot) => opcode::Read::new(types::Fixed(slot), dest, len),
                Target::Fd(fd) => opcode::Read::new(types::Fd(fd), dest, len),
            };
            return Ok((read.offset(offset_bytes).build(), chunk_bytes));
        }
        state.iov = [
            libc::iovec {
                iov_base: dest.cast(),
                iov_len: chunk_bytes as usize,
            },
            libc::iovec {
                iov_base: probe.cast(),
                iov_len: 1,
            },
        ];
        let read = match target {
            Target::Fixed(slot) => opcode::Readv::new(types::Fixed(slot), state.iov.as_ptr(), 2),
            Target::Fd(fd) => opcode::Readv::new(types::Fd(fd), state.iov.as_ptr(), 2),
        };
        Ok((read.offset(offset_bytes).build(), chunk_bytes))
    }

    fn push_chain(&mut self, idx: u32, slot: u32) -> Result<(), ReadError> {
        let file = self.state(idx)?.op.file;
        // Keep-open mode, a file past the kept limit: opened and checked
        // here, then handed to the slot, so the chain starts at its READ.
        let opened = self.files.keep_open();
        if opened {
            if let Err(e) = self.open_checked_into(file, slot) {
                self.release_slot(slot)?;
                return self.finish(idx, Err(e));
            }
        }
        let (read, chunk_bytes) = self.read_sqe(idx, Target::Fixed(slot))?;
        let read = read
            .flags(squeue::Flags::IO_HARDLINK)
            .user_data(Kind::ChainRead.tag(idx));
        let close = opcode::Close::new(types::Fixed(slot))
            .build()
            .user_data(Kind::ChainClose.tag(idx));
        self.state(idx)?.attempt = Attempt::Chain {
            slot,
            chunk_bytes,
            open_res: if opened { 0 } else { PENDING },
            read_res: PENDING,
            close_res: PENDING,
        };
        if opened {
            return self.push(&[read, close]);
        }
        let open = self
            .open_sqe(file, slot)?
            .flags(squeue::Flags::IO_LINK)
            .user_data(Kind::ChainOpen.tag(idx));
        self.push(&[open, read, close])
    }

    /// Opens `file` with a size check and puts it in transient slot `slot`
    /// (the process descriptor is closed again at once).
    fn open_checked_into(&mut self, file: u32, slot: u32) -> Result<(), ReadError> {
        let fd = self.files.open_checked(file)?;
        self.ring
            .submitter()
            .register_files_update(slot, &[fd.as_raw_fd()])
            .map_err(|e| Self::engine_error("put a file in the registered file table", e))?;
        Ok(())
    }

    fn push_fd_read(&mut self, idx: u32, fd: RawFd) -> Result<(), ReadError> {
        let (read, chunk_bytes) = self.read_sqe(idx, Target::Fd(fd))?;
        let read = read.user_data(Kind::FdRead.tag(idx));
        self.state(idx)?.attempt = Attempt::Fd { chunk_bytes };
        self.push(&[read])
    }

    /// Handles every CQE on the ring, and those they lead to, until the ring
    /// has none.
    pub(super) fn handle_completions(&mut self) -> Result<(), ReadError> {
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
            Kind::FdRead => self.on_fd_read(index, result),
            Kind::Wake => {
                self.woken = true;
                if result < 0 && result != -libc::EINTR {
                    let source = io::Error::from_raw_os_error(-result);
                    return Err(Self::engine_error("read the wake-up eventfd", source));
                }
                self.arm_wake()
            }
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

    fn on_fd_read(&mut self, idx: u32, result: i32) -> Result<(), ReadError> {
        let state = self.state(idx)?;
        let Attempt::Fd { chunk_bytes } = state.attempt else {
            let source = io::Error::other(format!(
                "read completion for read {idx}, which has no read on a descriptor in flight"
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
        let state = self.state(idx)?;
        if read_bytes > chunk_bytes {
            // Only a read with the probe byte can return more than asked.
            let file = state.op.file;
            let expected = self.files.size_bytes(file).unwrap_or(0);
            let error = ReadError::grew(self.files.path_buf(file), expected);
            return self.finish(idx, Err(error));
        }
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
}
