//! Which fault, if any, each HTTP request gets: one draw per request from a
//! per-connection generator seeded by `--seed` and the connection's accept
//! number, so a run with the same seed and the same traffic gets the same faults.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What the proxy does to one request and its response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forwarded untouched.
    None,
    /// Not forwarded: the proxy answers with this status (503 or 429) itself.
    Status(u16),
    /// The response's headers and half its body are forwarded, then the client
    /// connection is reset (RST).
    ResetMidBody,
    /// The response's headers are forwarded, then nothing for the stall time.
    StallAfterHeaders,
    /// The response body is forwarded at the trickle rate.
    Trickle,
}

/// The fractions and parameters of every fault, checked once at start.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    /// Fraction of requests answered 503 by the proxy.
    pub error_503: f64,
    /// Fraction of requests answered 429 by the proxy.
    pub error_429: f64,
    /// Fraction of responses reset mid-body.
    pub reset: f64,
    /// Fraction of responses stalled after their headers.
    pub stall: f64,
    /// Fraction of responses trickled.
    pub trickle: f64,
    /// How long a stalled response waits after its headers.
    pub stall_time: Duration,
    /// The rate of a trickled body.
    pub trickle_bytes_per_s: u64,
    /// Methods that faults apply to (upper case); empty: every method.
    pub methods: Vec<String>,
    /// The `--seed` every draw derives from.
    pub seed: u64,
}

impl FaultPlan {
    /// Checks that every fraction is in [0, 1] and that they add up to at most 1.
    pub fn validate(&self) -> Result<(), String> {
        let named = [
            ("--error-503", self.error_503),
            ("--error-429", self.error_429),
            ("--reset", self.reset),
            ("--stall", self.stall),
            ("--trickle", self.trickle),
        ];
        for (flag, value) in named {
            if !(0.0..=1.0).contains(&value) {
                return Err(format!(
                    "{flag} {value} is not a fraction: give a number from 0 to 1 (0.05 is 5% of requests)"
                ));
            }
        }
        let sum: f64 = named.iter().map(|(_, v)| v).sum();
        if sum > 1.0 + 1e-9 {
            return Err(format!(
                "the fault fractions add up to {sum} > 1: each request gets at most one fault, lower some of them"
            ));
        }
        if self.trickle > 0.0 && self.trickle_bytes_per_s == 0 {
            return Err(
                "--trickle-bytes-per-s 0 would never finish a trickled body: give at least 1"
                    .into(),
            );
        }
        Ok(())
    }

    /// The fault for a request with method `method` whose draw is `u` in [0, 1).
    pub fn pick(&self, method: &str, u: f64) -> Fault {
        if !self.methods.is_empty() && !self.methods.iter().any(|m| m.eq_ignore_ascii_case(method))
        {
            return Fault::None;
        }
        let mut edge = self.error_503;
        if u < edge {
            return Fault::Status(503);
        }
        edge += self.error_429;
        if u < edge {
            return Fault::Status(429);
        }
        edge += self.reset;
        if u < edge {
            return Fault::ResetMidBody;
        }
        edge += self.stall;
        if u < edge {
            return Fault::StallAfterHeaders;
        }
        edge += self.trickle;
        if u < edge {
            return Fault::Trickle;
        }
        Fault::None
    }
}

/// The `--rate` token bucket: `rate` tokens a second, at most `burst`
/// held, one per request admitted; shared by every connection.
#[derive(Debug)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    /// A full bucket; `rate` 0 admits everything.
    pub fn new(rate: f64, burst: Option<f64>) -> Result<Bucket, String> {
        if !rate.is_finite() || rate < 0.0 {
            return Err(format!(
                "--rate {rate} is not a rate: give requests per second (0: no limit)"
            ));
        }
        let burst = burst.unwrap_or((rate / 10.0).max(1.0));
        if !burst.is_finite() || burst < 1.0 {
            return Err(format!(
                "--rate-burst {burst} must be at least 1 (one request)"
            ));
        }
        Ok(Bucket {
            rate,
            burst,
            state: Mutex::new((burst, Instant::now())),
        })
    }

    /// Whether a request arriving now may go (it takes a token).
    pub fn admit(&self) -> bool {
        if self.rate == 0.0 {
            return true;
        }
        // A poisoned lock only means a holder panicked mid-update: go on.
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (tokens, at) = &mut *state;
        let now = Instant::now();
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * self.rate).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// SplitMix64: small, fast, and the same sequence on every machine.
#[derive(Clone, Debug)]
pub struct Draws {
    state: u64,
}

