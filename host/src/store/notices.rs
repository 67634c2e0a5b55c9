//! Notices between the servers sharing a PostgreSQL database, so each may
//! keep read caches: a revoked session, or a membership change, made by
//! one server is sent with PostgreSQL `NOTIFY` (delivered on commit, to
//! every listening connection), and each server's follower evicts what it
//! names. A server that is not listening — not yet, or its connection was
//! lost, or the line went quiet and an echo of its own did not come back —
//! uses no cache until it listens again, and then starts with empty ones.
//!
//! Every server confirms each revocation and membership change it applied
//! with a notice of its own, and the server that made the change answers
//! its caller once every listening server has confirmed (or a second has
//! passed), so the very next request anywhere sees the change.

use std::sync::Arc;
use std::time::Duration;

use super::{Backend, Store, StoreResult};

/// The channel every notice is sent on.
pub(crate) const CHANNEL: &str = "service_changes";

/// The name the listening connection shows in `pg_stat_activity`.
pub const APPLICATION_NAME: &str = "service-notices";

/// After this long without a notice, the follower sends itself an echo…
const QUIET: Duration = Duration::from_secs(5);
/// …which must come back within this long, or the line is taken as lost.
const ECHO_WAIT: Duration = Duration::from_secs(2);
/// How long a change waits for every listening server's confirmation.
const CONFIRM_WAIT: Duration = Duration::from_secs(1);
/// How long to wait before listening again after a failure.
const RETRY: Duration = Duration::from_secs(1);

/// What changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Notice {
    /// A session was revoked: every server evicts it.
    SessionRevoked(String),
    /// Someone joined, left or changed role in a workspace (the change's
    /// id, for its confirmations).
    MembershipsChanged(String),
    /// A follower checking its own line.
    Echo(String),
    /// A server (named by its follower's id) has applied a change (a
    /// revoked session's id, or a membership change's).
    Applied { server: String, change: String },
}

impl Notice {
    pub(crate) fn payload(&self) -> String {
        match self {
            Notice::SessionRevoked(id) => format!("session:{id}"),
            Notice::MembershipsChanged(change) => format!("memberships:{change}"),
            Notice::Echo(nonce) => format!("echo:{nonce}"),
            Notice::Applied { server, change } => format!("applied:{server}:{change}"),
        }
    }

    pub(crate) fn parse(payload: &str) -> Option<Notice> {
        match payload.split_once(':') {
            Some(("session", id)) if !id.is_empty() => Some(Notice::SessionRevoked(id.to_owned())),
            Some(("echo", nonce)) => Some(Notice::Echo(nonce.to_owned())),
            Some(("memberships", change)) => Some(Notice::MembershipsChanged(change.to_owned())),
            Some(("applied", rest)) => match rest.split_once(':') {
                Some((server, change)) if !server.is_empty() && !change.is_empty() => {
                    Some(Notice::Applied { server: server.to_owned(), change: change.to_owned() })
                }
                _ => None,
            },
            // From a server of the version before confirmations.
            None if payload == "memberships" => Some(Notice::MembershipsChanged(String::new())),
            _ => None,
        }
    }
}

impl Store {
    /// Sends a notice to every server (PostgreSQL only: on SQLite this
    /// process is the only server).
    pub(crate) async fn notify(&self, notice: &Notice) -> StoreResult<()> {
        if self.backend() == Backend::Postgres {
            sqlx::query("SELECT pg_notify($1, $2)").bind(CHANNEL).bind(notice.payload()).execute(self.pool()).await?;
        }
        Ok(())
    }

    /// How many servers listen for notices now (PostgreSQL).
    async fn notice_listeners(&self) -> StoreResult<usize> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()",
        )
        .bind(APPLICATION_NAME)
        .fetch_one(self.pool())
        .await?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// Confirmations as the servers send them: (change, server). Subscribe
    /// before making the change.
    pub(crate) fn confirmations(&self) -> tokio::sync::broadcast::Receiver<(String, String)> {
        self.confirmations.subscribe()
    }

    /// Waits until every server listening now has confirmed `change`, for
    /// at most [`CONFIRM_WAIT`] (PostgreSQL only: on SQLite this process
    /// is the only server). A server that does not confirm in time is one
    /// that cannot hear notices, and such a server uses no cache.
    pub(crate) async fn confirmed_everywhere(
        &self,
        change: &str,
        mut confirmations: tokio::sync::broadcast::Receiver<(String, String)>,
    ) {
        if self.backend() != Backend::Postgres {
            return;
        }
        let Ok(listening) = self.notice_listeners().await else { return };
        let mut confirmed = std::collections::HashSet::new();
        let _ = tokio::time::timeout(CONFIRM_WAIT, async {
            while confirmed.len() < listening {
                match confirmations.recv().await {
                    Ok((c, server)) if c == change => {
                        confirmed.insert(server);
                    }
                    // Missed some under heavy traffic: keep listening.
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                }
            }
        })
        .await;
    }

    /// Sends a notice when `tx` commits (PostgreSQL only).
    pub(super) async fn notify_on_commit(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        notice: &Notice,
    ) -> StoreResult<()> {
        if self.backend() == Backend::Postgres {
            sqlx::query("SELECT pg_notify($1, $2)").bind(CHANNEL).bind(notice.payload()).execute(&mut **tx).await?;
        }
        Ok(())
    }
}

