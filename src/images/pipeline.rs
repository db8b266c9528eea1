//! The image proxy's pipeline: [`Options`] (whichever grammar wrote them) executed on one
//! original, in imgproxy's order, pure and synchronous (it runs on the blocking pool).
//!
//! ```text
//! trim → prepare (orientation: EXIF + rotate + flip, one turn; scale from the header) →
//! scale-on-load (JPEG DCT scaling, band of rows) → crop `c` → scale → crop to result →
//! filters (blur, sharpen, pixelate, grayscale) → extend → extend aspect ratio → padding →
//! flatten → watermark → finalize (encode; lower quality until `mb` fits)
//! ```
//!
//! Geometry is worked out in the coordinates of the *turned* source (imgproxy's: sizes and
//! gravities mean the output's orientation), so the decoded image is turned first (when it is
//! turned at all) and then cropped and scaled in one SIMD resize ([`super::transform`]'s
//! decode, band and resize, shared with zimg's API; the decode may be one the route kept,
//! [`super::decoded`]). [`prepare`] plans from the header alone,
//! refuses requests over the route's limits (400/422) and estimates memory and cost (the pool
//! admits by them); [`run`] does the work. An animated source whose output animates (GIF,
//! WebP) runs every frame through the same steps with the first frame's layout
//! ([`super::animation`]); other outputs take its first frame.

use std::time::{Duration, Instant};

use super::animation;
use super::codec;
use super::decoded;
use super::filters;
use super::metadata;
use super::params::Target;
use super::raster::{Limits, Raster};
use super::smart;
use super::sniff::{ImageFormat, Probe};
use super::transform::{self, Plan, Shape, TransformError};
use crate::config::image_options::{Compass, Gravity, GravityType, Options, ResizeType};
use crate::config::image_params::FormatChoice;

/// The geometry of one request, in the turned source's pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Geometry {
    /// The crop `c` (the whole source without one): left, top, width, height.
    pub crop: (f64, f64, f64, f64),
    /// The scale applied to the crop, horizontal and vertical.
    pub scale: (f64, f64),
    /// The scaled crop's size.
    pub scaled: (u32, u32),
    /// The result cut out of the scaled crop: left, top (scaled pixels) and size.
    pub result: (f64, f64, u32, u32),
    /// The canvas after extend and extend-aspect-ratio, and the result's place on it.
    pub canvas: (u32, u32, u32, u32),
    /// The final size, padding included.
    pub out: (u32, u32),
    /// Padding in output pixels: top, right, bottom, left.
    pub padding: [u32; 4],
    /// The crop's or the result's position is chosen by content once decoded.
    pub smart_crop: bool,
    pub smart_result: bool,
}

impl Geometry {
    /// The region of the turned source that becomes the result, and the result's size.
    pub fn plan(&self) -> Plan {
        let (cx, cy, _, _) = self.crop;
        let (x, y, w, h) = self.result;
        Plan {
            crop: (
                cx + x / self.scale.0,
                cy + y / self.scale.1,
                f64::from(w) / self.scale.0,
                f64::from(h) / self.scale.1,
            ),
            out: (w, h),
        }
    }
}

/// `v` rounded, at least 1.
fn px(v: f64) -> u32 {
    (v.round().clamp(1.0, f64::from(u32::MAX))) as u32
}

/// The top-left corner of an `inner` box placed in an `outer` one by `g`, kept inside (offsets:
/// pixels × `offset_scale` when at least 1, fractions of the outer size below 1).
fn anchor(g: &Gravity, outer: (f64, f64), inner: (f64, f64), offset_scale: f64) -> (f64, f64) {
    let off = |v: f64, size: f64| {
        if v.abs() < 1.0 {
            v * size
        } else {
            v * offset_scale
        }
    };
    let (ox, oy) = (off(g.x, outer.0), off(g.y, outer.1));
    let (fw, fh) = (outer.0 - inner.0, outer.1 - inner.1);
    let (x, y) = match g.kind {
        GravityType::Compass(c) => c.anchor((fw, fh), (ox, oy)),
        // Placed by the smart crop's own search where it applies; centred otherwise.
        GravityType::Smart => Compass::Center.anchor((fw, fh), (ox, oy)),
        GravityType::FocusPoint(fx, fy) => {
            (fx * outer.0 - inner.0 / 2.0, fy * outer.1 - inner.1 / 2.0)
        }
    };
    (x.clamp(0.0, fw.max(0.0)), y.clamp(0.0, fh.max(0.0)))
}

