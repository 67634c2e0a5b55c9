//! A stream's data contract applied as its batches are written: each
//! batch is judged as the loader prepares it, off the async workers, on
//! the fields parsed for the destination (`Loader::write_under`); the
//! rest load, values a rule discards left out, and the records a rule
//! quarantines are written to the stream's rejected-rows table before the
//! batch's checkpoint is queued (so a state saved after the batch covers
//! them too).
//!
//! The rejected-rows table of stream `s` is the destination's table of
//! stream `s__rejected` (`warehouse::contract::rejected_stream`): one row per record kept
//! aside, with the job and attempt, the stream, the cursor's value, the
//! reason, the field's JSON pointer, the rule, and the record as read. In
//! a database its key is derived from the pipeline, the field and where
//! the record was read (in an append the place its row would have had,
//! otherwise its text), so a retry or a later sync that reads the same
//! record again rewrites its row instead of adding another.

use std::sync::Arc;

use serde_json::{Value, json};
use sha2::Digest;

use crate::store::kinds::ContractMode;
use crate::store::pipelines::{StreamContract, StreamSelection, StreamSyncMode};
use crate::warehouse::contract::{Breach, Contract, REJECTION_ID, Rejected, rejected_stream};
use crate::warehouse::shape::parts_hashed;
use crate::warehouse::{Loader, WriteError, Writer, Written};

/// The contract a stream is judged by: its own, else its destination's
/// default, whose `new_columns` rule evolves for a stream that declares
/// no fields (every field would be new).
pub(super) fn contract_of(
    sel: &StreamSelection,
    default: Option<StreamContract>,
    schema: &Value,
) -> Option<StreamContract> {
    sel.contract.or_else(|| {
        default.map(|mut d| {
            if !schema["properties"].is_object() {
                d.new_columns = ContractMode::Evolve;
            }
            d
        })
    })
}

/// The rejected-rows table's schema (what a typed destination makes of
/// it).
pub(super) fn rejected_schema() -> Value {
    let text = json!({ "type": "string" });
    json!({ "type": "object", "properties": {
        REJECTION_ID: text, "job_id": text, "attempt": { "type": "integer" }, "stream": text,
        "cursor": { "type": ["string", "null"] }, "reason": text, "pointer": text, "rule": text,
        "record": text, "rejected_at": text,
    } })
}

/// The rejected-rows table's loader: in a database, a row written again
/// under its rejection replaces the last.
pub(super) fn rejected_loader(writer: &Arc<Writer>, pipeline_id: &str, stream: &str) -> Loader {
    let mode =
        if writer.deduplicates() { StreamSyncMode::IncrementalDeduped } else { StreamSyncMode::IncrementalAppend };
    Loader::new(writer.clone(), pipeline_id, &rejected_stream(stream), mode, vec![REJECTION_ID.to_owned()])
}

/// A rejected row as read back, kept aside again for `breach`: the same
/// rejection, job, attempt, cursor, record and time, the new reason.
pub(super) fn rejected_again(row: &serde_json::Map<String, Value>, breach: &Breach) -> String {
    let mut row = rejected_as_read(row);
    row.extend(new_reason(breach));
    Value::Object(row).to_string()
}

/// A rejected row as read back (its values as text), as it is written:
/// its attempt a number.
pub(super) fn rejected_as_read(row: &serde_json::Map<String, Value>) -> serde_json::Map<String, Value> {
    let mut row = row.clone();
    if let Some(n) = row.get("attempt").and_then(Value::as_str).and_then(|n| n.parse::<u64>().ok()) {
        row.insert("attempt".into(), Value::from(n));
    }
    row
}

/// The fields a rejected row takes when `breach` keeps it aside again.
pub(super) fn new_reason(breach: &Breach) -> serde_json::Map<String, Value> {
    let fields = [
        ("reason", json!(breach.reason.as_str())),
        ("pointer", json!(breach.pointer)),
        ("rule", json!(breach.rule.as_str())),
    ];
    fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// What became of one batch's records besides loading as read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Verdicts {
    /// Written to the rejected-rows table.
    pub(super) quarantined: u64,
    /// Loaded with a value left out.
    pub(super) value_discarded: u64,
}

