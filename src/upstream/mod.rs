//! Upstream pools: the backends a proxy route sends to, how one is chosen for a request
//! (`balance.rs`), whether each is fit to take it (active checks in `health.rs`, passive
//! ejection from real requests' failures here), the retry of a failed idempotent request on
//! another backend or, after a pooled connection's close, on a new one; the pool's connections
//! (`connect.rs`: larder's own HTTP/1.1 ones in `h1.rs`, TLS and HTTP/2 through hyper-util;
//! why a send failed in `send_error.rs`, a leaf both clients import) and one exchange with a
//! backend (`exchange.rs`: the request rewritten, timeouts, the response body).
//!
//! ```text
//! send ─▶ choose (balance over backends up, not yet tried) ─▶ exchange ─▶ response
//!            │ none up: backups; none either: every primary (better a try than a 502)
//!            ▼
//!          failed before any response byte, idempotent, no body:
//!            ├─▶ a pooled connection closed first: same backend, new connection (once)
//!            └─▶ tries and time left: counted against the backend (ejected after
//!                max_fails) ─▶ choose again
//! ```
//!
//! Pools are shared by every route that names them and by every worker thread; their state is
//! atomics. [`Pools::build`] keeps a pool whose configuration did not change across a reload,
//! with its connections and health.

mod balance;
pub mod connect;
pub mod exchange;
mod h1;
mod health;
mod send_error;

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{header, request, Request, Response};

use crate::body::Body;
use crate::config::{Balance, HashOn, PassiveConfig, PoolConfig, Upstream};
pub use crate::http::FetchError;
pub use connect::Client;
pub use exchange::{upstream_request, UpstreamBody};

/// The running pools, by name.
#[derive(Clone, Default)]
pub struct Pools(BTreeMap<String, Arc<Pool>>);

