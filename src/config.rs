//! Typed configuration: one TOML file, every setting declared once with its type, default and bounds.
//!
//! Validation happens while deserializing: sizes, durations, fractions, URLs, host patterns are
//! their own types, and a bounded number, size or duration carries its range in its type
//! (`Bounded<1, 9>`, `ByteSize<{ 8 * KIB }, MIB>`, `Dur<100, HOUR_MS>`), so every bad value is
//! reported by `toml` with the span of that value, and [`Error`] turns the span into "line N, key
//! `table.key`". Checks that span several keys (listeners sharing a port, `max_object_size` above
//! `max_size`, `max_connections` above the open-files limit) run after parsing and name the key
//! they blame and its line, found by its path in the text ([`Locator`]). Each part of the program
//! receives its own typed slice of this (`CacheConfig`, `CompressionConfig`, `ProxyConfig`, ...),
//! never the whole thing. Loading a file ([`Config::load`]) reads a regular file of bounded
//! size ([`MAX_CONFIG_BYTES`]) and checks the directories it names on this machine (a static
//! route's `root`).
//!
//! It is plain data at the bottom of the dependency graph: it imports nothing of larder's, holds
//! no runtime state (the handlers build theirs from it, e.g. who may purge from `[admin]`), and
//! every type in it is `PartialEq`, so two configurations can be compared part by part. The
//! grammar of image transform parameters is here too ([`image_params`]): presets are written in
//! it and checked at load.

use std::fmt;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::Uri;
use serde::de::{self, Deserializer};
use serde::Deserialize;

pub mod access_log;
pub mod image_params;
pub mod otel;
pub mod pool;
pub mod push;
pub mod tiers;
pub mod tls;

pub use access_log::{AccessLogConfig, LogFormat, LogPiece, LOG_FIELDS};
use image_params::{FormatChoice, Preset};
pub use otel::TracingConfig;
pub use pool::{
    BackendConfig, Balance, HashOn, HealthCheck, HealthConfig, PassiveConfig, PoolConfig,
    UpstreamRef, UpstreamTlsConfig,
};
pub use push::{GroupConfig, IdPattern, JwtConfig, PushConfig};
pub use tiers::{DiskConfig, DiskWrite, SharedConfig};
pub use tls::{
    AcmeChallenge, AcmeConfig, CertConfig, HstsConfig, RedirectConfig, TlsConfig, TlsVersion,
};

/// The configuration compiled into the binary: what `larder` runs with no arguments.
pub const EMBEDDED_DEFAULT: &str = include_str!("../larder.default.toml");

/// Bytes in a KiB, MiB, GiB (for size bounds: `ByteSize<{ 8 * KIB }, MIB>`).
pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// Milliseconds in a second, a minute, an hour (for duration bounds: `Dur<100, HOUR_MS>`).
pub const SECOND_MS: u64 = 1000;
pub const MINUTE_MS: u64 = 60 * SECOND_MS;
pub const HOUR_MS: u64 = 60 * MINUTE_MS;
/// The longest duration any setting takes (8760h, a year) unless its type says less: beyond,
/// adding it to a clock reading can overflow, which panics.
pub const YEAR_MS: u64 = 8760 * HOUR_MS;

/// Worker threads at most (`workers`, `--workers`, `[compression] threads`, an image route's
/// `workers`). Each is an OS thread with its stack (and with `per-core` its own runtime and
/// listening sockets); past the number of cores more only add switching, and 1024 is above the
/// hardware threads of the largest servers. Unbounded, `workers = 100000000` had the runtime
/// allocate for each until memory ran out, and the port never opened.
pub const MAX_WORKERS: i64 = 1024;

/// A worker-thread count: 0 means one per core.
pub type Workers = Bounded<0, MAX_WORKERS>;

/// A configuration that failed to load.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A bad value or key; `line` is 0 (and left out) where the text does not set the key.
    #[error("{}", invalid(origin, *line, key, message))]
    Invalid {
        origin: String,
        line: usize,
        key: String,
        message: String,
    },
    #[error("{origin}: {message}")]
    Semantic { origin: String, message: String },
}

fn invalid(origin: &str, line: usize, key: &str, message: &str) -> String {
    match (line, key) {
        (0, "") => format!("{origin}: {message}"),
        (0, key) => format!("{origin}: key `{key}`: {message}"),
        (line, "") => format!("{origin}: line {line}: {message}"),
        (line, key) => format!("{origin}: line {line}, key `{key}`: {message}"),
    }
}

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub cache: CacheConfig,
    #[serde(default)]
    pub compression: CompressionConfig,
    #[serde(default, rename = "listener")]
    pub listeners: Vec<ListenerConfig>,
    /// Pools of backends that proxy routes name (`[pool.NAME]`); after parsing, also the
    /// inline pool of every route's `upstream`, named `upstream URL...`.
    #[serde(default, rename = "pool")]
    pub pools: pool::Pools,
    /// Administration: the bearer token guarding admin operations (image DELETE, uploads when
    /// a route asks for it).
    #[serde(default)]
    pub admin: AdminConfig,
    /// One line per request, when set.
    #[serde(default)]
    pub access_log: Option<AccessLogConfig>,
    /// A span per request exported to OpenTelemetry, when set.
    #[serde(default)]
    pub tracing: Option<TracingConfig>,
    /// Where this configuration came from, to name keys and lines in errors found after
    /// parsing ([`Config::fit_open_files`]). Part of `==` like the rest: to see what changed
    /// between two configurations, compare their parts.
    #[serde(skip)]
    pub source: Source,
}

/// The `[admin]` section.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Bearer token (`Authorization: Bearer <token>`) for admin operations; none disables them.
    pub token: Option<String>,
    /// Address of the admin API listener (`/_larder/status`, `/_larder/purge`); off when unset.
    /// Needs `token`. Bind it to loopback unless the network in front is trusted.
    pub listen: Option<SocketAddr>,
    /// Addresses allowed to send `PURGE` to proxy routes without the token.
    #[serde(default)]
    pub purge_allow: Vec<Cidr>,
}

/// The text a configuration was parsed from and its name in errors (a path, "embedded
/// default", "command line").
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Source {
    pub origin: String,
    pub text: Arc<str>,
    /// The file it was read from (what a reload reads again).
    pub path: Option<PathBuf>,
}

impl Source {
    /// An error blaming the first of `paths` the text sets (else the first), with its line.
    fn error(&self, paths: &[&[Seg]], message: impl Into<String>) -> Error {
        Locator::new(&self.text).error(&self.origin, paths, message.into())
    }
}

/// The largest configuration file larder reads (16 MiB; the example with every setting is
/// under 10 KiB). A larger file, or one that is not a regular file (`/dev/zero`, a pipe, a
/// directory), is refused before any of it is read: reading `/dev/zero` whole never ends.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// The text of the configuration file at `path`: a regular file of at most
/// [`MAX_CONFIG_BYTES`] (read through a bound too, should it grow meanwhile).
fn read_bounded(path: &Path) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind, Read};
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        let what = if meta.is_dir() {
            "a directory"
        } else {
            "not a regular file (a device, pipe or socket)"
        };
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("it is {what}: a configuration is a file"),
        ));
    }
    let too_large = || {
        Error::new(
            ErrorKind::InvalidData,
            format!(
                "larger than {} MiB: not a configuration",
                MAX_CONFIG_BYTES >> 20
            ),
        )
    };
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(too_large());
    }
    let mut text = String::new();
    (std::fs::File::open(path)?)
        .take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(too_large());
    }
    Ok(text)
}

/// File descriptors kept for what is not a client connection or a listening socket: standard
/// streams, the runtimes' epoll and wakers (about 12 in all with one worker, measured), files
/// being read, upstream connections being made. Past these, descriptors can still run out (an
/// upstream connection per proxied request); the accept loop backs off on EMFILE.
pub const RESERVED_FDS: u64 = 32;

impl Config {
    /// Parses a configuration from TOML text; `origin` names it in errors (a path or "embedded").
    pub fn parse(text: &str, origin: &str) -> Result<Config, Error> {
        let mut cfg: Config =
            toml::from_str(text).map_err(|e| Error::from_toml(&e, text, origin))?;
        cfg.source = Source {
            origin: origin.to_string(),
            text: text.into(),
            path: None,
        };
        cfg.check_semantics()?;
        cfg.name_inline_pools();
        Ok(cfg)
    }

    /// Moves every route's inline pool (`upstream = ...`) into [`Config::pools`], named
    /// `upstream URL...` (routes with the same backends and settings share one pool, with its
    /// connections and health), so that every proxy route names its pool.
    pub fn name_inline_pools(&mut self) {
        for l in &mut self.listeners {
            for r in &mut l.routes {
                let HandlerConfig::Proxy(p) = &mut r.handler else {
                    continue;
                };
                let UpstreamRef::Inline(backends) = &p.upstream else {
                    continue;
                };
                let pool = p.inline_pool(backends);
                let urls: Vec<String> = (backends.iter())
                    .map(|b| format!("{}://{}", b.url.scheme, b.url.authority))
                    .collect();
                let base = format!("upstream {}", urls.join(" "));
                let mut name = base.clone();
                let mut n = 1;
                while self.pools.get(&name).is_some_and(|other| *other != pool) {
                    n += 1;
                    name = format!("{base} #{n}");
                }
                self.pools.insert(name.clone(), pool);
                p.upstream = UpstreamRef::Pool(name);
            }
        }
    }

