//! One connection's life: hyper serving it (HTTP/1.1 keep-alive and pipelining, or HTTP/2),
//! with the per-connection limits, the idle watchdog, parking between requests, and graceful
//! shutdown. The connection path is generic over its [`Stream`]: the acceptor hands over the
//! stream and the protocol to speak on it (see [`Protocol`]).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use tokio::sync::watch;

use super::io::{Activity, Stream, Tracked, WatchdogTimer};
use crate::body::{Body, RequestBody};
use crate::config::ServerConfig;
use crate::interim;
use crate::memory;
use crate::route::LiveRouter;

/// The protocol a connection speaks, as its acceptor found out: a plain-TCP listener by
/// peeking at the first bytes (h2c prior knowledge), a TLS listener by ALPN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    Http2,
}

/// What each connection is built with: hyper's connection builders, one per protocol, the
/// settings checked per request, and the counter of dropped 1xx responses. larder tells HTTP/2 prior knowledge from
/// HTTP/1.1 itself (by peeking at the first bytes, see `listen::protocol`) rather than through
/// hyper-util's `auto` builder: `auto` reads the first bytes into a side buffer that hyper's
/// read buffer then grows around (16 KiB instead of 8 KiB per connection), and its connection
/// future is sized for HTTP/2 even on HTTP/1.1 connections.
pub struct Builders {
    h1: http1::Builder,
    h2: http2::Builder<TokioExecutor>,
    /// `h2` that also accepts WebSocket over HTTP/2 (RFC 8441's extended CONNECT), for
    /// listeners whose routes serve it ([`crate::route::Router::websocket_over_h2`]).
    h2_ws: http2::Builder<TokioExecutor>,
    pub h2c: bool,
    pub header_read_timeout: Duration,
    /// Request header fields at most (HTTP/2 is checked by [`crate::inbound::admit`]).
    max_headers: usize,
    /// The server's count of origins' 1xx responses dropped, shared by every connection.
    pub interim_dropped: interim::Dropped,
    /// Connections closed on a `proxy_protocol` listener for want of a valid PROXY header.
    pub proxy_refused: Arc<std::sync::atomic::AtomicU64>,
}

pub fn connection_builder(cfg: &ServerConfig) -> Builders {
    // hyper answers 431 to a request head over `max_header_size`. The read buffer may grow a
    // little past that so the oversized head is read whole: closing with unread input would
    // reset the connection and lose the 431.
    let max_head = cfg.max_header_size.0 as usize;
    let max_buf = (max_head + 16 * 1024).max(8192);
    let mut h1 = http1::Builder::new();
    h1.timer(WatchdogTimer)
        .keep_alive(true)
        // Without half-close, hyper reads the socket for EOF while a request is in flight,
        // reserving read-buffer space while the request still borrows the buffer: a second
        // allocation per request. The cost: a client vanishing mid-request is noticed when
        // the response is written.
        .half_close(true)
        .header_read_timeout(cfg.header_read_timeout.0)
        .max_header_size(max_head)
        .max_buf_size(max_buf);
    // hyper parses up to 100 fields in a buffer on the stack; another count puts it on the heap
    // for every request, so the default is left to hyper.
    let max_headers = cfg.max_headers.get() as usize;
    if max_headers != 100 {
        h1.max_headers(max_headers);
    }
    let mut h2 = http2::Builder::new(TokioExecutor::new());
    h2.timer(TokioTimer::new())
        .max_header_list_size(cfg.max_header_size.0.min(u32::MAX as u64) as u32)
        .max_concurrent_streams(256)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(20));
    let mut h2_ws = h2.clone();
    h2_ws.enable_connect_protocol();
    Builders {
        h1,
        h2,
        h2_ws,
        h2c: cfg.h2c,
        header_read_timeout: cfg.header_read_timeout.0,
        max_headers,
        interim_dropped: Default::default(),
        proxy_refused: Default::default(),
    }
}