impl Pools {
    /// Builds the pools of `cfg`, taking over from `old` every pool whose configuration is
    /// unchanged (its connections and health state with it). Health checks start here (on the
    /// current tokio runtime). An unreadable certificate file is an error naming the pool.
    pub fn build(cfg: &crate::config::pool::Pools, old: Option<&Pools>) -> Result<Pools, String> {
        let mut pools = BTreeMap::new();
        for (name, pc) in cfg {
            let kept = old
                .and_then(|o| o.0.get(name))
                .filter(|p| p.cfg == *pc)
                .cloned();
            let pool = match kept {
                Some(p) => p,
                None => Pool::new(name, pc).map_err(|e| format!("[pool.{name}]: {e}"))?,
            };
            pools.insert(name.clone(), pool);
        }
        Ok(Pools(pools))
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Pool>> {
        self.0.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Pool>> {
        self.0.values()
    }

    /// Every backend's health and counts as metric families (`/metrics`).
    pub fn metric_families(&self) -> Vec<crate::metrics::Family> {
        use crate::metrics::Family;
        if self.0.is_empty() {
            return Vec::new();
        }
        let family = |name, help, counter| Family {
            name,
            help,
            counter,
            samples: Vec::new(),
        };
        let mut up = family(
            "larder_upstream_up",
            "Whether a backend takes requests (1) or is down or ejected (0).",
            false,
        );
        let mut requests = family(
            "larder_upstream_requests",
            "Requests sent to a backend (each try).",
            true,
        );
        let mut failures = family("larder_upstream_failures", "Requests to a backend that failed (connection, timeout, garbage, or a 5xx counted by passive health).", true);
        let mut in_flight = family(
            "larder_upstream_in_flight",
            "Requests in flight to a backend.",
            false,
        );
        let mut errors = family(
            "larder_upstream_errors",
            "A backend's failed exchanges by kind: connect (no connection), timeout (no answer \
             or body in time), 5xx (an answer of 500-599), other (reset, garbage, broken body).",
            true,
        );
        let mut mirrors_dropped = family(
            "larder_upstream_mirrors_dropped",
            "Mirrored requests to a pool dropped because their `mirror` rule's bound was reached.",
            true,
        );
        for p in self.iter() {
            let now = p.now_ms();
            mirrors_dropped.samples.push((
                vec![("pool", p.name.clone())],
                p.mirrors_dropped.load(Ordering::Relaxed),
            ));
            for b in p.backends.iter() {
                let labels = vec![
                    ("pool", p.name.clone()),
                    ("backend", format!("{}://{}", b.url.scheme, b.url.authority)),
                ];
                let h = &b.health;
                let state = h.state(now, &p.cfg.passive);
                up.samples.push((labels.clone(), u64::from(state == "up")));
                requests
                    .samples
                    .push((labels.clone(), h.requests.load(Ordering::Relaxed)));
                failures
                    .samples
                    .push((labels.clone(), h.failures.load(Ordering::Relaxed)));
                for (k, kind) in ERROR_KINDS.iter().enumerate() {
                    let mut labels = labels.clone();
                    labels.push(("kind", kind.to_string()));
                    errors
                        .samples
                        .push((labels, h.errors[k].load(Ordering::Relaxed)));
                }
                in_flight
                    .samples
                    .push((labels, h.inflight.load(Ordering::Relaxed) as u64));
            }
        }
        vec![up, requests, failures, in_flight, errors, mirrors_dropped]
    }

    /// Drains or undrains backend `backend` (its URL) of pool `pool`; an error says which is
    /// unknown.
    pub fn drain(&self, pool: &str, backend: &str, drain: bool) -> Result<(), String> {
        let p = self.get(pool).ok_or_else(|| format!("no pool `{pool}`"))?;
        if p.drain(backend, drain) {
            Ok(())
        } else {
            Err(format!("pool `{pool}` has no backend `{backend}`"))
        }
    }

    /// Every pool's state, for the admin API.
    pub fn status(&self) -> serde_json::Value {
        serde_json::Value::Array(self.iter().map(|p| p.status()).collect())
    }
}

/// A pool of backends.
pub struct Pool {
    name: String,
    cfg: PoolConfig,
    backends: Box<[Backend]>,
    /// (index, weight) of the primaries.
    primaries: Box<[(usize, u32)]>,
    round_robin: balance::RoundRobin,
    backup_round_robin: balance::RoundRobin,
    ring: Option<balance::Ring>,
    rotate: AtomicUsize,
    client: Client,
    /// The zero of the millisecond clock the health atomics count in.
    epoch: Instant,
    checker: Mutex<Option<tokio::task::AbortHandle>>,
    /// Mirrors to this pool dropped because their rule's bound was reached (a `mirror` rule:
    /// docs/rules.md, "Traffic"), for the pool's status.
    mirrors_dropped: AtomicU64,
}

/// One backend and its health.
pub struct Backend {
    pub url: Upstream,
    pub weight: u32,
    pub backup: bool,
    health: Health,
}

impl Backend {
    fn drained(&self) -> bool {
        self.health.drained.load(Ordering::Relaxed)
    }
}

/// A backend's health, shared by every thread: the active checks' verdict, passive ejection
/// (consecutive failures, until when it is out, the probe in progress), and counts.
#[derive(Default)]
struct Health {
    /// Taken out by the operator (the admin API's drain): no new requests, even when every
    /// other backend is down.
    drained: AtomicBool,
    /// The active checks' verdict (up while there are none).
    down: AtomicBool,
    /// Active checks in a row: > 0 passed, < 0 failed.
    streak: AtomicI32,
    /// Consecutive failed requests.
    fails: AtomicU32,
    /// Ejected until this time (pool milliseconds).
    ejected_until: AtomicU64,
    /// When the probe of an ejected backend started (0: none).
    probe_since: AtomicU64,
    inflight: AtomicUsize,
    requests: AtomicU64,
    failures: AtomicU64,
    /// Failed exchanges by kind ([`ERROR_KINDS`]): whatever passive health makes of them
    /// (a 5xx is counted here with `on_5xx` off too). Written on failures only, off the
    /// path of a request that succeeds.
    errors: [AtomicU64; ERROR_KINDS.len()],
}

/// The kinds of a backend's failed exchanges: no connection, no answer in time, a 5xx
/// answer, anything else (a reset, garbage, a body that broke off).
pub const ERROR_KINDS: [&str; 4] = ["connect", "timeout", "5xx", "other"];

/// The [`ERROR_KINDS`] index of a failed exchange.
fn error_kind(e: &FetchError) -> usize {
    match e {
        FetchError::Connect(_) => 0,
        FetchError::Timeout(_) | FetchError::BodyTimeout(_) => 1,
        _ => 3,
    }
}

impl Pool {
    /// Builds a pool (and starts its health checks, if any, on the current runtime).
    pub fn new(name: &str, cfg: &PoolConfig) -> Result<Arc<Pool>, String> {
        let client = Client::new(cfg)?;
        let backends: Box<[Backend]> = (cfg.backends.iter())
            .map(|b| Backend {
                url: b.url.clone(),
                weight: b.weight,
                backup: b.backup,
                health: Health::default(),
            })
            .collect();
        let members = |backup: bool| -> Box<[(usize, u32)]> {
            (backends.iter().enumerate())
                .filter(|(_, b)| b.backup == backup)
                .map(|(i, b)| (i, b.weight))
                .collect()
        };
        let (primaries, backups) = (members(false), members(true));
        let ring = (cfg.balance == Balance::Hash).then(|| {
            let members: Vec<(usize, String, u32)> = (primaries.iter())
                .map(|&(i, w)| (i, backends[i].url.authority.to_string(), w))
                .collect();
            balance::Ring::new(&members)
        });
        let pool = Arc::new(Pool {
            name: name.to_string(),
            round_robin: balance::RoundRobin::new(&primaries),
            backup_round_robin: balance::RoundRobin::new(&backups),
            primaries,
            ring,
            rotate: AtomicUsize::new(0),
            client,
            backends,
            cfg: cfg.clone(),
            epoch: Instant::now(),
            checker: Mutex::new(None),
            mirrors_dropped: AtomicU64::new(0),
        });
        if let Some(h) = &cfg.health {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let task = rt.spawn(health::run(Arc::downgrade(&pool), h.clone()));
                *pool.checker.lock().expect("not poisoned") = Some(task.abort_handle());
            }
        }
        Ok(pool)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Counts a mirror to this pool dropped at its rule's bound; the count so far.
    pub fn mirror_dropped(&self) -> u64 {
        self.mirrors_dropped.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn backends(&self) -> &[Backend] {
        &self.backends
    }

    /// The backends' URLs, for logs and the startup banner.
    pub fn describe(&self) -> String {
        let urls: Vec<String> = (self.backends.iter())
            .map(|b| format!("{}://{}", b.url.scheme, b.url.authority))
            .collect();
        urls.join(", ")
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX) + 1
    }

    /// Sends a client's request (`parts`, `body`; not yet rewritten for a backend) to a
    /// backend of the pool and waits for the response head, within `timeout` (see
    /// [`exchange::send`]). An idempotent request without a body (RFC 9110 §9.2.2) whose
    /// exchange failed before any of a response came back goes again:
    /// - on a new connection to the same backend when a pooled keep-alive connection turned out
    ///   closed or reset by the origin (its idle timeout racing the reuse; nginx does the
    ///   same), once, not counted as the backend's failure;
    /// - else to another backend, up to `retries` more times and while `retry_timeout` lasts.
    ///
    /// Anything else fails at once.
    ///
    /// `parts` is the client's head, owned or lent (a fill lends the client's when it changes
    /// nothing): every try sends a head built from it ([`upstream_request`]).
    ///
    /// A plain fn: the returned future holds the request once (an async fn would keep its
    /// arguments beside its own copy).
    pub fn send<'a, P>(
        self: &'a Arc<Self>,
        parts: P,
        body: Body,
        peer: SocketAddr,
        timeout: Duration,
        body_timeout: Duration,
    ) -> impl Future<Output = Result<Response<UpstreamBody>, FetchError>> + 'a
    where
        P: Borrow<request::Parts> + Send + 'a,
    {
        use http_body::Body as _;
        let retryable = parts.borrow().method.is_idempotent() && body.is_end_stream();
        let key = self.hash_key(parts.borrow(), peer);
        // A retryable request may go again (its body is empty); anything else goes once.
        let mut body = Some(body);
        async move {
            let started = Instant::now();
            let mut tried = balance::BackendSet::default();
            let mut attempt = 0;
            let mut resend: Option<usize> = None;
            loop {
                let fresh = resend.is_some();
                let i = resend
                    .take()
                    .unwrap_or_else(|| self.choose(key.as_deref(), &tried));
                let backend = &self.backends[i];
                let p = upstream_request(parts.borrow(), &backend.url, peer);
                let b = if retryable {
                    Body::empty()
                } else {
                    body.take().expect("once")
                };
                backend.health.inflight.fetch_add(1, Ordering::Relaxed);
                backend.health.requests.fetch_add(1, Ordering::Relaxed);
                let guard = InFlight {
                    pool: Arc::clone(self),
                    backend: i,
                };
                let result = exchange::send(
                    &self.client,
                    Request::from_parts(p, b),
                    timeout,
                    body_timeout,
                    guard,
                    fresh,
                )
                .await;
                let failure = match result {
                    Ok(mut resp) => {
                        resp.extensions_mut()
                            .insert(crate::http::fetch::Upstreamed {
                                addr: Arc::from(backend.url.authority.as_str()),
                                time: started.elapsed(),
                            });
                        if resp.status().is_server_error() {
                            backend.health.errors[2].fetch_add(1, Ordering::Relaxed);
                        }
                        let failed = self.cfg.passive.on_5xx
                            && matches!(resp.status().as_u16(), 500 | 502 | 503 | 504);
                        self.outcome(i, !failed);
                        return Ok(resp);
                    }
                    Err(f) => f,
                };
                if retryable && failure.resend && !fresh {
                    tracing::debug!(pool = %self.name, backend = %backend.url.authority,
                    "pooled connection was closed; sending again on a new one");
                    resend = Some(i);
                    continue;
                }
                let e = failure.error;
                if failure.resend {
                    // Logged here, not by the exchange: it is not sent again.
                    tracing::warn!(error = %e, "upstream request failed");
                }
                if !matches!(e, FetchError::RequestBody(_) | FetchError::RequestTooLarge) {
                    backend.health.errors[error_kind(&e)].fetch_add(1, Ordering::Relaxed);
                    self.outcome(i, false);
                }
                tried.insert(i);
                let more = retryable
                    && attempt < self.cfg.retries.get()
                    && started.elapsed() < self.cfg.retry_timeout.0
                    && tried.len() < self.backends.len()
                    && retry_after(&e);
                if !more {
                    return Err(e);
                }
                tracing::warn!(pool = %self.name, backend = %backend.url.authority, error = %e,
                "retrying on another backend");
                attempt += 1;
            }
        }
    }

    /// What `balance = "hash"` hashes for this request (None: nothing to hash, round-robin).
    fn hash_key(&self, parts: &request::Parts, peer: SocketAddr) -> Option<Vec<u8>> {
        self.ring.as_ref()?;
        match &self.cfg.hash_on {
            HashOn::Uri => {
                let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
                Some(pq.as_bytes().to_vec())
            }
            HashOn::Client => Some(peer.ip().to_string().into_bytes()),
            HashOn::Header(name) => parts.headers.get(name).map(|v| v.as_bytes().to_vec()),
            HashOn::Cookie(name) => cookie(&parts.headers, name).map(|v| v.as_bytes().to_vec()),
        }
    }

    /// The backend for the next try: chosen by the pool's balance among the primaries up and
    /// not yet tried; else a backup; else (every backend down) any primary not yet tried, as
    /// Envoy's panic mode does: a request to a backend thought down may still succeed, a 502
    /// never does.
    fn choose(&self, key: Option<&[u8]>, tried: &balance::BackendSet) -> usize {
        let now = self.now_ms();
        let passive = &self.cfg.passive;
        let ok = |i: usize| !tried.contains(i) && self.backends[i].health.admit(now, passive);
        let chosen = match (self.cfg.balance, &self.ring, key) {
            (Balance::Hash, Some(ring), Some(key)) => ring.pick(key, ok),
            (Balance::LeastConn, _, _) => balance::least_loaded(
                &self.primaries,
                &self.rotate,
                |i| self.backends[i].health.inflight.load(Ordering::Relaxed),
                ok,
            ),
            _ => self.round_robin.pick(ok),
        };
        chosen
            .or_else(|| self.backup_round_robin.pick(ok))
            .or_else(|| {
                tracing::debug!(pool = %self.name, "no backend up: trying one anyway");
                self.round_robin
                    .pick(|i| !tried.contains(i) && !self.backends[i].drained())
            })
            .or_else(|| self.round_robin.pick(|i| !self.backends[i].drained()))
            .or_else(|| self.round_robin.pick(|_| true))
            .unwrap_or(0)
    }

    /// Drains (`true`) or undrains the backend whose URL is `url`: a drained backend gets no
    /// new request (those in flight finish). False when the pool has no such backend.
    pub fn drain(&self, url: &str, drain: bool) -> bool {
        let url = url.trim_end_matches('/');
        let Some(b) = (self.backends.iter())
            .find(|b| format!("{}://{}", b.url.scheme, b.url.authority) == url)
        else {
            return false;
        };
        b.health.drained.store(drain, Ordering::Relaxed);
        tracing::info!(pool = %self.name, backend = %url, drain, "backend drained by the admin API");
        true
    }

    /// A request to backend `i` succeeded or failed.
    fn outcome(&self, i: usize, success: bool) {
        let b = &self.backends[i];
        let h = &b.health;
        let max = self.cfg.passive.max_fails.get() as u32;
        if success {
            let was = h.fails.swap(0, Ordering::Relaxed);
            if max > 0 && was >= max {
                tracing::info!(pool = %self.name, backend = %b.url.authority,
                    "backend answered its probe: back in service");
            }
            h.probe_since.store(0, Ordering::Relaxed);
            return;
        }
        h.failures.fetch_add(1, Ordering::Relaxed);
        let fails = h.fails.fetch_add(1, Ordering::Relaxed) + 1;
        if max > 0 && fails >= max {
            let out = self.cfg.passive.fail_timeout.0;
            let until = self.now_ms() + u64::try_from(out.as_millis()).unwrap_or(u64::MAX);
            h.ejected_until.store(until, Ordering::Relaxed);
            h.probe_since.store(0, Ordering::Relaxed);
            tracing::warn!(pool = %self.name, backend = %b.url.authority, fails,
                "backend ejected for {out:?} after failed requests");
        }
    }

    /// The pool's state: each backend's health and counts.
    pub fn status(&self) -> serde_json::Value {
        let now = self.now_ms();
        let backends: Vec<serde_json::Value> = (self.backends.iter())
            .map(|b| {
                let h = &b.health;
                serde_json::json!({
                    "url": format!("{}://{}", b.url.scheme, b.url.authority),
                    "weight": b.weight,
                    "backup": b.backup,
                    "state": h.state(now, &self.cfg.passive),
                    "in_flight": h.inflight.load(Ordering::Relaxed),
                    "requests": h.requests.load(Ordering::Relaxed),
                    "failures": h.failures.load(Ordering::Relaxed),
                    "errors": (ERROR_KINDS.iter().zip(&h.errors))
                        .map(|(k, n)| (k.to_string(), n.load(Ordering::Relaxed).into()))
                        .collect::<serde_json::Map<String, serde_json::Value>>(),
                    "consecutive_failures": h.fails.load(Ordering::Relaxed),
                })
            })
            .collect();
        serde_json::json!({
            "name": self.name,
            "balance": format!("{:?}", self.cfg.balance),
            "health_checks": self.cfg.health.as_ref().map(|h| format!("{:?}", h.check)),
            "backends": backends,
            "mirrors_dropped": self.mirrors_dropped.load(Ordering::Relaxed),
        })
    }

    /// Each backend's state name (for tests and the admin API): "up", "down" (active checks),
    /// "ejected" (passive), "probing".
    pub fn states(&self) -> Vec<&'static str> {
        let now = self.now_ms();
        (self.backends.iter())
            .map(|b| b.health.state(now, &self.cfg.passive))
            .collect()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some(task) = self.checker.get_mut().ok().and_then(Option::take) {
            task.abort();
        }
    }
}

