//! Parallel directory walk with work stealing.
//!
//! Every directory is a job on a crossbeam-deque, and so is every chunk of
//! `STAT_CHUNK` names in one directory that still need a `stat` (their
//! size; a link's target): a flat directory of a million files is listed by
//! one thread but stat'ed by all (on a network filesystem, where each stat
//! is a round trip, that is most of the time). Each thread pops from its
//! own LIFO deque (depth first, so deques stay small), then steals a batch
//! from the global injector, then from its peers. A counter of jobs queued
//! or under way tells the threads when the walk is over: a job's children
//! are counted before the job itself is uncounted, so the counter reaches
//! zero only when no job is left anywhere. The first error stops every
//! thread.
//!
//! The caller's thread only waits and reports progress; each thread's files
//! are then sorted into one list in manifest order (`FileList::sorted_union`),
//! with a stamp of every directory listed (taken before its entries are read)
//! for the manifest cache.

use std::ffi::OsString;
use std::fs;
use std::io::IsTerminal;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;
use crossbeam_deque::{Injector, Steal, Stealer, Worker};
use indicatif::ProgressBar;

use crate::manifest::{FileList, ManifestError, MAX_FILES};
use crate::source::{DirStamp, LinkStamp};

/// Listing shorter than this shows no progress at all.
const PROGRESS_AFTER_MS: u64 = 1_000;
/// Without a terminal, one `tracing::info` line this often.
const PROGRESS_LOG_EVERY_MS: u64 = 5_000;
/// Names of one directory stat'ed as one job (see the module's comment).
const STAT_CHUNK: usize = 1024;
/// How often the waiting thread wakes to update progress.
const PROGRESS_POLL_MS: u64 = 100;
/// Idle rounds a thread spins, then yields, before it sleeps between looks.
const IDLE_SPIN_ROUNDS: u32 = 16;
const IDLE_YIELD_ROUNDS: u32 = 64;
/// Sleep of an idle thread waiting for peers to publish directories.
const IDLE_SLEEP_US: u64 = 100;

/// A listing thread's work.
enum Job {
    /// Read a directory (relative to the root).
    Dir(PathBuf),
    /// Stat these files and links (true: a link) of a directory.
    Stat {
        rel_dir: Arc<Path>,
        names: Vec<(OsString, bool)>,
    },
}

/// What every listing thread shares.
struct Walk<'a> {
    root: &'a Path,
    /// The root with every link resolved: a link whose target is not under
    /// it points out of the tree.
    canonical_root: PathBuf,
    /// List links to files outside the tree (`--follow-links-outside`).
    follow_outside: bool,
    /// Links to files outside the tree, left out.
    outside_links: Mutex<Vec<PathBuf>>,
    injector: Injector<Job>,
    stealers: Vec<Stealer<Job>>,
    /// Jobs queued anywhere or under way.
    pending_jobs: AtomicUsize,
    /// Most jobs a thread keeps queued before it stats a chunk of names
    /// itself: two per thread.
    stat_backlog_max: usize,
    /// Regular files found so far (progress and the MAX_FILES limit).
    files_found: AtomicU64,
    /// Set on the first error: every thread stops at its next job.
    stop: AtomicBool,
    first_error: Mutex<Option<ManifestError>>,
    /// Sockets, FIFOs and devices skipped, and the first one met.
    skipped_special: AtomicU64,
    first_special: Mutex<Option<PathBuf>>,
}

/// What a walk found.
pub(super) struct Listing {
    /// In manifest order.
    pub files: FileList,
    /// Every directory listed, the root included (empty relative path).
    pub dirs: Vec<DirStamp>,
    /// Every symbolic link met, and what it pointed to.
    pub links: Vec<LinkStamp>,
}