    /// Reads and parses a configuration file (a regular file of at most [`MAX_CONFIG_BYTES`]),
    /// and checks what the file names on this machine: each static route's `root` is a
    /// directory.
    pub fn load(path: &Path) -> Result<Config, Error> {
        let text = read_bounded(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut cfg = Self::parse(&text, &path.display().to_string())?;
        cfg.source.path = Some(path.to_path_buf());
        cfg.check_directories()?;
        Ok(cfg)
    }

    /// Each static route's `root` is a directory here: one that does not exist (a typo, a
    /// missing mount) would answer 404 to every request.
    fn check_directories(&self) -> Result<(), Error> {
        for (i, l) in self.listeners.iter().enumerate() {
            for (j, r) in l.routes.iter().enumerate() {
                let HandlerConfig::Static(StaticConfig {
                    root: Some(root), ..
                }) = &r.handler
                else {
                    continue;
                };
                let why = match std::fs::metadata(root) {
                    Ok(m) if m.is_dir() => continue,
                    Ok(_) => "is not a directory".to_string(),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        "does not exist".to_string()
                    }
                    Err(e) => format!("cannot be read: {e}"),
                };
                let relative = if root.is_relative() {
                    let cwd = std::env::current_dir().unwrap_or_default();
                    format!(" (relative to the working directory, {})", cwd.display())
                } else {
                    String::new()
                };
                let at = [Key("listener"), Index(i), Key("route"), Index(j)];
                return Err(self.source.error(
                    &[&[&at[..], &[Key("static"), Key("root")]].concat(), &at],
                    format!(
                        "{}{relative} {why}: every request would be answered 404",
                        root.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks that span several keys (each key alone was checked while parsing); an error names
    /// the key it blames and that key's line.
    fn check_semantics(&self) -> Result<(), Error> {
        let src = &self.source;
        if self.listeners.is_empty() {
            return Err(Error::Semantic {
                origin: src.origin.clone(),
                message: "no [[listener]] configured: larder would serve nothing".into(),
            });
        }
        let admin_listen: &[Seg] = &[Key("admin"), Key("listen")];
        if self.admin.listen.is_some() && self.admin.token.as_deref().is_none_or(str::is_empty) {
            return Err(src.error(
                &[admin_listen],
                "needs [admin] token: the admin API never runs open",
            ));
        }
        let line_of = |i: usize| {
            let at = Locator::new(&src.text);
            at.line_of(&[Key("listener"), Index(i), Key("addr")])
        };
        for (i, l) in self.listeners.iter().enumerate() {
            let addr: &[Seg] = &[Key("listener"), Index(i), Key("addr")];
            if let Some((j, other)) = (self.listeners[..i].iter().enumerate())
                .find(|(_, o)| ports_collide(o.addr, l.addr))
            {
                return Err(src.error(
                    &[addr],
                    format!(
                        "{} and the listener on {} (line {}) cannot both listen on port {}",
                        l.addr,
                        other.addr,
                        line_of(j),
                        l.addr.port()
                    ),
                ));
            }
            if let Some(admin) = self.admin.listen.filter(|a| ports_collide(*a, l.addr)) {
                return Err(src.error(
                    &[admin_listen],
                    format!(
                        "the admin listener on {admin} and the listener on {} (line {}) cannot \
                         both listen on port {}",
                        l.addr,
                        line_of(i),
                        admin.port()
                    ),
                ));
            }
            if let Some(tls) = &l.tls {
                let at = |k: &'static str| [Key("listener"), Index(i), Key("tls"), Key(k)];
                if tls.acme.as_ref().is_some_and(|a| a.domains.is_empty()) {
                    return Err(src.error(
                        &[&[
                            Key("listener"),
                            Index(i),
                            Key("tls"),
                            Key("acme"),
                            Key("domains"),
                        ]],
                        "needs at least one domain to obtain a certificate for",
                    ));
                }
                if tls.cert.is_some() != tls.key.is_some() {
                    return Err(src.error(
                        &[&at("cert"), &at("key")],
                        "`cert` and `key` go together: each certificate needs its private key",
                    ));
                }
                if tls.cert.is_none() && tls.certificates.is_empty() && tls.acme.is_none() {
                    return Err(src.error(
                        &[&at("certificates"), &addr[..3]],
                        "needs a certificate: `cert` and `key`, `certificates`, or `acme`",
                    ));
                }
            }
            if l.routes.is_empty() {
                return Err(src.error(
                    &[&[Key("listener"), Index(i), Key("route")], &addr[..2]],
                    format!("listener {} has no [[listener.route]]", l.addr),
                ));
            }
            for (j, r) in l.routes.iter().enumerate() {
                let at = |keys: &[&'static str]| {
                    let route = [Key("listener"), Index(i), Key("route"), Index(j)];
                    [&route[..], &keys.iter().map(|k| Key(k)).collect::<Vec<_>>()].concat()
                };
                if r.hsts.is_some() && l.tls.is_none() {
                    return Err(src.error(
                        &[&at(&["hsts"])],
                        "hsts is sent over HTTPS only (browsers ignore it over plain HTTP), and \
                         this listener has no [listener.tls]",
                    ));
                }
                match &r.handler {
                    HandlerConfig::Static(s) if s.root.is_some() == s.bundled.is_some() => {
                        return Err(src.error(
                            &[&at(&["static"])],
                            "needs exactly one of `root` (a directory) and `bundled`",
                        ));
                    }
                    HandlerConfig::Push(p) => {
                        if p.token.as_deref() == Some("") {
                            return Err(src.error(&[&at(&["push", "token"])], "is empty"));
                        }
                        if let Some(j) = &p.jwt {
                            if j.secret.is_some() == j.public_key.is_some() {
                                return Err(src.error(
                                    &[&at(&["push", "jwt"])],
                                    "needs exactly one of `secret` (HS256) and `public_key` (RS256)",
                                ));
                            }
                        } else if p.read_needs_jwt {
                            return Err(src.error(
                                &[&at(&["push", "read_needs_jwt"])],
                                "needs `jwt`: every read would be refused",
                            ));
                        }
                        if p.share && self.cache.shared.is_none() {
                            return Err(src.error(
                                &[&at(&["push", "share"])],
                                "needs [cache.shared]: no shared tier to share records through",
                            ));
                        }
                    }
                    HandlerConfig::Images(im)
                        if im.upload_token
                            && self.admin.token.as_deref().is_none_or(str::is_empty) =>
                    {
                        return Err(src.error(
                            &[&at(&["images", "upload_token"])],
                            "needs [admin] token: every upload would be refused",
                        ));
                    }
                    HandlerConfig::Images(im)
                        if im.share_originals && self.cache.shared.is_none() =>
                    {
                        return Err(src.error(
                            &[&at(&["images", "share_originals"])],
                            "needs [cache.shared]: there is no shared tier to store them in",
                        ));
                    }
                    _ => {}
                }
            }
        }
        self.check_pools()?;
        let cache = &self.cache;
        if cache.max_object_size.0 > cache.max_size.0 {
            return Err(src.error(
                &[
                    &[Key("cache"), Key("max_object_size")],
                    &[Key("cache"), Key("max_size")],
                ],
                format!(
                    "max_object_size ({}) is larger than max_size ({}): no response that large \
                     could be stored; set max_object_size to at most {}",
                    show_size(cache.max_object_size.0),
                    show_size(cache.max_size.0),
                    show_size(cache.max_size.0)
                ),
            ));
        }
        if let Some(shared) = &cache.shared {
            if let Err(why) = shared.check() {
                return Err(src.error(&[&[Key("cache"), Key("shared")]], why));
            }
        }
        Ok(())
    }

    /// Pools: each has a backend, each route's named pool exists, client certificates come
    /// with their keys.
    fn check_pools(&self) -> Result<(), Error> {
        let src = &self.source;
        for (name, p) in &self.pools {
            let at = |k: &'static str| [Key("pool"), Key(name), Key(k)];
            if p.backends.is_empty() {
                return Err(src.error(
                    &[&at("backends"), &at("backends")[..2]],
                    format!("pool `{name}` has no backend: every request would fail"),
                ));
            }
            if p.backends.iter().all(|b| b.backup) {
                return Err(src.error(
                    &[&at("backends")],
                    format!("pool `{name}` has only backup backends: one must be primary"),
                ));
            }
            if p.tls.client_cert.is_some() != p.tls.client_key.is_some() {
                return Err(src.error(
                    &[&[Key("pool"), Key(name), Key("tls")]],
                    "`client_cert` and `client_key` go together",
                ));
            }
        }
        for (i, l) in self.listeners.iter().enumerate() {
            for (j, r) in l.routes.iter().enumerate() {
                let HandlerConfig::Proxy(p) = &r.handler else {
                    continue;
                };
                if let UpstreamRef::Pool(name) = &p.upstream {
                    if !self.pools.contains_key(name) {
                        let route = [Key("listener"), Index(i), Key("route"), Index(j)];
                        let known: Vec<&str> = self.pools.keys().map(String::as_str).collect();
                        return Err(src.error(
                            &[&[&route[..], &[Key("proxy"), Key("pool")]].concat(), &route],
                            format!(
                                "no [pool.{name}] (pools: {})",
                                if known.is_empty() {
                                    "none".into()
                                } else {
                                    known.join(", ")
                                }
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Listening sockets larder opens: one per listener (one per listener and worker with
    /// `per-core` threads), and the admin listener.
    fn listening_sockets(&self) -> u64 {
        let per_listener = match self.server.layout() {
            Layout::PerCore => self.server.worker_count() as u64,
            Layout::WorkStealing => 1,
        };
        self.listeners.len() as u64 * per_listener + u64::from(self.admin.listen.is_some())
    }

    /// Fits `max_connections` to `limit`, the open files this process may have (its soft limit
    /// once raised to the hard one): each connection is a descriptor, besides the listening
    /// sockets and [`RESERVED_FDS`]. Beyond the limit, accepting fails with EMFILE long before
    /// the connection bound pauses it. A value the file sets that does not fit is an error
    /// naming it; the default is lowered to fit, and the new bound returned to be reported.
    pub fn fit_open_files(&mut self, limit: u64) -> Result<Option<i64>, Error> {
        let others = RESERVED_FDS + self.listening_sockets();
        let fits = i64::try_from(limit.saturating_sub(others)).unwrap_or(i64::MAX);
        let wanted = self.server.max_connections.get();
        if wanted <= fits {
            return Ok(None);
        }
        let path: &[Seg] = &[Key("server"), Key("max_connections")];
        let set = Locator::new(&self.source.text).line_of(path) > 0;
        if set || fits < 1 {
            return Err(self.source.error(
                &[path],
                format!(
                    "{wanted} connections need {} open files with the listening sockets and \
                     {RESERVED_FDS} more, but the open-files limit (RLIMIT_NOFILE, hard) is \
                     {limit}: lower max_connections to {} or raise the limit (ulimit -n, \
                     systemd's LimitNOFILE=)",
                    wanted as u64 + others,
                    fits.max(0)
                ),
            ));
        }
        self.server.max_connections = Bounded(fits);
        Ok(Some(fits))
    }

    /// A one-listener configuration proxying everything to `upstream` (the `--upstream` CLI form).
    pub fn single_route(listen: SocketAddr, handler: HandlerConfig) -> Config {
        let mut cfg = Config {
            server: ServerConfig::default(),
            cache: CacheConfig::default(),
            compression: CompressionConfig::default(),
            admin: AdminConfig::default(),
            access_log: None,
            tracing: None,
            listeners: vec![ListenerConfig {
                addr: listen,
                tls: None,
                routes: vec![RouteConfig {
                    host: None,
                    path: PathPrefix("/".into()),
                    handler,
                    hsts: None,
                }],
            }],
            pools: Default::default(),
            source: Source {
                origin: "command line".into(),
                text: "".into(),
                path: None,
            },
        };
        cfg.name_inline_pools();
        cfg
    }
}

/// Whether two listening sockets cannot both be bound (on Linux, even with SO_REUSEADDR): the
/// same port (not 0, which picks a free one) and the same address, or one of them the wildcard
/// of its family (`0.0.0.0` takes the port on every IPv4 address; `[::]`, dual-stack unless
/// `net.ipv6.bindv6only` is set, on every address). With `per-core` threads' SO_REUSEPORT the
/// second bind would even succeed, and the kernel would spread one port's connections over two
/// listeners' routes.
pub fn ports_collide(a: SocketAddr, b: SocketAddr) -> bool {
    if a.port() != b.port() || a.port() == 0 {
        return false;
    }
    let (x, y) = (a.ip().to_canonical(), b.ip().to_canonical());
    let covers = |w: std::net::IpAddr, o: std::net::IpAddr| {
        w.is_unspecified() && (w.is_ipv6() || o.is_ipv4())
    };
    x == y || covers(x, y) || covers(y, x)
}

impl Error {
    fn from_toml(e: &toml::de::Error, text: &str, origin: &str) -> Error {
        let at = Locator::new(text);
        let (line, key) = match e.span() {
            Some(span) => (at.line_at(span.start), at.key_at(span.start)),
            None => (0, String::new()),
        };
        Error::Invalid {
            origin: origin.to_string(),
            line,
            key,
            message: e.message().trim().to_string(),
        }
    }
}

/// One step of a key path: a key of a table, or an index in an array (of tables).
#[derive(Debug, Clone, Copy)]
enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}
use Seg::{Index, Key};

/// Where the keys of a configuration text are: the text parsed again by `toml_edit` (the parser
/// under `toml`), which keeps each key's and value's span. Only built to report an error.
struct Locator<'a> {
    text: &'a str,
    doc: Option<toml_edit::ImDocument<&'a str>>,
}

/// A child of a [`Node`]: its key (none for an array's element), the key's span (an element's
/// own span), and the child.
type Child<'d> = (Option<&'d str>, Option<Range<usize>>, Node<'d>);

/// A node of the parsed text, whatever its form.
#[derive(Clone, Copy)]
enum Node<'d> {
    Item(&'d toml_edit::Item),
    Table(&'d toml_edit::Table),
    Value(&'d toml_edit::Value),
}

impl<'d> Node<'d> {
    /// Its own span: a value's, or a table's (its header).
    fn span(self) -> Option<Range<usize>> {
        match self {
            Node::Item(toml_edit::Item::Value(v)) | Node::Value(v) => v.span(),
            Node::Item(toml_edit::Item::Table(t)) | Node::Table(t) => t.span(),
            Node::Item(_) => None,
        }
    }

    /// Its children.
    fn children(self) -> Vec<Child<'d>> {
        use toml_edit::{Item, Value};
        let table = |t: &'d toml_edit::Table| {
            t.iter()
                .map(|(k, v)| (Some(k), t.key(k).and_then(|k| k.span()), Node::Item(v)))
                .collect()
        };
        match self {
            Node::Table(t) | Node::Item(Item::Table(t)) => table(t),
            Node::Item(Item::ArrayOfTables(a)) => {
                a.iter().map(|t| (None, t.span(), Node::Table(t))).collect()
            }
            Node::Item(Item::Value(v)) | Node::Value(v) => match v {
                Value::InlineTable(t) => t
                    .iter()
                    .map(|(k, v)| (Some(k), t.key(k).and_then(|k| k.span()), Node::Value(v)))
                    .collect(),
                Value::Array(a) => a.iter().map(|v| (None, v.span(), Node::Value(v))).collect(),
                _ => Vec::new(),
            },
            Node::Item(Item::None) => Vec::new(),
        }
    }
}

fn holds(span: &Option<Range<usize>>, offset: usize) -> bool {
    span.as_ref().is_some_and(|s| s.contains(&offset))
}

impl<'a> Locator<'a> {
    fn new(text: &'a str) -> Self {
        Locator {
            text,
            doc: toml_edit::ImDocument::parse(text).ok(),
        }
    }

    /// The line (from 1) holding byte `offset`.
    fn line_at(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())]
            .matches('\n')
            .count()
            + 1
    }

    /// The path (`cache.max_size`, `listener.route.proxy.upstream`) of the deepest key whose
    /// key or value holds byte `offset`; empty if none does (a syntax error between keys).
    fn key_at(&self, offset: usize) -> String {
        fn find<'d>(node: Node<'d>, offset: usize, path: &mut Vec<&'d str>) -> bool {
            for (key, key_span, child) in node.children() {
                let depth = path.len();
                path.extend(key);
                if find(child, offset, path)
                    || holds(&key_span, offset)
                    || holds(&child.span(), offset)
                {
                    return true;
                }
                path.truncate(depth);
            }
            false
        }
        let mut path = Vec::new();
        if let Some(doc) = &self.doc {
            find(Node::Item(doc.as_item()), offset, &mut path);
        }
        path.join(".")
    }

    /// The line where the text sets `path` (its key; for a table in an array, its header), or
    /// 0 if it does not.
    fn line_of(&self, path: &[Seg]) -> usize {
        let Some(doc) = &self.doc else { return 0 };
        let mut node = Node::Item(doc.as_item());
        let mut span = None;
        for seg in path {
            let children = node.children();
            let found = match *seg {
                Key(k) => children.into_iter().find(|(name, ..)| *name == Some(k)),
                Index(i) => children
                    .into_iter()
                    .filter(|(name, ..)| name.is_none())
                    .nth(i),
            };
            let Some((_, key_span, child)) = found else {
                return 0;
            };
            span = key_span;
            node = child;
        }
        span.map_or(0, |s| self.line_at(s.start))
    }

    /// An error blaming the first of `paths` the text sets (else the first path, without a line).
    fn error(&self, origin: &str, paths: &[&[Seg]], message: String) -> Error {
        let (line, path) = paths
            .iter()
            .map(|p| (self.line_of(p), *p))
            .find(|(line, _)| *line > 0)
            .unwrap_or((0, paths.first().copied().unwrap_or(&[])));
        let key = path
            .iter()
            .filter_map(|s| match s {
                Key(k) => Some(*k),
                Index(_) => None,
            })
            .collect::<Vec<_>>()
            .join(".");
        Error::Invalid {
            origin: origin.to_string(),
            line,
            key,
            message,
        }
    }
}

/// Server-wide settings: threads, connection limits, timeouts.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Worker threads; 0 means one per core.
    pub workers: Workers,
    /// Open connections at most, over all listeners; at the bound, accepting pauses.
    pub max_connections: Bounded<1, 10_000_000>,
    /// Largest request head (request line plus headers) accepted; larger gets 431.
    /// At least 8 KiB (a browser's head with its cookies), at most 1 MiB (each connection may
    /// buffer that much).
    pub max_header_size: ByteSize<{ 8 * KIB }, MIB>,
    /// Most request header fields accepted (HTTP/1.1 and HTTP/2); more gets 431.
    pub max_headers: Bounded<1, 10_000>,
    /// Time a client has to send a complete request head (slowloris guard); 100ms to 1h (0
    /// timed every request out).
    pub header_read_timeout: Dur<100, HOUR_MS>,
    /// Keep-alive connections with no traffic for this long are closed; at least 100ms.
    pub idle_timeout: Dur<100>,
    /// An HTTP/1.1 connection idle this long hands its buffers back and waits, kept open, as a
    /// bare socket until its next request (nginx does the same on keep-alive); 0 keeps them.
    pub idle_release: Dur,
    /// While more connections than this are open, an HTTP/1.1 connection also hands its buffers
    /// back right after each response: with thousands of connections, state kept between
    /// requests has left the CPU's caches by the next request (docs/design.md, "Parking").
    pub release_above_connections: usize,
    /// On SIGTERM/SIGINT, in-flight requests get this long to finish.
    pub shutdown_grace: Dur,
    /// Accept HTTP/2 with prior knowledge (h2c) on the same port as HTTP/1.1.
    pub h2c: bool,
    /// How the worker threads share the work (see docs/design.md, "Threads").
    pub threading: Threading,
    /// Work-stealing runtime: poll the global task queue every this many tasks. Low values keep
    /// service fair across thousands of connections (tail latency); tokio's default is 31.
    pub global_queue_interval: Bounded<1, 255>,
    /// How often the configuration file is checked for changes, reloaded when it changed (as
    /// SIGHUP does); "0s": never.
    pub watch_config: Dur<0, HOUR_MS>,
}

impl ServerConfig {
    /// The layout in force: `threading`, with `auto` decided by the worker count. One worker
    /// runs single-threaded: measured on this project's bench, it serves as many requests at
    /// 10-100 connections, with less CPU and a lower p99 at 1,000-10,000 and on the proxy's
    /// pass path (docs/design.md "Threads"). Several workers steal work from each other, and
    /// keep listener addresses changeable on reload.
    pub fn layout(&self) -> Layout {
        match self.threading {
            Threading::PerCore => Layout::PerCore,
            Threading::WorkStealing => Layout::WorkStealing,
            Threading::Auto if self.worker_count() == 1 => Layout::PerCore,
            Threading::Auto => Layout::WorkStealing,
        }
    }

    /// Worker threads this asks for (`workers`; 0 = one per core).
    pub fn worker_count(&self) -> usize {
        match self.workers.as_usize() {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}

/// The layout of the worker threads, as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Threading {
    /// `per-core` with one worker, `work-stealing` with several (docs/design.md "Threads").
    Auto,
    /// One single-threaded runtime per worker, each with its own `SO_REUSEPORT` listening
    /// socket: the kernel spreads connections, a connection stays on its thread.
    PerCore,
    /// One multi-threaded tokio runtime whose workers steal tasks from each other.
    WorkStealing,
}

/// The layout of the worker threads in force ([`ServerConfig::layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    PerCore,
    WorkStealing,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            workers: Bounded(0),
            max_connections: Bounded(100_000),
            max_header_size: ByteSize(16 * 1024),
            max_headers: Bounded(100),
            header_read_timeout: Dur(Duration::from_secs(10)),
            idle_timeout: Dur(Duration::from_secs(60)),
            idle_release: Dur(Duration::from_secs(1)),
            release_above_connections: 512,
            shutdown_grace: Dur(Duration::from_secs(10)),
            h2c: true,
            threading: Threading::Auto,
            global_queue_interval: Bounded(2),
            watch_config: Dur(Duration::ZERO),
        }
    }
}

/// The memory cache shared by every route.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Total bytes the cache may hold (bodies of every encoding plus headers); at least 64 KiB
    /// (0 stored nothing, silently: a route's `cache = false` says so).
    pub max_size: ByteSize<{ 64 * KIB }>,
    /// Responses larger than this are streamed through, never stored; at most `max_size`.
    pub max_object_size: ByteSize,
    /// Name of the response header telling HIT, MISS, BYPASS or EXPIRED.
    pub status_header: HeaderNameCfg,
    /// How long a request waits for another request's fill of the same key, and, right after a
    /// fill, for a compressed variant it accepts to be built.
    pub coalesce_timeout: Dur,
    /// Store responses carrying Set-Cookie (the cookie itself is never stored, only the body).
    pub store_set_cookie: bool,
    /// Fraction of (Date - Last-Modified) used as a heuristic lifetime (RFC 9111 §4.2.2).
    pub heuristic_fraction: Fraction,
    /// Serve a stale response at once and refresh it in the background for this long past its
    /// lifetime, when the origin did not say (RFC 5861 stale-while-revalidate). 0 = only when the
    /// origin allows it.
    pub stale_while_revalidate: Dur,
    /// Serve a stale response when the origin fails or times out, for this long past its
    /// lifetime, when the origin did not say (RFC 5861 stale-if-error). 0 = only when allowed.
    pub stale_if_error: Dur,
    /// Serve a stale response, for this long past its lifetime, when the origin cannot be
    /// reached, breaks off or times out (RFC 9111 §4.2.4 "disconnected"), unless the response
    /// forbids stale reuse (must-revalidate, proxy-revalidate, s-maxage, no-cache). An origin's
    /// 5xx answer is not a disconnection: that is `stale_if_error`. 0 = never.
    pub stale_if_disconnected: Dur,
    /// Targeted cache-control fields honoured above Cache-Control, first valid one present wins
    /// (RFC 9213). Fields of another name than CDN-Cache-Control are removed before responses go
    /// on.
    pub targeted_cache_control: Vec<HeaderNameCfg>,
    /// Pass CDN-Cache-Control on to clients (other CDNs on the path use it too, RFC 9213 §3);
    /// false removes it like larder's own targeted fields.
    pub forward_cdn_cache_control: bool,
    /// Response field listing a response's tags for purge by tag (space or comma separated);
    /// removed before responses go on.
    pub tag_header: HeaderNameCfg,
    /// A tier on disk below memory, kept across restarts.
    pub disk: Option<DiskConfig>,
    /// A tier shared by every node, in Redis or Valkey.
    pub shared: Option<SharedConfig>,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            max_size: ByteSize(256 * 1024 * 1024),
            max_object_size: ByteSize(16 * 1024 * 1024),
            status_header: HeaderNameCfg(HeaderName::from_static("x-cache")),
            coalesce_timeout: Dur(Duration::from_secs(10)),
            store_set_cookie: false,
            heuristic_fraction: Fraction(0.1),
            stale_while_revalidate: Dur(Duration::ZERO),
            stale_if_error: Dur(Duration::ZERO),
            stale_if_disconnected: Dur(Duration::from_secs(60)),
            targeted_cache_control: vec![HeaderNameCfg(HeaderName::from_static(
                "cdn-cache-control",
            ))],
            forward_cdn_cache_control: true,
            tag_header: HeaderNameCfg(HeaderName::from_static("surrogate-key")),
            disk: None,
            shared: None,
        }
    }
}

/// Which stored bodies get pre-compressed variants, and how hard to compress.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompressionConfig {
    pub enabled: bool,
    /// Content types compressed (`text/*` matches any text type); parameters are ignored.
    #[serde(deserialize_with = "media_ranges")]
    pub types: Vec<String>,
    /// Bodies shorter than this are stored identity only.
    pub min_length: ByteSize,
    pub gzip_level: Bounded<1, 9>,
    pub brotli_level: Bounded<0, 11>,
    pub zstd_level: Bounded<1, 22>,
    /// Compressions running at once (off the async workers); 0 means one per core.
    pub threads: Workers,
    /// Compress responses that are not stored (passed through) on the fly, per request.
    pub dynamic: bool,
    /// Levels for on-the-fly compression: cheap, since they are paid on every request.
    pub dynamic_gzip_level: Bounded<1, 9>,
    pub dynamic_brotli_level: Bounded<0, 11>,
    pub dynamic_zstd_level: Bounded<1, 22>,
}

impl Default for CompressionConfig {
    fn default() -> Self {
        CompressionConfig {
            enabled: true,
            types: [
                "text/*",
                "application/json",
                "application/javascript",
                "application/xml",
                "application/xhtml+xml",
                "application/rss+xml",
                "application/atom+xml",
                "application/manifest+json",
                "application/ld+json",
                "application/wasm",
                "image/svg+xml",
                "font/ttf",
                "font/otf",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            min_length: ByteSize(256),
            gzip_level: Bounded(9),
            brotli_level: Bounded(11),
            zstd_level: Bounded(19),
            threads: Bounded(0),
            dynamic: true,
            dynamic_gzip_level: Bounded(1),
            dynamic_brotli_level: Bounded(4),
            dynamic_zstd_level: Bounded(3),
        }
    }
}

/// One listening socket and the routes it serves.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    pub addr: SocketAddr,
    /// HTTPS on this listener: its certificates (see [`TlsConfig`]).
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    #[serde(rename = "route")]
    pub routes: Vec<RouteConfig>,
}

/// A route: which requests (host, path prefix) go to which handler.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawRoute")]
pub struct RouteConfig {
    pub host: Option<HostPattern>,
    pub path: PathPrefix,
    pub handler: HandlerConfig,
    /// `Strict-Transport-Security` for the route's responses (TLS listeners only).
    pub hsts: Option<HstsConfig>,
}

/// What serves the requests of a route.
#[derive(Debug, Clone, PartialEq)]
pub enum HandlerConfig {
    Proxy(ProxyConfig),
    Static(StaticConfig),
    Respond(RespondConfig),
    Images(ImagesConfig),
    /// Live JSON records, written over HTTP, pushed to subscribers (SSE, WebSocket).
    Push(Box<PushConfig>),
    /// A permanent redirect (308) of every request to the same URL over HTTPS.
    RedirectHttps(RedirectConfig),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    host: Option<HostPattern>,
    #[serde(default = "PathPrefix::root")]
    path: PathPrefix,
    proxy: Option<ProxyConfig>,
    #[serde(rename = "static")]
    static_files: Option<StaticConfig>,
    respond: Option<RespondConfig>,
    images: Option<ImagesConfig>,
    push: Option<PushConfig>,
    redirect_https: Option<RedirectConfig>,
    hsts: Option<HstsConfig>,
}

impl TryFrom<RawRoute> for RouteConfig {
    type Error = String;
    fn try_from(r: RawRoute) -> Result<Self, String> {
        let mut handlers = Vec::new();
        if let Some(p) = r.proxy {
            handlers.push(HandlerConfig::Proxy(p));
        }
        if let Some(s) = r.static_files {
            handlers.push(HandlerConfig::Static(s));
        }
        if let Some(s) = r.respond {
            handlers.push(HandlerConfig::Respond(s));
        }
        if let Some(i) = r.images {
            handlers.push(HandlerConfig::Images(i));
        }
        if let Some(p) = r.push {
            handlers.push(HandlerConfig::Push(Box::new(p)));
        }
        if let Some(to) = r.redirect_https {
            handlers.push(HandlerConfig::RedirectHttps(to));
        }
        if handlers.len() != 1 {
            return Err(format!(
                "route `{}` needs exactly one handler (proxy, static, respond, images, push or redirect_https), found {}",
                r.path.0,
                handlers.len()
            ));
        }
        Ok(RouteConfig {
            host: r.host,
            path: r.path,
            handler: handlers.pop().expect("one handler"),
            hsts: r.hsts,
        })
    }
}

/// A caching reverse proxy to a pool of backends.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawProxy")]
pub struct ProxyConfig {
    /// The backends: inline (`upstream`), or a named `[pool.NAME]`. After parsing always
    /// `Pool`: [`Config::parse`] names each inline pool.
    pub upstream: UpstreamRef,
    /// Of an inline pool (`upstream`); a named pool sets its own.
    pub connect_timeout: Option<Dur<1, HOUR_MS>>,
    /// Time until the upstream's response head arrives, counted once the request (with its
    /// body) has been sent; while a body is being sent, the longest time without progress of
    /// it. At least 1ms.
    pub response_timeout: Dur<1>,
    /// Longest silence while reading an upstream body (between two reads, like nginx's
    /// `proxy_read_timeout`). At least 1ms.
    pub body_timeout: Dur<1>,
    /// Set false to proxy without caching.
    pub cache: bool,
    /// Whether clients' request directives that would make larder fetch more (no-cache,
    /// `Pragma: no-cache`, max-age, min-fresh) or serve staler (max-stale) are obeyed.
    pub request_cache_control: RequestCacheControl,
    /// Addresses whose request directives are obeyed even when `request_cache_control` ignores
    /// everyone else's (an office, a deploy script).
    pub request_cache_control_trusted: Vec<Cidr>,
    /// Idle pooled connections kept per backend, of an inline pool.
    pub pool_max_idle: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProxy {
    #[serde(default, deserialize_with = "pool::upstream_list")]
    upstream: Option<Vec<BackendConfig>>,
    pool: Option<String>,
    connect_timeout: Option<Dur<1, HOUR_MS>>,
    #[serde(default = "ProxyConfig::default_response_timeout")]
    response_timeout: Dur<1>,
    #[serde(default = "ProxyConfig::default_body_timeout")]
    body_timeout: Dur<1>,
    #[serde(default = "yes")]
    cache: bool,
    #[serde(default)]
    request_cache_control: RequestCacheControl,
    #[serde(default)]
    request_cache_control_trusted: Vec<Cidr>,
    pool_max_idle: Option<usize>,
}

impl TryFrom<RawProxy> for ProxyConfig {
    type Error = String;
    fn try_from(r: RawProxy) -> Result<Self, String> {
        let upstream = match (r.upstream, r.pool) {
            (Some(list), None) if list.is_empty() => {
                return Err("`upstream` lists no backend".into())
            }
            (Some(list), None) => UpstreamRef::Inline(list),
            (None, Some(name)) => {
                if r.connect_timeout.is_some() || r.pool_max_idle.is_some() {
                    return Err(format!(
                        "`connect_timeout` and `pool_max_idle` of a route with `pool` are set \
                         in [pool.{name}]"
                    ));
                }
                UpstreamRef::Pool(name)
            }
            (Some(_), Some(_)) => {
                return Err(
                    "needs one of `upstream` (URLs) and `pool` (a [pool.NAME]), not both".into(),
                )
            }
            (None, None) => {
                return Err("needs `upstream` (a URL or a list) or `pool` (a [pool.NAME])".into())
            }
        };
        Ok(ProxyConfig {
            upstream,
            connect_timeout: r.connect_timeout,
            response_timeout: r.response_timeout,
            body_timeout: r.body_timeout,
            cache: r.cache,
            request_cache_control: r.request_cache_control,
            request_cache_control_trusted: r.request_cache_control_trusted,
            pool_max_idle: r.pool_max_idle,
        })
    }
}

impl ProxyConfig {
    /// A route to the backends `upstreams` (an inline pool), every other setting at its
    /// default.
    pub fn new(upstream: Upstream) -> Self {
        Self::pool_of(vec![upstream])
    }

    /// A route to an inline pool of `upstreams`.
    pub fn pool_of(upstreams: Vec<Upstream>) -> Self {
        ProxyConfig {
            upstream: UpstreamRef::Inline(upstreams.into_iter().map(BackendConfig::new).collect()),
            connect_timeout: None,
            response_timeout: Self::default_response_timeout(),
            body_timeout: Self::default_body_timeout(),
            cache: true,
            request_cache_control: RequestCacheControl::default(),
            request_cache_control_trusted: Vec::new(),
            pool_max_idle: None,
        }
    }

    /// The name of the route's pool, once [`Config::parse`] named the inline ones.
    pub fn pool_name(&self) -> &str {
        match &self.upstream {
            UpstreamRef::Pool(name) => name,
            UpstreamRef::Inline(_) => "",
        }
    }

    /// The pool an inline `upstream` makes: round-robin, with a TCP health check when it has
    /// several backends (one alone has nothing to fail over to).
    pub fn inline_pool(&self, backends: &[BackendConfig]) -> PoolConfig {
        let mut pool = PoolConfig::of(backends.to_vec());
        if backends.len() > 1 {
            pool.health = Some(HealthConfig::tcp());
        }
        if let Some(t) = self.connect_timeout {
            pool.connect_timeout = t;
        }
        if let Some(n) = self.pool_max_idle {
            pool.max_idle = n;
        }
        pool
    }
    fn default_response_timeout() -> Dur<1> {
        Dur(Duration::from_secs(30))
    }
    fn default_body_timeout() -> Dur<1> {
        Dur(Duration::from_secs(60))
    }
}

/// Whose Cache-Control request directives a proxy route obeys. RFC 9111 §5.2.1: "They are
/// advisory; caches MAY implement them, but are not required to." `no-store` and
/// `only-if-cached` are obeyed from everyone either way: they never make larder fetch more.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RequestCacheControl {
    /// Only from `request_cache_control_trusted` addresses: no client can make every request an
    /// origin fetch (Varnish's default too).
    #[default]
    Ignore,
    /// From every client.
    #[serde(alias = "honor")]
    Honour,
}

fn yes() -> bool {
    true
}

/// Files served from a directory, or from files bundled in the binary.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticConfig {
    /// Directory served. Exactly one of `root` and `bundled`.
    pub root: Option<PathBuf>,
    /// A file set compiled into larder (`"demo"`), used by the embedded default.
    pub bundled: Option<Bundle>,
    /// Remove the route's path prefix before looking up the file.
    #[serde(default)]
    pub strip_prefix: bool,
    /// Files tried, in order, for a request naming a directory (`/docs/`).
    #[serde(default = "StaticConfig::default_index")]
    pub index: Vec<String>,
    /// Cache-Control sent with every file of this route (unless its extension has its own).
    pub cache_control: Option<HeaderValueCfg>,
    /// Cache-Control by file extension (without the dot, case-insensitive), e.g.
    /// `{ css = "public, max-age=31536000, immutable" }`; overrides `cache_control`.
    #[serde(default)]
    pub cache_control_by_extension: std::collections::BTreeMap<String, HeaderValueCfg>,
    /// Charset added to text types (`text/*`, JavaScript, JSON, XML, SVG); `""` adds none.
    #[serde(
        default = "StaticConfig::default_charset",
        deserialize_with = "charset"
    )]
    pub charset: String,
    /// Files up to this size are held in the memory cache (with their compressed variants);
    /// larger ones are streamed from disk in chunks.
    #[serde(default = "StaticConfig::default_memory_max")]
    pub max_memory_file_size: ByteSize,
    /// Serve `file.br`, `file.zst`, `file.gz` beside `file` to clients accepting them.
    #[serde(default = "yes")]
    pub precompressed: bool,
    /// Follow symlinks that lead outside `root` (symlinks within it are always followed).
    #[serde(default)]
    pub follow_symlinks: bool,
    /// Serve files and directories whose name starts with a dot (hidden by default: 404).
    #[serde(default)]
    pub dotfiles: bool,
    /// An HTML listing for directories without an index file (off by default: 403).
    #[serde(default)]
    pub directory_listing: bool,
}

