//! Destination, pipeline and job operations.
//!
//! A sync command may carry the schedule version it was issued against
//! (`schedule_version` in the body, or `If-Match: "<version>"`); a proposal
//! records the version current when it was made. If the pipeline's schedule
//! changed since, the command is refused with 409 `EXECUTION_CONFLICT`, like
//! a sync that meets an active job, and no job is created.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::Executed;
use super::text::check_name;
use crate::access::WorkspaceAccess;
use crate::error::{ApiError, ApiResult};
use crate::http::middleware::AuditNote;
use crate::server::AppState;
use crate::store::pipelines::{ActiveJob, Job, Pipeline, Schedule, StreamSelection, StreamSyncMode};

/// Body of `POST /destinations`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateDestination {
    pub name: String,
    /// `sqlite`, `postgres` or `jsonl`.
    pub kind: String,
    /// `sqlite`: `{file}`; `postgres`: `{url, credential_handle?}` (no
    /// password in the URL); `jsonl`: `{directory}`.
    pub configuration: Value,
}

/// Body of `PATCH /destinations/{destination_id}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateDestination {
    #[serde(default)]
    #[schema(ignore)]
    pub destination_id: String,
    pub name: Option<String>,
    pub configuration: Option<Value>,
}

/// Body of `POST /pipelines`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePipeline {
    pub name: String,
    pub source_id: String,
    pub destination_id: String,
    /// Streams to sync and how.
    pub streams: Vec<StreamSelection>,
    #[serde(default = "manual")]
    pub schedule: Schedule,
}

fn manual() -> Schedule {
    Schedule::Manual
}

/// Body of `PATCH /pipelines/{pipeline_id}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdatePipeline {
    #[serde(default)]
    #[schema(ignore)]
    pub pipeline_id: String,
    pub name: Option<String>,
    pub streams: Option<Vec<StreamSelection>>,
    pub schedule: Option<Schedule>,
}

/// A sync or reset command.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunPipeline {
    pub pipeline_id: String,
    /// The schedule version the command was issued against.
    pub schedule_version: Option<i64>,
}

async fn check_destination(state: &AppState, access: &WorkspaceAccess, kind: &str, config: &Value) -> ApiResult<()> {
    super::text::check_config("configuration", config)?;
    let parsed = crate::destinations::validate(kind, config)?;
    if let crate::destinations::DestinationConfig::Postgres { credential_handle, target } = &parsed {
        if !state.config.plugins.warehouses.allows_name(&target.host) {
            return Err(ApiError::bad_request(
                "DESTINATION_HOST_NOT_ALLOWED",
                format!("{} is not a database host the operator allows; the operator lists them in SERVICE_WAREHOUSE_ALLOWED_HOSTS", target.host),
            )
            .with_details(json!({ "field": "configuration.url", "host": target.host })));
        }
        if let Some(h) = credential_handle {
            let cred = state.vault.handle_exists(&access.workspace_id, h).await?.ok_or_else(|| {
                ApiError::bad_request("UNKNOWN_CREDENTIAL_HANDLE", "credential_handle names no credential of this workspace").with_details(json!({ "field": "configuration.credential_handle" }))
            })?;
            if !cred.hosts.contains(&target.host) {
                return Err(ApiError::bad_request("CREDENTIAL_HOST_MISMATCH", "the credential is not bound to the database host"));
            }
        }
    }
    Ok(())
}

pub async fn create_destination(state: &AppState, access: &WorkspaceAccess, note: &AuditNote, req: CreateDestination) -> ApiResult<Executed> {
    check_name("name", &req.name)?;
    check_destination(state, access, &req.kind, &req.configuration).await?;
    let d = state.store.create_destination(&access.workspace_id, &req.kind, req.name.trim(), &req.configuration, &access.principal.user_id).await?;
    note.target("destination", &d.destination_id);
    Executed::created(d)
}

