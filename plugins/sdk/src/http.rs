//! HTTPS requests to the provider, performed by the host.
//!
//! A connector cannot open sockets. It describes a request with [`Http`] and
//! the host sends it, after checking it against the egress policy (https on
//! port 443, declared and approved hosts only, no private addresses) and
//! attaching the credential named by a handle:
//!
//! ```no_run
//! use connector_sdk::{Http, Placement, Result};
//! # #[derive(serde::Deserialize)] struct Me { email: String }
//! # fn f(handle: &str) -> Result<()> {
//! let me: Me = Http::get("https://api.example.com/me")
//!     .credential(handle, Placement::Bearer)
//!     .send()?      // retries 429/5xx a few times, then maps the status to an Error
//!     .json()?;
//! # Ok(()) }
//! ```
//!
//! [`RequestBuilder::send`] is what connectors want almost always: bounded
//! retries with backoff, then any 4xx/5xx becomes the matching [`Error`]
//! (401 → `InvalidCredentials`, 403 → `PermissionDenied`, 429 →
//! `RateLimited`, 5xx → `ProviderUnavailable`, other 4xx → `ProviderError`).
//! [`RequestBuilder::send_raw`] makes one attempt and returns any status, for
//! connectors that handle statuses themselves.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::bindings::service::connector1_1_0::http_ahead as wit_ahead;
use crate::convert::{self, Started, Wire};
use crate::log;
use crate::types::{Error, Result};

/// How much of a provider's error message is kept in an [`Error`].
const MAX_PROVIDER_MESSAGE: usize = 200;

/// An HTTP method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `GET`
    Get,
    /// `HEAD`
    Head,
    /// `POST`
    Post,
    /// `PUT`
    Put,
    /// `PATCH`
    Patch,
    /// `DELETE`
    Delete,
    /// `OPTIONS`
    Options,
}

impl Method {
    /// Whether repeating the request is harmless, which decides whether
    /// [`RequestBuilder::send`] retries it after a server error or timeout.
    pub fn is_idempotent(self) -> bool {
        !matches!(self, Method::Post | Method::Patch)
    }

    fn as_str(self) -> &'static str {
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
}

/// Where the host puts a credential's secret in the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// `Authorization: Bearer <secret>` (API tokens, OAuth access tokens).
    Bearer,
    /// The secret as the value of this header, for example `X-Api-Key`.
    Header(String),
    /// HTTP Basic authentication: this username, the secret as password.
    Basic {
        /// The (non-secret) username.
        username: String,
    },
}

/// Where a request asks for a credential: a [`Placement`], a query
/// parameter or body field ([`RequestBuilder::credential_in_query`],
/// [`RequestBuilder::credential_in_body`]), or wherever the credential
/// was stored for ([`RequestBuilder::credential_as_stored`]). Named
/// directly for [`RequestBuilder::and_credential`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialPlace {
    /// Where a [`Placement`] says.
    Placed(Placement),
    /// The value of this query parameter.
    Query(String),
    /// The value of this body field (a key, or a JSON pointer).
    BodyField(String),
    /// Wherever the credential's record says.
    AsStored,
}

/// Starts requests. `Http::get(url)` and friends return a [`RequestBuilder`].
#[derive(Debug)]
pub struct Http;

impl Http {
    /// A request with any method.
    pub fn request(method: Method, url: impl Into<String>) -> RequestBuilder {
        RequestBuilder {
            method,
            url: url.into(),
            headers: vec![("accept".to_owned(), "application/json".to_owned())],
            body: None,
            credentials: Vec::new(),
            wire: None,
            timeout: None,
            retry: Retry::default(),
            problem: None,
        }
    }

    /// A `GET` request.
    pub fn get(url: impl Into<String>) -> RequestBuilder {
        Self::request(Method::Get, url)
    }

    /// A `POST` request.
    pub fn post(url: impl Into<String>) -> RequestBuilder {
        Self::request(Method::Post, url)
    }

