//! The manifest cache file's format: a source's objects with the evidence
//! that tells whether they are still its objects, byte by byte. Pure: it
//! reads from any `Read` and writes to any `Write`; the files themselves
//! (where, when, atomically) are `crate::source::cache`'s, and what the
//! evidence means is the source's (`crate::source::local`).
//!
//! Format version 4, little-endian; docs/manifest.md has the table with
//! every field's offset, and the `const` asserts below keep this code to it.
//! The objects' keys and sizes are two blocks that read straight into a
//! [`FileList`]'s buffers, without a buffer of the whole file or an
//! allocation per key:
//!
//! ```text
//! "RFMANIF\0"  u32 version  u32 kind  i64 listed-at (Unix seconds)
//! u32 len, root bytes (kind 0: canonical path; kind 1: the prefix's URL)
//! u64 directories   u64 links   u64 files   u64 file path bytes
//! directories: u32 len, path, u64 dev, u64 ino, i64 mtime s, u32 mtime ns, i64 ctime s, u32 ctime ns
//! links:       u32 len, path, u8 1 = to a file (then its size) or 0 = to anything else, u64 size
//! file paths:  each file's path and a NUL byte, end to end, strictly increasing
//!              (file path bytes in all, the NULs included)
//! file sizes:  u64 each, in the same order
//! kind 1 only: u64 ETag bytes, then each object's ETag and a NUL (empty: none)
//! u32 CRC-32 of everything before it
//! ```
//!
//! Kind 0 is a local tree (at least the root's directory record); kind 1 a
//! remote listing (no directory or link records; its evidence is the
//! listing time and the ETags). Version 3 (no kind, no ETags) and version 2
//! (a length-prefixed record per file) are a miss and are replaced at the
//! next listing.
//!
//! Any bytes decode to `Ok` or to an `Err` naming what is wrong, never a
//! panic, and no allocation is larger than the file's length warrants.

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::{DirStamp, LinkStamp};
use super::{FileList, MAX_FILES};

/// First bytes of every cache file.
pub(crate) const MAGIC: &[u8; 8] = b"RFMANIF\0";
/// The version this build writes and reads.
pub(crate) const FORMAT_VERSION: u32 = 4;
/// The kind field (bytes 12..16): a local directory tree.
pub(crate) const KIND_LOCAL_TREE: u32 = 0;
/// The kind field (bytes 12..16): a remote prefix's listing, with ETags.
pub(crate) const KIND_REMOTE: u32 = 1;
/// Bytes of the fixed header before the root's bytes: magic, version,
/// reserved, listed-at, the root's length.
pub(crate) const HEADER_FIXED_BYTES: u64 = 8 + 4 + 4 + 8 + 4;
/// Bytes of the four counts after the root.
pub(crate) const COUNTS_BYTES: u64 = 4 * 8;
/// Bytes of the CRC-32 at the end.
pub(crate) const CRC_BYTES: u64 = 4;
/// Bytes of one directory record besides its path.
pub(crate) const DIR_FIXED_BYTES: u64 = 4 + 8 + 8 + 8 + 4 + 8 + 4;
/// Bytes of one link record besides its path.
pub(crate) const LINK_FIXED_BYTES: u64 = 4 + 1 + 8;
/// Longest path a cache file may hold: far above PATH_MAX (4,096), which
/// the walk's paths cannot exceed.
const PATH_BYTES_MAX: u32 = 65_536;
/// Most bytes reserved ahead for a block: past it, a block's buffer grows
/// as its bytes arrive, so a length that lies costs no large reservation.
pub(crate) const RESERVE_BYTES_MAX: u64 = 64 << 20;
/// Bytes read or written at a time.
pub(crate) const IO_CHUNK_BYTES: usize = 256 * 1024;

// The layout docs/manifest.md gives, field by field: a change here is a
// change of the format (and of FORMAT_VERSION).
const _: () = assert!(MAGIC.len() == 8);
const _: () = assert!(
    HEADER_FIXED_BYTES == 28,
    "magic 0..8, version 8..12, kind 12..16, listed-at 16..24, root length 24..28"
);
const _: () = assert!(
    COUNTS_BYTES == 32,
    "directories, links, files, path bytes: a u64 each"
);
const _: () = assert!(
    DIR_FIXED_BYTES == 4 + 2 * 8 + 2 * (8 + 4),
    "a directory: path length, dev, ino, mtime (s, ns), ctime (s, ns)"
);
const _: () = assert!(LINK_FIXED_BYTES == 13, "a link: path length, kind, size");
const _: () = assert!(CRC_BYTES == 4);
const _: () = assert!(
    IO_CHUNK_BYTES / 8 * 8 == IO_CHUNK_BYTES,
    "sizes are read in whole u64s"
);

