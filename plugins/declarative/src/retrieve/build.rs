//! One request of a stream, as the CDK's `HttpRequester.send_request`
//! builds it for a slice and a page token: the URL from `url_base`, `path`
//! (or the token, for a `RequestPath`), then parameters, headers and
//! bodies gathered from the requester, the authenticator, the paginator
//! and the partition routers — a key given twice is an error, as there —
//! and the secret's place found where a rendered part is exactly a secret.

use serde_json::{Map, Value};

use super::http::{Body, Credential, Method, OAuthGrant, Place, Request, join_url};
use super::{Env, ReadError, Slice};
use crate::interpolation::{Context, Template, Val};
use crate::model::Refusal;
use crate::model::cursor::DatetimeCursor;
use crate::model::partition::Router;
use crate::model::request::{
    Authenticator, Entry, Inject, Nested, OptionField, RequestInput, RequestOption, Requester, SessionLogin,
    SessionToken, TokenOption,
};
use crate::model::{Retriever, Stream};
use crate::secrets::Holds;

/// Options gathered for one request, by where they go.
#[derive(Debug, Default)]
struct Options {
    params: Vec<(String, Val)>,
    headers: Vec<(String, Val)>,
    json: Map<String, Value>,
    data: Vec<(String, Val)>,
    text: Option<String>,
}

impl Options {
    /// Puts `value` where `option` says; a key already there is an error
    /// (a JSON body takes the same value twice).
    fn inject(&mut self, option: &RequestOption, value: Val, env: &Env) -> Result<(), ReadError> {
        let ctx = Context::at(env.now).with("config", env.config.clone()).with("parameters", option.parameters.clone());
        let name = |t: &Template| -> Result<String, ReadError> {
            t.eval_string(&ctx)
                .map(|v| v.to_text())
                .map_err(|e| ReadError::evaluation("a request option's field name", e))
        };
        match (&option.field, option.inject) {
            (OptionField::Name(t), Inject::Parameter) => push(&mut self.params, name(t)?, value, "query parameter"),
            (OptionField::Name(t), Inject::Header) => push(&mut self.headers, name(t)?, value, "header"),
            (OptionField::Name(t), Inject::BodyData) => push(&mut self.data, name(t)?, value, "body field"),
            (OptionField::Name(t), Inject::BodyJson) => merge_json(&mut self.json, &[name(t)?], value.to_json()),
            (OptionField::Path(path), _) => {
                let path = path.iter().map(name).collect::<Result<Vec<_>, _>>()?;
                merge_json(&mut self.json, &path, value.to_json())
            }
        }
    }
}

fn push(into: &mut Vec<(String, Val)>, key: String, value: Val, what: &str) -> Result<(), ReadError> {
    if into.iter().any(|(k, _)| *k == key) {
        return Err(ReadError::Invalid(format!(
            "the {what} {key} is given twice (by the requester, its authenticator, paginator or partition router)"
        )));
    }
    into.push((key, value));
    Ok(())
}

fn merge_json(into: &mut Map<String, Value>, path: &[String], value: Value) -> Result<(), ReadError> {
    let Some((last, parents)) = path.split_last() else { return Ok(()) };
    let mut at = into;
    for p in parents {
        let slot = at.entry(p.clone()).or_insert_with(|| Value::Object(Map::new()));
        at = match slot {
            Value::Object(m) => m,
            _ => return Err(ReadError::Invalid(format!("the body field {p} is given twice"))),
        };
    }
    match at.get(last) {
        Some(existing) if *existing != value => {
            Err(ReadError::Invalid(format!("the body field {last} is given twice with different values")))
        }
        _ => {
            at.insert(last.clone(), value);
            Ok(())
        }
    }
}

/// The context of the requester's templates.
pub(super) fn requester_context(env: &Env, parameters: &Val, slice: &Slice, token: Option<&Val>) -> Context {
    let mut ctx = Context::at(env.now)
        .with("config", env.config.clone())
        .with("parameters", parameters.clone())
        .with("stream_slice", slice.val())
        .with("next_page_token", next_page_token(token));
    for (k, v) in &slice.extra {
        ctx = ctx.with(k, v.clone());
    }
    ctx
}

/// The `next_page_token` templates see: `{"next_page_token": token}`.
pub(super) fn next_page_token(token: Option<&Val>) -> Val {
    token.map_or(Val::None, |t| Val::Dict(vec![("next_page_token".into(), t.clone())]))
}

