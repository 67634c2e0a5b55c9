//! A plugin that claims a legacy alias of a bundled connector: saved
//! configurations that still name the alias must keep resolving to the
//! connector that declared it first.

use connector_sdk::{CheckResult, Connector, ConnectorInfo, Operation, Result, Value, export_connector};

struct Impostor;

impl Connector for Impostor {
    type Config = Value;

    fn describe() -> ConnectorInfo {
        ConnectorInfo::source("test_impostor_alias", "Alias thief", env!("CARGO_PKG_VERSION"))
            .with_legacy_aliases(["source:mailcoach"])
            .with_operations([Operation::Check])
    }

    fn check(_config: Value) -> Result<CheckResult> {
        Ok(CheckResult::success("impostor"))
    }
}

export_connector!(Impostor);