/// How long a connection may idle: closed after `timeout`; an HTTP/1.1 connection parks
/// (gives its buffers back) after `release` (zero: never), or after each response while more
/// than `park_above` connections are open. `head` is the time a client has to send a request
/// head, which hyper checks at the watchdog's ticks (see [`WatchdogTimer`]).
#[derive(Clone, Copy)]
pub struct Idle {
    pub timeout: Duration,
    pub release: Duration,
    pub head: Duration,
    pub park_above: usize,
    /// The connection bound (`max_connections`), to count open connections by.
    pub max_conns: usize,
}

/// A connection as its acceptor hands it over: the stream, the protocol to speak on it and the
/// peer's address (the socket's, or its PROXY header's source).
pub struct Accepted<S> {
    pub stream: S,
    pub protocol: Protocol,
    pub peer: SocketAddr,
}

/// Serves one connection until the peer closes, it idles out, or shutdown completes: the
/// connection's task.
pub fn serve_connection<T: Stream>(
    accepted: Accepted<T>,
    router: LiveRouter,
    builder: Arc<Builders>,
    idle: Idle,
    shutdown: watch::Receiver<bool>,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> impl Future<Output = ()> + Send + Unpin + 'static {
    let Accepted {
        stream,
        protocol,
        peer,
    } = accepted;
    let routers = crate::route::RouterCache::new(router);
    let (ws_h2, metrics) = {
        let first = routers.current();
        // Decided per connection by the routes in force when it opens.
        let ws_h2 = protocol == Protocol::Http2 && first.websocket_over_h2();
        (ws_h2, first.metrics().cloned())
    };
    let interim_dropped = Arc::clone(&builder.interim_dropped);
    let activity = Arc::new(Activity::new(interim_dropped, metrics));
    let in_service = Arc::clone(&activity);
    // HTTP/1.1 only: interim responses are written on the connection between responses, which
    // HTTP/2's framing does not allow.
    let sink = (protocol == Protocol::Http1).then(|| interim::Sink::new(activity.clone()));
    let max_headers = builder.max_headers;
    // The request future is `Unpin` (its handler's part is boxed), which hyper asks of a
    // connection it hands back (see `ServeH1`).
    let service = service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
        use hyper::body::Body as _;
        let busy = InFlight::enter(Arc::clone(&in_service), !req.body().is_end_stream());
        if T::SECURE {
            req.extensions_mut().insert(crate::http::fields::Secure);
        }
        // The router in force now serves this request to its end, whatever reloads come.
        let router = routers.current();
        // The client: the connection's peer, or who the listener's trusted proxies name.
        let peer = router.client(&mut req, peer);
        let mut observed = router.observe(&mut req, peer);
        // Every handler gets the request with its one authority (or it is refused here).
        let (serving, route) = match crate::inbound::admit(&mut req, max_headers) {
            Ok(()) => router.dispatch_route(req.map(RequestBody::Hyper), peer, sink.clone()),
            Err(refused) => (
                crate::route::Serving::Ready(Some(refused.response())),
                crate::route::UNROUTED,
            ),
        };
        if let Some(o) = &mut observed {
            o.routed(route, &router);
        }
        InService {
            serving,
            busy,
            observed,
        }
    });
    let mut tracked = Tracked::new(stream, Arc::clone(&activity));
    if protocol == Protocol::Http2 {
        tracked = tracked.batched();
    }
    let io = TokioIo::new(tracked);
    match protocol {
        Protocol::Http2 => {
            // Boxed: the HTTP/2 connection state is large and rare; HTTP/1.1 tasks stay small.
            let h2 = if ws_h2 { &builder.h2_ws } else { &builder.h2 };
            let conn = h2.serve_connection(io, service);
            Serve::H2(Box::pin(drive_h2(
                conn,
                peer,
                activity,
                idle.timeout,
                shutdown,
                permit,
            )))
        }
        Protocol::Http1 => {
            let conn = Box::new(builder.h1.serve_connection(io, service));
            Serve::H1(ServeH1::new(
                conn, activity, peer, builder, idle, permit, shutdown,
            ))
        }
    }
}

