//! The io_uring backend: many reads in flight, spread over a few rings.
//!
//! The engine (this file) runs on the loader's thread and does no I/O: it
//! checks reads, hands them in batches to `ReaderConfig::uring_threads`
//! shards (`shard.rs`), each a thread that owns one io_uring (`ring.rs`), and
//! collects their completions from a channel. One ring copies page-cache
//! data on one core only (a cached read runs inline in `io_uring_enter`); a
//! few shards use a few cores, the way the pread pool does, while each keeps
//! io_uring's batching: one `io_uring_enter` opens, reads and closes a whole
//! batch of files. (IOSQE_ASYNC, which hands reads to the kernel's io-wq
//! threads, was measured slower: it costs about 50% more CPU per byte.)
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
//! In keep-open mode (record datasets: few large files, each read many
//! times) a read is a single READ on a process descriptor. The descriptors
//! are shared by all shards (`KeptFiles`): a file's first read in any shard
//! opens it with a plain `openat`, checks its size against the manifest's
//! (`SizeAtOpen`), and keeps it, so every read of a file, in every shard,
//! sees the same file even if its path is replaced or deleted later. Files
//! past the kept limit are opened and checked per read, and closed after it.
//!
//! A read that returns fewer bytes than asked (end of file: the file shrank)
//! is retried for the remainder as a new attempt; an attempt that reads 0
//! bytes is `ChangedSize`. Reads longer than `READ_CHUNK_BYTES_MAX` go as
//! several attempts, one after the other. The attempt that reaches the
//! recorded end of the file asks for one byte more: a READ one byte longer
//! when the op has a spare byte, else a READV with a one-byte probe buffer
//! after the range. A result one byte longer than the range is `Grew`.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use self::ring::Ring;
use self::shard::{Batch, ShardMsg};
use self::wake::Wake;
use super::files::KeptFiles;
use super::{Completion, FileTable, ReadEngine, ReadError, ReadOp, ReaderConfig};

mod ops;
mod probe;
mod ring;
mod shard;
mod wake;

const BACKEND: &str = "io_uring";

/// The engine's side of one shard.
struct ShardHandle {
    batches: Option<Sender<Batch>>,
    wake: Arc<Wake>,
    thread: Option<JoinHandle<()>>,
    /// Reads sent to the shard and not yet come back.
    in_flight: usize,
}

/// The io_uring engine behind `ReadEngine`.
pub(crate) struct UringEngine {
    files: Arc<FileTable>,
    shards: Vec<ShardHandle>,
    msgs: Receiver<ShardMsg>,
    /// Completions that needed no I/O (zero-length reads inside a file).
    ready: VecDeque<Completion>,
    in_flight: usize,
    max_in_flight: usize,
}

impl UringEngine {
    /// Probes io_uring and starts the shards; `UringUnavailable` says why
    /// io_uring cannot be used.
    pub(crate) fn open(
        files: Arc<FileTable>,
        cfg: &ReaderConfig,
    ) -> Result<UringEngine, ReadError> {
        let max_in_flight = cfg.queue_depth as usize;
        // Each message holds at least one completion, so at most
        // max_in_flight messages (plus one failure per shard) are ever queued.
        let (msgs_tx, msgs_rx) = crossbeam_channel::bounded(max_in_flight + cfg.uring_threads);
        let kept = Arc::new(KeptFiles::new(&files, cfg.keep_open_files_max));
        let mut engine = UringEngine {
            files: Arc::clone(&files),
            shards: Vec::with_capacity(cfg.uring_threads),
            msgs: msgs_rx,
            ready: VecDeque::with_capacity(max_in_flight),
            in_flight: 0,
            max_in_flight,
        };
        for id in 0..cfg.uring_threads {
            // Dropping `engine` on an error stops the shards already started.
            engine.start_shard(id, &files, &kept, cfg, &msgs_tx)?;
        }
        Ok(engine)
    }

