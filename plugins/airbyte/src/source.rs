//! The source's configuration and the manifest read from it: the
//! runtime's model of the manifest (refusals by JSON pointer, as
//! [`Error::InvalidConfig`]), the configuration the templates see (each
//! secret field a marker), and the clock.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use connector_sdk::{Error, Result, Value, json};
use declarative::interpolation::Val;
use declarative::model::{Source, Stream};
use declarative::retrieve::{self, Env, PrepareError};
use serde::Deserialize;

/// A source's configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The manifest, as published (YAML read into JSON by the server).
    pub manifest: Value,
    /// The manifest's configuration without its secret fields.
    #[serde(default = "empty_object")]
    pub config: Value,
    /// A credential handle for each secret field.
    #[serde(default)]
    pub credentials: Vec<SecretField>,
    /// The schema files the manifest reads from its package, by their
    /// path there (`schemas/users.json`), as the package ships them.
    #[serde(default)]
    pub schemas: serde_json::Map<String, Value>,
}

/// A secret field of the manifest's configuration and the credential that
/// holds its value.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretField {
    /// The field, as a JSON pointer into the configuration (`/api_key`).
    pub field: String,
    pub credential_handle: String,
}

impl Config {
    /// The handles by field.
    pub fn handles(&self) -> BTreeMap<String, String> {
        self.credentials.iter().map(|c| (c.field.clone(), c.credential_handle.clone())).collect()
    }
}

fn empty_object() -> Value {
    json!({})
}

/// The published schema of the configuration.
pub fn schema() -> Value {
    json!({
        "type": "object",
        "required": ["manifest"],
        "additionalProperties": false,
        "properties": {
            "manifest": { "type": "object", "description": "The Airbyte declarative manifest, as published." },
            "config": { "type": "object", "description": "The manifest's configuration (its spec's connection_specification), without secret fields." },
            "credentials": {
                "type": "array",
                "description": "A credential for each secret field of the configuration the manifest uses.",
                "items": {
                    "type": "object",
                    "required": ["field", "credential_handle"],
                    "additionalProperties": false,
                    "properties": {
                        "field": { "type": "string", "pattern": "^(/[^/]+)+$", "description": "The field, as a JSON pointer (/api_key)." },
                        "credential_handle": { "type": "string", "minLength": 1 }
                    }
                }
            },
            "schemas": {
                "type": "object",
                "description": "The schema files the manifest's streams read from their package (a JsonFileSchemaLoader, or none named), by their path in it (schemas/users.json); a stream whose file is not given has an open schema.",
                "additionalProperties": { "type": "object" }
            }
        }
    })
}

/// The manifest ready to read.
pub struct Prepared {
    pub source: Source,
    pub env: Env,
}

impl Prepared {
    pub fn new(config: &Config) -> Result<Prepared> {
        if !config.config.is_object() {
            return Err(Error::InvalidConfig("/config: the manifest's configuration must be an object".into()));
        }
        let handles = config.handles();
        if let Some(pointer) = handles.keys().find(|p| !p.starts_with('/')) {
            return Err(Error::InvalidConfig(format!(
                "/credentials: {pointer:?} is not a JSON pointer (like /api_key)"
            )));
        }
        let given: Vec<String> = handles.into_keys().collect();
        match retrieve::prepare(&config.manifest, &Val::from(&config.config), &given, now()) {
            Ok((source, env)) => Ok(Prepared { source, env }),
            Err(PrepareError::Refused(r)) => Err(Error::InvalidConfig(format!("/manifest{}: {}", r.pointer, r.reason))),
            Err(PrepareError::SecretInTheClear(pointer)) => Err(Error::InvalidConfig(format!(
                "/config{pointer} is a secret: store it as a credential and give its handle in /credentials"
            ))),
        }
    }

    /// The stream named `name`.
    pub fn stream(&self, name: &str) -> Result<&Stream> {
        self.source.stream(name).ok_or_else(|| Error::unknown_stream(name))
    }

    /// The manifest's streams' names, for messages.
    pub fn hosts(&self) -> String {
        format!("the manifest's {} stream(s)", self.source.streams.len())
    }
}

/// The guest's wall clock (the host may hold it still).
pub(crate) fn now() -> DateTime<Utc> {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    DateTime::<Utc>::from_timestamp(since.as_secs() as i64, since.subsec_nanos()).unwrap_or_default()
}
