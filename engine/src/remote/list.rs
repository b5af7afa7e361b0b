//! Listing a prefix: `(key relative to the prefix, size, ETag)` in byte-wise
//! order of keys, directory markers skipped; sequential, or in parallel over
//! key ranges with work stealing; or from an explicit key list.
//!
//! Parallel listing splits the key space as it goes: a worker lists its
//! range `(after, upto]` with start-after (`list_with_offset`), and every
//! `LIST_SPLIT_AFTER_KEYS` keys (a page), if workers are idle, it cuts its
//! remaining range at one key per idle worker and queues the parts, which
//! the idle workers take. Cut keys come from the keys seen, read as numbers
//! in the alphabet they use (`split`), so they follow the shape of real keys
//! (`shard-000123` in decimal, hashes in hex): the tail is cut about a page
//! apart ahead of the current key, a bounded range evenly.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};

use super::error::RemoteError;
use super::metrics::{AttemptOutcome, LastAttempt, LAST_ATTEMPT};
use super::split::{common_prefix, cut_points, page_alphabet};
use super::store::StoreHandle;
use super::RemoteObject;

/// A worker with a range checks for idle workers after this many keys.
pub const LIST_SPLIT_AFTER_KEYS: usize = 1000;
/// Pages a range cut for an idle worker spans (at least, and as a whole
/// number of them): every request asks for a whole page, so a range that
/// ends inside one has the rest of it parsed for nothing (the next range
/// asks for those keys again). With ranges of one page, the parallel
/// listing of 1M keys parsed 1.5 to 2.5 times the keys; of four, at most a
/// quarter more, while 1,000 pages still give 64 workers 250 ranges.
pub const RANGE_PAGES: usize = 4;
/// Keys of a range cut for an idle worker (see [`RANGE_PAGES`]).
const RANGE_KEYS: usize = RANGE_PAGES * LIST_SPLIT_AFTER_KEYS;
/// Cuts of the unbounded tail at least, when workers are idle (see
/// `list_range`).
pub const TAIL_CUTS_MIN: usize = 8;
/// Most parallel listing workers.
pub const LIST_WORKERS_MAX: usize = 256;
/// HEAD requests in flight while sizing a key list.
pub const HEADS_IN_FLIGHT: usize = 64;

/// How far a listing is.
#[derive(Clone, Copy, Debug, Default)]
pub struct ListProgress {
    /// Keys listed so far.
    pub keys: u64,
    /// Key ranges finished (parallel listing; 1 for a sequential one).
    pub ranges_done: u64,
}

/// A progress callback, called from runtime threads.
pub type ProgressFn<'a> = dyn Fn(ListProgress) + Send + Sync + 'a;

fn relative(store: &StoreHandle, meta: &ObjectMeta) -> Option<String> {
    let full = meta.location.as_ref();
    let prefix = store.prefix.as_ref();
    let rel = if prefix.is_empty() {
        full
    } else {
        full.strip_prefix(prefix)?.strip_prefix('/')?
    };
    (!rel.is_empty() && !rel.ends_with('/')).then(|| rel.to_string())
}

/// Sorts, and drops directory markers: object_store strips a key's
/// trailing `/`, so a marker shows as an empty object whose key is also a
/// directory of other keys.
fn finish(mut objects: Vec<RemoteObject>) -> Vec<RemoteObject> {
    objects.sort_unstable_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
    objects.dedup_by(|a, b| a.key == b.key);
    let mut keep = vec![true; objects.len()];
    for i in 0..objects.len() {
        if objects[i].size == 0 {
            let dir = format!("{}/", objects[i].key);
            // Keys under `dir` sort right after it or after keys such as
            // `dir-x` and `dir.x`; look ahead for the first with `dir` as prefix.
            let under = objects[i + 1..]
                .iter()
                .take_while(|o| o.key.starts_with(objects[i].key.as_str()))
                .any(|o| o.key.starts_with(&dir));
            keep[i] = !under;
        }
    }
    let mut it = keep.into_iter();
    objects.retain(|_| it.next().unwrap_or(true));
    objects
}

