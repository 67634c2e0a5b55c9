//! Evaluates templates for the differential check against Airbyte's CDK
//! (`tests/python/airbyte_interpolation.py`): one JSON object per input
//! line, `{"template", "context": {name: value}, "now": RFC 3339}`, and per
//! line out `{"value": …, "text": …}` (the value as JSON and as Python's
//! `str()`) or `{"error": kind}`.

use std::io::{BufRead, Write};

use declarative::interpolation::{Context, InterpolationError, Template, Val};
use serde_json::{Value, json};

fn main() {
    let stdin = std::io::stdin();
    let mut out = std::io::BufWriter::new(std::io::stdout());
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let answer = match serde_json::from_str::<Value>(&line) {
            Ok(input) => evaluate(&input),
            Err(e) => json!({ "error": "input", "message": e.to_string() }),
        };
        let _ = writeln!(out, "{answer}");
    }
}

fn evaluate(input: &Value) -> Value {
    let Some(now) = input["now"].as_str().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()) else {
        return json!({ "error": "input", "message": "now is not an RFC 3339 instant" });
    };
    let mut ctx = Context::at(now.with_timezone(&chrono::Utc));
    for (name, value) in input["context"].as_object().into_iter().flatten() {
        ctx = ctx.with(name, Val::from(value));
    }
    let result = Template::parse(input["template"].as_str().unwrap_or_default()).and_then(|t| t.eval(&ctx));
    match result {
        Ok(v) => json!({ "value": v.to_json(), "text": v.to_text(), "type": v.type_name() }),
        Err(e) => json!({ "error": match e {
            InterpolationError::Syntax(_) => "syntax",
            InterpolationError::Unsupported(_) => "unsupported",
            InterpolationError::Evaluation(_) | InterpolationError::Undefined(_) | InterpolationError::Type(_) => {
                "evaluation"
            }
        }, "message": e.to_string() }),
    }
}
