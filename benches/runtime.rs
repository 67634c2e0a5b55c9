//! Benchmark of the connector runtime, in one run:
//!
//! 1. invocation overhead: a fresh store, instantiation from the
//!    pre-instantiated plugin and a no-op call (p50, p99), in five rounds
//!    with the median of the rounds as the figure;
//! 2. egress overhead: the same GET to a loopback HTTPS server made
//!    directly with reqwest and through the host's egress layer (policy,
//!    resolution check, pinning);
//! 3. the same GET from inside a plugin, taking turns with that plugin's
//!    invocation without a request, so the cost splits into the
//!    invocation, the egress layer and what is left: the request and its
//!    answer crossing the boundary and the guest's own work;
//! 4. the same GET made by a plugin that is already running (as a
//!    connector makes every request of a read), timed by the guest.
//!
//! Run with `cargo bench -p service --bench runtime`. Figures depend on the
//! machine; nothing asserts them.

use testkit::provider;
mod support;

use std::time::{Duration, Instant};

use service::egress::{Caller, EgressPolicy, HostPattern, Method, OutboundRequest};
use service::plugin::registry::PluginSource;

struct Stats {
    p50: Duration,
    p99: Duration,
    mean: Duration,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    let mean = v.iter().sum::<Duration>() / v.len() as u32;
    Stats { p50: v[v.len() / 2], p99: v[v.len() * 99 / 100], mean }
}

