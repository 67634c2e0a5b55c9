//! The social-media source end to end: the bundled plugin against a fake
//! HubSpot-style provider over HTTPS (spec sections 2, 4 and 9 rule 4):
//! OAuth, entity options level by level, a validated selection, syncs of
//! every stream into SQLite and PostgreSQL, an access token that expires
//! mid-sync, unloading as the rollback, and nothing else touched.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use reqwest::Method;
use serde_json::{Value, json};

use crate::on_both_backends;
use crate::support::hubspot::{self, Hub};
use crate::support::mailcoach::{self, MailcoachState};
use crate::support::provider::{FakeProvider, TestCa};
use crate::support::trust::Trust;
use crate::support::{Backend, TestServer, count_rows, expect_error, json_ok, key_paths};

const CONNECTOR: &str = "conn_socialmedia_hub";
const RETAIL: [&str; 2] = ["ch-retail-fb", "ch-retail-li"];

/// A server reaching the fake HubSpot social API (and Mailcoach).
struct HubServer {
    srv: TestServer,
    hub: Arc<Hub>,
    mc_token: String,
    _provider: FakeProvider,
}

async fn setup(backend: Backend) -> HubServer {
    let ca = TestCa::new();
    let hub = Hub::new();
    let mc_token = format!("mc-token-{}", uuid::Uuid::new_v4().simple());
    let mc = Arc::new(MailcoachState {
        token: mc_token.clone(),
        campaigns: mailcoach::campaigns(12),
        subscribers: 30,
        ..Default::default()
    });
    let names = ["api.hubapi.com", "team.mailcoach.app"];
    // One HTTPS server plays both providers; the paths do not overlap.
    let provider = FakeProvider::start(&ca, &names, hubspot::router(hub.clone()).merge(mailcoach::router(mc))).await;
    let trust = Trust::new(&ca).pinning(&provider.pins(&names)).allowing("api.hubapi.com,*.mailcoach.app");
    let srv = TestServer::start_with(backend, |c| {
        c.plugins.egress = trust.policy();
        c.oauth = service::config::oauth::OAuthSettings::from_settings(
            Some(
                &json!({ CONNECTOR: { "client_id": hubspot::CLIENT_ID, "client_secret": hubspot::CLIENT_SECRET } })
                    .to_string(),
            ),
            None,
        )
        .unwrap();
    })
    .await
    .unwrap();
    HubServer { srv, hub, mc_token, _provider: provider }
}

impl HubServer {
    /// Runs the OAuth flow as a person would and answers the handle.
    async fn authorise(&self) -> String {
        let started = json_ok(
            self.srv
                .post("/v1/credentials/source/oauth/start", json!({ "connector_id": CONNECTOR }))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let url = url::Url::parse(started["data"]["authorization_url"].as_str().unwrap()).unwrap();
        assert_eq!(url.host_str(), Some("app.hubspot.com"));
        let q: HashMap<String, String> = url.query_pairs().into_owned().collect();
        assert_eq!(q["code_challenge_method"], "S256");
        assert_eq!(q["client_id"], hubspot::CLIENT_ID);
        assert!(q["scope"].contains("social"));
        let code = format!("code-{}", uuid::Uuid::new_v4().simple());
        self.hub.codes.lock().unwrap().insert(code.clone(), (q["code_challenge"].clone(), q["redirect_uri"].clone()));
        let created = json_ok(
            self.srv
                .post("/v1/credentials/source/oauth/callback", json!({ "state": q["state"], "code": code }))
                .send()
                .await
                .unwrap(),
        )
        .await;
        self.assert_no_tokens(&created);
        assert_eq!(created["data"]["connector_id"], CONNECTOR);
        assert_eq!(
            created["data"]["metadata"]["account"],
            json!({ "hub_id": "62515", "user_id": "77" }),
            "the account ids of the camel-case token answer"
        );
        created["data"]["credential_handle"].as_str().unwrap().to_owned()
    }

    fn assert_no_tokens(&self, body: &Value) {
        let text = body.to_string();
        for t in self.hub.tokens() {
            assert!(!text.contains(&t), "a provider token in {text}");
        }
        assert!(!text.contains(hubspot::CLIENT_SECRET));
    }

    async fn entities(&self, handle: &str, field: &str, configuration: Value, query: &str) -> reqwest::Response {
        self.srv
            .post(&format!("/v1/sources/entities{query}"), json!({ "connector_id": CONNECTOR, "credential_handle": handle, "field": field, "configuration": configuration }))
            .send()
            .await
            .unwrap()
    }

    async fn options(&self, handle: &str, field: &str, configuration: Value) -> Vec<(String, String, Value)> {
        let body = json_ok(self.entities(handle, field, configuration, "").await).await;
        self.assert_no_tokens(&body);
        assert_allowlisted(&body);
        body["data"]["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                (o["value"].as_str().unwrap().to_owned(), o["label"].as_str().unwrap().to_owned(), o["parent"].clone())
            })
            .collect()
    }

