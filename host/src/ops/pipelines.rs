//! Pipeline operations: creating, changing, pausing, resuming and deleting
//! pipelines (their runtime records are connections), and the plan
//! `prepare` proposes from a source's catalog.

use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use super::act::{Act, Category, Ctx, Executed};
use super::text::check_name;
use crate::access::WorkspaceAccess;
use crate::error::{ApiError, ApiResult};
use crate::plugin::types::{Stream, SyncMode};
use crate::state::AppState;
use crate::store::kinds::{ContractMode, DestinationKind, PipelineStatus};
use crate::store::pipelines::{Pipeline, Schedule, StreamContract, StreamSelection, StreamSyncMode};

/// The sync mode a stream is best read in: deduplicated incremental when it
/// has a cursor and a primary key, appended incremental with a cursor
/// alone, and a full refresh otherwise.
pub(crate) fn suggested_mode(stream: &Stream) -> StreamSyncMode {
    match (stream.sync_modes.contains(&SyncMode::Incremental), stream.primary_key.is_empty()) {
        (true, false) => StreamSyncMode::IncrementalDeduped,
        (true, true) => StreamSyncMode::IncrementalAppend,
        (false, _) => StreamSyncMode::FullRefreshOverwrite,
    }
}

/// What `POST /pipelines/prepare` proposes for a source: its catalog, a
/// selection of every stream in its suggested mode, warnings, and the
/// connector's preview of the data when it offers one. Creates nothing; it
/// runs the connector with the workspace's credentials.
pub(crate) async fn plan(state: &AppState, access: &WorkspaceAccess, source_id: &str) -> ApiResult<serde_json::Value> {
    let source = state
        .store
        .source(&access.workspace_id, source_id)
        .await?
        .ok_or_else(|| ApiError::invalid_field("source_id", "no such source"))?;
    let connector = state.plugins.connector(&source.connector_id, &access.workspace_id).await?;
    let catalog =
        connector.discover_and_keep(&state.store, &source.source_id, &source.configuration.to_string()).await?;
    let suggested: Vec<serde_json::Value> =
        catalog.iter().map(|s| json!({ "name": s.name, "sync_mode": suggested_mode(s) })).collect();
    let mut warnings: Vec<serde_json::Value> = catalog
        .iter()
        .filter(|s| suggested_mode(s) == StreamSyncMode::FullRefreshOverwrite)
        .map(|s| json!({ "stream": s.name, "warning": "no incremental mode: every sync reads the whole stream" }))
        .collect();
    // A sample of the data, from connectors that offer one: what a user
    // looks at before choosing streams. Its failure is a warning, not the
    // plan's.
    let preview = if connector.plugin().info.operations.contains(&crate::plugin::types::Operation::Preview) {
        match connector.preview(&source.configuration.to_string()).await {
            Ok(sample) => sample,
            Err(e) => {
                warnings.push(json!({ "warning": format!("no preview: {e}") }));
                serde_json::Value::Null
            }
        }
    } else {
        serde_json::Value::Null
    };
    let streams: Vec<serde_json::Value> = catalog
        .iter()
        .map(|s| {
            let fields: Vec<&String> =
                s.json_schema["properties"].as_object().map(|p| p.keys().collect()).unwrap_or_default();
            json!({
                "name": s.name,
                "fields": fields,
                "json_schema": s.json_schema,
                "sync_modes": s.sync_modes,
                "cursor_candidates": s.cursor_fields,
                "default_cursor_field": s.default_cursor_field,
                "primary_key_candidates": [s.primary_key],
            })
        })
        .collect();
    Ok(json!({
        "source_id": source.source_id,
        "connector_id": source.connector_id,
        "streams": streams,
        "suggested_selection": suggested,
        "warnings": warnings,
        "preview": preview,
    }))
}

