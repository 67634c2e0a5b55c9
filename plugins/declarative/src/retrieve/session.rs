//! Session tokens (`SessionTokenAuthenticator`): a login request sent
//! before a stream's request when its token is missing or expired — before
//! every request when the manifest gives no `expiration_duration`, as the
//! CDK logs in — and the token its answer holds, kept for the read. Such
//! a login sends no secret, so the token comes of nothing the guest may
//! not see; a login that sends one the host makes (a credential's `login`
//! exchange), and the guest sends no login at all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, FixedOffset, Utc};

use super::{Env, ReadError, Transport, build};
use crate::model::Stream;
use crate::model::request::{Authenticator, SessionLogin};

/// The tokens logins gave, by the login requester's pointer.
#[derive(Debug, Clone, Default)]
pub struct Sessions(Arc<Mutex<HashMap<String, Token>>>);

#[derive(Debug, Clone)]
struct Token {
    value: String,
    /// When it expires; none: good for one request.
    expires: Option<DateTime<FixedOffset>>,
}

impl Sessions {
    /// The token of the login at `pointer`, if one was given.
    pub(super) fn token(&self, pointer: &str) -> Option<String> {
        self.lock().get(pointer).map(|t| t.value.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Token>> {
        // A poisoned map still holds tokens: at worst one logs in again.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn fresh(&self, pointer: &str, now: DateTime<Utc>) -> bool {
        self.lock().get(pointer).and_then(|t| t.expires).is_some_and(|expires| expires >= now)
    }
}

/// Logs in for `stream`'s next request where its authenticator takes a
/// session token that is missing or expired.
pub(super) fn log_in(stream: &Stream, env: &Env, transport: &mut dyn Transport) -> Result<(), ReadError> {
    let Authenticator::Session(session) = &stream.retriever.requester.authenticator else { return Ok(()) };
    let now = transport.now();
    if session.expiration.is_some() && env.sessions.fresh(&session.login_pointer, now) {
        return Ok(());
    }
    // A login that sends a secret is the host's to make.
    let build::Login::ByGuest(request) = build::login(session, env)? else { return Ok(()) };
    let value = token(session, &request, env, transport)?;
    let expires = session.expiration.and_then(|gap| gap.after(&now.fixed_offset()));
    env.sessions.lock().insert(session.login_pointer.clone(), Token { value, expires });
    Ok(())
}

/// The token a login's answer holds at the manifest's path.
fn token(
    session: &SessionLogin,
    request: &super::Request,
    env: &Env,
    transport: &mut dyn Transport,
) -> Result<String, ReadError> {
    let Some(response) = super::send(&session.login.error_handler, request, None, env, transport)? else {
        return Err(ReadError::Invalid("the session login's answer was ignored by its error handler".into()));
    };
    let fault = |message: String| ReadError::Provider { status: response.status, url: request.url.clone(), message };
    let answer: serde_json::Value = serde_json::from_slice(&response.body)
        .map_err(|e| fault(format!("the session login's answer is not JSON: {e}")))?;
    // Keys into objects, indexes into lists, as dpath reads the path.
    let found = session.token_path.iter().try_fold(&answer, |at, key| match at {
        serde_json::Value::Array(items) => key.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => at.get(key),
    });
    let token = match found {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(v) if !v.is_null() => v.to_string(),
        _ => return Err(fault(format!("the session login's answer has no token at {}", session.token_path.join("/")))),
    };
    // A token that looks like a secret's marker would be read as one.
    if token.contains('\u{1}') {
        return Err(fault("the session login's token holds a control character".into()));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;
    use serde_json::json;

    use super::super::{Flow, Response, prepare, read};
    use super::*;
    use crate::interpolation::Val;

    /// A provider on a clock that moves four minutes a request: a login
    /// answers token `t-N`; a page answers when it carries the latest.
    struct Provider {
        now: DateTime<Utc>,
        logins: usize,
        sent: Vec<String>,
        /// What a login answers; none: `t-N`.
        token: Option<serde_json::Value>,
    }

    impl Transport for Provider {
        fn send(
            &mut self,
            request: &super::super::Request,
        ) -> Result<Response, Box<dyn std::error::Error + Send + Sync>> {
            self.now += TimeDelta::minutes(4);
            let answer = if request.url.ends_with("/login") {
                self.logins += 1;
                self.sent.push("login".into());
                let token = self.token.clone().unwrap_or_else(|| json!(format!("t-{}", self.logins)));
                json!({ "auth": [{ "token": token }] })
            } else {
                let carried = request.headers.iter().find(|(k, _)| k == "X-Session").map(|(_, v)| v.clone());
                let page: usize =
                    request.query.iter().find(|(k, _)| k == "page").map_or(1, |(_, v)| v.parse().unwrap());
                let fresh = carried == Some(format!("t-{}", self.logins));
                self.sent.push(format!("page {page}{}", if fresh { "" } else { " stale" }));
                json!({ "data": [{ "id": page }], "next": if page < 4 { json!(page + 1) } else { json!(null) } })
            };
            Ok(Response { status: 200, headers: Vec::new(), body: answer.to_string().into_bytes() })
        }
        fn wait(&mut self, _: f64) {}
        fn now(&self) -> DateTime<Utc> {
            self.now
        }
        fn monotonic(&self) -> std::time::Duration {
            std::time::Duration::ZERO
        }
    }

    fn manifest(expiration: Option<&str>) -> serde_json::Value {
        let mut auth = json!({ "type": "SessionTokenAuthenticator",
            "login_requester": { "type": "HttpRequester", "url_base": "https://api.example.com", "path": "/login" },
            "session_token_path": ["auth", "0", "token"],
            "request_authentication": { "type": "ApiKey",
                "inject_into": { "type": "RequestOption", "inject_into": "header", "field_name": "X-Session" } } });
        if let Some(e) = expiration {
            auth["expiration_duration"] = json!(e);
        }
        json!({ "streams": [{ "type": "DeclarativeStream", "name": "items",
            "retriever": { "type": "SimpleRetriever",
                "requester": { "type": "HttpRequester", "url_base": "https://api.example.com", "path": "/items",
                    "authenticator": auth },
                "record_selector": { "type": "RecordSelector",
                    "extractor": { "type": "DpathExtractor", "field_path": ["data"] } },
                "paginator": { "type": "DefaultPaginator",
                    "pagination_strategy": { "type": "CursorPagination", "cursor_value": "{{ response.next }}",
                        "stop_condition": "{{ not response.next }}" },
                    "page_token_option": { "type": "RequestOption", "inject_into": "request_parameter",
                        "field_name": "page" } } } }] })
    }

    fn read_all(expiration: Option<&str>, token: Option<serde_json::Value>) -> (Result<usize, ReadError>, Vec<String>) {
        let now: DateTime<Utc> = "2024-01-01T00:00:00Z".parse().unwrap();
        let m = manifest(expiration);
        let (source, env) = prepare(&m, &Val::from(&json!({})), &[], now).unwrap();
        let mut provider = Provider { now, logins: 0, sent: Vec::new(), token };
        let mut records = 0;
        let read = read(
            &source,
            &source.streams[0],
            &env,
            None,
            &mut provider,
            &mut |r| {
                records += r.len();
                Ok(Flow::More)
            },
            &mut |_| Ok(()),
        );
        (read.map(|_| records), provider.sent)
    }

    #[test]
    fn a_session_token_is_kept_until_it_expires_and_without_an_expiry_is_got_for_each_request() {
        // Fifteen minutes: a login, three pages four minutes apart, the
        // token expired, a login again.
        let (read, sent) = read_all(Some("PT15M"), None);
        assert_eq!(read.unwrap(), 4);
        assert_eq!(sent, ["login", "page 1", "page 2", "page 3", "login", "page 4"]);
        let (read, sent) = read_all(None, None);
        assert_eq!(read.unwrap(), 4);
        assert_eq!(sent, ["login", "page 1", "login", "page 2", "login", "page 3", "login", "page 4"]);
    }

    /// A login that sends a secret as its JSON body's password is the
    /// host's: the guest sends none, and each request carries the
    /// credential with what the host's login must be; as a check shows
    /// it, only its URL. Sent in any other form, it is refused.
    #[test]
    fn a_login_that_sends_a_secret_is_left_to_the_host() {
        use super::super::{Body, Credential, Place, first_requests};
        let now: DateTime<Utc> = "2024-01-01T00:00:00Z".parse().unwrap();
        // The manifest with `login`'s fields in its login requester and
        // `more` in its authenticator (a field of `requester` is the
        // stream requester's).
        let with = |login: serde_json::Value, more: serde_json::Value| {
            let mut m = manifest(Some("PT2H"));
            let requester = &mut m["streams"][0]["retriever"]["requester"];
            for (k, v) in more.as_object().unwrap() {
                match k.strip_prefix("requester.") {
                    Some(field) => requester[field] = v.clone(),
                    None => requester["authenticator"][k] = v.clone(),
                }
            }
            for (k, v) in login.as_object().unwrap() {
                requester["authenticator"]["login_requester"][k] = v.clone();
            }
            m
        };
        let with_login = |login: serde_json::Value| with(login, json!({}));
        let body = json!({ "user": "{{ config['user'] }}", "pass": "{{ config['password'] }}" });
        let m = with_login(json!({ "http_method": "POST", "request_body_json": body }));
        let config = Val::from(&json!({ "user": "ana" }));
        let (source, env) = prepare(&m, &config, &["/password".into()], now).unwrap();
        let firsts = first_requests(&source, &env);
        let login = firsts[0].1.as_ref().unwrap();
        let url = "https://api.example.com/login";
        assert_eq!((login.url.as_str(), &login.body, login.credentials.len()), (url, &Body::None, 0));
        let page = firsts[1].1.as_ref().unwrap();
        assert!(page.headers.iter().all(|(k, _)| k != "X-Session"), "{page:?}");
        let place = Place::SessionLogin {
            login_url: url.into(),
            username: "ana".into(),
            username_field: "user".into(),
            password_field: "pass".into(),
            token_pointer: "/auth/0/token".into(),
            header: Some("X-Session".into()),
            lifetime_secs: Some(7200),
        };
        assert_eq!(page.credentials, [Credential { pointer: "/password".into(), place }]);
        let mut provider = Provider { now, logins: 0, sent: Vec::new(), token: None };
        let read =
            read(&source, &source.streams[0], &env, None, &mut provider, &mut |_| Ok(Flow::More), &mut |_| Ok(()));
        assert!(read.is_ok());
        assert!(!provider.sent.contains(&"login".to_owned()), "{:?}", provider.sent);

        for (login, why) in [
            (json!({ "request_body_json": body }), "with a GET"),
            (
                json!({ "http_method": "POST", "request_parameters": { "pass": "{{ config['password'] }}" } }),
                "outside a JSON body's field",
            ),
            (
                json!({ "http_method": "POST", "request_body_json": { "user": "ana", "pass": "{{ config['password'] }}", "scope": "all" } }),
                "beside other fields",
            ),
            (
                json!({ "http_method": "POST", "request_body_json": body, "request_headers": { "X-Client": "1" } }),
                "headers of its own",
            ),
        ] {
            let (source, env) = prepare(&with_login(login), &config, &["/password".into()], now).unwrap();
            let refused = first_requests(&source, &env)[0].1.as_ref().unwrap_err().to_string();
            assert!(refused.contains(why), "{why}: {refused}");
        }

        // As a bearer token: no header named; the token's place and the
        // session's length are refused where they say what the host
        // cannot do, and a header the host fills is not the manifest's too.
        let posted = json!({ "http_method": "POST", "request_body_json": body });
        let (source, env) = prepare(
            &with(posted.clone(), json!({ "request_authentication": { "type": "Bearer" } })),
            &config,
            &["/password".into()],
            now,
        )
        .unwrap();
        let firsts = first_requests(&source, &env);
        let page = firsts[1].1.as_ref().unwrap();
        assert!(matches!(&page.credentials[0].place, Place::SessionLogin { header: None, .. }), "{page:?}");
        let authenticator = "/streams/0/retriever/requester/authenticator";
        let in_query = json!({ "request_authentication": { "type": "ApiKey",
            "inject_into": { "type": "RequestOption", "inject_into": "request_parameter", "field_name": "session" } } });
        for (more, at, why) in [
            (in_query, format!("refused at {authenticator}/request_authentication"), "not in a query or body"),
            (
                json!({ "expiration_duration": "P1M" }),
                format!("refused at {authenticator}/expiration_duration"),
                "weeks, days",
            ),
            (
                json!({ "requester.request_headers": { "x-session": "mine" } }),
                String::new(),
                "a request would send it twice",
            ),
        ] {
            let (source, env) = prepare(&with(posted.clone(), more), &config, &["/password".into()], now).unwrap();
            let refused = first_requests(&source, &env)
                .into_iter()
                .find_map(|(_, r)| r.err())
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(refused.contains(&at) && refused.contains(why), "{why}: {refused}");
        }
    }

    #[test]
    fn a_login_answer_without_a_usable_token_stops_the_read() {
        for (token, why) in
            [(json!(null), "no token at auth/0/token"), (json!("\u{1}secret0\u{1}"), "control character")]
        {
            let (read, sent) = read_all(None, Some(token));
            let error = read.unwrap_err().to_string();
            assert!(error.contains(why), "{error}");
            assert_eq!(sent, ["login"], "no page is asked with it");
        }
    }
}
