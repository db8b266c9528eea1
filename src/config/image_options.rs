//! The processing options of an image proxy request, whichever URL grammar wrote them
//! (imgproxy's `/rs:fill:100:100/g:sm/plain/...`, thumbor's `/100x100/smart/...`): one plain
//! struct, as imgproxy's `ProcessingOptions`, which the pipeline (`crate::images::pipeline`)
//! executes step by step. Plain data in config because imgproxy presets
//! (`images.imgproxy.presets`) are written in imgproxy's option grammar and checked at load; the
//! grammar of one option (`name:arg:arg`) is [`Options::apply`], used by both the presets and
//! the request parser (`crate::images::imgproxy`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use super::image_params::FormatChoice;

/// How the requested size applies (imgproxy's `resizing_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResizeType {
    /// Keep the aspect ratio, fit inside width × height.
    #[default]
    Fit,
    /// Keep the aspect ratio, cover width × height, crop the overflow (by gravity).
    Fill,
    /// As `Fill`, but never enlarge: the result may be smaller than asked, same aspect ratio.
    FillDown,
    /// Exactly width × height, aspect ratio ignored.
    Force,
    /// `Fill` when source and result have the same orientation, else `Fit`.
    Auto,
}

/// A point of the compass a box is anchored to inside another: a crop, an extension or a
/// result by its gravity (imgproxy's `g:no`, thumbor's `left/top`), a watermark by its
/// position (`wm:1:soea`). On each axis the box is near (left, top), in the middle, or far
/// (right, bottom); [`Compass::anchor`] places it, the one placement both use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compass {
    #[default]
    Center,
    North,
    South,
    East,
    West,
    NorthEast,
    NorthWest,
    SouthEast,
    SouthWest,
}

impl Compass {
    /// imgproxy's name of a point (`ce`, `no`, `so`, `ea`, `we`, `noea`, `nowe`, `soea`,
    /// `sowe`), or None.
    pub fn parse(v: &str) -> Option<Compass> {
        Some(match v {
            "ce" => Compass::Center,
            "no" => Compass::North,
            "so" => Compass::South,
            "ea" => Compass::East,
            "we" => Compass::West,
            "noea" => Compass::NorthEast,
            "nowe" => Compass::NorthWest,
            "soea" => Compass::SouthEast,
            "sowe" => Compass::SouthWest,
            _ => return None,
        })
    }

    /// The side on each axis (horizontal, vertical): 0 near (left, top), 1 middle, 2 far
    /// (right, bottom).
    pub fn sides(self) -> (u8, u8) {
        match self {
            Compass::NorthWest => (0, 0),
            Compass::North => (1, 0),
            Compass::NorthEast => (2, 0),
            Compass::West => (0, 1),
            Compass::Center => (1, 1),
            Compass::East => (2, 1),
            Compass::SouthWest => (0, 2),
            Compass::South => (1, 2),
            Compass::SouthEast => (2, 2),
        }
    }

    /// The point with these [`Compass::sides`] (a side above 2 is far).
    pub fn from_sides(h: u8, v: u8) -> Compass {
        match (h.min(2), v.min(2)) {
            (0, 0) => Compass::NorthWest,
            (1, 0) => Compass::North,
            (2, 0) => Compass::NorthEast,
            (0, 1) => Compass::West,
            (2, 1) => Compass::East,
            (0, 2) => Compass::SouthWest,
            (1, 2) => Compass::South,
            (2, 2) => Compass::SouthEast,
            _ => Compass::Center,
        }
    }

    /// The top-left corner of a box anchored here, `free` being the outer size less the box's
    /// on each axis: `offset` away from the anchored edge (near: `offset`, far: `free -
    /// offset`), or added to the middle (`free / 2 + offset`). In pixels of any type: `f64`
    /// for geometry, `i64` for a watermark (whose halves are truncated); not kept inside.
    pub fn anchor<T>(self, free: (T, T), offset: (T, T)) -> (T, T)
    where
        T: Copy
            + std::ops::Add<Output = T>
            + std::ops::Sub<Output = T>
            + std::ops::Div<Output = T>
            + From<u8>,
    {
        let along = |side: u8, free: T, offset: T| match side {
            0 => offset,
            2 => free - offset,
            _ => free / T::from(2) + offset,
        };
        let (h, v) = self.sides();
        (along(h, free.0, offset.0), along(v, free.1, offset.1))
    }
}

/// Where a crop (or an extension, or the result) is anchored (imgproxy's gravity `g`).
#[derive(Clone, Copy, PartialEq)]
pub enum GravityType {
    /// A point of the compass (imgproxy's `ce`, `no`, ...).
    Compass(Compass),
    /// Chosen by content (`crate::images::smart`, libvips's attention strategy).
    Smart,
    /// A focus point, as fractions of the width and height (0.0-1.0).
    FocusPoint(f64, f64),
}

impl Default for GravityType {
    fn default() -> Self {
        GravityType::Compass(Compass::Center)
    }
}

/// A compass point prints as its name alone (`North`, as before [`Compass`] was its own
/// type): options' cache keys print gravities, and stored results keep their keys.
impl std::fmt::Debug for GravityType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GravityType::Compass(c) => c.fmt(f),
            GravityType::Smart => f.write_str("Smart"),
            GravityType::FocusPoint(x, y) => f.debug_tuple("FocusPoint").field(x).field(y).finish(),
        }
    }
}

/// A gravity with its offsets (pixels when ≥ 1, fractions of the size when < 1, imgproxy's
/// rule), applied away from the anchored edge.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Gravity {
    pub kind: GravityType,
    pub x: f64,
    pub y: f64,
}

/// A crop before resizing (imgproxy's `c:%width:%height:%gravity`): sizes in pixels (≥ 1) or
/// fractions of the source (< 1); 0 means the full side. Gravity None: the request's gravity.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Crop {
    pub width: f64,
    pub height: f64,
    pub gravity: Option<Gravity>,
}

