//! The one place where the SDK's types meet the generated WIT bindings.
//!
//! Everything else in the crate speaks the types of `types.rs`, `http.rs`
//! and `sink.rs`; a new WIT version changes this file, not connectors.

use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::bindings::exports::service::connector1_0_0::plugin::Guest;
use crate::bindings::service::connector1_0_0::{http as wit_http, log as wit_log, sink as wit_sink, types as wit};
use crate::bindings::service::connector1_1_0::http_ahead as wit_ahead;
use crate::bindings::service::connector1_2_0::http_placed as wit_http_1_2;
use crate::bindings::service::connector1_3_0::http_multi as wit_http_1_3;
use crate::connector::Connector;
use crate::http::{CredentialPlace, HttpError, Method, Placement, RequestBuilder, Response};
use crate::log::Level;
use crate::sink::SinkError;
use crate::types::{
    CheckResult, ConnectorInfo, ConnectorKind, EntityOption, Error, OAuthEndpoints, Operation, ReadRequest,
    RecordError, Stream, SyncMode, WriteMode, WriteRequest, WriteResult,
};

/// Implements the generated export trait for any [`Connector`]: parses what
/// the host sends, calls the connector, converts what it returns.
/// `export_connector!` names it; connector authors never do.
pub struct Adapter<C>(PhantomData<fn() -> C>);

impl<C: Connector> Guest for Adapter<C> {
    fn describe() -> wit::ConnectorInfo {
        C::describe().into()
    }

    fn check(config: String) -> Result<wit::CheckResult, wit::ConnectorError> {
        run(|| C::check(parse_config(&config)?)).map(Into::into)
    }

    fn discover(config: String) -> Result<Vec<wit::Stream>, wit::ConnectorError> {
        run(|| C::discover(parse_config(&config)?)).map(wire_list)
    }

    fn read(req: wit::ReadRequest) -> Result<(), wit::ConnectorError> {
        run(|| C::read(req.try_into()?))
    }

    fn entity_options(config: String, field: String) -> Result<Vec<wit::EntityOption>, wit::ConnectorError> {
        run(|| C::entity_options(parse_config(&config)?, &field)).map(wire_list)
    }

    fn preview(config: String) -> Result<String, wit::ConnectorError> {
        run(|| C::preview(parse_config(&config)?)).map(|preview| preview.to_string())
    }

    fn write(req: wit::WriteRequest) -> Result<wit::WriteResult, wit::ConnectorError> {
        run(|| C::write(req.try_into()?)).map(Into::into)
    }
}

/// Runs one operation; its error becomes the wire error. (A closure, so the
/// operation can use `?` on the SDK's own error type.)
fn run<T>(operation: impl FnOnce() -> crate::Result<T>) -> Result<T, wit::ConnectorError> {
    operation().map_err(Into::into)
}

fn wire_list<T: Into<W>, W>(items: Vec<T>) -> Vec<W> {
    items.into_iter().map(Into::into).collect()
}

fn parse_config<C: DeserializeOwned>(config: &str) -> crate::Result<C> {
    serde_json::from_str(config)
        .map_err(|e| Error::InvalidConfig(format!("the configuration does not match the connector's schema: {e}")))
}

// ---- describe ---------------------------------------------------------------

