//! The `[compression]` section: which bodies get compressed variants, and how hard.

use serde::de::{self, Deserializer};
use serde::Deserialize;

use super::headers::is_token;
use super::units::{Bounded, ByteSize, Workers};

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
