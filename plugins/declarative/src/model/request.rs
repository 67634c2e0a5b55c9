//! The requester's components: where a value goes in a request
//! (`RequestOption`, `RequestPath`), the request's parameters, headers and
//! bodies as written, the authenticator, and the error handler.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::node::{Node, Refusal, template_of};
use crate::datetime::Gap;
use crate::interpolation::{Context, Template, Val};

/// Where a request option puts its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inject {
    Parameter,
    Header,
    BodyJson,
    BodyData,
}

/// A `RequestOption`: a value set in one place of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestOption {
    pub inject: Inject,
    pub field: OptionField,
    pub parameters: Val,
}

/// The option's field: a name, or (for JSON bodies) a path.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionField {
    Name(Template),
    Path(Vec<Template>),
}

impl RequestOption {
    pub(crate) fn read(node: &Node) -> Result<RequestOption, Refusal> {
        node.expect(&["RequestOption"], &[])?;
        let inject = match node.text("inject_into")? {
            Some("request_parameter") => Inject::Parameter,
            Some("header") => Inject::Header,
            Some("body_json") => Inject::BodyJson,
            Some("body_data") => Inject::BodyData,
            Some(other) => {
                return Err(Refusal::new(node.below("inject_into"), format!("inject_into {other} is not a place")));
            }
            None => return Err(Refusal::new(node.pointer(), "a RequestOption needs inject_into")),
        };
        // An empty name or path is none, as the CDK reads it.
        let given = |key: &str| {
            node.get(key).filter(|v| !matches!(v, Value::String(s) if s.is_empty()) && v.as_array() != Some(&vec![]))
        };
        let field = match (given("field_name"), given("field_path")) {
            (Some(name), None) => OptionField::Name(template_of(name, &node.below("field_name"))?),
            (None, Some(Value::Array(path))) if inject == Inject::BodyJson => OptionField::Path(
                path.iter()
                    .enumerate()
                    .map(|(i, s)| template_of(s, &format!("{}/{i}", node.below("field_path"))))
                    .collect::<Result<_, _>>()?,
            ),
            (None, Some(_)) => {
                return Err(Refusal::new(node.below("field_path"), "field_path is for body_json only, as a list"));
            }
            _ => return Err(Refusal::new(node.pointer(), "a RequestOption needs one of field_name or field_path")),
        };
        Ok(RequestOption { inject, field, parameters: node.parameters_val() })
    }
}

/// Refuses a paginator's page size and token options that set the same
/// key, as the CDK refuses to build them: a request could not hold both
/// values.
pub(crate) fn refuse_clash(
    pointer: &str,
    [(first_name, first), (second_name, second)]: [(&str, Option<&RequestOption>); 2],
    ctx: &Context,
) -> Result<(), Refusal> {
    let (Some(first), Some(second)) = (first, second) else { return Ok(()) };
    if first.inject != second.inject {
        return Ok(());
    }
    // Field names the configuration alone cannot name are left to the
    // request, which refuses a key given twice.
    let (Some(a), Some(b)) = (first.keys(ctx), second.keys(ctx)) else { return Ok(()) };
    let shorter = a.len().min(b.len());
    let clash = match first.inject {
        // A JSON body nests: one path inside the other clashes.
        Inject::BodyJson => a[..shorter] == b[..shorter],
        _ => a == b,
    };
    if !clash {
        return Ok(());
    }
    let place = match first.inject {
        Inject::Parameter => "the request parameters",
        Inject::Header => "the headers",
        Inject::BodyJson => "the JSON body",
        Inject::BodyData => "the form body",
    };
    Err(Refusal::new(
        pointer,
        format!("{first_name} and {second_name} both set `{}` in {place}: a request cannot hold both", b.join(".")),
    ))
}

impl RequestOption {
    /// The keys the option sets, its names evaluated with the
    /// configuration and its parameters.
    pub(crate) fn keys(&self, ctx: &Context) -> Option<Vec<String>> {
        let ctx = ctx.clone().with("parameters", self.parameters.clone());
        let name = |t: &Template| t.eval_string(&ctx).ok().map(|v| v.to_text());
        match &self.field {
            OptionField::Name(t) => Some(vec![name(t)?]),
            OptionField::Path(path) if !path.is_empty() => path.iter().map(name).collect(),
            OptionField::Path(_) => None,
        }
    }
}

