//! Push: live JSON records that clients write over HTTP and that browsers subscribe to over
//! Server-Sent Events or WebSocket (what Piper Push Cache does; the pub/sub half of nchan and
//! Mercure), served from a route (`push = { dir = "..." }`).
//!
//! - this file: the route's HTTP face: which request does what, access and CORS; and a
//!   server's list of its routes' stores ([`Stores`]), which its status and `/metrics` show;
//! - [`store`]: the records' face: open, write, read, list, subscribe, expire, and the
//!   observers of its commits; below it [`writer`] (the group-commit thread: commit, settle,
//!   observers in commit order, acknowledge; compaction), [`state`] (what its lock guards:
//!   records, staged changes, sequence numbers), [`history`], [`groups`], [`patch`] (merge
//!   patch, member set);
//! - [`record`]: the leaf: records, changes, and the [`record::Observer`] trait;
//! - [`log`]: the durable change log (group commit, recovery, compaction);
//! - [`filter`]: id patterns and member conditions of subscriptions;
//! - [`fanout`]: topics (one per distinct pattern and filter), events serialized once; the
//!   store's first observer;
//! - [`replicate`]: with `share`, the fleet's log: an observer of the store that appends its
//!   clients' changes, and a follower that applies the other nodes' changes;
//! - [`sse`]: a subscriber's event stream; [`ws`]: WebSocket sessions;
//! - [`auth`]: the write token and JSON Web Tokens.
//!
//! Who imports whom, bottom up (each file uses only files on lines above it; this file is on
//! top): filter, record, log, patch; auth, groups, history, fanout; state; writer; store;
//! replicate, sse, ws.
//!
//! docs/push.md is the user's guide.

pub mod auth;
pub mod fanout;
pub mod filter;
pub mod groups;
pub mod history;
pub mod log;
pub mod patch;
pub mod record;
pub mod replicate;
pub mod sse;
pub mod state;
pub mod store;
pub mod writer;
pub mod ws;

use std::net::SocketAddr;
use std::sync::Arc;

use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;

use self::auth::{Allowed, Auth};
use self::filter::{Filter, IdPattern};
use self::store::{Conditions, Store, Write, WriteError, Written};
use crate::body::{Body, RequestBody};
use crate::compress::AcceptEncoding;
use crate::config::push::valid_id;
use crate::config::{Config, HandlerConfig, PushConfig};
use crate::fleet::Fleet;
use crate::http::conditional::{self, Preconditions};
use crate::http::json_response;
use crate::http::query::Query;
use crate::interim::Sink;

/// The demo page (`demo = true`): the records of the route, live.
const DEMO: &str = include_str!("../../assets/push-demo.html");

/// A push route.
pub struct Push {
    inner: Arc<Inner>,
}

struct Inner {
    pub cfg: PushConfig,
    pub store: Arc<Store>,
    auth: Auth,
    prefix: String,
}

/// Opens the store of every push route of `config` (creating directories, replaying logs),
/// so that a directory that cannot be used is an error at start or reload, naming the route.
/// The stores stay open while the returned handles (and then the routes) hold them.
pub fn open_all(config: &Config) -> Result<Vec<Arc<Store>>, String> {
    let mut out = Vec::new();
    for (i, l) in config.listeners.iter().enumerate() {
        for (j, r) in l.routes.iter().enumerate() {
            let HandlerConfig::Push(p) = &r.handler else {
                continue;
            };
            let (store, opened) = Store::open(p).map_err(|e| {
                format!(
                    "listener {i} ({}) route {j} ({}): push.dir {}: {e}",
                    l.addr,
                    r.path.0,
                    p.dir.display()
                )
            })?;
            if opened.changes > 0 || opened.cut > 0 {
                tracing::info!(
                    dir = %p.dir.display(),
                    records = opened.records,
                    changes = opened.changes,
                    cut_bytes = opened.cut,
                    "push: change log replayed"
                );
            }
            Auth::new(p).map_err(|e| format!("listener {i} route {j}: push.jwt: {e}"))?;
            out.push(store);
        }
    }
    Ok(out)
}

/// The refusal (`status`, naming the version served) of a WebSocket request that is not of
/// version 13 (RFC 6455 §4.4), if it is not.
fn not_version_13(h: &http::HeaderMap, status: StatusCode) -> Option<Response<Body>> {
    if h.get(header::SEC_WEBSOCKET_VERSION).map(|v| v.as_bytes()) == Some(b"13") {
        return None;
    }
    let mut r = refuse(status, "WebSocket version 13 only");
    (r.headers_mut()).insert(
        header::SEC_WEBSOCKET_VERSION,
        HeaderValue::from_static("13"),
    );
    Some(r)
}

