//! Listening and connections: binding sockets, the accept loop, serving each connection with
//! hyper (HTTP/1.1 keep-alive and pipelining, h2c by prior knowledge on the same port), the
//! per-connection limits and timeouts, and graceful shutdown.
//!
//! Lifecycle: [`start`] binds every listener and spawns one accept loop each on the current
//! runtime, returning a [`Handle`]. A connection task runs hyper's connection future and, in the
//! same poll, an idle watchdog and the shutdown signal; on shutdown it asks hyper to finish
//! in-flight requests and close. [`Handle::shutdown`] waits for the connections up to the grace
//! period. A semaphore bounds open connections: at the bound, each accept loop holds the one
//! connection it accepted last, unserved, and accepts nothing more until a connection closes
//! (the kernel's backlog holds newer clients).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::Response;

use bytes::Bytes;

use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use crate::body::Body;
use crate::cache::Cache;
use crate::config::{Config, ServerConfig, Threading};
use crate::route::Router;

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
}

/// A running larder: its bound addresses, its cache, and the way to stop it.
pub struct Handle {
    /// Bound address of each configured listener, in configuration order.
    pub addrs: Vec<SocketAddr>,
    /// Bound address of the admin API listener, when configured.
    pub admin_addr: Option<SocketAddr>,
    pub cache: Arc<Cache>,
    /// Routers of each listener (for the startup banner).
    pub routers: Vec<Arc<Router>>,
    shutdown: watch::Sender<bool>,
    conns: Arc<Semaphore>,
    max_conns: usize,
    grace: Duration,
    interim_dropped: crate::interim::Dropped,
}

impl Handle {
    /// Stops accepting, lets in-flight requests finish for up to the grace period, and returns
    /// the number of connections still open when it gave up (0 when all closed in time).
    pub async fn shutdown(self) -> usize {
        let _ = self.shutdown.send(true);
        let deadline = tokio::time::Instant::now() + self.grace;
        loop {
            let open = self.max_conns - self.conns.available_permits();
            if open == 0 || tokio::time::Instant::now() >= deadline {
                return open;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.max_conns - self.conns.available_permits()
    }

    /// Interim (1xx) responses from origins dropped so far at the bounds of
    /// [`crate::interim`] (too many for one request, or a client not reading).
    pub fn interim_dropped(&self) -> u64 {
        self.interim_dropped.load(Ordering::Relaxed)
    }
}

/// Binds every listener of `config` and starts serving on the current tokio runtime.
///
/// With `threading = "per-core"` and more than one worker, the current runtime is worker 0 and
/// `workers - 1` more threads are started, each running a single-threaded runtime with its own
/// `SO_REUSEPORT` socket on every listener address; the cache, routes, connection bound and
/// shutdown signal are shared. Those threads end after shutdown (or when the [`Handle`] is
/// dropped) once the open connections drained or the grace period is over.
pub async fn start(config: Config) -> Result<Handle, Error> {
    let cache = Cache::new(config.cache.clone(), config.compression.clone());
    let server = Arc::new(config.server.clone());
    let max_conns = server.max_connections.get() as usize;
    let conns = Arc::new(Semaphore::new(max_conns));
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let builder = connection_builder(&server);
    let interim_dropped = Arc::clone(&builder.interim_dropped);
    let serving = Serving {
        builder: Arc::new(builder),
        server: Arc::clone(&server),
        conns: Arc::clone(&conns),
        shutdown: shutdown_rx,
    };
    let extra_threads = match server.threading {
        Threading::PerCore => server.worker_count().saturating_sub(1),
        Threading::WorkStealing => 0,
    };
    let reuse_port = extra_threads > 0;

    let mut addrs = Vec::new();
    let mut routers = Vec::new();
    for l in &config.listeners {
        let listener = bind(l.addr, reuse_port).map_err(|source| Error::Bind {
            addr: l.addr,
            source,
        })?;
        addrs.push(listener.local_addr().map_err(|source| Error::Bind {
            addr: l.addr,
            source,
        })?);
        let router = Arc::new(Router::new(l, &config.admin, &cache));
        routers.push(Arc::clone(&router));
        tokio::spawn(accept_loop(listener, router, serving.clone()));
    }
    for i in 1..=extra_threads {
        // Bind on this thread so that errors are reported by `start`.
        let mut listeners = Vec::with_capacity(addrs.len());
        for (addr, router) in addrs.iter().zip(&routers) {
            let std = bind_std(*addr, true).map_err(|source| Error::Bind {
                addr: *addr,
                source,
            })?;
            listeners.push((std, Arc::clone(router)));
        }
        let serving = serving.clone();
        std::thread::Builder::new()
            .name(format!("larder-worker-{i}"))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start worker runtime");
                        return;
                    }
                };
                rt.block_on(async move {
                    for (std, router) in listeners {
                        match TcpListener::from_std(std) {
                            Ok(l) => {
                                tokio::spawn(accept_loop(l, router, serving.clone()));
                            }
                            Err(e) => tracing::error!(error = %e, "cannot register listener"),
                        }
                    }
                    // Until shutdown (or the Handle is dropped), then until this process's
                    // connections drain or the grace period ends: dropping the runtime earlier
                    // would cut this thread's connections short.
                    let (server, conns) = (&serving.server, &serving.conns);
                    let mut stop = serving.shutdown.clone();
                    while !*stop.borrow_and_update() {
                        if stop.changed().await.is_err() {
                            break;
                        }
                    }
                    let deadline = tokio::time::Instant::now() + server.shutdown_grace.0;
                    while conns.available_permits() < server.max_connections.get() as usize
                        && tokio::time::Instant::now() < deadline
                    {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                });
            })
            .map_err(|source| Error::Bind {
                addr: addrs[0],
                source,
            })?;
    }
    tokio::spawn(return_freed_memory(serving.shutdown.clone()));
    let mut admin_addr = None;
    if let Some(addr) = config.admin.listen {
        let listener = bind(addr, false).map_err(|source| Error::Bind { addr, source })?;
        admin_addr = Some(
            listener
                .local_addr()
                .map_err(|source| Error::Bind { addr, source })?,
        );
        let router = Arc::new(Router::admin(&cache, config.admin.token.clone()));
        routers.push(Arc::clone(&router));
        tokio::spawn(accept_loop(listener, router, serving.clone()));
    }
    Ok(Handle {
        addrs,
        admin_addr,
        cache,
        routers,
        shutdown: shutdown_tx,
        conns,
        max_conns,
        grace: server.shutdown_grace.0,
        interim_dropped,
    })
}

