//! `ringfeed pack`: a tree of files or objects into WebDataset tar shards,
//! each with its sidecar index (TAR-INDEX.md, docs/pack.md).
//!
//! 1. List the source (local walk or remote listing, as `serve` does) and
//!    plan everything ([`plan::PackPlan`]): samples, order, shard sizes.
//! 2. Write the plan to `DEST/.ringfeed-pack.plan` first, or, when one is
//!    there, go on from it if it is this input's, refuse if not.
//! 3. For each shard not already written and verified (its size and its
//!    index as planned: the index is written only after its shard is whole),
//!    read its objects, many reads in flight, and write the shard and then
//!    its index.
//!
//! Deterministic: the plan and the headers depend on the listing only, so
//! the same input gives byte-identical shards, interrupted or not.

mod dest;
pub mod header;
pub mod labels;
pub mod plan;
mod read;

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::manifest::{FileList, ManifestOptions};
use crate::remote::{RemoteRuntime, StoreHandle};
use crate::source::{OpenedSource, SourceSpec, VersionTag};
use crate::tar::index::SIDECAR_SUFFIX;
use crate::tar::TarIndex;

use dest::ShardWriter;
pub use dest::{Dest, PARTS_IN_FLIGHT, PART_BYTES};
pub use labels::PackLabels;
pub use plan::{shard_name, PackPlan, PLAN_FILE};
pub use read::STREAM_OBJECT_BYTES;
use read::{Expected, Input, Pending};

/// Default `--shard-size` (256 MiB).
pub const DEFAULT_SHARD_BYTES: u64 = 256 << 20;

/// Most object reads in flight.
pub const READS_IN_FLIGHT_MAX: usize = 128;

/// Most bytes of objects read ahead of the writer.
pub const READ_AHEAD_BYTES_MAX: u64 = 256 << 20;

/// Seconds between progress lines.
pub const PROGRESS_INTERVAL_S: u64 = 3;

/// Mode of local shards and indexes when every input file is readable by
/// every user.
const PUBLIC_SHARD_MODE: u32 = 0o644;

/// Mode of local shards and indexes when some input file is not.
const PRIVATE_SHARD_MODE: u32 = 0o600;

/// Threads of the runtime that reads and uploads.
const RUNTIME_THREADS: usize = 8;

/// Test hook: milliseconds to sleep after each member, so a test can kill
/// `pack` in the middle of a shard. Unset in real use.
const MEMBER_DELAY_ENV: &str = "RINGFEED_PACK_TEST_MEMBER_DELAY_MS";

/// What `ringfeed pack` is asked.
#[derive(Clone, Debug)]
pub struct PackConfig {
    /// `--source`: a local directory or a remote prefix.
    pub source: String,
    /// `--dest`: a local directory or a remote prefix.
    pub dest: String,
    /// `--shard-size` in bytes.
    pub shard_size: u64,
    /// Log progress lines.
    pub progress: bool,
    /// A local source: list links to files outside it too.
    pub follow_links_outside: bool,
    /// `--labels`: an ImageFolder tree's class index as each sample's
    /// `.cls` member, and the class names in the indexes.
    pub labels: PackLabels,
}

/// What a run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackReport {
    /// Shards in the plan.
    pub shards: usize,
    /// Shards written by this run.
    pub written: usize,
    /// Shards found written and verified, kept.
    pub kept: usize,
    /// Files packed (all shards).
    pub files: u64,
    /// Bytes of the shards (all shards).
    pub shard_bytes: u64,
}

