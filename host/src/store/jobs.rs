//! Jobs: queued with at most one active per pipeline or activation,
//! claimed with leases, kept alive by heartbeats, retried, cancelled, and
//! their attempts and progress.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::Row;
use utoipa::ToSchema;

use super::kinds::{EventType, JobKind, JobStatus, Trigger};
use super::progress::JobProgress;
use super::webhooks::record_event;
use super::{Store, StoreResult, decode, from_ms, new_id, now_ms};

/// One attempt of a job.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct JobAttempt {
    /// 1 for the first attempt.
    pub attempt: i64,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// `succeeded`, `failed`, `retrying` (failed, another attempt follows),
    /// `cancelled`, `abandoned` (its runner stopped), or null while running.
    pub outcome: Option<String>,
    /// The sanitised error of an attempt that did not succeed.
    pub error: Option<String>,
}

/// What a job belongs to: a pipeline (syncs, resets and replays) or a reverse-ETL
/// activation (its runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobOwner {
    Pipeline,
    Activation,
}

/// Which jobs `GET /jobs` lists.
#[derive(Debug, Default, Clone)]
pub(crate) struct JobFilter {
    pub pipeline_id: Option<String>,
    pub activation_id: Option<String>,
    pub status: Option<JobStatus>,
    pub kind: Option<JobKind>,
    /// Created at or after (Unix ms).
    pub created_after: Option<i64>,
    /// Created before (Unix ms).
    pub created_before: Option<i64>,
}

/// A job's record.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Job {
    pub job_id: String,
    pub workspace_id: String,
    /// The pipeline of a sync or reset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipeline_id: Option<String>,
    /// The reverse-ETL activation of a run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activation_id: Option<String>,
    pub kind: JobKind,
    pub status: JobStatus,
    pub trigger: Trigger,
    pub attempts: i64,
    /// What it has done so far: per stream for a sync, per verdict for a
    /// reverse-ETL run, `{}` before it starts.
    pub progress: JobProgress,
    /// Sanitised reason of a failure.
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The plugin version the job runs, recorded when it first starts: it
    /// keeps it to its end, retries included, whatever becomes current.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin: Option<JobPlugin>,
    /// What its plugin invocations cost so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// What a job's plugin invocations cost, over all its attempts (an
/// attempt whose server died is not counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize, ToSchema)]
pub struct Usage {
    /// Guest CPU time, counted in 5 ms epoch ticks.
    pub guest_cpu_ms: u64,
    /// The most linear memory one invocation held.
    pub peak_memory_bytes: u64,
    /// Requests made through the egress.
    pub requests: u64,
    /// Request bodies sent.
    pub bytes_sent: u64,
    /// Response bodies received.
    pub bytes_received: u64,
    /// Host time spent on the plugin's requests (writes excluded).
    pub host_ms: u64,
}

impl Usage {
    /// Adds `other`: sums, and the larger peak.
    pub fn add(&mut self, other: &Usage) {
        self.guest_cpu_ms += other.guest_cpu_ms;
        self.peak_memory_bytes = self.peak_memory_bytes.max(other.peak_memory_bytes);
        self.requests += other.requests;
        self.bytes_sent += other.bytes_sent;
        self.bytes_received += other.bytes_received;
        self.host_ms += other.host_ms;
    }
}

/// A job attempt: the job and the runner holding its lease, or the lease
/// of one stream of a spread job. What an attempt commits to a destination
/// that checks it (the lakehouse) goes in only while the attempt still
/// holds its job (or stream).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobLease {
    pub job_id: String,
    pub owner: String,
    /// The stream whose lease it is, when the job is spread by stream.
    pub stream: Option<String>,
}

/// The component a job runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct JobPlugin {
    pub version: String,
    /// SHA-256 of the component.
    pub digest: String,
}