/// Bytes freed since freed memory was last returned: buffers of connections going idle, and
/// the working memory of finished image transforms.
static RELEASED: AtomicUsize = AtomicUsize::new(0);

/// What an idle connection gives back (its read and write buffers).
const CONNECTION_BUFFERS: usize = 16 << 10;

/// Notes `bytes` of heap freed (e.g. an image transform's buffers), for [`return_freed_memory`].
pub fn memory_freed(bytes: u64) {
    let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
    RELEASED.fetch_add(bytes, Ordering::Relaxed);
}

/// glibc keeps freed memory in its arenas (and, once a large block was freed, serves blocks up
/// to 32 MiB from them rather than from fresh mappings). When enough has been freed (thousands
/// of clients going idle together, a burst of image transforms), this asks it, at most once a
/// second and off the async workers, to return the free pages of every arena to the system, so
/// that RSS follows what is really held.
async fn return_freed_memory(mut shutdown: watch::Receiver<bool>) {
    const ENOUGH: usize = 4 << 20;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if RELEASED.load(Ordering::Relaxed) >= ENOUGH {
            RELEASED.store(0, Ordering::Relaxed);
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            tokio::task::spawn_blocking(|| {
                // SAFETY: malloc_trim only returns free pages; it has no preconditions.
                unsafe { libc::malloc_trim(0) };
            });
        }
    }
}

