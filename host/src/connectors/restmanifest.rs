//! `conn_rest_manifest`: the REST API source described by a manifest.
//!
//! The manifest's own rules (its types, its published schema and the
//! checks no schema can make: an https base URL to a named host, headers
//! only the host sets, unique stream names, parents that exist and form no
//! cycle, placeholders that match) are the shared `service-rest-manifest`
//! crate's, the very code the plugin runs. These rules add, when a source
//! is saved, what only the server knows: that the base URL's host is one
//! the operator allows, and that the credential is bound to it and stored
//! for this connector (a manifest may ask for any path of the host, so a
//! secret meant for another connector is not lent to it). Every refusal
//! names its JSON pointer, in the same shape as the schema's own errors.
//! The schema is also published in the OpenAPI description
//! ([`openapi_schemas`]).

use std::pin::Pin;

use rest_manifest::{Problem, ProblemKind};
use serde_json::Value;

use super::{ConnectorRules, invalid};
use crate::access::WorkspaceAccess;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::store::credentials::CredentialHandle;

/// The connector these rules are for.
pub(crate) const CONNECTOR_ID: &str = "conn_rest_manifest";

/// The name the configuration's schema has among the OpenAPI components;
/// its definitions are `RestManifest` + their name.
pub(crate) const OPENAPI_NAME: &str = "RestManifestConfiguration";

pub(crate) struct Rules;

/// The manifest's refusal as the API's: a header that carries credentials
/// is refused as any secret written into a configuration is.
fn refusal(problem: Problem) -> ApiError {
    match problem.kind {
        ProblemKind::CredentialHeader => {
            let field = problem.pointer.trim_start_matches('/').replace('/', ".").replace("~1", "/").replace("~0", "~");
            ApiError::secret_refused(&format!("configuration.{field}"))
        }
        ProblemKind::Invalid => invalid(&problem.pointer, problem.message),
    }
}

/// The configuration read and checked by the manifest's own rules; the
/// host of its base URL.
fn checked(config: &Value) -> ApiResult<(rest_manifest::Config, String)> {
    let config: rest_manifest::Config =
        serde_json::from_value(config.clone()).map_err(|e| invalid("", format!("not a manifest: {e}")))?;
    config.validate().map_err(refusal)?;
    let host = config.base_host().map_err(refusal)?;
    Ok((config, host))
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
            let (config, host) = checked(config)?;
            if !state.egress.policy().allowed_hosts.iter().any(|p| p.matches(&host)) {
                return Err(invalid(
                    "/base_url",
                    format!(
                        "{host} is not a host the operator allows connectors to reach (SERVICE_EGRESS_ALLOWED_HOSTS)"
                    ),
                ));
            }
            if let Some(handle) = &config.credential_handle {
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
            Ok(())
        })
    }
}

/// The configuration's schema as OpenAPI components: the schema itself
/// under [`OPENAPI_NAME`] and each of its definitions beside it, with the
/// references between them pointing at the components.
pub(crate) fn openapi_schemas() -> Vec<(String, Value)> {
    let Ok(mut schema) = serde_json::from_str::<Value>(rest_manifest::SCHEMA) else { return Vec::new() };
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
    use serde_json::json;

    fn error_path(e: ApiError) -> String {
        assert_eq!(e.code, "CONFIGURATION_INVALID");
        e.details["errors"][0]["path"].as_str().unwrap().to_owned()
    }

    fn source(base_url: &str, manifest: Value) -> Value {
        json!({ "base_url": base_url, "manifest": manifest })
    }

    #[test]
    fn the_manifests_refusals_keep_their_pointer() {
        let twice = json!({ "streams": [{ "name": "a", "path": "/a" }, { "name": "a", "path": "/b" }] });
        let refused = checked(&source("https://api.example.com", twice)).unwrap_err();
        assert_eq!(error_path(refused), "/manifest/streams/1/name");
        let port = json!({ "streams": [{ "name": "a", "path": "/a" }] });
        assert_eq!(error_path(checked(&source("https://a.example.com:8443/", port)).unwrap_err()), "/base_url");
        let (_, host) =
            checked(&source("https://API.example.com/v2", json!({ "streams": [{ "name": "a", "path": "/a" }] })))
                .unwrap();
        assert_eq!(host, "api.example.com");
        assert_eq!(error_path(checked(&json!({ "base_url": 1 })).unwrap_err()), "");
    }

    #[test]
    fn headers_that_carry_credentials_are_refused_as_secrets() {
        // Refused as any secret is, whatever the value looks like.
        let cookie =
            json!({ "headers": { "Accept": "x", "COOKIE": "a=b" }, "streams": [{ "name": "a", "path": "/a" }] });
        let refused = checked(&source("https://api.example.com", cookie)).unwrap_err();
        assert_eq!(refused.code, "SECRET_NOT_ACCEPTED");
        assert_eq!(refused.details["field"], "configuration.manifest.headers.COOKIE");
        let host = json!({ "headers": { "Host": "elsewhere.example" }, "streams": [{ "name": "a", "path": "/a" }] });
        assert_eq!(
            error_path(checked(&source("https://api.example.com", host)).unwrap_err()),
            "/manifest/headers/Host"
        );
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
