//! `--source` as given (a directory or a URL, and an optional `--keys`
//! file), and the source it opens.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::cache::ManifestCache;
use super::remote::{is_remote_url, RemoteSource};
use super::{build_manifest, build_manifest_cached, LocalSource, Source};
use crate::manifest::{Manifest, ManifestError, ManifestOptions, ManifestOrigin};

/// Where a dataset is, as `--source` (and `--keys`) said it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceSpec {
    /// A local directory (`DIR` or `file://DIR`).
    Local(PathBuf),
    /// A remote prefix: `s3://`, `gs://`, `az://` / `abfs://`, `http(s)://`.
    Remote {
        /// The URL as given.
        url: String,
        /// `--keys FILE`: the objects are the keys it lists, not a listing's.
        keys_file: Option<PathBuf>,
    },
}

impl SourceSpec {
    /// Reads `--source` (and `--keys`). A local directory with a keys file
    /// is refused: its listing is already fast and exact.
    pub fn parse(source: &str, keys_file: Option<&Path>) -> Result<SourceSpec, String> {
        if is_remote_url(source) {
            return Ok(SourceSpec::Remote {
                url: source.to_owned(),
                keys_file: keys_file.map(Path::to_path_buf),
            });
        }
        if let Some(keys) = keys_file {
            return Err(format!(
                "--keys {}: a key list is for remote sources (s3://, gs://, az://, http(s)://); \
                 --source {source} is a local directory, whose files are listed directly: leave --keys out",
                keys.display()
            ));
        }
        if let Some((scheme, _)) = source.split_once("://") {
            if scheme != "file" {
                return Err(format!(
                    "--source {source}: scheme {scheme}:// is not supported; use a local directory, \
                     s3://, gs://, az://, abfs://, http:// or https://"
                ));
            }
        }
        let path = source.strip_prefix("file://").unwrap_or(source);
        Ok(SourceSpec::Local(PathBuf::from(path)))
    }

    /// The local directory, if this is one.
    pub fn local_path(&self) -> Option<&Path> {
        match self {
            SourceSpec::Local(path) => Some(path),
            SourceSpec::Remote { .. } => None,
        }
    }

    /// Opens the source (a remote one: its store and runtime; nothing is
    /// asked of the network yet).
    pub fn open(&self) -> Result<OpenedSource, ManifestError> {
        match self {
            SourceSpec::Local(path) => Ok(OpenedSource::Local(LocalSource::open(path)?)),
            SourceSpec::Remote { url, keys_file } => Ok(OpenedSource::Remote(Arc::new(
                RemoteSource::open(url, keys_file.as_deref())?,
            ))),
        }
    }
}

impl fmt::Display for SourceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceSpec::Local(path) => write!(f, "{}", path.display()),
            // Shown, never with its secrets (a password, a signature).
            SourceSpec::Remote {
                url,
                keys_file: None,
            } => f.write_str(&crate::remote::redact_url(url)),
            SourceSpec::Remote {
                url,
                keys_file: Some(keys),
            } => write!(
                f,
                "{} (keys from {})",
                crate::remote::redact_url(url),
                keys.display()
            ),
        }
    }
}

impl From<PathBuf> for SourceSpec {
    fn from(path: PathBuf) -> SourceSpec {
        SourceSpec::Local(path)
    }
}

impl From<&Path> for SourceSpec {
    fn from(path: &Path) -> SourceSpec {
        SourceSpec::Local(path.to_path_buf())
    }
}

/// An opened source: what the loader lists, names objects by, and reads from.
#[derive(Clone, Debug)]
pub enum OpenedSource {
    /// A local directory.
    Local(LocalSource),
    /// A remote prefix (shared: the fetch engine takes its runtime).
    Remote(Arc<RemoteSource>),
}

impl OpenedSource {
    /// The source behind the one trait.
    pub fn source(&self) -> &dyn Source {
        match self {
            OpenedSource::Local(local) => local,
            OpenedSource::Remote(remote) => remote.as_ref(),
        }
    }

    /// This source, listing links to files outside a local root too when
    /// `follow` (`--follow-links-outside`; a remote source has no links).
    pub fn follow_links_outside(self, follow: bool) -> OpenedSource {
        match self {
            OpenedSource::Local(local) => OpenedSource::Local(local.follow_links_outside(follow)),
            remote => remote,
        }
    }

    /// Lists it and builds its manifest.
    pub fn build_manifest(&self, opts: &ManifestOptions) -> Result<Manifest, ManifestError> {
        build_manifest(self.source(), opts)
    }

    /// Like `build_manifest`, through the manifest cache.
    pub fn build_manifest_cached(
        &self,
        opts: &ManifestOptions,
        cache: &ManifestCache,
        relist: bool,
    ) -> Result<(Manifest, ManifestOrigin), ManifestError> {
        if opts.record_bytes == Some(0) {
            return Err(ManifestError::ZeroRecordBytes);
        }
        build_manifest_cached(self.source(), opts, cache, relist)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_flag_is_a_directory_or_a_remote_url() {
        assert_eq!(
            SourceSpec::parse("file:///data", None),
            Ok(SourceSpec::Local("/data".into()))
        );
        assert_eq!(
            SourceSpec::parse("data/x", None),
            Ok(SourceSpec::Local("data/x".into()))
        );
        assert_eq!(
            SourceSpec::parse("s3://b/p/", Some(Path::new("k.txt"))),
            Ok(SourceSpec::Remote {
                url: "s3://b/p/".into(),
                keys_file: Some("k.txt".into())
            })
        );
        let err = SourceSpec::parse("ftp://h/p", None).unwrap_err();
        assert!(err.contains("ftp://") && err.contains("s3://"), "{err}");
        let err = SourceSpec::parse("/data", Some(Path::new("k.txt"))).unwrap_err();
        assert!(
            err.contains("--keys k.txt") && err.contains("leave --keys out"),
            "{err}"
        );
    }
}
