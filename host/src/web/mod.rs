//! Browser pages served by the service itself: the one-time login link
//! printed at first start, invitation acceptance, secure credential entry,
//! the OAuth landing, and web sign-in.
//!
//! Layout:
//! - this module: the pages of one-time links (login, credential entry,
//!   OAuth landing), the sessions and audit records pages make, and what
//!   every page shares;
//! - [`signin`]: sign-in with e-mail and password, browser sessions in
//!   cookies, CSRF tokens, the account page and sign-out;
//! - [`cli_login`]: the confirmation page and code exchange of
//!   `service auth login` (loopback redirect with PKCE);
//! - [`approvals`]: pending proposals of a workspace, approved or
//!   rejected by a signed-in member;
//! - [`invitations`]: joining a workspace by an invitation link, as a new
//!   account or as the invited account signed in on the web.
//!
//! Each is two-step: `GET` shows a page and spends nothing (so link
//! previewers and prefetchers cannot burn a single-use link, and a person
//! sees what they are about to do); the form's `POST` acts.
//!
//! Every page is served with headers that forbid framing, caching and
//! content sniffing ([`page_headers`]); pages carry no script, and their
//! forms post only to this server.

use axum::Router;
use axum::extract::{Path, State};
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use secrecy::{ExposeSecret, SecretString};

use crate::access::ClientSource;
use crate::access::tokens;
use crate::state::AppState;
use crate::store::audit::NewAuditRecord;
use crate::store::kinds::{AuditOutcome, CredentialKind, CredentialStatus};
use crate::store::sessions::{NewSession, SessionKind};

pub mod approvals;
pub mod cli_login;
pub mod invitations;
pub mod signin;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/sign-in", get(signin::sign_in_page).post(signin::sign_in))
        .route("/sign-out", axum::routing::post(signin::sign_out))
        .route("/account", get(signin::account_page))
        .route("/cli/authorize", get(cli_login::authorize_page).post(cli_login::authorize))
        .route("/cli/token", axum::routing::post(cli_login::exchange))
        .route("/approvals", get(approvals::approvals_page))
        .route("/approvals/{approval_id}/{decision}", axum::routing::post(approvals::decide))
        .route("/login/{code}", get(login_page).post(login))
        .route("/invitations/{token}", get(invitations::invitation_page).post(invitations::accept_invitation))
        .route("/credential-entry/{token}", get(entry_page).post(submit_entry))
        .route("/oauth/callback", get(oauth_landing).post(oauth_complete))
        .layer(axum::middleware::from_fn(page_headers))
}

/// The content security policy of pages whose forms post only here.
const CSP_FORMS_TO_SELF: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The same policy, letting forms (and the redirects they lead to) also
/// reach `origin`, which the caller has checked.
pub fn csp_with_form_target(origin: &str) -> axum::http::HeaderValue {
    let policy = CSP_FORMS_TO_SELF.replace("form-action 'self'", &format!("form-action 'self' {origin}"));
    axum::http::HeaderValue::from_str(&policy).unwrap_or(axum::http::HeaderValue::from_static(CSP_FORMS_TO_SELF))
}

/// Headers of every page: no framing (clickjacking), no caching (pages
/// show one-time tokens and handles), no sniffing, no scripts, forms only
/// to this server, and no referrer carrying a link's code elsewhere.
pub async fn page_headers(req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    use axum::http::{HeaderValue, header};
    let mut response = next.run(req).await;
    let h = response.headers_mut();
    // A page whose form must lead elsewhere (the CLI's loopback address)
    // sets its own policy, differing only in `form-action`.
    h.entry(header::CONTENT_SECURITY_POLICY).or_insert(HeaderValue::from_static(CSP_FORMS_TO_SELF));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}

/// Escapes text for HTML element and attribute content.
pub fn escape(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '<' => "&lt;".to_owned(),
            '>' => "&gt;".to_owned(),
            '&' => "&amp;".to_owned(),
            '"' => "&quot;".to_owned(),
            '\'' => "&#39;".to_owned(),
            c => c.to_string(),
        })
        .collect()
}

