//! The cache's own threads: the writer, which turns fetched objects into
//! published entries off the loader's thread, and the start-up check of
//! the entries already there.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};

use bytes::Bytes;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::entry::{encode_footer, read_footer};
use super::usage::{flock, DIR_MODE, FILE_MODE, TMP_PREFIX};
use super::{Shared, STATE_ABSENT, STATE_CACHED};
use crate::ring::safe_file;
use crate::ring::segment::human_bytes;
use crate::say::say_err;

/// Work for the writer thread.
pub(crate) enum Job {
    /// Write object `index` whose bytes are these chunks, in order (the
    /// response body as received: refcounted, never copied).
    Write { index: usize, chunks: Vec<Bytes> },
    /// Remove object `index`'s entry (found corrupt).
    Remove { index: usize },
}

/// The writer thread and its queue; dropping it lets the thread finish the
/// queue and waits for it.
pub(crate) struct Writer {
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

/// Sequence of temporary names within this process.
static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

impl Writer {
    pub(crate) fn start(shared: Arc<Shared>) -> Writer {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("ringfeed-cache-writer".into())
            .spawn(move || {
                for job in rx {
                    run_job(&shared, job);
                }
            });
        match thread {
            Ok(thread) => Writer {
                tx: Some(tx),
                thread: Some(thread),
            },
            Err(e) => {
                tracing::warn!("data cache: cannot start its writer thread ({e}); nothing will be cached this run");
                Writer {
                    tx: None,
                    thread: None,
                }
            }
        }
    }

    /// Queues `bytes` of object `index` (its state already `STATE_WRITING`
    /// and its bytes counted in `queued_bytes`). False when the writer is
    /// gone (the caller puts the state back).
    pub(crate) fn send(&self, job: Job) -> bool {
        self.tx.as_ref().is_some_and(|tx| tx.send(job).is_ok())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            // A panicked writer has nothing left to finish.
            let _ = t.join();
        }
    }
}

fn run_job(shared: &Shared, job: Job) {
    match job {
        Job::Write { index, chunks } => {
            let n: u64 = chunks.iter().map(|c| c.len() as u64).sum();
            let published = if shared.stopped.load(Ordering::Relaxed) {
                false
            } else {
                write_entry(shared, index, &chunks)
            };
            if !published {
                shared.state[index].store(STATE_ABSENT, Ordering::Relaxed);
            }
            // A poisoned lock only means a panic elsewhere; the map is whole.
            shared
                .pending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&index);
            shared.queued_bytes.fetch_sub(n, Ordering::Relaxed);
        }
        Job::Remove { index } => {
            remove_entry(shared, index);
            shared.state[index].store(STATE_ABSENT, Ordering::Relaxed);
        }
    }
}

/// Writes, then publishes, the entry of object `index`; true when it is
/// there (written by us or by another loader first).
fn write_entry(shared: &Shared, index: usize, chunks: &[Bytes]) -> bool {
    let Some(id) = shared.identity(index) else {
        return false;
    };
    if chunks.iter().map(|c| c.len() as u64).sum::<u64>() != id.size {
        debug_assert!(false, "chunks of object {index} are not its size");
        return false;
    }
    let file_bytes = id.file_bytes();
    let tmp = shared.dataset_dir.join(format!(
        "{TMP_PREFIX}{file_bytes}.{}.{}",
        std::process::id(),
        TMP_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    // Reserve and create in one locked step, so that a rescan never sees
    // the reservation without its file.
    let reserved = shared.usage.locked(|used| {
        if used.saturating_add(file_bytes) > shared.limit_bytes {
            return Ok((None, *used));
        }
        // O_EXCL (never through a planted name), 0600 whatever the umask.
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        file.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
        flock(&file, libc::LOCK_EX)?;
        *used += file_bytes;
        Ok((Some(file), *used))
    });
    let file = match reserved {
        Ok((Some(file), used)) => {
            shared.stats.used_bytes.store(used, Ordering::Relaxed);
            file
        }
        Ok((None, used)) => {
            note_full(shared, used);
            return false;
        }
        Err(e) => {
            stop(shared, &tmp, &e);
            return false;
        }
    };
    let crc = chunks
        .iter()
        .fold(0, |crc, c| crc32c::crc32c_append(crc, c));
    let written = write_all(&file, chunks, &encode_footer(&id, crc));
    let dest = shared.dataset_dir.join(id.rel_path());
    let outcome = written.and_then(|()| publish(shared, &tmp, &dest, file_bytes));
    drop(file);
    match outcome {
        Ok(used) => {
            shared.stats.used_bytes.store(used, Ordering::Relaxed);
            shared.crc[index].store(crc, Ordering::Relaxed);
            // SYNC POINT: Release pairs with the engine's Acquire load of
            // the state: a reader that sees CACHED sees the CRC above.
            shared.state[index].store(STATE_CACHED, Ordering::Release);
            shared.stats.entries_written.fetch_add(1, Ordering::Relaxed);
            true
        }
        Err(e) => {
            let _ = shared.usage.locked(|used| {
                *used = used.saturating_sub(file_bytes);
                Ok(())
            });
            stop(shared, &tmp, &e);
            false
        }
    }
}

fn write_all(mut file: &File, chunks: &[Bytes], footer: &[u8]) -> io::Result<()> {
    for c in chunks {
        file.write_all(c)?;
    }
    file.write_all(footer)
}

/// Links `tmp` to `dest` without replacing it and removes `tmp`, under the
/// lock; a `dest` already there (another loader's) releases our
/// reservation. Returns the used bytes after.
fn publish(shared: &Shared, tmp: &Path, dest: &Path, file_bytes: u64) -> io::Result<u64> {
    shared.usage.locked(|used| {
        if let Some(parent) = dest.parent() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(DIR_MODE)
                .create(parent)?;
        }
        match fs::hard_link(tmp, dest) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                *used = used.saturating_sub(file_bytes);
            }
            Err(e) => return Err(e),
        }
        fs::remove_file(tmp)?;
        Ok(*used)
    })
}