/// Why a request was refused.
fn refuse(status: StatusCode, text: &str) -> Response<Body> {
    json_response(
        status,
        serde_json::json!({ "error": text }).to_string() + "\n",
    )
}

impl Push {
    /// The route at `prefix` for `cfg`; its store is opened by [`open_all`] first. With
    /// `share`, the store follows the route's log in `fleet` (the one the server opened from
    /// `[cache.shared]`; the replica started once per store, kept across reloads).
    pub fn new(cfg: &PushConfig, prefix: &str, fleet: Option<&Arc<Fleet>>) -> Result<Push, String> {
        let (store, _) =
            Store::open(cfg).map_err(|e| format!("push.dir {}: {e}", cfg.dir.display()))?;
        // A reload's settings apply to the store it keeps open.
        store.configure(cfg);
        if cfg.share {
            let log = fleet
                .map(|fleet| fleet.log(&format!("push:{prefix}")))
                .ok_or("push.share needs [cache.shared]")?;
            replicate::Replica::start(&store, log);
        }
        Ok(Push {
            inner: Arc::new(Inner {
                auth: Auth::new(cfg)?,
                cfg: cfg.clone(),
                store,
                prefix: prefix.to_string(),
            }),
        })
    }

    pub fn source(&self) -> String {
        self.inner.store.dir().display().to_string()
    }

    /// Serves one request of the route.
    pub async fn handle(
        &self,
        req: Request<RequestBody>,
        _peer: SocketAddr,
        sink: Option<Sink>,
    ) -> Response<Body> {
        let cors = self.inner.cors(req.headers());
        let mut res = self.route(req, sink).await;
        if let Some(origin) = cors {
            let h = res.headers_mut();
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            h.insert(
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                HeaderValue::from_static("etag, location"),
            );
            h.append(header::VARY, HeaderValue::from_static("origin"));
        }
        res
    }

    async fn route(&self, mut req: Request<RequestBody>, sink: Option<Sink>) -> Response<Body> {
        let inner = &self.inner;
        let path = req.uri().path();
        let rest = path
            .strip_prefix(inner.prefix.as_str())
            .unwrap_or(path)
            .trim_start_matches('/')
            .to_string();
        let query = Query::parse(req.uri().query(), true);
        let method = req.method().clone();
        if method == Method::OPTIONS {
            return inner.preflight(req.headers());
        }
        if !rest.is_empty() && !valid_id(&rest) {
            // `/records/` where the route is at `/`: a prefix meant, which `match` says.
            let under = rest.strip_suffix('/').filter(|id| valid_id(id));
            if let (Some(id), true) = (under, method == Method::GET || method == Method::HEAD) {
                let at = inner.prefix_slash();
                return refuse(
                    StatusCode::BAD_REQUEST,
                    &format!(
                        "`{rest}` is not an id (an id does not end in /): for the records under \
                         it, ask `{at}?match={id}/*` (with `&subscribe` to follow them)"
                    ),
                );
            }
            return refuse(
                StatusCode::BAD_REQUEST,
                "an id is segments of A-Z a-z 0-9 _ - . ~ : @ separated by /, at most 512 bytes",
            );
        }
        // WebSocket over HTTP/2 (RFC 8441): an extended CONNECT with `:protocol = websocket`.
        let ws_h2 = method == Method::CONNECT
            && (req.extensions().get::<hyper::ext::Protocol>())
                .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"));
        if method == Method::CONNECT && !ws_h2 {
            return refuse(StatusCode::METHOD_NOT_ALLOWED, "CONNECT is not served");
        }
        let get = method == Method::GET || method == Method::HEAD;
        if get || ws_h2 {
            let read = inner.auth.reader(req.headers(), query.get("authorization"));
            if let Allowed::Nothing(status, why) = read {
                return refuse(status, why);
            }
            if ws_h2 {
                return inner.websocket_h2(&mut req, read);
            }
            if method == Method::GET && crate::upgrade::wanted(req.headers()) {
                return inner.websocket(&req, sink, read);
            }
            let subscribe = query.has("subscribe")
                || (req.headers().get_all(header::ACCEPT).iter())
                    .any(|v| v.to_str().is_ok_and(|v| v.contains("text/event-stream")));
            if subscribe {
                return inner.subscribe(&req, &query, &rest, &read, sink);
            }
            if rest.is_empty() {
                let html = (req.headers().get(header::ACCEPT))
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.contains("text/html"));
                if inner.cfg.demo && html && query.is_empty() {
                    return demo_page();
                }
                return inner.list(&query, &read);
            }
            if !read.id(&rest) {
                return refuse(StatusCode::FORBIDDEN, "the token may not read this id");
            }
            return inner.get(&req, &rest);
        }
        let write = match method {
            Method::PUT | Method::PATCH | Method::DELETE if !rest.is_empty() => method.clone(),
            Method::PUT | Method::PATCH | Method::DELETE => {
                return refuse(StatusCode::METHOD_NOT_ALLOWED, "write to /<id>");
            }
            _ => {
                let mut r = refuse(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
                r.headers_mut().insert(
                    header::ALLOW,
                    HeaderValue::from_static("GET, HEAD, PUT, PATCH, DELETE, OPTIONS"),
                );
                return r;
            }
        };
        let allowed = inner.auth.writer(req.headers());
        if let Allowed::Nothing(status, why) = allowed {
            let mut r = refuse(status, why);
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
        inner.write(req, write, rest, allowed).await
    }
}

impl Inner {
    /// The `Access-Control-Allow-Origin` for a request from this origin, if it is allowed.
    fn cors(&self, h: &HeaderMap) -> Option<HeaderValue> {
        let origin = h.get(header::ORIGIN)?;
        let o = origin.to_str().ok()?;
        if self.cfg.cors_origins.iter().any(|c| c == "*") {
            return Some(HeaderValue::from_static("*"));
        }
        self.cfg
            .cors_origins
            .iter()
            .any(|c| c.eq_ignore_ascii_case(o))
            .then(|| origin.clone())
    }