/// A minimal page; `body` must already be escaped.
pub fn page(title: &str, body: &str) -> Html<String> {
    page_with_style(title, "", body)
}

/// A page with CSS of its own after the shared rules (wider, for tables,
/// when it has any); `body` must already be escaped.
pub fn page_with_style(title: &str, style: &str, body: &str) -> Html<String> {
    let width = if style.is_empty() { "40rem" } else { "64rem" };
    Html(format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"referrer\" content=\"no-referrer\">\
         <meta name=\"viewport\" content=\"width=device-width\"><title>{t}</title>\
         <style>body{{font-family:system-ui,sans-serif;max-width:{width};margin:3rem auto;padding:0 1rem;line-height:1.45}}\
         code{{word-break:break-all;background:#f3f3f3;padding:.2rem .4rem}}\
         input{{font:inherit;padding:.3rem;min-width:18rem}}button{{font:inherit;padding:.35rem .9rem}}{style}</style></head>\
         <body><h1>{t}</h1>{body}</body></html>",
        t = escape(title)
    ))
}

fn gone(what: &str) -> axum::response::Response {
    (
        axum::http::StatusCode::GONE,
        page("Link not valid", &format!("<p>This {} link is unknown, expired or already used.</p>", escape(what))),
    )
        .into_response()
}

fn token_page(title: &str, intro: &str, token: &SecretString) -> Html<String> {
    page(
        title,
        &format!(
            "<p>{}</p><p>Your API token (shown once; store it like a password):</p><p><code>{}</code></p>\
             <p>Use it as <code>Authorization: Bearer &lt;token&gt;</code>.</p>",
            escape(intro),
            escape(token.expose_secret())
        ),
    )
}

/// The password field of the forms that create or first open an account.
const PASSWORD_FIELD: &str = "<p><label>Choose a password for signing in on the web later (at least 12 characters; optional)<br>\
     <input type=\"password\" name=\"password\" autocomplete=\"new-password\" minlength=\"12\"></label></p>";

/// A password chosen on a form: none when left empty; refused (with why)
/// when too short or too long.
fn chosen_password(raw: &str) -> Result<Option<SecretString>, String> {
    if raw.is_empty() {
        return Ok(None);
    }
    let password = SecretString::from(raw.to_owned());
    crate::access::passwords::check(&password)?;
    Ok(Some(password))
}

/// Keeps a chosen password; the account works without it if this fails.
async fn keep_password(state: &AppState, user_id: &str, password: Option<SecretString>) -> bool {
    let Some(p) = password else { return false };
    match crate::access::passwords::hash(p).await {
        Ok(h) => state.store.set_password_hash(user_id, &h).await.is_ok(),
        Err(e) => {
            tracing::error!(error = %e, "could not hash a chosen password");
            false
        }
    }
}

fn password_refused(why: &str) -> axum::response::Response {
    let body = format!(
        "<p>The password was not accepted: {}. Nothing was used up: go back and choose another, or leave it empty.</p>",
        escape(why)
    );
    (axum::http::StatusCode::BAD_REQUEST, page("Choose another password", &body)).into_response()
}

const SIGN_IN_LATER: &str = "With the password you chose, you can also sign in at /sign-in.";

async fn login_page(Path(code): Path<String>) -> Html<String> {
    let _ = code;
    page(
        "Sign in",
        &format!(
            "<p>This single-use link signs you in as the administrator created at first start.</p>\
             <form method=\"post\">{PASSWORD_FIELD}<button type=\"submit\">Sign in and show my token</button></form>"
        ),
    )
}

#[derive(serde::Deserialize, Default)]
struct LoginForm {
    #[serde(default)]
    password: String,
}

/// Who is signing in, for the session's metadata.
pub struct ClientInfo {
    pub user_agent: Option<String>,
    pub address: Option<String>,
}

