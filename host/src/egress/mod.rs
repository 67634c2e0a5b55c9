//! Egress: every outbound request a connector makes, performed and policed
//! by the host.
//!
//! A request leaves only when all of these hold (each refusal names its rule
//! to the plugin and to the operator's log):
//!
//! 1. The URL is `https`, on port 443, without user-info, and names a host
//!    (IP-literal URLs are refused: they would bypass name-based policy).
//! 2. The host matches a pattern the plugin declared *and* a pattern of the
//!    operator's policy ([`EgressPolicy`], parsed in `config::egress`).
//! 3. The plugin sets none of `Authorization`, `Proxy-Authorization`,
//!    `Cookie`, `Host`: credentials are the host's to attach.
//! 4. The name resolves (by the host, here) only to globally routable
//!    addresses ([`address`]), unless the operator pinned the name to an
//!    address; the connection goes to exactly the checked addresses, so a
//!    second DNS answer cannot rebind it.
//! 5. A credential handle, if named, belongs to the invocation's workspace
//!    and is bound to the target host; its secret is injected into this
//!    request only, and scrubbed from the response before the plugin sees it.
//!
//! Redirects are never followed blindly: each `Location` goes through the
//! same checks, and a credential survives a redirect only to the same host.
//!
//! A request that carries a credential asks for an uncompressed answer
//! (the plugin's `Accept-Encoding`, `TE` and `Range` are dropped); one
//! that comes compressed anyway is decoded ([`coding`]) before the secret
//! is scrubbed from it, and its length is the scrubbed body's.
//!
//! An egress can also work for a connector's author ([`tape`]): one that
//! records hands every request, as the plugin made it (handle, never
//! secret), and the answer as the plugin got it (scrubbed) to a
//! [`Recorder`]; one that replays answers each request from a recording
//! and has no HTTP client at all, so it cannot open a socket. A replay
//! may also inject ([`Egress::injecting`]): each answer to a request that
//! names a credential is decoded and scrubbed as a live one would be, so
//! echoes of a canary secret planted in it can be looked for afterwards.
//!
//! Layout: this module (the policy's enforcement and the live exchange),
//! [`address`] (which addresses are global), [`budget`] (rate budgets
//! shared by every server, a turn taken before a request leaves), [`coding`] (content codings
//! undone before scrubbing), [`origin`] (where a URL goes, read as the
//! connectors' SDK reads it: the shared `service-connector-rules` crate),
//! [`inject`] (a secret into a query parameter or a body field of the
//! request sent), [`signing`] (a signature of the request sent, computed
//! with a secret that is itself sent nowhere), [`sigv4`] (AWS Signature
//! Version 4, for object stores and AWS Secrets Manager), [`reach`] (where the host may connect for a tenant: the one address
//! policy and pinned client of every reach, providers, receivers and
//! warehouses), [`receiver`] (the URL of a receiver the host posts to for
//! a workspace), [`tape`] (recording and replay).

pub(crate) mod address;
pub(crate) mod budget;
pub(crate) mod coding;
pub(crate) mod inject;
pub(crate) mod reach;
pub(crate) mod receiver;
pub mod signing;
pub(crate) mod sigv4;
pub(crate) mod tape;

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use url::{Host, Url};

// The SDK's reading of a URL's origin, so the host and its connectors read
// every URL one way.
pub(crate) use connector_rules::origin;

pub use crate::config::egress::{EgressPolicy, HostPattern};
pub(crate) use crate::store::credentials::CredentialHandle;
pub use reach::Reach;
use reach::{PinnedClient, Rules, Unreachable};
pub(crate) use tape::{Recorder, Replay};

/// HTTP method of an outbound request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Patch,
    Delete,
    Options,
}

impl Method {
    /// The method's name, as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
            Method::Options => "OPTIONS",
        }
    }

    /// The method named `name` (upper case, as on the wire).
    pub fn parse(name: &str) -> Option<Method> {
        [Method::Get, Method::Head, Method::Post, Method::Put, Method::Patch, Method::Delete, Method::Options]
            .into_iter()
            .find(|m| m.as_str() == name)
    }

    fn as_reqwest(self) -> reqwest::Method {
        match self {
            Method::Get => reqwest::Method::GET,
            Method::Head => reqwest::Method::HEAD,
            Method::Post => reqwest::Method::POST,
            Method::Put => reqwest::Method::PUT,
            Method::Patch => reqwest::Method::PATCH,
            Method::Delete => reqwest::Method::DELETE,
            Method::Options => reqwest::Method::OPTIONS,
        }
    }
}

/// Where the host puts a credential's secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// `Authorization: Bearer <secret>`.
    Bearer,
    /// The secret as the whole value of this header.
    Header(String),
    /// HTTP Basic with this username and the secret as password.
    BasicPassword(String),
    /// HTTP Basic with the secret as username and this (non-secret)
    /// password: an API that takes its key as the username.
    BasicUsername(String),
    /// HTTP Basic with the secret as both the username and the password.
    BasicBoth,
    /// HTTP Basic whose secret is the whole pair, `username:password`
    /// (RFC 7617's user-pass): an API whose username is a secret too.
    BasicPair,
    /// The secret between a fixed prefix and suffix as the value of this
    /// header (`Authorization: Token token="<secret>"`).
    HeaderAround { header: String, prefix: String, suffix: String },
    /// The secret as the value of this query parameter of the URL sent.
    Query(String),
    /// The secret as the value of this field of a JSON or form body (a
    /// top-level key, or a JSON pointer starting with `/`).
    BodyField(String),
    /// The secret in the URL's path, where the plugin's URL holds
    /// `connector_rules::path::CREDENTIAL_MARKER`.
    Path,
    /// No secret in the request: a signature of it, by this recipe.
    Signed(signing::Signing),
    /// What a plugin asks for when the credential's record is to decide
    /// (never a credential's own placement).
    AsStored,
}

impl Placement {
    /// Whether two placements put the secret in the same place (header
    /// names compare case-insensitively).
    pub(crate) fn same_as(&self, other: &Placement) -> bool {
        match (self, other) {
            (Placement::AsStored, _) | (_, Placement::AsStored) => true,
            (Placement::Signed(a), Placement::Signed(b)) => a == b,
            (Placement::Bearer, Placement::Bearer)
            | (Placement::Path, Placement::Path)
            | (Placement::BasicBoth, Placement::BasicBoth)
            | (Placement::BasicPair, Placement::BasicPair) => true,
            (Placement::Header(a), Placement::Header(b)) => a.eq_ignore_ascii_case(b),
            (Placement::BasicPassword(a), Placement::BasicPassword(b))
            | (Placement::BasicUsername(a), Placement::BasicUsername(b))
            | (Placement::Query(a), Placement::Query(b))
            | (Placement::BodyField(a), Placement::BodyField(b)) => a == b,
            (
                Placement::HeaderAround { header: a, prefix: ap, suffix: asx },
                Placement::HeaderAround { header: b, prefix: bp, suffix: bsx },
            ) => a.eq_ignore_ascii_case(b) && ap == bp && asx == bsx,
            _ => false,
        }
    }