/// Removal of a uniform border (imgproxy's `t:%threshold:%color:%equal_hor:%equal_ver`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Trim {
    pub threshold: f64,
    /// The border colour; None: the top-left pixel's.
    pub color: Option<[u8; 3]>,
    pub equal_hor: bool,
    pub equal_ver: bool,
}

/// Where the configured watermark image goes (imgproxy's `wm` positions).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum WatermarkPosition {
    /// At a point of the compass.
    At(Compass),
    /// Repeated over the whole image.
    Replicate,
}

impl Default for WatermarkPosition {
    fn default() -> Self {
        WatermarkPosition::At(Compass::Center)
    }
}

/// As [`GravityType`]'s: a compass point prints as its name alone (cache keys print it).
impl std::fmt::Debug for WatermarkPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WatermarkPosition::At(c) => c.fmt(f),
            WatermarkPosition::Replicate => f.write_str("Replicate"),
        }
    }
}

/// The configured watermark, placed (imgproxy's `wm:%opacity:%position:%x:%y:%scale`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Watermark {
    /// 0.0-1.0; 0 means no watermark.
    pub opacity: f64,
    pub position: WatermarkPosition,
    pub x: f64,
    pub y: f64,
    /// The watermark's width as a fraction of the result's; 0: its own size.
    pub scale: f64,
}

/// Every processing option of one request. `Default` is "nothing asked": the original's
/// pixels, the route's default format and quality.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Options {
    pub resize: ResizeType,
    /// 0: derived from the other side (both 0: the source's size).
    pub width: u32,
    pub height: u32,
    pub min_width: u32,
    pub min_height: u32,
    /// Multiplies width and height (imgproxy's `z`); 1.0 when absent (0.0 read as 1.0).
    pub zoom: (f64, f64),
    /// Device pixel ratio: multiplies the result's size (1.0 when absent; 0.0 read as 1.0).
    pub dpr: f64,
    /// Allow a result larger than the source (still bounded by the route's `max_upscale`).
    pub enlarge: bool,
    /// Extend the canvas to the requested size when the result is smaller, placed by gravity.
    pub extend: Option<Gravity>,
    /// Extend the canvas to the requested aspect ratio.
    pub extend_aspect: Option<Gravity>,
    pub gravity: Gravity,
    pub crop: Option<Crop>,
    pub trim: Option<Trim>,
    /// Added around the result after everything else: top, right, bottom, left (pixels,
    /// multiplied by `dpr`).
    pub padding: [u32; 4],
    /// Orient by the EXIF orientation (imgproxy's `ar`; None: the route's default, true).
    pub auto_rotate: Option<bool>,
    /// Clockwise, a multiple of 90.
    pub rotate: u16,
    /// Horizontal, vertical.
    pub flip: (bool, bool),
    /// The colour behind transparent pixels when the output has no alpha, of extended and
    /// padded areas (None: white for formats without alpha, transparent for the others).
    pub background: Option<[u8; 3]>,
    /// Gaussian blur sigma; 0: none.
    pub blur: f32,
    /// Sharpen sigma; 0: none.
    pub sharpen: f32,
    /// Pixelate block size; 0: none.
    pub pixelate: u32,
    /// Thumbor's `grayscale()` filter.
    pub grayscale: bool,
    pub watermark: Option<Watermark>,
    /// Drop metadata (EXIF, XMP, comments) from the output (None: the route's default, true).
    pub strip_metadata: Option<bool>,
    /// With `strip_metadata`, keep the copyright (EXIF Copyright/Artist).
    pub keep_copyright: Option<bool>,
    /// Convert to sRGB and drop the ICC profile (None: the route's default, true); false keeps
    /// the source's profile and pixels.
    pub strip_color_profile: Option<bool>,
    /// 1-100; 0: the per-format quality or the route's default.
    pub quality: u8,
    /// Per output format quality (imgproxy's `fq`), used when `quality` is 0.
    pub format_quality: Vec<(FormatChoice, u8)>,
    /// The result's largest size in bytes: quality is lowered until it fits (0: no limit).
    pub max_bytes: u64,
    /// The output format: None: the route's default (often `auto`, from Accept).
    pub format: Option<FormatChoice>,
    /// Progressive (interlaced) JPEG/PNG output.
    pub progressive: Option<bool>,
    /// Return the source's bytes untouched (imgproxy's `skp`/`raw` for these formats).
    pub skip_processing: Vec<FormatChoice>,
    /// Changes the cache key only (imgproxy's `cb`).
    pub cache_buster: String,
    /// Unix time after which the URL is refused (imgproxy's `exp`); 0: never.
    pub expires: u64,
    /// The file name the result is offered as (imgproxy's `fn`; None: the source's, with the
    /// result's extension), in `Content-Disposition`.
    pub filename: Option<String>,
    /// `Content-Disposition: attachment` (a "save as" download) rather than `inline`
    /// (imgproxy's `att`).
    pub attachment: bool,
    /// The source's bytes whatever their format and the format asked (imgproxy's `raw`).
    pub raw: bool,
    /// Limits a request redefines (imgproxy's security options), refused with 403 unless the
    /// route allows them (`imgproxy.allow_security_options`).
    pub security: SecurityOptions,
    /// The presets applied, in order (for the access log).
    pub presets: Vec<String>,
}

/// imgproxy's security options: a request's own limits in place of the route's (None: the
/// route's).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SecurityOptions {
    /// Most pixels of the source, in megapixels (`msr`, IMGPROXY_MAX_SRC_RESOLUTION).
    pub max_src_resolution: Option<f64>,
    /// Largest source in bytes (`msfs`); the route's `max_source_size` still bounds the fetch.
    pub max_src_file_size: Option<u64>,
    /// Most frames of an animation (`maf`).
    pub max_animation_frames: Option<u32>,
    /// Most pixels of one frame of an animation, in megapixels (`mafr`).
    pub max_animation_frame_resolution: Option<f64>,
    /// Largest width or height of the result (`mrd`).
    pub max_result_dimension: Option<u32>,
}

