//! The static-files handler: files from a root directory, or from a file set bundled in the
//! binary (the demo origin of the embedded default).
//!
//! # What a request goes through
//!
//! 1. The request path (after the route prefix, if stripped) is looked up as-is in `resolved`,
//!    a bounded map from raw path to what that path was found to be (`Resolved`): a small file
//!    held in the shared memory cache, a large file streamed from disk, a redirect, a listing,
//!    or a refusal. A hit there costs no decoding, no allocation and no system call.
//! 2. A resolution is trusted for [`RECHECK`] (one second). The first request after that wins a
//!    compare-and-swap on its timestamp and stats the file and its siblings again (on the
//!    blocking pool) while concurrent requests keep being served from the old resolution; if the
//!    files' fingerprint (inode, size, mtime of each) changed, the file is loaded again.
//! 3. An unknown path is decoded by [`safe_segments`] (percent-decoding once; `..`, encoded
//!    slashes, backslashes, NUL, bad UTF-8 and hidden names refused), joined below the root and
//!    canonicalized: a path whose real location is outside the root is refused unless
//!    `follow_symlinks`. Concurrent first requests for a path share one resolution, and
//!    requests that find a file's entry missing from the store share one load (the cache's
//!    miss coalescing), so a cold file under load is stat'ed, read and compressed once.
//! 4. A file up to `max_memory_file_size` is read once, with its `.br`/`.zst`/`.gz` siblings,
//!    into an [`Entry`] in the shared [`Cache`]; missing compressed variants are computed once in
//!    the background ([`Cache::spawn_variants`]). Every header block is prepared then. Larger
//!    files are streamed with `pread` in bounded chunks ([`crate::range::file_body`]).
//! 5. Delivery negotiates the encoding, answers If-Match / If-Unmodified-Since (412) and
//!    If-None-Match / If-Modified-Since (304), Range and If-Range ([`crate::range`]), and HEAD.

use std::collections::HashMap;
use std::fs::Metadata;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};

use crate::body::Body;
use crate::cache::policy::Freshness;
use crate::cache::{Cache, CacheKey, Entry, Inflight};
use crate::compress::{AcceptEncoding, Encoding};
use crate::config::{Bundle, StaticConfig};
use crate::http::conditional::{self, Preconditions};
use crate::http::etag::weakened;
use crate::http::{date, text_response};
use crate::range::{self, Decision};

/// How long a file's resolution is trusted before the file is stat-ed again.
pub const RECHECK: Duration = Duration::from_secs(1);

/// Paths remembered per handler (each costs about 200 bytes plus its path).
const RESOLVED_CAPACITY: usize = 64 * 1024;

/// Pre-compressed siblings, by the suffix added to the file name.
const SIBLINGS: [(Encoding, &str); 3] = [
    (Encoding::Br, ".br"),
    (Encoding::Zstd, ".zst"),
    (Encoding::Gzip, ".gz"),
];

pub struct StaticFiles {
    source: Source,
    prefix: String,
    strip_prefix: bool,
    settings: Settings,
    cache: Arc<Cache>,
    /// Distinguishes this handler's entries in the shared store.
    id: String,
    resolved: quick_cache::sync::Cache<Box<str>, Arc<Resolved>>,
    /// First resolutions in flight: concurrent first requests for a path share one.
    resolving: Arc<Inflight<Box<str>, Arc<Resolved>>>,
}

struct Settings {
    index: Vec<String>,
    cache_control: Option<HeaderValue>,
    by_extension: HashMap<String, HeaderValue>,
    charset: String,
    memory_max: u64,
    precompressed: bool,
    follow_symlinks: bool,
    dotfiles: bool,
    listing: bool,
}

