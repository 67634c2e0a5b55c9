//! Evaluates templates for the differential check against Airbyte's CDK
//! (`tests/python/airbyte_interpolation.py`): one JSON object per input
//! line, `{"template", "context": {name: value}, "now": RFC 3339}` (read
//! as values, so objects keep their keys' order), and per line out
//! `{"value": …, "text": …}` (the value as JSON and as Python's `str()`)
//! or `{"error": kind}`.

use std::io::{BufRead, Write};

use declarative::interpolation::{Context, InterpolationError, Template, Val};
use serde_json::{Value, json};

fn main() {
    let stdin = std::io::stdin();
    let mut out = std::io::BufWriter::new(std::io::stdout());
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let answer = match serde_json::from_str::<Val>(&line) {
            Ok(input) => evaluate(&input),
            Err(e) => json!({ "error": "input", "message": e.to_string() }),
        };
        let _ = writeln!(out, "{answer}");
    }
}

fn evaluate(input: &Val) -> Value {
    let now = match input.get("now") {
        Some(Val::Str(t)) => chrono::DateTime::parse_from_rfc3339(t).ok(),
        _ => None,
    };
    let Some(now) = now else {
        return json!({ "error": "input", "message": "now is not an RFC 3339 instant" });
    };
    let mut ctx = Context::at(now.with_timezone(&chrono::Utc));
    if let Some(Val::Dict(entries)) = input.get("context") {
        for (name, value) in entries {
            ctx = ctx.with(name, value.clone());
        }
    }
    let template = match input.get("template") {
        Some(Val::Str(t)) => t.as_str(),
        _ => "",
    };
    match Template::parse(template).and_then(|t| t.eval(&ctx)) {
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
