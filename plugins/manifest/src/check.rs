//! What a manifest must satisfy beyond its schema.
//!
//! The base URL is https to a named host on port 443, with no user-info,
//! query or fragment (the paths are the streams'); the credential's
//! placement is one the host knows; no header is one only the host sets;
//! stream names are unique; each parent exists and following parents ends
//! at a root; each path holds exactly its parent's placeholder; a page size
//! has a parameter to send it in. Each refusal is a [`Problem`] at the JSON
//! pointer of the value, relative to the configuration.

use connector_rules::{headers, origin};

use crate::{Config, CredentialPlacement, Paging};

/// Why a manifest is refused, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The JSON pointer of the refused value, e.g. `/manifest/streams/1/name`.
    pub pointer: String,
    /// What is wrong, for the person who wrote it.
    pub message: String,
    /// What kind of refusal this is.
    pub kind: ProblemKind,
}

/// What kind of refusal a [`Problem`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// The value does not fit the manifest's rules.
    Invalid,
    /// A header that carries credentials: whatever its value, it is
    /// treated as a secret written where none belongs (the host attaches
    /// credentials itself).
    CredentialHeader,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.pointer, self.message)
    }
}

impl std::error::Error for Problem {}

fn invalid<T>(pointer: impl Into<String>, message: impl Into<String>) -> Result<T, Problem> {
    Err(Problem { pointer: pointer.into(), message: message.into(), kind: ProblemKind::Invalid })
}

