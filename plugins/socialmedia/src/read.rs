//! `read`: one stream at a time, only the selected channels.
//!
//! Every stream lists the channels first (to know the selected ones and
//! their brands). `posts`, `post_metrics` and `channel_statistics` then page
//! through the published posts, 100 at a time by offset, until a short
//! page. Each page is parsed once into [`Broadcast`]s that borrow from its
//! body, and records are written straight to JSON text
//! ([`PostRecord`], [`MetricsRecord`]): reading `posts` builds no tree of
//! values at all; the metrics streams parse only each post's small
//! interaction counts. Pages are not requested ahead: the listing says nothing of its
//! length, so a request ahead would be a guess, and every guess past the
//! end would spend the portal's rate limit (110 requests per 10 s).
//!
//! `posts` reads incrementally on `created_at`, with a cursor per channel:
//! a channel added to the selection later is read from its beginning. The
//! provider's `since` filter is inclusive and takes one time, so a read asks
//! from the oldest cursor of the selected channels and each channel skips
//! what its own cursor covers (its newest creation time, and the posts
//! created at exactly that time). The listing's order is not documented, so
//! the state is checkpointed once, after the last page; an interrupted read
//! starts again from the previous state and the host's deduplication on
//! `broadcast_guid` absorbs the repeats. Metrics change after publishing, so `post_metrics` and
//! `channel_statistics` are read in full every time.

use std::collections::BTreeMap;

use connector_sdk::{Error, ReadRequest, Result, Sink, Value, json, log};
use serde::{Deserialize, Serialize};

use crate::api::{Api, Broadcast, Channel, PAGE_SIZE};
use crate::config::Config;
use crate::streams::{CURSOR_FIELD, ChannelTotals, MetricsRecord, PostRecord, StreamName, channel_record, post_ref};

/// Far more pages than any portal has: a provider that never sends a
/// short page cannot keep a read going forever.
const MAX_PAGES: usize = 100_000;

/// The checkpointed state of `posts`: a cursor per channel.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
pub struct PostsState {
    /// By channel GUID.
    #[serde(default)]
    pub channels: BTreeMap<String, ChannelCursor>,
}

impl PostsState {
    /// The `since` to ask the provider for: the oldest cursor of the
    /// selected channels, or none when one of them has never been read.
    fn since_for<'a>(&self, selected: impl IntoIterator<Item = &'a str>) -> Option<i64> {
        let mut oldest: Option<i64> = None;
        for channel in selected {
            let since = self.channels.get(channel)?.since?;
            oldest = Some(oldest.map_or(since, |o| o.min(since)));
        }
        oldest
    }
}

/// How far the posts of one channel have been read.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChannelCursor {
    /// The newest `created_at` read so far.
    pub since: Option<i64>,
    /// The posts created at exactly `since`, already read.
    #[serde(default)]
    pub at_since: Vec<String>,
}

impl ChannelCursor {
    /// Whether a post was read by the read that saved this state: older
    /// than the cursor, or at it and seen there.
    fn already_read(&self, guid: &str, created_at: Option<i64>) -> bool {
        match (self.since, created_at) {
            (Some(since), Some(t)) => t < since || (t == since && self.at_since.iter().any(|g| g == guid)),
            _ => false,
        }
    }

    /// Takes one emitted post into account.
    fn advance(&mut self, guid: &str, created_at: Option<i64>) {
        let Some(t) = created_at else { return };
        match self.since {
            Some(s) if t < s => {}
            Some(s) if t == s => {
                if !self.at_since.iter().any(|g| g == guid) {
                    self.at_since.push(guid.to_owned());
                }
            }
            _ => {
                self.since = Some(t);
                self.at_since = vec![guid.to_owned()];
            }
        }
    }
}

