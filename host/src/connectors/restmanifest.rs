//! `conn_rest_manifest`: the REST API source described by a manifest.
//!
//! The plugin's configuration schema (`plugins/restmanifest/
//! manifest.schema.json`, the same file compiled into the plugin) checks
//! the shape of a manifest; these rules check, when a source is saved,
//! what no schema can: that the base URL's host is one the operator
//! allows, that the credential is bound to it and stored for this
//! connector (a manifest may ask for any path of the host, so a secret
//! meant for another connector is not lent to it), that stream names are
//! unique, that parents exist and form no cycle, and that each child's
//! path holds its placeholder. Every refusal names its JSON pointer, in
//! the same shape as the schema's own errors. The schema is also
//! published in the OpenAPI description ([`openapi_schemas`]).

use std::pin::Pin;

use serde_json::{Value, json};
use url::{Host, Url};

use super::ConnectorRules;
use crate::access::WorkspaceAccess;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::store::credentials::CredentialHandle;

/// The connector these rules are for.
pub const CONNECTOR_ID: &str = "conn_rest_manifest";

/// The published schema of the configuration.
const SCHEMA: &str = include_str!("../../../plugins/restmanifest/manifest.schema.json");

/// The name the configuration's schema has among the OpenAPI components;
/// its definitions are `RestManifest` + their name.
pub const OPENAPI_NAME: &str = "RestManifestConfiguration";

pub(crate) struct Rules;

/// A refusal at a JSON pointer of the configuration, shaped as the
/// schema's own errors are.
fn invalid(pointer: &str, message: impl Into<String>) -> ApiError {
    let message = message.into();
    ApiError::bad_request("CONFIGURATION_INVALID", "the configuration does not match the connector's spec")
        .with_details(json!({ "field": "configuration", "errors": [{ "path": pointer, "message": message }] }))
}

impl ConnectorRules for Rules {
    fn connector_id(&self) -> &'static str {
        CONNECTOR_ID
    }

    fn validate_source<'a>(
        &'a self,
        state: &'a AppState,
        access: &'a WorkspaceAccess,
        config: &'a Value,
        _saved: Option<&'a Value>,
    ) -> Pin<Box<dyn Future<Output = ApiResult<()>> + Send + 'a>> {
        Box::pin(async move {
            let host = base_host(config["base_url"].as_str().unwrap_or_default())?;
            if !state.egress.policy().allowed_hosts.iter().any(|p| p.matches(&host)) {
                return Err(invalid(
                    "/base_url",
                    format!(
                        "{host} is not a host the operator allows connectors to reach (SERVICE_EGRESS_ALLOWED_HOSTS)"
                    ),
                ));
            }
            if let Some(handle) = config["credential_handle"].as_str() {
                let record = state
                    .vault
                    .require_handle(&access.workspace_id, &CredentialHandle::new(handle), Some(&host))
                    .await
                    .map_err(|e| e.at("configuration.credential_handle"))?;
                // A manifest can ask for any path of the host: a secret
                // stored for a compiled connector's few endpoints (or for
                // any connector) is not lent to it.
                if record.connector_id.as_deref() != Some(CONNECTOR_ID) {
                    return Err(invalid(
                        "/credential_handle",
                        format!(
                            "a manifest source takes only a credential stored for {CONNECTOR_ID} (its connector_id)"
                        ),
                    ));
                }
            }
            check_headers(&config["manifest"]["headers"])?;
            check_streams(&config["manifest"]["streams"])
        })
    }
}

/// The host of a base URL that is https, on port 443, names a host (not
/// an address) and carries no user-info, query or fragment.
fn base_host(raw: &str) -> ApiResult<String> {
    let url = Url::parse(raw).map_err(|e| invalid("/base_url", format!("not a URL: {e}")))?;
    if url.scheme() != "https" {
        return Err(invalid("/base_url", "must be an https URL"));
    }
    if url.port().is_some() {
        return Err(invalid("/base_url", "only port 443 is allowed"));
    }
    if !url.username().is_empty() || url.password().is_some() || url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("/base_url", "must carry no user-info, query or fragment"));
    }
    match url.host() {
        Some(Host::Domain(host)) if !host.ends_with('.') => Ok(host.to_ascii_lowercase()),
        Some(Host::Domain(_)) => Err(invalid("/base_url", "the host must not end with a dot")),
        _ => Err(invalid("/base_url", "must name a host, not an IP address")),
    }
}

