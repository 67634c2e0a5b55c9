//! Webhook subscriptions and their deliveries: the workspace's events,
//! signed per Standard Webhooks, sent to an outside URL.

use axum::Extension;
use axum::extract::{Path, State};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{ApiJson, ApiQuery, PageQuery, Workspace};
use super::{Envelope, Page, ok};
use crate::access::Role;
use crate::audit::AuditNote;
use crate::egress::receiver::receiver_origin;
use crate::error::{ApiError, ApiResult};
use crate::ops::webhooks::{CreateWebhook, UpdateWebhook, WebhookOp, WebhookWithSecret};
use crate::ops::{self, Executed};
use crate::state::AppState;
use crate::store::kinds::DeliveryStatus;
use crate::store::webhooks::{Delivery, Webhook};

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_webhook, list_webhooks))
        .routes(routes!(get_webhook, update_webhook, delete_webhook))
        .routes(routes!(list_deliveries))
        .routes(routes!(replay_delivery))
}

/// Subscribe a URL to event types. The answer holds the signing secret,
/// once. Administrators only; an MCP client's proposal waits for approval
/// (category `webhooks`).
#[utoipa::path(post, path = "/webhooks", tag = "webhooks", request_body = CreateWebhook,
    responses((status = 201, body = Envelope<WebhookWithSecret>), (status = 202, body = Envelope<crate::ops::Proposed>),
        (status = 400, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody),
        (status = 409, body = crate::error::ErrorBody, description = "`WEBHOOK_LIMIT_REACHED`: the workspace has as many subscriptions as the operator allows")))]
async fn create_webhook(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    ApiJson(body): ApiJson<CreateWebhook>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, WebhookOp::CreateWebhook(body)).await
}

/// A subscription as `ws` may see it: members below administrator see its
/// URL's host only, not the path (which often carries the receiver's own
/// secret).
fn as_seen(ws: &Workspace, mut w: Webhook) -> Webhook {
    if ws.role < Role::Administrator {
        w.url = receiver_origin(&w.url);
    }
    w
}

/// Subscriptions of the workspace (never their secrets; to members below
/// administrator, their URLs' hosts only).
#[utoipa::path(get, path = "/webhooks", tag = "webhooks", params(PageQuery), responses((status = 200, body = Envelope<Page<Webhook>>)))]
async fn list_webhooks(
    State(state): State<AppState>,
    ws: Workspace,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> ApiResult<Envelope<Page<Webhook>>> {
    let limit = q.limit()?;
    let items = state.store.webhooks(&ws.workspace_id, q.after()?.as_deref(), limit + 1).await?;
    let items = items.into_iter().map(|w| as_seen(&ws, w)).collect();
    Ok(ok(q.page(items, limit, |w| &w.webhook_id)))
}

/// One subscription (to members below administrator, its URL's host only).
#[utoipa::path(get, path = "/webhooks/{webhook_id}", tag = "webhooks", params(("webhook_id" = String, Path)),
    responses((status = 200, body = Envelope<Webhook>), (status = 404, body = crate::error::ErrorBody)))]
async fn get_webhook(
    State(state): State<AppState>,
    ws: Workspace,
    Path(id): Path<String>,
) -> ApiResult<Envelope<Webhook>> {
    let webhook = state.store.webhook(&ws.workspace_id, &id).await?.ok_or_else(|| ApiError::not_found("webhook"))?;
    Ok(ok(as_seen(&ws, webhook)))
}

/// Change a subscription's URL, event types, description or whether it is
/// enabled; `rotate_secret` makes a new signing secret (answered once)
/// while the current one keeps signing for the overlap window.
#[utoipa::path(patch, path = "/webhooks/{webhook_id}", tag = "webhooks", params(("webhook_id" = String, Path)), request_body = UpdateWebhook,
    responses((status = 200, body = Envelope<Webhook>), (status = 202, body = Envelope<crate::ops::Proposed>),
        (status = 400, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody)))]
async fn update_webhook(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
    ApiJson(mut body): ApiJson<UpdateWebhook>,
) -> ApiResult<Executed> {
    body.webhook_id = id;
    ops::submit(&state, &ws, &note, WebhookOp::UpdateWebhook(body)).await
}

/// Delete a subscription with its pending deliveries and delivery log.
#[utoipa::path(delete, path = "/webhooks/{webhook_id}", tag = "webhooks", params(("webhook_id" = String, Path)),
    responses((status = 200, body = Envelope<serde_json::Value>), (status = 202, body = Envelope<crate::ops::Proposed>),
        (status = 403, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody)))]
async fn delete_webhook(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, WebhookOp::DeleteWebhook { webhook_id: id }).await
}

/// Filters of `GET /webhooks/{webhook_id}/deliveries`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct DeliveriesQuery {
    /// Only deliveries in this status: `pending`, `delivered` or `failed`.
    #[param(value_type = Option<DeliveryStatus>)]
    status: Option<String>,
}

/// Deliveries of a subscription, newest first, each with the body sent
/// and every attempt (status, duration, error). Editors and
/// administrators: the bodies tell what happened in the workspace.
#[utoipa::path(get, path = "/webhooks/{webhook_id}/deliveries", tag = "webhooks", params(("webhook_id" = String, Path), PageQuery, DeliveriesQuery),
    responses((status = 200, body = Envelope<Page<Delivery>>), (status = 400, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody)))]
async fn list_deliveries(
    State(state): State<AppState>,
    ws: Workspace,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<PageQuery>,
    ApiQuery(f): ApiQuery<DeliveriesQuery>,
) -> ApiResult<Envelope<Page<Delivery>>> {
    ws.require(Role::Editor)?;
    let status = f
        .status
        .as_deref()
        .map(|s| {
            DeliveryStatus::parse(s).ok_or_else(|| {
                ApiError::invalid_field("status", format!("status must be {}", DeliveryStatus::choices()))
            })
        })
        .transpose()?;
    state.store.webhook(&ws.workspace_id, &id).await?.ok_or_else(|| ApiError::not_found("webhook"))?;
    let limit = q.limit()?;
    let items = state.store.deliveries(&ws.workspace_id, &id, status, q.after()?.as_deref(), limit + 1).await?;
    Ok(ok(q.page(items, limit, |d| &d.delivery_id)))
}

/// Send a delivery again, with the same `webhook-id` (a receiver that has
/// it already can tell), in its place in the subscription's order.
#[utoipa::path(post, path = "/webhooks/{webhook_id}/deliveries/{delivery_id}/replay", tag = "webhooks",
    params(("webhook_id" = String, Path), ("delivery_id" = String, Path)),
    responses((status = 202, body = Envelope<serde_json::Value>), (status = 403, body = crate::error::ErrorBody),
        (status = 404, body = crate::error::ErrorBody)))]
async fn replay_delivery(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path((webhook_id, delivery_id)): Path<(String, String)>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, WebhookOp::ReplayDelivery { webhook_id, delivery_id }).await
}
