//! Credential operations. The secret is sealed before the gate is asked,
//! so a proposal never holds one: the stored operation only activates a
//! sealed credential, or creates an entry link.

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::act::{Act, Category, Ctx, Executed};
use super::text::{HOSTS_MAX, LABEL_MAX, SHORT_MAX, check_opt};
use crate::access::Role;
use crate::access::tokens;
use crate::credentials::stores::Reference;
use crate::credentials::{CreateError, NewSecret, SecretError};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::store::kinds::{CredentialKind, CredentialStatus};

/// How long a credential-entry link stays usable.
pub(crate) const ENTRY_LINK_TTL_MS: i64 = 15 * 60 * 1000;

/// What a credential-entry link will create (no secret).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EntryLinkRequest {
    /// `api_token` (sent as a bearer token), `basic` (the secret is the
    /// password of `username`) or `secret` (sent as the value of `header`).
    #[serde(default = "default_kind")]
    pub kind: CredentialKind,
    /// Connector the credential is for.
    pub connector_id: Option<String>,
    /// Exact host names the secret may be sent to.
    pub hosts: Vec<String>,
    /// Free text shown on the entry page and the credential.
    pub label: Option<String>,
    /// Username for `basic` credentials (not a secret). Without one, the
    /// entry page asks the person for it beside the secret.
    pub username: Option<String>,
    /// Header name for `secret` credentials, e.g. `X-Api-Key`.
    #[serde(default)]
    pub header: Option<String>,
    /// Query parameter name for `secret` credentials, e.g. `api_key`.
    #[serde(default)]
    pub query_parameter: Option<String>,
    /// Body field for `secret` credentials, e.g. `password`.
    #[serde(default)]
    pub body_field: Option<String>,
}

impl EntryLinkRequest {
    pub(crate) fn place(&self) -> SecretPlace<'_> {
        SecretPlace {
            header: self.header.as_deref(),
            query_parameter: self.query_parameter.as_deref(),
            body_field: self.body_field.as_deref(),
            ..SecretPlace::default()
        }
    }
}

/// Where a `secret` credential's value goes: exactly one of the three.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SecretPlace<'a> {
    /// Header name, e.g. `X-Api-Key`.
    pub header: Option<&'a str>,
    /// Query parameter name, e.g. `api_key`: the host adds it to the URL
    /// it sends (never to what the connector sees).
    pub query_parameter: Option<&'a str>,
    /// Field of a JSON or form request body, e.g. `password` (a JSON
    /// pointer such as `/auth/key` reaches into an object).
    pub body_field: Option<&'a str>,
    /// A recipe for signing requests with the secret (which then goes
    /// into no request): see `egress::signing::Signing`.
    pub signing: Option<&'a Value>,
    /// A recipe for trading the secret for a token first: see
    /// `credentials::exchange::TokenExchange`.
    pub exchange: Option<&'a Value>,
    /// The secret goes into the URL's path, where the connector's URL
    /// holds `connector_rules::path::CREDENTIAL_MARKER`.
    pub url_path: bool,
    /// Fixed text before and after the secret in `header`
    /// (`Token token="` and `"`).
    pub header_prefix: Option<&'a str>,
    pub header_suffix: Option<&'a str>,
    /// For `basic` credentials whose secret is the username: the password
    /// beside it, not a secret (often empty, or `x`).
    pub password: Option<&'a str>,
    /// For `basic` credentials: `username_and_password` when the secret is
    /// both, `username:password` when it is the pair.
    pub secret_as: Option<&'a str>,
}

fn default_kind() -> CredentialKind {
    CredentialKind::ApiToken
}

/// Largest secret accepted (bytes).
const MAX_SECRET_BYTES: usize = 16 * 1024;
/// Shortest secret accepted (bytes). The egress layer scrubs a secret (and
/// its encodings) from what providers answer; a secret of a character or
/// two would turn that into corruption of ordinary text, and no provider
/// issues one.
const MIN_SECRET_BYTES: usize = 8;

