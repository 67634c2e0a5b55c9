//! Evaluation: Python's operators on [`Val`]s, Airbyte's macros
//! (`now_utc`, `today_utc`, `day_delta`, `duration`, `format_datetime`,
//! `timestamp`, `max`, `str_to_datetime`), Jinja's filters and tests, and
//! the Python methods manifests call (`get`, `strftime`, `split`, …).

use chrono::{DateTime, Datelike, FixedOffset, NaiveDate, NaiveDateTime, TimeDelta, TimeZone, Utc};

use super::parse::{BinOp, CmpOp, Expr, Node};
use super::value::Val;
use super::{Context, InterpolationError};

type Result<T> = std::result::Result<T, InterpolationError>;

fn failed(message: impl Into<String>) -> InterpolationError {
    InterpolationError::Evaluation(message.into())
}

/// What Python raises as a `TypeError` (the CDK then keeps the template
/// as written).
fn mismatch(message: impl Into<String>) -> InterpolationError {
    InterpolationError::Type(message.into())
}

/// Renders `nodes` into `out`.
pub(crate) fn render(nodes: &[Node], ctx: &Context, out: &mut String) -> Result<()> {
    for node in nodes {
        match node {
            Node::Text(text) => out.push_str(text),
            Node::Expr(e) => out.push_str(&eval(e, ctx)?.to_text()),
            Node::If { branches, otherwise } => {
                let mut taken = false;
                for (cond, body) in branches {
                    if eval(cond, ctx)?.truthy() {
                        render(body, ctx, out)?;
                        taken = true;
                        break;
                    }
                }
                if !taken {
                    render(otherwise, ctx, out)?;
                }
            }
        }
    }
    Ok(())
}

