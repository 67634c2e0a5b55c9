//! The values a connector exchanges with the host, as plain Rust types.
//!
//! They mirror the records of the WIT package `service:connector` (see
//! `wit/connector@1.0.0/types.wit`) but use Rust idioms: JSON as
//! [`serde_json::Value`] instead of text, builders instead of long literals,
//! and one [`Error`] type that works with `?`. The translation to and from
//! the generated bindings lives in `convert.rs` and nowhere else.

use std::fmt;

use serde::de::DeserializeOwned;
use serde_json::Value;

/// The result type of every connector operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Whether a connector reads from a provider or writes to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectorKind {
    /// Reads data from a provider into the platform.
    Source,
    /// Writes data from the platform to a provider.
    Destination,
}

/// An operation a connector can offer. List the ones you implement in
/// [`ConnectorInfo::with_operations`]; the host calls nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// [`Connector::check`](crate::Connector::check).
    Check,
    /// [`Connector::discover`](crate::Connector::discover).
    Discover,
    /// [`Connector::read`](crate::Connector::read).
    Read,
    /// [`Connector::entity_options`](crate::Connector::entity_options).
    EntityOptions,
    /// [`Connector::preview`](crate::Connector::preview).
    Preview,
    /// [`Connector::write`](crate::Connector::write).
    Write,
}

/// The OAuth 2.0 endpoints of a provider. The host runs the authorization
/// code flow with them; the connector only ever sees a credential handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthEndpoints {
    /// The authorization endpoint (https URL).
    pub authorize_url: String,
    /// The token endpoint (https URL), also used to refresh tokens.
    pub token_url: String,
    /// The scopes to request.
    pub scopes: Vec<String>,
}

/// What a connector says about itself; returned by
/// [`Connector::describe`](crate::Connector::describe).
///
/// ```
/// use connector_sdk::{ConnectorInfo, Operation, json};
///
/// let info = ConnectorInfo::source("conn_example_notes", "Notes", "0.1.0")
///     .with_hosts(["api.notes.example"])
///     .with_operations([Operation::Check, Operation::Discover, Operation::Read])
///     .with_config_schema(json!({
///         "type": "object",
///         "required": ["credential_handle"],
///         "properties": { "credential_handle": { "type": "string" } }
///     }));
/// assert_eq!(info.hosts, ["api.notes.example"]);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectorInfo {
    /// The stable connector id, for example `conn_emailcampaign_edm`.
    pub id: String,
    /// A human-readable name.
    pub name: String,
    /// The plugin's version; `env!("CARGO_PKG_VERSION")` is a good choice.
    pub version: String,
    /// Source or destination.
    pub kind: ConnectorKind,
    /// Older ids still found in saved configurations, each
    /// `source:<legacy_alias>`.
    pub legacy_aliases: Vec<String>,
    /// The JSON Schema of the config object.
    pub config_schema: Value,
    /// Hostnames the connector needs to reach: exact names or `*.suffix`
    /// patterns (a lone `*` for self-hosted providers whose hosts the
    /// operator approves one by one).
    pub hosts: Vec<String>,
    /// The OAuth endpoints, for connectors whose credentials come from OAuth.
    pub oauth: Option<OAuthEndpoints>,
    /// The operations this connector implements.
    pub operations: Vec<Operation>,
}

impl ConnectorInfo {
    /// Describes a source with no hosts, operations or config fields yet.
    pub fn source(id: impl Into<String>, name: impl Into<String>, version: impl Into<String>) -> Self {
        Self::new(ConnectorKind::Source, id.into(), name.into(), version.into())
    }

    /// Describes a destination with no hosts, operations or config fields yet.
    pub fn destination(id: impl Into<String>, name: impl Into<String>, version: impl Into<String>) -> Self {
        Self::new(ConnectorKind::Destination, id.into(), name.into(), version.into())
    }

    fn new(kind: ConnectorKind, id: String, name: String, version: String) -> Self {
        Self {
            id,
            name,
            version,
            kind,
            legacy_aliases: Vec::new(),
            config_schema: serde_json::json!({ "type": "object" }),
            hosts: Vec::new(),
            oauth: None,
            operations: Vec::new(),
        }
    }

    /// Sets the JSON Schema of the config object.
    pub fn with_config_schema(mut self, schema: Value) -> Self {
        self.config_schema = schema;
        self
    }

