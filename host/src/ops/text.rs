//! Bounds on the free text clients send: every text field has a length
//! limit, so a request cannot park megabytes in a label or a name (the body
//! limit alone would allow a 1 MiB one), and a configuration object cannot
//! hide one in a nested value.

use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult};

/// Names of workspaces, sources, destinations and pipelines.
pub(crate) const NAME_MAX: usize = 200;
/// Labels of credentials, links and tokens.
pub(crate) const LABEL_MAX: usize = 200;
/// Usernames and other short identifiers a client chooses.
pub(crate) const SHORT_MAX: usize = 200;
/// Hosts a credential may be bound to.
pub(crate) const HOSTS_MAX: usize = 20;
/// One string inside a free-form configuration object.
pub(crate) const CONFIG_STRING_MAX: usize = 4096;
/// A whole free-form configuration object, serialised.
pub(crate) const CONFIG_BYTES_MAX: usize = 64 * 1024;
/// Any string of any JSON body: the backstop for fields without a limit of
/// their own (SQL text is the longest that has one).
pub(crate) const ANY_STRING_MAX: usize = 64 * 1024;

/// Fails unless `value` has at most `max` characters.
pub(crate) fn check_len(field: &str, value: &str, max: usize) -> ApiResult<()> {
    if value.chars().count() > max {
        return Err(too_long(field, max));
    }
    Ok(())
}

/// Like [`check_len`], for an optional field.
pub(crate) fn check_opt(field: &str, value: Option<&str>, max: usize) -> ApiResult<()> {
    value.map_or(Ok(()), |v| check_len(field, v, max))
}

/// A name: 1 to [`NAME_MAX`] characters, not only spaces.
pub(crate) fn check_name(field: &str, value: &str) -> ApiResult<()> {
    if value.trim().is_empty() || value.chars().count() > NAME_MAX {
        return Err(ApiError::invalid_field(field, format!("{field} must be 1 to {NAME_MAX} characters"))
            .with_details(json!({ "field": field, "max_length": NAME_MAX })));
    }
    Ok(())
}

/// A free-form configuration object: at most [`CONFIG_BYTES_MAX`] bytes in
/// all, each string within at most [`CONFIG_STRING_MAX`] characters.
pub(crate) fn check_config(field: &str, value: &Value) -> ApiResult<()> {
    check_config_within(field, value, CONFIG_BYTES_MAX, CONFIG_STRING_MAX)
}

/// A configuration object within `max_bytes` serialised, each string
/// within `max_chars` characters.
pub(crate) fn check_config_within(field: &str, value: &Value, max_bytes: usize, max_chars: usize) -> ApiResult<()> {
    if value.to_string().len() > max_bytes {
        return Err(ApiError::invalid_field(field, format!("{field} exceeds {max_bytes} bytes"))
            .with_details(json!({ "field": field, "max_bytes": max_bytes })));
    }
    match longest_string(value, field, max_chars) {
        Some(path) => Err(too_long(&path, max_chars)),
        None => Ok(()),
    }
}

/// The path of the first string in `value` longer than `max` characters.
pub(crate) fn longest_string(value: &Value, path: &str, max: usize) -> Option<String> {
    match value {
        // Bytes first: a string of at most `max` bytes has at most `max`
        // characters, and counting characters is the slower test.
        Value::String(s) if s.len() > max && s.chars().count() > max => Some(path.to_owned()),
        Value::Object(map) => map.iter().find_map(|(k, v)| {
            longest_string(v, &if path.is_empty() { k.clone() } else { format!("{path}.{k}") }, max)
        }),
        Value::Array(items) => {
            items.iter().enumerate().find_map(|(i, v)| longest_string(v, &format!("{path}[{i}]"), max))
        }
        _ => None,
    }
}

/// The 400 naming a field that is too long and its limit.
pub(crate) fn too_long(field: &str, max: usize) -> ApiError {
    ApiError::invalid_field(field, format!("{field} must be at most {max} characters"))
        .with_details(json!({ "field": field, "max_length": max }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_count_characters_not_bytes() {
        assert!(check_len("label", &"データ".repeat(66), LABEL_MAX).is_ok(), "198 characters, 594 bytes");
        assert!(check_len("label", &"x".repeat(LABEL_MAX + 1), LABEL_MAX).is_err());
        assert!(check_name("name", "  ").is_err());
        let nested = json!({ "a": [{ "b": "y".repeat(CONFIG_STRING_MAX + 1) }] });
        let e = check_config("configuration", &nested).unwrap_err();
        assert_eq!(e.details["field"], "configuration.a[0].b");
    }
}