/// Reads one stream; see the module documentation.
pub fn read(request: ReadRequest<Config>) -> Result<()> {
    let stream = StreamName::parse(&request.stream)
        .ok_or_else(|| Error::Unsupported(format!("unknown stream `{}`", request.stream)))?;
    let config = &request.config;
    config.validate()?;
    if request.is_incremental() {
        if stream != StreamName::Posts {
            return Err(Error::Unsupported(format!("stream `{}` supports full refresh only", stream.as_str())));
        }
        if let Some(field) = request.cursor_field.as_deref().filter(|f| *f != CURSOR_FIELD) {
            return Err(Error::Unsupported(format!(
                "stream `posts` can only use `{CURSOR_FIELD}` as its cursor, not `{field}`"
            )));
        }
    }
    let api = Api::new(&config.credential_handle);
    let channels: Vec<Channel> = api.channels()?.into_iter().filter(|c| config.selects(&c.channel_guid)).collect();
    if channels.len() < config.channel_ids.len() {
        log::warn(format_args!(
            "{} of {} selected channels are no longer connected at the provider",
            config.channel_ids.len() - channels.len(),
            config.channel_ids.len()
        ));
    }
    let brand_of: BTreeMap<&str, Option<String>> =
        channels.iter().map(|c| (c.channel_guid.as_str(), c.brand().map(|b| b.0))).collect();

    match stream {
        StreamName::Channels => {
            let records: Vec<Value> = channels.iter().map(channel_record).collect();
            Sink::emit(stream.as_str(), &records)?;
        }
        StreamName::Posts => {
            // A state in an older shape is not understood: read everything once.
            let saved: PostsState = if request.is_incremental() {
                request.state_as().ok().flatten().unwrap_or_default()
            } else {
                PostsState::default()
            };
            let mut next = saved.clone();
            let mut read = 0usize;
            let since = saved.since_for(brand_of.keys().copied());
            for_each_page(&api, since, |page| {
                let mut records = Vec::with_capacity(page.len());
                for b in page {
                    let Some(p) = post_ref(b) else { continue };
                    let Some(brand) = brand_of.get(p.channel) else { continue };
                    if saved.channels.get(p.channel).is_some_and(|c| c.already_read(p.guid, p.created_at)) {
                        continue;
                    }
                    match next.channels.get_mut(p.channel) {
                        Some(cursor) => cursor.advance(p.guid, p.created_at),
                        None => next.channels.entry(p.channel.to_owned()).or_default().advance(p.guid, p.created_at),
                    }
                    records.push(PostRecord::new(b, &p, brand.as_deref()).to_json());
                }
                read += records.len();
                Ok(Sink::emit_json(stream.as_str(), &records)?)
            })?;
            log::info(format_args!("posts: {read} read"));
            if request.is_incremental() {
                Sink::checkpoint(stream.as_str(), &json!(next))?;
            }
        }
        StreamName::PostMetrics => {
            for_each_page(&api, None, |page| {
                let mut records = Vec::with_capacity(page.len());
                for b in page {
                    if let Some(p) = post_ref(b).filter(|p| brand_of.contains_key(p.channel)) {
                        records.push(MetricsRecord::new(b, &p)?.to_json());
                    }
                }
                Ok(Sink::emit_json(stream.as_str(), &records)?)
            })?;
        }
        StreamName::ChannelStatistics => {
            let mut totals: BTreeMap<String, ChannelTotals> = BTreeMap::new();
            for_each_page(&api, None, |page| {
                for b in page {
                    if let Some(p) = post_ref(b).filter(|p| brand_of.contains_key(p.channel)) {
                        totals.entry(p.channel.to_owned()).or_default().add(b)?;
                    }
                }
                Ok(())
            })?;
            let records: Vec<Value> =
                channels.iter().map(|c| totals.get(&c.channel_guid).cloned().unwrap_or_default().record(c)).collect();
            Sink::emit(stream.as_str(), &records)?;
        }
    }
    Ok(())
}

/// Calls `each` with every page of published posts created at or after
/// `since`.
fn for_each_page(api: &Api, since: Option<i64>, mut each: impl FnMut(&[Broadcast<'_>]) -> Result<()>) -> Result<()> {
    let mut offset = 0;
    for _ in 0..MAX_PAGES {
        let body = api.broadcasts(since, offset)?;
        let page = body.broadcasts()?;
        each(&page)?;
        if page.len() < PAGE_SIZE {
            return Ok(());
        }
        offset += page.len();
    }
    Err(Error::ProviderError(format!("the broadcasts listing did not end after {MAX_PAGES} pages")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_added_to_the_selection_is_read_from_its_beginning() {
        let mut state = PostsState::default();
        state.channels.entry("a".into()).or_default().advance("p1", Some(50));
        state.channels.entry("b".into()).or_default().advance("p2", Some(20));
        assert_eq!(state.since_for(["a", "b"]), Some(20), "the oldest cursor");
        assert_eq!(state.since_for(["a", "new"]), None, "a channel never read: from the start");
    }

    #[test]
    fn the_posts_state_skips_exactly_what_the_last_read_saw_at_its_boundary() {
        let mut s = ChannelCursor::default();
        s.advance("a", Some(10));
        s.advance("b", Some(20));
        s.advance("c", Some(20));
        s.advance("d", Some(15));
        assert_eq!(s, ChannelCursor { since: Some(20), at_since: vec!["b".into(), "c".into()] });
        assert!(s.already_read("b", Some(20)));
        assert!(!s.already_read("e", Some(20)), "a post created in the same millisecond but not yet seen is read");
        assert!(!s.already_read("b", Some(21)));
        assert!(s.already_read("a", Some(10)), "older than the cursor: read before");
    }
}
