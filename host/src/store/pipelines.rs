//! Pipelines (their runtime records are connections): their streams,
//! schedules and saved stream state.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::Row;
use utoipa::ToSchema;

use super::jobs::Job;
use super::kinds::{ContractMode, ContractRule, EventType, PipelineStatus};
use super::webhooks::record_event;
use super::{ResultExt, Store, StoreResult, decode, from_ms, new_id, now_ms};

/// How one stream is synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StreamSyncMode {
    /// Replace the stream's table on every sync.
    FullRefreshOverwrite,
    /// Append what changed since the last sync.
    IncrementalAppend,
    /// Upsert what changed since the last sync by primary key: no duplicates.
    IncrementalDeduped,
}

/// A selected stream of a pipeline.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamSelection {
    pub name: String,
    pub sync_mode: StreamSyncMode,
    /// Cursor field for incremental modes (default: the stream's).
    #[serde(default)]
    pub cursor_field: Option<String>,
    /// Primary key for the deduplicated mode (default: the stream's).
    #[serde(default)]
    pub primary_key: Option<Vec<String>>,
    /// What to do with records that do not fit the stream's schema
    /// (default: none, every record is loaded as it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contract: Option<StreamContract>,
}

/// A stream's data contract: for each rule, what a record that breaks it
/// does. A rule left out evolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamContract {
    /// A field the stream's schema does not declare.
    #[serde(default = "evolve")]
    pub new_columns: ContractMode,
    /// A value of a type the schema does not allow for its field, or
    /// outside its enumeration (null fits every type).
    #[serde(default = "evolve")]
    pub type_changes: ContractMode,
    /// A record that is not a JSON object, or lacks (or has null) a field
    /// the schema requires or its primary key. `discard_value` does not
    /// apply.
    #[serde(default = "evolve")]
    pub invalid_records: ContractMode,
}

impl Default for StreamContract {
    fn default() -> Self {
        StreamContract { new_columns: evolve(), type_changes: evolve(), invalid_records: evolve() }
    }
}

fn evolve() -> ContractMode {
    ContractMode::Evolve
}

impl StreamContract {
    /// What breaking `rule` does.
    pub fn mode(&self, rule: ContractRule) -> ContractMode {
        match rule {
            ContractRule::NewColumns => self.new_columns,
            ContractRule::TypeChanges => self.type_changes,
            ContractRule::InvalidRecords => self.invalid_records,
        }
    }

    /// Whether any rule may keep a record aside.
    pub fn quarantines(&self) -> bool {
        ContractRule::ALL.iter().any(|r| self.mode(*r) == ContractMode::Quarantine)
    }
}

/// When a pipeline runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Schedule {
    /// Only when asked.
    Manual,
    /// Every `minutes` minutes.
    Interval { minutes: u32 },
    /// A cron expression, evaluated in UTC (e.g. `0 6 * * *`, or with
    /// seconds: `0 0 6 * * *`).
    Cron { expression: String },
}

/// The description says what the server accepts: one of three objects,
/// told apart by `kind`, each with exactly its own fields.
impl utoipa::PartialSchema for Schedule {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, OneOfBuilder, Type};
        let variant = |kind: &str, description: &str| {
            ObjectBuilder::new()
                .description(Some(description))
                .property("kind", ObjectBuilder::new().schema_type(Type::String).enum_values(Some([kind])))
                .required("kind")
                .additional_properties(Some(AdditionalProperties::FreeForm(false)))
        };
        let manual = variant("manual", "Only when asked.");
        let interval = variant("interval", "Every `minutes` minutes.")
            .property(
                "minutes",
                ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(1)).maximum(Some(525_600)),
            )
            .required("minutes");
        let cron = variant("cron", "A cron expression, evaluated in UTC (`0 6 * * *`, or with seconds `0 0 6 * * *`).")
            .property(
                "expression",
                ObjectBuilder::new().schema_type(Type::String).min_length(Some(9)).max_length(Some(200)),
            )
            .required("expression");
        OneOfBuilder::new().item(manual).item(interval).item(cron).description(Some("When a pipeline runs.")).into()
    }
}

impl utoipa::ToSchema for Schedule {}

impl Schedule {
    /// The next run after `now` (Unix ms), if the schedule has one.
    pub(crate) fn next_after(&self, now: i64) -> Result<Option<i64>, String> {
        match self {
            Schedule::Manual => Ok(None),
            Schedule::Interval { minutes } => Ok(Some(now + i64::from(*minutes) * 60_000)),
            Schedule::Cron { expression } => {
                let cron: croner::Cron = expression.parse().map_err(|e| format!("not a cron expression: {e}"))?;
                let start = chrono::DateTime::from_timestamp_millis(now).unwrap_or_default();
                let next = cron
                    .find_next_occurrence(&start, false)
                    .map_err(|e| format!("the cron expression never fires: {e}"))?;
                Ok(Some(next.timestamp_millis()))
            }
        }
    }
}

