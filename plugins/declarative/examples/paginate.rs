//! Next page tokens for the corpus harness (`tests/python/airbyte_paginate.py`):
//! one JSON object per input line, `{"strategy": component, "config",
//! "parameters", "page": {"response", "link", "last_record",
//! "last_page_size", "last_token"}, "now"}`, and per line out
//! `{"token": …}`, `{"initial": …}` beside it, or `{"error": …}`.

use std::io::{BufRead, Write};

use declarative::interpolation::Val;
use declarative::paginate::{Page, Strategy, links};
use serde_json::{Value, json};

fn main() {
    let mut out = std::io::BufWriter::new(std::io::stdout());
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let answer =
            serde_json::from_str::<Value>(&line).map_or_else(|e| json!({ "error": e.to_string() }), |i| next(&i));
        let _ = writeln!(out, "{answer}");
    }
}

fn next(input: &Value) -> Value {
    let Some(now) = input["now"].as_str().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()) else {
        return json!({ "error": "now is not an RFC 3339 instant" });
    };
    let now = now.with_timezone(&chrono::Utc);
    let config = Val::from(&input["config"]);
    let strategy = match Strategy::from_component(&input["strategy"], &config, now) {
        Ok(s) => s,
        Err(e) => return json!({ "error": e.to_string() }),
    };
    let p = &input["page"];
    let mut headers = vec![("content-type".to_owned(), Val::Str("application/json".into()))];
    headers.push(("link".to_owned(), links(p["link"].as_str().unwrap_or_default())));
    let page = Page {
        response: Val::from(&p["response"]),
        headers: Val::Dict(headers),
        last_record: Val::from(&p["last_record"]),
        last_page_size: p["last_page_size"].as_i64().unwrap_or(0),
        last_token: (!p["last_token"].is_null()).then(|| Val::from(&p["last_token"])),
        stream_slice: Val::Dict(Vec::new()),
    };
    match strategy.next_token(&page, &config, &Val::from(&input["parameters"]), now) {
        Ok(token) => {
            json!({ "token": token.map(|t| t.to_json()), "initial": strategy.initial_token().map(|t| t.to_json()) })
        }
        Err(e) => json!({ "error": e.to_string() }),
    }
}
