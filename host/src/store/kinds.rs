//! The statuses, kinds and triggers records carry, as types: each with the
//! text it is stored and answered as (`as_str`, `parse`, serde), so an
//! impossible value is a compile error, not a runtime surprise.

/// Defines an enum stored and serialised as fixed texts.
macro_rules! text_enum {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, utoipa::ToSchema)]
        $vis enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] #[schema(rename = $text)] $variant),*
        }

        impl $name {
            /// Every value, in declaration order.
            $vis const ALL: &'static [$name] = &[$($name::$variant),*];

            /// The text it is stored and answered as.
            $vis fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),*
                }
            }

            /// The value a stored text names, if any.
            $vis fn parse(s: &str) -> Option<$name> {
                match s {
                    $($text => Some($name::$variant),)*
                    _ => None,
                }
            }

            /// The allowed texts, for messages (`a, b or c`).
            $vis fn choices() -> String {
                let all: Vec<&str> = $name::ALL.iter().map(|v| v.as_str()).collect();
                match all.split_last() {
                    Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
                    _ => all.join(""),
                }
            }
        }

        /// Accepts exactly the texts; anything else fails with `must be
        /// a, b or c`, which the API prefixes with the field's path.
        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                $name::parse(&text).ok_or_else(|| serde::de::Error::custom(format_args!("must be {}", $name::choices())))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

text_enum! {
    /// What a job does.
    pub enum JobKind {
        /// Reads what changed (or everything, for full refreshes).
        Sync = "sync",
        /// Clears the destination's data and state, then syncs from scratch.
        Reset = "reset",
        /// Loads the records the pipeline's contracts kept aside that fit
        /// them now.
        Replay = "replay",
        /// Sends a reverse-ETL model's new, changed and removed rows.
        ActivationRun = "activation_run",
        /// Sends every row of a reverse-ETL model, whatever its diff state.
        ActivationResync = "activation_resync",
    }
}

impl JobKind {
    /// Whether it is a reverse-ETL run rather than a pipeline's job.
    pub fn is_activation_run(self) -> bool {
        matches!(self, JobKind::ActivationRun | JobKind::ActivationResync)
    }
}

text_enum! {
    /// How an activation applies its model to the destination.
    pub enum ActivationMode {
        /// Create new records and update changed ones.
        Upsert = "upsert",
        /// Update records that exist; rows without one fail.
        UpdateOnly = "update_only",
        /// Create records for new rows only; never rewrite one.
        InsertOnly = "insert_only",
        /// Upsert, and remove the records whose rows left the model.
        Mirror = "mirror",
    }
}

text_enum! {
    /// What a reverse-ETL destination writes to.
    pub enum RetlDestinationKind {
        /// A writable object of a connector plugin, through its credential handle.
        Connector = "connector",
        /// An HTTPS endpoint that receives batches of JSON (`webhook` in
        /// API v1; in the code "webhook" names only the notification
        /// subscriptions).
        Endpoint = "webhook",
    }
}

text_enum! {
    /// Where a job is in its life.
    pub enum JobStatus {
        Queued = "queued",
        Running = "running",
        Succeeded = "succeeded",
        Failed = "failed",
        Cancelled = "cancelled",
    }
}

impl JobStatus {
    /// Whether the job has ended.
    pub fn is_final(self) -> bool {
        matches!(self, JobStatus::Succeeded | JobStatus::Failed | JobStatus::Cancelled)
    }
}

text_enum! {
    /// Where one stream of a sync spread over servers is.
    pub enum StreamRunStatus {
        /// Waiting for a runner (first, or again after a transient failure).
        Queued = "queued",
        Running = "running",
        Succeeded = "succeeded",
        /// Failed for good: the job fails once its other streams ended.
        Failed = "failed",
    }
}

impl StreamRunStatus {
    /// Whether the stream's run has ended for good.
    pub fn is_final(self) -> bool {
        matches!(self, StreamRunStatus::Succeeded | StreamRunStatus::Failed)
    }
}

text_enum! {
    /// What started a job.
    pub enum Trigger {
        /// A request (API, CLI).
        Manual = "manual",
        /// The pipeline's schedule.
        Schedule = "schedule",
        /// The approval of a proposal.
        Approval = "approval",
    }
}

text_enum! {
    /// Whether a pipeline's schedule runs.
    pub enum PipelineStatus {
        Active = "active",
        Paused = "paused",
    }
}

text_enum! {
    /// A built-in destination's kind.
    pub enum DestinationKind {
        /// An SQLite file under the workspace's folder.
        Sqlite = "sqlite",
        /// A PostgreSQL database the operator allows.
        Postgres = "postgres",
        /// A folder of JSON-lines files under the workspace's folder.
        Jsonl = "jsonl",
        /// Apache Iceberg tables in a warehouse folder under the
        /// workspace's folder.
        Iceberg = "iceberg",
    }
}

text_enum! {
    /// What a credential's secret is, which fixes where the host puts it.
    pub enum CredentialKind {
        /// Sent as a bearer token.
        ApiToken = "api_token",
        /// An OAuth access token (with its refresh token), sent as a bearer
        /// token and refreshed by the host.
        Oauth2 = "oauth2",
        /// The password of the credential's username, sent as HTTP Basic.
        Basic = "basic",
        /// Sent as the value of the credential's header.
        Secret = "secret",
    }
}

