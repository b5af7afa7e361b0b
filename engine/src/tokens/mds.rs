//! MosaicML MDS shards with a token column (llm-foundry's
//! `convert_dataset_hf --concat_tokens` output, `streaming.MDSWriter`):
//! an `index.json` listing shards in order, each
//!
//! ```text
//! u32           N, samples
//! u32 × (N+1)   offsets: sample i is bytes offsets[i]..offsets[i+1] of the shard
//! bytes         the writer's config, JSON
//! samples       each: a u32 size per variable-size column, then every column's
//!               bytes in column order (streaming/base/format/mds/writer.py)
//! ```
//!
//! A sample is a document; its tokens are the token column's values: an
//! `ndarray` (`ndarray:DTYPE:SHAPE`, `ndarray:DTYPE` with a shape prefix,
//! or `ndarray` with a dtype byte first: encodings.py's `NDArray`) or
//! `bytes` read as `--token-dtype`. The column is `tokens`, else
//! `input_ids`, else the only one. A shard's headers are read at start
//! (locally in place; remotely by one GET of the shard), so its documents
//! lie scattered between them (`Part::doc_offsets`). zstd shards
//! (`compression: zstd`) are decompressed once into the token cache
//! directory and read from there.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::access::{Access, Object};
use super::column::{Backing, Column};
use super::corpus::Part;
use super::docs::DocList;
use super::dtype::TokenDtype;
use super::litdata::{INDEX_JSON, INDEX_JSON_BYTES_MAX};
use super::TokenError;
use crate::manifest::digest_bytes;
use crate::source::private_dir::open_private_dir;

/// Most bytes of one shard (uncompressed): MDS's own limit is 2^32 (its
/// offsets are u32).
pub const SHARD_BYTES_MAX: u64 = 1 << 32;

/// One shard as `index.json` lists it.
#[derive(Debug)]
struct Shard {
    /// Its file, uncompressed.
    raw: String,
    raw_bytes: u64,
    /// Its zstd file, if compressed.
    zip: Option<String>,
    samples: u64,
    columns: Vec<ColumnSpec>,
}

/// A column of a shard.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ColumnSpec {
    name: String,
    encoding: String,
    /// Fixed size in bytes, or None (a u32 in each sample's head).
    size: Option<u64>,
}

/// How the token column's values are laid out in a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TokenEncoding {
    /// `ndarray:DTYPE:SHAPE`: values only.
    Fixed(TokenDtype),
    /// `ndarray:DTYPE`: a shape prefix, then the values.
    DynShape(TokenDtype),
    /// `ndarray`: a dtype byte, a shape prefix, then the values.
    DynDtype,
    /// `bytes`: the values, of `--token-dtype`.
    Bytes(TokenDtype),
}

/// NDArray's value dtype codes (encodings.py `_int2value_dtype`), the
/// integer ones.
fn dtype_of_code(code: u8) -> Option<TokenDtype> {
    match code {
        8 => Some(TokenDtype::U8),
        9 => Some(TokenDtype::I8),
        16 => Some(TokenDtype::U16),
        17 => Some(TokenDtype::I16),
        32 => Some(TokenDtype::U32),
        33 => Some(TokenDtype::I32),
        64 => Some(TokenDtype::U64),
        65 => Some(TokenDtype::I64),
        _ => None,
    }
}

fn encoding_of(spec: &ColumnSpec, dtype_flag: Option<TokenDtype>) -> Result<TokenEncoding, String> {
    let parts: Vec<&str> = spec.encoding.split(':').collect();
    let named = |s: &str| {
        TokenDtype::from_numpy_name(s)
            .ok_or_else(|| format!("column {} holds {s}, not integer token ids", spec.name))
    };
    match parts.as_slice() {
        ["ndarray", dtype, _shape] => Ok(TokenEncoding::Fixed(named(dtype)?)),
        ["ndarray", dtype] => Ok(TokenEncoding::DynShape(named(dtype)?)),
        ["ndarray"] => Ok(TokenEncoding::DynDtype),
        ["bytes"] => dtype_flag.map(TokenEncoding::Bytes).ok_or_else(|| {
            format!("column {} is bytes: pass --token-dtype, the type its tokens were written as (int64 for llm-foundry's older concat_tokens)", spec.name)
        }),
        _ => Err(format!(
            "column {} is encoded as {}, not an ndarray (or bytes) of token ids",
            spec.name, spec.encoding
        )),
    }
}

