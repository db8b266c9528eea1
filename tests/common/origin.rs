//! The test origin: a hyper server on 127.0.0.1:0 that answers what the test says
//! ([`Reply`]: delays, aborted, stalled and generated bodies) and records what it was asked
//! ([`Seen`]), its `Date` from the clock of the larder under test when the test moves that clock
//! ([`Origin::start_at`]); and [`raw_origin`], for origins that misbehave in ways hyper's server
//! will not.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// What the test origin answers.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// Wait this long before answering.
    pub delay: Duration,
    /// Send the head and part of the body, then drop the connection.
    pub abort_body: bool,
    /// Instead of `body`, a generated body of this many bytes (see [`Generated`]).
    pub generated: Option<Generated>,
    /// Send the head and part of the body, then go silent for this long (keeping the connection
    /// open) before dropping it.
    pub stall: Option<Duration>,
}

/// A long body made up as it is sent: byte `i` is [`pattern_byte`]`(i)`, in 64 KiB chunks, with
/// Content-Length when `declared`, chunked otherwise. `produced` counts the bytes the origin's
/// connection took, so a test can check how much of it larder pulled.
#[derive(Clone, Debug)]
pub struct Generated {
    pub len: u64,
    pub declared: bool,
    pub produced: Arc<AtomicU64>,
}

/// Byte `i` of a [`Generated`] body.
pub fn pattern_byte(i: u64) -> u8 {
    (i % 251) as u8
}

/// Bytes `first..=last` of a [`Generated`] body.
pub fn pattern(first: u64, last: u64) -> Vec<u8> {
    (first..=last).map(pattern_byte).collect()
}

impl Reply {
    pub fn ok(body: impl Into<Bytes>) -> Reply {
        Reply {
            status: 200,
            headers: vec![],
            body: body.into(),
            delay: Duration::ZERO,
            abort_body: false,
            generated: None,
            stall: None,
        }
    }
    /// A generated body of `len` bytes (Content-Length sent when `declared`), counted into
    /// `produced`.
    pub fn generated(len: u64, declared: bool, produced: &Arc<AtomicU64>) -> Reply {
        let mut r = Reply::ok(Bytes::new());
        r.generated = Some(Generated {
            len,
            declared,
            produced: Arc::clone(produced),
        });
        r
    }
    pub fn status(mut self, s: u16) -> Reply {
        self.status = s;
        self
    }
    pub fn header(mut self, k: &str, v: &str) -> Reply {
        self.headers.push((k.into(), v.into()));
        self
    }
    pub fn delay(mut self, d: Duration) -> Reply {
        self.delay = d;
        self
    }
    pub fn abort(mut self) -> Reply {
        self.abort_body = true;
        self
    }
    pub fn stall(mut self, d: Duration) -> Reply {
        self.stall = Some(d);
        self
    }
}

/// A request as the origin saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

type Handler = dyn Fn(&Seen, usize) -> Reply + Send + Sync;

/// An origin server on 127.0.0.1 that counts and records its requests.
pub struct Origin {
    pub addr: SocketAddr,
    count: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
    killed: tokio::sync::watch::Sender<bool>,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
}

impl Origin {
    /// Starts an origin; `handler` gets each request and its 0-based index.
    pub async fn start(handler: impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static) -> Origin {
        Origin::serve(None, handler).await
    }

    /// [`Origin::start`], dating its replies (those without a `date` of their own) by `clock`,
    /// the clock larder is started on ([`super::Larder::start_at`]): when the test moves it,
    /// the origin's time moves with larder's, as the world's would.
    pub async fn start_at(
        clock: &larder::clock::Clock,
        handler: impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static,
    ) -> Origin {
        Origin::serve(Some(clock.clone()), handler).await
    }

    async fn serve(
        clock: Option<larder::clock::Clock>,
        handler: impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static,
    ) -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let (c, s) = (count.clone(), seen.clone());
        let (killed, alive) = tokio::sync::watch::channel(false);
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&accepted);
        let open = Arc::new(AtomicUsize::new(0));
        let opened = Arc::clone(&open);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                opened.fetch_add(1, Ordering::SeqCst);
                let closed = Arc::clone(&opened);
                let (c, s, h) = (c.clone(), s.clone(), handler.clone());
                let clock = clock.clone();
                let mut alive = alive.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (c, s, h, clock) = (c.clone(), s.clone(), h.clone(), clock.clone());
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let seen = Seen {
                                method: parts.method.to_string(),
                                path: parts
                                    .uri
                                    .path_and_query()
                                    .map_or("/".into(), |p| p.to_string()),
                                headers: parts.headers,
                                body,
                            };
                            let n = c.fetch_add(1, Ordering::SeqCst);
                            let mut reply = h(&seen, n);
                            s.lock().unwrap().push(seen);
                            if !reply.delay.is_zero() {
                                tokio::time::sleep(reply.delay).await;
                            }
                            let dated =
                                (reply.headers.iter()).any(|(k, _)| k.eq_ignore_ascii_case("date"));
                            if let (Some(clock), false) = (clock, dated) {
                                let date = httpdate::fmt_http_date(clock.now());
                                reply.headers.push(("date".into(), date));
                            }
                            Ok::<_, Infallible>(build_reply(reply))
                        }
                    });
                    // More fields than hyper's default 100: larder's own bound is under test.
                    let conn = hyper::server::conn::http1::Builder::new()
                        .max_headers(1000)
                        .serve_connection(TokioIo::new(stream), svc);
                    tokio::select! {
                        _ = conn => {}
                        _ = alive.wait_for(|k| *k) => {}
                    }
                    closed.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Origin {
            addr,
            count,
            seen,
            task,
            killed,
            accepted,
            open,
        }
    }

    /// Requests served so far.
    pub fn hits(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Connections open now (accepted and not yet closed by either side).
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn stop(&self) {
        self.task.abort();
    }

    /// Stops accepting and closes every open connection, as a crashed server would.
    pub fn kill(&self) {
        self.task.abort();
        let _ = self.killed.send(true);
    }
}

