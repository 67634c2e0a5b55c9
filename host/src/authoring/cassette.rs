//! A cassette on disk: one folder, human-readable, diff-friendly, holding
//! no secret.
//!
//! | file | holds |
//! |---|---|
//! | `cassette.json` | what was recorded: the connector (id, version, interface), the component, the config, the streams read with their starting state, the record limit, the schema disagreements accepted, the instant the plugin's clock stood at |
//! | `exchanges.jsonl` | every request in the order the plugin made it (credential handle, never secret) with the answer it got, one per line; those of the reads resumed from each checkpoint (`resume STREAM from checkpoint N`) last |
//! | `responses/NNNN.json` (`.txt`, `.bin`) | the body of answer NNNN, byte for byte as the plugin got it |
//! | `check.json`, `catalog.json`, `entity-options.json`, `preview.json` | what those calls returned (`{"ok": ...}` or `{"error": ...}`) |
//! | `streams/NAME.jsonl` | the records and checkpoints stream NAME emitted, in order, and how its read ended |
//! | `schemas.json` | the JSON Schema inferred from each stream's records |
//!
//! Keys are sorted, lines end in `\n`, and a file is written only when it
//! changed, so a re-recording shows in a diff as what really changed.
//! Reading checks everything and names the file, line and column of the
//! first problem.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::egress::{
    CredentialHandle, CredentialUse, EgressError, InboundResponse, Method, OutboundRequest, Placement,
};
use crate::plugin::sandbox::GuestTime;
use crate::plugin::types::SyncMode;

/// The format of a cassette this host reads and writes.
pub(crate) const FORMAT: &str = "service-cassette/1";

/// The manifest, `cassette.json`.
pub(crate) const MANIFEST: &str = "cassette.json";
const EXCHANGES: &str = "exchanges.jsonl";
pub(crate) const RESPONSES: &str = "responses";
const STREAMS: &str = "streams";
const SCHEMAS: &str = "schemas.json";

/// What was recorded, and how to run it again.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Manifest {
    pub format: String,
    pub connector: ConnectorRef,
    /// The component, relative to the cassette's folder, when it was
    /// recorded from a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<String>,
    /// The config every call got (handles, never secrets).
    pub config: Value,
    pub streams: Vec<StreamPlan>,
    /// Records a read may emit before the host stops it, per stream.
    pub record_limit: u64,
    /// Schema disagreements the author accepts, so they do not fail the
    /// test.
    #[serde(default)]
    pub accepted: Vec<Acceptance>,
    /// The instant (RFC 3339) the plugin's wall clock stood at while it
    /// was recorded; its replays see the same instant, and the same
    /// randomness. A cassette recorded before clocks were frozen replays
    /// at [`UNRECORDED_CLOCK`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_at: Option<String>,
    /// Where the host put the secret, when the plugin left that to the
    /// credential (`as-stored`): a placement's text, or `{"signing":
    /// recipe}`; a token traded for the secret went where this says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_placement: Option<Value>,
}

/// The instant a cassette that names none replays at.
pub(crate) const UNRECORDED_CLOCK: &str = "2026-01-01T00:00:00Z";

impl Manifest {
    /// The clock and randomness its replays give the plugin.
    pub(crate) fn guest_time(&self) -> Result<GuestTime, CassetteError> {
        let text = self.recorded_at.as_deref().unwrap_or(UNRECORDED_CLOCK);
        frozen_at(text).ok_or_else(|| CassetteError::Invalid {
            path: format!("{MANIFEST}: at /recorded_at"),
            message: format!("{text:?} is not an RFC 3339 instant after 1970"),
        })
    }
}

/// A wall clock standing at `text` (RFC 3339), if it is an instant after
/// the Unix epoch.
pub(crate) fn frozen_at(text: &str) -> Option<GuestTime> {
    let at = chrono::DateTime::parse_from_rfc3339(text).ok()?;
    let nanos = at.timestamp_nanos_opt().filter(|n| *n >= 0)?;
    Some(GuestTime::Frozen(std::time::Duration::from_nanos(nanos as u64)))
}

/// The plugin a cassette was recorded with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConnectorRef {
    pub id: String,
    pub version: String,
    /// The WIT package it implements, e.g. `service:connector@1.1.0`.
    pub interface: String,
}

/// One stream read, as it was read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamPlan {
    pub name: String,
    pub sync_mode: SyncMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor_field: Option<String>,
    /// The state the read started from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<Value>,
}

