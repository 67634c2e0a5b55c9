//! `service plugins new|record|test|conform`: the connector author's
//! commands.
//! They need no database and no running server.
//!
//! Exit codes follow the CLI's: 0 done (every cassette passed); 1 a
//! cassette did not pass, or a recording failed; 2 the input cannot be
//! used (a malformed or foreign cassette, a config the plugin's schema
//! refuses, a component that does not validate, a missing file).

use std::io::{BufRead, IsTerminal};
use std::path::{Path, PathBuf};

use secrecy::SecretString;

use super::client::CliFailure;
use crate::authoring::{
    self, AuthoringError, Component, EgressSettings, RecordPlacement, RecordRequest, TestReport, TestRequest,
};
use crate::egress::Placement;

/// Arguments of `service plugins record`.
#[derive(Debug, clap::Args)]
pub struct RecordArgs {
    /// The plugin's component (`.wasm`), or `bundled:STEM` for one of the
    /// server's bundled plugins (`bundled:conn_restmanifest` records a
    /// manifest source).
    #[arg(long)]
    pub component: String,
    /// The config every call gets: a JSON object matching the plugin's
    /// config schema, with credential handles, never secrets.
    #[arg(long)]
    pub config: PathBuf,
    /// The cassette folder to write (created or replaced).
    #[arg(long)]
    pub out: PathBuf,
    /// Read only these streams (default: every stream discover returns).
    #[arg(long, value_delimiter = ',')]
    pub streams: Option<Vec<String>>,
    /// A JSON object of stream → state to start incremental reads from.
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// Records a read may emit before it is stopped, per stream.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub record_limit: u64,
    /// Where the host puts the secret: `bearer`, `header:NAME`,
    /// `basic:USER`, `query:NAME` or `body:FIELD`, or `@FILE`: a JSON
    /// file with a `signing` recipe or an `exchange` (the secret traded
    /// for a token first), as `POST /v1/credentials` takes them (on a
    /// server the credential decides). The secret itself comes from
    /// SERVICE_RECORD_SECRET, standard input, or a prompt that does not
    /// echo.
    #[arg(long, default_value = "bearer", value_parser = parse_placement)]
    pub placement: RecordPlacement,
    /// Hosts the plugin may reach (default: the hosts it declares).
    #[arg(long, env = "SERVICE_EGRESS_ALLOWED_HOSTS")]
    pub allowed_hosts: Option<String>,
    /// Pins host names to addresses, like curl's --resolve (staging).
    #[arg(long, env = "SERVICE_EGRESS_RESOLVE")]
    pub egress_resolve: Option<String>,
    /// PEM file of extra trusted root certificates (staging, private CAs).
    #[arg(long, env = "SERVICE_EGRESS_EXTRA_ROOTS")]
    pub egress_extra_roots: Option<PathBuf>,
    /// The hosts the secret may be sent to, comma-separated names or
    /// `*.suffix` patterns, as a server's credential is bound (default:
    /// the host of the config's `base_url` and the exact names the plugin
    /// declares).
    #[arg(long, env = "SERVICE_RECORD_SECRET_HOSTS")]
    pub secret_hosts: Option<String>,
    /// Keep a recording in which a call failed (a provider that was
    /// down, say) and exit 0; without it such a recording exits 1.
    #[arg(long)]
    pub accept_failures: bool,
    /// The instant (RFC 3339) the plugin's wall clock stands at while it
    /// is recorded and replayed (default: when the recording starts).
    #[arg(long)]
    pub clock: Option<String>,
}

/// Arguments of `service plugins conform`.
#[derive(Debug, clap::Args)]
pub struct ConformArgs {
    /// A cassette folder, or a folder of cassette folders.
    pub dir: PathBuf,
    /// The component to check, a file or `bundled:STEM` (default: the one
    /// the cassette was recorded with).
    #[arg(long)]
    pub component: Option<String>,
}

/// Arguments of `service plugins test`.
#[derive(Debug, clap::Args)]
pub struct TestArgs {
    /// A cassette folder, or a folder of cassette folders.
    pub dir: PathBuf,
    /// The component to test, a file or `bundled:STEM` (default: the one
    /// the cassette was recorded with).
    #[arg(long)]
    pub component: Option<String>,
    /// Rewrite the expected records, checkpoints and answers with what the
    /// replay returns (after a deliberate change; review the diff).
    #[arg(long)]
    pub update: bool,
    /// Accept the schema disagreements the replay finds, in the cassette's
    /// `cassette.json`.
    #[arg(long)]
    pub accept_schema: bool,
}

