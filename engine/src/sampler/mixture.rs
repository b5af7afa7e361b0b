//! Mixtures: several corpora drawn from in fixed proportions
//! (`serve --source A --source B --weights 0.7,0.3`; docs/tokens.md,
//! "Mixtures").
//!
//! Position p of an epoch is mapped in two steps, neither of which uses a
//! random number or depends on the world size:
//!
//! 1. **Which corpus.** Megatron's greedy largest-error interleave: the
//!    weights are made integers `W_c` with sum `S` (exact decimals, else
//!    rounded to a resolution of 2^-20), and position i goes to the corpus c
//!    with the largest `W_c·(i + 1) − count_c(i)·S` (ties to the lowest c),
//!    where `count_c(i)` is c's draws among positions `0..i`. Every prefix
//!    then holds each corpus within one sample of its exact share, and
//!    after `S` positions each corpus has drawn exactly `W_c`: the
//!    interleave repeats with period `S`, which is kept (`S ≤ 2^20`), so
//!    any position is found in O(1).
//! 2. **Which window.** Corpus c's k-th draw of epoch e is position
//!    `k mod n_c` of pass `k / n_c` of its own order: the run's order
//!    (`--shuffle`) over its `n_c` windows, seeded by the corpus
//!    (`mix64(seed ^ TAG ^ mix64(c + GAMMA))`) and keyed by
//!    `e·P_c + pass`, `P_c` being the passes an epoch makes over it at most.
//!    A corpus that runs out within an epoch is thus re-shuffled for its
//!    next pass.
//!
//! The samples of an epoch are by default the most that repeat no corpus
//! (`--samples-per-epoch` for more). The result is sample index
//! `first_window(c) + window`: corpora's windows end to end.

use super::feistel::{mix64, GAMMA};
use super::{EpochOrder, SampleOrder};

/// Most corpora in one mixture.
pub const MAX_CORPORA: usize = 256;
/// Longest period of the interleave: integer weights are scaled to sum at
/// most this (a resolution of about one in a million).
pub const PERIOD_MAX: u64 = 1 << 20;
/// Most decimal places a weight may have.
const DECIMALS_MAX: usize = 12;
/// Mixed into each corpus's seed ("CORPUS" in ASCII).
const TAG_CORPUS: u64 = 0x434F_5250_5553;

/// Why a mixture was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MixtureError {
    /// A weight that is not a positive decimal number.
    #[error("--weights: {0:?} is not a positive decimal number (e.g. 0.7, or 3 for 3 parts)")]
    BadWeight(String),
    /// Not one weight per corpus.
    #[error("--weights gives {weights} weight(s) for {corpora} --source(s); give one per source, in the same order")]
    Count {
        /// Weights given.
        weights: usize,
        /// Corpora.
        corpora: usize,
    },
    /// Too many corpora.
    #[error("{0} sources are more than the {MAX_CORPORA} one mixture may draw from")]
    TooMany(usize),
    /// An epoch of no sample.
    #[error("--samples-per-epoch 0 serves nothing; pass at least one step's worth")]
    ZeroSamples,
    /// Samples per epoch past the sampler's limit.
    #[error("--samples-per-epoch {0} is past the limit of 2^60 samples")]
    TooManySamples(u64),
}

/// Weights made integers, their sum the period `S`.
fn integer_weights(weights: &[String]) -> Result<Vec<u64>, MixtureError> {
    let mut parsed = Vec::with_capacity(weights.len());
    for w in weights {
        let bad = || MixtureError::BadWeight(w.clone());
        let (int, frac) = w.trim().split_once('.').unwrap_or((w.trim(), ""));
        let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if (int.is_empty() && frac.is_empty())
            || !digits(int)
            || !digits(frac)
            || frac.len() > DECIMALS_MAX
        {
            return Err(bad());
        }
        let mantissa: u128 = format!("{int}{frac}").parse().map_err(|_| bad())?;
        if mantissa == 0 {
            return Err(bad());
        }
        parsed.push((mantissa, frac.len()));
    }
    let places = parsed.iter().map(|&(_, d)| d).max().unwrap_or(0);
    let mut ints: Vec<u128> = parsed
        .iter()
        .map(|&(m, d)| m * 10u128.pow((places - d) as u32))
        .collect();
    let g = ints.iter().fold(0u128, |g, &x| gcd(g, x));
    ints.iter_mut().for_each(|x| *x /= g);
    let sum: u128 = ints.iter().sum();
    if sum <= u128::from(PERIOD_MAX) {
        return Ok(ints.into_iter().map(|x| x as u64).collect());
    }
    Ok(scale_to(&ints, PERIOD_MAX))
}

/// `ints` scaled to sum `total` by largest remainders, none below 1.
fn scale_to(ints: &[u128], total: u64) -> Vec<u64> {
    let sum: u128 = ints.iter().sum();
    let n = ints.len() as u64;
    // Each weight keeps 1; the rest is shared in proportion.
    let spare = u128::from(total - n);
    let mut out: Vec<u64> = ints.iter().map(|&x| 1 + (x * spare / sum) as u64).collect();
    let mut rems: Vec<(u128, usize)> = ints
        .iter()
        .enumerate()
        .map(|(i, &x)| (x * spare % sum, i))
        .collect();
    rems.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let short = total - out.iter().sum::<u64>();
    for &(_, i) in rems.iter().take(short as usize) {
        out[i] += 1;
    }
    out
}