    /// Where it puts the secret, in words (no secret involved).
    pub fn describe(&self) -> String {
        match self {
            Placement::Bearer => "as a bearer token".into(),
            Placement::Header(name) => format!("in header {name}"),
            Placement::BasicPassword(user) => format!("as the Basic password of {user}"),
            Placement::BasicUsername(_) => "as the Basic username".into(),
            Placement::BasicBoth => "as the Basic username and password".into(),
            Placement::BasicPair => "as the Basic username:password pair".into(),
            Placement::HeaderAround { header, prefix, suffix } => {
                format!("in header {header} as {prefix}<secret>{suffix}")
            }
            Placement::Query(name) => format!("in query parameter {name}"),
            Placement::BodyField(field) => format!("in body field {field}"),
            Placement::Path => "in the URL's path".into(),
            Placement::Signed(signing) => format!("as a signature in header {}", signing.header),
            Placement::AsStored => "wherever the credential says".into(),
        }
    }
}

impl Placement {
    /// The parts of a request the secret takes: a header (lower case), a
    /// query parameter, a body field, or the signature's. Two credentials
    /// of one request may not share one.
    fn parts(&self) -> Vec<Part> {
        match self {
            Placement::Bearer
            | Placement::BasicPassword(_)
            | Placement::BasicUsername(_)
            | Placement::BasicBoth
            | Placement::BasicPair => vec![Part::Header("authorization".into())],
            Placement::Header(name) | Placement::HeaderAround { header: name, .. } => {
                vec![Part::Header(name.to_ascii_lowercase())]
            }
            // Servers read a parameter's name in any case (the host
            // refuses other spellings of a query credential's name too).
            Placement::Query(name) => vec![Part::Query(name.to_ascii_lowercase())],
            Placement::BodyField(field) => vec![Part::Body(body_path(field))],
            Placement::Path => vec![Part::Path],
            Placement::Signed(recipe) => std::iter::once(Part::Signature)
                .chain(recipe.header_names().map(|h| Part::Header(h.to_ascii_lowercase())))
                .collect(),
            Placement::AsStored => Vec::new(),
        }
    }
}

/// A part of a request a secret goes into.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Header(String),
    Query(String),
    /// A body field by the keys leading to it.
    Body(Vec<String>),
    /// The URL's path (one marker: one credential).
    Path,
    Signature,
}

impl Part {
    /// Whether a secret in one would be lost to, or written over by, one
    /// in the other: the same part, or a body field inside the other.
    fn overlaps(&self, other: &Part) -> bool {
        match (self, other) {
            (Part::Body(a), Part::Body(b)) => a.starts_with(b) || b.starts_with(a),
            _ => self == other,
        }
    }
}

/// The keys leading to a body field: a top-level key as it is, a JSON
/// pointer (`/auth/key`) by its decoded segments.
fn body_path(field: &str) -> Vec<String> {
    match field.strip_prefix('/') {
        Some(pointer) => pointer.split('/').map(|s| s.replace("~1", "/").replace("~0", "~")).collect(),
        None => vec![field.to_owned()],
    }
}

/// Refuses a credential asked for in another place than its record fixes.
fn placed_as_stored(asked: &CredentialUse, injection: &Injection) -> Result<(), EgressError> {
    if asked.placement.same_as(&injection.placement) {
        return Ok(());
    }
    Err(EgressError::Denied(format!(
        "the credential is sent {}, not {}: its kind fixes where the secret goes",
        injection.placement.describe(),
        asked.placement.describe()
    )))
}

/// The credentials of one request each in a part of its own: two secrets
/// in one header, parameter or field would leave one of them unsent, or
/// joined to the other in a way neither credential was stored for.
fn apart(injections: &[Injection]) -> Result<(), EgressError> {
    let mut taken: Vec<Part> = Vec::new();
    for i in injections {
        for part in i.placement.parts() {
            if taken.iter().any(|t| t.overlaps(&part)) {
                return Err(EgressError::InvalidRequest(format!(
                    "two credentials of the request go {}: each needs a place of its own",
                    i.placement.describe()
                )));
            }
            taken.push(part);
        }
    }
    Ok(())
}

/// A credential a request asks the host to attach.
#[derive(Debug, Clone)]
pub struct CredentialUse {
    pub handle: CredentialHandle,
    pub placement: Placement,
}

/// The most credentials one request may name.
pub const MAX_CREDENTIALS: usize = 8;

/// An outbound request as a plugin describes it.
#[derive(Debug, Clone)]
pub struct OutboundRequest {
    pub method: Method,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
    /// The credentials the host attaches, each in its place (at most
    /// [`MAX_CREDENTIALS`], no handle twice).
    pub credentials: Vec<CredentialUse>,
    pub timeout_ms: Option<u32>,
}

/// The provider's answer, as handed to the plugin.
#[derive(Debug, Clone)]
pub struct InboundResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Why no response could be produced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    #[error("egress denied: {0}")]
    Denied(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("timed out")]
    Timeout,
    #[error("connection failed: {0}")]
    ConnectionFailed(String),
    #[error("response too large")]
    ResponseTooLarge,
    #[error("credential unavailable: {0}")]
    CredentialUnavailable(String),
}

/// A credential's secret and where it goes, as its record says.
#[derive(Clone)]
pub struct Injection {
    pub secret: SecretString,
    /// Whether the host can renew the secret (an OAuth access token) when
    /// the provider says it expired.
    pub renewable: bool,
    /// Whether any 401 renews it (a token the host traded for: a session
    /// or client-credentials token, obtained again), not only an answer
    /// that says the token expired.
    pub any_401_renews: bool,
    /// Fixed by the credential (its kind, username or header), never by
    /// the plugin: a plugin that asks for another place is refused, so it
    /// cannot route the secret into a header or a username it controls.
    pub placement: Placement,
}

