//! Reverse ETL: models (read-only queries of a warehouse), destinations
//! records are sent to, activations that map one onto the other, and
//! their runs — with `--wait`, the run's counts live until its outcome.

use reqwest::Method;
use serde_json::{Value, json};

use super::body::{Body, Fields, json_object};
use super::context::{Ctx, Page, seg};
use super::pipelines::ScheduleArgs;
use super::progress::{Awaited, wait};
use super::render::{Column, text_at};
use crate::cli::client::CliFailure;

const MODELS: &[Column] = &[
    Column("MODEL", "model_id"),
    Column("NAME", "name"),
    Column("WAREHOUSE", "warehouse_id"),
    Column("KEY", "primary_key"),
    Column("QUERY", "query"),
];
const DESTINATIONS: &[Column] = &[
    Column("DESTINATION", "destination_id"),
    Column("NAME", "name"),
    Column("KIND", "kind"),
    Column("CREATED", "created_at"),
];
const ACTIVATIONS: &[Column] = &[
    Column("ACTIVATION", "activation_id"),
    Column("NAME", "name"),
    Column("MODEL", "model_id"),
    Column("DESTINATION", "destination_id"),
    Column("MODE", "mode"),
    Column("SCHEDULE", "schedule.kind"),
    Column("PAUSED", "paused"),
];

#[derive(Debug, clap::Subcommand)]
pub enum ReverseEtlCommand {
    /// Try a query or a saved model: its columns, sample rows, and the
    /// suggested key and mappings for a destination.
    Prepare {
        /// A saved model.
        #[arg(long, conflicts_with_all = ["warehouse", "query"])]
        model: Option<String>,
        /// The warehouse (a destination of pipelines) to query.
        #[arg(long, requires = "query")]
        warehouse: Option<String>,
        /// A read-only SQL query.
        #[arg(long, requires = "warehouse")]
        query: Option<String>,
        /// A destination to suggest mappings for.
        #[arg(long)]
        destination: Option<String>,
    },
    /// Models: read-only queries of a warehouse, keyed by a column.
    #[command(subcommand)]
    Models(ModelsCommand),
    /// Where records are sent: a connector or a webhook.
    #[command(subcommand)]
    Destinations(DestinationsCommand),
    /// A model's rows mapped onto a destination's records, on a schedule.
    #[command(subcommand)]
    Activations(ActivationsCommand),
    /// Runs of activations.
    #[command(subcommand)]
    Runs(RunsCommand),
}

