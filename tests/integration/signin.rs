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
    res.headers().get_all(SET_COOKIE).iter().filter_map(|v| v.to_str().ok()).find(|v| v.starts_with(&format!("{name}="))).map(str::to_owned)
}

fn value(line: &str) -> String {
    line.split(';').next().unwrap().split_once('=').unwrap().1.to_owned()
}

/// Opens the sign-in page; returns the CSRF token its cookie holds.
async fn csrf(srv: &TestServer, b: &Client) -> String {
    let res = b.get(format!("{}/sign-in?next=/account", srv.base)).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let line = set_cookie(&res, "service_csrf").expect("the form page sets its CSRF cookie");
    assert!(line.contains("HttpOnly") && line.contains("SameSite=Strict"), "{line}");
    let token = value(&line);
    let page = res.text().await.unwrap();
    assert!(page.contains(&format!("name=\"csrf\" value=\"{token}\"")), "the form carries the token");
    token
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
    let weak = service::access::admin::set_password(store, EMAIL, SecretString::from("too short")).await;
    assert!(weak.unwrap_err().to_string().contains("at least 12"));
    service::access::admin::set_password(store, EMAIL, SecretString::from(PASSWORD)).await.unwrap();
    let b = browser();
    let token = csrf(&srv, &b).await;

    // A form posted from elsewhere carries no matching token: nothing happens.
    for (cookie, field) in [(None, token.as_str()), (Some(token.as_str()), "forged"), (Some(token.as_str()), "")] {
        let res = post_sign_in(&srv, &b, cookie, &[("csrf", field), ("email", EMAIL), ("password", PASSWORD)]).await;
        assert_eq!(res.status(), StatusCode::FORBIDDEN);
        assert!(set_cookie(&res, "service_session").is_none(), "no session without the CSRF token");
    }

    // Wrong password, unknown account: one answer, the password never shown.
    for (email, password) in [(EMAIL, "not the passphrase at all"), ("nobody@example.test", PASSWORD)] {
        let res = post_sign_in(&srv, &b, Some(&token), &[("csrf", &token), ("email", email), ("password", password)]).await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        assert!(set_cookie(&res, "service_session").is_none());
        let page = res.text().await.unwrap();
        assert!(page.contains("do not match an account"), "{page}");
        assert!(!page.contains(password), "a typed password is never rendered back");
    }

    // The right one: a session cookie, and on to where the user was going,
    // never to another site.
    let res = post_sign_in(&srv, &b, Some(&token), &[("csrf", &token), ("email", " Admin@Example.TEST "), ("password", PASSWORD), ("next", "//evil.example/x")]).await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(res.headers()[LOCATION], "/account", "an off-site next is ignored");
    let line = set_cookie(&res, "service_session").expect("a session cookie");
    assert!(line.contains("HttpOnly") && line.contains("SameSite=Lax") && line.contains("Path=/"), "{line}");
    assert!(!line.contains("Secure"), "plain HTTP public URL: not Secure");
    let session = value(&line);
    let cookies = format!("service_session={session}; service_csrf={token}");
    let page = b.get(format!("{}/account", srv.base)).header("cookie", &cookies).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.text().await.unwrap().contains(EMAIL));
    let res = b.get(format!("{}/sign-in?next=/account", srv.base)).header("cookie", &cookies).send().await.unwrap();
    assert_eq!(res.headers()[LOCATION], "/account", "signed in already: straight on");

    // The browser session is a session like the others: listed, revocable.
    let listed = json_ok(srv.get("/v1/sessions").send().await.unwrap()).await;
    let web: Vec<&Value> = listed["data"]["items"].as_array().unwrap().iter().filter(|s| s["label"] == "web sign-in").collect();
    assert_eq!(web.len(), 1, "{listed}");

    // Signing out needs the form's token too; then the session is gone
    // everywhere, cookie and API alike.
    let res = b.post(format!("{}/sign-out", srv.base)).header("cookie", format!("service_session={session}")).form(&[("csrf", token.as_str())]).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let me = b.get(format!("{}/v1/me", srv.base)).bearer_auth(&session).send().await.unwrap();
    assert_eq!(me.status(), StatusCode::OK, "still signed in after a forged sign-out");
    let res = b.post(format!("{}/sign-out", srv.base)).header("cookie", &cookies).form(&[("csrf", token.as_str())]).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(set_cookie(&res, "service_session").unwrap().contains("Max-Age=0"));
    let me = b.get(format!("{}/v1/me", srv.base)).bearer_auth(&session).send().await.unwrap();
    assert_eq!(me.status(), StatusCode::UNAUTHORIZED);
    let res = b.get(format!("{}/account", srv.base)).header("cookie", &cookies).send().await.unwrap();
    assert_eq!(res.headers()[LOCATION], "/sign-in?next=/account");
}

/// A guesser gets ten tries at one account, then even the right password
/// waits; other accounts from the same address still sign in.
async fn failed_sign_ins_are_throttled_per_account(backend: Backend) {
    let Some(srv) = TestServer::start(backend).await else { return };
    let (victim, _) = srv.user_in(&srv.workspace_id().await, service::access::Role::Viewer).await;
    let victim_email = srv.state.store.user(&victim).await.unwrap().unwrap().email;
    service::access::admin::set_password(&srv.state.store, &victim_email, SecretString::from(PASSWORD)).await.unwrap();
    service::access::admin::set_password(&srv.state.store, EMAIL, SecretString::from(PASSWORD)).await.unwrap();
    let b = browser();
    let token = csrf(&srv, &b).await;
    for i in 0..10 {
        let res = post_sign_in(&srv, &b, Some(&token), &[("csrf", &token), ("email", &victim_email), ("password", &format!("guess number {i:04}"))]).await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    let res = post_sign_in(&srv, &b, Some(&token), &[("csrf", &token), ("email", &victim_email), ("password", PASSWORD)]).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().contains_key("retry-after"));
    assert!(set_cookie(&res, "service_session").is_none());
    let res = post_sign_in(&srv, &b, Some(&token), &[("csrf", &token), ("email", EMAIL), ("password", PASSWORD)]).await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER, "another account is not locked out");
}

on_both_backends!(a_returning_user_signs_in_with_a_password_and_out_again, failed_sign_ins_are_throttled_per_account);
