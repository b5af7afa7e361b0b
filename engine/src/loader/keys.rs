//! Each published batch's sample keys, in its slot's key area
//! (`ring::layout::KeyArea`): what `batch.key(i)` and `rf_batch_key` read.
//! The key of a sample is its object's key relative to the source (and the
//! record's index in it, for `--record-bytes`), or a tar sample's key (its
//! first member's name before the extension, read from the sample's bytes
//! in the slot).

use crate::manifest::Manifest;
use crate::ring::layout::KeyArea;
use crate::ring::tar_fields::next_field;
use crate::ring::SampleEntry;
use crate::tar::split_key;

/// Writes the key of every sample of a batch into `payload`'s key area.
/// `samples` are where the readers put the samples' bytes (before a decode
/// stage moves them): a tar sample's key is read from them.
pub(super) fn write_keys(
    area: KeyArea,
    payload: &mut [u8],
    samples: &[SampleEntry],
    manifest: &Manifest,
) {
    let tar = manifest.sample_ranges().is_some();
    for (i, s) in samples.iter().enumerate() {
        // i < samples.len() <= max_samples_per_slot: a u32.
        let i = i as u32;
        if tar {
            let (prefix, key) = tar_key_parts(payload, s);
            let slash: &[u8] = if prefix.is_empty() { b"" } else { b"/" };
            // The parts borrow `payload`, which `write` changes: copied out
            // first (a key is short; its area is capped at 4 KiB).
            let mut key_bytes = Vec::with_capacity(prefix.len() + 1 + key.len());
            key_bytes.extend_from_slice(prefix);
            key_bytes.extend_from_slice(slash);
            key_bytes.extend_from_slice(key);
            area.write(payload, i, &[&key_bytes], None);
            continue;
        }
        let loc = manifest.sample(s.index);
        let record = manifest.record_bytes().map(|n| loc.offset_bytes / n.max(1));
        let key = manifest.files().path_bytes(loc.file as usize);
        area.write(payload, i, &[key], record);
    }
}

/// A tar sample's key as (ustar prefix, the rest of the key), read from its
/// bytes in `payload`; empty when they are not tar members (the decode
/// stage, or the trainer, says what is wrong with them).
fn tar_key_parts<'a>(payload: &'a [u8], s: &SampleEntry) -> (&'a [u8], &'a [u8]) {
    let raw = usize::try_from(s.offset)
        .ok()
        .zip(usize::try_from(s.offset.saturating_add(s.len)).ok())
        .and_then(|(a, b)| payload.get(a..b))
        .unwrap_or_default();
    let mut cursor = 0;
    match next_field(raw, &mut cursor) {
        Ok(Some(f)) if f.name_prefix.is_empty() => ((&[][..]), split_key(f.name).0),
        // A split ustar name: the key is prefix/name up to the extension,
        // and the extension lies in the name part.
        Ok(Some(f)) => (f.name_prefix, split_key(f.name).0),
        _ => (&[][..], &[][..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{FileList, ObjectNames};
    use std::path::PathBuf;

    struct Names;
    impl ObjectNames for Names {
        fn source_name(&self) -> PathBuf {
            "src".into()
        }
        fn object_name(&self, key: &[u8]) -> PathBuf {
            String::from_utf8_lossy(key).into_owned().into()
        }
    }

    fn read(area: KeyArea, payload: &[u8], i: usize) -> (String, Option<u64>) {
        let at = (area.offset + i as u64 * area.stride) as usize;
        let k = KeyArea::read(&payload[at..at + area.stride as usize]).unwrap();
        (String::from_utf8_lossy(k.key).into_owned(), k.record)
    }

    #[test]
    fn files_give_their_keys_and_records_their_key_and_index_in_the_file() {
        let mut files = FileList::new();
        files.push(b"a/first.bin", 12);
        files.push(b"b.bin", 8);
        let manifest = Manifest::from_objects(files, Some(4), &Names).unwrap();
        let area = KeyArea::plan(0, manifest.key_bytes_max());
        let mut payload = vec![0u8; area.end(3) as usize];
        let at = |index| SampleEntry {
            offset: 0,
            len: 4,
            index,
        };
        write_keys(area, &mut payload, &[at(4), at(0), at(2)], &manifest);
        assert_eq!(read(area, &payload, 0), ("b.bin".into(), Some(1)));
        assert_eq!(read(area, &payload, 1), ("a/first.bin".into(), Some(0)));
        assert_eq!(read(area, &payload, 2), ("a/first.bin".into(), Some(2)));
    }
}
