//! Where an image proxy request's original comes from: a path relative to the route's
//! `origin` (a base URL or a `[pool.NAME]`, fetched over HTTP with larder's upstream pools) or
//! `root` (a directory), or an absolute URL from the `allow_sources` list; and the loading of
//! it, limited to `max_source_size` and `source_timeout`.
//!
//! ```text
//! load ─▶ Relative: origin + path (segments percent-encoded, `..` refused) │ root + path
//!         Absolute: allowed by a parsed `allow_sources` prefix? (403 else)  │ Local: root
//!   fetched ─▶ memory entry fresh? ─▶ original
//!            └▶ coalesce (one fetch per URL) ─leader─▶ tiers (disk, shared; the fleet's lease)
//!                 ─▶ GET (conditional when a stale copy has validators) ─▶ 304: refreshed
//!                 ─▶ 404/410: NotFound; other non-2xx: Failed (502); nothing stored
//!                 ─▶ Content-Length > max: TooLarge unread; body past max: TooLarge, cut off
//!                 ─▶ stored by RFC 9111 (no-store: not stored) ─▶ followers get the same
//!                 ─▶ failed with a stale copy within stale-if-error: the stale copy
//! ```
//!
//! An original's `id` is the MD5 of its bytes (a fetched one: computed once per fetch and kept
//! in its cache entry), or for a `root` file its path, size and modification time: a changed
//! original makes new result keys. A `root` file read is kept in memory for [`ROOT_VALID`]
//! (a cached result's hit needs the id), so a changed file is seen within that. An original
//! says which memory copy it was had from ([`Held`]): while that copy is stored and fresh
//! ([`Sources::still_holds`]), a load would give the same id, so a result known for the id may
//! be served without loading it (`super::hits`).

use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, StatusCode};
use http_body_util::BodyExt;

use super::storage::Md5Hex;
use crate::body::Body;
use crate::cache::coalesce::{FillOutcome, Inflight, Join};
use crate::cache::policy::{self, FetchContext, RequestDirectives};
use crate::cache::{Cache, CacheKey, Entry, Found, Lease, Reach};
use crate::compress::Encoding;
use crate::config::pool::{BackendConfig, PoolConfig};
use crate::config::{ImagesConfig, OriginRef, SourceUrl, Upstream};
use crate::upstream::{Pool, Pools};

/// A source as a URL names it (after imgproxy's base64 or percent decoding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceRef {
    /// Relative to the route's `origin` or `root` (`photo.jpg`, `a/b.png`).
    Relative(String),
    /// An absolute `http://` or `https://` URL (allowed only by `allow_sources`).
    Absolute(String),
    /// imgproxy's `local:///path`: under the route's `root`.
    Local(String),
}

impl SourceRef {
    /// The file name the source's path ends in, without its extension (`photo` for
    /// `https://cdn/a/photo.jpg?x=1`); `image` when it has none.
    pub fn stem(&self) -> &str {
        let s = match self {
            SourceRef::Relative(s) | SourceRef::Absolute(s) | SourceRef::Local(s) => s,
        };
        let path = s.split(['?', '#']).next().unwrap_or(s);
        let name = path.rsplit('/').next().unwrap_or(path);
        let stem = name.rsplit_once('.').map_or(name, |(stem, _)| stem);
        if stem.is_empty() {
            "image"
        } else {
            stem
        }
    }
}

/// A loaded original.
#[derive(Debug, Clone)]
pub struct Original {
    pub data: Bytes,
    /// Names these bytes in result cache keys: a new original makes new keys.
    pub id: String,
    /// Where it came from (the metrics count it).
    pub had: Had,
    /// The memory copy it was had from (None: not stored).
    pub held: Option<Held>,
}

/// The memory copy of an original: its key, and the entry (not kept alive by this).
#[derive(Debug, Clone)]
pub struct Held {
    key: CacheKey,
    entry: Weak<Entry>,
}

impl Held {
    fn of(key: &CacheKey, entry: &Arc<Entry>) -> Held {
        Held {
            key: key.clone(),
            entry: Arc::downgrade(entry),
        }
    }
}

/// Where an original came from, in the order of `crate::metrics::SOURCE_OUTCOMES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Had {
    /// A fresh copy in the memory tier.
    Memory,
    /// A copy in a tier below memory (disk, shared).
    Tier,
    /// From the origin (a 304 refreshing a stale copy too).
    Fetched,
    /// From a concurrent request's fetch of the same URL.
    Coalesced,
    /// A file under `root`.
    Local,
    /// A stale copy standing in for an origin that failed (within stale-if-error).
    Stale,
}