/// The value of `e`.
pub(crate) fn eval(e: &Expr, ctx: &Context) -> Result<Val> {
    Ok(match e {
        Expr::Lit(v) => v.clone(),
        Expr::Name(n) => lookup(n, ctx).cloned().unwrap_or(Val::Undefined),
        Expr::List(items) => Val::List(items.iter().map(|i| eval(i, ctx)).collect::<Result<_>>()?),
        Expr::Dict(entries) => Val::Dict(
            entries.iter().map(|(k, v)| Ok((key_text(&eval(k, ctx)?)?, eval(v, ctx)?))).collect::<Result<_>>()?,
        ),
        Expr::Attr(target, name) => attribute(&defined(eval(target, ctx)?, "an attribute")?, name),
        Expr::Index(target, index) => match eval(index, ctx)? {
            // Jinja finds nothing under an undefined key.
            Val::Undefined => {
                defined(eval(target, ctx)?, "an item")?;
                Val::Undefined
            }
            index => subscript(&defined(eval(target, ctx)?, "an item")?, &index)?,
        },
        Expr::Slice(target, start, end) => {
            let bound = |b: &Option<Box<Expr>>| -> Result<Option<i64>> {
                match b {
                    None => Ok(None),
                    Some(e) => match eval(e, ctx)? {
                        Val::Int(i) => Ok(Some(i)),
                        Val::None => Ok(None),
                        other => Err(mismatch(format!("slice indices must be integers, not {}", other.type_name()))),
                    },
                }
            };
            slice(&eval(target, ctx)?, bound(start)?, bound(end)?)?
        }
        Expr::Call(target, args, kwargs) => {
            let args: Vec<Val> = args.iter().map(|a| eval(a, ctx)).collect::<Result<_>>()?;
            let kwargs: Vec<(String, Val)> =
                kwargs.iter().map(|(k, v)| Ok((k.clone(), eval(v, ctx)?))).collect::<Result<_>>()?;
            match &**target {
                Expr::Name(name) if !ctx.variables.contains_key(name) => macro_call(name, &args, &kwargs, ctx)?,
                Expr::Attr(receiver, method) => {
                    method_call(&defined(eval(receiver, ctx)?, "a method")?, method, &args)?
                }
                other => return Err(mismatch(format!("{other:?} is not callable"))),
            }
        }
        Expr::Filter(target, name, args) => {
            let args: Vec<Val> = args.iter().map(|a| eval(a, ctx)).collect::<Result<_>>()?;
            filter(eval(target, ctx)?, name, &args)?
        }
        Expr::Test(target, name, negated) => {
            let value = eval(target, ctx)?;
            let result = match name.as_str() {
                "none" => value == Val::None,
                "defined" => value != Val::Undefined,
                "undefined" => value == Val::Undefined,
                "true" => value == Val::Bool(true),
                "false" => value == Val::Bool(false),
                "string" => matches!(value, Val::Str(_)),
                "number" => matches!(value, Val::Int(_) | Val::Float(_)),
                "mapping" => matches!(value, Val::Dict(_)),
                other => return Err(InterpolationError::Unsupported(format!("the test {other}"))),
            };
            Val::Bool(result != *negated)
        }
        Expr::Neg(inner) => match eval(inner, ctx)? {
            Val::Int(i) => Val::Int(-i),
            Val::Float(f) => Val::Float(-f),
            Val::Duration(d) => Val::Duration(-d),
            Val::Undefined => return Err(InterpolationError::Undefined("negation of an undefined value".into())),
            other => return Err(mismatch(format!("bad operand type for unary -: {}", other.type_name()))),
        },
        Expr::Not(inner) => Val::Bool(!eval(inner, ctx)?.truthy()),
        Expr::And(a, b) => {
            let left = eval(a, ctx)?;
            if left.truthy() { eval(b, ctx)? } else { left }
        }
        Expr::Or(a, b) => {
            let left = eval(a, ctx)?;
            if left.truthy() { left } else { eval(b, ctx)? }
        }
        Expr::Cond { then, cond, otherwise } => {
            if eval(cond, ctx)?.truthy() {
                eval(then, ctx)?
            } else {
                match otherwise {
                    Some(e) => eval(e, ctx)?,
                    None => Val::Undefined,
                }
            }
        }
        Expr::Binary(op, a, b) => binary(*op, eval(a, ctx)?, eval(b, ctx)?)?,
        Expr::Compare(first, rest) => {
            let mut left = eval(first, ctx)?;
            for (op, e) in rest {
                let right = eval(e, ctx)?;
                if !compare(*op, &left, &right)? {
                    return Ok(Val::Bool(false));
                }
                left = right;
            }
            Val::Bool(true)
        }
    })
}

/// The variable `name`: the slice also goes by `stream_partition` and
/// `stream_interval`, as in the CDK.
fn lookup<'a>(name: &str, ctx: &'a Context) -> Option<&'a Val> {
    match (ctx.variables.get(name), name) {
        (Some(v), _) => Some(v),
        (None, "stream_partition" | "stream_interval") => ctx.variables.get("stream_slice"),
        (None, _) => None,
    }
}

/// Whether the context declares `name`.
pub(crate) fn declared(name: &str, ctx: &Context) -> bool {
    lookup(name, ctx).is_some()
}

/// Fails as Jinja's strict use of an undefined value does.
fn defined(v: Val, what: &str) -> Result<Val> {
    match v {
        Val::Undefined => Err(InterpolationError::Undefined(format!("{what} of an undefined value"))),
        v => Ok(v),
    }
}

fn key_text(v: &Val) -> Result<String> {
    match v {
        Val::Str(s) => Ok(s.clone()),
        Val::Int(_) | Val::Float(_) | Val::Bool(_) | Val::None => Ok(v.to_text()),
        other => Err(mismatch(format!("a {} cannot be a key", other.type_name()))),
    }
}

/// `target.name`: a dict's entry (Jinja looks attributes up as items), or
/// undefined.
fn attribute(target: &Val, name: &str) -> Val {
    target.get(name).cloned().unwrap_or(Val::Undefined)
}

