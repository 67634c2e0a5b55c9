//! Reading a stream as the CDK's `SimpleRetriever` reads it: its slices
//! (the partition routers' values, a parent stream's records), and for
//! each slice its pages — a request built ([`build`]), sent through a
//! [`Transport`] (retried as the error handler says), records selected,
//! filtered and transformed, the next page's token computed and its
//! request started before this page's records are handed over — until
//! the paginator has no token.
//!
//! # Layout
//!
//! | module | holds |
//! |---|---|
//! | [`http`] | requests and answers, URL joining, error classification |
//! | [`budget`] | the source's `api_budget` kept to: a transport that waits its turn |
//! | [`build`] | one request from the requester, authenticator, paginator and routers |
//! | [`incremental`] | an incremental cursor's windows, the intervals read, the state |
//! | [`partitioned`] | a cursor per partition, the global cursor, their state |
//! | [`session`] | session tokens: the login before a request, the token kept |
//! | this file | slices, pages, records and transformations |

mod budget;
pub mod build;
pub mod http;
pub mod incremental;
pub mod partitioned;
pub mod session;

use chrono::{DateTime, Utc};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::interpolation::{Context, InterpolationError, Reach, Val};
use crate::model::cursor::DatetimeCursor;
use crate::model::partition::Router;
use crate::model::record::Transformation;
use crate::model::request::ErrorHandler;
use crate::model::{self, Source, Stream};
use crate::paginate::{Page, Strategy};
use crate::secrets::Secrets;
pub use http::{Body, Credential, Method, OAuthGrant, Place, Request, Response, TokenTerms};
use incremental::{CursorState, Instant, Window};
use partitioned::PartitionedState;
pub use session::Sessions;

/// Sends requests for the runtime.
pub trait Transport {
    /// Sends `request` and returns the answer, whatever its status.
    fn send(&mut self, request: &Request) -> Result<Response, Box<dyn std::error::Error + Send + Sync>>;
    /// Waits before a retry.
    fn wait(&mut self, seconds: f64);
    /// The time now, as the guest's clock says (a wait until a time the
    /// provider names is measured from it).
    fn now(&self) -> DateTime<Utc>;
    /// A clock that only goes forward (which a test does not hold still):
    /// a duration is the difference of two readings.
    fn monotonic(&self) -> std::time::Duration;
    /// Sends `request` without waiting for its answer: a read asks for the
    /// next page while it hands this one's records over. By default the
    /// answer is waited for at once.
    fn start(&mut self, request: &Request) -> Result<Box<dyn Started>, Box<dyn std::error::Error + Send + Sync>> {
        self.send(request).map(|answer| Box::new(Answered(answer)) as Box<dyn Started>)
    }
}

/// A request started, its answer still to come.
pub trait Started {
    /// Waits for the answer, whatever its status.
    fn finish(self: Box<Self>) -> Result<Response, Box<dyn std::error::Error + Send + Sync>>;
}

/// An answer already there.
struct Answered(Response);

impl Started for Answered {
    fn finish(self: Box<Self>) -> Result<Response, Box<dyn std::error::Error + Send + Sync>> {
        Ok(self.0)
    }
}

/// Why a read stops.
#[derive(Debug)]
pub enum ReadError {
    /// The request could not be sent.
    Transport(Box<dyn std::error::Error + Send + Sync>),
    /// The error handler failed the read on this answer.
    Provider { status: u16, url: String, message: String },
    /// A template could not be evaluated.
    Evaluation { what: String, error: InterpolationError },
    /// A secret would have been used where only the guest could write it.
    Secret(String),
    /// The manifest asks for something a request cannot hold.
    Invalid(String),
    /// A component refused where it is used, by JSON pointer (known once
    /// a request is built).
    Refused(crate::model::Refusal),
    /// The consumer of the records stopped the read.
    Stopped(String),
}

impl ReadError {
    pub(crate) fn evaluation(what: &str, error: InterpolationError) -> ReadError {
        ReadError::Evaluation { what: what.to_owned(), error }
    }
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Transport(e) => write!(f, "the request could not be sent: {e}"),
            ReadError::Provider { status, url, message } => write!(f, "{url} answered {status}: {message}"),
            ReadError::Evaluation { what, error } => write!(f, "{what}: the template is {error}"),
            ReadError::Secret(m) => write!(f, "refused: {m}"),
            ReadError::Invalid(m) | ReadError::Stopped(m) => f.write_str(m),
            ReadError::Refused(r) => write!(f, "refused at {}: {}", r.pointer, r.reason),
        }
    }
}

impl std::error::Error for ReadError {}

