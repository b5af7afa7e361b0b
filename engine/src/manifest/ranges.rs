//! Ranges mode: each sample is a byte range of one object, listed one by
//! one (a tar shard's samples: docs/shards.md). Three flat arrays, no
//! allocation per sample: 20 bytes a sample.

use std::path::PathBuf;
use std::sync::Arc;

use super::{FileList, Manifest, ManifestError, ObjectNames, SampleLoc, MAX_FILES};

/// Every sample's object, offset and length, in sample order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SampleRanges {
    object: Vec<u32>,
    offset_bytes: Vec<u64>,
    len_bytes: Vec<u64>,
}

impl SampleRanges {
    /// No samples yet.
    pub fn new() -> SampleRanges {
        SampleRanges::default()
    }

    /// Appends a sample: `len_bytes` bytes at `offset_bytes` of object
    /// `object` (an index into the manifest's objects).
    pub fn push(&mut self, object: u32, offset_bytes: u64, len_bytes: u64) {
        self.object.push(object);
        self.offset_bytes.push(offset_bytes);
        self.len_bytes.push(len_bytes);
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.object.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.object.is_empty()
    }

    /// Sample `index`.
    ///
    /// # Panics
    /// If `index >= len()`.
    #[inline]
    pub fn get(&self, index: usize) -> SampleLoc {
        SampleLoc {
            file: self.object[index],
            offset_bytes: self.offset_bytes[index],
            len_bytes: self.len_bytes[index],
        }
    }

    /// Every sample's object, in sample order.
    pub fn objects(&self) -> &[u32] {
        &self.object
    }

    /// Every sample's offset, in sample order.
    pub fn offsets_bytes(&self) -> &[u64] {
        &self.offset_bytes
    }

    /// Every sample's length, in sample order.
    pub fn lens_bytes(&self) -> &[u64] {
        &self.len_bytes
    }
}

impl Manifest {
    /// The manifest of samples that are byte ranges of `files` (ranges
    /// mode). Refused: no sample, a range outside its object, more than
    /// `MAX_FILES` objects. `total_bytes` is then the samples' bytes (what
    /// an epoch reads), not the objects'.
    pub fn from_ranges(
        files: FileList,
        ranges: SampleRanges,
        names: &dyn ObjectNames,
    ) -> Result<Manifest, ManifestError> {
        if files.len() as u64 > MAX_FILES {
            return Err(ManifestError::TooManyFiles {
                path: names.source_name(),
                max: MAX_FILES,
            });
        }
        if ranges.is_empty() {
            return Err(ManifestError::Empty {
                path: names.source_name(),
            });
        }
        let mut total_bytes = 0u64;
        let mut max_sample_bytes = 0u64;
        for i in 0..ranges.len() {
            let loc = ranges.get(i);
            let fits = (loc.file as usize) < files.len()
                && loc
                    .offset_bytes
                    .checked_add(loc.len_bytes)
                    .is_some_and(|end| end <= files.size_bytes(loc.file as usize));
            if !fits {
                return Err(ManifestError::RangeOutside {
                    index: i as u64,
                    offset_bytes: loc.offset_bytes,
                    len_bytes: loc.len_bytes,
                    path: object_or_source(&files, loc.file, names),
                });
            }
            // Ranges lie inside objects whose sizes sum below 2^64 when
            // they do not overlap; saturate for those that do.
            total_bytes = total_bytes.saturating_add(loc.len_bytes);
            max_sample_bytes = max_sample_bytes.max(loc.len_bytes);
        }
        Ok(Manifest {
            files: Arc::new(files),
            record_bytes: None,
            first_record: Vec::new(),
            len: ranges.len() as u64,
            ranges: Some(Arc::new(ranges)),
            key_facts: None,
            windows: None,
            total_bytes,
            max_sample_bytes,
        })
    }

    /// Every sample's range, in ranges mode.
    pub fn sample_ranges(&self) -> Option<&SampleRanges> {
        self.ranges.as_deref()
    }
}

/// Object `file` as messages name it, or the source when there is no such object.
fn object_or_source(files: &FileList, file: u32, names: &dyn ObjectNames) -> PathBuf {
    if (file as usize) < files.len() {
        names.object_name(files.path_bytes(file as usize))
    } else {
        names.source_name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    struct At;

    impl ObjectNames for At {
        fn source_name(&self) -> PathBuf {
            PathBuf::from("/data")
        }
        fn object_name(&self, key: &[u8]) -> PathBuf {
            Path::new("/data").join(std::str::from_utf8(key).unwrap())
        }
    }

    fn shards() -> FileList {
        let mut files = FileList::new();
        files.push(b"a.tar", 4096);
        files.push(b"b.tar", 2048);
        files
    }

    #[test]
    fn samples_are_the_ranges_given_and_slots_are_sized_from_them() {
        let mut ranges = SampleRanges::new();
        ranges.push(0, 0, 1500);
        ranges.push(0, 2048, 600);
        ranges.push(1, 0, 2048);
        let m = Manifest::from_ranges(shards(), ranges, &At).unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(
            m.sample(1),
            SampleLoc {
                file: 0,
                offset_bytes: 2048,
                len_bytes: 600
            }
        );
        assert_eq!((m.total_bytes(), m.max_sample_bytes()), (4148, 2048));
        assert_eq!(m.largest_samples_total_bytes(2), 3548);
        assert_eq!(m.record_bytes(), None);
        // Another range, another dataset.
        let mut moved = SampleRanges::new();
        moved.push(0, 0, 1500);
        moved.push(0, 2560, 600);
        moved.push(1, 0, 2048);
        assert_ne!(
            Manifest::from_ranges(shards(), moved, &At)
                .unwrap()
                .digest(),
            m.digest()
        );
    }

    #[test]
    fn a_range_outside_its_object_is_refused_naming_it() {
        let mut ranges = SampleRanges::new();
        ranges.push(1, 1024, 1025);
        match Manifest::from_ranges(shards(), ranges, &At) {
            Err(ManifestError::RangeOutside { index: 0, path, .. }) => {
                assert_eq!(path, Path::new("/data/b.tar"))
            }
            other => panic!("expected RangeOutside, got {other:?}"),
        }
        let mut ranges = SampleRanges::new();
        ranges.push(7, 0, 1);
        assert!(matches!(
            Manifest::from_ranges(shards(), ranges, &At),
            Err(ManifestError::RangeOutside { .. })
        ));
        assert!(matches!(
            Manifest::from_ranges(shards(), SampleRanges::new(), &At),
            Err(ManifestError::Empty { .. })
        ));
    }
}
