//! A manifest's components read into types, as the CDK's factory builds
//! them from the resolved manifest ([`crate::resolve`]): every component
//! and every field that does something is either understood here or
//! refused with its JSON pointer ([`Refusal`]) — never ignored.
//!
//! # Layout
//!
//! | module | holds |
//! |---|---|
//! | [`node`] | reading one component: type, fields, templates, refusals |
//! | [`request`] | requester, request options, bodies, authenticators, error handlers |
//! | [`record`] | record selector, filter, transformations |
//! | [`partition`] | list and substream partition routers |
//! | [`cursor`] | the incremental cursor (`DatetimeBasedCursor`) |
//! | [`budget`] | the source's `api_budget` (`HTTPAPIBudget`) and its policies |
//! | this file | the source, its streams, retrievers and paginators |

pub mod budget;
pub mod cursor;
pub mod node;
pub mod partition;
pub mod record;
pub mod request;

use chrono::{DateTime, Utc};
use serde_json::Value;

use budget::Budget;
use cursor::DatetimeCursor;
use node::Node;
pub use node::Refusal;
use partition::Router;
use record::{Selector, Transformation};
use request::{RequestOption, Requester, TokenOption};

use crate::interpolation::{Context, Val};
use crate::paginate::Strategy;

/// A manifest ready to run: its streams, the streams its check reads, and
/// its spec's connection specification.
#[derive(Debug, Clone, PartialEq)]
pub struct Source {
    pub streams: Vec<Stream>,
    pub check_streams: Vec<String>,
    pub spec: Value,
    /// Its `api_budget`, if it has one.
    pub budget: Option<Budget>,
}

/// A `DeclarativeStream`.
#[derive(Debug, Clone, PartialEq)]
pub struct Stream {
    pub name: String,
    pub pointer: String,
    /// Each key a path of field names (the CDK's three spellings read as one).
    pub primary_key: Vec<Vec<String>>,
    pub schema: Value,
    /// The schema file a `JsonFileSchemaLoader` reads (the CDK's default
    /// loader where the manifest names none), as a path inside the
    /// connector's package (`schemas/users.json`): a schema the source's
    /// configuration may give. Without it, [`Stream::schema`] is open.
    pub schema_file: Option<String>,
    pub retriever: Retriever,
    pub transformations: Vec<Transformation>,
    /// Its `incremental_sync`, if it has one.
    pub cursor: Option<DatetimeCursor>,
}

/// A `SimpleRetriever`.
#[derive(Debug, Clone, PartialEq)]
pub struct Retriever {
    pub requester: Requester,
    pub selector: Selector,
    pub paginator: Option<Paginator>,
    pub routers: Vec<Router>,
    /// Whether `partition_router` is a list (the CDK's cartesian product,
    /// even of one), which keeps no parent state.
    pub routers_listed: bool,
    pub ignore_routers_on_paginated_requests: bool,
}

/// A `DefaultPaginator`.
#[derive(Debug, Clone, PartialEq)]
pub struct Paginator {
    pub strategy: Strategy,
    pub token_option: Option<TokenOption>,
    pub size_option: Option<RequestOption>,
    pub parameters: Val,
}

impl Source {
    /// The source a manifest describes, read with `config` (the
    /// non-secret configuration: some components read it once, as the CDK
    /// does when it builds them) at `now`.
    pub fn read(manifest: &Value, config: &Val, now: DateTime<Utc>) -> Result<Source, Refusal> {
        // Manifests need not say their type at the top; the CDK adds it.
        let mut manifest = manifest.clone();
        if let Value::Object(top) = &mut manifest
            && !top.contains_key("type")
        {
            top.insert("type".into(), Value::String("DeclarativeSource".into()));
        }
        let resolved = crate::resolve::references(&manifest).map_err(|e| Refusal::new("", e.to_string()))?;
        let resolved = crate::resolve::propagate(&resolved);
        let root = Node::at(&resolved, "")?;
        let kind = root.kind();
        root.expect(&[kind], &["dynamic_streams"])?;
        let budget = root.child("api_budget").transpose()?.map(|b| Budget::read(&b, config, now)).transpose()?;
        let streams: Vec<Stream> =
            root.children("streams")?.iter().map(|s| read_stream(s, config, now)).collect::<Result<_, _>>()?;
        if streams.is_empty() {
            return Err(Refusal::new("/streams", "the manifest declares no stream"));
        }
        let check_streams = match root.child("check").transpose()? {
            None => Vec::new(),
            Some(check) => {
                check.expect(&["CheckStream"], &["dynamic_streams_check_configs"])?;
                record::strings(&check, "stream_names")?
            }
        };
        Ok(Source { streams, check_streams, spec: connection_specification(&resolved), budget })
    }

