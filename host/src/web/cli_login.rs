//! `service auth login` on the service's side (RFC 8252: a loopback
//! redirect with PKCE).
//!
//! The CLI opens `GET /cli/authorize` with its loopback address, a state,
//! a S256 code challenge and its host name. A signed-in user (or one who
//! signs in first) confirms on the page; the service then redirects the
//! browser to the loopback address with a one-time code (two minutes) and
//! the state. The CLI spends the code at `POST /cli/token` with its
//! verifier and gets a session of its own (client kind `cli`, labelled
//! with its host), listed and revocable like any other.
//!
//! Only `http://127.0.0.1:<port>` and `http://[::1]:<port>` receive codes:
//! a code never leaves the user's machine. A code is spent by its first
//! use, right or wrong, and is worthless without the verifier that only
//! the CLI holds.
//!
//! Only a person signed in on the web (a web session, see
//! [`super::signin`]) can authorise a CLI: no other token in the cookie
//! counts. The CLI session ends when that web session would at the
//! latest, and every authorisation and exchange is audited.

use axum::Form;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use secrecy::ExposeSecret;
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use url::Url;

use super::accounts::ClientInfo;
use super::page::{escape, page};
use super::signin::{browser_session, csrf, csrf_ok, csrf_refused};
use crate::access::{ClientSource, tokens};
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::kinds::AuditOutcome;
use crate::store::sessions::{CliCode, SessionKind};

/// How long a code waits for the CLI.
const CODE_TTL_MS: i64 = 2 * 60 * 1000;

/// What the CLI asks for, as it comes in the query and goes back in the form.
#[derive(Debug, Deserialize)]
pub(crate) struct Authorize {
    #[serde(default)]
    redirect_uri: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    code_challenge: String,
    #[serde(default)]
    code_challenge_method: String,
    #[serde(default)]
    host: String,
    /// On the form: `allow` or `deny`.
    #[serde(default)]
    decision: String,
    #[serde(default)]
    csrf: String,
}

/// A request checked: a loopback address, a state, an S256 challenge.
struct Checked {
    redirect: Url,
    host: String,
}

fn check(a: &Authorize) -> Result<Checked, &'static str> {
    let redirect = Url::parse(&a.redirect_uri).map_err(|_| "redirect_uri must be the CLI's loopback address")?;
    let loopback = matches!(redirect.host(), Some(url::Host::Ipv4(ip)) if ip.is_loopback())
        || matches!(redirect.host(), Some(url::Host::Ipv6(ip)) if ip.is_loopback());
    if redirect.scheme() != "http"
        || !loopback
        || redirect.port().is_none()
        || !redirect.username().is_empty()
        || redirect.password().is_some()
        || redirect.fragment().is_some()
    {
        return Err(
            "redirect_uri must be http://127.0.0.1:<port>/… or http://[::1]:<port>/…: codes only go to this machine",
        );
    }
    if a.state.is_empty() || a.state.len() > 200 {
        return Err("state is required (at most 200 characters)");
    }
    if a.code_challenge_method != "S256"
        || a.code_challenge.len() != 43
        || !a.code_challenge.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err("a code_challenge with code_challenge_method S256 is required");
    }
    let host: String = a.host.chars().filter(|c| !c.is_control()).take(100).collect();
    let host = if host.trim().is_empty() { "an unnamed host".to_owned() } else { host.trim().to_owned() };
    Ok(Checked { redirect, host })
}

fn refused(why: &str) -> Response {
    (StatusCode::BAD_REQUEST, page("Cannot sign in the CLI", &format!("<p>{}</p>", escape(why)))).into_response()
}

fn hidden(name: &str, value: &str) -> String {
    format!("<input type=\"hidden\" name=\"{name}\" value=\"{}\">", escape(value))
}

/// `GET /cli/authorize`: the confirmation page (after signing in).
pub(crate) async fn authorize_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    axum::extract::OriginalUri(uri): axum::extract::OriginalUri,
    Query(a): Query<Authorize>,
) -> Response {
    let checked = match check(&a) {
        Ok(c) => c,
        Err(why) => return refused(why),
    };
    let Some(session) = browser_session(&state, &headers).await else {
        let here = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/cli/authorize");
        let next: String = url::form_urlencoded::byte_serialize(here.as_bytes()).collect();
        return Redirect::to(&format!("/sign-in?next={next}")).into_response();
    };
    let user = match state.store.user(&session.user_id).await {
        Ok(Some(u)) => u,
        Ok(None) => return Redirect::to("/sign-in").into_response(),
        Err(e) => return ApiError::from(e).into_response(),
    };
    let (token, set) = csrf(&state, &headers);
    let fields = [
        hidden("csrf", &token),
        hidden("redirect_uri", &a.redirect_uri),
        hidden("state", &a.state),
        hidden("code_challenge", &a.code_challenge),
        hidden("code_challenge_method", &a.code_challenge_method),
        hidden("host", &checked.host),
    ]
    .concat();
    let body = format!(
        "<p>The <code>service</code> command-line client on <strong>{host}</strong> asks to act as <strong>{email}</strong>.</p>\
         <p>It gets a session of its own, with your access in every workspace you belong to. You can revoke it any time \
         (<code>service auth logout</code>, or <code>POST /v1/sessions/{{session_id}}/revoke</code>).</p>\
         <p>Allow it only if you just ran <code>service auth login</code> on that machine.</p>\
         <form method=\"post\" action=\"/cli/authorize\">{fields}\
         <button type=\"submit\" name=\"decision\" value=\"allow\">Allow</button> \
         <button type=\"submit\" name=\"decision\" value=\"deny\">Deny</button></form>",
        host = escape(&checked.host),
        email = escape(&user.email),
    );
    let mut response = page("Sign in the command-line client", &body).into_response();
    // Browsers hold the redirect after the form to `form-action` too: the
    // checked loopback origin is allowed, nothing else.
    let origin = checked.redirect.origin().ascii_serialization();
    response
        .headers_mut()
        .insert(axum::http::header::CONTENT_SECURITY_POLICY, super::page::csp_with_form_target(&origin));
    if let Some(set) = set {
        response.headers_mut().append(axum::http::header::SET_COOKIE, set);
    }
    response
}

