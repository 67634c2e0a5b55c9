//! Reverse-ETL operations: models, reverse-ETL destinations, activations,
//! and starting runs. One approval category (`reverse_etl`), editors.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::act::{Act, Category, Ctx, Executed, Via};
use super::text::{check_config, check_len, check_name};
use crate::access::WorkspaceAccess;
use crate::error::{ApiError, ApiResult};
use crate::reverse_etl::mapping::Mapper;
use crate::reverse_etl::model::{open, preview_bounds};
use crate::reverse_etl::targets::Target;
use crate::state::AppState;
use crate::store::destinations::DeleteRefused;
use crate::store::jobs::{Job, NotQueued};
use crate::store::kinds::{ActivationMode, JobKind, RetlDestinationKind, Trigger};
use crate::store::pipelines::Schedule;
use crate::store::reverse_etl::{Activation, FieldMapping, Model};
use crate::warehouse::query::Bounds;

/// Longest model query, in characters: one over it still fits the 1 MiB
/// body limit however it is encoded (12 bytes a character at worst, as a
/// JSON surrogate pair), so a query too long is a 400 naming the field,
/// never a 413.
const MAX_QUERY: usize = 65_536;
/// Most mappings an activation has.
const MAX_MAPPINGS: usize = 500;

/// Body of `POST /reverse-etl/models`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateModel {
    #[schema(min_length = 1, max_length = 200, pattern = r"\S")]
    pub name: String,
    /// An SQLite or PostgreSQL destination of the workspace.
    pub warehouse_id: String,
    /// One `SELECT` statement; run read-only.
    #[schema(min_length = 1, max_length = 65536)]
    pub query: String,
    /// The column that identifies a row.
    #[schema(min_length = 1, max_length = 200)]
    pub primary_key: String,
}

/// Body of `PATCH /reverse-etl/models/{modelId}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateModel {
    #[serde(default)]
    #[schema(ignore)]
    pub model_id: String,
    pub name: Option<String>,
    pub warehouse_id: Option<String>,
    pub query: Option<String>,
    pub primary_key: Option<String>,
}

/// Body of `POST /reverse-etl/destinations`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateRetlDestination {
    #[schema(min_length = 1, max_length = 200, pattern = r"\S")]
    pub name: String,
    pub kind: RetlDestinationKind,
    /// `connector`: `{connector_id, object, match_field?, configuration}`
    /// (the connector's configuration, credential handles only);
    /// `webhook`: `{url, credential_handle?}`.
    #[schema(value_type = Object)]
    pub configuration: Value,
}

/// Body of `PATCH /reverse-etl/destinations/{destinationId}`: top-level
/// configuration keys are merged, as for sources.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateRetlDestination {
    #[serde(default)]
    #[schema(ignore)]
    pub destination_id: String,
    pub name: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub configuration: Option<Value>,
}

/// Body of `POST /reverse-etl/activations`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateActivation {
    #[schema(min_length = 1, max_length = 200, pattern = r"\S")]
    pub name: String,
    pub model_id: String,
    /// A reverse-ETL destination.
    pub destination_id: String,
    /// Destination field ← model column (or constant value).
    pub mappings: Vec<FieldMapping>,
    pub mode: ActivationMode,
    /// `{"kind": "manual"}` (default), `{"kind": "interval", "minutes": n}`
    /// or `{"kind": "cron", "expression": "0 6 * * *"}`.
    #[serde(default = "manual")]
    pub schedule: Schedule,
    #[serde(default)]
    pub paused: bool,
}

fn manual() -> Schedule {
    Schedule::Manual
}

/// Body of `PATCH /reverse-etl/activations/{activationId}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateActivation {
    #[serde(default)]
    #[schema(ignore)]
    pub activation_id: String,
    pub name: Option<String>,
    pub model_id: Option<String>,
    pub destination_id: Option<String>,
    pub mappings: Option<Vec<FieldMapping>>,
    pub mode: Option<ActivationMode>,
    pub schedule: Option<Schedule>,
    pub paused: Option<bool>,
}

/// Body of `POST /reverse-etl/activations/{activationId}/run`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunActivation {
    #[serde(default)]
    #[schema(ignore)]
    pub activation_id: String,
    /// Send every row, whatever the diff state says.
    #[serde(default)]
    pub full_resync: bool,
}

