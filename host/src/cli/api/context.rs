//! What every API command runs with: the signed-in client (workspace,
//! proposal mode) and the printer; and the three shapes of a command:
//! list a page, show one record, write and say what happened.

use reqwest::Method;
use serde_json::Value;

use super::render::{Column, Printer};
use crate::cli::client::{ApiClient, CliFailure};

/// The options of list commands.
#[derive(Debug, Clone, clap::Args)]
pub struct Page {
    /// How many items to show (1–200).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=200))]
    pub limit: Option<u16>,
    /// Where to continue: the cursor a previous page ended with.
    #[arg(long)]
    pub cursor: Option<String>,
}

impl Page {
    /// The page's query parameters.
    pub fn query(&self) -> Vec<(&'static str, String)> {
        let mut q = Vec::new();
        if let Some(l) = self.limit {
            q.push(("limit", l.to_string()));
        }
        if let Some(c) = &self.cursor {
            q.push(("cursor", c.clone()));
        }
        q
    }

    /// The page's query parameters and the filters given.
    pub fn with(&self, filters: Vec<(&'static str, Option<String>)>) -> Vec<(&'static str, String)> {
        let mut q = self.query();
        q.extend(filters.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))));
        q
    }
}

/// The client and the printer of one command.
pub(crate) struct Ctx {
    pub client: ApiClient,
    pub out: Printer,
}

impl Ctx {
    /// `GET path` with `query`, shown as a table.
    pub(crate) async fn list(
        &self,
        path: &str,
        query: &[(&str, String)],
        columns: &[Column<'_>],
    ) -> Result<(), CliFailure> {
        let answer = self.client.send(Method::GET, path, query, None).await?;
        self.out.list(&answer.data, columns);
        Ok(())
    }

    /// `GET path`, shown as a record.
    pub(crate) async fn show(&self, path: &str) -> Result<(), CliFailure> {
        let data = self.client.call(Method::GET, path, None).await?;
        self.out.record(&data);
        Ok(())
    }

    /// A write; `done` says what happened when it ran (else the proposal
    /// is shown). Returns the answer's `data` when it ran.
    pub(crate) async fn write(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        done: impl FnOnce(&Value) -> String,
    ) -> Result<Option<Value>, CliFailure> {
        // Every write carries a body: the API takes `{}` where it needs none.
        let body = body.unwrap_or_else(|| Value::Object(Default::default()));
        let send_body = if method == Method::DELETE { None } else { Some(&body) };
        let answer = self.client.send(method, path, &[], send_body).await?;
        self.out.write(&answer, done);
        Ok(answer.proposal().is_none().then_some(answer.data))
    }
}

/// A path segment from a user-given id, escaped so it stays one segment.
/// `.` and `..` (which URLs resolve as steps, escaped or not) become ids
/// no record has, so they reach no other route.
pub(crate) fn seg(id: &str) -> String {
    let escaped = url::form_urlencoded::byte_serialize(id.as_bytes()).collect::<String>().replace('+', "%20");
    if id.is_empty() || id.chars().all(|c| c == '.') { format!("~{escaped}") } else { escaped }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_stay_one_segment() {
        let base = url::Url::parse("http://h/v1/").unwrap();
        for id in ["..", ".", "", "a/b", "../x", "%2e%2e", "a b", "?q", "#f"] {
            let url = base.join(&format!("sessions/{}/revoke", seg(id))).unwrap();
            assert!(url.path().starts_with("/v1/sessions/") && url.path().ends_with("/revoke"), "{id}: {url}");
            assert_eq!(url.path().matches('/').count(), 4, "{id}: {url}");
        }
    }
}