    /// A `PUT` request.
    pub fn put(url: impl Into<String>) -> RequestBuilder {
        Self::request(Method::Put, url)
    }

    /// A `PATCH` request.
    pub fn patch(url: impl Into<String>) -> RequestBuilder {
        Self::request(Method::Patch, url)
    }

    /// A `DELETE` request.
    pub fn delete(url: impl Into<String>) -> RequestBuilder {
        Self::request(Method::Delete, url)
    }
}

/// A request being put together. Cloneable, so a paginator can reuse it for
/// every page.
///
/// Every request starts with `Accept: application/json`; set another `Accept`
/// header to change it.
#[derive(Debug, Clone)]
pub struct RequestBuilder {
    pub(crate) method: Method,
    pub(crate) url: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Option<Vec<u8>>,
    /// The credentials the host attaches, by handle, each in its place.
    pub(crate) credentials: Vec<(String, CredentialPlace)>,
    /// Set when a credential's place needs `http-placed@1.2.0`, or the
    /// request names several (`http-multi@1.3.0`).
    wire: Option<&'static Wire>,
    pub(crate) timeout: Option<Duration>,
    retry: Retry,
    /// A mistake made while building (a reserved header, a body that would
    /// not serialise), reported by `send` so the builder chain stays simple.
    problem: Option<String>,
}

impl RequestBuilder {
    /// The URL as it stands, query included.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Appends `key=value` to the query string, percent-encoding both.
    pub fn query(mut self, key: &str, value: impl fmt::Display) -> Self {
        let separator = if self.url.contains('?') { '&' } else { '?' };
        self.url.push(separator);
        percent_encode_into(&mut self.url, key);
        self.url.push('=');
        percent_encode_into(&mut self.url, &value.to_string());
        self
    }