/// What each connection is built with: hyper's connection builders, one per protocol, the
/// settings checked per request, and the counter of dropped 1xx responses. larder tells HTTP/2 prior knowledge from
/// HTTP/1.1 itself (by peeking at the first bytes, see [`sniff_h2`]) rather than through
/// hyper-util's `auto` builder: `auto` reads the first bytes into a side buffer that hyper's
/// read buffer then grows around (16 KiB instead of 8 KiB per connection), and its connection
/// future is sized for HTTP/2 even on HTTP/1.1 connections.
struct Builders {
    h1: http1::Builder,
    h2: http2::Builder<TokioExecutor>,
    h2c: bool,
    header_read_timeout: Duration,
    /// Request header fields at most (HTTP/2 is checked by [`crate::inbound::admit`]).
    max_headers: usize,
    /// The server's count of origins' 1xx responses dropped, shared by every connection.
    interim_dropped: crate::interim::Dropped,
}

fn connection_builder(cfg: &ServerConfig) -> Builders {
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
    Builders {
        h1,
        h2,
        h2c: cfg.h2c,
        header_read_timeout: cfg.header_read_timeout.0,
        max_headers,
        interim_dropped: Default::default(),
    }
}

/// hyper's timer for HTTP/1.1 connections, where its one use is the request-head deadline
/// (`header_read_timeout`), set anew for every request. Instead of an entry in tokio's timer
/// wheel per request, the deadline is compared with the clock whenever hyper polls it: the
/// connection's watchdog (see [`drive_h1`]) wakes the task at least every `header_read_timeout`,
/// and hyper polls the deadline each time it finds no complete head, so a slow head is cut off
/// at most one watchdog tick late.
#[derive(Clone, Copy)]
struct WatchdogTimer;

impl hyper::rt::Timer for WatchdogTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(Deadline(std::time::Instant::now() + duration))
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(Deadline(deadline))
    }
}

/// A deadline that registers no wakeup of its own (see [`WatchdogTimer`]).
struct Deadline(std::time::Instant);

impl Future for Deadline {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if std::time::Instant::now() >= self.0 {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl hyper::rt::Sleep for Deadline {}

/// Whether a new connection starts with the HTTP/2 connection preface (`PRI * HTTP/2.0`),
/// without consuming anything. None: the peer closed or sent nothing in time.
async fn sniff_h2(stream: &TcpStream, timeout: Duration) -> Option<bool> {
    const PREFACE: &[u8; 4] = b"PRI ";
    let deadline = tokio::time::Instant::now() + timeout;
    let mut buf = [0u8; 4];
    loop {
        let n = tokio::time::timeout_at(deadline, stream.peek(&mut buf))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        if buf[..n] != PREFACE[..n] {
            return Some(false);
        }
        if n == PREFACE.len() {
            return Some(true);
        }
        // A prefix of "PRI " (1-3 bytes in the first segment): peek again shortly.
        tokio::time::sleep(Duration::from_millis(2)).await;
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
    }
}

/// A listening socket with SO_REUSEADDR (and SO_REUSEPORT for per-core workers) and a deep
/// backlog.
fn bind(addr: SocketAddr, reuse_port: bool) -> io::Result<TcpListener> {
    TcpListener::from_std(bind_std(addr, reuse_port)?)
}

fn bind_std(addr: SocketAddr, reuse_port: bool) -> io::Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(8192)?;
    Ok(socket.into())
}

/// What every accept loop shares: connection builders, server settings, the connection bound
/// and the shutdown signal.
#[derive(Clone)]
struct Serving {
    builder: Arc<Builders>,
    server: Arc<ServerConfig>,
    conns: Arc<Semaphore>,
    shutdown: watch::Receiver<bool>,
}

async fn accept_loop(listener: TcpListener, router: Arc<Router>, serving: Serving) {
    let Serving {
        builder,
        server,
        conns,
        mut shutdown,
    } = serving;
    let mut warned_full = false;
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.changed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                if is_resource_exhaustion(&e) {
                    // Out of file descriptors: keep serving the connections we have, retry soon.
                    tracing::warn!(error = %e, "accept failed: out of file descriptors; backing off");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                } else {
                    tracing::debug!(error = %e, "accept failed");
                }
                continue;
            }
        };
        // At the connection bound, this accept loop holds the connection it just accepted and
        // stops accepting until a connection closes (the kernel's backlog holds newer clients).
        // The permit is taken after accepting so that per-core loops never sit on permits
        // they have no connection for.
        let permit = match Arc::clone(&conns).try_acquire_owned() {
            Ok(p) => {
                warned_full = false;
                p
            }
            Err(_) => {
                if !warned_full {
                    tracing::warn!(
                        max = server.max_connections.get(),
                        "connection limit reached; accepting paused"
                    );
                    warned_full = true;
                }
                tokio::select! {
                    p = Arc::clone(&conns).acquire_owned() => p.expect("semaphore never closed"),
                    _ = shutdown.changed() => return,
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let fut = serve_connection(
            stream,
            peer,
            Arc::clone(&router),
            Arc::clone(&builder),
            Idle {
                timeout: server.idle_timeout.0,
                release: server.idle_release.0,
                head: server.header_read_timeout.0,
                park_above: server.release_above_connections,
                max_conns: server.max_connections.get() as usize,
            },
            shutdown.clone(),
            permit,
        );
        tokio::spawn(fut);
    }
}

fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOBUFS) | Some(libc::ENOMEM)
    )
}

