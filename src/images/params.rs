//! URL parameters of a transform (zimg's API plus `f=auto`): parsing with a 400 naming the
//! parameter, presets (`t=NAME`), and the normalized form that keys the cache.

use std::fmt::Write as _;

use http::header::{self, HeaderMap};
use percent_encoding::percent_decode_str;
use serde::de::{self, Deserializer};
use serde::Deserialize;

use super::sniff::ImageFormat;

/// A parameter that failed validation: answered 400 with its name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("parameter `{name}`: {reason}")]
pub struct ParamError {
    pub name: &'static str,
    pub reason: String,
}

fn bad(name: &'static str, reason: impl Into<String>) -> ParamError {
    ParamError {
        name,
        reason: reason.into(),
    }
}

/// zimg's `p`: how `w` and `h` apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// 0: exactly `w`×`h`, aspect ratio ignored.
    Stretch,
    /// 1 (default): scale to cover `w`×`h`, then crop the middle (one side given: proportional).
    Cover,
    /// 2: cut a `w`×`h` region at `x`,`y` (centered when absent), no scaling.
    Crop,
    /// 3: `w` and `h` are percentages of the source's size.
    Percent,
    /// 4: scale to fit inside `w`×`h`, aspect ratio kept.
    Fit,
}

impl Mode {
    fn from_num(n: u32) -> Option<Mode> {
        Some(match n {
            0 => Mode::Stretch,
            1 => Mode::Cover,
            2 => Mode::Crop,
            3 => Mode::Percent,
            4 => Mode::Fit,
            _ => return None,
        })
    }
    fn num(self) -> u8 {
        match self {
            Mode::Stretch => 0,
            Mode::Cover => 1,
            Mode::Crop => 2,
            Mode::Percent => 3,
            Mode::Fit => 4,
        }
    }
}

/// The requested output format (`f`), or a route's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatChoice {
    /// `none`: the source's format.
    Keep,
    /// `auto`: AVIF or WebP when Accept lists them, else the source's format.
    Auto,
    Fixed(ImageFormat),
}

impl FormatChoice {
    fn parse(s: &str) -> Option<FormatChoice> {
        Some(match s.to_ascii_lowercase().as_str() {
            "none" => FormatChoice::Keep,
            "auto" => FormatChoice::Auto,
            "jpeg" | "jpg" => FormatChoice::Fixed(ImageFormat::Jpeg),
            "png" => FormatChoice::Fixed(ImageFormat::Png),
            "webp" => FormatChoice::Fixed(ImageFormat::Webp),
            "avif" => FormatChoice::Fixed(ImageFormat::Avif),
            "gif" => FormatChoice::Fixed(ImageFormat::Gif),
            _ => return None,
        })
    }
}

impl<'de> Deserialize<'de> for FormatChoice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        FormatChoice::parse(&s).ok_or_else(|| {
            de::Error::custom(format!(
                "unknown format `{s}` (use none, auto, jpeg, png, webp, avif or gif)"
            ))
        })
    }
}

/// Parameters as given (each optional, so a preset can be overridden field by field).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params {
    pub w: Option<u32>,
    pub h: Option<u32>,
    pub p: Option<Mode>,
    pub x: Option<u32>,
    pub y: Option<u32>,
    /// Clockwise degrees, normalized to 0..360.
    pub r: Option<u32>,
    pub g: Option<bool>,
    pub q: Option<u8>,
    pub f: Option<FormatChoice>,
    /// Preset name (`t`).
    pub t: Option<String>,
}

/// Largest value accepted for `w`, `h`, `x`, `y` before the route's own bounds apply.
const MAX_NUM: u32 = 1_000_000;

fn num(name: &'static str, v: &str, max: u32) -> Result<u32, ParamError> {
    let n: u32 = v
        .trim()
        .parse()
        .map_err(|_| bad(name, format!("`{v}` is not a non-negative integer")))?;
    if n > max {
        return Err(bad(name, format!("{n} is out of range (0 to {max})")));
    }
    Ok(n)
}

