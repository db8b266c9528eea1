//! One exchange with a backend: the client request rewritten into the backend's (with the
//! proxy fields of [`crate::http::fields`]: hop-by-hop fields, Via, X-Forwarded-*), the
//! timeouts on the response head and on the body ([`UpstreamBody`]), and whether a failure may
//! be resent (a pooled connection the origin had closed). The response's HTTP version is
//! larder's own (HTTP/1.1), not the backend's: the client's connection decides what goes on it.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{request, Request, Response, Uri};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::Instant;

use super::connect::Checkin;
use super::{Client, InFlight};
use crate::body::Body;
use crate::config::Upstream;
use crate::http::fields;
use crate::http::FetchError;

/// Sends `req` upstream (on a new connection if `fresh`) and waits for the response head: at
/// most `timeout` once the request (with its body) has been sent, and while a body is being
/// sent, at most `timeout` without progress of it (a large upload to an origin that reads
/// slowly is not cut off, a stalled one is). The response's body then fails if the upstream
/// sends nothing of it for `body_timeout`. Failures are logged with their detail.
///
/// The request is handed to the connection before this returns: the future holds only the
/// exchange's state, not the request (every caller above moves it).
pub fn send(
    client: &Client,
    req: Request<Body>,
    timeout: Duration,
    body_timeout: Duration,
    inflight: InFlight,
    fresh: bool,
) -> impl Future<Output = Result<Response<UpstreamBody>, Failure>> {
    use http_body::Body as _;
    let upload = (!req.body().is_end_stream()).then(|| Arc::new(Upload::new()));
    let mut req = match &upload {
        Some(progress) => req.map(|body| {
            Body::stream(Uploading {
                body,
                progress: Arc::clone(progress),
            })
        }),
        None => req,
    };
    forward_interim(&mut req);
    let sent = if fresh {
        client.resend(req)
    } else {
        client.request(req)
    };
    async move {
        let mut deadline = Instant::now() + timeout;
        let result = until_head(sent, &mut deadline, timeout, upload.as_deref()).await;
        let (error, resend) = match result {
            Some(Ok(answer)) => {
                let (mut response, conn) = answer.into_parts();
                // The backend's HTTP version is its own: larder speaks its own to its clients.
                // (An HTTP/1.0 origin's version passed on made hyper's server answer an
                // HTTP/1.1 client in HTTP/1.0 and close the connection.)
                *response.version_mut() = http::Version::HTTP_11;
                return Ok(
                    response.map(|body| UpstreamBody::new(body, body_timeout, inflight, conn))
                );
            }
            None => (FetchError::Timeout(timeout), false),
            Some(Err(_))
                if upload
                    .as_ref()
                    .is_some_and(|u| u.too_large.load(Ordering::Relaxed)) =>
            {
                (FetchError::RequestTooLarge, false)
            }
            Some(Err(e))
                if upload
                    .as_ref()
                    .is_some_and(|u| u.failed.load(Ordering::Relaxed)) =>
            {
                (FetchError::RequestBody(source_chain(&e)), false)
            }
            Some(Err(e)) if e.is_connect() => (FetchError::Connect(source_chain(&e)), false),
            Some(Err(e)) => (
                FetchError::Upstream(source_chain(&e)),
                e.closed_before_answer(),
            ),
        };
        match &error {
            FetchError::RequestBody(_) | FetchError::RequestTooLarge => {
                tracing::debug!(error = %error, "request not forwarded")
            }
            // The caller resends it or logs it.
            _ if resend => tracing::debug!(error = %error, "pooled upstream connection was closed"),
            _ => tracing::warn!(error = %error, "upstream request failed"),
        }
        Err(Failure { error, resend })
    }
}

/// A failed exchange: why, and whether a pooled connection closed before any answer (the
/// origin's idle timeout racing its reuse: an idempotent request may go again, on a new
/// connection).
pub struct Failure {
    pub error: FetchError,
    pub resend: bool,
}

/// Runs `exchange` (up to the response head); None once `deadline` passed with neither the
/// head nor, while `upload` is being sent, progress of it (each progress moves `deadline` to
/// `timeout` after it).
async fn until_head<F: Future>(
    exchange: F,
    deadline: &mut Instant,
    timeout: Duration,
    upload: Option<&Upload>,
) -> Option<F::Output> {
    tokio::pin!(exchange);
    loop {
        if let Ok(out) = tokio::time::timeout_at(*deadline, exchange.as_mut()).await {
            return Some(out);
        }
        let next = upload?.last_progress() + timeout;
        if next <= *deadline {
            return None;
        }
        *deadline = next;
    }
}

