//! Who does what with a job's published manifest (see `super`):
//!
//! - **Node 0** (`Role::Publisher`): a head of this job already there (node 0
//!   restarted) is the job's manifest, read as the others read it. Else the
//!   source's latest head, if its listing is younger than
//!   `--manifest-max-age`, is taken (no listing; listed again in the
//!   background, as a cached listing is). Else it lists (through the local
//!   manifest cache), uploads the manifest, writes
//!   the job's head create-only (another node 0 that won the race is
//!   followed), then the latest head.
//! - **Other nodes** (`Role::Reader`): look at the job's head (or, with no job
//!   id, at the latest head younger than `--manifest-max-age`) every 0.2 to
//!   2 s, up to `--job-manifest-wait`, and read the manifest it names in one
//!   GET. A manifest refused by its hash (or size, or format) stops the start:
//!   listing here could give this node another dataset than its peers. With
//!   the place left to auto, a node that waited in vain lists itself, with a
//!   warning; with a place given, it fails.
//!
//! Nothing read is used before it is checked: a head by its CRC-32 and its
//! fields (`head.rs`), a manifest by its size and the SHA-256 its head names,
//! then by the manifest format's own checks (its CRC-32, counts, keys).

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use super::board::{Board, Created};
use super::head::{hex, manifest_name, unix_secs, Head, HEAD_BYTES_MAX, MANIFEST_BYTES_MAX};
use super::{Place, PublishedError, Publishing, POLL_FIRST, POLL_MAX};
use crate::manifest::format;
use crate::manifest::{FileList, Manifest, ManifestOptions, ManifestOrigin, ObjectNames};
use crate::source::remote::{files_and_etags, human_duration, RemoteSource};
use crate::source::{build_manifest, build_manifest_cached, ManifestCache, Source, Validity};

/// A loader's part in its job's listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Node 0 (`--node-rank 0`): lists and publishes.
    Publisher,
    /// Any other node: waits for node 0's manifest and reads it.
    Reader,
}

/// What `obtain` gives the loader.
pub struct Obtained {
    /// The manifest to serve.
    pub manifest: Manifest,
    /// Where node 0's own listing came from (the local manifest cache), when
    /// it listed or used that cache; None when the manifest was read from
    /// the board.
    pub origin: Option<ManifestOrigin>,
    /// The published manifest the run uses, if any.
    pub published: Option<Arc<Published>>,
    /// How the manifest line says where it came from, when the board
    /// decided it (None: the local origin's words).
    pub words: Option<String>,
}

/// A published manifest a run uses: where it is, and which heads name it,
/// so that a run that proves it stale withdraws them.
pub struct Published {
    board: Arc<Board>,
    source_shown: String,
    identity: Vec<u8>,
    sha256: [u8; 32],
    bytes: u64,
    /// Heads to remove when the listing is proved stale.
    heads: Vec<String>,
    /// Node 0 took a published listing it did not make: it lists again in
    /// the background.
    pub relist: bool,
    /// Node 0's latest head names this manifest (refreshed after a re-list
    /// finds the prefix unchanged).
    latest: Option<String>,
}

impl std::fmt::Debug for Published {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Published({})", self.describe())
    }
}

impl Published {
    /// The manifest's place, for messages.
    pub fn describe(&self) -> String {
        self.board.describe(&manifest_name(&self.sha256))
    }

