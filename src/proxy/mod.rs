//! The caching reverse proxy handler: the request's journey through the cache, and how a
//! response that does not come from the store is adapted to the client (`pass_on`).
//!
//! ```text
//! request ─▶ GET/HEAD? ──no──▶ pass (stream both ways); a 2xx/3xx invalidates  x-cache: BYPASS
//!               │yes
//!               ▼
//!          lookup (URL, then Vary variant) ──fresh──▶ deliver                 HIT
//!               │stale within stale-while-revalidate ──▶ deliver, refresh in background  STALE
//!               │miss / stale
//!               ▼
//!          coalesce (per variant) ──follower──▶ wait ─▶ filled and Vary matches? deliver
//!               │                                  └─▶ failed? its error; other variant? its fill; else pass
//!               │leader
//!               ▼
//!          fill (fill.rs): fetch, conditional if stale ─▶ 304: refresh        REVALIDATED
//!               │  origin down / 5xx and stale-if-error allows ─▶ stale      STALE
//!               ▼
//!          storable? ──no──▶ stream back, release waiters                    MISS / EXPIRED
//!               │            (a client's Range: its own request sent instead)
//!               │yes
//!          buffer ─▶ decode once ─▶ store identity ─▶ deliver                 MISS / EXPIRED
//!                                     └─▶ background: gzip, zstd, br variants, each published
//!                                         when ready; until one the client accepts is, a
//!                                         delivery that would give identity waits for it
//! ```

mod fill;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use crate::body::RequestBody;
use http::header::{self, HeaderName, HeaderValue};
use http::{request, Method, Request, Response, StatusCode};

use crate::admin::Access;
use crate::body::Body;
use crate::cache::policy::RequestDirectives;
use crate::cache::{Cache, CacheKey, Entry, FillKey, FillOutcome, Found, Join, Reach};
use crate::config::{ProxyConfig, RequestCacheControl};
use crate::deliver::{self, CacheStatus};
use crate::http::fields::{self, VIA};
use crate::inbound;
use crate::upstream::{FetchError, Pool};
use fill::FillRequest;

/// A proxy route: a pool of backends, one shared cache. Cheap to clone (background refreshes hold one).
#[derive(Clone)]
pub struct Proxy(Arc<Inner>);

struct Inner {
    cfg: ProxyConfig,
    /// Who may PURGE.
    access: Access,
    pool: Arc<Pool>,
    cache: Arc<Cache>,
    status_header: HeaderName,
}

/// A request [`Proxy::fresh_hit`] could not answer, for [`Proxy::handle_slow`]: with its cache
/// key and what memory held under it, once looked up (not for methods other than GET and HEAD,
/// requests with credentials or an upgrade, or a route that does not cache).
pub struct Slow {
    req: Request<RequestBody>,
    looked: Option<(CacheKey, Option<Arc<Entry>>)>,
}

impl Proxy {
    pub fn new(cfg: ProxyConfig, pool: Arc<Pool>, cache: Arc<Cache>, access: Access) -> Proxy {
        Proxy(Arc::new(Inner {
            pool,
            access,
            status_header: cache.config().status_header.0.clone(),
            cfg,
            cache,
        }))
    }

    /// A route to the inline pool of `cfg` (unit tests).
    #[cfg(test)]
    pub(crate) fn for_test(cfg: ProxyConfig, cache: Arc<Cache>) -> Proxy {
        let crate::config::UpstreamRef::Inline(backends) = &cfg.upstream else {
            panic!("an inline upstream")
        };
        let pool = Pool::new("test", &cfg.inline_pool(backends)).expect("a pool");
        Proxy::new(cfg, pool, cache, Default::default())
    }

    /// The backends' URLs, for logs.
    pub fn upstream(&self) -> String {
        self.0.pool.describe()
    }

