//! One cache entry on disk: the object's bytes at offset 0, then a fixed
//! 64-byte footer. Byte by byte (all integers little-endian):
//!
//! | offset from footer start | bytes | field |
//! |---|---|---|
//! | 0  | 8 | magic `RFDATA\0\x01` |
//! | 8  | 4 | format version ([`FORMAT_VERSION`]) |
//! | 12 | 4 | CRC32C of the object bytes |
//! | 16 | 8 | object size in bytes |
//! | 24 | 8 | FNV-1a 64 of the object's key |
//! | 32 | 8 | FNV-1a 64 of the object's ETag |
//! | 40 | 20 | zero (reserved) |
//! | 60 | 4 | CRC32C of footer bytes 0..60 |
//!
//! The file's name is a hash of (key, ETag, size) and its size (object +
//! footer): `<hh>/<16 hex>-<file bytes>`, so a changed object (a new ETag or
//! size) maps to another name and never to an old entry, and a directory
//! scan learns every entry's size from its name alone.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Bytes of the footer after an object's bytes.
pub const FOOTER_BYTES: u64 = 64;
/// First 8 bytes of a footer.
pub const MAGIC: [u8; 8] = *b"RFDATA\0\x01";
/// Version of the entry format; another version is not read.
pub const FORMAT_VERSION: u32 = 1;

const _: () = assert!(FOOTER_BYTES == 64);
const _: () = assert!(8 + 4 + 4 + 8 + 8 + 8 + 20 + 4 == FOOTER_BYTES as usize);

/// FNV-1a, 64 bits (stable across versions: it names files on disk).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What ties an entry to one version of one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// FNV-1a 64 of the key.
    pub key_hash: u64,
    /// FNV-1a 64 of the ETag.
    pub etag_hash: u64,
    /// Object bytes.
    pub size: u64,
}

impl Identity {
    /// The identity of `key` at `etag` with `size` bytes.
    pub fn of(key: &str, etag: &str, size: u64) -> Identity {
        Identity {
            key_hash: fnv1a64(key.as_bytes()),
            etag_hash: fnv1a64(bare_etag(etag).as_bytes()),
            size,
        }
    }

    /// The entry's path relative to the dataset directory:
    /// `<hh>/<16 hex>-<file bytes>`, the hash over key, ETag and size.
    pub fn rel_path(&self) -> String {
        let mut buf = [0u8; 24];
        buf[..8].copy_from_slice(&self.key_hash.to_le_bytes());
        buf[8..16].copy_from_slice(&self.etag_hash.to_le_bytes());
        buf[16..].copy_from_slice(&self.size.to_le_bytes());
        let h = fnv1a64(&buf);
        format!("{:02x}/{h:016x}-{}", h >> 56, self.file_bytes())
    }

    /// Bytes of the entry file: the object and the footer.
    pub fn file_bytes(&self) -> u64 {
        self.size.saturating_add(FOOTER_BYTES)
    }
}

/// An ETag without quotes or a weak mark, as `remote::part` compares them.
fn bare_etag(tag: &str) -> &str {
    tag.trim().trim_start_matches("W/").trim_matches('"')
}

/// The size an entry's file name states (`<16 hex>-<bytes>`), or None for a
/// name that is not an entry's.
pub fn file_bytes_of_name(name: &str) -> Option<u64> {
    let (hash, bytes) = name.split_once('-')?;
    if hash.len() != 16 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    bytes.parse().ok().filter(|&b| b >= FOOTER_BYTES)
}

/// The footer of an object of identity `id` whose bytes have CRC32C `crc`.
pub fn encode_footer(id: &Identity, crc: u32) -> [u8; FOOTER_BYTES as usize] {
    let mut f = [0u8; FOOTER_BYTES as usize];
    f[0..8].copy_from_slice(&MAGIC);
    f[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    f[12..16].copy_from_slice(&crc.to_le_bytes());
    f[16..24].copy_from_slice(&id.size.to_le_bytes());
    f[24..32].copy_from_slice(&id.key_hash.to_le_bytes());
    f[32..40].copy_from_slice(&id.etag_hash.to_le_bytes());
    let own = crc32c::crc32c(&f[..60]);
    f[60..64].copy_from_slice(&own.to_le_bytes());
    f
}

/// Why a footer is not the one expected.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FooterError {
    /// Not an entry of this format (or torn).
    #[error("not a ringfeed cache entry footer (bad magic, version or footer checksum)")]
    Corrupt,
    /// An entry of another object or version (a hash collision on the name).
    #[error("footer names another object (size {size}, key hash {key_hash:016x})")]
    Other {
        /// The size it states.
        size: u64,
        /// The key hash it states.
        key_hash: u64,
    },
}

