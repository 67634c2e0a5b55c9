//! Example source: the posts of a JSONPlaceholder-style REST API.
//!
//! The whole shape of a source in a few lines: a typed config holding a
//! credential handle (never a secret), a check, one stream, and an
//! incremental read that walks numbered pages and checkpoints after each.

use connector_sdk::{
    CheckResult, Connector, ConnectorInfo, Error, Http, Operation, Pagination, Placement, ReadRequest, RequestBuilder,
    Result, Sink, Stream, Value, export_connector, json,
};
use serde::Deserialize;

const STREAM: &str = "posts";
/// The list endpoint, oldest post first, 50 per page.
const POSTS: &str = "/posts?_sort=id&_order=asc&_limit=50";

#[derive(Deserialize)]
struct Config {
    /// For example `https://jsonplaceholder.typicode.com`.
    base_url: String,
    /// Optional: the public demo API needs no token, a private copy may.
    credential_handle: Option<String>,
}

impl Config {
    fn get(&self, path: &str) -> RequestBuilder {
        let request = Http::get(format!("{}{path}", self.base_url.trim_end_matches('/')));
        match &self.credential_handle {
            Some(handle) => request.credential(handle, Placement::Bearer),
            None => request,
        }
    }
}

/// What a read remembers for the next incremental one.
#[derive(Deserialize)]
struct State {
    last_id: u64,
}

struct JsonPlaceholder;

impl Connector for JsonPlaceholder {
    type Config = Config;

    fn describe() -> ConnectorInfo {
        let id = "conn_example_jsonplaceholder";
        ConnectorInfo::source(id, "JSONPlaceholder (example)", env!("CARGO_PKG_VERSION"))
            .with_hosts(["jsonplaceholder.typicode.com"])
            .with_operations([Operation::Check, Operation::Discover, Operation::Read])
            .with_config_schema(json!({ "type": "object", "required": ["base_url"], "properties": {
                "base_url": { "type": "string", "format": "uri" },
                "credential_handle": { "type": "string", "description": "API token (Bearer)" } } }))
    }

    fn check(config: Config) -> Result<CheckResult> {
        config.get("/posts?_limit=1").send()?.json::<Vec<Value>>()?;
        Ok(CheckResult::success(format!("{} answers", config.base_url)))
    }

    fn discover(_config: Config) -> Result<Vec<Stream>> {
        let post = json!({ "type": "object", "required": ["id"], "properties": {
            "id": { "type": "integer" }, "userId": { "type": "integer" },
            "title": { "type": "string" }, "body": { "type": "string" } } });
        let posts = Stream::new(STREAM, post).with_primary_key(["id"]);
        Ok(vec![posts.with_incremental_cursor("id")])
    }

    fn read(request: ReadRequest<Config>) -> Result<()> {
        if request.stream != STREAM {
            return Err(Error::unknown_stream(&request.stream));
        }
        // No state (first read, full refresh, reset) means: from the start.
        let state: Option<State> = request.state_as()?;
        let mut last_id = state.map_or(0, |state| state.last_id);
        let first = request.config.get(POSTS).query("id_gte", last_id + 1);
        let numbered = Pagination::page_number("_page");
        for page in first.paginate(numbered).records_at("") {
            let records = page?.records;
            Sink::emit(STREAM, &records)?;
            let newest = records.last().and_then(|post| post["id"].as_u64());
            last_id = newest.unwrap_or(last_id);
            // Covers everything emitted so far, so a failed read resumes here.
            Sink::checkpoint(STREAM, &json!({ "last_id": last_id }))?;
        }
        Ok(())
    }
}

export_connector!(JsonPlaceholder);
