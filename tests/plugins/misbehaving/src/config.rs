//! Reading the test's instructions out of the config.

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::bindings::service::connector1_0_0::types::ConnectorError;

pub fn invalid_config(message: impl Into<String>) -> ConnectorError {
    ConnectorError::InvalidConfig(message.into())
}

/// Just the behaviour, read without building a tree of the whole config so
/// that `noop` stays as cheap as an invocation can be.
pub fn behave(config_text: &str) -> Result<String, ConnectorError> {
    #[derive(Deserialize)]
    struct Behave {
        behave: Option<String>,
    }
    let parsed: Behave = serde_json::from_str(config_text)
        .map_err(|e| invalid_config(format!("the config is not a JSON object: {e}")))?;
    parsed.behave.ok_or_else(|| invalid_config("behave: required"))
}

/// The config as a JSON object, with typed accessors that name the field
/// when it has the wrong type.
pub struct Config(Map<String, Value>);

impl Config {
    pub fn parse(config_text: &str) -> Result<Self, ConnectorError> {
        match serde_json::from_str(config_text) {
            Ok(Value::Object(map)) => Ok(Self(map)),
            Ok(_) => Err(invalid_config("the config is not a JSON object")),
            Err(e) => Err(invalid_config(format!("the config is not JSON: {e}"))),
        }
    }

    /// A field that is present and not null.
    pub fn get(&self, field: &str) -> Option<&Value> {
        self.0.get(field).filter(|value| !value.is_null())
    }

    /// A non-negative integer field, or `default` when it is absent.
    pub fn u64(&self, field: &str, default: u64) -> Result<u64, ConnectorError> {
        match self.get(field) {
            None => Ok(default),
            Some(value) => {
                value.as_u64().ok_or_else(|| invalid_config(format!("{field}: expected a non-negative integer")))
            }
        }
    }

    /// A string field, if present.
    pub fn string(&self, field: &str) -> Result<Option<&str>, ConnectorError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(_) => Err(invalid_config(format!("{field}: expected a string"))),
        }
    }
}