/// A schema disagreement the author accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Acceptance {
    pub stream: String,
    /// The field, as a path: `author.name`, `tags[]`.
    pub field: String,
    pub disagreement: super::schema::DisagreementKind,
}

/// One request and its answer, as recorded.
#[derive(Debug, Clone)]
pub(crate) struct Exchange {
    /// The call it belongs to: `check`, `read posts`, ...
    pub call: String,
    pub request: OutboundRequest,
    pub answer: Answer,
}

/// What the plugin got for a request.
#[derive(Debug, Clone)]
pub(crate) enum Answer {
    Response(InboundResponse),
    Error(EgressError),
    /// The plugin gave up on the request before its answer came.
    Abandoned,
}

/// Everything the calls of a run returned: what a cassette expects.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Observations {
    pub check: Option<Value>,
    pub catalog: Option<Value>,
    /// Field → outcome.
    pub entity_options: Option<Value>,
    pub preview: Option<Value>,
    /// Stream → its lines (`{"record": ...}`, `{"checkpoint": ...}`,
    /// `{"end": ...}`).
    pub streams: BTreeMap<String, Vec<Value>>,
}

impl Observations {
    /// The single-value files and their contents.
    pub(crate) fn files(&self) -> [(&'static str, Option<&Value>); 4] {
        [
            ("check.json", self.check.as_ref()),
            ("catalog.json", self.catalog.as_ref()),
            ("entity-options.json", self.entity_options.as_ref()),
            ("preview.json", self.preview.as_ref()),
        ]
    }
}

/// A whole cassette.
#[derive(Debug, Clone)]
pub(crate) struct Cassette {
    pub manifest: Manifest,
    pub exchanges: Vec<Exchange>,
    pub expected: Observations,
    /// Inferred schemas, by stream.
    pub schemas: Value,
}

/// Why a cassette cannot be read or written. Each names the file and,
/// where there is one, the position.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CassetteError {
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error("{path}:{line}:{column}: {message}")]
    Malformed { path: String, line: usize, column: usize, message: String },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

impl CassetteError {
    fn io(path: &Path, e: &std::io::Error) -> Self {
        CassetteError::Io { path: path.display().to_string(), message: e.to_string() }
    }

    fn invalid(path: &Path, message: impl Into<String>) -> Self {
        CassetteError::Invalid { path: path.display().to_string(), message: message.into() }
    }

    /// A JSON error at `line_offset` lines into the file.
    fn json(path: &Path, line_offset: usize, e: &serde_json::Error) -> Self {
        let message = e.to_string();
        // serde_json appends " at line L column C"; the position is ours.
        let message = match message.rfind(" at line ") {
            Some(at) => message[..at].to_owned(),
            None => message,
        };
        let message = if e.is_eof() { format!("the file ends early: {message}") } else { message };
        CassetteError::Malformed {
            path: path.display().to_string(),
            line: line_offset + e.line().max(1),
            column: e.column(),
            message,
        }
    }
}

// ---- the lines of exchanges.jsonl -------------------------------------------

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExchangeLine {
    seq: usize,
    call: String,
    method: String,
    url: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    headers: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<BodyLine>,
    /// The request's credential, when it names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    credential: Option<CredentialLine>,
    /// Its credentials, when it names several (then `credential` is not
    /// given).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    credentials: Vec<CredentialLine>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    response: Option<ResponseLine>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<ErrorLine>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    abandoned: bool,
}

