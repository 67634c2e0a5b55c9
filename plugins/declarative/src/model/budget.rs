//! The source's `api_budget` (`HTTPAPIBudget`): how many calls its
//! requests may make in a while, by policy, the first policy whose
//! matchers match a request deciding, as the CDK's budget decides. Read
//! here; kept to while reading by [`crate::retrieve`].

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::Value;

use super::node::{Node, Refusal, template_of};
use crate::datetime::Gap;
use crate::interpolation::{Context, Reach, Val};

/// An `HTTPAPIBudget`.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    pub policies: Vec<Policy>,
    /// The header naming when the provider's window resets (Unix seconds).
    pub reset_header: String,
    /// The header naming how many calls are left.
    pub remaining_header: String,
    /// Statuses that mean no call is left.
    pub hit_statuses: Vec<u16>,
    /// What of the configuration each template of the budget reads, by
    /// its pointer: none may read a secret.
    pub reads: Vec<(String, Reach)>,
}

/// One policy and the requests it applies to (every request without
/// matchers).
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub limit: Limit,
    pub matchers: Vec<Matcher>,
}

/// What a policy allows.
#[derive(Debug, Clone, PartialEq)]
pub enum Limit {
    /// `UnlimitedCallRatePolicy`.
    Unlimited,
    /// `FixedWindowCallRatePolicy`: `calls` per window of `period`; the
    /// first window lasts ten days unless the provider names its reset,
    /// as the CDK's does.
    Fixed { period: TimeDelta, calls: u64 },
    /// `MovingWindowCallRatePolicy`: at most `limit` calls in any
    /// `interval`, for each rate.
    Moving { rates: Vec<(u64, TimeDelta)> },
}

/// An `HttpRequestRegexMatcher`.
#[derive(Debug, Clone, PartialEq)]
pub struct Matcher {
    /// Upper case.
    pub method: Option<String>,
    /// `scheme://host[:port]`, without a trailing slash.
    pub url_base: Option<String>,
    /// A regular expression searched for in the URL's path (without its
    /// trailing slash).
    pub url_path_pattern: Option<String>,
    /// Query parameters the request must have, with these values.
    pub params: Vec<(String, String)>,
    /// Headers (lower-case names) the request must have, with these values.
    pub headers: Vec<(String, String)>,
    /// The calls a matching request counts for.
    pub weight: u64,
}

/// Headers the host writes (the credentials' and those it adds as it
/// sends): a matcher on them would match what the guest never sees.
const HOST_HEADERS: [&str; 10] = [
    "authorization",
    "cookie",
    "proxy-authorization",
    "content-type",
    "content-length",
    "accept",
    "accept-encoding",
    "user-agent",
    "connection",
    "host",
];

/// The most calls a limit or weight may name.
const MAX_CALLS: u64 = 1_000_000_000;

/// Pattern syntax Python's `re` reads otherwise than `regex-lite` (POSIX
/// classes, word-boundary forms, Unicode classes): refused rather than
/// matched differently.
const DIFFERENT_SYNTAX: [&str; 6] = ["[:", "\\<", "\\>", "\\b{", "\\p", "\\P"];

impl Budget {
    /// The budget at `node`, its templates evaluated with `config` at
    /// `now`.
    pub(crate) fn read(node: &Node, config: &Val, now: DateTime<Utc>) -> Result<Budget, Refusal> {
        node.expect(&["HTTPAPIBudget"], &[])?;
        let mut reads = Vec::new();
        let policies = node
            .children("policies")?
            .iter()
            .map(|p| read_policy(p, config, now, &mut reads))
            .collect::<Result<Vec<_>, _>>()?;
        if policies.is_empty() {
            return Err(Refusal::new(node.below("policies"), "a budget needs at least one policy"));
        }
        let statuses = match node.get("status_codes_for_ratelimit_hit") {
            None => vec![429],
            Some(Value::Array(items)) if !items.is_empty() => items
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    s.as_u64().and_then(|s| u16::try_from(s).ok()).ok_or_else(|| {
                        Refusal::new(
                            format!("{}/{i}", node.below("status_codes_for_ratelimit_hit")),
                            "expected a status",
                        )
                    })
                })
                .collect::<Result<_, _>>()?,
            Some(Value::Array(_)) => vec![429],
            Some(_) => return Err(Refusal::new(node.below("status_codes_for_ratelimit_hit"), "expected a list")),
        };
        Ok(Budget {
            policies,
            reset_header: node.text("ratelimit_reset_header")?.unwrap_or("ratelimit-reset").to_owned(),
            remaining_header: node.text("ratelimit_remaining_header")?.unwrap_or("ratelimit-remaining").to_owned(),
            hit_statuses: statuses,
            reads,
        })
    }

    /// The pointer of the first template that reads one of the secret
    /// fields `secrets` (JSON pointers): a limit the guest could only set
    /// knowing the secret.
    pub fn reads_secret(&self, secrets: &[String]) -> Option<&str> {
        let touches = |path: &[String]| {
            let pointer: String =
                path.iter().map(|p| format!("/{}", p.replace('~', "~0").replace('/', "~1"))).collect();
            secrets.iter().any(|s| {
                s == &pointer
                    || s.starts_with(&format!("{pointer}/"))
                    || pointer.starts_with(&format!("{s}/"))
                    || pointer.is_empty()
            })
        };
        self.reads.iter().find_map(|(at, reach)| {
            let reads = match reach {
                Reach::Nothing => false,
                Reach::Whole => !secrets.is_empty(),
                Reach::Paths(paths) => paths.iter().any(|p| touches(p)),
            };
            reads.then_some(at.as_str())
        })
    }
}

