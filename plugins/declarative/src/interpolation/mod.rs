//! Interpolated strings of a declarative manifest: a subset of Jinja2 with
//! Airbyte's variables and macros.
//!
//! A [`Template`] is parsed once ([`Template::parse`]) and rendered against
//! a [`Context`] as often as needed ([`Template::eval`]). As in Airbyte's
//! CDK, a string without `{{`/`{%` is itself; otherwise the template is
//! rendered to text, and text that reads as a Python literal becomes that
//! literal (`"{{ 5 }}"` is the integer 5, `"{{ [1, 2] }}"` a list), empty
//! text is `None`, and any other text stays text.
//!
//! # Layout
//!
//! | module | holds |
//! |---|---|
//! | [`value`] | the values an expression computes, with Python's text forms |
//! | `parse` | templates and expressions, with Jinja2's precedence |
//! | `eval` | operators, macros, filters, tests and methods |
//! | `literal` | the CDK's `literal_eval` of a rendered template |
//! | this file | [`Template`], [`Context`], [`Reach`] and [`InterpolationError`] |

pub(crate) mod eval;
mod literal;
mod parse;
pub mod value;

use std::collections::HashMap;

use chrono::{DateTime, Utc};

pub use value::Val;

/// Why a template cannot be parsed or evaluated. Messages name the
/// construct, never a value of the context (which may hold secrets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InterpolationError {
    /// Not Jinja, or not closed.
    Syntax(String),
    /// Jinja (or a macro, filter, method or tag) this runtime does not
    /// have: named, so a manifest using it is refused up front.
    Unsupported(String),
    /// A runtime failure: a type error, a bad date, a division by zero,
    /// a variable the context does not declare.
    Evaluation(String),
    /// What Python calls a `TypeError` (`'a' + 1`): [`Template::eval`]
    /// gives the template as written, as the CDK does.
    Type(String),
    /// An undefined value used where a value is needed (`x.y` of a
    /// missing `x`, `missing > 0`): [`Template::eval`] gives `None` for it,
    /// as the CDK gives its default.
    Undefined(String),
}

impl std::fmt::Display for InterpolationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InterpolationError::Syntax(m) => write!(f, "not a valid template: {m}"),
            InterpolationError::Unsupported(m) => write!(f, "unsupported: {m}"),
            InterpolationError::Evaluation(m) => write!(f, "cannot be evaluated: {m}"),
            InterpolationError::Undefined(m) => write!(f, "undefined: {m}"),
            InterpolationError::Type(m) => write!(f, "of the wrong type: {m}"),
        }
    }
}

impl std::error::Error for InterpolationError {}

/// What a template sees: its variables (`config`, `stream_slice`,
/// `next_page_token`, `response`, …) and the instant `now_utc()` returns.
#[derive(Debug, Clone)]
pub struct Context {
    pub variables: HashMap<String, Val>,
    pub now: DateTime<Utc>,
}

impl Context {
    /// A context at `now` with no variables.
    pub fn at(now: DateTime<Utc>) -> Context {
        Context { variables: HashMap::new(), now }
    }

    /// The same context with `name` bound to `value`.
    pub fn with(mut self, name: &str, value: Val) -> Context {
        self.variables.insert(name.to_owned(), value);
        self
    }
}

/// What a template reads of one variable: nothing, the values at some
/// key paths of it (`response.meta.next`, `response['links'].get('next')`),
/// or all of it (a method called on it, a key computed, the variable
/// itself).
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Reach {
    #[default]
    Nothing,
    Paths(Vec<Vec<String>>),
    Whole,
}

impl Reach {
    /// `path` read too (the empty path is all of it).
    pub fn add(&mut self, path: Vec<String>) {
        match self {
            _ if path.is_empty() => *self = Reach::Whole,
            Reach::Whole => {}
            Reach::Nothing => *self = Reach::Paths(vec![path]),
            Reach::Paths(paths) => paths.push(path),
        }
    }

    /// What this and `other` read together.
    pub fn and(mut self, other: Reach) -> Reach {
        match other {
            Reach::Nothing => {}
            Reach::Whole => self = Reach::Whole,
            Reach::Paths(paths) => paths.into_iter().for_each(|p| self.add(p)),
        }
        self
    }
}

