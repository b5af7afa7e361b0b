//! Why attach, next and release fail: one error enum per operation.

use std::io;

use crate::segment::{self, NameError};

/// The ringfeed release this library is (the workspace's one version: the
/// `ringfeed` command, the Python package and this crate agree).
const PACKAGE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The loader's release in words, for the ABI mismatch.
fn loader_words(release: Option<&str>) -> String {
    match release {
        Some(r) => format!("ringfeed {r}"),
        None => "a ringfeed release that does not record it (run `ringfeed --version` where the \
                 loader runs)"
            .to_string(),
    }
}

/// What to install for the trainers, for the ABI mismatch.
fn release_fix(release: Option<&str>) -> String {
    match release {
        Some(r) => format!("install ringfeed {r} for the trainers (pip install ringfeed=={r})"),
        None => "install the loader's release for the trainers (pip install ringfeed==VERSION)"
            .to_string(),
    }
}

/// A feed used in a child forked from the process that attached it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("this feed of {name:?} rank {rank} was attached by process {attached_by}; a forked child cannot take or give back its batches: take them in that process (a torch DataLoader over a feed needs num_workers=0), or attach in the child")]
pub struct Forked {
    /// The loader's name.
    pub name: String,
    /// The rank.
    pub rank: u32,
    /// Pid of the process that attached.
    pub attached_by: u32,
}

/// Why attach failed.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The name is not allowed.
    #[error(transparent)]
    Name(#[from] NameError),
    /// No loader of that name appeared in time.
    #[error("no loader named {name:?} appeared within {waited_ms} ms (looked for {path}); start one with `ringfeed serve --name {name} ...` (a loader that has served its whole run exits and removes it), or check RINGFEED_NAME")]
    Timeout {
        /// The name.
        name: String,
        /// The segment path.
        path: String,
        /// How long we waited.
        waited_ms: u64,
    },
    /// The segment exists but is not a ring, or is corrupt.
    #[error("{path} is not a valid ringfeed segment: {what}")]
    Corrupt {
        /// The segment path.
        path: String,
        /// What is wrong.
        what: String,
    },
    /// The segment was made by another version of ringfeed.
    #[error("{path} is from a loader of {loader} (ring ABI version {found}, {age} ringfeed than this one), but this library is ringfeed {PACKAGE_VERSION} and speaks ring ABI version {expected}; the loader and the trainers must run the same ringfeed release: {fix}, or restart the loader with the `ringfeed` {PACKAGE_VERSION} installed beside this binding", loader = loader_words(.loader_release.as_deref()), age = if .found > .expected { "a newer" } else { "an older" }, fix = release_fix(.loader_release.as_deref()))]
    AbiMismatch {
        /// The segment path.
        path: String,
        /// Version found.
        found: u32,
        /// Version expected.
        expected: u32,
        /// The loader's release, as its header records it (None: not
        /// recorded, a loader that predates the field).
        loader_release: Option<String>,
    },
    /// Rank outside 0..W.
    #[error("rank {rank} is out of range: loader {name:?} serves {world_size} rank(s) on this machine (ranks 0 to {last}); check LOCAL_RANK, and the loader's --world-size (the whole job) and --nnodes", last = .world_size.saturating_sub(1))]
    RankOutOfRange {
        /// The name.
        name: String,
        /// Requested rank.
        rank: u32,
        /// W.
        world_size: u32,
    },
    /// Another live process holds the rank.
    #[error("rank {rank} of loader {name:?} already has a consumer attached (pid {pid}); each rank takes one consumer at a time")]
    RankBusy {
        /// The name.
        name: String,
        /// The rank.
        rank: u32,
        /// The holder's pid.
        pid: u32,
    },
    /// This very process holds the rank: an attachment of it that was
    /// never detached. Waiting would wait on itself, so attach fails at once.
    #[error("rank {rank} of loader {name:?} is already attached by this process (pid {pid}), by an earlier attach not detached (a Feed, or a batch or array of one, alive); keep using it, or detach it first")]
    RankHeldByThisProcess {
        /// The name.
        name: String,
        /// The rank.
        rank: u32,
        /// This process's pid.
        pid: u32,
    },
    /// The loader that made the segment is dead.
    #[error("the loader of {name:?} (pid {pid}) is gone; restart `ringfeed serve` (and run `ringfeed gc` to remove its segment)")]
    LoaderGone {
        /// The name.
        name: String,
        /// Its last pid.
        pid: u32,
    },
    /// The loader stopped on an error (or a signal) and exited; its own words.
    #[error("the loader of {name:?} (pid {pid}) stopped {ago_s} s ago: {message}; fix that and start it again")]
    LoaderFailed {
        /// The name.
        name: String,
        /// Its pid.
        pid: u32,
        /// Seconds since it stopped.
        ago_s: u64,
        /// What it said.
        message: String,
    },
    /// The loader served its whole run and exited.
    #[error("the loader of {name:?} (pid {pid}) served its whole run and exited {ago_s} s ago; start a new one (with --resume, to go on from a checkpoint) to train more")]
    LoaderEnded {
        /// The name.
        name: String,
        /// Its pid.
        pid: u32,
        /// Seconds since it exited.
        ago_s: u64,
    },
    /// The segment belongs to a user this process does not trust: loader
    /// names are shared by every user of the machine, and another user's
    /// loader may serve anything under any name.
    #[error("{path} belongs to {}, not to this user (uid {euid}) or root: the loader of {name:?} is another user's, and its samples are not trusted; use another --name for your loader (and RINGFEED_NAME for its trainers), or, if that user's loaders are yours to trust, set {}={owner}", segment::trust::describe_uid(*owner), segment::trust::TRUST_UID_ENV)]
    Untrusted {
        /// The name.
        name: String,
        /// The segment path.
        path: String,
        /// The uid that owns the segment.
        owner: u32,
        /// This process's effective uid.
        euid: u32,
    },
    /// The segment under this name records another loader's name: a hard
    /// link to another loader's ring (issue 36), which anyone who can write
    /// /dev/shm can make when `fs.protected_hardlinks` is off.
    #[error("{path} is not the ring of loader {name:?}: its header records another loader's name, so it is a hard link to another loader's segment (made by someone who can write {dir}); its samples are not this job's and are not taken; remove it (`rm {path}`, as root or its owner) and start the loader of {name:?}, or use another --name", dir = segment::SHM_DIR)]
    NameMismatch {
        /// The name.
        name: String,
        /// The segment path.
        path: String,
    },
    /// No loader of the name runs, and its outcome's place holds something
    /// no loader writes (a directory, link, FIFO, socket or device): a
    /// loader of the name could not leave its last word there, so waiting
    /// for it would wait out the whole timeout (issue 36).
    #[error("no loader named {name:?} is running, and {path} is a {kind} of {}, which no ringfeed loader makes: a loader of {name:?} that stopped could not leave its outcome there, so this trainer does not wait out its timeout; remove it (as root or its owner) and start the loader (its log says how it ended), or use another --name", segment::trust::describe_uid(*owner))]
    OutcomePlanted {
        /// The name.
        name: String,
        /// The outcome path.
        path: String,
        /// What is there.
        kind: &'static str,
        /// Its owner.
        owner: u32,
    },
    /// An OS call failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The segment path.
        path: String,
        /// The OS error.
        source: io::Error,
    },
}

