//! Request-side types shared by every handler.
//!
//! - [`ApiJson`]: a JSON body whose every failure (malformed JSON, wrong
//!   types, unknown fields, oversized bodies, a secret where none belongs)
//!   is answered in the application's error shape.
//! - [`Workspace`]: the workspace a request addresses, with the caller's
//!   role in it.
//! - [`PageQuery`]: `limit` and `cursor` of list endpoints.
//!
//! How a request selects its workspace: a `{workspace_id}` path segment
//! wins; otherwise the `X-Service-Workspace` header; otherwise the
//! `workspace_id` query parameter; otherwise the caller's default workspace
//! (the oldest one they belong to). A workspace the caller does not belong
//! to answers 404, exactly like one that does not exist.

use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Query, RawPathParams, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use bytes::Bytes;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use utoipa::IntoParams;

use crate::access::{Principal, WorkspaceAccess};
use crate::audit::AuditNote;
use crate::error::ApiError;
use crate::state::AppState;

/// Largest request body accepted (bytes).
pub(crate) const BODY_LIMIT: usize = 1024 * 1024;

/// Header naming the workspace a request addresses.
pub(crate) const WORKSPACE_HEADER: &str = "x-service-workspace";

/// A JSON request body, checked for secrets, in the API's error shape.
pub(crate) struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let value = json_body(req, state).await?;
        if let Some(field) = crate::credentials::lookalike::find_secret(&value, "") {
            return Err(ApiError::secret_refused(&field));
        }
        parse_value(value).map(ApiJson)
    }
}

/// An optional JSON body: absent when the request has no `Content-Type`
/// and no body; otherwise exactly like [`ApiJson`].
pub(crate) struct MaybeJson<T>(pub Option<T>);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for MaybeJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let empty_length = req.headers().get(axum::http::header::CONTENT_LENGTH).is_some_and(|v| v == "0");
        if req.headers().get(axum::http::header::CONTENT_TYPE).is_none() || empty_length {
            return Ok(MaybeJson(None));
        }
        ApiJson::<T>::from_request(req, state).await.map(|j| MaybeJson(Some(j.0)))
    }
}

/// A JSON body that may carry a raw secret: only for the credential
/// creation endpoints (spec section 4, "Credentials").
pub(crate) struct SecretJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for SecretJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        parse_value(json_body(req, state).await?).map(SecretJson)
    }
}

async fn json_body<S: Send + Sync>(req: Request, state: &S) -> Result<Value, ApiError> {
    let is_json = req
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|ct| {
            let mime = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
            mime == "application/json" || mime.ends_with("+json")
        })
        .unwrap_or(false);
    if !is_json {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UNSUPPORTED_MEDIA_TYPE",
            "the request body must be JSON with Content-Type: application/json",
        ));
    }
    let bytes = Bytes::from_request(req, state).await.map_err(body_rejection)?;
    let value = serde_json::from_slice::<Value>(&bytes).map_err(|e| {
        ApiError::bad_request("MALFORMED_JSON", format!("the request body is not valid JSON: {e}"))
            .with_details(json!({ "line": e.line(), "column": e.column() }))
    })?;
    if !value.is_object() {
        return Err(ApiError::bad_request("VALIDATION_FAILED", "the request body must be a JSON object")
            .with_details(json!({ "field": "" })));
    }
    // Fields have limits of their own; this bounds the ones that do not.
    if let Some(field) = crate::ops::text::longest_string(&value, "", crate::ops::text::ANY_STRING_MAX) {
        return Err(crate::ops::text::too_long(&field, crate::ops::text::ANY_STRING_MAX));
    }
    Ok(value)
}

/// Query parameters, rejected in the API's error shape (axum's own
/// rejection is plain text).
pub(crate) struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _state: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        let de = serde_urlencoded::Deserializer::new(url::form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(de).map(ApiQuery).map_err(|e| {
            let field = e.path().to_string();
            let message = e.inner().to_string();
            let field = if field == "." { message.split('`').nth(1).unwrap_or("query").to_owned() } else { field };
            ApiError::invalid_field(&field, format!("invalid query parameter {field}: {message}"))
        })
    }
}

/// Maps a body-reading failure (most often: too large) to the error shape.
pub(crate) fn body_rejection(e: BytesRejection) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        payload_too_large()
    } else {
        ApiError::bad_request("UNREADABLE_BODY", "the request body could not be read")
    }
}

/// 413 naming the limit.
pub(crate) fn payload_too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "PAYLOAD_TOO_LARGE",
        format!("the request body exceeds {BODY_LIMIT} bytes"),
    )
    .with_details(json!({ "limit_bytes": BODY_LIMIT }))
}

/// Writes numbers with no fractional part (`151.0`) as integers: JSON
/// Schema, and so the description, counts them as integers.
fn integral_numbers(value: &mut Value) {
    match value {
        Value::Number(n) if !n.is_i64() && !n.is_u64() => {
            if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15) {
                *value = Value::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_numbers),
        Value::Object(map) => map.values_mut().for_each(integral_numbers),
        _ => {}
    }
}

