//! thumbor's URL grammar: `/unsafe/` or an HMAC-SHA1 signature, `trim`, manual crop
//! `AxB:CxD`, `fit-in`, `-WxH` (flips), `halign`/`valign`, `smart`, `filters:...`, the image
//! path; parsed into the processing options the pipeline runs.
//!
//! ```text
//! HASH|unsafe / [trim[:top-left|bottom-right][:TOL]/] [AxB:CxD/]
//!   [(adaptive-)(full-)fit-in/] [-][W|orig]x[-][H|orig]/ [left|center|right/]
//!   [top|middle|bottom/] [smart/] [filters:NAME(ARGS):NAME(ARGS)/] IMAGE
//! ```
//!
//! Parts are read in that order, each only when followed by `/`; the first segment that is not
//! the next expected part starts the image, as thumbor's URL regex reads it. The signature is
//! thumbor's: URL-safe base64 (padded, 28 characters) of the HMAC-SHA1 of everything after
//! `HASH/`, with the key (`images.thumbor.key`), checked before anything else is parsed.
//! Unknown filters are ignored (as thumbor does); a known filter with bad arguments is a 400
//! naming it. docs/images.md lists what differs from thumbor.

use aws_lc_rs::hmac;
use base64::Engine;
use percent_encoding::percent_decode_str;

use crate::config::image_options::{
    Compass, Crop, Gravity, GravityType, Options, ResizeType, Trim, Watermark, WatermarkPosition,
};
use crate::config::image_params::FormatChoice;
use crate::config::ThumborConfig;

use super::grammar::{Grammar, GrammarError, Parsed, SourceRef};

/// Largest blur sigma taken (thumbor bounds its blur radius at 150).
const MAX_BLUR: f32 = 150.0;

/// Whether `path` is written in thumbor's grammar: its first segment is `unsafe` or a thumbor
/// signature (28 characters of URL-safe base64 ending in `=`, which imgproxy's never do).
pub fn claims(path: &str) -> bool {
    let path = path.strip_prefix('/').unwrap_or(path);
    let Some((first, _)) = path.split_once('/') else {
        return false;
    };
    if first == "unsafe" {
        return true;
    }
    let body = first
        .strip_suffix('=')
        .or_else(|| first.strip_suffix("%3D"))
        .or_else(|| first.strip_suffix("%3d"));
    body.is_some_and(|b| {
        b.len() == 27
            && b.bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
    })
}

/// Parses `path` (the request's path as sent, percent-encoding kept, after the route's prefix,
/// without the leading `/`; a query is not part of it), checking its signature with `cfg.key`
/// when one is set: with a key, `unsafe` and wrong signatures are refused; without one, signed
/// URLs are (there is nothing to check them with).
pub fn parse(path: &str, cfg: &ThumborConfig) -> Result<Parsed, GrammarError> {
    let path = path.strip_prefix('/').unwrap_or(path);
    let path = path.split(['?', '#']).next().unwrap_or("");
    let Some((first, rest)) = path.split_once('/') else {
        return Err(GrammarError::Bad(
            "no original image was specified in the URL".into(),
        ));
    };
    check_signature(first, rest, cfg)?;
    let options = parse_options(rest)?;
    Ok(Parsed {
        grammar: Grammar::Thumbor,
        options: options.0,
        source: options.1,
    })
}

fn check_signature(first: &str, rest: &str, cfg: &ThumborConfig) -> Result<(), GrammarError> {
    let key = cfg.key.as_deref().filter(|k| !k.is_empty());
    match (first, key) {
        ("unsafe", None) => Ok(()),
        ("unsafe", Some(_)) => Err(GrammarError::Signature(
            "unsigned (unsafe) URL where a thumbor key is configured",
        )),
        (_, None) => Err(GrammarError::Signature(
            "signed URL where no thumbor key is configured",
        )),
        (hash, Some(key)) => {
            let hash = percent_decode_str(hash).decode_utf8_lossy();
            let tag = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(hash.trim_end_matches('='))
                .map_err(|_| GrammarError::Signature("malformed thumbor signature"))?;
            // HMAC-SHA1 of everything after `HASH/`, compared in constant time.
            let key = hmac::Key::new(hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, key.as_bytes());
            hmac::verify(&key, rest.as_bytes(), &tag)
                .map_err(|_| GrammarError::Signature("wrong thumbor signature"))
        }
    }
}

/// One side of `WxH`: absent or 0 (proportional), pixels, or the original's (`orig`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Side {
    Auto,
    Px(u32),
    Orig,
}

/// What the path parts say, before they become [`Options`].
#[derive(Debug, Default)]
struct Parts {
    trim: Option<f64>,
    /// Manual crop: left, top, right, bottom.
    crop: Option<(u32, u32, u32, u32)>,
    fit_in: bool,
    full: bool,
    size: Option<(bool, Side, bool, Side)>,
    halign: Option<&'static str>,
    valign: Option<&'static str>,
    smart: bool,
}

