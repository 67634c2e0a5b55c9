//! `egress`: one request exactly as the test wrote it, sent through the
//! host's `http` import without the SDK's guard rails, so the test sees the
//! host's own verdict (for example on an `Authorization` header the plugin
//! sets itself).
//!
//! The request is the config's `request` object:
//!
//! ```json
//! {
//!   "method": "GET",                         // any WIT method, any case; default GET
//!   "url": "https://api.provider.test/x",     // required
//!   "headers": [["x-name", "value"]],         // optional
//!   "credential": {                           // optional
//!     "handle": "cred_...",
//!     "placement": "bearer" | {"header": "x-api-key"} | {"basic": "user"}
//!                | {"query": "api_key"} | {"body": "password"} | "as-stored"
//!   },
//!   "credentials": [{"handle", "placement"}], // optional, instead
//!   "body": "text",                           // optional
//!   "timeout_ms": 5000                        // optional
//! }
//! ```
//!
//! A request that names `credentials` (a list, any length, handles
//! repeated as written) goes through `http-multi@1.3.0`; one whose
//! credential goes into a query parameter or a body field through
//! `http-placed@1.2.0`; every other through `http@1.0.0`.
//!
//! The outcome is `{"ok": {"status", "headers", "body"}}` (body as lossy
//! UTF-8, and as `body_hex` too when it is not text) or `{"error": {"kind", "message"}}` with the WIT error case as
//! `kind`.
//!
//! `egress_timed` sends the same request many times in one invocation and
//! times each inside the guest ([`send_timed`]), for the runtime benchmark.

use serde_json::{Value, json};

use crate::bindings::service::connector1_0_0::http::{self, CredentialPlacement, CredentialUse, HttpError, Method};
use crate::bindings::service::connector1_2_0::http_placed as http_1_2;
use crate::bindings::service::connector1_3_0::http_multi as http_1_3;

/// A request in the interface version that can say it.
pub enum Request {
    V1_0(http::Request),
    V1_2(http_1_2::Request),
    V1_3(http_1_3::Request),
}

impl Request {
    fn send(&self) -> Result<http::Response, HttpError> {
        match self {
            Request::V1_0(r) => http::send(r),
            Request::V1_2(r) => http_1_2::send(r),
            Request::V1_3(r) => http_1_3::send(r),
        }
    }
}
use crate::bindings::service::connector1_0_0::types::ConnectorError;
use crate::config::invalid_config;

/// Turns the config's `request` object into a WIT request.
pub fn parse_request(request: &Value) -> Result<Request, ConnectorError> {
    let object = request.as_object().ok_or_else(|| invalid_config("request: expected an object"))?;
    let field = |name: &str| object.get(name).filter(|value| !value.is_null());

    let method = match field("method") {
        None => Method::Get,
        Some(Value::String(name)) => parse_method(name)?,
        Some(_) => return Err(invalid_config("request.method: expected a string")),
    };
    let url = field("url")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid_config("request.url: required, a string"))?
        .to_owned();
    let headers = match field("headers") {
        None => Vec::new(),
        Some(Value::Array(pairs)) => pairs.iter().map(parse_header).collect::<Result<Vec<_>, _>>()?,
        Some(_) => {
            return Err(invalid_config("request.headers: expected a list of [name, value] pairs"));
        }
    };
    let body = match field("body") {
        None => None,
        Some(Value::String(text)) => Some(text.clone().into_bytes()),
        Some(_) => return Err(invalid_config("request.body: expected a string")),
    };
    let credential = field("credential").map(parse_credential).transpose()?;
    let newer = match &credential {
        Some((handle, Place::Query(name))) => Some(http_1_2::CredentialPlacement::QueryParameter(name.clone()))
            .map(|placement| http_1_2::CredentialUse { handle: handle.clone(), placement }),
        Some((handle, Place::Body(field))) => Some(http_1_2::CredentialPlacement::BodyField(field.clone()))
            .map(|placement| http_1_2::CredentialUse { handle: handle.clone(), placement }),
        Some((handle, Place::AsStored)) => {
            Some(http_1_2::CredentialUse { handle: handle.clone(), placement: http_1_2::CredentialPlacement::AsStored })
        }
        _ => None,
    };
    let timeout_ms = match field("timeout_ms") {
        None => None,
        Some(value) => Some(
            value
                .as_u64()
                .and_then(|ms| u32::try_from(ms).ok())
                .ok_or_else(|| invalid_config("request.timeout_ms: expected a u32"))?,
        ),
    };
    if let Some(listed) = field("credentials") {
        let credentials = listed
            .as_array()
            .ok_or_else(|| invalid_config("request.credentials: expected a list"))?
            .iter()
            .map(|c| parse_credential(c).map(|(handle, place)| placed(handle, place)))
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Request::V1_3(http_1_3::Request { method, url, headers, body, credentials, timeout_ms }));
    }
    if let Some(credential) = newer {
        return Ok(Request::V1_2(http_1_2::Request {
            method,
            url,
            headers,
            body,
            credential: Some(credential),
            timeout_ms,
        }));
    }
    let credential = credential.map(|(handle, place)| match place {
        Place::Old(placement) => CredentialUse { handle, placement },
        Place::Query(_) | Place::Body(_) | Place::AsStored => unreachable!("sent through 1.2.0 above"),
    });
    Ok(Request::V1_0(http::Request { method, url, headers, body, credential, timeout_ms }))
}