/// `name` as one JSON pointer token.
fn token(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

impl Config {
    /// Checks what the schema cannot (see the [module](self)).
    pub fn validate(&self) -> Result<(), Problem> {
        self.base_host()?;
        self.placement()?;
        for name in self.manifest.headers.keys() {
            let at = format!("/manifest/headers/{}", token(name));
            if headers::carries_credentials(name) {
                return Err(Problem {
                    pointer: at,
                    message: "credentials are attached by the host: name a credential_handle instead".into(),
                    kind: ProblemKind::CredentialHeader,
                });
            }
            if headers::is_reserved(name) {
                return invalid(at, "the host sets Host from the base URL");
            }
        }
        self.check_streams()
    }

    /// The host of the base URL, lower case, when the URL is https to a
    /// named host on port 443 with no user-info, query or fragment.
    pub fn base_host(&self) -> Result<String, Problem> {
        let url = self.base_url.as_str();
        let origin = origin::parse(url).map_err(|e| Problem {
            pointer: "/base_url".into(),
            message: match e {
                origin::OriginError::NotHttps => "must be an https URL".into(),
                other => other.to_string(),
            },
            kind: ProblemKind::Invalid,
        })?;
        if origin.port.is_some() {
            return invalid("/base_url", "only port 443 is allowed");
        }
        if url.contains(['?', '#']) {
            return invalid("/base_url", "must carry no user-info, query or fragment");
        }
        let host = origin.host;
        if host.starts_with('[') || host.parse::<std::net::Ipv4Addr>().is_ok() {
            return invalid("/base_url", "must name a host, not an IP address");
        }
        if host.ends_with('.') {
            return invalid("/base_url", "the host must not end with a dot");
        }
        Ok(host)
    }

    /// Where the secret goes (`credential_placement`, `bearer` when unset).
    pub fn placement(&self) -> Result<CredentialPlacement, Problem> {
        let text = self.credential_placement.as_deref().unwrap_or("bearer");
        match text.split_once(':') {
            None if text == "bearer" => Ok(CredentialPlacement::Bearer),
            None if text == "as-stored" => Ok(CredentialPlacement::AsStored),
            Some(("header", name)) if !name.is_empty() => Ok(CredentialPlacement::Header(name.to_owned())),
            Some(("basic", user)) => Ok(CredentialPlacement::Basic { username: user.to_owned() }),
            Some(("query", name)) if !name.is_empty() => Ok(CredentialPlacement::Query(name.to_owned())),
            _ => invalid("/credential_placement", "must be bearer, header:NAME, basic:USER, query:NAME or as-stored"),
        }
    }

    fn check_streams(&self) -> Result<(), Problem> {
        let streams = &self.manifest.streams;
        if streams.is_empty() {
            return invalid("/manifest/streams", "names no stream");
        }
        for (i, stream) in streams.iter().enumerate() {
            let at = format!("/manifest/streams/{i}");
            if streams[..i].iter().any(|s| s.name == stream.name) {
                return invalid(format!("{at}/name"), format!("stream {} is named twice", stream.name));
            }
            if !stream.path.starts_with('/') {
                return invalid(format!("{at}/path"), "must start with /");
            }
            let placeholders = placeholders(&stream.path);
            match &stream.parent {
                None if !placeholders.is_empty() => {
                    return invalid(format!("{at}/path"), "has a {placeholder} but the stream has no parent");
                }
                None => {}
                Some(parent) => {
                    if placeholders != [parent.placeholder.as_str()] {
                        return invalid(
                            format!("{at}/path"),
                            format!("must hold {{{}}} once, and no other placeholder", parent.placeholder),
                        );
                    }
                    if parent.stream == stream.name || !streams.iter().any(|s| s.name == parent.stream) {
                        return invalid(
                            format!("{at}/parent/stream"),
                            format!("no other stream is named {}", parent.stream),
                        );
                    }
                    // Following parents from here must end at a root.
                    let mut seen = vec![stream.name.as_str()];
                    let mut next = Some(parent.stream.as_str());
                    while let Some(name) = next {
                        if seen.contains(&name) {
                            return invalid(format!("{at}/parent/stream"), "the parents form a cycle");
                        }
                        seen.push(name);
                        next = self.stream(name).and_then(|s| s.parent.as_ref()).map(|p| p.stream.as_str());
                    }
                }
            }
            if stream.body.as_ref().is_some_and(|body| !body.is_object()) {
                return invalid(format!("{at}/body"), "must be a JSON object");
            }
            if let Paging::PageNumber { size: Some(_), size_param: None, .. } = &stream.paging {
                return invalid(format!("{at}/paging/size_param"), "a page size needs the parameter that sends it");
            }
        }
        Ok(())
    }
}

/// The `{name}`s of a path, in order.
pub fn placeholders(path: &str) -> Vec<&str> {
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
    use serde_json::{Value, json};

    use super::*;

    fn config(manifest: Value) -> Config {
        serde_json::from_value(json!({ "base_url": "https://api.example.com/v1", "manifest": manifest })).unwrap()
    }

    fn problem(manifest: Value) -> Problem {
        config(manifest).validate().unwrap_err()
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
        let twice = problem(json!({ "streams": [{ "name": "a", "path": "/a" }, { "name": "a", "path": "/b" }] }));
        assert_eq!(twice.to_string(), "/manifest/streams/1/name: stream a is named twice");
        assert_eq!(
            problem(json!({ "streams": [{ "name": "a", "path": "/a/{x}" }] })).pointer,
            "/manifest/streams/0/path"
        );
        let orphan = problem(
            json!({ "streams": [{ "name": "a", "path": "/a/{x}", "parent": { "stream": "b", "field": "id", "as": "x" } }] }),
        );
        assert!(orphan.to_string().starts_with("/manifest/streams/0/parent/stream: no other stream"), "{orphan}");
        let cycle = json!({ "streams": [
            { "name": "a", "path": "/a/{x}", "parent": { "stream": "b", "field": "id", "as": "x" } },
            { "name": "b", "path": "/b/{y}", "parent": { "stream": "a", "field": "id", "as": "y" } } ] });
        assert!(problem(cycle).to_string().ends_with("the parents form a cycle"));
        let wrong = json!({ "streams": [{ "name": "a", "path": "/a" },
            { "name": "b", "path": "/b/{z}", "parent": { "stream": "a", "field": "id", "as": "x" } }] });
        assert_eq!(problem(wrong).pointer, "/manifest/streams/1/path");
        let size = json!({ "streams": [{ "name": "a", "path": "/a", "paging": { "type": "page_number", "param": "p", "size": 5 } }] });
        assert_eq!(problem(size).pointer, "/manifest/streams/0/paging/size_param");
        let body = json!({ "streams": [{ "name": "a", "path": "/a", "body": ["not", "an", "object"] }] });
        assert_eq!(problem(body).to_string(), "/manifest/streams/0/body: must be a JSON object");
        assert_eq!(problem(json!({ "streams": [] })).pointer, "/manifest/streams");
    }

    #[test]
    fn headers_only_the_host_sets_are_refused() {
        for name in ["Authorization", "COOKIE", "proxy-authorization"] {
            let refused = problem(json!({ "headers": { name: "x" }, "streams": [{ "name": "a", "path": "/a" }] }));
            assert_eq!(
                (refused.pointer.as_str(), refused.kind),
                (&*format!("/manifest/headers/{name}"), ProblemKind::CredentialHeader)
            );
        }
        let host =
            problem(json!({ "headers": { "Host": "elsewhere.example" }, "streams": [{ "name": "a", "path": "/a" }] }));
        assert_eq!((host.pointer.as_str(), host.kind), ("/manifest/headers/Host", ProblemKind::Invalid));
        config(json!({ "headers": { "Accept": "application/json", "X-Api-Version": "2" }, "streams": [{ "name": "a", "path": "/a" }] }))
            .validate()
            .unwrap();
    }

    #[test]
    fn base_urls_name_an_https_host_on_443() {
        let with = |url: &str| -> Config {
            serde_json::from_value(
                json!({ "base_url": url, "manifest": { "streams": [{ "name": "a", "path": "/a" }] } }),
            )
            .unwrap()
        };
        assert_eq!(with("https://API.example.com/v2").base_host().unwrap(), "api.example.com");
        assert_eq!(with("https://api.example.com:443/v2").base_host().unwrap(), "api.example.com");
        for bad in [
            "http://api.example.com",
            "https://10.0.0.1/",
            "https://[::1]/",
            "https:///x",
            "https://a.example.com:8443/",
            "https://u@a.example.com/",
            "https://a.example.com/?x=1",
            "https://a.example.com/#top",
            "https://a.example.com./",
        ] {
            let refused = with(bad).validate().unwrap_err();
            assert_eq!(refused.pointer, "/base_url", "{bad}");
        }
        let user = with("https://user@api.example.com/v1").validate().unwrap_err().to_string();
        assert!(user.contains("/base_url: the URL carries user-info"), "{user}");
    }

    #[test]
    fn placements_the_host_knows() {
        let with = |placement: &str| -> Result<CredentialPlacement, Problem> {
            let mut c = config(json!({ "streams": [{ "name": "a", "path": "/a" }] }));
            c.credential_placement = Some(placement.into());
            c.placement()
        };
        assert_eq!(with("bearer"), Ok(CredentialPlacement::Bearer));
        assert_eq!(with("header:X-Key"), Ok(CredentialPlacement::Header("X-Key".into())));
        assert_eq!(with("basic:me"), Ok(CredentialPlacement::Basic { username: "me".into() }));
        assert_eq!(with("query:api_key"), Ok(CredentialPlacement::Query("api_key".into())));
        assert_eq!(with("as-stored"), Ok(CredentialPlacement::AsStored));
        for bad in ["header:", "token", "Bearer"] {
            assert_eq!(with(bad).unwrap_err().pointer, "/credential_placement", "{bad}");
        }
    }

    #[test]
    fn the_published_schema_is_json() {
        let schema: Value = serde_json::from_str(crate::SCHEMA).unwrap();
        assert!(schema["$defs"].is_object());
    }
}
