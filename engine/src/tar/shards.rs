//! A listing of tar shards into a ranges-mode manifest: each shard's index
//! from the index cache, else from its sidecar `.tar.idx`, else from its
//! headers (local: pread; remote: one streaming GET each, many in flight),
//! then its members grouped into samples.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::cache::{IndexCache, INDEX_FILE_BYTES_MAX};
use super::facts::{ClassLists, ShardFacts};
use super::group::{group, SampleRange};
use super::index::{TarIndex, SIDECAR_SUFFIX};
use super::local::{scan_file, LocalScanError};
use super::remote::{read_object, scan_object, RemoteScanError};
use super::scan::ScanError;
use crate::manifest::{FileList, Manifest, ManifestError, ObjectNames, SampleRanges};
use crate::source::{LocalSource, OpenedSource, RemoteSource, Source};

/// What a shard's name ends with.
pub const TAR_SUFFIX: &[u8] = b".tar";
/// Threads indexing local shards at once.
pub const LOCAL_INDEX_THREADS_MAX: usize = 8;
/// Remote shards being indexed at once (one streaming GET each).
pub const REMOTE_SHARDS_IN_FLIGHT: usize = 64;
/// Attempts of one remote shard's header scan (a failed GET is retried).
pub const SCAN_ATTEMPTS_MAX: u32 = 3;
/// First backoff between attempts; doubles each time.
pub const SCAN_BACKOFF_MS: u64 = 100;
/// Indexing logs its progress this often.
pub const PROGRESS_EVERY_MS: u64 = 3000;

/// True when `key` is a sidecar index (`<shard>.tar.idx`).
pub fn is_sidecar(key: &[u8]) -> bool {
    key.strip_suffix(SIDECAR_SUFFIX.as_bytes())
        .is_some_and(|shard| shard.ends_with(TAR_SUFFIX))
}

/// True when every object of `files` is a tar shard (`.tar`) or a sidecar
/// index, and there is at least one shard: the listing is served as tar
/// shards without `--format tar`.
pub fn is_tar_listing(files: &FileList) -> bool {
    let mut shards = 0usize;
    for key in files.paths_bytes() {
        if key.ends_with(TAR_SUFFIX) {
            shards += 1;
        } else if !is_sidecar(key) {
            return false;
        }
    }
    shards > 0
}

/// Where a shard's index came from, for the log.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    cached: usize,
    sidecar: usize,
    scanned: usize,
}

/// One shard to index.
struct Job {
    /// Position among the shards (the manifest's object index).
    shard: usize,
    key: Vec<u8>,
    size_bytes: u64,
    /// The sidecar was listed.
    sidecar: bool,
    /// ETag of the shard and of its sidecar (remote).
    etag: Option<String>,
}

