//! Administration: who may run admin operations ([`Access`]: a bearer token, or an address in an
//! allow list), the `PURGE` method on proxy routes, and the admin API served on its own listener
//! (`[admin] listen`, loopback by default in examples):
//!
//! - `GET /_larder/status`: cache size and counts, as JSON;
//! - `GET /_larder/entries?prefix=`: the URLs stored under a prefix, their variants' sizes,
//!   ages, TTLs and tags;
//! - `GET /_larder/config`: the running configuration, secrets redacted;
//! - `GET /metrics`: every metric in the OpenMetrics text format ([`crate::metrics`]);
//! - `POST /_larder/purge?url=http://host/path`: every variant of one URL;
//! - `POST /_larder/purge?prefix=http://host/path/`: every URL under a prefix;
//! - `POST /_larder/purge?tag=T`: every response tagged T by the tag header (`Surrogate-Key`);
//! - `GET /_larder/switches`, `PUT` / `DELETE /_larder/switches/NAME`: the named switches rules
//!   answer by (a maintenance page: `respond = { ..., switch = "maintenance" }`), on or off,
//!   held in the server's [`Switches`] across reloads.
//!
//! Purges by prefix or tag scan the store on a blocking thread, one shard lock at a time, so
//! requests keep being served while they run.

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};

use crate::body::Body;
use crate::cache::{Cache, CacheKey, Purge};
use crate::config::{AdminConfig, Cidr};
use crate::http::json_response;
use crate::http::query::Query;

/// Who may run administrative operations.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// `Authorization: Bearer <token>` grants access.
    pub token: Option<String>,
    /// Requests from these addresses need no token (PURGE only).
    pub allow: Vec<Cidr>,
}

impl Access {
    /// Who may PURGE on a proxy route: the `[admin]` token, or an address in `purge_allow`.
    pub fn purge(admin: &AdminConfig) -> Access {
        Access {
            token: admin.token.clone(),
            allow: admin.purge_allow.clone(),
        }
    }

    /// Whether the request carries the configured bearer token.
    pub fn bearer_ok(&self, headers: &HeaderMap) -> bool {
        self.token
            .as_deref()
            .is_some_and(|token| bearer_matches(headers, token))
    }

    /// Token, or an allowed peer address.
    pub fn permits(&self, headers: &HeaderMap, peer: SocketAddr) -> bool {
        self.bearer_ok(headers) || self.allow.iter().any(|c| c.contains(peer.ip()))
    }
}

/// The token of `Authorization: Bearer <token>`, if the request has one. The scheme's name is
/// case-insensitive (RFC 9110 §11.1: `bearer`, `BEARER` are Bearer too); one or more spaces
/// follow it.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim_start().split_once([' ', '\t'])?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Whether `Authorization: Bearer <token>` carries `token` (compared in constant time, by
/// the `subtle` crate: how long the comparison takes says nothing of how much of it matched).
pub fn bearer_matches(headers: &HeaderMap, token: &str) -> bool {
    use subtle::ConstantTimeEq;
    bearer_token(headers).is_some_and(|given| bool::from(given.as_bytes().ct_eq(token.as_bytes())))
}

