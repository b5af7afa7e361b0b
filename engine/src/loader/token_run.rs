//! A token run's configuration and what its loop needs (`serve --seq-len`,
//! docs/tokens.md): the windows, the mixture, the slot's token layout, and
//! the writing of a batch's separators and document starts into its slot.
//! Planned in `tokens.rs`.

use std::path::PathBuf;
use std::sync::Arc;

use crate::ring::layout::TokenFormat;
use crate::sampler::Mixture;
use crate::tokens::{CorpusSpec, TokenDtype, TokenSet};

/// Document starts a window carries at most, by default
/// (`--max-doc-starts`): 64 u32 per window, 256 bytes beside a window of
/// 2,049 uint16 tokens (4 KiB); more are counted, and said.
pub const DEFAULT_DOC_STARTS_MAX: u32 = 64;

/// How a token run reads and cuts its corpora (`--seq-len` and its flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokensConfig {
    /// Every `--source`, in order (the first is `ServeConfig::source`).
    pub corpora: Vec<CorpusSpec>,
    /// `--weights`, one decimal per source; None: equal, or one source.
    pub weights: Option<Vec<String>>,
    /// `--samples-per-epoch`: more than the default, the most that repeat
    /// no corpus.
    pub samples_per_epoch: Option<u64>,
    /// `L`.
    pub seq_len: u64,
    /// `--token-dtype`.
    pub dtype: Option<TokenDtype>,
    /// `--eos-token`.
    pub eos: Option<u64>,
    /// `--max-doc-starts`: each window's room for document starts.
    pub doc_starts_max: u32,
    /// Where remote indexes (and decompressed shards) are kept.
    pub keep_dir: Option<PathBuf>,
}

impl TokensConfig {
    /// Whether the corpora are drawn through a mixture (several sources,
    /// weights, or more samples per epoch than one corpus's windows).
    pub fn mixes(&self) -> bool {
        self.corpora.len() > 1 || self.weights.is_some() || self.samples_per_epoch.is_some()
    }
}

/// What the loop needs of a token run beside the manifest.
#[derive(Debug)]
pub struct TokenRun {
    /// The corpora's windows.
    pub set: Arc<TokenSet>,
    /// How an epoch's positions become windows, when the corpora are mixed.
    pub mixture: Option<Arc<Mixture>>,
    /// The slot's layout, as the ring's header records it.
    pub format: TokenFormat,
    /// Each data object as messages name it (an absolute path, a URL).
    pub names: Vec<String>,
    /// A window's starts passed `--max-doc-starts` (said once).
    pub(super) overflow_said: std::sync::atomic::AtomicBool,
}

/// Writes a planned batch's separator tokens and its windows' document
/// starts into its slot (pending batch `id`): the tokens at their places
/// among the windows, each window's count and starts in the regions
/// `run.format` names. A window with more starts than the room keeps the
/// first ones and its true count; the first such window of a run is said.
pub(super) fn write_extras(
    run: &TokenRun,
    plan: &crate::planner::BatchPlan,
    pending: &mut super::pending::Pending,
    id: usize,
) {
    let f = &run.format;
    let item = f.item_bytes() as usize;
    for fill in &plan.fills {
        let bytes = fill.token.to_le_bytes();
        put(pending, id, fill.dest_offset_bytes, &bytes[..item]);
    }
    let room = f.doc_starts_max as usize;
    let mut from = 0usize;
    for (i, &end) in plan.doc_starts_end.iter().enumerate() {
        let starts = &plan.doc_starts[from..end];
        from = end;
        let count = starts.len() as u32;
        put(
            pending,
            id,
            f.doc_counts_offset + 4 * i as u64,
            &count.to_le_bytes(),
        );
        let kept = &starts[..starts.len().min(room)];
        let mut bytes = Vec::with_capacity(4 * kept.len());
        for s in kept {
            bytes.extend_from_slice(&s.to_le_bytes());
        }
        let at = f.doc_starts_offset + 4 * (i * room) as u64;
        put(pending, id, at, &bytes);
        if starts.len() > room
            && !run
                .overflow_said
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(
                "a window holds {} document starts, more than --max-doc-starts {room}: its batch carries the first {room} and the count; \
                 raise --max-doc-starts for exact document masks (ringfeed.torch then joins the rest to the last document)",
                starts.len()
            );
        }
    }
}

/// Copies `bytes` to `offset` of pending batch `id`'s payload.
fn put(pending: &mut super::pending::Pending, id: usize, offset: u64, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let dest = pending.dest(id, offset, bytes.len() as u64);
    // SAFETY: `dest` holds `bytes.len()` bytes inside the claimed slot's
    // payload (Pending::dest checks the range), which no consumer sees
    // before it is published; the planner puts separators where no read
    // lands, and the starts region lies after every window.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dest, bytes.len()) };
}