/// Why a manifest cannot be made ready to read.
#[derive(Debug)]
pub enum PrepareError {
    /// A component, field or template refused, by JSON pointer.
    Refused(crate::model::Refusal),
    /// A secret field (this pointer) given in the clear configuration.
    SecretInTheClear(String),
}

/// A manifest ready to read: the secret fields (the spec's, and those a
/// credential is `given` for), `plain` (the configuration without them)
/// with a marker at each, and the source read once with that
/// configuration (the components that read it when built see the
/// markers, so a secret there is found when a request would carry it).
pub fn prepare(
    manifest: &Value,
    plain: &Val,
    given: &[String],
    now: DateTime<Utc>,
) -> Result<(Source, Env), PrepareError> {
    let mut secrets = Secrets::of_spec(&Source::spec(manifest).map_err(PrepareError::Refused)?, plain);
    for pointer in given {
        secrets.add(pointer);
    }
    if let Some(pointer) = secrets.given_in(plain) {
        return Err(PrepareError::SecretInTheClear(pointer.to_owned()));
    }
    let config = secrets.mark(plain, given);
    let source = Source::read(manifest, &config, now).map_err(PrepareError::Refused)?;
    if let Some(pointer) = source.budget.as_ref().and_then(|b| b.reads_secret(&secrets.pointers)) {
        return Err(PrepareError::Refused(model::Refusal::new(
            pointer,
            "this limit or weight reads a secret: the guest never holds one, so it cannot set one from it",
        )));
    }
    Ok((source, Env { config, secrets, now, sessions: Sessions::default() }))
}

/// Whether to go on reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    More,
    Enough,
}

/// What every template of a read sees: the configuration (secrets as
/// markers), the secrets, and the clock.
#[derive(Debug, Clone)]
pub struct Env {
    pub config: Val,
    pub secrets: Secrets,
    pub now: DateTime<Utc>,
    /// The session tokens logins gave during the read.
    pub sessions: Sessions,
}

/// A stream slice: the partition (`stream_slice` in templates) and the
/// extra fields a parent hands down (variables of their own).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Slice {
    pub partition: Vec<(String, Val)>,
    pub extra: Vec<(String, Val)>,
}

impl Slice {
    pub fn val(&self) -> Val {
        Val::Dict(self.partition.clone())
    }

    /// The slice of one window of a cursor: its bounds under the cursor's
    /// keys.
    fn window(cursor: &DatetimeCursor, window: &Window) -> Slice {
        Slice {
            partition: vec![
                (cursor.start_key.clone(), Val::Str(window.start.clone())),
                (cursor.end_key.clone(), Val::Str(window.end.clone())),
            ],
            extra: Vec::new(),
        }
    }

    fn merged(&self, other: &Slice) -> Slice {
        let mut out = self.clone();
        for (k, v) in &other.partition {
            match out.partition.iter_mut().find(|(ok, _)| ok == k) {
                Some(slot) => slot.1 = v.clone(),
                None => out.partition.push((k.clone(), v.clone())),
            }
        }
        out.extra.extend(other.extra.iter().cloned());
        out
    }
}

/// Reads `stream` of `source` from `state` (a stream with an incremental
/// cursor; `None` reads from its start): `on_records` gets each page's
/// records (JSON text), transformed, and says whether to go on; `on_state` gets the
/// state after each window of the cursor read to its end (and once at
/// the end).
pub fn read(
    source: &Source,
    stream: &Stream,
    env: &Env,
    state: Option<&Value>,
    transport: &mut dyn Transport,
    on_records: &mut dyn FnMut(Vec<Box<RawValue>>) -> Result<Flow, ReadError>,
    on_state: &mut dyn FnMut(Value) -> Result<(), ReadError>,
) -> Result<Flow, ReadError> {
    let mut paced;
    let transport: &mut dyn Transport = match &source.budget {
        Some(budget) => {
            paced = budget::Paced::new(budget, transport);
            &mut paced
        }
        None => transport,
    };
    let Some(cursor) = &stream.cursor else {
        for slice in slices(source, stream, env, None, transport)? {
            if read_slice(stream, &slice, env, None, &mut None, transport, on_records)? == Flow::Enough {
                return Ok(Flow::Enough);
            }
        }
        return Ok(Flow::More);
    };
    if !stream.retriever.routers.is_empty() {
        return read_partitioned(source, stream, cursor, env, state, transport, on_records, on_state);
    }
    let mut cursor_state = CursorState::new(cursor, state, env.now)?;
    let windows = cursor_state.windows(cursor)?;
    for window in &windows {
        let slice = Slice::window(cursor, window);
        let mut latest = None;
        let bounds = Some((cursor, &cursor_state));
        let flow = read_slice(stream, &slice, env, bounds, &mut latest, transport, on_records)?;
        if flow == Flow::Enough {
            return Ok(Flow::Enough);
        }
        cursor_state.close(cursor, window, latest)?;
        on_state(cursor_state.state(cursor))?;
    }
    if windows.is_empty() {
        on_state(cursor_state.state(cursor))?;
    }
    Ok(Flow::More)
}

