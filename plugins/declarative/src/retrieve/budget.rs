//! The source's `api_budget` kept to while a stream is read: each request
//! takes its calls from the first policy that matches it, waiting on the
//! monotonic clock until that policy's window allows them; each answer
//! updates the policy from the provider's headers (the calls left, when
//! the window resets) or its rate-limit status, as the CDK's
//! `HttpAPIBudget` does. The budget holds within one stream's read; the
//! host's rate budgets hold across streams and servers.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use chrono::{DateTime, Utc};

use super::build::percent_decode;
use super::http::{Method, Request, Response};
use super::{Started, Transport};
use crate::model::budget::{Budget, Limit, Matcher};

/// The longest a request waits for its budget: a window that opens later
/// fails the read, naming the wait, rather than hold it for days.
const MAX_WAIT_SECS: f64 = 600.0;

type TransportError = Box<dyn std::error::Error + Send + Sync>;

/// Why the budget stops a request.
#[derive(Debug)]
struct BudgetError(String);

impl std::fmt::Display for BudgetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "api_budget: {}", self.0)
    }
}

impl std::error::Error for BudgetError {}

/// A policy's calls so far.
#[derive(Debug)]
enum Window {
    Unlimited,
    /// Calls taken in the window that ends at `resets_at` (monotonic
    /// seconds).
    Fixed {
        resets_at: f64,
        taken: u64,
    },
    /// When each call was taken, with its weight, oldest first.
    Moving {
        taken: VecDeque<(f64, u64)>,
    },
}

/// What an answer said of its policy's calls: how many are left, and when
/// its window resets (Unix seconds).
struct Said {
    policy: usize,
    left: Option<u64>,
    resets: Option<i64>,
}

/// A transport that keeps to a budget.
pub(super) struct Paced<'a> {
    budget: Rc<Budget>,
    patterns: Vec<Vec<Option<regex_lite::Regex>>>,
    inner: &'a mut dyn Transport,
    windows: Vec<Window>,
    /// Answers not yet taken into account (one started ahead ends later).
    said: Rc<RefCell<Vec<Result<Said, BudgetError>>>>,
}

