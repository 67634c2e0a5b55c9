//! Read caches in front of the control database, used only on the
//! embedded SQLite backend, where this process is the one server and every
//! change passes through it (and drops what it changes at once). With
//! PostgreSQL, replicas share the database, and every request reads it.

/// Recently verified sessions, so the hot path does not ask the database
/// for every request. Used only on the embedded SQLite backend, where this
/// process is the one server and every revocation passes through it (and
/// evicts the entry at once); with PostgreSQL, where replicas share the
/// database, every request reads the session row so a revocation anywhere
/// takes effect on the next request everywhere.
pub struct SessionCache {
    entries: std::sync::Mutex<std::collections::HashMap<String, (super::sessions::ActiveSession, std::time::Instant)>>,
    ttl: std::time::Duration,
}

impl SessionCache {
    /// Entries older than this are verified again.
    pub fn new(ttl: std::time::Duration) -> Self {
        SessionCache { entries: Default::default(), ttl }
    }

    /// The live session of a token hash, if verified recently.
    pub fn get(&self, token_hash: &str, now_ms: i64) -> Option<super::sessions::ActiveSession> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (s, at) = entries.get(token_hash)?;
        (at.elapsed() < self.ttl && s.expires_at.is_none_or(|e| e > now_ms)).then(|| s.clone())
    }

    pub fn put(&self, token_hash: &str, s: super::sessions::ActiveSession) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() > 10_000 {
            entries.clear();
        }
        entries.insert(token_hash.to_owned(), (s, std::time::Instant::now()));
    }

    /// Evicts a revoked session.
    pub fn forget_session(&self, session_id: &str) {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).retain(|_, (s, _)| s.session_id != session_id);
    }
}

/// Recently read profiles for `GET /me`, on the embedded SQLite backend
/// only (one server): an entry is dropped when this server changes any
/// membership, and lives a few seconds at most.
pub struct MeCache {
    entries: std::sync::Mutex<std::collections::HashMap<String, CachedProfile>>,
}

/// A profile with the membership generation and time it was read at.
type CachedProfile = (u64, std::time::Instant, std::sync::Arc<(super::users::User, Vec<super::workspaces::WorkspaceWithRole>)>);

impl MeCache {
    const TTL: std::time::Duration = std::time::Duration::from_secs(5);

    pub fn new() -> Self {
        MeCache { entries: Default::default() }
    }

    /// A profile read at `generation`, if recent enough.
    pub fn get(&self, user_id: &str, generation: u64) -> Option<std::sync::Arc<(super::users::User, Vec<super::workspaces::WorkspaceWithRole>)>> {
        let e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (g, at, p) = e.get(user_id)?;
        (*g == generation && at.elapsed() < Self::TTL).then(|| p.clone())
    }

    /// Keeps a profile read at `generation`.
    pub fn put(&self, user_id: &str, generation: u64, p: std::sync::Arc<(super::users::User, Vec<super::workspaces::WorkspaceWithRole>)>) {
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if e.len() > 10_000 {
            e.clear();
        }
        e.insert(user_id.to_owned(), (generation, std::time::Instant::now(), p));
    }
}

impl Default for MeCache {
    fn default() -> Self {
        Self::new()
    }
}
