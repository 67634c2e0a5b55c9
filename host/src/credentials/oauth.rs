//! OAuth 2.0 authorization-code flows run by the host ([`OAuth`]), with PKCE (S256):
//! for source connectors (endpoints from the plugin's description) and for
//! the task app (endpoints from operator configuration). Client ids and
//! secrets always come from operator configuration, never from callers.
//!
//! The host exchanges the code itself, through the same egress policy as
//! plugins, stores the tokens as a sealed credential and hands out only a
//! `credential_handle`. It refreshes expired access tokens when the
//! credential is next used; plugins never notice.

use std::pin::Pin;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use url::Url;

use super::exchange::{ExchangeError, Obtained, TokenExchange};
use super::vault::{NewSecret, RefreshRefused, Refreshed, SecretMaterial, TokenRefresher};
use crate::access::{ClientSource, Principal, WorkspaceAccess};
use crate::config::oauth::{OAuthClient, OAuthSettings};
use crate::egress::{Caller, Egress, EgressError, HostPattern, Method, OutboundRequest};
use crate::error::ApiError;
use crate::plugin::registry::Registry;
use crate::store::Store;
use crate::store::credentials::CredentialRecord;
use crate::store::kinds::{CredentialKind, CredentialStatus};
use crate::store::now_ms;
use crate::store::oauth::{OAuthState, Spend};

/// The target name of the task-app flow.
pub(crate) const TASKAPP: &str = "taskapp";
/// How long a started flow can be completed.
const STATE_TTL_MS: i64 = 10 * 60 * 1000;

/// Everything a flow needs to know about its provider.
struct Provider {
    authorize_url: String,
    token_url: String,
    scopes: Vec<String>,
    client: OAuthClient,
    /// Hosts egress may reach for the exchange, and the credential binds to.
    hosts: Vec<HostPattern>,
    /// Whether the token endpoint's host is reachable for the exchange
    /// beyond `hosts` (a provider the operator named: its tokens are bound
    /// to the API hosts, not the authorization server).
    exchange_beyond_hosts: bool,
    connector_id: Option<String>,
}

/// The OAuth flows of an installation: its operator clients, where
/// browsers come back, the connectors that declare OAuth endpoints, and
/// the egress every exchange goes through.
pub struct OAuth {
    settings: OAuthSettings,
    /// Where providers send the browser back (`<public-url>/oauth/callback`).
    redirect_uri: String,
    plugins: Arc<Registry>,
    egress: Egress,
    store: Store,
}

impl OAuth {
    pub fn new(
        settings: OAuthSettings,
        public_url: &Url,
        plugins: Arc<Registry>,
        egress: Egress,
        store: Store,
    ) -> anyhow::Result<Self> {
        let redirect_uri = public_url.join("oauth/callback")?.to_string();
        Ok(OAuth { settings, redirect_uri, plugins, egress, store })
    }
}

async fn provider(settings: &OAuthSettings, plugins: &Registry, target: &str) -> Result<Provider, ApiError> {
    if target == TASKAPP {
        let t = settings.taskapp.clone().ok_or_else(|| {
            ApiError::not_configured(
                "OAUTH_NOT_CONFIGURED",
                "the operator has not configured the task app's OAuth client (SERVICE_TASKAPP_OAUTH)",
            )
        })?;
        let mut hosts = Vec::new();
        for u in [&t.token_url, &t.authorize_url] {
            if let Some(h) = Url::parse(u).ok().and_then(|u| u.host_str().map(str::to_owned))
                && let Ok(p) = HostPattern::parse(&h)
                && !hosts.contains(&p)
            {
                hosts.push(p);
            }
        }
        return Ok(Provider {
            authorize_url: t.authorize_url,
            token_url: t.token_url,
            scopes: t.scopes,
            client: OAuthClient::new(t.client_id, t.client_secret),
            hosts,
            exchange_beyond_hosts: false,
            connector_id: None,
        });
    }
    let plugin = plugins.available(target).await?;
    let client = settings.clients.get(&plugin.info.id);
    // The connector's own endpoints; else, for a connector that reads
    // whatever API it is given (a manifest source), the provider the
    // operator named beside the client, with the hosts its tokens go to.
    let operator_named = client.and_then(|c| c.endpoints().map(|e| (c, e)));
    let (authorize_url, token_url, scopes, hosts, exchange_beyond_hosts) = match (&plugin.info.oauth, operator_named) {
        (Some(e), _) => {
            (e.authorize_url.clone(), e.token_url.clone(), e.scopes.clone(), plugin.info.hosts.clone(), false)
        }
        (None, Some((c, (authorize, token)))) => {
            let hosts = c.hosts.iter().filter_map(|h| HostPattern::parse(h).ok()).collect();
            (authorize.to_owned(), token.to_owned(), c.scopes.clone(), hosts, true)
        }
        (None, None) => {
            return Err(ApiError::bad_request("OAUTH_NOT_SUPPORTED", "this connector does not use OAuth")
                .with_details(json!({ "connector_id": plugin.info.id })));
        }
    };
    let client = client.cloned().ok_or_else(|| {
        ApiError::not_configured(
            "OAUTH_NOT_CONFIGURED",
            "the operator has not configured an OAuth client for this connector (SERVICE_OAUTH_CLIENTS)",
        )
        .with_details(json!({ "connector_id": plugin.info.id }))
    })?;
    Ok(Provider {
        authorize_url,
        token_url,
        scopes,
        client,
        hosts,
        exchange_beyond_hosts,
        connector_id: Some(plugin.info.id.clone()),
    })
}

