//! A store from a source URL: which object_store backend, which bucket and
//! prefix, credentials and endpoints from the cloud's usual environment.
//!
//! Two object_store instances are built over the same URL and the same
//! counting HTTP connector: `fetch` with object_store's own retries turned
//! off (the fetch engine retries whole ranges itself, and counts each cause),
//! and `meta` with object_store's default retries, for listing and HEAD.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, RetryConfig};

use super::credentials;
use super::error::RemoteError;
use super::metrics::{CountingConnector, RemoteMetrics};
pub use super::scheme::Scheme;

/// Connect timeout of every request (object_store's default is 5 s).
pub const CONNECT_TIMEOUT_MS: u64 = 5_000;
/// Longest wait for any one read of the socket (reqwest's read timeout):
/// a backstop behind the fetch engine's own stall detector. object_store's
/// default whole-request timeout (30 s, body included) is turned off, since
/// it kills long downloads that are still making progress.
pub const SOCKET_READ_TIMEOUT_MS: u64 = 60_000;
/// Idle connections kept per host for reuse (HTTP/1.1 keep-alive): as many
/// as the largest window, so a full window never reconnects.
pub const POOL_IDLE_PER_HOST_MAX: usize = 1024;

/// A store and the prefix under which a source's objects live.
#[derive(Debug, Clone)]
pub struct StoreHandle {
    /// The source URL, for messages.
    pub display: String,
    /// Which kind of store.
    pub scheme: Scheme,
    /// Reads (no internal retries: the fetch engine retries).
    pub fetch: Arc<dyn ObjectStore>,
    /// Listing and HEAD (object_store's own retries).
    pub meta: Arc<dyn ObjectStore>,
    /// Where the source's keys start; keys are relative to it.
    pub prefix: Path,
    /// For http(s):// sources, the base URL (WebDAV listing goes there),
    /// without `user:password@`.
    pub http_base: Option<String>,
    /// Headers every request of an http(s):// source sends (its URL's
    /// `user:password@` as Basic authentication, marked sensitive).
    pub(crate) http_headers: http::HeaderMap,
    /// Counters every part of the remote engine adds to.
    pub metrics: Arc<RemoteMetrics>,
}

/// A key as the store names it: as is (`Path::parse`), as listings give
/// keys back. `Path::from` would percent-encode every non-ASCII byte, so
/// `é.bin` would be asked for as `%C3%A9.bin`, another key. A key that
/// `parse` refuses (an empty or `..` segment) falls back to `from`.
pub(crate) fn raw_path(key: &str) -> Path {
    Path::parse(key).unwrap_or_else(|_| Path::from(key))
}

impl StoreHandle {
    /// Which store this is for admission (`admission.rs`): its endpoint and
    /// bucket; fetch engines of one key share one controller. A store built
    /// by the caller (`from_store`) is a store of its own.
    pub fn admission_key(&self) -> String {
        let rest = self
            .display
            .split_once("://")
            .map_or(self.display.as_str(), |(_, r)| r);
        let authority = rest.split('/').next().unwrap_or(rest);
        match self.scheme {
            Scheme::Custom => format!("custom#{:p}", Arc::as_ptr(&self.metrics)),
            _ => admission_key(self.scheme, authority),
        }
    }

    /// The full object path of a key relative to the prefix.
    pub fn path_of(&self, key: &str) -> Path {
        if self.prefix.as_ref().is_empty() {
            raw_path(key)
        } else {
            raw_path(&format!("{}/{key}", self.prefix.as_ref()))
        }
    }

    /// A handle over a store built by the caller (object_store's in-memory
    /// store, a fault-injecting wrapper). `store` serves both reads and
    /// listing; its retries are its own.
    pub fn from_store(store: Arc<dyn ObjectStore>, prefix: &str, display: &str) -> StoreHandle {
        StoreHandle {
            display: display.to_string(),
            scheme: Scheme::Custom,
            fetch: Arc::clone(&store),
            meta: store,
            prefix: raw_path(prefix.trim_matches('/')),
            http_base: None,
            http_headers: http::HeaderMap::new(),
            metrics: Arc::new(RemoteMetrics::default()),
        }
    }