fn parse_options(rest: &str) -> Result<(Options, SourceRef), GrammarError> {
    let mut parts = Parts::default();
    let mut rest = rest;
    // Each part is taken only when it is the whole segment before a `/`, in thumbor's order.
    let mut stage = 0;
    let mut filters = None;
    while let Some((seg, after)) = rest.split_once('/') {
        if after.is_empty() {
            // Nothing would be left for the image: this segment is the image (thumbor's regex
            // backs off).
            break;
        }
        if seg.starts_with("filters:") {
            // The filters run to the first `)/` (a filter's arguments may hold `/`).
            match rest.find(")/") {
                Some(end) if end > "filters:".len() => {
                    filters = Some(&rest["filters:".len()..=end]);
                    rest = &rest[end + 2..];
                }
                _ => {}
            }
            break;
        }
        let next = match seg {
            "debug" if stage == 0 => 1,
            "meta" if stage <= 1 => {
                return Err(GrammarError::Bad(
                    "thumbor's meta endpoint is not supported".into(),
                ))
            }
            _ if stage <= 2 && trim_part(seg).is_some() => {
                parts.trim = trim_part(seg);
                3
            }
            _ if stage <= 3 && crop_part(seg).is_some() => {
                parts.crop = crop_part(seg);
                4
            }
            "fit-in" | "adaptive-fit-in" | "full-fit-in" | "adaptive-full-fit-in" if stage <= 4 => {
                parts.fit_in = true;
                parts.full = seg.contains("full-");
                5
            }
            _ if stage <= 5 && size_part(seg).is_some() => {
                parts.size = size_part(seg);
                6
            }
            "left" | "center" | "right" if stage <= 6 => {
                parts.halign = Some(static_name(seg));
                7
            }
            "top" | "middle" | "bottom" if stage <= 7 => {
                parts.valign = Some(static_name(seg));
                8
            }
            "smart" if stage <= 8 => {
                parts.smart = true;
                9
            }
            _ => break,
        };
        stage = next;
        rest = after;
    }
    let source = image(rest)?;
    let mut o = options_of(&parts);
    if let Some(f) = filters {
        let f = percent_decode_str(f).decode_utf8_lossy();
        apply_filters(&mut o, &f, parts.fit_in)?;
    }
    Ok((o, source))
}

fn static_name(s: &str) -> &'static str {
    match s {
        "left" => "left",
        "right" => "right",
        "top" => "top",
        "bottom" => "bottom",
        "middle" => "middle",
        _ => "center",
    }
}

fn digits(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `trim`, `trim:top-left`, `trim:bottom-right`, each with an optional `:TOLERANCE`.
fn trim_part(seg: &str) -> Option<f64> {
    let rest = seg.strip_prefix("trim")?;
    let rest = rest
        .strip_prefix(":top-left")
        .or_else(|| rest.strip_prefix(":bottom-right"))
        .unwrap_or(rest);
    match rest {
        "" => Some(0.0),
        _ => digits(rest.strip_prefix(':')?).map(f64::from),
    }
}

/// `AxB:CxD`: left, top, right, bottom.
fn crop_part(seg: &str) -> Option<(u32, u32, u32, u32)> {
    let (a, b) = seg.split_once(':')?;
    let (l, t) = a.split_once('x')?;
    let (r, bo) = b.split_once('x')?;
    Some((digits(l)?, digits(t)?, digits(r)?, digits(bo)?))
}

/// `[-][W|orig]x[-][H|orig]`: (flip horizontally, width, flip vertically, height).
fn size_part(seg: &str) -> Option<(bool, Side, bool, Side)> {
    let (w, h) = seg.split_once('x')?;
    let side = |s: &str| -> Option<(bool, Side)> {
        let (flip, s) = match s.strip_prefix('-') {
            Some(s) => (true, s),
            None => (false, s),
        };
        let side = match s {
            "" => Side::Auto,
            "orig" => Side::Orig,
            _ => match digits(s)? {
                0 => Side::Auto,
                n => Side::Px(n),
            },
        };
        Some((flip, side))
    };
    let (fw, w) = side(w)?;
    let (fh, h) = side(h)?;
    Some((fw, w, fh, h))
}

/// The image part: percent-decoded; `http(s)://` URLs (also with the `//` collapsed by a
/// proxy) are absolute, the rest relative to the route's origin or root.
fn image(raw: &str) -> Result<SourceRef, GrammarError> {
    let decoded = percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| GrammarError::Bad("the image path is not UTF-8".into()))?;
    if decoded.is_empty() {
        return Err(GrammarError::Bad(
            "no original image was specified in the URL".into(),
        ));
    }
    for scheme in ["http:", "https:"] {
        if let Some(after) = decoded.strip_prefix(scheme) {
            let host_path = after.trim_start_matches('/');
            if host_path.is_empty() {
                return Err(GrammarError::Bad(format!("bad image URL `{decoded}`")));
            }
            return Ok(SourceRef::Absolute(format!("{scheme}//{host_path}")));
        }
    }
    Ok(SourceRef::Relative(decoded.into_owned()))
}

