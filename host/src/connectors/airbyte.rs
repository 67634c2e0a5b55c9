//! `conn_airbyte_manifest`: Airbyte's published declarative manifests.
//!
//! The manifest is read when a source is saved by the very crate the
//! plugin runs (`service-declarative`): a component or field not built
//! yet, a `Custom*` component, a template that is not Jinja the runtime
//! knows, each is refused with its JSON pointer. What only the server
//! knows is checked too, on each stream's first request (built with a
//! marker in place of every secret): its host is one the operator allows;
//! every secret the manifest places has a credential in `credentials`,
//! stored for this connector, bound to that host and stored for that
//! place (the header, query parameter, body field, bearer token or Basic
//! password the manifest puts it in; a Basic username and password that
//! are both secret fields name one credential holding the pair); and no
//! secret is given in the clear in `config`.

use std::pin::Pin;

use declarative::interpolation::Val;
use declarative::model::Source;
use declarative::retrieve::{self, Env, OAuthGrant, Place, PrepareError, ReadError, TokenTerms};
use serde_json::{Value, json};

use super::{ConnectorRules, invalid};
use crate::access::WorkspaceAccess;
use crate::egress::Placement;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::store::credentials::CredentialHandle;

/// The connector these rules are for.
pub(crate) const CONNECTOR_ID: &str = "conn_airbyte_manifest";

/// The largest configuration (manifest, its configuration, schemas) a
/// source of this connector holds, serialised: within the API's body
/// limit with room for the rest of a request.
pub(crate) const MANIFEST_CONFIG_BYTES_MAX: usize = 768 * 1024;
/// The longest string in it (a description, a schema's prose).
pub(crate) const MANIFEST_STRING_MAX: usize = 64 * 1024;

pub(crate) struct Rules;

/// What a source reaches and where it puts secrets, as its first
/// requests show.
#[derive(Debug, PartialEq)]
pub(crate) struct Reach {
    /// Each stream's host.
    pub hosts: Vec<(String, String)>,
    /// Each secret the manifest places: its pointer, the place, the host.
    pub placements: Vec<(String, Place, String)>,
    /// The handles given, by pointer.
    pub handles: Vec<(String, String)>,
}

/// The configuration read by the runtime's own rules.
pub(crate) fn checked(config: &Value, now: chrono::DateTime<chrono::Utc>) -> ApiResult<Reach> {
    let obj = config.as_object().ok_or_else(|| invalid("", "expected an object"))?;
    let manifest = obj.get("manifest").ok_or_else(|| invalid("/manifest", "the manifest is required"))?;
    let plain = obj.get("config").cloned().unwrap_or_else(|| json!({}));
    if !plain.is_object() {
        return Err(invalid("/config", "the manifest's configuration must be an object"));
    }
    let handles: Vec<(String, String)> = match obj.get("credentials") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let field = item.get("field").and_then(Value::as_str).filter(|f| f.starts_with('/'));
                let handle = item.get("credential_handle").and_then(Value::as_str).filter(|h| !h.is_empty());
                match (field, handle) {
                    (Some(f), Some(h)) => Ok((f.to_owned(), h.to_owned())),
                    _ => Err(invalid(
                        &format!("/credentials/{i}"),
                        "a field (a JSON pointer, like /api_key) and a credential_handle",
                    )),
                }
            })
            .collect::<ApiResult<_>>()?,
        Some(_) => return Err(invalid("/credentials", "expected a list of fields and credential handles")),
    };
    let plain = Val::from(&plain);
    let given: Vec<String> = handles.iter().map(|(p, _)| p.clone()).collect();
    let (source, env) = match retrieve::prepare(manifest, &plain, &given, now) {
        Ok(prepared) => prepared,
        Err(PrepareError::Refused(r)) => return Err(invalid(&format!("/manifest{}", r.pointer), r.reason)),
        Err(PrepareError::SecretInTheClear(pointer)) => {
            let field = pointer.trim_start_matches('/').replace('/', ".");
            return Err(ApiError::secret_refused(&format!("configuration.config.{field}")));
        }
    };
    // The same requests with other markers: a part that changes with them
    // (outside the places the host fills) is a secret transformed by a
    // template, which only the guest could compute.
    let again = Env {
        config: env.secrets.mark_again(&plain, &given),
        secrets: env.secrets.clone(),
        now,
        sessions: Default::default(),
    };
    if let Some(pointer) = retrieve::secret_in_records(&source, &env, &again) {
        return Err(invalid(
            &format!("/manifest{pointer}"),
            "this value reads a secret: a record never carries one (and the guest never holds one)",
        ));
    }
    let again_source = Source::read(manifest, &again.config, now).ok();
    let again = again_source.as_ref().map(|s| retrieve::first_requests(s, &again));
    let mut hosts = Vec::new();
    let mut placements = Vec::new();
    let firsts = retrieve::first_requests(&source, &env);
    for (i, (stream, request)) in firsts.iter().enumerate() {
        let (stream, pointer) = (stream.name.clone(), stream.pointer.clone());
        // Other markers that make other requests (another number of them)
        // are a secret read by a template too.
        if let (Ok(first), Some(again)) = (request, &again) {
            let differs = match (again.len() == firsts.len()).then(|| &again[i].1) {
                // The places too: one the host fills from what the
                // manifest renders (a login's username) must not change.
                Some(Ok(second)) => {
                    (&first.url, &first.query, &first.headers, &first.body, &first.credentials)
                        != (&second.url, &second.query, &second.headers, &second.body, &second.credentials)
                }
                Some(Err(_)) | None => true,
            };
            if differs {
                return Err(invalid(
                    &format!("/manifest{pointer}"),
                    format!(
                        "stream {stream}: a template transforms a secret into the request (only the guest could compute it, and the guest never holds a secret)"
                    ),
                ));
            }
        }
        let request = match request {
            Ok(r) => r,
            Err(e @ ReadError::Secret(_)) => return Err(invalid(&format!("/manifest{pointer}"), e.to_string())),
            Err(ReadError::Refused(r)) => return Err(invalid(&format!("/manifest{}", r.pointer), r.reason.clone())),
            // Not buildable before a read (it needs a slice's values):
            // the read says why, if it still fails then.
            Err(_) => continue,
        };
        let host = host_of(&request.url).ok_or_else(|| {
            invalid(
                &format!("/manifest{pointer}"),
                format!("stream {stream}: {} is not an https URL with a host", request.url),
            )
        })?;
        // Each once: the requests of a stream's router values mostly
        // repeat one another's.
        for c in &request.credentials {
            let placement = (c.pointer.clone(), c.place.clone(), host.clone());
            if !placements.contains(&placement) {
                placements.push(placement);
            }
        }
        if !hosts.contains(&(stream.clone(), host.clone())) {
            hosts.push((stream, host));
        }
    }
    Ok(Reach { hosts, placements, handles })
}

