//! Waiting for a job or a reverse-ETL run to end, with its progress shown
//! live on standard error: on a terminal, one line per stream redrawn in
//! place (records, bytes, rate); elsewhere (logs, CI) a line whenever the
//! counts moved, at most every two seconds. Progress comes from the job's
//! event stream (`GET /jobs/{id}/events`); when that stream cannot be
//! followed to the end (a proxy that buffers it, a dropped connection),
//! the job is polled instead. The job's outcome is printed at the end,
//! and a job that did not succeed fails the command.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::Value;

use super::context::{Ctx, seg};
use super::render::{bytes, count, text, text_at};
use crate::cli::client::CliFailure;

/// How often the job is asked for its progress.
const POLL: Duration = Duration::from_millis(500);
/// How often a line is written where nothing is redrawn.
const PLAIN_EVERY: Duration = Duration::from_secs(2);

/// What is being waited for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Awaited {
    /// A sync or reset: records and bytes per stream.
    Job,
    /// A reverse-ETL run: the phase and its counts.
    Run,
}

impl Awaited {
    fn path(self, id: &str) -> String {
        match self {
            Awaited::Job => format!("jobs/{}", seg(id)),
            Awaited::Run => format!("reverse-etl/runs/{}", seg(id)),
        }
    }

    /// The lines of a progress view: a headline and one per stream.
    fn lines(self, id: &str, state: &Value, started: Instant) -> Vec<String> {
        let status = text_at(state, "status");
        let p = &state["progress"];
        match self {
            Awaited::Job => {
                let secs = started.elapsed().as_secs_f64().max(0.001);
                let mut lines = vec![format!(
                    "{id} {status}: {} records, {} ({}/s)",
                    count(num(&p["records"])),
                    bytes(num(&p["bytes"])),
                    count((num(&p["records"]) as f64 / secs) as u64)
                )];
                if let Some(streams) = p["streams"].as_object() {
                    let width = streams.keys().map(String::len).max().unwrap_or(0);
                    for (name, s) in streams {
                        lines.push(format!(
                            "  {name:<width$}  {:>12} records  {:>10}",
                            count(num(&s["records"])),
                            bytes(num(&s["bytes"]))
                        ));
                    }
                }
                lines
            }
            Awaited::Run => {
                let c = &p["counts"];
                let mut line = format!("{id} {status}");
                if let Some(phase) = p["phase"].as_str() {
                    line.push_str(&format!(" ({phase})"));
                }
                let parts: Vec<String> = ["queried", "added", "changed", "removed", "unchanged", "invalid", "failed"]
                    .iter()
                    .filter(|k| c.get(**k).is_some())
                    .map(|k| format!("{k} {}", count(num(&c[*k]))))
                    .collect();
                if !parts.is_empty() {
                    line.push_str(&format!(": {}", parts.join(", ")));
                }
                vec![line]
            }
        }
    }
}

fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// Draws progress: redrawn in place on a terminal, else as lines.
struct View<W: Write> {
    out: W,
    terminal: bool,
    drawn: usize,
    last_plain: Option<(Instant, Vec<String>)>,
}

impl<W: Write> View<W> {
    fn new(out: W, terminal: bool) -> View<W> {
        View { out, terminal, drawn: 0, last_plain: None }
    }

    fn show(&mut self, lines: &[String]) {
        let err = &mut self.out;
        if self.terminal {
            // Back to the first line drawn last time, then each line anew
            // (and blank the lines no longer needed).
            if self.drawn > 0 {
                let _ = write!(err, "\x1b[{}F", self.drawn);
            }
            for l in lines {
                let _ = writeln!(err, "\x1b[2K{l}");
            }
            for _ in lines.len()..self.drawn {
                let _ = writeln!(err, "\x1b[2K");
            }
            self.drawn = self.drawn.max(lines.len());
        } else {
            let due =
                self.last_plain.as_ref().is_none_or(|(at, before)| before != lines && at.elapsed() >= PLAIN_EVERY);
            if due {
                let _ = writeln!(err, "{}", lines.join("\n"));
                self.last_plain = Some((Instant::now(), lines.to_vec()));
            }
        }
        let _ = err.flush();
    }
}

