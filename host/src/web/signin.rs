//! Web sign-in for returning users: e-mail and password, a browser
//! session in a cookie, and sign-out.
//!
//! The session cookie (`service_session`) holds the token of a web
//! session ([`SessionKind::Web`]): listed in `GET /v1/sessions` and
//! revocable there, accepted by the pages and by nothing else. The pages
//! accept no other kind of token from it (an assistant's MCP token, an API
//! token and a CLI session are all refused), and the API refuses web
//! sessions, so a cookie never makes an API call and no token becomes a
//! person at the pages. The cookie is `HttpOnly`, `SameSite=Lax`, and
//! `Secure` with the `__Host-` prefix when the public URL is HTTPS.
//!
//! Every form carries a CSRF token bound to a pre-session id in the
//! `service_csrf` cookie (`SameSite=Strict`): the token is an HMAC of that
//! id under a server key, so a client cannot pick a pair that matches, and
//! over HTTPS the `__Host-` prefix keeps a sibling site from planting one.
//! A post without a matching token changes nothing.
//!
//! Sign-ins reserve their attempt against the per-address and per-account
//! limits before the password is checked (given back on success), at most
//! a few Argon2id checks run at once, and every check costs the same
//! whether or not the account exists. Sign-ins and sign-outs are audited
//! in the account's workspaces with the client's address. Nothing a user
//! typed as a password is ever rendered back.

use axum::Form;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use super::accounts::ClientInfo;
use super::page::{escape, page};
use crate::access::{ClientSource, passwords, tokens};
use crate::state::AppState;
use crate::store::kinds::AuditOutcome;
use crate::store::sessions::{ActiveSession, SessionKind};

/// The cookie that holds a browser session's token (over plain HTTP).
pub(crate) const SESSION_COOKIE: &str = "service_session";
/// The cookie holding the pre-session id CSRF tokens are bound to (over
/// plain HTTP).
pub(crate) const CSRF_COOKIE: &str = "service_csrf";

/// A cookie's name on this server: `__Host-` prefixed when served over
/// HTTPS, so only this exact origin can set it (no sibling subdomain, no
/// plain-HTTP page).
fn cookie_name(state: &AppState, base: &'static str) -> &'static str {
    match (state.config.public_url.scheme() == "https", base) {
        (true, SESSION_COOKIE) => "__Host-service_session",
        (true, _) => "__Host-service_csrf",
        (false, name) => name,
    }
}

/// The value of cookie `name` in a request.
pub(crate) fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

fn set_cookie(state: &AppState, base: &'static str, value: &str, same_site: &str, max_age_secs: i64) -> HeaderValue {
    let secure = if state.config.public_url.scheme() == "https" { "; Secure" } else { "" };
    let name = cookie_name(state, base);
    HeaderValue::from_str(&format!(
        "{name}={value}; Path=/; HttpOnly; SameSite={same_site}; Max-Age={max_age_secs}{secure}"
    ))
    .expect("cookie text is ASCII")
}

/// The web session a request's cookie names, if it is one and still
/// valid. A token of any other kind (API, CLI, MCP) is no web session,
/// whatever cookie carries it.
pub(crate) async fn browser_session(state: &AppState, headers: &HeaderMap) -> Option<ActiveSession> {
    let token = cookie(headers, cookie_name(state, SESSION_COOKIE))?;
    if !token.starts_with(tokens::TOKEN_PREFIX) || token.len() > 200 {
        return None;
    }
    state.store.active_session(&tokens::hash(&token)).await.ok().flatten().filter(|s| s.kind == SessionKind::Web)
}

/// Whether `id` looks like a pre-session id this server hands out.
fn well_formed(id: &str) -> bool {
    id.len() == 43 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The CSRF token of pre-session `id`.
fn csrf_token(state: &AppState, id: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(state.csrf_key.mac(&[b"csrf", id.as_bytes()]))
}

/// A form's CSRF token: bound to the request's pre-session cookie when it
/// has a well-formed one, else to a new one with the header that sets it.
pub(crate) fn csrf(state: &AppState, headers: &HeaderMap) -> (String, Option<HeaderValue>) {
    match cookie(headers, cookie_name(state, CSRF_COOKIE)).filter(|c| well_formed(c)) {
        Some(id) => (csrf_token(state, &id), None),
        None => {
            let fresh = tokens::generate("").expose_secret().to_owned();
            let set = set_cookie(state, CSRF_COOKIE, &fresh, "Strict", 86_400);
            (csrf_token(state, &fresh), Some(set))
        }
    }
}

/// Whether a posted form's CSRF token is the one bound to the request's
/// pre-session cookie (a value the client picked for both never is).
pub(crate) fn csrf_ok(state: &AppState, headers: &HeaderMap, posted: &str) -> bool {
    use subtle::ConstantTimeEq;
    match cookie(headers, cookie_name(state, CSRF_COOKIE)) {
        Some(id) if well_formed(&id) => csrf_token(state, &id).as_bytes().ct_eq(posted.as_bytes()).into(),
        _ => false,
    }
}

/// The answer to a form posted without its CSRF token.
pub(crate) fn csrf_refused() -> Response {
    let body = "<p>This form has expired or did not come from this service, so nothing was done. Reload the page and try again.</p>";
    (StatusCode::FORBIDDEN, page("Form expired", body)).into_response()
}

/// A page with the CSRF cookie set when it was new.
fn with_cookie(status: StatusCode, body: axum::response::Html<String>, set: Option<HeaderValue>) -> Response {
    let mut response = (status, body).into_response();
    if let Some(set) = set {
        response.headers_mut().append(header::SET_COOKIE, set);
    }
    response
}

/// Where to go after signing in: a path of this service, never another
/// site (`//host`, `/\host` and schemes are refused).
pub(crate) fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && !n.starts_with("/\\")
                && n.len() <= 2000
                && !n.chars().any(|c| c.is_control() || c == '\\') =>
        {
            n.to_owned()
        }
        _ => "/account".to_owned(),
    }
}

