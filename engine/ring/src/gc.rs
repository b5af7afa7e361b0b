//! `ringfeed gc`: remove segments whose loader is dead.

use std::io;

use crate::segment::{self, LOADER_LOCK_BYTE, SEGMENT_PREFIX, SHM_DIR};

/// What gc did with one segment.
#[derive(Debug)]
pub enum GcOutcome {
    /// Removed: its loader is dead.
    Removed {
        /// Loader name.
        name: String,
        /// Segment size.
        bytes: u64,
    },
    /// Kept: its loader is alive.
    Alive {
        /// Loader name.
        name: String,
    },
    /// Left alone: another user's (not this user's to judge, even as root;
    /// as anyone else, gc could not open or remove it).
    OtherUsers {
        /// Loader name.
        name: String,
        /// Its owner.
        uid: u32,
    },
    /// Left alone: a directory, link or other file that only has the name
    /// of a segment, or a file ringfeed did not write.
    NotASegment {
        /// The entry's name after the prefix.
        name: String,
        /// What it is.
        kind: String,
    },
    /// Could not be inspected or removed.
    Failed {
        /// Loader name.
        name: String,
        /// Why.
        error: io::Error,
    },
}

/// Inspects every `/dev/shm/ringfeed-*` of this user and removes those whose
/// loader holds no lock. A loader names its segment only once it holds its
/// lock (`Producer::create`), so a segment being created is never taken for
/// a dead one. Other users' segments are left alone, also by root.
pub fn collect() -> io::Result<Vec<GcOutcome>> {
    let mut names: Vec<String> = std::fs::read_dir(SHM_DIR)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix(SEGMENT_PREFIX))
                .map(str::to_string)
        })
        .collect();
    names.sort();
    Ok(names.into_iter().map(|name| inspect(&name)).collect())
}

fn inspect(name: &str) -> GcOutcome {
    // Loaders create, and replace dead, segments under this lock: what is
    // checked below is still there when it is removed.
    let _shm_lock = segment::ShmDirLock::take();
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    match std::fs::symlink_metadata(segment::shm_path(name)) {
        Ok(meta) if !meta.file_type().is_file() => {
            let t = meta.file_type();
            let kind = if t.is_dir() {
                "a directory"
            } else if t.is_symlink() {
                "a symbolic link"
            } else if t.is_fifo() {
                "a FIFO"
            } else {
                "not a regular file"
            };
            return GcOutcome::NotASegment {
                name: name.to_string(),
                kind: kind.to_string(),
            };
        }
        // Another user's segment is theirs to judge, root's gc included:
        // root removes it by hand if it must (docs/operations.md).
        // SAFETY: geteuid has no preconditions.
        Ok(meta) if meta.uid() != unsafe { libc::geteuid() } => {
            return GcOutcome::OtherUsers {
                name: name.to_string(),
                uid: meta.uid(),
            };
        }
        Ok(_) => {}
        Err(error) => {
            return GcOutcome::Failed {
                name: name.to_string(),
                error,
            }
        }
    }
    let fd = match segment::shm_open(name, libc::O_RDONLY, 0) {
        Ok(fd) => fd,
        Err(error) => {
            return GcOutcome::Failed {
                name: name.to_string(),
                error,
            }
        }
    };
    if let Some(kind) = segment::not_a_segment(&fd) {
        return GcOutcome::NotASegment {
            name: name.to_string(),
            kind,
        };
    }
    match segment::byte_is_locked(&fd, LOADER_LOCK_BYTE) {
        Ok(true) => GcOutcome::Alive {
            name: name.to_string(),
        },
        Ok(false) => {
            let bytes = segment::file_size(&fd).unwrap_or(0);
            match segment::shm_unlink(name) {
                Ok(()) => GcOutcome::Removed {
                    name: name.to_string(),
                    bytes,
                },
                Err(error) => GcOutcome::Failed {
                    name: name.to_string(),
                    error,
                },
            }
        }
        Err(error) => GcOutcome::Failed {
            name: name.to_string(),
            error,
        },
    }
}