fn is_param_type(v: &Val) -> bool {
    matches!(v, Val::Str(_) | Val::List(_))
}

/// A mapping of the requester evaluated: names and values rendered,
/// `None` values dropped.
fn evaluate(input: &RequestInput, ctx: &Context, typed: bool, what: &str) -> Result<Vec<(String, Val)>, ReadError> {
    let RequestInput::Mapping(entries) = input else { return Ok(Vec::new()) };
    let mut out = Vec::with_capacity(entries.len());
    for (name, entry) in entries {
        let key =
            name.eval_as(ctx, |v| matches!(v, Val::Str(_))).map_err(|e| ReadError::evaluation(what, e))?.to_text();
        let value = match entry {
            Entry::Template(t) => if typed { t.eval_as(ctx, is_param_type) } else { t.eval(ctx) }
                .map_err(|e| ReadError::evaluation(what, e))?,
            Entry::Literal(v) => Val::from(v),
        };
        if !matches!(value, Val::None | Val::Undefined) {
            out.push((key, value));
        }
    }
    Ok(out)
}

fn nested(n: &Nested, ctx: &Context) -> Result<Option<Value>, ReadError> {
    Ok(match n {
        Nested::Template(t) => match t.eval(ctx).map_err(|e| ReadError::evaluation("the JSON body", e))? {
            Val::None | Val::Undefined => None,
            v => Some(v.to_json()),
        },
        Nested::Literal(v) => Some(v.clone()),
        Nested::List(items) => Some(Value::Array(
            items.iter().map(|i| nested(i, ctx).map(|v| v.unwrap_or(Value::Null))).collect::<Result<_, _>>()?,
        )),
        Nested::Object(entries) => {
            let mut map = Map::new();
            for (k, v) in entries {
                let key = k.eval(ctx).map_err(|e| ReadError::evaluation("the JSON body", e))?.to_text();
                if let Some(v) = nested(v, ctx)? {
                    map.insert(key, v);
                }
            }
            Some(Value::Object(map))
        }
    })
}

/// The request for `slice` and `token` of `stream`.
pub(super) fn request(stream: &Stream, slice: &Slice, token: Option<&Val>, env: &Env) -> Result<Request, ReadError> {
    let retriever = &stream.retriever;
    let token_path = match (&retriever.paginator, token) {
        (Some(p), Some(t)) if p.token_option == Some(TokenOption::Path) && t.truthy() => Some(t.to_text()),
        _ => None,
    };
    // The requester's own options and its authenticator's, then the
    // paginator's and the routers'.
    assemble(&retriever.requester, slice, token, token_path, env, |options| {
        if let Some(paginator) = &retriever.paginator {
            if let (Some(TokenOption::Option(option)), Some(t)) = (&paginator.token_option, token) {
                options.inject(option, t.clone(), env)?;
            }
            if let Some(option) = &paginator.size_option {
                let size = paginator
                    .strategy
                    .page_size(&env.config, &paginator.parameters, env.now)
                    .map_err(|e| ReadError::Invalid(format!("the page size: {e}")))?;
                if let Some(size) = size.filter(|s| *s != 0) {
                    options.inject(option, Val::Int(size), env)?;
                }
            }
        }
        if token.is_none() || !retriever.ignore_routers_on_paginated_requests {
            match &stream.cursor {
                Some(cursor) => window_options(cursor, slice, options, env)?,
                None => route_options(retriever, slice, options, env)?,
            }
        }
        Ok(())
    })
}

/// Who logs in for a session token.
#[derive(Debug)]
pub(super) enum Login {
    /// The guest, with this request: the login sends no secret.
    ByGuest(Request),
    /// The host, with the credential holding the login's password, at the
    /// login's URL (the host makes the request from its recipe).
    ByHost { url: String, credential: Credential },
}