#[derive(Deserialize)]
pub(crate) struct Next {
    next: Option<String>,
}

fn sign_in_form(csrf: &str, next: &str, email: &str, problem: Option<&str>) -> axum::response::Html<String> {
    let problem =
        problem.map(|p| format!("<p role=\"alert\" style=\"color:#a00\">{}</p>", escape(p))).unwrap_or_default();
    page(
        "Sign in",
        &format!(
            "{problem}<form method=\"post\" action=\"/sign-in\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><input type=\"hidden\" name=\"next\" value=\"{next}\">\
             <p><label>E-mail<br><input type=\"email\" name=\"email\" value=\"{email}\" autocomplete=\"username\" required autofocus></label></p>\
             <p><label>Password<br><input type=\"password\" name=\"password\" autocomplete=\"current-password\" required></label></p>\
             <p><button type=\"submit\">Sign in</button></p></form>",
            csrf = escape(csrf),
            next = escape(next),
            email = escape(email)
        ),
    )
}

/// `GET /sign-in`: the form, or straight on when already signed in.
pub(crate) async fn sign_in_page(State(state): State<AppState>, headers: HeaderMap, Query(q): Query<Next>) -> Response {
    let next = safe_next(q.next.as_deref());
    if browser_session(&state, &headers).await.is_some() {
        return Redirect::to(&next).into_response();
    }
    let (token, set) = csrf(&state, &headers);
    with_cookie(StatusCode::OK, sign_in_form(&token, &next, "", None), set)
}

#[derive(Deserialize)]
pub(crate) struct SignIn {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    next: Option<String>,
    #[serde(default)]
    email: String,
    #[serde(default)]
    password: String,
}

fn too_many(limited: crate::access::throttle::Limited) -> Response {
    let body = format!("<p>Too many sign-ins. Try again in {} seconds.</p>", limited.seconds());
    let mut response = (StatusCode::TOO_MANY_REQUESTS, page("Sign in", &body)).into_response();
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(limited.seconds()));
    response
}