impl StaticConfig {
    fn default_index() -> Vec<String> {
        vec!["index.html".into()]
    }
    fn default_charset() -> String {
        "utf-8".into()
    }
    fn default_memory_max() -> ByteSize {
        ByteSize(1024 * 1024)
    }
    pub fn new_root(root: PathBuf) -> Self {
        StaticConfig {
            root: Some(root),
            bundled: None,
            strip_prefix: false,
            index: Self::default_index(),
            cache_control: None,
            cache_control_by_extension: Default::default(),
            charset: Self::default_charset(),
            max_memory_file_size: Self::default_memory_max(),
            precompressed: true,
            follow_symlinks: false,
            dotfiles: false,
            directory_listing: false,
        }
    }
}

/// File sets compiled into the binary.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Bundle {
    /// The demo origin's JSON document and HTML pages.
    Demo,
}

/// A fixed response (health checks, `/ping`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RespondConfig {
    #[serde(default = "RespondConfig::default_status")]
    pub status: Bounded<100, 999>,
    #[serde(default)]
    pub body: String,
    #[serde(default = "RespondConfig::default_type")]
    pub content_type: HeaderValueCfg,
}

impl RespondConfig {
    fn default_status() -> Bounded<100, 999> {
        Bounded(200)
    }
    fn default_type() -> HeaderValueCfg {
        HeaderValueCfg(http::HeaderValue::from_static("text/plain"))
    }
}