/// Why a file is not a cache file this build may use or remove.
#[derive(Debug, PartialEq, Eq)]
pub enum NotACacheFile {
    /// Written by a newer ringfeed: leave it to that one.
    NewerVersion(u32),
    /// Anything else: damaged, older, or not a cache file at all.
    Unusable(String),
}

/// What a cache file holds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Decoded {
    /// Directories stamped by the listing.
    pub dirs: Vec<DirStamp>,
    /// Links met by the listing, with what they pointed to.
    pub links: Vec<LinkStamp>,
    /// The objects, in manifest order.
    pub files: FileList,
    /// When the listing began (whole seconds).
    pub listed_at: SystemTime,
    /// A remote listing's ETags: each object's and a NUL, in manifest order
    /// (an empty one where the store gave none). None for a local tree.
    pub etags: Option<Vec<u8>>,
}

/// A writer that keeps the CRC-32 of what went through it.
struct CrcWriter<W: Write> {
    out: W,
    crc: crc32fast::Hasher,
}

impl<W: Write> CrcWriter<W> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.crc.update(bytes);
        self.out.write_all(bytes)
    }

    fn put_path(&mut self, path: &Path) -> io::Result<()> {
        let bytes = path.as_os_str().as_bytes();
        // Paths come from the file system: PATH_MAX-bounded, far below u32::MAX.
        self.put(&(bytes.len() as u32).to_le_bytes())?;
        self.put(bytes)
    }
}

/// Writes a cache file of the local tree `root` to `out`.
pub(crate) fn encode_to<W: Write>(
    out: W,
    root: &[u8],
    listed_at: SystemTime,
    dirs: &[DirStamp],
    links: &[LinkStamp],
    files: &FileList,
) -> io::Result<()> {
    encode_any(out, root, listed_at, (dirs, links), files, None)
}

/// Writes a cache file of the remote prefix `url` to `out`: `etags` holds
/// each of `files`' ETags and a NUL, in the same order.
pub(crate) fn encode_remote_to<W: Write>(
    out: W,
    url: &[u8],
    listed_at: SystemTime,
    files: &FileList,
    etags: &[u8],
) -> io::Result<()> {
    debug_assert_eq!(memchr::memchr_iter(0, etags).count(), files.len());
    encode_any(out, url, listed_at, (&[], &[]), files, Some(etags))
}

/// Either kind: a local tree's stamps, or a remote listing's ETags.
fn encode_any<W: Write>(
    out: W,
    root: &[u8],
    listed_at: SystemTime,
    (dirs, links): (&[DirStamp], &[LinkStamp]),
    files: &FileList,
    etags: Option<&[u8]>,
) -> io::Result<()> {
    let kind = if etags.is_some() {
        KIND_REMOTE
    } else {
        KIND_LOCAL_TREE
    };
    let mut w = CrcWriter {
        out,
        crc: crc32fast::Hasher::new(),
    };
    let listed_secs = listed_at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    w.put(MAGIC)?;
    w.put(&FORMAT_VERSION.to_le_bytes())?;
    w.put(&kind.to_le_bytes())?;
    w.put(&listed_secs.to_le_bytes())?;
    w.put_path(Path::new(OsStr::from_bytes(root)))?;
    for count in [dirs.len(), links.len(), files.len(), files.names().len()] {
        w.put(&(count as u64).to_le_bytes())?;
    }
    for d in dirs {
        w.put_path(&d.rel_path)?;
        w.put(&d.dev.to_le_bytes())?;
        w.put(&d.ino.to_le_bytes())?;
        w.put(&d.mtime.0.to_le_bytes())?;
        w.put(&d.mtime.1.to_le_bytes())?;
        w.put(&d.ctime.0.to_le_bytes())?;
        w.put(&d.ctime.1.to_le_bytes())?;
    }
    for l in links {
        w.put_path(&l.rel_path)?;
        w.put(&[u8::from(l.file_size.is_some())])?;
        w.put(&l.file_size.unwrap_or(0).to_le_bytes())?;
    }
    w.put(files.names())?;
    let mut chunk = Vec::with_capacity(IO_CHUNK_BYTES);
    for sizes in files.sizes().chunks(IO_CHUNK_BYTES / 8) {
        chunk.clear();
        chunk.extend(sizes.iter().flat_map(|size| size.to_le_bytes()));
        w.put(&chunk)?;
    }
    if let Some(etags) = etags {
        w.put(&(etags.len() as u64).to_le_bytes())?;
        w.put(etags)?;
    }
    let crc = w.crc.finalize();
    w.out.write_all(&crc.to_le_bytes())
}