fn refused() -> Response<Body> {
    let mut r = json_response(
        StatusCode::UNAUTHORIZED,
        "{\"error\":\"admin token required\"}".into(),
    );
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// The `PURGE` method on a proxy route: removes every variant of the request's URL.
pub fn purge_method(
    cache: &Cache,
    access: &Access,
    key: &CacheKey,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Response<Body> {
    if !access.permits(headers, peer) {
        return json_response(
            StatusCode::FORBIDDEN,
            "{\"error\":\"purge not allowed\"}".into(),
        );
    }
    // A URL purge scans nothing: fine on a worker. With tiers below, it reaches them (and the
    // other nodes) whether or not this node's memory held the URL.
    let n = cache.purge(&Purge::Url(key.clone()));
    let status = if n == 0 && !cache.has_tiers() {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::OK
    };
    json_response(status, format!("{{\"purged\":{n}}}"))
}

/// The server's named switches (`respond = { ..., switch = NAME }` in rules): one flag each,
/// made when a rule or the admin API first names it and kept for the life of the server, so a
/// reload keeps whether each is on. A rule holds its flag: reading it costs one atomic load.
#[derive(Default)]
pub struct Switches {
    flags: std::sync::Mutex<std::collections::BTreeMap<String, Arc<std::sync::atomic::AtomicBool>>>,
}

/// At most this many switches (names come from the admin API's callers too).
pub const MAX_SWITCHES: usize = 1024;

impl Switches {
    /// The flag of switch `name`, made (off) if new; None past [`MAX_SWITCHES`].
    pub fn flag(&self, name: &str) -> Option<Arc<std::sync::atomic::AtomicBool>> {
        let mut flags = self.flags.lock().expect("not poisoned");
        if let Some(f) = flags.get(name) {
            return Some(Arc::clone(f));
        }
        if flags.len() >= MAX_SWITCHES {
            return None;
        }
        let f = Arc::new(std::sync::atomic::AtomicBool::new(false));
        flags.insert(name.to_string(), Arc::clone(&f));
        Some(f)
    }

    /// Every switch and whether it is on, by name.
    pub fn list(&self) -> serde_json::Value {
        let flags = self.flags.lock().expect("not poisoned");
        (flags.iter())
            .map(|(k, v)| {
                let on = v.load(std::sync::atomic::Ordering::Relaxed);
                (k.clone(), serde_json::Value::Bool(on))
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    /// `/_larder/switches[/NAME]`: GET lists them, PUT turns one on, DELETE off.
    fn handle(&self, method: &Method, name: Option<&str>) -> Response<Body> {
        let Some(name) = name else {
            return match *method {
                Method::GET => json_response(StatusCode::OK, self.list().to_string()),
                _ => json_response(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{\"error\":\"GET the list; PUT or DELETE /_larder/switches/NAME\"}".into(),
                ),
            };
        };
        if !crate::config::SwitchName::valid(name) {
            return json_response(
                StatusCode::BAD_REQUEST,
                "{\"error\":\"a switch name is letters, digits, -, _ or ., at most 64\"}".into(),
            );
        }
        let on = match *method {
            Method::PUT => true,
            Method::DELETE => false,
            Method::GET => {
                let flags = self.flags.lock().expect("not poisoned");
                return match flags.get(name) {
                    Some(f) => json_response(
                        StatusCode::OK,
                        serde_json::json!({ "switch": name, "on": f.load(std::sync::atomic::Ordering::Relaxed) })
                            .to_string(),
                    ),
                    None => json_response(
                        StatusCode::NOT_FOUND,
                        "{\"error\":\"no such switch\"}".into(),
                    ),
                };
            }
            _ => {
                return json_response(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{\"error\":\"PUT turns a switch on, DELETE off\"}".into(),
                )
            }
        };
        match self.flag(name) {
            Some(f) => {
                let was = f.swap(on, std::sync::atomic::Ordering::Relaxed);
                if was != on {
                    tracing::info!(switch = name, on, "switch turned");
                }
                json_response(
                    StatusCode::OK,
                    serde_json::json!({ "switch": name, "on": on }).to_string(),
                )
            }
            None => json_response(
                StatusCode::INSUFFICIENT_STORAGE,
                format!("{{\"error\":\"at most {MAX_SWITCHES} switches\"}}"),
            ),
        }
    }
}

/// The dashboard: one page, its script and style inline, no CDN (assets/dashboard.html).
const DASHBOARD: &str = include_str!("../assets/dashboard.html");

/// The admin API handler.
pub struct Admin {
    cache: Arc<Cache>,
    access: Access,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// The server's part of the status (connections, TLS, ACME), from the server.
    info: Option<ServerInfo>,
    /// The running configuration's text (it changes with each reload).
    config: Option<ConfigText>,
    /// Reloads the configuration (`POST /_larder/reload`).
    reload: Option<ReloadFn>,
    /// Drains and undrains backends (`POST /_larder/drain`, `/_larder/undrain`).
    drain: Option<DrainFn>,
    /// The server's switches (`/_larder/switches`).
    switches: Option<Arc<Switches>>,
}

/// What the server adds to `/_larder/status`.
pub type ServerInfo = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// The running configuration's text.
pub type ConfigText = Arc<dyn Fn() -> Arc<str> + Send + Sync>;

/// Drains (true) or undrains a backend: (pool, backend URL, drain) → why not.
pub type DrainFn = Arc<dyn Fn(&str, &str, bool) -> Result<(), String> + Send + Sync>;

/// Reloads the configuration from its file: what needs a restart to apply, or why the new
/// file was refused (the running configuration then stays).
pub type ReloadFn = Arc<
    dyn Fn() -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<Vec<String>, String>> + Send>,
        > + Send
        + Sync,
>;

impl Admin {
    pub fn new(
        cache: Arc<Cache>,
        token: Option<String>,
        metrics: Option<Arc<crate::metrics::Metrics>>,
    ) -> Admin {
        Admin {
            cache,
            metrics,
            info: None,
            config: None,
            reload: None,
            drain: None,
            switches: None,
            access: Access {
                token,
                allow: Vec::new(),
            },
        }
    }

    /// Adds the server's part of the status and the running configuration (its text).
    pub fn with_server(mut self, info: ServerInfo, config_text: ConfigText) -> Admin {
        self.info = Some(info);
        self.config = Some(config_text);
        self
    }

    /// Adds `POST /_larder/drain` and `/_larder/undrain`.
    pub fn with_drain(mut self, drain: DrainFn) -> Admin {
        self.drain = Some(drain);
        self
    }

    /// Adds `/_larder/switches`.
    pub fn with_switches(mut self, switches: Arc<Switches>) -> Admin {
        self.switches = Some(switches);
        self
    }

    /// Adds `POST /_larder/reload`.
    pub fn with_reload(mut self, reload: ReloadFn) -> Admin {
        self.reload = Some(reload);
        self
    }

    pub async fn handle<B>(&self, req: Request<B>) -> Response<Body> {
        // The dashboard's page holds no data: it asks for the token, then the API.
        if req.method() == Method::GET && matches!(req.uri().path(), "/" | "/_larder/dashboard") {
            // Never in a frame (another site's page would overlay it, clickjacking):
            // `frame-ancestors 'none'`, and X-Frame-Options for browsers without CSP 2.
            let mut page = crate::http::page_response(
                DASHBOARD,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
            );
            (page.headers_mut()).insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
            return page;
        }
        if !self.access.bearer_ok(req.headers()) {
            return refused();
        }
        let path = req.uri().path();
        match (req.method(), path) {
            (&Method::GET, "/_larder/events") => self.events(),
            (&Method::GET, "/_larder/status") => self.status(),
            (&Method::GET, "/_larder/entries") => {
                // A scan of every shard: off the async workers, as purges by prefix are.
                let (cache, query) = (
                    Arc::clone(&self.cache),
                    req.uri().query().unwrap_or("").to_string(),
                );
                tokio::task::spawn_blocking(move || entries(&cache, &query))
                    .await
                    .unwrap_or_else(|_| {
                        json_response(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "{\"error\":\"listing failed\"}".into(),
                        )
                    })
            }
            (&Method::POST, "/_larder/drain" | "/_larder/undrain") => {
                let query = Query::parse(req.uri().query(), false);
                let drain = path == "/_larder/drain";
                match (&self.drain, query.get("pool"), query.get("backend")) {
                    (None, _, _) => json_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "{\"error\":\"no pools\"}".into(),
                    ),
                    (Some(f), Some(pool), Some(backend)) => match f(pool, backend, drain) {
                        Ok(()) => json_response(
                            StatusCode::OK,
                            serde_json::json!({ "pool": pool, "backend": backend, "drained": drain })
                                .to_string(),
                        ),
                        Err(e) => json_response(
                            StatusCode::NOT_FOUND,
                            serde_json::json!({ "error": e }).to_string(),
                        ),
                    },
                    _ => json_response(
                        StatusCode::BAD_REQUEST,
                        "{\"error\":\"needs pool=NAME and backend=URL\"}".into(),
                    ),
                }
            }
            (&Method::POST, "/_larder/reload") => match &self.reload {
                Some(reload) => match reload().await {
                    Ok(warnings) => json_response(
                        StatusCode::OK,
                        serde_json::json!({ "reloaded": true, "needs_restart": warnings })
                            .to_string(),
                    ),
                    Err(e) => json_response(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        serde_json::json!({ "reloaded": false, "error": e }).to_string(),
                    ),
                },
                None => json_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "{\"error\":\"this larder runs without a configuration file to reload\"}"
                        .into(),
                ),
            },
            (&Method::GET, "/_larder/top") => {
                let limit = (Query::parse(req.uri().query(), false).get("limit"))
                    .and_then(|l| l.parse().ok())
                    .unwrap_or(10usize)
                    .min(1000);
                let cache = Arc::clone(&self.cache);
                let top = tokio::task::spawn_blocking(move || cache.top(limit))
                    .await
                    .unwrap_or_default();
                let v: Vec<serde_json::Value> = (top.into_iter())
                    .map(|(k, hits, bytes)| {
                        serde_json::json!({ "key": k.as_str(), "hits": hits, "bytes": bytes })
                    })
                    .collect();
                json_response(StatusCode::OK, serde_json::Value::from(v).to_string())
            }
            (&Method::GET, "/_larder/config") => {
                let text = self
                    .config
                    .as_ref()
                    .map(|c| redact(&c()))
                    .unwrap_or_default();
                let mut r = Response::new(Body::full(text));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/toml; charset=utf-8"),
                );
                r
            }
            (&Method::GET, "/metrics") if self.metrics.is_some() => {
                let text = self
                    .metrics
                    .as_ref()
                    .map(|m| m.render())
                    .unwrap_or_default();
                let mut r = Response::new(Body::full(text));
                r.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static(
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    ),
                );
                r
            }
            (m, p) if p == "/_larder/switches" || p.starts_with("/_larder/switches/") => {
                match &self.switches {
                    Some(sw) => sw.handle(m, p.strip_prefix("/_larder/switches/")),
                    None => json_response(
                        StatusCode::NOT_FOUND,
                        "{\"error\":\"no switches here\"}".into(),
                    ),
                }
            }
            (m, "/_larder/purge") if m == Method::POST || m.as_str() == "PURGE" => {
                self.purge(req.uri().query().unwrap_or("")).await
            }
            (_, "/_larder/status" | "/_larder/purge") => json_response(
                StatusCode::METHOD_NOT_ALLOWED,
                "{\"error\":\"method not allowed\"}".into(),
            ),
            _ => json_response(
                StatusCode::NOT_FOUND,
                "{\"error\":\"no such admin endpoint\"}".into(),
            ),
        }
    }

    fn status(&self) -> Response<Body> {
        json_response(StatusCode::OK, self.status_value().to_string())
    }

    /// `/_larder/events`: the status, as Server-Sent Events, every second until the client
    /// goes (the dashboard's live view).
    fn events(&self) -> Response<Body> {
        let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(2);
        let source = StatusSource {
            cache: Arc::clone(&self.cache),
            metrics: self.metrics.clone(),
            info: self.info.clone(),
        };
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
            loop {
                tick.tick().await;
                let event = format!("data: {}\n\n", source.value());
                if tx.send(event.into()).await.is_err() {
                    return;
                }
            }
        });
        let mut r = Response::new(Body::stream(Events(rx)));
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        r
    }

    fn status_value(&self) -> serde_json::Value {
        StatusSource {
            cache: Arc::clone(&self.cache),
            metrics: self.metrics.clone(),
            info: self.info.clone(),
        }
        .value()
    }
}

/// What the status is made of, owned (the event stream outlives the request).
struct StatusSource {
    cache: Arc<Cache>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    info: Option<ServerInfo>,
}

/// An event stream's body: the events the producing task sends.
struct Events(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl http_body::Body for Events {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|e| e.map(|b| Ok(http_body::Frame::data(b))))
    }
}

