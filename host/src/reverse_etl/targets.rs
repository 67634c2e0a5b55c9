//! Where activations send records: a connector plugin's writable object
//! (through `plugin.write` and its credential handle), or an HTTPS
//! endpoint (kind `webhook` in the API) that receives batches of JSON through the same egress policy as
//! plugins (vetted hosts, the host injects the credential, no private
//! addresses).
//!
//! A connector says what it can write in the JSON Schema of a stream it
//! discovers: the top-level `x-write-keys` lists the fields that match a
//! record to an existing object (the default first), and properties
//! marked `readOnly: true` cannot be written.
//!
//! An endpoint receives `POST` requests with the body
//! `{"activation_id", "run_id", "operation", "records":
//! [{"key", "fields"}]}`, where `operation` is `upsert`, `update`,
//! `insert` or `delete`. A 2xx answer accepts the batch, except the
//! records it lists as `{"rejected": [{"index", "reason"}]}`; a 429 is
//! retried after its `Retry-After`; a 5xx or no answer fails the attempt
//! (the run is retried); any other answer fails every record of the
//! batch, which is sent again on the next run.

use std::time::Duration;

use serde_json::{Map, Value, json};
use url::Url;

use crate::egress::receiver::check_receiver_url;
use crate::egress::{Caller, CredentialUse, EgressError, HostPattern, Method, OutboundRequest, Reach};
use crate::error::{ApiError, ApiResult};
use crate::plugin::InvocationError;
use crate::plugin::connector::Connector;
use crate::plugin::types::{Operation, WriteMode, WriteRequest};
use crate::retry::Transient;
use crate::state::AppState;
use crate::store::kinds::RetlDestinationKind;
use crate::store::reverse_etl::RetlDestination;
use tokio_util::sync::CancellationToken;

/// The egress caller name of endpoint requests (credentials bound to a
/// connector cannot be used by it).
pub(crate) const ENDPOINT_CALLER: &str = "webhook";

/// Records per request to an endpoint.
const ENDPOINT_BATCH: usize = 500;
/// Records per `plugin.write` call.
const CONNECTOR_BATCH: usize = 100;
/// Waits for a webhook's `Retry-After`, at most this long each, this many times.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(60);
const RATE_LIMIT_RETRIES: usize = 3;

/// How records are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Insert,
    Update,
    Upsert,
    Delete,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Insert => "insert",
            Op::Update => "update",
            Op::Upsert => "upsert",
            Op::Delete => "delete",
        }
    }

    fn write_mode(self) -> WriteMode {
        match self {
            Op::Insert => WriteMode::Insert,
            Op::Update => WriteMode::Update,
            Op::Upsert => WriteMode::Upsert,
            Op::Delete => WriteMode::Delete,
        }
    }
}

/// Why a batch was not sent at all.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum SendError {
    /// It may work later (rate limits, outages, time-outs): the run is
    /// retried.
    #[error("{0}")]
    Transient(String),
    /// It will not work as configured: the run fails.
    #[error("{0}")]
    Permanent(String),
    /// The run was cancelled while the batch was under way.
    #[error("the run was cancelled")]
    Cancelled,
}

impl Transient for SendError {
    /// Only what may work later: a cancelled run is not tried again.
    fn is_transient(&self) -> bool {
        matches!(self, SendError::Transient(_))
    }
}