/// The image server (`images = { dir = "..." }`): upload, store by MD5, transform from URL
/// parameters (zimg's API), results cached (the image server, `crate::images`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImagesConfig {
    /// Directory holding the originals (created at start if missing), sharded by MD5.
    pub dir: PathBuf,
    /// Largest upload accepted, enforced while reading (413 beyond); at most 1 GiB, since an
    /// upload is held in memory whole.
    #[serde(default = "ImagesConfig::default_max_upload")]
    pub max_upload_size: ByteSize<0, GIB>,
    /// Largest source image, in pixels, read from its header before decoding (bombs refused).
    #[serde(default = "ImagesConfig::default_max_pixels")]
    pub max_pixels: Bounded<1, 1_000_000_000>,
    /// Largest output width or height; a request for more is refused with 400.
    #[serde(default = "ImagesConfig::default_max_output")]
    pub max_output_dimension: Bounded<1, 65_535>,
    /// Most frames an animated GIF or WebP may have (upload and transform).
    #[serde(default = "ImagesConfig::default_max_frames")]
    pub max_frames: Bounded<1, 100_000>,
    /// Recently used originals held in memory (bytes, scan-resistant), so a transform of a hot
    /// image reads no file; 0 reads every original from the store.
    #[serde(default = "ImagesConfig::default_originals_memory")]
    pub originals_memory: ByteSize,
    /// Store originals in the shared tier (`[cache.shared]`) as well as in `dir`, so that any
    /// node can transform any uploaded image (a node missing one locally fetches it once).
    #[serde(default)]
    pub share_originals: bool,
    /// Transforms running at once; 0 means one per core.
    #[serde(default = "ImagesConfig::default_workers")]
    pub workers: Workers,
    /// Transforms waiting for a worker at most; beyond, 503 with Retry-After at once.
    #[serde(default = "ImagesConfig::default_queue_depth")]
    pub queue_depth: Bounded<0, 1_000_000>,
    /// Longest a transform waits for a worker and its decode memory; then 503 with Retry-After.
    #[serde(default = "ImagesConfig::default_queue_timeout")]
    pub queue_timeout: Dur<1>,
    /// Memory the route's transforms may hold at once (decoded pixels, resize and encode
    /// buffers, estimated from the header before decoding). A transform waits until its
    /// estimate fits; one that could never fit gets 422.
    #[serde(default = "ImagesConfig::default_decode_memory")]
    pub decode_memory: ByteSize<MIB>,
    /// Largest scale factor applied to the source (1.0: never enlarged). A request for more
    /// gets the largest allowed size with the requested aspect ratio.
    #[serde(default = "ImagesConfig::default_max_upscale")]
    pub max_upscale: Upscale,
    /// rav1e's speed preset for AVIF output: 1 (slowest, smallest) to 10 (fastest).
    #[serde(default = "ImagesConfig::default_avif_speed")]
    pub avif_speed: Bounded<1, 10>,
    /// Largest AVIF output in pixels (AVIF encoding costs far more CPU per pixel than the
    /// other formats): `f=avif` beyond it gets 400, `f=auto` falls back to the source's format.
    #[serde(default = "ImagesConfig::default_max_avif_pixels")]
    pub max_avif_pixels: Bounded<1, 1_000_000_000>,
    /// Output format when a request has no `f`: `none` keeps the source's, `auto` picks AVIF
    /// or WebP from Accept, or a fixed `jpeg`, `png`, `webp`, `avif`, `gif`.
    #[serde(default = "ImagesConfig::default_format")]
    pub default_format: FormatChoice,
    /// Encoding quality (1-100) when a request has no `q`.
    #[serde(default = "ImagesConfig::default_quality")]
    pub default_quality: Bounded<1, 100>,
    /// Store transform results in the shared cache (false: every request transforms).
    #[serde(default = "yes")]
    pub cache_results: bool,
    /// Addresses allowed to upload (`"127.0.0.1"`, `"10.0.0.0/8"`); empty allows any.
    #[serde(default)]
    pub upload_allow: Vec<Cidr>,
    /// Uploads need the `[admin]` token as a bearer token.
    #[serde(default)]
    pub upload_token: bool,
    /// Named parameter sets for `t=NAME`, written as a query string:
    /// `thumb = "w=100&h=100&p=1"`. Parameters in the request override the preset's.
    #[serde(default)]
    pub presets: std::collections::BTreeMap<String, Preset>,
}

