//! A remote prefix as a source: `s3://BUCKET/PREFIX`, `gs://`, `az://` /
//! `abfs://`, `http(s)://`, through `crate::remote`.
//!
//! - The objects are the keys under the prefix, relative to it, in byte-wise
//!   order, directory markers (keys ending in `/`, or empty objects that are
//!   also a directory of other keys) skipped: a local directory and the same
//!   tree uploaded to a bucket give the same manifest, so the same batches
//!   for the same seed.
//! - Listing: S3 and GCS list key ranges in parallel with work stealing
//!   (`remote::list_parallel`); Azure lists in one paginated listing
//!   (`remote::list`: it cannot start after a key); http(s) walks the tree
//!   with WebDAV PROPFIND, depth 1 (`remote::list_webdav`). Or, for any of
//!   them, an explicit key list (`--keys FILE`; `remote::read_keys_file`).
//! - Progress as a local listing shows it: nothing for the first second,
//!   then a spinner on a terminal or a log line every 5 s.
//! - The manifest cache keeps a listing (keys, sizes, ETags) with the time
//!   it began ([`Validity::Remote`]). A start uses it while it is younger
//!   than `ManifestCache::remote_max_age` (`--manifest-max-age`, 1 h by
//!   default, 0: always list), and lists again in the background
//!   (`super::relist`): any difference stops the run and removes the cache
//!   file. Reads send the cached ETag as `If-Match` meanwhile, so an object
//!   changed before the re-list ends is an error, never other bytes. A
//!   `--keys` listing is not cached (the file is read at every start).
//!
//! Listing and fetching share one `RemoteRuntime` (the connection pool lives
//! on it): the source owns it, and the loader's fetch engine takes it from
//! here.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use indicatif::ProgressBar;
use object_store::ObjectStoreExt as _;

use super::cache::ManifestCache;
use super::{Checked, Listing, ObjectMeta, Source, Validity, VersionTag};
use crate::manifest::{FileList, ManifestError, ManifestOptions, ObjectNames};
use crate::remote::{
    self, ListProgress, RemoteError, RemoteObject, RemoteRuntime, Scheme, StoreHandle,
    LIST_WORKERS_MAX,
};

/// Listing shorter than this shows no progress at all (as a local listing).
const PROGRESS_AFTER_MS: u64 = 1_000;
/// Without a terminal, one `tracing::info` line this often.
const PROGRESS_LOG_EVERY_MS: u64 = 5_000;
/// How often the waiting thread wakes to update progress.
const PROGRESS_POLL_MS: u64 = 100;
/// Parallel listing workers when `ManifestOptions::threads` is 0: listing is
/// round trips, not cores (Dataflux lists with dozens).
pub const REMOTE_LIST_WORKERS_DEFAULT: usize = 32;
/// Threads of the remote runtime a loader starts: GETs are async, a few
/// threads drive hundreds of them (and copy their bytes into slots).
pub const REMOTE_RUNTIME_THREADS: usize = 4;
/// Why a `--keys` listing is never kept in the manifest cache.
const KEYS_NOT_CACHED: &str = "a --keys listing is read from its file at every start";
/// A cached listing stamped this far in the future (a clock stepped back)
/// is not trusted to be young.
const LISTED_IN_FUTURE_MAX: Duration = Duration::from_secs(60);
/// Environment variables that point a scheme at another server: part of a
/// prefix's cache identity, so two servers' buckets of one name differ.
const ENDPOINT_VARS: &[&str] = &[
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT",
    "GOOGLE_BASE_URL",
    "STORAGE_EMULATOR_HOST",
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_ENDPOINT",
    "AZURE_STORAGE_USE_EMULATOR",
    "AZURITE_BLOB_STORAGE_URL",
];

/// The path segment, beside the data, of ringfeed's own objects (a job's
/// published manifest, `published`): a key with a segment of this name is
/// never a sample.
pub const BOARD_SEGMENT: &str = ".ringfeed";

/// Whether `key` (relative to a prefix) is one of ringfeed's own objects.
pub fn is_ringfeed_key(key: &str) -> bool {
    key.split('/').any(|segment| segment == BOARD_SEGMENT)
}

/// Whether `source` names a remote store (a scheme `remote` serves).
pub fn is_remote_url(source: &str) -> bool {
    [
        "s3://", "s3a://", "gs://", "az://", "abfs://", "abfss://", "azure://", "http://",
        "https://",
    ]
    .iter()
    .any(|scheme| source.starts_with(scheme))
}

/// The objects under a remote prefix, or those a keys file lists.
#[derive(Debug)]
pub struct RemoteSource {
    store: StoreHandle,
    runtime: Arc<RemoteRuntime>,
    keys_file: Option<PathBuf>,
    /// The last listing's objects (keys, sizes, ETags), for the fetch engine.
    listed: Mutex<Option<Arc<Vec<RemoteObject>>>>,
    /// When the listing the manifest came from began, if it came from the
    /// cache.
    cached_listed_at: Mutex<Option<SystemTime>>,
}