/// Why a destination could not be opened for sending, kept typed until the
/// caller's boundary.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// Its configuration is not valid (the caller's to fix).
    #[error("{}", .0.message)]
    Invalid(ApiError),
    /// Its connector could not be reached or refused.
    #[error(transparent)]
    Connector(#[from] InvocationError),
    /// Its credential (in the named field) cannot be used.
    #[error("{1}")]
    Credential(&'static str, crate::credentials::HandleError),
}

impl Transient for TargetError {
    /// Whether another attempt may succeed.
    fn is_transient(&self) -> bool {
        match self {
            TargetError::Invalid(_) => false,
            TargetError::Connector(e) => e.is_transient(),
            TargetError::Credential(_, e) => matches!(e, crate::credentials::HandleError::Store(_)),
        }
    }
}

impl From<ApiError> for TargetError {
    fn from(e: ApiError) -> Self {
        TargetError::Invalid(e)
    }
}

impl From<TargetError> for ApiError {
    fn from(e: TargetError) -> ApiError {
        match e {
            TargetError::Invalid(e) => e,
            TargetError::Connector(e) => e.into(),
            TargetError::Credential(field, e) => e.at(field),
        }
    }
}

/// What a connector's writable object accepts.
#[derive(Debug, Clone)]
pub(crate) struct Writable {
    /// The fields it can write.
    pub fields: Vec<String>,
    /// The fields that can match a record to an existing object, the
    /// default first.
    pub keys: Vec<String>,
}

/// Reads `x-write-keys` and `readOnly` from a stream's schema; `None` when
/// the stream cannot be written.
pub(crate) fn writable(schema: &Value) -> Option<Writable> {
    let keys: Vec<String> =
        schema.get("x-write-keys")?.as_array()?.iter().filter_map(|k| k.as_str().map(str::to_owned)).collect();
    if keys.is_empty() {
        return None;
    }
    let fields = schema["properties"]
        .as_object()
        .map(|p| {
            p.iter()
                .filter(|(_, s)| s.get("readOnly").and_then(Value::as_bool) != Some(true))
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default();
    Some(Writable { fields, keys })
}

/// A destination ready to receive records.
pub(crate) enum Target {
    Connector {
        connector: Connector,
        /// The connector's configuration (JSON text, handles only).
        config: String,
        object: String,
        writable: Writable,
        match_field: String,
    },
    /// An HTTPS endpoint (kind `webhook` in the API).
    Endpoint {
        url: Url,
        /// The handle, and where its kind puts the secret.
        credential: Option<CredentialUse>,
        hosts: Vec<HostPattern>,
    },
}

/// A connector destination's configuration.
struct ConnectorSettings<'a> {
    connector_id: &'a str,
    object: &'a str,
    match_field: Option<&'a str>,
    configuration: &'a Value,
}

fn connector_settings(config: &Value) -> ApiResult<ConnectorSettings<'_>> {
    let obj = config
        .as_object()
        .ok_or_else(|| ApiError::invalid_field("configuration", "configuration must be an object"))?;
    if let Some(k) =
        obj.keys().find(|k| !["connector_id", "object", "match_field", "configuration"].contains(&k.as_str()))
    {
        return Err(ApiError::invalid_field(
            &format!("configuration.{k}"),
            format!(
                "unknown field {k}; a connector destination takes connector_id, object, match_field and configuration"
            ),
        ));
    }
    let text = |k: &str| obj.get(k).and_then(Value::as_str);
    Ok(ConnectorSettings {
        connector_id: text("connector_id")
            .ok_or_else(|| ApiError::invalid_field("configuration.connector_id", "connector_id is required"))?,
        object: text("object").ok_or_else(|| {
            ApiError::invalid_field(
                "configuration.object",
                "object is required: the connector's writable stream, for example subscribers",
            )
        })?,
        match_field: text("match_field"),
        configuration: obj.get("configuration").filter(|c| c.is_object()).ok_or_else(|| {
            ApiError::invalid_field(
                "configuration.configuration",
                "configuration must be the connector's configuration object",
            )
        })?,
    })
}

/// The URL and credential of a webhook destination, checked: HTTPS on
/// port 443, a host name the operator allows webhooks to reach
/// (`SERVICE_WEBHOOK_ALLOWED_HOSTS`, not the connectors' list), no
/// user-info, query or fragment (a secret goes in a credential handle).
fn endpoint_settings(state: &AppState, config: &Value) -> ApiResult<(Url, Option<String>)> {
    let obj = config
        .as_object()
        .ok_or_else(|| ApiError::invalid_field("configuration", "configuration must be an object"))?;
    if let Some(k) = obj.keys().find(|k| !["url", "credential_handle"].contains(&k.as_str())) {
        return Err(ApiError::invalid_field(
            &format!("configuration.{k}"),
            format!("unknown field {k}; a webhook takes url and credential_handle"),
        ));
    }
    let raw = obj
        .get("url")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid_field("configuration.url", "url is required"))?;
    let (url, _) = check_receiver_url(state.egress.policy(), raw).map_err(|e| e.at("configuration.url"))?;
    let handle = crate::warehouse::config::optional_handle(obj)?;
    Ok((url, handle))
}

