//! The requests the runtime makes and the answers it reads, in plain
//! terms a transport (the plugin's host calls, a test's client) sends:
//! URLs joined as the CDK joins them, the secret's place named instead of
//! the secret, and answers classified as the CDK's error handlers do.

use crate::interpolation::{Context, Val};
pub use crate::model::request::TokenTerms;
use crate::model::request::{Action, Backoff, DefaultHandler, ErrorHandler};

/// An HTTP method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
}

/// A request, with every part rendered and no secret in it.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub method: Method,
    /// The URL, with any query the manifest wrote into it.
    pub url: String,
    /// Query parameters to add, in order.
    pub query: Vec<(String, String)>,
    pub headers: Vec<(String, String)>,
    pub body: Body,
    /// The secrets the host places, each in a place of its own.
    pub credentials: Vec<Credential>,
}

/// A request body.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    None,
    Json(serde_json::Value),
    Form(Vec<(String, String)>),
    Text(String),
}

/// A secret the host puts into the request: which configuration field
/// (a JSON pointer) and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub pointer: String,
    pub place: Place,
}

/// Where the host puts a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// `Authorization: Bearer <secret>`.
    Bearer,
    /// The whole value of this header.
    Header(String),
    /// The value of this query parameter.
    Query(String),
    /// The value of this body field.
    BodyField(String),
    /// The password of HTTP Basic with this username.
    Basic { username: String },
    /// This header's value, the secret between a fixed prefix and suffix
    /// (`Authorization: Token token="<secret>"`).
    HeaderAround { header: String, prefix: String, suffix: String },
    /// The username of HTTP Basic with this (non-secret) password.
    BasicUsername { password: String },
    /// Both the username and the password of HTTP Basic.
    BasicBoth,
    /// HTTP Basic whose username is this credential's field and whose
    /// password is another secret field (`password`, a JSON pointer): one
    /// credential holds the pair, `username:password`.
    BasicPair { password: String },
    /// A bearer token the host obtains at `token_url` by an OAuth
    /// `grant`: this field is the client's secret, its id is `client_id`
    /// or, when that is a secret field too, the field `client_id_field`
    /// of the same credential.
    OAuthClient {
        token_url: String,
        client_id: String,
        client_id_field: Option<String>,
        grant: OAuthGrant,
        terms: TokenTerms,
    },
    /// In the URL's path: the request's URL holds
    /// `connector_rules::path::CREDENTIAL_MARKER` where it goes.
    UrlPath,
    /// A session token the host logs in for: it `POST`s a JSON body of
    /// `username` (at `username_field`) and this field, the password (at
    /// `password_field`), to `login_url`, reads the token at
    /// `token_pointer` of the answer, and sends it in `header` (as a
    /// bearer token without one), logging in again after
    /// `lifetime_secs` (unset: when the answer's `expires_in` says, or
    /// the host's default) or when the API refuses it.
    SessionLogin {
        login_url: String,
        username: String,
        username_field: String,
        password_field: String,
        token_pointer: String,
        header: Option<String>,
        lifetime_secs: Option<u64>,
    },
}

/// How the host obtains an OAuth access token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OAuthGrant {
    /// The client's id and secret alone.
    ClientCredentials,
    /// A refresh token too: the secret field `field`, which the same
    /// credential holds.
    RefreshToken { field: String },
    /// The refresh-token grant with an empty refresh token (a manifest's
    /// `refresh_token: ""`): the client's id and secret alone.
    EmptyRefreshToken,
}

impl Place {
    /// The other secret fields sent with this one, inside the same
    /// credential: both name its handle.
    pub fn fields_beside(&self) -> Vec<&String> {
        match self {
            Place::BasicPair { password } => vec![password],
            Place::OAuthClient { client_id_field, grant, .. } => {
                let refresh = match grant {
                    OAuthGrant::RefreshToken { field } => Some(field),
                    OAuthGrant::ClientCredentials | OAuthGrant::EmptyRefreshToken => None,
                };
                client_id_field.iter().chain(refresh).collect()
            }
            _ => Vec::new(),
        }
    }