fn listing_error(store: &StoreHandle, e: object_store::Error) -> RemoteError {
    let status = match &e {
        object_store::Error::NotFound { .. } => 404,
        object_store::Error::PermissionDenied { .. } => 403,
        object_store::Error::Unauthenticated { .. } => 401,
        // object_store hides the status of most failures: the counting
        // connector recorded the last attempt's.
        // Paginated listings may run their requests elsewhere; then the
        // status is read from object_store's message.
        _ => LAST_ATTEMPT
            .try_with(|last| match last.get() {
                AttemptOutcome::Status(s) => s,
                _ => 0,
            })
            .ok()
            .filter(|&s| s != 0)
            .unwrap_or_else(|| status_in_text(&e.to_string())),
    };
    RemoteError::Listing {
        url: store.display.clone(),
        status,
        scheme: store.scheme,
        detail: super::error::with_cause(&e),
    }
}

/// The status in object_store's "Server returned non-2xx status code: 403
/// Forbidden" message; 0 when there is none.
fn status_in_text(text: &str) -> u16 {
    const MARK: &str = "status code: ";
    text.find(MARK)
        .and_then(|i| text.get(i + MARK.len()..i + MARK.len() + 3))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The object of a listed key; `None` for a directory marker or a key
/// outside the prefix, an error for a key that cannot be one
/// ([`super::check_key`]).
fn to_object(store: &StoreHandle, meta: ObjectMeta) -> Result<Option<RemoteObject>, RemoteError> {
    let Some(key) = relative(store, &meta) else {
        return Ok(None);
    };
    super::check_key(&key).map_err(|detail| RemoteError::Listing {
        url: store.display.clone(),
        status: 0,
        scheme: store.scheme,
        detail,
    })?;
    Ok(Some(RemoteObject {
        key,
        size: meta.size,
        etag: meta.e_tag,
    }))
}

/// Lists the prefix with one paginated listing.
pub async fn list(
    store: &StoreHandle,
    progress: Option<&ProgressFn<'_>>,
) -> Result<Vec<RemoteObject>, RemoteError> {
    let prefix = (!store.prefix.as_ref().is_empty()).then_some(&store.prefix);
    let mut stream = store.meta.list(prefix);
    let mut out = Vec::new();
    while let Some(meta) = stream.next().await {
        let meta = meta.map_err(|e| listing_error(store, e))?;
        out.extend(to_object(store, meta)?);
        if out.len().is_multiple_of(LIST_SPLIT_AFTER_KEYS) {
            if let Some(p) = progress {
                p(ListProgress {
                    keys: out.len() as u64,
                    ranges_done: 0,
                });
            }
        }
    }
    if let Some(p) = progress {
        p(ListProgress {
            keys: out.len() as u64,
            ranges_done: 1,
        });
    }
    Ok(finish(out))
}

/// A key range `(after, upto]` of full object paths; `None` is unbounded.
#[derive(Debug, Clone)]
struct KeyRange {
    after: Option<String>,
    upto: Option<String>,
}

#[derive(Default)]
struct Queue {
    ranges: VecDeque<KeyRange>,
    busy: usize,
    keys: u64,
    ranges_done: u64,
    /// Pages of the key space given to ranges by cuts of the tail (and
    /// listed by the tail's workers): how far the keys are known to go.
    tail_pages: usize,
    error: Option<RemoteError>,
}

/// Lists the prefix with `workers` concurrent range listings (see the
/// module docs). Gives the same objects as [`list`]. Stores that cannot
/// start a listing after a key (Azure, HTTP) list everything for each
/// range and filter, so for them use [`list`].
pub async fn list_parallel(
    store: &StoreHandle,
    workers: usize,
    progress: Option<&ProgressFn<'_>>,
) -> Result<Vec<RemoteObject>, RemoteError> {
    let last = Arc::new(LastAttempt::default());
    LAST_ATTEMPT
        .scope(last, list_ranges(store, workers, progress))
        .await
}

async fn list_ranges(
    store: &StoreHandle,
    workers: usize,
    progress: Option<&ProgressFn<'_>>,
) -> Result<Vec<RemoteObject>, RemoteError> {
    if !(1..=LIST_WORKERS_MAX).contains(&workers) {
        return Err(RemoteError::InvalidConfig {
            reason: format!("listing workers {workers} is not in 1..={LIST_WORKERS_MAX}"),
        });
    }
    let queue = Arc::new(Mutex::new(Queue::default()));
    lock(&queue).ranges.push_back(KeyRange {
        after: None,
        upto: None,
    });
    let notify = Arc::new(tokio::sync::Notify::new());
    // Each worker is a task of its own, so the runtime's threads parse pages
    // in parallel: object_store parses a page's XML inside the stream that
    // asked for it, and workers joined in one future were all polled, and
    // so parsed, on one thread at a time (the CPU bound of a 1M-key listing).
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let (store, queue, notify) = (store.clone(), Arc::clone(&queue), Arc::clone(&notify));
        let last = LAST_ATTEMPT
            .try_with(Arc::clone)
            .unwrap_or_else(|_| Arc::new(LastAttempt::default()));
        tasks.spawn(LAST_ATTEMPT.scope(last, async move {
            worker(&store, workers, &queue, &notify).await
        }));
    }
    let mut runs: Vec<Run> = Vec::new();
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                Some(Ok(mut done)) => runs.append(&mut done),
                Some(Err(e)) => {
                    lock(&queue).error.get_or_insert(RemoteError::Stopped {
                        reason: format!("a listing task failed: {e}"),
                    });
                }
                None => break,
            },
            _ = tick.tick(), if progress.is_some() => report(&queue, progress),
        }
    }
    report(&queue, progress);
    if let Some(e) = lock(&queue).error.take() {
        return Err(e);
    }
    // The ranges are disjoint and each run is in key order: put end to end
    // in the order of their starts, they are the whole listing in order, and
    // `finish`'s sort only confirms it (one pass) instead of sorting a
    // million keys after the last page came.
    runs.sort_unstable_by(|a, b| {
        a.0.as_deref()
            .map(str::as_bytes)
            .cmp(&b.0.as_deref().map(str::as_bytes))
    });
    let total = runs.iter().map(|r| r.1.len()).sum();
    let mut all = Vec::with_capacity(total);
    for (_, mut objects) in runs {
        all.append(&mut objects);
    }
    Ok(finish(all))
}