/// The page token's place: an option, or the path of the next request.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenOption {
    Option(RequestOption),
    Path,
}

impl TokenOption {
    pub(crate) fn read(node: &Node) -> Result<TokenOption, Refusal> {
        match node.kind() {
            "RequestPath" => {
                node.expect(&["RequestPath"], &[])?;
                Ok(TokenOption::Path)
            }
            _ => RequestOption::read(node).map(TokenOption::Option),
        }
    }
}

/// Parameters, headers or a form body as written: a mapping of templates,
/// or one template (a body sent as text).
#[derive(Debug, Clone, PartialEq, Default)]
pub enum RequestInput {
    #[default]
    Empty,
    Mapping(Vec<(Template, Entry)>),
    Text(Template),
}

/// A mapping's value: a template, or any other JSON value as it is.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    Template(Template),
    Literal(Value),
}

impl RequestInput {
    pub(crate) fn read(node: &Node, key: &str) -> Result<RequestInput, Refusal> {
        let at = node.below(key);
        match node.get(key) {
            None => Ok(RequestInput::Empty),
            Some(Value::String(s)) if s.is_empty() => Ok(RequestInput::Empty),
            Some(Value::String(s)) => Ok(RequestInput::Text(template_of(&Value::String(s.clone()), &at)?)),
            Some(Value::Object(map)) => Ok(RequestInput::Mapping(
                map.iter()
                    .map(|(k, v)| {
                        let pointer = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                        let name = Template::parse(k)
                            .map_err(|e| Refusal::new(pointer.clone(), format!("the name is {e}")))?;
                        let entry = match v {
                            Value::String(_) => Entry::Template(template_of(v, &pointer)?),
                            other => Entry::Literal(other.clone()),
                        };
                        Ok((name, entry))
                    })
                    .collect::<Result<_, Refusal>>()?,
            )),
            Some(_) => Err(Refusal::new(at, "expected a mapping or a string")),
        }
    }
}

/// A JSON body as written: any JSON value, its strings templates.
#[derive(Debug, Clone, PartialEq)]
pub enum Nested {
    Template(Template),
    Literal(Value),
    List(Vec<Nested>),
    Object(Vec<(Template, Nested)>),
}

impl Nested {
    pub(crate) fn read(value: &Value, pointer: &str) -> Result<Nested, Refusal> {
        Ok(match value {
            Value::String(_) => Nested::Template(template_of(value, pointer)?),
            Value::Array(items) => Nested::List(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| Nested::read(v, &format!("{pointer}/{i}")))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Object(map) => Nested::Object(
                map.iter()
                    .map(|(k, v)| {
                        let below = format!("{pointer}/{}", k.replace('~', "~0").replace('/', "~1"));
                        let name =
                            Template::parse(k).map_err(|e| Refusal::new(below.clone(), format!("the name is {e}")))?;
                        Ok((name, Nested::read(v, &below)?))
                    })
                    .collect::<Result<_, Refusal>>()?,
            ),
            other => Nested::Literal(other.clone()),
        })
    }
}

/// An HTTP method the requester sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
}

/// How the requester authenticates. Tokens, passwords and keys are
/// templates over the configuration; where they name a secret, the host
/// places it (see [`crate::secrets`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Authenticator {
    None,
    ApiKey {
        token: Template,
        option: RequestOption,
    },
    Bearer {
        token: Template,
    },
    Basic {
        username: Template,
        password: Template,
    },
    /// An `OAuthAuthenticator`: the host trades the client's secret (and,
    /// for the refresh-token grant, the refresh token) for an access token
    /// at the token endpoint and sends it as a bearer token.
    OAuthClient {
        token_url: Template,
        client_id: Template,
        client_secret: Template,
        /// The refresh token of the refresh-token grant; none for the
        /// client-credentials grant.
        refresh_token: Option<Template>,
        /// The scopes asked for and where the answer says the expiry.
        terms: TokenTerms,
    },
    /// A `SessionTokenAuthenticator`: a login request whose answer holds
    /// a session token, which each request then carries. A login that
    /// sends no secret the guest makes itself; one that sends a secret
    /// (its password) the host makes, with the credential that holds it,
    /// and the host puts the token in each request.
    Session(Box<SessionLogin>),
}