impl RemoteSource {
    /// The store `url` names, on a runtime of its own; nothing is asked of
    /// the network yet. With `keys_file`, the objects are the ones it lists.
    pub fn open(url: &str, keys_file: Option<&Path>) -> Result<RemoteSource, ManifestError> {
        let runtime = RemoteRuntime::new(REMOTE_RUNTIME_THREADS)?;
        let store = StoreHandle::open(url)?;
        Ok(RemoteSource::over(store, Arc::new(runtime), keys_file))
    }

    /// A source over a store built by the caller (tests: an in-memory store).
    pub fn over(
        store: StoreHandle,
        runtime: Arc<RemoteRuntime>,
        keys_file: Option<&Path>,
    ) -> RemoteSource {
        RemoteSource {
            store,
            runtime,
            keys_file: keys_file.map(Path::to_path_buf),
            listed: Mutex::new(None),
            cached_listed_at: Mutex::new(None),
        }
    }

    /// The store and prefix.
    pub fn store(&self) -> &StoreHandle {
        &self.store
    }

    /// The runtime listing ran on; the fetch engine runs on it too.
    pub fn runtime(&self) -> &Arc<RemoteRuntime> {
        &self.runtime
    }

    /// The objects of `files` (a manifest's, in its order) as the fetch
    /// engine reads them: each with its ETag where the last listing of this
    /// source gave one for the same key and size, so a read insists on the
    /// version that was listed.
    pub fn objects_for(&self, files: &FileList) -> Vec<RemoteObject> {
        let listed = self.listed.lock().ok().and_then(|l| l.clone());
        let mut listed_iter = listed.as_deref().map(|v| v.iter().peekable());
        files
            .iter()
            .map(|f| {
                let path = f.rel_path.as_os_str().as_encoded_bytes();
                let key = String::from_utf8_lossy(path).into_owned();
                // Both are in byte-wise key order: walk them together.
                let etag = listed_iter.as_mut().and_then(|it| {
                    while it.next_if(|o| o.key.as_bytes() < path).is_some() {}
                    it.next_if(|o| o.key.as_bytes() == path && o.size == f.size_bytes)
                        .and_then(|o| o.etag.clone())
                });
                RemoteObject {
                    key,
                    size: f.size_bytes,
                    etag,
                }
            })
            .collect()
    }

    /// When the listing the manifest came from began, if the manifest came
    /// from the cache (None: listed by this start).
    pub fn cached_listed_at(&self) -> Option<SystemTime> {
        self.cached_listed_at.lock().ok().and_then(|at| *at)
    }

    /// The objects the manifest was built from (listed or cached), if any.
    pub(crate) fn listed_objects(&self) -> Option<Arc<Vec<RemoteObject>>> {
        self.listed.lock().ok().and_then(|l| l.clone())
    }

    /// Takes a listing made elsewhere (the manifest cache, a published
    /// manifest) as this source's: `objects` with `etags` (each object's and
    /// a NUL, in the same order), for the fetch engine's `If-Match`; and
    /// when it began, if the background re-list should compare with it
    /// (None: as if listed by this start).
    pub(crate) fn adopt(&self, objects: &FileList, etags: &[u8], listed_at: Option<SystemTime>) {
        let mut etags = etags.split(|&b| b == 0);
        let cached: Vec<RemoteObject> = objects
            .iter()
            .map(|f| RemoteObject {
                key: String::from_utf8_lossy(f.rel_path.as_os_str().as_encoded_bytes())
                    .into_owned(),
                size: f.size_bytes,
                etag: etags
                    .next()
                    .filter(|e| !e.is_empty())
                    .map(|e| String::from_utf8_lossy(e).into_owned()),
            })
            .collect();
        if let Ok(mut listed) = self.listed.lock() {
            *listed = Some(Arc::new(cached));
        }
        if let Ok(mut at) = self.cached_listed_at.lock() {
            *at = listed_at;
        }
    }

    /// Whether the source is a `--keys` file's list.
    pub fn has_keys_file(&self) -> bool {
        self.keys_file.is_some()
    }

