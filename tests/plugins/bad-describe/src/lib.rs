//! A component that implements the `connector` world correctly but describes
//! itself invalidly, so the host's plugin validation has something to refuse:
//!
//! - the id is empty,
//! - the config schema is not JSON,
//! - the only declared host is a URL with a space, not a host name.
//!
//! Everything else about the description is valid, and the one operation it
//! lists (`check`) works; a host that rejects the plugin must do so because
//! of those three fields alone.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit/connector@1.0.0",
        world: "connector",
    });
}

use bindings::exports::service::connector::plugin::Guest;
use bindings::service::connector::types::{
    CheckResult, ConnectorError, ConnectorInfo, ConnectorKind, EntityOption, Operation, ReadRequest, Stream,
    WriteRequest, WriteResult,
};

struct BadDescribe;

fn unsupported<T>() -> Result<T, ConnectorError> {
    Err(ConnectorError::Unsupported("the bad-describe test plugin offers only `check`".to_owned()))
}

impl Guest for BadDescribe {
    fn describe() -> ConnectorInfo {
        ConnectorInfo {
            id: String::new(),
            name: "Bad describe (test plugin)".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            kind: ConnectorKind::Source,
            legacy_aliases: Vec::new(),
            config_schema: "not json".to_owned(),
            hosts: vec!["http://bad host".to_owned()],
            oauth: None,
            operations: vec![Operation::Check],
        }
    }

    fn check(_config: String) -> Result<CheckResult, ConnectorError> {
        Ok(CheckResult { ok: true, message: "bad-describe test plugin".to_owned(), account: None })
    }

    fn discover(_config: String) -> Result<Vec<Stream>, ConnectorError> {
        unsupported()
    }

    fn read(_req: ReadRequest) -> Result<(), ConnectorError> {
        unsupported()
    }

    fn entity_options(_config: String, _field: String) -> Result<Vec<EntityOption>, ConnectorError> {
        unsupported()
    }

    fn preview(_config: String) -> Result<String, ConnectorError> {
        unsupported()
    }

    fn write(_req: WriteRequest) -> Result<WriteResult, ConnectorError> {
        unsupported()
    }
}

bindings::export!(BadDescribe with_types_in bindings);
