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
//! ```
//!
//! Files: [`params`] (URL parameters, presets, the normalized cache key), [`sniff`] (format and
//! dimensions from headers), [`storage`] (the store trait and the local directory), [`upload`]
//! (reading raw and multipart bodies under a limit), [`transform`] (geometry and pixel ops),
//! [`codec`] (decoders and encoders per format), [`colour`] (embedded ICC profiles to sRGB,
//! CMYK, profiles written back when kept), [`avif`] (the AVIF decoder: container, AV1,
//! YUV to RGB), [`raster`] (what they share: pixels, limits, errors; a leaf, so that codec and
//! avif import it and not each other), [`pool`] (the bounded blocking pool: memory budget, fair
//! order), [`smart`] (content-aware crop placement: edges, skin, saturation), [`source`] (the
//! image proxy's originals: `origin`, `root`, `allow_sources`; a route without `dir` takes no
//! uploads), [`grammar`] (what imgproxy's and thumbor's URL grammars make of a path),
//! [`thumbor`] (thumbor's grammar), [`filters`] (the proxy's pixel filters).
//!
//! Cache keys are `img://<md5><route prefix>?<normalized params>`, so a purge removes every key
//! starting with `img://<md5>/`, and `w=1&h=2` shares the entry of `h=2&w=1`.

pub mod avif;
pub mod codec;
pub mod colour;
pub mod filters;
pub mod grammar;
pub mod jpeg;
pub mod params;
pub mod pool;
pub mod raster;
pub mod smart;
pub mod sniff;
pub mod source;
pub mod storage;
pub mod thumbor;
pub mod transform;
pub mod upload;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::body::RequestBody;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};

use crate::body::Body;
use crate::cache::policy::Freshness;
use crate::cache::{Cache, CacheKey, Entry, FillKey, FillOutcome, Found, Join, Purge, Reach};
use crate::compress::Encoding;
use crate::config::ImagesConfig;
use crate::deliver::{self, CacheStatus};
use crate::fleet::Fleet;
use crate::http::{json_response, text_response};
use params::{ParamError, Params, Resolved};
use pool::{Pool, PoolError};
use raster::{CodecError, Limits};
use sniff::{Probe, SniffError};
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
}

