//! Typed configuration: one TOML file, every setting declared once with its type, default and bounds.
//!
//! Validation happens while deserializing (sizes, durations, URLs, bounded numbers, host patterns
//! are their own types), so every bad value is reported by `toml` with the span of that value, and
//! [`Error`] turns the span into "line N, key `k`". Each part of the program receives its own typed
//! slice of this (`CacheConfig`, `CompressionConfig`, `ProxyConfig`, ...), never the whole thing.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use http::header::HeaderName;
use http::Uri;
use serde::de::{self, Deserializer};
use serde::Deserialize;

/// The configuration compiled into the binary: what `larder` runs with no arguments.
pub const EMBEDDED_DEFAULT: &str = include_str!("../larder.default.toml");

/// A configuration that failed to load.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{origin}: line {line}, key `{key}`: {message}")]
    Invalid {
        origin: String,
        line: usize,
        key: String,
        message: String,
    },
    #[error("{origin}: {message}")]
    Semantic { origin: String, message: String },
}

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
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
    /// Administration: the bearer token guarding admin operations (image DELETE, uploads when
    /// a route asks for it).
    #[serde(default)]
    pub admin: AdminConfig,
}

/// The `[admin]` section.
#[derive(Debug, Clone, Default, Deserialize)]
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

impl Config {
    /// Parses a configuration from TOML text; `origin` names it in errors (a path or "embedded").
    pub fn parse(text: &str, origin: &str) -> Result<Config, Error> {
        let mut cfg: Config =
            toml::from_str(text).map_err(|e| Error::from_toml(&e, text, origin))?;
        cfg.distribute_admin_token();
        cfg.check_semantics().map_err(|message| Error::Semantic {
            origin: origin.to_string(),
            message,
        })?;
        Ok(cfg)
    }

