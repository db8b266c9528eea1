//! The request's journey through the cache: the fresh hit answered synchronously, then
//! everything else (stale, miss, purge): lookup → coalesce → fill (`fill.rs`) → deliver, and
//! the answer to a failed fetch.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use crate::body::RequestBody;
use http::header;
use http::{request, Method, Request, Response, StatusCode};

use super::fill::{clone_parts, FillRequest};
use super::{Inner, Proxy};
use crate::body::Body;
use crate::cache::policy::RequestDirectives;
use crate::cache::{CacheKey, Entry, FillKey, FillOutcome, Found, Join, Reach};
use crate::deliver::{self, CacheStatus};
use crate::upstream::FetchError;

/// A request [`Proxy::fresh_hit`] could not answer, for [`Proxy::handle_slow`]: with its cache
/// key and what memory held under it, once looked up (not for methods other than GET and HEAD,
/// requests with credentials or an upgrade, or a route that does not cache).
pub struct Slow {
    req: Request<RequestBody>,
    looked: Option<(CacheKey, Option<Arc<Entry>>)>,
}

impl Proxy {
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
        // A request with credentials is answered only by an entry stored as answering them:
        // that is the slow path's to check.
        // What the route's rules decided (a route without phases checks that one `Option`).
        let steer = super::Steer::of(me, req.extensions());
        if !me.cacheable(req.method(), req.headers())
            || req.headers().contains_key(header::AUTHORIZATION)
            || steer.is_some_and(|s| s.bypass)
        {
            return Err(Slow { req, looked: None });
        }
        let key = match steer {
            Some(s) => s.key(req.uri(), req.headers()),
            None => crate::cache::key::cache_key(&req),
        };
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
        if Inner::answers(&entry, &directives, false, now) {
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
            let key = me.key_of(&req);
            return crate::admin::purge_method(&me.cache, &me.access, &key, req.headers(), peer);
        }
        if !me.cacheable(method, req.headers()) || me.bypassed(req.extensions()) {
            return Box::pin(self.pass(req, peer, CacheStatus::Bypass)).await;
        }
        let directives = me.request_directives(req.headers(), peer);
        let has_auth = req.headers().contains_key(header::AUTHORIZATION);

        // Lookup (done already, unless the request had credentials).
        let (key, stored) = match looked {
            Some(looked) => looked,
            None => {
                let key = me.key_of(&req);
                let stored = me.cache.lookup(&key, req.headers());
                (key, stored)
            }
        };
        if let Some(entry) = &stored {
            let now = me.cache.clock().now();
            let usable = !has_auth || entry.auth_ok;
            if Inner::answers(entry, &directives, has_auth, now) {
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
                        .filter(|e| Inner::answers(e, directives, false, now))
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
}

impl Inner {
    /// Whether the cache may answer a request of this method with these fields at all: a
    /// caching route, GET or HEAD, no upgrade (anything else is passed). The one eligibility
    /// check, of the fresh hit and of the slow path alike.
    #[inline]
    fn cacheable(&self, method: &Method, headers: &http::HeaderMap) -> bool {
        self.cfg.cache
            && (*method == Method::GET || *method == Method::HEAD)
            && !headers.contains_key(header::UPGRADE)
    }

    /// Whether `entry` answers, as it is at `now`, a request with these directives: fresh
    /// enough for them and, for a request with credentials (`has_auth`), stored from a response
    /// that may answer them (RFC 9111 §3.5). The one freshness check, wherever an entry is
    /// found (memory, the disk, the shared tier, a fill waited on).
    #[inline]
    fn answers(
        entry: &Entry,
        directives: &RequestDirectives,
        has_auth: bool,
        now: SystemTime,
    ) -> bool {
        (!has_auth || entry.auth_ok) && directives.accepts(&entry.freshness, now)
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
    pub(super) async fn deliver_settled(
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

    pub(super) fn deliver_parts(
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
    pub(super) fn failure(
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
}
