//! What a pipeline is built from: workspaces and their members,
//! connectors, credentials (their secrets typed only on the service's
//! entry page, never on the command line), sources with their entity
//! options, and destinations.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use super::body::{Body, Fields, json_object};
use super::context::{Ctx, Page, seg};
use super::render::{Column, text_at};
use crate::cli::client::CliFailure;

const WORKSPACES: &[Column] = &[
    Column("WORKSPACE", "workspace_id"),
    Column("NAME", "name"),
    Column("ROLE", "role"),
    Column("CREATED", "created_at"),
];
const MEMBERS: &[Column] = &[
    Column("MEMBER", "member_id"),
    Column("EMAIL", "email"),
    Column("NAME", "name"),
    Column("ROLE", "role"),
    Column("JOINED", "joined_at"),
];
const CONNECTORS: &[Column] = &[
    Column("CONNECTOR", "connector_id"),
    Column("NAME", "name"),
    Column("VERSION", "version"),
    Column("KIND", "kind"),
    Column("STATUS", "status"),
];
const CREDENTIALS: &[Column] = &[
    Column("CREDENTIAL", "credential_id"),
    Column("HANDLE", "credential_handle"),
    Column("KIND", "kind"),
    Column("LABEL", "label"),
    Column("STATUS", "status"),
    Column("CREATED", "created_at"),
];
const SOURCES: &[Column] = &[
    Column("SOURCE", "source_id"),
    Column("NAME", "name"),
    Column("CONNECTOR", "connector_id"),
    Column("CREATED", "created_at"),
];
const DESTINATIONS: &[Column] = &[
    Column("DESTINATION", "destination_id"),
    Column("NAME", "name"),
    Column("KIND", "kind"),
    Column("CREATED", "created_at"),
];
const OPTIONS: &[Column] = &[Column("VALUE", "value"), Column("LABEL", "label"), Column("PARENT", "parent")];

#[derive(Debug, clap::Subcommand)]
pub enum WorkspacesCommand {
    /// The workspaces you belong to, with your role in each.
    List(Page),
}

#[derive(Debug, clap::Subcommand)]
pub enum MembersCommand {
    /// The members of the workspace (`--workspace`, else your default).
    List(Page),
    /// Invite someone by e-mail; prints the single-use link to send them.
    Invite {
        /// Their e-mail address.
        email: String,
        /// Their role: administrator, editor or viewer.
        #[arg(long, default_value = "viewer")]
        role: String,
        /// Hours until the invitation expires (1–336).
        #[arg(long)]
        expires_in_hours: Option<u32>,
    },
    /// Remove a member from the workspace.
    Remove { member_id: String },
}

#[derive(Debug, clap::Subcommand)]
pub enum ConnectorsCommand {
    /// The connectors this service offers, and whether each is available.
    List(Page),
    /// One connector: its kind, version, operations.
    Get { connector_id: String },
    /// The configuration a connector's sources take (JSON Schema).
    Spec { connector_id: String },
}

#[derive(Debug, clap::Subcommand)]
pub enum CredentialsCommand {
    /// The workspace's credentials (never their secrets).
    List(Page),
    /// One credential's record.
    Get { credential_id: String },
    /// Store a credential: opens the service's entry page in the browser,
    /// where the secret is typed, and waits for its handle. The secret
    /// never passes through this command.
    Create {
        /// What the secret is: api_token, basic, secret (oauth2 credentials
        /// come from `credentials/source/oauth/start`).
        #[arg(long, default_value = "api_token")]
        kind: String,
        /// The connector the credential is for (its hosts are allowed).
        #[arg(long)]
        connector: Option<String>,
        /// A host the secret may be sent to (repeatable).
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// What the credential is for.
        #[arg(long)]
        label: Option<String>,
        /// The username of a `basic` credential. Left out, the entry page
        /// asks for it beside the secret (as for an access key's id).
        #[arg(long)]
        username: Option<String>,
        /// The header a `secret` credential is sent in.
        #[arg(long)]
        header: Option<String>,
        /// Print the address to open instead of opening a browser.
        #[arg(long)]
        no_browser: bool,
    },
    /// Revoke a credential: it stops working at once and its secret is
    /// destroyed.
    Revoke { credential_id: String },
}

