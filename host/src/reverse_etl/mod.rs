//! Reverse ETL: models read from a warehouse are sent to destinations by
//! activations, sending only what changed since the destination last
//! accepted it. A run is a job: its executor is `crate::jobs::activation`.
//!
//! Layout:
//! - [`model`]: running a model's query over its warehouse, read-only and
//!   bounded, and the API's answer when the warehouse refuses it;
//! - [`mapping`]: field mappings applied to rows, keys and fingerprints;
//! - [`targets`]: connector and endpoint (`webhook`) destinations, and
//!   sending a batch;
//! - [`preview`]: columns, samples and suggestions for `prepare`.

pub(crate) mod mapping;
pub(crate) mod model;
pub(crate) mod preview;
pub(crate) mod targets;
