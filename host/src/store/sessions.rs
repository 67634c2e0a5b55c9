//! Sessions: one row per issued token. Only the token's hash is stored.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::Row;
use utoipa::ToSchema;

use super::{ResultExt, Store, StoreResult, from_ms, new_id, now_ms};

/// Which kind of client made a request (`X-Service-Client`); recorded on
/// sessions, audit records and approvals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClientSource {
    Api,
    Cli,
    Mcp,
}

impl ClientSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ClientSource::Api => "api",
            ClientSource::Cli => "cli",
            ClientSource::Mcp => "mcp",
        }
    }

    pub fn parse(s: &str) -> Option<ClientSource> {
        match s {
            "api" => Some(ClientSource::Api),
            "cli" => Some(ClientSource::Cli),
            "mcp" => Some(ClientSource::Mcp),
            _ => None,
        }
    }
}

/// What a token was issued as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionKind {
    /// An interactive session of the API (CLI login, one-time login link,
    /// invitation acceptance, first-run bootstrap).
    Session,
    /// A long-lived token minted for automation (`service admin create-token`).
    ApiToken,
    /// A person signed in on the web: the only kind the browser pages
    /// accept from their cookie, and one the API refuses, so no other
    /// token can act as a person at the pages (CLI authorisation,
    /// approvals) and a browser cookie is no API token.
    Web,
}

impl SessionKind {
    fn as_str(self) -> &'static str {
        match self {
            SessionKind::Session => "session",
            SessionKind::ApiToken => "api_token",
            SessionKind::Web => "web",
        }
    }

    /// The kind stored as `s`; unknown values read as the API kind that
    /// opens no page.
    fn parse(s: &str) -> SessionKind {
        match s {
            "api_token" => SessionKind::ApiToken,
            "web" => SessionKind::Web,
            _ => SessionKind::Session,
        }
    }
}

/// Session metadata as listed to administrators. Never holds the token.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct Session {
    pub session_id: String,
    pub user_id: String,
    pub kind: SessionKind,
    /// Free text given when the token was minted.
    pub label: Option<String>,
    /// Client kind that created the session.
    pub client_source: ClientSource,
    pub user_agent: Option<String>,
    /// Remote address the session was created from.
    pub address: Option<String>,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// What is recorded about a session when it is created.
#[derive(Debug, Clone)]
pub(crate) struct NewSession<'a> {
    pub user_id: &'a str,
    pub token_hash: &'a str,
    pub kind: SessionKind,
    pub label: Option<&'a str>,
    pub client_source: ClientSource,
    pub user_agent: Option<&'a str>,
    pub address: Option<&'a str>,
    pub expires_at: Option<i64>,
}

/// The part of a session the authentication check needs on every request.
#[derive(Debug, Clone)]
pub struct ActiveSession {
    pub session_id: String,
    pub user_id: String,
    /// The kind of client the session was issued to: an MCP session stays
    /// one whatever a request's header says.
    pub client_source: ClientSource,
    /// What the token was issued as: pages take only [`SessionKind::Web`],
    /// the API every other kind.
    pub kind: SessionKind,
    pub last_used_at: Option<i64>,
    pub expires_at: Option<i64>,
}

/// Which sessions a listing asks for, and who asks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionQuery<'a> {
    pub workspace_id: &'a str,
    /// The user listing them.
    pub viewer: &'a str,
    /// Whether the viewer administers the workspace.
    pub as_administrator: bool,
    /// Only this user's sessions.
    pub user_id: Option<&'a str>,
    pub include_revoked: bool,
}

/// The SQL condition that `viewer` (an expression) administers every
/// workspace `user` (an expression) belongs to, and is an operator if that
/// user is one.
fn administered(user: &str, viewer: &str) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM memberships o WHERE o.user_id = {user} AND NOT EXISTS \
         (SELECT 1 FROM memberships c WHERE c.workspace_id = o.workspace_id AND c.user_id = {viewer} AND c.role = 'administrator')) \
         AND ((SELECT u.operator FROM users u WHERE u.id = {user}) = 0 OR (SELECT v.operator FROM users v WHERE v.id = {viewer}) = 1)"
    )
}

const SESSION_COLUMNS: &str = "s.id, s.user_id, s.kind, s.label, s.client_source, s.user_agent, s.address, s.created_at, s.last_used_at, s.expires_at, s.revoked_at";

fn session_from_row(row: &sqlx::any::AnyRow) -> StoreResult<Session> {
    let kind: String = row.try_get("kind")?;
    let client: String = row.try_get("client_source")?;
    Ok(Session {
        session_id: row.try_get("id")?,
        user_id: row.try_get("user_id")?,
        kind: SessionKind::parse(&kind),
        label: row.try_get("label")?,
        client_source: ClientSource::parse(&client).unwrap_or(ClientSource::Api),
        user_agent: row.try_get("user_agent")?,
        address: row.try_get("address")?,
        created_at: from_ms(row.try_get("created_at")?),
        last_used_at: row.try_get::<Option<i64>, _>("last_used_at")?.map(from_ms),
        expires_at: row.try_get::<Option<i64>, _>("expires_at")?.map(from_ms),
        revoked_at: row.try_get::<Option<i64>, _>("revoked_at")?.map(from_ms),
    })
}

