//! A stream's write queue between the plugin's read and its writer:
//! bounded in bytes (records, states and their bookkeeping), and grouped
//! on the way out so batches that queued up while the writer was busy
//! share one transaction.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::warehouse::text_bytes;

/// Record bytes a writer gathers into one transaction at most, when
/// batches queue up faster than it writes them: a transaction costs a
/// flush to disk, whatever its size.
pub(crate) const GROUP_BYTES: usize = 16 * 1024 * 1024;

/// What a read hands its stream's writer, in the order the plugin made
/// the calls.
pub enum Work {
    /// A batch of records, each a JSON object's text.
    Records(Vec<String>),
    /// A stream state that covers the records before it.
    Checkpoint(String),
}

/// Sizes only: records can be large, and are the workspace's data.
impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Work::Records(records) => write!(f, "Records({} records, {} bytes)", records.len(), self.bytes()),
            Work::Checkpoint(state) => write!(f, "Checkpoint({} bytes)", state.len()),
        }
    }
}

/// What a queued item costs besides its text, and what each of its
/// records does: the memory that holds them, roughly, so a flood of empty
/// checkpoints or tiny records fills the queue too.
const ITEM_OVERHEAD: usize = 64;
const RECORD_OVERHEAD: usize = 32;

impl Work {
    /// What it holds, in bytes.
    fn bytes(&self) -> usize {
        match self {
            Work::Records(records) => text_bytes(records),
            Work::Checkpoint(state) => state.len(),
        }
    }

    /// What it takes of a queue's room.
    fn cost(&self) -> usize {
        let records = if let Work::Records(records) = self { records.len() } else { 0 };
        ITEM_OVERHEAD + records * RECORD_OVERHEAD + self.bytes()
    }
}

/// Bytes of records and states (and their bookkeeping, see
/// [`Work::cost`]) a stream's queue holds ahead of its writer at most.
/// Counted in bytes rather than items, so a connector reads just as far
/// ahead whether it emits many small batches or a few large ones, and its
/// checkpoints (one after every page, typically) cost it almost nothing:
/// with a queue of eight items, a page and its checkpoint took two and the
/// plugin could read only four pages ahead of a slow commit. Streams are
/// read one at a time, so a running job holds at most this much queued,
/// or one batch larger than that, which goes in alone once the queue is
/// empty.
pub const QUEUE_BYTES: usize = 32 * 1024 * 1024;

/// A stream's write queue, bounded to `budget` bytes ([`QUEUE_BYTES`] in a
/// job): the sending half for the read, the receiving half for the writer.
pub fn queue(budget: usize) -> (WorkSender, WorkQueue) {
    let budget = budget.clamp(1, Semaphore::MAX_PERMITS);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let room = Arc::new(Semaphore::new(budget));
    (WorkSender { tx, room: room.clone(), budget }, WorkQueue { rx, room })
}

/// Queues work for a stream's writer.
#[derive(Clone)]
pub struct WorkSender {
    /// Each item travels with the room it takes, which is given back when
    /// the writer takes it off the queue.
    tx: tokio::sync::mpsc::UnboundedSender<(Work, OwnedSemaphorePermit)>,
    room: Arc<Semaphore>,
    budget: usize,
}

impl WorkSender {
    /// Queues `work`, first waiting until the queue has room for it (an
    /// item larger than the whole queue waits for it to be empty). Gives
    /// it back if the writer has stopped.
    pub async fn send(&self, work: Work) -> Result<(), Work> {
        let cost = u32::try_from(work.cost().min(self.budget)).unwrap_or(u32::MAX);
        let Ok(room) = self.room.clone().acquire_many_owned(cost).await else { return Err(work) };
        self.tx.send((work, room)).map_err(|e| e.0.0)
    }
}

/// The writer's end of a stream's queue. Dropping it refuses whatever is
/// sent afterwards and wakes a sender waiting for room.
pub struct WorkQueue {
    rx: tokio::sync::mpsc::UnboundedReceiver<(Work, OwnedSemaphorePermit)>,
    room: Arc<Semaphore>,
}

impl WorkQueue {
    /// The next item, once there is one; `None` when every sender is gone
    /// and the queue is empty.
    pub async fn recv(&mut self) -> Option<Work> {
        self.rx.recv().await.map(|(work, _room)| work)
    }

    /// The next item if one is queued already.
    fn try_recv(&mut self) -> Option<Work> {
        self.rx.try_recv().ok().map(|(work, _room)| work)
    }
}

impl Drop for WorkQueue {
    fn drop(&mut self) {
        self.room.close();
    }
}

/// Takes `first` and whatever else is queued behind it already, up to
/// [`GROUP_BYTES`] of records: their records as one batch, and the latest
/// checkpoint among them, which goes after that batch. Each transaction
/// costs the destination a flush to disk, so when the writer falls behind
/// the batches that queued up meanwhile share one.
pub fn gather(first: Work, rx: &mut WorkQueue) -> (Vec<String>, Option<String>) {
    gather_while(first, rx, false)
}

