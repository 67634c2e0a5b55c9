//! Rate budgets at the egress: before a request leaves, it takes a turn on
//! every budget it draws on (each credential it names, its host) and waits
//! for the latest; a `Retry-After` in the answer pauses those budgets for
//! every server. The budgets and their turns live in the control database
//! ([`crate::store::budgets`]); this side knows which requests draw on
//! which budget, from a listing read again at most every second.
//!
//! A request whose turn is further away than [`MAX_TURN_WAIT`] is not held
//! that long: it gives its turns back and the plugin gets a `429` with the
//! `Retry-After` of the turn, as from a provider that is rate limiting, so
//! the connector backs off as it does for one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{CredentialUse, EgressError, InboundResponse};
use crate::store::Store;
use crate::store::budgets::{BudgetSubject, now_us};

/// How long the listing of budgets is used before it is read again: a
/// budget an operator sets reaches every server's requests this soon.
const LISTING_FOR: Duration = Duration::from_secs(1);

/// The longest pause a provider's `Retry-After` puts on a budget.
const MAX_PAUSE: Duration = Duration::from_secs(3600);

/// The longest a request is held for its turn before the plugin is told
/// to come back later instead.
pub(crate) const MAX_TURN_WAIT: Duration = Duration::from_secs(60);

/// The budgets of one server's egress.
pub(crate) struct Budgets {
    store: Store,
    listing: Mutex<Option<(Instant, Arc<Listing>)>>,
    /// One reader of the listing at a time.
    reading: tokio::sync::Mutex<()>,
}

/// Which budget each credential handle and host draws on.
#[derive(Default)]
struct Listing {
    /// By handle: the credential's workspace and its budget.
    by_handle: HashMap<String, (String, BudgetSubject)>,
    by_host: HashMap<String, BudgetSubject>,
}

impl Listing {
    /// The budgets a request from `workspace` naming `credentials` to
    /// `host` draws on. A handle draws on its credential's budget only
    /// from the credential's own workspace: a plugin naming another
    /// workspace's handle (refused later, at the credential) cannot spend
    /// that workspace's turns.
    fn drawn(&self, workspace: &str, credentials: &[CredentialUse], host: &str) -> Vec<BudgetSubject> {
        credentials
            .iter()
            .filter_map(|c| self.by_handle.get(c.handle.as_str()))
            .filter(|(owner, _)| owner == workspace)
            .map(|(_, subject)| subject)
            .chain(self.by_host.get(host))
            .cloned()
            .collect()
    }
}

/// What a request's turn came to.
pub(crate) enum Turn {
    /// It may leave now, having drawn on these budgets.
    Go(Vec<BudgetSubject>),
    /// Its turn is too far away; the plugin is answered this instead.
    Held(InboundResponse),
}

impl Budgets {
    pub(crate) fn new(store: Store) -> Budgets {
        Budgets { store, listing: Mutex::new(None), reading: tokio::sync::Mutex::new(()) }
    }