fn gcd(a: u128, b: u128) -> u128 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The interleave and each corpus's order: see the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mixture {
    /// `W_c`.
    weights: Vec<u64>,
    /// `S`.
    period: u64,
    /// The corpus of each position of the period.
    corpus_at: Vec<u16>,
    /// How many of its corpus's draws come before each position of the period.
    draw_at: Vec<u32>,
    /// Each corpus's positions in the period, ascending.
    positions: Vec<Vec<u32>>,
    /// `n_c`: windows of each corpus.
    sizes: Vec<u64>,
    /// First sample index of each corpus.
    bases: Vec<u64>,
    /// `P_c`: passes over each corpus an epoch makes at most.
    passes: Vec<u64>,
    samples_per_epoch: u64,
    order: SampleOrder,
    seed: u64,
}

impl Mixture {
    /// The mixture of corpora of `sizes` windows (each at least 1), whose
    /// windows start at sample `bases[c]`, drawn by `weights` (one decimal
    /// string per corpus, None: equal), `samples_per_epoch` a epoch (None:
    /// the most that repeat no corpus), each corpus in the run's `order`
    /// under `seed`.
    pub fn new(
        weights: Option<&[String]>,
        sizes: &[u64],
        bases: &[u64],
        samples_per_epoch: Option<u64>,
        order: SampleOrder,
        seed: u64,
    ) -> Result<Mixture, MixtureError> {
        let n = sizes.len();
        if n > MAX_CORPORA {
            return Err(MixtureError::TooMany(n));
        }
        let weights = match weights {
            Some(w) if w.len() != n => {
                return Err(MixtureError::Count {
                    weights: w.len(),
                    corpora: n,
                })
            }
            Some(w) => integer_weights(w)?,
            None => vec![1; n],
        };
        let period: u64 = weights.iter().sum();
        let (corpus_at, draw_at) = interleave(&weights, period);
        let mut positions = vec![Vec::new(); n];
        for (r, &c) in corpus_at.iter().enumerate() {
            positions[c as usize].push(r as u32);
        }
        let mut m = Mixture {
            weights,
            period,
            corpus_at,
            draw_at,
            positions,
            sizes: sizes.to_vec(),
            bases: bases.to_vec(),
            passes: vec![1; n],
            samples_per_epoch: 0,
            order,
            seed,
        };
        let samples = match samples_per_epoch {
            Some(0) => return Err(MixtureError::ZeroSamples),
            Some(s) if s > super::MAX_SAMPLES => return Err(MixtureError::TooManySamples(s)),
            Some(s) => s,
            None => m.most_without_repeats(),
        };
        m.samples_per_epoch = samples;
        m.passes = (0..n)
            .map(|c| m.draws_before(c, samples).div_ceil(m.sizes[c]).max(1))
            .collect();
        Ok(m)
    }

    /// Samples in an epoch.
    pub fn samples_per_epoch(&self) -> u64 {
        self.samples_per_epoch
    }

    /// The integer weights `W_c` (their sum is the period).
    pub fn weights(&self) -> &[u64] {
        &self.weights
    }

    /// Draws of corpus `c` among positions `0..p` of an epoch.
    pub fn draws_before(&self, c: usize, p: u64) -> u64 {
        let (whole, r) = (p / self.period, p % self.period);
        let within = self.positions[c].partition_point(|&x| u64::from(x) < r) as u64;
        whole.saturating_mul(self.weights[c]).saturating_add(within)
    }

