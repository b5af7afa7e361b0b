//! Credentials as users hold them, resolved the way each cloud's own CLI
//! resolves them, and named (never shown) in one start line.
//!
//! - S3: the AWS SDK's default chain (`aws-config`): environment, the
//!   profile `AWS_PROFILE` (static keys, `source_profile`/`role_arn`,
//!   `credential_process`, SSO) in `~/.aws/credentials` and `~/.aws/config`,
//!   web identity (EKS IRSA), the container endpoint (ECS task role, EKS Pod
//!   Identity), EC2 instance metadata. It is plugged into object_store
//!   through `AmazonS3Builder::with_credentials`, behind a cache that
//!   refreshes temporary credentials five minutes before they expire.
//! - GCS and Azure: object_store's own chains (docs/remote.md lists them),
//!   plus the Azure CLI (`az login`) where nothing else is configured.
//!
//! The source a store of each kind was opened with is remembered, so that a
//! 401/403 can say whose credentials were refused.

use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use aws_config::default_provider::credentials::DefaultCredentialsChain;
use aws_credential_types::credential_feature::AwsCredentialFeature;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::ProvideCredentials;
use aws_credential_types::Credentials;
use object_store::aws::{AwsCredential, AwsCredentialProvider};
use object_store::CredentialProvider;

use super::error::{with_cause, RemoteError};
use super::scheme::{record_source, Scheme};

/// Longest wait for the first credentials (a `credential_process`, an SSO
/// token exchange, a role assumption, the instance metadata service).
pub const CREDENTIALS_LOAD_TIMEOUT_MS: u64 = 60_000;
/// Temporary credentials are refreshed when they have less than this left.
pub const CREDENTIALS_REFRESH_BEFORE_MS: u64 = 5 * 60_000;

/// What to do when no AWS credentials are found (after "set").
const AWS_NONE_FIX: &str =
    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE=NAME for a \
     profile in ~/.aws/credentials or ~/.aws/config (`aws configure --profile NAME`, or \
     `aws sso login --profile NAME`), or AWS_SKIP_SIGNATURE=true for a public bucket";

/// Records (and logs, once per store) where a store's credentials come from.
pub(crate) fn announce(url: &str, scheme: Scheme, source: &str) {
    tracing::info!("credentials for {url}: {source}");
    record_source(scheme, source);
}