fn parse_placement(text: &str) -> Result<RecordPlacement, String> {
    if let Some(file) = text.strip_prefix('@') {
        return recipe(Path::new(file));
    }
    match authoring::cassette::parse_placement(text) {
        // What a plugin asks for, not a place: a recording needs one.
        Some(Placement::AsStored) | None => {
            Err("must be bearer, header:NAME, basic:USER, query:NAME, body:FIELD or @FILE (a recipe)".into())
        }
        Some(p) => Ok(RecordPlacement::Placed(p)),
    }
}

/// A recipe file: `{"signing": {…}}` or `{"exchange": {…}}`, as a
/// credential is stored with.
fn recipe(file: &Path) -> Result<RecordPlacement, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", file.display()))?;
    match value.as_object().map(|o| (o.len(), o.get("signing"), o.get("exchange"))) {
        Some((1, Some(signing), None)) => {
            let signing: crate::egress::signing::Signing = serde_json::from_value(signing.clone())
                .map_err(|e| format!("{}: not a signing recipe: {e}", file.display()))?;
            signing.check().map_err(|m| format!("{}: {m}", file.display()))?;
            Ok(RecordPlacement::Placed(Placement::Signed(signing)))
        }
        Some((1, None, Some(exchange))) => {
            let exchange: crate::credentials::exchange::TokenExchange = serde_json::from_value(exchange.clone())
                .map_err(|e| format!("{}: not a token exchange: {e}", file.display()))?;
            // A recording holds one secret; the refresh-token grant
            // needs a refresh token beside it.
            if exchange.refreshes() {
                return Err(format!(
                    "{}: the refresh_token grant cannot be recorded (a recording holds one secret, the grant two)",
                    file.display()
                ));
            }
            Ok(RecordPlacement::Traded(exchange))
        }
        _ => Err(format!("{}: must be an object with one key, signing or exchange", file.display())),
    }
}

/// A failure of the author's commands, with its exit code.
fn failure(e: AuthoringError) -> CliFailure {
    match e {
        AuthoringError::Run(_) | AuthoringError::Runtime(_) | AuthoringError::SecretInRecording(_) => {
            CliFailure::Other(e.to_string())
        }
        _ => CliFailure::Usage(e.to_string()),
    }
}

/// `service plugins new NAME [--dir DIR]`.
pub(crate) fn new(name: &str, dir: Option<&Path>) -> Result<(), CliFailure> {
    let dir = dir.map(Path::to_owned).unwrap_or_else(|| PathBuf::from(name));
    let made = authoring::scaffold::new_plugin(name, &dir).map_err(|e| CliFailure::Usage(e.to_string()))?;
    println!("created {} ({}) in {}", name, made.connector_id, made.dir.display());
    println!();
    println!("  cd {}", made.dir.display());
    println!("  cargo build");
    println!("  service plugins validate {}", made.component.display());
    println!(
        "  service plugins record --component {} --config config.example.json --out cassettes/posts",
        made.component.display()
    );
    println!("  service plugins test cassettes");
    println!("  service plugins conform cassettes");
    Ok(())
}

