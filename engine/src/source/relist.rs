//! The background re-list of a remote prefix whose manifest came from the
//! cache: the run starts at once on the cached listing, and this lists the
//! prefix again beside it. The same listing (keys, sizes, ETags) refreshes
//! the cache; any difference (a key added or removed, a size or an ETag
//! changed) removes the cache file and stops the run, naming a few of the
//! differences, so a changed dataset is never served for long: until then
//! every read insists on the cached ETag (`If-Match`), so an object changed
//! under the run is an error, never other bytes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime};

use super::cache::{forget_entry, ManifestCache};
use super::remote::{files_and_etags, human_duration, RemoteSource};
use super::{Source, Validity};
use crate::manifest::{ManifestOptions, ObjectNames};
use crate::remote::RemoteObject;

/// Differences named in the message that stops a run (the count says the
/// rest).
pub const DIFFERENCES_NAMED_MAX: usize = 3;

/// How a background re-list ended.
#[derive(Debug, PartialEq, Eq)]
pub enum RelistOutcome {
    /// The prefix is as cached; the cache holds the new listing.
    Unchanged {
        /// Objects listed.
        objects: usize,
        /// When the confirming listing began.
        listed_at: SystemTime,
    },
    /// The prefix changed: the message that stops the run.
    Changed(String),
    /// The listing failed: the run goes on with the cached listing (its
    /// reads still insist on the cached ETags).
    Failed(String),
}

/// The cache file a run's manifest came from, shared by the run and its
/// background re-list: once the run forgot it (a read proved it stale), a
/// re-list that ends later must not write it back, and the two never cross
/// (a refresh and a forget take the same lock).
#[derive(Clone, Debug)]
pub struct CachedEntry {
    path: PathBuf,
    forgotten: Arc<Mutex<bool>>,
}

impl CachedEntry {
    /// The cache file at `path`.
    pub fn new(path: PathBuf) -> CachedEntry {
        CachedEntry {
            path,
            forgotten: Arc::new(Mutex::new(false)),
        }
    }

    /// The cache file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the cache file, for good: no refresh writes it again.
    /// `Ok(true)`: it was there and is gone.
    pub fn forget(&self) -> std::io::Result<bool> {
        let mut forgotten = self
            .forgotten
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *forgotten = true;
        forget_entry(&self.path)
    }

    /// Runs `store` (which writes the file again) unless it was forgotten.
    fn refresh<T>(&self, store: impl FnOnce() -> T) -> Option<T> {
        let forgotten = self
            .forgotten
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        (!*forgotten).then(store)
    }
}

/// Lists `remote` again (its manifest came from `cache`'s file `entry`)
/// on a thread of its own, and hands the outcome to `done`.
pub fn spawn(
    remote: Arc<RemoteSource>,
    cache: ManifestCache,
    entry: CachedEntry,
    done: impl FnOnce(RelistOutcome) + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("ringfeed-relist".into())
        .spawn(move || done(relist(&remote, &cache, &entry)))
}

/// The re-list itself (see the module docs).
pub fn relist(remote: &RemoteSource, cache: &ManifestCache, entry: &CachedEntry) -> RelistOutcome {
    let started = Instant::now();
    let listed_at = SystemTime::now();
    let Some(before) = remote.listed_objects() else {
        return RelistOutcome::Failed("no cached listing to compare with".to_string());
    };
    let cached_at = remote.cached_listed_at();
    let opts = ManifestOptions {
        record_bytes: None,
        threads: 0,
        progress: false,
    };
    let after = match remote.list_objects(&opts) {
        Ok(after) => after,
        Err(err) => return RelistOutcome::Failed(err.to_string()),
    };
    let (total, named) = differences(&before, &after, DIFFERENCES_NAMED_MAX);
    let name = remote.source_name();
    if total > 0 {
        let removed = match entry.forget() {
            Ok(_) => format!("the cache file {} is removed", entry.path().display()),
            Err(err) => format!(
                "the cache file {} cannot be removed ({err}): remove it",
                entry.path().display()
            ),
        };
        let age = cached_at
            .and_then(|at| listed_at.duration_since(at).ok())
            .map_or_else(String::new, |age| format!(" {} ago", human_duration(age)));
        return RelistOutcome::Changed(format!(
            "{} changed since its cached listing{age}: {total} difference(s), {}; stopped rather than \
             serve a changed dataset. {removed}; start again to list it afresh \
             (--manifest-max-age 0 lists at every start)",
            name.display(),
            named.join(", ")
        ));
    }
    let (files, etags) = files_and_etags(&after);
    let validity = Validity::Remote { listed_at, etags };
    let stored = entry.refresh(|| {
        remote.cache_identity().and_then(|identity| {
            cache
                .store(remote, &identity, listed_at, &validity, &files)
                .map_err(|err| err.to_string())
        })
    });
    if stored.is_none() {
        tracing::info!(
            "{} is unchanged, but the run forgot its cached listing meanwhile: not stored again",
            name.display()
        );
    }
    if let Some(Err(why)) = stored {
        tracing::warn!(
            "{} is unchanged, but its cache cannot be refreshed ({why})",
            name.display()
        );
    }
    tracing::info!(
        "listed {} again in the background: unchanged, {} objects in {:.1} s",
        name.display(),
        after.len(),
        started.elapsed().as_secs_f64()
    );
    RelistOutcome::Unchanged {
        objects: after.len(),
        listed_at,
    }
}

