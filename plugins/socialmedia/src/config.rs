//! The source's configuration: the credential handle from the OAuth flow
//! and the selection of portal, brands and channels.
//!
//! Ids arrive as text; saved configurations from before the selection was
//! validated may hold numbers, which are read as their decimal text.

use connector_sdk::{Error, Result, Value, json};
use serde::{Deserialize, Deserializer};

/// A provider id (portal, brand or channel), as text.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Id(pub String);

impl Id {
    /// The id as it goes into a URL path segment: only ids made of
    /// letters, digits, `-` and `_` are accepted, so a config can never
    /// steer a request to another path.
    pub fn path_segment(&self, field: &str) -> Result<&str> {
        let ok = !self.0.is_empty()
            && self.0.len() <= 64
            && self.0.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if ok {
            Ok(&self.0)
        } else {
            Err(Error::InvalidConfig(format!(
                "{field}: `{}` is not an id",
                self.0.chars().take(64).collect::<String>()
            )))
        }
    }

    /// Reads an id from a JSON string or integer.
    pub fn from_value(v: &Value) -> Option<Id> {
        match v {
            Value::String(s) if !s.trim().is_empty() => Some(Id(s.trim().to_owned())),
            Value::Number(n) if n.is_u64() || n.is_i64() => Some(Id(n.to_string())),
            _ => None,
        }
    }
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        Id::from_value(&v).ok_or_else(|| serde::de::Error::custom("an id is a non-empty string or an integer"))
    }
}

/// The configuration of a social-media source.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    /// Handle of the OAuth credential (the host holds the tokens).
    pub credential_handle: String,
    /// The provider account (portal, "hub id").
    pub portal_id: Option<Id>,
    /// The brands (business units) whose channels are read.
    #[serde(default)]
    pub brand_ids: Vec<Id>,
    /// The connected social channels to read, by channel GUID.
    #[serde(default)]
    pub channel_ids: Vec<Id>,
}

impl Config {
    /// What a read needs: a handle and at least one channel.
    pub fn validate(&self) -> Result<()> {
        if self.credential_handle.trim().is_empty() {
            return Err(Error::InvalidConfig("credential_handle is required".into()));
        }
        if self.channel_ids.is_empty() {
            return Err(Error::InvalidConfig("channel_ids: choose at least one channel".into()));
        }
        Ok(())
    }

    /// Whether `channel` is among the selected channels.
    pub fn selects(&self, channel: &str) -> bool {
        self.channel_ids.iter().any(|c| c.0 == channel)
    }
}

/// The JSON Schema of the configuration. New sources must name a portal,
/// at least one brand and at least one channel, each chosen from
/// `POST /v1/sources/entities`.
pub fn schema() -> Value {
    let id = json!({ "type": ["string", "integer"], "minLength": 1, "maxLength": 64 });
    json!({
        "type": "object",
        "required": ["credential_handle", "portal_id", "brand_ids", "channel_ids"],
        "additionalProperties": false,
        "properties": {
            "credential_handle": { "type": "string", "minLength": 1, "description": "Handle of the OAuth credential from the source OAuth flow." },
            "portal_id": { "description": "The provider account (portal); one of the entity options for `portal_id`.", "type": ["string", "integer"], "minLength": 1, "maxLength": 64 },
            "brand_ids": { "description": "Brands of the portal; entity options for `brand_ids`.", "type": "array", "items": id, "minItems": 1, "maxItems": 100, "uniqueItems": true },
            "channel_ids": { "description": "Channels of the chosen brands, by channel GUID; entity options for `channel_ids`.", "type": "array", "items": id, "minItems": 1, "maxItems": 500, "uniqueItems": true }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_read_from_text_or_numbers() {
        let c: Config = serde_json::from_value(
            json!({ "credential_handle": "h", "portal_id": 62515, "brand_ids": ["7", 8], "channel_ids": ["abc"] }),
        )
        .unwrap();
        assert_eq!(c.portal_id, Some(Id("62515".into())));
        assert_eq!(c.brand_ids, [Id("7".into()), Id("8".into())]);
        assert!(c.selects("abc") && !c.selects("abd"));
    }

    #[test]
    fn ids_never_leave_their_path_segment() {
        assert!(Id("12345".into()).path_segment("portal_id").is_ok());
        for bad in ["../admin", "1/2", "a?b", "", "x y"] {
            assert!(Id(bad.into()).path_segment("f").is_err(), "{bad}");
        }
    }
}