fn random_b64(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut b);
    URL_SAFE_NO_PAD.encode(b)
}

impl OAuth {
    /// Starts a flow for `access` (the session and client are remembered):
    /// answers the provider's authorization URL.
    pub async fn start(&self, access: &WorkspaceAccess, target: &str) -> Result<Value, ApiError> {
        let p = provider(&self.settings, &self.plugins, target).await?;
        let target = p.connector_id.clone().unwrap_or_else(|| TASKAPP.to_owned());
        let st = random_b64(32);
        let verifier = random_b64(48);
        let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
        let redirect_uri = self.redirect_uri.clone();
        let expires_at = now_ms() + STATE_TTL_MS;
        self.store
            .create_oauth_state(
                &crate::access::tokens::hash(&st),
                &OAuthState {
                    workspace_id: access.workspace_id.clone(),
                    user_id: access.principal.user_id.clone(),
                    target: target.clone(),
                    code_verifier: verifier,
                    redirect_uri: redirect_uri.clone(),
                    expires_at,
                    used: false,
                    session_id: Some(access.principal.session_id.clone()).filter(|s| !s.is_empty()),
                    client_source: access.principal.client.as_str().to_owned(),
                },
            )
            .await?;
        let mut url = Url::parse(&p.authorize_url).map_err(ApiError::internal)?;
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", &p.client.client_id)
            .append_pair("redirect_uri", &redirect_uri)
            .append_pair("scope", &p.scopes.join(" "))
            .append_pair("state", &st)
            .append_pair("code_challenge", &challenge)
            .append_pair("code_challenge_method", "S256");
        Ok(json!({
            "authorization_url": url.to_string(),
            "state": st,
            "redirect_uri": redirect_uri,
            "expires_at": chrono::DateTime::from_timestamp_millis(expires_at),
            "connector_id": p.connector_id,
        }))
    }
}

/// Keeps provider-supplied text short and printable.
fn sanitise(s: &str, max: usize) -> String {
    s.chars().filter(|c| c.is_ascii_graphic() || *c == ' ').take(max).collect()
}

/// What a callback carries.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Callback {
    pub state: String,
    /// The authorization code, on success.
    pub code: Option<String>,
    /// The provider's error, e.g. `access_denied`.
    pub error: Option<String>,
    pub error_description: Option<String>,
}

/// What a completed exchange produced, before it is stored.
pub struct Completed {
    pub workspace_id: String,
    pub user_id: String,
    /// The session and client that started the flow.
    pub session_id: Option<String>,
    pub client_source: String,
    pub connector_id: String,
    hosts: Vec<String>,
    metadata: Value,
    material: Option<SecretMaterial>,
    access_expires_at: Option<i64>,
}

impl Completed {
    /// The credential to store (takes the tokens; call once).
    pub(crate) fn new_secret(&mut self, status: CredentialStatus) -> NewSecret<'_> {
        NewSecret {
            workspace_id: &self.workspace_id,
            created_by: &self.user_id,
            kind: CredentialKind::Oauth2,
            connector_id: Some(&self.connector_id),
            label: None,
            hosts: self.hosts.clone(),
            metadata: self.metadata.clone(),
            material: self.material.take().expect("new_secret is called once"),
            status,
            access_expires_at: self.access_expires_at,
        }
    }
}

