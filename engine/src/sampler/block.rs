//! The block order (`serve --shuffle block`): a shard-aware shuffle.
//!
//! Samples are cut into blocks of `B` consecutive manifest indices (the last
//! block is short when `B` does not divide `n`); the blocks are permuted;
//! the permuted blocks are grouped into windows of `W` blocks (the last
//! window may hold fewer); and the samples of each window are permuted among
//! themselves. Any `W·B` consecutive positions of the order then read from
//! at most `2·W` blocks, so a tar shard is read in a few long runs instead of
//! one small read per sample, while every epoch still visits every sample
//! exactly once in an order that depends on `(seed, epoch, n, B, W)` only.
//!
//! The windows do not overlap (a "tumbling" window, not a sliding shuffle
//! buffer): that keeps `at(position)` a pure function of the position, O(1)
//! expected time and memory, which is what resuming at any step with any
//! world size needs. docs/sampler.md, section 4, is the contract.

use thiserror::Error;

use super::feistel::{mix64, Feistel, GAMMA};

/// Largest block, in samples (2^24): a block is meant to be a stretch of a
/// shard, and a window of blocks must stay far inside u64 positions.
pub const MAX_BLOCK_SAMPLES: u32 = 1 << 24;

/// Largest window, in blocks (2^16).
pub const MAX_WINDOW_BLOCKS: u32 = 1 << 16;

/// Mixed into the seed of the block permutation ("BLOCKS" in ASCII).
const TAG_BLOCKS: u64 = 0x424C_4F43_4B53;

/// Mixed into the seed of each window's permutation ("WINDOW" in ASCII).
const TAG_WINDOW: u64 = 0x5749_4E44_4F57;

/// The shape of a block order: `B` samples a block, `W` blocks a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockShape {
    block_samples: u32,
    window_blocks: u32,
}

/// Why a block shape was refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BlockShapeError {
    /// `--shuffle-block` out of range.
    #[error("--shuffle-block {0} is outside 1..={MAX_BLOCK_SAMPLES} samples; pass a block of about the samples of a shard's stretch (default 256)")]
    Block(u32),
    /// `--shuffle-window` out of range.
    #[error("--shuffle-window {0} is outside 1..={MAX_WINDOW_BLOCKS} blocks; pass a window of a few blocks (default 8)")]
    Window(u32),
}

impl BlockShape {
    /// Default `--shuffle-block`.
    pub const DEFAULT_BLOCK_SAMPLES: u32 = 256;
    /// Default `--shuffle-window`.
    pub const DEFAULT_WINDOW_BLOCKS: u32 = 8;

    /// Blocks of `block_samples` samples in windows of `window_blocks`.
    pub fn new(block_samples: u32, window_blocks: u32) -> Result<BlockShape, BlockShapeError> {
        if !(1..=MAX_BLOCK_SAMPLES).contains(&block_samples) {
            return Err(BlockShapeError::Block(block_samples));
        }
        if !(1..=MAX_WINDOW_BLOCKS).contains(&window_blocks) {
            return Err(BlockShapeError::Window(window_blocks));
        }
        Ok(BlockShape {
            block_samples,
            window_blocks,
        })
    }

    /// `B`: samples in a block (the last block of a dataset may hold fewer).
    pub fn block_samples(self) -> u32 {
        self.block_samples
    }

    /// `W`: blocks in a window (the last window may hold fewer).
    pub fn window_blocks(self) -> u32 {
        self.window_blocks
    }
}

/// The block order of one epoch (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct BlockOrder {
    /// `B`.
    block: u64,
    /// `W`.
    window: u64,
    /// `W·B`: samples in a window of whole blocks.
    window_samples: u64,
    /// Samples in the last block, 1..=B.
    short: u64,
    /// Slot (position in the block order) of the last, maybe short, block.
    short_slot: u64,
    /// Blocks in the dataset.
    blocks: u64,
    /// The permutation of the blocks.
    block_order: Feistel,
    /// Seed of the block permutation; each window's seed derives from it.
    block_seed: u64,
    epoch: u64,
}