/// The EXIF orientation code (1-8) of the source's own orientation (`exif`, when applied)
/// followed by a clockwise rotation and flips: one turn of the decoded image does them all.
pub fn orientation(exif: u8, auto_rotate: bool, rotate: u16, flip: (bool, bool)) -> u8 {
    // A code as (clockwise quarter turns, then a horizontal flip), transform.rs's `orient`.
    let from = |c: u8| match c {
        2 => (0, true),
        3 => (2, false),
        4 => (2, true),
        5 => (1, true),
        6 => (1, false),
        7 => (3, true),
        8 => (3, false),
        _ => (0, false),
    };
    let (mut r, mut f) = from(if auto_rotate { exif } else { 1 });
    // Rotating after a flip turns the other way: rot(θ)∘flip = flip∘rot(−θ).
    let turn = |r: &mut u32, f: bool, q: u32| {
        *r = if f {
            (*r + 4 - q % 4) % 4
        } else {
            (*r + q) % 4
        }
    };
    turn(&mut r, f, u32::from(rotate / 90));
    if flip.0 {
        f = !f;
    }
    if flip.1 {
        // A vertical flip is a half turn then a horizontal flip.
        turn(&mut r, f, 2);
        f = !f;
    }
    match (r, f) {
        (0, false) => 1,
        (0, true) => 2,
        (2, false) => 3,
        (2, true) => 4,
        (1, true) => 5,
        (1, false) => 6,
        (3, true) => 7,
        _ => 8,
    }
}