impl Draws {
    /// The generator of connection number `connection` (in accept order) under `seed`.
    pub fn for_connection(seed: u64, connection: u64) -> Self {
        let mut draws = Draws {
            state: seed ^ connection.wrapping_mul(0xD134_2543_DE82_EF95),
        };
        // Mix once so that neighbouring connections do not start correlated.
        draws.next_u64();
        draws
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A draw uniform in [0, 1), from the top 53 bits.
    pub fn next_unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> FaultPlan {
        FaultPlan {
            error_503: 0.1,
            error_429: 0.1,
            reset: 0.1,
            stall: 0.1,
            trickle: 0.1,
            stall_time: Duration::from_millis(1),
            trickle_bytes_per_s: 1,
            methods: Vec::new(),
            seed: 1,
        }
    }

    #[test]
    fn fractions_pick_their_share_of_draws() {
        let plan = plan();
        let mut draws = Draws::for_connection(7, 3);
        let mut counts = [0u32; 6];
        for _ in 0..100_000 {
            let index = match plan.pick("GET", draws.next_unit()) {
                Fault::Status(503) => 0,
                Fault::Status(_) => 1,
                Fault::ResetMidBody => 2,
                Fault::StallAfterHeaders => 3,
                Fault::Trickle => 4,
                Fault::None => 5,
            };
            counts[index] += 1;
        }
        for count in &counts[..5] {
            assert!((9_000..11_000).contains(count), "{counts:?}");
        }
        assert!((48_000..52_000).contains(&counts[5]), "{counts:?}");
    }

    #[test]
    fn the_same_seed_and_connection_give_the_same_draws() {
        let a: Vec<u64> = (0..5)
            .map(|_| 0)
            .scan(Draws::for_connection(9, 2), |d, _| Some(d.next_u64()))
            .collect();
        let b: Vec<u64> = (0..5)
            .map(|_| 0)
            .scan(Draws::for_connection(9, 2), |d, _| Some(d.next_u64()))
            .collect();
        let c: Vec<u64> = (0..5)
            .map(|_| 0)
            .scan(Draws::for_connection(9, 3), |d, _| Some(d.next_u64()))
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn methods_not_listed_get_no_fault() {
        let mut plan = plan();
        plan.error_503 = 1.0;
        plan.methods = vec!["GET".into()];
        assert_eq!(plan.pick("get", 0.5), Fault::Status(503));
        assert_eq!(plan.pick("PUT", 0.5), Fault::None);
    }

    #[test]
    fn the_bucket_admits_its_burst_then_its_rate() {
        let bucket = Bucket::new(1000.0, Some(5.0)).unwrap();
        let burst = (0..50).filter(|_| bucket.admit()).count();
        assert!((5..=6).contains(&burst), "{burst}");
        std::thread::sleep(Duration::from_millis(20));
        let later = (0..50).filter(|_| bucket.admit()).count();
        assert!(
            (4..=6).contains(&later),
            "{later} after 20 ms at 1000/s with a burst of 5"
        );
        assert!(Bucket::new(0.0, None).unwrap().admit());
        assert!(Bucket::new(-1.0, None).unwrap_err().contains("--rate"));
        assert!(Bucket::new(10.0, Some(0.5))
            .unwrap_err()
            .contains("--rate-burst"));
    }

    #[test]
    fn fractions_over_one_are_refused_with_the_flag_named() {
        let mut plan = plan();
        plan.reset = 1.5;
        assert!(plan.validate().unwrap_err().contains("--reset 1.5"));
        plan.reset = 0.7;
        assert!(plan.validate().unwrap_err().contains("add up to"));
    }
}
