//! `report`: the canary probe. Gathers everything the plugin can observe
//! from inside the sandbox and returns it, so a test can search the output
//! for a secret it planted (in the host's environment, its files, a stored
//! credential) and prove it never got in.
//!
//! ```json
//! {
//!   "config": "<the config text, verbatim>",
//!   "env": [["NAME", "value"], ...],
//!   "args": ["..."],
//!   "current_dir": {"ok": "/..."} | {"error": "..."},
//!   "listings": {"/": {"ok": ["name", ...]} | {"error": "..."}, ".": ..., "/etc": ...},
//!   "files": {"/etc/passwd": {"ok": "<text>"} | {"error": "..."}, ...},
//!   "clock": {"unix_nanos": <the wall clock>},
//!   "random": {"hash_seeded": <a hash keyed by the randomness std seeds its maps with>},
//!   "egress": <as for behave "egress">            // only with config.request
//! }
//! ```

use std::fs;

use serde_json::{Map, Value, json};

use crate::bindings::service::connector1_0_0::types::ConnectorError;
use crate::config::Config;
use crate::egress;

/// Directories whose listing is attempted.
const LISTED: [&str; 3] = ["/", ".", "/etc"];

/// Files whose contents are attempted (a sandbox should show none of them).
const READ: [&str; 4] = ["/etc/passwd", "/etc/hostname", "/proc/self/environ", ".env"];

/// The most of one file the report includes.
const MAX_FILE_BYTES: usize = 64 * 1024;

pub fn report(config_text: &str, config: &Config) -> Result<Value, ConnectorError> {
    let env: Vec<(String, String)> = std::env::vars_os()
        .map(|(name, value)| (name.to_string_lossy().into_owned(), value.to_string_lossy().into_owned()))
        .collect();
    let args: Vec<String> = std::env::args_os().map(|arg| arg.to_string_lossy().into_owned()).collect();
    let current_dir = outcome(std::env::current_dir().map(|dir| dir.display().to_string()));

    let mut listings = Map::new();
    for dir in LISTED {
        listings.insert(dir.to_owned(), outcome(list(dir)));
    }
    let mut files = Map::new();
    for path in READ {
        files.insert(path.to_owned(), outcome(read_start(path)));
    }

    let unix_nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos().to_string())
        .unwrap_or_default();
    let hash_seeded = {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(0);
        hasher.finish().to_string()
    };
    let mut report = json!({
        "clock": { "unix_nanos": unix_nanos },
        "random": { "hash_seeded": hash_seeded },
        "config": config_text,
        "env": env,
        "args": args,
        "current_dir": current_dir,
        "listings": listings,
        "files": files,
    });
    if let Some(request) = config.get("request") {
        report["egress"] = egress::send(&egress::parse_request(request)?);
    }
    Ok(report)
}

fn list(dir: &str) -> std::io::Result<Vec<String>> {
    fs::read_dir(dir)?.map(|entry| entry.map(|entry| entry.file_name().to_string_lossy().into_owned())).collect()
}

fn read_start(path: &str) -> std::io::Result<String> {
    let bytes = fs::read(path)?;
    let end = bytes.len().min(MAX_FILE_BYTES);
    Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
}

/// `{"ok": value}` or `{"error": "<message>"}`.
fn outcome<T: Into<Value>>(result: std::io::Result<T>) -> Value {
    match result {
        Ok(value) => json!({ "ok": value.into() }),
        Err(error) => json!({ "error": error.to_string() }),
    }
}
