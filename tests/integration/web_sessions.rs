//! Only a person signed in on the web acts at the pages. Every other kind
//! of token (an assistant's MCP token, an API token, a CLI session) sent as
//! the session cookie is no one there: it cannot authorise a CLI, decide a
//! proposal, join a workspace or sign itself out; the positive control is a
//! real web sign-in that completes a CLI login, whose session ends when
//! the web session does at the latest. Sign-ins, sign-outs and CLI logins
//! are audited with the client's address. The invitation page says the
//! same whether or not the invited address has an account.

use base64::Engine;
use reqwest::header::{LOCATION, SET_COOKIE};
use reqwest::{Client, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};
use service::access::ClientSource;
use service::access::admin::{OnPasswordChange, create_token, set_password};
use sha2::{Digest, Sha256};

use crate::on_both_backends;
use crate::support::{Backend, TestServer, form_csrf, json_ok};

const EMAIL: &str = "admin@example.test";
pub(crate) const PASSWORD: &str = "a passphrase long enough";

on_both_backends!(
    no_token_but_a_web_sign_in_acts_at_the_pages,
    the_invitation_page_does_not_say_whether_an_address_has_an_account,
    an_assistant_ends_its_own_session_but_only_proposes_ending_its_persons_others
);

fn browser() -> Client {
    Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

fn cookie_value(res: &reqwest::Response, name: &str) -> Option<String> {
    res.headers()
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| v.strip_prefix(&format!("{name}=")).map(|rest| rest.split(';').next().unwrap().to_owned()))
}

/// A pre-session id and the CSRF token bound to it: what any client gets
/// from the sign-in page.
async fn csrf_pair(srv: &TestServer) -> (String, String) {
    let res = browser().get(srv.url("/sign-in")).send().await.unwrap();
    let id = cookie_value(&res, "service_csrf").unwrap();
    (id, form_csrf(&res.text().await.unwrap()).unwrap())
}

/// Signs `email` in on the web: the cookie header of its browser and the
/// token of its forms.
pub(crate) async fn web_sign_in(srv: &TestServer, email: &str) -> (String, String) {
    let (id, token) = csrf_pair(srv).await;
    let res = browser()
        .post(srv.url("/sign-in"))
        .header("cookie", format!("service_csrf={id}"))
        .form(&[("csrf", token.as_str()), ("email", email), ("password", PASSWORD)])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER, "{email} signs in");
    (format!("service_session={}; service_csrf={id}", cookie_value(&res, "service_session").unwrap()), token)
}