/// A pipeline (its runtime record is a connection: `pipeline_id` is also
/// the `connection_id`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Pipeline {
    pub pipeline_id: String,
    /// The same id, under the name the runtime uses.
    pub connection_id: String,
    pub workspace_id: String,
    pub name: String,
    pub source_id: String,
    pub destination_id: Option<String>,
    pub streams: Vec<StreamSelection>,
    pub schedule: Schedule,
    /// Increases whenever the schedule changes; a sync command may name the
    /// version it was issued against.
    pub schedule_version: i64,
    pub status: PipelineStatus,
    /// Minutes after which data not refreshed by a successful sync is
    /// stale (`pipeline.freshness_breached`); none when unset.
    pub freshness_minutes: Option<i64>,
    /// When the last sync or reset succeeded.
    pub last_succeeded_at: Option<DateTime<Utc>>,
    /// Since when the data is stale, while it is.
    pub freshness_breached_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

fn pipeline_from_row(r: &sqlx::any::AnyRow) -> StoreResult<Pipeline> {
    let id: String = r.try_get("id")?;
    let streams: String = r.try_get("streams")?;
    let schedule: String = r.try_get("schedule")?;
    Ok(Pipeline {
        connection_id: id.clone(),
        pipeline_id: id,
        workspace_id: r.try_get("workspace_id")?,
        name: r.try_get("name")?,
        source_id: r.try_get("source_id")?,
        destination_id: r.try_get("destination_id")?,
        streams: serde_json::from_str(&streams).unwrap_or_default(),
        schedule: serde_json::from_str(&schedule).unwrap_or(Schedule::Manual),
        schedule_version: r.try_get("schedule_version")?,
        status: decode(r.try_get("status")?, PipelineStatus::parse, "status")?,
        freshness_minutes: r.try_get("freshness_minutes")?,
        last_succeeded_at: r.try_get::<Option<i64>, _>("last_succeeded_at")?.map(from_ms),
        freshness_breached_at: r.try_get::<Option<i64>, _>("freshness_breached_at")?.map(from_ms),
        created_at: from_ms(r.try_get("created_at")?),
        updated_at: from_ms(r.try_get("updated_at")?),
    })
}

const PIPELINE_COLUMNS: &str = "id, workspace_id, name, source_id, destination_id, streams, schedule, schedule_version, status, freshness_minutes, last_succeeded_at, freshness_breached_at, created_at, updated_at";

impl Store {
    #[allow(clippy::too_many_arguments)]
    pub async fn create_pipeline(
        &self,
        workspace_id: &str,
        name: &str,
        source_id: &str,
        destination_id: &str,
        streams: &[StreamSelection],
        schedule: &Schedule,
        next_run_at: Option<i64>,
        freshness_minutes: Option<i64>,
    ) -> StoreResult<Pipeline> {
        let id = new_id("pl");
        let now = now_ms();
        sqlx::query(
            "INSERT INTO pipelines (id, workspace_id, name, source_id, destination_id, streams, schedule, schedule_version, status, created_at, updated_at, next_run_at, freshness_minutes) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, 1, 'active', $8, $8, $9, $10)",
        )
        .bind(&id)
        .bind(workspace_id)
        .bind(name)
        .bind(source_id)
        .bind(destination_id)
        .bind(serde_json::to_string(streams).unwrap_or_default())
        .bind(serde_json::to_string(schedule).unwrap_or_default())
        .bind(now)
        .bind(next_run_at)
        .bind(freshness_minutes)
        .execute(self.pool())
        .await
        .on_conflict("pipelines_references")?;
        Ok(self.pipeline(workspace_id, &id).await?.expect("just inserted"))
    }

