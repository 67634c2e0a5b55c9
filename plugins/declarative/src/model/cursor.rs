//! A stream's `incremental_sync`: a `DatetimeBasedCursor`, read as the
//! CDK's factory builds its concurrent cursor — the cursor field, the
//! formats, the start and end (`MinMaxDatetime`s, evaluated once with the
//! configuration), step, granularity and lookback as ISO 8601 durations,
//! and where each window's bounds go in a request.

use chrono::{DateTime, FixedOffset, Utc};
use serde_json::Value;

use super::node::{Node, Refusal, template_of};
use super::request::RequestOption;
use crate::datetime::{self, Gap};
use crate::interpolation::{Context, Template, Val};

/// A `DatetimeBasedCursor`.
#[derive(Debug, Clone, PartialEq)]
pub struct DatetimeCursor {
    /// The record field the cursor reads.
    pub field: String,
    /// The format of the state and of each window's bounds.
    pub format: String,
    /// The formats a record's (or a state's) value is read with, in order
    /// (`cursor_datetime_formats`, then `datetime_format`).
    pub input_formats: Vec<String>,
    pub start: DateTime<FixedOffset>,
    /// The end, if the manifest sets one; else the clock.
    pub end: Option<DateTime<FixedOffset>>,
    /// The width of a window; `None` is one window to the end.
    pub step: Option<Gap>,
    pub granularity: Option<Gap>,
    pub lookback: Option<Gap>,
    pub start_option: Option<RequestOption>,
    pub end_option: Option<RequestOption>,
    /// The slice's keys of a window's bounds (`start_time`, `end_time`).
    pub start_key: String,
    pub end_key: String,
    /// Pages stop at the first record older than the state.
    pub data_feed: bool,
    /// Records older than the state are dropped here.
    pub client_side: bool,
    pub compare_strictly: bool,
}

impl DatetimeCursor {
    /// Reads `incremental_sync` with `config` (the bounds and durations
    /// are evaluated once, as the CDK evaluates them when it builds the
    /// cursor) at `now`.
    pub(crate) fn read(node: &Node, config: &Val, now: DateTime<Utc>) -> Result<DatetimeCursor, Refusal> {
        // One cursor for every partition (`global_substream_cursor`) keeps
        // another state than the one per partition built here.
        node.expect(&["DatetimeBasedCursor"], &["clamping", "global_substream_cursor"])?;
        let parameters = node.parameters_val();
        let ctx = Context::at(now).with("config", config.clone()).with("parameters", parameters.clone());
        let text = |key: &str| -> Result<Option<String>, Refusal> {
            match node.template(key)? {
                None => Ok(None),
                Some(t) => t
                    .eval_string(&ctx)
                    .map(|v| Some(v.to_text()))
                    .map_err(|e| Refusal::new(node.below(key), format!("cannot be evaluated: {e}"))),
            }
        };
        let field = text("cursor_field")?
            .ok_or_else(|| Refusal::new(node.pointer(), "a DatetimeBasedCursor needs cursor_field"))?;
        let format = node
            .text("datetime_format")?
            .ok_or_else(|| Refusal::new(node.pointer(), "a DatetimeBasedCursor needs datetime_format"))?
            .to_owned();
        let mut input_formats = match node.get("cursor_datetime_formats") {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|f| f.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| Refusal::new(node.below("cursor_datetime_formats"), "expected a list of formats"))?,
            Some(_) => return Err(Refusal::new(node.below("cursor_datetime_formats"), "expected a list of formats")),
        };
        input_formats.push(format.clone());
        let gap = |key: &str| -> Result<Option<Gap>, Refusal> {
            match text(key)? {
                None => Ok(None),
                Some(t) if t.is_empty() => Ok(None),
                Some(t) => Gap::parse(&t).map(Some).map_err(|e| Refusal::new(node.below(key), e.to_string())),
            }
        };
        let (step, granularity) = (gap("step")?, gap("cursor_granularity")?);
        if node.get("step").is_some() != node.get("cursor_granularity").is_some() {
            return Err(Refusal::new(
                node.pointer(),
                "if step is defined, cursor_granularity should be as well and vice-versa",
            ));
        }
        if granularity.is_some_and(|g| g.months != 0) {
            return Err(Refusal::new(node.below("cursor_granularity"), "a granularity in months or years"));
        }
        let lookback = gap("lookback_window")?.filter(|g| !g.is_zero());
        let start = bound(node, "start_datetime", &format, config, now)?
            .ok_or_else(|| Refusal::new(node.pointer(), "a DatetimeBasedCursor needs start_datetime"))?;
        let end = bound(node, "end_datetime", &format, config, now)?;
        let option = |key: &str| node.child(key).transpose()?.map(|o| RequestOption::read(&o)).transpose();
        // A start and an end setting one key are read as the CDK reads
        // them: the end's value is sent.
        let (start_option, end_option) = (option("start_time_option")?, option("end_time_option")?);
        Ok(DatetimeCursor {
            field,
            format,
            input_formats,
            start,
            end,
            step,
            granularity,
            lookback,
            start_option,
            end_option,
            start_key: text("partition_field_start")?.unwrap_or_else(|| "start_time".into()),
            end_key: text("partition_field_end")?.unwrap_or_else(|| "end_time".into()),
            data_feed: node.flag("is_data_feed")?,
            client_side: node.flag("is_client_side_incremental")?,
            compare_strictly: node.flag("is_compare_strictly")?,
        })
    }

    /// A value of the cursor field (a record's, a state's) as a date: the
    /// first input format that reads it.
    pub fn parse(&self, value: &Value) -> Option<DateTime<FixedOffset>> {
        let text = match value {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Null => return None,
            other => other.to_string(),
        };
        self.input_formats.iter().find_map(|f| datetime::parse(&text, f).ok())
    }

    /// A date in the cursor's format.
    pub fn output(&self, t: &DateTime<FixedOffset>) -> String {
        datetime::format(t, &self.format).unwrap_or_else(|_| t.to_rfc3339())
    }
}

