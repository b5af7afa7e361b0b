//! From a `--source` to a corpus: which objects it names (a directory or
//! prefix, listed through the manifest cache; a Megatron `PREFIX`; one
//! file), which format they are, and the corpus their index describes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::access::{Access, Object};
use super::corpus::{Corpus, Part};
use super::dtype::TokenDtype;
use super::{datatrove, flat, litdata, mds, megatron, TokenError};
use crate::manifest::{ManifestError, ManifestOptions};
use crate::remote::RemoteObject;
use crate::source::{LocalSource, ManifestCache, RemoteSource, Source, SourceSpec};

/// Which format a corpus is in (`--format`; `Auto` tells it from the names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TokenFormatKind {
    /// Told from the objects: Megatron pairs, datatrove pairs, an
    /// `index.json` of LitData or MDS, else flat token files.
    #[default]
    Auto,
    /// Flat token files (`--format tokens`).
    Flat,
    /// Megatron-Core's `.bin` + `.idx` (`--format megatron`).
    Megatron,
    /// datatrove's `.ds` + `.ds.index` (`--format datatrove`).
    Datatrove,
    /// LitData's `optimize()` output with `TokensLoader` (`--format litdata`).
    LitData,
    /// MosaicML MDS shards (`--format mds`).
    Mds,
}

impl TokenFormatKind {
    /// Its name in messages and flags.
    pub fn name(self) -> &'static str {
        match self {
            TokenFormatKind::Auto => "auto",
            TokenFormatKind::Flat => "tokens",
            TokenFormatKind::Megatron => "megatron",
            TokenFormatKind::Datatrove => "datatrove",
            TokenFormatKind::LitData => "litdata",
            TokenFormatKind::Mds => "mds",
        }
    }
}

/// One `--source` of a token run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorpusSpec {
    /// Where it is.
    pub source: SourceSpec,
    /// Its format.
    pub format: TokenFormatKind,
}

/// How every corpus of a run is read and cut.
#[derive(Clone, Debug)]
pub struct TokenOptions {
    /// `L`: windows of `L + 1` tokens.
    pub seq_len: u64,
    /// `--token-dtype`: flat files' dtype; a check for the others.
    pub dtype: Option<TokenDtype>,
    /// `--eos-token`: put between documents.
    pub eos: Option<u64>,
    /// Where remote indexes are kept (the token cache directory), if any.
    pub keep_dir: Option<PathBuf>,
    /// The manifest cache a directory or prefix is listed through.
    pub manifest_cache: Option<ManifestCache>,
    /// List even when a cached listing is valid.
    pub refresh: bool,
    /// A local source: also read the files links point to outside it.
    pub follow_links_outside: bool,
    /// Log listing progress.
    pub progress: bool,
}

/// Where the readers find a corpus's data objects.
#[derive(Clone, Debug)]
pub enum DataLocation {
    /// Local files, by absolute path.
    Local(Vec<PathBuf>),
    /// Objects of a remote prefix.
    Remote {
        /// The source (its store, its runtime).
        source: Arc<RemoteSource>,
        /// The objects, with the ETags reads insist on.
        objects: Vec<RemoteObject>,
    },
}

/// A corpus ready to serve: its windows, and its data objects.
#[derive(Debug)]
pub struct OpenedCorpus {
    /// The windows.
    pub corpus: Corpus,
    /// The format it was read as.
    pub format: TokenFormatKind,
    /// Where its data objects are, in the order its parts name them.
    pub data: DataLocation,
    /// Each data object as messages name it.
    pub names: Vec<String>,
    /// Each data object's size.
    pub sizes: Vec<u64>,
    /// How its source is read (the first corpus's names the run).
    pub access: Access,
}

