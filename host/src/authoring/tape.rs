//! The two ends of a cassette's exchanges: [`Recording`] collects them
//! from a live egress, [`Player`] answers a replaying egress from them.
//!
//! Both know which call is running (`check`, `read posts`, ...): requests
//! are recorded under their call and answered only from their call's
//! recordings, so a plugin that asks in `read` what it asked in `check`
//! gets the answer it got in `read`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::cassette::{Answer, Exchange, placement_text};
use crate::egress::{EgressError, InboundResponse, OutboundRequest, Recorder, Replay};

/// The call running now, shared by the run and its tape.
#[derive(Default)]
pub(crate) struct CurrentCall(Mutex<String>);

impl CurrentCall {
    pub(crate) fn set(&self, call: &str) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = call.to_owned();
    }

    pub(crate) fn get(&self) -> String {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A request made while recording: its call, and once it ended, the
/// request and what the plugin got (none while it is on its way).
type Made = (String, Option<(OutboundRequest, Answer)>);

/// Collects a live egress's exchanges, in the order requests were made.
#[derive(Default)]
pub(crate) struct Recording {
    pub call: CurrentCall,
    next: AtomicU64,
    /// Ticket → (call, request, answer); a ticket without an answer was
    /// given up by the plugin.
    made: Mutex<BTreeMap<u64, Made>>,
}

impl Recording {
    /// The exchanges, in the order the plugin made the requests. A request
    /// the plugin gave up on before its answer came is kept as abandoned
    /// (its request as started).
    pub(crate) fn exchanges(&self) -> Vec<Exchange> {
        let made = self.made.lock().unwrap_or_else(|p| p.into_inner());
        made.values()
            .filter_map(|(call, done)| {
                done.as_ref().map(|(request, answer)| Exchange {
                    call: call.clone(),
                    request: request.clone(),
                    answer: answer.clone(),
                })
            })
            .collect()
    }
}

impl Recorder for Recording {
    fn begin(&self) -> u64 {
        let ticket = self.next.fetch_add(1, Ordering::SeqCst);
        self.made.lock().unwrap_or_else(|p| p.into_inner()).insert(ticket, (self.call.get(), None));
        ticket
    }

    fn exchanged(&self, ticket: u64, request: &OutboundRequest, outcome: &Result<InboundResponse, EgressError>) {
        let answer = match outcome {
            Ok(r) => Answer::Response(r.clone()),
            Err(e) => Answer::Error(e.clone()),
        };
        if let Some(entry) = self.made.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&ticket) {
            entry.1 = Some((request.clone(), answer));
        }
    }

    fn abandoned(&self, ticket: u64, request: &OutboundRequest) {
        if let Some(entry) = self.made.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&ticket)
            && entry.1.is_none()
        {
            entry.1 = Some((request.clone(), Answer::Abandoned));
        }
    }
}

/// `exchanges` without the resumed reads' exchanges that repeat one of
/// their stream's full read (the same request, answered the same): a
/// resumed read is answered from its own exchanges first, then from the
/// full read's.
pub(crate) fn without_repeats(exchanges: Vec<Exchange>) -> Vec<Exchange> {
    let same_answer = |a: &Answer, b: &Answer| match (a, b) {
        (Answer::Response(a), Answer::Response(b)) => a.status == b.status && a.body == b.body,
        (Answer::Error(a), Answer::Error(b)) => a.to_string() == b.to_string(),
        _ => false,
    };
    let mut kept: Vec<Exchange> = Vec::with_capacity(exchanges.len());
    for e in exchanges {
        let read = e
            .call
            .split(" from checkpoint ")
            .next()
            .and_then(|c| c.strip_prefix("resume "))
            .map(|s| format!("read {s}"));
        if let Some(read) = read {
            let key = RequestKey::of(&e.request);
            if kept
                .iter()
                .any(|k| k.call == read && RequestKey::of(&k.request) == key && same_answer(&k.answer, &e.answer))
            {
                continue;
            }
        }
        kept.push(e);
    }
    kept
}