enum Source {
    /// The canonical root directory.
    Dir(PathBuf),
    Bundled(Vec<(&'static str, Arc<Entry>)>),
}

/// What a request path was found to be at the last check.
struct Resolved {
    /// Milliseconds since the handler's epoch at the last stat.
    checked: AtomicU64,
    /// Hash of (inode, size, mtime) of every file this resolution depends on.
    fingerprint: u64,
    kind: Kind,
}

// Allowed to keep clippy clean after merging main (the static owner may box the variant).
enum Kind {
    Refused(StatusCode),
    /// A directory named without its trailing slash.
    Redirect,
    Listing(PathBuf),
    /// Held in the shared store under this key.
    Memory(CacheKey, Plan),
    Disk(Arc<DiskFile>),
}

/// A large file and its pre-compressed siblings, streamed from disk.
struct DiskFile {
    /// (encoding, path, length, prepared header block), smallest first.
    variants: Vec<(Encoding, PathBuf, u64, HeaderMap)>,
    modified: SystemTime,
}

/// The outcome of stat-ing a path: what it is, before reading anything.
#[derive(Clone)]
enum Plan {
    Refused(StatusCode),
    Redirect,
    Listing(PathBuf),
    File(Box<FilePlan>),
}

#[derive(Clone)]
struct FilePlan {
    /// The name the client asked for (MIME type and Cache-Control come from its extension).
    name: String,
    path: PathBuf,
    meta: Metadata,
    siblings: Vec<(Encoding, PathBuf, Metadata)>,
}

/// The demo origin's files.
const DEMO: [(&str, &[u8]); 4] = [
    ("index.html", include_bytes!("../assets/demo/index.html")),
    ("data.json", include_bytes!("../assets/demo/data.json")),
    ("page.html", include_bytes!("../assets/demo/page.html")),
    ("small.html", include_bytes!("../assets/demo/small.html")),
];

/// Start time of the process: the Last-Modified of bundled files.
fn bundle_time() -> SystemTime {
    static T: std::sync::OnceLock<SystemTime> = std::sync::OnceLock::new();
    *T.get_or_init(|| {
        let now = SystemTime::now();
        let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        UNIX_EPOCH + Duration::from_secs(secs)
    })
}

/// Freshness of a static entry made at `now`: it never expires by time (the file's stat decides).
fn static_freshness(now: SystemTime) -> Freshness {
    Freshness::own(Duration::from_secs(u32::MAX as u64), now)
}

impl StaticFiles {
    pub fn new(cfg: StaticConfig, prefix: &str, cache: Arc<Cache>) -> StaticFiles {
        static NEXT_ID: AtomicUsize = AtomicUsize::new(0);
        let settings = Settings {
            index: cfg.index.clone(),
            cache_control: cfg.cache_control.as_ref().map(|c| c.0.clone()),
            by_extension: cfg
                .cache_control_by_extension
                .iter()
                .map(|(k, v)| (k.trim_start_matches('.').to_ascii_lowercase(), v.0.clone()))
                .collect(),
            charset: cfg.charset.trim().to_string(),
            memory_max: cfg.max_memory_file_size.0,
            precompressed: cfg.precompressed,
            follow_symlinks: cfg.follow_symlinks,
            dotfiles: cfg.dotfiles,
            listing: cfg.directory_listing,
        };
        let source = match (&cfg.root, cfg.bundled) {
            (_, Some(Bundle::Demo)) => Source::Bundled(
                DEMO.iter()
                    .map(|(path, body)| {
                        let mut h = settings.headers_for(path);
                        let etag = format!("\"{:x}-{:x}\"", fnv1a(body), body.len());
                        h.insert(header::ETAG, HeaderValue::from_str(&etag).expect("hex"));
                        h.insert(header::LAST_MODIFIED, date::value(bundle_time()));
                        let e = Entry::build(
                            StatusCode::OK,
                            h,
                            vec![(Encoding::Identity, Bytes::from_static(body))],
                            static_freshness(cache.clock().now()),
                            false,
                        );
                        (*path, Arc::new(e))
                    })
                    .collect(),
            ),
            (Some(root), None) => {
                Source::Dir(std::fs::canonicalize(root).unwrap_or_else(|_| root.clone()))
            }
            (None, None) => Source::Dir(std::fs::canonicalize(".").unwrap_or_default()),
        };
        StaticFiles {
            source,
            prefix: prefix.to_string(),
            strip_prefix: cfg.strip_prefix,
            settings,
            cache,
            id: format!("static-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed)),
            resolved: quick_cache::sync::Cache::new(RESOLVED_CAPACITY),
            resolving: Arc::new(Inflight::default()),
        }
    }

    pub fn source(&self) -> String {
        match &self.source {
            Source::Dir(p) => p.display().to_string(),
            Source::Bundled(_) => "bundled demo files".into(),
        }
    }

    /// The path under the root that a request path names.
    #[inline]
    fn local_path<'a>(&self, full_path: &'a str) -> &'a str {
        if self.strip_prefix {
            return (full_path.strip_prefix(self.prefix.trim_end_matches('/')))
                .unwrap_or(full_path);
        }
        full_path
    }

    /// The hot path: a GET or HEAD of a file held in memory, resolved recently, answered
    /// synchronously (no future, no allocation for one). Anything else hands the request back
    /// for [`StaticFiles::serve`].
    #[inline]
    #[allow(clippy::result_large_err)]
    pub fn fresh_hit<B>(&self, req: Request<B>) -> Result<Response<Body>, Request<B>> {
        if (req.method() != Method::GET && req.method() != Method::HEAD)
            || !matches!(self.source, Source::Dir(_))
        {
            return Err(req);
        }
        let hit = match self.resolved.get(self.local_path(req.uri().path())) {
            Some(r) if !self.due(&r) => match &r.kind {
                Kind::Memory(key, _) => self.cache.get(key),
                _ => None,
            },
            _ => None,
        };
        match hit {
            Some(entry) => Ok(crate::deliver::as_origin(
                &entry,
                req.method(),
                req.headers(),
            )),
            None => Err(req),
        }
    }

    /// Serves `req`. The future owns a handle on the handler, so that it is a route's whole
    /// request future.
    pub async fn serve<B>(self: Arc<Self>, req: Request<B>) -> Response<Body> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            let mut r = text_response(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return r;
        }
        let full_path = req.uri().path();
        let path = self.local_path(full_path);
        let root = match &self.source {
            Source::Bundled(files) => return self.bundled(files, path, &req),
            Source::Dir(root) => root,
        };
        // Two rounds at most: a memory entry evicted from the store, or a file that changed
        // between its stat and its opening, is resolved once more.
        for _ in 0..2 {
            let resolved = match self.resolved.get(path) {
                // The fast path awaits nothing; the slow paths are boxed so that the
                // request future (held per connection by hyper) stays small.
                Some(r) if !self.due(&r) => r,
                Some(r) => Box::pin(self.recheck(root, path, r)).await,
                None => {
                    let segments = match safe_segments(path, self.settings.dotfiles) {
                        Ok(s) => s,
                        Err(status) => return refusal(status),
                    };
                    match Box::pin(self.resolve_once(root, path, segments)).await {
                        Some(r) => r,
                        None => return refusal(StatusCode::INTERNAL_SERVER_ERROR),
                    }
                }
            };
            match &resolved.kind {
                Kind::Refused(status) => return refusal(*status),
                Kind::Redirect => return redirect(full_path, req.uri().query()),
                Kind::Listing(dir) => return Box::pin(self.listing(dir.clone(), full_path)).await,
                Kind::Memory(key, plan) => {
                    let entry = match self.cache.get(key) {
                        Some(e) => e,
                        None => match Box::pin(self.load_memory_once(plan, key)).await {
                            Some(e) => e,
                            None => {
                                self.resolved.remove(path);
                                continue;
                            }
                        },
                    };
                    return crate::deliver::as_origin(&entry, req.method(), req.headers());
                }
                Kind::Disk(file) => {
                    match Box::pin(deliver_disk(file, req.method(), req.headers())).await {
                        Some(r) => return r,
                        None => {
                            self.resolved.remove(path);
                            continue;
                        }
                    }
                }
            }
        }
        refusal(StatusCode::SERVICE_UNAVAILABLE)
    }

