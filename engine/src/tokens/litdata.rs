//! LitData's `optimize()` output written with `TokensLoader`: an
//! `index.json` listing chunk files in order, each
//!
//! ```text
//! u32           N, items (documents) in the chunk
//! u32 × (N+1)   offsets: item j is bytes offsets[j]..offsets[j+1] of the chunk
//! bytes         the items end to end: raw tokens ("no_header_tensor:K" or
//!               "no_header_numpy:K", K naming the dtype)
//! ```
//!
//! (litdata/streaming/writer.py, `_create_chunk`). A chunk's items are its
//! documents; its tokens run from `offsets[0]` to `offsets[N]`. The headers
//! are read at start (one ranged read per chunk), never the data.

use std::ops::Range;

use super::access::{Access, Object};
use super::column::Column;
use super::corpus::Part;
use super::docs::DocList;
use super::dtype::TokenDtype;
use super::TokenError;

/// The index's name, at the top of the source.
pub const INDEX_JSON: &[u8] = b"index.json";
/// Most bytes of an `index.json` read.
pub const INDEX_JSON_BYTES_MAX: u64 = 256 << 20;
/// Most items a chunk header may claim (a header of 256 MiB, read at start).
const ITEMS_MAX: u64 = 1 << 26;

/// The dtype of LitData's `data_format` entry (`no_header_tensor:20` is a
/// torch.uint16; `no_header_numpy:5` a numpy uint16).
pub fn dtype_of(format: &str) -> Option<TokenDtype> {
    let (kind, k) = format.split_once(':')?;
    let k: u32 = k.parse().ok()?;
    match kind {
        // litdata.constants._TORCH_DTYPES_MAPPING
        "no_header_tensor" => match k {
            11 => Some(TokenDtype::U8),
            12 => Some(TokenDtype::I8),
            13 | 14 => Some(TokenDtype::I16),
            15 | 16 => Some(TokenDtype::I32),
            17 | 18 => Some(TokenDtype::I64),
            20 => Some(TokenDtype::U16),
            _ => None,
        },
        // litdata.constants._NUMPY_SCTYPES
        "no_header_numpy" => match k {
            0 => Some(TokenDtype::I8),
            1 => Some(TokenDtype::I16),
            2 => Some(TokenDtype::I32),
            3 => Some(TokenDtype::I64),
            4 => Some(TokenDtype::U8),
            5 => Some(TokenDtype::U16),
            6 => Some(TokenDtype::U32),
            7 => Some(TokenDtype::U64),
            _ => None,
        },
        _ => None,
    }
}

/// One chunk as `index.json` lists it.
struct Chunk {
    object: usize,
    items: u64,
    dim: Option<u64>,
}

/// What `index.json` (`bytes`) says: the dtype and the chunks, found among
/// `objects` (sorted keys) by their file names.
fn read_index(
    bytes: &[u8],
    objects: &[Object],
    dtype_flag: Option<TokenDtype>,
) -> Result<(TokenDtype, Vec<Chunk>), String> {
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("it is not JSON: {e}"))?;
    let config = v.get("config").ok_or("it has no \"config\"")?;
    for field in ["compression", "encryption"] {
        match config.get(field) {
            None | Some(serde_json::Value::Null) => {}
            Some(other) => {
                return Err(format!(
                    "its chunks use {field} {other}: only uncompressed, unencrypted chunks are read; optimize() again without it"
                ))
            }
        }
    }
    let formats = config
        .get("data_format")
        .and_then(|f| f.as_array())
        .ok_or("its config has no data_format")?;
    let format = match formats.as_slice() {
        [one] => one.as_str().unwrap_or(""),
        _ => return Err(format!("its items hold {} fields; a token corpus is written by optimize() with item_loader=TokensLoader(), one tensor per item", formats.len())),
    };
    let dtype = dtype_of(format).ok_or_else(|| {
        format!("its data format {format:?} is not integer tokens written with TokensLoader (no_header_tensor or no_header_numpy of an integer dtype)")
    })?;
    if let Some(flag) = dtype_flag.filter(|&f| f != dtype) {
        return Err(format!("its tokens are {dtype}, not --token-dtype {flag}"));
    }
    let chunks = v
        .get("chunks")
        .and_then(|c| c.as_array())
        .ok_or("it lists no \"chunks\"")?;
    let mut out = Vec::with_capacity(chunks.len());
    for (i, c) in chunks.iter().enumerate() {
        let name = c
            .get("filename")
            .and_then(|f| f.as_str())
            .ok_or_else(|| format!("chunk {i} has no filename"))?;
        let items = c
            .get("chunk_size")
            .and_then(|n| n.as_u64())
            .filter(|&n| n <= ITEMS_MAX)
            .ok_or_else(|| {
                format!("chunk {i} ({name}) has no item count (chunk_size) up to {ITEMS_MAX}")
            })?;
        let object = objects
            .binary_search_by(|o| o.key.as_slice().cmp(name.as_bytes()))
            .map_err(|_| {
                format!("its chunk {name} is not in the source: copy it there, or optimize() again")
            })?;
        out.push(Chunk {
            object,
            items,
            dim: c.get("dim").and_then(|d| d.as_u64()),
        });
    }
    Ok((dtype, out))
}