pub async fn update_destination(state: &AppState, access: &WorkspaceAccess, note: &AuditNote, req: UpdateDestination) -> ApiResult<Executed> {
    note.target("destination", &req.destination_id);
    let cur = state.store.destination(&access.workspace_id, &req.destination_id).await?.ok_or_else(|| ApiError::not_found("destination"))?;
    let name = req.name.unwrap_or(cur.name);
    check_name("name", &name)?;
    let config = req.configuration.unwrap_or(cur.configuration);
    check_destination(state, access, &cur.kind, &config).await?;
    let d = state.store.update_destination(&access.workspace_id, &req.destination_id, name.trim(), &config).await?.ok_or_else(|| ApiError::not_found("destination"))?;
    Executed::ok(d)
}

/// Validates stream selections against what the source offers.
async fn check_streams(state: &AppState, access: &WorkspaceAccess, source_id: &str, destination_kind: &str, streams: &[StreamSelection]) -> ApiResult<()> {
    if streams.is_empty() {
        return Err(ApiError::invalid_field("streams", "select at least one stream"));
    }
    let source = state.store.source(&access.workspace_id, source_id).await?.ok_or_else(|| ApiError::invalid_field("source_id", "no such source"))?;
    let plugin = state.plugins.available(&source.connector_id).await?;
    let catalog = state.plugins.runtime().discover(&plugin, &access.workspace_id, &state.egress, &source.configuration.to_string()).await?;
    for s in streams {
        let Some(offered) = catalog.iter().find(|c| c.name == s.name) else {
            return Err(ApiError::invalid_field("streams", format!("the source offers no stream {}", s.name)));
        };
        let incremental = s.sync_mode != StreamSyncMode::FullRefreshOverwrite;
        if incremental && !offered.sync_modes.contains(&crate::plugin::types::SyncMode::Incremental) {
            return Err(ApiError::invalid_field("streams", format!("stream {} cannot be read incrementally", s.name)));
        }
        if s.sync_mode == StreamSyncMode::IncrementalDeduped {
            if destination_kind == "jsonl" {
                return Err(ApiError::invalid_field("streams", "JSON-lines destinations cannot deduplicate; use incremental_append or full_refresh_overwrite"));
            }
            if s.primary_key.as_ref().unwrap_or(&offered.primary_key).is_empty() {
                return Err(ApiError::invalid_field("streams", format!("stream {} has no primary key to deduplicate by", s.name)));
            }
        }
    }
    Ok(())
}

fn next_run(schedule: &Schedule) -> Option<i64> {
    schedule.next_after(crate::store::now_ms()).ok().flatten()
}

fn check_schedule(s: &Schedule) -> ApiResult<()> {
    if let Schedule::Interval { minutes } = s
        && !(1..=525_600).contains(minutes)
    {
        return Err(ApiError::invalid_field("schedule.minutes", "minutes must be between 1 and 525600"));
    }
    if let Schedule::Cron { .. } = s {
        s.next_after(crate::store::now_ms()).map_err(|m| ApiError::invalid_field("schedule.expression", m))?;
    }
    Ok(())
}

pub async fn create_pipeline(state: &AppState, access: &WorkspaceAccess, note: &AuditNote, req: CreatePipeline) -> ApiResult<Executed> {
    check_name("name", &req.name)?;
    check_schedule(&req.schedule)?;
    let dest = state.store.destination(&access.workspace_id, &req.destination_id).await?.ok_or_else(|| ApiError::invalid_field("destination_id", "no such destination"))?;
    check_streams(state, access, &req.source_id, &dest.kind, &req.streams).await?;
    let p = state
        .store
        .create_pipeline(&access.workspace_id, req.name.trim(), &req.source_id, &req.destination_id, &req.streams, &req.schedule, next_run(&req.schedule))
        .await?;
    note.target("pipeline", &p.pipeline_id);
    Executed::created(p)
}

async fn pipeline(state: &AppState, access: &WorkspaceAccess, id: &str) -> ApiResult<Pipeline> {
    state.store.pipeline(&access.workspace_id, id).await?.ok_or_else(|| ApiError::not_found("pipeline"))
}

