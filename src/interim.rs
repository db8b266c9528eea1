//! 1xx interim responses (RFC 9110 §15.2): an origin's `103 Early Hints` (or any 1xx but 100 and
//! 101) reaches the HTTP/1.1 client before the final response, as a proxy must forward them.
//!
//! hyper's server has no way to send an informational response, so the block is written on the
//! connection through the same IO wrapper as hyper's own bytes (`server::io::Tracked`), and only
//! where that cannot interleave with hyper's output: while a request is being handled, hyper
//! writes nothing new on its connection until the handler returns, except bytes it still owes of
//! an earlier (pipelined) response, which it has drained once it flushes. The sink never touches
//! the connection: it queues the block and wakes the connection task; the wrapper writes the
//! queue at hyper's next flush (hyper flushes at every poll of a connection whose buffer is
//! empty), or before the first write after it (the final response's head). So a 103 reaches the
//! client while the origin still works on the final answer, and the path is the same under TLS.
//!
//! The sink travels to the upstream client in a task-local set around each proxied HTTP/1.1
//! request's handler; fetches without a client (background revalidation) have none and forward
//! nothing. Once the handler has returned, the request's sink forwards nothing more (a late
//! callback, e.g. after a timeout, would land inside a later response). Upstream 100 Continue is
//! not forwarded (hyper answers the client's `Expect` itself), nor 101.
//!
//! Bounds: an origin may send any number of 1xx responses, and a client may not read. At most
//! [`MAX_PER_RESPONSE`] go on per request and at most [`MAX_QUEUED`] bytes wait in the queue of
//! a connection; the others are dropped whole (a block is never cut, so the framing holds) and
//! counted in the server's [`Dropped`] counter.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::{HeaderMap, StatusCode};
use tokio::io::AsyncWrite;

tokio::task_local! {
    static SINK: Sink;
}

/// Interim responses forwarded per request at most; later ones are dropped.
pub const MAX_PER_RESPONSE: u32 = 8;

/// Interim bytes a connection queues at most while its client does not read; a block that does
/// not fit is dropped.
pub const MAX_QUEUED: usize = 16 * 1024;

/// The server's count of interim responses dropped at the bounds (shared by its connections).
pub type Dropped = Arc<AtomicU64>;

/// A connection's 1xx state: what its IO wrapper and its request handlers share. It lives inside
/// the connection's own shared state (the server's `Activity`, reached through [`Connection`]),
/// so that a request touches one allocation, not two; the fields read on every write come first.
#[repr(C)]
pub struct Shared {
    /// `pending` is not empty (read without the lock on every write).
    queued: AtomicBool,
    /// hyper has written since its last flush: it may still hold bytes of a response. Set and
    /// cleared by the IO wrapper, in the connection task.
    owed: AtomicBool,
    /// A handler's response body asked for the connection once hyper has written the head
    /// (a stream that the handler writes itself: push's SSE subscribers).
    handoff: AtomicBool,
    /// `upgrade` holds a claim (read without the lock after every hyper connection's end).
    claimed: AtomicBool,
    /// Interim responses met during the request being handled ([`MAX_PER_RESPONSE`] once its
    /// handler has returned).
    seen: AtomicU32,
    /// Interim bytes to write before hyper's next output: whole blocks, the first maybe partly
    /// written already. Boxed, and only while bytes wait: nearly every connection never sees a
    /// 1xx response and keeps a null pointer here (8 bytes, not a `Vec`'s 24).
    #[allow(clippy::box_collection)]
    pending: Mutex<Option<Box<Vec<u8>>>>,
    dropped: Dropped,
    /// Where the connection hands itself over after a 101, when a handler claimed it
    /// (`crate::upgrade`).
    upgrade: Mutex<Option<tokio::sync::oneshot::Sender<crate::upgrade::Upgraded>>>,
}

/// The connection a [`Sink`] forwards to: where its [`Shared`] state lives and how its task is
/// woken to write what was queued. The server's per-connection state implements it.
pub trait Connection: Send + Sync + 'static {
    fn interim(&self) -> &Shared;
    /// Wakes the task that polls the connection's IO wrapper.
    fn wake(&self);
}

impl Shared {
    /// Dropped blocks are counted in `dropped` (the server's counter).
    pub fn new(dropped: Dropped) -> Shared {
        Shared {
            queued: AtomicBool::new(false),
            owed: AtomicBool::new(false),
            handoff: AtomicBool::new(false),
            claimed: AtomicBool::new(false),
            seen: AtomicU32::new(0),
            pending: Mutex::new(None),
            dropped,
            upgrade: Mutex::new(None),
        }
    }

