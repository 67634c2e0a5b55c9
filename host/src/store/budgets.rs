//! Provider rate budgets shared by every server on the control database.
//!
//! A budget limits the requests that name one credential, or every request
//! to one provider host, to a rate with a burst. Each request takes a turn
//! ([`Store::take_turn`]): one `UPDATE … RETURNING` moves the budget's
//! `next_at` (the generic cell rate algorithm's theoretical arrival time)
//! one interval on and says how long the request waits. The row lock makes
//! turns taken at once on several servers follow each other, on SQLite and
//! on PostgreSQL alike. A provider's `Retry-After` moves `next_at` past the
//! pause ([`Store::pause_budget`]), so every server's next turn waits it.
//!
//! Times are Unix microseconds, from the clock of the server taking the
//! turn: servers sharing a budget must keep their clocks together (as
//! leases already ask).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::credentials::CredentialHandle;
use super::{Store, StoreResult, from_ms, now_ms};

/// What a budget limits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BudgetSubject {
    /// Every request that names the credential (by its id), whichever
    /// server, pipeline or connector sends it.
    Credential(String),
    /// Every request to the provider host (a name, lowercase), from any
    /// workspace.
    Host(String),
}

impl BudgetSubject {
    fn scope(&self) -> &'static str {
        match self {
            BudgetSubject::Credential(_) => "credential",
            BudgetSubject::Host(_) => "host",
        }
    }

    fn name(&self) -> &str {
        match self {
            BudgetSubject::Credential(id) | BudgetSubject::Host(id) => id,
        }
    }

    fn from_row(scope: &str, name: String) -> Option<BudgetSubject> {
        match scope {
            "credential" => Some(BudgetSubject::Credential(name)),
            "host" => Some(BudgetSubject::Host(name)),
            _ => None,
        }
    }
}

impl std::fmt::Display for BudgetSubject {
    /// `credential:cred_…` or `host:api.example.com`, as `/metrics` labels
    /// and the operator's listing show it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.scope(), self.name())
    }
}

/// How fast a budget lets requests go: on average one per interval, and
/// up to `burst` at once after a quiet spell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetRate {
    interval_us: i64,
    burst: u32,
}

impl BudgetRate {
    /// The most requests per second a budget may allow.
    pub const MAX_PER_SECOND: f64 = 100_000.0;
    /// The fewest: one request every 1,000 seconds.
    pub const MIN_PER_SECOND: f64 = 0.001;
    pub const MAX_BURST: u32 = 10_000;

    /// `None` outside [`Self::MIN_PER_SECOND`]..=[`Self::MAX_PER_SECOND`]
    /// or a burst outside 1..=[`Self::MAX_BURST`].
    pub fn new(per_second: f64, burst: u32) -> Option<BudgetRate> {
        if !(Self::MIN_PER_SECOND..=Self::MAX_PER_SECOND).contains(&per_second)
            || !(1..=Self::MAX_BURST).contains(&burst)
        {
            return None;
        }
        #[allow(clippy::cast_possible_truncation)]
        let interval_us = (1_000_000.0 / per_second).round() as i64;
        Some(BudgetRate { interval_us, burst })
    }

    pub fn per_second(self) -> f64 {
        1_000_000.0 / self.interval_us as f64
    }

    pub fn burst(self) -> u32 {
        self.burst
    }

    fn from_row(interval_us: i64, burst: i64) -> BudgetRate {
        BudgetRate { interval_us: interval_us.max(1), burst: u32::try_from(burst).unwrap_or(1).max(1) }
    }
}

/// A budget as the operator set it, with what it is known by now.
#[derive(Debug, Clone)]
pub struct RateBudget {
    pub subject: BudgetSubject,
    pub rate: BudgetRate,
    /// Until when a provider's `Retry-After` holds its requests, if that
    /// is still ahead.
    pub paused_until: Option<DateTime<Utc>>,
    /// The handle requests name the credential by, and its workspace
    /// (for a credential's budget whose credential still exists).
    pub handle: Option<(CredentialHandle, String)>,
}

/// The current time in Unix microseconds, the unit of turns.
pub(crate) fn now_us() -> i64 {
    Utc::now().timestamp_micros()
}