    /// Sets a header, replacing one of the same name. `Authorization`,
    /// `Proxy-Authorization`, `Cookie` and `Host` are refused (by the host,
    /// and already here): use [`credential`](Self::credential) instead.
    pub fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        if connector_rules::headers::is_reserved(name) {
            self.problem = Some(format!(
                "the `{name}` header is set by the host; \
                 name a credential handle with `.credential(...)` instead"
            ));
            return self;
        }
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.to_ascii_lowercase(), value.into()));
        self
    }

    /// Asks the host to attach the credential behind `handle` (a string from
    /// the config) in the given place. The secret never enters the plugin.
    /// This, and the three methods below, name the request's one
    /// credential (replacing any named before); [`and_credential`](Self::and_credential)
    /// names more.
    pub fn credential(mut self, handle: impl Into<String>, placement: Placement) -> Self {
        self.credentials = vec![(handle.into(), CredentialPlace::Placed(placement))];
        self.wire = None;
        self
    }

    /// Asks the host to put the secret behind `handle` into the query
    /// parameter `name` of the URL it sends (for APIs that take a key as
    /// `?api_key=...`). The URL this builder holds never carries it; a
    /// link the provider hands back that echoed it reads `[REDACTED]`
    /// there, and following it as it is works (the host sets the
    /// parameter again). The credential must have been stored for this
    /// query parameter.
    pub fn credential_in_query(mut self, handle: impl Into<String>, name: impl Into<String>) -> Self {
        self.credentials = vec![(handle.into(), CredentialPlace::Query(name.into()))];
        self.wire = Some(&convert::WIRE_1_2);
        self
    }

    /// Asks the host to attach the credential behind `handle` wherever it
    /// was stored for: its header, query parameter or body field, or, for
    /// a credential that signs requests, the signature headers the host
    /// computes over the request as sent (the secret then goes into no
    /// request at all). Sign nothing yourself, and set none of those
    /// headers: the host's replace them.
    pub fn credential_as_stored(mut self, handle: impl Into<String>) -> Self {
        self.credentials = vec![(handle.into(), CredentialPlace::AsStored)];
        self.wire = Some(&convert::WIRE_1_2);
        self
    }

    /// Asks the host to set the field `field` of the request body to the
    /// secret behind `handle`: a key of a JSON object body (or a JSON
    /// pointer such as `/auth/password`), or a field of a form body. Write
    /// the body without it ([`json`](Self::json) or
    /// [`body`](Self::body) with `application/x-www-form-urlencoded`).
    /// The credential must have been stored for this body field.
    pub fn credential_in_body(mut self, handle: impl Into<String>, field: impl Into<String>) -> Self {
        self.credentials = vec![(handle.into(), CredentialPlace::BodyField(field.into()))];
        self.wire = Some(&convert::WIRE_1_2);
        self
    }

    /// Names one more credential on this request, beside the one named
    /// with the methods above (an API key and an application key, each in
    /// a header of its own; an account token beside a bearer token).
    /// Naming a handle again replaces its place. Each credential must be
    /// stored for its place, and two may not share one (one header, one
    /// parameter, one field; `Authorization` twice): the host refuses the
    /// request. Every secret is scrubbed from the answer.
    ///
    /// A request naming several credentials needs interface 1.3.0's
    /// `http-multi`: a plugin that calls this imports it, and loads on
    /// hosts that have it.
    pub fn and_credential(mut self, handle: impl Into<String>, place: CredentialPlace) -> Self {
        let handle = handle.into();
        match self.credentials.iter_mut().find(|(h, _)| *h == handle) {
            Some(named) => named.1 = place,
            None => self.credentials.push((handle, place)),
        }
        self.wire = Some(&convert::WIRE_1_3);
        self
    }

    /// Sends `body` as JSON (and sets `Content-Type: application/json`).
    pub fn json<T: Serialize + ?Sized>(mut self, body: &T) -> Self {
        match serde_json::to_vec(body) {
            Ok(bytes) => {
                self.body = Some(bytes);
                self.header("content-type", "application/json")
            }
            Err(e) => {
                self.problem = Some(format!("the request body could not be serialised: {e}"));
                self
            }
        }
    }

    /// Sends `fields` as a form body (`application/x-www-form-urlencoded`),
    /// each name and value percent-encoded.
    pub fn form(self, fields: &[(String, String)]) -> Self {
        let mut body = String::new();
        for (i, (name, value)) in fields.iter().enumerate() {
            if i > 0 {
                body.push('&');
            }
            percent_encode_into(&mut body, name);
            body.push('=');
            percent_encode_into(&mut body, value);
        }
        self.body("application/x-www-form-urlencoded", body.into_bytes())
    }

    /// Sends raw bytes with the given content type.
    pub fn body(mut self, content_type: &str, bytes: impl Into<Vec<u8>>) -> Self {
        self.body = Some(bytes.into());
        self.header("content-type", content_type)
    }

    /// Limits how long one attempt may take. Without it the host's default
    /// applies; the host caps it in any case.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Replaces the retry policy of [`send`](Self::send).
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// Sends the request, retrying transient failures under the retry
    /// policy, and turns a 4xx/5xx answer into the matching [`Error`].
    ///
    /// Retried: 429 always (honouring `Retry-After`); 408, 500, 502, 503,
    /// 504, timeouts and connection failures only for idempotent methods, so
    /// a `POST` is never repeated after the provider may have acted on it.
    /// When the provider asks for a longer wait than the policy allows, the
    /// error is [`Error::RateLimited`] with its `Retry-After`, so the host can
    /// schedule the work for later.
    pub fn send(self) -> Result<Response> {
        let first = self.attempt();
        self.finish_with_retries(first)
    }

    /// Starts the request and returns at once; [`Pending::finish`] waits
    /// for its answer, with the same retries and errors as
    /// [`send`](Self::send) (retries are sent when they are due, from
    /// `finish`). Start the next pages of a list while the last one is
    /// handed over, where the provider's pagination says which pages
    /// exist; dropping a [`Pending`] cancels its request.
    ///
    /// At most [`Pending::max`] requests may be pending at once; one more
    /// is refused with [`HttpError::Denied`].
    pub fn start(self) -> Result<Pending, HttpError> {
        if let Some(problem) = &self.problem {
            return Err(HttpError::InvalidRequest(problem.clone()));
        }
        let pending = match self.wire {
            Some(wire) => (wire.start)(&self)?,
            None => convert::start_1_1(&self)?,
        };
        Ok(Pending { request: self, pending })
    }

    /// Retries after the first attempt's `outcome` as the policy allows;
    /// the last answer, as [`send`](Self::send) returns it.
    fn finish_with_retries(&self, first: Result<Response, HttpError>) -> Result<Response> {
        let mut outcome = first;
        let mut waited = Duration::ZERO;
        let mut retries = 0;
        loop {
            match self.wait_before_retry(&outcome, retries) {
                Some(wait) if retries < self.retry.max_retries && waited + wait <= self.retry.max_total_wait => {
                    log::info(format_args!(
                        "{}: transient failure, retrying in {} ms",
                        describe_request(self.method, &self.url),
                        wait.as_millis()
                    ));
                    std::thread::sleep(wait);
                    waited += wait;
                    retries += 1;
                    outcome = self.attempt();
                }
                _ => return outcome?.error_for_status(),
            }
        }
    }

    /// How long to wait before another attempt after `outcome`, or `None`
    /// when another attempt is pointless or unsafe.
    fn wait_before_retry(&self, outcome: &Result<Response, HttpError>, retries: u32) -> Option<Duration> {
        let idempotent = self.method.is_idempotent();
        match outcome {
            Ok(response) if response.status == 429 || (idempotent && is_transient(response.status)) => {
                Some(response.retry_after().unwrap_or_else(|| self.retry.backoff(retries)))
            }
            Err(HttpError::Timeout | HttpError::ConnectionFailed(_)) if idempotent => Some(self.retry.backoff(retries)),
            _ => None,
        }
    }

    /// Sends the request once and returns whatever status the provider
    /// answered. Only failures to get an answer at all are errors.
    pub fn send_raw(self) -> Result<Response, HttpError> {
        self.attempt()
    }

    fn attempt(&self) -> Result<Response, HttpError> {
        if let Some(problem) = &self.problem {
            return Err(HttpError::InvalidRequest(problem.clone()));
        }
        let response = match self.wire {
            Some(wire) => (wire.send)(self)?,
            None => convert::send_1_0(self)?,
        };
        Ok(Response::from_wire(response, describe_request(self.method, &self.url)))
    }
}

