//! The `images` handler's settings (`images = { dir = "..." }` on a route): the image server's
//! store, limits, workers, output defaults and presets.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::image_options::OptionList;
use super::image_params::{FormatChoice, Preset};
use super::net::{Cidr, Upstream};
use super::units::{show_size, yes, Bounded, ByteSize, Dur, Upscale, Workers, GIB, MIB};

/// The AV1 encoder behind AVIF output (`avif_encoder`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AvifEncoder {
    /// libaom when it loads (libaom.so.3, at run time), rav1e otherwise.
    #[default]
    Auto,
    /// libaom only: without it, AVIF output is refused (415 naming the library).
    Aom,
    /// rav1e (built in) only.
    Rav1e,
}

/// The image server (`images = { dir = "..." }`): upload, store by MD5, transform from URL
/// parameters (zimg's API), results cached (the image server, `crate::images`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImagesConfig {
    /// Directory holding uploaded originals (created at start if missing), sharded by MD5.
    /// Optional: a route with only `origin` or `root` takes no uploads. A route needs at least
    /// one of `dir`, `origin` and `root`.
    #[serde(default)]
    pub dir: Option<PathBuf>,
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
    /// Most frames an animated GIF, WebP or PNG (APNG) may have (upload and transform).
    #[serde(default = "ImagesConfig::default_max_frames")]
    pub max_frames: Bounded<1, 100_000>,
    /// Most pixels of all an animation's frames together (width × height × frames, from the
    /// header): an animated source is decoded whole, every frame, when the output animates.
    #[serde(default = "ImagesConfig::default_max_animation_pixels")]
    pub max_animation_pixels: Bounded<1, 10_000_000_000>,
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
    /// Decoded originals the image proxy keeps in memory for the next variants of the same
    /// original (its pixels at the scale decoded, least recently used evicted), so that a
    /// burst of widths and formats decodes it once; taken out of `decode_memory`. 0 keeps
    /// none (every transform decodes). Unset: 64 MiB, at most an eighth of `decode_memory`;
    /// set, at most half of it.
    #[serde(default)]
    pub decoded_cache: Option<ByteSize>,
    /// Largest scale factor applied to the source (1.0: never enlarged). A request for more
    /// gets the largest allowed size with the requested aspect ratio.
    #[serde(default = "ImagesConfig::default_max_upscale")]
    pub max_upscale: Upscale,
    /// AVIF output's speed: 1 (slowest, smallest) to 10 (fastest); libaom's cpu-used plus one,
    /// or rav1e's preset. Unset: 9 with libaom, 10 with rav1e.
    #[serde(default)]
    pub avif_speed: Option<Bounded<1, 10>>,
    /// Which AV1 encoder writes AVIF output: `auto` (libaom when it loads, else rav1e), `aom`
    /// (libaom only; without it AVIF output is refused with 415), `rav1e`.
    #[serde(default)]
    pub avif_encoder: AvifEncoder,
    /// Largest AVIF output in pixels (AVIF encoding costs far more CPU per pixel than the
    /// other formats): `f=avif` beyond it gets 400, `f=auto` falls back to the source's format.
    #[serde(default = "ImagesConfig::default_max_avif_pixels")]
    pub max_avif_pixels: Bounded<1, 1_000_000_000>,
    /// Output format when a request has no `f`: `none` keeps the source's, `auto` picks AVIF
    /// or WebP from Accept, or a fixed `jpeg`, `png`, `webp`, `avif`, `gif`, `jxl`.
    #[serde(default = "ImagesConfig::default_format")]
    pub default_format: FormatChoice,
    /// `auto` answers JPEG XL to a client whose Accept lists image/jxl, before AVIF and WebP
    /// (imgproxy's `IMGPROXY_AUTO_JXL`); never when libjxl cannot be loaded.
    #[serde(default)]
    pub auto_jxl: bool,
    /// Encoding quality (1-100) when a request has no `q`.
    #[serde(default = "ImagesConfig::default_quality")]
    pub default_quality: Bounded<1, 100>,
    /// JPEG output is progressive (imgproxy's `IMGPROXY_JPEG_PROGRESSIVE`): a little smaller,
    /// shown coarse first while loading, a little slower to encode.
    #[serde(default)]
    pub jpeg_progressive: bool,
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
    /// The image proxy's originals: a base URL (`"http://127.0.0.1:3000"`, or
    /// `"http://host/images/"`) or a pool (`"pool:NAME"`, a `[pool.NAME]`) that relative
    /// sources of imgproxy and thumbor URLs are fetched from, with larder's upstream machinery
    /// (keep-alive, TLS verified), cached in the tiers by HTTP caching rules, coalesced,
    /// limited to `max_source_size`.
    #[serde(default)]
    pub origin: Option<String>,
    /// A directory of originals that relative sources are read from (paths cannot leave it),
    /// instead of `origin`; also `local:///path` sources.
    #[serde(default)]
    pub root: Option<PathBuf>,
    /// Absolute source URLs allowed (`"https://images.example.com/"`: prefixes); empty allows
    /// none: only sources relative to `origin` or `root`.
    #[serde(default)]
    pub allow_sources: Vec<String>,
    /// Largest original fetched or read, enforced from Content-Length and while reading (the
    /// request fails with 422, nothing cached).
    #[serde(default = "ImagesConfig::default_max_source")]
    pub max_source_size: ByteSize<0, GIB>,
    /// Longest an original's fetch may take.
    #[serde(default = "ImagesConfig::default_source_timeout")]
    pub source_timeout: Dur<1>,
    /// imgproxy's URL grammar on this route: signature keys and presets.
    #[serde(default)]
    pub imgproxy: ImgproxyConfig,
    /// thumbor's URL grammar on this route: its signing key.
    #[serde(default)]
    pub thumbor: ThumborConfig,
    /// The watermark image (`wm` / thumbor's `watermark` filter with this image), a file read
    /// at load.
    #[serde(default)]
    pub watermark: Option<PathBuf>,
}

