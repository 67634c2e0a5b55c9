//! Destination operations: built-in warehouses (SQLite, PostgreSQL,
//! JSON-lines) a workspace loads into.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::act::{Act, Category, Ctx, Executed};
use super::text::check_name;
use crate::access::WorkspaceAccess;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::store::credentials::CredentialHandle;
use crate::store::destinations::DeleteRefused;
use crate::store::kinds::{CredentialKind, DestinationKind};
use crate::store::pipelines::StreamContract;
use crate::warehouse::DestinationConfig;
use crate::warehouse::config::Lakehouse;

/// Body of `POST /destinations`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateDestination {
    /// 1 to 200 characters, not only spaces.
    #[schema(min_length = 1, max_length = 200, pattern = r"\S")]
    pub name: String,
    pub kind: DestinationKind,
    /// `sqlite`: `{file}`; `postgres`: `{url, credential_handle?}` (no
    /// password in the URL); `jsonl`: `{directory}`; `iceberg`:
    /// `{warehouse, namespace?, commit_every_seconds?, partitions?}`.
    #[schema(value_type = Object)]
    pub configuration: Value,
    /// The data contract of every pipeline stream writing here that names
    /// none of its own (default: none, every record loads as it is).
    #[serde(default)]
    pub default_contract: Option<StreamContract>,
}

/// Body of `PATCH /destinations/{destination_id}`: top-level
/// configuration keys are merged (a `null` removes one), as for sources;
/// `default_contract` replaces the destination's (`null` removes it).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateDestination {
    #[serde(default)]
    #[schema(ignore)]
    pub destination_id: String,
    pub name: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub configuration: Option<Value>,
    /// Absent: unchanged; `null`: none.
    #[serde(default, deserialize_with = "super::patch::present")]
    #[schema(value_type = Option<StreamContract>)]
    pub default_contract: Option<Option<StreamContract>>,
}

async fn check_destination(
    state: &AppState,
    access: &WorkspaceAccess,
    kind: DestinationKind,
    config: &Value,
) -> ApiResult<()> {
    super::text::check_config("configuration", config)?;
    let parsed = crate::warehouse::validate(kind, config)?;
    // A host the server connects to for the destination: (field, host,
    // credential bound to it, whether that must be an access key).
    let reached = match &parsed {
        DestinationConfig::Postgres { credential_handle, target, .. } => {
            Some(("configuration.url", target.host.as_str(), credential_handle.as_deref(), false))
        }
        DestinationConfig::Iceberg { warehouse: Lakehouse::ObjectStore(s3), .. } => {
            Some(("configuration.endpoint", s3.host(), Some(s3.credential_handle.as_str()), true))
        }
        _ => None,
    };
    if let Some((field, host, credential_handle, access_key)) = reached {
        if !state.config.plugins.warehouses.allows_name(host) {
            return Err(ApiError::bad_request(
                "DESTINATION_HOST_NOT_ALLOWED",
                format!("{host} is not a warehouse host the operator allows; the operator lists them in SERVICE_WAREHOUSE_ALLOWED_HOSTS"),
            )
            .with_details(json!({ "field": field, "host": host })));
        }
        if let Some(h) = credential_handle {
            let record = state
                .vault
                .require_handle(&access.workspace_id, &CredentialHandle::new(h), Some(host))
                .await
                .map_err(|e| e.at("configuration.credential_handle"))?;
            // A credential stored for a connector is that connector's; the
            // server would refuse it at the first sync, so say so now.
            if let Some(connector) = &record.connector_id {
                return Err(ApiError::invalid_field(
                    "configuration.credential_handle",
                    format!(
                        "this credential is bound to connector {connector}, so only that connector may use it; a destination takes a credential bound to no connector"
                    ),
                ));
            }
            if access_key && record.kind != CredentialKind::Basic {
                return Err(ApiError::invalid_field(
                    "configuration.credential_handle",
                    "an object store's credential is a basic one: the access key's id as username, its secret as password",
                ));
            }
        }
    }
    Ok(())
}

