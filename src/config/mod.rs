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
//!
//! The files form a ladder, each importing only from those below it: the value types (`units`:
//! counts, sizes, durations; `net`: addresses, hosts, upstreams; `headers`) and `error` (the
//! error and the locator of keys in the text) at the bottom; a file per section above them
//! (`server`, `cache`, `listener` with its routes, a file per handler, ...); this file on top:
//! [`Config`], its loading, and the checks that span sections. The files name a file below
//! them (`super::units::Dur`), never what this file defines or re-exports (`super::Dur`); that,
//! and that config names no other module of larder, is checked by the layout test in
//! src/lib.rs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

pub mod access_log;
mod admin;
mod cache;
mod compression;
mod error;
mod headers;
pub mod image_options;
pub mod image_params;
mod images;
mod listener;
mod net;
pub mod otel;
pub mod pool;
mod proxy;
pub mod push;
mod respond;
pub mod rules;
pub mod rules_auth;
pub mod rules_cache;
pub mod rules_limits;
mod server;
mod static_files;
pub mod tiers;
pub mod tls;
mod units;

pub use access_log::{AccessLogConfig, LogFormat, LogPiece, LOG_FIELDS};
pub use admin::AdminConfig;
pub use cache::CacheConfig;
pub use compression::CompressionConfig;
pub use error::Error;
use error::{Index, Key, Locator, Seg};
pub use headers::{HeaderNameCfg, HeaderValueCfg};
pub use images::{
    allowed_source, AvifEncoder, ImagesConfig, ImgproxyConfig, KeyPair, OriginRef, SourceUrl,
    ThumborConfig,
};
pub use listener::{HandlerConfig, ListenerConfig, RealIpConfig, RealIpHeader, RouteConfig};
pub use net::{ports_collide, Cidr, HostPattern, PathPrefix, Upstream};
pub use otel::TracingConfig;
pub use pool::{
    BackendConfig, Balance, HashOn, HealthCheck, HealthConfig, PassiveConfig, PoolConfig,
    UpstreamRef, UpstreamTlsConfig,
};
pub use proxy::{ProxyConfig, RequestCacheControl};
pub use push::{GroupConfig, IdPattern, JwtConfig, PushConfig};
pub use respond::{FixedHeaders, RespondConfig, SwitchName};
pub use rules::{Action, Policies, RuleConfig, When};
pub use server::{
    lookup_group, lookup_user, Layout, LogLevel, ProcessLogFormat, ServerConfig, Threading, UserIds,
};
pub use static_files::{Bundle, StaticConfig};
pub use tiers::{DiskConfig, DiskWrite, SharedConfig};
pub use tls::{
    AcmeChallenge, AcmeConfig, CertConfig, HstsConfig, RedirectConfig, TlsConfig, TlsVersion,
    SELF_SIGNED_DIR,
};
pub use units::{
    show_duration, show_size, Bounded, ByteSize, Dur, Fraction, Upscale, Workers, GIB, HOUR_MS,
    KIB, MAX_WORKERS, MIB, MINUTE_MS, SECOND_MS, YEAR_MS,
};

