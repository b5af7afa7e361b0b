//! A validated mapping of a segment: typed access to its blocks.

use memmap2::MmapRaw;

use crate::layout::{Header, Layout, RankBlock, SampleEntryCell, SlotMeta};

/// A mapping whose size and layout were checked against each other, so every
/// accessor below stays inside it for any in-range rank, slot and entry.
pub(crate) struct View {
    map: MmapRaw,
    layout: Layout,
}

impl View {
    /// Wraps a mapping. The caller has checked `map.len() >= layout.segment_bytes`.
    pub(crate) fn new(map: MmapRaw, layout: Layout) -> View {
        assert!(
            map.len() as u64 >= layout.segment_bytes,
            "mapping smaller than its layout"
        );
        View { map, layout }
    }

    pub(crate) fn layout(&self) -> &Layout {
        &self.layout
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// # Safety
    /// `offset + size_of::<T>() <= segment_bytes`, `offset` aligned for T.
    unsafe fn at<T>(&self, offset: u64) -> &T {
        debug_assert!(offset + std::mem::size_of::<T>() as u64 <= self.layout.segment_bytes);
        // SAFETY: the caller keeps the range inside the mapping, which lives
        // as long as `self`; every T here is made only of atomics, valid for
        // any bit pattern and safe to share between processes.
        unsafe { &*(self.base().add(offset as usize) as *const T) }
    }

    pub(crate) fn header(&self) -> &Header {
        // SAFETY: the segment is at least HEADER_BYTES (checked at attach/create).
        unsafe { self.at(0) }
    }

    pub(crate) fn rank(&self, rank: u32) -> &RankBlock {
        assert!(rank < self.layout.geometry.world_size);
        // SAFETY: rank < W, and the rank table lies inside the layout.
        unsafe { self.at(self.layout.rank_offset(rank)) }
    }

    pub(crate) fn slot(&self, slot: u32) -> &SlotMeta {
        assert!(slot < self.layout.slot_count());
        // SAFETY: slot < W·K, and the slot table lies inside the layout.
        unsafe { self.at(self.layout.slot_meta_offset(slot)) }
    }

    pub(crate) fn sample_cell(&self, slot: u32, i: u32) -> &SampleEntryCell {
        assert!(slot < self.layout.slot_count() && i < self.layout.geometry.max_samples_per_slot);
        let offset = self.layout.slot_meta_offset(slot) + 128 + u64::from(i) * 24;
        // SAFETY: i < M, so the entry lies inside the slot's metadata stride.
        unsafe { self.at(offset) }
    }

    pub(crate) fn payload(&self, slot: u32) -> *mut u8 {
        assert!(slot < self.layout.slot_count());
        // SAFETY: the payload region of slot < W·K lies inside the mapping.
        unsafe {
            self.base()
                .add(self.layout.payload_offset_of(slot) as usize)
        }
    }

    /// The rank's K slots, in order.
    pub(crate) fn rank_slots(&self, rank: u32) -> Vec<&SlotMeta> {
        let k = self.layout.geometry.slots_per_rank;
        (0..k).map(|i| self.slot(rank * k + i)).collect()
    }
}