fn show(name: &str, s: &Stats) {
    println!("{name:<44} p50 {:>9.1} µs   p99 {:>9.1} µs   mean {:>9.1} µs", us(s.p50), us(s.p99), us(s.mean));
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca = provider::TestCa::new();
    let router = axum::Router::new().route("/ok", axum::routing::get(|| async { "fine" }));
    let fake = provider::FakeProvider::start(&ca, &["api.provider.test"], router).await;
    let dir = tempfile::tempdir().unwrap();
    let state = support::state(
        dir.path(),
        EgressPolicy::from_settings(
            "api.provider.test",
            Some(&fake.pins(&["api.provider.test"])),
            Some(ca.pem.as_bytes()),
        )
        .unwrap(),
    )
    .await;
    let wasm = support::test_plugin("test_misbehaving");
    let id = state.plugins.load_bytes(&std::fs::read(&wasm).unwrap(), PluginSource::File(wasm)).await.unwrap();
    let plugin = state.plugins.available(&id).await.unwrap();
    let ws = state.store.first_workspace().await.unwrap().unwrap().workspace_id;
    let runtime = state.plugins.runtime();
    println!("pooling allocator: {}", runtime.pooling);

    // 1. Invocation overhead: the no-op plugin's check, in rounds so that
    // a burst of noise on a shared machine shows as one odd round.
    let noop_wasm = support::test_plugin("test_noop");
    let noop_id =
        state.plugins.load_bytes(&std::fs::read(&noop_wasm).unwrap(), PluginSource::File(noop_wasm)).await.unwrap();
    let noop = state.plugins.available(&noop_id).await.unwrap();
    for _ in 0..1000 {
        runtime.check(&noop, &ws, &state.egress, "{}").await.unwrap();
    }
    let mut rounds = Vec::new();
    for round in 1..=5 {
        let mut times = Vec::with_capacity(4000);
        for _ in 0..4000 {
            let t = Instant::now();
            runtime.check(&noop, &ws, &state.egress, "{}").await.unwrap();
            times.push(t.elapsed());
        }
        let s = stats(times);
        show(&format!("no-op invocation, round {round}"), &s);
        rounds.push(s);
    }
    let median = |f: fn(&Stats) -> Duration| {
        let mut v: Vec<Duration> = rounds.iter().map(f).collect();
        v.sort();
        v[v.len() / 2]
    };
    let s = Stats { p50: median(|s| s.p50), p99: median(|s| s.p99), mean: median(|s| s.mean) };
    show("no-op invocation (median of the rounds)", &s);

    // 2. Egress overhead against a direct request.
    let direct = reqwest::Client::builder()
        .resolve("api.provider.test", fake.addr)
        .tls_certs_merge(reqwest::Certificate::from_pem_bundle(ca.pem.as_bytes()).unwrap())
        .build()
        .unwrap();
    let url = format!("https://api.provider.test:{}/ok", fake.addr.port());
    let declared = [HostPattern::parse("api.provider.test").unwrap()];
    let caller = Caller {
        plugin_id: "bench",
        declared_hosts: &declared,
        workspace_id: &ws,
        reach: service::egress::Reach::Providers,
    };
    let egress_req = || OutboundRequest {
        method: Method::Get,
        url: "https://api.provider.test/ok".into(),
        headers: vec![],
        body: None,
        credentials: Vec::new(),
        timeout_ms: None,
    };
    for _ in 0..200 {
        direct.get(&url).send().await.unwrap().bytes().await.unwrap();
        state.egress.send(&caller, egress_req()).await.unwrap();
    }
    let (mut d, mut e) = (Vec::new(), Vec::new());
    for _ in 0..3000 {
        let t = Instant::now();
        direct.get(&url).send().await.unwrap().bytes().await.unwrap();
        d.push(t.elapsed());
        let t = Instant::now();
        state.egress.send(&caller, egress_req()).await.unwrap();
        e.push(t.elapsed());
    }
    let (d, e) = (stats(d), stats(e));
    show("direct GET (reqwest, loopback HTTPS)", &d);
    show("GET through the egress layer", &e);
    println!(
        "egress overhead: {:+.1}% at p50, {:+.1}% on the mean",
        100.0 * (us(e.p50) / us(d.p50) - 1.0),
        100.0 * (us(e.mean) / us(d.mean) - 1.0)
    );

    // 3. The same GET from inside a plugin, taking turns with the same
    // plugin's invocation that sends nothing, so the difference between
    // them is what the request costs once it is a plugin's.
    let from_plugin = r#"{"behave":"egress","request":{"method":"GET","url":"https://api.provider.test/ok"}}"#;
    let (mut p, mut idle) = (Vec::new(), Vec::new());
    for _ in 0..2000 {
        let t = Instant::now();
        runtime.preview(&plugin, &ws, &state.egress, from_plugin).await.unwrap();
        p.push(t.elapsed());
        let t = Instant::now();
        runtime.preview(&plugin, &ws, &state.egress, r#"{"behave":"noop"}"#).await.unwrap();
        idle.push(t.elapsed());
    }
    let (p, idle) = (stats(p), stats(idle));
    show("the same plugin, invoked without a request", &idle);
    show("GET from inside a plugin (invocation + egress)", &p);
    println!(
        "in-plugin GET: {:.2}x direct at p50; beyond the invocation and the egress layer: {:+.1} µs",
        us(p.p50) / us(d.p50),
        us(p.p50) - us(idle.p50) - us(e.p50)
    );

    // 4. The same GET from inside a plugin that is already running: a
    // connector makes all the requests of a read in one invocation, so
    // this is what each of them costs it. The guest times every request
    // with its monotonic clock; batches take turns with batches of direct
    // requests.
    let timed =
        r#"{"behave":"egress_timed","times":200,"request":{"method":"GET","url":"https://api.provider.test/ok"}}"#;
    let (mut inside, mut d2) = (Vec::new(), Vec::new());
    for _ in 0..15 {
        for _ in 0..200 {
            let t = Instant::now();
            direct.get(&url).send().await.unwrap().bytes().await.unwrap();
            d2.push(t.elapsed());
        }
        let outcome = runtime.preview(&plugin, &ws, &state.egress, timed).await.unwrap();
        let nanos = outcome["nanos"].as_array().expect("the plugin's timings");
        assert_eq!(nanos.len(), 200, "every request was made and timed");
        inside.extend(nanos.iter().map(|n| Duration::from_nanos(n.as_u64().unwrap())));
    }
    let (inside, d2) = (stats(inside), stats(d2));
    show("direct GET, in turns with the batches below", &d2);
    show("GET inside a running plugin (guest's clock)", &inside);
    println!(
        "GET inside a running plugin: {:.2}x direct at p50, {:+.1} µs",
        us(inside.p50) / us(d2.p50),
        us(inside.p50) - us(d2.p50)
    );
}
