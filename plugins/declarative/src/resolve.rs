//! A manifest as the CDK reads it before building anything: references
//! replaced by what they name ([`references`]), then each component's
//! default type filled in from where it sits and `$parameters` handed
//! down to the components below ([`propagate`]). The same rules, in the
//! same order, as airbyte-cdk's `ManifestReferenceResolver` and
//! `ManifestComponentTransformer`, so a manifest means here what it means
//! there (the corpus harness compares both on every manifest).

use serde_json::{Map, Value};

/// Why references cannot be resolved. Names the reference, never a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveError {
    /// A reference that leads back to itself.
    Circular(String),
    /// A reference to nothing.
    Undefined(String),
}

impl std::fmt::Display for ResolveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResolveError::Circular(r) => write!(f, "the reference {r} leads back to itself"),
            ResolveError::Undefined(r) => write!(f, "the reference {r} names nothing in the manifest"),
        }
    }
}

impl std::error::Error for ResolveError {}

const REF: &str = "$ref";
const PARAMETERS: &str = "$parameters";
/// Fields holding configuration values rather than components: a string
/// there that looks like a reference is not one.
const CONFIG_VALUES: &[&str] = &["config_overrides"];

/// `manifest` with every `$ref` (and every string `#/…`) replaced by what
/// it names; a `$ref` beside other keys is the base they override.
pub fn references(manifest: &Value) -> Result<Value, ResolveError> {
    let mut visiting = Vec::new();
    node(manifest, manifest, &mut visiting)
}

fn node(value: &Value, manifest: &Value, visiting: &mut Vec<String>) -> Result<Value, ResolveError> {
    match value {
        Value::Object(map) => {
            let mut own = Map::new();
            for (k, v) in map.iter().filter(|(k, _)| *k != REF) {
                let evaluated =
                    if CONFIG_VALUES.contains(&k.as_str()) { v.clone() } else { node(v, manifest, visiting)? };
                own.insert(k.clone(), evaluated);
            }
            let Some(reference) = map.get(REF) else { return Ok(Value::Object(own)) };
            match node(reference, manifest, visiting)? {
                Value::Object(mut base) => {
                    for (k, v) in own {
                        base.insert(k, v);
                    }
                    Ok(Value::Object(base))
                }
                other => Ok(other),
            }
        }
        Value::Array(items) => {
            items.iter().map(|v| node(v, manifest, visiting)).collect::<Result<_, _>>().map(Value::Array)
        }
        Value::String(s) if s.starts_with("#/") => {
            if visiting.contains(s) {
                return Err(ResolveError::Circular(s.clone()));
            }
            visiting.push(s.clone());
            let target = lookup(&s[2..], manifest).ok_or_else(|| ResolveError::Undefined(s.clone()))?;
            let resolved = node(target, manifest, visiting);
            visiting.pop();
            resolved
        }
        other => Ok(other.clone()),
    }
}

/// The value at `path` (`a/b/0/c`), a key holding `/` itself found first
/// at each level, as the CDK reads it.
fn lookup<'a>(mut path: &str, mut at: &'a Value) -> Option<&'a Value> {
    while !path.is_empty() {
        if let Value::Object(map) = at
            && let Some(found) = map.get(path)
        {
            return Some(found);
        }
        let (head, rest) = path.split_once('/').unwrap_or((path, ""));
        // A number is an index (from the end when negative), and no key.
        at = match (at, head.parse::<i64>()) {
            (Value::Array(items), Ok(i)) => {
                let i = if i < 0 { i + items.len() as i64 } else { i };
                items.get(usize::try_from(i).ok()?)?
            }
            (Value::Object(map), Err(_)) => map.get(head)?,
            _ => return None,
        };
        path = rest;
    }
    Some(at)
}

