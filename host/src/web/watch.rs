//! Read-only pages for watching the data: pipelines (last run, status,
//! freshness), one pipeline (schedule, streams, recent jobs), reverse-ETL
//! activations and one activation (recent runs), and one job or run with
//! its attempts, error and per-stream progress.
//!
//! For signed-in members of the workspace (any role), through their
//! browser session; served with the headers every page has. They hold no
//! form, and work without JavaScript: a job's page shows the state it was
//! served with, and its one script (from this server, never inline)
//! follows the job's event stream to redraw the progress as it changes.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use serde_json::Value;

use super::accounts::member_access;
use super::page::{CSP_FORMS_TO_SELF, escape, page_with_style};
use super::signin::browser_session;
use crate::access::WorkspaceAccess;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::jobs::{Job, JobFilter, JobOwner};
use crate::store::pipelines::{Pipeline, Schedule};
use crate::store::progress::{JobProgress, SyncLedger};

/// Items a list shows at most.
const LISTED: i64 = 200;
/// Recent jobs or runs a pipeline's or activation's page shows.
const RECENT: i64 = 20;

const STYLE: &str = "table{border-collapse:collapse;width:100%;margin-bottom:1.5rem}td,th{border-top:1px solid #ddd;padding:.4rem .5rem;text-align:left;vertical-align:top}\
    th{font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}nav a{margin-right:1rem}.muted{color:#666}\
    .succeeded,.fresh{color:#176f2c}.failed,.stale{color:#b3261e}.running,.queued{color:#8a5a00}dl{display:grid;grid-template-columns:max-content 1fr;gap:.25rem 1.5rem}dt{font-weight:600}dd{margin:0}    h1{margin-bottom:.5rem}h2{margin-top:1.5rem}";

/// The policy of a job's page: the shared one, and its own script with
/// the event stream it reads.
const CSP_LIVE: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; script-src 'self'; connect-src 'self'";

/// The script of a job's page.
const JOB_SCRIPT: &str = include_str!("job.js");

#[derive(Deserialize)]
pub(crate) struct Which {
    workspace_id: Option<String>,
}

/// The member a page is for, or the response that sends them to sign in
/// or says why not.
async fn viewer(state: &AppState, headers: &HeaderMap, which: &Which, here: &str) -> Result<WorkspaceAccess, Response> {
    let Some(session) = browser_session(state, headers).await else {
        return Err(Redirect::to(&format!("/sign-in?next={here}")).into_response());
    };
    member_access(state, &session, which.workspace_id.as_deref()).await.map_err(|e| failed(&e))
}

fn failed(e: &ApiError) -> Response {
    let body = e.body();
    (
        e.status,
        page_with_style(
            "Not available",
            "",
            &format!(
                "<p>{}: {}</p><p><a href=\"/pipelines\">Pipelines</a></p>",
                escape(&body.code),
                escape(&body.message)
            ),
        ),
    )
        .into_response()
}

fn time(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string()).unwrap_or_else(|| "—".into())
}

fn status(s: &str) -> String {
    format!("<span class=\"{s}\">{s}</span>", s = escape(s))
}

fn schedule(s: &Schedule) -> String {
    match s {
        Schedule::Manual => "manual".into(),
        Schedule::Interval { minutes } => format!("every {minutes} min"),
        Schedule::Cron { expression } => format!("cron <code>{}</code>", escape(expression)),
    }
}

fn freshness(p: &Pipeline) -> String {
    match (p.freshness_minutes, p.freshness_breached_at) {
        (None, _) => "<span class=\"muted\">no setting</span>".into(),
        (Some(m), Some(since)) => {
            format!("<span class=\"stale\">stale</span> since {} (limit {m} min)", escape(&time(Some(since))))
        }
        (Some(m), None) => format!("<span class=\"fresh\">fresh</span> (limit {m} min)"),
    }
}

/// `?workspace_id=…` for links within the viewer's workspace.
fn ws_query(viewer: &WorkspaceAccess) -> String {
    format!("?workspace_id={}", escape(&viewer.workspace_id))
}