    /// The connection specification of a manifest (its spec's), read
    /// without reading its streams.
    pub fn spec(manifest: &Value) -> Result<Value, Refusal> {
        let resolved = crate::resolve::references(manifest).map_err(|e| Refusal::new("", e.to_string()))?;
        Ok(connection_specification(&resolved))
    }

    /// The stream named `name`.
    pub fn stream(&self, name: &str) -> Option<&Stream> {
        self.streams.iter().find(|s| s.name == name)
    }
}

fn connection_specification(resolved: &Value) -> Value {
    resolved
        .get("spec")
        .and_then(|s| s.get("connection_specification"))
        .cloned()
        .unwrap_or_else(|| serde_json::json!({ "type": "object" }))
}

pub(crate) fn read_stream(node: &Node, config: &Val, now: DateTime<Utc>) -> Result<Stream, Refusal> {
    node.expect(&["DeclarativeStream"], &["state_migrations", "file_uploader"])?;
    let name = node.text("name")?.unwrap_or_default().to_owned();
    if name.is_empty() {
        return Err(Refusal::new(node.pointer(), "a stream needs a name"));
    }
    let primary_key = match node.get("primary_key") {
        None => Vec::new(),
        Some(Value::String(s)) if s.is_empty() => Vec::new(),
        Some(Value::String(s)) => vec![vec![s.clone()]],
        Some(Value::Array(keys)) => keys
            .iter()
            .map(|k| match k {
                Value::String(s) => Ok(vec![s.clone()]),
                Value::Array(path) => Ok(path.iter().map(|p| p.as_str().unwrap_or_default().to_owned()).collect()),
                _ => Err(Refusal::new(node.below("primary_key"), "expected field names")),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(Refusal::new(node.below("primary_key"), "expected field names")),
    };
    let open_schema = || serde_json::json!({ "type": "object", "$schema": "http://json-schema.org/draft-07/schema#", "properties": {} });
    let (schema, schema_file) = match node.child("schema_loader").transpose()? {
        None => (open_schema(), Some(format!("schemas/{name}.json"))),
        Some(loader) => match loader.kind() {
            "InlineSchemaLoader" => {
                loader.expect(&["InlineSchemaLoader"], &[])?;
                (loader.get("schema").cloned().unwrap_or_else(|| serde_json::json!({})), None)
            }
            "JsonFileSchemaLoader" => {
                loader.expect(&["JsonFileSchemaLoader"], &[])?;
                let file = match loader.template("file_path")?.filter(|t| !t.source().is_empty()) {
                    None => format!("schemas/{name}.json"),
                    Some(t) => {
                        let ctx = crate::interpolation::Context::at(now)
                            .with("config", config.clone())
                            .with("parameters", loader.parameters_val());
                        let path = t
                            .eval_string(&ctx)
                            .map_err(|e| Refusal::new(loader.below("file_path"), format!("cannot be evaluated: {e}")))?
                            .to_text();
                        package_path(&path)
                    }
                };
                (open_schema(), Some(file))
            }
            _ => return Err(loader.unsupported_type()),
        },
    };
    let retriever =
        node.child("retriever").ok_or_else(|| Refusal::new(node.pointer(), "a stream needs a retriever"))??;
    let retriever = read_retriever(&retriever, config, now)?;
    let transformations =
        node.children("transformations")?.iter().map(Transformation::read).collect::<Result<_, _>>()?;
    let cursor =
        node.child("incremental_sync").transpose()?.map(|c| DatetimeCursor::read(&c, config, now)).transpose()?;
    Ok(Stream {
        name,
        pointer: node.pointer().to_owned(),
        primary_key,
        schema,
        schema_file,
        retriever,
        transformations,
        cursor,
    })
}

/// A schema file's path inside its package, as the CDK's
/// `extract_resource_and_schema_path` splits it
/// (`./source_x/schemas/users.json` is `schemas/users.json`).
fn package_path(path: &str) -> String {
    let mut parts: Vec<&str> = path.split('/').collect();
    if matches!(parts.first(), Some(&"" | &".")) {
        parts.remove(0);
    }
    if parts.len() >= 2 {
        parts.remove(0);
    }
    parts.join("/")
}

fn read_retriever(node: &Node, config: &Val, now: DateTime<Utc>) -> Result<Retriever, Refusal> {
    node.expect(&["SimpleRetriever"], &["page_size_reduction", "pagination_reset", "request_window_splitting"])?;
    if let Some(decoder) = node.child("decoder").transpose()? {
        decoder.expect(&["JsonDecoder"], &[])?;
    }
    let requester =
        node.child("requester").ok_or_else(|| Refusal::new(node.pointer(), "a retriever needs a requester"))??;
    let requester = Requester::read(&requester, config)?;
    let selector = node
        .child("record_selector")
        .ok_or_else(|| Refusal::new(node.pointer(), "a retriever needs a record_selector"))??;
    let selector = Selector::read(&selector)?;
    let paginator = match node.child("paginator").transpose()? {
        None => None,
        Some(p) if p.kind() == "NoPagination" => {
            p.expect(&["NoPagination"], &[])?;
            None
        }
        Some(p) => Some(read_paginator(&p, config, now)?),
    };
    let routers = Router::read_all(node, config, &Context::at(now))?;
    Ok(Retriever {
        requester,
        selector,
        paginator,
        routers,
        routers_listed: matches!(node.get("partition_router"), Some(Value::Array(_))),
        ignore_routers_on_paginated_requests: node.flag("ignore_stream_slicer_parameters_on_paginated_requests")?,
    })
}

fn read_paginator(node: &Node, config: &Val, now: DateTime<Utc>) -> Result<Paginator, Refusal> {
    node.expect(&["DefaultPaginator"], &[])?;
    let strategy = node
        .child("pagination_strategy")
        .ok_or_else(|| Refusal::new(node.pointer(), "a DefaultPaginator needs a pagination_strategy"))??;
    strategy.expect(&["CursorPagination", "PageIncrement", "OffsetIncrement"], &[])?;
    let built = Strategy::from_component(&Value::Object(strategy.fields.clone()), config, now)
        .map_err(|e| Refusal::new(strategy.pointer(), e.to_string()))?;
    let token_option = node.child("page_token_option").transpose()?.map(|o| TokenOption::read(&o)).transpose()?;
    let size_option = node.child("page_size_option").transpose()?.map(|o| RequestOption::read(&o)).transpose()?;
    if size_option.is_some() && !built.has_page_size() {
        return Err(Refusal::new(
            node.below("page_size_option"),
            "page_size_option cannot be set if the pagination strategy has no page_size",
        ));
    }
    if let Some(TokenOption::Option(token)) = &token_option {
        let ctx = Context::at(now).with("config", config.clone());
        request::refuse_clash(
            node.pointer(),
            [("page_size_option", size_option.as_ref()), ("page_token_option", Some(token))],
            &ctx,
        )?;
    }
    Ok(Paginator { strategy: built, token_option, size_option, parameters: node.parameters_val() })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::request::Authenticator;

    fn manifest(authenticator: Value) -> Value {
        json!({ "streams": [{ "type": "DeclarativeStream", "name": "items",
            "retriever": { "type": "SimpleRetriever",
                "requester": { "type": "HttpRequester", "url_base": "https://api.example.com", "path": "/items",
                    "authenticator": authenticator },
                "record_selector": { "type": "RecordSelector",
                    "extractor": { "type": "DpathExtractor", "field_path": [] } } } }] })
    }

    #[test]
    fn a_selective_authenticator_is_the_one_the_configuration_selects() {
        let selective = json!({ "type": "SelectiveAuthenticator", "authenticator_selection_path": ["auth", "kind"],
            "authenticators": {
                "key": { "type": "BearerAuthenticator", "api_token": "{{ config['auth']['token'] }}" },
                "oauth": { "type": "OAuthAuthenticator", "client_id": "x", "client_secret": "y", "refresh_token": "z",
                    "token_refresh_endpoint": "https://api.example.com/token" },
                "password": { "type": "OAuthAuthenticator", "client_id": "x", "client_secret": "y",
                    "grant_type": "password", "token_refresh_endpoint": "https://api.example.com/token" } } });
        let now: DateTime<Utc> = "2024-01-01T00:00:00Z".parse().unwrap();
        let read = |kind: &str| {
            Source::read(&manifest(selective.clone()), &Val::from(&json!({ "auth": { "kind": kind } })), now)
        };
        let source = read("key").unwrap();
        let requester = &source.streams[0].retriever.requester;
        assert!(matches!(requester.authenticator, Authenticator::Bearer { .. }));
        assert_eq!(requester.authenticator_pointer, "/streams/0/retriever/requester/authenticator/authenticators/key");
        // The refresh-token grant, by default.
        let source = read("oauth").unwrap();
        assert!(matches!(
            source.streams[0].retriever.requester.authenticator,
            Authenticator::OAuthClient { refresh_token: Some(_), .. }
        ));
        let refused = read("password").unwrap_err();
        assert_eq!(refused.pointer, "/streams/0/retriever/requester/authenticator/authenticators/password/grant_type");
        assert!(refused.reason.contains("OAuthAuthenticator with the password grant"), "{refused}");
        let refused = read("other").unwrap_err();
        assert!(refused.reason.contains("`other` is not found"), "{refused}");
        let refused = Source::read(&manifest(selective), &Val::from(&json!({})), now).unwrap_err();
        assert!(refused.reason.contains("auth/kind"), "{refused}");
    }

    /// A stream of `manifest` with `paginator` and `incremental_sync`.
    fn paged(paginator: Value, incremental: Value) -> Value {
        let mut m = manifest(json!({ "type": "NoAuth" }));
        m["streams"][0]["retriever"]["paginator"] = paginator;
        if !incremental.is_null() {
            m["streams"][0]["incremental_sync"] = incremental;
        }
        m
    }

    #[test]
    fn a_page_size_and_token_setting_one_key_are_refused_as_the_cdk_refuses_them() {
        let now: DateTime<Utc> = "2024-01-01T00:00:00Z".parse().unwrap();
        let config = Val::from(&json!({ "field": "offset" }));
        let option = |place: &str, field: Value| {
            let mut o = json!({ "type": "RequestOption", "inject_into": place });
            let key = if field.is_array() { "field_path" } else { "field_name" };
            o[key] = field;
            o
        };
        let paginator = |size: Value, token: Value| {
            json!({ "type": "DefaultPaginator", "page_size_option": size, "page_token_option": token,
                "pagination_strategy": { "type": "OffsetIncrement", "page_size": 50 } })
        };
        let read = |m: Value| Source::read(&m, &config, now);
        // The same parameter, once by a template of the configuration.
        let refused = read(paged(
            paginator(
                option("request_parameter", json!("offset")),
                option("request_parameter", json!("{{ config.field }}")),
            ),
            Value::Null,
        ))
        .unwrap_err();
        assert_eq!(refused.pointer, "/streams/0/retriever/paginator");
        assert!(refused.reason.contains("page_size_option and page_token_option both set `offset`"), "{refused}");
        // One path of a JSON body inside another.
        let refused = read(paged(
            paginator(option("body_json", json!(["page", "size"])), option("body_json", json!("page"))),
            Value::Null,
        ))
        .unwrap_err();
        assert!(refused.reason.contains("in the JSON body"), "{refused}");
        // Different keys, or one key in different places, are two options.
        for (size, token) in [
            (option("request_parameter", json!("limit")), option("request_parameter", json!("offset"))),
            (option("header", json!("offset")), option("request_parameter", json!("offset"))),
            (option("body_json", json!(["page", "size"])), option("body_json", json!(["page", "token"]))),
        ] {
            read(paged(paginator(size, token), Value::Null)).unwrap();
        }
        // A cursor's start and end on one key: the CDK builds it (the end's
        // value is sent), and so does this runtime.
        let cursor = json!({ "type": "DatetimeBasedCursor", "cursor_field": "updated", "datetime_format": "%Y-%m-%d",
            "start_datetime": "2023-01-01", "start_time_option": option("request_parameter", json!("since")),
            "end_time_option": option("request_parameter", json!("since")) });
        let m = paged(json!({ "type": "NoPagination" }), cursor);
        let (source, env) = crate::retrieve::prepare(&m, &config, &[], now).unwrap();
        let (_, first) = crate::retrieve::first_requests(&source, &env).remove(0);
        let sent: Vec<_> = first.unwrap().query.into_iter().filter(|(k, _)| k == "since").collect();
        assert_eq!(sent, [("since".to_owned(), "2024-01-01".to_owned())], "the end's value (now), once");
    }

    #[test]
    fn an_option_with_an_empty_field_name_is_refused() {
        let now: DateTime<Utc> = "2024-01-01T00:00:00Z".parse().unwrap();
        let paginator = json!({ "type": "DefaultPaginator",
            "page_size_option": { "type": "RequestOption", "inject_into": "request_parameter", "field_name": "" },
            "pagination_strategy": { "type": "CursorPagination", "cursor_value": "{{ response.next }}", "page_size": 50 } });
        let refused = Source::read(&paged(paginator, Value::Null), &Val::from(&json!({})), now).unwrap_err();
        assert_eq!(refused.pointer, "/streams/0/retriever/paginator/page_size_option");
        assert!(refused.reason.contains("needs one of field_name or field_path"), "{refused}");
    }
}
