//! Airbyte's declarative manifests as a source (`conn_airbyte_manifest`):
//! a manifest exactly as Airbyte publishes it (its `DeclarativeStream`s,
//! requesters, paginators, partition routers, transformations) runs
//! inside the sandbox, interpreted by the shared `service-declarative`
//! crate, and gives the records Airbyte's own CDK gives.
//!
//! A source's configuration is the `manifest`, its non-secret `config`,
//! `credentials`: for each secret field (a JSON pointer into the
//! manifest's configuration), the credential holding it (`[{"field":
//! "/api_key", "credential_handle": "<handle>"}]`), and optionally
//! `schemas`: the schema files the manifest reads from its package, by
//! their path there (`{"schemas/users.json": {…}}`).
//!
//! The guest never holds a secret: where the manifest puts one into a
//! request (an authenticator, a parameter, a header, a body field), the
//! request names the handle and its place, and the host puts the secret
//! there, only for hosts the credential is bound to. A manifest that
//! would make the guest write a secret itself (with other text, encoded,
//! into a record) is refused.
//!
//! | operation | what it does |
//! |---|---|
//! | `check` | reads the first page of each stream the manifest's `check` names |
//! | `discover` | the streams, with the manifest's schemas and primary keys |
//! | `read` | every slice and page of a stream, records as the CDK selects and transforms them; incremental from the saved state, checkpointed after each window of its cursor |
//! | `preview` | up to five records of each stream |
//!
//! # Layout
//!
//! | module | holds |
//! |---|---|
//! | [`source`] | the configuration, the manifest read into the runtime's model, refusals as the SDK's errors |
//! | [`transport`] | requests sent through the host, secrets placed by handle |
//! | this file | the operations |

pub mod source;
pub mod transport;

use connector_sdk::{
    CheckResult, Connector, ConnectorInfo, Error, Operation, ReadRequest, Result, Sink, Stream, Value, json,
};
use declarative::retrieve::{self, Flow};
use serde_json::value::RawValue;

use source::{Config, Prepared};
use transport::HostTransport;

/// The connector's id.
pub const CONNECTOR_ID: &str = "conn_airbyte_manifest";

/// Streams a preview shows at most.
const PREVIEW_STREAMS: usize = 10;
/// Records of each stream a preview shows.
const PREVIEW_RECORDS: usize = 5;

struct AirbyteManifest;

impl Connector for AirbyteManifest {
    type Config = Config;

    fn describe() -> ConnectorInfo {
        ConnectorInfo::source(CONNECTOR_ID, "Airbyte declarative manifest", env!("CARGO_PKG_VERSION"))
            .with_hosts(["*"])
            .with_operations([Operation::Check, Operation::Discover, Operation::Read, Operation::Preview])
            .with_config_schema(source::schema())
    }

    fn check(config: Config) -> Result<CheckResult> {
        let prepared = Prepared::new(&config)?;
        let names: Vec<String> = if prepared.source.check_streams.is_empty() {
            prepared.source.streams.iter().take(1).map(|s| s.name.clone()).collect()
        } else {
            prepared.source.check_streams.clone()
        };
        let mut transport = HostTransport::new(&config);
        for name in &names {
            let stream = prepared.stream(name)?;
            let mut seen = 0usize;
            let outcome = from_start(&prepared, stream, &mut transport, &mut |records| {
                seen += records.len();
                Ok(Flow::Enough)
            });
            if let Err(e) = outcome {
                return Ok(CheckResult::failure(format!("stream {name}: {}", transport.explain(e))));
            }
        }
        Ok(CheckResult::success(format!("{} answers: checked stream(s) {}", prepared.hosts(), names.join(", "))))
    }

    fn discover(config: Config) -> Result<Vec<Stream>> {
        let prepared = Prepared::new(&config)?;
        let schema = |s: &declarative::model::Stream| {
            s.schema_file
                .as_ref()
                .and_then(|file| config.schemas.get(file))
                .cloned()
                .unwrap_or_else(|| s.schema.clone())
        };
        Ok(prepared
            .source
            .streams
            .iter()
            .map(|s| {
                let stream = Stream::new(&s.name, schema(s))
                    .with_primary_key(s.primary_key.iter().filter_map(|path| path.first().cloned()));
                match &s.cursor {
                    Some(cursor) => stream.with_incremental_cursor(&cursor.field),
                    None => stream,
                }
            })
            .collect())
    }

    fn read(request: ReadRequest<Config>) -> Result<()> {
        let prepared = Prepared::new(&request.config)?;
        let stream = prepared.stream(&request.stream)?;
        let incremental = request.is_incremental();
        if incremental && stream.cursor.is_none() {
            return Err(Error::Unsupported(format!("stream {} is read in full only", stream.name)));
        }
        // A full read starts from the cursor's start, as the CDK's does.
        let state = if incremental { request.state.clone() } else { None };
        let mut transport = HostTransport::new(&request.config);
        let name = stream.name.clone();
        retrieve::read(
            &prepared.source,
            stream,
            &prepared.env,
            state.as_ref(),
            &mut transport,
            &mut |records| {
                let texts: Vec<&str> = records.iter().map(|r| r.get()).collect();
                Sink::emit_json(&name, &texts).map_err(|e| retrieve::ReadError::Stopped(e.to_string()))?;
                Ok(Flow::More)
            },
            &mut |state| {
                if incremental {
                    Sink::checkpoint(&name, &state).map_err(|e| retrieve::ReadError::Stopped(e.to_string()))?;
                }
                Ok(())
            },
        )
        .map_err(|e| transport.explain(e))?;
        Ok(())
    }

    fn preview(config: Config) -> Result<Value> {
        let prepared = Prepared::new(&config)?;
        let mut transport = HostTransport::new(&config);
        let mut streams = serde_json::Map::new();
        for stream in prepared.source.streams.iter().take(PREVIEW_STREAMS) {
            let mut sample: Vec<Value> = Vec::new();
            from_start(&prepared, stream, &mut transport, &mut |records| {
                for record in records.iter().take(PREVIEW_RECORDS - sample.len()) {
                    sample.push(
                        serde_json::from_str(record.get())
                            .map_err(|e| retrieve::ReadError::Invalid(format!("a record: {e}")))?,
                    );
                }
                Ok(if sample.len() >= PREVIEW_RECORDS { Flow::Enough } else { Flow::More })
            })
            .map_err(|e| transport.explain(e))?;
            streams.insert(stream.name.clone(), Value::Array(sample));
        }
        Ok(json!({ "streams": streams }))
    }
}

/// Reads a stream from its start (a cursor's too) for a look at it, keeping
/// no state.
fn from_start(
    prepared: &Prepared,
    stream: &declarative::model::Stream,
    transport: &mut HostTransport,
    on_records: &mut dyn FnMut(Vec<Box<RawValue>>) -> std::result::Result<Flow, retrieve::ReadError>,
) -> std::result::Result<Flow, retrieve::ReadError> {
    retrieve::read(&prepared.source, stream, &prepared.env, None, transport, on_records, &mut |_| Ok(()))
}

connector_sdk::export_connector!(AirbyteManifest);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connector_describes_itself() {
        let info = AirbyteManifest::describe();
        assert_eq!(info.id, CONNECTOR_ID);
        assert_eq!(info.config_schema["required"], json!(["manifest"]));
    }
}
