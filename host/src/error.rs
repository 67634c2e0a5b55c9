//! The API's one error type, mapped once to the spec's error shape
//! (`{"code", "message", "details", "request_id"}`, spec section 7).
//!
//! Handlers return `Result<_, ApiError>` and use `?`; conversions from the
//! store and other layers live here. Internal errors are logged with the
//! request id and answered with a generic message, so nothing internal
//! (SQL, paths, stack traces) reaches a client.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use crate::store::StoreError;
use crate::telemetry::request_id;

/// The error body every failing response carries.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// Stable machine-readable code: a numeric status as text (`"403"`) or a
    /// named code (`EXECUTION_CONFLICT`).
    pub code: String,
    /// Human-readable explanation; never contains secrets or internals.
    pub message: String,
    /// Structured context (offending field, conflicting ids, ...).
    pub details: Value,
    /// Identifier of the request, also sent as the `X-Request-Id` header.
    pub request_id: String,
}

/// An error answered to an API client.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
    pub details: Value,
    /// For 5xx: the cause, logged but never sent.
    internal: Option<anyhow::Error>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError { status, code: code.into(), message: message.into(), details: json!({}), internal: None }
    }

    /// Adds structured details.
    pub(crate) fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }

    /// 400 with a named code.
    pub(crate) fn bad_request(code: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 400 `VALIDATION_FAILED` naming the offending field.
    pub(crate) fn invalid_field(field: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "VALIDATION_FAILED", message).with_details(json!({ "field": field }))
    }

    /// 401: no usable bearer token.
    pub(crate) fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "401", message)
    }

    /// 403 with the spec's code `"403"`; the message says permission denied.
    pub(crate) fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "403", message)
    }

    /// 404: the resource does not exist *or* is in a workspace the caller
    /// is not a member of; the two are deliberately indistinguishable.
    pub fn not_found(what: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "404", format!("{what} not found"))
    }

    /// 409 with a named code.
    pub(crate) fn conflict(code: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    /// 409 for something the operator has not set up (an OAuth client, an
    /// allowed host): not the client's fault, not transient, and retrying
    /// will not help until the operator acts; the code names the setting's
    /// subject and the message the setting.
    pub(crate) fn not_configured(code: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    /// 400 `SECRET_NOT_ACCEPTED`: a secret arrived outside a credential
    /// flow (spec section 4, safety rule 5).
    pub(crate) fn secret_refused(field: &str) -> Self {
        Self::bad_request(
            "SECRET_NOT_ACCEPTED",
            "secret values are not accepted here: store the secret through a credential flow \
             (POST /v1/credentials, the secure credential-entry link or OAuth) and pass its credential_handle instead",
        )
        .with_details(json!({ "field": field, "use": "credential_handle" }))
    }

    /// 500: logs `cause` and tells the client only that it failed.
    pub fn internal(cause: impl Into<anyhow::Error>) -> Self {
        let mut e = Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "500",
            "internal error; the request id identifies it in the server log",
        );
        e.internal = Some(cause.into());
        e
    }

    /// 503: a dependency is down.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "503", message)
    }

    /// The body this error is answered with.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            code: self.code.clone(),
            message: self.message.clone(),
            details: self.details.clone(),
            request_id: request_id::current(),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status.as_u16(), self.code, self.message)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::internal(e)
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        ApiError::internal(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let Some(cause) = &self.internal {
            tracing::error!(error = format!("{cause:#}"), "request failed");
        }
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// Result of an API operation.
pub(crate) type ApiResult<T> = Result<T, ApiError>;

impl From<crate::plugin::InvocationError> for ApiError {
    /// One mapping from runtime outcomes to client errors. Messages come
    /// from the connector or the sandbox and are cut short; raw provider
    /// payloads never reach them.
    fn from(e: crate::plugin::InvocationError) -> Self {
        use crate::plugin::InvocationError as I;
        use crate::plugin::types::ConnectorError as C;
        fn short(m: &str) -> String {
            m.chars().take(300).collect()
        }
        match e {
            I::Connector(C::InvalidConfig(m)) => ApiError::bad_request(
                "CONNECTOR_INVALID_CONFIG",
                format!("the connector rejected the configuration: {}", short(&m)),
            ),
            I::Connector(C::InvalidCredentials(m)) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "PROVIDER_INVALID_CREDENTIALS",
                format!("the provider rejected the credential: {}", short(&m)),
            ),
            I::Connector(C::PermissionDenied(m)) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "PROVIDER_PERMISSION_DENIED",
                format!("the credential lacks access: {}", short(&m)),
            ),
            I::Connector(C::RateLimited(after)) => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "PROVIDER_RATE_LIMITED",
                "the provider is rate limiting requests; retry later",
            )
            .with_details(serde_json::json!({ "retry_after_seconds": after })),
            I::Connector(C::ProviderUnavailable(m)) => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "PROVIDER_UNAVAILABLE",
                format!("the provider is unavailable: {}", short(&m)),
            ),
            I::Connector(C::ProviderError(m)) => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "PROVIDER_ERROR",
                format!("the provider refused the request: {}", short(&m)),
            ),
            I::Connector(C::EgressDenied(m)) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "EGRESS_DENIED",
                format!("the egress policy refused a request: {}", short(&m)),
            ),
            I::Connector(C::Unsupported(m)) => {
                ApiError::bad_request("CONNECTOR_UNSUPPORTED", format!("not supported by the connector: {}", short(&m)))
            }
            I::Connector(C::Internal(m)) => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "CONNECTOR_FAILED",
                format!("the connector failed: {}", short(&m)),
            ),
            I::Timeout => ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "CONNECTOR_TIMEOUT",
                "the connector did not finish within its time limit",
            ),
            I::CpuLimit => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "CONNECTOR_CPU_LIMIT",
                "the connector exceeded its CPU time limit",
            ),
            I::MemoryLimit => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "CONNECTOR_MEMORY_LIMIT",
                "the connector exceeded its memory limit",
            ),
            I::Trapped(m) => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "CONNECTOR_TRAPPED",
                format!("the connector crashed: {}", short(&m)),
            ),
            I::OutputTooLarge => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "CONNECTOR_OUTPUT_TOO_LARGE",
                "the connector's output exceeds the size limit",
            ),
            I::Unsupported(op) => ApiError::bad_request(
                "CONNECTOR_OPERATION_UNSUPPORTED",
                format!("the connector does not offer the {op} operation"),
            ),
            I::Unavailable(id) => ApiError::conflict(
                "CONNECTOR_UNAVAILABLE",
                format!("connector {id} is not available (unloaded or disabled by the operator)"),
            )
            .with_details(serde_json::json!({ "connector_id": id })),
            I::Host(m) => ApiError::unavailable(short(&m)),
        }
    }
}