/// How far a request body being sent upstream has got.
struct Upload {
    start: Instant,
    /// When hyper last took a chunk of the body, or found its end: nanoseconds after `start`.
    last: AtomicU64,
    /// The body failed (the client's side broke off).
    failed: AtomicBool,
    /// It failed by going past the route's `max_body` (http-body-util's `Limited`).
    too_large: AtomicBool,
}

impl Upload {
    fn new() -> Upload {
        Upload {
            start: Instant::now(),
            last: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            too_large: AtomicBool::new(false),
        }
    }

    fn progressed(&self) {
        let ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last.store(ns, Ordering::Relaxed);
    }

    fn last_progress(&self) -> Instant {
        self.start + Duration::from_nanos(self.last.load(Ordering::Relaxed))
    }
}

/// A request body that records in [`Upload`] each chunk hyper takes and its end. hyper takes
/// the next chunk once it has written the last one out, so the record follows the upload.
struct Uploading {
    body: Body,
    progress: Arc<Upload>,
}

impl http_body::Body for Uploading {
    type Data = bytes::Bytes;
    type Error = crate::body::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Err(e))) => {
                if e.is::<http_body_util::LengthLimitError>() {
                    self.progress.too_large.store(true, Ordering::Relaxed);
                }
                self.progress.failed.store(true, Ordering::Relaxed)
            }
            Poll::Ready(_) => self.progress.progressed(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// An upstream response body that fails with [`FetchError::BodyTimeout`] when the upstream sends
/// nothing for `idle` (like nginx's `proxy_read_timeout`, the clock restarts with each frame:
/// at the first wait after it),
/// and with [`FetchError::Body`] when the connection breaks. Every consumer sees the failure as an
/// error, never as the end of the body: a fill stores nothing and a streamed response is cut off
/// (hyper then closes the client's connection, so the client sees it incomplete).
pub struct UpstreamBody {
    inner: Incoming,
    /// Set the first time the upstream has nothing to give: a body that came whole with its
    /// head never starts a timer. Boxed so the body stays Unpin.
    silence: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A frame came since `silence` was set: it restarts at the next wait.
    progressed: bool,
    idle: Duration,
    /// The backend counts this request in flight until the body is dropped.
    _inflight: InFlight,
    /// The connection, driven while the body is read and given back to the pool when the body
    /// is dropped, if its response is complete (larder's own HTTP/1.1 connections;
    /// hyper-util's pool keeps its own).
    conn: Option<Checkin>,
}

impl UpstreamBody {
    fn new(inner: Incoming, idle: Duration, inflight: InFlight, conn: Option<Checkin>) -> Self {
        UpstreamBody {
            inner,
            silence: None,
            progressed: false,
            idle,
            _inflight: inflight,
            conn,
        }
    }

    /// The connection was upgraded (a 101): it is the tunnel's, not given back to the pool.
    pub fn upgraded(self) {
        if let Some(c) = self.conn {
            c.discard();
        }
    }
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = FetchError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, FetchError>>> {
        let this = self.get_mut();
        let polled = match &mut this.conn {
            None => Pin::new(&mut this.inner).poll_frame(cx),
            // larder's own connection is driven by whoever reads its body.
            Some(conn) => conn.poll_frame(&mut this.inner, cx),
        };
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                this.progressed = true;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(FetchError::Body(source_chain(&e))))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                // The silence is counted from the first wait after the last frame.
                let silence = match &mut this.silence {
                    Some(s) if this.progressed => {
                        s.as_mut().reset(Instant::now() + this.idle);
                        s
                    }
                    Some(s) => s,
                    None => this.silence.insert(Box::pin(tokio::time::sleep(this.idle))),
                };
                this.progressed = false;
                match silence.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(FetchError::BodyTimeout(this.idle)))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// An origin's 1xx interim responses to `req` go on to the client being served, if any.
fn forward_interim(req: &mut Request<Body>) {
    if let Some(sink) = crate::interim::Sink::current() {
        hyper::ext::on_informational(req, move |res| sink.forward(res.status(), res.headers()));
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The upstream request for a client's request head: upstream URI (the upstream's path prefix,
/// when it has one, before the request's path), hop-by-hop fields left out,
/// Via and X-Forwarded-For/-Proto/-Host added. Host is the request's one authority (the URI's
/// when it has one, as [`crate::inbound`] decides), so the origin is asked for what the route
/// and the cache key were chosen by; without any, the upstream's own.
///
/// A new head built from a borrowed one: a request that may go again (to another backend, or
/// on a new connection) keeps its own, and a fill lends the client's when it changes nothing.
pub fn upstream_request(
    src: &request::Parts,
    upstream: &Upstream,
    peer: SocketAddr,
) -> request::Parts {
    let path = (src.uri.path_and_query().cloned())
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    // An upstream with a path prefix (`http://b/api/`): the prefix, then the path.
    let path = match &upstream.path {
        None => path,
        Some(_) => upstream.target(path.as_str()).parse().unwrap_or(path),
    };
    let host = match src.uri.authority() {
        Some(a) => HeaderValue::from_str(a.as_str()).ok(),
        None => src.headers.get(header::HOST).cloned(),
    };
    let from = &src.headers;
    // An upgrade (WebSocket) is asked of the backend too: its fields are hop-by-hop, but the
    // tunnel goes on to the backend (crate::upgrade).
    let upgrade = crate::upgrade::wanted(from)
        .then(|| from.get(header::UPGRADE).cloned())
        .flatten();
    // `TE: trailers` says the client takes trailers (gRPC needs it said to the backend too).
    let trailers = (from.get_all(header::TE).iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("trailers"));
    // Room for what is added here: TE, Upgrade, Connection, Host, and the four of forwarding.
    let mut h = fields::end_to_end_copy(from, 8);
    if trailers {
        h.insert(header::TE, HeaderValue::from_static("trailers"));
    }
    if let Some(protocol) = upgrade {
        h.insert(header::UPGRADE, protocol);
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    let host_field =
        (host.clone()).or_else(|| HeaderValue::from_str(upstream.authority.as_str()).ok());
    if let Some(v) = host_field {
        h.insert(header::HOST, v);
    }
    // Behind a trusted proxy, the proxy is the hop larder appends (see `fields::Hop`).
    let hop = src.extensions.get::<fields::Hop>();
    let scheme = fields::scheme(&src.extensions);
    fields::add_forwarding(
        &mut h,
        host.as_ref(),
        hop.map_or(peer.ip(), |h| h.0),
        scheme,
        hop.is_some(),
    );
    let mut r = Request::new(());
    *r.method_mut() = src.method.clone();
    *r.uri_mut() = Uri::builder()
        .scheme(upstream.scheme.clone())
        .authority(upstream.authority.clone())
        .path_and_query(path)
        .build()
        .expect("scheme, authority and path are valid");
    *r.version_mut() = http::Version::HTTP_11;
    *r.headers_mut() = h;
    r.into_parts().0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `upstream_request` for a GET of `uri` with `headers`, from 127.0.0.2.
    fn prepared(uri: &str, headers: &[(&str, &str)]) -> request::Parts {
        let mut b = Request::builder().uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let (parts, _) = b.body(()).unwrap().into_parts();
        let up: Upstream = "http://127.0.0.1:9".parse().unwrap();
        upstream_request(&parts, &up, "127.0.0.2:5000".parse().unwrap())
    }

    #[test]
    fn prepares_forwarding_headers() {
        let parts = prepared(
            "/a?b=1",
            &[
                ("host", "example.com"),
                ("x-forwarded-for", "10.0.0.1"),
                ("connection", "keep-alive"),
            ],
        );
        assert_eq!(parts.uri, "http://127.0.0.1:9/a?b=1");
        assert_eq!(parts.headers["host"], "example.com");
        assert_eq!(parts.headers["x-forwarded-for"], "10.0.0.1, 127.0.0.2");
        assert_eq!(parts.headers["x-forwarded-host"], "example.com");
        assert_eq!(parts.headers["via"], "1.1 larder");
        assert!(!parts.headers.contains_key("connection"));
    }

    /// Behind a trusted proxy (`crate::real_ip`) the chain gets the proxy appended, not the
    /// client found in it.
    #[test]
    fn the_hop_is_appended_rather_than_the_client() {
        let mut b = Request::builder().uri("/");
        b = b.header("x-forwarded-for", "198.51.100.9, 10.1.2.3");
        b = b.extension(fields::Hop("127.0.0.1".parse().unwrap()));
        let (parts, _) = b.body(()).unwrap().into_parts();
        let up: Upstream = "http://127.0.0.1:9".parse().unwrap();
        let p = upstream_request(&parts, &up, "198.51.100.9:0".parse().unwrap());
        assert_eq!(
            p.headers["x-forwarded-for"],
            "198.51.100.9, 10.1.2.3, 127.0.0.1"
        );
    }

    #[test]
    fn forwarded_host_is_the_target_authority() {
        let parts = prepared("http://victim.example/p", &[("host", "attacker.example")]);
        assert_eq!(parts.headers["host"], "victim.example");
        assert_eq!(parts.headers["x-forwarded-host"], "victim.example");
    }
}