/// Headers beyond the host's own (`connector_rules::headers::RESERVED`) a
/// `secret` credential may not be placed in: they steer the request.
const STEERING_HEADERS: &[&str] = &["content-length", "transfer-encoding", "range", "if-range"];

/// Where a `basic` credential's username comes from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Username<'a> {
    /// With the request (any kind: only `basic` takes one).
    Given(Option<&'a str>),
    /// From the person who types the secret on a credential-entry page.
    OnEntryPage,
}

/// Checks the non-secret fields of a credential to create and answers the
/// metadata stored with it: the username of a `basic` credential and the
/// header, query parameter or body field of a `secret` one. They fix where the host places the secret, so
/// a plugin cannot choose another place (a header it controls, or Basic
/// with a username of its own).
///
/// With [`Username::OnEntryPage`], a `basic` credential's metadata has no
/// username yet: the entry page asks for it.
pub(crate) fn credential_fields(
    kind: CredentialKind,
    label: Option<&str>,
    username: Username<'_>,
    place: SecretPlace<'_>,
    hosts: &[String],
) -> ApiResult<Value> {
    check_opt("label", label, LABEL_MAX)?;
    let header = place.header;
    check_opt("header", header, SHORT_MAX)?;
    check_opt("query_parameter", place.query_parameter, SHORT_MAX)?;
    check_opt("body_field", place.body_field, SHORT_MAX)?;
    let elsewhere = place.query_parameter.is_some()
        || place.body_field.is_some()
        || place.signing.is_some()
        || place.exchange.is_some()
        || place.url_path;
    let framed = place.header_prefix.is_some() || place.header_suffix.is_some();
    let (username, on_page) = match username {
        Username::Given(given) => {
            check_opt("username", given, SHORT_MAX)?;
            (given, false)
        }
        Username::OnEntryPage => (None, true),
    };
    if hosts.len() > HOSTS_MAX {
        return Err(ApiError::invalid_field("hosts", format!("at most {HOSTS_MAX} hosts")));
    }
    match kind {
        CredentialKind::ApiToken => {
            if username.is_some()
                || header.is_some()
                || elsewhere
                || framed
                || place.password.is_some()
                || place.secret_as.is_some()
            {
                return Err(ApiError::invalid_field(
                    "kind",
                    "an api_token is sent as a bearer token: it takes no username, header, query_parameter or body_field",
                ));
            }
            Ok(json!({}))
        }
        CredentialKind::Basic => {
            if header.is_some() || elsewhere || framed {
                return Err(ApiError::invalid_field(
                    "header",
                    "a basic credential is sent as HTTP Basic: it takes no header, query_parameter or body_field",
                ));
            }
            if let Some(secret_as) = place.secret_as {
                if secret_as != SECRET_AS_BOTH && secret_as != SECRET_AS_PAIR {
                    return Err(ApiError::invalid_field(
                        "secret_as",
                        format!(
                            "secret_as is `{SECRET_AS_BOTH}` (the secret as both parts of HTTP Basic), `{SECRET_AS_PAIR}` (the secret is the pair username:password) or not given"
                        ),
                    ));
                }
                if username.is_some() || on_page || place.password.is_some() {
                    return Err(ApiError::invalid_field(
                        "secret_as",
                        "a basic credential whose secret is both username and password takes no username or password",
                    ));
                }
                return Ok(json!({ "secret_as": secret_as }));
            }
            if let Some(password) = place.password {
                // The secret is the username; the password is none.
                if username.is_some() || on_page {
                    return Err(ApiError::invalid_field(
                        "password",
                        "a basic credential with a password has the secret as its username: it takes no username",
                    ));
                }
                check_placeholder("password", password)?;
                return Ok(json!({ "password": password }));
            }
            if on_page {
                return Ok(json!({}));
            }
            let user = username
                .filter(|u| check_username(u).is_ok())
                .ok_or_else(|| ApiError::invalid_field("username", USERNAME_RULE))?;
            Ok(json!({ "username": user }))
        }
        CredentialKind::Secret => {
            if username.is_some() {
                return Err(ApiError::invalid_field("username", "a secret credential takes no username"));
            }
            if place.password.is_some() || place.secret_as.is_some() {
                let field = if place.password.is_some() { "password" } else { "secret_as" };
                return Err(ApiError::invalid_field(field, format!("a secret credential takes no {field}")));
            }
            if framed && header.is_none() {
                return Err(ApiError::invalid_field(
                    "header_prefix",
                    "header_prefix and header_suffix frame the secret in a header: give the header too",
                ));
            }
            let places = [
                header.is_some(),
                place.query_parameter.is_some(),
                place.body_field.is_some(),
                place.signing.is_some(),
                place.exchange.is_some(),
                place.url_path,
            ];
            if places.iter().filter(|p| **p).count() > 1 {
                return Err(ApiError::invalid_field(
                    "header",
                    "a secret credential goes in one place: a header, a query_parameter, a body_field, the url_path, signing or an exchange",
                ));
            }
            if place.url_path {
                return Ok(json!({ "url_path": true }));
            }
            if let Some(recipe) = place.exchange {
                let exchange: crate::credentials::exchange::TokenExchange = serde_json::from_value(recipe.clone())
                    .map_err(|e| ApiError::invalid_field("exchange", format!("not a token exchange: {e}")))?;
                let bound = crate::credentials::bound_hosts(hosts).map_err(|e| ApiError::invalid_field("hosts", e))?;
                exchange.check(&bound).map_err(|m| ApiError::invalid_field("exchange", m))?;
                return Ok(json!({ "exchange": exchange }));
            }
            if let Some(recipe) = place.signing {
                let signing: crate::egress::signing::Signing = serde_json::from_value(recipe.clone())
                    .map_err(|e| ApiError::invalid_field("signing", format!("not a signing recipe: {e}")))?;
                signing.check().map_err(|m| ApiError::invalid_field("signing", m))?;
                return Ok(json!({ "signing": signing }));
            }
            if let Some(name) = place.query_parameter {
                if name.is_empty() || name.chars().any(|c| c.is_control() || c.is_whitespace() || "&=#+%".contains(c)) {
                    return Err(ApiError::invalid_field(
                        "query_parameter",
                        format!("'{name}' is not a query parameter name (no spaces, control characters or & = # + %)"),
                    ));
                }
                return Ok(json!({ "query_parameter": name }));
            }
            if let Some(field) = place.body_field {
                if field.is_empty() || field == "/" || field.chars().any(char::is_control) {
                    return Err(ApiError::invalid_field(
                        "body_field",
                        format!("'{field}' is not a body field: a key, or a JSON pointer such as /auth/key"),
                    ));
                }
                return Ok(json!({ "body_field": field }));
            }
            let name = header.map(str::to_ascii_lowercase).ok_or_else(|| {
                ApiError::invalid_field(
                    "header",
                    "a secret credential needs the header, query_parameter or body_field it is sent in, e.g. header X-Api-Key",
                )
            })?;
            let token_char = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
            if name.is_empty()
                || !name.chars().all(token_char)
                // (The whole Authorization header is a secret's place: some
                // APIs take a key there with no scheme.)
                || (connector_rules::headers::is_reserved(&name) && name != "authorization")
                || STEERING_HEADERS.contains(&name.as_str())
            {
                return Err(ApiError::invalid_field("header", format!("'{name}' cannot carry a credential")));
            }
            if !framed {
                return Ok(json!({ "header": name }));
            }
            let (prefix, suffix) = (place.header_prefix.unwrap_or_default(), place.header_suffix.unwrap_or_default());
            check_placeholder("header_prefix", prefix)?;
            check_placeholder("header_suffix", suffix)?;
            Ok(json!({ "header": name, "prefix": prefix, "suffix": suffix }))
        }
        CredentialKind::Oauth2 => Err(ApiError::invalid_field(
            "kind",
            "oauth2 credentials come from an OAuth flow; kind must be api_token, basic or secret",
        )),
    }
}

