//! Pipelines and their jobs: discover a source's streams, create and
//! change pipelines, pause, resume, reset, and sync — with `--wait`, the
//! job's progress live until its outcome.

use reqwest::Method;
use serde_json::{Value, json};

use super::body::{Body, Fields};
use super::context::{Ctx, Page, seg};
use super::progress::{Awaited, wait};
use super::render::{Column, text_at};
use crate::cli::client::CliFailure;

const PIPELINES: &[Column] = &[
    Column("PIPELINE", "pipeline_id"),
    Column("NAME", "name"),
    Column("STATUS", "status"),
    Column("SOURCE", "source_id"),
    Column("DESTINATION", "destination_id"),
    Column("SCHEDULE", "schedule.kind"),
];
const STREAMS: &[Column] = &[
    Column("STREAM", "name"),
    Column("SYNC MODES", "sync_modes"),
    Column("CURSOR", "default_cursor_field"),
    Column("FIELDS", "fields"),
];
const JOBS: &[Column] = &[
    Column("JOB", "job_id"),
    Column("KIND", "kind"),
    Column("STATUS", "status"),
    Column("PIPELINE", "pipeline_id"),
    Column("RECORDS", "progress.records"),
    Column("CREATED", "created_at"),
    Column("FINISHED", "finished_at"),
];
const REJECTED: &[Column] = &[
    Column("JOB", "job_id"),
    Column("ATTEMPT", "attempt"),
    Column("RULE", "rule"),
    Column("REASON", "reason"),
    Column("FIELD", "pointer"),
    Column("CURSOR", "cursor"),
    Column("RECORD", "record"),
];
const LEDGER: &[Column] = &[
    Column("STREAM", "stream"),
    Column("READ", "read"),
    Column("LOADED", "loaded"),
    Column("VALUE DISCARDED", "value_discarded"),
    Column("QUARANTINED", "quarantined"),
    Column("DEDUPLICATED", "deduplicated"),
    Column("LEFT TO RETRY", "left_to_retry"),
    Column("UNACCOUNTED", "unaccounted"),
    Column("SNAPSHOTS", "snapshot_ids"),
];
const ATTEMPTS: &[Column] = &[
    Column("ATTEMPT", "attempt"),
    Column("OUTCOME", "outcome"),
    Column("STARTED", "started_at"),
    Column("FINISHED", "finished_at"),
    Column("ERROR", "error"),
];

/// When a pipeline runs by itself.
#[derive(Debug, Clone, clap::Args)]
#[group(multiple = false)]
pub struct ScheduleArgs {
    /// Run only when asked.
    #[arg(long)]
    manual: bool,
    /// Run every this many minutes.
    #[arg(long, value_name = "MINUTES")]
    every: Option<u32>,
    /// Run on a cron expression (UTC), e.g. `0 6 * * *`.
    #[arg(long, value_name = "EXPRESSION")]
    cron: Option<String>,
}

impl ScheduleArgs {
    /// The schedule chosen, if one was.
    pub fn value(&self) -> Option<Value> {
        match (self.manual, self.every, &self.cron) {
            (true, ..) => Some(json!({ "kind": "manual" })),
            (_, Some(minutes), _) => Some(json!({ "kind": "interval", "minutes": minutes })),
            (_, _, Some(expression)) => Some(json!({ "kind": "cron", "expression": expression })),
            _ => None,
        }
    }
}

