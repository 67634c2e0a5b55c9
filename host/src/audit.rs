//! What a request or an approved execution tells the audit log: the
//! [`AuditNote`] handlers fill in as they learn the workspace, the action
//! and the target, turned into one record per state-changing request.

use std::sync::{Arc, Mutex};

use axum::http::StatusCode;

use crate::access::{ClientSource, Principal};
use crate::store::audit::NewAuditRecord;
use crate::store::kinds::AuditOutcome;
use crate::telemetry::request_id;

/// What a handler tells the audit layer about the request it served.
/// Cloned into the request by [`audit`]; handlers fill it in as they learn
/// the workspace, the action and the target.
#[derive(Clone, Default)]
pub(crate) struct AuditNote(Arc<Mutex<NoteFields>>);

#[derive(Default)]
struct NoteFields {
    workspace_id: Option<String>,
    action: Option<String>,
    target_type: Option<String>,
    target_id: Option<String>,
    approval_id: Option<String>,
    outcome: Option<AuditOutcome>,
    details: Option<serde_json::Value>,
}

impl AuditNote {
    fn with<R>(&self, f: impl FnOnce(&mut NoteFields) -> R) -> R {
        let mut guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    /// The workspace the request acted in.
    pub(crate) fn workspace(&self, id: &str) {
        self.with(|n| n.workspace_id = Some(id.to_owned()));
    }

    /// A stable action name such as `members.invite`.
    pub(crate) fn action(&self, action: &str) {
        self.with(|n| n.action = Some(action.to_owned()));
    }

    /// The resource acted on.
    pub(crate) fn target(&self, kind: &str, id: &str) {
        self.with(|n| {
            n.target_type = Some(kind.to_owned());
            n.target_id = Some(id.to_owned());
        });
    }

    /// The approval whose stored operation this request executed.
    pub(crate) fn approval(&self, id: &str) {
        self.with(|n| n.approval_id = Some(id.to_owned()));
    }

    /// What the action adds to its target (identifiers only: this is
    /// shown to every reader of the audit log).
    pub(crate) fn details(&self, details: serde_json::Value) {
        self.with(|n| n.details = Some(details));
    }

    /// Overrides the outcome derived from the status (e.g. `proposed`).
    pub(crate) fn outcome(&self, outcome: AuditOutcome) {
        self.with(|n| n.outcome = Some(outcome));
    }

    /// The audit record of a request (or of an approved execution) that
    /// answered `status`, made by `actor`.
    pub(crate) fn record(
        &self,
        actor: Option<&Principal>,
        fallback_action: &str,
        status: StatusCode,
    ) -> NewAuditRecord {
        let fields = self.with(std::mem::take);
        let outcome = fields.outcome.unwrap_or(match status.as_u16() {
            200..=299 => AuditOutcome::Succeeded,
            401 | 403 => AuditOutcome::Denied,
            _ => AuditOutcome::Failed,
        });
        NewAuditRecord {
            workspace_id: fields.workspace_id,
            actor_user_id: actor.map(|p| p.user_id.clone()),
            actor_session_id: actor.map(|p| p.session_id.clone()).filter(|s| !s.is_empty()),
            action: fields.action.unwrap_or_else(|| fallback_action.to_owned()),
            target_type: fields.target_type,
            target_id: fields.target_id,
            client_source: actor.map(|p| p.client).unwrap_or(ClientSource::Api),
            request_id: request_id::current(),
            outcome,
            status_code: i64::from(status.as_u16()),
            approval_id: fields.approval_id,
            address: None,
            details: fields.details,
        }
    }
}
