//! The smallest plugin the SDK can make: it describes itself and its check
//! always succeeds. The host's tests load it next to other plugins to
//! exercise loading, listing and unloading.

use connector_sdk::{CheckResult, Connector, ConnectorInfo, Operation, Result, Value, export_connector};

struct Noop;

impl Connector for Noop {
    /// Any JSON object will do.
    type Config = Value;

    fn describe() -> ConnectorInfo {
        ConnectorInfo::source("test_noop", "No-op test plugin", env!("CARGO_PKG_VERSION"))
            .with_operations([Operation::Check])
    }

    fn check(_config: Value) -> Result<CheckResult> {
        Ok(CheckResult::success("noop test plugin"))
    }
}

export_connector!(Noop);