/// Checks `footer` against `expected` and returns the data's CRC32C.
pub fn decode_footer(footer: &[u8], expected: &Identity) -> Result<u32, FooterError> {
    let word = |r: std::ops::Range<usize>| -> u64 {
        let mut b = [0u8; 8];
        b[..r.len()].copy_from_slice(&footer[r]);
        u64::from_le_bytes(b)
    };
    if footer.len() != FOOTER_BYTES as usize
        || footer[0..8] != MAGIC
        || word(8..12) != u64::from(FORMAT_VERSION)
        || word(60..64) != u64::from(crc32c::crc32c(&footer[..60]))
    {
        return Err(FooterError::Corrupt);
    }
    let found = Identity {
        size: word(16..24),
        key_hash: word(24..32),
        etag_hash: word(32..40),
    };
    if found != *expected {
        return Err(FooterError::Other {
            size: found.size,
            key_hash: found.key_hash,
        });
    }
    // The CRC field is 4 bytes: it fits.
    Ok(word(12..16) as u32)
}

/// Reads and checks the footer of the entry `file` (already open), whose
/// length must be the identity's file bytes.
pub fn read_footer(file: &File, expected: &Identity) -> io::Result<Result<u32, FooterError>> {
    let len = file.metadata()?.len();
    if len != expected.file_bytes() {
        return Ok(Err(FooterError::Corrupt));
    }
    let mut footer = [0u8; FOOTER_BYTES as usize];
    file.read_exact_at(&mut footer, expected.size)?;
    Ok(decode_footer(&footer, expected))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_footer_reads_back_the_checksum_it_was_written_with() {
        let id = Identity::of("a/b.jpg", "\"abc\"", 1234);
        let f = encode_footer(&id, 0xdead_beef);
        assert_eq!(decode_footer(&f, &id), Ok(0xdead_beef));
    }

    #[test]
    fn any_flipped_footer_bit_is_caught() {
        let id = Identity::of("k", "e", 7);
        let f = encode_footer(&id, 42);
        for bit in 0..(FOOTER_BYTES as usize * 8) {
            let mut g = f;
            g[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_footer(&g, &id).is_err(), "bit {bit} went unnoticed");
        }
    }

    #[test]
    fn a_new_etag_or_size_maps_to_another_entry_name() {
        let a = Identity::of("k", "\"v1\"", 10);
        assert_ne!(a.rel_path(), Identity::of("k", "\"v2\"", 10).rel_path());
        assert_ne!(a.rel_path(), Identity::of("k", "\"v1\"", 11).rel_path());
        assert_ne!(a.rel_path(), Identity::of("k2", "\"v1\"", 10).rel_path());
        // Quoting is not part of the version (Azure lists tags bare).
        assert_eq!(a.rel_path(), Identity::of("k", "v1", 10).rel_path());
    }

    #[test]
    fn an_entry_name_states_its_file_size() {
        let id = Identity::of("k", "e", 100);
        let rel = id.rel_path();
        let name = rel.split('/').nth(1).unwrap();
        assert_eq!(file_bytes_of_name(name), Some(100 + FOOTER_BYTES));
        assert_eq!(file_bytes_of_name(".tmp.1.2"), None);
        assert_eq!(file_bytes_of_name("source"), None);
    }

    #[test]
    fn a_footer_of_another_object_is_refused() {
        let a = Identity::of("k", "e", 100);
        let b = Identity::of("k", "e", 101);
        let f = encode_footer(&a, 1);
        assert!(matches!(
            decode_footer(&f, &b),
            Err(FooterError::Other { size: 100, .. })
        ));
    }
}