    /// Removes the heads that name this manifest (a run proved it stale):
    /// the next start lists the prefix again. Returns what it did, for the log.
    pub fn withdraw(&self) -> String {
        let mut failed = Vec::new();
        for name in &self.heads {
            if let Err(e) = self.board.delete(name) {
                failed.push(e.to_string());
            }
        }
        if failed.is_empty() {
            format!(
                "its published head(s) {} are withdrawn",
                self.heads
                    .iter()
                    .map(|h| self.board.describe(h))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            format!(
                "its published heads cannot all be withdrawn ({}): remove them",
                failed.join("; ")
            )
        }
    }

    /// After a background re-list found the prefix unchanged: the latest
    /// head, if it still names this manifest, is written again with the new
    /// listing time, so that the next job takes it as young.
    pub fn refresh(&self, listed_at: SystemTime) {
        let Some(name) = &self.latest else { return };
        let current = read_head(&self.board, name, &self.identity);
        if !matches!(&current, Ok(Some(h)) if h.sha256 == self.sha256) {
            return;
        }
        let head = Head {
            source: self.identity.clone(),
            sha256: self.sha256,
            bytes: self.bytes,
            listed_at,
            published_at: SystemTime::now(),
            job: None,
        };
        if let Err(e) = self.board.put(name, head.encode(), false) {
            tracing::warn!(
                "{} is unchanged, but its published head cannot be refreshed ({e})",
                self.source_shown
            );
        }
    }
}

/// The name of the head of a source (identity `identity`), or of one job
/// over it: short digests of both, the head itself holds them whole.
pub fn head_name(identity: &[u8], job: Option<&str>) -> String {
    let short = |bytes: &[u8]| hex(&Sha256::digest(bytes)[..8]);
    match job {
        None => format!("head-{}.txt", short(identity)),
        Some(job) => format!("head-{}-job-{}.txt", short(identity), short(job.as_bytes())),
    }
}

/// The manifest of `remote` for this node of the job (see the module docs).
pub fn obtain(
    remote: &Arc<RemoteSource>,
    opts: &ManifestOptions,
    cache: Option<&ManifestCache>,
    p: &Publishing,
) -> Result<Obtained, PublishedError> {
    let ctx = Ctx::open(remote, p)?;
    match p.role {
        Role::Publisher => publisher(&ctx, opts, cache, p),
        Role::Reader => reader(&ctx, opts, cache, p),
    }
}

/// `ringfeed manifest build`: lists `remote` now and publishes its manifest
/// as the source's latest (and, with a job id, as that job's); returns the
/// published manifest and the number of objects.
pub fn build_and_publish(
    remote: &Arc<RemoteSource>,
    cache: Option<&ManifestCache>,
    p: &Publishing,
) -> Result<(Arc<Published>, usize), PublishedError> {
    let ctx = Ctx::open(remote, p)?;
    let opts = ManifestOptions {
        record_bytes: None,
        threads: 0,
        progress: true,
    };
    let listed = ctx.list(&opts, cache, true)?;
    let objects = listed.files.len();
    let published = ctx.publish(&listed, p, true)?;
    Ok((Arc::new(published.0), objects))
}

/// What every step needs.
struct Ctx<'a> {
    remote: &'a Arc<RemoteSource>,
    board: Arc<Board>,
    identity: Vec<u8>,
    shown: String,
    latest: String,
    job: Option<String>,
}

/// A listing made (or taken from the local cache) by this node.
struct Listed {
    manifest: Manifest,
    origin: Option<ManifestOrigin>,
    files: FileList,
    etags: Vec<u8>,
    listed_at: SystemTime,
}

