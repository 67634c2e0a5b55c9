//! The next page's token, as the CDK's pagination strategies compute it
//! from the page just read: `CursorPagination` (a template over the
//! response, with an optional stop condition), `PageIncrement` and
//! `OffsetIncrement` (counting pages or records, stopping at a short or
//! empty page). Where the token goes in the next request is the
//! paginator's business, not this module's.

use chrono::{DateTime, Utc};

use crate::interpolation::{Context, InterpolationError, Reach, Template, Val};

/// A pagination strategy, its templates parsed.
#[derive(Debug, Clone, PartialEq)]
pub enum Strategy {
    Cursor { cursor_value: Template, stop_condition: Option<Template>, page_size: Option<i64> },
    PageIncrement { page_size: Option<i64>, start_from_page: i64, inject_on_first_request: bool },
    OffsetIncrement { page_size: Option<PageSize>, inject_on_first_request: bool },
}

/// An offset strategy's page size: a number, or a template over the
/// configuration and the response.
#[derive(Debug, Clone, PartialEq)]
pub enum PageSize {
    Fixed(i64),
    Interpolated(Template),
}

/// What the strategy sees of the page just read.
#[derive(Debug, Clone)]
pub struct Page {
    /// The decoded body (as much of it as the strategy reads:
    /// [`Strategy::response_reach`]).
    pub response: Val,
    /// The response's headers (names as sent), `link` replaced by the
    /// parsed Link header ([`links`]).
    pub headers: Val,
    pub last_record: Val,
    /// Records the selector extracted from the page, before any filter.
    pub last_page_size: i64,
    /// The token the page was requested with, if any.
    pub last_token: Option<Val>,
    pub stream_slice: Val,
}

/// Why no token can be computed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PaginationError {
    Interpolation(InterpolationError),
    /// The previous token of a counting strategy is not an integer.
    NotAnInteger(String),
    /// A page size that is not an integer.
    PageSize(String),
}

impl std::fmt::Display for PaginationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PaginationError::Interpolation(e) => write!(f, "{e}"),
            PaginationError::NotAnInteger(t) => write!(f, "the last page token {t} is not an integer"),
            PaginationError::PageSize(t) => write!(f, "the page size {t} is not an integer"),
        }
    }
}

impl std::error::Error for PaginationError {}

impl From<InterpolationError> for PaginationError {
    fn from(e: InterpolationError) -> Self {
        PaginationError::Interpolation(e)
    }
}

impl Strategy {
    /// The strategy a manifest's component describes (after
    /// [`crate::resolve`]), its templates parsed; `config` evaluates an
    /// interpolated page size of a cursor, as the CDK does once.
    pub fn from_component(
        component: &serde_json::Value,
        config: &Val,
        now: DateTime<Utc>,
    ) -> Result<Strategy, PaginationError> {
        use serde_json::Value;
        let text = |key: &str| component.get(key).and_then(Value::as_str);
        let template = |key: &str| text(key).map(Template::parse).transpose();
        let flag = |key: &str| component.get(key).and_then(Value::as_bool).unwrap_or(false);
        let unsupported = |what: String| PaginationError::Interpolation(InterpolationError::Unsupported(what));
        match text("type") {
            Some("CursorPagination") => {
                let cursor_value =
                    template("cursor_value")?.ok_or_else(|| unsupported("a cursor without cursor_value".into()))?;
                let page_size = match component.get("page_size") {
                    None | Some(Value::Null) => None,
                    Some(Value::Number(n)) => n.as_i64(),
                    Some(Value::String(t)) => {
                        match Template::parse(t)?.eval(&Context::at(now).with("config", config.clone()))? {
                            Val::Int(n) => Some(n),
                            _ => None,
                        }
                    }
                    Some(_) => None,
                };
                Ok(Strategy::Cursor { cursor_value, stop_condition: template("stop_condition")?, page_size })
            }
            Some("PageIncrement") => Ok(Strategy::PageIncrement {
                page_size: match component.get("page_size") {
                    None | Some(Value::Null) => None,
                    Some(Value::Number(n)) => n.as_i64(),
                    Some(Value::String(t)) => {
                        let parameters = component.get("$parameters").map_or(Val::Dict(Vec::new()), Val::from);
                        let ctx = Context::at(now).with("config", config.clone()).with("parameters", parameters);
                        match Template::parse(t)?.eval_string(&ctx)? {
                            Val::Int(n) => Some(n),
                            other => {
                                return Err(PaginationError::PageSize(other.repr()));
                            }
                        }
                    }
                    Some(_) => None,
                },
                start_from_page: component.get("start_from_page").and_then(Value::as_i64).unwrap_or(0),
                inject_on_first_request: flag("inject_on_first_request"),
            }),
            Some("OffsetIncrement") => Ok(Strategy::OffsetIncrement {
                page_size: match component.get("page_size") {
                    Some(Value::Number(n)) => n.as_i64().map(PageSize::Fixed),
                    Some(Value::String(t)) if !t.is_empty() => Some(PageSize::Interpolated(Template::parse(t)?)),
                    _ => None,
                },
                inject_on_first_request: flag("inject_on_first_request"),
            }),
            other => Err(unsupported(format!("the pagination strategy {}", other.unwrap_or("without a type")))),
        }
    }

