//! Routing: which handler serves a request, by host and path prefix; and where a route's
//! phases run around its handler ([`crate::phases`]: ① request and ④ deliver in
//! [`Router::dispatch_route`], ⑤ log in [`Observed::finish`]); and who a request's client is
//! ([`Router::client`]: the listener's trusted proxies, [`crate::real_ip`]).
//!
//! Order (documented in docs/config.md): routes with an exact host first, then wildcard hosts
//! (`*.example.com`, longest suffix first), then routes for any host; within each group the
//! longest path prefix wins, and among equal prefixes the one configured first. Prefixes match
//! raw path bytes, as nginx's prefix locations do.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::body::RequestBody;
use http::{header, HeaderName, HeaderValue, Request, Response, StatusCode};

use crate::admin::Access;
use crate::body::Body;
use crate::cache::Cache;
use crate::config::{
    AdminConfig, HandlerConfig, HostPattern, ListenerConfig, RouteConfig, UpstreamRef,
};
use crate::fleet::Fleet;
use crate::http::text_response;
use crate::images::Images;
use crate::interim::Sink;
use crate::phases::{Cx, Guarded, Phases};
use crate::proxy::Proxy;
use crate::respond::{RedirectHttps, Respond};
use crate::static_files::StaticFiles;
use crate::upstream::{Pool, Pools};

/// What serves a route's requests. Handlers are shared with the futures serving requests
/// (cheap to clone: a reference count, or a few small fields).
#[derive(Clone)]
pub enum Handler {
    Proxy(Arc<Proxy>),
    Static(Arc<StaticFiles>),
    Respond(Respond),
    Images(Arc<Images>),
    Push(Arc<crate::push::Push>),
    Admin(Arc<crate::admin::Admin>),
    RedirectHttps(RedirectHttps),
}

/// A request being served: a response at hand, or the handler's future, boxed on its own so
/// that it holds only what that handler needs (hyper keeps it per connection).
pub enum Serving {
    Ready(Option<Response<Body>>),
    Pending(Pin<Box<dyn Future<Output = Response<Body>> + Send>>),
}

impl Future for Serving {
    type Output = Response<Body>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Response<Body>> {
        match self.get_mut() {
            Serving::Ready(r) => Poll::Ready(r.take().expect("Serving polled after completion")),
            Serving::Pending(f) => f.as_mut().poll(cx),
        }
    }
}

impl Handler {
    /// Builds a route's handler from its configuration; `admin` is who may run admin
    /// operations (PURGE, image uploads and deletes), the same for every route; `fleet` is the
    /// fleet's Redis the server opened (`[cache.shared]`), for images' and push's sharing. A
    /// proxy gets the route's `phases` for its upstream exchanges (② and ③).
    fn build(
        cfg: &HandlerConfig,
        prefix: &str,
        cache: &Arc<Cache>,
        fleet: Option<&Arc<Fleet>>,
        admin: &AdminConfig,
        pools: &Pools,
        phases: Option<Arc<Phases>>,
    ) -> Handler {
        match cfg {
            HandlerConfig::Proxy(p) => {
                let pool = match &p.upstream {
                    UpstreamRef::Pool(name) => Arc::clone(
                        pools
                            .get(name)
                            .expect("the configuration names only pools it has"),
                    ),
                    // A configuration built in code rather than parsed: its own pool.
                    UpstreamRef::Inline(backends) => {
                        Pool::new("upstream", &p.inline_pool(backends))
                            .expect("an inline pool reads no file")
                    }
                };
                Handler::Proxy(Arc::new(Proxy::new(
                    p.clone(),
                    pool,
                    Arc::clone(cache),
                    Access::purge(admin),
                    phases,
                )))
            }
            HandlerConfig::Static(s) => Handler::Static(Arc::new(StaticFiles::new(
                s.clone(),
                prefix,
                Arc::clone(cache),
            ))),
            HandlerConfig::Respond(r) => Handler::Respond(Respond::new(r)),
            HandlerConfig::RedirectHttps(r) => Handler::RedirectHttps(RedirectHttps::new(r)),
            HandlerConfig::Push(p) => Handler::Push(Arc::new(
                crate::push::Push::new(p, prefix, fleet)
                    .expect("push stores are opened (crate::push::open_all) before routers"),
            )),
            HandlerConfig::Images(i) => Handler::Images(Arc::new(Images::new(
                crate::config::ImagesConfig::clone(i),
                prefix,
                Arc::clone(cache),
                fleet.cloned(),
                admin.token.clone(),
                pools,
            ))),
        }
    }

