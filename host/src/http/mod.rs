//! The HTTP surface: `/v1` (the control API), health and metrics, and the
//! OpenAPI description generated from the same route code.
//!
//! Layout:
//! - one module per resource, each exposing `fn router() ->
//!   OpenApiRouter<AppState>`; [`api`] only merges them and adds the
//!   middleware: [`me`], [`workspaces`] (with members and invitations),
//!   [`sessions`], [`audit_logs`], [`approvals`] (with policies),
//!   [`connectors`], [`credentials`], [`oauth`], [`emailcampaign`],
//!   [`plugins`], [`sources`], [`destinations`], [`pipelines`],
//!   [`connections`], [`jobs`], [`reverse_etl`], [`webhooks`];
//! - [`middleware`]: authentication, audit, idempotency, throttling,
//!   deadlines and metrics;
//! - [`extract`]: the request-side types every handler shares (JSON bodies
//!   in the application's error shape, the addressed workspace, paging);
//! - [`system`]: `/healthz`, `/readyz`, `/metrics`, OpenAPI.
//!
//! Routes that do not live where their path suggests:
//!
//! | Route | File |
//! |---|---|
//! | `/invitations/accept` | [`workspaces`] |
//! | `/workspaces/{workspace_id}/members/...` | [`workspaces`] |
//! | `/approval-policies/...` | [`approvals`] |
//! | `/credentials/source/oauth/...`, `/credentials/taskapp/oauth/...` | [`oauth`] |
//! | `/credentials/emailcampaign/api-token` | [`emailcampaign`] |
//! | `/connectors/emailcampaign/...` | [`emailcampaign`] |
//! | `/admin/plugins/...` | [`plugins`] |
//! | `/mcp` | `crate::mcp`, added by `crate::server` |
//! | `/login/...`, `/invitations/{token}`, `/credential-entry/...`, `/oauth/callback` | `crate::web` |
//!
//! Conventions (spec sections 1 and 7): success bodies are
//! `{"request_id", "data"}` ([`Envelope`]); errors are
//! [`crate::error::ErrorBody`]; lists are `data.items` + `data.next_cursor`
//! ([`Page`]).

pub(crate) mod approvals;
pub(crate) mod audit_logs;
pub(crate) mod connections;
pub(crate) mod connectors;
pub(crate) mod credentials;
pub(crate) mod destinations;
pub(crate) mod emailcampaign;
pub(crate) mod extract;
pub(crate) mod jobs;
pub(crate) mod me;
pub(crate) mod middleware;
pub(crate) mod oauth;
pub(crate) mod pipelines;
pub(crate) mod plugins;
pub(crate) mod reverse_etl;
pub(crate) mod sessions;
pub(crate) mod sources;
pub(crate) mod system;
pub(crate) mod webhooks;
pub(crate) mod workspaces;

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;

use crate::error::ApiError;
use crate::state::AppState;

/// The success envelope of every response.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Envelope<T> {
    /// Identifier of the request (UUID).
    pub request_id: String,
    /// The result.
    pub data: T,
    #[serde(skip)]
    #[schema(ignore)]
    status: StatusCode,
}

/// 200 with `data`.
pub(crate) fn ok<T: Serialize>(data: T) -> Envelope<T> {
    Envelope { request_id: crate::telemetry::request_id::current(), data, status: StatusCode::OK }
}

impl<T: Serialize> IntoResponse for Envelope<T> {
    fn into_response(self) -> Response {
        (self.status, axum::Json(&self)).into_response()
    }
}

/// The body an idempotent replay answers instead of the response's own,
/// when that one holds values shown once.
#[derive(Clone)]
pub(crate) struct ReplayBody(pub bytes::Bytes);

