//! How the job runners of every server are shared between workspaces, on
//! the control database itself (as several servers share it): a lone
//! workspace uses every runner, a workspace with one job waiting gets the
//! next runner that frees up whatever another has queued, and under
//! contention the runners go by the workspaces' claim weights.

use std::collections::{BTreeMap, VecDeque};

use serde_json::json;
use service::store::kinds::{DestinationKind, JobKind, JobStatus, Trigger};
use service::store::pipelines::{Schedule, StreamSelection, StreamSyncMode};
use service::store::{ClaimWeight, Store};

use crate::on_both_backends;
use crate::support::{Backend, PgDatabase, private_dir};

const LEASE_MS: i64 = 60_000;

/// A store on a fresh database of `backend` (and what keeps it alive).
async fn store_on(backend: Backend) -> (Store, Option<PgDatabase>, tempfile::TempDir) {
    let dir = private_dir();
    match backend {
        Backend::Sqlite => {
            let url = format!("sqlite://{}/service.db?mode=rwc", dir.path().display());
            (Store::connect(&url).await.unwrap(), None, dir)
        }
        Backend::Postgres => {
            let db = PgDatabase::create().await.expect("PostgreSQL for the claims test");
            (Store::connect(&db.url).await.unwrap(), Some(db), dir)
        }
    }
}

/// A workspace with `jobs` sync jobs queued (one pipeline each, as a
/// pipeline has one active job), the oldest first.
async fn workspace_with_jobs(store: &Store, name: &str, jobs: usize) -> String {
    let ws = store.create_workspace(name).await.unwrap().workspace_id;
    let user = store.create_user(&format!("{name}@example.test"), name).await.unwrap().user_id;
    let source = store.create_source(&ws, "conn_events", "events", &json!({}), &user).await.unwrap();
    let destination = store
        .create_destination(&ws, DestinationKind::Jsonl, "files", &json!({ "directory": "out" }), None, &user)
        .await
        .unwrap();
    queue(store, &ws, &source.source_id, &destination.destination_id, jobs).await;
    ws
}

async fn queue(store: &Store, ws: &str, source: &str, destination: &str, jobs: usize) {
    let streams = [StreamSelection {
        name: "events".into(),
        sync_mode: StreamSyncMode::FullRefreshOverwrite,
        cursor_field: None,
        primary_key: None,
        contract: None,
    }];
    for i in 0..jobs {
        let pipeline = store
            .create_pipeline(ws, &format!("p{i}"), source, destination, &streams, &Schedule::Manual, None, None)
            .await
            .unwrap();
        store.create_job(ws, &pipeline.pipeline_id, JobKind::Sync, Trigger::Manual).await.unwrap().unwrap();
    }
}

/// Runner slots: the jobs each holds, finished oldest first (jobs of one
/// length), and who claimed what.
struct Slots<'a> {
    store: &'a Store,
    running: VecDeque<(String, String)>,
    claims: BTreeMap<String, usize>,
}

impl Slots<'_> {
    /// One runner claims; the workspace it got a job of.
    async fn claim(&mut self) -> Option<String> {
        let job = self.store.claim_job("runner-test", LEASE_MS, 0).await.unwrap()?;
        *self.claims.entry(job.workspace_id.clone()).or_default() += 1;
        self.running.push_back((job.job_id, job.workspace_id.clone()));
        Some(job.workspace_id)
    }

    /// The oldest running job ends, freeing its runner.
    async fn finish_oldest(&mut self) {
        let (job, _) = self.running.pop_front().expect("a running job");
        self.store.finish_job(&job, "runner-test", JobStatus::Succeeded, None).await.unwrap();
    }

    fn running_of(&self, ws: &str) -> usize {
        self.running.iter().filter(|(_, w)| w == ws).count()
    }
}