fn note_full(shared: &Shared, used: u64) {
    if !shared.full.swap(true, Ordering::Relaxed) {
        shared.stats.fill_complete.store(1, Ordering::Relaxed);
        let cached = shared
            .state
            .iter()
            .filter(|s| s.load(Ordering::Relaxed) == STATE_CACHED)
            .count();
        say_err!(
            "ringfeed: data cache full at {} of {}: keeping these {cached} of {} objects (no eviction: under a new random order each epoch a fixed subset hits as often as any policy can)",
            human_bytes(used),
            human_bytes(shared.limit_bytes),
            shared.objects.len()
        );
    }
}

/// One warning, and no more writes this run.
fn stop(shared: &Shared, tmp: &Path, e: &io::Error) {
    let _ = fs::remove_file(tmp);
    if !shared.stopped.swap(true, Ordering::Relaxed) {
        shared.stats.writes_stopped.store(1, Ordering::Relaxed);
        tracing::warn!(
            "data cache: cannot write to {} ({e}); caching stops for this run, which goes on reading from remote \
             (free space there, fix its permissions, or pass --cache off)",
            shared.dataset_dir.display()
        );
    }
}

fn remove_entry(shared: &Shared, index: usize) {
    let (Some(path), Some(id)) = (shared.entry_path(index), shared.identity(index)) else {
        return;
    };
    let removed = shared.usage.locked(|used| match fs::remove_file(&path) {
        Ok(()) => {
            *used = used.saturating_sub(id.file_bytes());
            Ok(*used)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(*used),
        Err(e) => Err(e),
    });
    match removed {
        Ok(used) => shared.stats.used_bytes.store(used, Ordering::Relaxed),
        Err(e) => tracing::warn!(
            "data cache: cannot remove the corrupt entry {} ({e}); remove it by hand or run `ringfeed cache clear`",
            path.display()
        ),
    }
}

/// Marks the objects whose entries exist and have a sound footer CACHED,
/// removing entries with a bad footer, on a thread of its own; waits up to
/// `wait` for it and returns how many were found by then.
pub(crate) fn check_existing(shared: &Arc<Shared>, wait: Duration) -> usize {
    let (tx, rx) = mpsc::channel();
    let worker = Arc::clone(shared);
    let spawned = std::thread::Builder::new()
        .name("ringfeed-cache-check".into())
        .spawn(move || {
            let found = (0..worker.state.len())
                .filter(|&i| check_one(&worker, i))
                .count();
            let _ = tx.send(found);
        });
    if let Err(e) = spawned {
        tracing::warn!(
            "data cache: cannot start the check of its entries ({e}); reading all from remote"
        );
        return 0;
    }
    rx.recv_timeout(wait).unwrap_or_else(|_| {
        tracing::info!(
            "data cache: still checking its entries after {} s; until each is checked it is read from remote",
            wait.as_secs()
        );
        0
    })
}

fn check_one(shared: &Shared, index: usize) -> bool {
    if shared.state[index].load(Ordering::Relaxed) != STATE_ABSENT {
        return false;
    }
    let (Some(path), Some(id)) = (shared.entry_path(index), shared.identity(index)) else {
        return false;
    };
    // Never blocks on a FIFO, never follows a link; a regular file of ours.
    let file = match safe_file::open_trusted(&path) {
        Ok(file) => file,
        Err(e) if e.is_not_found() => return false,
        Err(e) => {
            tracing::warn!("data cache: ignoring {e}");
            return false;
        }
    };
    match read_footer(&file, &id) {
        Ok(Ok(crc)) => {
            shared.crc[index].store(crc, Ordering::Relaxed);
            // SYNC POINT: as in `write_entry`: CACHED is seen with its CRC.
            shared.state[index]
                .compare_exchange(
                    STATE_ABSENT,
                    STATE_CACHED,
                    Ordering::Release,
                    Ordering::Relaxed,
                )
                .is_ok()
        }
        Ok(Err(e)) => {
            tracing::warn!(
                "data cache: entry {} of {} is damaged ({e}); removing it, the object is read from remote",
                path.display(),
                shared.describe(index)
            );
            remove_entry(shared, index);
            false
        }
        Err(_) => false,
    }
}
