//! The caching reverse proxy handler: the route ([`Proxy`]: its pool, the shared cache, who
//! may purge, its phases) and, a file per concern, the request's journey through the cache
//! (`journey.rs`: the fresh hit, lookup, coalescing, delivery), the fill (`fill.rs`), what the
//! cache does not serve (`pass.rs`: pass, forward, tunnel) and how a response that does not come
//! from the store is adapted to the client (`adapt.rs`, `pass_on`: range cut, recode,
//! compression on the fly). The route's phases ② and ③ ([`crate::phases`]) run in `fill.rs`
//! and `pass.rs`, around each upstream exchange; what a route's cache and traffic rules
//! decided at ① reaches the proxy in the request as a [`Steer`] (its key's shape, a bypass,
//! lifetimes, the pool of a split), read only on a route with phases.
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

mod adapt;
mod fill;
mod journey;
mod pass;

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::HeaderName;
use http::Response;

use crate::admin::Access;
use crate::body::Body;
use crate::cache::policy::RequestDirectives;
use crate::cache::Cache;
use crate::config::{ProxyConfig, RequestCacheControl};
use crate::deliver::CacheStatus;
use crate::phases::Phases;
use crate::upstream::Pool;
pub use journey::Slow;
// Shared by the fill (`fill.rs`) with the files that define them.
use adapt::{content_length, range_against, Asked};

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
    /// The route's phases, for ② and ③ around each upstream exchange ([`crate::phases`]; ①,
    /// ④ and ⑤ are the router's). None: the route has no steps.
    phases: Option<Arc<Phases>>,
}

impl Proxy {
    pub fn new(
        cfg: ProxyConfig,
        pool: Arc<Pool>,
        cache: Arc<Cache>,
        access: Access,
        phases: Option<Arc<Phases>>,
    ) -> Proxy {
        Proxy(Arc::new(Inner {
            pool,
            access,
            phases,
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
        Proxy::new(cfg, pool, cache, Default::default(), None)
    }

    /// The backends' URLs, for logs.
    pub fn upstream(&self) -> String {
        self.0.pool.describe()
    }

    /// Serves one request: [`Proxy::fresh_hit`], else [`Proxy::handle_slow`], as the router
    /// does (it calls the two itself, so that a hit makes no future at all).
    #[cfg(test)]
    pub async fn handle(
        &self,
        req: http::Request<crate::body::RequestBody>,
        peer: SocketAddr,
    ) -> Response<Body> {
        match self.fresh_hit(req, peer) {
            Ok(resp) => resp,
            Err(slow) => Box::pin(self.clone().handle_slow(slow, peer)).await,
        }
    }
}

/// What a route's rules decided at ① for the proxy (docs/rules.md, "Cache" and "Traffic"),
/// carried in the request's extensions. Read only on a route with phases.
#[derive(Clone, Default)]
pub struct Steer {
    /// `cache_key`: the key's parts.
    pub key: Option<Arc<crate::config::rules_cache::CacheKeyConfig>>,
    /// `cache_ttl`: lifetimes by status, clamps.
    pub ttl: Option<Arc<crate::config::rules_cache::CacheTtlConfig>>,
    /// `cache_force`: stored for this long whatever the origin says (never `private`).
    pub force: Option<std::time::Duration>,
    /// `cache_bypass` (or a split that does not cache): passed, not looked up nor stored.
    pub bypass: bool,
    /// `split`: the pool this request goes to instead of the route's.
    pub pool: Option<Arc<Pool>>,
    /// `split` with `cache = "per-pool"`: the pool's name is part of the key.
    pub pool_in_key: bool,
}

impl Steer {
    /// What the rules decided for this request, on a route with phases.
    #[inline]
    fn of<'a>(me: &Inner, ext: &'a http::Extensions) -> Option<&'a Steer> {
        me.phases.as_ref().and_then(|_| ext.get::<Steer>())
    }

    /// The request's cache key, shaped by the rules.
    pub fn key(&self, uri: &http::Uri, headers: &http::HeaderMap) -> crate::cache::CacheKey {
        let pool = (self.pool.as_ref())
            .filter(|_| self.pool_in_key)
            .map(|p| p.name());
        crate::cache::key::shaped_key(uri, headers, self.key.as_deref(), pool)
    }
}

impl Inner {
    /// The pool a request goes to: the route's, or the one a split chose.
    #[inline]
    fn pool_for<'a>(&'a self, ext: &'a http::Extensions) -> &'a Arc<Pool> {
        match Steer::of(self, ext).and_then(|s| s.pool.as_ref()) {
            Some(p) => p,
            None => &self.pool,
        }
    }

    /// The cache key of a request, shaped by the rules that apply to it, if any.
    #[inline]
    fn key_of<B>(&self, req: &http::Request<B>) -> crate::cache::CacheKey {
        match Steer::of(self, req.extensions()) {
            Some(s) => s.key(req.uri(), req.headers()),
            None => crate::cache::key::cache_key(req),
        }
    }

    /// [`Inner::key_of`] a request's head.
    #[inline]
    fn key_of_parts(&self, parts: &http::request::Parts) -> crate::cache::CacheKey {
        match Steer::of(self, &parts.extensions) {
            Some(s) => s.key(&parts.uri, &parts.headers),
            None => crate::cache::key::cache_key_of(parts),
        }
    }

    /// Whether the rules send this request past the cache (`cache_bypass`, a split that does
    /// not cache).
    #[inline]
    fn bypassed(&self, ext: &http::Extensions) -> bool {
        Steer::of(self, ext).is_some_and(|s| s.bypass)
    }

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

    /// Stamps the cache-status header on a response not delivered from the store, and notes
    /// the result in its outcome.
    fn tag(&self, mut r: Response<Body>, status: CacheStatus) -> Response<Body> {
        r.headers_mut()
            .insert(self.status_header.clone(), status.header_value());
        r.body_mut().outcome_mut().set_cache(status.result());
        r
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
