//! The deliverer every server runs: it claims subscriptions with due
//! deliveries (a lease in the control database, so of N replicas one
//! sends a subscription's queue at a time), sends their deliveries oldest
//! first through egress, signs each, records every attempt, and on a
//! failure holds the subscription's queue until the retry (exponential
//! backoff with jitter, for the retry window) so order is kept.
//!
//! Fair between workspaces: one workspace's subscriptions hold at most
//! `SERVICE_WEBHOOK_SLOTS_PER_WORKSPACE` claims at once on all servers,
//! a claim is given back after a time slice, and claims go first to the
//! workspaces holding the fewest and the subscriptions served longest ago.
//!
//! Each event reaches each subscription at least once, in the order of
//! its events: the claim is renewed, and must still be live, before each
//! attempt, so a server that stalled past its lease sends nothing more;
//! an answer that came as the lease ran out is not recorded, and the next
//! holder sends that delivery again with the same `webhook-id`.

use std::time::{Duration, Instant};

use rand::Rng;
use tokio::task::JoinSet;

use super::signing::{SigningSecret, signature_header};
use crate::config::limits::WebhookLimits;
use crate::egress::{Caller, EgressError, HostPattern, Method, OutboundRequest, Reach};
use crate::retry::Transient;
use crate::state::AppState;
use crate::store::webhooks::{AttemptOutcome, AttemptRecord, Claim, DueDelivery, Head, Hold, WebhookTarget};
use crate::store::{StoreError, now_ms};

/// The egress caller name of webhook deliveries.
pub(crate) const CALLER: &str = "webhook-subscription";

/// How often a server looks for deliveries other servers queued.
const POLL: Duration = Duration::from_millis(500);

/// Subscriptions one server sends to at once.
const CONCURRENCY: usize = 8;

/// The longest error text kept per attempt.
const ERROR_CHARS: usize = 300;

/// How long a subscription whose queue could not be read is left alone.
const PAUSE_AFTER_ERROR_MS: i64 = 30_000;

/// Runs the deliverer until the task is aborted.
pub(crate) fn spawn(state: AppState) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut running = JoinSet::new();
        loop {
            while running.len() < CONCURRENCY {
                let limits = &state.config.limits.webhooks;
                match state.store.claim_webhook(lease_ms(limits), limits.slots_per_workspace).await {
                    Ok(Some(claim)) => {
                        let state = state.clone();
                        running.spawn(async move {
                            if let Err(e) = drain(&state, &claim).await {
                                tracing::warn!(webhook = %claim.webhook_id, error = %e, "webhook deliveries stopped");
                                let _ = state
                                    .store
                                    .release_webhook(&claim, Hold::Until(now_ms() + PAUSE_AFTER_ERROR_MS))
                                    .await;
                            }
                        });
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "could not claim webhook deliveries");
                        break;
                    }
                }
            }
            tokio::select! {
                _ = state.store.outbox_wait() => {}
                Some(_) = running.join_next(), if !running.is_empty() => {}
                _ = tokio::time::sleep(POLL) => {}
            }
        }
    })
}

fn lease_ms(limits: &WebhookLimits) -> i64 {
    i64::try_from(limits.lease.as_millis()).unwrap_or(i64::MAX)
}

/// Sends a claimed subscription's due deliveries, oldest first, until its
/// queue is empty, its head must wait for a retry, or the claim is lost.
async fn drain(state: &AppState, claim: &Claim) -> Result<(), StoreError> {
    let limits = &state.config.limits.webhooks;
    let webhook_id = &claim.webhook_id;
    let mut hold = Hold::Free;
    let turn = Instant::now();
    loop {
        // A turn ends after its time slice: the claim goes back, and the
        // least recently served subscriptions are claimed first.
        if turn.elapsed() >= limits.time_slice {
            break;
        }
        let Some(target) = state.store.webhook_target(webhook_id).await? else { return Ok(()) };
        if !target.enabled {
            break;
        }
        let due = match state.store.queue_head(webhook_id).await? {
            Head::Due(due) => due,
            Head::Waiting => {
                hold = Hold::UntilHeadIsDue;
                break;
            }
            Head::Empty => break,
        };
        if !state.store.renew_claim(claim, lease_ms(limits)).await? {
            // The lease ran out (this server stalled): whoever holds the
            // subscription now sends from here.
            return Ok(());
        }
        let attempted_at = now_ms();
        let started = Instant::now();
        let answer = send(state, &target, &due).await;
        let duration_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
        let (status_code, error) = match &answer {
            Ok(200..=299) => (answer.as_ref().ok().copied(), None),
            Ok(s) => (Some(*s), Some(format!("the receiver answered HTTP {s}"))),
            Err(e) => (None, Some(e.to_string().chars().take(ERROR_CHARS).collect::<String>())),
        };
        // A subscription that cannot be sent to as it is configured (its
        // URL, its signing secret, a host the policy refuses) ends the
        // delivery at once: waiting changes nothing.
        let permanent = answer.as_ref().is_err_and(|e| !e.is_transient());
        let outcome = if error.is_none() {
            AttemptOutcome::Delivered
        } else if permanent
            || now_ms() >= due.retry_from + i64::try_from(limits.retry_window.as_millis()).unwrap_or(i64::MAX)
        {
            AttemptOutcome::GivenUp
        } else {
            AttemptOutcome::RetryAt(now_ms() + backoff_ms(limits, due.failures + 1))
        };
        let record = AttemptRecord {
            delivery_id: &due.delivery_id,
            claim,
            retry_from: due.retry_from,
            attempted_at,
            duration_ms,
            status_code,
            error: error.as_deref(),
            outcome,
        };
        if !state.store.record_delivery_attempt(record, lease_ms(limits)).await? {
            // Another server holds the queue now; it sends from here.
            return Ok(());
        }
        if let AttemptOutcome::GivenUp = outcome {
            let why =
                if permanent { "its subscription cannot be sent to as configured" } else { "its retry window passed" };
            tracing::warn!(webhook = %webhook_id, delivery = %due.delivery_id, reason = why, "webhook delivery given up");
        }
    }
    state.store.release_webhook(claim, hold).await
}

