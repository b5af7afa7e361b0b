//! The decode stage's threads: persistent workers, each with its own
//! `Decoder`, all taking memory from one `MemoryBudget`, fed one sample at a
//! time from one queue (whichever thread is free takes the next sample).
//!
//! A sample's bytes and its image live in a claimed, unpublished slot of the
//! ring: the loader hands the workers raw pointers to them. The ring's
//! mapping must therefore outlive every job a worker may still be running:
//! the loader waits for the pool to be idle (`IdleWatch`) before it unmaps
//! the ring, and leaves the mapping in place when a decode outlives its
//! grace (the process is exiting then). A stop makes every queued sample a
//! no-op and every decode waiting for memory give up.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use ringfeed_decode::{DecodeError, Decoder, ImageSpec, MemoryBudget};

use super::tar::{tar_parts, TarFields};

/// Why one sample gave no image.
pub(super) enum SampleError {
    /// The sample's own fault (a bad sample), in words.
    Bad(String),
    /// The stage was stopped before or while it was decoded.
    Stopped,
    /// The decoder panicked (a bug of ringfeed's): the payload, to go on up.
    Panicked(Box<dyn std::any::Any + Send>),
}

/// A sample's outcome: its tar label (if it has one) or why it failed.
pub(super) type SampleResult = Result<Option<i64>, SampleError>;

/// A pointer into the ring, sent to a worker.
#[derive(Clone, Copy)]
struct RingPtr(*mut u8);

// SAFETY: a RingPtr points into a slot payload the loader claimed and has
// not published; each job gets its own sample's bytes and its own image,
// which no other thread touches until the job's result is received, and the
// mapping outlives every job (the module comment).
unsafe impl Send for RingPtr {}
unsafe impl Sync for RingPtr {}

/// One sample of a batch: its raw bytes and the image it becomes.
pub(super) struct SampleJob {
    pub(super) index: u64,
    input: RingPtr,
    input_len: usize,
    out: RingPtr,
}

impl SampleJob {
    /// Sample `index`, its raw bytes at `input` and its image at `out`
    /// (the stage's image size).
    ///
    /// # Safety
    /// `input..input+input_len` and `out..out+image_len` lie inside one
    /// claimed, unpublished slot payload and do not overlap any other job's
    /// `out`; nothing else writes them until this job's result is received.
    pub(super) unsafe fn new(index: u64, input: *const u8, input_len: usize, out: *mut u8) -> Self {
        SampleJob {
            index,
            input: RingPtr(input.cast_mut()),
            input_len,
            out: RingPtr(out),
        }
    }
}

/// A batch sent to the pool: its samples, and where their results go.
struct BatchJob {
    epoch: u64,
    samples: Vec<SampleJob>,
    results: Sender<(usize, SampleResult)>,
}

struct Job {
    batch: Arc<BatchJob>,
    i: usize,
}

/// What the workers share.
struct Shared {
    spec: ImageSpec,
    seed: u64,
    tar: Option<TarFields>,
    /// Set by a stop: queued samples are skipped, waits for memory end.
    stopping: AtomicBool,
    /// Samples queued or being decoded.
    busy: Mutex<usize>,
    idle: Condvar,
}

impl Shared {
    fn done_one(&self) {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        *busy = busy.saturating_sub(1);
        if *busy == 0 {
            self.idle.notify_all();
        }
    }
}

/// Waits for a pool to hold no sample (see the module comment).
#[derive(Clone)]
pub struct IdleWatch(Arc<Shared>);

