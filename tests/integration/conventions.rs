//! Conventions every endpoint shares (spec sections 1, 7, 9).

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::backend_tests;
use crate::support::{expect_error, json, json_ok};

backend_tests! {
    async fn success_envelope_carries_request_id_matching_header(srv) {
        let resp = srv.get("/v1/me").send().await.unwrap();
        let header = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
        let body = json_ok(resp).await;
        assert_eq!(body["request_id"], header.as_str());
        assert!(uuid::Uuid::parse_str(&header).is_ok());
        assert_eq!(body["data"]["user"]["email"], "admin@example.test");
        assert_eq!(body["data"]["workspaces"][0]["role"], "administrator");
        assert_eq!(body.as_object().unwrap().len(), 2, "only request_id and data: {body}");
    }

    async fn missing_or_bad_token_is_401_in_error_shape(srv) {
        let resp = srv.client.get(srv.url("/v1/me")).send().await.unwrap();
        expect_error(resp, 401, "401").await;
        let resp = srv.request_as("svc_not_a_real_token", Method::GET, "/v1/me").send().await.unwrap();
        expect_error(resp, 401, "401").await;
        let resp = srv.client.get(srv.url("/v1/workspaces")).header("authorization", "Basic YWRtaW46YWRtaW4=").send().await.unwrap();
        expect_error(resp, 401, "401").await;
    }

    async fn unknown_route_and_wrong_method_use_error_shape(srv) {
        expect_error(srv.get("/v1/no-such-thing").send().await.unwrap(), 404, "404").await;
        expect_error(srv.get("/nothing-here").send().await.unwrap(), 404, "404").await;
        expect_error(srv.request(Method::PUT, "/v1/me").send().await.unwrap(), 405, "405").await;
    }

    async fn malformed_bodies_are_400_with_clear_codes(srv) {
        let ws = srv.workspace_id().await;
        let path = format!("/v1/workspaces/{ws}/members/invitations");
        let resp = srv.request(Method::POST, &path).header("content-type", "application/json").body("{not json").send().await.unwrap();
        expect_error(resp, 400, "MALFORMED_JSON").await;
        let resp = srv.post(&path, json!({"email": "a@example.test", "role": "viewer", "colour": "blue"})).send().await.unwrap();
        let body = expect_error(resp, 400, "VALIDATION_FAILED").await;
        assert_eq!(body["details"]["field"], "colour");
        let resp = srv.post(&path, json!({"email": 42, "role": "viewer"})).send().await.unwrap();
        expect_error(resp, 400, "VALIDATION_FAILED").await;
        let resp = srv.post(&path, json!({"email": "a@example.test", "role": "owner"})).send().await.unwrap();
        expect_error(resp, 400, "VALIDATION_FAILED").await;
        let resp = srv.request(Method::POST, &path).body("email=a").header("content-type", "text/plain").send().await.unwrap();
        expect_error(resp, 415, "UNSUPPORTED_MEDIA_TYPE").await;
    }

    async fn oversized_body_is_413(srv) {
        let ws = srv.workspace_id().await;
        let big = "x".repeat(2 * 1024 * 1024);
        let resp = srv.post(&format!("/v1/workspaces/{ws}/members/invitations"), json!({"email": big, "role": "viewer"})).send().await.unwrap();
        expect_error(resp, 413, "PAYLOAD_TOO_LARGE").await;
    }

    async fn unknown_client_source_is_400(srv) {
        let resp = srv.get("/v1/me").header("x-service-client", "browser").send().await.unwrap();
        let body = expect_error(resp, 400, "INVALID_CLIENT_SOURCE").await;
        assert_eq!(body["details"]["header"], "X-Service-Client");
        for ok in ["api", "cli", "mcp"] {
            let resp = srv.get("/v1/me").header("x-service-client", ok).send().await.unwrap();
            let body = json_ok(resp).await;
            assert_eq!(body["data"]["client_source"], ok);
        }
    }

    async fn secret_shaped_input_is_refused_and_nothing_stored(srv) {
        let ws = srv.workspace_id().await;
        // Values no id or message could hold by chance (a three-letter one
        // would turn up in a random request id now and then).
        for (field, value) in [
            ("password", "hunter2-correct-horse"),
            ("client_secret", "client-secret-of-the-test"),
            ("apiKey", "api-key-of-the-test"),
            ("access_token", "access-token-of-the-test"),
        ] {
            let resp = srv
                .post(&format!("/v1/workspaces/{ws}/members/invitations"), json!({"email": "s@example.test", "role": "viewer", field: value}))
                .send()
                .await
                .unwrap();
            let body = expect_error(resp, 400, "SECRET_NOT_ACCEPTED").await;
            assert_eq!(body["details"]["field"], field);
            assert!(body["message"].as_str().unwrap().contains("credential_handle"));
            assert!(!body.to_string().contains(value), "{body}");
        }
        let members = json_ok(srv.get(&format!("/v1/workspaces/{ws}/members")).send().await.unwrap()).await;
        assert_eq!(members["data"]["items"].as_array().unwrap().len(), 1, "nothing was created");
    }

    async fn pagination_limit_and_cursor(srv) {
        let ws = srv.workspace_id().await;
        for _ in 0..4 {
            srv.user_in(&ws, service::access::Role::Viewer).await;
        }
        let mut seen = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = format!("/v1/workspaces/{ws}/members?limit=2");
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            let page = json_ok(srv.get(&path).send().await.unwrap()).await;
            let items = page["data"]["items"].as_array().unwrap();
            assert!(items.len() <= 2);
            seen.extend(items.iter().map(|m| m["member_id"].as_str().unwrap().to_owned()));
            match page["data"]["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => break,
            }
        }
        assert_eq!(seen.len(), 5);
        let mut dedup = seen.clone();
        dedup.dedup();
        assert_eq!(dedup, seen, "no member twice");
        expect_error(srv.get(&format!("/v1/workspaces/{ws}/members?limit=0")).send().await.unwrap(), 400, "VALIDATION_FAILED").await;
        expect_error(srv.get(&format!("/v1/workspaces/{ws}/members?limit=201")).send().await.unwrap(), 400, "VALIDATION_FAILED").await;
        expect_error(srv.get(&format!("/v1/workspaces/{ws}/members?cursor=%%%")).send().await.unwrap(), 400, "VALIDATION_FAILED").await;
    }

    async fn health_readiness_and_metrics(srv) {
        let h = json_ok(srv.client.get(srv.url("/healthz")).send().await.unwrap()).await;
        assert_eq!(h["data"]["status"], "ok");
        let r = json_ok(srv.client.get(srv.url("/readyz")).send().await.unwrap()).await;
        assert_eq!(r["data"]["database"], "ok");
        srv.get("/v1/me").send().await.unwrap();
        let m = srv.client.get(srv.url("/metrics")).send().await.unwrap().text().await.unwrap();
        assert!(m.contains("http_requests_total"), "{m}");
        assert!(m.contains("route=\"/v1/me\""), "{m}");
        assert!(m.contains("http_request_duration_seconds_bucket"), "{m}");
    }

    async fn openapi_is_served_and_lists_every_route(srv) {
        let resp = srv.client.get(srv.url("/openapi.json")).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let (_, doc) = json(resp).await;
        assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "{}", doc["openapi"]);
        let paths = doc["paths"].as_object().unwrap();
        for (path, method) in [
            ("/v1/me", "get"),
            ("/v1/workspaces", "get"),
            ("/v1/workspaces/{workspace_id}/members", "get"),
            ("/v1/workspaces/{workspace_id}/members/invitations", "post"),
            ("/v1/workspaces/{workspace_id}/members/{member_id}", "delete"),
            ("/v1/sessions", "get"),
            ("/v1/sessions/{session_id}/revoke", "post"),
            ("/v1/audit-logs", "get"),
        ] {
            assert!(paths.get(path).and_then(|p| p.get(method)).is_some(), "{method} {path} missing from OpenAPI");
        }
        assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
        // Every operation of the spec (section 4; reverse ETL arrives with
        // its own feature) and the everyday ones this server adds.
        let spec = [
            ("get", "/me"), ("get", "/workspaces"), ("get", "/workspaces/{workspace_id}/members"),
            ("post", "/workspaces/{workspace_id}/members/invitations"), ("delete", "/workspaces/{workspace_id}/members/{member_id}"),
            ("get", "/connectors"), ("get", "/connectors/{connector_id}"), ("get", "/connectors/{connector_id}/spec"),
            ("post", "/credentials"), ("get", "/credentials/{credential_id}"), ("post", "/credentials/taskapp/oauth/start"),
            ("post", "/credentials/taskapp/oauth/callback"), ("post", "/credentials/source/oauth/start"),
            ("post", "/credentials/source/oauth/callback"), ("post", "/credentials/emailcampaign/api-token"),
            ("post", "/connectors/emailcampaign/check"), ("post", "/connectors/emailcampaign/edm/preview"),
            ("post", "/sources"), ("patch", "/sources/{source_id}"), ("delete", "/sources/{source_id}"), ("post", "/sources/entities"),
            ("post", "/destinations"), ("patch", "/destinations/{destination_id}"), ("post", "/pipelines/prepare"), ("post", "/pipelines"),
            ("patch", "/pipelines/{pipeline_id}"), ("delete", "/connections/{connection_id}"), ("post", "/pipelines/{pipeline_id}/pause"),
            ("post", "/pipelines/{pipeline_id}/resume"), ("post", "/pipelines/{pipeline_id}/sync"), ("get", "/jobs/{job_id}"),
            ("get", "/approvals"), ("get", "/approval-policies"), ("patch", "/approval-policies/{category}"),
            ("post", "/approvals/{approval_id}/approve"), ("post", "/approvals/{approval_id}/reject"), ("get", "/audit-logs"),
            ("get", "/sessions"), ("post", "/sessions/{session_id}/revoke"),
        ];
        let extra = [
            ("get", "/jobs"), ("get", "/jobs/{job_id}/attempts"), ("post", "/jobs/{job_id}/cancel"), ("post", "/credentials/{credential_id}/revoke"),
            ("delete", "/destinations/{destination_id}"), ("get", "/sources/{source_id}"), ("get", "/destinations/{destination_id}"),
        ];
        for (method, path) in spec.iter().chain(extra.iter()) {
            let op = paths.get(&format!("/v1{path}")).and_then(|p| p.get(*method));
            let op = op.unwrap_or_else(|| panic!("{method} {path} missing from the description"));
            // The answers every operation can give are described, with the error shape.
            for status in ["400", "401", "403", "404", "429"] {
                assert!(op["responses"][status].is_object(), "{method} {path} does not describe {status}");
            }
            assert!(op["responses"]["503"].is_object(), "{method} {path} does not describe 503");
            if path.ends_with("/check") || path.ends_with("/preview") || path.ends_with("/prepare") || path.ends_with("/entities") || path.ends_with("/oauth/callback") {
                for status in ["502", "504"] {
                    assert!(op["responses"][status].is_object(), "{method} {path} reaches a provider but does not describe {status}");
                }
            }
            if *method != "get" {
                for status in ["202", "409", "413", "415", "422"] {
                    assert!(op["responses"][status].is_object(), "{method} {path} does not describe {status}");
                }
            }
        }
        // Under /v1 the same document needs the bearer token.
        expect_error(srv.client.get(srv.url("/v1/openapi.json")).send().await.unwrap(), 401, "401").await;
        let authed = json_ok(srv.get("/v1/openapi.json").send().await.unwrap()).await;
        assert_eq!(authed["paths"], doc["paths"]);
    }
}
