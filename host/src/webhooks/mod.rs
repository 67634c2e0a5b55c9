//! Outbound webhooks: what a workspace is told about, signed, delivered
//! from the durable outbox in the control database.
//!
//! Events are written by the store in the transaction of their cause (a
//! job starting or ending, a proposal made or decided, rows a reverse-ETL
//! run could not send); subscriptions are managed through the one door
//! for writes (`ops::webhooks`).
//!
//! Layout:
//! - [`signing`]: Standard Webhooks secrets and signatures;
//! - [`deliver`]: the deliverer every server runs: leases on
//!   subscriptions, attempts through egress, backoff and the retry window.

pub(crate) mod deliver;
pub(crate) mod signing;