    /// Starts serving `req`. The request moves straight into the handler's own future (an
    /// `async` layer per routing step would keep a copy of it each).
    fn serve(&self, req: Request<RequestBody>, peer: SocketAddr, sink: Option<Sink>) -> Serving {
        let fut: Pin<Box<dyn Future<Output = Response<Body>> + Send>> = match self {
            Handler::Respond(r) => return Serving::Ready(Some(r.handle(&req))),
            Handler::RedirectHttps(r) => {
                let host = strip_port(crate::inbound::authority(req.uri(), req.headers()));
                return Serving::Ready(Some(r.handle(host, req.uri())));
            }
            Handler::Static(s) => match s.fresh_hit(req) {
                Ok(hit) => return Serving::Ready(Some(hit)),
                Err(req) => Box::pin(Arc::clone(s).serve(req)),
            },
            // A fresh hit is answered here, without a future; everything else is boxed once.
            // Only a proxied request can meet an origin's 1xx responses.
            Handler::Proxy(p) => {
                let slow = match p.fresh_hit(req, peer) {
                    Ok(hit) => return Serving::Ready(Some(hit)),
                    Err(slow) => slow,
                };
                let slow = Proxy::clone(p).handle_slow(slow, peer);
                match sink {
                    Some(sink) => Box::pin(sink.scope(slow)),
                    None => Box::pin(slow),
                }
            }
            // A request whose cached result is known is answered here, as a fresh hit.
            Handler::Images(i) => match i.fresh_hit(req) {
                Ok(hit) => return Serving::Ready(Some(hit)),
                Err(req) => {
                    let i = Arc::clone(i);
                    Box::pin(async move { i.handle(req, peer).await })
                }
            },
            Handler::Push(p) => {
                let p = Arc::clone(p);
                Box::pin(async move { p.handle(req, peer, sink).await })
            }
            Handler::Admin(a) => {
                let a = Arc::clone(a);
                Box::pin(async move { a.handle(req).await })
            }
        };
        Serving::Pending(fut)
    }

    /// A one-line description for the startup log.
    pub fn describe(&self) -> String {
        match self {
            Handler::Proxy(p) => format!("proxy to {}", p.upstream()),
            Handler::Static(s) => format!("static files from {}", s.source()),
            Handler::Respond(_) => "fixed response".into(),
            Handler::Images(i) => format!("images in {}", i.source()),
            Handler::Push(p) => format!("push records in {}", p.source()),
            Handler::Admin(_) => "admin API (/_larder/status, /_larder/purge)".into(),
            Handler::RedirectHttps(r) => r.describe(),
        }
    }
}

struct Route {
    host: HostPattern,
    prefix: String,
    handler: Handler,
    /// The route's steps at each phase; None (most routes) costs one check per request.
    phases: Option<Arc<Phases>>,
    /// Fields added to every response: `Strict-Transport-Security` (TLS listeners only),
    /// `Alt-Svc` (listeners that also serve HTTP/3). Usually none.
    extra: Vec<(HeaderName, HeaderValue)>,
    /// The route's id in the server's metrics (its position among the router's routes when
    /// requests are not counted).
    metric: u32,
    /// `{listener} {host}{prefix}`, when requests are counted, logged or traced.
    label: String,
}

/// The routes of one listener, in match order.
pub struct Router {
    routes: Vec<Route>,
    /// Some route names a host: requests' hosts must be looked up.
    by_host: bool,
    /// Some route has phases: every request is observed, for ⑤ log.
    phased: bool,
    /// ACME HTTP-01 answers, served before routing (plain listeners, when an ACME listener
    /// validates by HTTP-01).
    http01: Option<Arc<crate::tls::acme::Http01>>,
    /// The server's metrics, when requests are counted: handed to whoever completes a
    /// request ([`Router::metrics`], [`Observed::finish`]).
    counted: Option<Arc<crate::metrics::Metrics>>,
    /// The server's access log, when requests are logged.
    logged: Option<Arc<crate::access_log::AccessLog>>,
    /// The server's span exporter, when requests are traced.
    traced: Option<Arc<crate::otel::Spans>>,
    /// The listener's trusted proxies (`[listener.real_ip]`): who the client is ([`Router::client`]).
    real_ip: Option<crate::real_ip::RealIp>,
    /// The listener's connections begin with a PROXY header (`proxy_protocol`).
    proxy_protocol: bool,
}

