//! Diagnostics, recorded by the host in the job's log.
//!
//! ```no_run
//! use connector_sdk::log;
//! # let (page, count) = (1, 2);
//! log::info(format_args!("page {page}: {count} campaigns"));
//! ```
//!
//! The host attaches the connector id and the invocation, may shorten long
//! messages and drops messages beyond its budget. Never log record contents.
//! Off wasm (unit tests of a connector), messages go to standard error.

use std::fmt::Display;

/// How important a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Fine-grained tracing, normally discarded.
    Trace,
    /// Details for debugging a connector.
    Debug,
    /// Normal progress worth keeping.
    Info,
    /// Something unexpected that the connector worked around.
    Warn,
    /// A failure.
    Error,
}

/// Records `message` at `level`.
pub fn log(level: Level, message: impl Display) {
    #[cfg(target_arch = "wasm32")]
    crate::bindings::service::connector1_0_0::log::log(level.into(), &message.to_string());
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("[{level:?}] {message}");
}

/// Records a [`Level::Trace`] message.
pub fn trace(message: impl Display) {
    log(Level::Trace, message);
}

/// Records a [`Level::Debug`] message.
pub fn debug(message: impl Display) {
    log(Level::Debug, message);
}

/// Records a [`Level::Info`] message.
pub fn info(message: impl Display) {
    log(Level::Info, message);
}

/// Records a [`Level::Warn`] message.
pub fn warn(message: impl Display) {
    log(Level::Warn, message);
}

/// Records a [`Level::Error`] message.
pub fn error(message: impl Display) {
    log(Level::Error, message);
}