pub(super) fn job_from_row(r: &sqlx::any::AnyRow) -> StoreResult<Job> {
    let progress: String = r.try_get("progress")?;
    Ok(Job {
        job_id: r.try_get("id")?,
        workspace_id: r.try_get("workspace_id")?,
        pipeline_id: r.try_get("pipeline_id")?,
        activation_id: r.try_get("activation_id")?,
        kind: decode(r.try_get("kind")?, JobKind::parse, "kind")?,
        status: decode(r.try_get("status")?, JobStatus::parse, "status")?,
        trigger: decode(r.try_get("trigger_source")?, Trigger::parse, "trigger_source")?,
        attempts: r.try_get("attempts")?,
        progress: serde_json::from_str(&progress).unwrap_or_default(),
        error: r.try_get("error")?,
        created_at: from_ms(r.try_get("created_at")?),
        started_at: r.try_get::<Option<i64>, _>("started_at")?.map(from_ms),
        finished_at: r.try_get::<Option<i64>, _>("finished_at")?.map(from_ms),
        plugin: match (r.try_get("plugin_version")?, r.try_get("plugin_digest")?) {
            (Some(version), Some(digest)) => Some(JobPlugin { version, digest }),
            _ => None,
        },
        usage: r.try_get::<Option<String>, _>("usage")?.and_then(|u| serde_json::from_str(&u).ok()),
    })
}

/// Each workspace's busy runners on every server (`workspace_id`,
/// `busy`): its running jobs' runners, and the runners reading a stream of
/// one of its spread syncs other than the job's own (bind `$1` to now).
pub(super) const BUSY_RUNNERS: &str = "(SELECT workspace_id, COUNT(*) AS busy FROM (\
     SELECT workspace_id FROM jobs WHERE status = 'running' AND lease_expires_at >= $1 \
     UNION ALL \
     SELECT hj.workspace_id FROM job_streams h JOIN jobs hj ON hj.id = h.job_id \
     WHERE h.status = 'running' AND h.lease_expires_at >= $1 AND h.lease_owner <> hj.lease_owner\
   ) b GROUP BY workspace_id)";

pub(super) const JOB_COLUMNS: &str = "id, workspace_id, pipeline_id, activation_id, kind, status, trigger_source, attempts, progress, error, created_at, started_at, finished_at, plugin_version, plugin_digest, usage";

/// What a job runs for: at most one of its jobs is active at a time.
#[derive(Debug, Clone, Copy)]
pub(super) enum JobFor<'a> {
    Pipeline(&'a str),
    Activation(&'a str),
}

impl JobFor<'_> {
    /// Its column in `jobs`, its id and the prefix of its jobs' ids (one
    /// active per column value: `jobs_one_active_per_pipeline`,
    /// `jobs_one_active_per_activation`).
    fn parts(&self) -> (&'static str, &str, &'static str) {
        match self {
            JobFor::Pipeline(id) => ("pipeline_id", id, "job"),
            JobFor::Activation(id) => ("activation_id", id, "run"),
        }
    }
}

/// Why a job was not queued.
#[derive(Debug)]
pub enum NotQueued {
    /// Another job of its pipeline or activation is active (this one,
    /// unless it ended meanwhile).
    Active(Option<Box<Job>>),
    /// Its pipeline or activation was deleted meanwhile.
    Gone,
}

impl Store {
    /// Creates a queued job unless one is active for the pipeline: the
    /// partial unique index decides, so it holds across replicas.
    pub async fn create_job(
        &self,
        workspace_id: &str,
        pipeline_id: &str,
        kind: JobKind,
        trigger: Trigger,
    ) -> StoreResult<Result<Job, NotQueued>> {
        self.queue_job(workspace_id, JobFor::Pipeline(pipeline_id), kind, trigger).await
    }

    pub(crate) async fn active_job(&self, pipeline_id: &str) -> StoreResult<Option<Job>> {
        self.active_job_for(JobFor::Pipeline(pipeline_id)).await
    }

