//! A transform's URL parameters (zimg's API plus `f=auto`) resolved into what to do: defaults
//! and presets (`t=NAME`) applied, the output format negotiated, and the normalized form that
//! keys the cache. The grammar itself ([`Params::parse`], a 400 naming the parameter) is plain
//! data in [`crate::config::image_params`], since presets in the configuration are written in it.

use std::fmt::Write as _;

use http::header::{self, HeaderMap};

pub use crate::config::image_params::{FormatChoice, Mode, ParamError, Params};

use super::sniff::ImageFormat;

/// The output format of a request, decided before the source is read (so the cache key needs
/// nothing but the request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The source's format.
    Keep,
    Fixed(ImageFormat),
    /// Negotiated from Accept: JPEG XL (where the route allows it, [`Target::or_jxl`]), AVIF
    /// or WebP if listed, else (`None`) the source's format; GIF for an animated WebP whose
    /// client lists no format that animates ([`Target::for_animation`]).
    Auto(Option<ImageFormat>),
}

impl Target {
    /// The target of a format choice, `auto` negotiated from the request's Accept.
    pub fn choose(choice: FormatChoice, req: &HeaderMap) -> Target {
        match choice {
            FormatChoice::Keep => Target::Keep,
            FormatChoice::Auto => Target::Auto(negotiate(req)),
            FormatChoice::Jpeg => Target::Fixed(ImageFormat::Jpeg),
            FormatChoice::Png => Target::Fixed(ImageFormat::Png),
            FormatChoice::Webp => Target::Fixed(ImageFormat::Webp),
            FormatChoice::Avif => Target::Fixed(ImageFormat::Avif),
            FormatChoice::Gif => Target::Fixed(ImageFormat::Gif),
            FormatChoice::Jxl => Target::Fixed(ImageFormat::Jxl),
        }
    }

    /// JPEG XL instead when negotiated (`auto`), `allowed` (the route's `auto_jxl`, libjxl
    /// loaded) and listed in Accept: imgproxy's `AUTO_JXL`, which it prefers to AVIF and WebP.
    pub fn or_jxl(self, req: &HeaderMap, allowed: bool) -> Target {
        match self {
            Target::Auto(_) if allowed && accepts(req, ImageFormat::Jxl) => {
                Target::Auto(Some(ImageFormat::Jxl))
            }
            t => t,
        }
    }

    /// imgproxy's rule for an `animated` source (one whose frames GIF or WebP output keeps,
    /// [`super::animation::animates`]): a negotiated format that cannot animate (AVIF; JPEG
    /// XL is never negotiated for one, [`Target::or_jxl`]) gives way to WebP where Accept
    /// lists it, else to what a client listing neither gets; there an animated WebP becomes
    /// GIF (imgproxy's first preferred format that animates: its preferred formats are JPEG,
    /// PNG and GIF), a GIF stays GIF and an APNG gives its default image as PNG (imgproxy
    /// reads no APNG frames). A format asked for (`@avif`, `f:avif`) is kept: AVIF of the
    /// first frame, as imgproxy's.
    pub fn for_animation(self, req: &HeaderMap, source: ImageFormat, animated: bool) -> Target {
        match self {
            Target::Auto(_) if animated => {
                if accepts(req, ImageFormat::Webp) {
                    Target::Auto(Some(ImageFormat::Webp))
                } else if source == ImageFormat::Webp {
                    Target::Auto(Some(ImageFormat::Gif))
                } else {
                    Target::Auto(None)
                }
            }
            t => t,
        }
    }

    /// The format produced from a `source` image.
    pub fn output(self, source: ImageFormat) -> ImageFormat {
        match self {
            // No HEIC encoder: its sources become JPEG, as in imgproxy (whose preferred
            // formats are JPEG, PNG and GIF).
            Target::Keep if source == ImageFormat::Heic => ImageFormat::Jpeg,
            Target::Keep => source,
            Target::Fixed(f) | Target::Auto(Some(f)) => f,
            // The client did not list the source's modern format: send JPEG.
            Target::Auto(None)
                if matches!(
                    source,
                    ImageFormat::Avif | ImageFormat::Webp | ImageFormat::Jxl | ImageFormat::Heic
                ) =>
            {
                ImageFormat::Jpeg
            }
            Target::Auto(None) => source,
        }
    }

