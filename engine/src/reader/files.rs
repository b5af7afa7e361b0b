//! The files a reader may read: absolute paths and the sizes the manifest
//! recorded for them.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use super::{ReadError, ReadOp};
use crate::manifest::FileList;

/// Opens `root` as a directory for `openat`, kept for the table's life.
fn open_dir(root: &Path) -> Result<OwnedFd, ReadError> {
    let c_root =
        CString::new(root.as_os_str().as_bytes()).map_err(|_| ReadError::InvalidFileTable {
            reason: format!("{}: path holds a NUL byte", root.display()),
        })?;
    // SAFETY: `c_root` is NUL-terminated; the result is checked.
    let fd = unsafe {
        libc::open(
            c_root.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let errno = io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        return Err(ReadError::from_errno(root.to_path_buf(), "open", errno));
    }
    // SAFETY: open just returned this descriptor and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The files a reader may read, indexed by `ReadOp::file`.
///
/// Built once by the caller from the manifest and shared (`Arc`) with the
/// engine. The sizes are what the manifest saw; a read that meets end of file
/// before them is `ReadError::ChangedSize`, and one that finds bytes past
/// them is `ReadError::Grew`.
///
/// The paths are a [`FileList`]: end to end in one buffer, NUL-terminated,
/// and for a table made by [`FileTable::over`] the very list the manifest
/// holds, not a copy. A table made by [`FileTable::under_root`] or `over`
/// holds paths relative to a directory it keeps open, and every open is an
/// `openat` from there: the kernel walks two components instead of the whole
/// absolute path.
#[derive(Debug)]
pub struct FileTable {
    /// The directory relative paths start from; None for absolute paths.
    dir: Option<OwnedFd>,
    /// That directory's path, for messages (empty for absolute paths).
    root: PathBuf,
    files: Arc<FileList>,
    keep_open: bool,
}

impl FileTable {
    /// Builds a table of absolute paths. `paths[i]` has `sizes[i]` bytes.
    ///
    /// With `keep_open`, each file is opened on its first read and kept open
    /// for the engine's life, up to `ReaderConfig::keep_open_files_max` files
    /// (`KeptFiles`, one descriptor per file for the whole engine); reads
    /// of files past that limit open, read and close. Every such open checks
    /// the file's size (`SizeAtOpen`), since a read of one record would not
    /// see a replaced file. Use it for few, large files read many times
    /// (record mode). A kept file is read as it was opened: deleting or
    /// replacing its path afterwards goes unnoticed (shrinking or growing it
    /// does not). Without it, every read opens and closes its file, so a file
    /// that vanished is reported on its next read.
    ///
    /// Refused: lengths that differ, more than `u32::MAX` files, a path that
    /// is not absolute or holds a NUL byte.
    pub fn new(
        paths: Vec<PathBuf>,
        sizes: Vec<u64>,
        keep_open: bool,
    ) -> Result<FileTable, ReadError> {
        let invalid = |reason: String| ReadError::InvalidFileTable { reason };
        if let Some(p) = paths.iter().find(|p| !p.is_absolute()) {
            return Err(invalid(format!("{}: path is not absolute", p.display())));
        }
        let files = Self::list(
            Path::new(""),
            paths.iter().map(|p| p.as_os_str().as_bytes()),
            sizes,
        )?;
        Self::build(None, PathBuf::new(), Arc::new(files), keep_open)
    }

    /// Builds a table of paths relative to the directory `root`, which is
    /// opened now and kept open. `rel_paths[i]` has `sizes[i]` bytes.
    /// `keep_open` as for [`FileTable::new`].
    ///
    /// Refused: lengths that differ, more than `u32::MAX` files, a path that
    /// is empty, absolute or holds a NUL byte, a root that cannot be opened
    /// as a directory.
    pub fn under_root<'a>(
        root: &Path,
        rel_paths: impl ExactSizeIterator<Item = &'a [u8]>,
        sizes: Vec<u64>,
        keep_open: bool,
    ) -> Result<FileTable, ReadError> {
        let files = Self::list(root, rel_paths, sizes)?;
        Self::over(root, Arc::new(files), keep_open)
    }

    /// Like [`FileTable::under_root`], over the list `files` itself (a
    /// manifest's): nothing is copied.
    pub fn over(
        root: &Path,
        files: Arc<FileList>,
        keep_open: bool,
    ) -> Result<FileTable, ReadError> {
        let dir = open_dir(root)?;
        if let Some(path) = files
            .paths_bytes()
            .find(|p| matches!(p.first(), None | Some(b'/')))
        {
            return Err(ReadError::InvalidFileTable {
                reason: format!(
                    "{:?}: not a path relative to {}",
                    OsStr::from_bytes(path),
                    root.display()
                ),
            });
        }
        Self::build(Some(dir), root.to_path_buf(), files, keep_open)
    }

    /// Checks that `paths` hold no NUL byte and lists them (`root` only
    /// names them in messages).
    fn list<'a>(
        root: &Path,
        paths: impl ExactSizeIterator<Item = &'a [u8]>,
        sizes: Vec<u64>,
    ) -> Result<FileList, ReadError> {
        let invalid = |reason: String| ReadError::InvalidFileTable { reason };
        if paths.len() != sizes.len() {
            return Err(invalid(format!(
                "{} paths but {} sizes",
                paths.len(),
                sizes.len()
            )));
        }
        let mut files = FileList::with_capacity(sizes.len(), 0);
        for (path, size) in paths.zip(sizes) {
            let shown = || root.join(OsStr::from_bytes(path)).display().to_string();
            if path.contains(&0) {
                return Err(invalid(format!("{}: path holds a NUL byte", shown())));
            }
            files.push(path, size);
        }
        Ok(files)
    }

    fn build(
        dir: Option<OwnedFd>,
        root: PathBuf,
        files: Arc<FileList>,
        keep_open: bool,
    ) -> Result<FileTable, ReadError> {
        if u32::try_from(files.len()).is_err() {
            return Err(ReadError::InvalidFileTable {
                reason: format!("{} files, more than the limit of {}", files.len(), u32::MAX),
            });
        }
        Ok(FileTable {
            dir,
            root,
            files,
            keep_open,
        })
    }

    /// Number of files.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// True when the table has no file.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// The paths and sizes (shared with the manifest for a table made by
    /// [`FileTable::over`]).
    pub fn files(&self) -> &Arc<FileList> {
        &self.files
    }

    /// Whether files stay open between reads (see `new`).
    pub fn keep_open(&self) -> bool {
        self.keep_open
    }

    /// Full path of file `file`, if it exists.
    pub fn path(&self, file: u32) -> Option<PathBuf> {
        ((file as usize) < self.len()).then(|| self.path_buf(file))
    }

    /// Size the manifest recorded for file `file`, if it exists.
    pub fn size_bytes(&self, file: u32) -> Option<u64> {
        self.files.sizes().get(file as usize).copied()
    }

    /// Directory descriptor for openat(2): the root, or AT_FDCWD for a table
    /// of absolute paths.
    pub(crate) fn dir_fd(&self) -> RawFd {
        self.dir.as_ref().map_or(libc::AT_FDCWD, AsRawFd::as_raw_fd)
    }

    /// Path for openat(2) from `dir_fd()`. `file` must have passed `check_op`.
    pub(crate) fn c_path(&self, file: u32) -> &CStr {
        self.files.c_path(file as usize)
    }

    /// Owned full path for an error message. `file` must have passed `check_op`.
    pub(crate) fn path_buf(&self, file: u32) -> PathBuf {
        self.root
            .join(OsStr::from_bytes(self.c_path(file).to_bytes()))
    }

    /// Whether `op`'s range ends at the recorded end of its file, so that
    /// the reader also checks for growth. `op` must have passed `check_op`.
    pub(crate) fn ends_at_eof(&self, op: &ReadOp) -> bool {
        self.size_bytes(op.file) == Some(op.offset_bytes + op.len_bytes)
    }

    /// Whether `op` completes without I/O: a zero-length range inside its
    /// file. (One at the end of its file, an empty file's, still reads one
    /// byte to see whether the file grew.)
    pub(crate) fn needs_no_io(&self, op: &ReadOp) -> bool {
        op.len_bytes == 0 && !self.ends_at_eof(op)
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
        if (op.len_bytes > 0 || op.spare_byte) && op.dest.is_null() {
            return Err(invalid("destination pointer is null".to_string()));
        }
        Ok(())
    }
}