fn options_of(p: &Parts) -> Options {
    let mut o = Options::default();
    let kind = match (p.halign.unwrap_or("center"), p.valign.unwrap_or("middle")) {
        _ if p.smart => GravityType::Smart,
        ("left", "top") => GravityType::Compass(Compass::NorthWest),
        ("left", "bottom") => GravityType::Compass(Compass::SouthWest),
        ("left", _) => GravityType::Compass(Compass::West),
        ("right", "top") => GravityType::Compass(Compass::NorthEast),
        ("right", "bottom") => GravityType::Compass(Compass::SouthEast),
        ("right", _) => GravityType::Compass(Compass::East),
        (_, "top") => GravityType::Compass(Compass::North),
        (_, "bottom") => GravityType::Compass(Compass::South),
        _ => GravityType::Compass(Compass::Center),
    };
    o.gravity = Gravity {
        kind,
        ..Gravity::default()
    };
    if let Some(threshold) = p.trim {
        o.trim = Some(Trim {
            threshold,
            ..Trim::default()
        });
    }
    // The manual crop, in source pixels: an absolute region, as the top-left anchored crop with
    // offsets. thumbor ignores an empty one.
    let region = p
        .crop
        .filter(|&(l, t, r, b)| r > l && b > t)
        .map(|(l, t, r, b)| (l, t, r - l, b - t));
    if let Some((l, t, w, h)) = region {
        o.crop = Some(Crop {
            width: f64::from(w),
            height: f64::from(h),
            gravity: Some(Gravity {
                kind: GravityType::Compass(Compass::NorthWest),
                x: f64::from(l),
                y: f64::from(t),
            }),
        });
    }
    let (flip_h, mut w, flip_v, mut h) = p.size.unwrap_or((false, Side::Auto, false, Side::Auto));
    o.flip = (flip_h, flip_v);
    // `orig` after a manual crop is the region's side.
    if let Some((_, _, rw, rh)) = region {
        if w == Side::Orig {
            w = Side::Px(rw);
        }
        if h == Side::Orig {
            h = Side::Px(rh);
        }
    }
    let px = |s: Side| match s {
        Side::Px(n) => n,
        _ => 0,
    };
    if p.fit_in {
        // Fit inside W×H, never enlarged (thumbor's fit-in); `orig` reads as proportional,
        // which is the same without enlargement.
        o.resize = ResizeType::Fit;
        o.width = px(w);
        o.height = px(h);
        if p.full {
            // full-fit-in: the smaller ratio, so the result covers W×H (imgproxy's min sizes).
            o.min_width = o.width;
            o.min_height = o.height;
        }
    } else {
        // thumbor's default: crop to W×H's aspect ratio, then resize (enlarging too).
        o.resize = ResizeType::Fill;
        o.enlarge = true;
        match (w, h) {
            // W×orig (no manual crop): the original's height kept, W columns cut out by the
            // gravity, no scaling.
            (Side::Px(n), Side::Orig) => {
                o.crop = Some(Crop {
                    width: f64::from(n),
                    height: 0.0,
                    gravity: None,
                })
            }
            (Side::Orig, Side::Px(n)) => {
                o.crop = Some(Crop {
                    width: 0.0,
                    height: f64::from(n),
                    gravity: None,
                })
            }
            _ => {
                o.width = px(w);
                o.height = px(h);
            }
        }
    }
    o
}

fn bad_filter(name: &str, reason: impl std::fmt::Display) -> GrammarError {
    GrammarError::Bad(format!("thumbor filter `{name}`: {reason}"))
}

/// A filter's arguments: split at commas outside single quotes, trimmed, quotes removed.
fn filter_args(s: &str) -> Vec<String> {
    if s.trim().is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in s.chars() {
        match c {
            '\'' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur).trim().to_string()),
            _ => cur.push(c),
        }
    }
    out.push(cur.trim().to_string());
    out
}

/// Applies `NAME(ARGS):NAME(ARGS)` in order (a later filter of a kind wins).
fn apply_filters(o: &mut Options, filters: &str, fit_in: bool) -> Result<(), GrammarError> {
    let pieces: Vec<&str> = filters.split("):").collect();
    let last = pieces.len() - 1;
    for (i, piece) in pieces.iter().enumerate() {
        let Some((name, args)) = piece.split_once('(') else {
            continue;
        };
        let args = if i == last {
            match args.strip_suffix(')') {
                Some(a) => a,
                None => continue,
            }
        } else {
            args
        };
        apply_filter(o, name, &filter_args(args), fit_in)?;
    }
    Ok(())
}

fn arity(name: &str, args: &[String], min: usize, max: usize) -> Result<(), GrammarError> {
    if args.len() < min || args.len() > max {
        let want = match (min, max) {
            (0, 0) => "no arguments".to_string(),
            (a, b) if a == b => format!("{a} argument(s)"),
            (a, b) => format!("{a} to {b} arguments"),
        };
        return Err(bad_filter(
            name,
            format!("takes {want}, got {}", args.len()),
        ));
    }
    Ok(())
}