/// Packs `cfg.source` into `cfg.dest` (see the module docs).
pub fn pack(cfg: &PackConfig) -> Result<PackReport> {
    if cfg.shard_size < 4096 {
        bail!(
            "--shard-size {} is below 4096 bytes; pass a size such as 256MiB",
            cfg.shard_size
        );
    }
    let spec = SourceSpec::parse(&cfg.source, None).map_err(anyhow::Error::msg)?;
    let opened = spec.open()?.follow_links_outside(cfg.follow_links_outside);
    let listing = opened.source().list(&ManifestOptions {
        record_bytes: None,
        threads: 0,
        progress: cfg.progress,
    })?;
    let files = listing.objects;
    let mut shard_mode = PUBLIC_SHARD_MODE;
    let (input, runtime, expected) = match &opened {
        OpenedSource::Local(local) => {
            let runtime = Arc::new(RemoteRuntime::new(RUNTIME_THREADS)?);
            let (mtimes, mode) = local_mtimes(local.root(), &files)?;
            shard_mode = mode;
            if mode == PRIVATE_SHARD_MODE {
                tracing::info!("pack: some input files are not readable by every user: shards are written {mode:04o}");
            }
            let expected = Expected {
                mtimes,
                etags: Vec::new(),
            };
            (Input::Local(local.root().to_path_buf()), runtime, expected)
        }
        OpenedSource::Remote(remote) => {
            let etags = listing
                .versions
                .as_deref()
                .map(|v| {
                    v.iter()
                        .map(|tag| match tag {
                            VersionTag::ETag(etag) => Some(etag.to_string()),
                            VersionTag::Local { .. } => None,
                        })
                        .collect()
                })
                .unwrap_or_default();
            let expected = Expected {
                mtimes: Vec::new(),
                etags,
            };
            (
                Input::Remote(remote.store().clone()),
                Arc::clone(remote.runtime()),
                expected,
            )
        }
    };
    let versions = version_words(&expected);
    let plan = PackPlan::new(&cfg.source, &files, &versions, cfg.shard_size, cfg.labels)?;
    tracing::info!("pack: labels: {}", plan.labels_said);
    let dest = open_dest(&cfg.dest, &input, shard_mode)?;
    runtime.block_on(run(cfg, &plan, &files, &input, &expected, &dest))
}

/// A local DEST (created) or a remote one; refuses a DEST inside a local
/// source (its shards would be packed by the next run), before it creates
/// anything. `shard_mode`: the mode of local shards.
fn open_dest(dest: &str, input: &Input, shard_mode: u32) -> Result<Dest> {
    let spec =
        SourceSpec::parse(dest, None).map_err(|e| anyhow::anyhow!("--dest {dest:?}: {e}"))?;
    if let Some(dir) = spec.local_path() {
        let inside = |dir: &Path| -> Result<()> {
            if let Input::Local(root) = input {
                let root = root.canonicalize().unwrap_or_else(|_| root.clone());
                if dir.starts_with(&root) {
                    bail!("--dest {} is inside --source {}: the shards would become input of the next run; pick a DEST outside it", dir.display(), root.display());
                }
            }
            Ok(())
        };
        // Checked on the path as it will resolve, before anything is made:
        // `SRC/../SRC/x` must not create `x` inside SRC to refuse it.
        if let Ok(resolved) = resolve_to_be(dir) {
            inside(&resolved)?;
        }
        std::fs::create_dir_all(dir).with_context(|| {
            format!(
                "cannot create --dest {} (check the path and its permissions)",
                dir.display()
            )
        })?;
        let dir = dir
            .canonicalize()
            .with_context(|| format!("cannot resolve --dest {}", dir.display()))?;
        inside(&dir)?;
        let local = dest::LocalDest::open(&dir, shard_mode)?;
        dest::remove_stale_tmp(&local);
        return Ok(Dest::Local(local));
    }
    if let Input::Remote(store) = input {
        let prefix = format!("{}/", store.display.trim_end_matches('/'));
        if format!("{}/", dest.trim_end_matches('/')).starts_with(&prefix) {
            bail!("--dest {dest} is inside --source {}: the shards would become input of the next run; pick a DEST outside it", store.display);
        }
    }
    Ok(Dest::Remote(StoreHandle::open(dest)?))
}

