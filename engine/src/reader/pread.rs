//! The fallback backend: a fixed pool of threads doing open/pread/close.
//!
//! The engine thread sends each read to the pool over a bounded channel; a
//! worker opens the file (or takes its kept descriptor), preads straight into
//! `dest`, closes, and sends the `Completion` back over a second channel.
//! Both channels hold `max_in_flight` items, and `submit` never lets more
//! reads be in flight, so no send ever blocks.

use std::collections::VecDeque;
use std::io;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::files::{KeptFiles, ReadFd};
use super::{
    Completion, FileTable, ReadEngine, ReadError, ReadOp, ReaderConfig, READ_CHUNK_BYTES_MAX,
    SHORT_READS_MAX,
};

const BACKEND: &str = "pread";

/// A read on its way to a worker.
struct Job(ReadOp);

// SAFETY: the only non-Send field is `dest`. `ReadEngine::submit`'s contract
// gives the engine exclusive use of that memory until the completion is
// reaped, and exactly one worker handles each job, so moving the pointer to
// that worker shares it with nobody.
unsafe impl Send for Job {}

/// What the workers share.
struct Pool {
    files: Arc<FileTable>,
    /// Keep-open mode's descriptors.
    kept: KeptFiles,
    /// Set by drop: workers skip the jobs still queued.
    shutdown: AtomicBool,
    /// An open found the descriptor table full (warned once).
    descriptors_ran_out: AtomicBool,
}

/// The pread thread pool behind `ReadEngine`.
pub(crate) struct PreadEngine {
    jobs: Option<Sender<Job>>,
    done: Receiver<Completion>,
    workers: Vec<JoinHandle<()>>,
    pool: Arc<Pool>,
    /// Completions that needed no worker (zero-length reads inside a file).
    ready: VecDeque<Completion>,
    in_flight: usize,
    max_in_flight: usize,
}

impl PreadEngine {
    /// Starts `cfg.pread_threads` workers.
    pub(crate) fn start(
        files: Arc<FileTable>,
        cfg: &ReaderConfig,
    ) -> Result<PreadEngine, ReadError> {
        let max_in_flight = cfg.queue_depth as usize;
        let pool = Arc::new(Pool {
            kept: KeptFiles::new(&files, cfg.keep_open_files_max),
            files,
            shutdown: AtomicBool::new(false),
            descriptors_ran_out: AtomicBool::new(false),
        });
        let (jobs_tx, jobs_rx) = crossbeam_channel::bounded::<Job>(max_in_flight);
        let (done_tx, done_rx) = crossbeam_channel::bounded::<Completion>(max_in_flight);
        let mut engine = PreadEngine {
            jobs: Some(jobs_tx),
            done: done_rx,
            workers: Vec::with_capacity(cfg.pread_threads),
            pool: Arc::clone(&pool),
            ready: VecDeque::with_capacity(max_in_flight),
            in_flight: 0,
            max_in_flight,
        };
        for i in 0..cfg.pread_threads {
            let (pool, jobs_rx, done_tx) = (Arc::clone(&pool), jobs_rx.clone(), done_tx.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("ringfeed-pread-{i}"))
                .spawn(move || worker(&pool, &jobs_rx, &done_tx));
            match spawned {
                Ok(handle) => engine.workers.push(handle),
                // Dropping `engine` joins the workers already started.
                Err(source) => {
                    return Err(ReadError::Engine {
                        backend: BACKEND,
                        op: "spawn a pread thread",
                        source,
                    })
                }
            }
        }
        Ok(engine)
    }

    fn take_ready(&mut self, out: &mut Vec<Completion>) -> usize {
        let n = self.ready.len();
        out.extend(self.ready.drain(..));
        self.in_flight -= n;
        n
    }
}