/// Lists every regular file under `root` with `threads` threads; a link to
/// a file outside `root` only when `follow_outside`.
pub(super) fn list_files(
    root: &Path,
    threads: usize,
    progress: bool,
    follow_outside: bool,
) -> Result<Listing, ManifestError> {
    debug_assert!(threads >= 1);
    let workers: Vec<Worker<Job>> = (0..threads).map(|_| Worker::new_lifo()).collect();
    let walk = Walk {
        root,
        canonical_root: fs::canonicalize(root).map_err(|source| ManifestError::ReadDir {
            path: root.to_path_buf(),
            source,
        })?,
        follow_outside,
        outside_links: Mutex::new(Vec::new()),
        injector: Injector::new(),
        stealers: workers.iter().map(Worker::stealer).collect(),
        pending_jobs: AtomicUsize::new(1),
        stat_backlog_max: 2 * threads,
        files_found: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        first_error: Mutex::new(None),
        skipped_special: AtomicU64::new(0),
        first_special: Mutex::new(None),
    };
    walk.injector.push(Job::Dir(PathBuf::new()));

    let started = Instant::now();
    let mut parts = Vec::with_capacity(threads);
    let mut dirs = Vec::new();
    let mut links = Vec::new();
    thread::scope(|scope| {
        // Each thread holds a sender; the channel disconnects when the last
        // one is done, which wakes the waiting thread at once.
        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(0);
        let mut handles = Vec::with_capacity(threads);
        for (i, local) in workers.into_iter().enumerate() {
            let walk = &walk;
            let done_tx = done_tx.clone();
            let spawned = thread::Builder::new()
                .name(format!("ringfeed-list-{i}"))
                .spawn_scoped(scope, move || {
                    let found = walk.run_thread(&local);
                    drop(done_tx);
                    found
                });
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(source) => {
                    walk.fail(ManifestError::ThreadSpawn { source });
                    break;
                }
            }
        }
        drop(done_tx);
        report_progress(&walk, &done_rx, started, progress);
        for handle in handles {
            match handle.join() {
                Ok(found) => {
                    parts.push(found.files);
                    dirs.extend(found.dirs);
                    links.extend(found.links);
                }
                // A panic in a listing thread is a bug: carry it on.
                Err(payload) => std::panic::resume_unwind(payload),
            }
        }
    });
    if let Some(err) = walk.take_error() {
        return Err(err);
    }
    let files = FileList::sorted_union(parts);
    let outside =
        std::mem::take(&mut *walk.outside_links.lock().unwrap_or_else(|p| p.into_inner()));
    warn_skipped(&walk, &links, &outside);
    tracing::debug!(
        root = %root.display(),
        files = files.len(),
        threads,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "listed and sorted source directory"
    );
    Ok(Listing { files, dirs, links })
}

/// One warning for what the manifest leaves out of the tree (links to
/// directories, sockets, FIFOs, devices), so that data behind a link such as
/// `train -> /mnt/disk2/train` is not lost in silence; debug logs name each.
fn warn_skipped(walk: &Walk<'_>, links: &[LinkStamp], outside: &[PathBuf]) {
    warn_outside(walk.root, outside.to_vec());
    let outside_count = outside.len();
    let not_files: Vec<LinkStamp> = links
        .iter()
        .filter(|l| l.file_size.is_none() && !outside.contains(&l.rel_path))
        .cloned()
        .collect();
    debug_assert!(links.iter().filter(|l| l.file_size.is_none()).count() >= outside_count);
    let mut what: Vec<String> = links_not_followed(walk.root, &not_files)
        .into_iter()
        .collect();
    let special = walk.skipped_special.load(Ordering::Relaxed);
    if special > 0 {
        let first = walk
            .first_special
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default();
        what.push(format!(
            "{special} socket(s), FIFO(s) or device(s) (one: {})",
            first.display()
        ));
    }
    warn_left_out(walk.root, what);
}

/// Links out of the tree shown in the warning.
const OUTSIDE_NAMED: usize = 3;

/// The one warning for links to files outside the tree, left out
/// (`rel_paths`, relative to `root`), if there are any.
pub(super) fn warn_outside(root: &Path, mut rel_paths: Vec<PathBuf>) {
    if rel_paths.is_empty() {
        return;
    }
    rel_paths.sort();
    let named: Vec<String> = rel_paths
        .iter()
        .take(OUTSIDE_NAMED)
        .map(|p| root.join(p).display().to_string())
        .collect();
    tracing::warn!(
        "{}: skipped {} link(s) to files outside it ({}{}): a link out of the source could show another user's files; \
         pass --follow-links-outside to read them",
        root.display(),
        rel_paths.len(),
        named.join(", "),
        if rel_paths.len() > OUTSIDE_NAMED { ", ..." } else { "" }
    );
}

/// "N link(s) to a directory or other non-file, not followed (first: P)",
/// if `links` holds any.
pub(super) fn links_not_followed(root: &Path, links: &[LinkStamp]) -> Option<String> {
    let not_files: Vec<&LinkStamp> = links.iter().filter(|l| l.file_size.is_none()).collect();
    let first = not_files.iter().map(|l| &l.rel_path).min()?;
    Some(format!(
        "{} link(s) to a directory or other non-file, not followed (first: {})",
        not_files.len(),
        root.join(first).display()
    ))
}