impl SourceError {
    /// The index of the outcome in `crate::metrics::SOURCE_OUTCOMES`.
    pub fn outcome(&self) -> usize {
        match self {
            SourceError::NotFound => 6,
            SourceError::NotAllowed(_) => 7,
            SourceError::TooLarge(_) => 8,
            SourceError::Failed(_) => 9,
        }
    }
}

/// Why an original could not be had.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SourceError {
    #[error("no such image")]
    NotFound,
    #[error("source not allowed: {0}")]
    NotAllowed(String),
    #[error("original larger than {0} bytes")]
    TooLarge(u64),
    #[error("fetching the original failed: {0}")]
    Failed(String),
}

impl SourceError {
    /// 404 for a missing original (the origin's 404 or 410, a missing file), 403 for a source
    /// the route does not allow, 422 for one over `max_source_size`, 502 for an origin that
    /// failed (another status, no connection, `source_timeout` passed).
    pub fn status(&self) -> StatusCode {
        match self {
            SourceError::NotFound => StatusCode::NOT_FOUND,
            SourceError::NotAllowed(_) => StatusCode::FORBIDDEN,
            SourceError::TooLarge(_) => StatusCode::UNPROCESSABLE_ENTITY,
            SourceError::Failed(_) => StatusCode::BAD_GATEWAY,
        }
    }
}

/// How long a file under `root` is used without looking at it again: a changed file is seen
/// within this (nginx's `open_file_cache_valid`, 60 s by default there).
pub const ROOT_VALID: Duration = Duration::from_secs(1);

/// The field of a stored original's entry that keeps its id (the MD5 of its bytes), so that a
/// hit does not hash the bytes again. Stored, never sent: these entries are never delivered.
const ID_FIELD: HeaderName = HeaderName::from_static("x-larder-original-id");

/// A place originals are fetched from: a pool, and the text naming it in cache keys.
struct Fetcher {
    pool: Arc<Pool>,
    /// `http://host:port/prefix` or `pool:NAME`.
    label: String,
}

/// The route's sources.
pub struct Sources {
    root: Option<PathBuf>,
    max_size: u64,
    timeout: Duration,
    origin: Option<Fetcher>,
    /// `allow_sources`, each with the pool fetching from its host.
    allowed: Vec<(SourceUrl, Fetcher)>,
    cache: Arc<Cache>,
    /// Fetches in flight, by cache key: concurrent loads of one original share one fetch and
    /// its outcome (a failure too).
    fills: Arc<Inflight<CacheKey, Result<Original, SourceError>>>,
}

/// The peer named in the forwarding fields of a fetch: larder itself (a fetch is shared by
/// every request waiting on it, not one client's).
const SELF: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