fn subscript(target: &Val, index: &Val) -> Result<Val> {
    Ok(match (target, index) {
        (Val::Dict(_), key) => target.get(&key_text(key)?).cloned().unwrap_or(Val::Undefined),
        (Val::List(items), Val::Int(i)) => position(*i, items.len()).map_or(Val::Undefined, |p| items[p].clone()),
        (Val::Str(s), Val::Int(i)) => {
            let chars: Vec<char> = s.chars().collect();
            position(*i, chars.len()).map_or(Val::Undefined, |p| Val::Str(chars[p].to_string()))
        }
        // Jinja falls back to an attribute, and finds none.
        _ => Val::Undefined,
    })
}

/// Python's index `i` (negative from the end) into `len` items.
fn position(i: i64, len: usize) -> Option<usize> {
    let len = i64::try_from(len).ok()?;
    let p = if i < 0 { len + i } else { i };
    (0..len).contains(&p).then_some(p as usize)
}

fn slice(target: &Val, start: Option<i64>, end: Option<i64>) -> Result<Val> {
    let clamp = |b: Option<i64>, len: usize, default: usize| -> usize {
        let len_i = len as i64;
        match b {
            None => default,
            Some(i) if i < 0 => (len_i + i).max(0) as usize,
            Some(i) => (i.min(len_i)) as usize,
        }
    };
    Ok(match target {
        Val::Str(s) => {
            let chars: Vec<char> = s.chars().collect();
            let (a, b) = (clamp(start, chars.len(), 0), clamp(end, chars.len(), chars.len()));
            Val::Str(if a < b { chars[a..b].iter().collect() } else { String::new() })
        }
        Val::List(items) => {
            let (a, b) = (clamp(start, items.len(), 0), clamp(end, items.len(), items.len()));
            Val::List(if a < b { items[a..b].to_vec() } else { Vec::new() })
        }
        other => return Err(mismatch(format!("a {} cannot be sliced", other.type_name()))),
    })
}

