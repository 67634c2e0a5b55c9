//! Sync throughput: records/s and MB/s from a paginated HTTPS fake source
//! through a plugin into an SQLite destination (and PostgreSQL when
//! `BENCH_POSTGRES_URL` names a database), and in the same run a native
//! baseline doing the same fetch, parse and write without Wasm.
//!
//! Run with `cargo bench -p service --bench sync`. Nothing asserts the
//! figures; they depend on the machine. Each phase also reports the CPU
//! time the whole process used meanwhile (the fake provider's side of the
//! transfer included): on a shared machine it varies much less than the
//! wall-clock rate, so it is the better figure for comparing two builds.

#[path = "../tests/integration/support/provider.rs"]
#[allow(dead_code)]
mod provider;
mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::Query;
use serde_json::{Value, json};
use service::destinations::{Loader, QUEUE_DEPTH, Work, Writer, gather};
use service::egress::EgressPolicy;
use service::plugin::registry::PluginSource;
use service::store::pipelines::StreamSyncMode;

const RECORDS: u64 = 100_000;
const PAGE: u64 = 1000;


/// Pages of about 1 KB records, rendered once.
fn pages() -> Arc<Vec<String>> {
    let pad = "x".repeat(940);
    Arc::new(
        (0..RECORDS / PAGE)
            .map(|p| {
                let data: Vec<Value> =
                    (p * PAGE..(p + 1) * PAGE).map(|i| json!({ "id": i, "updated_at": "2024-01-01T00:00:00Z", "kind": "open", "payload": pad })).collect();
                let next = if p + 1 < RECORDS / PAGE { json!(((p + 1) * PAGE).to_string()) } else { Value::Null };
                json!({ "data": data, "next_cursor": next }).to_string()
            })
            .collect(),
    )
}

fn report(name: &str, records: u64, bytes: u64, secs: f64, cpu: f64) {
    println!(
        "{name:<40} {:>10.0} records/s {:>8.1} MB/s ({records} records in {secs:.2} s, {cpu:.2} CPU-s)",
        records as f64 / secs,
        bytes as f64 / secs / 1e6
    );
}