    pub(crate) async fn pipeline(&self, workspace_id: &str, id: &str) -> StoreResult<Option<Pipeline>> {
        let sql = format!("SELECT {PIPELINE_COLUMNS} FROM pipelines WHERE workspace_id = $1 AND id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(workspace_id).bind(id).fetch_optional(self.pool()).await?;
        row.as_ref().map(pipeline_from_row).transpose()
    }

    pub(crate) async fn pipelines(
        &self,
        workspace_id: &str,
        after: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<Pipeline>> {
        let sql = format!(
            "SELECT {PIPELINE_COLUMNS} FROM pipelines WHERE workspace_id = $1 AND ($2 IS NULL OR id > $2) ORDER BY id LIMIT $3"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(workspace_id)
            .bind(after)
            .bind(limit)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(pipeline_from_row).collect()
    }

    /// Saves a pipeline's name, streams and schedule; the schedule version
    /// increases when the schedule changed.
    pub(crate) async fn update_pipeline(
        &self,
        p: &Pipeline,
        schedule_changed: bool,
        next_run_at: Option<i64>,
    ) -> StoreResult<Option<Pipeline>> {
        sqlx::query(
            "UPDATE pipelines SET name = $1, streams = $2, schedule = $3, schedule_version = schedule_version + $4, updated_at = $5, next_run_at = $6, \
             freshness_minutes = $9 WHERE workspace_id = $7 AND id = $8",
        )
        .bind(&p.name)
        .bind(serde_json::to_string(&p.streams).unwrap_or_default())
        .bind(serde_json::to_string(&p.schedule).unwrap_or_default())
        .bind(i64::from(schedule_changed))
        .bind(now_ms())
        .bind(next_run_at)
        .bind(&p.workspace_id)
        .bind(&p.pipeline_id)
        .bind(p.freshness_minutes)
        .execute(self.pool())
        .await?;
        self.pipeline(&p.workspace_id, &p.pipeline_id).await
    }

    pub(crate) async fn set_pipeline_status(
        &self,
        workspace_id: &str,
        id: &str,
        status: PipelineStatus,
    ) -> StoreResult<Option<Pipeline>> {
        sqlx::query("UPDATE pipelines SET status = $1, updated_at = $2 WHERE workspace_id = $3 AND id = $4")
            .bind(status.as_str())
            .bind(now_ms())
            .bind(workspace_id)
            .bind(id)
            .execute(self.pool())
            .await?;
        self.pipeline(workspace_id, id).await
    }

    /// Deletes a pipeline (connection), its state and its finished jobs;
    /// refused while a job is active.
    pub(crate) async fn delete_pipeline(&self, workspace_id: &str, id: &str) -> StoreResult<Result<(), Option<Job>>> {
        if let Some(active) = self.active_job(id).await? {
            return Ok(Err(Some(active)));
        }
        let n = sqlx::query("DELETE FROM pipelines WHERE workspace_id = $1 AND id = $2")
            .bind(workspace_id)
            .bind(id)
            .execute(self.pool())
            .await?
            .rows_affected();
        Ok(if n == 1 { Ok(()) } else { Err(None) })
    }

    pub(crate) async fn stream_state(&self, pipeline_id: &str, stream: &str) -> StoreResult<Option<String>> {
        let row = sqlx::query("SELECT state FROM pipeline_state WHERE pipeline_id = $1 AND stream = $2")
            .bind(pipeline_id)
            .bind(stream)
            .fetch_optional(self.pool())
            .await?;
        row.map(|r| Ok(r.try_get("state")?)).transpose()
    }

    pub(crate) async fn save_stream_state(&self, pipeline_id: &str, stream: &str, state: &str) -> StoreResult<()> {
        sqlx::query(SAVE_STREAM_STATE)
            .bind(pipeline_id)
            .bind(stream)
            .bind(state)
            .bind(now_ms())
            .execute(self.pool())
            .await?;
        Ok(())
    }

    pub(crate) async fn clear_stream_state(&self, pipeline_id: &str) -> StoreResult<()> {
        sqlx::query("DELETE FROM pipeline_state WHERE pipeline_id = $1").bind(pipeline_id).execute(self.pool()).await?;
        Ok(())
    }

    /// Active pipelines whose interval schedule is due.
    pub(crate) async fn due_pipelines(&self, now: i64) -> StoreResult<Vec<Pipeline>> {
        let sql = format!(
            "SELECT {PIPELINE_COLUMNS} FROM pipelines WHERE status = 'active' AND next_run_at IS NOT NULL AND next_run_at <= $1"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now).fetch_all(self.pool()).await?;
        rows.iter().map(pipeline_from_row).collect()
    }

    /// Takes the run of a pipeline that is due at `now`, moving its next
    /// run to `next_run_at`: true for the one server that moved it (the
    /// row's lock orders servers that try at once, and a later one finds
    /// the next run ahead), which then queues the run; false when another
    /// server took it, or the pipeline is no longer due (or was paused
    /// since it was found due).
    pub(crate) async fn take_due_run(
        &self,
        pipeline_id: &str,
        now: i64,
        next_run_at: Option<i64>,
    ) -> StoreResult<bool> {
        let taken = sqlx::query(
            "UPDATE pipelines SET next_run_at = $1 WHERE id = $2 AND status = 'active' \
             AND next_run_at IS NOT NULL AND next_run_at <= $3",
        )
        .bind(next_run_at)
        .bind(pipeline_id)
        .bind(now)
        .execute(self.pool())
        .await?
        .rows_affected();
        Ok(taken == 1)
    }

    /// Finds pipelines whose data went stale or fresh again and announces
    /// each change once, whichever server looks first: a pipeline is
    /// breached when its last successful sync (or, before one, its
    /// creation) is older than its freshness setting, and recovered when
    /// it no longer is (a sync succeeded, the setting changed or went, or
    /// the pipeline was paused). Returns how many changes it announced.
    pub(crate) async fn freshness_changes(&self, now: i64) -> StoreResult<usize> {
        let stale = "freshness_minutes IS NOT NULL AND status = 'active' \
                     AND COALESCE(last_succeeded_at, created_at) < $1 - freshness_minutes * 60000";
        // One read per tick, of the pipelines with a freshness setting
        // only (an index holds those): the ones whose state must change.
        let changing = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT id, freshness_breached_at FROM pipelines WHERE freshness_minutes IS NOT NULL \
             AND ((freshness_breached_at IS NULL AND {stale}) OR (freshness_breached_at IS NOT NULL AND NOT ({stale})))"
        )))
        .bind(now)
        .fetch_all(self.pool())
        .await?;
        let (mut breached, mut recovered) = (Vec::new(), Vec::new());
        for r in &changing {
            let id: String = r.try_get("id")?;
            match r.try_get::<Option<i64>, _>("freshness_breached_at")? {
                None => breached.push(id),
                Some(_) => recovered.push(id),
            }
        }
        let mut announced = 0;
        let mut queued = 0;
        for (ids, event, change) in [
            (
                breached,
                EventType::PipelineFreshnessBreached,
                format!("freshness_breached_at = $2 WHERE id = $3 AND freshness_breached_at IS NULL AND {stale}"),
            ),
            // `$2 = $2`: both statements take the same three parameters.
            (
                recovered,
                EventType::PipelineFreshnessRecovered,
                format!(
                    "freshness_breached_at = NULL WHERE id = $3 AND freshness_breached_at IS NOT NULL AND $2 = $2 AND NOT ({stale})"
                ),
            ),
        ] {
            for id in ids {
                let mut tx = self.begin_write().await?;
                let before =
                    sqlx::query(sqlx::AssertSqlSafe(format!("SELECT {PIPELINE_COLUMNS} FROM pipelines WHERE id = $1")))
                        .bind(&id)
                        .fetch_optional(&mut *tx)
                        .await?;
                let Some(before) = before.as_ref().map(pipeline_from_row).transpose()? else { continue };
                let n = sqlx::query(sqlx::AssertSqlSafe(format!("UPDATE pipelines SET {change}")))
                    .bind(now)
                    .bind(now)
                    .bind(&id)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if n == 1 {
                    let data = json!({
                        "pipeline_id": before.pipeline_id,
                        "name": before.name,
                        "freshness_minutes": before.freshness_minutes,
                        "last_succeeded_at": before.last_succeeded_at,
                        "breached_at": if event == EventType::PipelineFreshnessBreached { Some(from_ms(now)) } else { before.freshness_breached_at },
                    });
                    queued += record_event(&mut tx, self.outbox_bounds(), &before.workspace_id, event, data).await?;
                    announced += 1;
                }
                tx.commit().await?;
            }
        }
        if queued > 0 {
            self.outbox_written();
        }
        Ok(announced)
    }