    /// Serves one request: [`Proxy::fresh_hit`], else [`Proxy::handle_slow`], as the router
    /// does (it calls the two itself, so that a hit makes no future at all).
    #[cfg(test)]
    pub async fn handle(&self, req: Request<RequestBody>, peer: SocketAddr) -> Response<Body> {
        match self.fresh_hit(req, peer) {
            Ok(resp) => resp,
            Err(slow) => Box::pin(self.clone().handle_slow(slow, peer)).await,
        }
    }

    /// The hot path: a GET/HEAD whose stored response satisfies it as is, answered
    /// synchronously. Anything else hands the request back unchanged (moved, not boxed:
    /// boxing would allocate on every miss) for [`Proxy::handle_slow`], with the key and
    /// what memory held under it when they were looked up.
    #[inline]
    #[allow(clippy::result_large_err)]
    pub fn fresh_hit(
        &self,
        req: Request<RequestBody>,
        peer: SocketAddr,
    ) -> Result<Response<Body>, Slow> {
        let me = &self.0;
        if !me.cfg.cache
            || (req.method() != Method::GET && req.method() != Method::HEAD)
            || req.headers().contains_key(header::AUTHORIZATION)
            || req.headers().contains_key(header::UPGRADE)
        {
            return Err(Slow { req, looked: None });
        }
        let key = cache_key(&req);
        let Some(entry) = me.cache.lookup(&key, req.headers()) else {
            return Err(Slow {
                req,
                looked: Some((key, None)),
            });
        };
        if entry.pending.is_some() {
            // Compressed variants are being built: the client may have to wait for one.
            return Err(Slow {
                req,
                looked: Some((key, Some(entry))),
            });
        }
        // Only the freshness directives matter to a fresh hit, and only where honoured.
        let directives = if me.honours(peer) {
            RequestDirectives::from_headers(req.headers())
        } else {
            RequestDirectives::default()
        };
        // One reading of the clock for the decision and the Age it stamps.
        let now = me.cache.clock().now();
        if directives.accepts(&entry.freshness, now) {
            Ok(me.deliver(&entry, &req, CacheStatus::Hit, now))
        } else {
            Err(Slow {
                req,
                looked: Some((key, Some(entry))),
            })
        }
    }

