//! The provider's REST API, as this connector uses it.
//!
//! Every request goes to `{base_url}{path}` with the credential handle
//! attached as `Authorization: Bearer` (by the host; the plugin never sees
//! the token) and `Accept: application/json` (the SDK's default). Nothing
//! else in the crate builds URLs.
//!
//! | call | request |
//! |---|---|
//! | [`Api::current_user`] | `GET /user` |
//! | [`Api::list`] | `GET /campaigns`, `/email-lists`, `/email-lists/{uuid}/subscribers` with `per_page` and `page` |
//! | [`Api::recent_sent_campaigns`] | `GET /campaigns?filter[status]=sent&sort=-sent&per_page=N` |
//! | [`Api::find_subscriber`] | `GET /email-lists/{uuid}/subscribers?filter[email]=...` |
//! | [`Api::create_subscriber`] | `POST /email-lists/{uuid}/subscribers` |
//! | [`Api::update_subscriber`] | `PATCH /subscribers/{uuid}` |
//! | [`Api::delete_subscriber`] | `DELETE /subscribers/{uuid}` |
//!
//! # Errors and retries
//!
//! Reads use the SDK's [`RequestBuilder::send`]: 429 and transient 5xx are
//! retried with bounded backoff (honouring `Retry-After`), then 401 becomes
//! `invalid-credentials`, 403 `permission-denied`, 429 `rate-limited` (with
//! the provider's `Retry-After`), 5xx `provider-unavailable` and any other
//! 4xx `provider-error`.
//!
//! Writes need to see *which* 4xx the provider answered (a 422 is one bad
//! record, a 404 is a wrong list), which `send` folds into an error message.
//! [`send_keeping_client_errors`] therefore makes the first attempt itself,
//! hands plain 4xx answers back to the caller, and leaves everything worth
//! retrying to `send`'s bounded retry.
//!
//! # Pagination
//!
//! Lists are Laravel paginators: `{"data": [...], "links": {..., "next"},
//! "meta": {"current_page", "last_page", "per_page", "total"}}`. The plugin
//! asks for numbered pages itself instead of following `links.next`, because
//! Laravel builds those links without the other query parameters unless the
//! application asks it to, and page 2 would then silently come with another
//! page size and order. See [`has_more_pages`] for when a list ends.
//!
//! Once a page has said which page is the last (`meta.last_page`), the
//! next [`AHEAD`] pages are requested before that page is handed over
//! (`http-ahead`), so the provider's latency overlaps the host's work
//! instead of adding to it. Without a known last page the list is read one
//! page at a time. A page that ends the list early cancels the requests
//! started beyond it.

use std::collections::VecDeque;
use std::ops::Range;

use connector_sdk::{
    Error, Http, HttpError, Method, Pending, Placement, RequestBuilder, Response, Result, Retry, Value, log,
};

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::config::{Config, is_path_safe_id};

/// Records per page for reads (the provider's maximum page size is larger;
/// 100 keeps responses well under the host's size limit).
pub const PER_PAGE: u32 = 100;

/// A backstop against a provider that ignores `page` and never ends a list.
const MAX_PAGES: u32 = 100_000;

/// Pages requested ahead of the one being handed over, at most (and at
/// most what the host allows pending).
pub const AHEAD: u32 = 3;

/// The provider's API at one base URL, used with one credential handle.
#[derive(Debug, Clone)]
pub struct Api {
    /// `https://<host>/.../api`, no trailing slash.
    base: String,
    /// The credential handle from the config.
    credential: String,
}

/// The token owner, as `GET /user` describes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The account's email address, if the provider says.
    pub email: Option<String>,
    /// The account's numeric or string id, if the provider says.
    pub id: Option<String>,
}

/// One page of a list.
#[derive(Debug, Clone)]
pub struct ListPage {
    /// The page number requested (from 1).
    pub number: u32,
    /// The page's records, cut out of its body; see [`ListPage::records`].
    records: PageRecords,
    /// `meta.last_page`, when the provider sent it (for progress logs).
    pub last_page: Option<u64>,
}

impl ListPage {
    /// The records of the page, as the provider sent them: their JSON
    /// text, neither parsed nor copied, so records passed through are never
    /// rebuilt.
    pub fn records(&self) -> impl ExactSizeIterator<Item = &str> {
        self.records.iter()
    }
}