    /// The page size a `page_size_option` sends, as the strategy's
    /// `get_page_size` gives it (an interpolated offset size read from the
    /// configuration alone).
    pub fn page_size(
        &self,
        config: &Val,
        parameters: &Val,
        now: DateTime<Utc>,
    ) -> Result<Option<i64>, PaginationError> {
        match self {
            Strategy::Cursor { page_size, .. } | Strategy::PageIncrement { page_size, .. } => Ok(*page_size),
            Strategy::OffsetIncrement { page_size: None, .. } => Ok(None),
            Strategy::OffsetIncrement { page_size: Some(PageSize::Fixed(n)), .. } => Ok(Some(*n)),
            Strategy::OffsetIncrement { page_size: Some(PageSize::Interpolated(t)), .. } => {
                let ctx = Context::at(now).with("config", config.clone()).with("parameters", parameters.clone());
                match t.eval_string(&ctx)? {
                    Val::Int(n) => Ok(Some(n)),
                    other => Err(PaginationError::PageSize(other.repr())),
                }
            }
        }
    }

    /// Whether the strategy has a page size at all.
    pub fn has_page_size(&self) -> bool {
        match self {
            Strategy::Cursor { page_size, .. } | Strategy::PageIncrement { page_size, .. } => page_size.is_some(),
            Strategy::OffsetIncrement { page_size, .. } => page_size.is_some(),
        }
    }

    /// What the strategy's templates read of the response.
    pub fn response_reach(&self) -> Reach {
        match self {
            Strategy::Cursor { cursor_value, stop_condition, .. } => {
                let stop = stop_condition.as_ref().map_or(Reach::Nothing, |t| t.reach("response"));
                cursor_value.reach("response").and(stop)
            }
            Strategy::OffsetIncrement { page_size: Some(PageSize::Interpolated(t)), .. } => t.reach("response"),
            _ => Reach::Nothing,
        }
    }

    /// The token of the first request, if the strategy sends one.
    pub fn initial_token(&self) -> Option<Val> {
        match self {
            Strategy::Cursor { .. } => None,
            Strategy::PageIncrement { start_from_page, inject_on_first_request: true, .. } => {
                Some(Val::Int(*start_from_page))
            }
            Strategy::OffsetIncrement { inject_on_first_request: true, .. } => Some(Val::Int(0)),
            _ => None,
        }
    }