fn read_index(bytes: &[u8]) -> Result<Vec<Shard>, String> {
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("it is not JSON: {e}"))?;
    let shards = v
        .get("shards")
        .and_then(|s| s.as_array())
        .ok_or("it lists no \"shards\"")?;
    let mut out = Vec::with_capacity(shards.len());
    for (i, s) in shards.iter().enumerate() {
        let bad = |what: &str| format!("shard {i}: {what}");
        if s.get("format").and_then(|f| f.as_str()) != Some("mds") {
            return Err(bad("its format is not mds"));
        }
        let strings = |key: &str| -> Result<Vec<String>, String> {
            s.get(key)
                .and_then(|a| a.as_array())
                .map(|a| {
                    a.iter()
                        .map(|x| x.as_str().unwrap_or("").to_owned())
                        .collect()
                })
                .ok_or_else(|| bad(&format!("it has no {key}")))
        };
        let names = strings("column_names")?;
        let encodings = strings("column_encodings")?;
        let sizes = s
            .get("column_sizes")
            .and_then(|a| a.as_array())
            .ok_or_else(|| bad("it has no column_sizes"))?;
        if names.len() != encodings.len() || names.len() != sizes.len() {
            return Err(bad(
                "its column names, encodings and sizes differ in number",
            ));
        }
        let columns = names
            .into_iter()
            .zip(encodings)
            .zip(sizes)
            .map(|((name, encoding), size)| ColumnSpec {
                name,
                encoding,
                size: size.as_u64(),
            })
            .collect();
        let basename = |key: &str| {
            s.get(key)
                .and_then(|d| d.get("basename"))
                .and_then(|b| b.as_str())
                .map(str::to_owned)
        };
        let raw = basename("raw_data").ok_or_else(|| bad("it has no raw_data basename"))?;
        let raw_bytes = s
            .get("raw_data")
            .and_then(|d| d.get("bytes"))
            .and_then(|b| b.as_u64())
            .filter(|&b| b <= SHARD_BYTES_MAX)
            .ok_or_else(|| bad("its raw_data has no size up to 4 GiB"))?;
        let compression = s.get("compression").and_then(|c| c.as_str());
        let zip = match compression {
            None => None,
            Some(c) if c == "zstd" || c.starts_with("zstd:") => {
                Some(basename("zip_data").ok_or_else(|| bad("it is zstd-compressed but has no zip_data basename"))?)
            }
            Some(other) => {
                return Err(bad(&format!(
                    "it is compressed with {other}: only zstd shards are read; write them with compression='zstd' or none"
                )))
            }
        };
        out.push(Shard {
            raw,
            raw_bytes,
            zip,
            samples: s.get("samples").and_then(|n| n.as_u64()).unwrap_or(0),
            columns,
        });
    }
    Ok(out)
}

/// The token column among `columns`: `tokens`, else `input_ids`, else the
/// only one.
fn token_column(columns: &[ColumnSpec]) -> Result<usize, String> {
    for name in ["tokens", "input_ids"] {
        if let Some(i) = columns.iter().position(|c| c.name == name) {
            return Ok(i);
        }
    }
    if columns.len() == 1 {
        return Ok(0);
    }
    let names: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
    Err(format!(
        "its samples have columns {names:?} and none is named tokens or input_ids: the token column cannot be told"
    ))
}

