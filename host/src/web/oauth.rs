//! The OAuth landing: where providers send the browser back; a person
//! confirms before the access is stored.

use axum::extract::State;
use axum::response::IntoResponse;

use super::page::{escape, gone, page};
use crate::access::tokens;
use crate::state::AppState;
use crate::store::kinds::CredentialStatus;

/// What a provider adds to the browser's return: ours, and theirs (iss,
/// scope, ...), which are ignored.
#[derive(serde::Deserialize)]
pub(crate) struct Landing {
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

pub(crate) fn oauth_failed(e: &crate::error::ApiError) -> axum::response::Response {
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
pub(crate) async fn oauth_landing(
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
pub(crate) async fn oauth_complete(
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
        &crate::ops::Ctx::request(&state, &initiator, &note),
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
