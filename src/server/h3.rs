//! HTTP/3: a QUIC endpoint (quinn) on a TLS listener's address and port over UDP, each request
//! served by the listener's own router, cache and handlers through h3, as over HTTP/1.1 and
//! HTTP/2. TCP clients learn of it from `Alt-Svc`.
//!
//! A QUIC connection takes a permit of the connection bound like a TCP one and is refused at
//! the bound; it closes after `idle_timeout` without traffic. On shutdown each connection sends
//! GOAWAY, lets its requests finish and closes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{header, HeaderMap, Method, Request, Response};
use http_body_util::BodyExt;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

use crate::body::{Body, BoxError, RequestBody};
use crate::route::{LiveRouter, Router};
use crate::tls::Acceptor;

type H3Conn = h3::server::Connection<h3_quinn::Connection, Bytes>;
type SendHalf = h3::server::RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;
type RecvHalf = h3::server::RequestStream<h3_quinn::RecvStream, Bytes>;

/// Opens the HTTP/3 endpoint on `addr` (UDP) with the TLS listener's certificates.
pub fn bind(
    addr: SocketAddr,
    tls: &Acceptor,
    idle_timeout: Duration,
) -> Result<quinn::Endpoint, String> {
    let crypto = tls.quic_tls().map_err(|e| e.to_string())?;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(crypto)
        .map_err(|e| format!("QUIC TLS settings: {e}"))?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport.max_idle_timeout(idle_timeout.try_into().ok());
    // Requests at once per connection, as HTTP/2's max_concurrent_streams.
    transport.max_concurrent_bidi_streams(256u32.into());
    cfg.transport_config(Arc::new(transport));
    quinn::Endpoint::server(cfg, addr).map_err(|e| e.to_string())
}

/// Accepts QUIC connections on `endpoint` until shutdown.
pub async fn serve(
    endpoint: quinn::Endpoint,
    router: LiveRouter,
    conns: Arc<Semaphore>,
    max_headers: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => match i {
                Some(i) => i,
                None => return,
            },
            _ = shutdown.changed() => break,
        };
        let Ok(permit) = Arc::clone(&conns).try_acquire_owned() else {
            incoming.refuse();
            continue;
        };
        let (router, shutdown) = (Arc::clone(&router), shutdown.clone());
        tokio::spawn(connection(incoming, router, permit, max_headers, shutdown));
    }
    // Open connections finish on their own tasks; new ones are refused.
    endpoint.set_server_config(None);
}

/// One QUIC connection: its requests, each on a task of its own.
async fn connection(
    incoming: quinn::Incoming,
    router: LiveRouter,
    _permit: OwnedSemaphorePermit,
    max_headers: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    let Ok(quic) = incoming.await else { return };
    let peer = quic.remote_address();
    let Ok(mut conn) = H3Conn::new(h3_quinn::Connection::new(quic)).await else {
        return;
    };
    let mut stopping = *shutdown.borrow();
    loop {
        let accepted = tokio::select! {
            a = conn.accept() => a,
            _ = shutdown.changed(), if !stopping => {
                stopping = true;
                // GOAWAY: requests already started finish, no new ones.
                let _ = conn.shutdown(0).await;
                continue;
            }
        };
        let resolver = match accepted {
            Ok(Some(r)) => r,
            Ok(None) | Err(_) => return,
        };
        let router = router.load_full();
        tokio::spawn(async move {
            let Ok((req, stream)) = resolver.resolve_request().await else {
                return;
            };
            let (send, recv) = stream.split();
            request(req, send, recv, &router, peer, max_headers).await;
        });
    }
}

/// Serves one request and writes its response.
async fn request(
    req: Request<()>,
    mut send: SendHalf,
    recv: RecvHalf,
    router: &Router,
    peer: SocketAddr,
    max_headers: usize,
) {
    let head_only = req.method() == Method::HEAD;
    let mut req = req;
    // HTTP/3 runs on QUIC, which is always TLS.
    req.extensions_mut().insert(crate::http::fields::Secure);
    // The client: the QUIC peer, or who the listener's trusted proxies name (no PROXY header
    // over UDP).
    let peer = router.client(&mut req, peer);
    let observed = router.observe(&mut req, peer);
    let mut req = req.map(|()| RequestBody::Stream(upload(recv).boxed()));
    let (mut response, route) = match crate::inbound::admit(&mut req, max_headers) {
        Ok(()) => {
            let (serving, route) = router.dispatch_route(req, peer, None);
            (serving.await, route)
        }
        Err(refused) => (refused.response(), crate::route::UNROUTED),
    };
    if let Some(mut o) = observed {
        o.routed(route, router);
        o.finish(&mut response, router.metrics());
    }
    let _ = respond(response, &mut send, head_only).await;
}

/// The request body as frames read by a task of its own (h3's receive half is not `Sync`,
/// which handlers' bodies must be); a bounded channel keeps the reading at the handler's pace.
fn upload(mut recv: RecvHalf) -> http_body_util::StreamBody<ChannelStream> {
    let (tx, rx) = mpsc::channel::<Result<http_body::Frame<Bytes>, BoxError>>(2);
    tokio::spawn(async move {
        loop {
            let frame = match recv.recv_data().await {
                Ok(Some(mut data)) => {
                    Ok(http_body::Frame::data(data.copy_to_bytes(data.remaining())))
                }
                Ok(None) => return,
                Err(e) => Err(BoxError::from(e)),
            };
            let failed = frame.is_err();
            if tx.send(frame).await.is_err() || failed {
                return;
            }
        }
    });
    http_body_util::StreamBody::new(ChannelStream(rx))
}

/// The frames the upload task reads, as a stream.
pub struct ChannelStream(mpsc::Receiver<Result<http_body::Frame<Bytes>, BoxError>>);

impl futures_util::Stream for ChannelStream {
    type Item = Result<http_body::Frame<Bytes>, BoxError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// Writes `response` on the request's stream: the head, the body's frames (none for HEAD),
/// trailers, the end.
async fn respond(
    response: Response<Body>,
    send: &mut SendHalf,
    head_only: bool,
) -> Result<(), BoxError> {
    let (mut parts, mut body) = response.into_parts();
    strip_connection_fields(&mut parts.headers);
    send.send_response(Response::from_parts(parts, ())).await?;
    if !head_only {
        while let Some(frame) = body.frame().await {
            let frame = frame?;
            match frame.into_data() {
                Ok(data) => send.send_data(data).await?,
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        send.send_trailers(trailers).await?;
                    }
                }
            }
        }
    }
    send.finish().await?;
    Ok(())
}

/// HTTP/3 has no connection-specific fields (RFC 9114 §4.2): a response carrying one would be
/// malformed.
fn strip_connection_fields(h: &mut HeaderMap) {
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        http::HeaderName::from_static("keep-alive"),
        http::HeaderName::from_static("proxy-connection"),
    ] {
        h.remove(name);
    }
}
