//! Whether a failure may pass if tried again: the one question every
//! error type below the API answers the same way, so a job retries what
//! can come right and ends at once on what cannot. A job's failure is
//! made from any of them with `?` (`jobs::Failure: From<E: Transient>`),
//! keeping the answer.

/// An error that knows whether another attempt may succeed.
pub(crate) trait Transient: std::fmt::Display {
    /// Whether trying again later may succeed (a destination or provider
    /// that may come back), rather than fail the same way (a refusal, a
    /// record that will not fit, a missing object).
    fn is_transient(&self) -> bool;
}
