//! Windows mode: each sample is a fixed-length window of tokens cut from
//! the concatenation of a corpus's documents (`serve --seq-len`,
//! docs/tokens.md), its bytes in one or more ranges of one or more objects,
//! with tokens the loader writes itself between documents (`--eos-token`).
//! The manifest holds no window: a [`Windows`] (`crate::tokens`) finds each
//! one's parts and document starts by arithmetic and a binary search over
//! its corpus's document offsets.

use std::sync::Arc;

use super::{FileList, Manifest, ManifestError, ObjectNames, SampleLoc, MAX_FILES};

/// One stretch of a window's bytes, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowPart {
    /// `len_bytes` of object `object` from `offset_bytes`.
    Read {
        /// The object (an index into the manifest's objects).
        object: u32,
        /// Where the bytes start in it.
        offset_bytes: u64,
        /// How many.
        len_bytes: u64,
    },
    /// One token the loader writes (the separator between documents).
    Token(u64),
}

/// The windows of a run: how many, how long, and each one's parts and
/// document starts. Implemented by `crate::tokens`.
pub trait Windows: Send + Sync + std::fmt::Debug {
    /// Windows in all (the samples).
    fn len(&self) -> u64;

    /// True when there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of one window: `(L + 1) × item bytes`.
    fn window_bytes(&self) -> u64;

    /// Bytes of one token.
    fn item_bytes(&self) -> u64;

    /// Appends window `index`'s parts to `parts` (their bytes add up to
    /// `window_bytes`) and the token offsets in it (0 to L) where a
    /// document starts, ascending and distinct, to `starts`.
    ///
    /// # Panics
    /// If `index >= len()`.
    fn window(&self, index: u64, parts: &mut Vec<WindowPart>, starts: &mut Vec<u32>);

    /// Where window `index`'s first byte is: its first read's object and
    /// offset (for messages and the stall probe).
    fn first_byte(&self, index: u64) -> (u32, u64);

    /// A digest of which windows these are: the corpora's objects, their
    /// documents, the window length, the separator (for the plan digest).
    fn digest(&self) -> u64;
}

impl Manifest {
    /// The manifest of `windows` over `files` (every corpus's objects, in
    /// the order the windows' parts name them). Refused: no window, more
    /// than `MAX_FILES` objects.
    pub fn from_windows(
        files: FileList,
        windows: Arc<dyn Windows>,
        names: &dyn ObjectNames,
    ) -> Result<Manifest, ManifestError> {
        if files.len() as u64 > MAX_FILES {
            return Err(ManifestError::TooManyFiles {
                path: names.source_name(),
                max: MAX_FILES,
            });
        }
        if windows.is_empty() {
            return Err(ManifestError::Empty {
                path: names.source_name(),
            });
        }
        let len = windows.len();
        let window_bytes = windows.window_bytes();
        Ok(Manifest {
            files: Arc::new(files),
            record_bytes: None,
            first_record: Vec::new(),
            ranges: None,
            key_facts: None,
            len,
            total_bytes: len.saturating_mul(window_bytes),
            max_sample_bytes: window_bytes,
            windows: Some(windows),
        })
    }

    /// The windows, in windows mode.
    pub fn windows(&self) -> Option<&Arc<dyn Windows>> {
        self.windows.as_ref()
    }

    /// Sample `index` of windows mode as one location: its first byte's
    /// object and offset, and the window's length (its bytes may continue
    /// in other objects: [`Manifest::windows`] gives them all).
    pub(super) fn window_loc(windows: &dyn Windows, index: u64) -> SampleLoc {
        let (file, offset_bytes) = windows.first_byte(index);
        SampleLoc {
            file,
            offset_bytes,
            len_bytes: windows.window_bytes(),
        }
    }
}