fn number<T: std::str::FromStr>(name: &str, arg: &str) -> Result<T, GrammarError> {
    arg.parse()
        .map_err(|_| bad_filter(name, format!("`{arg}` is not a valid number")))
}

fn apply_filter(
    o: &mut Options,
    name: &str,
    args: &[String],
    fit_in: bool,
) -> Result<(), GrammarError> {
    match name {
        "quality" => {
            arity(name, args, 1, 1)?;
            let q: u32 = number(name, &args[0])?;
            o.quality = q.clamp(1, 100) as u8;
        }
        "format" => {
            arity(name, args, 1, 1)?;
            o.format = match args[0].to_ascii_lowercase().as_str() {
                "jpeg" | "jpg" => Some(FormatChoice::Jpeg),
                "png" => Some(FormatChoice::Png),
                "gif" => Some(FormatChoice::Gif),
                "webp" => Some(FormatChoice::Webp),
                "avif" => Some(FormatChoice::Avif),
                // thumbor's, not made here: the route's default format.
                "heic" | "heif" => o.format,
                other => return Err(bad_filter(name, format!("unknown format `{other}`"))),
            };
        }
        "blur" => {
            arity(name, args, 1, 2)?;
            let radius: u32 = number(name, &args[0])?;
            if radius == 0 {
                return Err(bad_filter(name, "the radius must be at least 1"));
            }
            let sigma: f32 = match args.get(1) {
                Some(s) => number(name, s)?,
                None => 0.0,
            };
            let sigma = if sigma > 0.0 { sigma } else { radius as f32 };
            o.blur = sigma.min(MAX_BLUR);
        }
        "grayscale" => {
            arity(name, args, 0, 0)?;
            o.grayscale = true;
        }
        "fill" => {
            arity(name, args, 1, 2)?;
            o.background = match args[0].to_ascii_lowercase().as_str() {
                // Not computed here: the format's default background (white, or transparent).
                "transparent" | "auto" | "blur" => None,
                c => Some(color(name, c)?),
            };
            if fit_in {
                o.extend = Some(Gravity::default());
            }
        }
        "background_color" => {
            arity(name, args, 1, 1)?;
            o.background = Some(color(name, &args[0].to_ascii_lowercase())?);
        }
        "watermark" => {
            arity(name, args, 4, 6)?;
            o.watermark = Some(watermark(name, args)?);
        }
        "strip_icc" => {
            arity(name, args, 0, 0)?;
            o.strip_color_profile = Some(true);
        }
        "strip_exif" => {
            arity(name, args, 0, 0)?;
            // All of it: thumbor keeps no copyright either.
            o.strip_metadata = Some(true);
            o.keep_copyright = Some(false);
        }
        "max_bytes" => {
            arity(name, args, 1, 1)?;
            o.max_bytes = number(name, &args[0])?;
        }
        "no_upscale" => {
            arity(name, args, 0, 0)?;
            o.enlarge = false;
        }
        "upscale" => {
            arity(name, args, 0, 0)?;
            o.enlarge = true;
        }
        "stretch" => {
            arity(name, args, 0, 0)?;
            o.resize = ResizeType::Force;
        }
        "rotate" => {
            arity(name, args, 1, 1)?;
            let deg: i64 = number(name, &args[0])?;
            // thumbor rotates counter-clockwise, by right angles only (others are ignored).
            if deg % 90 == 0 {
                o.rotate = ((360 - deg.rem_euclid(360)) % 360) as u16;
            }
        }
        _ => {} // thumbor ignores filters it does not know
    }
    Ok(())
}

/// thumbor's colours: hex (3 or 6 digits, `#` optional) or a CSS name.
fn color(name: &str, c: &str) -> Result<[u8; 3], GrammarError> {
    let named = match c {
        "black" => Some(0x000000),
        "white" => Some(0xffffff),
        "red" => Some(0xff0000),
        "lime" => Some(0x00ff00),
        "green" => Some(0x008000),
        "blue" => Some(0x0000ff),
        "yellow" => Some(0xffff00),
        "cyan" | "aqua" => Some(0x00ffff),
        "magenta" | "fuchsia" => Some(0xff00ff),
        "gray" | "grey" => Some(0x808080),
        "silver" => Some(0xc0c0c0),
        "maroon" => Some(0x800000),
        "olive" => Some(0x808000),
        "purple" => Some(0x800080),
        "teal" => Some(0x008080),
        "navy" => Some(0x000080),
        "orange" => Some(0xffa500),
        _ => None,
    };
    let hex = c.strip_prefix('#').unwrap_or(c);
    let parsed = named.or_else(|| {
        if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        match hex.len() {
            6 => u32::from_str_radix(hex, 16).ok(),
            3 => u32::from_str_radix(hex, 16).ok().map(|v| {
                ((v >> 8) & 0xf) * 0x110000 + ((v >> 4) & 0xf) * 0x1100 + (v & 0xf) * 0x11
            }),
            _ => None,
        }
    });
    let v = parsed.ok_or_else(|| bad_filter(name, format!("unknown colour `{c}`")))?;
    Ok([(v >> 16) as u8, (v >> 8) as u8, v as u8])
}

