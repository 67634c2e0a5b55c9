//! What the server keeps about its open connections: how many each
//! address holds ([`PerAddress`]), and whether a connection has a request
//! in flight or has been idle, and for how long ([`Activity`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes, HttpBody};
use axum::response::Response;

/// Connections open per client address, bounded.
pub(crate) struct PerAddress {
    cap: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl PerAddress {
    pub(super) fn new(cap: usize) -> Self {
        PerAddress { cap, open: Mutex::new(HashMap::new()) }
    }

    /// A place for one more connection from `ip`, or `None` when it holds
    /// its share already. The place is given back when dropped.
    pub(super) fn enter(self: Arc<Self>, ip: IpAddr) -> Option<AddressSlot> {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        {
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            let n = open.entry(ip).or_insert(0);
            if *n >= self.cap {
                return None;
            }
            *n += 1;
        }
        Some(AddressSlot { table: self, ip })
    }
}

/// One connection's place in [`PerAddress`].
pub(crate) struct AddressSlot {
    table: Arc<PerAddress>,
    ip: IpAddr,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self.table.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Requests in flight on one connection and when the last one ended.
pub(crate) struct Activity {
    started: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds after `started` at which the connection last had work.
    last: AtomicI64,
}

impl Activity {
    pub(super) fn new() -> Self {
        Activity { started: Instant::now(), in_flight: AtomicUsize::new(0), last: AtomicI64::new(0) }
    }

    fn now(&self) -> i64 {
        i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// How long the connection has had nothing in flight (zero while a
    /// request or its response body is under way).
    pub(crate) fn idle_for(&self) -> std::time::Duration {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return std::time::Duration::ZERO;
        }
        let since = self.now() - self.last.load(Ordering::SeqCst);
        std::time::Duration::from_millis(u64::try_from(since).unwrap_or(0))
    }

    /// A request begins: in flight until the [`InFlight`] is dropped.
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self.clone())
    }
}

/// A request in flight, from its head to the end of its answer's body
/// (or until it is abandoned); when it ends the connection's clock
/// restarts.
pub(crate) struct InFlight(Arc<Activity>);

impl InFlight {
    /// Keeps the request in flight until `response`'s body has been sent
    /// (or dropped): a long answer (an event stream) keeps its connection.
    pub(crate) fn until_sent(self, response: Response) -> Response {
        response.map(|body| Body::new(TrackedBody { inner: body, _guard: self }))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.last.store(self.0.now(), Ordering::SeqCst);
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that holds its [`InFlight`] until it is done.
struct TrackedBody {
    inner: Body,
    _guard: InFlight,
}

impl HttpBody for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_at_most_its_share_and_gets_places_back() {
        let table = Arc::new(PerAddress::new(2));
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        let one = table.clone().enter(a).unwrap();
        let _two = table.clone().enter(mapped).unwrap();
        assert!(table.clone().enter(a).is_none(), "an IPv4-mapped address is the same client");
        assert!(table.clone().enter("192.0.2.2".parse().unwrap()).is_some(), "another address has its own share");
        drop(one);
        assert!(table.clone().enter(a).is_some());
    }
}