/// `service plugins record`.
pub(crate) async fn record(args: RecordArgs, bundled: &[(&'static str, &'static [u8])]) -> Result<(), CliFailure> {
    let extra_roots_pem = match &args.egress_extra_roots {
        Some(path) => Some(
            std::fs::read(path)
                .map_err(|e| CliFailure::Usage(format!("SERVICE_EGRESS_EXTRA_ROOTS: {}: {e}", path.display())))?,
        ),
        None => None,
    };
    let request = RecordRequest {
        component: Component::named(&args.component, bundled).map_err(failure)?,
        config: &args.config,
        out: &args.out,
        streams: args.streams.clone(),
        state: args.state.as_deref(),
        record_limit: args.record_limit,
        placement: args.placement.clone(),
        egress: EgressSettings {
            allowed_hosts: args.allowed_hosts.clone(),
            resolve: args.egress_resolve.clone(),
            extra_roots_pem,
            secret_hosts: args.secret_hosts.clone(),
        },
        clock: args.clock.as_deref(),
    };
    let mut progress = |call: &str| eprintln!("  {call}");
    let summary = authoring::record(&request, &mut read_secret, &mut progress).await.map_err(failure)?;
    let c = &summary.connector;
    println!("recorded {} {} ({}) into {}", c.id, c.version, c.interface, args.out.display());
    println!("  {} exchange(s)", summary.exchanges);
    for (stream, (records, checkpoints, end)) in &summary.streams {
        let end = end.as_str().map(str::to_owned).unwrap_or_else(|| "failed".into());
        println!("  stream {stream}: {records} record(s), {checkpoints} checkpoint(s), {end}");
    }
    for (file, message) in &summary.failed_calls {
        println!("  {file}: the call failed: {message}");
    }
    for d in &summary.disagreements {
        println!("  schema: {d}");
    }
    if !summary.disagreements.is_empty() {
        println!(
            "  `service plugins test` fails on these until the declared schema agrees or the cassette accepts them (--accept-schema)"
        );
    }
    // A recording of failure is no green test: it says so unless the
    // author keeps it on purpose.
    let failed_streams = summary.streams.values().filter(|(_, _, end)| end.as_str().is_none()).count();
    if (failed_streams > 0 || !summary.failed_calls.is_empty()) && !args.accept_failures {
        return Err(CliFailure::Other(format!(
            "the recording holds {} failed call(s) and {failed_streams} failed stream(s), listed above; fix the provider or the config and record again, or pass --accept-failures to keep it",
            summary.failed_calls.len()
        )));
    }
    Ok(())
}

/// The recording's secret: `SERVICE_RECORD_SECRET`, else a prompt that
/// does not echo on a terminal, else the first line of standard input.
fn read_secret() -> Option<SecretString> {
    if let Ok(secret) = std::env::var("SERVICE_RECORD_SECRET") {
        return Some(secret.into());
    }
    if std::io::stdin().is_terminal() {
        return rpassword::prompt_password("secret for the config's credential handle (not shown): ")
            .ok()
            .map(Into::into);
    }
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).ok()?;
    let secret = line.trim_end_matches(['\n', '\r']).to_owned();
    Some(secret.into())
}

/// `service plugins test DIR`: every cassette under `dir`.
pub(crate) async fn test(args: TestArgs, bundled: &[(&'static str, &'static [u8])]) -> Result<(), CliFailure> {
    let cassettes = cassettes_in(&args.dir)?;
    let component = component_arg(args.component.as_deref(), bundled)?;
    let mut failed = 0;
    for dir in &cassettes {
        let request = TestRequest { dir, component, bundled, update: args.update, accept_schema: args.accept_schema };
        let started = std::time::Instant::now();
        let report = authoring::test(&request, &mut |_| {}).await.map_err(failure)?;
        if !report.offline {
            return Err(CliFailure::Other("the replay had network access; refusing to trust it".into()));
        }
        print_report(dir, &report, started.elapsed());
        if !report.passed() {
            failed += 1;
        }
    }
    if failed > 0 {
        return Err(CliFailure::Other(format!("{failed} of {} cassette(s) failed", cassettes.len())));
    }
    Ok(())
}

/// `service plugins conform DIR`: the conformance suite over every
/// cassette under `dir`.
pub(crate) async fn conform(args: ConformArgs, bundled: &[(&'static str, &'static [u8])]) -> Result<(), CliFailure> {
    let cassettes = cassettes_in(&args.dir)?;
    let component = component_arg(args.component.as_deref(), bundled)?;
    let mut failed = 0;
    for dir in &cassettes {
        let request = authoring::ConformRequest { dir, component, bundled };
        let started = std::time::Instant::now();
        let report = authoring::conform(&request, &mut |_| {}).await.map_err(failure)?;
        let c = &report.connector;
        let verdict = if report.passed() { "ok" } else { "FAILED" };
        println!(
            "{verdict}  {} ({} {}, {}) in {:.2} s, offline, {} checkpoint(s) crashed",
            dir.display(),
            c.id,
            c.version,
            report.component,
            started.elapsed().as_secs_f64(),
            report.crashes
        );
        for check in &report.checks {
            let mark = match check.verdict {
                authoring::conform::Verdict::Passed => "ok  ",
                authoring::conform::Verdict::Failed => "FAIL",
                authoring::conform::Verdict::NotApplicable => "n/a ",
            };
            let mut lines = check.lines.iter();
            println!("  {mark} {:<24} {}", check.name, lines.next().map(String::as_str).unwrap_or(""));
            for line in lines {
                println!("         {line}");
            }
        }
        if !report.passed() {
            failed += 1;
        }
    }
    if failed > 0 {
        return Err(CliFailure::Other(format!(
            "{failed} of {} cassette(s) failed the conformance suite",
            cassettes.len()
        )));
    }
    Ok(())
}

