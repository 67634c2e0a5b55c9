//! Removal of one-time records past any use: idempotency records after
//! their day, OAuth states, login codes (of the first start and of the
//! CLI) and credential-entry links a while
//! after they expired (kept that long so a late click still learns that
//! its link expired rather than that it never existed); webhook
//! deliveries that ended (delivered or given up) a month ago, with their
//! attempts, and events no delivery refers to any more.

use super::{Store, StoreResult};

/// How long expired links and states are kept before they are removed.
const KEEP_EXPIRED_MS: i64 = 7 * 24 * 60 * 60 * 1000;

/// How long the log of an ended webhook delivery is kept (to read and
/// replay it).
const KEEP_DELIVERIES_MS: i64 = 30 * 24 * 60 * 60 * 1000;

impl Store {
    /// Deletes what expired; answers how many rows went.
    pub async fn sweep_expired(&self, now: i64) -> StoreResult<u64> {
        let mut n = sqlx::query("DELETE FROM idempotency_keys WHERE created_at < $1")
            .bind(now - super::idempotency::KEY_TTL_MS)
            .execute(self.pool())
            .await?
            .rows_affected();
        for table in ["oauth_states", "login_codes", "cli_login_codes", "credential_entry_links"] {
            let sql = format!("DELETE FROM {table} WHERE expires_at < $1");
            n += sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(now - KEEP_EXPIRED_MS)
                .execute(self.pool())
                .await?
                .rows_affected();
        }
        // An ended delivery's `next_attempt_at` is the time of its last
        // attempt: the month counts from when it ended, not from its event.
        let old = now - KEEP_DELIVERIES_MS;
        n += sqlx::query(
            "DELETE FROM webhook_attempts WHERE delivery_id IN \
             (SELECT id FROM webhook_deliveries WHERE status IN ('delivered', 'failed') AND next_attempt_at < $1)",
        )
        .bind(old)
        .execute(self.pool())
        .await?
        .rows_affected();
        n += sqlx::query(
            "DELETE FROM webhook_deliveries WHERE status IN ('delivered', 'failed') AND next_attempt_at < $1",
        )
        .bind(old)
        .execute(self.pool())
        .await?
        .rows_affected();
        n += sqlx::query(
            "DELETE FROM events WHERE created_at < $1 AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = events.id)",
        )
        .bind(old)
        .execute(self.pool())
        .await?
        .rows_affected();
        Ok(n)
    }
}