/// Checks the state (single use, bound to user and workspace), handles a
/// provider denial, and exchanges the code through egress. `expect` is the
/// (workspace, user) the API caller acts as; the browser landing has none.
impl OAuth {
    pub async fn complete(&self, cb: &Callback, expect: Option<(&str, &str)>) -> Result<Completed, ApiError> {
        let hash = crate::access::tokens::hash(&cb.state);
        if let Some((ws, user)) = expect {
            // Someone else's flow behaves like an unknown one, and is not spent.
            match self.store.oauth_state_owner(&hash).await? {
                Some((w, u)) if w == ws && u == user => {}
                _ => return Err(state_error("OAUTH_STATE_UNKNOWN", "unknown OAuth state; start the flow again")),
            }
        }
        let flow = match self.store.spend_oauth_state(&hash).await? {
            Spend::Unknown => {
                return Err(state_error("OAUTH_STATE_UNKNOWN", "unknown OAuth state; start the flow again"));
            }
            Spend::Expired => return Err(state_error("OAUTH_STATE_EXPIRED", "the OAuth flow expired; start it again")),
            Spend::Used => {
                return Err(ApiError::conflict(
                    "OAUTH_STATE_USED",
                    "this OAuth flow was already completed; start a new one",
                ));
            }
            Spend::Spent(f) => f,
        };
        if let Some(err) = &cb.error {
            let code = sanitise(err, 64);
            if code == "access_denied" {
                return Err(ApiError::bad_request("OAUTH_ACCESS_DENIED", "the user denied access at the provider"));
            }
            return Err(ApiError::bad_request("OAUTH_PROVIDER_ERROR", format!("the provider reported an error: {code}"))
            .with_details(json!({ "provider_error": code, "description": cb.error_description.as_deref().map(|d| sanitise(d, 200)) })));
        }
        let code = cb
            .code
            .as_deref()
            .filter(|c| !c.is_empty())
            .ok_or_else(|| ApiError::invalid_field("code", "code is required unless error is given"))?;
        let p = provider(&self.settings, &self.plugins, &flow.target).await?;
        let form = vec![
            ("grant_type", "authorization_code".to_owned()),
            ("code", code.to_owned()),
            ("redirect_uri", flow.redirect_uri.clone()),
            ("client_id", p.client.client_id.clone()),
            ("client_secret", p.client.client_secret.expose_secret().to_owned()),
            ("code_verifier", flow.code_verifier.clone()),
        ];
        let tokens = token_request(&self.egress, &p, &flow.workspace_id, form).await?;
        let hosts: Vec<String> =
            p.hosts.iter().filter_map(|h| if let HostPattern::Exact(n) = h { Some(n.clone()) } else { None }).collect();
        if hosts.is_empty() {
            return Err(ApiError::bad_request(
                "OAUTH_NOT_SUPPORTED",
                "the connector declares no exact host a token could be bound to",
            ));
        }
        let mut metadata = json!({ "provider": flow.target, "scopes": tokens.scope.clone().unwrap_or_else(|| p.scopes.join(" ")), "token_type": tokens.token_type });
        if !tokens.account.is_empty() {
            metadata["account"] = Value::Object(tokens.account.clone());
        }
        Ok(Completed {
            workspace_id: flow.workspace_id,
            user_id: flow.user_id,
            session_id: flow.session_id,
            client_source: flow.client_source,
            connector_id: p.connector_id.unwrap_or_else(|| TASKAPP.to_owned()),
            hosts,
            metadata,
            material: Some(SecretMaterial { secret: tokens.access_token, refresh_token: tokens.refresh_token }),
            access_expires_at: tokens.expires_in.map(|s| now_ms() + s * 1000),
        })
    }

    /// The session that started a completed flow, as it stands now: the
    /// initiator's current role in the workspace and the client kind the flow
    /// was started with. A flow whose session was revoked, or whose initiator
    /// left the workspace, completes for nobody.
    pub(crate) async fn initiator(&self, done: &Completed) -> Result<WorkspaceAccess, ApiError> {
        let refused = || {
            ApiError::permission_denied(
                "permission denied: whoever started this authorisation can no longer complete it",
            )
        };
        if let Some(session_id) = &done.session_id {
            let session = self.store.session(session_id).await?.ok_or_else(refused)?;
            if session.revoked_at.is_some() {
                return Err(refused());
            }
        }
        let role = self.store.role_in(&done.user_id, &done.workspace_id).await?.ok_or_else(refused)?;
        Ok(WorkspaceAccess {
            principal: Principal {
                user_id: done.user_id.clone(),
                session_id: done.session_id.clone().unwrap_or_default(),
                client: ClientSource::parse(&done.client_source).unwrap_or(ClientSource::Mcp),
                proposal_requested: false,
            },
            workspace_id: done.workspace_id.clone(),
            role,
        })
    }
}