/// A request the host is performing: made by [`RequestBuilder::start`].
#[derive(Debug)]
pub struct Pending {
    request: RequestBuilder,
    pending: Box<dyn Started>,
}

impl Pending {
    /// How many requests the host lets a call have pending at once.
    pub fn max() -> u32 {
        wit_ahead::max_pending()
    }

    /// Waits for the answer; then as [`RequestBuilder::send`].
    pub fn finish(self) -> Result<Response> {
        let Pending { request, pending } = self;
        let first = Self::answer(&request, pending);
        request.finish_with_retries(first)
    }

    /// Waits for the answer, whatever its status, without retries, as
    /// [`RequestBuilder::send_raw`].
    pub fn finish_raw(self) -> Result<Response, HttpError> {
        Self::answer(&self.request, self.pending)
    }

    fn answer(request: &RequestBuilder, pending: Box<dyn Started>) -> Result<Response, HttpError> {
        pending.finish().map(|r| Response::from_wire(r, describe_request(request.method, &request.url)))
    }
}

/// How [`RequestBuilder::send`] retries transient failures: exponential
/// backoff with jitter, bounded both in attempts and in total waiting time
/// (the wait counts against the host's wall-clock limit for the call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// The wait before the first retry; it doubles with every retry.
    pub first_backoff: Duration,
    /// The longest wait between two attempts.
    pub max_backoff: Duration,
    /// The most time spent waiting in one `send`, `Retry-After` included.
    pub max_total_wait: Duration,
}