/// Plans `o` for a `sw`×`sh` turned source: 400 (naming the option) when the result would be
/// wider or taller than `limits.max_dim`. Enlarging is bounded by the route's `max_upscale`
/// (with `enlarge`) or forbidden (without, as imgproxy).
pub fn geometry(
    sw: u32,
    sh: u32,
    o: &Options,
    limits: &Limits,
) -> Result<Geometry, TransformError> {
    let (fw, fh) = (f64::from(sw.max(1)), f64::from(sh.max(1)));
    let dpr = o.dpr();
    let (zx, zy) = o.zoom();

    // The crop `c`: pixels, or fractions of the source below 1; 0 is the whole side.
    let mut smart_crop = false;
    let crop = match &o.crop {
        None => (0.0, 0.0, fw, fh),
        Some(c) => {
            let side = |v: f64, full: f64| {
                if v <= 0.0 {
                    full
                } else if v < 1.0 {
                    (v * full).max(1.0)
                } else {
                    v.min(full)
                }
            };
            let (cw, ch) = (side(c.width, fw).round(), side(c.height, fh).round());
            let g = c.gravity.unwrap_or(o.gravity);
            smart_crop = g.kind == GravityType::Smart;
            let (x, y) = anchor(&g, (fw, fh), (cw, ch), 1.0);
            (x.round(), y.round(), cw, ch)
        }
    };
    let (bw, bh) = (crop.2, crop.3);

    // The scale (imgproxy's calcScale), as shrink factors first.
    let dst = |v: u32, f: f64| (f64::from(v) * f).round();
    let (dw, dh) = (dst(o.width, dpr * zx), dst(o.height, dpr * zy));
    let mut ws = if dw > 0.0 { bw / dw } else { 1.0 };
    let mut hs = if dh > 0.0 { bh / dh } else { 1.0 };
    if dw == 0.0 && dh == 0.0 {
        // No size: dpr and zoom scale the source.
        (ws, hs) = (1.0 / (dpr * zx), 1.0 / (dpr * zy));
    } else if ws != 1.0 || hs != 1.0 {
        let mut rt = o.resize;
        if rt == ResizeType::Auto {
            let same = (bw >= bh) == (dw >= dh);
            rt = if same {
                ResizeType::Fill
            } else {
                ResizeType::Fit
            };
        }
        match rt {
            _ if o.width == 0 && rt != ResizeType::Force => ws = hs,
            _ if o.height == 0 && rt != ResizeType::Force => hs = ws,
            ResizeType::Fit => (ws, hs) = (ws.max(hs), ws.max(hs)),
            ResizeType::Fill | ResizeType::FillDown => (ws, hs) = (ws.min(hs), ws.min(hs)),
            _ => {}
        }
    }
    let (mut wk, mut hk) = (1.0 / ws, 1.0 / hs);
    // Enlarging: never without `enlarge`, at most `max_upscale` with it.
    let bound = |wk: &mut f64, hk: &mut f64, limit: f64| {
        if *wk > limit {
            *hk *= limit / *wk;
            *wk = limit;
        }
        if *hk > limit {
            *wk *= limit / *hk;
            *hk = limit;
        }
    };
    let enlarge = if o.enlarge { limits.max_upscale } else { 1.0 };
    bound(&mut wk, &mut hk, enlarge);
    // Minimum sizes may enlarge (imgproxy's min-width/min-height), within the route's bound.
    let (mw, mh) = (dst(o.min_width, dpr * zx), dst(o.min_height, dpr * zy));
    if mw > 0.0 && bw * wk < mw {
        let f = mw / (bw * wk);
        (wk, hk) = (wk * f, hk * f);
    }
    if mh > 0.0 && bh * hk < mh {
        let f = mh / (bh * hk);
        (wk, hk) = (wk * f, hk * f);
    }
    bound(&mut wk, &mut hk, limits.max_upscale);
    let scaled = (px(bw * wk), px(bh * hk));
    // The scale as the resize really does it (whole pixels).
    let scale = (f64::from(scaled.0) / bw, f64::from(scaled.1) / bh);

    // Crop to the result (fill, and a `min-width` overshoot): the requested size at most.
    let (mut rw, mut rh) = (
        if dw > 0.0 { dw } else { f64::from(scaled.0) },
        if dh > 0.0 { dh } else { f64::from(scaled.1) },
    );
    if o.resize == ResizeType::FillDown && !o.enlarge {
        let (sx, sy) = (rw / f64::from(scaled.0), rh / f64::from(scaled.1));
        if sx > sy && sx > 1.0 {
            rh = (f64::from(scaled.0) * rh / rw).round();
            rw = f64::from(scaled.0);
        } else if sy > sx && sy > 1.0 {
            rw = (f64::from(scaled.1) * rw / rh).round();
            rh = f64::from(scaled.1);
        }
    }
    let (rw, rh) = (
        px(rw.min(f64::from(scaled.0))),
        px(rh.min(f64::from(scaled.1))),
    );
    let smart_result = o.gravity.kind == GravityType::Smart;
    let (rx, ry) = anchor(
        &o.gravity,
        (f64::from(scaled.0), f64::from(scaled.1)),
        (f64::from(rw), f64::from(rh)),
        dpr,
    );
    let result = (rx.round(), ry.round(), rw, rh);

    // Extend to the requested size, then to its aspect ratio.
    let mut canvas = (rw, rh, 0, 0);
    if let Some(g) = &o.extend {
        let (cw, ch) = (rw.max(dw as u32), rh.max(dh as u32));
        canvas = place(g, (cw, ch), canvas, dpr);
    }
    if let Some(g) = &o.extend_aspect {
        if dw > 0.0 && dh > 0.0 {
            let (cw, ch) = (f64::from(canvas.0), f64::from(canvas.1));
            let want = dw / dh;
            let size = if cw / ch < want {
                (px(ch * want), canvas.1)
            } else {
                (canvas.0, px(cw / want))
            };
            canvas = place(g, size, canvas, dpr);
        }
    }
    let padding = o.padding.map(|p| (f64::from(p) * dpr).round() as u32);
    let out = (
        u64::from(canvas.0) + u64::from(padding[1]) + u64::from(padding[3]),
        u64::from(canvas.1) + u64::from(padding[0]) + u64::from(padding[2]),
    );
    let max = u64::from(limits.max_dim);
    for (v, name, side) in [(out.0, "width", "wide"), (out.1, "height", "tall")] {
        if v > max {
            return Err(TransformError::Param(
                name,
                format!("the result would be {v} pixels {side}, more than this route's {max}"),
            ));
        }
    }
    Ok(Geometry {
        crop,
        scale,
        scaled,
        result,
        canvas,
        out: (out.0 as u32, out.1 as u32),
        padding,
        smart_crop,
        smart_result,
    })
}

/// A `size` canvas holding the previous canvas's image (`prev`: its canvas size and the
/// image's place on it), the image placed by `g`.
fn place(
    g: &Gravity,
    size: (u32, u32),
    prev: (u32, u32, u32, u32),
    dpr: f64,
) -> (u32, u32, u32, u32) {
    let (iw, ih) = (prev.0, prev.1);
    let (x, y) = anchor(
        g,
        (f64::from(size.0), f64::from(size.1)),
        (f64::from(iw), f64::from(ih)),
        dpr,
    );
    (
        size.0,
        size.1,
        prev.2 + x.round() as u32,
        prev.3 + y.round() as u32,
    )
}

/// A request decided from the header and the options alone, before any pixel is decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    pub geometry: Geometry,
    /// The decoded image's turn (an EXIF code, 1-8).
    pub orientation: u8,
    pub format: ImageFormat,
    pub quality: u8,
    need: (u32, u32),
    rows: (f64, f64),
    gray: bool,
    /// Peak heap bytes, estimated.
    pub memory: u64,
    /// CPU cost in weighted pixels (the pool's fair order).
    pub cost: u64,
}