/// Body of `POST /pipelines`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreatePipeline {
    /// 1 to 200 characters, not only spaces.
    #[schema(min_length = 1, max_length = 200, pattern = r"\S")]
    pub name: String,
    pub source_id: String,
    pub destination_id: String,
    /// Streams to sync and how.
    pub streams: Vec<StreamSelection>,
    #[serde(default = "manual")]
    pub schedule: Schedule,
    /// Minutes after which data not refreshed by a successful sync is
    /// stale: the scheduler announces `pipeline.freshness_breached` once,
    /// and `pipeline.freshness_recovered` when a sync succeeds again.
    #[schema(minimum = 1, maximum = 525_600)]
    pub freshness_minutes: Option<i64>,
}

fn manual() -> Schedule {
    Schedule::Manual
}

/// Body of `PATCH /pipelines/{pipeline_id}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdatePipeline {
    #[serde(default)]
    #[schema(ignore)]
    pub pipeline_id: String,
    pub name: Option<String>,
    pub streams: Option<Vec<StreamSelection>>,
    pub schedule: Option<Schedule>,
    /// A new freshness setting; `0` removes it.
    #[schema(minimum = 0, maximum = 525_600)]
    pub freshness_minutes: Option<i64>,
}

/// Validates stream selections against what the source offers.
async fn check_streams(
    state: &AppState,
    access: &WorkspaceAccess,
    source_id: &str,
    destination_kind: Option<DestinationKind>,
    streams: &[StreamSelection],
) -> ApiResult<()> {
    if streams.is_empty() {
        return Err(ApiError::invalid_field("streams", "select at least one stream"));
    }
    let source = state
        .store
        .source(&access.workspace_id, source_id)
        .await?
        .ok_or_else(|| ApiError::invalid_field("source_id", "no such source"))?;
    let connector = state.plugins.connector(&source.connector_id, &access.workspace_id).await?;
    let catalog = connector.catalog(&state.store, &source.source_id, &source.configuration.to_string()).await?;
    for s in streams {
        let Some(offered) = catalog.iter().find(|c| c.name == s.name) else {
            return Err(ApiError::invalid_field("streams", format!("the source offers no stream {}", s.name)));
        };
        let incremental = s.sync_mode != StreamSyncMode::FullRefreshOverwrite;
        if incremental && !offered.sync_modes.contains(&crate::plugin::types::SyncMode::Incremental) {
            return Err(ApiError::invalid_field("streams", format!("stream {} cannot be read incrementally", s.name)));
        }
        if let Some(contract) = &s.contract {
            check_contract(s, contract, &offered.json_schema)?;
        }
        if s.sync_mode == StreamSyncMode::IncrementalDeduped {
            if destination_kind == Some(DestinationKind::Jsonl) {
                return Err(ApiError::invalid_field(
                    "streams",
                    "JSON-lines destinations cannot deduplicate; use incremental_append or full_refresh_overwrite",
                ));
            }
            if destination_kind == Some(DestinationKind::Iceberg) {
                return Err(ApiError::invalid_field(
                    "streams",
                    "Iceberg destinations cannot deduplicate yet (the Iceberg library the service uses writes no row deletes); use incremental_append or full_refresh_overwrite",
                ));
            }
            if s.primary_key.as_ref().unwrap_or(&offered.primary_key).is_empty() {
                return Err(ApiError::invalid_field(
                    "streams",
                    format!("stream {} has no primary key to deduplicate by", s.name),
                ));
            }
        }
    }
    Ok(())
}

/// A stream's contract, against the stream's schema.
fn check_contract(s: &StreamSelection, contract: &StreamContract, json_schema: &serde_json::Value) -> ApiResult<()> {
    let field = |rule: &str| format!("streams.{}.contract.{rule}", s.name);
    check_contract_rules(contract, &field)?;
    if contract.new_columns != ContractMode::Evolve && !json_schema["properties"].is_object() {
        return Err(ApiError::invalid_field(
            &field("new_columns"),
            format!("stream {} declares no fields, so every field would be new: leave new_columns to evolve", s.name),
        ));
    }
    Ok(())
}