impl From<ConnectorInfo> for wit::ConnectorInfo {
    fn from(info: ConnectorInfo) -> Self {
        Self {
            id: info.id,
            name: info.name,
            version: info.version,
            kind: match info.kind {
                ConnectorKind::Source => wit::ConnectorKind::Source,
                ConnectorKind::Destination => wit::ConnectorKind::Destination,
            },
            legacy_aliases: info.legacy_aliases,
            config_schema: info.config_schema.to_string(),
            hosts: info.hosts,
            oauth: info.oauth.map(Into::into),
            operations: info.operations.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<OAuthEndpoints> for wit::OauthEndpoints {
    fn from(oauth: OAuthEndpoints) -> Self {
        Self { authorize_url: oauth.authorize_url, token_url: oauth.token_url, scopes: oauth.scopes }
    }
}

impl From<Operation> for wit::Operation {
    fn from(operation: Operation) -> Self {
        match operation {
            Operation::Check => Self::Check,
            Operation::Discover => Self::Discover,
            Operation::Read => Self::Read,
            Operation::EntityOptions => Self::EntityOptions,
            Operation::Preview => Self::Preview,
            Operation::Write => Self::Write,
        }
    }
}

// ---- errors -----------------------------------------------------------------

impl From<Error> for wit::ConnectorError {
    fn from(error: Error) -> Self {
        match error {
            Error::InvalidConfig(m) => Self::InvalidConfig(m),
            Error::InvalidCredentials(m) => Self::InvalidCredentials(m),
            Error::PermissionDenied(m) => Self::PermissionDenied(m),
            Error::RateLimited { retry_after } => Self::RateLimited(retry_after),
            Error::ProviderUnavailable(m) => Self::ProviderUnavailable(m),
            Error::ProviderError(m) => Self::ProviderError(m),
            Error::EgressDenied(m) => Self::EgressDenied(m),
            Error::Unsupported(m) => Self::Unsupported(m),
            Error::Internal(m) => Self::Internal(m),
        }
    }
}

// ---- check, discover, entity options ---------------------------------------

impl From<CheckResult> for wit::CheckResult {
    fn from(result: CheckResult) -> Self {
        Self { ok: result.ok, message: result.message, account: result.account }
    }
}

impl From<Stream> for wit::Stream {
    fn from(stream: Stream) -> Self {
        Self {
            name: stream.name,
            json_schema: stream.json_schema.to_string(),
            sync_modes: stream.sync_modes.into_iter().map(Into::into).collect(),
            cursor_fields: stream.cursor_fields,
            primary_key: stream.primary_key,
            default_cursor_field: stream.default_cursor_field,
        }
    }
}

impl From<SyncMode> for wit::SyncMode {
    fn from(mode: SyncMode) -> Self {
        match mode {
            SyncMode::FullRefresh => Self::FullRefresh,
            SyncMode::Incremental => Self::Incremental,
        }
    }
}

impl From<wit::SyncMode> for SyncMode {
    fn from(mode: wit::SyncMode) -> Self {
        match mode {
            wit::SyncMode::FullRefresh => Self::FullRefresh,
            wit::SyncMode::Incremental => Self::Incremental,
        }
    }
}

impl From<EntityOption> for wit::EntityOption {
    fn from(option: EntityOption) -> Self {
        Self { value: option.value, label: option.label, parent: option.parent }
    }
}

// ---- read -------------------------------------------------------------------

impl<C: DeserializeOwned> TryFrom<wit::ReadRequest> for ReadRequest<C> {
    type Error = Error;

    fn try_from(req: wit::ReadRequest) -> crate::Result<Self> {
        let state = req
            .state
            .map(|state| serde_json::from_str::<Value>(&state))
            .transpose()
            .map_err(|e| Error::Internal(format!("the host sent a state that is not JSON: {e}")))?;
        Ok(Self {
            config: parse_config(&req.config)?,
            stream: req.stream,
            sync_mode: req.sync_mode.into(),
            cursor_field: req.cursor_field,
            state,
        })
    }
}

// ---- write ------------------------------------------------------------------

impl<C: DeserializeOwned> TryFrom<wit::WriteRequest> for WriteRequest<C> {
    type Error = Error;

    fn try_from(req: wit::WriteRequest) -> crate::Result<Self> {
        let records = req
            .records
            .iter()
            .enumerate()
            .map(|(index, record)| {
                serde_json::from_str(record)
                    .map_err(|_| Error::Internal(format!("the host sent record {index}, which is not JSON")))
            })
            .collect::<crate::Result<Vec<Value>>>()?;
        Ok(Self {
            config: parse_config(&req.config)?,
            stream: req.stream,
            mode: match req.mode {
                wit::WriteMode::Insert => WriteMode::Insert,
                wit::WriteMode::Update => WriteMode::Update,
                wit::WriteMode::Upsert => WriteMode::Upsert,
                wit::WriteMode::Delete => WriteMode::Delete,
            },
            key_fields: req.key_fields,
            records,
        })
    }
}

impl From<WriteResult> for wit::WriteResult {
    fn from(result: WriteResult) -> Self {
        Self {
            written: result.written,
            failed: result.failed,
            errors: result.errors.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<RecordError> for wit::RecordError {
    fn from(error: RecordError) -> Self {
        Self { index: error.index, message: error.message }
    }
}

// ---- http -------------------------------------------------------------------

/// Sends through 1.0.0's `http`.
pub(crate) fn send_1_0(request: &RequestBuilder) -> Result<wit_http::Response, HttpError> {
    Ok(wit_http::send(&wit_http::Request::try_from(request)?)?)
}

/// Starts through 1.1.0's `http-ahead`.
pub(crate) fn start_1_1(request: &RequestBuilder) -> Result<Box<dyn Started>, HttpError> {
    Ok(Box::new(wit_ahead::start(&wit_http::Request::try_from(request)?)?))
}

/// How a request whose credential only 1.2.0 can place, or whose several
/// credentials only 1.3.0 can name, reaches the host. A builder holds a
/// reference to [`WIRE_1_2`] or [`WIRE_1_3`] only once a method that
/// needs it named a credential, so a plugin that never places a
/// credential in a query or a body never references 1.2.0's functions and
/// its component does not import them (it loads on hosts without 1.2.0),
/// one that never names two credentials imports nothing of 1.3.0, and
/// one that never starts a request ahead does not import `http-ahead`.
#[derive(Debug)]
pub(crate) struct Wire {
    pub(crate) send: fn(&RequestBuilder) -> Result<wit_http::Response, HttpError>,
    pub(crate) start: fn(&RequestBuilder) -> Result<Box<dyn Started>, HttpError>,
}

/// Requests through 1.2.0's `http-placed`.
pub(crate) static WIRE_1_2: Wire = Wire {
    send: |r| Ok(wit_http_1_2::send(&wit_http_1_2::Request::from(r))?),
    start: |r| Ok(Box::new(wit_http_1_2::start(&wit_http_1_2::Request::from(r))?)),
};

/// Requests through 1.3.0's `http-multi`: those naming several
/// credentials.
pub(crate) static WIRE_1_3: Wire = Wire {
    send: |r| Ok(wit_http_1_3::send(&wit_http_1_3::Request::from(r))?),
    start: |r| Ok(Box::new(wit_http_1_3::start(&wit_http_1_3::Request::from(r))?)),
};

/// A request the host is performing, of whichever interface started it.
pub(crate) trait Started: std::fmt::Debug {
    fn finish(self: Box<Self>) -> Result<wit_http::Response, HttpError>;
}

impl Started for wit_ahead::Pending {
    fn finish(self: Box<Self>) -> Result<wit_http::Response, HttpError> {
        Ok(wit_ahead::Pending::finish(*self)?)
    }
}

impl Started for wit_http_1_2::Pending {
    fn finish(self: Box<Self>) -> Result<wit_http::Response, HttpError> {
        Ok(wit_http_1_2::Pending::finish(*self)?)
    }
}

impl Started for wit_http_1_3::Pending {
    fn finish(self: Box<Self>) -> Result<wit_http::Response, HttpError> {
        Ok(wit_http_1_3::Pending::finish(*self)?)
    }
}

fn wire_method(method: Method) -> wit_http::Method {
    match method {
        Method::Get => wit_http::Method::Get,
        Method::Head => wit_http::Method::Head,
        Method::Post => wit_http::Method::Post,
        Method::Put => wit_http::Method::Put,
        Method::Patch => wit_http::Method::Patch,
        Method::Delete => wit_http::Method::Delete,
        Method::Options => wit_http::Method::Options,
    }
}

fn timeout_ms(request: &RequestBuilder) -> Option<u32> {
    request.timeout.map(|t| u32::try_from(t.as_millis()).unwrap_or(u32::MAX))
}

impl TryFrom<&RequestBuilder> for wit_http::Request {
    type Error = HttpError;

    fn try_from(request: &RequestBuilder) -> Result<Self, HttpError> {
        let credential = match request.credentials.as_slice() {
            [] => None,
            [(handle, CredentialPlace::Placed(placement))] => Some(wit_http::CredentialUse {
                handle: handle.clone(),
                placement: match placement {
                    Placement::Bearer => wit_http::CredentialPlacement::AuthorizationBearer,
                    Placement::Header(name) => wit_http::CredentialPlacement::Header(name.clone()),
                    Placement::Basic { username } => wit_http::CredentialPlacement::BasicPassword(username.clone()),
                },
            }),
            // The builder sends these through 1.2.0 or 1.3.0; never reached.
            _ => {
                return Err(HttpError::InvalidRequest(
                    "this placement, or more than one credential, needs a newer interface".into(),
                ));
            }
        };
        Ok(Self {
            method: wire_method(request.method),
            url: request.url.clone(),
            headers: request.headers.clone(),
            body: request.body.clone(),
            credential,
            timeout_ms: timeout_ms(request),
        })
    }
}

impl From<&RequestBuilder> for wit_http_1_2::Request {
    fn from(request: &RequestBuilder) -> Self {
        Self {
            method: wire_method(request.method),
            url: request.url.clone(),
            headers: request.headers.clone(),
            body: request.body.clone(),
            // The builder sends one credential at most through 1.2.0.
            credential: request.credentials.first().map(credential_use),
            timeout_ms: timeout_ms(request),
        }
    }
}

impl From<&RequestBuilder> for wit_http_1_3::Request {
    fn from(request: &RequestBuilder) -> Self {
        Self {
            method: wire_method(request.method),
            url: request.url.clone(),
            headers: request.headers.clone(),
            body: request.body.clone(),
            credentials: request.credentials.iter().map(credential_use).collect(),
            timeout_ms: timeout_ms(request),
        }
    }
}

/// A credential and its place, as 1.2.0 (and 1.3.0) name them.
fn credential_use((handle, place): &(String, CredentialPlace)) -> wit_http_1_2::CredentialUse {
    wit_http_1_2::CredentialUse {
        handle: handle.clone(),
        placement: match place {
            CredentialPlace::Placed(Placement::Bearer) => wit_http_1_2::CredentialPlacement::AuthorizationBearer,
            CredentialPlace::Placed(Placement::Header(name)) => wit_http_1_2::CredentialPlacement::Header(name.clone()),
            CredentialPlace::Placed(Placement::Basic { username }) => {
                wit_http_1_2::CredentialPlacement::BasicPassword(username.clone())
            }
            CredentialPlace::Query(name) => wit_http_1_2::CredentialPlacement::QueryParameter(name.clone()),
            CredentialPlace::BodyField(field) => wit_http_1_2::CredentialPlacement::BodyField(field.clone()),
            CredentialPlace::AsStored => wit_http_1_2::CredentialPlacement::AsStored,
        },
    }
}

impl Response {
    pub(crate) fn from_wire(response: wit_http::Response, request: String) -> Self {
        Self::from_parts(response.status, response.headers, response.body, request)
    }
}

impl From<wit_http::HttpError> for HttpError {
    fn from(error: wit_http::HttpError) -> Self {
        match error {
            wit_http::HttpError::Denied(rule) => Self::Denied(rule),
            wit_http::HttpError::InvalidRequest(m) => Self::InvalidRequest(m),
            wit_http::HttpError::Timeout => Self::Timeout,
            wit_http::HttpError::ConnectionFailed(m) => Self::ConnectionFailed(m),
            wit_http::HttpError::ResponseTooLarge => Self::ResponseTooLarge,
            wit_http::HttpError::CredentialUnavailable(m) => Self::CredentialUnavailable(m),
        }
    }
}

// ---- sink and log -----------------------------------------------------------

impl From<wit_sink::SinkError> for SinkError {
    fn from(error: wit_sink::SinkError) -> Self {
        match error {
            wit_sink::SinkError::Cancelled => Self::Cancelled,
            wit_sink::SinkError::RecordTooLarge(index) => Self::RecordTooLarge { index: index as usize },
            wit_sink::SinkError::QuotaExceeded => Self::QuotaExceeded,
            wit_sink::SinkError::Rejected(reason) => Self::Rejected(reason),
        }
    }
}

impl From<Level> for wit_log::Level {
    fn from(level: Level) -> Self {
        match level {
            Level::Trace => Self::Trace,
            Level::Debug => Self::Debug,
            Level::Info => Self::Info,
            Level::Warn => Self::Warn,
            Level::Error => Self::Error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    /// Implements only `describe` and `read`, to see what the adapter does
    /// around them.
    struct Probe;

    #[derive(Deserialize)]
    struct ProbeConfig {
        #[allow(dead_code)]
        account: u32,
    }

    impl Connector for Probe {
        type Config = ProbeConfig;

        fn describe() -> ConnectorInfo {
            ConnectorInfo::source("conn_probe", "Probe", "1.2.3")
                .with_config_schema(json!({ "type": "object" }))
                .with_operations([Operation::Read])
        }

        fn read(request: ReadRequest<ProbeConfig>) -> crate::Result<()> {
            match request.state {
                Some(state) if state == json!({ "cursor": 7 }) => Ok(()),
                other => Err(Error::Internal(format!("unexpected state {other:?}"))),
            }
        }
    }

    fn read_request(config: &str, state: Option<&str>) -> wit::ReadRequest {
        wit::ReadRequest {
            config: config.into(),
            stream: "things".into(),
            sync_mode: wit::SyncMode::Incremental,
            cursor_field: None,
            state: state.map(Into::into),
        }
    }

    #[test]
    fn describe_sends_the_schema_as_json_text() {
        let info = Adapter::<Probe>::describe();
        assert_eq!(info.id, "conn_probe");
        assert_eq!(info.config_schema, r#"{"type":"object"}"#);
        assert!(matches!(info.operations[..], [wit::Operation::Read]));
    }

    #[test]
    fn a_config_that_does_not_parse_is_invalid_config() {
        let result = Adapter::<Probe>::read(read_request(r#"{"account":"x"}"#, None));
        assert!(matches!(result, Err(wit::ConnectorError::InvalidConfig(_))));
    }

    #[test]
    fn operations_left_out_are_unsupported() {
        let result = Adapter::<Probe>::discover(r#"{"account":1}"#.into());
        assert!(matches!(result, Err(wit::ConnectorError::Unsupported(_))));
    }

    #[test]
    fn state_reaches_the_connector_as_json() {
        let result = Adapter::<Probe>::read(read_request(r#"{"account":1}"#, Some(r#"{"cursor":7}"#)));
        assert!(result.is_ok(), "{result:?}");
    }

    #[test]
    fn errors_keep_their_variant_on_the_wire() {
        let wire: wit::ConnectorError = Error::RateLimited { retry_after: Some(9) }.into();
        assert!(matches!(wire, wit::ConnectorError::RateLimited(Some(9))));
    }
}
