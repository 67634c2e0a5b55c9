//! Read caches in front of the control database: verified sessions and
//! `GET /me` profiles. On the embedded SQLite backend this process is the
//! one server and every change passes through it (and drops what it
//! changes at once). With PostgreSQL, replicas share the database: a
//! change made by one reaches the others' caches as a notice (see
//! [`super::notices`]), and a replica that cannot hear notices does not
//! use its caches at all until it can again. Entries also expire after a
//! few seconds, a backstop for anything missed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::notices::Follower;
use super::sessions::ActiveSession;

/// How long an entry is used before it is read again, whatever notices say.
pub(crate) const BACKSTOP: Duration = Duration::from_secs(5);

/// Most entries kept; beyond, the cache starts over.
const MAX_ENTRIES: usize = 10_000;

/// Recently verified sessions, by token hash, so the hot path does not ask
/// the database for every request.
pub struct SessionCache {
    inner: Mutex<Sessions>,
    /// False while revocations could be missed (a PostgreSQL replica that
    /// is not listening for notices): then nothing is read or kept.
    trusted: AtomicBool,
}

struct Sessions {
    entries: HashMap<String, (ActiveSession, Instant)>,
    /// Bumped by every eviction, so a session read before a revocation
    /// and kept after its eviction is not kept.
    epoch: u64,
}

impl SessionCache {
    /// A cache that is used at once (`trusted`), or only once notices are
    /// heard.
    pub fn new(trusted: bool) -> Self {
        SessionCache {
            inner: Mutex::new(Sessions { entries: HashMap::new(), epoch: 0 }),
            trusted: AtomicBool::new(trusted),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sessions> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where the cache stands: pass it to [`SessionCache::put`] after
    /// reading a session from the database.
    pub fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    /// The live session of a token hash if verified recently, and where
    /// the cache stands (for a [`SessionCache::put`] after reading it).
    pub fn lookup(&self, token_hash: &str, now_ms: i64) -> (Option<ActiveSession>, u64) {
        let inner = self.lock();
        if !self.trusted.load(Ordering::Acquire) {
            return (None, inner.epoch);
        }
        let hit = inner
            .entries
            .get(token_hash)
            .filter(|(s, at)| at.elapsed() < BACKSTOP && s.expires_at.is_none_or(|e| e > now_ms))
            .map(|(s, _)| s.clone());
        (hit, inner.epoch)
    }

    /// The live session of a token hash, if verified recently.
    pub fn get(&self, token_hash: &str, now_ms: i64) -> Option<ActiveSession> {
        self.lookup(token_hash, now_ms).0
    }

    /// Keeps a session read at `epoch`, unless something was evicted since.
    pub fn put(&self, token_hash: &str, s: ActiveSession, epoch: u64) {
        if !self.trusted.load(Ordering::Acquire) {
            return;
        }
        let mut inner = self.lock();
        if inner.epoch != epoch {
            return;
        }
        if inner.entries.len() > MAX_ENTRIES {
            inner.entries.clear();
        }
        inner.entries.insert(token_hash.to_owned(), (s, Instant::now()));
    }

    /// Notes a cached session's use, keeping the time it was verified (so
    /// its use never extends the backstop).
    pub fn touched(&self, token_hash: &str, at_ms: i64) {
        if let Some((s, _)) = self.lock().entries.get_mut(token_hash) {
            s.last_used_at = Some(at_ms);
        }
    }

    /// Evicts a revoked session.
    pub(crate) fn forget_session(&self, session_id: &str) {
        let mut inner = self.lock();
        inner.epoch += 1;
        inner.entries.retain(|_, (s, _)| s.session_id != session_id);
    }

    pub fn is_trusted(&self) -> bool {
        self.trusted.load(Ordering::Acquire)
    }
}

impl Follower for SessionCache {
    fn set_trusted(&self, trusted: bool) {
        let mut inner = self.lock();
        inner.epoch += 1;
        inner.entries.clear();
        self.trusted.store(trusted, Ordering::Release);
    }

    /// Evicts a session another server (or this one) revoked, as its
    /// notice came back.
    fn revocation_heard(&self, session_id: &str) {
        self.forget_session(session_id);
    }
}

/// A user with their workspaces, as `GET /me` shows them.
pub(crate) type Profile = std::sync::Arc<(super::users::User, Vec<super::workspaces::WorkspaceWithRole>)>;

/// Recently read profiles for `GET /me`: an entry is dropped when any
/// membership changes (the store's membership generation moves, here or,
/// through a notice, on another replica), and lives a few seconds at most.
pub struct MeCache {
    entries: Mutex<HashMap<String, (u64, Instant, Profile)>>,
    trusted: AtomicBool,
}

impl MeCache {
    pub fn new(trusted: bool) -> Self {
        MeCache { entries: Default::default(), trusted: AtomicBool::new(trusted) }
    }

    /// A profile read at `generation`, if recent enough.
    pub fn get(&self, user_id: &str, generation: u64) -> Option<Profile> {
        if !self.trusted.load(Ordering::Acquire) {
            return None;
        }
        let e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (g, at, p) = e.get(user_id)?;
        (*g == generation && at.elapsed() < BACKSTOP).then(|| p.clone())
    }

    /// Keeps a profile read at `generation`.
    pub fn put(&self, user_id: &str, generation: u64, p: Profile) {
        if !self.trusted.load(Ordering::Acquire) {
            return;
        }
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if e.len() > MAX_ENTRIES {
            e.clear();
        }
        e.insert(user_id.to_owned(), (generation, Instant::now(), p));
    }
}

impl Follower for MeCache {
    fn set_trusted(&self, trusted: bool) {
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        e.clear();
        self.trusted.store(trusted, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(id: &str) -> ActiveSession {
        ActiveSession {
            session_id: id.into(),
            user_id: "usr_1".into(),
            client_source: crate::store::sessions::ClientSource::Api,
            kind: crate::store::sessions::SessionKind::Session,
            last_used_at: None,
            expires_at: None,
        }
    }

    #[test]
    fn a_session_read_before_a_revocation_is_not_kept_after_it() {
        let c = SessionCache::new(true);
        let before = c.epoch();
        c.forget_session("ses_1");
        c.put("h1", session("ses_1"), before);
        assert!(c.get("h1", 0).is_none(), "read before the eviction: not kept");
        c.put("h1", session("ses_1"), c.epoch());
        assert!(c.get("h1", 0).is_some());
        c.revocation_heard("ses_1");
        assert!(c.get("h1", 0).is_none());
    }

    #[test]
    fn an_untrusted_cache_keeps_and_answers_nothing() {
        let c = SessionCache::new(false);
        c.put("h1", session("ses_1"), c.epoch());
        assert!(c.get("h1", 0).is_none());
        c.set_trusted(true);
        c.put("h1", session("ses_1"), c.epoch());
        assert!(c.get("h1", 0).is_some());
        c.set_trusted(false);
        assert!(c.get("h1", 0).is_none());
        c.set_trusted(true);
        assert!(c.get("h1", 0).is_none(), "emptied when it stopped being used");
    }
}
