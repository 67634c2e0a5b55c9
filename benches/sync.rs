//! Sync throughput: records/s and MB/s from a paginated HTTPS fake source
//! through a plugin into an SQLite destination (and PostgreSQL when
//! `BENCH_POSTGRES_URL` names a database) and an Iceberg table on the
//! local filesystem, and in the same run a native
//! baseline doing the same fetch, parse and write without Wasm, and the
//! plugin path again under a data contract that judges every record
//! (rejecting none): what a contract costs.
//!
//! Run with `cargo bench -p service --bench sync`. Each destination gets
//! `BENCH_ROUNDS` (5) rounds in which the two paths take turns; the summary
//! is the median of each. Nothing asserts the figures; they depend on the
//! machine. Each phase also reports the CPU
//! time the whole process used meanwhile (the fake provider's side of the
//! transfer included): on a shared machine it varies much less than the
//! wall-clock rate, so it is the better figure for comparing two builds.

use testkit::provider;
mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::Query;
use serde_json::{Value, json};
use service::egress::EgressPolicy;
use service::plugin::registry::PluginSource;
use service::store::kinds::{
    ContractMode, CredentialKind, CredentialStatus, DestinationKind, JobKind, JobStatus, Trigger,
};
use service::store::pipelines::{StreamContract, StreamSyncMode};

const RECORDS: u64 = 100_000;
const PAGE: u64 = 1000;