impl SecurityOptions {
    /// Whether any is given.
    pub fn any(&self) -> bool {
        *self != SecurityOptions::default()
    }
}

/// Largest file name `fn` takes, in bytes.
const MAX_FILENAME: usize = 255;

/// `fn`'s `%filename:%encoded`: percent-encoded, or base64url when `encoded`; a name of at most
/// [`MAX_FILENAME`] bytes without control characters or path separators.
fn filename(name: &str, args: &[&str]) -> Result<Option<String>, OptionError> {
    max_args(name, args, 2)?;
    let Some(v) = arg(args, 0) else {
        return Ok(None);
    };
    let encoded = arg(args, 1).map_or(Ok(false), |e| boolean(name, e))?;
    let decoded = if encoded {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(v.trim_end_matches('='))
            .map_err(|_| bad(name, "not URL-safe base64"))?;
        String::from_utf8(bytes).map_err(|_| bad(name, "not UTF-8"))?
    } else {
        percent_encoding::percent_decode_str(v)
            .decode_utf8()
            .map_err(|_| bad(name, "not UTF-8 once percent-decoded"))?
            .into_owned()
    };
    if decoded.len() > MAX_FILENAME {
        return Err(bad(name, format!("longer than {MAX_FILENAME} bytes")));
    }
    if decoded.is_empty()
        || decoded
            .chars()
            .any(|c| c.is_control() || c == '/' || c == '\\')
    {
        return Err(bad(
            name,
            "a file name without control characters, `/` or `\\`",
        ));
    }
    Ok(Some(decoded))
}

/// Megapixels of `msr`/`mafr`: above 0, at most 10,000.
fn megapixels(name: &str, v: &str) -> Result<f64, OptionError> {
    let f = float(name, v, 10_000.0)?;
    if f == 0.0 {
        return Err(bad(name, "must be above 0"));
    }
    Ok(f)
}

/// An option that failed to parse: 400 naming it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("option `{name}`: {reason}")]
pub struct OptionError {
    pub name: String,
    pub reason: String,
}

fn bad(name: &str, reason: impl Into<String>) -> OptionError {
    OptionError {
        name: name.to_string(),
        reason: reason.into(),
    }
}

/// Largest width, height, crop or padding accepted before the route's own bounds apply.
const MAX_NUM: u32 = 1_000_000;

/// Largest device pixel ratio and zoom (imgproxy refuses a dpr over 8 too).
const MAX_FACTOR: f64 = 8.0;

fn int(name: &str, v: &str) -> Result<u32, OptionError> {
    let n: u32 = v
        .parse()
        .map_err(|_| bad(name, format!("`{v}` is not a non-negative integer")))?;
    if n > MAX_NUM {
        return Err(bad(name, format!("{n} is out of range (0 to {MAX_NUM})")));
    }
    Ok(n)
}

fn float(name: &str, v: &str, max: f64) -> Result<f64, OptionError> {
    let f: f64 = v
        .parse()
        .map_err(|_| bad(name, format!("`{v}` is not a number")))?;
    if !f.is_finite() || f < 0.0 || f > max {
        return Err(bad(name, format!("{v} is out of range (0 to {max})")));
    }
    Ok(f)
}

/// imgproxy's booleans (Go's `strconv.ParseBool`).
fn boolean(name: &str, v: &str) -> Result<bool, OptionError> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(bad(
            name,
            format!("`{v}` is not a boolean (1/0, true/false)"),
        )),
    }
}

fn hex_color(name: &str, v: &str) -> Result<[u8; 3], OptionError> {
    let ok = v.len() == 6 && v.bytes().all(|b| b.is_ascii_hexdigit());
    if !ok {
        return Err(bad(name, format!("`{v}` is not a hex colour (RRGGBB)")));
    }
    let c = |i: usize| u8::from_str_radix(&v[i..i + 2], 16).unwrap_or(0);
    Ok([c(0), c(2), c(4)])
}

fn format(name: &str, v: &str) -> Result<FormatChoice, OptionError> {
    match FormatChoice::parse(v) {
        Some(FormatChoice::Keep) | None => Err(bad(
            name,
            format!("unknown format `{v}` (jpg, png, webp, avif, gif, jxl, auto)"),
        )),
        Some(f) => Ok(f),
    }
}

fn max_args(name: &str, args: &[&str], n: usize) -> Result<(), OptionError> {
    if args.len() > n {
        return Err(bad(
            name,
            format!("at most {n} arguments, {} given", args.len()),
        ));
    }
    Ok(())
}

/// Argument `i` when given and not empty (imgproxy skips empty arguments: `rs:fill::100`).
fn arg<'a>(args: &[&'a str], i: usize) -> Option<&'a str> {
    args.get(i).copied().filter(|a| !a.is_empty())
}

/// `%type:%x_offset:%y_offset`, `sm` or `fp:%x:%y`; `smart` false for extend gravities.
fn gravity(name: &str, args: &[&str], smart: bool) -> Result<Gravity, OptionError> {
    let Some(t) = arg(args, 0) else {
        return Err(bad(name, "a gravity type is required"));
    };
    let offset = |i: usize| arg(args, i).map_or(Ok(0.0), |v| signed(name, v));
    match t {
        "sm" if smart => {
            max_args(name, args, 1)?;
            Ok(Gravity {
                kind: GravityType::Smart,
                x: 0.0,
                y: 0.0,
            })
        }
        "fp" => {
            max_args(name, args, 3)?;
            let x = arg(args, 1).map_or(Ok(0.5), |v| float(name, v, 1.0))?;
            let y = arg(args, 2).map_or(Ok(0.5), |v| float(name, v, 1.0))?;
            Ok(Gravity {
                kind: GravityType::FocusPoint(x, y),
                x: 0.0,
                y: 0.0,
            })
        }
        _ => {
            let kind = Compass::parse(t).map(GravityType::Compass).ok_or_else(|| {
                bad(
                    name,
                    format!(
                        "unknown gravity `{t}` (no, so, ea, we, noea, nowe, soea, sowe, ce{}, fp)",
                        if smart { ", sm" } else { "" }
                    ),
                )
            })?;
            max_args(name, args, 3)?;
            Ok(Gravity {
                kind,
                x: offset(1)?,
                y: offset(2)?,
            })
        }
    }
}