/// The warning for what a manifest of `root` leaves out, `what` in words;
/// none if it is empty.
pub(super) fn warn_left_out(root: &Path, what: Vec<String>) {
    if !what.is_empty() {
        tracing::warn!(
            "{}: skipped {}; a manifest holds regular files and links to them only (RINGFEED_LOG=debug names each; \
             to serve files behind a directory link, give the link's target as --source or link the files)",
            root.display(),
            what.join(" and ")
        );
    }
}

/// Waits for the threads to finish; after `PROGRESS_AFTER_MS`, shows a
/// spinner (terminal) or logs a line every `PROGRESS_LOG_EVERY_MS`.
fn report_progress(
    walk: &Walk<'_>,
    done: &crossbeam_channel::Receiver<()>,
    started: Instant,
    progress: bool,
) {
    let use_spinner = progress && std::io::stderr().is_terminal();
    let mut spinner: Option<ProgressBar> = None;
    let mut last_log = started;
    // Nobody sends: the channel disconnects when every thread is done.
    while let Err(RecvTimeoutError::Timeout) =
        done.recv_timeout(Duration::from_millis(PROGRESS_POLL_MS))
    {
        if started.elapsed() < Duration::from_millis(PROGRESS_AFTER_MS) {
            continue;
        }
        let found = walk.files_found.load(Ordering::Relaxed);
        let message = format!("listing {}: {found} files found", walk.root.display());
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
    }
    if let Some(bar) = spinner {
        bar.finish_and_clear();
        tracing::info!(
            "listed {}: {} files in {:.1} s",
            walk.root.display(),
            walk.files_found.load(Ordering::Relaxed),
            started.elapsed().as_secs_f64()
        );
    }
}

