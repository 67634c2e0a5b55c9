//! Paginated list endpoints, fetched one page at a time.
//!
//! [`RequestBuilder::paginate`] turns the request for the first page into an
//! iterator of [`Page`]s. Nothing is fetched until the iterator is advanced,
//! so a read can emit and checkpoint each page before asking for the next:
//!
//! ```no_run
//! use connector_sdk::{Http, Pagination, Result, Sink};
//! # fn f() -> Result<()> {
//! for page in Http::get("https://api.example.com/campaigns").paginate(Pagination::laravel()) {
//!     let page = page?;
//!     Sink::emit("campaigns", &page.records)?;
//! }
//! # Ok(()) }
//! ```

use serde_json::Value;

use crate::http::{RequestBuilder, origin};
use crate::types::{Error, Result};

/// How a list endpoint says where the next page is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pagination {
    /// Each page holds the URL of the next one at this JSON pointer; a null,
    /// empty or missing link ends the list. Relative links are resolved
    /// against the first request's origin; links to another origin are
    /// refused, so a provider cannot steer requests elsewhere.
    NextLink {
        /// A JSON pointer such as `/links/next`.
        pointer: String,
    },
    /// Pages are numbered: the query parameter `param` counts up from
    /// `first`, and the first page without records ends the list.
    PageNumber {
        /// The query parameter, for example `page`.
        param: String,
        /// The number of the first page, usually 1.
        first: u32,
    },
}

impl Pagination {
    /// Laravel's paginator: records in `data`, next page at `links.next`.
    /// Remember [`Pages::records_at`] defaults to `/data`, which fits.
    pub fn laravel() -> Self {
        Self::next_link("/links/next")
    }

    /// Follows the next-page URL found at a JSON pointer.
    pub fn next_link(pointer: &str) -> Self {
        Pagination::NextLink { pointer: pointer.to_owned() }
    }

    /// Counts pages with a query parameter, starting at 1.
    pub fn page_number(param: &str) -> Self {
        Pagination::PageNumber { param: param.to_owned(), first: 1 }
    }
}

/// One page of a list.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// The page's position, counting from 1 for the first page fetched.
    pub number: u32,
    /// The records found on the page.
    pub records: Vec<Value>,
    /// The rest of the response (pagination metadata and the like); the
    /// records have been moved out of it.
    pub body: Value,
}

/// The pages of a list, fetched lazily. Created by
/// [`RequestBuilder::paginate`]. After an error the iterator ends.
#[derive(Debug)]
pub struct Pages {
    template: RequestBuilder,
    pagination: Pagination,
    records_at: String,
    /// The next request to make; `None` once the list is exhausted.
    next: Option<RequestBuilder>,
    fetched: u32,
}

impl RequestBuilder {
    /// Iterates over the pages of a list, this request fetching the first.
    pub fn paginate(self, pagination: Pagination) -> Pages {
        let first = match &pagination {
            Pagination::NextLink { .. } => self.clone(),
            Pagination::PageNumber { param, first } => self.clone().query(param, first),
        };
        Pages { template: self, pagination, records_at: "/data".to_owned(), next: Some(first), fetched: 0 }
    }
}

impl Pages {
    /// Where the records are in each response, as a JSON pointer: `/data`
    /// by default, `""` when the response is the array itself.
    pub fn records_at(mut self, pointer: &str) -> Self {
        self.records_at = pointer.to_owned();
        self
    }

    fn fetch(&mut self, request: RequestBuilder) -> Result<Page> {
        let current_url = request.url().to_owned();
        let mut body: Value = request.send()?.json()?;
        self.fetched += 1;
        let records = match body.pointer_mut(&self.records_at).map(Value::take) {
            Some(Value::Array(records)) => records,
            Some(Value::Null) => Vec::new(),
            _ => {
                return Err(Error::ProviderError(format!(
                    "page {} has no list of records at `{}`",
                    self.fetched, self.records_at
                )));
            }
        };
        self.next = match &self.pagination {
            Pagination::NextLink { pointer } => match body.pointer(pointer) {
                Some(Value::String(link)) if !link.is_empty() => {
                    let url = self.resolve_link(link)?;
                    // A provider repeating the same link would loop forever.
                    (url != current_url).then(|| {
                        let mut next = self.template.clone();
                        next.url = url;
                        next
                    })
                }
                _ => None,
            },
            Pagination::PageNumber { param, first } => {
                (!records.is_empty()).then(|| self.template.clone().query(param, first.saturating_add(self.fetched)))
            }
        };
        Ok(Page { number: self.fetched, records, body })
    }

    /// Makes a next-page link absolute and checks it stays on the origin of
    /// the first request.
    fn resolve_link(&self, link: &str) -> Result<String> {
        let home = origin(self.template.url()).unwrap_or_default();
        let url =
            if link.starts_with('/') && !link.starts_with("//") { format!("{home}{link}") } else { link.to_owned() };
        if origin(&url).as_deref() == Some(home.as_str()) {
            Ok(url)
        } else {
            Err(Error::ProviderError(format!("the next-page link leaves {home}; not followed")))
        }
    }
}

impl Iterator for Pages {
    type Item = Result<Page>;

    fn next(&mut self) -> Option<Self::Item> {
        let request = self.next.take()?;
        Some(self.fetch(request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Http;

    fn pages(pagination: Pagination) -> Pages {
        Http::get("https://api.example.com/campaigns?sort=-sent").paginate(pagination)
    }

    #[test]
    fn page_numbers_start_at_the_first_page() {
        let pages = pages(Pagination::page_number("page"));
        assert_eq!(pages.next.as_ref().unwrap().url(), "https://api.example.com/campaigns?sort=-sent&page=1");
    }

    #[test]
    fn relative_links_resolve_against_the_origin() {
        let pages = pages(Pagination::laravel());
        assert_eq!(pages.resolve_link("/campaigns?page=2").unwrap(), "https://api.example.com/campaigns?page=2");
        assert_eq!(
            pages.resolve_link("https://API.example.com/campaigns?page=2").unwrap(),
            "https://API.example.com/campaigns?page=2"
        );
    }

    #[test]
    fn links_to_another_origin_are_refused() {
        let pages = pages(Pagination::laravel());
        for link in ["https://evil.example/campaigns?page=2", "//evil.example/x", "http://api.example.com/x"] {
            assert!(matches!(pages.resolve_link(link), Err(Error::ProviderError(_))), "{link}");
        }
    }
}
