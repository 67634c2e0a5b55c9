//! Outbound webhooks: subscriptions, the outbox of events, and the
//! deliveries servers claim and record.
//!
//! An event is written by [`record_event`] on the connection of the
//! transaction that makes its cause, with one delivery for each enabled
//! subscription of the workspace that asked for its type (an event no
//! subscription wants is not written at all). A server claims a whole
//! subscription with a lease ([`Store::claim_webhook`]), under a token
//! drawn for that claim alone, and sends its pending deliveries oldest
//! first; a failed head blocks the queue until its retry, which is what
//! keeps each subscription's order. Delivery is at least once: a server
//! that loses its lease while a receiver is answering cannot record the
//! answer, and the delivery is sent again by the next holder.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::Row;
use utoipa::ToSchema;

use super::credentials::Sealed;
use super::kinds::{DeliveryStatus, EventType};
use super::{Store, StoreError, StoreResult, decode, from_ms, new_id, now_ms};

/// A subscription, as clients see it (never its secret).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct Webhook {
    pub webhook_id: String,
    pub workspace_id: String,
    pub url: String,
    pub description: String,
    pub event_types: Vec<EventType>,
    pub enabled: bool,
    /// Until when the previous signing secret also signs, after a rotation.
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    /// Why the server disabled it (its queue reached its bound), if it did;
    /// enabling it again clears this.
    pub disabled_reason: Option<String>,
    /// Events it did not get while its queue was full.
    pub dropped_events: i64,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// What a new subscription is made of.
pub(crate) struct NewWebhook<'a> {
    pub webhook_id: &'a str,
    pub workspace_id: &'a str,
    pub url: &'a str,
    pub description: &'a str,
    pub event_types: &'a [EventType],
    pub secret: &'a Sealed,
    pub created_by: &'a str,
}

/// A subscription as the deliverer needs it: where, and the sealed
/// secrets that sign.
pub(crate) struct WebhookTarget {
    pub webhook_id: String,
    pub workspace_id: String,
    pub url: String,
    pub enabled: bool,
    pub secret: Sealed,
    /// The rotated-out secret, while it still signs.
    pub previous: Option<Sealed>,
}

/// A subscription's sealed secrets, for a master-key rotation.
pub(crate) struct WebhookSecrets {
    pub webhook_id: String,
    pub workspace_id: String,
    pub secret: Sealed,
    pub previous: Option<Sealed>,
}

/// A subscription claimed by one server, until its lease runs out.
pub(crate) struct Claim {
    pub webhook_id: String,
    /// Drawn for this claim: whoever holds it may send and record.
    pub token: String,
}

/// The next delivery of a subscription to send.
pub(crate) struct DueDelivery {
    pub delivery_id: String,
    pub payload: String,
    /// Failed attempts since its retry window opened.
    pub failures: i64,
    /// When its retry window opened: its event, or its last replay. An
    /// attempt is recorded against this window only: a replay while the
    /// attempt was under way opens a new one the attempt cannot close.
    pub retry_from: i64,
}

/// How a released subscription waits before it is claimed again.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Hold {
    /// As it was.
    Free,
    /// Until its oldest pending delivery is due.
    UntilHeadIsDue,
    /// Until then (a queue that could not be read is left alone a while).
    Until(i64),
}

/// What a claimed subscription's queue holds.
pub(crate) enum Head {
    /// Its oldest pending delivery, due now.
    Due(DueDelivery),
    /// Its oldest pending delivery waits for its retry.
    Waiting,
    /// Nothing pending.
    Empty,
}

/// How one attempt ended.
pub(crate) struct AttemptRecord<'a> {
    pub delivery_id: &'a str,
    pub claim: &'a Claim,
    /// The retry window the attempt was made in.
    pub retry_from: i64,
    pub attempted_at: i64,
    pub duration_ms: i64,
    pub status_code: Option<u16>,
    pub error: Option<&'a str>,
    /// What the delivery becomes.
    pub outcome: AttemptOutcome,
}

/// What a delivery becomes after an attempt.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AttemptOutcome {
    Delivered,
    /// Tried again at this time; the subscription waits until then.
    RetryAt(i64),
    /// The retry window is spent.
    GivenUp,
}

/// One attempt of a delivery.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct DeliveryAttempt {
    pub attempt: i64,
    pub attempted_at: DateTime<Utc>,
    /// The receiver's HTTP status, if it answered.
    pub status_code: Option<i64>,
    pub duration_ms: i64,
    pub error: Option<String>,
}