/// Why a credential cannot go on a request. Each reason is safe to show
/// (none holds the secret); only an unreachable store may pass by itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("unknown credential handle")]
    Unknown,
    /// Revoked, waiting for approval, needing re-authorisation.
    #[error("credential is {0}")]
    NotActive(String),
    #[error("credential is not bound to host {0}")]
    NotBound(String),
    #[error("the credential belongs to connector {0}")]
    OtherConnector(String),
    /// The credential's kind needs something it lacks (a username, a
    /// header name).
    #[error("{0}")]
    Incomplete(&'static str),
    /// It does not open under any key of the keyring, or is malformed.
    #[error("credential cannot be opened")]
    Unopenable,
    #[error("the provider says the credential expired and it cannot be renewed; store a new one")]
    NotRenewable,
    #[error("the access token expired and cannot be refreshed; authorise again")]
    CannotRefresh,
    #[error("the credential needs re-authorisation")]
    NeedsReauthorization,
    #[error("credential store unavailable")]
    StoreUnavailable,
    /// The operator's secret store the credential names cannot be reached
    /// (its kind: `vault`, `file`).
    #[error("secret store {0} unavailable")]
    SecretStoreUnavailable(&'static str),
    /// The credential's reference names nothing usable (a path that does
    /// not exist, a store not configured); the reference, never a value.
    #[error("secret reference: {0}")]
    Reference(String),
    /// The token endpoint of a credential traded for a token refused it
    /// or could not be reached; the reason, never the secret.
    #[error("token exchange: {0}")]
    Exchange(String),
    /// Asked to renew a value the provider refused, the store holds that
    /// same value: nothing newer to send, and the provider's answer
    /// stands.
    #[error("the secret store holds the value the provider refused")]
    Unchanged,
}

impl crate::retry::Transient for SecretError {
    /// Whether asking again later may succeed.
    fn is_transient(&self) -> bool {
        matches!(self, SecretError::StoreUnavailable | SecretError::SecretStoreUnavailable(_))
    }
}

/// Resolves credential handles to secrets for one workspace, one connector
/// and one host. Implemented by the credential vault; the egress layer only
/// asks.
pub trait SecretSource: Send + Sync {
    /// The secret behind `handle`, if the credential belongs to
    /// `workspace_id`, may be used by `connector_id` and is bound to
    /// `host`.
    fn secret_for<'a>(
        &'a self,
        workspace_id: &'a str,
        connector_id: &'a str,
        handle: &'a CredentialHandle,
        host: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Injection, SecretError>> + Send + 'a>>;

    /// A new secret for `handle` after the provider answered that
    /// `rejected`, the one just sent, has expired. An OAuth access token is
    /// refreshed (unless another request already replaced it); a secret of
    /// any other kind cannot be renewed, and the error says so (what a
    /// source that holds no renewable secret answers by default).
    fn renew<'a>(
        &'a self,
        _workspace_id: &'a str,
        _connector_id: &'a str,
        _handle: &'a CredentialHandle,
        _host: &'a str,
        _rejected: &'a SecretString,
    ) -> Pin<Box<dyn Future<Output = Result<Injection, SecretError>> + Send + 'a>> {
        Box::pin(async { Err(SecretError::NotRenewable) })
    }
}

/// Whether a 401 says the access token expired, in the ways providers say
/// it: RFC 6750's `WWW-Authenticate: Bearer error="invalid_token"`, or a
/// JSON body whose `category` is `EXPIRED_AUTHENTICATION` (HubSpot's
/// documented answer). Any other 401 (a revoked grant, a missing scope)
/// is the plugin's to report, not a reason to refresh.
fn says_token_expired(headers: &[(String, String)], body: &[u8]) -> bool {
    let rfc6750 = headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("www-authenticate")
            && v.split(',').any(|param| {
                let param = param.trim().trim_start_matches("Bearer").trim().to_ascii_lowercase();
                param == "error=\"invalid_token\"" || param == "error=invalid_token"
            })
    });
    rfc6750
        || serde_json::from_slice::<serde_json::Value>(body)
            .is_ok_and(|v| v["category"].as_str() == Some("EXPIRED_AUTHENTICATION"))
}

/// Who is making a request: the plugin (with the hosts it declared) and
/// the workspace it runs for.
#[derive(Debug, Clone)]
pub struct Caller<'a> {
    pub plugin_id: &'a str,
    pub declared_hosts: &'a [HostPattern],
    pub workspace_id: &'a str,
    /// Which of the operator's lists the host must be on.
    pub reach: Reach,
}

/// Headers dropped from a request that carries a credential: a partial
/// response could cut a reflected secret so that scrubbing no longer
/// recognises it, and a compressed one hides it from a byte search (the
/// host asks for `identity` instead, and decodes what comes coded anyway).
const STRIPPED_WITH_CREDENTIAL: &[&str] = &["range", "if-range", "accept-encoding", "te"];
/// Response headers never handed to a plugin.
const WITHHELD_RESPONSE_HEADERS: &[&str] = &["set-cookie", "set-cookie2", "authorization", "proxy-authorization"];
/// Redirects followed at most.
const MAX_REDIRECTS: usize = 5;

/// The host's outbound HTTP client with its policy.
#[derive(Clone)]
pub struct Egress {
    policy: Arc<EgressPolicy>,
    transport: Transport,
    secrets: Arc<dyn SecretSource>,
    /// Sees every exchange, when an author records a plugin.
    recorder: Option<Arc<dyn Recorder>>,
    /// Whether a replayed answer to a request naming a credential is
    /// handled as if the secret had gone out (decoded and scrubbed).
    replay_injects: bool,
    /// The rate budgets requests take turns on, shared with every server
    /// on the control database.
    budgets: Option<Arc<budget::Budgets>>,
}

/// Where requests that passed the policy go.
#[derive(Clone)]
enum Transport {
    /// Over the network, to the addresses the policy checked.
    Network(PinnedClient),
    /// Nowhere: a recording answers them.
    Replay(Arc<dyn Replay>),
}

impl Egress {
    /// Builds the client: the operator's extra trusted roots on top of the
    /// system's, no proxy, no automatic redirects.
    pub fn new(policy: EgressPolicy, secrets: Arc<dyn SecretSource>) -> anyhow::Result<Self> {
        let client = PinnedClient::new(
            concat!("service-connector-host/", env!("CARGO_PKG_VERSION")),
            &policy.extra_roots,
            |b| b,
        )?;
        Ok(Egress {
            policy: Arc::new(policy),
            transport: Transport::Network(client),
            secrets,
            recorder: None,
            replay_injects: false,
            budgets: None,
        })
    }

    /// An egress that answers every request from `replay` after the checks
    /// that need no network (scheme, port, declared and allowed host,
    /// headers). It holds no HTTP client and resolves no name.
    pub fn replaying(policy: EgressPolicy, replay: Arc<dyn Replay>) -> Self {
        Egress {
            policy: Arc::new(policy),
            transport: Transport::Replay(replay),
            secrets: Arc::new(tape::NoSecrets),
            recorder: None,
            replay_injects: false,
            budgets: None,
        }
    }

    /// The same replaying egress, handling each answer to a request that
    /// names a credential as the network path does once it sent the
    /// secret `secrets` gives: decoded, then scrubbed of every form of
    /// it. The conformance suite puts echoes of a canary secret into
    /// recorded answers and checks that none reaches the plugin.
    pub fn injecting(mut self, secrets: Arc<dyn SecretSource>) -> Self {
        self.secrets = secrets;
        self.replay_injects = true;
        self
    }

    /// The same egress, each request leaving only at its turn on the rate
    /// budgets of the control database behind `store` ([`budget`]).
    pub(crate) fn budgeted(mut self, store: crate::store::Store) -> Self {
        self.budgets = Some(Arc::new(budget::Budgets::new(store)));
        self
    }

    /// The same egress, handing every exchange to `recorder` too.
    pub fn recording(mut self, recorder: Arc<dyn Recorder>) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// Whether requests can reach the network (false when replaying).
    pub fn uses_network(&self) -> bool {
        matches!(self.transport, Transport::Network { .. })
    }

    /// The operator's policy.
    pub fn policy(&self) -> &EgressPolicy {
        &self.policy
    }

    /// Performs `req` for `caller` under the full policy.
    pub async fn send(&self, caller: &Caller<'_>, req: OutboundRequest) -> Result<InboundResponse, EgressError> {
        let recording = self.tape(&req);
        self.send_taped(caller, req, recording).await
    }

    /// Numbers `req` on the recording, when this egress records. Called
    /// when the plugin makes the request (not when a task gets round to
    /// sending it), so requests started together keep the order the
    /// plugin made them in, whatever order their answers arrive in.
    pub(crate) fn tape(&self, req: &OutboundRequest) -> Option<tape::Taping> {
        self.recorder.as_ref().map(|r| tape::Taping::begin(r.clone(), req))
    }

