//! Resolves a manifest (JSON on standard input) as the CDK does before
//! building it: references, then default types and `$parameters`; prints
//! the result, or `{"error": …}`. For the corpus harness
//! (`tests/python/airbyte_interpolation.py --resolve`).

use std::io::Read;

use serde_json::{Value, json};

fn main() {
    let mut text = String::new();
    let answer = match std::io::stdin()
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())
        .and_then(|_| serde_json::from_str::<Value>(&text).map_err(|e| e.to_string()))
    {
        Err(e) => json!({ "error": e }),
        Ok(manifest) => match declarative::resolve::references(&manifest) {
            Ok(resolved) => declarative::resolve::propagate(&resolved),
            Err(e) => json!({ "error": e.to_string() }),
        },
    };
    println!("{answer}");
}
