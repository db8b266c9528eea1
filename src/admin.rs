//! Administration: who may run admin operations ([`Access`]: a bearer token, or an address in an
//! allow list), the `PURGE` method on proxy routes, and the admin API served on its own listener
//! (`[admin] listen`, loopback by default in examples):
//!
//! - `GET /_larder/status`: cache size and counts, as JSON;
//! - `GET /_larder/entries?prefix=`: the URLs stored under a prefix, their variants' sizes,
//!   ages, TTLs and tags;
//! - `GET /_larder/config`: the running configuration, secrets redacted;
//! - `GET /_larder/history`: the status sampled every 10 seconds over the last hour
//!   ([`History`], kept by a background task the server runs), for the dashboard's charts;
//! - `GET /_larder/config/file`: the file larder runs from (`--config`), secrets redacted, and
//!   the versions applied from the dashboard; `POST /_larder/config/check` (the body: a
//!   candidate file) says what `larder check` would, at its key and line;
//!   `POST /_larder/config/apply` checks it, keeps the running file as a version, writes the
//!   candidate atomically (a temporary file in the same directory, renamed over it) and reloads;
//!   `POST /_larder/config/rollback?version=ID` applies a version kept (the last
//!   [`CONFIG_VERSIONS`], in the state directory's `config-versions/`). A `"<redacted>"` value
//!   sent back keeps the file's secret at that key. Requests sent cross-site (an `Origin` of
//!   another host, `Sec-Fetch-Site: cross-site` or `same-site`) are refused: the token travels
//!   in a header, never a cookie, and only the dashboard's own page may post;
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
    /// The last hour's samples of the status (`GET /_larder/history`).
    history: Arc<History>,
    /// The configuration file and its versions, when larder runs from one.
    file: Option<ConfigFile>,
}

/// The file larder runs from, edited from the dashboard.
struct ConfigFile {
    path: std::path::PathBuf,
    /// Where applied versions are kept (`<state_dir>/config-versions`).
    versions: std::path::PathBuf,
    /// One apply or rollback at a time.
    busy: tokio::sync::Mutex<()>,
}

/// The history's sampling task.
pub type Sampler = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

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
            history: Arc::new(History::default()),
            file: None,
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

    /// The background service that samples the status into the history every
    /// [`HISTORY_EVERY`] until `stop` changes (the server registers it).
    pub fn history_sampler(&self) -> impl FnOnce(tokio::sync::watch::Receiver<bool>) -> Sampler {
        let source = self.source();
        let history = Arc::clone(&self.history);
        move |mut stop| {
            Box::pin(async move {
                let mut tick = tokio::time::interval(HISTORY_EVERY);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = stop.changed() => return,
                    }
                    history.push(Sample::of(&source.value()));
                }
            })
        }
    }

    fn source(&self) -> StatusSource {
        StatusSource {
            cache: Arc::clone(&self.cache),
            metrics: self.metrics.clone(),
            info: self.info.clone(),
        }
    }

    /// Lets the dashboard edit the configuration file at `path` (the one reloads read),
    /// keeping the versions applied under `state_dir`.
    pub fn with_config_file(
        mut self,
        path: Option<std::path::PathBuf>,
        state_dir: &std::path::Path,
    ) -> Admin {
        self.file = path.map(|path| ConfigFile {
            path,
            versions: state_dir.join("config-versions"),
            busy: tokio::sync::Mutex::new(()),
        });
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

    pub async fn handle<B>(&self, req: Request<B>) -> Response<Body>
    where
        B: http_body::Body<Data = bytes::Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
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
        if req.method() != Method::GET
            && cross_site(req.headers(), req.uri().authority().map(|a| a.as_str()))
        {
            return json_response(
                StatusCode::FORBIDDEN,
                "{\"error\":\"sent from another site: admin requests must come from the dashboard's own origin\"}".into(),
            );
        }
        let path = req.uri().path();
        if path.starts_with("/_larder/config/") {
            return self.config_file(req).await;
        }
        match (req.method(), path) {
            (&Method::GET, "/_larder/events") => self.events(),
            (&Method::GET, "/_larder/status") => self.status(),
            (&Method::GET, "/_larder/history") => json_response(
                StatusCode::OK,
                serde_json::json!({
                    "every_seconds": HISTORY_EVERY.as_secs(),
                    "samples": self.history.samples(),
                })
                .to_string(),
            ),
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
        let source = self.source();
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
        self.source().value()
    }
}

