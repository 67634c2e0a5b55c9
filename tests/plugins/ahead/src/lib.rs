//! A plugin that starts requests with `http-ahead` (interface 1.1.0) and
//! reports what became of them, so the host's tests can check that a
//! started request is policed exactly like a sent one, that the number
//! pending is capped, and that dropping a request cancels it.
//!
//! `preview` takes `{"requests": [{"url": ..., "credential": handle?}],
//! "finish": true}`: it starts every request in order, then finishes them
//! in order (or, with `"finish": false`, drops them all and then starts
//! and drops them all once more, so the second round shows that dropped
//! requests no longer count as pending) and answers
//! `{"max": n, "results": [...]}`, one result per request: `{"status",
//! "body"}`, `{"error": {"kind", "message"}}` for a failed one, or
//! `{"refused": {"kind", "message"}}` for one `start` refused.

use connector_sdk::{
    Connector, ConnectorInfo, Http, HttpError, Operation, Pending, Placement, Result, Value, export_connector, json,
};
use serde::Deserialize;

#[derive(Deserialize)]
struct Config {
    requests: Vec<Request>,
    #[serde(default = "finish_by_default")]
    finish: bool,
}

fn finish_by_default() -> bool {
    true
}

#[derive(Deserialize)]
struct Request {
    url: String,
    #[serde(default)]
    credential: Option<String>,
}

struct Ahead;

impl Connector for Ahead {
    type Config = Config;

    fn describe() -> ConnectorInfo {
        ConnectorInfo::source("test_ahead", "Requests-ahead test plugin", env!("CARGO_PKG_VERSION"))
            .with_operations([Operation::Preview])
            .with_hosts(["api.provider.test", "echo.provider.test"])
    }

    fn preview(config: Config) -> Result<Value> {
        let start_all = || -> Vec<std::result::Result<Pending, HttpError>> {
            config
                .requests
                .iter()
                .map(|r| {
                    let mut request = Http::get(&r.url);
                    if let Some(handle) = &r.credential {
                        request = request.credential(handle, Placement::Bearer);
                    }
                    request.start()
                })
                .collect()
        };
        let started = start_all();
        let results: Vec<Value> = if config.finish {
            started
                .into_iter()
                .map(|s| match s {
                    Err(e) => json!({ "refused": kind(&e) }),
                    Ok(pending) => match pending.finish_raw() {
                        Ok(response) => json!({ "status": response.status(), "body": response.text() }),
                        Err(e) => json!({ "error": kind(&e) }),
                    },
                })
                .collect()
        } else {
            let drop_all = |started: Vec<std::result::Result<Pending, HttpError>>| {
                started.into_iter().map(|s| match s {
                    Err(e) => json!({ "refused": kind(&e) }),
                    Ok(pending) => {
                        drop(pending);
                        json!({ "dropped": true })
                    }
                })
            };
            let mut results: Vec<Value> = drop_all(started).collect();
            results.extend(drop_all(start_all()));
            results
        };
        Ok(json!({ "max": Pending::max(), "results": results }))
    }
}

fn kind(e: &HttpError) -> Value {
    let (kind, message) = match e {
        HttpError::Denied(m) => ("denied", m.clone()),
        HttpError::InvalidRequest(m) => ("invalid-request", m.clone()),
        HttpError::Timeout => ("timeout", String::new()),
        HttpError::ConnectionFailed(m) => ("connection-failed", m.clone()),
        HttpError::ResponseTooLarge => ("response-too-large", String::new()),
        HttpError::CredentialUnavailable(m) => ("credential-unavailable", m.clone()),
    };
    json!({ "kind": kind, "message": message })
}

export_connector!(Ahead);
