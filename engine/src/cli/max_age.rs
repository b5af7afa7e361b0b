//! `--manifest-max-age`: how old a remote prefix's cached listing may be
//! (docs/manifest.md, "Remote prefixes"); and `--idle-timeout`, how long a
//! loader waits with no trainer attached (docs/operations.md).

use std::time::Duration;

/// `--manifest-max-age`: a whole number and s, m, h or d (0 alone too).
pub(super) fn parse_max_age(s: &str) -> Result<Duration, String> {
    parse_duration(s, || {
        format!("--manifest-max-age {s:?}: expected a whole number and s, m, h or d, e.g. 30m or 1h (0: always list)")
    })
}

/// `--idle-timeout`: a whole number and s, m, h or d; `off` or 0: no limit
/// (Duration::ZERO).
pub(super) fn parse_idle_timeout(s: &str) -> Result<Duration, String> {
    if s == "off" {
        return Ok(Duration::ZERO);
    }
    parse_duration(s, || {
        format!("--idle-timeout {s:?}: expected a whole number and s, m, h or d, e.g. 90s or 10m (off or 0: wait for trainers for ever)")
    })
}

/// A whole number and s, m, h or d, or 0 alone; `bad` says what is wrong.
fn parse_duration(s: &str, bad: impl Fn() -> String) -> Result<Duration, String> {
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let unit_at = s.len().checked_sub(1).ok_or_else(&bad)?;
    let (n, unit) = s.split_at(unit_at);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let secs_per = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    n.checked_mul(secs_per)
        .map(Duration::from_secs)
        .ok_or_else(&bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_max_age_is_a_number_and_a_unit_or_zero() {
        assert_eq!(parse_max_age("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_max_age("30m"), Ok(Duration::from_secs(1_800)));
        assert_eq!(parse_max_age("2d"), Ok(Duration::from_secs(172_800)));
        assert_eq!(parse_max_age("0"), Ok(Duration::ZERO));
        assert_eq!(parse_idle_timeout("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_idle_timeout("off"), Ok(Duration::ZERO));
        assert!(parse_idle_timeout("never")
            .unwrap_err()
            .contains("off or 0"));
        for bad in ["", "h", "1", "1x", "-1h", "99999999999999999999d"] {
            let err = parse_max_age(bad).unwrap_err();
            assert!(err.contains("30m or 1h"), "{bad:?}: {err}");
        }
    }
}