/// Text the host writes beside a secret (a header's prefix, a Basic
/// password that is none): short, printable, and not itself shaped like a
/// secret (it is shown with the credential).
fn check_placeholder(field: &str, text: &str) -> ApiResult<()> {
    check_opt(field, Some(text), SHORT_MAX)?;
    if text.chars().any(char::is_control) {
        return Err(ApiError::invalid_field(field, format!("{field} holds control characters")));
    }
    if crate::credentials::lookalike::looks_like_secret_value(text) {
        return Err(ApiError::secret_refused(field));
    }
    Ok(())
}

/// A `basic` credential's `secret_as` when its secret is both the username
/// and the password.
pub(crate) const SECRET_AS_BOTH: &str = "username_and_password";
pub(crate) use crate::credentials::vault::SECRET_AS_PAIR;

/// What a `basic` credential's username must be.
const USERNAME_RULE: &str = "a basic credential needs a username (without ':' or control characters)";

/// Checks the username of a `basic` credential: HTTP Basic joins it to the
/// secret with `:`, so it holds none, nor control characters.
pub(crate) fn check_username(username: &str) -> Result<(), String> {
    if username.is_empty() || username.contains(':') || username.chars().any(char::is_control) {
        return Err(USERNAME_RULE.to_owned());
    }
    if username.chars().count() > SHORT_MAX {
        return Err(format!("a username has at most {SHORT_MAX} characters"));
    }
    Ok(())
}

