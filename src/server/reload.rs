//! Reloading the configuration while serving (SIGHUP, `larder reload` through the admin API,
//! or a change of the file when `[server] watch_config` is set): the new file is checked as
//! `larder check` would, then pools (those unchanged kept, with their connections and health),
//! routes and listeners are swapped; certificates are re-read. A request in flight finishes
//! on the router it started with (each request loads its listener's router once); the cache
//! and its contents stay, and so does the fleet's connection (new routers get the same one). A
//! listener whose address is gone stops accepting and its connections drain; a new address is
//! bound before anything is swapped, so a reload that cannot bind changes nothing.
//!
//! What a running process cannot change (`[server]`, `[cache]`, `[compression]`, `[admin]`,
//! `[access_log]`, `[tracing]`, a listener's TLS settings) is kept as it runs, and named in the answer as
//! needing a restart.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use http::HeaderValue;
use tokio::sync::watch;

use super::listen::{accept_loop, bind, Serving};
use crate::cache::Cache;
use crate::config::{Config, Layout, ListenerConfig};
use crate::fleet::Fleet;
use crate::route::{LiveRouter, Router};
use crate::tls;
use crate::upstream::Pools;

/// What every router is built with, beside its listener's configuration.
pub(super) struct RouterParts {
    pub cache: Arc<Cache>,
    /// The fleet's Redis (`[cache.shared]`), opened once at start: the cache's shared tier,
    /// images' originals and push's replicated logs go through this one, across reloads.
    pub fleet: Option<Arc<Fleet>>,
    pub pools: Arc<RwLock<Pools>>,
    pub metrics: Option<Arc<crate::metrics::Metrics>>,
    /// The server's list of its push routes' stores, replaced when a reload's routers are.
    pub push: Arc<crate::push::Stores>,
    /// The access log, when there is one.
    pub access_log: Option<Arc<crate::access_log::AccessLog>>,
    /// The span exporter, when requests are traced.
    pub spans: Option<Arc<crate::otel::Spans>>,
    pub http01: Arc<tls::acme::Http01>,
    /// The named switches rules answer by, the same across reloads.
    pub switches: Arc<crate::admin::Switches>,
    /// Limits' state, kept across reloads for the rules that did not change.
    pub kept: Arc<crate::rules::Kept>,
}

impl RouterParts {
    /// The router of listener `l` of `config`, bound at `bound`.
    pub fn router(
        &self,
        l: &ListenerConfig,
        config: &Config,
        bound: SocketAddr,
        alt_svc: Option<&HeaderValue>,
    ) -> Router {
        let pools = self.pools.read().expect("not poisoned");
        let env = crate::rules::Env {
            pools: &pools,
            fleet: self.fleet.as_ref(),
            clock: self.cache.clock(),
            switches: &self.switches,
            kept: &self.kept,
            listener: &l.addr.to_string(),
        };
        let mut router = Router::with_steps(
            l,
            &config.admin,
            &self.cache,
            self.fleet.as_ref(),
            &pools,
            |r| crate::rules::compile(r, &config.policies, &env),
        );
        if self.metrics.is_some() || self.access_log.is_some() || self.spans.is_some() {
            router.observe_into(
                self.metrics.as_ref(),
                self.access_log.as_ref(),
                self.spans.as_ref(),
                &bound.to_string(),
            );
        }
        let answers_http01 = config.listeners.iter().any(|l| {
            (l.tls.as_ref()).is_some_and(|t| {
                (t.acme.as_ref())
                    .is_some_and(|a| a.challenge == crate::config::AcmeChallenge::Http01)
            })
        });
        if answers_http01 && l.tls.is_none() {
            router.answer_http01(Arc::clone(&self.http01));
        }
        if let Some(v) = alt_svc {
            router.advertise(v.clone());
        }
        router
    }
}

/// A listener as it runs: its configured and bound addresses, its live router, TLS, and the
/// switch that stops its accept loops.
pub(super) struct Slot {
    pub addr: SocketAddr,
    pub bound: SocketAddr,
    pub live: LiveRouter,
    pub tls: Option<Arc<tls::Acceptor>>,
    pub alt_svc: Option<HeaderValue>,
    pub stop: watch::Sender<bool>,
}