    /// The part of a request the secret takes (a header by its lower-case
    /// name, a query parameter, a body field): two secrets of one request
    /// may not share one.
    pub fn part(&self) -> (&'static str, String) {
        match self {
            Place::Bearer
            | Place::Basic { .. }
            | Place::BasicUsername { .. }
            | Place::BasicBoth
            | Place::BasicPair { .. }
            | Place::OAuthClient { .. }
            | Place::SessionLogin { header: None, .. } => ("header", "authorization".into()),
            Place::SessionLogin { header: Some(h), .. } => ("header", h.to_ascii_lowercase()),
            Place::Header(h) | Place::HeaderAround { header: h, .. } => ("header", h.to_ascii_lowercase()),
            Place::Query(q) => ("query parameter", q.to_ascii_lowercase()),
            Place::BodyField(f) => ("body field", f.trim_start_matches('/').to_owned()),
            Place::UrlPath => ("URL path", String::new()),
        }
    }
}

/// An answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// A header's value (names compare case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// `url_base` and `path` joined as the CDK's `_join_url`: the path
/// resolved against the base (with a `/` added to it), as `urljoin` does.
pub fn join_url(base: &str, path: &str) -> String {
    if path.is_empty() {
        return base.to_owned();
    }
    let base = if base.ends_with('/') { base.to_owned() } else { format!("{base}/") };
    urljoin(&base, path)
}

/// Python's `urljoin` for the cases a manifest meets: an absolute URL
/// replaces the base, `//host` keeps the scheme, `/path` keeps the
/// origin, `?query` keeps the path, and a relative path replaces the
/// base's last segment, dot segments removed.
pub fn urljoin(base: &str, reference: &str) -> String {
    if reference.is_empty() {
        return base.to_owned();
    }
    if let Some(colon) = reference.find(':') {
        let scheme = &reference[..colon];
        if !scheme.is_empty()
            && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
            && scheme.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && !base.starts_with(&format!("{scheme}:"))
        {
            return reference.to_owned();
        }
        if let Some(rest) = reference.strip_prefix(&format!("{scheme}:"))
            && base.starts_with(&format!("{scheme}:"))
            && rest.starts_with("//")
        {
            return reference.to_owned();
        }
    }
    let (scheme, after_scheme) = match base.find("://") {
        Some(i) => (&base[..i], &base[i + 3..]),
        None => ("", base),
    };
    if let Some(authority_path) = reference.strip_prefix("//") {
        return format!("{scheme}://{authority_path}");
    }
    let authority_end = after_scheme.find(['/', '?', '#']).unwrap_or(after_scheme.len());
    let origin = format!("{scheme}://{}", &after_scheme[..authority_end]);
    let rest = &after_scheme[authority_end..];
    let base_path = &rest[..rest.find(['?', '#']).unwrap_or(rest.len())];
    if reference.starts_with('?') {
        return format!("{origin}{base_path}{reference}");
    }
    if reference.starts_with('#') {
        let no_fragment = &base[..base.find('#').unwrap_or(base.len())];
        return format!("{no_fragment}{reference}");
    }
    let (ref_path, ref_tail) = match reference.find(['?', '#']) {
        Some(i) => (&reference[..i], &reference[i..]),
        None => (reference, ""),
    };
    let merged = if ref_path.starts_with('/') {
        ref_path.to_owned()
    } else {
        let dir = &base_path[..base_path.rfind('/').map_or(0, |i| i + 1)];
        let dir = if dir.is_empty() { "/" } else { dir };
        format!("{dir}{ref_path}")
    };
    format!("{origin}{}{ref_tail}", remove_dot_segments(&merged))
}

fn remove_dot_segments(path: &str) -> String {
    if !path.split('/').any(|s| s == "." || s == "..") {
        return path.to_owned();
    }
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path.split('/').collect();
    for (i, s) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *s {
            "." => {
                if last {
                    out.push("");
                }
            }
            ".." => {
                if out.len() > 1 {
                    out.pop();
                }
                if last {
                    out.push("");
                }
            }
            other => out.push(other),
        }
    }
    out.join("/")
}

/// What to do with an answer, as the requester's error handler decides.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Success,
    Ignore,
    /// Try again after this many seconds (at most `retries` times).
    Retry {
        wait: f64,
        retries: u32,
    },
    Fail(String),
}