    /// [`Egress::send`] for a request [`Egress::tape`] numbered.
    pub(crate) async fn send_taped(
        &self,
        caller: &Caller<'_>,
        req: OutboundRequest,
        recording: Option<tape::Taping>,
    ) -> Result<InboundResponse, EgressError> {
        let result = self.send_checked(caller, req).await;
        if let Some(taping) = recording {
            taping.finish(&result);
        }
        match &result {
            Err(EgressError::Denied(rule)) => {
                tracing::warn!(plugin = caller.plugin_id, workspace = caller.workspace_id, rule = %rule, "egress denied");
                metrics::counter!("egress_requests_total", "plugin" => caller.plugin_id.to_owned(), "outcome" => "denied").increment(1);
            }
            Err(e) => {
                tracing::info!(plugin = caller.plugin_id, error = %e, "egress failed");
                metrics::counter!("egress_requests_total", "plugin" => caller.plugin_id.to_owned(), "outcome" => "failed").increment(1);
            }
            Ok(r) => {
                metrics::counter!("egress_requests_total", "plugin" => caller.plugin_id.to_owned(), "outcome" => "ok")
                    .increment(1);
                tracing::debug!(plugin = caller.plugin_id, status = r.status, "egress response");
            }
        }
        result
    }

    async fn send_checked(&self, caller: &Caller<'_>, req: OutboundRequest) -> Result<InboundResponse, EgressError> {
        for (name, _) in &req.headers {
            if connector_rules::headers::is_reserved(name) {
                return Err(EgressError::Denied(format!(
                    "header {name} may not be set by a plugin; name a credential handle and the host attaches it"
                )));
            }
        }
        same_reading(&req.url)?;
        if req.credentials.len() > MAX_CREDENTIALS {
            return Err(EgressError::InvalidRequest(format!("a request names at most {MAX_CREDENTIALS} credentials")));
        }
        for (i, c) in req.credentials.iter().enumerate() {
            if req.credentials[..i].iter().any(|other| other.handle == c.handle) {
                return Err(EgressError::InvalidRequest("a request names one credential twice".into()));
            }
        }
        if let Transport::Replay(replay) = &self.transport {
            let url = Url::parse(&req.url).map_err(|e| EgressError::InvalidRequest(format!("bad URL: {e}")))?;
            let host = self.check_target(caller, &url)?;
            let answer = replay.answer(&req)?;
            if req.credentials.is_empty() || !self.replay_injects {
                return Ok(answer);
            }
            // As if the secrets had gone out: checked, and the answer
            // decoded and scrubbed, by the same code as the network's.
            let mut injections = Vec::with_capacity(req.credentials.len());
            for credential in &req.credentials {
                let injection = self
                    .secrets
                    .secret_for(caller.workspace_id, caller.plugin_id, &credential.handle, &host)
                    .await
                    .map_err(|e| EgressError::CredentialUnavailable(e.to_string()))?;
                placed_as_stored(credential, &injection)?;
                injections.push(injection);
            }
            apart(&injections)?;
            let InboundResponse { status, mut headers, body } = answer;
            let body = self.decoded(caller, &host, &mut headers, body)?;
            let body = scrubbed(&injections, &mut headers, body);
            return Ok(InboundResponse { status, headers, body });
        }
        // The turn is waited for before the request's own time starts.
        let drawn = match &self.budgets {
            Some(budgets) => {
                let url = Url::parse(&req.url).map_err(|e| EgressError::InvalidRequest(format!("bad URL: {e}")))?;
                let host = self.check_target(caller, &url)?;
                match budgets.turn(caller.workspace_id, &req.credentials, &host).await? {
                    budget::Turn::Go(drawn) => drawn,
                    budget::Turn::Held(answer) => return Ok(answer),
                }
            }
            None => Vec::new(),
        };
        let timeout = Duration::from_millis(u64::from(
            req.timeout_ms.unwrap_or(self.policy.default_timeout_ms).min(self.policy.max_timeout_ms),
        ));
        let answer = match tokio::time::timeout(timeout, self.exchange(caller, req)).await {
            Ok(r) => r,
            Err(_) => Err(EgressError::Timeout),
        };
        if let (Some(budgets), Ok(answer)) = (&self.budgets, &answer) {
            budgets.answered(&drawn, answer).await;
        }
        answer
    }

    /// Checks a URL against every rule and pins the addresses the client
    /// will connect to. Returns the host name.
    pub(crate) async fn check_url(&self, caller: &Caller<'_>, url: &Url) -> Result<String, EgressError> {
        let host = self.check_target(caller, url)?;
        let Transport::Network(client) = &self.transport else {
            return Err(EgressError::ConnectionFailed("this egress has no network".into()));
        };
        client.check(&Rules::egress(&self.policy, caller.reach), &host, 443).await.map_err(unreachable)?;
        Ok(host)
    }

    /// The rules a URL must pass before any name is resolved: scheme,
    /// port, no user-info, a host name both declared and allowed. Returns
    /// the host name.
    fn check_target(&self, caller: &Caller<'_>, url: &Url) -> Result<String, EgressError> {
        if url.scheme() != "https" {
            return Err(EgressError::Denied(format!("only https is allowed, not {}", url.scheme())));
        }
        if url.port().is_some_and(|p| p != 443) {
            return Err(EgressError::Denied("only port 443 is allowed".into()));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(EgressError::Denied("URLs with user-info are not allowed".into()));
        }
        let host = match url.host() {
            Some(Host::Domain(d)) => d.to_owned(),
            Some(Host::Ipv4(ip)) => return Err(ip_literal(IpAddr::V4(ip))),
            Some(Host::Ipv6(ip)) => return Err(ip_literal(IpAddr::V6(ip))),
            None => return Err(EgressError::InvalidRequest("the URL has no host".into())),
        };
        if host.ends_with('.') {
            return Err(EgressError::Denied(format!("host {host} ends with a dot; use the name without it")));
        }
        if !caller.declared_hosts.iter().any(|p| p.matches(&host)) {
            return Err(EgressError::Denied(match caller.reach {
                // A receiver has no connector: its one host is the rule.
                Reach::Receivers => format!("host {host} is not the receiver's host; only its own host is reached"),
                Reach::Providers | Reach::Warehouses => {
                    format!("host {host} is not among the hosts the connector declared")
                }
            }));
        }
        Rules::egress(&self.policy, caller.reach).check_name(&host).map_err(unreachable)?;
        Ok(host)
    }

