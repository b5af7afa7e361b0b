//! The chunk layer's shape for a run under the block order: one chunk per
//! block of samples (`reader::chunked`).

use crate::manifest::Manifest;
use crate::ring::segment::human_bytes;

/// Windows of blocks the loader reads ahead under the block order with
/// chunks: its slots are its lookahead, and one window's chunks are a few
/// GETs, so a lookahead of the default 8 slots (2 windows of 64-sample
/// batches) kept only a few GETs in flight. Measured on the 20 ms path,
/// 4 KiB samples in shards, batch 64: 8 slots 18k samples/s, 64 slots 91k,
/// 256 slots 85-95k (bench/RESULTS-shards.md) while the chunk layer took
/// only 8 small reads per inner slot (2,048 reads: 32 batches in flight
/// whatever the slots); with that cap raised (`reader::chunked`), 64 slots
/// 85k, 128 slots 136-185k, 256 slots 150-240k (issue 29). The loader's
/// memory beside the ring grows with the GETs in flight (their chunk and
/// receive buffers): measured peak less the ring, 20,000 × 4 KiB, 64
/// slots ~83 MB, 128 slots ~131 MB, 256 slots ~148-260 MB. 32 windows
/// (128 slots of 64 samples at the default block of 64 and window of 4)
/// keeps it within the ring + 128 MiB the loader promises; more, with
/// `--slots-per-rank`, buys up to ~1.4x for the memory.
pub(super) const LOOKAHEAD_WINDOWS: u64 = 32;

/// The slots per rank a chunked block-order run wants for its lookahead
/// (see `LOOKAHEAD_WINDOWS`), within `AUTO_RANK_BYTES_MAX` of slots per
/// rank; None when the run is not chunked.
pub(super) fn lookahead_slots(
    manifest: &Manifest,
    order: crate::sampler::SampleOrder,
    batch_size: u32,
    slot_bytes: u64,
) -> Option<u32> {
    let shape = order.block_shape()?;
    if !chunkable(manifest) {
        return None;
    }
    let window = u64::from(shape.block_samples()) * u64::from(shape.window_blocks());
    let want = (LOOKAHEAD_WINDOWS * window).div_ceil(u64::from(batch_size.max(1)));
    let fit = super::slots::AUTO_RANK_BYTES_MAX / slot_bytes.max(1);
    let most = u64::from(crate::ring::layout::MAX_SLOTS_PER_RANK);
    Some(want.min(fit).min(most) as u32)
}

/// Whether a manifest's samples are small ranges of larger objects.
fn chunkable(manifest: &Manifest) -> bool {
    (manifest.sample_ranges().is_some() || manifest.record_bytes().is_some())
        && !manifest.is_empty()
        && manifest.total_bytes() / manifest.len() <= CHUNKED_SAMPLE_BYTES_MAX
}

/// Mean sample size past which the block order's reads are not chunked:
/// such samples are worth a GET each, and a block of them is many MiB.
const CHUNKED_SAMPLE_BYTES_MAX: u64 = 256 << 10;
/// Fewest and most bytes the chunk layer keeps (4 windows of blocks).
pub(super) const CHUNK_BUDGET_BYTES_MIN: u64 = 16 << 20;
pub(super) const CHUNK_BUDGET_BYTES_MAX: u64 = 256 << 20;

/// The chunk layer for a remote run under the block order whose samples
/// are small ranges of larger objects (tar shards, records): one chunk per
/// block (and per object a block runs into), so the samples of a window of
/// blocks cost one ranged GET per block instead of one each. None for any
/// other run.
pub(super) fn block_chunks(
    manifest: &Manifest,
    order: crate::sampler::SampleOrder,
) -> Option<crate::reader::chunked::ChunkConfig> {
    use crate::reader::chunked::{ChunkConfig, ChunkGeometry, CHUNK_BYTES_MAX};
    let shape = order.block_shape()?;
    if !chunkable(manifest) {
        return None;
    }
    let block = u64::from(shape.block_samples());
    let mut starts: Vec<(u32, u64)> = Vec::new();
    let mut longest = 0u64;
    let mut previous: Option<(u32, u64)> = None;
    for i in 0..manifest.len() {
        let loc = manifest.sample(i);
        let here = (loc.file, loc.offset_bytes);
        if i % block == 0 || previous.is_none_or(|(file, _)| file != loc.file) {
            starts.push(here);
        }
        if let Some(&(file, start)) = starts.last() {
            if file == loc.file {
                longest = longest.max(loc.offset_bytes + loc.len_bytes - start);
            }
        }
        previous = Some(here);
    }
    let budget = (4 * u64::from(shape.window_blocks()) * longest.min(CHUNK_BYTES_MAX))
        .clamp(CHUNK_BUDGET_BYTES_MIN, CHUNK_BUDGET_BYTES_MAX);
    tracing::info!(
        "block order over ranges of objects: each block of {block} samples is one ranged GET ({} chunks, the longest {}, up to {} kept)",
        starts.len(),
        human_bytes(longest),
        human_bytes(budget)
    );
    Some(ChunkConfig {
        geometry: ChunkGeometry::Starts(starts.into()),
        small_read_max: CHUNK_BYTES_MAX,
        budget_bytes: budget,
    })
}
