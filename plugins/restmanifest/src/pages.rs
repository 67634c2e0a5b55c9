//! Walking a stream's pages as its manifest entry says: the first request
//! (path, parameters, placeholder), each page's records, and the next page
//! by the paging the entry names, never outside the base URL's origin and
//! never past the page limit or round in a loop.
//!
//! Where a page says how many there are (page numbers with a total, or an
//! offset with a total) and the stream has no rate limit, the next
//! [`AHEAD`] pages are requested once this one's records are handed over
//! (`http-ahead`), so the provider's latency overlaps the host's work.
//! Any other paging learns the next page from the page before it and is
//! read one page at a time.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use connector_sdk::{Error, Http, Pending, RequestBuilder, Result};
use serde_json::value::RawValue;

use crate::json::{Page, Selector, first_byte};
use crate::manifest::{self, Config, Paging, StreamSpec};

/// Pages requested ahead of the one being handed over, at most (and at
/// most what the host allows pending).
pub const AHEAD: usize = 3;

/// One stream's reader: its requests and paging.
pub struct Pager<'c> {
    config: &'c Config,
    spec: &'c StreamSpec,
    selector: Selector,
    interval: Option<Duration>,
    last_request: Option<Instant>,
    /// `https://host[:port]` of the base URL, lower case.
    origin: String,
}

/// What a page walk is asked to do with each page.
pub enum Flow {
    /// Go on to the next page.
    More,
    /// Stop: the caller has what it needs.
    Enough,
}

impl<'c> Pager<'c> {
    pub fn new(config: &'c Config, spec: &'c StreamSpec) -> Self {
        Pager {
            config,
            spec,
            selector: Selector::parse(&spec.records),
            interval: spec.interval(&config.manifest),
            last_request: None,
            origin: origin(&config.base_url).unwrap_or_default(),
        }
    }