    async fn create_source(&self, configuration: Value) -> reqwest::Response {
        self.srv
            .post("/v1/sources", json!({ "connector_id": CONNECTOR, "name": "Social", "configuration": configuration }))
            .send()
            .await
            .unwrap()
    }

    async fn pipeline(&self, source_id: &str, destination: Value) -> String {
        let d = json_ok(self.srv.post("/v1/destinations", destination).send().await.unwrap()).await;
        let streams = json!([
            { "name": "channels", "sync_mode": "full_refresh_overwrite" },
            { "name": "posts", "sync_mode": "incremental_deduped" },
            { "name": "post_metrics", "sync_mode": "full_refresh_overwrite" },
            { "name": "channel_statistics", "sync_mode": "full_refresh_overwrite" },
        ]);
        let p = json_ok(
            self.srv
                .post("/v1/pipelines", json!({ "name": "social", "source_id": source_id, "destination_id": d["data"]["destination_id"], "streams": streams }))
                .send()
                .await
                .unwrap(),
        )
        .await;
        p["data"]["pipeline_id"].as_str().unwrap().to_owned()
    }

    async fn sync(&self, pipeline_id: &str) -> Value {
        let job =
            json_ok(self.srv.request(Method::POST, &format!("/v1/pipelines/{pipeline_id}/sync")).send().await.unwrap())
                .await;
        self.srv.wait_job(job["data"]["job_id"].as_str().unwrap()).await
    }

    fn valid_selection(handle: &str) -> Value {
        json!({ "credential_handle": handle, "portal_id": "62515", "brand_ids": ["101"], "channel_ids": RETAIL })
    }
}

/// Every key a connector, spec, source, entities or error answer of this
/// connector may hold. A new field fails this test until it is added here.
const ALLOWED_KEYS: &[&str] = &[
    "request_id",
    "data",
    "code",
    "message",
    "details",
    "details.field",
    "details.id",
    "details.connector_id",
    "data.connector_id",
    "data.credential_handle",
    "data.field",
    "data.options",
    "data.options.value",
    "data.options.label",
    "data.options.parent",
    "data.next_cursor",
    "data.name",
    "data.version",
    "data.kind",
    "data.status",
    "data.operations",
    "data.oauth",
    "data.interface_version",
    "data.oauth.scopes",
    "data.oauth.start",
    "data.config_schema",
    "data.source_id",
    "data.workspace_id",
    "data.configuration",
    "data.configuration.credential_handle",
    "data.configuration.portal_id",
    "data.configuration.brand_ids",
    "data.configuration.channel_ids",
    "data.created_by",
    "data.created_at",
    "data.updated_at",
];

fn assert_allowlisted(body: &Value) {
    for path in key_paths(body) {
        if path.starts_with("data.config_schema.") {
            continue;
        }
        assert!(ALLOWED_KEYS.contains(&path.as_str()), "unexpected field {path} in {body}");
    }
    let text = body.to_string();
    for leak in [
        "authorize",
        "token_url",
        "oauth/v1",
        "hubapi",
        "image",
        "/work/",
        "/tmp/",
        "target/",
        "panicked",
        "stack",
        "Bearer",
    ] {
        assert!(!text.contains(leak), "`{leak}` in a customer answer: {text}");
    }
}

