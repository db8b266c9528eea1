//! The image server: zimg's URL API with imgproxy's safety, every result cached.
//!
//! ```text
//! POST <prefix>upload ─▶ allowed? ─▶ read (≤ limit, 413) ─▶ sniff (415) ─▶ header limits (422)
//!                                   ─▶ MD5 ─▶ store (atomic, dedup) ─▶ JSON {md5,size,width,...}
//! GET  <prefix><md5>?w=&h=&p=... ─▶ params (400 naming one) ─▶ preset (t=) ─▶ key
//!        ─▶ cache HIT ─▶ deliver
//!        └▶ coalesce ─leader─▶ load original ─▶ prepare: plan + estimate memory and cost (400/422)
//!                              ─▶ pool (503 when full or after queue_timeout; fair order; within
//!                                 decode_memory): decode → resize → encode
//!                              ─▶ store entry ─▶ deliver MISS; followers get the same entry
//! GET  <prefix>info?md5=    ─▶ JSON from the original's header
//! DELETE <prefix><md5>      ─▶ admin token ─▶ remove original ─▶ purge cached variants
//! GET  <prefix>SIG/OPTIONS/plain/SOURCE@EXT (imgproxy), <prefix>unsafe/.../SOURCE (thumbor)
//!        ─▶ grammar by shape ([`grammar_of`]) ─▶ signature (403) ─▶ options (400 naming one)
//!        ─▶ load the original ([`source`], 404) ─▶ plan from its header ([`pipeline`], 400/422)
//!        ─▶ cache HIT, or coalesce ─leader─▶ pool: the pipeline ─▶ store ─▶ deliver
//! GET (either API) whose result was served before ─▶ [`hits`]: known request? still holds?
//!        ─▶ cache HIT ─▶ deliver (nothing parsed or loaded; [`Images::fresh_hit`])
//! ```
//!
//! Files: [`params`] (URL parameters, presets, the normalized cache key), [`sniff`] (format and
//! dimensions from headers), [`storage`] (the store trait and the local directory), [`upload`]
//! (reading raw and multipart bodies under a limit), [`transform`] (geometry and pixel ops),
//! [`codec`] (decoders and encoders per format), [`decoded`] (decoded originals kept for the
//! proxy's next variants), [`animation`] (animated GIF, WebP and PNG: every
//! frame composited, transformed alike and encoded again), [`colour`] (embedded ICC profiles to sRGB,
//! CMYK, profiles written back when kept), [`avif`] (the AVIF decoder: container, AV1,
//! YUV to RGB), [`avif_encode`] (the AVIF encoder: RGB to YUV 4:2:0, AV1, container), [`aom`]
//! (AV1 through libaom, loaded at run time; rav1e without it), [`jxl`] (JPEG XL: jxl-oxide
//! decoding, libjxl encoding), [`heif`] (HEIC decoding through libheif), [`dynlib`] (the shared
//! libraries those three load at run time),
//! [`raster`] (what they share: pixels, limits, errors; a leaf, so that codec and
//! avif import it and not each other), [`pool`] (the bounded blocking pool: memory budget, fair
//! order), [`grammar`] (what the proxy grammars produce), [`imgproxy`] and [`thumbor`] (the two
//! proxy grammars), [`pipeline`] (their options executed, in imgproxy's order), [`source`]
//! (their originals: `origin`, `root`, `allow_sources`; a route without `dir` takes no uploads),
//! [`hits`] (the requests answered with a cached result, answered again without parsing),
//! [`filters`] and [`smart`] (pixel filters, content-aware crop placement: edges, skin,
//! saturation), [`metadata`] (the original's EXIF, XMP and ICC profile a result keeps), [`stats`]
//! (what the routes count into the server's metrics).
//!
//! Cache keys are `img://<md5><route prefix>?<normalized params>`, so a purge removes every key
//! starting with `img://<md5>/`, and `w=1&h=2` shares the entry of `h=2&w=1`. Proxy results are
//! `img://proxy<route prefix><original's id>?<normalized options>&f=<format target>`, imgproxy's
//! with the file name they offer (`&cd=`) after the options. Both end with the route's
//! settings that shape results where they differ from the defaults ([`settings_key`]: `&rq=90`
//! for `default_quality = 90`), so a reload changing one is seen.

pub mod animation;
pub mod aom;
pub mod avif;
pub mod avif_encode;
pub mod codec;
pub mod colour;
pub mod decoded;
pub mod dynlib;
pub mod filters;
pub mod grammar;
pub mod heif;
pub mod hits;
pub mod imgproxy;
pub mod jpeg;
pub mod jxl;
pub mod metadata;
pub mod params;
pub mod pipeline;
pub mod pool;
pub mod raster;
pub mod smart;
pub mod sniff;
pub mod source;
pub mod stats;
pub mod storage;
pub mod thumbor;
pub mod transform;
pub mod upload;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::body::RequestBody;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};

use crate::access_log::ImageServed;
use crate::body::Body;
use crate::cache::policy::Freshness;
use crate::cache::{Cache, CacheKey, Entry, FillKey, FillOutcome, Found, Join, Purge, Reach};
use crate::compress::Encoding;
use crate::config::image_options::SecurityOptions;
use crate::config::ImagesConfig;
use crate::deliver::{self, CacheStatus};
use crate::fleet::Fleet;
use crate::http::{json_response, text_response};
use grammar::{Grammar, GrammarError, Parsed};
use params::{ParamError, Params, Resolved, Target};
use pool::{Pool, PoolError};
use raster::{CodecError, Limits, Raster};
use sniff::{Probe, SniffError};
use source::{Held, Original, SourceError};
use storage::{ImageStore, InMemory, LocalDir, Md5Hex, Shared};
use transform::TransformError;

