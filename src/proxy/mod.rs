//! The caching reverse proxy handler: the request's journey through the cache.
//!
//! ```text
//! request ─▶ cacheable? ──no──▶ pass (stream both ways)                         x-cache: BYPASS
//!               │yes
//!               ▼
//!          lookup ──fresh──▶ deliver                                            x-cache: HIT
//!               │miss/stale
//!               ▼
//!          coalesce ──follower──▶ wait ─▶ filled? deliver : pass
//!               │leader
//!               ▼
//!          fetch (conditional if stale) ─▶ 304? refresh + deliver               REVALIDATED
//!               │
//!          storable? ──no──▶ stream back, release waiters                       MISS/EXPIRED
//!               │yes
//!          buffer (≤ max object) ─▶ decode once ─▶ store identity ─▶ deliver     MISS/EXPIRED
//!                                                   └─▶ background: gzip, br, zstd variants
//! ```

pub mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use futures_util::StreamExt;
use http::header::{self, HeaderMap, HeaderName};
use http::{response, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, BodyStream, StreamBody};
use hyper::body::Incoming;

use crate::body::Body;
use crate::cache::policy::{self, FetchContext, RequestDirectives};
use crate::cache::{Cache, CacheKey, Entry, FillOutcome, Join};
use crate::compress::Encoding;
use crate::config::ProxyConfig;
use crate::deliver::{self, CacheStatus};
use upstream::{FetchError, VIA};

/// A proxy route: one upstream, one shared cache.
pub struct Proxy {
    cfg: ProxyConfig,
    client: upstream::Client,
    cache: Arc<Cache>,
    status_header: HeaderName,
}

/// Conditional request fields a fill never forwards (the fill must get a full response).
const CONDITIONALS: [HeaderName; 6] = [
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
    header::RANGE,
];

impl Proxy {
    pub fn new(cfg: ProxyConfig, cache: Arc<Cache>) -> Proxy {
        Proxy {
            client: upstream::client(&cfg),
            status_header: cache.cfg.status_header.0.clone(),
            cfg,
            cache,
        }
    }

    /// The upstream's URL, for logs.
    pub fn upstream(&self) -> String {
        format!(
            "{}://{}",
            self.cfg.upstream.scheme, self.cfg.upstream.authority
        )
    }

    /// Serves one request.
    pub async fn handle(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        let method = req.method();
        if !self.cfg.cache
            || (*method != Method::GET && *method != Method::HEAD)
            || req.headers().contains_key(header::UPGRADE)
        {
            return self.pass(req, peer, CacheStatus::Bypass).await;
        }
        let key = cache_key(&req);
        let directives = RequestDirectives::from_headers(req.headers());
        let has_auth = req.headers().contains_key(header::AUTHORIZATION);

        // Lookup.
        let stored = self.cache.store.get(&key);
        if let Some(entry) = &stored {
            if directives.accepts(&entry.freshness, Instant::now()) && (!has_auth || entry.auth_ok)
            {
                return deliver::from_entry(
                    entry,
                    req.method(),
                    req.headers(),
                    CacheStatus::Hit,
                    &self.status_header,
                );
            }
        }
        if directives.only_if_cached {
            // §5.2.1.7: nothing stored satisfies the request.
            return self.tag(
                upstream::text_response(StatusCode::GATEWAY_TIMEOUT, "not cached\n"),
                CacheStatus::Miss,
            );
        }
        let status = if stored.is_some() {
            CacheStatus::Expired
        } else {
            CacheStatus::Miss
        };
        // Requests with credentials or that demand an end-to-end reload fetch on their own.
        if has_auth || directives.no_cache {
            return self
                .fill(req, peer, key, None, status, stored, &directives)
                .await;
        }

        // Coalesce concurrent misses.
        match self.cache.store.inflight.join(&key) {
            Join::Leader(guard) => {
                self.fill(req, peer, key, Some(guard), status, stored, &directives)
                    .await
            }
            Join::Follower(follower) => {
                match follower.wait(self.cache.cfg.coalesce_timeout.0).await {
                    FillOutcome::Filled(entry) => deliver::from_entry(
                        &entry,
                        req.method(),
                        req.headers(),
                        CacheStatus::Hit,
                        &self.status_header,
                    ),
                    FillOutcome::Released => self.pass(req, peer, status).await,
                }
            }
        }
    }