impl ReadEngine for PreadEngine {
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
        super::admit(self.in_flight, self.max_in_flight, ops, &self.pool.files)?;
        let Some(jobs) = &self.jobs else {
            return Err(ReadError::Engine {
                backend: BACKEND,
                op: "submit",
                source: io::ErrorKind::BrokenPipe.into(),
            });
        };
        for op in ops {
            self.in_flight += 1;
            if self.pool.files.needs_no_io(op) {
                self.ready.push_back(Completion {
                    user_data: op.user_data,
                    result: Ok(()),
                });
                continue;
            }
            // The channel holds max_in_flight jobs and in_flight stays under
            // that, so this never blocks. It fails only if every worker died
            // (a panic), which leaves nobody to do the read.
            if jobs.send(Job(*op)).is_err() {
                self.in_flight -= 1;
                let source = io::Error::other("every pread thread has exited");
                return Err(ReadError::Engine {
                    backend: BACKEND,
                    op: "submit",
                    source,
                });
            }
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
        let mut appended = self.take_ready(out);
        while let Ok(c) = self.done.try_recv() {
            out.push(c);
            self.in_flight -= 1;
            appended += 1;
        }
        while appended < min_complete && self.in_flight > 0 {
            let received = match deadline {
                Some(deadline) => self.done.recv_deadline(deadline),
                None => self.done.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match received {
                Ok(c) => {
                    out.push(c);
                    self.in_flight -= 1;
                    appended += 1;
                }
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => {
                    let source = io::Error::other("every pread thread has exited");
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

impl Drop for PreadEngine {
    fn drop(&mut self) {
        // Queued jobs are skipped; a read a worker already started finishes
        // before join returns, so no byte lands in `dest` after drop.
        self.pool.shutdown.store(true, Ordering::Relaxed);
        self.jobs = None;
        for worker in self.workers.drain(..) {
            if worker.join().is_err() {
                tracing::error!("a pread reader thread panicked");
            }
        }
    }
}

fn worker(pool: &Pool, jobs: &Receiver<Job>, done: &Sender<Completion>) {
    while let Ok(Job(op)) = jobs.recv() {
        if pool.shutdown.load(Ordering::Relaxed) {
            continue;
        }
        // A panic must not lose the completion: the engine thread would
        // wait for it forever.
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| read_op(pool, &op)))
            .unwrap_or_else(|_| {
                let source = io::Error::other("the pread thread panicked during this read");
                Err(ReadError::Engine {
                    backend: BACKEND,
                    op: "read",
                    source,
                })
            });
        // Fails only when the engine is gone, and then nobody wants it.
        let _ = done.send(Completion {
            user_data: op.user_data,
            result,
        });
    }
}

fn read_op(pool: &Pool, op: &ReadOp) -> Result<(), ReadError> {
    let files = &pool.files;
    let fd = file_fd(pool, op.file)?;
    let size_bytes = files.size_bytes(op.file).unwrap_or(0);
    let ends_at_eof = files.ends_at_eof(op);
    // The read that reaches the recorded end of the file also asks for one
    // byte past it (see ReadOp::spare_byte): if that byte arrives, the file
    // grew. A zero-length op got here only for that probe (an empty file).
    let mut probe_byte = 0u8;
    let mut done_bytes = 0u64;
    let mut short_reads = 0u32;
    loop {
        let chunk_bytes = (op.len_bytes - done_bytes).min(READ_CHUNK_BYTES_MAX);
        // check_op bounded offset + len by the file size, a u64 that fits i64
        // for any real file; the cast cannot wrap for ranges that passed it.
        let offset = (op.offset_bytes + done_bytes) as libc::off_t;
        let iov = [
            libc::iovec {
                // Address arithmetic only; done_bytes <= len_bytes.
                iov_base: op.dest.wrapping_add(done_bytes as usize).cast(),
                iov_len: chunk_bytes as usize,
            },
            libc::iovec {
                iov_base: std::ptr::addr_of_mut!(probe_byte).cast(),
                iov_len: 1,
            },
        ];
        let wants_probe = ends_at_eof && done_bytes + chunk_bytes == op.len_bytes;
        // SAFETY: submit's contract makes `dest` valid for `len_bytes` writes
        // and ours alone; `done_bytes + chunk_bytes <= len_bytes`, so the
        // first buffer is inside it. The probe byte is `dest[len_bytes]`
        // where `spare_byte` allows it (written only if the read then fails
        // with Grew), else `probe_byte`, on this stack. `fd` is open for the
        // whole call.
        let n = unsafe {
            match (wants_probe, op.spare_byte) {
                (true, true) => {
                    libc::pread(fd.raw(), iov[0].iov_base, chunk_bytes as usize + 1, offset)
                }
                (true, false) => libc::preadv(fd.raw(), iov.as_ptr(), 2, offset),
                (false, _) => libc::pread(fd.raw(), iov[0].iov_base, chunk_bytes as usize, offset),
            }
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(ReadError::from_errno(
                files.path_buf(op.file),
                "read",
                err.raw_os_error().unwrap_or(libc::EIO),
            ));
        }
        let n = n as u64;
        if n > chunk_bytes {
            return Err(ReadError::grew(files.path_buf(op.file), size_bytes));
        }
        done_bytes += n;
        if done_bytes == op.len_bytes {
            return Ok(());
        }
        if n == 0 {
            return Err(ReadError::changed_size(
                files.path_buf(op.file),
                size_bytes,
                op.offset_bytes,
                op.len_bytes,
                done_bytes,
            ));
        }
        if n < chunk_bytes {
            short_reads += 1;
            if short_reads > SHORT_READS_MAX {
                let source = io::Error::other(format!("{short_reads} short reads"));
                return Err(ReadError::Io {
                    path: files.path_buf(op.file),
                    op: "read",
                    source,
                });
            }
        }
    }
}

/// How long a worker waits for a descriptor when the process has none left
/// (EMFILE): the other workers close theirs within microseconds of their
/// read, so only a table kept full by something else lasts this long.
const DESCRIPTOR_PATIENCE: Duration = Duration::from_secs(2);

/// The descriptor to read `file` through: in keep-open mode the kept one
/// (checked against the recorded size when opened), else one opened for
/// this read. Under a small `ulimit -n` the workers' opens together can
/// fill the table: an open that finds it full waits for another worker's
/// descriptor to be closed (warning once), for up to `DESCRIPTOR_PATIENCE`.
fn file_fd(pool: &Pool, file: u32) -> Result<ReadFd<'_>, ReadError> {
    let mut full_since: Option<Instant> = None;
    loop {
        let fd = if pool.files.keep_open() {
            pool.kept.fd(&pool.files, file)
        } else {
            pool.files.open(file).map(ReadFd::Owned)
        };
        match fd {
            Err(ReadError::Io { ref source, .. })
                if source.raw_os_error() == Some(libc::EMFILE) =>
            {
                let since = *full_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= DESCRIPTOR_PATIENCE || pool.shutdown.load(Ordering::Relaxed) {
                    return fd;
                }
                if !pool.descriptors_ran_out.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "the loader has no file descriptors left (ulimit -n {}): reads wait for each other's files \
                         to be closed, which slows them; raise `ulimit -n`",
                        super::nofile_limit()
                    );
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            fd => return fd,
        }
    }
}
