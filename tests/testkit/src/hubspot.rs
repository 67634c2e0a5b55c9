//! A fake of the social-media source's provider, speaking HubSpot's
//! protocol over HTTPS: the OAuth token endpoint (authorization code with
//! PKCE, refresh; camel-case answers with `hubId` and `userId`), the
//! account details, brands (business units) per user, channels that belong
//! to brands, and published broadcasts paged by `count`/`offset` and
//! filtered by `since`. It can answer 429 with `Retry-After` and let an
//! access token expire after a number of requests, answering 401 with
//! HubSpot's `EXPIRED_AUTHENTICATION` as the real provider does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

pub const PORTAL: u64 = 62515;
pub const USER: u64 = 77;
pub const CLIENT_ID: &str = "social-client";
pub const CLIENT_SECRET: &str = "social-operator-secret";

/// A connected channel and the brand it belongs to.
#[derive(Clone)]
pub struct Channel {
    pub guid: &'static str,
    pub brand: &'static str,
    pub name: Option<&'static str>,
    pub account_type: &'static str,
}

/// Brands the user can access: Retail and Travel. Brand 301 exists in
/// another portal only.
pub const BRANDS: [(&str, &str); 2] = [("101", "Acme Retail"), ("102", "Acme Travel")];

pub fn channels() -> Vec<Channel> {
    vec![
        Channel { guid: "ch-retail-fb", brand: "101", name: Some("Acme Retail"), account_type: "FacebookPage" },
        Channel { guid: "ch-retail-li", brand: "101", name: None, account_type: "LinkedInCompanyPage" },
        Channel { guid: "ch-travel-x", brand: "102", name: Some("Acme Travel"), account_type: "Twitter" },
    ]
}

#[derive(Default)]
pub struct Hub {
    /// code → (PKCE challenge, redirect_uri)
    pub codes: Mutex<HashMap<String, (String, String)>>,
    /// access token → requests it may still serve (None: unlimited)
    pub access: Mutex<HashMap<String, Option<usize>>>,
    pub refresh: Mutex<Vec<String>>,
    pub issued: AtomicUsize,
    pub refreshed: AtomicUsize,
    /// Requests each new access token serves before it expires (0: no limit).
    pub token_budget: AtomicUsize,
    /// How many of the next API requests answer 429.
    pub throttle_next: AtomicUsize,
    pub throttled: AtomicUsize,
    pub expired_answers: AtomicUsize,
    /// Published broadcasts (the provider's objects).
    pub broadcasts: Mutex<Vec<Value>>,
    /// `since` values the broadcasts listing was asked for.
    pub since_seen: Mutex<Vec<Option<i64>>>,
    /// Milliseconds each page of the broadcasts listing waits.
    pub page_delay_ms: std::sync::atomic::AtomicU64,
}

impl Hub {
    pub fn new() -> Arc<Hub> {
        let hub = Hub::default();
        for (i, c) in channels().iter().enumerate() {
            for n in 0..(120 + i * 10) {
                hub.broadcasts.lock().unwrap().push(broadcast(c, 1_700_000_000_000 + (n as i64) * 60_000 + i as i64));
            }
        }
        Arc::new(hub)
    }

    /// Publishes `n` more posts on `channel`, created after every other.
    pub fn publish(&self, channel: &str, n: usize) {
        let c = channels().into_iter().find(|c| c.guid == channel).unwrap();
        let mut all = self.broadcasts.lock().unwrap();
        let newest = all.iter().filter_map(|b| b["createdAt"].as_i64()).max().unwrap_or(0);
        for i in 0..n {
            all.push(broadcast(&c, newest + 1_000 + i as i64));
        }
    }

    pub fn published_on(&self, channels: &[&str]) -> usize {
        self.broadcasts
            .lock()
            .unwrap()
            .iter()
            .filter(|b| channels.contains(&b["channelGuid"].as_str().unwrap()))
            .count()
    }

    fn issue(&self) -> Value {
        let n = self.issued.fetch_add(1, Ordering::SeqCst);
        let at = format!("hub-access-{n}-{}", uuid::Uuid::new_v4().simple());
        let rt = format!("hub-refresh-{n}-{}", uuid::Uuid::new_v4().simple());
        let budget = match self.token_budget.load(Ordering::SeqCst) {
            0 => None,
            b => Some(b),
        };
        self.access.lock().unwrap().insert(at.clone(), budget);
        self.refresh.lock().unwrap().push(rt.clone());
        // The newer reference's camel case, with the account ids.
        json!({ "accessToken": at, "refreshToken": rt, "expiresIn": 1800, "tokenType": "bearer", "hubId": PORTAL, "userId": USER,
                "scopes": ["oauth", "social", "business_units_view.read"] })
    }