/// A list page's body and where each of its records lies in it. The body
/// is parsed once, as text, and the records stay in it: cutting them out
/// as values of their own would copy every byte again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PageRecords {
    body: String,
    spans: Vec<Range<usize>>,
}

impl PageRecords {
    fn iter(&self) -> impl ExactSizeIterator<Item = &str> {
        self.spans.iter().map(|span| &self.body[span.clone()])
    }

    fn len(&self) -> usize {
        self.spans.len()
    }

    fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }
}

/// The provider's answer to a subscriber create, update or delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteAnswer {
    /// The provider accepted the record.
    Accepted,
    /// The provider refused the record with a 4xx (validation, conflict,
    /// unknown subscriber).
    Refused {
        /// The HTTP status.
        status: u16,
        /// The fields the provider's validation errors name (names only,
        /// never values), at most a handful.
        fields: Vec<String>,
    },
}

impl Api {
    /// The API of a config, after checking the config.
    pub fn new(config: &Config) -> Result<Self> {
        Ok(Self { base: config.api_base()?, credential: config.credential()?.to_owned() })
    }

    /// A request to `{base}{path}` carrying the credential.
    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        Http::request(method, format!("{}{path}", self.base)).credential(self.credential.clone(), Placement::Bearer)
    }

    /// `GET /user`: who the token belongs to. This is the access check.
    pub fn current_user(&self) -> Result<User> {
        let body: Value = self.request(Method::Get, "/user").send()?.json()?;
        let user = body
            .get("data")
            .filter(|d| d.is_object())
            .ok_or_else(|| Error::ProviderError("GET /user answered without a `data` object".into()))?;
        let text = |value: Option<&Value>| match value? {
            Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_owned()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        };
        Ok(User { email: text(user.get("email")), id: text(user.get("id")) })
    }

    /// The pages of the list at `path`, `query` added to every request
    /// before `per_page` and `page`. Lazy: each page is fetched when the
    /// iterator reaches it, so a read can emit and checkpoint in between.
    pub fn list(&self, path: &str, query: &[(&str, &str)]) -> ListPages {
        let mut template = self.request(Method::Get, path);
        for (key, value) in query {
            template = template.query(key, value);
        }
        ListPages {
            template: template.query("per_page", PER_PAGE),
            path: path.to_owned(),
            next: Some(1),
            ahead: VecDeque::new(),
            ahead_allowed: None,
        }
    }

    /// The `limit` campaigns sent most recently, newest first (one request).
    pub fn recent_sent_campaigns(&self, limit: u32) -> Result<Vec<Value>> {
        let body: Value = self
            .request(Method::Get, "/campaigns")
            .query("filter[status]", "sent")
            .query("sort", "-sent")
            .query("per_page", limit)
            .send()?
            .json()?;
        let mut campaigns = records_of(body, "/campaigns", 1)?;
        campaigns.truncate(limit as usize);
        Ok(campaigns)
    }

    /// The uuids of every email list the token can see.
    pub fn all_email_list_uuids(&self) -> Result<Vec<String>> {
        let mut uuids = Vec::new();
        let mut unusable = 0;
        for page in self.list("/email-lists", &[]) {
            for list in page?.records() {
                let list: Value = serde_json::from_str(list).unwrap_or(Value::Null);
                match list.get("uuid").and_then(Value::as_str) {
                    Some(uuid) if is_path_safe_id(uuid) => uuids.push(uuid.to_owned()),
                    _ => unusable += 1,
                }
            }
        }
        if unusable > 0 {
            log::warn(format_args!("{unusable} email lists have no usable uuid; their subscribers are not read"));
        }
        Ok(uuids)
    }

    /// The uuid of the subscriber of `list` with exactly this email address,
    /// if there is one.
    pub fn find_subscriber(&self, list: &str, email: &str) -> Result<Option<String>> {
        let request = self.request(Method::Get, &subscribers_path(list)?).query("filter[email]", email);
        let response = send_keeping_client_errors(Method::Get, request)?;
        match response.status() {
            404 => return Err(unknown_list(list)),
            status if status >= 400 => {
                return Err(Error::ProviderError(format!(
                    "HTTP {status} when looking up a subscriber of an email list"
                )));
            }
            _ => {}
        }
        let records = records_of(response.json()?, "/email-lists/{uuid}/subscribers", 1)?;
        // The filter is an exact match, but a provider that treats it as a
        // search must not make the plugin update somebody else.
        Ok(records
            .iter()
            .filter(|s| {
                s.get("email").and_then(Value::as_str).is_some_and(|e| e.trim().eq_ignore_ascii_case(email.trim()))
            })
            .find_map(|s| s.get("uuid").and_then(Value::as_str).map(str::to_owned)))
    }

    /// `POST /email-lists/{list}/subscribers` with `body`. An unknown list
    /// is `invalid-config`: it comes from `email_list_uuids`.
    pub fn create_subscriber(&self, list: &str, body: &Value) -> Result<WriteAnswer> {
        let request = self.request(Method::Post, &subscribers_path(list)?).json(body);
        match write_answer(send_keeping_client_errors(Method::Post, request)?) {
            WriteAnswer::Refused { status: 404, .. } => Err(unknown_list(list)),
            answer => Ok(answer),
        }
    }

    /// `PATCH /subscribers/{uuid}` with `body`. A 404 (no such subscriber)
    /// is a [`WriteAnswer::Refused`] for the caller to act on.
    pub fn update_subscriber(&self, uuid: &str, body: &Value) -> Result<WriteAnswer> {
        if !is_path_safe_id(uuid) {
            return Ok(WriteAnswer::Refused { status: 404, fields: vec!["uuid".into()] });
        }
        let request = self.request(Method::Patch, &format!("/subscribers/{uuid}")).json(body);
        Ok(write_answer(send_keeping_client_errors(Method::Patch, request)?))
    }

    /// `DELETE /subscribers/{uuid}`. A 404 (no such subscriber) is a
    /// [`WriteAnswer::Refused`] for the caller to act on, also when it
    /// answers a retry: an earlier attempt may have deleted the subscriber.
    /// A uuid that is not a plain path segment is a `provider-error`, not a
    /// 404, because for a delete a 404 means "already gone".
    pub fn delete_subscriber(&self, uuid: &str) -> Result<WriteAnswer> {
        if !is_path_safe_id(uuid) {
            return Err(Error::ProviderError("a subscriber uuid is not a plain path segment".into()));
        }
        let request = self.request(Method::Delete, &format!("/subscribers/{uuid}"));
        match send_keeping_client_errors(Method::Delete, request) {
            Ok(response) => Ok(write_answer(response)),
            // `send` turns a 4xx after a retry into "HTTP <status> from ...".
            Err(Error::ProviderError(message)) if message.starts_with("HTTP 404 ") => {
                Ok(WriteAnswer::Refused { status: 404, fields: Vec::new() })
            }
            Err(error) => Err(error),
        }
    }
}

