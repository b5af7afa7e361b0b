//! A loader's last word, left after it exits: `/dev/shm/.ringfeed-NAME.outcome`.
//!
//! A loader removes its segment when it stops, so a trainer that attaches
//! after a loader failed (a bad source, before any trainer came) or after it
//! served its whole run would find nothing and wait out its whole timeout.
//! This small file says at once what happened and why. The name starts with a
//! dot, which no loader name may, so it never collides with a segment. A new
//! loader of the same name removes it when it starts, and `ringfeed gc`
//! removes those whose loader is gone; a trainer believes one only while it
//! is [`OUTCOME_FRESH`] old at most.
//!
//! Format, text: `ringfeed-outcome 1 KIND PID UNIX_MS\n` then the message
//! (UTF-8, at most [`OUTCOME_MESSAGE_MAX_BYTES`]). Anything else reads as
//! no outcome: the file is advice, never trusted for more.

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::safe_file::Dir;
use crate::segment::{SEGMENT_PREFIX, SHM_DIR};

/// How long after a loader's exit a trainer reports its outcome at once; an
/// older one is ignored (a new loader of the name may be on its way).
pub const OUTCOME_FRESH: Duration = Duration::from_secs(600);
/// Longest message kept.
pub const OUTCOME_MESSAGE_MAX_BYTES: usize = 2048;
const MAGIC: &str = "ringfeed-outcome 1";

/// How a loader ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutcomeKind {
    /// It served its whole run and exited.
    Ended,
    /// It stopped on an error or a signal.
    Failed,
}

/// A loader's last word.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// How it ended.
    pub kind: OutcomeKind,
    /// Its pid.
    pub pid: u32,
    /// When, in milliseconds since the Unix epoch.
    pub ended_unix_ms: u64,
    /// What it said (its error, with the fix).
    pub message: String,
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `/dev/shm/.ringfeed-NAME.outcome`.
pub fn outcome_path(name: &str) -> PathBuf {
    Path::new(SHM_DIR).join(file_name(name))
}

/// `.ringfeed-NAME.outcome`.
fn file_name(name: &str) -> String {
    format!(".{SEGMENT_PREFIX}{name}.outcome")
}

impl Outcome {
    /// This process's outcome, now.
    pub fn now(kind: OutcomeKind, message: &str) -> Outcome {
        let mut end = message.len().min(OUTCOME_MESSAGE_MAX_BYTES);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        Outcome {
            kind,
            pid: std::process::id(),
            ended_unix_ms: now_unix_ms(),
            message: message[..end].to_string(),
        }
    }

    /// How long ago the loader ended (0 for a time in the future).
    pub fn age(&self) -> Duration {
        Duration::from_millis(now_unix_ms().saturating_sub(self.ended_unix_ms))
    }

    /// Writes it for loader `name`: a new file under an unpredictable name
    /// (`O_EXCL`, mode 0600) renamed over the old one, so a reader never
    /// sees half of it, and a name planted in world-writable /dev/shm (a
    /// symlink to a root file, another user's file) is replaced itself,
    /// never written through or reused.
    pub fn write(&self, name: &str) -> io::Result<()> {
        let kind = match self.kind {
            OutcomeKind::Ended => "ended",
            OutcomeKind::Failed => "failed",
        };
        let text = format!(
            "{MAGIC} {kind} {} {}\n{}",
            self.pid, self.ended_unix_ms, self.message
        );
        let dir = Dir::open(Path::new(SHM_DIR))?;
        dir.write_atomic(OsStr::new(&file_name(name)), text.as_bytes(), 0o600, false)
    }

    /// The outcome left for loader `name`, if any, whatever its age. Only a
    /// regular file owned by a user whose loader this process would trust
    /// (`segment::trust`: itself, root, `RINGFEED_TRUST_UID`) is read, never
    /// through a link, never blocking (a FIFO); anything else is no outcome.
    pub fn read(name: &str) -> Option<Outcome> {
        let dir = Dir::open(Path::new(SHM_DIR)).ok()?;
        let bytes = dir
            .read_trusted_by(
                OsStr::new(&file_name(name)),
                (OUTCOME_MESSAGE_MAX_BYTES + 128) as u64,
                &crate::segment::trust::owner_trusted,
            )
            .ok()?;
        Self::parse(std::str::from_utf8(&bytes).ok()?)
    }

