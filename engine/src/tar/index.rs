//! The sidecar index of a tar shard, `<shard>.tar.idx` (TAR-INDEX.md,
//! docs/shards.md): one text line per regular-file member, so a shard's
//! samples are known without reading its headers. Pure: parses bytes and
//! writes to any `Write`; where the files live is the source's business.
//!
//! ```text
//! ringfeed-tar-index 1                             (2 when class lines follow)
//! shard_bytes <decimal size of the .tar>
//! class <name>                                     version 2 only: one line per class, in class order
//! <header_offset> <data_offset> <size> <name>      one line per member, in tar order
//! end <member_count> <crc32 of all preceding bytes, 8 lowercase hex>
//! ```
//!
//! A name's bytes 0x00-0x20, '%' and 0x7f are escaped as `%XX` (uppercase
//! hex); other bytes are raw. Any bytes parse to `Ok` or to an `Err` naming
//! the line and what is wrong, never a panic.

use std::io::{self, Write};

/// The first line of every index without class names.
pub const INDEX_MAGIC_LINE: &[u8] = b"ringfeed-tar-index 1";
/// The first line of an index with class names (`ringfeed pack` of an
/// ImageFolder tree): version 1 readers refuse it and read the shard's
/// headers instead, losing only the names.
pub const INDEX_MAGIC_LINE_V2: &[u8] = b"ringfeed-tar-index 2";
/// Most class names an index may hold.
pub const CLASSES_MAX: usize = 1 << 20;
/// What a sidecar's name adds to its shard's name (`a.tar` -> `a.tar.idx`).
pub const SIDECAR_SUFFIX: &str = ".idx";
/// Bytes of a tar block: headers and data start on multiples of it.
pub const TAR_BLOCK_BYTES: u64 = 512;
/// Longest member name an index may hold (pax names may pass PATH_MAX).
pub const NAME_BYTES_MAX: usize = 65_536;
/// Most members one shard's index may hold: a sample of one byte each
/// still takes two blocks, so this is a 256 GiB shard.
pub const MEMBERS_MAX: usize = 1 << 28;

/// One regular-file member of a shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TarMember {
    /// Offset of the first header block that belongs to this member (its
    /// pax and GNU long-name blocks included).
    pub header_offset: u64,
    /// Offset of the member's first content byte.
    pub data_offset: u64,
    /// Content bytes.
    pub size: u64,
    /// Full name, after pax `path` and GNU long names, raw bytes.
    pub name: Vec<u8>,
}

impl TarMember {
    /// One past the member's last content byte.
    pub fn data_end(&self) -> u64 {
        self.data_offset.saturating_add(self.size)
    }
}

/// A shard's regular-file members, in tar order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TarIndex {
    /// Size of the shard the index describes.
    pub shard_bytes: u64,
    /// Its regular-file members, in tar order.
    pub members: Vec<TarMember>,
    /// The dataset's class names, in class order: the `.cls` members' values
    /// index them (written by `ringfeed pack` of an ImageFolder tree, the
    /// same in every shard's index). Empty: none recorded.
    pub classes: Vec<Vec<u8>>,
}

/// Why an index's bytes are not a valid index.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TarIndexError {
    /// The first line is not `ringfeed-tar-index 1` (or 2).
    #[error("not a ringfeed tar index (first line is not 'ringfeed-tar-index 1' or 2); delete it to have the shard indexed from its headers")]
    BadMagic,
    /// A line does not have the shape its place asks for.
    #[error("line {line}: {what}")]
    BadLine {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        what: String,
    },
    /// A member's place breaks a rule of tar geometry.
    #[error("line {line}: member at header offset {header_offset}: {what}")]
    BadMember {
        /// 1-based line number.
        line: usize,
        /// The member's header offset.
        header_offset: u64,
        /// What is wrong with it.
        what: &'static str,
    },
    /// The bytes end before the `end` line.
    #[error("the index ends without its 'end' line (truncated)")]
    Truncated,
    /// The `end` line's count is not the number of member lines.
    #[error("the 'end' line counts {stated} members but the index has {found}")]
    CountMismatch {
        /// The count the `end` line states.
        stated: u64,
        /// Member lines found.
        found: u64,
    },
    /// The `end` line's CRC is not the CRC of the bytes before it.
    #[error(
        "CRC mismatch: the 'end' line says {stated:08x}, the bytes before it give {computed:08x}"
    )]
    CrcMismatch {
        /// The CRC the `end` line states.
        stated: u32,
        /// The CRC of the bytes before it.
        computed: u32,
    },
    /// Bytes follow the `end` line.
    #[error("bytes follow the 'end' line")]
    TrailingBytes,
}

