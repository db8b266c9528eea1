//! Starting and stopping: the runtime `main` runs on, [`start`] (the fleet's connection and the
//! cache opened once and handed to every router, every listener bound, the per-core worker
//! threads, the admin listener, the background services) and the [`Handle`] that shuts it all
//! down.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use super::background::Background;
use super::connection::connection_builder;
use super::listen::{accept_loop, bind, bind_std, Serving};
use super::reload::{Reloader, RouterParts, Slot};
use crate::cache::Cache;
use crate::clock::Clock;
use crate::config::{Config, Layout, ServerConfig};
use crate::fleet::Fleet;
use crate::interim;
use crate::memory::return_freed_memory;
use crate::route::{LiveRouter, Router};
use crate::tls;

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("listener {addr}: {source}")]
    Tls {
        addr: SocketAddr,
        source: tls::Error,
    },
    #[error("{0}")]
    AccessLog(String),
    #[error("{0}")]
    Tracing(String),
    #[error("{0}")]
    Pool(String),
    #[error("{0}")]
    Push(String),
    #[error("{0}")]
    Cache(#[from] crate::cache::tiers::OpenError),
    #[error("{0}")]
    Fleet(#[from] crate::fleet::OpenError),
}

/// A running larder: its bound addresses, its cache, and the way to stop it.
pub struct Handle {
    /// Bound address of each configured listener, in configuration order.
    pub addrs: Vec<SocketAddr>,
    /// Bound address of the admin API listener, when configured.
    pub admin_addr: Option<SocketAddr>,
    pub cache: Arc<Cache>,
    /// What each listener's routes serve (host, prefix, handler), for the startup banner: their
    /// descriptions, not the routers, which a reload must be able to drop (with every route's
    /// memory: kept decoded originals, the hits index, the transform pool).
    pub routes: Vec<Vec<(String, String, String)>>,
    shutdown: watch::Sender<bool>,
    conns: Arc<Semaphore>,
    max_conns: usize,
    grace: Duration,
    interim_dropped: interim::Dropped,
    background: Background,
    /// Each TLS listener's acceptor, in configuration order.
    tls: Vec<Arc<tls::Acceptor>>,
    /// Requests counted (when there is an admin listener to read them from).
    metrics: Option<Arc<crate::metrics::Metrics>>,
    pools: SharedPools,
    reloader: Arc<Reloader>,
    /// The access log, when configured (its writer stops once the last handle is gone).
    access_log: Option<Arc<crate::access_log::AccessLog>>,
    /// The span exporter, when configured: what it holds is sent at shutdown.
    spans: Option<Arc<crate::otel::Spans>>,
}

impl Handle {
    /// Stops accepting, lets in-flight requests finish for up to the grace period, and returns
    /// the number of connections still open when it gave up (0 when all closed in time). The
    /// background services stop too.
    pub async fn shutdown(self) -> usize {
        let _ = self.shutdown.send(true);
        let deadline = tokio::time::Instant::now() + self.grace;
        let open = loop {
            let open = self.max_conns - self.conns.available_permits();
            if open == 0 || tokio::time::Instant::now() >= deadline {
                break open;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        self.background.stop(deadline).await;
        // What the disk tier was given is written before the process goes.
        self.cache.flush().await;
        if let Some(spans) = self.spans {
            let _ = tokio::task::spawn_blocking(move || spans.shutdown()).await;
        }
        open
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.max_conns - self.conns.available_permits()
    }

    /// Interim (1xx) responses from origins dropped so far at the bounds of
    /// [`super::interim`] (too many for one request, or a client not reading).
    pub fn interim_dropped(&self) -> u64 {
        self.interim_dropped.load(Ordering::Relaxed)
    }

    /// The metrics in Prometheus text format, as `/metrics` serves them (None: not counted,
    /// there is no admin listener).
    pub fn metrics_text(&self) -> Option<String> {
        self.metrics.as_ref().map(|m| m.render())
    }

    /// Access log lines dropped so far (None: no access log).
    pub fn access_log_dropped(&self) -> Option<u64> {
        self.access_log.as_ref().map(|l| l.dropped())
    }

    /// TLS handshakes so far, by outcome, over every TLS listener.
    pub fn tls_counts(&self) -> tls::Counts {
        (self.tls.iter()).fold(tls::Counts::default(), |sum, a| sum + a.counters.snapshot())
    }

    /// Each ACME listener's state, in configuration order.
    pub fn acme_status(&self) -> Vec<tls::acme::AcmeStatus> {
        (self.tls.iter())
            .filter_map(|a| a.acme.as_ref().map(|m| m.status()))
            .collect()
    }

    /// Re-reads every TLS listener's certificates now (as a change of their files does):
    /// new connections get the new ones. On error the certificates in use stay.
    pub fn reload_certificates(&self) -> Result<(), tls::Error> {
        self.tls.iter().try_for_each(|a| a.certs.reload())
    }

    /// Applies a new configuration while serving (see [`Reloader::reload`]): what needs a
    /// restart to apply, or why it was refused (nothing changed then).
    pub fn reload(&self, config: Config) -> Result<Vec<String>, String> {
        self.reloader.reload(config)
    }

    /// Reads the configuration file again and applies it (SIGHUP, `larder reload`).
    pub fn reload_from_file(&self) -> Result<Vec<String>, String> {
        self.reloader.reload_from_file()
    }

    /// Whether larder runs from a configuration file (which a reload reads again).
    pub fn has_config_file(&self) -> bool {
        self.reloader.path().is_some()
    }

    /// Bound addresses of the listeners now (after reloads), in configuration order.
    pub fn listener_addrs(&self) -> Vec<SocketAddr> {
        self.reloader.addrs()
    }

    /// Every upstream pool's state: its backends' health and counts (as the admin API's
    /// status shows it).
    pub fn pools_status(&self) -> serde_json::Value {
        self.pools.read().expect("not poisoned").status()
    }

    /// The background services running beside the connections, by name.
    pub fn background_services(&self) -> Vec<&'static str> {
        self.background.names().collect()
    }
}

/// Binds every listener of `config` and starts serving on the current tokio runtime.
///
/// With `threading = "per-core"` and more than one worker, the current runtime is worker 0 and
/// `workers - 1` more threads are started, each running a single-threaded runtime with its own
/// `SO_REUSEPORT` socket on every listener address; the cache, routes, connection bound and
/// shutdown signal are shared. Those threads end after shutdown (or when the [`Handle`] is
/// dropped) once the open connections drained or the grace period is over.
pub async fn start(config: Config) -> Result<Handle, Error> {
    start_with(config, Clock::system()).await
}

/// [`start`], with the cache (and every handler through it) reading freshness, age and the
/// stale windows on `clock`: a test hands in a [`Clock::adjustable`] and moves it forward.
pub async fn start_with(config: Config, clock: Clock) -> Result<Handle, Error> {
    let shared = Shared::build(&config, clock).await?;
    let (serving, shutdown) = serving(&config.server);
    let interim_dropped = Arc::clone(&serving.builder.interim_dropped);
    let Listeners {
        addrs,
        mut routers,
        slots,
    } = bind_listeners(&config, &shared, &serving)?;
    spawn_workers(&addrs, &slots, &serving)?;
    let tls_acceptors: Vec<Arc<tls::Acceptor>> =
        shared.acceptors.iter().flatten().cloned().collect();
    let mut background = background_services(&shared, &serving);
    let max_conns = serving.server.max_connections.get() as usize;
    if let Some(m) = &shared.metrics {
        let (cache, conns, dropped) = (&shared.cache, &serving.conns, &interim_dropped);
        let refused = &serving.builder.proxy_refused;
        super::gauges::register(m, cache, conns, max_conns, dropped, refused, &tls_acceptors);
        super::gauges::register_families(m, cache, &shared.pools, &shared.push, &shared.access_log);
    }
    let (admin, watch_config) = (config.admin.clone(), config.server.watch_config.0);
    let reloader = Arc::new(Reloader::new(
        config,
        slots,
        shared.router_parts(),
        serving.clone(),
    ));
    if !watch_config.is_zero() && reloader.path().is_some() {
        let r = Arc::clone(&reloader);
        background.register(
            "reload on a change of the configuration file",
            move |stop| watch_config_file(r, watch_config, stop),
        );
    }
    let mut admin_addr = None;
    if let Some(addr) = admin.listen {
        let api = admin_api(admin.token, &shared, &tls_acceptors, &reloader, &serving);
        background.register("dashboard history", api.history_sampler());
        let (bound, router) = listen_admin(addr, api, &serving)?;
        admin_addr = Some(bound);
        routers.push(router);
    }
    Ok(Handle {
        addrs,
        admin_addr,
        cache: shared.cache,
        routes: routers.iter().map(|r| r.describe()).collect(),
        shutdown,
        conns: Arc::clone(&serving.conns),
        max_conns,
        grace: serving.server.shutdown_grace.0,
        interim_dropped,
        background,
        tls: tls_acceptors,
        metrics: shared.metrics,
        access_log: shared.access_log,
        spans: shared.spans,
        pools: shared.pools,
        reloader,
    })
}

/// What the listeners' routers, the admin API and the [`Handle`] share, built from the
/// configuration before any socket is bound.
struct Shared {
    cache: Arc<Cache>,
    /// The fleet's Redis (`[cache.shared]`), opened once here and handed to the cache, and to
    /// images and push through every router built (a reload keeps it).
    fleet: Option<Arc<Fleet>>,
    pools: SharedPools,
    /// Push routes' stores, opened here so that a bad directory is an error now: this server's
    /// own list (its status and metrics show these, not other servers' in the process),
    /// replaced by each reload.
    push: Arc<crate::push::Stores>,
    /// Requests are counted when there is an admin listener to read the counts from.
    metrics: Option<Arc<crate::metrics::Metrics>>,
    access_log: Option<Arc<crate::access_log::AccessLog>>,
    spans: Option<Arc<crate::otel::Spans>>,
    /// HTTP-01 answers of ACME orders, served by every plain listener.
    http01: Arc<tls::acme::Http01>,
    /// The named switches rules answer by (the admin API turns them), kept across reloads.
    switches: Arc<crate::admin::Switches>,
    kept: Arc<crate::rules::Kept>,
    /// Each listener's TLS acceptor (None: plain), in configuration order.
    acceptors: Vec<Option<Arc<tls::Acceptor>>>,
}

impl Shared {
    /// Opens the fleet's connection and the cache, builds the pools, opens the push stores, starts the access log and the
    /// span exporter, and loads every listener's certificates: each error is reported now.
    async fn build(config: &Config, clock: Clock) -> Result<Shared, Error> {
        let fleet = match &config.cache.shared {
            Some(s) => Some(Fleet::start(s).await?),
            None => None,
        };
        let cache = Cache::open(
            config.cache.clone(),
            config.compression.clone(),
            clock,
            fleet.clone(),
        )
        .await?;
        let pools = crate::upstream::Pools::build(&config.pools, None).map_err(Error::Pool)?;
        let push = crate::push::open_all(config).map_err(Error::Push)?;
        let push = Arc::new(crate::push::Stores::new(push));
        let pools = Arc::new(std::sync::RwLock::new(pools));
        let metrics = config.admin.listen.map(|_| crate::metrics::Metrics::new());
        let access_log = match &config.access_log {
            Some(cfg) => Some(crate::access_log::AccessLog::start(cfg).map_err(Error::AccessLog)?),
            None => None,
        };
        let spans = match &config.tracing {
            Some(cfg) => Some(crate::otel::Spans::start(cfg).map_err(Error::Tracing)?),
            None => None,
        };
        let http01 = Arc::new(tls::acme::Http01::default());
        let mut acceptors = Vec::new();
        for l in &config.listeners {
            let tls = match &l.tls {
                Some(cfg) => Some(Arc::new(tls::Acceptor::new(cfg, &http01).map_err(
                    |source| Error::Tls {
                        addr: l.addr,
                        source,
                    },
                )?)),
                None => None,
            };
            acceptors.push(tls);
        }
        Ok(Shared {
            cache,
            fleet,
            pools,
            push,
            metrics,
            access_log,
            spans,
            http01,
            switches: Arc::default(),
            kept: Arc::default(),
            acceptors,
        })
    }

    /// What a listener's router is built from (here, and by each reload).
    fn router_parts(&self) -> RouterParts {
        RouterParts {
            cache: Arc::clone(&self.cache),
            fleet: self.fleet.clone(),
            pools: Arc::clone(&self.pools),
            metrics: self.metrics.clone(),
            push: Arc::clone(&self.push),
            access_log: self.access_log.clone(),
            spans: self.spans.clone(),
            http01: Arc::clone(&self.http01),
            switches: Arc::clone(&self.switches),
            kept: Arc::clone(&self.kept),
        }
    }
}

/// What every accept loop is handed: the connection builder, the server's settings, the bound
/// on open connections, and the shutdown signal (with its sender, which [`Handle`] keeps).
fn serving(server: &ServerConfig) -> (Serving, watch::Sender<bool>) {
    let server = Arc::new(server.clone());
    let conns = Arc::new(Semaphore::new(server.max_connections.get() as usize));
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let builder = connection_builder(&server);
    let serving = Serving {
        builder: Arc::new(builder),
        server,
        conns,
        shutdown: shutdown_rx,
    };
    (serving, shutdown_tx)
}

/// Binds every listener of `config` (its HTTP/3 endpoint too, when it has one), builds its
/// router and spawns its accept loop on the current runtime.
fn bind_listeners(config: &Config, shared: &Shared, serving: &Serving) -> Result<Listeners, Error> {
    let server = &serving.server;
    let reuse_port = extra_threads(server) > 0;
    let parts = shared.router_parts();
    let (mut addrs, mut routers, mut slots) = (Vec::new(), Vec::new(), Vec::new());
    for (l, tls) in config.listeners.iter().zip(&shared.acceptors) {
        let listener = bind(l.addr, reuse_port).map_err(|source| Error::Bind {
            addr: l.addr,
            source,
        })?;
        let bound = listener.local_addr().map_err(|source| Error::Bind {
            addr: l.addr,
            source,
        })?;
        addrs.push(bound);
        let h3 = match tls
            .as_ref()
            .filter(|_| l.tls.as_ref().is_some_and(|t| t.http3))
        {
            Some(tls) => {
                let endpoint =
                    super::h3::bind(bound, tls, server.idle_timeout.0).map_err(|message| {
                        Error::Bind {
                            addr: bound,
                            source: io::Error::other(format!("HTTP/3 (UDP): {message}")),
                        }
                    })?;
                let alt_svc = format!("h3=\":{}\"; ma=86400", bound.port());
                Some((
                    endpoint,
                    http::HeaderValue::try_from(alt_svc).expect("a valid field"),
                ))
            }
            None => None,
        };
        let alt_svc = h3.as_ref().map(|(_, v)| v.clone());
        let router = Arc::new(parts.router(l, config, bound, alt_svc.as_ref()));
        let live: LiveRouter = crate::route::Live::new(Arc::clone(&router));
        if let Some((endpoint, _)) = h3 {
            tokio::spawn(super::h3::serve(
                endpoint,
                Arc::clone(&live),
                Arc::clone(&serving.conns),
                server.max_headers.get() as usize,
                serving.shutdown.clone(),
            ));
        }
        routers.push(router);
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(accept_loop(
            listener,
            Arc::clone(&live),
            serving.clone(),
            tls.clone(),
            stopped,
        ));
        slots.push(Slot {
            addr: l.addr,
            bound,
            live,
            tls: tls.clone(),
            alt_svc,
            stop,
        });
    }
    Ok(Listeners {
        addrs,
        routers,
        slots,
    })
}

/// The listeners [`bind_listeners`] started, each in configuration order.
struct Listeners {
    /// Their bound addresses.
    addrs: Vec<SocketAddr>,
    routers: Vec<Arc<Router>>,
    /// What a reload replaces.
    slots: Vec<Slot>,
}

/// Per-core worker threads beside the current one (worker 0): `workers - 1` with `per-core`
/// threads, none work-stealing.
fn extra_threads(server: &ServerConfig) -> usize {
    match server.layout() {
        Layout::PerCore => server.worker_count().saturating_sub(1),
        Layout::WorkStealing => 0,
    }
}

/// Starts the per-core worker threads beyond worker 0, each with its own `SO_REUSEPORT`
/// socket on every listener's address (bound here, so that errors are reported by `start`).
fn spawn_workers(addrs: &[SocketAddr], slots: &[Slot], serving: &Serving) -> Result<(), Error> {
    for i in 1..=extra_threads(&serving.server) {
        // Bind on this thread so that errors are reported by `start`.
        let mut listeners = Vec::with_capacity(addrs.len());
        for slot in slots {
            let std = bind_std(slot.bound, true).map_err(|source| Error::Bind {
                addr: slot.bound,
                source,
            })?;
            let stopped = slot.stop.subscribe();
            listeners.push((std, Arc::clone(&slot.live), slot.tls.clone(), stopped));
        }
        let serving = serving.clone();
        std::thread::Builder::new()
            .name(format!("larder-worker-{i}"))
            .spawn(move || run_worker(listeners, serving))
            .map_err(|source| Error::Bind {
                addr: addrs[0],
                source,
            })?;
    }
    Ok(())
}

/// The background services every server runs (returning freed memory), and those its TLS
/// listeners and access log ask for (ACME renewals, re-reading certificates, reopening the
/// log's file). Watching the configuration file is added once the reloader exists.
fn background_services(shared: &Shared, serving: &Serving) -> Background {
    let mut background = Background::new(serving.shutdown.clone());
    background.register("return freed memory", return_freed_memory);
    for a in shared.acceptors.iter().flatten() {
        if let Some(acme) = &a.acme {
            let (acme, every) = (Arc::clone(acme), acme.check_interval());
            background.register("acme", move |stop| tls::acme::run(acme, every, stop));
        }
        if !a.watch_interval.is_zero() {
            let (certs, every) = (Arc::clone(&a.certs), a.watch_interval);
            background.register("re-read certificates", move |stop| {
                tls::watch(certs, every, stop)
            });
        }
    }
    if let Some(log) = &shared.access_log {
        let log = Arc::clone(log);
        background.register("access log reopen on SIGUSR1", move |stop| {
            reopen_on_usr1(log, stop)
        });
    }
    background
}

/// The admin API: purge and status over the cache, guarded by `token`, with the server's
/// status, reloads of the configuration file and the draining of backends.
fn admin_api(
    token: Option<String>,
    shared: &Shared,
    tls: &[Arc<tls::Acceptor>],
    reloader: &Arc<Reloader>,
    serving: &Serving,
) -> crate::admin::Admin {
    let max_conns = serving.server.max_connections.get() as usize;
    let info = server_info(&serving.conns, max_conns, tls, &shared.pools, &shared.push);
    let text = Arc::clone(reloader);
    let reload = Arc::clone(reloader);
    let reload: crate::admin::ReloadFn = Arc::new(move || {
        let r = Arc::clone(&reload);
        Box::pin(async move { r.reload_from_file() })
    });
    crate::admin::Admin::new(Arc::clone(&shared.cache), token, shared.metrics.clone())
        .with_server(info, Arc::new(move || text.text()))
        .with_reload(reload)
        .with_switches(Arc::clone(&shared.switches))
        .with_config_file(reloader.path(), &serving.server.state_dir)
        .with_drain({
            let pools = Arc::clone(&shared.pools);
            Arc::new(move |pool: &str, backend: &str, drain: bool| {
                pools
                    .read()
                    .expect("not poisoned")
                    .drain(pool, backend, drain)
            })
        })
}

/// Reloads the configuration when its file changes (its length or modification time), checked
/// every `every`. A file that does not load is logged and the running configuration stays.
async fn watch_config_file(
    reloader: Arc<Reloader>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let Some(path) = reloader.path() else { return };
    let stamp = |p: &std::path::Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| (m.len(), m.modified().ok()))
    };
    let mut seen = stamp(&path);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        let now = stamp(&path);
        if now == seen {
            continue;
        }
        seen = now;
        match reloader.reload_from_file() {
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "configuration file changed but does not load; the running configuration stays")
            }
        }
    }
}