    /// Every access token and refresh token handed out.
    pub fn tokens(&self) -> Vec<String> {
        let mut t: Vec<String> = self.access.lock().unwrap().keys().cloned().collect();
        t.extend(self.refresh.lock().unwrap().iter().cloned());
        t
    }

    /// Checks the bearer token; `None` means the request may proceed.
    pub fn refuse(&self, h: &HeaderMap) -> Option<Response> {
        if self.throttle_next.load(Ordering::SeqCst) > 0 {
            self.throttle_next.fetch_sub(1, Ordering::SeqCst);
            self.throttled.fetch_add(1, Ordering::SeqCst);
            return Some((StatusCode::TOO_MANY_REQUESTS, [("retry-after", "0")], axum::Json(json!({ "status": "error", "message": "You have reached your ten_secondly_rolling limit.", "category": "RATE_LIMITS" }))).into_response());
        }
        let token = h
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("")
            .to_owned();
        let mut access = self.access.lock().unwrap();
        match access.get_mut(&token) {
            None => Some((StatusCode::UNAUTHORIZED, axum::Json(json!({ "status": "error", "message": "Authentication credentials not found.", "category": "INVALID_AUTHENTICATION" }))).into_response()),
            Some(Some(0)) => {
                self.expired_answers.fetch_add(1, Ordering::SeqCst);
                Some((StatusCode::UNAUTHORIZED, axum::Json(json!({ "status": "error", "message": "The OAuth token used to make this call expired 1 second(s) ago.", "category": "EXPIRED_AUTHENTICATION" }))).into_response())
            }
            Some(Some(left)) => {
                *left -= 1;
                None
            }
            Some(None) => None,
        }
    }
}

fn broadcast(c: &Channel, created: i64) -> Value {
    let guid = format!("bc-{}-{created}", c.guid);
    let n = created / 60_000 % 97;
    json!({
        "broadcastGuid": guid, "channelGuid": c.guid, "channelKey": format!("{}:{}", c.account_type, c.guid), "portalId": PORTAL,
        "status": "SUCCESS", "createdAt": created, "triggerAt": created + 500, "finishedAt": created + 900,
        "content": { "body": format!("Post {n} \u{1F680} on {}", c.guid), "linkUrl": "https://acme.example/p" },
        "message": null, "clicks": n,
        "interactionCounts": { "impressions": n * 10, "likes": n % 7, "comments": n % 3 },
        "createdBy": 123456, "campaignGuid": "internal-campaign"
    })
}

type Q = Query<HashMap<String, String>>;

/// The whole provider: [`account_router`] and the published broadcasts.
pub fn router(hub: Arc<Hub>) -> Router {
    account_router(hub.clone()).merge(broadcasts_router(hub))
}

