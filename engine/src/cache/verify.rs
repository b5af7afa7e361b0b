//! The check of a cache entry's first whole read in a run, off the loader's
//! thread: the CRC32C of the bytes that landed in the slot, against the CRC
//! its footer holds, computed by a thread of its own while the loader goes
//! on submitting and reaping other reads. The guarantee is the same as when
//! the loader computed it (docs/cache.md, "Reading"): the read's completion
//! is handed out only after its bytes matched, so a byte flipped on disk
//! before the entry's first read back in a run never reaches a trainer.
//!
//! Measured before (issue 40): the filling run's first cached epoch at 35% of
//! a local directory of the same files, the CRC of every entry's first read
//! on the loader thread beside its io_uring submissions and completions.

use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

/// Reads shorter than this are checked on the loader's thread: their CRC
/// (well under a microsecond) costs less than handing them over.
pub const INLINE_CHECK_BYTES_MAX: u64 = 16 << 10;
/// Most checking threads.
pub const CHECK_THREADS_MAX: usize = 4;

/// A read's bytes to check: where they are, how many, and what they must
/// hash to. `user_data` comes back with the outcome.
pub struct Check {
    /// The caller's tag.
    pub user_data: u64,
    /// The read's destination (slot memory).
    dest: *const u8,
    /// Its length.
    len: usize,
    /// The CRC32C the entry's footer holds.
    pub expected: u32,
}

// SAFETY: `dest` points into the read's destination, which the engine's
// caller keeps valid and untouched until the read's completion is handed
// out (`ReadEngine::submit`'s contract); the engine hands it out only after
// this check came back, and `Verifier::drop` waits for every check sent, so
// no thread reads the memory after that.
unsafe impl Send for Check {}

impl Check {
    /// A check of `len` bytes at `dest`.
    ///
    /// # Safety
    /// `dest` is valid for `len` reads, and nothing writes it, until the
    /// check's outcome came back from [`Verifier::outcomes`] (or the
    /// verifier was dropped).
    pub unsafe fn new(user_data: u64, dest: *const u8, len: u64, expected: u32) -> Check {
        Check {
            user_data,
            dest,
            len: len as usize,
            expected,
        }
    }

    /// The CRC32C of the bytes.
    fn crc(&self) -> u32 {
        // SAFETY: `new`'s contract: valid for `len` reads, unwritten until
        // the outcome is back.
        crc32c::crc32c(unsafe { std::slice::from_raw_parts(self.dest, self.len) })
    }
}

/// A check done: the tag, and the CRC32C found.
pub struct Outcome {
    /// The caller's tag.
    pub user_data: u64,
    /// The CRC32C of the bytes read.
    pub found: u32,
    /// The CRC32C the footer holds.
    pub expected: u32,
}

/// Threads that check reads (see the module docs).
pub struct Verifier {
    jobs: Option<Sender<Check>>,
    outcomes: Receiver<Outcome>,
    threads: Vec<JoinHandle<()>>,
    /// Checks sent and not yet taken back.
    pending: usize,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("threads", &self.threads.len())
            .field("pending", &self.pending)
            .finish()
    }
}

impl Verifier {
    /// Starts `threads` checking threads (1 to `CHECK_THREADS_MAX`); None
    /// when none can be started (the loader then checks on its own thread).
    pub fn start(threads: usize) -> Option<Verifier> {
        let (jobs, job_rx) = crossbeam_channel::unbounded::<Check>();
        let (done_tx, outcomes) = crossbeam_channel::unbounded::<Outcome>();
        let mut handles = Vec::new();
        for i in 0..threads.clamp(1, CHECK_THREADS_MAX) {
            let (rx, tx) = (job_rx.clone(), done_tx.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("ringfeed-check-{i}"))
                .spawn(move || {
                    for check in rx {
                        let found = check.crc();
                        // The receiver is gone only when the verifier is
                        // dropped, which then waits for this thread.
                        let _ = tx.send(Outcome {
                            user_data: check.user_data,
                            found,
                            expected: check.expected,
                        });
                    }
                });
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(err) if handles.is_empty() => {
                    tracing::warn!("data cache: cannot start a thread to check entries ({err}); checking them on the loader's thread");
                    return None;
                }
                Err(_) => break,
            }
        }
        Some(Verifier {
            jobs: Some(jobs),
            outcomes,
            threads: handles,
            pending: 0,
        })
    }

    /// Checks sent and not yet taken back.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Sends `check` to a thread; hands it back when none takes it (the
    /// caller checks it itself).
    pub fn send(&mut self, check: Check) -> Result<(), Check> {
        let Some(jobs) = &self.jobs else {
            return Err(check);
        };
        match jobs.send(check) {
            Ok(()) => {
                self.pending += 1;
                Ok(())
            }
            Err(e) => Err(e.into_inner()),
        }
    }

    /// Moves the checks done to `out`, waiting up to `wait` for one when
    /// none is done yet and some are pending.
    pub fn outcomes(&mut self, out: &mut Vec<Outcome>, wait: Duration) {
        let before = out.len();
        out.extend(self.outcomes.try_iter());
        if out.len() == before && self.pending > 0 && !wait.is_zero() {
            match self.outcomes.recv_timeout(wait) {
                Ok(outcome) => out.push(outcome),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
            }
            out.extend(self.outcomes.try_iter());
        }
        self.pending -= out.len() - before;
    }

    /// Checks `check` on this thread.
    pub fn check_here(check: &Check) -> Outcome {
        Outcome {
            user_data: check.user_data,
            found: check.crc(),
            expected: check.expected,
        }
    }
}

impl Drop for Verifier {
    fn drop(&mut self) {
        // Closing the queue ends each thread once it checked what it holds;
        // joined, so no thread reads a slot after the engine is gone.
        self.jobs = None;
        for handle in self.threads.drain(..) {
            let _ = handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_off_the_thread_finds_the_crc_of_the_bytes_and_names_a_mismatch() {
        let good = vec![7u8; 100_000];
        let mut bad = good.clone();
        bad[4_321] ^= 1;
        let want = crc32c::crc32c(&good);
        let mut v = Verifier::start(2).unwrap();
        // SAFETY: both buffers outlive the verifier and are not written meanwhile.
        unsafe {
            assert!(v
                .send(Check::new(1, good.as_ptr(), good.len() as u64, want))
                .is_ok());
            assert!(v
                .send(Check::new(2, bad.as_ptr(), bad.len() as u64, want))
                .is_ok());
        }
        let mut out = Vec::new();
        while out.len() < 2 {
            v.outcomes(&mut out, Duration::from_secs(5));
        }
        assert_eq!(v.pending(), 0);
        out.sort_by_key(|o| o.user_data);
        assert_eq!((out[0].found, out[0].expected), (want, want));
        assert_ne!(out[1].found, out[1].expected);
    }
}
