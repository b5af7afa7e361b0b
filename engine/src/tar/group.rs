//! Members into samples (TAR-INDEX.md): a sample is a maximal run of
//! consecutive members with the same key; its bytes run from its first
//! member's first header block to the end of its last member's data,
//! padded to the next 512-byte block (or the shard's end, where a shard
//! stops inside that padding). With the padding, samples that follow each
//! other in a shard are byte-adjacent: the planner merges a batch of
//! neighbours (`--shuffle block`) into one ranged read, where gaps of up to
//! 511 bytes between them would have split it into one read each.

use super::index::{TarIndex, TAR_BLOCK_BYTES};
use super::name::split_key;
use super::scan::{Fault, ScanError};

/// One sample of a shard: where its bytes are, and how many members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleRange {
    /// Offset of its first member's first header block.
    pub offset_bytes: u64,
    /// Bytes up to the end of its last member's data, padding included.
    pub len_bytes: u64,
    /// Members (fields) it holds.
    pub members: u32,
}

/// Past this many fields a sample's extensions are checked by sorting
/// them; below it, by comparing each with those before it.
const FIELDS_COMPARED_MAX: usize = 32;

/// Groups a shard's members into samples, calling `sample` for each in
/// order. Two members of one sample with the same extension are an error
/// at the second one's header.
pub fn group(index: &TarIndex, mut sample: impl FnMut(SampleRange)) -> Result<(), ScanError> {
    let members = &index.members;
    let mut start = 0;
    while start < members.len() {
        let (key, _) = split_key(&members[start].name);
        let mut end = start + 1;
        while end < members.len() && split_key(&members[end].name).0 == key {
            end += 1;
        }
        let run = &members[start..end];
        if has_duplicate_ext(run) {
            // The first repeat in tar order, for the message.
            for (i, m) in run.iter().enumerate() {
                let ext = split_key(&m.name).1;
                if run[..i].iter().any(|o| split_key(&o.name).1 == ext) {
                    return Err(ScanError {
                        offset: m.header_offset,
                        fault: Fault::DuplicateExt {
                            name: String::from_utf8_lossy(&m.name).into_owned(),
                            key: String::from_utf8_lossy(key).into_owned(),
                            ext: String::from_utf8_lossy(ext).into_owned(),
                        },
                    });
                }
            }
        }
        let offset_bytes = run[0].header_offset;
        // The index checked data_end >= header_offset for each member and
        // the members increase.
        let data_end = run[run.len() - 1].data_end();
        let padded_end = data_end
            .div_ceil(TAR_BLOCK_BYTES)
            .saturating_mul(TAR_BLOCK_BYTES)
            .min(index.shard_bytes)
            .max(data_end);
        let len_bytes = padded_end - offset_bytes;
        sample(SampleRange {
            offset_bytes,
            len_bytes,
            members: run.len() as u32,
        });
        start = end;
    }
    Ok(())
}

fn has_duplicate_ext(run: &[super::index::TarMember]) -> bool {
    if run.len() <= FIELDS_COMPARED_MAX {
        return run.iter().enumerate().any(|(i, m)| {
            run[..i]
                .iter()
                .any(|o| split_key(&o.name).1 == split_key(&m.name).1)
        });
    }
    let mut exts: Vec<&[u8]> = run.iter().map(|m| split_key(&m.name).1).collect();
    exts.sort_unstable();
    exts.windows(2).any(|w| w[0] == w[1])
}
