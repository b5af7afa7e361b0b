//! Reading a tar shard's headers: which regular-file members it holds and
//! where (ustar, pax `path`/`size` records, GNU long names), without its
//! data. A push parser over the shard's bytes in order: it says which bytes
//! it wants next (a header, a pax or long-name block) and which it skips (a
//! member's data), so one local file is read by hopping from header to
//! header and one remote object by a single streaming GET whose data bytes
//! go by unread.

use super::index::{TarIndex, TarMember, NAME_BYTES_MAX, TAR_BLOCK_BYTES};

/// Bytes of one tar block, as a `usize`.
pub const BLOCK: usize = TAR_BLOCK_BYTES as usize;
/// Largest pax extended header or GNU long name read (larger ones are an
/// error, not an allocation a hostile shard chooses).
pub const META_BYTES_MAX: u64 = 1 << 20;

/// What is wrong in a shard, at a byte offset [`ScanError`] gives.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    /// The shard ends inside a header block.
    #[error("the shard ends inside a header block (it is {shard_bytes} bytes): it is truncated")]
    TruncatedHeader {
        /// The shard's size.
        shard_bytes: u64,
    },
    /// The shard ends inside a member's data (or its padding).
    #[error("member {name:?} of {size_bytes} bytes ends at byte {end}, past the shard's end ({shard_bytes} bytes): the shard is truncated")]
    TruncatedMember {
        /// The member's name.
        name: String,
        /// Its size from its header.
        size_bytes: u64,
        /// Where its data (and padding) would end.
        end: u64,
        /// The shard's size.
        shard_bytes: u64,
    },
    /// A member's size is larger than the whole shard.
    #[error("member {name:?} says it is {size_bytes} bytes, larger than the whole shard ({shard_bytes} bytes): the shard is truncated or the header is wrong")]
    LargerThanShard {
        /// The member's name.
        name: String,
        /// Its size from its header.
        size_bytes: u64,
        /// The shard's size.
        shard_bytes: u64,
    },
    /// A header's checksum does not match its bytes (a field that is not
    /// a number is [`Fault::BadNumber`]).
    #[error("bad header checksum: the header says {stored}, its bytes sum to {computed} (not a tar file, or a damaged one)")]
    BadChecksum {
        /// The checksum field's value.
        stored: i64,
        /// The unsigned sum of the header's bytes.
        computed: i64,
    },
    /// A numeric header field is not a number.
    #[error("the header's {field} field is not an octal or base-256 number (not a tar file, or a damaged one)")]
    BadNumber {
        /// The field.
        field: &'static str,
    },
    /// A pax extended header is malformed.
    #[error("malformed pax extended header: {what}")]
    BadPax {
        /// What is wrong.
        what: &'static str,
    },
    /// A pax or GNU long-name header is larger than `META_BYTES_MAX`.
    #[error("a pax or GNU long-name header of {size_bytes} bytes is larger than the {max} read")]
    MetaTooLarge {
        /// Its size.
        size_bytes: u64,
        /// `META_BYTES_MAX`.
        max: u64,
    },
    /// A pax or long-name header is not followed by the member it names.
    #[error(
        "a pax or GNU long-name header is followed by the end of the archive, not by a member"
    )]
    MetaWithoutMember,
    /// A member type that cannot be served (sparse files, multi-volume).
    #[error("member {name:?} has type {typeflag:?}, which ringfeed does not serve (sparse or multi-volume); write the shard without it (tar --format=posix, no --sparse)")]
    Unsupported {
        /// The member's name.
        name: String,
        /// Its type flag.
        typeflag: char,
    },
    /// A name is longer than `NAME_BYTES_MAX` or empty.
    #[error("a member name of {len} bytes (at most {NAME_BYTES_MAX}, at least 1)")]
    BadName {
        /// Its length.
        len: usize,
    },
    /// Two members of one sample have the same extension.
    #[error("member {name:?} repeats extension {ext:?} within sample {key:?} (members of a sample are consecutive and each extension appears once, compared lowercased as WebDataset names fields)")]
    DuplicateExt {
        /// The second member's name.
        name: String,
        /// The sample's key.
        key: String,
        /// The repeated field name (the extension lowercased).
        ext: String,
    },
}