impl StatusSource {
    fn value(&self) -> serde_json::Value {
        let c = &self.cache;
        let mut v = serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "cache": {
                "urls": c.len(),
                "bytes": c.weight(),
                "capacity": c.capacity(),
                "fills_in_flight": c.fills_in_flight(),
                "tiers": c.tier_counts().iter().map(|t| {
                    let mut v = serde_json::json!({
                        "tier": t.tier.as_str(),
                        "hits": t.hits,
                        "misses": t.misses,
                        "writes": t.writes,
                        "errors": t.errors,
                        "lease_waits": t.lease_waits,
                        "purges_sent": t.purges_sent,
                        "purges_received": t.purges_received,
                    });
                    if let Some(connected) = t.connected {
                        v["connected"] = connected.into();
                        v["refused"] = t.refused.into();
                    }
                    v
                }).collect::<Vec<_>>(),
            },
        });
        if let (Some(m), Some(o)) = (&self.metrics, v.as_object_mut()) {
            let t = m.totals_by_cache();
            let by_cache: serde_json::Map<String, serde_json::Value> = (crate::metrics::CACHE
                .iter())
            .zip(t)
            .map(|(k, n)| (k.to_string(), n.into()))
            .collect();
            o.insert(
                "requests".into(),
                serde_json::json!({ "total": t.iter().sum::<u64>(), "by_cache": by_cache }),
            );
        }
        if let (Some(m), Some(o)) = (&self.metrics, v.as_object_mut()) {
            let (sent, saved) = m.bytes();
            let by_encoding: serde_json::Map<String, serde_json::Value> =
                (crate::metrics::ENCODINGS.iter())
                    .zip(sent)
                    .map(|(k, n)| (k.to_string(), n.into()))
                    .collect();
            o.insert(
                "bytes".into(),
                serde_json::json!({
                    "sent": sent.iter().sum::<u64>(),
                    "saved": saved,
                    "sent_by_encoding": by_encoding,
                }),
            );
        }
        if let (Some(m), Some(o)) = (&self.metrics, v.as_object_mut()) {
            o.insert(
                "latency".into(),
                serde_json::json!({
                    "le_seconds": crate::metrics::BUCKETS,
                    "counts": m.durations().to_vec(),
                }),
            );
        }
        if let (Some(info), Some(o)) = (&self.info, v.as_object_mut()) {
            if let serde_json::Value::Object(server) = info() {
                o.extend(server);
            }
        }
        v
    }
}