/// The configuration compiled into the binary: what `larder` runs with no arguments.
pub const EMBEDDED_DEFAULT: &str = include_str!("../../larder.default.toml");

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
    /// Named policies routes use (`[[policy.NAME]]`, each a list of rules; docs/rules.md).
    #[serde(default, rename = "policy")]
    pub policies: Policies,
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
pub fn read_bounded(path: &Path) -> std::io::Result<String> {
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
        cfg.set_state_dir(cfg.server.state_dir.clone());
        Ok(cfg)
    }

    /// Sets `[server] state_dir` (as `--state-dir` does), and with it where the listeners'
    /// `self_signed` certificates are kept (its `tls/`) and ACME's state unless a listener
    /// names its own (its `acme/`).
    pub fn set_state_dir(&mut self, dir: PathBuf) {
        for l in &mut self.listeners {
            if let Some(tls) = &mut l.tls {
                tls.self_signed_dir = dir.join("tls");
                if let Some(acme) = &mut tls.acme {
                    acme.state_dir =
                        (acme.given_state_dir.clone()).unwrap_or_else(|| dir.join("acme"));
                }
            }
        }
        self.server.state_dir = dir;
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
                let urls: Vec<String> = (backends.iter()).map(|b| b.url.to_string()).collect();
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
    /// and checks what the file names on this machine: the roots and watermark routes read,
    /// the files rules read, the user and group to run as.
    pub fn load(path: &Path) -> Result<Config, Error> {
        let text = read_bounded(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut cfg = Self::parse(&text, &path.display().to_string())?;
        cfg.source.path = Some(path.to_path_buf());
        cfg.check_directories()?;
        cfg.check_user()?;
        cfg.check_rule_files()?;
        Ok(cfg)
    }

    /// `[server] user` and `group` exist on this machine: starting as root would otherwise
    /// fail after binding.
    fn check_user(&self) -> Result<(), Error> {
        let s = &self.server;
        if let Some(user) = s.user.as_deref().filter(|u| lookup_user(u).is_none()) {
            return Err(self.source.error(
                &[&[Key("server"), Key("user")]],
                format!("no user `{user}` on this system"),
            ));
        }
        if let Some(group) = s.group.as_deref().filter(|g| lookup_group(g).is_none()) {
            return Err(self.source.error(
                &[&[Key("server"), Key("group")]],
                format!("no group `{group}` on this system"),
            ));
        }
        if s.group.is_some() && s.user.is_none() {
            return Err(self.source.error(
                &[&[Key("server"), Key("group")]],
                "needs [server] user: larder changes group only with its user",
            ));
        }
        Ok(())
    }

    /// The files and directories routes read exist here: a static route's `root` and an image
    /// route's `root` (directories: one that does not exist, a typo or a missing mount, would
    /// answer 404 to every request) and an image route's `watermark` (a file: without it every
    /// request asking for the watermark would be refused).
    fn check_directories(&self) -> Result<(), Error> {
        for (i, l) in self.listeners.iter().enumerate() {
            for (j, r) in l.routes.iter().enumerate() {
                let wanted: Vec<(&str, &str, &Path, bool, &str)> = match &r.handler {
                    HandlerConfig::Static(StaticConfig {
                        root: Some(root), ..
                    }) => vec![(
                        "static",
                        "root",
                        root,
                        true,
                        "every request would be answered 404",
                    )],
                    HandlerConfig::Images(im) => {
                        let root = im.root.iter().map(|p| {
                            let why = "every `local://` source would be answered 404";
                            ("images", "root", p.as_path(), true, why)
                        });
                        let mark = im.watermark.iter().map(|p| {
                            let why = "every request for the watermark would be refused";
                            ("images", "watermark", p.as_path(), false, why)
                        });
                        root.chain(mark).collect()
                    }
                    _ => Vec::new(),
                };
                for (handler, key, path, dir, consequence) in wanted {
                    let why = match std::fs::metadata(path) {
                        Ok(m) if m.is_dir() == dir => continue,
                        Ok(_) if dir => "is not a directory".to_string(),
                        Ok(_) => "is not a file".to_string(),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                            "does not exist".to_string()
                        }
                        Err(e) => format!("cannot be read: {e}"),
                    };
                    let relative = if path.is_relative() {
                        let cwd = std::env::current_dir().unwrap_or_default();
                        format!(" (relative to the working directory, {})", cwd.display())
                    } else {
                        String::new()
                    };
                    let at = [Key("listener"), Index(i), Key("route"), Index(j)];
                    return Err(self.source.error(
                        &[&[&at[..], &[Key(handler), Key(key)]].concat(), &at],
                        format!("{}{relative} {why}: {consequence}", path.display()),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The files rules read (an htpasswd, keys, a public key, a JWKS) exist and hold what the
    /// rule needs: a missing one would fail every request of the route.
    fn check_rule_files(&self) -> Result<(), Error> {
        let mut at = Vec::new();
        for (name, rules) in &self.policies {
            for (k, r) in rules.iter().enumerate() {
                at.push((vec![Key("policy"), Key(name), Index(k)], r));
            }
        }
        for (i, l) in self.listeners.iter().enumerate() {
            for (j, route) in l.routes.iter().enumerate() {
                for (k, r) in route.rules.iter().enumerate() {
                    let path = vec![
                        Key("listener"),
                        Index(i),
                        Key("route"),
                        Index(j),
                        Key("rule"),
                        Index(k),
                    ];
                    at.push((path, r));
                }
            }
        }
        for (path, r) in at {
            if let Err((key, why)) = check_auth_files(&r.action) {
                let kind = r.action.kind();
                let full = [&path[..], &[Key(kind), Key(key)]].concat();
                let relative = if why.starts_with('/') {
                    String::new()
                } else {
                    let cwd = std::env::current_dir().unwrap_or_default();
                    format!(" (relative to the working directory, {})", cwd.display())
                };
                return Err(self
                    .source
                    .error(&[&full, &path], format!("{why}{relative}")));
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
                if let Some((key, why)) = tls.certificate_sources_error() {
                    return Err(src.error(&[&at(key), &addr[..3]], why));
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
                    HandlerConfig::Respond(rc) if rc.switch.is_some() => {
                        return Err(src.error(
                            &[&at(&["respond", "switch"]), &at(&["respond"])],
                            "a switch is for a rule's `respond` ([[listener.route.rule]]): a \
                             route's own handler always answers",
                        ));
                    }
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
                    HandlerConfig::Images(im) => {
                        if let Some((key, why)) = self.images_sources_error(im) {
                            let mut keys = vec![at(&["images"])];
                            if !key.is_empty() {
                                keys.insert(0, at(&["images", key]));
                            }
                            let keys: Vec<&[Seg]> = keys.iter().map(Vec::as_slice).collect();
                            return Err(src.error(&keys, why));
                        }
                        if let Some(why) = im.decoded_cache_error() {
                            return Err(src.error(
                                &[&at(&["images", "decoded_cache"]), &at(&["images"])],
                                why,
                            ));
                        }
                    }
                    _ => {}
                }
            }
        }
        self.check_pools()?;
        self.check_rules()?;
        self.check_limits()?;
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

    /// What is wrong with an image route's sources, and the key to blame (empty: the route):
    /// it needs one of `dir`, `origin`, `root`; `origin` must read as a URL or name a pool;
    /// `allow_sources` are http(s) URLs.
    fn images_sources_error(&self, im: &ImagesConfig) -> Option<(&'static str, String)> {
        if im.dir.is_none() && im.origin.is_none() && im.root.is_none() {
            return Some((
                "",
                "needs one of `dir` (uploads), `origin` (a base URL or pool:NAME) and `root` \
                 (a directory): it has no originals"
                    .into(),
            ));
        }
        match im.origin_ref() {
            Err(why) => return Some(("origin", why)),
            Ok(Some(images::OriginRef::Pool(name))) if !self.pools.contains_key(&name) => {
                let known: Vec<&str> = self.pools.keys().map(String::as_str).collect();
                let known = if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                };
                return Some(("origin", format!("no [pool.{name}] (pools: {known})")));
            }
            _ => {}
        }
        for a in &im.allow_sources {
            if let Err(why) = images::allowed_source(a) {
                return Some(("allow_sources", why));
            }
        }
        None
    }

    /// Rules: every `use` names a policy that does not use itself, and no route runs more than
    /// [`rules::MAX_RULES`].
    fn check_rules(&self) -> Result<(), Error> {
        let src = &self.source;
        for (name, rules) in &self.policies {
            if let Err((k, why)) = rules::expand(rules, &self.policies) {
                let at = [Key("policy"), Key(name), Index(k)];
                return Err(src.error(&[&[&at[..], &[Key("use")]].concat(), &at], why));
            }
        }
        for (i, l) in self.listeners.iter().enumerate() {
            for (j, r) in l.routes.iter().enumerate() {
                if let Err((k, why)) = rules::expand(&r.rules, &self.policies) {
                    let at = [Key("listener"), Index(i), Key("route"), Index(j)];
                    let rule = [&at[..], &[Key("rule"), Index(k)]].concat();
                    return Err(src.error(&[&[&rule[..], &[Key("use")]].concat(), &rule, &at], why));
                }
            }
        }
        self.check_rule_pools()
    }

    /// The pools a `split` or `mirror` rule names exist (config/rules_cache.rs).
    fn check_rule_pools(&self) -> Result<(), Error> {
        let src = &self.source;
        let named = |a: &rules::Action| -> Vec<(&'static str, String)> {
            match a {
                rules::Action::Split(s) => (s.pools.iter())
                    .map(|(n, _)| ("split", n.clone()))
                    .collect(),
                rules::Action::Mirror(m) => vec![("mirror", m.pool.clone())],
                _ => Vec::new(),
            }
        };
        let mut lists: Vec<(Vec<Seg>, &Vec<RuleConfig>)> = Vec::new();
        for (name, rules) in &self.policies {
            lists.push((vec![Key("policy"), Key(name)], rules));
        }
        for (i, l) in self.listeners.iter().enumerate() {
            for (j, r) in l.routes.iter().enumerate() {
                let at = vec![
                    Key("listener"),
                    Index(i),
                    Key("route"),
                    Index(j),
                    Key("rule"),
                ];
                lists.push((at, &r.rules));
            }
        }
        for (at, rules) in lists {
            for (k, r) in rules.iter().enumerate() {
                for (kind, pool) in named(&r.action) {
                    if self.pools.contains_key(&pool) {
                        continue;
                    }
                    let rule = [&at[..], &[Index(k)]].concat();
                    let known: Vec<&str> = self.pools.keys().map(String::as_str).collect();
                    let why = format!(
                        "`{kind}` names the pool `{pool}`: no [pool.{pool}] (pools: {})",
                        if known.is_empty() {
                            "none".into()
                        } else {
                            known.join(", ")
                        }
                    );
                    return Err(src.error(&[&[&rule[..], &[Key(kind)]].concat(), &rule], why));
                }
            }
        }
        Ok(())
    }

    /// Limits (issue #41 item 4): a fleet-wide rate limit needs the fleet's Redis.
    fn check_limits(&self) -> Result<(), Error> {
        if self.cache.shared.is_some() {
            return Ok(());
        }
        let fleet = |r: &RuleConfig| matches!(&r.action, Action::RateLimit(l) if l.fleet);
        let why = "`fleet = true` needs [cache.shared]: there is no Redis to decide in";
        for (name, rules) in &self.policies {
            if let Some(k) = rules.iter().position(fleet) {
                let at = [Key("policy"), Key(name), Index(k)];
                let key = [&at[..], &[Key("rate_limit"), Key("fleet")]].concat();
                return Err(self.source.error(&[&key, &at], why));
            }
        }
        for (i, l) in self.listeners.iter().enumerate() {
            for (j, r) in l.routes.iter().enumerate() {
                if let Some(k) = r.rules.iter().position(fleet) {
                    let at = [
                        Key("listener"),
                        Index(i),
                        Key("route"),
                        Index(j),
                        Key("rule"),
                        Index(k),
                    ];
                    let key = [&at[..], &[Key("rate_limit"), Key("fleet")]].concat();
                    return Err(self.source.error(&[&key, &at], why));
                }
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

    /// Memory files of large bodies larder may hold open under the open-files `limit`: at most
    /// `cache.zero_copy_files`, and only descriptors the connections (at `max_connections`, as
    /// fitted by [`Config::fit_open_files`]), the listening sockets and [`RESERVED_FDS`] leave
    /// over, so they never take a connection's; none when `cache.zero_copy_min` is 0.
    pub fn zero_copy_files(&self, limit: u64) -> u64 {
        if self.cache.zero_copy_min.0 == 0 {
            return 0;
        }
        let taken = RESERVED_FDS
            + self.listening_sockets()
            + self.server.max_connections.get().max(0) as u64;
        (self.cache.zero_copy_files.get() as u64).min(limit.saturating_sub(taken))
    }

    /// Fits `max_connections` to `limit`, the open files this process may have (its soft limit
    /// once raised to the hard one): each connection is a descriptor, besides the listening
    /// sockets and [`RESERVED_FDS`] (large bodies' memory files take what is left over:
    /// [`Config::zero_copy_files`]). Beyond the limit, accepting fails with EMFILE long before
    /// the connection bound pauses it. A value the file sets that does not fit is an error
    /// naming it; the default is lowered to fit (leaving large bodies' memory files up to a
    /// quarter of the room), and the new bound returned to be reported.
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
        // The default lowered: large bodies' memory files keep up to a quarter of the room
        // (`Config::zero_copy_files` gives them what connections leave over).
        let files = i64::try_from(self.zero_copy_files(u64::MAX)).unwrap_or(i64::MAX);
        let lowered = (fits - files.min(fits / 4)).max(1);
        self.server.max_connections = Bounded(lowered);
        Ok(Some(lowered))
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
            policies: Policies::new(),
            listeners: vec![ListenerConfig {
                addr: listen,
                tls: None,
                proxy_protocol: false,
                real_ip: None,
                routes: vec![RouteConfig {
                    host: None,
                    path: PathPrefix("/".into()),
                    handler,
                    hsts: None,
                    rules: Vec::new(),
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

/// That the files an authentication rule names exist and hold what it needs: else the key to
/// blame and why.
fn check_auth_files(action: &Action) -> Result<(), (&'static str, String)> {
    use rules_auth::JwtKey;
    let files: Vec<(&'static str, &PathBuf)> = match action {
        Action::BasicAuth(b) => vec![("htpasswd", &b.htpasswd)],
        Action::ApiKey(k) => k.keys_file.iter().map(|f| ("keys_file", f)).collect(),
        Action::Jwt(j) => match &j.key {
            JwtKey::PublicKey(p) => vec![("public_key", p)],
            JwtKey::JwksFile(p) => vec![("jwks", p)],
            _ => Vec::new(),
        },
        _ => Vec::new(),
    };
    for (key, path) in files {
        let text = rules_auth::read_auth_file(path).map_err(|e| (key, e))?;
        let checked = match key {
            "htpasswd" => rules_auth::parse_htpasswd(&text).map(drop),
            "keys_file" => rules_auth::parse_keys_file(&text).map(drop),
            "public_key" => rules_auth::pem_keys(text.as_bytes()).map(drop),
            _ => rules_auth::parse_jwks(&text).map(drop),
        };
        checked.map_err(|e| (key, format!("{}: {e}", path.display())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    pub(super) fn err(text: &str) -> String {
        Config::parse(text, "t.toml").unwrap_err().to_string()
    }

    pub(super) const MIN: &str = "[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\nproxy = { upstream = \"http://127.0.0.1:2\" }\n";

    const POOLED: &str =
        "[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\nproxy = { pool = \"app\" }\n";

    #[test]
    fn acme_keeps_its_state_in_the_servers_state_dir_unless_told() {
        let acme = |extra: &str| {
            format!(
                "[server]\nstate_dir = \"/var/lib/larder\"\n[[listener]]\naddr = \"127.0.0.1:1\"\n  [listener.tls.acme]\n  domains = [\"a.test\"]\n  {extra}\n[[listener.route]]\nrespond = {{ body = \"x\" }}\n"
            )
        };
        let dir = |c: &Config| {
            let tls = c.listeners[0].tls.as_ref().unwrap();
            tls.acme.as_ref().unwrap().state_dir.clone()
        };
        let mut c = Config::parse(&acme(""), "t").unwrap();
        assert_eq!(dir(&c), PathBuf::from("/var/lib/larder/acme"));
        // `--state-dir` moves it along.
        c.set_state_dir(PathBuf::from("/srv/state"));
        assert_eq!(dir(&c), PathBuf::from("/srv/state/acme"));
        let mut c = Config::parse(&acme("state_dir = \"/etc/acme\""), "t").unwrap();
        c.set_state_dir(PathBuf::from("/srv/state"));
        assert_eq!(dir(&c), PathBuf::from("/etc/acme"));
    }

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
        // decoded_cache is taken out of decode_memory: at most half of it.
        let e = err(&format!(
            "{route}[listener.route.images]\ndir = \"/x\"\ndecode_memory = \"64MiB\"\n\
             decoded_cache = \"48MiB\"\n"
        ));
        assert!(
            e.contains("line 7, key `listener.route.images.decoded_cache`") && e.contains("32MiB"),
            "{e}"
        );
        let c = Config::parse(
            &format!("{route}[listener.route.images]\ndir = \"/x\"\ndecode_memory = \"64MiB\"\n"),
            "t",
        )
        .unwrap();
        let HandlerConfig::Images(im) = &c.listeners[0].routes[0].handler else {
            panic!("an image route");
        };
        assert_eq!(
            im.decoded_cache_bytes(),
            8 << 20,
            "unset: an eighth of decode_memory"
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
        // The default is lowered to what fits: 1024 less 32 reserved and one listening socket,
        // less a quarter of that for large bodies' memory files.
        let mut c = Config::parse(MIN, "t").unwrap();
        assert_eq!(c.fit_open_files(1024).unwrap(), Some(991 - 247));
        assert_eq!(c.server.max_connections.get(), 991 - 247);
        assert_eq!(c.zero_copy_files(1024), 247);
        // per-core: a listening socket per listener and worker.
        let mut c = Config::parse(
            &format!("[server]\nthreading = \"per-core\"\nworkers = 4\n{MIN}"),
            "t",
        )
        .unwrap();
        assert_eq!(c.fit_open_files(1024).unwrap(), Some(988 - 247));
        // No room at all is an error even for the default.
        let mut c = Config::parse(MIN, "t").unwrap();
        assert!(c.fit_open_files(33).is_err());
    }

    /// Large bodies' memory files take only the descriptors connections leave over.
    #[test]
    fn zero_copy_files_take_what_connections_leave() {
        let c = Config::parse(&format!("[server]\nmax_connections = 991\n{MIN}"), "t").unwrap();
        assert_eq!(c.zero_copy_files(1024), 0, "all taken by connections");
        let c = Config::parse(&format!("[server]\nmax_connections = 500\n{MIN}"), "t").unwrap();
        assert_eq!(c.zero_copy_files(1024), 1024 - 500 - 33);
        assert_eq!(
            c.zero_copy_files(1 << 20),
            1024,
            "at most cache.zero_copy_files"
        );
        let c = Config::parse(&format!("[cache]\nzero_copy_min = 0\n{MIN}"), "t").unwrap();
        assert_eq!(c.zero_copy_files(1 << 20), 0, "off");
    }
}
