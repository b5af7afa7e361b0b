//! `--job-manifest`, `--job-id` and `--job-manifest-wait`: one listing per
//! job (docs/manifest.md, "One listing per job"; `source::published`).

use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;

use crate::source::published::{Place, Publishing, Role, JOB_ID_BYTES_MAX};
use crate::source::SourceSpec;

/// The flags of a job's published manifest.
#[derive(Args, Debug, Clone)]
pub struct JobManifestArgs {
    /// One listing per job: node 0 (--node-rank 0) lists a remote source
    /// and publishes the manifest, the other nodes read it in one GET.
    /// auto: beside the data (PREFIX/.ringfeed/) when --nnodes is above 1;
    /// off: every node lists; or a URL (s3://, gs://, az://, http(s)://) or
    /// a directory every node mounts.
    #[arg(long, value_name = "auto|off|URL|DIR", default_value = "auto")]
    pub job_manifest: String,
    /// The job's id, the same on every node (ringfeed run passes torchrun's
    /// --rdzv-id; default SLURM_JOB_ID.SLURM_STEP_ID when set): its nodes
    /// then share the manifest node 0 chose for this job, however old.
    #[arg(long, value_name = "ID")]
    pub job_id: Option<String>,
    /// How long a node other than 0 waits for node 0's manifest (then it
    /// lists itself with --job-manifest auto, or fails with a place given):
    /// e.g. 90s, 10m.
    #[arg(long, value_name = "DURATION", value_parser = parse_wait, default_value = "10m")]
    pub job_manifest_wait: Duration,
}

fn parse_wait(s: &str) -> Result<Duration, String> {
    super::max_age::parse_max_age(s)
        .map_err(|e| e.replace("--manifest-max-age", "--job-manifest-wait"))
}

/// Where the job's place and rank put this loader, from the other flags.
pub struct JobShape<'a> {
    /// `--source` (and `--keys`).
    pub source: &'a SourceSpec,
    /// `--nnodes`.
    pub nnodes: u32,
    /// `--node-rank`.
    pub node_rank: u32,
    /// `--manifest-max-age`.
    pub max_age: Duration,
    /// `--manifest-cache refresh`.
    pub refresh: bool,
}

impl JobManifestArgs {
    /// The publishing these flags ask for; None when off (or auto where it
    /// does not apply: a local source, one machine, a `--keys` list).
    pub fn publishing(&self, shape: &JobShape<'_>) -> Result<Option<Publishing>> {
        let remote_keys = match shape.source {
            SourceSpec::Remote { keys_file, .. } => Some(keys_file.is_some()),
            SourceSpec::Local(_) => None,
        };
        let (place, explicit) = match self.job_manifest.as_str() {
            "off" => return Ok(None),
            "auto" if remote_keys != Some(false) || shape.nnodes <= 1 => return Ok(None),
            "auto" => (Place::Beside, false),
            value => (Place::parse(value), true),
        };
        match remote_keys {
            None => bail!(
                "--job-manifest {}: a local directory is listed by each machine (its stamps are that machine's); \
                 the job manifest is for remote sources (s3://, gs://, az://, http(s)://): leave it out",
                self.job_manifest
            ),
            Some(true) => bail!(
                "--job-manifest {} with --keys: every node reads the key list itself; leave one of them out",
                self.job_manifest
            ),
            Some(false) => {}
        }
        let job = self.job_id()?;
        if shape.max_age.is_zero() && job.is_none() {
            bail!(
                "--manifest-max-age 0 with a job manifest needs a job id, so that the nodes know node 0's listing is this job's: \
                 pass --job-id (the same on every node; ringfeed run passes torchrun's --rdzv-id), or --job-manifest off"
            );
        }
        Ok(Some(Publishing {
            place,
            explicit,
            role: if shape.node_rank == 0 {
                Role::Publisher
            } else {
                Role::Reader
            },
            job,
            wait: self.job_manifest_wait,
            max_age: shape.max_age,
            refresh: shape.refresh,
        }))
    }