/// A session token's login: its requester's request, which the guest
/// makes where it sends no secret. One that sends a secret the host
/// makes: a `POST` of a JSON body of a username and the secret as its
/// password, the token sent in a header or as a bearer token; a login
/// sending a secret in any other form is refused. A bearer token only
/// the host sends.
pub(super) fn login(session: &SessionLogin, env: &Env) -> Result<Login, ReadError> {
    let request = assemble(&session.login, &Slice::default(), None, None, env, |_| Ok(()))?;
    if request.credentials.is_empty() {
        if session.sent == SessionToken::Bearer {
            return Err(ReadError::Refused(Refusal::new(
                session.sent_pointer.clone(),
                "a session token in the Authorization header: only the host sets that header, for a login it makes (one whose password is a secret field), so the guest cannot send the token there",
            )));
        }
        return Ok(Login::ByGuest(request));
    }
    let refused = |how: &str| {
        ReadError::Secret(format!(
            "a session token's login would send a secret {how}: the host logs in for a token only with a POST of a JSON body holding a username and the secret as the password"
        ))
    };
    let (pointer, password_field) = match request.credentials.as_slice() {
        [Credential { pointer, place: Place::BodyField(field) }] => (pointer.clone(), field.clone()),
        _ => return Err(refused("outside a JSON body's field")),
    };
    if request.method != Method::Post {
        return Err(refused("with a GET"));
    }
    if !request.query.is_empty() || request.url.contains(['?', '#']) {
        return Err(refused("with a query"));
    }
    if !request.headers.is_empty() {
        return Err(refused("with headers of its own"));
    }
    let (username_field, username) = match &request.body {
        Body::Json(Value::Object(rest)) if rest.len() == 1 => match rest.iter().next() {
            Some((field, Value::String(username))) => (field.clone(), username.clone()),
            _ => return Err(refused("beside a field that is not a username")),
        },
        Body::Json(_) => return Err(refused("beside other fields than a username")),
        _ => return Err(refused("outside a JSON body")),
    };
    let header = match &session.sent {
        SessionToken::Bearer => None,
        SessionToken::ApiKey(option) if option.inject == Inject::Header => {
            let ctx = Context::at(env.now).with("config", env.config.clone());
            let name = option.keys(&ctx).and_then(|k| k.into_iter().next()).unwrap_or_default();
            let name = name.trim();
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)) {
                return Err(ReadError::Refused(Refusal::new(
                    session.sent_pointer.clone(),
                    format!("the session token's header {name:?} is not a header name"),
                )));
            }
            Some(name.to_owned())
        }
        SessionToken::ApiKey(_) => {
            return Err(ReadError::Refused(Refusal::new(
                session.sent_pointer.clone(),
                "the host sends a session token it logs in for in a header (or as a bearer token), not in a query or body",
            )));
        }
    };
    let lifetime_secs = match session.expiration {
        None => None,
        Some(gap) if gap.months == 0 && gap.exact > chrono::TimeDelta::zero() => {
            Some(gap.exact.num_seconds().max(1).unsigned_abs())
        }
        Some(_) => {
            return Err(ReadError::Refused(Refusal::new(
                format!("{}/expiration_duration", session.pointer),
                "a session the host logs in for lasts a positive duration in weeks, days, hours, minutes or seconds",
            )));
        }
    };
    let token_pointer: String =
        session.token_path.iter().map(|key| format!("/{}", key.replace('~', "~0").replace('/', "~1"))).collect();
    let place = Place::SessionLogin {
        login_url: request.url.clone(),
        username,
        username_field,
        password_field,
        token_pointer,
        header,
        lifetime_secs,
    };
    Ok(Login::ByHost { url: request.url, credential: Credential { pointer, place } })
}

