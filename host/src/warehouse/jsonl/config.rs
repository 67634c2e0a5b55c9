//! A JSON-lines destination's configuration: a folder name in the
//! workspace's folder.

use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::warehouse::DestinationConfig;
use crate::warehouse::config::plain_name;

/// The fields a JSON-lines destination takes.
pub(crate) const FIELDS: &[&str] = &["directory"];

/// A JSON-lines destination's configuration, checked: a plain folder name
/// in the workspace's exports folder.
pub(crate) fn config(obj: &Map<String, Value>) -> Result<DestinationConfig, ApiError> {
    Ok(DestinationConfig::Jsonl {
        directory: plain_name("configuration.directory", obj.get("directory").and_then(Value::as_str))?,
    })
}