    /// The coarse clock: a re-stat once a second needs no finer time (see `crate::clock`).
    fn now_ms(&self) -> u64 {
        crate::clock::coarse_ms()
    }

    /// Returns `r` if it is recent, else stats again (one request per path does; others keep
    /// using `r` meanwhile) and reloads when the files changed.
    /// Whether a resolution is older than [`RECHECK`].
    #[inline]
    fn due(&self, r: &Resolved) -> bool {
        self.now_ms()
            .saturating_sub(r.checked.load(Ordering::Relaxed))
            >= RECHECK.as_millis() as u64
    }

    async fn recheck(&self, root: &Path, path: &str, r: Arc<Resolved>) -> Arc<Resolved> {
        let now = self.now_ms();
        let checked = r.checked.load(Ordering::Relaxed);
        if now.saturating_sub(checked) < RECHECK.as_millis() as u64
            || r.checked
                .compare_exchange(checked, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return r;
        }
        let Ok(segments) = safe_segments(path, self.settings.dotfiles) else {
            return r;
        };
        let (fingerprint, plan) = self.probe(root, path, segments).await;
        if fingerprint == r.fingerprint {
            return r;
        }
        self.install(path, fingerprint, plan).await.unwrap_or(r)
    }

    /// Resolves `path` the first time: concurrent requests for it wait for one resolution (one
    /// stat, one read) instead of each doing their own.
    async fn resolve_once(
        &self,
        root: &Path,
        path: &str,
        segments: Vec<String>,
    ) -> Option<Arc<Resolved>> {
        let timeout = self.cache.config().coalesce_timeout.0;
        self.resolving
            .once(
                &Box::from(path),
                timeout,
                || self.resolved.get(path),
                || self.resolve(root, path, segments),
            )
            .await
    }