impl<'a> Paced<'a> {
    pub(super) fn new(budget: &Budget, inner: &'a mut dyn Transport) -> Paced<'a> {
        let now = seconds(inner.monotonic());
        let windows = budget
            .policies
            .iter()
            .map(|p| match p.limit {
                Limit::Unlimited => Window::Unlimited,
                // The CDK's first window lasts ten days, unless an answer
                // names its reset.
                Limit::Fixed { .. } => Window::Fixed { resets_at: now + 10.0 * 86_400.0, taken: 0 },
                Limit::Moving { .. } => Window::Moving { taken: VecDeque::new() },
            })
            .collect();
        let patterns = budget
            .policies
            .iter()
            .map(|p| {
                p.matchers
                    .iter()
                    .map(|m| m.url_path_pattern.as_deref().and_then(|r| regex_lite::Regex::new(r).ok()))
                    .collect()
            })
            .collect();
        Paced { budget: Rc::new(budget.clone()), patterns, inner, windows, said: Rc::default() }
    }

    /// The first policy that matches `request`, and the weight of the
    /// request under it (its first matching matcher's). A matcher on a
    /// header or parameter the host fills with a credential fails the
    /// read: it would never see what is sent.
    fn policy_of(&self, request: &Request) -> Result<Option<(usize, u64)>, TransportError> {
        let parts = Parts::of(request);
        for (i, policy) in self.budget.policies.iter().enumerate() {
            for m in &policy.matchers {
                let named = m.headers.iter().map(|(k, _)| ("header", k.to_ascii_lowercase()));
                let named = named.chain(m.params.iter().map(|(k, _)| ("query parameter", k.to_ascii_lowercase())));
                if let Some((_, name)) = named.into_iter().find(|n| parts.placed.contains(n)) {
                    return Err(Box::new(BudgetError(format!(
                        "policy {i} matches on {name}, which the host fills with a credential"
                    ))));
                }
            }
            if policy.matchers.is_empty() {
                return Ok(Some((i, 1)));
            }
            let matching =
                policy.matchers.iter().zip(&self.patterns[i]).find(|(m, re)| matches(m, re.as_ref(), &parts));
            if let Some((m, _)) = matching {
                return Ok(Some((i, m.weight)));
            }
        }
        Ok(None)
    }

    /// Takes the calls `request` needs, waiting for them.
    fn take(&mut self, request: &Request) -> Result<Option<usize>, TransportError> {
        self.settle()?;
        let Some((i, weight)) = self.policy_of(request)? else { return Ok(None) };
        loop {
            let now = seconds(self.inner.monotonic());
            let wait = try_take(&self.budget.policies[i].limit, &mut self.windows[i], weight, now)?;
            let Some(wait) = wait else { return Ok(Some(i)) };
            if wait > MAX_WAIT_SECS {
                return Err(Box::new(BudgetError(format!(
                    "policy {i} allows the next call in {wait:.0} s, longer than a read waits ({MAX_WAIT_SECS:.0} s)"
                ))));
            }
            self.inner.wait(wait.max(0.001));
        }
    }

    /// Takes into account what the answers so far said.
    fn settle(&mut self) -> Result<(), TransportError> {
        let said: Vec<Result<Said, BudgetError>> = self.said.borrow_mut().drain(..).collect();
        if said.is_empty() {
            return Ok(());
        }
        let now = seconds(self.inner.monotonic());
        let wall = unix_seconds(self.inner.now());
        for s in said {
            let s = s?;
            let limit = &self.budget.policies[s.policy].limit;
            update(limit, &mut self.windows[s.policy], s.left, s.resets.map(|r| now + (r as f64 - wall)), now);
        }
        Ok(())
    }
}

impl Transport for Paced<'_> {
    fn send(&mut self, request: &Request) -> Result<Response, TransportError> {
        let policy = self.take(request)?;
        let response = self.inner.send(request)?;
        if let Some(policy) = policy {
            // Counted as it comes, as the CDK counts it.
            self.said.borrow_mut().push(said(&self.budget, policy, &response));
            self.settle()?;
        }
        Ok(response)
    }

    fn wait(&mut self, seconds: f64) {
        // An answer started ahead is counted before a backoff; one the
        // budget cannot read fails the read at its next request.
        let said: Vec<_> = self.said.borrow_mut().drain(..).collect();
        let (fine, failed): (Vec<_>, Vec<_>) = said.into_iter().partition(Result::is_ok);
        self.said.borrow_mut().extend(fine);
        let _ = self.settle();
        self.said.borrow_mut().extend(failed);
        self.inner.wait(seconds)
    }

    fn now(&self) -> DateTime<Utc> {
        self.inner.now()
    }

    fn monotonic(&self) -> std::time::Duration {
        self.inner.monotonic()
    }

    fn start(&mut self, request: &Request) -> Result<Box<dyn Started>, TransportError> {
        let policy = self.take(request)?;
        let started = self.inner.start(request)?;
        match policy {
            None => Ok(started),
            Some(policy) => {
                Ok(Box::new(PacedStarted { started, policy, budget: self.budget.clone(), said: self.said.clone() }))
            }
        }
    }
}

/// A request started under a budget: its answer is noted when it comes.
struct PacedStarted {
    started: Box<dyn Started>,
    policy: usize,
    budget: Rc<Budget>,
    said: Rc<RefCell<Vec<Result<Said, BudgetError>>>>,
}

impl Started for PacedStarted {
    fn finish(self: Box<Self>) -> Result<Response, TransportError> {
        let response = self.started.finish()?;
        self.said.borrow_mut().push(said(&self.budget, self.policy, &response));
        Ok(response)
    }
}