/// Checks a model's query against its warehouse (it runs, read-only, and
/// has the key column).
async fn check_model(
    state: &AppState,
    access: &WorkspaceAccess,
    warehouse_id: &str,
    query: &str,
    primary_key: &str,
) -> ApiResult<()> {
    check_len("query", query, MAX_QUERY)?;
    check_len("primary_key", primary_key, 200)?;
    let mut rows =
        open(state, &access.workspace_id, warehouse_id, query, Bounds { rows: Some(1), ..preview_bounds(state) })
            .await?;
    // Run it too, for one row: what only fails when executed (a function
    // that writes, a sequence) is refused now rather than at the first run.
    rows.next_batch().await.map_err(crate::reverse_etl::model::query_error)?;
    if !rows.columns.iter().any(|c| c.name == primary_key) {
        let names: Vec<&str> = rows.columns.iter().map(|c| c.name.as_str()).collect();
        return Err(ApiError::invalid_field(
            "primary_key",
            format!("the query has no column {primary_key}; its columns are: {}", names.join(", ")),
        ));
    }
    Ok(())
}

pub(crate) async fn create_model(ctx: &Ctx<'_>, req: CreateModel) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    check_name("name", &req.name)?;
    check_model(state, access, &req.warehouse_id, &req.query, &req.primary_key).await?;
    let m = state
        .store
        .create_model(
            &access.workspace_id,
            req.name.trim(),
            &req.warehouse_id,
            &req.query,
            &req.primary_key,
            &access.principal.user_id,
        )
        .await?;
    note.target("model", &m.model_id);
    Executed::created(m)
}

pub(crate) async fn update_model(ctx: &Ctx<'_>, req: UpdateModel) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("model", &req.model_id);
    let cur =
        state.store.model(&access.workspace_id, &req.model_id).await?.ok_or_else(|| ApiError::not_found("model"))?;
    let (cur_warehouse, cur_key) = (cur.warehouse_id.clone(), cur.primary_key.clone());
    let m = Model {
        name: req.name.unwrap_or(cur.name.clone()).trim().to_owned(),
        warehouse_id: req.warehouse_id.unwrap_or(cur.warehouse_id.clone()),
        query: req.query.unwrap_or(cur.query.clone()),
        primary_key: req.primary_key.unwrap_or(cur.primary_key.clone()),
        ..cur
    };
    check_name("name", &m.name)?;
    check_model(state, access, &m.warehouse_id, &m.query, &m.primary_key).await?;
    // Keys of another warehouse or column name other rows: the
    // activations' diff state no longer describes what was sent.
    let forget = m.warehouse_id != cur_warehouse || m.primary_key != cur_key;
    Executed::ok(state.store.update_model(&m, forget).await?.ok_or_else(|| ApiError::not_found("model"))?)
}

pub(crate) async fn delete_model(ctx: &Ctx<'_>, model_id: &str) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("model", model_id);
    match state.store.delete_model(&access.workspace_id, model_id).await? {
        Err(DeleteRefused::NotFound) => Err(ApiError::not_found("model")),
        Err(DeleteRefused::InUse { ids, .. }) => Err(ApiError::conflict(
            "MODEL_IN_USE",
            "activations still send this model: delete them first (DELETE /v1/reverse-etl/activations/{activationId}), then the model",
        )
        .with_details(json!({ "activation_ids": ids }))),
        Ok(()) => Executed::ok(json!({ "model_id": model_id, "deleted": true })),
    }
}

/// Checks a destination: a connector's configuration as a source of that
/// connector would be checked, and what it can write; a webhook's URL and
/// credential.
async fn check_destination(
    state: &AppState,
    access: &WorkspaceAccess,
    kind: RetlDestinationKind,
    config: &Value,
) -> ApiResult<()> {
    check_config("configuration", config)?;
    if kind == RetlDestinationKind::Connector {
        let (connector_id, inner) = Target::connector_configuration(config)?;
        let connector_id = state
            .plugins
            .canonical_id(&connector_id)
            .ok_or_else(|| ApiError::invalid_field("configuration.connector_id", "unknown connector"))?;
        super::sources::validate_configuration(state, access, &connector_id, &inner, None).await?;
    }
    let probe = crate::store::reverse_etl::RetlDestination {
        destination_id: String::new(),
        workspace_id: access.workspace_id.clone(),
        name: String::new(),
        kind,
        configuration: config.clone(),
        created_by: String::new(),
        created_at: chrono::Utc::now(),
        updated_at: chrono::Utc::now(),
    };
    Target::open(state, &access.workspace_id, &probe).await.map(|_| ()).map_err(Into::into)
}