/// `POST /sign-in`.
pub(crate) async fn sign_in(
    State(state): State<AppState>,
    headers: HeaderMap,
    client: ClientInfo,
    Form(form): Form<SignIn>,
) -> Response {
    if !csrf_ok(&state, &headers, &form.csrf) {
        return csrf_refused();
    }
    let next = safe_next(form.next.as_deref());
    let password = SecretString::from(form.password);
    let email = form.email.trim().to_ascii_lowercase();
    let address = client.ip();
    let (token, set) = csrf(&state, &headers);
    // The attempt is counted before the password is checked, so many at
    // once cannot all slip under the limit; it is given back on success.
    let attempt = match state.throttle.sign_in_attempt(address, &email) {
        Ok(a) => a,
        Err(limited) => return too_many(limited),
    };
    let slot = match state.throttle.password_check() {
        Ok(slot) => slot,
        Err(limited) => {
            attempt.abandoned();
            return too_many(limited);
        }
    };
    let found = match state.store.user_for_sign_in(&email).await {
        Ok(found) => found,
        Err(e) => {
            attempt.abandoned();
            return crate::error::ApiError::from(e).into_response();
        }
    };
    let (user, stored) = match found {
        Some((user, stored)) => (Some(user), stored),
        None => (None, None),
    };
    // The same Argon2 work whether or not the account exists.
    let matched = passwords::verify(password, stored).await;
    drop(slot);
    let user = match user {
        Some(user) if matched => user,
        other => {
            drop(attempt);
            tracing::info!(address = %address, "web sign-in refused");
            if let Some(user) = other {
                let event = super::accounts::AccountEvent {
                    user_id: &user.user_id,
                    session_id: None,
                    client_source: ClientSource::Api,
                    action: "web.sign_in",
                    outcome: AuditOutcome::Denied,
                    status: 401,
                };
                super::accounts::audit_account(&state, &event, &client).await;
            }
            return with_cookie(
                StatusCode::UNAUTHORIZED,
                sign_in_form(&token, &next, &email, Some("That e-mail address and password do not match an account.")),
                set,
            );
        }
    };
    attempt.succeeded();
    let issue = super::accounts::Issue {
        user_id: &user.user_id,
        label: "web sign-in",
        kind: SessionKind::Web,
        client_source: ClientSource::Api,
        not_after: None,
    };
    let (session, session_id) = match super::accounts::issue_session(&state, &client, &issue).await {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let event = super::accounts::AccountEvent {
        user_id: &user.user_id,
        session_id: Some(&session_id),
        client_source: ClientSource::Api,
        action: "web.sign_in",
        outcome: AuditOutcome::Succeeded,
        status: 303,
    };
    super::accounts::audit_account(&state, &event, &client).await;
    let max_age = state.config.session_ttl_ms / 1000;
    let mut response = Redirect::to(&next).into_response();
    *response.status_mut() = StatusCode::SEE_OTHER;
    response
        .headers_mut()
        .append(header::SET_COOKIE, set_cookie(&state, SESSION_COOKIE, session.expose_secret(), "Lax", max_age));
    response
}

/// `GET /account`: who is signed in, and the sign-out form.
pub(crate) async fn account_page(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let Some(session) = browser_session(&state, &headers).await else {
        return Redirect::to("/sign-in?next=/account").into_response();
    };
    let user = match state.store.user(&session.user_id).await {
        Ok(Some(u)) => u,
        Ok(None) => return Redirect::to("/sign-in?next=/account").into_response(),
        Err(e) => return crate::error::ApiError::from(e).into_response(),
    };
    let (token, set) = csrf(&state, &headers);
    let body = format!(
        "<p>Signed in as <strong>{}</strong>.</p>\
         <form method=\"post\" action=\"/sign-out\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><button type=\"submit\">Sign out</button></form>",
        escape(&user.email),
        escape(&token)
    );
    with_cookie(StatusCode::OK, page("Your account", &body), set)
}

#[derive(Deserialize)]
pub(crate) struct SignOut {
    #[serde(default)]
    csrf: String,
}

/// `POST /sign-out`: revokes the browser session and forgets the cookie.
pub(crate) async fn sign_out(
    State(state): State<AppState>,
    headers: HeaderMap,
    client: ClientInfo,
    Form(form): Form<SignOut>,
) -> Response {
    if !csrf_ok(&state, &headers, &form.csrf) {
        return csrf_refused();
    }
    if let Some(session) = browser_session(&state, &headers).await {
        if let Err(e) = crate::ops::sessions::end_session(&state, &session.session_id).await {
            return e.into_response();
        }
        let event = super::accounts::AccountEvent {
            user_id: &session.user_id,
            session_id: Some(&session.session_id),
            client_source: ClientSource::Api,
            action: "web.sign_out",
            outcome: AuditOutcome::Succeeded,
            status: 200,
        };
        super::accounts::audit_account(&state, &event, &client).await;
    }
    let mut response =
        page("Signed out", "<p>You are signed out. <a href=\"/sign-in\">Sign in again</a></p>").into_response();
    response.headers_mut().append(header::SET_COOKIE, set_cookie(&state, SESSION_COOKIE, "", "Lax", 0));
    response
}