/// Indexes every shard of `listed` (a whole-object manifest of `source`)
/// and builds the ranges-mode manifest of their samples. Objects that are
/// neither shards nor sidecars are an error naming the first.
pub fn tar_manifest(
    source: &OpenedSource,
    listed: &Manifest,
    cache: Option<&IndexCache>,
) -> Result<Manifest, ManifestError> {
    let names = source.source();
    let files = listed.files();
    let mut shards = FileList::new();
    let mut jobs = Vec::new();
    let keys: Vec<&[u8]> = files.paths_bytes().collect();
    let etags = match source {
        OpenedSource::Remote(remote) => remote
            .objects_for(files)
            .into_iter()
            .map(|o| o.etag)
            .collect(),
        OpenedSource::Local(_) => vec![None; files.len()],
    };
    for (i, &key) in keys.iter().enumerate() {
        if is_sidecar(key) {
            continue;
        }
        if !key.ends_with(TAR_SUFFIX) {
            return Err(ManifestError::Shard(format!(
                "--format tar: {} is not a tar shard (its name does not end in .tar); serve shards and their .tar.idx only, or pass --format files",
                names.object_name(key).display()
            )));
        }
        let mut sidecar_key = key.to_vec();
        sidecar_key.extend_from_slice(SIDECAR_SUFFIX.as_bytes());
        // The sidecar sorts right after its shard, or after keys such as
        // `<shard>.x`: a binary search finds it.
        let sidecar = keys.binary_search(&sidecar_key.as_slice()).is_ok();
        jobs.push(Job {
            shard: jobs.len(),
            key: key.to_vec(),
            size_bytes: files.size_bytes(i),
            sidecar,
            etag: etags[i].clone(),
        });
        shards.push(key, files.size_bytes(i));
    }
    let started = Instant::now();
    let progress = Progress::default();
    let results = match source {
        OpenedSource::Local(local) => index_local(local, &jobs, cache, &progress),
        OpenedSource::Remote(remote) => index_remote(remote, &jobs, cache, &progress),
    };
    // A failure stops the other workers, so shards after it may not be
    // indexed: report the first failure, in shard order.
    if let Some(Some(Err(first))) = results.iter().find(|r| matches!(r, Some(Err(_)))) {
        return Err(ManifestError::Shard(first.clone()));
    }
    let mut ranges = SampleRanges::new();
    let mut counts = Counts::default();
    let mut facts = Vec::with_capacity(jobs.len());
    for (job, result) in jobs.iter().zip(results) {
        // Every shard was indexed when none failed (both indexers run
        // until the last job or the first failure).
        let (samples, shard_facts, how) = result
            .unwrap_or_else(|| {
                Err(format!(
                    "tar shard {} was not indexed (an internal error: please report it)",
                    names.object_name(&job.key).display()
                ))
            })
            .map_err(ManifestError::Shard)?;
        match how {
            How::Cached => counts.cached += 1,
            How::Sidecar => counts.sidecar += 1,
            How::Scanned => counts.scanned += 1,
        }
        for s in samples {
            // job.shard < jobs.len() <= files.len() <= MAX_FILES < u32::MAX.
            ranges.push(job.shard as u32, s.offset_bytes, s.len_bytes);
        }
        facts.push((
            names.object_name(&job.key).display().to_string(),
            shard_facts,
        ));
    }
    let facts = super::facts::merge(facts).map_err(ManifestError::Shard)?;
    let uncached = uncached_words(cache, progress.untagged.load(Ordering::Relaxed));
    tracing::info!(
        "tar shards: {} indexed in {:.2} s ({} from the index cache, {} from .tar.idx sidecars, {} from their headers), {} members in {} samples{uncached}",
        jobs.len(),
        started.elapsed().as_secs_f64(),
        counts.cached,
        counts.sidecar,
        counts.scanned,
        progress.members.load(Ordering::Relaxed),
        ranges.len()
    );
    Ok(Manifest::from_ranges(shards, ranges, &NamesOf(names))?.with_key_facts(facts))
}

/// What the indexing log line says of shards not kept in the index cache.
fn uncached_words(cache: Option<&IndexCache>, untagged: usize) -> String {
    match (cache, untagged) {
        (None, _) => "; index cache off".to_owned(),
        (Some(_), 0) => String::new(),
        (Some(_), n) => {
            format!("; {n} without an ETag or a last-modified time, so not kept in the index cache")
        }
    }
}

/// How one shard's index was had.
#[derive(Clone, Copy, Debug)]
enum How {
    Cached,
    Sidecar,
    Scanned,
}

/// A shard's samples and the facts of their keys, or the message of what
/// is wrong with it.
type ShardResult = Result<(Vec<SampleRange>, ShardFacts, How), String>;

#[derive(Default)]
struct Progress {
    done: AtomicUsize,
    members: AtomicU64,
    failed: AtomicBool,
    /// Remote shards with no version to key the index cache by.
    untagged: AtomicUsize,
    /// An index could not be written to the cache (warned once).
    cache_unwritable: AtomicBool,
    /// The class lists the indexes record, one copy of each.
    class_lists: ClassLists,
}