    fn start_shard(
        &mut self,
        id: usize,
        files: &Arc<FileTable>,
        kept: &Arc<KeptFiles>,
        cfg: &ReaderConfig,
        msgs: &Sender<ShardMsg>,
    ) -> Result<(), ReadError> {
        let engine_error = |op, source| ReadError::Engine {
            backend: BACKEND,
            op,
            source,
        };
        let wake = Arc::new(Wake::new().map_err(|e| engine_error("create an eventfd", e))?);
        let ring = Ring::open(Arc::clone(files), Arc::clone(kept), cfg, Arc::clone(&wake))?;
        // Each shard holds at most max_in_flight reads, in batches of at least one.
        let (batches_tx, batches_rx) = crossbeam_channel::bounded(self.max_in_flight);
        let thread = shard::spawn(id, ring, Arc::clone(&wake), batches_rx, msgs.clone())
            .map_err(|e| engine_error("spawn an io_uring shard thread", e))?;
        self.shards.push(ShardHandle {
            batches: Some(batches_tx),
            wake,
            thread: Some(thread),
            in_flight: 0,
        });
        Ok(())
    }

    /// Takes one shard message into `out`; returns how many completions.
    fn take_msg(&mut self, msg: ShardMsg, out: &mut Vec<Completion>) -> Result<usize, ReadError> {
        match msg {
            ShardMsg::Done { shard, completions } => {
                let n = completions.len();
                self.shards[shard].in_flight -= n;
                self.in_flight -= n;
                out.extend(completions);
                Ok(n)
            }
            ShardMsg::Failed(error) => Err(error),
        }
    }
}

impl ReadEngine for UringEngine {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    unsafe fn submit(&mut self, ops: &[ReadOp]) -> Result<(), ReadError> {
        crate::reader::admit(self.in_flight, self.max_in_flight, ops, &self.files)?;
        // Each read goes to the shard with the fewest in flight, so that a
        // batch spreads evenly and a busy shard gets less.
        let mut batches: Vec<Vec<ReadOp>> = vec![Vec::new(); self.shards.len()];
        for op in ops {
            self.in_flight += 1;
            if self.files.needs_no_io(op) {
                self.ready.push_back(Completion {
                    user_data: op.user_data,
                    result: Ok(()),
                });
                continue;
            }
            let shard = (0..self.shards.len())
                .min_by_key(|&i| self.shards[i].in_flight)
                .unwrap_or(0);
            self.shards[shard].in_flight += 1;
            batches[shard].push(*op);
        }
        for (shard, batch) in self.shards.iter_mut().zip(batches) {
            if batch.is_empty() {
                continue;
            }
            // The channel holds max_in_flight batches, and in_flight stays
            // under that, so this never blocks; it fails only if the shard
            // thread has exited after reporting a failure.
            let sent = shard.batches.as_ref().map(|tx| tx.send(Batch(batch)));
            if !matches!(sent, Some(Ok(()))) {
                let source = io::Error::other("an io_uring shard thread has exited");
                return Err(ReadError::Engine {
                    backend: BACKEND,
                    op: "submit",
                    source,
                });
            }
            shard.wake.poke_if_sleeping();
        }
        Ok(())
    }

    fn reap(
        &mut self,
        out: &mut Vec<Completion>,
        min_complete: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, ReadError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut appended = self.ready.len();
        self.in_flight -= appended;
        out.extend(self.ready.drain(..));
        while let Ok(msg) = self.msgs.try_recv() {
            appended += self.take_msg(msg, out)?;
        }
        while appended < min_complete && self.in_flight > 0 {
            let received = match deadline {
                Some(deadline) => self.msgs.recv_deadline(deadline),
                None => self.msgs.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match received {
                Ok(msg) => appended += self.take_msg(msg, out)?,
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => {
                    let source = io::Error::other("every io_uring shard thread has exited");
                    return Err(ReadError::Engine {
                        backend: BACKEND,
                        op: "reap",
                        source,
                    });
                }
            }
        }
        Ok(appended)
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        // Shards stop taking batches, finish what the kernel is doing (their
        // rings' drops wait for every CQE), and exit; join them so that no
        // byte lands in `dest` after this returns.
        for shard in &mut self.shards {
            shard.wake.close();
            shard.batches = None;
        }
        for shard in &mut self.shards {
            if let Some(thread) = shard.thread.take() {
                if thread.join().is_err() {
                    tracing::error!("an io_uring reader shard thread panicked");
                }
            }
        }
    }
}