impl FileTable {
    /// Opens file `file` for reading (a process descriptor, `openat` from
    /// the table's directory). `file` must have passed `check_op`.
    pub(crate) fn open(&self, file: u32) -> Result<OwnedFd, ReadError> {
        self.open_stat(file).map(|(fd, _)| fd)
    }

    /// [`FileTable::open`], and the file's `fstat`. Refuses a path that is
    /// no longer a regular file (`NotRegular`): the open does not wait (a
    /// FIFO put in a file's place would block it until a writer came), and
    /// the descriptor is made blocking again once it is known to be a file.
    fn open_stat(&self, file: u32) -> Result<(OwnedFd, libc::stat), ReadError> {
        let path = self.c_path(file);
        let mut flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK;
        let fd = loop {
            // SAFETY: `path` is a NUL-terminated string that outlives the call.
            let fd = unsafe { libc::openat(self.dir_fd(), path.as_ptr(), flags) };
            if fd >= 0 {
                // SAFETY: open just returned this descriptor and nobody else owns it.
                break unsafe { OwnedFd::from_raw_fd(fd) };
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => {}
                // Another process holds a write lease on the file (Samba,
                // an NFS server): a non-blocking open fails at once instead
                // of waiting for the lease to be given up. A FIFO never
                // fails this way, so wait like any open.
                Some(libc::EAGAIN) if flags & libc::O_NONBLOCK != 0 => flags &= !libc::O_NONBLOCK,
                errno => {
                    return Err(ReadError::from_errno(
                        self.path_buf(file),
                        "open",
                        errno.unwrap_or(libc::EIO),
                    ))
                }
            }
        };
        let errno = |what| {
            ReadError::from_errno(
                self.path_buf(file),
                what,
                io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO),
            )
        };
        // SAFETY: stat is plain old data; fstat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open and `st` a valid out-pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(errno("stat"));
        }
        if let Some(kind) = not_regular(st.st_mode) {
            return Err(ReadError::NotRegular {
                path: self.path_buf(file),
                kind,
            });
        }
        // Reads through io_uring honour O_NONBLOCK on a regular file too
        // (EAGAIN for bytes not in the page cache): clear it. O_NONBLOCK is
        // the only status flag the open set, so no F_GETFL is needed.
        // SAFETY: F_SETFL on an open descriptor.
        if flags & libc::O_NONBLOCK != 0
            && unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, 0) } < 0
        {
            return Err(errno("fcntl"));
        }
        Ok((fd, st))
    }

    /// Refuses file `file` if its path no longer names a regular file
    /// (`NotRegular`), without opening it: a `stat` by path, which does not
    /// wait for a FIFO's writer. For a read that has not returned for a
    /// while, whose open may be the one waiting (io_uring opens inside the
    /// ring, where O_NONBLOCK would also make cold reads fail with EAGAIN).
    /// An error of the stat itself (the file vanished) is left to the read.
    pub(crate) fn check_still_regular(&self, file: u32) -> Result<(), ReadError> {
        // SAFETY: stat is plain old data; fstatat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `c_path` is NUL-terminated and `st` a valid out-pointer.
        if unsafe { libc::fstatat(self.dir_fd(), self.c_path(file).as_ptr(), &mut st, 0) } != 0 {
            return Ok(());
        }
        match not_regular(st.st_mode) {
            Some(kind) => Err(ReadError::NotRegular {
                path: self.path_buf(file),
                kind,
            }),
            None => Ok(()),
        }
    }

    /// [`FileTable::open`], then checks that the file still has the size
    /// the manifest recorded (`SizeAtOpen` otherwise). For files read many
    /// times through one descriptor (keep-open mode), where the reads of
    /// single records would otherwise see a replaced file's bytes unless
    /// one of them happened to reach its end.
    pub(crate) fn open_checked(&self, file: u32) -> Result<OwnedFd, ReadError> {
        let (fd, st) = self.open_stat(file)?;
        let expected_bytes = self.size_bytes(file).unwrap_or(0);
        let actual_bytes = st.st_size as u64;
        if actual_bytes != expected_bytes {
            return Err(ReadError::SizeAtOpen {
                path: self.path_buf(file),
                expected_bytes,
                actual_bytes,
            });
        }
        Ok(fd)
    }
}