/// A session token's login and where the token goes.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionLogin {
    pub login: Requester,
    /// The pointer of the login requester (where a refusal names it).
    pub login_pointer: String,
    /// The token's path in the login's answer.
    pub token_path: Vec<String>,
    /// How long a token is good for; without it, a login before every
    /// request, as the CDK logs in.
    pub expiration: Option<Gap>,
    /// Where the token goes, as it is.
    pub sent: SessionToken,
    /// The pointer of `request_authentication` (where a refusal of the
    /// token's place names it).
    pub sent_pointer: String,
    /// The pointer of the authenticator.
    pub pointer: String,
}

/// Where a session token goes (`request_authentication`).
#[derive(Debug, Clone, PartialEq)]
pub enum SessionToken {
    /// `ApiKey`: as it is, where this option puts it.
    ApiKey(RequestOption),
    /// `Bearer`: `Authorization: Bearer <token>`, which only the host
    /// sets (for a login it makes).
    Bearer,
}

/// What an OAuth token request asks for beyond the grant, and how the
/// endpoint's answer says when the token expires.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenTerms {
    /// Sent as one `scopes` field each, as the CDK sends them.
    pub scopes: Vec<String>,
    /// The answer's field beside the token (`expires_in` when unset).
    pub expiry_field: Option<String>,
    /// Whether that field is the instant it expires, not seconds from now
    /// (the manifest gives a `token_expiry_date_format`).
    pub expiry_is_time: bool,
}

impl Authenticator {
    /// Reads an authenticator (a `SelectiveAuthenticator` as the one
    /// `config` selects), with the pointer of the one read.
    pub(crate) fn read(node: &Node, config: &Val) -> Result<(Authenticator, String), Refusal> {
        if node.kind() != "SelectiveAuthenticator" {
            return Authenticator::read_one(node, config).map(|a| (a, node.pointer().to_owned()));
        }
        node.expect(&["SelectiveAuthenticator"], &[])?;
        let path = match node.get("authenticator_selection_path") {
            Some(Value::Array(items)) => {
                items.iter().map(|i| i.as_str().map(str::to_owned)).collect::<Option<Vec<_>>>()
            }
            _ => None,
        }
        .ok_or_else(|| {
            Refusal::new(node.below("authenticator_selection_path"), "expected a list of configuration keys")
        })?;
        let mut at = config;
        for key in &path {
            at = at.get(key).ok_or_else(|| {
                Refusal::new(
                    node.below("authenticator_selection_path"),
                    format!("the configuration has no value at {}", path.join("/")),
                )
            })?;
        }
        let selected = at.to_text();
        let choice = match node.get("authenticators") {
            Some(Value::Object(map)) if map.contains_key(&selected) => {
                node.child("authenticators").transpose()?.map(|n| n.below(&selected))
            }
            _ => None,
        }
        .ok_or_else(|| {
            Refusal::new(node.below("authenticators"), format!("the authenticator `{selected}` is not found"))
        })?;
        let value = node.get("authenticators").and_then(|m| m.get(&selected)).unwrap_or(&Value::Null);
        let chosen = Node::at(value, choice.clone())?;
        Authenticator::read_one(&chosen, config).map(|a| (a, choice))
    }

