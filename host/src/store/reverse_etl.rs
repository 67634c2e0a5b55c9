//! Reverse ETL: models, reverse-ETL destinations, activations, their runs
//! (jobs of kind `activation_run` or `activation_resync`) and each
//! activation's diff state.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::Row;
use utoipa::ToSchema;

use super::destinations::DeleteRefused;
use super::jobs::{JOB_COLUMNS, Job, JobFor, NotQueued, job_from_row};
use super::kinds::{ActivationMode, JobKind, RetlDestinationKind, Trigger};
use super::pipelines::Schedule;
use super::{ResultExt, Store, StoreResult, decode, from_ms, new_id, now_ms};

/// A model: one read-only query over a warehouse destination.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct Model {
    pub model_id: String,
    pub workspace_id: String,
    pub name: String,
    /// The SQLite or PostgreSQL destination of the workspace it reads.
    pub warehouse_id: String,
    /// One `SELECT` statement.
    pub query: String,
    /// The column that identifies a row.
    pub primary_key: String,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A reverse-ETL destination: a connector's writable object, or a webhook.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct RetlDestination {
    pub destination_id: String,
    pub workspace_id: String,
    pub name: String,
    pub kind: RetlDestinationKind,
    /// `connector`: `{connector_id, object, match_field, configuration}`;
    /// `webhook`: `{url, credential_handle?}`. Never a secret.
    pub configuration: Value,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Where one destination field's value comes from: a column of the
/// model, or a constant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FieldMapping {
    /// The destination field.
    #[schema(min_length = 1, max_length = 200)]
    pub field: String,
    /// The model column whose value it takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 200)]
    pub column: Option<String>,
    /// A constant it takes instead (any JSON value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
}

/// An activation: a model sent to a destination.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct Activation {
    pub activation_id: String,
    pub workspace_id: String,
    pub name: String,
    pub model_id: String,
    pub destination_id: String,
    pub mappings: Vec<FieldMapping>,
    pub mode: ActivationMode,
    pub schedule: Schedule,
    pub paused: bool,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// What an activation's diff state says about one model key.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct KeyState {
    /// The fingerprint of the mapped fields the destination last
    /// accepted; `None` if it never accepted this key.
    pub fingerprint: Option<i64>,
    /// Whether the last send of this key failed.
    pub failed: bool,
    /// Whether the run asking accepted it itself (in an earlier attempt).
    pub sent_by_this_run: bool,
}

/// One key's outcome, to be kept in the diff state.
#[derive(Debug, Clone)]
pub(crate) enum KeyOutcome {
    /// The destination accepted the row with this fingerprint, matched by
    /// this value of its matching field.
    Sent { key: String, fingerprint: i64, destination_key: Option<String> },
    /// The destination refused the row: it is sent again next run.
    Failed { key: String, reason: String },
    /// The destination removed the record (or the key is forgotten).
    Removed { key: String },
}

/// One key of a diff-state snapshot: its hash (the diff's own) and what
/// the state says of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SnapshotKey {
    pub key_hash: u128,
    /// The fingerprint last accepted; `None` if never accepted.
    pub fingerprint: Option<i64>,
    /// Whether its last send failed.
    pub failed: bool,
}

impl SnapshotKey {
    /// Packed: the hash, the fingerprint (little-endian) and the flags.
    const BYTES: usize = 25;

    fn pack(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.key_hash.to_le_bytes());
        out.extend_from_slice(&self.fingerprint.unwrap_or(0).to_le_bytes());
        out.push(u8::from(self.fingerprint.is_some()) | (u8::from(self.failed) << 1));
    }

    fn unpack(b: &[u8]) -> Option<SnapshotKey> {
        let key_hash = u128::from_le_bytes(b.get(..16)?.try_into().ok()?);
        let fingerprint = i64::from_le_bytes(b.get(16..24)?.try_into().ok()?);
        let flags = *b.get(24)?;
        Some(SnapshotKey { key_hash, fingerprint: (flags & 1 != 0).then_some(fingerprint), failed: flags & 2 != 0 })
    }
}