impl Sources {
    /// The sources of `cfg`, storing fetched originals in `cache`; `pools` are the server's,
    /// for `origin = "pool:NAME"`. A configuration that did not pass [`crate::config`]'s
    /// checks loses its bad origin or allowed source (logged).
    pub fn new(cfg: &ImagesConfig, cache: Arc<Cache>, pools: &Pools) -> Sources {
        let origin = match cfg.origin_ref() {
            Ok(Some(OriginRef::Url(u))) => inline(u),
            Ok(Some(OriginRef::Pool(name))) => pools.get(&name).map(|p| Fetcher {
                pool: Arc::clone(p),
                label: format!("pool:{name}"),
            }),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "images: origin ignored");
                None
            }
        };
        let allowed = (cfg.allow_sources.iter())
            .filter_map(|a| {
                let u = crate::config::allowed_source(a).ok()?;
                let base: Upstream = format!("{}://{}", u.scheme, u.authority).parse().ok()?;
                Some((u, inline(base)?))
            })
            .collect();
        Sources {
            root: cfg.root.clone(),
            max_size: cfg.max_source_size.0,
            timeout: cfg.source_timeout.0,
            origin,
            allowed,
            cache,
            fills: Arc::default(),
        }
    }

    /// Whether `held` is still the copy a load at `now` would use: the same entry stored
    /// under its key, fresh (a changed `root` file after [`ROOT_VALID`], a fetched original
    /// past its freshness, a purge or eviction: no).
    pub fn still_holds(&self, held: &Held, now: SystemTime) -> bool {
        (self.cache.get(&held.key)).is_some_and(|e| {
            std::ptr::eq(Arc::as_ptr(&e), held.entry.as_ptr()) && e.freshness.is_fresh(now)
        })
    }

    /// Where relative sources come from, for logs.
    pub fn describe(&self) -> Option<String> {
        match (&self.origin, &self.root) {
            (Some(f), _) => Some(f.label.clone()),
            (None, Some(r)) => Some(r.display().to_string()),
            (None, None) => None,
        }
    }

    /// Loads `r`'s bytes: at most `max_source_size` of them, whoever stored the copy (routes
    /// of one origin or `root` share its originals' cache keys, not their limits).
    pub async fn load(&self, r: &SourceRef) -> Result<Original, SourceError> {
        let got = self.load_any(r).await?;
        if got.data.len() as u64 > self.max_size {
            return Err(SourceError::TooLarge(self.max_size));
        }
        Ok(got)
    }

    async fn load_any(&self, r: &SourceRef) -> Result<Original, SourceError> {
        match r {
            SourceRef::Relative(p) => match &self.origin {
                Some(origin) => self.fetch(origin, relative_target(p)?).await,
                None => self.local(p).await,
            },
            SourceRef::Local(p) => self.local(p).await,
            SourceRef::Absolute(u) => {
                let url = SourceUrl::parse(u).map_err(SourceError::NotAllowed)?;
                let Some((_, fetcher)) = self.allowed.iter().find(|(a, _)| a.admits(&url)) else {
                    return Err(SourceError::NotAllowed(u.clone()));
                };
                if has_dot_segment(&url.path_and_query) {
                    return Err(SourceError::NotAllowed(u.clone()));
                }
                self.fetch(fetcher, url.path_and_query).await
            }
        }
    }

    /// A file under `root`.
    async fn local(&self, p: &str) -> Result<Original, SourceError> {
        let Some(root) = &self.root else {
            return Err(SourceError::NotAllowed(
                "this route has no `root` for relative sources".into(),
            ));
        };
        let path = under(root, p).ok_or(SourceError::NotFound)?;
        // Kept in memory for ROOT_VALID (nginx's open_file_cache_valid): a hit on a result
        // needs its original's id, and reading the file for it on every request cost a
        // blocking-pool hand-off, two canonicalize calls and the read (57 µs a cached hit).
        let key = CacheKey::from_string(format!("imgsrc:root:{}", path.display()));
        let now = self.cache.clock().now();
        if let Some(e) = (self.cache.get(&key)).filter(|e| e.freshness.is_fresh(now)) {
            return Ok(original_of(&e, &key, Had::Local));
        }
        let (root, max) = (root.clone(), self.max_size);
        let mut got = tokio::task::spawn_blocking(move || read_local(&root, &path, max))
            .await
            .map_err(|_| SourceError::Failed("reader failed".into()))??;
        if let Ok(id) = HeaderValue::from_str(&got.id) {
            let mut fields = HeaderMap::new();
            fields.insert(ID_FIELD, id);
            let entry = Entry::build(
                StatusCode::OK,
                fields,
                vec![(Encoding::Identity, got.data.clone())],
                policy::Freshness::own(ROOT_VALID, now),
                false,
            );
            let entry = Arc::new(entry);
            got.held = Some(Held::of(&key, &entry));
            self.cache.store(key, entry);
        }
        Ok(got)
    }

    /// The original at `target` (a path and query) of `from`: a fresh stored copy, or one
    /// fetch shared by every concurrent load.
    async fn fetch(&self, from: &Fetcher, target: String) -> Result<Original, SourceError> {
        let key = CacheKey::from_string(format!("imgsrc:{}{}", from.label, target));
        let now = self.cache.clock().now();
        let stored = self.cache.get(&key);
        if let Some(e) = stored.as_ref().filter(|e| e.freshness.is_fresh(now)) {
            return Ok(original_of(e, &key, Had::Memory));
        }
        match self.fills.join(&key) {
            Join::Leader(guard) => {
                let got = self.fill(from, &key, &target, stored).await;
                guard.complete(got.clone());
                got
            }
            Join::Follower(f) => match f.wait(self.timeout + Duration::from_secs(1)).await {
                FillOutcome::Filled(got) => got.map(|o| Original {
                    had: Had::Coalesced,
                    ..o
                }),
                // The leader went away (its client did): fetch for this one.
                FillOutcome::Failed(_) | FillOutcome::Released => {
                    let stored = self.cache.get(&key);
                    self.fill(from, &key, &target, stored).await
                }
            },
        }
    }

    /// Leads the fetch of `key`: the tiers below memory first, then the origin (conditional
    /// when a stale copy has validators), within `source_timeout`.
    async fn fill(
        &self,
        from: &Fetcher,
        key: &CacheKey,
        target: &str,
        stored: Option<Arc<Entry>>,
    ) -> Result<Original, SourceError> {
        let (stale, lease) = match stored {
            Some(e) => (Some(e), None),
            None => {
                let (none, directives) = (HeaderMap::new(), RequestDirectives::default());
                match (self.cache)
                    .find(key, &none, &directives, Reach::Lease)
                    .await
                {
                    Found::Hit(e) => return Ok(original_of(&e, key, Had::Tier)),
                    Found::Stale(e) => (Some(e), None),
                    Found::Miss(lease) => (None, lease),
                }
            }
        };
        let kept = stale.clone();
        let exchange = self.exchange(from, key, target, stale, lease);
        let got = match tokio::time::timeout(self.timeout, exchange).await {
            Ok(got) => got,
            Err(_) => Err(SourceError::Failed(format!(
                "no original within source_timeout ({:?})",
                self.timeout
            ))),
        };
        match (got, kept) {
            // RFC 5861: a stale copy within its stale-if-error (or the cache's) stands in for
            // an origin that failed (5xx, no connection, no answer in time); a 404 does not.
            (Err(SourceError::Failed(why)), Some(e))
                if e.freshness.serve_on_error(self.cache.clock().now()) =>
            {
                tracing::debug!(key = key.as_str(), why, "stale original served on error");
                Ok(original_of(&e, key, Had::Stale))
            }
            (got, _) => got,
        }
    }

    async fn exchange(
        &self,
        from: &Fetcher,
        key: &CacheKey,
        target: &str,
        stale: Option<Arc<Entry>>,
        lease: Option<Lease>,
    ) -> Result<Original, SourceError> {
        let mut req = Request::get(target);
        if let Some(s) = &stale {
            if let Some(tag) = &s.etag {
                req = req.header(header::IF_NONE_MATCH, tag.clone());
            }
            if let Some(lm) = s.last_modified {
                req = req.header(header::IF_MODIFIED_SINCE, httpdate::fmt_http_date(lm));
            }
        }
        let (parts, ()) = req
            .body(())
            .map_err(|e| SourceError::Failed(format!("bad source path: {e}")))?
            .into_parts();
        let request_time = self.cache.clock().now();
        let resp = from
            .pool
            .send(parts, Body::empty(), SELF, self.timeout, self.timeout)
            .await
            .map_err(|e| SourceError::Failed(e.to_string()))?;
        let response_time = self.cache.clock().now();
        let (mut head, body) = resp.into_parts();
        // The id is larder's, never the origin's: a field of that name from the origin (a 304's
        // would replace the stored one) would name these bytes after another original's, and
        // their results would be served as that original's.
        head.headers.remove(ID_FIELD);
        let ctx = FetchContext {
            method: http::Method::GET,
            has_authorization: false,
            request_time,
            response_time,
            request_no_store: false,
            ttl: None,
            force: None,
        };
        let cfg = self.cache.config();
        if let (StatusCode::NOT_MODIFIED, Some(old)) = (head.status, &stale) {
            // RFC 9111 §4.3.4: the stored copy, with the 304's fields over its own.
            let mut fields = old.headers.clone();
            for name in head.headers.keys() {
                fields.remove(name);
            }
            for (name, value) in &head.headers {
                fields.append(name, value.clone());
            }
            return Ok(match policy::storability(&ctx, old.status, &fields, cfg) {
                Ok(s) => {
                    for name in &s.strip {
                        fields.remove(name);
                    }
                    let fresh = Arc::new(old.refreshed(fields, s.freshness));
                    self.cache
                        .store_filled(key.clone(), Arc::clone(&fresh), lease);
                    original_of(&fresh, key, Had::Fetched)
                }
                Err(_) => {
                    self.cache.remove(key);
                    original_of(old, key, Had::Fetched)
                }
            });
        }
        match head.status.as_u16() {
            200 | 203 => {}
            404 | 410 => return Err(SourceError::NotFound),
            s => return Err(SourceError::Failed(format!("the origin answered {s}"))),
        }
        let declared = (head.headers.get(header::CONTENT_LENGTH))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.max_size) {
            // Dropped unread: the connection is closed, not drained.
            return Err(SourceError::TooLarge(self.max_size));
        }
        let data = read_limited(body, self.max_size, declared).await?;
        let id = Md5Hex::of(&data).as_str().to_string();
        let mut original = Original {
            data: data.clone(),
            id: id.clone(),
            had: Had::Fetched,
            held: None,
        };
        let storable = if data.len() as u64 > cfg.max_object_size.0 {
            Err(policy::NoStoreReason::TooLarge)
        } else {
            policy::storability(&ctx, head.status, &head.headers, cfg)
        };
        match storable {
            Ok(s) => {
                let mut fields = head.headers;
                for name in &s.strip {
                    fields.remove(name);
                }
                if let Ok(v) = HeaderValue::from_str(&id) {
                    fields.insert(ID_FIELD, v);
                }
                let mut entry = Entry::build(
                    head.status,
                    fields,
                    vec![(Encoding::Identity, data)],
                    s.freshness,
                    false,
                );
                entry.auth_ok = s.auth_ok;
                let entry = Arc::new(entry);
                original.held = Some(Held::of(key, &entry));
                self.cache.store_filled(key.clone(), entry, lease);
            }
            Err(why) => {
                tracing::debug!(
                    key = key.as_str(),
                    reason = why.as_str(),
                    "original not stored"
                );
                if stale.is_some() {
                    self.cache.remove(key);
                }
            }
        }
        Ok(original)
    }
}