/// One axis of thumbor's watermark position.
#[derive(Clone, Copy)]
enum Axis {
    /// From the left or top edge (false) or the right or bottom one (true), pixels or a
    /// fraction of the image.
    Edge(bool, f64),
    Center,
    Repeat,
}

fn axis(name: &str, s: &str) -> Result<Axis, GrammarError> {
    match s {
        "center" => return Ok(Axis::Center),
        "repeat" => return Ok(Axis::Repeat),
        _ => {}
    }
    let (far, s) = match s.strip_prefix('-') {
        Some(s) => (true, s),
        None => (false, s),
    };
    let offset = match s.strip_suffix('p') {
        // A percentage of the image's size: a fraction (< 1), as the watermark's offsets read.
        Some(p) => (f64::from(digits(p).ok_or_else(|| bad_position(name, s))?) / 100.0).min(0.999),
        None => f64::from(digits(s).ok_or_else(|| bad_position(name, s))?),
    };
    Ok(Axis::Edge(far, offset))
}

fn bad_position(name: &str, s: &str) -> GrammarError {
    bad_filter(
        name,
        format!("position `{s}` is not a number, a percentage (`20p`), `center` or `repeat`"),
    )
}

/// `watermark(URL, X, Y, ALPHA[, W_RATIO[, H_RATIO]])`: the route's configured watermark image
/// (the URL is not fetched), placed as thumbor places it.
fn watermark(name: &str, args: &[String]) -> Result<Watermark, GrammarError> {
    let x = axis(name, &args[1])?;
    let y = axis(name, &args[2])?;
    let alpha: u32 = number(name, &args[3])?;
    let ratio = |s: Option<&String>| -> Result<f64, GrammarError> {
        match s.map(String::as_str) {
            None | Some("none") => Ok(0.0),
            Some(v) => Ok(f64::from(number::<i32>(name, v)?.max(0)) / 100.0),
        }
    };
    let scale = ratio(args.get(4))?;
    ratio(args.get(5))?; // h_ratio: checked, not used (docs/images.md)
    use WatermarkPosition as P;
    let (position, ox, oy) = match (&x, &y) {
        (Axis::Repeat, _) | (_, Axis::Repeat) => (P::Replicate, 0.0, 0.0),
        _ => {
            let (h, ox) = match x {
                Axis::Edge(far, o) => (if far { 2 } else { 0 }, o),
                _ => (1, 0.0),
            };
            let (v, oy) = match y {
                Axis::Edge(far, o) => (if far { 2 } else { 0 }, o),
                _ => (1, 0.0),
            };
            let p = P::At(Compass::from_sides(h, v));
            (p, ox, oy)
        }
    };
    Ok(Watermark {
        opacity: 1.0 - f64::from(alpha.min(100)) / 100.0,
        position,
        x: ox,
        y: oy,
        scale,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unsafe_cfg() -> ThumborConfig {
        ThumborConfig::default()
    }

    fn keyed(key: &str) -> ThumborConfig {
        ThumborConfig {
            key: Some(key.to_string()),
        }
    }

    fn opts(path: &str) -> Options {
        parse(path, &unsafe_cfg()).unwrap().options
    }

    fn is_bad(path: &str) -> bool {
        matches!(parse(path, &unsafe_cfg()), Err(GrammarError::Bad(_)))
    }

    fn fill(w: u32, h: u32) -> Options {
        Options {
            resize: ResizeType::Fill,
            enlarge: true,
            width: w,
            height: h,
            ..Options::default()
        }
    }

    fn gravity(kind: GravityType) -> Gravity {
        Gravity {
            kind,
            ..Gravity::default()
        }
    }

    #[test]
    fn sizes_and_modes() {
        let p = parse("unsafe/100x100/smart/photo.jpg", &unsafe_cfg()).unwrap();
        assert_eq!(p.grammar, Grammar::Thumbor);
        assert_eq!(p.source, SourceRef::Relative("photo.jpg".into()));
        assert_eq!(
            p.options,
            Options {
                gravity: gravity(GravityType::Smart),
                ..fill(100, 100)
            }
        );
        // no size: the original's
        assert_eq!(opts("unsafe/photo.jpg"), fill(0, 0));
        assert_eq!(opts("unsafe/300x/a/b.jpg"), fill(300, 0));
        assert_eq!(opts("unsafe/x200/a.jpg"), fill(0, 200));
        assert_eq!(opts("unsafe/0x200/a.jpg"), fill(0, 200));
        assert_eq!(opts("unsafe/origxorig/a.jpg"), fill(0, 0));
        assert_eq!(
            opts("unsafe/fit-in/300x200/a.jpg"),
            Options {
                resize: ResizeType::Fit,
                width: 300,
                height: 200,
                ..Options::default()
            }
        );
        assert_eq!(
            opts("unsafe/full-fit-in/300x200/a.jpg"),
            Options {
                resize: ResizeType::Fit,
                width: 300,
                height: 200,
                min_width: 300,
                min_height: 200,
                ..Options::default()
            }
        );
        assert_eq!(
            opts("unsafe/adaptive-fit-in/300x200/a.jpg").resize,
            ResizeType::Fit
        );
        // flips, including of the original's size
        assert_eq!(
            opts("unsafe/-300x-200/a.jpg"),
            Options {
                flip: (true, true),
                ..fill(300, 200)
            }
        );
        assert_eq!(
            opts("unsafe/-0x0/a.jpg"),
            Options {
                flip: (true, false),
                ..fill(0, 0)
            }
        );
        assert_eq!(opts("unsafe/x-/a.jpg").flip, (false, true));
    }

    #[test]
    fn orig_sides() {
        // 300xorig: the original's height, 300 columns cut by the gravity, no scaling
        assert_eq!(
            opts("unsafe/300xorig/left/a.jpg"),
            Options {
                crop: Some(Crop {
                    width: 300.0,
                    height: 0.0,
                    gravity: None
                }),
                gravity: gravity(GravityType::Compass(Compass::West)),
                ..fill(0, 0)
            }
        );
        assert_eq!(
            opts("unsafe/origx100/a.jpg").crop,
            Some(Crop {
                width: 0.0,
                height: 100.0,
                gravity: None
            })
        );
        // fit-in: proportional
        assert_eq!(opts("unsafe/fit-in/origx100/a.jpg").width, 0);
        // after a manual crop: the region's side
        let o = opts("unsafe/10x20:110x220/origx50/a.jpg");
        assert_eq!((o.width, o.height), (100, 50));
    }

    #[test]
    fn alignment_trim_and_manual_crop() {
        let cases = [
            ("left/top", GravityType::Compass(Compass::NorthWest)),
            ("center/top", GravityType::Compass(Compass::North)),
            ("right/top", GravityType::Compass(Compass::NorthEast)),
            ("left", GravityType::Compass(Compass::West)),
            ("middle", GravityType::Compass(Compass::Center)),
            ("right/middle", GravityType::Compass(Compass::East)),
            ("left/bottom", GravityType::Compass(Compass::SouthWest)),
            ("bottom", GravityType::Compass(Compass::South)),
            ("right/bottom", GravityType::Compass(Compass::SouthEast)),
            ("right/bottom/smart", GravityType::Smart),
        ];
        for (parts, kind) in cases {
            let o = opts(&format!("unsafe/100x50/{parts}/a.jpg"));
            assert_eq!(o.gravity, gravity(kind), "{parts}");
        }
        assert_eq!(
            opts("unsafe/trim/a.jpg").trim,
            Some(Trim {
                threshold: 0.0,
                ..Trim::default()
            })
        );
        assert_eq!(
            opts("unsafe/trim:bottom-right:30/a.jpg")
                .trim
                .unwrap()
                .threshold,
            30.0
        );
        assert_eq!(
            opts("unsafe/trim:top-left/a.jpg").trim.unwrap().threshold,
            0.0
        );
        let o = opts("unsafe/trim/10x20:110x220/fit-in/50x50/a.jpg");
        assert!(o.trim.is_some());
        assert_eq!(
            o.crop,
            Some(Crop {
                width: 100.0,
                height: 200.0,
                gravity: Some(Gravity {
                    kind: GravityType::Compass(Compass::NorthWest),
                    x: 10.0,
                    y: 20.0
                })
            })
        );
        assert_eq!((o.resize, o.width, o.height), (ResizeType::Fit, 50, 50));
        // an empty region is ignored, as thumbor does
        assert_eq!(opts("unsafe/50x50:10x10/a.jpg").crop, None);
    }

    #[test]
    fn out_of_order_parts_start_the_image() {
        // an alignment after `smart` is not an option: the image path begins there
        let p = parse("unsafe/smart/left/a.jpg", &unsafe_cfg()).unwrap();
        assert_eq!(p.source, SourceRef::Relative("left/a.jpg".into()));
        assert_eq!(p.options.gravity, gravity(GravityType::Smart));
        // a directory named like an option, as the last segment before nothing: the image
        let p = parse("unsafe/left/", &unsafe_cfg()).unwrap();
        assert_eq!(p.source, SourceRef::Relative("left/".into()));
        assert_eq!(p.options.gravity, Gravity::default());
        assert!(is_bad("unsafe/"));
        assert!(is_bad("unsafe/meta/100x100/a.jpg"));
    }

    #[test]
    fn image_paths() {
        let src = |p: &str| parse(p, &unsafe_cfg()).unwrap().source;
        assert_eq!(
            src("unsafe/100x100/http://example.com/a/b.jpg"),
            SourceRef::Absolute("http://example.com/a/b.jpg".into())
        );
        // a `//` collapsed by a proxy, percent-encoded URLs and queries inside them
        assert_eq!(
            src("unsafe/100x100/https:/example.com/a.jpg"),
            SourceRef::Absolute("https://example.com/a.jpg".into())
        );
        assert_eq!(
            src("unsafe/http%3A%2F%2Fexample.com%2Fa.jpg%3Fv%3D2"),
            SourceRef::Absolute("http://example.com/a.jpg?v=2".into())
        );
        assert_eq!(
            src("unsafe/my%20photo.jpg"),
            SourceRef::Relative("my photo.jpg".into())
        );
        // a query on the request is not part of the path (as thumbor reads request.path)
        assert_eq!(
            src("unsafe/100x100/a.jpg?x=1"),
            SourceRef::Relative("a.jpg".into())
        );
        assert_eq!(src("/unsafe/a.jpg"), SourceRef::Relative("a.jpg".into()));
        // filters whose arguments hold slashes end at the first `)/`
        assert_eq!(
            src("unsafe/filters:watermark(http://x/wm.png,0,0,0)/a/b.jpg"),
            SourceRef::Relative("a/b.jpg".into())
        );
        assert!(is_bad("unsafe/http://"));
        assert!(is_bad("unsafe/%FF.jpg"));
    }

    #[test]
    fn filters() {
        let o = opts("unsafe/fit-in/100x100/filters:format(webp):quality(50)/photo.jpg");
        assert_eq!(o.format, Some(FormatChoice::Webp));
        assert_eq!(o.quality, 50);
        let o = opts(
            "unsafe/filters:blur(4):grayscale():strip_icc():strip_exif():max_bytes(9000)/a.jpg",
        );
        assert_eq!(o.blur, 4.0);
        assert!(o.grayscale);
        assert_eq!(o.strip_color_profile, Some(true));
        assert_eq!(o.strip_metadata, Some(true));
        assert_eq!(
            o.keep_copyright,
            Some(false),
            "thumbor strips the copyright too"
        );
        assert_eq!(o.max_bytes, 9000);
        assert_eq!(opts("unsafe/filters:blur(4,%202.5)/a.jpg").blur, 2.5);
        assert_eq!(opts("unsafe/filters:blur(400)/a.jpg").blur, MAX_BLUR);
        assert_eq!(opts("unsafe/filters:quality(500)/a.jpg").quality, 100);
        assert_eq!(
            opts("unsafe/filters:format(JPG)/a.jpg").format,
            Some(FormatChoice::Jpeg)
        );
        assert_eq!(opts("unsafe/filters:format(heic)/a.jpg").format, None);
        // counter-clockwise in thumbor, clockwise in the options
        assert_eq!(opts("unsafe/filters:rotate(90)/a.jpg").rotate, 270);
        assert_eq!(opts("unsafe/filters:rotate(-90)/a.jpg").rotate, 90);
        assert_eq!(opts("unsafe/filters:rotate(180)/a.jpg").rotate, 180);
        assert_eq!(opts("unsafe/filters:rotate(45)/a.jpg").rotate, 0);
        assert!(!opts("unsafe/filters:no_upscale()/a.jpg").enlarge);
        assert!(opts("unsafe/fit-in/9x9/filters:upscale()/a.jpg").enlarge);
        assert_eq!(
            opts("unsafe/filters:stretch()/a.jpg").resize,
            ResizeType::Force
        );
        // fill: the background, and for fit-in the canvas extended to the box, centred
        let o = opts("unsafe/fit-in/100x100/filters:fill(f00)/a.jpg");
        assert_eq!(o.background, Some([255, 0, 0]));
        assert_eq!(o.extend, Some(Gravity::default()));
        let o = opts("unsafe/100x100/filters:fill(00ff80)/a.jpg");
        assert_eq!((o.background, o.extend), (Some([0, 255, 128]), None));
        assert_eq!(
            opts("unsafe/filters:fill(blue,true)/a.jpg").background,
            Some([0, 0, 255])
        );
        let o = opts("unsafe/fit-in/100x100/filters:fill(transparent)/a.jpg");
        assert_eq!((o.background, o.extend), (None, Some(Gravity::default())));
        assert_eq!(
            opts("unsafe/filters:background_color(%23ffffff)/a.jpg").background,
            Some([255, 255, 255])
        );
        // unknown filters are ignored, as thumbor does
        assert_eq!(
            opts("unsafe/filters:brightness(10):quality(7)/a.jpg").quality,
            7
        );
    }

    #[test]
    fn malformed_filters_are_refused_naming_them() {
        for (path, name) in [
            ("unsafe/filters:quality(x)/a.jpg", "quality"),
            ("unsafe/filters:quality()/a.jpg", "quality"),
            ("unsafe/filters:blur(0)/a.jpg", "blur"),
            ("unsafe/filters:blur(1,2,3)/a.jpg", "blur"),
            ("unsafe/filters:grayscale(1)/a.jpg", "grayscale"),
            ("unsafe/filters:fill(notacolour)/a.jpg", "fill"),
            ("unsafe/filters:format(bmp)/a.jpg", "format"),
            ("unsafe/filters:max_bytes(-1)/a.jpg", "max_bytes"),
            ("unsafe/filters:watermark(wm.png,0,0)/a.jpg", "watermark"),
            ("unsafe/filters:watermark(wm.png,zz,0,0)/a.jpg", "watermark"),
        ] {
            match parse(path, &unsafe_cfg()) {
                Err(GrammarError::Bad(m)) => assert!(m.contains(&format!("`{name}`")), "{m}"),
                other => panic!("{path}: {other:?}"),
            }
        }
    }

    #[test]
    fn watermark_positions() {
        let wm = |args: &str| {
            opts(&format!("unsafe/filters:watermark(wm.png,{args})/a.jpg"))
                .watermark
                .unwrap()
        };
        use WatermarkPosition as P;
        let w = wm("10,20,25");
        assert_eq!(
            (w.position, w.x, w.y, w.opacity),
            (P::At(Compass::NorthWest), 10.0, 20.0, 0.75)
        );
        let w = wm("-10,-20,0");
        assert_eq!(
            (w.position, w.x, w.y, w.opacity),
            (P::At(Compass::SouthEast), 10.0, 20.0, 1.0)
        );
        assert_eq!(wm("center,center,50").position, P::At(Compass::Center));
        assert_eq!(wm("center,-0,50").position, P::At(Compass::South));
        assert_eq!(wm("-5,center,50").position, P::At(Compass::East));
        assert_eq!(wm("repeat,repeat,50").position, P::Replicate);
        assert_eq!(wm("repeat,10,50").position, P::Replicate);
        let w = wm("20p,-30p,100,40");
        assert_eq!(
            (w.position, w.x, w.y, w.opacity),
            (P::At(Compass::SouthWest), 0.2, 0.3, 0.0)
        );
        assert_eq!(w.scale, 0.4);
        assert_eq!(wm("0,0,0,none,30").scale, 0.0);
        // a quoted URL may hold commas
        assert_eq!(
            opts("unsafe/filters:watermark('http://x/a,b.png',1,2,0)/a.jpg")
                .watermark
                .unwrap()
                .x,
            1.0
        );
    }

    // libthumbor's published vectors (its tests/test_cryptourl.py), key `my-security-key`.
    const KEY: &str = "my-security-key";
    const SIGNED: [&str; 3] = [
        "8ammJH8D-7tXy6kU3lTvoXlhu4o=/300x200/my.server.com/some/path/to/image.jpg",
        "B35oBEIwztbc3jm7vsdqLez2C78=/10x10:200x200/300x200/my.server.com/some/path/to/image.jpg",
        "as8U2DbUUtTMgvPF26LkjS3MocY=/10x10:200x200/300x200/filters:brightness(20):contrast(10)/my.server.com/some/path/to/image.jpg",
    ];

    #[test]
    fn signatures_of_libthumbor_are_accepted() {
        for url in SIGNED {
            let p = parse(url, &keyed(KEY)).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(
                p.source,
                SourceRef::Relative("my.server.com/some/path/to/image.jpg".into())
            );
            assert_eq!((p.options.width, p.options.height), (300, 200));
            assert!(claims(url));
            // the `=` percent-encoded by a client
            let enc = url.replacen('=', "%3D", 1);
            assert!(parse(&enc, &keyed(KEY)).is_ok());
            assert!(claims(&enc));
        }
    }

    #[test]
    fn tampered_unsigned_and_unkeyed_are_refused() {
        let forbidden = |url: &str, cfg: &ThumborConfig| {
            assert!(
                matches!(parse(url, cfg), Err(GrammarError::Signature(_))),
                "{url}"
            )
        };
        let k = keyed(KEY);
        forbidden(&SIGNED[0].replace("300x200", "300x201"), &k);
        forbidden(&SIGNED[0].replace("8ammJH8D", "8ammJH8E"), &k);
        forbidden(&SIGNED[0].replace("image.jpg", "image.png"), &k);
        forbidden(SIGNED[0], &keyed("another-key"));
        forbidden("unsafe/300x200/a.jpg", &k);
        forbidden("not-base64!/300x200/a.jpg", &k);
        forbidden("/300x200/a.jpg", &k);
        // a signed URL where no key is configured cannot be checked
        forbidden(SIGNED[0], &unsafe_cfg());
        // the signature is checked before the options: a bad filter behind a wrong one is 403
        forbidden("AAAAAAAAAAAAAAAAAAAAAAAAAAA=/filters:quality(x)/a.jpg", &k);
    }

    #[test]
    fn claims_only_thumbor_shapes() {
        assert!(claims("unsafe/a.jpg"));
        assert!(claims("/unsafe/100x100/smart/a.jpg"));
        assert!(!claims("insecure/rs:fill:100:100/plain/a.jpg"));
        // imgproxy's SHA-256 signatures are 43 characters without padding
        assert!(!claims(
            "oKfUtW34Dvo2BGQehJFR4Nr0_rIjOtdtzJ3QFsUcXH8/rs:fill:300:400/plain/a.jpg"
        ));
        assert!(!claims("unsafe"));
    }
}
