//! Accounts at the pages: who a request comes from ([`ClientInfo`]), the
//! sessions pages issue, passwords chosen on a form, and the audit
//! records of what touched an account's access.

use axum::response::IntoResponse;
use secrecy::SecretString;

use super::page::{escape, page};
use crate::access::tokens;
use crate::access::{ClientSource, Principal, WorkspaceAccess};
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::audit::NewAuditRecord;
use crate::store::kinds::AuditOutcome;
use crate::store::sessions::{ActiveSession, NewSession, SessionKind};

/// The password field of the forms that create or first open an account.
pub(crate) const PASSWORD_FIELD: &str = "<p><label>Choose a password for signing in on the web later (at least 12 characters; optional)<br>\
     <input type=\"password\" name=\"password\" autocomplete=\"new-password\" minlength=\"12\"></label></p>";

/// A password chosen on a form: none when left empty; refused (with why)
/// when too short or too long.
pub(crate) fn chosen_password(raw: &str) -> Result<Option<SecretString>, String> {
    if raw.is_empty() {
        return Ok(None);
    }
    let password = SecretString::from(raw.to_owned());
    crate::access::passwords::check(&password)?;
    Ok(Some(password))
}

/// Keeps a chosen password; the account works without it if this fails.
pub(crate) async fn keep_password(state: &AppState, user_id: &str, password: Option<SecretString>) -> bool {
    let Some(p) = password else { return false };
    match crate::access::passwords::hash(p).await {
        Ok(h) => state.store.set_password_hash(user_id, &h).await.is_ok(),
        Err(e) => {
            tracing::error!(error = %e, "could not hash a chosen password");
            false
        }
    }
}

pub(crate) fn password_refused(why: &str) -> axum::response::Response {
    let body = format!(
        "<p>The password was not accepted: {}. Nothing was used up: go back and choose another, or leave it empty.</p>",
        escape(why)
    );
    (axum::http::StatusCode::BAD_REQUEST, page("Choose another password", &body)).into_response()
}

pub(crate) const SIGN_IN_LATER: &str = "With the password you chose, you can also sign in at /sign-in.";

/// Who is signing in, for the session's metadata.
pub(crate) struct ClientInfo {
    pub user_agent: Option<String>,
    pub address: Option<String>,
}

impl ClientInfo {
    /// The client's address for rate limits (unspecified when unknown).
    pub(crate) fn ip(&self) -> std::net::IpAddr {
        self.address.as_deref().and_then(|a| a.parse().ok()).unwrap_or(std::net::IpAddr::from([0, 0, 0, 0]))
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ClientInfo {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        let user_agent = parts
            .headers
            .get(axum::http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .map(|s| s.chars().take(300).collect());
        let address = crate::access::address::of(parts).map(|ip| ip.to_string());
        Ok(ClientInfo { user_agent, address })
    }
}

/// A session a page issues.
pub(crate) struct Issue<'a> {
    pub user_id: &'a str,
    pub label: &'a str,
    pub kind: SessionKind,
    pub client_source: ClientSource,
    /// When it must end at the latest (the session it came from ends
    /// then); otherwise the configured lifetime decides.
    pub not_after: Option<i64>,
}

/// Creates a session; its token and id.
pub(crate) async fn issue_session(
    state: &AppState,
    client: &ClientInfo,
    issue: &Issue<'_>,
) -> Result<(SecretString, String), crate::error::ApiError> {
    let token = tokens::generate(tokens::TOKEN_PREFIX);
    let lifetime = crate::store::now_ms() + state.config.session_ttl_ms;
    let expires_at = issue.not_after.map_or(lifetime, |end| end.min(lifetime));
    let session_id = state
        .store
        .create_session(NewSession {
            user_id: issue.user_id,
            token_hash: &tokens::hash_secret(&token),
            kind: issue.kind,
            label: Some(issue.label),
            client_source: issue.client_source,
            user_agent: client.user_agent.as_deref(),
            address: client.address.as_deref(),
            expires_at: Some(expires_at),
        })
        .await?;
    Ok((token, session_id))
}

/// An API session shown once on a page (one-time login, invitation).
pub(crate) async fn api_session(
    state: &AppState,
    user_id: &str,
    label: &str,
    client: &ClientInfo,
) -> Result<SecretString, crate::error::ApiError> {
    let issue = Issue { user_id, label, kind: SessionKind::Session, client_source: ClientSource::Api, not_after: None };
    issue_session(state, client, &issue).await.map(|(token, _)| token)
}

/// Something that happened to an account's access at a page: a sign-in,
/// a sign-out, a CLI login.
pub(crate) struct AccountEvent<'a> {
    pub user_id: &'a str,
    /// The session that acted or was created.
    pub session_id: Option<&'a str>,
    pub client_source: ClientSource,
    pub action: &'a str,
    pub outcome: AuditOutcome,
    pub status: u16,
}

/// Audits an account event in every workspace the account belongs to, so
/// each workspace's administrators see what touched their members'
/// access, with the client's address. A failure to write is logged: the
/// event has happened.
pub(crate) async fn audit_account(state: &AppState, event: &AccountEvent<'_>, client: &ClientInfo) {
    let workspaces = match state.store.user_with_workspaces(event.user_id, 200).await {
        Ok(Some((_, workspaces))) => workspaces,
        Ok(None) => return,
        Err(e) => {
            tracing::error!(error = %e, action = event.action, "could not write audit record");
            return;
        }
    };
    for w in workspaces {
        let record = NewAuditRecord::event(
            &w.workspace_id,
            event.action,
            event.outcome,
            event.status,
            crate::telemetry::request_id::current(),
        )
        .by(event.user_id)
        .through(event.session_id, event.client_source)
        .on("user", event.user_id)
        .at_address(client.address.as_deref());
        if let Err(e) = state.store.append_audit(&record).await {
            tracing::error!(error = %e, action = event.action, "could not write audit record");
        }
    }
}

/// The signed-in member's standing in a workspace (their first one when
/// none is named).
pub(crate) async fn member_access(
    state: &AppState,
    session: &ActiveSession,
    workspace_id: Option<&str>,
) -> Result<WorkspaceAccess, ApiError> {
    let principal = Principal {
        user_id: session.user_id.clone(),
        session_id: session.session_id.clone(),
        client: session.client_source,
        proposal_requested: false,
    };
    WorkspaceAccess::resolve(&state.store, principal, workspace_id.map(str::to_owned)).await
}