/// The query of a CLI's authorisation request, with its verifier.
fn cli_request() -> (Vec<(&'static str, String)>, String) {
    let verifier = "cli-verifier-".repeat(5);
    let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
    let query = vec![
        ("redirect_uri", "http://127.0.0.1:9/callback".to_owned()),
        ("state", "st4te".to_owned()),
        ("code_challenge", challenge),
        ("code_challenge_method", "S256".to_owned()),
        ("host", "laptop".to_owned()),
    ];
    (query, verifier)
}

async fn status_of(srv: &TestServer, approval_id: &str) -> String {
    let listed = json_ok(srv.get("/v1/approvals").send().await.unwrap()).await;
    listed["data"]["items"].as_array().unwrap().iter().find(|a| a["approval_id"] == approval_id).unwrap()["status"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn no_token_but_a_web_sign_in_acts_at_the_pages(backend: Backend) {
    let Some(srv) = TestServer::start(backend).await else { return };
    let ws = srv.workspace_id().await;
    let store = &srv.state.store;
    set_password(store, EMAIL, SecretString::from(PASSWORD), OnPasswordChange::KeepSessions).await.unwrap();
    let mcp = create_token(store, EMAIL, Some("assistant"), Some(1), ClientSource::Mcp)
        .await
        .unwrap()
        .expose_secret()
        .to_owned();
    let api = create_token(store, EMAIL, Some("automation"), None, ClientSource::Api)
        .await
        .unwrap()
        .expose_secret()
        .to_owned();

    // The positive control: a person signs in on the web and authorises a
    // CLI, which gets a session of its own.
    let (web, web_csrf) = web_sign_in(&srv, EMAIL).await;
    let (query, verifier) = cli_request();
    let mut form: Vec<(&str, String)> = query.clone();
    form.push(("csrf", web_csrf.clone()));
    form.push(("decision", "allow".to_owned()));
    let res = browser().post(srv.url("/cli/authorize")).header("cookie", &web).form(&form).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    let callback = url::Url::parse(res.headers()[LOCATION].to_str().unwrap()).unwrap();
    let code = callback.query_pairs().find(|(k, _)| k == "code").expect("a code for the CLI").1.into_owned();
    let exchanged = browser()
        .post(srv.url("/cli/token"))
        .json(&json!({ "code": code, "code_verifier": verifier, "redirect_uri": "http://127.0.0.1:9/callback" }))
        .send()
        .await
        .unwrap();
    assert_eq!(exchanged.status(), StatusCode::OK);
    let exchanged: Value = exchanged.json().await.unwrap();
    let cli = exchanged["access_token"].as_str().unwrap().to_owned();
    let me = srv.request_as(&cli, reqwest::Method::GET, "/v1/me").send().await.unwrap();
    assert_eq!(me.status(), StatusCode::OK, "the CLI session works");

    // It never outlives the web session it was authorised from.
    let sessions = json_ok(srv.get("/v1/sessions").send().await.unwrap()).await;
    let items = sessions["data"]["items"].as_array().unwrap();
    let web_session = items.iter().find(|s| s["kind"] == "web").expect("the web session is listed");
    let cli_session = items.iter().find(|s| s["session_id"] == exchanged["session_id"]).unwrap();
    assert_eq!(cli_session["client_source"], "cli");
    assert_eq!(
        cli_session["expires_at"], web_session["expires_at"],
        "the CLI session ends with the web session that made it"
    );

    // The authorisation and the exchange were audited, with the address.
    let audit = json_ok(srv.get("/v1/audit-logs").send().await.unwrap()).await;
    for action in ["web.sign_in", "cli.authorize", "cli.token"] {
        let record = audit["data"]["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["action"] == action)
            .unwrap_or_else(|| panic!("{action}: {audit}"));
        assert_eq!(record["outcome"], "succeeded", "{record}");
        assert_eq!(record["address"], "127.0.0.1", "{record}");
    }

    // A proposal of the assistant, which approving would carry out.
    let proposal = srv
        .request_as(&mcp, reqwest::Method::POST, &format!("/v1/workspaces/{ws}/members/invitations"))
        .json(&json!({ "email": "via-assistant@example.test", "role": "administrator" }))
        .send()
        .await
        .unwrap();
    assert_eq!(proposal.status(), StatusCode::ACCEPTED);
    let approval_id = json_ok(proposal).await["data"]["approval"]["approval_id"].as_str().unwrap().to_owned();
    // An invitation the administrator's own account could join.
    let other_ws = store.create_workspace("Elsewhere").await.unwrap().workspace_id;
    let (_, other_admin) = srv.user_in(&other_ws, service::access::Role::Administrator).await;
    let invited = srv
        .request_as(&other_admin, reqwest::Method::POST, &format!("/v1/workspaces/{other_ws}/members/invitations"))
        .json(&json!({ "email": EMAIL, "role": "administrator" }))
        .send()
        .await
        .unwrap();
    let invitation =
        json_ok(invited).await["data"]["accept_url"].as_str().unwrap().rsplit('/').next().unwrap().to_owned();

    // Now every other kind of token as the cookie, with a CSRF pair any
    // client can get.
    let (csrf_id, csrf_token) = csrf_pair(&srv).await;
    for (kind, token) in [("mcp", &mcp), ("api", &api), ("cli", &cli)] {
        let cookie = format!("service_session={token}; service_csrf={csrf_id}");
        let get = |path: String| browser().get(srv.url(&path)).header("cookie", cookie.clone()).send();
        let post = |path: String, form: Vec<(&'static str, String)>| {
            browser().post(srv.url(&path)).header("cookie", cookie.clone()).form(&form).send()
        };

        for page in ["/account", "/approvals"] {
            let res = get(page.to_owned()).await.unwrap();
            assert_eq!(res.status(), StatusCode::SEE_OTHER, "{kind} token at {page}");
            assert!(
                res.headers()[LOCATION].to_str().unwrap().starts_with("/sign-in"),
                "{kind} token at {page}: to the sign-in page"
            );
        }
        let res = get("/sign-in".to_owned()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{kind} token: not signed in");

        // Deciding the assistant's own proposal.
        for decision in ["approve", "reject"] {
            let res = post(
                format!("/approvals/{approval_id}/{decision}"),
                vec![("csrf", csrf_token.clone()), ("workspace_id", ws.clone())],
            )
            .await
            .unwrap();
            assert_eq!(res.status(), StatusCode::SEE_OTHER, "{kind} token cannot {decision}");
        }
        assert_eq!(status_of(&srv, &approval_id).await, "pending", "{kind} token decided nothing");

        // Authorising a CLI.
        let query_string: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())))
            .finish();
        let res = get(format!("/cli/authorize?{query_string}")).await.unwrap();
        assert!(
            res.headers()[LOCATION].to_str().unwrap().starts_with("/sign-in"),
            "{kind} token: the CLI page asks for a sign-in"
        );
        let mut form = query.clone();
        form.push(("csrf", csrf_token.clone()));
        form.push(("decision", "allow".to_owned()));
        let res = post("/cli/authorize".to_owned(), form).await.unwrap();
        let location = res.headers().get(LOCATION).map(|l| l.to_str().unwrap().to_owned()).unwrap_or_default();
        assert!(!location.contains("code="), "{kind} token got a CLI code: {location}");

        // Joining a workspace as the account.
        let res = post(
            format!("/invitations/{invitation}"),
            vec![("csrf", csrf_token.clone()), ("join_as", "account".to_owned())],
        )
        .await
        .unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{kind} token cannot join");

        // Signing out ends no session but a web one.
        let res = post("/sign-out".to_owned(), vec![("csrf", csrf_token.clone())]).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let me = srv.request_as(token, reqwest::Method::GET, "/v1/me").send().await.unwrap();
        assert_eq!(me.status(), StatusCode::OK, "a sign-out with a {kind} token as the cookie revoked it");
    }
    let memberships =
        store.role_in(&store.user_by_email(EMAIL).await.unwrap().unwrap().user_id, &other_ws).await.unwrap();
    assert!(memberships.is_none(), "no token joined the workspace");

    // The person, signed in on the web, decides and joins.
    let res = browser()
        .post(srv.url(&format!("/approvals/{approval_id}/reject")))
        .header("cookie", &web)
        .form(&[("csrf", web_csrf.as_str()), ("workspace_id", ws.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(status_of(&srv, &approval_id).await, "rejected");
    let page = browser()
        .get(srv.url(&format!("/invitations/{invitation}")))
        .header("cookie", &web)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains(&format!("Join as {EMAIL}")), "{page}");
    let token = form_csrf(&page).unwrap();
    let res = browser()
        .post(srv.url(&format!("/invitations/{invitation}")))
        .header("cookie", &web)
        .form(&[("csrf", token.as_str()), ("join_as", "account")])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(
        store.role_in(&store.user_by_email(EMAIL).await.unwrap().unwrap().user_id, &other_ws).await.unwrap().is_some(),
        "the signed-in account joined"
    );
    srv.stop().await;
}

async fn the_invitation_page_does_not_say_whether_an_address_has_an_account(backend: Backend) {
    let Some(srv) = TestServer::start(backend).await else { return };
    let ws = srv.workspace_id().await;
    let (user_id, _) = srv.user_in(&ws, service::access::Role::Viewer).await;
    let existing = srv.state.store.user(&user_id).await.unwrap().unwrap().email;
    let other_ws = srv.state.store.create_workspace("Elsewhere").await.unwrap().workspace_id;
    let (_, other_admin) = srv.user_in(&other_ws, service::access::Role::Administrator).await;
    let mut pages = Vec::new();
    for email in [existing.as_str(), "nobody-yet@example.test"] {
        let invited = srv
            .request_as(&other_admin, reqwest::Method::POST, &format!("/v1/workspaces/{other_ws}/members/invitations"))
            .json(&json!({ "email": email, "role": "viewer" }))
            .send()
            .await
            .unwrap();
        let token =
            json_ok(invited).await["data"]["accept_url"].as_str().unwrap().rsplit('/').next().unwrap().to_owned();
        let res = browser().get(srv.url(&format!("/invitations/{token}"))).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let page = res.text().await.unwrap();
        // What differs by right: the address, the link and the form token.
        let page = page.replace(email, "EMAIL").replace(&token, "TOKEN");
        let page = match form_csrf(&page) {
            Some(t) => page.replace(&t, "CSRF"),
            None => page,
        };
        pages.push(page);
    }
    assert_eq!(pages[0], pages[1], "the page is the same for an address with an account and one without");
    srv.stop().await;
}

/// An assistant may end its own session at once; ending its person's other
/// sessions (the one they would reject its proposals from, say) is a
/// proposal like its writes.
async fn an_assistant_ends_its_own_session_but_only_proposes_ending_its_persons_others(backend: Backend) {
    let Some(srv) = TestServer::start(backend).await else { return };
    let mcp = create_token(&srv.state.store, EMAIL, Some("assistant"), None, ClientSource::Mcp)
        .await
        .unwrap()
        .expose_secret()
        .to_owned();
    let sessions = json_ok(srv.get("/v1/sessions").send().await.unwrap()).await;
    let id_of = |label: &str| {
        sessions["data"]["items"].as_array().unwrap().iter().find(|s| s["label"] == label).unwrap()["session_id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (approver, assistant) = (id_of("approver"), id_of("assistant"));
    let res =
        srv.request_as(&mcp, reqwest::Method::POST, &format!("/v1/sessions/{approver}/revoke")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::ACCEPTED, "a proposal, not a revocation");
    let proposal = json_ok(res).await;
    assert_eq!(proposal["data"]["approval"]["category"], "workspace_admin", "{proposal}");
    let me = srv.request_as(&srv.approver_token, reqwest::Method::GET, "/v1/me").send().await.unwrap();
    assert_eq!(me.status(), StatusCode::OK, "the person's session is still alive");
    let res =
        srv.request_as(&mcp, reqwest::Method::POST, &format!("/v1/sessions/{assistant}/revoke")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "its own session it ends at once");
    let me = srv.request_as(&mcp, reqwest::Method::GET, "/v1/me").send().await.unwrap();
    assert_eq!(me.status(), StatusCode::UNAUTHORIZED);
    srv.stop().await;
}