/// `/email-lists/{list}/subscribers`, refusing a uuid that is not a plain
/// path segment.
pub fn subscribers_path(list: &str) -> Result<String> {
    if !is_path_safe_id(list) {
        return Err(Error::InvalidConfig("email_list_uuids: not an email list uuid".into()));
    }
    Ok(format!("/email-lists/{list}/subscribers"))
}

fn unknown_list(list: &str) -> Error {
    Error::InvalidConfig(format!(
        "email_list_uuids: the provider has no email list {list} (or the token cannot see it)"
    ))
}

/// The lazily fetched pages of one list; see [`Api::list`].
#[derive(Debug)]
pub struct ListPages {
    /// The request for any page, without `page`.
    template: RequestBuilder,
    /// The list's path, for messages (no query: it may hold personal data).
    path: String,
    /// The next page to hand over; `None` once the list has ended or failed.
    next: Option<u32>,
    /// Pages after `next` already requested, in order.
    ahead: VecDeque<(u32, Pending)>,
    /// How many pages may be requested ahead, once asked of the host.
    ahead_allowed: Option<u32>,
}

impl ListPages {
    fn request(&self, number: u32) -> RequestBuilder {
        self.template.clone().query("page", number)
    }

    /// Page `number`: the answer to its request started ahead, or a
    /// request made now.
    fn fetch(&mut self, number: u32) -> Result<Response> {
        match self.ahead.pop_front() {
            Some((n, pending)) if n == number => pending.finish(),
            _ => {
                self.ahead.clear();
                self.request(number).send()
            }
        }
    }

