//! Megatron-Core's indexed dataset: `PREFIX.bin` (tokens) and `PREFIX.idx`,
//! as `megatron/core/datasets/indexed_dataset.py` writes it (little-endian):
//!
//! ```text
//! 0   9 bytes   b"MMIDIDX\x00\x00"
//! 9   u64       version, 1
//! 17  u8        dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
//!               6 float64, 7 float32, 8 uint16
//! 18  u64       S, sequences
//! 26  u64       D, document indices
//! 34  i32 × S   sequence lengths, in tokens
//!     i64 × S   sequence pointers: byte offset of each sequence in the .bin
//!     i64 × D   document indices: the sequence each document starts at,
//!               [0, e1, e2, ..., S] (a document ends where the next starts)
//!     (i8 × S   sequence modes, multimodal only: not read)
//! ```
//!
//! The index is mapped, never copied: a window's documents are found by a
//! binary search over `pointers[doc_idx[j]]`. The pointers must be the
//! sequences end to end from byte 0 (what the writer makes), which a scan at
//! start checks, with the lengths, the document indices and the `.bin`'s
//! size.

use std::sync::Arc;

use super::access::{Access, Object};
use super::column::{Backing, Column};
use super::corpus::Part;
use super::docs::DocList;
use super::dtype::TokenDtype;
use super::TokenError;

/// The header's first bytes.
pub const MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";
/// Bytes before the lengths.
pub const HEADER_BYTES: u64 = 34;
/// The suffix of an index.
pub const IDX: &[u8] = b".idx";
/// The suffix of its tokens.
pub const BIN: &[u8] = b".bin";

/// One `.idx` read and checked.
#[derive(Debug)]
pub struct MegatronIndex {
    /// The tokens' dtype.
    pub dtype: TokenDtype,
    /// Sequences.
    pub sequences: u64,
    /// Tokens in all.
    pub tokens: u64,
    /// The documents.
    pub docs: DocList,
}

/// The (`.bin`, `.idx`) pairs among `keys` (sorted), as indices into it,
/// in key order; and the `.bin`s without an index, for a warning.
pub fn pairs(keys: &[&[u8]]) -> (Vec<(usize, usize)>, Vec<usize>) {
    let mut pairs = Vec::new();
    let mut lone = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let Some(stem) = key.strip_suffix(BIN) else {
            continue;
        };
        let mut idx = stem.to_vec();
        idx.extend_from_slice(IDX);
        match keys.binary_search(&idx.as_slice()) {
            Ok(j) => pairs.push((i, j)),
            Err(_) => lone.push(i),
        }
    }
    (pairs, lone)
}

/// Reads and checks the index `bytes` (of `name`), for a `.bin` of
/// `bin_bytes` bytes.
pub fn parse(backing: Arc<Backing>, bin_bytes: u64) -> Result<MegatronIndex, String> {
    let b = backing.bytes();
    if b.len() < HEADER_BYTES as usize || &b[..9] != MAGIC {
        return Err("it does not start with MMIDIDX: not a Megatron index".into());
    }
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
    let version = u64_at(9);
    if version != 1 {
        return Err(format!("index version {version}: only version 1 is known"));
    }
    let code = b[17];
    let dtype = TokenDtype::from_megatron_code(code).ok_or_else(|| match code {
        6 | 7 => format!(
            "dtype code {code} is a float ({}), not token ids",
            if code == 6 { "float64" } else { "float32" }
        ),
        _ => format!("dtype code {code} is not one of Megatron's (1 to 8)"),
    })?;
    let (sequences, doc_entries) = (u64_at(18), u64_at(26));
    let outside = |e: super::column::ColumnOutside| format!("it is truncated: {e}");
    let lengths = Column::new(Arc::clone(&backing), HEADER_BYTES, sequences, 4).map_err(outside)?;
    let pointers_at = HEADER_BYTES + 4 * sequences;
    let pointers = Column::new(Arc::clone(&backing), pointers_at, sequences, 8).map_err(outside)?;
    let doc_idx =
        Column::new(backing, pointers_at + 8 * sequences, doc_entries, 8).map_err(outside)?;
    let item = dtype.item_bytes();
    let mut tokens = 0u64;
    for i in 0..sequences {
        let len = lengths.get_i32(i);
        if len < 0 {
            return Err(format!("sequence {i} has length {len}"));
        }
        let at = tokens * item;
        if pointers.get(i) != at {
            return Err(format!(
                "sequence {i} starts at byte {} of the .bin, not at {at} where the one before ends: \
                 only indexes whose sequences lie end to end (as IndexedDatasetBuilder writes them) are read",
                pointers.get(i) as i64
            ));
        }
        tokens += len as u64;
    }
    let mut previous = 0u64;
    for j in 0..doc_entries {
        let d = doc_idx.get(j);
        if (j == 0 && d != 0) || d < previous || d > sequences {
            return Err(format!(
                "document index {j} is {}: document indices must rise from 0 to at most the {sequences} sequences",
                d as i64
            ));
        }
        previous = d;
    }
    if tokens.checked_mul(item).is_none_or(|b| b > bin_bytes) {
        return Err(format!(
            "it describes {tokens} tokens of {item} bytes, more than the .bin's {bin_bytes} bytes: the .bin is truncated, or is not this index's"
        ));
    }
    if tokens * item < bin_bytes {
        tracing::warn!(
            "a Megatron .bin holds {} bytes past the {tokens} tokens its index describes; they are not served",
            bin_bytes - tokens * item
        );
    }
    // Documents: the entries below the sequence count (the last entry, S,
    // only ends the last one).
    let docs = doc_idx.lower_bound(sequences, 0, doc_entries);
    Ok(MegatronIndex {
        dtype,
        sequences,
        tokens,
        docs: DocList::Megatron {
            pointers,
            doc_idx,
            docs,
            item_bytes: item,
        },
    })
}