#[derive(Debug, clap::Subcommand)]
pub enum ModelsCommand {
    List(Page),
    /// Save a model; its query is checked read-only by running it for one row.
    Create {
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        warehouse: Option<String>,
        #[arg(long)]
        query: Option<String>,
        /// The column that identifies a row.
        #[arg(long)]
        primary_key: Option<String>,
        #[command(flatten)]
        fields: Fields,
    },
    Update {
        model_id: String,
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        warehouse: Option<String>,
        #[arg(long)]
        query: Option<String>,
        #[arg(long)]
        primary_key: Option<String>,
        #[command(flatten)]
        fields: Fields,
    },
    /// Delete a model no activation uses.
    Delete {
        model_id: String,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum DestinationsCommand {
    List(Page),
    Create {
        #[arg(long)]
        name: Option<String>,
        /// connector or webhook.
        #[arg(long)]
        kind: Option<String>,
        /// Its configuration (JSON object, `@FILE` or `-`).
        #[arg(long, value_name = "JSON", value_parser = json_object)]
        config: Option<Value>,
        #[command(flatten)]
        fields: Fields,
    },
    Update {
        destination_id: String,
        #[arg(long)]
        name: Option<String>,
        #[arg(long, value_name = "JSON", value_parser = json_object)]
        config: Option<Value>,
        #[command(flatten)]
        fields: Fields,
    },
    /// Delete a destination no activation uses.
    Delete {
        destination_id: String,
    },
}

/// `FIELD=COLUMN`: a destination field and the model column it takes.
fn mapping(arg: &str) -> Result<Value, String> {
    match arg.split_once('=') {
        Some((field, column)) if !field.is_empty() && !column.is_empty() => {
            Ok(json!({ "field": field, "column": column }))
        }
        _ => Err("must be FIELD=COLUMN".into()),
    }
}

/// `FIELD=VALUE`: a destination field and a constant (JSON, else text).
fn constant(arg: &str) -> Result<Value, String> {
    match arg.split_once('=') {
        Some((field, value)) if !field.is_empty() => Ok(
            json!({ "field": field, "value": serde_json::from_str::<Value>(value).unwrap_or_else(|_| Value::String(value.to_owned())) }),
        ),
        _ => Err("must be FIELD=VALUE".into()),
    }
}

/// The options an activation is made of.
#[derive(Debug, clap::Args)]
pub struct ActivationArgs {
    #[arg(long)]
    name: Option<String>,
    #[arg(long)]
    model: Option<String>,
    #[arg(long)]
    destination: Option<String>,
    /// A destination field taken from a model column, `FIELD=COLUMN`
    /// (repeatable; with `--constant`, replaces the mappings).
    #[arg(long = "map", value_parser = mapping)]
    maps: Vec<Value>,
    /// A destination field set to a constant, `FIELD=VALUE` (repeatable).
    #[arg(long = "constant", value_parser = constant)]
    constants: Vec<Value>,
    /// upsert, update_only, insert_only or mirror.
    #[arg(long)]
    mode: Option<String>,
    /// Whether scheduled runs are paused.
    #[arg(long)]
    paused: Option<bool>,
    #[command(flatten)]
    schedule: ScheduleArgs,
    #[command(flatten)]
    fields: Fields,
}

impl ActivationArgs {
    fn body(self) -> Body {
        let mut body = self.fields.body();
        body.opt("name", self.name)
            .opt("model_id", self.model)
            .opt("destination_id", self.destination)
            .opt("mode", self.mode)
            .opt("paused", self.paused);
        body.opt("schedule", self.schedule.value());
        let mappings: Vec<Value> = self.maps.into_iter().chain(self.constants).collect();
        if !mappings.is_empty() {
            body.opt("mappings", Some(Value::Array(mappings)));
        }
        body
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum ActivationsCommand {
    List(Page),
    Create(ActivationArgs),
    Update {
        activation_id: String,
        #[command(flatten)]
        args: ActivationArgs,
    },
    /// Delete an activation (refused while it runs).
    Delete {
        activation_id: String,
    },
    /// Run an activation now: send what changed since its last run.
    Run {
        activation_id: String,
        /// Send every row again, not only what changed.
        #[arg(long)]
        full_resync: bool,
        /// Wait for the run to end, showing its counts; exits 5 when it did
        /// not succeed.
        #[arg(long)]
        wait: bool,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum RunsCommand {
    /// One run: its phase, counts, and samples of rows that failed.
    Get { run_id: String },
    /// Wait for a run to end, showing its counts.
    Wait { run_id: String },
}

pub(crate) async fn run(ctx: &Ctx, cmd: ReverseEtlCommand) -> Result<(), CliFailure> {
    match cmd {
        ReverseEtlCommand::Prepare { model, warehouse, query, destination } => {
            let mut body = Body::default();
            body.opt("model_id", model)
                .opt("warehouse_id", warehouse)
                .opt("query", query)
                .opt("destination_id", destination);
            let data = ctx.client.call(Method::POST, "reverse-etl/prepare", Some(&body.into_value())).await?;
            if ctx.out.json {
                ctx.out.print_json(&data);
                return Ok(());
            }
            let names: Vec<String> =
                data["columns"].as_array().into_iter().flatten().map(|c| text_at(c, "name")).collect();
            let columns: Vec<Column<'_>> = names.iter().map(|n| Column(n, n)).collect();
            ctx.out.list(&json!({ "items": data["sample_rows"] }), &columns);
            println!("\nSuggested key: {}", text_at(&data, "suggested_primary_key"));
            if let Some(maps) = data["suggested_mappings"].as_array().filter(|m| !m.is_empty()) {
                let flags: Vec<String> = maps
                    .iter()
                    .filter(|m| m.get("column").is_some())
                    .map(|m| format!("--map {}={}", text_at(m, "field"), text_at(m, "column")))
                    .collect();
                println!("Suggested mappings: {}", flags.join(" "));
            }
            Ok(())
        }
        ReverseEtlCommand::Models(cmd) => models(ctx, cmd).await,
        ReverseEtlCommand::Destinations(cmd) => destinations(ctx, cmd).await,
        ReverseEtlCommand::Activations(cmd) => activations(ctx, cmd).await,
        ReverseEtlCommand::Runs(RunsCommand::Get { run_id }) => {
            ctx.show(&format!("reverse-etl/runs/{}", seg(&run_id))).await
        }
        ReverseEtlCommand::Runs(RunsCommand::Wait { run_id }) => wait(ctx, Awaited::Run, &run_id).await,
    }
}

async fn models(ctx: &Ctx, cmd: ModelsCommand) -> Result<(), CliFailure> {
    match cmd {
        ModelsCommand::List(page) => ctx.list("reverse-etl/models", &page.query(), MODELS).await,
        ModelsCommand::Create { name, warehouse, query, primary_key, fields } => {
            let mut body = fields.body();
            body.opt("name", name).opt("warehouse_id", warehouse).opt("query", query).opt("primary_key", primary_key);
            body.require(&[
                ("name", "--name"),
                ("warehouse_id", "--warehouse"),
                ("query", "--query"),
                ("primary_key", "--primary-key"),
            ])?;
            ctx.write(Method::POST, "reverse-etl/models", Some(body.into_value()), |d| {
                format!("Created model {} ({})", text_at(d, "model_id"), text_at(d, "name"))
            })
            .await
            .map(drop)
        }
        ModelsCommand::Update { model_id, name, warehouse, query, primary_key, fields } => {
            let mut body = fields.body();
            body.opt("name", name).opt("warehouse_id", warehouse).opt("query", query).opt("primary_key", primary_key);
            ctx.write(Method::PATCH, &format!("reverse-etl/models/{}", seg(&model_id)), Some(body.into_value()), |d| {
                format!("Updated model {}", text_at(d, "model_id"))
            })
            .await
            .map(drop)
        }
        ModelsCommand::Delete { model_id } => ctx
            .write(Method::DELETE, &format!("reverse-etl/models/{}", seg(&model_id)), None, |_| {
                format!("Deleted model {model_id}")
            })
            .await
            .map(drop),
    }
}

async fn destinations(ctx: &Ctx, cmd: DestinationsCommand) -> Result<(), CliFailure> {
    match cmd {
        DestinationsCommand::List(page) => ctx.list("reverse-etl/destinations", &page.query(), DESTINATIONS).await,
        DestinationsCommand::Create { name, kind, config, fields } => {
            let mut body = fields.body();
            body.opt("name", name).opt("kind", kind).opt("configuration", config);
            body.require(&[("name", "--name"), ("kind", "--kind"), ("configuration", "--config")])?;
            ctx.write(Method::POST, "reverse-etl/destinations", Some(body.into_value()), |d| {
                format!("Created destination {} ({})", text_at(d, "destination_id"), text_at(d, "name"))
            })
            .await
            .map(drop)
        }
        DestinationsCommand::Update { destination_id, name, config, fields } => {
            let mut body = fields.body();
            body.opt("name", name).opt("configuration", config);
            ctx.write(
                Method::PATCH,
                &format!("reverse-etl/destinations/{}", seg(&destination_id)),
                Some(body.into_value()),
                |d| format!("Updated destination {}", text_at(d, "destination_id")),
            )
            .await
            .map(drop)
        }
        DestinationsCommand::Delete { destination_id } => ctx
            .write(Method::DELETE, &format!("reverse-etl/destinations/{}", seg(&destination_id)), None, |_| {
                format!("Deleted destination {destination_id}")
            })
            .await
            .map(drop),
    }
}

async fn activations(ctx: &Ctx, cmd: ActivationsCommand) -> Result<(), CliFailure> {
    match cmd {
        ActivationsCommand::List(page) => ctx.list("reverse-etl/activations", &page.query(), ACTIVATIONS).await,
        ActivationsCommand::Create(args) => {
            let body = args.body();
            body.require(&[
                ("name", "--name"),
                ("model_id", "--model"),
                ("destination_id", "--destination"),
                ("mappings", "--map"),
                ("mode", "--mode"),
            ])?;
            ctx.write(Method::POST, "reverse-etl/activations", Some(body.into_value()), |d| {
                format!("Created activation {} ({})", text_at(d, "activation_id"), text_at(d, "name"))
            })
            .await
            .map(drop)
        }
        ActivationsCommand::Update { activation_id, args } => ctx
            .write(
                Method::PATCH,
                &format!("reverse-etl/activations/{}", seg(&activation_id)),
                Some(args.body().into_value()),
                |d| format!("Updated activation {}", text_at(d, "activation_id")),
            )
            .await
            .map(drop),
        ActivationsCommand::Delete { activation_id } => ctx
            .write(Method::DELETE, &format!("reverse-etl/activations/{}", seg(&activation_id)), None, |_| {
                format!("Deleted activation {activation_id}")
            })
            .await
            .map(drop),
        ActivationsCommand::Run { activation_id, full_resync, wait: wait_for_it } => {
            let body = json!({ "full_resync": full_resync });
            let ran = ctx
                .write(Method::POST, &format!("reverse-etl/activations/{}/run", seg(&activation_id)), Some(body), |d| {
                    format!("Started run {} of {activation_id}", text_at(d, "run_id"))
                })
                .await?;
            match ran {
                Some(run) if wait_for_it => wait(ctx, Awaited::Run, &text_at(&run, "run_id")).await,
                _ => Ok(()),
            }
        }
    }
}