/// Opens `spec` and reads its index into a corpus.
pub fn open_corpus(spec: &CorpusSpec, opts: &TokenOptions) -> Result<OpenedCorpus, TokenError> {
    let (access, mut objects) = resolve(spec, opts)?;
    objects.sort_by(|a, b| a.key.cmp(&b.key));
    let format = match spec.format {
        TokenFormatKind::Auto => detect(&access, &objects)?,
        f => f,
    };
    let keep = opts.keep_dir.as_deref();
    // zstd shards are read from their decompressed copies.
    let mut decompressed: Option<Vec<PathBuf>> = None;
    let (parts, data, dtype): (Vec<Part>, Vec<Object>, TokenDtype) = match format {
        TokenFormatKind::Flat | TokenFormatKind::Auto => {
            let dtype = opts.dtype.ok_or_else(|| {
                TokenError::Format(format!(
                    "{} holds no Megatron, datatrove, LitData or MDS index, so its files are read as flat token files: \
                     pass --token-dtype (uint16 for nanoGPT's GPT-2 train.bin), or --format for the format it is in",
                    access.source_name()
                ))
            })?;
            (
                flat::parts(&access, &objects, dtype)?,
                objects.clone(),
                dtype,
            )
        }
        TokenFormatKind::Megatron => megatron::parts(&access, &objects, keep)?,
        TokenFormatKind::Datatrove => datatrove::parts(&access, &objects, opts.dtype, keep)?,
        TokenFormatKind::LitData => litdata::parts(&access, &objects, opts.dtype)?,
        TokenFormatKind::Mds => {
            let m = mds::parts(&access, &objects, opts.dtype, keep)?;
            decompressed = m.local;
            (m.parts, m.data, m.dtype)
        }
    };
    if let Some(flag) = opts.dtype.filter(|&d| d != dtype) {
        return Err(TokenError::Format(format!(
            "{} holds {dtype} tokens, but --token-dtype says {flag}; leave it out, or fix it",
            access.source_name()
        )));
    }
    let corpus = Corpus::new(access.source_name(), dtype, parts, opts.seq_len, opts.eos)?;
    let sizes = data.iter().map(|o| o.size_bytes).collect();
    if let Some(paths) = decompressed {
        return Ok(OpenedCorpus {
            corpus,
            format,
            names: paths.iter().map(|p| p.display().to_string()).collect(),
            data: DataLocation::Local(paths),
            sizes,
            access,
        });
    }
    let names = data.iter().map(|o| access.name(&o.key)).collect();
    let data = match &access {
        Access::Local(local) => {
            DataLocation::Local(data.iter().map(|o| local.path_of(&o.key)).collect())
        }
        Access::Remote(remote) => DataLocation::Remote {
            source: Arc::clone(remote),
            objects: data
                .into_iter()
                .map(|o| RemoteObject {
                    key: String::from_utf8_lossy(&o.key).into_owned(),
                    size: o.size_bytes,
                    etag: o.etag,
                })
                .collect(),
        },
    };
    Ok(OpenedCorpus {
        corpus,
        format,
        data,
        names,
        sizes,
        access,
    })
}

/// The format `objects` are in, told from their names (and an
/// `index.json`'s contents).
fn detect(access: &Access, objects: &[Object]) -> Result<TokenFormatKind, TokenError> {
    let keys: Vec<&[u8]> = objects.iter().map(|o| o.key.as_slice()).collect();
    if !megatron::pairs(&keys).0.is_empty() {
        return Ok(TokenFormatKind::Megatron);
    }
    if !datatrove::pairs(&keys).0.is_empty() {
        return Ok(TokenFormatKind::Datatrove);
    }
    if let Ok(i) = keys.binary_search(&litdata::INDEX_JSON) {
        let obj = &objects[i];
        if obj.size_bytes <= litdata::INDEX_JSON_BYTES_MAX {
            let bytes = access.range(obj, 0..obj.size_bytes)?;
            let v: serde_json::Value =
                serde_json::from_slice(&bytes).map_err(|e| TokenError::Index {
                    name: access.name(&obj.key),
                    problem: format!("it is not JSON: {e}"),
                })?;
            if v.get("chunks").is_some() {
                return Ok(TokenFormatKind::LitData);
            }
            if v.get("shards").is_some() {
                return Ok(TokenFormatKind::Mds);
            }
        }
    }
    Ok(TokenFormatKind::Flat)
}

/// The objects `spec` names, and how to read them.
fn resolve(spec: &CorpusSpec, opts: &TokenOptions) -> Result<(Access, Vec<Object>), TokenError> {
    match &spec.source {
        SourceSpec::Local(path) => resolve_local(path, spec.format, opts),
        SourceSpec::Remote { url, keys_file } => {
            resolve_remote(url, keys_file.as_deref(), spec.format, opts)
        }
    }
}