/// An executed operation answers in the envelope, with its status; a
/// replay of it gets the answer without its one-time values.
impl IntoResponse for crate::ops::Executed {
    fn into_response(self) -> Response {
        let replay = (!self.one_time.is_empty()).then(|| {
            let stored = ok(self.storable());
            bytes::Bytes::from(serde_json::to_vec(&stored).unwrap_or_default())
        });
        let mut envelope = ok(self.data).into_response();
        *envelope.status_mut() = self.status;
        if let Some(body) = replay {
            envelope.extensions_mut().insert(ReplayBody(body));
        }
        envelope
    }
}

/// One page of a list: `items` and the cursor of the next page (absent on
/// the last page).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Page<T> {
    pub items: Vec<T>,
    /// Opaque; pass as `cursor` to get the next page.
    pub next_cursor: Option<String>,
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Control API", version = "1", description = "Management interface of the data-integration platform (control interface v1)."),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    components(schemas(crate::error::ErrorBody)),
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).bearer_format("opaque").build()),
        );
    }
}

/// Answers every operation can give besides its own, added to the
/// description wherever an operation does not describe them itself: the
/// layers in front of every handler (authentication, workspace and role,
/// rate limits, body and query parsing, idempotency) answer them.
fn document_common_answers(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
    let error = |description: &str| {
        RefOr::T(
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build(),
                )
                .build(),
        )
    };
    let everywhere = [
        (
            "400",
            "The request is malformed: a query parameter, header or body field is invalid (`details.field` names it).",
        ),
        ("401", "No usable bearer token."),
        ("403", "The caller's role, client or workspace does not allow this."),
        ("404", "The resource, or the workspace the request addresses, does not exist for the caller."),
        ("429", "Too many requests; `Retry-After` says when to try again."),
        ("503", "The control database or another part of the server is unavailable; retry later."),
    ];
    // Operations that run a connector or reach a provider answer for it.
    let reaching_providers = [
        "/v1/connectors/emailcampaign/check",
        "/v1/connectors/emailcampaign/edm/preview",
        "/v1/credentials/source/oauth/callback",
        "/v1/credentials/taskapp/oauth/callback",
        "/v1/pipelines/prepare",
        "/v1/pipelines",
        "/v1/pipelines/{pipeline_id}",
        "/v1/sources",
        "/v1/sources/{source_id}",
        "/v1/sources/entities",
    ];
    let provider_answers = [
        (
            "502",
            "The provider or the connector failed (`PROVIDER_ERROR`, `PROVIDER_UNAVAILABLE`, `CONNECTOR_FAILED`, `OAUTH_EXCHANGE_FAILED`, ...).",
        ),
        ("504", "The connector did not finish within its time limit."),
    ];
    let with_body = [
        ("409", "Conflicts with the resource's state, or a request with the same `Idempotency-Key` is still running."),
        ("413", "The request body is too large."),
        ("415", "The request body is not JSON."),
        ("422", "The `Idempotency-Key` was used with another request, or the provider refused the credential."),
    ];
    let envelope = utoipa::openapi::ObjectBuilder::new()
        .property(
            "request_id",
            utoipa::openapi::ObjectBuilder::new().schema_type(utoipa::openapi::schema::Type::String),
        )
        .property("data", utoipa::openapi::ObjectBuilder::new().schema_type(utoipa::openapi::schema::Type::Object))
        .required("request_id")
        .required("data");
    let proposal = RefOr::T(
        ResponseBuilder::new()
            .description("Not executed: a proposal awaiting approval was made (`data` is the approval).")
            .content("application/json", ContentBuilder::new().schema(Some(envelope)).build())
            .build(),
    );
    for (path, item) in openapi.paths.paths.iter_mut() {
        let reaches = reaching_providers.contains(&path.as_str());
        let ops = [
            (false, item.get.as_mut()),
            (true, item.post.as_mut()),
            (true, item.put.as_mut()),
            (true, item.patch.as_mut()),
            (true, item.delete.as_mut()),
        ];
        for (writes, op) in ops {
            let Some(op) = op else { continue };
            let responses = &mut op.responses.responses;
            for (status, description) in everywhere {
                responses.entry(status.to_owned()).or_insert_with(|| error(description));
            }
            if reaches {
                for (status, description) in provider_answers {
                    responses.entry(status.to_owned()).or_insert_with(|| error(description));
                }
            }
            if writes {
                for (status, description) in with_body {
                    responses.entry(status.to_owned()).or_insert_with(|| error(description));
                }
                responses.entry("202".to_owned()).or_insert_with(|| proposal.clone());
            }
        }
    }
}

