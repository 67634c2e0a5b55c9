//! The `service` CLI as an API client, run as a user runs it (the real
//! binary, `SERVICE_TOKEN` or a stored login): a credential typed on the
//! entry page while the CLI waits, a source, a destination and a pipeline
//! made from the command line, `pipelines sync --wait` with its progress
//! live until the outcome, tables and `--json`, a write that becomes a
//! proposal and is approved from another session, and each kind of
//! failure with its own exit code and the request id.

use std::io::{BufRead, BufReader};
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use reqwest::StatusCode;
use serde_json::{Value, json};
use service::access::Role;

use crate::on_both_backends;
use crate::support::mailcoach::{self, MailcoachState};
use crate::support::provider::{FakeProvider, TestCa};
use crate::support::trust::Trust;
use crate::support::{ADMIN_TOKEN, Backend, TestServer, json_ok, process};

const BASE_URL: &str = "https://mail.acme-corp.com/api";
const SECRET: &str = "mc-secret-typed-in-the-page-0123456789";

/// `service` pointed at the test server, with a token.
pub struct Cli {
    env: Vec<(&'static str, String)>,
}

impl Cli {
    /// The CLI of `srv`, keeping its logins in `config`.
    pub fn of(srv: &TestServer, config: &std::path::Path) -> Cli {
        Cli {
            env: vec![
                ("SERVICE_APP_URL", format!("{}/", srv.base)),
                ("SERVICE_API_BASE_URL", format!("{}/v1/", srv.base)),
                ("SERVICE_CONFIG_DIR", config.display().to_string()),
            ],
        }
    }

    pub fn command(&self, token: &str, args: &[&str]) -> std::process::Command {
        let mut cmd = process::command();
        cmd.envs(self.env.iter().map(|(k, v)| (*k, v.as_str()))).env("SERVICE_TOKEN", token).args(args);
        cmd
    }

    /// Runs a command to its end.
    pub async fn run_as(&self, token: &str, args: &[&str]) -> Output {
        let mut cmd = self.command(token, args);
        tokio::task::spawn_blocking(move || cmd.output().unwrap()).await.unwrap()
    }

    pub async fn run(&self, args: &[&str]) -> Output {
        self.run_as(ADMIN_TOKEN, args).await
    }

    /// Runs a command that must succeed; its standard output.
    pub async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert!(out.status.success(), "{args:?}: {}\n{}", stdout(&out), stderr(&out));
        stdout(&out)
    }