/// Checks a secret for a credential of `kind`: its length, and that it can
/// travel where the kind puts it.
pub(crate) fn check_secret(kind: CredentialKind, secret: &str) -> Result<(), String> {
    if secret.len() < MIN_SECRET_BYTES {
        return Err(format!("the secret must be at least {MIN_SECRET_BYTES} bytes"));
    }
    if secret.len() > MAX_SECRET_BYTES {
        return Err(format!("the secret exceeds {MAX_SECRET_BYTES} bytes"));
    }
    // A bearer token or header value travels as a header as it is: visible
    // ASCII only (a Basic password is encoded, so it may hold anything but
    // control characters).
    let fits = match kind {
        CredentialKind::Basic => !secret.chars().any(char::is_control),
        _ => secret.chars().all(|c| c.is_ascii_graphic()),
    };
    if !fits {
        return Err("the secret holds characters that cannot travel in a request header (spaces, control or non-ASCII characters)".into());
    }
    Ok(())
}

/// A reference to a secret in the operator's store, checked for a
/// credential of `kind` in `workspace_id`: the store is configured, the
/// workspace may name it, and it holds a value that fits the kind (read
/// once, never kept or shown).
pub(crate) async fn checked_reference(
    state: &AppState,
    workspace_id: &str,
    kind: CredentialKind,
    metadata: &Value,
    text: &str,
) -> ApiResult<Reference> {
    let reference = Reference::parse(text).map_err(|e| ApiError::invalid_field("reference", e.to_string()))?;
    let stores = state.vault.stores();
    stores.allows(workspace_id, &reference).map_err(|e| ApiError::invalid_field("reference", e.to_string()))?;
    if kind == CredentialKind::Oauth2 {
        return Err(ApiError::invalid_field("reference", "an OAuth credential's tokens are the host's to keep"));
    }
    let (value, _) = stores.resolve(workspace_id, &reference).await.map_err(|e| match e {
        SecretError::SecretStoreUnavailable(_) => ApiError::unavailable(e.to_string()),
        other => ApiError::invalid_field("reference", other.to_string()),
    })?;
    value_fits(kind, metadata, &value)
        .map_err(|m| ApiError::invalid_field("reference", format!("the value it names does not fit: {m}")))?;
    Ok(reference)
}