    fn read_one(node: &Node, config: &Val) -> Result<Authenticator, Refusal> {
        match node.kind() {
            "SessionTokenAuthenticator" => {
                node.expect(&["SessionTokenAuthenticator"], &[])?;
                if let Some(decoder) = node.child("decoder") {
                    decoder?.expect(&["JsonDecoder"], &[])?;
                }
                let login = node.child("login_requester").ok_or_else(|| {
                    Refusal::new(node.pointer(), "a SessionTokenAuthenticator needs a login_requester")
                })??;
                let token_path = match node.get("session_token_path") {
                    Some(Value::Array(items)) if !items.is_empty() => {
                        items.iter().map(|i| i.as_str().map(str::to_owned)).collect::<Option<Vec<_>>>()
                    }
                    _ => None,
                }
                .ok_or_else(|| {
                    Refusal::new(node.below("session_token_path"), "expected the token's path, a list of keys")
                })?;
                let expiration = match node.text("expiration_duration")? {
                    None => None,
                    Some(text) => Some(
                        Gap::parse(text).map_err(|e| Refusal::new(node.below("expiration_duration"), e.to_string()))?,
                    ),
                };
                let how = node.child("request_authentication").ok_or_else(|| {
                    Refusal::new(node.pointer(), "a SessionTokenAuthenticator needs request_authentication")
                })??;
                // A bearer token only the host sends, for a login it makes
                // (whether it does is known once the login is built).
                let sent = if how.kind() == "Bearer" {
                    how.expect(&["Bearer"], &[])?;
                    SessionToken::Bearer
                } else {
                    // A template around the token (`api_token`) is not
                    // built: refused rather than the bare token sent.
                    how.expect(&["ApiKey"], &["api_token"])?;
                    let option = how
                        .child("inject_into")
                        .ok_or_else(|| Refusal::new(how.pointer(), "the session token's ApiKey needs inject_into"))??;
                    let option = RequestOption::read(&option)?;
                    // The headers that carry credentials are the host's
                    // alone, and the host sends no bare token in one: the
                    // name as the configuration renders it (a template may
                    // name the header too).
                    let ctx = Context::at(DateTime::<Utc>::UNIX_EPOCH).with("config", config.clone());
                    if option.inject == Inject::Header
                        && let Some(name) = option.keys(&ctx).and_then(|k| k.into_iter().next())
                        && connector_rules::headers::is_reserved(name.trim())
                    {
                        return Err(Refusal::new(
                            how.pointer(),
                            format!(
                                "a session token in the {} header: only the host sets that header (for a credential it holds), so the guest cannot send the token there; a login the host makes (its password a secret field) may send it as a bearer token (type Bearer)",
                                name.trim()
                            ),
                        ));
                    }
                    SessionToken::ApiKey(option)
                };
                Ok(Authenticator::Session(Box::new(SessionLogin {
                    login: Requester::read(&login, config)?,
                    login_pointer: login.pointer().to_owned(),
                    token_path,
                    expiration,
                    sent,
                    sent_pointer: how.pointer().to_owned(),
                    pointer: node.pointer().to_owned(),
                })))
            }
            "NoAuth" => {
                node.expect(&["NoAuth"], &[])?;
                Ok(Authenticator::None)
            }
            "ApiKeyAuthenticator" => {
                node.expect(&["ApiKeyAuthenticator"], &[])?;
                let token = node.template("api_token")?.unwrap_or(Template::parse("").map_err(parse_refusal)?);
                let option = match (node.child("inject_into"), node.get("header")) {
                    (Some(option), _) => RequestOption::read(&option?)?,
                    (None, Some(header)) => RequestOption {
                        inject: Inject::Header,
                        field: OptionField::Name(template_of(header, &node.below("header"))?),
                        parameters: node.parameters_val(),
                    },
                    (None, None) => {
                        return Err(Refusal::new(node.pointer(), "an ApiKeyAuthenticator needs inject_into or header"));
                    }
                };
                Ok(Authenticator::ApiKey { token, option })
            }
            "BearerAuthenticator" => {
                node.expect(&["BearerAuthenticator"], &[])?;
                let token = node
                    .template("api_token")?
                    .ok_or_else(|| Refusal::new(node.pointer(), "a BearerAuthenticator needs api_token"))?;
                Ok(Authenticator::Bearer { token })
            }
            "BasicHttpAuthenticator" => {
                node.expect(&["BasicHttpAuthenticator"], &[])?;
                let username = node
                    .template("username")?
                    .ok_or_else(|| Refusal::new(node.pointer(), "a BasicHttpAuthenticator needs username"))?;
                let password = match node.template("password")? {
                    Some(p) => p,
                    None => Template::parse("").map_err(parse_refusal)?,
                };
                Ok(Authenticator::Basic { username, password })
            }
            "OAuthAuthenticator" => {
                // What would change the token request away from the one
                // the host makes (RFC 6749's form, its default names).
                node.expect(
                    &["OAuthAuthenticator"],
                    &[
                        "refresh_request_headers",
                        "profile_assertion",
                        "use_profile_assertion",
                        "client_id_name",
                        "client_secret_name",
                        "grant_type_name",
                        "refresh_token_name",
                        "token_expiry_is_time_of_expiration",
                    ],
                )?;
                // An empty extra body adds nothing to the token request.
                match node.get("refresh_request_body") {
                    None | Some(Value::Null) => {}
                    Some(Value::Object(extra)) if extra.is_empty() => {}
                    Some(_) => {
                        return Err(Refusal::new(
                            node.below("refresh_request_body"),
                            "OAuthAuthenticator.refresh_request_body is not supported yet (the token request is RFC 6749's form)",
                        ));
                    }
                }
                let grant = node.text("grant_type")?.unwrap_or("refresh_token");
                // A provider that rotates refresh tokens: the CDK writes
                // the new one back into the configuration; the host keeps
                // the one the endpoint answers with for every refresh
                // grant, so the updater asks for nothing more, as long as
                // the answer names it as RFC 6749 does.
                if let Some(updater) = node.child("refresh_token_updater").transpose()? {
                    if grant != "refresh_token" {
                        return Err(Refusal::new(
                            updater.pointer(),
                            "a refresh_token_updater belongs to the refresh_token grant",
                        ));
                    }
                    if updater.text("refresh_token_name")?.is_some_and(|n| n != "refresh_token") {
                        return Err(Refusal::new(
                            updater.below("refresh_token_name"),
                            "a rotated refresh token named other than refresh_token is not supported yet",
                        ));
                    }
                }
                let refreshes = match grant {
                    "client_credentials" => false,
                    "refresh_token" => true,
                    other => {
                        return Err(Refusal::new(
                            node.below("grant_type"),
                            format!(
                                "OAuthAuthenticator with the {other} grant is not supported (the client_credentials and refresh_token grants are)"
                            ),
                        ));
                    }
                };
                if node.text("access_token_name")?.is_some_and(|v| v != "access_token") {
                    return Err(Refusal::new(
                        node.below("access_token_name"),
                        "OAuthAuthenticator.access_token_name other than access_token is not supported yet",
                    ));
                }
                let terms = TokenTerms::read(node)?;
                let required = |key: &str| {
                    node.template(key)?
                        .ok_or_else(|| Refusal::new(node.pointer(), format!("an OAuthAuthenticator needs {key}")))
                };
                Ok(Authenticator::OAuthClient {
                    token_url: required("token_refresh_endpoint")?,
                    client_id: required("client_id")?,
                    client_secret: required("client_secret")?,
                    refresh_token: if refreshes { Some(required("refresh_token")?) } else { None },
                    terms,
                })
            }
            _ => Err(node.unsupported_type()),
        }
    }
}