    /// Pipelines as `/metrics` shows them: the `limit` whose data is
    /// oldest (never synced first), with how many pipelines there are.
    /// Read at most once per [`FRESHNESS_SNAPSHOT_AGE`] (scrapes in between
    /// share the last read, and concurrent ones wait for one), so a
    /// scraper cannot make every server read the whole table per request.
    pub(crate) async fn pipeline_freshness(&self, limit: i64) -> StoreResult<(Vec<PipelineFreshness>, i64)> {
        let mut snapshot = self.freshness_snapshot.lock().await;
        if let Some(s) = snapshot.as_ref().filter(|s| s.limit == limit && s.read_at.elapsed() < FRESHNESS_SNAPSHOT_AGE)
        {
            return Ok((s.listed.clone(), s.total));
        }
        let rows = sqlx::query(
            "SELECT id, workspace_id, last_succeeded_at, freshness_breached_at FROM pipelines \
             ORDER BY COALESCE(last_succeeded_at, 0), id LIMIT $1",
        )
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        let total: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM pipelines").fetch_one(self.pool()).await?;
        let listed = rows
            .iter()
            .map(|r| {
                Ok(PipelineFreshness {
                    pipeline_id: r.try_get("id")?,
                    workspace_id: r.try_get("workspace_id")?,
                    last_succeeded_at: r.try_get("last_succeeded_at")?,
                    breached: r.try_get::<Option<i64>, _>("freshness_breached_at")?.is_some(),
                })
            })
            .collect::<StoreResult<Vec<_>>>()?;
        *snapshot =
            Some(FreshnessSnapshot { limit, listed: listed.clone(), total, read_at: std::time::Instant::now() });
        Ok((listed, total))
    }
}