    /// A response body asked for the connection (see [`Sink::ask_handoff`]) and hyper has
    /// written all it had (its last flush came after its last write): the socket can go.
    #[inline]
    pub fn handoff_ready(&self) -> bool {
        self.handoff.load(Ordering::Acquire) && !self.owed.load(Ordering::Acquire)
    }

    /// The connection's side of an upgrade: the claim, if a handler made one.
    pub fn take_upgrade(&self) -> Option<tokio::sync::oneshot::Sender<crate::upgrade::Upgraded>> {
        if !self.claimed.load(Ordering::Acquire) {
            return None;
        }
        let taken = self.upgrade.lock().ok()?.take();
        self.claimed.store(false, Ordering::Release);
        taken
    }

    /// Interim bytes wait to be written.
    #[inline]
    fn queued(&self) -> bool {
        self.queued.load(Ordering::Acquire)
    }

    /// Before each of hyper's writes to `out`: when hyper owes nothing (this write starts new
    /// output: the final response's head), the queued bytes go first. hyper owes bytes from
    /// then until its next flush.
    #[inline]
    pub fn poll_before_write<W: AsyncWrite + Unpin>(
        &self,
        out: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.owed.load(Ordering::Acquire) {
            if self.queued() {
                std::task::ready!(self.poll_write(out, cx))?;
            }
            self.owed.store(true, Ordering::Release);
        }
        Poll::Ready(Ok(()))
    }

    /// At hyper's flush of `out`, which it does only with its own buffer empty (and at every
    /// poll of its connection): hyper owes nothing, so the queued bytes go now.
    #[inline]
    pub fn poll_at_flush<W: AsyncWrite + Unpin>(
        &self,
        out: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        self.owed.store(false, Ordering::Release);
        if self.queued() {
            self.poll_write(out, cx)
        } else {
            Poll::Ready(Ok(()))
        }
    }