impl Store {
    /// Sets (or replaces) the budget of `subject`; `false` when it names a
    /// credential that does not exist. Every server's next turn uses it.
    pub async fn set_rate_budget(&self, subject: &BudgetSubject, rate: BudgetRate) -> StoreResult<bool> {
        if let BudgetSubject::Credential(id) = subject {
            let known =
                sqlx::query("SELECT 1 FROM credentials WHERE id = $1").bind(id).fetch_optional(self.pool()).await?;
            if known.is_none() {
                return Ok(false);
            }
        }
        sqlx::query(
            "INSERT INTO rate_budgets (scope, subject, interval_us, burst, created_at) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (scope, subject) DO UPDATE SET interval_us = excluded.interval_us, burst = excluded.burst",
        )
        .bind(subject.scope())
        .bind(subject.name())
        .bind(rate.interval_us)
        .bind(i64::from(rate.burst))
        .bind(now_ms())
        .execute(self.pool())
        .await?;
        Ok(true)
    }

    /// Removes the budget of `subject`; `false` when it had none.
    pub async fn clear_rate_budget(&self, subject: &BudgetSubject) -> StoreResult<bool> {
        let n = sqlx::query("DELETE FROM rate_budgets WHERE scope = $1 AND subject = $2")
            .bind(subject.scope())
            .bind(subject.name())
            .execute(self.pool())
            .await?
            .rows_affected();
        Ok(n > 0)
    }

    /// Every budget, credentials' first, each scope by subject.
    pub async fn rate_budgets(&self) -> StoreResult<Vec<RateBudget>> {
        let rows = sqlx::query(
            "SELECT b.scope, b.subject, b.interval_us, b.burst, b.paused_until, c.handle, c.workspace_id
             FROM rate_budgets b LEFT JOIN credentials c ON b.scope = 'credential' AND c.id = b.subject
             ORDER BY b.scope, b.subject",
        )
        .fetch_all(self.pool())
        .await?;
        let now = now_us();
        let mut budgets = Vec::with_capacity(rows.len());
        for r in &rows {
            let scope: String = r.try_get("scope")?;
            let Some(subject) = BudgetSubject::from_row(&scope, r.try_get("subject")?) else { continue };
            let paused_until: i64 = r.try_get("paused_until")?;
            budgets.push(RateBudget {
                subject,
                rate: BudgetRate::from_row(r.try_get("interval_us")?, r.try_get("burst")?),
                paused_until: (paused_until > now).then(|| from_ms(paused_until / 1000)),
                handle: match (
                    r.try_get::<Option<String>, _>("handle")?,
                    r.try_get::<Option<String>, _>("workspace_id")?,
                ) {
                    (Some(handle), Some(workspace)) => Some((CredentialHandle::new(handle), workspace)),
                    _ => None,
                },
            });
        }
        Ok(budgets)
    }

    /// Takes the next turn of `subject`'s budget at `now` (Unix µs):
    /// how long the request waits before it leaves, or `None` when the
    /// budget is gone.
    pub(crate) async fn take_turn(&self, subject: &BudgetSubject, now: i64) -> StoreResult<Option<Duration>> {
        let row = sqlx::query(
            "UPDATE rate_budgets SET next_at = (CASE WHEN next_at > $1 THEN next_at ELSE $1 END) + interval_us
             WHERE scope = $2 AND subject = $3 RETURNING next_at, interval_us, burst",
        )
        .bind(now)
        .bind(subject.scope())
        .bind(subject.name())
        .fetch_optional(self.pool())
        .await?;
        let Some(row) = row else { return Ok(None) };
        let (next_at, interval, burst): (i64, i64, i64) =
            (row.try_get("next_at")?, row.try_get("interval_us")?, row.try_get("burst")?);
        // The turn starts `burst` intervals before the new arrival time:
        // a quiet budget lets `burst` requests go at once.
        let starts = next_at.saturating_sub(interval.saturating_mul(burst));
        Ok(Some(Duration::from_micros(u64::try_from(starts - now).unwrap_or(0))))
    }

