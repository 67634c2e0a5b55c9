//! How `PATCH` changes a configuration, the same on every resource: the
//! body's top-level keys replace the stored ones, a key set to `null` is
//! removed, keys the body leaves out stay as they are.

use serde::Deserialize;
use serde_json::Value;

use crate::error::{ApiError, ApiResult};

/// A `PATCH` field that may be absent (`None`: unchanged, with
/// `#[serde(default)]`), `null` (`Some(None)`: removed) or a value.
pub(crate) fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// Applies `patch` (when given) to `current`.
pub(crate) fn merge_configuration(current: Value, patch: Option<Value>) -> ApiResult<Value> {
    match (current, patch) {
        (current, None) => Ok(current),
        (Value::Object(mut map), Some(Value::Object(changes))) => {
            for (k, v) in changes {
                if v.is_null() {
                    map.remove(&k);
                } else {
                    map.insert(k, v);
                }
            }
            Ok(Value::Object(map))
        }
        (_, Some(Value::Object(changes))) => {
            Ok(Value::Object(changes.into_iter().filter(|(_, v)| !v.is_null()).collect()))
        }
        (_, Some(_)) => Err(ApiError::invalid_field("configuration", "configuration must be an object")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_are_merged_and_null_removes_one() {
        let merged =
            merge_configuration(json!({ "a": 1, "b": 2 }), Some(json!({ "b": 3, "a": null, "c": 4 }))).unwrap();
        assert_eq!(merged, json!({ "b": 3, "c": 4 }));
        assert_eq!(merge_configuration(json!({ "a": 1 }), None).unwrap(), json!({ "a": 1 }));
        assert!(merge_configuration(json!({}), Some(json!([1]))).is_err());
    }
}