/// A listener as a per-core worker serves it: its own socket, the listener's live router and
/// TLS, and the switch that stops it.
type WorkerListener = (
    std::net::TcpListener,
    LiveRouter,
    Option<Arc<tls::Acceptor>>,
    watch::Receiver<bool>,
);

/// A per-core worker thread: a single-threaded runtime serving its own sockets until shutdown
/// (or until the [`Handle`] is dropped), then until this process's connections drain or the
/// grace period ends: dropping the runtime earlier would cut this thread's connections short.
fn run_worker(listeners: Vec<WorkerListener>, serving: Serving) {
    let rt = match per_core_builder().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start worker runtime");
            return;
        }
    };
    rt.block_on(async move {
        for (std, router, tls, stopped) in listeners {
            match TcpListener::from_std(std) {
                Ok(l) => {
                    tokio::spawn(accept_loop(l, router, serving.clone(), tls, stopped));
                }
                Err(e) => tracing::error!(error = %e, "cannot register listener"),
            }
        }
        let (server, conns) = (&serving.server, &serving.conns);
        let mut stop = serving.shutdown.clone();
        while !*stop.borrow_and_update() {
            if stop.changed().await.is_err() {
                break;
            }
        }
        let deadline = tokio::time::Instant::now() + server.shutdown_grace.0;
        while conns.available_permits() < server.max_connections.get() as usize
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
}

/// The admin API's listener (`[admin] listen`): its own socket and router, served like any
/// listener on the current runtime.
fn listen_admin(
    addr: SocketAddr,
    admin: crate::admin::Admin,
    serving: &Serving,
) -> Result<(SocketAddr, Arc<Router>), Error> {
    let listener = bind(addr, false).map_err(|source| Error::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| Error::Bind { addr, source })?;
    let router = Arc::new(Router::admin(admin));
    tokio::spawn(accept_loop(
        listener,
        crate::route::Live::new(Arc::clone(&router)),
        serving.clone(),
        None,
        serving.shutdown.clone(),
    ));
    Ok((bound, router))
}

/// The server's part of the admin API's status: uptime, connections, TLS handshakes, ACME,
/// pools, push routes.
fn server_info(
    conns: &Arc<Semaphore>,
    max_conns: usize,
    tls: &[Arc<tls::Acceptor>],
    pools: &SharedPools,
    push: &Arc<crate::push::Stores>,
) -> crate::admin::ServerInfo {
    let (conns, tls, started) = (Arc::clone(conns), tls.to_vec(), std::time::Instant::now());
    let (pools, push) = (Arc::clone(pools), Arc::clone(push));
    Arc::new(move || {
        let c = (tls.iter()).fold(tls::Counts::default(), |s, a| s + a.counters.snapshot());
        let unix = |t: Option<std::time::SystemTime>| {
            t.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs())
        };
        let acme: Vec<serde_json::Value> = (tls.iter())
            .filter_map(|a| a.acme.as_ref())
            .map(|a| {
                let s = a.status();
                serde_json::json!({
                    "domain": a.domain(), "orders": s.orders, "obtained": s.obtained,
                    "failures": s.failures, "not_after": unix(s.not_after),
                    "last_error": s.last_error,
                })
            })
            .collect();
        serde_json::json!({
            "uptime_seconds": started.elapsed().as_secs(),
            "connections": { "open": max_conns - conns.available_permits(), "max": max_conns },
            "tls": {
                "handshakes": c.handshakes, "failed": c.failed,
                "timed_out": c.timed_out, "plain_http": c.plain_http,
            },
            "acme": acme,
            "pools": pools.read().expect("not poisoned").status(),
            "push": push.status(),
        })
    })
}

