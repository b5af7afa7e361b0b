//! A loader's last word, left after it exits: `/dev/shm/.ringfeed-NAME.outcome`.
//!
//! A loader removes its segment when it stops, so a trainer that attaches
//! after a loader failed (a bad source, before any trainer came) or after it
//! served its whole run would find nothing and wait out its whole timeout.
//! This small file says at once what happened and why. The name starts with a
//! dot, which no loader name may, so it never collides with a segment; a
//! trainer believes one only while it is [`OUTCOME_FRESH`] old at most.
//!
//! Its life (issue 39): a new loader of the name removes it when it starts
//! ([`Outcome::clear`]: whatever is there, a planted directory or FIFO
//! included, if this user may remove it; else it says so); `ringfeed run`
//! holds its loader's ([`Outcome::hold`]) while its trainers run and removes
//! it when they are done; `ringfeed gc` removes this user's once no segment
//! of the name is left, no `ringfeed run` holds it, and it is older than
//! [`OUTCOME_GC_GRACE`] ([`collect_stale`]), so a trainer that comes late
//! still reads it.
//!
//! Format, text: `ringfeed-outcome 1 KIND PID UNIX_MS NAME\n` then the
//! message (UTF-8, at most [`OUTCOME_MESSAGE_MAX_BYTES`]). NAME is the
//! loader's: an outcome hard-linked under another loader's name is not
//! believed there (a file without NAME, from an older loader, is). Anything
//! else reads as no outcome: the file is advice, never trusted for more.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::safe_file::{euid, kind_of, Dir, TrustError};
use crate::segment::{SEGMENT_PREFIX, SHM_DIR};

/// How long after a loader's exit a trainer reports its outcome at once; an
/// older one is ignored (a new loader of the name may be on its way).
pub const OUTCOME_FRESH: Duration = Duration::from_secs(600);
/// How long `ringfeed gc` leaves an outcome whose loader is gone: a trainer
/// that attaches late still reads it.
pub const OUTCOME_GC_GRACE: Duration = Duration::from_secs(60);
/// Longest message kept.
pub const OUTCOME_MESSAGE_MAX_BYTES: usize = 2048;
const MAGIC: &str = "ringfeed-outcome 1";
/// The byte of an outcome file whose lock says that a `ringfeed run` still
/// runs the loader's trainers ([`Outcome::hold`]).
const HOLD_LOCK_BYTE: i64 = 0;

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

/// What lies at a loader's outcome place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// Nothing a trainer believes: no file, another user's, a garbled or a
    /// foreign one.
    Nothing,
    /// Something no loader makes there: a directory, link, FIFO, socket or
    /// device. A loader of the name could not write its outcome.
    Planted {
        /// What it is.
        kind: &'static str,
        /// Its owner.
        owner: u32,
    },
    /// A loader's outcome.
    Outcome(Outcome),
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

/// The loader name of an outcome's file name.
fn loader_name_of(file_name: &OsStr) -> Option<&str> {
    file_name
        .to_str()?
        .strip_prefix('.')?
        .strip_prefix(SEGMENT_PREFIX)?
        .strip_suffix(".outcome")
}

