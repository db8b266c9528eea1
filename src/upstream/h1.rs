//! larder's own keep-alive HTTP/1.1 connections to a plain-HTTP pool's backends, over hyper's
//! `client::conn`: per backend, a list of idle connections (newest first out, at most
//! `max_idle`, none kept past `idle_timeout`), a connection taken for one exchange and given
//! back when its response body is dropped ([`Checkin`]). No task, channel or hash per request:
//! hyper-util's pooled client spent about a fifth of the pass path's instructions on those
//! (docs/design.md, "Upstream pools"). TLS and HTTP/2 backends stay on hyper-util's client
//! (`connect.rs`).
//!
//! ```text
//! send ─▶ idle connection of the backend, ready? ─▶ request ─▶ response head ─▶ UpstreamBody
//!              │ none                                  │ not sent (closed)      │ dropped
//!              ▼                                       ▼                        ▼
//!            connect (connect_timeout)            once more, new connection   back to idle
//! ```

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use http::uri::Authority;
use http::{Request, Uri};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use super::connect::{Answer, SendError};
use crate::body::Body;
use crate::config::PoolConfig;

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
    conns: Mutex<VecDeque<(SendRequest<Body>, Instant)>>,
    max: usize,
    timeout: Duration,
}

/// A future of one exchange, boxed: the callers' futures stay small.
pub type Sending = Pin<Box<dyn Future<Output = Result<Answer, SendError>> + Send>>;

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
        let Some(mut sender) = pooled else {
            return Box::pin(on_new_connection(authority, idle, req, timeout));
        };
        // Handed to the connection now: the future holds the exchange, not the request.
        let sending = sender.try_send_request(req);
        Box::pin(async move {
            match sending.await {
                Ok(response) => Ok(Answer::new(response, Some(Checkin::new(idle, sender)))),
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
    /// the way, busy ones (still finishing a response) left.
    fn take(&self) -> Option<SendRequest<Body>> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if conns.is_empty() {
            return None;
        }
        let now = Instant::now();
        let mut i = conns.len();
        while i > 0 {
            i -= 1;
            let (sender, since) = &conns[i];
            if sender.is_closed() || now.saturating_duration_since(*since) >= self.timeout {
                conns.remove(i);
            } else if sender.is_ready() {
                return conns.remove(i).map(|(s, _)| s);
            }
        }
        None
    }

    /// Keeps `sender` for a next request (the oldest goes when `max` are kept).
    fn put(&self, sender: SendRequest<Body>) {
        if self.max == 0 || sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let oldest = (conns.len() >= self.max).then(|| conns.pop_front());
        conns.push_back((sender, now));
        drop(conns);
        drop(oldest);
    }

    /// Closes the connections idle for `timeout` or closed by the backend.
    fn sweep(&self, now: Instant) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(|(s, since)| {
            !s.is_closed() && now.saturating_duration_since(*since) < self.timeout
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
) -> Result<Answer, SendError> {
    let Some(authority) = authority else {
        return Err(SendError::Connect(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the request names no backend",
        )));
    };
    let mut sender = connect(&authority, timeout).await?;
    match sender.send_request(req).await {
        Ok(response) => Ok(Answer::new(response, Some(Checkin::new(idle, sender)))),
        Err(error) => Err(SendError::Http {
            error,
            reused: false,
        }),
    }
}

/// A new connection to `authority` (its name resolved; each address tried in turn), within
/// `timeout`; hyper's end of it runs as a task of its own (with upgrades: a 101 hands it over).
async fn connect(authority: &Authority, timeout: Duration) -> Result<SendRequest<Body>, SendError> {
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
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|error| SendError::Http {
            error,
            reused: false,
        })?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "upstream connection ended");
        }
    });
    Ok(sender)
}

/// A connection lent to one exchange: given back to its backend's idle list when dropped
/// (with the response body; hyper takes it for a next request only once that response is
/// complete, and closes it if the body was left unread).
pub struct Checkin {
    idle: Arc<Idle>,
    sender: Option<SendRequest<Body>>,
}

impl Checkin {
    fn new(idle: Arc<Idle>, sender: SendRequest<Body>) -> Checkin {
        Checkin {
            idle,
            sender: Some(sender),
        }
    }

    /// The connection is not given back (it was upgraded: it is the tunnel's now).
    pub fn discard(mut self) {
        self.sender = None;
    }
}

impl Drop for Checkin {
    fn drop(&mut self) {
        if let Some(s) = self.sender.take() {
            self.idle.put(s);
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
                            let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if s.write_all(reply).await.is_err() {
                                return;
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

    async fn get(conns: &Arc<Conns>, addr: std::net::SocketAddr) -> Answer {
        let req = Request::get(format!("http://{addr}/x"))
            .header("host", "t")
            .body(Body::empty())
            .unwrap();
        conns.send(req, false).await.unwrap()
    }

    async fn read_all(a: Answer) {
        use http_body_util::BodyExt;
        let (response, checkin) = a.into_parts();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok");
        drop(checkin);
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
}
