//! The connector author's kit: make a plugin, record it against its
//! provider, and test it offline from the recording.
//!
//! A recording is made where the host already sees every request before
//! it attaches a credential, so it holds credential handles and never a
//! secret; what the provider echoes of the secret is scrubbed by the same
//! code that protects plugins from it, and the cassette is searched for
//! every form of the secret before a byte of it is written. A replay gives
//! the plugin an egress with no HTTP client at all: it cannot open a
//! socket.
//!
//! Layout:
//! - [`scaffold`]: `service plugins new`, a crate that builds on its own;
//! - [`cassette`]: the recording on disk (format, reading with positions,
//!   writing diff-friendly);
//! - [`tape`]: recording exchanges from a live egress, answering a
//!   replaying one;
//! - [`run`]: the calls a recording makes and a replay repeats, and the
//!   sink that keeps what they emit;
//! - [`compare`]: expected against replayed, as line diffs;
//! - [`schema`]: the schema the records show, against the declared one;
//! - [`conform`]: the conformance suite: crashes at every checkpoint,
//!   echoes of a canary secret, determinism, from a cassette;
//! - this module: [`record`], [`test`] and [`conform()`], and their
//!   settings and errors.
//!
//! A recording and its replays give the plugin a wall clock that stands
//! still at the recording's instant and randomness from a fixed seed, so
//! a replay asks exactly what the recording asked.

pub(crate) mod cassette;
pub(crate) mod compare;
pub(crate) mod conform;
pub(crate) mod run;
pub(crate) mod scaffold;
pub(crate) mod schema;
pub(crate) mod tape;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

use crate::config::ConfigError;
use crate::egress::{
    Caller, CredentialHandle, Egress, EgressPolicy, HostPattern, Injection, Placement, SecretError, SecretSource,
};
use crate::plugin::connector::Connector;
use crate::plugin::sandbox::{GuestTime, Limits};
use crate::plugin::{InvalidPlugin, LoadedPlugin, Runtime};
use cassette::{Cassette, CassetteError, ConnectorRef, Manifest};
use compare::Difference;
use run::{RunError, StreamChoice};
use schema::Disagreement;
use tape::{Miss, Player, Recording};

/// Why a recording or a test could not run. Each names the file it is
/// about; none holds a secret.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AuthoringError {
    #[error(transparent)]
    Cassette(#[from] CassetteError),
    #[error("{path}: {message}")]
    Input { path: String, message: String },
    #[error("{path}: not a usable plugin: {error}")]
    Component { path: String, error: InvalidPlugin },
    #[error("{path}: recorded for {recorded}, but the component is {found}; record the cassette again for this plugin")]
    OtherPlugin { path: String, recorded: String, found: String },
    #[error("{0}")]
    Settings(#[from] ConfigError),
    #[error(
        "the config names credential handle(s) {0}, and no secret was given: set SERVICE_RECORD_SECRET or pass the secret on standard input"
    )]
    NoSecret(String),
    #[error("{0}")]
    Run(#[from] RunError),
    #[error(
        "the recording would hold the secret (in {0}); nothing was written. The provider returns it in a form the host does not recognise"
    )]
    SecretInRecording(String),
    #[error("the plugin runtime could not start: {0}")]
    Runtime(String),
}

impl AuthoringError {
    fn input(path: &Path, message: impl Into<String>) -> Self {
        AuthoringError::Input { path: path.display().to_string(), message: message.into() }
    }
}

/// Where a recording's requests may go, beyond what the plugin declares.
#[derive(Debug, Clone, Default)]
pub(crate) struct EgressSettings {
    /// Allowed hosts (comma-separated patterns); default: the plugin's
    /// declared hosts.
    pub allowed_hosts: Option<String>,
    /// Pinned addresses (`host=ip:port,...`), for staging and tests.
    pub resolve: Option<String>,
    /// PEM roots trusted besides the system's.
    pub extra_roots_pem: Option<Vec<u8>>,
    /// The hosts the secret is bound to (comma-separated patterns), as a
    /// credential's are on a server; default: the host of the config's
    /// `base_url` and the exact names the plugin declares.
    pub secret_hosts: Option<String>,
}

/// A component named on the command line: a file, or one of the server's
/// bundled plugins (`bundled:STEM`, e.g. `bundled:conn_restmanifest`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Component<'a> {
    File(&'a Path),
    Bundled(&'static str, &'static [u8]),
}

