//! The audit log: one row per state-changing request, append only.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::Row;
use utoipa::ToSchema;

use super::kinds::AuditOutcome;
use super::sessions::ClientSource;
use super::{Store, StoreResult, decode, from_ms, new_id, now_ms};

/// One audit record. Holds identifiers and outcomes only, never a payload,
/// so no secret can reach it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct AuditRecord {
    pub audit_id: String,
    pub workspace_id: Option<String>,
    /// User who made the request.
    pub actor_user_id: Option<String>,
    /// Session the request was authenticated with.
    pub actor_session_id: Option<String>,
    /// What was attempted, e.g. `members.invite`.
    pub action: String,
    pub target_type: Option<String>,
    pub target_id: Option<String>,
    /// The client kind of the session (narrowed by `X-Service-Client`).
    pub client_source: ClientSource,
    pub request_id: String,
    pub outcome: AuditOutcome,
    /// HTTP status of the response.
    pub status_code: i64,
    /// The approval this execution carried out, when it ran on approval.
    pub approval_id: Option<String>,
    /// The client's address, when the record is of a request.
    pub address: Option<String>,
    /// What the action adds to its target, e.g. a plugin load's digest,
    /// version and signer. Identifiers only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<serde_json::Value>,
    pub created_at: DateTime<Utc>,
}

/// A record to append.
#[derive(Debug, Clone)]
pub(crate) struct NewAuditRecord {
    pub workspace_id: Option<String>,
    pub actor_user_id: Option<String>,
    pub actor_session_id: Option<String>,
    pub action: String,
    pub target_type: Option<String>,
    pub target_id: Option<String>,
    pub client_source: ClientSource,
    pub request_id: String,
    pub outcome: AuditOutcome,
    pub status_code: i64,
    pub approval_id: Option<String>,
    pub address: Option<String>,
    pub details: Option<serde_json::Value>,
}

impl NewAuditRecord {
    /// A record of something the server did on its own or for a browser
    /// page (no request through `/v1`): the rest is filled in by the caller.
    pub(crate) fn event(
        workspace_id: &str,
        action: &str,
        outcome: AuditOutcome,
        status_code: u16,
        request_id: String,
    ) -> Self {
        NewAuditRecord {
            workspace_id: Some(workspace_id.to_owned()),
            actor_user_id: None,
            actor_session_id: None,
            action: action.to_owned(),
            target_type: None,
            target_id: None,
            client_source: ClientSource::Api,
            request_id,
            outcome,
            status_code: i64::from(status_code),
            approval_id: None,
            address: None,
            details: None,
        }
    }

    /// The record, naming what it acted on.
    pub(crate) fn on(mut self, target_type: &str, target_id: &str) -> Self {
        self.target_type = Some(target_type.to_owned());
        self.target_id = Some(target_id.to_owned());
        self
    }

    /// The record, naming who acted.
    pub(crate) fn by(mut self, user_id: &str) -> Self {
        self.actor_user_id = Some(user_id.to_owned());
        self
    }

    /// The record, naming the session and kind of client that acted.
    pub(crate) fn through(mut self, session_id: Option<&str>, client: ClientSource) -> Self {
        self.actor_session_id = session_id.map(str::to_owned);
        self.client_source = client;
        self
    }

    /// The record, naming the client's address.
    pub(crate) fn at_address(mut self, address: Option<&str>) -> Self {
        self.address = address.map(str::to_owned);
        self
    }
}

/// Filters of `GET /audit-logs`.
#[derive(Debug, Clone, Default)]
pub(crate) struct AuditFilter {
    pub workspace_id: String,
    pub since: Option<i64>,
    pub until: Option<i64>,
    pub actor_user_id: Option<String>,
    pub action: Option<String>,
    pub client_source: Option<ClientSource>,
    pub outcome: Option<AuditOutcome>,
}

impl Store {
    pub(crate) async fn append_audit(&self, r: &NewAuditRecord) -> StoreResult<String> {
        let id = new_id("aud");
        sqlx::query(
            "INSERT INTO audit_logs (id, workspace_id, actor_user_id, actor_session_id, action, target_type, target_id, \
             client_source, request_id, outcome, status_code, approval_id, address, details, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
        )
        .bind(&id)
        .bind(&r.workspace_id)
        .bind(&r.actor_user_id)
        .bind(&r.actor_session_id)
        .bind(&r.action)
        .bind(&r.target_type)
        .bind(&r.target_id)
        .bind(r.client_source.as_str())
        .bind(&r.request_id)
        .bind(r.outcome.as_str())
        .bind(r.status_code)
        .bind(&r.approval_id)
        .bind(&r.address)
        .bind(r.details.as_ref().map(ToString::to_string))
        .bind(now_ms())
        .execute(self.pool())
        .await?;
        Ok(id)
    }

    /// Records of one workspace, newest first.
    pub(crate) async fn audit_records(
        &self,
        f: &AuditFilter,
        before: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<AuditRecord>> {
        let rows = sqlx::query(
            "SELECT id, workspace_id, actor_user_id, actor_session_id, action, target_type, target_id, client_source, \
             request_id, outcome, status_code, approval_id, address, details, created_at FROM audit_logs \
             WHERE workspace_id = $1 AND ($2 IS NULL OR created_at >= $2) AND ($3 IS NULL OR created_at < $3) \
             AND ($4 IS NULL OR actor_user_id = $4) AND ($5 IS NULL OR action = $5) AND ($6 IS NULL OR client_source = $6) \
             AND ($7 IS NULL OR outcome = $7) AND ($8 IS NULL OR id < $8) ORDER BY id DESC LIMIT $9",
        )
        .bind(&f.workspace_id)
        .bind(f.since)
        .bind(f.until)
        .bind(&f.actor_user_id)
        .bind(&f.action)
        .bind(f.client_source.map(ClientSource::as_str))
        .bind(f.outcome.map(AuditOutcome::as_str))
        .bind(before)
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(AuditRecord {
                    audit_id: r.try_get("id")?,
                    workspace_id: r.try_get("workspace_id")?,
                    actor_user_id: r.try_get("actor_user_id")?,
                    actor_session_id: r.try_get("actor_session_id")?,
                    action: r.try_get("action")?,
                    target_type: r.try_get("target_type")?,
                    target_id: r.try_get("target_id")?,
                    client_source: decode(r.try_get("client_source")?, ClientSource::parse, "client_source")?,
                    request_id: r.try_get("request_id")?,
                    outcome: decode(r.try_get("outcome")?, AuditOutcome::parse, "outcome")?,
                    status_code: r.try_get("status_code")?,
                    approval_id: r.try_get("approval_id")?,
                    address: r.try_get("address")?,
                    details: r.try_get::<Option<String>, _>("details")?.and_then(|d| serde_json::from_str(&d).ok()),
                    created_at: from_ms(r.try_get("created_at")?),
                })
            })
            .collect()
    }
}