/// A request body: text when it is UTF-8, Base64 otherwise.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum BodyLine {
    Text(String),
    Base64(String),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CredentialLine {
    handle: String,
    /// `bearer`, `header:NAME` or `basic:USER`.
    placement: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResponseLine {
    status: u16,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    headers: Vec<(String, String)>,
    /// The body's file, relative to the cassette; none for an empty body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ErrorLine {
    kind: ErrorKind,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    message: String,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ErrorKind {
    Denied,
    InvalidRequest,
    Timeout,
    ConnectionFailed,
    ResponseTooLarge,
    CredentialUnavailable,
}

/// A credential use as a cassette writes it: the handle, never a secret.
fn credential_line(c: &CredentialUse) -> CredentialLine {
    CredentialLine { handle: c.handle.as_str().to_owned(), placement: placement_text(&c.placement) }
}

/// A placement as a cassette writes it.
pub(crate) fn placement_text(p: &Placement) -> String {
    match p {
        Placement::Bearer => "bearer".into(),
        Placement::Header(name) => format!("header:{name}"),
        Placement::BasicPassword(user) => format!("basic:{user}"),
        Placement::BasicUsername(password) => format!("basic-username:{password}"),
        Placement::BasicBoth => "basic-both".into(),
        Placement::BasicPair => "basic-pair".into(),
        Placement::HeaderAround { header, prefix, suffix } => {
            format!("header-around:{}", serde_json::json!({ "header": header, "prefix": prefix, "suffix": suffix }))
        }
        Placement::Query(name) => format!("query:{name}"),
        Placement::BodyField(field) => format!("body:{field}"),
        Placement::Path => "path".into(),
        Placement::Signed(_) => "signed".into(),
        Placement::AsStored => "as-stored".into(),
    }
}

/// Where the host put a recording's secret, as a cassette keeps it.
pub(crate) fn sent_value(p: &Placement) -> Value {
    match p {
        Placement::Signed(recipe) => serde_json::json!({ "signing": recipe }),
        other => Value::String(placement_text(other)),
    }
}

/// A placement a cassette kept with [`sent_value`].
pub(crate) fn sent_placement(v: &Value) -> Option<Placement> {
    match v {
        Value::String(text) => parse_placement(text).filter(|p| *p != Placement::AsStored),
        Value::Object(map) => serde_json::from_value::<crate::egress::signing::Signing>(map.get("signing")?.clone())
            .ok()
            .map(Placement::Signed),
        _ => None,
    }
}

/// A placement from its cassette (and command-line) form.
pub(crate) fn parse_placement(text: &str) -> Option<Placement> {
    match text.split_once(':') {
        None if text == "bearer" => Some(Placement::Bearer),
        None if text == "as-stored" => Some(Placement::AsStored),
        None if text == "basic-both" => Some(Placement::BasicBoth),
        None if text == "basic-pair" => Some(Placement::BasicPair),
        None if text == "path" => Some(Placement::Path),
        Some(("header", name)) if !name.is_empty() => Some(Placement::Header(name.to_owned())),
        Some(("basic", user)) => Some(Placement::BasicPassword(user.to_owned())),
        Some(("basic-username", password)) => Some(Placement::BasicUsername(password.to_owned())),
        Some(("header-around", framed)) => {
            let v: Value = serde_json::from_str(framed).ok()?;
            let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
            Some(Placement::HeaderAround { header: text("header")?, prefix: text("prefix")?, suffix: text("suffix")? })
                .filter(|p| !matches!(p, Placement::HeaderAround { header, .. } if header.is_empty()))
        }
        Some(("query", name)) if !name.is_empty() => Some(Placement::Query(name.to_owned())),
        Some(("body", field)) if !field.is_empty() => Some(Placement::BodyField(field.to_owned())),
        _ => None,
    }
}

fn error_line(e: &EgressError) -> ErrorLine {
    let (kind, message) = match e {
        EgressError::Denied(m) => (ErrorKind::Denied, m.clone()),
        EgressError::InvalidRequest(m) => (ErrorKind::InvalidRequest, m.clone()),
        EgressError::Timeout => (ErrorKind::Timeout, String::new()),
        EgressError::ConnectionFailed(m) => (ErrorKind::ConnectionFailed, m.clone()),
        EgressError::ResponseTooLarge => (ErrorKind::ResponseTooLarge, String::new()),
        EgressError::CredentialUnavailable(m) => (ErrorKind::CredentialUnavailable, m.clone()),
    };
    ErrorLine { kind, message }
}

fn error_from(line: ErrorLine) -> EgressError {
    match line.kind {
        ErrorKind::Denied => EgressError::Denied(line.message),
        ErrorKind::InvalidRequest => EgressError::InvalidRequest(line.message),
        ErrorKind::Timeout => EgressError::Timeout,
        ErrorKind::ConnectionFailed => EgressError::ConnectionFailed(line.message),
        ErrorKind::ResponseTooLarge => EgressError::ResponseTooLarge,
        ErrorKind::CredentialUnavailable => EgressError::CredentialUnavailable(line.message),
    }
}

/// The extension a body's file gets: `json` when it parses as JSON,
/// `txt` when it is text, `bin` otherwise.
fn body_extension(body: &[u8]) -> &'static str {
    if serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok() {
        "json"
    } else if std::str::from_utf8(body).is_ok() {
        "txt"
    } else {
        "bin"
    }
}

// ---- writing -----------------------------------------------------------------

/// The files of `cassette`: relative path → content.
pub(crate) fn render(cassette: &Cassette) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files: BTreeMap<PathBuf, Vec<u8>> = BTreeMap::new();
    files.insert(PathBuf::from(MANIFEST), pretty(&serde_json::to_value(&cassette.manifest).unwrap_or(Value::Null)));
    let mut lines = String::new();
    for (i, exchange) in cassette.exchanges.iter().enumerate() {
        let seq = i + 1;
        let req = &exchange.request;
        let body = req.body.as_ref().map(|b| match std::str::from_utf8(b) {
            Ok(text) => BodyLine::Text(text.to_owned()),
            Err(_) => BodyLine::Base64(base64_encode(b)),
        });
        let mut line = ExchangeLine {
            seq,
            call: exchange.call.clone(),
            method: req.method.as_str().to_owned(),
            url: req.url.clone(),
            headers: req.headers.clone(),
            body,
            credential: match req.credentials.as_slice() {
                [one] => Some(credential_line(one)),
                _ => None,
            },
            credentials: match req.credentials.as_slice() {
                [_, _, ..] => req.credentials.iter().map(credential_line).collect(),
                _ => Vec::new(),
            },
            response: None,
            error: None,
            abandoned: false,
        };
        match &exchange.answer {
            Answer::Response(r) => {
                let body = (!r.body.is_empty()).then(|| {
                    let name = format!("{RESPONSES}/{seq:04}.{}", body_extension(&r.body));
                    files.insert(PathBuf::from(&name), r.body.clone());
                    name
                });
                line.response = Some(ResponseLine { status: r.status, headers: r.headers.clone(), body });
            }
            Answer::Error(e) => line.error = Some(error_line(e)),
            Answer::Abandoned => line.abandoned = true,
        }
        lines.push_str(&serde_json::to_string(&line).unwrap_or_default());
        lines.push('\n');
    }
    files.insert(PathBuf::from(EXCHANGES), lines.into_bytes());
    write_observations(&mut files, &cassette.expected);
    files.insert(PathBuf::from(SCHEMAS), pretty(&cassette.schemas));
    files
}