/// Reads a stream with a cursor and partition routers: each partition in
/// its own cursor's windows, the state after each partition and at the
/// end (see `partitioned`).
#[allow(clippy::too_many_arguments)]
fn read_partitioned(
    source: &Source,
    stream: &Stream,
    cursor: &DatetimeCursor,
    env: &Env,
    state: Option<&Value>,
    transport: &mut dyn Transport,
    on_records: &mut dyn FnMut(Vec<Box<RawValue>>) -> Result<Flow, ReadError>,
    on_state: &mut dyn FnMut(Value) -> Result<(), ReadError>,
) -> Result<Flow, ReadError> {
    let started = transport.monotonic();
    // One parent router keeps its parents' state (nothing, as no parent
    // here is read incrementally); a list of routers keeps none.
    let parent_state = match stream.retriever.routers.as_slice() {
        [Router::Substream { .. }] if !stream.retriever.routers_listed => Some(Value::Object(Default::default())),
        _ => None,
    };
    let mut partitioned = PartitionedState::new(cursor, state, parent_state, env.now)?;
    for partition in slices(source, stream, env, None, transport)? {
        let Some(i) = partitioned.partition(cursor, &partition.val().to_json())? else { continue };
        let windows = partitioned.cursor_state(i).windows(cursor)?;
        for window in &windows {
            let slice = partition.merged(&Slice::window(cursor, window));
            let mut latest = None;
            let bounds = Some((cursor, &*partitioned.cursor_state(i)));
            if read_slice(stream, &slice, env, bounds, &mut latest, transport, on_records)? == Flow::Enough {
                return Ok(Flow::Enough);
            }
            partitioned.observe(cursor, latest);
            partitioned.cursor_state(i).close(cursor, window, latest)?;
        }
        partitioned.close(cursor, i);
        on_state(partitioned.state(cursor))?;
    }
    let elapsed = transport.monotonic().saturating_sub(started);
    partitioned.finish(elapsed.as_secs_f64().ceil() as i64);
    on_state(partitioned.state(cursor))?;
    Ok(Flow::More)
}

/// The first requests of each stream as far as they can be built without
/// reading anything, after its session login where it takes a session
/// token: the hosts a source reaches and where each secret goes, for
/// checks before a read. The streams are the listed ones, then every
/// parent their routers read (each as the routers hold it; a parent with
/// a cursor is read over its windows only, so its own routers are not).
pub fn first_requests<'s>(source: &'s Source, env: &Env) -> Vec<(&'s Stream, Result<Request, ReadError>)> {
    let mut streams: Vec<(&Stream, bool)> = source.streams.iter().map(|s| (s, false)).collect();
    let mut i = 0;
    while i < streams.len() {
        let (stream, parent) = streams[i];
        if !(parent && stream.cursor.is_some()) {
            for router in &stream.retriever.routers {
                let Router::Substream { parents } = router else { continue };
                streams.extend(parents.iter().map(|p| (&*p.stream, true)));
            }
        }
        i += 1;
    }
    let mut budget = FIRST_SLICES;
    streams
        .into_iter()
        .flat_map(|(stream, parent)| {
            let login = match &stream.retriever.requester.authenticator {
                // A login the host makes is its recipe's: only its URL is
                // the manifest's (the host it reaches).
                model::request::Authenticator::Session(session) => Some((
                    stream,
                    build::login(session, env).map(|login| match login {
                        build::Login::ByGuest(request) => request,
                        build::Login::ByHost { url, .. } => Request {
                            method: http::Method::Post,
                            url,
                            query: Vec::new(),
                            headers: Vec::new(),
                            body: http::Body::None,
                            credentials: Vec::new(),
                        },
                    }),
                )),
                _ => None,
            };
            let token = stream.retriever.paginator.as_ref().and_then(|p| p.strategy.initial_token());
            let firsts: Vec<_> = match first_slices(stream, parent, env, &mut budget) {
                Ok(slices) => {
                    slices.iter().map(|slice| (stream, build::request(stream, slice, token.as_ref(), env))).collect()
                }
                Err(e) => vec![(stream, Err(e))],
            };
            login.into_iter().chain(firsts)
        })
        .collect()
}

/// The most slices of a source beyond each stream's first whose
/// requests are built before a read.
const FIRST_SLICES: usize = 10_000;