    /// The outcome for loader `name` if it is at most [`OUTCOME_FRESH`] old.
    pub fn read_fresh(name: &str) -> Option<Outcome> {
        Self::read(name).filter(|o| o.age() <= OUTCOME_FRESH)
    }

    fn parse(text: &str) -> Option<Outcome> {
        let (first, message) = text.split_once('\n')?;
        let rest = first.strip_prefix(MAGIC)?.trim_start();
        let mut fields = rest.split(' ');
        let kind = match fields.next()? {
            "ended" => OutcomeKind::Ended,
            "failed" => OutcomeKind::Failed,
            _ => return None,
        };
        let pid = fields.next()?.parse().ok()?;
        let ended_unix_ms = fields.next()?.parse().ok()?;
        Some(Outcome {
            kind,
            pid,
            ended_unix_ms,
            message: message.to_string(),
        })
    }

    /// Removes the outcome of loader `name` (a new loader of the name
    /// starts). An unlink of the name, which never follows a link. In
    /// sticky /dev/shm only the file's owner or root can remove it: root
    /// removes whatever is there (another user's file under this name is
    /// stale or planted, and never believed by this loader's trainers); a
    /// user cannot remove root's or another user's, and leaves it.
    pub fn remove(name: &str) {
        let _ = std::fs::remove_file(outcome_path(name));
    }
}

/// Removes the outcome files of this user's loaders that have no segment
/// (`ringfeed gc`, after it removed dead loaders' segments): the trainers of
/// those runs were told, or were never coming. Returns the names removed.
pub fn remove_stale() -> io::Result<Vec<String>> {
    use std::os::unix::fs::MetadataExt;
    let mut removed = Vec::new();
    for entry in std::fs::read_dir(SHM_DIR)?.filter_map(|e| e.ok()) {
        let file_name = entry.file_name();
        let Some(name) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix('.'))
            .and_then(|n| n.strip_prefix(SEGMENT_PREFIX))
            .and_then(|n| n.strip_suffix(".outcome"))
        else {
            continue;
        };
        // SAFETY: geteuid has no preconditions.
        let mine = entry
            .metadata()
            .is_ok_and(|m| m.uid() == unsafe { libc::geteuid() });
        if mine
            && !crate::segment::shm_path(name).exists()
            && std::fs::remove_file(entry.path()).is_ok()
        {
            removed.push(name.to_string());
        }
    }
    removed.sort();
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outcome_reads_back_as_written_and_garbage_reads_as_none() {
        let name = format!("outcome-test-{}", std::process::id());
        let o = Outcome::now(
            OutcomeKind::Failed,
            "cannot list s3://b/p: 403; set AWS_SECRET_ACCESS_KEY\nsecond line",
        );
        o.write(&name).unwrap();
        assert_eq!(Outcome::read_fresh(&name), Some(o));
        std::fs::write(outcome_path(&name), "not an outcome\n").unwrap();
        assert_eq!(Outcome::read(&name), None);
        std::fs::write(outcome_path(&name), "ringfeed-outcome 1 ended x 5\n").unwrap();
        assert_eq!(Outcome::read(&name), None);
        Outcome::remove(&name);
        assert_eq!(Outcome::read(&name), None);
    }

    #[test]
    fn an_old_outcome_is_not_fresh() {
        let name = format!("outcome-old-{}", std::process::id());
        let mut o = Outcome::now(OutcomeKind::Ended, "served its run");
        o.ended_unix_ms -= OUTCOME_FRESH.as_millis() as u64 + 1000;
        o.write(&name).unwrap();
        assert!(Outcome::read(&name).is_some());
        assert_eq!(Outcome::read_fresh(&name), None);
        Outcome::remove(&name);
    }
}
