//! Invitations: a single-use, expiring way for someone to join a workspace.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::Row;
use utoipa::ToSchema;

use super::workspaces::Role;
use super::{Store, StoreResult, from_ms, new_id, now_ms};

/// An invitation as returned to the administrator who created it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Invitation {
    pub invitation_id: String,
    pub workspace_id: String,
    pub email: String,
    pub role: Role,
    pub invited_by: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// What an accepted invitation granted.
#[derive(Debug, Clone)]
pub(crate) struct AcceptedInvitation {
    pub invitation_id: String,
    pub user_id: String,
    pub workspace_id: String,
    pub role: Role,
}

/// What an invitee sees before accepting.
#[derive(Debug, Clone)]
pub(crate) struct PendingInvitation {
    pub invitation_id: String,
    pub workspace_id: String,
    pub workspace_name: String,
    pub email: String,
    pub role: Role,
}

/// Who accepts an invitation.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Acceptor<'a> {
    /// Someone without an account: the link is their proof of the
    /// address, and accepting creates the account.
    NewAccount { name: &'a str },
    /// An account, through its own session.
    Account { user_id: &'a str },
}

/// Why an invitation was not accepted (nothing was spent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcceptError {
    /// Unknown, expired or already used.
    NotPending,
    /// The address has an account: it must accept signed in.
    AccountExists,
    /// The invitation is for another address than the account's.
    WrongAccount,
}

impl Store {
    pub async fn create_invitation(
        &self,
        workspace_id: &str,
        email: &str,
        role: Role,
        token_hash: &str,
        invited_by: &str,
        expires_at: i64,
    ) -> StoreResult<Invitation> {
        let id = new_id("inv");
        let now = now_ms();
        sqlx::query(
            "INSERT INTO invitations (id, workspace_id, email, role, token_hash, invited_by, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&id)
        .bind(workspace_id)
        .bind(email)
        .bind(role.as_str())
        .bind(token_hash)
        .bind(invited_by)
        .bind(now)
        .bind(expires_at)
        .execute(self.pool())
        .await?;
        Ok(Invitation {
            invitation_id: id,
            workspace_id: workspace_id.to_owned(),
            email: email.to_owned(),
            role,
            invited_by: invited_by.to_owned(),
            created_at: from_ms(now),
            expires_at: from_ms(expires_at),
        })
    }

    /// The invitation behind a token if it can still be accepted.
    pub(crate) async fn pending_invitation(&self, token_hash: &str) -> StoreResult<Option<PendingInvitation>> {
        let row = sqlx::query(
            "SELECT i.id, i.workspace_id, w.name, i.email, i.role \
             FROM invitations i JOIN workspaces w ON w.id = i.workspace_id \
             WHERE i.token_hash = $1 AND i.accepted_at IS NULL AND i.expires_at > $2",
        )
        .bind(token_hash)
        .bind(now_ms())
        .fetch_optional(self.pool())
        .await?;
        row.map(|r| {
            Ok(PendingInvitation {
                invitation_id: r.try_get("id")?,
                workspace_id: r.try_get("workspace_id")?,
                workspace_name: r.try_get("name")?,
                email: r.try_get("email")?,
                role: Role::parse(r.try_get::<&str, _>("role")?).unwrap_or(Role::Viewer),
            })
        })
        .transpose()
    }

    /// Spends the invitation and makes its address a member. All or
    /// nothing: a token is spent only together with the membership it
    /// grants. A new account is created only for an address that has none;
    /// an existing account accepts only for itself, through its own
    /// session, so an invitation can never hand anyone a session of an
    /// account that exists.
    pub(crate) async fn accept_invitation(
        &self,
        token_hash: &str,
        by: Acceptor<'_>,
    ) -> StoreResult<Result<AcceptedInvitation, AcceptError>> {
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let Some(row) = sqlx::query(
            "UPDATE invitations SET accepted_at = $1 WHERE token_hash = $2 AND accepted_at IS NULL AND expires_at > $1 \
             RETURNING id, workspace_id, email, role",
        )
        .bind(now)
        .bind(token_hash)
        .fetch_optional(&mut *tx)
        .await?
        else {
            return Ok(Err(AcceptError::NotPending));
        };
        let invitation_id: String = row.try_get("id")?;
        let workspace_id: String = row.try_get("workspace_id")?;
        let email: String = row.try_get("email")?;
        let role = Role::parse(row.try_get::<&str, _>("role")?).unwrap_or(Role::Viewer);

        let existing: Option<String> = sqlx::query("SELECT id FROM users WHERE email = $1")
            .bind(&email)
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| r.try_get("id"))
            .transpose()?;
        let user_id = match (by, existing) {
            (Acceptor::NewAccount { .. }, Some(_)) => return Ok(Err(AcceptError::AccountExists)),
            (Acceptor::NewAccount { name }, None) => {
                let id = new_id("usr");
                sqlx::query("INSERT INTO users (id, email, name, created_at) VALUES ($1, $2, $3, $4)")
                    .bind(&id)
                    .bind(&email)
                    .bind(name)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                id
            }
            (Acceptor::Account { user_id }, Some(owner)) if owner == user_id => owner,
            (Acceptor::Account { .. }, _) => return Ok(Err(AcceptError::WrongAccount)),
        };
        // An existing member keeps their current role: an invitation never
        // demotes anyone.
        sqlx::query(
            "INSERT INTO memberships (id, workspace_id, user_id, role, created_at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (workspace_id, user_id) DO NOTHING",
        )
        .bind(new_id("mem"))
        .bind(&workspace_id)
        .bind(&user_id)
        .bind(role.as_str())
        .bind(now)
        .execute(&mut *tx)
        .await?;
        sqlx::query("UPDATE invitations SET accepted_by = $1 WHERE id = $2")
            .bind(&user_id)
            .bind(&invitation_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.memberships_changed().await;
        Ok(Ok(AcceptedInvitation { invitation_id, user_id, workspace_id, role }))
    }
}