/// How a cassette names a bundled component.
const BUNDLED_PREFIX: &str = "bundled:";

impl<'a> Component<'a> {
    /// `text` as a component: `bundled:STEM` names one of `bundled`, and
    /// anything else is a file.
    pub(crate) fn named(text: &'a str, bundled: &[(&'static str, &'static [u8])]) -> Result<Self, AuthoringError> {
        let Some(stem) = text.strip_prefix(BUNDLED_PREFIX) else {
            return Ok(Component::File(Path::new(text)));
        };
        bundled.iter().find(|(name, _)| *name == stem).map(|(name, bytes)| Component::Bundled(name, bytes)).ok_or_else(
            || AuthoringError::Input {
                path: text.to_owned(),
                message: format!(
                    "no bundled plugin of that name; this server bundles {}",
                    bundled.iter().map(|(n, _)| format!("{BUNDLED_PREFIX}{n}")).collect::<Vec<_>>().join(", ")
                ),
            },
        )
    }

    /// The component's bytes, and how to name it.
    fn read(self) -> Result<(String, Vec<u8>), AuthoringError> {
        match self {
            Component::File(path) => Ok((path.display().to_string(), read_component(path)?)),
            Component::Bundled(name, bytes) => Ok((format!("{BUNDLED_PREFIX}{name}"), bytes.to_vec())),
        }
    }
}

/// What `service plugins record` was asked.
pub(crate) struct RecordRequest<'a> {
    pub component: Component<'a>,
    pub config: &'a Path,
    pub out: &'a Path,
    pub streams: Option<Vec<String>>,
    pub state: Option<&'a Path>,
    pub record_limit: u64,
    /// Where the secret goes in requests (the server takes it from the
    /// credential's kind and recipe).
    pub placement: RecordPlacement,
    pub egress: EgressSettings,
    /// The instant (RFC 3339) the plugin's clock stands at while it is
    /// recorded; default: when the recording starts.
    pub clock: Option<&'a str>,
}

/// Where a recording puts its secret: in a place of the requests (a
/// signing recipe included), or at a token endpoint, trading it for the
/// token the requests carry, as a server's credential says.
#[derive(Debug, Clone)]
pub enum RecordPlacement {
    Placed(Placement),
    Traded(crate::credentials::exchange::TokenExchange),
}

impl RecordPlacement {
    /// Where the plugin's requests carry the secret, or its token.
    fn sent(&self) -> Placement {
        match self {
            RecordPlacement::Placed(placement) => placement.clone(),
            RecordPlacement::Traded(exchange) => exchange.header.clone().map_or(Placement::Bearer, Placement::Header),
        }
    }
}

/// What a recording holds, for the author.
pub(crate) struct RecordSummary {
    pub connector: ConnectorRef,
    pub exchanges: usize,
    /// Stream → (records, checkpoints, how its read ended).
    pub streams: BTreeMap<String, (usize, usize, Value)>,
    /// Calls that returned an error: (file, message).
    pub failed_calls: Vec<(String, String)>,
    pub disagreements: Vec<Disagreement>,
}

/// Loads a component as a plugin; `label` names it.
async fn load(runtime: &Runtime, label: &str, bytes: &[u8]) -> Result<LoadedPlugin, AuthoringError> {
    runtime.load(bytes, label).await.map_err(|error| AuthoringError::Component { path: label.to_owned(), error })
}

fn read_component(path: &Path) -> Result<Vec<u8>, AuthoringError> {
    let bytes = std::fs::read(path).map_err(|e| AuthoringError::input(path, e.to_string()))?;
    if !bytes.starts_with(b"\0asm") {
        return Err(AuthoringError::input(path, "not a WebAssembly component"));
    }
    Ok(bytes)
}

fn runtime(time: GuestTime) -> Result<Arc<Runtime>, AuthoringError> {
    Runtime::new(Limits::default(), None)
        .map(|r| Arc::new(r.with_guest_time(time)))
        .map_err(|e| AuthoringError::Runtime(e.to_string()))
}