/// What an HTTP/1.1 connection's service must be for [`ServeH1`]: hyper asks `Unpin` of a
/// connection it hands back (`into_parts`). Implemented for every such service.
trait H1Service:
    hyper::service::HttpService<
        hyper::body::Incoming,
        ResBody = crate::body::Body,
        Future: Unpin,
        Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    > + Unpin
{
}

impl<S> H1Service for S where
    S: hyper::service::HttpService<
            hyper::body::Incoming,
            ResBody = crate::body::Body,
            Future: Unpin,
            Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        > + Unpin
{
}

/// A connection's task: HTTP/1.1 inline, HTTP/2 boxed. The tag comes first, then what an
/// HTTP/1.1 request reads (see [`ServeH1`]).
#[repr(u8)]
#[allow(clippy::large_enum_variant)] // The common case is inline; boxing it is what this avoids.
enum Serve<T: Stream, S: hyper::service::HttpService<hyper::body::Incoming>> {
    H1(ServeH1<T, S>),
    H2(Pin<Box<dyn Future<Output = ()> + Send>>),
}

impl<T, S> Future for Serve<T, S>
where
    T: Stream,
    S: H1Service,
{
    type Output = ();

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.get_mut() {
            Serve::H1(h1) => Pin::new(h1).poll(cx),
            Serve::H2(h2) => h2.as_mut().poll(cx),
        }
    }
}

/// The connection as hyper sees it.
type H1Io<T> = TokioIo<Tracked<T>>;

/// What an HTTP/1.1 connection task holds between wakeups.
enum Phase<T, S: hyper::service::HttpService<hyper::body::Incoming>> {
    /// A hyper connection reads, serves and writes requests.
    Serving(Box<http1::Connection<H1Io<T>, S>>),
    /// hyper's state is gone; the task waits on the bare stream for the next request.
    Parked(Tracked<T>, S),
    /// Between the two (only while switching).
    Switching,
    /// The end: the stream is being shut down (or a refused hand-over's stream).
    Closing(Pin<Box<dyn Future<Output = ()> + Send>>),
}

/// Serves HTTP/1.1 on a connection until the peer closes, it idles out, shutdown completes, or
/// it is handed over after a 101 (claimed in `activity.interim`).
///
/// While requests come, a hyper connection serves them. Between requests the connection may
/// *park*: hyper hands the socket back (with any bytes it read ahead) and its state (two 8 KiB
/// buffers, the cached header map, the in-flight slot) is freed; the task then waits on the
/// bare stream ([`Stream::poll_parked`]) and starts a new hyper connection when the client speaks again. It parks
/// - once idle for `idle.release`, so idle keep-alive connections cost a few hundred bytes
///   instead of two 8 KiB buffers (nginx frees a keep-alive connection's buffers too);
/// - right after each response while more than `idle.park_above` connections are open: with
///   thousands of connections, per-connection state that lives across requests is cold in
///   the CPU's caches by the time its next request comes, while state built per request comes
///   from the allocator's recently freed, cache-warm memory (docs/design.md "Parking").
///
/// The watchdog (one timer, re-armed at its ticks, and the shutdown signal) is polled only
/// when one of them woke the task (see [`Activity`]), not at every request.
///
/// A future written by hand, not an `async fn`: with thousands of connections the task's
/// memory is cold when a request comes, and each separately placed part of a generator (its
/// state tag, its caller's, the locals a request reads) cost a cache miss of its own. Here what
/// every request reads comes first, together, right behind tokio's task header.
#[repr(C)]
struct ServeH1<T, S: hyper::service::HttpService<hyper::body::Incoming>> {
    /// Also where the connection hands itself over after a 101 (`crate::upgrade`).
    activity: Arc<Activity>,
    /// Shutting down: hyper finishes what it has, nothing parks.
    closing: bool,
    /// hyper is asked to hand the connection back once it is idle (or done with its response).
    releasing: bool,
    /// The release was asked for by the idle watchdog (not per request).
    idle_release: bool,
    open: Open,
    phase: Phase<T, S>,
    // Read at the watchdog's wakeups, and when the connection parks or ends.
    watchdog: Watchdog,
    builder: Arc<Builders>,
    peer: SocketAddr,
}

