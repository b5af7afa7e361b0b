//! `ringfeed cache list` and `ringfeed cache clear`: the disk data cache of
//! remote objects (`<cache dir>/data`; not the manifest cache, which `gc`
//! tidies).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};

use crate::cache::entry::file_bytes_of_name;
use crate::cache::usage::{tmp_reserved_bytes, Usage};
use crate::cli::say::say_out;
use crate::ring::segment::human_bytes;

/// `ringfeed cache`.
#[derive(Args, Debug)]
pub struct CacheArgs {
    /// The cache directory `serve --cache-dir` was given (default:
    /// RINGFEED_CACHE_DIR, else $XDG_CACHE_HOME/ringfeed, else ~/.cache/ringfeed);
    /// the data cache is its data/ directory.
    #[arg(long, global = true)]
    pub cache_dir: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub action: CacheAction,
}

/// `ringfeed cache list|clear`.
#[derive(Subcommand, Debug)]
pub enum CacheAction {
    /// List the cached datasets: id, source, entries, bytes.
    List,
    /// Remove one dataset's entries (by the id `list` shows), or all.
    Clear {
        /// The dataset id (16 hex digits, from `ringfeed cache list`).
        dataset: Option<String>,
        /// Every dataset.
        #[arg(long, conflicts_with = "dataset")]
        all: bool,
    },
}

/// Most bytes of a dataset's `source` file read.
const SOURCE_BYTES_MAX: u64 = 64 << 10;

/// One dataset directory.
struct Dataset {
    id: String,
    source: String,
    entries: u64,
    bytes: u64,
    writing: u64,
}

/// Runs `ringfeed cache ...`.
pub fn run(args: &CacheArgs) -> Result<()> {
    let Some(root) = crate::cache::data_root(args.cache_dir.as_deref()) else {
        bail!("no cache directory: neither RINGFEED_CACHE_DIR, XDG_CACHE_HOME nor HOME is set; pass --cache-dir");
    };
    match &args.action {
        CacheAction::List => list(&root),
        CacheAction::Clear { dataset, all } => clear(&root, dataset.as_deref(), *all),
    }
}

fn datasets(root: &Path) -> Result<Vec<Dataset>> {
    let mut out = Vec::new();
    let dir = match fs::read_dir(root) {
        Ok(dir) => dir,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("cannot list {}", root.display())),
    };
    for item in dir {
        let item = item?;
        let id = item.file_name().to_string_lossy().into_owned();
        if !item.file_type()?.is_dir() || id.len() != 16 {
            continue;
        }
        let path = item.path();
        // Trusted only if ours; never a FIFO's endless wait. Redacted again: a
        // cache written before redaction holds the URL whole.
        let source = crate::ring::safe_file::read_trusted(&path.join("source"), SOURCE_BYTES_MAX)
            .map(|b| crate::remote::redact_url(String::from_utf8_lossy(&b).trim()))
            .unwrap_or_else(|_| "(unknown source)".to_owned());
        let mut d = Dataset {
            id,
            source,
            entries: 0,
            bytes: 0,
            writing: 0,
        };
        for sub in fs::read_dir(&path)? {
            let sub = sub?;
            let name = sub.file_name().to_string_lossy().into_owned();
            if tmp_reserved_bytes(&name).is_some() {
                d.writing += 1;
            } else if sub.file_type()?.is_dir() {
                for e in fs::read_dir(sub.path())? {
                    if let Some(b) = file_bytes_of_name(&e?.file_name().to_string_lossy()) {
                        d.entries += 1;
                        d.bytes += b;
                    }
                }
            }
        }
        out.push(d);
    }
    out.sort_by(|a, b| a.source.cmp(&b.source));
    Ok(out)
}

fn list(root: &Path) -> Result<()> {
    let all = datasets(root)?;
    if all.is_empty() {
        say_out!("no cached datasets in {}", root.display());
        return Ok(());
    }
    say_out!(
        "{:<16}  {:>9}  {:>10}  source",
        "dataset",
        "entries",
        "bytes"
    );
    for d in &all {
        let writing = if d.writing > 0 {
            format!(" ({} being written)", d.writing)
        } else {
            String::new()
        };
        say_out!(
            "{:<16}  {:>9}  {:>10}  {}{writing}",
            d.id,
            d.entries,
            human_bytes(d.bytes),
            d.source
        );
    }
    let usage = Usage::open(root).with_context(|| format!("cannot open {}", root.display()))?;
    say_out!(
        "{} datasets, {} used in {} (by the shared count)",
        all.len(),
        human_bytes(usage.used_bytes()?),
        root.display()
    );
    Ok(())
}

fn clear(root: &Path, dataset: Option<&str>, all: bool) -> Result<()> {
    let targets: Vec<Dataset> = match (dataset, all) {
        (_, true) => datasets(root)?,
        (Some(id), false) => {
            let found: Vec<Dataset> = datasets(root)?.into_iter().filter(|d| d.id == id).collect();
            if found.is_empty() {
                bail!(
                    "no cached dataset {id:?} in {}; `ringfeed cache list` shows the ids",
                    root.display()
                );
            }
            found
        }
        (None, false) => {
            bail!("say which dataset to clear (an id from `ringfeed cache list`) or --all")
        }
    };
    let usage = Usage::open(root).with_context(|| format!("cannot open {}", root.display()))?;
    for d in &targets {
        let path = root.join(&d.id);
        // Under the lock, so no loader reserves or publishes meanwhile; a
        // loader reading this dataset now reads the removed entries from
        // remote (a failed cache read falls back) and may write them again.
        usage
            .locked(|_| fs::remove_dir_all(&path))
            .with_context(|| format!("cannot remove {}", path.display()))?;
        say_out!(
            "removed {} ({} entries, {}): {}",
            d.id,
            d.entries,
            human_bytes(d.bytes),
            d.source
        );
    }
    let scan = usage.rescan()?;
    say_out!(
        "{} now used in {}",
        human_bytes(scan.used_bytes),
        root.display()
    );
    Ok(())
}
