//! The trust boundaries between users, workspaces, roles and client kinds,
//! each attacked the way an adversary would and shown to hold: taking over
//! an account through an invitation, reading one-time links, an assistant
//! deciding its own proposals, writes that ignore the proposal header,
//! administrators reaching into other workspaces, text that crashed the
//! server, and the limits that keep one client from exhausting it.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use service::access::{ClientSource, Role};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::backend_tests;
use crate::support::{Backend, TestServer, data_fingerprint, expect_error, json, json_ok};

/// A token of the bootstrap administrator issued to an MCP client (an
/// assistant).
async fn assistant_token(srv: &TestServer) -> String {
    service::access::admin::create_token(
        &srv.state.store,
        &srv.state.config.bootstrap_email,
        Some("assistant"),
        None,
        ClientSource::Mcp,
    )
    .await
    .unwrap()
    .expose_secret()
    .to_owned()
}

async fn invite(
    srv: &TestServer,
    token: &str,
    ws: &str,
    email: &str,
    role: &str,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = srv
        .request_as(token, Method::POST, &format!("/v1/workspaces/{ws}/members/invitations"))
        .json(&json!({ "email": email, "role": role }));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

/// Sessions of the installation, of everyone.
async fn session_count(srv: &TestServer) -> i64 {
    use sqlx::{Connection, Row};
    sqlx::any::install_default_drivers();
    let mut c = sqlx::AnyConnection::connect(&srv.state.config.database_url).await.unwrap();
    sqlx::query("SELECT COUNT(*) FROM sessions").fetch_one(&mut c).await.unwrap().get::<i64, _>(0)
}

/// Every row of every table, as text: what a secret or link must not be
/// found in.
async fn every_row(srv: &TestServer) -> String {
    use sqlx::{Connection, Row};
    sqlx::any::install_default_drivers();
    let mut c = sqlx::AnyConnection::connect(&srv.state.config.database_url).await.unwrap();
    let mut out = String::new();
    for (table, cols) in [
        ("approvals", "operation, result_body"),
        ("idempotency_keys", "request_hash, response_body"),
        ("audit_logs", "action, target_id"),
    ] {
        let rows =
            sqlx::query(sqlx::AssertSqlSafe(format!("SELECT {cols} FROM {table}"))).fetch_all(&mut c).await.unwrap();
        for r in rows {
            for i in 0..r.len() {
                out.push_str(&r.try_get::<Option<String>, _>(i).ok().flatten().unwrap_or_default());
                out.push('\n');
            }
        }
    }
    out
}

/// The data an operation could change, without what a proposal itself
/// writes (its approval row, and a credential sealed inert until its
/// activation is approved).
async fn what_proposals_must_not_change(srv: &TestServer) -> Vec<String> {
    data_fingerprint(srv)
        .await
        .into_iter()
        .filter(|l| !(l.starts_with("approvals:") || l.starts_with("credentials:") && l.contains("|pending_approval|")))
        .collect()
}

backend_tests! {
    async fn accepting_an_invitation_never_signs_anyone_into_an_existing_account(srv) {
        // The administrator of another workspace invites the installation
        // operator's address and opens the link themselves.
        let (other_ws, other_admin) = srv.other_workspace().await;
        let operator_email = srv.state.config.bootstrap_email.clone();
        let created = json_ok(invite(srv, &other_admin, &other_ws, &operator_email, "administrator", &[]).await).await;
        let url = created["data"]["accept_url"].as_str().unwrap().to_owned();
        let sessions_before = session_count(srv).await;

        let page = srv.client.get(&url).send().await.unwrap();
        assert_eq!(page.status(), StatusCode::OK);
        let html = page.text().await.unwrap();
        assert!(!html.contains("Join as"), "no way to accept as that account without its web sign-in: {html}");
        let taken = srv.client.post(&url).form(&[("name", "attacker")]).send().await.unwrap();
        assert_eq!(taken.status(), StatusCode::CONFLICT);
        let html = taken.text().await.unwrap();
        assert!(!html.contains("svc_"), "no token of the existing account: {html}");
        assert_eq!(session_count(srv).await, sessions_before, "no session was created");
        let members = json_ok(srv.request_as(&other_admin, Method::GET, &format!("/v1/workspaces/{other_ws}/members")).send().await.unwrap()).await;
        assert!(!members.to_string().contains(&operator_email), "and no membership granted: {members}");

        // Another account holding the link cannot accept it either.
        let code = url.rsplit('/').next().unwrap().to_owned();
        let (_, stranger) = srv.user_in(&other_ws, Role::Viewer).await;
        let resp = srv.request_as(&stranger, Method::POST, "/v1/invitations/accept").json(&json!({ "code": code })).send().await.unwrap();
        expect_error(resp, 404, "404").await;
        // Nor an assistant of the right account, nor as a proposal.
        let assistant = assistant_token(srv).await;
        let resp = srv.request_as(&assistant, Method::POST, "/v1/invitations/accept").json(&json!({ "code": code })).send().await.unwrap();
        expect_error(resp, 403, "403").await;
        let resp = srv.post("/v1/invitations/accept", json!({ "code": code })).header("x-service-execution-mode", "proposal").send().await.unwrap();
        expect_error(resp, 400, "PROPOSAL_NOT_APPLICABLE").await;

        // The account accepts with its own session, and that is audited.
        let accepted = json_ok(srv.post("/v1/invitations/accept", json!({ "code": code })).send().await.unwrap()).await;
        assert_eq!(accepted["data"]["workspace_id"], other_ws.as_str());
        let logs = json_ok(srv.request_as(&other_admin, Method::GET, "/v1/audit-logs?action=invitations.accept").send().await.unwrap()).await;
        let record = &logs["data"]["items"][0];
        assert_eq!(record["outcome"], "succeeded", "{logs}");
        assert_eq!(record["target_id"], created["data"]["invitation_id"]);
        let resp = srv.post("/v1/invitations/accept", json!({ "code": code })).send().await.unwrap();
        expect_error(resp, 404, "404").await;
    }

    async fn one_time_links_are_shown_once_and_stored_nowhere_readable(srv) {
        let ws = srv.workspace_id().await;
        let (_, viewer) = srv.user_in(&ws, Role::Viewer).await;
        let proposed = json_ok(invite(srv, &srv.admin_token, &ws, "linked@example.test", "viewer", &[("x-service-execution-mode", "proposal")]).await).await;
        let id = proposed["data"]["approval"]["approval_id"].as_str().unwrap().to_owned();
        let approved = json_ok(srv.request_as(&srv.approver_token, Method::POST, &format!("/v1/approvals/{id}/approve")).send().await.unwrap()).await;
        let url = approved["data"]["result"]["accept_url"].as_str().unwrap().to_owned();
        let code = url.rsplit('/').next().unwrap().to_owned();
        assert!(code.starts_with("svc1_"), "the approver sees the link once: {approved}");

        let listed = json_ok(srv.get("/v1/approvals").send().await.unwrap()).await;
        let mine = listed["data"]["items"].as_array().unwrap().iter().find(|a| a["approval_id"] == id.as_str()).cloned().unwrap();
        assert_eq!(mine["result"]["body"]["accept_url"], service::ops::SHOWN_ONCE, "{mine}");
        assert!(!listed.to_string().contains(&code));
        // A viewer learns a proposal exists, not what it holds.
        let seen = json_ok(srv.request_as(&viewer, Method::GET, "/v1/approvals").send().await.unwrap()).await;
        let theirs = seen["data"]["items"].as_array().unwrap().iter().find(|a| a["approval_id"] == id.as_str()).cloned().unwrap();
        assert_eq!(theirs["details_hidden"], true, "{theirs}");
        assert!(theirs["operation"].is_null() && theirs["result"].is_null(), "{theirs}");

        // Replays of links made under an idempotency key hold no link.
        let first = json_ok(srv.post("/v1/credentials/entry-links", json!({ "hosts": ["team.mailcoach.app"] })).header("idempotency-key", "link-1").send().await.unwrap()).await;
        let entry_code = first["data"]["url"].as_str().unwrap().rsplit('/').next().unwrap().to_owned();
        let replay = srv.post("/v1/credentials/entry-links", json!({ "hosts": ["team.mailcoach.app"] })).header("idempotency-key", "link-1").send().await.unwrap();
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        let replay = json_ok(replay).await;
        assert_eq!(replay["data"]["url"], service::ops::SHOWN_ONCE);
        assert_eq!(replay["data"]["entry_id"], first["data"]["entry_id"]);

        let stored = every_row(srv).await;
        assert!(!stored.contains(&code) && !stored.contains(&entry_code), "no one-time code is stored readable");
    }

    async fn an_assistant_session_stays_mcp_whatever_its_header_says(srv) {
        let ws = srv.workspace_id().await;
        let assistant = assistant_token(srv).await;
        for header in [None, Some("api"), Some("cli"), Some("mcp")] {
            let headers: Vec<(&str, &str)> = header.map(|h| vec![("x-service-client", h)]).unwrap_or_default();
            let resp = invite(srv, &assistant, &ws, "via-assistant@example.test", "viewer", &headers).await;
            assert_eq!(resp.status(), StatusCode::ACCEPTED, "a proposal with header {header:?}");
            let body = json_ok(resp).await;
            assert_eq!(body["data"]["approval"]["client_source"], "mcp");
        }
        let me = json_ok(srv.request_as(&assistant, Method::GET, "/v1/me").header("x-service-client", "api").send().await.unwrap()).await;
        assert_eq!(me["data"]["client_source"], "mcp");
        let pending = json_ok(srv.get("/v1/approvals?status=pending").send().await.unwrap()).await;
        let id = pending["data"]["items"][0]["approval_id"].as_str().unwrap().to_owned();
        for header in ["api", "cli"] {
            let resp = srv.request_as(&assistant, Method::POST, &format!("/v1/approvals/{id}/approve")).header("x-service-client", header).send().await.unwrap();
            expect_error(resp, 403, "403").await;
            let resp = srv.request_as(&assistant, Method::POST, &format!("/v1/approvals/{id}/reject")).header("x-service-client", header).send().await.unwrap();
            expect_error(resp, 403, "403").await;
        }
        let resp = srv.request_as(&assistant, Method::PATCH, "/v1/approval-policies/workspace_admin").header("x-service-client", "api").json(&json!({ "requires_approval": false })).send().await.unwrap();
        expect_error(resp, 403, "403").await;
        // An ordinary session may narrow itself to mcp, never the reverse.
        let resp = invite(srv, &srv.admin_token, &ws, "narrowed@example.test", "viewer", &[("x-service-client", "mcp")]).await;
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
    }

    async fn a_proposal_is_never_decided_by_the_session_that_made_it(srv) {
        let ws = srv.workspace_id().await;
        let body = json_ok(invite(srv, &srv.admin_token, &ws, "self@example.test", "viewer", &[("x-service-execution-mode", "proposal")]).await).await;
        let id = body["data"]["approval"]["approval_id"].as_str().unwrap().to_owned();
        for decision in ["approve", "reject"] {
            let resp = srv.request(Method::POST, &format!("/v1/approvals/{id}/{decision}")).send().await.unwrap();
            expect_error(resp, 403, "403").await;
        }
        let pending = json_ok(srv.get("/v1/approvals?status=pending").send().await.unwrap()).await;
        assert_eq!(pending["data"]["items"][0]["approval_id"], id.as_str(), "still pending");
        let done = json_ok(srv.request_as(&srv.approver_token, Method::POST, &format!("/v1/approvals/{id}/approve")).send().await.unwrap()).await;
        assert_eq!(done["data"]["approval"]["status"], "executed");
    }

    async fn revoking_the_proposing_session_voids_its_proposals(srv) {
        let ws = srv.workspace_id().await;
        let assistant = assistant_token(srv).await;
        let body = json_ok(invite(srv, &assistant, &ws, "voided@example.test", "viewer", &[]).await).await;
        let id = body["data"]["approval"]["approval_id"].as_str().unwrap().to_owned();
        let me = json_ok(srv.request_as(&assistant, Method::GET, "/v1/me").send().await.unwrap()).await;
        let session = me["data"]["session_id"].as_str().unwrap().to_owned();
        json_ok(srv.request(Method::POST, &format!("/v1/sessions/{session}/revoke")).send().await.unwrap()).await;
        let voided = json_ok(srv.get("/v1/approvals?status=voided").send().await.unwrap()).await;
        assert_eq!(voided["data"]["items"][0]["approval_id"], id.as_str(), "{voided}");
        let e = expect_error(srv.request_as(&srv.approver_token, Method::POST, &format!("/v1/approvals/{id}/approve")).send().await.unwrap(), 409, "APPROVAL_NOT_PENDING").await;
        assert_eq!(e["details"]["status"], "voided");
        let invited = json_ok(srv.get("/v1/audit-logs?action=members.invite&outcome=succeeded").send().await.unwrap()).await;
        assert!(invited["data"]["items"].as_array().unwrap().is_empty(), "nothing was executed");
    }

    async fn the_proposal_header_changes_nothing_on_any_write(srv) {
        let ws = srv.workspace_id().await;
        // Plugin switches and policy changes become proposals too.
        let resp = srv.post("/v1/admin/plugins/conn_emailcampaign_edm/unload", json!({})).header("x-service-execution-mode", "proposal").send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        let unload = json_ok(resp).await["data"]["approval"]["approval_id"].as_str().unwrap().to_owned();
        let c = json_ok(srv.get("/v1/connectors/conn_emailcampaign_edm").send().await.unwrap()).await;
        assert_eq!(c["data"]["status"], "available", "not unloaded by a proposal");
        let resp = srv.request(Method::PATCH, "/v1/approval-policies/sources").header("x-service-execution-mode", "proposal").json(&json!({ "requires_approval": false })).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        let policies = json_ok(srv.get("/v1/approval-policies").send().await.unwrap()).await;
        let sources = policies["data"]["items"].as_array().unwrap().iter().find(|p| p["category"] == "sources").cloned().unwrap();
        assert_eq!(sources["requires_approval"], true, "unchanged");
        // Deciding cannot be proposed: 400, and the proposal stays pending.
        let resp = srv.request_as(&srv.approver_token, Method::POST, &format!("/v1/approvals/{unload}/approve")).header("x-service-execution-mode", "proposal").send().await.unwrap();
        expect_error(resp, 400, "PROPOSAL_NOT_APPLICABLE").await;
        let done = json_ok(srv.request_as(&srv.approver_token, Method::POST, &format!("/v1/approvals/{unload}/approve")).send().await.unwrap()).await;
        assert_eq!(done["data"]["result"]["available"], false, "approved: unloaded");
        json_ok(srv.request_as(&srv.approver_token, Method::POST, "/v1/admin/plugins/conn_emailcampaign_edm/load").send().await.unwrap()).await;

        // Every write route of the description, with a body its schema
        // allows: with the header, nothing the operation governs changes.
        let doc = json_ok(srv.client.get(srv.url("/openapi.json")).send().await.unwrap()).await;
        let before = what_proposals_must_not_change(srv).await;
        for route in crate::support::routes::write_routes(&doc, "x", &["sample-text-1", "team.mailcoach.app", "viewer"]) {
            let mut req = srv.request(route.method.clone(), &route.path).header("x-service-execution-mode", "proposal").header("x-service-workspace", &ws);
            if let Some(body) = &route.body {
                req = req.json(body);
            }
            let resp = req.send().await.unwrap();
            assert!(resp.status().as_u16() < 500, "{} {}: {}", route.method, route.path, resp.status());
            assert_ne!(resp.status(), StatusCode::CREATED, "{} {} created something", route.method, route.path);
        }
        assert_eq!(what_proposals_must_not_change(srv).await, before);
    }

    async fn every_write_route_takes_text_in_any_script(srv) {
        // Japanese (the seventh byte inside a character), emoji, combining
        // accents and a right-to-left mark, in every string of every body
        // and every path parameter.
        let text = ["データ統合", "🚀📊 émoji", "e\u{301}\u{301}\u{301}", "\u{200f}مرحبا", "数据集成管道"];
        let doc = json_ok(srv.client.get(srv.url("/openapi.json")).send().await.unwrap()).await;
        for path_value in ["データ統合", "x"] {
            for route in crate::support::routes::write_routes(&doc, path_value, &text) {
                let mut req = srv.request(route.method.clone(), &route.path);
                if let Some(body) = &route.body {
                    req = req.json(body);
                }
                let resp = req.send().await.unwrap();
                let status = resp.status();
                let (_, body) = json(resp).await;
                assert!(status.as_u16() < 500, "{} {} answered {status}: {body}", route.method, route.path);
            }
        }
        // And one that used to crash, by hand.
        let d = srv.post("/v1/destinations", json!({ "name": "データ統合", "kind": "sqlite", "configuration": { "file": "w.db" } })).send().await.unwrap();
        assert_eq!(d.status(), StatusCode::CREATED);
        assert_eq!(json_ok(d).await["data"]["name"], "データ統合");
    }

    async fn session_administration_stays_within_what_an_administrator_administers(srv) {
        let ws = srv.workspace_id().await;
        let (other_ws, other_admin) = srv.other_workspace().await;
        // The operator joins the other workspace too.
        let created = json_ok(invite(srv, &other_admin, &other_ws, &srv.state.config.bootstrap_email, "viewer", &[]).await).await;
        let code = created["data"]["accept_url"].as_str().unwrap().rsplit('/').next().unwrap().to_owned();
        json_ok(srv.post("/v1/invitations/accept", json!({ "code": code })).send().await.unwrap()).await;
        let me = json_ok(srv.get("/v1/me").send().await.unwrap()).await;
        let (operator, operator_session) = (me["data"]["user"]["user_id"].as_str().unwrap().to_owned(), me["data"]["session_id"].as_str().unwrap().to_owned());

        // The other workspace's administrator sees none of the operator's
        // sessions and cannot end one.
        let listed = json_ok(srv.request_as(&other_admin, Method::GET, &format!("/v1/sessions?workspace_id={other_ws}")).send().await.unwrap()).await;
        assert!(!listed.to_string().contains(&operator), "{listed}");
        let resp = srv.request_as(&other_admin, Method::POST, &format!("/v1/sessions/{operator_session}/revoke")).header("x-service-workspace", &other_ws).send().await.unwrap();
        expect_error(resp, 403, "403").await;
        json_ok(srv.get("/v1/me").send().await.unwrap()).await;

        // A member only of that workspace is theirs to administer.
        let (member, member_token) = srv.user_in(&other_ws, Role::Viewer).await;
        let listed = json_ok(srv.request_as(&other_admin, Method::GET, &format!("/v1/sessions?workspace_id={other_ws}&user_id={member}")).send().await.unwrap()).await;
        let session = listed["data"]["items"][0]["session_id"].as_str().unwrap().to_owned();
        json_ok(srv.request_as(&other_admin, Method::POST, &format!("/v1/sessions/{session}/revoke")).header("x-service-workspace", &other_ws).send().await.unwrap()).await;
        expect_error(srv.request_as(&member_token, Method::GET, "/v1/me").send().await.unwrap(), 401, "401").await;

        // Anyone ends their own session, without being an administrator.
        let (_, viewer_token) = srv.user_in(&ws, Role::Viewer).await;
        let own = json_ok(srv.request_as(&viewer_token, Method::GET, "/v1/me").send().await.unwrap()).await;
        let own_session = own["data"]["session_id"].as_str().unwrap().to_owned();
        json_ok(srv.request_as(&viewer_token, Method::POST, &format!("/v1/sessions/{own_session}/revoke")).send().await.unwrap()).await;
        expect_error(srv.request_as(&viewer_token, Method::GET, "/v1/me").send().await.unwrap(), 401, "401").await;
    }

    async fn a_viewer_cannot_run_a_connector_with_the_workspaces_credentials(srv) {
        let ws = srv.workspace_id().await;
        let (_, viewer) = srv.user_in(&ws, Role::Viewer).await;
        let resp = srv.request_as(&viewer, Method::POST, "/v1/pipelines/prepare").json(&json!({ "source_id": "src_anything" })).send().await.unwrap();
        expect_error(resp, 403, "403").await;
    }

    async fn free_text_fields_are_bounded(srv) {
        let label = "x".repeat(200 * 1024);
        let resp = srv.post("/v1/credentials/entry-links", json!({ "hosts": ["team.mailcoach.app"], "label": label })).send().await.unwrap();
        let e = expect_error(resp, 400, "VALIDATION_FAILED").await;
        assert_eq!(e["details"]["field"], "label");
        let resp = srv.post("/v1/credentials", json!({ "hosts": ["api.example.com"], "secret": "a-long-enough-secret", "label": "y".repeat(201) })).send().await.unwrap();
        assert_eq!(expect_error(resp, 400, "VALIDATION_FAILED").await["details"]["max_length"], 200);
        let resp = srv.post("/v1/destinations", json!({ "name": "n".repeat(201), "kind": "sqlite", "configuration": { "file": "w.db" } })).send().await.unwrap();
        expect_error(resp, 400, "VALIDATION_FAILED").await;
        // Anywhere else in a body: the backstop.
        let resp = srv.post("/v1/sources", json!({ "connector_id": "conn_emailcampaign_edm", "name": "s", "configuration": { "base_url": "z".repeat(70_000) } })).send().await.unwrap();
        expect_error(resp, 400, "VALIDATION_FAILED").await;
    }

    async fn entry_links_send_secrets_only_where_the_operator_allows(srv) {
        for hosts in [json!(["evil.example.com"]), json!(["internal.corp"])] {
            let resp = srv.post("/v1/credentials/entry-links", json!({ "hosts": hosts })).send().await.unwrap();
            let e = expect_error(resp, 400, "VALIDATION_FAILED").await;
            assert_eq!(e["details"]["field"], "hosts");
        }
        // A connector's link goes only where the connector goes.
        let resp = srv.post("/v1/credentials/entry-links", json!({ "hosts": ["team.mailcoach.app"], "connector_id": "conn_emailcampaign_edm" })).send().await.unwrap();
        let link = json_ok(resp).await;
        // The page names who asks, for which workspace.
        let page = srv.client.get(link["data"]["url"].as_str().unwrap()).send().await.unwrap();
        let html = page.text().await.unwrap();
        assert!(html.contains("admin@example.test") && html.contains("Default workspace") && html.contains("team.mailcoach.app"), "{html}");
    }

    async fn postgres_destination_urls_cannot_steer_the_connection(srv) {
        let create = |url: String, extra: Value| {
            let mut configuration = json!({ "url": url });
            if let (Value::Object(c), Value::Object(e)) = (&mut configuration, extra) {
                c.extend(e);
            }
            srv.post("/v1/destinations", json!({ "name": "pg", "kind": "postgres", "configuration": configuration })).send()
        };
        // Parameters that would pick another host, socket, password,
        // client key or server setting, and hosts written to sneak past.
        for url in [
            "postgres://loader@127.0.0.1/w?host=/var/run/postgresql",
            "postgres://loader@127.0.0.1/w?hostaddr=169.254.169.254",
            "postgres://loader@127.0.0.1/w?port=6432",
            "postgres://loader@127.0.0.1/w?password=guess",
            "postgres://loader@127.0.0.1/w?sslkey=/etc/ssl/private/server.key",
            "postgres://loader@127.0.0.1/w?options=-c%20search_path%3Devil",
            "postgres://loader@%2Fvar%2Frun%2Fpostgresql/w",
            "postgres://loader@127.0.0.1/w/x",
        ] {
            let e = expect_error(create(url.into(), json!({})).await.unwrap(), 400, "VALIDATION_FAILED").await;
            assert_eq!(e["details"]["field"], "configuration.url", "{url}: {e}");
        }
        // Hosts the operator did not allow: the metadata service, private
        // networks, names.
        for url in ["postgres://loader@169.254.169.254/w", "postgres://loader@10.0.0.5/w", "postgres://loader@db.internal.example/w", "postgres://loader@[::ffff:127.0.0.1]/w"] {
            expect_error(create(url.into(), json!({})).await.unwrap(), 400, "DESTINATION_HOST_NOT_ALLOWED").await;
        }
        // A stored password goes only over TLS that verifies the server.
        let cred = json_ok(srv.post("/v1/credentials", json!({ "hosts": ["127.0.0.1"], "secret": "db-password-123" })).send().await.unwrap()).await;
        let handle = cred["data"]["credential_handle"].clone();
        for mode in ["disable", "prefer", "require", "verify-ca"] {
            let resp = create(format!("postgres://loader@127.0.0.1/w?sslmode={mode}"), json!({ "credential_handle": handle })).await.unwrap();
            expect_error(resp, 400, "VALIDATION_FAILED").await;
        }
        let elsewhere = json_ok(srv.post("/v1/credentials", json!({ "hosts": ["::1"], "secret": "db-password-456" })).send().await.unwrap()).await;
        let resp = create("postgres://loader@127.0.0.1/w".into(), json!({ "credential_handle": elsewhere["data"]["credential_handle"] })).await.unwrap();
        expect_error(resp, 400, "CREDENTIAL_HOST_MISMATCH").await;
        // What the operator allows is accepted, and an update is held to
        // the same rules.
        let ok = json_ok(create("postgres://loader@127.0.0.1:5433/w".into(), json!({ "credential_handle": handle })).await.unwrap()).await;
        let id = ok["data"]["destination_id"].as_str().unwrap();
        let resp = srv.request(Method::PATCH, &format!("/v1/destinations/{id}")).json(&json!({ "configuration": { "url": "postgres://loader@127.0.0.1/w?host=evil.example" } })).send().await.unwrap();
        expect_error(resp, 400, "VALIDATION_FAILED").await;
    }

    async fn pages_refuse_framing_caching_and_sniffing(srv) {
        let ws = srv.workspace_id().await;
        let created = json_ok(invite(srv, &srv.admin_token, &ws, "framed@example.test", "viewer", &[]).await).await;
        let url = created["data"]["accept_url"].as_str().unwrap().to_owned();
        for (what, resp) in [("invitation", srv.client.get(&url).send().await.unwrap()), ("unknown link", srv.client.get(srv.url("/credential-entry/svc1_nothing")).send().await.unwrap())] {
            let h = resp.headers();
            let csp = h["content-security-policy"].to_str().unwrap();
            assert!(csp.contains("frame-ancestors 'none'") && csp.contains("default-src 'none'"), "{what}: {csp}");
            assert_eq!(h["cache-control"], "no-store", "{what}");
            assert_eq!(h["x-content-type-options"], "nosniff", "{what}");
            assert_eq!(h["x-frame-options"], "DENY", "{what}");
        }
        let api = srv.get("/v1/me").send().await.unwrap();
        assert_eq!(api.headers()["x-content-type-options"], "nosniff");
        assert_eq!(api.headers()["cache-control"], "no-store");
    }
}

/// A server whose limits are small enough to reach in a test.
async fn tight(adjust: impl FnOnce(&mut service::config::limits::ServerLimits)) -> TestServer {
    TestServer::start_with(Backend::Sqlite, |c| adjust(&mut c.limits)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_send_headers_slowly_are_cut_off() {
    let srv = tight(|l| l.header_read_timeout = Duration::from_secs(1)).await;
    let mut stream = tokio::net::TcpStream::connect(srv.base.trim_start_matches("http://")).await.unwrap();
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ").await.unwrap();
    let mut buf = [0u8; 1024];
    // A slowloris client never finishes its headers; the server hangs up.
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
        .await
        .expect("the server closed the connection");
    match read {
        Ok(0) | Err(_) => {}
        Ok(n) => assert!(
            String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 408"),
            "{}",
            String::from_utf8_lossy(&buf[..n])
        ),
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_are_refused() {
    let srv = tight(|l| l.max_connections = 2).await;
    let addr = srv.base.trim_start_matches("http://").to_owned();
    let held =
        [tokio::net::TcpStream::connect(&addr).await.unwrap(), tokio::net::TcpStream::connect(&addr).await.unwrap()];
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut third = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let _ = third.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n").await;
    let mut buf = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(10), third.read(&mut buf)).await.unwrap().unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer: {}", String::from_utf8_lossy(&buf[..n]));
    drop(held);
    let mut ok = false;
    for _ in 0..50 {
        if reqwest::get(srv.url("/healthz")).await.is_ok_and(|r| r.status().is_success()) {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "served again once connections closed");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_requests_get_429_with_retry_after() {
    use service::config::limits::Rate;
    let srv = tight(|l| l.throttle.per_session = Rate { per_second: 0.5, burst: 3.0 }).await;
    for _ in 0..3 {
        json_ok(srv.get("/v1/me").send().await.unwrap()).await;
    }
    let resp = srv.get("/v1/me").send().await.unwrap();
    let retry: u64 = resp.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry), "{retry}");
    expect_error(resp, 429, "RATE_LIMITED").await;
    // Another session is not held up by this one.
    json_ok(srv.request_as(&srv.approver_token, Method::GET, "/v1/me").send().await.unwrap()).await;
    srv.stop().await;

    let srv = tight(|l| l.throttle.per_address = Rate { per_second: 0.5, burst: 3.0 }).await;
    for _ in 0..3 {
        assert!(srv.client.get(srv.url("/healthz")).send().await.unwrap().status().is_success());
    }
    expect_error(srv.get("/v1/me").send().await.unwrap(), 429, "RATE_LIMITED").await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guessing_tokens_is_throttled_per_address_but_never_refuses_a_valid_token() {
    use service::config::limits::Rate;
    let srv = tight(|l| l.throttle.failures_per_address = Rate { per_second: 0.01, burst: 5.0 }).await;
    for i in 0..5 {
        expect_error(
            srv.request_as(&format!("svc_guess_{i}"), Method::GET, "/v1/me").send().await.unwrap(),
            401,
            "401",
        )
        .await;
    }
    let resp = srv.request_as("svc_guess_next", Method::GET, "/v1/me").send().await.unwrap();
    assert!(resp.headers().contains_key("retry-after"));
    expect_error(resp, 429, "RATE_LIMITED").await;
    // The guesser's address is out of guesses; a person at the same address
    // (behind the same proxy, say) with a right token is not locked out.
    json_ok(srv.get("/v1/me").send().await.unwrap()).await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_one_time_records_are_swept() {
    let srv = TestServer::start(Backend::Sqlite).await.unwrap();
    let ws = srv.workspace_id().await;
    let path = format!("/v1/workspaces/{ws}/members/invitations");
    json_ok(
        srv.post(&path, json!({ "email": "fresh@example.test", "role": "viewer" }))
            .header("idempotency-key", "fresh")
            .send()
            .await
            .unwrap(),
    )
    .await;
    json_ok(
        srv.post(&path, json!({ "email": "stale@example.test", "role": "viewer" }))
            .header("idempotency-key", "stale")
            .send()
            .await
            .unwrap(),
    )
    .await;
    let count = |key: &'static str| {
        let url = srv.state.config.database_url.clone();
        async move {
            use sqlx::{Connection, Row};
            sqlx::any::install_default_drivers();
            let mut c = sqlx::AnyConnection::connect(&url).await.unwrap();
            sqlx::query("SELECT COUNT(*) FROM idempotency_keys WHERE idem_key = $1")
                .bind(key)
                .fetch_one(&mut c)
                .await
                .unwrap()
                .get::<i64, _>(0)
        }
    };
    {
        use sqlx::Connection;
        let mut c = sqlx::AnyConnection::connect(&srv.state.config.database_url).await.unwrap();
        sqlx::query("UPDATE idempotency_keys SET created_at = created_at - 172800000 WHERE idem_key = 'stale'")
            .execute(&mut c)
            .await
            .unwrap();
    }
    assert!(srv.state.store.sweep_expired(service::store::now_ms()).await.unwrap() >= 1);
    assert_eq!(count("stale").await, 0, "a day-old record is gone");
    assert_eq!(count("fresh").await, 1, "a fresh one stays");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_fingerprints_are_keyed_by_the_installation() {
    let mut hashes = Vec::new();
    for _ in 0..2 {
        // Each installation with a master key of its own (in its data directory).
        let srv = TestServer::start_with(Backend::Sqlite, |c| c.master_key = None).await.unwrap();
        // The same request on two installations (two master keys).
        let path = "/v1/credentials/entry-links";
        json_ok(
            srv.post(path, json!({ "hosts": ["team.mailcoach.app"] }))
                .header("idempotency-key", "k")
                .send()
                .await
                .unwrap(),
        )
        .await;
        use sqlx::{Connection, Row};
        let mut c = sqlx::AnyConnection::connect(&srv.state.config.database_url).await.unwrap();
        hashes.push(
            sqlx::query("SELECT request_hash FROM idempotency_keys")
                .fetch_one(&mut c)
                .await
                .unwrap()
                .get::<String, _>(0),
        );
        srv.stop().await;
    }
    assert_ne!(hashes[0], hashes[1], "a stored fingerprint cannot be recomputed without the installation's key");
}