    /// The most samples an epoch may have without drawing a window of any
    /// corpus twice (at least 1).
    fn most_without_repeats(&self) -> u64 {
        let fits = |p: u64| (0..self.sizes.len()).all(|c| self.draws_before(c, p) <= self.sizes[c]);
        let (mut lo, mut hi) = (1u64, super::MAX_SAMPLES);
        if !fits(lo) {
            return 1;
        }
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// The corpus of position `p` and its draw number in the epoch.
    pub fn draw(&self, p: u64) -> (usize, u64) {
        let r = (p % self.period) as usize;
        let c = self.corpus_at[r] as usize;
        let k = (p / self.period) * self.weights[c] + u64::from(self.draw_at[r]);
        (c, k)
    }

    /// The sample index at position `p` of epoch `epoch`.
    pub fn at(&self, epoch: u64, p: u64) -> u64 {
        let (c, k) = self.draw(p);
        let n = self.sizes[c];
        let (pass, within) = (k / n, k % n);
        let key = epoch.wrapping_mul(self.passes[c]).wrapping_add(pass);
        let seed = mix64(self.seed ^ TAG_CORPUS ^ mix64((c as u64).wrapping_add(GAMMA)));
        self.bases[c] + EpochOrder::of(self.order, seed, key, n).at(within)
    }

    /// Turns `batch`, positions of epoch `epoch`, into sample indices.
    pub fn map_batch(&self, epoch: u64, batch: &mut [u64]) {
        for p in batch.iter_mut() {
            *p = self.at(epoch, *p);
        }
    }
}

/// One period of the greedy interleave: each position's corpus, and how
/// many draws of that corpus precede it in the period.
fn interleave(weights: &[u64], period: u64) -> (Vec<u16>, Vec<u32>) {
    let mut counts = vec![0u64; weights.len()];
    let mut corpus_at = Vec::with_capacity(period as usize);
    let mut draw_at = Vec::with_capacity(period as usize);
    for i in 0..period {
        let mut best = 0usize;
        let mut best_error = i128::MIN;
        for (c, &w) in weights.iter().enumerate() {
            let error =
                i128::from(w) * i128::from(i + 1) - i128::from(counts[c]) * i128::from(period);
            if error > best_error {
                best_error = error;
                best = c;
            }
        }
        corpus_at.push(best as u16);
        draw_at.push(counts[best] as u32);
        counts[best] += 1;
    }
    debug_assert!(counts.iter().zip(weights).all(|(a, b)| a == b));
    (corpus_at, draw_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn weights_become_exact_integers() {
        assert_eq!(integer_weights(&w(&["0.7", "0.3"])).unwrap(), [7, 3]);
        assert_eq!(integer_weights(&w(&["3", "1"])).unwrap(), [3, 1]);
        assert_eq!(
            integer_weights(&w(&["0.5", "1.25", "2"])).unwrap(),
            [2, 5, 8]
        );
        for bad in ["0", "-1", "abc", "1e3", "", "."] {
            assert!(integer_weights(&w(&[bad, "1"])).is_err(), "{bad}");
        }
        let fine = integer_weights(&w(&["0.000000000001", "1"])).unwrap();
        assert_eq!(fine.iter().sum::<u64>(), PERIOD_MAX);
        assert_eq!(fine[0], 1, "a tiny weight keeps a draw per period");
    }

    proptest::proptest! {
        /// Every prefix holds each corpus within one sample of its share.
        #[test]
        fn every_prefix_is_within_one_sample_of_the_weights(
            weights in proptest::collection::vec(1u64..50, 1..6),
            reps in 1u64..3,
        ) {
            let strings: Vec<String> = weights.iter().map(|x| x.to_string()).collect();
            let n = weights.len();
            let m = Mixture::new(Some(&strings), &vec![1 << 40; n], &vec![0; n], Some(1000), SampleOrder::Exact, 1).unwrap();
            let total: u64 = m.weights.iter().sum();
            let mut counts = vec![0u64; n];
            for p in 0..total * reps {
                let (c, k) = m.draw(p);
                proptest::prop_assert_eq!(k, counts[c]);
                counts[c] += 1;
                for (d, &cnt) in counts.iter().enumerate() {
                    let exact = (p + 1) as f64 * m.weights[d] as f64 / total as f64;
                    proptest::prop_assert!((cnt as f64 - exact).abs() < 1.0, "p={} corpus {} has {} of {}", p, d, cnt, exact);
                    proptest::prop_assert_eq!(m.draws_before(d, p + 1), cnt);
                }
            }
        }
    }

    #[test]
    fn by_default_an_epoch_repeats_no_corpus_and_each_draws_all_its_windows_once() {
        let sizes = [70, 40];
        let m = Mixture::new(
            Some(&w(&["0.7", "0.3"])),
            &sizes,
            &[0, 70],
            None,
            SampleOrder::Exact,
            5,
        )
        .unwrap();
        // 0.7 N <= 70 and 0.3 N <= 40: N = 100 (and 101 would draw a 71st).
        assert_eq!(m.samples_per_epoch(), 100);
        let mut seen: Vec<u64> = (0..100).map(|p| m.at(3, p)).collect();
        seen.sort_unstable();
        // All 70 of the first, once each; 30 distinct of the second's 40.
        assert_eq!(seen[..70], (0..70).collect::<Vec<u64>>()[..]);
        assert!(seen[70..].windows(2).all(|w| w[0] < w[1]));
        assert!(seen[70..].iter().all(|&i| (70..110).contains(&i)));
    }

    #[test]
    fn a_corpus_that_runs_out_is_shuffled_again_for_its_next_pass() {
        let m = Mixture::new(
            Some(&w(&["1", "1"])),
            &[5, 1000],
            &[0, 5],
            Some(40),
            SampleOrder::Exact,
            9,
        )
        .unwrap();
        let firsts: Vec<u64> = (0..40).map(|p| m.at(0, p)).filter(|&i| i < 5).collect();
        assert_eq!(firsts.len(), 20);
        for pass in firsts.chunks(5) {
            let mut p = pass.to_vec();
            p.sort_unstable();
            assert_eq!(p, [0, 1, 2, 3, 4], "each pass is a permutation");
        }
        assert_ne!(firsts[..5], firsts[5..10], "passes are shuffled apart");
        assert_ne!(
            (0..40).map(|p| m.at(0, p)).collect::<Vec<_>>(),
            (0..40).map(|p| m.at(1, p)).collect::<Vec<_>>()
        );
    }
}