/// What is noted of a request at its start to count and log it when its response is ready
/// (the server's completion point calls [`Observed::finish`]).
pub struct Observed {
    /// [`crate::metrics::clock`] at the request's start.
    started: u64,
    /// The method class, when requests are counted.
    counted: Option<usize>,
    /// The access log and the request's part of the line (a logged request holds the log: its
    /// line is allocated anyway, and the thread that completes it need not find the log).
    logged: Option<(
        Arc<crate::access_log::AccessLog>,
        Box<crate::access_log::Entry>,
    )>,
    /// The request's span, when it is traced.
    traced: Option<Box<crate::otel::Traced>>,
    /// The route's phases, for ⑤ log (routes that have some).
    phases: Option<Arc<Phases>>,
    route: u32,
}

impl Observed {
    /// The route `dispatch_route` chose (and its label, for the log).
    #[inline]
    pub fn routed(&mut self, route: u32, router: &Router) {
        self.route = route;
        if self.logged.is_some() || self.traced.is_some() || router.phased {
            self.label(router);
        }
    }

    fn label(&mut self, router: &Router) {
        if let Some(r) = router.routes.iter().find(|r| r.metric == self.route) {
            self.phases.clone_from(&r.phases);
            if let Some((_, e)) = &mut self.logged {
                e.route.clone_from(&r.label);
            }
            if let Some(t) = &mut self.traced {
                t.routed(&r.prefix, &r.label);
            }
        }
    }

    /// Counts and logs the request now that `response` is ready, with the outcome its handler
    /// noted in it ([`crate::metrics::Outcome`]). `metrics` are the server's, which the router
    /// that observed the request holds ([`Router::metrics`]): the caller lends them (it has the
    /// router, or its connection kept them), so counting touches no reference count. A
    /// streamed body of unknown length is wrapped to count its bytes as they go.
    pub fn finish(
        self,
        response: &mut Response<Body>,
        metrics: Option<&Arc<crate::metrics::Metrics>>,
    ) {
        if let Some(p) = &self.phases {
            p.log(response);
        }
        let outcome = response.body().outcome();
        let cache = outcome.cache();
        let status = response.status().as_u16();
        let known = http_body::Body::size_hint(response.body()).exact();
        let nanos = crate::metrics::clock().saturating_sub(self.started);
        // The request's id, when a rule gave it one (④ left the context in the response).
        let request_id = match self.logged.is_some() || self.traced.is_some() {
            true => (response.extensions().get::<Arc<Cx>>()).and_then(|cx| cx.request_id.clone()),
            false => None,
        };
        let request_id = request_id.as_ref().and_then(|v| v.to_str().ok());
        if let Some(mut t) = self.traced {
            if let Some(id) = request_id {
                t.request_id(id);
            }
            let cache = crate::metrics::CACHE.get(cache).copied().unwrap_or("none");
            t.finish(status, cache, known);
        }
        if let (Some(method), Some(m)) = (self.counted, metrics) {
            let encoding = outcome.encoding().unwrap_or_else(|| {
                crate::metrics::encoding_class(response.headers().get(header::CONTENT_ENCODING))
            });
            let bytes = match known {
                Some(n) => n,
                None => {
                    let body = std::mem::replace(response.body_mut(), Body::empty());
                    *response.body_mut() = Body::stream(crate::metrics::CountedBody::new(
                        body,
                        Arc::clone(m),
                        self.route,
                        encoding,
                    ));
                    0
                }
            };
            let sent = crate::metrics::Sent {
                encoding,
                bytes,
                saved: outcome.saved(),
            };
            crate::metrics::record(m, self.route, method, status, cache, nanos, sent);
        }
        if let Some((log, mut e)) = self.logged {
            e.status = status;
            e.cache = cache;
            e.no_store = (outcome.no_store())
                .and_then(crate::cache::policy::NoStoreReason::from_code)
                .map(crate::cache::policy::NoStoreReason::as_str);
            e.duration = std::time::Duration::from_nanos(nanos);
            if self.phases.is_some() {
                let cx = response.extensions().get::<Arc<Cx>>();
                e.cache_rule = cx.and_then(|cx| cx.note("cache_rule")).map(Box::from);
                e.user = cx.and_then(|cx| cx.note("user")).map(str::to_string);
            }
            e.request_id = request_id.map(str::to_string);
            e.upstream = response
                .extensions()
                .get::<crate::http::fetch::Upstreamed>()
                .cloned();
            e.image = (response.extensions())
                .get::<crate::access_log::ImageServed>()
                .cloned();
            e.bytes = (response.headers().get(header::CONTENT_LENGTH))
                .and_then(|v| v.to_str().ok()?.parse().ok());
            log.log(*e);
        }
    }
}

