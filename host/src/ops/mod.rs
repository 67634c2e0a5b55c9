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

pub mod act;
pub mod credentials;
pub mod destinations;
pub mod execute;
pub mod gate;
pub mod members;
pub mod operation;
pub mod patch;
pub mod pipelines;
pub mod plugins;
pub mod policies;
pub mod reverse_etl;
pub mod sessions;
pub mod sources;
pub mod syncs;
pub mod text;
pub mod webhooks;

pub use act::{Act, Category, Executed, SHOWN_ONCE};
pub use gate::{EXECUTION_MODE_HEADER, Proposed, submit};
pub use operation::Operation;