impl ImagesConfig {
    /// An image route storing under `dir` with every other setting at its default.
    pub fn new_dir(dir: PathBuf) -> Self {
        ImagesConfig {
            dir,
            max_upload_size: Self::default_max_upload(),
            max_pixels: Self::default_max_pixels(),
            max_output_dimension: Self::default_max_output(),
            max_frames: Self::default_max_frames(),
            originals_memory: Self::default_originals_memory(),
            share_originals: false,
            workers: Bounded(0),
            queue_depth: Self::default_queue_depth(),
            queue_timeout: Self::default_queue_timeout(),
            decode_memory: Self::default_decode_memory(),
            max_upscale: Self::default_max_upscale(),
            avif_speed: Self::default_avif_speed(),
            max_avif_pixels: Self::default_max_avif_pixels(),
            default_format: Self::default_format(),
            default_quality: Self::default_quality(),
            cache_results: true,
            upload_allow: Vec::new(),
            upload_token: false,
            presets: Default::default(),
        }
    }
    fn default_max_upload() -> ByteSize<0, GIB> {
        ByteSize(20 << 20)
    }
    fn default_max_pixels() -> Bounded<1, 1_000_000_000> {
        Bounded(50_000_000)
    }
    fn default_max_output() -> Bounded<1, 65_535> {
        Bounded(4096)
    }
    fn default_max_frames() -> Bounded<1, 100_000> {
        Bounded(100)
    }
    fn default_workers() -> Workers {
        Bounded(0)
    }
    fn default_originals_memory() -> ByteSize {
        ByteSize(64 << 20)
    }
    fn default_queue_depth() -> Bounded<0, 1_000_000> {
        Bounded(64)
    }
    fn default_queue_timeout() -> Dur<1> {
        Dur(Duration::from_secs(10))
    }
    fn default_decode_memory() -> ByteSize<MIB> {
        ByteSize(512 << 20)
    }
    fn default_max_upscale() -> Upscale {
        Upscale(1.0)
    }
    fn default_avif_speed() -> Bounded<1, 10> {
        Bounded(10)
    }
    /// 1920×1080.
    fn default_max_avif_pixels() -> Bounded<1, 1_000_000_000> {
        Bounded(2_073_600)
    }
    fn default_format() -> FormatChoice {
        FormatChoice::Keep
    }
    fn default_quality() -> Bounded<1, 100> {
        Bounded(75)
    }
}