/// A request of `requester`: its URL, options and authenticator, then
/// what `more` adds, every secret placed by the host.
fn assemble(
    requester: &Requester,
    slice: &Slice,
    token: Option<&Val>,
    token_path: Option<String>,
    env: &Env,
    more: impl FnOnce(&mut Options) -> Result<(), ReadError>,
) -> Result<Request, ReadError> {
    let ctx = requester_context(env, &requester.parameters, slice, token);
    let text = |t: &Option<Template>, what: &str| -> Result<String, ReadError> {
        match t {
            None => Ok(String::new()),
            Some(t) => t.eval_string(&ctx).map(|v| v.to_text()).map_err(|e| ReadError::evaluation(what, e)),
        }
    };
    let url_base = text(&requester.url_base, "url_base")?;
    let url_field = text(&requester.url, "url")?;
    let path = match token_path {
        Some(p) => p,
        None => text(&requester.path, "path")?.trim_start_matches('/').to_owned(),
    };
    let url = if !url_base.is_empty() {
        join_url(&url_base, &path)
    } else if !path.is_empty() {
        join_url(&url_field, &path)
    } else {
        url_field.clone()
    };

    let mut options = Options {
        params: evaluate(&requester.parameters_input, &ctx, true, "request_parameters")?,
        headers: evaluate(&requester.headers, &ctx, false, "request_headers")?,
        ..Options::default()
    };
    if let Some(json) = &requester.body_json
        && let Some(Value::Object(map)) = nested(json, &ctx)?
    {
        options.json = map;
    }
    match &requester.body_data {
        RequestInput::Text(t) => {
            let body = t.eval(&ctx).map_err(|e| ReadError::evaluation("request_body_data", e))?;
            if !matches!(body, Val::None) {
                options.text = Some(body.to_text());
            }
        }
        input => options.data = evaluate(input, &ctx, true, "request_body_data")?,
    }
    let mut credentials: Vec<Credential> =
        authenticate(&requester.authenticator, &mut options, env)?.into_iter().collect();
    more(&mut options)?;

    // A secret in the path (an account's id the spec keeps secret): the
    // host writes it where the URL holds the marker.
    let url = match env.secrets.holds(&url) {
        // A next page's URL the host gave back with the marker where the
        // path's secret was: the secret of the stream's own path.
        Holds::Nothing if url.contains(connector_rules::path::CREDENTIAL_MARKER) => {
            let own = join_url(
                if url_base.is_empty() { &url_field } else { &url_base },
                text(&requester.path, "path")?.trim_start_matches('/'),
            );
            if let Holds::Around { pointer, .. } = env.secrets.holds(&own) {
                add_credential(&mut credentials, Credential { pointer, place: Place::UrlPath })?;
            }
            url
        }
        Holds::Nothing => url,
        Holds::Around { pointer, prefix, suffix } if !prefix.contains(['?', '#']) && prefix.contains("://") => {
            add_credential(&mut credentials, Credential { pointer, place: Place::UrlPath })?;
            format!("{prefix}{}{suffix}", connector_rules::path::CREDENTIAL_MARKER)
        }
        _ => {
            return Err(ReadError::Secret(
                "a secret would be written into the URL other than once in its path, which only the guest could write"
                    .into(),
            ));
        }
    };
    // Where a secret is, the host places it; anywhere else, refused.
    let mut found = |holds: Holds, place: Place| -> Result<bool, ReadError> {
        let pointer = match (holds, &place) {
            (Holds::Nothing, _) => return Ok(false),
            (Holds::Secret(p), _) => p,
            (Holds::BearerSecret(p), Place::Header(h)) if h.eq_ignore_ascii_case("authorization") => {
                return add_credential(&mut credentials, Credential { pointer: p, place: Place::Bearer }).map(|_| true);
            }
            (Holds::Around { pointer, prefix, suffix }, Place::Header(h)) => {
                let place = Place::HeaderAround { header: h.clone(), prefix, suffix };
                return add_credential(&mut credentials, Credential { pointer, place }).map(|_| true);
            }
            (Holds::BearerSecret(p) | Holds::Mixed(p) | Holds::Around { pointer: p, .. }, _) => {
                return Err(ReadError::Secret(format!(
                    "the secret {p} would be sent with other text around it ({}), which only the guest could write",
                    describe(&place)
                )));
            }
        };
        add_credential(&mut credentials, Credential { pointer, place }).map(|_| true)
    };
    let mut query = Vec::new();
    for (k, v) in options.params {
        let values = match v {
            Val::List(items) => items,
            Val::Dict(_) => {
                return Err(ReadError::Invalid(format!(
                    "the query parameter {k} is an object, which a query cannot hold"
                )));
            }
            other => vec![other],
        };
        for v in values {
            let text = v.to_text();
            if !found(env.secrets.holds(&text), Place::Query(k.clone()))? {
                query.push((k.clone(), text));
            }
        }
    }
    let mut headers = Vec::new();
    for (k, v) in options.headers {
        let text = v.to_text();
        if !found(env.secrets.holds(&text), Place::Header(k.clone()))? {
            headers.push((k, text));
        }
    }
    let method = match requester.method {
        crate::model::request::Method::Get => Method::Get,
        crate::model::request::Method::Post => Method::Post,
    };
    // A body goes with every method, GET included, as the CDK sends it
    // (its body methods are GET, POST, PUT and PATCH).
    let body = if let Some(text) = options.text {
        if !options.data.is_empty() {
            return Err(ReadError::Invalid("a text body cannot take form fields too".into()));
        }
        if env.secrets.holds(&text) != Holds::Nothing {
            return Err(ReadError::Secret("a secret would be written into a text body".into()));
        }
        Body::Text(text)
    } else if !options.data.is_empty() {
        if !options.json.is_empty() {
            return Err(ReadError::Invalid("a request has either a JSON body or form data, not both".into()));
        }
        let mut form = Vec::new();
        for (k, v) in options.data {
            let values = match v {
                Val::List(items) => items,
                other => vec![other],
            };
            for v in values {
                let text = v.to_text();
                if !found(env.secrets.holds(&text), Place::BodyField(k.clone()))? {
                    form.push((k.clone(), text));
                }
            }
        }
        Body::Form(form)
    } else if !options.json.is_empty() {
        let mut json = options.json;
        let keys: Vec<String> = json.keys().cloned().collect();
        for k in keys {
            if let Some(Value::String(s)) = json.get(&k)
                && found(env.secrets.holds(s), Place::BodyField(k.clone()))?
            {
                json.remove(&k);
            }
        }
        let text = Value::Object(json.clone()).to_string();
        if text.contains('\u{1}') {
            return Err(ReadError::Secret("a secret would be written deep in the JSON body".into()));
        }
        Body::Json(Value::Object(json))
    } else {
        Body::None
    };
    // A header the host fills for a credential (a token it obtains, in a
    // header the manifest names) is not written by the manifest too: the
    // request would carry two.
    for c in &credentials {
        if let ("header", name) = c.place.part()
            && let Some((written, _)) = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(&name))
        {
            return Err(ReadError::Secret(format!(
                "the header {written} is written by the manifest and carries {} too: a request would send it twice",
                describe(&c.place)
            )));
        }
    }
    // Query parameters the URL already holds with the same value are not
    // sent twice.
    let in_url = url_query(&url);
    query.retain(|(k, v)| in_url.iter().find(|(uk, _)| uk == k).is_none_or(|(_, uv)| uv != v));
    Ok(Request { method, url, query, headers, body, credentials })
}