/// The choice of the options' format enum for a format.
fn choice(f: ImageFormat) -> FormatChoice {
    match f {
        ImageFormat::Jpeg => FormatChoice::Jpeg,
        ImageFormat::Png => FormatChoice::Png,
        ImageFormat::Gif => FormatChoice::Gif,
        ImageFormat::Webp => FormatChoice::Webp,
        ImageFormat::Avif => FormatChoice::Avif,
        ImageFormat::Jxl => FormatChoice::Jxl,
        // Not a format asked for: `skp:heic` is refused by the grammar.
        ImageFormat::Heic => FormatChoice::Keep,
    }
}

/// Whether `o` asks for `source`-format originals untouched (`skp`).
pub fn skipped(o: &Options, source: ImageFormat) -> bool {
    o.raw || o.skip_processing.contains(&choice(source))
}

/// Plans `o` for a source probed as `probe` with the output `target` (from `f`, the route's
/// default and Accept): 422 for a source over the limits, 400 for a result over them.
pub fn prepare(
    probe: &Probe,
    o: &Options,
    target: Target,
    default_quality: u8,
    limits: &Limits,
) -> Result<Prepared, TransformError> {
    codec::check_limits(probe, limits)?;
    let orientation = orientation(
        probe.orientation,
        o.auto_rotate.unwrap_or(true),
        o.rotate,
        o.flip,
    );
    let (sw, sh) = transform::oriented_size(probe, orientation);
    let geometry = geometry(sw, sh, o, limits)?;
    let plan = geometry.plan();
    let (mut need, mut rows) = transform::window(probe, orientation, &plan);
    if o.trim.is_some() {
        // The border is found in the whole image at full size.
        (need, rows) = ((probe.width, probe.height), (0.0, 1.0));
    } else if geometry.smart_crop || geometry.smart_result {
        // Content is looked at beyond the rows kept.
        rows = (0.0, 1.0);
    }
    let format = transform::encodable_format(
        target.output(probe.format),
        matches!(target, Target::Auto(_)),
        geometry.out,
        probe.format,
        limits,
        "format",
    )?;
    let quality = match o.quality {
        0 => o
            .format_quality
            .iter()
            .find(|(f, _)| *f == choice(format))
            .map_or(default_quality, |(_, q)| *q),
        q => q,
    };
    let colourful = o.background.is_some()
        || o.watermark.is_some()
        || o.extend.is_some()
        || o.extend_aspect.is_some()
        || o.padding != [0; 4];
    let gray = o.grayscale && !colourful;
    let (ow, oh) = (geometry.out.0, geometry.out.1);
    let canvases = 4 * u64::from(ow) * u64::from(oh) * 2;
    let shape = Shape {
        need,
        out: plan.out,
        encoded: (ow, oh),
        gray,
        format,
        reoriented: orientation > 1,
        extra: canvases,
        encodes: if o.max_bytes > 0 { 3 } else { 1 },
    };
    let (mut memory, mut cost) = transform::estimate(probe, &shape, limits);
    if animation::animates(probe, format) {
        // Every frame is decoded and transformed, and all results are held for the encoder.
        memory += animation::memory(probe, geometry.out);
        cost = cost.saturating_mul(u64::from(probe.frames));
    }
    Ok(Prepared {
        geometry,
        orientation,
        format,
        quality,
        need,
        rows,
        gray,
        memory,
        cost,
    })
}

/// Most encodes tried to fit `mb` (quality falls each time, as imgproxy's).
const MAX_BYTES_TRIES: u32 = 8;

/// The time of a stage, when timed: reads the clock only with `Some` (metrics on).
fn lap(t: &mut Option<Instant>, into: Option<&mut Duration>) {
    if let (Some(start), Some(d)) = (t.as_mut(), into) {
        let now = Instant::now();
        *d += now - *start;
        *start = now;
    }
}

