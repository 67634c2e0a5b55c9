//! The only code that builds requests to the provider.
//!
//! | what | request |
//! |---|---|
//! | the portal | `GET /account-info/v3/details` → `portalId`, `uiDomain`, ... |
//! | brands | `GET /business-units/v3/business-units/user/{userId}` → `{"results": [{"id", "name"}]}` (not paged) |
//! | channels | `GET /broadcast/v1/channels/setting/publish/current` → a bare array |
//! | posts | `GET /broadcast/v1/broadcasts?status=success&since=<ms>&count=100&offset=N` → a bare array per page ([`BroadcastPage`]) |
//!
//! Every request carries the credential handle with bearer placement; the
//! host injects the access token, refreshes it when it expires (and when the
//! provider answers that it expired), and never shows it to the plugin.
//! 429s are retried after `Retry-After` by the SDK.

use std::borrow::Cow;
use std::marker::PhantomData;

use connector_sdk::{Error, Http, Placement, RequestBuilder, Result, Value, serde_json};
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::config::Id;

/// The provider's API.
pub const API: &str = "https://api.hubapi.com";

/// Posts per page of the broadcasts listing.
pub const PAGE_SIZE: usize = 100;

/// The portal the credential belongs to.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Account {
    /// The portal (hub) id.
    pub portal_id: Value,
    /// The domain of the portal's app, when given.
    #[serde(default)]
    pub ui_domain: Option<String>,
}

/// A brand (business unit).
#[derive(Debug, Deserialize)]
pub struct Brand {
    /// The brand id.
    pub id: Value,
    /// Its name.
    #[serde(default)]
    pub name: Option<String>,
}

/// A connected social channel.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Channel {
    /// The channel GUID: what the config selects.
    pub channel_guid: String,
    /// The network and account, for example `FacebookPage:1234`.
    #[serde(default)]
    pub channel_key: Option<String>,
    /// The network's account type, for example `FacebookPage`.
    #[serde(default)]
    pub account_type: Option<String>,
    /// Names as the provider gives them; null for some networks.
    #[serde(default)]
    pub name: Option<String>,
    /// See `name`.
    #[serde(default)]
    pub display_name: Option<String>,
    /// Whether the channel can publish.
    #[serde(default)]
    pub active: Option<bool>,
    /// The portal it belongs to.
    #[serde(default)]
    pub portal_id: Option<Value>,
    /// The brand (business unit) it belongs to.
    #[serde(default)]
    pub business_unit_id: Option<Value>,
}

impl Channel {
    /// What to show a person: the display name, the name, or the key.
    pub fn label(&self) -> String {
        let name = self.display_name.as_deref().or(self.name.as_deref()).filter(|n| !n.trim().is_empty());
        match (name, self.account_type.as_deref()) {
            (Some(n), Some(t)) => format!("{n} ({t})"),
            (Some(n), None) => n.to_owned(),
            (None, _) => self.channel_key.clone().unwrap_or_else(|| self.channel_guid.clone()),
        }
    }

    /// The brand the channel belongs to, as text.
    pub fn brand(&self) -> Option<Id> {
        self.business_unit_id.as_ref().and_then(Id::from_value)
    }
}

/// The provider's API through one credential.
pub struct Api<'a> {
    handle: &'a str,
}

impl<'a> Api<'a> {
    /// Requests made with the credential behind `handle`.
    pub fn new(handle: &'a str) -> Self {
        Api { handle }
    }

    fn get(&self, path: &str) -> RequestBuilder {
        Http::get(format!("{API}{path}"))
            .header("accept", "application/json")
            .credential(self.handle, Placement::Bearer)
    }

    /// The portal the credential belongs to.
    pub fn account(&self) -> Result<Account> {
        self.get("/account-info/v3/details").send()?.json()
    }

    /// The brands the user who authorised the credential can access.
    pub fn brands(&self, user: &Id) -> Result<Vec<Brand>> {
        #[derive(Deserialize)]
        struct Brands {
            results: Vec<Brand>,
        }
        let path =
            format!("/business-units/v3/business-units/user/{}", user.path_segment("credential_account.user_id")?);
        Ok(self.get(&path).send()?.json::<Brands>()?.results)
    }

    /// Every connected channel of the portal.
    pub fn channels(&self) -> Result<Vec<Channel>> {
        self.get("/broadcast/v1/channels/setting/publish/current").send()?.json()
    }

    /// One page of published posts created at or after `since` (epoch ms),
    /// as the provider sent it; [`BroadcastPage::broadcasts`] reads it.
    pub fn broadcasts(&self, since: Option<i64>, offset: usize) -> Result<BroadcastPage> {
        let mut req = self
            .get("/broadcast/v1/broadcasts")
            .query("status", "success")
            .query("count", PAGE_SIZE)
            .query("offset", offset);
        if let Some(since) = since {
            req = req.query("since", since);
        }
        Ok(BroadcastPage { offset, body: req.send()?.into_text()? })
    }
}

