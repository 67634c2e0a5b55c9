//! Credentials: creation, metadata reads, workspace scoping, secure entry
//! links, proposals and master-key rotation (spec sections 4 and 5).

use reqwest::{Method, StatusCode};
use secrecy::ExposeSecret;
use serde_json::{Value, json};

use crate::backend_tests;
use crate::support::{Backend, TestServer, expect_error, json_ok};

fn handle_on_page(html: &str) -> String {
    let start = html.find("<code>ch_").expect("handle on page") + "<code>".len();
    html[start..start + html[start..].find("</code>").unwrap()].to_owned()
}

backend_tests! {
    async fn credentials_are_created_with_a_handle_and_read_without_their_secret(srv) {
        let secret = format!("s3cret-{}", uuid::Uuid::new_v4().simple());
        let resp = srv.post("/v1/credentials", json!({ "kind": "api_token", "hosts": ["api.example.com"], "secret": secret, "label": "ci" })).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED);
        let created = json_ok(resp).await;
        let d = &created["data"];
        assert!(d["credential_id"].as_str().unwrap().starts_with("crd_"));
        assert!(d["credential_handle"].as_str().unwrap().starts_with("ch_"));
        assert_eq!(d["hosts"], json!(["api.example.com"]));
        assert_eq!(d["status"], "active");
        for field in ["created_by", "created_at", "kind", "label"] {
            assert!(!d[field].is_null(), "{field}");
        }
        assert!(!created.to_string().contains(&secret));
        let id = d["credential_id"].as_str().unwrap();
        let read = json_ok(srv.get(&format!("/v1/credentials/{id}")).send().await.unwrap()).await;
        assert_eq!(read["data"]["credential_handle"], d["credential_handle"]);
        assert!(!read.to_string().contains(&secret[..10]), "not even a fragment");
        let list = json_ok(srv.get("/v1/credentials").send().await.unwrap()).await;
        assert_eq!(list["data"]["items"].as_array().unwrap().len(), 1);

        for bad in [json!({ "hosts": [], "secret": "x" }), json!({ "hosts": ["*.example.com"], "secret": "x" }), json!({ "hosts": ["a.example.com"], "secret": "" }), json!({ "hosts": ["a.example.com"], "secret": "x", "kind": "magic" })] {
            expect_error(srv.post("/v1/credentials", bad).send().await.unwrap(), 400, "VALIDATION_FAILED").await;
        }
    }

    async fn a_secret_goes_in_one_header_query_parameter_or_body_field_named_plainly(srv) {
        let secret = format!("k3y-{}", uuid::Uuid::new_v4().simple());
        let base = |extra: Value| {
            let mut body = json!({ "kind": "secret", "hosts": ["api.example.com"], "secret": secret });
            body.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap());
            body
        };
        for (place, stored) in [
            (json!({ "query_parameter": "api_key" }), json!({ "query_parameter": "api_key" })),
            (json!({ "body_field": "/auth/password" }), json!({ "body_field": "/auth/password" })),
            (json!({ "header": "X-Api-Key" }), json!({ "header": "x-api-key" })),
        ] {
            let created = json_ok(srv.post("/v1/credentials", base(place.clone())).send().await.unwrap()).await;
            let metadata = &created["data"]["metadata"];
            for (k, v) in stored.as_object().unwrap() {
                assert_eq!(&metadata[k], v, "{place}: {created}");
            }
            assert!(!created.to_string().contains(&secret));
        }
        for (bad, field) in [
            (json!({}), "header"),
            (json!({ "query_parameter": "api_key", "header": "x-key" }), "header"),
            (json!({ "query_parameter": "a&b" }), "query_parameter"),
            (json!({ "query_parameter": "a key" }), "query_parameter"),
            (json!({ "query_parameter": "" }), "query_parameter"),
            (json!({ "body_field": "/" }), "body_field"),
            (json!({ "body_field": "" }), "body_field"),
        ] {
            let e = expect_error(srv.post("/v1/credentials", base(bad.clone())).send().await.unwrap(), 400, "VALIDATION_FAILED").await;
            assert!(e.to_string().contains(field), "{bad}: {e}");
            assert!(!e.to_string().contains(&secret), "{e}");
        }
        for kind in ["api_token", "basic"] {
            let mut body = base(json!({ "query_parameter": "api_key", "username": "me" }));
            body["kind"] = json!(kind);
            expect_error(srv.post("/v1/credentials", body).send().await.unwrap(), 400, "VALIDATION_FAILED").await;
        }
    }

    async fn a_handle_of_another_workspace_behaves_like_one_that_does_not_exist(srv) {
        let (_, other_admin) = srv.other_workspace().await;
        let created = json_ok(
            srv.request_as(&other_admin, Method::POST, "/v1/credentials")
                .json(&json!({ "hosts": ["mail.acme-corp.com"], "secret": "other-workspace-secret" }))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let foreign = created["data"]["credential_handle"].as_str().unwrap().to_owned();
        let foreign_id = created["data"]["credential_id"].as_str().unwrap().to_owned();
        expect_error(srv.get(&format!("/v1/credentials/{foreign_id}")).send().await.unwrap(), 404, "404").await;
        let body = json!({ "credential_handle": foreign, "base_url": "https://team.mailcoach.app/api" });
        let a = expect_error(srv.post("/v1/connectors/emailcampaign/check", body).send().await.unwrap(), 400, "UNKNOWN_CREDENTIAL_HANDLE").await;
        let body = json!({ "credential_handle": "ch_doesnotexist", "base_url": "https://team.mailcoach.app/api" });
        let b = expect_error(srv.post("/v1/connectors/emailcampaign/check", body).send().await.unwrap(), 400, "UNKNOWN_CREDENTIAL_HANDLE").await;
        assert_eq!(a["message"], b["message"]);
    }

    async fn raw_secrets_outside_credential_flows_are_refused(srv) {
        for (path, body) in [
            ("/v1/credentials/entry-links", json!({ "hosts": ["a.example.com"], "password": "hunter2" })),
            ("/v1/connectors/emailcampaign/check", json!({ "credential_handle": "ch_x", "api_token": "raw" })),
            ("/v1/connectors/emailcampaign/edm/preview", json!({ "credential_handle": "ch_x", "client_secret": "raw" })),
        ] {
            let e = expect_error(srv.post(path, body).send().await.unwrap(), 400, "SECRET_NOT_ACCEPTED").await;
            assert_eq!(e["details"]["use"], "credential_handle");
        }
        let list = json_ok(srv.get("/v1/credentials").send().await.unwrap()).await;
        assert!(list["data"]["items"].as_array().unwrap().is_empty(), "nothing stored");
    }

    async fn an_entry_link_lets_a_person_type_the_secret_once(srv) {
        let resp = srv
            .post("/v1/credentials/entry-links", json!({ "hosts": ["team.mailcoach.app"], "label": "from my assistant" }))
            .header("x-service-client", "mcp")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED, "entry links need no approval by default");
        let link = json_ok(resp).await;
        let url = link["data"]["url"].as_str().unwrap().to_owned();
        let poll = link["data"]["poll"].as_str().unwrap().to_owned();
        let pending = json_ok(srv.get(&poll).send().await.unwrap()).await;
        assert_eq!(pending["data"]["status"], "pending");
        assert!(pending["data"]["credential_handle"].is_null());

        let page = srv.client.get(&url).send().await.unwrap();
        assert_eq!(page.status(), StatusCode::OK);
        assert!(page.text().await.unwrap().contains("type=\"password\""));
        let secret = format!("typed-{}", uuid::Uuid::new_v4().simple());
        let stored = srv.client.post(&url).form(&[("secret", secret.as_str())]).send().await.unwrap();
        assert_eq!(stored.status(), StatusCode::OK);
        let html = stored.text().await.unwrap();
        assert!(!html.contains(&secret));
        let handle = handle_on_page(&html);

        let done = json_ok(srv.get(&poll).send().await.unwrap()).await;
        assert_eq!(done["data"]["status"], "completed");
        assert_eq!(done["data"]["credential_handle"], handle.as_str());
        assert_eq!(srv.client.post(&url).form(&[("secret", "again")]).send().await.unwrap().status(), StatusCode::GONE);
        assert_eq!(srv.client.get(&url).send().await.unwrap().status(), StatusCode::GONE);
        let ws = srv.workspace_id().await;
        let rec = srv.state.vault.reveal(&ws, &handle, "team.mailcoach.app").await.unwrap();
        assert_eq!(rec.expose_secret(), secret);
    }

    async fn a_basic_entry_link_takes_the_username_the_link_fixed_or_the_person_types(srv) {
        let link = |body: Value| {
            let req = srv.post("/v1/credentials/entry-links", body);
            async move { json_ok(req.send().await.unwrap()).await["data"].clone() }
        };
        let submit = |url: &str, form: &[(&str, &str)]| srv.client.post(url).form(form).send();
        let metadata = |handle: String| {
            let list = srv.get("/v1/credentials?limit=100").send();
            async move {
                let list = json_ok(list.await.unwrap()).await;
                let items = list["data"]["items"].as_array().unwrap().clone();
                items.into_iter().find(|c| c["credential_handle"] == handle.as_str()).expect("listed")["metadata"].clone()
            }
        };

        // Without a username, the page asks for it; the form must bring a
        // valid one, and the link still works until it does.
        let asks = link(json!({ "kind": "basic", "hosts": ["team.mailcoach.app"] })).await;
        let url = asks["url"].as_str().unwrap();
        let page = srv.client.get(url).send().await.unwrap().text().await.unwrap();
        assert!(page.contains("name=\"username\"") && page.contains("type=\"password\""), "{page}");
        let secret = format!("typed-{}", uuid::Uuid::new_v4().simple());
        for (form, why) in [
            (vec![("secret", secret.as_str())], "Missing username"),
            (vec![("username", "a:b"), ("secret", secret.as_str())], "without &#39;:&#39;"),
            (vec![("username", "line\nbreak"), ("secret", secret.as_str())], "control characters"),
        ] {
            let refused = submit(url, &form).await.unwrap();
            assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
            let html = refused.text().await.unwrap();
            assert!(html.contains(why) && html.contains("The link still works"), "{form:?}: {html}");
        }
        let typed = submit(url, &[("username", "AKIAIOSFODNN7EXAMPLE"), ("secret", &secret)]).await.unwrap();
        assert_eq!(typed.status(), StatusCode::OK);
        let handle = handle_on_page(&typed.text().await.unwrap());
        let meta = metadata(handle.clone()).await;
        assert_eq!(meta["username"], "AKIAIOSFODNN7EXAMPLE", "{meta}");
        let ws = srv.workspace_id().await;
        assert_eq!(srv.state.vault.reveal(&ws, &handle, "team.mailcoach.app").await.unwrap().expose_secret(), secret);

        // A username the link fixed is shown, and no form changes it.
        let fixed = link(json!({ "kind": "basic", "username": "mailer", "hosts": ["team.mailcoach.app"] })).await;
        let url = fixed["url"].as_str().unwrap();
        let page = srv.client.get(url).send().await.unwrap().text().await.unwrap();
        assert!(page.contains("Username: <strong>mailer</strong>") && !page.contains("name=\"username\""), "{page}");
        let other = submit(url, &[("username", "mallory"), ("secret", &secret)]).await.unwrap();
        assert_eq!(other.status(), StatusCode::BAD_REQUEST);
        assert!(other.text().await.unwrap().contains("does not take a username"));
        let stored = submit(url, &[("secret", &secret)]).await.unwrap();
        assert_eq!(stored.status(), StatusCode::OK);
        assert_eq!(metadata(handle_on_page(&stored.text().await.unwrap())).await["username"], "mailer");

        // A token is sent as a bearer token: its page asks for no username
        // and takes none.
        let token = link(json!({ "hosts": ["team.mailcoach.app"] })).await;
        let url = token["url"].as_str().unwrap();
        assert!(!srv.client.get(url).send().await.unwrap().text().await.unwrap().contains("name=\"username\""));
        let refused = submit(url, &[("username", "mallory"), ("secret", &secret)]).await.unwrap();
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    }

    async fn a_proposed_credential_holds_no_secret_and_activates_on_approval(srv) {
        let secret = format!("proposed-{}", uuid::Uuid::new_v4().simple());
        let resp = srv
            .post("/v1/credentials", json!({ "hosts": ["api.example.com"], "secret": secret }))
            .header("x-service-execution-mode", "proposal")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        let body = json_ok(resp).await;
        assert!(!body.to_string().contains(&secret));
        let approval = &body["data"]["approval"];
        assert_eq!(approval["operation"]["operation"], "activate_credential");
        let id = approval["approval_id"].as_str().unwrap();
        let listed = json_ok(srv.get("/v1/approvals").send().await.unwrap()).await;
        assert!(!listed.to_string().contains(&secret));
        let cid = approval["operation"]["credential_id"].as_str().unwrap();
        let pending = json_ok(srv.get(&format!("/v1/credentials/{cid}")).send().await.unwrap()).await;
        assert_eq!(pending["data"]["status"], "pending_approval");
        json_ok(srv.request_as(&srv.approver_token, Method::POST, &format!("/v1/approvals/{id}/approve")).send().await.unwrap()).await;
        let active = json_ok(srv.get(&format!("/v1/credentials/{cid}")).send().await.unwrap()).await;
        assert_eq!(active["data"]["status"], "active");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_the_master_key_reseals_every_credential() {
    // The key in a file of the data directory, as a fresh install keeps it.
    let srv = TestServer::start_with(Backend::Sqlite, |c| c.master_key = None).await.unwrap();
    let ws = srv.workspace_id().await;
    let created = json_ok(
        srv.post("/v1/credentials", json!({ "hosts": ["api.example.com"], "secret": "rotate-me-please" }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let handle = created["data"]["credential_handle"].as_str().unwrap().to_owned();
    let key_file = srv.data_dir.join("master.key");
    let before = std::fs::read_to_string(&key_file).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let data_dir = srv.data_dir.clone();
    let url = srv.state.config.database_url.clone();
    let _kept = srv.stop_keeping_data().await;

    let out = crate::support::process::command()
        .env("SERVICE_DATA_DIR", &data_dir)
        .env("DATABASE_URL", &url)
        .args(["admin", "rotate-master-key"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("re-sealed 1 credential"));
    let after = std::fs::read_to_string(&key_file).unwrap();
    assert_ne!(before, after);
    assert_eq!(after.lines().filter(|l| !l.starts_with('#')).count(), 1, "the old key is retired");

    // The store opens with the new key alone and the secret is intact.
    let keyring = service::credentials::keyring::Keyring::load(&data_dir, None).unwrap();
    let store = service::store::Store::connect(&url).await.unwrap();
    let vault = service::credentials::Vault::new(store, keyring);
    assert_eq!(vault.reveal(&ws, &handle, "api.example.com").await.unwrap().expose_secret(), "rotate-me-please");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_key_from_the_environment_is_rotated_with_a_new_one_from_the_environment() {
    use base64::Engine;
    let dir = crate::support::private_dir();
    let url = format!("sqlite://{}/service.db?mode=rwc", dir.path().display());
    let old = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
    let new = base64::engine::general_purpose::STANDARD.encode([9u8; 32]);
    // Seal a credential under the old key (as a server with SERVICE_MASTER_KEY would).
    let store = service::store::Store::connect(&url).await.unwrap();
    let ws = store.create_workspace("w").await.unwrap().workspace_id;
    let user = store.create_user("k@example.test", "k").await.unwrap().user_id;
    let ring = |b64: &str| {
        let f = dir.path().join("k");
        std::fs::write(&f, format!("x {b64}\n")).unwrap();
        std::fs::rename(&f, dir.path().join(service::credentials::keyring::KEY_FILE)).unwrap();
        service::credentials::keyring::Keyring::load(dir.path(), None).unwrap()
    };
    let vault = service::credentials::Vault::new(store.clone(), ring(&old));
    let rec = vault
        .create(service::credentials::NewSecret {
            workspace_id: &ws,
            created_by: &user,
            kind: service::store::kinds::CredentialKind::ApiToken,
            connector_id: None,
            label: None,
            hosts: vec!["api.example.com".into()],
            metadata: json!({}),
            material: service::credentials::SecretMaterial::new("env-rotated".to_owned().into()),
            status: service::store::kinds::CredentialStatus::Active,
            access_expires_at: None,
        })
        .await
        .unwrap();
    std::fs::remove_file(dir.path().join(service::credentials::keyring::KEY_FILE)).unwrap();
    let run = |extra: Option<&str>| {
        let mut c = crate::support::process::command();
        c.env("SERVICE_DATA_DIR", dir.path()).env("DATABASE_URL", &url).env("SERVICE_MASTER_KEY", &old);
        if let Some(n) = extra {
            c.env("SERVICE_NEW_MASTER_KEY", n);
        }
        c.args(["admin", "rotate-master-key"]).output().unwrap()
    };
    let refused = run(None);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("SERVICE_NEW_MASTER_KEY"));
    let done = run(Some(&new));
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    assert!(!dir.path().join(service::credentials::keyring::KEY_FILE).exists(), "no key file is written");
    let vault = service::credentials::Vault::new(store, ring(&new));
    assert_eq!(
        vault.reveal(&ws, rec.credential_handle.as_str(), "api.example.com").await.unwrap().expose_secret(),
        "env-rotated"
    );
}
