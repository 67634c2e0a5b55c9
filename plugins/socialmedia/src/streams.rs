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

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use connector_sdk::{Result, Stream, Value, json, serde_json};
use serde::Serialize;

use crate::api::{Broadcast, Channel};

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
    pub const ALL: [StreamName; 4] =
        [StreamName::Channels, StreamName::Posts, StreamName::PostMetrics, StreamName::ChannelStatistics];

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
pub fn post_ref<'a>(b: &'a Broadcast<'_>) -> Option<PostRef<'a>> {
    Some(PostRef { guid: b.guid.as_str()?, channel: b.channel.as_str()?, created_at: b.created_at.int() })
}

/// A post record, written straight to its JSON text (fields in the order
/// of their names); `brand` comes from the channel. Only a broadcast with
/// an identity ([`post_ref`]) makes a record.
#[derive(Serialize)]
pub struct PostRecord<'a> {
    brand_id: Option<&'a str>,
    broadcast_guid: &'a str,
    channel_guid: &'a str,
    channel_key: Option<Cow<'a, str>>,
    clicks: Option<i64>,
    content: Option<&'a str>,
    created_at: Option<i64>,
    finished_at: Option<i64>,
    message: Option<Cow<'a, str>>,
    status: Option<Cow<'a, str>>,
    trigger_at: Option<i64>,
}

impl<'a> PostRecord<'a> {
    /// The record of `b`, a post of the channel in `p`.
    pub fn new(b: &'a Broadcast<'_>, p: &PostRef<'a>, brand: Option<&'a str>) -> Self {
        PostRecord {
            brand_id: brand,
            broadcast_guid: p.guid,
            channel_guid: p.channel,
            channel_key: b.channel_key.text(),
            clicks: b.clicks.int(),
            content: b.content.as_deref(),
            created_at: p.created_at,
            finished_at: b.finished_at.int(),
            message: b.message.text(),
            status: b.status.text(),
            trigger_at: b.trigger_at.int(),
        }
    }

    /// The record's JSON text: what serde_json writes for it.
    pub fn to_json(&self) -> String {
        JsonObject::with_capacity(320 + self.content.map_or(0, str::len))
            .text("brand_id", self.brand_id)
            .text("broadcast_guid", Some(self.broadcast_guid))
            .text("channel_guid", Some(self.channel_guid))
            .text("channel_key", self.channel_key.as_deref())
            .int("clicks", self.clicks)
            .text("content", self.content)
            .int("created_at", self.created_at)
            .int("finished_at", self.finished_at)
            .text("message", self.message.as_deref())
            .text("status", self.status.as_deref())
            .int("trigger_at", self.trigger_at)
            .finish()
    }
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

/// The metrics of a broadcast, as the provider reports them; sums stop at
/// the largest count rather than wrapping.
pub fn metrics_of(b: &Broadcast<'_>) -> Result<(PostMetrics, BTreeMap<&'static str, i64>)> {
    let counts = &b.counts()?;
    let mut found = BTreeMap::new();
    for key in ENGAGEMENTS {
        if let Some(n) = int(&counts[key]) {
            found.insert(key, n);
        }
    }
    let engagements =
        if found.is_empty() { None } else { Some(found.values().fold(0i64, |sum, n| sum.saturating_add(*n))) };
    Ok((
        PostMetrics {
            clicks: b.clicks.int(),
            impressions: int(&counts["impressions"]).or_else(|| b.impressions.int()),
            engagements,
        },
        found,
    ))
}

/// A post-metrics record, written straight to its JSON text (fields in
/// the order of their names).
#[derive(Serialize)]
pub struct MetricsRecord<'a> {
    broadcast_guid: &'a str,
    channel_guid: &'a str,
    clicks: Option<i64>,
    comments: Option<i64>,
    engagements: Option<i64>,
    impressions: Option<i64>,
    likes: Option<i64>,
    published_at: Option<i64>,
    shares: Option<i64>,
}

impl<'a> MetricsRecord<'a> {
    /// The metrics record of `b`, identified by `p`.
    pub fn new(b: &Broadcast<'_>, p: &PostRef<'a>) -> Result<Self> {
        let (m, counts) = metrics_of(b)?;
        let first = |keys: &[&str]| keys.iter().find_map(|k| counts.get(k).copied());
        Ok(MetricsRecord {
            broadcast_guid: p.guid,
            channel_guid: p.channel,
            clicks: m.clicks,
            comments: first(&["comments", "replies"]),
            engagements: m.engagements,
            impressions: m.impressions,
            likes: first(&["likes", "favorites", "reactions"]),
            published_at: b.finished_at.int(),
            shares: first(&["shares", "retweets"]),
        })
    }

