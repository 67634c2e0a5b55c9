//! Values an expression computes: JSON's, and the instants, dates and
//! durations of the macros, with Python's truthiness and text forms
//! (what `{{ … }}` writes is Python's `str()` of the value).

use chrono::{DateTime, FixedOffset, NaiveDate, TimeDelta};
use serde_json::{Map, Number, Value};

/// A value inside an expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    /// A name that is not there (Jinja's `Undefined`): renders as nothing,
    /// is false, and fails when used further.
    Undefined,
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<Val>),
    /// Keys in the order given, as a Python dict keeps them.
    Dict(Vec<(String, Val)>),
    DateTime(DateTime<FixedOffset>),
    Date(NaiveDate),
    Duration(TimeDelta),
}

impl Val {
    /// Python's truthiness.
    pub fn truthy(&self) -> bool {
        match self {
            Val::Undefined | Val::None => false,
            Val::Bool(b) => *b,
            Val::Int(i) => *i != 0,
            Val::Float(f) => *f != 0.0,
            Val::Str(s) => !s.is_empty(),
            Val::List(l) => !l.is_empty(),
            Val::Dict(d) => !d.is_empty(),
            Val::DateTime(_) | Val::Date(_) => true,
            Val::Duration(d) => !d.is_zero(),
        }
    }