/// `GET /_larder/entries?prefix=http://host/path/&limit=N`: the URLs under a prefix, each
/// variant with its size per stored encoding, status, age, time to live and tags.
fn entries(cache: &Cache, query: &str) -> Response<Body> {
    let query = Query::parse(Some(query), false);
    let prefix = query.get("prefix").unwrap_or_default().to_string();
    let limit = (query.get("limit"))
        .and_then(|l| l.parse().ok())
        .unwrap_or(100usize)
        .min(10_000);
    let now = cache.clock().now();
    let urls: Vec<serde_json::Value> = (cache.entries_under(&prefix, limit).into_iter())
        .map(|(key, entries)| {
            let variants: Vec<serde_json::Value> = entries
                .iter()
                .map(|e| {
                    let sizes: serde_json::Map<String, serde_json::Value> =
                        (crate::compress::Encoding::ALL.iter())
                            .filter_map(|enc| {
                                let v = e.variant(*enc)?;
                                let name = enc.token().unwrap_or("identity");
                                Some((name.to_string(), v.body.len().into()))
                            })
                            .collect();
                    let age = e.freshness.current_age(now);
                    serde_json::json!({
                        "status": e.status.as_u16(),
                        "hits": e.hits(),
                        "bytes": sizes,
                        "age_seconds": age.as_secs(),
                        "ttl_seconds": e.freshness.lifetime.saturating_sub(age).as_secs(),
                        "tags": e.tags.iter().map(|t| &**t).collect::<Vec<&str>>(),
                    })
                })
                .collect();
            serde_json::json!({ "key": key.as_str(), "variants": variants })
        })
        .collect();
    json_response(StatusCode::OK, serde_json::Value::from(urls).to_string())
}