/// Runs `p` (made by [`prepare`] from `o`) on `src`; `mark` is the route's watermark image. An
/// animation kept by the output runs frame by frame ([`animation`]), every frame with the
/// first frame's layout (trim box, smart positions). `keep`: the route's kept decoded
/// originals ([`decoded`]).
///
/// With `timing` (the route's metrics are on), the time of its stages is added there: decode
/// (and the orientation turn), resize (layout, crop and scale, filters, canvas, watermark) and
/// encode (with `mb`'s retries and the metadata); an animation's frames are decoded and resized
/// in turns: resize is the time in its frames' steps, decode the rest. Without, no clock is
/// read.
#[allow(clippy::too_many_arguments)]
pub fn run(
    src: &[u8],
    probe: &Probe,
    o: &Options,
    p: &Prepared,
    mark: Option<&Raster>,
    limits: &Limits,
    mut timing: Option<&mut transform::Timing>,
    keep: Option<&decoded::Keep<'_>>,
) -> Result<Vec<u8>, TransformError> {
    let mut t = timing.is_some().then(Instant::now);
    if animation::animates(probe, p.format) {
        let mut first: Option<Layout> = None;
        let mut steps = Duration::ZERO;
        let anim = animation::map_frames(src, probe, limits, |frame| {
            let mut start = t.map(|_| Instant::now());
            let frame = transform::orient(frame, p.orientation);
            let out = match &first {
                Some(l) => render(l.trimmed(frame), 0, l, o, p, mark),
                None => {
                    let (frame, l) = layout(frame, 0, probe, o, p, limits)?;
                    render(frame, 0, first.insert(l), o, p, mark)
                }
            };
            lap(&mut start, Some(&mut steps));
            out
        })?;
        if let Some(tm) = timing.as_deref_mut() {
            lap(&mut t, Some(&mut tm.decode));
            tm.decode = tm.decode.saturating_sub(steps);
            tm.resize += steps;
        }
        let out = encode(p.format, p.quality, o.max_bytes, |q| {
            animation::encode(&anim, p.format, q)
        });
        lap(&mut t, timing.map(|tm| &mut tm.encode));
        return out;
    }
    // A kept profile (scp:0) must be one the output carries and fit its pixels.
    let keep_icc = metadata::keeps_icc(o)
        && !p.gray
        && !o.grayscale
        && matches!(
            p.format,
            ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::Webp
        );
    let want = decoded::Want {
        need: p.need,
        gray: p.gray,
        rows: p.rows,
        keep_icc,
    };
    let codec::Decoded { raster, band, icc } = decoded::decode(keep, src, probe, want, limits)?;
    let (img, top) = (transform::orient(raster, p.orientation), band.top);
    lap(&mut t, timing.as_deref_mut().map(|tm| &mut tm.decode));
    let (img, l) = layout(img, top, probe, o, p, limits)?;
    let img = render(img, top, &l, o, p, mark)?;
    lap(&mut t, timing.as_deref_mut().map(|tm| &mut tm.resize));
    let kept = metadata::keep(src, probe.format, o, icc);
    let out = |quality| codec::Output {
        quality,
        avif_speed: limits.avif_speed,
        avif_encoder: limits.avif_encoder,
        bg: codec::WHITE,
        icc: None,
        progressive: limits.jpeg_progressive,
        // AVIF's container is written by its encoder; the others' by `embed`.
        exif: kept
            .exif
            .as_deref()
            .filter(|_| p.format == ImageFormat::Avif),
    };
    let out = encode(p.format, p.quality, o.max_bytes, |q| {
        codec::encode_with(&img, p.format, &out(q))
    })?;
    let out = metadata::embed(out, p.format, &kept);
    lap(&mut t, timing.map(|tm| &mut tm.encode));
    Ok(out)
}

/// Where the result comes from in a decoded image: the geometry once trimmed and smart
/// positions are known, the trim box, and the width of the source the geometry is in.
struct Layout {
    g: Geometry,
    trim: Option<(u32, u32, u32, u32)>,
    source_w: u32,
}

impl Layout {
    /// `img` cut to the trim box.
    fn trimmed(&self, img: Raster) -> Raster {
        match self.trim {
            Some(b) => sub(&img, b),
            None => img,
        }
    }
}

/// The layout found in `img` (decoded and turned, its rows from `top`), and `img` trimmed.
fn layout(
    mut img: Raster,
    top: u32,
    probe: &Probe,
    o: &Options,
    p: &Prepared,
    limits: &Limits,
) -> Result<(Raster, Layout), TransformError> {
    let (ow, _) = transform::oriented_size(probe, p.orientation);
    let mut l = Layout {
        g: p.geometry,
        trim: None,
        source_w: ow,
    };
    if let Some(t) = &o.trim {
        let (x, y, w, h) = filters::trim_box(&img, t);
        if (w, h) != (img.width, img.height) && w > 0 && h > 0 {
            l.trim = Some((x, y, w, h));
            img = sub(&img, (x, y, w, h));
            l.g = geometry(w, h, o, limits)?;
            l.source_w = w;
        }
    }
    let (g, source_w) = (&mut l.g, l.source_w);
    // Smart positions, from the decoded pixels (k: decoded pixels per source pixel).
    let k = f64::from(img.width) / f64::from(source_w);
    if g.smart_crop {
        let (w, h) = ((g.crop.2 * k).round() as u32, (g.crop.3 * k).round() as u32);
        let (x, y) = smart::attention(&img, w.max(1), h.max(1));
        g.crop.0 = (f64::from(x) / k).round();
        g.crop.1 = (f64::from(y) / k).round();
    }
    if g.smart_result {
        let region = transform::in_decoded(g.crop, &img, top, source_w);
        let part = sub(
            &img,
            (
                region.0 as u32,
                region.1 as u32,
                (region.2 as u32).max(1),
                (region.3 as u32).max(1),
            ),
        );
        let win = (
            (f64::from(g.result.2) / g.scale.0 * k).round() as u32,
            (f64::from(g.result.3) / g.scale.1 * k).round() as u32,
        );
        let (x, y) = smart::attention(&part, win.0.max(1), win.1.max(1));
        g.result.0 = (f64::from(x) / k * g.scale.0).round();
        g.result.1 = (f64::from(y) / k * g.scale.1).round();
    }
    Ok((img, l))
}