impl Params {
    /// Parses a query string; unknown parameters are ignored (as zimg does), so they never split
    /// the cache.
    pub fn parse(query: &str) -> Result<Params, ParamError> {
        let mut p = Params::default();
        for pair in query.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode_str(v).decode_utf8_lossy();
            let v = v.as_ref();
            match k {
                "w" => p.w = Some(num("w", v, MAX_NUM)?),
                "h" => p.h = Some(num("h", v, MAX_NUM)?),
                "x" => p.x = Some(num("x", v, MAX_NUM)?),
                "y" => p.y = Some(num("y", v, MAX_NUM)?),
                "p" => {
                    let n = num("p", v, 4).map_err(|_| bad("p", "must be 0, 1, 2, 3 or 4"))?;
                    p.p = Mode::from_num(n);
                }
                "r" => {
                    let n: i64 = v
                        .trim()
                        .parse()
                        .map_err(|_| bad("r", format!("`{v}` is not an integer")))?;
                    if !(-360..=360).contains(&n) {
                        return Err(bad("r", "must be -360 to 360 degrees"));
                    }
                    p.r = Some(n.rem_euclid(360) as u32);
                }
                "g" => {
                    p.g = Some(match v.trim() {
                        "0" => false,
                        "1" => true,
                        _ => return Err(bad("g", "must be 0 or 1")),
                    })
                }
                "q" => {
                    let n = num("q", v, 100)?;
                    if n == 0 {
                        return Err(bad("q", "must be 1 to 100"));
                    }
                    p.q = Some(n as u8);
                }
                "f" => {
                    p.f = Some(FormatChoice::parse(v.trim()).ok_or_else(|| {
                        bad(
                            "f",
                            format!(
                                "unknown format `{v}` (none, auto, jpeg, png, webp, avif, gif)"
                            ),
                        )
                    })?)
                }
                "t" => {
                    if v.is_empty() {
                        return Err(bad("t", "empty preset name"));
                    }
                    p.t = Some(v.to_string());
                }
                _ => {}
            }
        }
        Ok(p)
    }

    /// These parameters over `base` (a preset): every parameter given here wins.
    pub fn over(self, base: &Params) -> Params {
        Params {
            w: self.w.or(base.w),
            h: self.h.or(base.h),
            p: self.p.or(base.p),
            x: self.x.or(base.x),
            y: self.y.or(base.y),
            r: self.r.or(base.r),
            g: self.g.or(base.g),
            q: self.q.or(base.q),
            f: self.f.or(base.f),
            t: None,
        }
    }
}

/// A preset from the configuration: a query string validated at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preset(pub Params);

impl<'de> Deserialize<'de> for Preset {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let p = Params::parse(&s).map_err(de::Error::custom)?;
        if p.t.is_some() {
            return Err(de::Error::custom(
                "a preset cannot name another preset (`t`)",
            ));
        }
        Ok(Preset(p))
    }
}

/// The output format of a request, decided before the source is read (so the cache key needs
/// nothing but the request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The source's format.
    Keep,
    Fixed(ImageFormat),
    /// Negotiated from Accept: AVIF or WebP if listed, else (`None`) the source's format.
    Auto(Option<ImageFormat>),
}

impl Target {
    /// The format produced from a `source` image.
    pub fn output(self, source: ImageFormat) -> ImageFormat {
        match self {
            Target::Keep => source,
            Target::Fixed(f) | Target::Auto(Some(f)) => f,
            // The client did not list the source's modern format: send JPEG.
            Target::Auto(None) if matches!(source, ImageFormat::Avif | ImageFormat::Webp) => {
                ImageFormat::Jpeg
            }
            Target::Auto(None) => source,
        }
    }

    fn key(self) -> &'static str {
        match self {
            Target::Keep => "none",
            Target::Fixed(f) => f.name(),
            Target::Auto(Some(ImageFormat::Avif)) => "auto-avif",
            Target::Auto(Some(ImageFormat::Webp)) => "auto-webp",
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
}

impl Resolved {
    /// Makes every choice that depends on the request only: defaults, the Accept negotiation.
    pub fn new(
        p: &Params,
        default_format: FormatChoice,
        default_quality: u8,
        req: &HeaderMap,
    ) -> Resolved {
        let target = match p.f.unwrap_or(default_format) {
            FormatChoice::Keep => Target::Keep,
            FormatChoice::Fixed(f) => Target::Fixed(f),
            FormatChoice::Auto => Target::Auto(negotiate(req)),
        };
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
        }
    }

    /// Resolves the output format for a `source` image.
    pub fn for_source(mut self, source: ImageFormat) -> Resolved {
        self.format = self.target.output(source);
        self
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
        s
    }
}

/// AVIF if Accept lists image/avif, else WebP if it lists image/webp (`q=0` is a refusal).
fn negotiate(req: &HeaderMap) -> Option<ImageFormat> {
    let accepts = |mime: &str| {
        req.get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|s| s.split(','))
            .any(|item| {
                let mut parts = item.split(';');
                let m = parts.next().unwrap_or("").trim();
                let refused = parts.any(|p| {
                    let p = p.trim();
                    p.strip_prefix("q=")
                        .and_then(|q| q.trim().parse::<f32>().ok())
                        .is_some_and(|q| q <= 0.0)
                });
                m.eq_ignore_ascii_case(mime) && !refused
            })
    };
    if accepts("image/avif") {
        Some(ImageFormat::Avif)
    } else if accepts("image/webp") {
        Some(ImageFormat::Webp)
    } else {
        None
    }
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

    #[test]
    fn errors_name_the_parameter() {
        assert_eq!(Params::parse("w=-1").unwrap_err().name, "w");
        assert_eq!(Params::parse("p=7").unwrap_err().name, "p");
        assert_eq!(Params::parse("f=bmp").unwrap_err().name, "f");
        assert_eq!(Params::parse("q=0").unwrap_err().name, "q");
        assert_eq!(Params::parse("g=2").unwrap_err().name, "g");
        assert_eq!(Params::parse("r=400").unwrap_err().name, "r");
        assert_eq!(Params::parse("r=-90").unwrap().r, Some(270));
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
}
