//! larder's own keep-alive HTTP/1.1 connections to a plain-HTTP pool's backends, over hyper's
//! `client::conn`: per backend, a list of idle connections (newest first out, at most
//! `max_idle`, none kept past `idle_timeout`), a connection taken for one exchange and given
//! back when its response body is dropped ([`Checkin`]). No task, channel or hash per request:
//! hyper-util's pooled client spent about a fifth of the pass path's instructions on those
//! (docs/design.md, "Upstream pools"). TLS and HTTP/2 backends stay on hyper-util's client
//! (`connect.rs`).
//!
//! hyper's end of a connection (the future that writes requests and reads responses) has no
//! task of its own either: whoever waits on the connection drives it ([`Conn`]): the exchange
//! until the response head, then the response body as it is read ([`Checkin::poll_frame`]). The
//! socket's readiness wakes the request's own task, with no hop through a second task and
//! hyper's channels (docs/design.md, "Upstream pools"). A connection upgraded by a 101 gets a
//! task, which hands its socket over to the tunnel.
//!
//! ```text
//! send ─▶ idle connection of the backend, ready? ─▶ request ─▶ response head ─▶ UpstreamBody
//!              │ none                                  │ not sent (closed)      │ dropped at
//!              ▼                                       ▼                        ▼ its end
//!            connect (connect_timeout)            once more, new connection   back to idle
//! ```

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use http::uri::Authority;
use http::Response;
use http::{Request, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::client::conn::TrySendError;
use hyper_util::rt::TokioIo;

use super::send_error::SendError;
use crate::body::Body;
use crate::config::PoolConfig;
use crate::socket::SendStream;

/// The connections of one pool's backends.
pub struct Conns {
    backends: Box<[Backend]>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    /// The sweeping task was started (on the first runtime that used the pool).
    sweeping: AtomicBool,
}

struct Backend {
    authority: Authority,
    idle: Arc<Idle>,
}

/// A backend's idle connections, oldest first, each with the time it was given back.
pub struct Idle {
    conns: Mutex<VecDeque<(Conn, Instant)>>,
    max: usize,
    timeout: Duration,
}

/// A future of one exchange, boxed: the callers' futures stay small. Its response head comes
/// with the connection to give back once the body is done with.
pub type Sending = Pin<Box<dyn Future<Output = Result<Answered, SendError>> + Send>>;

/// A response head and its connection ([`Checkin`]).
pub type Answered = (Response<Incoming>, Checkin);

impl Conns {
    /// The connections of `cfg`'s backends (none open yet). The idle ones past their time are
    /// closed by a task on the current runtime, if there is one, for as long as this lives.
    pub fn new(cfg: &PoolConfig) -> Arc<Conns> {
        let max_idle = cfg.max_idle;
        let idle_timeout = cfg.idle_timeout.0;
        let mut backends: Vec<Backend> = Vec::new();
        for b in &cfg.backends {
            if !backends.iter().any(|k| k.authority == b.url.authority) {
                backends.push(Backend {
                    authority: b.url.authority.clone(),
                    idle: Arc::new(Idle::new(max_idle, idle_timeout)),
                });
            }
        }
        let conns = Arc::new(Conns {
            backends: backends.into(),
            connect_timeout: cfg.connect_timeout.0,
            idle_timeout,
            sweeping: AtomicBool::new(false),
        });
        conns.start_sweeping();
        conns
    }

    /// Starts the task that closes idle connections past their time, on the current runtime
    /// (once; not while there is none).
    fn start_sweeping(self: &Arc<Self>) {
        if self.sweeping.load(Ordering::Relaxed) {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            if !self.sweeping.swap(true, Ordering::Relaxed) {
                rt.spawn(sweep(Arc::downgrade(self)));
            }
        }
    }

    /// Sends `req` (its URI absolute: the backend's authority and the path) on an idle
    /// connection of its backend, or on a new one when there is none ready or `fresh` is asked.
    /// A request that a pooled connection turned out closed before taking is sent on a new
    /// connection (it was never written, whatever its method).
    pub fn send(self: &Arc<Self>, mut req: Request<Body>, fresh: bool) -> Sending {
        self.start_sweeping();
        let authority = req.uri().authority().cloned();
        let idle = (authority.as_ref())
            // The URI's authority is the backend's own (upstream_request): bytes compare equal.
            .and_then(|a| (self.backends.iter()).find(|b| b.authority.as_str() == a.as_str()))
            .map(|b| Arc::clone(&b.idle))
            // Not one of the pool's backends: a connection of its own, not kept.
            .unwrap_or_else(|| Arc::new(Idle::new(0, self.idle_timeout)));
        // HTTP/1.1 asks a server for the path (origin-form); the Host field is the caller's.
        if let Some(pq) = req.uri().path_and_query().cloned() {
            *req.uri_mut() = Uri::from(pq);
        }
        let timeout = self.connect_timeout;
        let pooled = if fresh { None } else { idle.take() };
        let Some(conn) = pooled else {
            return Box::pin(on_new_connection(authority, idle, req, timeout));
        };
        Box::pin(async move {
            match conn.exchange(req).await {
                Ok((response, conn)) => Ok((response, Checkin::new(idle, conn))),
                Err(mut e) => match e.take_message() {
                    // Closed before it took the request: a new connection takes it (boxed:
                    // the common path's future stays small).
                    Some(req) => Box::pin(on_new_connection(authority, idle, req, timeout)).await,
                    None => Err(SendError::Http {
                        error: e.into_error(),
                        reused: true,
                    }),
                },
            }
        })
    }

    fn sweep(&self) {
        for b in self.backends.iter() {
            b.idle.sweep(Instant::now());
        }
    }
}

impl Idle {
    fn new(max: usize, timeout: Duration) -> Idle {
        Idle {
            conns: Mutex::new(VecDeque::new()),
            max,
            timeout,
        }
    }

    /// The newest idle connection ready for a request; closed and expired ones are dropped on
    /// the way. One the backend closed since is found so by its exchange, which gives the
    /// request back to go on a new connection.
    fn take(&self) -> Option<Conn> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        while let Some((conn, since)) = conns.pop_back() {
            if now.saturating_duration_since(since) < self.timeout && conn.sender.is_ready() {
                return Some(conn);
            }
        }
        None
    }

    /// Keeps `conn` for a next request (the oldest goes when `max` are kept).
    fn put(&self, conn: Conn) {
        if self.max == 0 || conn.sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let oldest = (conns.len() >= self.max).then(|| conns.pop_front());
        conns.push_back((conn, now));
        drop(conns);
        drop(oldest);
    }

    /// Closes the connections idle for `timeout` or closed by the backend (each is driven
    /// once, for no task: hyper's end reads the backend's close, if it came).
    fn sweep(&self, now: Instant) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain_mut(|(c, since)| {
            now.saturating_duration_since(*since) < self.timeout && c.ready_now()
        });
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.conns.lock().unwrap().len()
    }
}

