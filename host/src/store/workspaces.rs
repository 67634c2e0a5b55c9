//! Workspaces and their memberships.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::Row;
use utoipa::ToSchema;

use super::{Backend, ResultExt, Store, StoreError, StoreResult, from_ms, new_id, now_ms};

/// A member's role in one workspace, from most to least powerful.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Read only.
    Viewer,
    /// May change pipelines and their parts (sources, destinations, jobs).
    Editor,
    /// Everything, including members, sessions and approval policies.
    Administrator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Editor => "editor",
            Role::Administrator => "administrator",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "viewer" => Some(Role::Viewer),
            "editor" => Some(Role::Editor),
            "administrator" => Some(Role::Administrator),
            _ => None,
        }
    }
}

/// A workspace: the unit of isolation for everything a user configures.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Workspace {
    pub workspace_id: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

/// A workspace as seen by one of its members: with that member's role.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WorkspaceWithRole {
    pub workspace_id: String,
    /// The caller's membership in it.
    pub member_id: String,
    pub name: String,
    pub role: Role,
    pub created_at: DateTime<Utc>,
}

/// A user's membership in a workspace.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct Member {
    /// Identifier of the membership (`mem_...`), used to remove it.
    pub member_id: String,
    pub user_id: String,
    pub email: String,
    pub name: String,
    pub role: Role,
    /// When the user joined the workspace.
    pub joined_at: DateTime<Utc>,
}

/// Why removing a member was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RemoveMemberError {
    #[error("no such member")]
    NotFound,
    #[error("the workspace must keep at least one administrator")]
    LastAdministrator,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for RemoveMemberError {
    fn from(e: sqlx::Error) -> Self {
        RemoveMemberError::Store(e.into())
    }
}

fn role_from(s: &str) -> StoreResult<Role> {
    Role::parse(s).ok_or_else(|| StoreError::Database(sqlx::Error::Decode(format!("unknown role {s}").into())))
}

fn member_from_row(row: &sqlx::any::AnyRow) -> StoreResult<Member> {
    Ok(Member {
        member_id: row.try_get("id")?,
        user_id: row.try_get("user_id")?,
        email: row.try_get("email")?,
        name: row.try_get("name")?,
        role: role_from(row.try_get::<&str, _>("role")?)?,
        joined_at: from_ms(row.try_get("created_at")?),
    })
}

fn workspace_from_row(r: &sqlx::any::AnyRow) -> StoreResult<Workspace> {
    Ok(Workspace {
        workspace_id: r.try_get("id")?,
        name: r.try_get("name")?,
        created_at: from_ms(r.try_get("created_at")?),
    })
}

const MEMBER_COLUMNS: &str = "m.id, m.user_id, u.email, u.name, m.role, m.created_at";

/// A workspace's share of the job runners, relative to the other
/// workspaces' (1 to 1,000; every workspace starts at 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClaimWeight(u16);

impl ClaimWeight {
    pub const MAX: u16 = 1000;

    pub fn new(weight: u16) -> Option<ClaimWeight> {
        (1..=Self::MAX).contains(&weight).then_some(ClaimWeight(weight))
    }

    pub fn get(self) -> u16 {
        self.0
    }
}

impl std::fmt::Display for ClaimWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl Store {
    pub async fn create_workspace(&self, name: &str) -> StoreResult<Workspace> {
        let id = new_id("ws");
        let now = now_ms();
        sqlx::query("INSERT INTO workspaces (id, name, created_at) VALUES ($1, $2, $3)")
            .bind(&id)
            .bind(name)
            .bind(now)
            .execute(self.pool())
            .await?;
        Ok(Workspace { workspace_id: id, name: name.to_owned(), created_at: from_ms(now) })
    }

    /// The oldest workspace of the installation, where offline admin commands
    /// put new users unless told otherwise.
    pub async fn first_workspace(&self) -> StoreResult<Option<Workspace>> {
        let row = sqlx::query("SELECT id, name, created_at FROM workspaces ORDER BY created_at, id LIMIT 1")
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(workspace_from_row).transpose()
    }

    pub(crate) async fn workspace(&self, workspace_id: &str) -> StoreResult<Option<Workspace>> {
        let row = sqlx::query("SELECT id, name, created_at FROM workspaces WHERE id = $1")
            .bind(workspace_id)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(workspace_from_row).transpose()
    }

    /// Sets a workspace's share of the job runners; `false` when there is
    /// no such workspace. Every server's next claim uses it.
    pub async fn set_claim_weight(&self, workspace_id: &str, weight: ClaimWeight) -> StoreResult<bool> {
        let n = sqlx::query("UPDATE workspaces SET claim_weight = $1 WHERE id = $2")
            .bind(i64::from(weight.get()))
            .bind(workspace_id)
            .execute(self.pool())
            .await?
            .rows_affected();
        Ok(n > 0)
    }

    /// Every workspace with its share of the job runners, the oldest
    /// workspace first.
    pub async fn claim_weights(&self) -> StoreResult<Vec<(Workspace, ClaimWeight)>> {
        let rows = sqlx::query("SELECT id, name, created_at, claim_weight FROM workspaces ORDER BY created_at, id")
            .fetch_all(self.pool())
            .await?;
        rows.iter()
            .map(|r| {
                let weight: i64 = r.try_get("claim_weight")?;
                let weight = u16::try_from(weight).ok().and_then(ClaimWeight::new).unwrap_or(ClaimWeight(1));
                Ok((workspace_from_row(r)?, weight))
            })
            .collect()
    }