/// A listener's current router, replaced whole by a reload. A request keeps the router it
/// started with.
pub type LiveRouter = Arc<Live>;

/// A listener's current router and a count of its replacements, so that a connection keeps a
/// copy ([`RouterCache`]) and checks one counter per request.
pub struct Live {
    current: arc_swap::ArcSwap<Router>,
    generation: std::sync::atomic::AtomicU64,
}

impl Live {
    pub fn new(router: Arc<Router>) -> LiveRouter {
        Arc::new(Live {
            current: arc_swap::ArcSwap::new(router),
            generation: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Replaces the router: requests from now on get the new one.
    pub fn store(&self, router: Arc<Router>) {
        self.current.store(router);
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::Release);
    }

    /// The router in force now.
    pub fn load_full(&self) -> Arc<Router> {
        self.current.load_full()
    }

    /// Whether connections accepted now begin with a PROXY header (the router in force says).
    pub fn proxy_protocol(&self) -> bool {
        self.current.load().proxy_protocol
    }
}

/// A connection's copy of its listener's router: one atomic load per request sees whether a
/// reload replaced it (then the copy is refreshed).
pub struct RouterCache {
    live: LiveRouter,
    seen: std::cell::Cell<u64>,
    router: std::cell::RefCell<Arc<Router>>,
}

impl RouterCache {
    pub fn new(live: LiveRouter) -> RouterCache {
        let seen = live.generation.load(std::sync::atomic::Ordering::Acquire);
        let router = live.load_full();
        RouterCache {
            live,
            seen: std::cell::Cell::new(seen),
            router: std::cell::RefCell::new(router),
        }
    }

    /// The router in force for a request starting now.
    pub fn current(&self) -> std::cell::Ref<'_, Arc<Router>> {
        let now = self
            .live
            .generation
            .load(std::sync::atomic::Ordering::Acquire);
        if now != self.seen.get() {
            *self.router.borrow_mut() = self.live.load_full();
            self.seen.set(now);
        }
        self.router.borrow()
    }
}

impl Router {
    /// The router of `listener`, its handlers built with the shared `cache`, the `fleet` (if
    /// `[cache.shared]` opened one), `[admin]` and the running `pools`, without its routes'
    /// rules (the server builds routers with [`Router::with_steps`] and `rules::compile`).
    pub fn new(
        listener: &ListenerConfig,
        admin: &AdminConfig,
        cache: &Arc<Cache>,
        fleet: Option<&Arc<Fleet>>,
        pools: &Pools,
    ) -> Router {
        Router::with_steps(listener, admin, cache, fleet, pools, |_| Vec::new())
    }

