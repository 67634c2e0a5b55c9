//! The one door for writes.
//!
//! Every state-changing request is turned into an [`Operation`] and handed to
//! [`submit`], the single door to execution. Keeping operations as
//! serialisable values is what lets the approval gate store one as a
//! proposal and run it later exactly as it would have run now.
//!
//! Layout:
//! - [`act`]: [`Category`], the [`Act`] every operation implements, the
//!   context it runs with and [`Executed`]: what contexts build on;
//! - [`operation`]: [`Operation`], one variant per context;
//! - [`gate`]: [`submit`] and the approval gate behind it: proposals,
//!   policies, approving and rejecting;
//! - [`execute`]: who may perform an operation, and running an approved
//!   one as its proposer;
//! - one file per context with its operations and their execution:
//!   [`members`], [`sessions`], [`policies`], [`credentials`], [`sources`],
//!   [`destinations`], [`pipelines`], [`syncs`], [`plugins`],
//!   [`reverse_etl`], [`webhooks`];
//! - [`text`]: length limits of the text clients send;
//! - [`patch`]: how `PATCH` merges a configuration, on every resource.

pub(crate) mod act;
pub(crate) mod credentials;
pub(crate) mod destinations;
pub(crate) mod execute;
pub(crate) mod gate;
pub(crate) mod members;
pub(crate) mod operation;
pub(crate) mod patch;
pub(crate) mod pipelines;
pub(crate) mod plugins;
pub(crate) mod policies;
pub(crate) mod reverse_etl;
pub(crate) mod sessions;
pub(crate) mod sources;
pub(crate) mod syncs;
pub(crate) mod text;
pub(crate) mod webhooks;

pub use act::SHOWN_ONCE;
pub(crate) use act::{Category, Ctx, Executed};
pub(crate) use gate::{Proposed, submit};