/// Closes idle connections past their time, every half `idle_timeout` (within 50 ms and 5 s),
/// until the pool is gone.
async fn sweep(conns: Weak<Conns>) {
    let every = match conns.upgrade() {
        Some(c) => (c.idle_timeout / 2).clamp(Duration::from_millis(50), Duration::from_secs(5)),
        None => return,
    };
    loop {
        tokio::time::sleep(every).await;
        match conns.upgrade() {
            Some(c) => c.sweep(),
            None => return,
        }
    }
}

/// Sends `req` on a new connection to `authority`, kept in `idle` afterwards.
async fn on_new_connection(
    authority: Option<Authority>,
    idle: Arc<Idle>,
    req: Request<Body>,
    timeout: Duration,
) -> Result<Answered, SendError> {
    let Some(authority) = authority else {
        return Err(SendError::Connect(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the request names no backend",
        )));
    };
    let conn = connect(&authority, timeout).await?;
    match conn.exchange(req).await {
        Ok((response, conn)) => Ok((response, Checkin::new(idle, conn))),
        Err(e) => Err(SendError::Http {
            error: e.into_error(),
            reused: false,
        }),
    }
}

/// A new connection to `authority` (its name resolved; each address tried in turn), within
/// `timeout`; hyper's end of it with upgrades (a 101 hands the socket over).
async fn connect(authority: &Authority, timeout: Duration) -> Result<Conn, SendError> {
    let host = authority.host();
    let host = (host.strip_prefix('[').and_then(|h| h.strip_suffix(']'))).unwrap_or(host);
    let port = authority.port_u16().unwrap_or(80);
    let tcp =
        match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port))).await {
            Ok(Ok(tcp)) => tcp,
            Ok(Err(e)) => return Err(SendError::Connect(e)),
            Err(_) => {
                return Err(SendError::Connect(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no connection within {timeout:?}"),
                )))
            }
        };
    let _ = tcp.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(SendStream(tcp)))
        .await
        .map_err(|error| SendError::Http {
            error,
            reused: false,
        })?;
    Ok(Conn::new(sender, Box::pin(conn.with_upgrades())))
}

