//! `read`: walks a stream's list endpoint page by page and hands the
//! records to the host.
//!
//! | stream | requests |
//! |---|---|
//! | `campaigns`, `campaign_statistics` | `GET /campaigns?sort=-sent&per_page=100&page=N` |
//! | `email_lists` | `GET /email-lists?per_page=100&page=N` |
//! | `subscribers` | for each list: `GET /email-lists/{uuid}/subscribers?per_page=100&page=N`; the lists are `email_list_uuids`, or all lists (`GET /email-lists?...`) when that is empty |
//!
//! Each page is emitted as soon as it arrives. Incremental reads filter
//! records and checkpoint as [`crate::incremental`] explains: the starting
//! cursor after every page, the newest `updated_at` after the last one. Full
//! refreshes emit everything and checkpoint nothing.

use std::borrow::Cow;

use connector_sdk::{Error, ReadRequest, Result, Sink, Value, json, log};

use crate::api::{Api, ListPages};
use crate::config::Config;
use crate::incremental::{CURSOR_FIELD, CursorState, CursorValue, IncrementalRead};
use crate::streams::{StreamName, statistics_record};

/// Reads one stream; see the module documentation.
pub fn read(request: ReadRequest<Config>) -> Result<()> {
    let stream = StreamName::parse(&request.stream).ok_or_else(|| Error::unknown_stream(&request.stream))?;
    let config = &request.config;
    config.validate()?;
    let api = Api::new(config)?;

    let incremental = if request.is_incremental() {
        if !stream.is_incremental() {
            return Err(Error::Unsupported(format!("stream `{}` supports full refresh only", stream.as_str())));
        }
        if let Some(field) = request.cursor_field.as_deref().filter(|f| *f != CURSOR_FIELD) {
            return Err(Error::Unsupported(format!(
                "stream `{}` can only use `{CURSOR_FIELD}` as its cursor, not `{field}`",
                stream.as_str()
            )));
        }
        Some(IncrementalRead::new(saved_cursor(request.state.as_ref()), config.start_date()?))
    } else {
        None
    };
    let mut reader = StreamReader::new(stream, incremental);

    match stream {
        StreamName::Campaigns | StreamName::CampaignStatistics => {
            reader.read_list(api.list("/campaigns", &[("sort", "-sent")]), None)?;
        }
        StreamName::EmailLists => reader.read_list(api.list("/email-lists", &[]), None)?,
        StreamName::Subscribers => {
            let configured = config.email_lists()?;
            let lists = if configured.is_empty() { api.all_email_list_uuids()? } else { configured };
            log::info(format_args!("subscribers: reading {} email lists", lists.len()));
            for list in &lists {
                let path = crate::api::subscribers_path(list)?;
                reader.read_list(api.list(&path, &[]), Some(list))?;
            }
        }
    }
    reader.finish()
}

/// The cursor saved by the last committed read. A state this version does
/// not understand (written by a much older plugin, or hand-edited) is not an
/// error: the read starts over, which re-emits records but loses none.
fn saved_cursor(state: Option<&Value>) -> Option<CursorValue> {
    let state = state?;
    match serde_json::from_value::<CursorState>(state.clone()) {
        Ok(CursorState { updated_at: None }) => None,
        Ok(CursorState { updated_at: Some(text) }) => CursorValue::parse(&text).or_else(|| {
            log::warn("the saved cursor is not a timestamp; reading from the start");
            None
        }),
        Err(_) => {
            log::warn("the saved state is not understood; reading from the start");
            None
        }
    }
}

/// Emits the pages of one stream and keeps its incremental bookkeeping.
struct StreamReader {
    /// The stream being read.
    stream: StreamName,
    /// The filter and cursor of an incremental read; `None` for a full
    /// refresh.
    incremental: Option<IncrementalRead>,
    /// Records received from the provider.
    received: u64,
    /// Records emitted to the host.
    emitted: u64,
}

impl StreamReader {
    fn new(stream: StreamName, incremental: Option<IncrementalRead>) -> Self {
        Self { stream, incremental, received: 0, emitted: 0 }
    }

    /// Emits every page of `pages`. `list` is the email list the pages
    /// belong to, for subscribers.
    fn read_list(&mut self, pages: ListPages, list: Option<&str>) -> Result<()> {
        for page in pages {
            let page = page?;
            let received = page.records().len();
            let mut records: Vec<Cow<'_, str>> = Vec::with_capacity(received);
            for record in page.records() {
                if let Some(incremental) = self.incremental.as_mut()
                    && !incremental.admits_text(record)
                {
                    continue;
                }
                records.push(self.shape_text(record, list)?);
            }
            self.received += received as u64;
            self.emitted += records.len() as u64;
            Sink::emit_json(self.stream.as_str(), &records)?;
            if let Some(state) = self.incremental.as_ref().and_then(IncrementalRead::mid_read_state) {
                Sink::checkpoint(self.stream.as_str(), &json!(state))?;
            }
            let of = page.last_page.map(|l| format!("/{l}")).unwrap_or_default();
            log::info(format_args!(
                "{}: page {}{of}: {received} received, {} emitted",
                self.stream.as_str(),
                page.number,
                records.len()
            ));
        }
        Ok(())
    }

