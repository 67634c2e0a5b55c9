//! The email-campaign connector end to end: the bundled plugin against a
//! fake Mailcoach-compatible provider over HTTPS (spec sections 2, 4, 8).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::on_both_backends;
use crate::support::mailcoach::{self, MailcoachState};
use crate::support::provider::{FakeProvider, TestCa};
use crate::support::trust::Trust;
use crate::support::{Backend, TestServer, count_rows, data_fingerprint, expect_error, json, json_ok, key_paths};

const SELF_HOSTED: &str = "https://mail.acme-corp.com/api";
const CLOUD: &str = "https://team.mailcoach.app/api";

struct Ec {
    srv: TestServer,
    provider: FakeProvider,
    mc: Arc<MailcoachState>,
    token: String,
}

async fn setup(backend: Backend) -> Ec {
    setup_with(backend, mailcoach::campaigns(25)).await
}

/// The provider with these campaigns.
async fn setup_with(backend: Backend, campaigns: Vec<Value>) -> Ec {
    let ca = TestCa::new();
    let token = format!("mc-token-{}", uuid::Uuid::new_v4().simple());
    let mc = Arc::new(MailcoachState { token: token.clone(), campaigns, subscribers: 130, ..Default::default() });
    let names = ["mail.acme-corp.com", "team.mailcoach.app"];
    let provider = FakeProvider::start(&ca, &names, mailcoach::router(mc.clone())).await;
    let trust = Trust::new(&ca).serving(&provider, &names).allowing("*.mailcoach.app");
    let srv = TestServer::start_with(backend, |c| c.plugins.egress = trust.policy()).await.unwrap();
    Ec { srv, provider, mc, token }
}

impl Ec {
    async fn store_token(&self, base_url: &str, token: &str, method: Option<&str>) -> reqwest::Response {
        let mut body = json!({ "base_url": base_url, "api_token": token });
        if let Some(m) = method {
            body["connection_method"] = json!(m);
        }
        self.srv.post("/v1/credentials/emailcampaign/api-token", body).send().await.unwrap()
    }

    async fn handle(&self, base_url: &str, method: Option<&str>) -> String {
        let created = json_ok(self.store_token(base_url, &self.token.clone(), method).await).await;
        created["data"]["credential_handle"].as_str().unwrap().to_owned()
    }
}

/// Every key a check or preview answer may hold. A new field fails this
/// test until it is added here on purpose.
const ALLOWED_KEYS: &[&str] = &[
    "request_id",
    "data",
    "data.connector_id",
    "data.credential_handle",
    "data.data_source",
    "data.data_source.status",
    "data.data_source.message",
    "data.data_source.connection_method",
    "data.data_source.base_url",
    "data.data_source.account",
    "data.field_coverage",
    "data.metrics",
    "data.campaigns",
    "data.campaigns.campaign_id",
    "data.campaigns.name",
    "data.campaigns.status",
    "data.campaigns.sent_at",
    "data.campaigns.metrics",
    "data.attribution",
    "data.attribution.traffic",
    "data.attribution.sales",
    "data.attribution.traffic.requires_external_attribution",
    "data.attribution.traffic.reason",
    "data.attribution.traffic.metrics",
    "data.attribution.traffic.metrics.website_sessions",
    "data.attribution.traffic.metrics.website_conversions",
    "data.attribution.sales.requires_external_attribution",
    "data.attribution.sales.reason",
    "data.attribution.sales.metrics",
    "data.attribution.sales.metrics.revenue",
    "data.attribution.sales.metrics.orders",
];

fn assert_allowlisted(body: &Value) {
    let metric_keys: Vec<String> = service::connectors::emailcampaign::METRICS
        .iter()
        .flat_map(|m| {
            [format!("data.metrics.{m}"), format!("data.field_coverage.{m}"), format!("data.campaigns.metrics.{m}")]
        })
        .collect();
    for path in key_paths(body) {
        assert!(
            ALLOWED_KEYS.contains(&path.as_str()) || metric_keys.contains(&path),
            "unexpected field {path} in {body}"
        );
    }
}

async fn api_token_is_stored_sealed_and_bound_to_the_base_url_host(backend: Backend) {
    let ec = setup(backend).await;
    let resp = ec.store_token(SELF_HOSTED, &ec.token.clone(), None).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let created = json_ok(resp).await;
    let d = &created["data"];
    assert!(d["credential_handle"].as_str().unwrap().starts_with("ch_"));
    assert_eq!(d["connector_id"], "conn_emailcampaign_edm");
    assert_eq!(d["hosts"], json!(["mail.acme-corp.com"]));
    assert_eq!(d["metadata"]["connection_method"], "self_hosted", "connection_method defaults to self_hosted");
    assert_eq!(d["status"], "active");
    assert!(!created.to_string().contains(&ec.token));
    let id = d["credential_id"].as_str().unwrap();
    let read = json_ok(ec.srv.get(&format!("/v1/credentials/{id}")).send().await.unwrap()).await;
    assert!(!read.to_string().contains(&ec.token), "never returned, not even in part");
    assert!(!read.to_string().contains(&ec.token[..12]));
    assert_eq!(ec.provider.hits(), 0, "storing makes no provider request");
}

