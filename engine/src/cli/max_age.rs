//! `--manifest-max-age`: how old a remote prefix's cached listing may be
//! (docs/manifest.md, "Remote prefixes").

use std::time::Duration;

/// `--manifest-max-age`: a whole number and s, m, h or d (0 alone too).
pub(super) fn parse_max_age(s: &str) -> Result<Duration, String> {
    let bad = || {
        format!("--manifest-max-age {s:?}: expected a whole number and s, m, h or d, e.g. 30m or 1h (0: always list)")
    };
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let unit_at = s.len().checked_sub(1).ok_or_else(bad)?;
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
        .ok_or_else(bad)
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
        for bad in ["", "h", "1", "1x", "-1h", "99999999999999999999d"] {
            let err = parse_max_age(bad).unwrap_err();
            assert!(err.contains("30m or 1h"), "{bad:?}: {err}");
        }
    }
}