fn signed(name: &str, v: &str) -> Result<f64, OptionError> {
    let f: f64 = v
        .parse()
        .map_err(|_| bad(name, format!("`{v}` is not a number")))?;
    if !f.is_finite() || f.abs() > f64::from(MAX_NUM) {
        return Err(bad(name, format!("{v} is out of range")));
    }
    Ok(f)
}

/// `%extend:%gravity...` of `ex` and `exar` (and of `rs`/`s` after their sizes).
fn extend(name: &str, args: &[&str]) -> Result<Option<Gravity>, OptionError> {
    let on = arg(args, 0).map_or(Ok(false), |v| boolean(name, v))?;
    if !on {
        return Ok(None);
    }
    if args.len() > 1 {
        Ok(Some(gravity(name, &args[1..], false)?))
    } else {
        Ok(Some(Gravity::default()))
    }
}

impl Options {
    /// Applies one imgproxy option, `name` with its colon-separated `args` (`rs`, `["fill",
    /// "100", "100"]`): full names and short ones, as imgproxy's processing options page lists
    /// them. Presets (`pr`) are expanded by [`Options::apply_with`], which is given them.
    pub fn apply(&mut self, name: &str, args: &[&str]) -> Result<(), OptionError> {
        match name {
            "resize" | "rs" | "size" | "s" => {
                let sized = matches!(name, "size" | "s");
                let (first, n) = if sized { (0, 4) } else { (1, 5) };
                if args.len() > n + 3 {
                    return Err(bad(name, format!("at most {} arguments", n + 3)));
                }
                if !sized {
                    if let Some(t) = arg(args, 0) {
                        self.apply("rt", &[t]).map_err(|e| bad(name, e.reason))?;
                    }
                }
                if let Some(w) = arg(args, first) {
                    self.width = int(name, w)?;
                }
                if let Some(h) = arg(args, first + 1) {
                    self.height = int(name, h)?;
                }
                if let Some(e) = arg(args, first + 2) {
                    self.enlarge = boolean(name, e)?;
                }
                if args.len() > first + 3 {
                    self.extend = extend(name, &args[first + 3..])?;
                }
            }
            "resizing_type" | "rt" => {
                max_args(name, args, 1)?;
                self.resize = match args.first().copied().unwrap_or("") {
                    "fit" => ResizeType::Fit,
                    "fill" => ResizeType::Fill,
                    "fill-down" => ResizeType::FillDown,
                    "force" => ResizeType::Force,
                    "auto" => ResizeType::Auto,
                    t => {
                        return Err(bad(
                            name,
                            format!(
                                "unknown resizing type `{t}` (fit, fill, fill-down, force, auto)"
                            ),
                        ))
                    }
                };
            }
            "width" | "w" => self.width = one(name, args, int)?,
            "height" | "h" => self.height = one(name, args, int)?,
            "min-width" | "mw" => self.min_width = one(name, args, int)?,
            "min-height" | "mh" => self.min_height = one(name, args, int)?,
            "zoom" | "z" => {
                max_args(name, args, 2)?;
                let x = arg(args, 0).map_or(Ok(1.0), |v| positive(name, v))?;
                let y = arg(args, 1).map_or(Ok(x), |v| positive(name, v))?;
                self.zoom = (x, y);
            }
            "dpr" => self.dpr = one(name, args, positive)?,
            "enlarge" | "el" => self.enlarge = one(name, args, boolean)?,
            "extend" | "ex" => {
                max_args(name, args, 4)?;
                self.extend = extend(name, args)?;
            }
            "extend_aspect_ratio" | "extend_ar" | "exar" => {
                max_args(name, args, 4)?;
                self.extend_aspect = extend(name, args)?;
            }
            "gravity" | "g" => self.gravity = gravity(name, args, true)?,
            "crop" | "c" => {
                let size =
                    |i: usize| arg(args, i).map_or(Ok(0.0), |v| float(name, v, f64::from(MAX_NUM)));
                let (width, height) = (size(0)?, size(1)?);
                let gravity = if args.len() > 2 {
                    Some(gravity(name, &args[2..], true)?)
                } else {
                    None
                };
                self.crop = Some(Crop {
                    width,
                    height,
                    gravity,
                });
            }
            "trim" | "t" => {
                max_args(name, args, 4)?;
                let threshold = arg(args, 0).map_or(Ok(10.0), |v| float(name, v, 255.0))?;
                let color = arg(args, 1).map(|v| hex_color(name, v)).transpose()?;
                let equal_hor = arg(args, 2).map_or(Ok(false), |v| boolean(name, v))?;
                let equal_ver = arg(args, 3).map_or(Ok(false), |v| boolean(name, v))?;
                self.trim = (threshold > 0.0).then_some(Trim {
                    threshold,
                    color,
                    equal_hor,
                    equal_ver,
                });
            }
            "padding" | "pd" => {
                max_args(name, args, 4)?;
                let v = |i: usize| arg(args, i).map(|v| int(name, v)).transpose();
                let top = v(0)?.unwrap_or(0);
                let right = v(1)?.unwrap_or(top);
                let bottom = v(2)?.unwrap_or(top);
                let left = v(3)?.unwrap_or(right);
                self.padding = [top, right, bottom, left];
            }
            "auto_rotate" | "ar" => self.auto_rotate = Some(one(name, args, boolean)?),
            "rotate" | "rot" => {
                let deg: i64 = one(name, args, |n, v| {
                    v.parse::<i64>()
                        .map_err(|_| bad(n, format!("`{v}` is not an integer")))
                })?;
                if deg % 90 != 0 || deg.abs() > 3600 {
                    return Err(bad(name, "must be a multiple of 90 degrees"));
                }
                self.rotate = deg.rem_euclid(360) as u16;
            }
            "flip" | "fl" => {
                max_args(name, args, 2)?;
                let h = arg(args, 0).map_or(Ok(false), |v| boolean(name, v))?;
                let v = arg(args, 1).map_or(Ok(false), |v| boolean(name, v))?;
                self.flip = (h, v);
            }
            "background" | "bg" => {
                self.background = match args {
                    [] | [""] => None,
                    [hex] => Some(hex_color(name, hex)?),
                    [r, g, b] => {
                        let c = |v: &str| {
                            v.parse::<u8>()
                                .map_err(|_| bad(name, format!("`{v}` is not 0 to 255")))
                        };
                        Some([c(r)?, c(g)?, c(b)?])
                    }
                    _ => return Err(bad(name, "`R:G:B` or a hex colour `RRGGBB`")),
                };
            }
            "blur" | "bl" => self.blur = one(name, args, |n, v| float(n, v, 100.0))? as f32,
            "sharpen" | "sh" => self.sharpen = one(name, args, |n, v| float(n, v, 100.0))? as f32,
            "pixelate" | "pix" => self.pixelate = one(name, args, int)?,
            "watermark" | "wm" => {
                max_args(name, args, 5)?;
                let opacity = arg(args, 0).map_or(Ok(0.0), |v| float(name, v, 1.0))?;
                let position = match arg(args, 1).unwrap_or("ce") {
                    "re" => WatermarkPosition::Replicate,
                    p => match Compass::parse(p) {
                        Some(c) => WatermarkPosition::At(c),
                        None => {
                            return Err(bad(name, format!("unknown position `{p}`")));
                        }
                    },
                };
                let x = arg(args, 2).map_or(Ok(0.0), |v| signed(name, v))?;
                let y = arg(args, 3).map_or(Ok(0.0), |v| signed(name, v))?;
                let scale = arg(args, 4).map_or(Ok(0.0), |v| float(name, v, 1.0))?;
                self.watermark = (opacity > 0.0).then_some(Watermark {
                    opacity,
                    position,
                    x,
                    y,
                    scale,
                });
            }
            "strip_metadata" | "sm" => self.strip_metadata = Some(one(name, args, boolean)?),
            "keep_copyright" | "kcr" => self.keep_copyright = Some(one(name, args, boolean)?),
            "strip_color_profile" | "scp" => {
                self.strip_color_profile = Some(one(name, args, boolean)?)
            }
            "quality" | "q" => self.quality = one(name, args, quality)?,
            "format_quality" | "fq" => {
                if args.len() % 2 != 0 || args.is_empty() {
                    return Err(bad(name, "pairs of a format and a quality"));
                }
                for pair in args.chunks_exact(2) {
                    let f = format(name, pair[0])?;
                    let q = quality(name, pair[1])?;
                    self.format_quality.retain(|(g, _)| *g != f);
                    if q > 0 {
                        self.format_quality.push((f, q));
                    }
                }
                self.format_quality.sort_by_key(|(f, _)| *f as u8);
            }
            "max_bytes" | "mb" => {
                self.max_bytes = one(name, args, |n, v| {
                    v.parse::<u64>()
                        .map_err(|_| bad(n, format!("`{v}` is not a non-negative integer")))
                })?
            }
            "format" | "f" | "ext" => self.format = Some(one(name, args, format)?),
            "skip_processing" | "skp" => {
                self.skip_processing = args
                    .iter()
                    .filter(|a| !a.is_empty())
                    .map(|a| format(name, a))
                    .collect::<Result<_, _>>()?;
            }
            "cache_buster" | "cb" => {
                max_args(name, args, 1)?;
                self.cache_buster = args.first().unwrap_or(&"").to_string();
            }
            "expires" | "exp" => {
                self.expires = one(name, args, |n, v| {
                    v.parse::<u64>()
                        .map_err(|_| bad(n, format!("`{v}` is not a Unix time")))
                })?
            }
            "filename" | "fn" => self.filename = filename(name, args)?,
            "return_attachment" | "att" => self.attachment = one(name, args, boolean)?,
            "raw" => self.raw = one(name, args, boolean)?,
            "max_src_resolution" | "msr" => {
                self.security.max_src_resolution = Some(one(name, args, megapixels)?)
            }
            "max_src_file_size" | "msfs" => {
                // 0 is imgproxy's "no limit of its own": the route's `max_source_size` holds.
                let bytes = one(name, args, |n, v| {
                    v.parse::<u64>()
                        .map_err(|_| bad(n, format!("`{v}` is not a size in bytes")))
                })?;
                self.security.max_src_file_size = Some(bytes).filter(|b| *b > 0)
            }
            "max_animation_frames" | "maf" => {
                // As imgproxy: 0 frames is refused, not read as "no limit".
                let frames = one(name, args, int)?;
                if frames == 0 {
                    return Err(bad(name, "0 is not a number of frames (1 or more)"));
                }
                self.security.max_animation_frames = Some(frames)
            }
            "max_animation_frame_resolution" | "mafr" => {
                self.security.max_animation_frame_resolution = Some(one(name, args, megapixels)?)
            }
            "max_result_dimension" | "mrd" => {
                self.security.max_result_dimension = Some(one(name, args, int)?).filter(|n| *n > 0)
            }
            "preset" | "pr" => {
                return Err(bad(name, "presets cannot be used here"));
            }
            _ => return Err(bad(name, "unknown option")),
        }
        Ok(())
    }