/// A JSON file, with the position of a syntax error.
fn read_json(path: &Path) -> Result<Value, AuthoringError> {
    let text = std::fs::read_to_string(path).map_err(|e| AuthoringError::input(path, e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| {
        let message = e.to_string();
        let message = message.rfind(" at line ").map_or(message.clone(), |at| message[..at].to_owned());
        AuthoringError::Input { path: format!("{}:{}:{}", path.display(), e.line(), e.column()), message }
    })
}

/// Checks `config` against the plugin's config schema; `at` names where
/// the config is (a file, or a field of `cassette.json`).
fn check_config(plugin: &LoadedPlugin, config: &Value, at: &str) -> Result<(), AuthoringError> {
    let (config, _) = run::split_account(config);
    let config = &config;
    let validator = jsonschema::validator_for(&plugin.info.config_schema).map_err(|e| AuthoringError::Input {
        path: at.to_owned(),
        message: format!("the plugin's config schema is not a valid JSON Schema: {e}"),
    })?;
    if let Some(e) = validator.iter_errors(config).next() {
        let pointer = e.instance_path().to_string();
        let position = if pointer.is_empty() { "/".to_owned() } else { pointer };
        return Err(AuthoringError::Input {
            path: format!("{at}: at {position}"),
            message: format!("does not match the plugin's config schema: {e}"),
        });
    }
    Ok(())
}

/// A config whose `base_url` is on a host the plugin does not declare
/// would fail its first request: said up front, with what to change.
fn check_base_url(plugin: &LoadedPlugin, config: &Value, path: &Path) -> Result<(), AuthoringError> {
    let Some(host) =
        config["base_url"].as_str().and_then(|u| url::Url::parse(u).ok()).and_then(|u| u.host_str().map(str::to_owned))
    else {
        return Ok(());
    };
    if plugin.info.hosts.iter().any(|p| p.matches(&host)) {
        return Ok(());
    }
    let declared = plugin.info.hosts.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    Err(AuthoringError::Input {
        path: format!("{}: at /base_url", path.display()),
        message: format!(
            "{host} is not among the hosts the connector declares ({declared}); add it to them (`with_hosts` in the connector's `describe`), build again, and record"
        ),
    })
}

/// The hosts a plugin may reach when the author names none: those it
/// declares. A plugin that declares `*` (hosts chosen per deployment)
/// needs them named.
fn declared_hosts(plugin: &LoadedPlugin) -> Option<String> {
    let hosts: Vec<String> =
        plugin.info.hosts.iter().filter(|h| **h != HostPattern::Any).map(ToString::to_string).collect();
    (!hosts.is_empty()).then(|| hosts.join(","))
}

/// The hosts a recording's secret goes to when the author names none: the
/// host of the config's `base_url`, and the exact names the plugin
/// declares (never a pattern: a secret is bound to hosts, as a server's
/// credential is).
fn default_secret_hosts(plugin: &LoadedPlugin, config: &Value) -> Vec<HostPattern> {
    let mut hosts: Vec<HostPattern> =
        plugin.info.hosts.iter().filter(|h| matches!(h, HostPattern::Exact(_))).cloned().collect();
    if let Some(host) = config["base_url"]
        .as_str()
        .and_then(|u| url::Url::parse(u).ok())
        .and_then(|u| u.host_str().and_then(|h| HostPattern::parse(h).ok()))
        && !hosts.contains(&host)
    {
        hosts.push(host);
    }
    hosts
}

/// Records `request.component` against its provider into `request.out`.
/// `secret` is asked only when the config names a credential handle.
pub(crate) async fn record(
    request: &RecordRequest<'_>,
    secret: &mut dyn FnMut() -> Option<SecretString>,
    progress: &mut dyn FnMut(&str),
) -> Result<RecordSummary, AuthoringError> {
    // Re-recording replaces a cassette's files; anything else is left alone.
    let occupied = std::fs::read_dir(request.out).is_ok_and(|mut entries| entries.next().is_some());
    if occupied && !request.out.join(cassette::MANIFEST).is_file() {
        return Err(AuthoringError::input(
            request.out,
            "not empty and not a cassette; give a new folder (or a cassette to record again)",
        ));
    }
    let (label, bytes) = request.component.read()?;
    let config = read_json(request.config)?;
    if !config.is_object() {
        return Err(AuthoringError::input(request.config, "the config is not a JSON object"));
    }
    // What a server would refuse to store, a cassette does not keep either.
    if let Some(field) = crate::credentials::lookalike::find_secret(&config, "") {
        return Err(AuthoringError::Input {
            path: format!("{}: at /{}", request.config.display(), field.replace('.', "/")),
            message: "looks like a secret; a config names credential handles, and the secret is given to the recording through SERVICE_RECORD_SECRET or standard input".into(),
        });
    }
    let states: BTreeMap<String, Value> = match request.state {
        None => BTreeMap::new(),
        Some(path) => match read_json(path)? {
            Value::Object(map) => map.into_iter().collect(),
            _ => return Err(AuthoringError::input(path, "the state file is not a JSON object of stream → state")),
        },
    };
    let recorded_at = match request.clock {
        Some(text) => text.to_owned(),
        None => chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
    };
    let time = cassette::frozen_at(&recorded_at).ok_or_else(|| AuthoringError::Input {
        path: "--clock".into(),
        message: format!("{recorded_at:?} is not an RFC 3339 instant after 1970"),
    })?;
    let runtime = runtime(time)?;
    let plugin = load(&runtime, &label, &bytes).await?;
    check_config(&plugin, &config, &request.config.display().to_string())?;
    check_base_url(&plugin, &config, request.config)?;

    let handles: Vec<CredentialHandle> =
        CredentialHandle::in_configuration(&config).into_iter().map(|(_, handle)| handle).collect();
    let secret = if handles.is_empty() {
        None
    } else {
        let names = handles.iter().map(|h| h.as_str().to_owned()).collect::<Vec<_>>().join(", ");
        Some(secret().filter(|s| !s.expose_secret().is_empty()).ok_or(AuthoringError::NoSecret(names))?)
    };
    let allowed = match (&request.egress.allowed_hosts, declared_hosts(&plugin)) {
        (Some(named), _) => named.clone(),
        (None, Some(declared)) => declared,
        (None, None) => {
            return Err(AuthoringError::Settings(ConfigError::new(
                "SERVICE_EGRESS_ALLOWED_HOSTS",
                "the plugin declares hosts chosen per deployment (*); name the ones to reach",
            )));
        }
    };
    let policy = EgressPolicy::from_settings(
        &allowed,
        request.egress.resolve.as_deref(),
        request.egress.extra_roots_pem.as_deref(),
    )?;
    let egress_limit = policy.max_response_bytes;
    let bound = match (&secret, &request.egress.secret_hosts) {
        (None, _) => Vec::new(),
        (Some(_), Some(named)) => named
            .split(',')
            .filter(|h| !h.trim().is_empty())
            .map(|h| HostPattern::parse(h).map_err(|e| ConfigError::new("SERVICE_RECORD_SECRET_HOSTS", e)))
            .collect::<Result<Vec<_>, _>>()?,
        (Some(_), None) => default_secret_hosts(&plugin, &config),
    };
    if secret.is_some() && (bound.is_empty() || bound.contains(&HostPattern::Any)) {
        return Err(AuthoringError::Settings(ConfigError::new(
            "SERVICE_RECORD_SECRET_HOSTS",
            "name the hosts the secret may be sent to (the config has no base_url and the plugin declares no exact host)",
        )));
    }
    let traded = match &request.placement {
        RecordPlacement::Traded(recipe) => {
            let bound: Vec<String> = bound.iter().map(|h| h.to_string()).collect();
            recipe.check(&bound).map_err(|m| AuthoringError::Input { path: "--placement".into(), message: m })?;
            // Its own egress, holding no secret: the token request carries
            // the secret in its body, to the bound hosts only.
            let egress = Egress::new(policy.clone(), Arc::new(AuthorSecret::none()))
                .map_err(|e| AuthoringError::Runtime(e.to_string()))?;
            Some(Traded { recipe: recipe.clone(), egress, token: Default::default(), issued: Default::default() })
        }
        RecordPlacement::Placed(_) => None,
    };
    let secrets = Arc::new(AuthorSecret {
        handles,
        secret: secret.clone(),
        placement: request.placement.sent(),
        hosts: bound,
        traded,
    });
    let recording = Arc::new(Recording::default());
    let egress = Egress::new(policy, secrets.clone())
        .map_err(|e| AuthoringError::Runtime(e.to_string()))?
        .recording(recording.clone());
    let plugin = Arc::new(plugin);
    let connector = Connector::new(plugin.clone(), runtime, egress, run::WORKSPACE);
    let choice = StreamChoice::Discovered { names: request.streams.clone(), states };
    let outcome = run::run(&connector, &recording.call, &config, request.record_limit, choice, progress).await?;
    // Each incremental stream read again from every state it saved, as a
    // restarted job would: what the conformance suite replays.
    let (call_config, _) = run::split_account(&config);
    for plan in outcome.streams.iter().filter(|p| p.sync_mode == crate::plugin::types::SyncMode::Incremental) {
        let lines = outcome.observed.streams.get(&plan.name).map(Vec::as_slice).unwrap_or_default();
        if lines.last().and_then(|l| l.get("end")).and_then(Value::as_str) != Some("complete") {
            continue;
        }
        for (n, state) in conform::resume_points(lines, plan.state.as_ref()) {
            let label = run::resume_call(&plan.name, n);
            recording.call.set(&label);
            progress(&label);
            let resumed = cassette::StreamPlan { state: Some(state), ..plan.clone() };
            run::read(&connector, &call_config.to_string(), &resumed, request.record_limit).await;
        }
    }

    let (schemas, disagreements) = infer_schemas(&outcome.observed, &outcome.declared);
    let out_abs = absolute(request.out);
    let manifest = Manifest {
        format: cassette::FORMAT.to_owned(),
        connector: connector_ref(&plugin),
        component: Some(match request.component {
            Component::File(path) => cassette::relative_to(&absolute(path), &out_abs).display().to_string(),
            Component::Bundled(..) => label,
        }),
        config,
        streams: outcome.streams,
        record_limit: request.record_limit,
        accepted: Vec::new(),
        recorded_at: Some(recorded_at),
        secret_placement: None,
    };
    let exchanges = tape::without_repeats(recording.exchanges());
    // Where the secret went, for a plugin that left it to the credential:
    // what a conformance run places its canary by.
    let as_stored = exchanges.iter().any(|e| e.request.credentials.iter().any(|c| c.placement == Placement::AsStored));
    let manifest =
        Manifest { secret_placement: as_stored.then(|| cassette::sent_value(&request.placement.sent())), ..manifest };
    let cassette = Cassette { manifest, exchanges, expected: outcome.observed, schemas };
    let files = cassette::render(&cassette);
    if let Some(secret) = &secret {
        // The secret, and every token it was traded for.
        let sent = request.placement.sent();
        let mut forms = crate::egress::reflections(secret.expose_secret(), &sent);
        for token in secrets.issued() {
            forms.extend(crate::egress::reflections(token.expose_secret(), &sent));
        }
        // Every reading of a file: as written, and decoded under any
        // content coding its exchange names or its bytes look like.
        let holds_secret = |bytes: &[u8], coding: Option<&str>| {
            crate::egress::coding::readings(bytes, coding, egress_limit)
                .iter()
                .any(|reading| forms.iter().any(|f| memchr::memmem::find(reading, f).is_some()))
        };
        for (seq, exchange) in cassette.exchanges.iter().enumerate() {
            if let cassette::Answer::Response(r) = &exchange.answer {
                let coding = r.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case("content-encoding"));
                if holds_secret(&r.body, coding.map(|(_, v)| v.as_str())) {
                    return Err(AuthoringError::SecretInRecording(format!("{}/{:04}", cassette::RESPONSES, seq + 1)));
                }
            }
        }
        for (file, bytes) in &files {
            let named = file.to_string_lossy();
            if holds_secret(bytes, None) || forms.iter().any(|f| memchr::memmem::find(named.as_bytes(), f).is_some()) {
                return Err(AuthoringError::SecretInRecording(file.display().to_string()));
            }
        }
    }
    cassette::write_files(request.out, &files)?;

    let summary = RecordSummary {
        connector: cassette.manifest.connector.clone(),
        exchanges: cassette.exchanges.len(),
        streams: stream_summary(&cassette.expected),
        failed_calls: failed_calls(&cassette.expected),
        disagreements,
    };
    Ok(summary)
}