impl IdleWatch {
    /// True once no worker holds a sample, false if one still does after
    /// `timeout` (None: wait for as long as it takes).
    pub fn wait(&self, timeout: Option<Duration>) -> bool {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut busy = self.0.busy.lock().unwrap_or_else(|e| e.into_inner());
        while *busy > 0 {
            let slice = match deadline {
                None => Duration::from_millis(100),
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left,
                    _ => return false,
                },
            };
            busy = self
                .0
                .idle
                .wait_timeout(busy, slice)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

/// The decode threads.
pub(super) struct Pool {
    shared: Arc<Shared>,
    jobs: Option<Sender<Job>>,
}

impl Pool {
    /// `threads` workers (at least 1) decoding as `spec` says, seeded
    /// `seed`, taking memory from `budget`; tar samples when `tar`.
    pub(super) fn start(
        threads: usize,
        spec: ImageSpec,
        seed: u64,
        tar: Option<TarFields>,
        budget: &Arc<MemoryBudget>,
    ) -> std::io::Result<Pool> {
        let shared = Arc::new(Shared {
            spec,
            seed,
            tar,
            stopping: AtomicBool::new(false),
            busy: Mutex::new(0),
            idle: Condvar::new(),
        });
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        for t in 0..threads.max(1) {
            let (shared, rx) = (Arc::clone(&shared), rx.clone());
            let decoder = Decoder::with_budget(Arc::clone(budget));
            std::thread::Builder::new()
                .name(format!("ringfeed-decode-{t}"))
                .spawn(move || work(&shared, &rx, decoder))?;
        }
        Ok(Pool {
            shared,
            jobs: Some(tx),
        })
    }

    /// Queues every sample of a batch of `epoch`; their results come on
    /// the returned channel as (position in `samples`, result).
    pub(super) fn submit(
        &self,
        epoch: u64,
        samples: Vec<SampleJob>,
    ) -> Receiver<(usize, SampleResult)> {
        let (results, rx) = crossbeam_channel::unbounded();
        let n = samples.len();
        let batch = Arc::new(BatchJob {
            epoch,
            samples,
            results,
        });
        if let Some(jobs) = &self.jobs {
            *self.shared.busy.lock().unwrap_or_else(|e| e.into_inner()) += n;
            for i in 0..n {
                if jobs
                    .send(Job {
                        batch: Arc::clone(&batch),
                        i,
                    })
                    .is_err()
                {
                    // Every worker is gone (they only leave when the pool
                    // is dropped): the result says stopped.
                    self.shared.done_one();
                    let _ = batch.results.send((i, Err(SampleError::Stopped)));
                }
            }
        }
        rx
    }

    /// Skips every queued sample and ends every wait for memory.
    pub(super) fn stop(&self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
    }

    /// A handle that waits for the pool to hold no sample.
    pub(super) fn idle_watch(&self) -> IdleWatch {
        IdleWatch(Arc::clone(&self.shared))
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // The workers leave once the queue is empty; not joined, so that a
        // stop never waits for a decode under way (see IdleWatch).
        self.jobs = None;
    }
}

fn work(shared: &Shared, jobs: &Receiver<Job>, mut decoder: Decoder) {
    while let Ok(job) = jobs.recv() {
        let result = if shared.stopping.load(Ordering::Relaxed) {
            Err(SampleError::Stopped)
        } else {
            std::panic::catch_unwind(AssertUnwindSafe(|| decode_one(shared, &mut decoder, &job)))
                .unwrap_or_else(|panic| Err(SampleError::Panicked(panic)))
        };
        // The batch's receiver is gone when its batch was abandoned.
        let _ = job.batch.results.send((job.i, result));
        shared.done_one();
    }
}

fn decode_one(shared: &Shared, decoder: &mut Decoder, job: &Job) -> SampleResult {
    let s = &job.batch.samples[job.i];
    // SAFETY: SampleJob::new's contract: both ranges are inside a claimed,
    // unpublished slot that stays mapped while this job runs, the input is
    // only read, and the output is this job's alone.
    let (raw, out) = unsafe {
        (
            std::slice::from_raw_parts(s.input.0.cast_const(), s.input_len),
            std::slice::from_raw_parts_mut(s.out.0, shared.spec.output_len()),
        )
    };
    let (bytes, label) = match &shared.tar {
        Some(fields) => tar_parts(raw, fields).map_err(SampleError::Bad)?,
        None => (raw, None),
    };
    let stopping = || shared.stopping.load(Ordering::Relaxed);
    match decoder.decode_into_unless(
        bytes,
        &shared.spec,
        shared.seed,
        job.batch.epoch,
        s.index,
        out,
        &stopping,
    ) {
        Ok(_) => Ok(label),
        Err(DecodeError::Stopped) => Err(SampleError::Stopped),
        Err(e) => Err(SampleError::Bad(e.to_string())),
    }
}
