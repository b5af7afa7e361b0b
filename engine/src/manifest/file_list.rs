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
        let ends = ends_of(&names, sizes.len() + 1);
        if ends.len() > sizes.len() {
            return Err(format!("more paths than the {} sizes", sizes.len()));
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
        assert!(
            !dir.contains(&0) && !name.contains(&0),
            "a path holds a NUL byte: {:?}/{:?}",
            OsStr::from_bytes(dir),
            OsStr::from_bytes(name)
        );
        if !dir.is_empty() {
            self.names.extend_from_slice(dir);
            self.names.push(b'/');
        }
        self.push_unchecked(name, size_bytes);
    }

    /// The same files, sorted by the bytes of their paths (manifest order).
    ///
    /// # Panics
    /// With more than `u32::MAX` files (a manifest holds fewer).
    pub fn sorted(self) -> FileList {
        FileList::sorted_union(vec![self])
    }

    /// Every file of `parts` (a walk's threads' lists), sorted by the bytes
    /// of their paths (manifest order), in one list.
    ///
    /// The parts are never joined: their sizes are freed once the sorted
    /// sizes are built, the rest once the paths are copied in order. Alive
    /// at the peak are the parts' paths and ends, a u32 per file for the
    /// order, the sorted sizes and the sorted paths, i.e. the paths twice
    /// plus 20 bytes a file. Joining the parts first and
    /// then sorting into a copy kept the paths twice plus 36 bytes a file
    /// (72 MiB of the loader's memory listing a million files).
    ///
    /// # Panics
    /// With more than `u32::MAX` files (a manifest holds fewer).
    pub fn sorted_union(mut parts: Vec<FileList>) -> FileList {
        parts.retain(|p| !p.is_empty());
        let total: usize = parts.iter().map(FileList::len).sum();
        let n = u32::try_from(total).expect("at most u32::MAX files to sort");
        // firsts[k]: the number, across all parts, of part k's first file.
        let firsts: Vec<u32> = parts
            .iter()
            .scan(0u32, |next, p| {
                Some(std::mem::replace(next, *next + p.len() as u32))
            })
            .collect();
        let mut order: Vec<u32> = (0..n).collect();
        {
            let path = |f: u32| {
                let (k, i) = locate(&firsts, f);
                parts[k].path_bytes(i)
            };
            order.sort_unstable_by(|&a, &b| path(a).cmp(path(b)));
        }
        let sizes: Vec<u64> = order
            .iter()
            .map(|&f| {
                let (k, i) = locate(&firsts, f);
                parts[k].sizes[i]
            })
            .collect();
        for part in &mut parts {
            part.sizes = Vec::new();
        }
        let mut names = Vec::with_capacity(parts.iter().map(|p| p.names.len()).sum());
        for &f in &order {
            let (k, i) = locate(&firsts, f);
            names.extend_from_slice(parts[k].path_with_nul(i));
        }
        drop(order);
        drop(parts);
        let ends = ends_of(&names, sizes.len());
        FileList { names, ends, sizes }
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
        FileRef {
            rel_path: self.path(i),
            size_bytes: self.sizes[i],
        }
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

/// Where each NUL-terminated path of `names` ends (one past its NUL), for at
/// most `max` paths.
fn ends_of(names: &[u8], max: usize) -> Vec<u64> {
    let mut ends = Vec::with_capacity(max.min(names.len()));
    ends.extend(
        memchr::memchr_iter(0, names)
            .take(max)
            .map(|at| at as u64 + 1),
    );
    ends
}

/// Part and index within it of file `f` of a union whose part k begins at
/// file `firsts[k]` (`firsts` ascending, `firsts[0] == 0`).
fn locate(firsts: &[u32], f: u32) -> (usize, usize) {
    let k = firsts.partition_point(|&first| first <= f) - 1;
    (k, (f - firsts[k]) as usize)
}

impl fmt::Debug for FileList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 8;
        let mut list = f.debug_list();
        list.entries(
            self.iter()
                .take(SHOWN)
                .map(|file| (file.rel_path, file.size_bytes)),
        );
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
        assert_eq!(
            list.get(0),
            FileRef {
                rel_path: Path::new("b/x"),
                size_bytes: 3
            }
        );
        let sorted = list.clone().sorted();
        let paths: Vec<&Path> = sorted.iter().map(|f| f.rel_path).collect();
        assert_eq!(paths, [Path::new("a/y"), Path::new("b/x"), Path::new("z")]);
        assert_eq!(sorted.sizes(), [0, 3, 7]);
        assert_eq!(
            FileList::from_names(sorted.names().to_vec(), sorted.sizes().to_vec()),
            Ok(sorted)
        );
    }

    #[test]
    fn the_union_of_several_parts_is_every_file_once_in_path_order() {
        let part = |files: &[(&str, u64)]| {
            let mut list = FileList::new();
            for (path, size) in files {
                list.push(path.as_bytes(), *size);
            }
            list
        };
        let parts = vec![
            part(&[("b/2", 2), ("a", 1)]),
            FileList::new(),
            part(&[("b", 9), ("a.txt", 4)]),
            part(&[("b/1", 3), ("a/z", 5), ("c", 6)]),
        ];
        let union = FileList::sorted_union(parts);
        let all: Vec<(&[u8], u64)> = union
            .paths_bytes()
            .zip(union.sizes().iter().copied())
            .collect();
        // Byte order: '.' (0x2e) sorts before '/' (0x2f).
        let want: [(&[u8], u64); 7] = [
            (b"a", 1),
            (b"a.txt", 4),
            (b"a/z", 5),
            (b"b", 9),
            (b"b/1", 3),
            (b"b/2", 2),
            (b"c", 6),
        ];
        assert_eq!(all, want);
        assert_eq!(
            FileList::from_names(union.names().to_vec(), union.sizes().to_vec()),
            Ok(union)
        );
        assert_eq!(FileList::sorted_union(Vec::new()), FileList::new());
        assert_eq!(
            FileList::sorted_union(vec![FileList::new(), FileList::new()]),
            FileList::new()
        );
    }

    #[test]
    fn names_without_matching_sizes_are_refused() {
        assert!(FileList::from_names(b"a\0b\0".to_vec(), vec![1]).is_err());
        assert!(FileList::from_names(b"a\0b".to_vec(), vec![1, 2]).is_err());
        assert!(FileList::from_names(b"a\0".to_vec(), vec![1, 2]).is_err());
        assert_eq!(
            FileList::from_names(Vec::new(), Vec::new()),
            Ok(FileList::new())
        );
    }

    #[test]
    #[should_panic(expected = "NUL")]
    fn a_path_with_a_nul_byte_is_refused() {
        FileList::new().push(b"a\0b", 1);
    }
}