    /// The next page's token after `page`, or `None` when the pages end.
    /// `config` and `parameters` are the source's configuration and the
    /// component's `$parameters`; `now` is the clock templates see.
    pub fn next_token(
        &self,
        page: &Page,
        config: &Val,
        parameters: &Val,
        now: DateTime<Utc>,
    ) -> Result<Option<Val>, PaginationError> {
        match self {
            Strategy::Cursor { cursor_value, stop_condition, page_size } => {
                let ctx = Context::at(now)
                    .with("config", config.clone())
                    .with("parameters", parameters.clone())
                    .with("response", page.response.clone())
                    .with("headers", page.headers.clone())
                    .with("last_record", page.last_record.clone())
                    .with("last_page_size", Val::Int(page.last_page_size))
                    .with("page_size", page_size.map_or(Val::None, Val::Int))
                    .with("stream_slice", page.stream_slice.clone());
                if let Some(stop) = stop_condition
                    && condition(stop, &ctx)?
                {
                    return Ok(None);
                }
                let token = cursor_value.eval_string(&ctx)?;
                Ok(token.truthy().then_some(token))
            }
            Strategy::PageIncrement { page_size, start_from_page, .. } => {
                if page_size.is_some_and(|size| size != 0 && page.last_page_size < size) || page.last_page_size == 0 {
                    return Ok(None);
                }
                match &page.last_token {
                    None => Ok(Some(Val::Int(start_from_page + 1))),
                    Some(Val::Int(last)) => Ok(Some(Val::Int(last + 1))),
                    Some(other) => Err(PaginationError::NotAnInteger(other.repr())),
                }
            }
            Strategy::OffsetIncrement { page_size, .. } => {
                let size = match page_size {
                    None => None,
                    Some(PageSize::Fixed(n)) => Some(Val::Int(*n)),
                    Some(PageSize::Interpolated(t)) => Some(
                        t.eval_string(
                            &Context::at(now)
                                .with("config", config.clone())
                                .with("parameters", parameters.clone())
                                .with("response", page.response.clone()),
                        )?,
                    ),
                };
                let short = match size {
                    Some(Val::Int(n)) if n != 0 => page.last_page_size < n,
                    Some(Val::Float(f)) if f != 0.0 => (page.last_page_size as f64) < f,
                    _ => false,
                };
                if short || page.last_page_size == 0 {
                    return Ok(None);
                }
                match &page.last_token {
                    None => Ok(Some(Val::Int(page.last_page_size))),
                    Some(Val::Int(last)) => Ok(Some(Val::Int(last + page.last_page_size))),
                    Some(other) => Err(PaginationError::NotAnInteger(other.repr())),
                }
            }
        }
    }
}

/// A stop condition's verdict, as the CDK's `InterpolatedBoolean`: an
/// undefined or empty result is false; a result among Python's false
/// spellings (`False`, `0`, `[]`, `{}`, `""`, …) is false; anything else,
/// `None` included, is true.
pub fn condition(template: &Template, ctx: &Context) -> Result<bool, InterpolationError> {
    let text = match template.render(ctx) {
        Err(InterpolationError::Undefined(_)) => return Ok(false),
        Err(InterpolationError::Type(_)) => template.source().to_owned(),
        Err(e) => return Err(e),
        Ok(text) if text.is_empty() => return Ok(false),
        Ok(text) if template.is_static() => return Ok(!is_false_value(&Val::Str(text))),
        Ok(text) => text,
    };
    Ok(!is_false_value(&crate::interpolation::literal_or_text(text)))
}

/// Membership in the CDK's `FALSE_VALUES` (Python equality: `0 == False`).
fn is_false_value(v: &Val) -> bool {
    match v {
        Val::Bool(b) => !b,
        Val::Int(i) => *i == 0,
        Val::Float(f) => *f == 0.0,
        Val::Str(s) => matches!(s.as_str(), "False" | "false" | "{}" | "[]" | "()" | "" | "0" | "0.0"),
        Val::List(items) => items.is_empty(),
        Val::Dict(entries) => entries.is_empty(),
        _ => false,
    }
}

/// A Link header as `requests` parses it (`response.links`): each link
/// under its `rel` (or its URL), with its `url` and parameters.
pub fn links(header: &str) -> Val {
    const STRIP: &[char] = &[' ', '\'', '"'];
    let mut out: Vec<(String, Val)> = Vec::new();
    let value = header.trim_matches(STRIP);
    if value.is_empty() {
        return Val::Dict(out);
    }
    for part in split_links(value) {
        let (url, params) = part.split_once(';').unwrap_or((part, ""));
        let mut link: Vec<(String, Val)> =
            vec![("url".into(), Val::Str(url.trim_matches(&['<', '>', ' ', '\'', '"'][..]).to_owned()))];
        for param in params.split(';') {
            let mut pieces = param.split('=');
            let (Some(key), Some(value), None) = (pieces.next(), pieces.next(), pieces.next()) else { break };
            let key = key.trim_matches(STRIP).to_owned();
            let value = Val::Str(value.trim_matches(STRIP).to_owned());
            match link.iter_mut().find(|(k, _)| *k == key) {
                Some(entry) => entry.1 = value,
                None => link.push((key, value)),
            }
        }
        let link = Val::Dict(link);
        let key = match (link.get("rel"), link.get("url")) {
            (Some(Val::Str(rel)), _) if !rel.is_empty() => rel.clone(),
            (_, Some(url)) => url.to_text(),
            _ => String::new(),
        };
        match out.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = link,
            None => out.push((key, link)),
        }
    }
    Val::Dict(out)
}