    /// Loads a file into the store once for all the requests that found it missing.
    async fn load_memory_once(&self, plan: &Plan, key: &CacheKey) -> Option<Arc<Entry>> {
        self.cache
            .fill_once(key, || self.load_memory(plan.clone(), key.clone()))
            .await
    }

    async fn resolve(
        &self,
        root: &Path,
        path: &str,
        segments: Vec<String>,
    ) -> Option<Arc<Resolved>> {
        let (fingerprint, plan) = self.probe(root, path, segments).await;
        self.install(path, fingerprint, plan).await
    }

    /// Stats what `segments` name (on the blocking pool).
    async fn probe(&self, root: &Path, path: &str, segments: Vec<String>) -> (u64, Plan) {
        let root = root.to_path_buf();
        let trailing = path.ends_with('/');
        let index = self.settings.index.clone();
        let opts = (
            self.settings.follow_symlinks,
            self.settings.listing,
            self.settings.precompressed,
        );
        tokio::task::spawn_blocking(move || probe(&root, &segments, trailing, &index, opts))
            .await
            .unwrap_or((0, Plan::Refused(StatusCode::INTERNAL_SERVER_ERROR)))
    }

    /// Turns a plan into a resolution (reading a small file into the store) and remembers it.
    async fn install(&self, path: &str, fingerprint: u64, plan: Plan) -> Option<Arc<Resolved>> {
        let kind = match plan {
            Plan::Refused(s) => Kind::Refused(s),
            Plan::Redirect => Kind::Redirect,
            Plan::Listing(d) => Kind::Listing(d),
            Plan::File(f) if f.meta.len() <= self.settings.memory_max => {
                let key = CacheKey::from_parts("file", &self.id, &f.path.to_string_lossy());
                let plan = Plan::File(f);
                self.load_memory(plan.clone(), key.clone()).await?;
                Kind::Memory(key, plan)
            }
            Plan::File(f) => Kind::Disk(Arc::new(self.settings.disk_file(*f))),
        };
        let r = Arc::new(Resolved {
            checked: AtomicU64::new(self.now_ms()),
            fingerprint,
            kind,
        });
        self.resolved.insert(path.into(), Arc::clone(&r));
        Some(r)
    }