/// `path` with `suffix` appended to its last component.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn resolve_local(
    path: &Path,
    format: TokenFormatKind,
    opts: &TokenOptions,
) -> Result<(Access, Vec<Object>), TokenError> {
    let missing = || ManifestError::SourceMissing {
        path: path.to_path_buf(),
    };
    if path.is_dir() {
        let root = std::fs::canonicalize(path).map_err(|_| missing())?;
        let local = LocalSource::open(&root)?.follow_links_outside(opts.follow_links_outside);
        let objects = list(&local, opts)?;
        return Ok((Access::Local(local), objects));
    }
    let name = path.file_name().ok_or_else(missing)?.to_owned();
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let root = std::fs::canonicalize(parent).map_err(|_| missing())?;
    let size = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len())
    };
    let key = |suffix: &str| {
        let mut k = name.as_encoded_bytes().to_vec();
        k.extend_from_slice(suffix.as_bytes());
        k
    };
    let mut objects = Vec::new();
    let megatron_ok = matches!(format, TokenFormatKind::Auto | TokenFormatKind::Megatron);
    if let (true, Some(bin), Some(idx)) = (
        megatron_ok,
        size(&with_suffix(path, ".bin")),
        size(&with_suffix(path, ".idx")),
    ) {
        for (suffix, size_bytes) in [(".bin", bin), (".idx", idx)] {
            objects.push(Object {
                key: key(suffix),
                size_bytes,
                etag: None,
            });
        }
    } else if let Some(size_bytes) = size(path) {
        objects.push(Object {
            key: key(""),
            size_bytes,
            etag: None,
        });
    } else {
        return Err(missing().into());
    }
    Ok((Access::Local(LocalSource::at(&root)), objects))
}

fn resolve_remote(
    url: &str,
    keys_file: Option<&Path>,
    format: TokenFormatKind,
    opts: &TokenOptions,
) -> Result<(Access, Vec<Object>), TokenError> {
    let listed = |url: &str| -> Result<(Access, Vec<Object>), TokenError> {
        let remote = Arc::new(RemoteSource::open(url, keys_file)?);
        let objects = list(remote.as_ref(), opts)?;
        let files = {
            let mut f = crate::manifest::FileList::new();
            for o in &objects {
                f.push(&o.key, o.size_bytes);
            }
            f
        };
        let tagged = remote.objects_for(&files);
        let objects = objects
            .into_iter()
            .zip(tagged)
            .map(|(o, t)| Object { etag: t.etag, ..o })
            .collect();
        Ok((Access::Remote(remote), objects))
    };
    // A URL that names a directory-like prefix, or a keys file: listed.
    let after_scheme = url.split_once("://").map_or("", |(_, rest)| rest);
    let Some((parent, name)) = url.rsplit_once('/') else {
        return listed(url);
    };
    if keys_file.is_some() || name.is_empty() || !after_scheme.contains('/') {
        return listed(url);
    }
    let parent_source = Arc::new(RemoteSource::open(&format!("{parent}/"), None)?);
    let head = |suffix: &str| -> Option<Object> {
        let key = format!("{name}{suffix}").into_bytes();
        let meta = parent_source.head(&key).ok()?;
        let etag = match meta.version {
            Some(crate::source::VersionTag::ETag(e)) if !e.is_empty() => Some(e.to_string()),
            _ => None,
        };
        Some(Object {
            key,
            size_bytes: meta.size_bytes,
            etag,
        })
    };
    if matches!(format, TokenFormatKind::Auto | TokenFormatKind::Megatron) {
        if let (Some(bin), Some(idx)) = (head(".bin"), head(".idx")) {
            return Ok((Access::Remote(parent_source), vec![bin, idx]));
        }
    }
    if let Some(one) = head("") {
        return Ok((Access::Remote(parent_source), vec![one]));
    }
    listed(url)
}

/// Lists `source` through the manifest cache (when on): its objects, with
/// their sizes, in key order.
fn list(source: &dyn Source, opts: &TokenOptions) -> Result<Vec<Object>, TokenError> {
    let mopts = ManifestOptions {
        record_bytes: None,
        threads: 0,
        progress: opts.progress,
    };
    let manifest = match &opts.manifest_cache {
        Some(cache) => crate::source::build_manifest_cached(source, &mopts, cache, opts.refresh)?.0,
        None => crate::source::build_manifest(source, &mopts)?,
    };
    Ok(manifest
        .files()
        .iter()
        .map(|f| Object {
            key: f.rel_path.as_os_str().as_encoded_bytes().to_vec(),
            size_bytes: f.size_bytes,
            etag: None,
        })
        .collect())
}
