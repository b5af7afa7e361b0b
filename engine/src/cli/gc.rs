//! `ringfeed gc`.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

use crate::manifest::ManifestCache;
use crate::ring::gc::{collect, GcOutcome};
use crate::ring::segment::{human_bytes, SHM_DIR};

/// Removes segments of dead loaders, and cached manifests of directories
/// that are gone, and says what it did.
pub fn run() -> Result<()> {
    let segments = collect_segments();
    if let Some(dir) = ManifestCache::default_dir() {
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
                println!("removed {SHM_DIR}/ringfeed-{name} ({}), its loader is dead", human_bytes(*bytes));
            }
            GcOutcome::Alive { name } => println!("kept    {SHM_DIR}/ringfeed-{name}: its loader is running"),
            GcOutcome::Failed { name, error } => {
                failed += 1;
                eprintln!("error   {SHM_DIR}/ringfeed-{name}: {error}");
            }
        }
    }
    println!("{removed} segment(s) removed, {} kept", outcomes.len() - removed - failed);
    if failed > 0 {
        anyhow::bail!("{failed} segment(s) could not be inspected or removed (permissions?)");
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
            eprintln!("error   cannot list the manifest cache {}: {err}", dir.display());
            return;
        }
    };
    let (mut removed, mut kept) = (0, 0);
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let why = if let Some((_, pid)) = name.split_once(".manifest.tmp.") {
            // A writer renames its file when done: one left behind by a
            // dead process is garbage; a live one is still writing.
            match pid.parse::<i32>() {
                Ok(pid) if process_alive(pid) => None,
                _ => Some("a temporary file of a writer that is gone".to_owned()),
            }
        } else if name.ends_with(".manifest") {
            match ManifestCache::root_of(&path) {
                Some(root) if root.is_dir() => None,
                Some(root) => Some(format!("{} no longer exists", root.display())),
                None => Some("not a manifest cache file of this version".to_owned()),
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
    println!("{removed} cached manifest(s) removed, {kept} kept ({})", dir.display());
}

/// Whether process `pid` exists (EPERM: it does, owned by someone else).
fn process_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    pid > 0 && (unsafe { libc::kill(pid, 0) } == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}