text_enum! {
    /// Whether a credential may be used.
    pub enum CredentialStatus {
        /// Sealed, waiting for its activation to be approved.
        PendingApproval = "pending_approval",
        Active = "active",
        Revoked = "revoked",
        /// The provider refused to refresh it: authorise again.
        NeedsReauthorization = "needs_reauthorization",
    }
}

text_enum! {
    /// How a request or execution ended, as audited.
    pub enum AuditOutcome {
        Succeeded = "succeeded",
        Failed = "failed",
        /// Refused for want of authentication or permission.
        Denied = "denied",
        /// Stored as a proposal instead of executed.
        Proposed = "proposed",
    }
}

text_enum! {
    /// Where a proposal is in its life.
    pub enum ApprovalStatus {
        Pending = "pending",
        /// Approved and running now.
        Executing = "executing",
        Executed = "executed",
        /// Approved, and its execution failed.
        Failed = "failed",
        Rejected = "rejected",
        /// Pending past its expiry (derived, never stored).
        Expired = "expired",
        /// Its proposing session was revoked.
        Voided = "voided",
    }
}

text_enum! {
    /// What happened, as webhooks announce it (the `type` of an event).
    pub enum EventType {
        /// A job's first attempt started.
        JobStarted = "job.started",
        /// A pipeline's sync or reset succeeded.
        JobSucceeded = "job.succeeded",
        /// A pipeline's sync or reset failed for good (retries spent).
        JobFailed = "job.failed",
        /// A job was cancelled.
        JobCancelled = "job.cancelled",
        /// A reverse-ETL run succeeded.
        ActivationRunSucceeded = "activation_run.succeeded",
        /// A reverse-ETL run failed for good.
        ActivationRunFailed = "activation_run.failed",
        /// A pipeline's last successful sync is older than its freshness setting.
        PipelineFreshnessBreached = "pipeline.freshness_breached",
        /// A pipeline that breached its freshness setting synced again.
        PipelineFreshnessRecovered = "pipeline.freshness_recovered",
        /// A write was stored as a proposal for a person to decide.
        ApprovalRequested = "approval.requested",
        /// A proposal was approved or rejected.
        ApprovalDecided = "approval.decided",
        /// A reverse-ETL run ended with rows the destination failed or that were invalid.
        RowsRejected = "rows.rejected",
        /// A sync or reset ended (well or for good): where every record its
        /// last attempt read went, per stream.
        SyncLedger = "sync.ledger",
    }
}

text_enum! {
    /// What a stream's contract does with a record that breaks one of its
    /// rules.
    pub enum ContractMode {
        /// Load it as it is (the destination takes the new column or type
        /// where it can).
        Evolve = "evolve",
        /// Fail the sync before the batch is written, naming the field.
        Freeze = "freeze",
        /// Load the record with the offending value left out (null), and
        /// count it.
        DiscardValue = "discard_value",
        /// Keep the record aside in the rejected-rows table, and load the
        /// rest.
        Quarantine = "quarantine",
    }
}

text_enum! {
    /// The rules of a stream's contract.
    pub enum ContractRule {
        /// A field the stream's schema does not declare.
        NewColumns = "new_columns",
        /// A value of a type (or outside an enumeration) the schema does
        /// not allow for its field.
        TypeChanges = "type_changes",
        /// A record that is not an object, or lacks a required field or its
        /// primary key.
        InvalidRecords = "invalid_records",
    }
}

text_enum! {
    /// Why a record broke its stream's contract.
    pub enum RejectionReason {
        NewColumn = "new_column",
        TypeMismatch = "type_mismatch",
        NotInEnum = "not_in_enum",
        /// A number with more places or digits than its declared decimal.
        DecimalOutOfRange = "decimal_out_of_range",
        MissingRequired = "missing_required",
        MissingPrimaryKey = "missing_primary_key",
        NotAnObject = "not_an_object",
    }
}

text_enum! {
    /// Where a webhook delivery is.
    pub enum DeliveryStatus {
        /// Waiting for its (next) attempt.
        Pending = "pending",
        /// The receiver answered 2xx.
        Delivered = "delivered",
        /// Every attempt failed for the whole retry window.
        Failed = "failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_keep_their_stored_names() {
        assert_eq!(serde_json::to_value(CredentialStatus::NeedsReauthorization).unwrap(), "needs_reauthorization");
        assert_eq!(CredentialKind::parse("api_token"), Some(CredentialKind::ApiToken));
        assert_eq!(JobKind::choices(), "sync, reset, replay, activation_run or activation_resync");
        assert_eq!(ContractMode::choices(), "evolve, freeze, discard_value or quarantine");
        assert_eq!(ContractRule::choices(), "new_columns, type_changes or invalid_records");
        assert_eq!(DestinationKind::choices(), "sqlite, postgres, jsonl or iceberg");
        for s in JobStatus::ALL {
            assert_eq!(JobStatus::parse(s.as_str()), Some(*s));
        }
    }
}