/// What identifies a request in a recording: method, URL, body and
/// credentials (handle and placement of each). Headers the plugin sets are kept in
/// the cassette but do not take part.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RequestKey {
    method: &'static str,
    url: String,
    body: Option<Vec<u8>>,
    credentials: Vec<(String, String)>,
}

impl RequestKey {
    fn of(r: &OutboundRequest) -> Self {
        RequestKey {
            method: r.method.as_str(),
            url: r.url.clone(),
            body: r.body.clone(),
            credentials: r
                .credentials
                .iter()
                .map(|c| (c.handle.as_str().to_owned(), placement_text(&c.placement)))
                .collect(),
        }
    }
}

/// A request the recording had no answer for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Miss {
    pub call: String,
    pub method: &'static str,
    pub url: String,
    /// Why none fitted, naming the closest recorded request.
    pub why: String,
}

impl std::fmt::Display for Miss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no recorded answer for {} {} (in {}): {}", self.method, self.url, self.call, self.why)
    }
}

/// Answers requests from a cassette's exchanges, each at most once.
pub(crate) struct Player {
    pub call: CurrentCall,
    recorded: Vec<(String, RequestKey, Answer)>,
    used: Mutex<Vec<bool>>,
    misses: Mutex<Vec<Miss>>,
}

impl Player {
    pub(crate) fn new(exchanges: &[Exchange]) -> Self {
        let recorded: Vec<_> =
            exchanges.iter().map(|e| (e.call.clone(), RequestKey::of(&e.request), e.answer.clone())).collect();
        let used = Mutex::new(vec![false; recorded.len()]);
        Player { call: CurrentCall::default(), recorded, used, misses: Mutex::new(Vec::new()) }
    }