/// The running configuration and what a reload replaces.
pub struct Reloader {
    state: Mutex<State>,
    parts: RouterParts,
    serving: Serving,
}

struct State {
    config: Config,
    slots: Vec<Slot>,
}

impl Reloader {
    pub(super) fn new(
        config: Config,
        slots: Vec<Slot>,
        parts: RouterParts,
        serving: Serving,
    ) -> Reloader {
        Reloader {
            state: Mutex::new(State { config, slots }),
            parts,
            serving,
        }
    }

    /// The configuration file this larder runs from, if any.
    pub fn path(&self) -> Option<PathBuf> {
        self.state
            .lock()
            .expect("not poisoned")
            .config
            .source
            .path
            .clone()
    }

    /// The running configuration's text.
    pub fn text(&self) -> Arc<str> {
        Arc::clone(&self.state.lock().expect("not poisoned").config.source.text)
    }

    /// Bound addresses of the listeners, in configuration order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        let state = self.state.lock().expect("not poisoned");
        state.slots.iter().map(|s| s.bound).collect()
    }

    /// Reads the configuration file again and applies it (see [`Reloader::reload`]).
    pub fn reload_from_file(&self) -> Result<Vec<String>, String> {
        let path = self
            .path()
            .ok_or("larder runs without a configuration file: nothing to reload")?;
        let config = Config::load(&path).map_err(|e| e.to_string())?;
        self.reload(config)
    }

    /// Applies `new`: what it changes that needs a restart comes back (those parts keep
    /// running as they are); an error changes nothing. The service manager is told a reload
    /// is under way (RELOADING), and ready again once it is over, applied or refused.
    pub fn reload(&self, new: Config) -> Result<Vec<String>, String> {
        crate::service::reloading();
        let done = self.apply(new);
        crate::service::ready();
        done
    }

    fn apply(&self, mut new: Config) -> Result<Vec<String>, String> {
        let mut guard = self.state.lock().expect("not poisoned");
        let state = &mut *guard;
        let old = &state.config;
        let mut restart = Vec::new();
        // What a running process keeps. [server] is compared without the values the command
        // line and the open-files limit set (`--workers`, `--state-dir`, `--log-format`,
        // `--log-level` override their keys).
        let mut server = new.server.clone();
        server.workers = old.server.workers;
        server.max_connections = old.server.max_connections;
        server.state_dir = old.server.state_dir.clone();
        server.log_format = old.server.log_format;
        server.log_level = old.server.log_level;
        if server != old.server {
            restart.push("[server]".to_string());
        }
        // The state directory stays as started, the listeners' self-signed certificates in it.
        new.set_state_dir(old.server.state_dir.clone());
        new.server = old.server.clone();
        for (changed, name) in [
            (new.cache != old.cache, "[cache]"),
            (new.compression != old.compression, "[compression]"),
            (
                new.admin.listen != old.admin.listen || new.admin.token != old.admin.token,
                "[admin]",
            ),
            (new.access_log != old.access_log, "[access_log]"),
            (new.tracing != old.tracing, "[tracing]"),
        ] {
            if changed {
                restart.push(name.to_string());
            }
        }
        new.cache = old.cache.clone();
        new.compression = old.compression.clone();
        new.access_log = old.access_log.clone();
        new.tracing = old.tracing.clone();
        new.admin.listen = old.admin.listen;
        new.admin.token = old.admin.token.clone();

        // Match each new listener with a running one on the same address.
        let mut taken = vec![false; state.slots.len()];
        let mut matched = Vec::with_capacity(new.listeners.len());
        for l in &new.listeners {
            let found =
                (state.slots.iter().enumerate()).position(|(i, s)| !taken[i] && s.addr == l.addr);
            if let Some(i) = found {
                taken[i] = true;
            }
            matched.push(found);
        }
        let per_core = old.server.layout() == Layout::PerCore && old.server.worker_count() > 1;
        let adds = matched.iter().filter(|m| m.is_none()).count();
        if per_core && (adds > 0 || taken.iter().any(|t| !t)) {
            return Err(
                "listener addresses change only with a restart under threading = \"per-core\""
                    .into(),
            );
        }
        // Everything that can fail, before anything is swapped: the pools, new sockets and
        // their certificates.
        let pools = {
            let running = self.parts.pools.read().expect("not poisoned");
            Pools::build(&new.pools, Some(&running))?
        };
        // Push stores: those already open are kept (one writer per change log).
        let push_stores = crate::push::open_all(&new)?;
        let mut fresh = Vec::new();
        for (l, m) in new.listeners.iter().zip(&matched) {
            if m.is_some() {
                continue;
            }
            let listener =
                bind(l.addr, false).map_err(|e| format!("cannot listen on {}: {e}", l.addr))?;
            let bound = listener.local_addr().map_err(|e| e.to_string())?;
            let acceptor = match &l.tls {
                Some(cfg) => Some(Arc::new(
                    tls::Acceptor::new(cfg, &self.parts.http01)
                        .map_err(|e| format!("listener {}: {e}", l.addr))?,
                )),
                None => None,
            };
            if l.tls.as_ref().is_some_and(|t| t.http3 || t.acme.is_some()) {
                restart.push(format!("HTTP/3 and ACME of the new listener {}", l.addr));
            }
            fresh.push((listener, bound, acceptor));
        }
        for (l, m) in new.listeners.iter().zip(&matched) {
            if let Some(i) = m {
                let old_tls = old
                    .listeners
                    .iter()
                    .find(|o| o.addr == l.addr)
                    .and_then(|o| o.tls.as_ref());
                if old_tls != l.tls.as_ref() {
                    restart.push(format!("[listener.tls] of {}", l.addr));
                }
                if let Some(acceptor) = &state.slots[*i].tls {
                    acceptor
                        .certs
                        .reload()
                        .map_err(|e| format!("listener {}: {e}", l.addr))?;
                }
            }
        }

        // Swap: pools first (routers are built with them), then each listener's router.
        *self.parts.pools.write().expect("not poisoned") = pools;
        self.parts.push.replace(push_stores);
        let mut old_slots: Vec<Option<Slot>> = state.slots.drain(..).map(Some).collect();
        let mut fresh = fresh.into_iter();
        let mut slots = Vec::with_capacity(new.listeners.len());
        for (l, m) in new.listeners.iter().zip(&matched) {
            match m {
                Some(i) => {
                    let slot = old_slots[*i].take().expect("matched once");
                    let mut l = l.clone();
                    // A listener's TLS settings stay as they run.
                    l.tls = old
                        .listeners
                        .iter()
                        .find(|o| o.addr == l.addr)
                        .and_then(|o| o.tls.clone());
                    let router = self
                        .parts
                        .router(&l, &new, slot.bound, slot.alt_svc.as_ref());
                    slot.live.store(Arc::new(router));
                    slots.push(slot);
                }
                None => {
                    let (listener, bound, acceptor) = fresh.next().expect("bound above");
                    let router = self.parts.router(l, &new, bound, None);
                    let live: LiveRouter = crate::route::Live::new(Arc::new(router));
                    let (stop, stopped) = watch::channel(false);
                    tokio::spawn(accept_loop(
                        listener,
                        Arc::clone(&live),
                        self.serving.clone(),
                        acceptor.clone(),
                        stopped,
                    ));
                    tracing::info!(addr = %bound, "reload: listening");
                    slots.push(Slot {
                        addr: l.addr,
                        bound,
                        live,
                        tls: acceptor,
                        alt_svc: None,
                        stop,
                    });
                }
            }
        }
        for slot in old_slots.into_iter().flatten() {
            tracing::info!(addr = %slot.bound, "reload: listener removed; its connections drain");
            let _ = slot.stop.send(true);
        }
        // Listener TLS as it runs, in the configuration kept.
        for l in &mut new.listeners {
            if let Some(o) = state.config.listeners.iter().find(|o| o.addr == l.addr) {
                l.tls = o.tls.clone();
            }
        }
        state.slots = slots;
        state.config = new;
        tracing::info!(needs_restart = ?restart, "configuration reloaded");
        Ok(restart)
    }
}