impl Health {
    /// Whether a request may go to this backend now. An ejected backend whose time out is
    /// over takes one request, its probe (claimed here, by one caller); until that answers,
    /// or if it hangs for as long as an ejection, no other.
    fn admit(&self, now: u64, passive: &PassiveConfig) -> bool {
        if self.down.load(Ordering::Relaxed) || self.drained.load(Ordering::Relaxed) {
            return false;
        }
        let max = passive.max_fails.get() as u32;
        if max == 0 || self.fails.load(Ordering::Relaxed) < max {
            return true;
        }
        if now < self.ejected_until.load(Ordering::Relaxed) {
            return false;
        }
        let since = self.probe_since.load(Ordering::Relaxed);
        let out = u64::try_from(passive.fail_timeout.0.as_millis()).unwrap_or(u64::MAX);
        if since != 0 && now < since.saturating_add(out) {
            return false;
        }
        (self.probe_since)
            .compare_exchange(since, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    fn state(&self, now: u64, passive: &PassiveConfig) -> &'static str {
        let max = passive.max_fails.get() as u32;
        if self.drained.load(Ordering::Relaxed) {
            "drained"
        } else if self.down.load(Ordering::Relaxed) {
            "down"
        } else if max == 0 || self.fails.load(Ordering::Relaxed) < max {
            "up"
        } else if now < self.ejected_until.load(Ordering::Relaxed) {
            "ejected"
        } else {
            "probing"
        }
    }
}

/// A request in flight to a backend, counted until its response body is done with (the
/// pool held: a reload may drop the route while the body still streams).
pub struct InFlight {
    pool: Arc<Pool>,
    backend: usize,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let h = &self.pool.backends[self.backend].health;
        h.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether a failed exchange may be tried again elsewhere: nothing of a response came back
/// (the connection failed, closed or reset, or no head in time).
fn retry_after(e: &FetchError) -> bool {
    matches!(
        e,
        FetchError::Connect(_) | FetchError::Timeout(_) | FetchError::Upstream(_)
    )
}

/// The value of cookie `name` in the request's Cookie fields.
fn cookie<'a>(headers: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
    (headers.get_all(header::COOKIE).iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BackendConfig;
    use balance::BackendSet;

    fn pool(n: usize, cfg: impl FnOnce(&mut PoolConfig)) -> Arc<Pool> {
        let backends = (0..n)
            .map(|i| BackendConfig::new(format!("http://127.0.0.1:{}", 1000 + i).parse().unwrap()))
            .collect();
        let mut c = PoolConfig::of(backends);
        cfg(&mut c);
        Pool::new("t", &c).unwrap()
    }

    #[test]
    fn ejects_after_max_fails_then_probes_once() {
        let p = pool(2, |c| {
            c.passive.fail_timeout = crate::config::Dur(Duration::from_millis(30))
        });
        for _ in 0..3 {
            assert_eq!(p.states()[0], "up");
            p.outcome(0, false);
        }
        assert_eq!(p.states(), ["ejected", "up"]);
        for _ in 0..10 {
            assert_eq!(p.choose(None, &BackendSet::default()), 1);
        }
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(p.states()[0], "probing");
        // One request probes it; the others keep going to the healthy one meanwhile.
        let picks: Vec<usize> = (0..6)
            .map(|_| p.choose(None, &BackendSet::default()))
            .collect();
        assert_eq!(picks.iter().filter(|&&i| i == 0).count(), 1, "{picks:?}");
        p.outcome(0, true);
        assert_eq!(p.states(), ["up", "up"]);
    }

    #[test]
    fn a_failed_probe_ejects_again() {
        let p = pool(2, |c| {
            c.passive.fail_timeout = crate::config::Dur(Duration::from_millis(20))
        });
        for _ in 0..3 {
            p.outcome(0, false);
        }
        std::thread::sleep(Duration::from_millis(30));
        assert!(p.backends[0].health.admit(p.now_ms(), &p.cfg.passive));
        p.outcome(0, false);
        assert_eq!(p.states()[0], "ejected");
    }

    #[test]
    fn all_down_still_tries_and_backups_come_first() {
        let p = pool(2, |c| c.backends[1].backup = true);
        assert_eq!(p.choose(None, &BackendSet::default()), 0);
        for _ in 0..3 {
            p.outcome(0, false);
        }
        assert_eq!(p.choose(None, &BackendSet::default()), 1);
        for _ in 0..3 {
            p.outcome(1, false);
        }
        // Everything is out: a primary is tried anyway.
        assert_eq!(p.choose(None, &BackendSet::default()), 0);
    }

    #[test]
    fn tried_backends_are_skipped() {
        let p = pool(3, |_| {});
        let mut tried = BackendSet::default();
        tried.insert(1);
        for _ in 0..10 {
            let i = p.choose(None, &tried);
            assert_ne!(i, 1);
        }
    }

    /// Tried backends were a `u128` mask: from the 129th on, a backend that failed could be
    /// chosen again for the same request.
    #[test]
    fn tried_backends_are_skipped_beyond_the_128th() {
        let p = pool(200, |_| {});
        let mut tried = BackendSet::default();
        for i in 0..199 {
            tried.insert(i);
        }
        for _ in 0..300 {
            assert_eq!(p.choose(None, &tried), 199);
        }
    }

    #[test]
    fn cookie_values() {
        let mut h = http::HeaderMap::new();
        h.append(header::COOKIE, "a=1; sid=xyz".parse().unwrap());
        assert_eq!(cookie(&h, "sid"), Some("xyz"));
        assert_eq!(cookie(&h, "b"), None);
    }
}