/// A component's type, which a budget's rates and matchers may leave out.
fn typed(node: &Node, kind: &str) -> Result<(), Refusal> {
    match node.kind() {
        "" => Ok(()),
        k if k == kind => Ok(()),
        _ => Err(node.unsupported_type()),
    }
}

fn read_policy(
    node: &Node,
    config: &Val,
    now: DateTime<Utc>,
    reads: &mut Vec<(String, Reach)>,
) -> Result<Policy, Refusal> {
    let kinds = ["FixedWindowCallRatePolicy", "MovingWindowCallRatePolicy", "UnlimitedCallRatePolicy"];
    node.expect(&kinds, &[])?;
    let matchers = node
        .children("matchers")?
        .iter()
        .map(|m| read_matcher(m, config, now, reads))
        .collect::<Result<Vec<_>, _>>()?;
    let limit = match node.kind() {
        "UnlimitedCallRatePolicy" => Limit::Unlimited,
        "FixedWindowCallRatePolicy" => {
            let calls = match node.get("call_limit") {
                Some(Value::Number(n)) => n.as_u64().filter(|n| (1..=MAX_CALLS).contains(n)),
                _ => None,
            }
            .ok_or_else(|| {
                Refusal::new(node.below("call_limit"), format!("expected a number of calls from 1 to {MAX_CALLS}"))
            })?;
            Limit::Fixed { period: period(node, "period")?, calls }
        }
        _ => {
            let rates = node.children("rates")?;
            if rates.is_empty() {
                return Err(Refusal::new(node.below("rates"), "a moving window needs at least one rate"));
            }
            let rates = rates
                .iter()
                .map(|rate| {
                    typed(rate, "Rate")?;
                    let limit = evaluated(rate, "limit", config, now, reads)?
                        .ok_or_else(|| Refusal::new(rate.below("limit"), "a rate needs a limit"))?;
                    Ok((limit, period(rate, "interval")?))
                })
                .collect::<Result<Vec<_>, Refusal>>()?;
            Limit::Moving { rates }
        }
    };
    Ok(Policy { limit, matchers })
}

fn read_matcher(
    node: &Node,
    config: &Val,
    now: DateTime<Utc>,
    reads: &mut Vec<(String, Reach)>,
) -> Result<Matcher, Refusal> {
    typed(node, "HttpRequestRegexMatcher")?;
    let pairs = |key: &str, lower: bool| -> Result<Vec<(String, String)>, Refusal> {
        match node.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Object(map)) => Ok(map
                .iter()
                .map(|(k, v)| {
                    let k = if lower { k.to_lowercase() } else { k.clone() };
                    (k, python_str(v))
                })
                .collect()),
            Some(_) => Err(Refusal::new(node.below(key), "expected an object")),
        }
    };
    let headers = pairs("headers", true)?;
    if let Some((name, _)) = headers.iter().find(|(k, _)| HOST_HEADERS.contains(&k.as_str())) {
        return Err(Refusal::new(
            node.below("headers"),
            format!("the host writes {name}, so a matcher on it would not see what is sent"),
        ));
    }
    // The CDK takes an empty field as none.
    let text = |key: &str| -> Result<Option<&str>, Refusal> { Ok(node.text(key)?.filter(|t| !t.is_empty())) };
    let url_path_pattern = text("url_path_pattern")?.map(str::to_owned);
    if let Some(pattern) = &url_path_pattern {
        let at = node.below("url_path_pattern");
        if let Some(syntax) = DIFFERENT_SYNTAX.iter().find(|s| pattern.contains(*s)) {
            return Err(Refusal::new(at, format!("{syntax} means something else to Python's re than here")));
        }
        regex_lite::Regex::new(pattern)
            .map_err(|e| Refusal::new(at, format!("a pattern this runtime cannot read: {e}")))?;
    }
    let weight = evaluated(node, "weight", config, now, reads)?.unwrap_or(1);
    Ok(Matcher {
        method: text("method")?.map(str::to_uppercase),
        url_base: text("url_base")?.map(|b| b.trim_end_matches('/').to_owned()),
        url_path_pattern,
        params: pairs("params", false)?,
        headers,
        weight,
    })
}

/// A duration field: exact, and above nothing.
fn period(node: &Node, key: &str) -> Result<TimeDelta, Refusal> {
    let text = node.text(key)?.ok_or_else(|| Refusal::new(node.below(key), "expected an ISO 8601 duration"))?;
    match Gap::parse(text) {
        Ok(Gap { months: 0, exact }) if exact > TimeDelta::zero() => Ok(exact),
        Ok(_) => Err(Refusal::new(node.below(key), "expected a duration above nothing, in days or less")),
        Err(e) => Err(Refusal::new(node.below(key), e.0)),
    }
}

/// A number field that may be a template of the configuration, as the
/// CDK evaluates it once (`int(...)`): a number of at least 1.
fn evaluated(
    node: &Node,
    key: &str,
    config: &Val,
    now: DateTime<Utc>,
    reads: &mut Vec<(String, Reach)>,
) -> Result<Option<u64>, Refusal> {
    let Some(value) = node.get(key) else { return Ok(None) };
    let pointer = node.below(key);
    let template = template_of(value, &pointer)?;
    reads.push((pointer.clone(), template.reach("config")));
    let ctx = Context::at(now).with("config", config.clone());
    let rendered = template.render(&ctx).map_err(|e| Refusal::new(&pointer, format!("the template fails: {e}")))?;
    match rendered.trim().parse::<u64>() {
        Ok(n) if (1..=MAX_CALLS).contains(&n) => Ok(Some(n)),
        _ => Err(Refusal::new(pointer, format!("{rendered:?} is not a whole number from 1 to {MAX_CALLS}"))),
    }
}

/// A value as Python's `str()` writes it (what the CDK compares).
fn python_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Null => "None".into(),
        other => other.to_string(),
    }
}
