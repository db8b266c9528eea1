//! Listening and accepting: binding the TCP sockets, the accept loop with the connection bound,
//! the opening of a new connection (its PROXY header first on a `proxy_protocol` listener, see
//! `proxy_protocol.rs`; then its protocol: plain TCP: HTTP/1.1, or h2c by prior knowledge, told
//! apart by peeking; TLS: the handshake, then what ALPN chose), and the open-files limit that
//! accepting runs into.
//!
//! A semaphore bounds open connections: at the bound, each accept loop holds the one connection
//! it accepted last, unserved, and accepts nothing more until a connection closes (the kernel's
//! backlog holds newer clients).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use super::connection::{serve_connection, Accepted, Builders, Idle, Protocol};
use crate::config::{Config, ServerConfig};
use crate::route::LiveRouter;
use crate::tls::Acceptor;

/// A listening socket with SO_REUSEADDR (and SO_REUSEPORT for per-core workers) and a deep
/// backlog.
pub fn bind(addr: SocketAddr, reuse_port: bool) -> io::Result<TcpListener> {
    TcpListener::from_std(bind_std(addr, reuse_port)?)
}

/// [`bind`], not yet registered with a runtime (for a per-core worker's own runtime).
pub fn bind_std(addr: SocketAddr, reuse_port: bool) -> io::Result<std::net::TcpListener> {
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
pub struct Serving {
    pub builder: Arc<Builders>,
    pub server: Arc<ServerConfig>,
    pub conns: Arc<Semaphore>,
    pub shutdown: watch::Receiver<bool>,
}

/// Accepts connections on `listener` until shutdown or `stop` (a reload removed the listener:
/// the socket closes, its connections go on until they end), each served by `router` (the
/// one in force at each request) on a task of its own once its protocol is known (after the
/// TLS handshake, on a listener with `tls`).
pub async fn accept_loop(
    listener: TcpListener,
    router: LiveRouter,
    serving: Serving,
    tls: Option<Arc<Acceptor>>,
    mut stop: watch::Receiver<bool>,
) {
    let Serving {
        builder,
        server,
        conns,
        mut shutdown,
    } = serving;
    let mut warned_full = false;
    let mut listener = Some(listener);
    // Once stopped: the socket in blocking-free std form, emptied of the connections its
    // backlog holds (clients that connected before the stop are served, not reset).
    let mut draining: Option<std::net::TcpListener> = None;
    loop {
        let accepted = if let Some(std) = &draining {
            match std.accept() {
                Ok((s, peer)) => s
                    .set_nonblocking(true)
                    .and_then(|()| TcpStream::from_std(s))
                    .map(|s| (s, peer)),
                Err(_) => return,
            }
        } else {
            let l = listener.as_ref().expect("accepting");
            tokio::select! {
                r = l.accept() => r,
                _ = shutdown.changed() => return,
                _ = stop.wait_for(|s| *s) => {
                    let std = listener.take().expect("accepting").into_std();
                    match std.and_then(|s| s.set_nonblocking(true).map(|()| s)) {
                        Ok(s) => draining = Some(s),
                        Err(_) => return,
                    }
                    continue;
                }
            }
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
        let idle = Idle {
            timeout: server.idle_timeout.0,
            release: server.idle_release.0,
            head: server.header_read_timeout.0,
            park_above: server.release_above_connections,
            max_conns: server.max_connections.get() as usize,
        };
        let (router, builder) = (Arc::clone(&router), Arc::clone(&builder));
        // Read per connection from the router in force: a reload may turn it on or off.
        // With the server's count of connections refused for want of a valid PROXY header.
        let proxied = (router.proxy_protocol()).then(|| Arc::clone(&builder.proxy_refused));
        if let Some(tls) = &tls {
            let (tls, mut shutdown) = (Arc::clone(tls), shutdown.clone());
            let timeout = builder.header_read_timeout;
            let handshake = async move {
                let mut stream = stream;
                // The PROXY header comes before the TLS handshake.
                let peer = match proxied {
                    Some(refused) => {
                        proxied_client(&mut stream, peer, timeout, &mut shutdown, &refused).await?
                    }
                    None => peer,
                };
                let (stream, h2) = tls.accept(stream, timeout).await?;
                let protocol = if h2 { Protocol::Http2 } else { Protocol::Http1 };
                Some((stream, protocol, shutdown, peer))
            };
            tokio::spawn(Task::opening(handshake, move |opened| {
                served(opened, router, builder, idle, permit)
            }));
            continue;
        }
        let found = protocol(
            stream,
            peer,
            proxied,
            builder.h2c,
            builder.header_read_timeout,
            shutdown.clone(),
        );
        // One task: the protocol is found, then the connection served.
        tokio::spawn(Task::opening(found, move |opened| {
            served(opened, router, builder, idle, permit)
        }));
    }
}

/// What a connection's opening (PROXY header, h2c sniff or TLS handshake) hands on: the
/// stream, the protocol to speak on it, the shutdown signal and the peer (the socket's, or its
/// PROXY header's source); None when there is nothing to serve.
type Opened<S> = Option<(S, Protocol, watch::Receiver<bool>, SocketAddr)>;

/// The second step of a connection's [`Task`]: serves what its opening found.
fn served<S: super::io::Stream>(
    opened: Opened<S>,
    router: LiveRouter,
    builder: Arc<Builders>,
    idle: Idle,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Option<impl Future<Output = ()> + Send + Unpin + 'static> {
    let (stream, protocol, shutdown, peer) = opened?;
    let accepted = Accepted {
        stream,
        protocol,
        peer,
    };
    Some(serve_connection(
        accepted, router, builder, idle, shutdown, permit,
    ))
}

/// A connection's task: how it opens (`Opening`: the h2c sniff or the TLS handshake, boxed,
/// and what makes the served connection of its outcome; None: nothing to serve), then the
/// connection served. `FutureExt::then` does the same (an `async` block would hold the stream
/// and the rest once more beside the served connection), but the layout is then the
/// compiler's: its state tag sat behind the opening's state, 776 bytes into the task, a
/// cache line of its own that every request read (at 10,000 connections a task's memory is
/// cold when its next request comes). Here the tag comes first and the served connection
/// right behind it; the task is 400 bytes (1,600 before `ServeH1`).
#[repr(u8)]
enum Task<A, F, B> {
    /// The served connection: first, for the reader.
    Serving(B),
    Opening(Pin<Box<A>>, Option<F>),
    Done,
}

impl<A, F, B> Task<A, F, B>
where
    A: Future,
    F: FnOnce(A::Output) -> Option<B> + Unpin,
    B: Future<Output = ()> + Unpin,
{
    fn opening(first: A, then: F) -> Self {
        Task::Opening(Box::pin(first), Some(then))
    }
}

impl<A, F, B> Future for Task<A, F, B>
where
    A: Future,
    F: FnOnce(A::Output) -> Option<B> + Unpin,
    B: Future<Output = ()> + Unpin,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            match this {
                Task::Serving(served) => return Pin::new(served).poll(cx),
                Task::Opening(first, then) => {
                    let found = std::task::ready!(first.as_mut().poll(cx));
                    let then = then.take().expect("an opening is polled to its end once");
                    *this = match then(found) {
                        Some(served) => Task::Serving(served),
                        None => Task::Done,
                    };
                }
                Task::Done => return Poll::Ready(()),
            }
        }
    }
}

