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
use tokio::sync::{watch, Semaphore};

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
/// peer's address.
pub struct Accepted<S> {
    pub stream: S,
    pub protocol: Protocol,
    pub peer: SocketAddr,
}

/// Serves one connection until the peer closes, it idles out, or shutdown completes.
pub async fn serve_connection<S: Stream>(
    accepted: Accepted<S>,
    router: LiveRouter,
    builder: Arc<Builders>,
    idle: Idle,
    mut shutdown: watch::Receiver<bool>,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let Accepted {
        stream,
        protocol,
        peer,
    } = accepted;
    let activity = Arc::new(Activity::new(Arc::clone(&builder.interim_dropped)));
    let in_service = Arc::clone(&activity);
    // HTTP/1.1 only: interim responses are written on the connection between responses, which
    // HTTP/2's framing does not allow.
    let sink = (protocol == Protocol::Http1).then(|| interim::Sink::new(activity.clone()));
    // Decided per connection by the routes in force when it opens.
    let ws_h2 = protocol == Protocol::Http2 && router.load_full().websocket_over_h2();
    let routers = crate::route::RouterCache::new(router);
    let max_headers = builder.max_headers;
    // The request future is `Unpin` (its handler's part is boxed), which hyper asks of a
    // connection it hands back (see `serve_h1`).
    let service = service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
        use hyper::body::Body as _;
        let busy = InFlight::enter(Arc::clone(&in_service), !req.body().is_end_stream());
        // The router in force now serves this request to its end, whatever reloads come.
        let router = routers.current();
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
            _busy: busy,
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
            Box::pin(drive_h2(conn, peer, activity, idle.timeout, shutdown)).await;
        }
        Protocol::Http1 => {
            // Built here, so that the task keeps the stream and the service once, inside
            // hyper's connection (an `async fn`'s arguments stay in its future to the end).
            let conn = Box::new(builder.h1.serve_connection(io, service));
            serve_h1(
                conn,
                activity,
                peer,
                &builder.h1,
                idle,
                permit,
                &mut shutdown,
            )
            .await;
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
#[allow(clippy::too_many_arguments)] // The connection's parts, each passed once.
async fn serve_h1<T, S>(
    conn: Box<http1::Connection<H1Io<T>, S>>,
    activity: Arc<Activity>,
    peer: SocketAddr,
    h1: &http1::Builder,
    idle: Idle,
    permit: tokio::sync::OwnedSemaphorePermit,
    shutdown: &mut watch::Receiver<bool>,
) where
    T: Stream,
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = crate::body::Body> + Unpin,
    S::Future: Unpin,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let semaphore = Arc::clone(permit.semaphore());
    // What every request reads or writes, together (with thousands of connections the task's
    // state is cold when a request comes: fields spread over its future each cost a miss).
    let mut hot = Hot {
        phase: Phase::Serving(conn),
        activity,
        open: Open {
            permits: &semaphore,
            max: idle.max_conns,
            park_above: idle.park_above,
        },
        closing: *shutdown.borrow(),
        releasing: false,
        idle_release: false,
    };
    if hot.closing {
        if let Phase::Serving(conn) = &mut hot.phase {
            Pin::new(&mut **conn).graceful_shutdown();
        }
    }
    let release = !idle.release.is_zero() && idle.release < idle.timeout;
    // The watchdog also wakes hyper to check its request-head deadline.
    let tick = if release { idle.release } else { idle.timeout }
        .min(idle.head)
        .max(Duration::from_millis(10));
    let mut idle_for = Duration::ZERO;
    // Set: the watchdog's futures are polled (and so registered) at the first poll.
    hot.activity.watchdog_woken.store(true, Ordering::Release);
    let waker = Waker::from(Arc::clone(&hot.activity));
    let sleep = tokio::time::sleep(tick);
    let changed = shutdown.changed();
    tokio::pin!(sleep, changed);
    loop {
        let event = std::future::poll_fn(|cx| {
            // First: a wakeup that comes while hyper is polled below (the watchdog's, or the
            // interim sink's with a 1xx block to write) polls the task again.
            hot.activity.task.register(cx.waker());
            match &mut hot.phase {
                Phase::Serving(conn) => {
                    if let Poll::Ready(res) = conn.poll_without_shutdown(cx) {
                        return Poll::Ready(Watch::Done(res));
                    }
                    // A response body asked for the socket and hyper has written the head.
                    if hot.activity.interim.handoff_ready() {
                        return Poll::Ready(Watch::HandOff);
                    }
                    // Nothing in flight and hyper waits: it is idle, or still writing a
                    // response whose body the service has handed over. Either way hyper
                    // hands the connection back once its response is out. Not before this
                    // hyper connection has served a request (it may hold part of a head it
                    // read ahead, and letting go would mark that request `connection:
                    // close`), nor after a request with a body (see `Activity::with_body`).
                    if !hot.releasing
                        && !hot.closing
                        && hot.activity.in_flight.load(Ordering::Relaxed) == 0
                        && hot.activity.served.load(Ordering::Relaxed)
                        && !hot.activity.with_body.load(Ordering::Relaxed)
                        && hot.open.crowded()
                    {
                        hot.releasing = true;
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
                Phase::Switching => unreachable!("a phase is set before the task yields"),
            }
            if hot.closing {
                return Poll::Pending;
            }
            if hot.activity.watchdog_woken.swap(false, Ordering::AcqRel) {
                let mut wcx = Context::from_waker(&waker);
                if changed.as_mut().poll(&mut wcx).is_ready() {
                    return Poll::Ready(Watch::Shutdown);
                }
                if sleep.as_mut().poll(&mut wcx).is_ready() {
                    return Poll::Ready(Watch::Tick);
                }
            }
            Poll::Pending
        })
        .await;
        // hyper wrote a 101 and stopped, or the head of a response whose body the handler
        // writes itself: the socket goes to the handler that claimed it.
        if matches!(event, Watch::Done(Ok(())) | Watch::HandOff) {
            if let Some(to) = hot.activity.interim.take_upgrade() {
                let Phase::Serving(conn) = std::mem::replace(&mut hot.phase, Phase::Switching)
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
                    permit: Some(permit),
                };
                if let Err(back) = to.send(handed) {
                    let mut io = back.io;
                    let _ = tokio::io::AsyncWriteExt::shutdown(&mut io).await;
                }
                return;
            }
        }
        match event {
            Watch::Done(Ok(())) if hot.releasing && !hot.closing => {
                let Phase::Serving(conn) = std::mem::replace(&mut hot.phase, Phase::Switching)
                else {
                    unreachable!("hyper finished, so it was serving")
                };
                if hot.idle_release {
                    memory::connection_released();
                }
                hot.releasing = false;
                hot.idle_release = false;
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
                hot.activity.served.store(false, Ordering::Relaxed);
                hot.activity.with_body.store(false, Ordering::Relaxed);
                hot.phase = if tracked.pending.is_empty() {
                    Phase::Parked(tracked, service)
                } else {
                    Phase::Serving(Box::new(
                        h1.serve_connection(TokioIo::new(tracked), service),
                    ))
                };
            }
            Watch::Done(res) => {
                match res {
                    Ok(()) => {
                        if let Phase::Serving(conn) = hot.phase {
                            let mut io = conn.into_parts().io;
                            let _ = tokio::io::AsyncWriteExt::shutdown(io.inner_mut()).await;
                        }
                    }
                    Err(e) => tracing::debug!(%peer, error = %e, "connection ended with an error"),
                }
                return;
            }
            Watch::Failed(e) => {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
                return;
            }
            Watch::Readable => {
                let Phase::Parked(tracked, service) =
                    std::mem::replace(&mut hot.phase, Phase::Switching)
                else {
                    unreachable!("the stream became readable while parked")
                };
                hot.phase = Phase::Serving(Box::new(
                    h1.serve_connection(TokioIo::new(tracked), service),
                ));
            }
            Watch::Shutdown => {
                hot.closing = true;
                match &mut hot.phase {
                    Phase::Serving(conn) => Pin::new(&mut **conn).graceful_shutdown(),
                    // Nothing in flight: close now.
                    _ => return,
                }
            }
            // Asked for without a claim: nothing can take the socket.
            Watch::HandOff => return,
            Watch::Tick => {
                sleep.as_mut().reset(tokio::time::Instant::now() + tick);
                // The new deadline is registered at the next poll.
                hot.activity.watchdog_woken.store(true, Ordering::Release);
                if hot.activity.take_active() || hot.activity.in_flight.load(Ordering::Relaxed) > 0
                {
                    idle_for = Duration::ZERO;
                    continue;
                }
                idle_for += tick;
                let Phase::Serving(conn) = &mut hot.phase else {
                    if idle_for >= idle.timeout {
                        return;
                    }
                    continue;
                };
                if idle_for >= idle.timeout {
                    if hot.releasing {
                        // Handing back waits for a response stalled this long: give up.
                        return;
                    }
                    hot.closing = true;
                } else if release && !hot.releasing && idle_for >= idle.release {
                    hot.releasing = true;
                    hot.idle_release = true;
                } else {
                    continue;
                }
                // An idle connection closes at once; one still writing a response finishes it.
                Pin::new(&mut **conn).graceful_shutdown();
            }
        }
    }
}

/// The state of [`serve_h1`] that each request touches, kept in one place.
struct Hot<'a, T, S: hyper::service::HttpService<hyper::body::Incoming>> {
    phase: Phase<T, S>,
    /// Also where the connection hands itself over after a 101 (`crate::upgrade`).
    activity: Arc<Activity>,
    open: Open<'a>,
    /// Shutting down: hyper finishes what it has, nothing parks.
    closing: bool,
    /// hyper is asked to hand the connection back once it is idle (or done with its response).
    releasing: bool,
    /// The release was asked for by the idle watchdog (not per request).
    idle_release: bool,
}