    /// Everything but a fresh hit: stale, miss, pass, purge.
    ///
    /// Takes the proxy by value (a clone of its `Arc`): the future owns what it needs, so the
    /// router boxes it as it is, with no `async` layer around it keeping a second copy.
    pub async fn handle_slow(self, slow: Slow, peer: SocketAddr) -> Response<Body> {
        let me = &self.0;
        let Slow { req, looked } = slow;
        let method = req.method();
        if method.as_str() == "PURGE" {
            let key = cache_key(&req);
            return crate::admin::purge_method(&me.cache, &me.access, &key, req.headers(), peer);
        }
        if !me.cfg.cache
            || (*method != Method::GET && *method != Method::HEAD)
            || req.headers().contains_key(header::UPGRADE)
        {
            return Box::pin(self.pass(req, peer, CacheStatus::Bypass)).await;
        }
        let directives = me.request_directives(req.headers(), peer);
        let has_auth = req.headers().contains_key(header::AUTHORIZATION);

        // Lookup (done already, unless the request had credentials).
        let (key, stored) = match looked {
            Some(looked) => looked,
            None => {
                let key = cache_key(&req);
                let stored = me.cache.lookup(&key, req.headers());
                (key, stored)
            }
        };
        if let Some(entry) = &stored {
            let now = me.cache.clock().now();
            let usable = !has_auth || entry.auth_ok;
            if usable && directives.accepts(&entry.freshness, now) {
                return me
                    .deliver_settled(entry, req.method(), req.headers(), CacheStatus::Hit)
                    .await;
            }
            // RFC 5861 §3: answer stale at once, refresh once in the background.
            if usable
                && !directives.no_cache
                && directives.max_age.is_none()
                && directives.min_fresh.is_none()
                && entry.freshness.serve_while_revalidating(now)
            {
                let fill_key = me.cache.fill_key(&key, req.headers());
                if let Join::Leader(guard) = me.cache.join(&fill_key) {
                    let (parts, _) = req.into_parts();
                    let background = self.clone();
                    let refresh = FillRequest {
                        client: clone_parts(&parts),
                        peer,
                        key,
                        guard: Some(guard),
                        status: CacheStatus::Expired,
                        stale: Some(Arc::clone(entry)),
                        request_no_store: false,
                        lease: None,
                    };
                    tokio::spawn(async move {
                        let _ = background.fill(refresh).await;
                    });
                    return me.deliver_parts(
                        stored.as_ref().expect("stored"),
                        &parts,
                        CacheStatus::Stale,
                    );
                }
                return me.deliver(entry, &req, CacheStatus::Stale, now);
            }
        }
        if directives.only_if_cached {
            // §5.2.1.7: answered from what is stored, in memory or below it.
            if stored.is_none() && !has_auth && me.cache.has_tiers() {
                let found = me
                    .cache
                    .find(&key, req.headers(), &directives, Reach::Fleet);
                if let Found::Hit(entry) = Box::pin(found).await {
                    let (method, headers) = (req.method(), req.headers());
                    return me
                        .deliver_settled(&entry, method, headers, CacheStatus::Hit)
                        .await;
                }
            }
            // Nothing stored satisfies the request.
            return me.tag(
                crate::http::text_response(StatusCode::GATEWAY_TIMEOUT, "not cached\n"),
                CacheStatus::Miss,
            );
        }
        let status = if stored.is_some() {
            CacheStatus::Expired
        } else {
            CacheStatus::Miss
        };
        let (parts, _body) = req.into_parts();
        // Requests with credentials fetch on their own, and so do no-store requests (their
        // response is not stored: nobody could wait on it) and misses of a URL whose last
        // response might not be stored (hit-for-miss: `Cache::mark_uncacheable`; what may be
        // stored now still is). A reload (no-cache, where honoured) coalesces like a miss:
        // concurrent reloads make one revalidation.
        if has_auth || directives.no_store || me.cache.is_uncacheable(&key) {
            return Box::pin(self.fill(FillRequest {
                client: parts,
                peer,
                key,
                guard: None,
                status,
                stale: stored,
                request_no_store: directives.no_store,
                lease: None,
            }))
            .await;
        }

        // A disk hit needs no fill, so the disk is read before coalescing (concurrent misses of
        // one URL may each read it, and promote the same entry).
        let mut stored = stored;
        if stored.is_none() && me.cache.has_tiers() {
            match Box::pin(
                me.cache
                    .find(&key, &parts.headers, &directives, Reach::Node),
            )
            .await
            {
                Found::Hit(entry) => {
                    let (method, headers) = (&parts.method, &parts.headers);
                    return me
                        .deliver_settled(&entry, method, headers, CacheStatus::Hit)
                        .await;
                }
                // Stale: revalidated like an entry of memory's.
                Found::Stale(entry) => stored = Some(entry),
                Found::Miss(_) => {}
            }
        }

        // Misses are boxed so the future of a hit stays small: hyper moves it.
        Box::pin(self.coalesced(parts, peer, key, &directives, stored)).await
    }

