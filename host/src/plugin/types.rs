//! The host's own types for what crosses the plugin boundary.
//!
//! Every supported WIT version converts to and from these in its binding
//! module (`v1`, ...), so the rest of the host never sees generated types
//! and a new interface version does not ripple through the code base.

use serde::Serialize;
use utoipa::ToSchema;

use crate::egress::HostPattern;

/// Which way data flows through a connector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConnectorKind {
    Source,
    Destination,
}

/// An operation a connector can offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    Check,
    Discover,
    Read,
    EntityOptions,
    Preview,
    Write,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Check => "check",
            Operation::Discover => "discover",
            Operation::Read => "read",
            Operation::EntityOptions => "entity_options",
            Operation::Preview => "preview",
            Operation::Write => "write",
        }
    }
}

/// A provider's OAuth 2.0 endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct OAuthEndpoints {
    pub authorize_url: String,
    pub token_url: String,
    pub scopes: Vec<String>,
}

/// What a connector says about itself.
#[derive(Debug, Clone)]
pub struct ConnectorInfo {
    pub id: String,
    pub name: String,
    pub version: String,
    pub kind: ConnectorKind,
    pub legacy_aliases: Vec<String>,
    /// The configuration's JSON Schema (parsed).
    pub config_schema: serde_json::Value,
    pub hosts: Vec<HostPattern>,
    pub oauth: Option<OAuthEndpoints>,
    pub operations: Vec<Operation>,
}

/// Why a connector operation failed, as the connector reports it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectorError {
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    #[error("invalid credentials: {0}")]
    InvalidCredentials(String),
    #[error("permission denied by the provider: {0}")]
    PermissionDenied(String),
    #[error("rate limited by the provider")]
    RateLimited(Option<u32>),
    #[error("provider unavailable: {0}")]
    ProviderUnavailable(String),
    #[error("provider error: {0}")]
    ProviderError(String),
    #[error("egress denied: {0}")]
    EgressDenied(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("connector internal error: {0}")]
    Internal(String),
}

/// How a stream can be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SyncMode {
    FullRefresh,
    Incremental,
}

/// One readable collection of records.
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema)]
pub(crate) struct Stream {
    pub name: String,
    /// JSON Schema of one record.
    pub json_schema: serde_json::Value,
    pub sync_modes: Vec<SyncMode>,
    pub cursor_fields: Vec<String>,
    pub primary_key: Vec<String>,
    pub default_cursor_field: Option<String>,
}

/// What a read should read.
#[derive(Debug, Clone)]
pub struct ReadRequest {
    pub config: String,
    pub stream: String,
    pub sync_mode: SyncMode,
    pub cursor_field: Option<String>,
    pub state: Option<String>,
}

/// Whether a checkpoint advances a stream past `saved` (the state already
/// saved): one that says the same, as JSON values whatever their spacing,
/// does not. The host's rule for an append: records are written only
/// together with a state that advances, so a resume never reads again
/// what was written. The conformance suite checks connectors by it.
pub(crate) fn advances(saved: Option<&str>, checkpoint: &str) -> bool {
    let Some(saved) = saved else { return true };
    match (serde_json::from_str::<serde_json::Value>(saved), serde_json::from_str::<serde_json::Value>(checkpoint)) {
        (Ok(a), Ok(b)) => a != b,
        _ => saved != checkpoint,
    }
}

/// The config key under which the host hands `entity-options` what the
/// provider said about the credential's account when it was authorised
/// (for OAuth, ids such as `hub_id` and `user_id`). The host's alone: a
/// client cannot set it, and no other call gets it.
pub(crate) const CREDENTIAL_ACCOUNT: &str = "credential_account";

/// A provider-backed choice for a config field.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct EntityOption {
    pub value: String,
    pub label: String,
    pub parent: Option<String>,
}

/// Outcome of a check that ran to completion.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CheckResult {
    pub ok: bool,
    pub message: String,
    /// Non-secret description of the account.
    pub account: Option<String>,
}

/// How a write applies records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WriteMode {
    Insert,
    Update,
    Upsert,
    Delete,
}

/// What a write should write.
#[derive(Debug, Clone)]
pub struct WriteRequest {
    pub config: String,
    pub stream: String,
    pub mode: WriteMode,
    pub key_fields: Vec<String>,
    pub records: Vec<String>,
}

/// One failed record of a write.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RecordError {
    pub index: u32,
    pub message: String,
}

/// Outcome of a write.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WriteResult {
    pub written: u32,
    pub failed: u32,
    pub errors: Vec<RecordError>,
}

/// Why the host refused a sink call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkRefusal {
    Cancelled,
    RecordTooLarge(u32),
    QuotaExceeded,
    Rejected(String),
}