/// No header that carries credentials (the host attaches those: refused
/// as any secret in a body is, whatever its value looks like), and no
/// `Host`.
fn check_headers(headers: &Value) -> ApiResult<()> {
    for name in headers.as_object().into_iter().flatten().map(|(name, _)| name) {
        let at = format!("/manifest/headers/{}", name.replace('~', "~0").replace('/', "~1"));
        let lower = name.to_ascii_lowercase();
        if ["authorization", "proxy-authorization", "cookie"].contains(&lower.as_str()) {
            return Err(ApiError::secret_refused(&format!("configuration.manifest.headers.{name}")));
        }
        if lower == "host" {
            return Err(invalid(&at, "the host sets Host from the base URL"));
        }
    }
    Ok(())
}

/// Unique names, parents that exist and end at a root, and each path's
/// placeholders matching its parent.
fn check_streams(streams: &Value) -> ApiResult<()> {
    let streams = streams.as_array().map(Vec::as_slice).unwrap_or_default();
    let name = |s: &Value| s["name"].as_str().unwrap_or_default().to_owned();
    for (i, stream) in streams.iter().enumerate() {
        let at = format!("/manifest/streams/{i}");
        let this = name(stream);
        if streams[..i].iter().any(|s| name(s) == this) {
            return Err(invalid(&format!("{at}/name"), format!("stream {this} is named twice")));
        }
        let placeholders = placeholders(stream["path"].as_str().unwrap_or_default());
        let parent = &stream["parent"];
        if parent.is_null() {
            if !placeholders.is_empty() {
                return Err(invalid(&format!("{at}/path"), "has a {placeholder} but the stream has no parent"));
            }
            continue;
        }
        let placeholder = parent["as"].as_str().unwrap_or_default();
        if placeholders != [placeholder] {
            return Err(invalid(
                &format!("{at}/path"),
                format!("must hold {{{placeholder}}} once, and no other placeholder"),
            ));
        }
        let mut seen = vec![this.clone()];
        let mut next = parent["stream"].as_str().map(str::to_owned);
        while let Some(up) = next {
            if seen.contains(&up) {
                return Err(invalid(&format!("{at}/parent/stream"), "the parents form a cycle"));
            }
            let Some(found) = streams.iter().find(|s| name(s) == up) else {
                return Err(invalid(&format!("{at}/parent/stream"), format!("no stream is named {up}")));
            };
            seen.push(up);
            next = found["parent"]["stream"].as_str().map(str::to_owned);
        }
    }
    Ok(())
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

/// The configuration's schema as OpenAPI components: the schema itself
/// under [`OPENAPI_NAME`] and each of its definitions beside it, with the
/// references between them pointing at the components.
pub fn openapi_schemas() -> Vec<(String, Value)> {
    let Ok(mut schema) = serde_json::from_str::<Value>(SCHEMA) else { return Vec::new() };
    let defs = schema.as_object_mut().and_then(|s| s.remove("$defs")).unwrap_or(Value::Null);
    if let Some(s) = schema.as_object_mut() {
        s.remove("$schema");
        s.remove("$id");
    }
    let mut out = vec![(OPENAPI_NAME.to_owned(), schema)];
    for (name, def) in defs.as_object().into_iter().flatten() {
        out.push((def_name(name), def.clone()));
    }
    for (_, schema) in &mut out {
        relink(schema);
    }
    out
}

/// `page_limit` → `RestManifestPageLimit`.
fn def_name(name: &str) -> String {
    let mut out = String::from("RestManifest");
    for word in name.split('_') {
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            out.push(first.to_ascii_uppercase());
            out.push_str(chars.as_str());
        }
    }
    out
}