impl Target {
    /// Opens a destination for sending, checking what it says against
    /// the connector (which must offer `write` and this writable object).
    pub(crate) async fn open(
        state: &AppState,
        workspace_id: &str,
        dest: &RetlDestination,
    ) -> Result<Target, TargetError> {
        match dest.kind {
            RetlDestinationKind::Endpoint => {
                let (url, credential_handle) = endpoint_settings(state, &dest.configuration)?;
                let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
                let hosts =
                    vec![HostPattern::parse(&host).map_err(|m| ApiError::invalid_field("configuration.url", m))?];
                let credential = match credential_handle {
                    Some(handle) => {
                        let record = state
                            .vault
                            .require_handle(
                                workspace_id,
                                &crate::store::credentials::CredentialHandle::new(handle.as_str()),
                                Some(&host),
                            )
                            .await
                            .map_err(|e| TargetError::Credential("configuration.credential_handle", e))?;
                        // The egress layer would refuse it at the first send;
                        // say so when the destination is made.
                        if let Some(connector) = &record.connector_id {
                            return Err(TargetError::Invalid(ApiError::invalid_field(
                                "configuration.credential_handle",
                                format!(
                                    "this credential is bound to connector {connector}, so only that connector may use it; a webhook takes a credential bound to no connector"
                                ),
                            )));
                        }
                        let placement = crate::credentials::vault::placement(&record)
                            .map_err(|m| ApiError::invalid_field("configuration.credential_handle", m.to_string()))?;
                        Some(CredentialUse { handle: record.credential_handle.clone(), placement })
                    }
                    None => None,
                };
                Ok(Target::Endpoint { url, credential, hosts })
            }
            RetlDestinationKind::Connector => {
                let s = connector_settings(&dest.configuration)?;
                let connector = state.plugins.connector(s.connector_id, workspace_id).await?;
                if !connector.plugin().info.operations.contains(&Operation::Write) {
                    return Err(TargetError::Invalid(ApiError::invalid_field(
                        "configuration.connector_id",
                        format!("connector {} cannot write records", connector.plugin().plugin_id),
                    )));
                }
                let config = s.configuration.to_string();
                let streams = connector.discover(&config).await?;
                let writable =
                    streams.iter().find(|st| st.name == s.object).and_then(|st| writable(&st.json_schema)).ok_or_else(
                        || {
                            let offered: Vec<&str> = streams
                                .iter()
                                .filter(|st| writable(&st.json_schema).is_some())
                                .map(|st| st.name.as_str())
                                .collect();
                            ApiError::invalid_field(
                                "configuration.object",
                                format!("the connector cannot write {}; it writes: {}", s.object, offered.join(", ")),
                            )
                        },
                    )?;
                let match_field = match s.match_field {
                    None => writable.keys[0].clone(),
                    Some(f) if writable.keys.iter().any(|k| k == f) => f.to_owned(),
                    Some(f) => {
                        return Err(TargetError::Invalid(ApiError::invalid_field(
                            "configuration.match_field",
                            format!("{} records are matched by {}, not {f}", s.object, writable.keys.join(" or ")),
                        )));
                    }
                };
                Ok(Target::Connector { connector, config, object: s.object.to_owned(), writable, match_field })
            }
        }
    }

    /// The connector id and its configuration, for the checks a source
    /// configuration of that connector gets.
    pub(crate) fn connector_configuration(config: &Value) -> ApiResult<(String, Value)> {
        let s = connector_settings(config)?;
        Ok((s.connector_id.to_owned(), s.configuration.clone()))
    }

    /// The field a record is matched by at the destination, if any.
    pub(crate) fn match_field(&self) -> Option<&str> {
        match self {
            Target::Connector { match_field, .. } => Some(match_field),
            Target::Endpoint { .. } => None,
        }
    }

    /// The fields the destination can write; `None` when it takes any.
    pub(crate) fn fields(&self) -> Option<&[String]> {
        match self {
            Target::Connector { writable, .. } => Some(&writable.fields),
            Target::Endpoint { .. } => None,
        }
    }

    /// How many records go in one call.
    pub(crate) fn batch_size(&self) -> usize {
        match self {
            Target::Connector { .. } => CONNECTOR_BATCH,
            Target::Endpoint { .. } => ENDPOINT_BATCH,
        }
    }

    /// Sends one batch. Per record: `None` when accepted, else why not.
    /// Stops as soon as `cancel` fires, also while waiting for a
    /// `Retry-After`.
    pub(crate) async fn send(
        &self,
        state: &AppState,
        workspace_id: &str,
        ids: (&str, &str),
        op: Op,
        records: &[(String, Map<String, Value>)],
        cancel: &CancellationToken,
    ) -> Result<Vec<Option<String>>, SendError> {
        tokio::select! {
            sent = self.send_batch(state, workspace_id, ids, op, records) => sent,
            () = cancel.cancelled() => Err(SendError::Cancelled),
        }
    }

