//! datatrove's tokenized files, as its `TokenizedFile` writes them
//! (datatrove/pipeline/tokens/tokenizer.py): `NAME.ds` is the tokens end to
//! end (2 bytes each, or 4 for vocabularies past 65,536: datatrove's
//! `token_size`), `NAME.ds.index` is each document's end, in tokens, as
//! little-endian uint64, and an optional `NAME.ds.loss` holds a loss mask
//! byte per token (not served). The token size is `--token-dtype`'s, else
//! what the `.ds`'s size over the last document end says (2 or 4).

use super::access::{Access, Object};
use super::column::Column;
use super::corpus::Part;
use super::docs::DocList;
use super::dtype::TokenDtype;
use super::TokenError;

/// The suffix of a token file.
pub const DS: &[u8] = b".ds";
/// The suffix of its document ends.
pub const INDEX: &[u8] = b".ds.index";
/// The suffix of its loss mask.
pub const LOSS: &[u8] = b".ds.loss";

/// The (`.ds`, `.ds.index`) pairs among `keys` (sorted), in key order, and
/// the `.ds` files without an index.
pub fn pairs(keys: &[&[u8]]) -> (Vec<(usize, usize)>, Vec<usize>) {
    let mut pairs = Vec::new();
    let mut lone = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        if !key.ends_with(DS) {
            continue;
        }
        let mut idx = key.to_vec();
        idx.extend_from_slice(&INDEX[DS.len()..]);
        match keys.binary_search(&idx.as_slice()) {
            Ok(j) => pairs.push((i, j)),
            Err(_) => lone.push(i),
        }
    }
    (pairs, lone)
}

/// The document ends of `index` checked against a `.ds` of `ds_bytes`:
/// rising, the last one the file's end. Returns the ends and the token
/// size (`dtype`'s, else inferred).
fn check(ends: &Column, ds_bytes: u64, dtype: Option<TokenDtype>) -> Result<TokenDtype, String> {
    let n = ends.len();
    let last = if n == 0 { 0 } else { ends.get(n - 1) };
    let dtype = match dtype {
        Some(d) => d,
        None if last == 0 => TokenDtype::U16,
        None => {
            let size = ds_bytes / last;
            match (ds_bytes % last, TokenDtype::unsigned_of(size)) {
                (0, Some(d @ (TokenDtype::U16 | TokenDtype::U32))) => d,
                _ => {
                    return Err(format!(
                        "its index ends at token {last}, which does not make its {ds_bytes}-byte .ds a whole number of 2- or 4-byte tokens; \
                         pass --token-dtype if it was written with another size"
                    ))
                }
            }
        }
    };
    let item = dtype.item_bytes();
    if last.checked_mul(item) != Some(ds_bytes) {
        return Err(format!(
            "its index ends at token {last} ({} bytes of {dtype}), but the .ds is {ds_bytes} bytes",
            last.saturating_mul(item)
        ));
    }
    let mut previous = 0;
    for j in 0..n {
        let end = ends.get(j);
        if end < previous {
            return Err(format!(
                "document end {j} is {end}, before the one before it ({previous})"
            ));
        }
        previous = end;
    }
    Ok(dtype)
}

/// The parts of the datatrove files among `objects` (sorted keys): one per
/// `.ds`, its documents from its `.ds.index`. Returns the parts, the `.ds`
/// objects, and the dtype.
pub fn parts(
    access: &Access,
    objects: &[Object],
    dtype: Option<TokenDtype>,
    keep: Option<&std::path::Path>,
) -> Result<(Vec<Part>, Vec<Object>, TokenDtype), TokenError> {
    let keys: Vec<&[u8]> = objects.iter().map(|o| o.key.as_slice()).collect();
    let (pairs, lone) = pairs(&keys);
    for i in lone {
        tracing::warn!(
            "{} has no .ds.index beside it: not served (its documents are not known)",
            access.name(&objects[i].key)
        );
    }
    if pairs.is_empty() {
        return Err(TokenError::Format(format!(
            "{} holds no datatrove NAME.ds with its NAME.ds.index",
            access.source_name()
        )));
    }
    let mut parts = Vec::with_capacity(pairs.len());
    let mut data = Vec::with_capacity(pairs.len());
    let mut seen: Option<TokenDtype> = dtype;
    for (ds, idx) in pairs {
        let (ds, idx) = (&objects[ds], &objects[idx]);
        let bad = |problem: String| TokenError::Index {
            name: access.name(&idx.key),
            problem,
        };
        if idx.size_bytes % 8 != 0 {
            return Err(bad(format!(
                "it is {} bytes, not a whole number of uint64 document ends",
                idx.size_bytes
            )));
        }
        let backing = access.whole(idx, keep)?;
        let ends =
            Column::new(backing, 0, idx.size_bytes / 8, 8).map_err(|e| bad(e.to_string()))?;
        let d = check(&ends, ds.size_bytes, seen).map_err(bad)?;
        seen = Some(d);
        parts.push(Part {
            object: data.len() as u32,
            offset_bytes: 0,
            tokens: ds.size_bytes / d.item_bytes(),
            docs: DocList::Ends(ends),
            doc_offsets: None,
        });
        data.push(ds.clone());
    }
    Ok((parts, data, seen.unwrap_or(TokenDtype::U16)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_size_is_inferred_and_the_ends_checked() {
        let ends = Column::owned(&[3, 3, 7]);
        assert_eq!(check(&ends, 14, None), Ok(TokenDtype::U16));
        assert_eq!(check(&ends, 28, None), Ok(TokenDtype::U32));
        assert!(check(&ends, 21, None)
            .unwrap_err()
            .contains("--token-dtype"));
        assert!(check(&ends, 14, Some(TokenDtype::U32))
            .unwrap_err()
            .contains("28 bytes"));
        let falling = Column::owned(&[3, 2, 7]);
        assert!(check(&falling, 14, None).unwrap_err().contains("before"));
        let keys: Vec<&[u8]> = vec![b"a.ds", b"a.ds.index", b"a.ds.loss", b"b.ds", b"c.txt"];
        assert_eq!(pairs(&keys), (vec![(0, 1)], vec![3]));
    }
}