/// Writes rendered files into `dir`: creates it, replaces what an earlier
/// recording left there, and leaves files whose content is unchanged
/// untouched.
pub(crate) fn write_files(dir: &Path, files: &BTreeMap<PathBuf, Vec<u8>>) -> Result<(), CassetteError> {
    for (name, _) in Observations::default().files() {
        if !files.contains_key(Path::new(name)) {
            remove_file(&dir.join(name))?;
        }
    }
    replace_files(dir, files, &[RESPONSES, STREAMS])
}

/// Rewrites `cassette.json` alone.
pub(crate) fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<(), CassetteError> {
    let mut files = BTreeMap::new();
    files.insert(PathBuf::from(MANIFEST), pretty(&serde_json::to_value(manifest).unwrap_or(Value::Null)));
    replace_files(dir, &files, &[])
}

/// Rewrites only the expectations of a cassette (`plugins test --update`).
pub(crate) fn write_expectations(dir: &Path, expected: &Observations, schemas: &Value) -> Result<(), CassetteError> {
    let mut files = BTreeMap::new();
    write_observations(&mut files, expected);
    files.insert(PathBuf::from(SCHEMAS), pretty(schemas));
    // The single-value files a run no longer produces go too.
    for (name, value) in expected.files() {
        if value.is_none() {
            remove_file(&dir.join(name))?;
        }
    }
    replace_files(dir, &files, &[STREAMS])
}

fn write_observations(files: &mut BTreeMap<PathBuf, Vec<u8>>, observed: &Observations) {
    for (name, value) in observed.files() {
        if let Some(value) = value {
            files.insert(PathBuf::from(name), pretty(value));
        }
    }
    for (stream, lines) in &observed.streams {
        let mut text = String::new();
        for line in lines {
            text.push_str(&serde_json::to_string(line).unwrap_or_default());
            text.push('\n');
        }
        files.insert(PathBuf::from(STREAMS).join(stream_file(stream)), text.into_bytes());
    }
}

/// A stream's file name: its name, with anything but letters, digits,
/// `-`, `_` and `.` spelt as `%XX`, so no name escapes the folder.
pub(crate) fn stream_file(stream: &str) -> String {
    let mut name = String::new();
    for b in stream.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || (b == b'.' && !name.is_empty()) {
            name.push(b as char);
        } else {
            name.push_str(&format!("%{b:02X}"));
        }
    }
    format!("{name}.jsonl")
}