    /// Lists on the runtime while this thread shows progress.
    pub(crate) fn list_objects(
        &self,
        opts: &ManifestOptions,
    ) -> Result<Vec<RemoteObject>, RemoteError> {
        let keys = Arc::new(AtomicU64::new(0));
        let store = self.store.clone();
        let keys_file = self.keys_file.clone();
        let keys_given = keys_file.is_some();
        let workers = match opts.threads {
            0 => REMOTE_LIST_WORKERS_DEFAULT,
            n => n.min(LIST_WORKERS_MAX),
        };
        let seen = Arc::clone(&keys);
        let (tx, rx) = std::sync::mpsc::channel();
        self.runtime.handle().spawn(async move {
            let progress = move |p: ListProgress| seen.store(p.keys, Ordering::Relaxed);
            let found = match (&keys_file, store.scheme) {
                (Some(path), _) => remote::read_keys_file(&store, path).await,
                (None, Scheme::S3 | Scheme::Gcs) => {
                    remote::list_parallel(&store, workers, Some(&progress)).await
                }
                (None, Scheme::Http) => remote::list_webdav(&store).await,
                (None, Scheme::Azure | Scheme::Custom) => {
                    remote::list(&store, Some(&progress)).await
                }
            };
            // The receiver is gone only if the listing thread panicked.
            let _ = tx.send(found);
        });
        let started = Instant::now();
        let use_spinner = opts.progress && std::io::stderr().is_terminal();
        let mut spinner: Option<ProgressBar> = None;
        let mut last_log = started;
        let found = loop {
            match rx.recv_timeout(Duration::from_millis(PROGRESS_POLL_MS)) {
                Ok(found) => break found,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    break Err(RemoteError::Stopped {
                        reason: "the listing task ended without an answer".to_string(),
                    })
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            }
            if !opts.progress || started.elapsed() < Duration::from_millis(PROGRESS_AFTER_MS) {
                continue;
            }
            let message = format!(
                "listing {}: {} keys found",
                self.store.display,
                keys.load(Ordering::Relaxed)
            );
            if use_spinner {
                let bar = spinner.get_or_insert_with(|| {
                    let bar = ProgressBar::new_spinner();
                    bar.enable_steady_tick(Duration::from_millis(PROGRESS_POLL_MS));
                    bar
                });
                bar.set_message(message);
            } else if last_log.elapsed() >= Duration::from_millis(PROGRESS_LOG_EVERY_MS) {
                last_log = Instant::now();
                tracing::info!("{message}");
            }
        };
        if let Some(bar) = spinner {
            bar.finish_and_clear();
        }
        let mut objects = found?;
        if !keys_given {
            // Published manifests beside the data are ringfeed's, never samples.
            objects.retain(|o| !is_ringfeed_key(&o.key));
        }
        if opts.progress && started.elapsed() >= Duration::from_millis(PROGRESS_AFTER_MS) {
            tracing::info!(
                "listed {}: {} objects in {:.1} s",
                self.store.display,
                objects.len(),
                started.elapsed().as_secs_f64()
            );
        }
        Ok(objects)
    }
}

impl ObjectNames for RemoteSource {
    fn source_name(&self) -> PathBuf {
        PathBuf::from(&self.store.display)
    }

    fn object_name(&self, key: &[u8]) -> PathBuf {
        PathBuf::from(format!(
            "{}/{}",
            self.store.display.trim_end_matches('/'),
            String::from_utf8_lossy(key)
        ))
    }
}

impl Source for RemoteSource {
    fn list(&self, opts: &ManifestOptions) -> Result<Listing, ManifestError> {
        let listed_at = SystemTime::now();
        let objects = self.list_objects(opts)?;
        let (files, etags) = files_and_etags(&objects);
        let versions = objects
            .iter()
            // An object without an ETag is checked by size alone.
            .map(|o| VersionTag::ETag(o.etag.clone().unwrap_or_default().into()))
            .collect();
        if let Ok(mut listed) = self.listed.lock() {
            *listed = Some(Arc::new(objects));
        }
        if let Ok(mut at) = self.cached_listed_at.lock() {
            *at = None;
        }
        let validity = if self.keys_file.is_some() {
            Validity::Unchecked
        } else {
            Validity::Remote { listed_at, etags }
        };
        Ok(Listing {
            objects: files,
            versions: Some(versions),
            validity,
        })
    }

    fn head(&self, key: &[u8]) -> Result<ObjectMeta, ManifestError> {
        let path = self.store.path_of(&String::from_utf8_lossy(key));
        let store = self.store.clone();
        let meta = self
            .runtime
            .block_on(async move { store.meta.head(&path).await })
            .map_err(|e| {
                ManifestError::Remote(RemoteError::Permanent {
                    key: String::from_utf8_lossy(key).into_owned(),
                    store: self.store.display.clone(),
                    status: 0,
                    detail: format!("HEAD failed: {e}"),
                })
            })?;
        Ok(ObjectMeta {
            key: key.to_vec(),
            size_bytes: meta.size,
            version: meta.e_tag.map(|e| VersionTag::ETag(e.into())),
        })
    }

    fn cache_identity(&self) -> Result<Vec<u8>, String> {
        if self.keys_file.is_some() {
            return Err(KEYS_NOT_CACHED.to_string());
        }
        let mut identity = self.store.display.clone();
        for var in ENDPOINT_VARS {
            if let Some(value) = std::env::var_os(var).filter(|v| !v.is_empty()) {
                identity.push_str(&format!(" {var}={}", value.to_string_lossy()));
            }
        }
        Ok(identity.into_bytes())
    }

