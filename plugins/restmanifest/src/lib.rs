//! REST API source with no code (`conn_rest_manifest`): a manifest
//! describes a paged JSON API, and this component reads it, inside the same
//! sandbox and under the same egress rules as every compiled connector.
//!
//! A source's configuration is the API's `base_url`, an optional
//! `credential_handle` with its `credential_placement`, and the
//! `manifest`: shared headers, limits and retries, and one entry per
//! stream (path, parameters, records selector, primary key, paging,
//! incremental cursor, parent). Its types, published schema and checks
//! are the shared `service-rest-manifest` crate's: the server validates a
//! source with the same schema and the same checks ([`manifest::checked`])
//! this component runs.
//!
//! What the host keeps for this connector as for any other: requests go to
//! hosts the operator allows, over HTTPS, never to private addresses; the
//! secret is attached by the host to the request it makes. What this
//! connector adds: every page stays on the base URL's origin (a next-page
//! link elsewhere is refused), a read stops with an error after
//! `page_limit` pages or when its paging loops, and an oversized page is
//! refused by the host's response limit.
//!
//! | operation | what it does |
//! |---|---|
//! | `check` | reads the first page of the first stream that has no parent |
//! | `discover` | the streams, with the manifest's schema or one inferred from the first page (`x-inferred`) |
//! | `read` | every page, records passed through as the provider wrote them; incremental with an exact boundary ([`cursor`]) |
//! | `preview` | up to five records of each stream without a parent |
//!
//! # Layout
//!
//! | module | holds |
//! |---|---|
//! | [`manifest`] | the shared configuration crate in the SDK's terms |
//! | [`pages`] | requests, paging, origin and loop checks |
//! | [`json`] | finding records and fields in a page without building it |
//! | [`cursor`] | incremental state and its boundary |
//! | [`infer`] | the schema of a stream the manifest declares none for |
//! | this file | the operations, and parents walked for child streams |

pub mod cursor;
pub mod infer;
pub mod json;
pub mod manifest;
pub mod pages;

use connector_sdk::{
    CheckResult, Connector, ConnectorInfo, Error, Operation, ReadRequest, Result, Sink, Stream, Value,
    export_connector, json,
};
use serde_json::value::RawValue;

use cursor::{Boundary, IncrementalRead};
use manifest::{Config, StreamSpec};
use pages::{Flow, Pager};

/// The connector's id.
pub const CONNECTOR_ID: &str = "conn_rest_manifest";

/// The published schema of the configuration.
pub use rest_manifest::SCHEMA;

/// Streams a preview shows at most.
const PREVIEW_STREAMS: usize = 10;
/// Records of each stream a preview shows.
const PREVIEW_RECORDS: usize = 5;

struct RestManifest;

impl Connector for RestManifest {
    type Config = Config;

    fn describe() -> ConnectorInfo {
        // The schema is part of the component: a broken one fails the
        // plugin's own tests, never a load.
        let schema: Value = serde_json::from_str(SCHEMA).unwrap_or_else(|_| json!({ "type": "object" }));
        ConnectorInfo::source(CONNECTOR_ID, "REST API (manifest)", env!("CARGO_PKG_VERSION"))
            .with_hosts(["*"])
            .with_operations([Operation::Check, Operation::Discover, Operation::Read, Operation::Preview])
            .with_config_schema(schema)
    }

    fn check(config: Config) -> Result<CheckResult> {
        manifest::checked(&config)?;
        let root = roots(&config)
            .next()
            .ok_or_else(|| Error::InvalidConfig("/manifest/streams: every stream has a parent".into()))?;
        let mut count = 0;
        Pager::new(&config, root).walk(None, &[], &mut |_, records| {
            count = records.len();
            Ok(Flow::Enough)
        })?;
        Ok(CheckResult::success(format!(
            "{} answers: stream {} has {count} record(s) on its first page",
            config.base_url, root.name
        )))
    }

    fn discover(config: Config) -> Result<Vec<Stream>> {
        manifest::checked(&config)?;
        let mut streams = Vec::new();
        for spec in &config.manifest.streams {
            let schema = match &spec.schema {
                Some(schema) => schema.clone(),
                None => {
                    let mut inferred = infer::schema(&[]);
                    pages_of(&config, spec, &[], &mut |_, records| {
                        inferred = infer::schema(records);
                        Ok(Flow::Enough)
                    })?;
                    inferred
                }
            };
            let mut stream = Stream::new(&spec.name, schema).with_primary_key(spec.primary_key.iter().cloned());
            if let Some(incremental) = &spec.incremental {
                stream = stream.with_incremental_cursor(&incremental.cursor_field);
            }
            streams.push(stream);
        }
        Ok(streams)
    }