impl TarIndex {
    /// Parses an index's bytes, checking its CRC, its count and every
    /// member's geometry against `shard_bytes` (not against the shard
    /// itself: comparing `shard_bytes` with the shard's size is the
    /// caller's, who knows it).
    pub fn parse(bytes: &[u8]) -> Result<TarIndex, TarIndexError> {
        let mut lines = Lines {
            bytes,
            at: 0,
            line: 0,
        };
        let with_classes = match lines.next_line() {
            Some(first) if first == INDEX_MAGIC_LINE => false,
            Some(first) if first == INDEX_MAGIC_LINE_V2 => true,
            _ => return Err(TarIndexError::BadMagic),
        };
        let shard_line = lines.next_line().ok_or(TarIndexError::Truncated)?;
        let shard_bytes = match shard_line.strip_prefix(b"shard_bytes ") {
            Some(value) => parse_u64(value)
                .ok_or_else(|| bad_line(&lines, "shard_bytes is not a decimal u64"))?,
            None => return Err(bad_line(&lines, "expected 'shard_bytes <size>'")),
        };
        let mut index = TarIndex {
            shard_bytes,
            members: Vec::new(),
            classes: Vec::new(),
        };
        loop {
            let before_line = lines.at;
            let line = lines.next_line().ok_or(TarIndexError::Truncated)?;
            if let Some(name) = line.strip_prefix(b"class ").filter(|_| with_classes) {
                if !index.members.is_empty() || index.classes.len() >= CLASSES_MAX {
                    return Err(bad_line(
                        &lines,
                        "a class line after a member, or more than CLASSES_MAX (1048576)",
                    ));
                }
                let name = unescape_name(name).map_err(|what| bad_line(&lines, what))?;
                if name.is_empty() || name.len() > NAME_BYTES_MAX {
                    return Err(bad_line(&lines, "a class name is empty or too long"));
                }
                index.classes.push(name);
                continue;
            }
            if let Some(rest) = line.strip_prefix(b"end ") {
                let computed = crc32fast::hash(&bytes[..before_line]);
                return finish(index, &lines, rest, computed);
            }
            if index.members.len() >= MEMBERS_MAX {
                return Err(bad_line(
                    &lines,
                    "more members than MEMBERS_MAX (268435456)",
                ));
            }
            let member = parse_member(line).map_err(|what| bad_line(&lines, what))?;
            check_member(&member, index.members.last(), shard_bytes).map_err(|what| {
                TarIndexError::BadMember {
                    line: lines.line,
                    header_offset: member.header_offset,
                    what,
                }
            })?;
            index.members.push(member);
        }
    }

    /// Checks every member's geometry: what [`TarIndex::parse`] checks,
    /// for an index built in memory before it is written.
    pub fn check(&self) -> Result<(), TarIndexError> {
        let bad_class = |c: &Vec<u8>| c.is_empty() || c.len() > NAME_BYTES_MAX;
        if self.classes.len() > CLASSES_MAX || self.classes.iter().any(bad_class) {
            return Err(TarIndexError::BadLine {
                line: 3,
                what: "a class name is empty or too long, or more than CLASSES_MAX".into(),
            });
        }
        let mut previous = None;
        for (i, member) in self.members.iter().enumerate() {
            check_member(member, previous, self.shard_bytes).map_err(|what| {
                TarIndexError::BadMember {
                    line: i + 3,
                    header_offset: member.header_offset,
                    what,
                }
            })?;
            previous = Some(member);
        }
        Ok(())
    }

    /// Writes the index in the text format, `end` line and CRC included.
    /// An index that fails [`TarIndex::check`] is refused (`InvalidInput`),
    /// so no writer leaves an index its readers would reject.
    pub fn write(&self, out: &mut impl Write) -> io::Result<()> {
        self.check().map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("refusing to write a tar index: {e}"),
            )
        })?;
        let mut crc = crc32fast::Hasher::new();
        let mut line = Vec::with_capacity(256);
        line.extend_from_slice(if self.classes.is_empty() {
            INDEX_MAGIC_LINE
        } else {
            INDEX_MAGIC_LINE_V2
        });
        line.push(b'\n');
        line.extend_from_slice(format!("shard_bytes {}\n", self.shard_bytes).as_bytes());
        for class in &self.classes {
            line.extend_from_slice(b"class ");
            escape_name(class, &mut line);
            line.push(b'\n');
        }
        crc.update(&line);
        out.write_all(&line)?;
        for member in &self.members {
            line.clear();
            let fields = format!(
                "{} {} {} ",
                member.header_offset, member.data_offset, member.size
            );
            line.extend_from_slice(fields.as_bytes());
            escape_name(&member.name, &mut line);
            line.push(b'\n');
            crc.update(&line);
            out.write_all(&line)?;
        }
        let end = format!("end {} {:08x}\n", self.members.len(), crc.finalize());
        out.write_all(end.as_bytes())
    }
}