#[derive(Debug, clap::Subcommand)]
pub enum SourcesCommand {
    /// The workspace's sources.
    List(Page),
    /// One source, with warnings about its credential.
    Get { source_id: String },
    /// Create a source of a connector.
    Create {
        /// Its name.
        #[arg(long)]
        name: Option<String>,
        /// The connector.
        #[arg(long)]
        connector: Option<String>,
        /// Its configuration (JSON object, `@FILE` or `-`), with credential
        /// handles, never secrets.
        #[arg(long, value_name = "JSON", value_parser = json_object)]
        config: Option<Value>,
        #[command(flatten)]
        fields: Fields,
    },
    /// Change a source's name or configuration (fields given are merged).
    Update {
        source_id: String,
        #[arg(long)]
        name: Option<String>,
        #[arg(long, value_name = "JSON", value_parser = json_object)]
        config: Option<Value>,
        #[command(flatten)]
        fields: Fields,
    },
    /// Delete a source no pipeline uses.
    Delete { source_id: String },
    /// The options a configuration field offers (portal, brands, channels),
    /// read from the provider with a credential.
    Entities {
        /// The field: portal_id, brand_ids, channel_ids.
        field: String,
        #[arg(long)]
        connector: String,
        /// The credential handle to read them with.
        #[arg(long)]
        credential: String,
        /// What was chosen so far (JSON object).
        #[arg(long, value_name = "JSON", value_parser = json_object)]
        config: Option<Value>,
        #[command(flatten)]
        page: Page,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum DestinationsCommand {
    /// The workspace's destinations.
    List(Page),
    /// One destination.
    Get { destination_id: String },
    /// Create a destination (a warehouse pipelines load into).
    Create {
        #[arg(long)]
        name: Option<String>,
        /// Its kind: sqlite, postgres, jsonl, iceberg.
        #[arg(long)]
        kind: Option<String>,
        /// Its configuration (JSON object, `@FILE` or `-`).
        #[arg(long, value_name = "JSON", value_parser = json_object)]
        config: Option<Value>,
        #[command(flatten)]
        fields: Fields,
    },
    /// Change a destination's name or configuration (fields given are merged).
    Update {
        destination_id: String,
        #[arg(long)]
        name: Option<String>,
        #[arg(long, value_name = "JSON", value_parser = json_object)]
        config: Option<Value>,
        #[command(flatten)]
        fields: Fields,
    },
    /// Delete a destination no pipeline uses.
    Delete { destination_id: String },
}

/// The workspace a path names: `--workspace`, else the caller's default.
async fn workspace_id(ctx: &Ctx, chosen: Option<&str>) -> Result<String, CliFailure> {
    if let Some(w) = chosen {
        return Ok(w.to_owned());
    }
    let me = ctx.client.call(Method::GET, "me", None).await?;
    me.get("default_workspace_id")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| CliFailure::Other("you belong to no workspace".into()))
}

pub(crate) async fn workspaces(ctx: &Ctx, cmd: WorkspacesCommand) -> Result<(), CliFailure> {
    match cmd {
        WorkspacesCommand::List(page) => ctx.list("workspaces", &page.query(), WORKSPACES).await,
    }
}

pub(crate) async fn members(ctx: &Ctx, workspace: Option<&str>, cmd: MembersCommand) -> Result<(), CliFailure> {
    let ws = seg(&workspace_id(ctx, workspace).await?);
    match cmd {
        MembersCommand::List(page) => ctx.list(&format!("workspaces/{ws}/members"), &page.query(), MEMBERS).await,
        MembersCommand::Invite { email, role, expires_in_hours } => {
            let mut body = Body::default();
            body.opt("email", Some(email)).opt("role", Some(role)).opt("expires_in_hours", expires_in_hours);
            ctx.write(Method::POST, &format!("workspaces/{ws}/members/invitations"), Some(body.into_value()), |d| {
                format!(
                    "Invited {} as {} (invitation {}, until {}).\nSend them this link; it works once and is not shown again:\n  {}",
                    text_at(d, "email"),
                    text_at(d, "role"),
                    text_at(d, "invitation_id"),
                    text_at(d, "expires_at"),
                    text_at(d, "accept_url")
                )
            })
            .await
            .map(drop)
        }
        MembersCommand::Remove { member_id } => ctx
            .write(Method::DELETE, &format!("workspaces/{ws}/members/{}", seg(&member_id)), None, |_| {
                format!("Removed member {member_id}")
            })
            .await
            .map(drop),
    }
}

pub(crate) async fn connectors(ctx: &Ctx, cmd: ConnectorsCommand) -> Result<(), CliFailure> {
    match cmd {
        ConnectorsCommand::List(page) => ctx.list("connectors", &page.query(), CONNECTORS).await,
        ConnectorsCommand::Get { connector_id } => ctx.show(&format!("connectors/{}", seg(&connector_id))).await,
        ConnectorsCommand::Spec { connector_id } => {
            // A schema is deep: it reads best as JSON either way.
            let data = ctx.client.call(Method::GET, &format!("connectors/{}/spec", seg(&connector_id)), None).await?;
            ctx.out.print_json(&data);
            Ok(())
        }
    }
}

pub(crate) async fn credentials(ctx: &Ctx, cmd: CredentialsCommand) -> Result<(), CliFailure> {
    match cmd {
        CredentialsCommand::List(page) => ctx.list("credentials", &page.query(), CREDENTIALS).await,
        CredentialsCommand::Get { credential_id } => ctx.show(&format!("credentials/{}", seg(&credential_id))).await,
        CredentialsCommand::Revoke { credential_id } => ctx
            .write(Method::POST, &format!("credentials/{}/revoke", seg(&credential_id)), None, |d| {
                let users = text_at(d, "sources_using_it");
                format!("Revoked credential {credential_id}; sources that used it: {users}")
            })
            .await
            .map(drop),
        CredentialsCommand::Create { kind, connector, hosts, label, username, header, no_browser } => {
            let mut body = Body::default();
            body.opt("kind", Some(kind))
                .opt("connector_id", connector)
                .opt("label", label)
                .opt("username", username)
                .opt("header", header);
            if !hosts.is_empty() {
                body.opt("hosts", Some(json!(hosts)));
            }
            let answer =
                ctx.client.send(Method::POST, "credentials/entry-links", &[], Some(&body.into_value())).await?;
            if answer.proposal().is_some() {
                ctx.out.write(&answer, |_| String::new());
                return Ok(());
            }
            let link = answer.data;
            let (entry_id, url) = (text_at(&link, "entry_id"), text_at(&link, "url"));
            let opened = !no_browser && crate::cli::auth::open_browser(&url);
            eprintln!(
                "{}",
                if opened {
                    "Opened the credential entry page in your browser. If it did not open, visit:"
                } else {
                    "Open this address in a browser and type the secret there:"
                }
            );
            eprintln!("  {url}");
            eprintln!("Waiting for the secret to be entered (until {})…", text_at(&link, "expires_at"));
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let state =
                    ctx.client.call(Method::GET, &format!("credentials/entry-links/{}", seg(&entry_id)), None).await?;
                match state.get("status").and_then(Value::as_str) {
                    Some("completed") => {
                        if ctx.out.json {
                            ctx.out.print_json(&state);
                        } else {
                            println!("Stored credential {}; use it as", text_at(&state, "credential_id"));
                            println!("  {}", text_at(&state, "credential_handle"));
                        }
                        return Ok(());
                    }
                    Some("pending") => {}
                    _ => {
                        return Err(CliFailure::Other(format!(
                            "the entry page expired before a secret was entered (entry {entry_id}); run the command again"
                        )));
                    }
                }
            }
        }
    }
}