    /// Reads a small file and its siblings into an entry in the store.
    async fn load_memory(&self, plan: Plan, key: CacheKey) -> Option<Arc<Entry>> {
        let Plan::File(f) = plan else { return None };
        let limit = self.settings.memory_max;
        let paths: Vec<(Encoding, PathBuf)> = std::iter::once((Encoding::Identity, f.path.clone()))
            .chain(f.siblings.iter().map(|(e, p, _)| (*e, p.clone())))
            .collect();
        let (meta, bodies) = tokio::task::spawn_blocking(move || read_all(&paths, limit))
            .await
            .ok()??;
        let mut headers = self.settings.headers_for(&f.name);
        let (etag, modified) = validators(&meta);
        headers.insert(header::ETAG, etag);
        headers.insert(header::LAST_MODIFIED, date::value(modified));
        headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        let len = meta.len() as usize;
        let compress = self
            .cache
            .compressor()
            .wants(headers.get(header::CONTENT_TYPE), len);
        let negotiated = compress || bodies.len() > 1;
        let complete = bodies.len() == Encoding::ALL.len();
        let entry = Arc::new(Entry::build(
            StatusCode::OK,
            headers,
            bodies,
            static_freshness(self.cache.clock().now()),
            negotiated,
        ));
        self.cache.store(key.clone(), Arc::clone(&entry));
        if compress && !complete {
            self.cache.spawn_variants(key, Arc::clone(&entry));
        }
        Some(entry)
    }

    fn bundled<B>(
        &self,
        files: &[(&'static str, Arc<Entry>)],
        path: &str,
        req: &Request<B>,
    ) -> Response<Body> {
        let segments = match safe_segments(path, false) {
            Ok(s) => s,
            Err(status) => return refusal(status),
        };
        let want = if segments.is_empty() {
            match self.settings.index.first() {
                Some(i) => i.clone(),
                None => return refusal(StatusCode::NOT_FOUND),
            }
        } else {
            segments.join("/")
        };
        match files.iter().find(|(p, _)| *p == want) {
            Some((_, e)) => crate::deliver::as_origin(e, req.method(), req.headers()),
            None => refusal(StatusCode::NOT_FOUND),
        }
    }

    async fn listing(&self, dir: PathBuf, shown: &str) -> Response<Body> {
        let dotfiles = self.settings.dotfiles;
        let shown = shown.to_string();
        let html = tokio::task::spawn_blocking(move || listing_html(&dir, &shown, dotfiles))
            .await
            .ok()
            .flatten();
        match html {
            Some(h) => {
                let mut r = Response::new(Body::full(h));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/html; charset=utf-8"),
                );
                r.headers_mut()
                    .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
                r
            }
            None => refusal(StatusCode::FORBIDDEN),
        }
    }
}

impl Settings {
    /// Content-Type and Cache-Control for a file name.
    fn headers_for(&self, name: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        let mime = mime_guess::from_path(name).first_or_octet_stream();
        let essence = mime.essence_str();
        let texty = mime.type_() == mime_guess::mime::TEXT
            || matches!(
                essence,
                "application/javascript"
                    | "application/json"
                    | "application/xml"
                    | "application/xhtml+xml"
                    | "application/manifest+json"
                    | "application/ld+json"
                    | "application/rss+xml"
                    | "application/atom+xml"
                    | "image/svg+xml"
            );
        let ct = if texty && !self.charset.is_empty() {
            format!("{essence}; charset={}", self.charset)
        } else {
            essence.to_string()
        };
        if let Ok(v) = HeaderValue::from_str(&ct) {
            h.insert(header::CONTENT_TYPE, v);
        }
        let ext = Path::new(name)
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase());
        let cc = ext
            .and_then(|e| self.by_extension.get(&e))
            .or(self.cache_control.as_ref());
        if let Some(cc) = cc {
            h.insert(header::CACHE_CONTROL, cc.clone());
        }
        h
    }