/// One imgproxy signing key pair, hex-encoded (imgproxy's `IMGPROXY_KEY`/`IMGPROXY_SALT`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyPair {
    #[serde(deserialize_with = "hex_string")]
    pub key: String,
    #[serde(deserialize_with = "hex_string")]
    pub salt: String,
}

/// A non-empty string of hex digit pairs (checked at load: a bad key names its line).
fn hex_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if s.is_empty() || s.len() % 2 != 0 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(serde::de::Error::custom(
            "must be hex digits, an even number of them (imgproxy's IMGPROXY_KEY/SALT form)",
        ));
    }
    Ok(s)
}

/// imgproxy's grammar on an image route (`images.imgproxy`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImgproxyConfig {
    /// Key pairs: a URL signed with any of them is accepted (rotation). Empty: URLs are
    /// unsigned (`/insecure/...` or any signature segment).
    #[serde(default)]
    pub keys: Vec<KeyPair>,
    /// Bytes of the HMAC-SHA256 kept in the signature (imgproxy's `IMGPROXY_SIGNATURE_SIZE`).
    #[serde(default = "ImgproxyConfig::default_signature_size")]
    pub signature_size: Bounded<1, 32>,
    /// Named option lists for `pr:NAME`, in imgproxy's grammar: `thumb = "rs:fill:100:100/q:80"`;
    /// `default` applies to every request.
    #[serde(default)]
    pub presets: std::collections::BTreeMap<String, OptionList>,
    /// URLs may redefine the route's limits with imgproxy's security options (`msr`, `msfs`,
    /// `maf`, `mafr`, `mrd`; IMGPROXY_ALLOW_SECURITY_OPTIONS); false refuses them with 403.
    #[serde(default)]
    pub allow_security_options: bool,
    /// URLs name presets only (IMGPROXY_ONLY_PRESETS): `/SIGNATURE/thumb:sharp/plain/SOURCE`,
    /// the options segment being preset names separated by `:`; options are refused (an
    /// unknown preset, 400).
    #[serde(default)]
    pub only_presets: bool,
}

impl Default for ImgproxyConfig {
    fn default() -> Self {
        ImgproxyConfig {
            keys: Vec::new(),
            signature_size: Self::default_signature_size(),
            presets: Default::default(),
            allow_security_options: false,
            only_presets: false,
        }
    }
}