impl ClientInfo {
    /// The client's address for rate limits (unspecified when unknown).
    pub fn ip(&self) -> std::net::IpAddr {
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

async fn login(
    State(state): State<AppState>,
    client: ClientInfo,
    Path(code): Path<String>,
    form: Result<axum::Form<LoginForm>, axum::extract::rejection::FormRejection>,
) -> axum::response::Response {
    let password = match chosen_password(&form.map(|f| f.0).unwrap_or_default().password) {
        Ok(p) => p,
        Err(why) => return password_refused(&why),
    };
    let user_id = match state.store.redeem_login_code(&tokens::hash(&code)).await {
        Ok(Some(u)) => u,
        Ok(None) => return gone("sign-in"),
        Err(e) => return crate::error::ApiError::from(e).into_response(),
    };
    let later = if keep_password(&state, &user_id, password).await { SIGN_IN_LATER } else { "" };
    match api_session(&state, &user_id, "browser sign-in", &client).await {
        Ok(token) => {
            token_page("Signed in", &format!("You are signed in as the administrator. {later}"), &token).into_response()
        }
        Err(e) => e.into_response(),
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
async fn api_session(
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
        .from_address(client.address.as_deref());
        if let Err(e) = state.store.append_audit(&record).await {
            tracing::error!(error = %e, action = event.action, "could not write audit record");
        }
    }
}

async fn entry_page(State(state): State<AppState>, Path(token): Path<String>) -> axum::response::Response {
    let (link, requested_by) = match state.store.pending_entry_link(&tokens::hash(&token)).await {
        Ok(Some(l)) => l,
        Ok(None) => return gone("credential-entry"),
        Err(e) => return crate::error::ApiError::from(e).into_response(),
    };
    // Who asks, for which workspace: the person typing the secret decides
    // whether to trust the request.
    let workspace = state.store.workspace(&link.workspace_id).await.ok().flatten().map(|w| w.name).unwrap_or_default();
    let requester = state.store.user(&requested_by).await.ok().flatten().map(|u| u.email).unwrap_or_default();
    let hosts = link.spec["hosts"]
        .as_array()
        .map(|h| h.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(", "))
        .unwrap_or_default();
    let label = link.spec["label"].as_str().unwrap_or("");
    let connector = link.spec["connector_id"].as_str().unwrap_or("(any)");
    page(
        "Enter a secret",
        &format!(
            "<p><strong>{}</strong> asks you for a secret for workspace <strong>{}</strong>. Type it here, in the service's own page: \
             it is sealed at once and never shown again, and the assistant or tool that sent you here only ever gets a reference to it.</p>\
             <p>Connector: <strong>{}</strong><br>Sent only to: <strong>{}</strong><br>{}</p>\
             <form method=\"post\" autocomplete=\"off\"><label>Secret <input type=\"password\" name=\"secret\" required \
             autocomplete=\"off\" maxlength=\"16384\"></label> <button type=\"submit\">Store</button></form>\
             <p>This link works once and expires at {}. If you did not expect this request, close the page.</p>",
            escape(&requester),
            escape(&workspace),
            escape(connector),
            escape(&hosts),
            if label.is_empty() { String::new() } else { format!("Label: {}", escape(label)) },
            link.expires_at.to_rfc3339()
        ),
    )
    .into_response()
}

#[derive(serde::Deserialize)]
struct EntryForm {
    secret: SecretString,
}

async fn submit_entry(
    State(state): State<AppState>,
    Path(token): Path<String>,
    form: Result<axum::Form<EntryForm>, axum::extract::rejection::FormRejection>,
) -> axum::response::Response {
    let hash = tokens::hash(&token);
    let Ok(axum::Form(form)) = form else {
        return (axum::http::StatusCode::BAD_REQUEST, page("Missing secret", "<p>The form had no secret.</p>"))
            .into_response();
    };
    let (link, requested_by) = match state.store.pending_entry_link(&hash).await {
        Ok(Some(l)) => l,
        Ok(None) => return gone("credential-entry"),
        Err(e) => return crate::error::ApiError::from(e).into_response(),
    };
    if let Err(why) = crate::ops::credentials::check_secret(
        link.spec["kind"].as_str().and_then(CredentialKind::parse).unwrap_or(CredentialKind::ApiToken),
        form.secret.expose_secret(),
    ) {
        return (
            axum::http::StatusCode::BAD_REQUEST,
            page("Invalid secret", &format!("<p>{}. The link still works: go back and try again.</p>", escape(&why))),
        )
            .into_response();
    }
    // Spend first: of two concurrent submissions exactly one stores.
    match state.store.spend_entry_link(&hash).await {
        Ok(true) => {}
        Ok(false) => return gone("credential-entry"),
        Err(e) => return crate::error::ApiError::from(e).into_response(),
    }
    let spec = &link.spec;
    let hosts: Vec<String> = spec["hosts"]
        .as_array()
        .map(|h| h.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let created = state
        .vault
        .create(crate::credentials::NewSecret {
            workspace_id: &link.workspace_id,
            created_by: &requested_by,
            kind: spec["kind"].as_str().and_then(CredentialKind::parse).unwrap_or(CredentialKind::ApiToken),
            connector_id: spec["connector_id"].as_str(),
            label: spec["label"].as_str(),
            hosts,
            metadata: {
                // Where the secret goes was fixed when the link was made.
                let mut m = match &spec["placement"] {
                    serde_json::Value::Object(p) => p.clone(),
                    _ => serde_json::Map::from_iter(
                        spec["username"].as_str().map(|u| ("username".to_owned(), serde_json::json!(u))),
                    ),
                };
                m.insert("entered_via".into(), serde_json::json!("credential_entry_link"));
                serde_json::Value::Object(m)
            },
            material: crate::credentials::SecretMaterial::new(form.secret),
            status: CredentialStatus::Active,
            access_expires_at: None,
        })
        .await;
    let record = match created {
        Ok(r) => r,
        Err(e) => return crate::error::ApiError::internal(anyhow::anyhow!("{e}")).into_response(),
    };
    let _ = state.store.complete_entry_link(&hash, &record.credential_id).await;
    audit_credential_created(&state, &link.workspace_id, &requested_by, "credentials.create", &record.credential_id)
        .await;
    page(
        "Secret stored",
        &format!(
            "<p>The secret is sealed. Its reference (safe to share with your tools):</p><p><code>{}</code></p>\
             <p>You can close this page; the tool that sent you here picks the reference up by itself.</p>",
            escape(record.credential_handle.as_str())
        ),
    )
    .into_response()
}

/// What a provider adds to the browser's return: ours, and theirs (iss,
/// scope, ...), which are ignored.
#[derive(serde::Deserialize)]
struct Landing {
    #[serde(default)]
    state: String,
    code: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

impl Landing {
    fn callback(self) -> crate::credentials::oauth::Callback {
        crate::credentials::oauth::Callback {
            state: self.state,
            code: self.code,
            error: self.error,
            error_description: self.error_description,
        }
    }
}

fn oauth_failed(e: &crate::error::ApiError) -> axum::response::Response {
    (
        e.status,
        page(
            "Authorisation not completed",
            &format!("<p>{}</p><p>Code: <code>{}</code></p>", escape(&e.message), escape(&e.code)),
        ),
    )
        .into_response()
}

/// Where providers send the browser back. Completes nothing by itself: the
/// page names the workspace, the person who started the flow and through
/// which client, and a person confirms, so a consent someone else started
/// does not silently land in their workspace. A provider's refusal ends
/// the flow at once.
async fn oauth_landing(
    State(state): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<Landing>,
) -> axum::response::Response {
    if q.error.is_some() {
        return match state.oauth.complete(&q.callback(), None).await {
            Ok(_) => gone("authorisation"),
            Err(e) => oauth_failed(&e),
        };
    }
    let flow = match state.store.pending_oauth_flow(&tokens::hash(&q.state)).await {
        Ok(Some(f)) => f,
        Ok(None) => return gone("authorisation"),
        Err(e) => return crate::error::ApiError::from(e).into_response(),
    };
    page(
        "Finish connecting",
        &format!(
            "<p><strong>{}</strong> started connecting <strong>{}</strong> to workspace <strong>{}</strong> (through the {} client). \
             Finish only if you expected this: the access you just granted will be stored in that workspace.</p>\
             <form method=\"post\"><input type=\"hidden\" name=\"state\" value=\"{}\"><input type=\"hidden\" name=\"code\" value=\"{}\">\
             <button type=\"submit\">Store the access in {}</button></form><p>This request expires at {}.</p>",
            escape(&flow.initiator_email),
            escape(&flow.target),
            escape(&flow.workspace_name),
            escape(&flow.client_source),
            escape(&q.state),
            escape(q.code.as_deref().unwrap_or("")),
            escape(&flow.workspace_name),
            crate::store::from_ms(flow.expires_at).to_rfc3339()
        ),
    )
    .into_response()
}

/// Completes a confirmed flow as the session that started it: the host
/// exchanges the code and the credential goes through the approval gate as
/// that session's write, so a flow an MCP client started ends in a
/// proposal, not an active credential.
async fn oauth_complete(
    State(state): State<AppState>,
    form: Result<axum::Form<Landing>, axum::extract::rejection::FormRejection>,
) -> axum::response::Response {
    let Ok(axum::Form(landing)) = form else {
        return (
            axum::http::StatusCode::BAD_REQUEST,
            page("Authorisation not completed", "<p>The form was incomplete.</p>"),
        )
            .into_response();
    };
    let mut done = match state.oauth.complete(&landing.callback(), None).await {
        Ok(d) => d,
        Err(e) => return oauth_failed(&e),
    };
    let initiator = match state.oauth.initiator(&done).await {
        Ok(a) => a,
        Err(e) => return oauth_failed(&e),
    };
    let note = crate::audit::AuditNote::default();
    note.workspace(&done.workspace_id);
    let outcome = crate::ops::credentials::store_secret(
        &state,
        &initiator,
        &note,
        done.new_secret(CredentialStatus::PendingApproval),
    )
    .await;
    let status = outcome.as_ref().map(|e| e.status).unwrap_or_else(|e| e.status);
    note.action("credentials.oauth_complete");
    if let Err(e) =
        state.store.append_audit(&note.record(Some(&initiator.principal), "credentials.oauth_complete", status)).await
    {
        tracing::error!(error = %e, "could not write audit record");
    }
    match outcome {
        Ok(executed) if executed.status == axum::http::StatusCode::ACCEPTED => page(
            "Waiting for approval",
            "<p>Access was granted and sealed. Because the flow was started by an assistant, a workspace member approves \
             the credential before anything can use it.</p>",
        )
        .into_response(),
        Ok(executed) => page(
            "Authorised",
            &format!(
                "<p>Access was granted and stored. The reference to use in your tools:</p><p><code>{}</code></p>",
                escape(executed.data["credential_handle"].as_str().unwrap_or_default())
            ),
        )
        .into_response(),
        Err(e) => oauth_failed(&e),
    }
}

/// The audit record of a credential a browser page created (these pages are
/// outside `/v1`, so the audit middleware does not see them).
async fn audit_credential_created(
    state: &AppState,
    workspace_id: &str,
    actor: &str,
    action: &str,
    credential_id: &str,
) {
    let audit = NewAuditRecord::event(
        workspace_id,
        action,
        AuditOutcome::Succeeded,
        201,
        crate::telemetry::request_id::current(),
    )
    .by(actor)
    .on("credential", credential_id);
    if let Err(e) = state.store.append_audit(&audit).await {
        tracing::error!(error = %e, "could not write audit record");
    }
}
