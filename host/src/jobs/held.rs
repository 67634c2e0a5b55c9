//! The records of an appending stream that no saved state covers yet.
//!
//! An append has no key to absorb a record written twice, so a record is
//! written only together with a state that covers it: the records a read
//! emits are held until a checkpoint that advances the stream's state
//! (one equal to the state already saved commits nothing new), or until
//! the read ends well. A read that fails drops what it held, and the
//! retry reads it again from the saved state. Held records stay in memory
//! up to [`PENDING_BYTES`], then go to the spool, within the workspace's
//! share of it.

use std::sync::Arc;

use super::queue::GROUP_BYTES;
use super::spool::{PENDING_BYTES, Spool, SpoolBudget, SpoolError, Spooled};
use crate::warehouse::text_bytes;

/// Records held in the order they were read.
pub(super) struct Held {
    memory: Vec<String>,
    bytes: usize,
    spool: Option<Spool>,
    budget: Arc<SpoolBudget>,
    workspace_id: String,
}

impl Held {
    pub(super) fn new(budget: Arc<SpoolBudget>, workspace_id: &str) -> Held {
        Held { memory: Vec::new(), bytes: 0, spool: None, budget, workspace_id: workspace_id.to_owned() }
    }

    /// Holds `records` after those held before.
    pub(super) async fn push(&mut self, records: Vec<String>) -> Result<(), SpoolError> {
        let bytes = text_bytes(&records);
        if self.spool.is_none() && self.bytes + bytes <= PENDING_BYTES {
            self.bytes += bytes;
            self.memory.extend(records);
            return Ok(());
        }
        let spool = self.spool.get_or_insert_with(|| Spool::new(self.budget.clone(), &self.workspace_id));
        for record in &records {
            spool.push(record).await?;
        }
        Ok(())
    }

    /// Everything held, to be written in order; this holds nothing after.
    pub(super) async fn take(&mut self) -> Result<Taken, SpoolError> {
        self.bytes = 0;
        let memory = std::mem::take(&mut self.memory);
        let spooled = match self.spool.take() {
            Some(spool) => Some(spool.read().await?),
            None => None,
        };
        Ok(Taken { memory: Some(memory), spooled })
    }
}

/// Held records being written, a batch at a time.
pub(super) struct Taken {
    memory: Option<Vec<String>>,
    spooled: Option<Spooled>,
}

impl Taken {
    /// The next batch (about [`GROUP_BYTES`] of records, or what the
    /// memory held), in the order they were read; `None` when all were.
    pub(super) async fn next_batch(&mut self) -> Result<Option<Vec<String>>, SpoolError> {
        if let Some(memory) = self.memory.take().filter(|m| !m.is_empty()) {
            return Ok(Some(memory));
        }
        let Some(spooled) = &mut self.spooled else { return Ok(None) };
        let (mut batch, mut bytes) = (Vec::new(), 0);
        while bytes < GROUP_BYTES {
            match spooled.next::<String>().await? {
                Some(record) => {
                    bytes += record.len();
                    batch.push(record);
                }
                None => break,
            }
        }
        Ok((!batch.is_empty()).then_some(batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn held_records_come_back_in_order_from_memory_and_the_spool() {
        let dir = tempfile::tempdir().unwrap();
        let budget = Arc::new(SpoolBudget::new(dir.path().to_owned(), u64::MAX));
        let mut held = Held::new(budget, "ws");
        let record = |i: usize| format!("{{\"i\":{i},\"pad\":\"{}\"}}", "x".repeat(1000));
        // Past the memory's share, so the rest is spooled.
        let n = PENDING_BYTES / 1000 + 2000;
        for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
            held.push(chunk.iter().map(|i| record(*i)).collect()).await.unwrap();
        }
        let mut taken = held.take().await.unwrap();
        let mut seen = 0;
        while let Some(batch) = taken.next_batch().await.unwrap() {
            for r in batch {
                assert_eq!(r, record(seen));
                seen += 1;
            }
        }
        assert_eq!(seen, n);
        assert!(held.take().await.unwrap().next_batch().await.unwrap().is_none(), "nothing is held after");
    }
}