    /// Forwards the request as is and streams the response back; nothing is stored.
    async fn pass(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        status: CacheStatus,
    ) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        upstream::prepare_request(&mut parts, &self.cfg.upstream, peer);
        let req = Request::from_parts(parts, Body::stream(body));
        match upstream::send(&self.client, req, self.cfg.response_timeout.0).await {
            Ok(resp) => {
                let (mut rparts, rbody) = resp.into_parts();
                upstream::strip_hop_by_hop(&mut rparts.headers);
                rparts.headers.append(header::VIA, VIA);
                self.tag(Response::from_parts(rparts, Body::stream(rbody)), status)
            }
            Err(e) => self.tag(e.response(), status),
        }
    }

    /// Fetches for the cache: a full (or, for a stale entry, conditional) GET; stores the response
    /// if policy allows, and answers the client. Dropping `guard` without completing it releases
    /// coalesced waiters.
    #[allow(clippy::too_many_arguments)]
    async fn fill(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        key: CacheKey,
        guard: Option<crate::cache::coalesce::FillGuard>,
        status: CacheStatus,
        stale: Option<Arc<Entry>>,
        directives: &RequestDirectives,
    ) -> Response<Body> {
        let (mut parts, _body) = req.into_parts();
        let client_method = parts.method.clone();
        let client_headers = parts.headers.clone();
        let has_authorization = client_headers.contains_key(header::AUTHORIZATION);

        upstream::prepare_request(&mut parts, &self.cfg.upstream, peer);
        for h in CONDITIONALS {
            parts.headers.remove(h);
        }
        if let Some(e) = &stale {
            // §4.3.1: validate with the stored validators.
            if let Some(tag) = &e.etag {
                parts.headers.insert(header::IF_NONE_MATCH, tag.clone());
            }
            if let Some(lm) = e.headers.get(header::LAST_MODIFIED) {
                parts.headers.insert(header::IF_MODIFIED_SINCE, lm.clone());
            }
        }
        // A HEAD fill fetches the GET response so the body can be stored and served.
        parts.method = Method::GET;
        let request_time = SystemTime::now();
        let resp = match upstream::send(
            &self.client,
            Request::from_parts(parts, Body::empty()),
            self.cfg.response_timeout.0,
        )
        .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(key = key.as_str(), error = %e, "fill failed");
                return self.tag(e.response(), status);
            }
        };
        let ctx = FetchContext {
            method: Method::GET,
            has_authorization,
            request_time,
            response_time: SystemTime::now(),
            response_instant: Instant::now(),
            request_no_store: directives.no_store,
        };
        let (mut rparts, rbody) = resp.into_parts();
        upstream::strip_hop_by_hop(&mut rparts.headers);

        // Revalidated: refresh the stored headers and serve the stored body (§4.3.4).
        if rparts.status == StatusCode::NOT_MODIFIED {
            if let Some(old) = &stale {
                let headers = refresh_headers(&old.headers, &rparts.headers);
                if let Ok(storable) =
                    policy::storability(&ctx, old.status, &headers, &self.cache.cfg)
                {
                    let entry = Arc::new(old.refreshed(headers, storable.freshness));
                    self.cache.store.insert(key, Arc::clone(&entry));
                    if let Some(g) = guard {
                        g.complete(Arc::clone(&entry));
                    }
                    return deliver::from_entry(
                        &entry,
                        &client_method,
                        &client_headers,
                        CacheStatus::Revalidated,
                        &self.status_header,
                    );
                }
            }
        }

        let storable =
            match policy::storability(&ctx, rparts.status, &rparts.headers, &self.cache.cfg)
                .and_then(|s| {
                    if crate::cache::entry::vary_names_other_than_accept_encoding(&rparts.headers) {
                        Err(policy::NoStoreReason::Vary)
                    } else {
                        Ok(s)
                    }
                }) {
                Ok(s) => s,
                Err(reason) => {
                    tracing::debug!(key = key.as_str(), reason = reason.as_str(), "not stored");
                    drop(guard);
                    if stale.is_some() {
                        self.cache.store.remove(&key);
                    }
                    return self.respond_streamed(rparts, rbody, &client_method, status);
                }
            };

        // Buffer the body, up to the object size limit.
        let max = self.cache.store.max_object_size;
        let declared = rparts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max) {
            drop(guard);
            return self.respond_streamed(rparts, rbody, &client_method, status);
        }
        let body = match buffer_up_to(rbody, max).await {
            Buffered::Complete(b) => b,
            Buffered::TooLarge(streamed) => {
                drop(guard);
                self.cache.store.remove(&key);
                let r = Response::from_parts(rparts, head_aware(streamed, &client_method));
                return self.tag(r, status);
            }
            Buffered::Failed(e) => {
                tracing::debug!(key = key.as_str(), error = %e, "upstream body failed; nothing stored");
                return self.tag(e.response(), status);
            }
        };

        // Decode once if the origin sent a coding.
        let coding = match rparts.headers.get(header::CONTENT_ENCODING) {
            None => Some(Encoding::Identity),
            Some(v) => v.to_str().ok().and_then(Encoding::from_content_encoding),
        };
        let mut bodies = Vec::with_capacity(4);
        match coding {
            Some(Encoding::Identity) => bodies.push((Encoding::Identity, body)),
            Some(enc) if !storable.no_transform => {
                match self
                    .cache
                    .compressor
                    .decode(body.clone(), enc, max as usize)
                    .await
                {
                    Ok(identity) => {
                        bodies.push((Encoding::Identity, identity));
                        bodies.push((enc, body));
                    }
                    Err(e) => {
                        tracing::debug!(key = key.as_str(), error = %e, "cannot decode; not stored");
                        drop(guard);
                        return self.tag(Response::from_parts(rparts, Body::full(body)), status);
                    }
                }
            }
            // An unknown coding, or a coded no-transform response: passed on untouched.
            _ => {
                drop(guard);
                return self.tag(Response::from_parts(rparts, Body::full(body)), status);
            }
        }

        let mut headers = rparts.headers.clone();
        for name in &storable.strip {
            headers.remove(name);
        }
        headers.append(header::VIA, VIA);
        let negotiated = !storable.no_transform
            && self
                .cache
                .compressor
                .wants(headers.get(header::CONTENT_TYPE), bodies[0].1.len());
        let mut entry = Entry::build(
            rparts.status,
            headers,
            bodies,
            storable.freshness,
            negotiated,
        );
        entry.auth_ok = storable.auth_ok;
        let entry = Arc::new(entry);
        self.cache.store.insert(key.clone(), Arc::clone(&entry));
        if let Some(g) = guard {
            g.complete(Arc::clone(&entry));
        }
        if negotiated {
            self.cache.spawn_variants(key, Arc::clone(&entry));
        }
        let mut resp = deliver::from_entry(
            &entry,
            &client_method,
            &client_headers,
            status,
            &self.status_header,
        );
        // The client that caused the fill still gets the fields not stored for others.
        for name in &storable.strip {
            for v in rparts.headers.get_all(name) {
                resp.headers_mut().append(name.clone(), v.clone());
            }
        }
        resp
    }

    fn respond_streamed(
        &self,
        mut rparts: response::Parts,
        rbody: Incoming,
        method: &Method,
        status: CacheStatus,
    ) -> Response<Body> {
        rparts.headers.append(header::VIA, VIA);
        let body = if *method == Method::HEAD {
            Body::empty()
        } else {
            Body::stream(rbody)
        };
        self.tag(Response::from_parts(rparts, body), status)
    }

    fn tag(&self, mut r: Response<Body>, status: CacheStatus) -> Response<Body> {
        r.headers_mut()
            .insert(self.status_header.clone(), status.header_value());
        r
    }
}

