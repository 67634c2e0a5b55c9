//! Sessions: listing and revocation (spec section 5, "Sessions").

use reqwest::Method;
use serde_json::Value;
use service::access::Role;

use crate::backend_tests;
use crate::support::{expect_error, json_ok};

backend_tests! {
    async fn revocation_takes_effect_on_the_next_request(srv) {
        let ws = srv.workspace_id().await;
        let (user_id, token) = srv.user_in(&ws, Role::Editor).await;
        json_ok(srv.request_as(&token, Method::GET, "/v1/me").send().await.unwrap()).await;

        let list = json_ok(srv.get(&format!("/v1/sessions?user_id={user_id}")).send().await.unwrap()).await;
        let sessions = list["data"]["items"].as_array().unwrap();
        assert_eq!(sessions.len(), 1);
        let session = &sessions[0];
        assert_eq!(session["kind"], "api_token");
        assert!(session.get("token").is_none() && session.get("token_hash").is_none(), "{session}");
        let id = session["session_id"].as_str().unwrap();

        let revoked = json_ok(srv.request(Method::POST, &format!("/v1/sessions/{id}/revoke")).send().await.unwrap()).await;
        assert_eq!(revoked["data"]["revoked"], true);
        assert!(revoked["data"]["session"]["revoked_at"].is_string());
        expect_error(srv.request_as(&token, Method::GET, "/v1/me").send().await.unwrap(), 401, "401").await;

        // Revoked sessions are hidden unless asked for.
        let list = json_ok(srv.get(&format!("/v1/sessions?user_id={user_id}")).send().await.unwrap()).await;
        assert!(list["data"]["items"].as_array().unwrap().is_empty());
        let list = json_ok(srv.get(&format!("/v1/sessions?user_id={user_id}&include_revoked=true")).send().await.unwrap()).await;
        assert_eq!(list["data"]["items"].as_array().unwrap().len(), 1);
    }

    async fn sessions_of_other_workspaces_are_invisible(srv) {
        let (_, other_admin) = srv.other_workspace().await;
        let me = json_ok(srv.request_as(&other_admin, Method::GET, "/v1/me").send().await.unwrap()).await;
        let foreign_session = me["data"]["session_id"].as_str().unwrap().to_owned();
        let list = json_ok(srv.get("/v1/sessions?limit=200").send().await.unwrap()).await;
        let ids: Vec<&Value> = list["data"]["items"].as_array().unwrap().iter().map(|s| &s["session_id"]).collect();
        assert!(!ids.iter().any(|id| *id == foreign_session.as_str()));
        let resp = srv.request(Method::POST, &format!("/v1/sessions/{foreign_session}/revoke")).send().await.unwrap();
        expect_error(resp, 404, "404").await;
        json_ok(srv.request_as(&other_admin, Method::GET, "/v1/me").send().await.unwrap()).await;
    }

    async fn anyone_signs_themselves_out_but_nobody_else(srv) {
        let ws = srv.workspace_id().await;
        let (_, viewer) = srv.user_in(&ws, Role::Viewer).await;
        let own = json_ok(srv.request_as(&viewer, Method::GET, "/v1/me").send().await.unwrap()).await["data"]["session_id"].as_str().unwrap().to_owned();
        let admins = json_ok(srv.get("/v1/me").send().await.unwrap()).await["data"]["session_id"].as_str().unwrap().to_owned();
        let resp = srv.request_as(&viewer, Method::POST, &format!("/v1/sessions/{admins}/revoke")).send().await.unwrap();
        assert!(matches!(resp.status().as_u16(), 403 | 404), "a viewer revokes nobody else's session");
        json_ok(srv.get("/v1/me").send().await.unwrap()).await;
        let revoked = json_ok(srv.request_as(&viewer, Method::POST, &format!("/v1/sessions/{own}/revoke")).send().await.unwrap()).await;
        assert_eq!(revoked["data"]["revoked"], true);
        expect_error(srv.request_as(&viewer, Method::GET, "/v1/me").send().await.unwrap(), 401, "401").await;
    }

    async fn session_metadata_records_use(srv) {
        let me = json_ok(srv.get("/v1/me").send().await.unwrap()).await;
        let session_id = me["data"]["session_id"].clone();
        // last_used_at is written in the background; give it a moment.
        let mut last_used = Value::Null;
        for _ in 0..50 {
            let list = json_ok(srv.get("/v1/sessions").send().await.unwrap()).await;
            let mine = list["data"]["items"].as_array().unwrap().iter().find(|s| s["session_id"] == session_id).cloned().unwrap();
            last_used = mine["last_used_at"].clone();
            if last_used.is_string() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(last_used.is_string(), "last_used_at recorded");
    }
}