    /// `--job-id`, else SLURM_JOB_ID (with SLURM_STEP_ID), checked.
    fn job_id(&self) -> Result<Option<String>> {
        let from_env = || {
            let job = std::env::var("SLURM_JOB_ID")
                .ok()
                .filter(|j| !j.is_empty())?;
            Some(match std::env::var("SLURM_STEP_ID") {
                Ok(step) if !step.is_empty() => format!("slurm-{job}.{step}"),
                _ => format!("slurm-{job}"),
            })
        };
        let Some(job) = self.job_id.clone().or_else(from_env) else {
            return Ok(None);
        };
        if job.is_empty() || job.len() > JOB_ID_BYTES_MAX || job.chars().any(char::is_control) {
            bail!("--job-id {job:?}: 1 to {JOB_ID_BYTES_MAX} bytes without control characters");
        }
        Ok(Some(job))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::published::DEFAULT_WAIT;

    fn args(value: &str, job: Option<&str>) -> JobManifestArgs {
        JobManifestArgs {
            job_manifest: value.to_string(),
            job_id: job.map(str::to_string),
            job_manifest_wait: DEFAULT_WAIT,
        }
    }

    fn shape(source: &SourceSpec, nnodes: u32, node_rank: u32) -> JobShape<'_> {
        JobShape {
            source,
            nnodes,
            node_rank,
            max_age: Duration::from_secs(3600),
            refresh: false,
        }
    }

    #[test]
    fn auto_publishes_beside_a_remote_source_on_several_machines_only() {
        let remote = SourceSpec::parse("s3://b/p/", None).unwrap();
        let local = SourceSpec::parse("/data", None).unwrap();
        let a = args("auto", Some("j1"));
        assert_eq!(a.publishing(&shape(&remote, 1, 0)).unwrap(), None);
        assert_eq!(a.publishing(&shape(&local, 4, 0)).unwrap(), None);
        let p = a.publishing(&shape(&remote, 4, 2)).unwrap().unwrap();
        assert_eq!(
            (p.place, p.explicit, p.role, p.job.as_deref()),
            (Place::Beside, false, Role::Reader, Some("j1"))
        );
        let p = a.publishing(&shape(&remote, 4, 0)).unwrap().unwrap();
        assert_eq!(p.role, Role::Publisher);
        assert_eq!(
            args("off", None).publishing(&shape(&remote, 4, 0)).unwrap(),
            None
        );
    }

    #[test]
    fn a_place_given_is_a_url_or_a_directory_and_refused_for_a_local_source() {
        let remote = SourceSpec::parse("s3://b/p/", None).unwrap();
        let p = args("/shared/m", Some("j"))
            .publishing(&shape(&remote, 1, 0))
            .unwrap()
            .unwrap();
        assert_eq!(
            (p.place, p.explicit),
            (Place::Dir("/shared/m".into()), true)
        );
        let p = args("gs://x/y/", Some("j"))
            .publishing(&shape(&remote, 2, 1))
            .unwrap()
            .unwrap();
        assert_eq!(p.place, Place::Url("gs://x/y/".into()));
        let local = SourceSpec::parse("/data", None).unwrap();
        let e = args("/shared/m", None)
            .publishing(&shape(&local, 2, 0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("remote sources"), "{e}");
    }

    #[test]
    fn listing_at_every_start_needs_a_job_id() {
        let remote = SourceSpec::parse("s3://b/p/", None).unwrap();
        let mut s = shape(&remote, 2, 0);
        s.max_age = Duration::ZERO;
        let e = args("auto", None).publishing(&s).unwrap_err().to_string();
        assert!(e.contains("--job-id"), "{e}");
        assert!(args("auto", Some("j")).publishing(&s).unwrap().is_some());
    }
}
