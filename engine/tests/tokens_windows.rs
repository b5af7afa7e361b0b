//! The window rule against a model (docs/tokens.md, "The window rule"):
//! window k of a corpus is tokens [k·L, k·L + L + 1) of the concatenation
//! of its documents in corpus order, with `--eos-token` between documents;
//! its document starts are the offsets in it where a document begins. The
//! corpora here are random: documents (empty ones too) spread over parts of
//! every layout (contiguous, after a header, scattered between headers),
//! the bytes in in-memory objects; every window's parts are executed
//! against them and compared with the model's slice.

use proptest::prelude::*;
use ringfeed::manifest::{WindowPart, Windows};
use ringfeed::tokens::column::Column;
use ringfeed::tokens::docs::DocList;
use ringfeed::tokens::{Corpus, Part, TokenDtype, TokenSet};

/// A corpus built from documents, its objects' bytes, and the model stream.
struct Built {
    corpus: Corpus,
    objects: Vec<Vec<u8>>,
    /// The stream windows are cut from, and where each document starts in it.
    stream: Vec<u64>,
    starts: Vec<u64>,
}

/// Lays `docs` (token ids as u16) out over parts of `part_docs` documents
/// each, alternating the layouts, and builds the corpus.
fn build(docs: &[Vec<u16>], part_docs: usize, seq_len: u64, eos: Option<u64>) -> Option<Built> {
    let mut objects = Vec::new();
    let mut parts = Vec::new();
    for (p, group) in docs.chunks(part_docs.max(1)).enumerate() {
        let mut bytes = Vec::new();
        let layout = p % 3;
        // Layout 1: a header of 13 bytes before the tokens.
        if layout == 1 {
            bytes.extend_from_slice(&[0xAB; 13]);
        }
        let first = bytes.len() as u64;
        let mut starts = Vec::new();
        let mut offsets = Vec::new();
        let mut t = 0u64;
        for d in group {
            // Layout 2: 5 bytes of "sample header" before each document.
            if layout == 2 {
                bytes.extend_from_slice(&[0xCD; 5]);
            }
            starts.push(t);
            offsets.push(bytes.len() as u64);
            for tok in d {
                bytes.extend_from_slice(&tok.to_le_bytes());
            }
            t += d.len() as u64;
        }
        let docs = match layout {
            0 if group.len() == 1 => DocList::Single,
            0 => {
                // datatrove's layout: document ends.
                let ends: Vec<u64> = starts[1..].iter().copied().chain([t]).collect();
                DocList::Ends(Column::owned(&ends))
            }
            _ => DocList::Starts(Column::owned(&starts)),
        };
        parts.push(Part {
            object: objects.len() as u32,
            offset_bytes: first,
            tokens: t,
            docs,
            doc_offsets: (layout == 2).then(|| Column::owned(&offsets)),
        });
        objects.push(bytes);
    }
    // The model: the non-empty parts' documents, in order.
    let kept: Vec<&Vec<u16>> = docs
        .chunks(part_docs.max(1))
        .filter(|g| g.iter().any(|d| !d.is_empty()))
        .flatten()
        .collect();
    let mut stream = Vec::new();
    let mut doc_starts = Vec::new();
    for (i, d) in kept.iter().enumerate() {
        doc_starts.push(stream.len() as u64);
        stream.extend(d.iter().map(|&t| u64::from(t)));
        if let (Some(e), true) = (eos, i + 1 < kept.len()) {
            stream.push(e);
        }
    }
    let corpus = Corpus::new("model".into(), TokenDtype::U16, parts, seq_len, eos).ok()?;
    Some(Built {
        corpus,
        objects,
        stream,
        starts: doc_starts,
    })
}