    /// [`Options::apply`], with `pr`/`preset` expanded from `presets` (each named preset's
    /// options applied in place, in order).
    pub fn apply_with(
        &mut self,
        name: &str,
        args: &[&str],
        presets: &BTreeMap<String, OptionList>,
    ) -> Result<(), OptionError> {
        if !matches!(name, "pr" | "preset") {
            return self.apply(name, args);
        }
        for p in args.iter().filter(|a| !a.is_empty()) {
            let list = presets
                .get(*p)
                .ok_or_else(|| bad(name, format!("no preset named `{p}`")))?;
            list.apply_to(self)?;
            self.presets.push(p.to_string());
        }
        Ok(())
    }

    /// The normalized form of these options, independent of how the URL wrote them: part of
    /// the cache key of a result, so that equal options share one entry. Only what changes the
    /// result is in it (not `exp`, not the preset names), and only what differs from the
    /// defaults.
    pub fn key(&self) -> String {
        let d = Options::default();
        let mut s = String::with_capacity(64);
        let mut put = |part: std::fmt::Arguments| {
            if !s.is_empty() {
                s.push('/');
            }
            let _ = s.write_fmt(part);
        };
        put(format_args!(
            "{}:{}:{}",
            match self.resize {
                ResizeType::Fit => "fit",
                ResizeType::Fill => "fill",
                ResizeType::FillDown => "fill-down",
                ResizeType::Force => "force",
                ResizeType::Auto => "auto",
            },
            self.width,
            self.height
        ));
        if (self.min_width, self.min_height) != (0, 0) {
            put(format_args!("m:{}:{}", self.min_width, self.min_height));
        }
        let (zx, zy) = self.zoom();
        if (zx, zy) != (1.0, 1.0) {
            put(format_args!("z:{zx}:{zy}"));
        }
        if self.dpr() != 1.0 {
            put(format_args!("dpr:{}", self.dpr()));
        }
        if self.enlarge {
            put(format_args!("el"));
        }
        if let Some(g) = self.extend {
            put(format_args!("ex:{}", gravity_key(&g)));
        }
        if let Some(g) = self.extend_aspect {
            put(format_args!("exar:{}", gravity_key(&g)));
        }
        if self.gravity != d.gravity {
            put(format_args!("g:{}", gravity_key(&self.gravity)));
        }
        if let Some(c) = &self.crop {
            let g = c.gravity.as_ref().map_or(String::new(), gravity_key);
            put(format_args!("c:{}:{}:{g}", c.width, c.height));
        }
        if let Some(t) = &self.trim {
            put(format_args!("t:{t:?}"));
        }
        if self.padding != d.padding {
            let p = self.padding;
            put(format_args!("pd:{}:{}:{}:{}", p[0], p[1], p[2], p[3]));
        }
        if let Some(a) = self.auto_rotate {
            put(format_args!("ar:{}", u8::from(a)));
        }
        if self.rotate != 0 {
            put(format_args!("rot:{}", self.rotate));
        }
        if self.flip != d.flip {
            put(format_args!(
                "fl:{}:{}",
                u8::from(self.flip.0),
                u8::from(self.flip.1)
            ));
        }
        if let Some([r, g, b]) = self.background {
            put(format_args!("bg:{r:02x}{g:02x}{b:02x}"));
        }
        if self.blur > 0.0 {
            put(format_args!("bl:{}", self.blur));
        }
        if self.sharpen > 0.0 {
            put(format_args!("sh:{}", self.sharpen));
        }
        if self.pixelate > 0 {
            put(format_args!("pix:{}", self.pixelate));
        }
        if self.grayscale {
            put(format_args!("gray"));
        }
        if let Some(w) = &self.watermark {
            put(format_args!("wm:{w:?}"));
        }
        for (name, v) in [
            ("sm", self.strip_metadata),
            ("kcr", self.keep_copyright),
            ("scp", self.strip_color_profile),
            ("prog", self.progressive),
        ] {
            if let Some(v) = v {
                put(format_args!("{name}:{}", u8::from(v)));
            }
        }
        if self.quality > 0 {
            put(format_args!("q:{}", self.quality));
        }
        if !self.format_quality.is_empty() {
            put(format_args!("fq:{:?}", self.format_quality));
        }
        if self.max_bytes > 0 {
            put(format_args!("mb:{}", self.max_bytes));
        }
        if let Some(f) = self.format {
            put(format_args!("f:{f:?}"));
        }
        if !self.skip_processing.is_empty() {
            put(format_args!("skp:{:?}", self.skip_processing));
        }
        if !self.cache_buster.is_empty() {
            put(format_args!("cb:{}", self.cache_buster));
        }
        if let Some(f) = &self.filename {
            put(format_args!("fn:{f:?}"));
        }
        if self.attachment {
            put(format_args!("att"));
        }
        if self.raw {
            put(format_args!("raw"));
        }
        if self.security.any() {
            put(format_args!("sec:{:?}", self.security));
        }
        s
    }