/// Whether `secret` can be what a credential of `kind` with `metadata`
/// holds: one traded for a token goes in the token request's body (any
/// text, a PEM key too, which must parse); any other into a request as
/// its kind says.
fn value_fits(kind: CredentialKind, metadata: &Value, secret: &SecretString) -> Result<(), String> {
    let exchange = metadata
        .get("exchange")
        .and_then(|e| serde_json::from_value::<crate::credentials::exchange::TokenExchange>(e.clone()).ok());
    match &exchange {
        Some(exchange) => {
            let text = secret.expose_secret();
            if text.len() < MIN_SECRET_BYTES || text.len() > MAX_SECRET_BYTES {
                return Err(format!("the secret must be {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes"));
            }
            crate::credentials::exchange::check_secret(exchange, secret)
        }
        None if metadata.get("secret_as").and_then(Value::as_str) == Some(SECRET_AS_PAIR) => {
            check_secret(kind, secret.expose_secret())?;
            check_pair(secret.expose_secret())
        }
        None => check_secret(kind, secret.expose_secret()),
    }
}

/// A refresh token beside the secret exactly when the credential is traded
/// by the refresh-token grant: the host keeps the one the provider rotates
/// to, so it is given here, never as a reference to a store the host does
/// not write.
fn refresh_token_fits(
    metadata: &Value,
    referenced: bool,
    refresh_token: Option<&SecretString>,
    kind: CredentialKind,
) -> Result<(), String> {
    let refreshes = metadata
        .get("exchange")
        .and_then(|e| serde_json::from_value::<crate::credentials::exchange::TokenExchange>(e.clone()).ok())
        .is_some_and(|e| e.refreshes());
    match refresh_token {
        None if refreshes => {
            Err("a credential traded by the refresh_token grant holds the refresh token: give it beside the secret".into())
        }
        Some(_) if !refreshes && kind != CredentialKind::Oauth2 => {
            Err("only a credential traded by the refresh_token grant takes a refresh token".into())
        }
        Some(_) if referenced => Err(
            "the host stores the refresh token the provider rotates to: give the client's secret itself, not a reference"
                .into(),
        ),
        Some(token) if token.expose_secret().len() < MIN_SECRET_BYTES || token.expose_secret().len() > MAX_SECRET_BYTES => {
            Err(format!("the refresh token must be {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes"))
        }
        _ => Ok(()),
    }
}

/// A secret that is a Basic pair: `username:password`, each part long
/// enough to be scrubbed from answers on its own.
fn check_pair(secret: &str) -> Result<(), String> {
    let (user, password) = crate::egress::basic_pair(secret);
    if !secret.contains(':') || user.len() < MIN_SECRET_BYTES || password.len() < MIN_SECRET_BYTES {
        return Err(format!(
            "the secret is the pair username:password, each part at least {MIN_SECRET_BYTES} bytes (the username holds no ':')"
        ));
    }
    Ok(())
}

/// Seals a secret as a pending credential and lets the gate activate it
/// (or propose its activation). Every flow that accepts a secret ends here.
pub(crate) async fn store_secret(ctx: &Ctx<'_>, new: NewSecret<'_>) -> ApiResult<Executed> {
    let (state, ws, note) = (ctx.state, ctx.access, ctx.note);
    note.action("credentials.create");
    ws.require(Role::Editor)?;
    // A reference was checked against the value it names.
    let referenced = new.metadata.get(crate::credentials::REFERENCE).is_some();
    if !referenced {
        value_fits(new.kind, &new.metadata, &new.material.secret).map_err(|m| ApiError::invalid_field("secret", m))?;
    }
    refresh_token_fits(&new.metadata, referenced, new.material.refresh_token.as_ref(), new.kind)
        .map_err(|m| ApiError::invalid_field("refresh_token", m))?;
    let record = state.vault.create(new).await.map_err(|e| match e {
        CreateError::InvalidHost(m) => ApiError::invalid_field("hosts", m),
        CreateError::Store(e) => e.into(),
    })?;
    super::submit(state, ws, note, CredentialOp::ActivateCredential { credential_id: record.credential_id }).await
}