/// hyper's end of a connection: polled, it writes the requests sent and reads the responses.
type Driver = Pin<Box<dyn Future<Output = hyper::Result<()>> + Send + Sync>>;

/// One connection: the handle that requests go through, and hyper's end of it, driven by
/// whoever waits on the connection.
pub(super) struct Conn {
    sender: SendRequest<Body>,
    /// None once it finished: closed, failed, or upgraded.
    driver: Option<Driver>,
    /// The waker hyper's end is polled with ([`Relay`]).
    relay: Arc<Relay>,
    relay_waker: Waker,
}

/// The waker hyper's end of a connection is polled with: it wakes the task that drove it
/// last, until that task is done waiting on it ([`Conn::quiet`]). hyper keeps the waker of
/// each poll where it waits (the socket, the response body being taken), and wakes it even
/// once the task has what it waited for (taking the last piece of a body wakes the body's
/// writer, long gone by then): the task woken from inside its own poll would be polled again,
/// whole, for nothing.
struct Relay(futures_util::task::AtomicWaker);

impl std::task::Wake for Relay {
    fn wake(self: Arc<Self>) {
        self.0.wake();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.wake();
    }
}

impl Conn {
    fn new(sender: SendRequest<Body>, driver: Driver) -> Conn {
        let relay = Arc::new(Relay(futures_util::task::AtomicWaker::new()));
        Conn {
            sender,
            driver: Some(driver),
            relay_waker: Waker::from(Arc::clone(&relay)),
            relay,
        }
    }

    /// Polls hyper's end once for the task of `cx`.
    fn drive(&mut self, cx: &mut Context<'_>) {
        self.relay.0.register(cx.waker());
        self.poll_driver();
    }

    /// Polls hyper's end once with the relay; false once it has finished (the connection is
    /// closed).
    fn poll_driver(&mut self) -> bool {
        let Some(driver) = &mut self.driver else {
            return false;
        };
        match driver
            .as_mut()
            .poll(&mut Context::from_waker(&self.relay_waker))
        {
            Poll::Pending => true,
            Poll::Ready(ended) => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "upstream connection ended");
                }
                self.driver = None;
                false
            }
        }
    }

    /// The task that drove the connection has what it waited for: what hyper's end waits on
    /// wakes nobody until it is driven again.
    fn quiet(&self) {
        drop(self.relay.0.take());
    }

    /// Ready for a request now: hyper's end, polled once more (for no task: the next
    /// exchange drives it with its own), has seen its last response through, is open and
    /// wants one.
    fn ready_now(&mut self) -> bool {
        self.quiet();
        self.poll_driver() && self.sender.is_ready()
    }

    /// Sends `req` and drives the connection until its response head. The error gives the
    /// request back if the connection closed before taking it.
    async fn exchange(
        mut self,
        req: Request<Body>,
    ) -> Result<(Response<Incoming>, Conn), TrySendError<Request<Body>>> {
        let sending = self.sender.try_send_request(req);
        let mut sending = std::pin::pin!(sending);
        let response = std::future::poll_fn(|cx| {
            // hyper's end first: it writes the request, then reads the head and fulfils
            // `sending` (or fails it, if the connection ends). Only it does, here: the
            // socket's readiness wakes this task, and `sending` is polled without a waker
            // (fulfilled, it would wake this very task from inside its poll, for nothing).
            self.drive(cx);
            (sending.as_mut()).poll(&mut Context::from_waker(Waker::noop()))
        })
        .await?;
        // Whoever reads the body drives the connection again, with their own task.
        self.quiet();
        Ok((response, self))
    }

    /// hyper's end goes on in a task of its own: after a 101, to hand the socket over.
    fn detach(self) {
        let rt = tokio::runtime::Handle::try_current();
        if let (Some(driver), Ok(rt)) = (self.driver, rt) {
            rt.spawn(async move {
                if let Err(e) = driver.await {
                    tracing::debug!(error = %e, "upstream connection ended");
                }
            });
        }
    }
}

/// A connection lent to one exchange, driven while its response body is read
/// ([`Checkin::poll_frame`]); when dropped, given back to its backend's idle list if hyper's end,
/// driven once more, has the response complete (read, or left unread but all received: hyper
/// drains what is left of it in that one poll, or closes the connection).
pub struct Checkin {
    idle: Arc<Idle>,
    conn: Option<Conn>,
}