fn connector_ref(plugin: &LoadedPlugin) -> ConnectorRef {
    ConnectorRef {
        id: plugin.info.id.clone(),
        version: plugin.info.version.clone(),
        interface: plugin.version.as_str().to_owned(),
    }
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

/// Schemas inferred from each stream's records, and the disagreements
/// with the declared ones.
fn infer_schemas(observed: &cassette::Observations, declared: &BTreeMap<String, Value>) -> (Value, Vec<Disagreement>) {
    let mut schemas = serde_json::Map::new();
    let mut disagreements = Vec::new();
    for (stream, lines) in &observed.streams {
        let records = lines.iter().filter_map(|l| l.get("record"));
        let declared = declared.get(stream).cloned().unwrap_or(Value::Bool(true));
        let (schema, found) = schema::infer(stream, records, &declared);
        schemas.insert(stream.clone(), schema);
        disagreements.extend(found);
    }
    (Value::Object(schemas), disagreements)
}

fn stream_summary(observed: &cassette::Observations) -> BTreeMap<String, (usize, usize, Value)> {
    observed
        .streams
        .iter()
        .map(|(name, lines)| {
            let records = lines.iter().filter(|l| l.get("record").is_some()).count();
            let checkpoints = lines.iter().filter(|l| l.get("checkpoint").is_some()).count();
            let end = lines.last().and_then(|l| l.get("end")).cloned().unwrap_or(Value::Null);
            (name.clone(), (records, checkpoints, end))
        })
        .collect()
}

/// The calls that answered with an error: (file, message).
fn failed_calls(observed: &cassette::Observations) -> Vec<(String, String)> {
    let mut failed = Vec::new();
    for (file, value) in observed.files() {
        let Some(value) = value else { continue };
        if let Some(e) = value.get("error").and_then(Value::as_str) {
            failed.push((file.to_owned(), e.to_owned()));
        }
        if file == "entity-options.json" {
            for (field, outcome) in value.as_object().into_iter().flatten() {
                if let Some(e) = outcome.get("error").and_then(Value::as_str) {
                    failed.push((format!("{file} ({field})"), e.to_owned()));
                }
            }
        }
    }
    for (stream, lines) in &observed.streams {
        if let Some(e) = lines.last().and_then(|l| l["end"]["error"].as_str()) {
            failed.push((format!("streams/{}", cassette::stream_file(stream)), e.to_owned()));
        }
    }
    failed
}

/// What `service plugins test` was asked.
pub(crate) struct TestRequest<'a> {
    pub dir: &'a Path,
    pub component: Option<Component<'a>>,
    /// The server's bundled plugins (file stem, component): a cassette of
    /// a bundled connector whose component file is absent replays with
    /// the bundled one, and `bundled:STEM` names one.
    pub bundled: &'a [(&'static str, &'static [u8])],
    /// Rewrite the expectations with what the replay returned.
    pub update: bool,
    /// Accept the schema disagreements the replay finds.
    pub accept_schema: bool,
}

