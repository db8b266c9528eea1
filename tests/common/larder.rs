//! larder under test: started in-process on 127.0.0.1:0 from TOML text (the format users
//! write, which stays put while the library's types move) or, for the quick starts' path, from
//! a config built in code, on the system's clock or on one the test moves; and what the tests
//! read of its state;
//! and the built binary, for tests of the command line and of the process. Tests reach the
//! library's server and cache only through here, so that one edit absorbs a change of its API.

use std::net::SocketAddr;
use std::path::Path;

/// A running larder.
pub struct Larder {
    /// The first listener's address.
    pub addr: SocketAddr,
    handle: larder::server::Handle,
    /// The clock larder's cache reads.
    clock: larder::clock::Clock,
}

impl Larder {
    /// Starts larder from TOML text.
    pub async fn start(toml: &str) -> Larder {
        let cfg = larder::config::Config::parse(toml, "test").expect("test config parses");
        Larder::from_config(cfg).await
    }

    /// Starts larder from TOML text, its cache on `clock` (a [`larder::clock::Clock::adjustable`]
    /// the test moves with [`Larder::advance`]; hand the same clock to the origin,
    /// [`super::Origin::start_at`], so that its `Date` moves too).
    pub async fn start_at(toml: &str, clock: larder::clock::Clock) -> Larder {
        let cfg = larder::config::Config::parse(toml, "test").expect("test config parses");
        Larder::on(cfg, clock).await
    }

    /// Starts larder from a config built in code (as the command line's quick starts do).
    pub async fn from_config(cfg: larder::config::Config) -> Larder {
        Larder::on(cfg, larder::clock::Clock::system()).await
    }

    async fn on(cfg: larder::config::Config, clock: larder::clock::Clock) -> Larder {
        let handle = (larder::server::start_with(cfg, clock.clone()).await).expect("larder starts");
        Larder {
            addr: handle.addrs[0],
            handle,
            clock,
        }
    }

    /// Moves larder's clock (and the origin's, when it shares it) forward by `by`: what a stored
    /// response's age, freshness and stale windows are read on. Larder must have been started
    /// on an adjustable clock ([`Larder::start_at`]).
    pub fn advance(&self, by: std::time::Duration) {
        assert!(self.clock.advance(by), "larder runs on the system clock");
    }

    /// `http://` URL of `path` on the first listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// `http://` URL of `path` on the admin listener.
    pub fn admin_url(&self, path: &str) -> String {
        let admin = self.handle.admin_addr.expect("an admin listener");
        format!("http://{admin}{path}")
    }

    /// Stops larder gracefully: the connections still open when it gave up.
    pub async fn shutdown(self) -> usize {
        self.handle.shutdown().await
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.handle.open_connections()
    }

    /// The bound address of listener `i` (configuration order).
    pub fn addr_of(&self, i: usize) -> SocketAddr {
        self.handle.addrs[i]
    }

    /// Reloads larder with a new configuration (TOML text): what needs a restart, or why
    /// it was refused.
    pub fn reload(&self, toml: &str) -> Result<Vec<String>, String> {
        let cfg = larder::config::Config::parse(toml, "reload").map_err(|e| e.to_string())?;
        self.handle.reload(cfg)
    }

    /// The listeners' bound addresses now (after reloads).
    pub fn listener_addrs(&self) -> Vec<SocketAddr> {
        self.handle.listener_addrs()
    }

    /// Every upstream pool's state (backends' health and counts), as JSON.
    pub fn pools(&self) -> serde_json::Value {
        self.handle.pools_status()
    }

    /// The states of pool `name`'s backends ("up", "down", "ejected", "probing").
    pub fn backend_states(&self, name: &str) -> Vec<String> {
        let pools = self.pools();
        let pool = (pools.as_array().unwrap().iter())
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no pool {name} in {pools}"));
        (pool["backends"].as_array().unwrap().iter())
            .map(|b| b["state"].as_str().unwrap().to_string())
            .collect()
    }

    /// TLS handshakes so far, by outcome.
    pub fn tls_counts(&self) -> larder::tls::Counts {
        self.handle.tls_counts()
    }

    /// Access log lines dropped so far (None: no access log).
    pub fn access_log_dropped(&self) -> Option<u64> {
        self.handle.access_log_dropped()
    }

    /// The Prometheus text `/metrics` serves, when requests are counted.
    pub fn metrics_text(&self) -> Option<String> {
        self.handle.metrics_text()
    }

    /// Each ACME listener's state.
    pub fn acme_status(&self) -> Vec<larder::tls::acme::AcmeStatus> {
        self.handle.acme_status()
    }

    /// Re-reads the TLS listeners' certificates now.
    pub fn reload_certificates(&self) -> Result<(), larder::tls::Error> {
        self.handle.reload_certificates()
    }

    /// Interim (1xx) responses dropped so far.
    pub fn interim_dropped(&self) -> u64 {
        self.handle.interim_dropped()
    }

    /// Entries in the cache (every variant of a URL counts).
    pub fn cache_entries(&self) -> usize {
        self.handle.cache.len()
    }

