//! The CLI as an API client: the service's addresses, the logins stored
//! per API address, and requests that say they come from the CLI.
//!
//! Logins live in `logins.json` in the per-user configuration directory
//! (`--config-dir`/`SERVICE_CONFIG_DIR`, else `$XDG_CONFIG_HOME/service`,
//! else `~/.config/service`), created `0700`, the file `0600`, replaced
//! atomically. `SERVICE_TOKEN` overrides a stored login (for automation).

use std::collections::BTreeMap;
use std::path::PathBuf;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use url::Url;

/// How a CLI command failed; each kind has its own exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliFailure {
    /// The service answered with an error (exit code 3).
    #[error("{code}: {message} (request {request_id})")]
    Api { code: String, message: String, request_id: String },
    /// The service could not be reached (exit code 4).
    #[error("cannot reach {address}: {reason}")]
    Network { address: String, reason: String },
    /// The command line asked for something impossible (exit code 2, as
    /// the parser's own usage errors).
    #[error("{0}")]
    Usage(String),
    /// A job waited for ended without succeeding (exit code 5).
    #[error("{0}")]
    JobDidNotSucceed(String),
    /// Anything else: a refused login, a missing token (exit code 1).
    #[error("{0}")]
    Other(String),
}

impl CliFailure {
    /// The process exit code of this failure (usage errors are clap's 2).
    pub fn exit_code(&self) -> u8 {
        match self {
            CliFailure::Api { .. } => 3,
            CliFailure::Network { .. } => 4,
            CliFailure::Usage(_) => 2,
            CliFailure::JobDidNotSucceed(_) => 5,
            CliFailure::Other(_) => 1,
        }
    }
}

/// The service's addresses, where logins are kept, and a token that
/// overrides them.
#[derive(Debug, Clone, clap::Args)]
pub struct Addresses {
    /// Where the service's pages are (sign-in, confirmations).
    #[arg(long, env = "SERVICE_APP_URL", default_value = "http://127.0.0.1:8080/", global = true)]
    pub app_url: Url,
    /// The API's base URL, ending in `/v1/` (default: the app URL's `v1/`).
    #[arg(long, env = "SERVICE_API_BASE_URL", global = true)]
    pub api_base_url: Option<Url>,
    /// Where logins are kept (default: `$XDG_CONFIG_HOME/service`, else
    /// `~/.config/service`).
    #[arg(long, env = "SERVICE_CONFIG_DIR", global = true)]
    pub config_dir: Option<PathBuf>,
    /// A token to use instead of the stored login (for automation).
    #[arg(long, env = "SERVICE_TOKEN", hide_env_values = true, global = true, value_parser = crate::config::secret)]
    pub token: Option<SecretString>,
}

impl Addresses {
    /// The app URL, ending in `/`.
    pub fn app(&self) -> Url {
        with_slash(self.app_url.clone())
    }

    /// The API base URL, ending in `/v1/`; a server root given instead
    /// (as `service mcp` once took it) gets its `v1/`.
    pub fn api(&self) -> Url {
        let base = match &self.api_base_url {
            Some(u) => with_slash(u.clone()),
            None => self.app(),
        };
        if base.path().ends_with("/v1/") { base } else { base.join("v1/").expect("a relative path joins") }
    }

    /// The server root the API base URL is under (its paths start `/v1`).
    pub fn root(&self) -> Url {
        self.api().join("../").expect("a relative path joins")
    }

    /// The token to call the API with: `SERVICE_TOKEN`, else the login
    /// stored for the API address.
    pub fn token(&self) -> Result<SecretString, CliFailure> {
        if let Some(t) = self.token.as_ref().filter(|t| !t.expose_secret().is_empty()) {
            return Ok(t.clone());
        }
        match stored_login(self)? {
            Some(l) => Ok(l.token.into()),
            None => Err(CliFailure::Other(format!(
                "not signed in to {}: run service auth login, or set SERVICE_TOKEN",
                self.api()
            ))),
        }
    }
}

fn with_slash(mut u: Url) -> Url {
    if !u.path().ends_with('/') {
        let path = format!("{}/", u.path());
        u.set_path(&path);
    }
    u
}