fn number(v: &Val) -> Option<f64> {
    match v {
        Val::Int(i) => Some(*i as f64),
        Val::Float(f) => Some(*f),
        Val::Bool(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    }
}

fn binary(op: BinOp, a: Val, b: Val) -> Result<Val> {
    use Val::*;
    if op == BinOp::Concat {
        return Ok(Str(a.to_text() + &b.to_text()));
    }
    let (a, b) = (defined(a, "arithmetic")?, defined(b, "arithmetic")?);
    let mismatch = |a: &Val, b: &Val| {
        mismatch(format!("unsupported operand types for {op:?}: {} and {}", a.type_name(), b.type_name()))
    };
    Ok(match (op, &a, &b) {
        (BinOp::Add, Str(x), Str(y)) => Str(format!("{x}{y}")),
        (BinOp::Add, List(x), List(y)) => List(x.iter().chain(y).cloned().collect()),
        (BinOp::Add, DateTime(t), Duration(d)) | (BinOp::Add, Duration(d), DateTime(t)) => DateTime(*t + *d),
        (BinOp::Sub, DateTime(t), Duration(d)) => DateTime(*t - *d),
        (BinOp::Add, Date(t), Duration(d)) => Date(*t + TimeDelta::days(d.num_days())),
        (BinOp::Sub, Date(t), Duration(d)) => Date(*t - TimeDelta::days(d.num_days())),
        (BinOp::Sub, DateTime(x), DateTime(y)) => Duration(x.signed_duration_since(*y)),
        (BinOp::Sub, Date(x), Date(y)) => Duration(x.signed_duration_since(*y)),
        (BinOp::Add, Duration(x), Duration(y)) => Duration(*x + *y),
        (BinOp::Sub, Duration(x), Duration(y)) => Duration(*x - *y),
        (BinOp::Mul, Str(s), Int(n)) | (BinOp::Mul, Int(n), Str(s)) => Str(s.repeat((*n).max(0) as usize)),
        (_, Int(x), Int(y)) if !matches!(op, BinOp::Div) => {
            let (x, y) = (*x, *y);
            match op {
                BinOp::Add => Int(x.checked_add(y).ok_or_else(|| failed("integer overflow"))?),
                BinOp::Sub => Int(x.checked_sub(y).ok_or_else(|| failed("integer overflow"))?),
                BinOp::Mul => Int(x.checked_mul(y).ok_or_else(|| failed("integer overflow"))?),
                BinOp::FloorDiv | BinOp::Rem if y == 0 => return Err(failed("integer division or modulo by zero")),
                BinOp::FloorDiv => Int(x.div_euclid(y) - i64::from(y < 0 && x.rem_euclid(y) != 0)),
                BinOp::Rem => Int(((x % y) + y) % y),
                BinOp::Pow if y >= 0 => Int(x
                    .checked_pow(u32::try_from(y).unwrap_or(u32::MAX))
                    .ok_or_else(|| failed("integer overflow"))?),
                BinOp::Pow => Float((x as f64).powf(y as f64)),
                BinOp::Div | BinOp::Concat => unreachable!("handled above"),
            }
        }
        _ => {
            let (Some(x), Some(y)) = (number(&a), number(&b)) else { return Err(mismatch(&a, &b)) };
            match op {
                BinOp::Add => Float(x + y),
                BinOp::Sub => Float(x - y),
                BinOp::Mul => Float(x * y),
                BinOp::Div | BinOp::FloorDiv | BinOp::Rem if y == 0.0 => return Err(failed("division by zero")),
                BinOp::Div => Float(x / y),
                BinOp::FloorDiv => Float((x / y).floor()),
                BinOp::Rem => Float(x - y * (x / y).floor()),
                BinOp::Pow => Float(x.powf(y)),
                BinOp::Concat => unreachable!("handled above"),
            }
        }
    })
}

fn compare(op: CmpOp, a: &Val, b: &Val) -> Result<bool> {
    match op {
        CmpOp::Eq => Ok(equal(a, b)),
        CmpOp::Ne => Ok(!equal(a, b)),
        CmpOp::In | CmpOp::NotIn => {
            let found = match b.clone() {
                // An undefined container is empty to Jinja.
                Val::Undefined => false,
                Val::List(items) => items.iter().any(|i| equal(i, a)),
                Val::Dict(_) => b.get(&key_text(a)?).is_some(),
                Val::Str(s) => s.contains(&a.to_text()),
                other => return Err(mismatch(format!("argument of type {} is not iterable", other.type_name()))),
            };
            Ok(found == (op == CmpOp::In))
        }
        _ => {
            let (a, b) = (&defined(a.clone(), "a comparison")?, &defined(b.clone(), "a comparison")?);
            let ordering = match (a, b) {
                (Val::Str(x), Val::Str(y)) => x.cmp(y),
                (Val::DateTime(x), Val::DateTime(y)) => x.cmp(y),
                (Val::Date(x), Val::Date(y)) => x.cmp(y),
                (Val::Duration(x), Val::Duration(y)) => x.cmp(y),
                _ => match (number(a), number(b)) {
                    (Some(x), Some(y)) => x.partial_cmp(&y).ok_or_else(|| failed("cannot order NaN"))?,
                    _ => {
                        return Err(mismatch(format!(
                            "'<' not supported between instances of {} and {}",
                            a.type_name(),
                            b.type_name()
                        )));
                    }
                },
            };
            Ok(match op {
                CmpOp::Lt => ordering.is_lt(),
                CmpOp::Le => ordering.is_le(),
                CmpOp::Gt => ordering.is_gt(),
                _ => ordering.is_ge(),
            })
        }
    }
}

fn equal(a: &Val, b: &Val) -> bool {
    match (number(a), number(b)) {
        (Some(x), Some(y)) if !matches!((a, b), (Val::Bool(_), Val::Bool(_))) => x == y,
        _ => a == b,
    }
}

fn arg<'a>(args: &'a [Val], kwargs: &'a [(String, Val)], i: usize, name: &str) -> Option<&'a Val> {
    args.get(i).or_else(|| kwargs.iter().find(|(k, _)| k == name).map(|(_, v)| v))
}

fn text_arg(args: &[Val], kwargs: &[(String, Val)], i: usize, name: &str, of: &str) -> Result<String> {
    match arg(args, kwargs, i, name) {
        Some(Val::Str(s)) => Ok(s.clone()),
        Some(other) => Err(failed(format!("{of}: {name} must be a string, not {}", other.type_name()))),
        None => Err(failed(format!("{of}: {name} is missing"))),
    }
}

fn utc(t: DateTime<Utc>) -> DateTime<FixedOffset> {
    t.fixed_offset()
}

fn macro_call(name: &str, args: &[Val], kwargs: &[(String, Val)], ctx: &Context) -> Result<Val> {
    Ok(match name {
        "now_utc" => Val::DateTime(utc(ctx.now)),
        "today_utc" => Val::Date(ctx.now.date_naive()),
        "day_delta" => {
            let days = match arg(args, kwargs, 0, "num_days") {
                Some(Val::Int(d)) => *d,
                Some(Val::Float(f)) => return day_delta_float(*f, args, kwargs, ctx),
                _ => return Err(failed("day_delta: num_days must be a number")),
            };
            let format = match arg(args, kwargs, 1, "format") {
                Some(Val::Str(f)) => f.clone(),
                _ => "%Y-%m-%dT%H:%M:%S.%f%z".to_owned(),
            };
            Val::Str(strftime(&utc(ctx.now + TimeDelta::days(days)), &format)?)
        }
        "duration" => Val::Duration(iso_duration(&text_arg(args, kwargs, 0, "datestring", "duration")?)?),
        "str_to_datetime" => Val::DateTime(str_to_datetime(&text_arg(args, kwargs, 0, "s", "str_to_datetime")?)?),
        "timestamp" => match arg(args, kwargs, 0, "dt") {
            Some(Val::Int(i)) => Val::Int(*i),
            Some(Val::Float(f)) => Val::Int(f.trunc() as i64),
            Some(Val::Str(s)) => Val::Float(epoch_seconds(&str_to_datetime(s)?)),
            Some(Val::DateTime(t)) => Val::Float(epoch_seconds(t)),
            _ => return Err(failed("timestamp: give a number or a date string")),
        },
        "format_datetime" => {
            let format = text_arg(args, kwargs, 1, "format", "format_datetime")?;
            let at = match arg(args, kwargs, 0, "dt") {
                Some(Val::DateTime(t)) => return Ok(Val::Str(strftime(t, &format)?)),
                Some(Val::Date(d)) => {
                    return Ok(Val::Str(strftime(
                        &utc(Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).unwrap_or_default())),
                        &format,
                    )?));
                }
                Some(Val::Int(i)) => {
                    let input = match arg(args, kwargs, 2, "input_format") {
                        Some(Val::Str(input)) => input.as_str(),
                        _ => "%s",
                    };
                    crate::datetime::parse(&i.to_string(), input).map_err(|e| failed(e.to_string()))?
                }
                Some(Val::Str(s)) => match arg(args, kwargs, 2, "input_format") {
                    Some(Val::Str(input)) => strptime(s, input)?,
                    _ => str_to_datetime(s)?,
                },
                _ => return Err(failed("format_datetime: dt must be a datetime, a string or a timestamp")),
            };
            Val::Str(crate::datetime::format(&at, &format).map_err(|e| failed(e.to_string()))?)
        }
        "max" | "min" => {
            let items: Vec<Val> = match args {
                [Val::List(items)] => items.clone(),
                _ => args.to_vec(),
            };
            let mut best = items.first().cloned().ok_or_else(|| failed(format!("{name}() of nothing")))?;
            for item in &items[1..] {
                let better =
                    if name == "max" { compare(CmpOp::Gt, item, &best)? } else { compare(CmpOp::Lt, item, &best)? };
                if better {
                    best = item.clone();
                }
            }
            best
        }
        other => return Err(InterpolationError::Unsupported(format!("the macro {other}()"))),
    })
}

