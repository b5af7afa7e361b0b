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
use crate::ring::tar_fields::field_name;

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
/// order. Two members of one sample with the same field name (extension
/// lowercased, as WebDataset names fields: `a.jpg` and `a.JPG` are both
/// `jpg`) are an error at the second one's header.
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
                let ext = field_of(m);
                if run[..i].iter().any(|o| field_of(o) == ext) {
                    return Err(ScanError {
                        offset: m.header_offset,
                        fault: Fault::DuplicateExt {
                            name: String::from_utf8_lossy(&m.name).into_owned(),
                            key: String::from_utf8_lossy(key).into_owned(),
                            ext: String::from_utf8_lossy(&ext).into_owned(),
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

/// A member's field name: its extension as WebDataset names the field.
fn field_of(m: &super::index::TarMember) -> std::borrow::Cow<'_, [u8]> {
    field_name(split_key(&m.name).1)
}

fn has_duplicate_ext(run: &[super::index::TarMember]) -> bool {
    if run.len() <= FIELDS_COMPARED_MAX {
        return run
            .iter()
            .enumerate()
            .any(|(i, m)| run[..i].iter().any(|o| field_of(o) == field_of(m)));
    }
    let mut exts: Vec<_> = run.iter().map(field_of).collect();
    exts.sort_unstable();
    exts.windows(2).any(|w| w[0] == w[1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tar::index::TarMember;

    fn index(names: &[&str]) -> TarIndex {
        let members = names
            .iter()
            .enumerate()
            .map(|(i, name)| TarMember {
                header_offset: i as u64 * 1024,
                data_offset: i as u64 * 1024 + 512,
                size: 1,
                name: name.as_bytes().to_vec(),
            })
            .collect();
        TarIndex {
            shard_bytes: names.len() as u64 * 1024,
            members,
            classes: Vec::new(),
        }
    }

    #[test]
    fn extensions_differing_only_in_case_are_one_field_as_in_webdataset() {
        for many in [false, true] {
            let mut names = vec!["s1.jpg", "s1.JPG"];
            let extra: Vec<String> = (0..FIELDS_COMPARED_MAX)
                .map(|i| format!("s1.f{i}"))
                .collect();
            if many {
                names.splice(1..1, extra.iter().map(String::as_str));
            }
            let e = group(&index(&names), |_| {}).unwrap_err();
            let text = e.fault.to_string();
            assert!(
                text.contains("member \"s1.JPG\" repeats extension \"jpg\""),
                "{text}"
            );
            assert_eq!(e.offset, (names.len() as u64 - 1) * 1024);
        }
    }

    #[test]
    fn distinct_fields_of_one_key_make_one_sample() {
        let mut got = Vec::new();
        group(&index(&["s1.JPG", "s1.cls", "s2.jpg"]), |s| {
            got.push(s.members)
        })
        .unwrap();
        assert_eq!(got, vec![2, 1]);
    }
}
