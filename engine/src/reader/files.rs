//! The files a reader may read: absolute paths and the sizes the manifest
//! recorded for them.

use std::ffi::{CStr, CString, OsStr};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use super::{ReadError, ReadOp};

/// The files a reader may read, indexed by `ReadOp::file`.
///
/// Built once by the caller from the manifest and shared (`Arc`) with the
/// engine. The sizes are what the manifest saw; a read that meets end of file
/// before them is `ReadError::ChangedSize`.
#[derive(Debug)]
pub struct FileTable {
    paths: Vec<CString>,
    sizes_bytes: Vec<u64>,
    keep_open: bool,
}

impl FileTable {
    /// Builds a table. `paths[i]` has `sizes[i]` bytes.
    ///
    /// With `keep_open`, each file is opened on its first read and kept open
    /// for the engine's life, up to `ReaderConfig::keep_open_files_max` files;
    /// reads of files past that limit open, read and close. Use it for few,
    /// large files read many times (record mode). A kept file is read as it
    /// was opened: deleting or replacing its path afterwards goes unnoticed
    /// (shrinking it does not). Without it, every read opens and closes its
    /// file, so a file that vanished is reported on its next read.
    ///
    /// Refused: lengths that differ, more than `u32::MAX` files, a path that
    /// is not absolute or holds a NUL byte.
    pub fn new(
        paths: Vec<PathBuf>,
        sizes: Vec<u64>,
        keep_open: bool,
    ) -> Result<FileTable, ReadError> {
        let invalid = |reason: String| ReadError::InvalidFileTable { reason };
        if paths.len() != sizes.len() {
            return Err(invalid(format!(
                "{} paths but {} sizes",
                paths.len(),
                sizes.len()
            )));
        }
        if u32::try_from(paths.len()).is_err() {
            return Err(invalid(format!(
                "{} files, more than the limit of {}",
                paths.len(),
                u32::MAX
            )));
        }
        let mut c_paths = Vec::with_capacity(paths.len());
        for path in paths {
            if !path.is_absolute() {
                return Err(invalid(format!("{}: path is not absolute", path.display())));
            }
            let shown = path.display().to_string();
            let c_path = CString::new(path.into_os_string().into_vec())
                .map_err(|_| invalid(format!("{shown}: path holds a NUL byte")))?;
            c_paths.push(c_path);
        }
        Ok(FileTable {
            paths: c_paths,
            sizes_bytes: sizes,
            keep_open,
        })
    }

    /// Number of files.
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    /// True when the table has no file.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// Whether files stay open between reads (see `new`).
    pub fn keep_open(&self) -> bool {
        self.keep_open
    }

    /// Path of file `file`, if it exists.
    pub fn path(&self, file: u32) -> Option<&Path> {
        let c_path = self.paths.get(file as usize)?;
        Some(Path::new(OsStr::from_bytes(c_path.as_bytes())))
    }

    /// Size the manifest recorded for file `file`, if it exists.
    pub fn size_bytes(&self, file: u32) -> Option<u64> {
        self.sizes_bytes.get(file as usize).copied()
    }

    /// Path for open(2). `file` must have passed `check_op`.
    pub(crate) fn c_path(&self, file: u32) -> &CStr {
        &self.paths[file as usize]
    }

    /// Owned path for an error message. `file` must have passed `check_op`.
    pub(crate) fn path_buf(&self, file: u32) -> PathBuf {
        PathBuf::from(OsStr::from_bytes(self.paths[file as usize].as_bytes()))
    }

    /// Checks a read against the table before it is started.
    pub(crate) fn check_op(&self, op: &ReadOp) -> Result<(), ReadError> {
        let invalid = |reason: String| ReadError::InvalidOp {
            user_data: op.user_data,
            reason,
        };
        let Some(size_bytes) = self.size_bytes(op.file) else {
            return Err(invalid(format!(
                "file {} is not in the table of {} files",
                op.file,
                self.len()
            )));
        };
        let in_file =
            matches!(op.offset_bytes.checked_add(op.len_bytes), Some(end) if end <= size_bytes);
        if !in_file {
            return Err(invalid(format!(
                "{}: range of {} bytes at offset {} goes past the file's {} bytes",
                self.path_buf(op.file).display(),
                op.len_bytes,
                op.offset_bytes,
                size_bytes
            )));
        }
        if op.len_bytes > isize::MAX as u64 {
            return Err(invalid(format!(
                "length {} bytes is larger than memory",
                op.len_bytes
            )));
        }
        if op.len_bytes > 0 && op.dest.is_null() {
            return Err(invalid("destination pointer is null".to_string()));
        }
        Ok(())
    }
}