async fn a_social_source_goes_from_oauth_to_incremental_syncs_and_survives_unloading(backend: Backend) {
    let fx = setup(backend).await;
    let srv = &fx.srv;
    let handle = fx.authorise().await;

    // Entities, level by level.
    let portals = fx.options(&handle, "portal_id", json!({})).await;
    assert_eq!(portals.len(), 1);
    assert_eq!(portals[0].0, "62515");
    assert!(portals[0].1.contains("62515"));
    let brands = fx.options(&handle, "brand_ids", json!({ "portal_id": "62515" })).await;
    assert_eq!(
        brands.iter().map(|b| (b.0.as_str(), b.1.as_str())).collect::<Vec<_>>(),
        [("101", "Acme Retail"), ("102", "Acme Travel")]
    );
    assert!(brands.iter().all(|b| b.2 == "62515"), "brands belong to the portal");
    let channels = fx.options(&handle, "channel_ids", json!({ "portal_id": "62515", "brand_ids": ["101"] })).await;
    assert_eq!(channels.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), RETAIL, "only the chosen brand's channels");
    assert!(channels.iter().all(|c| c.2 == "101"));
    assert_eq!(channels[1].1, "LinkedInCompanyPage:ch-retail-li", "a channel without a name shows its key");
    let both = fx.options(&handle, "channel_ids", json!({ "portal_id": "62515", "brand_ids": ["101", "102"] })).await;
    assert_eq!(both.len(), 3);

    // A source with a valid selection, then every stream into SQLite.
    let created = fx.create_source(HubServer::valid_selection(&handle)).await;
    assert_eq!(created.status(), 201);
    let source = json_ok(created).await;
    assert_allowlisted(&source);
    let source_id = source["data"]["source_id"].as_str().unwrap().to_owned();
    let ws = srv.workspace_id().await;
    let pipeline = fx
        .pipeline(&source_id, json!({ "name": "wh", "kind": "sqlite", "configuration": { "file": "social.db" } }))
        .await;
    fx.hub.throttle_next.store(2, Ordering::SeqCst);
    let job = fx.sync(&pipeline).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert!(fx.hub.throttled.load(Ordering::SeqCst) >= 2, "429s were answered and retried");
    let url = format!("sqlite://{}?mode=ro", srv.warehouse(&ws, "social.db").display());
    let published = fx.hub.published_on(&RETAIL) as i64;
    assert_eq!(published, 250);
    assert_eq!(count_rows(&url, "channels").await, 2);
    assert_eq!(count_rows(&url, "posts").await, published);
    assert_eq!(count_rows(&url, "post_metrics").await, published);
    assert_eq!(count_rows(&url, "channel_statistics").await, 2);
    {
        use sqlx::{Connection, Row};
        let mut c = sqlx::AnyConnection::connect(&url).await.unwrap();
        let r = sqlx::query("SELECT SUM(CAST(\"posts_published\" AS INTEGER)) AS n FROM \"channel_statistics\"")
            .fetch_one(&mut c)
            .await
            .unwrap();
        assert_eq!(r.try_get::<i64, _>("n").unwrap(), published, "statistics add up to the posts");
        let r = sqlx::query(
            "SELECT \"content\" AS c, \"brand_id\" AS b FROM \"posts\" WHERE \"channel_guid\" = 'ch-retail-fb' LIMIT 1",
        )
        .fetch_one(&mut c)
        .await
        .unwrap();
        assert!(r.try_get::<String, _>("c").unwrap().contains('\u{1F680}'));
        assert_eq!(r.try_get::<String, _>("b").unwrap(), "101");
    }

    // New posts, and the access token expires mid-sync: the provider says
    // so, the host refreshes it and sends again, the sync completes and
    // reads only the new posts of the selected channels.
    fx.hub.publish("ch-retail-fb", 5);
    fx.hub.publish("ch-travel-x", 3);
    for budget in fx.hub.access.lock().unwrap().values_mut() {
        *budget = Some(3);
    }
    let refreshed = fx.hub.refreshed.load(Ordering::SeqCst);
    let job = fx.sync(&pipeline).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert!(fx.hub.expired_answers.load(Ordering::SeqCst) >= 1, "the token expired during the sync");
    assert!(fx.hub.refreshed.load(Ordering::SeqCst) > refreshed, "and was refreshed");
    assert_eq!(job["progress"]["streams"]["posts"]["records"], 5, "only the new posts: {job}");
    assert!(
        fx.hub.since_seen.lock().unwrap().iter().any(|s| s.is_some()),
        "the incremental read asked for posts since its state"
    );
    assert_eq!(count_rows(&url, "posts").await, published + 5);
    assert_eq!(count_rows(&url, "post_metrics").await, published + 5);

    // The same streams into PostgreSQL.
    if let Some(warehouse) = crate::support::PgDatabase::create().await {
        let pg = fx
            .pipeline(
                &source_id,
                json!({ "name": "pg", "kind": "postgres", "configuration": { "url": warehouse.url } }),
            )
            .await;
        let job = fx.sync(&pg).await;
        assert_eq!(job["status"], "succeeded", "{job}");
        assert_eq!(count_rows(&warehouse.url, "posts").await, published + 5);
        assert_eq!(count_rows(&warehouse.url, "channel_statistics").await, 2);
        fx.hub.publish("ch-retail-li", 2);
        let job = fx.sync(&pg).await;
        assert_eq!(job["progress"]["streams"]["posts"]["records"], 2, "{job}");
        assert_eq!(count_rows(&warehouse.url, "posts").await, published + 7);
    } else {
        assert!(std::env::var_os("SERVICE_TEST_REQUIRE_POSTGRES").is_none(), "PostgreSQL is required for this run");
    }

    // Rollback is unloading: the connector is unavailable, nothing else
    // changes; loading it again restores everything.
    json_ok(srv.request(Method::POST, &format!("/v1/admin/plugins/{CONNECTOR}/unload")).send().await.unwrap()).await;
    let c = json_ok(srv.get(&format!("/v1/connectors/{CONNECTOR}")).send().await.unwrap()).await;
    assert_eq!(c["data"]["status"], "unavailable");
    expect_error(fx.entities(&handle, "portal_id", json!({}), "").await, 409, "CONNECTOR_UNAVAILABLE").await;
    expect_error(fx.create_source(HubServer::valid_selection(&handle)).await, 409, "CONNECTOR_UNAVAILABLE").await;
    let kept = json_ok(srv.get(&format!("/v1/sources/{source_id}")).send().await.unwrap()).await;
    assert_eq!(kept["data"]["configuration"], source["data"]["configuration"]);
    json_ok(srv.request(Method::POST, &format!("/v1/admin/plugins/{CONNECTOR}/load")).send().await.unwrap()).await;
    fx.hub.publish("ch-retail-fb", 1);
    let job = fx.sync(&pipeline).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let unseen = fx.hub.published_on(&RETAIL) as i64 - (published + 5);
    assert_eq!(job["progress"]["streams"]["posts"]["records"], unseen, "the saved state survived the unload: {job}");

    // A channel added to the selection later is read from its beginning.
    let patch = json!({ "configuration": { "brand_ids": ["101", "102"], "channel_ids": ["ch-retail-fb", "ch-retail-li", "ch-travel-x"] } });
    json_ok(srv.request(Method::PATCH, &format!("/v1/sources/{source_id}")).json(&patch).send().await.unwrap()).await;
    let job = fx.sync(&pipeline).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["progress"]["streams"]["posts"]["records"], fx.hub.published_on(&["ch-travel-x"]) as i64, "{job}");
}