/// The type a component without one has where it sits
/// (`<parent type>.<field>`), as the CDK's `DEFAULT_MODEL_TYPES`.
fn default_type(at: &str) -> Option<&'static str> {
    Some(match at {
        "CompositeErrorHandler.error_handlers" => "DefaultErrorHandler",
        "CursorPagination.decoder" | "DefaultPaginator.decoder" | "DpathExtractor.decoder" => "JsonDecoder",
        "DatetimeBasedCursor.end_datetime" | "DatetimeBasedCursor.start_datetime" => "MinMaxDatetime",
        "DatetimeBasedCursor.end_time_option"
        | "DatetimeBasedCursor.start_time_option"
        | "DefaultPaginator.page_size_option"
        | "ListPartitionRouter.request_option"
        | "ParentStreamConfig.request_option" => "RequestOption",
        "DeclarativeSource.check" => "CheckStream",
        "DeclarativeSource.spec" => "Spec",
        "DeclarativeSource.streams" | "DynamicDeclarativeStream.stream_template" | "ParentStreamConfig.stream" => {
            "DeclarativeStream"
        }
        "DeclarativeStream.retriever" | "HttpComponentsResolver.retriever" | "DynamicSchemaLoader.retriever" => {
            "SimpleRetriever"
        }
        "DeclarativeStream.schema_loader" => "JsonFileSchemaLoader",
        "DynamicDeclarativeStream.components_resolver" => "ConfigComponentResolver",
        "HttpComponentsResolver.components_mapping" | "ConfigComponentsResolver.components_mapping" => {
            "ComponentMappingDefinition"
        }
        "ConfigComponentsResolver.stream_config" => "StreamConfig",
        "DefaultErrorHandler.response_filters" => "HttpResponseFilter",
        "DpathExtractor.record_expander" => "RecordExpander",
        "HttpRequester.error_handler" => "DefaultErrorHandler",
        "RecordExpander.parent_fields" => "ParentFieldPath",
        "RecordSelector.extractor" => "DpathExtractor",
        "RecordSelector.record_filter" => "RecordFilter",
        "SimpleRetriever.paginator" => "NoPagination",
        "SimpleRetriever.record_selector" => "RecordSelector",
        "SimpleRetriever.requester" => "HttpRequester",
        "SubstreamPartitionRouter.parent_stream_configs" | "CustomPartitionRouter.parent_stream_configs" => {
            "ParentStreamConfig"
        }
        "AddFields.fields" => "AddedFieldDefinition",
        "SchemaTypeIdentifier.types_map" => "TypesMap",
        _ => return None,
    })
}

/// The custom type a component naming a `class_name` has where it sits.
fn custom_type(at: &str) -> Option<&'static str> {
    Some(match at {
        "CompositeErrorHandler.backoff_strategies" | "DefaultErrorHandler.backoff_strategies" => {
            "CustomBackoffStrategy"
        }
        "DeclarativeStream.retriever" => "CustomRetriever",
        "DeclarativeStream.transformations" => "CustomTransformation",
        "DefaultPaginator.pagination_strategy" => "CustomPaginationStrategy",
        "HttpRequester.authenticator" => "CustomAuthenticator",
        "HttpRequester.error_handler" => "CustomErrorHandler",
        "RecordSelector.extractor" => "CustomRecordExtractor",
        "SimpleRetriever.partition_router" => "CustomPartitionRouter",
        _ => return None,
    })
}

/// Python's truthiness of a JSON value.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// The resolved manifest with default types filled in and `$parameters`
/// handed down: the CDK's `propagate_types_and_parameters("", manifest, {})`.
pub fn propagate(manifest: &Value) -> Value {
    match manifest {
        Value::Object(map) => Value::Object(component("", map, &Map::new())),
        other => other.clone(),
    }
}