/// The slices a stream's first requests are built for before a read, on
/// its cursor's first window (from its start): its list routers' first
/// values together, then each further value of each list router in turn
/// (so a secret in any item of a configuration list is placed by a
/// request of that item), while `budget` lasts. One slice without
/// routers' values where a router reads a parent stream (those values
/// come from reading it), or for a parent with a cursor (read over its
/// windows only); none where a list router has no values (nothing is
/// read).
fn first_slices(stream: &Stream, parent: bool, env: &Env, budget: &mut usize) -> Result<Vec<Slice>, ReadError> {
    let window = match &stream.cursor {
        None => Slice::default(),
        Some(cursor) => {
            let windows = CursorState::new(cursor, None, env.now)?.windows(cursor)?;
            windows.first().map(|w| Slice::window(cursor, w)).unwrap_or_default()
        }
    };
    if parent && stream.cursor.is_some() {
        return Ok(vec![window]);
    }
    let mut lists = Vec::new();
    for router in &stream.retriever.routers {
        match router {
            Router::List { values, cursor_field, .. } => lists.push((cursor_field, values)),
            Router::Substream { .. } => return Ok(vec![window]),
        }
    }
    let one =
        |field: &String, value: &Val| Slice { partition: vec![(field.clone(), value.clone())], extra: Vec::new() };
    let mut first = Slice::default();
    for (field, values) in &lists {
        let Some(value) = values.first() else { return Ok(Vec::new()) };
        first = first.merged(&one(field, value));
    }
    let mut slices = vec![first.merged(&window)];
    for (field, values) in &lists {
        for value in values.iter().skip(1) {
            if *budget == 0 {
                return Ok(slices);
            }
            *budget -= 1;
            slices.push(first.merged(&one(field, value)).merged(&window));
        }
    }
    Ok(slices)
}

/// The first transformation field, record filter or partition value
/// that reads a secret (it renders differently under two markings of the
/// secrets): its JSON pointer. Records must never carry a secret, and
/// the guest never holds one to put there.
pub fn secret_in_records(source: &Source, env: &Env, again: &Env) -> Option<String> {
    for stream in &source.streams {
        for (i, t) in stream.transformations.iter().enumerate() {
            let Transformation::AddFields { fields, parameters, .. } = t else { continue };
            for (j, field) in fields.iter().enumerate() {
                let render = |env: &Env| {
                    let ctx = Context::at(env.now)
                        .with("config", env.config.clone())
                        .with("parameters", parameters.clone())
                        .with("record", Val::Dict(Vec::new()))
                        .with("stream_slice", Val::Dict(Vec::new()))
                        .with("stream_state", Val::Dict(Vec::new()));
                    field.value.eval(&ctx).ok()
                };
                let (first, second) = (render(env), render(again));
                if first != second || first.as_ref().is_some_and(|v| env.secrets.touches(v)) {
                    return Some(format!("{}/transformations/{i}/fields/{j}/value", stream.pointer));
                }
            }
        }
    }
    None
}

/// The slices of a stream: the windows of its cursor (from `state`), or
/// one empty slice without routers, else the cartesian product of its
/// routers' slices.
fn slices(
    source: &Source,
    stream: &Stream,
    env: &Env,
    state: Option<&mut CursorState>,
    transport: &mut dyn Transport,
) -> Result<Vec<Slice>, ReadError> {
    if let (Some(cursor), Some(state)) = (&stream.cursor, state) {
        return Ok(state.windows(cursor)?.iter().map(|w| Slice::window(cursor, w)).collect());
    }
    let mut product = vec![Slice::default()];
    for router in &stream.retriever.routers {
        let own = router_slices(source, router, env, transport)?;
        product = product.iter().flat_map(|p| own.iter().map(move |o| p.merged(o))).collect();
    }
    Ok(product)
}