    /// The target's part of a cache key.
    pub fn key(self) -> &'static str {
        match self {
            Target::Keep => "none",
            Target::Fixed(f) => f.name(),
            Target::Auto(Some(ImageFormat::Avif)) => "auto-avif",
            Target::Auto(Some(ImageFormat::Webp)) => "auto-webp",
            Target::Auto(Some(ImageFormat::Jxl)) => "auto-jxl",
            Target::Auto(_) => "auto",
        }
    }
}

/// A transform with every choice made: what the worker does and what keys the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub w: Option<u32>,
    pub h: Option<u32>,
    pub mode: Mode,
    pub x: Option<u32>,
    pub y: Option<u32>,
    pub r: u32,
    pub gray: bool,
    pub quality: u8,
    /// `q` was given (re-encoding is asked even without other changes).
    pub quality_given: bool,
    pub target: Target,
    /// The resolved output format (set by [`Resolved::for_source`]).
    pub format: ImageFormat,
    /// Keep the source's ICC profile (pixels untouched, the output carries it) instead of
    /// converting to sRGB; only where the output format carries one (JPEG, PNG, WebP).
    pub keep_icc: bool,
    /// What transparent pixels are flattened onto where the output has no alpha (JPEG).
    pub bg: [u8; 3],
    /// Place a cover crop on the content (`super::smart`) rather than at the centre.
    pub smart: bool,
}

impl Resolved {
    /// Makes every choice that depends on the request only: defaults, the Accept negotiation.
    pub fn new(
        p: &Params,
        default_format: FormatChoice,
        default_quality: u8,
        req: &HeaderMap,
    ) -> Resolved {
        let target = Target::choose(p.f.unwrap_or(default_format), req);
        Resolved {
            w: p.w,
            h: p.h,
            mode: p.p.unwrap_or(Mode::Cover),
            x: p.x,
            y: p.y,
            r: p.r.unwrap_or(0),
            gray: p.g.unwrap_or(false),
            quality: p.q.unwrap_or(default_quality),
            quality_given: p.q.is_some(),
            target,
            format: ImageFormat::Jpeg,
            keep_icc: false,
            bg: [255; 3],
            smart: false,
        }
    }

    /// Resolves the output format for a `source` image.
    pub fn for_source(mut self, source: ImageFormat) -> Resolved {
        self.format = self.target.output(source);
        self
    }

    /// A cover crop placed by content ([`Resolved::smart`] applies to cover crops only: the
    /// other modes keep the whole source or place the crop where asked).
    pub fn smart_cover(&self) -> bool {
        self.smart && self.mode == Mode::Cover
    }

    /// Whether the response depends on Accept (`Vary: Accept`).
    pub fn negotiated(&self) -> bool {
        matches!(self.target, Target::Auto(_))
    }

    /// Nothing to do for a `source` image: serve the stored original.
    pub fn is_original(&self, source: ImageFormat) -> bool {
        let changes = self.w.is_some()
            || self.h.is_some()
            || self.r != 0
            || self.gray
            || self.quality_given
            || (self.mode == Mode::Crop && (self.x.is_some() || self.y.is_some()));
        !changes && self.target.output(source) == source
    }

    /// The normalized parameters: same transform, same string, whatever the order given.
    pub fn key(&self) -> String {
        let mut s = String::with_capacity(64);
        let opt = |v: Option<u32>| v.map_or("-".to_string(), |n| n.to_string());
        let _ = write!(
            s,
            "w={}&h={}&p={}&x={}&y={}&r={}&g={}&q={}{}&f={}",
            opt(self.w),
            opt(self.h),
            self.mode.num(),
            opt(self.x),
            opt(self.y),
            self.r,
            u8::from(self.gray),
            self.quality,
            if self.quality_given { "!" } else { "" },
            self.target.key()
        );
        // Only when not the default, so that zimg's keys stay as they were.
        if self.keep_icc {
            s.push_str("&icc=keep");
        }
        if self.smart {
            s.push_str("&smart=1");
        }
        if self.bg != [255; 3] {
            let _ = write!(
                s,
                "&bg={:02x}{:02x}{:02x}",
                self.bg[0], self.bg[1], self.bg[2]
            );
        }
        s
    }
}

/// AVIF if Accept lists image/avif, else WebP if it lists image/webp.
pub fn negotiate(req: &HeaderMap) -> Option<ImageFormat> {
    Accepted::of(req, false).first()
}