impl Admin {
    async fn purge(&self, query: &str) -> Response<Body> {
        let query = Query::parse(Some(query), false);
        let Some((kind, value)) = (query.first_of(&["url", "prefix", "tag"]))
            .map(|(k, v)| (k.to_string(), v.to_string()))
        else {
            return json_response(
                StatusCode::BAD_REQUEST,
                "{\"error\":\"give one of url=, prefix= or tag=\"}".into(),
            );
        };
        if value.is_empty() {
            return json_response(
                StatusCode::BAD_REQUEST,
                format!("{{\"error\":\"empty {kind}\"}}"),
            );
        }
        let cache = Arc::clone(&self.cache);
        let purged = match kind.as_str() {
            "url" => match key_of_url(&value) {
                Some(k) => cache.purge(&Purge::Url(k)),
                None => {
                    return json_response(
                        StatusCode::BAD_REQUEST,
                        "{\"error\":\"url must be absolute: http://host/path\"}".into(),
                    )
                }
            },
            "prefix" => {
                let prefix = normalize_url_prefix(&value);
                tokio::task::spawn_blocking(move || cache.purge(&Purge::Prefix(prefix)))
                    .await
                    .unwrap_or(0)
            }
            _ => tokio::task::spawn_blocking(move || cache.purge(&Purge::Tag(value)))
                .await
                .unwrap_or(0),
        };
        json_response(StatusCode::OK, format!("{{\"purged\":{purged}}}"))
    }
}

/// `http://Host/path?q` → its cache key.
fn key_of_url(url: &str) -> Option<CacheKey> {
    let rest = url.strip_prefix("http://")?;
    let (host, pq) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, "/"),
    };
    (!host.is_empty()).then(|| CacheKey::from_parts("http", host, pq))
}

