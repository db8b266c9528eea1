//! The parameters of an image transform, as zimg's URLs write them (`w=100&h=100&p=1&f=webp`):
//! the grammar, with an error naming the parameter, and the parsed values. Plain data in
//! config because presets (`[listener.route.images.presets]`) are written in it and checked at
//! load; the image server parses each request's query with the same grammar
//! (`crate::images::params` resolves the values into a transform).

use percent_encoding::percent_decode_str;
use serde::de::{self, Deserializer};
use serde::Deserialize;

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
    /// zimg's number for the mode.
    pub fn num(self) -> u8 {
        match self {
            Mode::Stretch => 0,
            Mode::Cover => 1,
            Mode::Crop => 2,
            Mode::Percent => 3,
            Mode::Fit => 4,
        }
    }
}

/// The requested output format (`f`), or a route's default (`default_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatChoice {
    /// `none`: the source's format.
    Keep,
    /// `auto`: AVIF or WebP when Accept lists them, else the source's format.
    Auto,
    Jpeg,
    Png,
    Webp,
    Avif,
    Gif,
    /// JPEG XL (output through libjxl, loaded at run time).
    Jxl,
}

impl FormatChoice {
    pub fn parse(s: &str) -> Option<FormatChoice> {
        Some(match s.to_ascii_lowercase().as_str() {
            "none" => FormatChoice::Keep,
            "auto" => FormatChoice::Auto,
            "jpeg" | "jpg" => FormatChoice::Jpeg,
            "png" => FormatChoice::Png,
            "webp" => FormatChoice::Webp,
            "avif" => FormatChoice::Avif,
            "gif" => FormatChoice::Gif,
            "jxl" => FormatChoice::Jxl,
            _ => return None,
        })
    }
}

impl<'de> Deserialize<'de> for FormatChoice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        FormatChoice::parse(&s).ok_or_else(|| {
            de::Error::custom(format!(
                "unknown format `{s}` (use none, auto, jpeg, png, webp, avif, gif or jxl)"
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
                                "unknown format `{v}` (none, auto, jpeg, png, webp, avif, gif, jxl)"
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
