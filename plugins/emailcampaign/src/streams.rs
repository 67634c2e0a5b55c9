//! The streams this connector offers, with the JSON Schema of their records.
//!
//! | stream | records | key | sync modes |
//! |---|---|---|---|
//! | `campaigns` | the provider's campaign objects, as sent | `uuid` | full refresh, incremental on `updated_at` |
//! | `campaign_statistics` | one per campaign: identity plus [`Metrics`] | `uuid` | full refresh, incremental on `updated_at` |
//! | `email_lists` | the provider's email list objects, as sent | `uuid` | full refresh |
//! | `subscribers` | the subscribers of the configured (or all) lists, as sent | `uuid` | full refresh, incremental on `updated_at` |
//!
//! Streams that pass the provider's objects through keep every field the
//! provider sends (their schemas allow additional properties); the plugin
//! adds nothing to them except `email_list_uuid` on a subscriber that lacks
//! it. The schemas describe the fields the connector knows about.
//!
//! `subscribers` is also what `write` writes, and its schema says how, by the
//! host's convention: every property the connector cannot write carries
//! `"readOnly": true` (only `email`, `first_name`, `last_name` and
//! `extra_attributes` are writable), and the top-level `"x-write-keys":
//! ["email", "uuid"]` lists the fields that match a record to an existing
//! subscriber, the default first. The other streams carry no
//! `x-write-keys`: they cannot be written.

use connector_sdk::{Stream, Value, json};
use serde_json::Map;

use crate::incremental::CURSOR_FIELD;
use crate::metrics::{CampaignCounts, Metrics};

/// A stream of this connector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamName {
    /// `campaigns`
    Campaigns,
    /// `campaign_statistics`
    CampaignStatistics,
    /// `email_lists`
    EmailLists,
    /// `subscribers`
    Subscribers,
}

impl StreamName {
    /// Every stream, in the order `discover` lists them.
    pub const ALL: [StreamName; 4] =
        [StreamName::Campaigns, StreamName::CampaignStatistics, StreamName::EmailLists, StreamName::Subscribers];

    /// The stream's name as the host knows it.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamName::Campaigns => "campaigns",
            StreamName::CampaignStatistics => "campaign_statistics",
            StreamName::EmailLists => "email_lists",
            StreamName::Subscribers => "subscribers",
        }
    }

    /// The stream called `name`, if there is one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// Whether the stream can be read incrementally (on `updated_at`).
    pub fn is_incremental(self) -> bool {
        !matches!(self, StreamName::EmailLists)
    }

    /// The stream as `discover` describes it.
    pub fn describe(self) -> Stream {
        let stream = Stream::new(self.as_str(), self.schema()).with_primary_key(["uuid"]);
        if self.is_incremental() { stream.with_incremental_cursor(CURSOR_FIELD) } else { stream }
    }

    /// The JSON Schema of one record.
    pub fn schema(self) -> Value {
        match self {
            StreamName::Campaigns => campaign_schema(),
            StreamName::CampaignStatistics => statistics_schema(),
            StreamName::EmailLists => email_list_schema(),
            StreamName::Subscribers => subscriber_schema(),
        }
    }
}

/// The full catalogue, as `discover` returns it.
pub fn catalogue() -> Vec<Stream> {
    StreamName::ALL.into_iter().map(StreamName::describe).collect()
}

/// The `campaign_statistics` record of a provider campaign object: the
/// campaign's identity and its normalised metrics, flattened.
pub fn statistics_record(campaign: &Value) -> Value {
    let mut record = Map::new();
    for field in ["uuid", "name", "status", "email_list_uuid", "sent_at", CURSOR_FIELD] {
        let value = campaign.get(field).filter(|v| v.is_string()).cloned();
        record.insert(field.to_owned(), value.unwrap_or(Value::Null));
    }
    let metrics = Metrics::of_campaign(&CampaignCounts::from_campaign(campaign));
    if let Value::Object(metrics) = metrics.to_json() {
        record.extend(metrics);
    }
    Value::Object(record)
}

// ---- schemas ----------------------------------------------------------------