    /// Answers a miss through the fill that serves it: leads the fill, or waits on the one in
    /// flight and serves what it stored, but only if that response answers this request (Vary,
    /// §4.1). A URL stored as varying coalesces per variant from the start; for one not known to
    /// vary, every miss waits on the URL's fill, and a request the stored variant does not
    /// answer then joins (or leads) the fill of its own variant. Requests with credentials never
    /// get here: they fetch on their own.
    async fn coalesced(
        &self,
        parts: request::Parts,
        peer: SocketAddr,
        key: CacheKey,
        directives: &RequestDirectives,
        mut stored: Option<Arc<Entry>>,
    ) -> Response<Body> {
        let me = &self.0;
        let status = |stored: &Option<Arc<Entry>>| match stored {
            Some(_) => CacheStatus::Expired,
            None => CacheStatus::Miss,
        };
        let mut fill_key = me.cache.fill_key(&key, &parts.headers);
        // Waiting on the URL's fill, then on the variant's; one more in case the Vary changed.
        for _ in 0..3 {
            let follower = match me.cache.join(&fill_key) {
                Join::Leader(guard) => {
                    // Below memory: the disk (`handle_slow` found nothing there for this
                    // request: an index lookup), then the shared tier (and its lease).
                    let mut lease = None;
                    if stored.is_none() && me.cache.has_tiers() {
                        let found = me
                            .cache
                            .find(&key, &parts.headers, directives, Reach::Lease);
                        match Box::pin(found).await {
                            Found::Hit(entry) => {
                                guard.complete(Arc::clone(&entry));
                                let (method, headers) = (&parts.method, &parts.headers);
                                return me
                                    .deliver_settled(&entry, method, headers, CacheStatus::Hit)
                                    .await;
                            }
                            // Stale: revalidated like an entry of memory's.
                            Found::Stale(entry) => stored = Some(entry),
                            Found::Miss(l) => lease = l,
                        }
                    }
                    return self
                        .fill(FillRequest {
                            client: parts,
                            peer,
                            key,
                            guard: Some(guard),
                            status: status(&stored),
                            stale: stored,
                            request_no_store: directives.no_store,
                            lease,
                        })
                        .await;
                }
                Join::Follower(f) => f,
            };
            match follower.wait(me.cache.config().coalesce_timeout.0).await {
                FillOutcome::Filled(entry) if entry.selection.matches(&parts.headers) => {
                    let (method, headers) = (&parts.method, &parts.headers);
                    return me
                        .deliver_settled(&entry, method, headers, CacheStatus::Hit)
                        .await;
                }
                // Another variant: this request's own may be stored by now; if not, its fill.
                FillOutcome::Filled(other) => {
                    stored = me.cache.lookup(&key, &parts.headers);
                    let now = me.cache.clock().now();
                    if let Some(e) = stored
                        .as_ref()
                        .filter(|e| directives.accepts(&e.freshness, now))
                    {
                        let (method, headers) = (&parts.method, &parts.headers);
                        return me
                            .deliver_settled(e, method, headers, CacheStatus::Hit)
                            .await;
                    }
                    let variant = other.selection.key_of(&parts.headers);
                    fill_key = FillKey::variant(key.clone(), variant);
                }
                FillOutcome::Failed(e) => {
                    let (method, headers) = (&parts.method, &parts.headers);
                    return me.failure(&e, stored.as_deref(), method, headers, status(&stored));
                }
                FillOutcome::Released => break,
            }
        }
        // Nothing stored for this request (or waited too long): fetch for itself.
        let status = status(&stored);
        let req = Request::from_parts(parts, Body::empty());
        Box::pin(self.forward(req, peer, status)).await
    }

