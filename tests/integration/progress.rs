//! Watching a job: per-stream progress on the job record and as
//! Server-Sent Events from `GET /v1/jobs/{job_id}/events`, and the
//! per-pipeline series of `/metrics`.

use std::sync::atomic::Ordering;

use reqwest::Method;
use serde_json::{Value, json};

use crate::on_both_backends;
use crate::support::events::events_source_beside;
use crate::support::provider::TestCa;
use crate::support::{Backend, expect_error, json_ok};

/// Reads a job's event stream to its end: (event, data) in order.
async fn events(srv: &crate::support::TestServer, token: &str, job_id: &str) -> Vec<(String, Value)> {
    let mut res = srv.request_as(token, Method::GET, &format!("/v1/jobs/{job_id}/events")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "text/event-stream");
    let mut buffer = Vec::new();
    let mut out = Vec::new();
    while let Some(chunk) =
        tokio::time::timeout(std::time::Duration::from_secs(60), res.chunk()).await.unwrap().unwrap()
    {
        buffer.extend_from_slice(&chunk);
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let block: Vec<u8> = buffer.drain(..end + 2).collect();
            let block = String::from_utf8(block).unwrap();
            let name = block.lines().find_map(|l| l.strip_prefix("event: ")).map(str::to_owned);
            let data = block.lines().find_map(|l| l.strip_prefix("data: "));
            if let (Some(name), Some(data)) = (name, data) {
                out.push((name, serde_json::from_str(data).unwrap()));
            }
        }
    }
    out
}

/// Starts a sync of a new pipeline whose provider waits `delay_ms` per
/// page: (pipeline id, job id).
async fn slow_sync(fx: &crate::support::events::EventsSource, delay_ms: u64) -> (String, String) {
    fx.events.delay_ms.store(delay_ms, Ordering::SeqCst);
    let dest = fx.destination("sqlite", json!({ "file": "w.db" })).await;
    let pipeline = fx.pipeline(&dest, "incremental_append").await;
    let job =
        json_ok(fx.srv.request(Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap()).await;
    (pipeline, job["data"]["job_id"].as_str().unwrap().to_owned())
}

/// A sync's progress streams as it runs: its attempt, per-stream counters
/// that grow batch by batch (read and written, rate, last checkpoint),
/// and its end, after which the stream closes. Members of the workspace
/// may follow it; nobody else learns it exists.
async fn a_sync_streams_its_progress_while_it_runs(backend: Backend) {
    let fx = events_source_beside(backend, 1500, &TestCa::new(), "", |_| {}).await;
    let (pipeline, id) = slow_sync(&fx, 250).await;
    let srv = &fx.srv;
    let ws = srv.workspace_id().await;
    let (_, viewer) = srv.user_in(&ws, service::access::Role::Viewer).await;
    let seen = events(srv, &viewer, &id).await;

    let names: Vec<&str> = seen.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"attempt_started"), "{names:?}");
    assert_eq!(names.last(), Some(&"finished"), "{names:?}");
    assert_eq!(seen.last().unwrap().1["status"], "succeeded");
    let written: Vec<u64> = seen
        .iter()
        .filter(|(n, _)| n == "progress")
        .map(|(_, d)| d["progress"]["streams"]["events"]["records"].as_u64().unwrap_or(0))
        .collect();
    assert!(written.len() >= 3, "progress came batch by batch: {written:?}");
    assert!(written.windows(2).all(|w| w[0] <= w[1]), "{written:?}");
    assert!(written.iter().any(|&n| n > 0 && n < 1500), "a part of the stream was shown before its end: {written:?}");
    assert_eq!(*written.last().unwrap(), 1500);
    let last = &seen.iter().rev().find(|(n, _)| n == "progress").unwrap().1["progress"]["streams"]["events"];
    assert_eq!(last["records_read"], 1500);
    assert!(last["bytes_read"].as_u64().unwrap() > 0);
    assert!(last["records_per_second"].as_f64().unwrap() > 0.0, "{last}");
    assert!(last["checkpointed_at"].is_string(), "{last}");
    assert_eq!(last["status"], "done");
    assert!(last["records_remaining"].is_null(), "the source reports no total");

    // A stream that keeps no state shows no checkpoint.
    let dest2 = fx.destination("sqlite", json!({ "file": "o.db" })).await;
    let overwrite = fx.pipeline(&dest2, "full_refresh_overwrite").await;
    fx.events.delay_ms.store(0, Ordering::SeqCst);
    let refreshed = fx.sync(&overwrite).await;
    assert_eq!(refreshed["status"], "succeeded");
    let stream = &refreshed["progress"]["streams"]["events"];
    assert_eq!(stream["records"], 1500, "{stream}");
    assert!(stream["checkpointed_at"].is_null(), "nothing was saved: {stream}");

    // A job that ended answers its end at once.
    let again = events(srv, &viewer, &id).await;
    assert_eq!(again.last().unwrap().0, "finished");
    assert!(again.len() <= 2, "{again:?}");
    // Another workspace gets no stream.
    let (_, other) = srv.other_workspace().await;
    expect_error(
        srv.request_as(&other, Method::GET, &format!("/v1/jobs/{id}/events")).send().await.unwrap(),
        404,
        "404",
    )
    .await;

    // /metrics: the stream's counters and the pipeline's freshness.
    let metrics = srv.get("/metrics").send().await.unwrap().text().await.unwrap();
    let series = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && l.contains(&format!("pipeline=\"{pipeline}\"")))
            .unwrap_or_else(|| panic!("no {name} for the pipeline"))
            .to_owned()
    };
    let written = series("pipeline_records_written_total");
    // Tenants appear as opaque labels: neither the workspace's id nor the
    // stream's name is in any series.
    assert!(written.contains("workspace=\"w_") && written.contains("stream=\"s_"), "{written}");
    assert!(!metrics.contains(ws.as_str()) && !metrics.contains("stream=\"events\""), "{metrics}");
    assert!(written.ends_with(" 1500"), "{written}");
    assert!(series("pipeline_records_read_total").ends_with(" 1500"));
    let age: f64 = series("pipeline_last_success_age_seconds").rsplit(' ').next().unwrap().parse().unwrap();
    assert!((0.0..120.0).contains(&age), "{age}");
    assert!(series("pipeline_freshness_breached").ends_with(" 0"));
    assert!(metrics.contains("pipelines_not_listed 0"), "{metrics}");
    fx.srv.stop().await;
}

