//! The processing options of an image proxy request, whichever URL grammar wrote them
//! (imgproxy's `/rs:fill:100:100/g:sm/plain/...`, thumbor's `/100x100/smart/...`): one plain
//! struct, as imgproxy's `ProcessingOptions`, which the pipeline (`crate::images::pipeline`)
//! executes step by step. Plain data in config because imgproxy presets
//! (`images.imgproxy.presets`) are written in imgproxy's option grammar and checked at load; the
//! grammar of one option (`name:arg:arg`) is [`Options::apply`], used by both the presets and
//! the request parser (`crate::images::imgproxy`).

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

/// Where a crop (or an extension, or a watermark) is anchored (imgproxy's gravity `g`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum GravityType {
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
    /// Chosen by content (`crate::images::smart`, libvips's attention strategy).
    Smart,
    /// A focus point, as fractions of the width and height (0.0-1.0).
    FocusPoint(f64, f64),
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WatermarkPosition {
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
    /// Repeated over the whole image.
    Replicate,
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
    /// The presets applied, in order (for the access log).
    pub presets: Vec<String>,
}

/// An option that failed to parse: 400 naming it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("option `{name}`: {reason}")]
pub struct OptionError {
    pub name: String,
    pub reason: String,
}

impl Options {
    /// Applies one imgproxy option, `name` with its colon-separated `args` (`rs`, `["fill",
    /// "100", "100"]`): full names and short ones, as imgproxy's processing options page lists
    /// them. Presets (`pr`) are expanded by the caller, which holds them.
    pub fn apply(&mut self, name: &str, args: &[&str]) -> Result<(), OptionError> {
        let _ = (name, args);
        Err(OptionError {
            name: name.to_string(),
            reason: "not implemented yet".into(),
        })
    }

    /// The normalized form of these options, independent of how the URL wrote them: part of
    /// the cache key of a result, so that equal options share one entry.
    pub fn key(&self) -> String {
        format!("{self:?}")
    }
}
