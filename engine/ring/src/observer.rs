//! A read-only look at a live ring, for `ringfeed stat`: it takes no lock and
//! writes nothing, so it can never disturb the loader or a trainer. It opens
//! only a ring whose owner a trainer would attach to (`segment::trust`), and
//! shows the header's text only as printable ASCII: another user's segment,
//! or a forged one, is not shown as if it were this user's loader.

use std::time::Duration;

use memmap2::MmapOptions;

use crate::consumer::{validate_header, AttachError};
use crate::layout::{state, Job, Progress, RunShape};
use crate::segment::{self, LOADER_LOCK_BYTE};
use crate::sync::Ordering;
use crate::view::View;

/// Counters of one rank at one instant.
#[derive(Clone, Copy, Debug, Default)]
pub struct RankSnapshot {
    /// Batches published to the rank.
    pub published: u64,
    /// Batches its consumer took.
    pub consumed: u64,
    /// Batches its consumer released.
    pub released: u64,
    /// Payload bytes of the batches its consumers took.
    pub bytes_consumed: u64,
    /// Batches expected in the whole run (u64::MAX: unknown).
    pub batches_expected: u64,
    /// Total time its consumer waited inside `next`.
    pub wait: Duration,
    /// Whether a consumer holds the rank now.
    pub attached: bool,
    /// Pid of the consumer (0 if none).
    pub consumer_pid: u32,
    /// Whether the loader finished the rank.
    pub finished: bool,
}

/// The whole ring at one instant.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Loader pid.
    pub loader_pid: u32,
    /// Whether the loader still holds its lock.
    pub loader_alive: bool,
    /// Loader state (see `layout::state`).
    pub state: u32,
    /// Reader backend.
    pub reader_backend: String,
    /// Reads in flight.
    pub reads_in_flight: u32,
    /// Batches published, all ranks.
    pub batches_published: u64,
    /// Bytes published, all ranks.
    pub bytes_published: u64,
    /// Slots per rank.
    pub slots_per_rank: u32,
    /// Payload bytes per slot.
    pub slot_payload_bytes: u64,
    /// Whole segment size.
    pub segment_bytes: u64,
    /// Where the ring's ranks sit in the training job.
    pub job: Job,
    /// Per rank.
    pub ranks: Vec<RankSnapshot>,
    /// The loader's counters block (all 0 from a loader that predates it).
    pub counters: crate::layout::Counters,
    /// The uid that owns the segment.
    pub owner: u32,
    /// Where the trainers are in the run (None from a loader that predates
    /// it, or before it said).
    pub progress: Option<Progress>,
}

impl Snapshot {
    /// The state in words.
    pub fn state_name(&self) -> &'static str {
        match self.state {
            state::CREATING => "creating",
            state::READY => "running",
            state::ENDED => "ended",
            state::ABORTED => "aborted",
            _ => "unknown",
        }
    }
}

/// `bytes` as text when every byte is printable ASCII (a space included)
/// and there is some; else None. Header text comes from whoever wrote the
/// segment: a control character would reach the terminal of whoever looks.
pub fn printable_ascii(bytes: &[u8]) -> Option<String> {
    let printable = !bytes.is_empty() && bytes.iter().all(|&b| b == b' ' || b.is_ascii_graphic());
    printable.then(|| String::from_utf8_lossy(bytes).into_owned())
}

/// A read-only mapping of a ring.
pub struct Observer {
    fd: std::os::fd::OwnedFd,
    view: View,
    job: Job,
    owner: u32,
}