/// CPU seconds the process has used so far, all threads, user and system
/// (Linux: `/proc/self/stat`, in units of 1/100 s).
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // utime and stime are the 12th and 13th fields after the command name,
    // which is in parentheses and may hold spaces.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    after_name.split_whitespace().skip(11).take(2).filter_map(|v| v.parse::<f64>().ok()).sum::<f64>() / 100.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pages = pages();
    let total_bytes: u64 = pages.iter().map(|p| p.len() as u64).sum();
    let served = pages.clone();
    let router = axum::Router::new().route(
        "/events",
        axum::routing::get(move |Query(q): Query<HashMap<String, String>>| {
            let pages = served.clone();
            async move {
                let start: u64 = q.get("cursor").and_then(|c| c.parse().ok()).unwrap_or(0);
                ([("content-type", "application/json")], pages[(start / PAGE) as usize].clone())
            }
        }),
    );
    let ca = provider::TestCa::new();
    let fake = provider::FakeProvider::start(&ca, &["api.source.test"], router).await;
    let dir = tempfile::tempdir().unwrap();
    let state = support::state(dir.path(), EgressPolicy::from_settings("*.source.test", Some(&fake.pins(&["api.source.test"])), Some(ca.pem.as_bytes())).unwrap()).await;
    let wasm = support::test_plugin("test_paged_source");
    state.plugins.load_bytes(&std::fs::read(&wasm).unwrap(), PluginSource::File(wasm)).await.unwrap();
    let ws = state.store.first_workspace().await.unwrap().unwrap().workspace_id;
    let admin = state.store.user_by_email("bench@example.test").await.unwrap().unwrap().user_id;
    let cred = state
        .vault
        .create(service::credentials::NewSecret {
            workspace_id: &ws,
            created_by: &admin,
            kind: "api_token",
            connector_id: None,
            label: None,
            hosts: vec!["api.source.test".into()],
            metadata: json!({}),
            material: service::credentials::SecretMaterial::new("bench-source-token-0123456789".to_owned().into()),
            status: "active",
            access_expires_at: None,
        })
        .await
        .unwrap();
    let source_cfg = json!({ "base_url": "https://api.source.test", "credential_handle": cred.credential_handle, "page_size": PAGE });
    let source = state.store.create_source(&ws, "test_paged_source", "bench", &source_cfg, &admin).await.unwrap();
    let runner = service::jobs::spawn(state.clone());

    let mut targets = vec![("sqlite", json!({ "file": "bench.db" }))];
    if let Ok(url) = std::env::var("BENCH_POSTGRES_URL") {
        targets.push(("postgres", json!({ "url": url })));
    }
    for (kind, dest_cfg) in targets {
        // Through the plugin: a real sync job.
        let dest = state.store.create_destination(&ws, kind, kind, &dest_cfg, &admin).await.unwrap();
        let streams = vec![service::store::pipelines::StreamSelection { name: "events".into(), sync_mode: StreamSyncMode::FullRefreshOverwrite, cursor_field: None, primary_key: None }];
        let p = state
            .store
            .create_pipeline(&ws, "bench", &source.source_id, &dest.destination_id, &streams, &service::store::pipelines::Schedule::Manual, None)
            .await
            .unwrap();
        let (t, cpu) = (Instant::now(), cpu_secs());
        let job = state.store.create_job(&ws, &p.pipeline_id, "sync", "manual").await.unwrap().unwrap();
        state.jobs_queued.notify_one();
        let done = loop {
            let j = state.store.job(&ws, &job.job_id).await.unwrap().unwrap();
            if j.status != "queued" && j.status != "running" {
                break j;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        };
        let (secs, cpu) = (t.elapsed().as_secs_f64(), cpu_secs() - cpu);
        assert_eq!(done.status, "succeeded", "{:?}", done.error);
        let plugin = (done.progress["records"].as_u64().unwrap(), secs);
        report(&format!("{kind}: through the plugin"), plugin.0, total_bytes, plugin.1, cpu);

        // Native baseline: the same fetch, parse and write, no Wasm.
        let client = reqwest::Client::builder()
            .resolve("api.source.test", fake.addr)
            .tls_certs_merge(reqwest::Certificate::from_pem_bundle(ca.pem.as_bytes()).unwrap())
            .build()
            .unwrap();
        let parsed = service::destinations::validate(kind, &dest_cfg).unwrap();
        let writer = Writer::open(&parsed, dir.path(), None).await.unwrap();
        writer.clear("events_native").await.unwrap();
        let writer = Arc::new(writer);
        let (t, cpu) = (Instant::now(), cpu_secs());
        // Built the way the job runner is: pages are fetched while the
        // previous one is written, with the same queue depth, and each
        // batch is prepared while the one before it is applied.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Work>(QUEUE_DEPTH);
        let write_task = tokio::spawn(async move {
            let mut writing = std::time::Duration::ZERO;
            let mut loader = Loader::new(writer.clone(), "bench", "events_native", StreamSyncMode::FullRefreshOverwrite, Vec::new());
            while let Some(first) = rx.recv().await {
                // Pages queued meanwhile share a transaction, as in the
                // job runner's writer.
                let (records, _) = gather(first, &mut rx);
                let w = Instant::now();
                loader.write(records).await.unwrap();
                writing += w.elapsed();
            }
            let w = Instant::now();
            loader.drain().await.unwrap();
            writing += w.elapsed();
            drop(loader);
            if let Ok(writer) = Arc::try_unwrap(writer) {
                writer.close().await;
            }
            writing
        });
        let (mut cursor, mut n) = (None::<String>, 0u64);
        loop {
            let mut url = format!("https://api.source.test:{}/events?limit={PAGE}", fake.addr.port());
            if let Some(c) = &cursor {
                url.push_str(&format!("&cursor={c}"));
            }
            let body = client.get(&url).send().await.unwrap().bytes().await.unwrap();
            #[derive(serde::Deserialize)]
            struct Page<'a> {
                #[serde(borrow)]
                data: Vec<&'a serde_json::value::RawValue>,
                next_cursor: Option<String>,
            }
            let page: Page = serde_json::from_slice(&body).unwrap();
            let records: Vec<String> = page.data.iter().map(|r| r.get().to_owned()).collect();
            n += records.len() as u64;
            tx.send(Work::Records(records)).await.unwrap();
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        drop(tx);
        let writing = write_task.await.unwrap();
        let (secs, cpu) = (t.elapsed().as_secs_f64(), cpu_secs() - cpu);
        report(&format!("{kind}: native baseline"), n, total_bytes, secs, cpu);
        println!("{kind}: native baseline spent {:.2} s of its {secs:.2} s in the destination writer", writing.as_secs_f64());
        println!("{kind}: plugin path at {:.0}% of the native baseline", 100.0 * (plugin.0 as f64 / plugin.1) / (n as f64 / secs));
    }
    runner.abort();
}
