//! The MCP server: every operation of the API as a tool, for assistants.
//!
//! Tools are derived from the OpenAPI description of `/v1` (itself
//! generated from the route code), so every operation has a tool and the
//! two cannot drift: the tool `service_<operation>` takes the path and
//! query parameters as arguments and the request body as `body`, with the
//! same JSON Schemas. A call is dispatched as an ordinary API request with
//! the caller's bearer token and `X-Service-Client: mcp`, so it goes through
//! exactly the same authentication, validation, audit and approval gate:
//! writes return approval proposals unless the workspace's policy says
//! otherwise.
//!
//! No tool accepts a raw secret: the operations that do (`POST
//! /credentials`, the email-campaign API token) are left out; assistants use
//! the credential-entry link or OAuth instead.
//!
//! Transports: streamable HTTP at `/mcp` on the server (authenticated with
//! the same bearer tokens), and stdio through `service mcp`, which talks to
//! a running server over HTTP.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Body;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Map, Value, json};

/// Operations whose input carries a raw secret: never tools.
const SECRET_OPERATIONS: &[&str] = &["create_credential", "store_api_token"];

/// Tool names fixed by the specification.
const NAMED_TOOLS: &[(&str, &str)] = &[
    ("start_source_oauth", "service_get_source_oauth_consent_url"),
    ("complete_source_oauth", "service_complete_source_oauth"),
];

/// How one tool maps to an API request.
#[derive(Debug, Clone)]
struct Route {
    method: reqwest::Method,
    /// `/v1/...` with `{name}` placeholders.
    path: String,
    path_params: Vec<String>,
    query_params: Vec<String>,
    body: BodyArgs,
}

/// Where a tool's request body comes from.
#[derive(Debug, Clone)]
enum BodyArgs {
    /// The operation takes none.
    None,
    /// These arguments, side by side with the path and query ones, make
    /// the JSON object sent as the body.
    Fields(Vec<String>),
    /// The argument `body`, as given (a body that is not an object with
    /// named fields, or whose names clash with a path or query parameter).
    Whole,
}

/// The tools and how to run them.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    tools: Vec<Tool>,
    routes: HashMap<String, Route>,
}

/// Rewrites OpenAPI component references into a self-contained schema's
/// `$defs`, collecting the definitions it needs.
fn inline_refs(v: &Value, components: &Map<String, Value>, defs: &mut Map<String, Value>) -> Value {
    match v {
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, val) in m {
                if k == "$ref"
                    && let Some(name) = val.as_str().and_then(|r| r.strip_prefix("#/components/schemas/"))
                {
                    if !defs.contains_key(name)
                        && let Some(def) = components.get(name)
                    {
                        defs.insert(name.to_owned(), Value::Null);
                        let inlined = inline_refs(def, components, defs);
                        defs.insert(name.to_owned(), inlined);
                    }
                    out.insert(k.clone(), json!(format!("#/$defs/{name}")));
                } else {
                    out.insert(k.clone(), inline_refs(val, components, defs));
                }
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| inline_refs(x, components, defs)).collect()),
        other => other.clone(),
    }
}

