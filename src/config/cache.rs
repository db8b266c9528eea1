//! The `[cache]` section: the memory cache shared by every route (its tiers below memory are in
//! [`super::tiers`]).

use std::time::Duration;

use http::header::HeaderName;
use serde::Deserialize;

use super::headers::HeaderNameCfg;
use super::tiers::{DiskConfig, SharedConfig};
use super::units::{Bounded, ByteSize, Dur, Fraction, KIB};

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
    /// Stored bodies (each encoding's) this large and larger are kept in a memory file, which
    /// plain HTTP/1.1 connections send with `sendfile`, without copying them into the socket;
    /// 0 = never (every body on the heap, copied into the socket).
    pub zero_copy_min: ByteSize,
    /// At most this many bodies kept so at once: each holds an open file, counted with the
    /// connections against the open-files limit. Beyond it, bodies stay on the heap.
    pub zero_copy_files: Bounded<1, 1_000_000>,
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
            zero_copy_min: ByteSize(64 * KIB),
            zero_copy_files: Bounded(1024),
            disk: None,
            shared: None,
        }
    }
}
