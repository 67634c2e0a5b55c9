//! Users: people (or automation accounts) who hold sessions and memberships.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::Row;
use utoipa::ToSchema;

use super::{ResultExt, Store, StoreResult, from_ms, new_id, now_ms};

/// A user account.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct User {
    /// Stable identifier (`usr_...`).
    pub user_id: String,
    /// Login e-mail address, unique across the installation.
    pub email: String,
    /// Display name.
    pub name: String,
    /// When the account was created.
    pub created_at: DateTime<Utc>,
}

fn user_from_row(row: &sqlx::any::AnyRow) -> StoreResult<User> {
    Ok(User {
        user_id: row.try_get("id")?,
        email: row.try_get("email")?,
        name: row.try_get("name")?,
        created_at: from_ms(row.try_get("created_at")?),
    })
}

impl Store {
    /// Number of users; zero means a fresh installation to bootstrap.
    pub(crate) async fn count_users(&self) -> StoreResult<i64> {
        let row = sqlx::query("SELECT COUNT(*) AS n FROM users").fetch_one(self.pool()).await?;
        Ok(row.try_get("n")?)
    }

    /// Creates a user; a taken e-mail is `Conflict("users_email")`.
    pub async fn create_user(&self, email: &str, name: &str) -> StoreResult<User> {
        let id = new_id("usr");
        let now = now_ms();
        sqlx::query("INSERT INTO users (id, email, name, created_at) VALUES ($1, $2, $3, $4)")
            .bind(&id)
            .bind(email)
            .bind(name)
            .bind(now)
            .execute(self.pool())
            .await
            .on_conflict("users_email")?;
        Ok(User { user_id: id, email: email.to_owned(), name: name.to_owned(), created_at: from_ms(now) })
    }

    /// Looks a user up by id.
    pub async fn user(&self, user_id: &str) -> StoreResult<Option<User>> {
        let row = sqlx::query("SELECT id, email, name, created_at FROM users WHERE id = $1")
            .bind(user_id)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(user_from_row).transpose()
    }

    /// Looks a user up by e-mail address (exact, as stored: lower case).
    pub async fn user_by_email(&self, email: &str) -> StoreResult<Option<User>> {
        let row = sqlx::query("SELECT id, email, name, created_at FROM users WHERE email = $1")
            .bind(email)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(user_from_row).transpose()
    }

    /// Sets a user's password hash (PHC text); false when no such user.
    pub(crate) async fn set_password_hash(&self, user_id: &str, hash: &str) -> StoreResult<bool> {
        let n = sqlx::query("UPDATE users SET password_hash = $1 WHERE id = $2")
            .bind(hash)
            .bind(user_id)
            .execute(self.pool())
            .await?
            .rows_affected();
        Ok(n == 1)
    }

    /// A user found by e-mail, with their password hash if they have one.
    pub async fn user_for_sign_in(&self, email: &str) -> StoreResult<Option<(User, Option<String>)>> {
        let row = sqlx::query("SELECT id, email, name, created_at, password_hash FROM users WHERE email = $1")
            .bind(email)
            .fetch_optional(self.pool())
            .await?;
        match row {
            Some(r) => Ok(Some((user_from_row(&r)?, r.try_get("password_hash")?))),
            None => Ok(None),
        }
    }
}

impl Store {
    /// A user with their workspaces (oldest membership first) in one query:
    /// `GET /me` is the hottest read.
    pub(crate) async fn user_with_workspaces(
        &self,
        user_id: &str,
        limit: i64,
    ) -> StoreResult<Option<(User, Vec<crate::store::workspaces::WorkspaceWithRole>)>> {
        let rows = sqlx::query(
            "SELECT u.id, u.email, u.name, u.created_at, m.id AS member_id, m.role, w.id AS workspace_id, w.name AS workspace_name, \
             w.created_at AS workspace_created_at FROM users u LEFT JOIN memberships m ON m.user_id = u.id \
             LEFT JOIN workspaces w ON w.id = m.workspace_id WHERE u.id = $1 ORDER BY m.id LIMIT $2",
        )
        .bind(user_id)
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        let Some(first) = rows.first() else { return Ok(None) };
        let user = user_from_row(first)?;
        let mut workspaces = Vec::new();
        for r in &rows {
            let Some(member_id) = r.try_get::<Option<String>, _>("member_id")? else { continue };
            let role: String = r.try_get("role")?;
            workspaces.push(crate::store::workspaces::WorkspaceWithRole {
                workspace_id: r.try_get("workspace_id")?,
                member_id,
                name: r.try_get("workspace_name")?,
                role: super::workspaces::Role::parse(&role).unwrap_or(super::workspaces::Role::Viewer),
                created_at: from_ms(r.try_get("workspace_created_at")?),
            });
        }
        Ok(Some((user, workspaces)))
    }
}