    /// Runs a `--json` command that must succeed; its data.
    pub async fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let text = self.ok(&all).await;
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {text}"))
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

async fn the_cli_builds_and_syncs_a_pipeline_and_reports_failures_by_kind(backend: Backend) {
    let ca = TestCa::new();
    let token = format!("mc-token-{}", uuid::Uuid::new_v4().simple());
    assert_ne!(token, SECRET);
    // Pages answer slowly, so the sync runs long enough to show progress.
    let mc = Arc::new(MailcoachState {
        token: SECRET.to_owned(),
        campaigns: mailcoach::campaigns(25),
        subscribers: 3000,
        ..Default::default()
    });
    let names = ["mail.acme-corp.com"];
    let provider = FakeProvider::start(&ca, &names, mailcoach::router(mc.clone())).await;
    let trust = Trust::new(&ca).serving(&provider, &names);
    let srv = TestServer::start_with(backend, |c| c.plugins.egress = trust.policy()).await.unwrap();
    let config = crate::support::private_dir();
    let cli = Cli::of(&srv, config.path());
    let ws = srv.workspace_id().await;

    // Tables for people.
    let table = cli.ok(&["workspaces", "list"]).await;
    let header = table.lines().next().unwrap();
    assert!(header.starts_with("WORKSPACE") && header.contains("ROLE"), "{table}");
    assert!(table.lines().any(|l| l.starts_with(&ws) && l.contains("administrator")), "{table}");
    let connectors = cli.ok(&["connectors", "list"]).await;
    assert!(
        connectors.lines().any(|l| l.starts_with("conn_emailcampaign_edm") && l.contains("available")),
        "{connectors}"
    );

    // A credential: the CLI prints the entry page and waits; the secret is
    // typed on the page (here, posted as the page's form) and never passes
    // through the CLI.
    let mut child = cli
        .command(
            ADMIN_TOKEN,
            &[
                "credentials",
                "create",
                "--connector",
                "conn_emailcampaign_edm",
                "--host",
                "mail.acme-corp.com",
                "--label",
                "newsletters",
                "--no-browser",
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err_lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = loop {
        let line = err_lines.next().expect("the CLI prints the entry page's address").unwrap();
        if let Some(rest) = line.trim().strip_prefix("http") {
            break format!("http{rest}");
        }
    };
    assert!(url.starts_with(&format!("{}/credential-entry/", srv.base)), "{url}");
    let page = reqwest::Client::new().post(&url).form(&[("secret", SECRET)]).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap();
    let rest: Vec<String> = err_lines.map_while(Result::ok).collect();
    assert!(out.status.success(), "{} {rest:?}", stdout(&out));
    let printed = stdout(&out);
    let handle = printed
        .split_whitespace()
        .find(|w| w.starts_with("ch_"))
        .unwrap_or_else(|| panic!("a handle: {printed}"))
        .to_owned();
    assert!(!printed.contains(SECRET) && !rest.concat().contains(SECRET), "the secret is never printed");

    // A source, a destination, a pipeline with the suggested streams.
    let config_json = json!({ "base_url": BASE_URL, "credential_handle": handle }).to_string();
    let source = cli
        .json(&[
            "sources",
            "create",
            "--name",
            "Newsletters",
            "--connector",
            "conn_emailcampaign_edm",
            "--config",
            &config_json,
        ])
        .await;
    let source_id = source["source_id"].as_str().unwrap().to_owned();
    let shown = cli.ok(&["sources", "get", &source_id]).await;
    assert!(shown.contains(&format!("configuration.credential_handle: {handle}")), "{shown}");
    let destination = cli
        .json(&[
            "destinations",
            "create",
            "--name",
            "Warehouse",
            "--kind",
            "sqlite",
            "--set",
            "configuration.file=mail.db",
        ])
        .await;
    let destination_id = destination["destination_id"].as_str().unwrap().to_owned();
    let streams = cli.ok(&["pipelines", "prepare", "--source", &source_id]).await;
    assert!(streams.lines().next().unwrap().starts_with("STREAM"), "{streams}");
    assert!(streams.contains("subscribers") && streams.contains("Suggested: --stream campaigns:"), "{streams}");
    let created = cli
        .ok(&["pipelines", "create", "--name", "mail", "--source", &source_id, "--destination", &destination_id])
        .await;
    let pipeline_id =
        created.split_whitespace().find(|w| w.starts_with("pl_")).unwrap_or_else(|| panic!("{created}")).to_owned();
    let pipeline = json_ok(srv.get(&format!("/v1/pipelines/{pipeline_id}")).send().await.unwrap()).await;
    assert_eq!(pipeline["data"]["streams"].as_array().unwrap().len(), 4, "the suggested selection: {pipeline}");

    // A sync waited for: progress lines while it runs, then the outcome.
    mc.delay_ms.store(120, Ordering::SeqCst);
    let out = cli.run(&["pipelines", "sync", &pipeline_id, "--wait"]).await;
    mc.delay_ms.store(0, Ordering::SeqCst);
    let (so, se) = (stdout(&out), stderr(&out));
    assert!(out.status.success(), "{so}\n{se}");
    let job_id = so.split_whitespace().find(|w| w.starts_with("job_")).unwrap_or_else(|| panic!("{so}")).to_owned();
    assert!(so.contains(&format!("{job_id} succeeded in")), "{so}");
    let totals: Vec<u64> = se
        .lines()
        .filter(|l| l.starts_with(&format!("{job_id} ")) && l.contains(" records, "))
        .map(|l| l.split(": ").nth(1).unwrap().split(' ').next().unwrap().replace(',', "").parse().unwrap())
        .collect();
    assert!(totals.len() >= 3, "progress shown while it ran: {se}");
    assert!(
        totals.windows(2).all(|w| w[0] <= w[1]) && totals.first() < totals.last(),
        "counts only grow: {totals:?}\n{se}"
    );
    assert_eq!(*totals.last().unwrap(), 25 + 25 + 1 + 3000, "{se}");
    assert!(
        se.lines().any(|l| l.trim_start().starts_with("subscribers") && l.contains("3,000 records")),
        "per stream: {se}"
    );
    let jobs = cli.json(&["jobs", "list", "--pipeline", &pipeline_id]).await;
    assert_eq!(jobs["items"][0]["job_id"], job_id.as_str());
    assert_eq!(jobs["items"][0]["status"], "succeeded");
    // The job's ledger: every record each stream read, loaded.
    let shown = cli.ok(&["jobs", "get", &job_id]).await;
    assert!(shown.contains("Ledger of attempt 1: balanced"), "{shown}");
    let row: Vec<&str> = shown
        .lines()
        .find(|l| l.starts_with("subscribers "))
        .unwrap_or_else(|| panic!("a ledger row per stream: {shown}"))
        .split_whitespace()
        .collect();
    assert_eq!(row[1..8], ["3000", "3000", "0", "0", "0", "0", "0"], "read, loaded, nothing else: {shown}");

    // A write asked to be a proposal says so; another session approves it.
    let out = cli.run(&["sources", "update", &source_id, "--name", "Renamed", "--propose"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let so = stdout(&out);
    assert!(so.starts_with("Proposed, not run: approval apr_"), "{so}");
    let approval_id = so.split_whitespace().find(|w| w.starts_with("apr_")).unwrap().to_owned();
    assert!(stderr(&out).contains(&format!("service approvals approve {approval_id}")));
    assert_eq!(
        json_ok(srv.get(&format!("/v1/sources/{source_id}")).send().await.unwrap()).await["data"]["name"],
        "Newsletters",
        "not run yet"
    );
    let pending = cli.ok(&["approvals", "list", "--status", "pending"]).await;
    assert!(
        pending.lines().any(|l| l.starts_with(&approval_id) && l.contains(" cli ")),
        "proposed from the CLI: {pending}"
    );
    let (_, other_admin) = srv.user_in(&ws, Role::Administrator).await;
    let out = cli.run_as(&other_admin, &["approvals", "approve", &approval_id]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("It ran and answered 200"), "{}", stdout(&out));
    assert_eq!(
        json_ok(srv.get(&format!("/v1/sources/{source_id}")).send().await.unwrap()).await["data"]["name"],
        "Renamed"
    );

    // An invitation's link is printed once, for the inviter to pass on.
    let invited = cli.ok(&["members", "invite", "new-member@example.test", "--role", "editor"]).await;
    assert!(invited.starts_with("Invited new-member@example.test as editor (invitation inv_"), "{invited}");
    assert!(invited.contains(&format!("{}/invitations/svc1_", srv.base)), "{invited}");

    // A proposed invitation, approved: the approver is shown its link,
    // which the stored proposal never keeps.
    let out = cli.run(&["members", "invite", "proposed-member@example.test", "--propose"]).await;
    let proposal = stdout(&out)
        .split_whitespace()
        .find(|w| w.starts_with("apr_"))
        .unwrap_or_else(|| panic!("{}", stdout(&out)))
        .to_owned();
    let out = cli.run_as(&other_admin, &["approvals", "approve", &proposal]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(&format!("{}/invitations/svc1_", srv.base)), "the link, once: {}", stdout(&out));

    // Every request said it came from the CLI.
    let audit = cli.json(&["audit-logs", "list", "--action", "sources.create"]).await;
    assert_eq!(audit["items"][0]["client_source"], "cli", "{audit}");

    // The credential is listed without its secret, and revoked by id.
    let credentials = cli.json(&["credentials", "list"]).await;
    let credential = credentials["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["credential_handle"] == handle.as_str())
        .expect("listed")
        .clone();
    assert!(!credentials.to_string().contains(SECRET));
    let credential_id = credential["credential_id"].as_str().unwrap();
    let revoked = cli.ok(&["credentials", "revoke", credential_id]).await;
    assert!(
        revoked.starts_with(&format!("Revoked credential {credential_id}; sources that used it:"))
            && revoked.contains(&source_id),
        "{revoked}"
    );
    let out = cli.run(&["credentials", "revoke", credential_id]).await;
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("CREDENTIAL_REVOKED"), "{}", stderr(&out));

    // Failures: the API's (code, message, request id; exit 3) ...
    let out = cli.run(&["sources", "get", "src_missing"]).await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let e = stderr(&out);
    assert!(e.contains("404") && e.contains("(request ") && !e.contains("(request unknown)"), "{e}");
    let (_, viewer) = srv.user_in(&ws, Role::Viewer).await;
    let out = cli.run_as(&viewer, &["pipelines", "delete", &pipeline_id]).await;
    assert_eq!(out.status.code(), Some(3), "a viewer cannot delete: {}", stderr(&out));
    assert!(stderr(&out).contains("FORBIDDEN") || stderr(&out).contains("403"), "{}", stderr(&out));
    assert_eq!(
        json_ok(srv.get(&format!("/v1/pipelines/{pipeline_id}")).send().await.unwrap()).await["data"]["pipeline_id"],
        pipeline_id.as_str()
    );
    // ... the network's (exit 4) ...
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut cmd = cli.command(ADMIN_TOKEN, &["sources", "list"]);
    cmd.env("SERVICE_API_BASE_URL", format!("http://127.0.0.1:{closed}/v1/"));
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap()).await.unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("cannot reach http://127.0.0.1:{closed}/v1/: Connection refused")),
        "{}",
        stderr(&out)
    );
    // ... and usage errors (exit 2), before any request.
    for args in [
        vec!["sources", "create", "--name", "x"],
        vec!["sources", "create", "--name", "x", "--connector", "c", "--config", "{"],
        vec!["destinations", "create", "--data", "[1]"],
        vec![
            "pipelines",
            "create",
            "--name",
            "p",
            "--source",
            &source_id,
            "--destination",
            &destination_id,
            "--stream",
            "campaigns:sideways",
        ],
    ] {
        let out = cli.run(&args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
    // Without a token or a login, nothing is sent.
    let mut cmd = cli.command("", &["sources", "list"]);
    cmd.env_remove("SERVICE_TOKEN");
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap()).await.unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("service auth login"), "{}", stderr(&out));

    // Another workspace's resources are not reached by naming it.
    let (other_ws, _) = srv.other_workspace().await;
    let out = cli.run(&["sources", "list", "--workspace", &other_ws]).await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
}

on_both_backends!(the_cli_builds_and_syncs_a_pipeline_and_reports_failures_by_kind);
