//! Destinations: where pipelines load and reverse-ETL models read, and
//! the one rule for deleting what something still uses.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::Row;
use utoipa::ToSchema;

use super::kinds::DestinationKind;
use super::pipelines::StreamContract;
use super::{Store, StoreResult, decode, from_ms, new_id, now_ms};

/// A configured destination.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Destination {
    pub destination_id: String,
    pub workspace_id: String,
    pub kind: DestinationKind,
    pub name: String,
    pub configuration: Value,
    /// The data contract of every pipeline stream writing here that names
    /// none of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_contract: Option<StreamContract>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Why a source or destination was not deleted.
#[derive(Debug)]
pub(crate) enum DeleteRefused {
    NotFound,
    /// The records that still use it: their table (`pipelines`,
    /// `retl_models`, `retl_activations`) and ids.
    InUse {
        table: &'static str,
        ids: Vec<String>,
    },
}

/// Every destination kind, quoted for SQL: what the `destinations`
/// table admits.
fn kinds() -> Vec<String> {
    DestinationKind::ALL.iter().map(|k| format!("'{}'", k.as_str())).collect()
}

/// Whether a check constraint's text admits every kind.
fn admits_all(check: &str) -> bool {
    kinds().iter().all(|k| check.contains(k.as_str()))
}

/// Widens the `kind` check of the `destinations` table to every kind of
/// [`DestinationKind`]. A migration file cannot: the two engines change a
/// check constraint in ways neither understands of the other (SQLite
/// rebuilds the table with foreign keys off, PostgreSQL replaces the
/// constraint). Idempotent; several servers may run it at once.
pub(super) async fn admit_kinds(pool: &sqlx::AnyPool, backend: super::Backend) -> Result<(), sqlx::Error> {
    use sqlx::Connection as _;
    let kinds = kinds().join(", ");
    let mut conn = pool.acquire().await?;
    match backend {
        super::Backend::Postgres => {
            let check = "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'destinations_kind_check'";
            // Read first, without a lock: every start after the first
            // finds the constraint wide enough and takes none.
            let current: Option<String> = sqlx::query_scalar(check).fetch_optional(&mut *conn).await?;
            if current.is_some_and(|c| admits_all(&c)) {
                return Ok(());
            }
            let mut tx = conn.begin().await?;
            // A backup or a long transaction holding the table fails the
            // start after a while instead of queueing every reader behind.
            sqlx::query("SET LOCAL lock_timeout = '10s'").execute(&mut *tx).await?;
            sqlx::query("LOCK TABLE destinations IN ACCESS EXCLUSIVE MODE").execute(&mut *tx).await?;
            let current: Option<String> = sqlx::query_scalar(check).fetch_optional(&mut *tx).await?;
            if current.is_some_and(|c| admits_all(&c)) {
                return tx.commit().await;
            }
            let sql = format!(
                "ALTER TABLE destinations DROP CONSTRAINT IF EXISTS destinations_kind_check; \
                 ALTER TABLE destinations ADD CONSTRAINT destinations_kind_check CHECK (kind IN ({kinds}))"
            );
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut *tx).await?;
            tx.commit().await
        }
        super::Backend::Sqlite => {
            let sql: String =
                sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'destinations'")
                    .fetch_one(&mut *conn)
                    .await?;
            if admits_all(&sql) {
                return Ok(());
            }
            // The rebuild copies the columns named here: a table that has
            // others (a later migration) is refused rather than cut down.
            let columns: Vec<String> =
                sqlx::query_scalar("SELECT name FROM pragma_table_info('destinations')").fetch_all(&mut *conn).await?;
            if columns != DESTINATION_COLUMNS {
                return Err(sqlx::Error::Protocol(format!(
                    "the destinations table has the columns {columns:?}, not those its rebuild copies"
                )));
            }
            // The rebuild SQLite documents for changing a table's
            // constraints: foreign keys off (outside a transaction), copy,
            // swap, check, foreign keys on again.
            sqlx::raw_sql("PRAGMA foreign_keys = OFF").execute(&mut *conn).await?;
            let rebuilt = rebuild_destinations(&mut conn, &kinds).await;
            if rebuilt.is_err() {
                let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
            }
            let restored = sqlx::raw_sql("PRAGMA foreign_keys = ON").execute(&mut *conn).await;
            rebuilt?;
            restored?;
            Ok(())
        }
    }
}