/// Points every `#/$defs/x` reference at its component.
fn relink(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::String(target)) = map.get_mut("$ref")
                && let Some(name) = target.strip_prefix("#/$defs/")
            {
                *target = format!("#/components/schemas/{}", def_name(name));
            }
            map.values_mut().for_each(relink);
        }
        Value::Array(items) => items.iter_mut().for_each(relink),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_path(e: ApiError) -> String {
        assert_eq!(e.code, "CONFIGURATION_INVALID");
        e.details["errors"][0]["path"].as_str().unwrap().to_owned()
    }

    #[test]
    fn what_no_schema_can_check_is_refused_at_its_pointer() {
        let twice = json!([{ "name": "a", "path": "/a" }, { "name": "a", "path": "/b" }]);
        assert_eq!(error_path(check_streams(&twice).unwrap_err()), "/manifest/streams/1/name");
        let orphan = json!([{ "name": "a", "path": "/a/{x}", "parent": { "stream": "b", "field": "id", "as": "x" } }]);
        assert_eq!(error_path(check_streams(&orphan).unwrap_err()), "/manifest/streams/0/parent/stream");
        let cycle = json!([
            { "name": "a", "path": "/a/{x}", "parent": { "stream": "b", "field": "id", "as": "x" } },
            { "name": "b", "path": "/b/{y}", "parent": { "stream": "a", "field": "id", "as": "y" } }]);
        assert_eq!(error_path(check_streams(&cycle).unwrap_err()), "/manifest/streams/0/parent/stream");
        let wrong = json!([{ "name": "a", "path": "/a" }, { "name": "b", "path": "/b/{z}", "parent": { "stream": "a", "field": "id", "as": "x" } }]);
        assert_eq!(error_path(check_streams(&wrong).unwrap_err()), "/manifest/streams/1/path");
        let fine = json!([{ "name": "a", "path": "/a" }, { "name": "b", "path": "/a/{x}/b", "parent": { "stream": "a", "field": "id", "as": "x" } }]);
        check_streams(&fine).unwrap();
    }

    #[test]
    fn headers_that_carry_credentials_are_the_hosts() {
        // Refused as any secret is, whatever the value looks like.
        let refused = check_headers(&json!({ "Accept": "x", "COOKIE": "a=b" })).unwrap_err();
        assert_eq!(refused.code, "SECRET_NOT_ACCEPTED");
        assert_eq!(refused.details["field"], "configuration.manifest.headers.COOKIE");
        assert_eq!(
            error_path(check_headers(&json!({ "Host": "elsewhere.example" })).unwrap_err()),
            "/manifest/headers/Host"
        );
        check_headers(&json!({ "Accept": "application/json", "X-Api-Version": "2" })).unwrap();
    }

    #[test]
    fn base_urls_name_an_https_host() {
        assert_eq!(base_host("https://API.example.com/v2").unwrap(), "api.example.com");
        for bad in [
            "http://api.example.com",
            "https://10.0.0.1/",
            "https://[::1]/",
            "https://a.example.com:8443/",
            "https://u@a.example.com/",
            "https://a.example.com/?x=1",
        ] {
            assert_eq!(error_path(base_host(bad).unwrap_err()), "/base_url", "{bad}");
        }
    }

    #[test]
    fn the_schema_becomes_components_whose_references_resolve() {
        let schemas = openapi_schemas();
        let names: Vec<&str> = schemas.iter().map(|(n, _)| n.as_str()).collect();
        assert!(
            names.contains(&OPENAPI_NAME)
                && names.contains(&"RestManifestPaging")
                && names.contains(&"RestManifestPageLimit")
        );
        let text = serde_json::to_string(&schemas).unwrap();
        assert!(!text.contains("$defs"), "every reference points at a component");
        for target in text.split("\"#/components/schemas/").skip(1) {
            let name = target.split('"').next().unwrap();
            assert!(names.contains(&name), "{name} is a component");
        }
    }
}