/// How long a connection may idle: closed after `timeout`; an HTTP/1.1 connection parks
/// (gives its buffers back) after `release` (zero: never), or after each response while more
/// than `park_above` connections are open. `head` is the time a client has to send a request
/// head, which hyper checks at the watchdog's ticks (see [`WatchdogTimer`]).
#[derive(Clone, Copy)]
struct Idle {
    timeout: Duration,
    release: Duration,
    head: Duration,
    park_above: usize,
    /// The connection bound (`max_connections`), to count open connections by.
    max_conns: usize,
}

/// Serves one connection until the peer closes, it idles out, or shutdown completes.
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: Arc<Router>,
    builder: Arc<Builders>,
    idle: Idle,
    mut shutdown: watch::Receiver<bool>,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let h2 = if builder.h2c {
        tokio::select! {
            r = sniff_h2(&stream, builder.header_read_timeout) => match r {
                Some(h2) => h2,
                None => return,
            },
            _ = shutdown.changed() => return,
        }
    } else {
        false
    };
    let activity = Arc::new(Activity::default());
    let in_service = Arc::clone(&activity);
    let interim = Arc::new(crate::interim::Shared::new(Arc::clone(
        &builder.interim_dropped,
    )));
    // HTTP/1.1 only: interim responses are written on the socket between responses, which
    // HTTP/2's framing does not allow.
    let sink = (!h2).then(|| {
        use std::os::fd::AsRawFd;
        crate::interim::Sink::new(stream.as_raw_fd(), Arc::clone(&interim))
    });
    let max_headers = builder.max_headers;
    // The request future is `Unpin` (its handler's part is boxed), which hyper asks of a
    // connection it hands back (see `serve_h1`).
    let service = service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
        use hyper::body::Body as _;
        let busy = InFlight::enter(Arc::clone(&in_service), !req.body().is_end_stream());
        // Every handler gets the request with its one authority (or it is refused here).
        let serving = match crate::inbound::admit(&mut req, max_headers) {
            Ok(()) => router.dispatch(req, peer, sink.clone()),
            Err(refused) => crate::route::Serving::Ready(Some(refused.response())),
        };
        InService {
            serving,
            _busy: busy,
        }
    });
    let io = TokioIo::new(Tracked {
        inner: stream,
        pending: Bytes::new(),
        activity: Arc::clone(&activity),
        interim,
    });
    if h2 {
        // Boxed: the HTTP/2 connection state is large and rare; HTTP/1.1 tasks stay small.
        let conn = builder.h2.serve_connection(io, service);
        Box::pin(drive_h2(conn, peer, activity, idle.timeout, shutdown)).await;
    } else {
        let open = Open {
            permits: permit.semaphore(),
            max: idle.max_conns,
        };
        serve_h1(io, service, peer, &builder.h1, idle, open, &mut shutdown).await;
    }
}

/// The socket as hyper sees it.
type H1Io = TokioIo<Tracked<TcpStream>>;

/// What an HTTP/1.1 connection task holds between wakeups.
enum Phase<S: hyper::service::HttpService<hyper::body::Incoming>> {
    /// A hyper connection reads, serves and writes requests.
    Serving(Box<http1::Connection<H1Io, S>>),
    /// hyper's state is gone; the task waits on the bare socket for the next request.
    Parked(Tracked<TcpStream>, S),
    /// Between the two (only while switching).
    Switching,
}

