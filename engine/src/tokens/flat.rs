//! Flat token files (nanoGPT's `train.bin`, `--format tokens
//! --token-dtype T`): each file is its tokens end to end, and one document.

use super::access::{Access, Object};
use super::corpus::Part;
use super::docs::DocList;
use super::dtype::TokenDtype;
use super::TokenError;

/// The parts of flat token files `objects` (every object is one, in key
/// order), of `dtype`.
pub fn parts(
    access: &Access,
    objects: &[Object],
    dtype: TokenDtype,
) -> Result<Vec<Part>, TokenError> {
    let item = dtype.item_bytes();
    objects
        .iter()
        .enumerate()
        .map(|(i, obj)| {
            if obj.size_bytes % item != 0 {
                return Err(TokenError::Index {
                    name: access.name(&obj.key),
                    problem: format!(
                        "it is {} bytes, not a whole number of {dtype} tokens ({item} bytes each); pass the --token-dtype it was written with",
                        obj.size_bytes
                    ),
                });
            }
            Ok(Part {
                // i < objects.len(), which the listing bounded by MAX_FILES.
                object: i as u32,
                offset_bytes: 0,
                tokens: obj.size_bytes / item,
                docs: DocList::Single,
                doc_offsets: None,
            })
        })
        .collect()
}
