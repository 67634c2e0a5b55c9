//! Members and invitations.

use reqwest::{Method, StatusCode};
use serde_json::json;
use service::access::Role;

use crate::backend_tests;
use crate::support::{expect_error, json, json_ok};

/// The token shown on an HTML page after a successful sign-in or acceptance.
fn token_on_page(html: &str) -> String {
    let start = html.find("<code>svc_").expect("token on page") + "<code>".len();
    let end = start + html[start..].find("</code>").unwrap();
    html[start..end].to_owned()
}

backend_tests! {
    async fn invitation_is_accepted_once_and_grants_the_role(srv) {
        let ws = srv.workspace_id().await;
        let resp = srv.post(&format!("/v1/workspaces/{ws}/members/invitations"), json!({"email": "New.Person@Example.test", "role": "editor"})).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED);
        let inv = json_ok(resp).await;
        assert_eq!(inv["data"]["email"], "new.person@example.test");
        assert_eq!(inv["data"]["role"], "editor");
        let accept_url = inv["data"]["accept_url"].as_str().unwrap().to_owned();
        assert!(accept_url.starts_with(&srv.base));

        // Looking at the page spends nothing.
        let page = srv.client.get(&accept_url).send().await.unwrap();
        assert_eq!(page.status(), StatusCode::OK);
        assert!(page.text().await.unwrap().contains("editor"));

        // A password too short is refused before anything is spent.
        let refused = srv.client.post(&accept_url).form(&[("name", "New Person"), ("password", "short")]).send().await.unwrap();
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
        assert!(!refused.text().await.unwrap().contains("short\""), "the password is not shown back");
        assert!(srv.state.store.user_by_email("new.person@example.test").await.unwrap().is_none());

        let accepted = srv
            .client
            .post(&accept_url)
            .header("user-agent", "integration-test/1")
            .form(&[("name", "New Person"), ("password", "new person's passphrase")])
            .send()
            .await
            .unwrap();
        assert_eq!(accepted.status(), StatusCode::OK);
        let page = accepted.text().await.unwrap();
        assert!(page.contains("/sign-in") && !page.contains("passphrase"), "{page}");
        let token = token_on_page(&page);
        // The chosen password signs the new member in on the web later.
        let (_, hash) = srv.state.store.user_for_sign_in("new.person@example.test").await.unwrap().unwrap();
        assert!(service::access::passwords::verify("new person's passphrase".to_owned().into(), hash).await);
        let me = json_ok(srv.request_as(&token, Method::GET, "/v1/me").send().await.unwrap()).await;
        // The new session carries its metadata.
        let user_id = me["data"]["user"]["user_id"].as_str().unwrap();
        let sessions = json_ok(srv.get(&format!("/v1/sessions?user_id={user_id}")).send().await.unwrap()).await;
        let session = &sessions["data"]["items"][0];
        assert_eq!(session["kind"], "session");
        assert_eq!(session["user_agent"], "integration-test/1");
        assert_eq!(session["address"], "127.0.0.1");
        assert!(session["expires_at"].is_string());
        assert_eq!(me["data"]["user"]["email"], "new.person@example.test");
        assert_eq!(me["data"]["workspaces"][0]["workspace_id"], ws.as_str());
        assert_eq!(me["data"]["workspaces"][0]["role"], "editor");

        // Single use.
        let again = srv.client.post(&accept_url).form(&[("name", "Someone else")]).send().await.unwrap();
        assert_eq!(again.status(), StatusCode::GONE);
        assert_eq!(srv.client.get(&accept_url).send().await.unwrap().status(), StatusCode::GONE);
    }

    async fn expired_invitation_cannot_be_accepted(srv) {
        let ws = srv.workspace_id().await;
        let me = json_ok(srv.get("/v1/me").send().await.unwrap()).await;
        let admin = me["data"]["user"]["user_id"].as_str().unwrap();
        let token = "svc1_expired_invitation_token_for_test";
        srv.state
            .store
            .create_invitation(&ws, "late@example.test", Role::Viewer, &service::access::tokens::hash(token), admin, service::store::now_ms() - 1)
            .await
            .unwrap();
        let resp = srv.client.post(srv.url(&format!("/invitations/{token}"))).form(&[("name", "Late")]).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::GONE);
        assert!(srv.state.store.user_by_email("late@example.test").await.unwrap().is_none());
    }

    async fn invitation_expiry_is_bounded(srv) {
        let ws = srv.workspace_id().await;
        let path = format!("/v1/workspaces/{ws}/members/invitations");
        let resp = srv.post(&path, json!({"email": "a@example.test", "role": "viewer", "expires_in_hours": 0})).send().await.unwrap();
        expect_error(resp, 400, "VALIDATION_FAILED").await;
        let resp = srv.post(&path, json!({"email": "not-an-address", "role": "viewer"})).send().await.unwrap();
        let body = expect_error(resp, 400, "VALIDATION_FAILED").await;
        assert_eq!(body["details"]["field"], "email");
    }

    async fn members_are_listed_and_removed_but_not_the_last_administrator(srv) {
        let ws = srv.workspace_id().await;
        let (viewer_id, viewer_token) = srv.user_in(&ws, Role::Viewer).await;
        let members = json_ok(srv.get(&format!("/v1/workspaces/{ws}/members")).send().await.unwrap()).await;
        let items = members["data"]["items"].as_array().unwrap();
        assert_eq!(items.len(), 2);
        let admin_member = items.iter().find(|m| m["role"] == "administrator").unwrap()["member_id"].as_str().unwrap().to_owned();
        let viewer_member = items.iter().find(|m| m["user_id"] == viewer_id.as_str()).unwrap()["member_id"].as_str().unwrap().to_owned();
        let viewers = json_ok(srv.get(&format!("/v1/workspaces/{ws}/members?role=viewer")).send().await.unwrap()).await;
        assert_eq!(viewers["data"]["items"].as_array().unwrap().len(), 1);

        let resp = srv.request(Method::DELETE, &format!("/v1/workspaces/{ws}/members/{admin_member}")).send().await.unwrap();
        expect_error(resp, 409, "LAST_ADMINISTRATOR").await;

        let removed = json_ok(srv.request(Method::DELETE, &format!("/v1/workspaces/{ws}/members/{viewer_member}")).send().await.unwrap()).await;
        assert_eq!(removed["data"]["removed"], true);
        // The removed viewer's token still authenticates, but the workspace is gone for them.
        let resp = srv.request_as(&viewer_token, Method::GET, &format!("/v1/workspaces/{ws}/members")).send().await.unwrap();
        expect_error(resp, 404, "404").await;
        let resp = srv.request(Method::DELETE, &format!("/v1/workspaces/{ws}/members/{viewer_member}")).send().await.unwrap();
        expect_error(resp, 404, "404").await;

        // With a second administrator, the first may go.
        let (_, second_admin) = srv.user_in(&ws, Role::Administrator).await;
        let resp = srv.request_as(&second_admin, Method::DELETE, &format!("/v1/workspaces/{ws}/members/{admin_member}")).send().await.unwrap();
        let (status, _) = json(resp).await;
        assert_eq!(status, StatusCode::OK);
    }
}
