//! Allocating the slot payloads in /dev/shm: each by its first claim, the
//! rest on request by a thread of their own.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::{CreateError, Producer};
use crate::layout::Layout;
use crate::segment::{self, human_bytes};

/// Which slot payloads are allocated in /dev/shm. `create` checks that the
/// whole ring fits and allocates the header and tables only; each payload is
/// allocated by its first claim, or earlier by `reserve_rest`. The loader thus
/// never writes a page /dev/shm could refuse (no SIGBUS), and a large ring
/// serves its first batches without first spending 100 ms per 400 MiB in
/// fallocate (a 6 MiB slot costs its first claim about 1.6 ms).
pub(super) struct Backing {
    /// Per slot: allocated (Release after the fallocate).
    pub(super) allocated: Vec<AtomicBool>,
    /// Tells the `reserve_rest` thread to stop.
    pub(super) stop: AtomicBool,
}

impl Backing {
    /// Allocates slot `slot`'s payload in /dev/shm unless that was done (by
    /// the claim or by the `reserve_rest` thread; doing it twice is harmless).
    fn allocate_slot(&self, fd: &OwnedFd, layout: &Layout, slot: u32) -> io::Result<()> {
        use std::sync::atomic::Ordering as O;
        let flag = &self.allocated[slot as usize];
        if flag.load(O::Acquire) {
            return Ok(());
        }
        segment::allocate(
            fd,
            layout.payload_offset_of(slot),
            layout.geometry.slot_payload_bytes,
        )?;
        flag.store(true, O::Release);
        Ok(())
    }
}

/// The `reserve_rest` thread.
fn reserve_slots(fd: &OwnedFd, backing: &Backing, layout: &Layout) {
    let g = layout.geometry;
    for k in 0..g.slots_per_rank {
        for r in 0..g.world_size {
            if backing.stop.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            let slot = r * g.slots_per_rank + k;
            if let Err(e) = backing.allocate_slot(fd, layout, slot) {
                tracing::debug!("reserving the ring stopped at slot {slot}: {e}");
                return;
            }
        }
    }
}

impl Producer {
    /// Allocates slot `slot`'s payload in /dev/shm unless that was done.
    pub(super) fn ensure_allocated(&mut self, slot: u32) -> Result<(), CreateError> {
        let l = self.view.layout();
        self.backing.allocate_slot(&self.fd, l, slot).map_err(|e| {
            if matches!(e.raw_os_error(), Some(libc::ENOSPC)) {
                let free_bytes = segment::free_bytes(&self.fd).unwrap_or(0);
                CreateError::ShmFull {
                    path: self.path.clone(),
                    slot,
                    slot_size: human_bytes(l.geometry.slot_payload_bytes),
                    free_bytes,
                    free: human_bytes(free_bytes),
                }
            } else {
                CreateError::Io {
                    what: "cannot allocate",
                    path: self.path.clone(),
                    source: e,
                }
            }
        })
    }

    /// Allocates, on a thread of its own, every slot payload not allocated
    /// yet, in claim order (every rank's next slot, then the one after, ...).
    /// The loader calls it once every rank has its first batch: from then on
    /// the whole ring is taken from /dev/shm within about 0.1 s per 400 MiB,
    /// charged to the loader, so that a full /dev/shm shows up at once and a
    /// trainer that pins the payload region (`cudaHostRegister`) finds the
    /// pages there. A slot it has not reached is allocated by its claim; an
    /// error stops it quietly and the claim that needs the slot reports it.
    pub fn reserve_rest(&mut self) {
        if self.reserver.is_some() {
            return;
        }
        let Ok(fd) = self.fd.try_clone() else {
            return;
        };
        let backing = Arc::clone(&self.backing);
        let layout = *self.view.layout();
        self.reserver = std::thread::Builder::new()
            .name("ringfeed-reserve".into())
            .spawn(move || reserve_slots(&fd, &backing, &layout))
            .ok();
    }