    /// Queues a job (a pipeline's sync or reset, an activation's run)
    /// unless one is active for the same pipeline or activation: a partial
    /// unique index decides, so it holds across replicas.
    pub(super) async fn queue_job(
        &self,
        workspace_id: &str,
        subject: JobFor<'_>,
        kind: JobKind,
        trigger: Trigger,
    ) -> StoreResult<Result<Job, NotQueued>> {
        let (column, owner, prefix) = subject.parts();
        let id = new_id(prefix);
        let now = now_ms();
        let sql = format!(
            "INSERT INTO jobs (id, workspace_id, {column}, kind, status, trigger_source, attempts, not_before, progress, created_at) \
             VALUES ($1, $2, $3, $4, 'queued', $5, 0, $6, '{{}}', $6)"
        );
        let inserted = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&id)
            .bind(workspace_id)
            .bind(owner)
            .bind(kind.as_str())
            .bind(trigger.as_str())
            .bind(now)
            .execute(self.pool())
            .await;
        match inserted {
            Ok(_) => Ok(Ok(self.job(workspace_id, &id).await?.expect("just inserted"))),
            Err(sqlx::Error::Database(db)) if db.is_foreign_key_violation() => Ok(Err(NotQueued::Gone)),
            // The only unique rule a new job can break is its index's.
            Err(sqlx::Error::Database(db)) if db.is_unique_violation() => {
                Ok(Err(NotQueued::Active(self.active_job_for(subject).await?.map(Box::new))))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The queued or running job of a pipeline or activation.
    pub(super) async fn active_job_for(&self, subject: JobFor<'_>) -> StoreResult<Option<Job>> {
        let (column, owner, ..) = subject.parts();
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE {column} = $1 AND status IN ('queued', 'running')");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(owner).fetch_optional(self.pool()).await?;
        row.as_ref().map(job_from_row).transpose()
    }

    pub async fn job(&self, workspace_id: &str, id: &str) -> StoreResult<Option<Job>> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE workspace_id = $1 AND id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(workspace_id).bind(id).fetch_optional(self.pool()).await?;
        row.as_ref().map(job_from_row).transpose()
    }

    /// Claims a runnable job: queued and due, or running with an expired
    /// lease (its runner died). Weighted fair between workspaces: the job
    /// of the workspace whose busy runners (on every server: its jobs'
    /// own, and those reading streams of its spread syncs) are the
    /// smallest share of its claim weight, the oldest among equals; none
    /// of a workspace that already has `per_workspace` busy (0: no such
    /// cap, so a lone workspace uses every runner). One conditional
    /// update, so two runners never hold the same job.
    pub async fn claim_job(&self, owner: &str, lease_ms: i64, per_workspace: i64) -> StoreResult<Option<Job>> {
        let now = now_ms();
        let sql = format!(
            "SELECT j.id FROM jobs j JOIN workspaces w ON w.id = j.workspace_id \
             LEFT JOIN {BUSY_RUNNERS} r ON r.workspace_id = j.workspace_id \
             WHERE ((j.status = 'queued' AND j.not_before <= $1) OR (j.status = 'running' AND j.lease_expires_at < $1)) \
               AND ($2 = 0 OR COALESCE(r.busy, 0) < $2) \
             ORDER BY (COALESCE(r.busy, 0) + 1) * 1.0 / w.claim_weight, j.created_at, j.id LIMIT 1"
        );
        let candidate =
            sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now).bind(per_workspace).fetch_optional(self.pool()).await?;
        let Some(candidate) = candidate else { return Ok(None) };
        let id: String = candidate.try_get("id")?;
        let mut tx = self.begin_write().await?;
        let n = sqlx::query(
            "UPDATE jobs SET status = 'running', lease_owner = $1, lease_expires_at = $2, attempts = attempts + 1, \
             started_at = COALESCE(started_at, $3) WHERE id = $4 AND ((status = 'queued' AND not_before <= $3) OR (status = 'running' AND lease_expires_at < $3))",
        )
        .bind(owner)
        .bind(now + lease_ms)
        .bind(now)
        .bind(&id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if n == 0 {
            return Ok(None);
        }
        let job = job_in(&mut tx, &id).await?;
        // An earlier attempt still open lost its runner (its lease ran out).
        sqlx::query("UPDATE job_attempts SET finished_at = $1, outcome = 'abandoned', error = 'the runner stopped renewing its lease' WHERE job_id = $2 AND finished_at IS NULL")
            .bind(now)
            .bind(&id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO job_attempts (job_id, attempt, runner, started_at) VALUES ($1, $2, $3, $4)")
            .bind(&id)
            .bind(job.attempts)
            .bind(owner)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        let queued = if job.attempts == 1 {
            announce(&mut tx, self.outbox_bounds(), &job, EventType::JobStarted).await?
        } else {
            0
        };
        tx.commit().await?;
        if queued > 0 {
            self.outbox_written();
        }
        Ok(Some(job))
    }

    /// Closes the open attempt of a job held by `owner`.
    pub(crate) async fn end_attempt(
        &self,
        job_id: &str,
        owner: &str,
        outcome: &str,
        error: Option<&str>,
    ) -> StoreResult<()> {
        let mut conn = self.pool().acquire().await?;
        end_attempt(&mut conn, job_id, owner, outcome, error).await
    }

    pub(crate) async fn job_attempts(&self, job_id: &str) -> StoreResult<Vec<JobAttempt>> {
        let rows = sqlx::query("SELECT attempt, started_at, finished_at, outcome, error FROM job_attempts WHERE job_id = $1 ORDER BY attempt")
            .bind(job_id)
            .fetch_all(self.pool())
            .await?;
        rows.iter()
            .map(|r| {
                Ok(JobAttempt {
                    attempt: r.try_get("attempt")?,
                    started_at: from_ms(r.try_get("started_at")?),
                    finished_at: r.try_get::<Option<i64>, _>("finished_at")?.map(from_ms),
                    outcome: r.try_get("outcome")?,
                    error: r.try_get("error")?,
                })
            })
            .collect()
    }

    /// Jobs of a workspace, newest first, filtered; `after` is the id of
    /// the last job of the previous page (an unknown one ends the list).
    pub(crate) async fn jobs(
        &self,
        workspace_id: &str,
        f: &JobFilter,
        after: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<Job>> {
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE workspace_id = $1 AND ($2 IS NULL OR pipeline_id = $2) AND ($3 IS NULL OR status = $3) \
             AND ($4 IS NULL OR kind = $4) AND ($5 IS NULL OR created_at >= $5) AND ($6 IS NULL OR created_at < $6) \
             AND ($7 IS NULL OR (created_at, id) < (SELECT p.created_at, p.id FROM jobs p WHERE p.id = $7 AND p.workspace_id = $1)) \
             AND ($9 IS NULL OR activation_id = $9) \
             ORDER BY created_at DESC, id DESC LIMIT $8"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(workspace_id)
            .bind(f.pipeline_id.as_deref())
            .bind(f.status.map(|s| s.as_str()))
            .bind(f.kind.map(|k| k.as_str()))
            .bind(f.created_after)
            .bind(f.created_before)
            .bind(after)
            .bind(limit)
            .bind(f.activation_id.as_deref())
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(job_from_row).collect()
    }

    /// The newest job of each of `ids` (pipelines or activations of the
    /// workspace, as `owner` says), by owner id: one query for a whole
    /// list page, each owner's newest found through its index.
    pub(crate) async fn last_jobs(
        &self,
        workspace_id: &str,
        owner: JobOwner,
        ids: &[String],
    ) -> StoreResult<std::collections::HashMap<String, Job>> {
        if ids.is_empty() {
            return Ok(Default::default());
        }
        let column = match owner {
            JobOwner::Pipeline => "pipeline_id",
            JobOwner::Activation => "activation_id",
        };
        let owners = (0..ids.len()).map(|i| format!("(${})", i + 2)).collect::<Vec<_>>().join(", ");
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE id IN (SELECT (SELECT j.id FROM jobs j WHERE j.{column} = o.column1 \
             AND j.workspace_id = $1 ORDER BY j.created_at DESC, j.id DESC LIMIT 1) FROM (VALUES {owners}) AS o)"
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(workspace_id);
        for id in ids {
            query = query.bind(id);
        }
        let mut out = std::collections::HashMap::with_capacity(ids.len());
        for row in query.fetch_all(self.pool()).await? {
            let job = job_from_row(&row)?;
            let key = match owner {
                JobOwner::Pipeline => job.pipeline_id.clone(),
                JobOwner::Activation => job.activation_id.clone(),
            };
            if let Some(key) = key {
                out.insert(key, job);
            }
        }
        Ok(out)
    }

    /// Extends a lease; false when the job is no longer this runner's
    /// (taken over, or cancelled).
    pub(crate) async fn heartbeat(&self, job_id: &str, owner: &str, lease_ms: i64) -> StoreResult<bool> {
        let n = sqlx::query(
            "UPDATE jobs SET lease_expires_at = $1 WHERE id = $2 AND lease_owner = $3 AND status = 'running'",
        )
        .bind(now_ms() + lease_ms)
        .bind(job_id)
        .bind(owner)
        .execute(self.pool())
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    /// Records the plugin version a job runs, the first time it runs; the
    /// version it keeps (an earlier attempt's record wins).
    pub(crate) async fn pin_job_plugin(&self, job_id: &str, plugin: &JobPlugin) -> StoreResult<JobPlugin> {
        sqlx::query("UPDATE jobs SET plugin_version = $1, plugin_digest = $2 WHERE id = $3 AND plugin_digest IS NULL")
            .bind(&plugin.version)
            .bind(&plugin.digest)
            .bind(job_id)
            .execute(self.pool())
            .await?;
        let row = sqlx::query("SELECT plugin_version, plugin_digest FROM jobs WHERE id = $1")
            .bind(job_id)
            .fetch_one(self.pool())
            .await?;
        Ok(JobPlugin { version: row.try_get("plugin_version")?, digest: row.try_get("plugin_digest")? })
    }

    /// Adds an attempt's usage to a job's (in one transaction: runners of
    /// a spread sync on several servers add theirs at once).
    pub(crate) async fn add_job_usage(&self, job_id: &str, spent: &Usage) -> StoreResult<()> {
        let mut tx = self.begin_write().await?;
        let sql = match self.backend() {
            super::Backend::Postgres => "SELECT usage FROM jobs WHERE id = $1 FOR UPDATE",
            // The write transaction holds the whole database already.
            super::Backend::Sqlite => "SELECT usage FROM jobs WHERE id = $1",
        };
        let row = sqlx::query(sql).bind(job_id).fetch_optional(&mut *tx).await?;
        let mut total: Usage = row
            .and_then(|r| r.try_get::<Option<String>, _>("usage").ok().flatten())
            .and_then(|u| serde_json::from_str(&u).ok())
            .unwrap_or_default();
        total.add(spent);
        sqlx::query("UPDATE jobs SET usage = $1 WHERE id = $2")
            .bind(serde_json::to_string(&total).unwrap_or_default())
            .bind(job_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    pub(crate) async fn job_progress(&self, job_id: &str, progress: &JobProgress) -> StoreResult<()> {
        sqlx::query("UPDATE jobs SET progress = $1 WHERE id = $2")
            .bind(serde_json::to_string(progress).unwrap_or_else(|_| "{}".into()))
            .bind(job_id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Ends a job held by `owner`, announcing how it ended.
    pub async fn finish_job(
        &self,
        job_id: &str,
        owner: &str,
        status: JobStatus,
        error: Option<&str>,
    ) -> StoreResult<()> {
        let mut tx = self.begin_write().await?;
        let n = sqlx::query("UPDATE jobs SET status = $1, error = $2, finished_at = $3, lease_owner = NULL, lease_expires_at = NULL WHERE id = $4 AND lease_owner = $5 AND status = 'running'")
            .bind(status.as_str())
            .bind(error)
            .bind(now_ms())
            .bind(job_id)
            .bind(owner)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        // A job cancelled meanwhile keeps the attempt as its cancellation closed it.
        if n == 0 {
            return Ok(());
        }
        end_attempt(&mut tx, job_id, owner, status.as_str(), error).await?;
        let job = job_in(&mut tx, job_id).await?;
        let runs = job.kind.is_activation_run();
        if status == JobStatus::Succeeded
            && let Some(pipeline_id) = &job.pipeline_id
        {
            // What freshness is measured from.
            sqlx::query("UPDATE pipelines SET last_succeeded_at = $1 WHERE id = $2")
                .bind(job.finished_at.map(|t| t.timestamp_millis()).unwrap_or_else(now_ms))
                .bind(pipeline_id)
                .execute(&mut *tx)
                .await?;
        }
        let event = match (status, runs) {
            (JobStatus::Succeeded, false) => Some(EventType::JobSucceeded),
            (JobStatus::Failed, false) => Some(EventType::JobFailed),
            (JobStatus::Succeeded, true) => Some(EventType::ActivationRunSucceeded),
            (JobStatus::Failed, true) => Some(EventType::ActivationRunFailed),
            _ => None,
        };
        let mut queued = 0;
        if let Some(event) = event {
            queued += announce(&mut tx, self.outbox_bounds(), &job, event).await?;
        }
        if let Some(sync) = job.progress.sync().filter(|_| !runs)
            && let Some(ledger) = &sync.ledger
        {
            let mut data = json!({
                "job_id": job.job_id,
                "pipeline_id": job.pipeline_id,
                "status": status.as_str(),
                "attempt": ledger.attempt,
                "balanced": ledger.balanced,
                "streams": ledger.streams,
            });
            if !sync.earlier_ledgers.is_empty() {
                data["earlier_ledgers"] = json!(sync.earlier_ledgers);
            }
            queued +=
                record_event(&mut tx, self.outbox_bounds(), &job.workspace_id, EventType::SyncLedger, data).await?;
        }
        if let Some(run) = job.progress.run().filter(|_| runs) {
            let (failed, invalid) = (run.counts.failed, run.counts.invalid);
            if failed + invalid > 0 {
                let data = json!({
                    "job_id": job.job_id,
                    "activation_id": job.activation_id,
                    "failed": failed,
                    "invalid": invalid,
                    "failed_samples": run.failed_samples,
                    "invalid_samples": run.invalid_samples,
                });
                queued += record_event(&mut tx, self.outbox_bounds(), &job.workspace_id, EventType::RowsRejected, data)
                    .await?;
            }
        }
        tx.commit().await?;
        if queued > 0 {
            self.outbox_written();
        }
        Ok(())
    }

    /// Puts a job back in the queue after a transient failure.
    pub(crate) async fn retry_job(&self, job_id: &str, owner: &str, not_before: i64, error: &str) -> StoreResult<()> {
        let mut tx = self.begin_write().await?;
        let n = sqlx::query("UPDATE jobs SET status = 'queued', not_before = $1, error = $2, lease_owner = NULL, lease_expires_at = NULL WHERE id = $3 AND lease_owner = $4")
            .bind(not_before)
            .bind(error)
            .bind(job_id)
            .bind(owner)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if n == 1 {
            end_attempt(&mut tx, job_id, owner, "retrying", Some(error)).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Cancels a queued or running job, announcing it.
    pub(crate) async fn cancel_job(&self, workspace_id: &str, job_id: &str) -> StoreResult<bool> {
        let mut tx = self.begin_write().await?;
        let n = sqlx::query(
            "UPDATE jobs SET status = 'cancelled', finished_at = $1, lease_owner = NULL WHERE workspace_id = $2 AND id = $3 AND status IN ('queued', 'running')",
        )
        .bind(now_ms())
        .bind(workspace_id)
        .bind(job_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let mut queued = 0;
        if n == 1 {
            sqlx::query("UPDATE job_attempts SET finished_at = $1, outcome = 'cancelled' WHERE job_id = $2 AND finished_at IS NULL")
                .bind(now_ms())
                .bind(job_id)
                .execute(&mut *tx)
                .await?;
            let job = job_in(&mut tx, job_id).await?;
            queued = announce(&mut tx, self.outbox_bounds(), &job, EventType::JobCancelled).await?;
        }
        tx.commit().await?;
        if queued > 0 {
            self.outbox_written();
        }
        Ok(n == 1)
    }

    /// Whether a job is still this runner's to run.
    pub(crate) async fn job_status(&self, job_id: &str) -> StoreResult<Option<JobStatus>> {
        let row = sqlx::query("SELECT status FROM jobs WHERE id = $1").bind(job_id).fetch_optional(self.pool()).await?;
        row.map(|r| decode(r.try_get("status")?, JobStatus::parse, "status")).transpose()
    }
}

/// A job as the transaction on `conn` sees it.
async fn job_in(conn: &mut sqlx::AnyConnection, id: &str) -> StoreResult<Job> {
    let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1");
    let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id).fetch_one(&mut *conn).await?;
    job_from_row(&row)
}

/// Closes the open attempt of a job held by `owner`.
async fn end_attempt(
    conn: &mut sqlx::AnyConnection,
    job_id: &str,
    owner: &str,
    outcome: &str,
    error: Option<&str>,
) -> StoreResult<()> {
    sqlx::query("UPDATE job_attempts SET finished_at = $1, outcome = $2, error = $3 WHERE job_id = $4 AND runner = $5 AND finished_at IS NULL")
        .bind(now_ms())
        .bind(outcome)
        .bind(error)
        .bind(job_id)
        .bind(owner)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Writes the event of a job's change, its record as the data.
async fn announce(
    conn: &mut sqlx::AnyConnection,
    bounds: super::webhooks::OutboxBounds,
    job: &Job,
    event: EventType,
) -> StoreResult<usize> {
    let data = serde_json::to_value(job).unwrap_or(Value::Null);
    record_event(conn, bounds, &job.workspace_id, event, data).await
}