/// What a replay found.
pub(crate) struct TestReport {
    pub connector: ConnectorRef,
    /// The component replayed, as the author would name it.
    pub component: String,
    pub misses: Vec<Miss>,
    /// Recorded requests never made again: (exchange number, request).
    pub unused: Vec<(usize, String)>,
    pub differences: Vec<Difference>,
    /// Disagreements the cassette does not accept.
    pub disagreements: Vec<Disagreement>,
    /// Accepted disagreements the records no longer show.
    pub stale_acceptances: Vec<cassette::Acceptance>,
    /// Whether the expectations were rewritten.
    pub updated: bool,
    /// Whether the replay opened no network: its egress had no client.
    pub offline: bool,
}

impl TestReport {
    /// Whether the cassette's expectations hold.
    pub(crate) fn passed(&self) -> bool {
        self.misses.is_empty() && self.differences.is_empty() && self.disagreements.is_empty()
    }
}

/// A cassette and the plugin to replay it with, checked to belong
/// together, on a runtime whose clock stands at the recording's instant.
struct Prepared {
    cassette: Cassette,
    label: String,
    plugin: Arc<LoadedPlugin>,
    runtime: Arc<Runtime>,
}

async fn prepare(
    dir: &Path,
    component: Option<Component<'_>>,
    bundled: &[(&'static str, &'static [u8])],
) -> Result<Prepared, AuthoringError> {
    let cassette = cassette::read(dir)?;
    let manifest_path = dir.join(cassette::MANIFEST).display().to_string();
    let (label, bytes) = component_for(dir, component, bundled, &cassette.manifest)?;
    let time = cassette.manifest.guest_time()?;
    let runtime = runtime(time)?;
    let plugin = load(&runtime, &label, &bytes).await?;
    let found = connector_ref(&plugin);
    let recorded = &cassette.manifest.connector;
    if found.id != recorded.id || found.interface != recorded.interface {
        return Err(AuthoringError::OtherPlugin {
            path: manifest_path,
            recorded: format!("{} ({})", recorded.id, recorded.interface),
            found: format!("{} ({})", found.id, found.interface),
        });
    }
    if !cassette.manifest.config.is_object() {
        return Err(AuthoringError::Input {
            path: format!("{manifest_path}: at /config"),
            message: "not a JSON object".into(),
        });
    }
    check_config(&plugin, &cassette.manifest.config, &format!("{manifest_path}: config"))?;
    Ok(Prepared { cassette, label, plugin: Arc::new(plugin), runtime })
}