    /// [`Router::new`], each route given the `steps` compiled for it, in the order they run.
    pub fn with_steps(
        listener: &ListenerConfig,
        admin: &AdminConfig,
        cache: &Arc<Cache>,
        fleet: Option<&Arc<Fleet>>,
        pools: &Pools,
        steps: impl Fn(&RouteConfig) -> Vec<Guarded>,
    ) -> Router {
        let mut routes: Vec<Route> = listener
            .routes
            .iter()
            .map(|r| {
                let phases = Phases::of(steps(r));
                Route {
                    host: r.host.clone().unwrap_or(HostPattern::Any),
                    prefix: r.path.0.clone(),
                    handler: Handler::build(
                        &r.handler,
                        &r.path.0,
                        cache,
                        fleet,
                        admin,
                        pools,
                        phases.clone(),
                    ),
                    phases,
                    extra: (r.hsts.as_ref())
                        .filter(|_| listener.tls.is_some())
                        .map(|v| (header::STRICT_TRANSPORT_SECURITY, v.0.clone()))
                        .into_iter()
                        .collect(),
                    metric: 0,
                    label: String::new(),
                }
            })
            .collect();
        // Stable sort keeps configuration order among equals.
        routes.sort_by_key(|r| {
            let host_rank = match &r.host {
                HostPattern::Exact(_) => (0, 0),
                HostPattern::Suffix(s) => (1, usize::MAX - s.len()),
                HostPattern::Any => (2, 0),
            };
            (host_rank, usize::MAX - r.prefix.len())
        });
        // Until metrics number them (`observe_into`): their positions, so that a request's
        // route is found again at its completion (⑤ log).
        for (i, r) in routes.iter_mut().enumerate() {
            r.metric = i as u32;
        }
        let by_host = routes.iter().any(|r| !matches!(r.host, HostPattern::Any));
        let phased = routes.iter().any(|r| r.phases.is_some());
        Router {
            routes,
            by_host,
            phased,
            http01: None,
            counted: None,
            logged: None,
            traced: None,
            real_ip: listener.real_ip.as_ref().map(crate::real_ip::RealIp::new),
            proxy_protocol: listener.proxy_protocol,
        }
    }

    /// The admin listener's router: every request goes to the admin API.
    pub fn admin(admin: crate::admin::Admin) -> Router {
        Router {
            routes: vec![Route {
                host: HostPattern::Any,
                prefix: "/".into(),
                handler: Handler::Admin(Arc::new(admin)),
                phases: None,
                extra: Vec::new(),
                metric: 0,
                label: String::new(),
            }],
            by_host: false,
            phased: false,
            http01: None,
            counted: None,
            logged: None,
            traced: None,
            real_ip: None,
            proxy_protocol: false,
        }
    }

    /// Counts this router's requests in `metrics` and/or logs them in `log`, each route
    /// labelled `{listener} {host}{prefix}`.
    pub fn observe_into(
        &mut self,
        metrics: Option<&Arc<crate::metrics::Metrics>>,
        log: Option<&Arc<crate::access_log::AccessLog>>,
        spans: Option<&Arc<crate::otel::Spans>>,
        listener: &str,
    ) {
        for (i, r) in self.routes.iter_mut().enumerate() {
            let host = match &r.host {
                HostPattern::Any => "*".to_string(),
                HostPattern::Exact(h) => h.clone(),
                HostPattern::Suffix(s) => format!("*{s}"),
            };
            let label = format!("{listener} {host}{}", r.prefix);
            r.metric = match metrics {
                Some(m) => m.route(label.clone()),
                None => i as u32,
            };
            if let Handler::Images(images) = &r.handler {
                if let Some(m) = metrics {
                    images.count_into(m);
                }
                if log.is_some() {
                    images.log_into();
                }
            }
            r.label = label;
        }
        self.counted = metrics.cloned();
        self.logged = log.cloned();
        self.traced = spans.cloned();
    }

    /// The client of `req`, which came from `peer` (the socket's, or its PROXY header's source):
    /// `peer` itself, or on a listener with `[listener.real_ip]` the address its trusted proxies
    /// name ([`crate::real_ip`]). What [`Router::observe`] and [`Router::dispatch`] get.
    #[inline]
    pub fn client<B>(&self, req: &mut Request<B>, peer: SocketAddr) -> SocketAddr {
        match &self.real_ip {
            Some(r) => r.client(req, peer),
            None => peer,
        }
    }

    /// Whether the listener's connections begin with a PROXY header.
    pub fn proxy_protocol(&self) -> bool {
        self.proxy_protocol
    }