/// A credential and its place as 1.2.0 (and 1.3.0) name them.
fn placed(handle: String, place: Place) -> http_1_2::CredentialUse {
    let placement = match place {
        Place::Old(CredentialPlacement::AuthorizationBearer) => http_1_2::CredentialPlacement::AuthorizationBearer,
        Place::Old(CredentialPlacement::Header(name)) => http_1_2::CredentialPlacement::Header(name),
        Place::Old(CredentialPlacement::BasicPassword(user)) => http_1_2::CredentialPlacement::BasicPassword(user),
        Place::Query(name) => http_1_2::CredentialPlacement::QueryParameter(name),
        Place::Body(field) => http_1_2::CredentialPlacement::BodyField(field),
        Place::AsStored => http_1_2::CredentialPlacement::AsStored,
    };
    http_1_2::CredentialUse { handle, placement }
}

/// Where the test asks for the credential.
enum Place {
    Old(CredentialPlacement),
    Query(String),
    Body(String),
    AsStored,
}

fn parse_method(name: &str) -> Result<Method, ConnectorError> {
    Ok(match name.to_ascii_uppercase().as_str() {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "PATCH" => Method::Patch,
        "DELETE" => Method::Delete,
        "OPTIONS" => Method::Options,
        _ => {
            return Err(invalid_config(format!("request.method: unknown method {name:?}")));
        }
    })
}

fn parse_header(pair: &Value) -> Result<(String, String), ConnectorError> {
    match pair.as_array().map(Vec::as_slice) {
        Some([Value::String(name), Value::String(value)]) => Ok((name.clone(), value.clone())),
        _ => Err(invalid_config("request.headers: every entry must be [name, value], two strings")),
    }
}

fn parse_credential(credential: &Value) -> Result<(String, Place), ConnectorError> {
    let handle = credential
        .get("handle")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid_config("request.credential.handle: required, a string"))?
        .to_owned();
    let placement = match credential.get("placement") {
        None | Some(Value::Null) => Place::Old(CredentialPlacement::AuthorizationBearer),
        Some(Value::String(name)) if name == "bearer" => Place::Old(CredentialPlacement::AuthorizationBearer),
        Some(Value::String(name)) if name == "as-stored" => Place::AsStored,
        Some(Value::Object(place)) if place.len() == 1 => match place.iter().next() {
            Some((key, Value::String(v))) if key == "header" => Place::Old(CredentialPlacement::Header(v.clone())),
            Some((key, Value::String(v))) if key == "basic" => {
                Place::Old(CredentialPlacement::BasicPassword(v.clone()))
            }
            Some((key, Value::String(v))) if key == "query" => Place::Query(v.clone()),
            Some((key, Value::String(v))) if key == "body" => Place::Body(v.clone()),
            _ => return Err(bad_placement()),
        },
        Some(_) => return Err(bad_placement()),
    };
    Ok((handle, placement))
}

fn bad_placement() -> ConnectorError {
    invalid_config(
        r#"request.credential.placement: expected "bearer", {"header": name}, {"basic": username}, {"query": name}, {"body": field} or "as-stored""#,
    )
}

/// Sends the request and describes the outcome; never fails itself.
pub fn send(request: &Request) -> Value {
    match request.send() {
        Ok(response) => {
            let mut ok = json!({
                "status": response.status,
                "headers": response.headers,
                "body": String::from_utf8_lossy(&response.body),
            });
            // Bytes that are not text are given exactly too, so a test can
            // decode them as a plugin would (a compressed body, say).
            if std::str::from_utf8(&response.body).is_err() {
                ok["body_hex"] = Value::String(response.body.iter().map(|b| format!("{b:02x}")).collect());
            }
            json!({ "ok": ok })
        }
        Err(error) => {
            let (kind, message) = kind_of(error);
            json!({ "error": { "kind": kind, "message": message } })
        }
    }
}

/// The WIT error case's name, and what it says.
fn kind_of(error: HttpError) -> (&'static str, String) {
    match error {
        HttpError::Denied(rule) => ("denied", rule),
        HttpError::InvalidRequest(why) => ("invalid-request", why),
        HttpError::Timeout => ("timeout", "no complete response within the timeout".into()),
        HttpError::ConnectionFailed(why) => ("connection-failed", why),
        HttpError::ResponseTooLarge => ("response-too-large", "the response exceeded the host's size limit".into()),
        HttpError::CredentialUnavailable(why) => ("credential-unavailable", why),
    }
}

/// `egress_timed`: sends `request` `times` times in one invocation and
/// times each send inside the guest with the monotonic clock, so a
/// benchmark sees what a request costs a plugin that is already running
/// (a connector makes all the requests of a read in one invocation).
/// Every answer must be a 2xx, and the first that is not, or a request
/// that fails, fails the call; the outcome is `{"nanos": [...]}`, one
/// figure per request, in order.
pub fn send_timed(request: &Request, times: u64) -> Result<Value, ConnectorError> {
    let mut nanos = Vec::with_capacity(usize::try_from(times).unwrap_or(0).min(1 << 20));
    for i in 0..times {
        let started = std::time::Instant::now();
        let outcome = request.send();
        let took = started.elapsed();
        match outcome {
            Ok(response) if (200..300).contains(&response.status) => {}
            Ok(response) => {
                return Err(ConnectorError::ProviderError(format!("request {i} answered {}", response.status)));
            }
            Err(error) => {
                return Err(ConnectorError::ProviderUnavailable(format!("request {i} failed: {}", kind_of(error).0)));
            }
        }
        nanos.push(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
    }
    Ok(json!({ "nanos": nanos }))
}
