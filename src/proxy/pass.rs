//! What the cache does not serve: a request passed upstream as is (other methods, upgrades,
//! hit-for-miss), its response streamed back and adapted (`adapt.rs`); a successful unsafe
//! method's invalidations; an upgraded connection tunnelled to the backend's.

use std::future::Future;
use std::net::SocketAddr;

use crate::body::RequestBody;
use crate::phases::Cx;
use http::header;
use http::{Method, Request, Response};

use super::adapt::Asked;
use super::Proxy;
use crate::body::Body;
use crate::cache::key::{key_host, same_origin_key};
use crate::deliver::CacheStatus;
use crate::http::fields;
use crate::upstream::FetchError;

impl Proxy {
    /// Forwards a request the cache cannot serve and streams the response back. A successful
    /// response to an unsafe method invalidates the URLs it names (RFC 9111 §4.4).
    pub(super) fn pass(
        &self,
        req: Request<RequestBody>,
        peer: SocketAddr,
        status: CacheStatus,
    ) -> impl Future<Output = Response<Body>> + '_ {
        let (parts, body) = req.into_parts();
        let unsafe_method = !matches!(
            parts.method,
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
        );
        // What an unsafe method's success invalidates (RFC 9111 §4.4): noted before the
        // request goes; a safe method allocates none of it.
        let target = unsafe_method.then(|| {
            (
                self.0.key_of_parts(&parts),
                key_host(&parts).to_string(),
                parts.uri.path().to_string(),
            )
        });
        let forwarded = self.forward(Request::from_parts(parts, Body::stream(body)), peer, status);
        // A map, not an async block: a future captured by one is kept twice once awaited.
        futures_util::FutureExt::map(forwarded, move |resp| {
            let Some((key, host, path)) = target else {
                return resp;
            };
            if resp.status().is_success() || resp.status().is_redirection() {
                let cache = &self.0.cache;
                cache.remove(&key);
                for name in [header::LOCATION, header::CONTENT_LOCATION] {
                    if let Some(target) = resp.headers().get(&name).and_then(|v| v.to_str().ok()) {
                        if let Some(k) = same_origin_key(target, &host, &path) {
                            cache.remove(&k);
                        }
                    }
                }
            }
            resp
        })
    }

    /// Sends a request upstream as is and streams the response back; nothing is stored.
    ///
    /// A plain fn: the request goes into the pool's future before this returns, so the
    /// returned future does not hold it too (each caller above moves this future).
    pub(super) fn forward(
        &self,
        req: Request<Body>,
        peer: SocketAddr,
        status: CacheStatus,
    ) -> impl Future<Output = Response<Body>> + '_ {
        let me = &self.0;
        let (mut parts, body) = req.into_parts();
        let asked = Asked::of(&parts.method, &parts.headers);
        let cx = me.phases.as_ref().and_then(|_| Cx::of(&parts).cloned());
        if let Some(p) = &me.phases {
            p.upstream_request(&mut parts);
        }
        // A WebSocket (or other) upgrade, on HTTP/1.1 (whose connections have a sink): the
        // client's connection, claimed now, is handed over once larder's 101 is written, and
        // joined to the backend's.
        let sink = crate::upgrade::wanted(&parts.headers)
            .then(crate::interim::Sink::current)
            .flatten();
        let client = sink.as_ref().map(|s| s.claim_upgrade());
        let (response_timeout, body_timeout) = (me.cfg.response_timeout.0, me.cfg.body_timeout.0);
        // A split's pool (docs/rules.md, "Traffic"), owned by the future that uses it.
        let split = super::Steer::of(me, &parts.extensions).and_then(|s| s.pool.clone());
        let sent = match split {
            None => futures_util::future::Either::Left(me.pool.send(
                parts,
                body,
                peer,
                response_timeout,
                body_timeout,
            )),
            Some(pool) => futures_util::future::Either::Right(Box::pin(async move {
                pool.send(parts, body, peer, response_timeout, body_timeout)
                    .await
            })),
        };
        // A map, not an async block: a future captured by one is kept twice once awaited.
        futures_util::FutureExt::map(sent, move |sent| {
            match sent {
                Ok(mut resp) if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS => {
                    let Some(client) = client else {
                        // The backend switched protocols unasked.
                        return me.tag(
                            FetchError::Upstream("101 to a request that asked no upgrade".into())
                                .response(),
                            status,
                        );
                    };
                    let backend = hyper::upgrade::on(&mut resp);
                    tokio::spawn(tunnel(client, backend, peer));
                    let (rparts, body) = resp.into_parts();
                    body.upgraded();
                    let mut out = Response::new(Body::empty());
                    *out.status_mut() = rparts.status;
                    *out.headers_mut() = rparts.headers;
                    out
                }
                Ok(resp) => {
                    if let Some(sink) = &sink {
                        // No upgrade after all: the connection stays with its server.
                        sink.unclaim_upgrade();
                    }
                    let (mut rparts, rbody) = resp.into_parts();
                    fields::strip_hop_by_hop(&mut rparts.headers);
                    if let Some(p) = &me.phases {
                        p.upstream_response(&mut rparts, cx.as_ref());
                    }
                    me.pass_on(rparts, Body::stream(rbody), &asked, status)
                }
                Err(e) => me.tag(e.response(), status),
            }
        })
    }
}

/// Joins an upgraded client connection to the backend's, bytes both ways, until either side
/// closes.
async fn tunnel(
    client: tokio::sync::oneshot::Receiver<crate::upgrade::Upgraded>,
    backend: hyper::upgrade::OnUpgrade,
    peer: SocketAddr,
) {
    use tokio::io::AsyncWriteExt;
    let (client, backend) = match tokio::join!(client, backend) {
        (Ok(c), Ok(b)) => (c, b),
        (c, b) => {
            tracing::debug!(%peer, client = c.is_ok(), backend = ?b.err(), "upgrade not completed");
            return;
        }
    };
    let mut backend = hyper_util::rt::TokioIo::new(backend);
    let mut io = client.io;
    if !client.read_ahead.is_empty() && backend.write_all(&client.read_ahead).await.is_err() {
        return;
    }
    match tokio::io::copy_bidirectional(&mut io, &mut backend).await {
        Ok((up, down)) => tracing::debug!(%peer, up, down, "upgraded connection closed"),
        Err(e) => tracing::debug!(%peer, error = %e, "upgraded connection ended"),
    }
}