fn day_delta_float(days: f64, args: &[Val], kwargs: &[(String, Val)], ctx: &Context) -> Result<Val> {
    let format = match arg(args, kwargs, 1, "format") {
        Some(Val::Str(f)) => f.clone(),
        _ => "%Y-%m-%dT%H:%M:%S.%f%z".to_owned(),
    };
    let micros = (days * 86_400_000_000.0) as i64;
    Ok(Val::Str(strftime(&utc(ctx.now + TimeDelta::microseconds(micros)), &format)?))
}

fn epoch_seconds(t: &DateTime<FixedOffset>) -> f64 {
    t.timestamp() as f64 + f64::from(t.timestamp_subsec_micros()) / 1e6
}

/// `dateutil.parser.isoparse`, naive values taken as UTC, the result in UTC.
pub(crate) fn str_to_datetime(s: &str) -> Result<DateTime<FixedOffset>> {
    let s = s.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(utc(t.with_timezone(&Utc)));
    }
    for format in ["%Y-%m-%dT%H:%M:%S%.f%:z", "%Y-%m-%dT%H:%M:%S%.f%z", "%Y-%m-%d %H:%M:%S%.f%:z", "%Y-%m-%dT%H:%M%:z"]
    {
        if let Ok(t) = DateTime::parse_from_str(s, format) {
            return Ok(utc(t.with_timezone(&Utc)));
        }
    }
    for format in ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M", "%Y%m%dT%H%M%S"] {
        if let Ok(t) = NaiveDateTime::parse_from_str(s, format) {
            return Ok(utc(Utc.from_utc_datetime(&t)));
        }
    }
    for format in ["%Y-%m-%d", "%Y%m%d"] {
        if let Ok(d) = NaiveDate::parse_from_str(s, format) {
            return Ok(utc(Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).unwrap_or_default())));
        }
    }
    Err(failed(format!("{s:?} is not an ISO 8601 date or time")))
}