    fn disk_file(&self, f: FilePlan) -> DiskFile {
        let base = self.headers_for(&f.name);
        let (etag, modified) = validators(&f.meta);
        let mut variants: Vec<(Encoding, PathBuf, u64, HeaderMap)> =
            std::iter::once((Encoding::Identity, f.path.clone(), f.meta.len()))
                .chain(f.siblings.iter().map(|(e, p, m)| (*e, p.clone(), m.len())))
                .map(|(enc, p, len)| {
                    let mut h = base.clone();
                    if let Some(ce) = enc.header_value() {
                        h.insert(header::CONTENT_ENCODING, ce);
                        h.insert(
                            header::ETAG,
                            weakened(&etag).unwrap_or_else(|| etag.clone()),
                        );
                    } else {
                        h.insert(header::ETAG, etag.clone());
                    }
                    h.insert(header::LAST_MODIFIED, date::value(modified));
                    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
                    if !f.siblings.is_empty() {
                        h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
                    }
                    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
                    (enc, p, len, h)
                })
                .collect();
        variants.sort_by_key(|(e, _, len, _)| (*len, *e != Encoding::Identity));
        DiskFile { variants, modified }
    }
}

/// Strong ETag and Last-Modified from a file's metadata.
fn validators(meta: &Metadata) -> (HeaderValue, SystemTime) {
    let modified = meta.modified().unwrap_or(UNIX_EPOCH);
    let mtime = modified.duration_since(UNIX_EPOCH).unwrap_or_default();
    let etag = HeaderValue::from_str(&format!(
        "\"{:x}.{:x}-{:x}\"",
        mtime.as_secs(),
        mtime.subsec_nanos(),
        meta.len()
    ))
    .expect("hex etag");
    (etag, modified)
}

/// Adds a file's identity (or its absence) to a fingerprint.
fn hash_meta(h: &mut impl Hasher, m: Option<&Metadata>) {
    match m {
        None => 0u8.hash(h),
        Some(m) => {
            (
                1u8,
                m.dev(),
                m.ino(),
                m.len(),
                m.mtime(),
                m.mtime_nsec(),
                m.is_dir(),
            )
                .hash(h);
        }
    }
}

/// Stats what `segments` name below `root`: the blocking half of a resolution.
fn probe(
    root: &Path,
    segments: &[String],
    trailing_slash: bool,
    index: &[String],
    (follow_symlinks, listing, precompressed): (bool, bool, bool),
) -> (u64, Plan) {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let mut full = root.to_path_buf();
    for s in segments {
        full.push(s);
    }
    let inside = |p: &Path| -> Option<PathBuf> {
        let real = std::fs::canonicalize(p).ok()?;
        (follow_symlinks || real.starts_with(root)).then_some(real)
    };
    let meta = std::fs::metadata(&full).ok();
    hash_meta(&mut hasher, meta.as_ref());
    let Some(meta) = meta else {
        return (hasher.finish(), Plan::Refused(StatusCode::NOT_FOUND));
    };
    if inside(&full).is_none() {
        return (hasher.finish(), Plan::Refused(StatusCode::NOT_FOUND));
    }
    let (name, path, meta) = if meta.is_dir() {
        if !segments.is_empty() && !trailing_slash {
            return (hasher.finish(), Plan::Redirect);
        }
        let mut found = None;
        for idx in index {
            let candidate = full.join(idx);
            let m = std::fs::metadata(&candidate).ok();
            hash_meta(&mut hasher, m.as_ref());
            if let Some(m) = m.filter(|m| m.is_file()) {
                if inside(&candidate).is_some() {
                    found = Some((idx.clone(), candidate, m));
                    break;
                }
            }
        }
        match found {
            Some(f) => f,
            None if listing => return (hasher.finish(), Plan::Listing(full)),
            None => return (hasher.finish(), Plan::Refused(StatusCode::FORBIDDEN)),
        }
    } else if meta.is_file() {
        if trailing_slash {
            return (hasher.finish(), Plan::Refused(StatusCode::NOT_FOUND));
        }
        let name = segments.last().cloned().unwrap_or_default();
        (name, full, meta)
    } else {
        return (hasher.finish(), Plan::Refused(StatusCode::NOT_FOUND));
    };
    let mut siblings = Vec::new();
    if precompressed {
        for (enc, suffix) in SIBLINGS {
            let mut p = path.clone().into_os_string();
            p.push(suffix);
            let p = PathBuf::from(p);
            let m = std::fs::metadata(&p).ok().filter(|m| m.is_file());
            hash_meta(&mut hasher, m.as_ref());
            if let Some(m) = m {
                if inside(&p).is_some() {
                    siblings.push((enc, p, m));
                }
            }
        }
    }
    (
        hasher.finish(),
        Plan::File(Box::new(FilePlan {
            name,
            path,
            meta,
            siblings,
        })),
    )
}