/// The CDK's resolution of a status no filter matched: success for 2xx,
/// failure for the client errors it maps, a retry for anything else.
fn default_action(status: u16) -> Action {
    match status {
        200..=299 => Action::Success,
        400 | 401 | 403 | 404 | 405 => Action::Fail,
        429 => Action::RateLimited,
        _ => Action::Retry,
    }
}

/// One `DefaultErrorHandler`'s resolution: its first matching filter,
/// else the default.
fn interpret(h: &DefaultHandler, response: &Response, config: &Val, ctx: &Context) -> Action {
    // The body as text only for a filter that searches it (a page may
    // be megabytes).
    let text = std::cell::OnceCell::new();
    let text = || text.get_or_init(|| String::from_utf8_lossy(&response.body));
    for f in &h.filters {
        let predicate = || {
            f.predicate.as_ref().is_some_and(|p| {
                let body: Val = serde_json::from_slice(&response.body).unwrap_or(Val::Dict(Vec::new()));
                let headers =
                    Val::Dict(response.headers.iter().map(|(k, v)| (k.clone(), Val::Str(v.clone()))).collect());
                let ctx = ctx
                    .clone()
                    .with("config", config.clone())
                    .with("parameters", f.parameters.clone())
                    .with("response", body)
                    .with("headers", headers);
                crate::paginate::condition(p, &ctx).unwrap_or(false)
            })
        };
        let contains = || f.error_message_contains.as_deref().is_some_and(|m| text().contains(m));
        if f.http_codes.contains(&response.status) || predicate() || contains() {
            return f.action;
        }
    }
    default_action(response.status)
}

/// The verdict on `response` after `attempt` earlier tries, `now` the
/// transport's Unix time: the first handler of a composite that does not
/// fail decides, else the last.
pub fn classify(
    handler: &ErrorHandler,
    response: &Response,
    config: &Val,
    ctx: &Context,
    attempt: u32,
    now: f64,
) -> Verdict {
    let none = DefaultHandler::default();
    let handlers: Vec<&DefaultHandler> =
        if handler.handlers.is_empty() { vec![&none] } else { handler.handlers.iter().collect() };
    let mut decided = (Action::Fail, handlers[0]);
    for h in handlers {
        decided = (interpret(h, response, config, ctx), h);
        if decided.0 != Action::Fail {
            break;
        }
    }
    finish(decided.0, decided.1, response, attempt, now)
}

fn finish(action: Action, handler: &DefaultHandler, response: &Response, attempt: u32, now: f64) -> Verdict {
    match action {
        Action::Success => Verdict::Success,
        Action::Ignore => Verdict::Ignore,
        Action::Fail => Verdict::Fail(format!("the provider answered {}", response.status)),
        Action::Retry | Action::RateLimited => {
            let retries = handler.max_retries.unwrap_or(5);
            // The first strategy that names a wait decides, as the CDK's.
            let mut wait = None;
            for strategy in &handler.backoff {
                match backoff(strategy, response, attempt, now) {
                    Ok(Some(w)) if w > 0.0 => {
                        wait = Some(w);
                        break;
                    }
                    Ok(_) => {}
                    Err(fail) => return fail,
                }
            }
            let wait = wait.unwrap_or_else(|| {
                if handler.backoff.is_empty()
                    && let Some(w) = numeric_header(response, "retry-after")
                {
                    return w;
                }
                5.0 * 2f64.powi(attempt as i32)
            });
            Verdict::Retry { wait, retries }
        }
    }
}

/// The wait one strategy names, if it names one; the failure of a wait
/// longer than the stream may wait.
fn backoff(strategy: &Backoff, response: &Response, attempt: u32, now: f64) -> Result<Option<f64>, Verdict> {
    Ok(match strategy {
        Backoff::Constant(s) => Some(*s),
        Backoff::Exponential(factor) => Some(factor * 2f64.powi(attempt as i32)),
        Backoff::FromHeader { header, max } => {
            let wait = numeric_header(response, header);
            if let (Some(w), Some(max)) = (wait, max)
                && w >= *max
            {
                return Err(Verdict::Fail(format!(
                    "the provider asks for a wait of {w} s, longer than the stream's limit of {max} s"
                )));
            }
            wait
        }
        Backoff::UntilTimeFromHeader { header, min } => match numeric_header(response, header) {
            None => *min,
            Some(until) => {
                let wait = until - now;
                match min {
                    Some(min) => Some(wait.max(*min)),
                    None if wait < 0.0 => None,
                    None => Some(wait),
                }
            }
        },
    })
}