    /// The record's JSON text: what serde_json writes for it.
    pub fn to_json(&self) -> String {
        JsonObject::with_capacity(256)
            .text("broadcast_guid", Some(self.broadcast_guid))
            .text("channel_guid", Some(self.channel_guid))
            .int("clicks", self.clicks)
            .int("comments", self.comments)
            .int("engagements", self.engagements)
            .int("impressions", self.impressions)
            .int("likes", self.likes)
            .int("published_at", self.published_at)
            .int("shares", self.shares)
            .finish()
    }
}

/// A record's JSON text, written field by field in the order given (the
/// records' fields are in the order of their names). Text without a quote,
/// a backslash or a control character, which is most of what a provider
/// sends, is copied as it is; other text goes through serde_json. Either
/// way the text is what serde_json writes for the same fields. Escaping
/// every post's text again was a third of the connector's own time in a
/// sync (benches/README.md).
struct JsonObject {
    out: String,
}

impl JsonObject {
    fn with_capacity(bytes: usize) -> Self {
        let mut out = String::with_capacity(bytes);
        out.push('{');
        JsonObject { out }
    }

    fn key(&mut self, key: &str) {
        debug_assert!(!needs_escape(key), "field names are plain");
        if self.out.len() > 1 {
            self.out.push(',');
        }
        self.out.push('"');
        self.out.push_str(key);
        self.out.push_str("\":");
    }

    fn text(mut self, key: &str, value: Option<&str>) -> Self {
        self.key(key);
        match value {
            None => self.out.push_str("null"),
            Some(text) if needs_escape(text) => {
                self.out.push_str(&serde_json::to_string(text).expect("text serialises"))
            }
            Some(text) => {
                self.out.push('"');
                self.out.push_str(text);
                self.out.push('"');
            }
        }
        self
    }

    fn int(mut self, key: &str, value: Option<i64>) -> Self {
        self.key(key);
        match value {
            None => self.out.push_str("null"),
            Some(n) => {
                let _ = write!(self.out, "{n}");
            }
        }
        self
    }

    fn finish(mut self) -> String {
        self.out.push('}');
        self.out
    }
}