    /// Bytes the cache holds.
    pub fn cache_bytes(&self) -> u64 {
        self.handle.cache.weight()
    }

    /// Whether the cache holds an entry for `http://{host}{path}` that a request with no
    /// fields would be answered from.
    pub fn has_entry(&self, host: &str, path: &str) -> bool {
        let key = larder::cache::CacheKey::from_parts("http", host, path);
        let no_fields = http::HeaderMap::new();
        self.handle.cache.lookup(&key, &no_fields).is_some()
    }

    /// The codings of the entry for `http://{host}{path}` that a request with no fields would
    /// be answered from ("identity" for the body as stored), and whether more are being built
    /// for it; `None` when nothing is stored.
    pub fn stored_encodings(&self, host: &str, path: &str) -> Option<(Vec<&'static str>, bool)> {
        let key = larder::cache::CacheKey::from_parts("http", host, path);
        let entry = self.handle.cache.lookup(&key, &http::HeaderMap::new())?;
        let codings = (entry.by_size().iter())
            .map(|e| e.token().unwrap_or("identity"))
            .collect();
        Some((codings, entry.pending.is_some()))
    }
}

/// Starts larder from TOML text; `{origin}` is replaced by the origin's URL.
pub async fn larder(toml: &str, origin: &str) -> Larder {
    Larder::start(&toml.replace("{origin}", origin)).await
}

/// The usual test config: one listener on a free port proxying everything to `{origin}`.
pub const PROXY: &str = r#"
[compression]
brotli_level = 5
zstd_level = 3
gzip_level = 6

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  proxy = { upstream = "{origin}", response_timeout = "2s", connect_timeout = "1s" }
"#;

/// [`PROXY`] with more keys in the proxy route's table, e.g. `body_timeout = "1s"`.
pub fn proxy_with(route_keys: &str) -> String {
    PROXY.replace(
        r#"connect_timeout = "1s" }"#,
        &format!(r#"connect_timeout = "1s", {route_keys} }}"#),
    )
}

/// [`PROXY`] with lines in its `[server]` table, e.g. `max_headers = 200`.
pub fn proxy_with_server(server_keys: &str) -> String {
    PROXY.replace(
        "[compression]",
        &format!("[server]\n{server_keys}\n[compression]"),
    )
}

/// A config of one listener on a free port whose one route takes every path to the handler
/// table `[listener.route.{handler}]`, holding `handler_keys` (and any subtables after them);
/// `tables` come first (`[server]`, `[admin]`...).
pub fn one_route(tables: &str, handler: &str, handler_keys: &str) -> String {
    format!(
        r#"{tables}

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  [listener.route.{handler}]
{handler_keys}
"#
    )
}

/// A config serving the files under `root`: `static_keys` are more lines of the route's
/// `static` table (`directory_listing = true`), `server_keys` lines of the `[server]` table
/// (`workers = 2`).
pub fn static_files(root: &Path, static_keys: &str, server_keys: &str) -> String {
    let keys = format!("root = \"{}\"\n{static_keys}", root.display());
    one_route(&format!("[server]\n{server_keys}"), "static", &keys)
}

/// The larder binary, to run with arguments.
pub fn larder_command() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_larder"))
}

/// A child process, killed when dropped (a failing test leaves no larder running).
pub struct Child(pub std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An address on 127.0.0.1 with a port free a moment ago, for a process told where to listen.
/// Taken from 20000-22767, below the kernel's ephemeral range (32768 and up here), so that no
/// outgoing connection of another test takes it before the process binds it (a Redis Cluster
/// node's bus, its port + 10000, stays below that range too); each test binary (by its pid)
/// starts at its own place, and a port is never handed out twice in one binary.
pub fn free_port() -> SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id() * 37 % 2_768;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + (start + n) % 2_768;
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port as u16)) {
            return l.local_addr().unwrap();
        }
    }
}

/// Raises this process's open-files limit to its hard limit, as larder does at start: the
/// limit now.
pub fn raise_open_files_limit() -> u64 {
    larder::server::raise_nofile_limit().map_or(1024, |(_, new)| new)
}

/// larder with one image route reading originals from a temporary `root` where `files` (name,
/// bytes) are written first, uploads in a temporary `dir`; `extra` holds more keys of the
/// route's `images` table (and subtables after them); on `clock` when given.
pub struct ImageRoute {
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub root: tempfile::TempDir,
    pub larder: Larder,
}

pub async fn image_route(
    files: &[(&str, Vec<u8>)],
    extra: &str,
    clock: Option<larder::clock::Clock>,
) -> ImageRoute {
    let dir = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    for (name, bytes) in files {
        std::fs::write(root.path().join(name), bytes).unwrap();
    }
    let keys = format!(
        "dir = \"{}\"\nroot = \"{}\"\n{extra}",
        dir.path().display(),
        root.path().display()
    );
    let toml = one_route("", "images", &keys);
    let larder = match clock {
        Some(c) => Larder::start_at(&toml, c).await,
        None => Larder::start(&toml).await,
    };
    ImageRoute {
        addr: larder.addr,
        dir,
        root,
        larder,
    }
}