/// What `response` says of policy `policy`'s calls: the remaining header,
/// else none left on a rate-limit status; the reset header. A header that
/// is no whole number fails the read, as the CDK's `int()` fails it.
fn said(budget: &Budget, policy: usize, response: &Response) -> Result<Said, BudgetError> {
    let number = |name: &str| -> Result<Option<i64>, BudgetError> {
        match response.header(name).map(str::trim).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => v
                .parse::<i64>()
                .map(Some)
                .map_err(|_| BudgetError(format!("the provider's {name} header is {v:?}, not a whole number"))),
        }
    };
    // Fewer than none left is none left.
    let left = match number(&budget.remaining_header)? {
        Some(left) => Some(u64::try_from(left).unwrap_or(0)),
        None if budget.hit_statuses.contains(&response.status) => Some(0),
        None => None,
    };
    Ok(Said { policy, left, resets: number(&budget.reset_header)? })
}

/// Takes `weight` calls of `window` at `now` if its limit allows them
/// (`None`), else how long to wait before trying again.
fn try_take(limit: &Limit, window: &mut Window, weight: u64, now: f64) -> Result<Option<f64>, TransportError> {
    match (limit, window) {
        (Limit::Fixed { period, calls }, Window::Fixed { resets_at, taken }) => {
            if weight > *calls {
                return Err(Box::new(BudgetError(format!(
                    "a request weighs {weight}, more than the {calls} calls allowed"
                ))));
            }
            roll(*period, resets_at, taken, now);
            if taken.saturating_add(weight) > *calls {
                return Ok(Some(*resets_at - now));
            }
            *taken = taken.saturating_add(weight);
            Ok(None)
        }
        (Limit::Moving { rates }, Window::Moving { taken }) => {
            let lowest = rates.iter().map(|(l, _)| *l).min().unwrap_or(0);
            if weight > lowest {
                return Err(Box::new(BudgetError(format!(
                    "a request weighs {weight}, more than the lowest rate ({lowest})"
                ))));
            }
            let mut wait: Option<f64> = None;
            for (limit, interval) in rates {
                let span = seconds_of(*interval);
                let since = now - span;
                if used_since(taken, since).saturating_add(weight) > *limit {
                    // Until the oldest call in the window leaves it.
                    let oldest = taken.iter().find(|(t, _)| *t > since).map_or(now, |(t, _)| *t);
                    let until = oldest + span - now;
                    wait = Some(wait.map_or(until, |w| w.max(until)));
                }
            }
            if wait.is_some() {
                return Ok(wait);
            }
            taken.push_back((now, weight));
            // Calls older than the longest interval count no more.
            let longest = rates.iter().map(|(_, i)| seconds_of(*i)).fold(0.0, f64::max);
            while taken.front().is_some_and(|(t, _)| *t <= now - longest) {
                taken.pop_front();
            }
            Ok(None)
        }
        _ => Ok(None),
    }
}

/// The calls taken after `since`.
fn used_since(taken: &VecDeque<(f64, u64)>, since: f64) -> u64 {
    taken.iter().filter(|(t, _)| *t > since).fold(0u64, |sum, (_, w)| sum.saturating_add(*w))
}

/// A fixed window past its reset starts the next one.
fn roll(period: chrono::TimeDelta, resets_at: &mut f64, taken: &mut u64, now: f64) {
    if now > *resets_at {
        *resets_at += seconds_of(period);
        *taken = 0;
    }
}

