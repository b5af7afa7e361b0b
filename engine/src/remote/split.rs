//! Where to cut a key range so that idle listing workers can take parts of
//! it (`list::list_parallel`). Pure: keys in, keys out.
//!
//! Keys are read as numbers in the alphabet the keys themselves use where
//! they vary: a page of `obj-000000` .. `obj-000999` varies in decimal
//! digits, so `obj-000999` is the number 999 in base 10, and the next page
//! is expected at 1000 .. 1999. (Reading them in a fixed base-64 alphabet
//! instead put every guess between `obj-0009..` and `obj-001`, where no key
//! is: each split was empty and the listing stayed sequential.)
//!
//! - An unbounded range (the tail of the prefix) is cut ahead of the
//!   current key at multiples of the span one page covered: one cut per
//!   idle worker, each new range about a page, the last one unbounded.
//! - A bounded range is cut into parts of whole pages between the current
//!   key and its end, as many as idle workers but no more than the pages its
//!   end is estimated to be away (a request asks for a whole page, whose keys
//!   past its range's end are parsed for nothing).
//! - Keys that fill the numbers irregularly (hashes) get ranges that end
//!   two standard deviations of a page early, so that a range fits its pages.
//!
//! A cut that is not strictly inside its range, or that object_store's
//! `Path` would not keep as it is, is dropped: any cuts give the same
//! listing; good ones give a fast one.

use object_store::path::Path;

/// Characters a cut key may be made of: ASCII-ordered, and each one kept as
/// is by object_store's `Path` (so a cut key round-trips).
pub const SPLIT_ALPHABET: &[u8] =
    b"-.0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz";
/// Most digits read after the fixed head of a key (64^16 fits a u128).
pub const SPLIT_DIGITS: usize = 16;
/// Most cuts made at once.
pub const CUTS_AT_ONCE_MAX: usize = 64;

/// The characters `keys` use at and after byte `skip` (where a page's keys
/// differ), sorted, restricted to [`SPLIT_ALPHABET`]; that whole alphabet
/// when fewer than two remain.
pub fn page_alphabet<'a>(keys: impl Iterator<Item = &'a [u8]>, skip: usize) -> Vec<u8> {
    let mut seen = [false; 128];
    for key in keys {
        for &c in key.get(skip..).unwrap_or_default() {
            if c < 128 {
                seen[c as usize] = true;
            }
        }
    }
    let alphabet: Vec<u8> = SPLIT_ALPHABET
        .iter()
        .copied()
        .filter(|&c| seen[c as usize])
        .collect();
    if alphabet.len() < 2 {
        SPLIT_ALPHABET.to_vec()
    } else {
        alphabet
    }
}

/// Bytes two keys share at their start.
pub fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Keys read as numbers: `width` digits in `alphabet` from byte `from`.
struct Digits<'a> {
    alphabet: &'a [u8],
    from: usize,
    width: usize,
}

impl Digits<'_> {
    fn base(&self) -> u128 {
        self.alphabet.len() as u128
    }

    /// The largest number `width` digits hold.
    fn max(&self) -> u128 {
        self.base().pow(self.width as u32) - 1
    }

    /// Index of the largest alphabet character <= c (0 below the
    /// alphabet): monotone, so the order of keys is kept.
    fn digit(&self, c: u8) -> u128 {
        self.alphabet.iter().rposition(|&a| a <= c).unwrap_or(0) as u128
    }

    fn number(&self, key: &[u8]) -> u128 {
        (0..self.width).fold(0u128, |n, i| {
            n * self.base() + key.get(self.from + i).map_or(0, |&c| self.digit(c))
        })
    }

    /// `head` followed by `n` in `width` digits.
    fn key(&self, head: &[u8], mut n: u128) -> Vec<u8> {
        let mut digits = vec![0u8; self.width];
        for d in digits.iter_mut().rev() {
            *d = self.alphabet[(n % self.base()) as usize];
            n /= self.base();
        }
        let mut key = head.to_vec();
        key.extend(digits);
        key
    }
}