    /// Writes the queued bytes to `out` (the connection, below hyper), to the end or until
    /// `out` is full.
    fn poll_write<W: AsyncWrite + Unpin>(
        &self,
        out: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(q) = pending.as_mut() {
            while !q.is_empty() {
                match Pin::new(&mut *out).poll_write(cx, q) {
                    Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    Poll::Ready(Ok(n)) => {
                        q.drain(..n);
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            }
        }
        // The queue's memory goes with it: a connection keeps none between 1xx bursts.
        *pending = None;
        self.queued.store(false, Ordering::Release);
        Poll::Ready(Ok(()))
    }

    fn drop_one(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// The request's handler has returned: hyper writes its final response next. Later 1xx
    /// responses are dropped. So are blocks still queued while hyper owes bytes of an earlier
    /// (pipelined) response: the final head goes out right behind those bytes, with no flush
    /// between, so the blocks could only follow it, where the client would take them for the
    /// next response's. (Nothing of them was written: the queue is written only while hyper
    /// owes nothing.)
    fn end_request(&self) {
        self.seen.store(MAX_PER_RESPONSE, Ordering::Relaxed);
        if self.queued() && self.owed.load(Ordering::Acquire) {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(q) = pending.take() {
                // Each block ends with its head's one empty line.
                let blocks = q.windows(4).filter(|w| w == b"\r\n\r\n").count();
                self.dropped.fetch_add(blocks as u64, Ordering::Relaxed);
            }
            self.queued.store(false, Ordering::Release);
        }
    }
}

/// Where a request's interim responses go: the client connection's queue.
#[derive(Clone)]
pub struct Sink {
    conn: Arc<dyn Connection>,
}

impl Sink {
    pub fn new(conn: Arc<dyn Connection>) -> Sink {
        Sink { conn }
    }

    #[inline]
    fn shared(&self) -> &Shared {
        self.conn.interim()
    }

    /// Runs a request's handler with this sink in reach of the upstream client; the request
    /// starts with no interim response forwarded, and forwards none once the handler returned.
    pub fn scope<F: std::future::Future>(self, f: F) -> Scoped<F> {
        self.shared().seen.store(0, Ordering::Relaxed);
        Scoped {
            inner: SINK.scope(self, f),
        }
    }

    /// The sink of the request being handled on this task, if any.
    pub fn current() -> Option<Sink> {
        SINK.try_with(Sink::clone).ok()
    }

    /// Claims the connection for an upgrade: it arrives on the receiver once the 101 is
    /// written (see `crate::upgrade`).
    pub fn claim_upgrade(&self) -> tokio::sync::oneshot::Receiver<crate::upgrade::Upgraded> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let shared = self.shared();
        if let Ok(mut slot) = shared.upgrade.lock() {
            *slot = Some(tx);
            shared.claimed.store(true, Ordering::Release);
        }
        rx
    }

    /// Claims the connection for a response whose body the handler writes itself, after
    /// hyper has written the head: the body asks for it ([`Sink::ask_handoff`]) at its first
    /// poll, and the connection arrives on the receiver once hyper's bytes are out.
    pub fn claim_handoff(&self) -> tokio::sync::oneshot::Receiver<crate::upgrade::Upgraded> {
        self.claim_upgrade()
    }

    /// Asks for the claimed connection now (from the response body's first poll).
    pub fn ask_handoff(&self) {
        self.shared().handoff.store(true, Ordering::Release);
    }

    /// Gives up a claim (the backend did not switch protocols).
    pub fn unclaim_upgrade(&self) {
        self.shared().take_upgrade();
    }

    /// Sends one interim response on to the client: queues it and wakes the connection.
    pub fn forward(&self, status: StatusCode, headers: &HeaderMap) {
        if !status.is_informational()
            || status == StatusCode::CONTINUE
            || status == StatusCode::SWITCHING_PROTOCOLS
        {
            return;
        }
        let shared = self.shared();
        if shared.seen.fetch_add(1, Ordering::Relaxed) >= MAX_PER_RESPONSE {
            shared.drop_one();
            return;
        }
        let block = encode(status, headers);
        {
            let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
            let queued = pending.as_ref().map_or(0, |q| q.len());
            if queued + block.len() > MAX_QUEUED {
                shared.drop_one();
                return;
            }
            match pending.as_mut() {
                Some(q) => q.extend_from_slice(&block),
                None => *pending = Some(Box::new(block)),
            }
            shared.queued.store(true, Ordering::Release);
        }
        self.conn.wake();
    }
}

/// `HTTP/1.1 103 Early Hints` and the fields, minus hop-by-hop ones.
fn encode(status: StatusCode, headers: &HeaderMap) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(
        status
            .canonical_reason()
            .unwrap_or("Informational")
            .as_bytes(),
    );
    out.extend_from_slice(b"\r\n");
    let mut headers = headers.clone();
    crate::http::fields::strip_hop_by_hop(&mut headers);
    for (name, value) in &headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

pin_project_lite::pin_project! {
    /// [`Sink::scope`]'s future: the handler's own, with the sink in reach (a plain future,
    /// not an `async fn`, which would hold the handler's future twice: as its argument and
    /// inside the task-local scope).
    pub struct Scoped<F: std::future::Future> {
        #[pin]
        inner: tokio::task::futures::TaskLocalFuture<Sink, F>,
    }
}

impl<F: std::future::Future> std::future::Future for Scoped<F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let mut inner = self.project().inner;
        let out = std::task::ready!(inner.as_mut().poll(cx));
        // The request is done: no more interim responses for it.
        if let Some(sink) = inner.take_value() {
            sink.shared().end_request();
        }
        std::task::Poll::Ready(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection whose task counts its wakeups.
    struct Conn {
        shared: Shared,
        wakes: std::sync::atomic::AtomicUsize,
    }

    impl Connection for Conn {
        fn interim(&self) -> &Shared {
            &self.shared
        }
        fn wake(&self) {
            self.wakes.fetch_add(1, Ordering::Relaxed);
        }
    }

    impl std::ops::Deref for Conn {
        type Target = Shared;
        fn deref(&self) -> &Shared {
            &self.shared
        }
    }

    fn connection() -> (Arc<Conn>, Dropped) {
        let dropped = Dropped::default();
        let conn = Conn {
            shared: Shared::new(Arc::clone(&dropped)),
            wakes: Default::default(),
        };
        (Arc::new(conn), dropped)
    }

    #[test]
    fn queue_and_count_are_bounded() {
        // Nothing writes the queue here: the client does not read.
        let (shared, dropped) = connection();
        let sink = Sink::new(shared.clone());
        let mut h = HeaderMap::new();
        h.insert("link", "x".repeat(3000).parse().unwrap());
        let hints = StatusCode::from_u16(103).unwrap();
        for _ in 0..20 {
            sink.forward(hints, &h);
        }
        let block = encode(hints, &h).len();
        let queued = shared
            .pending
            .lock()
            .unwrap()
            .as_ref()
            .map_or(0, |q| q.len());
        assert_eq!(queued, MAX_QUEUED / block * block);
        assert_eq!(
            dropped.load(Ordering::Relaxed),
            20 - (MAX_QUEUED / block) as u64
        );
        // The count is per request: small blocks, and past MAX_PER_RESPONSE all are dropped.
        *shared.pending.lock().unwrap() = None;
        shared.seen.store(0, Ordering::Relaxed);
        dropped.store(0, Ordering::Relaxed);
        for _ in 0..20 {
            sink.forward(hints, &HeaderMap::new());
        }
        assert_eq!(
            dropped.load(Ordering::Relaxed),
            20 - u64::from(MAX_PER_RESPONSE)
        );
    }

    /// The claim flag lets the connection skip the lock after every response; a claim is
    /// taken once, and a withdrawn one is gone.
    #[test]
    fn an_upgrade_claim_is_taken_once_and_can_be_withdrawn() {
        let (shared, _) = connection();
        let sink = Sink::new(shared.clone());
        assert!(shared.take_upgrade().is_none());
        let _rx = sink.claim_upgrade();
        assert!(shared.take_upgrade().is_some());
        assert!(shared.take_upgrade().is_none());
        let _rx = sink.claim_upgrade();
        sink.unclaim_upgrade();
        assert!(shared.take_upgrade().is_none());
    }

    #[test]
    fn encodes_early_hints_without_hop_by_hop_fields() {
        let mut h = HeaderMap::new();
        h.insert("link", "</a.css>; rel=preload".parse().unwrap());
        h.insert("connection", "x-hop".parse().unwrap());
        h.insert("x-hop", "1".parse().unwrap());
        let b = encode(StatusCode::from_u16(103).unwrap(), &h);
        assert_eq!(
            String::from_utf8(b).unwrap(),
            "HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n"
        );
    }

    #[test]
    fn the_sink_queues_and_wakes_the_connection_which_writes_whole_blocks() {
        let (shared, _) = connection();
        let sink = Sink::new(shared.clone());
        let hints = StatusCode::from_u16(103).unwrap();
        let mut h = HeaderMap::new();
        h.insert("link", "</a.css>; rel=preload".parse().unwrap());
        sink.forward(hints, &h);
        sink.forward(hints, &h);
        assert!(shared.queued());
        assert_eq!(shared.wakes.load(Ordering::Relaxed), 2);
        let mut out = Vec::new();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(shared.poll_at_flush(&mut out, &mut cx).is_ready());
        let block = "HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n";
        assert_eq!(String::from_utf8(out).unwrap(), block.repeat(2));
        assert!(!shared.queued());
    }

    /// A 1xx callback that comes after the handler returned (its upstream request outlived it,
    /// e.g. past a timeout) is dropped: it would land inside a later response.
    #[tokio::test]
    async fn nothing_is_forwarded_once_the_handler_returned() {
        let (shared, dropped) = connection();
        let sink = Sink::new(shared.clone());
        let late = sink
            .clone()
            .scope(async {
                let current = Sink::current().expect("the sink is in reach of the handler");
                current.forward(StatusCode::from_u16(103).unwrap(), &HeaderMap::new());
                current
            })
            .await;
        assert!(shared.queued());
        *shared.pending.lock().unwrap() = None;
        shared.queued.store(false, Ordering::Release);
        late.forward(StatusCode::from_u16(103).unwrap(), &HeaderMap::new());
        assert!(!shared.queued());
        assert_eq!(dropped.load(Ordering::Relaxed), 1);
        // The next request's handler forwards again.
        sink.scope(async {
            Sink::current()
                .unwrap()
                .forward(StatusCode::from_u16(103).unwrap(), &HeaderMap::new());
        })
        .await;
        assert!(shared.queued());
    }

    /// hyper still holds bytes of a pipelined response when the next request's handler
    /// returns: its head follows them with no flush between, so blocks queued meanwhile are
    /// dropped (and counted) rather than written after it. With nothing owed they go first.
    #[tokio::test]
    async fn blocks_that_could_only_follow_the_final_head_are_dropped() {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let hints = StatusCode::from_u16(103).unwrap();
        for owed in [false, true] {
            let (shared, dropped) = connection();
            let mut out = Vec::new();
            if owed {
                // hyper wrote part of a response and has not flushed.
                assert!(shared.poll_before_write(&mut out, &mut cx).is_ready());
            }
            Sink::new(shared.clone())
                .scope(async {
                    let sink = Sink::current().unwrap();
                    sink.forward(hints, &HeaderMap::new());
                    sink.forward(hints, &HeaderMap::new());
                })
                .await;
            assert!(shared.poll_before_write(&mut out, &mut cx).is_ready());
            let written = String::from_utf8(out).unwrap().matches("103").count();
            let lost = dropped.load(Ordering::Relaxed);
            assert_eq!((written, lost), if owed { (0, 2) } else { (2, 0) });
        }
    }
}