/// A delivery of one event to one subscription.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct Delivery {
    /// Sent as `webhook-id`; the same on every retry and replay.
    pub delivery_id: String,
    pub webhook_id: String,
    pub event_id: String,
    pub event_type: EventType,
    pub status: DeliveryStatus,
    pub attempts: i64,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub last_status_code: Option<i64>,
    pub last_error: Option<String>,
    pub delivered_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    /// The body sent, exactly as signed.
    #[schema(value_type = Object)]
    pub payload: Value,
    /// Every attempt, oldest first.
    pub attempt_log: Vec<DeliveryAttempt>,
}

const COLUMNS: &str = "id, workspace_id, url, description, event_types, enabled, previous_until, disabled_reason, \
     dropped_events, created_by, created_at, updated_at";

fn webhook_from_row(r: &sqlx::any::AnyRow) -> StoreResult<Webhook> {
    let types: String = r.try_get("event_types")?;
    let names: Vec<String> = serde_json::from_str(&types).unwrap_or_default();
    let event_types =
        names.iter().map(|n| decode(n, EventType::parse, "event_types")).collect::<StoreResult<Vec<_>>>()?;
    let now = now_ms();
    Ok(Webhook {
        webhook_id: r.try_get("id")?,
        workspace_id: r.try_get("workspace_id")?,
        url: r.try_get("url")?,
        description: r.try_get("description")?,
        event_types,
        enabled: r.try_get::<i64, _>("enabled")? != 0,
        previous_secret_expires_at: r.try_get::<Option<i64>, _>("previous_until")?.filter(|t| *t > now).map(from_ms),
        disabled_reason: r.try_get("disabled_reason")?,
        dropped_events: r.try_get("dropped_events")?,
        created_by: r.try_get("created_by")?,
        created_at: from_ms(r.try_get("created_at")?),
        updated_at: from_ms(r.try_get("updated_at")?),
    })
}

fn sealed(text: Option<String>) -> StoreResult<Option<Sealed>> {
    text.map(|t| {
        Sealed::from_text(&t).ok_or_else(|| {
            StoreError::Database(sqlx::Error::ColumnDecode {
                index: "secret".into(),
                source: "corrupt sealed secret".into(),
            })
        })
    })
    .transpose()
}

fn types_json(types: &[EventType]) -> String {
    Value::from(types.iter().map(|t| t.as_str()).collect::<Vec<_>>()).to_string()
}

/// How much a workspace's webhooks may hold back: undelivered events per
/// subscription and per workspace. Beyond either, a subscription takes no
/// more: it is disabled with the reason and its events are counted as
/// dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OutboxBounds {
    pub pending_per_subscription: i64,
    pub pending_per_workspace: i64,
}

impl Default for OutboxBounds {
    fn default() -> Self {
        OutboxBounds { pending_per_subscription: 1000, pending_per_workspace: 5000 }
    }
}

