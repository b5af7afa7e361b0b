//! Where a part's documents start, in the part's own tokens, read in place
//! from the format's index (docs/tokens.md, "Formats").

use super::column::Column;

/// The documents of one part (a file, a chunk, a shard) of a corpus: how
/// many, and where each starts in the part's tokens. Starts ascend; the
/// first is 0; a document ends where the next starts (or the part ends).
#[derive(Clone, Debug)]
pub enum DocList {
    /// The whole part is one document (a flat token file).
    Single,
    /// `starts[j]` is document j's first token (LitData items, MDS samples:
    /// made when the chunk or shard headers were read).
    Starts(Column),
    /// datatrove's `.ds.index`: `ends[j]` is document j's end, so document
    /// j starts at 0 (j = 0) or `ends[j - 1]`.
    Ends(Column),
    /// Megatron's `.idx`: document j starts at the sequence
    /// `doc_idx[j]`, whose first byte is `pointers[doc_idx[j]]`; `docs`
    /// of the `doc_idx` entries start one (those below the sequence count).
    Megatron {
        /// Byte offset of each sequence in the `.bin`.
        pointers: Column,
        /// The sequence each document starts at (`document_indices`).
        doc_idx: Column,
        /// Documents: the `doc_idx` entries below the sequence count.
        docs: u64,
        /// Bytes of a token.
        item_bytes: u64,
    },
}

impl DocList {
    /// Documents in the part (at least 1: a part with no tokens has one
    /// empty document).
    pub fn len(&self) -> u64 {
        match self {
            DocList::Single => 1,
            DocList::Starts(c) | DocList::Ends(c) => c.len().max(1),
            DocList::Megatron { docs, .. } => (*docs).max(1),
        }
    }

    /// Never empty (see `len`).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Where document `j` starts, in the part's tokens.
    #[inline]
    pub fn start(&self, j: u64) -> u64 {
        match self {
            DocList::Single => 0,
            DocList::Starts(c) => {
                if c.is_empty() {
                    0
                } else {
                    c.get(j)
                }
            }
            DocList::Ends(c) => {
                if j == 0 {
                    0
                } else {
                    c.get(j - 1)
                }
            }
            DocList::Megatron {
                pointers,
                doc_idx,
                docs,
                item_bytes,
            } => {
                if *docs == 0 {
                    0
                } else {
                    pointers.get(doc_idx.get(j)) / item_bytes
                }
            }
        }
    }

    /// The last document whose start is at most `t` (a token of the part).
    pub fn doc_at(&self, t: u64) -> u64 {
        // The first document starting past t, less one; start(0) = 0 <= t.
        let (mut lo, mut hi) = (0u64, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.start(mid) <= t {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.saturating_sub(1)
    }

    /// The first document whose start is at least `t`.
    pub fn first_at_or_after(&self, t: u64) -> u64 {
        let (mut lo, mut hi) = (0u64, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.start(mid) < t {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }
}