/// One stored login.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Login {
    pub token: String,
    pub email: String,
    pub session_id: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct LoginFile {
    #[serde(default)]
    logins: BTreeMap<String, Login>,
}

/// The per-user configuration directory.
fn config_dir(a: &Addresses) -> Result<PathBuf, CliFailure> {
    if let Some(d) = a.config_dir.as_ref().filter(|d| !d.as_os_str().is_empty()) {
        return Ok(d.clone());
    }
    if let Some(d) = std::env::var_os("XDG_CONFIG_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("service"));
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(h) => Ok(PathBuf::from(h).join(".config").join("service")),
        None => Err(CliFailure::Other("no configuration directory: set SERVICE_CONFIG_DIR or HOME".into())),
    }
}

fn read_logins(a: &Addresses) -> Result<LoginFile, CliFailure> {
    let path = config_dir(a)?.join("logins.json");
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            CliFailure::Other(format!("{}: not a login file ({e}); remove it and sign in again", path.display()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(LoginFile::default()),
        Err(e) => Err(CliFailure::Other(format!("{}: {e}", path.display()))),
    }
}

fn write_logins(a: &Addresses, file: &LoginFile) -> Result<(), CliFailure> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    let dir = config_dir(a)?;
    let io = |e: std::io::Error| CliFailure::Other(format!("{}: {e}", dir.display()));
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir).map_err(io)?;
    let tmp = dir.join(format!(".logins.json.{}", std::process::id()));
    let mut f =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).map_err(io)?;
    // A file left by an older version with wider rights is narrowed too.
    f.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    f.write_all(&serde_json::to_vec_pretty(file).expect("logins serialise")).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, dir.join("logins.json")).map_err(io)?;
    Ok(())
}

/// The login stored for the API address.
pub(crate) fn stored_login(a: &Addresses) -> Result<Option<Login>, CliFailure> {
    Ok(read_logins(a)?.logins.get(a.api().as_str()).cloned())
}

/// Stores (or, with `None`, forgets) the login of the API address.
pub(crate) fn store_login(a: &Addresses, login: Option<Login>) -> Result<(), CliFailure> {
    let mut file = read_logins(a)?;
    match login {
        Some(l) => file.logins.insert(a.api().to_string(), l),
        None => file.logins.remove(a.api().as_str()),
    };
    write_logins(a, &file)
}

/// A client of one API address with one token.
pub(crate) struct ApiClient {
    http: reqwest::Client,
    api: Url,
    token: SecretString,
    /// Sent as `X-Service-Workspace` when set.
    workspace: Option<String>,
    /// Asks for writes to be stored as proposals.
    propose: bool,
}

/// A success: its status and its `data`.
#[derive(Debug)]
pub(crate) struct Answer {
    pub status: reqwest::StatusCode,
    pub data: Value,
}

impl Answer {
    /// The approval a write became instead of running (a 202 proposal).
    pub(crate) fn proposal(&self) -> Option<&Value> {
        (self.status == reqwest::StatusCode::ACCEPTED).then(|| self.data.get("approval")).flatten()
    }
}

impl ApiClient {
    pub(crate) fn new(api: Url, token: SecretString) -> ApiClient {
        ApiClient { http: http(), api, token, workspace: None, propose: false }
    }

    /// The client of the API address with `SERVICE_TOKEN`, else the
    /// stored login.
    pub(crate) fn signed_in(addresses: &Addresses) -> Result<ApiClient, CliFailure> {
        Ok(ApiClient::new(addresses.api(), addresses.token()?))
    }

    /// Addresses `workspace` (else the caller's default workspace).
    pub(crate) fn in_workspace(mut self, workspace: Option<String>) -> ApiClient {
        self.workspace = workspace.filter(|w| !w.is_empty());
        self
    }

    /// Asks the service to store writes as proposals for someone to approve.
    pub(crate) fn proposing(mut self, propose: bool) -> ApiClient {
        self.propose = propose;
        self
    }

