//! The approval gate (spec section 4, "Approvals" and "Safety model").

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use service::access::Role;

use crate::backend_tests;
use crate::support::{TestServer, expect_error, json, json_ok};

async fn invite(srv: &TestServer, token: &str, ws: &str, email: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = srv
        .request_as(token, Method::POST, &format!("/v1/workspaces/{ws}/members/invitations"))
        .json(&json!({"email": email, "role": "viewer"}));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

async fn invitation_count(srv: &TestServer) -> usize {
    let logs = json_ok(srv.get("/v1/audit-logs?action=members.invite&outcome=succeeded").send().await.unwrap()).await;
    logs["data"]["items"].as_array().unwrap().len()
}

backend_tests! {
    async fn proposal_header_always_returns_a_pending_proposal_and_changes_nothing(srv) {
        let ws = srv.workspace_id().await;
        let resp = invite(srv, &srv.admin_token, &ws, "p@example.test", &[("x-service-execution-mode", "proposal"), ("x-service-client", "cli")]).await;
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        let body = json_ok(resp).await;
        let approval = &body["data"]["approval"];
        assert_eq!(approval["status"], "pending");
        assert_eq!(approval["category"], "workspace_admin");
        assert_eq!(approval["action"], "members.invite");
        assert_eq!(approval["client_source"], "cli");
        assert!(approval["summary"].as_str().unwrap().contains("p@example.test"));
        assert_eq!(approval["operation"]["operation"], "invite_member");
        assert_eq!(approval["operation"]["email"], "p@example.test");
        assert_eq!(invitation_count(srv).await, 0, "nothing executed");
        let proposed = json_ok(srv.get("/v1/audit-logs?outcome=proposed").send().await.unwrap()).await;
        assert_eq!(proposed["data"]["items"][0]["approval_id"], approval["approval_id"]);
        expect_error(invite(srv, &srv.admin_token, &ws, "p@example.test", &[("x-service-execution-mode", "later")]).await, 400, "INVALID_EXECUTION_MODE").await;
    }

    async fn mcp_writes_are_proposals_by_default_until_the_policy_says_otherwise(srv) {
        let ws = srv.workspace_id().await;
        let resp = invite(srv, &srv.admin_token, &ws, "m@example.test", &[("x-service-client", "mcp")]).await;
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        assert_eq!(invitation_count(srv).await, 0);

        let policies = json_ok(srv.get("/v1/approval-policies").send().await.unwrap()).await;
        let p = &policies["data"]["items"][0];
        assert_eq!(p["category"], "workspace_admin");
        assert_eq!(p["requires_approval"], true);
        assert_eq!(p["approver_role"], "administrator");

        // An MCP client cannot switch its own guard off.
        let resp = srv.request(Method::PATCH, "/v1/approval-policies/workspace_admin").header("x-service-client", "mcp").json(&json!({"requires_approval": false})).send().await.unwrap();
        expect_error(resp, 403, "403").await;
        // A non-administrator cannot either.
        let (_, editor) = srv.user_in(&ws, Role::Editor).await;
        let resp = srv.request_as(&editor, Method::PATCH, "/v1/approval-policies/workspace_admin").json(&json!({"requires_approval": false})).send().await.unwrap();
        let body = expect_error(resp, 403, "403").await;
        assert!(body["message"].as_str().unwrap().contains("permission denied"));
        expect_error(srv.request_as(&editor, Method::GET, "/v1/approval-policies").send().await.unwrap(), 403, "403").await;
        expect_error(srv.request(Method::PATCH, "/v1/approval-policies/no_such_category").json(&json!({"requires_approval": false})).send().await.unwrap(), 404, "404").await;

        let updated = json_ok(srv.request(Method::PATCH, "/v1/approval-policies/workspace_admin").json(&json!({"requires_approval": false})).send().await.unwrap()).await;
        assert_eq!(updated["data"]["requires_approval"], false);
        assert_eq!(updated["data"]["customised"], true);
        let resp = invite(srv, &srv.admin_token, &ws, "m2@example.test", &[("x-service-client", "mcp")]).await;
        assert_eq!(resp.status(), StatusCode::CREATED);
        assert_eq!(invitation_count(srv).await, 1);
        // The explicit proposal header still wins.
        let resp = invite(srv, &srv.admin_token, &ws, "m3@example.test", &[("x-service-client", "mcp"), ("x-service-execution-mode", "proposal")]).await;
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
    }

    async fn approving_executes_exactly_once_and_links_the_audit_record(srv) {
        let ws = srv.workspace_id().await;
        let body = json_ok(invite(srv, &srv.admin_token, &ws, "once@example.test", &[("x-service-client", "mcp")]).await).await;
        let id = body["data"]["approval"]["approval_id"].as_str().unwrap().to_owned();

        // Ten approvers click at once: one execution.
        let mut handles = Vec::new();
        for _ in 0..10 {
            let req = srv.request_as(&srv.approver_token, Method::POST, &format!("/v1/approvals/{id}/approve"));
            handles.push(tokio::spawn(async move { req.send().await.unwrap() }));
        }
        let mut oks = Vec::new();
        let mut conflicts = 0;
        for h in handles {
            let resp = h.await.unwrap();
            match resp.status() {
                StatusCode::CREATED => oks.push(json(resp).await.1),
                StatusCode::CONFLICT => {
                    let (_, b) = json(resp).await;
                    assert_eq!(b["code"], "APPROVAL_NOT_PENDING", "{b}");
                    conflicts += 1;
                }
                other => panic!("unexpected {other}"),
            }
        }
        assert_eq!(oks.len(), 1);
        assert_eq!(conflicts, 9);
        let done = &oks[0]["data"];
        assert_eq!(done["approval"]["status"], "executed");
        assert_eq!(done["result"]["email"], "once@example.test");
        assert!(done["result"]["accept_url"].is_string());
        assert_eq!(invitation_count(srv).await, 1);

        let logs = json_ok(srv.get("/v1/audit-logs?action=approvals.approve&outcome=succeeded").send().await.unwrap()).await;
        let rec = &logs["data"]["items"][0];
        assert_eq!(rec["approval_id"], id.as_str());
        let exec = json_ok(srv.get("/v1/audit-logs?action=members.invite&outcome=succeeded").send().await.unwrap()).await;
        let exec = &exec["data"]["items"][0];
        assert_eq!(exec["approval_id"], id.as_str(), "the executed operation links to its approval");
        assert_eq!(exec["client_source"], "mcp", "recorded with the proposing client");
        assert_eq!(exec["target_type"], "invitation");
        let listed = json_ok(srv.get("/v1/approvals?status=executed&client_source=mcp").send().await.unwrap()).await;
        assert_eq!(listed["data"]["items"][0]["approval_id"], id.as_str());
        assert_eq!(listed["data"]["items"][0]["result"]["status"], 201);

        // Rejecting after approving: 409, nothing changes.
        let resp = srv.request_as(&srv.approver_token, Method::POST, &format!("/v1/approvals/{id}/reject")).send().await.unwrap();
        let b = expect_error(resp, 409, "APPROVAL_NOT_PENDING").await;
        assert_eq!(b["details"]["status"], "executed");
    }

    async fn rejected_and_expired_proposals_execute_nothing(srv) {
        let ws = srv.workspace_id().await;
        let body = json_ok(invite(srv, &srv.admin_token, &ws, "r@example.test", &[("x-service-execution-mode", "proposal")]).await).await;
        let id = body["data"]["approval"]["approval_id"].as_str().unwrap().to_owned();
        let rejected = json_ok(srv.request_as(&srv.approver_token, Method::POST, &format!("/v1/approvals/{id}/reject")).send().await.unwrap()).await;
        assert_eq!(rejected["data"]["approval"]["status"], "rejected");
        let b = expect_error(srv.request_as(&srv.approver_token, Method::POST, &format!("/v1/approvals/{id}/approve")).send().await.unwrap(), 409, "APPROVAL_NOT_PENDING").await;
        assert_eq!(b["details"]["status"], "rejected");

        let me = json_ok(srv.get("/v1/me").send().await.unwrap()).await;
        let admin_id = me["data"]["user"]["user_id"].as_str().unwrap();
        let op = json!({"operation": "invite_member", "email": "late@example.test", "role": "viewer"});
        let expired = srv
            .state
            .store
            .create_approval(service::store::approvals::NewApproval {
                workspace_id: &ws,
                category: "workspace_admin",
                action: "members.invite",
                summary: "Invite late@example.test",
                operation: &op,
                proposed_by: admin_id,
                proposed_session: "ses_x",
                client_source: service::access::ClientSource::Mcp,
                request_id: "00000000-0000-0000-0000-000000000000",
                expires_at: service::store::now_ms() - 1,
            })
            .await
            .unwrap();
        let listed = json_ok(srv.get("/v1/approvals?status=expired").send().await.unwrap()).await;
        assert_eq!(listed["data"]["items"][0]["approval_id"], expired.approval_id.as_str());
        let resp = srv.request_as(&srv.approver_token, Method::POST, &format!("/v1/approvals/{}/approve", expired.approval_id)).send().await.unwrap();
        expect_error(resp, 409, "APPROVAL_EXPIRED").await;
        assert_eq!(invitation_count(srv).await, 0);
        expect_error(srv.request(Method::POST, "/v1/approvals/apr_missing/approve").send().await.unwrap(), 404, "404").await;
    }

    async fn who_may_approve_is_a_workspace_setting_and_mcp_may_not_decide(srv) {
        let ws = srv.workspace_id().await;
        let (_, editor) = srv.user_in(&ws, Role::Editor).await;
        let body = json_ok(invite(srv, &srv.admin_token, &ws, "e@example.test", &[("x-service-execution-mode", "proposal")]).await).await;
        let id = body["data"]["approval"]["approval_id"].as_str().unwrap().to_owned();
        expect_error(srv.request_as(&editor, Method::POST, &format!("/v1/approvals/{id}/approve")).send().await.unwrap(), 403, "403").await;
        let resp = srv.request_as(&srv.approver_token, Method::POST, &format!("/v1/approvals/{id}/approve")).header("x-service-client", "mcp").send().await.unwrap();
        expect_error(resp, 403, "403").await;

        json_ok(srv.request(Method::PATCH, "/v1/approval-policies/workspace_admin").json(&json!({"approver_role": "editor"})).send().await.unwrap()).await;
        // The editor may now decide, but the execution runs as the proposer
        // (an administrator), so the invitation is made.
        let resp = srv.request_as(&editor, Method::POST, &format!("/v1/approvals/{id}/approve")).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED);
        expect_error(srv.request(Method::PATCH, "/v1/approval-policies/workspace_admin").json(&json!({"approver_role": "viewer"})).send().await.unwrap(), 400, "VALIDATION_FAILED").await;
    }

    async fn a_failing_execution_returns_its_error_and_marks_the_proposal_failed(srv) {
        let ws = srv.workspace_id().await;
        let members = json_ok(srv.get(&format!("/v1/workspaces/{ws}/members")).send().await.unwrap()).await;
        let admin_member = members["data"]["items"][0]["member_id"].as_str().unwrap().to_owned();
        let resp = srv
            .request(Method::DELETE, &format!("/v1/workspaces/{ws}/members/{admin_member}"))
            .header("x-service-execution-mode", "proposal")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        let id = json_ok(resp).await["data"]["approval"]["approval_id"].as_str().unwrap().to_owned();
        let b = expect_error(srv.request_as(&srv.approver_token, Method::POST, &format!("/v1/approvals/{id}/approve")).send().await.unwrap(), 409, "LAST_ADMINISTRATOR").await;
        assert_eq!(b["details"]["approval_id"], id.as_str());
        let a = json_ok(srv.get("/v1/approvals?status=failed").send().await.unwrap()).await;
        let item: &Value = &a["data"]["items"][0];
        assert_eq!(item["approval_id"], id.as_str());
        assert_eq!(item["result"]["body"]["code"], "LAST_ADMINISTRATOR");
    }
}
