//! Watching a run: trainers that do not come, reads that do not land, a
//! ring whose name was removed. (Progress lines come from the ring's
//! figures: `cli::progress`.)

use std::collections::HashMap;
use std::sync::mpsc::TryRecvError;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Loader, RunError};

/// How often the loader looks for trainers that do not come and reads
/// that do not land.
pub(super) const WATCH_EVERY: Duration = Duration::from_secs(5);
/// Reads in flight with no completion for this long get a warning.
const READS_STALLED: Duration = Duration::from_secs(30);
/// No read completed for this long: see `Loader::probe_stalled_files`.
const STALL_PROBE: Duration = Duration::from_secs(1);
/// Most files one stall probe looks at.
const STALL_PROBE_FILES_MAX: usize = 4096;

impl Loader {
    /// Names the ranks among `waiting` that no trainer is attached to: a
    /// trainer that crashed before attaching, or a rank-count typo, would
    /// otherwise look like a loader that hangs in silence. Before any
    /// trainer came, that is normal (torchrun starting, imports): it says
    /// so once, plainly; once some came, the missing ones are warned of
    /// every time.
    pub(super) fn log_unattached(&mut self, waiting: &[u32], context: &str) {
        let missing: Vec<u32> = waiting
            .iter()
            .copied()
            .filter(|&r| !self.producer.consumer_attached(r))
            .collect();
        if missing.is_empty() {
            return;
        }
        let w = self.plan.cfg.world_size;
        let last = w.saturating_sub(1);
        if !(0..w).any(|r| self.producer.ever_attached(r)) {
            if !self.said_waiting {
                self.said_waiting = true;
                let ranks = if w == 1 {
                    "LOCAL_RANK 0".to_owned()
                } else {
                    format!("LOCAL_RANK 0 to {last}")
                };
                tracing::info!("waiting for {w} trainer(s) to attach ({ranks})");
            }
            return;
        }
        // Some trainers came and these did not: a crash or a rank mismatch.
        tracing::warn!(
            "{context}waiting for rank(s) {missing:?}: no trainer is attached to them (the loader serves ranks 0 to {last}; each trainer \
             attaches with LOCAL_RANK set to its rank, and this machine needs {w} trainer(s), LOCAL_RANK 0 to {last})"
        );
    }

    /// Once no read has completed for `STALL_PROBE`, checks that the files
    /// of the reads in flight are regular files: a FIFO put in place of one
    /// (after the listing) blocks an io_uring open until a writer comes,
    /// which may be never. Fails with `NotRegular` naming it, instead of a
    /// loader that waits in silence. Once per stall, on a thread of its own:
    /// on a hung network filesystem the stats block too, and this thread
    /// must go on acting on a stop.
    pub(super) fn probe_stalled_files(&mut self) -> Result<(), RunError> {
        if let Some(outcome) = &self.stall_probe {
            match outcome.try_recv() {
                Ok(found) => {
                    self.stall_probe = None;
                    found?;
                }
                // Still at it (perhaps stuck itself): no second one.
                Err(TryRecvError::Empty) => return Ok(()),
                Err(TryRecvError::Disconnected) => self.stall_probe = None,
            }
        }
        if self.reads_moved.elapsed() < STALL_PROBE || self.stall_probed == Some(self.reads_moved) {
            return Ok(());
        }
        self.stall_probed = Some(self.reads_moved);
        // The files of the waiting batches' reads, less those still queued
        // (per file: a file may be read by several ops); some that already
        // landed are counted in, which costs a stat each.
        let manifest = &self.plan.manifest;
        let mut reads: HashMap<u32, i64> = HashMap::new();
        for sample in self.pending.samples_waiting() {
            *reads.entry(manifest.sample(sample.index).file).or_default() += 1;
        }
        for op in &self.queued {
            *reads.entry(op.file).or_default() -= 1;
        }
        let mut files: Vec<u32> = reads
            .into_iter()
            .filter(|&(_, n)| n > 0)
            .map(|(file, _)| file)
            .collect();
        files.sort_unstable();
        files.truncate(STALL_PROBE_FILES_MAX);
        // Remote reads have a stall detector of their own (the fetch engine's).
        let Some(table) = self.plan.target.files().map(Arc::clone) else {
            return Ok(());
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("ringfeed-stall-probe".into())
            .spawn(move || {
                let _ = tx.send(
                    files
                        .iter()
                        .try_for_each(|&file| table.check_still_regular(file)),
                );
            });
        match spawned {
            Ok(_) => self.stall_probe = Some(rx),
            Err(e) => {
                tracing::debug!("cannot start a thread to look at the files of stalled reads: {e}")
            }
        }
        Ok(())
    }

    /// Warns, every `READS_STALLED`, while reads are in flight and none has
    /// completed for that long: otherwise a read that never returns looks
    /// like a loader that hangs in silence.
    pub(super) fn watch_stall(&mut self) {
        let in_flight = self.reader.in_flight();
        if in_flight == 0 {
            self.reads_moved = Instant::now();
            return;
        }
        let still = self.reads_moved.elapsed();
        let quiet = self
            .stall_warned
            .is_none_or(|t| t.elapsed() >= READS_STALLED);
        if still >= READS_STALLED && quiet {
            tracing::warn!(
                "no read has completed for {:.0} s, with {in_flight} in flight (a hung network filesystem, or a FIFO or device in place of a dataset file under {}?)",
                still.as_secs_f64(),
                self.plan.cfg.source
            );
            self.stall_warned = Some(Instant::now());
        }
    }

    /// Warns, once, when the ring's name is no longer in /dev/shm (removed by
    /// `rm /dev/shm/*` or systemd's RemoveIPC): trainers attached go on, but
    /// none can attach any more, and a rank waiting for one waits for ever.
    pub(super) fn watch_name(&mut self) {
        if self.name_lost || self.producer.name_is_ours() {
            return;
        }
        self.name_lost = true;
        tracing::warn!(
            "{} was removed from /dev/shm while this loader runs (by hand, a cleanup script, or systemd's RemoveIPC=yes at logout): \
             trainers already attached go on, but no trainer can attach any more; stop this loader (Ctrl-C) and start it again \
             (--resume to go on where the trainers are), and keep /dev/shm/ringfeed-* out of cleanups",
            self.producer.path()
        );
    }
}