/// An address or network: `127.0.0.1`, `::1`, `10.0.0.0/8`, `fd00::/8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: std::net::IpAddr,
    pub prefix: u8,
}

impl Cidr {
    /// Whether `ip` lies in this network (IPv4-mapped IPv6 addresses count as IPv4).
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        use std::net::IpAddr;
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("invalid address `{s}` (use 127.0.0.1, ::1 or 10.0.0.0/8)");
        let (a, p) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let addr: std::net::IpAddr = a.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(bad)?,
            None => max,
        };
        Ok(Cidr { addr, prefix })
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

// ---------------------------------------------------------------------------------------------
// Value types: each validates itself while deserializing so errors carry the value's span.

/// An integer within `LO..=HI`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounded<const LO: i64, const HI: i64>(pub i64);

impl<const LO: i64, const HI: i64> Bounded<LO, HI> {
    /// `v` if it is within the bounds.
    pub fn new(v: i64) -> Result<Self, String> {
        if (LO..=HI).contains(&v) {
            Ok(Bounded(v))
        } else {
            Err(format!("{v} is out of range (must be {LO} to {HI})"))
        }
    }

    pub fn get(self) -> i64 {
        self.0
    }

    /// The value as a count (a negative one as 0).
    pub fn as_usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(0)
    }
}

/// As the command line writes it (`--workers 4`).
impl<const LO: i64, const HI: i64> FromStr for Bounded<LO, HI> {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let v = s
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not a whole number from {LO} to {HI}"))?;
        Self::new(v)
    }
}

impl<'de, const LO: i64, const HI: i64> Deserialize<'de> for Bounded<LO, HI> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::new(i64::deserialize(d)?).map_err(de::Error::custom)
    }
}

/// `v` if it is within `lo..=hi`, else an error giving the range in `show`'s words ("must be at
/// least 8KiB", "must be 100ms to 1h"; a bound at the end of `u64` is no bound).
fn within(v: u64, lo: u64, hi: u64, show: fn(u64) -> String) -> Result<u64, String> {
    if (lo..=hi).contains(&v) {
        return Ok(v);
    }
    let range = match (lo > 0, hi < u64::MAX) {
        (true, true) => format!("must be {} to {}", show(lo), show(hi)),
        (true, false) => format!("must be at least {}", show(lo)),
        _ => format!("must be at most {}", show(hi)),
    };
    Err(format!("{} is out of range ({range})", show(v)))
}

/// A whole number with a unit (`"64KiB"`, `"250ms"`, `"10"`) as a count of the smallest unit:
/// `units` maps each spelling (lowercase) to its multiple; `kind`, `example` and `unit_help`
/// word the errors.
fn parse_with_unit(
    s: &str,
    units: &[(&str, u64)],
    kind: &str,
    example: &str,
    unit_help: &str,
) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid {kind} `{s}` (expected e.g. {example})"))?;
    let unit = unit.trim().to_ascii_lowercase();
    let (_, mult) = units
        .iter()
        .find(|(u, _)| *u == unit)
        .ok_or_else(|| format!("invalid {kind} unit in `{s}` (use {unit_help})"))?;
    n.checked_mul(*mult)
        .ok_or_else(|| format!("{kind} `{s}` is too large"))
}

/// A size in bytes within `MIN..=MAX`, written as a number or a string like `"256MiB"`,
/// `"16KB"`, `"1g"`. Without bounds, any size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize<const MIN: u64 = 0, const MAX: u64 = { u64::MAX }>(pub u64);

/// `n` bytes in the largest unit that writes it whole: `8KiB`, `1MiB`, `1000`.
pub fn show_size(n: u64) -> String {
    match n {
        0 => "0".into(),
        n if n % GIB == 0 => format!("{}GiB", n / GIB),
        n if n % MIB == 0 => format!("{}MiB", n / MIB),
        n if n % KIB == 0 => format!("{}KiB", n / KIB),
        n => n.to_string(),
    }
}

/// A size as written (`"64KiB"`), unbounded.
fn parse_size(s: &str) -> Result<u64, String> {
    const UNITS: &[(&str, u64)] = &[
        ("", 1),
        ("b", 1),
        ("k", KIB),
        ("kb", KIB),
        ("kib", KIB),
        ("m", MIB),
        ("mb", MIB),
        ("mib", MIB),
        ("g", GIB),
        ("gb", GIB),
        ("gib", GIB),
    ];
    let example = "512, \"64KiB\", \"256MiB\"";
    parse_with_unit(s, UNITS, "size", example, "B, KiB, MiB or GiB")
}

impl<const MIN: u64, const MAX: u64> ByteSize<MIN, MAX> {
    /// `n` bytes if within the bounds.
    pub fn new(n: u64) -> Result<Self, String> {
        within(n, MIN, MAX, show_size).map(ByteSize)
    }
}

impl<const MIN: u64, const MAX: u64> FromStr for ByteSize<MIN, MAX> {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::new(parse_size(s)?)
    }
}

impl<'de, const MIN: u64, const MAX: u64> Deserialize<'de> for ByteSize<MIN, MAX> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Measured {
            expecting: "a size such as 1048576 or \"256MiB\"",
            number: |n| u64::try_from(n).map_err(|_| "a size cannot be negative".into()),
            make: Self::new,
            parse: parse_size,
        })
    }
}

/// Deserializes a measure written as a number or as a string with a unit (a size, a duration):
/// `number` turns a number into the count `make` takes, `parse` a string.
struct Measured<T> {
    expecting: &'static str,
    number: fn(i64) -> Result<u64, String>,
    make: fn(u64) -> Result<T, String>,
    parse: fn(&str) -> Result<u64, String>,
}

impl<T> de::Visitor<'_> for Measured<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.expecting)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        (self.number)(v).and_then(self.make).map_err(E::custom)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        match i64::try_from(v) {
            Ok(v) => self.visit_i64(v),
            Err(_) => Err(E::custom(format!("{v} is too large"))),
        }
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        (self.parse)(v).and_then(self.make).map_err(E::custom)
    }
}

/// A duration within `MIN_MS..=MAX_MS` milliseconds, written as `"250ms"`, `"10s"`, `"5m"`,
/// `"1h"`, or a number of seconds. Without bounds, 0 to [`YEAR_MS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur<const MIN_MS: u64 = 0, const MAX_MS: u64 = YEAR_MS>(pub Duration);

/// `ms` milliseconds in the largest unit that writes it whole: `100ms`, `10s`, `1h`.
pub fn show_duration(ms: u64) -> String {
    match ms {
        0 => "0s".into(),
        ms if ms % HOUR_MS == 0 => format!("{}h", ms / HOUR_MS),
        ms if ms % MINUTE_MS == 0 => format!("{}m", ms / MINUTE_MS),
        ms if ms % SECOND_MS == 0 => format!("{}s", ms / SECOND_MS),
        ms => format!("{ms}ms"),
    }
}

/// A duration as written (`"250ms"`), in milliseconds.
fn parse_ms(s: &str) -> Result<u64, String> {
    const UNITS: &[(&str, u64)] = &[
        ("ms", 1),
        ("", SECOND_MS),
        ("s", SECOND_MS),
        ("m", MINUTE_MS),
        ("h", HOUR_MS),
    ];
    let example = "\"500ms\", \"10s\", \"5m\"";
    parse_with_unit(s, UNITS, "duration", example, "ms, s, m or h")
}

impl<const MIN_MS: u64, const MAX_MS: u64> Dur<MIN_MS, MAX_MS> {
    /// `ms` milliseconds if within the bounds.
    pub fn from_ms(ms: u64) -> Result<Self, String> {
        within(ms, MIN_MS, MAX_MS, show_duration).map(|ms| Dur(Duration::from_millis(ms)))
    }
}

impl<const MIN_MS: u64, const MAX_MS: u64> FromStr for Dur<MIN_MS, MAX_MS> {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::from_ms(parse_ms(s)?)
    }
}

impl<'de, const MIN_MS: u64, const MAX_MS: u64> Deserialize<'de> for Dur<MIN_MS, MAX_MS> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Measured {
            expecting: "a duration such as \"10s\" or \"500ms\"",
            number: |secs| {
                u64::try_from(secs)
                    .map_err(|_| "a duration cannot be negative".to_string())?
                    .checked_mul(SECOND_MS)
                    .ok_or_else(|| format!("duration {secs} is too large"))
            },
            make: Self::from_ms,
            parse: parse_ms,
        })
    }
}

/// A fraction: a finite number from 0 to 1 (an integer is taken too: `0`, `1`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fraction(pub f64);

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if (0.0..=1.0).contains(&v) {
            Ok(Fraction(v))
        } else {
            Err(de::Error::custom(format!(
                "{v} is out of range (must be a number from 0 to 1)"
            )))
        }
    }
}

/// An RFC 9110 token: a content type's parts, a charset's name.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Content types written `type/subtype` or `type/*` (`[compression] types`): anything else
/// would never match a response.
fn media_ranges<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let types = Vec::<String>::deserialize(d)?;
    for t in &types {
        let ok = t.trim().split_once('/').is_some_and(|(major, minor)| {
            is_token(major) && major != "*" && (minor == "*" || is_token(minor))
        });
        if !ok {
            return Err(de::Error::custom(format!(
                "`{t}` is not a content type (use e.g. \"text/html\" or \"text/*\")"
            )));
        }
    }
    Ok(types)
}

/// A charset's name for Content-Type (`utf-8`), or empty for none.
fn charset<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if s.trim().is_empty() || is_token(s.trim()) {
        Ok(s)
    } else {
        Err(de::Error::custom(format!(
            "`{s}` is not a charset name (e.g. \"utf-8\"; \"\" adds none)"
        )))
    }
}

/// A scale factor from 1.0 (no enlargement) to 16.0, written as a number (`1`, `2.5`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Upscale(pub f64);

