//! Recording and replaying a plugin's exchanges, for its author's tests.
//!
//! Both sit where the host already sees every request before it attaches
//! a credential: a [`Recorder`] gets the request as the plugin made it,
//! naming a credential handle and never its secret, and the answer as the
//! plugin got it, after the secret was scrubbed from it. A [`Replay`]
//! answers requests instead of the network. What a recording looks like on
//! disk is the authoring kit's business, not this module's.

use std::pin::Pin;
use std::sync::Arc;

use super::{CredentialHandle, EgressError, InboundResponse, Injection, OutboundRequest, SecretError, SecretSource};

/// Sees every exchange of an egress that records.
pub trait Recorder: Send + Sync {
    /// A request is being made: its number in the order the plugin made
    /// them. Answers may arrive in another order (requests started ahead).
    fn begin(&self) -> u64;
    /// What request `ticket` was, as the plugin made it, and what the
    /// plugin got back.
    fn exchanged(&self, ticket: u64, request: &OutboundRequest, outcome: &Result<InboundResponse, EgressError>);
    /// The plugin gave request `ticket` up before its answer came (it
    /// dropped a request started ahead).
    fn abandoned(&self, ticket: u64, request: &OutboundRequest);
}

/// One request on its way, as a recorder sees it: finished with its
/// outcome, or abandoned when dropped unfinished.
pub(crate) struct Taping {
    recorder: Arc<dyn Recorder>,
    ticket: u64,
    request: Option<OutboundRequest>,
}

impl Taping {
    pub(super) fn begin(recorder: Arc<dyn Recorder>, request: &OutboundRequest) -> Self {
        let ticket = recorder.begin();
        Taping { recorder, ticket, request: Some(request.clone()) }
    }

    pub(super) fn finish(mut self, outcome: &Result<InboundResponse, EgressError>) {
        if let Some(request) = self.request.take() {
            self.recorder.exchanged(self.ticket, &request, outcome);
        }
    }
}

impl Drop for Taping {
    fn drop(&mut self) {
        if let Some(request) = self.request.take() {
            self.recorder.abandoned(self.ticket, &request);
        }
    }
}

/// Answers requests from a recording.
pub trait Replay: Send + Sync {
    /// The recorded answer to `request`; a request the recording does not
    /// hold is an error that says so (and what was recorded instead).
    fn answer(&self, request: &OutboundRequest) -> Result<InboundResponse, EgressError>;
}

/// The secrets of an egress that replays: none (no request goes out).
pub(super) struct NoSecrets;

impl SecretSource for NoSecrets {
    fn secret_for<'a>(
        &'a self,
        _workspace_id: &'a str,
        _connector_id: &'a str,
        _handle: &'a CredentialHandle,
        _host: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Injection, SecretError>> + Send + 'a>> {
        Box::pin(async { Err(SecretError::Unknown) })
    }

    fn renew<'a>(
        &'a self,
        _workspace_id: &'a str,
        _connector_id: &'a str,
        _handle: &'a CredentialHandle,
        _host: &'a str,
        _rejected: &'a secrecy::SecretString,
    ) -> Pin<Box<dyn Future<Output = Result<Injection, SecretError>> + Send + 'a>> {
        Box::pin(async { Err(SecretError::Unknown) })
    }
}