/// Everything but the broadcasts listing: the token endpoint, the account,
/// brands and channels (a benchmark answers broadcasts from pre-rendered
/// pages of its own).
pub fn account_router(hub: Arc<Hub>) -> Router {
    Router::new()
        .route(
            "/oauth/v1/token",
            post(|State(h): State<Arc<Hub>>, axum::Form(f): axum::Form<HashMap<String, String>>| async move {
                if f.get("client_id").map(String::as_str) != Some(CLIENT_ID) || f.get("client_secret").map(String::as_str) != Some(CLIENT_SECRET) {
                    return (StatusCode::BAD_REQUEST, axum::Json(json!({ "status": "BAD_CLIENT_ID", "message": "missing or unknown client id" }))).into_response();
                }
                match f.get("grant_type").map(String::as_str) {
                    Some("authorization_code") => {
                        let code = f.get("code").cloned().unwrap_or_default();
                        let Some((challenge, redirect)) = h.codes.lock().unwrap().remove(&code) else {
                            return (StatusCode::BAD_REQUEST, axum::Json(json!({ "status": "BAD_AUTH_CODE", "message": "auth code not found" }))).into_response();
                        };
                        let verifier = f.get("code_verifier").cloned().unwrap_or_default();
                        if URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes())) != challenge || f.get("redirect_uri") != Some(&redirect) {
                            return (StatusCode::BAD_REQUEST, axum::Json(json!({ "status": "BAD_AUTH_CODE", "message": "code verifier or redirect does not match" }))).into_response();
                        }
                        axum::Json(h.issue()).into_response()
                    }
                    Some("refresh_token") => {
                        if !h.refresh.lock().unwrap().contains(f.get("refresh_token").unwrap_or(&String::new())) {
                            return (StatusCode::BAD_REQUEST, axum::Json(json!({ "status": "BAD_REFRESH_TOKEN", "message": "unknown refresh token" }))).into_response();
                        }
                        h.refreshed.fetch_add(1, Ordering::SeqCst);
                        axum::Json(h.issue()).into_response()
                    }
                    _ => (StatusCode::BAD_REQUEST, axum::Json(json!({ "status": "BAD_GRANT_TYPE" }))).into_response(),
                }
            }),
        )
        .route(
            "/account-info/v3/details",
            get(|State(h): State<Arc<Hub>>, hd: HeaderMap| async move {
                if let Some(r) = h.refuse(&hd) {
                    return r;
                }
                axum::Json(json!({ "portalId": PORTAL, "accountType": "STANDARD", "timeZone": "Europe/Berlin", "companyCurrency": "EUR", "uiDomain": "app-eu1.hubspot.com", "dataHostingLocation": "eu1" })).into_response()
            }),
        )
        .route(
            "/business-units/v3/business-units/user/{user}",
            get(|State(h): State<Arc<Hub>>, hd: HeaderMap, Path(user): Path<String>| async move {
                if let Some(r) = h.refuse(&hd) {
                    return r;
                }
                let results: Vec<Value> = if user == USER.to_string() {
                    BRANDS.iter().map(|(id, name)| json!({ "id": id, "name": name, "logoMetadata": { "logoUrl": "https://cdn.example/logo.png" } })).collect()
                } else {
                    Vec::new()
                };
                axum::Json(json!({ "results": results })).into_response()
            }),
        )
        .route(
            "/broadcast/v1/channels/setting/publish/current",
            get(|State(h): State<Arc<Hub>>, hd: HeaderMap| async move {
                if let Some(r) = h.refuse(&hd) {
                    return r;
                }
                let list: Vec<Value> = channels()
                    .iter()
                    .map(|c| json!({ "channelGuid": c.guid, "channelKey": format!("{}:{}", c.account_type, c.guid), "accountType": c.account_type,
                        "name": c.name, "displayName": c.name, "active": true, "portalId": PORTAL, "businessUnitId": c.brand.parse::<u64>().unwrap(),
                        "dataMap": { "pageAccessToken": "not-for-customers" } }))
                    .collect();
                axum::Json(Value::Array(list)).into_response()
            }),
        )
        .with_state(hub)
}

fn broadcasts_router(hub: Arc<Hub>) -> Router {
    Router::new()
        .route(
            "/broadcast/v1/broadcasts",
            get(|State(h): State<Arc<Hub>>, hd: HeaderMap, Query(q): Q| async move {
                if let Some(r) = h.refuse(&hd) {
                    return r;
                }
                let delay = h.page_delay_ms.load(Ordering::SeqCst);
                if delay > 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                }
                let count: usize = q.get("count").and_then(|c| c.parse().ok()).unwrap_or(250).min(500);
                let offset: usize = q.get("offset").and_then(|c| c.parse().ok()).unwrap_or(0);
                let since: Option<i64> = q.get("since").and_then(|s| s.parse().ok());
                h.since_seen.lock().unwrap().push(since);
                let wanted = q.get("status").map(|s| s.to_ascii_uppercase());
                let all = h.broadcasts.lock().unwrap();
                // Newest first, as the provider lists them.
                let mut matching: Vec<&Value> = all
                    .iter()
                    .filter(|b| wanted.as_deref().is_none_or(|w| b["status"] == w))
                    .filter(|b| since.is_none_or(|s| b["createdAt"].as_i64().unwrap() >= s))
                    .collect();
                matching.sort_by_key(|b| std::cmp::Reverse(b["createdAt"].as_i64().unwrap()));
                let page: Vec<Value> = matching.into_iter().skip(offset).take(count).cloned().collect();
                axum::Json(Value::Array(page)).into_response()
            }),
        )
        .with_state(hub)
}