/// A connector destination is saved with the canonical connector id.
fn canonical(state: &AppState, kind: RetlDestinationKind, mut config: Value) -> Value {
    if kind == RetlDestinationKind::Connector
        && let Some(id) =
            config.get("connector_id").and_then(Value::as_str).and_then(|id| state.plugins.canonical_id(id))
    {
        config["connector_id"] = Value::String(id);
    }
    config
}

pub(crate) async fn create_destination(ctx: &Ctx<'_>, req: CreateRetlDestination) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    check_name("name", &req.name)?;
    check_destination(state, access, req.kind, &req.configuration).await?;
    let config = canonical(state, req.kind, req.configuration);
    let d = state
        .store
        .create_retl_destination(&access.workspace_id, req.name.trim(), req.kind, &config, &access.principal.user_id)
        .await?;
    note.target("reverse_etl_destination", &d.destination_id);
    Executed::created(d)
}

pub(crate) async fn update_destination(ctx: &Ctx<'_>, req: UpdateRetlDestination) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("reverse_etl_destination", &req.destination_id);
    let cur = state
        .store
        .retl_destination(&access.workspace_id, &req.destination_id)
        .await?
        .ok_or_else(|| ApiError::not_found("destination"))?;
    let name = req.name.unwrap_or(cur.name);
    check_name("name", &name)?;
    let config = super::patch::merge_configuration(cur.configuration.clone(), req.configuration)?;
    check_destination(state, access, cur.kind, &config).await?;
    let config = canonical(state, cur.kind, config);
    // Sending elsewhere (another connector, object, list, matching field
    // or address) starts afresh; a new credential for the same place does not.
    let forget = without_handles(&config) != without_handles(&cur.configuration);
    let d = state
        .store
        .update_retl_destination(&access.workspace_id, &req.destination_id, name.trim(), &config, forget)
        .await?
        .ok_or_else(|| ApiError::not_found("destination"))?;
    Executed::ok(d)
}