    /// Builds the stores a source URL names (see the module docs). Must be
    /// called where a tokio runtime's handle is available if the store's
    /// construction needs one (it does not today).
    ///
    /// The URL is shown and stored only redacted ([`super::redact_url`]);
    /// an http(s) URL's `user:password@` is sent as Basic authentication,
    /// never as part of a request's URL.
    pub fn open(url: &str) -> Result<StoreHandle, RemoteError> {
        super::remember_secrets(url);
        let shown = super::redact_url(url);
        let bad = |reason: &str| RemoteError::BadUrl {
            url: shown.clone(),
            reason: reason.to_string(),
        };
        let (scheme_str, _) = url
            .split_once("://")
            .ok_or_else(|| bad("it has no scheme://"))?;
        let scheme = match scheme_str {
            "s3" | "s3a" => Scheme::S3,
            "gs" => Scheme::Gcs,
            "az" | "abfs" | "abfss" | "azure" => Scheme::Azure,
            "http" | "https" => Scheme::Http,
            other => return Err(bad(&format!("scheme {other:?} is not supported"))),
        };
        let mut http_headers = http::HeaderMap::new();
        let stripped;
        let url = match (scheme, super::redact::split_userinfo(url)) {
            (Scheme::Http, Some(((user, pass), without))) => {
                let mut value =
                    http::HeaderValue::from_str(&super::redact::basic_auth(&user, &pass))
                        .map_err(|_| bad("its user:password@ cannot be sent as a header"))?;
                value.set_sensitive(true);
                http_headers.insert(http::header::AUTHORIZATION, value);
                stripped = without;
                stripped.as_str()
            }
            _ => url,
        };
        let rest = url.split_once("://").map_or("", |(_, r)| r);
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        if authority.is_empty() {
            return Err(bad("it names no bucket, container or host"));
        }
        check_credentials(url, &shown, scheme)?;
        // Credentials as the cloud's CLI would find them (credentials.rs);
        // each store names its source in one start line.
        let mut aws_credentials = None;
        let mut azure_cli = false;
        match scheme {
            Scheme::S3 => aws_credentials = credentials::s3_provider(&shown)?,
            Scheme::Gcs => credentials::announce(&shown, scheme, &credentials::gcs_source()),
            Scheme::Azure => {
                let (source, use_cli) = credentials::azure_source();
                azure_cli = use_cli;
                credentials::announce(&shown, scheme, &source);
            }
            Scheme::Http | Scheme::Custom => {}
        }
        let metrics = Arc::new(RemoteMetrics::default());
        let fetch_retry = RetryConfig {
            max_retries: 0,
            ..RetryConfig::default()
        };
        let recipe = StoreRecipe {
            scheme,
            scheme_str,
            authority,
            url,
            shown: &shown,
            headers: &http_headers,
            aws_credentials: aws_credentials.as_ref(),
            azure_cli,
            metrics: &metrics,
        };
        let fetch = recipe.build(fetch_retry)?;
        let meta = recipe.build(RetryConfig::default())?;
        let (prefix, http_base) = match scheme {
            // The HTTP store is rooted at the URL itself: keys are relative to it.
            Scheme::Http => (Path::default(), Some(http_base_url(url))),
            _ => (raw_path(path.trim_matches('/')), None),
        };
        Ok(StoreHandle {
            display: shown,
            scheme,
            fetch,
            meta,
            prefix,
            http_base,
            http_headers,
            metrics,
        })
    }
}

/// What the stores of one URL are built from (one for fetches, without
/// object_store's retries, one for metadata, with them).
struct StoreRecipe<'a> {
    scheme: Scheme,
    scheme_str: &'a str,
    authority: &'a str,
    /// The URL without its user:password@.
    url: &'a str,
    /// The URL as shown (redacted).
    shown: &'a str,
    headers: &'a http::HeaderMap,
    aws_credentials: Option<&'a object_store::aws::AwsCredentialProvider>,
    azure_cli: bool,
    metrics: &'a Arc<RemoteMetrics>,
}

impl StoreRecipe<'_> {
    /// A store with `retry`.
    fn build(&self, retry: RetryConfig) -> Result<Arc<dyn ObjectStore>, RemoteError> {
        let connector = CountingConnector::new(Arc::clone(self.metrics));
        let options = client_options(self.scheme, self.scheme_str == "http")
            .with_default_headers(self.headers.clone());
        let base = format!("{}://{}", self.scheme_str, self.authority);
        let config_err = |e: object_store::Error| RemoteError::Config {
            url: self.shown.to_string(),
            scheme: self.scheme,
            detail: e.to_string(),
            fix: self.scheme.env_fix(),
        };
        Ok(match self.scheme {
            Scheme::S3 => Arc::new(
                match self.aws_credentials {
                    Some(provider) => {
                        AmazonS3Builder::from_env().with_credentials(Arc::clone(provider))
                    }
                    None => AmazonS3Builder::from_env(),
                }
                .with_url(base)
                .with_client_options(options)
                .with_retry(retry)
                .with_http_connector(connector)
                .build()
                .map_err(config_err)?,
            ),
            Scheme::Gcs => Arc::new(
                GoogleCloudStorageBuilder::from_env()
                    .with_url(base)
                    .with_client_options(options)
                    .with_retry(retry)
                    .with_http_connector(connector)
                    .build()
                    .map_err(config_err)?,
            ),
            Scheme::Azure => Arc::new(
                // Only ever turned on here: AZURE_USE_AZURE_CLI=true stays.
                match self.azure_cli {
                    true => MicrosoftAzureBuilder::from_env().with_use_azure_cli(true),
                    false => MicrosoftAzureBuilder::from_env(),
                }
                .with_url(base)
                .with_client_options(options)
                .with_retry(retry)
                .with_http_connector(connector)
                .build()
                .map_err(config_err)?,
            ),
            Scheme::Http | Scheme::Custom => Arc::new(
                HttpBuilder::new()
                    .with_url(self.url.trim_end_matches('/'))
                    .with_client_options(options)
                    .with_retry(retry)
                    .with_http_connector(connector)
                    .build()
                    .map_err(config_err)?,
            ),
        })
    }
}

