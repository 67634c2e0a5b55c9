//! Credentials (spec section 4, "Credentials"; section 5): the secure
//! flows that accept a secret, and metadata reads that never return one.

use axum::Extension;
use axum::extract::{Path, State};
use secrecy::SecretString;
use serde::Deserialize;
use serde_json::json;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{ApiJson, ApiQuery, PageQuery, SecretJson, Workspace};
use super::{Envelope, Page, ok};
use crate::audit::AuditNote;
use crate::credentials::{NewSecret, SecretMaterial};
use crate::error::{ApiError, ApiResult};
use crate::ops::credentials::{EntryLinkRequest, SecretPlace, Username, credential_fields, store_secret};
use crate::ops::{self, Executed};
use crate::state::AppState;
use crate::store::credentials::CredentialRecord;
use crate::store::entry_links::EntryLink;
use crate::store::kinds::{CredentialKind, CredentialStatus};

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_credential, list_credentials))
        .routes(routes!(get_credential))
        .routes(routes!(revoke_credential))
        .routes(routes!(create_entry_link))
        .routes(routes!(get_entry_link))
}

/// Body of `POST /credentials`: the one generic place a raw secret is
/// accepted over the API.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewCredentialBody {
    /// `api_token` (sent as a bearer token), `basic` (the secret is the
    /// password of `username`, the username beside `password`, or both,
    /// or the pair, with `secret_as`) or
    /// `secret` (sent as the value of `header`, framed by `header_prefix`
    /// and `header_suffix` if given, `query_parameter` or `body_field`).
    #[serde(default = "default_kind")]
    pub kind: CredentialKind,
    /// Connector the credential is for: only that connector's plugin may
    /// use it.
    pub connector_id: Option<String>,
    /// Exact host names the secret may be sent to.
    pub hosts: Vec<String>,
    /// The secret itself. Stored sealed; never returned. Either this or
    /// `reference`.
    #[schema(value_type = Option<String>, format = Password)]
    pub secret: Option<SecretString>,
    /// Where the operator's own store keeps the secret, instead of the
    /// secret: `vault://MOUNT/workspaces/WORKSPACE/PATH#KEY`, `env://NAME`
    /// or `file:///PATH`, among the stores and names the operator allows.
    /// The host reads it when a request needs it and never stores it.
    pub reference: Option<String>,
    pub label: Option<String>,
    /// Username for `basic` credentials (not a secret).
    pub username: Option<String>,
    /// Header name for `secret` credentials, e.g. `X-Api-Key`.
    pub header: Option<String>,
    /// Fixed text the host writes before the secret in `header`, e.g.
    /// `Token token="` (not a secret: shown with the credential).
    pub header_prefix: Option<String>,
    /// Fixed text the host writes after the secret in `header`, e.g. `"`.
    pub header_suffix: Option<String>,
    /// For `basic` credentials whose secret is the username (an API that
    /// takes its key as the Basic username): the password beside it, not a
    /// secret (often empty, or `x`); then `username` is not given.
    pub password: Option<String>,
    /// For `basic` credentials whose secret is both the username and the
    /// password (an API that takes its key as both): `username_and_password`;
    /// whose secret is the pair `username:password`, both parts secret
    /// (an account id and a token): `username:password`. Then neither
    /// `username` nor `password` is given.
    pub secret_as: Option<String>,
    /// Query parameter name for `secret` credentials, e.g. `api_key`: the
    /// host adds it to the URL it sends, never to what a connector sees.
    pub query_parameter: Option<String>,
    /// Field of a JSON or form request body for `secret` credentials,
    /// e.g. `password` (a JSON pointer such as `/auth/key` reaches into an
    /// object): the host sets it in the body it sends.
    pub body_field: Option<String>,
    /// For `secret` credentials that sign requests instead of travelling
    /// in them: `{"algorithm": "hmac-sha256" | "hmac-sha512", "header",
    /// "prefix", "timestamp_header", "parts": [method, path, host,
    /// timestamp, body, body_sha256], "separator", "encoding": "hex" |
    /// "base64"}`.
    #[schema(value_type = Option<Object>)]
    pub signing: Option<serde_json::Value>,
    /// For `secret` credentials the host trades for a token first:
    /// `{"grant": "client_credentials", "token_url", "client_id", "scope"}`,
    /// `{"grant": "jwt_bearer", "token_url", "issuer", "subject",
    /// "audience", "scope", "algorithm": "RS256" | "ES256", "key_id"}` (the
    /// secret a PKCS#8 PEM key) or `{"grant": "login", "token_url",
    /// "username", "username_field", "password_field", "token_pointer",
    /// "lifetime_secs"}` or `{"grant": "refresh_token", "token_url",
    /// "client_id"}` (with `refresh_token`), each with an optional `header` the token goes in
    /// (bearer without). The token URL must be on one of `hosts`.
    #[schema(value_type = Option<Object>)]
    pub exchange: Option<serde_json::Value>,
    /// For `secret` credentials a connector writes into the URL's path:
    /// `true`. The host writes the secret where the connector's URL holds
    /// `%7Bcredential%7D` (`{credential}`), percent-encoded.
    #[serde(default)]
    pub url_path: bool,
    /// For `secret` credentials traded by the `refresh_token` grant: the
    /// refresh token, sealed beside the secret (the client's); the host
    /// keeps the one the provider rotates it to. Never shown again.
    #[schema(value_type = Option<String>, format = Password)]
    pub refresh_token: Option<SecretString>,
}