    /// Sets the hosts the connector may reach.
    pub fn with_hosts<S: Into<String>>(mut self, hosts: impl IntoIterator<Item = S>) -> Self {
        self.hosts = hosts.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the operations the connector implements.
    pub fn with_operations(mut self, operations: impl IntoIterator<Item = Operation>) -> Self {
        self.operations = operations.into_iter().collect();
        self
    }

    /// Sets the legacy aliases (`source:<legacy_alias>`).
    pub fn with_legacy_aliases<S: Into<String>>(mut self, aliases: impl IntoIterator<Item = S>) -> Self {
        self.legacy_aliases = aliases.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the OAuth endpoints.
    pub fn with_oauth(mut self, oauth: OAuthEndpoints) -> Self {
        self.oauth = Some(oauth);
        self
    }
}

/// How a stream can be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// Everything, every time.
    FullRefresh,
    /// Only what changed since the last checkpoint.
    Incremental,
}

/// One readable collection of records, returned by
/// [`Connector::discover`](crate::Connector::discover).
///
/// ```
/// use connector_sdk::{Stream, SyncMode, json};
///
/// let posts = Stream::new("posts", json!({ "type": "object" }))
///     .with_primary_key(["id"])
///     .with_incremental_cursor("id");
/// assert_eq!(posts.sync_modes, [SyncMode::FullRefresh, SyncMode::Incremental]);
/// assert_eq!(posts.default_cursor_field.as_deref(), Some("id"));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Stream {
    /// The stream name, unique within the connector.
    pub name: String,
    /// The JSON Schema of one record.
    pub json_schema: Value,
    /// The sync modes the stream supports.
    pub sync_modes: Vec<SyncMode>,
    /// The top-level fields a user may pick as the incremental cursor.
    pub cursor_fields: Vec<String>,
    /// The top-level fields that identify a record.
    pub primary_key: Vec<String>,
    /// The cursor used when the user picks none.
    pub default_cursor_field: Option<String>,
}

impl Stream {
    /// A stream that supports full refresh only and has no key.
    pub fn new(name: impl Into<String>, json_schema: Value) -> Self {
        Self {
            name: name.into(),
            json_schema,
            sync_modes: vec![SyncMode::FullRefresh],
            cursor_fields: Vec::new(),
            primary_key: Vec::new(),
            default_cursor_field: None,
        }
    }

    /// Sets the fields that identify a record.
    pub fn with_primary_key<S: Into<String>>(mut self, fields: impl IntoIterator<Item = S>) -> Self {
        self.primary_key = fields.into_iter().map(Into::into).collect();
        self
    }

    /// Makes the stream readable incrementally on `field`. The first cursor
    /// added becomes the default one.
    pub fn with_incremental_cursor(mut self, field: impl Into<String>) -> Self {
        let field = field.into();
        if !self.sync_modes.contains(&SyncMode::Incremental) {
            self.sync_modes.push(SyncMode::Incremental);
        }
        self.default_cursor_field.get_or_insert_with(|| field.clone());
        if !self.cursor_fields.contains(&field) {
            self.cursor_fields.push(field);
        }
        self
    }
}

/// What [`Connector::read`](crate::Connector::read) should read.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadRequest<C> {
    /// The connector's config, already parsed.
    pub config: C,
    /// The stream to read.
    pub stream: String,
    /// How to read it.
    pub sync_mode: SyncMode,
    /// The cursor field the user picked; `None` means the stream's default.
    pub cursor_field: Option<String>,
    /// The state this connector last checkpointed for the stream, if the
    /// host has one (never on a full refresh or after a reset).
    pub state: Option<Value>,
}

impl<C> ReadRequest<C> {
    /// Whether this is an incremental read.
    pub fn is_incremental(&self) -> bool {
        self.sync_mode == SyncMode::Incremental
    }

    /// The checkpointed state as the connector's own type. A state that does
    /// not fit the type (for example one written by an older version of the
    /// connector) is an [`Error::Internal`]; match on it to start over
    /// instead if that suits the stream.
    pub fn state_as<T: DeserializeOwned>(&self) -> Result<Option<T>> {
        self.state
            .clone()
            .map(serde_json::from_value)
            .transpose()
            .map_err(|e| Error::Internal(format!("the saved state of stream `{}` is not understood: {e}", self.stream)))
    }
}

/// One provider-backed choice for a config field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityOption {
    /// The value stored in the config field.
    pub value: String,
    /// What the user sees.
    pub label: String,
    /// The value of the option this one belongs to, in a hierarchy.
    pub parent: Option<String>,
}

impl EntityOption {
    /// An option without a parent.
    pub fn new(value: impl Into<String>, label: impl Into<String>) -> Self {
        Self { value: value.into(), label: label.into(), parent: None }
    }

    /// Places the option below `parent` (the parent option's value).
    pub fn with_parent(mut self, parent: impl Into<String>) -> Self {
        self.parent = Some(parent.into());
        self
    }
}

/// The outcome of a check that ran to completion. Typed failures (a rejected
/// credential, a provider outage) are returned as [`Error`] instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    /// Whether the config works.
    pub ok: bool,
    /// A short explanation for the user.
    pub message: String,
    /// A non-secret account description (account id, email address).
    pub account: Option<String>,
}

