//! One client cannot take the server from everyone else: invalid tokens
//! lock out only further invalid tokens (per address, behind a trusted
//! proxy per forwarded client), one address holds a bounded share of the
//! connections, idle connections are closed, a body trickled in is cut
//! off long before the request deadline, and concurrent password guesses
//! neither outrun the sign-in limit nor grow the server's memory.

use std::time::Duration;

use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::support::process::{ServerProcess, command};
use crate::support::{ADMIN_TOKEN, Backend, TestServer, form_csrf};

/// A connection to `srv` from the loopback address `from` (127.0.0.x).
async fn connect_from(srv: &TestServer, from: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    socket.connect(srv.state.config.bind).await.unwrap()
}

/// Whether the server has closed `conn` (reads until EOF, an error, or
/// `wait` passes with the connection still open).
async fn closed_within(conn: &mut TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

/// A plain HTTP/1.1 request over `conn`; the status code of its answer.
async fn http1_status(conn: &mut TcpStream, request: &str) -> u16 {
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf)).await.expect("an answer").unwrap();
        assert!(n > 0, "closed before answering: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&answer).split(' ').nth(1).unwrap().parse().unwrap()
}

const HEALTHZ: &str = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
/// The client preface of HTTP/2 over cleartext, and an empty SETTINGS frame.
const H2C_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_hold_every_connection() {
    let srv = TestServer::start_with(Backend::Sqlite, |c| {
        c.limits.max_connections = 40;
        c.limits.max_connections_per_address = 8;
    })
    .await
    .unwrap();
    // More idle connections than its share, half of them HTTP/2.
    let mut held = Vec::new();
    for i in 0..30 {
        let mut conn = connect_from(&srv, "127.0.0.1").await;
        if i % 2 == 0 {
            conn.write_all(H2C_PREFACE).await.unwrap();
        }
        held.push(conn);
    }
    let mut open = 0;
    for conn in &mut held {
        if !closed_within(conn, Duration::from_millis(300)).await {
            open += 1;
        }
    }
    assert_eq!(open, 8, "one address keeps exactly its share open");
    // Another client is still served while those are held.
    let mut other = connect_from(&srv, "127.0.0.2").await;
    assert_eq!(http1_status(&mut other, HEALTHZ).await, 200);
    drop(held);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_and_slow_bodies_cut_off() {
    let srv = TestServer::start_with(Backend::Sqlite, |c| {
        c.limits.idle_timeout = Duration::from_secs(1);
        c.limits.body_read_timeout = Duration::from_secs(1);
    })
    .await
    .unwrap();
    // HTTP/1 keep-alive after an answer, and HTTP/2 with no stream.
    let mut h1 = connect_from(&srv, "127.0.0.1").await;
    assert_eq!(http1_status(&mut h1, HEALTHZ).await, 200);
    let mut h2 = connect_from(&srv, "127.0.0.1").await;
    h2.write_all(H2C_PREFACE).await.unwrap();
    assert!(closed_within(&mut h1, Duration::from_secs(10)).await, "an idle HTTP/1 connection is closed");
    assert!(closed_within(&mut h2, Duration::from_secs(10)).await, "an idle HTTP/2 connection is closed");

    // A body a byte at a time: 408 long before the two-minute deadline.
    let slow = connect_from(&srv, "127.0.0.1").await;
    let (mut reader, mut slow) = slow.into_split();
    let head = format!(
        "POST /v1/sources HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{{"
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let trickle = async {
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if slow.write_all(b" ").await.is_err() {
                break;
            }
        }
    };
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    let read = async {
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buf[..n]);
                    if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    };
    // The trickle goes on for ten seconds; the answer must come first.
    tokio::select! {
        _ = read => {}
        _ = trickle => panic!("the server waited for the whole trickled body"),
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    srv.stop().await;
}

/// Invalid tokens from an address refuse only further invalid ones: a
/// valid token from the same address still passes. Behind a trusted proxy
/// each forwarded client is counted on its own; from anywhere else the
/// forwarding headers are ignored.
async fn invalid_tokens_lock_out_only_invalid_tokens(trust_loopback: bool) {
    let srv = TestServer::start_with(Backend::Sqlite, |c| {
        if trust_loopback {
            c.limits.trusted_proxies = vec![service::config::limits::Network::parse("127.0.0.1").unwrap()];
        }
    })
    .await
    .unwrap();
    let me = |token: &str, client: &str| {
        srv.request_as(token, reqwest::Method::GET, "/v1/me").header("x-forwarded-for", client).send()
    };
    let mut limited = 0;
    for i in 0..40 {
        let status = me(&format!("svc_bogus_{i:040}"), "203.0.113.1").await.unwrap().status();
        assert!(status == StatusCode::UNAUTHORIZED || status == StatusCode::TOO_MANY_REQUESTS, "{status}");
        if status == StatusCode::TOO_MANY_REQUESTS {
            limited += 1;
        }
    }
    assert!(limited >= 9, "bogus tokens run out: {limited} of 40 limited");
    assert_eq!(
        me(ADMIN_TOKEN, "203.0.113.1").await.unwrap().status(),
        StatusCode::OK,
        "a valid token from the same client passes"
    );
    let elsewhere = me("svc_bogus_from_another_client_000000000000000", "203.0.113.2").await.unwrap().status();
    if trust_loopback {
        assert_eq!(elsewhere, StatusCode::UNAUTHORIZED, "another client behind the proxy has its own count");
    } else {
        assert_eq!(elsewhere, StatusCode::TOO_MANY_REQUESTS, "an untrusted peer's forwarding header is ignored");
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_tokens_do_not_lock_out_valid_ones() {
    invalid_tokens_lock_out_only_invalid_tokens(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_each_client_is_counted_on_its_own() {
    invalid_tokens_lock_out_only_invalid_tokens(true).await;
}

/// Kibibytes of a process's memory line (`VmRSS`, `VmHWM`).
fn memory_kib(pid: u32, line: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix(line)).unwrap().trim().trim_end_matches(" kB").trim().parse().unwrap()
}

/// A hundred wrong passwords for one account at once: no more than the
/// account's limit are checked, and the server's memory grows by less
/// than 256 MiB (each Argon2 check holds 19 MiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_guesses_neither_outrun_the_limit_nor_the_memory() {
    crate::support::init_crypto();
    let dir = crate::support::private_dir();
    let data = dir.path().display().to_string();
    // Every guess on a connection of its own, all at once.
    let env = vec![
        ("SERVICE_DATA_DIR", data.clone()),
        ("SERVICE_BOOTSTRAP_TOKEN", ADMIN_TOKEN.to_owned()),
        ("SERVICE_MAX_CONNECTIONS_PER_ADDRESS", "200".to_owned()),
    ];
    let server = ServerProcess::start(env).await;
    let email = "admin@localhost.localdomain";
    let mut set = command();
    set.env("SERVICE_DATA_DIR", &data)
        .args(["admin", "set-password", "--email", email, "--keep-sessions"])
        .stdin(std::process::Stdio::piped());
    let out = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = set.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(b"the right passphrase\n").unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let page = client.get(format!("{}/sign-in", server.base)).send().await.unwrap();
    let id = page.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .trim_start_matches("service_csrf=")
        .to_owned();
    let csrf = form_csrf(&page.text().await.unwrap()).unwrap();
    let before = memory_kib(server.pid(), "VmRSS:");
    let attempts = (0..100).map(|i| {
        let client = client.clone();
        let (base, id, csrf) = (server.base.clone(), id.clone(), csrf.clone());
        tokio::spawn(async move {
            client
                .post(format!("{base}/sign-in"))
                .header("cookie", format!("service_csrf={id}"))
                .form(&[("csrf", csrf.as_str()), ("email", email), ("password", &format!("wrong guess number {i}"))])
                .send()
                .await
                .unwrap()
                .status()
        })
    });
    let statuses = futures_util::future::join_all(attempts).await;
    let checked = statuses.iter().filter(|s| *s.as_ref().unwrap() == StatusCode::UNAUTHORIZED).count();
    let refused = statuses.iter().filter(|s| *s.as_ref().unwrap() == StatusCode::TOO_MANY_REQUESTS).count();
    assert_eq!(checked + refused, 100, "{statuses:?}");
    assert!(checked <= 10, "{checked} passwords were checked; the account allows 10");
    let peak = memory_kib(server.pid(), "VmHWM:");
    assert!(peak.saturating_sub(before) < 256 * 1024, "the server grew from {before} KiB to a peak of {peak} KiB");
    drop(server);
}