async fn the_selection_is_checked_against_what_the_provider_offers_now(backend: Backend) {
    let fx = setup(backend).await;
    let srv = &fx.srv;
    let handle = fx.authorise().await;
    let refused = |field: &str, id: &str, body: &Value| {
        assert_eq!(body["details"]["field"], format!("configuration.{field}"), "{body}");
        assert_eq!(body["details"]["id"], id, "{body}");
        assert_allowlisted(body);
    };
    let with = |patch: Value| {
        let mut c = HubServer::valid_selection(&handle);
        for (k, v) in patch.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    };
    // A channel of another brand, a brand of another portal, ids the
    // provider does not know, another portal.
    let e = expect_error(
        fx.create_source(with(json!({ "channel_ids": ["ch-retail-fb", "ch-travel-x"] }))).await,
        400,
        "ENTITY_NOT_OFFERED",
    )
    .await;
    refused("channel_ids", "ch-travel-x", &e);
    let e =
        expect_error(fx.create_source(with(json!({ "brand_ids": ["101", "301"] }))).await, 400, "ENTITY_NOT_OFFERED")
            .await;
    refused("brand_ids", "301", &e);
    let e = expect_error(
        fx.create_source(with(json!({ "channel_ids": ["ch-nobody-knows"] }))).await,
        400,
        "ENTITY_NOT_OFFERED",
    )
    .await;
    refused("channel_ids", "ch-nobody-knows", &e);
    let e =
        expect_error(fx.create_source(with(json!({ "portal_id": "99999" }))).await, 400, "ENTITY_NOT_OFFERED").await;
    refused("portal_id", "99999", &e);
    // Brand and channel selection is required.
    expect_error(
        fx.create_source(json!({ "credential_handle": handle, "portal_id": "62515" })).await,
        400,
        "CONFIGURATION_INVALID",
    )
    .await;
    expect_error(fx.create_source(with(json!({ "channel_ids": [] }))).await, 400, "CONFIGURATION_INVALID").await;
    // Options need the level above, and the credential's own portal.
    expect_error(
        fx.entities(&handle, "channel_ids", json!({ "portal_id": "62515" }), "").await,
        400,
        "CONNECTOR_INVALID_CONFIG",
    )
    .await;
    expect_error(
        fx.entities(&handle, "brand_ids", json!({ "portal_id": "1" }), "").await,
        400,
        "CONNECTOR_INVALID_CONFIG",
    )
    .await;
    expect_error(fx.entities(&handle, "nonsense", json!({}), "").await, 400, "VALIDATION_FAILED").await;
    expect_error(fx.entities("ch_unknown", "portal_id", json!({}), "").await, 400, "UNKNOWN_CREDENTIAL_HANDLE").await;
    let e = json_ok(
        fx.entities(
            &handle,
            "brand_ids",
            json!({ "portal_id": "62515", "credential_account": { "user_id": "1" } }),
            "",
        )
        .await,
    )
    .await;
    assert_eq!(e["data"]["options"].as_array().unwrap().len(), 2, "a client cannot choose whose brands are listed");

    // Paged.
    let first = json_ok(
        fx.entities(&handle, "channel_ids", json!({ "portal_id": "62515", "brand_ids": ["101", "102"] }), "?limit=2")
            .await,
    )
    .await;
    assert_eq!(first["data"]["options"].as_array().unwrap().len(), 2);
    let cursor = first["data"]["next_cursor"].as_str().unwrap();
    let rest = json_ok(
        fx.entities(
            &handle,
            "channel_ids",
            json!({ "portal_id": "62515", "brand_ids": ["101", "102"] }),
            &format!("?limit=2&cursor={cursor}"),
        )
        .await,
    )
    .await;
    assert_eq!(rest["data"]["options"][0]["value"], "ch-travel-x");
    assert!(rest["data"]["next_cursor"].is_null());

    // Viewers do not run the connector with the workspace's credential.
    let (_, viewer) = srv.user_in(&srv.workspace_id().await, service::access::Role::Viewer).await;
    let resp = srv
        .request_as(&viewer, Method::POST, "/v1/sources/entities")
        .json(&json!({ "connector_id": CONNECTOR, "credential_handle": handle, "field": "portal_id" }))
        .send()
        .await
        .unwrap();
    expect_error(resp, 403, "403").await;

    // The spec says OAuth and its scopes, not the provider's endpoints.
    let spec = json_ok(srv.get(&format!("/v1/connectors/{CONNECTOR}/spec")).send().await.unwrap()).await;
    assert_allowlisted(&spec);
    assert_eq!(spec["data"]["oauth"]["scopes"], json!(["oauth", "social", "business_units_view.read"]));
    assert_allowlisted(&json_ok(srv.get(&format!("/v1/connectors/{CONNECTOR}")).send().await.unwrap()).await);

    // A source saved before the selection was validated, with raw ids (one
    // of them gone at the provider, numbers where text is usual) and its
    // legacy connector alias: updating it keeps working; only ids it did
    // not hold are checked.
    let ws = srv.workspace_id().await;
    let legacy = json!({ "credential_handle": handle, "portal_id": 62515, "brand_ids": [101], "channel_ids": ["ch-retail-fb", "ch-retired-2019"] });
    let connector_id = srv.state.plugins.canonical_id("source:socialmedia").unwrap();
    assert_eq!(connector_id, CONNECTOR);
    let (user, _) = srv.user_in(&ws, service::access::Role::Editor).await;
    let old = srv.state.store.create_source(&ws, &connector_id, "Old social", &legacy, &user).await.unwrap();
    let path = format!("/v1/sources/{}", old.source_id);
    let patched = json_ok(
        srv.request(Method::PATCH, &path).json(&json!({ "name": "Old social, renamed" })).send().await.unwrap(),
    )
    .await;
    assert_eq!(patched["data"]["configuration"]["channel_ids"], json!(["ch-retail-fb", "ch-retired-2019"]));
    let e = expect_error(
        srv.request(Method::PATCH, &path)
            .json(&json!({ "configuration": { "channel_ids": ["ch-retail-fb", "ch-retired-2019", "ch-travel-x"] } }))
            .send()
            .await
            .unwrap(),
        400,
        "ENTITY_NOT_OFFERED",
    )
    .await;
    refused("channel_ids", "ch-travel-x", &e);
    json_ok(
        srv.request(Method::PATCH, &path)
            .json(&json!({ "configuration": { "channel_ids": ["ch-retail-fb", "ch-retired-2019", "ch-retail-li"] } }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let alias = json_ok(srv.post("/v1/sources", json!({ "connector_id": "source:hubspot_social", "name": "Aliased", "configuration": HubServer::valid_selection(&handle) })).send().await.unwrap()).await;
    assert_eq!(alias["data"]["connector_id"], CONNECTOR, "a legacy alias is stored as the canonical id");
}

on_both_backends!(
    a_social_source_goes_from_oauth_to_incremental_syncs_and_survives_unloading,
    the_selection_is_checked_against_what_the_provider_offers_now
);

/// Every row of the tables a customer's setup lives in, by table and id
/// (sessions, audit records, idempotency records and OAuth states change
/// with any use of the API and are left out).
async fn customer_rows(srv: &TestServer) -> BTreeMap<String, String> {
    use sqlx::{Connection, Row};
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(&srv.state.config.database_url).await.unwrap();
    let tables = [
        ("sources", "id, connector_id, name, configuration, updated_at"),
        ("destinations", "id, kind, name, configuration, updated_at"),
        ("pipelines", "id, source_id, destination_id, streams, schedule, schedule_version, status"),
        ("pipeline_state", "*"),
        ("jobs", "id, pipeline_id, status, attempts, progress, finished_at"),
        ("credentials", "id, handle, connector_id, status, metadata, ciphertext"),
        ("plugin_states", "connector_id, enabled"),
        ("workspaces", "id, name"),
        ("memberships", "id, user_id, workspace_id, role"),
        ("users", "id, email"),
        ("approval_policies", "workspace_id || ':' || category, requires_approval, approver_role"),
        ("approvals", "id, status"),
        ("invitations", "id, email"),
    ];
    let mut out = BTreeMap::new();
    for (table, cols) in tables {
        let rows =
            sqlx::query(sqlx::AssertSqlSafe(format!("SELECT {cols} FROM {table}"))).fetch_all(&mut conn).await.unwrap();
        for r in rows {
            let cells: Vec<String> = (0..r.len())
                .map(|i| match r.try_get::<Option<String>, _>(i) {
                    Ok(v) => v.unwrap_or_default(),
                    Err(_) => r.try_get::<Option<i64>, _>(i).ok().flatten().map(|n| n.to_string()).unwrap_or_default(),
                })
                .collect();
            out.insert(format!("{table}:{}", cells[0]), cells.join("|"));
        }
    }
    out
}

/// Tables and row counts of a SQLite warehouse.
async fn warehouse_tables(url: &str) -> Vec<(String, i64)> {
    use sqlx::{Connection, Row};
    let mut c = sqlx::AnyConnection::connect(url).await.unwrap();
    let names: Vec<String> = sqlx::query("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .fetch_all(&mut c)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut out = Vec::new();
    for n in names {
        let r =
            sqlx::query(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM \"{n}\""))).fetch_one(&mut c).await.unwrap();
        out.push((n, r.get::<i64, _>(0)));
    }
    out
}

async fn adding_the_social_source_changes_nothing_that_was_there(backend: Backend) {
    let fx = setup(backend).await;
    let srv = &fx.srv;
    // A customer's existing setup: an email-campaign source synced into a
    // warehouse on a schedule.
    let cred = json_ok(srv.post("/v1/credentials/emailcampaign/api-token", json!({ "base_url": "https://team.mailcoach.app/api", "api_token": fx.mc_token, "connection_method": "cloud" })).send().await.unwrap()).await;
    let ec = json_ok(
        srv.post("/v1/sources", json!({ "connector_id": "conn_emailcampaign_edm", "name": "Newsletters", "configuration": { "base_url": "https://team.mailcoach.app/api", "credential_handle": cred["data"]["credential_handle"], "connection_method": "cloud" } }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let d = json_ok(
        srv.post(
            "/v1/destinations",
            json!({ "name": "wh", "kind": "sqlite", "configuration": { "file": "existing.db" } }),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    let p = json_ok(
        srv.post("/v1/pipelines", json!({ "name": "campaigns", "source_id": ec["data"]["source_id"], "destination_id": d["data"]["destination_id"],
            "streams": [{ "name": "campaigns", "sync_mode": "incremental_deduped" }, { "name": "email_lists", "sync_mode": "full_refresh_overwrite" }],
            "schedule": { "kind": "interval", "minutes": 1440 } }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let job = fx.sync(p["data"]["pipeline_id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let ws = srv.workspace_id().await;
    let existing_wh = format!("sqlite://{}?mode=ro", srv.warehouse(&ws, "existing.db").display());

    // The social connector starts unloaded, as before it was added.
    json_ok(srv.request(Method::POST, &format!("/v1/admin/plugins/{CONNECTOR}/unload")).send().await.unwrap()).await;
    let before = customer_rows(srv).await;
    let tables_before = warehouse_tables(&existing_wh).await;
    assert!(tables_before.iter().any(|(n, _)| n == "campaigns"));

    // Add it: load, authorise, choose, create, sync into its own warehouse.
    json_ok(srv.request(Method::POST, &format!("/v1/admin/plugins/{CONNECTOR}/load")).send().await.unwrap()).await;
    let handle = fx.authorise().await;
    let source = json_ok(fx.create_source(HubServer::valid_selection(&handle)).await).await;
    let pipeline = fx
        .pipeline(
            source["data"]["source_id"].as_str().unwrap(),
            json!({ "name": "social", "kind": "sqlite", "configuration": { "file": "social.db" } }),
        )
        .await;
    assert_eq!(fx.sync(&pipeline).await["status"], "succeeded");

    let after = customer_rows(srv).await;
    for (key, row) in &before {
        if key == &format!("plugin_states:{CONNECTOR}") {
            continue; // disabling and enabling its definition is the rollback
        }
        assert_eq!(after.get(key), Some(row), "{key} changed");
    }
    let added: Vec<&String> = after.keys().filter(|k| !before.contains_key(*k)).collect();
    for key in &added {
        let row = &after[*key];
        let ours = row.contains(CONNECTOR)
            || row.contains(&pipeline)
            || row.contains(source["data"]["source_id"].as_str().unwrap())
            || row.contains("social.db");
        assert!(ours, "{key} is not part of the social source: {row}");
    }
    assert_eq!(
        warehouse_tables(&existing_wh).await,
        tables_before,
        "the existing warehouse and its _service_ naming are untouched"
    );
}

on_both_backends!(adding_the_social_source_changes_nothing_that_was_there);

/// The entity options through the CLI: a page of them as a table, the
/// cursor to the next, the same as JSON, and a refusal with its code.
async fn the_cli_lists_entity_options_page_by_page(backend: Backend) {
    use crate::cli_api::{Cli, stderr, stdout};
    let fx = setup(backend).await;
    let handle = fx.authorise().await;
    let config = crate::support::private_dir();
    let cli = Cli::of(&fx.srv, config.path());
    let all = fx.options(&handle, "channel_ids", json!({ "portal_id": "62515", "brand_ids": ["101"] })).await;
    assert!(all.len() >= 2, "{all:?}");
    let chosen = r#"{"portal_id":"62515","brand_ids":["101"]}"#;
    let out = cli
        .run(&[
            "sources",
            "entities",
            "channel_ids",
            "--connector",
            CONNECTOR,
            "--credential",
            &handle,
            "--config",
            chosen,
            "--limit",
            "1",
        ])
        .await;
    let (table, notes) = (stdout(&out), stderr(&out));
    assert!(out.status.success(), "{notes}");
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "a header and one option: {table}");
    assert!(
        lines[0].starts_with("VALUE") && lines[1].starts_with(&all[0].0) && lines[1].contains(&all[0].1),
        "{table}"
    );
    assert!(notes.contains("more: repeat with --cursor 1"), "{notes}");
    let next = cli
        .json(&[
            "sources",
            "entities",
            "channel_ids",
            "--connector",
            CONNECTOR,
            "--credential",
            &handle,
            "--config",
            chosen,
            "--limit",
            "1",
            "--cursor",
            "1",
        ])
        .await;
    assert_eq!(next["items"][0]["value"], all[1].0.as_str(), "{next}");
    fx.assert_no_tokens(&next);
    let out = cli
        .run(&[
            "sources",
            "entities",
            "brand_ids",
            "--connector",
            CONNECTOR,
            "--credential",
            &handle,
            "--config",
            r#"{"portal_id":"1"}"#,
        ])
        .await;
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("CONNECTOR_INVALID_CONFIG"), "{}", stderr(&out));
}

on_both_backends!(the_cli_lists_entity_options_page_by_page);

/// Exactly once for the bundled social-media source in an append: its
/// posts come newest first, so its read checkpoints only at its end, and
/// a server killed (`kill -9`) in the middle of a first read and of a
/// resumed one finishes the job on restart with every post in the table
/// once: in SQLite, PostgreSQL and an Iceberg table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_social_append_killed_mid_read_leaves_every_post_once() {
    for into in crate::support::replicas::CrashInto::ALL {
        social_append_killed_mid_read(into).await;
    }
}

async fn social_append_killed_mid_read(into: crate::support::replicas::CrashInto) {
    use crate::support::process::ServerProcess;
    use crate::support::replicas::{CrashTarget, Processes};
    crate::support::init_crypto();
    let Some(mut target) = CrashTarget::new(into).await else { return };
    let ca = TestCa::new();
    let hub = Hub::new();
    hub.publish("ch-retail-fb", 2500);
    let names = ["api.hubapi.com"];
    let provider = FakeProvider::start(&ca, &names, hubspot::router(hub.clone())).await;
    let mut procs = Processes::new(&ca, &provider);
    procs.reaching(&provider, &names);
    procs.env.push(("SERVICE_JOB_LEASE_SECS", "1".into()));
    let clients = json!({ CONNECTOR: { "client_id": hubspot::CLIENT_ID, "client_secret": hubspot::CLIENT_SECRET } });
    procs.env.push(("SERVICE_OAUTH_CLIENTS", clients.to_string()));
    procs.env.extend(target.env());
    let mut server = ServerProcess::start(procs.env.clone()).await;
    let post = |base: &str, path: &str, body: Value| {
        let sent = procs.api(base, Method::POST, path).json(&body).send();
        async move { json_ok(sent.await.unwrap()).await }
    };
    procs.adopt_workspace(&server.base).await;
    // The OAuth flow, as a person runs it.
    let started = post(&server.base, "/v1/credentials/source/oauth/start", json!({ "connector_id": CONNECTOR })).await;
    let url = url::Url::parse(started["data"]["authorization_url"].as_str().unwrap()).unwrap();
    let q: HashMap<String, String> = url.query_pairs().into_owned().collect();
    let code = format!("code-{}", uuid::Uuid::new_v4().simple());
    hub.codes.lock().unwrap().insert(code.clone(), (q["code_challenge"].clone(), q["redirect_uri"].clone()));
    let cred =
        post(&server.base, "/v1/credentials/source/oauth/callback", json!({ "state": q["state"], "code": code })).await;
    let handle = cred["data"]["credential_handle"].as_str().unwrap().to_owned();
    let source = post(
        &server.base,
        "/v1/sources",
        json!({ "connector_id": CONNECTOR, "name": "Social", "configuration": HubServer::valid_selection(&handle) }),
    )
    .await;
    let dest = post(&server.base, "/v1/destinations", target.destination("social.db")).await;
    let pipeline = post(
        &server.base,
        "/v1/pipelines",
        json!({ "name": "social", "source_id": source["data"]["source_id"], "destination_id": dest["data"]["destination_id"],
            "streams": [{ "name": "posts", "sync_mode": "incremental_append" }] }),
    )
    .await;
    let pipeline = pipeline["data"]["pipeline_id"].as_str().unwrap().to_owned();
    let pages = || hub.since_seen.lock().unwrap().len();
    hub.page_delay_ms.store(100, Ordering::SeqCst);
    for round in ["first read", "resumed read"] {
        let before = pages();
        let job = post(&server.base, &format!("/v1/pipelines/{pipeline}/sync"), json!({})).await;
        let job_id = job["data"]["job_id"].as_str().unwrap().to_owned();
        for _ in 0..500 {
            if pages() >= before + 3 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        server.kill();
        assert!(pages() >= before + 3, "{round}: the read was under way when killed");
        server = ServerProcess::start(procs.env.clone()).await;
        let last = procs.wait(&server.base, &job_id).await;
        assert_eq!(last["status"], "succeeded", "{into:?}, {round}: {last}");
        let (n, ids) = target.count(&procs, "social.db", "posts", "broadcast_guid").await;
        let published = hub.published_on(&RETAIL) as i64;
        assert_eq!((n, ids), (published, published), "{into:?}, {round}: {n} rows for {ids} posts");
        // New posts for the resumed read.
        hub.publish("ch-retail-li", 1000);
    }
    server.kill();
}
