//! A plugin that misbehaves on request, so the host's tests can check that
//! the sandbox holds: CPU, memory and stack limits, traps, output and log
//! limits, the egress policy, and that nothing secret is visible inside.
//!
//! The config names the behaviour in `behave`; the other fields depend on
//! it. `preview` runs the behaviour and returns a JSON object saying what
//! happened. `read` runs `emit` (records and checkpoints through the sink)
//! and, for the benefit of read-side tests, every other behaviour as well
//! (its result is dropped).
//!
//! | `behave` | does | fields (default) |
//! |---|---|---|
//! | `noop` | returns `{}` at once | |
//! | `loop` | spins forever, no host calls | |
//! | `memory_bomb` | allocates and fills 1 MiB chunks forever | |
//! | `recursion` | recurses without bound | `frame`: `"small"` (engine stack) or `"large"` (4 KiB frames on the linear-memory stack) |
//! | `trap` | panics (a wasm `unreachable` trap) | |
//! | `oversized_output` | returns a JSON object of exactly `size` bytes | `size` (64 MiB) |
//! | `log_flood` | logs `count` ~200-byte info messages | `count` (100000) |
//! | `egress` | sends one request | `request` (see [`egress`]) |
//! | `egress_timed` | sends `request` `times` times, each timed inside the guest | `request`, `times` (1) |
//! | `report` | reports everything it can see | `request` (optional) |
//! | `emit` | emits records and checkpoints | `records` (10), `record_bytes` (16), `batch` (100), `stream` |
//!
//! An unknown or missing `behave` is `invalid-config`.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit/connector@1.3.0",
        world: "connector",
        generate_all,
    });
}

mod config;
mod egress;
mod emit;
mod hostile;
mod report;

use bindings::exports::service::connector1_0_0::plugin::Guest;
use bindings::service::connector1_0_0::types::{
    CheckResult, ConnectorError, ConnectorInfo, ConnectorKind, EntityOption, Operation, ReadRequest, Stream, SyncMode,
    WriteRequest, WriteResult,
};
use serde_json::{Value, json};

use config::{Config, invalid_config};

/// The stream `discover` lists and `emit` writes to by default.
const STREAM: &str = "items";

struct Misbehaving;

impl Guest for Misbehaving {
    fn describe() -> ConnectorInfo {
        let schema = json!({
            "type": "object",
            "required": ["behave"],
            "properties": {
                "behave": {
                    "type": "string",
                    "description": "noop, loop, memory_bomb, recursion, trap, oversized_output, \
                                    log_flood, egress, egress_timed, report or emit"
                },
                "frame": { "type": "string" },
                "size": { "type": "integer", "minimum": 0 },
                "count": { "type": "integer", "minimum": 0 },
                "times": { "type": "integer", "minimum": 0 },
                "request": { "type": "object" },
                "records": { "type": "integer", "minimum": 0 },
                "record_bytes": { "type": "integer", "minimum": 0 },
                "batch": { "type": "integer", "minimum": 1 },
                "stream": { "type": "string" }
            },
            "additionalProperties": true
        });
        ConnectorInfo {
            id: "test_misbehaving".to_owned(),
            name: "Misbehaving (test plugin)".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            kind: ConnectorKind::Source,
            legacy_aliases: Vec::new(),
            config_schema: schema.to_string(),
            hosts: ["api.provider.test", "echo.provider.test", "localhost", "redirect.provider.test"]
                .map(str::to_owned)
                .to_vec(),
            oauth: None,
            operations: vec![Operation::Check, Operation::Preview, Operation::Discover, Operation::Read],
        }
    }

    fn check(_config: String) -> Result<CheckResult, ConnectorError> {
        Ok(CheckResult { ok: true, message: "misbehaving test plugin".to_owned(), account: None })
    }