    async fn exchange(&self, caller: &Caller<'_>, req: OutboundRequest) -> Result<InboundResponse, EgressError> {
        let Transport::Network(client) = &self.transport else {
            return Err(EgressError::ConnectionFailed("this egress has no network".into()));
        };
        let client = client.client();
        let mut url = Url::parse(&req.url).map_err(|e| EgressError::InvalidRequest(format!("bad URL: {e}")))?;
        let mut method = req.method;
        let mut body = req.body;
        let mut credentials = req.credentials;
        let mut first_host: Option<String> = None;
        // Set to a secret renewed after a provider refused the one sent
        // (by its credential's index): the next round sends the same
        // request once more with it.
        let mut fresh: Option<(usize, Injection)> = None;
        let mut renewed = false;
        let mut redirects = 0;
        for _ in 0..=MAX_REDIRECTS + 1 {
            let host = self.check_url(caller, &url).await?;
            if first_host.as_ref().is_some_and(|h| *h != host) {
                // Credentials never follow a redirect to another host.
                credentials.clear();
            }
            first_host.get_or_insert_with(|| host.clone());
            let mut injections = Vec::with_capacity(credentials.len());
            for (index, c) in credentials.iter().enumerate() {
                let injection = match fresh.take_if(|(at, _)| *at == index) {
                    Some((_, renewed)) => renewed,
                    None => self
                        .secrets
                        .secret_for(caller.workspace_id, caller.plugin_id, &c.handle, &host)
                        .await
                        .map_err(|e| EgressError::CredentialUnavailable(e.to_string()))?,
                };
                placed_as_stored(c, &injection)?;
                injections.push(injection);
            }
            apart(&injections)?;
            // The secrets go into what is sent, never into `url` or `body`:
            // a redirect starts again from the plugin's request.
            let mut sent_url = url.clone();
            let mut sent_body = body.clone();
            for i in &injections {
                match (&i.placement, &sent_body) {
                    (Placement::Query(name), _) => {
                        inject::check_query(&url, name)?;
                        sent_url = inject::query(&sent_url, name, Some(&i.secret));
                    }
                    (Placement::Path, _) => sent_url = inject::path(&sent_url, &i.secret)?,
                    (Placement::BodyField(field), Some(b)) => {
                        sent_body = Some(inject::body_field(&req.headers, Some(b), field, &i.secret)?.to_vec());
                    }
                    // A redirect that turned the request into a GET sends
                    // no body, and so no secret.
                    (Placement::BodyField(_), None) if redirects > 0 => {}
                    (Placement::BodyField(field), None) => {
                        return Err(EgressError::InvalidRequest(format!(
                            "the credential goes into body field {field}: the request has no body"
                        )));
                    }
                    (Placement::AsStored, _) => {
                        return Err(EgressError::CredentialUnavailable(
                            "the credential names no place for its secret".into(),
                        ));
                    }
                    _ => {}
                }
            }
            // Signed last, over the request with every other secret in it.
            let signed = injections.iter().find_map(|i| match &i.placement {
                Placement::Signed(recipe) => {
                    let now =
                        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
                    Some((
                        recipe,
                        recipe.headers(&i.secret, method, &sent_url, sent_body.as_deref().unwrap_or_default(), now),
                    ))
                }
                _ => None,
            });
            let mut builder = client.request(method.as_reqwest(), sent_url);
            for (name, value) in &req.headers {
                if !injections.is_empty() && STRIPPED_WITH_CREDENTIAL.contains(&name.to_ascii_lowercase().as_str()) {
                    continue;
                }
                // The signature's headers are the host's.
                if signed
                    .as_ref()
                    .is_some_and(|(recipe, _)| recipe.header_names().any(|h| h.eq_ignore_ascii_case(name)))
                {
                    continue;
                }
                builder = builder.header(name.as_str(), value.as_str());
            }
            // The signature is scrubbed from the answer too: an echo of it
            // would let the plugin send it again itself.
            let signatures: Vec<String> = signed
                .as_ref()
                .map(|(_, headers)| headers.iter().map(|(_, v)| v.clone()).collect())
                .unwrap_or_default();
            for (name, value) in signed.map(|(_, headers)| headers).unwrap_or_default() {
                builder = builder.header(name, value);
            }
            if !injections.is_empty() {
                builder = builder.header("accept-encoding", "identity");
            }
            for i in &injections {
                let secret = &i.secret;
                builder = match &i.placement {
                    Placement::Bearer => builder.header("authorization", format!("Bearer {}", secret.expose_secret())),
                    Placement::Header(name) => builder.header(name.as_str(), secret.expose_secret()),
                    Placement::BasicPassword(user) => builder.basic_auth(user, Some(secret.expose_secret())),
                    Placement::BasicUsername(password) => builder.basic_auth(secret.expose_secret(), Some(password)),
                    Placement::BasicBoth => builder.basic_auth(secret.expose_secret(), Some(secret.expose_secret())),
                    Placement::BasicPair => {
                        let (user, password) = basic_pair(secret.expose_secret());
                        builder.basic_auth(user, Some(password))
                    }
                    Placement::HeaderAround { header, prefix, suffix } => {
                        builder.header(header.as_str(), format!("{prefix}{}{suffix}", secret.expose_secret()))
                    }
                    Placement::Query(_)
                    | Placement::BodyField(_)
                    | Placement::Path
                    | Placement::Signed(_)
                    | Placement::AsStored => builder,
                };
            }
            if let Some(b) = sent_body {
                builder = builder.body(b);
            }
            let request = builder.build().map_err(|e| EgressError::InvalidRequest(e.without_url().to_string()))?;
            let mut response = client.execute(request).await.map_err(|e| classify(&e))?;
            let status = response.status().as_u16();

            if matches!(status, 301 | 302 | 303 | 307 | 308)
                && let Some(location) = response.headers().get("location").and_then(|v| v.to_str().ok())
            {
                redirects += 1;
                if redirects > MAX_REDIRECTS {
                    break;
                }
                let mut next =
                    url.join(location).map_err(|_| EgressError::Denied("redirect to an invalid URL".into()))?;
                for i in &injections {
                    next = unechoed(i, next)?;
                }
                // The same checks apply to the new target; a refusal is the
                // answer for the whole request.
                self.check_url(caller, &next).await.map_err(|e| match e {
                    EgressError::Denied(rule) => EgressError::Denied(format!("redirect refused: {rule}")),
                    other => other,
                })?;
                if status == 303 || (matches!(status, 301 | 302) && method == Method::Post) {
                    method = Method::Get;
                    body = None;
                }
                url = next;
                continue;
            }

            // Sized up front when the provider says how much is coming, so
            // a large page is not copied again each time the buffer grows.
            let announced = response.content_length().and_then(|n| usize::try_from(n).ok()).unwrap_or(0);
            if announced > self.policy.max_response_bytes {
                return Err(EgressError::ResponseTooLarge);
            }
            let mut collected = Vec::with_capacity(announced);
            while let Some(chunk) = response.chunk().await.map_err(|e| classify(&e))? {
                if collected.len() + chunk.len() > self.policy.max_response_bytes {
                    return Err(EgressError::ResponseTooLarge);
                }
                collected.extend_from_slice(&chunk);
            }
            let mut headers: Vec<(String, String)> = response
                .headers()
                .iter()
                .filter(|(n, _)| !WITHHELD_RESPONSE_HEADERS.contains(&n.as_str()))
                .map(|(n, v)| (n.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
                .collect();
            if !injections.is_empty() {
                collected = self.decoded(caller, &host, &mut headers, collected)?;
            }
            // The one credential that can be renewed, when a 401 says so.
            let renewable = {
                let mut candidates = injections.iter().enumerate().filter(|(_, i)| {
                    i.renewable
                        && (i.any_401_renews
                            || (matches!(i.placement, Placement::Bearer) && says_token_expired(&headers, &collected)))
                });
                match (candidates.next(), candidates.next()) {
                    (Some(only), None) => Some(only),
                    _ => None,
                }
            };
            if status == 401
                && !renewed
                && let Some((index, i)) = renewable
            {
                renewed = true;
                let handle = &credentials[index].handle;
                match self.secrets.renew(caller.workspace_id, caller.plugin_id, handle, &host, &i.secret).await {
                    Ok(renewal) => {
                        tracing::info!(plugin = caller.plugin_id, host = %host, "the provider refused the credential; renewed it, sending again");
                        fresh = Some((index, renewal));
                        continue;
                    }
                    // Nothing newer: the plugin gets the provider's 401.
                    Err(SecretError::Unchanged) => {}
                    Err(e) => return Err(EgressError::CredentialUnavailable(e.to_string())),
                }
            }
            if !injections.is_empty() {
                collected = scrubbed(&injections, &mut headers, collected);
            }
            for signature in signatures.iter().filter(|s| s.len() >= 16) {
                let before = collected.len();
                collected = scrub(collected, signature.as_bytes());
                headers.retain(|(_, v)| !v.contains(signature.as_str()));
                if collected.len() != before {
                    for (_, value) in headers.iter_mut().filter(|(n, _)| n == "content-length") {
                        *value = collected.len().to_string();
                    }
                }
            }
            return Ok(InboundResponse { status, headers, body: collected });
        }
        Err(EgressError::Denied(format!("more than {MAX_REDIRECTS} redirects")))
    }
}

impl Egress {
    /// `body` with its content codings undone, and the headers that named
    /// them (and its coded length) dropped: the answer to a request that
    /// carried a credential, before it is searched for the secret.
    fn decoded(
        &self,
        caller: &Caller<'_>,
        host: &str,
        headers: &mut Vec<(String, String)>,
        body: Vec<u8>,
    ) -> Result<Vec<u8>, EgressError> {
        let named: Vec<String> =
            headers.iter().filter(|(n, _)| n == "content-encoding").map(|(_, v)| v.clone()).collect();
        if named.iter().all(|v| coding::codings(v).is_empty()) {
            return Ok(body);
        }
        // No body (a HEAD, a 204, a 304): nothing to decode, and the
        // coding no longer describes anything handed on.
        if body.is_empty() {
            headers.retain(|(n, _)| n != "content-encoding");
            return Ok(body);
        }
        let decoded =
            coding::decode(&named.join(","), &body, self.policy.max_response_bytes).map_err(|e| match e {
                coding::CodingError::TooLarge => EgressError::ResponseTooLarge,
                other => {
                    tracing::warn!(plugin = caller.plugin_id, %host, reason = %other, "egress refused an answer it could not decode");
                    EgressError::Denied(other.to_string())
                }
            })?;
        headers.retain(|(n, _)| n != "content-encoding" && n != "content-length");
        headers.push(("content-length".into(), decoded.len().to_string()));
        Ok(decoded)
    }
}

/// Refuses a URL the host's parser and the connectors' reading
/// ([`origin`]) would take for two different servers, or that the
/// connectors' reading refuses (a host not written in ASCII): a
/// connector deciding by one reading where a link goes must never have
/// the host send it somewhere else. URLs refused for other reasons (not
/// https, user-info, unparsable) are left to the rules that say so.
fn same_reading(raw: &str) -> Result<(), EgressError> {
    let Ok(url) = Url::parse(raw) else { return Ok(()) };
    if url.scheme() != "https" || !matches!(url.host(), Some(Host::Domain(_))) {
        return Ok(());
    }
    match origin::parse(raw) {
        Ok(read)
            if url.host_str() == Some(read.host.as_str())
                && url.port_or_known_default() == Some(read.port.unwrap_or(443)) =>
        {
            Ok(())
        }
        Ok(read) => Err(EgressError::Denied(format!(
            "the URL reads as {} to the connector and as another server to the host; write the host plainly",
            read.serialize()
        ))),
        Err(origin::OriginError::NotHttps | origin::OriginError::UserInfo | origin::OriginError::NoHost) => Ok(()),
        Err(e) => Err(EgressError::Denied(e.to_string())),
    }
}

/// `body` and `headers` with every form of the injected secrets taken
/// out: a provider that echoes the request (debug endpoints, error pages)
/// must not hand a secret back to the plugin, in any of the forms an echo
/// would carry it.
///
/// Every form of every secret of the request is searched for at once,
/// the longest first: scrubbing one secret must never cut another that
/// holds it (a key that is a prefix of another) so that the rest of it
/// no longer matches.
fn scrubbed(injections: &[Injection], headers: &mut Vec<(String, String)>, mut body: Vec<u8>) -> Vec<u8> {
    let mut forms: Vec<Vec<u8>> = Vec::new();
    // In a next page's URL, a secret of the path becomes the marker the
    // plugin wrote, which the host fills again when the plugin follows it.
    let mut in_links: Vec<(Vec<u8>, &[u8])> = Vec::new();
    for injection in injections {
        let instead: &[u8] = match injection.placement {
            Placement::Path => connector_rules::path::CREDENTIAL_MARKER.as_bytes(),
            _ => REDACTED,
        };
        for form in reflections(injection.secret.expose_secret(), &injection.placement) {
            if !forms.contains(&form) {
                in_links.push((form.clone(), instead));
                forms.push(form);
            }
        }
    }
    longest_first(&mut forms);
    in_links.sort_by_key(|(f, _)| std::cmp::Reverse(f.len()));
    let holds = |value: &str| forms.iter().any(|f| memchr::memmem::find(value.as_bytes(), f).is_some());
    // A header that echoes the secret is withheld, but for `Link`: it is
    // redacted in place, so a next page whose URL echoes a query
    // credential still leads there (the host sets the parameter again
    // when the plugin follows it).
    for (_, value) in headers.iter_mut().filter(|(n, _)| n == "link") {
        if holds(value) {
            let redacted =
                in_links.iter().fold(std::mem::take(value).into_bytes(), |v, (f, instead)| replaced(v, f, instead));
            *value = String::from_utf8_lossy(&redacted).into_owned();
        }
    }
    headers.retain(|(_, v)| !holds(v));
    let before = body.len();
    for form in &forms {
        body = scrub(body, form);
    }
    // The provider's length would tell the secret's length once the body
    // no longer holds it.
    if body.len() != before {
        for (_, value) in headers.iter_mut().filter(|(n, _)| n == "content-length") {
            *value = body.len().to_string();
        }
    }
    body
}

/// A redirect's target, `next`, freed of the secret the provider echoed
/// into it: the parameter a query credential goes in is dropped (the host
/// sets it again if the target is the credential's host); any other form
/// of the secret left in the URL refuses the redirect, since the URL would
/// carry the secret wherever it goes.
fn unechoed(injection: &Injection, next: Url) -> Result<Url, EgressError> {
    let next = match &injection.placement {
        Placement::Query(name) => inject::query(&next, name, None),
        _ => next,
    };
    let forms = reflections(injection.secret.expose_secret(), &injection.placement);
    if forms.iter().any(|f| memchr::memmem::find(next.as_str().as_bytes(), f).is_some()) {
        return Err(EgressError::Denied("redirect refused: its target carries the credential's secret".into()));
    }
    Ok(next)
}

/// A refusal of the address policy as the plugin (or the receiver's
/// owner) is told it: a name that did not resolve is a failed
/// connection, which may pass; the rest are the policy's.
fn unreachable(e: Unreachable) -> EgressError {
    match e {
        Unreachable::Unresolved(..) => EgressError::ConnectionFailed(e.to_string()),
        _ => EgressError::Denied(e.to_string()),
    }
}

fn ip_literal(ip: IpAddr) -> EgressError {
    match address::refusal(ip) {
        Some(why) => EgressError::Denied(format!("IP-literal URL to a {why} ({ip})")),
        None => EgressError::Denied(format!("IP-literal URLs are not allowed ({ip}); use a declared host name")),
    }
}

fn classify(e: &reqwest::Error) -> EgressError {
    if e.is_timeout() {
        EgressError::Timeout
    } else {
        // Without the URL: it may carry query parameters.
        let mut msg = e.without_url_ref().to_string();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            source = s.source();
        }
        EgressError::ConnectionFailed(msg)
    }
}

/// The forms in which a reflecting endpoint would hand a secret back: as
/// sent, Base64 (the Basic header's `user:secret` too), percent-encoded
/// (as a query or form value) and JSON-escaped (inside a JSON echo).
pub(crate) fn reflections(secret: &str, placement: &Placement) -> Vec<Vec<u8>> {
    let mut forms = forms_of(secret, placement);
    // Each part of a pair is a secret of its own: an answer that echoes
    // the account's id alone is scrubbed too.
    if let Placement::BasicPair = placement {
        let (user, password) = basic_pair(secret);
        for part in [user, password].into_iter().filter(|p| !p.is_empty()) {
            for form in forms_of(part, &Placement::Bearer) {
                if !forms.contains(&form) {
                    forms.push(form);
                }
            }
        }
    }
    longest_first(&mut forms);
    forms
}

/// Orders forms to be scrubbed one after another so that none is cut
/// by a shorter one it holds.
fn longest_first(forms: &mut [Vec<u8>]) {
    forms.sort_by_key(|f| std::cmp::Reverse(f.len()));
}

/// The username and password of a pair stored as `username:password`:
/// split at the first colon, as RFC 7617 reads it (a username holds none).
pub(crate) fn basic_pair(secret: &str) -> (&str, &str) {
    secret.split_once(':').unwrap_or((secret, ""))
}

/// The forms of one secret as a provider may echo it.
fn forms_of(secret: &str, placement: &Placement) -> Vec<Vec<u8>> {
    use base64::Engine;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    let mut forms: Vec<Vec<u8>> = vec![secret.as_bytes().to_vec()];
    let mut add = |form: String| {
        if !form.is_empty() && !forms.iter().any(|f| f == form.as_bytes()) {
            forms.push(form.into_bytes());
        }
    };
    add(STANDARD.encode(secret));
    add(STANDARD.encode(secret).trim_end_matches('=').to_owned());
    add(URL_SAFE_NO_PAD.encode(secret));
    let pair = match placement {
        Placement::BasicPassword(user) => Some(format!("{user}:{secret}")),
        Placement::BasicUsername(password) => Some(format!("{secret}:{password}")),
        Placement::BasicBoth => Some(format!("{secret}:{secret}")),
        _ => None,
    };
    if let Some(pair) = pair {
        add(STANDARD.encode(&pair));
        add(STANDARD.encode(&pair).trim_end_matches('=').to_owned());
    }
    // As the host writes it into a path.
    if let Placement::Path = placement
        && let Some(in_path) = connector_rules::path::with_secret(connector_rules::path::CREDENTIAL_MARKER, secret)
    {
        add(in_path);
    }
    let form_encoded: String = url::form_urlencoded::byte_serialize(secret.as_bytes()).collect();
    add(form_encoded.replace('+', "%20"));
    add(form_encoded.to_ascii_lowercase_hex());
    add(form_encoded);
    let json = serde_json::to_string(secret).unwrap_or_default();
    let json = json.get(1..json.len().saturating_sub(1)).unwrap_or_default().to_owned();
    let ascii_json: String = json
        .chars()
        .map(|c| {
            if c.is_ascii() {
                c.to_string()
            } else {
                c.encode_utf16(&mut [0; 2]).iter().map(|u| format!("\\u{u:04x}")).collect()
            }
        })
        .collect();
    add(json.replace('/', "\\/"));
    add(json);
    add(ascii_json);
    forms
}

/// Percent-encoding with lower-case hex digits, as some servers echo it.
trait LowercaseHex {
    fn to_ascii_lowercase_hex(&self) -> String;
}

impl LowercaseHex for String {
    fn to_ascii_lowercase_hex(&self) -> String {
        let mut out = String::with_capacity(self.len());
        let mut rest = self.as_str();
        while let Some(at) = rest.find('%') {
            out.push_str(&rest[..at]);
            let hex = rest.get(at + 1..at + 3).unwrap_or_default();
            out.push('%');
            out.push_str(&hex.to_ascii_lowercase());
            rest = rest.get(at + 1 + hex.len()..).unwrap_or_default();
        }
        out.push_str(rest);
        out
    }
}

/// Replaces every occurrence of `secret` in `body`.
fn scrub(body: Vec<u8>, secret: &[u8]) -> Vec<u8> {
    replaced(body, secret, REDACTED)
}

/// What the host writes where it took a secret out.
const REDACTED: &[u8] = b"[REDACTED]";

/// `body` with every occurrence of `secret` replaced by `instead`.
fn replaced(body: Vec<u8>, secret: &[u8], instead: &[u8]) -> Vec<u8> {
    if secret.is_empty() || body.len() < secret.len() {
        return body;
    }
    let finder = memchr::memmem::Finder::new(secret);
    let mut hits = finder.find_iter(&body).peekable();
    if hits.peek().is_none() {
        return body;
    }
    let mut out = Vec::with_capacity(body.len());
    let mut copied = 0;
    for at in hits {
        // Occurrences do not overlap: the search resumes after each one.
        out.extend_from_slice(&body[copied..at]);
        out.extend_from_slice(instead);
        copied = at + secret.len();
    }
    out.extend_from_slice(&body[copied..]);
    out
}

/// A client error's text without its URL (which may carry a query
/// credential, or name a store's path).
pub(crate) trait WithoutUrlRef {
    fn without_url_ref(&self) -> String;
}

impl WithoutUrlRef for reqwest::Error {
    fn without_url_ref(&self) -> String {
        let s = self.to_string();
        match self.url() {
            Some(u) => s.replace(u.as_str(), "<url>"),
            None => s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn injected(placement: Placement) -> Injection {
        Injection {
            secret: SecretString::from("s3cret-value-0001".to_owned()),
            renewable: false,
            any_401_renews: false,
            placement,
        }
    }

    #[test]
    fn the_credentials_of_a_request_each_take_a_part_of_their_own() {
        let fine = [
            injected(Placement::Header("X-Api-Key".into())),
            injected(Placement::Header("x-app-key".into())),
            injected(Placement::Query("key".into())),
            injected(Placement::BodyField("/auth/token".into())),
            injected(Placement::Bearer),
        ];
        assert_eq!(apart(&fine), Ok(()));
        for (a, b) in [
            (Placement::Header("X-Api-Key".into()), Placement::Header("x-api-key".into())),
            (Placement::Bearer, Placement::BasicPassword("me".into())),
            (Placement::BasicPair, Placement::Header("Authorization".into())),
            (
                Placement::HeaderAround {
                    header: "authorization".into(),
                    prefix: "Token ".into(),
                    suffix: String::new(),
                },
                Placement::BasicBoth,
            ),
            (Placement::Query("key".into()), Placement::Query("key".into())),
            (Placement::BodyField("token".into()), Placement::BodyField("/token".into())),
            (Placement::BodyField("a/b".into()), Placement::BodyField("/a~1b".into())),
            (Placement::BodyField("/auth".into()), Placement::BodyField("/auth/key".into())),
            (Placement::Query("key".into()), Placement::Query("KEY".into())),
        ] {
            let refused = apart(&[injected(a.clone()), injected(b.clone())]);
            assert!(matches!(refused, Err(EgressError::InvalidRequest(_))), "{a:?} beside {b:?}: {refused:?}");
        }
    }

    #[test]
    fn a_secret_that_holds_another_is_scrubbed_whole() {
        // The shorter secret first, as a plugin may order its credentials:
        // scrubbing it must not leave the rest of the longer one.
        let short = Injection { secret: SecretString::from("sk_live_".to_owned()), ..injected(Placement::Bearer) };
        let long = Injection {
            secret: SecretString::from("sk_live_0123456789abcdef".to_owned()),
            ..injected(Placement::Header("x-key".into()))
        };
        let mut headers = vec![("x-echo".to_owned(), "sk_live_0123456789abcdef".to_owned())];
        let body = scrubbed(&[short, long], &mut headers, b"{\"echo\": \"sk_live_0123456789abcdef\"}".to_vec());
        let body = String::from_utf8(body).unwrap();
        assert!(!body.contains("0123456789abcdef"), "{body}");
        assert!(headers.is_empty(), "{headers:?}");
        // Within a pair: a username the password holds.
        let forms = reflections("tok-0123:tok-0123-and-more", &Placement::BasicPair);
        let position = |f: &str| forms.iter().position(|x| x == f.as_bytes()).unwrap();
        assert!(position("tok-0123-and-more") < position("tok-0123"));
    }

    #[test]
    fn a_basic_pair_is_split_at_its_first_colon_and_each_part_is_scrubbed() {
        assert_eq!(basic_pair("AC0123456789:tok:en"), ("AC0123456789", "tok:en"));
        let forms = reflections("AC0123456789:token-0123456789", &Placement::BasicPair);
        for part in ["AC0123456789", "token-0123456789", "AC0123456789:token-0123456789"] {
            assert!(forms.iter().any(|f| f == part.as_bytes()), "{part}");
        }
        use base64::Engine;
        let header = base64::engine::general_purpose::STANDARD.encode("AC0123456789:token-0123456789");
        assert!(forms.iter().any(|f| *f == header.as_bytes()));
    }

    #[test]
    fn every_echoed_form_of_a_secret_is_recognised() {
        use base64::Engine;
        let secret = "s3cr3t/+ é \"x\"";
        let forms = reflections(secret, &Placement::BasicPassword("bob".into()));
        let has = |f: &str| forms.iter().any(|x| x == f.as_bytes());
        assert!(has(secret));
        assert!(has(&base64::engine::general_purpose::STANDARD.encode(format!("bob:{secret}"))), "Basic header");
        assert!(has(&base64::engine::general_purpose::STANDARD.encode(secret)));
        assert!(has("s3cr3t%2F%2B+%C3%A9+%22x%22"), "form encoding");
        assert!(has("s3cr3t%2f%2b+%c3%a9+%22x%22"), "lower-case hex");
        assert!(has("s3cr3t%2F%2B%20%C3%A9%20%22x%22"), "path encoding");
        assert!(has("s3cr3t/+ é \\\"x\\\""), "JSON escaping");
        assert!(has("s3cr3t\\/+ é \\\"x\\\""), "JSON escaping of /");
        assert!(has("s3cr3t/+ \\u00e9 \\\"x\\\""), "JSON ASCII escaping");
    }

    #[test]
    fn a_secret_of_the_path_goes_where_the_marker_is_and_comes_back_as_the_marker_in_a_next_link() {
        let secret = SecretString::from("acct*0001~x y".to_owned());
        let url = Url::parse("https://api.example.com/v3/a/%7Bcredential%7D/calls.json?page=1").unwrap();
        let sent = inject::path(&url, &secret).unwrap();
        assert_eq!(sent.as_str(), "https://api.example.com/v3/a/acct%2A0001~x%20y/calls.json?page=1");
        for unmarked in ["https://api.example.com/v3/calls", "https://api.example.com/v3/calls?a=%7Bcredential%7D"] {
            let refused = inject::path(&Url::parse(unmarked).unwrap(), &secret);
            assert!(matches!(refused, Err(EgressError::InvalidRequest(_))), "{unmarked}: {refused:?}");
        }
        // One path, one credential.
        let refused = apart(&[injected(Placement::Path), injected(Placement::Path)]);
        assert!(matches!(refused, Err(EgressError::InvalidRequest(_))), "{refused:?}");
        // The provider's next link leads to the same path: the plugin gets
        // the marker back, the body an echo scrubbed.
        let injection = Injection { secret, ..injected(Placement::Path) };
        let mut headers = vec![(
            "link".to_owned(),
            "<https://api.example.com/v3/a/acct%2A0001~x%20y/calls.json?page=2>; rel=\"next\"".to_owned(),
        )];
        let body = scrubbed(&[injection], &mut headers, b"{\"account\": \"acct*0001~x y\"}".to_vec());
        assert_eq!(headers[0].1, "<https://api.example.com/v3/a/%7Bcredential%7D/calls.json?page=2>; rel=\"next\"");
        assert_eq!(body, b"{\"account\": \"[REDACTED]\"}".to_vec());
    }

    #[test]
    fn scrub_replaces_every_occurrence() {
        let out = scrub(b"a SECRET b SECRETSECRET".to_vec(), b"SECRET");
        assert_eq!(out, b"a [REDACTED] b [REDACTED][REDACTED]".to_vec());
        assert_eq!(scrub(b"short".to_vec(), b"much longer secret"), b"short".to_vec());
    }

    #[test]
    fn only_a_said_expiry_renews_a_token() {
        let h = |v: &str| vec![("www-authenticate".to_owned(), v.to_owned())];
        assert!(says_token_expired(
            &h(r#"Bearer realm="api", error="invalid_token", error_description="expired""#),
            b""
        ));
        assert!(says_token_expired(&[], br#"{"status":"error","category":"EXPIRED_AUTHENTICATION"}"#));
        assert!(!says_token_expired(
            &h(r#"Bearer error="insufficient_scope", error_description="not an invalid_token""#),
            b""
        ));
        assert!(!says_token_expired(&[], br#"{"category":"INVALID_AUTHENTICATION"}"#));
        assert!(!says_token_expired(&[], b"invalid_token"));
    }
}
