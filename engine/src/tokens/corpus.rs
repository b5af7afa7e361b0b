//! A corpus: the concatenation of its documents in corpus order, cut into
//! windows of `L + 1` tokens that overlap by one (docs/tokens.md, "The
//! window rule"). Window k is tokens `[k·L, k·L + L + 1)` of the stream;
//! with a separator (`--eos-token`) the stream is every document followed
//! by the separator but the last. A window finds its documents by a binary
//! search over their starts, read in place from the format's index.

use super::column::Column;
use super::docs::DocList;
use super::dtype::TokenDtype;
use crate::manifest::WindowPart;

/// A stretch of a corpus: a file, a chunk, a shard; its tokens and documents.
#[derive(Clone, Debug)]
pub struct Part {
    /// Its object, among the corpus's.
    pub object: u32,
    /// Where its token 0 is in the object (contiguous parts).
    pub offset_bytes: u64,
    /// Tokens it holds.
    pub tokens: u64,
    /// Where its documents start.
    pub docs: DocList,
    /// Scattered parts (MDS samples, with a header between them): where
    /// each document's first byte is in the object. None: the tokens are
    /// contiguous from `offset_bytes`.
    pub doc_offsets: Option<Column>,
}

/// A corpus: its parts in corpus order, and how its windows are cut.
#[derive(Clone, Debug)]
pub struct Corpus {
    name: String,
    dtype: TokenDtype,
    parts: Vec<Part>,
    /// Tokens before each part, and in all (`parts.len() + 1` entries).
    part_tokens: Vec<u64>,
    /// Documents before each part, and in all.
    part_docs: Vec<u64>,
    seq_len: u64,
    eos: Option<u64>,
}

/// Why a corpus cannot be cut into windows.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CorpusError {
    /// The stream is shorter than one window.
    #[error("{name} holds {tokens} tokens{with_eos}, fewer than one window of --seq-len {seq_len} + 1; lower --seq-len or add documents")]
    TooShort {
        /// The corpus.
        name: String,
        /// Its tokens (with separators).
        tokens: u64,
        /// ", separators included" or "".
        with_eos: &'static str,
        /// `L`.
        seq_len: u64,
    },
    /// The separator does not fit the dtype.
    #[error("--eos-token {token} does not fit {name}'s token dtype {dtype}; pass a token id of the corpus's vocabulary")]
    EosTooLarge {
        /// The corpus.
        name: String,
        /// The separator.
        token: u64,
        /// The dtype.
        dtype: TokenDtype,
    },
    /// Tokens in all pass 2^62 (only a corrupt index says so).
    #[error("{name}: its index claims more than 2^62 tokens; it is corrupt")]
    TooLarge {
        /// The corpus.
        name: String,
    },
}

impl Corpus {
    /// The corpus of `parts` (in corpus order; parts with no token are
    /// left out), named `name` in messages, cut into windows of
    /// `seq_len + 1` tokens with `eos` between documents.
    pub fn new(
        name: String,
        dtype: TokenDtype,
        parts: Vec<Part>,
        seq_len: u64,
        eos: Option<u64>,
    ) -> Result<Corpus, CorpusError> {
        if let Some(token) = eos {
            if !dtype.holds(token) {
                return Err(CorpusError::EosTooLarge { name, token, dtype });
            }
        }
        let parts: Vec<Part> = parts.into_iter().filter(|p| p.tokens > 0).collect();
        let mut part_tokens = Vec::with_capacity(parts.len() + 1);
        let mut part_docs = Vec::with_capacity(parts.len() + 1);
        let (mut tokens, mut docs) = (0u64, 0u64);
        for p in &parts {
            part_tokens.push(tokens);
            part_docs.push(docs);
            tokens = tokens
                .checked_add(p.tokens)
                .filter(|&t| t <= 1 << 62)
                .ok_or_else(|| CorpusError::TooLarge { name: name.clone() })?;
            docs += p.docs.len();
        }
        part_tokens.push(tokens);
        part_docs.push(docs);
        let corpus = Corpus {
            name,
            dtype,
            parts,
            part_tokens,
            part_docs,
            seq_len,
            eos,
        };
        if corpus.windows() == 0 {
            return Err(CorpusError::TooShort {
                name: corpus.name.clone(),
                tokens: corpus.stream_tokens(),
                with_eos: if eos.is_some() {
                    ", separators included"
                } else {
                    ""
                },
                seq_len,
            });
        }
        Ok(corpus)
    }

    /// The corpus as messages name it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its token dtype.
    pub fn dtype(&self) -> TokenDtype {
        self.dtype
    }

    /// Tokens stored (separators not counted).
    pub fn tokens(&self) -> u64 {
        self.part_tokens[self.parts.len()]
    }

    /// Documents.
    pub fn docs(&self) -> u64 {
        self.part_docs[self.parts.len()]
    }

    /// Parts (files, chunks, shards holding tokens).
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// Tokens of the stream windows are cut from: stored tokens, plus a
    /// separator between every two documents with `--eos-token`.
    pub fn stream_tokens(&self) -> u64 {
        match self.eos {
            Some(_) => self.tokens() + self.docs().saturating_sub(1),
            None => self.tokens(),
        }
    }

    /// Windows: `floor((stream − 1) / L)`, the last partial one dropped.
    pub fn windows(&self) -> u64 {
        let v = self.stream_tokens();
        if self.seq_len == 0 || v <= self.seq_len {
            return 0;
        }
        (v - 1) / self.seq_len
    }