pub(crate) async fn sources(ctx: &Ctx, cmd: SourcesCommand) -> Result<(), CliFailure> {
    match cmd {
        SourcesCommand::List(page) => ctx.list("sources", &page.query(), SOURCES).await,
        SourcesCommand::Get { source_id } => ctx.show(&format!("sources/{}", seg(&source_id))).await,
        SourcesCommand::Create { name, connector, config, fields } => {
            let mut body = fields.body();
            body.opt("name", name).opt("connector_id", connector).opt("configuration", config);
            body.require(&[("name", "--name"), ("connector_id", "--connector"), ("configuration", "--config")])?;
            ctx.write(Method::POST, "sources", Some(body.into_value()), |d| {
                format!("Created source {} ({})", text_at(d, "source_id"), text_at(d, "name"))
            })
            .await
            .map(drop)
        }
        SourcesCommand::Update { source_id, name, config, fields } => {
            let mut body = fields.body();
            body.opt("name", name).opt("configuration", config);
            ctx.write(Method::PATCH, &format!("sources/{}", seg(&source_id)), Some(body.into_value()), |d| {
                format!("Updated source {} ({})", text_at(d, "source_id"), text_at(d, "name"))
            })
            .await
            .map(drop)
        }
        SourcesCommand::Delete { source_id } => ctx
            .write(Method::DELETE, &format!("sources/{}", seg(&source_id)), None, |_| {
                format!("Deleted source {source_id}")
            })
            .await
            .map(drop),
        SourcesCommand::Entities { field, connector, credential, config, page } => {
            let mut body = Body::default();
            body.opt("connector_id", Some(connector))
                .opt("credential_handle", Some(credential))
                .opt("field", Some(field))
                .opt("configuration", config);
            let answer =
                ctx.client.send(Method::POST, "sources/entities", &page.query(), Some(&body.into_value())).await?;
            let mut data = answer.data;
            // Shown as a page of options.
            if let Some(options) = data.get_mut("options").map(Value::take) {
                data["items"] = options;
            }
            ctx.out.list(&data, OPTIONS);
            Ok(())
        }
    }
}