/// How often the history samples the status.
pub const HISTORY_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
/// Samples kept: one hour's.
pub const HISTORY_LEN: usize = 360;

/// The last hour of the status, one [`Sample`] every [`HISTORY_EVERY`] (a ring of
/// [`HISTORY_LEN`]): the dashboard draws its charts from it when it opens, not from when it
/// opened. Counters, not rates: rates are differences of two samples over their times.
#[derive(Default)]
pub struct History(std::sync::Mutex<std::collections::VecDeque<Sample>>);

impl History {
    pub fn push(&self, s: Sample) {
        let mut ring = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if ring.len() == HISTORY_LEN {
            ring.pop_front();
        }
        ring.push_back(s);
    }

    pub fn samples(&self) -> Vec<Sample> {
        let ring = self.0.lock().unwrap_or_else(|e| e.into_inner());
        ring.iter().cloned().collect()
    }
}

/// One sample of the status's counters (totals since start) at `unix_ms`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Sample {
    pub unix_ms: u64,
    pub requests: u64,
    pub hits: u64,
    pub lookups: u64,
    /// Responses by status class, 1xx to 5xx.
    pub status: [u64; 5],
    /// Failed exchanges with backends, every pool's.
    pub upstream_errors: u64,
    pub sent: u64,
    pub saved: u64,
    /// Requests by duration (the buckets of `crate::metrics::BUCKETS`, then longer).
    pub latency: Vec<u64>,
}