/// Reads each file (identity first) whole; the identity file's metadata comes from the opened
/// file so the validators describe the bytes read. Siblings that fail to read are skipped.
fn read_all(
    paths: &[(Encoding, PathBuf)],
    limit: u64,
) -> Option<(Metadata, Vec<(Encoding, Bytes)>)> {
    use std::io::Read;
    let mut out = Vec::with_capacity(paths.len());
    let mut first_meta = None;
    for (enc, p) in paths {
        let read = (|| -> std::io::Result<(Metadata, Vec<u8>)> {
            let mut f = std::fs::File::open(p)?;
            let m = f.metadata()?;
            if m.len() > limit {
                return Err(std::io::Error::other("grew past the memory limit"));
            }
            let mut buf = Vec::with_capacity(m.len() as usize);
            f.read_to_end(&mut buf)?;
            Ok((m, buf))
        })();
        match (read, *enc) {
            (Ok((m, buf)), Encoding::Identity) => {
                first_meta = Some(m);
                out.push((Encoding::Identity, Bytes::from(buf)));
            }
            (Ok((_, buf)), e) => out.push((e, Bytes::from(buf))),
            (Err(_), Encoding::Identity) => return None,
            (Err(_), _) => {}
        }
    }
    Some((first_meta?, out))
}

/// Serves a large file from disk. None when the file no longer matches its resolution.
async fn deliver_disk(file: &DiskFile, method: &Method, req: &HeaderMap) -> Option<Response<Body>> {
    let accept = AcceptEncoding::parse(req.get(header::ACCEPT_ENCODING));
    let (_, path, len, head) = file
        .variants
        .iter()
        .find(|(e, ..)| accept.accepts(*e))
        .or_else(|| {
            file.variants
                .iter()
                .find(|(e, ..)| *e == Encoding::Identity)
        })?;
    let decided = conditional::evaluate(&Preconditions::of(req), method, head, Some(file.modified));
    if let Some(r) = decided.response(head) {
        return Some(r);
    }
    if *method == Method::HEAD {
        let mut r = Response::new(Body::empty());
        *r.headers_mut() = head.clone();
        return Some(r);
    }
    let decision = range::evaluate(req, *len, head.get(header::ETAG), Some(file.modified));
    if decision == Decision::Unsatisfiable {
        return Some(range::unsatisfiable(*len));
    }
    let p = path.clone();
    let opened = tokio::task::spawn_blocking(move || {
        let f = std::fs::File::open(&p)?;
        let m = f.metadata()?;
        Ok::<_, std::io::Error>((f, m))
    })
    .await
    .ok()?
    .ok()?;
    if opened.1.len() != *len {
        return None;
    }
    let f = Arc::new(opened.0);
    Some(match decision {
        Decision::Partial(ranges) => {
            range::partial(&ranges, *len, head.clone(), range::Source::File(f), false)
        }
        _ => {
            let mut r = Response::new(range::file_body(f, *len));
            *r.headers_mut() = head.clone();
            r
        }
    })
}

fn refusal(status: StatusCode) -> Response<Body> {
    let text = match status {
        StatusCode::NOT_FOUND => "not found\n",
        StatusCode::FORBIDDEN => "forbidden\n",
        StatusCode::BAD_REQUEST => "bad path\n",
        _ => "cannot serve this file\n",
    };
    text_response(status, text)
}