/// The descriptors of keep-open mode: one per file for the engine's life,
/// shared by every worker or ring of the engine, so that all reads of a
/// file go to the one file that was opened (and checked, see
/// [`FileTable::open_checked`]) first. A file deleted or replaced after that
/// goes on being read as it was. At most `max` files are kept; the reads of
/// the others open (checked), read and close.
#[derive(Debug)]
pub(crate) struct KeptFiles {
    fds: Vec<OnceLock<OwnedFd>>,
    /// Cells filled so far (reserved before opening, so it never passes `max`).
    count: AtomicU32,
    /// Lowered to `count` when an open meets a full descriptor table.
    max: AtomicU32,
}

/// Descriptors left to the rest of the loader by [`KeptFiles`].
const KEPT_MARGIN: u32 = 32;

/// A descriptor for one read: kept for the engine's life, or opened for
/// this read alone.
#[derive(Debug)]
pub(crate) enum ReadFd<'a> {
    /// Kept in [`KeptFiles`].
    Kept(BorrowedFd<'a>),
    /// Closed when dropped.
    Owned(OwnedFd),
}

impl ReadFd<'_> {
    /// The raw descriptor.
    pub(crate) fn raw(&self) -> RawFd {
        match self {
            ReadFd::Kept(fd) => fd.as_raw_fd(),
            ReadFd::Owned(fd) => fd.as_raw_fd(),
        }
    }
}