impl TokenTerms {
    /// `scopes` (a list, sent as written), `expires_in_name` and whether a
    /// `token_expiry_date_format` makes it an instant.
    fn read(node: &Node) -> Result<TokenTerms, Refusal> {
        let scopes = match node.get("scopes") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|s| s.as_str().filter(|s| !s.is_empty()).map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| Refusal::new(node.below("scopes"), "expected a list of scope names"))?,
            Some(_) => return Err(Refusal::new(node.below("scopes"), "expected a list of scope names")),
        };
        let name = node.text("expires_in_name")?;
        if let Some(name) = name
            && (name.is_empty() || name.contains("{{") || name.contains("{%") || name.contains('/'))
        {
            return Err(Refusal::new(
                node.below("expires_in_name"),
                "OAuthAuthenticator.expires_in_name must name a field (a template is not supported yet)",
            ));
        }
        let expiry_is_time = node.text("token_expiry_date_format")?.is_some_and(|f| !f.is_empty());
        let expiry_field = match name {
            Some("expires_in") | None if !expiry_is_time => None,
            Some(name) => Some(name.to_owned()),
            None => Some("expires_in".to_owned()),
        };
        Ok(TokenTerms { scopes, expiry_field, expiry_is_time })
    }
}

fn parse_refusal(e: crate::interpolation::InterpolationError) -> Refusal {
    Refusal::new("", e.to_string())
}