/// What a contract may be whatever stream it judges, into any
/// destination; `field` names a rule's field for the error.
pub(super) fn check_contract_rules(contract: &StreamContract, field: &dyn Fn(&str) -> String) -> ApiResult<()> {
    if contract.invalid_records == ContractMode::DiscardValue {
        return Err(ApiError::invalid_field(
            &field("invalid_records"),
            "a record that does not fit has no one value to leave out: use evolve, freeze or quarantine",
        ));
    }
    Ok(())
}

pub(super) fn next_run(schedule: &Schedule) -> Option<i64> {
    schedule.next_after(crate::store::now_ms()).ok().flatten()
}

pub(super) fn check_schedule(s: &Schedule) -> ApiResult<()> {
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

/// A freshness setting in minutes: 1 to a year (`0` only where it means
/// "none").
fn check_freshness(minutes: i64, zero_allowed: bool) -> ApiResult<Option<i64>> {
    match minutes {
        0 if zero_allowed => Ok(None),
        1..=525_600 => Ok(Some(minutes)),
        _ => Err(ApiError::invalid_field(
            "freshness_minutes",
            if zero_allowed {
                "freshness_minutes must be between 1 and 525600, or 0 to remove it"
            } else {
                "freshness_minutes must be between 1 and 525600"
            },
        )),
    }
}

pub(crate) async fn create_pipeline(ctx: &Ctx<'_>, req: CreatePipeline) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    check_name("name", &req.name)?;
    check_schedule(&req.schedule)?;
    let freshness = req.freshness_minutes.map(|m| check_freshness(m, false)).transpose()?.flatten();
    let dest = state
        .store
        .destination(&access.workspace_id, &req.destination_id)
        .await?
        .ok_or_else(|| ApiError::invalid_field("destination_id", "no such destination"))?;
    check_streams(state, access, &req.source_id, Some(dest.kind), &req.streams).await?;
    let p = state
        .store
        .create_pipeline(
            &access.workspace_id,
            req.name.trim(),
            &req.source_id,
            &req.destination_id,
            &req.streams,
            &req.schedule,
            next_run(&req.schedule),
            freshness,
        )
        .await?;
    note.target("pipeline", &p.pipeline_id);
    Executed::created(p)
}

async fn pipeline(state: &AppState, access: &WorkspaceAccess, id: &str) -> ApiResult<Pipeline> {
    state.store.pipeline(&access.workspace_id, id).await?.ok_or_else(|| ApiError::not_found("pipeline"))
}

/// Why an update needs an approval, if it does: it changes the primary
/// key of a deduplicated stream, which rekeys rows a sync cannot put back.
pub(super) async fn destructive_change(
    state: &AppState,
    access: &WorkspaceAccess,
    req: &UpdatePipeline,
) -> ApiResult<Option<String>> {
    let Some(streams) = &req.streams else { return Ok(None) };
    let Some(p) = state.store.pipeline(&access.workspace_id, &req.pipeline_id).await? else { return Ok(None) };
    let rekeyed = p.streams.iter().find(|old| {
        old.sync_mode == StreamSyncMode::IncrementalDeduped
            && streams.iter().any(|new| {
                new.name == old.name
                    && new.sync_mode == StreamSyncMode::IncrementalDeduped
                    && new.primary_key != old.primary_key
            })
    });
    Ok(rekeyed.map(|s| format!("it changes the primary key of deduplicated stream {}", s.name)))
}

pub(crate) async fn update_pipeline(ctx: &Ctx<'_>, req: UpdatePipeline) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("pipeline", &req.pipeline_id);
    let mut p = pipeline(state, access, &req.pipeline_id).await?;
    if let Some(n) = req.name {
        check_name("name", &n)?;
        p.name = n.trim().to_owned();
    }
    if let Some(streams) = req.streams {
        let kind = match &p.destination_id {
            Some(d) => state.store.destination(&access.workspace_id, d).await?.map(|d| d.kind),
            None => None,
        };
        check_streams(state, access, &p.source_id, kind, &streams).await?;
        p.streams = streams;
    }
    let mut changed = false;
    if let Some(s) = req.schedule {
        check_schedule(&s)?;
        changed = s != p.schedule;
        p.schedule = s;
    }
    if let Some(m) = req.freshness_minutes {
        p.freshness_minutes = check_freshness(m, true)?;
    }
    let next = next_run(&p.schedule);
    let p = state.store.update_pipeline(&p, changed, next).await?.ok_or_else(|| ApiError::not_found("pipeline"))?;
    Executed::ok(p)
}

pub(crate) async fn set_status(ctx: &Ctx<'_>, id: &str, status: PipelineStatus) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("pipeline", id);
    pipeline(state, access, id).await?;
    let p = state
        .store
        .set_pipeline_status(&access.workspace_id, id, status)
        .await?
        .ok_or_else(|| ApiError::not_found("pipeline"))?;
    Executed::ok(p)
}

pub(crate) async fn delete_connection(ctx: &Ctx<'_>, id: &str) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("connection", id);
    match state.store.delete_pipeline(&access.workspace_id, id).await? {
        Ok(()) => Executed::ok(json!({ "connection_id": id, "deleted": true })),
        Err(None) => Err(ApiError::not_found("connection")),
        Err(Some(active)) => {
            Err(super::syncs::conflict("a job is active for this connection; cancel it or wait", Some(active), None))
        }
    }
}

/// Pipeline operations.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "operation", rename_all = "snake_case")]
pub(crate) enum PipelineOp {
    CreatePipeline(CreatePipeline),
    UpdatePipeline(UpdatePipeline),
    PausePipeline { pipeline_id: String },
    ResumePipeline { pipeline_id: String },
    DeleteConnection { connection_id: String },
}

impl Act for PipelineOp {
    fn action(&self) -> &'static str {
        match self {
            PipelineOp::CreatePipeline(_) => "pipelines.create",
            PipelineOp::UpdatePipeline(_) => "pipelines.update",
            PipelineOp::PausePipeline { .. } => "pipelines.pause",
            PipelineOp::ResumePipeline { .. } => "pipelines.resume",
            PipelineOp::DeleteConnection { .. } => "connections.delete",
        }
    }

    fn category(&self) -> Category {
        Category::Pipelines
    }

    fn summary(&self) -> String {
        match self {
            PipelineOp::CreatePipeline(p) => {
                format!("Create pipeline \"{}\" from {} to {}", p.name.trim(), p.source_id, p.destination_id)
            }
            PipelineOp::UpdatePipeline(p) => format!("Update pipeline {}", p.pipeline_id),
            PipelineOp::PausePipeline { pipeline_id } => format!("Pause pipeline {pipeline_id}"),
            PipelineOp::ResumePipeline { pipeline_id } => format!("Resume pipeline {pipeline_id}"),
            PipelineOp::DeleteConnection { connection_id } => format!("Delete connection {connection_id}"),
        }
    }
}

impl PipelineOp {
    pub(super) async fn run(self, ctx: &Ctx<'_>) -> ApiResult<Executed> {
        match self {
            PipelineOp::CreatePipeline(r) => create_pipeline(ctx, r).await,
            PipelineOp::UpdatePipeline(r) => update_pipeline(ctx, r).await,
            PipelineOp::PausePipeline { pipeline_id } => set_status(ctx, &pipeline_id, PipelineStatus::Paused).await,
            PipelineOp::ResumePipeline { pipeline_id } => set_status(ctx, &pipeline_id, PipelineStatus::Active).await,
            PipelineOp::DeleteConnection { connection_id } => delete_connection(ctx, &connection_id).await,
        }
    }
}