impl ImageError {
    pub fn status(&self) -> StatusCode {
        match self {
            ImageError::Param(_) | ImageError::BadUpload(_) => StatusCode::BAD_REQUEST,
            ImageError::NotFound | ImageError::NoStore => StatusCode::NOT_FOUND,
            ImageError::NotAnImage(_) | ImageError::Refused(CodecError::Unsupported(_)) => {
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
}

/// Stored results never change (the key names the bytes): cached for a year, immutable.
const IMMUTABLE: &str = "public, max-age=31536000, immutable";

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
        let limits = Limits {
            max_pixels: cfg.max_pixels.get() as u64,
            max_dim: cfg.max_output_dimension.get() as u32,
            max_frames: cfg.max_frames.get() as u32,
            max_upscale: cfg.max_upscale.0,
            avif_speed: cfg.avif_speed.get() as u8,
            max_avif_pixels: cfg.max_avif_pixels.get() as u64,
        };
        Images {
            inner: Arc::new(Inner {
                pool: Pool::new(
                    cfg.workers.as_usize(),
                    cfg.queue_depth.get() as usize,
                    cfg.decode_memory.0,
                    cfg.queue_timeout.0,
                ),
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

    /// Serves one request.
    pub async fn handle(&self, req: Request<RequestBody>, peer: SocketAddr) -> Response<Body> {
        let path = req.uri().path();
        let rest = path
            .strip_prefix(self.inner.prefix.as_str())
            .unwrap_or(path)
            .trim_start_matches('/')
            .to_string();
        let method = req.method().clone();
        let result = match (&method, rest.as_str()) {
            (&Method::POST, "upload") => self.upload(req, peer).await,
            (&Method::GET | &Method::HEAD, "info") => self.info(&req).await,
            (_, "upload" | "info") => Err(ImageError::Method),
            (&Method::GET | &Method::HEAD, name) => match Md5Hex::parse(name) {
                Some(md5) => self.get(&req, md5).await,
                None => Err(ImageError::NotFound),
            },
            (&Method::DELETE, name) => match Md5Hex::parse(name) {
                Some(md5) => self.delete(&req, md5).await,
                None => Err(ImageError::NotFound),
            },
            _ => Err(ImageError::Method),
        };
        result.unwrap_or_else(|e| {
            tracing::debug!(path = %req_path(&rest), error = %e, "image request refused");
            e.response()
        })
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

    async fn get(
        &self,
        req: &Request<RequestBody>,
        md5: Md5Hex,
    ) -> Result<Response<Body>, ImageError> {
        let inner = &self.inner;
        let mut params = Params::parse(req.uri().query().unwrap_or(""))?;
        if let Some(name) = params.t.take() {
            let preset = inner.cfg.presets.get(&name).ok_or_else(|| ParamError {
                name: "t",
                reason: format!("no preset named `{name}`"),
            })?;
            params = params.over(&preset.0);
        }
        let resolved = Resolved::new(
            &params,
            inner.cfg.default_format,
            inner.cfg.default_quality.get() as u8,
            req.headers(),
        );
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
            let entry = Arc::clone(inner).make(md5, resolved).await?;
            return Ok(deliver(&entry, CacheStatus::Bypass));
        }
        let key = CacheKey::from_parts(
            "img",
            md5.as_str(),
            &format!("{}?{}", inner.prefix, resolved.key()),
        );
        if let Some(entry) = inner.cache.get(&key) {
            return Ok(deliver(&entry, CacheStatus::Hit));
        }
        match inner.cache.join(&FillKey::from(key.clone())) {
            Join::Leader(guard) => {
                // The fill runs as its own task: it completes (and feeds the followers) even if
                // this client goes away. Another node may have made this result already (the
                // shared tier), or be making it (its lease).
                let fill_inner = Arc::clone(inner);
                let task = tokio::spawn(async move {
                    let cache = &fill_inner.cache;
                    let directives = Default::default();
                    let (request, reach) = (http::HeaderMap::new(), Reach::Lease);
                    let lease = match cache.find(&key, &request, &directives, reach).await {
                        // Results never change: a stored one is served however old.
                        Found::Hit(entry) | Found::Stale(entry) => {
                            guard.complete(Arc::clone(&entry));
                            return Ok((entry, CacheStatus::Hit));
                        }
                        Found::Miss(lease) => lease,
                    };
                    let entry = Arc::clone(&fill_inner).make(md5, resolved).await?;
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
                    let entry = Arc::clone(inner).make(md5, resolved).await?;
                    Ok(deliver(&entry, CacheStatus::Miss))
                }
            },
        }
    }
}

impl Inner {
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
            let ran = self
                .pool
                .run(job, move || {
                    transform::run(&data, &probe, &resolved, &limits)
                })
                .await?;
            // Its buffers are free now: let the server give such memory back to the system.
            crate::memory::memory_freed(prepared.memory);
            let (out, timing) = ran?;
            let format = prepared.format;
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
        let mut entry = result_entry(&md5, &key, body, format, negotiated, now);
        entry.reserve_stamp(&self.status_header);
        Ok(Arc::new(entry))
    }
}

/// The cached response of one transform: real Content-Type, strong ETag naming the original and
/// the parameters, a year of immutable freshness.
fn result_entry(
    md5: &Md5Hex,
    key: &str,
    body: Bytes,
    format: sniff::ImageFormat,
    negotiated: bool,
    now: std::time::SystemTime,
) -> Entry {
    let mut h = HeaderMap::new();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.mime()),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(IMMUTABLE));
    let tag = Md5Hex::of(key.as_bytes());
    if let Ok(v) = HeaderValue::from_str(&format!("\"{}-{}\"", md5.as_str(), &tag.as_str()[..16])) {
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