/// The objects one range of a parallel listing gave, in key order, and
/// where the range began (None: at the first key).
type Run = (Option<String>, Vec<RemoteObject>);

/// How often a parallel listing reports its progress.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

fn report(queue: &Mutex<Queue>, progress: Option<&ProgressFn<'_>>) {
    if let Some(p) = progress {
        let q = lock(queue);
        let now = ListProgress {
            keys: q.keys,
            ranges_done: q.ranges_done,
        };
        drop(q);
        p(now);
    }
}

fn lock(queue: &Mutex<Queue>) -> std::sync::MutexGuard<'_, Queue> {
    // A poisoned lock only means another worker panicked mid-update of
    // plain counters; the queue itself stays consistent.
    queue.lock().unwrap_or_else(|p| p.into_inner())
}

async fn worker(
    store: &StoreHandle,
    workers: usize,
    queue: &Mutex<Queue>,
    notify: &tokio::sync::Notify,
) -> Vec<Run> {
    let mut runs = Vec::new();
    loop {
        let range = {
            let mut q = lock(queue);
            if q.error.is_some() {
                return runs;
            }
            match q.ranges.pop_front() {
                Some(r) => {
                    q.busy += 1;
                    Some(r)
                }
                None if q.busy == 0 => {
                    notify.notify_waiters();
                    return runs;
                }
                None => None,
            }
        };
        let Some(range) = range else {
            // Bounded wait: a wakeup between the check and here is not lost for long.
            let _ = tokio::time::timeout(Duration::from_millis(20), notify.notified()).await;
            continue;
        };
        let after = range.after.clone();
        let mut out = Vec::new();
        let result = list_range(store, workers, range, queue, notify, &mut out).await;
        runs.push((after, out));
        let mut q = lock(queue);
        q.busy -= 1;
        q.ranges_done += 1;
        if let Err(e) = result {
            q.error.get_or_insert(e);
        }
        drop(q);
        notify.notify_waiters();
    }
}

