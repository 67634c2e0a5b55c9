//! A realistic cursor-paginated REST source, for the host's pipeline tests
//! and throughput benchmarks.
//!
//! The provider (a test server behind `*.source.test`) answers
//!
//! ```text
//! GET {base_url}/events?cursor=<c>&limit=<page_size>      (no cursor: from the start)
//! Authorization: Bearer <secret>                            (attached by the host)
//!
//! {"data": [ {...}, {...} ], "next_cursor": "<c2>" | null}
//! ```
//!
//! Each page's records are handed to the host exactly as the provider wrote
//! them: they are split out of the page as raw JSON text and never parsed
//! into values or serialised again, so the plugin costs the pipeline as
//! little as possible. After every page the read checkpoints
//! `{"cursor": <next_cursor>}`; on the last page (`next_cursor` null) it
//! checkpoints the cursor that fetched that page, so an incremental read
//! resumes by asking for the last page again and picks up whatever the
//! provider appended since.

use connector_sdk::bindings::service::connector1_0_0::sink as wire_sink;
use connector_sdk::sink::{MAX_BATCH_BYTES, MAX_BATCH_RECORDS};
use connector_sdk::{
    CheckResult, Connector, ConnectorInfo, Error, Http, Operation, Placement, ReadRequest, RequestBuilder, Result,
    Sink, SinkError, Stream, export_connector, json, log,
};
use serde::Deserialize;
use serde_json::value::RawValue;

const STREAM: &str = "events";

fn default_page_size() -> u32 {
    1000
}

#[derive(Deserialize)]
struct Config {
    /// For example `https://api.source.test`.
    base_url: String,
    /// The API token, used as a Bearer token by the host.
    credential_handle: String,
    /// Records per page (the `limit` query parameter).
    #[serde(default = "default_page_size")]
    page_size: u32,
}

impl Config {
    fn validate(&self) -> Result<()> {
        if !self.base_url.starts_with("https://") {
            return Err(Error::InvalidConfig("base_url: must be an https:// URL".to_owned()));
        }
        if self.page_size == 0 {
            return Err(Error::InvalidConfig("page_size: must be at least 1".to_owned()));
        }
        Ok(())
    }

    /// `GET {base_url}/events` with the credential attached.
    fn events(&self) -> RequestBuilder {
        Http::get(format!("{}/events", self.base_url.trim_end_matches('/')))
            .credential(&self.credential_handle, Placement::Bearer)
    }
}

/// One page of the list, records kept as the provider's text.
#[derive(Deserialize)]
struct EventsPage {
    data: Vec<Box<RawValue>>,
    #[serde(default)]
    next_cursor: Option<String>,
}

/// What a read checkpoints: where to continue.
#[derive(Deserialize)]
struct State {
    cursor: Option<String>,
}

struct PagedSource;

impl Connector for PagedSource {
    type Config = Config;

    fn describe() -> ConnectorInfo {
        ConnectorInfo::source("test_paged_source", "Paged REST source (test plugin)", env!("CARGO_PKG_VERSION"))
            .with_hosts(["*.source.test"])
            .with_operations([Operation::Check, Operation::Discover, Operation::Read])
            .with_config_schema(json!({
                "type": "object",
                "required": ["base_url", "credential_handle"],
                "properties": {
                    "base_url": {
                        "type": "string",
                        "format": "uri",
                        "description": "The API's base URL, for example https://api.source.test"
                    },
                    "credential_handle": {
                        "type": "string",
                        "description": "API token, sent as a Bearer token"
                    },
                    "page_size": {
                        "type": "integer",
                        "minimum": 1,
                        "default": 1000,
                        "description": "Records per page"
                    }
                }
            }))
    }

    fn check(config: Config) -> Result<CheckResult> {
        config.validate()?;
        let response = config.events().query("limit", 1).send_raw()?;
        let status = response.status();
        if status == 200 {
            return Ok(CheckResult::success(format!("{} answers", config.base_url)));
        }
        // 401 becomes invalid-credentials, 403 permission-denied, 429
        // rate-limited, 5xx provider-unavailable, other 4xx provider-error.
        response.error_for_status()?;
        Ok(CheckResult::failure(format!("the events endpoint answered HTTP {status} instead of 200")))
    }