impl Progress {
    /// Warns, once a run, that the index cache cannot be written.
    fn cache_write_failed(&self, cache: &IndexCache, shard: &str, err: &std::io::Error) {
        if !self.cache_unwritable.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "cannot keep the index of {shard} in the tar index cache {}: {err}; the next start reads the shards' headers again \
                 (make it writable, or point --cache-dir or RINGFEED_CACHE_DIR elsewhere)",
                cache.dir().display()
            );
        }
    }

    fn log(&self, total: usize) {
        tracing::info!(
            "indexing tar shards: {}/{total} done, {} members so far",
            self.done.load(Ordering::Relaxed),
            self.members.load(Ordering::Relaxed)
        );
    }
}

fn scan_message(shard: &str, err: &ScanError) -> String {
    format!(
        "tar shard {shard}, header at byte {}: {}; re-create the shard (or remove it from the source)",
        err.offset, err.fault
    )
}

/// Groups `index` (of `shard`) into samples, with the facts of their keys.
fn samples_of(
    shard: &str,
    index: &TarIndex,
    progress: &Progress,
) -> Result<(Vec<SampleRange>, ShardFacts), String> {
    let mut samples = Vec::new();
    group(index, |s| samples.push(s)).map_err(|e| scan_message(shard, &e))?;
    progress
        .members
        .fetch_add(index.members.len() as u64, Ordering::Relaxed);
    Ok((samples, ShardFacts::of(index, &progress.class_lists)))
}

/// A sidecar's index if it is valid for a shard of `shard_bytes`; a warning
/// otherwise (the shard is then indexed from its headers).
fn sidecar_index(
    sidecar: &str,
    bytes: Result<Vec<u8>, String>,
    shard_bytes: u64,
) -> Option<TarIndex> {
    let why = match bytes.map(|b| TarIndex::parse(&b)) {
        Ok(Ok(index)) if index.shard_bytes == shard_bytes => return Some(index),
        Ok(Ok(index)) => format!(
            "it describes a shard of {} bytes, the shard is {shard_bytes}",
            index.shard_bytes
        ),
        Ok(Err(err)) => err.to_string(),
        Err(err) => format!("cannot read it: {err}"),
    };
    tracing::warn!("ignoring the tar index {sidecar}: {why}; the shard is indexed from its headers (rewrite or delete the .idx)");
    None
}

fn index_local(
    local: &LocalSource,
    jobs: &[Job],
    cache: Option<&IndexCache>,
    progress: &Progress,
) -> Vec<Option<ShardResult>> {
    let root = local.cache_identity().unwrap_or_default();
    let results: Vec<Mutex<Option<ShardResult>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let threads = LOCAL_INDEX_THREADS_MAX.min(jobs.len()).max(1);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs.len() || progress.failed.load(Ordering::Relaxed) {
                    return;
                }
                let result = index_local_shard(local, &root, &jobs[i], cache, progress);
                if result.is_err() {
                    progress.failed.store(true, Ordering::Relaxed);
                }
                progress.done.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut slot) = results[i].lock() {
                    *slot = Some(result);
                }
            });
        }
        watch(progress, jobs.len(), || {
            next.load(Ordering::Relaxed) >= jobs.len() + threads
        });
    });
    results
        .into_iter()
        .map(|m| m.into_inner().ok().flatten())
        .collect()
}

/// Logs progress every `PROGRESS_EVERY_MS` until `finished` says so.
fn watch(progress: &Progress, total: usize, finished: impl Fn() -> bool) {
    let started = Instant::now();
    let mut logged = Instant::now();
    while !finished()
        && progress.done.load(Ordering::Relaxed) < total
        && !progress.failed.load(Ordering::Relaxed)
    {
        std::thread::sleep(Duration::from_millis(50));
        if started.elapsed() > Duration::from_millis(PROGRESS_EVERY_MS)
            && logged.elapsed() > Duration::from_millis(PROGRESS_EVERY_MS)
        {
            progress.log(total);
            logged = Instant::now();
        }
    }
}

