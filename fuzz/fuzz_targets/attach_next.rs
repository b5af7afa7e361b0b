//! Arbitrary bytes become a ring segment; a consumer attaches to it and takes
//! batches. Whatever the bytes, attach and `next` must return (an error is
//! fine), never panic, and every batch they hand out must lie inside its own
//! slot of the mapping.
//!
//! Input: `[rank, flags, segment bytes...]`.
//! - `rank`: the rank to attach as (values past the world size are tried too).
//! - `flags` bit 0: resize the segment to the size its header claims (at most
//!   [`FIT_MAX_BYTES`], zero-filled), so that short inputs reach `next`
//!   instead of stopping at the size check.
//! - `flags` bit 1: keep every batch instead of releasing it (the detach then
//!   reclaims them).
//!
//! The segment is a memfd. The harness opens a second open file description
//! of it through /proc/self/fd and holds the loader lock (byte 0) there, so
//! attach sees a live loader and goes on to validate the contents.
//!
//! ASan does not see reads past a batch inside the mapping (it is not heap),
//! so the harness checks every batch against the layout itself: that is the
//! reference model the ring is held to. Each batch's sample keys and the
//! class names (header bytes 1608–1671, flags bits 6 and 7) are read too, and
//! each must lie inside its own slot's payload (the names: slot 0's).
#![no_main]

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use ringfeed_ring::segment::{self, LOADER_LOCK_BYTE};
use ringfeed_ring::{BatchRef, Consumer, Next};

/// Largest segment the "fit" flag makes.
const FIT_MAX_BYTES: u64 = 1 << 20;
/// Batches taken per input (more than any seed's slots per rank).
const NEXT_CALLS: usize = 6;
/// Offset of `segment_bytes` in the header.
const SEGMENT_BYTES_AT: usize = 40;

fn memfd_with(bytes: &[u8], fit: bool) -> Option<OwnedFd> {
    // SAFETY: the name is a valid C string; memfd_create returns a new fd or -1.
    let raw = unsafe { libc::memfd_create(c"ringfeed-fuzz".as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return None;
    }
    // SAFETY: `raw` is a fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut file = File::from(fd.try_clone().ok()?);
    file.write_all(bytes).ok()?;
    if fit && bytes.len() >= SEGMENT_BYTES_AT + 8 {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[SEGMENT_BYTES_AT..SEGMENT_BYTES_AT + 8]);
        let claimed = u64::from_le_bytes(word);
        if claimed <= FIT_MAX_BYTES {
            file.set_len(claimed).ok()?;
        }
    }
    Some(fd)
}

/// A second open file description of the same memfd.
fn reopen(fd: &OwnedFd) -> Option<OwnedFd> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .ok()?;
    Some(OwnedFd::from(file))
}

/// The reference model: a batch lies in our own slot, its table is within
/// capacity, and every sample lies inside the bytes in use. Then every byte
/// is read, so a bad pointer faults here rather than in a trainer.
fn check_batch(consumer: &Consumer, b: &BatchRef) -> u64 {
    let layout = *consumer.layout();
    let g = layout.geometry;
    assert!(b.slot < layout.slot_count(), "slot {} out of range", b.slot);
    assert_eq!(
        b.slot / g.slots_per_rank,
        consumer.rank(),
        "slot of another rank"
    );
    assert!(
        b.n_samples <= g.max_samples_per_slot,
        "{} samples > capacity",
        b.n_samples
    );
    assert!(
        b.data_len <= g.slot_payload_bytes,
        "data_len beyond the slot"
    );
    let (payloads, payloads_len) = consumer.payload_region();
    let slot_start = u64::from(b.slot) * g.slot_payload_bytes;
    assert!(
        slot_start + g.slot_payload_bytes <= payloads_len,
        "slot payload beyond the mapping"
    );
    // SAFETY: slot_start < payloads_len, checked just above.
    assert_eq!(
        b.data,
        unsafe { payloads.add(slot_start as usize) },
        "payload pointer is not the slot's"
    );
    // SAFETY: the batch is taken and not released; the consumer is attached.
    let table = unsafe { b.sample_table() };
    assert_eq!(table.len(), b.n_samples as usize);
    let mut sum = 0u64;
    for (i, s) in table.iter().enumerate() {
        assert!(
            s.offset
                .checked_add(s.len)
                .is_some_and(|end| end <= b.data_len),
            "sample {i} outside the batch"
        );
        // SAFETY: as above; the bounds were just checked.
        let bytes = unsafe { b.sample_bytes(i) };
        sum = bytes
            .iter()
            .fold(sum, |acc, &x| acc.wrapping_add(u64::from(x)));
    }
    sum
}

/// Reads every key of `b` and every class name (at most a few hundred):
/// each must lie inside its slot's payload, the names inside slot 0's.
fn check_names(consumer: &Consumer, b: &BatchRef) -> u64 {
    let g = consumer.layout().geometry;
    let (payloads, _) = consumer.payload_region();
    let inside = |bytes: &[u8], slot: u32| {
        let start = payloads as usize + slot as usize * g.slot_payload_bytes as usize;
        let p = bytes.as_ptr() as usize;
        assert!(
            p >= start && p + bytes.len() <= start + g.slot_payload_bytes as usize,
            "a name outside slot {slot}'s payload"
        );
        bytes.iter().fold(0u64, |acc, &x| acc.wrapping_add(u64::from(x)))
    };
    let mut sum = 0u64;
    for i in 0..=b.n_samples {
        if let Ok(k) = consumer.sample_key(b.slot, b.generation, Some(b.data), i) {
            assert!(i < b.n_samples, "a key past the batch");
            sum = sum.wrapping_add(inside(k.key, b.slot));
        }
    }
    for i in 0..consumer.class_count().min(300) {
        if let Ok(Some(name)) = consumer.class_name(i) {
            sum = sum.wrapping_add(inside(name, 0));
        }
    }
    sum
}

fuzz_target!(|data: &[u8]| {
    let [rank, flags, segment_bytes @ ..] = data else {
        return;
    };
    let Some(loader) = memfd_with(segment_bytes, flags & 1 != 0) else {
        return;
    };
    let Some(consumer_fd) = reopen(&loader) else {
        return;
    };
    if !matches!(segment::try_lock_byte(&loader, LOADER_LOCK_BYTE), Ok(true)) {
        return;
    }
    let Ok(mut consumer) = Consumer::attach_to_fd(consumer_fd, "fuzz", u32::from(*rank)) else {
        return;
    };
    for _ in 0..NEXT_CALLS {
        match consumer.next(Some(Duration::ZERO)) {
            Ok(Next::Batch(b)) => {
                std::hint::black_box(check_batch(&consumer, &b));
                std::hint::black_box(check_names(&consumer, &b));
                if flags & 2 == 0 {
                    let _ = consumer.release(b.slot, b.generation);
                }
            }
            Ok(Next::End) | Ok(Next::Timeout) | Err(_) => break,
        }
    }
    drop(consumer);
    drop(loader);
});