/// The canonical path `path` will have once its missing part is created:
/// its longest existing ancestor resolved (links and all), then the rest,
/// whose `..` and `.` are taken lexically (nothing there is a link yet).
fn resolve_to_be(path: &Path) -> std::io::Result<std::path::PathBuf> {
    let abs = std::path::absolute(path)?;
    let mut existing = abs.as_path();
    let mut rest = Vec::new();
    let mut resolved = loop {
        match existing.canonicalize() {
            Ok(p) => break p,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
                    return Err(e);
                };
                rest.push(name.to_os_string());
                existing = parent;
            }
            Err(e) => return Err(e),
        }
    };
    for name in rest.into_iter().rev() {
        match name.to_str() {
            Some("..") => {
                resolved.pop();
            }
            Some(".") => {}
            _ => resolved.push(name),
        }
    }
    Ok(resolved)
}

/// Each local file's mtime word ([`read::mtime_word`]): a file changed in
/// place (same size) changes the input's digest. And the mode of the
/// shards: 0644 when every file (and the root) may be read by every user,
/// else 0600, so that no shard shows bytes their owner kept to themselves.
fn local_mtimes(root: &Path, files: &FileList) -> Result<(Vec<u64>, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let readable = |meta: &std::fs::Metadata| meta.permissions().mode() & 0o004 != 0;
    let mut public = std::fs::metadata(root).is_ok_and(|m| m.permissions().mode() & 0o005 == 0o005);
    let mtimes = files
        .iter()
        .map(|f| {
            let path = root.join(f.rel_path);
            let meta = std::fs::metadata(&path).with_context(|| {
                format!(
                    "cannot stat {} (it was listed a moment ago)",
                    path.display()
                )
            })?;
            public &= readable(&meta);
            Ok(read::mtime_word(&meta))
        })
        .collect::<Result<Vec<u64>>>()?;
    Ok((
        mtimes,
        if public {
            PUBLIC_SHARD_MODE
        } else {
            PRIVATE_SHARD_MODE
        },
    ))
}

/// One word per object for the input's digest: its mtime word, or a digest
/// of its ETag (0 where the listing gave none).
fn version_words(expected: &Expected) -> Vec<u64> {
    if !expected.mtimes.is_empty() {
        return expected.mtimes.clone();
    }
    expected
        .etags
        .iter()
        .map(|etag| {
            etag.as_deref().map_or(0, |e| {
                crate::manifest::digest_words(0, e.bytes().map(u64::from))
            })
        })
        .collect()
}

async fn run(
    cfg: &PackConfig,
    plan: &PackPlan,
    files: &FileList,
    input: &Input,
    expected: &Expected,
    dest: &Dest,
) -> Result<PackReport> {
    let text = plan.to_text(&cfg.source);
    match dest.read(PLAN_FILE).await? {
        Some(found) => {
            if let Some(why) = plan.mismatch(&found, &dest.display()) {
                bail!("{why}");
            }
            tracing::info!(
                "pack: {} holds the plan of this input: going on from it",
                dest.display()
            );
        }
        None => {
            check_finished_pack(plan, files, dest).await?;
            dest.put_small(PLAN_FILE, text.into_bytes()).await?;
        }
    }
    let mut report = PackReport {
        shards: plan.shards.len(),
        files: plan.input_objects,
        shard_bytes: plan.shards.iter().map(|s| s.bytes).sum(),
        ..PackReport::default()
    };
    let mut todo = Vec::new();
    for s in 0..plan.shards.len() {
        if verified(plan, files, dest, s).await? {
            report.kept += 1;
        } else {
            todo.push(s);
        }
    }
    if report.kept > 0 {
        tracing::info!(
            "pack: {} of {} shards already written and verified: kept",
            report.kept,
            report.shards
        );
    }
    let mut progress = Progress::new(cfg.progress, plan, &todo);
    write_shards(plan, files, input, expected, dest, &todo, &mut progress).await?;
    report.written = todo.len();
    if !todo.is_empty() {
        progress.line(true);
    }
    // Done: DEST holds shards and their indexes only, so that `serve`
    // takes it as a tar listing. A rerun tells a finished pack by its shards.
    dest.remove(PLAN_FILE).await?;
    Ok(report)
}