/// Where sample `bytes` (at `at` of its shard) keeps its tokens: their
/// first byte's offset in the shard, their number, their dtype.
fn sample_tokens(
    bytes: &[u8],
    at: u64,
    columns: &[ColumnSpec],
    tc: usize,
    enc: TokenEncoding,
) -> Result<(u64, u64, TokenDtype), String> {
    let u32_at = |o: usize| -> Option<u64> {
        bytes
            .get(o..o + 4)
            .map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
    };
    let short = || "it is truncated".to_string();
    let variable = columns.iter().filter(|c| c.size.is_none()).count();
    let mut pos = 4 * variable as u64;
    let mut var_i = 0;
    let mut size_of_tc = 0u64;
    for (i, c) in columns.iter().enumerate() {
        let size = match c.size {
            Some(s) => s,
            None => {
                let s = u32_at(4 * var_i).ok_or_else(short)?;
                var_i += 1;
                s
            }
        };
        if i == tc {
            size_of_tc = size;
            break;
        }
        pos += size;
    }
    let end = pos.checked_add(size_of_tc).ok_or_else(short)?;
    if end > bytes.len() as u64 {
        return Err(short());
    }
    let col = &bytes[pos as usize..end as usize];
    let (skip, dtype) = match enc {
        TokenEncoding::Fixed(d) | TokenEncoding::Bytes(d) => (0usize, d),
        TokenEncoding::DynShape(d) => (shape_prefix(col, 0)?, d),
        TokenEncoding::DynDtype => {
            let code = *col.first().ok_or_else(short)?;
            let d = dtype_of_code(code)
                .ok_or_else(|| format!("its dtype code {code} is not an integer type"))?;
            (1 + shape_prefix(col, 1)?, d)
        }
    };
    let values = col.len() - skip.min(col.len());
    let item = dtype.item_bytes() as usize;
    if skip > col.len() || !values.is_multiple_of(item) {
        return Err(format!(
            "its token column of {} bytes is not a whole number of {dtype} values after its {skip}-byte prefix",
            col.len()
        ));
    }
    Ok((at + pos + skip as u64, (values / item) as u64, dtype))
}

/// Bytes of NDArray's shape prefix at `from` of `col`: a byte `(ndim << 2)
/// | shape dtype code`, then `ndim` dims of 1, 2, 4 or 8 bytes.
fn shape_prefix(col: &[u8], from: usize) -> Result<usize, String> {
    let byte = *col.get(from).ok_or("it is truncated")?;
    let ndim = usize::from(byte >> 2);
    let dim_bytes = 1usize << (byte & 3);
    Ok(1 + ndim * dim_bytes)
}

/// The part of shard `b` (its whole bytes): documents at their samples'
/// token columns.
fn shard_part(
    b: &[u8],
    shard: &Shard,
    tc: usize,
    enc: TokenEncoding,
    object: u32,
) -> Result<(Part, Option<TokenDtype>), String> {
    let u32_at = |o: usize| -> Option<u64> {
        b.get(o..o + 4)
            .map(|x| u64::from(u32::from_le_bytes([x[0], x[1], x[2], x[3]])))
    };
    let n = u32_at(0).ok_or("it is shorter than its header")?;
    if n != shard.samples {
        return Err(format!(
            "it holds {n} samples, index.json says {}",
            shard.samples
        ));
    }
    let mut starts = Vec::with_capacity(n as usize);
    let mut offsets = Vec::with_capacity(n as usize);
    let mut tokens = 0u64;
    let mut dtype = None;
    for i in 0..n as usize {
        let (a, z) = match (u32_at(4 + 4 * i), u32_at(8 + 4 * i)) {
            (Some(a), Some(z)) if a <= z && z <= b.len() as u64 => (a, z),
            _ => {
                return Err(format!(
                    "sample {i}'s offsets lie outside its {} bytes",
                    b.len()
                ))
            }
        };
        let (at, count, d) = sample_tokens(&b[a as usize..z as usize], a, &shard.columns, tc, enc)
            .map_err(|e| format!("sample {i}: {e}"))?;
        match dtype {
            Some(prev) if prev != d => {
                return Err(format!(
                    "sample {i} holds {d} tokens, those before it {prev}"
                ))
            }
            _ => dtype = Some(d),
        }
        starts.push(tokens);
        offsets.push(at);
        tokens += count;
    }
    Ok((
        Part {
            object,
            offset_bytes: 0,
            tokens,
            docs: DocList::Starts(Column::owned(&starts)),
            doc_offsets: Some(Column::owned(&offsets)),
        },
        dtype,
    ))
}

/// What an MDS corpus is read as: its parts, its data objects (the shards
/// the readers read), and, for zstd shards, their decompressed copies (then
/// the data objects are those local files).
pub struct MdsParts {
    /// The parts, one per shard with samples.
    pub parts: Vec<Part>,
    /// The shards as the source has them (uncompressed ones).
    pub data: Vec<Object>,
    /// zstd shards: each one's decompressed file, in `data`'s order.
    pub local: Option<Vec<PathBuf>>,
    /// The tokens' dtype.
    pub dtype: TokenDtype,
}