/// A parsed interpolated string.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    source: String,
    /// `None` for a string without Jinja.
    nodes: Option<Vec<parse::Node>>,
}

impl Template {
    /// Parses `source`; refuses what is not Jinja or not supported.
    pub fn parse(source: &str) -> Result<Template, InterpolationError> {
        if source.contains("stream_state") {
            return Err(InterpolationError::Unsupported(
                "stream_state (the CDK no longer interpolates it; use stream_interval)".into(),
            ));
        }
        let nodes = if source.contains("{{") || source.contains("{%") || source.contains("{#") {
            Some(parse::template(source)?)
        } else {
            None
        };
        Ok(Template { source: source.to_owned(), nodes })
    }

    /// The template as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// What the template reads of the variable `name`.
    pub fn reach(&self, name: &str) -> Reach {
        let mut out = Reach::Nothing;
        if let Some(nodes) = &self.nodes {
            parse::reach(nodes, name, &mut out);
        }
        out
    }

    /// Whether the string holds Jinja at all.
    pub fn is_static(&self) -> bool {
        self.nodes.is_none()
    }

    /// The rendered text, as Jinja writes it. As Jinja's analysis in the
    /// CDK, every name must be declared, taken branch or not.
    pub fn render(&self, ctx: &Context) -> Result<String, InterpolationError> {
        let Some(nodes) = &self.nodes else { return Ok(self.source.clone()) };
        let mut names = Vec::new();
        parse::names(nodes, &mut names);
        if let Some(missing) = names.iter().find(|n| !eval::declared(n, ctx)) {
            return Err(InterpolationError::Evaluation(format!("undeclared variable {missing}")));
        }
        let mut out = String::new();
        eval::render(nodes, ctx, &mut out)?;
        // Jinja drops the template's one final newline.
        if self.source.ends_with('\n') && out.ends_with('\n') {
            out.pop();
            if out.ends_with('\r') && self.source.ends_with("\r\n") {
                out.pop();
            }
        }
        Ok(out)
    }

    /// The value as the CDK's `InterpolatedString` computes it (what most
    /// components hold): as [`Template::eval`], except that an undefined
    /// value used where a value is needed is an error (the CDK renders the
    /// same template again as its default, and fails), and an empty
    /// rendering is the empty string.
    pub fn eval_string(&self, ctx: &Context) -> Result<Val, InterpolationError> {
        self.eval_string_as(ctx, |_| true)
    }

    /// As [`Template::eval_string`], keeping the literal the text spells
    /// only when `valid` accepts it (an `AddFields` value's `value_type`).
    pub fn eval_string_as(&self, ctx: &Context, valid: impl Fn(&Val) -> bool) -> Result<Val, InterpolationError> {
        let read = |text: String| match literal::literal(&text) {
            Some(v) if valid(&v) => v,
            _ => Val::Str(text),
        };
        if self.nodes.is_none() {
            // Plain text is read as a literal too (`"100"` is 100).
            return Ok(read(self.source.clone()));
        }
        match self.render(ctx) {
            Ok(text) if text.is_empty() => Ok(Val::Str(text)),
            Ok(text) => Ok(read(text)),
            Err(InterpolationError::Type(_)) => Ok(read(self.source.clone())),
            Err(e) => Err(e),
        }
    }

    /// The value, as Airbyte's CDK computes it with no default: the
    /// rendered text, read as a Python literal where it is one.
    pub fn eval(&self, ctx: &Context) -> Result<Val, InterpolationError> {
        self.eval_as(ctx, |_| true)
    }

    /// As [`Template::eval`], keeping the literal the text spells only
    /// when `valid` accepts it (the CDK's `valid_types`), else the text.
    pub fn eval_as(&self, ctx: &Context, valid: impl Fn(&Val) -> bool) -> Result<Val, InterpolationError> {
        let text = match &self.nodes {
            None => Ok(self.source.clone()),
            Some(_) => self.render(ctx),
        };
        let text = match text {
            // Nothing rendered (an undefined value, an empty one) is None.
            Ok(text) if text.is_empty() => return Ok(Val::None),
            Err(InterpolationError::Undefined(_)) => return Ok(Val::None),
            Ok(text) => text,
            Err(InterpolationError::Type(_)) => self.source.clone(),
            Err(e) => return Err(e),
        };
        Ok(match literal::literal(&text) {
            Some(v) if valid(&v) => v,
            _ => Val::Str(text),
        })
    }
}