/// Why an image request failed; each maps to one status code.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(transparent)]
    Param(#[from] ParamError),
    #[error("no such image")]
    NotFound,
    #[error("not an image larder handles: {0}")]
    NotAnImage(#[from] SniffError),
    #[error("upload larger than {0} bytes")]
    TooLarge(u64),
    #[error("bad upload: {0}")]
    BadUpload(String),
    #[error("{0}")]
    Refused(#[from] CodecError),
    #[error("busy: too many transforms waiting")]
    Busy,
    #[error("forbidden: {0}")]
    Forbidden(&'static str),
    #[error("a valid admin bearer token is required")]
    Unauthorized,
    #[error("method not allowed")]
    Method,
    #[error("this image route takes no uploads: it has no `dir`")]
    NoStore,
    #[error("storage failed: {0}")]
    Storage(#[from] std::io::Error),
    #[error("internal error")]
    Internal,
    /// An image proxy URL refused by its grammar (403 signature, 400 the rest).
    #[error(transparent)]
    Grammar(#[from] GrammarError),
    /// The original of an image proxy request could not be had.
    #[error(transparent)]
    Source(#[from] SourceError),
}

impl ImageError {
    pub fn status(&self) -> StatusCode {
        match self {
            ImageError::Param(_) | ImageError::BadUpload(_) => StatusCode::BAD_REQUEST,
            ImageError::NotFound | ImageError::NoStore => StatusCode::NOT_FOUND,
            ImageError::NotAnImage(_)
            | ImageError::Refused(CodecError::Unsupported(_) | CodecError::Unavailable { .. }) => {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            }
            ImageError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ImageError::Refused(CodecError::Encode(..) | CodecError::Internal(_)) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            ImageError::Refused(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ImageError::Busy => StatusCode::SERVICE_UNAVAILABLE,
            ImageError::Forbidden(_) => StatusCode::FORBIDDEN,
            ImageError::Unauthorized => StatusCode::UNAUTHORIZED,
            ImageError::Method => StatusCode::METHOD_NOT_ALLOWED,
            ImageError::Storage(_) | ImageError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ImageError::Grammar(GrammarError::Signature(_)) => StatusCode::FORBIDDEN,
            ImageError::Grammar(GrammarError::Bad(_)) => StatusCode::BAD_REQUEST,
            ImageError::Source(SourceError::NotFound) => StatusCode::NOT_FOUND,
            ImageError::Source(SourceError::NotAllowed(_)) => StatusCode::FORBIDDEN,
            ImageError::Source(SourceError::TooLarge(_)) => StatusCode::UNPROCESSABLE_ENTITY,
            ImageError::Source(SourceError::Failed(_)) => StatusCode::BAD_GATEWAY,
        }
    }

    fn response(&self) -> Response<Body> {
        let status = self.status();
        let mut r = text_response(status, &format!("{self}\n"));
        let h = r.headers_mut();
        match self {
            ImageError::Busy => {
                h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            ImageError::Unauthorized => {
                h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ImageError::Method => {
                h.insert(
                    header::ALLOW,
                    HeaderValue::from_static("GET, HEAD, POST, DELETE"),
                );
            }
            _ => {}
        }
        r
    }
}

impl From<TransformError> for ImageError {
    fn from(e: TransformError) -> Self {
        match e {
            TransformError::Param(name, reason) => ImageError::Param(ParamError { name, reason }),
            TransformError::Codec(c) => ImageError::Refused(c),
        }
    }
}

impl From<PoolError> for ImageError {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::Busy | PoolError::Waited => ImageError::Busy,
            PoolError::OverBudget { need, budget } => {
                ImageError::Refused(CodecError::OverMemoryBudget { need, budget })
            }
            PoolError::Panicked => ImageError::Internal,
        }
    }
}

/// An image route.
pub struct Images {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: ImagesConfig,
    /// The `[admin]` token: uploads (with `upload_token`) and deletes need it.
    admin_token: Option<String>,
    /// The route's path prefix (part of cache keys: routes may differ in presets and defaults).
    prefix: String,
    /// Uploaded originals (`dir`); None: the route takes no uploads.
    store: Option<Arc<dyn ImageStore>>,
    /// Originals of the image proxy's URLs (`origin`, `root`, `allow_sources`).
    sources: source::Sources,
    cache: Arc<Cache>,
    pool: Pool,
    status_header: HeaderName,
    limits: Limits,
    /// The route's `watermark` image, decoded at start.
    mark: Option<Arc<Raster>>,
    /// What the route counts into the server's metrics.
    stats: stats::Stats,
    /// `auto` may answer JPEG XL: the route's `auto_jxl`, and libjxl loads.
    auto_jxl: bool,
    /// The requests answered with a cached result (None: `cache_results = false`).
    hits: Option<hits::Hits>,
    /// The server writes an access log ([`Images::log_into`]): a cached hit notes what the log
    /// says of it in its response; without a log the note (an extensions map, three
    /// allocations a hit) is not made.
    logged: std::sync::atomic::AtomicBool,
    /// Decoded originals kept for the proxy's next variants (`decoded_cache`).
    decoded: decoded::DecodedCache,
    /// The route's settings that shape results, in their keys ([`settings_key`]).
    settings: String,
}

/// Stored results never change (the key names the bytes): cached for a year, immutable.
const IMMUTABLE: &str = "public, max-age=31536000, immutable";

/// Image proxy results: a year, as imgproxy's default TTL (an original may change under the
/// same URL, so not immutable).
const PROXIED: &str = "public, max-age=31536000";

impl Images {
    /// The route at `prefix` for `cfg`, its results stored in `cache`; with `share_originals`,
    /// originals kept in `fleet` too (the one the server opened from `[cache.shared]`);
    /// `pools` for `origin = "pool:NAME"`.
    pub fn new(
        cfg: ImagesConfig,
        prefix: &str,
        cache: Arc<Cache>,
        fleet: Option<Arc<Fleet>>,
        admin_token: Option<String>,
        pools: &crate::upstream::Pools,
    ) -> Images {
        let store = cfg.dir.as_deref().map(|dir| -> Arc<dyn ImageStore> {
            match (cfg.originals_memory.0, cfg.share_originals) {
                (0, false) => Arc::new(LocalDir::new(dir)),
                (n, false) => Arc::new(InMemory::new(LocalDir::new(dir), n)),
                (0, true) => Arc::new(Shared::new(LocalDir::new(dir), fleet)),
                (n, true) => Arc::new(InMemory::new(Shared::new(LocalDir::new(dir), fleet), n)),
            }
        });
        let sources = source::Sources::new(&cfg, Arc::clone(&cache), pools);
        let limits = limits_of(&cfg, avif_encode::resolve(cfg.avif_encoder, prefix));
        let mark = cfg.watermark.as_deref().and_then(|path| match load_mark(path, &limits) {
            Ok(r) => Some(Arc::new(r)),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "watermark image not loaded");
                None
            }
        });
        let auto_jxl = cfg.auto_jxl && jxl::can_encode();
        if cfg.auto_jxl && !auto_jxl {
            tracing::warn!(
                prefix,
                "auto_jxl: libjxl does not load, JPEG XL is never negotiated"
            );
        }
        let settings = settings_key(&cfg, mark.as_deref());
        Images {
            inner: Arc::new(Inner {
                settings,
                mark,
                auto_jxl,
                stats: stats::Stats::default(),
                hits: cfg.cache_results.then(hits::Hits::default),
                logged: std::sync::atomic::AtomicBool::new(false),
                // The kept decoded originals' bytes are taken out of the transforms' budget.
                pool: Pool::new(
                    cfg.workers.as_usize(),
                    cfg.queue_depth.get() as usize,
                    cfg.decode_memory
                        .0
                        .saturating_sub(cfg.decoded_cache_bytes()),
                    cfg.queue_timeout.0,
                ),
                decoded: decoded::DecodedCache::new(cfg.decoded_cache_bytes()),
                prefix: prefix.to_string(),
                store,
                sources,
                status_header: cache.config().status_header.0.clone(),
                cache,
                limits,
                cfg,
                admin_token,
            }),
        }
    }

    /// The `[admin]` token this route checks.
    #[cfg(test)]
    pub(crate) fn admin_token(&self) -> Option<&str> {
        self.inner.admin_token.as_deref()
    }

    /// Counts the route's transforms and originals into `m` (the server's metrics, when it
    /// counts requests).
    pub fn count_into(&self, m: &Arc<crate::metrics::Metrics>) {
        self.inner.stats.count_into(m);
    }

    /// The server logs requests: cached hits note what the log says of them, as other
    /// responses do.
    pub fn log_into(&self) {
        (self.inner.logged).store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Where the originals are, for logs.
    pub fn source(&self) -> String {
        let uploads = self.inner.store.as_ref().map(|s| s.describe());
        match (uploads, self.inner.sources.describe()) {
            (Some(u), Some(o)) => format!("{u}, originals from {o}"),
            (Some(u), None) => u,
            (None, Some(o)) => format!("originals from {o} (no uploads)"),
            (None, None) => "nowhere".into(),
        }
    }

    /// The uploaded originals' store, or [`ImageError::NoStore`] on a route without `dir`.
    fn store(&self) -> Result<&Arc<dyn ImageStore>, ImageError> {
        self.inner.store.as_ref().ok_or(ImageError::NoStore)
    }

    /// Answers a request whose cached result is known ([`hits`]) at once, or gives it back
    /// (moved, not boxed: boxing would allocate on every other request) for [`Images::handle`].
    #[allow(clippy::result_large_err)]
    pub fn fresh_hit(
        &self,
        req: Request<RequestBody>,
    ) -> Result<Response<Body>, Request<RequestBody>> {
        let inner = &self.inner;
        let Some(hits) = &inner.hits else {
            return Err(req);
        };
        if !matches!(*req.method(), Method::GET | Method::HEAD) {
            return Err(req);
        }
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
        let Some(known) = hits.get(path, params::negotiated(req.headers(), self.inner.auto_jxl))
        else {
            return Err(req);
        };
        let now = inner.cache.clock().now();
        if !known.holds(&inner.sources, now) {
            return Err(req);
        }
        let Some(entry) = inner.cache.get(&known.result) else {
            return Err(req);
        };
        let r = deliver::from_entry(
            &entry,
            req.method(),
            req.headers(),
            CacheStatus::Hit,
            &inner.status_header,
            now,
        );
        if inner.logged.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(noted(r, known.served.clone()));
        }
        Ok(r)
    }

    /// Serves one request.
    pub async fn handle(&self, req: Request<RequestBody>, peer: SocketAddr) -> Response<Body> {
        let path = req.uri().path();
        let rest = path
            .strip_prefix(self.inner.prefix.as_str())
            .unwrap_or(path)
            .trim_start_matches('/')
            .to_string();
        let method = req.method().clone();
        // What the log says of a transform, set as soon as known: a refused one says it too.
        let mut served = None;
        let result = match (&method, rest.as_str()) {
            (&Method::POST, "upload") => self.upload(req, peer).await,
            (&Method::GET | &Method::HEAD, "info") => self.info(&req).await,
            (_, "upload" | "info") => Err(ImageError::Method),
            (&Method::GET | &Method::HEAD, path) if path.contains('/') => {
                self.proxy(&req, path, &mut served).await
            }
            (_, path) if path.contains('/') => Err(ImageError::Method),
            (&Method::GET | &Method::HEAD, name) => match Md5Hex::parse(name) {
                Some(md5) => self.get(&req, md5, &mut served).await,
                None => Err(ImageError::NotFound),
            },
            (&Method::DELETE, name) => match Md5Hex::parse(name) {
                Some(md5) => self.delete(&req, md5).await,
                None => Err(ImageError::NotFound),
            },
            _ => Err(ImageError::Method),
        };
        let r = result.unwrap_or_else(|e| {
            tracing::debug!(path = %req_path(&rest), error = %e, "image request refused");
            e.response()
        });
        match served {
            Some(served) => noted(r, served),
            None => r,
        }
    }

    fn authorized(&self, headers: &HeaderMap) -> Result<(), ImageError> {
        let Some(token) = self.inner.admin_token.as_deref() else {
            return Err(ImageError::Forbidden("no [admin] token is configured"));
        };
        if crate::admin::bearer_matches(headers, token) {
            Ok(())
        } else {
            Err(ImageError::Unauthorized)
        }
    }

    async fn upload(
        &self,
        req: Request<RequestBody>,
        peer: SocketAddr,
    ) -> Result<Response<Body>, ImageError> {
        // A route without `dir` says so before reading anything.
        self.store()?;
        let cfg = &self.inner.cfg;
        if !cfg.upload_allow.is_empty() && !cfg.upload_allow.iter().any(|c| c.contains(peer.ip())) {
            return Err(ImageError::Forbidden(
                "uploads are not allowed from this address",
            ));
        }
        if cfg.upload_token {
            self.authorized(req.headers())?;
        }
        let (parts, body) = req.into_parts();
        let files = upload::files(&parts.headers, body, cfg.max_upload_size.0).await?;
        // Check every file before storing any: a form is accepted whole or not at all.
        let mut checked = Vec::with_capacity(files.len());
        for data in files {
            let probe = sniff::probe(&data)?;
            codec::check_limits(&probe, &self.inner.limits)?;
            checked.push((probe, data));
        }
        let store = Arc::clone(self.store()?);
        let replies = tokio::task::spawn_blocking(move || {
            checked
                .into_iter()
                .map(|(probe, data)| {
                    let md5 = Md5Hex::of(&data);
                    store.put(&md5, &data)?;
                    Ok(info_json(&md5, data.len(), &probe))
                })
                .collect::<Result<Vec<String>, std::io::Error>>()
        })
        .await
        .map_err(|_| ImageError::Internal)??;
        let body = if replies.len() == 1 {
            replies.into_iter().next().expect("one reply")
        } else {
            format!("[{}]", replies.join(","))
        };
        Ok(json_response(StatusCode::OK, body))
    }

    async fn info(&self, req: &Request<RequestBody>) -> Result<Response<Body>, ImageError> {
        let q = req.uri().query().unwrap_or("");
        let md5 = q
            .split('&')
            .find_map(|kv| kv.strip_prefix("md5="))
            .and_then(Md5Hex::parse)
            .ok_or_else(|| ParamError {
                name: "md5",
                reason: "32 hex digits required".into(),
            })?;
        let data = self.load(&md5).await?;
        let probe = sniff::probe(&data)?;
        Ok(json_response(
            StatusCode::OK,
            info_json(&md5, data.len(), &probe),
        ))
    }

    async fn delete(
        &self,
        req: &Request<RequestBody>,
        md5: Md5Hex,
    ) -> Result<Response<Body>, ImageError> {
        self.authorized(req.headers())?;
        let store = Arc::clone(self.store()?);
        let m = md5.clone();
        let existed = tokio::task::spawn_blocking(move || store.delete(&m))
            .await
            .map_err(|_| ImageError::Internal)??;
        // Purge even if the file was already gone: variants may outlive it.
        self.inner
            .cache
            .purge(&Purge::Prefix(format!("img://{}/", md5.as_str())));
        if !existed {
            return Err(ImageError::NotFound);
        }
        Ok(json_response(
            StatusCode::OK,
            format!("{{\"md5\":\"{}\",\"deleted\":true}}", md5.as_str()),
        ))
    }

    async fn load(&self, md5: &Md5Hex) -> Result<Bytes, ImageError> {
        self.inner.load(md5).await
    }

    /// A transform of an uploaded original (zimg's API); `served` says so for the log.
    async fn get(
        &self,
        req: &Request<RequestBody>,
        md5: Md5Hex,
        served: &mut Option<ImageServed>,
    ) -> Result<Response<Body>, ImageError> {
        let inner = &self.inner;
        let served = served.insert(ImageServed {
            grammar: Grammar::Zimg.name(),
            presets: Box::from(""),
        });
        let mut params = Params::parse(req.uri().query().unwrap_or(""))?;
        if let Some(name) = params.t.take() {
            let preset = inner.cfg.presets.get(&name).ok_or_else(|| ParamError {
                name: "t",
                reason: format!("no preset named `{name}`"),
            })?;
            params = params.over(&preset.0);
            served.presets = name.into_boxed_str();
        }
        let resolved = Resolved::new(
            &params,
            inner.cfg.default_format,
            inner.cfg.default_quality.get() as u8,
            req.headers(),
        );
        let key = CacheKey::from_parts(
            "img",
            md5.as_str(),
            &format!("{}?{}{}", inner.prefix, resolved.key(), inner.settings),
        );
        let fill = Arc::clone(inner);
        let result = key.clone();
        let made = cached(inner, req, key, move || fill.make(md5, resolved)).await?;
        inner.learn(req, result, None, None, served);
        Ok(made)
    }

    /// An image proxy request (imgproxy's or thumbor's grammar, told apart by
    /// [`grammar_of`]): parsed (403, 400 before any work), its original loaded (404), planned
    /// from the header (400/422), cached under the original's id, the normalized options and
    /// the output format. `served` names the grammar for the log from the start, the presets
    /// once parsed.
    async fn proxy(
        &self,
        req: &Request<RequestBody>,
        path: &str,
        served: &mut Option<ImageServed>,
    ) -> Result<Response<Body>, ImageError> {
        let inner = &self.inner;
        let now = inner.cache.clock().now();
        let shape = grammar_of(path);
        let served = served.insert(ImageServed {
            grammar: shape.name(),
            presets: Box::from(""),
        });
        let Parsed {
            grammar,
            options,
            source,
        } = match shape {
            Grammar::Thumbor => {
                unsigned_refused(&inner.cfg, Grammar::Thumbor)?;
                // thumbor's grammar is options by design: a route taking only imgproxy's
                // presets takes none of its URLs (they chose any size and filter).
                if inner.cfg.imgproxy.only_presets {
                    return Err(GrammarError::Signature(
                        "this route takes only preset names (`imgproxy.only_presets`): thumbor's URLs are refused",
                    )
                    .into());
                }
                thumbor::parse(path, &inner.cfg.thumbor)?
            }
            _ => {
                unsigned_refused(&inner.cfg, Grammar::Imgproxy)?;
                imgproxy::parse(path, &inner.cfg.imgproxy, now)?
            }
        };
        *served = ImageServed {
            grammar: grammar.name(),
            presets: options.presets.join(",").into_boxed_str(),
        };
        if options.watermark.is_some() && inner.mark.is_none() {
            return Err(ImageError::Param(ParamError {
                name: "watermark",
                reason: "this route has no `watermark` image".into(),
            }));
        }
        let original = inner.sources.load(&source).await;
        inner.stats.source(&original);
        let original = original?;
        // What must still hold for this request to be answered from the route's index.
        let held = original.held.clone();
        let until = (options.expires != 0)
            .then(|| {
                SystemTime::UNIX_EPOCH
                    .checked_add(Duration::from_secs(options.expires.saturating_add(1)))
            })
            .flatten();
        let probe = sniff::probe(&original.data)?;
        let limits = request_limits(&inner.limits, &options.security, &probe, &original)?;
        let disposition = (grammar == Grammar::Imgproxy).then(|| Disposition {
            name: options
                .filename
                .clone()
                .unwrap_or_else(|| source.stem().to_string()),
            attachment: options.attachment,
        });
        let target = Target::choose(
            options.format.unwrap_or(inner.cfg.default_format),
            req.headers(),
        )
        // imgproxy's AUTO_JXL: never for an animation (its first frame only); AUTO_AVIF
        // neither when the source animates.
        .or_jxl(req.headers(), inner.auto_jxl && probe.frames <= 1)
        .for_animation(
            req.headers(),
            probe.format,
            animation::animates(&probe, sniff::ImageFormat::Webp),
        );
        let negotiated = matches!(target, Target::Auto(_));
        let quality = inner.cfg.default_quality.get() as u8;
        let skip = pipeline::skipped(&options, probe.format);
        let mut opts_key = if skip {
            "skp".to_string()
        } else {
            options.key()
        };
        // The name offered is the request's (the source's when `fn` is not given: two URLs of
        // the same bytes are two names), and the entry carries it: so is the key.
        if let Some(d) = &disposition {
            d.key_into(&mut opts_key);
        }
        let key = CacheKey::from_parts(
            "img",
            "proxy",
            &format!(
                "{}{}?{}&f={}{}",
                inner.prefix,
                original.id,
                opts_key,
                target.key(),
                inner.settings
            ),
        );
        // A cached result is served without planning it again.
        if let Some(r) = hit(inner, req, &key) {
            if let Some(held) = held {
                inner.learn(req, key, Some(held), until, served);
            }
            return Ok(r);
        }
        // Planned from the header: over the limits is refused here, before queueing or caching.
        let prepared = if skip {
            None
        } else {
            Some(pipeline::prepare(
                &probe, &options, target, quality, &limits,
            )?)
        };
        let fill = Arc::clone(inner);
        let tag = key.as_str().to_string();
        let result = key.clone();
        let made = cached(inner, req, key, move || async move {
            let Original { data, id, .. } = original;
            let (body, format) = match prepared {
                None => (data, probe.format),
                Some(prepared) => {
                    let job = pool::Job {
                        memory: prepared.memory,
                        cost: prepared.cost,
                    };
                    let mark = fill.mark.clone();
                    let format = prepared.format;
                    let memory = prepared.memory;
                    let source_len = data.len();
                    let timed = fill.stats.timed();
                    let route = Arc::clone(&fill);
                    let (ran, nanos) = (fill.stats)
                        .run(&fill.pool, job, move || {
                            let keep = decoded::Keep {
                                cache: &route.decoded,
                                id: &id,
                                stats: &route.stats,
                            };
                            let mut timing = transform::Timing::default();
                            let out = pipeline::run(
                                &data,
                                &probe,
                                &options,
                                &prepared,
                                mark.as_deref(),
                                &limits,
                                timed.then_some(&mut timing),
                                Some(&keep),
                            );
                            (out, timing)
                        })
                        .await?;
                    crate::memory::memory_freed(memory);
                    let out = ran.0?;
                    (fill.stats).transformed(grammar, format, nanos, source_len, out.len());
                    if timed {
                        fill.stats.stages(&ran.1);
                    }
                    (Bytes::from(out), format)
                }
            };
            let now = fill.cache.clock().now();
            let etag = format!("\"{}\"", Md5Hex::of(tag.as_bytes()).as_str());
            let offered = disposition.map(|d| d.header(format));
            let mut entry = result_entry(&etag, body, format, negotiated, PROXIED, now, offered);
            entry.reserve_stamp(&fill.status_header);
            Ok(Arc::new(entry))
        })
        .await?;
        if let Some(held) = held {
            inner.learn(req, result, Some(held), until, served);
        }
        Ok(made)
    }
}
/// The route's settings that shape its results besides a request's own options (the default
/// quality, progressive JPEG, AVIF's encoder, speed and pixel cap, enlargement, the watermark
/// image), as a part of the results' keys: those that differ from the defaults, so that a route
/// at the defaults keeps its keys, and a reload changing one makes new results rather than
/// serving those made under the old value (cached for a year).
fn settings_key(cfg: &ImagesConfig, mark: Option<&Raster>) -> String {
    use std::fmt::Write as _;
    let d = ImagesConfig::new_origin(String::new());
    let mut s = String::new();
    if cfg.default_quality != d.default_quality {
        let _ = write!(s, "&rq={}", cfg.default_quality.get());
    }
    if cfg.jpeg_progressive != d.jpeg_progressive {
        let _ = write!(s, "&rprog={}", u8::from(cfg.jpeg_progressive));
    }
    if cfg.avif_encoder != d.avif_encoder {
        let _ = write!(s, "&rae={:?}", cfg.avif_encoder);
    }
    if let Some(speed) = cfg.avif_speed.filter(|_| cfg.avif_speed != d.avif_speed) {
        let _ = write!(s, "&ras={}", speed.get());
    }
    if cfg.max_avif_pixels != d.max_avif_pixels {
        let _ = write!(s, "&rap={}", cfg.max_avif_pixels.get());
    }
    if cfg.max_upscale != d.max_upscale {
        let _ = write!(s, "&rup={}", cfg.max_upscale.0);
    }
    if let Some(m) = mark {
        let _ = write!(s, "&rwm={}", Md5Hex::of(&m.data).as_str());
    }
    s
}

/// The limits a route's configuration sets, AVIF output through `avif_encoder` (resolved).
fn limits_of(cfg: &ImagesConfig, avif_encoder: crate::config::AvifEncoder) -> Limits {
    Limits {
        max_pixels: cfg.max_pixels.get() as u64,
        max_dim: cfg.max_output_dimension.get() as u32,
        max_frames: cfg.max_frames.get() as u32,
        max_upscale: cfg.max_upscale.0,
        avif_speed: (cfg.avif_speed)
            .map_or(avif_encode::default_speed(avif_encoder), |s| s.get() as u8),
        avif_encoder,
        max_avif_pixels: cfg.max_avif_pixels.get() as u64,
        max_animation_pixels: cfg.max_animation_pixels.get() as u64,
        jpeg_progressive: cfg.jpeg_progressive,
    }
}

/// The route's limits as a request's security options (imgproxy's `msr`, `msfs`, `maf`,
/// `mafr`, `mrd`; allowed by the grammar) redefine them; a source over `msfs` or, animated,
/// over `mafr` is refused here (422).
fn request_limits(
    route: &Limits,
    s: &SecurityOptions,
    probe: &Probe,
    original: &Original,
) -> Result<Limits, ImageError> {
    let mut limits = *route;
    if !s.any() {
        return Ok(limits);
    }
    let megapixels = |mp: f64| (mp * 1e6).round() as u64;
    if let Some(max) = s
        .max_src_file_size
        .filter(|m| original.data.len() as u64 > *m)
    {
        return Err(ImageError::Source(SourceError::TooLarge(max)));
    }
    let pixels = u64::from(probe.width) * u64::from(probe.height);
    if let Some(limit) = s.max_animation_frame_resolution.map(megapixels) {
        if probe.frames > 1 && pixels > limit {
            return Err(CodecError::TooManyPixels { pixels, limit }.into());
        }
    }
    if let Some(mp) = s.max_src_resolution {
        limits.max_pixels = megapixels(mp);
    }
    if let Some(n) = s.max_animation_frames {
        limits.max_frames = n;
    }
    if let Some(n) = s.max_result_dimension {
        limits.max_dim = n;
    }
    Ok(limits)
}

/// How a proxied result is offered for saving (imgproxy's `Content-Disposition`): the file
/// name (`fn`, else the source's) with the result's extension, `inline` or `attachment`
/// (`att`).
struct Disposition {
    name: String,
    attachment: bool,
}

impl Disposition {
    /// Appends what tells this disposition apart to a result's key (the name percent-encoded:
    /// it cannot pass for another part of the key).
    fn key_into(&self, key: &mut String) {
        let name =
            percent_encoding::utf8_percent_encode(&self.name, percent_encoding::NON_ALPHANUMERIC);
        let _ = std::fmt::Write::write_fmt(
            key,
            format_args!("&cd={}:{name}", u8::from(self.attachment)),
        );
    }

    /// The header (RFC 6266): a quoted ASCII `filename`, and `filename*` in UTF-8 when the
    /// name is not plain ASCII.
    fn header(&self, format: sniff::ImageFormat) -> HeaderValue {
        let full = format!("{}.{}", self.name, format.extension());
        let kind = if self.attachment {
            "attachment"
        } else {
            "inline"
        };
        let ascii: String = full
            .chars()
            .map(|c| match c {
                '"' | '\\' => '_',
                c if c.is_ascii() && !c.is_ascii_control() => c,
                _ => '_',
            })
            .collect();
        let mut v = format!("{kind}; filename=\"{ascii}\"");
        if ascii != full {
            const ATTR: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
                .remove(b'-')
                .remove(b'.')
                .remove(b'_')
                .remove(b'~');
            let encoded = percent_encoding::utf8_percent_encode(&full, ATTR);
            v.push_str(&format!("; filename*=UTF-8''{encoded}"));
        }
        HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static("inline"))
    }
}

/// `r` with what the access log says of the image request it answers.
fn noted(mut r: Response<Body>, served: ImageServed) -> Response<Body> {
    r.extensions_mut().insert(served);
    r
}

/// The result cached under `key`, delivered as a hit (None: not cached, or results are not
/// kept on this route).
fn hit(inner: &Arc<Inner>, req: &Request<RequestBody>, key: &CacheKey) -> Option<Response<Body>> {
    if !inner.cfg.cache_results {
        return None;
    }
    let entry = inner.cache.get(key)?;
    Some(deliver::from_entry(
        &entry,
        req.method(),
        req.headers(),
        CacheStatus::Hit,
        &inner.status_header,
        inner.cache.clock().now(),
    ))
}

/// Serves the entry under `key`: from the cache, or made by `make` (once for all concurrent
/// requests of the key: the first makes it in a task of its own, which completes and feeds the
/// others even if its client goes away; another node may have made it already, the shared
/// tier, or be making it, its lease). Without `cache_results`, made for every request.
async fn cached<F, Fut>(
    inner: &Arc<Inner>,
    req: &Request<RequestBody>,
    key: CacheKey,
    make: F,
) -> Result<Response<Body>, ImageError>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Arc<Entry>, ImageError>> + Send + 'static,
{
    let deliver = |entry: &Entry, status: CacheStatus| {
        deliver::from_entry(
            entry,
            req.method(),
            req.headers(),
            status,
            &inner.status_header,
            inner.cache.clock().now(),
        )
    };
    if !inner.cfg.cache_results {
        let entry = make().await?;
        return Ok(deliver(&entry, CacheStatus::Bypass));
    }
    if let Some(r) = hit(inner, req, &key) {
        return Ok(r);
    }
    match inner.cache.join(&FillKey::from(key.clone())) {
        Join::Leader(guard) => {
            let fill_inner = Arc::clone(inner);
            let task = tokio::spawn(async move {
                let cache = &fill_inner.cache;
                let directives = Default::default();
                let (request, reach) = (http::HeaderMap::new(), Reach::Lease);
                let lease = match cache.find(&key, &request, &directives, reach).await {
                    // Results are served however old: their keys name what made them.
                    Found::Hit(entry) | Found::Stale(entry) => {
                        guard.complete(Arc::clone(&entry));
                        return Ok((entry, CacheStatus::Hit));
                    }
                    Found::Miss(lease) => lease,
                };
                let entry = make().await?;
                cache.store_filled(key, Arc::clone(&entry), lease);
                guard.complete(Arc::clone(&entry));
                Ok::<_, ImageError>((entry, CacheStatus::Miss))
            });
            let (entry, status) = task.await.map_err(|_| ImageError::Internal)??;
            Ok(deliver(&entry, status))
        }
        Join::Follower(f) => match f.wait(inner.cache.config().coalesce_timeout.0).await {
            FillOutcome::Filled(entry) => Ok(deliver(&entry, CacheStatus::Hit)),
            FillOutcome::Failed(_) | FillOutcome::Released => {
                let entry = make().await?;
                Ok(deliver(&entry, CacheStatus::Miss))
            }
        },
    }
}

/// The grammar of an image proxy path (after the route's prefix, two segments or more):
/// thumbor's when it starts with `unsafe` or a thumbor signature (28 characters of base64url
/// with its `=` padding: an HMAC-SHA1), imgproxy's otherwise (its signatures have no padding).
fn grammar_of(path: &str) -> Grammar {
    let first = path.split('/').next().unwrap_or("");
    if first == "unsafe" || (first.len() == 28 && first.ends_with('=')) {
        Grammar::Thumbor
    } else {
        Grammar::Imgproxy
    }
}

/// Refuses `grammar`'s URLs (403) when it has no key of its own and the route's other grammar
/// has one: a route that signs its URLs takes no unsigned ones, in either grammar (a key for
/// imgproxy's is not walked around through thumbor's `unsafe`, nor the other way round).
fn unsigned_refused(cfg: &ImagesConfig, grammar: Grammar) -> Result<(), GrammarError> {
    let imgproxy = !cfg.imgproxy.keys.is_empty();
    let thumbor = cfg.thumbor.key.as_deref().is_some_and(|k| !k.is_empty());
    let (own, other) = match grammar {
        Grammar::Thumbor => (thumbor, imgproxy),
        _ => (imgproxy, thumbor),
    };
    if other && !own {
        return Err(GrammarError::Signature(match grammar {
            Grammar::Thumbor => "this route signs its URLs: thumbor's need `images.thumbor.key`",
            _ => "this route signs its URLs: imgproxy's need `images.imgproxy.keys`",
        }));
    }
    Ok(())
}

/// The route's watermark image, decoded whole.
fn load_mark(path: &std::path::Path, limits: &Limits) -> Result<Raster, ImageError> {
    let data = std::fs::read(path)?;
    let probe = sniff::probe(&data)?;
    codec::check_limits(&probe, limits)?;
    let (img, _) = codec::decode(
        &data,
        &probe,
        (probe.width, probe.height),
        false,
        (0.0, 1.0),
        limits,
    )?;
    Ok(transform::orient(img, probe.orientation))
}

impl Inner {
    /// Remembers that `req` asks for the result under `result` ([`hits`]), while the
    /// original's memory copy `held` is fresh and until the URL expires (`until`).
    fn learn(
        &self,
        req: &Request<RequestBody>,
        result: CacheKey,
        held: Option<Held>,
        until: Option<SystemTime>,
        served: &ImageServed,
    ) {
        let Some(hits) = &self.hits else { return };
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
        let known = hits::Known {
            result,
            held,
            until,
            served: served.clone(),
        };
        hits.learn(
            path,
            params::negotiated(req.headers(), self.auto_jxl),
            known,
        );
    }

    /// The original: from memory when held there, else read on the blocking pool.
    async fn load(&self, md5: &Md5Hex) -> Result<Bytes, ImageError> {
        let store = Arc::clone(self.store.as_ref().ok_or(ImageError::NotFound)?);
        if let Some(data) = store.get_in_memory(md5) {
            return Ok(data);
        }
        let m = md5.clone();
        tokio::task::spawn_blocking(move || store.get(&m))
            .await
            .map_err(|_| ImageError::Internal)??
            .ok_or(ImageError::NotFound)
    }

    /// Loads the original and produces the entry for `resolved` (the original itself when
    /// nothing changes, else a transform on the pool).
    async fn make(
        self: Arc<Self>,
        md5: Md5Hex,
        resolved: Resolved,
    ) -> Result<Arc<Entry>, ImageError> {
        let data = self.load(&md5).await?;
        let probe = sniff::probe(&data)?;
        let resolved = resolved.for_source(probe.format);
        let key = resolved.key();
        let negotiated = resolved.negotiated();
        let (body, format) = if resolved.is_original(probe.format) {
            (data, probe.format)
        } else {
            let limits = self.limits;
            // Planned from the header: bad parameters and sources over the limits are refused
            // here, before queueing; the estimates decide when the transform may start.
            let prepared = transform::prepare(&probe, &resolved, &limits)?;
            let job = pool::Job {
                memory: prepared.memory,
                cost: prepared.cost,
            };
            let source_len = data.len();
            let (ran, nanos) = (self.stats)
                .run(&self.pool, job, move || {
                    transform::run(&data, &probe, &resolved, &limits)
                })
                .await?;
            // Its buffers are free now: let the server give such memory back to the system.
            crate::memory::memory_freed(prepared.memory);
            let (out, timing) = ran?;
            let format = prepared.format;
            (self.stats).transformed(Grammar::Zimg, format, nanos, source_len, out.len());
            self.stats.stages(&timing);
            tracing::debug!(
                md5 = md5.as_str(),
                params = key.as_str(),
                decode_us = timing.decode.as_micros() as u64,
                resize_us = timing.resize.as_micros() as u64,
                encode_us = timing.encode.as_micros() as u64,
                "image transformed"
            );
            (Bytes::from(out), format)
        };
        let now = self.cache.clock().now();
        let tag = Md5Hex::of(key.as_bytes());
        let etag = format!("\"{}-{}\"", md5.as_str(), &tag.as_str()[..16]);
        let mut entry = result_entry(&etag, body, format, negotiated, IMMUTABLE, now, None);
        entry.reserve_stamp(&self.status_header);
        Ok(Arc::new(entry))
    }
}

/// The cached response of one transform: real Content-Type, the strong ETag `etag` (naming the
/// original and the parameters), `cache_control`, a year of freshness in the cache, and the
/// `Content-Disposition` given.
fn result_entry(
    etag: &str,
    body: Bytes,
    format: sniff::ImageFormat,
    negotiated: bool,
    cache_control: &'static str,
    now: std::time::SystemTime,
    disposition: Option<HeaderValue>,
) -> Entry {
    let mut h = HeaderMap::new();
    if let Some(v) = disposition {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.mime()),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(cache_control),
    );
    if let Ok(v) = HeaderValue::from_str(etag) {
        h.insert(header::ETAG, v);
    }
    if negotiated {
        h.insert(header::VARY, HeaderValue::from_static("Accept"));
    }
    h.insert(
        HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    );
    let freshness = Freshness::own(Duration::from_secs(365 * 24 * 3600), now);
    Entry::build(
        StatusCode::OK,
        h,
        vec![(Encoding::Identity, body)],
        freshness,
        false,
    )
}

fn info_json(md5: &Md5Hex, size: usize, p: &Probe) -> String {
    format!(
        "{{\"md5\":\"{}\",\"size\":{},\"width\":{},\"height\":{},\"format\":\"{}\"}}",
        md5.as_str(),
        size,
        p.width,
        p.height,
        p.format.name()
    )
}

fn req_path(rest: &str) -> &str {
    &rest[..rest.len().min(64)]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Limits::DEFAULT`, which tests and tools start from, is what a route whose
    /// configuration sets no limit runs under.
    #[test]
    fn the_default_limits_are_the_configurations() {
        use crate::config::{AvifEncoder, Config, HandlerConfig};
        let cfg = Config::parse(
            "[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\nimages = { dir = \"d\" }\n",
            "t.toml",
        )
        .unwrap();
        let HandlerConfig::Images(im) = &cfg.listeners[0].routes[0].handler else {
            panic!("an image route");
        };
        let made = limits_of(im, AvifEncoder::Rav1e);
        let want = Limits {
            avif_encoder: AvifEncoder::Rav1e,
            ..Limits::DEFAULT
        };
        assert_eq!(format!("{made:?}"), format!("{want:?}"));
    }

    #[test]
    fn a_format_without_its_library_is_415() {
        let e = ImageError::Refused(CodecError::Unavailable {
            format: "JPEG XL output",
            library: "libjxl",
            why: "none of libjxl.so.0.7 loads".into(),
        });
        assert_eq!(e.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert!(e.to_string().contains("libjxl"), "{e}");
    }

    #[test]
    fn grammar_by_shape() {
        assert_eq!(grammar_of("unsafe/100x100/smart/a.jpg"), Grammar::Thumbor);
        assert_eq!(
            grammar_of("ABCDEFGHIJKLMNOPQRSTUVWXYZa=/100x100/a.jpg"),
            Grammar::Thumbor
        );
        assert_eq!(
            grammar_of("insecure/rs:fill:1:1/plain/a.jpg"),
            Grammar::Imgproxy
        );
        assert_eq!(
            grammar_of("oKfUtW34Dvo2BGQehJFR4Nr0_rIjOtdtzJ3QFsUcXH8/plain/a.jpg"),
            Grammar::Imgproxy
        );
        // A truncated imgproxy signature of 28 characters has no padding.
        assert_eq!(
            grammar_of("ABCDEFGHIJKLMNOPQRSTUVWXYZab/plain/a.jpg"),
            Grammar::Imgproxy
        );
    }
}