/// Reads the MDS corpus among `objects` (sorted keys, `index.json` at the
/// top).
pub fn parts(
    access: &Access,
    objects: &[Object],
    dtype_flag: Option<TokenDtype>,
    keep: Option<&Path>,
) -> Result<MdsParts, TokenError> {
    let find = |name: &str| objects.binary_search_by(|o| o.key.as_slice().cmp(name.as_bytes()));
    let index = find(std::str::from_utf8(INDEX_JSON).unwrap_or("index.json"))
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
    let shards = read_index(&bytes).map_err(bad_index)?;
    let mut out = MdsParts {
        parts: Vec::new(),
        data: Vec::new(),
        local: None,
        dtype: dtype_flag.unwrap_or(TokenDtype::U16),
    };
    let mut dtype: Option<TokenDtype> = None;
    let mut local = Vec::new();
    for shard in &shards {
        let tc = token_column(&shard.columns).map_err(bad_index)?;
        let enc = encoding_of(&shard.columns[tc], dtype_flag).map_err(bad_index)?;
        let key = shard.zip.as_deref().unwrap_or(&shard.raw);
        let obj = find(key).map(|i| &objects[i]).map_err(|_| {
            bad_index(format!(
                "its shard {key} is not in the source: copy it there"
            ))
        })?;
        let (backing, path) = match &shard.zip {
            None => (whole_shard(access, obj)?, None),
            Some(_) => {
                let dir = keep.ok_or_else(|| TokenError::Index {
                    name: access.name(&obj.key),
                    problem: "zstd shards are decompressed into the token cache directory, and there is none: pass --cache-dir".into(),
                })?;
                let (b, p) = decompressed(access, obj, shard.raw_bytes, dir)?;
                (b, Some(p))
            }
        };
        let object = out.data.len() as u32;
        let (part, d) = shard_part(backing.bytes(), shard, tc, enc, object).map_err(|problem| {
            TokenError::Index {
                name: access.name(&obj.key),
                problem,
            }
        })?;
        match (dtype, d) {
            (Some(prev), Some(d)) if prev != d => {
                return Err(TokenError::Index {
                    name: access.name(&obj.key),
                    problem: format!(
                        "its tokens are {d}, those before it {prev}: one corpus holds one dtype"
                    ),
                })
            }
            (_, Some(d)) => dtype = Some(d),
            _ => {}
        }
        out.parts.push(part);
        match path {
            Some(p) => {
                out.data.push(Object {
                    key: obj.key.clone(),
                    size_bytes: shard.raw_bytes,
                    etag: None,
                });
                local.push(p);
            }
            None => out.data.push(obj.clone()),
        }
    }
    if !local.is_empty() {
        if local.len() != out.data.len() {
            return Err(TokenError::Format(format!(
                "{}: some shards are zstd-compressed and some are not; write them all alike",
                access.source_name()
            )));
        }
        out.local = Some(local);
    }
    if let Some(d) = dtype {
        out.dtype = d;
    }
    Ok(out)
}

/// A shard's bytes, to read its headers: mapped in place, or fetched into
/// memory (at most `access::IN_MEMORY_INDEX_BYTES_MAX`) and dropped once
/// its documents are found.
fn whole_shard(access: &Access, obj: &Object) -> Result<Arc<Backing>, TokenError> {
    access.whole(obj, None)
}

