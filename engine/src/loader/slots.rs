//! How many slots each rank gets: the rules of the default (twice the
//! queue depth in flight, bounded, fitted to /dev/shm) in one place.

use crate::ring::segment::human_bytes;
use crate::ring::{Layout, RingGeometry};

/// Fewest slots per rank the default falls back to when /dev/shm is short.
pub const AUTO_SLOTS_FLOOR: u32 = 2;

/// The default K, lowered (with a warning) while the ring would not fit in
/// `free_bytes` of /dev/shm, down to `AUTO_SLOTS_FLOOR`: a default that fits
/// beats one that fails. A ring that does not fit even then is left to
/// `Producer::create`, which says how much room it needs.
pub(super) fn fit_auto_slots(geometry: RingGeometry, free_bytes: Option<u64>) -> u32 {
    let Some(free) = free_bytes else {
        return geometry.slots_per_rank;
    };
    let bytes = |k| {
        Layout::compute(RingGeometry {
            slots_per_rank: k,
            ..geometry
        })
        .map_or(u64::MAX, |l| l.segment_bytes)
    };
    let want = geometry.slots_per_rank;
    let mut k = want;
    while k > AUTO_SLOTS_FLOOR && bytes(k) > free {
        k -= 1;
    }
    if k < want && bytes(k) <= free {
        tracing::warn!(
            "/dev/shm has {} of room (free, less what other running loaders' rings will still take), too little for the default {want} slots per rank ({}): using {k} ({}); \
             give shared memory more room for more prefetch, or pass --slots-per-rank",
            human_bytes(free),
            human_bytes(bytes(want)),
            human_bytes(bytes(k))
        );
        k
    } else {
        want
    }
}

/// Fewest slots per rank chosen by default.
pub const AUTO_SLOTS_MIN: u32 = 4;
/// Most slots per rank chosen by default.
pub const AUTO_SLOTS_MAX: u32 = 16;
/// Payload bytes per rank above which the default stops adding slots past
/// `AUTO_SLOTS_MIN`.
pub const AUTO_RANK_BYTES_MAX: u64 = 256 << 20;

/// The default slots per rank: enough that a full queue depth of reads can be
/// in flight twice over while a rank's trainer holds a batch and another
/// waits to be taken, i.e. 2·queue_depth/B, at least 4 and at most 16, and,
/// where a rank's slots would pass 256 MiB, only as many as fit in it (but
/// still at least 4). A batch is published
/// only when its last read lands; with fewer slots the queue drains at every
/// batch boundary. Measured on 2 cores, 100 KB files, B=64, queue depth 256:
/// 4 slots 5.1 GB/s, 6 slots 5.9, 8 slots 6.2–6.6 (bench/RESULTS.md).
pub fn auto_slots_per_rank(batch_size: u32, queue_depth: u32, slot_bytes: u64) -> u32 {
    let want = (2 * u64::from(queue_depth)).div_ceil(u64::from(batch_size.max(1)));
    let mut k = want.clamp(u64::from(AUTO_SLOTS_MIN), u64::from(AUTO_SLOTS_MAX)) as u32;
    let fit = AUTO_RANK_BYTES_MAX / slot_bytes.max(1);
    if u64::from(k) > fit {
        k = fit.clamp(u64::from(AUTO_SLOTS_MIN), u64::from(k)) as u32;
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_slots_cover_twice_the_queue_depth_within_bounds() {
        let mb = 1_000_000;
        // 2·256/64 = 8 slots of 6.4 MB.
        assert_eq!(auto_slots_per_rank(64, 256, 64 * 100_000), 8);
        // Large batches: never fewer than 4.
        assert_eq!(auto_slots_per_rank(256, 256, 256 * 4096), 4);
        // Tiny batches: at most 16.
        assert_eq!(auto_slots_per_rank(1, 256, 4096), 16);
        // 2·256/48 = 10.67, rounded up.
        assert_eq!(auto_slots_per_rank(48, 256, mb), 11);
        // 64 MB slots: 8 would be 512 MB per rank; 4 is the floor.
        assert_eq!(auto_slots_per_rank(64, 256, 64 * mb), 4);
        // 40 MB slots: 6 fit in 256 MiB.
        assert_eq!(auto_slots_per_rank(32, 256, 40 * mb), 6);
        // Degenerate inputs do not panic.
        assert_eq!(auto_slots_per_rank(0, 1, 0), 4);
    }

    #[test]
    fn the_default_slots_shrink_to_fit_dev_shm_down_to_two() {
        let g = RingGeometry {
            world_size: 8,
            slots_per_rank: 8,
            max_samples_per_slot: 64,
            slot_payload_bytes: 1 << 20,
        };
        let size = |k| {
            Layout::compute(RingGeometry {
                slots_per_rank: k,
                ..g
            })
            .unwrap()
            .segment_bytes
        };
        assert_eq!(fit_auto_slots(g, None), 8, "unknown or unlimited /dev/shm");
        assert_eq!(fit_auto_slots(g, Some(size(8))), 8);
        assert_eq!(fit_auto_slots(g, Some(size(8) - 1)), 7);
        assert_eq!(fit_auto_slots(g, Some(size(3) + 100)), 3);
        // Not even 2 fit: keep the default and let create say how much is needed.
        assert_eq!(fit_auto_slots(g, Some(size(2) - 1)), 8);
    }
}