/// `POST /cli/authorize`: on "allow", a one-time code to the loopback
/// address; on "deny", `error=access_denied`.
pub(crate) async fn authorize(
    State(state): State<AppState>,
    headers: HeaderMap,
    client: ClientInfo,
    Form(a): Form<Authorize>,
) -> Response {
    if !csrf_ok(&state, &headers, &a.csrf) {
        return csrf_refused();
    }
    let mut checked = match check(&a) {
        Ok(c) => c,
        Err(why) => return refused(why),
    };
    let Some(session) = browser_session(&state, &headers).await else {
        return Redirect::to("/sign-in").into_response();
    };
    let allowed = a.decision == "allow";
    let event = super::accounts::AccountEvent {
        user_id: &session.user_id,
        session_id: Some(&session.session_id),
        client_source: ClientSource::Api,
        action: "cli.authorize",
        outcome: if allowed { AuditOutcome::Succeeded } else { AuditOutcome::Denied },
        status: 303,
    };
    if !allowed {
        super::accounts::audit_account(&state, &event, &client).await;
        checked.redirect.query_pairs_mut().append_pair("error", "access_denied").append_pair("state", &a.state);
        return Redirect::to(checked.redirect.as_str()).into_response();
    }
    let code = tokens::generate(tokens::CODE_PREFIX);
    let issued = CliCode {
        user_id: session.user_id.clone(),
        code_challenge: a.code_challenge.clone(),
        redirect_uri: a.redirect_uri.clone(),
        host_label: checked.host,
        expires_at: crate::store::now_ms() + CODE_TTL_MS,
        session_expires_at: session.expires_at,
    };
    if let Err(e) = state.store.create_cli_code(&issued, &tokens::hash_secret(&code)).await {
        return ApiError::from(e).into_response();
    }
    super::accounts::audit_account(&state, &event, &client).await;
    checked.redirect.query_pairs_mut().append_pair("code", code.expose_secret()).append_pair("state", &a.state);
    Redirect::to(checked.redirect.as_str()).into_response()
}

#[derive(Debug, Deserialize)]
pub(crate) struct Exchange {
    code: String,
    code_verifier: String,
    redirect_uri: String,
}

/// `POST /cli/token`: a code and its verifier for a CLI session token.
pub(crate) async fn exchange(
    State(state): State<AppState>,
    client: ClientInfo,
    axum::Json(x): axum::Json<Exchange>,
) -> Response {
    let address = client.ip();
    if let Err(limited) = state.throttle.failures_exhausted(address) {
        return limited.into_response();
    }
    let refused = |state: &AppState| {
        state.throttle.failure(address);
        ApiError::bad_request(
            "CLI_LOGIN_REFUSED",
            "the code is unknown, used, expired, or not for this verifier and address: run service auth login again",
        )
        .into_response()
    };
    if x.code.len() > 200 || x.code_verifier.len() < 43 || x.code_verifier.len() > 128 {
        return refused(&state);
    }
    let issued = match state.store.redeem_cli_code(&tokens::hash(&x.code)).await {
        Ok(Some(c)) => c,
        Ok(None) => return refused(&state),
        Err(e) => return ApiError::from(e).into_response(),
    };
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(x.code_verifier.as_bytes()));
    let matches: bool = subtle::ConstantTimeEq::ct_eq(challenge.as_bytes(), issued.code_challenge.as_bytes()).into();
    let mut event = super::accounts::AccountEvent {
        user_id: &issued.user_id,
        session_id: None,
        client_source: ClientSource::Cli,
        action: "cli.token",
        outcome: AuditOutcome::Denied,
        status: 400,
    };
    if !matches || x.redirect_uri != issued.redirect_uri {
        super::accounts::audit_account(&state, &event, &client).await;
        return refused(&state);
    }
    let label = format!("CLI on {}", issued.host_label);
    let issue = super::accounts::Issue {
        user_id: &issued.user_id,
        label: &label,
        kind: SessionKind::Session,
        client_source: ClientSource::Cli,
        not_after: issued.session_expires_at,
    };
    match super::accounts::issue_session(&state, &client, &issue).await {
        Ok((token, session_id)) => {
            event.session_id = Some(&session_id);
            event.outcome = AuditOutcome::Succeeded;
            event.status = 200;
            super::accounts::audit_account(&state, &event, &client).await;
            axum::Json(
                json!({ "access_token": token.expose_secret(), "token_type": "Bearer", "session_id": session_id }),
            )
            .into_response()
        }
        Err(e) => e.into_response(),
    }
}
