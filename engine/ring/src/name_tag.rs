//! The loader's name, recorded in its ring's header, so that a trainer never
//! takes another loader's ring for its own.
//!
//! Anyone who can write /dev/shm can hard-link a file they cannot even read
//! when `fs.protected_hardlinks` is off (many containers): root's segment of
//! job A linked as `/dev/shm/ringfeed-B` is root's file, with A's live
//! loader lock, and root's trainer of B attached to it and trained on A's
//! batches (issue 36). A link under another name is the same file, so only
//! something inside it can tell: the loader writes a 128-bit FNV-1a digest
//! of its name at header offset [`NAME_TAG_OFFSET`] (bytes 1800–1815, before
//! READY) and a trainer attaching under name B refuses a ring whose digest
//! is not B's. Zero means a loader that predates the field: not checked.
//! (A count of links would refuse A's own trainers as soon as someone
//! linked A's ring anywhere; the name refuses only the wrong ones.)

/// Header offset of the name tag: two little-endian u64 words, the low and
/// the high half of the 128-bit FNV-1a digest of the loader's name.
pub const NAME_TAG_OFFSET: usize = 1800;
/// Its length.
pub const NAME_TAG_BYTES: usize = 16;

/// The tag of loader `name`: FNV-1a, 128 bits, of its bytes, as two words
/// (low, high). Never all zero for a valid name (1 to 64 bytes).
pub fn tag(name: &str) -> [u64; 2] {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let h = name
        .bytes()
        .fold(OFFSET, |h, b| (h ^ u128::from(b)).wrapping_mul(PRIME));
    [h as u64, (h >> 64) as u64]
}

/// Writes loader `name`'s tag into the header of the ring `view` maps
/// (while it is CREATING: the READY store's Release publishes it).
pub(crate) fn write(view: &crate::view::View, name: &str) {
    const _: () = assert!(NAME_TAG_OFFSET.is_multiple_of(8));
    const _: () = assert!(NAME_TAG_OFFSET + NAME_TAG_BYTES <= crate::layout::HEADER_BYTES as usize);
    for (i, word) in tag(name).into_iter().enumerate() {
        // SAFETY: the mapping is at least HEADER_BYTES long (asserted above
        // for this range) and lives as long as `view`; the offset is
        // 8-aligned in a page-aligned mapping; these bytes lie in the
        // header's reserved words, which are atomics no other code uses.
        let cell = unsafe {
            &*(view.base().add(NAME_TAG_OFFSET + 8 * i) as *const crate::sync::AtomicU64)
        };
        cell.store(word, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The tag recorded in a header's bytes (at least [`NAME_TAG_OFFSET`] +
/// [`NAME_TAG_BYTES`] long); `None` when it is zero (an older loader).
pub fn recorded(header: &[u8]) -> Option<[u64; 2]> {
    let word = |o: usize| {
        let mut le = [0u8; 8];
        le.copy_from_slice(header.get(o..o + 8)?);
        Some(u64::from_le_bytes(le))
    };
    let tag = [word(NAME_TAG_OFFSET)?, word(NAME_TAG_OFFSET + 8)?];
    (tag != [0, 0]).then_some(tag)
}

/// Whether a header's bytes may be loader `name`'s ring: its tag is
/// `name`'s, or it records none.
pub fn matches(header: &[u8], name: &str) -> bool {
    recorded(header).is_none_or(|t| t == tag(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_is_fnv1a_128_and_tells_names_apart() {
        // FNV-1a 128 of "" is its offset basis; of "a", the published value.
        assert_eq!(tag(""), [0x62b8_2175_6295_c58d, 0x6c62_272e_07bb_0142]);
        assert_eq!(tag("a"), [0x7891_2b70_4e4a_8964, 0xd228_cb69_6f1a_8caf]);
        assert_ne!(tag("job-a"), tag("job-b"));
        let mut header = vec![0u8; 4096];
        assert!(matches(&header, "anything"));
        let t = tag("job-a");
        header[NAME_TAG_OFFSET..NAME_TAG_OFFSET + 8].copy_from_slice(&t[0].to_le_bytes());
        header[NAME_TAG_OFFSET + 8..NAME_TAG_OFFSET + 16].copy_from_slice(&t[1].to_le_bytes());
        assert!(matches(&header, "job-a"));
        assert!(!matches(&header, "job-b"));
        assert_eq!(recorded(&header[..100]), None);
    }
}
