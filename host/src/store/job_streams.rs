//! The streams of a sync spread over servers (`job_streams`): the job's
//! runner makes a row per stream, and any runner of any server claims the
//! next one with a lease of its own (one conditional update, as jobs are
//! claimed), keeps it with heartbeats, shows the stream's progress in it
//! and ends it with the stream's ledger. A stream whose runner died is
//! taken over when its lease expires; one that failed transiently waits
//! its backoff and is read again alone.

use sqlx::Row;

use super::jobs::{BUSY_RUNNERS, JOB_COLUMNS, Job, job_from_row};
use super::kinds::StreamRunStatus;
use super::progress::{StreamLedger, StreamProgress};
use super::{Store, StoreResult, decode, now_ms};

/// One stream of a spread sync, as its row holds it.
#[derive(Debug, Clone)]
pub struct StreamRun {
    pub stream: String,
    pub status: StreamRunStatus,
    pub progress: Option<StreamProgress>,
    /// The ledger of its last attempt that ended (none when it read
    /// nothing).
    pub ledger: Option<StreamLedger>,
    /// The ledgers of the attempts before that one, oldest first.
    pub earlier_ledgers: Vec<StreamLedger>,
    pub error: Option<String>,
}

/// A stream a runner claimed: its job (as it is now) and which attempt of
/// the stream this is.
#[derive(Debug, Clone)]
pub struct StreamClaim {
    pub job: Job,
    pub stream: String,
    pub attempt: i64,
}

/// How a stream's attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEnd {
    Succeeded,
    /// Failed transiently: read again alone, not before the instant
    /// (Unix milliseconds).
    Retry {
        not_before: i64,
        error: String,
    },
    /// Failed for good.
    Failed(String),
    /// Stopped from outside (its job cancelled or taken over, its lease
    /// lost): free at once for whichever runner goes on, the attempt not
    /// counted.
    Stopped,
}