/// The parts of the Megatron pairs among `objects` (sorted keys): one per
/// `.bin`, its documents from its `.idx` (fetched into `keep` when remote).
/// Returns the parts, the `.bin` objects (the data the readers read), and
/// the dtype.
pub fn parts(
    access: &Access,
    objects: &[Object],
    keep: Option<&std::path::Path>,
) -> Result<(Vec<Part>, Vec<Object>, TokenDtype), TokenError> {
    let keys: Vec<&[u8]> = objects.iter().map(|o| o.key.as_slice()).collect();
    let (pairs, lone) = pairs(&keys);
    for i in lone {
        tracing::warn!(
            "{} has no .idx beside it: not served (a Megatron dataset is PREFIX.bin with PREFIX.idx)",
            access.name(&objects[i].key)
        );
    }
    if pairs.is_empty() {
        return Err(TokenError::Format(format!(
            "{} holds no Megatron PREFIX.bin with its PREFIX.idx",
            access.source_name()
        )));
    }
    let mut parts = Vec::with_capacity(pairs.len());
    let mut data = Vec::with_capacity(pairs.len());
    let mut dtype: Option<TokenDtype> = None;
    for (bin, idx) in pairs {
        let (bin, idx) = (&objects[bin], &objects[idx]);
        let backing = access.whole(idx, keep)?;
        let index = parse(backing, bin.size_bytes).map_err(|problem| TokenError::Index {
            name: access.name(&idx.key),
            problem,
        })?;
        match dtype {
            Some(d) if d != index.dtype => {
                return Err(TokenError::Index {
                    name: access.name(&idx.key),
                    problem: format!(
                        "its tokens are {}, those before it {d}: one corpus holds one dtype",
                        index.dtype
                    ),
                })
            }
            _ => dtype = Some(index.dtype),
        }
        tracing::debug!(
            "{}: {} sequences, {} tokens",
            access.name(&idx.key),
            index.sequences,
            index.tokens
        );
        parts.push(Part {
            object: data.len() as u32,
            offset_bytes: 0,
            tokens: index.tokens,
            docs: index.docs,
            doc_offsets: None,
        });
        data.push(bin.clone());
    }
    // At least one pair was read, so dtype is set.
    let dtype = dtype.unwrap_or(TokenDtype::U16);
    Ok((parts, data, dtype))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An index as IndexedDatasetBuilder writes it.
    fn index(code: u8, lengths: &[i32], doc_idx: &[i64], item: i64) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&1u64.to_le_bytes());
        b.push(code);
        b.extend_from_slice(&(lengths.len() as u64).to_le_bytes());
        b.extend_from_slice(&(doc_idx.len() as u64).to_le_bytes());
        for l in lengths {
            b.extend_from_slice(&l.to_le_bytes());
        }
        let mut at = 0i64;
        for l in lengths {
            b.extend_from_slice(&at.to_le_bytes());
            at += i64::from(*l) * item;
        }
        for d in doc_idx {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b
    }

    #[test]
    fn an_index_of_the_writer_is_read_and_its_documents_found() {
        let bytes = index(8, &[3, 0, 5, 2], &[0, 1, 2, 3, 4], 2);
        let idx = parse(Arc::new(Backing::Owned(bytes)), 20).unwrap();
        assert_eq!(
            (idx.dtype, idx.tokens, idx.docs.len()),
            (TokenDtype::U16, 10, 4)
        );
        let starts: Vec<u64> = (0..4).map(|j| idx.docs.start(j)).collect();
        assert_eq!(starts, [0, 3, 3, 8]);
    }

    #[test]
    fn a_bad_index_is_refused_saying_why() {
        let cases: Vec<(Vec<u8>, u64, &str)> = vec![
            (b"MMIDIDY\0\0".to_vec(), 0, "MMIDIDX"),
            (index(7, &[1], &[0, 1], 4), 4, "float"),
            (index(9, &[1], &[0, 1], 4), 4, "1 to 8"),
            (index(8, &[3, 2], &[0, 2], 2), 8, "more than the .bin"),
            (index(8, &[3, -1], &[0, 2], 2), 8, "length -1"),
            (index(8, &[3, 2], &[0, 3], 2), 10, "document index 1"),
            (index(8, &[3, 2], &[1, 2], 2), 10, "document index 0"),
        ];
        for (bytes, bin, says) in cases {
            let e = parse(Arc::new(Backing::Owned(bytes)), bin).unwrap_err();
            assert!(e.contains(says), "{e} should say {says}");
        }
        let mut gap = index(8, &[3, 2], &[0, 1, 2], 2);
        // The second pointer (at 34 + 8 + 8) moved past a gap.
        gap[50..58].copy_from_slice(&8i64.to_le_bytes());
        let e = parse(Arc::new(Backing::Owned(gap)), 100).unwrap_err();
        assert!(e.contains("end to end"), "{e}");
        let mut short = index(8, &[3, 2], &[0, 1, 2], 2);
        short.truncate(60);
        let e = parse(Arc::new(Backing::Owned(short)), 10).unwrap_err();
        assert!(e.contains("truncated"), "{e}");
    }
}
