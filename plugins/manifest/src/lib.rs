//! The REST API manifest (`conn_rest_manifest`'s configuration), written
//! once for the server and the plugin.
//!
//! The server checks a manifest when a source is saved and publishes its
//! schema; the plugin interprets it inside the sandbox. Both read it with
//! these types and refuse it with these checks, so a manifest the server
//! accepts is one the plugin runs, and a refusal names the same JSON
//! pointer on both sides. What only the server can know (the hosts the
//! operator allows, the credentials a workspace holds) stays in the
//! server.
//!
//! # Layout
//!
//! | module | holds |
//! |---|---|
//! | this file | the configuration's types and [`SCHEMA`] |
//! | [`check`] | what no JSON Schema can check, each refusal a [`Problem`] at a JSON pointer |

pub mod check;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

pub use check::{Problem, ProblemKind};

/// The published JSON Schema of a source's configuration.
pub const SCHEMA: &str = include_str!("../manifest.schema.json");

/// Pages one read of a stream fetches at most, unless the manifest says.
pub const DEFAULT_PAGE_LIMIT: u32 = 10_000;

/// What a source of this connector is configured with.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub base_url: String,
    #[serde(default)]
    pub credential_handle: Option<String>,
    #[serde(default)]
    pub credential_placement: Option<String>,
    pub manifest: Manifest,
}

/// The streams and what they share.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub page_limit: Option<u32>,
    #[serde(default)]
    pub rate_limit: Option<RateLimit>,
    #[serde(default)]
    pub retry: Option<RetryPolicy>,
    pub streams: Vec<StreamSpec>,
}

/// One stream of the manifest.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamSpec {
    pub name: String,
    pub path: String,
    #[serde(default)]
    pub params: BTreeMap<String, Value>,
    /// A JSON object: the stream's requests are `POST`s carrying it (a
    /// search API), paging and the incremental parameter still in the
    /// query. A credential stored for a body field goes into it.
    #[serde(default)]
    pub body: Option<Value>,
    #[serde(default)]
    pub records: String,
    #[serde(default)]
    pub primary_key: Vec<String>,
    #[serde(default)]
    pub paging: Paging,
    #[serde(default)]
    pub incremental: Option<Incremental>,
    #[serde(default)]
    pub parent: Option<Parent>,
    #[serde(default)]
    pub schema: Option<Value>,
    #[serde(default)]
    pub page_limit: Option<u32>,
    #[serde(default)]
    pub rate_limit: Option<RateLimit>,
    #[serde(default)]
    pub retry: Option<RetryPolicy>,
}

/// How the next page is found.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Paging {
    #[default]
    None,
    PageNumber {
        param: String,
        #[serde(default = "first_page")]
        start: u64,
        #[serde(default)]
        size_param: Option<String>,
        #[serde(default)]
        size: Option<u32>,
        #[serde(default)]
        total_pages: Option<String>,
    },
    Offset {
        offset_param: String,
        limit_param: String,
        limit: u32,
        #[serde(default)]
        total: Option<String>,
    },
    Cursor {
        param: String,
        next_cursor: String,
    },
    LinkHeader,
    NextUrl {
        next_url: String,
    },
}

fn first_page() -> u64 {
    1
}

/// An incremental stream's cursor.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Incremental {
    pub cursor_field: String,
    #[serde(default)]
    pub param: Option<String>,
    #[serde(default)]
    pub format: CursorFormat,
    #[serde(default)]
    pub start: Option<Value>,
    /// The API answers in ascending order of the cursor: each page's
    /// newest value is saved as the read goes (so a host writes as it
    /// reads), and a record older than one before it fails the read.
    #[serde(default)]
    pub sorted: bool,
}

/// How a cursor is written into a request parameter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CursorFormat {
    #[default]
    Raw,
    Rfc3339,
    Unix,
    UnixMs,
    Date,
}

/// A child stream's parent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parent {
    pub stream: String,
    pub field: String,
    #[serde(rename = "as")]
    pub placeholder: String,
}

/// The most requests a stream sends per second.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    pub requests_per_second: f64,
}

/// The manifest's retry policy (see [`StreamSpec::retrying`]).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    #[serde(default = "default_retries")]
    pub max_retries: u32,
    #[serde(default = "default_wait")]
    pub max_wait_seconds: u32,
}

fn default_retries() -> u32 {
    4
}

fn default_wait() -> u32 {
    60
}

/// Where the host puts the secret of the source's credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialPlacement {
    /// `Authorization: Bearer <secret>` (`bearer`, the default).
    Bearer,
    /// The secret as the value of one header (`header:NAME`).
    Header(String),
    /// HTTP Basic with this username and the secret as the password
    /// (`basic:USER`).
    Basic {
        /// The username sent beside the secret.
        username: String,
    },
    /// The secret as the value of one query parameter (`query:NAME`),
    /// added by the host to the URL it sends.
    Query(String),
    /// Wherever the credential was stored for (`as-stored`): the only
    /// placement of a credential that signs requests.
    AsStored,
}

/// How a stream's requests are retried: the manifest's policy, or the
/// default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retrying {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// The first wait between attempts.
    pub first_backoff: Duration,
    /// The longest wait between attempts.
    pub max_backoff: Duration,
    /// All waits of one request together.
    pub max_total_wait: Duration,
}

impl Config {
    /// The stream named `name`.
    pub fn stream(&self, name: &str) -> Option<&StreamSpec> {
        self.manifest.streams.iter().find(|s| s.name == name)
    }
}

impl StreamSpec {
    /// The page limit of this stream's reads.
    pub fn page_limit(&self, manifest: &Manifest) -> u32 {
        self.page_limit.or(manifest.page_limit).unwrap_or(DEFAULT_PAGE_LIMIT)
    }

    /// The smallest time between two requests of this stream.
    pub fn interval(&self, manifest: &Manifest) -> Option<Duration> {
        let rate = self.rate_limit.or(manifest.rate_limit)?;
        Duration::try_from_secs_f64(1.0 / rate.requests_per_second).ok()
    }

    /// How this stream's requests are retried.
    pub fn retrying(&self, manifest: &Manifest) -> Retrying {
        let policy = self.retry.or(manifest.retry);
        Retrying {
            max_retries: policy.map_or(default_retries(), |p| p.max_retries),
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            max_total_wait: Duration::from_secs(u64::from(policy.map_or(default_wait(), |p| p.max_wait_seconds))),
        }
    }
}
