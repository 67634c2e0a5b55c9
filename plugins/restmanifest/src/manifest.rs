//! The source configuration: the API's base URL, the credential, and the
//! manifest of streams, as `manifest.schema.json` describes them; and the
//! checks no JSON Schema can make (unique names, parents that exist and
//! form no cycle, placeholders that match), each naming its JSON pointer.

use std::collections::BTreeMap;
use std::time::Duration;

use connector_sdk::{Error, Placement, Result, Retry, Value};
use serde::Deserialize;

/// Pages one read of a stream fetches at most, unless the manifest says.
pub const DEFAULT_PAGE_LIMIT: u32 = 10_000;

/// Headers a manifest may not set: the host attaches credentials itself.
const RESERVED_HEADERS: &[&str] = &["authorization", "proxy-authorization", "cookie", "host"];

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

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    pub requests_per_second: f64,
}

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

impl Config {
    /// Checks what the schema cannot: the base URL, the placement, the
    /// headers, unique stream names, parents and placeholders.
    pub fn validate(&self) -> Result<()> {
        let invalid = |pointer: &str, message: &str| Err(Error::InvalidConfig(format!("{pointer}: {message}")));
        if !self.base_url.starts_with("https://") {
            return invalid("/base_url", "must be an https URL");
        }
        let host = match connector_sdk::origin::parse(&self.base_url) {
            Ok(origin) => origin.host,
            Err(e) => return invalid("/base_url", &e.to_string()),
        };
        if host.starts_with('[') || host.parse::<std::net::Ipv4Addr>().is_ok() {
            return invalid("/base_url", "must name a host, not an IP address");
        }
        self.placement()?;
        for name in self.manifest.headers.keys() {
            if RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
                return invalid(
                    &format!("/manifest/headers/{name}"),
                    "credentials are attached by the host: name a credential_handle instead",
                );
            }
        }
        let streams = &self.manifest.streams;
        if streams.is_empty() {
            return invalid("/manifest/streams", "names no stream");
        }
        for (i, stream) in streams.iter().enumerate() {
            let at = format!("/manifest/streams/{i}");
            if streams[..i].iter().any(|s| s.name == stream.name) {
                return invalid(&format!("{at}/name"), &format!("stream {} is named twice", stream.name));
            }
            if !stream.path.starts_with('/') {
                return invalid(&format!("{at}/path"), "must start with /");
            }
            let placeholders = placeholders(&stream.path);
            match &stream.parent {
                None if !placeholders.is_empty() => {
                    return invalid(&format!("{at}/path"), "has a {placeholder} but the stream has no parent");
                }
                None => {}
                Some(parent) => {
                    if placeholders != [parent.placeholder.as_str()] {
                        return invalid(
                            &format!("{at}/path"),
                            &format!("must hold {{{}}} once, and no other placeholder", parent.placeholder),
                        );
                    }
                    if !streams.iter().any(|s| s.name == parent.stream) || parent.stream == stream.name {
                        return invalid(
                            &format!("{at}/parent/stream"),
                            &format!("no other stream is named {}", parent.stream),
                        );
                    }
                    // Following parents from here must end at a root.
                    let mut seen = vec![stream.name.as_str()];
                    let mut next = Some(parent.stream.as_str());
                    while let Some(name) = next {
                        if seen.contains(&name) {
                            return invalid(&format!("{at}/parent/stream"), "the parents form a cycle");
                        }
                        seen.push(name);
                        next = streams
                            .iter()
                            .find(|s| s.name == name)
                            .and_then(|s| s.parent.as_ref())
                            .map(|p| p.stream.as_str());
                    }
                }
            }
            if let Paging::PageNumber { size: Some(_), size_param: None, .. } = &stream.paging {
                return invalid(&format!("{at}/paging/size_param"), "a page size needs the parameter that sends it");
            }
        }
        Ok(())
    }

    /// Where the secret goes.
    pub fn placement(&self) -> Result<Placement> {
        let text = self.credential_placement.as_deref().unwrap_or("bearer");
        match text.split_once(':') {
            None if text == "bearer" => Ok(Placement::Bearer),
            Some(("header", name)) if !name.is_empty() => Ok(Placement::Header(name.to_owned())),
            Some(("basic", user)) => Ok(Placement::Basic { username: user.to_owned() }),
            _ => Err(Error::InvalidConfig("/credential_placement: must be bearer, header:NAME or basic:USER".into())),
        }
    }

    /// The stream named `name`.
    pub fn stream(&self, name: &str) -> Result<&StreamSpec> {
        self.manifest.streams.iter().find(|s| s.name == name).ok_or_else(|| Error::unknown_stream(name))
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
    pub fn retry(&self, manifest: &Manifest) -> Retry {
        match self.retry.or(manifest.retry) {
            None => Retry {
                max_retries: default_retries(),
                first_backoff: Duration::from_secs(1),
                max_backoff: Duration::from_secs(30),
                max_total_wait: Duration::from_secs(u64::from(default_wait())),
            },
            Some(policy) => Retry {
                max_retries: policy.max_retries,
                first_backoff: Duration::from_secs(1),
                max_backoff: Duration::from_secs(30),
                max_total_wait: Duration::from_secs(u64::from(policy.max_wait_seconds)),
            },
        }
    }
}