/// A fault and where in the shard it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanError {
    /// Byte offset of the header (or member) at fault.
    pub offset: u64,
    /// What is wrong.
    pub fault: Fault,
}

/// What the parser wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// The next `n` bytes (at [`Scanner::position`]), handed to [`Scanner::take`].
    Bytes(usize),
    /// The next `n` bytes are not needed: [`Scanner::skip`] them.
    Skip(u64),
    /// The archive ended; [`Scanner::finish`] gives the index.
    Done,
}

/// Metadata waiting for the member it describes.
#[derive(Debug, Default)]
struct Pending {
    /// Offset of the first header block of the member (pax/long-name blocks).
    header_offset: Option<u64>,
    path: Option<Vec<u8>>,
    size_bytes: Option<u64>,
}

#[derive(Debug)]
enum State {
    Header,
    /// Reading a pax ('x'), global pax ('g') or GNU long-name ('L', 'K')
    /// header's data of this many bytes (then its padding is skipped).
    Meta {
        typeflag: u8,
        size_bytes: u64,
    },
    Skip(u64),
    Done,
}

/// The push parser (see the module docs).
#[derive(Debug)]
pub struct Scanner {
    shard_bytes: u64,
    position: u64,
    state: State,
    pending: Pending,
    index: TarIndex,
}

fn padded(size_bytes: u64) -> u64 {
    size_bytes
        .div_ceil(TAR_BLOCK_BYTES)
        .saturating_mul(TAR_BLOCK_BYTES)
}