    /// Stops and joins the thread `reserve_rest` started: a stopping loader
    /// allocates no more of the ring.
    pub(super) fn stop_reserving(&mut self) {
        self.backing
            .stop
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.reserver.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::RingGeometry;
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    /// Bytes of the file actually allocated (st_blocks).
    fn allocated_bytes(fd: &OwnedFd) -> u64 {
        // SAFETY: stat is plain old data; fstat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open and `st` a valid out-pointer.
        assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
        st.st_blocks as u64 * 512
    }

    #[test]
    fn slot_payloads_are_allocated_by_their_first_claim_and_the_rest_on_request() {
        // 4 MiB slots, a multiple of a huge page: the figures below hold on a
        // tmpfs with huge pages too, give or take one 2 MiB page.
        let slot = 4u64 << 20;
        let slack = 2u64 << 20;
        let g = RingGeometry {
            world_size: 2,
            slots_per_rank: 3,
            max_samples_per_slot: 4,
            slot_payload_bytes: slot,
        };
        let mut p = Producer::create(&format!("lazy-alloc-{}", std::process::id()), g).unwrap();
        let l = *p.layout();
        assert_eq!(segment::file_size(&p.fd).unwrap(), l.segment_bytes);
        let base = allocated_bytes(&p.fd);
        assert!(
            base >= l.payload_offset && base <= l.payload_offset + slack,
            "{base} bytes allocated at create"
        );
        let c0 = p.try_claim(0).unwrap().unwrap();
        let c1 = p.try_claim(1).unwrap().unwrap();
        let two = allocated_bytes(&p.fd);
        assert!(
            two >= base + 2 * slot - slack && two <= base + 2 * slot + slack,
            "{two} after two claims"
        );
        p.publish(c0, 0, 0, &[]).unwrap();
        p.publish(c1, 0, 0, &[]).unwrap();
        // The rest of the ring, on request, in the background.
        p.reserve_rest();
        let t = std::time::Instant::now();
        while allocated_bytes(&p.fd) < l.segment_bytes && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            allocated_bytes(&p.fd) >= l.segment_bytes,
            "{} of {} bytes allocated",
            allocated_bytes(&p.fd),
            l.segment_bytes
        );
        // Claims of slots the reserver allocated allocate nothing more.
        let mut c0 = p.try_claim(0).unwrap().unwrap();
        c0.payload_mut().fill(7);
    }

    #[test]
    fn a_ring_not_yet_allocated_counts_against_the_room_of_the_next_until_it_is_or_its_loader_dies()
    {
        let slot = 4u64 << 20;
        let slack = 2u64 << 20;
        let g = RingGeometry {
            world_size: 2,
            slots_per_rank: 3,
            max_samples_per_slot: 4,
            slot_payload_bytes: slot,
        };
        let name = format!("promised-{}", std::process::id());
        let path = segment::shm_path(&name);
        let promised = || {
            segment::promised_to_other_rings("some-other-loader")
                .into_iter()
                .find(|p| p.path == path)
        };
        let mut p = Producer::create(&name, g).unwrap();
        let holes = promised().expect("a live ring with holes is listed").bytes;
        assert!(
            holes + slack >= 6 * slot && holes <= 6 * slot,
            "{holes} bytes promised"
        );
        assert!(
            segment::promised_to_other_rings(&name)
                .iter()
                .all(|p| p.path != path),
            "a ring is not promised to itself"
        );
        let c = p.try_claim(0).unwrap().unwrap();
        p.publish(c, 0, 0, &[]).unwrap();
        let after_claim = promised().unwrap().bytes;
        assert!(
            after_claim + slack >= 5 * slot && after_claim <= 5 * slot,
            "{after_claim} bytes promised after a claim"
        );
        // A dead loader's ring never grows: it is not counted.
        p.abandon();
        assert!(path.exists());
        assert_eq!(promised(), None);
        segment::shm_unlink(&name).unwrap();
        // A ring wholly reserved promises nothing.
        let mut p = Producer::create(&name, g).unwrap();
        p.reserve_rest();
        let t = std::time::Instant::now();
        while promised().is_some() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(promised(), None);
    }
}
