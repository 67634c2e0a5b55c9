//! Joining a workspace by an invitation link.
//!
//! The page looks the same whether or not the invited address has an
//! account, so whoever holds the link (the administrator who made it,
//! say) does not learn that from it. Someone new creates their account
//! and gets a first token; the invited account joins while signed in on
//! the web (a web session of that very address: no other token in the
//! cookie counts), and the link signs nobody in.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;

use super::accounts::{
    ClientInfo, PASSWORD_FIELD, SIGN_IN_LATER, api_session, chosen_password, keep_password, password_refused,
};
use super::page::{escape, gone, page, token_page};
use super::signin::{browser_session, csrf, csrf_ok, csrf_refused};
use crate::access::tokens;
use crate::state::AppState;
use crate::store::audit::NewAuditRecord;
use crate::store::invitations::{AcceptError, AcceptedInvitation, Acceptor};
use crate::store::kinds::AuditOutcome;

/// `GET /invitations/{token}`.
pub(crate) async fn invitation_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(token): Path<String>,
) -> axum::response::Response {
    let inv = match state.store.pending_invitation(&tokens::hash(&token)).await {
        Ok(Some(inv)) => inv,
        Ok(None) => return gone("invitation"),
        Err(e) => return crate::error::ApiError::from(e).into_response(),
    };
    let signed_in = match browser_session(&state, &headers).await {
        Some(session) => state.store.user(&session.user_id).await.ok().flatten(),
        None => None,
    };
    let (csrf_token, set) = csrf(&state, &headers);
    let intro = format!(
        "<p>You are invited to <strong>{}</strong> as <strong>{}</strong> ({}).</p>",
        escape(&inv.workspace_name),
        inv.role.as_str(),
        escape(&inv.email)
    );
    let here: String = url::form_urlencoded::byte_serialize(format!("/invitations/{token}").as_bytes()).collect();
    let existing = match &signed_in {
        Some(user) if user.email.eq_ignore_ascii_case(&inv.email) => format!(
            "<form method=\"post\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"join_as\" value=\"account\">\
             <button type=\"submit\">Join as {}</button></form>",
            escape(&csrf_token),
            escape(&user.email)
        ),
        Some(user) => format!(
            "<p>You are signed in as {}, not as the invited address. To join with the account of {}, \
             <a href=\"/account\">sign out</a> and sign in with it.</p>",
            escape(&user.email),
            escape(&inv.email)
        ),
        None => format!(
            "<p>Have an account with this address? <a href=\"/sign-in?next={here}\">Sign in</a> and join from this page.</p>"
        ),
    };
    let new_account = format!(
        "<h2>New here?</h2><form method=\"post\"><p><label>Your name <input name=\"name\" maxlength=\"200\"></label></p>{PASSWORD_FIELD}\
         <button type=\"submit\">Create my account and join</button></form>"
    );
    let mut response = page("Join workspace", &format!("{intro}{existing}{new_account}")).into_response();
    if let Some(set) = set {
        response.headers_mut().append(header::SET_COOKIE, set);
    }
    response
}

#[derive(serde::Deserialize, Default)]
pub(crate) struct AcceptForm {
    #[serde(default)]
    name: String,
    #[serde(default)]
    password: String,
    /// `account`: the signed-in account joins.
    #[serde(default)]
    join_as: String,
    #[serde(default)]
    csrf: String,
}

/// `POST /invitations/{token}`: creates an account for an address without
/// one and shows its first token, or lets the invited account, signed in
/// on the web, join.
pub(crate) async fn accept_invitation(
    State(state): State<AppState>,
    headers: HeaderMap,
    client: ClientInfo,
    Path(token): Path<String>,
    form: Result<axum::Form<AcceptForm>, axum::extract::rejection::FormRejection>,
) -> axum::response::Response {
    let form = form.map(|f| f.0).unwrap_or_default();
    if form.join_as == "account" {
        return join_signed_in(&state, &headers, &client, &token, &form.csrf).await;
    }
    let name = form.name.trim().chars().take(200).collect::<String>();
    let password = match chosen_password(&form.password) {
        Ok(p) => p,
        Err(why) => return password_refused(&why),
    };
    let accepted = match state
        .store
        .accept_invitation(&tokens::hash(&token), Acceptor::NewAccount { name: &name })
        .await
    {
        Ok(Ok(a)) => a,
        Ok(Err(AcceptError::AccountExists)) => {
            let body = "<p>No account was created. If this address has an account already, sign in with it and join from the invitation's page; \
                 this link signs nobody in.</p>";
            return (StatusCode::CONFLICT, page("Sign in to join", body)).into_response();
        }
        Ok(Err(_)) => return gone("invitation"),
        Err(e) => return crate::error::ApiError::from(e).into_response(),
    };
    audit_accepted(&state, &accepted, None, &client).await;
    let later = if keep_password(&state, &accepted.user_id, password).await { SIGN_IN_LATER } else { "" };
    match api_session(&state, &accepted.user_id, "invitation", &client).await {
        Ok(token) => token_page(
            "Invitation accepted",
            &format!("You joined workspace {} as {}. {later}", accepted.workspace_id, accepted.role.as_str()),
            &token,
        )
        .into_response(),
        Err(e) => e.into_response(),
    }
}

/// The invited account joins, signed in on the web: nothing is issued.
async fn join_signed_in(
    state: &AppState,
    headers: &HeaderMap,
    client: &ClientInfo,
    token: &str,
    posted_csrf: &str,
) -> axum::response::Response {
    if !csrf_ok(state, headers, posted_csrf) {
        return csrf_refused();
    }
    let Some(session) = browser_session(state, headers).await else {
        return (
            StatusCode::UNAUTHORIZED,
            page(
                "Sign in to join",
                "<p>Sign in on the web with the invited account, then join from the invitation's page.</p>",
            ),
        )
            .into_response();
    };
    match state.store.accept_invitation(&tokens::hash(token), Acceptor::Account { user_id: &session.user_id }).await {
        Ok(Ok(accepted)) => {
            audit_accepted(state, &accepted, Some(&session.session_id), client).await;
            page("Invitation accepted", &format!("<p>You joined workspace {} as {}.</p>", escape(&accepted.workspace_id), accepted.role.as_str())).into_response()
        }
        Ok(Err(AcceptError::WrongAccount)) => {
            (StatusCode::FORBIDDEN, page("Another account", "<p>This invitation is for another address than the account you are signed in with. Nothing was changed.</p>")).into_response()
        }
        Ok(Err(_)) => gone("invitation"),
        Err(e) => crate::error::ApiError::from(e).into_response(),
    }
}

async fn audit_accepted(
    state: &AppState,
    accepted: &AcceptedInvitation,
    session_id: Option<&str>,
    client: &ClientInfo,
) {
    let record = NewAuditRecord::event(
        &accepted.workspace_id,
        "invitations.accept",
        AuditOutcome::Succeeded,
        200,
        crate::telemetry::request_id::current(),
    )
    .by(&accepted.user_id)
    .through(session_id, crate::access::ClientSource::Api)
    .on("invitation", &accepted.invitation_id)
    .at_address(client.address.as_deref());
    if let Err(e) = state.store.append_audit(&record).await {
        tracing::error!(error = %e, "could not write audit record");
    }
}
