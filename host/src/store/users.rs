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
    pub async fn count_users(&self) -> StoreResult<i64> {
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
}