/// `img` (trimmed, its rows from `top`) made into the result by `l`: cropped and scaled,
/// filtered, extended, padded, flattened, watermarked; not yet encoded.
fn render(
    img: Raster,
    top: u32,
    l: &Layout,
    o: &Options,
    p: &Prepared,
    mark: Option<&Raster>,
) -> Result<Raster, TransformError> {
    let g = &l.g;
    let plan = g.plan();
    let crop = transform::in_decoded(plan.crop, &img, top, l.source_w);
    let mut img = transform::resize(img, crop, plan.out)?;

    if o.blur > 0.0 {
        img = filters::blur(&img, o.blur);
    }
    if o.sharpen > 0.0 {
        img = filters::sharpen(&img, o.sharpen);
    }
    if o.pixelate > 0 {
        img = filters::pixelate(&img, o.pixelate);
    }
    // Only a JPEG decoder makes gray pixels itself (`p.gray`); the others give colour.
    if o.grayscale && (!p.gray || img.channels != 1) {
        img = img.to_gray();
    }
    let (cw, ch, cx, cy) = g.canvas;
    if (cw, ch) != (img.width, img.height) {
        img = filters::place(&img, cw, ch, cx, cy, o.background);
    }
    if g.padding != [0; 4] {
        let [t, r, b, l] = g.padding;
        img = filters::place(&img, cw + l + r, ch + t + b, l, t, o.background);
    }
    if img.channels == 4 && (o.background.is_some() || p.format == ImageFormat::Jpeg) {
        img = filters::flatten(&img, o.background.unwrap_or([255, 255, 255]));
    }
    if let (Some(wm), Some(mark)) = (&o.watermark, mark) {
        filters::watermark(&mut img, mark, wm);
    }
    Ok(img)
}

/// Encodes at `quality`, then lower while the result is over `max_bytes` (0: no limit):
/// imgproxy's steps (¼, ½ or ¾ of the quality by how far over), at most [`MAX_BYTES_TRIES`]
/// encodes, never below quality 10; the last try is returned when nothing fits.
fn encode(
    format: ImageFormat,
    quality: u8,
    max_bytes: u64,
    mut at: impl FnMut(u8) -> Result<Vec<u8>, codec::CodecError>,
) -> Result<Vec<u8>, TransformError> {
    let mut q = quality.max(1);
    let mut tries = 0;
    loop {
        let out = at(q)?;
        tries += 1;
        let len = out.len() as u64;
        let lossy = matches!(
            format,
            ImageFormat::Jpeg | ImageFormat::Webp | ImageFormat::Avif | ImageFormat::Jxl
        );
        if max_bytes == 0 || len <= max_bytes || !lossy || q <= 10 || tries >= MAX_BYTES_TRIES {
            return Ok(out);
        }
        let over = len as f64 / max_bytes as f64;
        let step = if over > 3.0 {
            0.25
        } else if over > 1.5 {
            0.5
        } else {
            0.75
        };
        q = ((f64::from(q) * step) as u8).max(10);
    }
}