    fn why_not_cacheable(
        &self,
        validity: &Validity,
        _listed_at: SystemTime,
        _cache: &ManifestCache,
    ) -> Option<String> {
        match validity {
            Validity::Remote { .. } => None,
            _ => Some(KEYS_NOT_CACHED.to_string()),
        }
    }

    fn check_cached(
        &self,
        objects: &FileList,
        validity: &Validity,
        cache: &ManifestCache,
        _threads: usize,
    ) -> Result<Checked, String> {
        let Validity::Remote { listed_at, etags } = validity else {
            return Err("the cache file holds a local directory's listing".to_string());
        };
        check_age(*listed_at, SystemTime::now(), cache.remote_max_age)?;
        self.adopt(objects, etags, Some(*listed_at));
        Ok(Checked::default())
    }
}

/// A listing's keys and sizes, and its ETags block (each ETag and a NUL).
pub(crate) fn files_and_etags(objects: &[RemoteObject]) -> (FileList, Vec<u8>) {
    let mut files =
        FileList::with_capacity(objects.len(), objects.iter().map(|o| o.key.len()).sum());
    let mut etags = Vec::with_capacity(objects.len() * 36);
    for o in objects {
        files.push(o.key.as_bytes(), o.size);
        // HTTP header values hold no NUL; one would only cut the ETag short,
        // which the read's If-Match then refuses.
        let etag = o.etag.as_deref().unwrap_or_default().as_bytes();
        etags.extend(etag.iter().copied().filter(|&b| b != 0));
        etags.push(0);
    }
    (files, etags)
}

/// Whether a listing that began at `listed_at` is young enough at `now`.
fn check_age(listed_at: SystemTime, now: SystemTime, max_age: Duration) -> Result<(), String> {
    if max_age.is_zero() {
        return Err("--manifest-max-age 0: a remote prefix is listed at every start".to_string());
    }
    match now.duration_since(listed_at) {
        Ok(age) if age > max_age => Err(format!(
            "the cached listing is {} old, past --manifest-max-age {}",
            human_duration(age),
            human_duration(max_age)
        )),
        Ok(_) => Ok(()),
        Err(ahead) if ahead.duration() > LISTED_IN_FUTURE_MAX => Err(format!(
            "the cached listing is stamped {} in the future (was the clock set back?)",
            human_duration(ahead.duration())
        )),
        Err(_) => Ok(()),
    }
}

/// `90 s`, `12 min`, `3.0 h`, `2.0 d`: for messages.
pub fn human_duration(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0..=119 => format!("{secs} s"),
        120..=7_199 => format!("{} min", secs / 60),
        7_200..=172_799 => format!("{:.1} h", secs as f64 / 3_600.0),
        _ => format!("{:.1} d", secs as f64 / 86_400.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_listing_is_young_within_the_age_limit_and_never_with_zero() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let hour = Duration::from_secs(3_600);
        assert_eq!(check_age(at, at + hour / 2, hour), Ok(()));
        let old = check_age(at, at + hour * 2, hour).unwrap_err();
        assert!(old.contains("2.0 h old") && old.contains("60 min"), "{old}");
        assert!(check_age(at, at, Duration::ZERO)
            .unwrap_err()
            .contains("--manifest-max-age 0"));
        assert_eq!(check_age(at + Duration::from_secs(5), at, hour), Ok(()));
        assert!(check_age(at + hour, at, hour)
            .unwrap_err()
            .contains("in the future"));
    }

    #[test]
    fn keys_with_a_ringfeed_segment_are_ringfeeds_own_and_others_are_samples() {
        for key in [
            ".ringfeed/head-1.txt",
            "a/.ringfeed/manifest-0.rfm",
            ".ringfeed",
        ] {
            assert!(is_ringfeed_key(key), "{key}");
        }
        for key in [
            "a.ringfeed",
            ".ringfeeds/x",
            "x/.ringfeed.txt",
            "ringfeed/x",
        ] {
            assert!(!is_ringfeed_key(key), "{key}");
        }
    }

    #[test]
    fn remote_urls_are_told_from_local_paths() {
        for url in [
            "s3://b/p",
            "gs://b",
            "az://c/p",
            "abfs://c@a.dfs.core.windows.net/p",
        ] {
            assert!(is_remote_url(url), "{url}");
        }
        for url in ["https://h/p", "http://127.0.0.1:8080/d/"] {
            assert!(is_remote_url(url), "{url}");
        }
        for path in ["/data/s3://x", "data", "file:///data", "s3:/b"] {
            assert!(!is_remote_url(path), "{path}");
        }
    }
}