    fn read(request: ReadRequest<Config>) -> Result<()> {
        let config = &request.config;
        manifest::checked(config)?;
        let spec = manifest::stream(config, &request.stream)?;
        let incremental = spec.incremental.as_ref().filter(|_| request.is_incremental());
        if let (Some(incremental), Some(asked)) = (incremental, &request.cursor_field)
            && *asked != incremental.cursor_field
        {
            return Err(Error::Unsupported(format!(
                "stream {} reads incrementally on {} only, not {asked}",
                spec.name, incremental.cursor_field
            )));
        }
        let mut tracker = match incremental {
            Some(incremental) => Some(IncrementalRead::new(
                request.state_as::<Boundary>()?,
                incremental.start.clone(),
                incremental.param.as_ref().map(|_| incremental.format),
            )),
            None => None,
        };
        let mut extra = Vec::new();
        if let (Some(incremental), Some(tracker)) = (incremental, &tracker)
            && let (Some(param), Some(from)) = (&incremental.param, tracker.from())
        {
            let value = cursor::format(from, incremental.format).ok_or_else(|| {
                Error::InvalidConfig(format!(
                    "stream {}: the cursor value {from} cannot be written as the incremental format asks",
                    spec.name
                ))
            })?;
            extra.push((param.clone(), value));
        }
        let wanted: Vec<&str> = incremental
            .map(|i| {
                std::iter::once(i.cursor_field.as_str()).chain(spec.primary_key.iter().map(String::as_str)).collect()
            })
            .unwrap_or_default();
        pages_of(config, spec, &extra, &mut |number, records| {
            let mut texts: Vec<&str> = Vec::with_capacity(records.len());
            for record in records {
                let admitted = match tracker.as_mut() {
                    None => true,
                    Some(tracker) => {
                        let found = json::fields(record, &wanted)
                            .map_err(|e| Error::ProviderError(format!("stream {}, page {number}: {e}", spec.name)))?;
                        let value =
                            |raw: Option<&RawValue>| raw.and_then(|r| serde_json::from_str::<Value>(r.get()).ok());
                        let cursor = value(found[0]);
                        if let (true, Some(at)) = (incremental.is_some_and(|i| i.sorted), cursor.as_ref())
                            && let Some(newer) = tracker.behind(at)
                        {
                            return Err(Error::ProviderError(format!(
                                "stream {}, page {number}: the manifest says its pages are sorted by {}, but {at} comes after {newer}; remove \"sorted\" if the API does not sort",
                                spec.name,
                                incremental.map(|i| i.cursor_field.as_str()).unwrap_or_default()
                            )));
                        }
                        let key = (!spec.primary_key.is_empty())
                            .then(|| found[1..].iter().map(|f| value(*f).unwrap_or(Value::Null)).collect());
                        tracker.admits(cursor, key)
                    }
                };
                if admitted {
                    texts.push(record.get());
                }
            }
            Sink::emit_json(&spec.name, &texts)?;
            // Sorted pages are covered as they come; others only by where
            // the read started, until the last page is read.
            let sorted = incremental.is_some_and(|i| i.sorted);
            let state = tracker.as_ref().and_then(|t| if sorted { t.final_state() } else { t.resume_state() });
            if let Some(state) = state {
                Sink::checkpoint(&spec.name, &state)?;
            }
            Ok(Flow::More)
        })?;
        if let Some(state) = tracker.as_ref().and_then(IncrementalRead::final_state) {
            Sink::checkpoint(&spec.name, &state)?;
        }
        Ok(())
    }

    fn preview(config: Config) -> Result<Value> {
        manifest::checked(&config)?;
        let mut streams = serde_json::Map::new();
        for spec in roots(&config).take(PREVIEW_STREAMS) {
            let mut sample = Vec::new();
            Pager::new(&config, spec).walk(None, &[], &mut |_, records| {
                sample = records
                    .iter()
                    .take(PREVIEW_RECORDS)
                    .filter_map(|r| serde_json::from_str::<Value>(r.get()).ok())
                    .collect();
                Ok(Flow::Enough)
            })?;
            streams.insert(spec.name.clone(), Value::Array(sample));
        }
        Ok(json!({ "streams": streams }))
    }
}

/// The streams without a parent, in the manifest's order.
fn roots(config: &Config) -> impl Iterator<Item = &StreamSpec> {
    config.manifest.streams.iter().filter(|s| s.parent.is_none())
}

/// Walks the pages of `spec`: directly for a stream without a parent, and
/// once per record of its parent (walked the same way) for a child, with
/// the parent's value in the path. A parent record without the value is
/// skipped.
fn pages_of(
    config: &Config,
    spec: &StreamSpec,
    extra: &[(String, String)],
    on_page: &mut dyn FnMut(u32, &[&RawValue]) -> Result<Flow>,
) -> Result<()> {
    let Some(parent) = &spec.parent else {
        return Pager::new(config, spec).walk(None, extra, on_page);
    };
    let parent_spec = manifest::stream(config, &parent.stream)?;
    let mut pager = Pager::new(config, spec);
    pages_of(config, parent_spec, &[], &mut |_, parents| {
        for record in parents {
            let found = json::fields(record, &[parent.field.as_str()])
                .map_err(|e| Error::ProviderError(format!("stream {}: {e}", parent_spec.name)))?;
            let value = match found[0].map(|r| serde_json::from_str::<Value>(r.get())) {
                // `.` and `..` (however encoded) would walk up the path to
                // another endpoint: never a value to request.
                Some(Ok(Value::String(s))) if !s.is_empty() && !pages::dot_segment(&s) => s,
                Some(Ok(Value::Number(n))) => n.to_string(),
                _ => {
                    connector_sdk::log::warn(format_args!(
                        "stream {}: a {} record has no usable {}; skipped",
                        spec.name, parent_spec.name, parent.field
                    ));
                    continue;
                }
            };
            let mut enough = false;
            pager.walk(Some(&value), extra, &mut |number, records| {
                let flow = on_page(number, records)?;
                enough = matches!(flow, Flow::Enough);
                Ok(flow)
            })?;
            if enough {
                return Ok(Flow::Enough);
            }
        }
        Ok(Flow::More)
    })
}

export_connector!(RestManifest);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_published_schema_is_the_one_described() {
        let info = RestManifest::describe();
        assert_eq!(info.id, CONNECTOR_ID);
        assert_eq!(info.hosts, ["*"]);
        assert_eq!(info.config_schema["$defs"]["paging"]["oneOf"].as_array().unwrap().len(), 6);
        assert_eq!(info.config_schema["required"], json!(["base_url", "manifest"]));
    }
}
