//! The approvals page: a signed-in member reviews the pending proposals of
//! a workspace (what would run, who proposed it, from which client) and
//! approves or rejects them.
//!
//! Deciding goes through the same gate as `POST /v1/approvals/{id}/approve`
//! and `/reject`: the same role and policy checks, never by the proposing
//! session or an assistant's, executed once, and audited (with the browser
//! session as the actor). What a member may not decide is shown without
//! its operation, as the API shows it.

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::accounts::member_access;
use super::page::{escape, page_with_style};
use super::signin::{browser_session, csrf, csrf_ok, csrf_refused};
use crate::access::WorkspaceAccess;
use crate::audit::AuditNote;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::approvals::ApprovalFilter;
use crate::store::kinds::ApprovalStatus;

/// Proposals listed at most.
const LISTED: i64 = 100;

const STYLE: &str = "table{border-collapse:collapse;width:100%}td,th{border-top:1px solid #ddd;padding:.5rem;text-align:left;vertical-align:top}\
    pre{white-space:pre-wrap;word-break:break-all;background:#f6f6f6;padding:.5rem;max-height:16rem;overflow:auto;font-size:.85rem}\
    form{display:inline}button{margin:.2rem .4rem .2rem 0}nav a{margin-right:1rem}.muted{color:#666}";

#[derive(Deserialize)]
pub(crate) struct Which {
    workspace_id: Option<String>,
}

fn failed(e: &ApiError) -> Response {
    let body = e.body();
    (
        e.status,
        page_with_style(
            "Approvals",
            "",
            &format!(
                "<p>{}: {}</p><p><a href=\"/approvals\">Back to approvals</a></p>",
                escape(&body.code),
                escape(&body.message)
            ),
        ),
    )
        .into_response()
}

/// `GET /approvals`: the pending proposals of a workspace.
pub(crate) async fn approvals_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(which): Query<Which>,
) -> Response {
    let Some(session) = browser_session(&state, &headers).await else {
        return Redirect::to("/sign-in?next=/approvals").into_response();
    };
    let viewer = match member_access(&state, &session, which.workspace_id.as_deref()).await {
        Ok(a) => a,
        Err(e) => return failed(&e),
    };
    match render(&state, &headers, &viewer).await {
        Ok(r) => r,
        Err(e) => failed(&e),
    }
}