    fn preflight(&self, h: &HeaderMap) -> Response<Body> {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::NO_CONTENT;
        let out = r.headers_mut();
        out.insert(
            header::ALLOW,
            HeaderValue::from_static("GET, HEAD, PUT, PATCH, DELETE, OPTIONS"),
        );
        if self.cors(h).is_some() {
            out.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, HEAD, PUT, PATCH, DELETE"),
            );
            out.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static(
                    "authorization, content-type, if-match, if-none-match, last-event-id",
                ),
            );
            out.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static("600"),
            );
        }
        r
    }

    fn get(&self, req: &Request<RequestBody>, id: &str) -> Response<Body> {
        let Some(rec) = self.store.get(id) else {
            return refuse(StatusCode::NOT_FOUND, "no such record");
        };
        let mut head = HeaderMap::new();
        head.insert(header::ETAG, rec.etag.clone());
        let modified = std::time::UNIX_EPOCH + std::time::Duration::from_millis(rec.t);
        head.insert(header::LAST_MODIFIED, crate::http::date::value(modified));
        head.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        head.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let compressible = rec.json.len() >= store::COMPRESS_ABOVE;
        if compressible {
            head.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
        }
        let pre = Preconditions::of(req.headers());
        let outcome = conditional::evaluate(&pre, req.method(), &head, Some(modified));
        if let Some(r) = outcome.response(&head) {
            return r;
        }
        let mut body = rec.json.clone();
        if compressible {
            let accept = AcceptEncoding::parse(req.headers().get(header::ACCEPT_ENCODING));
            // Smallest first: the first the client accepts (identity when none is).
            if let Some((e, b)) = rec.encoded().iter().find(|(e, _)| accept.accepts(*e)) {
                if let Some(v) = e.header_value() {
                    head.insert(header::CONTENT_ENCODING, v);
                }
                body = b.clone();
            }
        }
        head.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        let mut r = Response::new(if req.method() == Method::HEAD {
            Body::empty()
        } else {
            Body::full(body)
        });
        *r.headers_mut() = head;
        r
    }

    fn topic_of(
        &self,
        query: &Query,
        rest: &str,
        read: &Allowed,
    ) -> Result<Arc<fanout::Topic>, Box<Response<Body>>> {
        let pattern = match (query.get("match"), rest) {
            (Some(p), _) => IdPattern::parse(p),
            (None, "") => Ok(IdPattern::all()),
            (None, id) => IdPattern::parse(id),
        }
        .map_err(|e| Box::new(refuse(StatusCode::BAD_REQUEST, &e)))?;
        if !read.pattern(&pattern) {
            return Err(Box::new(refuse(
                StatusCode::FORBIDDEN,
                "the token may not read these ids",
            )));
        }
        let filter = Filter::parse(query.get("filter").unwrap_or(""))
            .map_err(|e| Box::new(refuse(StatusCode::BAD_REQUEST, &e.to_string())))?;
        Ok(self.store.fanout.topic(&pattern, &filter))
    }

    fn list(&self, query: &Query, read: &Allowed) -> Response<Body> {
        let topic = match self.topic_of(query, "", read) {
            Ok(t) => t,
            Err(r) => return *r,
        };
        let (records, seq) = self.store.list(&topic);
        let mut out = format!("{{\"seq\":{seq},\"records\":{{").into_bytes();
        for (i, (id, r)) in records.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(
                serde_json::to_string(&**id)
                    .expect("a string serializes")
                    .as_bytes(),
            );
            out.push(b':');
            out.extend_from_slice(&r.json);
        }
        out.extend_from_slice(b"}}\n");
        let mut r = Response::new(Body::full(out));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        r
    }

    fn subscribe(
        &self,
        req: &Request<RequestBody>,
        query: &Query,
        rest: &str,
        read: &Allowed,
        sink: Option<Sink>,
    ) -> Response<Body> {
        let topic = match self.topic_of(query, rest, read) {
            Ok(t) => t,
            Err(r) => return *r,
        };
        let since = (req.headers().get("last-event-id"))
            .and_then(|v| v.to_str().ok())
            .or(query.get("last-event-id"))
            .or(query.get("since"));
        let since = match since.map(|s| s.trim().parse::<u64>()) {
            None => None,
            Some(Ok(n)) => Some(n),
            Some(Err(_)) => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    "Last-Event-ID is an event's sequence number",
                )
            }
        };
        let init = query.get("init") != Some("0") && query.get("init") != Some("false");
        let start = self.store.subscribe(&topic, since, init);
        // HTTP/1.x: hyper writes the head, then the socket is handed over and the events are
        // written on it directly (see `sse::HandOff`). HTTP/2 and HTTP/3: a streamed body.
        let body = match sink {
            Some(sink) if req.version() <= http::Version::HTTP_11 => {
                let chunked = req.version() == http::Version::HTTP_11;
                let claim = sink.claim_handoff();
                let heartbeat = self.cfg.heartbeat.0;
                tokio::spawn(async move {
                    if let Ok(up) = claim.await {
                        sse::serve_raw(up, start, chunked, heartbeat).await;
                    }
                });
                Body::stream(sse::HandOff::new(sink))
            }
            _ => Body::stream(sse::SseBody::new(start)),
        };
        let mut r = Response::new(body);
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        // nginx in front: do not buffer the stream.
        h.insert("x-accel-buffering", HeaderValue::from_static("no"));
        r
    }

    fn websocket(
        &self,
        req: &Request<RequestBody>,
        sink: Option<Sink>,
        read: Allowed,
    ) -> Response<Body> {
        let h = req.headers();
        let ws = (h.get(header::UPGRADE))
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
        let Some(key) = h.get(header::SEC_WEBSOCKET_KEY).filter(|_| ws) else {
            return refuse(
                StatusCode::BAD_REQUEST,
                "only WebSocket upgrades are served",
            );
        };
        if let Some(r) = not_version_13(h, StatusCode::UPGRADE_REQUIRED) {
            return r;
        }
        let Some(sink) = sink else {
            return refuse(
                StatusCode::BAD_REQUEST,
                "WebSocket is served over HTTP/1.1, and over HTTP/2 as RFC 8441 says (use SSE over HTTP/3)",
            );
        };
        let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
        let claim = sink.claim_upgrade();
        let route = self.ws_route();
        tokio::spawn(async move {
            if let Ok(up) = claim.await {
                ws::session(route, up, read).await;
            }
        });
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let out = r.headers_mut();
        out.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        out.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        out.insert(
            header::SEC_WEBSOCKET_ACCEPT,
            HeaderValue::try_from(accept).expect("base64"),
        );
        r
    }

    /// A WebSocket session on an HTTP/2 stream: 200, then the stream's bytes are the socket's.
    fn websocket_h2(&self, req: &mut Request<RequestBody>, read: Allowed) -> Response<Body> {
        // HTTP/2 has no 426 (nothing to upgrade): a plain 400.
        if let Some(r) = not_version_13(req.headers(), StatusCode::BAD_REQUEST) {
            return r;
        }
        let upgrade = hyper::upgrade::on(req);
        let route = self.ws_route();
        tokio::spawn(async move {
            if let Ok(stream) = upgrade.await {
                let up = crate::upgrade::Upgraded {
                    io: Box::new(hyper_util::rt::TokioIo::new(stream)),
                    read_ahead: bytes::Bytes::new(),
                    permit: None,
                };
                ws::session(route, up, read).await;
            }
        });
        Response::new(Body::empty())
    }

    async fn write(
        &self,
        req: Request<RequestBody>,
        method: Method,
        path: String,
        allowed: Allowed,
    ) -> Response<Body> {
        // The whole path is the record's id, unless a stored record's id is a proper prefix
        // of it: then the rest is a member path of that record (PUT only).
        let (id, member) = if method == Method::PUT && self.store.get(&path).is_none() {
            match self.store.split_member(&path) {
                Some((id, m)) => (id.to_string(), Some(m.to_string())),
                None => (path, None),
            }
        } else {
            (path, None)
        };
        if !allowed.id(&id) {
            return refuse(StatusCode::FORBIDDEN, "the token may not write this id");
        }
        let h = req.headers();
        let cond = Conditions {
            if_match: h.get(header::IF_MATCH).cloned(),
            if_none_match: h.get(header::IF_NONE_MATCH).cloned(),
        };
        let w = if method == Method::DELETE {
            Write::Delete
        } else {
            let max = self.cfg.max_record_size.0 as usize;
            let value = match read_json(req, max).await {
                Ok(v) => v,
                Err(r) => return r,
            };
            match (method, member.as_deref()) {
                (Method::PATCH, _) => Write::Patch(value),
                (_, Some(m)) => Write::Member(m.split('/').map(str::to_string).collect(), value),
                _ => Write::Put(value),
            }
        };
        // Committed changes reach the subscribers and the fleet through the store's observers,
        // in commit order, even if this request is gone by then.
        match self.store.write(&id, w, &cond).await {
            Ok(Written::Deleted) => {
                let mut r = Response::new(Body::empty());
                *r.status_mut() = StatusCode::NO_CONTENT;
                r
            }
            Ok(w) => {
                let (status, rec) = match w {
                    Written::Created(r) => (StatusCode::CREATED, r),
                    Written::Replaced(r) => (StatusCode::OK, r),
                    Written::Deleted => unreachable!("handled above"),
                };
                let body = format!(
                    "{{\"id\":{},\"seq\":{}}}\n",
                    serde_json::to_string(&id).expect("a string serializes"),
                    rec.seq
                );
                let mut r = json_response(status, body);
                r.headers_mut().insert(header::ETAG, rec.etag.clone());
                if status == StatusCode::CREATED {
                    let loc = format!("{}{}", self.prefix_slash(), id);
                    if let Ok(v) = HeaderValue::try_from(loc) {
                        r.headers_mut().insert(header::LOCATION, v);
                    }
                }
                r
            }
            Err(WriteError::NotFound) => refuse(StatusCode::NOT_FOUND, "no such record"),
            Err(WriteError::PreconditionFailed) => {
                refuse(StatusCode::PRECONDITION_FAILED, "precondition failed")
            }
            Err(WriteError::Conflict(at)) => {
                // `at` is where the path met a value that is not an object: empty for the
                // record itself.
                let through = if at.is_empty() {
                    "the record is not an object".to_string()
                } else {
                    format!("its member `{at}` is not an object")
                };
                let member = member.as_deref().unwrap_or_default();
                refuse(
                    StatusCode::CONFLICT,
                    &format!("cannot set member `{member}` of record `{id}`: {through}"),
                )
            }
            Err(WriteError::TooLarge(max)) => refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("a record is at most {max} bytes"),
            ),
            Err(WriteError::Storage) => refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "the change log cannot be written",
            ),
        }
    }

    /// What a WebSocket session needs of the route.
    fn ws_route(&self) -> ws::Route {
        ws::Route {
            store: Arc::clone(&self.store),
            max_message: self.cfg.ws_max_message.0 as usize,
            queue: self.cfg.queue.0 as usize,
            heartbeat: self.cfg.heartbeat.0,
        }
    }

    fn prefix_slash(&self) -> String {
        if self.prefix.ends_with('/') {
            self.prefix.clone()
        } else {
            format!("{}/", self.prefix)
        }
    }
}