    /// The device pixel ratio, 1.0 when not given.
    pub fn dpr(&self) -> f64 {
        if self.dpr > 0.0 {
            self.dpr
        } else {
            1.0
        }
    }

    /// The zoom factors, 1.0 when not given.
    pub fn zoom(&self) -> (f64, f64) {
        let z = |v: f64| if v > 0.0 { v } else { 1.0 };
        (z(self.zoom.0), z(self.zoom.1))
    }
}

fn gravity_key(g: &Gravity) -> String {
    format!("{:?}:{}:{}", g.kind, g.x, g.y)
}

fn positive(name: &str, v: &str) -> Result<f64, OptionError> {
    let f = float(name, v, MAX_FACTOR)?;
    if f == 0.0 {
        return Err(bad(name, "must be above 0"));
    }
    Ok(f)
}

fn quality(name: &str, v: &str) -> Result<u8, OptionError> {
    v.parse::<u8>()
        .ok()
        .filter(|q| *q <= 100)
        .ok_or_else(|| bad(name, format!("`{v}` is not a quality (0 to 100)")))
}

/// The single argument of `name`, parsed by `f`.
fn one<T>(
    name: &str,
    args: &[&str],
    f: impl Fn(&str, &str) -> Result<T, OptionError>,
) -> Result<T, OptionError> {
    match args {
        [v] => f(name, v),
        [] => Err(bad(name, "an argument is required")),
        _ => Err(bad(name, format!("one argument, {} given", args.len()))),
    }
}