async fn check_reports_connected_with_sanitised_metrics(backend: Backend) {
    let ec = setup(backend).await;
    let handle = ec.handle(SELF_HOSTED, None).await;
    let body = json_ok(
        ec.srv.post("/v1/connectors/emailcampaign/check", json!({ "credential_handle": handle })).send().await.unwrap(),
    )
    .await;
    let d = &body["data"];
    assert_eq!(d["connector_id"], "conn_emailcampaign_edm");
    assert_eq!(d["credential_handle"], handle.as_str());
    assert_eq!(d["data_source"]["status"], "connected", "{body}");
    assert_eq!(d["data_source"]["account"], "owner@acme-corp.com");
    assert!(d["metrics"]["sent"].as_u64().unwrap() > 0);
    assert!(d["metrics"]["open_rate"].as_f64().unwrap() > 0.0);
    assert_eq!(d["field_coverage"]["complaints"], "not_provided");
    assert_eq!(d["field_coverage"]["delivered"], "derived");
    assert_allowlisted(&body);
    let text = body.to_string();
    assert!(!text.contains(&ec.token) && !text.contains("html") && !text.contains("from_email"));
    // The provider saw the token only because the host injected it.
    assert!(ec.mc.seen_auth.lock().unwrap().iter().all(|a| *a == format!("Bearer {}", ec.token)));
}