    /// Turns a provider record's JSON text into the stream's: as it is
    /// where the stream passes records through (only statistics, and
    /// subscribers without their list, are parsed and rebuilt).
    fn shape_text<'a>(&self, record: &'a str, list: Option<&str>) -> Result<Cow<'a, str>> {
        /// What decides whether a subscriber needs its list added.
        #[derive(serde::Deserialize)]
        struct ListOf {
            #[serde(default)]
            email_list_uuid: Option<serde::de::IgnoredAny>,
        }
        let rebuild = match self.stream {
            StreamName::CampaignStatistics => true,
            StreamName::Subscribers if list.is_some() => {
                serde_json::from_str::<ListOf>(record).map(|s| s.email_list_uuid.is_none()).unwrap_or(true)
            }
            _ => false,
        };
        if !rebuild {
            return Ok(Cow::Borrowed(record));
        }
        let value: Value = serde_json::from_str(record)
            .map_err(|e| Error::ProviderError(format!("{}: a record is not JSON: {e}", self.stream.as_str())))?;
        Ok(Cow::Owned(self.shape(value, list).to_string()))
    }

    /// Turns a provider record into the stream's record.
    fn shape(&self, record: Value, list: Option<&str>) -> Value {
        match (self.stream, record) {
            (StreamName::CampaignStatistics, campaign) => statistics_record(&campaign),
            (StreamName::Subscribers, Value::Object(mut subscriber)) => {
                // The list the subscriber was read from, when the provider
                // leaves it out (older instances send a numeric list id only).
                if let Some(list) = list {
                    let known = subscriber.get("email_list_uuid").is_some_and(|v| !v.is_null());
                    if !known {
                        subscriber.insert("email_list_uuid".into(), json!(list));
                    }
                }
                Value::Object(subscriber)
            }
            (_, record) => record,
        }
    }

    /// Writes the closing checkpoint of an incremental read.
    fn finish(self) -> Result<()> {
        if let Some(incremental) = &self.incremental {
            Sink::checkpoint(self.stream.as_str(), &json!(incremental.final_state()))?;
            let without = incremental.records_without_cursor();
            if without > 0 {
                log::warn(format_args!(
                    "{}: {without} records had no readable {CURSOR_FIELD} and were emitted unfiltered",
                    self.stream.as_str()
                ));
            }
        }
        log::info(format_args!("{}: done, {} received, {} emitted", self.stream.as_str(), self.received, self.emitted));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_cursor_is_read_from_the_state() {
        let state = json!({ "updated_at": "2024-03-01T10:00:00.000000Z" });
        assert_eq!(saved_cursor(Some(&state)).map(|c| c.text), Some("2024-03-01T10:00:00.000000Z".to_owned()));
    }

    #[test]
    fn no_state_a_null_cursor_or_an_unknown_state_start_from_the_beginning() {
        for state in [
            None,
            Some(json!({ "updated_at": null })),
            Some(json!({ "updated_at": "not a time" })),
            Some(json!({ "last_id": 7 })),
            Some(json!("2024-01-01")),
        ] {
            assert!(saved_cursor(state.as_ref()).is_none(), "{state:?}");
        }
    }

    #[test]
    fn subscribers_get_the_list_they_were_read_from_when_missing() {
        let reader = StreamReader::new(StreamName::Subscribers, None);
        let shaped = reader.shape(json!({ "uuid": "s1", "email_list_uuid": null }), Some("l1"));
        assert_eq!(shaped["email_list_uuid"], json!("l1"));
        let kept = reader.shape(json!({ "uuid": "s1", "email_list_uuid": "l2" }), Some("l1"));
        assert_eq!(kept["email_list_uuid"], json!("l2"));
    }

    #[test]
    fn record_text_passes_through_unparsed_unless_the_stream_reshapes_it() {
        let campaigns = StreamReader::new(StreamName::Campaigns, None);
        let text = r#"{"uuid":"c1","html":"<p>hi</p>","open_rate":4523}"#;
        assert!(matches!(campaigns.shape_text(text, None).unwrap(), Cow::Borrowed(t) if t == text));
        let subscribers = StreamReader::new(StreamName::Subscribers, None);
        let with_list = r#"{"uuid":"s1","email_list_uuid":"l2"}"#;
        assert!(matches!(subscribers.shape_text(with_list, Some("l1")).unwrap(), Cow::Borrowed(_)));
        let without: Value = serde_json::from_str(
            &subscribers.shape_text(r#"{"uuid":"s1","email_list_uuid":null}"#, Some("l1")).unwrap(),
        )
        .unwrap();
        assert_eq!(without["email_list_uuid"], json!("l1"));
        let statistics = StreamReader::new(StreamName::CampaignStatistics, None);
        let shaped =
            statistics.shape_text(r#"{"uuid":"c1","sent_to_number_of_subscribers":10,"open_count":5}"#, None).unwrap();
        assert!(matches!(shaped, Cow::Owned(_)), "statistics are rebuilt: {shaped}");
        assert!(statistics.shape_text("not json", None).is_err());
    }

    #[test]
    fn campaigns_pass_through_unchanged() {
        let reader = StreamReader::new(StreamName::Campaigns, None);
        let campaign = json!({ "uuid": "c1", "html": "<p>hi</p>", "open_rate": 4523 });
        assert_eq!(reader.shape(campaign.clone(), None), campaign);
    }
}