/// One stream's contract at work in one attempt.
pub(super) struct Judge {
    contract: Arc<Contract>,
    /// The rejected-rows table's loader, when a rule quarantines.
    aside: Option<Loader>,
    pipeline_id: String,
    job_id: String,
    attempt: u32,
    stream: String,
    cursor_field: Option<String>,
}

/// Who the judged records belong to.
pub(super) struct Owner<'a> {
    pub(super) writer: &'a Arc<Writer>,
    pub(super) pipeline_id: &'a str,
    pub(super) job_id: &'a str,
    pub(super) attempt: u32,
    pub(super) stream: &'a str,
    pub(super) cursor_field: Option<String>,
}

impl Judge {
    /// The stream's judge, its rejected-rows table started when a rule
    /// quarantines.
    pub(super) async fn start(owner: Owner<'_>, contract: Contract, quarantines: bool) -> Result<Judge, WriteError> {
        let aside = if quarantines {
            // A database rewrites a row read again; a file or a lakehouse
            // cannot (their readers take the last).
            let mode = if owner.writer.deduplicates() {
                StreamSyncMode::IncrementalDeduped
            } else {
                StreamSyncMode::IncrementalAppend
            };
            owner.writer.begin_rejected(owner.pipeline_id, owner.stream, mode, &rejected_schema()).await?;
            Some(rejected_loader(owner.writer, owner.pipeline_id, owner.stream))
        } else {
            None
        };
        Ok(Judge {
            contract: Arc::new(contract),
            aside,
            pipeline_id: owner.pipeline_id.to_owned(),
            job_id: owner.job_id.to_owned(),
            attempt: owner.attempt,
            stream: owner.stream.to_owned(),
            cursor_field: owner.cursor_field,
        })
    }

    /// Writes `records` through `loader`, judged as they are prepared,
    /// then writes those kept aside and waits for them (before the caller
    /// can queue the batch's checkpoint). A breach of a rule that freezes
    /// fails the batch before any of it is written.
    pub(super) async fn load(
        &mut self,
        loader: &mut Loader,
        records: Vec<String>,
    ) -> Result<(Written, Verdicts), WriteError> {
        let (written, judged) = loader.write_under(records, Some(&self.contract)).await?;
        let mut verdicts = Verdicts { quarantined: 0, value_discarded: judged.value_discarded };
        if !judged.rejected.is_empty() {
            let rows: Vec<String> = judged.rejected.iter().map(|r| self.rejected_row(r)).collect();
            let aside = self.aside.as_mut().ok_or_else(|| {
                WriteError::Destination("a record was quarantined without a rejected-rows table".into())
            })?;
            // Counted as the destination stored them (a row replaced by a
            // later copy in the same batch is one of them): a row that did
            // not land leaves the ledger unbalanced.
            let written = aside.write(rows).await?;
            let settled = aside.settle().await?;
            verdicts.quarantined = [written, settled].iter().map(|w| w.stored + w.deduplicated).sum();
        }
        Ok((written, verdicts))
    }

    /// Waits until every rejected row is written.
    pub(super) async fn finish(&mut self) -> Result<(), WriteError> {
        if let Some(aside) = &mut self.aside {
            aside.drain().await?;
        }
        Ok(())
    }

    /// A record kept aside as a row of the rejected-rows table.
    fn rejected_row(&self, r: &Rejected) -> String {
        // The same record kept aside again, in this job or a later one,
        // rewrites its row: the key is the pipeline's, the stream's, the
        // field's and where the record was read, never the job's.
        let hash = parts_hashed(&[&self.pipeline_id, &self.stream, &r.breach.pointer, &r.place]);
        let cursor = self
            .cursor_field
            .as_deref()
            .and_then(|field| serde_json::from_str::<Value>(&r.record).ok().map(|v| v[field].clone()))
            .filter(|v| !v.is_null())
            .map(|v| match v {
                Value::String(s) => s,
                other => other.to_string(),
            });
        json!({
            REJECTION_ID: hex::encode(hash.finalize()),
            "job_id": self.job_id,
            "attempt": self.attempt,
            "stream": self.stream,
            "cursor": cursor,
            "reason": r.breach.reason.as_str(),
            "pointer": r.breach.pointer,
            "rule": r.breach.rule.as_str(),
            "record": r.record,
            "rejected_at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        })
        .to_string()
    }
}