impl ImgproxyConfig {
    fn default_signature_size() -> Bounded<1, 32> {
        Bounded(32)
    }
}

/// thumbor's grammar on an image route (`images.thumbor`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThumborConfig {
    /// The security key (thumbor's `SECURITY_KEY`): URLs must carry its HMAC-SHA1; without
    /// one, `/unsafe/` URLs are served.
    #[serde(default)]
    pub key: Option<String>,
}

/// An absolute http(s) URL taken apart, for `allow_sources` and the sources checked against
/// it: compared on these parts, never on the text (`https://good.example.com.evil.net/` is
/// not under `https://good.example.com`, nor is `https://good.example.com@evil.net/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceUrl {
    pub scheme: http::uri::Scheme,
    /// `host[:port]` as written (no user info), to connect to.
    pub authority: http::uri::Authority,
    /// The host, lowercase.
    pub host: String,
    /// The port, the scheme's default when none is written.
    pub port: u16,
    /// Path and query (`/` when the URL has no path).
    pub path_and_query: String,
}

impl SourceUrl {
    /// Reads an absolute `http://` or `https://` URL; user info (`user@host`) is refused.
    pub fn parse(s: &str) -> Result<SourceUrl, String> {
        let uri: http::Uri = s.parse().map_err(|e| format!("`{s}` is not a URL: {e}"))?;
        let scheme = uri.scheme().cloned().unwrap_or(http::uri::Scheme::HTTP);
        if uri.scheme().is_none()
            || (scheme != http::uri::Scheme::HTTP && scheme != http::uri::Scheme::HTTPS)
        {
            return Err(format!("`{s}`: an http:// or https:// URL is needed"));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| format!("`{s}` has no host"))?;
        if authority.as_str().contains('@') {
            return Err(format!("`{s}`: user info (`user@`) is not allowed"));
        }
        let port = authority
            .port_u16()
            .unwrap_or(if scheme == http::uri::Scheme::HTTPS {
                443
            } else {
                80
            });
        Ok(SourceUrl {
            host: authority.host().to_ascii_lowercase(),
            scheme,
            port,
            path_and_query: uri
                .path_and_query()
                .map_or_else(|| "/".to_string(), |p| p.as_str().to_string()),
            authority,
        })
    }

    /// Whether `src` is under this URL taken as an `allow_sources` prefix: same scheme, host
    /// and port, and a path under this one's (at a `/`: `/img` admits `/img/a.jpg`, not
    /// `/img-private/a.jpg`; `/img/` admits what starts with it).
    pub fn admits(&self, src: &SourceUrl) -> bool {
        if self.scheme != src.scheme || self.host != src.host || self.port != src.port {
            return false;
        }
        let prefix = self.path_and_query.as_str();
        let path = src.path_and_query.as_str();
        if prefix.ends_with('/') {
            return path.starts_with(prefix);
        }
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['/', '?']))
    }
}

/// An `allow_sources` entry read: an absolute http(s) URL without a query.
pub fn allowed_source(s: &str) -> Result<SourceUrl, String> {
    let u = SourceUrl::parse(s)?;
    if u.path_and_query.contains('?') {
        return Err(format!("`{s}`: a URL prefix, without a query"));
    }
    Ok(u)
}

/// Where an image route's `origin` points: a base URL, or a named pool.
#[derive(Debug, Clone, PartialEq)]
pub enum OriginRef {
    Url(Upstream),
    Pool(String),
}

impl ImagesConfig {
    /// `origin` read: a base URL (http:// or https://, a path prefix, no query) or
    /// `pool:NAME`; None without one; an error says what is wrong with it.
    pub fn origin_ref(&self) -> Result<Option<OriginRef>, String> {
        let Some(o) = self.origin.as_deref() else {
            return Ok(None);
        };
        if let Some(name) = o.strip_prefix("pool:") {
            if name.is_empty() {
                return Err("`pool:` needs a pool's name (`pool:images`)".into());
            }
            return Ok(Some(OriginRef::Pool(name.to_string())));
        }
        o.parse::<Upstream>().map(|u| Some(OriginRef::Url(u)))
    }

    /// An image route storing uploads under `dir` with every other setting at its default.
    pub fn new_dir(dir: PathBuf) -> Self {
        let mut c = Self::new_origin(String::new());
        c.origin = None;
        c.dir = Some(dir);
        c
    }

