//! Millions of paths and sizes in a handful of allocations.

use std::ffi::{CStr, OsStr};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Files and their sizes, stored end to end: every path in one buffer, each
/// followed by a NUL byte (so that it goes to `openat` as it is), where each
/// path ends, and the sizes.
///
/// A file costs its path's length plus 17 bytes: a million files with
/// 15-byte paths take 32 MB in three allocations. As a `PathBuf` and a size
/// each, with the readers' own copy of the names, the same million took
/// 97 MiB of the loader's memory and 0.2 s to read back from the manifest
/// cache (most of it a million allocations and first touches of fresh
/// heap pages). The manifest and the readers share one list (`Arc`).
///
/// Invariant: no path holds a NUL byte (`push` refuses one; `from_names`
/// splits on them).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct FileList {
    /// Every path, NUL-terminated, end to end.
    names: Vec<u8>,
    /// Where each path's NUL terminator ends in `names` (one past it).
    ends: Vec<u64>,
    sizes: Vec<u64>,
}

/// One file of a [`FileList`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileRef<'a> {
    /// The path as stored (relative to the manifest root in a manifest).
    pub rel_path: &'a Path,
    /// Size when listed (the target's size for a link to a file).
    pub size_bytes: u64,
}

impl FileList {
    /// An empty list.
    pub fn new() -> FileList {
        FileList::default()
    }

    /// An empty list with room for `files` paths of `path_bytes` bytes in
    /// all (terminators not counted).
    pub fn with_capacity(files: usize, path_bytes: usize) -> FileList {
        FileList {
            names: Vec::with_capacity(path_bytes + files),
            ends: Vec::with_capacity(files),
            sizes: Vec::with_capacity(files),
        }
    }

    /// The list of `names` (paths, each followed by a NUL byte, end to end)
    /// and `sizes`; `Err` says why they do not make one.
    pub fn from_names(names: Vec<u8>, sizes: Vec<u64>) -> Result<FileList, String> {
        if !names.is_empty() && names.last() != Some(&0) {
            return Err("the last path has no NUL terminator".into());
        }
        let mut ends = Vec::with_capacity(sizes.len());
        for at in memchr::memchr_iter(0, &names) {
            if ends.len() == sizes.len() {
                return Err(format!("more paths than the {} sizes", sizes.len()));
            }
            ends.push(at as u64 + 1);
        }
        if ends.len() != sizes.len() {
            return Err(format!("{} paths but {} sizes", ends.len(), sizes.len()));
        }
        Ok(FileList { names, ends, sizes })
    }

    /// Appends `path` with `size_bytes`.
    ///
    /// # Panics
    /// If `path` holds a NUL byte (no file system path does).
    pub fn push(&mut self, path: &[u8], size_bytes: u64) {
        self.push_joined(&[], path, size_bytes);
    }

    /// Appends `dir/name` (`name` alone when `dir` is empty) with
    /// `size_bytes`, without building the joined path first.
    ///
    /// # Panics
    /// If `dir` or `name` holds a NUL byte.
    pub fn push_joined(&mut self, dir: &[u8], name: &[u8], size_bytes: u64) {
        assert!(!dir.contains(&0) && !name.contains(&0), "a path holds a NUL byte: {:?}/{:?}", OsStr::from_bytes(dir), OsStr::from_bytes(name));
        if !dir.is_empty() {
            self.names.extend_from_slice(dir);
            self.names.push(b'/');
        }
        self.push_unchecked(name, size_bytes);
    }

    /// Appends every file of `other`.
    pub fn append(&mut self, other: &FileList) {
        let base = self.names.len() as u64;
        self.names.extend_from_slice(&other.names);
        self.ends.extend(other.ends.iter().map(|end| base + end));
        self.sizes.extend_from_slice(&other.sizes);
    }

    /// The same files, sorted by the bytes of their paths (manifest order).
    /// Takes the list by value: the copy and the original are both alive
    /// only while the sorted one is filled.
    ///
    /// # Panics
    /// With more than `u32::MAX` files (a manifest holds fewer).
    pub fn sorted(self) -> FileList {
        let n = u32::try_from(self.len()).expect("at most u32::MAX files to sort");
        let mut order: Vec<u32> = (0..n).collect();
        order.sort_unstable_by(|&a, &b| self.path_bytes(a as usize).cmp(self.path_bytes(b as usize)));
        let mut sorted = FileList::with_capacity(self.len(), self.names.len() - self.len());
        for &i in &order {
            sorted.push_unchecked(self.path_bytes(i as usize), self.sizes[i as usize]);
        }
        sorted
    }