/// A cache the notices keep right: used only while they can be heard, and
/// told of every revocation.
pub(crate) trait Follower: Send + Sync {
    /// Starts or stops using the cache; either way it starts empty.
    fn set_trusted(&self, trusted: bool);

    /// A session was revoked (here or on another server).
    fn revocation_heard(&self, _session_id: &str) {}
}

/// Follows the notices of the other servers into this one's caches, until
/// the process ends (PostgreSQL only; returns at once on SQLite).
pub(crate) async fn follow(store: Store, caches: Vec<Arc<dyn Follower>>) {
    if store.backend() != Backend::Postgres {
        return;
    }
    let trust = |on: bool| caches.iter().for_each(|c| c.set_trusted(on));
    let url = with_application_name(store.url());
    let nonce = super::new_id("echo");
    loop {
        trust(false);
        let mut listener = match sqlx::postgres::PgListener::connect(&url).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for change notices; caches are off until it can");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        // A lost connection must end this listener (and the caches' use)
        // at once, not be mended quietly while notices go missing.
        listener.eager_reconnect(false);
        if let Err(e) = listener.listen(CHANNEL).await {
            tracing::warn!(error = %e, "cannot listen for change notices; caches are off until it can");
            tokio::time::sleep(RETRY).await;
            continue;
        }
        // Listening: whatever commits from now on reaches us. What the
        // caches held was dropped when they were turned off, and memberships
        // may have changed while nobody listened.
        store.memberships_changed_here();
        trust(true);
        tracing::debug!("listening for change notices; caches are on");
        loop {
            let next = match tokio::time::timeout(QUIET, listener.try_recv()).await {
                Ok(next) => next,
                Err(_) => {
                    // Quiet: prove the line still carries notices.
                    if store.notify(&Notice::Echo(nonce.clone())).await.is_err() {
                        break;
                    }
                    match tokio::time::timeout(ECHO_WAIT, listener.try_recv()).await {
                        Ok(next) => next,
                        Err(_) => break,
                    }
                }
            };
            match next {
                Ok(Some(n)) => match Notice::parse(n.payload()) {
                    Some(Notice::SessionRevoked(id)) => {
                        caches.iter().for_each(|c| c.revocation_heard(&id));
                        // Applied here: the revoking server counts on it.
                        if store.notify(&Notice::Applied { server: nonce.clone(), change: id }).await.is_err() {
                            break;
                        }
                    }
                    Some(Notice::MembershipsChanged(change)) => {
                        store.memberships_changed_here();
                        if !change.is_empty()
                            && store.notify(&Notice::Applied { server: nonce.clone(), change }).await.is_err()
                        {
                            break;
                        }
                    }
                    Some(Notice::Applied { server, change }) => {
                        let _ = store.confirmations.send((change, server));
                    }
                    Some(Notice::Echo(_)) | None => {}
                },
                // The connection was lost: notices may have been missed.
                Ok(None) | Err(_) => break,
            }
        }
        tracing::warn!("lost the change-notice connection; caches are off until it is back");
    }
}

/// The database URL with the listening connection's name in it.
fn with_application_name(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            let kept: Vec<(String, String)> = u
                .query_pairs()
                .filter(|(k, _)| k != "application_name")
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            u.query_pairs_mut().clear().extend_pairs(kept).append_pair("application_name", APPLICATION_NAME);
            u.to_string()
        }
        Err(_) => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_read_back_as_they_were_sent() {
        let applied = Notice::Applied { server: "echo_1".into(), change: "ses_1".into() };
        for n in [
            Notice::SessionRevoked("ses_1".into()),
            Notice::MembershipsChanged("chg_1".into()),
            Notice::Echo("echo_1".into()),
            applied,
        ] {
            assert_eq!(Notice::parse(&n.payload()), Some(n));
        }
        assert_eq!(Notice::parse("memberships"), Some(Notice::MembershipsChanged(String::new())));
        assert_eq!(Notice::parse("session:"), None);
        assert_eq!(Notice::parse("applied:echo_1"), None);
        assert_eq!(Notice::parse("applied::ses_1"), None);
        assert_eq!(Notice::parse("something else"), None);
        assert_eq!(
            with_application_name("postgres://u@127.0.0.1:5432/db?sslmode=disable&application_name=x"),
            "postgres://u@127.0.0.1:5432/db?sslmode=disable&application_name=service-notices"
        );
    }
}
