//! Where an activation run keeps the rows it will send: in memory while
//! they fit in [`PENDING_BYTES`], then in an unnamed file (gone when
//! closed, readable by no one else) in the spool directory, never past the
//! workspace's share of it ([`SpoolBudget`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, BufWriter};

/// Bytes of rows kept in memory at most; the rest is spooled.
pub(crate) const PENDING_BYTES: usize = 32 * 1024 * 1024;

/// Why a row could not be spooled.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpoolError {
    /// The workspace's runs hold their whole share of the spool.
    #[error(
        "the rows waiting to be sent would take more than the {limit_bytes} bytes of spool this workspace may use (SERVICE_RETL_SPOOL_MB)"
    )]
    Full { limit_bytes: u64 },
    #[error("the spool failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("a spooled row could not be read back: {0}")]
    Corrupt(#[from] serde_json::Error),
}

impl crate::retry::Transient for SpoolError {
    /// Whether another attempt may succeed: a full spool or a disk error
    /// may clear; a row that does not read back will not.
    fn is_transient(&self) -> bool {
        !matches!(self, SpoolError::Corrupt(_))
    }
}

/// Spool bytes each workspace's runs hold on this server, bounded.
pub(crate) struct SpoolBudget {
    limit: u64,
    dir: PathBuf,
    held: Mutex<HashMap<String, u64>>,
}

impl SpoolBudget {
    pub(crate) fn new(dir: PathBuf, limit: u64) -> Self {
        SpoolBudget { limit, dir, held: Mutex::new(HashMap::new()) }
    }

    /// The spool directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    fn take(&self, workspace_id: &str, bytes: u64) -> Result<(), SpoolError> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let now = held.entry(workspace_id.to_owned()).or_insert(0);
        if now.saturating_add(bytes) > self.limit {
            return Err(SpoolError::Full { limit_bytes: self.limit });
        }
        *now += bytes;
        Ok(())
    }

    fn give_back(&self, workspace_id: &str, bytes: u64) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(now) = held.get_mut(workspace_id) {
            *now = now.saturating_sub(bytes);
            if *now == 0 {
                held.remove(workspace_id);
            }
        }
    }
}

/// Rows as JSON lines, in memory and then on disk.
pub(crate) struct Spool {
    memory: Vec<u8>,
    file: Option<BufWriter<tokio::fs::File>>,
    budget: Arc<SpoolBudget>,
    workspace_id: String,
    /// Bytes this spool holds of its workspace's share.
    held: u64,
}

impl Spool {
    pub(crate) fn new(budget: Arc<SpoolBudget>, workspace_id: &str) -> Spool {
        Spool { memory: Vec::new(), file: None, budget, workspace_id: workspace_id.to_owned(), held: 0 }
    }

    pub(crate) async fn push<T: Serialize>(&mut self, row: &T) -> Result<(), SpoolError> {
        let mut line = serde_json::to_vec(row)?;
        // Compact JSON never holds a raw newline: one line per row.
        line.push(b'\n');
        if self.file.is_none() && self.memory.len() + line.len() > PENDING_BYTES {
            let spilled = self.memory.len() as u64;
            self.budget.take(&self.workspace_id, spilled)?;
            self.held += spilled;
            let mut file =
                BufWriter::with_capacity(1 << 20, tokio::fs::File::from_std(tempfile::tempfile_in(self.budget.dir())?));
            file.write_all(&std::mem::take(&mut self.memory)).await?;
            self.file = Some(file);
        }
        match &mut self.file {
            Some(f) => {
                self.budget.take(&self.workspace_id, line.len() as u64)?;
                self.held += line.len() as u64;
                f.write_all(&line).await?;
            }
            None => self.memory.extend_from_slice(&line),
        }
        Ok(())
    }

    /// The rows, in the order they came.
    pub(crate) async fn read(mut self) -> Result<Spooled, SpoolError> {
        let reservation = Reservation {
            budget: self.budget.clone(),
            workspace_id: std::mem::take(&mut self.workspace_id),
            bytes: std::mem::take(&mut self.held),
        };
        match self.file.take() {
            None => {
                Ok(Spooled { lines: Lines::Memory(std::mem::take(&mut self.memory), 0), _reservation: reservation })
            }
            Some(mut f) => {
                f.flush().await?;
                let mut file = f.into_inner();
                tokio::io::AsyncSeekExt::rewind(&mut file).await?;
                Ok(Spooled {
                    lines: Lines::File(BufReader::with_capacity(1 << 20, file).lines()),
                    _reservation: reservation,
                })
            }
        }
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        self.budget.give_back(&self.workspace_id, self.held);
    }
}

/// A share of the spool, given back when the rows are done with.
struct Reservation {
    budget: Arc<SpoolBudget>,
    workspace_id: String,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give_back(&self.workspace_id, self.bytes);
    }
}

/// A spool being read back.
pub(crate) struct Spooled {
    lines: Lines,
    _reservation: Reservation,
}

enum Lines {
    /// The lines, and where the next one starts.
    Memory(Vec<u8>, usize),
    File(tokio::io::Lines<BufReader<tokio::fs::File>>),
}

impl Spooled {
    pub(crate) async fn next<T: DeserializeOwned>(&mut self) -> Result<Option<T>, SpoolError> {
        match &mut self.lines {
            Lines::Memory(lines, at) => {
                let rest = &lines[*at..];
                let Some(end) = rest.iter().position(|b| *b == b'\n') else { return Ok(None) };
                *at += end + 1;
                Ok(Some(serde_json::from_slice(&rest[..end])?))
            }
            Lines::File(lines) => match lines.next_line().await? {
                Some(line) => Ok(Some(serde_json::from_str(&line)?)),
                None => Ok(None),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_workspace_spools_no_more_than_its_share_and_gets_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let budget = Arc::new(SpoolBudget::new(dir.path().to_owned(), (PENDING_BYTES + 4096) as u64));
        let row = "x".repeat(1000);
        let mut spool = Spool::new(budget.clone(), "ws_a");
        let mut full = None;
        for _ in 0..(PENDING_BYTES / 1000 + 100) {
            if let Err(e) = spool.push(&row).await {
                full = Some(e);
                break;
            }
        }
        assert!(matches!(full, Some(SpoolError::Full { .. })), "{full:?}");
        let mut other = Spool::new(budget.clone(), "ws_b");
        other.push(&row).await.expect("another workspace has its own share");
        drop(spool);
        assert!(budget.held.lock().unwrap().get("ws_a").is_none(), "given back when dropped");
        let mut again = Spool::new(budget.clone(), "ws_a");
        for _ in 0..10 {
            again.push(&row).await.unwrap();
        }
        let mut read = again.read().await.unwrap();
        let mut n = 0;
        while let Some(r) = read.next::<String>().await.unwrap() {
            assert_eq!(r, row);
            n += 1;
        }
        assert_eq!(n, 10);
    }
}