fn head_aware(body: Body, method: &Method) -> Body {
    if *method == Method::HEAD {
        Body::empty()
    } else {
        body
    }
}

/// The cache key of a request: scheme, Host (or URI authority), path and query.
pub fn cache_key<B>(req: &Request<B>) -> CacheKey {
    let host = req
        .uri()
        .authority()
        .map(|a| a.as_str())
        .or_else(|| {
            req.headers()
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
        })
        .unwrap_or("");
    let pq = req.uri().path_and_query().map_or("/", |p| p.as_str());
    CacheKey::from_parts("http", host, pq)
}

/// Headers of a stored response updated by a 304 (RFC 9111 §3.2): every field in the 304
/// replaces the stored one, except those describing the body.
fn refresh_headers(stored: &HeaderMap, fresh: &HeaderMap) -> HeaderMap {
    let mut out = stored.clone();
    let keep: [HeaderName; 4] = [
        header::CONTENT_LENGTH,
        header::CONTENT_ENCODING,
        header::CONTENT_RANGE,
        header::TRANSFER_ENCODING,
    ];
    let mut replaced: Vec<&HeaderName> = Vec::new();
    for (name, value) in fresh.iter() {
        if keep.contains(name) {
            continue;
        }
        if !replaced.contains(&name) {
            out.remove(name);
            replaced.push(name);
        }
        out.append(name.clone(), value.clone());
    }
    out
}

enum Buffered {
    Complete(Bytes),
    /// Larger than the limit: the part read so far followed by the rest, streamed.
    TooLarge(Body),
    Failed(FetchError),
}

/// Reads `body` whole if it fits in `max` bytes.
async fn buffer_up_to(mut body: Incoming, max: u64) -> Buffered {
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut total: u64 = 0;
    loop {
        match body.frame().await {
            None => break,
            Some(Err(e)) => return Buffered::Failed(FetchError::Body(e.to_string())),
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue; // trailers are not stored
                };
                total += data.len() as u64;
                chunks.push(data);
                if total > max {
                    let head = futures_util::stream::iter(
                        chunks
                            .into_iter()
                            .map(|c| Ok::<_, hyper::Error>(http_body::Frame::data(c))),
                    );
                    let rest = BodyStream::new(body);
                    return Buffered::TooLarge(Body::stream(StreamBody::new(head.chain(rest))));
                }
            }
        }
    }
    Buffered::Complete(match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.pop().expect("one chunk"),
        _ => {
            let mut v = Vec::with_capacity(total as usize);
            for c in chunks {
                v.extend_from_slice(&c);
            }
            Bytes::from(v)
        }
    })
}