fn describe(place: &Place) -> String {
    match place {
        Place::Bearer => "a bearer token".into(),
        Place::Header(h) => format!("header {h}"),
        Place::Query(q) => format!("query parameter {q}"),
        Place::BodyField(f) => format!("body field {f}"),
        Place::UrlPath => "the URL's path".into(),
        Place::Basic { .. } | Place::BasicUsername { .. } | Place::BasicBoth | Place::BasicPair { .. } => {
            "Basic authentication".into()
        }
        Place::OAuthClient { .. } => "an OAuth access token".into(),
        Place::SessionLogin { .. } => "a session token the host logs in for".into(),
        Place::HeaderAround { header, .. } => format!("header {header}"),
    }
}

/// Adds a secret the host places: once per field, each in a part of the
/// request of its own.
fn add_credential(credentials: &mut Vec<Credential>, c: Credential) -> Result<(), ReadError> {
    if credentials.contains(&c) {
        return Ok(());
    }
    // A pair's password field is sent too, inside the pair (an OAuth
    // client's id and refresh token, inside its token request).
    let fields = |c: &Credential| -> Vec<String> {
        std::iter::once(&c.pointer).chain(c.place.fields_beside()).cloned().collect()
    };
    if let Some(same) = credentials.iter().find(|other| fields(other).iter().any(|f| fields(&c).contains(f))) {
        return Err(ReadError::Secret(format!(
            "the secret {} would be sent twice ({} and {}); a credential goes in one place",
            c.pointer,
            describe(&same.place),
            describe(&c.place)
        )));
    }
    if let Some(other) = credentials.iter().find(|other| other.place.part() == c.place.part()) {
        return Err(ReadError::Secret(format!(
            "the secrets {} and {} would share {}",
            other.pointer,
            c.pointer,
            describe(&c.place)
        )));
    }
    credentials.push(c);
    Ok(())
}

