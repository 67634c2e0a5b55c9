//! One run of a plugin's calls, the same whether it is recorded or
//! replayed: `check`, `discover`, `entity-options` for every config field,
//! `preview`, and a `read` of each stream, each call only when the plugin
//! offers it. What the calls return becomes [`Observations`].

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::cassette::{Observations, StreamPlan};
use super::tape::CurrentCall;
use crate::egress::CredentialHandle;
use crate::plugin::InvocationError;
use crate::plugin::connector::Connector;
use crate::plugin::sandbox::RecordSink;
use crate::plugin::types::{CREDENTIAL_ACCOUNT, Operation, ReadRequest, SinkRefusal, Stream, SyncMode};

/// The workspace a plugin runs for while its author records or tests it.
pub(crate) const WORKSPACE: &str = "ws_author";

/// Which streams a run reads.
pub(crate) enum StreamChoice {
    /// As a cassette recorded them.
    Recorded(Vec<StreamPlan>),
    /// Chosen from what `discover` returns: these names (all when none),
    /// starting from these states.
    Discovered { names: Option<Vec<String>>, states: BTreeMap<String, Value> },
}

/// Why a run cannot start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    #[error("stream {0} is not among the streams discover returned ({1})")]
    UnknownStream(String, String),
}

/// What a run returned, the streams it read and the catalog's schemas.
pub(crate) struct RunOutcome {
    pub observed: Observations,
    pub streams: Vec<StreamPlan>,
    /// Each discovered stream's declared record schema.
    pub declared: BTreeMap<String, Value>,
    /// Each discovered stream's primary key (empty when it has none).
    pub primary_keys: BTreeMap<String, Vec<String>>,
}

/// The call that reads `stream`, as the tape names it.
pub(crate) fn read_call(stream: &str) -> String {
    format!("read {stream}")
}

/// The call that reads `stream` again from its `n`th checkpoint (from 1),
/// as a restarted job would: recorded after every other call, and
/// replayed by the conformance suite.
pub(crate) fn resume_call(stream: &str, n: usize) -> String {
    format!("resume {stream} from checkpoint {n}")
}

/// Whether `call` is a resumed read.
pub(crate) fn is_resume(call: &str) -> bool {
    call.starts_with("resume ")
}

fn outcome<T: serde::Serialize>(result: Result<T, InvocationError>) -> Value {
    match result {
        Ok(value) => json!({ "ok": value }),
        Err(e) => json!({ "error": e.to_string() }),
    }
}

/// A recording's config split as the server splits it: what every call
/// gets, and the credential's account (`credential_account`), which only
/// `entity-options` gets.
pub(crate) fn split_account(config: &Value) -> (Value, Option<Value>) {
    let mut config = config.clone();
    let account = config.as_object_mut().and_then(|c| c.remove(CREDENTIAL_ACCOUNT));
    (config, account)
}

/// Runs every call the plugin offers, announcing each in `call` (for the
/// tape) and to `progress` (for the author).
pub(crate) async fn run(
    connector: &Connector,
    call: &CurrentCall,
    config: &Value,
    record_limit: u64,
    choice: StreamChoice,
    progress: &mut dyn FnMut(&str),
) -> Result<RunOutcome, RunError> {
    let offers = |op: Operation| connector.plugin().info.operations.contains(&op);
    let (config, account) = split_account(config);
    let config_text = config.to_string();
    let mut observed = Observations::default();

    if offers(Operation::Check) {
        call.set("check");
        progress("check");
        observed.check = Some(outcome(connector.check(&config_text).await));
    }
    let mut catalog: Option<Vec<Stream>> = None;
    if offers(Operation::Discover) {
        call.set("discover");
        progress("discover");
        let found = connector.discover(&config_text).await;
        if let Ok(streams) = &found {
            catalog = Some(streams.clone());
        }
        observed.catalog = Some(outcome(found));
    }
    if offers(Operation::EntityOptions) {
        let mut with_account = config.clone();
        if let (Some(map), Some(account)) = (with_account.as_object_mut(), account) {
            map.insert(CREDENTIAL_ACCOUNT.to_owned(), account);
        }
        let options_config = with_account.to_string();
        let mut options = serde_json::Map::new();
        for field in option_fields(&connector.plugin().info.config_schema) {
            let label = format!("entity-options {field}");
            call.set(&label);
            progress(&label);
            options.insert(field.clone(), outcome(connector.entity_options(&options_config, &field).await));
        }
        observed.entity_options = Some(Value::Object(options));
    }
    if offers(Operation::Preview) {
        call.set("preview");
        progress("preview");
        observed.preview = Some(outcome(connector.preview(&config_text).await));
    }

    let declared: BTreeMap<String, Value> =
        catalog.iter().flatten().map(|s| (s.name.clone(), s.json_schema.clone())).collect();
    let primary_keys: BTreeMap<String, Vec<String>> =
        catalog.iter().flatten().map(|s| (s.name.clone(), s.primary_key.clone())).collect();
    let streams = match choice {
        StreamChoice::Recorded(plans) => plans,
        StreamChoice::Discovered { names, states } => {
            plan_streams(catalog.as_deref().unwrap_or_default(), names, &states)?
        }
    };
    if offers(Operation::Read) {
        for plan in &streams {
            let label = read_call(&plan.name);
            call.set(&label);
            progress(&label);
            let lines = read(connector, &config_text, plan, record_limit).await;
            observed.streams.insert(plan.name.clone(), lines);
        }
    }
    Ok(RunOutcome { observed, streams, declared, primary_keys })
}