/// The columns of `destinations`, in order.
const DESTINATION_COLUMNS: [&str; 9] = [
    "id",
    "workspace_id",
    "kind",
    "name",
    "configuration",
    "created_by",
    "created_at",
    "updated_at",
    "default_contract",
];

/// SQLite: `destinations` made anew with `kinds` admitted, in one
/// transaction that commits only when no foreign key is left dangling.
async fn rebuild_destinations(
    conn: &mut sqlx::pool::PoolConnection<sqlx::Any>,
    kinds: &str,
) -> Result<(), sqlx::Error> {
    let columns = DESTINATION_COLUMNS.join(", ");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN IMMEDIATE; \
         CREATE TABLE destinations_next ( \
             id TEXT PRIMARY KEY, \
             workspace_id TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE, \
             kind TEXT NOT NULL CHECK (kind IN ({kinds})), \
             name TEXT NOT NULL, \
             configuration TEXT NOT NULL, \
             created_by TEXT NOT NULL REFERENCES users(id), \
             created_at BIGINT NOT NULL, \
             updated_at BIGINT NOT NULL, \
             default_contract TEXT); \
         INSERT INTO destinations_next ({columns}) SELECT {columns} FROM destinations; \
         DROP TABLE destinations; \
         ALTER TABLE destinations_next RENAME TO destinations; \
         CREATE INDEX destinations_workspace ON destinations (workspace_id, id);"
    )))
    .execute(&mut **conn)
    .await?;
    let dangling = sqlx::raw_sql("PRAGMA foreign_key_check").fetch_all(&mut **conn).await?;
    if !dangling.is_empty() {
        return Err(sqlx::Error::Protocol(format!(
            "rebuilding destinations would leave {} foreign keys dangling",
            dangling.len()
        )));
    }
    sqlx::raw_sql("COMMIT").execute(&mut **conn).await?;
    Ok(())
}

/// A default contract as its column holds it.
fn contract_text(contract: Option<&StreamContract>) -> Option<String> {
    contract.map(|c| serde_json::to_string(c).unwrap_or_default())
}

fn destination_from_row(r: &sqlx::any::AnyRow) -> StoreResult<Destination> {
    let configuration: String = r.try_get("configuration")?;
    Ok(Destination {
        destination_id: r.try_get("id")?,
        workspace_id: r.try_get("workspace_id")?,
        kind: decode(r.try_get("kind")?, DestinationKind::parse, "kind")?,
        name: r.try_get("name")?,
        configuration: serde_json::from_str(&configuration).unwrap_or(Value::Null),
        default_contract: r
            .try_get::<Option<String>, _>("default_contract")?
            .map(|c| {
                serde_json::from_str(&c).map_err(|e| {
                    super::StoreError::Database(sqlx::Error::ColumnDecode {
                        index: "default_contract".to_owned(),
                        source: Box::new(e),
                    })
                })
            })
            .transpose()?,
        created_by: r.try_get("created_by")?,
        created_at: from_ms(r.try_get("created_at")?),
        updated_at: from_ms(r.try_get("updated_at")?),
    })
}

const DEST_COLUMNS: &str =
    "id, workspace_id, kind, name, configuration, default_contract, created_by, created_at, updated_at";

impl Store {
    pub async fn create_destination(
        &self,
        workspace_id: &str,
        kind: DestinationKind,
        name: &str,
        configuration: &Value,
        default_contract: Option<&StreamContract>,
        by: &str,
    ) -> StoreResult<Destination> {
        let id = new_id("dst");
        let now = now_ms();
        sqlx::query(
            "INSERT INTO destinations (id, workspace_id, kind, name, configuration, default_contract, created_by, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)",
        )
        .bind(&id)
        .bind(workspace_id)
        .bind(kind.as_str())
        .bind(name)
        .bind(configuration.to_string())
        .bind(contract_text(default_contract))
        .bind(by)
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(self.destination(workspace_id, &id).await?.expect("just inserted"))
    }

