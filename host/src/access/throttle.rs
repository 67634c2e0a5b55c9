//! Request rate limits: per client address (before anything else, so a
//! flood costs a hash lookup), per session, and for failures: invalid
//! tokens per address and per token, failed web sign-ins per address and
//! per account; and the event streams one user holds open at once.
//!
//! A failure limit only ever refuses more failures: a valid token is let
//! through whatever its address did before, so a client that floods with
//! bogus tokens cannot lock out the people who share its address. Web
//! sign-ins reserve their attempt before the password is checked (and get
//! it back when it matches), so concurrent guesses cannot outrun the
//! limit, and at most [`PASSWORD_CHECKS`] Argon2 checks run at once.
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

    /// Gives back `cost` tokens taken earlier (never past the burst).
    fn refund(&self, key: &K, cost: f64) {
        if !self.rate.enabled() {
            return;
        }
        let shard = &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS];
        let mut map = shard.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((tokens, _)) = map.get_mut(key) {
            *tokens = (*tokens + cost).min(self.rate.burst);
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
    /// Invalid tokens by their hash: the same bad token tried again and
    /// again is refused even from many addresses.
    failures_by_token: Buckets<String>,
    by_session: Buckets<String>,
    sign_in_failures_by_account: Buckets<String>,
    /// Argon2 checks running at once (each holds 19 MiB).
    password_checks: tokio::sync::Semaphore,
    /// Open event streams by user.
    streams: std::sync::Arc<Mutex<HashMap<String, usize>>>,
}

/// Event streams (a job's Server-Sent Events) one user may hold open on
/// one server at once: enough for a person's tabs and a few scripts; a
/// client opening streams without end meets the limit, not the server's
/// memory.
pub const STREAMS_PER_USER: usize = 16;

/// Failed web sign-ins one account allows: ten, then one a minute.
const SIGN_IN_FAILURES_PER_ACCOUNT: Rate = Rate { per_second: 1.0 / 60.0, burst: 10.0 };

/// Password checks (Argon2id, 19 MiB each) one server runs at once; a
/// sign-in that finds them all busy is answered 429 rather than queued.
pub(crate) const PASSWORD_CHECKS: usize = 4;

impl Throttle {
    pub fn new(s: ThrottleSettings) -> Self {
        Throttle {
            by_address: Buckets::new(s.per_address),
            failures_by_address: Buckets::new(s.failures_per_address),
            failures_by_token: Buckets::new(s.failures_per_address),
            by_session: Buckets::new(s.per_session),
            sign_in_failures_by_account: Buckets::new(SIGN_IN_FAILURES_PER_ACCOUNT),
            password_checks: tokio::sync::Semaphore::new(PASSWORD_CHECKS),
            streams: Default::default(),
        }
    }

    /// A place for one more open event stream of `user_id`, held until
    /// the [`StreamSlot`] is dropped (the stream ends or its client goes).
    pub fn open_stream(&self, user_id: &str) -> Result<StreamSlot, Limited> {
        let mut open = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(user_id.to_owned()).or_insert(0);
        if *n >= STREAMS_PER_USER {
            return Err(Limited { what: "too many open event streams for this user", wait: Duration::from_secs(5) });
        }
        *n += 1;
        Ok(StreamSlot { streams: self.streams.clone(), user_id: user_id.to_owned() })
    }

    /// Counts a request from `address`.
    pub fn address(&self, address: IpAddr) -> Result<(), Limited> {
        self.by_address
            .take(&address, 1.0, Instant::now())
            .map_err(|wait| Limited { what: "too many requests from this address", wait })
    }

    /// Refuses `address` while it has used up its failures (one-time codes
    /// that did not match).
    pub(crate) fn failures_exhausted(&self, address: IpAddr) -> Result<(), Limited> {
        match self.failures_by_address.exhausted(&address, Instant::now()) {
            Some(wait) => Err(Limited { what: "too many failed attempts from this address", wait }),
            None => Ok(()),
        }
    }

    /// Counts a failed attempt of `address` (a code that did not match).
    pub fn failure(&self, address: IpAddr) {
        let _ = self.failures_by_address.take(&address, 1.0, Instant::now());
    }

    /// Counts a request whose token did not authenticate, against its
    /// address (when known) and the token; refused once either has used
    /// up its failures. Only ever called for a token that failed: a valid
    /// one never meets this limit.
    pub(crate) fn invalid_token(&self, address: Option<IpAddr>, token_hash: &str) -> Result<(), Limited> {
        let now = Instant::now();
        let by_address = address.map(|a| self.failures_by_address.take(&a, 1.0, now)).unwrap_or(Ok(()));
        let by_token = self.failures_by_token.take(&token_hash.to_owned(), 1.0, now);
        match (by_address, by_token) {
            (Err(wait), _) => Err(Limited { what: "too many requests with invalid tokens from this address", wait }),
            (_, Err(wait)) => Err(Limited { what: "too many requests with this invalid token", wait }),
            _ => Ok(()),
        }
    }

