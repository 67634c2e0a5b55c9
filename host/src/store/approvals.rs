//! Approval proposals and approval policies.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::Row;
use utoipa::ToSchema;

use super::kinds::{ApprovalStatus, EventType};
use super::sessions::ClientSource;
use super::webhooks::record_event;
use super::workspaces::Role;
use super::{Store, StoreResult, decode, from_ms, new_id, now_ms};

/// A stored proposal to perform one write operation.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Approval {
    pub approval_id: String,
    pub workspace_id: String,
    /// Approval category of the operation.
    pub category: String,
    /// Action name, as in audit records (e.g. `members.invite`).
    pub action: String,
    /// One line a person can judge the proposal by.
    pub summary: String,
    /// The operation that approval would perform, exactly.
    pub operation: Value,
    /// Where the proposal is in its life.
    pub status: ApprovalStatus,
    pub proposed_by: String,
    /// The session that proposed it: it may not decide its own proposal.
    #[serde(skip)]
    pub proposed_session: Option<String>,
    /// Client kind that proposed it.
    pub client_source: ClientSource,
    /// Request that created the proposal.
    pub request_id: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub decided_by: Option<String>,
    pub decided_at: Option<DateTime<Utc>>,
    /// What execution answered: HTTP status and body.
    pub result: Option<ApprovalResult>,
    /// True when `operation` and `result` are withheld: only the proposer
    /// and the members who may decide the proposal see them.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub details_hidden: bool,
}

/// The answer of an approved execution.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ApprovalResult {
    pub status: i64,
    pub body: Value,
}

/// A proposal to store.
pub struct NewApproval<'a> {
    pub workspace_id: &'a str,
    pub category: &'a str,
    pub action: &'a str,
    pub summary: &'a str,
    pub operation: &'a Value,
    pub proposed_by: &'a str,
    pub proposed_session: &'a str,
    pub client_source: ClientSource,
    pub request_id: &'a str,
    pub expires_at: i64,
}

/// Filters of `GET /approvals`.
#[derive(Debug, Default)]
pub(crate) struct ApprovalFilter {
    pub status: Option<ApprovalStatus>,
    pub category: Option<String>,
    pub client_source: Option<ClientSource>,
}

/// Why a proposal could not be decided.
#[derive(Debug)]
pub(crate) enum DecideError {
    NotFound,
    /// Already decided: carries the current status.
    NotPending(ApprovalStatus),
    Expired,
}

/// A workspace's policy for one category.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct StoredPolicy {
    pub category: String,
    pub requires_approval: bool,
    pub approver_role: Role,
    pub updated_by: Option<String>,
    pub updated_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "id, workspace_id, category, action, summary, operation, status, proposed_by, proposed_session, client_source, \
     request_id, created_at, expires_at, decided_by, decided_at, result_status, result_body";

fn from_row(r: &sqlx::any::AnyRow, now: i64) -> StoreResult<Approval> {
    let mut status = decode(r.try_get("status")?, ApprovalStatus::parse, "status")?;
    let expires_at: i64 = r.try_get("expires_at")?;
    if status == ApprovalStatus::Pending && expires_at <= now {
        status = ApprovalStatus::Expired;
    }
    let operation: String = r.try_get("operation")?;
    let result_status: Option<i64> = r.try_get("result_status")?;
    let result_body: Option<String> = r.try_get("result_body")?;
    Ok(Approval {
        approval_id: r.try_get("id")?,
        workspace_id: r.try_get("workspace_id")?,
        category: r.try_get("category")?,
        action: r.try_get("action")?,
        summary: r.try_get("summary")?,
        operation: serde_json::from_str(&operation).unwrap_or(Value::Null),
        status,
        proposed_by: r.try_get("proposed_by")?,
        proposed_session: r.try_get("proposed_session")?,
        client_source: decode(r.try_get("client_source")?, ClientSource::parse, "client_source")?,
        request_id: r.try_get("request_id")?,
        created_at: from_ms(r.try_get("created_at")?),
        expires_at: from_ms(expires_at),
        decided_by: r.try_get("decided_by")?,
        decided_at: r.try_get::<Option<i64>, _>("decided_at")?.map(from_ms),
        result: result_status.map(|status| ApprovalResult {
            status,
            body: result_body.and_then(|b| serde_json::from_str(&b).ok()).unwrap_or(Value::Null),
        }),
        details_hidden: false,
    })
}