fn state_error(code: &str, message: &str) -> ApiError {
    ApiError::bad_request(code, message).with_details(json!({ "field": "state" }))
}

/// A token endpoint's answer.
struct Tokens {
    access_token: SecretString,
    refresh_token: Option<SecretString>,
    expires_in: Option<i64>,
    token_type: Option<String>,
    scope: Option<String>,
    /// What the provider said about the account, non-secret ids only.
    account: Map<String, Value>,
}

/// Account ids a token response may carry (HubSpot's `hub_id` and
/// `user_id`, in snake or camel case), kept with the credential under the
/// snake-case name.
const ACCOUNT_FIELDS: [(&str, &str); 2] = [("hub_id", "hubId"), ("user_id", "userId")];

/// A field of a token response in either of the casings providers use
/// (RFC 6749's snake case; camel case in newer references).
fn field<'v>(v: &'v Value, snake: &str, camel: &str) -> &'v Value {
    match &v[snake] {
        Value::Null => &v[camel],
        found => found,
    }
}

/// Reads a token endpoint's successful answer.
fn parse_tokens(v: &Value) -> Option<Tokens> {
    let access = field(v, "access_token", "accessToken").as_str().filter(|s| !s.is_empty())?;
    let scope = match field(v, "scope", "scopes") {
        Value::String(s) => Some(s.clone()),
        Value::Array(items) => Some(items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" ")),
        _ => None,
    };
    let mut account = Map::new();
    for (snake, camel) in ACCOUNT_FIELDS {
        let id = match field(v, snake, camel) {
            Value::Number(n) => Some(n.to_string()),
            Value::String(s)
                if !s.is_empty()
                    && s.len() <= 64
                    && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') =>
            {
                Some(s.clone())
            }
            _ => None,
        };
        if let Some(id) = id {
            account.insert(snake.to_owned(), Value::String(id));
        }
    }
    let expires_in = match field(v, "expires_in", "expiresIn") {
        Value::String(s) => s.parse().ok(),
        other => other.as_i64(),
    };
    Some(Tokens {
        access_token: SecretString::from(access.to_owned()),
        refresh_token: field(v, "refresh_token", "refreshToken")
            .as_str()
            .filter(|s| !s.is_empty())
            .map(|s| SecretString::from(s.to_owned())),
        expires_in,
        token_type: field(v, "token_type", "tokenType").as_str().map(|s| sanitise(s, 32)),
        scope: scope.map(|s| sanitise(&s, 500)),
        account,
    })
}

/// Posts a form to the token endpoint through egress.
async fn token_request(
    egress: &Egress,
    p: &Provider,
    workspace_id: &str,
    form: Vec<(&str, String)>,
) -> Result<Tokens, ApiError> {
    let body = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form.iter().map(|(k, v)| (*k, v.as_str())))
        .finish();
    // An operator-named provider's token endpoint is reached for the
    // exchange though its tokens are bound to the API hosts alone; a
    // connector's own provider must be among the hosts it declares.
    let mut reachable = p.hosts.clone();
    if p.exchange_beyond_hosts
        && let Some(token_host) = Url::parse(&p.token_url).ok().and_then(|u| u.host_str().map(str::to_owned))
        && let Ok(pattern) = HostPattern::parse(&token_host)
        && !reachable.contains(&pattern)
    {
        reachable.push(pattern);
    }
    let caller = Caller {
        plugin_id: p.connector_id.as_deref().unwrap_or(TASKAPP),
        declared_hosts: &reachable,
        workspace_id,
        reach: crate::egress::Reach::Providers,
    };
    let req = OutboundRequest {
        method: Method::Post,
        url: p.token_url.clone(),
        headers: vec![
            ("content-type".into(), "application/x-www-form-urlencoded".into()),
            ("accept".into(), "application/json".into()),
        ],
        body: Some(body.into_bytes()),
        credentials: Vec::new(),
        timeout_ms: Some(30_000),
    };
    let resp = egress.send(&caller, req).await.map_err(|e| match e {
        EgressError::Denied(rule) => ApiError::new(
            axum::http::StatusCode::BAD_GATEWAY,
            "OAUTH_EXCHANGE_FAILED",
            format!("the token endpoint may not be reached: {rule}"),
        ),
        other => ApiError::new(
            axum::http::StatusCode::BAD_GATEWAY,
            "OAUTH_EXCHANGE_FAILED",
            format!("the token endpoint could not be reached: {other}"),
        ),
    })?;
    let v: Value = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
    if !(200..300).contains(&resp.status) {
        let code = v["error"].as_str().map(|e| sanitise(e, 64)).unwrap_or_else(|| format!("http_{}", resp.status));
        return Err(ApiError::new(
            axum::http::StatusCode::BAD_GATEWAY,
            "OAUTH_PROVIDER_ERROR",
            format!("the provider refused the token request: {code}"),
        )
        .with_details(json!({ "provider_error": code })));
    }
    parse_tokens(&v).ok_or_else(|| {
        ApiError::new(
            axum::http::StatusCode::BAD_GATEWAY,
            "OAUTH_PROVIDER_ERROR",
            "the provider's token response has no access token",
        )
    })
}