    /// At a request's start: what its completion will count and log (None: neither is on).
    #[inline]
    pub fn observe<B>(&self, req: &mut Request<B>, peer: SocketAddr) -> Option<Observed> {
        if self.counted.is_none() && self.logged.is_none() && self.traced.is_none() && !self.phased
        {
            return None;
        }
        let logged = (self.logged.as_ref()).filter(|log| log.wants()).map(|log| {
            let e = crate::access_log::Entry::request(
                peer,
                req.method(),
                req.uri(),
                req.version(),
                req.headers(),
            );
            (Arc::clone(log), Box::new(e))
        });
        let traced = (self.traced.as_ref()).and_then(|spans| spans.begin(req, peer));
        Some(Observed {
            traced,
            started: crate::metrics::clock(),
            counted: (self.counted.as_ref()).map(|_| crate::metrics::method_class(req.method())),
            logged,
            phases: None,
            route: UNROUTED,
        })
    }

    /// The server's metrics, when this router's requests are counted: what the completion of
    /// a request it observed counts into ([`Observed::finish`]).
    #[inline]
    pub fn metrics(&self) -> Option<&Arc<crate::metrics::Metrics>> {
        self.counted.as_ref()
    }

    /// Answers ACME HTTP-01 challenges from `tokens` before routing.
    pub fn answer_http01(&mut self, tokens: Arc<crate::tls::acme::Http01>) {
        self.http01 = Some(tokens);
    }

    /// Adds `Alt-Svc: value` to every route's responses (the listener also serves HTTP/3).
    pub fn advertise(&mut self, alt_svc: HeaderValue) {
        for r in &mut self.routes {
            r.extra.push((header::ALT_SVC, alt_svc.clone()));
        }
    }

    /// Whether HTTP/2 connections to this listener accept WebSocket (RFC 8441): it has a push
    /// route, and no proxy route. Advertising it makes browsers send every WebSocket to the
    /// listener over HTTP/2, and the proxy passes WebSockets through on HTTP/1.1 only; without
    /// it they open an HTTP/1.1 connection for them.
    pub fn websocket_over_h2(&self) -> bool {
        let any = |f: fn(&Handler) -> bool| self.routes.iter().any(|r| f(&r.handler));
        any(|h| matches!(h, Handler::Push(_))) && !any(|h| matches!(h, Handler::Proxy(_)))
    }

    /// The handler for a host (without port, any case) and path, if a route matches.
    pub fn find(&self, host: &str, path: &str) -> Option<&Handler> {
        self.route(host, path).map(|r| &r.handler)
    }

    fn route(&self, host: &str, path: &str) -> Option<&Route> {
        self.routes
            .iter()
            .find(|r| r.host.matches(host) && path.starts_with(r.prefix.as_str()))
    }

    /// Routes as (host, prefix, handler description), in match order.
    pub fn describe(&self) -> Vec<(String, String, String)> {
        self.routes
            .iter()
            .map(|r| {
                let host = match &r.host {
                    HostPattern::Any => "*".to_string(),
                    HostPattern::Exact(h) => h.clone(),
                    HostPattern::Suffix(s) => format!("*{s}"),
                };
                (host, r.prefix.clone(), r.handler.describe())
            })
            .collect()
    }

    /// Routes one request; the returned future serves it. `sink` is where an origin's 1xx
    /// responses go (HTTP/1.1 clients).
    pub fn dispatch(
        &self,
        req: Request<RequestBody>,
        peer: SocketAddr,
        sink: Option<Sink>,
    ) -> Serving {
        self.dispatch_route(req, peer, sink).0
    }

    /// [`Router::dispatch`], and the metrics id of the route that serves (0: none matched).
    pub fn dispatch_route(
        &self,
        req: Request<RequestBody>,
        peer: SocketAddr,
        sink: Option<Sink>,
    ) -> (Serving, u32) {
        if let Some(tokens) = &self.http01 {
            if let Some(answer) = tokens.answer(req.uri().path()) {
                let mut r = Response::new(Body::full(answer));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/octet-stream"),
                );
                return (Serving::Ready(Some(r)), UNROUTED);
            }
        }
        let host = if self.by_host {
            strip_port(crate::inbound::authority(req.uri(), req.headers()))
        } else {
            ""
        };
        match self.route(host, req.uri().path()) {
            Some(Route {
                handler,
                phases: None,
                extra,
                metric,
                ..
            }) if extra.is_empty() => (handler.serve(req, peer, sink), *metric),
            Some(Route {
                handler,
                phases,
                extra,
                metric,
                ..
            }) => {
                let serving = match phases {
                    Some(phases) => {
                        // The request's context stays in the response for ⑤ and the log.
                        let keep = self.logged.is_some() || self.traced.is_some() || phases.logs();
                        phased(phases, handler, req, peer, sink, keep)
                    }
                    None => handler.serve(req, peer, sink),
                };
                let serving = match extra.is_empty() {
                    true => serving,
                    false => with_fields(serving, extra.clone()),
                };
                (serving, *metric)
            }
            None => (
                Serving::Ready(Some(text_response(
                    StatusCode::NOT_FOUND,
                    "no route for this request\n",
                ))),
                UNROUTED,
            ),
        }
    }
}