fn env_value(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn env_true(name: &str) -> bool {
    env_value(name).is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// `rel` under the home directory (`crate::home`: HOME, else the password
/// database's), for messages and the presence checks below; None without a
/// home. Never a path relative to the working directory.
fn home_file(rel: &str) -> Option<String> {
    crate::home::file(rel).map(|p| p.display().to_string())
}

/// The AWS profile file `var` names, else `rel` under the home, else words
/// saying it is not read.
fn aws_file(var: &str, rel: &str) -> String {
    env_value(var)
        .filter(|_| !crate::home::blanked(var))
        .or_else(|| home_file(rel))
        .unwrap_or_else(|| format!("~/{rel} (not read: no home directory)"))
}

/// The profile the AWS CLI would use, and its two files.
struct AwsProfile {
    name: String,
    credentials_file: String,
    config_file: String,
}

impl AwsProfile {
    fn from_env() -> AwsProfile {
        AwsProfile {
            name: env_value("AWS_PROFILE").unwrap_or_else(|| "default".to_string()),
            credentials_file: aws_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"),
            config_file: aws_file("AWS_CONFIG_FILE", ".aws/config"),
        }
    }

    /// The file whose section holds the profile (for the start line only):
    /// the credentials file if it has `[NAME]`, else the config file.
    fn file(&self) -> &str {
        let section = format!("[{}]", self.name);
        let in_credentials = std::fs::read_to_string(&self.credentials_file)
            .is_ok_and(|text| text.lines().any(|l| l.trim() == section));
        if in_credentials {
            &self.credentials_file
        } else {
            &self.config_file
        }
    }
}

/// Words for where the AWS chain found its credentials.
fn describe(creds: &Credentials, profile: &AwsProfile) -> String {
    let features = creds
        .get_property::<Vec<AwsCredentialFeature>>()
        .cloned()
        .unwrap_or_default();
    let has = |f: AwsCredentialFeature| features.contains(&f);
    let name = &profile.name;
    if has(AwsCredentialFeature::CredentialsProcess) {
        format!(
            "credential_process of AWS profile '{name}' in {}",
            profile.config_file
        )
    } else if has(AwsCredentialFeature::CredentialsSso) {
        format!(
            "SSO session of AWS profile '{name}' in {}",
            profile.config_file
        )
    } else if has(AwsCredentialFeature::CredentialsProfileStsWebIdToken)
        || has(AwsCredentialFeature::CredentialsStsAssumeRoleWebId)
    {
        "web identity token (AWS_WEB_IDENTITY_TOKEN_FILE, role AWS_ROLE_ARN: EKS IRSA)".to_string()
    } else if has(AwsCredentialFeature::CredentialsStsAssumeRole) {
        format!(
            "role assumed by AWS profile '{name}' in {}",
            profile.config_file
        )
    } else if has(AwsCredentialFeature::CredentialsHttp) {
        "container credentials endpoint (AWS_CONTAINER_CREDENTIALS_*: ECS task role or EKS Pod \
         Identity)"
            .to_string()
    } else if has(AwsCredentialFeature::CredentialsImds) {
        "EC2 instance metadata (the instance role)".to_string()
    } else if has(AwsCredentialFeature::CredentialsEnvVars) {
        "environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)".to_string()
    } else if has(AwsCredentialFeature::CredentialsProfile) {
        format!("AWS profile '{name}' from {}", profile.file())
    } else {
        // Debug of the credentials redacts the secret; the key id is not secret
        // but is not needed either: the provider's name is enough.
        let debug = format!("{creds:?}");
        let provider = debug
            .split("provider_name: \"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .unwrap_or("unknown");
        format!("AWS SDK provider {provider}")
    }
}

/// The runtime the AWS chain runs on: its own, one thread, alive for the
/// process, so that its HTTP connections and sleeps never depend on the
/// runtime (or lack of one) of whoever opened the store.
fn aws_runtime() -> Result<&'static tokio::runtime::Runtime, String> {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("ringfeed-credentials")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the credentials runtime: {e}"))?;
    // A racing caller's runtime is dropped here, unused.
    Ok(RUNTIME.get_or_init(|| rt))
}

/// Runs `fut` on the credentials runtime and waits for it from any thread
/// (inside or outside another runtime).
fn wait_on<T: Send + 'static>(
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T, String> {
    let rt = aws_runtime()?;
    let (tx, rx) = std::sync::mpsc::channel();
    rt.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv_timeout(Duration::from_millis(CREDENTIALS_LOAD_TIMEOUT_MS))
        .map_err(|_| {
            format!(
                "no answer from the AWS credential chain in {} s",
                CREDENTIALS_LOAD_TIMEOUT_MS / 1000
            )
        })
}

/// `t` as `YYYY-MM-DDTHH:MM:SSZ` (UTC), as an `Expiration` is written.
fn utc(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t)
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Words saying when credentials expired, if their expiry has passed:
/// aws-config hands out what a source gave, expired or not (a
/// `credential_process` printing an old `Expiration`, a stale cache file),
/// and a server that does not check (or a clock that is off) would go on.
fn expired(expiry: Option<SystemTime>) -> Option<String> {
    let expiry = expiry?;
    let ago = SystemTime::now().duration_since(expiry).ok()?;
    Some(format!(
        "they expired at {} ({} s ago, by this machine's clock)",
        utc(expiry),
        ago.as_secs()
    ))
}

fn to_object_store(creds: &Credentials) -> Arc<AwsCredential> {
    Arc::new(AwsCredential {
        key_id: creds.access_key_id().to_string(),
        secret_key: creds.secret_access_key().to_string(),
        token: creds.session_token().map(str::to_string),
    })
}

/// Credentials and when they stop being valid (None: never).
type Cached = (Arc<AwsCredential>, Option<SystemTime>);

/// object_store's credential hook over the AWS chain, with a cache.
#[derive(Debug)]
struct AwsChainProvider {
    chain: Arc<DefaultCredentialsChain>,
    cached: RwLock<Cached>,
    refresh: tokio::sync::Mutex<()>,
    source: String,
}

impl AwsChainProvider {
    fn fresh(&self) -> Option<Arc<AwsCredential>> {
        let cached = self.cached.read().ok()?;
        let margin = Duration::from_millis(CREDENTIALS_REFRESH_BEFORE_MS);
        match cached.1 {
            None => Some(Arc::clone(&cached.0)),
            Some(expiry) if expiry > SystemTime::now() + margin => Some(Arc::clone(&cached.0)),
            Some(_) => None,
        }
    }
}

#[async_trait]
impl CredentialProvider for AwsChainProvider {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        if let Some(c) = self.fresh() {
            return Ok(c);
        }
        let _one_refresh = self.refresh.lock().await;
        if let Some(c) = self.fresh() {
            return Ok(c);
        }
        let chain = Arc::clone(&self.chain);
        let loaded = match aws_runtime() {
            Ok(rt) => rt
                .spawn(async move { chain.provide_credentials().await })
                .await
                .map_err(|e| format!("the credentials task failed: {e}")),
            Err(e) => Err(e),
        };
        let fail = |detail: String| object_store::Error::Generic {
            store: "S3",
            source: Box::new(std::io::Error::other(format!(
                "refreshing the AWS credentials from {} failed: {detail}; refresh them (for SSO: \
                 `aws sso login`) or fix the source",
                self.source
            ))),
        };
        match loaded {
            Ok(Ok(creds)) => {
                if let Some(when) = expired(creds.expiry()) {
                    return Err(fail(format!(
                        "the refreshed credentials are no newer: {when}"
                    )));
                }
                let fresh = to_object_store(&creds);
                if let Ok(mut cached) = self.cached.write() {
                    *cached = (Arc::clone(&fresh), creds.expiry());
                }
                Ok(fresh)
            }
            Ok(Err(e)) => {
                // Still valid (inside the refresh margin): keep using it.
                let cached = self.cached.read().ok().map(|c| c.clone());
                match cached {
                    Some((c, Some(expiry))) if expiry > SystemTime::now() => Ok(c),
                    _ => Err(fail(with_cause(&e))),
                }
            }
            Err(e) => Err(fail(e)),
        }
    }
}

/// The S3 credentials the AWS CLI would use, loaded once now (so that a
/// missing or broken source fails before any listing) and refreshed as
/// they near expiry. `Ok(None)`: `AWS_SKIP_SIGNATURE` asks for none.
pub(crate) fn s3_provider(url: &str) -> Result<Option<AwsCredentialProvider>, RemoteError> {
    if env_true("AWS_SKIP_SIGNATURE") {
        announce(
            url,
            Scheme::S3,
            "none (AWS_SKIP_SIGNATURE=true: unsigned requests)",
        );
        return Ok(None);
    }
    let profile = AwsProfile::from_env();
    let failed = |tried: String, detail: String, fix: &str| RemoteError::CredentialSource {
        url: url.to_string(),
        tried,
        detail,
        fix: fix.to_string(),
    };
    let loaded = wait_on(async {
        let chain = DefaultCredentialsChain::builder().build().await;
        let creds = chain.provide_credentials().await;
        (chain, creds)
    })
    .map_err(|e| {
        failed(
            "the AWS credential chain".to_string(),
            e,
            "check that the credential_process, SSO or STS endpoint it uses answers, or set \
             AWS_EC2_METADATA_DISABLED=true off EC2",
        )
    })?;
    let (chain, creds) = loaded;
    let creds = match creds {
        Ok(creds) => creds,
        Err(CredentialsError::CredentialsNotLoaded(_)) => {
            let imds = if env_true("AWS_EC2_METADATA_DISABLED") {
                "EC2 instance metadata (disabled by AWS_EC2_METADATA_DISABLED)"
            } else {
                "EC2 instance metadata (no answer: not on EC2, or no instance role)"
            };
            return Err(RemoteError::MissingCredentials {
                url: url.to_string(),
                reason: format!(
                    "no AWS credentials found; looked, in order, at the environment \
                     (AWS_ACCESS_KEY_ID), profile '{}' in {} and {}, a web identity token \
                     (AWS_WEB_IDENTITY_TOKEN_FILE), the container endpoint \
                     (AWS_CONTAINER_CREDENTIALS_*) and {imds}",
                    profile.name, profile.credentials_file, profile.config_file
                ),
                fix: AWS_NONE_FIX.to_string(),
            });
        }
        Err(e) => {
            return Err(failed(
                format!(
                    "the AWS credential chain (profile '{}' in {} and {}, or the environment)",
                    profile.name, profile.credentials_file, profile.config_file
                ),
                with_cause(&e),
                "fix the profile or run what it needs (`aws sso login --profile NAME` for SSO, \
                 the credential_process command by hand to see its error), or set \
                 AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
            ));
        }
    };
    let source = describe(&creds, &profile);
    if let Some(when) = expired(creds.expiry()) {
        return Err(failed(
            source,
            when,
            "refresh them where they come from (run the credential_process command by hand to see \
             what it prints; `aws sso login --profile NAME` for SSO), check this machine's clock, \
             or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        ));
    }
    announce(url, Scheme::S3, &source);
    Ok(Some(Arc::new(AwsChainProvider {
        chain: Arc::new(chain),
        cached: RwLock::new((to_object_store(&creds), creds.expiry())),
        refresh: tokio::sync::Mutex::new(()),
        source,
    })))
}

/// Where object_store's GCS builder will find credentials, in its order
/// (the start line; nothing is read but the presence of files).
pub(crate) fn gcs_source() -> String {
    if env_true("GOOGLE_SKIP_SIGNATURE") {
        return "none (GOOGLE_SKIP_SIGNATURE=true: unsigned requests)".to_string();
    }
    if env_value("GOOGLE_BEARER_TOKEN").is_some() {
        return "bearer token in GOOGLE_BEARER_TOKEN".to_string();
    }
    if let Some(path) = env_value("GOOGLE_SERVICE_ACCOUNT")
        .or_else(|| env_value("GOOGLE_SERVICE_ACCOUNT_PATH"))
        .or_else(|| env_value("SERVICE_ACCOUNT"))
    {
        return format!("service account key file {path} (GOOGLE_SERVICE_ACCOUNT)");
    }
    if env_value("GOOGLE_SERVICE_ACCOUNT_KEY").is_some() {
        return "service account key in GOOGLE_SERVICE_ACCOUNT_KEY".to_string();
    }
    if let Some(path) = env_value("GOOGLE_APPLICATION_CREDENTIALS") {
        return format!("application default credentials {path} (GOOGLE_APPLICATION_CREDENTIALS)");
    }
    let adc = home_file(".config/gcloud/application_default_credentials.json");
    if let Some(adc) = adc.filter(|f| std::path::Path::new(f).exists()) {
        return format!(
            "application default credentials {adc} (`gcloud auth application-default login`)"
        );
    }
    "GCE metadata server (the VM's service account, or GKE workload identity)".to_string()
}

/// The Azure CLI's profile if `az login` was run (it writes
/// azureProfile.json in `AZURE_CONFIG_DIR`, default `~/.azure`): its path.
fn azure_cli_profile() -> Option<String> {
    let dir = env_value("AZURE_CONFIG_DIR").or_else(|| home_file(".azure"))?;
    let profile = std::path::Path::new(&dir).join("azureProfile.json");
    profile.exists().then(|| profile.display().to_string())
}

/// Where object_store's Azure builder will find credentials, and whether to
/// turn on the Azure CLI: where no key, SAS, token, service principal,
/// workload identity or managed identity endpoint is configured and `az
/// login` was run, the CLI is used (as the Azure SDK's default chain would
/// before probing instance metadata, which is not there off Azure).
pub(crate) fn azure_source() -> (String, bool) {
    // object_store takes this one before its own order (and then ignores the
    // Azure CLI flag): the start line says so, and the CLI is not turned on.
    if let Some(kind) = env_value("AZURE_CREDENTIAL_TYPE").filter(|t| t != "auto") {
        return (format!("AZURE_CREDENTIAL_TYPE={kind}"), false);
    }
    let set = |v: &str| env_value(v).is_some();
    let source = if env_true("AZURE_STORAGE_USE_EMULATOR") {
        "the Azurite emulator's well-known account (AZURE_STORAGE_USE_EMULATOR)"
    } else if set("AZURE_STORAGE_TOKEN") || set("AZURE_STORAGE_BEARER_TOKEN") {
        "bearer token (AZURE_STORAGE_TOKEN)"
    } else if set("AZURE_STORAGE_ACCOUNT_KEY") || set("AZURE_STORAGE_ACCESS_KEY") {
        "account key (AZURE_STORAGE_ACCOUNT_KEY)"
    } else if set("AZURE_FEDERATED_TOKEN_FILE") {
        "workload identity (AZURE_FEDERATED_TOKEN_FILE, AZURE_CLIENT_ID, AZURE_TENANT_ID)"
    } else if set("AZURE_CLIENT_SECRET") || set("AZURE_STORAGE_CLIENT_SECRET") {
        "service principal (AZURE_CLIENT_ID, AZURE_CLIENT_SECRET, AZURE_TENANT_ID)"
    } else if set("AZURE_STORAGE_SAS_KEY") || set("AZURE_STORAGE_SAS_TOKEN") {
        "SAS token (AZURE_STORAGE_SAS_KEY)"
    } else if env_true("AZURE_USE_AZURE_CLI") {
        "Azure CLI (`az account get-access-token`; AZURE_USE_AZURE_CLI)"
    } else if env_true("AZURE_SKIP_SIGNATURE") {
        "none (AZURE_SKIP_SIGNATURE=true: unsigned requests)"
    } else if let Some(profile) = (!set("IDENTITY_ENDPOINT") && !set("AZURE_MSI_ENDPOINT"))
        .then(azure_cli_profile)
        .flatten()
    {
        return (
            format!("Azure CLI login (`az login`, {profile}; `az account get-access-token`)"),
            true,
        );
    } else {
        "managed identity (instance metadata or IDENTITY_ENDPOINT)"
    };
    (source.to_string(), false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expiry_is_written_as_an_rfc3339_utc_time() {
        let at = |secs: u64| utc(SystemTime::UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(978_307_200), "2001-01-01T00:00:00Z");
        assert_eq!(at(951_782_400 + 3_661), "2000-02-29T01:01:01Z");
        assert_eq!(at(4_102_444_799), "2099-12-31T23:59:59Z");
    }

    #[test]
    fn only_an_expiry_in_the_past_is_expired() {
        assert_eq!(expired(None), None);
        let future = SystemTime::now() + Duration::from_secs(3_600);
        assert_eq!(expired(Some(future)), None);
        let past = SystemTime::UNIX_EPOCH + Duration::from_secs(978_307_200);
        let said = expired(Some(past)).unwrap();
        assert!(
            said.starts_with("they expired at 2001-01-01T00:00:00Z ("),
            "{said}"
        );
    }
}