/// The bytes of a cache file (tests).
#[cfg(test)]
pub(crate) fn encode(
    root: &[u8],
    listed_at: SystemTime,
    dirs: &[DirStamp],
    links: &[LinkStamp],
    files: &FileList,
) -> Vec<u8> {
    let mut out = Vec::new();
    encode_to(&mut out, root, listed_at, dirs, links, files).expect("writing to a Vec");
    out
}

/// Reads the cache file `bytes`, made by `encode` for `root` (tests).
#[cfg(test)]
pub(crate) fn decode(bytes: &[u8], root: &[u8]) -> Result<Decoded, String> {
    decode_from(bytes, bytes.len() as u64, root)
}

/// Reads a cache file of `len` bytes made by `encode_to` for `root` from
/// `src`. Any bytes give `Ok` or an `Err` naming what is wrong, never a
/// panic; no allocation is larger than `len` warrants, and a file whose
/// length is a lie (a sparse file reads as zeros) is refused within its
/// first records or its first 256 KiB of paths. Nothing is returned before
/// the CRC at the end matched.
pub(crate) fn decode_from<R: Read>(src: R, len: u64, root: &[u8]) -> Result<Decoded, String> {
    let mut r = Reader::new(src, len);
    let header = r.header().map_err(|err| match err {
        HeaderError::Newer(version) => {
            format!("format version {version}, this build reads {FORMAT_VERSION}")
        }
        HeaderError::Bad(why) => why,
    })?;
    if header.root.as_os_str().as_bytes() != root {
        return Err(format!("it is the cache of {}", header.root.display()));
    }
    decode_body(&mut r, &header)
}

/// What follows the header, through the CRC.
fn decode_body<R: Read>(r: &mut Reader<R>, header: &Header) -> Result<Decoded, String> {
    let remote = header.kind == KIND_REMOTE;
    let n_dirs = r.u64()?;
    let n_links = r.u64()?;
    let n_files = r.u64()?;
    let path_bytes = r.u64()?;
    let left = r.body_left();
    // Every record takes at least its fixed bytes, and every file path at
    // least one byte and its NUL: counts past what is left are lies.
    let least = n_dirs
        .checked_mul(DIR_FIXED_BYTES)
        .and_then(|b| b.checked_add(n_links.checked_mul(LINK_FIXED_BYTES)?))
        .and_then(|b| b.checked_add(path_bytes))
        .and_then(|b| b.checked_add(n_files.checked_mul(8)?));
    if n_dirs == 0 && !remote {
        return Err("it has no directory records (there is always the root's)".into());
    }
    if remote && (n_dirs, n_links) != (0, 0) {
        return Err(format!(
            "a remote listing with {n_dirs} directory and {n_links} link records (it has none)"
        ));
    }
    if n_files == 0
        || n_files > MAX_FILES
        || path_bytes / 2 < n_files
        || least.is_none_or(|least| least > left)
    {
        return Err(format!(
            "{n_dirs} directories, {n_links} links and {n_files} files of {path_bytes} path bytes cannot fit in {left} bytes"
        ));
    }
    // Capacities from the counts are capped: a record is larger in memory
    // than on disk, and the records may still turn out to be garbage.
    const RECORDS_RESERVED_MAX: u64 = 4_096;
    let mut dirs = Vec::with_capacity(n_dirs.min(RECORDS_RESERVED_MAX) as usize);
    let mut root_seen = false;
    for _ in 0..n_dirs {
        // Only the root's own stamp has an empty path (zeros, such as a
        // sparse file's, would make every record one).
        let rel_path = r.rel_path(!root_seen)?;
        root_seen |= rel_path.as_os_str().is_empty();
        dirs.push(DirStamp {
            rel_path,
            dev: r.u64()?,
            ino: r.u64()?,
            mtime: (r.i64()?, r.nanos()?),
            ctime: (r.i64()?, r.nanos()?),
        });
    }
    let mut links = Vec::with_capacity(n_links.min(RECORDS_RESERVED_MAX) as usize);
    for _ in 0..n_links {
        let rel_path = r.rel_path(false)?;
        let to_file = match r.array::<1>()?[0] {
            0 => false,
            1 => true,
            other => return Err(format!("link kind {other} is neither 0 nor 1")),
        };
        let size = r.u64()?;
        links.push(LinkStamp {
            rel_path,
            file_size: to_file.then_some(size),
        });
    }
    let names = r.names(path_bytes, n_files)?;
    let sizes = r.u64s(n_files)?;
    let etags = if remote {
        let etag_bytes = r.u64()?;
        let etags = r.bytes(etag_bytes)?;
        let count = memchr::memchr_iter(0, &etags).count() as u64;
        if count != n_files || etags.last().is_some_and(|&b| b != 0) {
            return Err(format!(
                "its ETags block holds {count} ETags, not one for each of its {n_files} files"
            ));
        }
        Some(etags)
    } else {
        None
    };
    r.finish()?;
    let files = FileList::from_names(names, sizes)?;
    let mut prev: &[u8] = &[];
    for path in files.paths_bytes() {
        // No NUL: the list split on them.
        check_components(path)?;
        if prev >= path {
            return Err(format!(
                "files out of order at {}",
                String::from_utf8_lossy(path)
            ));
        }
        prev = path;
    }
    Ok(Decoded {
        dirs,
        links,
        files,
        listed_at: header.listed_at,
        etags,
    })
}