/// The connection's idle watchdog: a timer re-armed at each tick, and the shutdown signal,
/// polled with `waker` (the connection's [`Activity`]: it notes that one of them fired).
struct Watchdog {
    waker: Waker,
    sleep: Pin<Box<tokio::time::Sleep>>,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    tick: Duration,
    /// Idle this long, the connection closes.
    timeout: Duration,
    /// Idle this long, the connection parks (None: only after responses, when crowded).
    release: Option<Duration>,
    idle_for: Duration,
}

/// The connection's place under the connection bound (`max_connections`, counted by its
/// semaphore), and the count of open connections above which it parks after each response.
struct Open {
    /// None once handed over (the upgraded stream holds it).
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    max: usize,
    park_above: usize,
}

impl Open {
    /// More than `park_above` connections are open.
    #[inline]
    fn crowded(&self) -> bool {
        self.permit
            .as_ref()
            .is_some_and(|p| self.max - p.semaphore().available_permits() > self.park_above)
    }
}

/// What [`ServeH1`] does after an event.
#[derive(PartialEq, Eq)]
enum Step {
    Continue,
    Done,
}

impl<T, S> ServeH1<T, S>
where
    T: Stream,
    S: H1Service,
{
    fn new(
        mut conn: Box<http1::Connection<H1Io<T>, S>>,
        activity: Arc<Activity>,
        peer: SocketAddr,
        builder: Arc<Builders>,
        idle: Idle,
        permit: tokio::sync::OwnedSemaphorePermit,
        mut shutdown: watch::Receiver<bool>,
    ) -> Self {
        let closing = *shutdown.borrow();
        if closing {
            Pin::new(&mut *conn).graceful_shutdown();
        }
        let release = !idle.release.is_zero() && idle.release < idle.timeout;
        // The watchdog also wakes hyper to check its request-head deadline.
        let tick = if release { idle.release } else { idle.timeout }
            .min(idle.head)
            .max(Duration::from_millis(10));
        // Set: the watchdog's futures are polled (and so registered) at the first poll.
        activity.watchdog_woken.store(true, Ordering::Release);
        let waker = Waker::from(Arc::clone(&activity));
        ServeH1 {
            activity,
            closing,
            releasing: false,
            idle_release: false,
            open: Open {
                permit: Some(permit),
                max: idle.max_conns,
                park_above: idle.park_above,
            },
            phase: Phase::Serving(conn),
            watchdog: Watchdog {
                waker,
                sleep: Box::pin(tokio::time::sleep(tick)),
                shutdown: Box::pin(async move {
                    let _ = shutdown.changed().await;
                }),
                tick,
                timeout: idle.timeout,
                release: release.then_some(idle.release),
                idle_for: Duration::ZERO,
            },
            builder,
            peer,
        }
    }

    /// Polls hyper (or the parked stream), then the watchdog if it woke the task.
    #[inline]
    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Watch> {
        // First: a wakeup that comes while hyper is polled below (the watchdog's, or the
        // interim sink's with a 1xx block to write) polls the task again.
        self.activity.task.register(cx.waker());
        match &mut self.phase {
            Phase::Serving(conn) => {
                if let Poll::Ready(res) = conn.poll_without_shutdown(cx) {
                    return Poll::Ready(Watch::Done(res));
                }
                // A response body asked for the socket and hyper has written the head.
                if self.activity.interim.handoff_ready() {
                    return Poll::Ready(Watch::HandOff);
                }
                // Nothing in flight and hyper waits: it is idle, or still writing a response
                // whose body the service has handed over. Either way hyper hands the
                // connection back once its response is out. Not before this hyper connection
                // has served a request (it may hold part of a head it read ahead, and letting
                // go would mark that request `connection: close`), nor after a request with a
                // body (see `Activity::with_body`).
                if !self.releasing
                    && !self.closing
                    && self.activity.in_flight.load(Ordering::Relaxed) == 0
                    && self.activity.served.load(Ordering::Relaxed)
                    && !self.activity.with_body.load(Ordering::Relaxed)
                    && self.open.crowded()
                {
                    self.releasing = true;
                    Pin::new(&mut **conn).graceful_shutdown();
                    if let Poll::Ready(res) = conn.poll_without_shutdown(cx) {
                        return Poll::Ready(Watch::Done(res));
                    }
                }
            }
            Phase::Parked(tracked, _) => {
                if let Poll::Ready(r) = tracked.poll_parked(cx) {
                    return Poll::Ready(match r {
                        Ok(()) => Watch::Readable,
                        Err(e) => Watch::Failed(e),
                    });
                }
            }
            Phase::Switching | Phase::Closing(_) => {
                unreachable!("a phase is set before the task yields, and a closing one ends it")
            }
        }
        if self.closing {
            return Poll::Pending;
        }
        if self.activity.watchdog_woken.swap(false, Ordering::AcqRel) {
            let w = &mut self.watchdog;
            let mut wcx = Context::from_waker(&w.waker);
            if w.shutdown.as_mut().poll(&mut wcx).is_ready() {
                return Poll::Ready(Watch::Shutdown);
            }
            if w.sleep.as_mut().poll(&mut wcx).is_ready() {
                return Poll::Ready(Watch::Tick);
            }
        }
        Poll::Pending
    }

    /// Acts on what woke the task.
    fn on_event(&mut self, event: Watch) -> Step {
        // hyper wrote a 101 and stopped, or the head of a response whose body the handler
        // writes itself: the socket goes to the handler that claimed it.
        if matches!(event, Watch::Done(Ok(())) | Watch::HandOff) {
            if let Some(to) = self.activity.interim.take_upgrade() {
                let Phase::Serving(conn) = std::mem::replace(&mut self.phase, Phase::Switching)
                else {
                    unreachable!("hyper finished, so it was serving")
                };
                let parts = conn.into_parts();
                let tracked = parts.io.into_inner();
                // The bare stream, unless a parked read left bytes in the wrapper; from here
                // no watchdog or 1xx queue looks at it.
                let io: Box<dyn crate::upgrade::Io> = if tracked.pending.is_empty() {
                    Box::new(tracked.inner)
                } else {
                    Box::new(tracked)
                };
                // hyper's buffers are freed with its connection state.
                memory::connection_released();
                let handed = crate::upgrade::Upgraded {
                    io,
                    // A copy of what hyper read ahead (usually nothing): a slice of its read
                    // buffer would keep all 8 KiB of it alive as long as the connection.
                    read_ahead: if parts.read_buf.is_empty() {
                        Bytes::new()
                    } else {
                        Bytes::copy_from_slice(&parts.read_buf)
                    },
                    // The connection still counts against `max_connections`.
                    permit: self.open.permit.take(),
                };
                if let Err(mut back) = to.send(handed) {
                    self.phase = Phase::Closing(Box::pin(async move {
                        let _ = tokio::io::AsyncWriteExt::shutdown(&mut back.io).await;
                    }));
                    return Step::Continue;
                }
                return Step::Done;
            }
        }
        match event {
            Watch::Done(Ok(())) if self.releasing && !self.closing => {
                let Phase::Serving(conn) = std::mem::replace(&mut self.phase, Phase::Switching)
                else {
                    unreachable!("hyper finished, so it was serving")
                };
                if self.idle_release {
                    memory::connection_released();
                }
                self.releasing = false;
                self.idle_release = false;
                let http1::Parts {
                    io,
                    read_buf,
                    service,
                    ..
                } = conn.into_parts();
                let mut tracked = io.into_inner();
                // An empty `read_buf` still owns hyper's whole read buffer: it goes now.
                if !read_buf.is_empty() {
                    // hyper read ahead (part of a request head): it is read again first.
                    tracked.pending = if tracked.pending.is_empty() {
                        Bytes::copy_from_slice(&read_buf)
                    } else {
                        [&read_buf[..], &tracked.pending[..]].concat().into()
                    };
                }
                drop(read_buf);
                self.activity.served.store(false, Ordering::Relaxed);
                self.activity.with_body.store(false, Ordering::Relaxed);
                self.phase = if tracked.pending.is_empty() {
                    Phase::Parked(tracked, service)
                } else {
                    Phase::Serving(Box::new(
                        self.builder
                            .h1
                            .serve_connection(TokioIo::new(tracked), service),
                    ))
                };
                Step::Continue
            }
            Watch::Done(res) => {
                match res {
                    Ok(()) => {
                        let phase = std::mem::replace(&mut self.phase, Phase::Switching);
                        if let Phase::Serving(conn) = phase {
                            let mut io = conn.into_parts().io;
                            self.phase = Phase::Closing(Box::pin(async move {
                                let _ = tokio::io::AsyncWriteExt::shutdown(io.inner_mut()).await;
                            }));
                            return Step::Continue;
                        }
                    }
                    Err(e) => {
                        tracing::debug!(peer = %self.peer, error = %e, "connection ended with an error")
                    }
                }
                Step::Done
            }
            Watch::Failed(e) => {
                tracing::debug!(peer = %self.peer, error = %e, "connection ended with an error");
                Step::Done
            }
            Watch::Readable => {
                let Phase::Parked(tracked, service) =
                    std::mem::replace(&mut self.phase, Phase::Switching)
                else {
                    unreachable!("the stream became readable while parked")
                };
                self.phase = Phase::Serving(Box::new(
                    self.builder
                        .h1
                        .serve_connection(TokioIo::new(tracked), service),
                ));
                Step::Continue
            }
            Watch::Shutdown => {
                self.closing = true;
                match &mut self.phase {
                    Phase::Serving(conn) => {
                        Pin::new(&mut **conn).graceful_shutdown();
                        Step::Continue
                    }
                    // Nothing in flight: close now.
                    _ => Step::Done,
                }
            }
            // Asked for without a claim: nothing can take the socket.
            Watch::HandOff => Step::Done,
            Watch::Tick => self.on_tick(),
        }
    }

    /// The watchdog's timer fired: re-armed; the connection parks or closes if it idled long
    /// enough.
    fn on_tick(&mut self) -> Step {
        let w = &mut self.watchdog;
        w.sleep.as_mut().reset(tokio::time::Instant::now() + w.tick);
        // The new deadline is registered at the next poll.
        self.activity.watchdog_woken.store(true, Ordering::Release);
        if self.activity.take_active() || self.activity.in_flight.load(Ordering::Relaxed) > 0 {
            w.idle_for = Duration::ZERO;
            return Step::Continue;
        }
        w.idle_for += w.tick;
        let Phase::Serving(conn) = &mut self.phase else {
            return if w.idle_for >= w.timeout {
                Step::Done
            } else {
                Step::Continue
            };
        };
        if w.idle_for >= w.timeout {
            if self.releasing {
                // Handing back waits for a response stalled this long: give up.
                return Step::Done;
            }
            self.closing = true;
        } else if !self.releasing && w.release.is_some_and(|r| w.idle_for >= r) {
            self.releasing = true;
            self.idle_release = true;
        } else {
            return Step::Continue;
        }
        // An idle connection closes at once; one still writing a response finishes it.
        Pin::new(&mut **conn).graceful_shutdown();
        Step::Continue
    }
}

