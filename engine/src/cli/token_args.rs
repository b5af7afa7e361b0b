//! `ringfeed serve`'s token flags (`--seq-len` and its company), and the
//! token run they make (docs/tokens.md).

use std::path::Path;

use anyhow::{bail, Result};
use clap::Args;

use crate::loader::{TokensConfig, DEFAULT_DOC_STARTS_MAX};
use crate::source::{ManifestCache, SourceSpec};
use crate::tokens::{CorpusSpec, TokenDtype, TokenFormatKind};

/// The token flags, part of [`ServeArgs`](super::serve::ServeArgs).
#[derive(Args, Debug, Clone)]
pub struct TokenArgs {
    /// Serve windows of L + 1 tokens (inputs and targets shifted by one)
    /// cut from the concatenation of a token corpus's documents: Megatron
    /// .bin/.idx, datatrove .ds, LitData TokensLoader chunks, MDS shards, or
    /// flat token files (docs/tokens.md).
    #[arg(long, value_name = "L")]
    pub seq_len: Option<u64>,
    /// The token type of flat token files (--format tokens): uint16 (GPT-2's
    /// vocabulary, nanoGPT's train.bin), uint32, int32, ...; a check for the
    /// formats that say their own.
    #[arg(long, value_name = "DTYPE")]
    pub token_dtype: Option<TokenDtype>,
    /// Put this token between documents (for corpora stored without one);
    /// by default no token is inserted.
    #[arg(long, value_name = "ID")]
    pub eos_token: Option<u64>,
    /// With several --source: how much of each an epoch draws, one decimal
    /// per source in order (e.g. 0.7,0.3); default equal.
    #[arg(long, value_name = "W1,W2,...")]
    pub weights: Option<String>,
    /// Samples in an epoch of a mixture (default: the most that repeat no
    /// source's window; more re-shuffle a source that runs out).
    #[arg(long, value_name = "N")]
    pub samples_per_epoch: Option<u64>,
    /// Document starts each window carries at most (more are counted and
    /// said).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_DOC_STARTS_MAX)]
    pub max_doc_starts: u32,
}

impl TokenArgs {
    /// Whether any token flag but `--seq-len` was given.
    fn others_given(&self) -> Option<&'static str> {
        [
            (self.token_dtype.is_some(), "--token-dtype"),
            (self.eos_token.is_some(), "--eos-token"),
            (self.weights.is_some(), "--weights"),
            (self.samples_per_epoch.is_some(), "--samples-per-epoch"),
            (
                self.max_doc_starts != DEFAULT_DOC_STARTS_MAX,
                "--max-doc-starts",
            ),
        ]
        .into_iter()
        .find_map(|(given, name)| given.then_some(name))
    }

    /// The token run these flags and `sources` (every `--source`, in
    /// order) ask for; None without `--seq-len`. `format` is the token
    /// format `--format` named (None: told from the data).
    pub fn config(
        &self,
        sources: &[String],
        keys: Option<&Path>,
        format: Option<TokenFormatKind>,
        cache_dir: Option<&Path>,
    ) -> Result<Option<TokensConfig>> {
        let Some(seq_len) = self.seq_len else {
            if let Some(flag) = self.others_given() {
                bail!("{flag} shapes a token run: add --seq-len L (samples of L + 1 tokens)");
            }
            if let Some(f) = format {
                bail!(
                    "--format {} serves token windows: add --seq-len L (samples of L + 1 tokens)",
                    f.name()
                );
            }
            if sources.len() > 1 {
                bail!("{} --source given: mixing sources is for token corpora (add --seq-len L and --weights); otherwise pass one", sources.len());
            }
            return Ok(None);
        };
        if seq_len == 0 || seq_len > u64::from(u32::MAX) - 1 {
            bail!(
                "--seq-len {seq_len}: a window holds L + 1 tokens, L from 1 to {}",
                u32::MAX - 1
            );
        }
        if keys.is_some() && sources.len() > 1 {
            bail!("--keys lists the objects of one remote --source; with several sources give each a prefix, a Megatron PREFIX, or a file");
        }
        let mut corpora = Vec::with_capacity(sources.len());
        for (i, s) in sources.iter().enumerate() {
            let keys = if i == 0 { keys } else { None };
            corpora.push(CorpusSpec {
                source: SourceSpec::parse(s, keys).map_err(anyhow::Error::msg)?,
                format: format.unwrap_or(TokenFormatKind::Auto),
            });
        }
        let weights = match &self.weights {
            None => None,
            Some(w) => {
                let list: Vec<String> = w.split(',').map(|x| x.trim().to_owned()).collect();
                if list.len() != sources.len() {
                    bail!("--weights {w} gives {} weight(s) for {} --source(s); give one per source, in the same order", list.len(), sources.len());
                }
                Some(list)
            }
        };
        if let (Some(eos), Some(dtype)) = (self.eos_token, self.token_dtype) {
            if !dtype.holds(eos) {
                bail!("--eos-token {eos} does not fit --token-dtype {dtype}");
            }
        }
        if self.max_doc_starts > crate::ring::layout::MAX_DOC_STARTS {
            bail!(
                "--max-doc-starts {} is above the limit of {}",
                self.max_doc_starts,
                crate::ring::layout::MAX_DOC_STARTS
            );
        }
        Ok(Some(TokensConfig {
            corpora,
            weights,
            samples_per_epoch: self.samples_per_epoch,
            seq_len,
            dtype: self.token_dtype,
            eos: self.eos_token,
            doc_starts_max: self.max_doc_starts,
            keep_dir: ManifestCache::dir_under(cache_dir)
                .map(|d| crate::tokens::access::token_dir_beside(&d)),
        }))
    }
}