/// Visitor methods answering `$value` for booleans, numbers and null:
/// values a field of the wrong type is read as.
macro_rules! other_scalars {
    ($ty:ty, $value:expr) => {
        fn visit_bool<E>(self, _: bool) -> std::result::Result<$ty, E> {
            Ok($value)
        }
        fn visit_i64<E>(self, _: i64) -> std::result::Result<$ty, E> {
            Ok($value)
        }
        fn visit_u64<E>(self, _: u64) -> std::result::Result<$ty, E> {
            Ok($value)
        }
        fn visit_f64<E>(self, _: f64) -> std::result::Result<$ty, E> {
            Ok($value)
        }
        fn visit_unit<E>(self) -> std::result::Result<$ty, E> {
            Ok($value)
        }
    };
}

/// A page of the broadcasts listing: its body, parsed when read, so that
/// the broadcasts borrow their text from it instead of being copied into
/// a tree of values.
pub struct BroadcastPage {
    /// Where the page starts in the listing, for messages.
    offset: usize,
    body: String,
}

/// Never the body: it is the provider's content.
impl std::fmt::Debug for BroadcastPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BroadcastPage").field("offset", &self.offset).field("bytes", &self.body.len()).finish()
    }
}

impl BroadcastPage {
    /// The page at `offset` from its body as the provider sent it (tests).
    pub fn from_body(offset: usize, body: impl Into<String>) -> Self {
        BroadcastPage { offset, body: body.into() }
    }

    /// The page's broadcasts. An item that is not an object is an empty
    /// broadcast (it has no identity, so it is skipped); a body that is not
    /// an array is not a listing; one that is not JSON says where it breaks,
    /// never what it holds.
    pub fn broadcasts(&self) -> Result<Vec<Broadcast<'_>>> {
        let offset = self.offset;
        serde_json::from_str(&self.body).map_err(|e| {
            if e.is_data() {
                Error::ProviderError(format!("the broadcasts listing at offset {offset} is not a JSON array"))
            } else {
                Error::ProviderError(format!(
                    "the broadcasts listing at offset {offset} is not JSON (line {}, column {})",
                    e.line(),
                    e.column()
                ))
            }
        })
    }
}

/// A published post as the provider lists it: only the fields the streams
/// use, each taken as it comes ([`Scalar`]). The rest is skipped, checked
/// only as far as finding where it ends needs: a malformed field that no
/// stream reads (an unpaired escape in a field of no interest, say) does
/// not fail the read. A field given twice counts with its last value.
#[derive(Debug, Default)]
pub struct Broadcast<'a> {
    /// `broadcastGuid`
    pub guid: Scalar<'a>,
    /// `channelGuid`
    pub channel: Scalar<'a>,
    /// `channelKey`
    pub channel_key: Scalar<'a>,
    /// `status`
    pub status: Scalar<'a>,
    /// `createdAt` (epoch ms)
    pub created_at: Scalar<'a>,
    /// `triggerAt` (epoch ms)
    pub trigger_at: Scalar<'a>,
    /// `finishedAt` (epoch ms)
    pub finished_at: Scalar<'a>,
    /// `content`: its text, or the `body` of an object.
    pub content: Option<Cow<'a, str>>,
    /// `message`
    pub message: Scalar<'a>,
    /// `clicks`
    pub clicks: Scalar<'a>,
    /// `impressions`, where a network reports them beside the counts.
    pub impressions: Scalar<'a>,
    /// `interactionCounts` and `interactions`, as their JSON text: only
    /// the metrics streams read them, with [`Broadcast::counts`].
    counts: [Option<&'a RawValue>; 2],
}

impl Broadcast<'_> {
    /// The interaction counts: `interactionCounts`, or `interactions` when
    /// that is not an object; `null` when neither is given. Counts that do
    /// not parse (an unpaired escape, a number beyond any float) are a
    /// provider error, never counts of nothing.
    pub fn counts(&self) -> Result<Value> {
        let [counts, interactions] = self.counts;
        let chosen = match counts {
            Some(raw) if raw.get().starts_with('{') => Some(raw),
            _ => interactions,
        };
        chosen.map_or(Ok(Value::Null), |raw| {
            serde_json::from_str(raw.get()).map_err(|e| {
                Error::ProviderError(format!(
                    "a broadcast's interaction counts are not valid JSON (column {})",
                    e.column()
                ))
            })
        })
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Broadcast<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visit<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for Visit<'a> {
            type Value = Broadcast<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a broadcast")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> std::result::Result<Broadcast<'a>, M::Error> {
                let mut b = Broadcast::default();
                // Keys as `Scalar`s: serde's own `Cow` always copies.
                while let Some(key) = map.next_key::<Scalar<'de>>()? {
                    match key.as_str().unwrap_or_default() {
                        "broadcastGuid" => b.guid = map.next_value()?,
                        "channelGuid" => b.channel = map.next_value()?,
                        "channelKey" => b.channel_key = map.next_value()?,
                        "status" => b.status = map.next_value()?,
                        "createdAt" => b.created_at = map.next_value()?,
                        "triggerAt" => b.trigger_at = map.next_value()?,
                        "finishedAt" => b.finished_at = map.next_value()?,
                        "content" => b.content = map.next_value::<Content<'a>>()?.0,
                        "message" => b.message = map.next_value()?,
                        "clicks" => b.clicks = map.next_value()?,
                        "impressions" => b.impressions = map.next_value()?,
                        "interactionCounts" => b.counts[0] = Some(map.next_value()?),
                        "interactions" => b.counts[1] = Some(map.next_value()?),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(b)
            }
            fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> std::result::Result<Broadcast<'a>, S::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Broadcast::default())
            }
            fn visit_str<E>(self, _: &str) -> std::result::Result<Broadcast<'a>, E> {
                Ok(Broadcast::default())
            }
            other_scalars!(Broadcast<'a>, Broadcast::default());
        }
        d.deserialize_any(Visit(PhantomData))
    }
}