/// Reads a JSON body of at most `max` bytes (413 beyond, before reading more).
async fn read_json(req: Request<RequestBody>, max: usize) -> Result<Value, Response<Body>> {
    let too_large = || {
        refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("a record is at most {max} bytes"),
        )
    };
    let declared = (req.headers().get(header::CONTENT_LENGTH))
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    let mut body = req.into_body();
    let mut buf = Vec::with_capacity(declared.unwrap_or(0) as usize);
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "the body could not be read",
            ));
        };
        if let Some(d) = frame.data_ref() {
            if buf.len() + d.len() > max {
                return Err(too_large());
            }
            buf.extend_from_slice(d);
        }
    }
    serde_json::from_slice(&buf)
        .map_err(|e| refuse(StatusCode::BAD_REQUEST, &format!("invalid JSON: {e}")))
}

fn demo_page() -> Response<Body> {
    crate::http::page_response(
        DEMO,
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
         connect-src 'self'",
    )
}

/// The push stores of one server's routes: what its admin API's status and `/metrics` show
/// (another server in the process has its own, with its own routes' stores). Set from
/// [`open_all`] where the server builds its routers, and replaced by each reload with the
/// stores of the configuration it applies (a store is listed once however many routes share
/// its directory, in the order of the directories).
#[derive(Default)]
pub struct Stores(std::sync::Mutex<Vec<Arc<Store>>>);