    /// The value's type, as Python names it (for error messages).
    pub fn type_name(&self) -> &'static str {
        match self {
            Val::Undefined => "undefined",
            Val::None => "NoneType",
            Val::Bool(_) => "bool",
            Val::Int(_) => "int",
            Val::Float(_) => "float",
            Val::Str(_) => "str",
            Val::List(_) => "list",
            Val::Dict(_) => "dict",
            Val::DateTime(_) => "datetime",
            Val::Date(_) => "date",
            Val::Duration(_) => "timedelta",
        }
    }

    /// The entry `key` of a dict.
    pub fn get(&self, key: &str) -> Option<&Val> {
        match self {
            Val::Dict(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Python's `str()`: what a template writes.
    pub fn to_text(&self) -> String {
        match self {
            Val::Undefined => String::new(),
            Val::Str(s) => s.clone(),
            other => other.repr(),
        }
    }

    /// Python's `repr()`: how a value is written inside a list or dict.
    pub fn repr(&self) -> String {
        match self {
            Val::Undefined => "Undefined".into(),
            Val::None => "None".into(),
            Val::Bool(true) => "True".into(),
            Val::Bool(false) => "False".into(),
            Val::Int(i) => i.to_string(),
            Val::Float(f) => float_repr(*f),
            Val::Str(s) => str_repr(s),
            Val::List(items) => format!("[{}]", items.iter().map(Val::repr).collect::<Vec<_>>().join(", ")),
            Val::Dict(entries) => format!(
                "{{{}}}",
                entries.iter().map(|(k, v)| format!("{}: {}", str_repr(k), v.repr())).collect::<Vec<_>>().join(", ")
            ),
            Val::DateTime(t) => datetime_text(t),
            Val::Date(d) => d.format("%Y-%m-%d").to_string(),
            Val::Duration(d) => duration_text(d),
        }
    }

    /// The JSON form of the value (instants as Python writes them).
    pub fn to_json(&self) -> Value {
        match self {
            Val::Undefined | Val::None => Value::Null,
            Val::Bool(b) => Value::Bool(*b),
            Val::Int(i) => Value::Number((*i).into()),
            Val::Float(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Val::Str(s) => Value::String(s.clone()),
            Val::List(items) => Value::Array(items.iter().map(Val::to_json).collect()),
            Val::Dict(entries) => Value::Object(entries.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()),
            other => Value::String(other.to_text()),
        }
    }
}

impl From<&Value> for Val {
    fn from(v: &Value) -> Self {
        match v {
            Value::Null => Val::None,
            Value::Bool(b) => Val::Bool(*b),
            Value::Number(n) => match n.as_i64() {
                Some(i) => Val::Int(i),
                None => Val::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            Value::String(s) => Val::Str(s.clone()),
            Value::Array(items) => Val::List(items.iter().map(Val::from).collect()),
            Value::Object(map) => Val::Dict(map.iter().map(|(k, v)| (k.clone(), Val::from(v))).collect()),
        }
    }
}

/// JSON read straight into values, objects keeping their keys in the
/// order written (a `serde_json::Value` would sort them).
impl<'de> serde::Deserialize<'de> for Val {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Val, D::Error> {
        deserializer.deserialize_any(ValVisitor)
    }
}

struct ValVisitor;

impl<'de> serde::de::Visitor<'de> for ValVisitor {
    type Value = Val;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Val, E> {
        Ok(Val::None)
    }

    fn visit_none<E>(self) -> Result<Val, E> {
        Ok(Val::None)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Val, E> {
        Ok(Val::Bool(b))
    }

    fn visit_i64<E>(self, i: i64) -> Result<Val, E> {
        Ok(Val::Int(i))
    }

    fn visit_u64<E>(self, u: u64) -> Result<Val, E> {
        Ok(i64::try_from(u).map_or(Val::Float(u as f64), Val::Int))
    }

    fn visit_f64<E>(self, f: f64) -> Result<Val, E> {
        Ok(Val::Float(f))
    }

    fn visit_str<E>(self, s: &str) -> Result<Val, E> {
        Ok(Val::Str(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Val, E> {
        Ok(Val::Str(s))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Val, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Val::List(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Val, A::Error> {
        let mut entries: Vec<(String, Val)> = Vec::new();
        while let Some((key, value)) = map.next_entry::<String, Val>()? {
            // A repeated key keeps its first place and its last value.
            match entries.iter_mut().find(|(k, _)| *k == key) {
                Some(entry) => entry.1 = value,
                None => entries.push((key, value)),
            }
        }
        Ok(Val::Dict(entries))
    }
}

/// A JSON object's entries as a dict.
pub fn dict(map: &Map<String, Value>) -> Val {
    Val::Dict(map.iter().map(|(k, v)| (k.clone(), Val::from(v))).collect())
}

/// Python's `repr()` of a float: the shortest text that reads back, with
/// `.0` on whole numbers and an exponent past 1e16.
fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if f == f.trunc() && f.abs() < 1e16 {
        return format!("{f:.1}");
    }
    let text = format!("{f}");
    if f.abs() >= 1e16 || (f != 0.0 && f.abs() < 1e-4) {
        let e = format!("{f:e}");
        // Rust writes 1e20 and 1.5e-7; Python 1e+20 and 1.5e-07.
        if let Some((mantissa, exp)) = e.split_once('e') {
            let (sign, digits) = exp.strip_prefix('-').map_or(("+", exp), |d| ("-", d));
            return format!("{mantissa}e{sign}{digits:0>2}");
        }
    }
    text
}

/// Python's `repr()` of a string: single quotes unless it holds one and
/// no double quote.
fn str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python's `str()` of an aware datetime: `2026-11-20 12:00:00.123456+00:00`
/// (no fraction when it is zero).
fn datetime_text(t: &DateTime<FixedOffset>) -> String {
    let fraction = if t.timestamp_subsec_micros() == 0 { "" } else { ".%6f" };
    t.format(&format!("%Y-%m-%d %H:%M:%S{fraction}%:z")).to_string()
}

/// Python's `str()` of a timedelta: `1 day, 2:03:04` or `-1 day, 23:59:59`.
fn duration_text(d: &TimeDelta) -> String {
    let micros = d.num_microseconds().unwrap_or(i64::MAX);
    let days = micros.div_euclid(86_400_000_000);
    let rest = micros.rem_euclid(86_400_000_000);
    let (secs, frac) = (rest / 1_000_000, rest % 1_000_000);
    let clock = format!("{}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60);
    let clock = if frac == 0 { clock } else { format!("{clock}.{frac:06}") };
    match days {
        0 => clock,
        1 | -1 => format!("{days} day, {clock}"),
        _ => format!("{days} days, {clock}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_as_python_writes_them() {
        assert_eq!(Val::Float(1.0).repr(), "1.0");
        assert_eq!(Val::Float(0.1).repr(), "0.1");
        assert_eq!(Val::Float(1e20).repr(), "1e+20");
        assert_eq!(Val::Float(1.5e-7).repr(), "1.5e-07");
        assert_eq!(Val::Str("it's".into()).repr(), "\"it's\"");
        let list = Val::List(vec![Val::Str("a".into()), Val::Int(1), Val::None, Val::Bool(true)]);
        assert_eq!(list.to_text(), "['a', 1, None, True]");
        let dict = Val::Dict(vec![("k".into(), Val::Str("v".into()))]);
        assert_eq!(dict.to_text(), "{'k': 'v'}");
        let t = DateTime::parse_from_rfc3339("2026-11-20T12:00:00.123456Z").unwrap();
        assert_eq!(Val::DateTime(t).to_text(), "2026-11-20 12:00:00.123456+00:00");
        let whole = DateTime::parse_from_rfc3339("2026-11-20T12:00:00Z").unwrap();
        assert_eq!(Val::DateTime(whole).to_text(), "2026-11-20 12:00:00+00:00");
        assert_eq!(Val::Duration(TimeDelta::days(-1)).to_text(), "-1 day, 0:00:00");
        assert_eq!(Val::Duration(TimeDelta::seconds(93_784)).to_text(), "1 day, 2:03:04");
        assert!(!Val::Str(String::new()).truthy() && Val::List(vec![Val::None]).truthy());
        let read: Val = serde_json::from_str(r#"{"z": 1, "a": [true, null, 2.5, "s"], "z": 3}"#).unwrap();
        assert_eq!(read.to_text(), "{'z': 3, 'a': [True, None, 2.5, 's']}");
    }
}