impl Retry {
    /// No retries: one attempt, then the status decides.
    pub const fn none() -> Self {
        Self {
            max_retries: 0,
            first_backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
            max_total_wait: Duration::ZERO,
        }
    }

    /// The wait before retry number `retry` (0-based): the exponential step,
    /// scaled by a random factor in [0.5, 1) so that many jobs hitting the
    /// same provider do not retry in lockstep.
    fn backoff(&self, retry: u32) -> Duration {
        let step = self.first_backoff.saturating_mul(1u32.checked_shl(retry).unwrap_or(u32::MAX)).min(self.max_backoff);
        // `RandomState` draws fresh keys from the host's random source; that
        // is plenty for jitter and needs no extra dependency.
        let random = RandomState::new().hash_one(retry);
        let factor = 0.5 + (random % 1000) as f64 / 2000.0;
        step.mul_f64(factor)
    }
}

impl Default for Retry {
    /// Four retries, starting at one second and doubling up to 16 seconds,
    /// never more than 30 seconds of waiting in total.
    fn default() -> Self {
        Self {
            max_retries: 4,
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(16),
            max_total_wait: Duration::from_secs(30),
        }
    }
}

/// Statuses worth another attempt of an idempotent request.
fn is_transient(status: u16) -> bool {
    matches!(status, 408 | 500 | 502 | 503 | 504)
}

/// The provider's answer.
#[derive(Debug, Clone)]
pub struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// `METHOD url-without-query`, for error messages.
    request: String,
}

impl Response {
    pub(crate) fn from_parts(status: u16, headers: Vec<(String, String)>, body: Vec<u8>, request: String) -> Self {
        Self { status, headers, body, request }
    }

    /// The HTTP status code.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The first value of a header; names compare case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// All headers, names in lowercase.
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// The body as bytes.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The body as text, checked once and not copied: for parsing JSON that
    /// borrows from it (records cut out of a page as they are, with
    /// [`RawValue`](serde_json::value::RawValue)), where [`Response::json`]
    /// would copy them out. A body that is not UTF-8 is an
    /// [`Error::ProviderError`] naming the request (without its query).
    pub fn into_text(self) -> Result<String> {
        let request = self.request;
        String::from_utf8(self.body).map_err(|e| {
            Error::ProviderError(format!(
                "unexpected response to {request}: the body is not UTF-8 text (at byte {})",
                e.utf8_error().valid_up_to()
            ))
        })
    }

    /// The body as text; invalid UTF-8 is replaced, not an error.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Parses the body as JSON into `T`. A body that does not fit is an
    /// [`Error::ProviderError`] naming the request (without its query).
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(&self.body).map_err(|e| {
            Error::ProviderError(format!("unexpected response to {}: {}", self.request, redact_quoted(&e.to_string())))
        })
    }

    /// How long the provider asked to wait (`Retry-After`, in seconds or as
    /// an HTTP date).
    pub fn retry_after(&self) -> Option<Duration> {
        connector_rules::retry_after::parse(self.header("retry-after")?, SystemTime::now())
    }

    /// Passes 1xx–3xx answers through and turns 4xx/5xx into the matching
    /// [`Error`].
    pub fn error_for_status(self) -> Result<Self> {
        if self.status < 400 {
            return Ok(self);
        }
        let what = format!("HTTP {} from {}", self.status, self.request);
        let detail = self.provider_message().map(|m| format!(": {m}")).unwrap_or_default();
        Err(match self.status {
            401 => Error::InvalidCredentials(format!("the provider rejected the credential ({what}){detail}")),
            403 => Error::PermissionDenied(format!("{what}{detail}")),
            429 => Error::RateLimited {
                retry_after: self.retry_after().map(|d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX)),
            },
            408 | 500..=599 => Error::ProviderUnavailable(what),
            _ => Error::ProviderError(format!("{what}{detail}")),
        })
    }

    /// The short message providers put in JSON error bodies
    /// (`{"message": ...}` or `{"error": ...}`), shortened.
    fn provider_message(&self) -> Option<String> {
        let body: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
        let message = ["/message", "/error", "/error/message", "/error_description"]
            .iter()
            .find_map(|pointer| body.pointer(pointer)?.as_str())?;
        Some(truncate(message.trim(), MAX_PROVIDER_MESSAGE))
    }
}