impl Catalog {
    /// Builds the tools from an OpenAPI document.
    pub(crate) fn from_openapi(doc: &Value) -> Catalog {
        let components = doc["components"]["schemas"].as_object().cloned().unwrap_or_default();
        let mut catalog = Catalog::default();
        let Some(paths) = doc["paths"].as_object() else { return catalog };
        for (path, item) in paths {
            if !path.starts_with("/v1/") || path == "/v1/openapi.json" {
                continue;
            }
            let Some(item) = item.as_object() else { continue };
            for (method, op) in item {
                let Ok(m) = method.to_ascii_uppercase().parse::<reqwest::Method>() else { continue };
                let Some(op_id) = op["operationId"].as_str() else { continue };
                if SECRET_OPERATIONS.contains(&op_id) {
                    continue;
                }
                let name = NAMED_TOOLS
                    .iter()
                    .find(|(o, _)| *o == op_id)
                    .map(|(_, n)| n.to_string())
                    .unwrap_or_else(|| format!("service_{op_id}"));
                let mut defs = Map::new();
                let mut props = Map::new();
                let mut required = Vec::new();
                let mut path_params = Vec::new();
                let mut query_params = Vec::new();
                for p in op["parameters"].as_array().into_iter().flatten() {
                    let (Some(pname), Some(loc)) = (p["name"].as_str(), p["in"].as_str()) else { continue };
                    let mut schema = inline_refs(&p["schema"], &components, &mut defs);
                    if let (Some(desc), Value::Object(s)) = (p["description"].as_str(), &mut schema) {
                        s.insert("description".into(), json!(desc));
                    }
                    props.insert(pname.to_owned(), schema);
                    match loc {
                        "path" => {
                            required.push(json!(pname));
                            path_params.push(pname.to_owned());
                        }
                        "query" => query_params.push(pname.to_owned()),
                        _ => {}
                    }
                }
                let body = &op["requestBody"]["content"]["application/json"]["schema"];
                let body_required = op["requestBody"]["required"].as_bool().unwrap_or(true);
                let resolved = match body["$ref"].as_str().and_then(|r| r.strip_prefix("#/components/schemas/")) {
                    Some(name) => components.get(name).unwrap_or(&Value::Null),
                    None => body,
                };
                let fields = resolved["properties"]
                    .as_object()
                    .filter(|f| !f.is_empty() && f.keys().all(|k| !props.contains_key(k) && k != "body"));
                let body_args = if body.is_null() {
                    BodyArgs::None
                } else if let Some(fields) = fields {
                    // Flat: the body's fields are arguments of their own, as
                    // assistants expect, with the same constraints.
                    for (field, schema) in fields {
                        props.insert(field.clone(), inline_refs(schema, &components, &mut defs));
                    }
                    if body_required {
                        required.extend(resolved["required"].as_array().into_iter().flatten().cloned());
                    }
                    BodyArgs::Fields(fields.keys().cloned().collect())
                } else {
                    props.insert("body".into(), inline_refs(body, &components, &mut defs));
                    if body_required {
                        required.push(json!("body"));
                    }
                    BodyArgs::Whole
                };
                let mut schema = Map::new();
                schema.insert("type".into(), json!("object"));
                schema.insert("properties".into(), Value::Object(props));
                schema.insert("required".into(), Value::Array(required));
                schema.insert("additionalProperties".into(), json!(false));
                if !defs.is_empty() {
                    schema.insert("$defs".into(), Value::Object(defs));
                }
                let summary = op["summary"].as_str().unwrap_or(op_id);
                let description = match op["description"].as_str() {
                    Some(d) => format!("{summary}\n\n{d}\n\n{method} {path}", method = m),
                    None => format!("{summary}\n\n{m} {path}"),
                };
                let read_only = m == reqwest::Method::GET;
                let annotations = ToolAnnotations::new()
                    .read_only(read_only)
                    .destructive(
                        m == reqwest::Method::DELETE
                            || op_id.contains("revoke")
                            || op_id.contains("remove")
                            || op_id.contains("unload"),
                    )
                    .idempotent(read_only || m == reqwest::Method::DELETE)
                    .open_world(false);
                let tool = Tool::new(name.clone(), description, Arc::new(schema)).with_annotations(annotations);
                catalog.tools.push(tool);
                catalog
                    .routes
                    .insert(name, Route { method: m, path: path.clone(), path_params, query_params, body: body_args });
            }
        }
        catalog.tools.sort_by(|a, b| a.name.cmp(&b.name));
        catalog
    }
}

/// Sends one API request and returns (status, body).
pub(crate) trait Dispatch: Send + Sync + 'static {
    fn send(&self, req: axum::http::Request<Body>) -> Pin<Box<dyn Future<Output = (u16, Vec<u8>)> + Send + '_>>;
}

/// Dispatch into this server's own router, in process.
pub(crate) struct InProcess(pub axum::Router);

impl Dispatch for InProcess {
    fn send(&self, req: axum::http::Request<Body>) -> Pin<Box<dyn Future<Output = (u16, Vec<u8>)> + Send + '_>> {
        let router = self.0.clone();
        Box::pin(async move {
            use tower::ServiceExt;
            match router.oneshot(req).await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let body = axum::body::to_bytes(resp.into_body(), 64 * 1024 * 1024)
                        .await
                        .map(|b| b.to_vec())
                        .unwrap_or_default();
                    (status, body)
                }
                Err(never) => match never {},
            }
        })
    }
}

/// Dispatch to a running server over HTTP (`service mcp`).
pub(crate) struct Remote {
    pub base: url::Url,
    pub client: reqwest::Client,
}

impl Dispatch for Remote {
    fn send(&self, req: axum::http::Request<Body>) -> Pin<Box<dyn Future<Output = (u16, Vec<u8>)> + Send + '_>> {
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let body = axum::body::to_bytes(body, 16 * 1024 * 1024).await.unwrap_or_default();
            let url = match self.base.join(parts.uri.to_string().trim_start_matches('/')) {
                Ok(u) => u,
                Err(_) => return (400, br#"{"code":"BAD_URL","message":"bad request path"}"#.to_vec()),
            };
            let mut rb = self.client.request(parts.method, url).body(body);
            for (k, v) in &parts.headers {
                rb = rb.header(k, v);
            }
            match rb.send().await {
                Ok(r) => {
                    let status = r.status().as_u16();
                    (status, r.bytes().await.map(|b| b.to_vec()).unwrap_or_default())
                }
                Err(e) => (502, json!({ "code": "UNREACHABLE", "message": format!("the service is unreachable: {}", e.without_url()) }).to_string().into_bytes()),
            }
        })
    }
}

/// Where a call's bearer token comes from.
#[derive(Clone)]
pub(crate) enum Token {
    /// The `Authorization` header of the MCP HTTP request.
    FromRequest,
    /// A token given to `service mcp`.
    Fixed(Arc<SecretString>),
}