/// A configuration without its credential handles, at any depth.
fn without_handles(config: &Value) -> Value {
    match config {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| k.as_str() != "credential_handle")
                .map(|(k, v)| (k.clone(), without_handles(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

pub(crate) async fn delete_destination(ctx: &Ctx<'_>, destination_id: &str) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("reverse_etl_destination", destination_id);
    match state.store.delete_retl_destination(&access.workspace_id, destination_id).await? {
        Err(DeleteRefused::NotFound) => Err(ApiError::not_found("destination")),
        Err(DeleteRefused::InUse { ids, .. }) => Err(ApiError::conflict(
            "DESTINATION_IN_USE",
            "activations still send to this destination: delete them first (DELETE /v1/reverse-etl/activations/{activationId}), then the destination",
        )
        .with_details(json!({ "activation_ids": ids }))),
        Ok(()) => Executed::ok(json!({ "destination_id": destination_id, "deleted": true })),
    }
}

/// Checks an activation's parts against each other: the model runs and
/// its columns fit the mapping, the destination can take the fields
/// mapped and is matched by a mapped field.
async fn check_activation(state: &AppState, access: &WorkspaceAccess, a: &Activation) -> ApiResult<()> {
    check_name("name", &a.name)?;
    super::pipelines::check_schedule(&a.schedule)?;
    if a.mappings.len() > MAX_MAPPINGS {
        return Err(ApiError::invalid_field("mappings", format!("at most {MAX_MAPPINGS} mappings")));
    }
    for (i, m) in a.mappings.iter().enumerate() {
        check_len(&format!("mappings[{i}].field"), &m.field, 200)?;
        if let Some(v) = &m.value {
            check_config(&format!("mappings[{i}].value"), v)?;
        }
    }
    let model = state
        .store
        .model(&access.workspace_id, &a.model_id)
        .await?
        .ok_or_else(|| ApiError::invalid_field("model_id", "no such model"))?;
    let dest = state
        .store
        .retl_destination(&access.workspace_id, &a.destination_id)
        .await?
        .ok_or_else(|| ApiError::invalid_field("destination_id", "no such reverse-ETL destination"))?;
    let target = Target::open(state, &access.workspace_id, &dest).await?;
    if let Some(fields) = target.fields()
        && let Some((i, m)) = a.mappings.iter().enumerate().find(|(_, m)| !fields.contains(&m.field))
    {
        return Err(ApiError::invalid_field(
            &format!("mappings[{i}].field"),
            format!("the destination cannot write {}; it writes: {}", m.field, fields.join(", ")),
        ));
    }
    let rows = open(
        state,
        &access.workspace_id,
        &model.warehouse_id,
        &model.query,
        Bounds { rows: Some(1), ..preview_bounds(state) },
    )
    .await?;
    Mapper::new(&a.mappings, &rows.columns, &model.primary_key, target.match_field()).map_err(|e| {
        if e.secret { ApiError::secret_refused(&e.field) } else { ApiError::invalid_field(&e.field, e.message) }
    })?;
    Ok(())
}

pub(crate) async fn create_activation(ctx: &Ctx<'_>, req: CreateActivation) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    let now = chrono::Utc::now();
    let draft = Activation {
        activation_id: String::new(),
        workspace_id: access.workspace_id.clone(),
        name: req.name.trim().to_owned(),
        model_id: req.model_id,
        destination_id: req.destination_id,
        mappings: req.mappings,
        mode: req.mode,
        schedule: req.schedule,
        paused: req.paused,
        created_by: access.principal.user_id.clone(),
        created_at: now,
        updated_at: now,
    };
    check_activation(state, access, &draft).await?;
    let a = state
        .store
        .create_activation(
            &access.workspace_id,
            &draft.name,
            &draft.model_id,
            &draft.destination_id,
            &draft.mappings,
            draft.mode,
            &draft.schedule,
            draft.paused,
            super::pipelines::next_run(&draft.schedule),
            &access.principal.user_id,
        )
        .await?;
    note.target("activation", &a.activation_id);
    Executed::created(a)
}

pub(crate) async fn update_activation(ctx: &Ctx<'_>, req: UpdateActivation) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("activation", &req.activation_id);
    let cur = state
        .store
        .activation(&access.workspace_id, &req.activation_id)
        .await?
        .ok_or_else(|| ApiError::not_found("activation"))?;
    let schedule_changed = req.schedule.as_ref().is_some_and(|s| *s != cur.schedule);
    let (cur_model, cur_destination) = (cur.model_id.clone(), cur.destination_id.clone());
    let a = Activation {
        name: req.name.map(|n| n.trim().to_owned()).unwrap_or(cur.name.clone()),
        model_id: req.model_id.unwrap_or(cur.model_id.clone()),
        destination_id: req.destination_id.unwrap_or(cur.destination_id.clone()),
        mappings: req.mappings.unwrap_or(cur.mappings.clone()),
        mode: req.mode.unwrap_or(cur.mode),
        schedule: req.schedule.unwrap_or(cur.schedule.clone()),
        paused: req.paused.unwrap_or(cur.paused),
        ..cur
    };
    check_activation(state, access, &a).await?;
    let next = schedule_changed.then(|| super::pipelines::next_run(&a.schedule));
    // Another model or destination starts from an empty diff state; not
    // under a run that would write the old one back.
    let forget = a.model_id != cur_model || a.destination_id != cur_destination;
    if forget && let Some(active) = state.store.active_run(&a.activation_id).await? {
        return Err(ApiError::conflict(
            "EXECUTION_CONFLICT",
            "a run of this activation is active; its model or destination can change once it ends",
        )
        .with_details(json!({ "active_run": run_summary(&active) })));
    }
    Executed::ok(
        state.store.update_activation(&a, next, forget).await?.ok_or_else(|| ApiError::not_found("activation"))?,
    )
}

pub(crate) async fn delete_activation(ctx: &Ctx<'_>, activation_id: &str) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("activation", activation_id);
    match state.store.delete_activation(&access.workspace_id, activation_id).await? {
        Ok(()) => Executed::ok(json!({ "activation_id": activation_id, "deleted": true })),
        Err(None) => Err(ApiError::not_found("activation")),
        Err(Some(active)) => Err(ApiError::conflict(
            "EXECUTION_CONFLICT",
            "a run of this activation is active; cancel it (POST /v1/jobs/{job_id}/cancel) or wait for it to end",
        )
        .with_details(json!({ "active_run": run_summary(&active) }))),
    }
}

/// How a conflict names the active run.
fn run_summary(j: &Job) -> Value {
    json!({ "run_id": j.job_id, "status": j.status, "created_at": j.created_at })
}

/// Starts a run unless one is active: 409 `EXECUTION_CONFLICT` with the
/// active run, as for syncs.
pub(crate) async fn run(ctx: &Ctx<'_>, req: RunActivation, trigger: Trigger) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("activation", &req.activation_id);
    let a = state
        .store
        .activation(&access.workspace_id, &req.activation_id)
        .await?
        .ok_or_else(|| ApiError::not_found("activation"))?;
    let kind = if req.full_resync { JobKind::ActivationResync } else { JobKind::ActivationRun };
    match state.store.create_run(&access.workspace_id, &a.activation_id, kind, trigger).await? {
        Ok(run) => {
            state.jobs_queued.notify_one();
            note.target("run", &run.job_id);
            Executed::created(
                json!({ "run_id": run.job_id, "activation_id": a.activation_id, "status": run.status, "full_resync": req.full_resync, "created_at": run.created_at }),
            )
        }
        Err(NotQueued::Gone) => Err(ApiError::not_found("activation")),
        Err(NotQueued::Active(active)) => Err(ApiError::conflict(
            "EXECUTION_CONFLICT",
            "a run of this activation is already active; refresh its status before retrying",
        )
        .with_details(json!({ "active_run": active.as_deref().map(run_summary) }))),
    }
}

/// Body of `POST /reverse-etl/prepare`: a saved model, or a warehouse and
/// a query; optionally a reverse-ETL destination to suggest mappings for.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PrepareModel {
    pub model_id: Option<String>,
    pub warehouse_id: Option<String>,
    #[schema(max_length = 100000)]
    pub query: Option<String>,
    pub destination_id: Option<String>,
}

/// Runs a model (saved, or a warehouse and a query) for a preview.
/// Creates nothing, but it runs a query on the warehouse with the
/// workspace's credentials, so it goes through the gate like the writes:
/// an assistant's preview is a proposal unless the policy says otherwise.
pub(crate) async fn prepare(ctx: &Ctx<'_>, req: PrepareModel) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    let (warehouse_id, query) = match (&req.model_id, &req.warehouse_id, &req.query) {
        (Some(id), None, None) => {
            note.target("model", id);
            let m = state
                .store
                .model(&access.workspace_id, id)
                .await?
                .ok_or_else(|| ApiError::invalid_field("model_id", "no such model"))?;
            (m.warehouse_id, m.query)
        }
        (None, Some(w), Some(q)) => {
            note.target("destination", w);
            (w.clone(), q.clone())
        }
        _ => return Err(ApiError::invalid_field("model_id", "give either model_id, or warehouse_id and query")),
    };
    let destination = match &req.destination_id {
        Some(id) => Some(
            state
                .store
                .retl_destination(&access.workspace_id, id)
                .await?
                .ok_or_else(|| ApiError::invalid_field("destination_id", "no such reverse-ETL destination"))?,
        ),
        None => None,
    };
    Executed::ok(
        crate::reverse_etl::preview::preview(state, &access.workspace_id, &warehouse_id, &query, destination.as_ref())
            .await?,
    )
}

/// Reverse-ETL operations.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "operation", rename_all = "snake_case")]
pub(crate) enum ReverseEtlOp {
    Prepare(PrepareModel),
    CreateModel(CreateModel),
    UpdateModel(UpdateModel),
    DeleteModel { model_id: String },
    CreateRetlDestination(CreateRetlDestination),
    UpdateRetlDestination(UpdateRetlDestination),
    DeleteRetlDestination { destination_id: String },
    CreateActivation(CreateActivation),
    UpdateActivation(UpdateActivation),
    DeleteActivation { activation_id: String },
    RunActivation(RunActivation),
}

impl Act for ReverseEtlOp {
    fn action(&self) -> &'static str {
        match self {
            ReverseEtlOp::Prepare(_) => "reverse_etl.prepare",
            ReverseEtlOp::CreateModel(_) => "reverse_etl.models.create",
            ReverseEtlOp::UpdateModel(_) => "reverse_etl.models.update",
            ReverseEtlOp::DeleteModel { .. } => "reverse_etl.models.delete",
            ReverseEtlOp::CreateRetlDestination(_) => "reverse_etl.destinations.create",
            ReverseEtlOp::UpdateRetlDestination(_) => "reverse_etl.destinations.update",
            ReverseEtlOp::DeleteRetlDestination { .. } => "reverse_etl.destinations.delete",
            ReverseEtlOp::CreateActivation(_) => "reverse_etl.activations.create",
            ReverseEtlOp::UpdateActivation(_) => "reverse_etl.activations.update",
            ReverseEtlOp::DeleteActivation { .. } => "reverse_etl.activations.delete",
            ReverseEtlOp::RunActivation(_) => "reverse_etl.activations.run",
        }
    }

    fn category(&self) -> Category {
        Category::ReverseEtl
    }

    fn summary(&self) -> String {
        match self {
            ReverseEtlOp::Prepare(p) => match (&p.model_id, &p.warehouse_id, &p.query) {
                (Some(id), _, _) => format!("Preview reverse-ETL model {id} (runs its query on the warehouse)"),
                (_, Some(w), Some(q)) => {
                    format!("Run a query on warehouse {w} for a preview: {}", q.chars().take(200).collect::<String>())
                }
                _ => "Preview a reverse-ETL model".to_owned(),
            },
            ReverseEtlOp::CreateModel(m) => format!(
                "Create reverse-ETL model \"{}\" over warehouse {} keyed by {}",
                m.name.trim(),
                m.warehouse_id,
                m.primary_key
            ),
            ReverseEtlOp::UpdateModel(m) => format!("Update reverse-ETL model {}", m.model_id),
            ReverseEtlOp::DeleteModel { model_id } => format!("Delete reverse-ETL model {model_id}"),
            ReverseEtlOp::CreateRetlDestination(d) => {
                format!("Create {} reverse-ETL destination \"{}\"", d.kind, d.name.trim())
            }
            ReverseEtlOp::UpdateRetlDestination(d) => format!("Update reverse-ETL destination {}", d.destination_id),
            ReverseEtlOp::DeleteRetlDestination { destination_id } => {
                format!("Delete reverse-ETL destination {destination_id}")
            }
            ReverseEtlOp::CreateActivation(a) => format!(
                "Create activation \"{}\": model {} to destination {} ({})",
                a.name.trim(),
                a.model_id,
                a.destination_id,
                a.mode
            ),
            ReverseEtlOp::UpdateActivation(a) => format!("Update activation {}", a.activation_id),
            ReverseEtlOp::DeleteActivation { activation_id } => {
                format!("Delete activation {activation_id} and its diff state")
            }
            ReverseEtlOp::RunActivation(r) if r.full_resync => {
                format!("Run activation {}: send every row again", r.activation_id)
            }
            ReverseEtlOp::RunActivation(r) => format!("Run activation {}: send what changed", r.activation_id),
        }
    }
}

impl ReverseEtlOp {
    pub(super) async fn run(self, ctx: &Ctx<'_>) -> ApiResult<Executed> {
        match self {
            ReverseEtlOp::Prepare(r) => prepare(ctx, r).await,
            ReverseEtlOp::CreateModel(r) => create_model(ctx, r).await,
            ReverseEtlOp::UpdateModel(r) => update_model(ctx, r).await,
            ReverseEtlOp::DeleteModel { model_id } => delete_model(ctx, &model_id).await,
            ReverseEtlOp::CreateRetlDestination(r) => create_destination(ctx, r).await,
            ReverseEtlOp::UpdateRetlDestination(r) => update_destination(ctx, r).await,
            ReverseEtlOp::DeleteRetlDestination { destination_id } => delete_destination(ctx, &destination_id).await,
            ReverseEtlOp::CreateActivation(r) => create_activation(ctx, r).await,
            ReverseEtlOp::UpdateActivation(r) => update_activation(ctx, r).await,
            ReverseEtlOp::DeleteActivation { activation_id } => delete_activation(ctx, &activation_id).await,
            ReverseEtlOp::RunActivation(r) => {
                let trigger = if ctx.via == Via::Approval { Trigger::Approval } else { Trigger::Manual };
                run(ctx, r, trigger).await
            }
        }
    }
}
