//! Web sign-in for returning users: passwords, the browser session cookie,
//! CSRF on every form, throttled failures and sign-out, attacked the way
//! a hostile page or a password guesser would.

use reqwest::header::{LOCATION, SET_COOKIE};
use reqwest::{Client, StatusCode};
use secrecy::SecretString;
use serde_json::Value;

use crate::on_both_backends;
use crate::support::{Backend, TestServer, json_ok};

const EMAIL: &str = "admin@example.test";
const PASSWORD: &str = "a passphrase long enough";

/// A browser without a cookie jar or redirects: the test carries cookies.
fn browser() -> Client {
    Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

/// The `Set-Cookie` line of cookie `name`, if the answer set it.
fn set_cookie(res: &reqwest::Response, name: &str) -> Option<String> {
    res.headers()
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(&format!("{name}=")))
        .map(str::to_owned)
}

fn value(line: &str) -> String {
    line.split(';').next().unwrap().split_once('=').unwrap().1.to_owned()
}

/// Opens the sign-in page; returns the pre-session id its CSRF cookie
/// holds and the token its form carries.
async fn csrf(srv: &TestServer, b: &Client) -> (String, String) {
    let res = b.get(format!("{}/sign-in?next=/account", srv.base)).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let line = set_cookie(&res, "service_csrf").expect("the form page sets its CSRF cookie");
    assert!(line.contains("HttpOnly") && line.contains("SameSite=Strict"), "{line}");
    let id = value(&line);
    let page = res.text().await.unwrap();
    let token = crate::support::form_csrf(&page).expect("the form carries a token");
    assert_ne!(token, id, "the token is bound to the cookie, not a copy of it");
    (id, token)
}

async fn post_sign_in(srv: &TestServer, b: &Client, cookie: Option<&str>, form: &[(&str, &str)]) -> reqwest::Response {
    let mut req = b.post(format!("{}/sign-in", srv.base)).form(form);
    if let Some(c) = cookie {
        req = req.header("cookie", format!("service_csrf={c}"));
    }
    req.send().await.unwrap()
}