/// The links to the other workspaces of the member, and this page's kin.
async fn header_nav(state: &AppState, viewer: &WorkspaceAccess, path: &str) -> Result<String, ApiError> {
    let (me, workspaces) = state
        .store
        .user_with_workspaces(&viewer.principal.user_id, 200)
        .await?
        .ok_or_else(|| ApiError::unauthenticated("no such user"))?;
    let others: String = workspaces
        .iter()
        .map(|w| {
            let name = escape(&w.name);
            if w.workspace_id == viewer.workspace_id {
                format!("<strong>{name}</strong> ")
            } else {
                format!("<a href=\"{path}?workspace_id={}\">{name}</a> ", escape(&w.workspace_id))
            }
        })
        .collect();
    Ok(format!(
        "<p>Signed in as {email} ({role} here). <a href=\"/account\">Account</a></p>\
         <nav><a href=\"/pipelines{q}\">Pipelines</a><a href=\"/reverse-etl/activations{q}\">Reverse ETL</a>\
         <a href=\"/approvals{q}\">Approvals</a></nav><p class=\"muted\">Workspaces: {others}</p>",
        email = escape(&me.email),
        role = viewer.role.as_str(),
        q = ws_query(viewer),
    ))
}

fn job_row(viewer: &WorkspaceAccess, j: &Job) -> String {
    format!(
        "<tr><td><a href=\"/jobs/{id}{q}\">{id}</a></td><td>{kind}</td><td>{status}</td><td>{trigger}</td>\
         <td>{created}</td><td>{finished}</td><td class=\"n\">{records}</td></tr>",
        id = escape(&j.job_id),
        q = ws_query(viewer),
        kind = j.kind.as_str(),
        status = status(j.status.as_str()),
        trigger = j.trigger.as_str(),
        created = time(Some(j.created_at)),
        finished = time(j.finished_at),
        records = j.progress.sync().map(|p| p.records.to_string()).unwrap_or_default(),
    )
}

/// The cell of a list's "last run": its owner's newest job, if any.
fn last_run(viewer: &WorkspaceAccess, last: Option<&Job>) -> String {
    match last {
        Some(j) => format!(
            "{} <a href=\"/jobs/{id}{q}\">{when}</a>",
            status(j.status.as_str()),
            id = escape(&j.job_id),
            q = ws_query(viewer),
            when = time(j.finished_at.or(j.started_at).or(Some(j.created_at)))
        ),
        None => "<span class=\"muted\">never run</span>".into(),
    }
}

const JOB_HEAD: &str = "<tr><th>Job</th><th>Kind</th><th>Status</th><th>Trigger</th><th>Created</th><th>Finished</th><th>Records</th></tr>";

/// `GET /pipelines`: the workspace's pipelines.
pub(crate) async fn pipelines_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(which): Query<Which>,
) -> Response {
    let viewer = match viewer(&state, &headers, &which, "/pipelines").await {
        Ok(v) => v,
        Err(r) => return r,
    };
    render(pipelines(&state, &viewer).await, "Pipelines")
}

fn render(body: Result<String, ApiError>, title: &str) -> Response {
    match body {
        Ok(body) => page_with_style(title, STYLE, &body).into_response(),
        Err(e) => failed(&e),
    }
}

async fn pipelines(state: &AppState, viewer: &WorkspaceAccess) -> Result<String, ApiError> {
    let nav = header_nav(state, viewer, "/pipelines").await?;
    let list = state.store.pipelines(&viewer.workspace_id, None, LISTED).await?;
    let ids: Vec<String> = list.iter().map(|p| p.pipeline_id.clone()).collect();
    let lasts = state.store.last_jobs(&viewer.workspace_id, JobOwner::Pipeline, &ids).await?;
    let mut rows = String::new();
    for p in &list {
        let last = last_run(viewer, lasts.get(&p.pipeline_id));
        rows.push_str(&format!(
            "<tr><td><a href=\"/pipelines/{id}{q}\">{name}</a></td><td>{state}</td><td>{schedule}</td><td>{last}</td>\
             <td>{freshness}</td><td>{success}</td></tr>",
            id = escape(&p.pipeline_id),
            q = ws_query(viewer),
            name = escape(&p.name),
            state = p.status.as_str(),
            schedule = schedule(&p.schedule),
            freshness = freshness(p),
            success = time(p.last_succeeded_at),
        ));
    }
    let table = if rows.is_empty() {
        "<p>No pipelines in this workspace yet.</p>".to_owned()
    } else {
        format!(
            "<table><thead><tr><th>Pipeline</th><th>Status</th><th>Schedule</th><th>Last run</th><th>Freshness</th>\
             <th>Last success</th></tr></thead><tbody>{rows}</tbody></table>"
        )
    };
    Ok(format!("{nav}{table}"))
}

/// `GET /pipelines/{pipeline_id}`: one pipeline and its recent jobs.
pub(crate) async fn pipeline_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(which): Query<Which>,
) -> Response {
    let viewer = match viewer(&state, &headers, &which, "/pipelines").await {
        Ok(v) => v,
        Err(r) => return r,
    };
    render(pipeline(&state, &viewer, &id).await, "Pipeline")
}