/// Writes `files` under `dir`; in each of `owned` (folders the cassette
/// owns outright), removes what `files` does not name.
fn replace_files(dir: &Path, files: &BTreeMap<PathBuf, Vec<u8>>, owned: &[&str]) -> Result<(), CassetteError> {
    std::fs::create_dir_all(dir).map_err(|e| CassetteError::io(dir, &e))?;
    for folder in owned {
        let folder = dir.join(folder);
        let Ok(entries) = std::fs::read_dir(&folder) else { continue };
        for entry in entries.flatten() {
            let relative = entry.path().strip_prefix(dir).map(Path::to_owned).unwrap_or_default();
            if !files.contains_key(&relative) {
                remove_file(&entry.path())?;
            }
        }
    }
    for (relative, bytes) in files {
        let path = dir.join(relative);
        if std::fs::read(&path).is_ok_and(|old| old == *bytes) {
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| CassetteError::io(parent, &e))?;
        }
        std::fs::write(&path, bytes).map_err(|e| CassetteError::io(&path, &e))?;
    }
    Ok(())
}

fn remove_file(path: &Path) -> Result<(), CassetteError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CassetteError::io(path, &e)),
        _ => Ok(()),
    }
}

/// Pretty JSON with a final newline.
fn pretty(value: &Value) -> Vec<u8> {
    let mut text = serde_json::to_vec_pretty(value).unwrap_or_default();
    text.push(b'\n');
    text
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

// ---- reading -----------------------------------------------------------------

/// Reads the cassette in `dir`, checking every file it names.
pub(crate) fn read(dir: &Path) -> Result<Cassette, CassetteError> {
    let manifest_path = dir.join(MANIFEST);
    let text = read_text(&manifest_path)?;
    let manifest: Value = serde_json::from_str(&text).map_err(|e| CassetteError::json(&manifest_path, 0, &e))?;
    // The format first: a cassette of another format is named as such,
    // not as a list of unknown fields.
    match manifest.get("format").and_then(Value::as_str) {
        Some(FORMAT) => {}
        Some(other) => {
            return Err(CassetteError::invalid(
                &manifest_path,
                format!("format {other} is not one this host reads ({FORMAT})"),
            ));
        }
        None => {
            return Err(CassetteError::invalid(
                &manifest_path,
                format!("no \"format\": \"{FORMAT}\"; is this a cassette?"),
            ));
        }
    }
    let manifest: Manifest = serde_json::from_str(&text).map_err(|e| CassetteError::json(&manifest_path, 0, &e))?;
    let exchanges = read_exchanges(dir)?;
    let mut expected = Observations {
        check: read_optional_json(&dir.join("check.json"))?,
        catalog: read_optional_json(&dir.join("catalog.json"))?,
        entity_options: read_optional_json(&dir.join("entity-options.json"))?,
        preview: read_optional_json(&dir.join("preview.json"))?,
        streams: BTreeMap::new(),
    };
    for plan in &manifest.streams {
        let path = dir.join(STREAMS).join(stream_file(&plan.name));
        let text = read_text(&path)?;
        let mut lines = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let value: Value = serde_json::from_str(line).map_err(|e| CassetteError::json(&path, n, &e))?;
            lines.push(value);
        }
        expected.streams.insert(plan.name.clone(), lines);
    }
    let schemas = read_optional_json(&dir.join(SCHEMAS))?.unwrap_or(Value::Null);
    Ok(Cassette { manifest, exchanges, expected, schemas })
}