fn default_kind() -> CredentialKind {
    CredentialKind::ApiToken
}

/// Store a secret; answers its `credential_id` and `credential_handle`.
#[utoipa::path(post, path = "/credentials", tag = "credentials", request_body = NewCredentialBody,
    responses((status = 201, body = Envelope<CredentialRecord>), (status = 400, body = crate::error::ErrorBody)))]
async fn create_credential(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    SecretJson(body): SecretJson<NewCredentialBody>,
) -> ApiResult<Executed> {
    let connector_id = match &body.connector_id {
        Some(c) => Some(
            state
                .plugins
                .canonical_id(c)
                .ok_or_else(|| ApiError::invalid_field("connector_id", "unknown connector"))?,
        ),
        None => None,
    };
    let mut metadata = credential_fields(
        body.kind,
        body.label.as_deref(),
        Username::Given(body.username.as_deref()),
        SecretPlace {
            header: body.header.as_deref(),
            query_parameter: body.query_parameter.as_deref(),
            body_field: body.body_field.as_deref(),
            signing: body.signing.as_ref(),
            exchange: body.exchange.as_ref(),
            url_path: body.url_path,
            header_prefix: body.header_prefix.as_deref(),
            header_suffix: body.header_suffix.as_deref(),
            password: body.password.as_deref(),
            secret_as: body.secret_as.as_deref(),
        },
        &body.hosts,
    )?;
    let mut material = match (body.secret, body.reference) {
        (Some(secret), None) => SecretMaterial::new(secret),
        (None, Some(reference)) => {
            // Reading the store answers whether a name exists: editors only.
            ws.require(crate::access::Role::Editor)?;
            let reference =
                crate::ops::credentials::checked_reference(&state, &ws.workspace_id, body.kind, &metadata, &reference)
                    .await?;
            metadata[crate::credentials::REFERENCE] = json!(reference.text());
            SecretMaterial::new(SecretString::from(reference.text()))
        }
        _ => {
            return Err(ApiError::invalid_field(
                "secret",
                "give the secret, or a reference to where the operator's store keeps it, not both",
            ));
        }
    };
    material.refresh_token = body.refresh_token;
    store_secret(
        &crate::ops::Ctx::request(&state, &ws, &note),
        NewSecret {
            workspace_id: &ws.workspace_id,
            created_by: &ws.principal.user_id,
            kind: body.kind,
            connector_id: connector_id.as_deref(),
            label: body.label.as_deref(),
            hosts: body.hosts,
            metadata,
            material,
            status: CredentialStatus::PendingApproval,
            access_expires_at: None,
        },
    )
    .await
}