    /// Requests the pages after `number` up to `last`, keeping
    /// `ahead_allowed` on their way. A refusal to start one is no error:
    /// the page is then requested when it is due.
    fn start_ahead(&mut self, number: u32, last: u64) {
        let allowed = *self.ahead_allowed.get_or_insert_with(|| AHEAD.min(Pending::max()));
        let mut page = self.ahead.back().map_or(number, |(n, _)| *n) + 1;
        while (self.ahead.len() as u32) < allowed && u64::from(page) <= last && page <= MAX_PAGES {
            match self.request(page).start() {
                Ok(pending) => self.ahead.push_back((page, pending)),
                Err(_) => return,
            }
            page += 1;
        }
    }
}

impl Iterator for ListPages {
    type Item = Result<ListPage>;

    fn next(&mut self) -> Option<Self::Item> {
        let number = self.next.take()?;
        let fetched = self
            .fetch(number)
            .and_then(|response| response.into_text())
            .and_then(|body| parse_page(body, &self.path, number));
        let (records, pagination) = match fetched {
            Ok(page) => page,
            Err(e) => {
                self.ahead.clear();
                return Some(Err(e));
            }
        };
        let more = has_more_pages(number, PER_PAGE, &pagination, records.len());
        let last_page = pagination.pointer("/meta/last_page").and_then(as_page_number);
        let more = more && !records.is_empty();
        if more && number >= MAX_PAGES {
            self.ahead.clear();
            return Some(Err(Error::ProviderError(format!("{} did not end after {MAX_PAGES} pages", self.path))));
        }
        match (more, last_page) {
            (true, Some(last)) => self.start_ahead(number, last),
            (true, None) => {}
            (false, _) => self.ahead.clear(),
        }
        self.next = more.then_some(number + 1);
        Some(Ok(ListPage { number, records, last_page }))
    }
}

/// Whether a list goes on after page `current`, judged from that page's
/// pagination (`meta`, `links`) and its number of records: `meta.last_page`
/// when the provider sends it, else whether `links.next` is a link, else
/// whether the page was full. A page without
/// records always ends the list (checked by the caller).
pub fn has_more_pages(current: u32, per_page: u32, body: &Value, records: usize) -> bool {
    if let Some(last) = body.pointer("/meta/last_page").and_then(as_page_number) {
        return u64::from(current) < last;
    }
    match body.pointer("/links/next") {
        Some(Value::String(link)) => !link.is_empty(),
        Some(_) => false,
        None => records >= per_page as usize,
    }
}

fn as_page_number(value: &Value) -> Option<u64> {
    value.as_u64().or_else(|| value.as_str().and_then(|s| s.trim().parse().ok()))
}

/// The `data` array of a list response (`null` counts as empty).
fn records_of(body: Value, path: &str, page: u32) -> Result<Vec<Value>> {
    match body {
        Value::Object(mut object) => match object.remove("data") {
            Some(Value::Array(records)) => Ok(records),
            Some(Value::Null) => Ok(Vec::new()),
            _ => Err(no_data(path, page)),
        },
        _ => Err(no_data(path, page)),
    }
}

/// A list page's records and its pagination (`meta` and `links`), in one
/// pass over its body, without building the records.
fn parse_page(body: String, path: &str, page: u32) -> Result<(PageRecords, Value)> {
    #[derive(Deserialize)]
    struct Page<'a> {
        /// Missing: not a list response; `null`: an empty page.
        #[serde(borrow, default, deserialize_with = "present")]
        data: Option<Option<Vec<&'a RawValue>>>,
        #[serde(default)]
        meta: Value,
        #[serde(default)]
        links: Value,
    }
    fn present<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<Option<Option<Vec<&'de RawValue>>>, D::Error> {
        Option::deserialize(d).map(Some)
    }
    let (spans, pagination) = match serde_json::from_str::<Page>(&body) {
        Ok(Page { data: Some(records), meta, links }) => {
            let start = body.as_ptr().addr();
            let spans = records
                .unwrap_or_default()
                .iter()
                .map(|record| {
                    // Each record borrows from `body`: its offset in it.
                    let at = record.get().as_ptr().addr() - start;
                    debug_assert!(
                        body.get(at..at + record.get().len()) == Some(record.get()),
                        "a record borrowed from its page"
                    );
                    at..at + record.get().len()
                })
                .collect();
            (spans, serde_json::json!({ "meta": meta, "links": links }))
        }
        // Not an object, or `data` missing or not an array: not a list
        // response. A body that is not JSON at all says where it breaks
        // (never what it holds).
        Ok(Page { data: None, .. }) => return Err(no_data(path, page)),
        Err(e) if e.is_data() => return Err(no_data(path, page)),
        Err(e) => {
            return Err(Error::ProviderError(format!(
                "page {page} of {path} is not JSON (line {}, column {})",
                e.line(),
                e.column()
            )));
        }
    };
    Ok((PageRecords { body, spans }, pagination))
}