async fn list_range(
    store: &StoreHandle,
    workers: usize,
    mut range: KeyRange,
    queue: &Mutex<Queue>,
    notify: &tokio::sync::Notify,
    out: &mut Vec<RemoteObject>,
) -> Result<(), RemoteError> {
    let prefix = (!store.prefix.as_ref().is_empty()).then_some(&store.prefix);
    let meta: &dyn ObjectStore = store.meta.as_ref();
    let mut stream = match &range.after {
        Some(after) => meta.list_with_offset(prefix, &super::store::raw_path(after)),
        None => meta.list(prefix),
    };
    let mut first: Option<String> = None;
    let mut seen = 0usize;
    while let Some(item) = stream.next().await {
        let item = item.map_err(|e| listing_error(store, e))?;
        let loc = item.location.as_ref().to_string();
        if !reaches(&mut range, &loc, queue) {
            break;
        }
        first.get_or_insert_with(|| loc.clone());
        out.extend(to_object(store, item)?);
        seen += 1;
        if seen.is_multiple_of(LIST_SPLIT_AFTER_KEYS) {
            lock(queue).keys += LIST_SPLIT_AFTER_KEYS as u64;
        }
        // The range's last key: nothing is left (saves a page past it).
        if range.upto.as_deref() == Some(loc.as_str()) {
            break;
        }
        // Cut at the first key of a page, not the last of the one before:
        // the range is known to go on (a cut past the end of the keys costs
        // a request that finds nothing).
        if seen > LIST_SPLIT_AFTER_KEYS && seen % LIST_SPLIT_AFTER_KEYS == 1 {
            let lo = first.as_deref().unwrap_or(&loc);
            cut(
                store,
                workers,
                &mut range,
                (lo, &loc, seen),
                out,
                queue,
                notify,
            );
        }
    }
    lock(queue).keys += (seen % LIST_SPLIT_AFTER_KEYS) as u64;
    Ok(())
}

/// Whether `loc` lies in `range`, after taking into it the ranges that
/// follow it while no worker took them: past a range's end, the rest of the
/// page (already fetched and parsed) belongs to the next range, and this
/// worker goes on with it instead of dropping keys it parsed (with ranges
/// about a page long, near half the pages of a listing were parsed twice:
/// the CPU a parallel listing is bound by).
fn reaches(range: &mut KeyRange, loc: &str, queue: &Mutex<Queue>) -> bool {
    while range.upto.as_deref().is_some_and(|upto| loc > upto) {
        let mut q = lock(queue);
        let next = q
            .ranges
            .iter()
            .position(|r| r.after == range.upto)
            .and_then(|i| q.ranges.remove(i));
        drop(q);
        match next {
            Some(next) => range.upto = next.upto,
            None => return false,
        }
    }
    true
}

