//! An SQLite destination's configuration: a file name in the workspace's
//! folder.

use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::warehouse::DestinationConfig;
use crate::warehouse::config::plain_name;

/// The fields an SQLite destination takes.
pub(crate) const FIELDS: &[&str] = &["file"];

/// An SQLite destination's configuration, checked: a plain file name in
/// the workspace's warehouse folder.
pub(crate) fn config(obj: &Map<String, Value>) -> Result<DestinationConfig, ApiError> {
    Ok(DestinationConfig::Sqlite { file: plain_name("configuration.file", obj.get("file").and_then(Value::as_str))? })
}