impl<'de> Deserialize<'de> for Upscale {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if !(1.0..=16.0).contains(&v) {
            return Err(de::Error::custom(format!(
                "{v} is out of range (must be 1.0 to 16.0; 1.0 never enlarges)"
            )));
        }
        Ok(Upscale(v))
    }
}

/// A response header name given in the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNameCfg(pub HeaderName);

impl<'de> Deserialize<'de> for HeaderNameCfg {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        HeaderName::from_bytes(s.as_bytes())
            .map(HeaderNameCfg)
            .map_err(|_| de::Error::custom(format!("`{s}` is not a valid header name")))
    }
}

/// A valid HTTP header value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderValueCfg(pub http::HeaderValue);

impl<'de> Deserialize<'de> for HeaderValueCfg {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        http::HeaderValue::from_str(s.trim())
            .map(HeaderValueCfg)
            .map_err(|_| de::Error::custom(format!("`{s}` is not a valid header value")))
    }
}

/// An upstream origin: `http://host:port` or `https://host:port` (no path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// `host:port` as sent in requests' authority.
    pub authority: http::uri::Authority,
    pub scheme: http::uri::Scheme,
}

impl FromStr for Upstream {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let uri: Uri = s
            .parse()
            .map_err(|e| format!("invalid upstream URL `{s}`: {e}"))?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or_else(|| format!("upstream `{s}` needs a scheme (http://)"))?;
        if scheme != http::uri::Scheme::HTTP && scheme != http::uri::Scheme::HTTPS {
            return Err(format!(
                "upstream `{s}`: the scheme must be http:// or https://"
            ));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| format!("upstream `{s}` needs a host"))?;
        if uri.path() != "/" && !uri.path().is_empty() {
            return Err(format!("upstream `{s}` must not have a path"));
        }
        Ok(Upstream { authority, scheme })
    }
}

impl<'de> Deserialize<'de> for Upstream {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

/// A route's host: exact (`example.com`), wildcard (`*.example.com`), or any (`*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    Any,
    Exact(String),
    /// Suffix including the dot: `*.example.com` → `.example.com`.
    Suffix(String),
}

impl FromStr for HostPattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        if t == "*" {
            return Ok(HostPattern::Any);
        }
        let valid = |h: &str| {
            !h.is_empty()
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
        };
        if let Some(rest) = t.strip_prefix("*.") {
            if valid(rest) {
                return Ok(HostPattern::Suffix(format!(".{rest}")));
            }
        } else if valid(&t) {
            return Ok(HostPattern::Exact(t));
        }
        Err(format!(
            "invalid host pattern `{s}` (use example.com, *.example.com or *)"
        ))
    }
}

impl<'de> Deserialize<'de> for HostPattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

/// A route's path prefix; always starts with `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPrefix(pub String);

impl PathPrefix {
    fn root() -> Self {
        PathPrefix("/".into())
    }
}

impl<'de> Deserialize<'de> for PathPrefix {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if !s.starts_with('/') {
            return Err(de::Error::custom(format!(
                "path prefix `{s}` must start with /"
            )));
        }
        Ok(PathPrefix(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Config::parse(text, "t.toml").unwrap_err().to_string()
    }

    const MIN: &str = "[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\nproxy = { upstream = \"http://127.0.0.1:2\" }\n";

    const POOLED: &str =
        "[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\nproxy = { pool = \"app\" }\n";

    #[test]
    fn pools_are_checked_and_named() {
        let e = err(&format!("{POOLED}[pool.app]\nbackends = []\n"));
        assert!(
            e.contains("line 6") && e.contains("pool `app` has no backend"),
            "{e}"
        );
        let e = err(&format!(
            "{POOLED}[pool.other]\nbackends = [\"http://a:1\"]\n"
        ));
        assert!(
            e.contains("line 4") && e.contains("no [pool.app] (pools: other)"),
            "{e}"
        );
        let e = err(&format!(
            "{POOLED}[pool.app]\nbackends = [{{ url = \"http://a:1\", backup = true }}]\n"
        ));
        assert!(e.contains("only backup backends"), "{e}");
        let e = err("[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\nproxy = { pool = \"a\", upstream = \"http://a:1\" }\n");
        assert!(e.contains("not both"), "{e}");
        let e = err(
            "[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\nproxy = { upstream = [] }\n",
        );
        assert!(e.contains("lists no backend"), "{e}");
        let e = err(&format!(
            "{POOLED}[pool.app]\nbackends = [\"http://a:1\"]\nbalance = \"random\"\n"
        ));
        assert!(e.contains("line 7") && e.contains("balance"), "{e}");
        // Inline upstreams become pools named after their backends; equal ones are shared.
        let two = "[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\npath = \"/a\"\nproxy = { upstream = \"http://a:1\" }\n[[listener.route]]\nproxy = { upstream = \"http://a:1\" }\n[[listener.route]]\npath = \"/b\"\nproxy = { upstream = \"http://a:1\", connect_timeout = \"1s\" }\n";
        let c = Config::parse(two, "t").unwrap();
        let names: Vec<&str> = (c.listeners[0].routes.iter())
            .map(|r| match &r.handler {
                HandlerConfig::Proxy(p) => p.pool_name(),
                _ => "",
            })
            .collect();
        assert_eq!(
            names,
            [
                "upstream http://a:1",
                "upstream http://a:1",
                "upstream http://a:1 #2"
            ]
        );
        assert_eq!(c.pools.len(), 2);
    }

    #[test]
    fn embedded_default_parses() {
        let c = Config::parse(EMBEDDED_DEFAULT, "embedded").unwrap();
        assert_eq!(c.listeners.len(), 2);
        // Live records with their demo page under /records/ (the token is made at start).
        let push = c.listeners[0]
            .routes
            .iter()
            .find(|r| r.path.0 == "/records/");
        let Some(HandlerConfig::Push(p)) = push.map(|r| &r.handler) else {
            panic!("the embedded default has a push route under /records/")
        };
        assert!(p.demo && p.token.is_none());
    }

    #[test]
    fn minimal_config_has_defaults() {
        let c = Config::parse(MIN, "t").unwrap();
        assert_eq!(c.cache.max_size, ByteSize(256 << 20));
        assert_eq!(c.listeners[0].routes[0].path.0, "/");
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let e = err(&format!("[cache]\nmax_size = \"1MiB\"\nbogus = 3\n{MIN}"));
        assert!(e.contains("line 3"), "{e}");
        assert!(e.contains("bogus"), "{e}");
    }

    #[test]
    fn bad_value_names_key_and_line() {
        let e = err(&format!("[server]\n\n[cache]\nmax_size = \"12XB\"\n{MIN}"));
        assert!(e.contains("line 4"), "{e}");
        assert!(e.contains("max_size"), "{e}");
        let e = err(&format!("[compression]\ngzip_level = 12\n{MIN}"));
        assert!(
            e.contains("line 2") && e.contains("gzip_level") && e.contains("1 to 9"),
            "{e}"
        );
    }

    #[test]
    fn route_needs_one_handler() {
        let e = err("[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\npath = \"/\"\n");
        assert!(e.contains("exactly one handler"), "{e}");
    }

    #[test]
    fn sizes_and_durations() {
        assert_eq!("64KiB".parse::<ByteSize>().unwrap(), ByteSize(65536));
        assert_eq!("3".parse::<ByteSize>().unwrap(), ByteSize(3));
        assert!("-3".parse::<ByteSize>().is_err());
        assert_eq!(
            "250ms".parse::<Dur>().unwrap(),
            Dur(Duration::from_millis(250))
        );
        assert!("5 fortnights".parse::<Dur>().is_err());
    }

    #[test]
    fn host_patterns() {
        assert_eq!("*".parse::<HostPattern>().unwrap(), HostPattern::Any);
        assert_eq!(
            "*.Example.com".parse::<HostPattern>().unwrap(),
            HostPattern::Suffix(".example.com".into())
        );
        assert!("exa mple".parse::<HostPattern>().is_err());
    }

    /// The `[admin]` token reaches the image route where its handler is built
    /// (`route::tests::handlers_get_the_admin_token_where_they_are_built`).
    #[test]
    fn images_route_and_presets() {
        let c = Config::parse(
            "[admin]\ntoken = \"s3cret\"\n[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\npath = \"/img/\"\nimages = { dir = \"/tmp/x\", upload_allow = [\"10.0.0.0/8\"], presets = { thumb = \"w=100&h=100\" } }\n",
            "t",
        )
        .unwrap();
        let HandlerConfig::Images(i) = &c.listeners[0].routes[0].handler else {
            panic!("images route")
        };
        assert!(i.upload_allow[0].contains("10.1.2.3".parse().unwrap()));
        assert!(!i.upload_allow[0].contains("11.1.2.3".parse().unwrap()));
        let e = err("[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\nimages = { dir = \"/x\", presets = { a = \"w=abc\" } }\n");
        assert!(e.contains("line 4") && e.contains("`w`"), "{e}");
    }

    #[test]
    fn bounded_sizes_durations_and_fractions() {
        type Head = ByteSize<{ 8 * KIB }, MIB>;
        assert_eq!("16KiB".parse::<Head>().unwrap(), ByteSize(16 * KIB));
        let e = "1KiB".parse::<Head>().unwrap_err();
        assert!(
            e.contains("1KiB") && e.contains("must be 8KiB to 1MiB"),
            "{e}"
        );
        let e = ByteSize::<MIB>::new(0).unwrap_err();
        assert!(e.contains("must be at least 1MiB"), "{e}");
        type Timeout = Dur<100, HOUR_MS>;
        assert!("0s".parse::<Timeout>().unwrap_err().contains("100ms to 1h"));
        assert!("2h".parse::<Timeout>().is_err());
        assert!("100ms".parse::<Timeout>().is_ok());
        // Once an overflow panic; now an error, as is anything past a year.
        assert!("99999999999999999h".parse::<Dur>().is_err());
        assert!("8761h".parse::<Dur>().is_err());
        assert_eq!(
            "8760h".parse::<Dur>().unwrap().0,
            Duration::from_millis(YEAR_MS)
        );
        assert!("2000".parse::<Workers>().unwrap_err().contains("0 to 1024"));
        for bad in ["-3.5", "nan", "inf", "1.01"] {
            let e = err(&format!("[cache]\nheuristic_fraction = {bad}\n{MIN}"));
            assert!(e.contains("line 2, key `cache.heuristic_fraction`"), "{e}");
        }
        let c = Config::parse(&format!("[cache]\nheuristic_fraction = 1\n{MIN}"), "t").unwrap();
        assert_eq!(c.cache.heuristic_fraction, Fraction(1.0));
    }

    #[test]
    fn cache_tiers() {
        let c = Config::parse(
            &format!(
                "[cache.disk]\ndir = \"/var/cache/larder\"\nmax_size = \"20GiB\"\n\
                 [cache.shared]\nurl = \"redis+cluster://10.0.0.1:7000\"\ntimeout = \"50ms\"\n{MIN}"
            ),
            "t.toml",
        )
        .unwrap();
        let disk = c.cache.disk.unwrap();
        assert_eq!((disk.max_size.0, disk.write), (20 << 30, DiskWrite::All));
        let shared = c.cache.shared.unwrap();
        assert_eq!(shared.client_url(), "redis-cluster://10.0.0.1:7000");
        assert_eq!(shared.lease.0, Duration::from_secs(5));
        let e = err(&format!("[cache.shared]\nurl = \"http://x:1\"\n{MIN}"));
        assert!(
            e.contains("line 1") && e.contains("cache.shared") && e.contains("not a Redis URL"),
            "{e}"
        );
        let e = err(&format!(
            "[cache.disk]\ndir = \"d\"\nmax_size = \"1MiB\"\n{MIN}"
        ));
        assert!(e.contains("line 3") && e.contains("max_size"), "{e}");
        let e = err(&format!(
            "[cache.disk]\ndir = \"d\"\nwrite = \"sometimes\"\n{MIN}"
        ));
        assert!(e.contains("line 3") && e.contains("write"), "{e}");
    }

    #[test]
    fn errors_name_the_full_key_path_even_in_inline_tables() {
        let e = err(&format!(
            "{MIN}[[listener.route]]\npath = \"/r\"\nrespond = {{ body = \"x\", status = 1000 }}\n"
        ));
        assert!(
            e.contains("line 7, key `listener.route.respond.status`: 1000 is out of range"),
            "{e}"
        );
        let e = err(&format!("[server]\nworkers = 1\nh2c = \"yes\"\n{MIN}"));
        assert!(e.contains("line 3, key `server.h2c`"), "{e}");
        let e = err(&format!("cache.max_size = \"1KiB\"\n{MIN}"));
        assert!(e.contains("line 1, key `cache.max_size`"), "{e}");
    }

    #[test]
    fn listeners_sharing_a_port() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(ports_collide(a("127.0.0.1:80"), a("127.0.0.1:80")));
        assert!(ports_collide(a("0.0.0.0:80"), a("127.0.0.1:80")));
        assert!(ports_collide(a("127.0.0.1:80"), a("0.0.0.0:80")));
        assert!(ports_collide(a("[::]:80"), a("10.0.0.1:80")));
        assert!(ports_collide(a("[::]:80"), a("0.0.0.0:80")));
        assert!(ports_collide(a("[::ffff:127.0.0.1]:80"), a("127.0.0.1:80")));
        assert!(!ports_collide(a("0.0.0.0:80"), a("[::1]:80")));
        assert!(!ports_collide(a("127.0.0.1:80"), a("127.0.0.2:80")));
        assert!(!ports_collide(a("127.0.0.1:80"), a("127.0.0.1:81")));
        assert!(!ports_collide(a("0.0.0.0:0"), a("127.0.0.1:0")));
        let e = err(&format!(
            "{MIN}[[listener]]\naddr = \"0.0.0.0:1\"\n[[listener.route]]\nrespond = {{}}\n"
        ));
        assert!(
            e.contains("line 6, key `listener.addr`") && e.contains("(line 2)"),
            "{e}"
        );
        let e = err(&format!(
            "[admin]\ntoken = \"t\"\nlisten = \"[::]:1\"\n{MIN}"
        ));
        assert!(e.contains("line 3, key `admin.listen`"), "{e}");
    }