/// Reads `bytes` line by line, counting lines from 1.
struct Lines<'a> {
    bytes: &'a [u8],
    at: usize,
    line: usize,
}

impl<'a> Lines<'a> {
    /// The next line without its '\n', or `None` when no complete line is
    /// left (a last line without '\n' is a truncated one).
    fn next_line(&mut self) -> Option<&'a [u8]> {
        let rest = &self.bytes[self.at..];
        let newline = memchr::memchr(b'\n', rest)?;
        self.at += newline + 1;
        self.line += 1;
        Some(&rest[..newline])
    }
}

fn bad_line(lines: &Lines<'_>, what: &str) -> TarIndexError {
    TarIndexError::BadLine {
        line: lines.line,
        what: what.to_string(),
    }
}

/// Checks the `end` line (`rest` is what follows `end `) and that nothing
/// follows it.
fn finish(
    index: TarIndex,
    lines: &Lines<'_>,
    rest: &[u8],
    computed: u32,
) -> Result<TarIndex, TarIndexError> {
    let mut fields = rest.split(|&b| b == b' ');
    let (Some(count), Some(crc), None) = (fields.next(), fields.next(), fields.next()) else {
        return Err(bad_line(lines, "expected 'end <member_count> <crc32>'"));
    };
    let stated_count =
        parse_u64(count).ok_or_else(|| bad_line(lines, "the member count is not a decimal u64"))?;
    let stated_crc =
        parse_crc(crc).ok_or_else(|| bad_line(lines, "the CRC is not 8 lowercase hex digits"))?;
    if lines.at != lines.bytes.len() {
        return Err(TarIndexError::TrailingBytes);
    }
    if stated_crc != computed {
        return Err(TarIndexError::CrcMismatch {
            stated: stated_crc,
            computed,
        });
    }
    let found = index.members.len() as u64;
    if stated_count != found {
        return Err(TarIndexError::CountMismatch {
            stated: stated_count,
            found,
        });
    }
    Ok(index)
}

fn parse_member(line: &[u8]) -> Result<TarMember, &'static str> {
    let mut fields = line.splitn(4, |&b| b == b' ');
    let mut number = |what: &'static str| fields.next().and_then(parse_u64).ok_or(what);
    let header_offset = number("header_offset is not a decimal u64")?;
    let data_offset = number("data_offset is not a decimal u64")?;
    let size = number("size is not a decimal u64")?;
    let name = fields.next().ok_or("the member has no name")?;
    Ok(TarMember {
        header_offset,
        data_offset,
        size,
        name: unescape_name(name)?,
    })
}

/// The geometry every member must have: block-aligned, at least one header
/// block before its data, inside the shard, after the previous member.
fn check_member(
    member: &TarMember,
    previous: Option<&TarMember>,
    shard_bytes: u64,
) -> Result<(), &'static str> {
    if member.name.is_empty() {
        return Err("the name is empty");
    }
    if member.name.len() > NAME_BYTES_MAX {
        return Err("the name is longer than NAME_BYTES_MAX (65536)");
    }
    if !member.header_offset.is_multiple_of(TAR_BLOCK_BYTES)
        || !member.data_offset.is_multiple_of(TAR_BLOCK_BYTES)
    {
        return Err("header_offset and data_offset must be multiples of 512");
    }
    if member.data_offset < member.header_offset.saturating_add(TAR_BLOCK_BYTES) {
        return Err("data_offset must be at least one 512-byte header after header_offset");
    }
    match member.data_offset.checked_add(member.size) {
        Some(end) if end <= shard_bytes => {}
        _ => return Err("the member's data runs past shard_bytes"),
    }
    if let Some(previous) = previous {
        if member.header_offset < previous.data_end() {
            return Err("the member starts before the previous member's data ends");
        }
    }
    Ok(())
}