    /// `method` on `path` (relative to the API base, no leading `/`), with
    /// an optional JSON body; the answer's `data`.
    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, CliFailure> {
        Ok(self.send(method, path, &[], body).await?.data)
    }

    /// Opens `path`'s Server-Sent Events stream: the response, its body
    /// still to be read; an error answer as the failure it says.
    pub(crate) async fn events(&self, path: &str) -> Result<reqwest::Response, CliFailure> {
        let url = self.api.join(path).map_err(|e| CliFailure::Other(format!("{path}: {e}")))?;
        let mut req = self
            .http
            .get(url)
            .bearer_auth(self.token.expose_secret())
            .header("x-service-client", "cli")
            .header("accept", "text/event-stream");
        if let Some(w) = &self.workspace {
            req = req.header("x-service-workspace", w);
        }
        let res = req.send().await.map_err(|e| network(&self.api, &e))?;
        if res.status().is_success() {
            Ok(res)
        } else {
            Err(answer(res).await.err().unwrap_or_else(|| CliFailure::Other(format!("{path}: no event stream"))))
        }
    }

    /// `method` on `path` with query parameters and an optional JSON body.
    pub(crate) async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Answer, CliFailure> {
        let mut url = self.api.join(path).map_err(|e| CliFailure::Other(format!("{path}: {e}")))?;
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
        }
        let mut req =
            self.http.request(method, url).bearer_auth(self.token.expose_secret()).header("x-service-client", "cli");
        if let Some(w) = &self.workspace {
            req = req.header("x-service-workspace", w);
        }
        if self.propose {
            req = req.header("x-service-execution-mode", "proposal");
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let res = req.send().await.map_err(|e| network(&self.api, &e))?;
        let status = res.status();
        Ok(Answer { status, data: answer(res).await? })
    }
}

/// The HTTP client of the CLI.
pub(crate) fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .user_agent(concat!("service-cli/", env!("CARGO_PKG_VERSION")))
        .build()
        .expect("an HTTP client builds")
}

pub(crate) fn network(address: &Url, e: &reqwest::Error) -> CliFailure {
    // The innermost cause says what happened (connection refused, a
    // certificate, a timeout); the outer ones only repeat the address.
    let mut cause: &dyn std::error::Error = e;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    let reason = if e.is_timeout() { "timed out".to_owned() } else { cause.to_string() };
    CliFailure::Network { address: address.to_string(), reason }
}

/// The `data` of a success, or the error shape as a failure.
pub(crate) async fn answer(res: reqwest::Response) -> Result<Value, CliFailure> {
    let status = res.status();
    let body: Value = res.json().await.unwrap_or(Value::Null);
    if status.is_success() {
        return Ok(body.get("data").cloned().unwrap_or(body));
    }
    let text = |k: &str| body.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    Err(CliFailure::Api {
        code: if text("code").is_empty() { status.as_u16().to_string() } else { text("code") },
        message: if text("message").is_empty() { status.to_string() } else { text("message") },
        request_id: if text("request_id").is_empty() { "unknown".into() } else { text("request_id") },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addresses(app: &str, api: Option<&str>) -> Addresses {
        Addresses {
            app_url: Url::parse(app).unwrap(),
            api_base_url: api.map(|a| Url::parse(a).unwrap()),
            config_dir: None,
            token: None,
        }
    }

    #[test]
    fn the_api_address_ends_in_v1_whichever_form_it_is_given_in() {
        let a = addresses("http://127.0.0.1:8080", None);
        assert_eq!(
            (a.app().as_str(), a.api().as_str(), a.root().as_str()),
            ("http://127.0.0.1:8080/", "http://127.0.0.1:8080/v1/", "http://127.0.0.1:8080/")
        );
        let a = addresses("https://app.example.com/", Some("https://api.example.com/prefix/v1"));
        assert_eq!(
            (a.api().as_str(), a.root().as_str()),
            ("https://api.example.com/prefix/v1/", "https://api.example.com/prefix/")
        );
        let a = addresses("https://app.example.com/", Some("https://api.example.com/"));
        assert_eq!(a.api().as_str(), "https://api.example.com/v1/", "a server root gets its v1/");
    }
}