/// Why the host produced no response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// The egress policy refused the request; carries the rule.
    Denied(String),
    /// The request is malformed (or was built with a mistake, such as a
    /// reserved header).
    InvalidRequest(String),
    /// No complete answer within the timeout.
    Timeout,
    /// DNS, TCP or TLS failed.
    ConnectionFailed(String),
    /// The answer exceeded the host's size limit.
    ResponseTooLarge,
    /// The credential handle cannot be used for this request.
    CredentialUnavailable(String),
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::Denied(rule) => write!(f, "request refused by the egress policy: {rule}"),
            HttpError::InvalidRequest(m) => write!(f, "invalid request: {m}"),
            HttpError::Timeout => f.write_str("the request timed out"),
            HttpError::ConnectionFailed(m) => write!(f, "connection failed: {m}"),
            HttpError::ResponseTooLarge => f.write_str("the response exceeded the host's size limit"),
            HttpError::CredentialUnavailable(m) => write!(f, "credential unavailable: {m}"),
        }
    }
}

impl std::error::Error for HttpError {}

impl From<HttpError> for Error {
    fn from(e: HttpError) -> Self {
        match e {
            HttpError::Denied(rule) => Error::EgressDenied(rule),
            // A malformed request is a connector bug, not the user's doing.
            HttpError::InvalidRequest(m) => Error::Internal(format!("invalid request: {m}")),
            HttpError::Timeout => Error::ProviderUnavailable("the request timed out".into()),
            HttpError::ConnectionFailed(m) => Error::ProviderUnavailable(format!("connection failed: {m}")),
            HttpError::ResponseTooLarge => {
                Error::ProviderError("the response exceeded the host's size limit; request smaller pages".into())
            }
            HttpError::CredentialUnavailable(m) => Error::InvalidCredentials(m),
        }
    }
}

/// `GET https://host/path`, leaving out the query (it may carry filters
/// with personal data) so the text can go into errors and logs.
fn describe_request(method: Method, url: &str) -> String {
    let end = url.find(['?', '#']).unwrap_or(url.len());
    format!("{} {}", method.as_str(), &url[..end])
}

/// `https://host[:port]` of an absolute URL, read as the host reads it
/// ([`crate::origin`]).
pub(crate) fn origin(url: &str) -> Option<String> {
    crate::origin::origin(url)
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode_into(out: &mut String, text: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push('%');
            out.push(HEX[usize::from(byte >> 4)] as char);
            out.push(HEX[usize::from(byte & 0xf)] as char);
        }
    }
}

