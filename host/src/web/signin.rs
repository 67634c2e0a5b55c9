//! Web sign-in for returning users: e-mail and password, a browser
//! session in a cookie, and sign-out.
//!
//! The session cookie (`service_session`) holds a session token like any
//! other (listed in `GET /v1/sessions`, revocable there); it is
//! `HttpOnly`, `SameSite=Lax`, and `Secure` when the public URL is HTTPS.
//! The API never reads cookies, only `Authorization`, so a cookie cannot
//! make an API call on anyone's behalf. Every form carries a CSRF token
//! that must match the `service_csrf` cookie (`SameSite=Strict`); a post
//! without it changes nothing. Failed sign-ins are throttled per address
//! and per account, and cost an Argon2id check whether or not the account
//! exists. Nothing a user typed as a password is ever rendered back.

use axum::Form;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use super::{ClientInfo, escape, page};
use crate::access::{passwords, tokens};
use crate::state::AppState;
use crate::store::sessions::ActiveSession;

/// The cookie that holds a browser session's token.
pub const SESSION_COOKIE: &str = "service_session";
/// The cookie a form's CSRF token must match.
pub const CSRF_COOKIE: &str = "service_csrf";

/// The value of cookie `name` in a request.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

fn set_cookie(state: &AppState, name: &str, value: &str, same_site: &str, max_age_secs: i64) -> HeaderValue {
    let secure = if state.config.public_url.scheme() == "https" { "; Secure" } else { "" };
    HeaderValue::from_str(&format!("{name}={value}; Path=/; HttpOnly; SameSite={same_site}; Max-Age={max_age_secs}{secure}")).expect("cookie text is ASCII")
}

/// The browser session a request's cookie names, if it is still valid.
pub async fn browser_session(state: &AppState, headers: &HeaderMap) -> Option<ActiveSession> {
    let token = cookie(headers, SESSION_COOKIE)?;
    if !token.starts_with(tokens::TOKEN_PREFIX) || token.len() > 200 {
        return None;
    }
    state.store.active_session(&tokens::hash(&token)).await.ok().flatten()
}

/// A form's CSRF token: the request's cookie when it has a well-formed
/// one, else a new one with the header that sets it.
pub fn csrf(state: &AppState, headers: &HeaderMap) -> (String, Option<HeaderValue>) {
    match cookie(headers, CSRF_COOKIE).filter(|c| c.len() == 43 && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')) {
        Some(c) => (c, None),
        None => {
            let fresh = tokens::generate("").expose_secret().to_owned();
            let set = set_cookie(state, CSRF_COOKIE, &fresh, "Strict", 86_400);
            (fresh, Some(set))
        }
    }
}

/// Whether a posted form's CSRF token matches the request's cookie.
pub fn csrf_ok(headers: &HeaderMap, posted: &str) -> bool {
    use subtle::ConstantTimeEq;
    match cookie(headers, CSRF_COOKIE) {
        Some(c) if !c.is_empty() => c.as_bytes().ct_eq(posted.as_bytes()).into(),
        _ => false,
    }
}

/// The answer to a form posted without its CSRF token.
pub fn csrf_refused() -> Response {
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
pub fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n) if n.starts_with('/') && !n.starts_with("//") && !n.starts_with("/\\") && n.len() <= 2000 && !n.chars().any(|c| c.is_control() || c == '\\') => n.to_owned(),
        _ => "/account".to_owned(),
    }
}

#[derive(Deserialize)]
pub struct Next {
    next: Option<String>,
}

fn sign_in_form(csrf: &str, next: &str, email: &str, problem: Option<&str>) -> axum::response::Html<String> {
    let problem = problem.map(|p| format!("<p role=\"alert\" style=\"color:#a00\">{}</p>", escape(p))).unwrap_or_default();
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
pub async fn sign_in_page(State(state): State<AppState>, headers: HeaderMap, Query(q): Query<Next>) -> Response {
    let next = safe_next(q.next.as_deref());
    if browser_session(&state, &headers).await.is_some() {
        return Redirect::to(&next).into_response();
    }
    let (token, set) = csrf(&state, &headers);
    with_cookie(StatusCode::OK, sign_in_form(&token, &next, "", None), set)
}

#[derive(Deserialize)]
pub struct SignIn {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    next: Option<String>,
    #[serde(default)]
    email: String,
    #[serde(default)]
    password: String,
}

/// `POST /sign-in`.
pub async fn sign_in(State(state): State<AppState>, headers: HeaderMap, client: ClientInfo, Form(form): Form<SignIn>) -> Response {
    if !csrf_ok(&headers, &form.csrf) {
        return csrf_refused();
    }
    let next = safe_next(form.next.as_deref());
    let password = SecretString::from(form.password);
    let email = form.email.trim().to_ascii_lowercase();
    let address = client.ip();
    let (token, set) = csrf(&state, &headers);
    if let Err(limited) = state.throttle.sign_in_exhausted(address, &email) {
        let body = format!("<p>Too many failed sign-ins. Try again in {} seconds.</p>", limited.seconds());
        let mut response = (StatusCode::TOO_MANY_REQUESTS, page("Sign in", &body)).into_response();
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(limited.seconds()));
        return response;
    }
    let found = match state.store.user_for_sign_in(&email).await {
        Ok(found) => found,
        Err(e) => return crate::error::ApiError::from(e).into_response(),
    };
    let (user, stored) = match found {
        Some((user, stored)) => (Some(user), stored),
        None => (None, None),
    };
    // The same Argon2 work whether or not the account exists.
    let matched = passwords::verify(password, stored).await;
    let Some(user) = user.filter(|_| matched) else {
        state.throttle.sign_in_failure(address, &email);
        tracing::info!(address = %address, "web sign-in refused");
        return with_cookie(StatusCode::UNAUTHORIZED, sign_in_form(&token, &next, &email, Some("That e-mail address and password do not match an account.")), set);
    };
    let session = match super::issue_session(&state, &user.user_id, "web sign-in", &client).await {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let max_age = state.config.session_ttl_ms / 1000;
    let mut response = Redirect::to(&next).into_response();
    *response.status_mut() = StatusCode::SEE_OTHER;
    response.headers_mut().append(header::SET_COOKIE, set_cookie(&state, SESSION_COOKIE, session.expose_secret(), "Lax", max_age));
    response
}

/// `GET /account`: who is signed in, and the sign-out form.
pub async fn account_page(State(state): State<AppState>, headers: HeaderMap) -> Response {
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
pub struct SignOut {
    #[serde(default)]
    csrf: String,
}

/// `POST /sign-out`: revokes the browser session and forgets the cookie.
pub async fn sign_out(State(state): State<AppState>, headers: HeaderMap, Form(form): Form<SignOut>) -> Response {
    if !csrf_ok(&headers, &form.csrf) {
        return csrf_refused();
    }
    if let Some(session) = browser_session(&state, &headers).await
        && let Err(e) = crate::ops::sessions::end_session(&state, &session.session_id).await
    {
        return e.into_response();
    }
    let mut response = page("Signed out", "<p>You are signed out. <a href=\"/sign-in\">Sign in again</a></p>").into_response();
    response.headers_mut().append(header::SET_COOKIE, set_cookie(&state, SESSION_COOKIE, "", "Lax", 0));
    response
}