/// The decompressed copy of zstd shard `obj` (`raw_bytes` once
/// decompressed) in `dir`, made if not there already: mapped, with its path.
fn decompressed(
    access: &Access,
    obj: &Object,
    raw_bytes: u64,
    dir: &Path,
) -> Result<(Arc<Backing>, PathBuf), TokenError> {
    let fail = |problem: String| TokenError::Index {
        name: access.name(&obj.key),
        problem,
    };
    let version = match access {
        Access::Local(local) => {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(local.path_of(&obj.key)).map_err(|e| fail(e.to_string()))?;
            format!("{}.{}.{}.{}", m.dev(), m.ino(), m.mtime(), m.mtime_nsec())
        }
        Access::Remote(_) => obj.etag.clone().unwrap_or_default(),
    };
    let identity = format!(
        "{}\0{}\0{}\0{version}",
        access.name(&obj.key),
        obj.size_bytes,
        raw_bytes
    );
    let a = digest_bytes(0x6d64_737a_0001, identity.as_bytes());
    let b = digest_bytes(0x6d64_737a_0002, identity.as_bytes());
    let name = format!("{a:016x}{b:016x}.mds");
    let keep = open_private_dir(dir).map_err(|e| TokenError::CacheDir {
        dir: dir.to_path_buf(),
        cause: e.to_string(),
    })?;
    let path = dir.join(&name);
    if !version.is_empty() {
        if let Ok(file) = keep.open_trusted(OsStr::new(&name)) {
            if file.metadata().map(|m| m.len()).ok() == Some(raw_bytes) {
                let b = Backing::map(&file).map_err(|e| fail(e.to_string()))?;
                return Ok((Arc::new(b), path));
            }
        }
    }
    let zip = access.whole(obj, Some(dir))?;
    let (mut file, tmp) = keep
        .create_temp(&format!(".{name}"), 0o600)
        .map_err(|e| fail(format!("cannot decompress into {}: {e}", dir.display())))?;
    let written = ruzstd::decoding::StreamingDecoder::new(zip.bytes())
        .map_err(|e| format!("it is not zstd: {e}"))
        .and_then(|mut dec| {
            // Never more than index.json promised: a bomb stops here.
            let mut limited = (&mut dec).take(raw_bytes + 1);
            std::io::copy(&mut limited, &mut file).map_err(|e| e.to_string())
        })
        .and_then(|n| match n == raw_bytes {
            true => file.flush().map_err(|e| e.to_string()),
            false => Err(format!(
                "it decompresses to more or fewer than the {raw_bytes} bytes index.json says"
            )),
        })
        .and_then(|()| {
            keep.rename(OsStr::new(&tmp), OsStr::new(&name))
                .map_err(|e| e.to_string())
        });
    if let Err(e) = written {
        let _ = keep.remove(OsStr::new(&tmp));
        return Err(fail(e));
    }
    let file = keep
        .open_trusted(OsStr::new(&name))
        .map_err(|e| fail(e.to_string()))?;
    let b = Backing::map(&file).map_err(|e| fail(e.to_string()))?;
    Ok((Arc::new(b), path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, encoding: &str, size: Option<u64>) -> ColumnSpec {
        ColumnSpec {
            name: name.into(),
            encoding: encoding.into(),
            size,
        }
    }

    #[test]
    fn a_sample_s_token_column_is_found_past_the_others_and_its_prefix() {
        // Columns (sorted, as MDSWriter keeps them): id (int, 8 bytes fixed),
        // text (str, variable), tokens (ndarray:uint16, variable).
        let cols = [
            col("id", "int", Some(8)),
            col("text", "str", None),
            col("tokens", "ndarray:uint16", None),
        ];
        let mut s = Vec::new();
        s.extend_from_slice(&3u32.to_le_bytes()); // text: 3 bytes
        s.extend_from_slice(&(1u32 + 1 + 6).to_le_bytes()); // tokens: prefix 2 + 3 values
        s.extend_from_slice(&[0; 8]); // id
        s.extend_from_slice(b"abc");
        s.extend_from_slice(&[1 << 2, 3]); // ndim 1, uint8 shape: [3]
        for t in [7u16, 8, 9] {
            s.extend_from_slice(&t.to_le_bytes());
        }
        let tc = token_column(&cols).unwrap();
        let enc = encoding_of(&cols[tc], None).unwrap();
        let (at, n, d) = sample_tokens(&s, 100, &cols, tc, enc).unwrap();
        assert_eq!((at, n, d), (100 + 8 + 8 + 3 + 2, 3, TokenDtype::U16));
        assert!(sample_tokens(&s[..20], 0, &cols, tc, enc).is_err());
        let e = encoding_of(&col("tokens", "bytes", None), None).unwrap_err();
        assert!(e.contains("--token-dtype"), "{e}");
        assert!(encoding_of(&col("tokens", "ndarray:float32", None), None).is_err());
    }
}