fn router_slices(
    source: &Source,
    router: &Router,
    env: &Env,
    transport: &mut dyn Transport,
) -> Result<Vec<Slice>, ReadError> {
    match router {
        Router::List { values, cursor_field, .. } => Ok(values
            .iter()
            .map(|v| Slice { partition: vec![(cursor_field.clone(), v.clone())], extra: Vec::new() })
            .collect()),
        Router::Substream { parents } => {
            let mut out = Vec::new();
            for parent in parents {
                let key: Vec<&str> = parent.parent_key.split('/').filter(|s| !s.is_empty()).collect();
                // A parent with a cursor is read in full, from its start.
                let mut parent_state =
                    parent.stream.cursor.as_ref().map(|c| CursorState::new(c, None, env.now)).transpose()?;
                for parent_slice in slices(source, &parent.stream, env, parent_state.as_mut(), transport)? {
                    let mut records = Vec::new();
                    let bounds = parent.stream.cursor.as_ref().zip(parent_state.as_ref());
                    read_slice(&parent.stream, &parent_slice, env, bounds, &mut None, transport, &mut |page| {
                        records.extend(page);
                        Ok(Flow::More)
                    })?;
                    for record in records {
                        let record: Value = serde_json::from_str(record.get())
                            .map_err(|e| ReadError::Invalid(format!("stream {}: a record: {e}", parent.stream.name)))?;
                        let Some(value) = dpath_get(&record, &key).filter(|v| !v.is_null()) else { continue };
                        let extra = parent
                            .extra_fields
                            .iter()
                            .map(|path| {
                                let segments: Vec<&str> = path.iter().map(String::as_str).collect();
                                (path.join("."), dpath_get(&record, &segments).map_or(Val::None, Val::from))
                            })
                            .collect();
                        out.push(Slice {
                            partition: vec![
                                (parent.partition_field.clone(), Val::from(value)),
                                ("parent_slice".into(), parent_slice.val()),
                            ],
                            extra,
                        });
                    }
                }
            }
            Ok(out)
        }
    }
}