/// The MCP server handler.
#[derive(Clone)]
pub(crate) struct McpServer {
    catalog: Arc<Catalog>,
    dispatch: Arc<dyn Dispatch>,
    token: Token,
}

impl McpServer {
    pub(crate) fn new(catalog: Arc<Catalog>, dispatch: Arc<dyn Dispatch>, token: Token) -> Self {
        McpServer { catalog, dispatch, token }
    }

    fn authorization(&self, ctx: &RequestContext<RoleServer>) -> Option<String> {
        match &self.token {
            Token::Fixed(t) => Some(format!("Bearer {}", t.expose_secret())),
            Token::FromRequest => ctx
                .extensions
                .get::<axum::http::request::Parts>()
                .and_then(|p| p.headers.get(axum::http::header::AUTHORIZATION))
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        }
    }
}

/// Percent-encodes one path segment.
fn segment(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>().replace('+', "%20")
}

fn as_query_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("service", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Control API of the data-integration platform. Writes return approval proposals that a person approves; \
                 secrets are never passed to tools: ask for a credential-entry link (service_create_entry_link) and use the \
                 credential_handle it yields.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.catalog.tools.clone()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        let route = self
            .catalog
            .routes
            .get(&name)
            .ok_or_else(|| McpError::invalid_params(format!("unknown tool {name}"), None))?;
        let args = request.arguments.unwrap_or_default();
        let mut path = route.path.clone();
        for p in &route.path_params {
            let v = args
                .get(p)
                .map(as_query_value)
                .ok_or_else(|| McpError::invalid_params(format!("missing argument {p}"), None))?;
            path = path.replace(&format!("{{{p}}}"), &segment(&v));
        }
        let query: Vec<(String, String)> = route
            .query_params
            .iter()
            .filter_map(|q| args.get(q).filter(|v| !v.is_null()).map(|v| (q.clone(), as_query_value(v))))
            .collect();
        if !query.is_empty() {
            path.push('?');
            path.push_str(&url::form_urlencoded::Serializer::new(String::new()).extend_pairs(&query).finish());
        }
        let mut builder =
            axum::http::Request::builder().method(route.method.clone()).uri(&path).header("x-service-client", "mcp");
        if let Some(auth) = self.authorization(&ctx) {
            builder = builder.header(axum::http::header::AUTHORIZATION, auth);
        }
        let body = match &route.body {
            BodyArgs::None => Body::empty(),
            BodyArgs::Whole => {
                builder = builder.header(axum::http::header::CONTENT_TYPE, "application/json");
                Body::from(args.get("body").cloned().unwrap_or(json!({})).to_string())
            }
            BodyArgs::Fields(fields) => {
                builder = builder.header(axum::http::header::CONTENT_TYPE, "application/json");
                // A null argument is an absent one (assistants send null for
                // what they leave out); nulls inside a value stay.
                let object: Map<String, Value> = fields
                    .iter()
                    .filter_map(|f| args.get(f).filter(|v| !v.is_null()).map(|v| (f.clone(), v.clone())))
                    .collect();
                Body::from(Value::Object(object).to_string())
            }
        };
        let req = builder.body(body).map_err(|e| McpError::invalid_params(e.to_string(), None))?;
        let (status, bytes) = self.dispatch.send(req).await;
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let result = if status < 400 {
            CallToolResult::success(vec![ContentBlock::text(text)])
        } else {
            CallToolResult::error(vec![ContentBlock::text(text)])
        };
        Ok(result.into())
    }
}

/// The `/mcp` endpoint: streamable HTTP, stateless JSON answers.
pub(crate) fn http_service(
    catalog: Arc<Catalog>,
    api: axum::Router,
    allowed_hosts: Vec<String>,
) -> rmcp::transport::streamable_http_server::StreamableHttpService<
    McpServer,
    rmcp::transport::streamable_http_server::session::local::LocalSessionManager,
> {
    use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
    let dispatch: Arc<dyn Dispatch> = Arc::new(InProcess(api));
    let config = StreamableHttpServerConfig::default().with_allowed_hosts(allowed_hosts);
    StreamableHttpService::new(
        move || Ok(McpServer::new(catalog.clone(), dispatch.clone(), Token::FromRequest)),
        Default::default(),
        config,
    )
}

/// `service mcp`: serves the tools over stdio, calling the running server
/// whose root (where `/v1` starts) is `base`.
pub(crate) async fn serve_stdio(base: url::Url, token: SecretString) -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    let client = reqwest::Client::new();
    let doc: Value = client.get(base.join("openapi.json")?).send().await?.error_for_status()?.json().await?;
    let catalog = Arc::new(Catalog::from_openapi(&doc));
    let server = McpServer::new(catalog, Arc::new(Remote { base, client }), Token::Fixed(Arc::new(token)));
    let running = server.serve(rmcp::transport::stdio()).await?;
    running.waiting().await?;
    Ok(())
}