/// The metrics route id of a request no route serves (not counted).
pub const UNROUTED: u32 = u32::MAX;

/// A request on a route with phases: ① before the handler (an answer there is the
/// response; a step that waits makes the rest of ① and the handler one future), ④ on the
/// response, which then carries the request's context for ⑤.
fn phased(
    phases: &Arc<Phases>,
    handler: &Handler,
    req: Request<RequestBody>,
    peer: SocketAddr,
    sink: Option<Sink>,
    keep: bool,
) -> Serving {
    let (req, cx, decided) = match phases.request(req, Cx::new(peer)) {
        Ok(done) => done,
        Err(deciding) => {
            let (phases, handler) = (Arc::clone(phases), handler.clone());
            return Serving::Pending(Box::pin(async move {
                let (req, cx, decided) = deciding.await;
                let (serving, cx) = decide(&handler, req, cx, decided, peer, sink);
                finish(&phases, serving.await, &cx, keep)
            }));
        }
    };
    let (serving, cx) = decide(handler, req, cx, decided, peer, sink);
    match serving {
        Serving::Ready(Some(r)) => Serving::Ready(Some(finish(phases, r, &cx, keep))),
        Serving::Ready(None) => Serving::Ready(None),
        Serving::Pending(f) => {
            let phases = Arc::clone(phases);
            Serving::Pending(Box::pin(async move { finish(&phases, f.await, &cx, keep) }))
        }
    }
}

/// After ①: the handler serves the request (which carries its context), or ①'s answer is
/// the response.
fn decide(
    handler: &Handler,
    mut req: Request<RequestBody>,
    cx: Cx,
    decided: crate::phases::Decided,
    peer: SocketAddr,
    sink: Option<Sink>,
) -> (Serving, Arc<Cx>) {
    let cx = Arc::new(cx);
    match decided {
        Err(answer) => (Serving::Ready(Some(answer)), cx),
        Ok(()) => {
            req.extensions_mut().insert(Arc::clone(&cx));
            (handler.serve(req, peer, sink), cx)
        }
    }
}

/// ④, and (`keep`) the context left in the response for ⑤ and the access log.
fn finish(phases: &Phases, mut r: Response<Body>, cx: &Arc<Cx>, keep: bool) -> Response<Body> {
    phases.deliver(&mut r, cx);
    if keep {
        r.extensions_mut().insert(Arc::clone(cx));
    }
    r
}