/// Decimal digits only, no sign, no overflow.
fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 20 {
        return None;
    }
    digits.iter().try_fold(0u64, |value, &d| {
        if !d.is_ascii_digit() {
            return None;
        }
        value.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

fn parse_crc(hex: &[u8]) -> Option<u32> {
    if hex.len() != 8 {
        return None;
    }
    hex.iter().try_fold(0u32, |value, &h| {
        let nibble = match h {
            b'0'..=b'9' => h - b'0',
            b'a'..=b'f' => h - b'a' + 10,
            _ => return None,
        };
        Some(value << 4 | u32::from(nibble))
    })
}

fn needs_escape(b: u8) -> bool {
    b <= 0x20 || b == b'%' || b == 0x7f
}

/// Appends `name` to `out` with 0x00-0x20, '%' and 0x7f as `%XX`.
pub fn escape_name(name: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in name {
        if needs_escape(b) {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]);
        } else {
            out.push(b);
        }
    }
}

/// The raw bytes of an escaped name. A raw byte that should have been
/// escaped, or a '%' not followed by two hex digits, is an error.
pub fn unescape_name(escaped: &[u8]) -> Result<Vec<u8>, &'static str> {
    let mut name = Vec::with_capacity(escaped.len());
    let mut at = 0;
    while at < escaped.len() {
        let b = escaped[at];
        if b == b'%' {
            let hex = escaped
                .get(at + 1..at + 3)
                .ok_or("a '%' in the name is not followed by two hex digits")?;
            let high =
                hex_value(hex[0]).ok_or("a '%' in the name is not followed by two hex digits")?;
            let low =
                hex_value(hex[1]).ok_or("a '%' in the name is not followed by two hex digits")?;
            name.push(high << 4 | low);
            at += 3;
        } else if needs_escape(b) {
            return Err("the name holds a raw byte that must be escaped (0x00-0x20, 0x7f)");
        } else {
            name.push(b);
            at += 1;
        }
    }
    Ok(name)
}