/// Why `next` failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NextError {
    /// The loader died.
    #[error("the loader of {name:?} (pid {pid}) is gone: it died before the end of the run; restart it (`ringfeed run` resumes from your checkpoint; `ringfeed serve` needs --resume EPOCH:SAMPLES) and attach again")]
    LoaderGone {
        /// The name.
        name: String,
        /// Its pid.
        pid: u32,
    },
    /// The loader stopped early on purpose.
    #[error("the loader of {name:?} stopped before the end of the run: {reason}")]
    Aborted {
        /// The name.
        name: String,
        /// Why, in words.
        reason: String,
    },
    /// The segment broke the protocol.
    #[error("the ring of {name:?} is corrupt: {what}")]
    Corrupt {
        /// The name.
        name: String,
        /// What is wrong.
        what: String,
    },
    /// The next batch goes into a slot that still holds a batch this
    /// consumer took and did not release: no wait can end until it does.
    #[error("the next batch of rank {rank} of {name:?} goes into slot {slot}, which still holds the batch of epoch {epoch} step {step} this process has not given back ({slots_per_rank} slot(s) a rank, used in turn); release it first, or raise --slots-per-rank")]
    SlotHeld {
        /// The name.
        name: String,
        /// The rank.
        rank: u32,
        /// The slot the next batch needs.
        slot: u32,
        /// Epoch of the batch still in it.
        epoch: u64,
        /// Step of the batch still in it.
        step: u64,
        /// K.
        slots_per_rank: u32,
    },
    /// Used in a forked child.
    #[error(transparent)]
    Forked(#[from] Forked),
}

/// Why a release was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseError {
    /// The handle does not name one of this rank's slots.
    #[error("slot {slot} does not belong to rank {rank}")]
    NotOurs {
        /// Slot given.
        slot: u32,
        /// Our rank.
        rank: u32,
    },
    /// The slot was already released and reused.
    #[error("stale batch handle: slot {slot} generation {generation} was released already (the slot now holds generation {current})")]
    Stale {
        /// Slot.
        slot: u32,
        /// Generation in the handle.
        generation: u64,
        /// Generation in the slot.
        current: u64,
    },
    /// The handle names a batch this consumer never took with `next`.
    #[error("slot {slot} generation {generation} was never taken by next(); only batches returned by next() can be released")]
    NotTaken {
        /// Slot.
        slot: u32,
        /// Generation in the handle.
        generation: u64,
    },
    /// The batch was released already.
    #[error("batch in slot {slot} (generation {generation}) was already released")]
    AlreadyReleased {
        /// Slot.
        slot: u32,
        /// Generation.
        generation: u64,
    },
    /// The handle's payload pointer is not this consumer's slot: the batch
    /// came from another feed (another loader, or an earlier attach).
    #[error("the batch's data pointer is not slot {slot} of this feed: it was returned by another feed (another loader or rank, or an earlier attach); release a batch on the feed that returned it")]
    OtherFeed {
        /// Slot given.
        slot: u32,
    },
    /// Used in a forked child.
    #[error(transparent)]
    Forked(#[from] Forked),
}