/// Keys per snapshot chunk (some 1.6 MB packed).
const SNAPSHOT_CHUNK_KEYS: usize = 65_536;

/// Whose diff state to forget: an activation's, or that of every
/// activation of a model or of a reverse-ETL destination.
#[derive(Debug, Clone, Copy)]
pub(crate) enum StateOf<'a> {
    Activation(&'a str),
    Model(&'a str),
    Destination(&'a str),
}

const MODEL_COLUMNS: &str =
    "id, workspace_id, name, warehouse_id, query, primary_key, created_by, created_at, updated_at";
const RDEST_COLUMNS: &str = "id, workspace_id, name, kind, configuration, created_by, created_at, updated_at";
const ACTIVATION_COLUMNS: &str = "id, workspace_id, name, model_id, destination_id, mappings, mode, schedule, paused, created_by, created_at, updated_at";

fn model_from_row(r: &sqlx::any::AnyRow) -> StoreResult<Model> {
    Ok(Model {
        model_id: r.try_get("id")?,
        workspace_id: r.try_get("workspace_id")?,
        name: r.try_get("name")?,
        warehouse_id: r.try_get("warehouse_id")?,
        query: r.try_get("query")?,
        primary_key: r.try_get("primary_key")?,
        created_by: r.try_get("created_by")?,
        created_at: from_ms(r.try_get("created_at")?),
        updated_at: from_ms(r.try_get("updated_at")?),
    })
}

fn rdest_from_row(r: &sqlx::any::AnyRow) -> StoreResult<RetlDestination> {
    let configuration: String = r.try_get("configuration")?;
    Ok(RetlDestination {
        destination_id: r.try_get("id")?,
        workspace_id: r.try_get("workspace_id")?,
        name: r.try_get("name")?,
        kind: decode(r.try_get("kind")?, RetlDestinationKind::parse, "kind")?,
        configuration: serde_json::from_str(&configuration).unwrap_or(Value::Null),
        created_by: r.try_get("created_by")?,
        created_at: from_ms(r.try_get("created_at")?),
        updated_at: from_ms(r.try_get("updated_at")?),
    })
}

fn activation_from_row(r: &sqlx::any::AnyRow) -> StoreResult<Activation> {
    let mappings: String = r.try_get("mappings")?;
    let schedule: String = r.try_get("schedule")?;
    Ok(Activation {
        activation_id: r.try_get("id")?,
        workspace_id: r.try_get("workspace_id")?,
        name: r.try_get("name")?,
        model_id: r.try_get("model_id")?,
        destination_id: r.try_get("destination_id")?,
        mappings: serde_json::from_str(&mappings).unwrap_or_default(),
        mode: decode(r.try_get("mode")?, ActivationMode::parse, "mode")?,
        schedule: serde_json::from_str(&schedule).unwrap_or(Schedule::Manual),
        paused: r.try_get::<i64, _>("paused")? != 0,
        created_by: r.try_get("created_by")?,
        created_at: from_ms(r.try_get("created_at")?),
        updated_at: from_ms(r.try_get("updated_at")?),
    })
}

/// State rows written per statement batch when a run commits outcomes.
const STATE_BATCH: usize = 500;

impl Store {
    pub(crate) async fn create_model(
        &self,
        workspace_id: &str,
        name: &str,
        warehouse_id: &str,
        query: &str,
        primary_key: &str,
        by: &str,
    ) -> StoreResult<Model> {
        let id = new_id("rm");
        let now = now_ms();
        sqlx::query(
            "INSERT INTO retl_models (id, workspace_id, name, warehouse_id, query, primary_key, created_by, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)",
        )
        .bind(&id)
        .bind(workspace_id)
        .bind(name)
        .bind(warehouse_id)
        .bind(query)
        .bind(primary_key)
        .bind(by)
        .bind(now)
        .execute(self.pool())
        .await
        .on_conflict("retl_models_warehouse")?;
        Ok(self.model(workspace_id, &id).await?.expect("just inserted"))
    }

    pub(crate) async fn model(&self, workspace_id: &str, id: &str) -> StoreResult<Option<Model>> {
        let sql = format!("SELECT {MODEL_COLUMNS} FROM retl_models WHERE workspace_id = $1 AND id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(workspace_id).bind(id).fetch_optional(self.pool()).await?;
        row.as_ref().map(model_from_row).transpose()
    }

    pub(crate) async fn models(&self, workspace_id: &str, after: Option<&str>, limit: i64) -> StoreResult<Vec<Model>> {
        let sql = format!(
            "SELECT {MODEL_COLUMNS} FROM retl_models WHERE workspace_id = $1 AND ($2 IS NULL OR id > $2) ORDER BY id LIMIT $3"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(workspace_id)
            .bind(after)
            .bind(limit)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(model_from_row).collect()
    }

    /// Saves a model's fields; with `forget`, the diff state of its
    /// activations goes too (its keys now name other rows).
    pub(crate) async fn update_model(&self, m: &Model, forget: bool) -> StoreResult<Option<Model>> {
        let mut tx = self.begin_write().await?;
        sqlx::query("UPDATE retl_models SET name = $1, warehouse_id = $2, query = $3, primary_key = $4, updated_at = $5 WHERE workspace_id = $6 AND id = $7")
            .bind(&m.name)
            .bind(&m.warehouse_id)
            .bind(&m.query)
            .bind(&m.primary_key)
            .bind(now_ms())
            .bind(&m.workspace_id)
            .bind(&m.model_id)
            .execute(&mut *tx)
            .await
            .on_conflict("retl_models_warehouse")?;
        if forget {
            forget_state(&mut tx, StateOf::Model(&m.model_id)).await?;
        }
        tx.commit().await?;
        self.model(&m.workspace_id, &m.model_id).await
    }

    /// Deletes a model no activation uses.
    pub(crate) async fn delete_model(&self, workspace_id: &str, id: &str) -> StoreResult<Result<(), DeleteRefused>> {
        self.delete_unless_used("retl_models", workspace_id, id, &[("retl_activations", "model_id")]).await
    }

    pub(crate) async fn create_retl_destination(
        &self,
        workspace_id: &str,
        name: &str,
        kind: RetlDestinationKind,
        configuration: &Value,
        by: &str,
    ) -> StoreResult<RetlDestination> {
        let id = new_id("rd");
        let now = now_ms();
        sqlx::query(
            "INSERT INTO retl_destinations (id, workspace_id, name, kind, configuration, created_by, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $7)",
        )
        .bind(&id)
        .bind(workspace_id)
        .bind(name)
        .bind(kind.as_str())
        .bind(configuration.to_string())
        .bind(by)
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(self.retl_destination(workspace_id, &id).await?.expect("just inserted"))
    }

    pub(crate) async fn retl_destination(&self, workspace_id: &str, id: &str) -> StoreResult<Option<RetlDestination>> {
        let sql = format!("SELECT {RDEST_COLUMNS} FROM retl_destinations WHERE workspace_id = $1 AND id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(workspace_id).bind(id).fetch_optional(self.pool()).await?;
        row.as_ref().map(rdest_from_row).transpose()
    }

    pub(crate) async fn retl_destinations(
        &self,
        workspace_id: &str,
        after: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<RetlDestination>> {
        let sql = format!(
            "SELECT {RDEST_COLUMNS} FROM retl_destinations WHERE workspace_id = $1 AND ($2 IS NULL OR id > $2) ORDER BY id LIMIT $3"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(workspace_id)
            .bind(after)
            .bind(limit)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(rdest_from_row).collect()
    }

    /// Saves a destination's fields; with `forget`, the diff state of its
    /// activations goes too (what they sent is now elsewhere).
    pub(crate) async fn update_retl_destination(
        &self,
        workspace_id: &str,
        id: &str,
        name: &str,
        configuration: &Value,
        forget: bool,
    ) -> StoreResult<Option<RetlDestination>> {
        let mut tx = self.begin_write().await?;
        sqlx::query("UPDATE retl_destinations SET name = $1, configuration = $2, updated_at = $3 WHERE workspace_id = $4 AND id = $5")
            .bind(name)
            .bind(configuration.to_string())
            .bind(now_ms())
            .bind(workspace_id)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        if forget {
            forget_state(&mut tx, StateOf::Destination(id)).await?;
        }
        tx.commit().await?;
        self.retl_destination(workspace_id, id).await
    }

    /// Deletes a reverse-ETL destination no activation uses.
    pub(crate) async fn delete_retl_destination(
        &self,
        workspace_id: &str,
        id: &str,
    ) -> StoreResult<Result<(), DeleteRefused>> {
        self.delete_unless_used("retl_destinations", workspace_id, id, &[("retl_activations", "destination_id")]).await
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn create_activation(
        &self,
        workspace_id: &str,
        name: &str,
        model_id: &str,
        destination_id: &str,
        mappings: &[FieldMapping],
        mode: ActivationMode,
        schedule: &Schedule,
        paused: bool,
        next_run_at: Option<i64>,
        by: &str,
    ) -> StoreResult<Activation> {
        let id = new_id("ra");
        let now = now_ms();
        sqlx::query(
            "INSERT INTO retl_activations (id, workspace_id, name, model_id, destination_id, mappings, mode, schedule, paused, next_run_at, created_by, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12)",
        )
        .bind(&id)
        .bind(workspace_id)
        .bind(name)
        .bind(model_id)
        .bind(destination_id)
        .bind(serde_json::to_string(mappings).unwrap_or_else(|_| "[]".into()))
        .bind(mode.as_str())
        .bind(serde_json::to_string(schedule).unwrap_or_default())
        .bind(i64::from(paused))
        .bind(next_run_at)
        .bind(by)
        .bind(now)
        .execute(self.pool())
        .await
        .on_conflict("retl_activations_references")?;
        Ok(self.activation(workspace_id, &id).await?.expect("just inserted"))
    }

    pub(crate) async fn activation(&self, workspace_id: &str, id: &str) -> StoreResult<Option<Activation>> {
        let sql = format!("SELECT {ACTIVATION_COLUMNS} FROM retl_activations WHERE workspace_id = $1 AND id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(workspace_id).bind(id).fetch_optional(self.pool()).await?;
        row.as_ref().map(activation_from_row).transpose()
    }

    pub(crate) async fn activations(
        &self,
        workspace_id: &str,
        after: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<Activation>> {
        let sql = format!(
            "SELECT {ACTIVATION_COLUMNS} FROM retl_activations WHERE workspace_id = $1 AND ($2 IS NULL OR id > $2) ORDER BY id LIMIT $3"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(workspace_id)
            .bind(after)
            .bind(limit)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(activation_from_row).collect()
    }

    /// Saves an activation's fields. A changed schedule sets its next run;
    /// with `forget`, its diff state goes (it reads another model or sends
    /// elsewhere now).
    pub(crate) async fn update_activation(
        &self,
        a: &Activation,
        next_run_at: Option<Option<i64>>,
        forget: bool,
    ) -> StoreResult<Option<Activation>> {
        let (set_next, next) = match next_run_at {
            Some(n) => (1i64, n),
            None => (0, None),
        };
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "UPDATE retl_activations SET name = $1, model_id = $2, destination_id = $3, mappings = $4, mode = $5, schedule = $6, paused = $7, \
             next_run_at = CASE WHEN $8 = 1 THEN $9 ELSE next_run_at END, updated_at = $10 WHERE workspace_id = $11 AND id = $12",
        )
        .bind(&a.name)
        .bind(&a.model_id)
        .bind(&a.destination_id)
        .bind(serde_json::to_string(&a.mappings).unwrap_or_else(|_| "[]".into()))
        .bind(a.mode.as_str())
        .bind(serde_json::to_string(&a.schedule).unwrap_or_default())
        .bind(i64::from(a.paused))
        .bind(set_next)
        .bind(next)
        .bind(now_ms())
        .bind(&a.workspace_id)
        .bind(&a.activation_id)
        .execute(&mut *tx)
        .await
        .on_conflict("retl_activations_references")?;
        if forget {
            forget_state(&mut tx, StateOf::Activation(&a.activation_id)).await?;
        }
        tx.commit().await?;
        self.activation(&a.workspace_id, &a.activation_id).await
    }

    /// Deletes an activation, its diff state and its finished runs;
    /// refused while a run is active. The activation is locked first on
    /// PostgreSQL (a run being queued holds a key-share lock on it), so
    /// the check sees every run queued before, and none is queued after.
    pub(crate) async fn delete_activation(&self, workspace_id: &str, id: &str) -> StoreResult<Result<(), Option<Job>>> {
        let mut tx = self.begin_write().await?;
        let lock = if self.backend() == super::Backend::Postgres { " FOR UPDATE" } else { "" };
        let exists = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT id FROM retl_activations WHERE workspace_id = $1 AND id = $2{lock}"
        )))
        .bind(workspace_id)
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        if exists.is_none() {
            return Ok(Err(None));
        }
        let sql =
            format!("SELECT {JOB_COLUMNS} FROM jobs WHERE activation_id = $1 AND status IN ('queued', 'running')");
        if let Some(active) = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id).fetch_optional(&mut *tx).await? {
            return Ok(Err(Some(job_from_row(&active)?)));
        }
        sqlx::query("DELETE FROM retl_activations WHERE workspace_id = $1 AND id = $2")
            .bind(workspace_id)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Ok(()))
    }

    /// Unpaused activations whose schedule is due.
    pub(crate) async fn due_activations(&self, now: i64) -> StoreResult<Vec<Activation>> {
        let sql = format!(
            "SELECT {ACTIVATION_COLUMNS} FROM retl_activations WHERE paused = 0 AND next_run_at IS NOT NULL AND next_run_at <= $1"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now).fetch_all(self.pool()).await?;
        rows.iter().map(activation_from_row).collect()
    }

    /// Takes the run of an activation that is due at `now`, as
    /// [`Store::take_due_run`] takes a pipeline's: true for the one server
    /// that moved its next run to `next_run_at`.
    pub(crate) async fn take_due_activation_run(
        &self,
        activation_id: &str,
        now: i64,
        next_run_at: Option<i64>,
    ) -> StoreResult<bool> {
        let taken = sqlx::query(
            "UPDATE retl_activations SET next_run_at = $1 WHERE id = $2 AND paused = 0 \
             AND next_run_at IS NOT NULL AND next_run_at <= $3",
        )
        .bind(next_run_at)
        .bind(activation_id)
        .bind(now)
        .execute(self.pool())
        .await?
        .rows_affected();
        Ok(taken == 1)
    }

    /// Queues a run unless one is active for the activation (see
    /// [`Store::queue_job`]).
    pub(crate) async fn create_run(
        &self,
        workspace_id: &str,
        activation_id: &str,
        kind: JobKind,
        trigger: Trigger,
    ) -> StoreResult<Result<Job, NotQueued>> {
        self.queue_job(workspace_id, JobFor::Activation(activation_id), kind, trigger).await
    }

    pub(crate) async fn active_run(&self, activation_id: &str) -> StoreResult<Option<Job>> {
        self.active_job_for(JobFor::Activation(activation_id)).await
    }

    /// A reverse-ETL run of the workspace.
    pub(crate) async fn run(&self, workspace_id: &str, run_id: &str) -> StoreResult<Option<Job>> {
        let sql =
            format!("SELECT {JOB_COLUMNS} FROM jobs WHERE workspace_id = $1 AND id = $2 AND activation_id IS NOT NULL");
        let row =
            sqlx::query(sqlx::AssertSqlSafe(sql)).bind(workspace_id).bind(run_id).fetch_optional(self.pool()).await?;
        row.as_ref().map(job_from_row).transpose()
    }

    /// Streams an activation's diff state into `each` (key, state),
    /// without holding it all twice. `run_id` is the run asking.
    pub(crate) async fn diff_state(
        &self,
        activation_id: &str,
        run_id: &str,
        mut each: impl FnMut(String, KeyState),
    ) -> StoreResult<()> {
        use futures_util::TryStreamExt;
        // Three narrow columns: a million keys stream in about a second.
        let mut rows = sqlx::query(
            "SELECT record_key, fingerprint, (CASE WHEN failure IS NULL THEN 0 ELSE 1 END) + (CASE WHEN sent_by = $2 THEN 2 ELSE 0 END) AS flags \
             FROM retl_state WHERE activation_id = $1",
        )
        .bind(activation_id)
        .bind(run_id)
        .fetch(self.pool());
        while let Some(r) = rows.try_next().await? {
            let flags: i64 = r.try_get(2)?;
            each(
                r.try_get(0)?,
                KeyState { fingerprint: r.try_get(1)?, failed: flags & 1 != 0, sent_by_this_run: flags & 2 != 0 },
            );
        }
        Ok(())
    }

    /// How many keys an activation's diff state holds (as its snapshot
    /// counts them while it is current).
    pub(crate) async fn diff_state_len(&self, activation_id: &str) -> StoreResult<u64> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COALESCE((SELECT s.keys FROM retl_state_snapshots s JOIN retl_activations a \
             ON a.id = s.activation_id AND a.state_version = s.version WHERE s.activation_id = $1 AND s.chunk = 0), \
             (SELECT COUNT(*) FROM retl_state WHERE activation_id = $1))",
        )
        .bind(activation_id)
        .fetch_one(self.pool())
        .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// The version of an activation's diff state: it moves with every
    /// write to it (see [`Store::record_outcomes`]).
    pub(crate) async fn diff_state_version(&self, activation_id: &str) -> StoreResult<i64> {
        let v: Option<i64> = sqlx::query_scalar("SELECT state_version FROM retl_activations WHERE id = $1")
            .bind(activation_id)
            .fetch_optional(self.pool())
            .await?;
        Ok(v.unwrap_or(0))
    }

    /// Streams the snapshot of an activation's diff state taken at
    /// `version` into `each`, if the activation is still at that version
    /// and the snapshot is whole. `false`: there is none to use (nothing
    /// or only part of one was handed over), and the state is read with
    /// [`Store::diff_state`].
    pub(crate) async fn diff_snapshot(
        &self,
        activation_id: &str,
        version: i64,
        mut each: impl FnMut(SnapshotKey),
    ) -> StoreResult<bool> {
        use base64::Engine as _;
        // Chunk by chunk: a stream of them would buffer most of the
        // snapshot's text at once.
        let (mut expected, mut seen) = (None, 0u64);
        let mut packed = Vec::with_capacity(SNAPSHOT_CHUNK_KEYS * SnapshotKey::BYTES);
        for chunk in 0i64.. {
            let row = sqlx::query(
                "SELECT s.keys, s.entries FROM retl_state_snapshots s JOIN retl_activations a \
                 ON a.id = s.activation_id AND a.state_version = s.version \
                 WHERE s.activation_id = $1 AND s.version = $2 AND s.chunk = $3",
            )
            .bind(activation_id)
            .bind(version)
            .bind(chunk)
            .fetch_optional(self.pool())
            .await?;
            let Some(r) = row else { break };
            let keys: i64 = r.try_get(0)?;
            let text: String = r.try_get(1)?;
            drop(r);
            packed.clear();
            if *expected.get_or_insert(keys) != keys
                || base64::engine::general_purpose::STANDARD.decode_vec(text.as_bytes(), &mut packed).is_err()
                || packed.len() % SnapshotKey::BYTES != 0
            {
                return Ok(false);
            }
            drop(text);
            for entry in packed.chunks_exact(SnapshotKey::BYTES) {
                let Some(key) = SnapshotKey::unpack(entry) else { return Ok(false) };
                each(key);
                seen += 1;
            }
        }
        Ok(expected.is_some_and(|keys| u64::try_from(keys).ok() == Some(seen)))
    }

    /// Keeps `keys` (`count` of them) as the snapshot of an activation's
    /// diff state, replacing the one before, if the state is still at
    /// `version`; `false` if it moved (another writer's outcomes would be
    /// missing from it), and then nothing is kept.
    pub(crate) async fn keep_diff_snapshot(
        &self,
        activation_id: &str,
        version: i64,
        count: u64,
        keys: impl Iterator<Item = SnapshotKey>,
    ) -> StoreResult<bool> {
        use base64::Engine as _;
        let mut tx = self.begin_write().await?;
        // Locks the activation's row until the commit: a batch of
        // outcomes committed meanwhile waits, then moves the version.
        let current = sqlx::query(
            "UPDATE retl_activations SET state_version = state_version WHERE id = $1 AND state_version = $2",
        )
        .bind(activation_id)
        .bind(version)
        .execute(&mut *tx)
        .await?;
        if current.rows_affected() != 1 {
            return Ok(false);
        }
        sqlx::query("DELETE FROM retl_state_snapshots WHERE activation_id = $1")
            .bind(activation_id)
            .execute(&mut *tx)
            .await?;
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        let mut packed = Vec::with_capacity(SNAPSHOT_CHUNK_KEYS * SnapshotKey::BYTES);
        let mut keys = keys.peekable();
        let mut chunk = 0i64;
        while chunk == 0 || keys.peek().is_some() {
            packed.clear();
            for key in keys.by_ref().take(SNAPSHOT_CHUNK_KEYS) {
                key.pack(&mut packed);
            }
            sqlx::query(
                "INSERT INTO retl_state_snapshots (activation_id, chunk, version, keys, entries) VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(activation_id)
            .bind(chunk)
            .bind(version)
            .bind(count)
            .bind(base64::engine::general_purpose::STANDARD.encode(&packed))
            .execute(&mut *tx)
            .await?;
            chunk += 1;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Streams an activation's keys into `each` with the matching value the
    /// destination accepted them under (`None`: never accepted).
    pub(crate) async fn sent_keys(
        &self,
        activation_id: &str,
        mut each: impl FnMut(String, Option<String>),
    ) -> StoreResult<()> {
        use futures_util::TryStreamExt;
        let mut rows = sqlx::query("SELECT record_key, CASE WHEN fingerprint IS NULL THEN NULL ELSE destination_key END FROM retl_state WHERE activation_id = $1")
            .bind(activation_id)
            .fetch(self.pool());
        while let Some(r) = rows.try_next().await? {
            each(r.try_get(0)?, r.try_get(1)?);
        }
        Ok(())
    }

    /// Keeps the outcomes of one batch of run `run_id`, a few hundred keys
    /// per statement, each group in one transaction that moves the state's
    /// version. Returns how many versions it moved.
    pub(crate) async fn record_outcomes(
        &self,
        activation_id: &str,
        run_id: &str,
        outcomes: &[KeyOutcome],
    ) -> StoreResult<i64> {
        let mut moved = 0;
        for chunk in outcomes.chunks(STATE_BATCH) {
            let mut tx = self.begin_write().await?;
            sqlx::query("UPDATE retl_activations SET state_version = state_version + 1 WHERE id = $1")
                .bind(activation_id)
                .execute(&mut *tx)
                .await?;
            moved += 1;
            let sent: Vec<_> = chunk
                .iter()
                .filter_map(|o| {
                    if let KeyOutcome::Sent { key, fingerprint, destination_key } = o {
                        Some((key, *fingerprint, destination_key))
                    } else {
                        None
                    }
                })
                .collect();
            if !sent.is_empty() {
                let sql = format!(
                    "INSERT INTO retl_state (activation_id, sent_by, record_key, fingerprint, destination_key, failure) VALUES {} \
                     ON CONFLICT (activation_id, record_key) DO UPDATE SET fingerprint = excluded.fingerprint, destination_key = excluded.destination_key, \
                     sent_by = excluded.sent_by, failure = NULL",
                    values(sent.len(), 3, "$1, $2", "NULL")
                );
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(activation_id).bind(run_id);
                for (key, fingerprint, destination_key) in sent {
                    q = q.bind(key.as_str()).bind(fingerprint).bind(destination_key.as_deref());
                }
                q.execute(&mut *tx).await?;
            }
            let failed: Vec<_> = chunk
                .iter()
                .filter_map(|o| if let KeyOutcome::Failed { key, reason } = o { Some((key, reason)) } else { None })
                .collect();
            if !failed.is_empty() {
                let sql = format!(
                    "INSERT INTO retl_state (activation_id, record_key, failure) VALUES {} \
                     ON CONFLICT (activation_id, record_key) DO UPDATE SET failure = excluded.failure",
                    values(failed.len(), 2, "$1", "")
                );
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(activation_id);
                for (key, reason) in failed {
                    q = q.bind(key.as_str()).bind(reason.as_str());
                }
                q.execute(&mut *tx).await?;
            }
            let removed: Vec<&String> = chunk
                .iter()
                .filter_map(|o| if let KeyOutcome::Removed { key } = o { Some(key) } else { None })
                .collect();
            if !removed.is_empty() {
                let list = (0..removed.len()).map(|i| format!("${}", i + 2)).collect::<Vec<_>>().join(", ");
                let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DELETE FROM retl_state WHERE activation_id = $1 AND record_key IN ({list})"
                )))
                .bind(activation_id);
                for key in removed {
                    q = q.bind(key.as_str());
                }
                q.execute(&mut *tx).await?;
            }
            tx.commit().await?;
        }
        Ok(moved)
    }
}

/// `rows` groups of placeholders for a multi-row `VALUES`: each group is
/// `(lead, $n.. ($per of them), tail)`, numbered after the lead's.
fn values(rows: usize, per: usize, lead: &str, tail: &str) -> String {
    let first = lead.matches('$').count() + 1;
    (0..rows)
        .map(|r| {
            let own = (0..per).map(|i| format!("${}", first + r * per + i)).collect::<Vec<_>>().join(", ");
            let tail = if tail.is_empty() { String::new() } else { format!(", {tail}") };
            format!("({lead}, {own}{tail})")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Forgets a diff state inside `tx`: its activations send every row
/// again next run. Their versions move and their snapshots go.
async fn forget_state(tx: &mut sqlx::Transaction<'_, sqlx::Any>, of: StateOf<'_>) -> StoreResult<()> {
    let (which, id) = match of {
        StateOf::Activation(id) => ("= $1", id),
        StateOf::Model(id) => ("IN (SELECT id FROM retl_activations WHERE model_id = $1)", id),
        StateOf::Destination(id) => ("IN (SELECT id FROM retl_activations WHERE destination_id = $1)", id),
    };
    for sql in [
        format!("DELETE FROM retl_state WHERE activation_id {which}"),
        format!("DELETE FROM retl_state_snapshots WHERE activation_id {which}"),
        format!("UPDATE retl_activations SET state_version = state_version + 1 WHERE id {which}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id).execute(&mut **tx).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_key_packs_into_25_bytes_and_back() {
        let keys = [
            SnapshotKey { key_hash: u128::MAX - 7, fingerprint: Some(-42), failed: false },
            SnapshotKey { key_hash: 1, fingerprint: None, failed: true },
            SnapshotKey { key_hash: 0, fingerprint: Some(0), failed: true },
        ];
        let mut packed = Vec::new();
        for k in &keys {
            k.pack(&mut packed);
        }
        assert_eq!(packed.len(), keys.len() * SnapshotKey::BYTES);
        let back: Vec<SnapshotKey> =
            packed.chunks_exact(SnapshotKey::BYTES).map(|b| SnapshotKey::unpack(b).unwrap()).collect();
        assert_eq!(back, keys);
        assert_eq!(SnapshotKey::unpack(&packed[..24]), None, "a short entry is refused");
    }
}
