//! The block order (`serve --shuffle block`): a shard-aware shuffle.
//!
//! Samples are cut into blocks of `B` consecutive manifest indices; the
//! whole blocks are permuted, and a short last block (when `B` does not
//! divide `n`) follows them; the blocks in that order are grouped into
//! windows of `W` blocks (the last window may hold fewer); and the samples
//! of each window are permuted among themselves. Every window but the last
//! holds exactly `W·B` samples, so windows start at multiples of `W·B`. Any `W·B` consecutive positions of the order then read from
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
    #[error("--shuffle-block {0} is outside 1..={MAX_BLOCK_SAMPLES} samples; pass a block of about the samples of a shard's stretch (default 64)")]
    Block(u32),
    /// `--shuffle-window` out of range.
    #[error("--shuffle-window {0} is outside 1..={MAX_WINDOW_BLOCKS} blocks; pass a window of a few blocks (default 4)")]
    Window(u32),
}

impl BlockShape {
    /// Default `--shuffle-block`.
    pub const DEFAULT_BLOCK_SAMPLES: u32 = 64;
    /// Default `--shuffle-window`.
    pub const DEFAULT_WINDOW_BLOCKS: u32 = 4;

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
    /// Samples in all.
    n: u64,
    /// Whole blocks (`floor(n / B)`); a short block, if any, follows them.
    full_blocks: u64,
    /// The permutation of the whole blocks.
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
        let full_blocks = n / block;
        let block_seed = mix64(seed ^ TAG_BLOCKS);
        BlockOrder {
            block,
            window,
            // Both bounded (2^24 · 2^16 = 2^40): no overflow.
            window_samples: block * window,
            n,
            full_blocks,
            block_order: Feistel::new(block_seed, epoch, full_blocks.max(1)),
            block_seed,
            epoch,
        }
    }

    /// The sample at `position` (< n).
    pub(super) fn at(&self, position: u64) -> u64 {
        // Every window holds W·B samples but the last, which holds the rest
        // (the short block, if any, is the last slot of the last window).
        let w = position / self.window_samples;
        let first = w * self.window_samples;
        let len = self.window_samples.min(self.n - first);
        let window_seed = mix64(self.block_seed ^ TAG_WINDOW ^ mix64(w.wrapping_add(GAMMA)));
        let shuffled = Feistel::new(window_seed, self.epoch, len).at(position - first);
        let slot = w * self.window + shuffled / self.block;
        let within = shuffled % self.block;
        let block = if slot < self.full_blocks {
            self.block_order.at(slot)
        } else {
            slot // the short block keeps its place, after the whole ones
        };
        block * self.block + within
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
    fn shapes_outside_the_limits_are_refused_with_the_flag() {
        let e = BlockShape::new(0, 8).unwrap_err().to_string();
        assert!(e.contains("--shuffle-block 0"), "{e}");
        let e = BlockShape::new(256, MAX_WINDOW_BLOCKS + 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--shuffle-window"), "{e}");
    }
}
