//! Arrays of little-endian integers read in place: a memory-mapped index
//! file (Megatron's `.idx`, datatrove's `.ds.index`) or bytes an index was
//! read or built into. Nothing is copied into per-document objects: a
//! column of 10 million documents is the file's own pages, which the
//! kernel maps and drops as it likes.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// Where a column's bytes are.
#[derive(Debug)]
pub enum Backing {
    /// A file mapped read-only.
    Mapped(memmap2::Mmap),
    /// Bytes in memory.
    Owned(Vec<u8>),
}

impl Backing {
    /// Maps `file` read-only. The file is the loader's to keep unchanged:
    /// an index that changes under a run would change its windows, which
    /// the readers' size checks do not see (docs/tokens.md says so).
    pub fn map(file: &File) -> io::Result<Backing> {
        let len = file.metadata()?.len();
        if len == 0 {
            // An empty mapping is refused by mmap; nothing to map anyway.
            return Ok(Backing::Owned(Vec::new()));
        }
        // SAFETY: a read-only private view of a file we opened; a file
        // changed underneath changes what we read (bounds-checked below,
        // never a memory error of ours: slices stay within the mapping's
        // length, fixed at map time), and a file truncated underneath would
        // fault on access, which the index formats' own readers accept too.
        // Index files are small beside the data and owned by the user who
        // starts the loader; docs/tokens.md states the rule.
        let map = unsafe { memmap2::MmapOptions::new().map(file)? };
        Ok(Backing::Mapped(map))
    }

    /// Opens and maps `path`.
    pub fn map_path(path: &Path) -> io::Result<Backing> {
        Backing::map(&File::open(path)?)
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// `len` little-endian integers of `width` bytes (4 or 8) at `offset` of a
/// backing; values are read as u64 (a signed column's negative values come
/// back huge, which every caller's checks refuse).
#[derive(Clone, Debug)]
pub struct Column {
    backing: Arc<Backing>,
    offset: usize,
    len: u64,
    width: usize,
}

/// A column that does not fit its backing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{len} values of {width} bytes at byte {offset} pass the end of its {available} bytes")]
pub struct ColumnOutside {
    /// Values claimed.
    pub len: u64,
    /// Their width.
    pub width: usize,
    /// Where they start.
    pub offset: u64,
    /// Bytes the backing has.
    pub available: u64,
}

impl Column {
    /// `len` values of `width` bytes (4 or 8) at `offset` of `backing`,
    /// refused if they do not lie inside it.
    pub fn new(
        backing: Arc<Backing>,
        offset: u64,
        len: u64,
        width: usize,
    ) -> Result<Column, ColumnOutside> {
        debug_assert!(width == 4 || width == 8);
        let available = backing.bytes().len() as u64;
        let fits = len
            .checked_mul(width as u64)
            .and_then(|b| b.checked_add(offset))
            .is_some_and(|end| end <= available);
        if !fits {
            return Err(ColumnOutside {
                len,
                width,
                offset,
                available,
            });
        }
        Ok(Column {
            backing,
            // Both fit in the mapping, so in usize.
            offset: offset as usize,
            len,
            width,
        })
    }

    /// A column of `values` in memory.
    pub fn owned(values: &[u64]) -> Column {
        let mut bytes = Vec::with_capacity(values.len() * 8);
        for v in values {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        Column {
            backing: Arc::new(Backing::Owned(bytes)),
            offset: 0,
            len: values.len() as u64,
            width: 8,
        }
    }

    /// Number of values.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Value `i`.
    ///
    /// # Panics
    /// If `i >= len()` (callers search within `len`).
    #[inline]
    pub fn get(&self, i: u64) -> u64 {
        assert!(i < self.len, "value {i} of a column of {}", self.len);
        let at = self.offset + i as usize * self.width;
        let b = &self.backing.bytes()[at..at + self.width];
        if self.width == 8 {
            u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
        } else {
            u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
    }

    /// A 4-byte column's value `i` as a signed 32-bit integer, widened
    /// (Megatron's sequence lengths are int32).
    #[inline]
    pub fn get_i32(&self, i: u64) -> i64 {
        i64::from(self.get(i) as u32 as i32)
    }

    /// The first `i` in `lo..hi` whose value is not below `value` (the
    /// column is ascending there), by binary search.
    pub fn lower_bound(&self, value: u64, lo: u64, hi: u64) -> u64 {
        let (mut lo, mut hi) = (lo, hi);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.get(mid) < value {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_column_past_its_bytes_is_refused_and_values_read_little_endian() {
        let mut bytes = Vec::new();
        for v in [1u32, 2, 0xFFFF_FFFF] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        let backing = Arc::new(Backing::Owned(bytes));
        let c = Column::new(Arc::clone(&backing), 0, 3, 4).unwrap();
        assert_eq!((c.get(0), c.get(2), c.get_i32(2)), (1, 0xFFFF_FFFF, -1));
        assert!(Column::new(Arc::clone(&backing), 4, 3, 4).is_err());
        assert!(Column::new(backing, u64::MAX, 2, 8).is_err());
        let o = Column::owned(&[3, 5, 5, 9]);
        assert_eq!(
            (
                o.lower_bound(5, 0, 4),
                o.lower_bound(6, 0, 4),
                o.lower_bound(10, 0, 4)
            ),
            (1, 3, 4)
        );
    }
}