fn index_local_shard(
    local: &LocalSource,
    root: &[u8],
    job: &Job,
    cache: Option<&IndexCache>,
    progress: &Progress,
) -> ShardResult {
    use std::os::unix::fs::MetadataExt;
    let path = local.path_of(&job.key);
    let name = path.display().to_string();
    let meta = std::fs::metadata(&path).map_err(|e| {
        format!(
            "tar shard {name}: cannot read its metadata: {e}; check that it exists and is readable"
        )
    })?;
    if meta.len() != job.size_bytes {
        return Err(format!(
            "tar shard {name} is {} bytes, but was listed at {}: it changed since it was listed; start again with --manifest-cache refresh",
            meta.len(),
            job.size_bytes
        ));
    }
    let mut identity = root.to_vec();
    for part in [&b"\0local\0"[..], &job.key] {
        identity.extend_from_slice(part);
    }
    identity.extend_from_slice(
        format!(
            "\0{}\0{}\0{}\0{}.{}",
            meta.len(),
            meta.dev(),
            meta.ino(),
            meta.mtime(),
            meta.mtime_nsec()
        )
        .as_bytes(),
    );
    if let Some(index) = cache.and_then(|c| c.get(&identity, job.size_bytes)) {
        let (samples, facts) = samples_of(&name, &index, progress)?;
        return Ok((samples, facts, How::Cached));
    }
    let from_sidecar = job.sidecar.then(|| {
        let sidecar = format!("{name}{SIDECAR_SUFFIX}");
        let bytes = read_sidecar(std::path::Path::new(&sidecar));
        sidecar_index(&sidecar, bytes, job.size_bytes)
    });
    let (index, how) = match from_sidecar.flatten() {
        Some(index) => (index, How::Sidecar),
        None => match scan_file(&path, job.size_bytes) {
            Ok(index) => (index, How::Scanned),
            Err(LocalScanError::Scan(err)) => return Err(scan_message(&name, &err)),
            Err(LocalScanError::Io(err)) => {
                return Err(format!("tar shard {name}: cannot read its headers: {err}; check that it is readable and was not truncated since it was listed"))
            }
        },
    };
    let (samples, facts) = samples_of(&name, &index, progress)?;
    if let Some(cache) = cache {
        if let Err(err) = cache.put(&identity, &index) {
            progress.cache_write_failed(cache, &name, &err);
        }
    }
    Ok((samples, facts, how))
}

fn index_remote(
    remote: &RemoteSource,
    jobs: &[Job],
    cache: Option<&IndexCache>,
    progress: &Progress,
) -> Vec<Option<ShardResult>> {
    let total = jobs.len();
    remote.runtime().block_on(async {
        let mut results: Vec<Option<ShardResult>> = (0..total).map(|_| None).collect();
        let mut logged = Instant::now();
        let mut pending = futures::stream::iter(jobs.iter().map(|job| async move {
            (
                job.shard,
                index_remote_shard(remote, job, cache, progress).await,
            )
        }))
        .buffer_unordered(REMOTE_SHARDS_IN_FLIGHT);
        while let Some((i, result)) = pending.next().await {
            let failed = result.is_err();
            results[i] = Some(result);
            progress.done.fetch_add(1, Ordering::Relaxed);
            if failed {
                break;
            }
            if logged.elapsed() > Duration::from_millis(PROGRESS_EVERY_MS) {
                progress.log(total);
                logged = Instant::now();
            }
        }
        results
    })
}

