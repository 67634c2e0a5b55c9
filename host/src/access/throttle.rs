//! Request rate limits: per client address (before anything else, so a
//! flood costs a hash lookup), per address for failed sign-ins (so guessing
//! tokens costs the guesser, not the database), and per session.
//!
//! Token buckets in memory, per server: with several replicas each keeps
//! its own, which bounds a client by the sum (the operator sizes the
//! limits accordingly). A refused request answers 429 `RATE_LIMITED` with
//! `Retry-After`.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::config::limits::{Rate, ThrottleSettings};
use crate::error::ApiError;

/// Buckets kept before idle ones are dropped.
const MAX_BUCKETS_PER_SHARD: usize = 4096;
const SHARDS: usize = 16;

/// Token buckets by key, sharded so concurrent requests rarely wait on
/// one lock.
struct Buckets<K> {
    rate: Rate,
    shards: Vec<Mutex<HashMap<K, (f64, Instant)>>>,
    hasher: std::collections::hash_map::RandomState,
}

impl<K: Hash + Eq + Clone> Buckets<K> {
    fn new(rate: Rate) -> Self {
        Buckets { rate, shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(), hasher: Default::default() }
    }

    /// Takes `cost` tokens; when there are not enough, how long until there
    /// are.
    fn take(&self, key: &K, cost: f64, now: Instant) -> Result<(), Duration> {
        if !self.rate.enabled() {
            return Ok(());
        }
        let shard = &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS];
        let mut map = shard.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_BUCKETS_PER_SHARD && !map.contains_key(key) {
            // Drop the buckets that have refilled: they hold no state worth
            // keeping.
            let (rate, burst) = (self.rate.per_second, self.rate.burst);
            map.retain(|_, (tokens, at)| *tokens + now.duration_since(*at).as_secs_f64() * rate < burst);
        }
        let (tokens, at) = map.entry(key.clone()).or_insert((self.rate.burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * self.rate.per_second).min(self.rate.burst);
        *at = now;
        if *tokens >= cost {
            *tokens -= cost;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((cost - *tokens) / self.rate.per_second))
        }
    }

    /// Whether a bucket is empty, without taking from it.
    fn exhausted(&self, key: &K, now: Instant) -> Option<Duration> {
        if !self.rate.enabled() {
            return None;
        }
        let shard = &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS];
        let map = shard.lock().unwrap_or_else(|p| p.into_inner());
        let (tokens, at) = map.get(key)?;
        let tokens = (tokens + now.duration_since(*at).as_secs_f64() * self.rate.per_second).min(self.rate.burst);
        (tokens < 1.0).then(|| Duration::from_secs_f64((1.0 - tokens) / self.rate.per_second))
    }
}

/// The server's rate limits.
pub struct Throttle {
    by_address: Buckets<IpAddr>,
    failures_by_address: Buckets<IpAddr>,
    by_session: Buckets<String>,
    sign_in_failures_by_account: Buckets<String>,
}

/// Failed web sign-ins one account allows: ten, then one a minute.
const SIGN_IN_FAILURES_PER_ACCOUNT: Rate = Rate { per_second: 1.0 / 60.0, burst: 10.0 };

impl Throttle {
    pub fn new(s: ThrottleSettings) -> Self {
        Throttle {
            by_address: Buckets::new(s.per_address),
            failures_by_address: Buckets::new(s.failures_per_address),
            by_session: Buckets::new(s.per_session),
            sign_in_failures_by_account: Buckets::new(SIGN_IN_FAILURES_PER_ACCOUNT),
        }
    }

    /// Counts a request from `address`.
    pub fn address(&self, address: IpAddr) -> Result<(), Limited> {
        self.by_address.take(&address, 1.0, Instant::now()).map_err(|wait| Limited { what: "too many requests from this address", wait })
    }

    /// Refuses `address` while it has used up its failed sign-ins, before
    /// the token is even looked up.
    pub fn failures_exhausted(&self, address: IpAddr) -> Result<(), Limited> {
        match self.failures_by_address.exhausted(&address, Instant::now()) {
            Some(wait) => Err(Limited { what: "too many requests with invalid tokens from this address", wait }),
            None => Ok(()),
        }
    }

    /// Counts a request with a token that did not authenticate.
    pub fn failure(&self, address: IpAddr) {
        let _ = self.failures_by_address.take(&address, 1.0, Instant::now());
    }

    /// Refuses a web sign-in while its address has used up its failed
    /// attempts (shared with invalid tokens) or its account has.
    pub fn sign_in_exhausted(&self, address: IpAddr, account: &str) -> Result<(), Limited> {
        self.failures_exhausted(address)?;
        match self.sign_in_failures_by_account.exhausted(&account.to_owned(), Instant::now()) {
            Some(wait) => Err(Limited { what: "too many failed sign-ins for this account", wait }),
            None => Ok(()),
        }
    }

    /// Counts a failed web sign-in against its address and its account.
    pub fn sign_in_failure(&self, address: IpAddr, account: &str) {
        self.failure(address);
        let _ = self.sign_in_failures_by_account.take(&account.to_owned(), 1.0, Instant::now());
    }

    /// Counts a request of a session.
    pub fn session(&self, session_id: &str) -> Result<(), Limited> {
        self.by_session.take(&session_id.to_owned(), 1.0, Instant::now()).map_err(|wait| Limited { what: "too many requests with this token", wait })
    }
}

/// A refused request: which limit, and how long until it has room.
#[derive(Debug, Clone, Copy)]
pub struct Limited {
    what: &'static str,
    wait: Duration,
}

impl Limited {
    /// Whole seconds until there is room again, at least one.
    pub fn seconds(&self) -> u64 {
        self.wait.as_secs_f64().ceil().max(1.0) as u64
    }
}

/// 429 `RATE_LIMITED` with `Retry-After` (whole seconds, at least one).
impl IntoResponse for Limited {
    fn into_response(self) -> Response {
        let seconds = self.wait.as_secs_f64().ceil().max(1.0) as u64;
        let mut response = ApiError::new(StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED", format!("{}; retry after {seconds} s", self.what))
            .with_details(json!({ "retry_after_seconds": seconds }))
            .into_response();
        if let Ok(v) = HeaderValue::from_str(&seconds.to_string()) {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, v);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refills_at_its_rate_and_caps_at_its_burst() {
        let b: Buckets<u8> = Buckets::new(Rate { per_second: 10.0, burst: 3.0 });
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(b.take(&1, 1.0, t0).is_ok());
        }
        let wait = b.take(&1, 1.0, t0).unwrap_err();
        assert!(wait <= Duration::from_millis(100), "{wait:?}");
        assert!(b.take(&2, 1.0, t0).is_ok(), "keys are independent");
        assert!(b.take(&1, 1.0, t0 + Duration::from_millis(150)).is_ok(), "refilled");
        assert!(b.take(&1, 1.0, t0 + Duration::from_secs(60)).is_ok());
        assert!(b.take(&1, 3.0, t0 + Duration::from_secs(60)).is_err(), "never more than the burst");
        let off: Buckets<u8> = Buckets::new(Rate::OFF);
        for _ in 0..1000 {
            assert!(off.take(&1, 1.0, t0).is_ok());
        }
    }
}