/// What the error handler does with an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Success,
    Fail,
    Ignore,
    Retry,
    RateLimited,
}

/// A `HttpResponseFilter`: which answers it matches, and what it does.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseFilter {
    pub action: Action,
    pub http_codes: Vec<u16>,
    pub error_message_contains: Option<String>,
    pub predicate: Option<Template>,
    pub error_message: Option<Template>,
    pub parameters: Val,
}

/// How long to wait before a retry.
#[derive(Debug, Clone, PartialEq)]
pub enum Backoff {
    Constant(f64),
    Exponential(f64),
    /// The seconds the answer's header says; an answer that says more
    /// than `max` fails the read.
    FromHeader {
        header: String,
        max: Option<f64>,
    },
    /// Until the Unix time the answer's header says, at least `min`.
    UntilTimeFromHeader {
        header: String,
        min: Option<f64>,
    },
}

/// The error handler: filters tried in order, then the CDK's defaults.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ErrorHandler {
    /// `DefaultErrorHandler`s of a `CompositeErrorHandler`, in order.
    pub handlers: Vec<DefaultHandler>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct DefaultHandler {
    pub filters: Vec<ResponseFilter>,
    pub backoff: Vec<Backoff>,
    pub max_retries: Option<u32>,
}

impl ErrorHandler {
    pub(crate) fn read(node: &Node) -> Result<ErrorHandler, Refusal> {
        match node.kind() {
            "CompositeErrorHandler" => {
                node.expect(&["CompositeErrorHandler"], &[])?;
                let handlers = node
                    .children("error_handlers")?
                    .iter()
                    .map(|h| match h.kind() {
                        "DefaultErrorHandler" => DefaultHandler::read(h),
                        _ => Err(h.unsupported_type()),
                    })
                    .collect::<Result<_, _>>()?;
                Ok(ErrorHandler { handlers })
            }
            "DefaultErrorHandler" => Ok(ErrorHandler { handlers: vec![DefaultHandler::read(node)?] }),
            _ => Err(node.unsupported_type()),
        }
    }
}

impl DefaultHandler {
    fn read(node: &Node) -> Result<DefaultHandler, Refusal> {
        node.expect(&["DefaultErrorHandler"], &[])?;
        let filters = node.children("response_filters")?.iter().map(ResponseFilter::read).collect::<Result<_, _>>()?;
        let backoff = node
            .children("backoff_strategies")?
            .iter()
            .map(|b| match b.kind() {
                "ConstantBackoffStrategy" => {
                    b.expect(&["ConstantBackoffStrategy"], &[])?;
                    Ok(Backoff::Constant(seconds(b, "backoff_time_in_seconds")?.unwrap_or(5.0)))
                }
                "ExponentialBackoffStrategy" => {
                    b.expect(&["ExponentialBackoffStrategy"], &[])?;
                    Ok(Backoff::Exponential(seconds(b, "factor")?.unwrap_or(5.0)))
                }
                "WaitTimeFromHeader" => {
                    b.expect(&["WaitTimeFromHeader"], &["regex"])?;
                    let header = header_name(b)?;
                    Ok(Backoff::FromHeader { header, max: seconds(b, "max_waiting_time_in_seconds")? })
                }
                "WaitUntilTimeFromHeader" => {
                    b.expect(&["WaitUntilTimeFromHeader"], &["regex"])?;
                    let header = header_name(b)?;
                    Ok(Backoff::UntilTimeFromHeader { header, min: seconds(b, "min_wait")? })
                }
                _ => Err(b.unsupported_type()),
            })
            .collect::<Result<_, _>>()?;
        let max_retries = match node.get("max_retries") {
            None => None,
            Some(Value::Number(n)) => n.as_u64().map(|n| n.min(100) as u32),
            Some(_) => return Err(Refusal::new(node.below("max_retries"), "expected a number")),
        };
        Ok(DefaultHandler { filters, backoff, max_retries })
    }
}

/// The header a backoff strategy reads (a name, not a template).
fn header_name(node: &Node) -> Result<String, Refusal> {
    let header =
        node.text("header")?.ok_or_else(|| Refusal::new(node.pointer(), format!("{} needs header", node.kind())))?;
    if header.contains("{{") || header.contains("{%") {
        return Err(Refusal::new(node.below("header"), "a header name from a template is not supported yet"));
    }
    Ok(header.to_owned())
}