    /// Forwards a request the cache cannot serve and streams the response back. A successful
    /// response to an unsafe method invalidates the URLs it names (RFC 9111 §4.4).
    fn pass(
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
                cache_key_of(&parts),
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
    fn forward(
        &self,
        req: Request<Body>,
        peer: SocketAddr,
        status: CacheStatus,
    ) -> impl Future<Output = Response<Body>> + '_ {
        let me = &self.0;
        let (parts, body) = req.into_parts();
        let asked = Asked::of(&parts.method, &parts.headers);
        // A WebSocket (or other) upgrade, on HTTP/1.1 (whose connections have a sink): the
        // client's connection, claimed now, is handed over once larder's 101 is written, and
        // joined to the backend's.
        let sink = crate::upgrade::wanted(&parts.headers)
            .then(crate::interim::Sink::current)
            .flatten();
        let client = sink.as_ref().map(|s| s.claim_upgrade());
        let sent = (me.pool).send(
            parts,
            body,
            peer,
            me.cfg.response_timeout.0,
            me.cfg.body_timeout.0,
        );
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

/// What the client asked of a response that is passed on rather than delivered from the store,
/// taken before its request goes upstream: the method, and the fields the response is adapted
/// to.
struct Asked {
    head: bool,
    accept: Option<HeaderValue>,
    range: Option<HeaderValue>,
    if_range: Option<HeaderValue>,
}

impl Asked {
    fn of(method: &Method, headers: &http::HeaderMap) -> Asked {
        let get = |name| headers.get(name).cloned();
        Asked {
            head: *method == Method::HEAD,
            accept: get(header::ACCEPT_ENCODING),
            range: (*method == Method::GET)
                .then(|| get(header::RANGE))
                .flatten(),
            if_range: get(header::IF_RANGE),
        }
    }
}

impl Inner {
    /// Whether this route obeys the freshness directives of requests from `peer`
    /// (`request_cache_control`, `request_cache_control_trusted`).
    #[inline]
    fn honours(&self, peer: SocketAddr) -> bool {
        self.cfg.request_cache_control == RequestCacheControl::Honour
            || self
                .cfg
                .request_cache_control_trusted
                .iter()
                .any(|c| c.contains(peer.ip()))
    }

    /// The request's directives as this route obeys them for `peer`: all of them where honoured,
    /// else only no-store and only-if-cached (RFC 9111 §5.2.1: they are advisory).
    fn request_directives(&self, headers: &http::HeaderMap, peer: SocketAddr) -> RequestDirectives {
        let d = RequestDirectives::from_headers(headers);
        if self.honours(peer) {
            d
        } else {
            d.binding_only()
        }
    }

    /// Delivers `entry` as it is at `now` (by the cache's clock).
    #[inline]
    fn deliver<B>(
        &self,
        entry: &crate::cache::Entry,
        req: &Request<B>,
        status: CacheStatus,
        now: SystemTime,
    ) -> Response<Body> {
        deliver::from_entry(
            entry,
            req.method(),
            req.headers(),
            status,
            &self.status_header,
            now,
        )
    }

    /// Delivers `entry`, first waiting (at most `coalesce_timeout`) for a compressed variant
    /// the client accepts when the entry holds none yet and one is being built (not when its
    /// compression is queued behind other bodies': then identity at once).
    async fn deliver_settled(
        &self,
        entry: &Arc<crate::cache::Entry>,
        method: &Method,
        headers: &http::HeaderMap,
        status: CacheStatus,
    ) -> Response<Body> {
        let settled;
        let entry = match &entry.pending {
            Some(p) => {
                let accept =
                    crate::compress::AcceptEncoding::parse(headers.get(header::ACCEPT_ENCODING));
                let can_start = self.cache.compressor().idle();
                let wait = self.cache.config().coalesce_timeout.0;
                settled = p.settled(entry, &accept, can_start, wait).await;
                &settled
            }
            None => entry,
        };
        let now = self.cache.clock().now();
        deliver::from_entry(entry, method, headers, status, &self.status_header, now)
    }

    fn deliver_parts(
        &self,
        entry: &crate::cache::Entry,
        parts: &request::Parts,
        status: CacheStatus,
    ) -> Response<Body> {
        deliver::from_entry(
            entry,
            &parts.method,
            &parts.headers,
            status,
            &self.status_header,
            self.cache.clock().now(),
        )
    }

    /// The answer to a request whose fetch failed (its own, or the fill it waited on): the stale
    /// response if stale-if-error or the disconnected grace allows it (RFC 5861 §4, RFC 9111
    /// §4.2.4; never under must-revalidate), else the error as 502/504.
    fn failure(
        &self,
        e: &FetchError,
        stale: Option<&crate::cache::Entry>,
        method: &Method,
        request: &http::HeaderMap,
        status: CacheStatus,
    ) -> Response<Body> {
        let now = self.cache.clock().now();
        let grace = self.cache.config().stale_if_disconnected.0;
        match stale.filter(|o| {
            o.freshness.serve_on_error(now) || o.freshness.serve_disconnected(now, grace)
        }) {
            Some(old) => deliver::from_entry(
                old,
                method,
                request,
                CacheStatus::Stale,
                &self.status_header,
                now,
            ),
            None => self.tag(e.response(), status),
        }
    }

    /// Stamps the cache-status header on a response not delivered from the store, and notes
    /// the result in its outcome.
    fn tag(&self, mut r: Response<Body>, status: CacheStatus) -> Response<Body> {
        r.headers_mut()
            .insert(self.status_header.clone(), status.header_value());
        r.body_mut().outcome_mut().set_cache(status.result());
        r
    }

    /// A response that is not delivered from the store, on its way to the client: larder's
    /// private fields removed, Via added, then adapted to what the client asked: one range cut
    /// from a full 200 the origin sent despite the client's Range (the upstream dropped once it
    /// is sent), or else a coding the client does not accept decoded, an identity body
    /// compressed on the fly.
    fn pass_on(
        &self,
        mut rparts: http::response::Parts,
        body: Body,
        asked: &Asked,
        status: CacheStatus,
    ) -> Response<Body> {
        use crate::range::{self, Decision};
        self.strip_private_fields(&mut rparts.headers);
        rparts.headers.append(header::VIA, VIA);
        let body = if asked.head { Body::empty() } else { body };
        match range_to_cut(&rparts, asked) {
            (Decision::Partial(ranges), Some(len)) if ranges.len() == 1 => {
                rparts.status = StatusCode::PARTIAL_CONTENT;
                let body = range::slice_stream(ranges[0], len, &mut rparts.headers, body);
                return self.tag(Response::from_parts(rparts, body), status);
            }
            (Decision::Unsatisfiable, Some(len)) => {
                return self.tag(range::unsatisfiable(len), status);
            }
            // Several ranges get the whole 200 (a server may ignore Range, RFC 9110 §14.2).
            _ => {}
        }
        let body = self.recode(&mut rparts, body, asked);
        self.tag(Response::from_parts(rparts, body), status)
    }

    /// Adapts the content coding of a response passed on to the client's Accept-Encoding: a
    /// coding it does not accept (RFC 9110 §12.5.3; no Accept-Encoding counts as identity only,
    /// as for stored responses) is decoded while streaming; an identity body is compressed on
    /// the fly if it accepts a coding. Never under `no-transform` (§7.7), never a partial body,
    /// and a coding larder does not know is passed as sent. The headers are set even for HEAD.
    fn recode(&self, rparts: &mut http::response::Parts, body: Body, asked: &Asked) -> Body {
        use crate::compress::{AcceptEncoding, Encoding};
        let h = &rparts.headers;
        let Some(coded) = h.get(header::CONTENT_ENCODING) else {
            return if asked.head {
                body
            } else {
                self.compress_on_the_fly(rparts, body, asked.accept.as_ref())
            };
        };
        let decodable = coded
            .to_str()
            .ok()
            .and_then(Encoding::from_content_encoding)
            .filter(|e| {
                *e != Encoding::Identity
                    && !AcceptEncoding::parse(asked.accept.as_ref()).accepts(*e)
                    && !matches!(rparts.status.as_u16(), 100..=199 | 204 | 206 | 304)
                    && !h.contains_key(header::CONTENT_RANGE)
                    && !crate::cache::policy::CacheControl::from_headers(h, &header::CACHE_CONTROL)
                        .no_transform
            });
        let Some(enc) = decodable else {
            return body;
        };
        let empty = content_length(h) == Some(0);
        mark_recoded(&mut rparts.headers, Encoding::Identity);
        if asked.head || empty {
            body
        } else {
            crate::compress::decode_stream(body, enc)
        }
    }

    /// Compresses a response that is not stored, per request, when the client accepts a coding,
    /// the origin sent none, the type is compressible and `no-transform` does not forbid it.
    fn compress_on_the_fly(
        &self,
        rparts: &mut http::response::Parts,
        body: Body,
        accept: Option<&http::HeaderValue>,
    ) -> Body {
        let compressor = self.cache.compressor();
        let h = &rparts.headers;
        let len = content_length(h).map_or(usize::MAX, |n| n as usize);
        let eligible = compressor.config().dynamic
            && accept.is_some()
            && matches!(rparts.status.as_u16(), 200..=203)
            && !h.contains_key(header::CONTENT_ENCODING)
            && !h.contains_key(header::CONTENT_RANGE)
            && compressor.wants(h.get(header::CONTENT_TYPE), len)
            && !h
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
            && !crate::cache::policy::CacheControl::from_headers(h, &header::CACHE_CONTROL)
                .no_transform;
        if !eligible {
            return body;
        }
        let Some(enc) = crate::compress::AcceptEncoding::parse(accept).dynamic_choice() else {
            return body;
        };
        mark_recoded(&mut rparts.headers, enc);
        crate::compress::encode_stream(body, enc, compressor.config())
    }

    /// Fields meant for larder alone (targeted cache-control, tags) never go on.
    fn strip_private_fields(&self, headers: &mut http::HeaderMap) {
        let cfg = self.cache.config();
        for f in &cfg.targeted_cache_control {
            // CDN-Cache-Control speaks to every CDN on the path (RFC 9213 §3): forwarded unless
            // configured otherwise. A field of larder's own naming is consumed here.
            if !(cfg.forward_cdn_cache_control && f.0 == "cdn-cache-control") {
                headers.remove(&f.0);
            }
        }
        headers.remove(&cfg.tag_header.0);
    }
}

/// The fields of a response whose body larder codes into `enc` (Identity: decodes) on the way:
/// Content-Encoding set, Content-Length gone (the new length is not known before the end), the
/// ETag weakened (another representation), Vary: Accept-Encoding (the body now depends on it).
fn mark_recoded(h: &mut http::HeaderMap, enc: crate::compress::Encoding) {
    h.remove(header::CONTENT_LENGTH);
    match enc.header_value() {
        Some(v) => h.insert(header::CONTENT_ENCODING, v),
        None => h.remove(header::CONTENT_ENCODING),
    };
    if !crate::cache::entry::vary_lists(h, "accept-encoding") {
        h.append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    }
    if let Some(weak) = h.get(header::ETAG).and_then(crate::http::etag::weakened) {
        h.insert(header::ETAG, weak);
    }
}

/// What to do with the client's Range on a response passed on, and the length it counts in:
/// only a 200 of known length whose bytes go to the client as they are (not decoded for it).
fn range_to_cut(
    rparts: &http::response::Parts,
    asked: &Asked,
) -> (crate::range::Decision, Option<u64>) {
    use crate::compress::{AcceptEncoding, Encoding};
    if asked.range.is_none() {
        // Nothing to cut (most requests): no header of the response is read.
        return (crate::range::Decision::Full, None);
    }
    let h = &rparts.headers;
    let decoded = h
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .and_then(Encoding::from_content_encoding)
        .is_some_and(|e| {
            e != Encoding::Identity && !AcceptEncoding::parse(asked.accept.as_ref()).accepts(e)
        });
    match content_length(h) {
        Some(len) if rparts.status == StatusCode::OK && !decoded => (
            range_against(asked.range.as_ref(), asked.if_range.as_ref(), h, len),
            Some(len),
        ),
        _ => (crate::range::Decision::Full, None),
    }
}

/// A request's Range and If-Range against a response with these headers, `len` bytes long.
fn range_against(
    range: Option<&HeaderValue>,
    if_range: Option<&HeaderValue>,
    response: &http::HeaderMap,
    len: u64,
) -> crate::range::Decision {
    // Only If-Range compares dates.
    let last_modified = if_range
        .and(response.get(header::LAST_MODIFIED))
        .and_then(|v| v.to_str().ok())
        .and_then(crate::http::date::parse_lenient);
    crate::range::decide(
        range,
        if_range,
        len,
        response.get(header::ETAG),
        last_modified,
    )
}

/// A response's Content-Length, when it has a valid one.
fn content_length(h: &http::HeaderMap) -> Option<u64> {
    h.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

fn clone_parts(p: &request::Parts) -> request::Parts {
    let mut b = Request::builder()
        .method(p.method.clone())
        .uri(p.uri.clone())
        .version(p.version);
    if let Some(h) = b.headers_mut() {
        *h = p.headers.clone();
    }
    b.body(()).expect("parts are valid").into_parts().0
}

/// The cache key of a request: scheme, its one authority (see [`crate::inbound`]), path and
/// query.
pub fn cache_key<B>(req: &Request<B>) -> CacheKey {
    let pq = req.uri().path_and_query().map_or("/", |p| p.as_str());
    CacheKey::from_parts("http", inbound::authority(req.uri(), req.headers()), pq)
}

fn cache_key_of(parts: &request::Parts) -> CacheKey {
    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    CacheKey::from_parts("http", key_host(parts), pq)
}

fn key_host(parts: &request::Parts) -> &str {
    inbound::authority(&parts.uri, &parts.headers)
}

/// The cache key a Location / Content-Location names, if on the same origin (§4.4).
fn same_origin_key(target: &str, host: &str, request_path: &str) -> Option<CacheKey> {
    if let Some(rest) = target.strip_prefix("http://") {
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, "/"),
        };
        return authority
            .eq_ignore_ascii_case(host)
            .then(|| CacheKey::from_parts("http", host, path));
    }
    if target.starts_with("//") || target.contains("://") {
        return None;
    }
    if target.starts_with('/') {
        return Some(CacheKey::from_parts("http", host, target));
    }
    let dir = &request_path[..request_path.rfind('/').map_or(0, |i| i + 1)];
    Some(CacheKey::from_parts(
        "http",
        host,
        &format!("{dir}{target}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalidation_targets_stay_on_the_origin() {
        let k = |t: &str| same_origin_key(t, "example.com", "/a/b").map(|k| k.as_str().to_string());
        assert_eq!(k("/x").as_deref(), Some("http://example.com/x"));
        assert_eq!(k("c").as_deref(), Some("http://example.com/a/c"));
        assert_eq!(
            k("http://EXAMPLE.com/y").as_deref(),
            Some("http://example.com/y")
        );
        assert_eq!(k("http://other.com/y"), None);
        assert_eq!(k("//other.com/y"), None);
        assert_eq!(k("https://example.com/y"), None);
    }
}

#[cfg(test)]
mod size_probe {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// What the handler's future may weigh: 584 B when docs/design.md ("Stale serving and the
    /// request's future") was written, plus a little headroom for fields added since.
    const HIT_FUTURE_MAX: usize = 640;

    /// Regression guard: hyper moves the handler's future for every request, so a hit must not
    /// carry the state of the miss path (it was 2.5 KB before the slow path was boxed).
    #[tokio::test]
    async fn hit_future_stays_small() {
        let cache = crate::cache::Cache::new(Default::default(), Default::default());
        let p = super::Proxy::for_test(
            crate::config::ProxyConfig::new("http://127.0.0.1:1".parse().unwrap()),
            cache,
        );
        let size = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&size);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let svc =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let (p, seen) = (p.clone(), Arc::clone(&seen));
                    async move {
                        let f = p.handle(
                            req.map(crate::body::RequestBody::Hyper),
                            "127.0.0.1:1".parse().unwrap(),
                        );
                        seen.store(std::mem::size_of_val(&f), Ordering::SeqCst);
                        Ok::<_, std::convert::Infallible>(f.await)
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                .await;
        });
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut v = Vec::new();
        let _ = s.read_to_end(&mut v).await;
        // The origin is down: the answer proves the handler ran (and its size was taken).
        assert!(String::from_utf8_lossy(&v).starts_with("HTTP/1.1 502"));
        let size = size.load(Ordering::SeqCst);
        assert!(
            size <= HIT_FUTURE_MAX,
            "the handler's future weighs {size} B, over its bound of {HIT_FUTURE_MAX} B \
             (584 B measured, 10% headroom): keep the miss path's state boxed"
        );
    }
}
