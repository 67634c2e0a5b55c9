//! Selects records for the corpus harness (`tests/python/airbyte_extract.py`):
//! one JSON object per input line, `{"body", "path": [segments]}`, and per
//! line out `{"records": […]}`: the body as the page's text, as the
//! runtime reads it.

use std::io::{BufRead, Write};

use serde_json::{Value, json};

fn main() {
    let mut out = std::io::BufWriter::new(std::io::stdout());
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let answer = match serde_json::from_str::<Value>(&line) {
            Ok(input) => {
                let path: Vec<String> = input["path"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|s| s.as_str().unwrap_or_default().to_owned())
                    .collect();
                let page = input["body"].to_string();
                json!({ "records": declarative::extract::records(&page, &path) })
            }
            Err(e) => json!({ "error": e.to_string() }),
        };
        let _ = writeln!(out, "{answer}");
    }
}