impl KeptFiles {
    /// A table for `files` (empty unless it is in keep-open mode) keeping at
    /// most `max` descriptors, and never more than half of RLIMIT_NOFILE:
    /// they are process descriptors, and the rest of the process needs some.
    pub(crate) fn new(files: &FileTable, max: u32) -> KeptFiles {
        let cells = if files.keep_open() { files.len() } else { 0 };
        KeptFiles {
            fds: (0..cells).map(|_| OnceLock::new()).collect(),
            count: AtomicU32::new(0),
            // Besides what it keeps, the loader holds a few dozen descriptors
            // (rings, eventfds, the segment, the root, the reads of files
            // not kept): leave them room even under a tiny `ulimit -n`.
            max: AtomicU32::new(max.min((super::nofile_limit() / 2).saturating_sub(KEPT_MARGIN))),
        }
    }

    /// The kept descriptor of file `file`, opening (checked against the
    /// recorded size) and keeping it now if it is not yet; None when the
    /// limit is reached and the file is not kept: open it for this read.
    pub(crate) fn kept<'a>(
        &'a self,
        files: &FileTable,
        file: u32,
    ) -> Result<Option<BorrowedFd<'a>>, ReadError> {
        let Some(cell) = self.fds.get(file as usize) else {
            return Ok(None);
        };
        if let Some(fd) = cell.get() {
            return Ok(Some(fd.as_fd()));
        }
        // Reserve a place under the limit before opening, so racing threads
        // cannot pass it together.
        if self.count.fetch_add(1, Ordering::Relaxed) >= self.max.load(Ordering::Relaxed) {
            self.count.fetch_sub(1, Ordering::Relaxed);
            return Ok(None);
        }
        let fd = match files.open_checked(file) {
            Ok(fd) => fd,
            Err(ReadError::Io { source, .. }) if source.raw_os_error() == Some(libc::EMFILE) => {
                // The descriptor table is full: keep no more files, and let
                // this read open its own (which says so if it fails too).
                self.max.store(
                    self.count.fetch_sub(1, Ordering::Relaxed) - 1,
                    Ordering::Relaxed,
                );
                return Ok(None);
            }
            Err(e) => {
                self.count.fetch_sub(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        if let Err(fd) = cell.set(fd) {
            // Another thread kept this file first: read through its
            // descriptor (the file every read of it must see), give back our
            // place, and close ours.
            self.count.fetch_sub(1, Ordering::Relaxed);
            drop(fd);
        }
        // The cell was just filled and is never emptied.
        Ok(cell.get().map(AsFd::as_fd))
    }

    /// The descriptor to read file `file` through: its kept one (see
    /// `kept`), or one opened (and checked) for this read.
    pub(crate) fn fd<'a>(&'a self, files: &FileTable, file: u32) -> Result<ReadFd<'a>, ReadError> {
        match self.kept(files, file)? {
            Some(fd) => Ok(ReadFd::Kept(fd)),
            None => files.open_checked(file).map(ReadFd::Owned),
        }
    }
}

/// What a file of mode `mode` is, in words, unless it is a regular file (one
/// wording with the ring's checks of its segments).
pub(crate) use ringfeed_ring::segment::not_regular_mode as not_regular;