    /// `push` for a path known to hold no NUL byte (checked by the caller,
    /// or taken from this type); ends the path begun in `names`.
    fn push_unchecked(&mut self, path: &[u8], size_bytes: u64) {
        self.names.extend_from_slice(path);
        self.names.push(0);
        self.ends.push(self.names.len() as u64);
        self.sizes.push(size_bytes);
    }

    /// Number of files.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    /// True when there is no file.
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    /// File `i`.
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn get(&self, i: usize) -> FileRef<'_> {
        FileRef { rel_path: self.path(i), size_bytes: self.sizes[i] }
    }

    /// Every file, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = FileRef<'_>> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    /// Every path's bytes (without the terminator), in order.
    pub fn paths_bytes(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let path = &self.names[start..end as usize - 1];
            start = end as usize;
            path
        })
    }

    /// Path of file `i`.
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn path(&self, i: usize) -> &Path {
        Path::new(OsStr::from_bytes(self.path_bytes(i)))
    }

    /// Bytes of file `i`'s path, without the terminator.
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn path_bytes(&self, i: usize) -> &[u8] {
        let with_nul = self.path_with_nul(i);
        &with_nul[..with_nul.len() - 1]
    }

    /// File `i`'s path as a C string.
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn c_path(&self, i: usize) -> &CStr {
        // SAFETY: no path holds a NUL byte (the type's invariant) and each
        // is followed by exactly one, so this is a path and its terminator.
        // (The checked version scanned the path on every open: 1.8 % of the
        // loader's CPU.)
        unsafe { CStr::from_bytes_with_nul_unchecked(self.path_with_nul(i)) }
    }

    fn path_with_nul(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.names[start..self.ends[i] as usize]
    }

    /// Size of file `i`.
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn size_bytes(&self, i: usize) -> u64 {
        self.sizes[i]
    }

    /// Every file's size, in order.
    pub fn sizes(&self) -> &[u64] {
        &self.sizes
    }

    /// Every path with its NUL terminator, end to end (what `from_names`
    /// takes back).
    pub fn names(&self) -> &[u8] {
        &self.names
    }
}

impl fmt::Debug for FileList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 8;
        let mut list = f.debug_list();
        list.entries(self.iter().take(SHOWN).map(|file| (file.rel_path, file.size_bytes)));
        if self.len() > SHOWN {
            list.entry(&format_args!("... {} files in all", self.len()));
        }
        list.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_sizes_read_back_in_order() {
        let mut list = FileList::new();
        list.push(b"b/x", 3);
        list.push_joined(b"a", b"y", 0);
        list.push_joined(b"", b"z", 7);
        assert_eq!(list.len(), 3);
        assert_eq!(list.path(1), Path::new("a/y"));
        assert_eq!(list.c_path(2).to_bytes(), b"z");
        assert_eq!(list.get(0), FileRef { rel_path: Path::new("b/x"), size_bytes: 3 });
        let sorted = list.clone().sorted();
        let paths: Vec<&Path> = sorted.iter().map(|f| f.rel_path).collect();
        assert_eq!(paths, [Path::new("a/y"), Path::new("b/x"), Path::new("z")]);
        assert_eq!(sorted.sizes(), [0, 3, 7]);
        assert_eq!(FileList::from_names(sorted.names().to_vec(), sorted.sizes().to_vec()), Ok(sorted));
    }

    #[test]
    fn append_keeps_both_lists_whole() {
        let mut a = FileList::new();
        a.push(b"one", 1);
        let mut b = FileList::new();
        b.push(b"two", 2);
        b.push(b"three", 3);
        a.append(&b);
        let all: Vec<(&Path, u64)> = a.iter().map(|f| (f.rel_path, f.size_bytes)).collect();
        assert_eq!(all, [(Path::new("one"), 1), (Path::new("two"), 2), (Path::new("three"), 3)]);
    }

    #[test]
    fn names_without_matching_sizes_are_refused() {
        assert!(FileList::from_names(b"a\0b\0".to_vec(), vec![1]).is_err());
        assert!(FileList::from_names(b"a\0b".to_vec(), vec![1, 2]).is_err());
        assert!(FileList::from_names(b"a\0".to_vec(), vec![1, 2]).is_err());
        assert_eq!(FileList::from_names(Vec::new(), Vec::new()), Ok(FileList::new()));
    }

    #[test]
    #[should_panic(expected = "NUL")]
    fn a_path_with_a_nul_byte_is_refused() {
        FileList::new().push(b"a\0b", 1);
    }
}