/// A header's value as a number of seconds (or a Unix time).
fn numeric_header(response: &Response, name: &str) -> Option<f64> {
    response.header(name).and_then(|v| v.trim().parse::<f64>().ok()).filter(|v| v.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_join_as_python_joins_them() {
        assert_eq!(join_url("https://a.io/api/", "users"), "https://a.io/api/users");
        assert_eq!(join_url("https://a.io/api", "users"), "https://a.io/api/users");
        assert_eq!(join_url("https://a.io/api", ""), "https://a.io/api");
        assert_eq!(join_url("https://a.io/api/v1", "/users?x=1"), "https://a.io/users?x=1");
        assert_eq!(join_url("https://a.io/api", "https://b.io/next?p=2"), "https://b.io/next?p=2");
        assert_eq!(join_url("https://a.io/api", "?page=2"), "https://a.io/api/?page=2");
        assert_eq!(join_url("https://a.io/api/v1", "../v2/x"), "https://a.io/api/v2/x");
        assert_eq!(join_url("https://a.io", "users/1"), "https://a.io/users/1");
        assert_eq!(join_url("https://a.io/api", "//c.io/x"), "https://c.io/x");
    }

    fn answer(headers: &[(&str, &str)]) -> Response {
        Response {
            status: 429,
            headers: headers.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            body: Vec::new(),
        }
    }

    fn handler(backoff: Vec<Backoff>) -> DefaultHandler {
        DefaultHandler { filters: Vec::new(), backoff, max_retries: None }
    }

    fn wait(h: &DefaultHandler, response: &Response, now: f64) -> Verdict {
        finish(Action::RateLimited, h, response, 1, now)
    }

    #[test]
    fn the_first_strategy_that_names_a_wait_decides() {
        let until = Backoff::UntilTimeFromHeader { header: "X-Reset".into(), min: None };
        let h = handler(vec![until.clone(), Backoff::Constant(7.0)]);
        // The provider's reset time, 30 s from now.
        assert_eq!(wait(&h, &answer(&[("x-reset", "1030")]), 1000.0), Verdict::Retry { wait: 30.0, retries: 5 });
        // A reset time gone by, or none: the next strategy.
        assert_eq!(wait(&h, &answer(&[("x-reset", "900")]), 1000.0), Verdict::Retry { wait: 7.0, retries: 5 });
        assert_eq!(wait(&h, &answer(&[]), 1000.0), Verdict::Retry { wait: 7.0, retries: 5 });
        // At least the minimum, with or without the header.
        let min = handler(vec![Backoff::UntilTimeFromHeader { header: "X-Reset".into(), min: Some(60.0) }]);
        assert_eq!(wait(&min, &answer(&[("x-reset", "1030")]), 1000.0), Verdict::Retry { wait: 60.0, retries: 5 });
        assert_eq!(wait(&min, &answer(&[]), 1000.0), Verdict::Retry { wait: 60.0, retries: 5 });
        // No strategy names one: the CDK's exponential default.
        assert_eq!(wait(&handler(vec![until]), &answer(&[]), 1000.0), Verdict::Retry { wait: 10.0, retries: 5 });
    }

    #[test]
    fn a_wait_past_the_streams_limit_fails_the_read() {
        let h = handler(vec![Backoff::FromHeader { header: "Retry-After".into(), max: Some(120.0) }]);
        assert_eq!(wait(&h, &answer(&[("retry-after", "30")]), 0.0), Verdict::Retry { wait: 30.0, retries: 5 });
        assert!(matches!(wait(&h, &answer(&[("retry-after", "120")]), 0.0), Verdict::Fail(m) if m.contains("120")));
    }
}