/// Rendered text as the CDK reads it: the Python literal it spells, or
/// the text itself.
pub(crate) fn literal_or_text(text: String) -> Val {
    literal::literal(&text).unwrap_or(Val::Str(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ctx() -> Context {
        let now = DateTime::parse_from_rfc3339("2026-11-20T12:00:00.123456Z").unwrap().with_timezone(&Utc);
        Context::at(now)
            .with(
                "config",
                Val::from(&json!({ "start_date": "2024-01-15T00:00:00Z", "page_size": "50", "symbols": ["A", "B"],
                    "lat": "45.5", "credentials": { "client_id": "id" }, "api_url": null, "start": "20240115" })),
            )
            .with("stream_slice", Val::from(&json!({ "start_time": "2024-01-01", "parent_slice": { "id": 7 } })))
            .with("next_page_token", Val::from(&json!({ "next_page_token": 3 })))
            .with(
                "response",
                Val::from(&json!({ "meta": { "next_page": null }, "hasNext": false, "items": [1, 2, 3] })),
            )
    }

    #[test]
    fn a_template_reaches_the_key_paths_it_reads() {
        let reach = |source: &str| Template::parse(source).unwrap().reach("response");
        let paths =
            |ps: &[&[&str]]| Reach::Paths(ps.iter().map(|p| p.iter().map(|s| (*s).to_owned()).collect()).collect());
        assert_eq!(reach("{{ response.meta.current_page + 1 }}"), paths(&[&["meta", "current_page"]]));
        assert_eq!(
            reach("{{ response['links'].get('next', config['x']) if response.has_more }}"),
            paths(&[&["links", "next"], &["has_more"]])
        );
        assert_eq!(reach("{{ not response.data }}"), paths(&[&["data"]]));
        assert_eq!(reach("{{ response.data | length < 10 }}"), paths(&[&["data"]]));
        assert_eq!(reach("{{ response.data[-1].id }}"), paths(&[&["data"]]));
        assert_eq!(reach("{{ 'next' not in response or response.next == '' }}"), paths(&[&["next"], &["next"]]));
        assert_eq!(reach("{{ 'a' in response.meta }}"), paths(&[&["meta", "a"]]));
        assert_eq!(reach("{{ response.meta in ['a'] }}"), paths(&[&["meta"]]));
        // A method, a computed key or the variable itself: all of it.
        assert_eq!(reach("{{ response.keys() | list }}"), Reach::Whole);
        assert_eq!(reach("{{ response[config['key']] }}"), Reach::Whole);
        assert_eq!(reach("{{ response }}"), Reach::Whole);
        assert_eq!(reach("{{ last_record.id }}"), Reach::Nothing);
        assert_eq!(reach("page"), Reach::Nothing);
        assert_eq!(reach("{{ response.a }}").and(reach("{{ response }}")), Reach::Whole);
    }

    fn eval(source: &str) -> Val {
        Template::parse(source)
            .unwrap_or_else(|e| panic!("{source}: {e}"))
            .eval(&ctx())
            .unwrap_or_else(|e| panic!("{source}: {e}"))
    }

    fn text(source: &str) -> String {
        eval(source).to_text()
    }

    #[test]
    /// Each expected value is what airbyte-cdk 7.39.1's `JinjaInterpolation`
    /// gives for the same expression, context and frozen clock.
    fn the_corpus_expressions_give_what_the_cdk_gives() {
        assert_eq!(eval("static"), Val::Str("static".into()));
        assert_eq!(eval("{{ config['page_size'] }}"), Val::Int(50));
        assert_eq!(eval("{{ config['page_size'] | int * 2 }}"), Val::Int(100));
        assert_eq!(eval("{{ config.get('missing', 'fallback') }}"), Val::Str("fallback".into()));
        assert_eq!(
            eval("{{ config['api_url'] or 'https://plausible.io/api/v1/stats' }}"),
            Val::Str("https://plausible.io/api/v1/stats".into())
        );
        assert_eq!(text("{{ ','.join(config.get('symbols', [])) }}"), "A,B");
        assert_eq!(text("{{ now_utc().strftime('%Y-%m-%dT%H:%M:%SZ') }}"), "2026-11-20T12:00:00Z");
        assert_eq!(text("{{ now_utc().strftime('%Y-%m-%dT%H:%M:%S.%f%z') }}"), "2026-11-20T12:00:00.123456+0000");
        assert_eq!(text("{{ now_utc().strftime('%s') }}"), "1795176000");
        assert_eq!(text("{{ now_utc().isoformat() }}"), "2026-11-20T12:00:00.123456+00:00");
        assert_eq!(text("{{ today_utc() }}"), "2026-11-20");
        assert_eq!(text("{{ today_utc().strftime('%Y%m%d') }}"), "20261120");
        assert_eq!(text("{{ day_delta(-1) }}"), "2026-11-19T12:00:00.123456+0000");
        assert_eq!(text("{{ day_delta(-365, format='%Y-%m-%dT%H:%M:%SZ') }}"), "2025-11-20T12:00:00Z");
        assert_eq!(text("{{ (now_utc() - duration('P30D')).strftime('%Y-%m-%d') }}"), "2026-10-21");
        assert_eq!(text("{{ format_datetime(config['start_date'], '%Y-%m-%d') }}"), "2024-01-15");
        assert_eq!(text("{{ format_datetime('2024-01-15', '%s') }}"), "1705276800");
        assert_eq!(eval("{{ timestamp(config['start_date']) * 1000 }}"), Val::Float(1_705_276_800_000.0));
        assert_eq!(eval("{{ timestamp(1705276800) }}"), Val::Int(1_705_276_800));
        assert_eq!(
            text("{{ max(day_delta(-365, format='%Y-%m-%dT%H:%M:%SZ'), config['start_date']) }}"),
            "2025-11-20T12:00:00Z"
        );
        assert_eq!(eval("{{ response['hasNext'] is false }}"), Val::Bool(true));
        assert_eq!(eval("{{ response.meta.next_page is none }}"), Val::Bool(true));
        assert_eq!(eval("{{ response['items'] | length > 2 }}"), Val::Bool(true));
        assert_eq!(eval("{{ next_page_token['next_page_token'] }}"), Val::Int(3));
        assert_eq!(eval("{{ stream_slice.parent_slice.id }}"), Val::Int(7));
        assert_eq!(text("{{ '/top/' ~ config.start[:4] ~ '/' ~ config.start[4:6] }}"), "/top/2024/01");
        assert_eq!(
            text("{% if -90.00 <= config['lat']|float <= 90.00 %}{{ config['lat'] }}{% else %}bad{% endif %}"),
            "45.5"
        );
        assert_eq!(text("{{ 'a' if 'start_date' in config else 'b' }}"), "a");
        assert_eq!(eval("{{ config['q w'] | urlencode }}"), Val::None);
        assert_eq!(eval("{{ config['missing'] }}"), Val::None);
        let strict = |source: &str| Template::parse(source).unwrap().eval_string(&ctx());
        assert_eq!(strict("{{ config['missing'] }}"), Ok(Val::Str(String::new())));
        assert!(matches!(strict("{{ config.missing.deeper }}"), Err(InterpolationError::Undefined(_))));
        assert_eq!(strict("{{ config['page_size'] }}"), Ok(Val::Int(50)));
        assert_eq!(eval("{{ ['id', 'secret'] | join(':') | base64encode }}"), Val::Str("aWQ6c2VjcmV0".into()));
        assert_eq!(eval("{{ 'aWQ6c2VjcmV0' | base64decode }}"), Val::Str("id:secret".into()));
        assert_eq!(eval("{{ config.missing.deeper }}"), Val::None);
        assert_eq!(eval("{{ 'abc'['x'] }}"), Val::None);
        assert_eq!(eval("{{ response.missing == 1 }}"), Val::Bool(false));
        assert_eq!(eval("{{ config.missing ~ 'a' }}"), Val::Str("a".into()));
        assert_eq!(eval("{{ config.missing | length }}"), Val::Int(0));
        assert_eq!(eval("{{ config.missing > 0 }}"), Val::None);
        assert_eq!(eval("{{ 'x' in response.missing }}"), Val::Bool(false));
        assert_eq!(eval("{{ stream_partition.parent_slice.id }}"), Val::Int(7));
        assert_eq!(eval("{{ 'page' not in response.missing }}"), Val::Bool(true));
        assert_eq!(eval("{{ config[response.missing] > 1 }}"), Val::None);
        assert_eq!(eval("{{ config.missing | int / 1000 }}"), Val::None);
        assert_eq!(eval("{{ [config.missing] }}"), Val::Str("[Undefined]".into()));
        assert_eq!(eval("{{ ','.join('ab') }}"), Val::Str("a,b".into()));
        assert_eq!(eval("{{ (config['start'] or 0) + 1 }}"), Val::Str("{{ (config['start'] or 0) + 1 }}".into()));
        assert_eq!(eval("{{ now_utc().isoformat('T', 'seconds') }}"), Val::Str("2026-11-20T12:00:00+00:00".into()));
        assert_eq!(eval("a{{ 1 }}\n"), Val::Str("a1".into()));
        assert_eq!(eval("{{ today_utc().strftime('%Y%m%d') }}"), Val::Int(20_261_120));
        assert_eq!(eval("{{ now_utc().timestamp() }}"), Val::Float(1_795_176_000.123_456));
        assert_eq!(text("{{ now_utc() }}"), "2026-11-20 12:00:00.123456+00:00");
        assert_eq!(text("{{ duration('PT1H') }}"), "1:00:00");
        assert_eq!(eval("{{ '01' }}"), Val::Str("01".into()));
        assert_eq!(eval("{{ config['credentials'] }}"), Val::Dict(vec![("client_id".into(), Val::Str("id".into()))]));
        assert_eq!(text("{{ 'a b/c' | urlencode }}"), "a%20b/c");
        assert_eq!(eval("{{ [1, 2] }}"), Val::List(vec![Val::Int(1), Val::Int(2)]));
        assert_eq!(eval("page {{ 2 }}"), Val::Str("page 2".into()));
        assert_eq!(eval("{{ config['start_date'] }}"), Val::Str("2024-01-15T00:00:00Z".into()));
        assert_eq!(text("{{ '  a b  '.strip().replace(' ', '_').lower() }}"), "a_b");
        assert_eq!(
            eval("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }}"),
            Val::Str("3 -4 1 1024 3.5".into())
        );
    }

    #[test]
    fn what_is_not_supported_is_named_and_what_fails_says_why() {
        for (source, says) in [
            ("{% for x in y %}{% endfor %}", "for"),
            ("{{ generate_uuid() }}", "generate_uuid"),
            ("{{ config | hash('md5') }}", "hash"),
            ("{{ config is odd }}", "odd"),
            ("{{ stream_state.updated_at }}", "stream_interval"),
            ("{{ now_utc().strftime('%Q') }}", "%Q"),
        ] {
            let e = Template::parse(source).and_then(|t| t.eval(&ctx())).unwrap_err();
            assert!(matches!(e, InterpolationError::Unsupported(_)) && e.to_string().contains(says), "{source}: {e}");
        }
        let e = Template::parse("{{ 'a' if true else nowhere }}").unwrap().eval(&ctx()).unwrap_err();
        assert_eq!(e, InterpolationError::Evaluation("undeclared variable nowhere".into()));
        let e = Template::parse("{{ 1 // 0 }}").unwrap().eval(&ctx()).unwrap_err();
        assert!(matches!(e, InterpolationError::Evaluation(_)), "{e}");
        let e = Template::parse("{{ config['credentials'] + 1 }}").unwrap().render(&ctx()).unwrap_err();
        assert!(matches!(e, InterpolationError::Type(_)), "{e}");
        assert!(!e.to_string().contains("\"id\""), "no value in the message: {e}");
        assert!(matches!(Template::parse("{{ ("), Err(InterpolationError::Syntax(_))));
    }
}
