//! `service auth login` end to end: the real binary, a browser (an HTTP
//! client that signs in and confirms as a person would), the loopback
//! callback and the PKCE exchange; then status, overrides, logout, and the
//! attacks on codes: another address, a replay, a wrong verifier, a
//! forged state.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use base64::Engine;
use reqwest::header::{LOCATION, SET_COOKIE};
use reqwest::{Client, StatusCode};
use secrecy::SecretString;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::support::{ADMIN_TOKEN, Backend, TestServer, json_ok, process};

const EMAIL: &str = "admin@example.test";
const PASSWORD: &str = "a passphrase long enough";

/// A browser that keeps its cookies in the test's hands.
struct Browser {
    http: Client,
    base: String,
    cookies: Vec<(String, String)>,
    /// The CSRF token of the last form a page showed.
    form_csrf: Option<String>,
}

impl Browser {
    fn new(base: &str) -> Browser {
        Browser {
            http: Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap(),
            base: base.to_owned(),
            cookies: Vec::new(),
            form_csrf: None,
        }
    }

    fn header(&self) -> String {
        self.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("; ")
    }

    fn keep(&mut self, res: &reqwest::Response) {
        for line in res.headers().get_all(SET_COOKIE).iter().filter_map(|v| v.to_str().ok()) {
            let (k, v) = line.split(';').next().unwrap().split_once('=').unwrap();
            self.cookies.retain(|(name, _)| name != k);
            self.cookies.push((k.to_owned(), v.to_owned()));
        }
    }

    fn csrf(&self) -> String {
        self.form_csrf.clone().expect("a page with a form was shown")
    }

    /// Keeps what a browser keeps of a page (its cookies, the CSRF token
    /// of its form) and hands the page on unchanged.
    async fn seen(&mut self, res: reqwest::Response) -> reqwest::Response {
        self.keep(&res);
        let (status, headers) = (res.status(), res.headers().clone());
        let body = res.bytes().await.unwrap();
        if let Some(token) = crate::support::form_csrf(&String::from_utf8_lossy(&body)) {
            self.form_csrf = Some(token);
        }
        let mut page = axum::http::Response::new(body);
        *page.status_mut() = status;
        *page.headers_mut() = headers;
        reqwest::Response::from(page)
    }

    fn url(&self, path_or_url: &str) -> String {
        if path_or_url.starts_with("http") { path_or_url.to_owned() } else { format!("{}{path_or_url}", self.base) }
    }

    async fn get(&mut self, path: &str) -> reqwest::Response {
        let res = self.http.get(self.url(path)).header("cookie", self.header()).send().await.unwrap();
        self.seen(res).await
    }

    async fn post(&mut self, path: &str, form: &[(&str, &str)]) -> reqwest::Response {
        let res = self.http.post(self.url(path)).header("cookie", self.header()).form(form).send().await.unwrap();
        self.seen(res).await
    }

    /// Signs in on the sign-in page.
    async fn sign_in(&mut self) {
        self.get("/sign-in").await;
        let csrf = self.csrf();
        let res = self.post("/sign-in", &[("csrf", &csrf), ("email", EMAIL), ("password", PASSWORD)]).await;
        assert_eq!(res.status(), StatusCode::SEE_OTHER);
    }
}

fn location(res: &reqwest::Response) -> String {
    res.headers()[LOCATION].to_str().unwrap().to_owned()
}

fn query(url: &str, key: &str) -> Option<String> {
    url::Url::parse(url).unwrap().query_pairs().find(|(k, _)| k == key).map(|(_, v)| v.into_owned())
}

/// `service` with the test's addresses and configuration directory.
struct Cli {
    env: Vec<(&'static str, String)>,
}

impl Cli {
    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = process::command();
        cmd.env_remove("SERVICE_TOKEN").envs(self.env.iter().map(|(k, v)| (*k, v.as_str()))).args(args);
        cmd
    }