impl CheckResult {
    /// The config works.
    pub fn success(message: impl Into<String>) -> Self {
        Self { ok: true, message: message.into(), account: None }
    }

    /// The check ran, and found a problem that fits none of the [`Error`]
    /// variants (for example a plan without API access).
    pub fn failure(message: impl Into<String>) -> Self {
        Self { ok: false, message: message.into(), account: None }
    }

    /// Names the account the credential belongs to.
    pub fn with_account(mut self, account: impl Into<String>) -> Self {
        self.account = Some(account.into());
        self
    }
}

/// How [`Connector::write`](crate::Connector::write) applies records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Create new objects.
    Insert,
    /// Change existing objects found by the key fields.
    Update,
    /// Update the object found by the key fields, or create it.
    Upsert,
    /// Delete the objects found by the key fields.
    Delete,
}

/// What [`Connector::write`](crate::Connector::write) should write.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteRequest<C> {
    /// The connector's config, already parsed.
    pub config: C,
    /// The destination object, for example `subscribers`.
    pub stream: String,
    /// How to apply the records.
    pub mode: WriteMode,
    /// The fields that identify an existing object.
    pub key_fields: Vec<String>,
    /// The records (JSON objects), in the order the host sent them.
    pub records: Vec<Value>,
}

/// Why one record of a write failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError {
    /// The record's index in [`WriteRequest::records`].
    pub index: u32,
    /// What went wrong, without the record's contents.
    pub message: String,
}

/// The outcome of a write. Build it as you go:
///
/// ```
/// use connector_sdk::WriteResult;
///
/// let mut result = WriteResult::default();
/// result.record_written();
/// result.record_failed(1, "email is missing");
/// assert_eq!((result.written, result.failed), (1, 1));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteResult {
    /// How many records the provider accepted.
    pub written: u32,
    /// How many records failed.
    pub failed: u32,
    /// Why they failed.
    pub errors: Vec<RecordError>,
}

impl WriteResult {
    /// Counts one written record.
    pub fn record_written(&mut self) {
        self.written += 1;
    }

    /// Counts one failed record and says why.
    pub fn record_failed(&mut self, index: usize, message: impl Into<String>) {
        self.failed += 1;
        self.errors.push(RecordError { index: u32::try_from(index).unwrap_or(u32::MAX), message: message.into() });
    }
}

/// Why an operation failed. The variants are the ones the host tells apart;
/// pick the most specific. Messages reach users and operators, so keep record
/// data out of them.
///
/// Most variants come for free: [`RequestBuilder::send`](crate::RequestBuilder::send)
/// turns HTTP statuses and host refusals into the right one, and sink errors
/// convert with `?`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A config setting is missing or wrong; name the field.
    InvalidConfig(String),
    /// The provider rejected the credential (HTTP 401), or the host could not
    /// use the handle.
    InvalidCredentials(String),
    /// The credential lacks access (HTTP 403, missing scope).
    PermissionDenied(String),
    /// The provider is rate-limiting and waiting here would take too long.
    RateLimited {
        /// The provider's `Retry-After`, in seconds, if it sent one.
        retry_after: Option<u32>,
    },
    /// The provider is down or failing (5xx, timeouts) after retries.
    ProviderUnavailable(String),
    /// The provider refused the request (other 4xx) or answered nonsense.
    ProviderError(String),
    /// The host's egress policy refused a request; carries the rule.
    EgressDenied(String),
    /// The connector does not offer this operation, stream or mode.
    Unsupported(String),
    /// A bug or unexpected condition in the connector.
    Internal(String),
}

impl Error {
    /// The error the default trait methods return for operations a connector
    /// does not implement.
    pub fn unsupported_operation(operation: &str) -> Self {
        Error::Unsupported(format!("this connector does not offer the `{operation}` operation"))
    }

    /// The error for a stream name the connector does not know.
    pub fn unknown_stream(stream: &str) -> Self {
        Error::Unsupported(format!("this connector has no stream `{stream}`"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidConfig(m) => write!(f, "invalid configuration: {m}"),
            Error::InvalidCredentials(m) => write!(f, "invalid credentials: {m}"),
            Error::PermissionDenied(m) => write!(f, "permission denied: {m}"),
            Error::RateLimited { retry_after: Some(s) } => write!(f, "rate limited by the provider; retry after {s}s"),
            Error::RateLimited { retry_after: None } => write!(f, "rate limited by the provider"),
            Error::ProviderUnavailable(m) => write!(f, "provider unavailable: {m}"),
            Error::ProviderError(m) => write!(f, "provider error: {m}"),
            Error::EgressDenied(m) => write!(f, "request refused by the egress policy: {m}"),
            Error::Unsupported(m) => write!(f, "unsupported: {m}"),
            Error::Internal(m) => write!(f, "internal connector error: {m}"),
        }
    }
}

impl std::error::Error for Error {}