/// The wait before attempt `n + 1` after `n` failed: one second doubled
/// each time up to the limit, then a random point in its upper half, so
/// receivers coming back are not met by every sender at once.
fn backoff_ms(limits: &WebhookLimits, failed: i64) -> i64 {
    let cap = i64::try_from(limits.max_backoff.as_millis()).unwrap_or(i64::MAX).max(1);
    let full = 1_000i64.saturating_mul(1i64 << (failed - 1).clamp(0, 30)).min(cap);
    rand::rng().random_range(full / 2..=full)
}

/// Why an attempt got no answer.
#[derive(Debug, thiserror::Error)]
enum SendError {
    #[error("the URL is invalid: {0}")]
    Url(String),
    #[error("the signing secret cannot be opened: {0}")]
    Secret(String),
    #[error("refused by the egress policy: {0}")]
    Refused(String),
    #[error(transparent)]
    Egress(EgressError),
}

impl Transient for SendError {
    /// A receiver that timed out or could not be reached may answer
    /// later; a subscription whose URL, secret or host cannot be used
    /// will not, until it is changed.
    fn is_transient(&self) -> bool {
        matches!(self, SendError::Egress(EgressError::Timeout | EgressError::ConnectionFailed(_)))
    }
}

/// One attempt: the event's body, signed, posted through egress (HTTPS,
/// an allowed host resolving to public addresses; a redirect is followed
/// only on the same host). Answers the HTTP status, or why none came.
async fn send(state: &AppState, target: &WebhookTarget, due: &DueDelivery) -> Result<u16, SendError> {
    let url = url::Url::parse(&target.url).map_err(|e| SendError::Url(e.to_string()))?;
    let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
    let declared = [HostPattern::parse(&host).map_err(|e| SendError::Url(format!("its host is invalid: {e}")))?];
    let mut secrets = Vec::with_capacity(2);
    for sealed in std::iter::once(&target.secret).chain(target.previous.as_ref()) {
        let bytes = state
            .vault
            .open_signing_secret(&target.webhook_id, &target.workspace_id, sealed)
            .map_err(|e| SendError::Secret(e.to_string()))?;
        secrets.push(SigningSecret::from_bytes(&bytes));
    }
    let timestamp = now_ms() / 1000;
    let body = due.payload.as_bytes().to_vec();
    let signature = signature_header(&secrets, &due.delivery_id, timestamp, &body);
    let request = OutboundRequest {
        method: Method::Post,
        url: target.url.clone(),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("webhook-id".into(), due.delivery_id.clone()),
            ("webhook-timestamp".into(), timestamp.to_string()),
            ("webhook-signature".into(), signature),
        ],
        body: Some(body),
        credentials: Vec::new(),
        timeout_ms: Some(u32::try_from(state.config.limits.webhooks.attempt_timeout.as_millis()).unwrap_or(u32::MAX)),
    };
    let caller = Caller {
        plugin_id: CALLER,
        declared_hosts: &declared,
        workspace_id: &target.workspace_id,
        reach: Reach::Receivers,
    };
    match state.egress.send(&caller, request).await {
        Ok(answer) => Ok(answer.status),
        Err(EgressError::Denied(rule)) => Err(SendError::Refused(rule)),
        Err(e) => Err(SendError::Egress(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_receiver_that_may_answer_later_is_tried_again() {
        assert!(SendError::Egress(EgressError::Timeout).is_transient());
        assert!(SendError::Egress(EgressError::ConnectionFailed("reset".into())).is_transient());
        for permanent in [
            SendError::Url("relative URL without a base".into()),
            SendError::Secret("cannot be opened".into()),
            SendError::Refused("host is not allowed".into()),
            SendError::Egress(EgressError::ResponseTooLarge),
        ] {
            assert!(!permanent.is_transient(), "{permanent}");
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_limit_with_jitter_in_its_upper_half() {
        let limits = WebhookLimits { max_backoff: Duration::from_secs(60), ..Default::default() };
        for _ in 0..50 {
            assert!((500..=1_000).contains(&backoff_ms(&limits, 1)));
            assert!((4_000..=8_000).contains(&backoff_ms(&limits, 4)));
            assert!((30_000..=60_000).contains(&backoff_ms(&limits, 12)));
            assert!((30_000..=60_000).contains(&backoff_ms(&limits, 400)));
        }
    }
}