    pub(crate) async fn destination(&self, workspace_id: &str, id: &str) -> StoreResult<Option<Destination>> {
        let sql = format!("SELECT {DEST_COLUMNS} FROM destinations WHERE workspace_id = $1 AND id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(workspace_id).bind(id).fetch_optional(self.pool()).await?;
        row.as_ref().map(destination_from_row).transpose()
    }

    pub(crate) async fn destinations(
        &self,
        workspace_id: &str,
        after: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<Destination>> {
        let sql = format!(
            "SELECT {DEST_COLUMNS} FROM destinations WHERE workspace_id = $1 AND ($2 IS NULL OR id > $2) ORDER BY id LIMIT $3"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(workspace_id)
            .bind(after)
            .bind(limit)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(destination_from_row).collect()
    }

    /// Destinations of every workspace that keep files in the data
    /// directory (SQLite and JSON-lines).
    pub(crate) async fn file_destinations(&self) -> StoreResult<Vec<Destination>> {
        let sql = format!("SELECT {DEST_COLUMNS} FROM destinations WHERE kind IN ('sqlite', 'jsonl') ORDER BY id");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_all(self.pool()).await?;
        rows.iter().map(destination_from_row).collect()
    }

    pub(crate) async fn update_destination(
        &self,
        workspace_id: &str,
        id: &str,
        name: &str,
        configuration: &Value,
        default_contract: Option<&StreamContract>,
    ) -> StoreResult<Option<Destination>> {
        sqlx::query("UPDATE destinations SET name = $1, configuration = $2, default_contract = $3, updated_at = $4 WHERE workspace_id = $5 AND id = $6")
            .bind(name)
            .bind(configuration.to_string())
            .bind(contract_text(default_contract))
            .bind(now_ms())
            .bind(workspace_id)
            .bind(id)
            .execute(self.pool())
            .await?;
        self.destination(workspace_id, id).await
    }

    /// Deletes a destination no pipeline uses; the tables and files it
    /// wrote stay where they are.
    pub(crate) async fn delete_destination(
        &self,
        workspace_id: &str,
        id: &str,
    ) -> StoreResult<Result<(), DeleteRefused>> {
        self.delete_unless_used(
            "destinations",
            workspace_id,
            id,
            &[("pipelines", "destination_id"), ("retl_models", "warehouse_id")],
        )
        .await
    }

    /// Deletes a row of `table` unless a row of one of `users` (table,
    /// column) names it. The check and the delete run in one transaction,
    /// the row locked on PostgreSQL (a user's foreign key waits on that
    /// lock), so a pipeline or activation created meanwhile cannot be left
    /// pointing at nothing.
    pub(super) async fn delete_unless_used(
        &self,
        table: &'static str,
        workspace_id: &str,
        id: &str,
        users: &[(&'static str, &'static str)],
    ) -> StoreResult<Result<(), DeleteRefused>> {
        let mut tx = self.begin_write().await?;
        let lock = if self.backend() == super::Backend::Postgres { " FOR UPDATE" } else { "" };
        let exists = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT id FROM {table} WHERE workspace_id = $1 AND id = $2{lock}"
        )))
        .bind(workspace_id)
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        if exists.is_none() {
            return Ok(Err(DeleteRefused::NotFound));
        }
        for &(user, column) in users {
            let ids =
                sqlx::query(sqlx::AssertSqlSafe(format!("SELECT id FROM {user} WHERE {column} = $1 ORDER BY id")))
                    .bind(id)
                    .fetch_all(&mut *tx)
                    .await?
                    .iter()
                    .map(|r| r.try_get::<String, _>("id"))
                    .collect::<Result<Vec<_>, _>>()?;
            if !ids.is_empty() {
                return Ok(Err(DeleteRefused::InUse { table: user, ids }));
            }
        }
        sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table} WHERE workspace_id = $1 AND id = $2")))
            .bind(workspace_id)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Ok(()))
    }
}
