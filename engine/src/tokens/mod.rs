//! Token corpora as a source format (`serve --seq-len L`, docs/tokens.md):
//! pre-tokenized documents in the formats people already have, served as
//! fixed-length windows of `L + 1` tokens with their document starts.
//!
//! A corpus is read at start into [`Part`]s (a file, a chunk, a shard:
//! where its tokens are and where its documents start), from its format's
//! own index, mapped in place or read in ranges, never into an object per
//! document. [`Corpus`] cuts the concatenation of its documents into
//! windows by arithmetic and a binary search; [`TokenSet`] puts the
//! corpora of a mixture end to end, and is the manifest's
//! [`Windows`](crate::manifest::Windows). The formats:
//!
//! - `flat`: nanoGPT's `train.bin` (`--format tokens --token-dtype T`);
//! - `megatron`: Megatron-Core's `PREFIX.bin` + `PREFIX.idx`;
//! - `datatrove`: `NAME.ds` + `NAME.ds.index`;
//! - `litdata`: LitData's `optimize()` output with `TokensLoader`;
//! - `mds`: MosaicML MDS shards with a token column (zstd shards too).
//!
//! `open` resolves a `--source` into objects (a directory, a prefix, a
//! Megatron `PREFIX`, one file), tells the format, and builds the corpus;
//! `access` reads index files local or remote.

pub mod access;
pub mod column;
pub mod corpus;
pub mod datatrove;
pub mod docs;
pub mod dtype;
pub mod flat;
pub mod litdata;
pub mod mds;
pub mod megatron;
pub mod open;
pub mod set;

use std::path::PathBuf;

pub use corpus::{Corpus, CorpusError, Part};
pub use dtype::TokenDtype;
pub use open::{open_corpus, CorpusSpec, OpenedCorpus, TokenFormatKind, TokenOptions};
pub use set::TokenSet;

/// Why a token corpus cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The source cannot be opened or listed.
    #[error(transparent)]
    Listing(#[from] crate::manifest::ManifestError),
    /// The source's objects are not a token corpus of the format asked for
    /// (or of any known one).
    #[error("{0}")]
    Format(String),
    /// An index or header is malformed, or does not match its data.
    #[error("{name}: {problem}")]
    Index {
        /// The object.
        name: String,
        /// What is wrong, and the fix.
        problem: String,
    },
    /// An index or header could not be read.
    #[error("cannot read {name}: {problem}; check that it exists, is readable, and did not change since it was listed")]
    Read {
        /// The object.
        name: String,
        /// The cause.
        problem: String,
    },
    /// The token cache directory cannot be used.
    #[error("the token cache directory {}: {cause}; pass a --cache-dir of your own", dir.display())]
    CacheDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        cause: String,
    },
    /// The corpus cannot be cut into windows.
    #[error(transparent)]
    Corpus(#[from] CorpusError),
    /// The corpora of a mixture do not go together.
    #[error("{0}")]
    Mixture(String),
}