/// Keys strictly between `current` and `upto` (or after `current` when the
/// range is unbounded), increasing, at which to cut the rest of a range
/// that began at `first` and has listed `seen` keys, for at most `parts`
/// idle workers. `floor`: bytes of the store's prefix, never changed.
/// `page_keys`: keys a listing page holds.
pub fn cut_points(
    first: &str,
    current: &str,
    upto: Option<&str>,
    alphabet: &[u8],
    parts: usize,
    (floor, seen, page_keys): (usize, usize, usize),
) -> Vec<String> {
    let cur = current.as_bytes();
    let skip = match upto {
        Some(hi) => common_prefix(cur, hi.as_bytes()),
        None => common_prefix(first.as_bytes(), cur),
    };
    // Read as digits the varying part and the alphabet characters just
    // before it (where a carry goes: `obj-000999` + 1 is `obj-001000`).
    let mut from = skip.min(cur.len());
    while from > floor && alphabet.contains(&cur[from - 1]) {
        from -= 1;
    }
    let end = upto.map_or(cur.len(), |hi| hi.len().max(cur.len()));
    let digits = Digits {
        alphabet,
        from,
        width: end.saturating_sub(from).min(SPLIT_DIGITS),
    };
    if digits.width == 0 || !current.is_char_boundary(from) || alphabet.len() < 2 {
        return Vec::new();
    }
    let at = digits.number(cur);
    let walked = at.saturating_sub(digits.number(first.as_bytes()));
    let gaps = seen.saturating_sub(1).max(1) as u128;
    let per_key = (walked / gaps).max(1);
    // A page holds `page_keys` keys: every request of a range asks for a
    // whole page and its keys are all parsed, those past the range's end
    // too. So each new range is a whole number of pages, ending where its
    // last page would (the current key opens a page, which ends
    // `page_keys - 1` keys on). Keys spaced irregularly (hashes) fill a
    // span unevenly: their ranges end two standard deviations early
    // (2 sqrt(page_keys) keys), so that a range fits its pages; one that
    // passed them by a few keys cost a request whose page was all another
    // range's (the parallel listing parsed 1.3 to 2.5 times the keys).
    let regular = walked.is_multiple_of(gaps);
    let margin = if regular {
        0
    } else {
        2 * (page_keys as f64).sqrt() as u128
    };
    let page = (page_keys as u128).saturating_sub(margin).max(1);
    let span = (walked.saturating_mul(page) / gaps).max(1);
    let numbers: Vec<u128> = match upto {
        Some(hi) => {
            let left = digits.number(hi.as_bytes()).saturating_sub(at);
            // Whole pages left, guessed from the pace so far; this worker
            // keeps its current page (and more), the others take the rest.
            let pages_left = left / span;
            let parts = (parts as u128)
                .min(pages_left.saturating_sub(1))
                .min(CUTS_AT_ONCE_MAX as u128);
            if parts == 0 {
                return Vec::new();
            }
            let per = pages_left / (parts + 1);
            (1..=parts)
                .filter_map(|i| at.checked_add(span.checked_mul(per * i)?))
                .map(|n| n - per_key)
                .collect()
        }
        None => (1..=parts.min(CUTS_AT_ONCE_MAX) as u128)
            .map_while(|i| {
                at.checked_add(span.checked_mul(i)?)
                    .map(|n| n - per_key)
                    .filter(|&n| n <= digits.max())
            })
            .collect(),
    };
    let head = &cur[..from];
    let mut cuts: Vec<String> = Vec::with_capacity(numbers.len());
    for n in numbers {
        let Ok(key) = String::from_utf8(digits.key(head, n)) else {
            continue;
        };
        let after = cuts.last().map_or(current, String::as_str);
        let inside = key.as_str() > after && upto.is_none_or(|hi| key.as_str() < hi);
        if inside && Path::from(key.as_str()).as_ref() == key {
            cuts.push(key);
        }
    }
    cuts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decimal() -> Vec<u8> {
        b"0123456789".to_vec()
    }

    #[test]
    fn a_page_of_decimal_keys_is_read_in_base_ten() {
        let keys: Vec<String> = (0..1000).map(|i| format!("k/obj-{i:06}")).collect();
        let skip = common_prefix(keys[0].as_bytes(), keys[999].as_bytes());
        assert_eq!(
            page_alphabet(keys.iter().map(|k| k.as_bytes()), skip),
            decimal()
        );
    }

    #[test]
    fn the_tail_is_cut_a_page_apart_ahead_of_the_current_key() {
        // At the first key of the second page: this page ends at 1999.
        let cuts = cut_points(
            "k/obj-000000",
            "k/obj-001000",
            None,
            &decimal(),
            3,
            (2, 1001, 1000),
        );
        assert_eq!(cuts, ["k/obj-001999", "k/obj-002999", "k/obj-003999"]);
        // Every other key: a page spans twice the numbers.
        let cuts = cut_points(
            "k/obj-000000",
            "k/obj-002000",
            None,
            &decimal(),
            2,
            (2, 1001, 1000),
        );
        assert_eq!(cuts, ["k/obj-003998", "k/obj-005998"]);
    }

    #[test]
    fn a_bounded_range_is_cut_into_whole_pages_no_finer_than_its_pages() {
        // At the first key of a page, 10 pages and more before the range's
        // end: the worker keeps its page, 9 idle workers a page each (the
        // last the rest), cut where the pages end (a cut inside a page costs
        // a request for its rest).
        let cuts = cut_points(
            "k/obj-010000",
            "k/obj-011000",
            Some("k/obj-021999"),
            &decimal(),
            100,
            (2, 1001, 1000),
        );
        let want: Vec<String> = (1..=9)
            .map(|i| format!("k/obj-{:06}", 10_999 + 1000 * i))
            .collect();
        assert_eq!(cuts, want);
        // Two idle workers: three parts of whole pages (3, 3 and the rest).
        let cuts = cut_points(
            "k/obj-010000",
            "k/obj-011000",
            Some("k/obj-021999"),
            &decimal(),
            2,
            (2, 1001, 1000),
        );
        assert_eq!(cuts, ["k/obj-013999", "k/obj-016999"]);
        // Less than a page left: no cut.
        let none = cut_points(
            "k/obj-010000",
            "k/obj-010999",
            Some("k/obj-011200"),
            &decimal(),
            8,
            (2, 1000, 1000),
        );
        assert!(none.is_empty(), "{none:?}");
    }

    #[test]
    fn hex_keys_are_cut_in_base_sixteen_and_the_prefix_is_kept() {
        let hex = page_alphabet([&b"0123456789abcdef"[..]].into_iter(), 0);
        assert_eq!(hex, b"0123456789abcdef");
        // 256 dense hex keys, pages of 256: the next pages end at 1fe, 2fe.
        let cuts = cut_points("p/0000", "p/00ff", None, &hex, 2, (2, 256, 256));
        assert_eq!(cuts, ["p/01fe", "p/02fe"]);
        // Digits of the prefix itself are never carried into.
        let cuts = cut_points("9/99", "9/99", None, &decimal(), 2, (2, 1, 1000));
        assert!(cuts.iter().all(|c| c.starts_with("9/")), "{cuts:?}");
    }

    #[test]
    fn hashes_are_cut_early_enough_that_a_range_fits_its_pages() {
        // Random hex keys: 1000 keys walked an irregular span of numbers.
        let hex = b"0123456789abcdef";
        let cuts = cut_points("p/10000", "p/11f3a", None, hex, 2, (2, 1001, 1000));
        let n = |k: &str| u128::from_str_radix(&k[2..], 16).unwrap();
        let span = n("p/11f3a") - n("p/10000");
        // Each range about 937 keys' worth of numbers (1000 less 2 sqrt(1000)).
        let first = n(&cuts[0]) - n("p/11f3a");
        assert!(
            first < span * 95 / 100 && first > span * 90 / 100,
            "{cuts:?}"
        );
    }

    #[test]
    fn cuts_never_leave_their_range() {
        for (first, cur, upto) in [
            ("a", "a0", Some("a0-")),
            ("x/1", "x/9", Some("x/9a")),
            ("é/0", "é/5", None),
        ] {
            for parts in [1, 5, 64] {
                let cuts = cut_points(first, cur, upto, SPLIT_ALPHABET, parts, (0, 10, 1000));
                let mut prev = cur.to_string();
                for c in &cuts {
                    assert!(c.as_str() > prev.as_str(), "{cuts:?}");
                    assert!(upto.is_none_or(|hi| c.as_str() < hi), "{cuts:?}");
                    prev = c.clone();
                }
            }
        }
    }
}
