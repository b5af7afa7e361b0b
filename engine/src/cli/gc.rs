//! `ringfeed gc`.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::ring::gc::{collect, GcOutcome};
use crate::ring::outcome::{OutcomeGc, OUTCOME_GC_GRACE};
use crate::ring::safe_file::{Dir, TrustError};
use crate::ring::segment::{human_bytes, SHM_DIR};
use crate::source::private_dir::open_existing_private_dir;
use crate::source::{is_stale_tmp, ManifestCache, NotACacheFile};

/// Removes segments of dead loaders, and cached manifests of directories
/// that are gone (in `cache_dir`, else the default cache directory), and
/// says what it did.
pub fn run(cache_dir: Option<PathBuf>) -> Result<()> {
    let segments = collect_segments();
    if let Some(dir) = ManifestCache::dir_under(cache_dir.as_deref()) {
        collect_manifests(&dir);
    }
    segments
}

fn collect_segments() -> Result<()> {
    let outcomes = collect().with_context(|| format!("cannot list {SHM_DIR}"))?;
    let mut removed = 0;
    let mut failed = 0;
    for o in &outcomes {
        match o {
            GcOutcome::Removed { name, bytes } => {
                removed += 1;
                println!(
                    "removed {SHM_DIR}/ringfeed-{name} ({}), its loader is dead",
                    human_bytes(*bytes)
                );
            }
            GcOutcome::Alive { name } => {
                println!("kept    {SHM_DIR}/ringfeed-{name}: its loader is running")
            }
            GcOutcome::OtherUsers { name, uid } => {
                let whose = crate::ring::segment::trust::user_name(*uid)
                    .map(|u| format!(", {u}'s"))
                    .unwrap_or_default();
                println!("skipped {SHM_DIR}/ringfeed-{name}: another user's (uid {uid}){whose}; left to them (`ringfeed gc` as that user), also when gc runs as root")
            }
            GcOutcome::NotASegment { name, kind } => {
                println!("skipped {SHM_DIR}/ringfeed-{name}: {kind}, not a ringfeed segment")
            }
            GcOutcome::Failed { name, error } => {
                failed += 1;
                eprintln!("error   {SHM_DIR}/ringfeed-{name}: {error}");
            }
        }
    }
    println!(
        "{removed} segment(s) removed, {} kept",
        outcomes.len() - removed - failed
    );
    // The last words of loaders that exited (ring::outcome), once no
    // segment of the name is left, no `ringfeed run` holds them, and a late
    // trainer has had its minute.
    match crate::ring::outcome::collect_stale() {
        Ok(gc) => say_outcomes(&gc),
        Err(e) => eprintln!("error   cannot list {SHM_DIR} for outcome files: {e}"),
    }
    if failed > 0 {
        anyhow::bail!(
            "{failed} segment(s) could not be inspected or removed (the errors above say why)"
        );
    }
    Ok(())
}

/// Says what `collect_stale` did with the outcome files.
fn say_outcomes(gc: &OutcomeGc) {
    if !gc.removed.is_empty() {
        println!(
            "removed the outcome file(s) of {} loader(s) that exited: {}",
            gc.removed.len(),
            gc.removed.join(", ")
        );
    }
    if !gc.recent.is_empty() {
        println!(
            "kept    the outcome file(s) of {}: their loader exited less than {} s ago (a trainer that comes late still reads it)",
            gc.recent.join(", "),
            OUTCOME_GC_GRACE.as_secs()
        );
    }
    if !gc.held.is_empty() {
        println!(
            "kept    the outcome file(s) of {}: their `ringfeed run` still runs its trainers",
            gc.held.join(", ")
        );
    }
}

/// Removes cache files of directories that no longer exist, files that are
/// not cache files of this version, and temporary files of dead writers.
/// The directory is opened under the cache's private-directory rule (as
/// `serve` opens it: ours, not a link, in a cache directory no other user
/// may fill) and its entries are judged and removed through its descriptor,
/// never through a path another user could redirect. Problems are printed,
/// never fatal: the cache is only an optimisation.
fn collect_manifests(path: &Path) {
    let dir = match open_existing_private_dir(path) {
        Ok(Some(dir)) => dir,
        Ok(None) => return,
        Err(err) => {
            eprintln!(
                "error   the manifest cache {} is not this user's to clean: {err}; nothing removed there",
                path.display()
            );
            return;
        }
    };
    let names = match dir.names() {
        Ok(names) => names,
        Err(err) => {
            eprintln!(
                "error   cannot list the manifest cache {}: {err}",
                path.display()
            );
            return;
        }
    };
    let (mut removed, mut kept) = (0, 0);
    for name in names {
        let text = name.to_string_lossy();
        let why = if text.contains(".manifest.tmp.") {
            // A writer renames its file when done: one left for long is
            // garbage (ages, not process ids: a writer may be in another
            // PID namespace or on another host sharing the directory).
            dir.open_trusted(&name)
                .and_then(|f| f.metadata().map_err(|source| io_trust(&dir, &name, source)))
                .ok()
                .filter(is_stale_tmp)
                .map(|_| "a temporary file left by a writer that stopped".to_owned())
        } else if text.ends_with(".manifest") {
            manifest_gone(&dir, &name)
        } else {
            continue;
        };
        let shown = path.join(&name);
        match why {
            None => kept += 1,
            Some(why) => match dir.remove(&name) {
                Ok(()) => {
                    removed += 1;
                    println!("removed {}: {why}", shown.display());
                }
                Err(err) => eprintln!("error   {}: cannot remove: {err}", shown.display()),
            },
        }
    }
    println!(
        "{removed} cached manifest(s) removed, {kept} kept ({})",
        path.display()
    );
}

fn io_trust(dir: &Dir, name: &OsStr, source: std::io::Error) -> TrustError {
    TrustError::Io {
        path: dir.path().join(name),
        source,
    }
}

/// Why the cache file `name` of `dir` is to be removed, if it is.
fn manifest_gone(dir: &Dir, name: &OsStr) -> Option<String> {
    let read = dir.open_trusted(name).and_then(|file| {
        let meta = file
            .metadata()
            .map_err(|source| io_trust(dir, name, source))?;
        Ok((file, meta))
    });
    let root = match read {
        Ok((file, meta)) => ManifestCache::root_of_open(file, &meta),
        Err(e) => Err(NotACacheFile::Unusable(e.to_string())),
    };
    match root {
        // A remote prefix's listing: nothing here can tell whether
        // the prefix still exists; its age limit retires it.
        Ok(root) if crate::source::remote::is_remote_url(&root.to_string_lossy()) => None,
        // Only a directory that is certainly gone: an unmounted or
        // unreadable one may come back.
        Ok(root) => match fs::symlink_metadata(&root) {
            Err(err)
                if err.kind() == std::io::ErrorKind::NotFound
                    || err.raw_os_error() == Some(libc::ENOTDIR) =>
            {
                Some(format!("{} no longer exists", root.display()))
            }
            Ok(meta) if meta.is_file() => Some(format!(
                "{} is now a file, not the directory that was listed",
                root.display()
            )),
            _ => None,
        },
        Err(NotACacheFile::NewerVersion(_)) => None,
        Err(NotACacheFile::Unusable(why)) => {
            Some(format!("not a usable manifest cache file ({why})"))
        }
    }
}