/// Without a plan file DEST is new, or holds a finished pack (whose plan was
/// removed at its end): refuses shards that are not exactly this plan's.
async fn check_finished_pack(plan: &PackPlan, files: &FileList, dest: &Dest) -> Result<()> {
    let mut found = dest.shard_names().await?;
    if found.is_empty() {
        return Ok(());
    }
    found.sort();
    let planned: Vec<String> = (0..plan.shards.len()).map(shard_name).collect();
    // Shards that are there must be this plan's; missing ones (deleted
    // because they were damaged) are written again.
    let mut other = found.iter().find(|n| !planned.contains(n)).cloned();
    if other.is_none() {
        for (s, name) in planned.iter().enumerate() {
            if found.binary_search(name).is_ok() && !verified(plan, files, dest, s).await? {
                other = Some(name.clone());
                break;
            }
        }
    }
    if let Some(name) = other {
        bail!(
            "{} already holds {} shards, and they are not this input's ({name} differs: another input, another --shard-size, or a damaged shard or index); pack into an empty DEST, or delete the shards that differ (and their .tar.idx) to have them written again",
            dest.display(),
            found.len()
        );
    }
    Ok(())
}

/// Whether shard `s` is in DEST as planned: its size, and an index that
/// parses and lists exactly the planned members (an index is written only
/// once its shard is whole).
async fn verified(plan: &PackPlan, files: &FileList, dest: &Dest, s: usize) -> Result<bool> {
    let name = shard_name(s);
    if dest.size_of(&name).await? != Some(plan.shards[s].bytes) {
        return Ok(false);
    }
    let Some(bytes) = dest.read(&format!("{name}{SIDECAR_SUFFIX}")).await? else {
        return Ok(false);
    };
    Ok(TarIndex::parse(&bytes).is_ok_and(|index| index == plan.shard_index(files, s)))
}

async fn write_shards(
    plan: &PackPlan,
    files: &FileList,
    input: &Input,
    expected: &Expected,
    dest: &Dest,
    todo: &[usize],
    progress: &mut Progress,
) -> Result<()> {
    let mut reads = Reads {
        input,
        expected,
        delay_ms: std::env::var(MEMBER_DELAY_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        // Every object of the shards to write, in order (label members
        // are not read).
        order: todo
            .iter()
            .flat_map(|&s| {
                let shard = &plan.shards[s];
                plan.members[shard.first_member..shard.first_member + shard.members]
                    .iter()
                    .copied()
                    .filter(|&m| plan.label_member(files, m).is_none())
            })
            .collect(),
        next: 0,
        in_flight: VecDeque::new(),
        ahead_bytes: 0,
    };
    for &s in todo {
        let name = shard_name(s);
        let mut writer = dest.start_shard(&name).await?;
        let written = write_shard(plan, files, s, &mut writer, &mut reads, progress).await;
        match written {
            Ok(()) => writer.finish(dest).await?,
            Err(e) => {
                writer.abandon(dest).await;
                return Err(e.context(format!("packing {} into {}", name, dest.display())));
            }
        }
        let mut index = Vec::new();
        plan.shard_index(files, s)
            .write(&mut index)
            .context("cannot build the index")?;
        dest.put_small(&format!("{name}{SIDECAR_SUFFIX}"), index)
            .await?;
        progress.shard_done();
    }
    Ok(())
}

/// Reads running ahead of the writer: up to READS_IN_FLIGHT_MAX objects or
/// READ_AHEAD_BYTES_MAX bytes (at least one).
struct Reads<'a> {
    input: &'a Input,
    expected: &'a Expected,
    delay_ms: u64,
    order: Vec<usize>,
    next: usize,
    in_flight: VecDeque<(usize, Pending)>,
    ahead_bytes: u64,
}

