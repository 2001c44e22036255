//! Where the stores are and who we are to them, the AWS way, for the whole
//! process.
//!
//! S3: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//! `AWS_REGION` (or `AWS_DEFAULT_REGION`), `AWS_ENDPOINT_URL_S3` or
//! `AWS_ENDPOINT_URL`, then the profile `AWS_PROFILE` (else `default`) of
//! `~/.aws/credentials` and `~/.aws/config` (or `AWS_SHARED_CREDENTIALS_FILE`
//! and `AWS_CONFIG_FILE`) for what the variables leave unset, then the
//! flags (`--endpoint-url`, `--region`, `--no-sign-request`) over both.
//! A custom endpoint is addressed path-style (`ENDPOINT/BUCKET/KEY`), as
//! the S3-compatible servers expect.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::http::HttpBuilder;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};

use super::error::RemoteError;

/// The flags every command that reads URLs takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreOptions {
    /// `--endpoint-url`: an S3-compatible server, over the variables.
    pub endpoint_url: Option<String>,
    /// `--region`, over `AWS_REGION`.
    pub region: Option<String>,
    /// `--no-sign-request`: anonymous requests, for public buckets.
    pub no_sign_request: bool,
}

/// A request that gets no answer within this fails (and is retried).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A connection not made within this fails (and is retried).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Retries of a failed request (5xx, `SlowDown`, a dropped connection):
/// at most this many, with jittered exponential backoff…
pub const MAX_RETRIES: usize = 4;
/// …and never past this long after the first try.
pub const RETRY_WINDOW: Duration = Duration::from_secs(20);

static OPTIONS: OnceLock<StoreOptions> = OnceLock::new();

/// Sets this process's options (once, at start-up; later calls are
/// ignored). Without a call, the variables and profile files alone apply.
pub fn configure(options: StoreOptions) {
    let _ = OPTIONS.set(options);
}

fn options() -> &'static StoreOptions {
    OPTIONS.get_or_init(StoreOptions::default)
}

fn client_options() -> ClientOptions {
    ClientOptions::new()
        .with_timeout(REQUEST_TIMEOUT)
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_allow_http(true)
}

fn retry() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: MAX_RETRIES,
        retry_timeout: RETRY_WINDOW,
    }
}

/// One client per bucket or web origin, shared by every object of it (the
/// connection pool and the credentials are the client's).
type Stores = Mutex<HashMap<String, Arc<dyn ObjectStore>>>;

fn stores() -> &'static Stores {
    static STORES: OnceLock<Stores> = OnceLock::new();
    STORES.get_or_init(Default::default)
}

/// The S3 client for `bucket`.
pub(crate) fn s3(bucket: &str, url: &str) -> Result<Arc<dyn ObjectStore>, RemoteError> {
    cached(&format!("s3://{bucket}"), || {
        let mut builder = AmazonS3Builder::new().with_bucket_name(bucket);
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let profile = Profile::load(&env("AWS_PROFILE").unwrap_or_else(|| "default".into()));
        let pick = |vars: &[&str], key: &str| {
            vars.iter()
                .find_map(|v| env(v))
                .or_else(|| profile.get(key).map(str::to_string))
        };
        let o = options();
        let access = pick(&["AWS_ACCESS_KEY_ID"], "aws_access_key_id");
        let secret = pick(&["AWS_SECRET_ACCESS_KEY"], "aws_secret_access_key");
        let token = pick(&["AWS_SESSION_TOKEN"], "aws_session_token");
        let region = o
            .region
            .clone()
            .or_else(|| pick(&["AWS_REGION", "AWS_DEFAULT_REGION"], "region"))
            .unwrap_or_else(|| "us-east-1".to_string());
        let endpoint = o
            .endpoint_url
            .clone()
            .or_else(|| pick(&["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"], "endpoint_url"));
        builder = builder.with_region(region);
        if let Some(endpoint) = endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_virtual_hosted_style_request(false);
        }
        if o.no_sign_request {
            builder = builder.with_skip_signature(true);
        } else if let (Some(access), Some(secret)) = (access, secret) {
            builder = builder
                .with_access_key_id(access)
                .with_secret_access_key(secret);
            if let Some(token) = token {
                builder = builder.with_token(token);
            }
        } else if env("AWS_EC2_METADATA_DISABLED").as_deref() != Some("false") {
            // Without keys, the client would ask the instance metadata
            // service, which off EC2 costs a time-out before a vague
            // error: it is asked only where the user says it is there.
            return Err(RemoteError::NoCredentials {
                url: url.to_string(),
            });
        }
        built(
            builder
                .with_client_options(client_options())
                .with_retry(retry())
                .build(),
            url,
            "S3",
        )
    })
}