    async fn send_batch(
        &self,
        state: &AppState,
        workspace_id: &str,
        ids: (&str, &str),
        op: Op,
        records: &[(String, Map<String, Value>)],
    ) -> Result<Vec<Option<String>>, SendError> {
        match self {
            Target::Connector { connector, config, object, match_field, .. } => {
                let req = WriteRequest {
                    config: config.clone(),
                    stream: object.clone(),
                    mode: op.write_mode(),
                    key_fields: vec![match_field.clone()],
                    records: records.iter().map(|(_, r)| Value::Object(r.clone()).to_string()).collect(),
                };
                let result = connector.write(&req).await.map_err(invocation_failure)?;
                let mut outcome = vec![None; records.len()];
                for e in result.errors {
                    if let Some(slot) = outcome.get_mut(e.index as usize) {
                        *slot = Some(short(&e.message));
                    }
                }
                Ok(outcome)
            }
            Target::Endpoint { url, credential, hosts } => {
                let body = json!({
                    "activation_id": ids.0,
                    "run_id": ids.1,
                    "operation": op.as_str(),
                    "records": records.iter().map(|(key, fields)| json!({ "key": key, "fields": fields })).collect::<Vec<_>>(),
                });
                let caller =
                    Caller { plugin_id: ENDPOINT_CALLER, declared_hosts: hosts, workspace_id, reach: Reach::Receivers };
                let request = OutboundRequest {
                    method: Method::Post,
                    url: url.to_string(),
                    headers: vec![("content-type".into(), "application/json".into())],
                    body: Some(body.to_string().into_bytes()),
                    credentials: credential.iter().cloned().collect(),
                    timeout_ms: None,
                };
                let mut tries = 0;
                loop {
                    let answer = state.egress.send(&caller, request.clone()).await.map_err(egress_failure)?;
                    match answer.status {
                        200..=299 => return Ok(rejections(&answer.body, records.len())),
                        429 if tries < RATE_LIMIT_RETRIES => {
                            tries += 1;
                            let wait = answer
                                .headers
                                .iter()
                                .find(|(n, _)| n == "retry-after")
                                .and_then(|(_, v)| v.trim().parse::<u64>().ok())
                                .unwrap_or(1);
                            tokio::time::sleep(Duration::from_secs(wait).min(RETRY_AFTER_CAP)).await;
                        }
                        429 => return Err(SendError::Transient("the webhook is rate-limiting".into())),
                        s @ 500..=599 => return Err(SendError::Transient(format!("the webhook failed (HTTP {s})"))),
                        s => return Ok(vec![Some(format!("the webhook refused the batch (HTTP {s})")); records.len()]),
                    }
                }
            }
        }
    }
}

/// A message cut to a length fit for a run's samples.
pub(crate) fn short(s: &str) -> String {
    s.chars().take(300).collect()
}

/// The records a webhook's 2xx answer rejects.
fn rejections(body: &[u8], n: usize) -> Vec<Option<String>> {
    let mut outcome = vec![None; n];
    let Ok(answer) = serde_json::from_slice::<Value>(body) else { return outcome };
    for r in answer["rejected"].as_array().into_iter().flatten() {
        if let Some(i) = r["index"].as_u64().and_then(|i| usize::try_from(i).ok())
            && let Some(slot) = outcome.get_mut(i)
        {
            *slot = Some(short(r["reason"].as_str().unwrap_or("rejected by the webhook")));
        }
    }
    outcome
}

fn invocation_failure(e: InvocationError) -> SendError {
    let message = short(&e.to_string());
    if e.is_transient() { SendError::Transient(message) } else { SendError::Permanent(message) }
}

fn egress_failure(e: EgressError) -> SendError {
    match e {
        EgressError::Timeout | EgressError::ConnectionFailed(_) => SendError::Transient(short(&e.to_string())),
        other => SendError::Permanent(short(&other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writable_object_is_read_from_its_schema() {
        let schema = json!({
            "x-write-keys": ["email", "uuid"],
            "properties": { "email": {}, "first_name": {}, "uuid": { "readOnly": true }, "created_at": { "readOnly": true } }
        });
        let w = writable(&schema).unwrap();
        assert_eq!(w.keys, vec!["email", "uuid"]);
        assert_eq!(w.fields, vec!["email", "first_name"]);
        assert!(writable(&json!({ "properties": { "a": {} } })).is_none(), "no write keys: not writable");
    }

    #[test]
    fn a_webhook_answer_rejects_only_the_records_it_names() {
        let got = rejections(br#"{"rejected":[{"index":1,"reason":"bad email"},{"index":9}]}"#, 3);
        assert_eq!(got, vec![None, Some("bad email".to_owned()), None]);
        assert_eq!(rejections(b"not json", 2), vec![None, None]);
    }
}