/// Writes the members of shard `s` and the end-of-archive blocks.
async fn write_shard(
    plan: &PackPlan,
    files: &FileList,
    s: usize,
    writer: &mut ShardWriter,
    reads: &mut Reads<'_>,
    progress: &mut Progress,
) -> Result<()> {
    let zeros = [0u8; plan::END_OF_ARCHIVE_BYTES as usize];
    let shard = &plan.shards[s];
    let mut written = 0u64;
    for &m in &plan.members[shard.first_member..shard.first_member + shard.members] {
        if let Some((name, data)) = plan.label_member(files, m) {
            let head = header::member_header(&name, data.len() as u64);
            let pad = header::padding(data.len() as u64);
            writer.write(&head).await?;
            writer.write(&data).await?;
            writer.write(&zeros[..pad as usize]).await?;
            written += head.len() as u64 + data.len() as u64 + pad;
            continue;
        }
        while reads.next < reads.order.len()
            && (reads.in_flight.is_empty()
                || (reads.in_flight.len() < READS_IN_FLIGHT_MAX
                    && reads.ahead_bytes < READ_AHEAD_BYTES_MAX))
        {
            let i = reads.order[reads.next];
            let size = files.size_bytes(i);
            let pending = reads
                .input
                .start(i, files.path_bytes(i), size, reads.expected);
            if matches!(pending, Pending::Whole(_)) {
                reads.ahead_bytes += size;
            }
            reads.in_flight.push_back((i, pending));
            reads.next += 1;
        }
        let Some((i, pending)) = reads.in_flight.pop_front() else {
            bail!("internal: no read for a member of {}", shard_name(s));
        };
        if i != m {
            bail!(
                "internal: the read of object {i} came for member {m} of {}",
                shard_name(s)
            );
        }
        let (key, size) = (files.path_bytes(i), files.size_bytes(i));
        let head = header::member_header(key, size);
        match pending {
            Pending::Whole(read) => {
                let data = read
                    .await
                    .map_err(|e| anyhow::anyhow!("a read task failed: {e}"))??;
                reads.ahead_bytes -= size;
                read::check_size(&String::from_utf8_lossy(key), size, data.len() as u64)?;
                writer.write(&head).await?;
                writer.write(&data).await?;
            }
            Pending::Stream => {
                writer.write(&head).await?;
                reads
                    .input
                    .stream_into(i, key, size, reads.expected, writer)
                    .await?;
            }
        }
        let pad = header::padding(size);
        writer.write(&zeros[..pad as usize]).await?;
        written += head.len() as u64 + size + pad;
        progress.member(size);
        if reads.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(reads.delay_ms)).await;
        }
    }
    writer.write(&zeros).await?;
    written += zeros.len() as u64;
    if written != shard.bytes {
        bail!(
            "internal: {} came to {written} bytes, planned {}",
            shard_name(s),
            shard.bytes
        );
    }
    Ok(())
}

/// The progress line, every PROGRESS_INTERVAL_S seconds.
struct Progress {
    on: bool,
    started: Instant,
    last: Instant,
    files: u64,
    bytes: u64,
    shards: usize,
    files_total: u64,
    shards_total: usize,
}

impl Progress {
    fn new(on: bool, plan: &PackPlan, todo: &[usize]) -> Progress {
        let now = Instant::now();
        Progress {
            on,
            started: now,
            last: now,
            files: 0,
            bytes: 0,
            shards: 0,
            files_total: todo.iter().map(|&s| plan.shard_files(s) as u64).sum(),
            shards_total: todo.len(),
        }
    }

    fn member(&mut self, size: u64) {
        self.files += 1;
        self.bytes += size;
        self.line(false);
    }

    fn shard_done(&mut self) {
        self.shards += 1;
    }

    fn line(&mut self, last: bool) {
        if !self.on || (!last && self.last.elapsed() < Duration::from_secs(PROGRESS_INTERVAL_S)) {
            return;
        }
        self.last = Instant::now();
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        tracing::info!(
            "pack: {}/{} files, {:.1} MB, {}/{} shards written, {:.1} MB/s, {:.0} files/s{}",
            self.files,
            self.files_total,
            self.bytes as f64 / 1e6,
            self.shards,
            self.shards_total,
            self.bytes as f64 / 1e6 / secs,
            self.files as f64 / secs,
            if last { " (done)" } else { "" }
        );
    }
}