fn object(required: &[&str], properties: Value, open: bool) -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": required,
        "additionalProperties": open,
        "properties": properties,
    })
}

fn text() -> Value {
    json!({ "type": ["string", "null"] })
}

fn time() -> Value {
    json!({ "type": ["string", "null"], "format": "date-time" })
}

fn count() -> Value {
    json!({ "type": ["integer", "null"], "minimum": 0 })
}

fn provider_rate() -> Value {
    json!({
        "type": ["integer", "null"],
        "description": "The provider's rate in hundredths of a percent (4523 = 45.23 %)"
    })
}

/// `schema` with the annotation `"readOnly": true`: `write` cannot set the
/// property.
fn read_only(mut schema: Value) -> Value {
    if let Value::Object(annotations) = &mut schema {
        annotations.insert("readOnly".into(), Value::Bool(true));
    }
    schema
}

fn fraction() -> Value {
    json!({ "type": ["number", "null"], "minimum": 0, "maximum": 1 })
}

fn campaign_schema() -> Value {
    object(
        &["uuid"],
        json!({
            "uuid": { "type": "string" },
            "name": text(),
            "email_list_uuid": text(),
            "status": {
                "type": ["string", "null"],
                "description": "draft, scheduled, sending, sent or cancelled"
            },
            "subject": text(),
            "from_email": text(),
            "html": { "type": ["string", "null"], "description": "the campaign's HTML, as sent" },
            "sent_to_number_of_subscribers": count(),
            "sent_at": time(),
            "scheduled_at": time(),
            "created_at": time(),
            "updated_at": time(),
            "open_count": count(),
            "unique_open_count": count(),
            "click_count": count(),
            "unique_click_count": count(),
            "unsubscribe_count": count(),
            "bounce_count": count(),
            "complaint_count": count(),
            "open_rate": provider_rate(),
            "click_rate": provider_rate(),
            "unsubscribe_rate": provider_rate(),
            "bounce_rate": provider_rate(),
        }),
        true,
    )
}

fn statistics_schema() -> Value {
    let identity = [
        ("uuid", json!({ "type": "string" })),
        ("name", text()),
        ("status", text()),
        ("email_list_uuid", text()),
        ("sent_at", time()),
        ("updated_at", time()),
    ];
    let counts = [
        "sent",
        "delivered",
        "opens",
        "unique_opens",
        "clicks",
        "unique_clicks",
        "bounces",
        "unsubscribes",
        "complaints",
    ]
    .map(|name| (name, count()));
    let rates = ["delivery_rate", "open_rate", "click_rate", "bounce_rate", "unsubscribe_rate", "complaint_rate"]
        .map(|name| (name, fraction()));
    let properties: Map<String, Value> =
        identity.into_iter().chain(counts).chain(rates).map(|(name, schema)| (name.to_owned(), schema)).collect();
    let required: Vec<&str> = properties.keys().map(String::as_str).collect();
    object(&required, Value::Object(properties.clone()), false)
}

fn email_list_schema() -> Value {
    object(
        &["uuid"],
        json!({
            "uuid": { "type": "string" },
            "name": text(),
            "active_subscribers_count": count(),
            "created_at": time(),
            "updated_at": time(),
        }),
        true,
    )
}

/// The fields that match a written subscriber record to an existing
/// subscriber, the default first (see the `write` module).
pub const SUBSCRIBER_WRITE_KEYS: [&str; 2] = ["email", "uuid"];

fn subscriber_schema() -> Value {
    let mut schema = object(
        &["uuid"],
        json!({
            "uuid": read_only(json!({ "type": "string" })),
            "email_list_uuid": read_only(text()),
            "email": text(),
            "first_name": text(),
            "last_name": text(),
            "status": read_only(json!({
                "type": ["string", "null"],
                "description": "unconfirmed, subscribed or unsubscribed"
            })),
            "extra_attributes": { "type": ["object", "array", "null"] },
            "tags": read_only(json!({ "type": ["array", "null"] })),
            "subscribed_at": read_only(time()),
            "unsubscribed_at": read_only(time()),
            "created_at": read_only(time()),
            "updated_at": read_only(time()),
        }),
        true,
    );
    schema["x-write-keys"] = json!(SUBSCRIBER_WRITE_KEYS);
    schema
}

