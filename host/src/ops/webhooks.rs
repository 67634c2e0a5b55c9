//! Webhook subscription operations: creating, changing (a new signing
//! secret included), deleting, and replaying a delivery.
//!
//! A subscription sends a workspace's events to an outside URL, so its
//! writes are administrators' (category `webhooks`) and its URL obeys the
//! rules of webhook destinations: HTTPS, an allowed host, never an
//! address. The signing secret is made when the operation runs (never
//! stored in a proposal) and answered once.

use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use super::act::{Act, Category, Ctx, Executed};
use super::text::check_opt;
use crate::egress::receiver::{check_receiver_url, receiver_origin};
use crate::error::{ApiError, ApiResult};
use crate::store::kinds::EventType;
use crate::store::new_id;
use crate::store::webhooks::{NewWebhook, Webhook};
use crate::webhooks::signing::SigningSecret;

/// Longest description.
const DESCRIPTION_MAX: usize = 500;

/// Body of `POST /webhooks`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateWebhook {
    /// An HTTPS URL on port 443 whose host the operator allows webhooks to
    /// reach (`SERVICE_WEBHOOK_ALLOWED_HOSTS`); no query, fragment or
    /// user-info.
    #[schema(max_length = 2048)]
    pub url: String,
    /// The event types to receive (at least one).
    #[schema(min_items = 1)]
    pub event_types: Vec<EventType>,
    #[serde(default)]
    #[schema(max_length = 500)]
    pub description: Option<String>,
}

/// Body of `PATCH /webhooks/{webhook_id}`: what is given changes.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateWebhook {
    #[serde(default)]
    #[schema(ignore)]
    pub webhook_id: String,
    #[schema(max_length = 2048)]
    pub url: Option<String>,
    #[schema(min_items = 1)]
    pub event_types: Option<Vec<EventType>>,
    #[schema(max_length = 500)]
    pub description: Option<String>,
    /// A disabled subscription gets no new deliveries; its pending ones
    /// wait until it is enabled again.
    pub enabled: Option<bool>,
    /// `true` makes a new signing secret, answered once; the current one
    /// keeps signing beside it for the overlap window, so receivers can
    /// switch without missing a message.
    #[serde(default)]
    pub rotate_secret: bool,
}

/// A subscription with the secret shown once.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WebhookWithSecret {
    #[serde(flatten)]
    pub webhook: Webhook,
    /// `whsec_…`: shown once, here; verify each message's
    /// `webhook-signature` with it (Standard Webhooks).
    pub secret: String,
}

fn check_url(ctx: &Ctx<'_>, url: &str) -> ApiResult<()> {
    if url.len() > 2048 {
        return Err(super::text::too_long("url", 2048));
    }
    check_receiver_url(ctx.state.egress.policy(), url).map(|_| ()).map_err(|e| e.at("url"))
}

fn check_types(types: &[EventType]) -> ApiResult<Vec<EventType>> {
    if types.is_empty() {
        return Err(ApiError::invalid_field("event_types", "list at least one event type"));
    }
    let mut unique: Vec<EventType> = Vec::with_capacity(types.len());
    for t in types {
        if !unique.contains(t) {
            unique.push(*t);
        }
    }
    Ok(unique)
}

async fn create(ctx: &Ctx<'_>, req: CreateWebhook) -> ApiResult<Executed> {
    check_url(ctx, &req.url)?;
    let types = check_types(&req.event_types)?;
    check_opt("description", req.description.as_deref(), DESCRIPTION_MAX)?;
    let ws = &ctx.access.workspace_id;
    let cap = ctx.state.config.limits.webhooks.subscriptions_per_workspace;
    if ctx.state.store.webhook_count(ws).await? >= cap {
        return Err(ApiError::conflict(
            "WEBHOOK_LIMIT_REACHED",
            format!(
                "this workspace has {cap} webhook subscriptions, as many as the operator allows (SERVICE_WEBHOOKS_PER_WORKSPACE); delete one first"
            ),
        )
        .with_details(json!({ "limit": cap })));
    }
    let id = new_id("whk");
    let secret = SigningSecret::generate();
    let sealed = ctx.state.vault.seal_signing_secret(&id, ws, secret.bytes());
    let webhook = ctx
        .state
        .store
        .create_webhook(NewWebhook {
            webhook_id: &id,
            workspace_id: ws,
            url: &req.url,
            description: req.description.as_deref().unwrap_or("").trim(),
            event_types: &types,
            secret: &sealed,
            created_by: &ctx.access.principal.user_id,
        })
        .await?;
    ctx.note.target("webhook", &id);
    use secrecy::ExposeSecret;
    let shown = WebhookWithSecret { webhook, secret: secret.shown().expose_secret().to_owned() };
    Ok(Executed::created(shown)?.shown_once(&["/secret"]))
}