async fn pipeline(state: &AppState, viewer: &WorkspaceAccess, id: &str) -> Result<String, ApiError> {
    let nav = header_nav(state, viewer, "/pipelines").await?;
    let p = state.store.pipeline(&viewer.workspace_id, id).await?.ok_or_else(|| ApiError::not_found("pipeline"))?;
    let streams: String = p
        .streams
        .iter()
        .map(|s| {
            format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&s.name),
                escape(
                    &serde_json::to_value(s.sync_mode)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                ),
                escape(s.cursor_field.as_deref().unwrap_or("default")),
                escape(&s.primary_key.as_ref().map(|k| k.join(", ")).unwrap_or_else(|| "default".into())),
            )
        })
        .collect();
    let filter = JobFilter { pipeline_id: Some(p.pipeline_id.clone()), ..Default::default() };
    let jobs = state.store.jobs(&viewer.workspace_id, &filter, None, RECENT).await?;
    let rows: String = jobs.iter().map(|j| job_row(viewer, j)).collect();
    let jobs = if rows.is_empty() {
        "<p>No jobs yet.</p>".to_owned()
    } else {
        format!("<table><thead>{JOB_HEAD}</thead><tbody>{rows}</tbody></table>")
    };
    Ok(format!(
        "{nav}<h2>{name}</h2><dl><dt>Status</dt><dd>{state}</dd><dt>Schedule</dt><dd>{schedule}</dd>\
         <dt>Freshness</dt><dd>{freshness}</dd><dt>Last success</dt><dd>{success}</dd>\
         <dt>Source → destination</dt><dd><code>{source}</code> → <code>{dest}</code></dd></dl>\
         <h2>Streams</h2><table><thead><tr><th>Stream</th><th>Mode</th><th>Cursor</th><th>Primary key</th></tr></thead>\
         <tbody>{streams}</tbody></table><h2>Recent jobs</h2>{jobs}",
        name = escape(&p.name),
        state = p.status.as_str(),
        schedule = schedule(&p.schedule),
        freshness = freshness(&p),
        success = time(p.last_succeeded_at),
        source = escape(&p.source_id),
        dest = escape(p.destination_id.as_deref().unwrap_or("—")),
    ))
}

/// `GET /reverse-etl/activations`: the workspace's activations.
pub(crate) async fn activations_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(which): Query<Which>,
) -> Response {
    let viewer = match viewer(&state, &headers, &which, "/reverse-etl/activations").await {
        Ok(v) => v,
        Err(r) => return r,
    };
    render(activations(&state, &viewer).await, "Reverse ETL")
}

async fn activations(state: &AppState, viewer: &WorkspaceAccess) -> Result<String, ApiError> {
    let nav = header_nav(state, viewer, "/reverse-etl/activations").await?;
    let list = state.store.activations(&viewer.workspace_id, None, LISTED).await?;
    let ids: Vec<String> = list.iter().map(|a| a.activation_id.clone()).collect();
    let lasts = state.store.last_jobs(&viewer.workspace_id, JobOwner::Activation, &ids).await?;
    let mut rows = String::new();
    for a in &list {
        let last = last_run(viewer, lasts.get(&a.activation_id));
        rows.push_str(&format!(
            "<tr><td><a href=\"/reverse-etl/activations/{id}{q}\">{name}</a></td><td>{mode}</td><td>{schedule}</td>\
             <td>{paused}</td><td>{last}</td></tr>",
            id = escape(&a.activation_id),
            q = ws_query(viewer),
            name = escape(&a.name),
            mode = a.mode.as_str(),
            schedule = schedule(&a.schedule),
            paused = if a.paused { "paused" } else { "active" },
        ));
    }
    let table = if rows.is_empty() {
        "<p>No reverse-ETL activations in this workspace yet.</p>".to_owned()
    } else {
        format!(
            "<table><thead><tr><th>Activation</th><th>Mode</th><th>Schedule</th><th>Status</th><th>Last run</th></tr></thead>\
             <tbody>{rows}</tbody></table>"
        )
    };
    Ok(format!("{nav}{table}"))
}

/// `GET /reverse-etl/activations/{activation_id}`: one activation and its
/// recent runs.
pub(crate) async fn activation_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(which): Query<Which>,
) -> Response {
    let viewer = match viewer(&state, &headers, &which, "/reverse-etl/activations").await {
        Ok(v) => v,
        Err(r) => return r,
    };
    render(activation(&state, &viewer, &id).await, "Activation")
}