fn hex_value(h: u8) -> Option<u8> {
    match h {
        b'0'..=b'9' => Some(h - b'0'),
        b'A'..=b'F' => Some(h - b'A' + 10),
        b'a'..=b'f' => Some(h - b'a' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(header_offset: u64, data_offset: u64, size: u64, name: &[u8]) -> TarMember {
        TarMember {
            header_offset,
            data_offset,
            size,
            name: name.to_vec(),
        }
    }

    fn sample_index() -> TarIndex {
        TarIndex {
            shard_bytes: 10_240,
            members: vec![
                member(0, 512, 3, b"000001.jpg"),
                member(1024, 1536, 0, b"000001.cls"),
                member(
                    2048,
                    3584,
                    700,
                    b"dir with space/100%/\x01odd\x7f\xff\xe2\x82\xac.seg.png",
                ),
                member(5120, 5632, 512, b"a/.hidden.txt"),
            ],
            classes: Vec::new(),
        }
    }

    fn written(index: &TarIndex) -> Vec<u8> {
        let mut out = Vec::new();
        index.write(&mut out).unwrap();
        out
    }

    /// Rewrites the `end` line's CRC so a test reaches the check after it.
    fn with_fixed_crc(body: &[u8], count: usize) -> Vec<u8> {
        let mut out = body.to_vec();
        out.extend_from_slice(format!("end {count} {:08x}\n", crc32fast::hash(body)).as_bytes());
        out
    }

    #[test]
    fn an_index_written_then_parsed_is_the_same_index() {
        let index = sample_index();
        assert_eq!(TarIndex::parse(&written(&index)).unwrap(), index);
    }

    #[test]
    fn an_empty_shard_has_an_index_with_no_members() {
        let index = TarIndex {
            shard_bytes: 1024,
            members: vec![],
            classes: Vec::new(),
        };
        let bytes = written(&index);
        assert_eq!(
            bytes,
            b"ringfeed-tar-index 1\nshard_bytes 1024\nend 0 "
                .iter()
                .copied()
                .chain(
                    format!(
                        "{:08x}\n",
                        crc32fast::hash(b"ringfeed-tar-index 1\nshard_bytes 1024\n")
                    )
                    .bytes()
                )
                .collect::<Vec<u8>>()
        );
        assert_eq!(TarIndex::parse(&bytes).unwrap(), index);
    }

    #[test]
    fn odd_names_are_escaped_as_the_contract_says() {
        let text = written(&sample_index());
        let third = text.split(|&b| b == b'\n').nth(4).unwrap();
        assert_eq!(
            third,
            b"2048 3584 700 dir%20with%20space/100%25/%01odd%7F\xff\xe2\x82\xac.seg.png".as_slice()
        );
    }

    #[test]
    fn every_escapable_byte_round_trips() {
        let name: Vec<u8> = (0u8..=255).collect();
        let mut escaped = Vec::new();
        escape_name(&name, &mut escaped);
        assert!(!escaped.iter().any(|&b| b <= 0x20 || b == 0x7f));
        assert_eq!(unescape_name(&escaped).unwrap(), name);
    }

    #[test]
    fn lowercase_escapes_are_read_too() {
        assert_eq!(unescape_name(b"a%2fb%7f").unwrap(), b"a/b\x7f");
    }

    #[test]
    fn a_raw_space_or_a_broken_escape_in_a_name_is_an_error() {
        assert!(unescape_name(b"a b").is_err());
        assert!(unescape_name(b"a%2").is_err());
        assert!(unescape_name(b"a%zz").is_err());
    }

    #[test]
    fn a_flipped_byte_fails_the_crc() {
        let mut bytes = written(&sample_index());
        let at = bytes.iter().position(|&b| b == b'j').unwrap();
        bytes[at] = b'k';
        assert!(matches!(
            TarIndex::parse(&bytes),
            Err(TarIndexError::CrcMismatch { .. })
        ));
    }

    #[test]
    fn a_wrong_member_count_is_refused() {
        let body = b"ringfeed-tar-index 1\nshard_bytes 2048\n0 512 3 a.txt\n";
        let err = TarIndex::parse(&with_fixed_crc(body, 2)).unwrap_err();
        assert_eq!(
            err,
            TarIndexError::CountMismatch {
                stated: 2,
                found: 1
            }
        );
    }

    #[test]
    fn a_truncated_index_is_refused_at_every_cut() {
        let bytes = written(&sample_index());
        for cut in 0..bytes.len() {
            assert!(
                TarIndex::parse(&bytes[..cut]).is_err(),
                "cut at {cut} parsed"
            );
        }
    }

    #[test]
    fn bytes_after_the_end_line_are_refused() {
        let mut bytes = written(&sample_index());
        bytes.extend_from_slice(b"x\n");
        assert_eq!(TarIndex::parse(&bytes), Err(TarIndexError::TrailingBytes));
    }

    #[test]
    fn another_format_is_not_read() {
        assert_eq!(
            TarIndex::parse(b"ringfeed-tar-index 3\n"),
            Err(TarIndexError::BadMagic)
        );
        assert_eq!(TarIndex::parse(b""), Err(TarIndexError::BadMagic));
    }

    #[test]
    fn members_with_impossible_geometry_are_refused() {
        let cases: &[&[u8]] = &[
            b"0 512 4096 past.end\n", // data runs past shard_bytes
            b"1 513 3 unaligned\n",   // not on a block
            b"0 0 3 no.header\n",     // no header block before the data
            b"0 512 18446744073709551615 overflow\n",
        ];
        for line in cases {
            let mut body = b"ringfeed-tar-index 1\nshard_bytes 2048\n".to_vec();
            body.extend_from_slice(line);
            let err = TarIndex::parse(&with_fixed_crc(&body, 1)).unwrap_err();
            assert!(
                matches!(err, TarIndexError::BadMember { line: 3, .. }),
                "{line:?}: {err}"
            );
        }
    }

    #[test]
    fn overlapping_members_are_refused() {
        let body = b"ringfeed-tar-index 1\nshard_bytes 4096\n0 512 1000 a.x\n1024 1536 1 b.x\n";
        let err = TarIndex::parse(&with_fixed_crc(body, 2)).unwrap_err();
        assert!(
            matches!(
                err,
                TarIndexError::BadMember {
                    line: 4,
                    header_offset: 1024,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn numbers_with_signs_or_spaces_are_not_numbers() {
        for line in [
            &b"+0 512 3 a.x\n"[..],
            b"0  512 3 a.x\n",
            b"0 512 3\n",
            b"0 512 x a.x\n",
        ] {
            let mut body = b"ringfeed-tar-index 1\nshard_bytes 2048\n".to_vec();
            body.extend_from_slice(line);
            let err = TarIndex::parse(&with_fixed_crc(&body, 1)).unwrap_err();
            assert!(
                matches!(err, TarIndexError::BadLine { line: 3, .. }),
                "{line:?}: {err}"
            );
        }
    }

    #[test]
    fn writing_an_index_with_bad_geometry_is_refused() {
        let index = TarIndex {
            shard_bytes: 100,
            members: vec![member(0, 512, 3, b"a.x")],
            classes: Vec::new(),
        };
        let err = index.write(&mut Vec::new()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn an_uppercase_crc_is_not_the_format() {
        assert_eq!(parse_crc(b"deadbeef"), Some(0xdead_beef));
        assert_eq!(parse_crc(b"DEADBEEF"), None);
        assert_eq!(parse_crc(b"deadbee"), None);
    }
}