    #[test]
    fn cross_key_checks_blame_the_key_that_is_set() {
        let e = err(&format!("[cache]\nmax_size = \"8MiB\"\n{MIN}"));
        assert!(e.contains("line 2, key `cache.max_size`"), "{e}");
        let e = err(&format!(
            "[cache]\nmax_object_size = \"9MiB\"\nmax_size = \"8MiB\"\n{MIN}"
        ));
        assert!(e.contains("line 2, key `cache.max_object_size`"), "{e}");
        let text = format!("[cache]\nmax_object_size = \"8MiB\"\nmax_size = \"8MiB\"\n{MIN}");
        assert!(Config::parse(&text, "t").is_ok());
        let e = err("[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\nstatic = { root = \"/x\", bundled = \"demo\" }\n");
        assert!(e.contains("line 4, key `listener.route.static`"), "{e}");
    }

    #[test]
    fn values_that_would_never_match_or_never_work() {
        let e = err(&format!(
            "[compression]\ntypes = [\"text/*\", \"json\"]\n{MIN}"
        ));
        assert!(
            e.contains("line 2, key `compression.types`") && e.contains("`json`"),
            "{e}"
        );
        assert!(err(&format!("[compression]\ntypes = [\"*/*\"]\n{MIN}")).contains("types"));
        let ok = format!("[compression]\ntypes = [\"text/*\", \"application/ld+json\"]\n{MIN}");
        assert!(Config::parse(&ok, "t").is_ok());
        let route = "[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\n";
        let e = err(&format!(
            "{route}static = {{ root = \"/x\", charset = \"utf-8\\r\\nx: y\" }}\n"
        ));
        assert!(
            e.contains("line 4, key `listener.route.static.charset`"),
            "{e}"
        );
        assert!(Config::parse(
            &format!("{route}static = {{ root = \"/x\", charset = \"\" }}\n"),
            "t"
        )
        .is_ok());
        let e = err(&format!(
            "{route}[listener.route.images]\ndir = \"/x\"\nupload_token = true\n"
        ));
        assert!(
            e.contains("line 6, key `listener.route.images.upload_token`"),
            "{e}"
        );
    }

    #[test]
    fn max_connections_fits_the_open_files_limit() {
        // Set in the file and above the limit: an error naming it.
        let mut c =
            Config::parse(&format!("[server]\nmax_connections = 5000\n{MIN}"), "t").unwrap();
        let e = c.fit_open_files(1024).unwrap_err().to_string();
        assert!(e.contains("line 2, key `server.max_connections`"), "{e}");
        assert!(e.contains("1024") && e.contains("991"), "{e}");
        assert!(c.fit_open_files(5033).unwrap().is_none());
        // The default is lowered to what fits: 1024 less 32 reserved and one listening socket.
        let mut c = Config::parse(MIN, "t").unwrap();
        assert_eq!(c.fit_open_files(1024).unwrap(), Some(991));
        assert_eq!(c.server.max_connections.get(), 991);
        // per-core: a listening socket per listener and worker.
        let mut c = Config::parse(
            &format!("[server]\nthreading = \"per-core\"\nworkers = 4\n{MIN}"),
            "t",
        )
        .unwrap();
        assert_eq!(c.fit_open_files(1024).unwrap(), Some(988));
        // No room at all is an error even for the default.
        let mut c = Config::parse(MIN, "t").unwrap();
        assert!(c.fit_open_files(33).is_err());
    }

    #[test]
    fn proxy_body_timeout_defaults_to_60s_and_is_never_zero() {
        let c = Config::parse(MIN, "t").unwrap();
        let HandlerConfig::Proxy(p) = &c.listeners[0].routes[0].handler else {
            panic!("proxy route")
        };
        assert_eq!(p.body_timeout, Dur(Duration::from_secs(60)));
        let e = err(&MIN.replace("2\" }", "2\", body_timeout = \"0s\" }"));
        assert!(
            e.contains("line 4, key `listener.route.proxy.body_timeout`")
                && e.contains("must be 1ms to"),
            "{e}"
        );
    }

    #[test]
    fn request_cache_control_is_ignored_by_default() {
        let proxy = |text: &str| {
            let c = Config::parse(text, "t").unwrap();
            let HandlerConfig::Proxy(p) = &c.listeners[0].routes[0].handler else {
                panic!("proxy route")
            };
            p.clone()
        };
        let p = proxy(MIN);
        assert_eq!(p.request_cache_control, RequestCacheControl::Ignore);
        assert!(p.request_cache_control_trusted.is_empty());
        for (value, want) in [
            ("honour", RequestCacheControl::Honour),
            ("honor", RequestCacheControl::Honour),
            ("ignore", RequestCacheControl::Ignore),
        ] {
            let text = MIN.replace(
                "2\" }",
                &format!("2\", request_cache_control = \"{value}\" }}"),
            );
            assert_eq!(proxy(&text).request_cache_control, want);
        }
        let text = MIN.replace(
            "2\" }",
            "2\", request_cache_control_trusted = [\"10.0.0.0/8\"] }",
        );
        assert!(proxy(&text).request_cache_control_trusted[0].contains("10.1.2.3".parse().unwrap()));
        let e = err(&MIN.replace("2\" }", "2\", request_cache_control = \"always\" }"));
        assert!(e.contains("line 4") && e.contains("honour"), "{e}");
    }

    #[test]
    fn upstream_rejects_paths_and_other_schemes() {
        assert!("http://127.0.0.1:3000".parse::<Upstream>().is_ok());
        assert!("http://127.0.0.1:3000/x".parse::<Upstream>().is_err());
        assert!("https://example.com".parse::<Upstream>().is_ok());
        assert!("ftp://x".parse::<Upstream>().is_err());
    }

    /// Config is plain data at the bottom of the dependency graph: outside its tests, no file
    /// of it names another module of larder (`crate::` anywhere, `super::` in this file, whose
    /// parent is the crate), in code or in a `use`. Doc comments may mention them.
    #[test]
    fn config_imports_nothing_of_larders() {
        let files = [
            ("config.rs", include_str!("config.rs"), true),
            (
                "config/image_params.rs",
                include_str!("config/image_params.rs"),
                false,
            ),
        ];
        for (name, text, root) in files {
            let code = text.split("#[cfg(test)]").next().unwrap_or(text);
            for (n, line) in code.lines().enumerate() {
                let line = line.trim_start();
                if line.starts_with("//") {
                    continue;
                }
                let reaches_out = line.contains("crate::") || (root && line.contains("super::"));
                assert!(!reaches_out, "{name}:{}: {line}", n + 1);
            }
        }
    }

    /// `threading = "auto"` (the default) runs one worker per-core and several work-stealing;
    /// an explicit layout is kept whatever the count.
    #[test]
    fn auto_threading_is_per_core_for_one_worker() {
        let layout = |server: &str| {
            Config::parse(&format!("[server]\n{server}\n{MIN}"), "t.toml")
                .unwrap()
                .server
                .layout()
        };
        assert_eq!(layout("workers = 1"), Layout::PerCore);
        assert_eq!(layout("workers = 1\nthreading = \"auto\""), Layout::PerCore);
        assert_eq!(layout("workers = 2"), Layout::WorkStealing);
        assert_eq!(
            layout("workers = 1\nthreading = \"work-stealing\""),
            Layout::WorkStealing
        );
        assert_eq!(
            layout("workers = 2\nthreading = \"per-core\""),
            Layout::PerCore
        );
    }
}
