//! OAuth flows in progress.

use sqlx::Row;

use super::{Store, StoreResult, now_ms};

/// A flow's state as stored.
#[derive(Debug, Clone)]
pub struct OAuthState {
    pub workspace_id: String,
    pub user_id: String,
    pub target: String,
    pub code_verifier: String,
    pub redirect_uri: String,
    pub expires_at: i64,
    pub used: bool,
    /// The session that started the flow.
    pub session_id: Option<String>,
    /// The kind of client that started it: a flow an MCP client started
    /// ends in a proposal, wherever it is completed.
    pub client_source: String,
}

/// A pending flow as its confirmation page describes it.
#[derive(Debug, Clone)]
pub(crate) struct PendingFlow {
    pub workspace_name: String,
    pub initiator_email: String,
    pub target: String,
    pub client_source: String,
    pub expires_at: i64,
}

/// What spending a state found.
#[derive(Debug)]
pub(crate) enum Spend {
    Unknown,
    Expired,
    Used,
    Spent(OAuthState),
}

impl Store {
    pub async fn create_oauth_state(&self, state_hash: &str, s: &OAuthState) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO oauth_states (state_hash, workspace_id, user_id, target, code_verifier, redirect_uri, created_at, expires_at, \
             session_id, client_source) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(state_hash)
        .bind(&s.workspace_id)
        .bind(&s.user_id)
        .bind(&s.target)
        .bind(&s.code_verifier)
        .bind(&s.redirect_uri)
        .bind(now_ms())
        .bind(s.expires_at)
        .bind(&s.session_id)
        .bind(&s.client_source)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Spends a state once; reports unknown, expired and reused states.
    pub(crate) async fn spend_oauth_state(&self, state_hash: &str) -> StoreResult<Spend> {
        let now = now_ms();
        let row = sqlx::query(
            "UPDATE oauth_states SET used_at = $1 WHERE state_hash = $2 AND used_at IS NULL AND expires_at > $1 \
             RETURNING workspace_id, user_id, target, code_verifier, redirect_uri, expires_at, session_id, client_source",
        )
        .bind(now)
        .bind(state_hash)
        .fetch_optional(self.pool())
        .await?;
        if let Some(r) = row {
            return Ok(Spend::Spent(OAuthState {
                workspace_id: r.try_get("workspace_id")?,
                user_id: r.try_get("user_id")?,
                target: r.try_get("target")?,
                code_verifier: r.try_get("code_verifier")?,
                redirect_uri: r.try_get("redirect_uri")?,
                expires_at: r.try_get("expires_at")?,
                used: true,
                session_id: r.try_get("session_id")?,
                client_source: r.try_get("client_source")?,
            }));
        }
        let row = sqlx::query("SELECT used_at, expires_at FROM oauth_states WHERE state_hash = $1")
            .bind(state_hash)
            .fetch_optional(self.pool())
            .await?;
        Ok(match row {
            None => Spend::Unknown,
            Some(r) if r.try_get::<Option<i64>, _>("used_at")?.is_some() => Spend::Used,
            Some(_) => Spend::Expired,
        })
    }

    /// A flow that can still be completed, described for its confirmation
    /// page, without spending it.
    pub(crate) async fn pending_oauth_flow(&self, state_hash: &str) -> StoreResult<Option<PendingFlow>> {
        let row = sqlx::query(
            "SELECT w.name, u.email, o.target, o.client_source, o.expires_at FROM oauth_states o \
             JOIN workspaces w ON w.id = o.workspace_id JOIN users u ON u.id = o.user_id \
             WHERE o.state_hash = $1 AND o.used_at IS NULL AND o.expires_at > $2",
        )
        .bind(state_hash)
        .bind(now_ms())
        .fetch_optional(self.pool())
        .await?;
        row.map(|r| {
            Ok(PendingFlow {
                workspace_name: r.try_get("name")?,
                initiator_email: r.try_get("email")?,
                target: r.try_get("target")?,
                client_source: r.try_get("client_source")?,
                expires_at: r.try_get("expires_at")?,
            })
        })
        .transpose()
    }

    /// Who a state belongs to, without spending it.
    pub(crate) async fn oauth_state_owner(&self, state_hash: &str) -> StoreResult<Option<(String, String)>> {
        let row = sqlx::query("SELECT workspace_id, user_id FROM oauth_states WHERE state_hash = $1")
            .bind(state_hash)
            .fetch_optional(self.pool())
            .await?;
        row.map(|r| Ok((r.try_get("workspace_id")?, r.try_get("user_id")?))).transpose()
    }
}
