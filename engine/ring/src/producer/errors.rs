//! Why a ring could not be created or a batch published, and the words
//! that tell the user how much /dev/shm to give and where.

use std::io;
use std::os::fd::OwnedFd;

use crate::layout::GeometryError;
use crate::segment::{self, human_bytes, NameError};

/// Why a ring could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The name is not allowed.
    #[error(transparent)]
    Name(#[from] NameError),
    /// The geometry is out of range.
    #[error("cannot build a ring of this shape: {0}")]
    Geometry(#[from] GeometryError),
    /// The ring's ranks do not lie inside the job (`create_in_job`).
    #[error("cannot build a ring whose ranks are not all in the job: {0}")]
    Job(String),
    /// Another live loader has this name.
    #[error("a loader named {name:?} is already running ({}) as {}; {}", running_pid(*pid), segment::trust::describe_uid(*owner), already_running_fix(*owner))]
    AlreadyRunning {
        /// The name.
        name: String,
        /// Its pid, as recorded in its segment (0: not recorded yet).
        pid: u32,
        /// The uid that owns its segment.
        owner: u32,
    },
    /// /dev/shm has not enough room.
    #[error(
        "/dev/shm is too small for the ring {path}: it needs {} ({needed_bytes} bytes) but only {}{}. \
         Give shared memory more room: `docker run --shm-size={}`, or in Kubernetes mount an `emptyDir` with `medium: Memory` \
         (and a sizeLimit of at least {}) at /dev/shm; or make the ring smaller",
        human_bytes(*needed_bytes), room_left(room), others_clause(room), docker_size(*suggest_mib), kubernetes_size(*suggest_mib)
    )]
    ShmTooSmall {
        /// The segment path.
        path: String,
        /// Bytes the segment needs.
        needed_bytes: u64,
        /// /dev/shm's free bytes, and the other live loaders' rings that
        /// will still take part of them as their slots are first claimed.
        room: segment::Room,
        /// A size of /dev/shm to suggest, in MiB: what it holds now, the
        /// rings promised and this one, and a quarter more.
        suggest_mib: u64,
    },
    /// /dev/shm filled up after the ring was created: a slot could not be
    /// allocated.
    #[error(
        "/dev/shm filled up while the loader ran: slot {slot} of the ring {path} ({slot_size}) could not be allocated, \
         {free} ({free_bytes} bytes) are free. Something else is using /dev/shm (another loader? see `df -h /dev/shm` and \
         `ringfeed gc`); give shared memory more room (`docker run --shm-size=...`, or a Kubernetes `emptyDir` with \
         `medium: Memory`), or make the ring smaller (--slots-per-rank, --batch-size)"
    )]
    ShmFull {
        /// The segment path.
        path: String,
        /// The slot.
        slot: u32,
        /// Human-readable slot size.
        slot_size: String,
        /// Bytes free in /dev/shm.
        free_bytes: u64,
        /// Human-readable free.
        free: String,
    },
    /// The name is taken by something ringfeed did not make.
    #[error("{path} is {what}, not a ringfeed segment: ringfeed leaves it alone, since something else made it; remove it if nothing uses it, or choose another --name")]
    NotASegment {
        /// The segment path.
        path: String,
        /// What it is.
        what: String,
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

/// The other loader's pid in words: 0 means it is still creating its segment.
/// What to do about a name held by a live loader of `owner`.
fn already_running_fix(owner: u32) -> &'static str {
    if owner == crate::safe_file::euid() {
        "stop it or choose another --name"
    } else {
        "loader names are shared by every user of this machine, and this one is another user's: \
         choose another --name (and give it to the trainers), or ask that user to stop theirs"
    }
}

fn running_pid(pid: u32) -> String {
    if pid == 0 {
        "it is creating its segment right now".to_string()
    } else {
        format!("pid {pid}")
    }
}

/// A batch that cannot be published as described.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// Batches of a rank must be published in claim order.
    #[error("rank {rank}: batch {seq} published before batch {expected}")]
    OutOfOrder {
        /// Rank.
        rank: u32,
        /// Seq of this claim.
        seq: u64,
        /// Seq expected next.
        expected: u64,
    },
    /// More samples than the slot's table holds.
    #[error("batch has {n} samples but a slot holds at most {max}")]
    TooManySamples {
        /// Samples given.
        n: usize,
        /// Capacity.
        max: u32,
    },
    /// A sample lies outside the payload.
    #[error("sample {i} (offset {offset}, {len} bytes) lies outside the {payload_bytes}-byte slot payload")]
    SampleOutOfBounds {
        /// Position in the batch.
        i: usize,
        /// Its offset.
        offset: u64,
        /// Its length.
        len: u64,
        /// Payload size.
        payload_bytes: u64,
    },
}

/// `ShmTooSmall` for a ring of `needed_bytes` with only `room`.
pub(super) fn shm_too_small(path: &str, needed_bytes: u64, room: segment::Room) -> CreateError {
    let suggest_mib = suggest_shm_mib(needed_bytes, &room);
    CreateError::ShmTooSmall {
        path: path.to_string(),
        needed_bytes,
        room,
        suggest_mib,
    }
}