/// A URL prefix in the form cache keys take (host lowercased).
fn normalize_url_prefix(prefix: &str) -> String {
    match prefix.strip_prefix("http://") {
        Some(rest) => {
            let (host, path) = match rest.find('/') {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            format!("http://{}{path}", host.to_ascii_lowercase())
        }
        None => prefix.to_string(),
    }
}

/// `text` (a TOML configuration) with the values of secret keys replaced by `"<redacted>"`:
/// keys named `token`, `password` or `secret`, or ending in `_token`, `_password`, `_secret`,
/// `shared_key` (the fleet key of `[cache.shared]`), every field of `[tracing.headers]`, and
/// every key of a table named `keys` (an `api_key` rule's `{ holder = "key" }`).
pub fn redact(text: &str) -> String {
    let Ok(mut doc) = text.parse::<toml_edit::DocumentMut>() else {
        return String::new();
    };
    fn secret(k: &str) -> bool {
        ["token", "password", "secret"]
            .iter()
            .any(|s| k == *s || k.ends_with(&format!("_{s}")))
            || k == "shared_key"
    }
    fn walk(t: &mut dyn toml_edit::TableLike) {
        for (k, item) in t.iter_mut() {
            if secret(k.get()) && item.as_str().is_some() {
                *item = toml_edit::value("<redacted>");
            } else if let (true, Some(keys)) = (k.get() == "keys", item.as_table_like_mut()) {
                for (_, key) in keys.iter_mut() {
                    if key.as_str().is_some() {
                        *key = toml_edit::value("<redacted>");
                    }
                }
            } else if let Some(sub) = item.as_table_like_mut() {
                walk(sub);
            } else if let Some(arr) = item.as_array_of_tables_mut() {
                for t in arr.iter_mut() {
                    walk(t);
                }
            }
        }
    }
    walk(doc.as_table_mut());
    // The fields sent to the tracing collector carry its credentials, whatever their names.
    if let Some(fields) = (doc.get_mut("tracing"))
        .and_then(|t| t.get_mut("headers"))
        .and_then(|h| h.as_table_like_mut())
    {
        for (_, item) in fields.iter_mut() {
            if item.as_str().is_some() {
                *item = toml_edit::value("<redacted>");
            }
        }
    }
    doc.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_secrets_are_redacted() {
        let text = "[[policy.p]]\napi_key = { keys = { alice = \"alice-key-1\" } }\n[[policy.p]]\njwt = { secret = \"0123456789abcdef\" }\n";
        let out = redact(text);
        assert!(
            !out.contains("alice-key-1") && !out.contains("0123456789abcdef"),
            "{out}"
        );
        assert!(out.contains("alice"), "{out}");
    }

    #[test]
    fn bearer_and_allow_list() {
        let a = Access {
            token: Some("s3cret".into()),
            allow: vec!["10.0.0.0/8".parse().unwrap()],
        };
        let mut h = HeaderMap::new();
        let peer: SocketAddr = "192.168.1.1:5".parse().unwrap();
        assert!(!a.permits(&h, peer));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer s3cret"),
        );
        assert!(a.permits(&h, peer));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer s3cre"),
        );
        assert!(!a.permits(&h, peer));
        assert!(a.permits(&HeaderMap::new(), "10.1.1.1:5".parse().unwrap()));
        assert!(!Access::default().bearer_ok(&h));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        // RFC 9110 §11.1: an auth scheme's name is case-insensitive.
        let a = Access {
            token: Some("s3cret".into()),
            allow: vec![],
        };
        for (value, ok) in [
            ("Bearer s3cret", true),
            ("bearer s3cret", true),
            ("BEARER s3cret", true),
            ("bEaReR   s3cret ", true),
            ("Bearer\ts3cret", true),
            ("Basic s3cret", false),
            ("Bearers3cret", false),
            ("bearer s3cre", false),
            ("bearer", false),
        ] {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, HeaderValue::from_static(value));
            assert_eq!(a.bearer_ok(&h), ok, "{value:?}");
        }
    }

    #[test]
    fn urls_to_keys() {
        assert_eq!(
            key_of_url("http://Ex.com/a?b").unwrap().as_str(),
            "http://ex.com/a?b"
        );
        assert_eq!(
            key_of_url("http://ex.com").unwrap().as_str(),
            "http://ex.com/"
        );
        assert!(key_of_url("/relative").is_none());
        assert_eq!(
            normalize_url_prefix("http://EX.com/img/"),
            "http://ex.com/img/"
        );
    }
}