/// What a header says.
struct Header {
    root: PathBuf,
    kind: u32,
    listed_at: SystemTime,
}

/// Why a header was refused.
enum HeaderError {
    Newer(u32),
    Bad(String),
}

impl From<String> for HeaderError {
    fn from(why: String) -> HeaderError {
        HeaderError::Bad(why)
    }
}

/// A bounds-checked cursor over a cache file of known length, which
/// checksums everything it reads.
struct Reader<R: Read> {
    src: R,
    crc: crc32fast::Hasher,
    /// Bytes not read yet, the CRC's 4 included (the file's length says).
    left: u64,
    len: u64,
}

impl<R: Read> Reader<R> {
    fn new(src: R, len: u64) -> Reader<R> {
        Reader {
            src,
            crc: crc32fast::Hasher::new(),
            left: len,
            len,
        }
    }

    /// Bytes left before the CRC.
    fn body_left(&self) -> u64 {
        self.left.saturating_sub(4)
    }

    /// Fills `buf` from the body.
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), String> {
        if buf.len() as u64 > self.body_left() {
            return Err(format!("it ends early, at byte {}", self.len));
        }
        self.src
            .read_exact(buf)
            .map_err(|err| format!("cannot read it: {err}"))?;
        self.crc.update(buf);
        self.left -= buf.len() as u64;
        Ok(())
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut out = [0; N];
        self.fill(&mut out)?;
        Ok(out)
    }

    /// `n` bytes, allocated only once the file is known to hold them.
    fn bytes(&mut self, n: u64) -> Result<Vec<u8>, String> {
        if n > self.body_left() {
            return Err(format!("it ends early, at byte {}", self.len));
        }
        let mut out = vec![0; n as usize];
        self.fill(&mut out)?;
        Ok(out)
    }

    /// The paths block: `n` bytes holding `paths` NUL-terminated paths, read
    /// in pieces. Stops at the first piece with an empty path or more NULs
    /// than paths (a sparse file's zeros are both) before reading the rest.
    fn names(&mut self, n: u64, paths: u64) -> Result<Vec<u8>, String> {
        if n > self.body_left() {
            return Err(format!("it ends early, at byte {}", self.len));
        }
        let mut out = Vec::with_capacity(n.min(RESERVE_BYTES_MAX) as usize);
        let mut nuls = 0u64;
        while (out.len() as u64) < n {
            let at = out.len();
            let piece = (n - at as u64).min(IO_CHUNK_BYTES as u64) as usize;
            out.resize(at + piece, 0);
            self.fill(&mut out[at..])?;
            // Look one byte back: an empty path may straddle two pieces.
            let seen = &out[at.saturating_sub(1)..];
            if out[0] == 0 || memchr::memmem::find(seen, b"\0\0").is_some() {
                return Err("its paths block holds an empty path".into());
            }
            nuls += memchr::memchr_iter(0, &out[at..]).count() as u64;
            if nuls > paths {
                return Err(format!(
                    "its paths block holds more than the {paths} paths it claims"
                ));
            }
        }
        if nuls != paths {
            return Err(format!(
                "its paths block holds {nuls} paths, not the {paths} it claims"
            ));
        }
        // Past the reservation the buffer grew by doubling: give the spare back.
        out.shrink_to_fit();
        Ok(out)
    }

    /// `n` little-endian u64s.
    fn u64s(&mut self, n: u64) -> Result<Vec<u64>, String> {
        if n > self.body_left() / 8 {
            return Err(format!("it ends early, at byte {}", self.len));
        }
        let mut out = Vec::with_capacity(n.min(RESERVE_BYTES_MAX / 8) as usize);
        let mut chunk = vec![0; IO_CHUNK_BYTES.min(n as usize * 8)];
        while out.len() < n as usize {
            let part = &mut chunk[..(n as usize - out.len()).min(IO_CHUNK_BYTES / 8) * 8];
            self.fill(part)?;
            out.extend(
                part.chunks_exact(8)
                    .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))),
            );
        }
        out.shrink_to_fit();
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, String> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, String> {
        self.array().map(u64::from_le_bytes)
    }

    fn i64(&mut self) -> Result<i64, String> {
        self.array().map(i64::from_le_bytes)
    }

    fn nanos(&mut self) -> Result<u32, String> {
        match self.u32()? {
            n if n < 1_000_000_000 => Ok(n),
            n => Err(format!("{n} nanoseconds is not a time")),
        }
    }

    /// Magic, version, kind, listed-at and the root.
    fn header(&mut self) -> Result<Header, HeaderError> {
        // Magic, version, reserved, listed-at, root length, CRC.
        const SHORTEST: u64 = HEADER_FIXED_BYTES + CRC_BYTES;
        if self.len < SHORTEST {
            return Err(HeaderError::Bad(format!("{} bytes is too short", self.len)));
        }
        if self.array::<8>()? != *MAGIC {
            return Err(HeaderError::Bad(
                "it is not a ringfeed manifest cache file".into(),
            ));
        }
        let version = self.u32()?;
        if version > FORMAT_VERSION {
            return Err(HeaderError::Newer(version));
        }
        if version != FORMAT_VERSION {
            return Err(HeaderError::Bad(format!(
                "format version {version}, this build reads {FORMAT_VERSION}"
            )));
        }
        let kind = self.u32()?;
        if kind != KIND_LOCAL_TREE && kind != KIND_REMOTE {
            return Err(HeaderError::Bad(format!("kind {kind} is neither 0 nor 1")));
        }
        let listed_secs = self.i64()?;
        let listed_at = if listed_secs >= 0 {
            UNIX_EPOCH + std::time::Duration::from_secs(listed_secs as u64)
        } else {
            UNIX_EPOCH
        };
        let root = PathBuf::from(std::ffi::OsString::from_vec(self.path_bytes()?));
        if kind == KIND_REMOTE {
            // A prefix's URL (`s3://b/p/`): gc knows it for a remote one.
            if !root.as_os_str().as_bytes().windows(3).any(|w| w == b"://") {
                return Err(HeaderError::Bad(format!(
                    "its remote root {root:?} is not a URL"
                )));
            }
            return Ok(Header {
                root,
                kind,
                listed_at,
            });
        }
        // Roots are canonical paths; gc would look a relative one up from
        // wherever it runs.
        if !root.is_absolute() {
            return Err(HeaderError::Bad(format!(
                "its root {:?} is not an absolute path",
                root
            )));
        }
        Ok(Header {
            root,
            kind,
            listed_at,
        })
    }

    /// A u32 length, then that many bytes of a path.
    fn path_bytes(&mut self) -> Result<Vec<u8>, String> {
        let len = self.u32()?;
        if len > PATH_BYTES_MAX {
            return Err(format!(
                "a path of {len} bytes is longer than any path ringfeed lists"
            ));
        }
        self.bytes(u64::from(len))
    }

    /// A relative path of plain components; empty only if `may_be_empty`
    /// (the root's own directory stamp).
    fn rel_path(&mut self, may_be_empty: bool) -> Result<PathBuf, String> {
        let bytes = self.path_bytes()?;
        check_plain(&bytes, may_be_empty)?;
        Ok(PathBuf::from(std::ffi::OsString::from_vec(bytes)))
    }

    /// Reads (and checksums) the rest of the body.
    fn skip_to_crc(&mut self) -> Result<(), String> {
        let mut chunk = vec![0; IO_CHUNK_BYTES];
        while self.body_left() > 0 {
            let n = self.body_left().min(IO_CHUNK_BYTES as u64) as usize;
            self.fill(&mut chunk[..n])?;
        }
        Ok(())
    }

    /// The CRC, which must match what was read, and then the end of the file.
    fn finish(&mut self) -> Result<(), String> {
        if self.left != 4 {
            return Err(format!("{} bytes after the last file", self.body_left()));
        }
        let mut stored = [0; 4];
        self.src
            .read_exact(&mut stored)
            .map_err(|err| format!("cannot read it: {err}"))?;
        if self.crc.clone().finalize() != u32::from_le_bytes(stored) {
            return Err("its checksum does not match (a torn or damaged file)".into());
        }
        let mut more = [0; 1];
        match self.src.read(&mut more) {
            Ok(0) => Ok(()),
            Ok(_) => Err("it grew while it was read".into()),
            Err(err) => Err(format!("cannot read it: {err}")),
        }
    }
}