/// A /dev/shm size in MiB: what it holds now, the rings promised, this
/// ring, and a quarter more (NCCL keeps buffers there too); in steps of
/// 256 MiB below 4 GiB, of 1 GiB above.
fn suggest_shm_mib(needed_bytes: u64, room: &segment::Room) -> u64 {
    let (mib, gib) = (1u64 << 20, 1u64 << 30);
    let used = room.size_bytes.saturating_sub(room.free_bytes);
    let want = used
        .saturating_add(room.promised_bytes())
        .saturating_add(needed_bytes);
    let want = want.saturating_add(want / 4);
    if want < 4 * gib {
        want.div_ceil(256 * mib).max(1) * 256
    } else {
        want.div_ceil(gib) * 1024
    }
}

/// `mib` as `docker run --shm-size` takes it ("768m", "6g").
fn docker_size(mib: u64) -> String {
    if mib.is_multiple_of(1024) {
        format!("{}g", mib / 1024)
    } else {
        format!("{mib}m")
    }
}

/// `mib` as a Kubernetes quantity ("768Mi", "6Gi"): there "m" is a
/// thousandth, and "768m" would be under one byte.
fn kubernetes_size(mib: u64) -> String {
    if mib.is_multiple_of(1024) {
        format!("{}Gi", mib / 1024)
    } else {
        format!("{mib}Mi")
    }
}

/// "R (r bytes) are free" (or "left", when other rings take part of the
/// free bytes) for `ShmTooSmall`.
fn room_left(room: &segment::Room) -> String {
    let left = room.left();
    format!(
        "{} ({left} bytes) are {}",
        human_bytes(left),
        if room.promised.is_empty() {
            "free"
        } else {
            "left"
        }
    )
}

/// Empty, or the clause of `ShmTooSmall` that says where the free bytes
/// went: the rings other loaders will still allocate.
fn others_clause(room: &segment::Room) -> String {
    if room.promised.is_empty() {
        return String::new();
    }
    let rings: Vec<String> = room
        .promised
        .iter()
        .map(|p| format!("{} {}", p.path.display(), human_bytes(p.bytes)))
        .collect();
    format!(
        ": {} are free, of which {} are promised to the rings of other running loaders, allocated as their slots fill ({})",
        human_bytes(room.free_bytes),
        human_bytes(room.promised_bytes()),
        rings.join(", ")
    )
}

/// The error for a failed allocation of part of the segment.
pub(super) fn alloc_error(
    path: &str,
    fd: &OwnedFd,
    needed_bytes: u64,
    e: io::Error,
) -> CreateError {
    if e.raw_os_error() == Some(libc::ENOSPC) {
        let room = segment::room_of(fd).unwrap_or(segment::Room {
            size_bytes: 0,
            free_bytes: 0,
            promised: Vec::new(),
        });
        shm_too_small(path, needed_bytes, room)
    } else {
        CreateError::Io {
            what: "cannot allocate",
            path: path.to_string(),
            source: e,
        }
    }
}

/// The error for a segment of this name that cannot be opened: for
/// another user's, who owns it and what to do.
pub(super) fn open_existing_error(path: &str, e: io::Error) -> CreateError {
    use std::os::unix::fs::MetadataExt;
    if e.raw_os_error() == Some(libc::EACCES) {
        if let Ok(meta) = std::fs::metadata(path) {
            return CreateError::Io {
                what: "cannot open existing",
                path: path.to_string(),
                source: io::Error::new(
                    e.kind(),
                    format!(
                        "{e}: it belongs to user id {} (this process runs as {}); choose another --name, or run as that user (or have them run `ringfeed gc` if their loader is gone)",
                        meta.uid(),
                        // SAFETY: getuid has no preconditions.
                        unsafe { libc::getuid() }
                    ),
                ),
            };
        }
    }
    CreateError::Io {
        what: "cannot open existing",
        path: path.to_string(),
        source: e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suggested_shm_size_holds_what_is_there_the_promised_rings_and_this_one_with_room_to_spare(
    ) {
        let mib = 1u64 << 20;
        let room = |size_bytes, free_bytes, promised: &[u64]| segment::Room {
            size_bytes,
            free_bytes,
            promised: promised
                .iter()
                .map(|&bytes| segment::Promised {
                    path: "/dev/shm/ringfeed-x".into(),
                    bytes,
                })
                .collect(),
        };
        let both = |needed, room| {
            let mib = suggest_shm_mib(needed, &room);
            (docker_size(mib), kubernetes_size(mib))
        };
        // Docker's default 64 MiB, 60 of them used: an 8 MiB ring needs 68, and a quarter more.
        assert_eq!(
            both(8 * mib, room(64 * mib, 4 * mib, &[])),
            ("256m".into(), "256Mi".into())
        );
        // A 700 MiB ring, 200 MiB promised: 900 x 1.25 = 1125 MiB, 1280 in steps of 256.
        assert_eq!(
            both(700 * mib, room(64 * mib, 64 * mib, &[200 * mib])),
            ("1280m".into(), "1280Mi".into())
        );
        assert_eq!(
            both(3 << 30, room(1 << 30, 0, &[])),
            ("5g".into(), "5Gi".into())
        );
        // 1 GiB exactly, in steps of 256 MiB: said in GiB.
        assert_eq!(
            both(800 * mib, room(0, 0, &[])),
            ("1g".into(), "1Gi".into())
        );
        // Unknown room (a failed statvfs): the ring alone.
        assert_eq!(
            both(8 * mib, room(0, 0, &[])),
            ("256m".into(), "256Mi".into())
        );
    }
}