/// Refreshes OAuth access tokens for the vault when they expire. The vault
/// holds the service weakly (the service's egress client holds the vault).
impl TokenRefresher for OAuth {
    fn refresh<'a>(
        &'a self,
        workspace_id: &'a str,
        provider_target: &'a str,
        refresh_token: &'a SecretString,
    ) -> Pin<Box<dyn Future<Output = Result<Refreshed, RefreshRefused>> + Send + 'a>> {
        Box::pin(async move {
            let p = provider(&self.settings, &self.plugins, provider_target)
                .await
                .map_err(|e| RefreshRefused(e.message))?;
            let form = vec![
                ("grant_type", "refresh_token".to_owned()),
                ("refresh_token", refresh_token.expose_secret().to_owned()),
                ("client_id", p.client.client_id.clone()),
                ("client_secret", p.client.client_secret.expose_secret().to_owned()),
            ];
            let t = token_request(&self.egress, &p, workspace_id, form).await.map_err(|e| RefreshRefused(e.message))?;
            Ok(Refreshed {
                access_token: t.access_token,
                refresh_token: t.refresh_token,
                expires_at: t.expires_in.map(|s| now_ms() + s * 1000),
            })
        })
    }

    fn exchange<'a>(
        &'a self,
        record: &'a CredentialRecord,
        exchange: &'a TokenExchange,
        secret: &'a SecretString,
        refresh_token: Option<&'a SecretString>,
    ) -> Pin<Box<dyn Future<Output = Result<Obtained, ExchangeError>> + Send + 'a>> {
        Box::pin(exchange_token(&self.egress, record, exchange, secret, refresh_token))
    }
}

/// Performs the token request of a credential traded for a token,
/// through egress: to the credential's bound hosts only, under the
/// operator's policy, as the connector it belongs to.
async fn exchange_token(
    egress: &Egress,
    record: &CredentialRecord,
    exchange: &TokenExchange,
    secret: &SecretString,
    refresh_token: Option<&SecretString>,
) -> Result<Obtained, ExchangeError> {
    let hosts: Vec<HostPattern> = record.hosts.iter().filter_map(|h| HostPattern::parse(h).ok()).collect();
    let caller = Caller {
        plugin_id: record.connector_id.as_deref().unwrap_or("credential-exchange"),
        declared_hosts: &hosts,
        workspace_id: &record.workspace_id,
        reach: crate::egress::Reach::Providers,
    };
    super::exchange::trade(egress, &caller, exchange, secret, refresh_token).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_responses_are_read_in_snake_and_camel_case() {
        let snake = parse_tokens(&json!({ "access_token": "a1", "refresh_token": "r1", "expires_in": 1800, "token_type": "bearer", "hub_id": 62515, "scopes": ["oauth", "social"] })).unwrap();
        let camel = parse_tokens(&json!({ "accessToken": "a1", "refreshToken": "r1", "expiresIn": 1800, "tokenType": "bearer", "hubId": 62515, "userId": 77, "scopes": ["oauth", "social"] })).unwrap();
        for t in [&snake, &camel] {
            assert_eq!(t.access_token.expose_secret(), "a1");
            assert_eq!(t.refresh_token.as_ref().unwrap().expose_secret(), "r1");
            assert_eq!(t.expires_in, Some(1800));
            assert_eq!(t.scope.as_deref(), Some("oauth social"));
            assert_eq!(t.account["hub_id"], "62515");
        }
        assert_eq!(camel.account["user_id"], "77");
        assert!(parse_tokens(&json!({ "accessToken": "" })).is_none());
    }

    #[test]
    fn only_plain_ids_are_kept_as_account_facts() {
        let t = parse_tokens(&json!({ "access_token": "a", "user_id": "<script>", "hub_id": { "x": 1 } })).unwrap();
        assert!(t.account.is_empty());
    }
}