/// `dpath.get` of a path of keys (list indices as numbers).
fn dpath_get<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    let mut at = v;
    for segment in path {
        at = match at {
            Value::Object(m) => m.get(*segment)?,
            Value::Array(items) => items.get(segment.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(at)
}

/// Reads every page of one slice (of a cursor's window, with its state:
/// records older than the state dropped where the cursor says so, and
/// `latest` the greatest cursor value kept). Records stay the page's
/// text unless a filter, a transformation or a cursor must read them.
fn read_slice(
    stream: &Stream,
    slice: &Slice,
    env: &Env,
    bounds: Option<(&DatetimeCursor, &CursorState)>,
    latest: &mut Option<Instant>,
    transport: &mut dyn Transport,
    on_records: &mut dyn FnMut(Vec<Box<RawValue>>) -> Result<Flow, ReadError>,
) -> Result<Flow, ReadError> {
    let retriever = &stream.retriever;
    let mut token = retriever.paginator.as_ref().and_then(|p| p.strategy.initial_token());
    let field_path = field_path(stream, env)?;
    let reach = retriever.paginator.as_ref().map_or(Reach::Nothing, |p| p.strategy.response_reach());
    let decode = bounds.is_some() || retriever.selector.filter.is_some() || !stream.transformations.is_empty();
    let handler = &stream.retriever.requester.error_handler;
    // The next page's request, started while this page's records are
    // handed over (none started if starting it failed: it is sent then).
    let mut ahead: Option<(Request, Option<Box<dyn Started>>)> = None;
    loop {
        let (request, started) = match ahead.take() {
            Some(ahead) => ahead,
            None => {
                session::log_in(stream, env, transport)?;
                (build::request(stream, slice, token.as_ref(), env)?, None)
            }
        };
        let Some(response) = send(handler, &request, started, env, transport)? else { return Ok(Flow::More) };
        // A page that is not UTF-8 is no JSON: an empty body.
        let text = std::str::from_utf8(&response.body).unwrap_or_default();
        let parsed = crate::extract::Parsed::parse(text, &field_path);
        let extracted = parsed.records(&field_path);
        let extracted_count = extracted.len() as i64;
        let (kept, last_record, feed_ends) = if decode {
            let records = extracted
                .into_iter()
                .map(|r| serde_json::from_str::<Value>(r.get()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ReadError::Invalid(format!("stream {}: a record: {e}", stream.name)))?;
            let (kept, last_record, feed_ends) = select(stream, slice, env, bounds, token.as_ref(), records)?;
            if let Some((cursor, _)) = bounds {
                *latest = incremental::latest(cursor, &kept, *latest);
            }
            let kept = kept
                .iter()
                .map(serde_json::value::to_raw_value)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ReadError::Invalid(format!("stream {}: a record: {e}", stream.name)))?;
            (kept, last_record, feed_ends)
        } else {
            let last_record =
                extracted.last().map_or(Val::None, |r| serde_json::from_str(r.get()).unwrap_or(Val::None));
            (extracted.into_iter().map(ToOwned::to_owned).collect(), last_record, false)
        };
        let kept_count = kept.len() as i64;
        // The next page, asked for before this one's records go (what
        // fails on the way is told after they have gone).
        let next = if feed_ends {
            Ok(None)
        } else {
            let read = PageRead {
                response: &response,
                parsed: &parsed,
                last_record,
                kept: kept_count,
                extracted: extracted_count,
            };
            next_page(stream, slice, env, &reach, read, token.as_ref()).and_then(|next| {
                let Some(next) = next else { return Ok(None) };
                session::log_in(stream, env, transport)?;
                let request = build::request(stream, slice, Some(&next), env)?;
                let started = transport.start(&request).ok();
                Ok(Some((next, request, started)))
            })
        };
        if !kept.is_empty() && on_records(kept)? == Flow::Enough {
            return Ok(Flow::Enough);
        }
        match next? {
            Some((next, request, started)) => {
                token = Some(next);
                ahead = Some((request, started));
            }
            None => return Ok(Flow::More),
        }
    }
}

/// What a page gave its paginator to read.
struct PageRead<'a> {
    response: &'a Response,
    parsed: &'a crate::extract::Parsed<'a>,
    last_record: Val,
    kept: i64,
    extracted: i64,
}

/// The token of the page after `read` (none after the last page).
fn next_page(
    stream: &Stream,
    slice: &Slice,
    env: &Env,
    reach: &Reach,
    read: PageRead,
    token: Option<&Val>,
) -> Result<Option<Val>, ReadError> {
    let Some(paginator) = &stream.retriever.paginator else { return Ok(None) };
    let mut headers: Vec<(String, Val)> =
        read.response.headers.iter().map(|(k, v)| (k.clone(), Val::Str(v.clone()))).collect();
    let link = read.response.header("link").map(crate::paginate::links).unwrap_or(Val::Dict(Vec::new()));
    headers.retain(|(k, _)| !k.eq_ignore_ascii_case("link"));
    headers.push(("link".into(), link));
    let page = Page {
        response: read.parsed.view(reach),
        headers: Val::Dict(headers),
        last_record: read.last_record,
        last_page_size: match paginator.strategy {
            Strategy::Cursor { .. } => read.kept,
            _ => read.extracted,
        },
        last_token: token.cloned(),
        stream_slice: slice.val(),
    };
    paginator
        .strategy
        .next_token(&page, &env.config, &paginator.parameters, env.now)
        .map_err(|e| ReadError::Invalid(format!("stream {}: the next page: {e}", stream.name)))
}

/// The records of a page a filter, transformations or a cursor keep, as
/// the CDK's record selector keeps them; the last record the paginator
/// sees; and whether a data feed ends with this page (its last record
/// older than the state).
fn select(
    stream: &Stream,
    slice: &Slice,
    env: &Env,
    bounds: Option<(&DatetimeCursor, &CursorState)>,
    token: Option<&Val>,
    extracted: Vec<Value>,
) -> Result<(Vec<Value>, Val, bool), ReadError> {
    let retriever = &stream.retriever;
    let transform_first =
        retriever.selector.transform_before_filtering.unwrap_or_else(|| bounds.is_some_and(|(c, _)| c.client_side));
    let ctx = retriever.selector.filter.as_ref().map(|_| {
        Context::at(env.now)
            .with("config", env.config.clone())
            .with("parameters", retriever.selector.filter_parameters.clone())
            .with("stream_slice", slice.val())
            .with("next_page_token", build::next_page_token(token))
            .with("stream_state", Val::Dict(Vec::new()))
    });
    let mut kept = Vec::with_capacity(extracted.len());
    for mut record in extracted {
        if transform_first {
            for t in &stream.transformations {
                transform(t, &mut record, slice, env)?;
            }
        }
        if let Some((cursor, state)) = bounds
            && cursor.client_side
            && !cursor.data_feed
            && !state.keeps(cursor, &record)
        {
            continue;
        }
        if let (Some(filter), Some(ctx)) = (&retriever.selector.filter, &ctx) {
            let ctx = ctx.clone().with("record", Val::from(&record));
            if !crate::paginate::condition(filter, &ctx).map_err(|e| ReadError::evaluation("the record filter", e))? {
                continue;
            }
        }
        if !transform_first {
            for t in &stream.transformations {
                transform(t, &mut record, slice, env)?;
            }
        }
        if env.secrets.touches_json(&record) {
            return Err(ReadError::Secret(format!("stream {}: a record would hold a secret", stream.name)));
        }
        kept.push(record);
    }
    let last_record = kept.last().map_or(Val::None, Val::from);
    // A data feed stops at the first page whose last record is older
    // than the state, and drops the older records once pages have seen
    // them.
    let mut feed_ends = false;
    if let Some((cursor, state)) = bounds
        && cursor.data_feed
    {
        feed_ends = kept.last().is_some_and(|r| !state.keeps(cursor, r));
        kept.retain(|r| state.keeps(cursor, r));
    }
    Ok((kept, last_record, feed_ends))
}

/// The extractor's field path, rendered.
fn field_path(stream: &Stream, env: &Env) -> Result<Vec<String>, ReadError> {
    let selector = &stream.retriever.selector;
    let ctx = Context::at(env.now)
        .with("config", env.config.clone())
        .with("parameters", selector.extractor_parameters.clone());
    selector
        .field_path
        .iter()
        .map(|t| t.eval_string(&ctx).map(|v| v.to_text()).map_err(|e| ReadError::evaluation("the field path", e)))
        .collect()
}

/// Sends a request, retrying as the error handler says; `None` for an
/// answer the handler ignores.
fn send(
    handler: &ErrorHandler,
    request: &Request,
    mut started: Option<Box<dyn Started>>,
    env: &Env,
    transport: &mut dyn Transport,
) -> Result<Option<Response>, ReadError> {
    let ctx = Context::at(env.now);
    let mut attempt = 0;
    loop {
        // The first attempt may have been started already.
        let response = match started.take() {
            Some(started) => started.finish(),
            None => transport.send(request),
        }
        .map_err(ReadError::Transport)?;
        let now = transport.now();
        let now = now.timestamp() as f64 + f64::from(now.timestamp_subsec_micros()) / 1e6;
        match http::classify(handler, &response, &env.config, &ctx, attempt, now) {
            http::Verdict::Success => return Ok(Some(response)),
            http::Verdict::Ignore => return Ok(None),
            http::Verdict::Retry { wait, retries } if attempt < retries => {
                attempt += 1;
                transport.wait(wait.clamp(0.0, 600.0));
            }
            http::Verdict::Retry { .. } => {
                return Err(ReadError::Provider {
                    status: response.status,
                    url: request.url.clone(),
                    message: format!("still failing after {attempt} retries"),
                });
            }
            http::Verdict::Fail(message) => {
                return Err(ReadError::Provider { status: response.status, url: request.url.clone(), message });
            }
        }
    }
}

/// Applies one transformation to a record.
fn transform(t: &Transformation, record: &mut Value, slice: &Slice, env: &Env) -> Result<(), ReadError> {
    match t {
        Transformation::AddFields { fields, condition, parameters } => {
            for field in fields {
                let ctx = Context::at(env.now)
                    .with("config", env.config.clone())
                    .with("parameters", parameters.clone())
                    .with("record", Val::from(&*record))
                    .with("stream_slice", slice.val())
                    .with("stream_state", Val::Dict(Vec::new()));
                // An `InterpolatedString`: nothing rendered is "".
                let value = field
                    .value
                    .eval_string_as(&ctx, |v| field.value_type.is_none_or(|t| t.admits(v)))
                    .map_err(|e| ReadError::evaluation("an added field", e))?;
                if let Some(condition) = condition {
                    let path = Val::List(field.path.iter().map(|p| Val::Str(p.clone())).collect());
                    let ctx = ctx.with("value", value.clone()).with("path", path);
                    if !crate::paginate::condition(condition, &ctx)
                        .map_err(|e| ReadError::evaluation("the condition", e))?
                    {
                        continue;
                    }
                }
                dpath_new(record, &field.path, value.to_json());
            }
            Ok(())
        }
        Transformation::RemoveFields { pointers, condition, parameters } => {
            for pointer in pointers {
                let keep = |v: &Value| -> Result<bool, ReadError> {
                    let Some(condition) = condition else { return Ok(false) };
                    let ctx = Context::at(env.now)
                        .with("config", env.config.clone())
                        .with("parameters", parameters.clone())
                        .with("property", Val::from(v))
                        .with("stream_slice", slice.val())
                        .with("stream_state", Val::Dict(Vec::new()));
                    Ok(!crate::paginate::condition(condition, &ctx)
                        .map_err(|e| ReadError::evaluation("the condition", e))?)
                };
                remove(record, pointer, &keep)?;
            }
            Ok(())
        }
    }
}

/// `dpath.new`: sets `value` at `path`, making objects on the way.
fn dpath_new(record: &mut Value, path: &[String], value: Value) {
    let Some((last, parents)) = path.split_last() else { return };
    let mut at = record;
    for p in parents {
        let Value::Object(map) = at else { return };
        at = map.entry(p.clone()).or_insert_with(|| Value::Object(Default::default()));
    }
    if let Value::Object(map) = at {
        map.insert(last.clone(), value);
    }
}

/// `dpath.delete` of a glob path (`*` any key or index), where `keep`
/// does not spare the value.
fn remove(
    record: &mut Value,
    path: &[String],
    keep: &dyn Fn(&Value) -> Result<bool, ReadError>,
) -> Result<(), ReadError> {
    let Some((first, rest)) = path.split_first() else { return Ok(()) };
    match record {
        Value::Object(map) => {
            let keys: Vec<String> =
                if first == "*" || first == "**" { map.keys().cloned().collect() } else { vec![first.clone()] };
            for k in keys {
                if rest.is_empty() {
                    if let Some(v) = map.get(&k)
                        && !keep(v)?
                    {
                        map.remove(&k);
                    }
                } else if let Some(child) = map.get_mut(&k) {
                    remove(child, rest, keep)?;
                }
            }
        }
        Value::Array(items) => {
            let indices: Vec<usize> = if first == "*" || first == "**" {
                (0..items.len()).collect()
            } else {
                first.parse::<usize>().ok().into_iter().filter(|i| *i < items.len()).collect()
            };
            if rest.is_empty() {
                let mut index = 0;
                let mut err = None;
                items.retain(|v| {
                    let removing = indices.contains(&index)
                        && err.is_none()
                        && !keep(v).unwrap_or_else(|e| {
                            err = Some(e);
                            true
                        });
                    index += 1;
                    !removing
                });
                if let Some(e) = err {
                    return Err(e);
                }
            } else {
                for i in indices {
                    remove(&mut items[i], rest, keep)?;
                }
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stream(name: &str, path: &str, extra: Value) -> Value {
        let mut s = json!({ "type": "DeclarativeStream", "name": name,
            "retriever": { "type": "SimpleRetriever",
                "requester": { "type": "HttpRequester", "url_base": "https://api.example.com", "path": path },
                "record_selector": { "type": "RecordSelector",
                    "extractor": { "type": "DpathExtractor", "field_path": ["data"] } } } });
        for (k, v) in extra.as_object().into_iter().flatten() {
            s[k] = v.clone();
        }
        s
    }

    fn list(values: Value, field: &str) -> Value {
        json!({ "type": "ListPartitionRouter", "values": values, "cursor_field": field,
            "request_option": { "type": "RequestOption", "inject_into": "request_parameter", "field_name": field } })
    }

    /// Before a read, every value of every list router is sent in some
    /// first request (not every combination); a parent with a cursor is
    /// built as it is read, over its first window without its routers.
    #[test]
    fn first_requests_cover_each_list_value_and_parents_as_they_are_read() {
        let now: DateTime<Utc> = "2024-01-01T00:00:00Z".parse().unwrap();
        let mut routed = stream("routed", "/items", json!({}));
        routed["retriever"]["partition_router"] =
            json!([list(json!(["1", "2"]), "a"), list(json!(["x", "y", "z"]), "b")]);
        let mut parent = stream(
            "parents",
            "/parents",
            json!({ "incremental_sync": { "type": "DatetimeBasedCursor",
            "cursor_field": "updated", "datetime_format": "%Y-%m-%d", "start_datetime": "2023-12-01", "step": "P100D",
            "cursor_granularity": "P1D" } }),
        );
        let grandparent = stream("grandparents", "/grandparents", json!({}));
        parent["retriever"]["partition_router"] = json!([list(json!(["p"]), "c"), { "type": "SubstreamPartitionRouter",
            "parent_stream_configs": [{ "type": "ParentStreamConfig", "stream": grandparent, "parent_key": "id",
                "partition_field": "g" }] }]);
        let mut child = stream("children", "/children", json!({}));
        child["retriever"]["partition_router"] = json!({ "type": "SubstreamPartitionRouter",
            "parent_stream_configs": [{ "type": "ParentStreamConfig", "stream": parent, "parent_key": "id",
                "partition_field": "parent_id" }] });
        let manifest = json!({ "version": "6.44.0", "type": "DeclarativeSource",
            "check": { "type": "CheckStream", "stream_names": ["routed"] }, "streams": [routed, child] });
        let (source, env) = prepare(&manifest, &Val::from(&json!({})), &[], now).unwrap();
        let firsts = first_requests(&source, &env);
        let sent: Vec<(String, Vec<(String, String)>)> = firsts
            .iter()
            .map(|(s, r)| {
                let r = r.as_ref().unwrap();
                (s.name.clone(), r.query.iter().filter(|(k, _)| k.len() == 1).cloned().collect())
            })
            .collect();
        let pair = |a: &str, b: &str| vec![("a".to_owned(), a.to_owned()), ("b".to_owned(), b.to_owned())];
        assert_eq!(
            sent,
            [
                ("routed".to_owned(), pair("1", "x")),
                ("routed".to_owned(), pair("2", "x")),
                ("routed".to_owned(), pair("1", "y")),
                ("routed".to_owned(), pair("1", "z")),
                ("children".to_owned(), vec![]),
                ("parents".to_owned(), vec![]),
            ],
            "the parent's router value `c` is not sent, and its own parent is not built"
        );
    }
}