fn truncate(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// Replaces the contents of double-quoted strings: serde quotes the
/// offending value in its messages, and that value is provider data.
fn redact_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut inside = false;
    for c in message.chars() {
        if c == '"' {
            if inside {
                out.push('…');
            }
            inside = !inside;
            out.push(c);
        } else if !inside {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16, headers: &[(&str, &str)], body: &str) -> Response {
        Response::from_parts(
            status,
            headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
            body.as_bytes().to_vec(),
            "GET https://api.example.com/things".into(),
        )
    }

    #[test]
    fn status_401_is_invalid_credentials() {
        let err = response(401, &[], r#"{"message":"Unauthenticated."}"#).error_for_status().unwrap_err();
        assert!(matches!(err, Error::InvalidCredentials(m) if m.contains("Unauthenticated.")));
    }

    #[test]
    fn status_403_is_permission_denied() {
        let err = response(403, &[], "").error_for_status().unwrap_err();
        assert!(matches!(err, Error::PermissionDenied(_)));
    }

    #[test]
    fn status_429_is_rate_limited_with_retry_after() {
        let err = response(429, &[("retry-after", "17")], "").error_for_status().unwrap_err();
        assert_eq!(err, Error::RateLimited { retry_after: Some(17) });
    }

    #[test]
    fn status_5xx_is_provider_unavailable() {
        for status in [500, 502, 503, 504] {
            let err = response(status, &[], "").error_for_status().unwrap_err();
            assert!(matches!(err, Error::ProviderUnavailable(_)), "{status}");
        }
    }

    #[test]
    fn other_4xx_is_provider_error_with_shortened_message() {
        let long = "x".repeat(500);
        let err = response(422, &[], &format!(r#"{{"message":"{long}"}}"#)).error_for_status().unwrap_err();
        let Error::ProviderError(message) = err else { panic!("{err:?}") };
        assert!(message.starts_with("HTTP 422 from GET https://api.example.com/things: xxx"));
        assert!(message.chars().count() < 300);
    }

    #[test]
    fn success_and_redirect_statuses_pass() {
        assert!(response(200, &[], "").error_for_status().is_ok());
        assert!(response(304, &[], "").error_for_status().is_ok());
    }

    #[test]
    fn a_body_is_taken_as_text_only_when_it_is_utf8() {
        let text = response(200, &[], r#"{"data":["é"]}"#).into_text().unwrap();
        assert_eq!(text, r#"{"data":["é"]}"#);
        let mut bad = response(200, &[], "");
        bad.body = b"{\"id\":\"qq\xffqq\"}".to_vec();
        let err = bad.into_text().unwrap_err().to_string();
        assert!(err.contains("GET https://api.example.com/things: the body is not UTF-8 text (at byte 9)"), "{err}");
        assert!(!err.contains("qq"), "no provider value in the message: {err}");
    }

    #[test]
    fn json_errors_do_not_repeat_provider_values() {
        let err = response(200, &[], r#"{"id":"alice@example.com"}"#)
            .json::<std::collections::HashMap<String, u32>>()
            .unwrap_err();
        let Error::ProviderError(message) = err else { panic!("{err:?}") };
        assert!(!message.contains("alice"), "{message}");
    }

    #[test]
    fn header_lookup_ignores_case() {
        assert_eq!(response(200, &[("x-ratelimit-remaining", "5")], "").header("X-RateLimit-Remaining"), Some("5"));
    }

    #[test]
    fn query_parameters_are_percent_encoded() {
        let request =
            Http::get("https://api.example.com/campaigns").query("filter[status]", "sent").query("q", "a b&c");
        assert_eq!(request.url(), "https://api.example.com/campaigns?filter%5Bstatus%5D=sent&q=a%20b%26c");
    }

    #[test]
    fn reserved_headers_are_refused_before_sending() {
        let request = Http::get("https://api.example.com/").header("Authorization", "Bearer x");
        assert!(matches!(request.send_raw(), Err(HttpError::InvalidRequest(m)) if m.contains("credential")));
    }

    #[test]
    fn only_a_query_or_body_credential_reaches_for_the_newer_interface() {
        let query = Http::get("https://a.example/").credential_in_query("h", "api_key");
        assert_eq!(query.credentials, [("h".to_owned(), CredentialPlace::Query("api_key".into()))]);
        assert!(query.wire.is_some());
        let body = Http::post("https://a.example/").credential_in_body("h", "/auth/password");
        assert_eq!(body.credentials, [("h".to_owned(), CredentialPlace::BodyField("/auth/password".into()))]);
        assert!(body.wire.is_some());
        let placed = query.credential("h", Placement::Bearer);
        assert_eq!(placed.credentials, [("h".to_owned(), CredentialPlace::Placed(Placement::Bearer))]);
        assert!(placed.wire.is_none(), "a placement 1.0.0 can say goes through 1.0.0");
        assert!(Http::get("https://a.example/").wire.is_none());
    }

    #[test]
    fn only_a_second_credential_reaches_for_the_interface_that_takes_several() {
        let one = Http::get("https://a.example/").credential("a", Placement::Header("x-api-key".into()));
        let two = one.clone().and_credential("b", CredentialPlace::Placed(Placement::Header("x-app-key".into())));
        assert_eq!(two.credentials.len(), 2);
        assert!(std::ptr::eq(two.wire.unwrap(), &convert::WIRE_1_3));
        // The same handle again: its place replaced.
        let again = two.and_credential("b", CredentialPlace::Query("key".into()));
        assert_eq!(again.credentials[1], ("b".to_owned(), CredentialPlace::Query("key".into())));
        assert_eq!(again.credentials.len(), 2);
        // The single-credential methods name the one credential.
        let single = again.credential_in_query("c", "key");
        assert_eq!(single.credentials, [("c".to_owned(), CredentialPlace::Query("key".into()))]);
        assert!(std::ptr::eq(single.wire.unwrap(), &convert::WIRE_1_2));
    }

    #[test]
    fn header_replaces_a_header_of_the_same_name() {
        let request = Http::get("https://api.example.com/").header("Accept", "text/csv");
        assert_eq!(request.headers, [("accept".to_string(), "text/csv".to_string())]);
    }

    #[test]
    fn backoff_grows_and_stays_within_bounds() {
        let policy = Retry::default();
        for retry in 0..10 {
            let step = Duration::from_secs(1u64 << retry.min(4));
            let wait = policy.backoff(retry);
            assert!(wait >= step / 2 && wait < step, "retry {retry}: {wait:?}");
        }
    }

    #[test]
    fn rate_limits_are_retried_for_every_method_after_retry_after() {
        let limited = Ok(response(429, &[("retry-after", "3")], ""));
        for request in [Http::get("https://a.example/"), Http::post("https://a.example/")] {
            assert_eq!(request.wait_before_retry(&limited, 0), Some(Duration::from_secs(3)));
        }
    }

    #[test]
    fn server_errors_and_timeouts_are_retried_only_when_idempotent() {
        let (get, post) = (Http::get("https://a.example/"), Http::post("https://a.example/"));
        for outcome in [Ok(response(503, &[], "")), Err(HttpError::Timeout)] {
            assert!(get.wait_before_retry(&outcome, 0).is_some());
            assert_eq!(post.wait_before_retry(&outcome, 0), None);
        }
    }

    #[test]
    fn client_errors_and_refusals_are_not_retried() {
        let get = Http::get("https://a.example/");
        assert_eq!(get.wait_before_retry(&Ok(response(404, &[], "")), 0), None);
        assert_eq!(get.wait_before_retry(&Err(HttpError::Denied("host".into())), 0), None);
    }

    #[test]
    fn post_is_not_idempotent() {
        assert!(!Method::Post.is_idempotent());
        assert!(Method::Get.is_idempotent() && Method::Put.is_idempotent() && Method::Delete.is_idempotent());
    }

    #[test]
    fn origin_is_scheme_and_authority() {
        assert_eq!(origin("https://API.example.com:8443/x?y").as_deref(), Some("https://api.example.com:8443"));
        assert_eq!(origin("https://API.example.com:443/x?y").as_deref(), Some("https://api.example.com"));
        assert_eq!(origin("/relative"), None);
    }
}
