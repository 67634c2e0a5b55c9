//! The streams, their schemas, and the records built from provider objects.
//!
//! | stream | one record per | key | sync modes |
//! |---|---|---|---|
//! | `channels` | selected channel | `channel_guid` | full refresh |
//! | `posts` | published post (broadcast) of a selected channel | `broadcast_guid` | full refresh, incremental on `created_at` |
//! | `post_metrics` | published post: clicks, impressions, engagements | `broadcast_guid` | full refresh |
//! | `channel_statistics` | selected channel: totals over its posts | `channel_guid` | full refresh |
//!
//! Records are built field by field: nothing of the provider's objects
//! travels beyond the fields named here. A metric the provider does not
//! report is `null`, never 0. Times are epoch milliseconds, as the provider
//! gives them.

use std::collections::BTreeMap;

use connector_sdk::{Stream, Value, json};

use crate::api::Channel;

/// The cursor of the `posts` stream.
pub const CURSOR_FIELD: &str = "created_at";

/// A stream of this connector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamName {
    /// `channels`
    Channels,
    /// `posts`
    Posts,
    /// `post_metrics`
    PostMetrics,
    /// `channel_statistics`
    ChannelStatistics,
}

impl StreamName {
    /// Every stream, in the order `discover` lists them.
    pub const ALL: [StreamName; 4] = [StreamName::Channels, StreamName::Posts, StreamName::PostMetrics, StreamName::ChannelStatistics];

    /// The name the host knows it by.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamName::Channels => "channels",
            StreamName::Posts => "posts",
            StreamName::PostMetrics => "post_metrics",
            StreamName::ChannelStatistics => "channel_statistics",
        }
    }

    /// The stream called `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

/// What `discover` answers.
pub fn catalogue() -> Vec<Stream> {
    let int = json!({ "type": ["integer", "null"] });
    let text = json!({ "type": ["string", "null"] });
    let object = |props: Value| json!({ "type": "object", "properties": props });
    vec![
        Stream::new("channels", object(json!({
            "channel_guid": { "type": "string" }, "channel_key": text, "account_type": text, "name": text,
            "active": { "type": ["boolean", "null"] }, "portal_id": text, "brand_id": text
        })))
        .with_primary_key(["channel_guid"]),
        Stream::new("posts", object(json!({
            "broadcast_guid": { "type": "string" }, "channel_guid": { "type": "string" }, "channel_key": text, "brand_id": text,
            "status": text, "created_at": int, "trigger_at": int, "finished_at": int, "content": text, "message": text, "clicks": int
        })))
        .with_primary_key(["broadcast_guid"])
        .with_incremental_cursor(CURSOR_FIELD),
        Stream::new("post_metrics", object(json!({
            "broadcast_guid": { "type": "string" }, "channel_guid": { "type": "string" }, "published_at": int,
            "clicks": int, "impressions": int, "engagements": int, "likes": int, "comments": int, "shares": int
        })))
        .with_primary_key(["broadcast_guid"]),
        Stream::new("channel_statistics", object(json!({
            "channel_guid": { "type": "string" }, "name": text, "brand_id": text, "posts_published": { "type": "integer" },
            "clicks": int, "impressions": int, "engagements": int, "last_published_at": int
        })))
        .with_primary_key(["channel_guid"]),
    ]
}

fn text(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(s.clone()),
        Value::Number(n) => Value::String(n.to_string()),
        _ => Value::Null,
    }
}

fn int(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| v.as_f64().filter(|f| f.is_finite() && *f >= 0.0).map(|f| f as i64))
}

/// A channel record.
pub fn channel_record(c: &Channel) -> Value {
    json!({
        "channel_guid": c.channel_guid,
        "channel_key": c.channel_key,
        "account_type": c.account_type,
        "name": c.display_name.clone().or_else(|| c.name.clone()),
        "active": c.active,
        "portal_id": c.portal_id.as_ref().map(text),
        "brand_id": c.brand().map(|b| b.0),
    })
}

/// The fields a post's identity and time come from.
pub struct PostRef<'a> {
    /// `broadcastGuid`
    pub guid: &'a str,
    /// `channelGuid`
    pub channel: &'a str,
    /// `createdAt` (epoch ms)
    pub created_at: Option<i64>,
}

/// The identity of a broadcast, if it has one.
pub fn post_ref(b: &Value) -> Option<PostRef<'_>> {
    Some(PostRef { guid: b["broadcastGuid"].as_str()?, channel: b["channelGuid"].as_str()?, created_at: int(&b["createdAt"]) })
}

/// A post record; `brand` comes from the channel.
pub fn post_record(b: &Value, brand: Option<&str>) -> Value {
    let content = match &b["content"] {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("body").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    };
    json!({
        "broadcast_guid": b["broadcastGuid"],
        "channel_guid": b["channelGuid"],
        "channel_key": text(&b["channelKey"]),
        "brand_id": brand,
        "status": text(&b["status"]),
        "created_at": int(&b["createdAt"]),
        "trigger_at": int(&b["triggerAt"]),
        "finished_at": int(&b["finishedAt"]),
        "content": content,
        "message": text(&b["message"]),
        "clicks": int(&b["clicks"]),
    })
}