fn component(at: &str, given: &Map<String, Value>, parent: &Map<String, Value>) -> Map<String, Value> {
    let mut c = given.clone();
    if !c.contains_key("type") {
        let found = if c.contains_key("class_name") { custom_type(at) } else { default_type(at) };
        if let Some(found) = found {
            c.insert("type".into(), Value::String(found.into()));
        }
    }
    let mut current = parent.clone();
    if let Some(Value::Object(own)) = c.remove(PARAMETERS) {
        for (k, v) in own {
            current.insert(k, v);
        }
    }
    // A JSON schema is not a component.
    if matches!(c.get("type"), Some(Value::String(t)) if t == "object")
        || matches!(c.get("type"), Some(Value::Array(_) | Value::Object(_)))
    {
        return c;
    }
    if !c.contains_key("type") {
        let nested: Vec<String> = c
            .iter()
            .filter(|(_, v)| v.as_object().is_some_and(|o| o.get("type").is_some_and(truthy)))
            .map(|(k, _)| k.clone())
            .collect();
        for k in nested {
            if let Some(Value::Object(inner)) = c.get(&k) {
                let done = component(at, inner, &current);
                c.insert(k, Value::Object(done));
            }
        }
        return c;
    }
    for (k, v) in &current {
        if !c.get(k).is_some_and(truthy) {
            c.insert(k.clone(), v.clone());
        }
    }
    let kind = match c.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let fields: Vec<String> = c.keys().cloned().collect();
    for field in fields {
        let child_at = format!("{kind}.{field}");
        match c.get(&field) {
            Some(Value::Object(inner)) => {
                let excluded = current.remove(&field);
                let done = component(&child_at, inner, &current);
                c.insert(field.clone(), Value::Object(done));
                if let Some(v) = excluded.filter(truthy) {
                    current.insert(field, v);
                }
            }
            Some(Value::Array(items)) => {
                let excluded = current.remove(&field);
                let done: Vec<Value> = items
                    .iter()
                    .map(|item| match item {
                        Value::Object(inner) => Value::Object(component(&child_at, inner, &current)),
                        other => other.clone(),
                    })
                    .collect();
                c.insert(field.clone(), Value::Array(done));
                if let Some(v) = excluded.filter(truthy) {
                    current.insert(field, v);
                }
            }
            _ => {}
        }
    }
    if !current.is_empty() {
        c.insert(PARAMETERS.into(), Value::Object(current));
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn references_resolve_with_local_keys_overriding() {
        let m = json!({
            "definitions": { "base": { "type": "HttpRequester", "url_base": "https://a", "http_method": "GET" },
                "nested/path": "slash key", "nested": { "path": "deep" }, "list": [{ "x": 1 }] },
            "one": { "$ref": "#/definitions/base", "http_method": "POST" },
            "two": "#/definitions/nested/path",
            "three": "#/definitions/list/0/x",
        });
        let r = references(&m).unwrap();
        assert_eq!(r["one"], json!({ "type": "HttpRequester", "url_base": "https://a", "http_method": "POST" }));
        assert_eq!(r["two"], "slash key");
        assert_eq!(r["three"], 1);
        let circular = json!({ "a": "#/b", "b": "#/a" });
        assert!(matches!(references(&circular), Err(ResolveError::Circular(_))));
        assert!(matches!(references(&json!({ "a": "#/nowhere" })), Err(ResolveError::Undefined(_))));
        let kept = json!({ "config_overrides": { "x": "#/not/a/ref" } });
        assert_eq!(references(&kept).unwrap(), kept);
    }

    #[test]
    fn parameters_flow_down_and_types_fill_in() {
        let m = json!({ "type": "DeclarativeSource", "streams": [{
            "$parameters": { "name": "users", "path": "/users", "primary_key": "id" },
            "retriever": { "requester": { "url_base": "https://api", "path": "" },
                "record_selector": { "extractor": { "field_path": ["data"] } } },
            "schema_loader": { "type": "InlineSchemaLoader", "schema": { "type": "object", "$parameters": { "x": 1 } } } }] });
        let p = propagate(&m);
        let stream = &p["streams"][0];
        assert_eq!(stream["type"], "DeclarativeStream");
        assert_eq!(stream["name"], "users");
        assert_eq!(stream["retriever"]["type"], "SimpleRetriever");
        assert_eq!(stream["retriever"]["requester"]["type"], "HttpRequester");
        // An empty value is replaced by the parameter's, as the CDK does.
        assert_eq!(stream["retriever"]["requester"]["path"], "/users");
        assert_eq!(stream["retriever"]["record_selector"]["extractor"]["type"], "DpathExtractor");
        assert_eq!(stream["retriever"]["$parameters"]["name"], "users");
        // A JSON schema takes no parameters and keeps none.
        assert_eq!(stream["schema_loader"]["schema"], json!({ "type": "object" }));
    }
}