    /// Adds `user_id` to the workspace; already a member is
    /// `Conflict("memberships_workspace_user")`.
    pub async fn add_member(&self, workspace_id: &str, user_id: &str, role: Role) -> StoreResult<String> {
        let id = new_id("mem");
        sqlx::query(
            "INSERT INTO memberships (id, workspace_id, user_id, role, created_at) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&id)
        .bind(workspace_id)
        .bind(user_id)
        .bind(role.as_str())
        .bind(now_ms())
        .execute(self.pool())
        .await
        .on_conflict("memberships_workspace_user")?;
        self.memberships_changed().await;
        Ok(id)
    }

    /// The user's role in a workspace, or `None` when not a member (callers
    /// answer 404 then, exactly as for a workspace that does not exist).
    pub async fn role_in(&self, user_id: &str, workspace_id: &str) -> StoreResult<Option<Role>> {
        let row = sqlx::query("SELECT role FROM memberships WHERE user_id = $1 AND workspace_id = $2")
            .bind(user_id)
            .bind(workspace_id)
            .fetch_optional(self.pool())
            .await?;
        row.map(|r| role_from(r.try_get::<&str, _>("role")?)).transpose()
    }

    /// The workspace a request uses when it names none: the user's oldest
    /// membership.
    pub(crate) async fn default_workspace_of(&self, user_id: &str) -> StoreResult<Option<(String, Role)>> {
        let row = sqlx::query("SELECT workspace_id, role FROM memberships WHERE user_id = $1 ORDER BY id LIMIT 1")
            .bind(user_id)
            .fetch_optional(self.pool())
            .await?;
        row.map(|r| Ok((r.try_get("workspace_id")?, role_from(r.try_get::<&str, _>("role")?)?))).transpose()
    }

    /// Every workspace the user belongs to, oldest membership first (so the
    /// first one is the user's default workspace).
    pub(crate) async fn workspaces_of(
        &self,
        user_id: &str,
        after: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<WorkspaceWithRole>> {
        let rows = sqlx::query(
            "SELECT w.id, m.id AS member_id, w.name, w.created_at, m.role FROM memberships m JOIN workspaces w ON w.id = m.workspace_id \
             WHERE m.user_id = $1 AND ($2 IS NULL OR m.id > $2) ORDER BY m.id LIMIT $3",
        )
        .bind(user_id)
        .bind(after)
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(WorkspaceWithRole {
                    workspace_id: r.try_get("id")?,
                    member_id: r.try_get("member_id")?,
                    name: r.try_get("name")?,
                    role: role_from(r.try_get::<&str, _>("role")?)?,
                    created_at: from_ms(r.try_get("created_at")?),
                })
            })
            .collect()
    }

    /// Members of a workspace in joining order, with an optional role filter.
    pub(crate) async fn members(
        &self,
        workspace_id: &str,
        role: Option<Role>,
        after: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<Member>> {
        let sql = format!(
            "SELECT {MEMBER_COLUMNS} FROM memberships m JOIN users u ON u.id = m.user_id \
             WHERE m.workspace_id = $1 AND ($2 IS NULL OR m.role = $2) AND ($3 IS NULL OR m.id > $3) \
             ORDER BY m.id LIMIT $4"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(workspace_id)
            .bind(role.map(Role::as_str))
            .bind(after)
            .bind(limit)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(member_from_row).collect()
    }

    /// Removes a membership unless it is the workspace's last administrator.
    ///
    /// The check and the delete are one statement, and on PostgreSQL the
    /// workspace row is locked first, so two administrators removing each
    /// other at the same moment cannot leave the workspace without one.
    pub(crate) async fn remove_member(&self, workspace_id: &str, member_id: &str) -> Result<Member, RemoveMemberError> {
        let mut tx = self.begin_write().await?;
        if self.backend() == Backend::Postgres {
            sqlx::query("SELECT id FROM workspaces WHERE id = $1 FOR UPDATE")
                .bind(workspace_id)
                .execute(&mut *tx)
                .await?;
        }
        let sql = format!(
            "SELECT {MEMBER_COLUMNS} FROM memberships m JOIN users u ON u.id = m.user_id \
             WHERE m.workspace_id = $1 AND m.id = $2"
        );
        let Some(row) =
            sqlx::query(sqlx::AssertSqlSafe(sql)).bind(workspace_id).bind(member_id).fetch_optional(&mut *tx).await?
        else {
            return Err(RemoveMemberError::NotFound);
        };
        let member = member_from_row(&row)?;
        let deleted = sqlx::query(
            "DELETE FROM memberships WHERE workspace_id = $1 AND id = $2 AND (role <> 'administrator' OR \
             (SELECT COUNT(*) FROM memberships WHERE workspace_id = $1 AND role = 'administrator') > 1)",
        )
        .bind(workspace_id)
        .bind(member_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if deleted == 0 {
            return Err(RemoveMemberError::LastAdministrator);
        }
        tx.commit().await?;
        self.memberships_changed().await;
        Ok(member)
    }
}