    /// Reads and parses a configuration file.
    pub fn load(path: &Path) -> Result<Config, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Gives each image route its copy of the admin token (each part gets its own slice).
    fn distribute_admin_token(&mut self) {
        for l in &mut self.listeners {
            for r in &mut l.routes {
                match &mut r.handler {
                    HandlerConfig::Images(i) => i.admin_token.clone_from(&self.admin.token),
                    HandlerConfig::Proxy(p) => {
                        p.access = crate::admin::Access {
                            token: self.admin.token.clone(),
                            allow: self.admin.purge_allow.clone(),
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// Checks that span several keys (each key alone was checked while parsing).
    fn check_semantics(&self) -> Result<(), String> {
        if self.listeners.is_empty() {
            return Err("no [[listener]] configured: larder would serve nothing".into());
        }
        if self.admin.listen.is_some() && self.admin.token.as_deref().is_none_or(str::is_empty) {
            return Err("[admin] listen needs [admin] token: the admin API never runs open".into());
        }
        let mut seen = std::collections::HashSet::new();
        for l in &self.listeners {
            if !seen.insert(l.addr) {
                return Err(format!("listener address {} is configured twice", l.addr));
            }
            if l.routes.is_empty() {
                return Err(format!("listener {} has no [[listener.route]]", l.addr));
            }
        }
        Ok(())
    }

    /// A one-listener configuration proxying everything to `upstream` (the `--upstream` CLI form).
    pub fn single_route(listen: SocketAddr, handler: HandlerConfig) -> Config {
        Config {
            server: ServerConfig::default(),
            cache: CacheConfig::default(),
            compression: CompressionConfig::default(),
            admin: AdminConfig::default(),
            listeners: vec![ListenerConfig {
                addr: listen,
                routes: vec![RouteConfig {
                    host: None,
                    path: PathPrefix("/".into()),
                    handler,
                }],
            }],
        }
    }
}

impl Error {
    fn from_toml(e: &toml::de::Error, text: &str, origin: &str) -> Error {
        let (line, key) = match e.span() {
            Some(span) => {
                let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
                let line_text = text.lines().nth(line - 1).unwrap_or("");
                (line, key_of_line(line_text))
            }
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

/// The key a TOML line sets (`a.b = 1` → `a.b`; `[[listener.route]]` → `listener.route`).
fn key_of_line(line: &str) -> String {
    let t = line.trim();
    if let Some(inner) = t.strip_prefix("[[").and_then(|s| s.split("]]").next()) {
        return inner.trim().to_string();
    }
    if let Some(inner) = t.strip_prefix('[').and_then(|s| s.split(']').next()) {
        return inner.trim().to_string();
    }
    match t.split_once('=') {
        Some((k, _)) => k.trim().trim_matches('"').to_string(),
        None => t.to_string(),
    }
}

/// Server-wide settings: threads, connection limits, timeouts.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Worker threads; 0 means one per core.
    pub workers: usize,
    /// Open connections at most, over all listeners; at the bound, accepting pauses.
    pub max_connections: Bounded<1, 10_000_000>,
    /// Largest request head (request line plus headers) accepted; larger gets 431.
    pub max_header_size: ByteSize,
    /// Time a client has to send a complete request head (slowloris guard).
    pub header_read_timeout: Dur,
    /// Keep-alive connections with no traffic for this long are closed.
    pub idle_timeout: Dur,
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
}

/// The layout of the worker threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Threading {
    /// One single-threaded runtime per worker, each with its own `SO_REUSEPORT` listening
    /// socket: the kernel spreads connections, a connection stays on its thread.
    PerCore,
    /// One multi-threaded tokio runtime whose workers steal tasks from each other.
    WorkStealing,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            workers: 0,
            max_connections: Bounded(100_000),
            max_header_size: ByteSize(16 * 1024),
            header_read_timeout: Dur(Duration::from_secs(10)),
            idle_timeout: Dur(Duration::from_secs(60)),
            idle_release: Dur(Duration::from_secs(1)),
            release_above_connections: 512,
            shutdown_grace: Dur(Duration::from_secs(10)),
            h2c: true,
            threading: Threading::WorkStealing,
            global_queue_interval: Bounded(2),
        }
    }
}

/// The memory cache shared by every route.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Total bytes the cache may hold (bodies of every encoding plus headers).
    pub max_size: ByteSize,
    /// Responses larger than this are streamed through, never stored.
    pub max_object_size: ByteSize,
    /// Name of the response header telling HIT, MISS, BYPASS or EXPIRED.
    pub status_header: HeaderNameCfg,
    /// How long a request waits for another request's fill of the same key.
    pub coalesce_timeout: Dur,
    /// Store responses carrying Set-Cookie (the cookie itself is never stored, only the body).
    pub store_set_cookie: bool,
    /// Fraction of (Date - Last-Modified) used as a heuristic lifetime (RFC 9111 §4.2.2).
    pub heuristic_fraction: f64,
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
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            max_size: ByteSize(256 * 1024 * 1024),
            max_object_size: ByteSize(16 * 1024 * 1024),
            status_header: HeaderNameCfg(HeaderName::from_static("x-cache")),
            coalesce_timeout: Dur(Duration::from_secs(10)),
            store_set_cookie: false,
            heuristic_fraction: 0.1,
            stale_while_revalidate: Dur(Duration::ZERO),
            stale_if_error: Dur(Duration::ZERO),
            stale_if_disconnected: Dur(Duration::from_secs(60)),
            targeted_cache_control: vec![HeaderNameCfg(HeaderName::from_static(
                "cdn-cache-control",
            ))],
            forward_cdn_cache_control: true,
            tag_header: HeaderNameCfg(HeaderName::from_static("surrogate-key")),
        }
    }
}

/// Which stored bodies get pre-compressed variants, and how hard to compress.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompressionConfig {
    pub enabled: bool,
    /// Content types compressed (`text/*` matches any text type); parameters are ignored.
    pub types: Vec<String>,
    /// Bodies shorter than this are stored identity only.
    pub min_length: ByteSize,
    pub gzip_level: Bounded<1, 9>,
    pub brotli_level: Bounded<0, 11>,
    pub zstd_level: Bounded<1, 22>,
    /// Compressions running at once (off the async workers); 0 means one per core.
    pub threads: usize,
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
            threads: 0,
            dynamic: true,
            dynamic_gzip_level: Bounded(1),
            dynamic_brotli_level: Bounded(4),
            dynamic_zstd_level: Bounded(3),
        }
    }
}

/// One listening socket and the routes it serves.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    pub addr: SocketAddr,
    #[serde(rename = "route")]
    pub routes: Vec<RouteConfig>,
}