fn shm() -> io::Result<Dir> {
    Dir::open(Path::new(SHM_DIR))
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
    /// never written through or reused. What a rename cannot replace (a
    /// directory planted meanwhile) is removed first if this user may
    /// ([`Outcome::clear`]); else the error says what is there.
    pub fn write(&self, name: &str) -> io::Result<()> {
        let kind = match self.kind {
            OutcomeKind::Ended => "ended",
            OutcomeKind::Failed => "failed",
        };
        let text = format!(
            "{MAGIC} {kind} {} {} {name}\n{}",
            self.pid, self.ended_unix_ms, self.message
        );
        let dir = shm()?;
        let file = file_name(name);
        let write = || dir.write_atomic(OsStr::new(&file), text.as_bytes(), 0o600, false);
        match write() {
            Ok(()) => Ok(()),
            Err(first) => match Self::clear(name) {
                Ok(_) => write(),
                Err(why) => Err(io::Error::new(first.kind(), why)),
            },
        }
    }

    /// What lies at loader `name`'s outcome place. Only a regular file owned
    /// by a user whose loader this process would trust (`segment::trust`:
    /// itself, root, `RINGFEED_TRUST_UID`) is read, never through a link,
    /// never blocking (a FIFO), and only if it names this loader (or no
    /// loader: an older one's).
    pub fn look(name: &str) -> Found {
        let Ok(dir) = shm() else {
            return Found::Nothing;
        };
        let file = file_name(name);
        let read = dir.read_trusted_by(
            OsStr::new(&file),
            (OUTCOME_MESSAGE_MAX_BYTES + 256) as u64,
            &crate::segment::trust::owner_trusted,
        );
        match read {
            Ok(bytes) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|text| Self::parse(text, name))
                .map_or(Found::Nothing, Found::Outcome),
            Err(TrustError::NotRegular { .. }) => match dir.lstat(OsStr::new(&file)) {
                Ok(st) if st.st_mode & libc::S_IFMT != libc::S_IFREG => Found::Planted {
                    kind: kind_of(st.st_mode),
                    owner: st.st_uid,
                },
                _ => Found::Nothing,
            },
            Err(_) => Found::Nothing,
        }
    }

    /// The outcome left for loader `name`, if any, whatever its age
    /// ([`Outcome::look`]).
    pub fn read(name: &str) -> Option<Outcome> {
        match Self::look(name) {
            Found::Outcome(o) => Some(o),
            _ => None,
        }
    }

    /// The outcome for loader `name` if it is at most [`OUTCOME_FRESH`] old.
    pub fn read_fresh(name: &str) -> Option<Outcome> {
        Self::read(name).filter(|o| o.age() <= OUTCOME_FRESH)
    }

    fn parse(text: &str, name: &str) -> Option<Outcome> {
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
        if fields.next().is_some_and(|recorded| recorded != name) {
            // Another loader's outcome, hard-linked under this name.
            return None;
        }
        Some(Outcome {
            kind,
            pid,
            ended_unix_ms,
            message: message.to_string(),
        })
    }

    /// Removes the outcome of loader `name` if it is this user's own file
    /// (tests, and `ringfeed run` once its trainers are done); anything
    /// else there is left.
    pub fn remove(name: &str) {
        let Ok(dir) = shm() else {
            return;
        };
        let file = file_name(name);
        if dir
            .lstat(OsStr::new(&file))
            .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_uid == euid())
        {
            let _ = dir.remove(OsStr::new(&file));
        }
    }

    /// Clears loader `name`'s outcome place for a new loader of the name:
    /// its own old outcome is removed quietly; anything else there (a
    /// directory, link, FIFO, another user's file: planted, or another
    /// user's loader's word) is removed if this user may (root may, in
    /// sticky /dev/shm), and `Ok(Some(words))` says what was removed. `Err`
    /// says what is there and that this user cannot remove it: the trainers
    /// will not learn how this loader ends.
    pub fn clear(name: &str) -> Result<Option<String>, String> {
        let path = outcome_path(name);
        let dir = shm().map_err(|e| format!("cannot open {SHM_DIR}: {e}"))?;
        let file = file_name(name);
        let st = match dir.lstat(OsStr::new(&file)) {
            Ok(st) => st,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot inspect {}: {e}", path.display())),
        };
        let regular = st.st_mode & libc::S_IFMT == libc::S_IFREG;
        let what = format!(
            "a {} of {}",
            kind_of(st.st_mode),
            crate::segment::trust::describe_uid(st.st_uid)
        );
        match dir.remove_tree(OsStr::new(&file)) {
            Ok(()) if regular && st.st_uid == euid() => Ok(None),
            Ok(()) => Ok(Some(format!(
                "removed {}, {what}, which no loader of this user made",
                path.display()
            ))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!(
                "{} is {what}, and this user (uid {}) cannot remove it ({e}): the trainers of {name:?} \
                 will not be told how this loader ends; remove it as root (or its owner), or use another --name",
                path.display(),
                euid()
            )),
        }
    }

    /// Holds loader `name`'s outcome for a `ringfeed run` whose trainers
    /// still run: a lock on it that `ringfeed gc` respects, which the
    /// kernel drops when the holder exits. None when there is no outcome of
    /// this user's to hold.
    pub fn hold(name: &str) -> Option<File> {
        let dir = shm().ok()?;
        let file = dir.open_trusted_rw(OsStr::new(&file_name(name))).ok()?;
        let fd = OwnedFd::from(file);
        crate::segment::try_lock_byte(&fd, HOLD_LOCK_BYTE)
            .ok()
            .filter(|&locked| locked)?;
        Some(File::from(fd))
    }
}