pub(crate) async fn destinations(ctx: &Ctx, cmd: DestinationsCommand) -> Result<(), CliFailure> {
    match cmd {
        DestinationsCommand::List(page) => ctx.list("destinations", &page.query(), DESTINATIONS).await,
        DestinationsCommand::Get { destination_id } => {
            ctx.show(&format!("destinations/{}", seg(&destination_id))).await
        }
        DestinationsCommand::Create { name, kind, config, fields } => {
            let mut body = fields.body();
            body.opt("name", name).opt("kind", kind).opt("configuration", config);
            body.require(&[("name", "--name"), ("kind", "--kind"), ("configuration", "--config")])?;
            ctx.write(Method::POST, "destinations", Some(body.into_value()), |d| {
                format!("Created destination {} ({})", text_at(d, "destination_id"), text_at(d, "name"))
            })
            .await
            .map(drop)
        }
        DestinationsCommand::Update { destination_id, name, config, fields } => {
            let mut body = fields.body();
            body.opt("name", name).opt("configuration", config);
            ctx.write(Method::PATCH, &format!("destinations/{}", seg(&destination_id)), Some(body.into_value()), |d| {
                format!("Updated destination {} ({})", text_at(d, "destination_id"), text_at(d, "name"))
            })
            .await
            .map(drop)
        }
        DestinationsCommand::Delete { destination_id } => ctx
            .write(Method::DELETE, &format!("destinations/{}", seg(&destination_id)), None, |_| {
                format!("Deleted destination {destination_id}")
            })
            .await
            .map(drop),
    }
}