type OriginBody = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;

/// A body of the chunks `chunks` yields; a failure drops the connection mid-body.
fn chunks(
    chunks: impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send + 'static,
) -> OriginBody {
    use futures_util::TryStreamExt;
    http_body_util::StreamBody::new(chunks.map_ok(http_body::Frame::data)).boxed_unsync()
}

/// The body of a [`Generated`] reply, produced chunk by chunk as the connection takes it.
fn generated(g: Generated) -> OriginBody {
    chunks(futures_util::stream::unfold(0, move |sent| {
        let g = g.clone();
        async move {
            let n = (g.len - sent).min(64 * 1024);
            if n == 0 {
                return None;
            }
            g.produced.fetch_add(n, Ordering::SeqCst);
            Some((Ok(Bytes::from(pattern(sent, sent + n - 1))), sent + n))
        }
    }))
}

fn build_reply(r: Reply) -> Response<OriginBody> {
    use futures_util::stream::{self, StreamExt};
    let len = r.body.len() as u64;
    // The length announced when it is not the body's own (a body cut short).
    let mut declared = None;
    let body = if let Some(g) = r.generated.clone() {
        declared = g.declared.then_some(g.len);
        generated(g)
    } else if let Some(d) = r.stall {
        // The first tenth, then silence until `d` ends, then a failure.
        declared = Some(len);
        let first = r.body.slice(..r.body.len() / 10);
        let silence = async move {
            tokio::time::sleep(d).await;
            Err(std::io::Error::other("origin gives up"))
        };
        chunks(stream::once(async { Ok(first) }).chain(stream::once(silence)))
    } else if r.abort_body {
        // Half, then a failure.
        declared = Some(len);
        let half = r.body.slice(..r.body.len() / 2);
        chunks(stream::iter([
            Ok(half),
            Err(std::io::Error::other("origin aborts")),
        ]))
    } else {
        Full::new(r.body).map_err(|e| match e {}).boxed_unsync()
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::from_u16(r.status).unwrap();
    for (k, v) in &r.headers {
        resp.headers_mut().append(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            http::HeaderValue::from_str(v).unwrap(),
        );
    }
    if let Some(len) = declared {
        resp.headers_mut()
            .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
    }
    resp
}

/// Counts of requests per path, from an origin's record.
pub fn per_path(seen: &[Seen]) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for s in seen {
        *m.entry(s.path.clone()).or_insert(0) += 1;
    }
    m
}

/// An origin on 127.0.0.1 that speaks raw bytes: `serve` gets each accepted connection (for
/// origins that misbehave in ways hyper's server will not).
pub async fn raw_origin<F, Fut>(serve: F) -> SocketAddr
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    raw_origin_on(TcpListener::bind("127.0.0.1:0").await.unwrap(), serve)
}

/// An origin that answers the first request of each keep-alive connection ("answer N", N
/// counting answers) and lets the next one fail: it reads it and closes (`reset` false), or
/// closes with it unread, which makes the kernel send a reset ("connection reset by peer").
pub async fn one_answer_per_connection(reset: bool) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let count = Arc::new(AtomicUsize::new(0));
    raw_origin(move |mut s| {
        let count = Arc::clone(&count);
        async move {
            if super::raw::read_head(&mut s).await.is_none() {
                return;
            }
            let n = count.fetch_add(1, Ordering::SeqCst);
            let body = format!("answer {n}");
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncache-control: no-store\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(reply.as_bytes()).await;
            // The next request on this connection is dropped unanswered.
            if reset {
                let _ = s.readable().await;
                let _ = s.set_zero_linger();
            } else {
                let _ = s.read(&mut [0u8; 4096]).await;
            }
        }
    })
    .await
}

/// [`raw_origin`] on a listener the test set up (socket options).
pub fn raw_origin_on<F, Fut>(listener: TcpListener, serve: F) -> SocketAddr
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(serve(s));
        }
    });
    addr
}