/// A list of imgproxy options as a URL path writes them (`rs:fill:100:100/q:80`), checked when
/// parsed: what an imgproxy preset (`images.imgproxy.presets`) holds. A preset cannot name
/// another preset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionList(Vec<(String, Vec<String>)>);

impl OptionList {
    /// Parses and checks `s` (options separated by `/`; `:` or imgproxy's `,`-free form).
    pub fn parse(s: &str) -> Result<OptionList, OptionError> {
        let mut list = Vec::new();
        let mut check = Options::default();
        for seg in s.split('/').filter(|p| !p.is_empty()) {
            let mut parts = seg.split(':');
            let name = parts.next().unwrap_or("");
            let args: Vec<&str> = parts.collect();
            check.apply(name, &args)?;
            list.push((
                name.to_string(),
                args.iter().map(|a| a.to_string()).collect(),
            ));
        }
        Ok(OptionList(list))
    }

    /// Applies these options to `o`, in order.
    pub fn apply_to(&self, o: &mut Options) -> Result<(), OptionError> {
        for (name, args) in &self.0 {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            o.apply(name, &args)?;
        }
        Ok(())
    }
}

impl<'de> Deserialize<'de> for OptionList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        OptionList::parse(&s).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(path: &str) -> Result<Options, OptionError> {
        let mut o = Options::default();
        OptionList::parse(path)?.apply_to(&mut o)?;
        Ok(o)
    }

    fn err(path: &str) -> String {
        opts(path).unwrap_err().name
    }

    #[test]
    fn resize_and_size() {
        let o = opts("rs:fill:100:200:1:1:so:5:6").unwrap();
        assert_eq!(o.resize, ResizeType::Fill);
        assert_eq!((o.width, o.height, o.enlarge), (100, 200, true));
        assert_eq!(
            o.extend,
            Some(Gravity {
                kind: GravityType::Compass(Compass::South),
                x: 5.0,
                y: 6.0
            })
        );
        let o = opts("s:50:60/rt:fill-down").unwrap();
        assert_eq!(
            (o.width, o.height, o.resize),
            (50, 60, ResizeType::FillDown)
        );
        // Empty arguments keep what was there.
        let o = opts("w:10/h:20/rs:force::30").unwrap();
        assert_eq!((o.width, o.height, o.resize), (10, 30, ResizeType::Force));
        let o = opts("resize:auto:1:2/width:3/height:4/mw:5/mh:6").unwrap();
        assert_eq!(
            (o.resize, o.width, o.height, o.min_width, o.min_height),
            (ResizeType::Auto, 3, 4, 5, 6)
        );
        assert_eq!(err("rs:cover:1:1"), "rs");
        assert_eq!(err("w:-1"), "w");
        assert_eq!(err("h:abc"), "h");
        assert_eq!(err("s:1:2:3"), "s");
    }

    #[test]
    fn factors_and_booleans() {
        let o = opts("dpr:2/z:1.5/el:true").unwrap();
        assert_eq!((o.dpr(), o.zoom(), o.enlarge), (2.0, (1.5, 1.5), true));
        assert_eq!(opts("z:2:3").unwrap().zoom(), (2.0, 3.0));
        assert_eq!(Options::default().dpr(), 1.0);
        assert_eq!(err("dpr:0"), "dpr");
        assert_eq!(err("dpr:9"), "dpr");
        assert_eq!(err("el:yes"), "el");
        assert_eq!(err("z:0"), "z");
    }

    #[test]
    fn gravity_crop_extend() {
        let o = opts("g:soea:10:0.2").unwrap();
        assert_eq!(
            o.gravity,
            Gravity {
                kind: GravityType::Compass(Compass::SouthEast),
                x: 10.0,
                y: 0.2
            }
        );
        assert_eq!(opts("g:sm").unwrap().gravity.kind, GravityType::Smart);
        assert_eq!(
            opts("g:fp:0.25:0.75").unwrap().gravity.kind,
            GravityType::FocusPoint(0.25, 0.75)
        );
        assert_eq!(err("g:up"), "g");
        assert_eq!(err("g:fp:2:0"), "g");
        assert_eq!(err("g:sm:1"), "g");
        let c = opts("c:100:50:nowe").unwrap().crop.unwrap();
        assert_eq!((c.width, c.height), (100.0, 50.0));
        assert_eq!(
            c.gravity.unwrap().kind,
            GravityType::Compass(Compass::NorthWest)
        );
        assert_eq!(opts("c:0.5:0.5").unwrap().crop.unwrap().gravity, None);
        assert_eq!(opts("ex:1").unwrap().extend, Some(Gravity::default()));
        assert_eq!(opts("ex:0").unwrap().extend, None);
        assert_eq!(
            opts("exar:1:no").unwrap().extend_aspect.unwrap().kind,
            GravityType::Compass(Compass::North)
        );
        // Smart gravity cannot place an extension.
        assert_eq!(err("ex:1:sm"), "ex");
    }

    #[test]
    fn padding_is_css_like() {
        assert_eq!(opts("pd:10").unwrap().padding, [10, 10, 10, 10]);
        assert_eq!(opts("pd:10:20").unwrap().padding, [10, 20, 10, 20]);
        assert_eq!(opts("pd:10:20:30").unwrap().padding, [10, 20, 30, 20]);
        assert_eq!(opts("padding:1:2:3:4").unwrap().padding, [1, 2, 3, 4]);
        assert_eq!(err("pd:1:2:3:4:5"), "pd");
    }

    #[test]
    fn orientation_colour_filters() {
        let o = opts("rot:-90/fl:1:0/ar:0").unwrap();
        assert_eq!(
            (o.rotate, o.flip, o.auto_rotate),
            (270, (true, false), Some(false))
        );
        assert_eq!(err("rot:45"), "rot");
        assert_eq!(opts("bg:255:0:10").unwrap().background, Some([255, 0, 10]));
        assert_eq!(opts("bg:ff000a").unwrap().background, Some([255, 0, 10]));
        assert_eq!(opts("bg:ff000a/bg:").unwrap().background, None);
        assert_eq!(err("bg:300:0:0"), "bg");
        assert_eq!(err("bg:red"), "bg");
        let o = opts("bl:2.5/sh:0.5/pix:8").unwrap();
        assert_eq!((o.blur, o.sharpen, o.pixelate), (2.5, 0.5, 8));
        assert_eq!(err("bl:x"), "bl");
        let t = opts("t:20:ffffff:1:0").unwrap().trim.unwrap();
        assert_eq!(
            (t.threshold, t.color, t.equal_hor),
            (20.0, Some([255; 3]), true)
        );
        let w = opts("wm:0.5:soea:10:20:0.3").unwrap().watermark.unwrap();
        assert_eq!(
            (w.opacity, w.position, w.scale),
            (0.5, WatermarkPosition::At(Compass::SouthEast), 0.3)
        );
        assert_eq!(
            opts("wm:1:re").unwrap().watermark.unwrap().position,
            WatermarkPosition::Replicate
        );
        assert_eq!(err("wm:2"), "wm");
    }

    /// Gravities and watermark positions print in cache keys as they did before [`Compass`]
    /// was split out of them (stored results keep their keys), and one placement serves both.
    #[test]
    fn compass_points_keep_their_keys_and_share_one_anchor() {
        let key = opts("g:noea:5:6/wm:0.5:sowe/c:10:10:fp:0.25:0.75")
            .unwrap()
            .key();
        for part in [
            "NorthEast:5:6",
            "position: SouthWest",
            "FocusPoint(0.25, 0.75)",
        ] {
            assert!(key.contains(part), "{part} in {key}");
        }
        assert!(!key.contains("Compass") && !key.contains("At("), "{key}");
        for h in 0..3 {
            for v in 0..3 {
                assert_eq!(Compass::from_sides(h, v).sides(), (h, v));
            }
        }
        // f64 for geometry, i64 (halves truncated) for watermarks: the same rule.
        assert_eq!(Compass::South.anchor((10.0, 7.0), (1.0, 2.0)), (6.0, 5.0));
        assert_eq!(Compass::South.anchor((10i64, 7), (1, 2)), (6, 5));
        assert_eq!(Compass::Center.anchor((7i64, -3), (0, 0)), (3, -1));
        assert_eq!(Compass::NorthWest.anchor((7i64, 7), (2, 3)), (2, 3));
    }

    #[test]
    fn output_options() {
        let o = opts("q:80/fq:webp:70:avif:50/mb:10000/f:webp/sm:1/kcr:0/scp:1").unwrap();
        assert_eq!(o.quality, 80);
        assert_eq!(
            o.format_quality,
            vec![(FormatChoice::Webp, 70), (FormatChoice::Avif, 50)]
        );
        assert_eq!((o.max_bytes, o.format), (10000, Some(FormatChoice::Webp)));
        assert_eq!(
            (o.strip_metadata, o.keep_copyright, o.strip_color_profile),
            (Some(true), Some(false), Some(true))
        );
        assert_eq!(opts("ext:jpg").unwrap().format, Some(FormatChoice::Jpeg));
        let o = opts("skp:jpg:png/cb:abc/exp:1700000000").unwrap();
        assert_eq!(
            o.skip_processing,
            vec![FormatChoice::Jpeg, FormatChoice::Png]
        );
        assert_eq!((o.cache_buster.as_str(), o.expires), ("abc", 1_700_000_000));
        assert_eq!(err("q:101"), "q");
        assert_eq!(err("fq:webp"), "fq");
        assert_eq!(err("f:bmp"), "f");
        assert_eq!(err("mb:-1"), "mb");
        assert_eq!(err("nope:1"), "nope");
        assert_eq!(err("pr:thumb"), "pr");
    }

    #[test]
    fn presets_expand_in_place() {
        let mut presets = BTreeMap::new();
        presets.insert(
            "thumb".to_string(),
            OptionList::parse("rs:fill:100:100/q:80").unwrap(),
        );
        let mut o = Options::default();
        o.apply_with("pr", &["thumb"], &presets).unwrap();
        o.apply_with("q", &["90"], &presets).unwrap();
        assert_eq!((o.width, o.quality), (100, 90));
        assert_eq!(o.presets, vec!["thumb".to_string()]);
        assert_eq!(
            o.apply_with("pr", &["nope"], &presets).unwrap_err().name,
            "pr"
        );
        assert_eq!(OptionList::parse("rs:fill/pr:x").unwrap_err().name, "pr");
    }

    #[test]
    fn key_is_normalized() {
        let a = opts("rs:fill:100:100/q:80").unwrap();
        let b = opts("q:80/w:100/h:100/rt:fill/exp:99").unwrap();
        assert_eq!(a.key(), b.key());
        assert_ne!(a.key(), opts("rs:fill:100:100/q:81").unwrap().key());
        assert_ne!(a.key(), opts("rs:fill:100:100/q:80/cb:2").unwrap().key());
        assert_eq!(Options::default().key(), "fit:0:0");
    }

    #[test]
    fn security_options_refuse_what_imgproxy_refuses() {
        let o = opts("maf:3/mrd:0/msfs:100").unwrap();
        assert_eq!(o.security.max_animation_frames, Some(3));
        assert_eq!(o.security.max_src_file_size, Some(100));
        // `mrd:0` keeps the route's limit.
        assert_eq!(o.security.max_result_dimension, None);
        assert_eq!(err("maf:0"), "maf");
        assert_eq!(err("max_animation_frames:0"), "max_animation_frames");
        assert_eq!(opts("msfs:0").unwrap().security.max_src_file_size, None);
        assert_eq!(err("msfs:-1"), "msfs");
    }
}