/// Writes an event and its deliveries on `conn`, the connection of the
/// transaction that commits its cause. Returns how many deliveries it
/// queued (the caller wakes the deliverer after committing when any did).
/// A subscription whose queue is at its bound (or whose workspace's is)
/// gets none: it is disabled with the reason, and the event counted as
/// dropped for it.
pub(crate) async fn record_event(
    conn: &mut sqlx::AnyConnection,
    bounds: OutboxBounds,
    workspace_id: &str,
    event_type: EventType,
    data: Value,
) -> StoreResult<usize> {
    // Events of one workspace are counted against its bounds one at a
    // time: PostgreSQL's concurrent transactions would each see room for
    // one more. (SQLite has one writer at a time.)
    if conn.backend_name() == "PostgreSQL" {
        sqlx::query("SELECT id FROM webhooks WHERE workspace_id = $1 ORDER BY id FOR UPDATE")
            .bind(workspace_id)
            .fetch_all(&mut *conn)
            .await?;
    }
    let rows = sqlx::query(
        "SELECT t.webhook_id, w.enabled, (SELECT COUNT(*) FROM webhook_deliveries d \
         WHERE d.webhook_id = t.webhook_id AND d.status = 'pending') AS pending \
         FROM webhook_event_types t JOIN webhooks w ON w.id = t.webhook_id \
         WHERE t.workspace_id = $1 AND t.event_type = $2 AND (w.enabled = 1 OR w.disabled_reason IS NOT NULL) \
         ORDER BY t.webhook_id",
    )
    .bind(workspace_id)
    .bind(event_type.as_str())
    .fetch_all(&mut *conn)
    .await?;
    if rows.is_empty() {
        return Ok(0);
    }
    let mut workspace_pending: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM webhook_deliveries WHERE workspace_id = $1 AND status = 'pending'")
            .bind(workspace_id)
            .fetch_one(&mut *conn)
            .await?;
    let mut subscribers: Vec<String> = Vec::with_capacity(rows.len());
    for r in &rows {
        let webhook_id: String = r.try_get("webhook_id")?;
        let enabled = r.try_get::<i64, _>("enabled")? != 0;
        let pending: i64 = r.try_get("pending")?;
        let full = if pending >= bounds.pending_per_subscription {
            Some(format!(
                "its queue reached {} undelivered events (SERVICE_WEBHOOK_MAX_PENDING); later events were dropped",
                bounds.pending_per_subscription
            ))
        } else if workspace_pending >= bounds.pending_per_workspace {
            Some(format!(
                "the workspace's webhooks reached {} undelivered events (SERVICE_WEBHOOK_MAX_PENDING_PER_WORKSPACE); later events were dropped",
                bounds.pending_per_workspace
            ))
        } else {
            None
        };
        match (enabled, full) {
            (true, None) => {
                workspace_pending += 1;
                subscribers.push(webhook_id);
            }
            (true, Some(reason)) => {
                tracing::warn!(webhook = %webhook_id, workspace = %workspace_id, %reason, "webhook subscription disabled");
                metrics::counter!("webhook_events_dropped_total").increment(1);
                sqlx::query(
                    "UPDATE webhooks SET enabled = 0, disabled_reason = $1, dropped_events = dropped_events + 1 WHERE id = $2",
                )
                .bind(reason)
                .bind(&webhook_id)
                .execute(&mut *conn)
                .await?;
            }
            // Disabled for a full queue: counted, until it is enabled again.
            (false, _) => {
                metrics::counter!("webhook_events_dropped_total").increment(1);
                sqlx::query("UPDATE webhooks SET dropped_events = dropped_events + 1 WHERE id = $1")
                    .bind(&webhook_id)
                    .execute(&mut *conn)
                    .await?;
            }
        }
    }
    if subscribers.is_empty() {
        return Ok(0);
    }
    let now = now_ms();
    let event_id = new_id("evt");
    let payload = json!({
        "type": event_type.as_str(),
        "timestamp": from_ms(now).to_rfc3339_opts(SecondsFormat::Millis, true),
        "event_id": event_id,
        "workspace_id": workspace_id,
        "data": data,
    })
    .to_string();
    sqlx::query("INSERT INTO events (id, workspace_id, event_type, payload, created_at) VALUES ($1, $2, $3, $4, $5)")
        .bind(&event_id)
        .bind(workspace_id)
        .bind(event_type.as_str())
        .bind(&payload)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    for webhook_id in &subscribers {
        sqlx::query(
            "INSERT INTO webhook_deliveries (id, webhook_id, workspace_id, event_id, event_type, status, attempts, next_attempt_at, retry_from, created_at) \
             VALUES ($1, $2, $3, $4, $5, 'pending', 0, $6, $6, $6)",
        )
        .bind(new_id("msg"))
        .bind(webhook_id)
        .bind(workspace_id)
        .bind(&event_id)
        .bind(event_type.as_str())
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    Ok(subscribers.len())
}

async fn set_event_types(
    conn: &mut sqlx::AnyConnection,
    workspace_id: &str,
    webhook_id: &str,
    types: &[EventType],
) -> StoreResult<()> {
    sqlx::query("DELETE FROM webhook_event_types WHERE webhook_id = $1").bind(webhook_id).execute(&mut *conn).await?;
    for t in types {
        sqlx::query("INSERT INTO webhook_event_types (webhook_id, workspace_id, event_type) VALUES ($1, $2, $3)")
            .bind(webhook_id)
            .bind(workspace_id)
            .bind(t.as_str())
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

impl Store {
    /// Sets how much webhooks may hold back, from the server's settings.
    pub(crate) fn set_outbox_bounds(&self, bounds: OutboxBounds) {
        *self.outbox_bounds.write().unwrap_or_else(|p| p.into_inner()) = bounds;
    }

    /// How much webhooks may hold back.
    pub(crate) fn outbox_bounds(&self) -> OutboxBounds {
        *self.outbox_bounds.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes this server's deliverer: deliveries were committed.
    pub(crate) fn outbox_written(&self) {
        self.outbox.notify_one();
    }

    /// Resolves once deliveries were committed by this server (or at once,
    /// if some were since the last wait).
    pub(crate) async fn outbox_wait(&self) {
        self.outbox.notified().await;
    }

    pub(crate) async fn create_webhook(&self, w: NewWebhook<'_>) -> StoreResult<Webhook> {
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO webhooks (id, workspace_id, url, description, event_types, enabled, secret, created_by, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, 1, $6, $7, $8, $8)",
        )
        .bind(w.webhook_id)
        .bind(w.workspace_id)
        .bind(w.url)
        .bind(w.description)
        .bind(types_json(w.event_types))
        .bind(w.secret.to_text())
        .bind(w.created_by)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        set_event_types(&mut tx, w.workspace_id, w.webhook_id, w.event_types).await?;
        tx.commit().await?;
        Ok(self.webhook(w.workspace_id, w.webhook_id).await?.expect("just inserted"))
    }

    /// How many subscriptions a workspace has.
    pub(crate) async fn webhook_count(&self, workspace_id: &str) -> StoreResult<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM webhooks WHERE workspace_id = $1")
            .bind(workspace_id)
            .fetch_one(self.pool())
            .await?)
    }

    pub(crate) async fn webhook(&self, workspace_id: &str, id: &str) -> StoreResult<Option<Webhook>> {
        let sql = format!("SELECT {COLUMNS} FROM webhooks WHERE workspace_id = $1 AND id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(workspace_id).bind(id).fetch_optional(self.pool()).await?;
        row.as_ref().map(webhook_from_row).transpose()
    }

    pub(crate) async fn webhooks(
        &self,
        workspace_id: &str,
        after: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<Webhook>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM webhooks WHERE workspace_id = $1 AND ($2 IS NULL OR id > $2) ORDER BY id LIMIT $3"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(workspace_id)
            .bind(after)
            .bind(limit)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(webhook_from_row).collect()
    }

    /// Changes a subscription's URL, description, event types and whether
    /// it is enabled; with `secret`, rotates its signing secret (the
    /// current one keeps signing until `previous_until`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn update_webhook(
        &self,
        workspace_id: &str,
        id: &str,
        url: &str,
        description: &str,
        event_types: &[EventType],
        enabled: bool,
        secret: Option<(&Sealed, i64)>,
    ) -> StoreResult<Option<Webhook>> {
        let mut tx = self.begin_write().await?;
        let n = sqlx::query(
            "UPDATE webhooks SET url = $1, description = $2, event_types = $3, enabled = $4, updated_at = $5, \
             disabled_reason = CASE WHEN $4 = 1 THEN NULL ELSE disabled_reason END \
             WHERE workspace_id = $6 AND id = $7",
        )
        .bind(url)
        .bind(description)
        .bind(types_json(event_types))
        .bind(i64::from(enabled))
        .bind(now_ms())
        .bind(workspace_id)
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if n == 0 {
            return Ok(None);
        }
        if let Some((next, previous_until)) = secret {
            sqlx::query("UPDATE webhooks SET previous_secret = secret, previous_until = $1, secret = $2 WHERE id = $3")
                .bind(previous_until)
                .bind(next.to_text())
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        set_event_types(&mut tx, workspace_id, id, event_types).await?;
        tx.commit().await?;
        self.webhook(workspace_id, id).await
    }

    /// Deletes a subscription with its queue and delivery log. Returns
    /// whether it existed.
    pub(crate) async fn delete_webhook(&self, workspace_id: &str, id: &str) -> StoreResult<bool> {
        let mut tx = self.begin_write().await?;
        let n = sqlx::query("DELETE FROM webhooks WHERE workspace_id = $1 AND id = $2")
            .bind(workspace_id)
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if n == 1 {
            sqlx::query("DELETE FROM webhook_event_types WHERE webhook_id = $1").bind(id).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM webhook_attempts WHERE delivery_id IN (SELECT id FROM webhook_deliveries WHERE webhook_id = $1)")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM webhook_deliveries WHERE webhook_id = $1").bind(id).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(n == 1)
    }

    /// Every subscription's sealed secrets, for a master-key rotation.
    pub(crate) async fn all_webhook_secrets(&self) -> StoreResult<Vec<WebhookSecrets>> {
        let rows = sqlx::query("SELECT id, workspace_id, secret, previous_secret FROM webhooks ORDER BY id")
            .fetch_all(self.pool())
            .await?;
        rows.iter()
            .map(|r| {
                Ok(WebhookSecrets {
                    webhook_id: r.try_get("id")?,
                    workspace_id: r.try_get("workspace_id")?,
                    secret: sealed(Some(r.try_get("secret")?))?.expect("present"),
                    previous: sealed(r.try_get("previous_secret")?)?,
                })
            })
            .collect()
    }

    pub(crate) async fn reseal_webhook(&self, id: &str, secret: &Sealed, previous: Option<&Sealed>) -> StoreResult<()> {
        sqlx::query("UPDATE webhooks SET secret = $1, previous_secret = $2 WHERE id = $3")
            .bind(secret.to_text())
            .bind(previous.map(Sealed::to_text))
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Claims a subscription whose queue has a due delivery and that no
    /// live lease holds: its queue is this claim's until the lease runs
    /// out. A subscription waiting for its head's retry is not claimed.
    ///
    /// Weighted fair between workspaces, as job runners are: a workspace
    /// already holding `slots_per_workspace` live claims (on every server
    /// together) gets no more, and the others are served first by how
    /// small a share of their claim weight the claims their workspace
    /// holds are, then by how long ago the subscription was last served.
    /// (Two servers claiming at the same moment may each take the last
    /// slot: the bound is exceeded by one claim at most per server.)
    pub(crate) async fn claim_webhook(&self, lease_ms: i64, slots_per_workspace: i64) -> StoreResult<Option<Claim>> {
        let now = now_ms();
        let held = "(SELECT COUNT(*) FROM webhooks o WHERE o.workspace_id = w.workspace_id \
                    AND o.lease_owner IS NOT NULL AND o.lease_expires_at >= $1)";
        let candidates: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT w.id FROM webhooks w JOIN workspaces s ON s.id = w.workspace_id \
             WHERE (w.lease_owner IS NULL OR w.lease_expires_at < $1) \
             AND w.enabled = 1 AND (w.blocked_until IS NULL OR w.blocked_until <= $1) \
             AND EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.webhook_id = w.id AND d.status = 'pending' \
             AND d.next_attempt_at <= $1) AND {held} < $2 \
             ORDER BY ({held} + 1) * 1.0 / s.claim_weight, COALESCE(w.last_served_at, 0), w.id LIMIT 8"
        )))
        .bind(now)
        .bind(slots_per_workspace)
        .fetch_all(self.pool())
        .await?;
        for id in candidates {
            let token = uuid::Uuid::new_v4().simple().to_string();
            let n = sqlx::query(
                "UPDATE webhooks SET lease_owner = $1, lease_expires_at = $2 WHERE id = $3 \
                 AND (lease_owner IS NULL OR lease_expires_at < $4) \
                 AND (SELECT COUNT(*) FROM webhooks o WHERE o.workspace_id = webhooks.workspace_id \
                 AND o.lease_owner IS NOT NULL AND o.lease_expires_at >= $4) < $5",
            )
            .bind(&token)
            .bind(now + lease_ms)
            .bind(&id)
            .bind(now)
            .bind(slots_per_workspace)
            .execute(self.pool())
            .await?
            .rows_affected();
            if n == 1 {
                return Ok(Some(Claim { webhook_id: id, token }));
            }
        }
        Ok(None)
    }

    /// Extends a claim that is still live; false when it ran out (another
    /// server may hold the subscription now) or was taken over.
    pub(crate) async fn renew_claim(&self, claim: &Claim, lease_ms: i64) -> StoreResult<bool> {
        let now = now_ms();
        let n = sqlx::query(
            "UPDATE webhooks SET lease_expires_at = $1 WHERE id = $2 AND lease_owner = $3 AND lease_expires_at >= $4",
        )
        .bind(now + lease_ms)
        .bind(&claim.webhook_id)
        .bind(&claim.token)
        .bind(now)
        .execute(self.pool())
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    /// Gives a claimed subscription back, held as `hold` says.
    pub(crate) async fn release_webhook(&self, claim: &Claim, hold: Hold) -> StoreResult<()> {
        // The head's retry is read in the statement that releases, so a
        // replay committed since the deliverer looked (its head due now)
        // is not blocked until the old retry.
        let blocked_until = match hold {
            Hold::Free => "blocked_until",
            Hold::UntilHeadIsDue => {
                "(SELECT d.next_attempt_at FROM webhook_deliveries d WHERE d.webhook_id = webhooks.id \
                 AND d.status = 'pending' ORDER BY d.created_at, d.id LIMIT 1)"
            }
            Hold::Until(_) => "$3",
        };
        let query = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE webhooks SET lease_owner = NULL, lease_expires_at = NULL, blocked_until = {blocked_until}, \
             last_served_at = {now} WHERE id = $1 AND lease_owner = $2",
            now = now_ms()
        )))
        .bind(&claim.webhook_id)
        .bind(&claim.token);
        match hold {
            Hold::Until(at) => query.bind(at),
            _ => query,
        }
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Where and how a claimed subscription's deliveries go.
    pub(crate) async fn webhook_target(&self, id: &str) -> StoreResult<Option<WebhookTarget>> {
        let row = sqlx::query("SELECT id, workspace_id, url, enabled, secret, previous_secret, previous_until FROM webhooks WHERE id = $1")
            .bind(id)
            .fetch_optional(self.pool())
            .await?;
        let Some(r) = row else { return Ok(None) };
        let previous_live = r.try_get::<Option<i64>, _>("previous_until")?.is_some_and(|t| t > now_ms());
        Ok(Some(WebhookTarget {
            webhook_id: r.try_get("id")?,
            workspace_id: r.try_get("workspace_id")?,
            url: r.try_get("url")?,
            enabled: r.try_get::<i64, _>("enabled")? != 0,
            secret: sealed(Some(r.try_get("secret")?))?.expect("present"),
            previous: if previous_live { sealed(r.try_get("previous_secret")?)? } else { None },
        }))
    }

    /// The oldest pending delivery of a subscription, and whether it is due.
    pub(crate) async fn queue_head(&self, webhook_id: &str) -> StoreResult<Head> {
        let row = sqlx::query(
            "SELECT d.id, d.failures, d.retry_from, d.next_attempt_at, e.payload FROM webhook_deliveries d \
             JOIN events e ON e.id = d.event_id WHERE d.webhook_id = $1 AND d.status = 'pending' \
             ORDER BY d.created_at, d.id LIMIT 1",
        )
        .bind(webhook_id)
        .fetch_optional(self.pool())
        .await?;
        let Some(r) = row else { return Ok(Head::Empty) };
        let next: i64 = r.try_get("next_attempt_at")?;
        if next > now_ms() {
            return Ok(Head::Waiting);
        }
        Ok(Head::Due(DueDelivery {
            delivery_id: r.try_get("id")?,
            payload: r.try_get("payload")?,
            failures: r.try_get("failures")?,
            retry_from: r.try_get("retry_from")?,
        }))
    }

    /// Records an attempt and what the delivery becomes, if the claim
    /// still holds the subscription (its lease renewed on the way).
    /// Returns false when the claim was lost: another server holds the
    /// queue now, and this attempt is not recorded. An attempt that
    /// ended after its delivery was replayed is logged, but leaves the
    /// replayed delivery pending and its queue unblocked.
    pub(crate) async fn record_delivery_attempt(&self, a: AttemptRecord<'_>, lease_ms: i64) -> StoreResult<bool> {
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let held = sqlx::query("UPDATE webhooks SET lease_expires_at = $1 WHERE id = $2 AND lease_owner = $3")
            .bind(now + lease_ms)
            .bind(&a.claim.webhook_id)
            .bind(&a.claim.token)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if held == 0 {
            return Ok(false);
        }
        let attempt: i64 = sqlx::query_scalar(
            "UPDATE webhook_deliveries SET attempts = attempts + 1 WHERE id = $1 RETURNING attempts",
        )
        .bind(a.delivery_id)
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO webhook_attempts (delivery_id, attempt, attempted_at, status_code, duration_ms, error) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(a.delivery_id)
        .bind(attempt)
        .bind(a.attempted_at)
        .bind(a.status_code.map(i64::from))
        .bind(a.duration_ms)
        .bind(a.error)
        .execute(&mut *tx)
        .await?;
        let (status, next, delivered, failed) = match a.outcome {
            AttemptOutcome::Delivered => (DeliveryStatus::Delivered, a.attempted_at, Some(now), 0i64),
            AttemptOutcome::RetryAt(at) => (DeliveryStatus::Pending, at, None, 1),
            AttemptOutcome::GivenUp => (DeliveryStatus::Failed, a.attempted_at, None, 1),
        };
        let same_window = sqlx::query(
            "UPDATE webhook_deliveries SET status = $1, next_attempt_at = $2, last_status = $3, last_error = $4, delivered_at = $5, \
             failures = failures + $6 WHERE id = $7 AND retry_from = $8 AND status = 'pending'",
        )
        .bind(status.as_str())
        .bind(next)
        .bind(a.status_code.map(i64::from))
        .bind(a.error)
        .bind(delivered)
        .bind(failed)
        .bind(a.delivery_id)
        .bind(a.retry_from)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if same_window == 1 {
            let blocked_until = match a.outcome {
                AttemptOutcome::RetryAt(at) => Some(at),
                _ => None,
            };
            sqlx::query("UPDATE webhooks SET blocked_until = $1 WHERE id = $2")
                .bind(blocked_until)
                .bind(&a.claim.webhook_id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Deliveries of a subscription, newest first, with their attempts.
    pub(crate) async fn deliveries(
        &self,
        workspace_id: &str,
        webhook_id: &str,
        status: Option<DeliveryStatus>,
        before: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<Delivery>> {
        let rows = sqlx::query(
            "SELECT d.id, d.webhook_id, d.event_id, d.event_type, d.status, d.attempts, d.next_attempt_at, d.last_status, \
             d.last_error, d.delivered_at, d.created_at, \
             (SELECT e.payload FROM events e WHERE e.id = d.event_id) AS payload \
             FROM webhook_deliveries d WHERE d.workspace_id = $1 AND d.webhook_id = $2 \
             AND ($3 IS NULL OR d.status = $3) AND ($4 IS NULL OR d.id < $4) ORDER BY d.id DESC LIMIT $5",
        )
        .bind(workspace_id)
        .bind(webhook_id)
        .bind(status.map(DeliveryStatus::as_str))
        .bind(before)
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        // Every attempt of the deliveries read, in one query, not one per
        // delivery (and by their ids: the page may have moved since).
        let ids = rows.iter().map(|r| r.try_get::<String, _>("id")).collect::<Result<Vec<_>, _>>()?;
        let attempt_rows = if ids.is_empty() {
            Vec::new()
        } else {
            let list = (1..=ids.len()).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ");
            let mut query = sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT delivery_id, attempt, attempted_at, status_code, duration_ms, error FROM webhook_attempts \
                 WHERE delivery_id IN ({list}) ORDER BY delivery_id, attempt"
            )));
            for id in &ids {
                query = query.bind(id);
            }
            query.fetch_all(self.pool()).await?
        };
        let mut attempts: std::collections::HashMap<String, Vec<DeliveryAttempt>> = Default::default();
        for a in &attempt_rows {
            attempts.entry(a.try_get("delivery_id")?).or_default().push(DeliveryAttempt {
                attempt: a.try_get("attempt")?,
                attempted_at: from_ms(a.try_get("attempted_at")?),
                status_code: a.try_get("status_code")?,
                duration_ms: a.try_get("duration_ms")?,
                error: a.try_get("error")?,
            });
        }
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let id: String = r.try_get("id")?;
            let status = decode(r.try_get("status")?, DeliveryStatus::parse, "status")?;
            let payload: Option<String> = r.try_get("payload")?;
            out.push(Delivery {
                attempt_log: attempts.remove(&id).unwrap_or_default(),
                delivery_id: id,
                webhook_id: r.try_get("webhook_id")?,
                event_id: r.try_get("event_id")?,
                event_type: decode(r.try_get("event_type")?, EventType::parse, "event_type")?,
                status,
                attempts: r.try_get("attempts")?,
                next_attempt_at: (status == DeliveryStatus::Pending)
                    .then(|| r.try_get::<i64, _>("next_attempt_at").map(from_ms))
                    .transpose()?,
                last_status_code: r.try_get("last_status")?,
                last_error: r.try_get("last_error")?,
                delivered_at: r.try_get::<Option<i64>, _>("delivered_at")?.map(from_ms),
                created_at: from_ms(r.try_get("created_at")?),
                payload: payload.and_then(|p| serde_json::from_str(&p).ok()).unwrap_or(Value::Null),
            });
        }
        Ok(out)
    }

    /// Queues a delivery again, whatever became of it: it keeps its id, so
    /// a receiver that already has it can tell. Its retry window opens
    /// anew (a fresh backoff, a day of retries) and its subscription's
    /// queue is unblocked, so it goes out now if it is the oldest pending.
    /// Returns whether it exists.
    pub(crate) async fn replay_delivery(
        &self,
        workspace_id: &str,
        webhook_id: &str,
        delivery_id: &str,
    ) -> StoreResult<bool> {
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        // The subscription's row first, then the delivery's: the order an
        // attempt's record takes them in, so the two never deadlock.
        sqlx::query(
            "UPDATE webhooks SET blocked_until = NULL WHERE id = $1 AND workspace_id = $2 \
             AND EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.id = $3 AND d.webhook_id = $1)",
        )
        .bind(webhook_id)
        .bind(workspace_id)
        .bind(delivery_id)
        .execute(&mut *tx)
        .await?;
        // A window opened in the same millisecond as the last still differs
        // from it, so an attempt of the old window is always told apart.
        let n = sqlx::query(
            "UPDATE webhook_deliveries SET status = 'pending', next_attempt_at = $1, failures = 0, \
             retry_from = CASE WHEN retry_from >= $1 THEN retry_from + 1 ELSE $1 END \
             WHERE workspace_id = $2 AND webhook_id = $3 AND id = $4",
        )
        .bind(now)
        .bind(workspace_id)
        .bind(webhook_id)
        .bind(delivery_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        if n == 1 {
            self.outbox_written();
        }
        Ok(n == 1)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, VecDeque};

    use super::*;
    use crate::store::ClaimWeight;
    use crate::store::testing::ControlDatabase;

    /// A workspace of `weight` with eight subscriptions, each with a
    /// delivery due.
    async fn workspace_with_due_deliveries(store: &Store, name: &str, weight: u16) -> String {
        let ws = store.create_workspace(name).await.unwrap().workspace_id;
        assert!(store.set_claim_weight(&ws, ClaimWeight::new(weight).unwrap()).await.unwrap());
        let user = store.create_user(&format!("{name}@example.test"), name).await.unwrap().user_id;
        let secret = Sealed::from_text("k:n:c").unwrap();
        for _ in 0..8 {
            let webhook_id = new_id("wh");
            store
                .create_webhook(NewWebhook {
                    webhook_id: &webhook_id,
                    workspace_id: &ws,
                    url: "https://hooks.example.test/in",
                    description: "",
                    event_types: &[EventType::JobStarted],
                    secret: &secret,
                    created_by: &user,
                })
                .await
                .unwrap();
        }
        let mut conn = store.pool().acquire().await.unwrap();
        let queued = record_event(&mut conn, store.outbox_bounds(), &ws, EventType::JobStarted, json!({})).await;
        assert_eq!(queued.unwrap(), 8);
        ws
    }

    /// Delivery slots go by the workspaces' claim weights under contention,
    /// as job runners do: with weights 3 and 1, eight slots are shared six
    /// and two, and 1,000 claims (each as a slot frees up) 3:1 within
    /// ±10%. Neither workspace passes the cap per workspace. On both
    /// control databases.
    #[tokio::test]
    async fn delivery_slots_go_by_claim_weight_under_contention() {
        for db in ControlDatabase::each_kind().await {
            let store = db.connect().await;
            let heavy = workspace_with_due_deliveries(&store, "heavy", 3).await;
            let light = workspace_with_due_deliveries(&store, "light", 1).await;
            let workspace_of = |claim: &Claim| {
                let (id, pool) = (claim.webhook_id.clone(), store.pool().clone());
                async move {
                    let sql = "SELECT workspace_id FROM webhooks WHERE id = $1";
                    sqlx::query_scalar::<_, String>(sql).bind(id).fetch_one(&pool).await.unwrap()
                }
            };
            let mut held: VecDeque<(Claim, String)> = VecDeque::new();
            for _ in 0..8 {
                let claim = store.claim_webhook(60_000, 8).await.unwrap().expect("a subscription with work");
                let ws = workspace_of(&claim).await;
                held.push_back((claim, ws));
            }
            let of = |held: &VecDeque<(Claim, String)>, ws: &str| held.iter().filter(|(_, w)| w == ws).count();
            assert_eq!((of(&held, &heavy), of(&held, &light)), (6, 2), "eight slots shared 3:1");

            let mut claims: BTreeMap<String, usize> = BTreeMap::new();
            for _ in 0..1000 {
                let (oldest, _) = held.pop_front().unwrap();
                store.release_webhook(&oldest, Hold::Free).await.unwrap();
                let claim = store.claim_webhook(60_000, 8).await.unwrap().expect("a subscription with work");
                let ws = workspace_of(&claim).await;
                *claims.entry(ws.clone()).or_default() += 1;
                held.push_back((claim, ws));
            }
            let share = claims[&heavy] as f64 / 1000.0;
            assert!((share - 0.75).abs() <= 0.075, "the heavy workspace had {share} of 1,000 claims, not 3/4 ± 10%");
            // At its cap a workspace gets no more, however light the other.
            assert!(store.claim_webhook(60_000, 2).await.unwrap().is_none(), "both hold more than two");
            store.close().await;
            db.drop().await;
        }
    }
}