/// The authenticator's part: a secret's place, or plain values where the
/// token names no secret.
fn authenticate(auth: &Authenticator, options: &mut Options, env: &Env) -> Result<Option<Credential>, ReadError> {
    let ctx = |parameters: &Val| {
        Context::at(env.now).with("config", env.config.clone()).with("parameters", parameters.clone())
    };
    let render = |t: &Template, ctx: &Context| -> Result<String, ReadError> {
        t.eval_string(ctx).map(|v| v.to_text()).map_err(|e| ReadError::evaluation("the authenticator", e))
    };
    match auth {
        Authenticator::None => Ok(None),
        Authenticator::Session(session) => match login(session, env)? {
            // The host's token, which it puts where its recipe says.
            Login::ByHost { credential, .. } => Ok(Some(credential)),
            Login::ByGuest(_) => {
                // The token the last login gave (none yet when the source
                // is checked before any read).
                let token = env.sessions.token(&session.login_pointer).unwrap_or_default();
                if let SessionToken::ApiKey(option) = &session.sent {
                    options.inject(option, Val::Str(token), env)?;
                }
                Ok(None)
            }
        },
        Authenticator::OAuthClient { token_url, client_id, client_secret, refresh_token, terms } => {
            let c = ctx(&Val::Dict(Vec::new()));
            let token_url = render(token_url, &c)?;
            if env.secrets.holds(&token_url) != Holds::Nothing {
                return Err(ReadError::Secret("a secret would be written into the token endpoint's URL".into()));
            }
            let (client_id, client_id_field) = match env.secrets.holds(&render(client_id, &c)?) {
                Holds::Nothing => (render(client_id, &c)?, None),
                Holds::Secret(field) => (String::new(), Some(field)),
                _ => return Err(ReadError::Secret("the OAuth client id holds a secret with other text".into())),
            };
            let grant = match refresh_token {
                None => OAuthGrant::ClientCredentials,
                Some(refresh_token) => match env.secrets.holds(&render(refresh_token, &c)?) {
                    Holds::Secret(field) => OAuthGrant::RefreshToken { field },
                    Holds::Nothing if render(refresh_token, &c)?.is_empty() => OAuthGrant::EmptyRefreshToken,
                    _ => {
                        return Err(ReadError::Secret(
                            "the OAuth refresh token must be a secret field of the configuration (airbyte_secret), which the client's credential holds".into(),
                        ));
                    }
                },
            };
            match env.secrets.holds(&render(client_secret, &c)?) {
                Holds::Secret(pointer) => Ok(Some(Credential {
                    pointer,
                    place: Place::OAuthClient { token_url, client_id, client_id_field, grant, terms: terms.clone() },
                })),
                _ => Err(ReadError::Secret(
                    "the OAuth client secret must be a secret field of the configuration (airbyte_secret), which a credential holds".into(),
                )),
            }
        }
        Authenticator::Bearer { token } => {
            let value = render(token, &ctx(&Val::Dict(Vec::new())))?;
            match env.secrets.holds(&value) {
                Holds::Nothing => {
                    push(&mut options.headers, "Authorization".into(), Val::Str(format!("Bearer {value}")), "header")?;
                    Ok(None)
                }
                Holds::Secret(pointer) => Ok(Some(Credential { pointer, place: Place::Bearer })),
                Holds::Around { pointer, prefix, suffix } => Ok(Some(Credential {
                    pointer,
                    place: Place::HeaderAround {
                        header: "Authorization".into(),
                        prefix: format!("Bearer {prefix}"),
                        suffix,
                    },
                })),
                _ => Err(ReadError::Secret("the bearer token holds a secret with other text".into())),
            }
        }
        Authenticator::ApiKey { token, option } => {
            let value = render(token, &ctx(&option.parameters))?;
            match env.secrets.holds(&value) {
                Holds::Nothing => {
                    options.inject(option, Val::Str(value), env)?;
                    Ok(None)
                }
                holds => {
                    let name_ctx = ctx(&option.parameters);
                    let name = match &option.field {
                        OptionField::Name(t) => render(t, &name_ctx)?,
                        OptionField::Path(_) => {
                            return Err(ReadError::Secret("an API key placed at a nested body path".into()));
                        }
                    };
                    let place = match option.inject {
                        Inject::Header => Place::Header(name),
                        Inject::Parameter => Place::Query(name),
                        Inject::BodyJson | Inject::BodyData => Place::BodyField(name),
                    };
                    match (holds, &place) {
                        (Holds::Secret(pointer), _) => Ok(Some(Credential { pointer, place })),
                        (Holds::BearerSecret(pointer), Place::Header(h)) if h.eq_ignore_ascii_case("authorization") => {
                            Ok(Some(Credential { pointer, place: Place::Bearer }))
                        }
                        (Holds::Around { pointer, prefix, suffix }, Place::Header(h)) => Ok(Some(Credential {
                            pointer,
                            place: Place::HeaderAround { header: h.clone(), prefix, suffix },
                        })),
                        _ => Err(ReadError::Secret(format!(
                            "the API key's {} holds a secret with other text, which only the guest could write",
                            describe(&place)
                        ))),
                    }
                }
            }
        }
        Authenticator::Basic { username, password } => {
            let c = ctx(&Val::Dict(Vec::new()));
            let user = render(username, &c)?;
            let pass = render(password, &c)?;
            match (env.secrets.holds(&user), env.secrets.holds(&pass)) {
                (Holds::Nothing, Holds::Nothing) => {
                    let encoded = crate::interpolation::eval::base64_encode(format!("{user}:{pass}").as_bytes());
                    push(&mut options.headers, "Authorization".into(), Val::Str(format!("Basic {encoded}")), "header")?;
                    Ok(None)
                }
                (Holds::Secret(pointer), Holds::Nothing) => {
                    Ok(Some(Credential { pointer, place: Place::BasicUsername { password: pass } }))
                }
                (Holds::Nothing, Holds::Secret(pointer)) => {
                    Ok(Some(Credential { pointer, place: Place::Basic { username: user } }))
                }
                (Holds::Secret(pointer), Holds::Secret(same)) if pointer == same => {
                    Ok(Some(Credential { pointer, place: Place::BasicBoth }))
                }
                // Two secret fields: one credential holds the pair.
                (Holds::Secret(pointer), Holds::Secret(password)) => {
                    Ok(Some(Credential { pointer, place: Place::BasicPair { password } }))
                }
                _ => Err(ReadError::Secret(
                    "Basic authentication with a secret among other text in its username or password: only the guest could write it".into(),
                )),
            }
        }
    }
}