/// At the first key of a page (`at`: the range's first key, this one, the
/// keys seen), cuts the rest of `range` at one key per idle worker and
/// queues the parts (see the module docs).
fn cut(
    store: &StoreHandle,
    workers: usize,
    range: &mut KeyRange,
    (lo, loc, seen): (&str, &str, usize),
    out: &[RemoteObject],
    queue: &Mutex<Queue>,
    notify: &tokio::sync::Notify,
) {
    let mut q = lock(queue);
    let mut idle = workers.saturating_sub(q.busy + q.ranges.len());
    if range.upto.is_none() {
        // The tail's end is unknown: at most twice the pages already
        // given to ranges, so that cuts past it stay few.
        q.tail_pages += seen / LIST_SPLIT_AFTER_KEYS;
        idle = idle.min((2 * q.tail_pages).max(TAIL_CUTS_MIN));
    }
    if idle == 0 {
        return;
    }
    let page = &out[out.len().saturating_sub(LIST_SPLIT_AFTER_KEYS)..];
    let alphabet = match (page.first(), page.last()) {
        (Some(a), Some(b)) => page_alphabet(
            page.iter().map(|o| o.key.as_bytes()),
            common_prefix(a.key.as_bytes(), b.key.as_bytes()),
        ),
        _ => super::split::SPLIT_ALPHABET.to_vec(),
    };
    // The store's prefix and its `/`: never cut into.
    let floor = match store.prefix.as_ref().len() {
        0 => 0,
        n => n + 1,
    };
    let cuts = cut_points(
        lo,
        loc,
        range.upto.as_deref(),
        &alphabet,
        idle,
        (floor, seen, RANGE_KEYS),
    );
    if range.upto.is_none() {
        q.tail_pages += cuts.len() * RANGE_PAGES;
    }
    if let Some(first_cut) = cuts.first() {
        for w in cuts.windows(2) {
            q.ranges.push_back(KeyRange {
                after: Some(w[0].clone()),
                upto: Some(w[1].clone()),
            });
        }
        q.ranges.push_back(KeyRange {
            after: cuts.last().cloned(),
            upto: range.upto.take(),
        });
        range.upto = Some(first_cut.clone());
        drop(q);
        notify.notify_waiters();
    }
}

/// Reads an explicit key list: one key per line, optionally a tab and its
/// size in bytes; blank lines and lines starting with `#` are skipped. Keys
/// without a size are sized with HEAD requests (which also give the ETag).
pub async fn read_keys_file(
    store: &StoreHandle,
    path: &std::path::Path,
) -> Result<Vec<RemoteObject>, RemoteError> {
    let file_err = |line: usize, reason: String| RemoteError::KeysFile {
        path: path.display().to_string(),
        line,
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| file_err(0, e.to_string()))?;
    let mut objects = Vec::new();
    let mut unsized_at = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, size) = match line.split_once('\t') {
            Some((k, s)) => {
                let size = s
                    .trim()
                    .parse::<u64>()
                    .map_err(|e| file_err(i + 1, format!("size {s:?}: {e}")))?;
                (k, Some(size))
            }
            None => (line, None),
        };
        let key = key.trim_start_matches('/');
        if key.ends_with('/') {
            return Err(file_err(i + 1, format!("{key:?} is not an object key")));
        }
        super::check_key(key).map_err(|e| file_err(i + 1, e))?;
        if size.is_none() {
            unsized_at.push((objects.len(), i + 1));
        }
        objects.push(RemoteObject {
            key: key.to_string(),
            size: size.unwrap_or(0),
            etag: None,
        });
    }
    let heads = futures::stream::iter(unsized_at.into_iter().map(|(at, line)| {
        let location = store.path_of(&objects[at].key);
        async move { (at, line, store.meta.head(&location).await) }
    }))
    .buffer_unordered(HEADS_IN_FLIGHT)
    .collect::<Vec<_>>()
    .await;
    for (at, line, head) in heads {
        let meta = head.map_err(|e| file_err(line, format!("HEAD {}: {e}", objects[at].key)))?;
        objects[at].size = meta.size;
        objects[at].etag = meta.e_tag;
    }
    objects.sort_unstable_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
    if let Some(w) = objects.windows(2).find(|w| w[0].key == w[1].key) {
        return Err(file_err(0, format!("key {:?} is listed twice", w[0].key)));
    }
    Ok(objects)
}

#[cfg(test)]
mod tests {
    use super::finish;
    use crate::remote::RemoteObject;

    #[test]
    fn directory_markers_are_dropped_and_empty_files_kept() {
        let o = |key: &str, size| RemoteObject {
            key: key.to_string(),
            size,
            etag: None,
        };
        let got = finish(vec![o("b", 0), o("a/b", 3), o("a", 0), o("a-c", 0)]);
        assert_eq!(got, vec![o("a-c", 0), o("a/b", 3), o("b", 0)]);
    }
}