/// The running pools, replaced whole by a reload.
type SharedPools = Arc<std::sync::RwLock<crate::upstream::Pools>>;

/// Reopens the access log's file at each SIGUSR1 (after logrotate moved it).
async fn reopen_on_usr1(
    log: Arc<crate::access_log::AccessLog>,
    mut shutdown: watch::Receiver<bool>,
) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut usr1) = signal(SignalKind::user_defined1()) else {
        tracing::warn!("cannot watch SIGUSR1: the access log is not reopened on it");
        return;
    };
    loop {
        tokio::select! {
            _ = usr1.recv() => log.reopen(),
            _ = shutdown.changed() => return,
        }
    }
}

/// How long an idle blocking-pool thread lives when one worker serves everything (tokio's
/// default is 10 s).
///
/// While a process has a single thread, the kernel looks its file descriptors up without
/// touching the file's reference count; with any second thread, every `recv` and `sendmsg`
/// takes and drops a reference on the socket's `struct file`, which at thousands of
/// connections is a cache miss per system call. The static files' re-stat (once a second per
/// path) and the return of freed memory (at most once a second) each wake a blocking thread
/// that would otherwise stay for 10 s, so a lone worker would never be alone. Measured at
/// 10,000 connections (100-byte static file, `perf`): `fdget` 236 ns per request against the
/// single-threaded ceiling's 63; with the short keep-alive, 0.2-0.3 µs less server CPU per
/// request (docs/design.md "Threads"). Respawning a thread costs tens of µs once a second.
const LONE_WORKER_BLOCKING_KEEP_ALIVE: Duration = Duration::from_millis(20);