/// Replays the cassette in `request.dir` with no network and compares.
pub(crate) async fn test(
    request: &TestRequest<'_>,
    progress: &mut dyn FnMut(&str),
) -> Result<TestReport, AuthoringError> {
    let Prepared { mut cassette, label, plugin, runtime } =
        prepare(request.dir, request.component, request.bundled).await?;
    let found = connector_ref(&plugin);
    // The resumed reads are the conformance suite's to replay.
    let exchanges: Vec<_> = cassette.exchanges.iter().filter(|e| !run::is_resume(&e.call)).cloned().collect();
    let player = Arc::new(Player::new(&exchanges));
    // Whatever the plugin declares, and nothing else: the recording answers.
    let policy = EgressPolicy { allowed_hosts: plugin.info.hosts.clone(), ..EgressPolicy::default() };
    let egress = Egress::replaying(policy, player.clone());
    let offline = !egress.uses_network();
    let connector = Connector::new(plugin, runtime, egress, run::WORKSPACE);
    let choice = StreamChoice::Recorded(cassette.manifest.streams.clone());
    let outcome =
        run::run(&connector, &player.call, &cassette.manifest.config, cassette.manifest.record_limit, choice, progress)
            .await?;

    let (schemas, found_disagreements) = infer_schemas(&outcome.observed, &outcome.declared);
    let accepted = |d: &Disagreement| {
        cassette
            .manifest
            .accepted
            .iter()
            .any(|a| a.stream == d.stream && a.field == d.field && a.disagreement == d.kind)
    };
    let stale_acceptances: Vec<_> = cassette
        .manifest
        .accepted
        .iter()
        .filter(|a| {
            !found_disagreements.iter().any(|d| a.stream == d.stream && a.field == d.field && a.disagreement == d.kind)
        })
        .cloned()
        .collect();
    let mut disagreements: Vec<Disagreement> = found_disagreements.iter().filter(|d| !accepted(d)).cloned().collect();
    let mut differences = compare::differences(&cassette.expected, &outcome.observed);
    let mut updated = false;
    if request.update {
        cassette::write_expectations(request.dir, &outcome.observed, &schemas)?;
        differences.clear();
        updated = true;
    }
    if request.accept_schema {
        cassette.manifest.accepted = found_disagreements
            .iter()
            .map(|d| cassette::Acceptance { stream: d.stream.clone(), field: d.field.clone(), disagreement: d.kind })
            .collect();
        cassette::write_manifest(request.dir, &cassette.manifest)?;
        disagreements.clear();
        updated = true;
    }
    Ok(TestReport {
        connector: found,
        component: label,
        misses: player.misses(),
        unused: player.unused(),
        differences,
        disagreements,
        stale_acceptances,
        updated,
        offline,
    })
}