/// The `(x, y, w, h)` part of `img` (clamped to it), copied.
fn sub(img: &Raster, (x, y, w, h): (u32, u32, u32, u32)) -> Raster {
    let x = x.min(img.width.saturating_sub(1));
    let y = y.min(img.height.saturating_sub(1));
    let w = w.min(img.width - x).max(1);
    let h = h.min(img.height - y).max(1);
    if (x, y, w, h) == (0, 0, img.width, img.height) {
        return img.clone();
    }
    let c = usize::from(img.channels);
    let row = img.width as usize * c;
    let mut data = Vec::with_capacity(w as usize * h as usize * c);
    for r in y..y + h {
        let start = r as usize * row + x as usize * c;
        data.extend_from_slice(&img.data[start..start + w as usize * c]);
    }
    Raster {
        width: w,
        height: h,
        channels: img.channels,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::image_options::OptionList;

    const LIMITS: Limits = Limits {
        max_frames: 1,
        max_animation_pixels: 500_000_000,
        ..Limits::DEFAULT
    };

    fn opts(s: &str) -> Options {
        let mut o = Options::default();
        OptionList::parse(s).unwrap().apply_to(&mut o).unwrap();
        o
    }

    fn out(sw: u32, sh: u32, s: &str) -> (u32, u32) {
        geometry(sw, sh, &opts(s), &LIMITS).unwrap().out
    }

    /// thumbor's `grayscale()` on a PNG: only a JPEG decoder makes gray pixels itself, and the
    /// step was skipped for every source when the plan decoded "gray" (PNG, GIF, WebP and AVIF
    /// stayed in colour).
    #[test]
    fn regression_grayscale_of_a_png_is_gray() {
        let red = Raster {
            width: 8,
            height: 8,
            channels: 3,
            data: [200, 30, 30].repeat(64),
        };
        let src = codec::encode(&red, ImageFormat::Png, 75).unwrap();
        let probe = crate::images::sniff::probe(&src).unwrap();
        let o = Options {
            grayscale: true,
            ..Options::default()
        };
        let p = prepare(&probe, &o, Target::Keep, 75, &LIMITS).unwrap();
        let out = run(&src, &probe, &o, &p, None, &LIMITS, None, None).unwrap();
        let back = crate::images::sniff::probe(&out).unwrap();
        let (img, _) = codec::decode(&out, &back, (8, 8), false, (0.0, 1.0), &LIMITS).unwrap();
        assert!(
            img.data
                .chunks_exact(usize::from(img.channels))
                .all(|px| px.len() < 3 || (px[0] == px[1] && px[1] == px[2])),
            "{:?}",
            &img.data[..4]
        );
    }

    /// Stages are timed when asked (the route's metrics are on), for a still image and for an
    /// animation (frames decoded and resized in turns), and the result is the same image.
    #[test]
    fn stages_are_timed_only_when_asked() {
        let still = codec::encode(
            &Raster {
                width: 32,
                height: 32,
                channels: 3,
                data: [200, 30, 30].repeat(32 * 32),
            },
            ImageFormat::Png,
            75,
        )
        .unwrap();
        let mut anim = Vec::new();
        {
            let mut e = gif::Encoder::new(&mut anim, 16, 16, &[255, 0, 0, 0, 0, 255]).unwrap();
            for index in [0u8, 1] {
                let f = gif::Frame::from_indexed_pixels(16, 16, vec![index; 256], None);
                e.write_frame(&f).unwrap();
            }
        }
        let limits = Limits {
            max_frames: 10,
            ..LIMITS
        };
        for (src, target) in [
            (still, Target::Fixed(ImageFormat::Webp)),
            (anim, Target::Fixed(ImageFormat::Gif)),
        ] {
            let probe = crate::images::sniff::probe(&src).unwrap();
            let o = opts("rs:fit:8:8/bl:1");
            let p = prepare(&probe, &o, target, 75, &limits).unwrap();
            let plain = run(&src, &probe, &o, &p, None, &limits, None, None).unwrap();
            let mut t = transform::Timing::default();
            let timed = run(&src, &probe, &o, &p, None, &limits, Some(&mut t), None).unwrap();
            assert_eq!(plain, timed, "{:?}", probe.format);
            for (stage, d) in [
                ("decode", t.decode),
                ("resize", t.resize),
                ("encode", t.encode),
            ] {
                assert!(d > Duration::ZERO, "{stage} of {:?}: {t:?}", probe.format);
            }
        }
    }

    #[test]
    fn resize_types() {
        assert_eq!(out(640, 856, "rs:fit:100:100"), (75, 100));
        assert_eq!(out(640, 856, "rs:fill:100:100"), (100, 100));
        assert_eq!(out(640, 856, "rs:force:100:100"), (100, 100));
        assert_eq!(out(640, 856, "rs:fit:100:0"), (100, 134));
        assert_eq!(out(640, 856, "rs:fit:0:100"), (75, 100));
        assert_eq!(out(640, 856, "rs:force:100:0"), (100, 856));
        // auto: fill when orientations agree (portrait in, portrait out), else fit.
        assert_eq!(out(640, 856, "rs:auto:100:150"), (100, 150));
        assert_eq!(out(640, 856, "rs:auto:150:100"), (75, 100));
        // Never enlarged without `el`: fill keeps what it has, fill-down the aspect ratio.
        assert_eq!(out(200, 150, "rs:fill:400:400"), (200, 150));
        assert_eq!(out(200, 150, "rs:fill-down:400:400"), (150, 150));
        assert_eq!(out(200, 150, "rs:fit:400:400"), (200, 150));
        assert_eq!(out(200, 100, "rs:fill:300:200"), (200, 100));
        assert_eq!(out(200, 100, "rs:fill-down:300:200"), (150, 100));
        assert_eq!(out(640, 856, "rs:fill:100:100/dpr:2"), (200, 200));
        assert_eq!(out(640, 856, "w:100/z:2"), (200, 268));
        assert_eq!(out(640, 856, "w:100/mw:200"), (100, 268));
        assert_eq!(out(640, 856, "c:320:428/w:100"), (100, 134));
    }

    #[test]
    fn enlarging_is_bounded_by_the_route() {
        let up = Limits {
            max_upscale: 2.0,
            ..LIMITS
        };
        let g = |s: &str| geometry(200, 150, &opts(s), &up).unwrap().out;
        assert_eq!(g("rs:fit:1000:1000"), (200, 150));
        assert_eq!(g("rs:fit:1000:1000/el:1"), (400, 300));
        assert_eq!(g("rs:fit:300:300/el:1"), (300, 225));
    }

    #[test]
    fn gravity_places_the_result() {
        let g = |s: &str| {
            let g = geometry(200, 100, &opts(s), &LIMITS).unwrap();
            (g.result.0, g.result.1)
        };
        assert_eq!(g("rs:fill:50:100"), (75.0, 0.0));
        assert_eq!(g("rs:fill:50:100/g:we"), (0.0, 0.0));
        assert_eq!(g("rs:fill:50:100/g:ea"), (150.0, 0.0));
        assert_eq!(g("rs:fill:50:100/g:we:10"), (10.0, 0.0));
        assert_eq!(g("rs:fill:50:100/g:ea:10"), (140.0, 0.0));
        assert_eq!(g("rs:fill:50:100/g:fp:0.9:0.5"), (150.0, 0.0));
        assert_eq!(g("rs:fill:50:100/g:fp:0.5:0.5"), (75.0, 0.0));
        // Offsets below 1 are fractions.
        assert_eq!(g("rs:fill:50:100/g:we:0.1"), (20.0, 0.0));
        let c = geometry(200, 100, &opts("c:50:50:soea"), &LIMITS).unwrap();
        assert_eq!(c.crop, (150.0, 50.0, 50.0, 50.0));
    }

    #[test]
    fn canvas_extend_and_padding() {
        let g = geometry(200, 100, &opts("rs:fit:300:300/ex:1"), &LIMITS).unwrap();
        assert_eq!((g.canvas, g.out), ((300, 300, 50, 100), (300, 300)));
        let g = geometry(200, 100, &opts("rs:fit:300:300/ex:1:no"), &LIMITS).unwrap();
        assert_eq!(g.canvas, (300, 300, 50, 0));
        let g = geometry(200, 100, &opts("rs:fit:100:100/exar:1"), &LIMITS).unwrap();
        assert_eq!(g.out, (100, 100));
        let g = geometry(200, 100, &opts("w:100/pd:10:20/dpr:2"), &LIMITS).unwrap();
        assert_eq!(g.out, (200 + 80, 100 + 40));
        assert!(matches!(
            geometry(200, 100, &opts("pd:5000"), &LIMITS),
            Err(TransformError::Param("width", _))
        ));
    }

    #[test]
    fn orientations_compose() {
        assert_eq!(orientation(1, true, 0, (false, false)), 1);
        assert_eq!(orientation(6, true, 0, (false, false)), 6);
        assert_eq!(orientation(6, false, 0, (false, false)), 1);
        assert_eq!(orientation(1, true, 90, (false, false)), 6);
        assert_eq!(orientation(6, true, 90, (false, false)), 3);
        assert_eq!(orientation(1, true, 0, (true, false)), 2);
        assert_eq!(orientation(1, true, 0, (false, true)), 4);
        assert_eq!(orientation(1, true, 0, (true, true)), 3);
        assert_eq!(orientation(1, true, 90, (true, false)), 5);
        // The pixels agree with the turns done one after another.
        let img = Raster {
            width: 3,
            height: 2,
            channels: 1,
            data: vec![1, 2, 3, 4, 5, 6],
        };
        for exif in 1..=8u8 {
            for rot in [0u16, 90, 180, 270] {
                for flip in [(false, false), (true, false), (false, true), (true, true)] {
                    let mut want = transform::orient(img.clone(), exif);
                    want = transform::rotate(&want, u32::from(rot));
                    if flip.0 {
                        want = transform::orient(want, 2);
                    }
                    if flip.1 {
                        want = transform::orient(want, 4);
                    }
                    let got = transform::orient(img.clone(), orientation(exif, true, rot, flip));
                    assert_eq!(got, want, "exif {exif} rot {rot} flip {flip:?}");
                }
            }
        }
    }
}