/// Follows the job or run until it ends, showing its progress; prints its
/// outcome and fails unless it succeeded.
pub(crate) async fn wait(ctx: &Ctx, what: Awaited, id: &str) -> Result<(), CliFailure> {
    let started = Instant::now();
    let stderr = std::io::stderr();
    let terminal = stderr.is_terminal();
    let mut view = View::new(stderr, terminal);
    if follow(ctx, what, id, &mut view, started).await.is_err() {
        poll(ctx, what, id, &mut view, started).await?;
    }
    let state = ctx.client.call(Method::GET, &what.path(id), None).await?;
    let status = text_at(&state, "status");
    if ctx.out.json {
        ctx.out.print_json(&state);
    } else if !view.terminal {
        // The last state, whether or not a line was due.
        eprintln!("{}", what.lines(id, &state, started).join("\n"));
    }
    let took = format!("{:.1} s", started.elapsed().as_secs_f64());
    match status.as_str() {
        "succeeded" => {
            if !ctx.out.json {
                println!("{id} succeeded in {took}");
            }
            Ok(())
        }
        other => {
            let reason =
                state.get("error").filter(|e| !e.is_null()).map(text).unwrap_or_else(|| "no reason given".into());
            Err(CliFailure::JobDidNotSucceed(format!("{id} {other} after {took}: {reason}")))
        }
    }
}

/// Shows the job's events until it ends. An error when the stream could
/// not be opened or ended before the job did.
async fn follow<W: Write>(
    ctx: &Ctx,
    what: Awaited,
    id: &str,
    view: &mut View<W>,
    started: Instant,
) -> Result<(), CliFailure> {
    let mut res = ctx.client.events(&format!("jobs/{}/events", seg(id))).await?;
    // Bytes, not text: a chunk may end inside a character.
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        let chunk = res.chunk().await.map_err(|e| CliFailure::Other(format!("the event stream broke: {e}")))?;
        let Some(chunk) = chunk else {
            return Err(CliFailure::Other("the event stream ended before the job".into()));
        };
        buffer.extend_from_slice(&chunk);
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let block: Vec<u8> = buffer.drain(..end + 2).collect();
            let Some((event, data)) = parse_event(&String::from_utf8_lossy(&block)) else { continue };
            match event.as_str() {
                "progress" => view.show(&what.lines(id, &data, started)),
                "finished" => return Ok(()),
                _ => {}
            }
        }
    }
}

/// One Server-Sent Event block: its name and its JSON data.
fn parse_event(block: &str) -> Option<(String, Value)> {
    let mut event = String::from("message");
    let mut data = String::new();
    for line in block.lines() {
        if let Some(name) = line.strip_prefix("event:") {
            event = name.trim().to_owned();
        } else if let Some(d) = line.strip_prefix("data:") {
            data.push_str(d.strip_prefix(' ').unwrap_or(d));
        }
    }
    (!data.is_empty()).then(|| serde_json::from_str(&data).ok().map(|v| (event, v))).flatten()
}

/// Asks for the job until it ends, showing its progress.
async fn poll<W: Write>(
    ctx: &Ctx,
    what: Awaited,
    id: &str,
    view: &mut View<W>,
    started: Instant,
) -> Result<(), CliFailure> {
    loop {
        let state = ctx.client.call(Method::GET, &what.path(id), None).await?;
        let status = text_at(&state, "status");
        view.show(&what.lines(id, &state, started));
        // Anything but waiting or running is an end (a status this CLI
        // does not know included), so the wait never outlives the job.
        if !matches!(status.as_str(), "queued" | "running") {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_terminal_sees_the_lines_redrawn_in_place_and_a_log_sees_changes_only() {
        let lines = |n: u64| {
            Awaited::Job.lines("job_1", &json!({ "status": "running", "progress": { "records": n, "bytes": n * 1024, "streams": { "a": { "records": n, "bytes": n * 1024 } } } }), Instant::now())
        };
        assert_eq!(lines(1500)[0].split(" (").next().unwrap(), "job_1 running: 1,500 records, 1.5 MiB");
        assert_eq!(lines(1500)[1], "  a         1,500 records     1.5 MiB");

        let mut tty = View::new(Vec::new(), true);
        tty.show(&lines(1));
        tty.show(&lines(2));
        let drawn = String::from_utf8(tty.out).unwrap();
        assert!(drawn.starts_with("\x1b[2Kjob_1 running: 1 records"), "{drawn:?}");
        assert_eq!(drawn.matches("\x1b[2F").count(), 1, "back up two lines once: {drawn:?}");
        assert!(drawn.contains("\x1b[2F\x1b[2Kjob_1 running: 2 records"), "{drawn:?}");

        let mut log = View::new(Vec::new(), false);
        log.show(&lines(1));
        log.show(&lines(1));
        log.show(&lines(2));
        let written = String::from_utf8(log.out).unwrap();
        assert_eq!(written.matches("job_1 running").count(), 1, "nothing again within two seconds: {written}");
        assert!(!written.contains('\x1b'), "no terminal codes in a log");
    }

    #[test]
    fn event_blocks_give_their_name_and_data() {
        let (name, data) = parse_event("event: progress\ndata: {\"status\":\"running\"}\n\n").unwrap();
        assert_eq!((name.as_str(), data["status"].as_str()), ("progress", Some("running")));
        assert!(parse_event(": keep-alive\n\n").is_none());
    }
}
