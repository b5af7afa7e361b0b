//! The keyed permutation under every shuffled order: a Feistel network
//! over the smallest power-of-two domain that holds `n`, cycle-walked back
//! into `[0, n)` (docs/sampler.md, section 1).

/// Feistel rounds of the epoch permutation. Part of the stable contract.
pub const FEISTEL_ROUNDS: usize = 8;

/// SplitMix64's increment (the golden ratio in 64-bit fixed point).
pub(super) const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// Smallest Feistel domain, in bits: two halves of at least one bit each.
const MIN_DOMAIN_BITS: u32 = 2;

/// SplitMix64's output function (Steele, Lea, Flood 2014; the constants of
/// Stafford's "Mix13" variant). A bijection on `u64`.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A keyed permutation of `[0, n)`: the Feistel network over the smallest
/// power-of-two domain that holds `n`, cycle-walked back into `[0, n)`
/// (docs/sampler.md, sections 1.3 to 1.5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Feistel {
    n: u64,
    round_keys: [u64; FEISTEL_ROUNDS],
    lo_bits: u32,
    hi_bits: u32,
}

impl Feistel {
    pub(super) fn new(seed: u64, epoch: u64, n: u64) -> Self {
        // Smallest k >= 2 with 2^k >= n; n - 1 < 2^k needs bitlen(n - 1) bits.
        let bitlen = u64::BITS - n.saturating_sub(1).leading_zeros();
        let domain_bits = bitlen.max(MIN_DOMAIN_BITS);
        let lo_bits = domain_bits / 2;
        Feistel {
            n,
            round_keys: round_keys(seed, epoch),
            lo_bits,
            hi_bits: domain_bits - lo_bits,
        }
    }

    /// Position `position` (< n) of the permutation.
    #[inline]
    pub(super) fn at(&self, position: u64) -> u64 {
        debug_assert!(position < self.n);
        // Cycle-walking: the Feistel network permutes [0, 2^k); following the
        // cycle of `position` until it re-enters [0, n) restricts it to a
        // permutation of [0, n). The walk ends because the cycle contains
        // `position` itself; the domain is < 2n (or 4), so it takes < 2 steps
        // on average.
        let mut x = position;
        loop {
            x = self.encrypt(x);
            if x < self.n {
                return x;
            }
        }
    }

    /// One pass of the Feistel network over `[0, 2^(hi_bits + lo_bits))`.
    #[inline]
    fn encrypt(&self, x: u64) -> u64 {
        let lo_mask = (1u64 << self.lo_bits) - 1;
        let mut hi = x >> self.lo_bits;
        let mut lo = x & lo_mask;
        for (round, key) in self.round_keys.iter().enumerate() {
            // Each round XORs one half with a keyed hash of the other half,
            // which is invertible whatever the two widths are. Taking the top
            // bits of mix64 keeps the best-mixed bits.
            if round % 2 == 0 {
                hi ^= mix64(lo ^ key) >> (u64::BITS - self.hi_bits);
            } else {
                lo ^= mix64(hi ^ key) >> (u64::BITS - self.lo_bits);
            }
        }
        (hi << self.lo_bits) | lo
    }
}

/// Round keys for `(seed, epoch)`: a SplitMix64 stream whose start state is
/// `seed XOR mix64(epoch + GAMMA)`. Distinct epochs of one seed get distinct
/// start states because both `+ GAMMA` and `mix64` are bijections.
fn round_keys(seed: u64, epoch: u64) -> [u64; FEISTEL_ROUNDS] {
    let mut state = seed ^ mix64(epoch.wrapping_add(GAMMA));
    let mut keys = [0u64; FEISTEL_ROUNDS];
    for key in &mut keys {
        state = state.wrapping_add(GAMMA);
        *key = mix64(state);
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domain_is_the_smallest_power_of_two_and_an_odd_width_puts_the_extra_bit_high() {
        let order = Feistel::new(0, 0, 1000); // 2^10 >= 1000 > 2^9
        assert_eq!((order.hi_bits, order.lo_bits), (5, 5));
        let order = Feistel::new(0, 0, 513); // 2^10 again
        assert_eq!((order.hi_bits, order.lo_bits), (5, 5));
        let order = Feistel::new(0, 0, 512); // 2^9
        assert_eq!((order.hi_bits, order.lo_bits), (5, 4));
        let order = Feistel::new(0, 0, 1); // the 4-element minimum
        assert_eq!((order.hi_bits, order.lo_bits), (1, 1));
    }
}