/// Python's `strptime`, a value without an offset taken as UTC.
fn strptime(s: &str, format: &str) -> Result<DateTime<FixedOffset>> {
    crate::datetime::strptime(s, format).map_err(|e| failed(e.to_string()))
}

/// Python's `strftime` (a directive it does not know is refused by name).
pub(crate) fn strftime(t: &DateTime<FixedOffset>, format: &str) -> Result<String> {
    crate::datetime::strftime(t, format).map_err(|e| InterpolationError::Unsupported(e.to_string()))
}

/// An ISO 8601 duration (`P30D`, `PT1H`, `P1W`, `P1Y2M`: years and
/// months as 365 and 30 days, isodate's `Duration` approximated).
fn iso_duration(text: &str) -> Result<TimeDelta> {
    let bad = || failed(format!("{text:?} is not an ISO 8601 duration"));
    let (negative, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text),
    };
    let rest = rest.strip_prefix('P').ok_or_else(bad)?;
    let (date, time) = rest.split_once('T').unwrap_or((rest, ""));
    let mut total = TimeDelta::zero();
    let mut number = String::new();
    for (part, is_time) in [(date, false), (time, true)] {
        for c in part.chars() {
            if c.is_ascii_digit() || c == '.' {
                number.push(c);
                continue;
            }
            let n: f64 = number.parse().map_err(|_| bad())?;
            number.clear();
            let secs = match (c, is_time) {
                ('Y', false) => n * 365.0 * 86_400.0,
                ('M', false) => n * 30.0 * 86_400.0,
                ('W', false) => n * 7.0 * 86_400.0,
                ('D', false) => n * 86_400.0,
                ('H', true) => n * 3600.0,
                ('M', true) => n * 60.0,
                ('S', true) => n,
                _ => return Err(bad()),
            };
            total += TimeDelta::microseconds((secs * 1e6) as i64);
        }
    }
    if !number.is_empty() {
        return Err(bad());
    }
    Ok(if negative { -total } else { total })
}