/// The config fields a plugin may offer choices for: every property of
/// its config schema but the credential handles.
fn option_fields(schema: &Value) -> Vec<String> {
    let properties = schema.get("properties").and_then(Value::as_object).cloned().unwrap_or_default();
    let sample = Value::Object(properties.keys().map(|k| (k.clone(), json!(""))).collect());
    let handles: Vec<String> =
        CredentialHandle::in_configuration(&sample).into_iter().map(|(key, _)| key.to_owned()).collect();
    properties.keys().filter(|k| !handles.contains(k)).cloned().collect()
}

/// The streams to read, in the catalog's order, each incremental when it
/// can be.
fn plan_streams(
    catalog: &[Stream],
    names: Option<Vec<String>>,
    states: &BTreeMap<String, Value>,
) -> Result<Vec<StreamPlan>, RunError> {
    let known = || catalog.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ");
    let chosen: Vec<&Stream> = match names {
        None => catalog.iter().collect(),
        Some(names) => names
            .iter()
            .map(|n| catalog.iter().find(|s| s.name == *n).ok_or_else(|| RunError::UnknownStream(n.clone(), known())))
            .collect::<Result<_, _>>()?,
    };
    Ok(chosen
        .into_iter()
        .map(|s| {
            let incremental = s.sync_modes.contains(&SyncMode::Incremental);
            StreamPlan {
                name: s.name.clone(),
                sync_mode: if incremental { SyncMode::Incremental } else { SyncMode::FullRefresh },
                cursor_field: None,
                state: if incremental { states.get(&s.name).cloned() } else { None },
            }
        })
        .collect())
}

/// Reads one stream into lines: each record and checkpoint as emitted,
/// then how the read ended.
pub(super) async fn read(connector: &Connector, config: &str, plan: &StreamPlan, record_limit: u64) -> Vec<Value> {
    let collected = Arc::new(Mutex::new(Collected::default()));
    let sink = Collector { stream: plan.name.clone(), record_limit, collected: collected.clone() };
    let request = ReadRequest {
        config: config.to_owned(),
        stream: plan.name.clone(),
        sync_mode: plan.sync_mode,
        cursor_field: plan.cursor_field.clone(),
        state: plan.state.as_ref().map(Value::to_string),
    };
    let result = connector.read(&request, Box::new(sink)).await;
    let mut collected = std::mem::take(&mut *collected.lock().unwrap_or_else(|p| p.into_inner()));
    let end = if collected.limit_reached {
        json!({ "end": "record limit reached" })
    } else {
        match result {
            Ok(()) => json!({ "end": "complete" }),
            Err(e) => json!({ "end": { "error": e.to_string() } }),
        }
    };
    collected.lines.push(end);
    collected.lines
}

#[derive(Default)]
struct Collected {
    lines: Vec<Value>,
    records: u64,
    limit_reached: bool,
}

/// The sink of a run: checks what the plugin hands over as the server
/// does, and keeps it.
struct Collector {
    stream: String,
    record_limit: u64,
    collected: Arc<Mutex<Collected>>,
}

impl Collector {
    fn take(&self, stream: &str, item: Item) -> Result<(), SinkRefusal> {
        if stream != self.stream {
            return Err(SinkRefusal::Rejected(format!("this read is for stream {}", self.stream)));
        }
        let mut c = self.collected.lock().unwrap_or_else(|p| p.into_inner());
        match item {
            Item::Records(records) => {
                if c.records >= self.record_limit {
                    c.limit_reached = true;
                    return Err(SinkRefusal::Cancelled);
                }
                let mut parsed = Vec::with_capacity(records.len());
                for (i, text) in records.iter().enumerate() {
                    match serde_json::from_str::<Value>(text) {
                        Ok(v @ Value::Object(_)) => parsed.push(json!({ "record": v })),
                        _ => {
                            return Err(SinkRefusal::Rejected(format!("record {i} of the batch is not a JSON object")));
                        }
                    }
                }
                c.records += parsed.len() as u64;
                c.lines.extend(parsed);
            }
            Item::Checkpoint(state) => match serde_json::from_str::<Value>(&state) {
                Ok(v) => c.lines.push(json!({ "checkpoint": v })),
                Err(_) => return Err(SinkRefusal::Rejected("the state is not JSON".into())),
            },
        }
        Ok(())
    }
}

enum Item {
    Records(Vec<String>),
    Checkpoint(String),
}

impl RecordSink for Collector {
    fn emit<'a>(
        &'a mut self,
        stream: &'a str,
        records: Vec<String>,
    ) -> Pin<Box<dyn Future<Output = Result<(), SinkRefusal>> + Send + 'a>> {
        Box::pin(async move { self.take(stream, Item::Records(records)) })
    }

    fn checkpoint<'a>(
        &'a mut self,
        stream: &'a str,
        state: String,
    ) -> Pin<Box<dyn Future<Output = Result<(), SinkRefusal>> + Send + 'a>> {
        Box::pin(async move { self.take(stream, Item::Checkpoint(state)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_are_asked_for_every_field_but_the_credentials() {
        let schema = json!({ "type": "object", "properties": {
            "credential_handle": {}, "backup_credential_handle": {}, "portal_id": {}, "brand_ids": {} } });
        assert_eq!(option_fields(&schema), vec!["brand_ids".to_owned(), "portal_id".to_owned()]);
    }
}