fn read_exchanges(dir: &Path) -> Result<Vec<Exchange>, CassetteError> {
    let path = dir.join(EXCHANGES);
    let text = read_text(&path)?;
    let mut exchanges = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let line: ExchangeLine = serde_json::from_str(raw).map_err(|e| CassetteError::json(&path, n, &e))?;
        let at = |message: String| CassetteError::Malformed {
            path: path.display().to_string(),
            line: n + 1,
            column: 1,
            message,
        };
        let method = Method::parse(&line.method).ok_or_else(|| at(format!("unknown method {}", line.method)))?;
        let body = match line.body {
            None => None,
            Some(BodyLine::Text(text)) => Some(text.into_bytes()),
            Some(BodyLine::Base64(encoded)) => {
                use base64::Engine;
                Some(
                    base64::engine::general_purpose::STANDARD
                        .decode(encoded)
                        .map_err(|e| at(format!("the body is not Base64: {e}")))?,
                )
            }
        };
        if line.credential.is_some() && !line.credentials.is_empty() {
            return Err(at("a request names its credential, or its credentials, not both".into()));
        }
        let credentials = line
            .credential
            .into_iter()
            .chain(line.credentials)
            .map(|c| {
                Ok(CredentialUse {
                    handle: CredentialHandle::new(c.handle),
                    placement: parse_placement(&c.placement).ok_or_else(|| {
                        at(format!(
                            "placement {} is not bearer, header:NAME, basic:USER, query:NAME, body:FIELD or as-stored",
                            c.placement
                        ))
                    })?,
                })
            })
            .collect::<Result<Vec<_>, CassetteError>>()?;
        let answer = match (line.response, line.error, line.abandoned) {
            (Some(r), None, false) => {
                let body = match &r.body {
                    None => Vec::new(),
                    Some(file) => {
                        let relative = Path::new(file);
                        if !relative.starts_with(RESPONSES) || relative.components().count() != 2 {
                            return Err(at(format!("body file {file} is not in {RESPONSES}/")));
                        }
                        let body_path = dir.join(relative);
                        std::fs::read(&body_path).map_err(|e| CassetteError::io(&body_path, &e))?
                    }
                };
                Answer::Response(InboundResponse { status: r.status, headers: r.headers, body })
            }
            (None, Some(e), false) => Answer::Error(error_from(e)),
            (None, None, true) => Answer::Abandoned,
            _ => return Err(at("an exchange has exactly one of response, error and abandoned".into())),
        };
        let request =
            OutboundRequest { method, url: line.url, headers: line.headers, body, credentials, timeout_ms: None };
        exchanges.push(Exchange { call: line.call, request, answer });
    }
    Ok(exchanges)
}

fn read_text(path: &Path) -> Result<String, CassetteError> {
    let bytes = std::fs::read(path).map_err(|e| CassetteError::io(path, &e))?;
    String::from_utf8(bytes).map_err(|e| CassetteError::invalid(path, format!("not UTF-8 text: {e}")))
}

fn read_optional_json(path: &Path) -> Result<Option<Value>, CassetteError> {
    if !path.exists() {
        return Ok(None);
    }
    let text = read_text(path)?;
    serde_json::from_str(&text).map(Some).map_err(|e| CassetteError::json(path, 0, &e))
}

/// `path` relative to `base` (both absolute or both relative to the same
/// folder), with `..` where needed.
pub(crate) fn relative_to(path: &Path, base: &Path) -> PathBuf {
    let path: Vec<_> = path.components().collect();
    let base: Vec<_> = base.components().collect();
    let common = path.iter().zip(&base).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..base.len() {
        out.push("..");
    }
    for part in &path[common..] {
        out.push(part.as_os_str());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_names_cannot_leave_the_streams_folder() {
        assert_eq!(stream_file("posts"), "posts.jsonl");
        assert_eq!(stream_file("../etc/passwd"), "%2E.%2Fetc%2Fpasswd.jsonl");
        assert_eq!(stream_file("a b.c"), "a%20b.c.jsonl");
    }

    #[test]
    fn placements_read_back_as_written() {
        for p in [
            Placement::Bearer,
            Placement::Header("X-Api-Key".into()),
            Placement::BasicPassword("me".into()),
            Placement::BasicUsername("x".into()),
            Placement::BasicBoth,
            Placement::BasicPair,
            Placement::HeaderAround {
                header: "authorization".into(),
                prefix: "Token token=\"".into(),
                suffix: "\"".into(),
            },
            Placement::Query("api_key".into()),
            Placement::BodyField("/auth/key".into()),
            Placement::AsStored,
        ] {
            assert_eq!(parse_placement(&placement_text(&p)), Some(p));
        }
        assert_eq!(parse_placement("cookie"), None);
        assert_eq!(parse_placement("header:"), None);
    }

    #[test]
    fn relative_paths_climb_where_needed() {
        assert_eq!(relative_to(Path::new("/a/b/c.wasm"), Path::new("/a/d/e")), PathBuf::from("../../b/c.wasm"));
        assert_eq!(relative_to(Path::new("/a/b/c.wasm"), Path::new("/a/b")), PathBuf::from("c.wasm"));
    }

    #[test]
    fn a_truncated_line_is_named_with_its_position() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(EXCHANGES), "{\"seq\":1,\"call\":\"check\",\"method\":\"GET\",\"url\":\"https://a\",\"response\":{\"status\":200}}\n{\"seq\":2,\"ca").unwrap();
        let err = read_exchanges(dir.path()).unwrap_err().to_string();
        assert!(err.contains("exchanges.jsonl:2:"), "{err}");
        assert!(err.contains("ends early"), "{err}");
    }
}