fn filter(value: Val, name: &str, args: &[Val]) -> Result<Val> {
    Ok(match name {
        "int" | "float" if value == Val::Undefined => {
            return Err(InterpolationError::Undefined(format!("the {name} filter of an undefined value")));
        }
        "int" => Val::Int(match &value {
            Val::Int(i) => *i,
            Val::Float(f) => f.trunc() as i64,
            Val::Bool(b) => i64::from(*b),
            Val::Str(s) => s
                .trim()
                .parse::<i64>()
                .ok()
                .or_else(|| s.trim().parse::<f64>().ok().map(|f| f.trunc() as i64))
                .unwrap_or(0),
            _ => 0,
        }),
        "float" => Val::Float(match &value {
            Val::Str(s) => s.trim().parse().unwrap_or(0.0),
            other => number(other).unwrap_or(0.0),
        }),
        "string" => Val::Str(value.to_text()),
        "length" | "count" => Val::Int(match &value {
            Val::Undefined => 0,
            Val::Str(s) => s.chars().count() as i64,
            Val::List(l) => l.len() as i64,
            Val::Dict(d) => d.len() as i64,
            other => return Err(mismatch(format!("object of type {} has no len()", other.type_name()))),
        }),
        "lower" => Val::Str(value.to_text().to_lowercase()),
        "upper" => Val::Str(value.to_text().to_uppercase()),
        "trim" => Val::Str(value.to_text().trim().to_owned()),
        "join" => {
            let separator = args.first().map(Val::to_text).unwrap_or_default();
            match value {
                Val::List(items) => Val::Str(items.iter().map(Val::to_text).collect::<Vec<_>>().join(&separator)),
                other => Val::Str(other.to_text()),
            }
        }
        "urlencode" => Val::Str(match &value {
            Val::Dict(entries) => entries
                .iter()
                .map(|(k, v)| format!("{}={}", quote(k), quote(&v.to_text())))
                .collect::<Vec<_>>()
                .join("&"),
            other => quote(&other.to_text()),
        }),
        "default" | "d" => match value {
            Val::Undefined => args.first().cloned().unwrap_or(Val::Str(String::new())),
            other => other,
        },
        "tojson" => Val::Str(value.to_json().to_string()),
        "base64encode" => Val::Str(base64_encode(value.to_text().as_bytes())),
        "base64decode" => Val::Str(
            base64_decode(&value.to_text())
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| failed("base64decode: not Base64 of UTF-8 text"))?,
        ),
        other => return Err(InterpolationError::Unsupported(format!("the filter {other}"))),
    })
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard Base64 with padding, as Python's `base64.b64encode`.
pub(crate) fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(BASE64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The bytes of standard Base64 text (padding optional).
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let digits: Vec<u32> = text
        .trim_end_matches('=')
        .bytes()
        .map(|b| BASE64.iter().position(|c| *c == b).map(|p| p as u32))
        .collect::<Option<_>>()?;
    if digits.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, d)| n | d << (18 - 6 * i));
        for i in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    Some(out)
}