/// Executes window `k`'s parts against the objects. The starts vector
/// already holds another window's, as a batch's does: they stay, and do not
/// count against this window's.
fn read_window(set: &TokenSet, objects: &[Vec<u8>], k: u64) -> (Vec<u64>, Vec<u32>) {
    let (mut parts, mut starts) = (Vec::new(), vec![0, 1, 2, 3, 4, 5, 6, 7, 8]);
    set.window(k, &mut parts, &mut starts);
    assert_eq!(starts[..9], [0, 1, 2, 3, 4, 5, 6, 7, 8]);
    let starts = starts.split_off(9);
    let mut tokens = Vec::new();
    for p in parts {
        match p {
            WindowPart::Read {
                object,
                offset_bytes,
                len_bytes,
            } => {
                let b = &objects[object as usize]
                    [offset_bytes as usize..(offset_bytes + len_bytes) as usize];
                tokens.extend(
                    b.chunks(2)
                        .map(|c| u64::from(u16::from_le_bytes([c[0], c[1]]))),
                );
            }
            WindowPart::Token(t) => tokens.push(t),
        }
    }
    (tokens, starts)
}

fn docs_strategy() -> impl Strategy<Value = Vec<Vec<u16>>> {
    prop::collection::vec(prop::collection::vec(0u16..1000, 0..12), 1..30)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn every_window_is_the_slice_of_the_concatenation_with_its_document_starts(
        docs in docs_strategy(),
        part_docs in 1usize..6,
        seq_len in 1u64..9,
        eos in prop::option::of(60000u64..60010),
    ) {
        let Some(b) = build(&docs, part_docs, seq_len, eos) else {
            // Shorter than one window: Corpus::new refuses it (tested below).
            return Ok(());
        };
        let n = b.corpus.windows();
        prop_assert_eq!(n, (b.stream.len() as u64 - 1) / seq_len);
        let set = TokenSet::new(vec![b.corpus], &[b.objects.len() as u32]);
        prop_assert_eq!(set.window_bytes(), (seq_len + 1) * 2);
        for k in 0..n {
            let (tokens, starts) = read_window(&set, &b.objects, k);
            let (v0, v1) = (k * seq_len, k * seq_len + seq_len + 1);
            prop_assert_eq!(&tokens[..], &b.stream[v0 as usize..v1 as usize], "window {}", k);
            // The model's starts: each non-empty document's (an empty one
            // without a separator takes no token, and shares the next's).
            let mut want: Vec<u32> = Vec::new();
            for (i, &s) in b.starts.iter().enumerate() {
                let end = b.starts.get(i + 1).copied().unwrap_or(b.stream.len() as u64);
                if s >= v0 && s < v1 && end > s && want.last() != Some(&((s - v0) as u32)) {
                    want.push((s - v0) as u32);
                }
            }
            prop_assert_eq!(starts, want, "window {}", k);
        }
    }
}

#[test]
fn corpora_end_to_end_number_their_windows_and_objects_in_order() {
    let a = build(&[vec![1, 2, 3, 4, 5]], 1, 2, None).unwrap();
    let b = build(&[vec![7, 8, 9], vec![10, 11]], 1, 2, None).unwrap();
    let (na, nb) = (a.corpus.windows(), b.corpus.windows());
    let mut objects = a.objects.clone();
    objects.extend(b.objects.clone());
    let set = TokenSet::new(vec![a.corpus, b.corpus], &[1, 2]);
    assert_eq!((na, nb, set.len()), (2, 2, 4));
    assert_eq!(set.locate(2), (1, 0));
    assert_eq!(read_window(&set, &objects, 1).0, [3, 4, 5]);
    assert_eq!(read_window(&set, &objects, 2), (vec![7, 8, 9], vec![0]));
    assert_eq!(read_window(&set, &objects, 3), (vec![9, 10, 11], vec![1]));
}

#[test]
fn a_corpus_shorter_than_one_window_is_refused_naming_the_fix() {
    let docs = [vec![1u16, 2], vec![3]];
    assert!(
        build(&docs, 1, 2, None).is_some(),
        "3 tokens make one window of 2 + 1"
    );
    let e = Corpus::new("short".into(), TokenDtype::U16, Vec::new(), 2, None).unwrap_err();
    assert!(e.to_string().contains("--seq-len 2"), "{e}");
    assert!(build(&docs, 1, 3, None).is_none());
    assert!(
        build(&docs, 1, 3, Some(9)).is_some(),
        "the separator makes 4 tokens"
    );
}