/// The part of chunk `header` (its first `4 + 4(N+1)` bytes) of
/// `chunk_bytes` bytes.
fn chunk_part(
    header: &[u8],
    chunk: &Chunk,
    chunk_bytes: u64,
    item: u64,
    object: u32,
) -> Result<Part, String> {
    let u32_at = |o: usize| {
        u64::from(u32::from_le_bytes([
            header[o],
            header[o + 1],
            header[o + 2],
            header[o + 3],
        ]))
    };
    let n = chunk.items;
    if u32_at(0) != n {
        return Err(format!(
            "its header says {} items, index.json {n}",
            u32_at(0)
        ));
    }
    let offset = |j: u64| u32_at(4 + 4 * j as usize);
    let first = offset(0);
    if first != 4 + 4 * (n + 1) {
        return Err(format!(
            "its first item starts at byte {first}, not after its header ({})",
            4 + 4 * (n + 1)
        ));
    }
    let mut starts = Vec::with_capacity(n as usize);
    let mut previous = first;
    for j in 0..n {
        let (a, b) = (offset(j), offset(j + 1));
        if b < a || b > chunk_bytes || (a - first) % item != 0 || a != previous {
            return Err(format!("item {j} lies at bytes {a}..{b}, not a run of whole tokens inside its {chunk_bytes} bytes after the item before it"));
        }
        starts.push((a - first) / item);
        previous = b;
    }
    let tokens_bytes = offset(n) - first;
    if tokens_bytes % item != 0 {
        return Err(format!(
            "its items hold {tokens_bytes} bytes, not whole tokens of {item} bytes"
        ));
    }
    let tokens = tokens_bytes / item;
    if let Some(dim) = chunk.dim.filter(|&d| d != tokens) {
        return Err(format!(
            "its items hold {tokens} tokens, index.json says {dim}"
        ));
    }
    Ok(Part {
        object,
        offset_bytes: first,
        tokens,
        docs: DocList::Starts(Column::owned(&starts)),
        doc_offsets: None,
    })
}

/// The parts of a LitData token corpus among `objects` (sorted keys, with
/// `index.json` at the top): one per chunk, in `index.json`'s order.
/// Returns the parts, the chunk objects, and the dtype.
pub fn parts(
    access: &Access,
    objects: &[Object],
    dtype_flag: Option<TokenDtype>,
) -> Result<(Vec<Part>, Vec<Object>, TokenDtype), TokenError> {
    let index = objects
        .binary_search_by(|o| o.key.as_slice().cmp(INDEX_JSON))
        .map_err(|_| TokenError::Format(format!("{} has no index.json", access.source_name())))?;
    let index_obj = &objects[index];
    let bad_index = |problem: String| TokenError::Index {
        name: access.name(&index_obj.key),
        problem,
    };
    if index_obj.size_bytes > INDEX_JSON_BYTES_MAX {
        return Err(bad_index(format!(
            "it is {} bytes, more than an index.json can be",
            index_obj.size_bytes
        )));
    }
    let bytes = access.range(index_obj, 0..index_obj.size_bytes)?;
    let (dtype, chunks) = read_index(&bytes, objects, dtype_flag).map_err(bad_index)?;
    let reads: Vec<(usize, Range<u64>)> = chunks
        .iter()
        .map(|c| (c.object, 0..4 + 4 * (c.items + 1)))
        .collect();
    let headers = access.ranges(objects, &reads)?;
    let mut parts = Vec::with_capacity(chunks.len());
    let mut data = Vec::with_capacity(chunks.len());
    for (chunk, header) in chunks.iter().zip(&headers) {
        let obj = &objects[chunk.object];
        let part = chunk_part(
            header,
            chunk,
            obj.size_bytes,
            dtype.item_bytes(),
            data.len() as u32,
        )
        .map_err(|problem| TokenError::Index {
            name: access.name(&obj.key),
            problem,
        })?;
        parts.push(part);
        data.push(obj.clone());
    }
    Ok((parts, data, dtype))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_formats_name_their_dtypes() {
        assert_eq!(dtype_of("no_header_tensor:20"), Some(TokenDtype::U16));
        assert_eq!(dtype_of("no_header_tensor:16"), Some(TokenDtype::I32));
        assert_eq!(dtype_of("no_header_numpy:6"), Some(TokenDtype::U32));
        assert_eq!(dtype_of("no_header_tensor:0"), None, "float32");
        assert_eq!(dtype_of("tensor:20"), None);
    }

    #[test]
    fn a_chunk_header_gives_its_documents() {
        // Items of 3, 0 and 2 uint16 tokens.
        let n = 3u32;
        let first = 4 + 4 * (n + 1);
        let mut h = n.to_le_bytes().to_vec();
        for o in [first, first + 6, first + 6, first + 10] {
            h.extend_from_slice(&o.to_le_bytes());
        }
        let chunk = Chunk {
            object: 0,
            items: 3,
            dim: Some(5),
        };
        let part = chunk_part(&h, &chunk, u64::from(first) + 10, 2, 0).unwrap();
        assert_eq!((part.tokens, part.offset_bytes), (5, u64::from(first)));
        let starts: Vec<u64> = (0..3).map(|j| part.docs.start(j)).collect();
        assert_eq!(starts, [0, 3, 3]);
        let e = chunk_part(&h, &chunk, u64::from(first) + 8, 2, 0).unwrap_err();
        assert!(e.contains("inside"), "{e}");
    }
}