    fn discover(_config: String) -> Result<Vec<Stream>, ConnectorError> {
        let item = json!({
            "type": "object",
            "required": ["id", "payload"],
            "properties": {
                "id": { "type": "integer" },
                "payload": { "type": "string" }
            }
        });
        Ok(vec![Stream {
            name: STREAM.to_owned(),
            json_schema: item.to_string(),
            sync_modes: vec![SyncMode::FullRefresh, SyncMode::Incremental],
            cursor_fields: vec!["id".to_owned()],
            primary_key: vec!["id".to_owned()],
            default_cursor_field: Some("id".to_owned()),
        }])
    }

    fn read(req: ReadRequest) -> Result<(), ConnectorError> {
        let behave = config::behave(&req.config)?;
        if behave == "noop" {
            return Ok(());
        }
        let config = Config::parse(&req.config)?;
        if behave == "emit" {
            let start = emit::resume_offset(req.state.as_deref())?;
            let stream = config.string("stream")?.unwrap_or(&req.stream);
            emit::emit(&config, stream, start)?;
            return Ok(());
        }
        run(&behave, &req.config, &config).map(drop)
    }

    fn entity_options(_config: String, field: String) -> Result<Vec<EntityOption>, ConnectorError> {
        Err(ConnectorError::Unsupported(format!("no options for `{field}`")))
    }

    fn preview(config_text: String) -> Result<String, ConnectorError> {
        let behave = config::behave(&config_text)?;
        // The invocation-overhead benchmark: nothing but the answer.
        if behave == "noop" {
            return Ok("{}".to_owned());
        }
        let config = Config::parse(&config_text)?;
        if behave == "oversized_output" {
            // Built as text directly: a `Value` would only double the memory.
            let size = config.u64("size", 64 * 1024 * 1024)?;
            return Ok(hostile::oversized_output(to_usize(size, "size")?));
        }
        run(&behave, &config_text, &config).map(|outcome| outcome.to_string())
    }

    fn write(_req: WriteRequest) -> Result<WriteResult, ConnectorError> {
        Err(ConnectorError::Unsupported("the misbehaving test plugin is a source".to_owned()))
    }
}

/// Runs one behaviour and describes the outcome (for those that return).
fn run(behave: &str, config_text: &str, config: &Config) -> Result<Value, ConnectorError> {
    match behave {
        "noop" => Ok(json!({})),
        "loop" => hostile::spin(),
        "memory_bomb" => hostile::hoard_memory(),
        "recursion" => match config.string("frame")?.unwrap_or("small") {
            "small" => Ok(json!({ "depth": hostile::recurse_on_engine_stack(0) })),
            "large" => Ok(json!({ "depth": hostile::recurse_on_memory_stack(0) })),
            other => Err(invalid_config(format!("frame: expected \"small\" or \"large\", got {other:?}"))),
        },
        "trap" => hostile::trap(),
        "oversized_output" => {
            let size = to_usize(config.u64("size", 64 * 1024 * 1024)?, "size")?;
            Ok(json!({ "bytes": hostile::oversized_output(size).len() }))
        }
        "log_flood" => {
            let count = config.u64("count", 100_000)?;
            Ok(json!({ "logged": hostile::log_flood(count) }))
        }
        "egress" => {
            let request =
                config.get("request").ok_or_else(|| invalid_config("request: required for behave \"egress\""))?;
            Ok(egress::send(&egress::parse_request(request)?))
        }
        "egress_timed" => {
            let request =
                config.get("request").ok_or_else(|| invalid_config("request: required for behave \"egress_timed\""))?;
            let times = config.u64("times", 1)?;
            egress::send_timed(&egress::parse_request(request)?, times)
        }
        "report" => report::report(config_text, config),
        "emit" => {
            let stream = config.string("stream")?.unwrap_or(STREAM);
            Ok(json!({ "emitted": emit::emit(config, stream, 0)? }))
        }
        other => Err(invalid_config(format!("behave: unknown behaviour {other:?}"))),
    }
}

fn to_usize(value: u64, field: &str) -> Result<usize, ConnectorError> {
    usize::try_from(value).map_err(|_| invalid_config(format!("{field}: {value} does not fit in this plugin's memory")))
}

bindings::export!(Misbehaving with_types_in bindings);