/// A `MinMaxDatetime` (or a template) at `key`, evaluated and read.
fn bound(
    node: &Node,
    key: &str,
    cursor_format: &str,
    config: &Val,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<FixedOffset>>, Refusal> {
    let at = node.below(key);
    let (value, format, min, max, parameters) = match node.get(key) {
        None => return Ok(None),
        Some(Value::Object(_)) => {
            let m = node.child(key).transpose()?.ok_or_else(|| Refusal::new(at.clone(), "expected a component"))?;
            m.expect(&["MinMaxDatetime"], &[])?;
            let value =
                m.template("datetime")?.ok_or_else(|| Refusal::new(at.clone(), "a MinMaxDatetime needs datetime"))?;
            let format = m.text("datetime_format")?.filter(|f| !f.is_empty()).unwrap_or(cursor_format).to_owned();
            (value, format, m.template("min_datetime")?, m.template("max_datetime")?, m.parameters_val())
        }
        Some(v) => (template_of(v, &at)?, cursor_format.to_owned(), None, None, node.parameters_val()),
    };
    let ctx = Context::at(now).with("config", config.clone()).with("parameters", parameters);
    let read = |t: &Template, what: &str| -> Result<Option<DateTime<FixedOffset>>, Refusal> {
        let text = t
            .eval_string(&ctx)
            .map_err(|e| Refusal::new(at.clone(), format!("the {what} cannot be evaluated: {e}")))?
            .to_text();
        if text.is_empty() && what != "date" {
            return Ok(None);
        }
        datetime::parse(&text, &format)
            .map(Some)
            .map_err(|e| Refusal::new(at.clone(), format!("the {what} cannot be read: {e}")))
    };
    let mut t = read(&value, "date")?.ok_or_else(|| Refusal::new(at.clone(), "no date"))?;
    if let Some(min) = min.as_ref().map(|m| read(m, "minimum")).transpose()?.flatten() {
        t = t.max(min);
    }
    if let Some(max) = max.as_ref().map(|m| read(m, "maximum")).transpose()?.flatten() {
        t = t.min(max);
    }
    Ok(Some(t))
}
