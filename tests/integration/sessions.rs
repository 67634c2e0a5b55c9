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

/// Two `service serve` processes on one PostgreSQL database, each with its
/// caches of sessions and profiles warm: a session revoked through either
/// fails on the very next request to the other; a member removed through
/// one is gone from their `/me` on the other at once; and a server whose
/// notice connection is cut (here, a revocation made behind both servers'
/// backs while it reconnects) starts again from empty caches rather than
/// trust what it may have missed. Needs PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_through_one_server_holds_on_the_next_request_to_another() {
    use crate::support::process::ServerProcess;
    use crate::support::{ADMIN_TOKEN, PgDatabase, init_crypto, private_dir};
    use service::store::notices::APPLICATION_NAME;
    use sqlx::Connection;
    init_crypto();
    let Some(db) = PgDatabase::create().await else { return };
    let dir = private_dir();
    let env = vec![
        ("SERVICE_DATA_DIR", dir.path().display().to_string()),
        ("DATABASE_URL", db.url.clone()),
        ("SERVICE_BOOTSTRAP_TOKEN", ADMIN_TOKEN.to_owned()),
        ("SERVICE_BOOTSTRAP_EMAIL", "admin@example.test".to_owned()),
    ];
    // One after the other: the first creates the installation.
    let a = ServerProcess::start(env.clone()).await;
    let b = ServerProcess::start(env.clone()).await;
    let mut pg = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut both_listen = Vec::new();
    for _ in 0..100 {
        both_listen = listeners(&mut pg, APPLICATION_NAME).await;
        if both_listen.len() == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(both_listen.len(), 2, "each server listens for notices");

    let http = reqwest::Client::new();
    let me = |base: &str, token: &str| http.get(format!("{base}/v1/me")).bearer_auth(token).send();
    let store = service::store::Store::connect(&db.url).await.unwrap();
    let (ws, email) = {
        let body: Value = me(&a.base, ADMIN_TOKEN).await.unwrap().json().await.unwrap();
        (
            body["data"]["default_workspace_id"].as_str().unwrap().to_owned(),
            body["data"]["user"]["email"].as_str().unwrap().to_owned(),
        )
    };
    for round in 0..20 {
        let token = service::access::admin::create_token(
            &store,
            &email,
            Some("replica test"),
            None,
            service::access::ClientSource::Api,
        )
        .await
        .unwrap();
        let token = secrecy::ExposeSecret::expose_secret(&token).to_owned();
        // Warm both servers' caches.
        let mut session_id = String::new();
        for base in [&a.base, &b.base, &a.base, &b.base] {
            let res = me(base, &token).await.unwrap();
            assert_eq!(res.status(), 200);
            session_id = res.json::<Value>().await.unwrap()["data"]["session_id"].as_str().unwrap().to_owned();
        }
        let (through, other) = if round % 2 == 0 { (&a.base, &b.base) } else { (&b.base, &a.base) };
        let revoked = http
            .post(format!("{through}/v1/sessions/{session_id}/revoke"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&serde_json::json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(revoked.status(), 200, "round {round}");
        assert_eq!(
            me(other, &token).await.unwrap().status(),
            401,
            "round {round}: the other server still let the revoked session in"
        );
        assert_eq!(me(through, &token).await.unwrap().status(), 401, "round {round}");
    }

    // A member removed through one server is gone from /me on the other.
    let member_email = "replica-member@example.test";
    service::access::admin::create_user(&store, member_email, "Member", Some(&ws), Role::Editor).await.unwrap();
    let member_token =
        service::access::admin::create_token(&store, member_email, None, None, service::access::ClientSource::Api)
            .await
            .unwrap();
    let member_token = secrecy::ExposeSecret::expose_secret(&member_token).to_owned();
    for base in [&a.base, &b.base, &b.base] {
        let body: Value = me(base, &member_token).await.unwrap().json().await.unwrap();
        assert_eq!(body["data"]["workspaces"].as_array().unwrap().len(), 1, "{body}");
    }
    let members: Value = http
        .get(format!("{}/v1/workspaces/{ws}/members", a.base))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let member_id =
        members["data"]["items"].as_array().unwrap().iter().find(|m| m["email"] == member_email).unwrap()["member_id"]
            .as_str()
            .unwrap()
            .to_owned();
    let removed = http
        .delete(format!("{}/v1/workspaces/{ws}/members/{member_id}", a.base))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 200, "{}", removed.text().await.unwrap());
    let body: Value = me(&b.base, &member_token).await.unwrap().json().await.unwrap();
    assert_eq!(
        body["data"]["workspaces"],
        serde_json::json!([]),
        "the other server still shows the membership: {body}"
    );

    // Behind the servers' backs: revoked in the database with no notice,
    // then server B's notice connection is cut. Once B listens again it
    // must not answer from what it cached before.
    let token = service::access::admin::create_token(
        &store,
        &email,
        Some("cut test"),
        None,
        service::access::ClientSource::Api,
    )
    .await
    .unwrap();
    let token = secrecy::ExposeSecret::expose_secret(&token).to_owned();
    for _ in 0..2 {
        assert_eq!(me(&b.base, &token).await.unwrap().status(), 200);
    }
    let hash = service::access::tokens::hash(&token);
    sqlx::query("UPDATE sessions SET revoked_at = 1 WHERE token_hash = $1").bind(&hash).execute(&mut pg).await.unwrap();
    // No notice was sent: B answers from its cache (which shows it is on).
    assert_eq!(me(&b.base, &token).await.unwrap().status(), 200, "B's session cache is in use");
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()")
        .bind(APPLICATION_NAME)
        .execute(&mut pg)
        .await
        .unwrap();
    let mut relistening = Vec::new();
    for _ in 0..100 {
        relistening = listeners(&mut pg, APPLICATION_NAME).await;
        if relistening.len() == 2 && relistening.iter().all(|p| !both_listen.contains(p)) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        relistening.len() == 2 && relistening.iter().all(|p| !both_listen.contains(p)),
        "both listen again on new connections: {relistening:?}"
    );
    assert_eq!(
        me(&b.base, &token).await.unwrap().status(),
        401,
        "answered from a cache kept across the lost connection"
    );
    drop((a, b));
}

/// The backends of the database listening for notices.
async fn listeners(pg: &mut sqlx::PgConnection, name: &str) -> Vec<i32> {
    sqlx::query_scalar::<_, i32>(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database() ORDER BY pid",
    )
    .bind(name)
    .fetch_all(pg)
    .await
    .unwrap()
}