impl Stores {
    /// The list of `stores` (those [`open_all`] opened for the server's configuration).
    pub fn new(stores: Vec<Arc<Store>>) -> Stores {
        let list = Stores::default();
        list.replace(stores);
        list
    }

    /// Lists `stores` instead (a reload's, once it applies).
    pub fn replace(&self, mut stores: Vec<Arc<Store>>) {
        stores.sort_by(|a, b| a.dir().cmp(b.dir()));
        stores.dedup_by(|a, b| Arc::ptr_eq(a, b));
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = stores;
    }

    fn list(&self) -> Vec<Arc<Store>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The server's push stores, for the admin API's status document: each one's directory,
    /// records, subscriptions, topics, changes, and whether it is shared with the other nodes.
    pub fn status(&self) -> serde_json::Value {
        (self.list().iter())
            .map(|s| {
                serde_json::json!({
                    "dir": s.dir().display().to_string(),
                    "records": s.len(),
                    "subscriptions": s.fanout.subscribers(),
                    "topics": s.fanout.topics(),
                    "changes": s.seq(),
                    "history": s.history().0,
                    "history_bytes": s.history().1,
                    "queued_bytes": s.fanout.held_bytes(),
                    "shared": s.shared(),
                })
            })
            .collect()
    }

    /// The server's push routes' figures for `/metrics`, one sample per store (labelled by
    /// its directory): records held, subscriptions and distinct topics now, changes made.
    pub fn metric_families(&self) -> Vec<crate::metrics::Family> {
        let stores = self.list();
        if stores.is_empty() {
            return Vec::new();
        }
        let family = |name, help, counter, value: &dyn Fn(&Store) -> u64| crate::metrics::Family {
            name,
            help,
            counter,
            samples: (stores.iter())
                .map(|s| (vec![("dir", s.dir().display().to_string())], value(s)))
                .collect(),
        };
        vec![
            family(
                "larder_push_records",
                "Records a push route holds.",
                false,
                &|s| s.len() as u64,
            ),
            family(
                "larder_push_subscriptions",
                "Subscriptions open now (SSE streams and WebSocket subscriptions).",
                false,
                &|s| s.fanout.subscribers() as u64,
            ),
            family(
                "larder_push_topics",
                "Distinct patterns and filters subscribed to now.",
                false,
                &|s| s.fanout.topics() as u64,
            ),
            family(
                "larder_push_changes",
                "Changes made to a push route's records (its sequence number).",
                true,
                &|s| s.seq(),
            ),
            family(
                "larder_push_history_changes",
                "Changes a push route's history holds for resuming subscribers.",
                false,
                &|s| s.history().0 as u64,
            ),
            family(
                "larder_push_history_bytes",
                "Bytes of the values a push route's history holds (bounded by history_bytes).",
                false,
                &|s| s.history().1,
            ),
            family(
                "larder_push_queued_bytes",
                "Bytes of events a push route's subscribers have not read yet (bounded per topic by queue_bytes).",
                false,
                &|s| s.fanout.held_bytes(),
            ),
        ]
    }
}