/// A number of seconds (a number, or text holding one).
fn seconds(node: &Node, key: &str) -> Result<Option<f64>, Refusal> {
    match node.get(key) {
        None => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(Value::String(s)) => {
            s.trim().parse::<f64>().map(Some).map_err(|_| {
                Refusal::new(node.below(key), "expected a number of seconds (a template is not supported)")
            })
        }
        Some(_) => Err(Refusal::new(node.below(key), "expected a number")),
    }
}

impl ResponseFilter {
    fn read(node: &Node) -> Result<ResponseFilter, Refusal> {
        node.expect(&["HttpResponseFilter"], &[])?;
        let action = match node.text("action")? {
            Some("SUCCESS") => Action::Success,
            Some("FAIL") | None => Action::Fail,
            Some("IGNORE") => Action::Ignore,
            Some("RETRY") => Action::Retry,
            Some("RATE_LIMITED") => Action::RateLimited,
            Some(other) => {
                return Err(Refusal::new(node.below("action"), format!("the action {other} is not supported")));
            }
        };
        let http_codes = match node.get("http_codes") {
            None => Vec::new(),
            Some(Value::Array(codes)) => codes.iter().filter_map(Value::as_u64).map(|c| c as u16).collect(),
            Some(_) => return Err(Refusal::new(node.below("http_codes"), "expected a list of status codes")),
        };
        Ok(ResponseFilter {
            action,
            http_codes,
            error_message_contains: node.text("error_message_contains")?.map(str::to_owned),
            predicate: node.template("predicate")?,
            error_message: node.template("error_message")?,
            parameters: node.parameters_val(),
        })
    }
}

/// The `HttpRequester`, its templates parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Requester {
    pub url_base: Option<Template>,
    pub path: Option<Template>,
    pub url: Option<Template>,
    pub method: Method,
    pub parameters_input: RequestInput,
    pub headers: RequestInput,
    pub body_json: Option<Nested>,
    pub body_data: RequestInput,
    pub authenticator: Authenticator,
    pub authenticator_pointer: String,
    pub error_handler: ErrorHandler,
    pub parameters: Val,
}

impl Requester {
    /// Reads a requester; `config` picks a `SelectiveAuthenticator`'s
    /// choice, as the CDK picks it when it builds the component.
    pub(crate) fn read(node: &Node, config: &Val) -> Result<Requester, Refusal> {
        node.expect(&["HttpRequester"], &["fetch_properties_from_endpoint", "query_properties", "request_body"])?;
        let method = match node.text("http_method")? {
            None | Some("GET") => Method::Get,
            Some("POST") => Method::Post,
            Some(other) => {
                return Err(Refusal::new(node.below("http_method"), format!("the method {other} is not supported")));
            }
        };
        let body_json = match node.get("request_body_json") {
            None => None,
            Some(v) if v.as_str() == Some("") => None,
            Some(v) => Some(Nested::read(v, &node.below("request_body_json"))?),
        };
        let body_data = RequestInput::read(node, "request_body_data")?;
        if body_json.is_some() && body_data != RequestInput::Empty {
            return Err(Refusal::new(node.pointer(), "a request has either request_body_json or request_body_data"));
        }
        let (authenticator, authenticator_pointer) = match node.child("authenticator") {
            None => (Authenticator::None, String::new()),
            Some(auth) => {
                let auth = auth?;
                let (authenticator, pointer) = Authenticator::read(&auth, config)?;
                (authenticator, pointer)
            }
        };
        let error_handler = match node.child("error_handler") {
            None => ErrorHandler::default(),
            Some(h) => ErrorHandler::read(&h?)?,
        };
        Ok(Requester {
            url_base: node.template("url_base")?,
            path: node.template("path")?,
            url: node.template("url")?,
            method,
            parameters_input: RequestInput::read(node, "request_parameters")?,
            headers: RequestInput::read(node, "request_headers")?,
            body_json,
            body_data,
            authenticator,
            authenticator_pointer,
            error_handler,
            parameters: node.parameters_val(),
        })
    }
}
