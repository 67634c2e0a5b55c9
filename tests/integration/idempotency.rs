//! `Idempotency-Key` on POST.

use reqwest::StatusCode;
use serde_json::json;

use crate::backend_tests;
use crate::support::{expect_error, json, json_ok};

backend_tests! {
    async fn same_key_same_body_replays_the_first_response(srv) {
        let ws = srv.workspace_id().await;
        let path = format!("/v1/workspaces/{ws}/members/invitations");
        let body = json!({"email": "once@example.test", "role": "viewer"});
        let first = srv.post(&path, body.clone()).header("idempotency-key", "k-1").send().await.unwrap();
        assert_eq!(first.status(), StatusCode::CREATED);
        let first_header = first.headers()["x-request-id"].to_str().unwrap().to_owned();
        let first = json_ok(first).await;
        assert_eq!(first["request_id"], first_header.as_str());
        let second = srv.post(&path, body.clone()).header("idempotency-key", "k-1").send().await.unwrap();
        assert_eq!(second.status(), StatusCode::CREATED);
        assert_eq!(second.headers()["idempotent-replayed"], "true");
        assert_eq!(second.headers()["x-request-id"], first_header.as_str(), "the replay names the request it first answered");
        let (_, second) = json(second).await;
        let mut expected = first.clone();
        expected["data"]["accept_url"] = json!(service::ops::SHOWN_ONCE);
        assert_eq!(second, expected, "the replay is the first response, without its one-time link");
        // Only one invitation was made, and one audit record.
        let logs = json_ok(srv.get("/v1/audit-logs?action=members.invite").send().await.unwrap()).await;
        assert_eq!(logs["data"]["items"].as_array().unwrap().len(), 1);
        // Without a key, the same body makes a second invitation.
        let third = json_ok(srv.post(&path, body).send().await.unwrap()).await;
        assert_ne!(third["data"]["invitation_id"], first["data"]["invitation_id"]);
    }

    async fn same_key_different_body_is_refused(srv) {
        let ws = srv.workspace_id().await;
        let path = format!("/v1/workspaces/{ws}/members/invitations");
        json_ok(srv.post(&path, json!({"email": "a@example.test", "role": "viewer"})).header("idempotency-key", "k-2").send().await.unwrap()).await;
        let resp = srv.post(&path, json!({"email": "b@example.test", "role": "viewer"})).header("idempotency-key", "k-2").send().await.unwrap();
        expect_error(resp, 422, "IDEMPOTENCY_KEY_REUSED").await;
        let logs = json_ok(srv.get("/v1/audit-logs?action=members.invite").send().await.unwrap()).await;
        assert_eq!(logs["data"]["items"].as_array().unwrap().len(), 1);
    }

    async fn keys_are_per_user_and_client_errors_are_replayed_too(srv) {
        let ws = srv.workspace_id().await;
        let path = format!("/v1/workspaces/{ws}/members/invitations");
        let bad = json!({"email": "not-an-address", "role": "viewer"});
        expect_error(srv.post(&path, bad.clone()).header("idempotency-key", "k-3").send().await.unwrap(), 400, "VALIDATION_FAILED").await;
        let replay = srv.post(&path, bad).header("idempotency-key", "k-3").send().await.unwrap();
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(replay.status(), StatusCode::BAD_REQUEST);
        // Another user's identical key is independent.
        let (_, other_admin) = srv.user_in(&ws, service::access::Role::Administrator).await;
        let resp = srv
            .request_as(&other_admin, reqwest::Method::POST, &path)
            .header("idempotency-key", "k-3")
            .json(&json!({"email": "c@example.test", "role": "viewer"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED);
        expect_error(srv.post(&path, json!({})).header("idempotency-key", "").send().await.unwrap(), 400, "VALIDATION_FAILED").await;
    }
}