    /// The URL of the first page: the base URL, the path with `value` in
    /// its placeholder, the entry's parameters, the paging's first
    /// parameters and `extra` (the incremental parameter).
    fn first_url(&self, value: Option<&str>, extra: &[(String, String)]) -> String {
        let mut path = self.spec.path.clone();
        if let (Some(parent), Some(value)) = (&self.spec.parent, value) {
            path = path.replace(&format!("{{{}}}", parent.placeholder), &encode(value));
        }
        let mut query: Vec<(String, String)> = self
            .spec
            .params
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string())))
            .collect();
        match &self.spec.paging {
            Paging::PageNumber { param, start, size_param, size, .. } => {
                query.push((param.clone(), start.to_string()));
                if let (Some(size_param), Some(size)) = (size_param, size) {
                    query.push((size_param.clone(), size.to_string()));
                }
            }
            Paging::Offset { offset_param, limit_param, limit, .. } => {
                query.push((offset_param.clone(), "0".into()));
                query.push((limit_param.clone(), limit.to_string()));
            }
            Paging::None | Paging::Cursor { .. } | Paging::LinkHeader | Paging::NextUrl { .. } => {}
        }
        query.extend(extra.iter().cloned());
        with_query(&format!("{}{path}", self.config.base_url.trim_end_matches('/')), &query)
    }

    fn request(&self, url: &str) -> RequestBuilder {
        let request = match &self.spec.body {
            Some(body) => Http::post(url).json(body),
            None => Http::get(url),
        };
        let mut request = request.header("accept", "application/json").retry(manifest::retry(self.spec, self.config));
        for (name, value) in &self.config.manifest.headers {
            request = request.header(name, value.clone());
        }
        if let Some(handle) = &self.config.credential_handle {
            // The placement was checked with the config.
            if let Ok(placed) = manifest::with_credential(request.clone(), handle, self.config) {
                request = placed;
            }
        }
        request
    }

    /// Waits as long as the stream's rate limit asks.
    fn throttle(&mut self) {
        if let (Some(interval), Some(last)) = (self.interval, self.last_request) {
            let since = last.elapsed();
            if since < interval {
                std::thread::sleep(interval - since);
            }
        }
        self.last_request = Some(Instant::now());
    }

    /// Reads the pages of the stream (for the parent value `value`), handing
    /// each page's records to `on_page` until it says enough or the paging
    /// ends.
    pub fn walk(
        &mut self,
        value: Option<&str>,
        extra: &[(String, String)],
        on_page: &mut dyn FnMut(u32, &[&RawValue]) -> Result<Flow>,
    ) -> Result<()> {
        let name = &self.spec.name;
        let limit = self.spec.page_limit(&self.config.manifest);
        let first = self.first_url(value, extra);
        let mut url = first.clone();
        let mut asked: HashSet<String> = HashSet::new();
        let mut ahead: VecDeque<(String, Pending)> = VecDeque::new();
        let mut number = 0u32;
        // The next offset, by the records received (an API may send fewer
        // than the limit asked for and still have more).
        let mut offset = 0u64;
        loop {
            number += 1;
            if number > limit {
                return Err(Error::ProviderError(format!(
                    "stream {name}: more than {limit} pages; the paging does not end (check the stream's paging, or raise page_limit)"
                )));
            }
            if !asked.insert(url.clone()) {
                return Err(Error::ProviderError(format!(
                    "stream {name}, page {number}: the paging asks for a page it already read; it goes round in a loop"
                )));
            }
            let sent = match ahead.pop_front() {
                Some((started, pending)) if started == url => pending.finish(),
                _ => {
                    ahead.clear();
                    self.throttle();
                    self.request(&url).send()
                }
            };
            let response = sent.map_err(|e| in_context(e, name, number))?;
            let link = response.header("link").map(str::to_owned);
            let body = response.into_text().map_err(|e| in_context(e, name, number))?;
            let doc = Page::parse(&body).map_err(|e| {
                Error::ProviderError(format!("stream {name}, page {number}: the answer is not JSON ({e})"))
            })?;
            let records = self.records(&doc, number)?;
            offset += records.len() as u64;
            if let Flow::Enough = on_page(number, &records)? {
                return Ok(());
            }
            // Only once the caller wants more: a check or a preview that
            // stops after one page sends nothing it does not read.
            self.start_ahead(&mut ahead, &first, &doc, (number, limit), records.len(), offset);
            let next = match &self.spec.paging {
                Paging::None => None,
                // A total the page states is trusted over a short page: APIs
                // cap page sizes below what is asked.
                Paging::PageNumber { param, start, size, total_pages, .. } => {
                    let more = match total_pages.as_ref().and_then(|at| number_at(&doc, at)) {
                        Some(total) => u64::from(number) < total,
                        None => !size.is_some_and(|size| records.len() < size as usize),
                    };
                    (!records.is_empty() && more)
                        .then(|| replace_param(&first, param, &(start + u64::from(number)).to_string()))
                }
                Paging::Offset { offset_param, limit: page, total, .. } => {
                    let more = match total.as_ref().and_then(|at| number_at(&doc, at)) {
                        Some(total) => offset < total,
                        None => records.len() >= *page as usize,
                    };
                    (!records.is_empty() && more).then(|| replace_param(&first, offset_param, &offset.to_string()))
                }
                Paging::Cursor { param, next_cursor } => {
                    text_at(&doc, next_cursor).filter(|c| !c.is_empty()).map(|c| replace_param(&first, param, &c))
                }
                Paging::LinkHeader => match link.as_deref().and_then(next_link) {
                    Some(link) => Some(self.follow(&url, &link, number)?),
                    None => None,
                },
                Paging::NextUrl { next_url } => match text_at(&doc, next_url).filter(|u| !u.is_empty()) {
                    Some(link) => Some(self.follow(&url, &link, number)?),
                    None => None,
                },
            };
            match next {
                Some(next) => url = next,
                None => return Ok(()),
            }
        }
    }

    /// Requests the pages after page `number` that its body says exist,
    /// keeping [`AHEAD`] on their way. Only with a known total and no rate
    /// limit; a refusal to start one is no error (it is asked for when due).
    fn start_ahead(
        &self,
        ahead: &mut VecDeque<(String, Pending)>,
        first: &str,
        doc: &Page,
        (number, page_limit): (u32, u32),
        on_page: usize,
        offset: u64,
    ) {
        if self.interval.is_some() {
            return;
        }
        let upcoming: Vec<String> = match &self.spec.paging {
            Paging::PageNumber { param, start, size, total_pages: Some(at), .. } => {
                let short = size.is_some_and(|size| on_page < size as usize);
                let Some(total) = number_at(doc, at).filter(|_| on_page > 0 && !short) else { return };
                (u64::from(number) + 1..=total.min(u64::from(page_limit)))
                    .take(AHEAD)
                    .map(|page| replace_param(first, param, &(start + page - 1).to_string()))
                    .collect()
            }
            Paging::Offset { offset_param, limit, total: Some(at), .. } => {
                // Only after a full page: the step of the pages to come.
                let Some(total) = number_at(doc, at).filter(|_| on_page >= *limit as usize) else { return };
                (0..u64::from(page_limit.saturating_sub(number)))
                    .map(|k| offset + k * u64::from(*limit))
                    .take_while(|offset| *offset < total)
                    .take(AHEAD)
                    .map(|offset| replace_param(first, offset_param, &offset.to_string()))
                    .collect()
            }
            _ => return,
        };
        let allowed = AHEAD.min(Pending::max() as usize);
        for url in upcoming {
            if ahead.len() >= allowed {
                return;
            }
            if ahead.iter().any(|(started, _)| *started == url) {
                continue;
            }
            match self.request(&url).start() {
                Ok(pending) => ahead.push_back((url, pending)),
                Err(_) => return,
            }
        }
    }

    /// The records of a page: the list the selector finds, each an object.
    fn records<'a>(&self, doc: &Page<'a>, number: u32) -> Result<Vec<&'a RawValue>> {
        let name = &self.spec.name;
        let Some(list) = self.selector.find_in(doc) else {
            let has = doc.keys();
            let has = if has.is_empty() { "no fields".to_owned() } else { format!("fields {}", has.join(", ")) };
            return Err(Error::ProviderError(format!(
                "stream {name}, page {number}: the records selector {} finds nothing (the page has {has})",
                self.selector
            )));
        };
        let records: Vec<&RawValue> = match first_byte(list) {
            b'[' => serde_json::from_str(list.get())
                .map_err(|e| Error::ProviderError(format!("stream {name}, page {number}: {e}")))?,
            b'n' => Vec::new(),
            _ => {
                return Err(Error::ProviderError(format!(
                    "stream {name}, page {number}: the records selector {} finds no list",
                    self.selector
                )));
            }
        };
        if let Some(i) = records.iter().position(|r| first_byte(r) != b'{') {
            return Err(Error::ProviderError(format!(
                "stream {name}, page {number}: record {i} is not a JSON object (does the records selector point at the list?)"
            )));
        }
        Ok(records)
    }

    /// The absolute URL of a next-page link, if it stays on the base URL's
    /// origin.
    fn follow(&self, current: &str, link: &str, number: u32) -> Result<String> {
        let url = resolve(current, link);
        match origin(&url) {
            Some(o) if o == self.origin => Ok(url),
            Some(other) => Err(Error::ProviderError(format!(
                "stream {}, page {number}: the next page is at {other}, outside {}; not followed",
                self.spec.name, self.origin
            ))),
            None => Err(Error::ProviderError(format!(
                "stream {}, page {number}: the next page is at {url}, which is no https URL; not followed",
                self.spec.name
            ))),
        }
    }
}