/// A field as the provider sends it: text (borrowed from the page where it
/// has no escapes), a number, or anything else, which counts as missing.
#[derive(Debug, Default, Clone, PartialEq)]
pub enum Scalar<'a> {
    /// A string.
    Text(Cow<'a, str>),
    /// A number.
    Number(serde_json::Number),
    /// Missing, null, or neither text nor a number.
    #[default]
    Other,
}

impl Scalar<'_> {
    /// The text of a string field.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Scalar::Text(t) => Some(t),
            _ => None,
        }
    }

    /// As text: a string as it is, a number written out, else nothing.
    pub fn text(&self) -> Option<Cow<'_, str>> {
        match self {
            Scalar::Text(t) => Some(Cow::Borrowed(t)),
            Scalar::Number(n) => Some(Cow::Owned(n.to_string())),
            Scalar::Other => None,
        }
    }

    /// As a whole number: an integer, or a finite non-negative number cut to
    /// one; else nothing.
    pub fn int(&self) -> Option<i64> {
        match self {
            Scalar::Number(n) => {
                n.as_i64().or_else(|| n.as_f64().filter(|f| f.is_finite() && *f >= 0.0).map(|f| f as i64))
            }
            _ => None,
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Scalar<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visit<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for Visit<'a> {
            type Value = Scalar<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> std::result::Result<Scalar<'a>, E> {
                Ok(Scalar::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> std::result::Result<Scalar<'a>, E> {
                Ok(Scalar::Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> std::result::Result<Scalar<'a>, E> {
                Ok(Scalar::Text(Cow::Owned(v)))
            }
            fn visit_i64<E>(self, v: i64) -> std::result::Result<Scalar<'a>, E> {
                Ok(Scalar::Number(v.into()))
            }
            fn visit_u64<E>(self, v: u64) -> std::result::Result<Scalar<'a>, E> {
                Ok(Scalar::Number(v.into()))
            }
            fn visit_f64<E>(self, v: f64) -> std::result::Result<Scalar<'a>, E> {
                Ok(serde_json::Number::from_f64(v).map_or(Scalar::Other, Scalar::Number))
            }
            fn visit_bool<E>(self, _: bool) -> std::result::Result<Scalar<'a>, E> {
                Ok(Scalar::Other)
            }
            fn visit_unit<E>(self) -> std::result::Result<Scalar<'a>, E> {
                Ok(Scalar::Other)
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> std::result::Result<Scalar<'a>, M::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other)
            }
            fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> std::result::Result<Scalar<'a>, S::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other)
            }
        }
        d.deserialize_any(Visit(PhantomData))
    }
}

/// A post's `content`: its text, or the text of the `body` of an object.
struct Content<'a>(Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visit<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for Visit<'a> {
            type Value = Content<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> std::result::Result<Content<'a>, M::Error> {
                let mut body = None;
                while let Some(key) = map.next_key::<Scalar<'de>>()? {
                    if key.as_str() == Some("body") {
                        body = match map.next_value::<Scalar<'a>>()? {
                            Scalar::Text(t) => Some(t),
                            _ => None,
                        };
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Content(body))
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> std::result::Result<Content<'a>, E> {
                Ok(Content(Some(Cow::Borrowed(v))))
            }
            fn visit_str<E>(self, v: &str) -> std::result::Result<Content<'a>, E> {
                Ok(Content(Some(Cow::Owned(v.to_owned()))))
            }
            fn visit_string<E>(self, v: String) -> std::result::Result<Content<'a>, E> {
                Ok(Content(Some(Cow::Owned(v))))
            }
            other_scalars!(Content<'a>, Content(None));
            fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> std::result::Result<Content<'a>, S::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Content(None))
            }
        }
        d.deserialize_any(Visit(PhantomData))
    }
}