/// `NAME[:SYNC_MODE]`: a stream to sync, and how.
fn stream(arg: &str) -> Result<Value, String> {
    let (name, mode) = arg.split_once(':').map_or((arg, None), |(n, m)| (n, Some(m)));
    if name.is_empty() {
        return Err("the stream name must not be empty".into());
    }
    match mode {
        None => Ok(json!({ "name": name })),
        Some(m @ ("full_refresh_overwrite" | "incremental_append" | "incremental_deduped")) => {
            Ok(json!({ "name": name, "sync_mode": m }))
        }
        Some(other) => {
            Err(format!("{other}: the sync mode is full_refresh_overwrite, incremental_append or incremental_deduped"))
        }
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum PipelinesCommand {
    /// The workspace's pipelines.
    List(Page),
    /// One pipeline: its streams, schedule and status.
    Get { pipeline_id: String },
    /// Discover a source's streams and the suggested selection.
    Prepare {
        /// The source.
        #[arg(long)]
        source: String,
    },
    /// Create a pipeline. Without `--stream`, the source's suggested
    /// selection is taken (every stream, its best sync mode).
    Create {
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        source: Option<String>,
        #[arg(long)]
        destination: Option<String>,
        /// A stream, `NAME[:SYNC_MODE]` (repeatable).
        #[arg(long = "stream", value_parser = stream)]
        streams: Vec<Value>,
        #[command(flatten)]
        schedule: ScheduleArgs,
        #[command(flatten)]
        fields: Fields,
    },
    /// Change a pipeline's name, streams or schedule.
    Update {
        pipeline_id: String,
        #[arg(long)]
        name: Option<String>,
        /// The streams, `NAME[:SYNC_MODE]` (repeatable; replaces the selection).
        #[arg(long = "stream", value_parser = stream)]
        streams: Vec<Value>,
        #[command(flatten)]
        schedule: ScheduleArgs,
        #[command(flatten)]
        fields: Fields,
    },
    /// Delete a pipeline (its connection); the destination's data stays.
    Delete { pipeline_id: String },
    /// Stop scheduled syncs until resumed.
    Pause { pipeline_id: String },
    /// Resume scheduled syncs.
    Resume { pipeline_id: String },
    /// Clear what the pipeline synced and its cursors, so the next sync
    /// reads everything again.
    Reset {
        pipeline_id: String,
        /// Wait for the reset to end, showing its progress.
        #[arg(long)]
        wait: bool,
    },
    /// Records a stream's contract kept aside (quarantined), with why.
    Rejected {
        pipeline_id: String,
        /// The stream (needed when the pipeline has several).
        #[arg(long)]
        stream: Option<String>,
        #[command(flatten)]
        page: Page,
    },
    /// Replay the records the pipeline's contracts kept aside: load those
    /// that fit now, keep the rest with their new reason.
    Replay {
        pipeline_id: String,
        /// Wait for the replay to end, showing its progress.
        #[arg(long)]
        wait: bool,
    },
    /// Start a sync now.
    Sync {
        pipeline_id: String,
        /// Wait for the job to end, showing records and bytes per stream
        /// live; exits 5 when it did not succeed.
        #[arg(long)]
        wait: bool,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum JobsCommand {
    /// Jobs, newest first.
    List {
        /// Only this pipeline's jobs.
        #[arg(long)]
        pipeline: Option<String>,
        /// Only this reverse-ETL activation's runs.
        #[arg(long)]
        activation: Option<String>,
        /// Only jobs in this status: queued, running, succeeded, failed, cancelled.
        #[arg(long)]
        status: Option<String>,
        /// Only jobs of this kind: sync, reset, activation_run, activation_resync.
        #[arg(long)]
        kind: Option<String>,
        #[command(flatten)]
        page: Page,
    },
    /// One job with its progress.
    Get { job_id: String },
    /// A job's attempts: which server ran each, and how it ended.
    Attempts { job_id: String },
    /// Wait for a job to end, showing its progress.
    Wait { job_id: String },
    /// Cancel a queued or running job.
    Cancel { job_id: String },
}

/// Starts a job of the pipeline (`what`: a sync, reset or replay, by
/// POSTing to `action`) and, asked to, waits for it.
async fn start(ctx: &Ctx, pipeline_id: &str, action: &str, what: &str, wait_for_it: bool) -> Result<(), CliFailure> {
    let path = format!("pipelines/{}/{action}", seg(pipeline_id));
    let ran = ctx
        .write(Method::POST, &path, None, |d| format!("Started {what} job {} of {pipeline_id}", text_at(d, "job_id")))
        .await?;
    match ran {
        Some(job) if wait_for_it => wait(ctx, Awaited::Job, &text_at(&job, "job_id")).await,
        _ => Ok(()),
    }
}

pub(crate) async fn pipelines(ctx: &Ctx, cmd: PipelinesCommand) -> Result<(), CliFailure> {
    match cmd {
        PipelinesCommand::List(page) => ctx.list("pipelines", &page.query(), PIPELINES).await,
        PipelinesCommand::Get { pipeline_id } => ctx.show(&format!("pipelines/{}", seg(&pipeline_id))).await,
        PipelinesCommand::Rejected { pipeline_id, stream, page } => {
            ctx.list(
                &format!("pipelines/{}/rejected", seg(&pipeline_id)),
                &page.with(vec![("stream", stream)]),
                REJECTED,
            )
            .await
        }
        PipelinesCommand::Prepare { source } => {
            let data =
                ctx.client.call(Method::POST, "pipelines/prepare", Some(&json!({ "source_id": source }))).await?;
            if ctx.out.json {
                ctx.out.print_json(&data);
                return Ok(());
            }
            ctx.out.list(&json!({ "items": data["streams"] }), STREAMS);
            let suggested: Vec<String> = data["suggested_selection"]
                .as_array()
                .map(|s| s.iter().map(|s| format!("{}:{}", text_at(s, "name"), text_at(s, "sync_mode"))).collect())
                .unwrap_or_default();
            println!(
                "\nSuggested: {}",
                suggested.iter().map(|s| format!("--stream {s}")).collect::<Vec<_>>().join(" ")
            );
            for w in data["warnings"].as_array().into_iter().flatten() {
                eprintln!("warning: {}: {}", text_at(w, "stream"), text_at(w, "warning"));
            }
            Ok(())
        }
        PipelinesCommand::Create { name, source, destination, streams, schedule, fields } => {
            let mut body = fields.body();
            body.opt("name", name)
                .opt("source_id", source)
                .opt("destination_id", destination)
                .opt("schedule", schedule.value());
            if !streams.is_empty() {
                body.opt("streams", Some(Value::Array(streams)));
            }
            body.require(&[("name", "--name"), ("source_id", "--source"), ("destination_id", "--destination")])?;
            if !body.0.contains_key("streams") {
                let prep = ctx
                    .client
                    .call(Method::POST, "pipelines/prepare", Some(&json!({ "source_id": body.0["source_id"] })))
                    .await?;
                eprintln!("streams: the suggested selection ({})", text_at(&prep, "suggested_selection"));
                body.opt("streams", Some(prep["suggested_selection"].clone()));
            }
            ctx.write(Method::POST, "pipelines", Some(body.into_value()), |d| {
                format!("Created pipeline {} ({})", text_at(d, "pipeline_id"), text_at(d, "name"))
            })
            .await
            .map(drop)
        }
        PipelinesCommand::Update { pipeline_id, name, streams, schedule, fields } => {
            let mut body: Body = fields.body();
            body.opt("name", name).opt("schedule", schedule.value());
            if !streams.is_empty() {
                body.opt("streams", Some(Value::Array(streams)));
            }
            ctx.write(Method::PATCH, &format!("pipelines/{}", seg(&pipeline_id)), Some(body.into_value()), |d| {
                format!("Updated pipeline {} ({})", text_at(d, "pipeline_id"), text_at(d, "name"))
            })
            .await
            .map(drop)
        }
        PipelinesCommand::Delete { pipeline_id } => ctx
            .write(Method::DELETE, &format!("connections/{}", seg(&pipeline_id)), None, |_| {
                format!("Deleted pipeline {pipeline_id}")
            })
            .await
            .map(drop),
        PipelinesCommand::Pause { pipeline_id } => ctx
            .write(Method::POST, &format!("pipelines/{}/pause", seg(&pipeline_id)), None, |d| {
                format!("Pipeline {pipeline_id} is {}", text_at(d, "status"))
            })
            .await
            .map(drop),
        PipelinesCommand::Resume { pipeline_id } => ctx
            .write(Method::POST, &format!("pipelines/{}/resume", seg(&pipeline_id)), None, |d| {
                format!("Pipeline {pipeline_id} is {}", text_at(d, "status"))
            })
            .await
            .map(drop),
        PipelinesCommand::Reset { pipeline_id, wait } => start(ctx, &pipeline_id, "reset", "reset", wait).await,
        PipelinesCommand::Replay { pipeline_id, wait } => {
            start(ctx, &pipeline_id, "rejected/replay", "replay", wait).await
        }
        PipelinesCommand::Sync { pipeline_id, wait } => start(ctx, &pipeline_id, "sync", "sync", wait).await,
    }
}

pub(crate) async fn jobs(ctx: &Ctx, cmd: JobsCommand) -> Result<(), CliFailure> {
    match cmd {
        JobsCommand::List { pipeline, activation, status, kind, page } => {
            let q = page.with(vec![
                ("pipeline_id", pipeline),
                ("activation_id", activation),
                ("status", status),
                ("kind", kind),
            ]);
            ctx.list("jobs", &q, JOBS).await
        }
        JobsCommand::Get { job_id } => {
            let data = ctx.client.call(Method::GET, &format!("jobs/{}", seg(&job_id)), None).await?;
            ctx.out.record(&data);
            if !ctx.out.json {
                // Every attempt's that ended, oldest first.
                let earlier = data.pointer("/progress/earlier_ledgers").and_then(Value::as_array);
                for ledger in earlier.into_iter().flatten().chain(data.pointer("/progress/ledger")) {
                    print!("{}", ledger_table(ledger));
                }
            }
            Ok(())
        }
        JobsCommand::Attempts { job_id } => {
            let data = ctx.client.call(Method::GET, &format!("jobs/{}/attempts", seg(&job_id)), None).await?;
            ctx.out.list(&data, ATTEMPTS);
            Ok(())
        }
        JobsCommand::Wait { job_id } => wait(ctx, Awaited::Job, &job_id).await,
        JobsCommand::Cancel { job_id } => ctx
            .write(Method::POST, &format!("jobs/{}/cancel", seg(&job_id)), None, |d| {
                format!("Job {job_id} is {}", text_at(d, "status"))
            })
            .await
            .map(drop),
    }
}

/// A job's ledger for people: whether it balances, and a row per stream.
fn ledger_table(ledger: &Value) -> String {
    let balanced = if ledger["balanced"] == true { "balanced" } else { "DOES NOT BALANCE" };
    let streams: Vec<Value> = ledger["streams"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, counts)| {
            let mut row = counts.clone();
            row["stream"] = json!(name);
            row
        })
        .collect();
    format!(
        "\nLedger of attempt {}: {balanced}\n{}",
        text_at(ledger, "attempt"),
        super::render::table(&streams, LEDGER)
    )
}
