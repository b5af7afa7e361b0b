//! `ringfeed manifest build SOURCE`: list a remote prefix once, ahead of a
//! job, and publish its manifest where the job's nodes read it (docs/manifest.md,
//! "One listing per job").

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;

use crate::source::published::{self, Place, Publishing, Role, DEFAULT_WAIT};
use crate::source::{ManifestCache, SourceSpec};

/// Arguments of `ringfeed manifest`.
#[derive(Args, Debug, Clone)]
pub struct ManifestArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ManifestCommand,
}

/// `ringfeed manifest` subcommands.
#[derive(Subcommand, Debug, Clone)]
pub enum ManifestCommand {
    /// List a remote source now and publish its manifest for the next jobs
    /// (beside the data, PREFIX/.ringfeed/, or --job-manifest's place): a
    /// job's node 0 then takes it while it is younger than its
    /// --manifest-max-age, and no node lists.
    Build(BuildArgs),
}

/// Arguments of `ringfeed manifest build`.
#[derive(Args, Debug, Clone)]
pub struct BuildArgs {
    /// The remote prefix (as `serve --source` takes it).
    pub source: String,
    /// Where to publish: a URL or a directory every node mounts (default:
    /// beside the data).
    #[arg(long, value_name = "URL|DIR")]
    pub job_manifest: Option<String>,
    /// Also publish it as this job's manifest (the job's nodes pass the
    /// same --job-id).
    #[arg(long, value_name = "ID")]
    pub job_id: Option<String>,
    /// Cache directory (the local manifest cache keeps the listing too).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
}

/// Runs `ringfeed manifest`.
pub fn run(args: &ManifestArgs) -> Result<()> {
    match &args.command {
        ManifestCommand::Build(b) => build(b),
    }
}

fn build(args: &BuildArgs) -> Result<()> {
    let spec = SourceSpec::parse(&args.source, None).map_err(anyhow::Error::msg)?;
    let crate::source::OpenedSource::Remote(remote) = spec.open()? else {
        bail!(
            "ringfeed manifest build {}: a local directory is listed by each machine; the published manifest is for remote sources (s3://, gs://, az://, http(s)://)",
            args.source
        );
    };
    let place = match &args.job_manifest {
        None => Place::Beside,
        Some(value) if value == "auto" => Place::Beside,
        Some(value) => Place::parse(value),
    };
    let p = Publishing {
        place,
        explicit: true,
        role: Role::Publisher,
        job: args.job_id.clone(),
        wait: DEFAULT_WAIT,
        max_age: crate::source::DEFAULT_REMOTE_MAX_AGE,
        refresh: true,
    };
    let cache = ManifestCache::dir_under(args.cache_dir.as_deref()).map(ManifestCache::at);
    let started = std::time::Instant::now();
    let (published, objects) = published::build_and_publish(&remote, cache.as_ref(), &p)
        .with_context(|| format!("ringfeed manifest build {}", spec))?;
    crate::say::say_out!(
        "ringfeed: listed {} ({objects} objects) in {:.1} s and published its manifest at {}",
        spec,
        started.elapsed().as_secs_f64(),
        published.describe()
    );
    Ok(())
}