/// What `service plugins conform` was asked.
pub(crate) struct ConformRequest<'a> {
    pub dir: &'a Path,
    pub component: Option<Component<'a>>,
    /// The server's bundled plugins, as for [`TestRequest::bundled`].
    pub bundled: &'a [(&'static str, &'static [u8])],
}

/// Runs the conformance suite over the cassette in `request.dir`, with no
/// network.
pub(crate) async fn conform(
    request: &ConformRequest<'_>,
    progress: &mut dyn FnMut(&str),
) -> Result<conform::ConformReport, AuthoringError> {
    let prepared = prepare(request.dir, request.component, request.bundled).await?;
    conform::conform(prepared, progress).await
}

/// The component to replay: the one named, else the cassette's file,
/// else the bundled plugin of the same file name.
fn component_for(
    dir: &Path,
    component: Option<Component<'_>>,
    bundled: &[(&'static str, &'static [u8])],
    manifest: &Manifest,
) -> Result<(String, Vec<u8>), AuthoringError> {
    if let Some(component) = component {
        return component.read();
    }
    if let Some(named) = manifest.component.as_deref().filter(|c| c.starts_with(BUNDLED_PREFIX)) {
        return Component::named(named, bundled)?.read();
    }
    let recorded = manifest.component.as_ref().map(|c| dir.join(c));
    if let Some(path) = &recorded
        && path.exists()
    {
        // Named without the climb through the cassette's folder.
        return Ok((tidy(path).display().to_string(), read_component(path)?));
    }
    let stem = recorded.as_ref().and_then(|p| p.file_stem()).map(|s| s.to_string_lossy().into_owned());
    if let Some((name, bytes)) = bundled.iter().find(|(name, _)| Some(*name) == stem.as_deref()) {
        return Ok((format!("(bundled {name})"), bytes.to_vec()));
    }
    Err(AuthoringError::Input {
        path: dir.join(cassette::MANIFEST).display().to_string(),
        message: match recorded {
            Some(path) => format!("the component {} does not exist; build it or pass --component", path.display()),
            None => "the cassette names no component; pass --component".into(),
        },
    })
}

