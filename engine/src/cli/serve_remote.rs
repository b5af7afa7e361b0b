//! What `ringfeed serve` adds for a remote prefix whose manifest came from
//! the cache: `--manifest-max-age`, the words of its manifest line, and the
//! re-list in the background that stops the run if the prefix changed
//! (docs/manifest.md, "Remote prefixes").

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::loader::signals;
use crate::manifest::ManifestOrigin;
use crate::source::relist::{self, RelistOutcome};
use crate::source::remote::human_duration;
use crate::source::ManifestCache;
use crate::source::{OpenedSource, RemoteSource};

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

/// A remote prefix served from its cached listing.
pub(super) struct CachedRemote {
    remote: Arc<RemoteSource>,
    entry: PathBuf,
    cache: ManifestCache,
    listed_at: SystemTime,
}

impl CachedRemote {
    /// Some when `source` is remote and its manifest came from `cache`.
    pub(super) fn of(
        source: &OpenedSource,
        origin: Option<&ManifestOrigin>,
        cache: Option<&ManifestCache>,
    ) -> Option<CachedRemote> {
        match (source, origin, cache) {
            (
                OpenedSource::Remote(remote),
                Some(ManifestOrigin::Cached { path, .. }),
                Some(cache),
            ) => remote.cached_listed_at().map(|listed_at| CachedRemote {
                remote: Arc::clone(remote),
                entry: path.clone(),
                cache: cache.clone(),
                listed_at,
            }),
            _ => None,
        }
    }

    /// How the manifest line says where the manifest came from.
    pub(super) fn words(&self, max_age: Duration) -> String {
        let age = SystemTime::now()
            .duration_since(self.listed_at)
            .unwrap_or_default();
        format!(
            "from the cache {} (listed {} ago, within --manifest-max-age {}; listing again in the background)",
            self.entry.display(),
            human_duration(age),
            human_duration(max_age)
        )
    }

    /// Lists the prefix again beside the run: a change stops the run
    /// (`signals::stop_with`), a failure is a warning (reads still insist
    /// on the cached ETags). The handle, to wait for it before a run that
    /// served everything is called done.
    pub(super) fn relist_in_background(self) -> Option<std::thread::JoinHandle<()>> {
        let name = self.remote.store().display.clone();
        let named = name.clone();
        let spawned =
            relist::spawn(
                self.remote,
                self.cache,
                self.entry,
                move |outcome| match outcome {
                    RelistOutcome::Unchanged { .. } => {}
                    RelistOutcome::Changed(why) => signals::stop_with(why),
                    RelistOutcome::Failed(why) => tracing::warn!(
                    "listing {named} again in the background failed ({why}); serving on from the \
                     cached listing (each read still insists on the object's cached ETag)"
                ),
                },
            );
        match spawned {
            Ok(handle) => Some(handle),
            Err(err) => {
                tracing::warn!(
                    "cannot start the background re-list of {name} ({err}); serving from the cached listing"
                );
                None
            }
        }
    }
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