    /// Hands back a turn taken and not used (the request was held, not
    /// sent), so the budget's rate counts requests that left.
    pub(crate) async fn give_back_turn(&self, subject: &BudgetSubject) -> StoreResult<()> {
        sqlx::query("UPDATE rate_budgets SET next_at = next_at - interval_us WHERE scope = $1 AND subject = $2")
            .bind(subject.scope())
            .bind(subject.name())
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Holds every turn of `subject`'s budget until `until` (Unix µs), as
    /// a provider's `Retry-After` asked: the first turn after it starts
    /// then, the next ones an interval apart (no burst right after).
    pub(crate) async fn pause_budget(&self, subject: &BudgetSubject, until: i64) -> StoreResult<()> {
        sqlx::query(
            "UPDATE rate_budgets SET
                 next_at = CASE WHEN next_at > $1 + (burst - 1) * interval_us THEN next_at
                                ELSE $1 + (burst - 1) * interval_us END,
                 paused_until = CASE WHEN paused_until > $1 THEN paused_until ELSE $1 END
             WHERE scope = $2 AND subject = $3",
        )
        .bind(until)
        .bind(subject.scope())
        .bind(subject.name())
        .execute(self.pool())
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store =
            Store::connect(&format!("sqlite://{}?mode=rwc", dir.path().join("control.db").display())).await.unwrap();
        (dir, store)
    }

    fn host() -> BudgetSubject {
        BudgetSubject::Host("api.example.com".into())
    }

    #[test]
    fn rates_out_of_range_are_refused() {
        assert!(BudgetRate::new(0.0, 1).is_none());
        assert!(BudgetRate::new(f64::NAN, 1).is_none());
        assert!(BudgetRate::new(200_000.0, 1).is_none());
        assert!(BudgetRate::new(10.0, 0).is_none());
        assert!(BudgetRate::new(10.0, 10_001).is_none());
        let rate = BudgetRate::new(4.0, 2).unwrap();
        assert_eq!((rate.per_second(), rate.burst()), (4.0, 2));
    }

    #[tokio::test]
    async fn a_burst_goes_at_once_and_the_rest_one_interval_apart() {
        let (_dir, store) = store().await;
        assert!(store.set_rate_budget(&host(), BudgetRate::new(10.0, 3).unwrap()).await.unwrap());
        let now = 1_000_000_000;
        let mut waits = Vec::new();
        for _ in 0..6 {
            waits.push(store.take_turn(&host(), now).await.unwrap().unwrap().as_millis());
        }
        assert_eq!(waits, vec![0, 0, 0, 100, 200, 300]);
        // A quiet spell refills the burst, never beyond it.
        let later = now + 10_000_000;
        let mut waits = Vec::new();
        for _ in 0..4 {
            waits.push(store.take_turn(&host(), later).await.unwrap().unwrap().as_millis());
        }
        assert_eq!(waits, vec![0, 0, 0, 100]);
        assert!(store.take_turn(&BudgetSubject::Host("other.example.com".into()), now).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_pause_holds_the_next_turn_until_it_ends_then_paces_without_a_burst() {
        let (_dir, store) = store().await;
        store.set_rate_budget(&host(), BudgetRate::new(10.0, 5).unwrap()).await.unwrap();
        let now = 1_000_000_000;
        store.pause_budget(&host(), now + 2_000_000).await.unwrap();
        let mut waits = Vec::new();
        for _ in 0..3 {
            waits.push(store.take_turn(&host(), now).await.unwrap().unwrap().as_millis());
        }
        assert_eq!(waits, vec![2000, 2100, 2200]);
        // A shorter pause seen later moves nothing back.
        store.pause_budget(&host(), now + 1_000_000).await.unwrap();
        assert_eq!(store.take_turn(&host(), now).await.unwrap().unwrap().as_millis(), 2300);
        // A turn given back is the next one taken.
        store.give_back_turn(&host()).await.unwrap();
        assert_eq!(store.take_turn(&host(), now).await.unwrap().unwrap().as_millis(), 2300);
    }

    #[tokio::test]
    async fn a_credentials_budget_needs_the_credential_and_is_listed_with_its_handle() {
        let (_dir, store) = store().await;
        let rate = BudgetRate::new(2.0, 1).unwrap();
        assert!(!store.set_rate_budget(&BudgetSubject::Credential("cred_missing".into()), rate).await.unwrap());
        assert!(store.set_rate_budget(&host(), rate).await.unwrap());
        assert!(store.set_rate_budget(&host(), BudgetRate::new(5.0, 2).unwrap()).await.unwrap());
        let listed = store.rate_budgets().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].subject.to_string(), listed[0].rate.per_second()), ("host:api.example.com".into(), 5.0));
        assert!(listed[0].handle.is_none() && listed[0].paused_until.is_none());
        assert!(store.clear_rate_budget(&host()).await.unwrap());
        assert!(!store.clear_rate_budget(&host()).await.unwrap());
        assert!(store.rate_budgets().await.unwrap().is_empty());
    }
}
