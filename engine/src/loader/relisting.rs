//! A remote prefix served from its cached listing: the words of its
//! manifest line, and the re-list in the background that stops the run if
//! the prefix changed (docs/manifest.md, "Remote prefixes").

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use super::StopToken;
use crate::manifest::ManifestOrigin;
use crate::source::published::Published;
use crate::source::relist::{self, CachedEntry, RelistOutcome};
use crate::source::remote::human_duration;
use crate::source::ManifestCache;
use crate::source::{OpenedSource, RemoteSource};

/// A remote prefix served from its cached listing.
pub(super) struct CachedRemote {
    remote: Arc<RemoteSource>,
    entry: CachedEntry,
    cache: ManifestCache,
    listed_at: SystemTime,
    /// The job's published manifest node 0 took from the board: the re-list
    /// refreshes its head, or withdraws it when the prefix changed.
    published: Option<Arc<Published>>,
}

/// A background re-list under way, and the cache file it may refresh.
pub(super) struct Relisting {
    pub(super) handle: JoinHandle<()>,
    pub(super) entry: CachedEntry,
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
                entry: CachedEntry::new(path.clone()),
                cache: cache.clone(),
                listed_at,
                published: None,
            }),
            _ => None,
        }
    }

    /// The same, with the job's published manifest the re-list looks after.
    pub(super) fn published(self, published: Option<Arc<Published>>) -> CachedRemote {
        CachedRemote { published, ..self }
    }

    /// How the manifest line says where the manifest came from.
    pub(super) fn words(&self, max_age: Duration) -> String {
        let age = SystemTime::now()
            .duration_since(self.listed_at)
            .unwrap_or_default();
        format!(
            "from the cache {} (listed {} ago, within --manifest-max-age {}; listing again in the background)",
            self.entry.path().display(),
            human_duration(age),
            human_duration(max_age)
        )
    }

    /// Lists the prefix again beside the run: a change stops the run
    /// (`stop`), a failure is a warning (reads still insist on the cached
    /// ETags).
    pub(super) fn relist_in_background(self, stop: &StopToken) -> Option<Relisting> {
        let name = self.remote.store().display.clone();
        let named = name.clone();
        let stop = stop.clone();
        let entry = self.entry.clone();
        let published = self.published;
        let spawned =
            relist::spawn(
                self.remote,
                self.cache,
                self.entry,
                move |outcome| match outcome {
                    RelistOutcome::Unchanged { listed_at, .. } => {
                        if let Some(p) = published.as_ref().filter(|p| p.relist) {
                            p.refresh(listed_at);
                        }
                    }
                    RelistOutcome::Changed(why) => {
                        let why = match &published {
                            Some(p) => format!(
                                "{why}; the job's manifest {}: {}",
                                p.describe(),
                                p.withdraw()
                            ),
                            None => why,
                        };
                        stop.stop_with(why)
                    }
                    RelistOutcome::Failed(why) => tracing::warn!(
                    "listing {named} again in the background failed ({why}); serving on from the \
                     cached listing (each read still insists on the object's cached ETag)"
                ),
                },
            );
        match spawned {
            Ok(handle) => Some(Relisting { handle, entry }),
            Err(err) => {
                tracing::warn!(
                    "cannot start the background re-list of {name} ({err}); serving from the cached listing"
                );
                None
            }
        }
    }
}