/// 301 to the same path with a trailing slash (a directory named without it).
fn redirect(path: &str, query: Option<&str>) -> Response<Body> {
    let mut loc = String::with_capacity(path.len() + 2);
    loc.push_str(path);
    loc.push('/');
    if let Some(q) = query {
        loc.push('?');
        loc.push_str(q);
    }
    let mut r = text_response(StatusCode::MOVED_PERMANENTLY, "moved\n");
    if let Ok(v) = HeaderValue::from_str(&loc) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// Characters percent-encoded in listing links.
const LINK: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'\'')
    .add(b'\\');

fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn listing_html(dir: &Path, shown: &str, dotfiles: bool) -> Option<String> {
    let mut names: Vec<(String, bool)> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            if !dotfiles && name.starts_with('.') {
                return None;
            }
            let is_dir = e.file_type().ok()?.is_dir();
            Some((name, is_dir))
        })
        .collect();
    names.sort();
    let title = escape_html(shown);
    let mut html = format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Index of {title}</title></head>\n<body><h1>Index of {title}</h1>\n<ul>\n<li><a href=\"../\">../</a></li>\n"
    );
    for (name, is_dir) in names {
        let slash = if is_dir { "/" } else { "" };
        let href = utf8_percent_encode(&name, LINK).to_string();
        html.push_str(&format!(
            "<li><a href=\"{}{slash}\">{}{slash}</a></li>\n",
            escape_html(&href),
            escape_html(&name)
        ));
    }
    html.push_str("</ul></body></html>\n");
    Some(html)
}

/// Decodes a request path into safe segments, or the status to refuse it with.
pub fn safe_segments(path: &str, dotfiles: bool) -> Result<Vec<String>, StatusCode> {
    let lower = path.to_ascii_lowercase();
    // Encoded separators and NUL never name a file.
    if lower.contains("%2f") || lower.contains("%5c") || lower.contains("%00") {
        return Err(StatusCode::BAD_REQUEST);
    }
    let decoded = percent_decode_str(path)
        .decode_utf8()
        .map_err(|_| StatusCode::BAD_REQUEST)?;
    // A second round of decoding must not produce separators or dot segments (double encoding).
    if decoded.contains('%') {
        let twice = percent_decode_str(&decoded).decode_utf8_lossy();
        if twice != decoded && (twice.contains("..") || twice.contains('/') || twice.contains('\\'))
        {
            return Err(StatusCode::BAD_REQUEST);
        }
    }
    if decoded.contains('\0') || decoded.contains('\\') || decoded.chars().any(char::is_control) {
        return Err(StatusCode::BAD_REQUEST);
    }
    let mut out = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "" => continue,
            "." | ".." => return Err(StatusCode::BAD_REQUEST),
            s if s.starts_with('.') && !dotfiles => return Err(StatusCode::NOT_FOUND),
            s => out.push(s.to_string()),
        }
    }
    Ok(out)
}

/// FNV-1a, for bundled files' ETags (computed once at start).
fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_traversal() {
        for bad in [
            "/../etc/passwd",
            "/a/../../b",
            "/%2e%2e/etc/passwd",
            "/a%2fb",
            "/a%5cb",
            "/a\\b",
            "/%252e%252e/x",
            "/%c0%ae%c0%ae/x",
            "/a%00b",
            "/.git/config",
            "/./a",
        ] {
            assert!(safe_segments(bad, false).is_err(), "{bad}");
        }
        assert_eq!(
            safe_segments("/a/b%20c.html", false).unwrap(),
            vec!["a", "b c.html"]
        );
        assert_eq!(safe_segments("/", false).unwrap(), Vec::<String>::new());
        assert_eq!(safe_segments("/.well", true).unwrap(), vec![".well"]);
    }

    #[test]
    fn listing_escapes_names() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("<b>&x\".txt"), b"x").unwrap();
        std::fs::write(dir.path().join(".hidden"), b"x").unwrap();
        let html = listing_html(dir.path(), "/d/<i>", false).unwrap();
        assert!(html.contains("&lt;b&gt;&amp;x&quot;.txt"));
        assert!(!html.contains("<b>"));
        assert!(!html.contains("<i>"));
        assert!(!html.contains(".hidden"));
    }
}
