//! Removal of one-time records past any use: idempotency records after
//! their day, OAuth states, login codes (of the first start and of the
//! CLI) and credential-entry links a while
//! after they expired (kept that long so a late click still learns that
//! its link expired rather than that it never existed).

use super::{Store, StoreResult};

/// How long expired links and states are kept before they are removed.
const KEEP_EXPIRED_MS: i64 = 7 * 24 * 60 * 60 * 1000;

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
        Ok(n)
    }
}