/// A route: which requests (host, path prefix) go to which handler.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "RawRoute")]
pub struct RouteConfig {
    pub host: Option<HostPattern>,
    pub path: PathPrefix,
    pub handler: HandlerConfig,
}

/// What serves the requests of a route.
#[derive(Debug, Clone)]
pub enum HandlerConfig {
    Proxy(ProxyConfig),
    Static(StaticConfig),
    Respond(RespondConfig),
    Images(ImagesConfig),
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
        if handlers.len() != 1 {
            return Err(format!(
                "route `{}` needs exactly one handler (proxy, static, respond or images), found {}",
                r.path.0,
                handlers.len()
            ));
        }
        Ok(RouteConfig {
            host: r.host,
            path: r.path,
            handler: handlers.pop().expect("one handler"),
        })
    }
}

/// A caching reverse proxy to one upstream.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    pub upstream: Upstream,
    #[serde(default = "ProxyConfig::default_connect_timeout")]
    pub connect_timeout: Dur,
    /// Time until the upstream's response head arrives.
    #[serde(default = "ProxyConfig::default_response_timeout")]
    pub response_timeout: Dur,
    /// Set false to proxy without caching.
    #[serde(default = "yes")]
    pub cache: bool,
    /// Idle pooled connections kept per upstream host.
    #[serde(default = "ProxyConfig::default_pool_idle")]
    pub pool_max_idle: usize,
    /// Who may PURGE (copied from `[admin]` after parsing).
    #[serde(skip)]
    pub access: crate::admin::Access,
}

impl ProxyConfig {
    pub fn new(upstream: Upstream) -> Self {
        ProxyConfig {
            upstream,
            connect_timeout: Self::default_connect_timeout(),
            response_timeout: Self::default_response_timeout(),
            cache: true,
            pool_max_idle: Self::default_pool_idle(),
            access: crate::admin::Access::default(),
        }
    }
    fn default_connect_timeout() -> Dur {
        Dur(Duration::from_secs(5))
    }
    fn default_response_timeout() -> Dur {
        Dur(Duration::from_secs(30))
    }
    fn default_pool_idle() -> usize {
        1024
    }
}

fn yes() -> bool {
    true
}

/// Files served from a directory, or from files bundled in the binary.
#[derive(Debug, Clone, Deserialize)]
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
    #[serde(default = "StaticConfig::default_charset")]
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
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RespondConfig {
    #[serde(default = "RespondConfig::default_status")]
    pub status: Bounded<100, 999>,
    #[serde(default)]
    pub body: String,
    #[serde(default = "RespondConfig::default_type")]
    pub content_type: String,
}

impl RespondConfig {
    fn default_status() -> Bounded<100, 999> {
        Bounded(200)
    }
    fn default_type() -> String {
        "text/plain".into()
    }
}

