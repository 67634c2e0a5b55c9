//! `service auth`: sign the CLI in through the browser (RFC 8252: a
//! loopback redirect with PKCE), say who is signed in where, and sign out
//! (revoking the session on the server).

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::client::{Addresses, ApiClient, CliFailure, Login, answer, http, network, store_login, stored_login};

/// How long the CLI waits for the browser.
const WAIT_FOR_BROWSER: Duration = Duration::from_secs(300);

#[derive(Debug, clap::Subcommand)]
pub enum AuthCommand {
    /// Sign in through the browser and keep the session for this API address.
    Login {
        /// Print the address to open instead of opening a browser.
        #[arg(long)]
        no_browser: bool,
        /// Read a token from standard input instead (for automation).
        #[arg(long)]
        with_token: bool,
    },
    /// Say who is signed in, at which address.
    Status,
    /// Revoke this CLI's session on the server and forget it.
    Logout,
}

pub(crate) async fn run(addresses: &Addresses, cmd: AuthCommand) -> Result<(), CliFailure> {
    match cmd {
        AuthCommand::Login { with_token: true, .. } => {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).map_err(|e| CliFailure::Other(format!("standard input: {e}")))?;
            let token = SecretString::from(line.trim().to_owned());
            if token.expose_secret().is_empty() {
                return Err(CliFailure::Other("no token on standard input".into()));
            }
            remember(addresses, token).await
        }
        AuthCommand::Login { no_browser, .. } => {
            let token = browser_login(addresses, no_browser).await?;
            remember(addresses, token).await
        }
        AuthCommand::Status => {
            let api = addresses.api();
            let overridden = addresses.token.is_some();
            let client = ApiClient::signed_in(addresses)?;
            let me = client.call(reqwest::Method::GET, "me", None).await?;
            println!("Signed in to {api} as {}", me["user"]["email"].as_str().unwrap_or("?"));
            println!(
                "  session {} (client {})",
                me["session_id"].as_str().unwrap_or("?"),
                me["client_source"].as_str().unwrap_or("?")
            );
            if overridden {
                println!("  token from SERVICE_TOKEN");
            }
            Ok(())
        }
        AuthCommand::Logout => {
            let api = addresses.api();
            let Some(login) = stored_login(addresses)? else {
                return Err(CliFailure::Other(format!("not signed in to {api}")));
            };
            let client = ApiClient::new(api.clone(), login.token.clone().into());
            match client
                .call(reqwest::Method::POST, &format!("sessions/{}/revoke", login.session_id), Some(&json!({})))
                .await
            {
                // Revoked now, or already unusable: either way it is gone.
                Ok(_) | Err(CliFailure::Api { .. }) => {}
                Err(e) => return Err(e),
            }
            store_login(addresses, None)?;
            println!("Signed out of {api} ({})", login.email);
            Ok(())
        }
    }
}

/// Checks a token against the API and stores it for the address.
async fn remember(addresses: &Addresses, token: SecretString) -> Result<(), CliFailure> {
    let api = addresses.api();
    let me = ApiClient::new(api.clone(), token.clone()).call(reqwest::Method::GET, "me", None).await?;
    let email = me["user"]["email"].as_str().unwrap_or_default().to_owned();
    let session_id = me["session_id"].as_str().unwrap_or_default().to_owned();
    store_login(addresses, Some(Login { token: token.expose_secret().to_owned(), email: email.clone(), session_id }))?;
    println!("Signed in to {api} as {email}");
    Ok(())
}

/// 256 random bits, base64url: a PKCE verifier or a state.
fn random() -> String {
    crate::access::tokens::generate("").expose_secret().to_owned()
}

/// This machine's name, for the session's label.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "this machine".into())
}

/// The browser flow: returns the new session's token.
async fn browser_login(addresses: &Addresses, no_browser: bool) -> Result<SecretString, CliFailure> {
    let app = addresses.app();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| CliFailure::Other(format!("cannot listen on 127.0.0.1: {e}")))?;
    let port = listener.local_addr().map_err(|e| CliFailure::Other(e.to_string()))?.port();
    let redirect_uri = format!("http://127.0.0.1:{port}/callback");
    let verifier = random();
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
    let state = random();
    let mut url = app.join("cli/authorize").map_err(|e| CliFailure::Other(e.to_string()))?;
    url.query_pairs_mut()
        .append_pair("redirect_uri", &redirect_uri)
        .append_pair("state", &state)
        .append_pair("code_challenge", &challenge)
        .append_pair("code_challenge_method", "S256")
        .append_pair("host", &host_name());
    let opened = !no_browser && open_browser(url.as_str());
    if opened {
        eprintln!("Opened your browser to sign in. If it did not open, visit:");
    } else {
        eprintln!("Open this address in a browser to sign in:");
    }
    eprintln!("  {url}");

    // One callback with the right state ends the wait.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<HashMap<String, String>>(1);
    let router = axum::Router::new().route(
        "/callback",
        axum::routing::get(move |axum::extract::Query(q): axum::extract::Query<HashMap<String, String>>| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(q).await;
                axum::response::Html("<!doctype html><title>service</title><p>Done: you can close this window and return to the terminal.</p>")
            }
        }),
    );
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let waited = tokio::time::timeout(WAIT_FOR_BROWSER, async {
        while let Some(q) = rx.recv().await {
            let same: bool = q.get("state").is_some_and(|s| subtle::ConstantTimeEq::ct_eq(s.as_bytes(), state.as_bytes()).into());
            if !same {
                return Err(CliFailure::Other("the browser came back with a state this login did not send: refused (start again with service auth login)".into()));
            }
            if let Some(e) = q.get("error") {
                return Err(CliFailure::Other(format!("the sign-in was not allowed in the browser ({e})")));
            }
            if let Some(code) = q.get("code") {
                return Ok(code.clone());
            }
        }
        Err(CliFailure::Other("the browser never came back".into()))
    })
    .await;
    // Let the browser's page load before the listener goes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.abort();
    let code = waited.map_err(|_| {
        CliFailure::Other(format!("no answer from the browser within {} minutes", WAIT_FOR_BROWSER.as_secs() / 60))
    })??;

    let token_url = app.join("cli/token").map_err(|e| CliFailure::Other(e.to_string()))?;
    let res = http()
        .post(token_url.clone())
        .header("x-service-client", "cli")
        .json(&json!({ "code": code, "code_verifier": verifier, "redirect_uri": redirect_uri }))
        .send()
        .await
        .map_err(|e| network(&token_url, &e))?;
    let body = answer(res).await?;
    match body.get("access_token").and_then(Value::as_str) {
        Some(t) => Ok(SecretString::from(t.to_owned())),
        None => Err(CliFailure::Other("the service answered without a token".into())),
    }
}

/// Opens `url` in the user's browser; false when none could be started.
pub(crate) fn open_browser(url: &str) -> bool {
    let opener = if cfg!(target_os = "macos") { "open" } else { "xdg-open" };
    std::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .is_ok()
}