impl Observer {
    /// Opens loader `name`'s segment read-only and validates it. A segment
    /// owned by a user whom a trainer would not attach to
    /// (`segment::trust::owner_trusted`) is refused, naming its owner, as
    /// attach refuses it.
    pub fn open(name: &str) -> Result<Observer, AttachError> {
        segment::validate_name(name)?;
        let path = segment::shm_path(name).display().to_string();
        // O_NONBLOCK: an open of a FIFO put there for reading would wait for
        // a writer forever.
        let fd = segment::shm_open(name, libc::O_RDONLY | libc::O_NONBLOCK, 0).map_err(|e| {
            if e.raw_os_error() == Some(libc::ENOENT) {
                AttachError::Timeout {
                    name: name.to_string(),
                    path: path.clone(),
                    waited_ms: 0,
                    running: "`ringfeed ls` lists the loaders running here".to_owned(),
                }
            } else {
                AttachError::Io {
                    what: "cannot open",
                    path: path.clone(),
                    source: e,
                }
            }
        })?;
        if let Some(what) = segment::not_a_segment(&fd) {
            return Err(AttachError::Corrupt {
                path,
                what: format!("it is {what}"),
            });
        }
        // Before a byte of it is read or shown, as attach does.
        crate::consumer::check_owner(&fd, name, &path)?;
        let owner = segment::trust::owner_of(&fd).map_err(|e| AttachError::Io {
            what: "cannot stat",
            path: path.clone(),
            source: e,
        })?;
        let size = segment::file_size(&fd).map_err(|e| AttachError::Io {
            what: "cannot stat",
            path: path.clone(),
            source: e,
        })?;
        let file = std::fs::File::from(fd.try_clone().map_err(|e| AttachError::Io {
            what: "cannot dup",
            path: path.clone(),
            source: e,
        })?);
        let map = MmapOptions::new()
            .len(size as usize)
            .map_raw_read_only(&file)
            .map_err(|e| AttachError::Io {
                what: "cannot map",
                path: path.clone(),
                source: e,
            })?;
        // SAFETY: the mapping is `size` bytes long and lives for this borrow.
        let bytes = unsafe { std::slice::from_raw_parts(map.as_ptr(), size as usize) };
        let (layout, job) = validate_header(bytes, &path)?;
        // Another loader's ring linked under this name is not this name's.
        if !crate::name_tag::matches(bytes, name) {
            return Err(AttachError::NameMismatch {
                name: name.to_string(),
                path,
            });
        }
        Ok(Observer {
            fd,
            view: View::new(map, layout),
            job,
            owner,
        })
    }

    /// The uid that owns the segment.
    pub fn owner(&self) -> u32 {
        self.owner
    }

    /// Reads every counter now.
    pub fn snapshot(&self) -> Snapshot {
        let h = self.view.header();
        let l = self.view.layout();
        let r = Ordering::Relaxed;
        let mut backend = Vec::new();
        for cell in &h.reader_backend {
            backend.extend_from_slice(&cell.load(r).to_le_bytes());
        }
        let end = backend
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(backend.len());
        // Written by the segment's owner: shown only as printable ASCII.
        let backend = match &backend[..end] {
            [] => String::new(),
            text => printable_ascii(text).unwrap_or_else(|| "(not printable)".to_owned()),
        };
        let ranks = (0..l.geometry.world_size)
            .map(|rank| {
                let b = self.view.rank(rank);
                RankSnapshot {
                    published: b.published.load(r),
                    consumed: b.consumed.load(r),
                    released: b.released_total.load(r),
                    bytes_consumed: b.bytes_consumed.load(r),
                    batches_expected: b.batches_expected.load(r),
                    wait: Duration::from_nanos(b.wait_ns_total.load(r)),
                    attached: segment::byte_is_locked(&self.fd, segment::rank_lock_byte(rank))
                        .unwrap_or(false),
                    consumer_pid: b.consumer_pid.load(r),
                    finished: b.finished.load(r) != 0,
                }
            })
            .collect();
        let counters = crate::layout::Counters(std::array::from_fn(|i| h.counters[i].load(r)));
        Snapshot {
            loader_pid: h.loader_pid.load(r),
            loader_alive: segment::byte_is_locked(&self.fd, LOADER_LOCK_BYTE).unwrap_or(false),
            state: h.state.load(r),
            reader_backend: backend,
            reads_in_flight: h.reads_in_flight.load(r),
            batches_published: h.batches_published.load(r),
            bytes_published: h.bytes_published.load(r),
            slots_per_rank: l.geometry.slots_per_rank,
            slot_payload_bytes: l.geometry.slot_payload_bytes,
            segment_bytes: l.segment_bytes,
            job: self.job,
            ranks,
            counters,
            owner: self.owner,
            progress: RunShape::read(h).map(|shape| Progress::of(shape, &counters)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::printable_ascii;

    #[test]
    fn header_text_is_shown_only_when_every_byte_is_printable_ascii() {
        assert_eq!(printable_ascii(b"io_uring").as_deref(), Some("io_uring"));
        assert_eq!(printable_ascii(b"a b").as_deref(), Some("a b"));
        for bad in [
            &b""[..],
            b"\x1b]0;x\x07",
            b"tab\there",
            b"caf\xc3\xa9",
            b"nl\n",
        ] {
            assert_eq!(printable_ascii(bad), None, "{bad:?}");
        }
    }
}