fn parse_value<T: DeserializeOwned>(mut value: Value) -> Result<T, ApiError> {
    integral_numbers(&mut value);
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let message = e.inner().to_string();
        // A fixed set of texts (a kind, a status) says which it allows.
        if let Some(choices) = message.strip_prefix("must be ") {
            return ApiError::invalid_field(&path, format!("{path} must be {choices}"));
        }
        // serde names the offending field in backticks; surface it.
        let field = message.split('`').nth(1).unwrap_or("").to_owned();
        ApiError::new(StatusCode::BAD_REQUEST, "VALIDATION_FAILED", format!("invalid request body: {message}"))
            .with_details(json!({ "field": field }))
    })
}

/// The caller's standing in the workspace this request addresses.
pub(crate) struct Workspace(pub WorkspaceAccess);

impl std::ops::Deref for Workspace {
    type Target = WorkspaceAccess;
    fn deref(&self) -> &WorkspaceAccess {
        &self.0
    }
}

impl FromRequestParts<AppState> for Workspace {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let principal = parts
            .extensions
            .get::<Principal>()
            .cloned()
            .ok_or_else(|| ApiError::unauthenticated("authentication required"))?;
        let from_path = match RawPathParams::from_request_parts(parts, state).await {
            Ok(params) => params.iter().find(|(k, _)| *k == "workspace_id").map(|(_, v)| v.to_owned()),
            Err(_) => None,
        };
        let from_header = parts
            .headers
            .get(WORKSPACE_HEADER)
            .map(|v| {
                v.to_str()
                    .map(str::to_owned)
                    .map_err(|_| ApiError::invalid_field(WORKSPACE_HEADER, "not a valid workspace id"))
            })
            .transpose()?;
        let from_query = Query::<WorkspaceQuery>::try_from_uri(&parts.uri).ok().and_then(|q| q.0.workspace_id);
        let requested = from_path.or(from_header).or(from_query);
        let access = WorkspaceAccess::resolve(&state.store, principal, requested).await?;
        if let Some(note) = parts.extensions.get::<AuditNote>() {
            note.workspace(&access.workspace_id);
        }
        Ok(Workspace(access))
    }
}

#[derive(Deserialize)]
struct WorkspaceQuery {
    workspace_id: Option<String>,
}

/// The authenticated caller, for endpoints that address no workspace.
pub(crate) struct Caller(pub Principal);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        parts
            .extensions
            .get::<Principal>()
            .cloned()
            .map(Caller)
            .ok_or_else(|| ApiError::unauthenticated("authentication required"))
    }
}

/// Default page size of list endpoints.
pub(crate) const DEFAULT_LIMIT: i64 = 50;
/// Largest page size of list endpoints.
pub(crate) const MAX_LIMIT: i64 = 200;

/// `limit` and `cursor` of every list endpoint.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct PageQuery {
    /// Items per page: 1 to 200, default 50.
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
    /// `next_cursor` of the previous page: the position after which the
    /// next page starts.
    #[param(pattern = r"^[A-Za-z0-9_-]{1,128}$")]
    pub cursor: Option<String>,
}

impl PageQuery {
    /// The validated page size.
    pub(crate) fn limit(&self) -> Result<i64, ApiError> {
        match self.limit {
            None => Ok(DEFAULT_LIMIT),
            Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            Some(_) => Err(ApiError::invalid_field("limit", format!("limit must be between 1 and {MAX_LIMIT}"))),
        }
    }

    /// The position the cursor names (the last id of the previous page).
    /// Any well-formed position is accepted: one past the end gives an
    /// empty page.
    pub(crate) fn after(&self) -> Result<Option<String>, ApiError> {
        match self.cursor.as_deref() {
            None => Ok(None),
            Some(c)
                if !c.is_empty()
                    && c.len() <= 128
                    && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') =>
            {
                Ok(Some(c.to_owned()))
            }
            Some(_) => Err(ApiError::invalid_field("cursor", "cursor is not one this server issued")),
        }
    }

    /// Builds a page from up to `limit + 1` fetched items: the extra item
    /// only tells that another page exists.
    pub(crate) fn page<T>(&self, mut items: Vec<T>, limit: i64, key: impl Fn(&T) -> &str) -> super::Page<T> {
        let next_cursor = if items.len() as i64 > limit {
            items.truncate(limit as usize);
            items.last().map(|last| key(last).to_owned())
        } else {
            None
        };
        super::Page { items, next_cursor }
    }
}

/// Parses an optional RFC 3339 time of a query filter into milliseconds.
pub(crate) fn parse_time(field: &str, value: Option<&str>) -> Result<Option<i64>, ApiError> {
    value
        .map(|v| {
            chrono::DateTime::parse_from_rfc3339(v)
                .map(|t| t.timestamp_millis())
                .map_err(|_| ApiError::invalid_field(field, format!("{field} must be an RFC 3339 time")))
        })
        .transpose()
}