    /// Reserves one failed sign-in of `address` and of `account` before
    /// the password is checked, atomically for each: of many concurrent
    /// attempts no more than the limit get past this. The attempt is given
    /// back when the password matches ([`SignInAttempt::succeeded`]).
    pub(crate) fn sign_in_attempt(&self, address: IpAddr, account: &str) -> Result<SignInAttempt<'_>, Limited> {
        let now = Instant::now();
        self.failures_by_address
            .take(&address, 1.0, now)
            .map_err(|wait| Limited { what: "too many failed sign-ins from this address", wait })?;
        if let Err(wait) = self.sign_in_failures_by_account.take(&account.to_owned(), 1.0, now) {
            self.failures_by_address.refund(&address, 1.0);
            return Err(Limited { what: "too many failed sign-ins for this account", wait });
        }
        Ok(SignInAttempt { throttle: self, address, account: account.to_owned(), refunded: false })
    }

    /// A turn to check a password, when one is free.
    pub(crate) fn password_check(&self) -> Result<tokio::sync::SemaphorePermit<'_>, Limited> {
        self.password_checks
            .try_acquire()
            .map_err(|_| Limited { what: "too many sign-ins at once", wait: Duration::from_secs(1) })
    }

    /// Counts a request of a session.
    pub fn session(&self, session_id: &str) -> Result<(), Limited> {
        self.by_session
            .take(&session_id.to_owned(), 1.0, Instant::now())
            .map_err(|wait| Limited { what: "too many requests with this token", wait })
    }
}

/// One open event stream, counted against its user until dropped.
pub struct StreamSlot {
    streams: std::sync::Arc<Mutex<HashMap<String, usize>>>,
    user_id: String,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.user_id) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.user_id);
            }
        }
    }
}

/// A sign-in attempt reserved against its limits: spent unless it
/// [`succeeded`](SignInAttempt::succeeded) or was [`abandoned`](SignInAttempt::abandoned).
pub(crate) struct SignInAttempt<'a> {
    throttle: &'a Throttle,
    address: IpAddr,
    account: String,
    refunded: bool,
}

impl SignInAttempt<'_> {
    /// The password matched: the attempt is not a failure.
    pub(crate) fn succeeded(mut self) {
        self.refund();
    }

    /// No password was checked (the server was busy): nothing is counted.
    pub(crate) fn abandoned(mut self) {
        self.refund();
    }

    fn refund(&mut self) {
        if !self.refunded {
            self.refunded = true;
            self.throttle.failures_by_address.refund(&self.address, 1.0);
            self.throttle.sign_in_failures_by_account.refund(&self.account, 1.0);
        }
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
        let mut response = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "RATE_LIMITED",
            format!("{}; retry after {seconds} s", self.what),
        )
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
    fn a_user_holds_a_bounded_number_of_streams_and_gets_them_back() {
        let t = Throttle::new(ThrottleSettings::default());
        let held: Vec<_> = (0..STREAMS_PER_USER).map(|_| t.open_stream("u1").expect("within the limit")).collect();
        assert!(t.open_stream("u1").is_err(), "one more is refused");
        assert!(t.open_stream("u2").is_ok(), "another user has room");
        drop(held);
        assert!(t.open_stream("u1").is_ok(), "closed streams are given back");
        assert!(t.streams.lock().unwrap().is_empty(), "nothing is kept for users with no stream open");
    }

    #[test]
    fn sign_in_attempts_are_reserved_before_the_check_and_refunded_on_success() {
        let t = Throttle::new(ThrottleSettings {
            failures_per_address: Rate { per_second: 0.001, burst: 30.0 },
            ..Default::default()
        });
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let held: Vec<_> =
            (0..10).map(|_| t.sign_in_attempt(ip, "a@example.test").expect("within the account's ten")).collect();
        assert!(
            t.sign_in_attempt(ip, "a@example.test").is_err(),
            "the eleventh concurrent attempt is refused before any check"
        );
        assert!(t.sign_in_attempt(ip, "b@example.test").is_ok(), "another account still has room");
        for attempt in held {
            attempt.succeeded();
        }
        assert!(t.sign_in_attempt(ip, "a@example.test").is_ok(), "successes are given back");
    }

    #[test]
    fn invalid_tokens_are_counted_per_address_and_per_token() {
        let t = Throttle::new(ThrottleSettings {
            failures_per_address: Rate { per_second: 0.001, burst: 3.0 },
            ..Default::default()
        });
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        for i in 0..3 {
            assert!(t.invalid_token(Some(a), &format!("h{i}")).is_ok());
        }
        assert!(t.invalid_token(Some(a), "h9").is_err(), "the address has used up its failures");
        assert!(t.invalid_token(Some(b), "h0").is_ok());
        assert!(t.invalid_token(Some(b), "h0").is_ok());
        assert!(t.invalid_token(Some(b), "h0").is_err(), "the same bad token from elsewhere runs out too");
    }

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
        b.refund(&2, 5.0);
        assert!(b.take(&2, 3.0, t0).is_ok(), "a refund never passes the burst");
        assert!(b.take(&2, 1.0, t0).is_err());
        let off: Buckets<u8> = Buckets::new(Rate::OFF);
        for _ in 0..1000 {
            assert!(off.take(&1, 1.0, t0).is_ok());
        }
    }
}