    async fn run(&self, args: &[&str], extra: &[(&str, &str)]) -> std::process::Output {
        let mut cmd = self.command(args);
        cmd.envs(extra.iter().copied()).stdin(Stdio::null());
        tokio::task::spawn_blocking(move || cmd.output().unwrap()).await.unwrap()
    }

    /// Starts `service auth login --no-browser`; returns it, the address
    /// it asks to open, and what else it writes to standard error.
    fn login(&self) -> (Child, String, mpsc::Receiver<String>) {
        let mut child = self
            .command(&["auth", "login", "--no-browser"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let url = loop {
            let line = rx.recv_timeout(Duration::from_secs(30)).expect("the CLI prints the address to open");
            if let Some(rest) = line.trim().strip_prefix("http") {
                break format!("http{rest}");
            }
        };
        (child, url, rx)
    }
}

async fn finish(child: Child) -> std::process::Output {
    tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap()
}

async fn setup() -> (TestServer, tempfile::TempDir, Cli) {
    let srv = TestServer::start(Backend::Sqlite).await.unwrap();
    service::access::admin::set_password(
        &srv.state.store,
        EMAIL,
        SecretString::from(PASSWORD),
        service::access::admin::OnPasswordChange::KeepSessions,
    )
    .await
    .unwrap();
    let config = crate::support::private_dir();
    let env = vec![
        ("SERVICE_APP_URL", format!("{}/", srv.base)),
        ("SERVICE_API_BASE_URL", format!("{}/v1/", srv.base)),
        ("SERVICE_CONFIG_DIR", config.path().join("service").display().to_string()),
    ];
    (srv, config, Cli { env })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_signs_in_through_the_browser_and_out_again() {
    let (srv, config, cli) = setup().await;
    let (child, url, _) = cli.login();
    assert!(url.starts_with(&format!("{}/cli/authorize?", srv.base)), "{url}");

    // The browser: not signed in, so to the sign-in page and back.
    let mut b = Browser::new(&srv.base);
    let res = b.get(&url).await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    let to_sign_in = location(&res);
    assert!(to_sign_in.starts_with("/sign-in?next=%2Fcli%2Fauthorize"), "{to_sign_in}");
    b.get(&to_sign_in).await;
    let csrf = b.csrf();
    let next = query(&format!("http://x{to_sign_in}"), "next").unwrap();
    let res = b.post("/sign-in", &[("csrf", &csrf), ("email", EMAIL), ("password", PASSWORD), ("next", &next)]).await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    let back = location(&res);
    assert!(back.starts_with("/cli/authorize?"), "{back}");
    let res = b.get(&back).await;
    assert_eq!(res.status(), StatusCode::OK);
    let page = res.text().await.unwrap();
    assert!(page.contains(EMAIL) && page.contains("Allow"), "{page}");

    // Confirming sends the browser to the CLI's loopback address.
    let params: Vec<(String, String)> = url::Url::parse(&url).unwrap().query_pairs().into_owned().collect();
    let mut form: Vec<(&str, &str)> = params.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let csrf = b.csrf();
    form.push(("csrf", &csrf));
    form.push(("decision", "allow"));
    let res = b.post("/cli/authorize", &form).await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    let callback = location(&res);
    assert!(callback.starts_with("http://127.0.0.1:") && callback.contains("/callback?code=svc1_"), "{callback}");
    let done = b.get(&callback).await;
    assert!(done.text().await.unwrap().contains("close this window"));
    let out = finish(child).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("Signed in to {}/v1/ as {EMAIL}", srv.base)), "{stdout}");

    // Stored for this address only, readable by the user only.
    use std::os::unix::fs::PermissionsExt;
    let file = config.path().join("service").join("logins.json");
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    let stored: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let login = &stored["logins"][format!("{}/v1/", srv.base)];
    let token = login["token"].as_str().unwrap().to_owned();

    // A CLI session of its own, labelled with the host, on the server.
    let sessions = json_ok(srv.get("/v1/sessions").send().await.unwrap()).await;
    let cli_sessions: Vec<&Value> = sessions["data"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["client_source"] == "cli" && s["label"].as_str().unwrap_or("").starts_with("CLI on "))
        .collect();
    assert_eq!(cli_sessions.len(), 1, "{sessions}");
    assert_eq!(cli_sessions[0]["session_id"], login["session_id"]);

    // The code was spent: replaying it gets nothing.
    let code = query(&callback, "code").unwrap();
    let replay = reqwest::Client::new()
        .post(format!("{}/cli/token", srv.base))
        .json(&json!({ "code": code, "code_verifier": "x".repeat(43), "redirect_uri": "http://127.0.0.1:1/callback" }))
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), StatusCode::BAD_REQUEST);
    assert_eq!(replay.json::<Value>().await.unwrap()["code"], "CLI_LOGIN_REFUSED");

    let out = cli.run(&["auth", "status"], &[]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains(EMAIL) && stdout.contains("client cli"), "{stdout}");
    let out = cli.run(&["auth", "status"], &[("SERVICE_TOKEN", ADMIN_TOKEN)]).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("token from SERVICE_TOKEN"));
    // Errors say what failed, with distinct exit codes.
    let out = cli.run(&["auth", "status"], &[("SERVICE_TOKEN", "svc_not_a_real_token_at_all_0123456789")]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "an API error: {stderr}");
    assert!(stderr.contains("401") || stderr.contains("UNAUTHENTICATED"), "{stderr}");
    assert!(stderr.contains("request "), "the request id: {stderr}");
    let out = cli
        .run(&["auth", "status"], &[("SERVICE_API_BASE_URL", "http://127.0.0.1:1/v1/"), ("SERVICE_TOKEN", ADMIN_TOKEN)])
        .await;
    assert_eq!(out.status.code(), Some(4), "a network error: {}", String::from_utf8_lossy(&out.stderr));

    // Logout revokes the session on the server and forgets it here.
    let out = cli.run(&["auth", "logout"], &[]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let me = reqwest::Client::new().get(format!("{}/v1/me", srv.base)).bearer_auth(&token).send().await.unwrap();
    assert_eq!(me.status(), StatusCode::UNAUTHORIZED);
    assert!(!std::fs::read_to_string(&file).unwrap().contains(&token));
    let out = cli.run(&["auth", "status"], &[]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("service auth login"));

    // A token for automation, from standard input.
    let mut cmd = cli.command(&["auth", "login", "--with-token"]);
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), format!("{ADMIN_TOKEN}\n").as_bytes()).unwrap();
    let out = finish(child).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!String::from_utf8_lossy(&out.stdout).contains(ADMIN_TOKEN), "the token is never printed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codes_go_only_to_this_machine_and_only_with_their_verifier() {
    let (srv, _config, cli) = setup().await;
    let mut b = Browser::new(&srv.base);
    b.sign_in().await;
    let verifier = "v".repeat(20) + &"w".repeat(30);
    let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
    let authorize = |redirect: &str, b: &Browser| {
        vec![
            ("redirect_uri".to_owned(), redirect.to_owned()),
            ("state".to_owned(), "st4te".to_owned()),
            ("code_challenge".to_owned(), challenge.clone()),
            ("code_challenge_method".to_owned(), "S256".to_owned()),
            ("host".to_owned(), "laptop".to_owned()),
            ("csrf".to_owned(), b.csrf()),
            ("decision".to_owned(), "allow".to_owned()),
        ]
    };
    let as_ref = |f: &Vec<(String, String)>| f.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<Vec<_>>();

    // Codes never go to another machine, nor to a name that could resolve anywhere.
    for redirect in
        ["https://evil.example/cb", "http://localhost:9999/cb", "http://127.0.0.1/cb", "http://10.0.0.8:9999/cb"]
    {
        let form = as_ref(&authorize(redirect, &b));
        let res = b
            .http
            .post(format!("{}/cli/authorize", srv.base))
            .header("cookie", b.header())
            .form(&form)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{redirect}");
        assert!(res.headers().get(LOCATION).is_none());
    }
    // Not without the form's CSRF token.
    let mut form = as_ref(&authorize("http://127.0.0.1:9/callback", &b));
    form.retain(|(k, _)| k != "csrf");
    let res = b
        .http
        .post(format!("{}/cli/authorize", srv.base))
        .header("cookie", b.header())
        .form(&form)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);

    let code_for = |redirect: &'static str| {
        let form = as_ref(&authorize(redirect, &b));
        let req = b.http.post(format!("{}/cli/authorize", srv.base)).header("cookie", b.header()).form(&form);
        async move {
            let res = req.send().await.unwrap();
            assert_eq!(res.status(), StatusCode::SEE_OTHER);
            let to = location(&res);
            assert_eq!(query(&to, "state").as_deref(), Some("st4te"));
            query(&to, "code").unwrap()
        }
    };
    let exchange = |code: String, verifier: String, redirect: &'static str| {
        let req = reqwest::Client::new()
            .post(format!("{}/cli/token", srv.base))
            .json(&json!({ "code": code, "code_verifier": verifier, "redirect_uri": redirect }));
        async move {
            let res = req.send().await.unwrap();
            (res.status(), res.json::<Value>().await.unwrap())
        }
    };
    const CB: &str = "http://127.0.0.1:9/callback";
    // A code without its verifier is worth nothing, and is spent by trying.
    let code = code_for(CB).await;
    let (status, body) = exchange(code.clone(), "x".repeat(43), CB).await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::BAD_REQUEST, Some("CLI_LOGIN_REFUSED")));
    let (status, _) = exchange(code, verifier.clone(), CB).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "spent by the wrong try");
    // Nor at another address than it was sent to.
    let code = code_for(CB).await;
    let (status, _) = exchange(code, verifier.clone(), "http://127.0.0.1:10/callback").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // With both: a CLI session.
    let code = code_for(CB).await;
    let (status, body) = exchange(code, verifier.clone(), CB).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let token = body["access_token"].as_str().unwrap();
    let me =
        json_ok(reqwest::Client::new().get(format!("{}/v1/me", srv.base)).bearer_auth(token).send().await.unwrap())
            .await;
    let sessions = json_ok(srv.get("/v1/sessions").send().await.unwrap()).await;
    let session = sessions["data"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["session_id"] == me["data"]["session_id"])
        .unwrap()
        .clone();
    assert_eq!(
        (session["client_source"].as_str(), session["label"].as_str()),
        (Some("cli"), Some("CLI on laptop")),
        "{session}"
    );
    // Deny: the CLI learns it was refused.
    let mut form = as_ref(&authorize(CB, &b));
    form.retain(|(k, _)| k != "decision");
    form.push(("decision".into(), "deny".into()));
    let res = b
        .http
        .post(format!("{}/cli/authorize", srv.base))
        .header("cookie", b.header())
        .form(&form)
        .send()
        .await
        .unwrap();
    let to = location(&res);
    assert_eq!(query(&to, "error").as_deref(), Some("access_denied"));
    assert!(query(&to, "code").is_none());

    // A callback with another state (a page luring the browser there) is
    // refused by the CLI, which then exits without signing in.
    let (child, url, rest) = cli.login();
    let redirect = query(&url, "redirect_uri").unwrap();
    let _ = reqwest::Client::new().get(format!("{redirect}?code=svc1_forged&state=forged")).send().await;
    let out = finish(child).await;
    // Every line, once the reader has seen the end of its output.
    let said: Vec<String> = rest.iter().collect();
    assert!(!out.status.success());
    assert!(said.iter().any(|l| l.contains("state this login did not send")), "{said:?}");
}