#[cfg(test)]
mod tests {
    use super::*;
    use connector_sdk::SyncMode;

    #[test]
    fn discover_lists_the_four_streams_keyed_by_uuid() {
        let streams = catalogue();
        let names: Vec<&str> = streams.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["campaigns", "campaign_statistics", "email_lists", "subscribers"]);
        assert!(streams.iter().all(|s| s.primary_key == ["uuid"]));
    }

    #[test]
    fn all_but_email_lists_are_incremental_on_updated_at() {
        for stream in catalogue() {
            if stream.name == "email_lists" {
                assert_eq!(stream.sync_modes, [SyncMode::FullRefresh]);
                assert!(stream.cursor_fields.is_empty());
            } else {
                assert_eq!(stream.sync_modes, [SyncMode::FullRefresh, SyncMode::Incremental]);
                assert_eq!(stream.cursor_fields, ["updated_at"]);
                assert_eq!(stream.default_cursor_field.as_deref(), Some("updated_at"));
            }
        }
    }

    #[test]
    fn the_subscriber_schema_says_what_write_can_write() {
        let schema = StreamName::Subscribers.schema();
        assert_eq!(schema["x-write-keys"], json!(["email", "uuid"]));
        let properties = schema["properties"].as_object().unwrap();
        let mut writable: Vec<&str> = properties
            .iter()
            .filter(|(_, property)| property.get("readOnly").is_none())
            .map(|(name, _)| name.as_str())
            .collect();
        writable.sort_unstable();
        let mut expected = crate::write::WRITABLE_FIELDS;
        expected.sort_unstable();
        assert_eq!(writable, expected);
        for (name, property) in properties {
            if !writable.contains(&name.as_str()) {
                assert_eq!(property["readOnly"], json!(true), "{name}");
            }
        }
        for key in SUBSCRIBER_WRITE_KEYS {
            assert!(properties.contains_key(key), "{key}");
        }
    }

    #[test]
    fn only_subscribers_can_be_written() {
        for stream in StreamName::ALL {
            let schema = stream.schema();
            let writable = stream == StreamName::Subscribers;
            assert_eq!(schema.get("x-write-keys").is_some(), writable, "{stream:?}");
            if !writable {
                let properties = schema["properties"].as_object().unwrap();
                assert!(properties.values().all(|p| p.get("readOnly").is_none()));
            }
        }
    }

    #[test]
    fn stream_names_round_trip() {
        for stream in StreamName::ALL {
            assert_eq!(StreamName::parse(stream.as_str()), Some(stream));
        }
        assert_eq!(StreamName::parse("opens"), None);
    }

    #[test]
    fn a_statistics_record_has_exactly_the_fields_of_its_schema() {
        let record = statistics_record(&json!({
            "uuid": "c1",
            "name": "March news",
            "status": "sent",
            "email_list_uuid": "l1",
            "sent_at": "2024-03-01T09:00:00.000000Z",
            "updated_at": "2024-03-02T09:00:00.000000Z",
            "html": "<html>not copied</html>",
            "sent_to_number_of_subscribers": 200,
            "unique_open_count": 50,
        }));
        let schema = StreamName::CampaignStatistics.schema();
        let mut fields: Vec<&String> = record.as_object().unwrap().keys().collect();
        let mut declared: Vec<&String> = schema["properties"].as_object().unwrap().keys().collect();
        fields.sort();
        declared.sort();
        assert_eq!(fields, declared);
        assert_eq!(record["open_rate"], json!(0.25));
        assert_eq!(record["complaints"], Value::Null);
        assert_eq!(record["name"], json!("March news"));
    }

    #[test]
    fn statistics_identity_fields_that_are_not_strings_become_null() {
        let record = statistics_record(&json!({ "uuid": "c1", "name": { "nested": true } }));
        assert_eq!(record["name"], Value::Null);
        assert_eq!(record["sent_at"], Value::Null);
    }
}
