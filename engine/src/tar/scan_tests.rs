//! Tests of the header parser: crafted shards, hostile bytes.

use super::*;

proptest::proptest! {
    /// Hostile bytes end in an index or a fault, never a panic, and the
    /// members found always lie inside the shard.
    #[test]
    fn any_bytes_scan_to_an_index_or_a_fault(
        blocks in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 512), 0..6),
        cut in 0usize..3072,
    ) {
        let mut shard: Vec<u8> = blocks.concat();
        shard.truncate(cut.min(shard.len()));
        if let Ok(index) = scan_bytes(&shard) {
            for m in &index.members {
                proptest::prop_assert!(m.data_end() <= shard.len() as u64);
            }
        }
    }
}

/// A header for `name` of `size` bytes with its checksum filled in.
fn header(name: &[u8], size: u64, typeflag: u8) -> Vec<u8> {
    let mut h = vec![0u8; BLOCK];
    h[..name.len()].copy_from_slice(name);
    h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    h[156] = typeflag;
    h[257..263].copy_from_slice(b"ustar\0");
    fix_checksum(&mut h);
    h
}

fn fix_checksum(h: &mut [u8]) {
    h[148..156].copy_from_slice(b"        ");
    let sum: u64 = h[..BLOCK].iter().map(|&b| u64::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

/// A small valid shard: a pax member, a GNU long name, plain members.
fn shard() -> Vec<u8> {
    let mut t = Vec::new();
    let pad = |t: &mut Vec<u8>| t.resize(t.len().div_ceil(BLOCK) * BLOCK, 0);
    t.extend(header(b"0.jpg", 3, b'0'));
    t.extend_from_slice(b"abc");
    pad(&mut t);
    let record = b"20 path=p/1.seg.png\n";
    t.extend(header(b"PaxHeader", record.len() as u64, b'x'));
    t.extend_from_slice(record);
    pad(&mut t);
    t.extend(header(b"x", 700, b'0'));
    t.extend([7u8; 700]);
    pad(&mut t);
    t.extend(header(b"././@LongLink", 9, b'L'));
    t.extend_from_slice(b"long.name");
    pad(&mut t);
    t.extend(header(b"trunc", 0, b'0'));
    t.extend([0u8; 1024]);
    t
}

#[test]
fn pax_paths_and_gnu_long_names_name_the_member_that_follows() {
    let index = scan_bytes(&shard()).unwrap();
    let names: Vec<&[u8]> = index.members.iter().map(|m| m.name.as_slice()).collect();
    assert_eq!(names, [&b"0.jpg"[..], b"p/1.seg.png", b"long.name"]);
    assert_eq!(index.members[1].header_offset, 1024);
    assert_eq!(index.members[1].data_offset, 2560);
    assert_eq!(
        index.members[2].data_offset - index.members[2].header_offset,
        1536
    );
}

proptest::proptest! {
    /// A valid shard with one header byte changed (and its checksum
    /// made right again, as a buggy writer would): an index or a fault,
    /// never a panic, members inside the shard.
    #[test]
    fn a_header_field_changed_scans_to_an_index_or_a_fault(
        which in 0usize..5,
        at in 0usize..BLOCK,
        value in proptest::num::u8::ANY,
    ) {
        let mut t = shard();
        let headers = [0usize, 1024, 2048, 3584, 4608];
        let h = headers[which];
        if !(148..156).contains(&at) {
            t[h + at] = value;
            fix_checksum(&mut t[h..h + BLOCK]);
        }
        if let Ok(index) = scan_bytes(&t) {
            for m in &index.members {
                proptest::prop_assert!(m.data_end() <= t.len() as u64);
            }
        }
    }
}

#[test]
fn a_shard_that_is_all_zeros_is_an_empty_archive() {
    assert_eq!(scan_bytes(&[0u8; 10240]).unwrap().members, vec![]);
    assert_eq!(scan_bytes(&[]).unwrap().members, vec![]);
}

#[test]
fn base_256_sizes_and_space_padded_octal_are_numbers() {
    let mut field = [0u8; 12];
    field[0] = 0x80;
    field[11] = 7;
    field[10] = 1;
    assert_eq!(parse_number(&field, "size"), Ok(263));
    assert_eq!(parse_number(b"   0000017 \0", "size"), Ok(15));
    assert!(parse_number(b"12x\0", "size").is_err());
    assert!(parse_number(b"\0\0\0", "size").is_err());
}

/// The story: a posix-format shard cut inside the padding after a pax
/// header was reported at the next header's offset, past the shard's end,
/// and the streamed (remote) scan said the body ended early. Both now name
/// the pax header of the member that was cut.
#[test]
fn a_shard_cut_after_a_pax_header_is_truncated_at_that_header() {
    let t = shard();
    let cut = &t[..1536 + 100];
    let err = scan_bytes(cut).unwrap_err();
    assert_eq!(err.offset, 1024);
    assert!(
        matches!(err.fault, Fault::TruncatedHeader { .. }),
        "{err:?}"
    );
}