/// `re.split(", *<", value)`: the pieces between `,` + spaces + `<`.
fn split_links(value: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let bytes = value.as_bytes();
    let (mut start, mut i) = (0, 0);
    while i < bytes.len() {
        if bytes[i] == b',' {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] == b' ' {
                j += 1;
            }
            if j < bytes.len() && bytes[j] == b'<' {
                pieces.push(&value[start..i]);
                start = j + 1;
                i = j + 1;
                continue;
            }
        }
        i += 1;
    }
    pieces.push(&value[start..]);
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-20T12:00:00Z").unwrap().with_timezone(&Utc)
    }

    fn page(response: serde_json::Value, size: i64, last: Option<Val>) -> Page {
        Page {
            response: Val::from(&response),
            headers: Val::Dict(vec![(
                "link".into(),
                links(
                    "<https://api.example.com/items?page=2>; rel=\"next\", <https://api.example.com/items?page=9>; rel=\"last\"",
                ),
            )]),
            last_record: Val::None,
            last_page_size: size,
            last_token: last,
            stream_slice: Val::Dict(vec![]),
        }
    }

    #[test]
    fn cursors_stop_conditions_and_counters_give_the_next_token() {
        let config = Val::from(&json!({}));
        let params = Val::Dict(vec![]);
        let cursor = Strategy::Cursor {
            cursor_value: Template::parse("{{ response.next }}").unwrap(),
            stop_condition: Some(Template::parse("{{ not response.has_more }}").unwrap()),
            page_size: None,
        };
        let next = |s: &Strategy, p: &Page| s.next_token(p, &config, &params, now()).unwrap();
        assert_eq!(
            next(&cursor, &page(json!({ "next": "c2", "has_more": true }), 3, None)),
            Some(Val::Str("c2".into()))
        );
        assert_eq!(next(&cursor, &page(json!({ "next": "c2", "has_more": false }), 3, None)), None);
        assert_eq!(next(&cursor, &page(json!({ "has_more": true }), 3, None)), None);
        let link = Strategy::Cursor {
            cursor_value: Template::parse("{{ headers['link']['next']['url'] }}").unwrap(),
            stop_condition: None,
            page_size: None,
        };
        assert_eq!(
            next(&link, &page(json!({}), 3, None)),
            Some(Val::Str("https://api.example.com/items?page=2".into()))
        );
        let pages = Strategy::PageIncrement { page_size: Some(3), start_from_page: 1, inject_on_first_request: false };
        assert_eq!(next(&pages, &page(json!({}), 3, None)), Some(Val::Int(2)));
        assert_eq!(next(&pages, &page(json!({}), 3, Some(Val::Int(4)))), Some(Val::Int(5)));
        assert_eq!(next(&pages, &page(json!({}), 2, Some(Val::Int(4)))), None);
        assert_eq!(pages.initial_token(), None);
        let offsets = Strategy::OffsetIncrement { page_size: Some(PageSize::Fixed(3)), inject_on_first_request: true };
        assert_eq!(offsets.initial_token(), Some(Val::Int(0)));
        assert_eq!(next(&offsets, &page(json!({}), 3, Some(Val::Int(0)))), Some(Val::Int(3)));
        assert_eq!(next(&offsets, &page(json!({}), 0, Some(Val::Int(3)))), None);
        assert!(offsets.next_token(&page(json!({}), 3, Some(Val::Str("x".into()))), &config, &params, now()).is_err());
    }

    #[test]
    fn link_headers_read_as_requests_reads_them() {
        let parsed =
            links("<https://a/x?p=2>; rel=\"next\"; title=\"n\", <https://a/x?p=1>;rel=prev, <https://a/no-rel>");
        assert_eq!(parsed.get("next").and_then(|l| l.get("url")), Some(&Val::Str("https://a/x?p=2".into())));
        assert_eq!(parsed.get("next").and_then(|l| l.get("title")), Some(&Val::Str("n".into())));
        assert_eq!(parsed.get("prev").and_then(|l| l.get("url")), Some(&Val::Str("https://a/x?p=1".into())));
        assert!(parsed.get("https://a/no-rel").is_some());
        assert_eq!(links("  "), Val::Dict(vec![]));
    }
}