/// The cursor's options for a window: its bounds where the manifest puts
/// them.
fn window_options(cursor: &DatetimeCursor, slice: &Slice, options: &mut Options, env: &Env) -> Result<(), ReadError> {
    let partition = slice.val();
    // The CDK writes both into one mapping, the end last: on one key, the
    // end's value is sent.
    let ctx = Context::at(env.now).with("config", env.config.clone());
    let one_key = match (&cursor.start_option, &cursor.end_option) {
        (Some(start), Some(end)) => {
            start.inject == end.inject && start.keys(&ctx).is_some_and(|k| end.keys(&ctx) == Some(k))
        }
        _ => false,
    };
    let start = cursor.start_option.as_ref().filter(|_| !one_key);
    for (option, key) in [(start, &cursor.start_key), (cursor.end_option.as_ref(), &cursor.end_key)] {
        if let (Some(option), Some(value)) = (option, partition.get(key)) {
            options.inject(option, value.clone(), env)?;
        }
    }
    Ok(())
}

/// The partition routers' options for `slice`.
fn route_options(retriever: &Retriever, slice: &Slice, options: &mut Options, env: &Env) -> Result<(), ReadError> {
    let partition = slice.val();
    for router in &retriever.routers {
        match router {
            Router::List { cursor_field, option: Some(option), .. } => {
                if let Some(v) = partition.get(cursor_field).filter(|v| v.truthy()) {
                    options.inject(option, v.clone(), env)?;
                }
            }
            Router::List { option: None, .. } => {}
            Router::Substream { parents } => {
                for parent in parents {
                    if let Some(option) = &parent.option
                        && let Some(v) = partition.get(&parent.partition_field).filter(|v| v.truthy())
                    {
                        options.inject(option, v.clone(), env)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// The query a URL holds, decoded (the first value of each key).
fn url_query(url: &str) -> Vec<(String, String)> {
    let Some(q) = url.split_once('?').map(|(_, q)| q.split('#').next().unwrap_or("")) else { return Vec::new() };
    let mut out: Vec<(String, String)> = Vec::new();
    for pair in q.split(['&', ';']).filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (k, v) = (percent_decode(k), percent_decode(v));
        // parse_qs drops blank values.
        if !v.is_empty() && !out.iter().any(|(ok, _)| *ok == k) {
            out.push((k, v));
        }
    }
    out
}

/// The value of one hex digit.
fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

/// A query part with its percent-escapes and `+` decoded.
pub(super) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            // Hex digits read as bytes: a `%` before a character of
            // several bytes is kept as it is.
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(high), Some(low)) => {
                    out.push(high * 16 + low);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