/// Credentials of the workspace (metadata only).
#[utoipa::path(get, path = "/credentials", tag = "credentials", params(PageQuery),
    responses((status = 200, body = Envelope<Page<CredentialRecord>>)))]
async fn list_credentials(
    State(state): State<AppState>,
    ws: Workspace,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> ApiResult<Envelope<Page<CredentialRecord>>> {
    let limit = q.limit()?;
    let items = state.store.credentials(&ws.workspace_id, q.after()?.as_deref(), limit + 1).await?;
    Ok(ok(q.page(items, limit, |c| &c.credential_id)))
}

/// A credential's metadata: never the secret, not even a fragment.
#[utoipa::path(get, path = "/credentials/{credential_id}", tag = "credentials", params(("credential_id" = String, Path)),
    responses((status = 200, body = Envelope<CredentialRecord>), (status = 404, body = crate::error::ErrorBody)))]
async fn get_credential(
    State(state): State<AppState>,
    ws: Workspace,
    Path(id): Path<String>,
) -> ApiResult<Envelope<CredentialRecord>> {
    let c = state.store.credential(&ws.workspace_id, &id).await?.ok_or_else(|| ApiError::not_found("credential"))?;
    Ok(ok(c.record))
}

/// Revoke a credential: it stops working at once for every plugin and job,
/// its secret is destroyed, and the record says who revoked it and when.
/// The answer lists the sources that use it (they fail until given a new
/// one). A revoked credential cannot be restored: store a new one.
#[utoipa::path(post, path = "/credentials/{credential_id}/revoke", tag = "credentials", params(("credential_id" = String, Path)),
    responses((status = 200, body = Envelope<serde_json::Value>), (status = 202, body = Envelope<crate::ops::Proposed>),
        (status = 403, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)))]
async fn revoke_credential(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::credentials::CredentialOp::RevokeCredential { credential_id: id }).await
}

/// Ask for a single-use, expiring page where a person types the secret
/// (for CLI and MCP clients, which must never see it). Poll the answer's
/// `poll` path for the resulting handle.
#[utoipa::path(post, path = "/credentials/entry-links", tag = "credentials", request_body = EntryLinkRequest,
    responses((status = 201, body = Envelope<serde_json::Value>), (status = 400, body = crate::error::ErrorBody)))]
async fn create_entry_link(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    body: Result<ApiJson<EntryLinkRequest>, ApiError>,
) -> ApiResult<Executed> {
    let ApiJson(body) = body.map_err(|mut e| {
        // A username shaped like a key (an access key's id) is refused as
        // any body's would be; the page can ask the person for it instead.
        if e.code == "SECRET_NOT_ACCEPTED" && e.details["field"] == "username" {
            e.message = "this username looks like a key, which a request body may not carry: leave username out \
                         and the entry page asks the person for it beside the secret"
                .into();
        }
        e
    })?;
    ops::submit(&state, &ws, &note, crate::ops::credentials::CredentialOp::CreateEntryLink(body)).await
}

/// A credential-entry link's state; once completed it carries the handle.
#[utoipa::path(get, path = "/credentials/entry-links/{entry_id}", tag = "credentials", params(("entry_id" = String, Path)),
    responses((status = 200, body = Envelope<serde_json::Value>), (status = 404, body = crate::error::ErrorBody)))]
async fn get_entry_link(
    State(state): State<AppState>,
    ws: Workspace,
    Path(id): Path<String>,
) -> ApiResult<Envelope<serde_json::Value>> {
    let link: EntryLink = state
        .store
        .entry_link(&ws.workspace_id, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("credential entry link"))?;
    let handle = match &link.credential_id {
        Some(cid) => state.store.credential(&ws.workspace_id, cid).await?.map(|c| c.record.credential_handle),
        None => None,
    };
    Ok(ok(json!({
        "entry_id": link.entry_id,
        "status": link.status,
        "expires_at": link.expires_at,
        "credential_id": link.credential_id,
        "credential_handle": handle,
    })))
}