/// A new plain-TCP connection's protocol: HTTP/2 when h2c is on and the client starts with
/// the HTTP/2 preface, else HTTP/1.1; after its PROXY header when `proxied`. None: the peer
/// closed, sent nothing within `timeout`, sent no valid PROXY header, or the server is
/// shutting down.
async fn protocol(
    mut stream: TcpStream,
    peer: SocketAddr,
    proxied: Option<Arc<AtomicU64>>,
    h2c: bool,
    timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> Opened<TcpStream> {
    // The PROXY header and the first bytes after it share the request-head deadline.
    let (peer, left) = match proxied {
        Some(refused) => {
            let start = tokio::time::Instant::now();
            let client =
                proxied_client(&mut stream, peer, timeout, &mut shutdown, &refused).await?;
            (client, timeout.saturating_sub(start.elapsed()))
        }
        None => (peer, timeout),
    };
    if !h2c {
        return Some((stream, Protocol::Http1, shutdown, peer));
    }
    let h2 = tokio::select! {
        r = sniff_h2(&stream, left) => r?,
        _ = shutdown.changed() => return None,
    };
    let protocol = if h2 { Protocol::Http2 } else { Protocol::Http1 };
    Some((stream, protocol, shutdown, peer))
}

/// The client of a connection on a `proxy_protocol` listener: the source its PROXY header
/// names (or `peer`, for a health check's `LOCAL` header and addresses that are not IP). None:
/// no valid header within `timeout` (the connection is closed and counted in `refused`), or the
/// server is shutting down.
async fn proxied_client(
    stream: &mut TcpStream,
    peer: SocketAddr,
    timeout: Duration,
    shutdown: &mut watch::Receiver<bool>,
    refused: &AtomicU64,
) -> Option<SocketAddr> {
    let deadline = tokio::time::Instant::now() + timeout;
    let read = tokio::select! {
        r = super::proxy_protocol::read_header(stream, peer, deadline) => r,
        _ = shutdown.changed() => return None,
    };
    match read {
        Ok(client) => Some(client),
        Err(why) => {
            refused.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, ?why, "connection closed: no valid PROXY protocol header");
            None
        }
    }
}

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

fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOBUFS) | Some(libc::ENOMEM)
    )
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