/// Jinja's `urlencode` of a string: everything but unreserved characters
/// and `/` percent-encoded.
fn quote(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn method_call(receiver: &Val, method: &str, args: &[Val]) -> Result<Val> {
    let text_arg = |i: usize| -> Result<String> {
        match args.get(i) {
            Some(Val::Str(s)) => Ok(s.clone()),
            Some(other) => Err(mismatch(format!("{method}: expected a string, not {}", other.type_name()))),
            None => Err(failed(format!("{method}: an argument is missing"))),
        }
    };
    Ok(match (receiver, method) {
        (Val::Dict(_), "get") => {
            let key = key_text(args.first().ok_or_else(|| failed("get: a key is missing"))?)?;
            receiver.get(&key).cloned().unwrap_or_else(|| args.get(1).cloned().unwrap_or(Val::None))
        }
        (Val::Dict(entries), "keys") => Val::List(entries.iter().map(|(k, _)| Val::Str(k.clone())).collect()),
        (Val::Dict(entries), "values") => Val::List(entries.iter().map(|(_, v)| v.clone()).collect()),
        (Val::Str(s), "split") => match args.first() {
            None | Some(Val::None) => Val::List(s.split_whitespace().map(|p| Val::Str(p.to_owned())).collect()),
            Some(_) => {
                let separator = text_arg(0)?;
                if separator.is_empty() {
                    return Err(failed("split: empty separator"));
                }
                Val::List(s.split(separator.as_str()).map(|p| Val::Str(p.to_owned())).collect())
            }
        },
        (Val::Str(s), "strip") => Val::Str(match args.first() {
            None => s.trim().to_owned(),
            Some(_) => {
                let chars: Vec<char> = text_arg(0)?.chars().collect();
                s.trim_matches(|c| chars.contains(&c)).to_owned()
            }
        }),
        (Val::Str(s), "lower") => Val::Str(s.to_lowercase()),
        (Val::Str(s), "upper") => Val::Str(s.to_uppercase()),
        (Val::Str(s), "startswith") => Val::Bool(s.starts_with(&text_arg(0)?)),
        (Val::Str(s), "endswith") => Val::Bool(s.ends_with(&text_arg(0)?)),
        (Val::Str(s), "replace") => Val::Str(s.replace(&text_arg(0)?, &text_arg(1)?)),
        (Val::Str(s), "join") => match args.first() {
            Some(Val::List(items)) => Val::Str(items.iter().map(Val::to_text).collect::<Vec<_>>().join(s)),
            // A string is a sequence of its characters.
            Some(Val::Str(text)) => Val::Str(text.chars().map(String::from).collect::<Vec<_>>().join(s)),
            _ => return Err(mismatch("join: expected a list")),
        },
        (Val::DateTime(t), "strftime") => Val::Str(strftime(t, &text_arg(0)?)?),
        (Val::DateTime(t), "isoformat") => {
            let separator = match args.first() {
                Some(Val::Str(s)) => s.clone(),
                _ => "T".to_owned(),
            };
            let clock = match args.get(1) {
                None => {
                    if t.timestamp_subsec_micros() == 0 {
                        "%H:%M:%S"
                    } else {
                        "%H:%M:%S.%6f"
                    }
                }
                Some(Val::Str(spec)) => match spec.as_str() {
                    "auto" => {
                        if t.timestamp_subsec_micros() == 0 {
                            "%H:%M:%S"
                        } else {
                            "%H:%M:%S.%6f"
                        }
                    }
                    "hours" => "%H",
                    "minutes" => "%H:%M",
                    "seconds" => "%H:%M:%S",
                    "milliseconds" => "%H:%M:%S.%3f",
                    "microseconds" => "%H:%M:%S.%6f",
                    other => return Err(failed(format!("isoformat: unknown timespec {other:?}"))),
                },
                Some(other) => {
                    return Err(mismatch(format!("isoformat: timespec must be a string, not {}", other.type_name())));
                }
            };
            Val::Str(t.format(&format!("%Y-%m-%d{separator}{clock}%:z")).to_string())
        }
        (Val::DateTime(t), "timestamp") => Val::Float(epoch_seconds(t)),
        (Val::DateTime(t), "date") => Val::Date(t.date_naive()),
        (Val::Date(d), "strftime") => {
            Val::Str(strftime(&utc(Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).unwrap_or_default())), &text_arg(0)?)?)
        }
        (Val::Date(d), "isoformat") => Val::Str(format!("{:04}-{:02}-{:02}", d.year(), d.month(), d.day())),
        (Val::Duration(d), "total_seconds") => Val::Float(d.num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6),
        (other, method) => {
            return Err(InterpolationError::Unsupported(format!("the method {method}() of a {}", other.type_name())));
        }
    })
}