/// `path` without `.` and with each `name/..` taken away, as written.
fn tidy(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out: Vec<Component<'_>> = Vec::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir if matches!(out.last(), Some(Component::Normal(_))) => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out.iter().collect()
}

/// The secret of a recording: one, for the handles the config names, put
/// where the author says, or traded for a token first.
struct AuthorSecret {
    handles: Vec<CredentialHandle>,
    secret: Option<SecretString>,
    /// Where the secret (or its token) goes.
    placement: Placement,
    /// The hosts the secret is bound to.
    hosts: Vec<HostPattern>,
    traded: Option<Traded>,
}

/// A recording's secret traded for a token: the recipe, the egress its
/// token requests go through, the token in use and every one obtained.
struct Traded {
    recipe: crate::credentials::exchange::TokenExchange,
    egress: Egress,
    token: tokio::sync::Mutex<Option<SecretString>>,
    issued: std::sync::Mutex<Vec<SecretString>>,
}

impl AuthorSecret {
    /// A source of no secret at all.
    fn none() -> AuthorSecret {
        AuthorSecret {
            handles: Vec::new(),
            secret: None,
            placement: Placement::Bearer,
            hosts: Vec::new(),
            traded: None,
        }
    }

    /// Every token the secret was traded for.
    fn issued(&self) -> Vec<SecretString> {
        self.traded.as_ref().map(|t| t.issued.lock().unwrap_or_else(|p| p.into_inner()).clone()).unwrap_or_default()
    }

    async fn injection(
        &self,
        handle: &CredentialHandle,
        host: &str,
        rejected: Option<&SecretString>,
    ) -> Result<Injection, SecretError> {
        if !self.handles.iter().any(|h| h.as_str() == handle.as_str()) {
            return Err(SecretError::Unknown);
        }
        if !self.hosts.iter().any(|p| p.matches(host)) {
            return Err(SecretError::NotBound(host.to_owned()));
        }
        let secret = self.secret.clone().ok_or(SecretError::Incomplete("no secret was given"))?;
        let Some(traded) = &self.traded else {
            if rejected.is_some() {
                return Err(SecretError::NotRenewable);
            }
            return Ok(Injection {
                secret,
                renewable: false,
                any_401_renews: false,
                placement: self.placement.clone(),
            });
        };
        let mut token = traded.token.lock().await;
        let stale = |t: &SecretString| rejected.is_some_and(|r| r.expose_secret() == t.expose_secret());
        let current = match token.as_ref().filter(|t| !stale(t)) {
            Some(t) => t.clone(),
            None => {
                let caller = Caller {
                    plugin_id: "recording",
                    declared_hosts: &self.hosts,
                    workspace_id: run::WORKSPACE,
                    reach: crate::egress::Reach::Providers,
                };
                let obtained =
                    crate::credentials::exchange::trade(&traded.egress, &caller, &traded.recipe, &secret, None)
                        .await
                        .map_err(|e| SecretError::Exchange(e.0))?;
                traded.issued.lock().unwrap_or_else(|p| p.into_inner()).push(obtained.token.clone());
                *token = Some(obtained.token.clone());
                obtained.token
            }
        };
        Ok(Injection { secret: current, renewable: true, any_401_renews: true, placement: self.placement.clone() })
    }
}

impl SecretSource for AuthorSecret {
    fn secret_for<'a>(
        &'a self,
        _workspace_id: &'a str,
        _connector_id: &'a str,
        handle: &'a CredentialHandle,
        host: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Injection, SecretError>> + Send + 'a>> {
        Box::pin(async move { self.injection(handle, host, None).await })
    }

    fn renew<'a>(
        &'a self,
        _workspace_id: &'a str,
        _connector_id: &'a str,
        handle: &'a CredentialHandle,
        host: &'a str,
        rejected: &'a SecretString,
    ) -> Pin<Box<dyn Future<Output = Result<Injection, SecretError>> + Send + 'a>> {
        Box::pin(async move { self.injection(handle, host, Some(rejected)).await })
    }
}