/// What `ringfeed gc` did with this user's outcome files.
#[derive(Debug, Default)]
pub struct OutcomeGc {
    /// Removed: their loader is gone, nobody holds them, and they are older
    /// than [`OUTCOME_GC_GRACE`].
    pub removed: Vec<String>,
    /// Kept: younger than [`OUTCOME_GC_GRACE`] (a trainer may still come).
    pub recent: Vec<String>,
    /// Kept: a `ringfeed run` still runs their trainers.
    pub held: Vec<String>,
}

/// Removes the outcome files of this user's loaders that are gone (no
/// segment of the name), that no `ringfeed run` holds, and that are older
/// than [`OUTCOME_GC_GRACE`] (`ringfeed gc`, after it removed dead loaders'
/// segments): the trainers of those runs were told, or are not coming.
/// Everything is done through /dev/shm's descriptor; other users' files,
/// and anything not a regular file, are left.
pub fn collect_stale() -> io::Result<OutcomeGc> {
    let dir = shm()?;
    let mut gc = OutcomeGc::default();
    for file in dir.names()? {
        let Some(name) = loader_name_of(&file) else {
            continue;
        };
        let mine = dir
            .lstat(&file)
            .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_uid == euid());
        let segment = format!("{SEGMENT_PREFIX}{name}");
        if !mine || dir.lstat(OsStr::new(&segment)).is_ok() {
            continue;
        }
        let Ok(opened) = dir.open_trusted(&file) else {
            continue;
        };
        let age = opened
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .unwrap_or_default();
        let fd = OwnedFd::from(opened);
        if age < OUTCOME_GC_GRACE {
            gc.recent.push(name.to_string());
        } else if crate::segment::byte_is_locked(&fd, HOLD_LOCK_BYTE).unwrap_or(true) {
            gc.held.push(name.to_string());
        } else if dir.remove(&file).is_ok() {
            gc.removed.push(name.to_string());
        }
    }
    for names in [&mut gc.removed, &mut gc.recent, &mut gc.held] {
        names.sort();
    }
    Ok(gc)
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
        // An older loader's, with no name: believed.
        std::fs::write(outcome_path(&name), "ringfeed-outcome 1 ended 7 5\nbye").unwrap();
        assert_eq!(Outcome::read(&name).map(|o| o.pid), Some(7));
        // Another loader's (a hard link under this name): not.
        std::fs::write(
            outcome_path(&name),
            "ringfeed-outcome 1 ended 7 5 other-job\nbye",
        )
        .unwrap();
        assert_eq!(Outcome::read(&name), None);
        Outcome::remove(&name);
        assert_eq!(Outcome::read(&name), None);
    }

    #[test]
    fn a_directory_at_the_outcome_place_is_told_and_cleared() {
        let name = format!("outcome-dir-{}", std::process::id());
        std::fs::create_dir_all(outcome_path(&name).join("inside")).unwrap();
        assert_eq!(
            Outcome::look(&name),
            Found::Planted {
                kind: "directory",
                owner: euid()
            }
        );
        let o = Outcome::now(OutcomeKind::Failed, "no such source");
        o.write(&name).unwrap();
        assert_eq!(Outcome::read(&name), Some(o));
        Outcome::remove(&name);
        assert_eq!(Outcome::look(&name), Found::Nothing);
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