/// `serving`'s response with the `fields` added.
fn with_fields(serving: Serving, fields: Vec<(HeaderName, HeaderValue)>) -> Serving {
    let add = move |r: &mut Response<Body>| {
        for (k, v) in fields {
            r.headers_mut().insert(k, v);
        }
    };
    match serving {
        Serving::Ready(Some(mut r)) => {
            add(&mut r);
            Serving::Ready(Some(r))
        }
        Serving::Ready(None) => Serving::Ready(None),
        Serving::Pending(f) => Serving::Pending(Box::pin(async move {
            let mut r = f.await;
            add(&mut r);
            r
        })),
    }
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host
            .split(']')
            .next()
            .map_or(host, |h| &host[..h.len() + 1]);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn order_is_exact_then_wildcard_then_any_longest_prefix_first() {
        let cfg = Config::parse(
            r#"
[[listener]]
addr = "127.0.0.1:1"
  [[listener.route]]
  path = "/"
  respond = { body = "any-root" }
  [[listener.route]]
  path = "/api/"
  respond = { body = "any-api" }
  [[listener.route]]
  host = "*.example.com"
  respond = { body = "wild" }
  [[listener.route]]
  host = "www.example.com"
  path = "/static/"
  respond = { body = "exact-static" }
"#,
            "t",
        )
        .unwrap();
        let cache = Cache::new(cfg.cache.clone(), cfg.compression.clone());
        let r = Router::new(
            &cfg.listeners[0],
            &cfg.admin,
            &cache,
            None,
            &Pools::default(),
        );
        let body = |host: &str, path: &str| match r.find(host, path) {
            Some(Handler::Respond(x)) => x.body_text(),
            _ => "none".into(),
        };
        assert_eq!(body("www.example.com", "/static/a"), "exact-static");
        assert_eq!(body("WWW.example.com", "/other"), "wild");
        assert_eq!(body("a.b.example.com", "/api/x"), "wild");
        assert_eq!(body("example.com", "/api/x"), "any-api");
        assert_eq!(body("other", "/x"), "any-root");
    }

    /// `[admin]` goes to the handlers where they are built, from a file or from a
    /// configuration built in code (the command line's quick starts) alike.
    #[tokio::test]
    async fn handlers_get_the_admin_token_where_they_are_built() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "[admin]\ntoken = \"s3cret\"\n[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\npath = \"/img/\"\nimages = {{ dir = {:?} }}\n",
            dir.path().display().to_string()
        );
        let parsed = Config::parse(&text, "t").unwrap();
        let mut built = Config::single_route(
            "127.0.0.1:1".parse().unwrap(),
            parsed.listeners[0].routes[0].handler.clone(),
        );
        built.admin.token = Some("s3cret".into());
        for c in [parsed, built] {
            let cache = Cache::new(c.cache.clone(), c.compression.clone());
            let r = Router::new(&c.listeners[0], &c.admin, &cache, None, &Pools::default());
            let Some(Handler::Images(i)) = r.find("", "/img/x") else {
                panic!("images route")
            };
            assert_eq!(i.admin_token(), Some("s3cret"));
        }
    }

    /// The fleet goes to push and images where their handlers are built, as the server hands it
    /// in, not through the cache: a cache in memory only (no shared tier of its own) and a fleet
    /// handed to the router give a push route with `share` its replicated log.
    #[tokio::test]
    async fn handlers_get_the_fleet_where_they_are_built() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "[cache.shared]\nurl = \"redis://127.0.0.1:1\"\n[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\npath = \"/live/\"\npush = {{ dir = {:?}, share = true }}\n",
            dir.path().display().to_string()
        );
        let c = Config::parse(&text, "t").unwrap();
        let _stores = crate::push::open_all(&c).unwrap();
        // Not connected (nothing listens there): it connects in the background.
        let fleet = Arc::new(Fleet::connect(c.cache.shared.as_ref().unwrap()).unwrap());
        let cache = Cache::new(c.cache.clone(), c.compression.clone());
        let r = Router::new(
            &c.listeners[0],
            &c.admin,
            &cache,
            Some(&fleet),
            &Pools::default(),
        );
        assert!(matches!(r.find("", "/live/x"), Some(Handler::Push(_))));
    }

    /// Without rules a route holds no phases and the router observes nothing for them: a hit
    /// pays one `Option` check, not a step per kind of rule.
    #[test]
    fn routes_without_steps_hold_no_phases() {
        let cfg = Config::parse(
            "[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\nrespond = { body = \"x\" }\n",
            "t",
        )
        .unwrap();
        let cache = Cache::new(cfg.cache.clone(), cfg.compression.clone());
        let r = Router::new(
            &cfg.listeners[0],
            &cfg.admin,
            &cache,
            None,
            &Pools::default(),
        );
        assert!(r.routes.iter().all(|r| r.phases.is_none()));
        assert!(!r.phased);
        let mut req = Request::new(());
        assert!(r
            .observe(&mut req, "127.0.0.1:1".parse().unwrap())
            .is_none());
    }

    #[test]
    fn ports_are_stripped() {
        assert_eq!(strip_port("example.com:8080"), "example.com");
        assert_eq!(strip_port("[::1]:80"), "[::1]");
        assert_eq!(strip_port("example.com"), "example.com");
    }
}