impl Store {
    /// Stores a proposal, announcing it (`approval.requested`).
    pub async fn create_approval(&self, a: NewApproval<'_>) -> StoreResult<Approval> {
        let id = new_id("apr");
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO approvals (id, workspace_id, category, action, summary, operation, status, proposed_by, proposed_session, \
             client_source, request_id, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7, $8, $9, $10, $11, $12)",
        )
        .bind(&id)
        .bind(a.workspace_id)
        .bind(a.category)
        .bind(a.action)
        .bind(a.summary)
        .bind(a.operation.to_string())
        .bind(a.proposed_by)
        .bind(a.proposed_session)
        .bind(a.client_source.as_str())
        .bind(a.request_id)
        .bind(now_ms())
        .bind(a.expires_at)
        .execute(&mut *tx)
        .await?;
        let approval = approval_in(&mut tx, a.workspace_id, &id).await?;
        let queued = announce(&mut tx, self.outbox_bounds(), &approval, EventType::ApprovalRequested).await?;
        tx.commit().await?;
        if queued > 0 {
            self.outbox_written();
        }
        Ok(approval)
    }

    pub(crate) async fn approval(&self, workspace_id: &str, id: &str) -> StoreResult<Option<Approval>> {
        let sql = format!("SELECT {COLUMNS} FROM approvals WHERE workspace_id = $1 AND id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(workspace_id).bind(id).fetch_optional(self.pool()).await?;
        let now = now_ms();
        row.map(|r| from_row(&r, now)).transpose()
    }

    /// Proposals of a workspace, newest first.
    pub(crate) async fn approvals(
        &self,
        workspace_id: &str,
        f: &ApprovalFilter,
        before: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<Approval>> {
        let now = now_ms();
        // `expired` is derived: a pending proposal past its expiry.
        let (status, expired) = match f.status {
            Some(ApprovalStatus::Expired) => (Some(ApprovalStatus::Pending), Some(1i64)),
            Some(ApprovalStatus::Pending) => (Some(ApprovalStatus::Pending), Some(0i64)),
            other => (other, None),
        };
        let sql = format!(
            "SELECT {COLUMNS} FROM approvals WHERE workspace_id = $1 AND ($2 IS NULL OR status = $2) \
             AND ($3 IS NULL OR category = $3) AND ($4 IS NULL OR client_source = $4) AND ($5 IS NULL OR id < $5) \
             AND ($6 IS NULL OR ($6 = 1 AND expires_at <= $7) OR ($6 = 0 AND expires_at > $7)) ORDER BY id DESC LIMIT $8"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(workspace_id)
            .bind(status.map(ApprovalStatus::as_str))
            .bind(&f.category)
            .bind(f.client_source.map(ClientSource::as_str))
            .bind(before)
            .bind(expired)
            .bind(now)
            .bind(limit)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(|r| from_row(r, now)).collect()
    }

    /// Moves a pending, unexpired proposal to `to` (`executing` or
    /// `rejected`). One statement, so of two concurrent decisions exactly one
    /// wins.
    pub(crate) async fn decide_approval(
        &self,
        workspace_id: &str,
        id: &str,
        decided_by: &str,
        to: ApprovalStatus,
    ) -> StoreResult<Result<Approval, DecideError>> {
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let n = sqlx::query(
            "UPDATE approvals SET status = $1, decided_by = $2, decided_at = $3 \
             WHERE workspace_id = $4 AND id = $5 AND status = 'pending' AND expires_at > $3",
        )
        .bind(to.as_str())
        .bind(decided_by)
        .bind(now)
        .bind(workspace_id)
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let mut queued = 0;
        // A rejection is final now; an approval is announced when its
        // execution has answered ([`Store::finish_approval`]).
        if n == 1 && to == ApprovalStatus::Rejected {
            let decided = approval_in(&mut tx, workspace_id, id).await?;
            queued = announce(&mut tx, self.outbox_bounds(), &decided, EventType::ApprovalDecided).await?;
        }
        tx.commit().await?;
        if queued > 0 {
            self.outbox_written();
        }
        let current = self.approval(workspace_id, id).await?;
        Ok(match (n, current) {
            (_, None) => Err(DecideError::NotFound),
            (1, Some(a)) => Ok(a),
            (_, Some(a)) if a.status == ApprovalStatus::Expired => Err(DecideError::Expired),
            (_, Some(a)) => Err(DecideError::NotPending(a.status)),
        })
    }

    /// Records what the approved execution answered, and announces the
    /// decision with its outcome (`executed` or `failed`).
    pub(crate) async fn finish_approval(
        &self,
        id: &str,
        succeeded: bool,
        status: u16,
        body: &Value,
    ) -> StoreResult<()> {
        let mut tx = self.begin_write().await?;
        let finished = sqlx::query(
            "UPDATE approvals SET status = $1, result_status = $2, result_body = $3 WHERE id = $4 AND status = 'executing' \
             RETURNING workspace_id",
        )
        .bind(if succeeded { ApprovalStatus::Executed } else { ApprovalStatus::Failed }.as_str())
        .bind(i64::from(status))
        .bind(body.to_string())
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let mut queued = 0;
        if let Some(row) = finished {
            let workspace_id: String = row.try_get("workspace_id")?;
            let decided = approval_in(&mut tx, &workspace_id, id).await?;
            queued = announce(&mut tx, self.outbox_bounds(), &decided, EventType::ApprovalDecided).await?;
        }
        tx.commit().await?;
        if queued > 0 {
            self.outbox_written();
        }
        Ok(())
    }

    /// Stored policies of a workspace (categories never changed are absent).
    pub(crate) async fn approval_policies(&self, workspace_id: &str) -> StoreResult<Vec<StoredPolicy>> {
        let rows = sqlx::query(
            "SELECT category, requires_approval, approver_role, updated_by, updated_at FROM approval_policies WHERE workspace_id = $1",
        )
        .bind(workspace_id)
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(StoredPolicy {
                    category: r.try_get("category")?,
                    requires_approval: r.try_get::<i64, _>("requires_approval")? != 0,
                    approver_role: Role::parse(r.try_get::<&str, _>("approver_role")?).unwrap_or(Role::Administrator),
                    updated_by: r.try_get("updated_by")?,
                    updated_at: Some(from_ms(r.try_get("updated_at")?)),
                })
            })
            .collect()
    }

    pub(crate) async fn set_approval_policy(
        &self,
        workspace_id: &str,
        category: &str,
        requires: bool,
        approver: Role,
        by: &str,
    ) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO approval_policies (workspace_id, category, requires_approval, approver_role, updated_by, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (workspace_id, category) DO UPDATE SET \
             requires_approval = excluded.requires_approval, approver_role = excluded.approver_role, \
             updated_by = excluded.updated_by, updated_at = excluded.updated_at",
        )
        .bind(workspace_id)
        .bind(category)
        .bind(i64::from(requires))
        .bind(approver.as_str())
        .bind(by)
        .bind(now_ms())
        .execute(self.pool())
        .await?;
        Ok(())
    }
}

/// A proposal as the transaction on `conn` sees it.
async fn approval_in(conn: &mut sqlx::AnyConnection, workspace_id: &str, id: &str) -> StoreResult<Approval> {
    let sql = format!("SELECT {COLUMNS} FROM approvals WHERE workspace_id = $1 AND id = $2");
    let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(workspace_id).bind(id).fetch_one(&mut *conn).await?;
    from_row(&row, now_ms())
}

/// Announces a proposal or its decision: what a person needs to find it
/// and judge it, not the operation's body (a receiver is not an approver).
async fn announce(
    conn: &mut sqlx::AnyConnection,
    bounds: super::webhooks::OutboxBounds,
    a: &Approval,
    event: EventType,
) -> StoreResult<usize> {
    let data = json!({
        "approval_id": a.approval_id,
        "category": a.category,
        "action": a.action,
        "summary": a.summary,
        "status": a.status,
        "proposed_by": a.proposed_by,
        "client_source": a.client_source,
        "created_at": a.created_at,
        "expires_at": a.expires_at,
        "decided_by": a.decided_by,
        "decided_at": a.decided_at,
    });
    record_event(conn, bounds, &a.workspace_id, event, data).await
}
