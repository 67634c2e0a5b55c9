//! Credentials: secrets sealed at rest, referred to everywhere else by an
//! opaque `credential_handle`.
//!
//! - [`keyring`]: the master key(s) and the AEAD (XChaCha20-Poly1305) that
//!   seals every secret, bound to its credential and workspace.
//! - [`vault`]: [`Vault`] creates credentials and hands a secret out only
//!   to the egress layer, for one workspace, connector and bound host at a
//!   time ([`crate::egress::SecretSource`]);
//! - [`oauth`]: [`OAuth`], the authorization-code flows the host runs
//!   (PKCE, the exchange, refreshing tokens), and the token requests of
//!   [`exchange`];
//! - [`exchange`]: credentials the host trades for a token first (client
//!   credentials, a JWT bearer assertion, a login);
//! - [`lookalike`]: what looks like a secret (field names, value shapes),
//!   refused wherever a secret does not belong;
//! - [`stores`]: secrets that stay in the operator's own store (OpenBao or
//!   Vault, listed environment variables, files under one directory),
//!   named by a credential's reference and read when a request needs them.
//!
//! Secrets are held in `secrecy` types from the moment they are parsed, so
//! neither `Debug` nor a log line can show them; only the sealed form is
//! stored, and no response type can carry one.

pub mod exchange;
pub mod keyring;
pub(crate) mod lookalike;
pub(crate) mod oauth;
pub mod stores;
pub(crate) mod vault;

pub(crate) use oauth::OAuth;
pub use vault::*;