/// The `{name}`s of a path, in order.
fn placeholders(path: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else { break };
        found.push(&rest[open + 1..open + close]);
        rest = &rest[open + close + 1..];
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use connector_sdk::json;

    fn config(manifest: Value) -> Config {
        serde_json::from_value(json!({ "base_url": "https://api.example.com/v1", "manifest": manifest })).unwrap()
    }

    fn problem(manifest: Value) -> String {
        match config(manifest).validate() {
            Err(Error::InvalidConfig(m)) => m,
            other => panic!("expected an invalid config, got {other:?}"),
        }
    }

    #[test]
    fn a_plain_manifest_is_valid() {
        let c = config(json!({ "streams": [
            { "name": "repos", "path": "/repos", "paging": { "type": "link_header" } },
            { "name": "issues", "path": "/repos/{repo}/issues", "parent": { "stream": "repos", "field": "name", "as": "repo" },
              "paging": { "type": "page_number", "param": "page", "size_param": "per_page", "size": 50 } } ] }));
        c.validate().unwrap();
        assert!(matches!(c.manifest.streams[1].paging, Paging::PageNumber { start: 1, size: Some(50), .. }));
    }

    #[test]
    fn what_no_schema_can_check_is_named_by_pointer() {
        assert_eq!(
            problem(json!({ "streams": [{ "name": "a", "path": "/a" }, { "name": "a", "path": "/b" }] })),
            "/manifest/streams/1/name: stream a is named twice"
        );
        assert!(
            problem(json!({ "streams": [{ "name": "a", "path": "/a/{x}" }] })).starts_with("/manifest/streams/0/path")
        );
        assert!(
            problem(json!({ "streams": [{ "name": "a", "path": "/a/{x}", "parent": { "stream": "b", "field": "id", "as": "x" } }] }))
                .starts_with("/manifest/streams/0/parent/stream: no other stream")
        );
        let cycle = json!({ "streams": [
            { "name": "a", "path": "/a/{x}", "parent": { "stream": "b", "field": "id", "as": "x" } },
            { "name": "b", "path": "/b/{y}", "parent": { "stream": "a", "field": "id", "as": "y" } } ] });
        assert!(problem(cycle).ends_with("the parents form a cycle"));
        assert!(
            problem(json!({ "headers": { "Authorization": "Bearer x" }, "streams": [{ "name": "a", "path": "/a" }] }))
                .starts_with("/manifest/headers/Authorization")
        );
    }

    #[test]
    fn base_urls_must_be_https_to_a_named_host() {
        for url in ["http://api.example.com", "https://10.0.0.1/x", "https://[::1]/x", "https:///x"] {
            let c: Config = serde_json::from_value(
                json!({ "base_url": url, "manifest": { "streams": [{ "name": "a", "path": "/a" }] } }),
            )
            .unwrap();
            assert!(c.validate().is_err(), "{url}");
        }
        let c: Config = serde_json::from_value(json!({ "base_url": "https://user@api.example.com/v1",
            "manifest": { "streams": [{ "name": "a", "path": "/a" }] } }))
        .unwrap();
        let refused = c.validate().unwrap_err().to_string();
        assert!(refused.contains("/base_url: the URL carries user-info"), "{refused}");
    }
}