impl<T, S: hyper::service::HttpService<hyper::body::Incoming>> Drop for ServeH1<T, S> {
    /// The connection (and its socket) goes before its place under `max_connections` (`open`,
    /// declared earlier, would otherwise be released first).
    fn drop(&mut self) {
        self.phase = Phase::Switching;
    }
}

impl<T, S> Future for ServeH1<T, S>
where
    T: Stream,
    S: H1Service,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            if let Phase::Closing(closing) = &mut this.phase {
                return closing.as_mut().poll(cx);
            }
            let event = std::task::ready!(this.poll_event(cx));
            if this.on_event(event) == Step::Done {
                return Poll::Ready(());
            }
        }
    }
}

/// What woke [`ServeH1`].
enum Watch {
    Done(hyper::Result<()>),
    /// The parked stream has bytes (or EOF) to read.
    Readable,
    /// Waiting on the parked stream failed.
    Failed(std::io::Error),
    Shutdown,
    Tick,
    /// A response body asked for the socket (`interim::Sink::ask_handoff`).
    HandOff,
}

/// Runs an HTTP/2 connection to its end beside the idle watchdog and the shutdown signal.
async fn drive_h2<C>(
    conn: C,
    peer: SocketAddr,
    activity: Arc<Activity>,
    idle_timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
    // The connection's place under `max_connections`, held until it ends.
    _permit: tokio::sync::OwnedSemaphorePermit,
) where
    C: GracefulConnection,
    C::Error: std::fmt::Display,
{
    tokio::pin!(conn);
    let mut closing = *shutdown.borrow();
    if closing {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            // The writes of one poll leave together, at the next (see `Tracked::batched`).
            res = std::future::poll_fn(|cx| {
                let r = conn.as_mut().poll(cx);
                if r.is_pending() {
                    activity.flush_at_next_poll(cx);
                }
                r
            }) => {
                if let Err(e) = res {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = shutdown.changed(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = tokio::time::sleep(idle_timeout), if !closing => {
                if !activity.take_active() && activity.in_flight.load(Ordering::Relaxed) == 0 {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// A request's response future, counted in flight until it is dropped (hyper drops it once
/// the response is ready, or when the connection goes).
struct InService {
    serving: crate::route::Serving,
    /// In flight; its connection's [`Activity`] lends the metrics the request is counted in.
    busy: InFlight,
    /// Counted and logged when it completes (metrics or access log on).
    observed: Option<crate::route::Observed>,
}

impl Future for InService {
    type Output = Result<Response<Body>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut r = std::task::ready!(Pin::new(&mut self.serving).poll(cx));
        if let Some(o) = self.observed.take() {
            o.finish(&mut r, self.busy.0.metrics.as_ref());
        }
        Poll::Ready(Ok(r))
    }
}

/// Counts a request as in flight until dropped (also when the request is cancelled).
struct InFlight(Arc<Activity>);

impl InFlight {
    fn enter(a: Arc<Activity>, with_body: bool) -> InFlight {
        a.in_flight.fetch_add(1, Ordering::Relaxed);
        a.served.store(true, Ordering::Relaxed);
        if with_body {
            a.with_body.store(true, Ordering::Relaxed);
        }
        InFlight(a)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio::sync::Semaphore;

    /// Any stream serves: an in-memory one here, parked with the default `poll_parked`.
    impl Stream for DuplexStream {}

    type Handled = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    /// One HTTP/1.1 connection served over an in-memory stream.
    struct Served {
        client: DuplexStream,
        activity: Arc<Activity>,
        sink: interim::Sink,
        _shutdown: watch::Sender<bool>,
    }

    /// Serves a connection whose every request is answered by `handler`, parking after
    /// `release` idle.
    fn serve<H, F>(release: Duration, handler: H) -> Served
    where
        H: Fn() -> F + Send + Unpin + 'static,
        F: Future<Output = Response<Body>> + Send + 'static,
    {
        let (client, server) = tokio::io::duplex(64 << 10);
        let activity = Arc::new(Activity::new(interim::Dropped::default(), None));
        let sink = interim::Sink::new(activity.clone());
        let io = TokioIo::new(Tracked::new(server, Arc::clone(&activity)));
        let activity_of_task = Arc::clone(&activity);
        let service = service_fn(move |_| -> Handled {
            let answer = handler();
            Box::pin(async move { Ok(answer.await) })
        });
        let (tx, shutdown) = watch::channel(false);
        tokio::spawn(async move {
            let builder = Arc::new(connection_builder(&ServerConfig::default()));
            let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
            let idle = Idle {
                timeout: Duration::from_secs(10),
                release,
                head: Duration::from_secs(10),
                park_above: usize::MAX,
                max_conns: 1,
            };
            let peer = "127.0.0.1:1".parse().unwrap();
            let conn = Box::new(builder.h1.serve_connection(io, service));
            ServeH1::new(
                conn,
                activity_of_task,
                peer,
                builder,
                idle,
                permit,
                shutdown,
            )
            .await;
        });
        Served {
            client,
            activity,
            sink,
            _shutdown: tx,
        }
    }

    /// Reads until `end` has come, or fails after a second.
    async fn read_until(client: &mut DuplexStream, end: &str) -> String {
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(1), async {
            let mut buf = [0u8; 1024];
            while !String::from_utf8_lossy(&got).ends_with(end) {
                let n = client.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
                got.extend_from_slice(&buf[..n]);
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no {end:?} in {:?}", String::from_utf8_lossy(&got)));
        String::from_utf8(got).unwrap()
    }

    /// The sink is called from another task (the upstream client's, in larder): the block it
    /// queues goes out through the connection's writer while the handler still waits, before
    /// the final response.
    #[tokio::test]
    async fn a_1xx_block_goes_out_while_the_handler_still_waits() {
        let (started_tx, started) = tokio::sync::mpsc::unbounded_channel::<()>();
        let (release, answer) = tokio::sync::oneshot::channel::<()>();
        let answer = Mutex::new(Some(answer));
        let mut c = serve(Duration::ZERO, move || {
            let started = started_tx.clone();
            let answer = answer.lock().unwrap().take();
            async move {
                let _ = started.send(());
                if let Some(a) = answer {
                    let _ = a.await;
                }
                Response::new(Body::full("final"))
            }
        });
        let mut started = started;
        c.client
            .write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        started.recv().await.unwrap();
        let sink = c.sink.clone();
        tokio::spawn(async move {
            let mut h = http::HeaderMap::new();
            h.insert("link", "</a.css>; rel=preload".parse().unwrap());
            sink.forward(http::StatusCode::from_u16(103).unwrap(), &h);
        });
        let hints = read_until(&mut c.client, "\r\n\r\n").await;
        assert_eq!(
            hints,
            "HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n"
        );
        release.send(()).unwrap();
        let last = read_until(&mut c.client, "final").await;
        assert!(last.starts_with("HTTP/1.1 200 OK\r\n"), "{last}");
    }

    /// Parking works on any stream: the parked read's bytes (half a request head) go to the
    /// next hyper connection first.
    #[tokio::test]
    async fn a_parked_connection_on_any_stream_serves_again() {
        let mut c = serve(Duration::from_millis(20), || async {
            Response::new(Body::full("ok"))
        });
        for _ in 0..2 {
            c.client
                .write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                .await
                .unwrap();
            assert!(read_until(&mut c.client, "ok")
                .await
                .starts_with("HTTP/1.1 200 OK"));
            // Parked once idle: hyper's state is gone.
            tokio::time::sleep(Duration::from_millis(150)).await;
            assert!(!c.activity.served.load(Ordering::Relaxed));
            c.client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
            tokio::time::sleep(Duration::from_millis(30)).await;
            c.client.write_all(b"Host: t\r\n\r\n").await.unwrap();
            assert!(read_until(&mut c.client, "ok")
                .await
                .starts_with("HTTP/1.1 200 OK"));
        }
    }
}