async fn preview_shows_campaign_metrics_and_flags_traffic_and_sales(backend: Backend) {
    let ec = setup(backend).await;
    let handle = ec.handle(CLOUD, Some("cloud")).await;
    let body = json_ok(
        ec.srv
            .post("/v1/connectors/emailcampaign/edm/preview", json!({ "credential_handle": handle }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let d = &body["data"];
    assert_eq!(d["data_source"]["connection_method"], "cloud");
    let campaigns = d["campaigns"].as_array().unwrap();
    assert_eq!(campaigns.len(), 10);
    for c in campaigns {
        for m in service::connectors::emailcampaign::METRICS {
            assert!(c["metrics"].get(*m).is_some(), "metric {m} present");
        }
    }
    for area in ["traffic", "sales"] {
        assert_eq!(d["attribution"][area]["requires_external_attribution"], true);
        for v in d["attribution"][area]["metrics"].as_object().unwrap().values() {
            assert!(v.is_null(), "no invented values");
        }
    }
    assert_allowlisted(&body);
    assert!(!body.to_string().contains(&ec.token));
}

async fn check_and_preview_change_nothing(backend: Backend) {
    let ec = setup(backend).await;
    let handle = ec.handle(SELF_HOSTED, None).await;
    let before = data_fingerprint(&ec.srv).await;
    json_ok(
        ec.srv.post("/v1/connectors/emailcampaign/check", json!({ "credential_handle": handle })).send().await.unwrap(),
    )
    .await;
    json_ok(
        ec.srv
            .post("/v1/connectors/emailcampaign/edm/preview", json!({ "credential_handle": handle }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(before, data_fingerprint(&ec.srv).await);
}

async fn bad_tokens_rate_limits_and_outages_are_told_apart(backend: Backend) {
    let ec = setup(backend).await;
    let created = json_ok(ec.store_token(SELF_HOSTED, "wrong-token-value", None).await).await;
    let bad = created["data"]["credential_handle"].as_str().unwrap().to_owned();
    let body = json_ok(
        ec.srv.post("/v1/connectors/emailcampaign/check", json!({ "credential_handle": bad })).send().await.unwrap(),
    )
    .await;
    assert_eq!(body["data"]["data_source"]["status"], "invalid_credentials", "{body}");
    let resp = ec
        .srv
        .post("/v1/connectors/emailcampaign/edm/preview", json!({ "credential_handle": bad }))
        .send()
        .await
        .unwrap();
    expect_error(resp, 422, "PROVIDER_INVALID_CREDENTIALS").await;

    // A 429 with Retry-After is waited out within the call.
    let good = ec.handle(SELF_HOSTED, None).await;
    ec.mc.rate_limit_next.store(1, Ordering::SeqCst);
    json_ok(
        ec.srv
            .post("/v1/connectors/emailcampaign/edm/preview", json!({ "credential_handle": good }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    // A lasting outage ends as a typed provider error after bounded retries.
    ec.mc.fail_next.store(100, Ordering::SeqCst);
    let resp = ec
        .srv
        .post("/v1/connectors/emailcampaign/edm/preview", json!({ "credential_handle": good }))
        .send()
        .await
        .unwrap();
    expect_error(resp, 502, "PROVIDER_UNAVAILABLE").await;
    let retried = 100 - ec.mc.fail_next.load(Ordering::SeqCst);
    assert!((2..=10).contains(&retried), "bounded retries: {retried}");
}

async fn connection_method_is_optional_and_unknown_values_are_refused(backend: Backend) {
    let ec = setup(backend).await;
    let resp = ec.store_token(SELF_HOSTED, "t", Some("on_premises")).await;
    let body = expect_error(resp, 400, "VALIDATION_FAILED").await;
    assert_eq!(body["details"]["field"], "connection_method");
    // A cloud URL must be on the cloud domain.
    let resp = ec.store_token(SELF_HOSTED, "t", Some("cloud")).await;
    let body = expect_error(resp, 400, "BASE_URL_REJECTED").await;
    assert_eq!(body["details"]["rule_number"], 7);
    assert_eq!(ec.provider.hits(), 0);
}

async fn the_connector_is_addressed_by_its_canonical_id_and_refused_when_unloaded(backend: Backend) {
    let ec = setup(backend).await;
    let c = json_ok(ec.srv.get("/v1/connectors/source:mailcoach").send().await.unwrap()).await;
    assert_eq!(c["data"]["connector_id"], "conn_emailcampaign_edm", "legacy aliases resolve to the canonical id");
    let handle = ec.handle(SELF_HOSTED, None).await;
    json_ok(ec.srv.request(Method::POST, "/v1/admin/plugins/conn_emailcampaign_edm/unload").send().await.unwrap())
        .await;
    let resp =
        ec.srv.post("/v1/connectors/emailcampaign/check", json!({ "credential_handle": handle })).send().await.unwrap();
    expect_error(resp, 409, "CONNECTOR_UNAVAILABLE").await;
    json_ok(ec.srv.request(Method::POST, "/v1/admin/plugins/conn_emailcampaign_edm/load").send().await.unwrap()).await;
    json_ok(
        ec.srv.post("/v1/connectors/emailcampaign/check", json!({ "credential_handle": handle })).send().await.unwrap(),
    )
    .await;
}

/// Base URLs that break the rules in every spelling we could think of.
const HOSTILE: &[&str] = &[
    "http://mail.acme-corp.com/api",
    "HTTPS://mail.acme-corp.com/api",
    "https://MAIL.acme-corp.com/api",
    "https://mail.acme-corp.com/api?x=1",
    "https://mail.acme-corp.com/api?",
    "https://mail.acme-corp.com/api#",
    "https://mail.acme-corp.com/api#frag",
    "https://user@mail.acme-corp.com/api",
    "https://user:pw@mail.acme-corp.com/api",
    "https://mail.acme-corp.com@evil.example.com/api",
    "https://evil.example.com@mail.acme-corp.com/api",
    "https://mail.acme-corp.com%40evil.com/api",
    "https://mail.acme-corp.com:8443/api",
    "https://mail.acme-corp.com:80/api",
    "https://mail.acme-corp.com:0443/api",
    "https://mail.acme-corp.com:/api",
    "https://127.0.0.1/api",
    "https://2130706433/api",
    "https://0x7f000001/api",
    "https://0177.0.0.1/api",
    "https://127.1/api",
    "https://[::1]/api",
    "https://[::ffff:127.0.0.1]/api",
    "https://[fd00::1]/api",
    "https://[::]/api",
    "https://169.254.169.254/api",
    "https://10.0.0.1/api",
    "https://192.168.1.1/api",
    "https://100.64.0.1/api",
    "https://0.0.0.0/api",
    "https://0/api",
    "https://localhost/api",
    "https://localhost./api",
    "https://foo.localhost/api",
    "https://intranet/api",
    "https://db.internal/api",
    "https://printer.local/api",
    "https://router.lan/api",
    "https://metadata.google.internal/api",
    "https://mail.acme-corp.com./api",
    "https://.mail.acme-corp.com/api",
    "https://mail.acme-corp.com/api/../api",
    "https://mail.acme-corp.com/./api",
    "https://mail.acme-corp.com/v1",
    "https://mail.acme-corp.com/",
    "https://mail.acme-corp.com",
    "https://mail.acme-corp.com/apix",
    "https://mail.acme-corp.com/api/",
    "https://mail.acme-corp.com\\@evil.com/api",
    "https:\\\\mail.acme-corp.com/api",
    " https://mail.acme-corp.com/api",
    "https://mail.acme-corp.com/api ",
    "https://mail.acme-corp.com\t/api",
    "https://mail.acme-corp.com/a\npi",
    "https://\u{ff4d}ail.acme-corp.com/api",
    "https://m\u{430}il.acme-corp.com/api",
    "https://mail\u{3002}acme-corp.com/api",
    "https://xn--mil-8cd.acme-corp.com/api",
    "https://evilacme-corp.com/api",
    "https://mail.acme-corp.com.evil.example.com/api",
    "https://acme-corp.com/api",
    "https://mailcoach.app/api",
    "https://evilmailcoach.app/api",
    "https://team.mailcoach.app.evil.example.com/api",
    "https://%6dail.acme-corp.com/api",
    "https://mail.acme-corp.com/%61pi",
    "ftp://mail.acme-corp.com/api",
    "javascript:alert(1)",
    "",
    "mail.acme-corp.com/api",
    "//mail.acme-corp.com/api",
    "https:mail.acme-corp.com/api",
    "https:/mail.acme-corp.com/api",
    "https:///mail.acme-corp.com/api",
];

async fn hostile_base_urls_are_rejected_before_any_provider_request(backend: Backend) {
    let ec = setup(backend).await;
    assert!(HOSTILE.len() >= 50);
    let handle = ec.handle(SELF_HOSTED, None).await;
    for raw in HOSTILE {
        let resp = ec.store_token(raw, "some-token", None).await;
        let (status, body) = json(resp).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{raw:?} must be rejected: {body}");
        assert_eq!(body["code"], "BASE_URL_REJECTED", "{raw:?}: {body}");
        assert!(body["details"]["rule"].is_string() && body["details"]["rule_number"].is_u64(), "{raw:?}: {body}");
        let resp = ec
            .srv
            .post("/v1/connectors/emailcampaign/check", json!({ "credential_handle": handle, "base_url": raw }))
            .send()
            .await
            .unwrap();
        let (status, body) = json(resp).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "check with {raw:?}: {body}");
        assert_eq!(body["code"], "BASE_URL_REJECTED", "check with {raw:?}: {body}");
    }
    assert_eq!(ec.provider.hits(), 0, "the provider received no request");
    assert_eq!(ec.mc.requests.load(Ordering::SeqCst), 0);
}

on_both_backends!(
    api_token_is_stored_sealed_and_bound_to_the_base_url_host,
    check_reports_connected_with_sanitised_metrics,
    preview_shows_campaign_metrics_and_flags_traffic_and_sales,
    check_and_preview_change_nothing,
    bad_tokens_rate_limits_and_outages_are_told_apart,
    connection_method_is_optional_and_unknown_values_are_refused,
    the_connector_is_addressed_by_its_canonical_id_and_refused_when_unloaded,
    hostile_base_urls_are_rejected_before_any_provider_request,
);

async fn sources_are_created_validated_and_deleted_only_when_unused(backend: Backend) {
    let ec = setup(backend).await;
    let srv = &ec.srv;
    let handle = ec.handle(SELF_HOSTED, None).await;
    // A legacy alias and a configuration without connection_method still work.
    let resp = srv
        .post("/v1/sources", json!({ "connector_id": "source:mailcoach", "name": "Newsletters", "configuration": { "base_url": SELF_HOSTED, "credential_handle": handle } }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let src = json_ok(resp).await;
    assert_eq!(src["data"]["connector_id"], "conn_emailcampaign_edm");
    let id = src["data"]["source_id"].as_str().unwrap().to_owned();

    let post = |cfg: Value| {
        srv.post("/v1/sources", json!({ "connector_id": "conn_emailcampaign_edm", "name": "x", "configuration": cfg }))
    };
    expect_error(
        post(json!({ "base_url": "https://127.0.0.1/api", "credential_handle": handle })).send().await.unwrap(),
        400,
        "BASE_URL_REJECTED",
    )
    .await;
    expect_error(
        post(json!({ "base_url": SELF_HOSTED, "credential_handle": handle, "connection_method": "ftp" }))
            .send()
            .await
            .unwrap(),
        400,
        "CONFIGURATION_INVALID",
    )
    .await;
    expect_error(
        post(json!({ "base_url": SELF_HOSTED, "credential_handle": "ch_nope" })).send().await.unwrap(),
        400,
        "UNKNOWN_CREDENTIAL_HANDLE",
    )
    .await;
    expect_error(
        post(json!({ "base_url": SELF_HOSTED, "api_token": "raw" })).send().await.unwrap(),
        400,
        "SECRET_NOT_ACCEPTED",
    )
    .await;
    expect_error(post(json!({ "base_url": SELF_HOSTED })).send().await.unwrap(), 400, "CONFIGURATION_INVALID").await;
    assert_eq!(ec.provider.hits(), 0, "validation makes no provider request");

    let patched = json_ok(
        srv.request(Method::PATCH, &format!("/v1/sources/{id}"))
            .json(&json!({ "name": "Renamed", "configuration": { "connection_method": "self_hosted" } }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(patched["data"]["name"], "Renamed");
    assert_eq!(patched["data"]["configuration"]["base_url"], SELF_HOSTED);

    // Unloaded: new work refused, the saved source keeps its configuration.
    json_ok(srv.request(Method::POST, "/v1/admin/plugins/conn_emailcampaign_edm/unload").send().await.unwrap()).await;
    expect_error(
        post(json!({ "base_url": SELF_HOSTED, "credential_handle": handle })).send().await.unwrap(),
        409,
        "CONNECTOR_UNAVAILABLE",
    )
    .await;
    let kept = json_ok(srv.get(&format!("/v1/sources/{id}")).send().await.unwrap()).await;
    assert_eq!(kept["data"]["configuration"]["credential_handle"], handle.as_str());
    json_ok(srv.request(Method::POST, "/v1/admin/plugins/conn_emailcampaign_edm/load").send().await.unwrap()).await;

    // A connection that uses the source blocks its deletion.
    {
        use sqlx::Connection;
        let mut conn = sqlx::AnyConnection::connect(&srv.state.config.database_url).await.unwrap();
        let ws = srv.workspace_id().await;
        sqlx::query(
            "INSERT INTO pipelines (id, workspace_id, source_id, name, created_at) VALUES ('pl_test', $1, $2, 'p', 0)",
        )
        .bind(&ws)
        .bind(&id)
        .execute(&mut conn)
        .await
        .unwrap();
        let e = expect_error(
            srv.request(Method::DELETE, &format!("/v1/sources/{id}")).send().await.unwrap(),
            409,
            "SOURCE_IN_USE",
        )
        .await;
        assert_eq!(e["details"]["connection_ids"], json!(["pl_test"]));
        sqlx::query("DELETE FROM pipelines WHERE id = 'pl_test'").execute(&mut conn).await.unwrap();
    }
    let deleted = json_ok(srv.request(Method::DELETE, &format!("/v1/sources/{id}")).send().await.unwrap()).await;
    assert_eq!(deleted["data"]["deletion_verified"], true);
    expect_error(srv.get(&format!("/v1/sources/{id}")).send().await.unwrap(), 404, "404").await;
}

on_both_backends!(sources_are_created_validated_and_deleted_only_when_unused);

/// The bundled connector as a pipeline source: every stream lands in its
/// own warehouse table, nested provider fields as JSON text, and a second
/// sync adds no duplicates.
async fn a_pipeline_syncs_every_stream_into_a_warehouse(backend: Backend) {
    let ec = setup(backend).await;
    let srv = &ec.srv;
    let handle = ec.handle(SELF_HOSTED, None).await;
    let configuration = json!({ "base_url": SELF_HOSTED, "credential_handle": handle });
    let src = json_ok(
        srv.post(
            "/v1/sources",
            json!({ "connector_id": "conn_emailcampaign_edm", "name": "Newsletters", "configuration": configuration }),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    let source_id = src["data"]["source_id"].as_str().unwrap().to_owned();
    let prep =
        json_ok(srv.post("/v1/pipelines/prepare", json!({ "source_id": source_id })).send().await.unwrap()).await;
    let offered: Vec<&str> =
        prep["data"]["streams"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(offered, ["campaigns", "campaign_statistics", "email_lists", "subscribers"], "{prep}");
    let dest = json_ok(
        srv.post("/v1/destinations", json!({ "name": "w", "kind": "sqlite", "configuration": { "file": "mail.db" } }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let streams = json!([
        { "name": "campaigns", "sync_mode": "incremental_deduped" },
        { "name": "campaign_statistics", "sync_mode": "full_refresh_overwrite" },
        { "name": "email_lists", "sync_mode": "full_refresh_overwrite" },
        { "name": "subscribers", "sync_mode": "incremental_deduped" },
    ]);
    let body = json!({ "name": "mail", "source_id": source_id, "destination_id": dest["data"]["destination_id"], "streams": streams });
    let p = json_ok(srv.post("/v1/pipelines", body).send().await.unwrap()).await;
    let pipeline = p["data"]["pipeline_id"].as_str().unwrap().to_owned();

    let warehouse = format!("sqlite://{}?mode=ro", srv.warehouse(&srv.workspace_id().await, "mail.db").display());
    let expected = [("campaigns", 25), ("campaign_statistics", 25), ("email_lists", 1), ("subscribers", 130)];
    for run in 0..2 {
        let job =
            json_ok(srv.request(Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap()).await;
        let job = srv.wait_job(job["data"]["job_id"].as_str().unwrap()).await;
        assert_eq!(job["status"], "succeeded", "run {run}: {job}");
        for (stream, n) in expected {
            assert_eq!(count_rows(&warehouse, stream).await, n, "run {run}: {stream}");
        }
        if run == 0 {
            assert_eq!(job["progress"]["streams"]["subscribers"]["records"], 130, "{job}");
        }
    }

    use sqlx::{Connection, Row};
    let mut c = sqlx::AnyConnection::connect(&warehouse).await.unwrap();
    let row = sqlx::query(
        "SELECT extra_attributes, tags, last_name, _service_meta FROM subscribers WHERE email = 'reader1@example.com'",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    assert_eq!(row.get::<String, _>(0), r#"{"plan":"pro"}"#, "nested objects land as JSON text");
    assert_eq!(row.get::<String, _>(1), r#"["newsletter"]"#);
    assert_eq!(row.try_get::<Option<String>, _>(2).unwrap(), None, "null lands as NULL");
    let meta: Value = serde_json::from_str(&row.get::<String, _>(3)).unwrap();
    assert_eq!(meta["stream"], "subscribers");
    let stats =
        sqlx::query("SELECT COUNT(*) FROM campaign_statistics WHERE uuid IS NOT NULL").fetch_one(&mut c).await.unwrap();
    assert_eq!(stats.get::<i64, _>(0), 25);
}

on_both_backends!(a_pipeline_syncs_every_stream_into_a_warehouse);

/// The bundled connector under a data contract: a campaign whose name the
/// provider sends as a number is kept aside, as read, while the other 24
/// load and the ledger balances; once the contract lets the type change
/// through, a replay loads it into the deduplicated table, once.
async fn a_drifted_campaign_is_kept_aside_and_replayed_once_the_contract_allows_it(backend: Backend) {
    let mut campaigns = mailcoach::campaigns(25);
    campaigns[3]["name"] = json!(404);
    let drifted = campaigns[3].clone();
    let ec = setup_with(backend, campaigns).await;
    let srv = &ec.srv;
    let handle = ec.handle(SELF_HOSTED, None).await;
    let configuration = json!({ "base_url": SELF_HOSTED, "credential_handle": handle });
    let body =
        json!({ "connector_id": "conn_emailcampaign_edm", "name": "Newsletters", "configuration": configuration });
    let source = json_ok(srv.post("/v1/sources", body).send().await.unwrap()).await;
    let body = json!({ "name": "w", "kind": "sqlite", "configuration": { "file": "mail.db" } });
    let dest = json_ok(srv.post("/v1/destinations", body).send().await.unwrap()).await;
    let stream = |rule: &str| json!([{ "name": "campaigns", "sync_mode": "incremental_deduped", "contract": { "type_changes": rule } }]);
    let body = json!({ "name": "mail", "source_id": source["data"]["source_id"],
        "destination_id": dest["data"]["destination_id"], "streams": stream("quarantine") });
    let pipeline = json_ok(srv.post("/v1/pipelines", body).send().await.unwrap()).await["data"]["pipeline_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let run = |path: String| async move {
        let job = json_ok(srv.request(Method::POST, &path).send().await.unwrap()).await;
        srv.wait_job(job["data"]["job_id"].as_str().unwrap()).await
    };
    let counts = |job: &Value| -> Vec<Value> {
        let ledger = &job["progress"]["ledger"]["streams"]["campaigns"];
        ["read", "loaded", "quarantined", "unaccounted"].iter().map(|k| ledger[*k].clone()).collect()
    };
    let job = run(format!("/v1/pipelines/{pipeline}/sync")).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(counts(&job), [json!(25), json!(24), json!(1), json!(0)], "{job}");
    let warehouse = format!("sqlite://{}?mode=ro", srv.warehouse(&srv.workspace_id().await, "mail.db").display());
    assert_eq!(count_rows(&warehouse, "campaigns").await, 24);
    let rejected = json_ok(srv.get(&format!("/v1/pipelines/{pipeline}/rejected")).send().await.unwrap()).await;
    let kept = rejected["data"]["items"].as_array().unwrap();
    assert_eq!(kept.len(), 1, "{rejected}");
    assert_eq!((&kept[0]["reason"], &kept[0]["pointer"]), (&json!("type_mismatch"), &json!("/name")), "{rejected}");
    assert_eq!(kept[0]["record"]["uuid"], drifted["uuid"], "the record as the connector read it: {rejected}");
    assert_eq!(kept[0]["record"]["name"], 404);

    let patch = json!({ "streams": stream("evolve") });
    json_ok(srv.request(Method::PATCH, &format!("/v1/pipelines/{pipeline}")).json(&patch).send().await.unwrap()).await;
    let job = run(format!("/v1/pipelines/{pipeline}/rejected/replay")).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(counts(&job), [json!(1), json!(1), json!(0), json!(0)], "{job}");
    assert_eq!(count_rows(&warehouse, "campaigns").await, 25);
    let job = run(format!("/v1/pipelines/{pipeline}/sync")).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(count_rows(&warehouse, "campaigns").await, 25, "a later sync adds no second row of it");
}

on_both_backends!(a_drifted_campaign_is_kept_aside_and_replayed_once_the_contract_allows_it);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_takes_too_long_is_abandoned_with_503() {
    let ca = TestCa::new();
    let token = format!("mc-token-{}", uuid::Uuid::new_v4().simple());
    let mc =
        Arc::new(MailcoachState { token: token.clone(), campaigns: mailcoach::campaigns(3), ..Default::default() });
    let provider = FakeProvider::start(&ca, &["mail.acme-corp.com"], mailcoach::router(mc.clone())).await;
    let trust = Trust::new(&ca).serving(&provider, &["mail.acme-corp.com"]);
    let srv = TestServer::start_with(Backend::Sqlite, |c| {
        c.plugins.egress = trust.policy();
        c.limits.request_timeout = std::time::Duration::from_secs(1);
    })
    .await
    .unwrap();
    let created = json_ok(
        srv.post("/v1/credentials/emailcampaign/api-token", json!({ "base_url": SELF_HOSTED, "api_token": token }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let handle = created["data"]["credential_handle"].as_str().unwrap().to_owned();
    // A slow provider holds the request past the server's deadline.
    mc.delay_ms.store(4_000, Ordering::SeqCst);
    let started = std::time::Instant::now();
    let resp =
        srv.post("/v1/connectors/emailcampaign/check", json!({ "credential_handle": handle })).send().await.unwrap();
    let e = expect_error(resp, 503, "REQUEST_TIMEOUT").await;
    assert_eq!(e["details"]["timeout_seconds"], 1);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(4),
        "answered at the deadline, not when the provider was done"
    );
    srv.stop().await;
}

/// A long list is read with its next pages requested ahead once the first
/// page names the last one: several requests are on their way at once,
/// never more than the connector's window; a page answered 429 while it
/// was ahead is retried; every record lands exactly once.
async fn pages_are_requested_ahead_and_each_record_lands_once(backend: Backend) {
    const CAMPAIGNS: usize = 1_050;
    let ca = TestCa::new();
    let token = format!("mc-token-{}", uuid::Uuid::new_v4().simple());
    let mc = Arc::new(MailcoachState {
        token: token.clone(),
        campaigns: mailcoach::campaigns(CAMPAIGNS),
        ..Default::default()
    });
    let provider = FakeProvider::start(&ca, &["mail.acme-corp.com"], mailcoach::router(mc.clone())).await;
    let trust = Trust::new(&ca).serving(&provider, &["mail.acme-corp.com"]);
    let srv = TestServer::start_with(backend, |c| c.plugins.egress = trust.policy()).await.unwrap();
    let ec = Ec { srv, provider, mc, token };
    let srv = &ec.srv;
    let connector = json_ok(srv.get("/v1/connectors/conn_emailcampaign_edm").send().await.unwrap()).await;
    assert_eq!(connector["data"]["interface_version"], "service:connector@1.1.0", "it imports http-ahead: {connector}");
    let handle = ec.handle(SELF_HOSTED, None).await;
    let configuration = json!({ "base_url": SELF_HOSTED, "credential_handle": handle });
    let src = json_ok(
        srv.post(
            "/v1/sources",
            json!({ "connector_id": "conn_emailcampaign_edm", "name": "Newsletters", "configuration": configuration }),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    let dest = json_ok(
        srv.post("/v1/destinations", json!({ "name": "w", "kind": "sqlite", "configuration": { "file": "ahead.db" } }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let body = json!({ "name": "ahead", "source_id": src["data"]["source_id"], "destination_id": dest["data"]["destination_id"], "streams": [{ "name": "campaigns", "sync_mode": "full_refresh_overwrite" }] });
    let p = json_ok(srv.post("/v1/pipelines", body).send().await.unwrap()).await;
    let pipeline = p["data"]["pipeline_id"].as_str().unwrap().to_owned();

    // Slow answers make the overlap certain; page 5 is refused once.
    ec.mc.delay_ms.store(40, Ordering::SeqCst);
    ec.mc.rate_limit_page.store(5, Ordering::SeqCst);
    ec.mc.most_in_flight.store(0, Ordering::SeqCst);
    let job = json_ok(srv.request(Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap()).await;
    let job = srv.wait_job(job["data"]["job_id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(ec.mc.rate_limit_page.load(Ordering::SeqCst), 0, "page 5 was refused once");
    let most = ec.mc.most_in_flight.load(Ordering::SeqCst);
    assert!((2..=3).contains(&most), "pages requested ahead, at most 3 at once: {most}");

    let warehouse = format!("sqlite://{}?mode=ro", srv.warehouse(&srv.workspace_id().await, "ahead.db").display());
    assert_eq!(count_rows(&warehouse, "campaigns").await, CAMPAIGNS as i64);
    use sqlx::{Connection, Row};
    let mut c = sqlx::AnyConnection::connect(&warehouse).await.unwrap();
    let distinct = sqlx::query("SELECT COUNT(DISTINCT uuid) FROM campaigns").fetch_one(&mut c).await.unwrap();
    assert_eq!(distinct.get::<i64, _>(0), CAMPAIGNS as i64, "each campaign once");
}

on_both_backends!(pages_are_requested_ahead_and_each_record_lands_once);

/// Exactly once for the bundled email-campaign source in an append: a
/// first read checkpoints only at its end, and a resumed read's page
/// checkpoints repeat the saved state, so a server killed (`kill -9`) in
/// the middle of either finishes the job on restart with every subscriber
/// in the table once: in SQLite, PostgreSQL and an Iceberg table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_email_campaign_append_killed_mid_read_leaves_every_subscriber_once() {
    for into in crate::support::replicas::CrashInto::ALL {
        email_campaign_append_killed_mid_read(into).await;
    }
}

async fn email_campaign_append_killed_mid_read(into: crate::support::replicas::CrashInto) {
    use crate::support::process::ServerProcess;
    use crate::support::replicas::{CrashTarget, Processes};
    crate::support::init_crypto();
    let Some(mut target) = CrashTarget::new(into).await else { return };
    let ca = TestCa::new();
    let token = format!("mc-crash-{}", uuid::Uuid::new_v4().simple());
    let mc = Arc::new(MailcoachState {
        token: token.clone(),
        campaigns: mailcoach::campaigns(3),
        subscribers: 1500,
        ..Default::default()
    });
    let names = ["mail.acme-corp.com"];
    let provider = FakeProvider::start(&ca, &names, mailcoach::router(mc.clone())).await;
    let mut procs = Processes::new(&ca, &provider);
    procs.reaching(&provider, &names);
    procs.env.push(("SERVICE_JOB_LEASE_SECS", "1".into()));
    procs.env.extend(target.env());
    let mut server = ServerProcess::start(procs.env.clone()).await;
    let post = |base: &str, path: &str, body: Value| {
        let sent = procs.api(base, Method::POST, path).json(&body).send();
        async move { json_ok(sent.await.unwrap()).await }
    };
    procs.adopt_workspace(&server.base).await;
    let cred = post(
        &server.base,
        "/v1/credentials/emailcampaign/api-token",
        json!({ "base_url": SELF_HOSTED, "api_token": token }),
    )
    .await;
    let configuration = json!({ "base_url": SELF_HOSTED, "credential_handle": cred["data"]["credential_handle"] });
    let source = post(
        &server.base,
        "/v1/sources",
        json!({ "connector_id": "conn_emailcampaign_edm", "name": "mail", "configuration": configuration }),
    )
    .await;
    let dest = post(&server.base, "/v1/destinations", target.destination("mail.db")).await;
    let pipeline = post(
        &server.base,
        "/v1/pipelines",
        json!({ "name": "mail", "source_id": source["data"]["source_id"], "destination_id": dest["data"]["destination_id"],
            "streams": [{ "name": "subscribers", "sync_mode": "incremental_append" }] }),
    )
    .await;
    let pipeline = pipeline["data"]["pipeline_id"].as_str().unwrap().to_owned();
    // Each answer waits: a read of every page takes a second or so.
    mc.delay_ms.store(40, Ordering::SeqCst);
    for round in ["first read", "resumed read"] {
        let before = mc.requests.load(Ordering::SeqCst);
        let job = post(&server.base, &format!("/v1/pipelines/{pipeline}/sync"), json!({})).await;
        let job_id = job["data"]["job_id"].as_str().unwrap().to_owned();
        for _ in 0..500 {
            if mc.requests.load(Ordering::SeqCst) >= before + 6 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        server.kill();
        assert!(mc.requests.load(Ordering::SeqCst) >= before + 6, "{round}: the read was under way when killed");
        server = ServerProcess::start(procs.env.clone()).await;
        let last = procs.wait(&server.base, &job_id).await;
        assert_eq!(last["status"], "succeeded", "{into:?}, {round}: {last}");
        let (n, ids) = target.count(&procs, "mail.db", "subscribers", "uuid").await;
        assert_eq!((n, ids), (1500, 1500), "{into:?}, {round}: {n} rows for {ids} subscribers");
    }
    server.kill();
}