/// The `/v1` routes with their OpenAPI description.
fn v1() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .merge(me::router())
        .merge(workspaces::router())
        .merge(sessions::router())
        .merge(audit_logs::router())
        .merge(approvals::router())
        .merge(connectors::router())
        .merge(credentials::router())
        .merge(emailcampaign::router())
        .merge(oauth::router())
        .merge(plugins::router())
        .merge(sources::router())
        .merge(destinations::router())
        .merge(pipelines::router())
        .merge(connections::router())
        .merge(jobs::router())
        .merge(reverse_etl::router())
        .merge(webhooks::router())
}

/// Headers of every answer: never sniffed as another content type, and
/// (API answers hold handles and ids) never kept by a shared cache.
async fn security_headers(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    use axum::http::{HeaderValue, header};
    let mut response = next.run(req).await;
    let h = response.headers_mut();
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// The description as served: the generated one, and the schema of the
/// REST manifest connector's configuration among its components (a
/// source's `configuration` is free-form in the API; this is what one of
/// that connector must match).
fn published(openapi: &utoipa::openapi::OpenApi) -> String {
    let Ok(mut doc) = serde_json::to_value(openapi) else { return openapi.to_pretty_json().unwrap_or_default() };
    if let Some(schemas) = doc.pointer_mut("/components/schemas").and_then(serde_json::Value::as_object_mut) {
        for (name, schema) in crate::connectors::restmanifest::openapi_schemas() {
            schemas.insert(name, schema);
        }
    }
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

/// The API: `/v1` (with authentication, idempotency and audit), the
/// operational routes, the error-shaped fallbacks and every layer an
/// answer of this server gets, and the OpenAPI description generated from
/// the same route code. `extra` (the browser pages) is served under the
/// same layers. The composition root adds MCP.
pub(crate) fn api(state: &AppState, extra: Router<AppState>) -> (Router, Arc<utoipa::openapi::OpenApi>) {
    let (v1_routes, mut openapi) = OpenApiRouter::with_openapi(ApiDoc::openapi()).nest("/v1", v1()).split_for_parts();
    openapi.info.version = "1".into();
    document_common_answers(&mut openapi);
    let openapi = Arc::new(openapi);
    let doc = Arc::new(published(&openapi));

    let v1_routes = v1_routes
        .route("/v1/openapi.json", axum::routing::get(move || system::openapi_json(doc.clone())))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), middleware::audit))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), middleware::idempotency))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), middleware::authenticate));

    let api = Router::new()
        .merge(v1_routes)
        .merge(system::router(&openapi))
        .merge(extra)
        .route_layer(axum::middleware::from_fn(middleware::metrics))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "404", "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "405", "method not allowed on this route")
        })
        .layer(axum::extract::DefaultBodyLimit::max(extract::BODY_LIMIT))
        .layer(axum::middleware::from_fn(security_headers))
        // A bug must still answer in the error shape, with the request id.
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_: Box<dyn std::any::Any + Send>| {
            ApiError::internal(anyhow::anyhow!("handler panicked")).into_response()
        }))
        .layer(axum::middleware::from_fn_with_state(state.clone(), middleware::deadline))
        .layer(axum::middleware::from_fn_with_state(state.clone(), middleware::read_body))
        .layer(axum::middleware::from_fn_with_state(state.clone(), middleware::throttle_address))
        .layer(axum::middleware::from_fn(crate::telemetry::request_id::assign))
        .with_state(state.clone());
    (api, openapi)
}