pub(crate) async fn activate(ctx: &Ctx<'_>, credential_id: &str) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("credential", credential_id);
    if !state
        .store
        .set_credential_status(
            &access.workspace_id,
            credential_id,
            CredentialStatus::PendingApproval,
            CredentialStatus::Active,
        )
        .await?
    {
        return Err(ApiError::conflict("CREDENTIAL_NOT_PENDING", "the credential is not awaiting activation"));
    }
    let record = state
        .store
        .credential(&access.workspace_id, credential_id)
        .await?
        .ok_or_else(|| ApiError::not_found("credential"))?
        .record;
    Executed::created(record)
}

/// The sources of a workspace whose configuration names `handle`.
pub(crate) async fn sources_using(state: &AppState, workspace_id: &str, handle: &str) -> ApiResult<Vec<String>> {
    let sources = state.store.sources(workspace_id, None, None, 100_000).await?;
    Ok(sources
        .into_iter()
        .filter(|s| s.configuration.as_object().is_some_and(|c| c.values().any(|v| v.as_str() == Some(handle))))
        .map(|s| s.source_id)
        .collect())
}

/// Revokes a credential: it stops working for every plugin and job, its
/// secret is destroyed, and the record says who revoked it and when. The
/// answer names the sources that use it.
pub(crate) async fn revoke(ctx: &Ctx<'_>, credential_id: &str) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("credential", credential_id);
    let current = state
        .store
        .credential(&access.workspace_id, credential_id)
        .await?
        .ok_or_else(|| ApiError::not_found("credential"))?;
    if current.record.status == CredentialStatus::Revoked {
        return Err(ApiError::conflict("CREDENTIAL_REVOKED", "the credential is already revoked"));
    }
    if !state.vault.revoke(&access.workspace_id, credential_id, &access.principal.user_id).await? {
        return Err(ApiError::conflict("CREDENTIAL_REVOKED", "the credential is already revoked"));
    }
    let record = state
        .store
        .credential(&access.workspace_id, credential_id)
        .await?
        .ok_or_else(|| ApiError::not_found("credential"))?
        .record;
    let used_by = sources_using(state, &access.workspace_id, record.credential_handle.as_str()).await?;
    Executed::ok(json!({ "credential": record, "sources_using_it": used_by }))
}

pub(crate) async fn create_entry_link(ctx: &Ctx<'_>, req: EntryLinkRequest) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    // A `basic` link without a username leaves it to the person too, who
    // types it beside the secret (an access key's id, say, which request
    // bodies refuse because it looks like a key).
    let username = match (req.kind, req.username.as_deref()) {
        (CredentialKind::Basic, None) => Username::OnEntryPage,
        (_, given) => Username::Given(given),
    };
    let placement = credential_fields(req.kind, req.label.as_deref(), username, req.place(), &req.hosts)?;
    let hosts = crate::credentials::bound_hosts(&req.hosts).map_err(|e| ApiError::invalid_field("hosts", e))?;
    let connector_id = match &req.connector_id {
        Some(c) => Some(
            state
                .plugins
                .canonical_id(c)
                .ok_or_else(|| ApiError::invalid_field("connector_id", "unknown connector"))?,
        ),
        None => None,
    };
    // The page tells a person where their secret will go: only where the
    // operator lets it go, and only where the connector goes.
    let declared = match &connector_id {
        Some(id) => Some(
            state
                .plugins
                .summary(id)
                .await?
                .ok_or_else(|| ApiError::invalid_field("connector_id", "unknown connector"))?
                .info
                .hosts,
        ),
        None => None,
    };
    for h in &hosts {
        let policy = state.egress.policy();
        let allowed = policy.allowed_hosts.iter().chain(&policy.webhook_hosts).any(|p| p.matches(h));
        if !allowed && !state.config.plugins.warehouses.allows_name(h) {
            return Err(ApiError::invalid_field(
                "hosts",
                format!(
                    "{h} is not a host the operator allows; a credential-entry link can only send a secret where the operator lets it go"
                ),
            ));
        }
        if let Some(declared) = &declared
            && !declared.iter().any(|p| p.matches(h))
        {
            return Err(ApiError::invalid_field("hosts", format!("{h} is not a host the connector reaches")));
        }
    }
    let spec = json!({ "kind": req.kind, "connector_id": connector_id, "hosts": hosts, "label": req.label, "placement": placement });
    let token = tokens::generate(tokens::CODE_PREFIX);
    let link = state
        .store
        .create_entry_link(
            &access.workspace_id,
            &tokens::hash_secret(&token),
            &access.principal.user_id,
            &spec,
            crate::store::now_ms() + ENTRY_LINK_TTL_MS,
        )
        .await?;
    note.target("credential_entry_link", &link.entry_id);
    let url = state
        .config
        .public_url
        .join(&format!("credential-entry/{}", token.expose_secret()))
        .map_err(ApiError::internal)?;
    Ok(Executed::created(json!({
        "entry_id": link.entry_id,
        "url": url.to_string(),
        "expires_at": link.expires_at,
        "status": link.status,
        "poll": format!("/v1/credentials/entry-links/{}", link.entry_id),
    }))?
    .shown_once(&["/url"]))
}