impl Walk<'_> {
    /// One listing thread: take directories until none is left anywhere.
    fn run_thread(&self, local: &Worker<Job>) -> Listing {
        let mut found = Listing {
            files: FileList::new(),
            dirs: Vec::new(),
            links: Vec::new(),
        };
        let mut idle_rounds = 0u32;
        while !self.stop.load(Ordering::Relaxed) {
            let Some(job) = self.find_job(local) else {
                // SYNC POINT: pairs with the AcqRel decrement below; seeing 0
                // means every directory's children were already counted and
                // listed, so no job can appear any more.
                if self.pending_jobs.load(Ordering::Acquire) == 0 {
                    break;
                }
                idle_rounds = idle_rounds.saturating_add(1);
                idle_backoff(idle_rounds);
                continue;
            };
            idle_rounds = 0;
            let done = match job {
                Job::Dir(dir) => self.list_dir(local, dir, &mut found),
                Job::Stat { rel_dir, names } => self.stat_names(&rel_dir, names, &mut found),
            };
            if let Err(err) = done {
                self.fail(err);
            }
            // SYNC POINT: the children of this job were counted (and pushed)
            // before this decrement, so the counter cannot touch 0 while a
            // job is still queued.
            self.pending_jobs.fetch_sub(1, Ordering::AcqRel);
        }
        found
    }

    /// Own deque first, then a batch from the injector, then a peer.
    fn find_job(&self, local: &Worker<Job>) -> Option<Job> {
        local.pop().or_else(|| {
            std::iter::repeat_with(|| {
                self.injector.steal_batch_and_pop(local).or_else(|| {
                    self.stealers
                        .iter()
                        .map(Stealer::steal)
                        .collect::<Steal<_>>()
                })
            })
            .find(|steal| !steal.is_retry())
            .and_then(Steal::success)
        })
    }

    /// Lists one directory: subdirectories and chunks of names to stat
    /// become jobs (the last chunk is stat'ed here); the directory's own
    /// stamp goes to `found`.
    fn list_dir(
        &self,
        local: &Worker<Job>,
        rel_dir: PathBuf,
        found: &mut Listing,
    ) -> Result<(), ManifestError> {
        let abs_dir = self.root.join(&rel_dir);
        let read_dir_error = |source| ManifestError::ReadDir {
            path: abs_dir.clone(),
            source,
        };
        // The stamp comes before the entries: a change made while they are
        // read moves the directory's times past it, so a cache that keeps it
        // is found stale later. The root may be a link; the others are not
        // followed (the parent saw a directory; one replaced by a link since
        // is ELOOP here). Read through a descriptor, as the cache's check does.
        let meta = super::check::dir_metadata(&abs_dir, rel_dir.as_os_str().is_empty())
            .map_err(read_dir_error)?;
        found
            .dirs
            .push(super::check::stamp_of(rel_dir.clone(), &meta));
        let rel_dir: Arc<Path> = Arc::from(rel_dir);
        let mut names = Vec::new();
        for entry in fs::read_dir(&abs_dir).map_err(read_dir_error)? {
            let entry = entry.map_err(read_dir_error)?;
            // `file_type` does not follow links (and needs no stat where the
            // filesystem reports types in the directory, as most do).
            let file_type = entry
                .file_type()
                .map_err(|source| ManifestError::Metadata {
                    path: entry.path(),
                    source,
                })?;
            if file_type.is_dir() {
                self.pending_jobs.fetch_add(1, Ordering::Relaxed);
                local.push(Job::Dir(rel_dir.join(entry.file_name())));
            } else if file_type.is_file() || file_type.is_symlink() {
                names.push((entry.file_name(), file_type.is_symlink()));
                if names.len() == STAT_CHUNK {
                    let chunk = std::mem::take(&mut names);
                    if local.len() < self.stat_backlog_max {
                        // SYNC POINT: counted before pushed, as a directory is.
                        self.pending_jobs.fetch_add(1, Ordering::Relaxed);
                        local.push(Job::Stat {
                            rel_dir: Arc::clone(&rel_dir),
                            names: chunk,
                        });
                    } else {
                        // The others do not keep up (stats are slower than
                        // reading names): stat here rather than hold every
                        // name of a huge directory in memory at once.
                        self.stat_names(&rel_dir, chunk, found)?;
                    }
                    if self.stop.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                }
            } else {
                tracing::debug!(path = %entry.path().display(), "skipping a socket, FIFO or device");
                if self.skipped_special.fetch_add(1, Ordering::Relaxed) == 0 {
                    *self.first_special.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(entry.path());
                }
            }
        }
        self.stat_names(&rel_dir, names, found)
    }

    /// Stats the files and links `names` of `rel_dir` into `found`: a file
    /// with its size; a link followed once, to learn whether it names a file.
    fn stat_names(
        &self,
        rel_dir: &Path,
        names: Vec<(OsString, bool)>,
        found: &mut Listing,
    ) -> Result<(), ManifestError> {
        let abs_dir = self.root.join(rel_dir);
        let mut files = 0u64;
        for (name, is_link) in names {
            let path = abs_dir.join(&name);
            let metadata_error = |source| ManifestError::Metadata {
                path: path.clone(),
                source,
            };
            let size_bytes = if is_link {
                let target = fs::metadata(&path).map_err(metadata_error)?;
                let mut file_size = target.is_file().then_some(target.len());
                if file_size.is_some()
                    && !self.follow_outside
                    && super::check::is_outside(&self.canonical_root, &path)
                {
                    // Left out, as a link to a non-file is (the cache's
                    // check knows it by its target being outside).
                    tracing::debug!(path = %path.display(), "skipping a link to a file outside the source");
                    self.outside_links
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(rel_dir.join(&name));
                    file_size = None;
                }
                found.links.push(LinkStamp {
                    rel_path: rel_dir.join(&name),
                    file_size,
                });
                let Some(size) = file_size else {
                    tracing::debug!(path = %path.display(), "skipping a link that is not to a regular file");
                    continue;
                };
                size
            } else {
                fs::symlink_metadata(&path).map_err(metadata_error)?.len()
            };
            // Joined in place: no path is allocated per file.
            found
                .files
                .push_joined(rel_dir.as_os_str().as_bytes(), name.as_bytes(), size_bytes);
            files += 1;
        }
        self.count_found(files)
    }

    /// Adds `n` files to the count of files found; fails past `MAX_FILES`.
    fn count_found(&self, n: u64) -> Result<(), ManifestError> {
        let found = self.files_found.fetch_add(n, Ordering::Relaxed) + n;
        if found > MAX_FILES {
            return Err(ManifestError::TooManyFiles {
                path: self.root.to_path_buf(),
                max: MAX_FILES,
            });
        }
        Ok(())
    }

    /// Records the first error and stops every thread.
    fn fail(&self, err: ManifestError) {
        let mut first = self
            .first_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        first.get_or_insert(err);
        self.stop.store(true, Ordering::Relaxed);
    }

    fn take_error(&self) -> Option<ManifestError> {
        self.first_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }
}

/// Spin, then yield, then sleep while peers may still publish directories.
fn idle_backoff(idle_rounds: u32) {
    if idle_rounds <= IDLE_SPIN_ROUNDS {
        std::hint::spin_loop();
    } else if idle_rounds <= IDLE_YIELD_ROUNDS {
        thread::yield_now();
    } else {
        thread::sleep(Duration::from_micros(IDLE_SLEEP_US));
    }
}
