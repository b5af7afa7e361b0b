//! The fields of a tar sample, for trainers (docs/shards.md): a sample served
//! from WebDataset tar shards is its members' raw tar bytes (header blocks,
//! pax and GNU long-name blocks included, then data), up to the last
//! member's last data byte. [`next_field`] walks them one regular-file member
//! at a time, giving slices of the sample itself: no byte is copied. The C
//! ABI's `rf_tar_field_next` is this function.
//!
//! Field names follow WebDataset's default (`group_by_keys(lcase=True)`):
//! the extension lowercased, `s1.JPG` is field `jpg` ([`field_name`]); the
//! member's name and extension as stored stay in [`TarField`].
//!
//! Here rather than in the engine because trainers link only this crate.

use std::borrow::Cow;

/// Bytes of a tar block.
const BLOCK: usize = 512;

/// One member of a tar sample: slices of the sample's own bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TarField<'a> {
    /// The ustar prefix when the name was split into prefix and name
    /// (the full name is `prefix/name`); empty otherwise.
    pub name_prefix: &'a [u8],
    /// The member's name (all of it, unless `name_prefix` is not empty).
    pub name: &'a [u8],
    /// The extension: what follows the first '.' of the name's last path
    /// component that is not that component's first character (a slice of
    /// `name`; empty when there is none), as stored: `JPG` for
    /// `s1.JPG`. The field's name is [`TarField::field_name`].
    pub ext: &'a [u8],
    /// The member's data.
    pub data: &'a [u8],
}

impl<'a> TarField<'a> {
    /// The field's name as WebDataset gives it by default: the extension
    /// lowercased (`s1.JPG` -> `jpg`), see [`field_name`].
    pub fn field_name(&self) -> Cow<'a, [u8]> {
        field_name(self.ext)
    }
}

/// WebDataset's default field name for an extension: Python's
/// `str.lower()` of the name decoded as UTF-8 with `surrogateescape`, i.e.
/// UTF-8 text lowercased as Unicode and bytes that are not UTF-8 kept as
/// they are. Borrowed when nothing changes (the usual case: `jpg`).
pub fn field_name(ext: &[u8]) -> Cow<'_, [u8]> {
    if ext.is_ascii() {
        if !ext.iter().any(u8::is_ascii_uppercase) {
            return Cow::Borrowed(ext);
        }
        return Cow::Owned(ext.to_ascii_lowercase());
    }
    let mut out = Vec::with_capacity(ext.len());
    for chunk in ext.utf8_chunks() {
        out.extend_from_slice(chunk.valid().to_lowercase().as_bytes());
        out.extend_from_slice(chunk.invalid());
    }
    if out == ext {
        Cow::Borrowed(ext)
    } else {
        Cow::Owned(out)
    }
}

/// Why a sample's bytes are not tar members.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TarFieldError {
    /// The bytes end inside a header or a member's data.
    #[error("the sample ends inside the member whose header is at byte {offset} (the sample is {len} bytes): it is not whole tar members")]
    Truncated {
        /// Offset of the header.
        offset: usize,
        /// The sample's length.
        len: usize,
    },
    /// A header's checksum does not match.
    #[error("bad tar header checksum at byte {offset} of the sample")]
    BadChecksum {
        /// Offset of the header.
        offset: usize,
    },
    /// A header field or pax record is malformed.
    #[error("malformed tar header at byte {offset} of the sample: {what}")]
    Malformed {
        /// Offset of the header.
        offset: usize,
        /// What is wrong.
        what: &'static str,
    },
}

/// The next regular-file member at or after `*cursor` (0 for the first),
/// advancing `*cursor` past it; `Ok(None)` at the end of the sample.
pub fn next_field<'a>(
    sample: &'a [u8],
    cursor: &mut usize,
) -> Result<Option<TarField<'a>>, TarFieldError> {
    let mut pos = *cursor;
    let mut long_name: Option<&'a [u8]> = None;
    let mut size_override: Option<u64> = None;
    loop {
        if pos >= sample.len() {
            *cursor = pos;
            return Ok(None);
        }
        let truncated = TarFieldError::Truncated {
            offset: pos,
            len: sample.len(),
        };
        let header = sample.get(pos..pos + BLOCK).ok_or(truncated.clone())?;
        let malformed = |what| TarFieldError::Malformed { offset: pos, what };
        if header.iter().all(|&b| b == 0) {
            return Err(malformed("an end-of-archive block inside a sample"));
        }
        check_sum(header).ok_or(TarFieldError::BadChecksum { offset: pos })?;
        let typeflag = header[156];
        let header_size = number(&header[124..136]).ok_or(malformed("the size is not a number"))?;
        let size = match typeflag {
            b'x' | b'g' | b'L' | b'K' => header_size,
            _ => size_override.unwrap_or(header_size),
        };
        let data_start = pos + BLOCK;
        let data_end = usize::try_from(size)
            .ok()
            .and_then(|s| data_start.checked_add(s))
            .filter(|&e| e <= sample.len());
        let data_end = data_end.ok_or(truncated)?;
        let data = &sample[data_start..data_end];
        // The next header: past the data's padding (absent after the last member).
        let next = data_end.div_ceil(BLOCK) * BLOCK;
        match typeflag {
            b'x' => {
                let (path, size) = pax(data).ok_or(malformed("a pax record is malformed"))?;
                long_name = path.or(long_name);
                size_override = size.or(size_override);
            }
            b'L' => {
                long_name = Some(&data[..data.iter().position(|&b| b == 0).unwrap_or(data.len())])
            }
            b'0' | b'\0' | b'7' => {
                let (name_prefix, name) = match long_name {
                    Some(name) => (&[][..], name),
                    None => ustar_name(header),
                };
                // Past the last member, its padding is not in the sample.
                *cursor = next.min(sample.len());
                return Ok(Some(TarField {
                    name_prefix,
                    name,
                    ext: ext_of(name),
                    data,
                }));
            }
            // Directories, links, global pax, long link names: not fields.
            _ => {
                long_name = None;
                size_override = None;
            }
        }
        pos = next;
    }
}

