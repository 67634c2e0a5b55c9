//! A paged source that stamps every record with the version of the plugin
//! that read it, for the host's upgrade tests: a sync that started on one
//! version must land only that version's stamp, however many pages later
//! another version became current.
//!
//! Built twice from this one file: `test-versioned-one` (1.0.0) and
//! `test-versioned-two` (2.0.0, feature `wider`), which declares one more
//! host and one more operation, so making it current widens what the
//! connector may do.
//!
//! The provider is the paged source's (`GET {base_url}/events?cursor&limit`
//! answering `{"data": [...], "next_cursor": ...}`, a Bearer token).

use connector_sdk::{
    CheckResult, Connector, ConnectorInfo, Error, Http, Operation, Placement, ReadRequest, Result, Sink, Stream, Value,
    export_connector, json,
};
use serde::Deserialize;

const STREAM: &str = "events";
const VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Deserialize)]
struct Config {
    base_url: String,
    credential_handle: String,
    #[serde(default = "default_page_size")]
    page_size: u32,
}

fn default_page_size() -> u32 {
    100
}

#[derive(Deserialize)]
struct Page {
    data: Vec<Value>,
    #[serde(default)]
    next_cursor: Option<String>,
}

#[derive(Deserialize)]
struct State {
    cursor: Option<String>,
}

struct Versioned;

impl Connector for Versioned {
    type Config = Config;

    fn describe() -> ConnectorInfo {
        let hosts: &[&str] =
            if cfg!(feature = "wider") { &["*.source.test", "*.mirror.test"] } else { &["*.source.test"] };
        let operations: &[Operation] = if cfg!(feature = "wider") {
            &[Operation::Check, Operation::Discover, Operation::Read, Operation::Preview]
        } else {
            &[Operation::Check, Operation::Discover, Operation::Read]
        };
        ConnectorInfo::source("test_versioned", "Versioned source (test plugin)", VERSION)
            .with_hosts(hosts.iter().copied())
            .with_operations(operations.iter().copied())
            .with_config_schema(json!({
                "type": "object",
                "required": ["base_url", "credential_handle"],
                "properties": {
                    "base_url": { "type": "string" },
                    "credential_handle": { "type": "string" },
                    "page_size": { "type": "integer", "minimum": 1 }
                }
            }))
    }

    fn check(_config: Config) -> Result<CheckResult> {
        Ok(CheckResult::success(format!("test_versioned {VERSION}")))
    }

    fn discover(_config: Config) -> Result<Vec<Stream>> {
        let schema = json!({ "type": "object", "required": ["id"], "additionalProperties": true });
        Ok(vec![Stream::new(STREAM, schema).with_primary_key(["id"]).with_incremental_cursor("updated_at")])
    }

    fn read(request: ReadRequest<Config>) -> Result<()> {
        if request.stream != STREAM {
            return Err(Error::unknown_stream(&request.stream));
        }
        let config = &request.config;
        let mut cursor = request.state_as::<State>()?.and_then(|s| s.cursor);
        loop {
            let mut page = Http::get(format!("{}/events", config.base_url.trim_end_matches('/')))
                .credential(&config.credential_handle, Placement::Bearer)
                .query("limit", config.page_size);
            if let Some(c) = &cursor {
                page = page.query("cursor", c);
            }
            let page: Page = page.send()?.json()?;
            let records: Vec<Value> = page
                .data
                .into_iter()
                .map(|mut r| {
                    r["plugin_version"] = json!(VERSION);
                    r
                })
                .collect();
            Sink::emit(STREAM, &records)?;
            match page.next_cursor {
                Some(next) => {
                    Sink::checkpoint(STREAM, &json!({ "cursor": next }))?;
                    cursor = Some(next);
                }
                None => {
                    Sink::checkpoint(STREAM, &json!({ "cursor": cursor }))?;
                    return Ok(());
                }
            }
        }
    }
}

export_connector!(Versioned);
