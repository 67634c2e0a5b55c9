//! The bundled email-campaign connector, `conn_emailcampaign_edm`.
//!
//! It speaks the REST API of Mailcoach and compatible services, in both of
//! their deployment forms: a self-hosted instance
//! (`https://<instance-domain>/api`) and the provider's cloud
//! (`https://<team>.mailcoach.app/api`). The user stores an API token with the
//! control API and configures its *credential handle*; the host attaches the
//! token as `Authorization: Bearer` to every request this plugin describes.
//!
//! # What it offers
//!
//! | operation | what it does |
//! |---|---|
//! | `check` | `GET /user`; succeeds with the token owner's email as the account |
//! | `discover` | the streams `campaigns`, `campaign_statistics`, `email_lists`, `subscribers`; the schema of `subscribers` says what `write` can write ([`streams`]) |
//! | `read` | pages through a stream, 100 records a page ([`read`]), incremental on `updated_at` ([`incremental`]) |
//! | `preview` | normalised metrics of the 10 most recently sent campaigns ([`preview`], [`metrics`]) |
//! | `write` | inserts, upserts, updates or deletes subscribers of the first configured list, matched by `email` or `uuid` ([`write`](mod@write)) |
//!
//! The connector is a source (`kind: source`); `write` is its reverse-ETL
//! side. Its legacy aliases `source:emailcampaign` and `source:mailcoach`
//! exist only so old saved configurations keep resolving.
//!
//! # Hosts
//!
//! A self-hosted instance can live at any domain, so the connector declares
//! the hosts `["*"]`: the operator's approved-host policy alone decides
//! which instances may be reached (by default the cloud domain
//! `*.mailcoach.app`), and the host validates `base_url` before calling the
//! plugin. [`config`] repeats the text-level checks so mistakes surface as
//! `invalid-config` naming the field.
//!
//! # Things a newcomer should know
//!
//! - The provider has no "changed since" filter. Every read walks the whole
//!   list; incremental reads filter on the plugin's side and checkpoint
//!   conservatively ([`incremental`] explains why).
//! - Statistics may be missing on older instances; every metric is optional
//!   and a missing one is `null`, never 0 ([`metrics`]).
//! - Nothing the plugin returns outside `read` copies provider objects
//!   wholesale: the preview and the statistics records are built field by
//!   field.
//!
//! # Layout
//!
//! | module | holds |
//! |---|---|
//! | [`config`] | the config type, its JSON Schema, validation |
//! | [`api`] | the only code that builds requests: endpoints, paging, error handling |
//! | [`streams`] | stream names, schemas, the `campaign_statistics` record |
//! | [`metrics`] | metric normalisation, totals, field coverage |
//! | [`incremental`] | timestamps, the cursor filter and the checkpointed state |
//! | [`read`], [`preview`], [`write`](mod@write) | one operation each |
//!
//! Unit tests cover the pure parts and run natively:
//! `cargo test --target x86_64-unknown-linux-gnu -p conn-emailcampaign`.

pub mod api;
pub mod config;
pub mod incremental;
pub mod metrics;
pub mod preview;
pub mod read;
pub mod streams;
pub mod write;

use connector_sdk::{
    CheckResult, Connector, ConnectorInfo, Operation, ReadRequest, Result, Stream, Value, WriteRequest, WriteResult,
    export_connector,
};

use crate::api::Api;
use crate::config::Config;

/// The stable connector id.
pub const CONNECTOR_ID: &str = "conn_emailcampaign_edm";

/// Older ids found in saved configurations (compatibility only).
pub const LEGACY_ALIASES: [&str; 2] = ["source:emailcampaign", "source:mailcoach"];

/// The connector; see the crate documentation.
pub struct EmailCampaigns;

impl Connector for EmailCampaigns {
    type Config = Config;

    fn describe() -> ConnectorInfo {
        ConnectorInfo::source(CONNECTOR_ID, "Email campaigns", env!("CARGO_PKG_VERSION"))
            .with_legacy_aliases(LEGACY_ALIASES)
            .with_hosts(["*"])
            .with_operations([
                Operation::Check,
                Operation::Discover,
                Operation::Read,
                Operation::Preview,
                Operation::Write,
            ])
            .with_config_schema(config::schema())
    }

    fn check(config: Config) -> Result<CheckResult> {
        config.validate()?;
        let user = Api::new(&config)?.current_user()?;
        let account = user.email.or_else(|| user.id.map(|id| format!("user {id}")));
        let result = CheckResult::success("the API token works and can read the account");
        Ok(match account {
            Some(account) => result.with_account(account),
            None => result,
        })
    }

    fn discover(config: Config) -> Result<Vec<Stream>> {
        config.validate()?;
        Ok(streams::catalogue())
    }

    fn read(request: ReadRequest<Config>) -> Result<()> {
        read::read(request)
    }

    fn preview(config: Config) -> Result<Value> {
        preview::preview(&config)
    }

    fn write(request: WriteRequest<Config>) -> Result<WriteResult> {
        write::write(request)
    }
}

export_connector!(EmailCampaigns);

#[cfg(test)]
mod tests {
    use super::*;
    use connector_sdk::ConnectorKind;

    #[test]
    fn describe_names_the_product_connector_and_its_aliases() {
        let info = EmailCampaigns::describe();
        assert_eq!(info.id, "conn_emailcampaign_edm");
        assert_eq!(info.name, "Email campaigns");
        assert_eq!(info.kind, ConnectorKind::Source);
        assert_eq!(info.legacy_aliases, ["source:emailcampaign", "source:mailcoach"]);
        assert!(info.oauth.is_none());
    }

    #[test]
    fn describe_leaves_host_approval_to_the_operator() {
        assert_eq!(EmailCampaigns::describe().hosts, ["*"]);
    }

    #[test]
    fn describe_lists_the_implemented_operations() {
        assert_eq!(
            EmailCampaigns::describe().operations,
            [Operation::Check, Operation::Discover, Operation::Read, Operation::Preview, Operation::Write]
        );
    }
}