impl From<crate::plugin::registry::VersionError> for ApiError {
    /// Installed versions: a version that is not there is not found; one a
    /// replica cannot load (a signature no longer trusted) is refused.
    fn from(e: crate::plugin::registry::VersionError) -> Self {
        use crate::plugin::registry::VersionError;
        match e {
            VersionError::UnknownPlugin(_) => ApiError::not_found("plugin"),
            VersionError::NoSuchVersion { .. } => ApiError::new(StatusCode::NOT_FOUND, "404", e.to_string()),
            VersionError::Ambiguous { ref digests, .. } => {
                let details = serde_json::json!({ "digests": digests });
                ApiError::conflict("PLUGIN_VERSION_AMBIGUOUS", e.to_string()).with_details(details)
            }
            VersionError::Load(crate::plugin::registry::LoadError::Store(e)) | VersionError::Store(e) => {
                ApiError::from(e)
            }
            VersionError::Load(e) => ApiError::conflict("PLUGIN_REFUSED", e.to_string()),
        }
    }
}

impl crate::egress::receiver::ReceiverUrlError {
    /// The refusal of a receiver URL given in `field`.
    pub(crate) fn at(self, field: &str) -> ApiError {
        use crate::egress::receiver::ReceiverUrlError;
        match self {
            ReceiverUrlError::Invalid(why) => ApiError::invalid_field(field, why),
            ReceiverUrlError::SecretInUrl => ApiError::secret_refused(field),
            ReceiverUrlError::HostNotAllowed(host) => ApiError::bad_request(
                "WEBHOOK_HOST_NOT_ALLOWED",
                format!("{host} is not a host the operator allows webhooks to post to; the operator lists them in SERVICE_WEBHOOK_ALLOWED_HOSTS"),
            )
            .with_details(serde_json::json!({ "field": field, "host": host })),
        }
    }
}
