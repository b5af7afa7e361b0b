//! `ringfeed gc`.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::ring::gc::{collect, GcOutcome};
use crate::ring::segment::{human_bytes, SHM_DIR};
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
    // segment of the name is left.
    match crate::ring::outcome::remove_stale() {
        Ok(names) if !names.is_empty() => println!(
            "removed the outcome file(s) of {} loader(s) that exited: {}",
            names.len(),
            names.join(", ")
        ),
        Ok(_) => {}
        Err(e) => eprintln!("error   cannot list {SHM_DIR} for outcome files: {e}"),
    }
    if failed > 0 {
        anyhow::bail!(
            "{failed} segment(s) could not be inspected or removed (the errors above say why)"
        );
    }
    Ok(())
}

/// Removes cache files of directories that no longer exist, files that are
/// not cache files of this version, and temporary files of dead writers.
/// Problems are printed, never fatal: the cache is only an optimisation.
fn collect_manifests(dir: &Path) {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return,
        Err(err) => {
            eprintln!(
                "error   cannot list the manifest cache {}: {err}",
                dir.display()
            );
            return;
        }
    };
    let (mut removed, mut kept) = (0, 0);
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let why = if name.contains(".manifest.tmp.") {
            // A writer renames its file when done: one left for long is
            // garbage (ages, not process ids: a writer may be in another
            // PID namespace or on another host sharing the directory).
            match entry.metadata() {
                Ok(meta) if is_stale_tmp(&meta) => {
                    Some("a temporary file left by a writer that stopped".to_owned())
                }
                _ => None,
            }
        } else if name.ends_with(".manifest") {
            match ManifestCache::root_of(&path) {
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
        } else {
            continue;
        };
        match why {
            None => kept += 1,
            Some(why) => match fs::remove_file(&path) {
                Ok(()) => {
                    removed += 1;
                    println!("removed {}: {why}", path.display());
                }
                Err(err) => eprintln!("error   {}: cannot remove: {err}", path.display()),
            },
        }
    }
    println!(
        "{removed} cached manifest(s) removed, {kept} kept ({})",
        dir.display()
    );
}