/// The host of an `https` URL, lower case, without a port.
fn host_of(url: &str) -> Option<String> {
    let rest = url.strip_prefix("https://")?;
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let host = authority.rsplit('@').next()?.split(':').next()?;
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// The egress placement a manifest's place is stored as.
fn as_placement(place: &Place) -> Placement {
    match place {
        Place::Bearer => Placement::Bearer,
        Place::Header(h) => Placement::Header(h.clone()),
        Place::Query(q) => Placement::Query(q.clone()),
        Place::BodyField(f) => Placement::BodyField(f.clone()),
        Place::Basic { username } => Placement::BasicPassword(username.clone()),
        Place::BasicUsername { password } => Placement::BasicUsername(password.clone()),
        Place::BasicBoth => Placement::BasicBoth,
        Place::BasicPair { .. } => Placement::BasicPair,
        Place::UrlPath => Placement::Path,
        // The token the host obtains goes as a bearer token, or in the
        // header the manifest names.
        Place::OAuthClient { .. } | Place::SessionLogin { header: None, .. } => Placement::Bearer,
        Place::SessionLogin { header: Some(h), .. } => Placement::Header(h.clone()),
        Place::HeaderAround { header, prefix, suffix } => Placement::HeaderAround {
            header: header.to_ascii_lowercase(),
            prefix: prefix.clone(),
            suffix: suffix.clone(),
        },
    }
}

/// Whether a credential trades its secret for a token as the manifest's
/// `OAuthAuthenticator` would: by the same grant, at the same token
/// endpoint, for the same client id (when the manifest names it in the
/// clear), with no scope the manifest does not ask for.
fn oauth_client_matches(
    record: &crate::store::credentials::CredentialRecord,
    token_url: &str,
    client_id: Option<&str>,
    grant: &OAuthGrant,
    terms: &TokenTerms,
) -> Result<(), String> {
    let exchange = record.metadata.get("exchange").and_then(|e| serde_json::from_value(e.clone()).ok());
    exchange_matches(exchange.as_ref(), token_url, client_id, grant, terms)
}

/// The check of [`oauth_client_matches`] on the credential's recipe.
fn exchange_matches(
    exchange: Option<&crate::credentials::exchange::TokenExchange>,
    token_url: &str,
    client_id: Option<&str>,
    grant: &OAuthGrant,
    terms: &TokenTerms,
) -> Result<(), String> {
    use crate::credentials::exchange::{Grant, TokenExchange};
    let wanted = match grant {
        OAuthGrant::ClientCredentials => "client_credentials",
        OAuthGrant::RefreshToken { .. } => "refresh_token",
        OAuthGrant::EmptyRefreshToken => "refresh_token (with empty_refresh_token)",
    };
    let (exchange, stored_url, stored_id, scope) = match (exchange, grant) {
        (
            Some(
                e @ TokenExchange {
                    grant: Grant::ClientCredentials { token_url, client_id, scope }, header: None, ..
                },
            ),
            OAuthGrant::ClientCredentials,
        ) => (e, token_url, client_id, scope.as_ref()),
        (
            Some(
                e @ TokenExchange {
                    grant: Grant::RefreshToken { token_url, client_id, empty_refresh_token },
                    header: None,
                    ..
                },
            ),
            OAuthGrant::RefreshToken { .. } | OAuthGrant::EmptyRefreshToken,
        ) if *empty_refresh_token == (*grant == OAuthGrant::EmptyRefreshToken) => (e, token_url, client_id, None),
        _ => {
            return Err(format!(
                "the manifest's OAuthAuthenticator trades a client secret for a token at {token_url}: store a secret credential with an exchange of the {wanted} grant there"
            ));
        }
    };
    if stored_url != token_url {
        return Err(format!(
            "the manifest trades the client secret at {token_url}, and the credential at {stored_url}"
        ));
    }
    if let Some(id) = client_id
        && id != stored_id
    {
        return Err("the manifest's OAuth client id is not the credential's".into());
    }
    if scope.is_some() {
        return Err("the credential asks for a scope the manifest does not".into());
    }
    if exchange.scopes != terms.scopes {
        return Err(format!(
            "the manifest asks for the scopes {:?} and the credential's exchange for {:?}",
            terms.scopes, exchange.scopes
        ));
    }
    if (exchange.expiry_field.as_deref(), exchange.expiry_is_time)
        != (terms.expiry_field.as_deref(), terms.expiry_is_time)
    {
        return Err(format!(
            "the manifest reads the token's expiry from {} ({}); store the credential's exchange with expiry_field and expiry_is_time saying the same",
            terms.expiry_field.as_deref().unwrap_or("expires_in"),
            if terms.expiry_is_time { "the instant it expires" } else { "seconds from now" }
        ));
    }
    Ok(())
}

/// Whether a credential's recipe logs in as the manifest's
/// `SessionTokenAuthenticator` would: at the same URL, with the same
/// username in the same fields, reading the token at the same place and
/// keeping it as long.
fn login_matches(exchange: Option<&crate::credentials::exchange::TokenExchange>, place: &Place) -> Result<(), String> {
    use crate::credentials::exchange::{Grant, TokenExchange};
    let Place::SessionLogin {
        login_url,
        username,
        username_field,
        password_field,
        token_pointer,
        header: _,
        lifetime_secs,
    } = place
    else {
        return Ok(());
    };
    let Some(TokenExchange {
        grant:
            Grant::Login {
                token_url,
                username: stored_username,
                username_field: stored_username_field,
                password_field: stored_password_field,
                token_pointer: stored_pointer,
                lifetime_secs: stored_lifetime,
            },
        expiry_field,
        ..
    }) = exchange
    else {
        return Err(format!(
            "the manifest's SessionTokenAuthenticator logs in at {login_url} with a secret: store the password as a secret credential with an exchange of the login grant there (token_url, username, token_pointer)"
        ));
    };
    let differs = |what: &str, manifest: String, stored: String| {
        Err(format!("the manifest's login has {what} {manifest}, and the credential's exchange has {stored}"))
    };
    if token_url != login_url {
        return differs("the URL", login_url.clone(), token_url.clone());
    }
    if stored_username != username {
        return Err("the manifest's login username is not the credential's".into());
    }
    if (stored_username_field, stored_password_field) != (username_field, password_field) {
        let fields = |u: &str, p: &str| format!("{u} and {p}");
        return differs(
            "the username and password fields",
            fields(username_field, password_field),
            fields(stored_username_field, stored_password_field),
        );
    }
    if stored_pointer != token_pointer {
        return differs("the token at", token_pointer.clone(), stored_pointer.clone());
    }
    if let Some(field) = expiry_field {
        return Err(format!(
            "the credential's exchange reads the session's expiry from {field}, which the manifest's login does not: leave expiry_field out"
        ));
    }
    if stored_lifetime != lifetime_secs {
        let lasting =
            |secs: &Option<u64>| secs.map_or("until the answer's expires_in (or an hour)".into(), |s| format!("{s} s"));
        return differs("sessions lasting (expiration_duration)", lasting(lifetime_secs), lasting(stored_lifetime));
    }
    Ok(())
}

impl ConnectorRules for Rules {
    fn connector_id(&self) -> &'static str {
        CONNECTOR_ID
    }

    /// A published manifest runs to a few hundred KB (its schemas inline,
    /// long descriptions); its source still fits in one request body.
    fn config_limits(&self) -> Option<super::ConfigLimits> {
        Some(super::ConfigLimits { bytes: MANIFEST_CONFIG_BYTES_MAX, string_chars: MANIFEST_STRING_MAX })
    }

    fn validate_source<'a>(
        &'a self,
        state: &'a AppState,
        access: &'a WorkspaceAccess,
        config: &'a Value,
        _saved: Option<&'a Value>,
    ) -> Pin<Box<dyn Future<Output = ApiResult<()>> + Send + 'a>> {
        Box::pin(async move {
            let reach = checked(config, chrono::Utc::now())?;
            for (stream, host) in &reach.hosts {
                if !state.egress.policy().allowed_hosts.iter().any(|p| p.matches(host)) {
                    return Err(invalid(
                        "/manifest",
                        format!(
                            "stream {stream} reaches {host}, not a host the operator allows connectors to reach (SERVICE_EGRESS_ALLOWED_HOSTS)"
                        ),
                    ));
                }
            }
            for (pointer, place, host) in &reach.placements {
                let at = match reach.handles.iter().position(|(p, _)| p == pointer) {
                    Some(i) => format!("/credentials/{i}"),
                    None => "/credentials".to_owned(),
                };
                let wanted = as_placement(place);
                let Some((_, handle)) = reach.handles.iter().find(|(p, _)| p == pointer) else {
                    return Err(invalid(
                        &at,
                        format!(
                            "the manifest sends the secret field {pointer} to {host} {}: give a credential handle stored for it",
                            wanted.describe()
                        ),
                    ));
                };
                // A secret username and a secret password: one credential
                // holds the pair, and both fields name it; so for an OAuth
                // client whose id or refresh token is a secret field too.
                let how = match place {
                    Place::BasicPair { .. } => {
                        "as the Basic username and password: give both fields the handle of one basic credential whose secret is the pair (secret_as `username:password`)"
                    }
                    _ => {
                        "with an OAuth client's secret: give these fields the handle of one credential traded for a token (its exchange holds the client id, its refresh_token the refresh token)"
                    }
                };
                let apart = place
                    .fields_beside()
                    .into_iter()
                    .find(|other| reach.handles.iter().find(|(p, _)| p == *other).map(|(_, h)| h) != Some(handle));
                if let Some(other) = apart {
                    let at = match reach.handles.iter().position(|(p, _)| p == other) {
                        Some(i) => format!("/credentials/{i}"),
                        None => "/credentials".to_owned(),
                    };
                    return Err(invalid(&at, format!("the manifest sends {pointer} and {other} {how}")));
                }
                let record = state
                    .vault
                    .require_handle(&access.workspace_id, &CredentialHandle::new(handle), Some(host))
                    .await
                    .map_err(|e| e.at(&format!("configuration.{}", at.trim_start_matches('/').replace('/', "."))))?;
                // A manifest can ask for any path of a host: a secret
                // stored for another connector is not lent to it.
                if record.connector_id.as_deref() != Some(CONNECTOR_ID) {
                    return Err(invalid(
                        &at,
                        format!(
                            "an Airbyte manifest source takes only credentials stored for {CONNECTOR_ID} (their connector_id)"
                        ),
                    ));
                }
                let stored = crate::credentials::vault::placement(&record)
                    .map_err(|e| invalid(&at, format!("the credential cannot be placed: {e}")))?;
                if !stored.same_as(&wanted) {
                    return Err(invalid(
                        &at,
                        format!(
                            "the manifest puts {pointer} {}, and the credential is stored to go {}",
                            wanted.describe(),
                            stored.describe()
                        ),
                    ));
                }
                if let Place::OAuthClient { token_url, client_id, client_id_field, grant, terms } = place {
                    oauth_client_matches(
                        &record,
                        token_url,
                        client_id_field.is_none().then_some(client_id.as_str()),
                        grant,
                        terms,
                    )
                    .map_err(|why| invalid(&at, why))?;
                }
                if let Place::SessionLogin { .. } = place {
                    let exchange = record.metadata.get("exchange").and_then(|e| serde_json::from_value(e.clone()).ok());
                    login_matches(exchange.as_ref(), place).map_err(|why| invalid(&at, why))?;
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A login credential is taken only where its recipe logs in as the
    /// manifest does: each part that differs is named.
    #[test]
    fn a_login_credential_that_logs_in_otherwise_than_the_manifest_is_refused() {
        let url = "https://api.login.test/v1/login";
        let place = Place::SessionLogin {
            login_url: url.into(),
            username: "ana".into(),
            username_field: "user".into(),
            password_field: "password".into(),
            token_pointer: "/auth/token".into(),
            header: Some("X-Session".into()),
            lifetime_secs: Some(3600),
        };
        let recipe = |changes: Value| {
            let mut v = json!({ "grant": "login", "token_url": url, "username": "ana", "username_field": "user",
                "password_field": "password", "token_pointer": "/auth/token", "lifetime_secs": 3600,
                "header": "X-Session" });
            v.as_object_mut().unwrap().extend(changes.as_object().unwrap().clone());
            serde_json::from_value::<crate::credentials::exchange::TokenExchange>(v).unwrap()
        };
        assert_eq!(login_matches(Some(&recipe(json!({}))), &place), Ok(()));
        for (changes, says) in [
            (json!({ "token_url": "https://api.login.test/v2/login" }), "the URL"),
            (json!({ "username": "bob" }), "username is not the credential's"),
            (
                json!({ "username_field": "login" }),
                "user and password, and the credential's exchange has login and password",
            ),
            (json!({ "password_field": "secret" }), "username and password fields"),
            (json!({ "token_pointer": "/token" }), "the token at /auth/token"),
            (json!({ "lifetime_secs": null }), "until the answer's expires_in"),
            (json!({ "expiry_field": "valid_for" }), "leave expiry_field out"),
        ] {
            let refused = login_matches(Some(&recipe(changes.clone())), &place).unwrap_err();
            assert!(refused.contains(says), "{changes}: {refused}");
        }
        let client = serde_json::from_value::<crate::credentials::exchange::TokenExchange>(
            json!({ "grant": "client_credentials", "token_url": url, "client_id": "c" }),
        )
        .unwrap();
        for other in [None, Some(&client)] {
            assert!(login_matches(other, &place).unwrap_err().contains("exchange of the login grant"));
        }
    }

    #[test]
    fn a_credential_whose_exchange_says_otherwise_than_the_manifest_is_refused() {
        let url = "https://auth.example.com/t";
        let recipe = |extra: Value| {
            let mut v = json!({ "grant": "refresh_token", "token_url": url, "client_id": "c" });
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            serde_json::from_value::<crate::credentials::exchange::TokenExchange>(v).unwrap()
        };
        let refresh = OAuthGrant::RefreshToken { field: "/refresh_token".into() };
        let terms =
            TokenTerms { scopes: vec!["read".into()], expiry_field: Some("expires_at".into()), expiry_is_time: true };
        let agreeing = recipe(json!({ "scopes": ["read"], "expiry_field": "expires_at", "expiry_is_time": true }));
        assert_eq!(exchange_matches(Some(&agreeing), url, Some("c"), &refresh, &terms), Ok(()));
        for (stored, grant, says) in [
            (recipe(json!({ "expiry_field": "expires_at", "expiry_is_time": true })), &refresh, "scopes"),
            (
                recipe(json!({ "scopes": ["read", "write"], "expiry_field": "expires_at", "expiry_is_time": true })),
                &refresh,
                "scopes",
            ),
            (recipe(json!({ "scopes": ["read"], "expiry_field": "expires_at" })), &refresh, "expiry"),
            (recipe(json!({ "scopes": ["read"] })), &refresh, "expiry"),
            // An empty refresh token and a stored one are not the same grant.
            (agreeing.clone(), &OAuthGrant::EmptyRefreshToken, "empty_refresh_token"),
            (
                recipe(
                    json!({ "empty_refresh_token": true, "scopes": ["read"], "expiry_field": "expires_at", "expiry_is_time": true }),
                ),
                &refresh,
                "refresh_token grant",
            ),
        ] {
            let refused = exchange_matches(Some(&stored), url, Some("c"), grant, &terms).unwrap_err();
            assert!(refused.contains(says), "{refused}");
        }
        assert!(exchange_matches(None, url, Some("c"), &refresh, &terms).is_err());
    }

    fn error_path(e: ApiError) -> String {
        assert_eq!(e.code, "CONFIGURATION_INVALID", "{e:?}");
        e.details["errors"][0]["path"].as_str().unwrap().to_owned()
    }

    fn manifest(authenticator: Value, extra: Value) -> Value {
        let mut stream = json!({ "type": "DeclarativeStream", "name": "items",
            "retriever": { "type": "SimpleRetriever",
                "requester": { "type": "HttpRequester", "url_base": "https://api.example.com/v1", "path": "/items",
                    "authenticator": authenticator },
                "record_selector": { "type": "RecordSelector", "extractor": { "type": "DpathExtractor", "field_path": ["data"] } } } });
        if let (Some(s), Some(e)) = (stream.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                s.insert(k.clone(), v.clone());
            }
        }
        json!({ "version": "6.0.0", "type": "DeclarativeSource", "check": { "type": "CheckStream", "stream_names": ["items"] },
            "streams": [stream],
            "spec": { "type": "Spec", "connection_specification": { "type": "object", "properties": {
                "api_key": { "type": "string", "airbyte_secret": true }, "region": { "type": "string" } } } } })
    }

    fn now() -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::parse_from_rfc3339("2026-11-20T12:00:00Z").unwrap().into()
    }

    #[test]
    fn each_secret_is_placed_where_the_manifest_sends_it() {
        let header = json!({ "type": "ApiKeyAuthenticator", "api_token": "{{ config['api_key'] }}",
            "inject_into": { "type": "RequestOption", "inject_into": "header", "field_name": "X-Key" } });
        let config = json!({ "manifest": manifest(header, json!({})), "config": { "region": "eu" },
            "credentials": [{ "field": "/api_key", "credential_handle": "h1" }] });
        let reach = checked(&config, now()).unwrap();
        assert_eq!(reach.hosts, [("items".to_owned(), "api.example.com".to_owned())]);
        assert_eq!(
            reach.placements,
            [("/api_key".to_owned(), Place::Header("X-Key".into()), "api.example.com".to_owned())]
        );
        let bearer = json!({ "type": "BearerAuthenticator", "api_token": "{{ config.api_key }}" });
        let config = json!({ "manifest": manifest(bearer, json!({})), "credentials": [{ "field": "/api_key", "credential_handle": "h1" }] });
        assert_eq!(checked(&config, now()).unwrap().placements[0].1, Place::Bearer);
        let query = json!({ "type": "ApiKeyAuthenticator", "api_token": "{{ config['api_key'] }}",
            "inject_into": { "type": "RequestOption", "inject_into": "request_parameter", "field_name": "key" } });
        let config = json!({ "manifest": manifest(query, json!({})), "credentials": [{ "field": "/api_key", "credential_handle": "h1" }] });
        assert_eq!(checked(&config, now()).unwrap().placements[0].1, Place::Query("key".into()));
    }

    #[test]
    fn several_secrets_of_a_request_each_have_a_place_of_their_own() {
        let with_app_key = |authenticator: Value, headers: Value| {
            let mut m = manifest(authenticator, json!({}));
            m["spec"]["connection_specification"]["properties"]["app_key"] =
                json!({ "type": "string", "airbyte_secret": true });
            m["streams"][0]["retriever"]["requester"]["request_headers"] = headers;
            json!({ "manifest": m, "credentials": [{ "field": "/api_key", "credential_handle": "h1" },
                { "field": "/app_key", "credential_handle": "h2" }] })
        };
        let key = json!({ "type": "ApiKeyAuthenticator", "api_token": "{{ config['api_key'] }}",
            "inject_into": { "type": "RequestOption", "inject_into": "header", "field_name": "DD-API-KEY" } });
        let config = with_app_key(key.clone(), json!({ "DD-APPLICATION-KEY": "{{ config['app_key'] }}" }));
        let placements: Vec<(String, Place)> =
            checked(&config, now()).unwrap().placements.into_iter().map(|(p, place, _)| (p, place)).collect();
        assert_eq!(
            placements,
            [
                ("/api_key".to_owned(), Place::Header("DD-API-KEY".into())),
                ("/app_key".to_owned(), Place::Header("DD-APPLICATION-KEY".into()))
            ]
        );
        // A Basic username and password from two secret fields: one pair.
        let pair = json!({ "type": "BasicHttpAuthenticator", "username": "{{ config['app_key'] }}",
            "password": "{{ config['api_key'] }}" });
        let placements = checked(&with_app_key(pair, json!({})), now()).unwrap().placements;
        assert_eq!(placements[0].1, Place::BasicPair { password: "/api_key".into() });
        assert_eq!(placements.len(), 1);
        // One secret in two places, two secrets in one: refused by pointer.
        let twice = with_app_key(key.clone(), json!({ "X-Again": "{{ config['api_key'] }}" }));
        let refused = checked(&twice, now()).unwrap_err();
        assert!(refused.details.to_string().contains("sent twice"), "{refused:?}");
        assert_eq!(error_path(refused), "/manifest/streams/0");
        let bearer = json!({ "type": "BearerAuthenticator", "api_token": "{{ config['api_key'] }}" });
        let shared = with_app_key(bearer, json!({ "Authorization": "{{ config['app_key'] }}" }));
        let refused = checked(&shared, now()).unwrap_err();
        assert!(refused.details.to_string().contains("would share"), "{refused:?}");
    }

    #[test]
    fn an_oauth_client_is_a_token_the_host_obtains_and_other_grants_are_refused_by_pointer() {
        let oauth = |grant: &str, client_id: &str| {
            json!({ "type": "OAuthAuthenticator", "token_refresh_endpoint": "https://api.example.com/oauth/token",
                "client_id": client_id, "client_secret": "{{ config['api_key'] }}", "grant_type": grant })
        };
        let config = |authenticator: Value| {
            let mut m = manifest(authenticator, json!({}));
            m["spec"]["connection_specification"]["properties"]["client_id"] =
                json!({ "type": "string", "airbyte_secret": true });
            json!({ "manifest": m, "credentials": [{ "field": "/api_key", "credential_handle": "h1" },
                { "field": "/client_id", "credential_handle": "h1" }] })
        };
        let place = |authenticator: Value| checked(&config(authenticator), now()).unwrap().placements[0].1.clone();
        assert_eq!(
            place(oauth("client_credentials", "my-client")),
            Place::OAuthClient {
                token_url: "https://api.example.com/oauth/token".into(),
                client_id: "my-client".into(),
                client_id_field: None,
                grant: OAuthGrant::ClientCredentials,
                terms: TokenTerms::default(),
            }
        );
        // A client id that is a secret field: the same credential's.
        assert!(matches!(
            place(oauth("client_credentials", "{{ config['client_id'] }}")),
            Place::OAuthClient { client_id_field: Some(f), .. } if f == "/client_id"
        ));
        // The refresh-token grant: its refresh token a secret field the
        // same credential holds, which it needs.
        let mut refreshing = oauth("refresh_token", "c");
        refreshing["refresh_token"] = json!("{{ config['client_id'] }}");
        assert!(matches!(
            place(refreshing),
            Place::OAuthClient { grant: OAuthGrant::RefreshToken { field }, .. } if field == "/client_id"
        ));
        // An empty refresh token: the client's id and secret alone.
        let mut empty = oauth("refresh_token", "c");
        empty["refresh_token"] = json!("");
        assert!(matches!(place(empty), Place::OAuthClient { grant: OAuthGrant::EmptyRefreshToken, .. }));
        let refused = checked(&config(oauth("refresh_token", "c")), now()).unwrap_err();
        assert!(refused.details.to_string().contains("needs refresh_token"), "{refused:?}");
        let mut plain_refresh = oauth("refresh_token", "c");
        plain_refresh["refresh_token"] = json!("{{ 'plain' }}");
        let refused = checked(&config(plain_refresh), now()).unwrap_err();
        assert!(refused.details.to_string().contains("refresh token must be a secret"), "{refused:?}");
        // Scopes and where the answer says the expiry: asked of the
        // credential's exchange.
        let mut scoped = oauth("client_credentials", "c");
        scoped["scopes"] = json!(["read", "write"]);
        scoped["expires_in_name"] = json!("expires_at");
        scoped["token_expiry_date_format"] = json!("YYYY-MM-DDTHH:mm:ss[Z]");
        assert!(matches!(
            place(scoped),
            Place::OAuthClient { terms: TokenTerms { scopes, expiry_field: Some(f), expiry_is_time: true }, .. }
                if scopes == ["read", "write"] && f == "expires_at"
        ));
        // Other grants, scope lists of other shapes, another token name:
        // by pointer.
        let refused = checked(&config(oauth("password", "c")), now()).unwrap_err();
        assert!(refused.details.to_string().contains("password grant"), "{refused:?}");
        assert_eq!(error_path(refused), "/manifest/streams/0/retriever/requester/authenticator/grant_type");
        let mut scoped = oauth("client_credentials", "c");
        scoped["scopes"] = json!("read");
        assert_eq!(
            error_path(checked(&config(scoped), now()).unwrap_err()),
            "/manifest/streams/0/retriever/requester/authenticator/scopes"
        );
        let mut renamed = oauth("client_credentials", "c");
        renamed["access_token_name"] = json!("token");
        assert_eq!(
            error_path(checked(&config(renamed), now()).unwrap_err()),
            "/manifest/streams/0/retriever/requester/authenticator/access_token_name"
        );
        // A client secret in the clear is no credential's.
        let plain = json!({ "type": "OAuthAuthenticator", "token_refresh_endpoint": "https://api.example.com/t",
            "client_id": "c", "client_secret": "{{ config['region'] }}", "grant_type": "client_credentials" });
        let refused = checked(&config(plain), now()).unwrap_err();
        assert!(refused.details.to_string().contains("client secret"), "{refused:?}");
    }

    #[test]
    fn what_would_let_the_guest_read_a_secret_is_refused_by_pointer() {
        // Framed in a header: the host writes the frame (the credential
        // must hold it). Anywhere else, only the guest could write it.
        let framed = json!({ "type": "ApiKeyAuthenticator", "api_token": "Token {{ config['api_key'] }}",
            "inject_into": { "type": "RequestOption", "inject_into": "header", "field_name": "Authorization" } });
        let config = json!({ "manifest": manifest(framed, json!({})), "credentials": [{ "field": "/api_key", "credential_handle": "h1" }] });
        let place = checked(&config, now()).unwrap().placements[0].1.clone();
        assert_eq!(
            place,
            Place::HeaderAround { header: "Authorization".into(), prefix: "Token ".into(), suffix: String::new() }
        );
        let in_query = json!({ "type": "ApiKeyAuthenticator", "api_token": "Token {{ config['api_key'] }}",
            "inject_into": { "type": "RequestOption", "inject_into": "request_parameter", "field_name": "key" } });
        let config = json!({ "manifest": manifest(in_query, json!({})), "credentials": [{ "field": "/api_key", "credential_handle": "h1" }] });
        let refused = checked(&config, now()).unwrap_err();
        assert_eq!(error_path(refused), "/manifest/streams/0");
        // Encoded into a parameter.
        let none = json!({ "type": "NoAuth" });
        let mut m = manifest(none, json!({}));
        m["streams"][0]["retriever"]["requester"]["request_parameters"] =
            json!({ "k": "{{ config['api_key'] | base64encode }}" });
        let config = json!({ "manifest": m, "credentials": [{ "field": "/api_key", "credential_handle": "h1" }] });
        let refused = checked(&config, now()).unwrap_err();
        assert!(refused.details.to_string().contains("transforms a secret"), "{refused:?}");
        // Copied into a record.
        let copied = json!({ "transformations": [{ "type": "AddFields", "fields": [
            { "type": "AddedFieldDefinition", "path": ["k"], "value": "{{ config['api_key'] }}" }] }] });
        let config = json!({ "manifest": manifest(json!({ "type": "NoAuth" }), copied),
            "credentials": [{ "field": "/api_key", "credential_handle": "h1" }] });
        assert_eq!(
            error_path(checked(&config, now()).unwrap_err()),
            "/manifest/streams/0/transformations/0/fields/0/value"
        );
        // Given in the clear.
        let bearer = json!({ "type": "BearerAuthenticator", "api_token": "{{ config.api_key }}" });
        let config = json!({ "manifest": manifest(bearer, json!({})), "config": { "api_key": "plain" } });
        let refused = checked(&config, now()).unwrap_err();
        assert_eq!(refused.code, "SECRET_NOT_ACCEPTED");
    }

    #[test]
    fn unsupported_components_are_refused_by_pointer_and_name() {
        let custom = json!({ "type": "CustomAuthenticator", "class_name": "source_x.Auth" });
        let config = json!({ "manifest": manifest(custom, json!({})) });
        let refused = checked(&config, now()).unwrap_err();
        assert!(
            refused.details.to_string().contains("CustomAuthenticator source_x.Auth runs Python code"),
            "{refused:?}"
        );
        assert_eq!(error_path(refused), "/manifest/streams/0/retriever/requester/authenticator");
        let cursor = json!({ "incremental_sync": { "type": "DatetimeBasedCursor", "cursor_field": "updated" } });
        let config = json!({ "manifest": manifest(json!({ "type": "NoAuth" }), cursor) });
        assert_eq!(error_path(checked(&config, now()).unwrap_err()), "/manifest/streams/0/incremental_sync");
    }
}