    /// An image route taking its originals from `origin` (a base URL or `pool:NAME`), without
    /// uploads, every other setting at its default.
    pub fn new_origin(origin: String) -> Self {
        ImagesConfig {
            dir: None,
            max_upload_size: Self::default_max_upload(),
            max_pixels: Self::default_max_pixels(),
            max_output_dimension: Self::default_max_output(),
            max_frames: Self::default_max_frames(),
            max_animation_pixels: Self::default_max_animation_pixels(),
            originals_memory: Self::default_originals_memory(),
            share_originals: false,
            workers: Bounded(0),
            queue_depth: Self::default_queue_depth(),
            queue_timeout: Self::default_queue_timeout(),
            decode_memory: Self::default_decode_memory(),
            decoded_cache: None,
            max_upscale: Self::default_max_upscale(),
            avif_speed: None,
            avif_encoder: AvifEncoder::Auto,
            max_avif_pixels: Self::default_max_avif_pixels(),
            default_format: Self::default_format(),
            auto_jxl: false,
            default_quality: Self::default_quality(),
            jpeg_progressive: false,
            cache_results: true,
            upload_allow: Vec::new(),
            upload_token: false,
            presets: Default::default(),
            origin: Some(origin),
            root: None,
            allow_sources: Vec::new(),
            max_source_size: Self::default_max_source(),
            source_timeout: Self::default_source_timeout(),
            imgproxy: ImgproxyConfig::default(),
            thumbor: ThumborConfig::default(),
            watermark: None,
        }
    }
    /// The bytes of `decoded_cache` (its default when unset).
    pub fn decoded_cache_bytes(&self) -> u64 {
        self.decoded_cache
            .map_or((64 << 20).min(self.decode_memory.0 / 8), |b| b.0)
    }

    /// Why `decoded_cache` cannot be had (more than half of `decode_memory`, which it is
    /// taken out of: transforms would be left too little).
    pub fn decoded_cache_error(&self) -> Option<String> {
        let (kept, all) = (self.decoded_cache_bytes(), self.decode_memory.0);
        (kept > all / 2).then(|| {
            format!(
                "is {}, more than half of decode_memory ({}), which it is taken out of; set \
                 at most {}",
                show_size(kept),
                show_size(all),
                show_size(all / 2)
            )
        })
    }