/// Whether JSON text of `s` needs an escape: a quote, a backslash or a
/// control character (what serde_json escapes). Looks at eight bytes at a
/// time: the guest has no vector instructions, and this runs over every
/// post's text.
fn needs_escape(s: &str) -> bool {
    const ONES: u64 = u64::from_le_bytes([1; 8]);
    const HIGH: u64 = ONES * 0x80;
    // Whether any byte of `x` is zero, or (with `below`) less than that
    // value, for values up to 0x80: exact for "any", which is all this asks.
    let below = |x: u64, n: u8| (x.wrapping_sub(ONES * u64::from(n)) & !x & HIGH) != 0;
    let mut chunks = s.as_bytes().chunks_exact(8);
    for chunk in &mut chunks {
        let x = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        if below(x, 0x20) || below(x ^ (ONES * u64::from(b'"')), 1) || below(x ^ (ONES * u64::from(b'\\')), 1) {
            return true;
        }
    }
    chunks.remainder().iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\')
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
    /// Adds one post; sums stop at the largest count rather than wrapping.
    pub fn add(&mut self, b: &Broadcast<'_>) -> Result<()> {
        let (m, _) = metrics_of(b)?;
        self.posts += 1;
        let plus = |acc: Option<i64>, n: Option<i64>| match (acc, n) {
            (a, None) => a,
            (a, Some(n)) => Some(a.unwrap_or(0).saturating_add(n)),
        };
        self.clicks = plus(self.clicks, m.clicks);
        self.impressions = plus(self.impressions, m.impressions);
        self.engagements = plus(self.engagements, m.engagements);
        self.last_published_at = self.last_published_at.max(b.finished_at.int());
        Ok(())
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
    use crate::api::BroadcastPage;

    fn one(body: &str, each: impl FnOnce(&Broadcast<'_>)) {
        let page = BroadcastPage::from_body(0, format!("[{body}]"));
        each(&page.broadcasts().unwrap()[0]);
    }

    #[test]
    fn metrics_the_provider_does_not_report_are_null_not_zero() {
        one(r#"{ "clicks": 3 }"#, |b| {
            assert_eq!(metrics_of(b).unwrap().0, PostMetrics { clicks: Some(3), impressions: None, engagements: None })
        });
        one(r#"{ "clicks": 1, "interactionCounts": { "impressions": 50, "likes": 4, "comments": 1 } }"#, |b| {
            assert_eq!(
                metrics_of(b).unwrap().0,
                PostMetrics { clicks: Some(1), impressions: Some(50), engagements: Some(5) }
            )
        });
        one(r#"{ "interactionCounts": 7, "interactions": { "favorites": 2 }, "impressions": 9.5 }"#, |b| {
            assert_eq!(
                metrics_of(b).unwrap().0,
                PostMetrics { clicks: None, impressions: Some(9), engagements: Some(2) },
                "counts under their other name"
            )
        });
    }

    #[test]
    fn counts_that_do_not_parse_fail_the_metrics_but_not_the_post() {
        for counts in [r#"{ "likes": 4, "label": "\udc00" }"#, r#"{ "likes": 4, "x": 1e400 }"#] {
            let body = format!(
                r#"{{ "broadcastGuid": "b1", "channelGuid": "c1", "content": "hi", "interactionCounts": {counts} }}"#
            );
            one(&body, |b| {
                let p = post_ref(b).unwrap();
                let err =
                    MetricsRecord::new(b, &p).err().expect("no metrics from counts that do not parse").to_string();
                assert!(err.contains("a broadcast's interaction counts are not valid JSON"), "{err}");
                assert!(ChannelTotals::default().add(b).is_err(), "nor totals");
                assert!(PostRecord::new(b, &p, None).to_json().contains(r#""content":"hi""#), "the post itself reads");
            });
        }
    }

    #[test]
    fn channel_totals_add_only_what_was_reported_and_never_wrap() {
        let mut t = ChannelTotals::default();
        one(r#"{ "clicks": 2, "finishedAt": 10 }"#, |b| t.add(b).unwrap());
        one(r#"{ "clicks": 3, "finishedAt": 30, "interactionCounts": { "impressions": 7 } }"#, |b| t.add(b).unwrap());
        assert_eq!(
            (t.posts, t.clicks, t.impressions, t.engagements, t.last_published_at),
            (2, Some(5), Some(7), None, Some(30))
        );
        one(r#"{ "clicks": 1e19, "interactionCounts": { "likes": 1e19, "comments": 1 } }"#, |b| t.add(b).unwrap());
        assert_eq!((t.clicks, t.engagements), (Some(i64::MAX), Some(i64::MAX)), "sums stop at the largest count");
    }

    #[test]
    fn post_records_carry_only_named_fields() {
        one(
            r#"{ "broadcastGuid": "b1", "channelGuid": "c1", "createdAt": 5, "content": { "body": "hi", "secretish": "x" }, "raw": { "a": 1 } }"#,
            |b| {
                let r: Value =
                    serde_json::from_str(&PostRecord::new(b, &post_ref(b).unwrap(), Some("7")).to_json()).unwrap();
                let keys: Vec<&String> = r.as_object().unwrap().keys().collect();
                assert!(!keys.iter().any(|k| *k == "raw" || *k == "secretish"));
                assert_eq!(r["content"], "hi");
                assert_eq!(r["brand_id"], "7");
            },
        );
    }

    /// The records the previous, value-built code made for each field
    /// shape, written out: escapes, numbers as text, floats, numbers past
    /// `u64::MAX`, wrong types, content as an object, counts under their
    /// other name, and fields given twice (the last counts).
    #[test]
    fn records_are_the_text_the_value_built_records_were() {
        let body = r#"{ "broadcastGuid": "b\"1", "channelGuid": "c1", "channelKey": 42, "status": "SUCCESS", "createdAt": 1.7e3,
            "triggerAt": -4, "finishedAt": "9", "content": "caf\u00e9 \ud83d\ude80", "message": 2.5, "clicks": true,
            "interactionCounts": { "likes": 1, "reactions": 9, "replies": 3, "retweets": 2, "impressions": 11 }, "status": "ERROR" }"#;
        one(body, |b| {
            let p = post_ref(b).unwrap();
            assert_eq!(
                PostRecord::new(b, &p, None).to_json(),
                json!({ "broadcast_guid": "b\"1", "channel_guid": "c1", "channel_key": "42", "brand_id": null, "status": "ERROR",
                    "created_at": 1700, "trigger_at": -4, "finished_at": null, "content": "caf\u{e9} \u{1F680}", "message": "2.5", "clicks": null })
                .to_string()
            );
            assert_eq!(
                MetricsRecord::new(b, &p).unwrap().to_json(),
                json!({ "broadcast_guid": "b\"1", "channel_guid": "c1", "published_at": null, "clicks": null, "impressions": 11,
                    "engagements": 15, "likes": 1, "comments": 3, "shares": 2 })
                .to_string()
            );
        });
        let body = r#"{ "broadcastGuid": "b2", "channelGuid": "c2", "createdAt": 123456789012345678901234, "clicks": 7.9, "channelKey": null,
            "content": { "linkUrl": "u", "body": "first" }, "content": { "body": "second\nline", "body": 3 }, "finishedAt": 20,
            "interactionCounts": [1], "interactions": { "favorites": 5, "retweets": 1, "impressions": "x" }, "impressions": 8 }"#;
        one(body, |b| {
            let p = post_ref(b).unwrap();
            assert_eq!(
                PostRecord::new(b, &p, Some("9")).to_json(),
                json!({ "broadcast_guid": "b2", "channel_guid": "c2", "channel_key": null, "brand_id": "9", "status": null,
                    "created_at": i64::MAX, "trigger_at": null, "finished_at": 20, "content": null, "message": null, "clicks": 7 })
                .to_string(),
                "the last `content` wins, and its last `body` is no text"
            );
            assert_eq!(
                MetricsRecord::new(b, &p).unwrap().to_json(),
                json!({ "broadcast_guid": "b2", "channel_guid": "c2", "published_at": 20, "clicks": 7, "impressions": 8,
                    "engagements": 6, "likes": 5, "comments": null, "shares": 1 })
                .to_string()
            );
        });
        one(r#"{ "content": { "body": "first" }, "content": "plain" }"#, |b| {
            assert_eq!(b.content.as_deref(), Some("plain"))
        });
        one(r#"{ "broadcastGuid": 7, "channelGuid": "c1" }"#, |b| {
            assert!(post_ref(b).is_none(), "no identity without a text id")
        });
    }

    #[test]
    fn text_is_escaped_exactly_where_serde_json_escapes_it() {
        // Every ASCII character and two of several bytes, at every place in
        // and around an eight-byte chunk.
        let specials: Vec<String> = (0u8..0x80)
            .map(|b| char::from(b).to_string())
            .chain(["\u{e9}".to_owned(), "\u{1F680}".to_owned()])
            .collect();
        for special in &specials {
            for len in 0..20 {
                for at in 0..=len {
                    let text = format!("{}{special}{}", "a".repeat(at), "b".repeat(len - at));
                    let escaped = serde_json::to_string(&text).unwrap() != format!("\"{text}\"");
                    assert_eq!(needs_escape(&text), escaped, "{text:?}");
                }
            }
        }
        assert!(!needs_escape(""));
    }

    #[test]
    fn records_are_what_serde_json_writes_for_them() {
        let texts = [
            "plain",
            "",
            "quote \" inside",
            "back\\slash",
            "line\nbreak",
            "tab\tand \u{1} control",
            "caf\u{e9} \u{1F680}, longer than a chunk",
            "\u{7f} is no control",
        ];
        for text in texts {
            let (t, id) = (serde_json::to_string(text).unwrap(), serde_json::to_string(&format!("id-{text}")).unwrap());
            let body = format!(
                r#"{{ "broadcastGuid": {id}, "channelGuid": {id}, "channelKey": {t}, "status": {t}, "message": {t}, "content": {t},
                    "createdAt": -3, "clicks": 9, "finishedAt": 12, "triggerAt": 0, "interactionCounts": {{ "likes": 1, "shares": 2 }} }}"#
            );
            one(&body, |b| {
                let p = post_ref(b).unwrap();
                let post = PostRecord::new(b, &p, Some(text));
                assert_eq!(post.to_json(), serde_json::to_string(&post).unwrap(), "{text:?}");
                let metrics = MetricsRecord::new(b, &p).unwrap();
                assert_eq!(metrics.to_json(), serde_json::to_string(&metrics).unwrap(), "{text:?}");
            });
        }
        one(r#"{ "broadcastGuid": "b", "channelGuid": "c" }"#, |b| {
            let p = post_ref(b).unwrap();
            let post = PostRecord::new(b, &p, None);
            assert_eq!(post.to_json(), serde_json::to_string(&post).unwrap(), "every field missing");
        });
    }

    #[test]
    fn a_listing_that_is_no_array_or_no_json_says_so_without_its_values() {
        let page = BroadcastPage::from_body(
            0,
            r#"[{"broadcastGuid": "b1", "channelGuid": "c"}, 3, null, [1], "x", {"content": {"body": 1}}]"#,
        );
        let items = page.broadcasts().unwrap();
        assert_eq!(items.len(), 6, "items that are no objects are kept, without an identity");
        assert_eq!(items.iter().filter(|b| post_ref(b).is_some()).count(), 1);
        assert_eq!(items[5].content, None, "a body that is no text is no content");
        let err = BroadcastPage::from_body(200, r#"{"results": []}"#).broadcasts().unwrap_err().to_string();
        assert!(err.contains("the broadcasts listing at offset 200 is not a JSON array"), "{err}");
        let page = BroadcastPage::from_body(300, r#"[{"content": "secret-text"#);
        let err = page.broadcasts().unwrap_err().to_string();
        assert!(err.contains("the broadcasts listing at offset 300 is not JSON (line 1, column"), "{err}");
        assert!(!err.contains("secret-text") && !format!("{page:?}").contains("secret-text"), "{err}");
    }
}
