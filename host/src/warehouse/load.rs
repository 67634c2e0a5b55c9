//! Loading one stream: each batch is prepared (off the async workers),
//! then applied in the background, in order, with as many in flight as
//! the destination allows, and checkpoints come due only after the batches
//! before them.

use std::collections::VecDeque;
use std::sync::Arc;

use super::{WriteError, Writer};
use crate::store::pipelines::StreamSyncMode;

/// Writes one stream's batches: each is prepared, then applied in the
/// background, in order, with as many in flight as the destination allows
/// for the sync mode, so the next batch is prepared while the last one is
/// in the database.
///
/// Preparing runs on the blocking pool: it is CPU work with no `.await`
/// in it, milliseconds per batch and tens of milliseconds for a group of
/// them ([`GROUP_BYTES`]), which on an async worker would hold up every
/// other task there (API requests, the source's HTTP transfers).
///
/// Checkpoints queue behind the batches emitted before them and come back
/// as [`Written::checkpoint`] once all of those are written, without
/// stopping the batches after them.
pub struct Loader {
    writer: Arc<Writer>,
    stream: Arc<StreamTarget>,
    limit: usize,
    in_flight: VecDeque<InFlight>,
}

/// Where a stream's batches go and how they are keyed.
struct StreamTarget {
    pipeline_id: String,
    stream: String,
    mode: StreamSyncMode,
    primary_key: Vec<String>,
}

enum InFlight {
    Batch(tokio::task::JoinHandle<Result<(u64, u64), WriteError>>),
    Checkpoint(String),
}

/// What finished writing since the last call.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Written {
    pub records: u64,
    pub bytes: u64,
    /// The latest checkpoint whose data is all written.
    pub checkpoint: Option<String>,
}

impl Loader {
    pub fn new(writer: Arc<Writer>, pipeline_id: &str, stream: &str, mode: StreamSyncMode, primary_key: Vec<String>) -> Loader {
        let limit = writer.concurrent_batches(mode);
        let stream = StreamTarget { pipeline_id: pipeline_id.to_owned(), stream: stream.to_owned(), mode, primary_key };
        Loader { writer, stream: Arc::new(stream), limit, in_flight: Default::default() }
    }

    /// Prepares `records` and starts writing them, first waiting for
    /// earlier batches while too many are in flight. Returns what finished
    /// meanwhile, or the first failure.
    pub async fn write(&mut self, records: Vec<String>) -> Result<Written, WriteError> {
        let (writer, stream) = (self.writer.clone(), self.stream.clone());
        let batch = tokio::task::spawn_blocking(move || writer.prepare(&stream.pipeline_id, &stream.stream, &records, stream.mode, &stream.primary_key))
            .await
            .unwrap_or_else(|e| Err(WriteError::Destination(format!("preparing the batch stopped: {e}"))))?;
        let mut written = Written::default();
        while self.batches() >= self.limit {
            self.next(&mut written).await?;
        }
        let writer = self.writer.clone();
        self.in_flight.push_back(InFlight::Batch(tokio::spawn(async move {
            let records = batch.records;
            writer.apply(batch).await.map(|bytes| (records, bytes))
        })));
        Ok(written)
    }

    /// Queues a checkpoint behind the batches written before it; returns
    /// it at once when there are none.
    pub fn checkpoint(&mut self, state: String) -> Written {
        if self.in_flight.is_empty() {
            return Written { checkpoint: Some(state), ..Written::default() };
        }
        self.in_flight.push_back(InFlight::Checkpoint(state));
        Written::default()
    }

    /// Waits until every batch is written; what finished, or the first
    /// failure.
    pub async fn drain(&mut self) -> Result<Written, WriteError> {
        let mut written = Written::default();
        while !self.in_flight.is_empty() {
            self.next(&mut written).await?;
        }
        Ok(written)
    }

    /// Waits for the oldest batch, and takes the checkpoints it makes due.
    async fn next(&mut self, written: &mut Written) -> Result<(), WriteError> {
        self.take_due(written);
        if let Some(InFlight::Batch(task)) = self.in_flight.pop_front() {
            let (records, bytes) = task.await.unwrap_or_else(|e| Err(WriteError::Destination(format!("the writer stopped: {e}"))))?;
            written.records += records;
            written.bytes += bytes;
        }
        self.take_due(written);
        Ok(())
    }

    /// Batches being written now.
    fn batches(&self) -> usize {
        self.in_flight.iter().filter(|f| matches!(f, InFlight::Batch(_))).count()
    }

    /// Takes the checkpoints no unwritten batch precedes.
    fn take_due(&mut self, written: &mut Written) {
        while let Some(InFlight::Checkpoint(_)) = self.in_flight.front() {
            if let Some(InFlight::Checkpoint(state)) = self.in_flight.pop_front() {
                written.checkpoint = Some(state);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::super::DestinationConfig;
    use super::super::tests::test_place;

    #[tokio::test]
    async fn checkpoints_come_due_only_after_the_batches_before_them() {
        let dir = tempfile::tempdir().unwrap();
        let writer = Writer::open(&DestinationConfig::Jsonl { directory: "out".into() }, &test_place(dir.path()), None).await.unwrap();
        let mut loader = Loader::new(std::sync::Arc::new(writer), "p", "events", StreamSyncMode::IncrementalAppend, Vec::new());
        let batch = |n: usize| (0..n).map(|i| format!(r#"{{"id": {i}}}"#)).collect::<Vec<_>>();
        assert_eq!(loader.checkpoint("a".into()).checkpoint.as_deref(), Some("a"), "nothing before it: due at once");
        assert_eq!(loader.write(batch(2)).await.unwrap(), Written::default());
        assert_eq!(loader.checkpoint("b".into()), Written::default(), "its batch is still in flight");
        let after_first = loader.write(batch(3)).await.unwrap();
        assert_eq!((after_first.records, after_first.checkpoint.as_deref()), (2, Some("b")));
        loader.checkpoint("c".into());
        let rest = loader.drain().await.unwrap();
        assert_eq!((rest.records, rest.checkpoint.as_deref()), (3, Some("c")));
        let lines = std::fs::read_to_string(dir.path().join("exports/ws_test/out/events.jsonl")).unwrap();
        assert_eq!(lines.lines().count(), 5);
        assert!(loader.write(vec!["not json".to_owned()]).await.is_err(), "a bad record fails before it is queued");
    }
}
