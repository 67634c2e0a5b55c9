//! Watching a job: per-stream progress on the job record and as
//! Server-Sent Events from `GET /v1/jobs/{job_id}/events`, and the
//! per-pipeline series of `/metrics`.

use std::sync::atomic::Ordering;

use reqwest::Method;
use serde_json::{Value, json};

use crate::on_both_backends;
use crate::pipelines::setup_beside;
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

/// A sync's progress streams as it runs: its attempt, per-stream counters
/// that grow batch by batch (read and written, rate, last checkpoint),
/// and its end, after which the stream closes. Members of the workspace
/// may follow it; nobody else learns it exists.
async fn a_sync_streams_its_progress_while_it_runs(backend: Backend) {
    let fx = setup_beside(backend, 1500, &TestCa::new(), "", |_| {}).await;
    fx.events.delay_ms.store(250, Ordering::SeqCst);
    let srv = &fx.srv;
    let dest = fx.destination("sqlite", json!({ "file": "w.db" })).await;
    let pipeline = fx.pipeline(&dest, "incremental_append").await;
    let job = json_ok(srv.request(Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap()).await;
    let id = job["data"]["job_id"].as_str().unwrap().to_owned();
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
    assert!(written.contains(&format!("workspace=\"{ws}\"")) && written.contains("stream=\"events\""), "{written}");
    assert!(written.ends_with(" 1500"), "{written}");
    assert!(series("pipeline_records_read_total").ends_with(" 1500"));
    let age: f64 = series("pipeline_last_success_age_seconds").rsplit(' ').next().unwrap().parse().unwrap();
    assert!((0.0..120.0).contains(&age), "{age}");
    assert!(series("pipeline_freshness_breached").ends_with(" 0"));
    assert!(metrics.contains("pipelines_not_listed 0"), "{metrics}");
    fx.srv.stop().await;
}

on_both_backends!(a_sync_streams_its_progress_while_it_runs);
