//! The kind of store a URL names, what to tell a user whose credentials it
//! refused, and where the last store of each kind took its credentials
//! from. Below `store.rs`, `error.rs` and `credentials.rs`, which all name it.

use std::fmt;
use std::sync::Mutex;

/// The kind of store a URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// `s3://` (and S3-compatible servers through `AWS_ENDPOINT_URL`).
    S3,
    /// `gs://`.
    Gcs,
    /// `az://`, `abfs://`, `abfss://`.
    Azure,
    /// `http://`, `https://`.
    Http,
    /// A store handed in by the caller (object_store's in-memory store, tests).
    Custom,
}

impl Scheme {
    /// What to do about a 401/403: names the source of the credentials the
    /// last store of this kind was opened with, when known.
    pub fn permission_fix(self) -> String {
        match source_of(self) {
            Some(source) if self == Scheme::S3 => format!(
                "the credentials from {source} were refused: they may be wrong, expired or \
                 revoked; refresh or fix them there, and check that they grant s3:GetObject and \
                 s3:ListBucket on the bucket"
            ),
            Some(source) => format!(
                "the credentials from {source} were refused: they may be wrong, expired or \
                 revoked; {}",
                self.static_permission_fix()
            ),
            None => self.static_permission_fix().to_string(),
        }
    }

    fn static_permission_fix(self) -> &'static str {
        match self {
            Scheme::S3 => {
                "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary \
                 keys) and that they grant s3:GetObject and s3:ListBucket on the bucket"
            }
            Scheme::Gcs => {
                "check GOOGLE_APPLICATION_CREDENTIALS (or GOOGLE_SERVICE_ACCOUNT) and that the account \
                 has storage.objects.get and storage.objects.list on the bucket"
            }
            Scheme::Azure => {
                "check AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_KEY, or a client id/secret) and \
                 that it has the Storage Blob Data Reader role on the container"
            }
            Scheme::Http => "the server refused: check its access rules for this path",
            Scheme::Custom => "the store refused the credentials it was built with",
        }
    }

    pub(crate) fn env_fix(self) -> &'static str {
        match self {
            Scheme::S3 => "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL (and AWS_ALLOW_HTTP=true for http endpoints)",
            Scheme::Gcs => "GOOGLE_APPLICATION_CREDENTIALS or GOOGLE_SERVICE_ACCOUNT (and GOOGLE_BUCKET)",
            Scheme::Azure => "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_KEY (AZURE_STORAGE_USE_EMULATOR=true for Azurite)",
            Scheme::Http => "the URL",
            Scheme::Custom => "the store's construction",
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scheme::S3 => "s3",
            Scheme::Gcs => "gcs",
            Scheme::Azure => "azure",
            Scheme::Http => "http",
            Scheme::Custom => "custom",
        })
    }
}

/// The source of the credentials the last store of each kind was opened
/// with (S3, GCS, Azure), for the message of a 401/403.
static SOURCES: Mutex<[Option<String>; 3]> = Mutex::new([None, None, None]);

fn slot(scheme: Scheme) -> Option<usize> {
    match scheme {
        Scheme::S3 => Some(0),
        Scheme::Gcs => Some(1),
        Scheme::Azure => Some(2),
        Scheme::Http | Scheme::Custom => None,
    }
}

/// Records where the last store of `scheme` took its credentials from
/// (`credentials::announce`), for the message of a later 401/403.
pub(crate) fn record_source(scheme: Scheme, source: &str) {
    if let Some(i) = slot(scheme) {
        if let Ok(mut sources) = SOURCES.lock() {
            sources[i] = Some(source.to_string());
        }
    }
}

/// The source the last store of this kind was opened with, if any.
pub(crate) fn source_of(scheme: Scheme) -> Option<String> {
    let i = slot(scheme)?;
    SOURCES.lock().ok().and_then(|s| s[i].clone())
}