pub async fn update_pipeline(state: &AppState, access: &WorkspaceAccess, note: &AuditNote, req: UpdatePipeline) -> ApiResult<Executed> {
    note.target("pipeline", &req.pipeline_id);
    let mut p = pipeline(state, access, &req.pipeline_id).await?;
    if let Some(n) = req.name {
        check_name("name", &n)?;
        p.name = n.trim().to_owned();
    }
    if let Some(streams) = req.streams {
        let kind = match &p.destination_id {
            Some(d) => state.store.destination(&access.workspace_id, d).await?.map(|d| d.kind).unwrap_or_default(),
            None => String::new(),
        };
        check_streams(state, access, &p.source_id, &kind, &streams).await?;
        p.streams = streams;
    }
    let mut changed = false;
    if let Some(s) = req.schedule {
        check_schedule(&s)?;
        changed = s != p.schedule;
        p.schedule = s;
    }
    let next = next_run(&p.schedule);
    let p = state.store.update_pipeline(&p, changed, next).await?.ok_or_else(|| ApiError::not_found("pipeline"))?;
    Executed::ok(p)
}

pub async fn set_status(state: &AppState, access: &WorkspaceAccess, note: &AuditNote, id: &str, status: &str) -> ApiResult<Executed> {
    note.target("pipeline", id);
    pipeline(state, access, id).await?;
    let p = state.store.set_pipeline_status(&access.workspace_id, id, status).await?.ok_or_else(|| ApiError::not_found("pipeline"))?;
    Executed::ok(p)
}

pub async fn delete_connection(state: &AppState, access: &WorkspaceAccess, note: &AuditNote, id: &str) -> ApiResult<Executed> {
    note.target("connection", id);
    match state.store.delete_pipeline(&access.workspace_id, id).await? {
        Ok(()) => Executed::ok(json!({ "connection_id": id, "deleted": true })),
        Err(None) => Err(ApiError::not_found("connection")),
        Err(Some(active)) => Err(conflict("a job is active for this connection; cancel it or wait", Some(active), None)),
    }
}

/// The spec's 409 for syncs and resets.
fn conflict(message: &str, active: Option<Job>, schedule: Option<(i64, i64)>) -> ApiError {
    let mut details = json!({ "active_job": active });
    if let Some((given, current)) = schedule {
        details = json!({ "reason": "schedule_changed", "given_schedule_version": given, "current_schedule_version": current });
    }
    ApiError::conflict("EXECUTION_CONFLICT", message).with_details(details)
}

/// Starts a sync or reset job, unless one is active or the schedule moved.
pub async fn run(state: &AppState, access: &WorkspaceAccess, note: &AuditNote, req: RunPipeline, kind: &str, trigger: &str) -> ApiResult<Executed> {
    note.target("pipeline", &req.pipeline_id);
    let p = pipeline(state, access, &req.pipeline_id).await?;
    if let Some(v) = req.schedule_version
        && v != p.schedule_version
    {
        return Err(conflict(
            "the pipeline's schedule changed since this command was issued; refresh the pipeline before retrying",
            None,
            Some((v, p.schedule_version)),
        ));
    }
    let source = state.store.source(&access.workspace_id, &p.source_id).await?.ok_or_else(|| ApiError::not_found("source"))?;
    state.plugins.available(&source.connector_id).await?;
    match state.store.create_job(&access.workspace_id, &p.pipeline_id, kind, trigger).await? {
        Ok(job) => {
            state.jobs_queued.notify_one();
            note.target("job", &job.job_id);
            Executed::created(job)
        }
        Err(ActiveJob(active)) => Err(conflict(
            "a sync or reset is already active for this pipeline; refresh its status before retrying",
            active,
            None,
        )),
    }
}

pub async fn cancel_job(state: &AppState, access: &WorkspaceAccess, note: &AuditNote, job_id: &str) -> ApiResult<Executed> {
    note.target("job", job_id);
    let job = state.store.job(&access.workspace_id, job_id).await?.ok_or_else(|| ApiError::not_found("job"))?;
    if !state.store.cancel_job(&access.workspace_id, job_id).await? {
        return Err(ApiError::conflict("JOB_NOT_ACTIVE", format!("the job is already {}", job.status)));
    }
    let job = state.store.job(&access.workspace_id, job_id).await?.ok_or_else(|| ApiError::not_found("job"))?;
    Executed::ok(job)
}