async fn a_lone_workspace_takes_every_runner_and_a_newcomer_the_next_free_one(backend: Backend) {
    let (store, _db, _dir) = store_on(backend).await;
    let busy = workspace_with_jobs(&store, "busy", 1000).await;
    let mut slots = Slots { store: &store, running: VecDeque::new(), claims: BTreeMap::new() };
    // Work-conserving: eight runners, all the busy workspace's.
    for _ in 0..8 {
        assert_eq!(slots.claim().await.as_deref(), Some(busy.as_str()));
    }
    // Another workspace queues one job: the next runner that frees up is
    // its, ahead of the 992 jobs waiting longer.
    let newcomer = workspace_with_jobs(&store, "newcomer", 1).await;
    slots.finish_oldest().await;
    assert_eq!(slots.claim().await.as_deref(), Some(newcomer.as_str()));
    assert_eq!((slots.running_of(&busy), slots.running_of(&newcomer)), (7, 1));
    // Its job done, every runner is the busy workspace's again.
    for _ in 0..8 {
        slots.finish_oldest().await;
        assert_eq!(slots.claim().await.as_deref(), Some(busy.as_str()));
    }
    assert_eq!(slots.running_of(&busy), 8);
    // A cap per workspace, when an operator sets one, holds.
    let capped = store.claim_job("runner-capped", LEASE_MS, 8).await.unwrap();
    assert!(capped.is_none(), "a workspace at its cap gets no ninth runner");
}

async fn runners_go_by_claim_weight_under_contention(backend: Backend) {
    let (store, _db, _dir) = store_on(backend).await;
    let heavy = workspace_with_jobs(&store, "heavy", 1100).await;
    let light = workspace_with_jobs(&store, "light", 1100).await;
    assert!(store.set_claim_weight(&heavy, ClaimWeight::new(3).unwrap()).await.unwrap());
    assert!(!store.set_claim_weight("ws_none", ClaimWeight::new(3).unwrap()).await.unwrap());
    let weights: BTreeMap<String, u16> =
        store.claim_weights().await.unwrap().into_iter().map(|(w, c)| (w.workspace_id, c.get())).collect();
    assert_eq!((weights[&heavy], weights[&light]), (3, 1));
    let mut slots = Slots { store: &store, running: VecDeque::new(), claims: BTreeMap::new() };
    for _ in 0..8 {
        slots.claim().await.unwrap();
    }
    assert_eq!((slots.running_of(&heavy), slots.running_of(&light)), (6, 2), "8 runners shared 3:1");
    // 1,000 claims, each as a runner frees up.
    slots.claims.clear();
    for _ in 0..1000 {
        slots.finish_oldest().await;
        slots.claim().await.unwrap();
    }
    let share = slots.claims[&heavy] as f64 / 1000.0;
    assert!((share - 0.75).abs() <= 0.075, "the heavy workspace had {share} of 1,000 claims, not 3/4 ± 10%");
    println!("claims by weight 3:1 over 1,000 claims: {} and {}", slots.claims[&heavy], slots.claims[&light]);
}

async fn an_operator_sets_and_lists_claim_weights(backend: Backend) {
    let (store, db, dir) = store_on(backend).await;
    let ws = workspace_with_jobs(&store, "tenant", 0).await;
    store.close().await;
    let url = match &db {
        Some(db) => db.url.clone(),
        None => format!("sqlite://{}/service.db?mode=rwc", dir.path().display()),
    };
    let admin = |args: &[&str]| {
        crate::support::process::command()
            .env("SERVICE_DATA_DIR", dir.path())
            .env("DATABASE_URL", &url)
            .arg("admin")
            .args(args)
            .output()
            .unwrap()
    };
    let set = admin(&["set-claim-weight", "--workspace", &ws, "--weight", "5"]);
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    assert_eq!(String::from_utf8_lossy(&set.stdout).trim(), format!("workspace {ws} now has claim weight 5"));
    let listed = admin(&["claim-weights"]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains(&format!("{ws}\t5\ttenant")));
    // Out of range, or no such workspace: refused, nothing changed.
    for (args, says) in [
        (vec!["set-claim-weight", "--workspace", ws.as_str(), "--weight", "0"], "from 1 to 1000"),
        (vec!["set-claim-weight", "--workspace", ws.as_str(), "--weight", "1001"], "from 1 to 1000"),
        (vec!["set-claim-weight", "--workspace", "ws_nobody", "--weight", "2"], "no workspace ws_nobody"),
    ] {
        let out = admin(&args);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains(says), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let store = Store::connect(&url).await.unwrap();
    let weights = store.claim_weights().await.unwrap();
    assert_eq!(weights.iter().find(|(w, _)| w.workspace_id == ws).map(|(_, c)| c.get()), Some(5));
}

on_both_backends!(
    a_lone_workspace_takes_every_runner_and_a_newcomer_the_next_free_one,
    runners_go_by_claim_weight_under_contention,
    an_operator_sets_and_lists_claim_weights,
);