/// Starts an OAuth flow for a source connector or the task app.
pub(crate) async fn start_oauth(ctx: &Ctx<'_>, target: &str) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("oauth_flow", target);
    let started = state.oauth.start(access, target).await?;
    Ok(Executed::ok(started)?.shown_once(&["/authorization_url", "/state"]))
}

/// Credential operations. The secret is sealed before the gate is asked, so
/// none of these holds one.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "operation", rename_all = "snake_case")]
pub(crate) enum CredentialOp {
    /// Activate a credential whose secret was sealed by a credential flow.
    ActivateCredential { credential_id: String },
    /// Create a single-use link where a person enters a secret.
    CreateEntryLink(EntryLinkRequest),
    /// Start an OAuth flow (a connector id, or `taskapp`).
    StartOAuth { target: String },
    /// Revoke a credential and destroy its secret.
    RevokeCredential { credential_id: String },
}

impl Act for CredentialOp {
    fn action(&self) -> &'static str {
        match self {
            CredentialOp::ActivateCredential { .. } => "credentials.create",
            CredentialOp::CreateEntryLink(_) => "credentials.entry_link",
            CredentialOp::StartOAuth { .. } => "credentials.oauth_start",
            CredentialOp::RevokeCredential { .. } => "credentials.revoke",
        }
    }

    fn category(&self) -> Category {
        match self {
            CredentialOp::ActivateCredential { .. } | CredentialOp::RevokeCredential { .. } => Category::Credentials,
            CredentialOp::CreateEntryLink(_) | CredentialOp::StartOAuth { .. } => Category::CredentialEntry,
        }
    }

    fn summary(&self) -> String {
        match self {
            CredentialOp::ActivateCredential { credential_id } => format!("Activate credential {credential_id}"),
            CredentialOp::CreateEntryLink(r) => {
                format!("Create a {} credential-entry link for {}", r.kind, r.hosts.join(", "))
            }
            CredentialOp::StartOAuth { target } => format!("Start an OAuth authorisation for {target}"),
            CredentialOp::RevokeCredential { credential_id } => {
                format!("Revoke credential {credential_id} and destroy its secret")
            }
        }
    }
}

impl CredentialOp {
    pub(super) async fn run(self, ctx: &Ctx<'_>) -> ApiResult<Executed> {
        match self {
            CredentialOp::ActivateCredential { credential_id } => activate(ctx, &credential_id).await,
            CredentialOp::CreateEntryLink(req) => create_entry_link(ctx, req).await,
            CredentialOp::StartOAuth { target } => start_oauth(ctx, &target).await,
            CredentialOp::RevokeCredential { credential_id } => revoke(ctx, &credential_id).await,
        }
    }
}
