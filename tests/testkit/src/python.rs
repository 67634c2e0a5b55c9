//! The tests' Python tools run as servers (`tests/python/moto_*.py`): a
//! script started with the tools' interpreter, which prints one JSON line
//! once it serves (its port, its keys) and then reads commands, a line
//! each, on its standard input.

use std::path::Path;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// A running script, killed when dropped.
pub struct Script {
    pub child: Child,
    /// What it prints after its first line (answers to commands).
    pub lines: Lines<BufReader<ChildStdout>>,
    /// Its first line: what it serves.
    pub started: serde_json::Value,
}

impl Script {
    /// Starts `script` (a path) with `python` and `args`, and waits for its
    /// first line.
    pub async fn start(python: &Path, script: &Path, args: &[&str]) -> Script {
        let mut child = Command::new(python)
            .arg(script)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = lines.next_line().await.unwrap().unwrap_or_else(|| panic!("{} printed nothing", script.display()));
        let started = serde_json::from_str(&line).unwrap();
        Script { child, lines, started }
    }

    /// Sends `command` as a line and reads the line that answers it.
    pub async fn ask(&mut self, command: &serde_json::Value) -> serde_json::Value {
        let stdin = self.child.stdin.as_mut().expect("the script reads commands");
        stdin.write_all(format!("{command}\n").as_bytes()).await.unwrap();
        let line = self.lines.next_line().await.unwrap().expect("the script answers each command");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("the script answered {line:?}: {e}"))
    }
}
