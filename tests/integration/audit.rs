//! The audit log (issue: every state-changing request writes a record).

use reqwest::Method;
use serde_json::json;
use service::access::Role;

use crate::backend_tests;
use crate::support::{expect_error, json_ok};

backend_tests! {
    async fn every_write_is_recorded_with_client_source_and_outcome(srv) {
        let ws = srv.workspace_id().await;
        let resp = srv
            .post(&format!("/v1/workspaces/{ws}/members/invitations"), json!({"email": "a@example.test", "role": "viewer"}))
            .header("x-service-client", "cli")
            .send()
            .await
            .unwrap();
        let request_id = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
        let inv = json_ok(resp).await;
        let accept_url = inv["data"]["accept_url"].as_str().unwrap().to_owned();
        let invite_token = accept_url.rsplit('/').next().unwrap().to_owned();

        // A denied write is recorded too.
        let (viewer_id, viewer) = srv.user_in(&ws, Role::Viewer).await;
        let resp = srv
            .request_as(&viewer, Method::POST, &format!("/v1/workspaces/{ws}/members/invitations"))
            .header("x-service-client", "mcp")
            .json(&json!({"email": "b@example.test", "role": "viewer"}))
            .send()
            .await
            .unwrap();
        expect_error(resp, 403, "403").await;

        let logs = json_ok(srv.get("/v1/audit-logs").send().await.unwrap()).await;
        let items = logs["data"]["items"].as_array().unwrap();
        assert_eq!(items.len(), 2, "{logs}");
        // Newest first.
        let denied = &items[0];
        assert_eq!(denied["action"], "members.invite");
        assert_eq!(denied["outcome"], "denied");
        assert_eq!(denied["client_source"], "mcp");
        assert_eq!(denied["actor_user_id"], viewer_id.as_str());
        assert_eq!(denied["status_code"], 403);
        let ok = &items[1];
        assert_eq!(ok["action"], "members.invite");
        assert_eq!(ok["outcome"], "succeeded");
        assert_eq!(ok["client_source"], "cli");
        assert_eq!(ok["request_id"], request_id.as_str());
        assert_eq!(ok["workspace_id"], ws.as_str());
        assert_eq!(ok["target_type"], "invitation");
        assert_eq!(ok["target_id"], inv["data"]["invitation_id"]);
        assert!(ok["created_at"].is_string());
        // No secret: the invitation token is nowhere in the log.
        assert!(!logs.to_string().contains(&invite_token));
    }

    async fn audit_logs_filter_by_action_client_actor_and_time(srv) {
        let ws = srv.workspace_id().await;
        for client in ["api", "cli", "mcp"] {
            srv.post(&format!("/v1/workspaces/{ws}/members/invitations"), json!({"email": format!("{client}@example.test"), "role": "viewer"}))
                .header("x-service-client", client)
                .send()
                .await
                .unwrap();
        }
        let (_, editor) = srv.user_in(&ws, Role::Editor).await;
        srv.request_as(&editor, Method::POST, "/v1/sessions/ses_missing/revoke").send().await.unwrap();

        let only_cli = json_ok(srv.get("/v1/audit-logs?client_source=cli").send().await.unwrap()).await;
        assert_eq!(only_cli["data"]["items"].as_array().unwrap().len(), 1);
        let invites = json_ok(srv.get("/v1/audit-logs?action=members.invite").send().await.unwrap()).await;
        assert_eq!(invites["data"]["items"].as_array().unwrap().len(), 3);
        let me = json_ok(srv.get("/v1/me").send().await.unwrap()).await;
        let admin_id = me["data"]["user"]["user_id"].as_str().unwrap();
        let by_admin = json_ok(srv.get(&format!("/v1/audit-logs?actor={admin_id}")).send().await.unwrap()).await;
        assert_eq!(by_admin["data"]["items"].as_array().unwrap().len(), 3);
        let denied = json_ok(srv.get("/v1/audit-logs?outcome=denied").send().await.unwrap()).await;
        assert_eq!(denied["data"]["items"][0]["action"], "sessions.revoke");
        let future = json_ok(srv.get("/v1/audit-logs?since=2999-01-01T00:00:00Z").send().await.unwrap()).await;
        assert!(future["data"]["items"].as_array().unwrap().is_empty());
        let past = json_ok(srv.get("/v1/audit-logs?until=2000-01-01T00:00:00Z").send().await.unwrap()).await;
        assert!(past["data"]["items"].as_array().unwrap().is_empty());
        expect_error(srv.get("/v1/audit-logs?since=yesterday").send().await.unwrap(), 400, "VALIDATION_FAILED").await;
        expect_error(srv.get("/v1/audit-logs?client_source=fax").send().await.unwrap(), 400, "VALIDATION_FAILED").await;

        // A non-administrator sees only their own records.
        let own = json_ok(srv.request_as(&editor, Method::GET, "/v1/audit-logs").send().await.unwrap()).await;
        assert_eq!(own["data"]["items"].as_array().unwrap().len(), 1);
        let resp = srv.request_as(&editor, Method::GET, &format!("/v1/audit-logs?actor={admin_id}")).send().await.unwrap();
        expect_error(resp, 403, "403").await;
    }
}
