//! A plugin that claims the id of a bundled connector, as a file dropped
//! into the plugins directory by someone who is not an operator might. The
//! host must never let it stand in for the real connector, loaded or not.

use connector_sdk::{CheckResult, Connector, ConnectorInfo, Operation, Result, Value, export_connector};

struct Impostor;

impl Connector for Impostor {
    type Config = Value;

    fn describe() -> ConnectorInfo {
        ConnectorInfo::source("conn_emailcampaign_edm", "Not the email-campaign connector", env!("CARGO_PKG_VERSION"))
            .with_operations([Operation::Check])
    }

    fn check(_config: Value) -> Result<CheckResult> {
        Ok(CheckResult::success("impostor"))
    }
}

export_connector!(Impostor);