fn no_data(path: &str, page: u32) -> Error {
    Error::ProviderError(format!("page {page} of {path} is not a list response (no `data` array)"))
}

/// What a create or update answer means for the record.
fn write_answer(response: Response) -> WriteAnswer {
    if response.is_success() {
        return WriteAnswer::Accepted;
    }
    WriteAnswer::Refused {
        status: response.status(),
        fields: serde_json::from_slice::<Value>(response.body()).map(|body| invalid_fields(&body)).unwrap_or_default(),
    }
}

/// The field names of a Laravel validation error body
/// (`{"message": ..., "errors": {"email": [...]}}`). Only names that look
/// like field names are kept, and never the messages, which may quote the
/// submitted values.
pub fn invalid_fields(body: &Value) -> Vec<String> {
    let Some(errors) = body.get("errors").and_then(Value::as_object) else {
        return Vec::new();
    };
    errors
        .keys()
        .filter(|name| {
            !name.is_empty()
                && name.len() <= 40
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
        })
        .take(5)
        .cloned()
        .collect()
}

/// Sends `request` and returns the provider's answer even when it is a
/// client error, so the caller can tell a 404 from a 422. Only what no
/// caller can handle per record becomes an error: 401, 403, a rate limit
/// that outlasts the retries, 5xx and transport failures.
///
/// The first attempt is made here. If it is worth retrying (429 for any
/// method; 408, 5xx, timeouts and connection failures only for idempotent
/// methods, so a create is never repeated after the provider may have acted
/// on it), the request is handed to the SDK's bounded retry
/// ([`RequestBuilder::send`]), after first waiting out a short `Retry-After`.
pub fn send_keeping_client_errors(method: Method, request: RequestBuilder) -> Result<Response> {
    let policy = Retry::default();
    match request.clone().send_raw() {
        Ok(response) => match response.status() {
            429 => {
                let wait = response.retry_after().unwrap_or(policy.first_backoff);
                if wait > policy.max_total_wait {
                    // Too long to wait inside this call: say when to retry.
                    return response.error_for_status();
                }
                std::thread::sleep(wait);
            }
            401 | 403 => return response.error_for_status(),
            408 | 500..=599 if !method.is_idempotent() => return response.error_for_status(),
            408 | 500..=599 => {}
            _ => return Ok(response),
        },
        Err(HttpError::Timeout | HttpError::ConnectionFailed(_)) if method.is_idempotent() => {}
        Err(e) => return Err(e.into()),
    }
    request.send()
}

#[cfg(test)]
mod tests {
    use super::*;
    use connector_sdk::json;

    /// The records of a test body, as the page parser counts them.
    fn count(body: &Value) -> usize {
        body.get("data").and_then(Value::as_array).map_or(0, Vec::len)
    }

    fn api() -> Api {
        let config: Config = serde_json::from_value(json!({
            "base_url": "https://news.example.com/api/",
            "credential_handle": "cred_42"
        }))
        .unwrap();
        Api::new(&config).unwrap()
    }

    #[test]
    fn list_requests_carry_page_size_and_page_after_the_streams_own_query() {
        let pages = api().list("/campaigns", &[("sort", "-sent")]);
        assert_eq!(
            pages.template.clone().query("page", 1).url(),
            "https://news.example.com/api/campaigns?sort=-sent&per_page=100&page=1"
        );
    }

    #[test]
    fn query_brackets_are_percent_encoded() {
        let url = api().request(Method::Get, "/campaigns").query("filter[status]", "sent").url().to_owned();
        assert_eq!(url, "https://news.example.com/api/campaigns?filter%5Bstatus%5D=sent");
    }

    #[test]
    fn a_list_ends_at_meta_last_page() {
        let body = json!({ "data": [{}], "meta": { "current_page": 2, "last_page": 3 }, "links": { "next": null } });
        assert!(has_more_pages(2, 100, &body, count(&body)));
        assert!(!has_more_pages(3, 100, &body, count(&body)));
    }