    fn discover(_config: Config) -> Result<Vec<Stream>> {
        let event = json!({
            "type": "object",
            "required": ["id"],
            "properties": {
                "id": { "type": ["string", "integer"] },
                "kind": { "type": "string" },
                "updated_at": { "type": "string", "format": "date-time" },
                "payload": {
                    "type": "object",
                    "additionalProperties": false,
                    "properties": { "n": { "type": "integer" } }
                },
                "note": { "type": ["string", "null"] },
                "amount": { "type": ["string", "number", "null"], "format": "decimal", "precision": 38, "scale": 9 },
                "day": { "type": ["string", "null"], "format": "date" }
            },
            "additionalProperties": true
        });
        Ok(vec![Stream::new(STREAM, event).with_primary_key(["id"]).with_incremental_cursor("updated_at")])
    }

    fn read(request: ReadRequest<Config>) -> Result<()> {
        if request.stream != STREAM {
            return Err(Error::unknown_stream(&request.stream));
        }
        let config = &request.config;
        config.validate()?;
        // The host passes a state only when resuming (incremental reads, or
        // a retry after a failure); without one, start from the beginning.
        let mut cursor = request.state_as::<State>()?.and_then(|state| state.cursor);
        let (mut pages, mut records) = (0u64, 0u64);
        loop {
            let mut page_request = config.events();
            if let Some(cursor) = &cursor {
                page_request = page_request.query("cursor", cursor);
            }
            let page: EventsPage = page_request.query("limit", config.page_size).send()?.json()?;
            pages += 1;
            records += page.data.len() as u64;
            emit_raw(STREAM, page.data)?;
            match page.next_cursor.filter(|next| !next.is_empty()) {
                Some(next) if cursor.as_deref() == Some(next.as_str()) => {
                    return Err(Error::ProviderError(format!("page {pages} points back to itself as the next page")));
                }
                Some(next) => {
                    Sink::checkpoint(STREAM, &json!({ "cursor": next }))?;
                    cursor = Some(next);
                }
                None => {
                    Sink::checkpoint(STREAM, &json!({ "cursor": cursor }))?;
                    break;
                }
            }
        }
        log::info(format_args!("{STREAM}: {records} records in {pages} pages"));
        Ok(())
    }
}

/// Hands records to the host as they are, in batches within the same limits
/// the SDK's `Sink::emit` keeps (which would re-serialise every record).
fn emit_raw(stream: &str, records: Vec<Box<RawValue>>) -> Result<()> {
    let mut batch: Vec<String> = Vec::with_capacity(records.len().min(MAX_BATCH_RECORDS));
    let (mut batch_bytes, mut batch_start) = (0, 0);
    for (index, record) in records.into_iter().enumerate() {
        let text = String::from(Box::<str>::from(record));
        let fits = batch.len() < MAX_BATCH_RECORDS && batch_bytes + text.len() <= MAX_BATCH_BYTES;
        if !batch.is_empty() && !fits {
            flush(stream, &mut batch, batch_start)?;
            batch_bytes = 0;
            batch_start = index;
        }
        batch_bytes += text.len();
        batch.push(text);
    }
    if !batch.is_empty() {
        flush(stream, &mut batch, batch_start)?;
    }
    Ok(())
}

/// One `sink.emit` call; a record index in the host's answer is made
/// relative to the whole page.
fn flush(stream: &str, batch: &mut Vec<String>, offset: usize) -> Result<()> {
    let result = wire_sink::emit(stream, batch);
    batch.clear();
    result.map_err(|e| match SinkError::from(e) {
        SinkError::RecordTooLarge { index } => SinkError::RecordTooLarge { index: index + offset },
        other => other,
    })?;
    Ok(())
}

export_connector!(PagedSource);