impl Store {
    /// Makes a row for each of `streams` (in their order) that the job has
    /// none for: a job taken over keeps what its streams did.
    pub(crate) async fn spread_streams(&self, job_id: &str, streams: &[String]) -> StoreResult<()> {
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        for (position, stream) in streams.iter().enumerate() {
            sqlx::query(
                "INSERT INTO job_streams (job_id, stream, position, status, attempts, not_before) \
                 VALUES ($1, $2, $3, 'queued', 0, $4) ON CONFLICT (job_id, stream) DO NOTHING",
            )
            .bind(job_id)
            .bind(stream)
            .bind(position as i64)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Claims a stream to read: queued and due, or running with an expired
    /// lease (its runner died), of a running job (`job_id`'s alone when
    /// given). Between workspaces as jobs are claimed: the stream of the
    /// workspace whose busy runners (on every server) are the smallest
    /// share of its claim weight, then the oldest job's first; none of a
    /// workspace that already has `per_workspace` busy (0: no cap). One
    /// conditional update, so two runners never hold the same stream.
    pub(crate) async fn claim_stream(
        &self,
        owner: &str,
        lease_ms: i64,
        job_id: Option<&str>,
        per_workspace: i64,
    ) -> StoreResult<Option<StreamClaim>> {
        let now = now_ms();
        let sql = format!(
            "SELECT s.job_id, s.stream FROM job_streams s JOIN jobs j ON j.id = s.job_id \
             JOIN workspaces w ON w.id = j.workspace_id LEFT JOIN {BUSY_RUNNERS} r ON r.workspace_id = j.workspace_id \
             WHERE j.status = 'running' AND ($2 IS NULL OR s.job_id = $2) \
               AND ((s.status = 'queued' AND s.not_before <= $1) OR (s.status = 'running' AND s.lease_expires_at < $1)) \
               AND ($3 = 0 OR COALESCE(r.busy, 0) < $3) \
             ORDER BY (COALESCE(r.busy, 0) + 1) * 1.0 / w.claim_weight, j.created_at, j.id, s.position LIMIT 1"
        );
        let candidate = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(now)
            .bind(job_id)
            .bind(per_workspace)
            .fetch_optional(self.pool())
            .await?;
        let Some(candidate) = candidate else { return Ok(None) };
        let (job_id, stream): (String, String) = (candidate.try_get("job_id")?, candidate.try_get("stream")?);
        let mut tx = self.begin_write().await?;
        let row = sqlx::query(
            "UPDATE job_streams SET status = 'running', lease_owner = $1, lease_expires_at = $2, runner = $1, \
             attempts = attempts + 1 WHERE job_id = $3 AND stream = $4 \
             AND ((status = 'queued' AND not_before <= $5) OR (status = 'running' AND lease_expires_at < $5)) \
             RETURNING attempts",
        )
        .bind(owner)
        .bind(now + lease_ms)
        .bind(&job_id)
        .bind(&stream)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let attempt: i64 = row.try_get("attempts")?;
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1 AND status = 'running'");
        let job = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(&job_id).fetch_optional(&mut *tx).await?;
        let Some(job) = job else { return Ok(None) };
        let job = job_from_row(&job)?;
        tx.commit().await?;
        Ok(Some(StreamClaim { job, stream, attempt }))
    }

    /// Extends a stream's lease; false when it is no longer this runner's
    /// (taken over) or its job no longer runs (cancelled, or ended).
    pub(crate) async fn stream_heartbeat(
        &self,
        job_id: &str,
        stream: &str,
        owner: &str,
        lease_ms: i64,
    ) -> StoreResult<bool> {
        let n = sqlx::query(
            "UPDATE job_streams SET lease_expires_at = $1 WHERE job_id = $2 AND stream = $3 AND lease_owner = $4 \
             AND status = 'running' AND EXISTS (SELECT 1 FROM jobs j WHERE j.id = $2 AND j.status = 'running')",
        )
        .bind(now_ms() + lease_ms)
        .bind(job_id)
        .bind(stream)
        .bind(owner)
        .execute(self.pool())
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    /// Saves a stream's progress while `owner` holds it.
    pub(crate) async fn stream_progress(
        &self,
        job_id: &str,
        stream: &str,
        owner: &str,
        progress: &StreamProgress,
    ) -> StoreResult<()> {
        sqlx::query("UPDATE job_streams SET progress = $1 WHERE job_id = $2 AND stream = $3 AND lease_owner = $4")
            .bind(serde_json::to_string(progress).unwrap_or_default())
            .bind(job_id)
            .bind(stream)
            .bind(owner)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Ends `owner`'s attempt of a stream, with its ledger (the one before
    /// joins the earlier ones); false when the stream was no longer its
    /// (taken over meanwhile).
    pub(crate) async fn end_stream_run(
        &self,
        job_id: &str,
        stream: &str,
        owner: &str,
        end: &StreamEnd,
        ledger: Option<&StreamLedger>,
    ) -> StoreResult<bool> {
        let (status, not_before, error, counted) = match end {
            StreamEnd::Succeeded => (StreamRunStatus::Succeeded, None, None, true),
            StreamEnd::Retry { not_before, error } => {
                (StreamRunStatus::Queued, Some(*not_before), Some(error.as_str()), true)
            }
            StreamEnd::Failed(error) => (StreamRunStatus::Failed, None, Some(error.as_str()), true),
            StreamEnd::Stopped => (StreamRunStatus::Queued, Some(now_ms()), None, false),
        };
        let mut tx = self.begin_write().await?;
        let held = sqlx::query(
            "SELECT ledger, earlier_ledgers FROM job_streams \
             WHERE job_id = $1 AND stream = $2 AND lease_owner = $3 AND status = 'running'",
        )
        .bind(job_id)
        .bind(stream)
        .bind(owner)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(held) = held else { return Ok(false) };
        let mut earlier: Vec<StreamLedger> =
            serde_json::from_str(&held.try_get::<String, _>("earlier_ledgers")?).unwrap_or_default();
        if let Some(last) = held.try_get::<Option<String>, _>("ledger")?.and_then(|l| serde_json::from_str(&l).ok()) {
            earlier.push(last);
        }
        sqlx::query(
            "UPDATE job_streams SET status = $1, not_before = COALESCE($2, not_before), error = $3, \
             ledger = $4, earlier_ledgers = $5, lease_owner = NULL, lease_expires_at = NULL, \
             attempts = attempts - $6 WHERE job_id = $7 AND stream = $8",
        )
        .bind(status.as_str())
        .bind(not_before)
        .bind(error)
        .bind(ledger.map(|l| serde_json::to_string(l).unwrap_or_default()))
        .bind(serde_json::to_string(&earlier).unwrap_or_else(|_| "[]".into()))
        .bind(i64::from(!counted))
        .bind(job_id)
        .bind(stream)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// The streams of a spread job, in the pipeline's order (none for a
    /// job that was not spread).
    pub(crate) async fn stream_runs(&self, job_id: &str) -> StoreResult<Vec<StreamRun>> {
        let rows = sqlx::query(
            "SELECT stream, status, progress, ledger, earlier_ledgers, error FROM job_streams \
             WHERE job_id = $1 ORDER BY position",
        )
        .bind(job_id)
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                let json =
                    |column: &str| -> StoreResult<Option<String>> { Ok(r.try_get::<Option<String>, _>(column)?) };
                Ok(StreamRun {
                    stream: r.try_get("stream")?,
                    status: decode(r.try_get("status")?, StreamRunStatus::parse, "status")?,
                    progress: json("progress")?.and_then(|p| serde_json::from_str(&p).ok()),
                    ledger: json("ledger")?.and_then(|l| serde_json::from_str(&l).ok()),
                    earlier_ledgers: json("earlier_ledgers")?
                        .and_then(|l| serde_json::from_str(&l).ok())
                        .unwrap_or_default(),
                    error: r.try_get("error")?,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing::{ControlDatabase, spread_job};

    const LEASE_MS: i64 = 60_000;

    /// Each stream goes to one runner at a time; a runner whose lease ran
    /// out loses its stream to the next and can then neither renew, show
    /// progress in nor end it; a stream put back waits out its backoff;
    /// a cancelled job's streams go to nobody. On both control databases.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stream_is_held_by_one_runner_and_taken_over_only_when_its_lease_ran_out() {
        for db in ControlDatabase::each_kind().await {
            let store = db.connect().await;
            let (ws, job) = spread_job(&store, &["s0", "s1", "s2"]).await;
            // A lease that has already run out: the runner died at once.
            let first = store.claim_stream("runner-dead", -1, None, 0).await.unwrap().unwrap();
            assert_eq!((first.stream.as_str(), first.attempt, first.job.job_id.as_str()), ("s0", 1, job.as_str()));
            let taken = store.claim_stream("runner-b", LEASE_MS, None, 0).await.unwrap().unwrap();
            assert_eq!((taken.stream.as_str(), taken.attempt), ("s0", 2), "taken over after its lease");
            let next = store.claim_stream("runner-c", LEASE_MS, Some(&job), 0).await.unwrap().unwrap();
            assert_eq!(next.stream, "s1");
            // The dead runner's hold is gone for good.
            assert!(!store.stream_heartbeat(&job, "s0", "runner-dead", LEASE_MS).await.unwrap());
            let shown = StreamProgress {
                records: 7,
                bytes: 70,
                records_read: 7,
                bytes_read: 70,
                records_per_second: 1.0,
                checkpointed_at: None,
                records_remaining: None,
                status: crate::store::progress::StreamStatus::Running,
            };
            store.stream_progress(&job, "s0", "runner-dead", &shown).await.unwrap();
            assert!(!store.end_stream_run(&job, "s0", "runner-dead", &StreamEnd::Succeeded, None).await.unwrap());
            // The holder renews, shows and ends it.
            assert!(store.stream_heartbeat(&job, "s0", "runner-b", LEASE_MS).await.unwrap());
            store.stream_progress(&job, "s0", "runner-b", &shown).await.unwrap();
            let ledger = StreamLedger::settle(7, 7, 0, 0, true);
            assert!(store.end_stream_run(&job, "s0", "runner-b", &StreamEnd::Succeeded, Some(&ledger)).await.unwrap());
            // s1 fails transiently: back, but not before its backoff.
            let later = StreamEnd::Retry { not_before: now_ms() + LEASE_MS, error: "503".into() };
            assert!(store.end_stream_run(&job, "s1", "runner-c", &later, None).await.unwrap());
            let s2 = store.claim_stream("runner-d", LEASE_MS, None, 0).await.unwrap().unwrap();
            assert_eq!(s2.stream, "s2");
            assert!(store.claim_stream("runner-e", LEASE_MS, None, 0).await.unwrap().is_none(), "s1 waits");
            // s2 fails once, having read 5 of which 3 were loaded: read
            // again, its first attempt's ledger kept among the earlier.
            let first_ledger = StreamLedger::settle(5, 3, 0, 0, false);
            let again = StreamEnd::Retry { not_before: now_ms() - 1, error: "503".into() };
            assert!(store.end_stream_run(&job, "s2", "runner-d", &again, Some(&first_ledger)).await.unwrap());
            let retried = store.claim_stream("runner-f", LEASE_MS, None, 0).await.unwrap().unwrap();
            assert_eq!((retried.stream.as_str(), retried.attempt), ("s2", 2));
            let runs = store.stream_runs(&job).await.unwrap();
            let seen: Vec<(&str, StreamRunStatus)> = runs.iter().map(|r| (r.stream.as_str(), r.status)).collect();
            assert_eq!(
                seen,
                [("s0", StreamRunStatus::Succeeded), ("s1", StreamRunStatus::Queued), ("s2", StreamRunStatus::Running)]
            );
            assert_eq!(runs[0].progress.as_ref().map(|p| p.records), Some(7));
            assert_eq!((runs[0].ledger.as_ref(), runs[0].earlier_ledgers.len()), (Some(&ledger), 0));
            assert_eq!(runs[1].error.as_deref(), Some("503"));
            // A cancelled job's streams: no renewal, no claim; the stopped
            // attempt is not counted, and what it read is kept.
            assert!(store.cancel_job(&ws, &job).await.unwrap());
            assert!(!store.stream_heartbeat(&job, "s2", "runner-f", LEASE_MS).await.unwrap());
            assert!(store.end_stream_run(&job, "s2", "runner-f", &StreamEnd::Stopped, None).await.unwrap());
            assert!(store.claim_stream("runner-e", LEASE_MS, None, 0).await.unwrap().is_none());
            let runs = store.stream_runs(&job).await.unwrap();
            assert_eq!((runs[2].ledger.as_ref(), &runs[2].earlier_ledgers[..]), (None, &[first_ledger][..]));
            let attempts: i64 =
                sqlx::query_scalar("SELECT attempts FROM job_streams WHERE job_id = $1 AND stream = 's2'")
                    .bind(&job)
                    .fetch_one(store.pool())
                    .await
                    .unwrap();
            assert_eq!(attempts, 1, "the stopped attempt is not counted");
            store.close().await;
            db.drop().await;
        }
    }

    /// The pipeline of a job.
    async fn pipeline_of(store: &Store, job: &str) -> String {
        sqlx::query_scalar("SELECT pipeline_id FROM jobs WHERE id = $1")
            .bind(job)
            .fetch_one(store.pool())
            .await
            .unwrap()
    }

    /// A helping runner takes no stream of a workspace whose runners
    /// already number its cap: the job's own runner counts, and so does
    /// every runner reading a stream for it but the job's own; and a job
    /// of the workspace is not claimed past the cap either.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn helpers_keep_to_the_workspaces_cap() {
        for db in ControlDatabase::each_kind().await {
            let store = db.connect().await;
            let (ws, job) = spread_job(&store, &["s0", "s1", "s2", "s3"]).await;
            assert!(store.claim_stream("runner-help", LEASE_MS, None, 1).await.unwrap().is_none(), "cap 1: the job");
            // The job's own runner reads one: it counts once.
            let own = store.claim_stream("runner-job", LEASE_MS, Some(&job), 0).await.unwrap().unwrap();
            assert_eq!(own.stream, "s0");
            let helped = store.claim_stream("runner-help", LEASE_MS, None, 2).await.unwrap().unwrap();
            assert_eq!(helped.stream, "s1");
            assert!(store.claim_stream("runner-more", LEASE_MS, None, 2).await.unwrap().is_none(), "cap 2 reached");
            // Job claims count the helper too: with a cap of 3 the
            // workspace's next job waits (the job, the helper and the one
            // just claimed), with 4 it goes.
            assert!(store.claim_stream("runner-more", LEASE_MS, None, 3).await.unwrap().is_some());
            let user = store.create_user("v@example.test", "v").await.unwrap().user_id;
            let source = store.create_source(&ws, "conn_events", "e2", &serde_json::json!({}), &user).await.unwrap();
            let first = store.pipeline(&ws, &pipeline_of(&store, &job).await).await.unwrap().unwrap();
            let destination = first.destination_id.unwrap();
            let manual = crate::store::pipelines::Schedule::Manual;
            let pipeline = store
                .create_pipeline(&ws, "p2", &source.source_id, &destination, &first.streams, &manual, None, None)
                .await
                .unwrap();
            let kinds = (crate::store::kinds::JobKind::Sync, crate::store::kinds::Trigger::Manual);
            store.create_job(&ws, &pipeline.pipeline_id, kinds.0, kinds.1).await.unwrap().unwrap();
            assert!(store.claim_job("runner-next", LEASE_MS, 3).await.unwrap().is_none(), "cap 3: job and 2 helpers");
            assert!(store.claim_job("runner-next", LEASE_MS, 4).await.unwrap().is_some());
            store.close().await;
            db.drop().await;
        }
    }
}