/// A one-backend pool for `base` (an `origin` URL, or an allowed source's host).
fn inline(base: Upstream) -> Option<Fetcher> {
    let label = base.to_string();
    let mut pc = PoolConfig::of(vec![BackendConfig::new(base)]);
    pc.max_idle = 32;
    match Pool::new("images", &pc) {
        Ok(pool) => Some(Fetcher { pool, label }),
        Err(e) => {
            tracing::warn!(error = %e, origin = %label, "images: origin ignored");
            None
        }
    }
}

/// The original stored in `e` under `key`, had from where `had` says.
fn original_of(e: &Arc<Entry>, key: &CacheKey, had: Had) -> Original {
    let data = e
        .variant(Encoding::Identity)
        .map(|v| v.body.clone())
        .unwrap_or_default();
    let id = match e.headers.get(ID_FIELD).and_then(|v| v.to_str().ok()) {
        Some(id) => id.to_string(),
        None => Md5Hex::of(&data).as_str().to_string(),
    };
    Original {
        data,
        id,
        had,
        held: Some(Held::of(key, e)),
    }
}

/// Reads `body` whole, failing once it passes `max` bytes (the rest left unread).
async fn read_limited<B>(body: B, max: u64, declared: Option<u64>) -> Result<Bytes, SourceError>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut body = body;
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(64 << 10).min(max) as usize);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| SourceError::Failed(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            if (buf.len() + data.len()) as u64 > max {
                return Err(SourceError::TooLarge(max));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}

/// The characters of a path segment sent percent-encoded: controls, space, non-ASCII (always)
/// and what would end or change the path (`?`, `#`, `%`, `/` within a name) or is not allowed
/// in a URI path.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// The target (`/a/b%20c.jpg`) for a source relative to the origin: its segments
/// percent-encoded, empty and `.` segments dropped (`//evil.com/x` is `/evil.com/x` on the
/// origin: the path never names another authority), `..` refused (it could leave the origin's
/// path prefix).
fn relative_target(rel: &str) -> Result<String, SourceError> {
    let mut out = String::with_capacity(rel.len() + 8);
    for seg in rel.split('/') {
        match seg {
            "" | "." => {}
            ".." => return Err(SourceError::NotAllowed(format!("`..` in `{rel}`"))),
            s => {
                out.push('/');
                out.extend(percent_encoding::utf8_percent_encode(s, SEGMENT));
            }
        }
    }
    if out.is_empty() {
        return Err(SourceError::NotFound);
    }
    Ok(out)
}

/// Whether a URL path has a `.` or `..` segment, written plainly or percent-encoded, its `/`
/// too (a server would resolve it, leaving an allowed prefix: nginx decodes `..%2F` before it
/// resolves dot segments), or after a `\` (a separator to some servers).
fn has_dot_segment(path_and_query: &str) -> bool {
    let path = path_and_query.split('?').next().unwrap_or("");
    let path = percent_encoding::percent_decode_str(path).decode_utf8_lossy();
    path.split(['/', '\\']).any(|seg| seg == "." || seg == "..")
}

/// The longest file name (Linux's NAME_MAX): a longer one is not a file, never an I/O error.
const NAME_MAX: usize = 255;

/// `rel` under `root`, or None when it would leave it (`..`, an absolute path, a prefix) or
/// cannot name a file (a NUL, a name over [`NAME_MAX`] bytes: the file system's errors for
/// those would be taken for a failing source).
fn under(root: &Path, rel: &str) -> Option<PathBuf> {
    if rel.contains('\0') || rel.split('/').any(|name| name.len() > NAME_MAX) {
        return None;
    }
    let rel = Path::new(rel.trim_start_matches('/'));
    let mut out = root.to_path_buf();
    for c in rel.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(out)
}

/// Reads `path` (under `root`) whole, at most `max` bytes. A path whose real location is
/// outside the root (a symlink pointing out) is not found: the root is what the route serves.
fn read_local(root: &Path, path: &Path, max: u64) -> Result<Original, SourceError> {
    use std::io::Read;
    let not_found = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory => SourceError::NotFound,
        _ => SourceError::Failed(e.to_string()),
    };
    let real_root = root.canonicalize().map_err(not_found)?;
    let real = path.canonicalize().map_err(not_found)?;
    if !real.starts_with(&real_root) {
        return Err(SourceError::NotFound);
    }
    let f = std::fs::File::open(&real).map_err(not_found)?;
    let meta = f
        .metadata()
        .map_err(|e| SourceError::Failed(e.to_string()))?;
    if !meta.is_file() {
        return Err(SourceError::NotFound);
    }
    if meta.len() > max {
        return Err(SourceError::TooLarge(max));
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    f.take(max + 1)
        .read_to_end(&mut data)
        .map_err(|e| SourceError::Failed(e.to_string()))?;
    if data.len() as u64 > max {
        return Err(SourceError::TooLarge(max));
    }
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let rel = real.strip_prefix(&real_root).unwrap_or(&real);
    Ok(Original {
        id: format!("local:{}:{}:{modified}", rel.display(), data.len()),
        data: Bytes::from(data),
        had: Had::Local,
        held: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_cannot_leave_the_root() {
        let root = Path::new("/srv/img");
        assert_eq!(
            under(root, "a/b.jpg"),
            Some(PathBuf::from("/srv/img/a/b.jpg"))
        );
        assert_eq!(under(root, "/a.jpg"), Some(PathBuf::from("/srv/img/a.jpg")));
        assert_eq!(
            under(root, "./a.jpg"),
            Some(PathBuf::from("/srv/img/a.jpg"))
        );
        assert_eq!(under(root, "../etc/passwd"), None);
        assert_eq!(under(root, "a/../../x"), None);
        assert_eq!(under(root, "a\0.jpg"), None);
        assert_eq!(under(root, &"a".repeat(256)), None);
        assert!(under(root, &"a".repeat(255)).is_some());
    }

    #[test]
    fn relative_targets_stay_on_the_origin() {
        let t = |s: &str| relative_target(s).ok();
        assert_eq!(t("photo.jpg").as_deref(), Some("/photo.jpg"));
        assert_eq!(t("//evil.com/x").as_deref(), Some("/evil.com/x"));
        assert_eq!(t("a b/c?d#e%f").as_deref(), Some("/a%20b/c%3Fd%23e%25f"));
        assert_eq!(t("./a//b").as_deref(), Some("/a/b"));
        assert_eq!(t("é.jpg").as_deref(), Some("/%C3%A9.jpg"));
        assert!(matches!(
            relative_target("a/../../x"),
            Err(SourceError::NotAllowed(_))
        ));
        assert!(matches!(relative_target("/"), Err(SourceError::NotFound)));
        // Whatever the path, the request's authority is the origin's.
        for p in ["//evil.com/x", "http://evil.com/x", "@evil.com/x"] {
            let target = relative_target(p).unwrap();
            let uri: http::Uri = target.parse().unwrap();
            assert!(uri.authority().is_none(), "{p} → {target}");
        }
    }

    #[test]
    fn dot_segments_are_seen_encoded_too() {
        assert!(has_dot_segment("/img/../secret"));
        assert!(has_dot_segment("/img/%2e%2E/secret"));
        assert!(has_dot_segment("/img/..%2Fsecret"));
        assert!(has_dot_segment("/img/%2E%2E%2fsecret"));
        assert!(has_dot_segment("/img/..%5Csecret"));
        assert!(!has_dot_segment("/img/a%2Fb.jpg"));
        assert!(!has_dot_segment("/img/a..b.jpg?x=/../"));
    }
}