/// The pages of pipelines and jobs are for signed-in members of the
/// workspace only, escape what users named, and let only a job's page run
/// its one script.
async fn the_watch_pages_show_a_workspace_only_to_its_members(backend: Backend) {
    use secrecy::SecretString;
    use service::access::admin::{OnPasswordChange, set_password};
    let fx = events_source_beside(backend, 300, &TestCa::new(), "", |_| {}).await;
    let srv = &fx.srv;
    let dest = fx.destination("sqlite", json!({ "file": "w.db" })).await;
    let named = json_ok(
        srv.post("/v1/pipelines", json!({ "name": "<script>alert(1)</script>", "source_id": fx.source_id, "destination_id": dest, "streams": [{ "name": "events", "sync_mode": "incremental_append" }], "freshness_minutes": 60 }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let pipeline = named["data"]["pipeline_id"].as_str().unwrap().to_owned();
    let job = fx.sync(&pipeline).await;
    let job_id = job["job_id"].as_str().unwrap().to_owned();
    let ws = srv.workspace_id().await;
    let (viewer_id, _) = srv.user_in(&ws, service::access::Role::Viewer).await;
    let viewer = srv.state.store.user(&viewer_id).await.unwrap().unwrap().email;
    let (other_ws, _) = srv.other_workspace().await;
    let (outsider_id, _) = srv.user_in(&other_ws, service::access::Role::Administrator).await;
    let outsider = srv.state.store.user(&outsider_id).await.unwrap().unwrap().email;
    for email in [&viewer, &outsider] {
        set_password(
            &srv.state.store,
            email,
            SecretString::from(crate::web_sessions::PASSWORD),
            OnPasswordChange::KeepSessions,
        )
        .await
        .unwrap();
    }
    let browser = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let page = |cookie: Option<&str>, path: &str| {
        let mut req = browser.get(srv.url(path));
        if let Some(c) = cookie {
            req = req.header("cookie", c);
        }
        req.send()
    };

    // Nobody signed in is sent to sign in.
    let anonymous = page(None, "/pipelines").await.unwrap();
    assert_eq!(anonymous.status(), 303);
    assert!(anonymous.headers()["location"].to_str().unwrap().starts_with("/sign-in"));
    // An API token is not a browser session.
    let bearer = browser.get(srv.url("/pipelines")).bearer_auth(&srv.admin_token).send().await.unwrap();
    assert_eq!(bearer.status(), 303);

    let (cookie, _) = crate::web_sessions::web_sign_in(srv, &viewer).await;
    let list = page(Some(&cookie), "/pipelines").await.unwrap();
    assert_eq!(list.status(), 200);
    assert_eq!(list.headers()["x-frame-options"], "DENY");
    assert_eq!(list.headers()["cache-control"], "no-store");
    assert!(!list.headers()["content-security-policy"].to_str().unwrap().contains("script-src"));
    let html = list.text().await.unwrap();
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;") && !html.contains("<script>alert"), "{html}");
    assert!(html.contains("fresh") && html.contains(&job_id), "{html}");
    let one = page(Some(&cookie), &format!("/pipelines/{pipeline}")).await.unwrap().text().await.unwrap();
    assert!(one.contains("incremental_append") && one.contains(&job_id), "{one}");
    let job_page = page(Some(&cookie), &format!("/jobs/{job_id}")).await.unwrap();
    assert_eq!(job_page.status(), 200);
    let csp = job_page.headers()["content-security-policy"].to_str().unwrap().to_owned();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("connect-src 'self'") && !csp.contains("unsafe-eval"),
        "{csp}"
    );
    let html = job_page.text().await.unwrap();
    assert!(html.contains("succeeded") && html.contains(">300<"), "served with its progress: {html}");
    assert!(
        html.contains("<script src=\"/assets/job.js\"></script>") && !html.contains("<script>"),
        "no inline script"
    );
    let stream = page(Some(&cookie), &format!("/jobs/{job_id}/events")).await.unwrap();
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    assert!(stream.text().await.unwrap().contains("event: finished"));

    // A member of another workspace sees none of it, named or not.
    let (cookie, _) = crate::web_sessions::web_sign_in(srv, &outsider).await;
    for path in [
        format!("/jobs/{job_id}"),
        format!("/jobs/{job_id}?workspace_id={ws}"),
        format!("/jobs/{job_id}/events"),
        format!("/jobs/{job_id}/events?workspace_id={ws}"),
        format!("/pipelines/{pipeline}"),
        format!("/pipelines?workspace_id={ws}"),
    ] {
        let res = page(Some(&cookie), &path).await.unwrap();
        assert!(matches!(res.status().as_u16(), 403 | 404), "{path}: {}", res.status());
        let text = res.text().await.unwrap();
        assert!(!text.contains("alert(1)") && !text.contains("event: "), "{path}: {text}");
    }
    let theirs = page(Some(&cookie), "/pipelines").await.unwrap().text().await.unwrap();
    assert!(theirs.contains("No pipelines in this workspace yet"), "{theirs}");
    fx.srv.stop().await;
}

/// Reads a stream until it ends or `secs` pass: whether it ended, and
/// the names of the events it sent.
async fn read_until_closed(res: &mut reqwest::Response, secs: u64) -> (bool, Vec<String>) {
    let mut names = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        match tokio::time::timeout_at(deadline, res.chunk()).await {
            Err(_) => return (false, names),
            Ok(Ok(None)) | Ok(Err(_)) => return (true, names),
            Ok(Ok(Some(chunk))) => names.extend(
                String::from_utf8_lossy(&chunk).lines().filter_map(|l| l.strip_prefix("event: ")).map(str::to_owned),
            ),
        }
    }
}

/// A job's event streams are bounded: one user holds at most sixteen at
/// once, and an open stream ends soon after its token is revoked or its
/// user leaves the workspace, while the job still runs.
async fn event_streams_are_bounded_and_end_when_access_does(backend: Backend) {
    use service::access::throttle::STREAMS_PER_USER;
    let fx = events_source_beside(backend, 1500, &TestCa::new(), "", |c| {
        c.limits.streams.recheck = std::time::Duration::from_millis(500);
    })
    .await;
    let (_, id) = slow_sync(&fx, 4000).await;
    let srv = &fx.srv;
    let ws = srv.workspace_id().await;
    let path = format!("/v1/jobs/{id}/events");

    let (revoked_id, revoked) = srv.user_in(&ws, service::access::Role::Viewer).await;
    let mut open = Vec::new();
    for _ in 0..STREAMS_PER_USER {
        let res = srv.request_as(&revoked, Method::GET, &path).send().await.unwrap();
        assert_eq!(res.status(), 200);
        open.push(res);
    }
    let refused =
        expect_error(srv.request_as(&revoked, Method::GET, &path).send().await.unwrap(), 429, "RATE_LIMITED").await;
    assert!(refused["message"].as_str().unwrap().contains("event streams"), "{refused}");
    // Another user has room of their own; a stream closed gives its place back.
    let (leaver_id, leaver) = srv.user_in(&ws, service::access::Role::Viewer).await;
    let mut leaving = srv.request_as(&leaver, Method::GET, &path).send().await.unwrap();
    assert_eq!(leaving.status(), 200);
    drop(open.pop());
    // The server learns the client went at its next write to it (a
    // progress event, or a keep-alive within 15 s).
    let mut again = None;
    for _ in 0..300 {
        let res = srv.request_as(&revoked, Method::GET, &path).send().await.unwrap();
        if res.status() == 200 {
            again = Some(res);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    open.push(again.expect("a closed stream's place is given back"));

    // The token is revoked: every one of its streams ends, unfinished.
    let sessions = json_ok(srv.get(&format!("/v1/sessions?user_id={revoked_id}")).send().await.unwrap()).await;
    let session = sessions["data"]["items"][0]["session_id"].as_str().unwrap().to_owned();
    json_ok(srv.request(Method::POST, &format!("/v1/sessions/{session}/revoke")).send().await.unwrap()).await;
    for res in &mut open {
        let (ended, names) = read_until_closed(res, 20).await;
        assert!(ended, "a revoked token's stream ends");
        assert!(!names.iter().any(|n| n == "finished"), "it ended before the job: {names:?}");
    }
    // The user leaves the workspace: the stream ends too.
    let members = json_ok(srv.get(&format!("/v1/workspaces/{ws}/members")).send().await.unwrap()).await;
    let member = members["data"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["user_id"] == leaver_id.as_str())
        .unwrap()["member_id"]
        .as_str()
        .unwrap()
        .to_owned();
    json_ok(srv.request(Method::DELETE, &format!("/v1/workspaces/{ws}/members/{member}")).send().await.unwrap()).await;
    let (ended, names) = read_until_closed(&mut leaving, 20).await;
    assert!(ended && !names.iter().any(|n| n == "finished"), "a former member's stream ends: {names:?}");
    let still = json_ok(srv.get(&format!("/v1/jobs/{id}")).send().await.unwrap()).await;
    assert_eq!(still["data"]["status"], "running", "the streams ended on their own, not with the job");
    json_ok(srv.request(Method::POST, &format!("/v1/jobs/{id}/cancel")).send().await.unwrap()).await;
    fx.srv.stop().await;
}

/// Every attempt is an event, however short: a sync whose three attempts
/// each fail at once (its destination hangs up on every connection)
/// streams each attempt's start and end, in order, then the job's end.
async fn every_attempt_is_an_event_however_short(backend: Backend) {
    let fx = events_source_beside(backend, 10, &TestCa::new(), "", |_| {}).await;
    let hang_up = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = hang_up.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((socket, _)) = hang_up.accept().await {
            drop(socket);
        }
    });
    let dest = fx.destination("postgres", json!({ "url": format!("postgres://loader@127.0.0.1:{port}/w") })).await;
    let pipeline = fx.pipeline(&dest, "incremental_append").await;
    let srv = &fx.srv;
    let job = json_ok(srv.request(Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap()).await;
    let seen = events(srv, &srv.admin_token, job["data"]["job_id"].as_str().unwrap()).await;
    let attempts: Vec<(&str, i64, &str)> = seen
        .iter()
        .filter(|(n, _)| n.starts_with("attempt_"))
        .map(|(n, d)| (n.as_str(), d["attempt"].as_i64().unwrap(), d["outcome"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(
        attempts,
        [
            ("attempt_started", 1, ""),
            ("attempt_ended", 1, "retrying"),
            ("attempt_started", 2, ""),
            ("attempt_ended", 2, "retrying"),
            ("attempt_started", 3, ""),
            ("attempt_ended", 3, "failed"),
        ],
        "{seen:?}"
    );
    assert_eq!(seen.last().unwrap().0, "finished");
    assert_eq!(seen.last().unwrap().1["status"], "failed");
    fx.srv.stop().await;
}

on_both_backends!(
    a_sync_streams_its_progress_while_it_runs,
    the_watch_pages_show_a_workspace_only_to_its_members,
    event_streams_are_bounded_and_end_when_access_does,
    every_attempt_is_an_event_however_short
);

/// A plugin's meters count from a fresh server's first sync and again
/// after a restart, for a bundled connector too (its meters are made when
/// it loads, at start: they must find the recorder installed). With a
/// metrics token set, `/metrics` answers only to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_meters_count_on_a_fresh_server_and_after_a_restart_and_the_metrics_token_guards_them() {
    use crate::support::process::ServerProcess;
    use crate::support::provider::FakeProvider;
    crate::support::init_crypto();
    let ca = TestCa::new();
    let token = format!("meter-{}", uuid::Uuid::new_v4().simple());
    let api = std::sync::Arc::new(testkit::restapi::RestApi::new(60).with_token(token.clone()));
    let provider = FakeProvider::start(&ca, &["api.source.test"], testkit::restapi::router(api)).await;
    let mut procs = crate::support::replicas::Processes::new(&ca, &provider);
    let metrics_token = "metrics-token-0123456789abcdef";
    procs.env.push(("SERVICE_METRICS_TOKEN", metrics_token.into()));
    let mut server = ServerProcess::start(procs.env.clone()).await;
    let pipeline = procs.rest_manifest_pipeline(&server.base, &token, 25, "full_refresh_overwrite").await;
    let post = |base: &str, path: &str, body: Value| procs.api(base, Method::POST, path).json(&body);
    let client = reqwest::Client::new();
    for round in ["fresh", "restarted"] {
        if round == "restarted" {
            server.kill();
            server = ServerProcess::start(procs.env.clone()).await;
        }
        let job =
            json_ok(post(&server.base, &format!("/v1/pipelines/{pipeline}/sync"), json!({})).send().await.unwrap())
                .await;
        let job = procs.wait(&server.base, job["data"]["job_id"].as_str().unwrap()).await;
        assert_eq!(job["status"], "succeeded", "{round}: {job}");
        let scrape = client.get(format!("{}/metrics", server.base)).bearer_auth(metrics_token).send().await.unwrap();
        assert_eq!(scrape.status(), 200, "{round}");
        let text = scrape.text().await.unwrap();
        let requests: f64 = text
            .lines()
            .find(|l| l.starts_with("plugin_requests_total{connector=\"conn_rest_manifest\""))
            .unwrap_or_else(|| panic!("{round}: no requests counted for the bundled connector:\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        // Three pages of 25, each one request.
        assert!(requests >= 3.0, "{round}: {requests}");
    }
    let url = format!("{}/metrics", server.base);
    assert_eq!(client.get(&url).send().await.unwrap().status(), 401, "no token");
    assert_eq!(client.get(&url).bearer_auth("metrics-token-0123456789abcdeX").send().await.unwrap().status(), 401);
    server.kill();
}