    /// `L`.
    pub fn seq_len(&self) -> u64 {
        self.seq_len
    }

    /// The separator, if any.
    pub fn eos(&self) -> Option<u64> {
        self.eos
    }

    /// Where global document `d` starts, in stored tokens.
    fn start_of(&self, d: u64) -> u64 {
        let p = self.part_docs.partition_point(|&before| before <= d) - 1;
        self.part_tokens[p] + self.parts[p].docs.start(d - self.part_docs[p])
    }

    /// The first document starting at or after stored token `t`.
    fn first_doc_at_or_after(&self, t: u64) -> u64 {
        let n = self.parts.len();
        let p = self.part_tokens[..n].partition_point(|&before| before < t);
        // Every document of parts before p starts before t... but for the
        // last of them, which may start at or after t only if it is empty:
        // search the part that holds t (p - 1) from its first document.
        if p == 0 {
            return 0;
        }
        let q = p - 1;
        let local = self.parts[q]
            .docs
            .first_at_or_after(t - self.part_tokens[q]);
        self.part_docs[q] + local
    }

    /// The document whose stream span holds stream token `v` (with a
    /// separator: the largest d with `start(d) + d <= v`).
    fn doc_at_stream(&self, v: u64) -> u64 {
        let (mut lo, mut hi) = (0u64, self.docs());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.start_of(mid) + mid <= v {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.saturating_sub(1)
    }

    /// Appends the reads of stored tokens `[a, b)` to `out`, objects offset
    /// by `object_base`; adjacent reads of one object are merged.
    fn reads(&self, a: u64, b: u64, object_base: u32, out: &mut Vec<WindowPart>) {
        let item = self.dtype.item_bytes();
        let n = self.parts.len();
        let mut p = self.part_tokens[..n].partition_point(|&before| before <= a) - 1;
        let mut a = a;
        while a < b {
            let part = &self.parts[p];
            let base = self.part_tokens[p];
            let end = b.min(self.part_tokens[p + 1]);
            let object = object_base + part.object;
            match &part.doc_offsets {
                None => push_read(
                    out,
                    object,
                    part.offset_bytes + (a - base) * item,
                    (end - a) * item,
                ),
                Some(offsets) => {
                    let mut j = part.docs.doc_at(a - base);
                    let mut t = a;
                    while t < end {
                        let doc_end = if j + 1 < part.docs.len() {
                            base + part.docs.start(j + 1)
                        } else {
                            self.part_tokens[p + 1]
                        };
                        let stop = end.min(doc_end);
                        if stop > t {
                            let doc_start = base + part.docs.start(j);
                            push_read(
                                out,
                                object,
                                offsets.get(j) + (t - doc_start) * item,
                                (stop - t) * item,
                            );
                        }
                        t = stop;
                        j += 1;
                    }
                }
            }
            a = end;
            p += 1;
        }
    }

    /// Appends window `k`'s parts and document starts (see
    /// [`crate::manifest::Windows::window`]); objects offset by `object_base`.
    pub fn window(
        &self,
        k: u64,
        object_base: u32,
        parts: &mut Vec<WindowPart>,
        starts: &mut Vec<u32>,
    ) {
        assert!(k < self.windows(), "window {k} of {}", self.windows());
        let v0 = k * self.seq_len;
        let v1 = v0 + self.seq_len + 1;
        // `starts` may hold the batch's earlier windows' starts: dedupe
        // within this window only.
        let first = starts.len();
        let mut push_start = |v: u64| {
            let at = (v - v0) as u32;
            if starts.len() == first || starts.last() != Some(&at) {
                starts.push(at);
            }
        };
        let Some(eos) = self.eos else {
            self.reads(v0, v1, object_base, parts);
            let mut d = self.first_doc_at_or_after(v0);
            while d < self.docs() {
                let s = self.start_of(d);
                if s >= v1 {
                    break;
                }
                push_start(s);
                d += 1;
            }
            return;
        };
        let docs = self.docs();
        let mut d = self.doc_at_stream(v0);
        let mut v = v0;
        while v < v1 && d < docs {
            let s = self.start_of(d);
            let e = if d + 1 < docs {
                self.start_of(d + 1)
            } else {
                self.tokens()
            };
            let (vs, ve) = (s + d, e + d);
            let last = d + 1 == docs;
            if vs >= v0 && vs < v1 && (ve > vs || !last) {
                push_start(vs);
            }
            let (a, b) = (v.max(vs), v1.min(ve));
            if a < b {
                self.reads(a - d, b - d, object_base, parts);
                v = b;
            }
            if !last && v == ve && v < v1 {
                parts.push(WindowPart::Token(eos));
                v += 1;
            }
            d += 1;
        }
        debug_assert_eq!(v, v1, "window {k} of {}", self.name);
    }
}

/// Appends a read, merged into the last one when it continues it.
fn push_read(out: &mut Vec<WindowPart>, object: u32, offset_bytes: u64, len_bytes: u64) {
    if let Some(WindowPart::Read {
        object: o,
        offset_bytes: at,
        len_bytes: len,
    }) = out.last_mut()
    {
        if *o == object && *at + *len == offset_bytes {
            *len += len_bytes;
            return;
        }
    }
    out.push(WindowPart::Read {
        object,
        offset_bytes,
        len_bytes,
    });
}
