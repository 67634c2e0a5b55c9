//! Secure credential entry: the page a person types a secret into, sealed
//! at once; whoever asked only ever gets its handle.

use axum::extract::{Path, State};
use axum::response::IntoResponse;
use secrecy::{ExposeSecret, SecretString};

use super::page::{escape, gone, page};
use crate::access::tokens;
use crate::ops::text::SHORT_MAX;
use crate::state::AppState;
use crate::store::audit::NewAuditRecord;
use crate::store::kinds::{AuditOutcome, CredentialKind, CredentialStatus};

pub(crate) async fn entry_page(State(state): State<AppState>, Path(token): Path<String>) -> axum::response::Response {
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
    // A `basic` secret is the password of a username: the one the link
    // names, shown, or the person's own, asked for.
    let (username_shown, username_field) = match (kind(&link.spec), fixed_username(&link.spec)) {
        (CredentialKind::Basic, Some(user)) => {
            (format!("<br>Username: <strong>{}</strong>", escape(user)), String::new())
        }
        (CredentialKind::Basic, None) => (
            String::new(),
            format!(
                "<label>Username <input type=\"text\" name=\"username\" required autocomplete=\"off\" maxlength=\"{SHORT_MAX}\"></label> "
            ),
        ),
        _ => (String::new(), String::new()),
    };
    page(
        "Enter a secret",
        &format!(
            "<p><strong>{}</strong> asks you for a secret for workspace <strong>{}</strong>. Type it here, in the service's own page: \
             it is sealed at once and never shown again, and the assistant or tool that sent you here only ever gets a reference to it.</p>\
             <p>Connector: <strong>{}</strong><br>Sent only to: <strong>{}</strong>{username_shown}<br>{}</p>\
             <form method=\"post\" autocomplete=\"off\">{username_field}<label>Secret <input type=\"password\" name=\"secret\" required \
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

/// The kind of credential a link creates.
fn kind(spec: &serde_json::Value) -> CredentialKind {
    spec["kind"].as_str().and_then(CredentialKind::parse).unwrap_or(CredentialKind::ApiToken)
}

/// The username a link fixed for a `basic` credential (links made before
/// placements were recorded kept it beside the kind).
fn fixed_username(spec: &serde_json::Value) -> Option<&str> {
    spec["placement"]["username"].as_str().or_else(|| spec["username"].as_str())
}

#[derive(serde::Deserialize)]
pub(crate) struct EntryForm {
    secret: SecretString,
    /// A `basic` credential's username, when the link left it to the person.
    username: Option<String>,
}

pub(crate) async fn submit_entry(
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
    let kind = kind(&link.spec);
    let invalid = |title: &str, why: &str| {
        (
            axum::http::StatusCode::BAD_REQUEST,
            page(title, &format!("<p>{}. The link still works: go back and try again.</p>", escape(why))),
        )
            .into_response()
    };
    if let Err(why) = crate::ops::credentials::check_secret(kind, form.secret.expose_secret()) {
        return invalid("Invalid secret", &why);
    }
    // The person's username, where the link asked for one; a link that
    // fixed it (or a kind without one) takes none from the form.
    let typed_username = match (kind, fixed_username(&link.spec), form.username.as_deref()) {
        (CredentialKind::Basic, None, Some(user)) => match crate::ops::credentials::check_username(user) {
            Ok(()) => Some(user.to_owned()),
            Err(why) => return invalid("Invalid username", &why),
        },
        (CredentialKind::Basic, None, None) => return invalid("Missing username", "The form had no username"),
        (_, _, Some(_)) => return invalid("Unexpected username", "This link does not take a username"),
        (_, _, None) => None,
    };
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
            kind,
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
                if let Some(user) = typed_username {
                    m.insert("username".into(), serde_json::json!(user));
                }
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

/// The audit record of a credential a browser page created (these pages are
/// outside `/v1`, so the audit middleware does not see them).
pub(crate) async fn audit_credential_created(
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