/// The `--component` of `test` and `conform`, when given.
fn component_arg<'a>(
    named: Option<&'a str>,
    bundled: &[(&'static str, &'static [u8])],
) -> Result<Option<Component<'a>>, CliFailure> {
    named.map(|n| Component::named(n, bundled)).transpose().map_err(failure)
}

/// `dir` itself when it is a cassette, else the cassettes directly in it.
fn cassettes_in(dir: &Path) -> Result<Vec<PathBuf>, CliFailure> {
    if dir.join(authoring::cassette::MANIFEST).is_file() {
        return Ok(vec![dir.to_owned()]);
    }
    let entries = std::fs::read_dir(dir).map_err(|e| CliFailure::Usage(format!("{}: {e}", dir.display())))?;
    let mut found: Vec<PathBuf> =
        entries.flatten().map(|e| e.path()).filter(|p| p.join(authoring::cassette::MANIFEST).is_file()).collect();
    found.sort();
    if found.is_empty() {
        return Err(CliFailure::Usage(format!(
            "{}: no cassette here (a folder with {}) nor in its folders",
            dir.display(),
            authoring::cassette::MANIFEST
        )));
    }
    Ok(found)
}

fn print_report(dir: &Path, report: &TestReport, took: std::time::Duration) {
    let c = &report.connector;
    let verdict = if report.passed() { "ok" } else { "FAILED" };
    println!(
        "{verdict}  {} ({} {}, {}) in {:.2} s, offline",
        dir.display(),
        c.id,
        c.version,
        report.component,
        took.as_secs_f64()
    );
    for miss in &report.misses {
        println!("  {miss}");
    }
    for difference in &report.differences {
        println!("  {} differs (- recorded, + replayed):", difference.file);
        print!("{}", difference.diff);
    }
    for d in &report.disagreements {
        println!("  schema: {d}");
    }
    if !report.disagreements.is_empty() {
        println!("  declare these in the stream's schema, or accept them in cassette.json (--accept-schema)");
    }
    for (n, request) in &report.unused {
        println!("  note: recorded exchange {n} ({request}) was not requested again");
    }
    for a in &report.stale_acceptances {
        println!("  note: accepted {:?} of {} in stream {} no longer occurs", a.disagreement, a.field, a.stream);
    }
    if report.updated {
        println!("  expectations rewritten; review them with a diff before committing");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_and_recipe_files_are_read_or_refused_by_name() {
        assert!(matches!(parse_placement("query:api_key"), Ok(RecordPlacement::Placed(Placement::Query(_)))));
        assert!(parse_placement("as-stored").unwrap_err().contains("@FILE"));
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            format!("@{}", path.display())
        };
        let signing = write(
            "signing.json",
            r#"{"signing": {"algorithm": "hmac-sha256", "header": "X-Signature", "parts": ["method", "path"]}}"#,
        );
        assert!(matches!(parse_placement(&signing), Ok(RecordPlacement::Placed(Placement::Signed(_)))));
        let exchange = write(
            "exchange.json",
            r#"{"exchange": {"grant": "client_credentials", "token_url": "https://api.example.com/token", "client_id": "app"}}"#,
        );
        assert!(matches!(parse_placement(&exchange), Ok(RecordPlacement::Traded(_))));
        for (name, text, says) in [
            ("both.json", r#"{"signing": {}, "exchange": {}}"#, "one key, signing or exchange"),
            ("list.json", "[1]", "one key, signing or exchange"),
            ("broken.json", "{", "not JSON"),
            ("grant.json", r#"{"exchange": {"grant": "password"}}"#, "not a token exchange"),
            (
                "refresh.json",
                r#"{"exchange": {"grant": "refresh_token", "token_url": "https://api.example.com/token", "client_id": "app"}}"#,
                "cannot be recorded",
            ),
            (
                "reserved.json",
                r#"{"signing": {"algorithm": "hmac-sha256", "header": "Host", "parts": ["method"]}}"#,
                "Host",
            ),
        ] {
            let refused = parse_placement(&write(name, text)).unwrap_err();
            assert!(refused.contains(name) && refused.contains(says), "{name}: {refused}");
        }
        assert!(parse_placement("@/nonexistent/recipe.json").unwrap_err().contains("/nonexistent/recipe.json"));
    }
}