async fn index_remote_shard(
    remote: &RemoteSource,
    job: &Job,
    cache: Option<&IndexCache>,
    progress: &Progress,
) -> ShardResult {
    let store = remote.store();
    let key = String::from_utf8_lossy(&job.key).into_owned();
    let name = remote.object_name(&job.key).display().to_string();
    // The version that tells a changed object of the same size: the
    // listing's ETag, else one HEAD's (ETag, else last-modified); without
    // one the index is not cached.
    let version = match &job.etag {
        Some(etag) => Some(etag.clone()),
        None => super::remote::version_of(store, &key).await,
    };
    let identity = version
        .map(|v| format!("{}\0remote\0{key}\0{}\0{v}", store.display, job.size_bytes).into_bytes());
    if identity.is_none() {
        progress.untagged.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(index) = identity
        .as_ref()
        .and_then(|id| cache.and_then(|c| c.get(id, job.size_bytes)))
    {
        let (samples, facts) = samples_of(&name, &index, progress)?;
        return Ok((samples, facts, How::Cached));
    }
    let mut from_sidecar = None;
    if job.sidecar {
        let sidecar_key = format!("{key}{SIDECAR_SUFFIX}");
        let bytes = read_object(store, &sidecar_key).await;
        from_sidecar = sidecar_index(&format!("{name}{SIDECAR_SUFFIX}"), bytes, job.size_bytes);
    }
    let (index, how) = match from_sidecar {
        Some(index) => (index, How::Sidecar),
        None => match scan_with_retries(store, &key, job.size_bytes, job.etag.as_deref()).await {
            Ok(index) => (index, How::Scanned),
            Err(RemoteScanError::Scan(err)) => return Err(scan_message(&name, &err)),
            Err(RemoteScanError::Get(err)) => {
                return Err(format!("tar shard {name}: cannot read its headers: {err}; check the store and that the shard did not change since it was listed"))
            }
        },
    };
    let (samples, facts) = samples_of(&name, &index, progress)?;
    if let (Some(cache), Some(identity)) = (cache, &identity) {
        if let Err(err) = cache.put(identity, &index) {
            progress.cache_write_failed(cache, &name, &err);
        }
    }
    Ok((samples, facts, how))
}

/// [`scan_object`], again after a failed GET (up to `SCAN_ATTEMPTS_MAX`
/// attempts, backing off); a malformed shard is not retried.
async fn scan_with_retries(
    store: &crate::remote::StoreHandle,
    key: &str,
    shard_bytes: u64,
    etag: Option<&str>,
) -> Result<TarIndex, RemoteScanError> {
    let mut attempt = 1;
    loop {
        match scan_object(store, key, shard_bytes, etag).await {
            Err(RemoteScanError::Get(err)) if attempt < SCAN_ATTEMPTS_MAX => {
                tracing::debug!("reading the headers of {key} failed ({err}); attempt {} of {SCAN_ATTEMPTS_MAX}", attempt + 1);
                tokio::time::sleep(Duration::from_millis(SCAN_BACKOFF_MS << attempt)).await;
                attempt += 1;
            }
            done => return done,
        }
    }
}

/// A source seen as the names it gives.
struct NamesOf<'a>(&'a dyn Source);

impl ObjectNames for NamesOf<'_> {
    fn source_name(&self) -> std::path::PathBuf {
        self.0.source_name()
    }

    fn object_name(&self, key: &[u8]) -> std::path::PathBuf {
        self.0.object_name(key)
    }
}

/// A local sidecar's bytes: a file of the source (so followed if a link, as
/// the listing did), but never a FIFO's endless wait or a device's endless
/// bytes, and at most [`INDEX_FILE_BYTES_MAX`].
fn read_sidecar(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("it is not a regular file".to_owned());
    }
    if meta.len() > INDEX_FILE_BYTES_MAX {
        return Err(format!(
            "it is {} bytes, more than an index can be",
            meta.len()
        ));
    }
    let mut bytes = Vec::new();
    file.take(INDEX_FILE_BYTES_MAX)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    Ok(bytes)
}