/// How `after` differs from `before` (both in byte-wise key order): the
/// number of differences, and the first `named_max` in words.
pub fn differences(
    before: &[RemoteObject],
    after: &[RemoteObject],
    named_max: usize,
) -> (usize, Vec<String>) {
    let mut total = 0;
    let mut named = Vec::new();
    let mut note = |what: String| {
        total += 1;
        if named.len() < named_max {
            named.push(what);
        }
    };
    let (mut b, mut a) = (before.iter().peekable(), after.iter().peekable());
    loop {
        match (b.peek(), a.peek()) {
            (None, None) => break,
            (Some(old), None) => {
                note(format!("{} removed", old.key));
                b.next();
            }
            (None, Some(new)) => {
                note(format!("{} added", new.key));
                a.next();
            }
            (Some(old), Some(new)) => match old.key.as_bytes().cmp(new.key.as_bytes()) {
                std::cmp::Ordering::Less => {
                    note(format!("{} removed", old.key));
                    b.next();
                }
                std::cmp::Ordering::Greater => {
                    note(format!("{} added", new.key));
                    a.next();
                }
                std::cmp::Ordering::Equal => {
                    if old.size != new.size {
                        note(format!(
                            "{} is {} bytes, was {}",
                            old.key, new.size, old.size
                        ));
                    } else if old.etag != new.etag {
                        note(format!(
                            "{} has ETag {}, was {}",
                            old.key,
                            new.etag.as_deref().unwrap_or("none"),
                            old.etag.as_deref().unwrap_or("none")
                        ));
                    }
                    b.next();
                    a.next();
                }
            },
        }
    }
    (total, named)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(key: &str, size: u64, etag: &str) -> RemoteObject {
        RemoteObject {
            key: key.to_string(),
            size,
            etag: Some(etag.to_string()),
        }
    }

    #[test]
    fn a_forgotten_entry_is_never_refreshed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.manifest");
        std::fs::write(&path, b"cached").unwrap();
        let entry = CachedEntry::new(path.clone());
        assert_eq!(entry.refresh(|| 1), Some(1));
        assert!(entry.clone().forget().unwrap());
        assert!(!path.exists());
        assert_eq!(
            entry.refresh(|| std::fs::write(&path, b"again").unwrap()),
            None
        );
        assert!(
            !path.exists(),
            "a re-list that ended after the forget wrote it back"
        );
    }

    #[test]
    fn the_same_listing_has_no_differences() {
        let list = vec![obj("a", 1, "x"), obj("b/c", 2, "y")];
        assert_eq!(differences(&list, &list.clone(), 3), (0, vec![]));
    }

    #[test]
    fn keys_added_removed_resized_and_retagged_are_each_named() {
        let before = vec![
            obj("a", 1, "x"),
            obj("b", 2, "y"),
            obj("c", 3, "z"),
            obj("e", 5, "v"),
        ];
        let after = vec![
            obj("a", 1, "x"),
            obj("b", 20, "y"),
            obj("c", 3, "changed"),
            obj("d", 4, "w"),
        ];
        let (total, named) = differences(&before, &after, 10);
        assert_eq!(total, 4);
        assert_eq!(
            named,
            [
                "b is 20 bytes, was 2",
                "c has ETag changed, was z",
                "d added",
                "e removed"
            ]
        );
        let (total, named) = differences(&before, &after, 1);
        assert_eq!((total, named.len()), (4, 1));
    }
}
