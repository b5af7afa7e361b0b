//! The windows of a run: one corpus's, or those of every corpus of a
//! mixture end to end. Window indices run corpus after corpus (corpus c's
//! window k is sample `first_window(c) + k`), and so do object indices, so
//! that a sample's index says which corpus it came from.

use super::corpus::Corpus;
use crate::manifest::{digest_words, WindowPart, Windows};

/// The corpora of a run and their windows, end to end.
#[derive(Debug)]
pub struct TokenSet {
    corpora: Vec<Corpus>,
    /// Windows before each corpus, and in all.
    window_base: Vec<u64>,
    /// Objects before each corpus.
    object_base: Vec<u32>,
    window_bytes: u64,
    item_bytes: u64,
}

impl TokenSet {
    /// The set of `corpora` (at least one, all of one dtype and window
    /// length), whose objects are `objects[c]` many each, in order.
    pub fn new(corpora: Vec<Corpus>, objects: &[u32]) -> TokenSet {
        debug_assert!(!corpora.is_empty() && objects.len() == corpora.len());
        let mut window_base = Vec::with_capacity(corpora.len() + 1);
        let mut object_base = Vec::with_capacity(corpora.len());
        let (mut windows, mut obj) = (0u64, 0u32);
        for (c, n) in corpora.iter().zip(objects) {
            window_base.push(windows);
            object_base.push(obj);
            windows = windows.saturating_add(c.windows());
            obj = obj.saturating_add(*n);
        }
        window_base.push(windows);
        let item_bytes = corpora[0].dtype().item_bytes();
        TokenSet {
            window_bytes: (corpora[0].seq_len() + 1) * item_bytes,
            item_bytes,
            corpora,
            window_base,
            object_base,
        }
    }

    /// The corpora.
    pub fn corpora(&self) -> &[Corpus] {
        &self.corpora
    }

    /// The sample index of corpus `c`'s first window.
    pub fn first_window(&self, c: usize) -> u64 {
        self.window_base[c]
    }

    /// The corpus of sample `index`, and its window in that corpus.
    pub fn locate(&self, index: u64) -> (usize, u64) {
        let c = self.window_base[..self.corpora.len()].partition_point(|&b| b <= index) - 1;
        (c, index - self.window_base[c])
    }
}

impl Windows for TokenSet {
    fn len(&self) -> u64 {
        self.window_base[self.corpora.len()]
    }

    fn window_bytes(&self) -> u64 {
        self.window_bytes
    }

    fn item_bytes(&self) -> u64 {
        self.item_bytes
    }

    fn window(&self, index: u64, parts: &mut Vec<WindowPart>, starts: &mut Vec<u32>) {
        let (c, k) = self.locate(index);
        self.corpora[c].window(k, self.object_base[c], parts, starts);
    }

    fn first_byte(&self, index: u64) -> (u32, u64) {
        let (mut parts, mut starts) = (Vec::new(), Vec::new());
        self.window(index, &mut parts, &mut starts);
        parts
            .iter()
            .find_map(|p| match *p {
                WindowPart::Read {
                    object,
                    offset_bytes,
                    ..
                } => Some((object, offset_bytes)),
                WindowPart::Token(_) => None,
            })
            .unwrap_or((self.object_base[self.locate(index).0], 0))
    }

    fn digest(&self) -> u64 {
        let mut words = vec![self.window_bytes, self.item_bytes];
        for c in &self.corpora {
            words.extend([
                c.seq_len(),
                c.eos().map_or(u64::MAX, |e| e ^ 0x5eed),
                c.tokens(),
                c.docs(),
                c.parts().len() as u64,
            ]);
            for p in c.parts() {
                words.extend([u64::from(p.object), p.offset_bytes, p.tokens, p.docs.len()]);
            }
        }
        digest_words(0x746f_6b65_6e73_6574, words)
    }
}
