//! Stored first responses for `Idempotency-Key` replays.

use sqlx::Row;

use super::{Store, StoreResult, now_ms};

/// How long a key is remembered.
pub(crate) const KEY_TTL_MS: i64 = 24 * 60 * 60 * 1000;

/// The state of an idempotency key when a request presents it.
#[derive(Debug)]
pub(crate) enum KeyState {
    /// First use: the key is now reserved for this request.
    Reserved,
    /// A request with this key is still running.
    InFlight { request_hash: String },
    /// A request with this key has completed; its response can be replayed.
    Completed { request_hash: String, status: u16, body: String },
}

impl Store {
    /// Reserves `key` for a request, or reports what an earlier request with
    /// the same key left behind. Expired keys are forgotten first.
    pub(crate) async fn reserve_idempotency_key(
        &self,
        user_id: &str,
        key: &str,
        request_hash: &str,
    ) -> StoreResult<KeyState> {
        let now = now_ms();
        sqlx::query("DELETE FROM idempotency_keys WHERE user_id = $1 AND idem_key = $2 AND created_at < $3")
            .bind(user_id)
            .bind(key)
            .bind(now - KEY_TTL_MS)
            .execute(self.pool())
            .await?;
        let inserted = sqlx::query(
            "INSERT INTO idempotency_keys (user_id, idem_key, request_hash, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (user_id, idem_key) DO NOTHING",
        )
        .bind(user_id)
        .bind(key)
        .bind(request_hash)
        .bind(now)
        .execute(self.pool())
        .await?
        .rows_affected();
        if inserted == 1 {
            return Ok(KeyState::Reserved);
        }
        let row = sqlx::query(
            "SELECT request_hash, status_code, response_body FROM idempotency_keys WHERE user_id = $1 AND idem_key = $2",
        )
        .bind(user_id)
        .bind(key)
        .fetch_optional(self.pool())
        .await?;
        let Some(row) = row else {
            // Deleted between our insert attempt and the read: try again once.
            return Box::pin(self.reserve_idempotency_key(user_id, key, request_hash)).await;
        };
        let request_hash: String = row.try_get("request_hash")?;
        let status: Option<i64> = row.try_get("status_code")?;
        let body: Option<String> = row.try_get("response_body")?;
        Ok(match (status, body) {
            (Some(status), Some(body)) => KeyState::Completed { request_hash, status: status as u16, body },
            _ => KeyState::InFlight { request_hash },
        })
    }

    /// Stores the response of the request that reserved `key`.
    pub(crate) async fn complete_idempotency_key(
        &self,
        user_id: &str,
        key: &str,
        status: u16,
        body: &str,
    ) -> StoreResult<()> {
        sqlx::query(
            "UPDATE idempotency_keys SET status_code = $1, response_body = $2 WHERE user_id = $3 AND idem_key = $4",
        )
        .bind(i64::from(status))
        .bind(body)
        .bind(user_id)
        .bind(key)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Forgets a reservation whose request failed on the server side, so the
    /// client may retry with the same key.
    pub(crate) async fn release_idempotency_key(&self, user_id: &str, key: &str) -> StoreResult<()> {
        sqlx::query("DELETE FROM idempotency_keys WHERE user_id = $1 AND idem_key = $2 AND status_code IS NULL")
            .bind(user_id)
            .bind(key)
            .execute(self.pool())
            .await?;
        Ok(())
    }
}