impl Checkin {
    fn new(idle: Arc<Idle>, conn: Conn) -> Checkin {
        Checkin {
            idle,
            conn: Some(conn),
        }
    }

    /// The next frame of `body`, this connection's response body, for the task of `cx`.
    /// hyper's end reads the body on when driven from here (usually it has read it all with
    /// the head). Only it fills the body, and it runs here: the socket's readiness, which it
    /// waits on with this task's waker, is what wakes the task; the body itself is polled
    /// without one, and once a frame came the relay is emptied (`Conn::quiet`).
    pub fn poll_frame(
        &mut self,
        body: &mut Incoming,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, hyper::Error>>> {
        use http_body::Body as _;
        let Some(conn) = &mut self.conn else {
            return Pin::new(body).poll_frame(cx);
        };
        let mut quiet = Context::from_waker(Waker::noop());
        match Pin::new(&mut *body).poll_frame(&mut quiet) {
            Poll::Pending => {}
            ready => return ready,
        }
        conn.drive(cx);
        let polled = Pin::new(body).poll_frame(&mut quiet);
        if polled.is_ready() {
            conn.quiet();
        }
        polled
    }

    /// The connection is not given back (it was upgraded: it is the tunnel's now); hyper's
    /// end goes on in a task until it has handed the socket over.
    pub fn discard(mut self) {
        if let Some(conn) = self.conn.take() {
            conn.detach();
        }
    }
}

impl Drop for Checkin {
    fn drop(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            if conn.ready_now() {
                self.idle.put(conn);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use std::sync::atomic::AtomicUsize;

    /// An origin answering every request of each connection with `ok`; counts connections.
    async fn origin() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        origin_with(Reply::Ok).await
    }

    #[derive(Clone, Copy)]
    enum Reply {
        /// `ok`, keeping the connection.
        Ok,
        /// A body of this many bytes of `x`, written 8 KiB at a time, 5 ms apart.
        Pieces(usize),
        /// `ok`, then the connection closed (without saying so in the head).
        OkThenClose,
        /// `ok`, then the connection closed 500 ms later.
        OkThenCloseLater,
    }

    /// An origin answering every request of each connection with `reply`; counts connections.
    async fn origin_with(reply: Reply) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let mut got = Vec::new();
                    loop {
                        let Ok(n) = s.read(&mut buf).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        got.extend_from_slice(&buf[..n]);
                        while let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                            got.drain(..end + 4);
                            let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            match reply {
                                Reply::Ok => {
                                    if s.write_all(ok).await.is_err() {
                                        return;
                                    }
                                }
                                Reply::OkThenClose => {
                                    let _ = s.write_all(ok).await;
                                    return;
                                }
                                Reply::OkThenCloseLater => {
                                    let _ = s.write_all(ok).await;
                                    tokio::time::sleep(Duration::from_millis(500)).await;
                                    return;
                                }
                                Reply::Pieces(len) => {
                                    let head =
                                        format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n");
                                    if s.write_all(head.as_bytes()).await.is_err() {
                                        return;
                                    }
                                    let mut left = len;
                                    while left > 0 {
                                        let n = left.min(8192);
                                        tokio::time::sleep(Duration::from_millis(5)).await;
                                        if s.write_all(&vec![b'x'; n]).await.is_err() {
                                            return;
                                        }
                                        left -= n;
                                    }
                                }
                            }
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    fn pool(addr: std::net::SocketAddr, max_idle: usize, idle: &str) -> Arc<Conns> {
        let toml = format!(
            "backends = [\"http://{addr}\"]\nmax_idle = {max_idle}\nidle_timeout = \"{idle}\""
        );
        let cfg: PoolConfig = toml::from_str(&toml).unwrap();
        Conns::new(&cfg)
    }

    async fn get(conns: &Arc<Conns>, addr: std::net::SocketAddr) -> Answered {
        let req = Request::get(format!("http://{addr}/x"))
            .header("host", "t")
            .body(Body::empty())
            .unwrap();
        conns.send(req, false).await.unwrap()
    }

    /// Reads the answer's body to its end as `UpstreamBody` does ([`Checkin::poll_frame`]);
    /// the connection then goes back to its backend's idle list.
    async fn read_body(a: Answered) -> Vec<u8> {
        let (response, mut checkin) = a;
        let mut body = response.into_body();
        let mut got = Vec::new();
        loop {
            let next = std::future::poll_fn(|cx| checkin.poll_frame(&mut body, cx));
            let frame = tokio::time::timeout(Duration::from_secs(5), next)
                .await
                .expect("the body comes on (the socket's readiness wakes its reader)");
            match frame {
                Some(f) => got.extend_from_slice(&f.unwrap().into_data().unwrap()),
                None => break,
            }
        }
        got
    }

    async fn read_all(a: Answered) {
        assert_eq!(read_body(a).await, b"ok");
    }

    #[tokio::test]
    async fn a_connection_is_reused_once_its_response_is_read() {
        let (addr, accepted) = origin().await;
        let conns = pool(addr, 8, "60s");
        for _ in 0..5 {
            read_all(get(&conns, addr).await).await;
            tokio::task::yield_now().await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        // Two at once: the second cannot share the first's connection.
        let a = get(&conns, addr).await;
        let b = get(&conns, addr).await;
        read_all(a).await;
        read_all(b).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        assert_eq!(conns.backends[0].idle.len(), 2);
    }

    #[tokio::test]
    async fn idle_connections_are_bounded_and_expire() {
        let (addr, _) = origin().await;
        let conns = pool(addr, 2, "200ms");
        let answers = [
            get(&conns, addr).await,
            get(&conns, addr).await,
            get(&conns, addr).await,
        ];
        for a in answers {
            read_all(a).await;
        }
        assert_eq!(conns.backends[0].idle.len(), 2, "max_idle = 2");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(conns.backends[0].idle.len(), 0, "swept after idle_timeout");
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let conns = pool(addr, 8, "60s");
        let req = Request::get(format!("http://{addr}/"))
            .body(Body::empty())
            .unwrap();
        let e = conns.send(req, false).await.err().expect("refused");
        assert!(e.is_connect(), "{e}");
    }

    #[tokio::test]
    async fn a_body_in_pieces_is_read_by_driving_its_connection() {
        // hyper's end of the connection has no task: the body's reader drives it, and the
        // socket's readiness wakes the reader when a piece comes.
        let (addr, accepted) = origin_with(Reply::Pieces(100_000)).await;
        let conns = pool(addr, 8, "60s");
        for _ in 0..2 {
            let body = read_body(get(&conns, addr).await).await;
            assert_eq!(body.len(), 100_000);
            assert!(body.iter().all(|&b| b == b'x'));
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "read to its end: reused"
        );
    }

    #[tokio::test]
    async fn a_body_left_unread_closes_its_connection() {
        let (addr, accepted) = origin_with(Reply::Pieces(100_000)).await;
        let conns = pool(addr, 8, "60s");
        drop(get(&conns, addr).await);
        assert_eq!(conns.backends[0].idle.len(), 0, "not given back mid-body");
        assert_eq!(read_body(get(&conns, addr).await).await.len(), 100_000);
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_body_left_unread_but_all_received_keeps_its_connection() {
        // A health check's answer: its body came with the head; hyper drains it when the
        // connection is given back.
        let (addr, accepted) = origin().await;
        let conns = pool(addr, 8, "60s");
        drop(get(&conns, addr).await);
        assert_eq!(conns.backends[0].idle.len(), 1);
        read_all(get(&conns, addr).await).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn the_sweep_closes_idle_connections_the_origin_closed() {
        let (addr, _) = origin_with(Reply::OkThenCloseLater).await;
        let conns = pool(addr, 8, "60s");
        read_all(get(&conns, addr).await).await;
        let idle = &conns.backends[0].idle;
        idle.sweep(Instant::now());
        assert_eq!(idle.len(), 1, "kept until the close comes");
        tokio::time::sleep(Duration::from_millis(1000)).await;
        idle.sweep(Instant::now());
        assert_eq!(idle.len(), 0, "closed by the origin: dropped");
    }

    #[tokio::test]
    async fn a_pooled_connection_the_origin_closed_is_replaced() {
        // Nothing drives an idle connection: the backend's close is found by the next
        // exchange, which hyper gives the request back from (never written), and it goes on a
        // new connection.
        let (addr, accepted) = origin_with(Reply::OkThenClose).await;
        let conns = pool(addr, 8, "60s");
        for round in 1..=3 {
            read_all(get(&conns, addr).await).await;
            // The close reaches this side.
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(accepted.load(Ordering::SeqCst), round);
        }
    }
}
