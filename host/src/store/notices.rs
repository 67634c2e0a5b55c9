//! Notices between the servers sharing a PostgreSQL database, so each may
//! keep read caches: a revoked session, or a membership change, made by
//! one server is sent with PostgreSQL `NOTIFY` (delivered on commit, to
//! every listening connection), and each server's follower evicts what it
//! names. A server that is not listening — not yet, or its connection was
//! lost, or the line went quiet and an echo of its own did not come back —
//! uses no cache until it listens again, and then starts with empty ones.

use std::sync::Arc;
use std::time::Duration;

use super::caches::{MeCache, SessionCache};
use super::{Backend, Store, StoreResult};

/// The channel every notice is sent on.
pub const CHANNEL: &str = "service_changes";

/// The name the listening connection shows in `pg_stat_activity`.
pub const APPLICATION_NAME: &str = "service-notices";

/// After this long without a notice, the follower sends itself an echo…
const QUIET: Duration = Duration::from_secs(5);
/// …which must come back within this long, or the line is taken as lost.
const ECHO_WAIT: Duration = Duration::from_secs(2);
/// How long to wait before listening again after a failure.
const RETRY: Duration = Duration::from_secs(1);

/// What changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A session was revoked: every server evicts it.
    SessionRevoked(String),
    /// Someone joined, left or changed role in a workspace.
    MembershipsChanged,
    /// A follower checking its own line.
    Echo(String),
}

impl Notice {
    pub fn payload(&self) -> String {
        match self {
            Notice::SessionRevoked(id) => format!("session:{id}"),
            Notice::MembershipsChanged => "memberships".into(),
            Notice::Echo(nonce) => format!("echo:{nonce}"),
        }
    }

    pub fn parse(payload: &str) -> Option<Notice> {
        match payload.split_once(':') {
            Some(("session", id)) if !id.is_empty() => Some(Notice::SessionRevoked(id.to_owned())),
            Some(("echo", nonce)) => Some(Notice::Echo(nonce.to_owned())),
            None if payload == "memberships" => Some(Notice::MembershipsChanged),
            _ => None,
        }
    }
}

impl Store {
    /// Sends a notice to every server (PostgreSQL only: on SQLite this
    /// process is the only server).
    pub async fn notify(&self, notice: &Notice) -> StoreResult<()> {
        if self.backend() == Backend::Postgres {
            sqlx::query("SELECT pg_notify($1, $2)").bind(CHANNEL).bind(notice.payload()).execute(self.pool()).await?;
        }
        Ok(())
    }

    /// Sends a notice when `tx` commits (PostgreSQL only).
    pub(super) async fn notify_on_commit(&self, tx: &mut sqlx::Transaction<'_, sqlx::Any>, notice: &Notice) -> StoreResult<()> {
        if self.backend() == Backend::Postgres {
            sqlx::query("SELECT pg_notify($1, $2)").bind(CHANNEL).bind(notice.payload()).execute(&mut **tx).await?;
        }
        Ok(())
    }
}

/// Follows the notices of the other servers into this one's caches, until
/// the process ends (PostgreSQL only; returns at once on SQLite).
pub async fn follow(store: Store, sessions: Arc<SessionCache>, me: Arc<MeCache>) {
    if store.backend() != Backend::Postgres {
        return;
    }
    let url = with_application_name(store.url());
    let nonce = super::new_id("echo");
    loop {
        sessions.set_trusted(false);
        me.set_trusted(false);
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
        sessions.set_trusted(true);
        me.set_trusted(true);
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
                    Some(Notice::SessionRevoked(id)) => sessions.revocation_heard(&id),
                    Some(Notice::MembershipsChanged) => store.memberships_changed_here(),
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
            let kept: Vec<(String, String)> = u.query_pairs().filter(|(k, _)| k != "application_name").map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
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
        for n in [Notice::SessionRevoked("ses_1".into()), Notice::MembershipsChanged, Notice::Echo("echo_1".into())] {
            assert_eq!(Notice::parse(&n.payload()), Some(n));
        }
        assert_eq!(Notice::parse("session:"), None);
        assert_eq!(Notice::parse("something else"), None);
        assert_eq!(
            with_application_name("postgres://u@127.0.0.1:5432/db?sslmode=disable&application_name=x"),
            "postgres://u@127.0.0.1:5432/db?sslmode=disable&application_name=service-notices"
        );
    }
}