async fn activation(state: &AppState, viewer: &WorkspaceAccess, id: &str) -> Result<String, ApiError> {
    let nav = header_nav(state, viewer, "/reverse-etl/activations").await?;
    let a = state.store.activation(&viewer.workspace_id, id).await?.ok_or_else(|| ApiError::not_found("activation"))?;
    let filter = JobFilter { activation_id: Some(a.activation_id.clone()), ..Default::default() };
    let runs = state.store.jobs(&viewer.workspace_id, &filter, None, RECENT).await?;
    let rows: String = runs.iter().map(|j| job_row(viewer, j)).collect();
    let runs = if rows.is_empty() {
        "<p>No runs yet.</p>".to_owned()
    } else {
        format!("<table><thead>{JOB_HEAD}</thead><tbody>{rows}</tbody></table>")
    };
    Ok(format!(
        "{nav}<h2>{name}</h2><dl><dt>Mode</dt><dd>{mode}</dd><dt>Schedule</dt><dd>{schedule}</dd><dt>Status</dt><dd>{paused}</dd>\
         <dt>Model → destination</dt><dd><code>{model}</code> → <code>{dest}</code></dd><dt>Mapped fields</dt><dd>{mapped}</dd></dl>\
         <h2>Recent runs</h2>{runs}",
        name = escape(&a.name),
        mode = a.mode.as_str(),
        schedule = schedule(&a.schedule),
        paused = if a.paused { "paused" } else { "active" },
        model = escape(&a.model_id),
        dest = escape(&a.destination_id),
        mapped = a.mappings.len(),
    ))
}

/// The progress table of a job as served (the script redraws the same
/// table from the event stream): row counts of a reverse-ETL run, streams
/// of a sync.
fn progress_table(progress: &JobProgress, run: bool) -> String {
    if run {
        let run = progress.run();
        // The counts by name, as the event stream's JSON lists them.
        let counts = run.and_then(|r| serde_json::to_value(&r.counts).ok()).unwrap_or_default();
        let rows: String = counts
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("<tr><td>{}</td><td class=\"n\">{}</td></tr>", escape(k), escape(&v.to_string())))
            .collect();
        let phase = run.and_then(|r| serde_json::to_value(r.phase).ok()).and_then(|p| p.as_str().map(str::to_owned));
        return format!(
            "<p>Phase: <span id=\"phase\">{}</span></p><table id=\"counts\"><thead><tr><th>Rows</th><th>Count</th></tr></thead><tbody>{rows}</tbody></table>",
            escape(phase.as_deref().unwrap_or("—"))
        );
    }
    let mut rows = String::new();
    for (name, s) in progress.sync().into_iter().flat_map(|p| &p.streams) {
        let checkpoint = s.checkpointed_at.and_then(|t| serde_json::to_value(t).ok());
        let status = serde_json::to_value(s.status).ok();
        rows.push_str(&format!(
            "<tr><td>{name}</td><td>{status}</td><td class=\"n\">{read}</td><td class=\"n\">{written}</td>\
             <td class=\"n\">{bytes}</td><td class=\"n\">{rate}</td><td>{checkpoint}</td></tr>",
            name = escape(name),
            status = escape(status.as_ref().and_then(Value::as_str).unwrap_or("")),
            read = s.records_read,
            written = s.records,
            bytes = s.bytes,
            rate = s.records_per_second,
            checkpoint = escape(checkpoint.as_ref().and_then(Value::as_str).unwrap_or("—")),
        ));
    }
    format!(
        "<table id=\"streams\"><thead><tr><th>Stream</th><th>Status</th><th>Records read</th><th>Records written</th>\
         <th>Bytes written</th><th>Records/s</th><th>Last checkpoint</th></tr></thead><tbody>{rows}</tbody></table>{}",
        ledger_table(progress.sync().and_then(|p| p.ledger.as_ref()))
    )
}

/// Where every record the last attempt of a sync read went, once it
/// ended (the script fills it in when the job ends while the page is
/// open).
fn ledger_table(ledger: Option<&SyncLedger>) -> String {
    let summary = match ledger {
        None => "Shown once an attempt ends.".to_owned(),
        Some(l) => format!("Attempt {}: {}", l.attempt, if l.balanced { "balanced" } else { "does not balance" }),
    };
    let rows: String = ledger
        .into_iter()
        .flat_map(|l| &l.streams)
        .map(|(name, s)| {
            let snapshots: Vec<String> = s.snapshot_ids.iter().map(i64::to_string).collect();
            format!(
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                escape(name),
                s.read,
                s.loaded,
                s.value_discarded,
                s.quarantined,
                s.deduplicated,
                s.left_to_retry,
                s.unaccounted,
                escape(&snapshots.join(" ")),
            )
        })
        .collect();
    format!(
        "<h2>Ledger</h2><p id=\"ledger-summary\">{}</p><table id=\"ledger\"><thead><tr><th>Stream</th><th>Read</th>\
         <th>Loaded</th><th>Value discarded</th><th>Quarantined</th><th>Deduplicated</th><th>Left to retry</th>\
         <th>Unaccounted</th><th>Iceberg snapshots</th></tr></thead><tbody>{rows}</tbody></table>",
        escape(&summary)
    )
}

