//! What a loader serving token windows (`ringfeed serve --seq-len L`;
//! docs/tokens.md) puts in each batch: sample i is `L + 1` tokens, and the
//! batch's document starts sit at fixed offsets of the payload.

use crate::{fail, guard, rf_feed, RF_E_INVALID, RF_OK};

/// The token layout of a loader's batches (`rf_get_token_format`): sample i
/// is `seq_len + 1` tokens of `item_bytes` each at `batch.data + i ×
/// (seq_len + 1) × item_bytes`; `batch.data + doc_counts_offset` holds
/// `n_samples` little-endian uint32, the documents starting in each sample
/// (more than `doc_starts_max` when some were left out);
/// `batch.data + doc_starts_offset` holds `doc_starts_max` little-endian
/// uint32 per sample, the token offsets (0 to `seq_len`) where those
/// documents start, ascending.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct rf_token_format {
    /// 1: samples are token windows as below; 0: they are the objects'
    /// bytes (and the other fields are 0).
    pub is_tokens: u32,
    /// Bytes of one token: 1, 2, 4 or 8.
    pub item_bytes: u32,
    /// The tokens' type as a numpy type string (`<u2`, `<i4`, `|u1`),
    /// NUL-terminated.
    pub dtype: [u8; 8],
    /// L: a sample holds L + 1 tokens.
    pub seq_len: u64,
    /// Payload offset of the per-sample document counts.
    pub doc_counts_offset: u64,
    /// Payload offset of the document starts.
    pub doc_starts_offset: u64,
    /// Document starts each sample has room for.
    pub doc_starts_max: u32,
    /// 1 when the loader puts `eos_token` between documents.
    pub has_eos: u32,
    /// The token between documents (`--eos-token`), if `has_eos`.
    pub eos_token: u64,
    /// Corpora the run draws from (its `--source`s).
    pub corpora: u32,
    /// Zero (padding).
    pub reserved: u32,
}

const _: () = assert!(std::mem::size_of::<rf_token_format>() == 64);

/// Fills `*format` with the token layout of the loader's batches, or with
/// `is_tokens` 0 when its samples are the objects' bytes. The same for
/// every batch of the run.
///
/// # Safety
/// `feed` comes from rf_attach and was not detached; `format` is writable.
#[no_mangle]
pub unsafe extern "C" fn rf_get_token_format(
    feed: *const rf_feed,
    format: *mut rf_token_format,
) -> i32 {
    guard(|| {
        if feed.is_null() || format.is_null() {
            return fail(
                RF_E_INVALID,
                "rf_get_token_format: feed and format must not be NULL",
            );
        }
        // SAFETY: a live feed from rf_attach.
        let consumer = unsafe { &(*feed).consumer };
        let out = match consumer.job().tokens {
            Some(t) => {
                // The dtype as a C string: at most 7 characters and a NUL.
                let mut dtype = t.dtype;
                dtype[7] = 0;
                rf_token_format {
                    is_tokens: 1,
                    item_bytes: t.item_bytes() as u32,
                    dtype,
                    seq_len: t.seq_len,
                    doc_counts_offset: t.doc_counts_offset,
                    doc_starts_offset: t.doc_starts_offset,
                    doc_starts_max: t.doc_starts_max,
                    has_eos: u32::from(t.eos_token.is_some()),
                    eos_token: t.eos_token.unwrap_or(0),
                    corpora: t.corpora,
                    reserved: 0,
                }
            }
            None => rf_token_format::default(),
        };
        // SAFETY: non-NULL and writable by contract.
        unsafe { *format = out };
        RF_OK
    })
}