/// What decides a negotiated format for `req` ([`Accepted::of`]): the route's index of cached
/// results keys requests by it ([`super::hits`]).
pub fn negotiated(req: &HeaderMap, jxl: bool) -> Accepted {
    Accepted::of(req, jxl)
}

/// The formats larder negotiates that a request's Accept lists (`q=0` is a refusal): all that
/// a negotiated output depends on besides the source (an animated source skips the formats
/// that cannot animate, [`Target::for_animation`], so whether WebP is listed matters even
/// where AVIF is).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Accepted(u8);

impl Accepted {
    const JXL: u8 = 1;
    const AVIF: u8 = 2;
    const WEBP: u8 = 4;

    /// The formats `req`'s Accept lists, read in one pass; JPEG XL only with `jxl` (the
    /// route's `auto_jxl`).
    pub fn of(req: &HeaderMap, jxl: bool) -> Accepted {
        let mut bits = 0;
        for item in req
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|s| s.split(','))
        {
            let mut parts = item.split(';');
            let m = parts.next().unwrap_or("").trim();
            let bit = if m.eq_ignore_ascii_case("image/avif") {
                Accepted::AVIF
            } else if m.eq_ignore_ascii_case("image/webp") {
                Accepted::WEBP
            } else if jxl && m.eq_ignore_ascii_case("image/jxl") {
                Accepted::JXL
            } else {
                continue;
            };
            // `q` in either case (RFC 9110's ABNF strings are case-insensitive: `Q=0` refuses
            // too); a weight that is no number (`q=NaN`, `q=x`) is no refusal.
            let refused = parts.any(|p| {
                let p = p.trim();
                p.get(..2)
                    .is_some_and(|n| n.eq_ignore_ascii_case("q="))
                    .then(|| p[2..].trim().parse::<f32>().ok())
                    .flatten()
                    .is_some_and(|q| q <= 0.0)
            });
            if !refused {
                bits |= bit;
            }
        }
        Accepted(bits)
    }

    /// Listed (JPEG XL only if it was looked for).
    pub fn has(self, format: ImageFormat) -> bool {
        let bit = match format {
            ImageFormat::Jxl => Accepted::JXL,
            ImageFormat::Avif => Accepted::AVIF,
            ImageFormat::Webp => Accepted::WEBP,
            _ => 0,
        };
        self.0 & bit != 0
    }

    /// The format negotiated: JPEG XL (if looked for), then AVIF, then WebP.
    pub fn first(self) -> Option<ImageFormat> {
        [ImageFormat::Jxl, ImageFormat::Avif, ImageFormat::Webp]
            .into_iter()
            .find(|f| self.has(*f))
    }
}

