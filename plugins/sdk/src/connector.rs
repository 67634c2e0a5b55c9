//! The trait a connector implements.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::types::{
    CheckResult, ConnectorInfo, EntityOption, Error, ReadRequest, Result, Stream, WriteRequest, WriteResult,
};

/// A connector: one provider, seen as a source or a destination.
///
/// Only [`describe`](Connector::describe) is required. Every other operation
/// defaults to [`Error::Unsupported`]; implement the ones you list in
/// [`ConnectorInfo::with_operations`] and register the type with
/// [`export_connector!`](crate::export_connector).
///
/// The methods take no `self`: the host runs every call in a fresh instance,
/// so there is nothing to keep between calls. What a read must remember for
/// next time goes into a checkpoint ([`Sink::checkpoint`](crate::Sink::checkpoint)).
///
/// Configs arrive parsed as [`Connector::Config`]; a config that does not
/// parse is answered with [`Error::InvalidConfig`] before your code runs.
pub trait Connector {
    /// The connector's config: what the JSON Schema in
    /// [`ConnectorInfo::config_schema`] describes. Credential fields are
    /// handles (`String`), never secrets. Use [`serde_json::Value`] to take
    /// the config as it comes.
    type Config: DeserializeOwned;

    /// Says what the connector is. Called when the plugin is loaded, without
    /// a config; it must not make requests or log.
    fn describe() -> ConnectorInfo;

    /// Checks that a config works: typically one cheap authenticated request
    /// (`GET /me`) whose answer names the account.
    fn check(config: Self::Config) -> Result<CheckResult> {
        let _ = config;
        Err(Error::unsupported_operation("check"))
    }

    /// Lists the streams the config gives access to.
    fn discover(config: Self::Config) -> Result<Vec<Stream>> {
        let _ = config;
        Err(Error::unsupported_operation("discover"))
    }

    /// Reads one stream: emit records with [`Sink::emit`](crate::Sink::emit),
    /// checkpoint progress with [`Sink::checkpoint`](crate::Sink::checkpoint),
    /// return `Ok(())` when the stream is exhausted.
    fn read(request: ReadRequest<Self::Config>) -> Result<()> {
        let _ = request;
        Err(Error::unsupported_operation("read"))
    }

    /// Lists provider-backed choices for the config field `field` (for
    /// example the brands a credential can see).
    ///
    /// The config is what the user has filled in so far and may lack
    /// required fields, so it arrives untyped; pick out what you need.
    /// Beside the user's fields it holds `credential_handle` and, when the
    /// host knows what the provider said about the credential's account at
    /// authorisation, `credential_account` (for OAuth, ids such as `hub_id`
    /// and `user_id` from the token response). Only the host sets that
    /// field. Return every option; the host pages them for the user.
    fn entity_options(config: Value, field: &str) -> Result<Vec<EntityOption>> {
        let _ = config;
        Err(Error::Unsupported(format!("this connector offers no options for `{field}`")))
    }

    /// Returns a small sample of the data for a user to look at, as a JSON
    /// object. Leave out anything the user should not see.
    fn preview(config: Self::Config) -> Result<Value> {
        let _ = config;
        Err(Error::unsupported_operation("preview"))
    }

    /// Writes a batch of records. Failures of single records go into the
    /// [`WriteResult`]; return an error only when the whole batch failed.
    fn write(request: WriteRequest<Self::Config>) -> Result<WriteResult> {
        let _ = request;
        Err(Error::unsupported_operation("write"))
    }
}