/// Serves HTTP/1.1 on a connection until the peer closes, it idles out, or shutdown completes.
///
/// While requests come, a hyper connection serves them. Between requests the connection may
/// *park*: hyper hands the socket back (with any bytes it read ahead) and its state (two 8 KiB
/// buffers, the cached header map, the in-flight slot) is freed; the task then waits on the
/// bare socket and starts a new hyper connection when the client speaks again. It parks
/// - once idle for `idle.release`, so idle keep-alive connections cost a few hundred bytes
///   instead of two 8 KiB buffers (nginx frees a keep-alive connection's buffers too);
/// - right after each response while more than `idle.park_above` connections are open: with
///   thousands of connections, per-connection state that lives across requests is cold in
///   the CPU's caches by the time its next request comes, while state built per request comes
///   from the allocator's recently freed, cache-warm memory (docs/design.md "Parking").
///
/// The watchdog (one timer, re-armed at its ticks, and the shutdown signal) is polled only
/// when one of them woke the task (see [`Activity`]), not at every request.
async fn serve_h1<S>(
    io: H1Io,
    service: S,
    peer: SocketAddr,
    h1: &http1::Builder,
    idle: Idle,
    open: Open<'_>,
    shutdown: &mut watch::Receiver<bool>,
) where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = crate::body::Body> + Unpin,
    S::Future: Unpin,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let activity = Arc::clone(&io.inner().activity);
    let mut phase = Phase::Serving(Box::new(h1.serve_connection(io, service)));
    let mut closing = *shutdown.borrow();
    if closing {
        if let Phase::Serving(conn) = &mut phase {
            Pin::new(&mut **conn).graceful_shutdown();
        }
    }
    let release = !idle.release.is_zero() && idle.release < idle.timeout;
    // The watchdog also wakes hyper to check its request-head deadline.
    let tick = if release { idle.release } else { idle.timeout }
        .min(idle.head)
        .max(Duration::from_millis(10));
    // hyper is asked to hand the connection back once it is idle (or done with its response).
    let mut releasing = false;
    // The release was asked for by the idle watchdog (not per request).
    let mut idle_release = false;
    let mut idle_for = Duration::ZERO;
    // Set: the watchdog's futures are polled (and so registered) at the first poll.
    activity.watchdog_woken.store(true, Ordering::Release);
    let waker = Waker::from(Arc::clone(&activity));
    let sleep = tokio::time::sleep(tick);
    let changed = shutdown.changed();
    tokio::pin!(sleep, changed);
    loop {
        let event = std::future::poll_fn(|cx| {
            match &mut phase {
                Phase::Serving(conn) => {
                    if let Poll::Ready(res) = conn.poll_without_shutdown(cx) {
                        return Poll::Ready(Watch::Done(res));
                    }
                    // Nothing in flight and hyper waits: it is idle, or still writing a
                    // response whose body the service has handed over. Either way hyper
                    // hands the connection back once its response is out. Not before this
                    // hyper connection has served a request (it may hold part of a head it
                    // read ahead, and letting go would mark that request `connection:
                    // close`), nor after a request with a body (see `Activity::with_body`).
                    if !releasing
                        && !closing
                        && activity.in_flight.load(Ordering::Relaxed) == 0
                        && activity.served.load(Ordering::Relaxed)
                        && !activity.with_body.load(Ordering::Relaxed)
                        && open.above(idle.park_above)
                    {
                        releasing = true;
                        Pin::new(&mut **conn).graceful_shutdown();
                        if let Poll::Ready(res) = conn.poll_without_shutdown(cx) {
                            return Poll::Ready(Watch::Done(res));
                        }
                    }
                }
                Phase::Parked(tracked, _) => {
                    if tracked.inner.poll_read_ready(cx).is_ready() {
                        return Poll::Ready(Watch::Readable);
                    }
                }
                Phase::Switching => unreachable!("a phase is set before the task yields"),
            }
            if closing {
                return Poll::Pending;
            }
            activity.task.register(cx.waker());
            if activity.watchdog_woken.swap(false, Ordering::AcqRel) {
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
        match event {
            Watch::Done(Ok(())) if releasing && !closing => {
                let Phase::Serving(conn) = std::mem::replace(&mut phase, Phase::Switching) else {
                    unreachable!("hyper finished, so it was serving")
                };
                if idle_release {
                    RELEASED.fetch_add(CONNECTION_BUFFERS, Ordering::Relaxed);
                }
                releasing = false;
                idle_release = false;
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
                activity.served.store(false, Ordering::Relaxed);
                activity.with_body.store(false, Ordering::Relaxed);
                phase = if tracked.pending.is_empty() {
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
                        if let Phase::Serving(conn) = phase {
                            let mut io = conn.into_parts().io;
                            let _ = tokio::io::AsyncWriteExt::shutdown(io.inner_mut()).await;
                        }
                    }
                    Err(e) => tracing::debug!(%peer, error = %e, "connection ended with an error"),
                }
                return;
            }
            Watch::Readable => {
                let Phase::Parked(tracked, service) =
                    std::mem::replace(&mut phase, Phase::Switching)
                else {
                    unreachable!("the socket became readable while parked")
                };
                phase = Phase::Serving(Box::new(
                    h1.serve_connection(TokioIo::new(tracked), service),
                ));
            }
            Watch::Shutdown => {
                closing = true;
                match &mut phase {
                    Phase::Serving(conn) => Pin::new(&mut **conn).graceful_shutdown(),
                    // Nothing in flight: close now.
                    _ => return,
                }
            }
            Watch::Tick => {
                sleep.as_mut().reset(tokio::time::Instant::now() + tick);
                // The new deadline is registered at the next poll.
                activity.watchdog_woken.store(true, Ordering::Release);
                if activity.take_active() || activity.in_flight.load(Ordering::Relaxed) > 0 {
                    idle_for = Duration::ZERO;
                    continue;
                }
                idle_for += tick;
                let Phase::Serving(conn) = &mut phase else {
                    if idle_for >= idle.timeout {
                        return;
                    }
                    continue;
                };
                if idle_for >= idle.timeout {
                    if releasing {
                        // Handing back waits for a response stalled this long: give up.
                        return;
                    }
                    closing = true;
                } else if release && !releasing && idle_for >= idle.release {
                    releasing = true;
                    idle_release = true;
                } else {
                    continue;
                }
                // An idle connection closes at once; one still writing a response finishes it.
                Pin::new(&mut **conn).graceful_shutdown();
            }
        }
    }
}

/// The count of open connections, as the connection bound's semaphore knows it.
#[derive(Clone, Copy)]
struct Open<'a> {
    permits: &'a Semaphore,
    max: usize,
}