    /// Waits for the turn of a request from `workspace` naming
    /// `credentials` to `host`.
    pub(crate) async fn turn(
        &self,
        workspace: &str,
        credentials: &[CredentialUse],
        host: &str,
    ) -> Result<Turn, EgressError> {
        let drawn = self.listing().await?.drawn(workspace, credentials, host);
        if drawn.is_empty() {
            return Ok(Turn::Go(drawn));
        }
        let now = now_us();
        let mut taken = Vec::with_capacity(drawn.len());
        let mut wait = Duration::ZERO;
        for subject in drawn {
            match self.store.take_turn(&subject, now).await {
                Ok(Some(w)) => {
                    wait = wait.max(w);
                    taken.push(subject);
                }
                // Removed since the listing was read.
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(budget = %subject, error = %e, "a rate budget's turn could not be taken");
                    self.give_back(&taken).await;
                    return Err(EgressError::ConnectionFailed(format!(
                        "the rate budget {subject} could not be read; the request was not sent"
                    )));
                }
            }
        }
        if wait > MAX_TURN_WAIT {
            self.give_back(&taken).await;
            for subject in &taken {
                metrics::counter!("egress_budget_held_total", "budget" => subject.to_string()).increment(1);
            }
            return Ok(Turn::Held(held(wait)));
        }
        for subject in &taken {
            let budget = subject.to_string();
            metrics::counter!("egress_budget_requests_total", "budget" => budget.clone()).increment(1);
            #[allow(clippy::cast_possible_truncation)]
            metrics::counter!("egress_budget_waited_milliseconds_total", "budget" => budget)
                .increment(wait.as_millis() as u64);
        }
        tokio::time::sleep(wait).await;
        Ok(Turn::Go(taken))
    }

    /// Pauses the budgets a request drew on when its answer asks to wait
    /// (a `429` or `503` with `Retry-After`): every server's next turn on
    /// them waits until then (at most [`MAX_PAUSE`]).
    pub(crate) async fn answered(&self, drawn: &[BudgetSubject], answer: &InboundResponse) {
        if drawn.is_empty() || !matches!(answer.status, 429 | 503) {
            return;
        }
        let Some(wait) = answer
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("retry-after"))
            .and_then(|(_, v)| connector_rules::retry_after::parse(v, std::time::SystemTime::now()))
        else {
            return;
        };
        let wait = wait.min(MAX_PAUSE);
        let until = now_us().saturating_add(i64::try_from(wait.as_micros()).unwrap_or(0));
        for subject in drawn {
            metrics::counter!("egress_budget_pauses_total", "budget" => subject.to_string()).increment(1);
            if let Err(e) = self.store.pause_budget(subject, until).await {
                tracing::warn!(budget = %subject, error = %e, "a provider's Retry-After could not be shared");
            }
        }
    }

    async fn give_back(&self, taken: &[BudgetSubject]) {
        for subject in taken {
            if let Err(e) = self.store.give_back_turn(subject).await {
                tracing::warn!(budget = %subject, error = %e, "a turn not used could not be given back");
            }
        }
    }

    /// The listing of budgets, read again when older than
    /// [`LISTING_FOR`]. When the database cannot be read, the last
    /// listing stands; with none yet, the request is not sent.
    async fn listing(&self) -> Result<Arc<Listing>, EgressError> {
        if let Some(listing) = self.current(true) {
            return Ok(listing);
        }
        let _one_reader = self.reading.lock().await;
        if let Some(listing) = self.current(true) {
            return Ok(listing);
        }
        match self.store.rate_budgets().await {
            Ok(budgets) => {
                let mut listing = Listing::default();
                for budget in budgets {
                    metrics::gauge!("egress_budget_requests_per_second", "budget" => budget.subject.to_string())
                        .set(budget.rate.per_second());
                    match (&budget.subject, budget.handle) {
                        (BudgetSubject::Credential(_), Some((handle, workspace))) => {
                            listing.by_handle.insert(handle.as_str().to_owned(), (workspace, budget.subject));
                        }
                        (BudgetSubject::Host(name), _) => {
                            listing.by_host.insert(name.clone(), budget.subject);
                        }
                        // A budget of a credential that no longer exists.
                        (BudgetSubject::Credential(_), None) => {}
                    }
                }
                let listing = Arc::new(listing);
                *self.listing.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), listing.clone()));
                Ok(listing)
            }
            Err(e) => {
                tracing::warn!(error = %e, "the rate budgets could not be read");
                self.current(false).ok_or_else(|| {
                    EgressError::ConnectionFailed("the rate budgets could not be read; the request was not sent".into())
                })
            }
        }
    }

    /// The listing held, if any (and, when `fresh`, only if recent).
    fn current(&self, fresh: bool) -> Option<Arc<Listing>> {
        let held = self.listing.lock().unwrap_or_else(|p| p.into_inner());
        held.as_ref().filter(|(at, _)| !fresh || at.elapsed() < LISTING_FOR).map(|(_, l)| l.clone())
    }
}

/// The answer to a request held back: a `429` whose `Retry-After` is when
/// its turn would have come.
fn held(wait: Duration) -> InboundResponse {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let body = serde_json::json!({
        "message": format!("held by the host: the rate budget this request draws on has no turn for {seconds} s"),
    });
    InboundResponse {
        status: 429,
        headers: vec![("retry-after".into(), seconds.to_string()), ("content-type".into(), "application/json".into())],
        body: body.to_string().into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::Placement;
    use crate::store::credentials::CredentialHandle;

    fn using(handle: &str) -> CredentialUse {
        CredentialUse { handle: CredentialHandle::new(handle), placement: Placement::Bearer }
    }

    #[test]
    fn a_request_draws_on_its_credentials_and_its_hosts_budgets_in_its_own_workspace_only() {
        let mine = BudgetSubject::Credential("crd_mine".into());
        let host = BudgetSubject::Host("api.example.com".into());
        let mut listing = Listing::default();
        listing.by_handle.insert("h_mine".into(), ("ws_a".into(), mine.clone()));
        listing.by_host.insert("api.example.com".into(), host.clone());
        assert_eq!(listing.drawn("ws_a", &[using("h_mine")], "api.example.com"), vec![mine.clone(), host.clone()]);
        assert_eq!(listing.drawn("ws_a", &[using("h_mine")], "api.other.com"), vec![mine]);
        assert_eq!(listing.drawn("ws_a", &[using("h_unbudgeted")], "api.other.com"), vec![]);
        // Another workspace naming the handle spends none of its turns.
        assert_eq!(listing.drawn("ws_b", &[using("h_mine")], "api.example.com"), vec![host]);
    }

    #[test]
    fn a_held_request_is_answered_429_with_the_turns_seconds_rounded_up() {
        let answer = held(Duration::from_millis(61_200));
        assert_eq!(answer.status, 429);
        assert!(answer.headers.contains(&("retry-after".into(), "62".into())));
    }
}