async fn render(state: &AppState, headers: &HeaderMap, viewer: &WorkspaceAccess) -> Result<Response, ApiError> {
    let (me, workspaces) = state
        .store
        .user_with_workspaces(&viewer.principal.user_id, 200)
        .await?
        .ok_or_else(|| ApiError::unauthenticated("no such user"))?;
    let filter = ApprovalFilter { status: Some(ApprovalStatus::Pending), category: None, client_source: None };
    let mut pending = state.store.approvals(&viewer.workspace_id, &filter, None, LISTED).await?;
    crate::ops::gate::redact_for(state, viewer, &mut pending).await?;
    let (token, set) = csrf(state, headers);

    let nav: String = workspaces
        .iter()
        .map(|w| {
            let name = escape(&w.name);
            if w.workspace_id == viewer.workspace_id {
                format!("<strong>{name}</strong> ")
            } else {
                format!("<a href=\"/approvals?workspace_id={}\">{name}</a> ", escape(&w.workspace_id))
            }
        })
        .collect();
    let mut rows = String::new();
    for a in &pending {
        let proposer = match state.store.user(&a.proposed_by).await? {
            Some(u) => u.email,
            None => a.proposed_by.clone(),
        };
        let own = a.proposed_session.as_deref() == Some(viewer.principal.session_id.as_str());
        let detail = if a.details_hidden {
            "<p class=\"muted\">The operation is shown to the proposer and to members who may decide it.</p>".to_owned()
        } else {
            format!("<pre>{}</pre>", escape(&serde_json::to_string_pretty(&a.operation).unwrap_or_default()))
        };
        let decide = if a.details_hidden {
            String::new()
        } else if own {
            "<p class=\"muted\">Proposed by this session: another session decides it.</p>".to_owned()
        } else {
            let form = |decision: &str, label: &str| {
                format!(
                    "<form method=\"post\" action=\"/approvals/{id}/{decision}\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
                     <input type=\"hidden\" name=\"workspace_id\" value=\"{ws}\"><button type=\"submit\">{label}</button></form>",
                    id = escape(&a.approval_id),
                    csrf = escape(&token),
                    ws = escape(&viewer.workspace_id),
                )
            };
            format!("{}{}", form("approve", "Approve and run"), form("reject", "Reject"))
        };
        rows.push_str(&format!(
            "<tr><td><strong>{summary}</strong><br><span class=\"muted\">{category} · {action} · {id}</span>{detail}{decide}</td>\
             <td>{proposer}<br><span class=\"muted\">from {client}</span></td><td>{created}<br><span class=\"muted\">expires {expires}</span></td></tr>",
            summary = escape(&a.summary),
            category = escape(&a.category),
            action = escape(&a.action),
            id = escape(&a.approval_id),
            proposer = escape(&proposer),
            client = a.client_source.as_str(),
            created = a.created_at.format("%Y-%m-%d %H:%M UTC"),
            expires = a.expires_at.format("%Y-%m-%d %H:%M UTC"),
        ));
    }
    let table = if rows.is_empty() {
        "<p>Nothing is waiting for a decision in this workspace.</p>".to_owned()
    } else {
        format!(
            "<table><thead><tr><th>Proposal</th><th>Proposed by</th><th>When</th></tr></thead><tbody>{rows}</tbody></table>"
        )
    };
    let body = format!(
        "<p>Signed in as {email} ({role} here). <a href=\"/account\">Account</a></p><nav>Workspaces: {nav}</nav><h2>Waiting for a decision</h2>{table}",
        email = escape(&me.email),
        role = viewer.role.as_str(),
    );
    let mut response = page_with_style("Approvals", STYLE, &body).into_response();
    if let Some(set) = set {
        response.headers_mut().append(header::SET_COOKIE, set);
    }
    Ok(response)
}

#[derive(Deserialize)]
pub(crate) struct Decide {
    #[serde(default)]
    csrf: String,
    workspace_id: Option<String>,
}

/// `POST /approvals/{approval_id}/{decision}`: approve (and run) or reject.
pub(crate) async fn decide(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((approval_id, decision)): Path<(String, String)>,
    Form(form): Form<Decide>,
) -> Response {
    if !csrf_ok(&state, &headers, &form.csrf) {
        return csrf_refused();
    }
    let Some(session) = browser_session(&state, &headers).await else {
        return Redirect::to("/sign-in?next=/approvals").into_response();
    };
    let approver = match member_access(&state, &session, form.workspace_id.as_deref()).await {
        Ok(a) => a,
        Err(e) => return failed(&e),
    };
    let note = AuditNote::default();
    note.workspace(&approver.workspace_id);
    let outcome = match decision.as_str() {
        "approve" => crate::ops::gate::approve(&state, &approver, &note, &approval_id).await,
        "reject" => crate::ops::gate::reject(&state, &approver, &note, &approval_id).await,
        _ => {
            return (StatusCode::NOT_FOUND, page_with_style("Approvals", "", "<p>No such decision.</p>"))
                .into_response();
        }
    };
    let status = outcome.as_ref().map(|e| e.status).unwrap_or_else(|e| e.status);
    // Pages are outside `/v1`: the audit middleware does not see them.
    if let Err(e) = state
        .store
        .append_audit(&note.record(Some(&approver.principal), &format!("approvals.{decision}"), status))
        .await
    {
        tracing::error!(error = %e, "could not write audit record");
    }
    let back =
        format!("<p><a href=\"/approvals?workspace_id={}\">Back to approvals</a></p>", escape(&approver.workspace_id));
    match outcome {
        Ok(executed) => {
            let what = if decision == "approve" { "Approved: the operation ran." } else { "Rejected: nothing ran." };
            let result = if decision == "approve" {
                format!("<pre>{}</pre>", escape(&serde_json::to_string_pretty(&executed.data).unwrap_or_default()))
            } else {
                String::new()
            };
            page_with_style("Approvals", STYLE, &format!("<p>{what}</p>{result}{back}")).into_response()
        }
        Err(e) => failed(&e),
    }
}