    fn default_max_source() -> ByteSize<0, GIB> {
        ByteSize(20 << 20)
    }
    fn default_source_timeout() -> Dur<1> {
        Dur(Duration::from_secs(10))
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
    /// 100 frames of 1000×1000 (imgproxy's default is 1 frame of 50 megapixels, 0 more).
    fn default_max_animation_pixels() -> Bounded<1, 10_000_000_000> {
        Bounded(100_000_000)
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

#[cfg(test)]
mod tests {
    use crate::config::tests::err;
    use crate::config::{Config, HandlerConfig};

    #[test]
    fn allowed_sources_compare_parsed_urls() {
        use super::{allowed_source, SourceUrl};
        let good = allowed_source("https://good.example.com").unwrap();
        let ok = |u: &str| good.admits(&SourceUrl::parse(u).unwrap());
        assert!(ok("https://good.example.com/a.jpg"));
        assert!(ok("https://GOOD.example.com:443/a.jpg"));
        assert!(!ok("https://good.example.com.evil.net/a.jpg"));
        assert!(!ok("http://good.example.com/a.jpg"));
        assert!(!ok("https://good.example.com:8443/a.jpg"));
        assert!(SourceUrl::parse("https://good.example.com@evil.net/a.jpg").is_err());
        let img = allowed_source("https://cdn.example.com/img").unwrap();
        let ok = |u: &str| img.admits(&SourceUrl::parse(u).unwrap());
        assert!(ok("https://cdn.example.com/img/a.jpg"));
        assert!(!ok("https://cdn.example.com/img-private/a.jpg"));
        assert!(!ok("https://cdn.example.com/a.jpg"));
        assert!(allowed_source("ftp://x/").is_err());
        assert!(allowed_source("https://x/?a=1").is_err());
    }

    /// A route needs originals from somewhere; a bad origin names its key and line.
    #[test]
    fn image_sources_are_checked() {
        let route = |keys: &str| {
            format!(
                "[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\nimages = {{ {keys} }}\n"
            )
        };
        let e = err(&route("max_pixels = 100"));
        assert!(
            e.contains("line 4") && e.contains("needs one of `dir`"),
            "{e}"
        );
        let e = err(&route("origin = \"ftp://x/\""));
        assert!(e.contains("line 4") && e.contains("images.origin`"), "{e}");
        let e = err(&route("origin = \"pool:nope\""));
        assert!(e.contains("no [pool.nope]"), "{e}");
        let e = err(&route("root = \"/x\", allow_sources = [\"https://a@b/\"]"));
        assert!(
            e.contains("images.allow_sources`") && e.contains("user info"),
            "{e}"
        );
        for ok in [
            "origin = \"http://127.0.0.1:3000/img/\"",
            "root = \"/srv\"",
            "dir = \"/x\"",
        ] {
            Config::parse(&route(ok), "t").unwrap();
        }
        let c = Config::parse(
            &format!(
                "[pool.img]\nbackends = [\"http://127.0.0.1:2\"]\n{}",
                route("origin = \"pool:img\"")
            ),
            "t",
        );
        assert!(c.is_ok(), "{:?}", c.err());
    }

    /// The animation limit and progressive JPEG: defaults, and a bad value names key and line.
    #[test]
    fn animation_pixels_and_progressive() {
        let route = |keys: &str| {
            format!(
                "[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\nimages = {{ dir = \"/x\", {keys} }}\n"
            )
        };
        let e = err(&route("max_animation_pixels = 0"));
        assert!(
            e.contains("line 4") && e.contains("images.max_animation_pixels`"),
            "{e}"
        );
        let e = err(&route("jpeg_progressive = 1"));
        assert!(e.contains("images.jpeg_progressive`"), "{e}");
        let c = Config::parse(
            &route("max_animation_pixels = 5000000, jpeg_progressive = true"),
            "t",
        )
        .unwrap();
        let HandlerConfig::Images(i) = &c.listeners[0].routes[0].handler else {
            panic!("images route")
        };
        assert_eq!(i.max_animation_pixels.get(), 5_000_000);
        assert!(i.jpeg_progressive);
        let d = super::ImagesConfig::new_dir("/x".into());
        assert_eq!(d.max_animation_pixels.get(), 100_000_000);
        assert!(!d.jpeg_progressive);
    }

    /// The AVIF encoder and speed: defaults (auto, speed unset), values, and a bad one named
    /// with its key and line.
    #[test]
    fn avif_encoder_and_speed() {
        use super::AvifEncoder;
        let route = |keys: &str| {
            format!(
                "[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\nimages = {{ dir = \"/x\", {keys} }}\n"
            )
        };
        let e = err(&route("avif_encoder = \"svt\""));
        assert!(
            e.contains("line 4") && e.contains("images.avif_encoder`") && e.contains("rav1e"),
            "{e}"
        );
        let e = err(&route("avif_speed = 11"));
        assert!(e.contains("images.avif_speed`"), "{e}");
        let c = Config::parse(&route("avif_encoder = \"rav1e\", avif_speed = 7"), "t").unwrap();
        let HandlerConfig::Images(i) = &c.listeners[0].routes[0].handler else {
            panic!("images route")
        };
        assert_eq!(
            (i.avif_encoder, i.avif_speed.map(|s| s.get())),
            (AvifEncoder::Rav1e, Some(7))
        );
        let d = super::ImagesConfig::new_dir("/x".into());
        assert_eq!((d.avif_encoder, d.avif_speed), (AvifEncoder::Auto, None));
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
        let e = err("[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\nimages = { dir = \"/x\", imgproxy = { presets = { t = \"rs:fill:100:100/q:abc\" } } }\n");
        assert!(e.contains("line 4") && e.contains("`q`"), "{e}");
        let e = err("[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\nimages = { dir = \"/x\", imgproxy = { keys = [{ key = \"zz\", salt = \"00\" }] } }\n");
        assert!(e.contains("line 4") && e.contains("hex"), "{e}");
    }
}