impl BlockOrder {
    /// The block order of epoch `epoch` of `n >= 1` samples under `seed`.
    pub(super) fn new(shape: BlockShape, seed: u64, epoch: u64, n: u64) -> BlockOrder {
        let block = u64::from(shape.block_samples);
        let window = u64::from(shape.window_blocks);
        let blocks = n.div_ceil(block).max(1);
        let block_seed = mix64(seed ^ TAG_BLOCKS);
        let block_order = Feistel::new(block_seed, epoch, blocks);
        // n == 0 has no position to serve; keep the fields sane anyway.
        let short = n.saturating_sub((blocks - 1) * block).max(1);
        BlockOrder {
            block,
            window,
            // Both bounded (2^24 · 2^16 = 2^40): no overflow.
            window_samples: block * window,
            short,
            short_slot: block_order.position_of(blocks - 1),
            blocks,
            block_order,
            block_seed,
            epoch,
        }
    }

    /// Samples the blocks of window `w` hold.
    fn window_len(&self, w: u64) -> u64 {
        let first = w * self.window;
        let slots = self.window.min(self.blocks - first);
        let missing = if self.short_slot / self.window == w {
            self.block - self.short
        } else {
            0
        };
        slots * self.block - missing
    }

    /// The sample at `position` (< n).
    pub(super) fn at(&self, position: u64) -> u64 {
        // 1. The window holding `position`: windows before the one with the
        //    short block hold W·B samples each, that one B - short fewer.
        let short_window = self.short_slot / self.window;
        let short_start = short_window * self.window_samples;
        let short_len = self.window_len(short_window);
        let (w, offset) = if position < short_start {
            (
                position / self.window_samples,
                position % self.window_samples,
            )
        } else if position < short_start + short_len {
            (short_window, position - short_start)
        } else {
            let after = position - short_start - short_len;
            (
                short_window + 1 + after / self.window_samples,
                after % self.window_samples,
            )
        };
        // 2. The window's own permutation of its samples.
        let window_seed = mix64(self.block_seed ^ TAG_WINDOW ^ mix64(w.wrapping_add(GAMMA)));
        let shuffled = Feistel::new(window_seed, self.epoch, self.window_len(w)).at(offset);
        // 3. Which slot of the window, and where in its block: every slot
        //    holds B samples but the short block's.
        let first_slot = w * self.window;
        let (slot, within) = if w != short_window {
            (first_slot + shuffled / self.block, shuffled % self.block)
        } else {
            let short_at = (self.short_slot - first_slot) * self.block;
            if shuffled < short_at {
                (first_slot + shuffled / self.block, shuffled % self.block)
            } else if shuffled < short_at + self.short {
                (self.short_slot, shuffled - short_at)
            } else {
                let after = shuffled - short_at - self.short;
                (self.short_slot + 1 + after / self.block, after % self.block)
            }
        };
        // 4. The block in that slot, and the sample in it.
        self.block_order.at(slot) * self.block + within
    }
}

#[cfg(test)]
mod tests {
    use super::super::{EpochOrder, SampleOrder};
    use super::*;

    fn order(n: u64, block: u32, window: u32) -> EpochOrder {
        let shape = BlockShape::new(block, window).unwrap();
        EpochOrder::of(SampleOrder::Block(shape), 9, 2, n)
    }

    #[test]
    fn block_orders_of_every_small_shape_are_permutations() {
        for n in 1..=70u64 {
            for block in [1, 2, 3, 7, 16, 100] {
                for window in [1, 2, 3, 5] {
                    let order = order(n, block, window);
                    let mut seen = vec![false; n as usize];
                    for p in 0..n {
                        let i = order.at(p) as usize;
                        assert!(!seen[i], "n={n} B={block} W={window}: {i} twice");
                        seen[i] = true;
                    }
                }
            }
        }
    }

    #[test]
    fn the_block_permutations_inverse_finds_every_position() {
        let feistel = Feistel::new(5, 1, 1000);
        for p in 0..1000 {
            assert_eq!(feistel.position_of(feistel.at(p)), p);
        }
    }

    #[test]
    fn shapes_outside_the_limits_are_refused_with_the_flag() {
        let e = BlockShape::new(0, 8).unwrap_err().to_string();
        assert!(e.contains("--shuffle-block 0"), "{e}");
        let e = BlockShape::new(256, MAX_WINDOW_BLOCKS + 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--shuffle-window"), "{e}");
    }
}