    #[test]
    fn without_meta_a_list_follows_whether_links_next_is_set() {
        let more = json!({ "data": [{}], "links": { "next": "https://x/api/campaigns?page=2" } });
        let done = json!({ "data": [{}], "links": { "next": null } });
        assert!(has_more_pages(1, 100, &more, count(&more)));
        assert!(!has_more_pages(1, 100, &done, count(&done)));
    }

    #[test]
    fn without_any_pagination_data_a_full_page_means_more() {
        let full = json!({ "data": vec![json!({}); 3] });
        let short = json!({ "data": [{}] });
        assert!(has_more_pages(1, 3, &full, count(&full)));
        assert!(!has_more_pages(1, 3, &short, count(&short)));
        // As the page parser hands it over: pagination without the records.
        let parsed = json!({ "meta": null, "links": null });
        assert!(has_more_pages(1, 3, &parsed, 3), "a full page without pagination data means more");
        assert!(!has_more_pages(1, 3, &parsed, 2));
    }

    #[test]
    fn a_page_is_parsed_once_and_its_records_are_their_own_text() {
        let body = r#"{"links": {"next": null}, "data": [ {"id":1,"s":"a\"b","n":{"x":[1, 2]}} ,{"é":"ü"},7, null ], "meta": {"last_page": 3}}"#;
        let (records, pagination) = parse_page(body.to_owned(), "/campaigns", 2).unwrap();
        assert_eq!(
            records.iter().collect::<Vec<_>>(),
            [r#"{"id":1,"s":"a\"b","n":{"x":[1, 2]}}"#, r#"{"é":"ü"}"#, "7", "null"]
        );
        assert_eq!(pagination, json!({ "meta": { "last_page": 3 }, "links": { "next": null } }));
        let (records, pagination) = parse_page(r#"{"data": null}"#.to_owned(), "/x", 1).unwrap();
        assert_eq!(records.len(), 0, "a null page is empty");
        assert_eq!(pagination, json!({ "meta": null, "links": null }));
    }

    #[test]
    fn a_page_without_a_data_array_is_no_list_and_one_that_is_not_json_says_where() {
        for body in [r#"{"meta": {}}"#, r#"{"data": {}}"#, r#"{"data": "x"}"#, "[]", "3", r#"{"data": [], "data": []}"#]
        {
            let err = parse_page(body.to_owned(), "/x", 4).unwrap_err().to_string();
            assert!(err.contains("page 4 of /x is not a list response"), "{body}: {err}");
        }
        for body in [r#"{"data": [{"email": "alice@example.com""#, r#"{"data": [{"email": alice}]}"#, ""] {
            let err = parse_page(body.to_owned(), "/x", 4).unwrap_err().to_string();
            assert!(err.contains("page 4 of /x is not JSON (line 1, column"), "{body}: {err}");
            assert!(!err.contains("alice"), "no provider value in the message: {err}");
        }
    }

    #[test]
    fn list_data_must_be_an_array_or_null() {
        assert_eq!(records_of(json!({ "data": null }), "/x", 1).unwrap(), Vec::<Value>::new());
        assert_eq!(records_of(json!({ "data": [1] }), "/x", 1).unwrap(), vec![json!(1)]);
        assert!(matches!(records_of(json!({ "data": {} }), "/x", 1), Err(Error::ProviderError(_))));
        assert!(matches!(records_of(json!([]), "/x", 1), Err(Error::ProviderError(_))));
    }

    #[test]
    fn validation_errors_give_field_names_never_messages() {
        let body = json!({
            "message": "The email alice@example.com has already been taken.",
            "errors": {
                "email": ["The email alice@example.com has already been taken."],
                "extra_attributes.plan": ["invalid"],
                "<script>": ["x"]
            }
        });
        assert_eq!(invalid_fields(&body), ["email", "extra_attributes.plan"]);
        assert!(invalid_fields(&json!({ "message": "no" })).is_empty());
    }

    #[test]
    fn subscriber_paths_refuse_anything_but_a_plain_id() {
        assert_eq!(subscribers_path("845b334b-90de").unwrap(), "/email-lists/845b334b-90de/subscribers");
        for bad in ["", "a/b", "a?b", "..", "a b"] {
            assert!(subscribers_path(bad).is_err(), "{bad}");
        }
    }
}