/// I/O events a worker takes from the kernel at a time (tokio's default: 1,024). At thousands
/// of busy connections one `epoll_wait` returned ~60 ready sockets; each wakeup touches the
/// connection's task header and its socket's readiness record, and by the time the 60th task
/// ran, the lines its wakeup had touched were out of the cache again. In batches of 32 they
/// are still there. Measured (one worker, `wrk -t1`, 100-byte static page, alternating
/// rounds, docs/design.md "Threads"): 10,000 connections 11.24 -> 10.60 µs per request
/// (median of 4, lower in 4 of 4); 1,000: 7.70-7.92 -> 7.25-7.63; /ping at 100: no change.
/// Per-core workers only: the work-stealing runtime keeps tokio's default (not measured).
pub const IO_EVENTS_PER_TICK: usize = 32;

/// A per-core worker's single-threaded runtime (worker 0's, built by [`runtime`], and each
/// further worker's, in `run_worker`).
fn per_core_builder() -> tokio::runtime::Builder {
    let mut b = tokio::runtime::Builder::new_current_thread();
    b.max_io_events_per_tick(IO_EVENTS_PER_TICK).enable_all();
    b
}

/// Builds the runtime `main` runs [`start`] on: per-core (`threading = "per-core"`, or `auto`
/// with one worker) a single-threaded runtime (worker 0; `start` adds the others), work-stealing
/// one multi-threaded runtime with `workers` threads.
pub fn runtime(cfg: &ServerConfig) -> io::Result<tokio::runtime::Runtime> {
    match cfg.layout() {
        Layout::PerCore => {
            let mut b = per_core_builder();
            if cfg.worker_count() == 1 {
                b.thread_keep_alive(LONE_WORKER_BLOCKING_KEEP_ALIVE);
            }
            b.build()
        }
        Layout::WorkStealing => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(cfg.worker_count());
            // Connections woken beyond a worker's local queue (256 tasks) wait in the global
            // queue; tokio checks it every 31 polls by default, which starves those connections
            // at 1,000+ clients (p99 150 ms and more while p50 is 2 ms). Checking it every
            // couple of polls keeps service fair: see docs/design.md, "Fairness".
            b.global_queue_interval(cfg.global_queue_interval.get() as u32);
            b.enable_all().build()
        }
    }
}

/// A future that resolves when SIGTERM or SIGINT arrives. The handlers are installed by this
/// call, not at the first poll: a signal that comes right after (once the service manager was
/// told larder is ready) is caught, not left to its default action of ending the process.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    async move {
        tokio::select! {
            _ = int.recv() => {},
            _ = term.recv() => {},
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn background_services_run_until_shutdown() {
        let cfg = Config::parse(
            "[[listener]]\naddr = \"127.0.0.1:0\"\n  [[listener.route]]\n  respond = { body = \"x\" }\n",
            "t",
        )
        .unwrap();
        let handle = start(cfg).await.unwrap();
        assert_eq!(handle.background_services(), ["return freed memory"]);
        let stopped = tokio::time::timeout(Duration::from_secs(5), handle.shutdown()).await;
        assert_eq!(stopped.expect("shutdown is prompt"), 0);
    }
}