async fn update(ctx: &Ctx<'_>, req: UpdateWebhook) -> ApiResult<Executed> {
    let ws = &ctx.access.workspace_id;
    ctx.note.target("webhook", &req.webhook_id);
    let cur = ctx.state.store.webhook(ws, &req.webhook_id).await?.ok_or_else(|| ApiError::not_found("webhook"))?;
    // The URL is judged when it changes: a subscription whose host left
    // the allowlist can still be disabled, described or deleted (the
    // deliverer refuses to send to it either way).
    let url = match req.url {
        Some(url) if url != cur.url => {
            check_url(ctx, &url)?;
            url
        }
        _ => cur.url,
    };
    let types = check_types(&req.event_types.unwrap_or(cur.event_types))?;
    check_opt("description", req.description.as_deref(), DESCRIPTION_MAX)?;
    let description = req.description.map(|d| d.trim().to_owned()).unwrap_or(cur.description);
    let secret = req.rotate_secret.then(SigningSecret::generate);
    let sealed = secret.as_ref().map(|s| ctx.state.vault.seal_signing_secret(&req.webhook_id, ws, s.bytes()));
    let overlap = i64::try_from(ctx.state.config.limits.webhooks.secret_overlap.as_millis()).unwrap_or(i64::MAX);
    let webhook = ctx
        .state
        .store
        .update_webhook(
            ws,
            &req.webhook_id,
            &url,
            &description,
            &types,
            req.enabled.unwrap_or(cur.enabled),
            sealed.as_ref().map(|s| (s, crate::store::now_ms() + overlap)),
        )
        .await?
        .ok_or_else(|| ApiError::not_found("webhook"))?;
    match secret {
        Some(secret) => {
            use secrecy::ExposeSecret;
            let shown = WebhookWithSecret { webhook, secret: secret.shown().expose_secret().to_owned() };
            Ok(Executed::ok(shown)?.shown_once(&["/secret"]))
        }
        None => Executed::ok(webhook),
    }
}

/// Webhook subscription operations.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "operation", rename_all = "snake_case")]
pub(crate) enum WebhookOp {
    CreateWebhook(CreateWebhook),
    UpdateWebhook(UpdateWebhook),
    DeleteWebhook { webhook_id: String },
    ReplayDelivery { webhook_id: String, delivery_id: String },
}

impl Act for WebhookOp {
    fn action(&self) -> &'static str {
        match self {
            WebhookOp::CreateWebhook(_) => "webhooks.create",
            WebhookOp::UpdateWebhook(_) => "webhooks.update",
            WebhookOp::DeleteWebhook { .. } => "webhooks.delete",
            WebhookOp::ReplayDelivery { .. } => "webhooks.replay",
        }
    }

    fn category(&self) -> Category {
        Category::Webhooks
    }

    fn summary(&self) -> String {
        match self {
            WebhookOp::CreateWebhook(w) => {
                let types: Vec<&str> = w.event_types.iter().map(|t| t.as_str()).collect();
                format!("Send {} events to {}", types.join(", "), receiver_origin(&w.url))
            }
            WebhookOp::UpdateWebhook(w) => match (&w.url, w.rotate_secret) {
                (Some(url), _) => format!("Change webhook {} to send to {}", w.webhook_id, receiver_origin(url)),
                (None, true) => format!("Rotate the signing secret of webhook {}", w.webhook_id),
                (None, false) => format!("Update webhook {}", w.webhook_id),
            },
            WebhookOp::DeleteWebhook { webhook_id } => format!("Delete webhook {webhook_id}"),
            WebhookOp::ReplayDelivery { webhook_id, delivery_id } => {
                format!("Send delivery {delivery_id} of webhook {webhook_id} again")
            }
        }
    }
}

impl WebhookOp {
    pub(super) async fn run(self, ctx: &Ctx<'_>) -> ApiResult<Executed> {
        match self {
            WebhookOp::CreateWebhook(r) => create(ctx, r).await,
            WebhookOp::UpdateWebhook(r) => update(ctx, r).await,
            WebhookOp::DeleteWebhook { webhook_id } => {
                ctx.note.target("webhook", &webhook_id);
                if !ctx.state.store.delete_webhook(&ctx.access.workspace_id, &webhook_id).await? {
                    return Err(ApiError::not_found("webhook"));
                }
                Executed::ok(json!({ "webhook_id": webhook_id, "deleted": true }))
            }
            WebhookOp::ReplayDelivery { webhook_id, delivery_id } => {
                ctx.note.target("webhook", &webhook_id);
                if !ctx.state.store.replay_delivery(&ctx.access.workspace_id, &webhook_id, &delivery_id).await? {
                    return Err(ApiError::not_found("delivery"));
                }
                Executed::with_status(
                    axum::http::StatusCode::ACCEPTED,
                    json!({ "webhook_id": webhook_id, "delivery_id": delivery_id, "status": "pending" }),
                )
            }
        }
    }
}