pub(crate) async fn create_destination(ctx: &Ctx<'_>, req: CreateDestination) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    check_name("name", &req.name)?;
    check_destination(state, access, req.kind, &req.configuration).await?;
    if let Some(contract) = &req.default_contract {
        super::pipelines::check_contract_rules(contract, &|rule| format!("default_contract.{rule}"))?;
    }
    let d = state
        .store
        .create_destination(
            &access.workspace_id,
            req.kind,
            req.name.trim(),
            &req.configuration,
            req.default_contract.as_ref(),
            &access.principal.user_id,
        )
        .await?;
    note.target("destination", &d.destination_id);
    Executed::created(d)
}

pub(crate) async fn update_destination(ctx: &Ctx<'_>, req: UpdateDestination) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("destination", &req.destination_id);
    let cur = state
        .store
        .destination(&access.workspace_id, &req.destination_id)
        .await?
        .ok_or_else(|| ApiError::not_found("destination"))?;
    let name = req.name.unwrap_or(cur.name);
    check_name("name", &name)?;
    let config = super::patch::merge_configuration(cur.configuration, req.configuration)?;
    check_destination(state, access, cur.kind, &config).await?;
    let default_contract = req.default_contract.unwrap_or(cur.default_contract);
    if let Some(contract) = &default_contract {
        super::pipelines::check_contract_rules(contract, &|rule| format!("default_contract.{rule}"))?;
    }
    let d = state
        .store
        .update_destination(&access.workspace_id, &req.destination_id, name.trim(), &config, default_contract.as_ref())
        .await?
        .ok_or_else(|| ApiError::not_found("destination"))?;
    Executed::ok(d)
}

/// Deletes a destination no pipeline writes to; what it wrote stays.
pub(crate) async fn delete_destination(ctx: &Ctx<'_>, destination_id: &str) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("destination", destination_id);
    match state.store.delete_destination(&access.workspace_id, destination_id).await? {
        Err(DeleteRefused::NotFound) => Err(ApiError::not_found("destination")),
        Err(DeleteRefused::InUse { table: "pipelines", ids }) => Err(ApiError::conflict(
            "DESTINATION_IN_USE",
            "pipelines still write to this destination: delete them first (DELETE /v1/connections/{pipeline_id}), then the destination",
        )
        .with_details(json!({ "pipeline_ids": ids }))),
        Err(DeleteRefused::InUse { ids, .. }) => Err(ApiError::conflict(
            "DESTINATION_IN_USE",
            "reverse-ETL models read from this warehouse: delete them first (DELETE /v1/reverse-etl/models/{modelId}), then the destination",
        )
        .with_details(json!({ "model_ids": ids }))),
        Ok(()) => Executed::ok(json!({ "destination_id": destination_id, "deleted": true })),
    }
}

/// Destination operations.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "operation", rename_all = "snake_case")]
#[expect(
    clippy::enum_variant_names,
    reason = "the variants name the operations stored in proposals (`create_destination`, ...)"
)]
pub(crate) enum DestinationOp {
    CreateDestination(CreateDestination),
    UpdateDestination(UpdateDestination),
    /// Delete a destination no pipeline uses.
    DeleteDestination {
        destination_id: String,
    },
}

impl Act for DestinationOp {
    fn action(&self) -> &'static str {
        match self {
            DestinationOp::CreateDestination(_) => "destinations.create",
            DestinationOp::UpdateDestination(_) => "destinations.update",
            DestinationOp::DeleteDestination { .. } => "destinations.delete",
        }
    }

    fn category(&self) -> Category {
        Category::Destinations
    }

    fn summary(&self) -> String {
        match self {
            DestinationOp::CreateDestination(d) => format!("Create {} destination \"{}\"", d.kind, d.name.trim()),
            DestinationOp::UpdateDestination(d) => format!("Update destination {}", d.destination_id),
            DestinationOp::DeleteDestination { destination_id } => format!("Delete destination {destination_id}"),
        }
    }
}

impl DestinationOp {
    pub(super) async fn run(self, ctx: &Ctx<'_>) -> ApiResult<Executed> {
        match self {
            DestinationOp::CreateDestination(r) => create_destination(ctx, r).await,
            DestinationOp::UpdateDestination(r) => update_destination(ctx, r).await,
            DestinationOp::DeleteDestination { destination_id } => delete_destination(ctx, &destination_id).await,
        }
    }
}
