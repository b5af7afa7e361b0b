//! What a listing of a local tree keeps as evidence that it is still valid:
//! each directory's identity and times, and each link's target. Made by the
//! local source (`crate::source::local`), stored by the manifest's cache
//! format (`format.rs`): below both, so neither imports the other for it.

use std::path::PathBuf;

/// A directory as it was when listed. A name added to it, removed or
/// renamed moves its mtime and ctime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirStamp {
    /// Path relative to the source's root; empty for the root.
    pub rel_path: PathBuf,
    /// Device of the directory.
    pub dev: u64,
    /// Inode of the directory.
    pub ino: u64,
    /// (seconds, nanoseconds) since the Unix epoch.
    pub mtime: (i64, u32),
    /// (seconds, nanoseconds) since the Unix epoch.
    pub ctime: (i64, u32),
}

/// A symbolic link met by the walk, and what it pointed to: its target can
/// change without any directory of the tree changing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkStamp {
    /// Path relative to the source's root.
    pub rel_path: PathBuf,
    /// `Some(size)`: a regular file of that size (listed); None: anything
    /// else (a directory, a socket...), or a file outside the root while
    /// such links are not followed: not listed.
    pub file_size: Option<u64>,
}