/// `GET /jobs/{job_id}`: a job or reverse-ETL run, its attempts and its
/// progress, redrawn live by the page's script.
pub(crate) async fn job_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(which): Query<Which>,
) -> Response {
    let viewer = match viewer(&state, &headers, &which, "/pipelines").await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let mut response = render(job(&state, &viewer, &id).await, "Job");
    if response.status().is_success() {
        response.headers_mut().insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP_LIVE));
    }
    response
}

async fn job(state: &AppState, viewer: &WorkspaceAccess, id: &str) -> Result<String, ApiError> {
    let nav = header_nav(state, viewer, "/pipelines").await?;
    let j = state.store.job(&viewer.workspace_id, id).await?.ok_or_else(|| ApiError::not_found("job"))?;
    let attempts: String = state
        .store
        .job_attempts(&j.job_id)
        .await?
        .iter()
        .map(|a| {
            format!(
                "<tr><td class=\"n\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                a.attempt,
                time(Some(a.started_at)),
                time(a.finished_at),
                escape(a.outcome.as_deref().unwrap_or("running")),
                escape(a.error.as_deref().unwrap_or("")),
            )
        })
        .collect();
    let parent = match (&j.pipeline_id, &j.activation_id) {
        (Some(p), _) => format!("<a href=\"/pipelines/{p}{q}\">pipeline {p}</a>", p = escape(p), q = ws_query(viewer)),
        (None, Some(a)) => format!(
            "<a href=\"/reverse-etl/activations/{a}{q}\">activation {a}</a>",
            a = escape(a),
            q = ws_query(viewer)
        ),
        _ => String::new(),
    };
    Ok(format!(
        "{nav}<h2>{id}</h2><div id=\"live\" data-events=\"/jobs/{id}/events{q}\">\
         <dl><dt>Of</dt><dd>{parent}</dd><dt>Kind</dt><dd>{kind}</dd><dt>Status</dt><dd id=\"status\">{status}</dd>\
         <dt>Trigger</dt><dd>{trigger}</dd><dt>Started</dt><dd>{started}</dd><dt>Finished</dt><dd id=\"finished\">{finished}</dd>\
         <dt>Error</dt><dd id=\"error\">{error}</dd></dl><h2>Progress</h2>{progress}</div>\
         <h2>Attempts</h2><table><thead><tr><th>Attempt</th><th>Started</th><th>Finished</th><th>Outcome</th><th>Error</th></tr></thead>\
         <tbody>{attempts}</tbody></table><script src=\"/assets/job.js\"></script>",
        id = escape(&j.job_id),
        q = ws_query(viewer),
        kind = j.kind.as_str(),
        status = status(j.status.as_str()),
        trigger = j.trigger.as_str(),
        started = time(j.started_at),
        finished = time(j.finished_at),
        error = escape(j.error.as_deref().unwrap_or("—")),
        progress = progress_table(&j.progress, j.kind.is_activation_run()),
    ))
}

/// `GET /jobs/{job_id}/events`: the job's events for its page, with the
/// browser session (the API's stream takes a bearer token).
pub(crate) async fn job_events(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(which): Query<Which>,
) -> Response {
    let viewer = match viewer(&state, &headers, &which, "/pipelines").await {
        Ok(v) => v,
        Err(r) => return r,
    };
    match state.store.job(&viewer.workspace_id, &id).await {
        Ok(Some(first)) => match state.throttle.open_stream(&viewer.principal.user_id) {
            Ok(slot) => Sse::new(crate::jobs::watch::events(state, viewer, first, slot))
                .keep_alive(KeepAlive::default())
                .into_response(),
            Err(limited) => limited.into_response(),
        },
        Ok(None) => failed(&ApiError::not_found("job")),
        Err(e) => failed(&ApiError::from(e)),
    }
}

/// `GET /assets/job.js`: the script of a job's page.
pub(crate) async fn job_script() -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/javascript; charset=utf-8")),
            (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP_FORMS_TO_SELF)),
        ],
        JOB_SCRIPT,
    )
        .into_response()
}