/// The HTTP client for the origin (`scheme://host:port`) of `url`.
pub(crate) fn http(url: &url::Url) -> Result<Arc<dyn ObjectStore>, RemoteError> {
    let origin = url.origin().ascii_serialization();
    cached(&origin, || {
        built(
            HttpBuilder::new()
                .with_url(origin.clone())
                .with_client_options(client_options())
                .with_retry(retry())
                .build(),
            url.as_str(),
            "HTTP",
        )
    })
}

/// A built client as the shared store, or why it could not be built.
fn built<S: ObjectStore>(
    store: object_store::Result<S>,
    url: &str,
    kind: &str,
) -> Result<Arc<dyn ObjectStore>, RemoteError> {
    store
        .map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
        .map_err(|e| RemoteError::Request {
            url: url.to_string(),
            reason: format!("cannot set up the {kind} client: {e}"),
        })
}

fn cached(
    key: &str,
    make: impl FnOnce() -> Result<Arc<dyn ObjectStore>, RemoteError>,
) -> Result<Arc<dyn ObjectStore>, RemoteError> {
    let mut stores = stores().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(store) = stores.get(key) {
        return Ok(Arc::clone(store));
    }
    let store = make()?;
    stores.insert(key.to_string(), Arc::clone(&store));
    Ok(store)
}

/// The keys of one profile in the shared credentials and config files.
#[derive(Debug, Default)]
struct Profile(HashMap<String, String>);

impl Profile {
    fn load(name: &str) -> Profile {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let file = |var: &str, default: &str| {
            std::env::var_os(var)
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(".aws").join(default)))
        };
        let mut keys = HashMap::new();
        // The config file names a profile `[profile NAME]` (but `[default]`);
        // the credentials file `[NAME]`. Credentials win where both set a key.
        let config_section = if name == "default" {
            "default".to_string()
        } else {
            format!("profile {name}")
        };
        for (path, section) in [
            (file("AWS_CONFIG_FILE", "config"), config_section.as_str()),
            (file("AWS_SHARED_CREDENTIALS_FILE", "credentials"), name),
        ] {
            // A profile file is small; one that cannot be read holds nothing.
            let Some(text) = path
                .and_then(|p| crate::regular_file::open(&p).ok())
                .and_then(|f| {
                    use std::io::Read;
                    let mut s = String::new();
                    f.take(1 << 20).read_to_string(&mut s).ok().map(|_| s)
                })
            else {
                continue;
            };
            keys.extend(ini_section(&text, section));
        }
        Profile(keys)
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// `key = value` pairs of `[section]` in an INI text (keys lowercased).
fn ini_section(text: &str, section: &str) -> Vec<(String, String)> {
    let mut inside = false;
    let mut pairs = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == section;
            continue;
        }
        if inside {
            if let Some((k, v)) = line.split_once('=') {
                pairs.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_sections() {
        let text = "[default]\nregion = eu-west-1\n\n[profile lab]\n# note\nregion=us-east-2\nendpoint_url = http://127.0.0.1:9000\n[other]\nregion = x\n";
        let lab: HashMap<_, _> = ini_section(text, "profile lab").into_iter().collect();
        assert_eq!(lab["region"], "us-east-2");
        assert_eq!(lab["endpoint_url"], "http://127.0.0.1:9000");
        let default: HashMap<_, _> = ini_section(text, "default").into_iter().collect();
        assert_eq!(default.len(), 1);
        assert_eq!(default["region"], "eu-west-1");
    }
}
