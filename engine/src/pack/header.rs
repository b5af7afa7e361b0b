//! Deterministic tar headers for `ringfeed pack`: ustar, mode 0644, uid and
//! gid 0, mtime 0, no user or group names; a pax `x` header carries a name
//! longer than 100 bytes or with a non-ASCII byte (and a size past the
//! ustar field's 8 GiB). The same name and size always give the same bytes.

use crate::tar::index::TAR_BLOCK_BYTES;

/// Longest name the ustar `name` field holds (with no NUL after it).
const USTAR_NAME_BYTES: usize = 100;

/// Largest size the 11 octal digits of the ustar `size` field hold.
const USTAR_SIZE_MAX: u64 = (1 << 33) - 1;

/// Name of the pax extended header's own block (as Python's tarfile writes it).
const PAX_HEADER_NAME: &[u8] = b"././@PaxHeader";

/// Bytes of tar padding after `size` content bytes, up to the next block.
pub fn padding(size: u64) -> u64 {
    (TAR_BLOCK_BYTES - size % TAR_BLOCK_BYTES) % TAR_BLOCK_BYTES
}

/// Whether a member of this name and size needs a pax header.
fn needs_pax(name: &[u8], size: u64) -> bool {
    name.len() > USTAR_NAME_BYTES || !name.is_ascii() || size > USTAR_SIZE_MAX
}

/// The header blocks of a regular-file member (`pax` header and its data
/// first, where one is needed), a whole number of 512-byte blocks.
pub fn member_header(name: &[u8], size: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(TAR_BLOCK_BYTES as usize);
    if needs_pax(name, size) {
        let mut records = Vec::new();
        if std::str::from_utf8(name).is_err() {
            // pax says names are UTF-8; this one is raw bytes (a Linux file
            // name may be any bytes), so say so: tar readers then take the
            // bytes as they are.
            pax_record(&mut records, b"hdrcharset", b"BINARY");
        }
        pax_record(&mut records, b"path", name);
        if size > USTAR_SIZE_MAX {
            pax_record(&mut records, b"size", size.to_string().as_bytes());
        }
        out.extend_from_slice(&ustar_block(PAX_HEADER_NAME, records.len() as u64, b'x'));
        out.extend_from_slice(&records);
        out.resize(out.len() + padding(records.len() as u64) as usize, 0);
    }
    out.extend_from_slice(&ustar_block(&fallback_name(name), size, b'0'));
    out
}

/// Bytes of [`member_header`] for this name and size, without building it.
pub fn member_header_bytes(name: &[u8], size: u64) -> u64 {
    // Cheap enough to build: names are short, and this runs once per member.
    member_header(name, size).len() as u64
}

/// The name a reader that ignores pax sees: the first 100 bytes, with
/// every non-ASCII byte as '_'.
fn fallback_name(name: &[u8]) -> Vec<u8> {
    name.iter()
        .take(USTAR_NAME_BYTES)
        .map(|&b| if b.is_ascii() { b } else { b'_' })
        .collect()
}

/// Appends the pax record `"<len> <key>=<value>\n"`, whose decimal length
/// counts its own digits.
fn pax_record(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    let body = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = body + 1;
    while len != body + len.to_string().len() {
        len = body + len.to_string().len();
    }
    out.extend_from_slice(len.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(key);
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
}

/// One ustar header block. `name` is at most 100 bytes; a `size` past the
/// field's range is written as 0 (the pax `size` record before it rules).
fn ustar_block(name: &[u8], size: u64, typeflag: u8) -> [u8; 512] {
    let mut b = [0u8; 512];
    b[..name.len()].copy_from_slice(name);
    octal(&mut b[100..108], 0o644);
    octal(&mut b[108..116], 0);
    octal(&mut b[116..124], 0);
    octal(
        &mut b[124..136],
        if size > USTAR_SIZE_MAX { 0 } else { size },
    );
    octal(&mut b[136..148], 0);
    b[156] = typeflag;
    b[257..263].copy_from_slice(b"ustar\0");
    b[263..265].copy_from_slice(b"00");
    octal(&mut b[329..337], 0);
    octal(&mut b[337..345], 0);
    // The checksum is the sum of the header's bytes with its own field
    // read as 8 spaces; written as 6 octal digits, NUL, space.
    b[148..156].copy_from_slice(b"        ");
    let sum: u32 = b.iter().map(|&x| u32::from(x)).sum();
    let digits = format!("{sum:06o}");
    b[148..154].copy_from_slice(digits.as_bytes());
    b[154] = 0;
    b[155] = b' ';
    b
}

/// Writes `value` as zero-padded octal digits and a NUL into `field`.
fn octal(field: &mut [u8], value: u64) {
    let width = field.len() - 1;
    let digits = format!("{value:0width$o}");
    field[..width].copy_from_slice(&digits.as_bytes()[digits.len() - width..]);
    field[width] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_ascii_name_gets_one_ustar_block_with_a_valid_checksum() {
        let h = member_header(b"a/b/000123.jpg", 5000);
        assert_eq!(h.len(), 512);
        assert_eq!(&h[..14], b"a/b/000123.jpg");
        assert_eq!(&h[124..136], b"00000011610\0");
        let stored = u32::from_str_radix(std::str::from_utf8(&h[148..154]).unwrap(), 8).unwrap();
        let mut copy = h.clone();
        copy[148..156].copy_from_slice(b"        ");
        assert_eq!(stored, copy.iter().map(|&x| u32::from(x)).sum::<u32>());
    }

    #[test]
    fn a_long_or_non_ascii_name_goes_in_a_pax_record_that_counts_its_own_length() {
        let long = vec![b'x'; 150];
        let h = member_header(&long, 1);
        assert_eq!(h.len(), 3 * 512);
        assert_eq!(h[156], b'x');
        let record = b"160 path=";
        assert_eq!(&h[512..512 + record.len()], record);
        let h = member_header("é.txt".as_bytes(), 1);
        assert_eq!(&h[512..512 + 15], "15 path=é.txt\n".as_bytes());
        assert_eq!(
            &h[1024..1031],
            b"__.txt\0",
            "the fallback name of a pax member"
        );
        assert_eq!(member_header(b"y", 1).len(), 512);
        assert_eq!(padding(0), 0);
        assert_eq!(padding(1), 511);
        assert_eq!(padding(512), 0);
    }

    #[test]
    fn a_name_of_raw_bytes_is_marked_binary() {
        let h = member_header(b"caf\xe9.txt", 0);
        assert_eq!(&h[512..512 + 22], b"21 hdrcharset=BINARY\n1");
    }
}
