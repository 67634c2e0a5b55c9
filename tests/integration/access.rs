//! Roles and workspace isolation (issue: roles per workspace; spec 7).

use reqwest::Method;
use serde_json::json;
use service::access::Role;

use crate::backend_tests;
use crate::support::{expect_error, json_ok};

backend_tests! {
    async fn viewer_and_editor_get_403_permission_denied_for_admin_operations(srv) {
        let ws = srv.workspace_id().await;
        for role in [Role::Viewer, Role::Editor] {
            let (_, token) = srv.user_in(&ws, role).await;
            let resp = srv
                .request_as(&token, Method::POST, &format!("/v1/workspaces/{ws}/members/invitations"))
                .json(&json!({"email": "x@example.test", "role": "viewer"}))
                .send()
                .await
                .unwrap();
            let body = expect_error(resp, 403, "403").await;
            assert!(body["message"].as_str().unwrap().contains("permission denied"));
            expect_error(srv.request_as(&token, Method::GET, "/v1/approval-policies").send().await.unwrap(), 403, "403").await;
            // Sessions: each member sees their own, and no one else's.
            let own = json_ok(srv.request_as(&token, Method::GET, "/v1/sessions").send().await.unwrap()).await;
            let items = own["data"]["items"].as_array().unwrap();
            assert_eq!(items.len(), 1, "{own}");
            // Reading members is open to every member.
            json_ok(srv.request_as(&token, Method::GET, &format!("/v1/workspaces/{ws}/members")).send().await.unwrap()).await;
        }
    }

    async fn another_workspace_answers_404_like_a_missing_one(srv) {
        let (other_ws, _) = srv.other_workspace().await;
        let missing = expect_error(srv.get("/v1/workspaces/ws_doesnotexist/members").send().await.unwrap(), 404, "404").await;
        let foreign = expect_error(srv.get(&format!("/v1/workspaces/{other_ws}/members")).send().await.unwrap(), 404, "404").await;
        assert_eq!(missing["message"], foreign["message"]);
        // The same through the header and the query parameter.
        expect_error(srv.get("/v1/sessions").header("x-service-workspace", &other_ws).send().await.unwrap(), 404, "404").await;
        expect_error(srv.get(&format!("/v1/audit-logs?workspace_id={other_ws}")).send().await.unwrap(), 404, "404").await;
        let resp = srv.post(&format!("/v1/workspaces/{other_ws}/members/invitations"), json!({"email": "x@example.test", "role": "viewer"})).send().await.unwrap();
        expect_error(resp, 404, "404").await;
    }

    async fn workspace_selection_header_picks_among_own_workspaces(srv) {
        let (other_ws, other_admin) = srv.other_workspace().await;
        // The other administrator is also a viewer in the first workspace.
        let ws = srv.workspace_id().await;
        let me = json_ok(srv.request_as(&other_admin, Method::GET, "/v1/me").send().await.unwrap()).await;
        let user_id = me["data"]["user"]["user_id"].as_str().unwrap().to_owned();
        srv.state.store.add_member(&ws, &user_id, Role::Viewer).await.unwrap();
        // Default workspace: the oldest membership (the other workspace, as administrator).
        json_ok(srv.request_as(&other_admin, Method::GET, "/v1/approval-policies").send().await.unwrap()).await;
        // Selecting the first workspace, where they are a viewer: 403.
        let resp = srv.request_as(&other_admin, Method::GET, "/v1/approval-policies").header("x-service-workspace", &ws).send().await.unwrap();
        expect_error(resp, 403, "403").await;
        let list = json_ok(srv.request_as(&other_admin, Method::GET, "/v1/workspaces").send().await.unwrap()).await;
        let ids: Vec<_> = list["data"]["items"].as_array().unwrap().iter().map(|w| w["workspace_id"].as_str().unwrap().to_owned()).collect();
        assert_eq!(ids, vec![other_ws, ws]);
    }

    async fn me_reflects_membership_changes_at_once(srv) {
        let ws = srv.workspace_id().await;
        let (user_id, token) = srv.user_in(&ws, Role::Viewer).await;
        let me = json_ok(srv.request_as(&token, Method::GET, "/v1/me").send().await.unwrap()).await;
        assert_eq!(me["data"]["workspaces"].as_array().unwrap().len(), 1);
        let members = json_ok(srv.get(&format!("/v1/workspaces/{ws}/members")).send().await.unwrap()).await;
        let member = members["data"]["items"].as_array().unwrap().iter().find(|m| m["user_id"] == user_id.as_str()).unwrap()["member_id"].as_str().unwrap().to_owned();
        json_ok(srv.request(Method::DELETE, &format!("/v1/workspaces/{ws}/members/{member}")).send().await.unwrap()).await;
        let me = json_ok(srv.request_as(&token, Method::GET, "/v1/me").send().await.unwrap()).await;
        assert!(me["data"]["workspaces"].as_array().unwrap().is_empty(), "{me}");
        assert!(me["data"]["default_workspace_id"].is_null());
    }
}
