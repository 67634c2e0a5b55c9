//! The MCP server with a real MCP client (rmcp's own streamable-HTTP
//! client): initialise, list tools, call a read tool, call a write tool and
//! get a proposal, approve it over HTTP and see it executed once.

use reqwest::{Method, StatusCode};
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

use crate::backend_tests;
use crate::support::{TestServer, expect_error, json_ok};

fn text_of(r: &CallToolResult) -> Value {
    let content = serde_json::to_value(&r.content).unwrap();
    let text = content[0]["text"].as_str().unwrap_or("null");
    serde_json::from_str(text).unwrap_or(Value::Null)
}

async fn client(srv: &TestServer, token: &str) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
    let config = StreamableHttpClientTransportConfig::with_uri(srv.url("/mcp")).auth_header(token.to_owned());
    let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    ().serve(transport).await.expect("MCP initialise")
}

backend_tests! {
    async fn an_mcp_client_lists_tools_reads_proposes_and_the_approval_executes_once(srv) {
        let mcp = client(srv, &srv.admin_token).await;
        let info = mcp.peer_info().expect("server info");
        assert_eq!(info.server_info.as_ref().map(|s| s.name.as_str()), Some("service"));

        let tools = mcp.list_all_tools().await.unwrap();
        let names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
        for expected in ["service_get_source_oauth_consent_url", "service_complete_source_oauth", "service_get_me", "service_list_workspaces", "service_invite_member", "service_list_approvals", "service_create_source", "service_delete_source", "service_create_entry_link"] {
            assert!(names.contains(&expected.to_owned()), "{expected} missing from {names:?}");
        }
        // No tool takes a raw secret.
        assert!(!names.iter().any(|n| n == "service_create_credential" || n == "service_store_api_token"));
        // No tool has an argument (at any depth) that holds one; the names
        // of credential kinds may appear as values.
        fn argument_names(v: &serde_json::Value, out: &mut Vec<String>) {
            match v {
                serde_json::Value::Object(m) => {
                    if let Some(serde_json::Value::Object(props)) = m.get("properties") {
                        out.extend(props.keys().cloned());
                    }
                    m.values().for_each(|v| argument_names(v, out));
                }
                serde_json::Value::Array(items) => items.iter().for_each(|v| argument_names(v, out)),
                _ => {}
            }
        }
        for t in &tools {
            let schema = serde_json::to_value(&t.input_schema).unwrap();
            let mut names = Vec::new();
            argument_names(&schema, &mut names);
            assert!(!names.iter().any(|n| n == "api_token" || n == "secret" || n.ends_with("password")), "{} takes a secret: {schema}", t.name);
        }
        let me_tool = tools.iter().find(|t| t.name == "service_get_me").unwrap();
        assert_eq!(me_tool.annotations.as_ref().and_then(|a| a.read_only_hint), Some(true));
        let delete_tool = tools.iter().find(|t| t.name == "service_delete_source").unwrap();
        assert_eq!(delete_tool.annotations.as_ref().and_then(|a| a.destructive_hint), Some(true));

        let me = mcp.call_tool(CallToolRequestParams::new("service_get_me")).await.unwrap();
        assert_ne!(me.is_error, Some(true));
        let me = text_of(&me);
        assert_eq!(me["data"]["user"]["email"], "admin@example.test");
        assert_eq!(me["data"]["client_source"], "mcp");
        let ws = me["data"]["default_workspace_id"].as_str().unwrap().to_owned();

        // A write through MCP is a proposal by default.
        // Flat arguments: the path's and the body's side by side.
        let invite = tools.iter().find(|t| t.name == "service_invite_member").unwrap();
        let props = invite.input_schema["properties"].as_object().unwrap();
        assert!(props.contains_key("workspace_id") && props.contains_key("email") && props.contains_key("role") && !props.contains_key("body"), "{props:?}");
        assert_eq!(props["expires_in_hours"]["maximum"].as_f64(), Some(336.0), "with the same constraints");
        let args = json!({ "workspace_id": ws, "email": "via-mcp@example.test", "role": "viewer" });
        let proposed = mcp
            .call_tool(CallToolRequestParams::new("service_invite_member").with_arguments(args.as_object().unwrap().clone()))
            .await
            .unwrap();
        let proposed = text_of(&proposed);
        let approval = &proposed["data"]["approval"];
        assert_eq!(approval["status"], "pending", "{proposed}");
        assert_eq!(approval["client_source"], "mcp");
        let id = approval["approval_id"].as_str().unwrap().to_owned();
        let invited = json_ok(srv.get("/v1/audit-logs?action=members.invite&outcome=succeeded").send().await.unwrap()).await;
        assert!(invited["data"]["items"].as_array().unwrap().is_empty(), "nothing executed yet");

        // Webhook subscriptions are tools too, proposed in a category of
        // their own, never run by the assistant.
        assert!(tools.iter().any(|t| t.name == "service_list_deliveries"));
        let args = json!({ "url": "https://hooks.example.com/in", "event_types": ["job.failed"] });
        let hook = mcp
            .call_tool(CallToolRequestParams::new("service_create_webhook").with_arguments(args.as_object().unwrap().clone()))
            .await
            .unwrap();
        let hook = text_of(&hook);
        assert_eq!(hook["data"]["approval"]["category"], "webhooks", "{hook}");
        assert!(!hook.to_string().contains("whsec_"), "{hook}");

        // The assistant cannot approve its own proposal.
        let self_approve = mcp
            .call_tool(CallToolRequestParams::new("service_approve").with_arguments(json!({ "approval_id": id }).as_object().unwrap().clone()))
            .await
            .unwrap();
        assert_eq!(self_approve.is_error, Some(true));
        assert_eq!(text_of(&self_approve)["code"], "403");

        // A person approves over HTTP: executed once.
        let resp = srv.request_as(&srv.approver_token, Method::POST, &format!("/v1/approvals/{id}/approve")).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED);
        expect_error(srv.request_as(&srv.approver_token, Method::POST, &format!("/v1/approvals/{id}/approve")).send().await.unwrap(), 409, "APPROVAL_NOT_PENDING").await;
        let invited = json_ok(srv.get("/v1/audit-logs?action=members.invite&outcome=succeeded").send().await.unwrap()).await;
        let items = invited["data"]["items"].as_array().unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0]["client_source"], "mcp");
        assert_eq!(items[0]["approval_id"], id.as_str());
        mcp.cancel().await.unwrap();
    }

    async fn the_mcp_endpoint_needs_a_valid_token(srv) {
        let resp = srv.client.post(srv.url("/mcp")).json(&json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list" })).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        let resp = srv.client.post(srv.url("/mcp")).bearer_auth("svc_wrong").json(&json!({})).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    }
}

/// `service mcp` serves the same tools over stdio to a local assistant,
/// calling a running server with the user's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stdio_transport_serves_the_same_tools() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;

    let srv = TestServer::start(crate::support::Backend::Sqlite).await.unwrap();
    let mut child = crate::support::process::command()
        // The spec's base URL, ending in /v1/.
        .env("SERVICE_API_BASE_URL", format!("{}/v1/", srv.base))
        .env("SERVICE_TOKEN", &srv.admin_token)
        .arg("mcp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let lines = std::thread::spawn(move || {
        let mut out = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let done = line.contains("\"id\":3");
            out.push(line);
            if done {
                break;
            }
        }
        out
    });
    let messages = [
        json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": { "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "test", "version": "1" } } }),
        json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }),
        json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/list" }),
        json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": { "name": "service_get_me", "arguments": {} } }),
    ];
    for m in messages {
        writeln!(stdin, "{m}").unwrap();
        stdin.flush().unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let out = tokio::task::spawn_blocking(move || lines.join().unwrap()).await.unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let all = out.join("\n");
    assert!(all.contains("service_list_sources"), "tools listed: {all}");
    let call = out.iter().find(|l| l.contains("\"id\":3")).expect("a tools/call answer");
    let v: Value = serde_json::from_str(call).unwrap();
    let text = v["result"]["content"][0]["text"].as_str().unwrap();
    let me: Value = serde_json::from_str(text).unwrap();
    assert_eq!(me["data"]["user"]["email"], "admin@example.test");
    assert_eq!(me["data"]["client_source"], "mcp");
    srv.stop().await;
}