fn lossy(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

impl Scanner {
    /// A parser for a shard of `shard_bytes` bytes.
    pub fn new(shard_bytes: u64) -> Scanner {
        Scanner {
            shard_bytes,
            position: 0,
            state: State::Header,
            pending: Pending::default(),
            index: TarIndex {
                shard_bytes,
                members: Vec::new(),
                classes: Vec::new(),
            },
        }
    }

    /// Offset of the next byte the parser wants or skips.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Members found so far.
    pub fn members(&self) -> usize {
        self.index.members.len()
    }

    /// What the parser wants next, or why the shard cannot give it.
    pub fn want(&self) -> Result<Want, ScanError> {
        let left = self.shard_bytes - self.position.min(self.shard_bytes);
        match self.state {
            State::Done => Ok(Want::Done),
            State::Skip(n) => Ok(Want::Skip(n)),
            State::Meta { size_bytes, .. } => Ok(Want::Bytes(size_bytes as usize)),
            State::Header if left >= TAR_BLOCK_BYTES => Ok(Want::Bytes(BLOCK)),
            State::Header => match self.pending.header_offset {
                // The shard ends after a pax or long-name header, before
                // (or inside) the header of the member it names.
                Some(offset) => Err(ScanError {
                    offset,
                    fault: Fault::TruncatedHeader {
                        shard_bytes: self.shard_bytes,
                    },
                }),
                // A shard without the end-of-archive blocks (or without the
                // last member's padding): accepted, as tar itself does.
                None if left == 0 => Ok(Want::Done),
                None => Err(self.fault_here(Fault::TruncatedHeader {
                    shard_bytes: self.shard_bytes,
                })),
            },
        }
    }

    fn fault_here(&self, fault: Fault) -> ScanError {
        ScanError {
            offset: self.position,
            fault,
        }
    }

    /// Skips `n` bytes, at most what [`Want::Skip`] asked.
    pub fn skip(&mut self, n: u64) {
        if let State::Skip(left) = self.state {
            let n = n.min(left);
            self.position += n;
            self.state = if n == left {
                State::Header
            } else {
                State::Skip(left - n)
            };
        }
    }

    /// The shard's bytes ended (a streamed body): a skip that ran past the
    /// end is done, and [`Scanner::want`] then says whether the shard was
    /// whole.
    pub fn end_of_shard(&mut self) {
        if let State::Skip(left) = self.state {
            self.position += left;
            self.state = State::Header;
        }
    }

    /// Takes the bytes [`Want::Bytes`] asked for (exactly that many).
    pub fn take(&mut self, bytes: &[u8]) -> Result<(), ScanError> {
        match self.state {
            State::Header => {
                debug_assert_eq!(bytes.len(), BLOCK);
                let offset = self.position;
                self.header(bytes)
                    .map_err(|fault| ScanError { offset, fault })
            }
            State::Meta {
                typeflag,
                size_bytes,
            } => {
                debug_assert_eq!(bytes.len() as u64, size_bytes);
                let offset = self.position;
                self.meta(typeflag, bytes)
                    .map_err(|fault| ScanError { offset, fault })?;
                self.position += size_bytes;
                self.state = State::Skip(padded(size_bytes) - size_bytes);
                Ok(())
            }
            State::Skip(_) | State::Done => Ok(()),
        }
    }

    /// The index of the members found; call after [`Want::Done`].
    pub fn finish(self) -> TarIndex {
        self.index
    }

    fn header(&mut self, block: &[u8]) -> Result<(), Fault> {
        let offset = self.position;
        if block.iter().all(|&b| b == 0) {
            if self.pending.header_offset.is_some() {
                return Err(Fault::MetaWithoutMember);
            }
            // End of archive: what follows (a second zero block, a record's
            // padding) is not read.
            self.state = State::Done;
            return Ok(());
        }
        check_checksum(block)?;
        let typeflag = block[156];
        let header_size = parse_number(&block[124..136], "size")?;
        let size_bytes = match typeflag {
            b'x' | b'L' | b'K' | b'g' => header_size,
            _ => self.pending.size_bytes.unwrap_or(header_size),
        };
        let data_offset = offset + TAR_BLOCK_BYTES;
        let name = match typeflag {
            b'x' | b'L' | b'K' | b'g' => Vec::new(),
            _ => self
                .pending
                .path
                .take()
                .unwrap_or_else(|| ustar_name(block)),
        };
        if size_bytes > self.shard_bytes {
            return Err(Fault::LargerThanShard {
                name: lossy(&name),
                size_bytes,
                shard_bytes: self.shard_bytes,
            });
        }
        let end = data_offset.saturating_add(padded(size_bytes));
        if data_offset.saturating_add(size_bytes) > self.shard_bytes {
            return Err(Fault::TruncatedMember {
                name: lossy(&name),
                size_bytes,
                end,
                shard_bytes: self.shard_bytes,
            });
        }
        self.position = data_offset;
        match typeflag {
            b'x' | b'L' | b'K' | b'g' => {
                if size_bytes > META_BYTES_MAX {
                    return Err(Fault::MetaTooLarge {
                        size_bytes,
                        max: META_BYTES_MAX,
                    });
                }
                if typeflag != b'g' {
                    self.pending.header_offset.get_or_insert(offset);
                }
                self.state = State::Meta {
                    typeflag,
                    size_bytes,
                };
                return Ok(());
            }
            b'0' | b'\0' | b'7' => {
                if name.is_empty() || name.len() > NAME_BYTES_MAX {
                    return Err(Fault::BadName { len: name.len() });
                }
                let header_offset = self.pending.header_offset.unwrap_or(offset);
                self.index.members.push(TarMember {
                    header_offset,
                    data_offset,
                    size: size_bytes,
                    name,
                });
            }
            b'1'..=b'6' => {}
            other => {
                return Err(Fault::Unsupported {
                    name: lossy(&name),
                    typeflag: char::from(other),
                })
            }
        }
        self.pending = Pending::default();
        // Padding past the shard's end: the last member's data is whole,
        // but the archive is cut; its bytes are still served.
        self.state = State::Skip(end.min(self.shard_bytes.max(data_offset)) - data_offset);
        Ok(())
    }

    fn meta(&mut self, typeflag: u8, data: &[u8]) -> Result<(), Fault> {
        match typeflag {
            b'L' => {
                let end = memchr::memchr(0, data).unwrap_or(data.len());
                self.pending.path = Some(data[..end].to_vec());
            }
            b'x' => parse_pax(data, &mut self.pending)?,
            // 'K' (long link target) and 'g' (global pax) change no member's
            // name or size that ringfeed reads.
            _ => {}
        }
        Ok(())
    }
}

/// The name of a ustar (or old GNU) header: `prefix/name` when the
/// ustar prefix field is used.
fn ustar_name(block: &[u8]) -> Vec<u8> {
    let field = |range: std::ops::Range<usize>| {
        let bytes = &block[range];
        &bytes[..memchr::memchr(0, bytes).unwrap_or(bytes.len())]
    };
    let name = field(0..100);
    let is_ustar = &block[257..263] == b"ustar\0";
    let prefix = if is_ustar { field(345..500) } else { &[][..] };
    if prefix.is_empty() {
        name.to_vec()
    } else {
        let mut full = prefix.to_vec();
        full.push(b'/');
        full.extend_from_slice(name);
        full
    }
}

fn check_checksum(block: &[u8]) -> Result<(), Fault> {
    let stored = parse_number(&block[148..156], "checksum")? as i64;
    let spaces = 8 * i64::from(b' ');
    let unsigned: i64 = block.iter().map(|&b| i64::from(b)).sum::<i64>()
        - block[148..156].iter().map(|&b| i64::from(b)).sum::<i64>()
        + spaces;
    // Some old tars summed signed chars; both are accepted, as GNU tar does.
    let signed: i64 = block.iter().map(|&b| i64::from(b as i8)).sum::<i64>()
        - block[148..156]
            .iter()
            .map(|&b| i64::from(b as i8))
            .sum::<i64>()
        + spaces;
    if stored == unsigned || stored == signed {
        Ok(())
    } else {
        Err(Fault::BadChecksum {
            stored,
            computed: unsigned,
        })
    }
}

/// An octal field (NUL or space terminated, leading spaces allowed) or a
/// GNU base-256 one (high bit of the first byte set).
fn parse_number(field: &[u8], name: &'static str) -> Result<u64, Fault> {
    let bad = || Fault::BadNumber { field: name };
    if field.first().is_some_and(|&b| b & 0x80 != 0) {
        if field[0] & 0x40 != 0 {
            return Err(bad()); // negative
        }
        let mut value = u64::from(field[0] & 0x3f);
        for &b in &field[1..] {
            value = value
                .checked_mul(256)
                .and_then(|v| v.checked_add(u64::from(b)))
                .ok_or_else(bad)?;
        }
        return Ok(value);
    }
    let digits = field.iter().skip_while(|&&b| b == b' ');
    let mut value = 0u64;
    let mut any = false;
    for &b in digits {
        match b {
            b'0'..=b'7' => {
                value = value
                    .checked_mul(8)
                    .and_then(|v| v.checked_add(u64::from(b - b'0')))
                    .ok_or_else(bad)?;
                any = true;
            }
            b'\0' | b' ' => break,
            _ => return Err(bad()),
        }
    }
    if any {
        Ok(value)
    } else {
        Err(bad())
    }
}

/// Reads pax records (`"<len> <key>=<value>\n"`), keeping `path` and `size`.
fn parse_pax(mut data: &[u8], pending: &mut Pending) -> Result<(), Fault> {
    let bad = |what| Fault::BadPax { what };
    while !data.is_empty() {
        if data.iter().all(|&b| b == 0) {
            break;
        }
        let space = memchr::memchr(b' ', data).ok_or(bad("a record has no length"))?;
        let len: usize = std::str::from_utf8(&data[..space])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(bad("a record's length is not a number"))?;
        if len <= space + 1 || len > data.len() || data[len - 1] != b'\n' {
            return Err(bad("a record's length does not end it at a newline"));
        }
        let record = &data[space + 1..len - 1];
        let eq = memchr::memchr(b'=', record).ok_or(bad("a record has no '='"))?;
        let (key, value) = (&record[..eq], &record[eq + 1..]);
        match key {
            b"path" => pending.path = Some(value.to_vec()),
            b"size" => {
                let size = std::str::from_utf8(value)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or(bad("size is not a decimal number"))?;
                pending.size_bytes = Some(size);
            }
            _ => {}
        }
        data = &data[len..];
    }
    Ok(())
}

/// Scans a whole shard held in memory (tests, small shards).
pub fn scan_bytes(shard: &[u8]) -> Result<TarIndex, ScanError> {
    let mut scanner = Scanner::new(shard.len() as u64);
    loop {
        let at = scanner.position() as usize;
        match scanner.want()? {
            Want::Done => return Ok(scanner.finish()),
            Want::Skip(n) => scanner.skip(n),
            Want::Bytes(n) => scanner.take(&shard[at..at + n])?,
        }
    }
}

#[cfg(test)]
#[path = "scan_tests.rs"]
mod tests;