async fn a_returning_user_signs_in_with_a_password_and_out_again(backend: Backend) {
    let Some(srv) = TestServer::start(backend).await else { return };
    let store = &srv.state.store;
    let weak = service::access::admin::set_password(
        store,
        EMAIL,
        SecretString::from("too short"),
        service::access::admin::OnPasswordChange::KeepSessions,
    )
    .await;
    assert!(weak.unwrap_err().to_string().contains("at least 12"));
    service::access::admin::set_password(
        store,
        EMAIL,
        SecretString::from(PASSWORD),
        service::access::admin::OnPasswordChange::KeepSessions,
    )
    .await
    .unwrap();
    let b = browser();
    let (id, token) = csrf(&srv, &b).await;

    // A form posted from elsewhere carries no matching token: nothing
    // happens; nor does a cookie and a token the client chose alike.
    let chosen = "a".repeat(43);
    for (cookie, field) in [
        (None, token.as_str()),
        (Some(id.as_str()), "forged"),
        (Some(id.as_str()), ""),
        (Some(chosen.as_str()), chosen.as_str()),
        (Some(token.as_str()), token.as_str()),
    ] {
        let res = post_sign_in(&srv, &b, cookie, &[("csrf", field), ("email", EMAIL), ("password", PASSWORD)]).await;
        assert_eq!(res.status(), StatusCode::FORBIDDEN);
        assert!(set_cookie(&res, "service_session").is_none(), "no session without the CSRF token");
    }

    // Wrong password, unknown account: one answer, the password never shown.
    for (email, password) in [(EMAIL, "not the passphrase at all"), ("nobody@example.test", PASSWORD)] {
        let res =
            post_sign_in(&srv, &b, Some(&id), &[("csrf", &token), ("email", email), ("password", password)]).await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        assert!(set_cookie(&res, "service_session").is_none());
        let page = res.text().await.unwrap();
        assert!(page.contains("do not match an account"), "{page}");
        assert!(!page.contains(password), "a typed password is never rendered back");
    }

    // The right one: a session cookie, and on to where the user was going,
    // never to another site.
    let res = post_sign_in(
        &srv,
        &b,
        Some(&id),
        &[("csrf", &token), ("email", " Admin@Example.TEST "), ("password", PASSWORD), ("next", "//evil.example/x")],
    )
    .await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(res.headers()[LOCATION], "/account", "an off-site next is ignored");
    let line = set_cookie(&res, "service_session").expect("a session cookie");
    assert!(line.contains("HttpOnly") && line.contains("SameSite=Lax") && line.contains("Path=/"), "{line}");
    assert!(!line.contains("Secure"), "plain HTTP public URL: not Secure");
    let session = value(&line);
    let cookies = format!("service_session={session}; service_csrf={id}");
    let page = b.get(format!("{}/account", srv.base)).header("cookie", &cookies).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.text().await.unwrap().contains(EMAIL));
    let res = b.get(format!("{}/sign-in?next=/account", srv.base)).header("cookie", &cookies).send().await.unwrap();
    assert_eq!(res.headers()[LOCATION], "/account", "signed in already: straight on");

    // The browser session is a session like the others: listed (as a web
    // session), revocable; but it opens pages only, never the API.
    let listed = json_ok(srv.get("/v1/sessions").send().await.unwrap()).await;
    let web: Vec<&Value> =
        listed["data"]["items"].as_array().unwrap().iter().filter(|s| s["label"] == "web sign-in").collect();
    assert_eq!(web.len(), 1, "{listed}");
    assert_eq!(web[0]["kind"], "web");
    let me = b.get(format!("{}/v1/me", srv.base)).bearer_auth(&session).send().await.unwrap();
    assert_eq!(me.status(), StatusCode::UNAUTHORIZED, "a web session is no API token");

    // Signing out needs the form's token too; then the session is gone.
    let res = b
        .post(format!("{}/sign-out", srv.base))
        .header("cookie", format!("service_session={session}"))
        .form(&[("csrf", token.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let res = b.get(format!("{}/account", srv.base)).header("cookie", &cookies).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "still signed in after a forged sign-out");
    let res = b
        .post(format!("{}/sign-out", srv.base))
        .header("cookie", &cookies)
        .form(&[("csrf", token.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(set_cookie(&res, "service_session").unwrap().contains("Max-Age=0"));
    let res = b.get(format!("{}/account", srv.base)).header("cookie", &cookies).send().await.unwrap();
    assert_eq!(res.headers()[LOCATION], "/sign-in?next=/account");
    let sessions = json_ok(srv.get("/v1/sessions?include_revoked=true").send().await.unwrap()).await;
    let web = sessions["data"]["items"].as_array().unwrap().iter().find(|s| s["label"] == "web sign-in").unwrap();
    assert!(web["revoked_at"].is_string(), "{web}");

    // Both were audited, with the address they came from.
    let audit = json_ok(srv.get("/v1/audit-logs").send().await.unwrap()).await;
    let items = audit["data"]["items"].as_array().unwrap();
    for (action, outcome) in [("web.sign_in", "succeeded"), ("web.sign_in", "denied"), ("web.sign_out", "succeeded")] {
        let found = items
            .iter()
            .find(|r| r["action"] == action && r["outcome"] == outcome)
            .unwrap_or_else(|| panic!("{action} {outcome}: {audit}"));
        assert_eq!(found["address"], "127.0.0.1", "{found}");
    }
}

/// A guesser gets ten tries at one account, then even the right password
/// waits; other accounts from the same address still sign in.
async fn failed_sign_ins_are_throttled_per_account(backend: Backend) {
    let Some(srv) = TestServer::start(backend).await else { return };
    let (victim, _) = srv.user_in(&srv.workspace_id().await, service::access::Role::Viewer).await;
    let victim_email = srv.state.store.user(&victim).await.unwrap().unwrap().email;
    service::access::admin::set_password(
        &srv.state.store,
        &victim_email,
        SecretString::from(PASSWORD),
        service::access::admin::OnPasswordChange::KeepSessions,
    )
    .await
    .unwrap();
    service::access::admin::set_password(
        &srv.state.store,
        EMAIL,
        SecretString::from(PASSWORD),
        service::access::admin::OnPasswordChange::KeepSessions,
    )
    .await
    .unwrap();
    let b = browser();
    let (id, token) = csrf(&srv, &b).await;
    for i in 0..10 {
        let res = post_sign_in(
            &srv,
            &b,
            Some(&id),
            &[("csrf", &token), ("email", &victim_email), ("password", &format!("guess number {i:04}"))],
        )
        .await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    let res =
        post_sign_in(&srv, &b, Some(&id), &[("csrf", &token), ("email", &victim_email), ("password", PASSWORD)]).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().contains_key("retry-after"));
    assert!(set_cookie(&res, "service_session").is_none());
    let res = post_sign_in(&srv, &b, Some(&id), &[("csrf", &token), ("email", EMAIL), ("password", PASSWORD)]).await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER, "another account is not locked out");
}

/// Signs `email` in on the web; returns the cookies of its browser and
/// the CSRF token its forms carry.
async fn signed_in(srv: &TestServer, email: &str) -> (String, String) {
    let b = browser();
    let (id, token) = csrf(srv, &b).await;
    let res = post_sign_in(srv, &b, Some(&id), &[("csrf", &token), ("email", email), ("password", PASSWORD)]).await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER, "{email} signs in");
    (format!("service_session={}; service_csrf={id}", value(&set_cookie(&res, "service_session").unwrap())), token)
}

/// The approvals page: a member who may decide sees what would run, who
/// proposed it and from which client, and approves (it runs once) or
/// rejects; a viewer sees no operation and cannot decide; a form posted
/// without its token does nothing.
async fn proposals_are_decided_on_the_approvals_page(backend: Backend) {
    let Some(srv) = TestServer::start(backend).await else { return };
    let ws = srv.workspace_id().await;
    let mut emails = Vec::new();
    for role in [service::access::Role::Administrator, service::access::Role::Viewer] {
        let (user_id, _) = srv.user_in(&ws, role).await;
        let email = srv.state.store.user(&user_id).await.unwrap().unwrap().email;
        service::access::admin::set_password(
            &srv.state.store,
            &email,
            SecretString::from(PASSWORD),
            service::access::admin::OnPasswordChange::KeepSessions,
        )
        .await
        .unwrap();
        emails.push((user_id, email));
    }
    let propose = |email: &str| {
        srv.post(
            &format!("/v1/workspaces/{ws}/members/invitations"),
            serde_json::json!({ "email": email, "role": "viewer" }),
        )
        .header("x-service-execution-mode", "proposal")
        .header("x-service-client", "cli")
    };
    let first = json_ok(propose("first-invitee@example.test").send().await.unwrap()).await;
    let first = first["data"]["approval"]["approval_id"].as_str().unwrap().to_owned();
    let second = json_ok(propose("second-invitee@example.test").send().await.unwrap()).await;
    let second = second["data"]["approval"]["approval_id"].as_str().unwrap().to_owned();
    let b = browser();
    let srv = &srv;
    let status_of = |id: String| async move {
        let listed = json_ok(srv.get("/v1/approvals").send().await.unwrap()).await;
        listed["data"]["items"].as_array().unwrap().iter().find(|a| a["approval_id"] == id.as_str()).unwrap()["status"]
            .as_str()
            .unwrap()
            .to_owned()
    };

    let res = b.get(format!("{}/approvals", srv.base)).send().await.unwrap();
    assert_eq!(res.headers()[LOCATION], "/sign-in?next=/approvals", "signed out: to the sign-in page");

    // A viewer: the proposals, not what they would run, and no decision.
    let (viewer, viewer_csrf) = signed_in(srv, &emails[1].1).await;
    let page =
        b.get(format!("{}/approvals", srv.base)).header("cookie", &viewer).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("first-invitee@example.test") || page.contains(&first), "{page}");
    assert!(!page.contains("Approve and run") && !page.contains("<pre>"), "no operation, no decision: {page}");
    let res = b
        .post(format!("{}/approvals/{first}/approve", srv.base))
        .header("cookie", &viewer)
        .form(&[("csrf", viewer_csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(status_of(first.clone()).await, "pending");

    // An administrator: what would run, by whom, from where; then decides.
    let (admin, admin_csrf) = signed_in(srv, &emails[0].1).await;
    let page =
        b.get(format!("{}/approvals", srv.base)).header("cookie", &admin).send().await.unwrap().text().await.unwrap();
    assert!(
        page.contains("first-invitee@example.test")
            && page.contains(EMAIL)
            && page.contains("from cli")
            && page.contains("Approve and run")
            && page.contains("<pre>"),
        "{page}"
    );
    let res = b
        .post(format!("{}/approvals/{first}/approve", srv.base))
        .header("cookie", format!("service_session={}", &admin[16..admin.find(';').unwrap()]))
        .form(&[("csrf", "forged")])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN, "no CSRF cookie, no decision");
    assert_eq!(status_of(first.clone()).await, "pending");
    let res = b
        .post(format!("{}/approvals/{first}/approve", srv.base))
        .header("cookie", &admin)
        .form(&[("csrf", admin_csrf.as_str()), ("workspace_id", ws.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.text().await.unwrap().contains("Approved"));
    assert_eq!(status_of(first.clone()).await, "executed");
    let res = b
        .post(format!("{}/approvals/{first}/approve", srv.base))
        .header("cookie", &admin)
        .form(&[("csrf", admin_csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT, "executed once");
    let res = b
        .post(format!("{}/approvals/{second}/reject", srv.base))
        .header("cookie", &admin)
        .form(&[("csrf", admin_csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(status_of(second).await, "rejected");
    // Another workspace's proposals are not reachable from this one.
    let (other_ws, other_token) = srv.other_workspace().await;
    let res =
        b.get(format!("{}/approvals?workspace_id={other_ws}", srv.base)).header("cookie", &admin).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND, "not a member there");
    let theirs = srv
        .request_as(&other_token, reqwest::Method::POST, &format!("/v1/workspaces/{other_ws}/members/invitations"))
        .json(&serde_json::json!({ "email": "theirs@example.test", "role": "viewer" }))
        .header("x-service-execution-mode", "proposal")
        .send()
        .await
        .unwrap();
    let theirs = json_ok(theirs).await["data"]["approval"]["approval_id"].as_str().unwrap().to_owned();
    for ws_field in [ws.as_str(), other_ws.as_str()] {
        let res = b
            .post(format!("{}/approvals/{theirs}/approve", srv.base))
            .header("cookie", &admin)
            .form(&[("csrf", admin_csrf.as_str()), ("workspace_id", ws_field)])
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "deciding in another workspace, named as {ws_field}");
    }
    let listed =
        json_ok(srv.request_as(&other_token, reqwest::Method::GET, "/v1/approvals").send().await.unwrap()).await;
    assert_eq!(listed["data"]["items"][0]["status"], "pending", "{listed}");

    // Audited with the member's browser session as the actor.
    let audit = json_ok(srv.get("/v1/audit-logs?action=approvals.approve").send().await.unwrap()).await;
    let record = audit["data"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["approval_id"] == first.as_str() && r["action"] == "approvals.approve")
        .cloned();
    assert_eq!(record.map(|r| r["actor_user_id"].clone()), Some(serde_json::json!(emails[0].0)), "{audit}");
}

on_both_backends!(
    a_returning_user_signs_in_with_a_password_and_out_again,
    failed_sign_ins_are_throttled_per_account,
    proposals_are_decided_on_the_approvals_page
);