/// The store a URL reads for admission: its endpoint (the one object_store
/// would use, from the cloud's variables where they name one) and its
/// bucket, container or host. Credentials never enter it.
fn admission_key(scheme: Scheme, authority: &str) -> String {
    let var = |names: &[&str]| {
        names
            .iter()
            .find_map(|n| std::env::var(n).ok().filter(|v| !v.is_empty()))
            .unwrap_or_default()
    };
    let endpoint = match scheme {
        Scheme::S3 => var(&[
            "AWS_ENDPOINT_URL",
            "AWS_ENDPOINT",
            "AWS_REGION",
            "AWS_DEFAULT_REGION",
        ]),
        Scheme::Gcs => var(&["GOOGLE_CLOUD_STORAGE_ENDPOINT", "GOOGLE_STORAGE_ENDPOINT"]),
        Scheme::Azure => var(&[
            "AZURE_STORAGE_ENDPOINT",
            "AZURE_ENDPOINT",
            "AZURE_STORAGE_ACCOUNT_NAME",
        ]),
        Scheme::Http | Scheme::Custom => String::new(),
    };
    // A URL shown keeps a redacted user:password@: the host and port only.
    let bucket = authority.rsplit('@').next().unwrap_or(authority);
    format!("{scheme}://{endpoint}/{bucket}")
}

/// The URL with exactly one trailing slash (the HTTP store's root).
fn http_base_url(url: &str) -> String {
    format!("{}/", url.trim_end_matches('/'))
}

/// The client settings of the cloud's environment (`AWS_ALLOW_HTTP`,
/// `AZURE_ALLOW_HTTP`, proxies, ...), which a builder's `from_env` would
/// read but `with_client_options` replaces; then timeouts for long bodies:
/// connect and per-read limits, no whole-request limit; HTTP/1.1 with a
/// pool as large as the window.
fn client_options(scheme: Scheme, allow_http: bool) -> ClientOptions {
    let env_prefix = match scheme {
        Scheme::S3 => Some("AWS_"),
        Scheme::Gcs => Some("GOOGLE_"),
        Scheme::Azure => Some("AZURE_"),
        Scheme::Http | Scheme::Custom => None,
    };
    let mut options = ClientOptions::new();
    if let Some(prefix) = env_prefix {
        for (k, v) in std::env::vars() {
            let Some(name) = k.strip_prefix(prefix) else {
                continue;
            };
            if let Ok(key) = name
                .to_ascii_lowercase()
                .parse::<object_store::ClientConfigKey>()
            {
                options = options.with_config(key, v);
            }
        }
    }
    let options = options
        .with_timeout_disabled()
        .with_connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
        .with_read_timeout(Duration::from_millis(SOCKET_READ_TIMEOUT_MS))
        .with_pool_max_idle_per_host(POOL_IDLE_PER_HOST_MAX)
        .with_http1_only();
    if allow_http {
        options.with_allow_http(true)
    } else {
        options
    }
}

fn env_set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty())
}

fn env_true(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// Fails early, naming the variable, where the environment holds half a
/// key or an http endpoint not allowed (a missing credential source is
/// found by the AWS chain in credentials.rs). `shown`: the URL redacted.
fn check_credentials(url: &str, shown: &str, scheme: Scheme) -> Result<(), RemoteError> {
    let missing = |reason: &str, fix: &str| {
        Err(RemoteError::MissingCredentials {
            url: shown.to_string(),
            reason: reason.to_string(),
            fix: fix.to_string(),
        })
    };
    match scheme {
        Scheme::S3 => {
            let has_key = env_set("AWS_ACCESS_KEY_ID");
            if has_key && !env_set("AWS_SECRET_ACCESS_KEY") {
                return missing(
                    "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not",
                    "AWS_SECRET_ACCESS_KEY",
                );
            }
            if let Ok(endpoint) = std::env::var("AWS_ENDPOINT_URL") {
                if endpoint.starts_with("http://") && !env_true("AWS_ALLOW_HTTP") {
                    return missing(
                        &format!("AWS_ENDPOINT_URL={endpoint} is plain http"),
                        "AWS_ALLOW_HTTP=true (or use an https endpoint)",
                    );
                }
            }
            Ok(())
        }
        Scheme::Azure => {
            if !env_set("AZURE_STORAGE_ACCOUNT_NAME")
                && !url.contains('@')
                && !env_true("AZURE_STORAGE_USE_EMULATOR")
            {
                return missing(
                    "no Azure storage account is named",
                    "AZURE_STORAGE_ACCOUNT_NAME (or use abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/)",
                );
            }
            Ok(())
        }
        Scheme::Gcs | Scheme::Http | Scheme::Custom => Ok(()),
    }
}