impl<'a> Ctx<'a> {
    fn open(remote: &'a Arc<RemoteSource>, p: &Publishing) -> Result<Ctx<'a>, PublishedError> {
        let shown = remote.store().display.clone();
        let identity = remote
            .cache_identity()
            .map_err(PublishedError::NotShareable)?;
        let board_err = |error| {
            PublishedError::Board {
            source_shown: shown.clone(),
            error,
            fix: "give --job-manifest a place every node can read (and node 0 write), or pass --job-manifest off",
        }
        };
        let board = match &p.place {
            Place::Beside => Board::in_store(
                remote.store(),
                Some(super::BOARD_SEGMENT),
                Arc::clone(remote.runtime()),
            ),
            Place::Url(url) => {
                let store = crate::remote::StoreHandle::open(url).map_err(|e| {
                    board_err(super::BoardError {
                        at: crate::remote::redact_url(url),
                        detail: e.to_string(),
                    })
                })?;
                Board::in_store(&store, None, Arc::clone(remote.runtime()))
            }
            Place::Dir(dir) => Board::in_dir(dir.clone()).map_err(board_err)?,
        };
        Ok(Ctx {
            board: Arc::new(board),
            latest: head_name(&identity, None),
            job: p.job.clone(),
            remote,
            identity,
            shown,
        })
    }

    fn board_error(&self, error: super::BoardError) -> PublishedError {
        PublishedError::Board {
            source_shown: self.shown.clone(),
            error,
            fix: "check that every node can read there and node 0 can write (credentials, permissions), or pass --job-manifest off",
        }
    }

    fn refused(&self, at: String, why: String, fix: &str) -> PublishedError {
        PublishedError::Refused {
            source_shown: self.shown.clone(),
            at,
            why,
            fix: fix.to_string(),
        }
    }

    fn job_head(&self) -> Option<String> {
        self.job
            .as_deref()
            .map(|j| head_name(&self.identity, Some(j)))
    }

    /// Lists the prefix (through the local cache unless `fresh`).
    fn list(
        &self,
        opts: &ManifestOptions,
        cache: Option<&ManifestCache>,
        fresh: bool,
    ) -> Result<Listed, PublishedError> {
        let began = SystemTime::now();
        let source: &dyn Source = self.remote.as_ref();
        let (manifest, origin) = match cache {
            Some(cache) => {
                let (m, origin) = build_manifest_cached(source, opts, cache, fresh)?;
                (m, Some(origin))
            }
            None => (build_manifest(source, opts)?, None),
        };
        let objects = self.remote.listed_objects().unwrap_or_default();
        let (files, etags) = files_and_etags(&objects);
        let listed_at = self.remote.cached_listed_at().unwrap_or(began);
        Ok(Listed {
            manifest,
            origin,
            files,
            etags,
            listed_at,
        })
    }

    /// Uploads `listed`'s manifest unless it is there, then writes the job's
    /// head (create-only) and the latest head. Returns the published
    /// manifest, and the job head another node 0 wrote first, if one did.
    fn publish(
        &self,
        listed: &Listed,
        p: &Publishing,
        write_latest: bool,
    ) -> Result<(Published, Option<Head>), PublishedError> {
        let mut blob = Vec::new();
        format::encode_remote_to(
            &mut blob,
            &self.identity,
            UNIX_EPOCH,
            &listed.files,
            &listed.etags,
        )
        .map_err(|e| {
            self.board_error(super::BoardError {
                at: self.board.describe(""),
                detail: format!("cannot encode the manifest: {e}"),
            })
        })?;
        let sha256: [u8; 32] = Sha256::digest(&blob).into();
        let bytes = blob.len() as u64;
        // Written even when one of that name is there: it may have been
        // changed since (a reader would refuse it by its hash).
        let name = manifest_name(&sha256);
        self.board
            .put(&name, blob, false)
            .map_err(|e| self.board_error(e))?;
        let head = |job: Option<&str>| Head {
            source: self.identity.clone(),
            sha256,
            bytes,
            listed_at: listed.listed_at,
            published_at: SystemTime::now(),
            job: job.map(|j| j.as_bytes().to_vec()),
        };
        let mut heads = Vec::new();
        let mut winner = None;
        if let (Some(job), Some(job_head)) = (p.job.as_deref(), self.job_head()) {
            match self.board.put(&job_head, head(Some(job)).encode(), true) {
                Ok(Created::Written) => {}
                Ok(Created::Exists) => {
                    winner = read_head(&self.board, &job_head, &self.identity).map_err(|why| {
                        self.refused(
                            self.board.describe(&job_head),
                            why,
                            "remove it and start the job again",
                        )
                    })?;
                }
                Err(e) => return Err(self.board_error(e)),
            }
            heads.push(job_head);
        }
        if write_latest && winner.is_none() {
            self.board
                .put(&self.latest, head(None).encode(), false)
                .map_err(|e| self.board_error(e))?;
            heads.push(self.latest.clone());
        }
        Ok((
            Published {
                board: self.board_clone(),
                source_shown: self.shown.clone(),
                identity: self.identity.clone(),
                sha256,
                bytes,
                latest: write_latest.then(|| self.latest.clone()),
                heads,
                relist: false,
            },
            winner,
        ))
    }

    fn board_clone(&self) -> Arc<Board> {
        Arc::clone(&self.board)
    }

    /// The manifest `head` names, checked (see the module docs), as the
    /// objects and ETags it lists.
    fn fetch(&self, head: &Head) -> Result<(FileList, Vec<u8>), PublishedError> {
        let name = manifest_name(&head.sha256);
        let at = self.board.describe(&name);
        let fix = "remove the heads under the place and start the job again, so that node 0 lists afresh (or pass --job-manifest off)";
        let changed =
            "it was changed or replaced after it was published (tampered, or a stale copy)";
        let (reader, len) = self
            .board
            .open(&name, MANIFEST_BYTES_MAX)
            .map_err(|e| self.refused(at.clone(), e.detail, fix))?
            .ok_or_else(|| {
                self.refused(
                    at.clone(),
                    "it is missing, though a head names it".into(),
                    fix,
                )
            })?;
        if len != head.bytes {
            let why = format!(
                "it is {len} bytes, its head names a manifest of {} bytes and SHA-256 {}: {changed}",
                head.bytes,
                hex(&head.sha256)
            );
            return Err(self.refused(at, why, fix));
        }
        let mut hashing = Hashing {
            inner: reader,
            sha: Sha256::new(),
            read: 0,
        };
        let decoded = format::decode_from(&mut hashing, head.bytes, &self.identity);
        // Hash every byte, whatever the decoder made of them: a manifest
        // changed after it was published is refused by its hash first.
        let drained = std::io::copy(&mut (&mut hashing).take(head.bytes), &mut std::io::sink());
        if let Err(e) = drained {
            return Err(self.refused(at, format!("reading it failed: {e}"), fix));
        }
        let found: [u8; 32] = hashing.sha.finalize().into();
        if found != head.sha256 || hashing.read != head.bytes {
            return Err(self.refused(
                at,
                format!(
                    "its {} bytes hash to SHA-256 {}, its head names {}: {changed}",
                    hashing.read,
                    hex(&found),
                    hex(&head.sha256)
                ),
                fix,
            ));
        }
        let decoded = decoded.map_err(|why| self.refused(at.clone(), why, fix))?;
        let etags = decoded.etags.ok_or_else(|| {
            self.refused(at, "it lists a local directory, not a prefix".into(), fix)
        })?;
        Ok((decoded.files, etags))
    }

    /// A manifest of the files `head` names, for this node's flags.
    fn manifest_from(
        &self,
        head: &Head,
        opts: &ManifestOptions,
        listed_at: Option<SystemTime>,
    ) -> Result<Manifest, PublishedError> {
        let (files, etags) = self.fetch(head)?;
        self.remote.adopt(&files, &etags, listed_at);
        let names = Names(self.remote.as_ref());
        Ok(Manifest::from_objects(files, opts.record_bytes, &names)?)
    }

    fn published(&self, head: &Head, heads: Vec<String>, relist: bool) -> Published {
        Published {
            board: self.board_clone(),
            source_shown: self.shown.clone(),
            identity: self.identity.clone(),
            sha256: head.sha256,
            bytes: head.bytes,
            latest: relist.then(|| self.latest.clone()),
            heads,
            relist,
        }
    }

    fn words(&self, head: &Head, how: &str) -> String {
        let age = |t: SystemTime| {
            SystemTime::now()
                .duration_since(t)
                .map_or_else(|_| "0 s".to_string(), human_duration)
        };
        format!(
            "{how} {} (listed {} ago, published {} ago, sha256 {}…)",
            self.board.describe(&manifest_name(&head.sha256)),
            age(head.listed_at),
            age(head.published_at),
            &hex(&head.sha256)[..12]
        )
    }
}

fn publisher(
    ctx: &Ctx<'_>,
    opts: &ManifestOptions,
    cache: Option<&ManifestCache>,
    p: &Publishing,
) -> Result<Obtained, PublishedError> {
    // Node 0 restarted within its job: the job's head decides.
    if let Some(job_head) = ctx.job_head() {
        let head = read_head(&ctx.board, &job_head, &ctx.identity).map_err(|why| {
            ctx.refused(
                ctx.board.describe(&job_head),
                why,
                "remove it and start the job again",
            )
        })?;
        if let Some(head) = head {
            let manifest = ctx.manifest_from(&head, opts, None)?;
            return Ok(Obtained {
                manifest,
                origin: None,
                words: Some(ctx.words(&head, "published for this job (node 0 restarted):")),
                published: Some(Arc::new(ctx.published(&head, vec![job_head], false))),
            });
        }
    }
    if !p.refresh {
        if let Some(took) = take_latest(ctx, opts, cache, p)? {
            return Ok(took);
        }
    }
    let listed = ctx.list(opts, cache, p.refresh)?;
    let published = ctx.publish(&listed, p, true);
    let Listed {
        manifest, origin, ..
    } = listed;
    match published {
        Ok((published, None)) => {
            let words = format!(
                "published for the job's other nodes at {}",
                published.describe()
            );
            Ok(Obtained {
                manifest,
                origin,
                words: Some(words),
                published: Some(Arc::new(published)),
            })
        }
        Ok((_, Some(winner))) => {
            // Another node 0 of this job published first: its manifest is the job's.
            let manifest = ctx.manifest_from(&winner, opts, None)?;
            let job_head = ctx.job_head().into_iter().collect();
            Ok(Obtained {
                manifest,
                origin: None,
                words: Some(ctx.words(&winner, "published for this job by another node 0:")),
                published: Some(Arc::new(ctx.published(&winner, job_head, false))),
            })
        }
        Err(e) if !p.explicit => {
            tracing::warn!(
                "cannot publish the manifest of {} ({e}); the job's other nodes wait up to {} for it, then list {} themselves \
                 (give --job-manifest a place node 0 may write, or pass --job-manifest off)",
                ctx.shown,
                human_duration(p.wait),
                ctx.shown
            );
            Ok(Obtained {
                manifest,
                origin,
                words: None,
                published: None,
            })
        }
        Err(e) => Err(e),
    }
}

/// Node 0: the source's latest published listing, if it is young enough
/// and passes its checks (a refused one is said, and the prefix listed).
fn take_latest(
    ctx: &Ctx<'_>,
    opts: &ManifestOptions,
    cache: Option<&ManifestCache>,
    p: &Publishing,
) -> Result<Option<Obtained>, PublishedError> {
    let head = match read_head(&ctx.board, &ctx.latest, &ctx.identity) {
        Ok(Some(head)) => head,
        Ok(None) => return Ok(None),
        Err(why) => {
            tracing::info!(
                "the latest published head of {} is not used ({why}); listing",
                ctx.shown
            );
            return Ok(None);
        }
    };
    if let Err(why) = young(&head, p.max_age) {
        tracing::info!(
            "the latest published manifest of {} is not used: {why}; listing",
            ctx.shown
        );
        return Ok(None);
    }
    let (files, etags) = match ctx.fetch(&head) {
        Ok(got) => got,
        Err(PublishedError::Refused { at, why, .. }) => {
            tracing::warn!(
                "{at} is refused ({why}); making the manifest of {} again (listing it, or from this node's manifest cache) and publishing it afresh",
                ctx.shown
            );
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    ctx.remote.adopt(&files, &etags, Some(head.listed_at));
    // Kept in the local manifest cache too: the background re-list compares
    // with it and refreshes it, as for any cached listing.
    let origin = cache.and_then(|cache| {
        let validity = Validity::Remote {
            listed_at: head.listed_at,
            etags: etags.clone(),
        };
        match cache.store(
            ctx.remote.as_ref(),
            &ctx.identity,
            head.listed_at,
            &validity,
            &files,
        ) {
            Ok(None) => Some(ManifestOrigin::Cached {
                path: cache.entry_path_of(&ctx.identity),
                dirs_checked: 0,
                files_checked: 0,
            }),
            _ => None,
        }
    });
    let manifest = Manifest::from_objects(files, opts.record_bytes, &Names(ctx.remote.as_ref()))?;
    let mut heads = vec![ctx.latest.clone()];
    if let (Some(job), Some(job_head)) = (p.job.as_deref(), ctx.job_head()) {
        let ours = Head {
            job: Some(job.as_bytes().to_vec()),
            published_at: SystemTime::now(),
            ..head.clone()
        };
        match ctx.board.put(&job_head, ours.encode(), true) {
            Ok(Created::Written) => {}
            // A node 0 of this job that restarted meanwhile: rare, and its
            // head is read at the next start; this run's nodes read the job
            // head, so take it now.
            Ok(Created::Exists) => return publisher(ctx, opts, None, p).map(Some),
            Err(e) => return Err(ctx.board_error(e)),
        }
        heads.push(job_head);
    }
    Ok(Some(Obtained {
        manifest,
        origin,
        words: Some(ctx.words(&head, "from the published")),
        published: Some(Arc::new(ctx.published(&head, heads, true))),
    }))
}

fn reader(
    ctx: &Ctx<'_>,
    opts: &ManifestOptions,
    cache: Option<&ManifestCache>,
    p: &Publishing,
) -> Result<Obtained, PublishedError> {
    let name = ctx.job_head().unwrap_or_else(|| ctx.latest.clone());
    let started = Instant::now();
    let mut pause = POLL_FIRST;
    let mut said = Instant::now();
    let mut why_waiting;
    loop {
        match read_head(&ctx.board, &name, &ctx.identity) {
            Ok(Some(head)) => match acceptable(&head, p) {
                Ok(()) => {
                    let manifest = ctx.manifest_from(&head, opts, None)?;
                    let by = match &p.job {
                        Some(job) => format!("read from node 0's, for job {job}:"),
                        None => "read from node 0's".to_string(),
                    };
                    return Ok(Obtained {
                        manifest,
                        origin: None,
                        words: Some(ctx.words(&head, &by)),
                        published: Some(Arc::new(ctx.published(&head, vec![name], false))),
                    });
                }
                Err(why) => why_waiting = why,
            },
            Ok(None) => why_waiting = "no head yet".to_string(),
            // A damaged head may be one being replaced on a store without
            // atomic writes; a network failure may pass: wait on.
            Err(why) => why_waiting = why,
        }
        let waited = started.elapsed();
        if waited >= p.wait {
            return timed_out(ctx, opts, cache, p, &name, waited);
        }
        if said.elapsed() >= Duration::from_secs(10) {
            said = Instant::now();
            tracing::info!(
                "waiting for node 0 to publish the manifest of {} at {} ({} s so far, {why_waiting})",
                ctx.shown,
                ctx.board.describe(&name),
                waited.as_secs()
            );
        }
        std::thread::sleep(pause.min(p.wait.saturating_sub(waited)));
        pause = (pause * 3 / 2).min(POLL_MAX);
    }
}

fn timed_out(
    ctx: &Ctx<'_>,
    opts: &ManifestOptions,
    cache: Option<&ManifestCache>,
    p: &Publishing,
    name: &str,
    waited: Duration,
) -> Result<Obtained, PublishedError> {
    let job = p
        .job
        .as_ref()
        .map_or_else(String::new, |j| format!(" (job {j})"));
    if p.explicit {
        return Err(PublishedError::Timeout {
            source_shown: ctx.shown.clone(),
            at: ctx.board.describe(name),
            waited_s: waited.as_secs(),
            job,
        });
    }
    tracing::warn!(
        "node 0 did not publish the manifest of {} at {} within {} s{job}; listing it on this node \
         (is node 0's loader running, and may it write there? see its log)",
        ctx.shown,
        ctx.board.describe(name),
        waited.as_secs()
    );
    let listed = ctx.list(opts, cache, false)?;
    Ok(Obtained {
        manifest: listed.manifest,
        origin: listed.origin,
        words: None,
        published: None,
    })
}

/// Whether a reading node takes `head`: a job's head always (it is what
/// node 0 chose for the job); the latest, without a job id, while its
/// listing is younger than `--manifest-max-age`.
fn acceptable(head: &Head, p: &Publishing) -> Result<(), String> {
    if p.job.is_some() {
        return Ok(());
    }
    young(head, p.max_age)
}

fn young(head: &Head, max_age: Duration) -> Result<(), String> {
    let age = SystemTime::now()
        .duration_since(head.listed_at)
        .unwrap_or_default();
    if age > max_age {
        return Err(format!(
            "its listing is {} old, past --manifest-max-age {}",
            human_duration(age),
            human_duration(max_age)
        ));
    }
    Ok(())
}

/// The head `name`, if there is one, checked, and of this source.
fn read_head(board: &Board, name: &str, identity: &[u8]) -> Result<Option<Head>, String> {
    let Some(bytes) = board
        .get_small(name, HEAD_BYTES_MAX)
        .map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    let head = Head::parse(&bytes)?;
    if head.source != identity {
        return Err(format!(
            "it is the head of {}, not of this source",
            String::from_utf8_lossy(&head.source)
        ));
    }
    if unix_secs(head.listed_at) == 0 {
        return Err("it has no listing time".to_string());
    }
    Ok(Some(head))
}

/// A reader that hashes what goes through it.
struct Hashing<R: Read> {
    inner: R,
    sha: Sha256,
    read: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(out)?;
        self.sha.update(&out[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

/// A source seen as the names it gives.
struct Names<'a>(&'a RemoteSource);

impl ObjectNames for Names<'_> {
    fn source_name(&self) -> std::path::PathBuf {
        self.0.source_name()
    }

    fn object_name(&self, key: &[u8]) -> std::path::PathBuf {
        self.0.object_name(key)
    }
}