/// A relative path of plain components; empty only if `may_be_empty`.
fn check_plain(bytes: &[u8], may_be_empty: bool) -> Result<(), String> {
    if bytes.contains(&0) {
        return Err(format!(
            "{:?} holds a NUL byte",
            String::from_utf8_lossy(bytes)
        ));
    }
    if may_be_empty && bytes.is_empty() {
        return Ok(());
    }
    check_components(bytes)
}

/// Plain components only: no empty one (a leading, trailing or doubled
/// '/', or an empty path), no "." or "..". One pass; a million paths of a
/// cached manifest are checked in a few milliseconds.
fn check_components(bytes: &[u8]) -> Result<(), String> {
    let mut start = 0;
    for end in memchr::memchr_iter(b'/', bytes).chain(std::iter::once(bytes.len())) {
        if matches!(&bytes[start..end], b"" | b"." | b"..") {
            return Err(format!(
                "{:?} is not a plain relative path",
                String::from_utf8_lossy(bytes)
            ));
        }
        start = end + 1;
    }
    Ok(())
}

/// The root recorded in a cache file of `len` bytes read from `src`, once
/// the whole file was read and found valid. A newer format's file is told
/// apart by its header and its CRC-32 (every format ends with one over
/// everything before it), so a damaged file whose version field reads high
/// is still `Unusable`; `before_newer` may refuse to read a newer one whole
/// (the caller knows whether it is mostly holes).
pub(crate) fn root_of<R: Read>(
    src: R,
    len: u64,
    before_newer: impl FnOnce() -> Result<(), String>,
) -> Result<PathBuf, NotACacheFile> {
    let unusable = NotACacheFile::Unusable;
    let mut r = Reader::new(src, len);
    match r.header() {
        Ok(header) => decode_body(&mut r, &header)
            .map(|_| header.root)
            .map_err(unusable),
        Err(HeaderError::Newer(version)) => {
            before_newer().map_err(unusable)?;
            r.skip_to_crc()
                .and_then(|()| r.finish())
                .map_err(unusable)?;
            Err(NotACacheFile::NewerVersion(version))
        }
        Err(HeaderError::Bad(why)) => Err(unusable(why)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> (Vec<DirStamp>, Vec<LinkStamp>, FileList) {
        let dirs = vec![
            DirStamp {
                rel_path: PathBuf::new(),
                dev: 1,
                ino: 2,
                mtime: (1_700_000_000, 5),
                ctime: (1_700_000_001, 999_999_999),
            },
            DirStamp {
                rel_path: "a/b".into(),
                dev: 1,
                ino: 3,
                mtime: (-3, 0),
                ctime: (0, 1),
            },
        ];
        let links = vec![
            LinkStamp {
                rel_path: "a/b/d".into(),
                file_size: Some(1000),
            },
            LinkStamp {
                rel_path: "dirlink".into(),
                file_size: None,
            },
        ];
        (dirs, links, list(&["a/b/c", "a/b/d", "z", "é"]))
    }

    fn list(paths: &[&str]) -> FileList {
        let mut files = FileList::new();
        for (i, p) in paths.iter().enumerate() {
            files.push(p.as_bytes(), i as u64 * 1000);
        }
        files
    }

    fn root_of_bytes(bytes: &[u8]) -> Result<PathBuf, NotACacheFile> {
        root_of(bytes, bytes.len() as u64, || Ok(()))
    }

    #[test]
    fn a_root_of_the_cache_is_read_back_from_a_whole_valid_file() {
        assert_eq!(
            root_of_bytes(&sample_bytes(b"/data/set")),
            Ok(PathBuf::from("/data/set"))
        );
    }

    fn sample_bytes(root: &[u8]) -> Vec<u8> {
        let (dirs, links, files) = sample();
        encode(root, SystemTime::now(), &dirs, &links, &files)
    }

    /// The table of docs/manifest.md, field by field, on a small file.
    #[test]
    fn every_field_sits_at_the_offset_docs_manifest_md_gives() {
        let dirs = vec![DirStamp {
            rel_path: PathBuf::new(),
            dev: 0x0102,
            ino: 0x0304,
            mtime: (-5, 6),
            ctime: (7, 8),
        }];
        let links = vec![LinkStamp {
            rel_path: "l".into(),
            file_size: Some(9),
        }];
        let files = list(&["a", "bc"]);
        let listed_at = UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let b = encode(b"/r", listed_at, &dirs, &links, &files);
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        assert_eq!(&b[0..8], MAGIC);
        assert_eq!(u32_at(8), FORMAT_VERSION);
        assert_eq!(u32_at(12), 0);
        assert_eq!(u64_at(16), 1_700_000_000);
        let r = 2;
        assert_eq!(u32_at(24), r as u32);
        assert_eq!(&b[28..28 + r], b"/r");
        let counts = 28 + r;
        assert_eq!(
            [
                u64_at(counts),
                u64_at(counts + 8),
                u64_at(counts + 16),
                u64_at(counts + 24)
            ],
            [1, 1, 2, 5]
        );
        let dir = counts + COUNTS_BYTES as usize;
        assert_eq!(u32_at(dir), 0, "the root's own stamp has an empty path");
        assert_eq!([u64_at(dir + 4), u64_at(dir + 12)], [0x0102, 0x0304]);
        assert_eq!(u64_at(dir + 20) as i64, -5);
        assert_eq!(u32_at(dir + 28), 6);
        assert_eq!([u64_at(dir + 32), u64::from(u32_at(dir + 40))], [7, 8]);
        let link = dir + DIR_FIXED_BYTES as usize;
        assert_eq!(u32_at(link), 1);
        assert_eq!(&b[link + 4..link + 6], b"l\x01");
        assert_eq!(u64_at(link + 6), 9);
        let paths = link + LINK_FIXED_BYTES as usize + 1;
        assert_eq!(&b[paths..paths + 5], b"a\0bc\0");
        let sizes = paths + 5;
        assert_eq!([u64_at(sizes), u64_at(sizes + 8)], [0, 1000]);
        let crc = sizes + 16;
        assert_eq!(b.len(), crc + CRC_BYTES as usize);
        assert_eq!(u32_at(crc), crc32fast::hash(&b[..crc]));
    }

    #[test]
    fn a_cache_file_reads_back_as_written() {
        let (dirs, links, files) = sample();
        let listed_at = UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let bytes = encode(b"/data/set", listed_at, &dirs, &links, &files);
        assert_eq!(
            decode(&bytes, b"/data/set"),
            Ok(Decoded {
                dirs,
                links,
                files,
                listed_at: UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000),
                etags: None,
            })
        );
    }

    #[test]
    fn another_roots_cache_file_is_refused_by_name() {
        let err = decode(&sample_bytes(b"/data/set"), b"/data/other").unwrap_err();
        assert!(err.contains("/data/set"), "{err}");
    }

    #[test]
    fn paths_that_leave_the_root_or_come_out_of_order_are_refused() {
        let (dirs, links, _) = sample();
        for bad in [
            &["a", "../etc/passwd"][..],
            &["/etc/passwd"],
            &["b", "a"],
            &["a", "a"],
            &["a//b"],
            &["a/./b"],
            &[""],
            &["a/"],
        ] {
            let files = list(bad);
            let bytes = encode(b"/r", SystemTime::now(), &dirs, &links, &files);
            assert!(decode(&bytes, b"/r").is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_refused() {
        let bytes = sample_bytes(b"/r");
        for len in 0..bytes.len() {
            assert!(
                decode(&bytes[..len], b"/r").is_err(),
                "truncated to {len} accepted"
            );
        }
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert!(decode(&bad, b"/r").is_err(), "flip at {at} accepted");
        }
    }

    #[test]
    fn a_newer_format_is_told_apart_from_a_damaged_file() {
        let mut bytes = sample_bytes(b"/r");
        bytes.truncate(bytes.len() - 4);
        bytes[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(
            root_of_bytes(&bytes),
            Err(NotACacheFile::NewerVersion(FORMAT_VERSION + 1))
        );
        assert!(matches!(
            root_of_bytes(b"garbage"),
            Err(NotACacheFile::Unusable(_))
        ));
    }

    /// A file whose length is a lie (sparse: zeros up to an enormous
    /// length) after a valid header, with counts that claim every byte.
    #[test]
    fn a_sparse_file_is_refused_early_without_a_large_allocation() {
        let header = &sample_bytes(b"/r")[..8 + 4 + 4 + 8 + 4 + 2];
        let len: u64 = 1 << 50;
        let left = len - header.len() as u64 - 32 - 4;
        let cases: [([u64; 4], &str); 4] = [
            ([1, left / LINK_FIXED_BYTES, 1, 2], "cannot fit"), // links that cannot all fit
            (
                [left / DIR_FIXED_BYTES, 0, 1, 2],
                "not a plain relative path",
            ), // zeros: a second empty directory path
            ([1, 0, MAX_FILES, MAX_FILES * 2], "empty path"),   // zeros: empty file paths
            ([1, 0, u64::MAX / 4, u64::MAX / 2], "cannot fit"), // overflowing sums
        ];
        for ([dirs, links, files, path_bytes], expected) in cases {
            let mut head = header.to_vec();
            for n in [dirs, links, files, path_bytes] {
                head.extend_from_slice(&n.to_le_bytes());
            }
            let src = io::Read::chain(head.as_slice(), io::repeat(0));
            let err = decode_from(src, len, b"/r").unwrap_err();
            assert!(
                err.contains(expected),
                "{dirs}/{links}/{files}/{path_bytes}: {err}"
            );
        }
    }

    /// Paths blocks of several 256 KiB pieces, and of exactly one and two
    /// (15-byte paths and their NULs: 16,384 to a piece).
    #[test]
    fn large_lists_read_back_across_pieces() {
        let (dirs, links, _) = sample();
        for n in [300_000, 16_384, 32_768, 16_385] {
            let mut files = FileList::new();
            for i in 0..n {
                files.push(
                    format!("d{:04}/f{:04}.bin", i / 10_000, i % 10_000).as_bytes(),
                    i as u64,
                );
            }
            let bytes = encode(b"/r", SystemTime::now(), &dirs, &links, &files);
            let decoded = decode(&bytes, b"/r").unwrap();
            assert_eq!(decoded.files, files, "{n} files");
        }
    }

    #[test]
    fn a_relative_root_is_refused() {
        for root in [&b""[..], b"relative/dir"] {
            let bytes = sample_bytes(root);
            assert!(decode(&bytes, root)
                .unwrap_err()
                .contains("not an absolute path"));
            assert!(matches!(
                root_of_bytes(&bytes),
                Err(NotACacheFile::Unusable(_))
            ));
        }
    }

    #[test]
    fn a_damaged_file_whose_version_reads_newer_is_unusable() {
        let mut bytes = sample_bytes(b"/r");
        bytes[8..12].copy_from_slice(&(FORMAT_VERSION + 16).to_le_bytes());
        assert!(matches!(
            root_of_bytes(&bytes),
            Err(NotACacheFile::Unusable(_))
        ));
    }

    fn remote_bytes(url: &[u8], etags: &[u8]) -> Vec<u8> {
        let files = list(&["a/x.bin", "b", "c"]);
        let listed_at = UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        let mut out = Vec::new();
        encode_remote_to(&mut out, url, listed_at, &files, etags).unwrap();
        out
    }

    #[test]
    fn a_remote_listing_reads_back_with_its_etags_and_listing_time() {
        let etags = b"\"e1\"\0\0\"e3\"\0";
        let bytes = remote_bytes(b"s3://bucket/pre/", etags);
        assert_eq!(
            u32::from_le_bytes(bytes[12..16].try_into().unwrap()),
            KIND_REMOTE
        );
        let decoded = decode(&bytes, b"s3://bucket/pre/").unwrap();
        assert_eq!(decoded.files, list(&["a/x.bin", "b", "c"]));
        assert_eq!(decoded.etags.as_deref(), Some(&etags[..]));
        assert!(decoded.dirs.is_empty() && decoded.links.is_empty());
        assert_eq!(
            decoded.listed_at,
            UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000)
        );
        assert_eq!(root_of_bytes(&bytes), Ok(PathBuf::from("s3://bucket/pre/")));
    }

    #[test]
    fn a_remote_listing_whose_etags_do_not_match_its_files_is_refused() {
        let bytes = remote_bytes(b"s3://b/", b"\"e1\"\0\"e2\"\0");
        let err = decode(&bytes, b"s3://b/").unwrap_err();
        assert!(err.contains("2 ETags") && err.contains("3 files"), "{err}");
        let bytes = remote_bytes(b"/not/a/url", b"\0\0\0");
        assert!(decode(&bytes, b"/not/a/url")
            .unwrap_err()
            .contains("not a URL"));
    }

    #[test]
    fn every_flipped_byte_of_a_remote_listing_is_refused() {
        let bytes = remote_bytes(b"gs://b/p", b"\"1\"\0\"2\"\0\"3\"\0");
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert!(decode(&bad, b"gs://b/p").is_err(), "flip at {at} accepted");
        }
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len], b"gs://b/p").is_err(), "cut at {len}");
        }
    }

    /// A body with a valid CRC.
    fn with_crc(mut body: Vec<u8>) -> Vec<u8> {
        let crc = crc32fast::hash(&body);
        body.extend_from_slice(&crc.to_le_bytes());
        body
    }

    proptest! {
        /// Arbitrary bodies with a valid CRC: the parser itself must refuse
        /// or accept without panicking or over-allocating.
        #[test]
        fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&with_crc(body), b"/r");
        }

        /// A valid header for the right root, then small counts and records
        /// of random bytes: the parser gets past the header into the records.
        #[test]
        fn arbitrary_records_after_a_valid_header_never_panic(
            counts in (0u64..4, 0u64..4, 0u64..6, 0u64..40),
            records in proptest::collection::vec(any::<u8>(), 0..400),
            small_lens in any::<bool>(),
        ) {
            let mut body = sample_bytes(b"/r");
            // Header: magic 8, version 4, reserved 4, listed-at 8, root 4 + 2.
            body.truncate(8 + 4 + 4 + 8 + 4 + 2);
            for n in [counts.0, counts.1, counts.2, counts.3] {
                body.extend_from_slice(&n.to_le_bytes());
            }
            let mut records = records;
            if small_lens {
                // Keep the u32 lengths small, so that paths are read.
                for chunk in records.chunks_mut(16) {
                    let end = chunk.len().min(4);
                    chunk[1..end].fill(0);
                    chunk[0] %= 8;
                }
            }
            body.extend_from_slice(&records);
            let _ = decode(&with_crc(body), b"/r");
        }
    }
}