impl Open<'_> {
    /// More than `n` connections are open.
    #[inline]
    fn above(&self, n: usize) -> bool {
        self.max - self.permits.available_permits() > n
    }
}

/// What woke [`serve_h1`].
enum Watch {
    Done(hyper::Result<()>),
    /// The parked socket has bytes (or EOF) to read.
    Readable,
    Shutdown,
    Tick,
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
            res = conn.as_mut() => {
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

/// What the idle watchdog knows about a connection. It is also the waker the watchdog's own
/// futures (timer, shutdown signal) are polled with: that records that one of them fired and
/// wakes the connection task, so that [`drive_h1`] polls them only then. One allocation per
/// connection, touched by every read and write anyway.
#[derive(Default)]
struct Activity {
    /// Set by every read or write that moved bytes; cleared by the watchdog.
    active: AtomicBool,
    /// Requests being handled now.
    in_flight: AtomicUsize,
    /// The current hyper connection has started a request.
    served: AtomicBool,
    /// A request of the current hyper connection came with a body. hyper may still be reading
    /// (or draining) it after the response, so the connection does not park after responses.
    with_body: AtomicBool,
    /// The watchdog's timer or the shutdown signal woke the task.
    watchdog_woken: AtomicBool,
    /// The connection task's waker.
    task: futures_util::task::AtomicWaker,
}

impl std::task::Wake for Activity {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.watchdog_woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl Activity {
    #[inline]
    fn touch(&self) {
        if !self.active.load(Ordering::Relaxed) {
            self.active.store(true, Ordering::Relaxed);
        }
    }
    fn take_active(&self) -> bool {
        self.active.swap(false, Ordering::Relaxed)
    }
}

/// A request's response future, counted in flight until it is dropped (hyper drops it once
/// the response is ready, or when the connection goes).
struct InService {
    serving: crate::route::Serving,
    _busy: InFlight,
}

impl Future for InService {
    type Output = Result<Response<Body>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.serving).poll(cx).map(Ok)
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

/// A stream that records activity for the idle watchdog, and first replays `pending` (bytes a
/// released hyper connection had read ahead).
struct Tracked<S> {
    inner: S,
    pending: Bytes,
    activity: Arc<Activity>,
    /// 1xx bytes to write before hyper's next output, and whether hyper still owes bytes.
    interim: Arc<crate::interim::Shared>,
}

impl<S: AsyncWrite + Unpin> Tracked<S> {
    /// Before hyper's write: queued interim bytes go first when hyper's buffer was empty (this
    /// write starts new output: the final response's head), and hyper now owes bytes until its
    /// next flush (hyper flushes the socket only once its buffer is drained).
    fn poll_interim(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let owed = self.interim.owed.load(Ordering::Acquire);
        if owed || !self.interim.queued.load(Ordering::Acquire) {
            self.interim.owed.store(true, Ordering::Release);
            return Poll::Ready(Ok(()));
        }
        let mut q = self
            .interim
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        while !q.is_empty() {
            match Pin::new(&mut self.inner).poll_write(cx, &q) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    q.drain(..n);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.interim.queued.store(false, Ordering::Release);
        self.interim.owed.store(true, Ordering::Release);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.pending.is_empty() {
            let n = self.pending.len().min(buf.remaining());
            buf.put_slice(&self.pending.split_to(n));
            self.activity.touch();
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_interim(cx))?;
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_interim(cx))?;
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // hyper flushes the socket only when its own buffer is empty: nothing owed any more.
        self.interim.owed.store(false, Ordering::Release);
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Raises the open-files soft limit to the hard limit; returns (old, new).
pub fn raise_nofile_limit() -> Option<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a properly sized struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        let old = lim.rlim_cur;
        if lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Some((old, old));
            }
        }
        Some((old, lim.rlim_cur))
    }
}

/// What [`fit_open_files`] did to the open-files limit and the connection bound.
#[derive(Debug, Clone, Copy)]
pub struct OpenFiles {
    /// The soft limit before and after raising it.
    pub old: u64,
    pub new: u64,
    /// `max_connections` when it was lowered from its default to fit.
    pub lowered_to: Option<i64>,
}

/// At start-up (and in `larder check`): raises the open-files soft limit to the hard one, then
/// checks `max_connections` against it ([`Config::fit_open_files`]). `None` when the limit
/// cannot be read.
pub fn fit_open_files(cfg: &mut Config) -> Result<Option<OpenFiles>, crate::config::Error> {
    let Some((old, new)) = raise_nofile_limit() else {
        return Ok(None);
    };
    let lowered_to = cfg.fit_open_files(new)?;
    Ok(Some(OpenFiles {
        old,
        new,
        lowered_to,
    }))
}

/// Builds the runtime `main` runs [`start`] on: with `threading = "per-core"` a single-threaded
/// runtime (worker 0; `start` adds the others), with `"work-stealing"` one multi-threaded runtime
/// with `workers` threads.
pub fn runtime(cfg: &ServerConfig) -> io::Result<tokio::runtime::Runtime> {
    match cfg.threading {
        Threading::PerCore => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Threading::WorkStealing => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(cfg.worker_count());
            // Connections woken beyond a worker's local queue (256 tasks) wait in the global
            // queue; tokio checks it every 31 polls by default, which starves those connections
            // at 1,000+ clients (p99 150 ms and more while p50 is 2 ms). Checking it every
            // couple of polls keeps service fair: see docs/design.md, "Fairness".
            b.global_queue_interval(cfg.global_queue_interval.get() as u32);
            b.enable_all().build()
        }
    }
}

/// Resolves when SIGTERM or SIGINT arrives.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
