//! Session tokens (`SessionTokenAuthenticator`): a login request sent
//! before a stream's request when its token is missing or expired — before
//! every request when the manifest gives no `expiration_duration`, as the
//! CDK logs in — and the token its answer holds, kept for the read. The
//! login sends no secret (one that would is refused when the source is
//! saved), so the token comes of nothing the guest may not see.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, FixedOffset, Utc};

use super::{Env, ReadError, Transport, build};
use crate::model::Stream;
use crate::model::request::{Authenticator, SessionLogin};

/// The tokens logins gave, by the login requester's pointer.
#[derive(Debug, Clone, Default)]
pub struct Sessions(Arc<Mutex<HashMap<String, Token>>>);

#[derive(Debug, Clone)]
struct Token {
    value: String,
    /// When it expires; none: good for one request.
    expires: Option<DateTime<FixedOffset>>,
}

impl Sessions {
    /// The token of the login at `pointer`, if one was given.
    pub(super) fn token(&self, pointer: &str) -> Option<String> {
        self.lock().get(pointer).map(|t| t.value.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Token>> {
        // A poisoned map still holds tokens: at worst one logs in again.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn fresh(&self, pointer: &str, now: DateTime<Utc>) -> bool {
        self.lock().get(pointer).and_then(|t| t.expires).is_some_and(|expires| expires >= now)
    }
}

/// Logs in for `stream`'s next request where its authenticator takes a
/// session token that is missing or expired.
pub(super) fn log_in(stream: &Stream, env: &Env, transport: &mut dyn Transport) -> Result<(), ReadError> {
    let Authenticator::Session(session) = &stream.retriever.requester.authenticator else { return Ok(()) };
    let now = transport.now();
    if session.expiration.is_some() && env.sessions.fresh(&session.login_pointer, now) {
        return Ok(());
    }
    let value = token(session, env, transport)?;
    let expires = session.expiration.and_then(|gap| gap.after(&now.fixed_offset()));
    env.sessions.lock().insert(session.login_pointer.clone(), Token { value, expires });
    Ok(())
}

/// The token a login's answer holds at the manifest's path.
fn token(session: &SessionLogin, env: &Env, transport: &mut dyn Transport) -> Result<String, ReadError> {
    let request = build::login_request(session, env)?;
    let Some(response) = super::send(&session.login.error_handler, &request, env, transport)? else {
        return Err(ReadError::Invalid("the session login's answer was ignored by its error handler".into()));
    };
    let answer: serde_json::Value = serde_json::from_slice(&response.body)
        .map_err(|e| ReadError::Invalid(format!("the session login's answer is not JSON: {e}")))?;
    let found = session.token_path.iter().try_fold(&answer, |at, key| at.get(key));
    match found {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(v) if !v.is_null() => Ok(v.to_string()),
        _ => Err(ReadError::Invalid(format!(
            "the session login's answer has no token at {}",
            session.token_path.join("/")
        ))),
    }
}