fn ext_of(name: &[u8]) -> &[u8] {
    let start = name
        .iter()
        .rposition(|&b| b == b'/')
        .map_or(0, |slash| slash + 1);
    match name
        .get(start + 1..)
        .and_then(|rest| rest.iter().position(|&b| b == b'.'))
    {
        Some(at) => &name[start + 1 + at + 1..],
        None => &[],
    }
}

fn until_nul(field: &[u8]) -> &[u8] {
    &field[..field.iter().position(|&b| b == 0).unwrap_or(field.len())]
}

fn ustar_name(header: &[u8]) -> (&[u8], &[u8]) {
    let name = until_nul(&header[0..100]);
    if &header[257..263] == b"ustar\0" {
        (until_nul(&header[345..500]), name)
    } else {
        (&[], name)
    }
}

fn check_sum(header: &[u8]) -> Option<()> {
    let stored = number(&header[148..156])?;
    let field: u64 = header[148..156].iter().map(|&b| u64::from(b)).sum();
    let unsigned = header.iter().map(|&b| u64::from(b)).sum::<u64>() - field + 8 * 0x20;
    let signed_field: i64 = header[148..156].iter().map(|&b| i64::from(b as i8)).sum();
    let signed = header.iter().map(|&b| i64::from(b as i8)).sum::<i64>() - signed_field + 8 * 0x20;
    (stored == unsigned || i64::try_from(stored).ok() == Some(signed)).then_some(())
}

fn number(field: &[u8]) -> Option<u64> {
    if field.first().is_some_and(|&b| b & 0x80 != 0) {
        if field[0] & 0x40 != 0 {
            return None;
        }
        return field[1..]
            .iter()
            .try_fold(u64::from(field[0] & 0x3f), |v, &b| {
                v.checked_mul(256)?.checked_add(u64::from(b))
            });
    }
    let digits = field
        .iter()
        .skip_while(|&&b| b == b' ')
        .take_while(|&&b| b != 0 && b != b' ');
    let mut any = false;
    let value = digits.into_iter().try_fold(0u64, |v, &b| {
        any = true;
        (b'0'..=b'7').contains(&b).then_some(())?;
        v.checked_mul(8)?.checked_add(u64::from(b - b'0'))
    })?;
    any.then_some(value)
}