impl Sample {
    /// The counters of a status value (what `/_larder/status` serves).
    pub fn of(v: &serde_json::Value) -> Sample {
        let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        let mut status = [0u64; 5];
        for (i, name) in crate::metrics::STATUS_NAMES.iter().enumerate() {
            status[i] = n(&v["requests"]["by_status"][name]);
        }
        let upstream_errors = (v["pools"].as_array().into_iter().flatten())
            .flat_map(|p| p["backends"].as_array().into_iter().flatten())
            .flat_map(|b| b["errors"].as_object().into_iter().flatten())
            .map(|(_, e)| n(e))
            .sum();
        Sample {
            unix_ms: n(&v["unix_ms"]),
            requests: n(&v["requests"]["total"]),
            hits: n(&v["hit_ratio"]["hits"]),
            lookups: n(&v["hit_ratio"]["lookups"]),
            status,
            upstream_errors,
            sent: n(&v["bytes"]["sent"]),
            saved: n(&v["bytes"]["saved"]),
            latency: (v["latency"]["counts"].as_array().into_iter().flatten())
                .map(n)
                .collect(),
        }
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
        let unix_ms = (c.clock().now())
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut v = serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            // When the counters were read (the cache's clock): rates are differences over
            // these, not over when the page received them.
            "unix_ms": unix_ms,
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
            let by_route = m.by_route_status();
            let mut by_status = [0u64; 5];
            for (_, counts) in &by_route {
                for (slot, n) in by_status.iter_mut().zip(counts) {
                    *slot += n;
                }
            }
            let names = crate::metrics::STATUS_NAMES;
            let classes = |counts: &[u64; 5]| {
                (names.iter().zip(counts))
                    .map(|(k, n)| (k.to_string(), (*n).into()))
                    .collect::<serde_json::Map<String, serde_json::Value>>()
            };
            let routes: Vec<serde_json::Value> = (by_route.iter())
                .map(|(route, counts)| {
                    serde_json::json!({ "route": route, "by_status": classes(counts) })
                })
                .collect();
            o.insert(
                "requests".into(),
                serde_json::json!({
                    "total": t.iter().sum::<u64>(),
                    "by_cache": by_cache,
                    "by_status": classes(&by_status),
                    "routes": routes,
                }),
            );
            let (hits, lookups) = crate::metrics::hits_and_lookups(&t);
            o.insert(
                "hit_ratio".into(),
                serde_json::json!({
                    "hits": hits,
                    "lookups": lookups,
                    "definition": crate::metrics::HIT_RATIO_DEFINITION,
                }),
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
        let images = (self.metrics.as_ref()).and_then(|m| m.images().totals());
        if let (Some(t), Some(o)) = (images, v.as_object_mut()) {
            let sources: serde_json::Map<String, serde_json::Value> =
                (crate::metrics::SOURCE_OUTCOMES.iter())
                    .zip(t.sources)
                    .map(|(k, n)| (k.to_string(), n.into()))
                    .collect();
            o.insert(
                "images".into(),
                serde_json::json!({
                    "transforms": t.transforms,
                    "le_seconds": crate::metrics::IMAGE_BUCKETS,
                    "counts": t.buckets.to_vec(),
                    "queued": t.queued,
                    "rejected": t.rejected,
                    "sources": sources,
                    "saved": t.saved,
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

/// How many applied versions of the configuration are kept.
pub const CONFIG_VERSIONS: usize = 10;

/// Whether a request was sent by a page of another site (a browser says so): its `Origin`
/// names another host than its `Host`, or `Sec-Fetch-Site` is `cross-site` or `same-site`
/// (another port or subdomain is another origin). Requests without either (curl, `larder
/// reload`) are not browsers' and pass on their token alone. `authority` is the request's
/// (its URI's, as HTTP/2 carries it) when it has no `Host` field.
pub fn cross_site(headers: &HeaderMap, authority: Option<&str>) -> bool {
    let site = headers.get("sec-fetch-site").map(|v| v.as_bytes());
    if matches!(site, Some(s) if s != b"same-origin" && s != b"none") {
        return true;
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    let host = (headers.get(header::HOST).map(|h| h.as_bytes())).or(authority.map(str::as_bytes));
    let origin_host = (origin.to_str().ok())
        .and_then(|o| o.split_once("://"))
        .map(|(_, h)| h.trim_end_matches('/').as_bytes());
    match (origin_host, host) {
        (Some(o), Some(h)) => !o.eq_ignore_ascii_case(h),
        _ => true,
    }
}

/// A configuration refused: where (line, key; 0 and empty when the text does not say) and why.
fn config_error(e: &crate::config::Error, shown_as: &str, written_as: &str) -> serde_json::Value {
    match e {
        crate::config::Error::Invalid {
            line, key, message, ..
        } => serde_json::json!({ "line": line, "key": key, "message": message }),
        other => serde_json::json!({
            "line": 0, "key": "",
            "message": other.to_string().replace(written_as, shown_as),
        }),
    }
}

fn config_refused(status: StatusCode, error: serde_json::Value) -> Response<Body> {
    json_response(
        status,
        serde_json::json!({ "ok": false, "error": error }).to_string(),
    )
}

impl Admin {
    /// `/_larder/config/...`: the configuration file from the dashboard.
    async fn config_file<B>(&self, req: Request<B>) -> Response<Body>
    where
        B: http_body::Body<Data = bytes::Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let Some(file) = &self.file else {
            let why = "larder runs without a configuration file (start it with --config FILE to edit it here)";
            if req.method() == Method::GET && req.uri().path() == "/_larder/config/file" {
                let text = self
                    .config
                    .as_ref()
                    .map(|c| redact(&c()))
                    .unwrap_or_default();
                return json_response(
                    StatusCode::OK,
                    serde_json::json!({ "editable": false, "why": why, "text": text }).to_string(),
                );
            }
            return config_refused(
                StatusCode::CONFLICT,
                serde_json::json!({ "line": 0, "key": "", "message": why }),
            );
        };
        let (method, path) = (req.method().clone(), req.uri().path().to_string());
        let query = req.uri().query().unwrap_or("").to_string();
        match (method, path.as_str()) {
            (Method::GET, "/_larder/config/file") => {
                // Bounded as any configuration read (the file may have grown, or be gone).
                let path = file.path.clone();
                let read = tokio::task::spawn_blocking(move || crate::config::read_bounded(&path));
                let text = match read.await.map_err(std::io::Error::other).and_then(|r| r) {
                    Ok(text) => text,
                    Err(e) => {
                        let message = format!("{}: {e}", file.path.display());
                        return config_refused(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            serde_json::json!({ "line": 0, "key": "", "message": message }),
                        );
                    }
                };
                json_response(
                    StatusCode::OK,
                    serde_json::json!({
                        "editable": true,
                        "path": file.path.display().to_string(),
                        "text": redact(&text),
                        "versions": file.list(),
                    })
                    .to_string(),
                )
            }
            (Method::POST, "/_larder/config/check" | "/_larder/config/apply") => {
                let limit = crate::config::MAX_CONFIG_BYTES as usize;
                let body = http_body_util::Limited::new(req.into_body(), limit);
                let text = match http_body_util::BodyExt::collect(body).await {
                    Ok(b) => b.to_bytes(),
                    Err(_) => {
                        return config_refused(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            serde_json::json!({ "line": 0, "key": "", "message": format!("a configuration is at most {limit} bytes") }),
                        )
                    }
                };
                let Ok(text) = String::from_utf8(text.to_vec()) else {
                    return config_refused(
                        StatusCode::BAD_REQUEST,
                        serde_json::json!({ "line": 0, "key": "", "message": "not UTF-8 text" }),
                    );
                };
                let _busy = file.busy.lock().await;
                let current = std::fs::read_to_string(&file.path).unwrap_or_default();
                let text = unredact(&text, &current);
                let apply = path.ends_with("/apply");
                self.check_and_apply(file, &text, &current, apply).await
            }
            (Method::POST, "/_larder/config/rollback") => {
                let q = Query::parse(Some(&query), false);
                let id = q.get("version").unwrap_or_default().to_string();
                let Some(text) = file.version(&id) else {
                    return config_refused(
                        StatusCode::NOT_FOUND,
                        serde_json::json!({ "line": 0, "key": "", "message": format!("no version `{id}` kept") }),
                    );
                };
                let _busy = file.busy.lock().await;
                let current = std::fs::read_to_string(&file.path).unwrap_or_default();
                self.check_and_apply(file, &text, &current, true).await
            }
            (
                _,
                "/_larder/config/file"
                | "/_larder/config/check"
                | "/_larder/config/apply"
                | "/_larder/config/rollback",
            ) => json_response(
                StatusCode::METHOD_NOT_ALLOWED,
                "{\"error\":\"method not allowed\"}".into(),
            ),
            _ => json_response(
                StatusCode::NOT_FOUND,
                "{\"error\":\"no such admin endpoint\"}".into(),
            ),
        }
    }

    /// Checks `text` as `larder check` would (written beside the file, loaded from there);
    /// with `apply`, renames the candidate over the file and reloads, then keeps `current`
    /// and `text` as versions. A reload that refuses it puts `current` back (no version kept).
    async fn check_and_apply(
        &self,
        file: &ConfigFile,
        text: &str,
        current: &str,
        apply: bool,
    ) -> Response<Body> {
        let shown = file.path.display().to_string();
        let dir = file
            .path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        let name = file
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let candidate = dir.join(format!(".{name}.larder-candidate"));
        let written = candidate.display().to_string();
        if let Err(e) = write_synced(&candidate, text) {
            return config_refused(
                StatusCode::INTERNAL_SERVER_ERROR,
                serde_json::json!({ "line": 0, "key": "", "message": format!("cannot write {written}: {e}") }),
            );
        }
        let checked = crate::config::Config::load(&candidate).map_err(|e| config_error(&e, &shown, &written)).and_then(|cfg| {
            let refused = |e: String| serde_json::json!({ "line": 0, "key": "", "message": e.replace(&written, &shown) });
            // What `larder check` reads besides the file: certificates, the pools' CA and
            // client certificates (pools built and dropped: their health checks stop).
            crate::tls::check(&cfg).map_err(|e| refused(e.to_string()))?;
            crate::upstream::Pools::build(&cfg.pools, None).map_err(refused)?;
            Ok(())
        });
        if let Err(error) = checked {
            let _ = std::fs::remove_file(&candidate);
            return config_refused(StatusCode::UNPROCESSABLE_ENTITY, error);
        }
        if !apply {
            let _ = std::fs::remove_file(&candidate);
            return json_response(StatusCode::OK, "{\"ok\":true}".into());
        }
        let Some(reload) = &self.reload else {
            let _ = std::fs::remove_file(&candidate);
            return config_refused(
                StatusCode::CONFLICT,
                serde_json::json!({ "line": 0, "key": "", "message": "this larder cannot reload" }),
            );
        };
        // Keep the file's permissions (it may hold secrets).
        if let Ok(meta) = std::fs::metadata(&file.path) {
            let _ = std::fs::set_permissions(&candidate, meta.permissions());
        }
        if let Err(e) = std::fs::rename(&candidate, &file.path) {
            let _ = std::fs::remove_file(&candidate);
            return config_refused(
                StatusCode::INTERNAL_SERVER_ERROR,
                serde_json::json!({ "line": 0, "key": "", "message": format!("cannot replace {shown}: {e}") }),
            );
        }
        match reload().await {
            Ok(needs_restart) => {
                // Versions are what was applied: the file that ran before, and this one.
                let now = self.cache.clock().now();
                let kept = (file.keep(current, now))
                    .and_then(|_| file.keep(text, now))
                    .err()
                    .map(|e| format!("not kept as a version in {}: {e}", file.versions.display()));
                if let Some(e) = &kept {
                    tracing::warn!(error = %e, "configuration applied from the dashboard");
                }
                json_response(
                    StatusCode::OK,
                    serde_json::json!({
                        "ok": true, "applied": true, "needs_restart": needs_restart,
                        "versions_error": kept,
                    })
                    .to_string(),
                )
            }
            Err(e) => {
                // The file says what runs: the previous one goes back.
                let _ = write_synced(&candidate, current)
                    .and_then(|_| std::fs::rename(&candidate, &file.path));
                config_refused(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    serde_json::json!({ "line": 0, "key": "", "message": format!("the reload refused it, the running configuration stays: {e}") }),
                )
            }
        }
    }
}

/// Writes `text` to `path` and syncs it to the disk.
fn write_synced(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut f = std::fs::File::create(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

impl ConfigFile {
    /// The versions kept, newest first: `{id, unix_ms}`.
    fn list(&self) -> Vec<serde_json::Value> {
        self.ids()
            .into_iter()
            .map(|(ms, id)| serde_json::json!({ "id": id, "unix_ms": ms }))
            .collect()
    }

    /// (unix ms, id) of the versions kept, newest first. An id is `<unix ms>-<n>`.
    fn ids(&self) -> Vec<(u64, String)> {
        let mut out: Vec<(u64, u64, String)> =
            (std::fs::read_dir(&self.versions).into_iter().flatten())
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let id = name.strip_suffix(".toml")?;
                    let (ms, n) = id.split_once('-')?;
                    Some((ms.parse().ok()?, n.parse().ok()?, id.to_string()))
                })
                .collect();
        out.sort_by_key(|v| std::cmp::Reverse((v.0, v.1)));
        out.into_iter().map(|(ms, _, id)| (ms, id)).collect()
    }

    /// The text of version `id`, if kept (an id is digits and one hyphen: never a path).
    fn version(&self, id: &str) -> Option<String> {
        let ok = !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit() || b == b'-');
        ok.then(|| std::fs::read_to_string(self.versions.join(format!("{id}.toml"))).ok())
            .flatten()
    }

    /// Keeps `text` as the newest version (unless it is the newest already), and the last
    /// [`CONFIG_VERSIONS`] only.
    fn keep(&self, text: &str, now: std::time::SystemTime) -> std::io::Result<()> {
        let ids = self.ids();
        if let Some((_, newest)) = ids.first() {
            if self.version(newest).as_deref() == Some(text) {
                return Ok(());
            }
        }
        std::fs::create_dir_all(&self.versions)?;
        let ms = now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let n = ids.iter().filter(|(m, _)| *m == ms).count();
        let tmp = self.versions.join(".new");
        write_synced(&tmp, text)?;
        std::fs::rename(&tmp, self.versions.join(format!("{ms}-{n}.toml")))?;
        for (_, id) in self.ids().into_iter().skip(CONFIG_VERSIONS) {
            let _ = std::fs::remove_file(self.versions.join(format!("{id}.toml")));
        }
        Ok(())
    }
}

/// `text` with each `"<redacted>"` value (as [`redact`] shows secrets) replaced by the value
/// `current` has at the same key: a redacted file sent back keeps its secrets.
pub fn unredact(text: &str, current: &str) -> String {
    if !text.contains("<redacted>") {
        return text.to_string();
    }
    let (Ok(mut doc), Ok(cur)) = (
        text.parse::<toml_edit::DocumentMut>(),
        current.parse::<toml_edit::DocumentMut>(),
    ) else {
        return text.to_string();
    };
    fn walk(t: &mut dyn toml_edit::TableLike, cur: Option<&dyn toml_edit::TableLike>) {
        for (k, item) in t.iter_mut() {
            let was = cur.and_then(|c| c.get(k.get()));
            if item.as_str() == Some("<redacted>") {
                if let Some(v) = was.and_then(|w| w.as_str()) {
                    *item = toml_edit::value(v);
                }
            } else if let Some(sub) = item.as_table_like_mut() {
                walk(sub, was.and_then(|w| w.as_table_like()));
            } else if let Some(arr) = item.as_array_of_tables_mut() {
                let old = was.and_then(|w| w.as_array_of_tables());
                for (i, t) in arr.iter_mut().enumerate() {
                    let o = old
                        .and_then(|o| o.get(i))
                        .map(|t| t as &dyn toml_edit::TableLike);
                    walk(t, o);
                }
            }
        }
    }
    walk(
        doc.as_table_mut(),
        Some(cur.as_table() as &dyn toml_edit::TableLike),
    );
    doc.to_string()
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
    fn cross_site_requests_are_told_apart() {
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, HeaderValue::from_static(v));
            }
            m
        };
        assert!(!cross_site(&h(&[("host", "127.0.0.1:9090")]), None), "curl");
        assert!(!cross_site(
            &h(&[
                ("host", "127.0.0.1:9090"),
                ("origin", "http://127.0.0.1:9090"),
                ("sec-fetch-site", "same-origin")
            ]),
            None
        ));
        assert!(cross_site(
            &h(&[
                ("host", "127.0.0.1:9090"),
                ("origin", "http://evil.example")
            ]),
            None
        ));
        assert!(
            cross_site(
                &h(&[
                    ("host", "127.0.0.1:9090"),
                    ("origin", "http://127.0.0.1:8080")
                ]),
                None
            ),
            "another port"
        );
        assert!(cross_site(
            &h(&[("host", "127.0.0.1:9090"), ("sec-fetch-site", "cross-site")]),
            None
        ));
        assert!(cross_site(
            &h(&[("host", "a.example"), ("sec-fetch-site", "same-site")]),
            None
        ));
        assert!(cross_site(
            &h(&[("host", "a.example"), ("origin", "null")]),
            None
        ));
        // HTTP/2: the authority in the URI, no Host field.
        let origin = [("origin", "http://127.0.0.1:9090")];
        assert!(!cross_site(&h(&origin), Some("127.0.0.1:9090")));
        assert!(cross_site(&h(&origin), Some("127.0.0.1:9091")));
    }

    #[test]
    fn a_redacted_secret_sent_back_keeps_the_files_value() {
        let current = "[admin]\ntoken = \"s3cret\"\n[[listener]]\naddr = \"x\"\n[tracing.headers]\nauthorization = \"Bearer abc\"\n";
        let shown = redact(current);
        assert!(
            !shown.contains("s3cret") && !shown.contains("abc"),
            "{shown}"
        );
        let edited = shown.replace("addr = \"x\"", "addr = \"y\"");
        let back = unredact(&edited, current);
        assert!(back.contains("token = \"s3cret\""), "{back}");
        assert!(back.contains("authorization = \"Bearer abc\""), "{back}");
        assert!(back.contains("addr = \"y\""), "{back}");
        // A secret set anew is kept as written.
        assert!(unredact("[admin]\ntoken = \"new\"\n", current).contains("\"new\""));
    }

    #[test]
    fn versions_keep_the_last_ten_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let f = ConfigFile {
            path: dir.path().join("larder.toml"),
            versions: dir.path().join("v"),
            busy: tokio::sync::Mutex::new(()),
        };
        let t0 = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        for i in 0..12u64 {
            f.keep(
                &format!("# {i}\n"),
                t0 + std::time::Duration::from_secs(i / 2),
            )
            .unwrap();
        }
        // The same text again is not a new version.
        f.keep("# 11\n", t0 + std::time::Duration::from_secs(99))
            .unwrap();
        let ids = f.ids();
        assert_eq!(ids.len(), CONFIG_VERSIONS);
        assert_eq!(f.version(&ids[0].1).unwrap(), "# 11\n");
        assert_eq!(f.version(&ids[9].1).unwrap(), "# 2\n");
        assert_eq!(ids[0].0, 1_700_000_005_000);
        assert!(f.version("../larder").is_none());
    }

    #[test]
    fn history_keeps_an_hour_and_samples_the_status() {
        let h = History::default();
        for i in 0..(HISTORY_LEN as u64 + 5) {
            h.push(Sample {
                unix_ms: i,
                ..Sample::default()
            });
        }
        let s = h.samples();
        assert_eq!(s.len(), HISTORY_LEN);
        assert_eq!(s[0].unix_ms, 5);
        let status = serde_json::json!({
            "unix_ms": 7, "requests": {"total": 9, "by_status": {"2xx": 5, "4xx": 3, "5xx": 1}},
            "hit_ratio": {"hits": 4, "lookups": 6}, "bytes": {"sent": 100, "saved": 50},
            "latency": {"counts": [1, 2]},
            "pools": [{"backends": [{"errors": {"connect": 2, "5xx": 1}}, {"errors": {"timeout": 4}}]}],
        });
        assert_eq!(
            Sample::of(&status),
            Sample {
                unix_ms: 7,
                requests: 9,
                hits: 4,
                lookups: 6,
                status: [0, 5, 0, 3, 1],
                upstream_errors: 7,
                sent: 100,
                saved: 50,
                latency: vec![1, 2],
            }
        );
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