/// [`gather`], stopping at the first checkpoint: the records returned are
/// exactly those it covers (of what is queued), none emitted after it.
pub(crate) fn gather_to_checkpoint(first: Work, rx: &mut WorkQueue) -> (Vec<String>, Option<String>) {
    gather_while(first, rx, true)
}

fn gather_while(first: Work, rx: &mut WorkQueue, stop_at_checkpoint: bool) -> (Vec<String>, Option<String>) {
    let (mut records, mut checkpoint) = (Vec::new(), None);
    let mut bytes = 0;
    let mut next = Some(first);
    while let Some(work) = next.take() {
        match work {
            Work::Records(more) => {
                bytes += text_bytes(&more);
                if records.is_empty() {
                    records = more;
                } else {
                    records.extend(more);
                }
            }
            Work::Checkpoint(state) => {
                checkpoint = Some(state);
                if stop_at_checkpoint {
                    break;
                }
            }
        }
        if bytes < GROUP_BYTES {
            next = rx.try_recv();
        }
    }
    (records, checkpoint)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(n: usize, size: usize) -> Work {
        Work::Records((0..n).map(|_| "r".repeat(size)).collect())
    }

    #[tokio::test]
    async fn queued_batches_are_written_together_with_the_latest_checkpoint_after_them() {
        let (tx, mut rx) = queue(QUEUE_BYTES);
        tx.send(Work::Checkpoint("c2".into())).await.unwrap();
        tx.send(records(3, 10)).await.unwrap();
        tx.send(Work::Checkpoint("c3".into())).await.unwrap();
        let (gathered, checkpoint) = gather(records(2, 10), &mut rx);
        assert_eq!(gathered.len(), 5, "both batches in one");
        assert_eq!(checkpoint.as_deref(), Some("c3"), "the latest checkpoint, which covers them all");
        assert!(rx.try_recv().is_none(), "the queue is empty");

        let (gathered, checkpoint) = gather(Work::Checkpoint("alone".into()), &mut rx);
        assert!(gathered.is_empty());
        assert_eq!(checkpoint.as_deref(), Some("alone"));
    }

    #[tokio::test]
    async fn a_group_stops_at_its_byte_limit() {
        let (tx, mut rx) = queue(QUEUE_BYTES);
        tx.send(records(1, 10)).await.unwrap();
        tx.send(Work::Checkpoint("later".into())).await.unwrap();
        let (gathered, checkpoint) = gather(records(4, GROUP_BYTES / 4), &mut rx);
        assert_eq!((gathered.len(), checkpoint), (4, None), "a full group takes nothing more");
        let (gathered, checkpoint) = gather(rx.try_recv().unwrap(), &mut rx);
        assert_eq!((gathered.len(), checkpoint.as_deref()), (1, Some("later")), "what was left is the next group");
    }

    #[tokio::test]
    async fn the_queue_holds_bytes_not_items_and_a_stopped_writer_frees_its_senders() {
        fn pending<F: std::future::Future + Unpin>(f: &mut F) -> bool {
            std::pin::Pin::new(f).poll(&mut std::task::Context::from_waker(std::task::Waker::noop())).is_pending()
        }
        let checkpoint = |s: &str| Work::Checkpoint(s.into());
        let (tx, mut rx) = queue(10 * checkpoint("0").cost() + records(4, 20).cost() + 10);
        for i in 0..10 {
            tx.send(checkpoint(&i.to_string())).await.unwrap();
        }
        tx.send(records(4, 20)).await.unwrap();
        let mut full = Box::pin(tx.send(records(1, 20)));
        assert!(pending(&mut full), "10 bytes of room left: a record of 20 waits");
        assert!(matches!(rx.recv().await, Some(Work::Checkpoint(c)) if c == "0"));
        assert!(pending(&mut full), "one checkpoint taken off is not room enough");
        for _ in 1..10 {
            assert!(matches!(rx.try_recv(), Some(Work::Checkpoint(_))));
        }
        assert!(matches!(rx.try_recv(), Some(Work::Records(r)) if r.len() == 4));
        assert!(full.await.is_ok(), "room again once the writer took what was queued");

        let mut oversized = Box::pin(tx.send(records(1, 100_000)));
        assert!(pending(&mut oversized), "larger than the queue: waits for it to be empty");
        assert!(rx.try_recv().is_some());
        assert!(oversized.await.is_ok(), "and then goes in alone");

        let mut waiting = Box::pin(tx.send(records(1, 50)));
        assert!(pending(&mut waiting));
        drop(rx);
        assert!(
            matches!(waiting.await, Err(Work::Records(r)) if r.len() == 1),
            "the work comes back when the writer stopped"
        );
        assert!(tx.send(checkpoint("late")).await.is_err());

        // Empty items are not free: a flood of them fills the queue too.
        let (tx, _rx) = queue(3 * ITEM_OVERHEAD);
        for _ in 0..3 {
            tx.send(checkpoint("")).await.unwrap();
        }
        assert!(pending(&mut Box::pin(tx.send(checkpoint("")))));
    }
}
