//! Every write route of the published OpenAPI description, with a request
//! body built from its schema: for attacks that must hold on every route
//! (text in any script, the proposal header), so a route added later is
//! covered without anyone remembering to.

use serde_json::{Map, Value, json};

/// One write operation of the description.
#[derive(Debug, Clone)]
pub struct WriteRoute {
    pub method: reqwest::Method,
    /// The path under the server root, path parameters filled in.
    pub path: String,
    /// A body its schema allows, or none.
    pub body: Option<Value>,
}

/// The write routes of `doc`, with every path parameter set to
/// `path_value` and every string of every body to a value from `text`
/// (taken in turn).
pub fn write_routes(doc: &Value, path_value: &str, text: &[&str]) -> Vec<WriteRoute> {
    let components = doc["components"]["schemas"].as_object().cloned().unwrap_or_default();
    let mut routes = Vec::new();
    let mut turn = 0usize;
    for (path, item) in doc["paths"].as_object().into_iter().flatten() {
        for (method, op) in item.as_object().into_iter().flatten() {
            let method = match method.as_str() {
                "post" => reqwest::Method::POST,
                "patch" => reqwest::Method::PATCH,
                "put" => reqwest::Method::PUT,
                "delete" => reqwest::Method::DELETE,
                _ => continue,
            };
            let mut filled = path.clone();
            for p in op["parameters"].as_array().into_iter().flatten() {
                if p["in"] == "path" {
                    let name = p["name"].as_str().unwrap_or_default();
                    let encoded: String = url::form_urlencoded::byte_serialize(path_value.as_bytes()).collect();
                    filled = filled.replace(&format!("{{{name}}}"), &encoded);
                }
            }
            let schema = &op["requestBody"]["content"]["application/json"]["schema"];
            let body = (!schema.is_null()).then(|| sample(schema, &components, text, &mut turn, 0));
            routes.push(WriteRoute { method, path: filled, body });
        }
    }
    routes
}

/// A value `schema` allows, strings from `text`.
fn sample(schema: &Value, components: &Map<String, Value>, text: &[&str], turn: &mut usize, depth: usize) -> Value {
    if depth > 8 {
        return Value::Null;
    }
    if let Some(name) = schema["$ref"].as_str().and_then(|r| r.strip_prefix("#/components/schemas/")) {
        return components.get(name).map(|s| sample(s, components, text, turn, depth + 1)).unwrap_or(Value::Null);
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(first) = schema[key].as_array().and_then(|a| a.iter().find(|s| s["type"] != "null")) {
            return sample(first, components, text, turn, depth + 1);
        }
    }
    if let Some(first) = schema["enum"].as_array().and_then(|e| e.first()) {
        return first.clone();
    }
    let ty = match &schema["type"] {
        Value::Array(types) => types.iter().find(|t| *t != "null").cloned().unwrap_or(Value::Null),
        other => other.clone(),
    };
    match ty.as_str() {
        Some("string") => {
            *turn += 1;
            json!(text[*turn % text.len()])
        }
        Some("integer") => json!(schema["minimum"].as_i64().unwrap_or(1).max(1)),
        Some("number") => json!(1.5),
        Some("boolean") => json!(true),
        Some("array") => json!([sample(&schema["items"], components, text, turn, depth + 1)]),
        _ => {
            let mut out = Map::new();
            for (k, v) in schema["properties"].as_object().into_iter().flatten() {
                out.insert(k.clone(), sample(v, components, text, turn, depth + 1));
            }
            Value::Object(out)
        }
    }
}
