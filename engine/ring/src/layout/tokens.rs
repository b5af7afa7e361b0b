//! What a loader serving token windows (`serve --seq-len L`, docs/tokens.md)
//! puts in each batch, as header words 1544–1607 record it
//! ([`super::flags::TOKENS_KNOWN`]): sample i is `L + 1` tokens of one
//! dtype at `i × (L + 1) × item bytes` of the payload, and the batch's
//! document starts sit after them, in two arrays at fixed offsets.

/// Header words the token format takes, from [`TOKENS_OFFSET`].
pub const TOKEN_WORDS: usize = 8;
/// Where the token format sits in the header.
pub const TOKENS_OFFSET: usize = 1544;
/// Most document starts one sample may carry (`--max-doc-starts`).
pub const MAX_DOC_STARTS: u32 = 1 << 16;

/// The token layout of a run's batches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenFormat {
    /// The tokens' dtype as a numpy type string (`<u2`, `<i4`, ...),
    /// ASCII, NUL-padded.
    pub dtype: [u8; 8],
    /// `L`: a sample holds `L + 1` tokens (inputs and targets shifted by one).
    pub seq_len: u64,
    /// Payload offset of the batch's document-start counts: one
    /// little-endian u32 per sample, the number of documents that start in
    /// it (more than `doc_starts_max` when some were left out).
    pub doc_counts_offset: u64,
    /// Payload offset of the batch's document starts: `doc_starts_max`
    /// little-endian u32 per sample, the token offsets (in `0..=L`) where a
    /// document starts, ascending; the first `min(count, max)` are valid.
    pub doc_starts_offset: u64,
    /// Capacity of each sample's starts.
    pub doc_starts_max: u32,
    /// The token put between documents (`--eos-token`), if any.
    pub eos_token: Option<u64>,
    /// Corpora the run draws from (its `--source`s); 0: not said.
    pub corpora: u32,
}

impl TokenFormat {
    /// The layout of batches of up to `samples` windows of `seq_len + 1`
    /// tokens of `item_bytes` each: counts after the tokens (8-aligned),
    /// starts after the counts (8-aligned). None on overflow.
    pub fn plan(
        dtype: [u8; 8],
        seq_len: u64,
        item_bytes: u64,
        samples: u32,
        doc_starts_max: u32,
    ) -> Option<TokenFormat> {
        let tokens = seq_len
            .checked_add(1)?
            .checked_mul(item_bytes)?
            .checked_mul(u64::from(samples))?;
        let doc_counts_offset = tokens.checked_add(7)? / 8 * 8;
        let counts = 4 * u64::from(samples);
        let doc_starts_offset = doc_counts_offset.checked_add(counts)?.checked_add(7)? / 8 * 8;
        Some(TokenFormat {
            dtype,
            seq_len,
            doc_counts_offset,
            doc_starts_offset,
            doc_starts_max,
            eos_token: None,
            corpora: 0,
        })
    }

    /// Bytes of one token, from the dtype string (`<u2` is 2); 0 when the
    /// string is not one this format knows.
    pub fn item_bytes(&self) -> u64 {
        match &self.dtype[..3] {
            b"|u1" | b"|i1" => 1,
            b"<u2" | b"<i2" => 2,
            b"<u4" | b"<i4" => 4,
            b"<u8" | b"<i8" => 8,
            _ => 0,
        }
    }

    /// The dtype as text (`<u2`).
    pub fn dtype_str(&self) -> &str {
        let end = self.dtype.iter().position(|&b| b == 0).unwrap_or(8);
        std::str::from_utf8(&self.dtype[..end]).unwrap_or("")
    }

    /// Bytes of a slot's payload a batch of `samples` windows takes: the
    /// tokens, the counts, the starts (the layout the loader plans).
    pub fn batch_bytes(&self, samples: u32) -> u64 {
        let starts = 4u64
            .saturating_mul(u64::from(self.doc_starts_max))
            .saturating_mul(u64::from(samples));
        self.doc_starts_offset.saturating_add(starts)
    }