/// Takes an answer's word into account: fewer calls left than the window
/// counts (a fixed window also takes a reset it names); a moving window
/// told none are left (with no reset) counts every call of its strictest
/// rate as taken now.
fn update(limit: &Limit, window: &mut Window, left: Option<u64>, resets_at: Option<f64>, now: f64) {
    match (limit, window) {
        (Limit::Fixed { period, calls }, Window::Fixed { resets_at: at, taken }) => {
            roll(*period, at, taken, now);
            if let Some(left) = left
                && calls.saturating_sub(*taken) > left
            {
                *taken = calls.saturating_sub(left);
            }
            if let Some(resets) = resets_at {
                *at = resets;
            }
        }
        (Limit::Moving { rates }, Window::Moving { taken }) if left == Some(0) && resets_at.is_none() => {
            let free = rates
                .iter()
                .map(|(limit, interval)| limit.saturating_sub(used_since(taken, now - seconds_of(*interval))))
                .min()
                .unwrap_or(0);
            if free > 0 {
                taken.push_back((now, free));
            }
        }
        _ => {}
    }
}

/// The parts of a request its matchers look at.
struct Parts {
    method: &'static str,
    base: String,
    path: String,
    params: Vec<(String, String)>,
    headers: Vec<(String, String)>,
    /// The headers and query parameters the host fills with a credential
    /// (as [`super::http::Place::part`] names them).
    placed: Vec<(&'static str, String)>,
}

impl Parts {
    fn of(request: &Request) -> Parts {
        let url = request.url.as_str();
        let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
        let (rest, _fragment) = rest.split_once('#').unwrap_or((rest, ""));
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (host, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let mut params: Vec<(String, String)> = query
            .split('&')
            .filter(|p| !p.is_empty())
            .filter_map(|p| {
                let (k, v) = p.split_once('=')?;
                let (k, v) = (percent_decode(k), percent_decode(v));
                // `parse_qsl` leaves out blank values.
                (!v.is_empty()).then_some((k, v))
            })
            .collect();
        params.extend(request.query.iter().filter(|(_, v)| !v.is_empty()).cloned());
        Parts {
            method: match request.method {
                Method::Get => "GET",
                Method::Post => "POST",
            },
            base: format!("{scheme}://{host}"),
            path: requoted(path.trim_end_matches('/')),
            params,
            headers: request.headers.iter().map(|(k, v)| (k.to_lowercase(), v.clone())).collect(),
            placed: request.credentials.iter().map(|c| c.place.part()).collect(),
        }
    }

    /// The value of `key` as a dict of the pairs holds it (the last wins).
    fn last<'p>(pairs: &'p [(String, String)], key: &str) -> Option<&'p str> {
        pairs.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

fn matches(m: &Matcher, pattern: Option<&regex_lite::Regex>, parts: &Parts) -> bool {
    m.method.as_deref().is_none_or(|method| method == parts.method)
        && m.url_base.as_deref().is_none_or(|base| base == parts.base)
        && pattern.is_none_or(|re| re.is_match(&parts.path))
        && m.params.iter().all(|(k, v)| Parts::last(&parts.params, k) == Some(v.as_str()))
        && m.headers.iter().all(|(k, v)| Parts::last(&parts.headers, k) == Some(v.as_str()))
}

/// A path as `requests` sends it (`requote_uri`): what is not safe in a
/// URL percent-encoded, escapes already there kept.
fn requoted(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~!#$%&'()*+,/:;=?@[]".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn seconds(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

fn seconds_of(d: chrono::TimeDelta) -> f64 {
    d.num_microseconds().map_or(f64::MAX, |us| us as f64 / 1e6)
}

fn unix_seconds(t: DateTime<Utc>) -> f64 {
    t.timestamp() as f64 + f64::from(t.timestamp_subsec_micros()) / 1e6
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::{Flow, prepare, read};
    use super::*;
    use crate::interpolation::Val;

    /// A provider that answers three pages at once and records, on a
    /// clock that moves only when the reader waits, when each request came.
    struct Provider {
        clock: f64,
        asked: Vec<(f64, String)>,
        /// Headers every answer carries.
        headers: Vec<(String, String)>,
        /// The status of every answer but the last page's.
        status: u16,
    }

    impl Transport for Provider {
        fn send(&mut self, request: &Request) -> Result<Response, TransportError> {
            let page: usize = request.query.iter().find(|(k, _)| k == "page").map_or(1, |(_, v)| v.parse().unwrap());
            self.asked.push((self.clock, format!("{} page {page}", request.url)));
            let body =
                json!({ "data": [{ "id": page }], "next": if page < 3 { json!(page + 1) } else { json!(null) } });
            let status = if page < 3 { self.status } else { 200 };
            Ok(Response { status, headers: self.headers.clone(), body: body.to_string().into_bytes() })
        }
        fn wait(&mut self, seconds: f64) {
            self.clock += seconds;
        }
        fn now(&self) -> DateTime<Utc> {
            DateTime::UNIX_EPOCH + chrono::TimeDelta::microseconds((self.clock * 1e6) as i64)
        }
        fn monotonic(&self) -> std::time::Duration {
            std::time::Duration::from_secs_f64(self.clock)
        }
    }

    fn manifest(budget: serde_json::Value) -> serde_json::Value {
        json!({ "api_budget": budget, "streams": [{ "type": "DeclarativeStream", "name": "items",
            "retriever": { "type": "SimpleRetriever",
                "requester": { "type": "HttpRequester", "url_base": "https://api.example.com", "path": "/v1/items" },
                "record_selector": { "type": "RecordSelector",
                    "extractor": { "type": "DpathExtractor", "field_path": ["data"] } },
                "paginator": { "type": "DefaultPaginator",
                    "pagination_strategy": { "type": "CursorPagination", "cursor_value": "{{ response.next }}",
                        "stop_condition": "{{ not response.next }}" },
                    "page_token_option": { "type": "RequestOption", "inject_into": "request_parameter",
                        "field_name": "page" } } } }] })
    }

    /// When each page was asked for (seconds after the read began), or why
    /// the read failed.
    fn read_with(budget: serde_json::Value, headers: &[(&str, &str)]) -> Result<Vec<f64>, String> {
        read_manifest(manifest(budget), headers, 200, &[])
    }

    /// [`read_with`] of a whole manifest, the provider answering `status`,
    /// the fields `given` secret.
    fn read_manifest(
        m: serde_json::Value,
        headers: &[(&str, &str)],
        status: u16,
        given: &[String],
    ) -> Result<Vec<f64>, String> {
        let now = "2024-01-01T00:00:00Z".parse().unwrap();
        let (source, env) = prepare(&m, &Val::from(&json!({ "rate": 2 })), given, now).map_err(|e| format!("{e:?}"))?;
        let headers = headers.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let mut provider = Provider { clock: 100.0, asked: Vec::new(), headers, status };
        read(&source, &source.streams[0], &env, None, &mut provider, &mut |_| Ok(Flow::More), &mut |_| Ok(()))
            .map_err(|e| e.to_string())?;
        // To a hundredth: a window opens just after its reset.
        Ok(provider.asked.iter().map(|(t, _)| ((t - 100.0) * 100.0).round() / 100.0).collect())
    }

    #[test]
    fn a_moving_window_spaces_the_calls_its_rate_allows() {
        let budget = json!({ "type": "HTTPAPIBudget", "policies": [{ "type": "MovingWindowCallRatePolicy",
            "rates": [{ "limit": "{{ config['rate'] }}", "interval": "PT10S" }],
            "matchers": [{ "method": "GET", "url_path_pattern": "^/v1/items" }] }] });
        assert_eq!(read_with(budget, &[]).unwrap(), [0.0, 0.0, 10.0]);
    }

    #[test]
    fn a_policy_whose_matchers_miss_the_request_keeps_nothing_back() {
        let budget = json!({ "type": "HTTPAPIBudget", "policies": [{ "type": "MovingWindowCallRatePolicy",
            "rates": [{ "limit": 1, "interval": "PT10S" }],
            "matchers": [{ "method": "GET", "url_path_pattern": "^/v1/files" },
                         { "method": "POST" }, { "params": { "page": "9" } }] }] });
        assert_eq!(read_with(budget, &[]).unwrap(), [0.0, 0.0, 0.0]);
        // The first policy that matches decides: unlimited before limited.
        let budget = json!({ "type": "HTTPAPIBudget", "policies": [
            { "type": "UnlimitedCallRatePolicy", "matchers": [{ "params": { "page": "2" } }] },
            { "type": "MovingWindowCallRatePolicy", "rates": [{ "limit": 1, "interval": "PT5S" }], "matchers": [] }] });
        assert_eq!(read_with(budget, &[]).unwrap(), [0.0, 0.0, 5.0]);
    }

    #[test]
    fn a_fixed_window_waits_for_the_reset_the_provider_names() {
        // Two calls a window; the provider says its window resets at
        // Unix second 130 (the clock starts at 100): the third call waits
        // for it.
        let budget = json!({ "type": "HTTPAPIBudget", "ratelimit_reset_header": "X-Reset", "policies": [{
            "type": "FixedWindowCallRatePolicy", "period": "PT60S", "call_limit": 2, "matchers": [] }] });
        assert_eq!(read_with(budget, &[("X-Reset", "130")]).unwrap(), [0.0, 0.0, 30.0]);
        // Without a reset the first window lasts ten days: the read fails,
        // naming the wait, rather than hold on.
        let budget = json!({ "type": "HTTPAPIBudget", "policies": [{
            "type": "FixedWindowCallRatePolicy", "period": "PT60S", "call_limit": 2, "matchers": [] }] });
        let failed = read_with(budget, &[]).unwrap_err();
        assert!(failed.contains("api_budget") && failed.contains("864000"), "{failed}");
    }

    #[test]
    fn an_answer_that_no_call_is_left_fills_a_moving_window() {
        let budget = json!({ "type": "HTTPAPIBudget", "policies": [{ "type": "MovingWindowCallRatePolicy",
            "rates": [{ "limit": 5, "interval": "PT4S" }], "matchers": [] }] });
        assert_eq!(read_with(budget, &[("ratelimit-remaining", "0")]).unwrap(), [0.0, 4.0, 8.0]);
    }

    #[test]
    fn budgets_the_runtime_cannot_keep_are_refused_by_pointer() {
        let refused = |budget: serde_json::Value| read_with(budget, &[]).unwrap_err();
        let policy = |matcher: serde_json::Value| {
            json!({ "type": "HTTPAPIBudget", "policies": [{ "type": "MovingWindowCallRatePolicy",
                "rates": [{ "limit": 1, "interval": "PT1S" }], "matchers": [matcher] }] })
        };
        assert!(
            refused(policy(json!({ "headers": { "Authorization": "x" } })))
                .contains("/api_budget/policies/0/matchers/0/headers")
        );
        assert!(refused(policy(json!({ "url_path_pattern": "(?<=a)b" }))).contains("url_path_pattern"));
        let months = json!({ "type": "HTTPAPIBudget", "policies": [{ "type": "MovingWindowCallRatePolicy",
            "rates": [{ "limit": 1, "interval": "P1M" }], "matchers": [] }] });
        assert!(refused(months).contains("/api_budget/policies/0/rates/0/interval"));
        let zero = json!({ "type": "HTTPAPIBudget", "policies": [{ "type": "MovingWindowCallRatePolicy",
            "rates": [{ "limit": "{{ config['none'] }}", "interval": "PT1S" }], "matchers": [] }] });
        assert!(refused(zero).contains("/api_budget/policies/0/rates/0/limit"));
        let custom = json!({ "type": "HTTPAPIBudget", "policies": [{ "type": "CustomCallRatePolicy" }] });
        assert!(refused(custom).contains("/api_budget/policies/0"));
    }

    #[test]
    fn a_matcher_weighs_its_requests_and_one_heavier_than_the_limit_fails_the_read() {
        let weighed = |weight: u64| {
            json!({ "type": "HTTPAPIBudget", "policies": [{ "type": "MovingWindowCallRatePolicy",
                "rates": [{ "limit": 2, "interval": "PT10S" }],
                "matchers": [{ "url_base": "https://api.example.com/", "headers": {}, "weight": weight }] }] })
        };
        assert_eq!(read_with(weighed(2), &[]).unwrap(), [0.0, 10.0, 20.0]);
        let failed = read_with(weighed(3), &[]).unwrap_err();
        assert!(failed.contains("weighs 3"), "{failed}");
    }

    #[test]
    fn a_rate_limit_status_leaves_no_call_in_the_window() {
        // A 429 without a remaining header: none left until the window
        // moves on (the status is the paginator's business; the records
        // still come).
        let budget = json!({ "type": "HTTPAPIBudget", "policies": [{ "type": "MovingWindowCallRatePolicy",
            "rates": [{ "limit": 5, "interval": "PT4S" }], "matchers": [] }] });
        let m = manifest(budget);
        let mut handled = m.clone();
        handled["streams"][0]["retriever"]["requester"]["error_handler"] = json!({ "type": "DefaultErrorHandler",
            "response_filters": [{ "type": "HttpResponseFilter", "action": "SUCCESS", "http_codes": [429] }] });
        assert_eq!(read_manifest(handled, &[], 429, &[]).unwrap(), [0.0, 4.0, 8.0]);
        // A remaining header that is no number fails the read, as the
        // CDK's int() does.
        let budget = json!({ "type": "HTTPAPIBudget", "policies": [{ "type": "MovingWindowCallRatePolicy",
            "rates": [{ "limit": 5, "interval": "PT4S" }], "matchers": [] }] });
        let failed = read_with(budget, &[("ratelimit-remaining", "1.5")]).unwrap_err();
        assert!(failed.contains("ratelimit-remaining"), "{failed}");
    }

    #[test]
    fn a_budget_that_reads_a_secret_or_matches_on_a_credential_is_refused() {
        let given = ["/key".to_owned()];
        let reading = |limit: &str, weight: &str| {
            manifest(json!({ "type": "HTTPAPIBudget", "policies": [{ "type": "MovingWindowCallRatePolicy",
                "rates": [{ "limit": limit, "interval": "PT1S" }],
                "matchers": [{ "method": "GET", "weight": weight }] }] }))
        };
        for (limit, weight, at) in [
            ("{{ 100 if 'sk_test_' in config['key'] else 25 }}", "1", "rates/0/limit"),
            ("2", "{{ 1 if config.get('key') else 2 }}", "matchers/0/weight"),
            ("{{ config | length }}", "1", "rates/0/limit"),
        ] {
            let refused = read_manifest(reading(limit, weight), &[], 200, &given).unwrap_err();
            assert!(refused.contains(&format!("/api_budget/policies/0/{at}")), "{limit} {weight}: {refused}");
            assert!(refused.contains("reads a secret"), "{refused}");
        }
        // A matcher on the header the host fills with the key.
        let mut m = manifest(json!({ "type": "HTTPAPIBudget", "policies": [{ "type": "MovingWindowCallRatePolicy",
            "rates": [{ "limit": 1, "interval": "PT1S" }], "matchers": [{ "headers": { "X-Key": "k" } }] }] }));
        m["streams"][0]["retriever"]["requester"]["authenticator"] = json!({ "type": "ApiKeyAuthenticator",
            "api_token": "{{ config['key'] }}",
            "inject_into": { "type": "RequestOption", "inject_into": "header", "field_name": "X-Key" } });
        let failed = read_manifest(m, &[], 200, &given).unwrap_err();
        assert!(failed.contains("x-key") && failed.contains("credential"), "{failed}");
    }

    #[test]
    fn a_path_is_matched_as_it_is_sent() {
        assert_eq!(requoted("/v1/caf\u{e9} items/%41"), "/v1/caf%C3%A9%20items/%41");
        assert_eq!(percent_decode("a%\u{20ac}b%41+c"), "a%\u{20ac}bA c");
    }
}