/// Engagement counts a provider may report under `interactionCounts` (or
/// `interactions`), by network.
const ENGAGEMENTS: [&str; 7] = ["likes", "comments", "shares", "favorites", "retweets", "replies", "reactions"];

/// The metrics of one post.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct PostMetrics {
    /// Link clicks.
    pub clicks: Option<i64>,
    /// Times the post was shown.
    pub impressions: Option<i64>,
    /// The sum of the engagement counts the provider reports.
    pub engagements: Option<i64>,
}

/// The metrics of a broadcast, as the provider reports them.
pub fn metrics_of(b: &Value) -> (PostMetrics, BTreeMap<&'static str, i64>) {
    let counts = if b["interactionCounts"].is_object() { &b["interactionCounts"] } else { &b["interactions"] };
    let mut found = BTreeMap::new();
    for key in ENGAGEMENTS {
        if let Some(n) = int(&counts[key]) {
            found.insert(key, n);
        }
    }
    let engagements = if found.is_empty() { None } else { Some(found.values().sum()) };
    (PostMetrics { clicks: int(&b["clicks"]), impressions: int(&counts["impressions"]).or_else(|| int(&b["impressions"])), engagements }, found)
}

/// A post-metrics record.
pub fn metrics_record(b: &Value) -> Value {
    let (m, counts) = metrics_of(b);
    json!({
        "broadcast_guid": b["broadcastGuid"],
        "channel_guid": b["channelGuid"],
        "published_at": int(&b["finishedAt"]),
        "clicks": m.clicks,
        "impressions": m.impressions,
        "engagements": m.engagements,
        "likes": counts.get("likes").or(counts.get("favorites")).or(counts.get("reactions")),
        "comments": counts.get("comments").or(counts.get("replies")),
        "shares": counts.get("shares").or(counts.get("retweets")),
    })
}

/// Totals of one channel, added up post by post.
#[derive(Debug, Default, Clone)]
pub struct ChannelTotals {
    /// Published posts.
    pub posts: i64,
    /// Sums; `None` while no post reported the metric.
    pub clicks: Option<i64>,
    /// See `clicks`.
    pub impressions: Option<i64>,
    /// See `clicks`.
    pub engagements: Option<i64>,
    /// The newest `finishedAt`.
    pub last_published_at: Option<i64>,
}

impl ChannelTotals {
    /// Adds one post.
    pub fn add(&mut self, b: &Value) {
        let (m, _) = metrics_of(b);
        self.posts += 1;
        let plus = |acc: Option<i64>, n: Option<i64>| match (acc, n) {
            (a, None) => a,
            (a, Some(n)) => Some(a.unwrap_or(0) + n),
        };
        self.clicks = plus(self.clicks, m.clicks);
        self.impressions = plus(self.impressions, m.impressions);
        self.engagements = plus(self.engagements, m.engagements);
        self.last_published_at = self.last_published_at.max(int(&b["finishedAt"]));
    }

    /// The channel-statistics record.
    pub fn record(&self, c: &Channel) -> Value {
        json!({
            "channel_guid": c.channel_guid,
            "name": c.display_name.clone().or_else(|| c.name.clone()),
            "brand_id": c.brand().map(|b| b.0),
            "posts_published": self.posts,
            "clicks": self.clicks,
            "impressions": self.impressions,
            "engagements": self.engagements,
            "last_published_at": self.last_published_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_the_provider_does_not_report_are_null_not_zero() {
        let (m, _) = metrics_of(&json!({ "clicks": 3 }));
        assert_eq!(m, PostMetrics { clicks: Some(3), impressions: None, engagements: None });
        let (m, _) = metrics_of(&json!({ "clicks": 1, "interactionCounts": { "impressions": 50, "likes": 4, "comments": 1 } }));
        assert_eq!(m, PostMetrics { clicks: Some(1), impressions: Some(50), engagements: Some(5) });
    }

    #[test]
    fn channel_totals_add_only_what_was_reported() {
        let mut t = ChannelTotals::default();
        t.add(&json!({ "clicks": 2, "finishedAt": 10 }));
        t.add(&json!({ "clicks": 3, "finishedAt": 30, "interactionCounts": { "impressions": 7 } }));
        assert_eq!((t.posts, t.clicks, t.impressions, t.engagements, t.last_published_at), (2, Some(5), Some(7), None, Some(30)));
    }

    #[test]
    fn post_records_carry_only_named_fields() {
        let r = post_record(&json!({ "broadcastGuid": "b1", "channelGuid": "c1", "createdAt": 5, "content": { "body": "hi", "secretish": "x" }, "raw": { "a": 1 } }), Some("7"));
        let keys: Vec<&String> = r.as_object().unwrap().keys().collect();
        assert!(!keys.iter().any(|k| *k == "raw" || *k == "secretish"));
        assert_eq!(r["content"], "hi");
        assert_eq!(r["brand_id"], "7");
    }
}