/// Whether the request's Accept lists `format`, one of those [`Accepted`] reads.
fn accepts(req: &HeaderMap, format: ImageFormat) -> bool {
    Accepted::of(req, true).has(format)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn order_does_not_matter() {
        let h = HeaderMap::new();
        let a = Params::parse("w=100&h=50&g=1").unwrap();
        let b = Params::parse("g=1&h=50&w=100&zz=9").unwrap();
        let ra = Resolved::new(&a, FormatChoice::Keep, 75, &h);
        let rb = Resolved::new(&b, FormatChoice::Keep, 75, &h);
        assert_eq!(ra.key(), rb.key());
    }

    /// A weight of 0 refuses a format however it is written (`Q=0`, `q=0.000`, spaces); a
    /// weight that is no number refuses nothing. Before, `Q=0` was read as listing it.
    #[test]
    fn a_zero_weight_refuses_in_either_case() {
        let of = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::ACCEPT, HeaderValue::from_static(v));
            negotiated(&h, true)
        };
        for v in [
            "image/webp;Q=0",
            "image/webp; q=0.000",
            "image/webp ;Q=0.;level=1",
            "image/avif;q=-1",
        ] {
            assert_eq!(of(v).first(), None, "{v}");
        }
        for v in ["image/webp;q=0.001", "image/webp;Q=1", "image/webp;q=NaN"] {
            assert_eq!(of(v).first(), Some(ImageFormat::Webp), "{v}");
        }
    }

    #[test]
    fn auto_negotiates() {
        let mut h = HeaderMap::new();
        let p = Params::parse("f=auto&w=10").unwrap();
        let r = |h: &HeaderMap| {
            Resolved::new(&p, FormatChoice::Keep, 75, h).for_source(ImageFormat::Jpeg)
        };
        assert_eq!(r(&h).format, ImageFormat::Jpeg);
        h.insert(header::ACCEPT, HeaderValue::from_static("image/webp,*/*"));
        assert_eq!(r(&h).format, ImageFormat::Webp);
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("image/avif;q=0, image/webp"),
        );
        assert_eq!(r(&h).format, ImageFormat::Webp);
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("image/avif,image/webp"),
        );
        assert_eq!(r(&h).format, ImageFormat::Avif);
        assert!(r(&h).negotiated());
    }

    /// imgproxy's AUTO_AVIF skips animations: WebP where listed, else GIF for an animated
    /// WebP (the source's format for the others); a fixed format and still sources untouched.
    #[test]
    fn negotiated_avif_of_an_animation() {
        let h = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::ACCEPT, HeaderValue::from_static(v));
            h
        };
        let both = h("image/avif,image/webp");
        let avif = h("image/avif");
        let auto = |h: &HeaderMap| Target::choose(FormatChoice::Auto, h);
        let webp = Target::Auto(Some(ImageFormat::Webp));
        assert_eq!(
            auto(&both).for_animation(&both, ImageFormat::Gif, true),
            webp
        );
        assert_eq!(
            auto(&both).for_animation(&both, ImageFormat::Webp, true),
            webp
        );
        let gif = |t: Target, s| t.output(s) == ImageFormat::Gif;
        assert!(gif(
            auto(&avif).for_animation(&avif, ImageFormat::Gif, true),
            ImageFormat::Gif
        ));
        assert!(gif(
            auto(&avif).for_animation(&avif, ImageFormat::Webp, true),
            ImageFormat::Webp
        ));
        let none = h("*/*");
        assert!(gif(
            auto(&none).for_animation(&none, ImageFormat::Webp, true),
            ImageFormat::Webp
        ));
        let png = auto(&avif).for_animation(&avif, ImageFormat::Png, true);
        assert_eq!(png.output(ImageFormat::Png), ImageFormat::Png);
        assert!(png.key() != auto(&avif).key() && png.key() != webp.key());
        // Still sources, and formats asked for, are untouched.
        assert_eq!(
            auto(&both).for_animation(&both, ImageFormat::Gif, false),
            auto(&both)
        );
        let fixed = Target::Fixed(ImageFormat::Avif);
        assert_eq!(fixed.for_animation(&both, ImageFormat::Gif, true), fixed);
        // The Accept the index keys by tells the two apart.
        assert_ne!(negotiated(&both, false), negotiated(&avif, false));
        assert_eq!(negotiated(&both, false).first(), Some(ImageFormat::Avif));
        assert_eq!(negotiated(&h("image/jxl"), false).first(), None);
        assert_eq!(
            negotiated(&h("image/jxl"), true).first(),
            Some(ImageFormat::Jxl)
        );
    }

    /// imgproxy's AUTO_JXL: JPEG XL before AVIF and WebP, only where the route allows it and
    /// only for `auto`; its own cache key.
    #[test]
    fn jxl_is_negotiated_only_where_allowed() {
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("image/jxl,image/avif,image/webp"),
        );
        let auto = Target::choose(FormatChoice::Auto, &h);
        assert_eq!(auto, Target::Auto(Some(ImageFormat::Avif)));
        let jxl = auto.or_jxl(&h, true);
        assert_eq!(jxl, Target::Auto(Some(ImageFormat::Jxl)));
        assert_eq!(jxl.output(ImageFormat::Png), ImageFormat::Jxl);
        assert_eq!(jxl.key(), "auto-jxl");
        assert_ne!(jxl.key(), Target::Auto(None).key());
        assert_eq!(auto.or_jxl(&h, false), auto, "the route does not allow it");
        let fixed = Target::choose(FormatChoice::Webp, &h);
        assert_eq!(fixed.or_jxl(&h, true), fixed, "only `auto` negotiates");
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("image/jxl;q=0,image/webp"),
        );
        let refused = Target::choose(FormatChoice::Auto, &h).or_jxl(&h, true);
        assert_eq!(refused, Target::Auto(Some(ImageFormat::Webp)));
    }
}