/// How long a read of the pipelines' freshness serves `/metrics`: a
/// scrape interval's worth. Ages are computed at each scrape from the
/// times read, so they keep counting between reads.
pub(crate) const FRESHNESS_SNAPSHOT_AGE: std::time::Duration = std::time::Duration::from_secs(15);

/// The last read of the pipelines' freshness.
pub(crate) struct FreshnessSnapshot {
    limit: i64,
    listed: Vec<PipelineFreshness>,
    total: i64,
    read_at: std::time::Instant,
}

/// A pipeline's freshness, for `/metrics`.
#[derive(Clone)]
pub(crate) struct PipelineFreshness {
    pub pipeline_id: String,
    pub workspace_id: String,
    /// Unix milliseconds of the last successful sync or reset.
    pub last_succeeded_at: Option<i64>,
    /// Whether its freshness setting is breached now.
    pub breached: bool,
}

/// Saves a stream's state: binds the pipeline, the stream, the state and
/// the time.
pub(super) const SAVE_STREAM_STATE: &str = "INSERT INTO pipeline_state (pipeline_id, stream, state, updated_at) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (pipeline_id, stream) DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at";

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::store::kinds::DestinationKind;
    use crate::store::testing::ControlDatabase;

    /// Two servers' schedulers find the same pipelines due at once: each
    /// due run goes to exactly one of them, however their attempts
    /// interleave, and a run taken is not due again until its next time.
    /// On both control databases.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_due_run_is_taken_by_one_server() {
        for db in ControlDatabase::each_kind().await {
            let (a, b) = (db.connect().await, db.connect().await);
            let ws = a.create_workspace("w").await.unwrap().workspace_id;
            let user = a.create_user("u@example.test", "u").await.unwrap().user_id;
            let source = a.create_source(&ws, "conn_events", "events", &json!({}), &user).await.unwrap();
            let destination = a
                .create_destination(&ws, DestinationKind::Jsonl, "f", &json!({ "directory": "out" }), None, &user)
                .await
                .unwrap();
            let streams = [StreamSelection {
                name: "events".into(),
                sync_mode: StreamSyncMode::FullRefreshOverwrite,
                cursor_field: None,
                primary_key: None,
                contract: None,
            }];
            let every_minute = Schedule::Interval { minutes: 1 };
            let due_at = now_ms() - 1;
            for i in 0..50 {
                let (source, destination) = (&source.source_id, &destination.destination_id);
                let name = format!("p{i}");
                a.create_pipeline(&ws, &name, source, destination, &streams, &every_minute, Some(due_at), None)
                    .await
                    .unwrap();
            }
            let now = now_ms();
            let (seen_a, seen_b) = (a.due_pipelines(now).await.unwrap(), b.due_pipelines(now).await.unwrap());
            assert_eq!((seen_a.len(), seen_b.len()), (50, 50), "both see every run due");
            let next = every_minute.next_after(now).unwrap();
            let take = |store: Store, seen: Vec<Pipeline>| {
                tokio::spawn(async move {
                    let mut taken = Vec::new();
                    for p in seen {
                        if store.take_due_run(&p.pipeline_id, now, next).await.unwrap() {
                            taken.push(p.pipeline_id);
                        }
                    }
                    taken
                })
            };
            let (by_a, by_b) = (take(a.clone(), seen_a), take(b.clone(), seen_b.into_iter().rev().collect()));
            let (by_a, by_b) = (by_a.await.unwrap(), by_b.await.unwrap());
            let mut all: Vec<&String> = by_a.iter().chain(&by_b).collect();
            all.sort();
            all.dedup();
            assert_eq!((by_a.len() + by_b.len(), all.len()), (50, 50), "{} and {}", by_a.len(), by_b.len());
            assert!(a.due_pipelines(now_ms()).await.unwrap().is_empty(), "not due again before its next time");
            a.close().await;
            b.close().await;
            db.drop().await;
        }
    }
}