/// The image server (`images = { dir = "..." }`): upload, store by MD5, transform from URL
/// parameters (zimg's API), results cached. See `crate::images`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImagesConfig {
    /// Directory holding the originals (created at start if missing), sharded by MD5.
    pub dir: PathBuf,
    /// Largest upload accepted, enforced while reading (413 beyond).
    #[serde(default = "ImagesConfig::default_max_upload")]
    pub max_upload_size: ByteSize,
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
    /// Transforms running at once; 0 means one per core.
    #[serde(default)]
    pub workers: usize,
    /// Transforms waiting for a worker at most; beyond, 503 with Retry-After at once.
    #[serde(default = "ImagesConfig::default_queue_depth")]
    pub queue_depth: Bounded<0, 1_000_000>,
    /// Longest a transform waits for a worker and its decode memory; then 503 with Retry-After.
    #[serde(default = "ImagesConfig::default_queue_timeout")]
    pub queue_timeout: Dur,
    /// Memory the route's transforms may hold at once (decoded pixels, resize and encode
    /// buffers, estimated from the header before decoding). A transform waits until its
    /// estimate fits; one that could never fit gets 422.
    #[serde(default = "ImagesConfig::default_decode_memory")]
    pub decode_memory: ByteSize,
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
    pub default_format: crate::images::params::FormatChoice,
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
    pub presets: std::collections::BTreeMap<String, crate::images::params::Preset>,
    /// Copied from `[admin] token` after parsing.
    #[serde(skip)]
    pub admin_token: Option<String>,
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
            workers: 0,
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
            admin_token: None,
        }
    }
    fn default_max_upload() -> ByteSize {
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
    fn default_originals_memory() -> ByteSize {
        ByteSize(64 << 20)
    }
    fn default_queue_depth() -> Bounded<0, 1_000_000> {
        Bounded(64)
    }
    fn default_queue_timeout() -> Dur {
        Dur(Duration::from_secs(10))
    }
    fn default_decode_memory() -> ByteSize {
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
    fn default_format() -> crate::images::params::FormatChoice {
        crate::images::params::FormatChoice::Keep
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
    pub fn get(self) -> i64 {
        self.0
    }
}

impl<'de, const LO: i64, const HI: i64> Deserialize<'de> for Bounded<LO, HI> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = i64::deserialize(d)?;
        if !(LO..=HI).contains(&v) {
            return Err(de::Error::custom(format!(
                "{v} is out of range (must be {LO} to {HI})"
            )));
        }
        Ok(Bounded(v))
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

/// A size in bytes, written as a number or a string like `"256MiB"`, `"16KB"`, `"1g"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num.parse().map_err(|_| {
            format!("invalid size `{s}` (expected e.g. 512, \"64KiB\", \"256MiB\")")
        })?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            _ => {
                return Err(format!(
                    "invalid size unit in `{s}` (use B, KiB, MiB or GiB)"
                ))
            }
        };
        n.checked_mul(mult)
            .map(ByteSize)
            .ok_or_else(|| format!("size `{s}` is too large"))
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size such as 1048576 or \"256MiB\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom("a size cannot be negative"))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// A duration written as `"250ms"`, `"10s"`, `"5m"`, `"1h"`, or a number of seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl FromStr for Dur {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num.parse().map_err(|_| {
            format!("invalid duration `{s}` (expected e.g. \"500ms\", \"10s\", \"5m\")")
        })?;
        let d = match unit.trim() {
            "ms" => Duration::from_millis(n),
            "" | "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n * 60),
            "h" => Duration::from_secs(n * 3600),
            _ => {
                return Err(format!(
                    "invalid duration unit in `{s}` (use ms, s, m or h)"
                ))
            }
        };
        Ok(Dur(d))
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration such as \"10s\" or \"500ms\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Dur, E> {
                u64::try_from(v)
                    .map(|s| Dur(Duration::from_secs(s)))
                    .map_err(|_| E::custom("a duration cannot be negative"))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Dur, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// A response header name given in the config.
#[derive(Debug, Clone)]
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

/// An upstream origin: `http://host:port` (no path).
#[derive(Debug, Clone)]
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
        if scheme != http::uri::Scheme::HTTP {
            return Err(format!(
                "upstream `{s}`: only http:// upstreams are supported so far"
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

    #[test]
    fn embedded_default_parses() {
        let c = Config::parse(EMBEDDED_DEFAULT, "embedded").unwrap();
        assert_eq!(c.listeners.len(), 2);
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

    #[test]
    fn images_route_and_admin_token() {
        let c = Config::parse(
            "[admin]\ntoken = \"s3cret\"\n[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\npath = \"/img/\"\nimages = { dir = \"/tmp/x\", upload_allow = [\"10.0.0.0/8\"], presets = { thumb = \"w=100&h=100\" } }\n",
            "t",
        )
        .unwrap();
        let HandlerConfig::Images(i) = &c.listeners[0].routes[0].handler else {
            panic!("images route")
        };
        assert_eq!(i.admin_token.as_deref(), Some("s3cret"));
        assert!(i.upload_allow[0].contains("10.1.2.3".parse().unwrap()));
        assert!(!i.upload_allow[0].contains("11.1.2.3".parse().unwrap()));
        let e = err("[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\nimages = { dir = \"/x\", presets = { a = \"w=abc\" } }\n");
        assert!(e.contains("line 4") && e.contains("`w`"), "{e}");
    }

    #[test]
    fn upstream_rejects_paths_and_https() {
        assert!("http://127.0.0.1:3000".parse::<Upstream>().is_ok());
        assert!("http://127.0.0.1:3000/x".parse::<Upstream>().is_err());
        assert!("ftp://x".parse::<Upstream>().is_err());
    }
}