/// The `path` and `size` of pax records.
fn pax(mut data: &[u8]) -> Option<(Option<&[u8]>, Option<u64>)> {
    let (mut path, mut size) = (None, None);
    while !data.is_empty() && !data.iter().all(|&b| b == 0) {
        let space = data.iter().position(|&b| b == b' ')?;
        let len: usize = std::str::from_utf8(&data[..space]).ok()?.parse().ok()?;
        if len <= space + 1 || len > data.len() || data[len - 1] != b'\n' {
            return None;
        }
        let record = &data[space + 1..len - 1];
        let eq = record.iter().position(|&b| b == b'=')?;
        match &record[..eq] {
            b"path" => path = Some(&record[eq + 1..]),
            b"size" => size = Some(std::str::from_utf8(&record[eq + 1..]).ok()?.parse().ok()?),
            _ => {}
        }
        data = &data[len..];
    }
    Some((path, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ustar header for `name` of `size` bytes, checksum filled in.
    fn header(name: &[u8], size: usize, typeflag: u8) -> Vec<u8> {
        let mut h = vec![0u8; BLOCK];
        h[..name.len()].copy_from_slice(name);
        h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
        h[156] = typeflag;
        h[257..263].copy_from_slice(b"ustar\0");
        h[148..156].copy_from_slice(b"        ");
        let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        h
    }

    fn member(name: &[u8], data: &[u8], typeflag: u8, last: bool) -> Vec<u8> {
        let mut m = header(name, data.len(), typeflag);
        m.extend_from_slice(data);
        if !last {
            m.resize(m.len().div_ceil(BLOCK) * BLOCK, 0);
        }
        m
    }

    /// (name, ext, data) of each field.
    type Fields = Vec<(Vec<u8>, Vec<u8>, Vec<u8>)>;

    fn fields(sample: &[u8]) -> Result<Fields, TarFieldError> {
        let mut cursor = 0;
        let mut out = Vec::new();
        while let Some(f) = next_field(sample, &mut cursor)? {
            out.push((f.name.to_vec(), f.ext.to_vec(), f.data.to_vec()));
        }
        Ok(out)
    }

    #[test]
    fn a_sample_walks_its_regular_members_skipping_directories_and_using_pax_paths() {
        let mut sample = member(b"d/", b"", b'5', false);
        sample.extend(member(b"k/000001.jpg", b"jpeg", b'0', false));
        let long = [b"k/".as_slice(), &[b'x'; 150], b"/000001.seg.png"].concat();
        let record = [
            format!("{} path=", long.len() + 10).as_bytes(),
            &long,
            b"\n",
        ]
        .concat();
        sample.extend(member(b"PaxHeader", &record, b'x', false));
        sample.extend(member(b"truncated-name", b"", b'0', false));
        sample.extend(member(b"k/000001.cls", b"7", b'0', true));
        let got = fields(&sample).unwrap();
        assert_eq!(got.len(), 3);
        // The cursor after the last field is the sample's end, a valid one.
        let mut cursor = sample.len() - 1 - b"7".len() - 511;
        assert!(next_field(&sample, &mut cursor).unwrap().is_some());
        assert_eq!(cursor, sample.len());
        assert_eq!(next_field(&sample, &mut cursor), Ok(None));
        assert_eq!(
            got[0],
            (b"k/000001.jpg".to_vec(), b"jpg".to_vec(), b"jpeg".to_vec())
        );
        assert_eq!(got[1], (long, b"seg.png".to_vec(), vec![]));
        assert_eq!(
            got[2],
            (b"k/000001.cls".to_vec(), b"cls".to_vec(), b"7".to_vec())
        );
    }

    #[test]
    fn a_cut_sample_is_an_error_at_the_member_it_cuts() {
        let mut sample = member(b"a.jpg", b"12345", b'0', false);
        sample.extend(member(b"a.cls", b"678", b'0', true));
        let cut = &sample[..sample.len() - 1];
        assert_eq!(
            fields(cut),
            Err(TarFieldError::Truncated {
                offset: BLOCK * 2,
                len: cut.len()
            })
        );
        assert_eq!(
            fields(&sample[..BLOCK * 2 + 100]),
            Err(TarFieldError::Truncated {
                offset: BLOCK * 2,
                len: BLOCK * 2 + 100
            })
        );
    }

    #[test]
    fn a_damaged_header_is_a_checksum_error_never_a_panic() {
        let mut sample = member(b"a.jpg", b"12345", b'0', true);
        sample[3] ^= 1;
        assert_eq!(
            fields(&sample),
            Err(TarFieldError::BadChecksum { offset: 0 })
        );
        for len in 0..sample.len() {
            let _ = fields(&sample[..len]);
        }
    }

    proptest::proptest! {
        /// Whatever a slot holds, walking it ends in fields inside it, the
        /// end, or an error: never a panic, never a slice outside it.
        #[test]
        fn any_bytes_walk_to_fields_inside_them_or_an_error(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2048),
        ) {
            let mut cursor = 0;
            let range = bytes.as_ptr_range();
            while let Ok(Some(f)) = next_field(&bytes, &mut cursor) {
                for part in [f.name, f.name_prefix, f.ext, f.data] {
                    proptest::prop_assert!(part.is_empty() || (range.contains(&part.as_ptr()) && part.len() <= bytes.len()));
                }
                proptest::prop_assert!(cursor <= bytes.len());
            }
        }
    }

    #[test]
    fn extensions_follow_the_webdataset_rule() {
        assert_eq!(ext_of(b"a/b/000123.seg.png"), b"seg.png");
        assert_eq!(ext_of(b"a/.hidden.txt"), b"txt");
        assert_eq!(ext_of(b"README"), b"");
        assert_eq!(ext_of(b"v1.2/x"), b"");
    }

    #[test]
    fn field_names_are_extensions_lowercased_as_webdataset_does() {
        assert_eq!(field_name(b"JPG"), b"jpg".as_slice());
        assert_eq!(field_name(b"Seg.PNG"), b"seg.png".as_slice());
        assert!(matches!(field_name(b"jpg"), Cow::Borrowed(_)));
        assert_eq!(field_name(b""), b"".as_slice());
        // Unicode text as Python's str.lower(); bytes that are not UTF-8 kept.
        assert_eq!(field_name("ÉTÉ".as_bytes()), "été".as_bytes());
        assert_eq!(field_name(b"A\xffB"), b"a\xffb".as_slice());
        assert_eq!(field_name(b"\xc3"), b"\xc3".as_slice());
    }

    #[test]
    fn a_field_keeps_its_stored_name_and_extension_beside_its_field_name() {
        let sample = member(b"k/s1.JPG", b"jpeg", b'0', true);
        let mut cursor = 0;
        let f = next_field(&sample, &mut cursor).unwrap().unwrap();
        assert_eq!(f.name, b"k/s1.JPG");
        assert_eq!(f.ext, b"JPG");
        assert_eq!(f.field_name(), b"jpg".as_slice());
    }
}