    /// Checks a format read from a header against the slots it describes:
    /// a known dtype, and every region of a batch of `max_samples` inside
    /// `payload_bytes`, in order, without overflow.
    pub fn check(&self, max_samples: u32, payload_bytes: u64) -> Result<(), String> {
        let n = u64::from(max_samples);
        let item = self.item_bytes();
        let tokens = self
            .seq_len
            .checked_add(1)
            .and_then(|t| t.checked_mul(item))
            .and_then(|t| t.checked_mul(n));
        let counts_end = n
            .checked_mul(4)
            .and_then(|c| c.checked_add(self.doc_counts_offset));
        let starts_end = n
            .checked_mul(4)
            .and_then(|b| b.checked_mul(u64::from(self.doc_starts_max)))
            .and_then(|b| b.checked_add(self.doc_starts_offset));
        match (tokens, counts_end, starts_end) {
            (Some(tokens), Some(counts_end), Some(starts_end))
                if item > 0
                    && self.seq_len > 0
                    && self.doc_starts_max <= MAX_DOC_STARTS
                    && tokens <= self.doc_counts_offset
                    && self.doc_counts_offset.is_multiple_of(4)
                    && counts_end <= self.doc_starts_offset
                    && self.doc_starts_offset.is_multiple_of(4)
                    && starts_end <= payload_bytes =>
            {
                Ok(())
            }
            _ => Err(format!(
                "its token format {self:?} does not fit slots of {payload_bytes} bytes and {max_samples} samples"
            )),
        }
    }

    /// The header words that record this format (see docs/ring-layout.md).
    pub fn to_words(&self) -> [u64; TOKEN_WORDS] {
        [
            u64::from_le_bytes(self.dtype),
            self.seq_len,
            self.doc_counts_offset,
            self.doc_starts_offset,
            u64::from(self.doc_starts_max),
            u64::from(self.eos_token.is_some()),
            self.eos_token.unwrap_or(0),
            u64::from(self.corpora),
        ]
    }

    /// The format header words record; not yet checked.
    pub fn from_words(w: [u64; TOKEN_WORDS]) -> TokenFormat {
        TokenFormat {
            dtype: w[0].to_le_bytes(),
            seq_len: w[1],
            doc_counts_offset: w[2],
            doc_starts_offset: w[3],
            // Saturating: a hostile value fails `check`'s limit.
            doc_starts_max: u32::try_from(w[4]).unwrap_or(u32::MAX),
            eos_token: (w[5] & 1 != 0).then_some(w[6]),
            corpora: u32::try_from(w[7]).unwrap_or(u32::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dtype(s: &str) -> [u8; 8] {
        let mut d = [0u8; 8];
        d[..s.len()].copy_from_slice(s.as_bytes());
        d
    }

    #[test]
    fn a_planned_format_fits_its_slots_and_survives_the_header() {
        let f = TokenFormat::plan(dtype("<u2"), 2048, 2, 8, 64).unwrap();
        assert_eq!(f.doc_counts_offset, 8 * 2049 * 2);
        assert_eq!(f.doc_starts_offset, f.doc_counts_offset + 32);
        assert!(f.check(8, f.batch_bytes(8)).is_ok());
        assert!(f.check(8, f.batch_bytes(8) - 1).is_err());
        let back = TokenFormat::from_words(
            TokenFormat {
                eos_token: Some(50256),
                corpora: 2,
                ..f
            }
            .to_words(),
        );
        assert_eq!(back.eos_token, Some(50256));
        assert_eq!(
            (back.dtype_str(), back.item_bytes(), back.corpora),
            ("<u2", 2, 2)
        );
    }

    #[test]
    fn a_hostile_token_format_is_refused_without_overflow() {
        for w in [
            [u64::MAX; TOKEN_WORDS],
            [0; TOKEN_WORDS],
            [u64::from_le_bytes(dtype("<u8")), u64::MAX, 0, 0, 1, 0, 0, 0],
            [u64::from_le_bytes(dtype("<x9")), 4, 16, 32, 1, 0, 0, 0],
        ] {
            let f = TokenFormat::from_words(w);
            assert!(f.check(4, 1 << 20).is_err(), "{f:?}");
            let _ = f.batch_bytes(u32::MAX);
        }
    }
}