/// An SDK error, saying which stream and page it is about.
fn in_context(e: Error, stream: &str, page: u32) -> Error {
    let at = |m: String| format!("stream {stream}, page {page}: {m}");
    match e {
        Error::InvalidConfig(m) => Error::InvalidConfig(at(m)),
        Error::InvalidCredentials(m) => Error::InvalidCredentials(at(m)),
        Error::PermissionDenied(m) => Error::PermissionDenied(at(m)),
        Error::ProviderUnavailable(m) => Error::ProviderUnavailable(at(m)),
        Error::ProviderError(m) => Error::ProviderError(at(m)),
        Error::EgressDenied(m) => Error::EgressDenied(at(m)),
        Error::Unsupported(m) => Error::Unsupported(at(m)),
        Error::Internal(m) => Error::Internal(at(m)),
        other => other,
    }
}

/// A number at `place` (a number, or a text of digits).
fn number_at(doc: &Page, place: &str) -> Option<u64> {
    let found = Selector::parse(place).find_in(doc)?;
    match serde_json::from_str::<serde_json::Value>(found.get()).ok()? {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A text at `place` (a string, or a number written out); none for null.
fn text_at(doc: &Page, place: &str) -> Option<String> {
    let found = Selector::parse(place).find_in(doc)?;
    match serde_json::from_str::<serde_json::Value>(found.get()).ok()? {
        serde_json::Value::String(s) => Some(s),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The `rel="next"` target of a `Link` header (RFC 8288). Targets are
/// read between `<` and `>` first, so a comma inside one (`fields=a,b`)
/// does not split it.
pub fn next_link(header: &str) -> Option<String> {
    let mut rest = header;
    while let Some(open) = rest.find('<') {
        let close = open + rest[open..].find('>')?;
        let target = &rest[open + 1..close];
        let after = &rest[close + 1..];
        let params = &after[..after.find('<').unwrap_or(after.len())];
        let next = params.split([';', ',']).any(|p| {
            p.trim()
                .strip_prefix("rel=")
                .map(|v| v.trim_matches('"').split_ascii_whitespace().any(|r| r.eq_ignore_ascii_case("next")))
                .unwrap_or(false)
        });
        if next {
            return Some(target.to_owned());
        }
        rest = &after[params.len()..];
    }
    None
}

/// Whether a parent value is `.` or `..` in any spelling (`%2e`): a path
/// segment that would walk up to another endpoint.
pub fn dot_segment(value: &str) -> bool {
    let decoded = value.to_ascii_lowercase().replace("%2e", ".");
    decoded == "." || decoded == ".."
}

/// `https://host[:port]` of an `https` URL, read as the host reads it
/// (the default port names the same origin as none); none otherwise.
pub fn origin(url: &str) -> Option<String> {
    connector_sdk::origin::origin(url)
}

/// `link` made absolute against `current`.
fn resolve(current: &str, link: &str) -> String {
    let lower = link.to_ascii_lowercase();
    if lower.starts_with("https://") || lower.starts_with("http://") || lower.contains("://") {
        return link.to_owned();
    }
    if let Some(rest) = link.strip_prefix("//") {
        return format!("https://{rest}");
    }
    let Some(home) = origin(current) else { return link.to_owned() };
    if link.starts_with('/') {
        return format!("{home}{link}");
    }
    let without_query = current.split(['?', '#']).next().unwrap_or(current);
    if link.starts_with('?') {
        return format!("{without_query}{link}");
    }
    let directory = match without_query[home.len()..].rfind('/') {
        Some(at) => &without_query[..home.len() + at + 1],
        None => without_query,
    };
    format!("{directory}{link}")
}

/// `url` with `query` appended, percent-encoded.
fn with_query(url: &str, query: &[(String, String)]) -> String {
    let mut out = url.to_owned();
    for (i, (key, value)) in query.iter().enumerate() {
        out.push(if i == 0 && !url.contains('?') { '?' } else { '&' });
        out.push_str(&encode(key));
        out.push('=');
        out.push_str(&encode(value));
    }
    out
}

/// `url` with parameter `key` set to `value` (replaced, or appended).
fn replace_param(url: &str, key: &str, value: &str) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let encoded_key = encode(key);
    let mut pairs: Vec<String> = query.split('&').filter(|p| !p.is_empty()).map(str::to_owned).collect();
    let pair = format!("{encoded_key}={}", encode(value));
    match pairs.iter_mut().find(|p| p.split('=').next() == Some(encoded_key.as_str())) {
        Some(existing) => *existing = pair,
        None => pairs.push(pair),
    }
    format!("{base}?{}", pairs.join("&"))
}

/// Percent-encodes all but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_headers_are_read_as_github_sends_them() {
        let header = r#"<https://api.github.com/repositories/1/issues?page=2>; rel="next", <https://api.github.com/repositories/1/issues?page=9>; rel="last""#;
        assert_eq!(next_link(header).unwrap(), "https://api.github.com/repositories/1/issues?page=2");
        assert_eq!(next_link(r#"<https://x/a?page=1>; rel="prev first""#), None);
        assert_eq!(next_link(r#"</a?page=3>; rel="prev next""#).unwrap(), "/a?page=3");
        let commas =
            r#"<https://h/a?fields=id,title&page=1>; rel="prev", <https://h/a?fields=id,title&page=3>; rel="next""#;
        assert_eq!(next_link(commas).unwrap(), "https://h/a?fields=id,title&page=3");
        assert_eq!(next_link("<https://h/a?page=2>; rel=\"last\""), None);
    }

    #[test]
    fn dot_segments_are_caught_however_spelled() {
        for value in [".", "..", "%2e", "%2E%2e", ".%2E"] {
            assert!(dot_segment(value), "{value}");
        }
        for value in ["...", "a..", ".hidden", "1.5"] {
            assert!(!dot_segment(value), "{value}");
        }
    }

    #[test]
    fn links_resolve_against_the_page_they_came_from() {
        let current = "https://api.example.com/v1/items?page=1";
        assert_eq!(resolve(current, "/v1/items?page=2"), "https://api.example.com/v1/items?page=2");
        assert_eq!(resolve(current, "?page=2"), "https://api.example.com/v1/items?page=2");
        assert_eq!(resolve(current, "other?page=2"), "https://api.example.com/v1/other?page=2");
        assert_eq!(resolve(current, "//evil.example/x"), "https://evil.example/x");
        assert_eq!(origin("https://API.example.com:8443/x"), Some("https://api.example.com:8443".into()));
        assert_eq!(origin("http://api.example.com/x"), None);
        assert_eq!(origin("https://API.example.com:443/x"), Some("https://api.example.com".into()));
        assert_eq!(origin("https://[::1]:443/x"), Some("https://[::1]".into()));
    }

    #[test]
    fn parameters_are_encoded_and_replaced_in_place() {
        let url = with_query("https://h/p", &[("q".into(), "a b&c".into()), ("page".into(), "1".into())]);
        assert_eq!(url, "https://h/p?q=a%20b%26c&page=1");
        assert_eq!(replace_param(&url, "page", "2"), "https://h/p?q=a%20b%26c&page=2");
        assert_eq!(replace_param("https://h/p", "cursor", "x/y"), "https://h/p?cursor=x%2Fy");
    }
}
