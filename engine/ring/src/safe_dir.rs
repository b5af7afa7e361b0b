//! Listing, inspecting and removing entries of a directory opened once
//! ([`Dir`]), never through a path: what `ringfeed gc` cleans (a cache's
//! `manifests/`, /dev/shm's outcome files) and what a loader finds planted
//! at its outcome's name. A link is never followed, another user's
//! directory never entered as if it were ours.

use std::ffi::{CStr, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use crate::safe_file::{component, euid, fstat, trusted_owner, Dir, TrustError};

/// The most entries [`Dir::remove_tree`] removes: a tree planted to make a
/// loader's start slow is refused past it.
pub const REMOVE_TREE_ENTRIES_MAX: usize = 10_000;
/// The deepest [`Dir::remove_tree`] goes (each level holds a descriptor).
pub const REMOVE_TREE_DEPTH_MAX: usize = 32;

impl Dir {
    /// Opens the existing subdirectory `name`: refused if it is a link or
    /// not a directory ([`TrustError::NotRegular`]), or belongs to a user
    /// other than this one or root ([`TrustError::NotOwned`]). Makes nothing.
    pub fn open_dir(&self, name: &OsStr) -> Result<Dir, TrustError> {
        let path = self.path.join(name);
        let fd = self.open_subdir(name).map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => TrustError::NotRegular {
                path: path.clone(),
                kind: "symlink or non-directory",
            },
            _ => TrustError::Io {
                path: path.clone(),
                source: e,
            },
        })?;
        let st = fstat(&fd).map_err(|source| TrustError::Io {
            path: path.clone(),
            source,
        })?;
        if !trusted_owner(st.st_uid) {
            return Err(TrustError::NotOwned {
                path,
                uid: st.st_uid,
                euid: euid(),
            });
        }
        Ok(Dir { fd, path })
    }

    /// `O_DIRECTORY | O_NOFOLLOW`: a link in the place of `name` is ELOOP.
    fn open_subdir(&self, name: &OsStr) -> io::Result<OwnedFd> {
        let c = component(name)?;
        // SAFETY: the dirfd is open for our lifetime and `c` is NUL-terminated.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: openat returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The names in the directory (not `.` and `..`), read through its
    /// descriptor: whatever its path names now, this is the directory opened.
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        // fdopendir takes the descriptor it is given: give it a copy.
        // SAFETY: a valid descriptor; F_DUPFD_CLOEXEC has no memory arguments.
        let dup = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `dup` is a new directory descriptor that the DIR now owns.
        let dir = unsafe { libc::fdopendir(dup) };
        if dir.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so `dup` is still ours to close.
            unsafe { libc::close(dup) };
            return Err(e);
        }
        // Reads from the start, wherever an earlier listing left the offset.
        // SAFETY: `dir` is a valid DIR from fdopendir.
        unsafe { libc::rewinddir(dir) };
        let mut names = Vec::new();
        let result = loop {
            // readdir returns NULL at the end and on an error, which only
            // errno tells apart.
            // SAFETY: errno is thread-local; writing it is always allowed.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: `dir` is a valid DIR, used by this thread only.
            let entry = unsafe { libc::readdir(dir) };
            if entry.is_null() {
                let e = io::Error::last_os_error();
                break if e.raw_os_error() == Some(0) {
                    Ok(())
                } else {
                    Err(e)
                };
            }
            // SAFETY: d_name of an entry readdir returned is NUL-terminated
            // and valid until the next readdir on `dir`.
            let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
            let bytes = name.to_bytes();
            if bytes != b"." && bytes != b".." {
                names.push(OsStr::from_bytes(bytes).to_os_string());
            }
        };
        // SAFETY: `dir` is valid and closed once (this also closes `dup`).
        unsafe { libc::closedir(dir) };
        result.map(|()| names)
    }

    /// `lstat` of `name` in the directory (a link is described, not followed).
    pub fn lstat(&self, name: &OsStr) -> io::Result<libc::stat> {
        let c = component(name)?;
        // SAFETY: an all-zero stat is a valid value to be overwritten.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid dirfd, NUL-terminated name, valid out pointer.
        let rc = unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st)
    }

    /// Removes the entry `name` whatever it is: a file, link, FIFO or
    /// socket is unlinked (a link itself, never its target); a directory is
    /// emptied through descriptors, never following a link inside it, and
    /// removed. At most [`REMOVE_TREE_ENTRIES_MAX`] entries and
    /// [`REMOVE_TREE_DEPTH_MAX`] levels; past them an error says so. Where
    /// the permissions refuse (another user's entry in a sticky directory,
    /// for anyone but root), the OS error is returned.
    pub fn remove_tree(&self, name: &OsStr) -> io::Result<()> {
        let mut budget = REMOVE_TREE_ENTRIES_MAX;
        self.remove_tree_at(name, 0, &mut budget)
    }

    fn remove_tree_at(&self, name: &OsStr, depth: usize, budget: &mut usize) -> io::Result<()> {
        if *budget == 0 || depth > REMOVE_TREE_DEPTH_MAX {
            return Err(io::Error::other(format!(
                "{} holds more than {REMOVE_TREE_ENTRIES_MAX} entries or {REMOVE_TREE_DEPTH_MAX} levels: not removed",
                self.path.join(name).display()
            )));
        }
        *budget -= 1;
        match self.remove(name) {
            Err(e) if e.raw_os_error() == Some(libc::EISDIR) => {}
            done => return done,
        }
        let sub = Dir {
            fd: self.open_subdir(name)?,
            path: self.path.join(name),
        };
        for entry in sub.names()? {
            sub.remove_tree_at(&entry, depth + 1, budget)?;
        }
        drop(sub);
        let c = component(name)?;
        // SAFETY: valid dirfd and NUL-terminated name.
        if unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn names_and_lstat_see_the_directory_opened_and_never_follow_a_link() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a"), b"a").unwrap();
        std::os::unix::fs::symlink("/", root.join("sub/link")).unwrap();
        std::os::unix::fs::symlink(root.join("sub"), root.join("link")).unwrap();
        let dir = Dir::open(root).unwrap();
        assert!(matches!(
            dir.open_dir(OsStr::new("link")),
            Err(TrustError::NotRegular { .. })
        ));
        let sub = dir.open_dir(OsStr::new("sub")).unwrap();
        let mut names = sub.names().unwrap();
        names.sort();
        assert_eq!(names, ["a", "link"]);
        // Listed twice from the start.
        assert_eq!(sub.names().unwrap().len(), 2);
        let st = sub.lstat(OsStr::new("link")).unwrap();
        assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFLNK);
        // The directory moved: its descriptor still lists it.
        std::fs::rename(root.join("sub"), root.join("moved")).unwrap();
        assert_eq!(sub.names().unwrap().len(), 2);
    }

    #[test]
    fn a_tree_is_removed_without_following_its_links() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        let outside = root.join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"k").unwrap();
        let tree = root.join("tree");
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        std::fs::write(tree.join("a/b/f"), b"f").unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("a/out")).unwrap();
        let dir = Dir::open(root).unwrap();
        dir.remove_tree(OsStr::new("tree")).unwrap();
        assert!(!tree.exists());
        assert!(outside.join("keep").exists());
        std::os::unix::fs::symlink(&outside, root.join("l")).unwrap();
        dir.remove_tree(OsStr::new("l")).unwrap();
        assert!(outside.join("keep").exists() && !Path::new(&root.join("l")).exists());
        let mut deep = root.join("deep");
        for _ in 0..=REMOVE_TREE_DEPTH_MAX + 1 {
            deep = deep.join("d");
        }
        std::fs::create_dir_all(&deep).unwrap();
        let e = dir.remove_tree(OsStr::new("deep")).unwrap_err();
        assert!(e.to_string().contains("levels: not removed"), "{e}");
    }
}