    /// The requests that found no answer, in the order they were made.
    pub(crate) fn misses(&self) -> Vec<Miss> {
        self.misses.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Recorded requests (1-based, as in `exchanges.jsonl`) that were
    /// never asked again, except those the plugin had given up on.
    pub(crate) fn unused(&self) -> Vec<(usize, String)> {
        let used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        self.recorded
            .iter()
            .enumerate()
            .filter(|(i, (_, _, answer))| !used[*i] && !matches!(answer, Answer::Abandoned))
            .map(|(i, (call, key, _))| (i + 1, format!("{} {} (in {call})", key.method, key.url)))
            .collect()
    }

    /// Why `key` found no answer in `call`, naming the closest recorded
    /// request.
    fn explain(&self, call: &str, key: &RequestKey, used: &[bool]) -> String {
        let same: Vec<usize> =
            (0..self.recorded.len()).filter(|i| self.recorded[*i].0 == call && self.recorded[*i].1 == *key).collect();
        if !same.is_empty() {
            return format!(
                "it was recorded {} time(s) in this call and every recorded answer was used (first: exchange {})",
                same.len(),
                same[0] + 1
            );
        }
        let in_call: Vec<usize> = (0..self.recorded.len()).filter(|i| self.recorded[*i].0 == call).collect();
        let candidates = if in_call.is_empty() { (0..self.recorded.len()).collect() } else { in_call };
        let closest = candidates.into_iter().min_by_key(|i| {
            let (_, other, _) = &self.recorded[*i];
            let mut distance = edit_distance(&key.url, &other.url);
            if other.method != key.method {
                distance += 1000;
            }
            if other.body != key.body {
                distance += 100;
            }
            if other.credentials != key.credentials {
                distance += 100;
            }
            // Prefer one not yet used: the likelier intended answer.
            (distance, used[*i])
        });
        match closest {
            None => "the cassette records no request at all".into(),
            Some(i) => {
                let (other_call, other, _) = &self.recorded[i];
                let mut differs = Vec::new();
                if other.method != key.method {
                    differs.push("method");
                }
                if other.url != key.url {
                    differs.push("URL");
                }
                if other.body != key.body {
                    differs.push("body");
                }
                if other.credentials != key.credentials {
                    differs.push("credential");
                }
                format!(
                    "the closest recorded request is exchange {} {} {} (in {other_call}; differs in {})",
                    i + 1,
                    other.method,
                    other.url,
                    if differs.is_empty() { "its call".to_owned() } else { differs.join(", ") }
                )
            }
        }
    }
}

impl Replay for Player {
    fn answer(&self, request: &OutboundRequest) -> Result<InboundResponse, EgressError> {
        let call = self.call.get();
        let key = RequestKey::of(request);
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        let found =
            (0..self.recorded.len()).find(|i| !used[*i] && self.recorded[*i].0 == call && self.recorded[*i].1 == key);
        if let Some(i) = found {
            used[i] = true;
            return match &self.recorded[i].2 {
                Answer::Response(r) => Ok(r.clone()),
                Answer::Error(e) => Err(e.clone()),
                Answer::Abandoned => {
                    Err(EgressError::ConnectionFailed("the plugin gave this request up when it was recorded".into()))
                }
            };
        }
        let miss = Miss {
            call: call.clone(),
            method: key.method,
            url: key.url.clone(),
            why: self.explain(&call, &key, &used),
        };
        let message = miss.to_string();
        self.misses.lock().unwrap_or_else(|p| p.into_inner()).push(miss);
        // A refusal, not a connection failure: nothing retries it, so a
        // replay miss fails the test at once, named once.
        Err(EgressError::Denied(message))
    }
}

/// Levenshtein distance of two strings, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous + usize::from(ca != *cb);
            previous = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(previous + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::Method;

    fn get(url: &str) -> OutboundRequest {
        OutboundRequest {
            method: Method::Get,
            url: url.into(),
            headers: vec![],
            body: None,
            credentials: Vec::new(),
            timeout_ms: None,
        }
    }

    fn ok(body: &str) -> Answer {
        Answer::Response(InboundResponse { status: 200, headers: vec![], body: body.as_bytes().to_vec() })
    }

    #[test]
    fn each_recorded_answer_is_given_once_within_its_call() {
        let exchanges = vec![
            Exchange { call: "read a".into(), request: get("https://h/p?page=1"), answer: ok("1") },
            Exchange { call: "read a".into(), request: get("https://h/p?page=2"), answer: ok("2") },
            Exchange { call: "read a".into(), request: get("https://h/p?page=1"), answer: ok("1 again") },
        ];
        let player = Player::new(&exchanges);
        player.call.set("read a");
        assert_eq!(player.answer(&get("https://h/p?page=2")).unwrap().body, b"2");
        assert_eq!(player.answer(&get("https://h/p?page=1")).unwrap().body, b"1");
        assert_eq!(player.answer(&get("https://h/p?page=1")).unwrap().body, b"1 again");
        let third = player.answer(&get("https://h/p?page=1")).unwrap_err().to_string();
        assert!(third.contains("recorded 2 time(s)"), "{third}");
        assert!(player.unused().is_empty());

        player.call.set("check");
        let elsewhere = player.answer(&get("https://h/p?page=3")).unwrap_err().to_string();
        assert!(elsewhere.contains("GET https://h/p?page=3 (in check)"), "{elsewhere}");
        assert!(elsewhere.contains("closest recorded request is exchange"), "{elsewhere}");
        assert_eq!(player.misses().len(), 2);
    }

    #[test]
    fn the_closest_request_is_named() {
        let exchanges = vec![
            Exchange { call: "read a".into(), request: get("https://h/posts?_page=1"), answer: ok("1") },
            Exchange { call: "read a".into(), request: get("https://h/users?_page=1"), answer: ok("u") },
        ];
        let player = Player::new(&exchanges);
        player.call.set("read a");
        let miss = player.answer(&get("https://h/posts?page=2")).unwrap_err().to_string();
        assert!(miss.contains("exchange 1 GET https://h/posts?_page=1"), "{miss}");
        assert_eq!(player.unused().len(), 2);
    }

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }
}