impl Store {
    pub(crate) async fn create_session(&self, new: NewSession<'_>) -> StoreResult<String> {
        let id = new_id("ses");
        sqlx::query(
            "INSERT INTO sessions (id, user_id, token_hash, kind, label, client_source, user_agent, address, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&id)
        .bind(new.user_id)
        .bind(new.token_hash)
        .bind(new.kind.as_str())
        .bind(new.label)
        .bind(new.client_source.as_str())
        .bind(new.user_agent)
        .bind(new.address)
        .bind(now_ms())
        .bind(new.expires_at)
        .execute(self.pool())
        .await
        .on_conflict("sessions_token_hash")?;
        Ok(id)
    }

    /// The live session holding this token hash: not revoked, not expired.
    pub(crate) async fn active_session(&self, token_hash: &str) -> StoreResult<Option<ActiveSession>> {
        let row = sqlx::query(
            "SELECT id, user_id, client_source, kind, last_used_at, expires_at FROM sessions \
             WHERE token_hash = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $2)",
        )
        .bind(token_hash)
        .bind(now_ms())
        .fetch_optional(self.pool())
        .await?;
        row.map(|r| {
            Ok(ActiveSession {
                session_id: r.try_get("id")?,
                user_id: r.try_get("user_id")?,
                // Unknown values are treated as the most restricted kind.
                client_source: ClientSource::parse(r.try_get::<&str, _>("client_source")?).unwrap_or(ClientSource::Mcp),
                kind: SessionKind::parse(r.try_get::<&str, _>("kind")?),
                last_used_at: r.try_get("last_used_at")?,
                expires_at: r.try_get("expires_at")?,
            })
        })
        .transpose()
    }

    pub(crate) async fn touch_session(&self, session_id: &str, at: i64) -> StoreResult<()> {
        sqlx::query("UPDATE sessions SET last_used_at = $1 WHERE id = $2")
            .bind(at)
            .bind(session_id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    pub(crate) async fn session(&self, session_id: &str) -> StoreResult<Option<Session>> {
        let sql = format!("SELECT {SESSION_COLUMNS} FROM sessions s WHERE s.id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(session_id).fetch_optional(self.pool()).await?;
        row.as_ref().map(session_from_row).transpose()
    }

    /// Sessions `viewer` may administer among the members of a workspace,
    /// newest first: the viewer's own, and (when `as_administrator`) those
    /// of members whose every workspace the viewer administers. A session
    /// is the user's, not the workspace's: an administrator of one
    /// workspace must not see or end how someone works in another.
    /// Operators' sessions only operators administer.
    pub(crate) async fn sessions_in_workspace(
        &self,
        q: &SessionQuery<'_>,
        before: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<Session>> {
        let sql = format!(
            "SELECT {SESSION_COLUMNS} FROM sessions s JOIN memberships m ON m.user_id = s.user_id AND m.workspace_id = $1 \
             WHERE ($2 IS NULL OR s.user_id = $2) AND ($3 = 1 OR s.revoked_at IS NULL) AND ($4 IS NULL OR s.id < $4) \
             AND (s.user_id = $6 OR ($7 = 1 AND {})) \
             ORDER BY s.id DESC LIMIT $5",
            administered("s.user_id", "$6")
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(q.workspace_id)
            .bind(q.user_id)
            .bind(i64::from(q.include_revoked))
            .bind(before)
            .bind(limit)
            .bind(q.viewer)
            .bind(i64::from(q.as_administrator))
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(session_from_row).collect()
    }

    /// Whether `viewer` may administer `user_id`'s sessions (see
    /// [`Store::sessions_in_workspace`]).
    pub(crate) async fn administers_sessions_of(&self, viewer: &str, user_id: &str) -> StoreResult<bool> {
        if viewer == user_id {
            return Ok(true);
        }
        let sql = format!("SELECT 1 AS yes FROM users su WHERE su.id = $1 AND {}", administered("su.id", "$2"));
        let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(user_id).bind(viewer).fetch_optional(self.pool()).await?;
        Ok(row.is_some())
    }

    /// Marks a session revoked and voids the proposals it made that are
    /// still pending (nobody may approve what a revoked session proposed);
    /// returns false when it was revoked already.
    pub(crate) async fn revoke_session(&self, session_id: &str) -> StoreResult<bool> {
        let now = now_ms();
        let mut tx = self.pool().begin().await?;
        let n = sqlx::query("UPDATE sessions SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
            .bind(now)
            .bind(session_id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        sqlx::query("UPDATE approvals SET status = 'voided', decided_at = $1 WHERE proposed_session = $2 AND status = 'pending'")
            .bind(now)
            .bind(session_id)
            .execute(&mut *tx)
            .await?;
        // Every server evicts it from its cache as this commits.
        self.notify_on_commit(&mut tx, &super::notices::Notice::SessionRevoked(session_id.to_owned())).await?;
        tx.commit().await?;
        Ok(n > 0)
    }

    /// Revokes every live session of a user (a password reset: whoever
    /// held one of them is out) and voids the proposals they made that
    /// are still pending; the sessions revoked.
    pub(crate) async fn revoke_user_sessions(&self, user_id: &str) -> StoreResult<Vec<String>> {
        let now = now_ms();
        let mut tx = self.pool().begin().await?;
        let rows =
            sqlx::query("UPDATE sessions SET revoked_at = $1 WHERE user_id = $2 AND revoked_at IS NULL RETURNING id")
                .bind(now)
                .bind(user_id)
                .fetch_all(&mut *tx)
                .await?;
        let ids = rows.iter().map(|r| r.try_get::<String, _>("id")).collect::<Result<Vec<_>, _>>()?;
        for id in &ids {
            sqlx::query("UPDATE approvals SET status = 'voided', decided_at = $1 WHERE proposed_session = $2 AND status = 'pending'")
                .bind(now)
                .bind(id)
                .execute(&mut *tx)
                .await?;
            self.notify_on_commit(&mut tx, &super::notices::Notice::SessionRevoked(id.clone())).await?;
        }
        tx.commit().await?;
        Ok(ids)
    }

    /// Stores a one-time login code (its hash) for the bootstrap login link.
    pub(crate) async fn create_login_code(&self, code_hash: &str, user_id: &str, expires_at: i64) -> StoreResult<()> {
        sqlx::query("INSERT INTO login_codes (code_hash, user_id, created_at, expires_at) VALUES ($1, $2, $3, $4)")
            .bind(code_hash)
            .bind(user_id)
            .bind(now_ms())
            .bind(expires_at)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Spends a login code: returns its user once, and never again.
    pub(crate) async fn redeem_login_code(&self, code_hash: &str) -> StoreResult<Option<String>> {
        let now = now_ms();
        let row = sqlx::query(
            "UPDATE login_codes SET used_at = $1 WHERE code_hash = $2 AND used_at IS NULL AND expires_at > $1 RETURNING user_id",
        )
        .bind(now)
        .bind(code_hash)
        .fetch_optional(self.pool())
        .await?;
        row.map(|r| Ok(r.try_get("user_id")?)).transpose()
    }

    /// Stores a one-time code of a CLI login (its hash).
    pub(crate) async fn create_cli_code(&self, code: &CliCode, code_hash: &str) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO cli_login_codes (code_hash, user_id, code_challenge, redirect_uri, host_label, created_at, expires_at, session_expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(code_hash)
        .bind(&code.user_id)
        .bind(&code.code_challenge)
        .bind(&code.redirect_uri)
        .bind(&code.host_label)
        .bind(now_ms())
        .bind(code.expires_at)
        .bind(code.session_expires_at)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Spends a CLI login code: what it was issued for, once, unexpired.
    /// A wrong verifier spends it too (the caller checks after this).
    pub(crate) async fn redeem_cli_code(&self, code_hash: &str) -> StoreResult<Option<CliCode>> {
        let now = now_ms();
        let row = sqlx::query(
            "UPDATE cli_login_codes SET used_at = $1 WHERE code_hash = $2 AND used_at IS NULL AND expires_at > $1 \
             RETURNING user_id, code_challenge, redirect_uri, host_label, expires_at, session_expires_at",
        )
        .bind(now)
        .bind(code_hash)
        .fetch_optional(self.pool())
        .await?;
        row.map(|r| {
            Ok(CliCode {
                user_id: r.try_get("user_id")?,
                code_challenge: r.try_get("code_challenge")?,
                redirect_uri: r.try_get("redirect_uri")?,
                host_label: r.try_get("host_label")?,
                expires_at: r.try_get("expires_at")?,
                session_expires_at: r.try_get("session_expires_at")?,
            })
        })
        .transpose()
    }
}

/// What a CLI login code was issued for.
#[derive(Debug, Clone)]
pub(crate) struct CliCode {
    pub user_id: String,
    /// `BASE64URL(SHA256(verifier))`.
    pub code_challenge: String,
    /// The CLI's loopback address the code was sent to.
    pub redirect_uri: String,
    /// The host name the CLI said it runs on (for the session's label).
    pub host_label: String,
    pub expires_at: i64,
    /// When the web session that authorised it ends: the CLI session it
    /// becomes ends then at the latest.
    pub session_expires_at: Option<i64>,
}