/// Pages of about 1 KB records fitting the schema the test plugin
/// declares (a lakehouse types its columns by it), rendered once.
fn pages() -> Arc<Vec<String>> {
    let pad = "x".repeat(940);
    Arc::new(
        (0..RECORDS / PAGE)
            .map(|p| {
                let data: Vec<Value> = (p * PAGE..(p + 1) * PAGE)
                    .map(|i| json!({ "id": i, "updated_at": "2024-01-01T00:00:00Z", "kind": "open", "payload": { "n": i }, "note": pad }))
                    .collect();
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
    let state = support::state(
        dir.path(),
        EgressPolicy::from_settings("*.source.test", Some(&fake.pins(&["api.source.test"])), Some(ca.pem.as_bytes()))
            .unwrap(),
    )
    .await;
    let wasm = support::test_plugin("test_paged_source");
    state.plugins.load_bytes(&std::fs::read(&wasm).unwrap(), PluginSource::File(wasm)).await.unwrap();
    let ws = state.store.first_workspace().await.unwrap().unwrap().workspace_id;
    let admin = state.store.user_by_email("bench@example.test").await.unwrap().unwrap().user_id;
    let cred = state
        .vault
        .create(service::credentials::NewSecret {
            workspace_id: &ws,
            created_by: &admin,
            kind: CredentialKind::ApiToken,
            connector_id: None,
            label: None,
            hosts: vec!["api.source.test".into()],
            metadata: json!({}),
            material: service::credentials::SecretMaterial::new("bench-source-token-0123456789".to_owned().into()),
            status: CredentialStatus::Active,
            access_expires_at: None,
        })
        .await
        .unwrap();
    let source_cfg = json!({ "base_url": "https://api.source.test", "credential_handle": cred.credential_handle, "page_size": PAGE });
    let source = state.store.create_source(&ws, "test_paged_source", "bench", &source_cfg, &admin).await.unwrap();
    let runner = service::jobs::spawn(state.clone());

    let native = support::Native {
        client: reqwest::Client::builder()
            .resolve("api.source.test", fake.addr)
            .tls_certs_merge(reqwest::Certificate::from_pem_bundle(ca.pem.as_bytes()).unwrap())
            .build()
            .unwrap(),
    };
    let native_url = format!("https://api.source.test:{}/events?limit={PAGE}", fake.addr.port());
    let rounds: usize = std::env::var("BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(5).max(1);
    let mut targets = vec![(DestinationKind::Sqlite, json!({ "file": "bench.db" }))];
    if let Ok(url) = std::env::var("BENCH_POSTGRES_URL") {
        targets.push((DestinationKind::Postgres, json!({ "url": url })));
    }
    targets.push((DestinationKind::Iceberg, json!({ "warehouse": "bench", "namespace": "bench" })));
    for (kind, dest_cfg) in targets {
        let dest = state.store.create_destination(&ws, kind, kind.as_str(), &dest_cfg, None, &admin).await.unwrap();
        // The same stream twice: as it is, and under a contract that
        // judges every record and (the records fitting it) rejects none.
        let on_breach = ContractMode::Quarantine;
        let judged =
            StreamContract { new_columns: on_breach, type_changes: ContractMode::Evolve, invalid_records: on_breach };
        let mut pipelines = Vec::new();
        for (name, contract) in [("bench", None), ("bench-contract", Some(judged))] {
            let streams = vec![service::store::pipelines::StreamSelection {
                name: "events".into(),
                sync_mode: StreamSyncMode::FullRefreshOverwrite,
                cursor_field: None,
                primary_key: None,
                contract,
            }];
            let pipeline = state
                .store
                .create_pipeline(
                    &ws,
                    name,
                    &source.source_id,
                    &dest.destination_id,
                    &streams,
                    &service::store::pipelines::Schedule::Manual,
                    None,
                    None,
                )
                .await
                .unwrap();
            pipelines.push(pipeline.pipeline_id);
        }
        let parsed = service::warehouse::validate(kind, &dest_cfg).unwrap();
        // The two paths take turns, so a busy spell on the machine falls
        // on both rather than on one.
        let (mut plugin_rates, mut contract_rates, mut native_rates) = (Vec::new(), Vec::new(), Vec::new());
        // CPU seconds per run of each path: steadier than the rates on a
        // shared machine.
        let (mut plugin_cpu, mut contract_cpu) = (Vec::new(), Vec::new());
        for round in 1..=rounds {
            let (t, cpu) = (Instant::now(), support::cpu_seconds());
            let records = sync_job(&state, &ws, &pipelines[0]).await;
            let (secs, cpu) = (t.elapsed().as_secs_f64(), support::cpu_seconds() - cpu);
            report(&format!("{kind} #{round}: through the plugin"), records, total_bytes, secs, cpu);
            plugin_rates.push(records as f64 / secs);
            plugin_cpu.push(cpu);

            let (t, cpu) = (Instant::now(), support::cpu_seconds());
            let records = sync_job(&state, &ws, &pipelines[1]).await;
            let (secs, cpu) = (t.elapsed().as_secs_f64(), support::cpu_seconds() - cpu);
            report(&format!("{kind} #{round}: with a contract"), records, total_bytes, secs, cpu);
            assert_eq!(records, RECORDS, "the contract kept nothing aside");
            contract_rates.push(records as f64 / secs);
            contract_cpu.push(cpu);

            let (t, cpu) = (Instant::now(), support::cpu_seconds());
            let place = service::warehouse::Place {
                data_dir: dir.path(),
                workspace_id: &ws,
                warehouses: &state.config.plugins.warehouses,
                extra_roots: &[],
                catalogs: Some(&state.store),
            };
            let first_url = native_url.clone();
            let records = native
                .sync(
                    native_url.clone(),
                    move |body| cut_page(&first_url, body),
                    "events_native",
                    &serde_json::Value::Null,
                    support::Target { destination: &parsed, place: &place, access_key: None },
                )
                .await;
            let (secs, cpu) = (t.elapsed().as_secs_f64(), support::cpu_seconds() - cpu);
            report(&format!("{kind} #{round}: native baseline"), records, total_bytes, secs, cpu);
            native_rates.push(records as f64 / secs);
        }
        let (plugin, native) = (median(&mut plugin_rates), median(&mut native_rates));
        let contract = median(&mut contract_rates);
        let (cpu_plain, cpu_judged) = (median(&mut plugin_cpu), median(&mut contract_cpu));
        println!(
            "{kind}: with a contract that judges every record {contract:.0} records/s: {:.1}% of the plugin path; CPU {cpu_judged:.2} s against {cpu_plain:.2} s (+{:.1}%)",
            100.0 * contract / plugin,
            100.0 * (cpu_judged / cpu_plain - 1.0)
        );
        let mb = |rate: f64| rate * total_bytes as f64 / RECORDS as f64 / 1e6;
        println!(
            "{kind}: median of {rounds} rounds: through the plugin {plugin:.0} records/s ({:.1} MB/s), native baseline {native:.0} records/s ({:.1} MB/s)",
            mb(plugin),
            mb(native)
        );
        println!("{kind}: plugin path at {:.0}% of the native baseline", 100.0 * plugin / native);
    }
    runner.abort();
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 }
}

/// Through the plugin: a real sync job, from the queue to the runner's
/// last write. Returns the records it wrote.
async fn sync_job(state: &service::state::AppState, ws: &str, pipeline_id: &str) -> u64 {
    let job = state.store.create_job(ws, pipeline_id, JobKind::Sync, Trigger::Manual).await.unwrap().unwrap();
    state.jobs_queued.notify_one();
    let done = loop {
        let j = state.store.job(ws, &job.job_id).await.unwrap().unwrap();
        if j.status.is_final() {
            break j;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    assert_eq!(done.status, JobStatus::Succeeded, "{:?}", done.error);
    done.progress.sync().expect("a sync's progress").records
}

/// The test plugin's pages cut into records, and the next page's URL.
fn cut_page(first_url: &str, body: &[u8]) -> (Vec<String>, Option<String>) {
    #[derive(serde::Deserialize)]
    struct Page<'a> {
        #[serde(borrow)]
        data: Vec<&'a serde_json::value::RawValue>,
        next_cursor: Option<String>,
    }
    let page: Page = serde_json::from_slice(body).unwrap();
    let batch = page.data.iter().map(|r| r.get().to_owned()).collect();
    (batch, page.next_cursor.map(|c| format!("{first_url}&cursor={c}")))
}