/// The count of open connections, as the connection bound's semaphore knows it, and the
/// count above which a connection parks after each response.
#[derive(Clone, Copy)]
struct Open<'a> {
    permits: &'a Semaphore,
    max: usize,
    park_above: usize,
}

impl Open<'_> {
    /// More than `park_above` connections are open.
    #[inline]
    fn crowded(&self) -> bool {
        self.max - self.permits.available_permits() > self.park_above
    }
}

/// What woke [`serve_h1`].
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
    _busy: InFlight,
    /// Counted and logged when it completes (metrics or access log on).
    observed: Option<crate::route::Observed>,
}

impl Future for InService {
    type Output = Result<Response<Body>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut r = std::task::ready!(Pin::new(&mut self.serving).poll(cx));
        if let Some(o) = self.observed.take() {
            o.finish(&mut r);
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
        let activity = Arc::new(Activity::new(interim::Dropped::default()));
        let sink = interim::Sink::new(activity.clone());
        let io = TokioIo::new(Tracked::new(server, Arc::clone(&activity)));
        let activity_of_task = Arc::clone(&activity);
        let service = service_fn(move |_| -> Handled {
            let answer = handler();
            Box::pin(async move { Ok(answer.await) })
        });
        let (tx, mut shutdown) = watch::channel(false);
        tokio::spawn(async move {
            let builder = connection_builder(&ServerConfig::default());
            let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
            let idle = Idle {
                timeout: Duration::from_secs(10),
                release,
                head: Duration::from_secs(10),
                park_above: usize::MAX,
                max_conns: 1,
            };
            let peer = "127.0.0.1:1".parse().unwrap();
            serve_h1(
                Box::new(builder.h1.serve_connection(io, service)),
                activity_of_task,
                peer,
                &builder.h1,
                idle,
                permit,
                &mut shutdown,
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
