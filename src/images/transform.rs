//! The transform pipeline, pure and synchronous (it runs on the blocking pool):
//! plan the geometry → decode (shrinking on load) → orient → crop+resize (SIMD) → rotate →
//! grayscale → encode. Decoding converts to sRGB (or keeps the source's profile, `keep_icc`);
//! encoding flattens alpha onto `bg` where the format has none; a `smart` crop is placed on
//! the content ([`super::smart`]); an animation the output keeps (GIF, WebP) runs frame by
//! frame with the first frame's crop ([`super::animation`]). [`prepare`] plans from the
//! header alone and estimates the peak memory and CPU cost (never enlarging past
//! `max_upscale`, holding AVIF output to its pixel cap); [`run`] returns the encoded bytes and
//! the time spent in each step.

use std::time::{Duration, Instant};

use fast_image_resize as fr;

use super::codec;
use super::params::{Mode, Resolved, Target};
use super::raster::{CodecError, Limits, Raster};
use super::sniff::{ImageFormat, Probe};

/// Why a transform could not be made (mapped to 400/422 by the handler).
#[derive(Debug, thiserror::Error)]
pub enum TransformError {
    /// The request asks for something out of bounds: 400 naming the parameter.
    #[error("parameter `{0}`: {1}")]
    Param(&'static str, String),
    #[error(transparent)]
    Codec(#[from] CodecError),
}

/// Where the time of one transform went.
#[derive(Debug, Default, Clone, Copy)]
pub struct Timing {
    pub decode: Duration,
    pub resize: Duration,
    pub encode: Duration,
}

/// The geometry of a transform, in the oriented source's coordinates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    /// Region of the source used: left, top, width, height.
    pub crop: (f64, f64, f64, f64),
    /// Size of that region after scaling.
    pub out: (u32, u32),
}

fn at_least_one(v: f64) -> u32 {
    (v.round() as u32).max(1)
}

/// Computes the geometry of zimg's `p` modes for a `sw`×`sh` (oriented) source. A request
/// wider or taller than `max_dim` is refused; a plan enlarging the source by more than
/// `max_upscale` is shrunk to that scale, keeping the requested aspect ratio (as thumbor's
/// `no_upscale` and imgproxy without `enlarge` do).
pub fn plan(
    sw: u32,
    sh: u32,
    r: &Resolved,
    max_dim: u32,
    max_upscale: f64,
) -> Result<Plan, TransformError> {
    let (fw, fh) = (f64::from(sw), f64::from(sh));
    let full = (0.0, 0.0, fw, fh);
    let proportional = |w: Option<u32>, h: Option<u32>| -> (u32, u32) {
        match (w, h) {
            (Some(w), None) => (w, at_least_one(fh * f64::from(w) / fw)),
            (None, Some(h)) => (at_least_one(fw * f64::from(h) / fh), h),
            (Some(w), Some(h)) => (w, h),
            (None, None) => (sw, sh),
        }
    };
    for (name, v) in [("w", r.w), ("h", r.h)] {
        if v == Some(0) {
            return Err(TransformError::Param(name, "must be at least 1".into()));
        }
    }
    let mut p = match r.mode {
        Mode::Stretch => Plan {
            crop: full,
            out: proportional(r.w, r.h),
        },
        Mode::Cover => match (r.w, r.h) {
            (Some(w), Some(h)) => {
                let s = (f64::from(w) / fw).max(f64::from(h) / fh);
                let (cw, ch) = ((f64::from(w) / s).min(fw), (f64::from(h) / s).min(fh));
                Plan {
                    crop: ((fw - cw) / 2.0, (fh - ch) / 2.0, cw, ch),
                    out: (w, h),
                }
            }
            _ => Plan {
                crop: full,
                out: proportional(r.w, r.h),
            },
        },
        Mode::Fit => match (r.w, r.h) {
            (Some(w), Some(h)) => {
                let s = (f64::from(w) / fw).min(f64::from(h) / fh);
                Plan {
                    crop: full,
                    out: (at_least_one(fw * s), at_least_one(fh * s)),
                }
            }
            _ => Plan {
                crop: full,
                out: proportional(r.w, r.h),
            },
        },
        Mode::Percent => {
            let pw = r.w.or(r.h).unwrap_or(100);
            let ph = r.h.or(r.w).unwrap_or(100);
            Plan {
                crop: full,
                out: (
                    at_least_one(fw * f64::from(pw) / 100.0),
                    at_least_one(fh * f64::from(ph) / 100.0),
                ),
            }
        }
        Mode::Crop => {
            let cw = r.w.unwrap_or(sw).min(sw);
            let ch = r.h.unwrap_or(sh).min(sh);
            let x = r.x.unwrap_or((sw - cw) / 2);
            let y = r.y.unwrap_or((sh - ch) / 2);
            if x >= sw {
                return Err(TransformError::Param(
                    "x",
                    format!("outside the {sw}px width"),
                ));
            }
            if y >= sh {
                return Err(TransformError::Param(
                    "y",
                    format!("outside the {sh}px height"),
                ));
            }
            let (cw, ch) = (cw.min(sw - x), ch.min(sh - y));
            Plan {
                crop: (f64::from(x), f64::from(y), f64::from(cw), f64::from(ch)),
                out: (cw, ch),
            }
        }
    };
    if p.out.0 > max_dim {
        return Err(TransformError::Param(
            "w",
            format!("output width {} exceeds {max_dim}", p.out.0),
        ));
    }
    if p.out.1 > max_dim {
        return Err(TransformError::Param(
            "h",
            format!("output height {} exceeds {max_dim}", p.out.1),
        ));
    }
    let scale = (f64::from(p.out.0) / p.crop.2).max(f64::from(p.out.1) / p.crop.3);
    if scale > max_upscale {
        let k = max_upscale / scale;
        p.out = (
            at_least_one(f64::from(p.out.0) * k),
            at_least_one(f64::from(p.out.1) * k),
        );
    }
    let (rw, rh) = rotated_size(p.out.0, p.out.1, r.r);
    if rw > max_dim || rh > max_dim {
        return Err(TransformError::Param(
            "r",
            format!("rotated size {rw}x{rh} exceeds {max_dim}"),
        ));
    }
    Ok(p)
}

/// The size of a `w`×`h` image rotated by `deg` clockwise (the canvas grows to hold it).
pub fn rotated_size(w: u32, h: u32, deg: u32) -> (u32, u32) {
    match deg % 360 {
        0 | 180 => (w, h),
        90 | 270 => (h, w),
        d => {
            let a = f64::from(d).to_radians();
            let (s, c) = (a.sin().abs(), a.cos().abs());
            let (fw, fh) = (f64::from(w), f64::from(h));
            (
                ((fw * c + fh * s).round() as u32).max(1),
                ((fw * s + fh * c).round() as u32).max(1),
            )
        }
    }
}

/// A transform decided from the header and the parameters alone, before any pixel is decoded:
/// its geometry, its output format, and what it will cost (the pool admits and orders it by
/// these estimates).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prepared {
    pub plan: Plan,
    /// The format encoded (an `f=auto` AVIF over `max_avif_pixels` falls back to the format a
    /// client without AVIF gets).
    pub format: ImageFormat,
    /// The smallest decoded size (unoriented) keeping the plan's scale: a JPEG decoder may
    /// shrink to it.
    need: (u32, u32),
    /// Rows kept, as fractions of the unoriented height: a JPEG decoder may decode only them.
    rows: (f64, f64),
    /// Peak heap bytes of the transform, estimated (see [`Prepared::estimate`]).
    pub memory: u64,
    /// CPU cost in weighted pixels, comparable between transforms (not a time).
    pub cost: u64,
}

/// Plans `r` for a source probed as `probe` and estimates its cost: 400 for parameters out of
/// bounds, 422 for a source over the limits.
pub fn prepare(probe: &Probe, r: &Resolved, limits: &Limits) -> Result<Prepared, TransformError> {
    codec::check_limits(probe, limits)?;
    // Geometry in oriented coordinates first: it decides how much the decoder may shrink.
    let (ow, oh) = oriented_size(probe, probe.orientation);
    let plan = plan(ow, oh, r, limits.max_dim, limits.max_upscale)?;
    let (need, mut rows) = window(probe, probe.orientation, &plan);
    // A smart crop's place is known only once the pixels are: the whole height is decoded.
    if r.smart_cover() {
        rows = (0.0, 1.0);
    }

    let (ew, eh) = rotated_size(plan.out.0, plan.out.1, r.r);
    let format = encodable_format(
        r.format,
        r.negotiated(),
        (ew, eh),
        probe.format,
        limits,
        "f",
    )?;
    let mut p = Prepared {
        plan,
        format,
        need,
        rows,
        memory: 0,
        cost: 0,
    };
    (p.memory, p.cost) = p.estimate(probe, r, limits);
    Ok(p)
}

impl Prepared {
    fn estimate(&self, probe: &Probe, r: &Resolved, limits: &Limits) -> (u64, u64) {
        let shape = Shape {
            need: self.need,
            out: self.plan.out,
            encoded: rotated_size(self.plan.out.0, self.plan.out.1, r.r),
            gray: r.gray,
            format: self.format,
            reoriented: probe.orientation > 1,
            extra: 0,
            encodes: 1,
        };
        let (mut memory, mut cost) = estimate(probe, &shape, limits);
        if super::animation::animates(probe, self.format) {
            // Every frame is decoded and transformed, and all results are held for the encoder.
            memory += super::animation::memory(probe, shape.encoded);
            cost = cost.saturating_mul(u64::from(probe.frames));
        }
        (memory, cost)
    }
}

/// The sizes a transform's memory and cost are estimated from.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    /// The size asked of the decoder (unoriented).
    pub need: (u32, u32),
    /// The resized image.
    pub out: (u32, u32),
    /// The image encoded (rotated, extended, padded).
    pub encoded: (u32, u32),
    /// Decoded as luma only.
    pub gray: bool,
    /// The output format.
    pub format: ImageFormat,
    /// The decoded image is turned (a copy).
    pub reoriented: bool,
    /// Bytes held besides, while encoding (canvases, filter copies).
    pub extra: u64,
    /// Times the result is encoded (1, more to fit a size limit).
    pub encodes: u64,
}

/// Peak heap bytes and CPU cost, from sizes alone. Memory is the largest of three phases,
/// each counted from what the code below holds at once: decoding (the decoder's buffers and
/// the raster, plus a copy to orient it), resizing (the raster, the resizer's intermediate
/// image, the result) and encoding (the result, a rotated or gray copy, the encoder's
/// buffers). Bytes per pixel are upper bounds per format, checked against a counting
/// allocator by `tests/image_memory.rs`. The cost weights are coarse ratios of per-pixel
/// time between codecs (AVIF encoding dwarfs everything else; its weight is measured for the
/// encoder and speed in `limits`), enough to order transforms.
pub(super) fn estimate(probe: &Probe, s: &Shape, limits: &Limits) -> (u64, u64) {
    let (dw, dh) = match probe.format {
        ImageFormat::Jpeg => super::jpeg::scaled_size(probe.width, probe.height, s.need),
        _ => (probe.width, probe.height),
    };
    let (dw, dh, decoded) = (u64::from(dw), u64::from(dh), u64::from(dw) * u64::from(dh));
    let channels: u64 = match probe.format {
        ImageFormat::Jpeg if s.gray => 1,
        ImageFormat::Jpeg => 3,
        _ => 4,
    };
    const MIB: u64 = 1 << 20;
    // Decoding: bytes per pixel (the decoder's buffers and the raster), bytes besides the
    // pixels, work per pixel. rav1d's frame buffers, several planes each, dwarf the raster.
    // CMYK JPEGs hold their CMYK samples and the RGB made of them; 16-bit RGBA PNGs are
    // decoded into 8 bytes a pixel (made 8-bit in place) beside the decoder's own buffers.
    let (decode_bytes, decode_fixed, decode_work) = match probe.format {
        ImageFormat::Jpeg if probe.cmyk => (7, 0, 2),
        ImageFormat::Jpeg => (channels, 0, 1),
        ImageFormat::Png => (10, 0, 3),
        ImageFormat::Gif => (8, 0, 2),
        ImageFormat::Webp => (8, 0, 3),
        ImageFormat::Avif => (32, 2 * MIB, 8),
        // jxl-oxide's f32 planes, capped at this by its allocation tracker; libheif's.
        ImageFormat::Jxl => (
            super::jxl::DECODE_BYTES_PER_PIXEL,
            super::jxl::DECODE_FIXED_BYTES,
            10,
        ),
        ImageFormat::Heic => (
            super::heif::DECODE_BYTES_PER_PIXEL,
            super::heif::DECODE_FIXED_BYTES,
            6,
        ),
    };
    let (ow, oh) = (u64::from(s.out.0), u64::from(s.out.1));
    let encoded = u64::from(s.encoded.0) * u64::from(s.encoded.1);
    // Encoding: the same for the encoder (its own copy of the pixels included). rav1e's
    // are measured at ~53 bytes a pixel above ~3 MB; its work is measured per encoder and
    // speed (`avif_encode::cost_per_pixel`).
    let (encode_bytes, encode_fixed, encode_work) = match s.format {
        ImageFormat::Jpeg => (4, 0, 1),
        ImageFormat::Png => (8, 0, 3),
        ImageFormat::Gif => (12, 0, 6),
        ImageFormat::Webp => (8, 0, 6),
        ImageFormat::Avif => (
            56,
            3 * MIB,
            super::avif_encode::cost_per_pixel(limits.avif_encoder, limits.avif_speed),
        ),
        // libjxl at effort 4 (its own buffers are float planes); HEIC is never encoded.
        ImageFormat::Jxl | ImageFormat::Heic => (48, 4 * MIB, 30),
    };
    let oriented = u64::from(s.reoriented);
    // libheif decodes the HEVC picture at the size its stream codes, which only the limit on
    // each side it is given bounds (heif.rs), not the header's area: its buffers are counted
    // at that side squared, so a header of 8000×1 over an 8000×8000 picture reserves what
    // decoding it takes (a non-square photo reserves at most its longer side squared).
    let coded = match probe.format {
        ImageFormat::Heic => super::heif::decode_side(probe).pow(2),
        _ => decoded,
    };
    let decode = coded * decode_bytes + decoded * oriented * channels + decode_fixed;
    // The raster (and for RGBA the resizer's alpha-premultiplied copy of it), the resizer's
    // intermediate image (one pass done) and the result.
    let premultiplied = if channels == 4 { 4 } else { 0 };
    let resize = decoded * (channels + premultiplied) + 4 * (ow * dh).max(dw * oh) + 4 * ow * oh;
    // The resized image, a rotated or gray copy, the encoder.
    let encode = 4 * ow * oh + 8 * encoded + encode_bytes * encoded + encode_fixed + s.extra;
    // Besides: the resizer's coefficients, row buffers, the encoded output.
    let memory = decode.max(resize).max(encode) + (256 << 10);
    let cost = decoded * decode_work + ow * oh + encoded * encode_work * s.encodes.max(1);
    (memory, cost)
}

/// The size of `probe`'s image turned by `orientation` (an EXIF code, 1-8).
pub(super) fn oriented_size(probe: &Probe, orientation: u8) -> (u32, u32) {
    if orientation >= 5 {
        (probe.height, probe.width)
    } else {
        (probe.width, probe.height)
    }
}

/// What the decoder is asked for a `plan` made in the coordinates of `probe`'s image turned by
/// `orientation`: the smallest size keeping the plan's scale (unoriented; a JPEG decoder may
/// shrink to it) and the rows kept, as fractions of the unoriented height (when the source's
/// rows are the output's, a JPEG decoder decodes only that band).
pub(super) fn window(probe: &Probe, orientation: u8, plan: &Plan) -> ((u32, u32), (f64, f64)) {
    let (ow, oh) = oriented_size(probe, orientation);
    let scale = (f64::from(plan.out.0) / plan.crop.2).max(f64::from(plan.out.1) / plan.crop.3);
    let need = (
        (f64::from(ow) * scale).ceil() as u32,
        (f64::from(oh) * scale).ceil() as u32,
    );
    let need = if orientation >= 5 {
        (need.1, need.0)
    } else {
        need
    };
    let rows = if orientation <= 1 {
        (
            plan.crop.1 / f64::from(oh),
            (plan.crop.1 + plan.crop.3) / f64::from(oh),
        )
    } else {
        (0.0, 1.0)
    };
    (need, rows)
}

/// The longest side each format's encoder writes: libjpeg-turbo's 65,500, WebP's 16,383 (14
/// bits), GIF's 65,535 (16 bits), libaom's and rav1e's 65,536; PNG's and JPEG XL's are far
/// beyond any result a route allows (`max_output_dimension` or `mrd` at most 1,000,000).
fn max_side(format: ImageFormat) -> u32 {
    match format {
        ImageFormat::Jpeg => 65_500,
        ImageFormat::Webp => 16_383,
        ImageFormat::Gif => 65_535,
        ImageFormat::Avif | ImageFormat::Heic => 65_536,
        ImageFormat::Png | ImageFormat::Jxl => u32::MAX,
    }
}

/// The output format once AVIF's pixel cap and each format's longest side are applied to an
/// `encoded`-sized result: a negotiated format falls back to what a client without AVIF or
/// WebP gets, an asked-for one is refused (400 naming `param`), before any work (the encoder
/// refused it after the decode and resize, a 500).
pub(super) fn encodable_format(
    format: ImageFormat,
    negotiated: bool,
    encoded: (u32, u32),
    source: ImageFormat,
    limits: &Limits,
    param: &'static str,
) -> Result<ImageFormat, TransformError> {
    let (ew, eh) = encoded;
    let too_long = |f: ImageFormat| ew.max(eh) > max_side(f);
    let too_many =
        format == ImageFormat::Avif && u64::from(ew) * u64::from(eh) > limits.max_avif_pixels;
    if !too_many && !too_long(format) {
        return Ok(format);
    }
    let fallback = Target::Auto(None).output(source);
    if negotiated && !too_long(fallback) {
        return Ok(fallback);
    }
    let why = match (negotiated, too_many) {
        (false, true) => format!(
            "AVIF output is limited to {} pixels and this one is {ew}x{eh}",
            limits.max_avif_pixels
        ),
        _ => {
            let f = if negotiated { fallback } else { format };
            format!(
                "{} output is at most {} pixels a side and this one is {ew}x{eh}",
                f.name().to_uppercase(),
                max_side(f)
            )
        }
    };
    Err(TransformError::Param(
        param,
        format!("{why}: ask for a smaller size or another format"),
    ))
}

/// A region of the oriented source (`ow` pixels wide) in the pixels of `img`, a decoded (and
/// perhaps shrunk) band of it starting at row `top`.
pub(super) fn in_decoded(
    crop: (f64, f64, f64, f64),
    img: &Raster,
    top: u32,
    ow: u32,
) -> (f64, f64, f64, f64) {
    let k = f64::from(img.width) / f64::from(ow);
    let crop = (
        crop.0 * k,
        crop.1 * k - f64::from(top),
        crop.2 * k,
        crop.3 * k,
    );
    // Rounding at the band's edges must not reach outside the rows decoded.
    let y = crop.1.max(0.0);
    (
        crop.0,
        y,
        crop.2.min(f64::from(img.width) - crop.0),
        crop.3.min(f64::from(img.height) - y),
    )
}

/// Transforms `src` (probed as `probe`) as `r` asks.
pub fn run(
    src: &[u8],
    probe: &Probe,
    r: &Resolved,
    limits: &Limits,
) -> Result<(Vec<u8>, Timing), TransformError> {
    let mut t = Timing::default();
    let p = prepare(probe, r, limits)?;
    let plan = p.plan;
    let (ow, _) = oriented_size(probe, probe.orientation);

    let start = Instant::now();
    let place = |img: &Raster, top: u32| {
        let crop = in_decoded(plan.crop, img, top, ow);
        // A smart crop keeps the planned size and moves it to the content.
        if r.smart_cover() {
            super::smart::place(img, crop)
        } else {
            crop
        }
    };
    if super::animation::animates(probe, p.format) {
        // Every frame with the first frame's crop; decode and resize interleave.
        let mut crop = None;
        let anim = super::animation::map_frames(src, probe, limits, |img| {
            let c = *crop.get_or_insert_with(|| place(&img, 0));
            finish(img, c, plan.out, r)
        })?;
        t.resize = start.elapsed();
        let start = Instant::now();
        let out = super::animation::encode(&anim, p.format, r.quality)?;
        t.encode = start.elapsed();
        return Ok((out, t));
    }
    // A kept profile must be one the output can carry, and fit its pixels (not a gray output).
    let keep_icc = r.keep_icc
        && !r.gray
        && matches!(
            p.format,
            ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::Webp
        );
    let codec::Decoded {
        raster: img,
        band,
        icc,
    } = codec::decode_colour(src, probe, p.need, r.gray, p.rows, limits, keep_icc)?;
    let img = orient(img, probe.orientation);
    t.decode = start.elapsed();

    let start = Instant::now();
    let crop = place(&img, band.top);
    let img = finish(img, crop, plan.out, r)?;
    t.resize = start.elapsed();

    let start = Instant::now();
    let out = codec::encode_with(
        &img,
        p.format,
        &codec::Output {
            quality: r.quality,
            avif_speed: limits.avif_speed,
            avif_encoder: limits.avif_encoder,
            bg: r.bg,
            icc: icc.as_deref(),
            progressive: limits.jpeg_progressive,
            exif: None,
        },
    )?;
    t.encode = start.elapsed();
    Ok((out, t))
}

/// `crop` of `img` scaled to `out`, rotated and grayed as `r` asks.
fn finish(
    img: Raster,
    crop: (f64, f64, f64, f64),
    out: (u32, u32),
    r: &Resolved,
) -> Result<Raster, CodecError> {
    let mut img = resize(img, crop, out)?;
    if r.r != 0 {
        img = rotate(&img, r.r);
    }
    if r.gray {
        img = img.to_gray();
    }
    Ok(img)
}

/// Crops `crop` (in `img` pixels) and scales it to `out`, with SIMD convolution.
pub fn resize(
    img: Raster,
    crop: (f64, f64, f64, f64),
    out: (u32, u32),
) -> Result<Raster, CodecError> {
    let full = crop.0 == 0.0
        && crop.1 == 0.0
        && crop.2 == f64::from(img.width)
        && crop.3 == f64::from(img.height);
    if full && out == (img.width, img.height) {
        return Ok(img);
    }
    let pt = match img.channels {
        1 => fr::PixelType::U8,
        3 => fr::PixelType::U8x3,
        _ => fr::PixelType::U8x4,
    };
    let channels = img.channels;
    let src = fr::images::Image::from_vec_u8(img.width, img.height, img.data, pt)
        .map_err(|e| CodecError::Internal(e.to_string()))?;
    let mut dst = fr::images::Image::new(out.0, out.1, pt);
    let same_size =
        (crop.2 - f64::from(out.0)).abs() < 1e-9 && (crop.3 - f64::from(out.1)).abs() < 1e-9;
    // Lanczos3, as libvips (imgproxy) resizes: against a float reference the bilinear filter
    // this used scored SSIM 0.860 where imgproxy scores 0.892 (640x856 -> 100x100 fill JPEG),
    // Lanczos3 0.893 at the same CPU a request (bench/run imgproxy, docs/benchmarks.md).
    let alg = if same_size {
        fr::ResizeAlg::Nearest
    } else {
        fr::ResizeAlg::Convolution(lanczos3())
    };
    let opts = fr::ResizeOptions::new()
        .resize_alg(alg)
        .crop(crop.0, crop.1, crop.2, crop.3);
    fr::Resizer::new()
        .resize(&src, &mut dst, &opts)
        .map_err(|e| CodecError::Internal(e.to_string()))?;
    Ok(Raster {
        width: out.0,
        height: out.1,
        channels,
        data: dst.into_vec(),
    })
}

/// Lanczos3 read from a table (linear interpolation between 1/1024 steps: within 2e-6 of the
/// exact kernel, below the resizer's 14-bit fixed-point weights) instead of two `sin` a tap:
/// fast_image_resize computes each resize's weights anew, and for a 640x856 -> 100x100 fill
/// the `sin` calls took ~5% of a request's CPU.
fn lanczos3() -> fr::FilterType {
    match fr::Filter::new("Lanczos3 (table)", lanczos3_tabled, LANCZOS_SUPPORT as f64) {
        Ok(f) => fr::FilterType::Custom(f),
        Err(_) => fr::FilterType::Lanczos3,
    }
}

const LANCZOS_SUPPORT: usize = 3;
const LANCZOS_STEPS: usize = 1024;

fn lanczos3_tabled(x: f64) -> f64 {
    static TABLE: std::sync::LazyLock<Vec<f64>> = std::sync::LazyLock::new(|| {
        let sinc = |x: f64| {
            if x == 0.0 {
                1.0
            } else {
                let x = x * std::f64::consts::PI;
                x.sin() / x
            }
        };
        let n = LANCZOS_SUPPORT * LANCZOS_STEPS;
        (0..=n + 1)
            .map(|i| {
                let x = i as f64 / LANCZOS_STEPS as f64;
                if i < n {
                    sinc(x) * sinc(x / LANCZOS_SUPPORT as f64)
                } else {
                    0.0
                }
            })
            .collect()
    });
    let x = x.abs() * LANCZOS_STEPS as f64;
    if x >= (LANCZOS_SUPPORT * LANCZOS_STEPS) as f64 {
        return 0.0;
    }
    let i = x as usize;
    let t = &*TABLE;
    t[i] + (t[i + 1] - t[i]) * (x - i as f64)
}

/// Applies an EXIF orientation (1-8), so the output is upright and needs no tag.
pub fn orient(img: Raster, orientation: u8) -> Raster {
    match orientation {
        2 => flip_h(&img),
        3 => rotate(&img, 180),
        4 => flip_h(&rotate(&img, 180)),
        5 => flip_h(&rotate(&img, 90)),
        6 => rotate(&img, 90),
        7 => flip_h(&rotate(&img, 270)),
        8 => rotate(&img, 270),
        _ => img,
    }
}

fn flip_h(img: &Raster) -> Raster {
    let c = usize::from(img.channels);
    let row = img.width as usize * c;
    let mut data = Vec::with_capacity(img.data.len());
    for r in img.data.chunks_exact(row) {
        for px in r.chunks_exact(c).rev() {
            data.extend_from_slice(px);
        }
    }
    Raster {
        data,
        ..img.clone()
    }
}

/// Rotates clockwise by `deg`: exact for right angles, bilinear on a grown canvas otherwise
/// (white behind opaque images, transparent behind images with alpha).
pub fn rotate(img: &Raster, deg: u32) -> Raster {
    let (w, h, c) = (
        img.width as usize,
        img.height as usize,
        img.channels as usize,
    );
    let deg = deg % 360;
    if deg == 0 {
        return img.clone();
    }
    if deg % 90 == 0 {
        let (nw, nh) = if deg == 180 { (w, h) } else { (h, w) };
        let mut out = vec![0u8; nw * nh * c];
        for y in 0..h {
            for x in 0..w {
                let (nx, ny) = match deg {
                    90 => (h - 1 - y, x),
                    180 => (w - 1 - x, h - 1 - y),
                    _ => (y, w - 1 - x),
                };
                let s = (y * w + x) * c;
                let d = (ny * nw + nx) * c;
                out[d..d + c].copy_from_slice(&img.data[s..s + c]);
            }
        }
        return Raster {
            width: nw as u32,
            height: nh as u32,
            channels: img.channels,
            data: out,
        };
    }
    let (nw, nh) = rotated_size(img.width, img.height, deg);
    let (nw, nh) = (nw as usize, nh as usize);
    let a = f64::from(deg).to_radians();
    let (sin, cos) = (a.sin(), a.cos());
    let (cx, cy) = (w as f64 / 2.0, h as f64 / 2.0);
    let (ncx, ncy) = (nw as f64 / 2.0, nh as f64 / 2.0);
    let background: [u8; 4] = if c == 4 { [0, 0, 0, 0] } else { [255; 4] };
    let mut out = vec![0u8; nw * nh * c];
    for ny in 0..nh {
        for nx in 0..nw {
            // Inverse rotation: where in the source does this output pixel come from.
            let dx = nx as f64 + 0.5 - ncx;
            let dy = ny as f64 + 0.5 - ncy;
            let sx = dx * cos + dy * sin + cx - 0.5;
            let sy = -dx * sin + dy * cos + cy - 0.5;
            let d = (ny * nw + nx) * c;
            if sx < -0.5 || sy < -0.5 || sx > w as f64 - 0.5 || sy > h as f64 - 0.5 {
                out[d..d + c].copy_from_slice(&background[..c]);
                continue;
            }
            let x0 = sx.floor().clamp(0.0, (w - 1) as f64) as usize;
            let y0 = sy.floor().clamp(0.0, (h - 1) as f64) as usize;
            let x1 = (x0 + 1).min(w - 1);
            let y1 = (y0 + 1).min(h - 1);
            let fx = (sx - x0 as f64).clamp(0.0, 1.0);
            let fy = (sy - y0 as f64).clamp(0.0, 1.0);
            for ch in 0..c {
                let p = |x: usize, y: usize| f64::from(img.data[(y * w + x) * c + ch]);
                let top = p(x0, y0) * (1.0 - fx) + p(x1, y0) * fx;
                let bottom = p(x0, y1) * (1.0 - fx) + p(x1, y1) * fx;
                out[d + ch] = (top * (1.0 - fy) + bottom * fy).round() as u8;
            }
        }
    }
    Raster {
        width: nw as u32,
        height: nh as u32,
        channels: img.channels,
        data: out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::params::{FormatChoice, Params};

    fn resolved(q: &str) -> Resolved {
        let p = Params::parse(q).unwrap();
        Resolved::new(&p, FormatChoice::Keep, 75, &http::HeaderMap::new())
            .for_source(ImageFormat::Jpeg)
    }

    /// libheif may decode a picture as large as its side limit squared whatever the header's
    /// area (heif.rs): a HEIC of 8000×1 reserves what an 8001×8001 picture takes to decode.
    #[test]
    fn a_heic_reserves_its_longer_side_squared_for_decoding() {
        let probe = |w, h| Probe {
            format: ImageFormat::Heic,
            width: w,
            height: h,
            frames: 1,
            orientation: 1,
            cmyk: false,
        };
        let shape = |w, h| Shape {
            need: (w, h),
            out: (w.min(100), h.min(100)),
            encoded: (w.min(100), h.min(100)),
            gray: false,
            format: ImageFormat::Jpeg,
            reoriented: false,
            extra: 0,
            encodes: 1,
        };
        let (thin, _) = estimate(&probe(8000, 1), &shape(8000, 1), &Limits::DEFAULT);
        assert!(
            thin >= 8001 * 8001 * super::super::heif::DECODE_BYTES_PER_PIXEL,
            "{thin}"
        );
        let (square, _) = estimate(&probe(300, 300), &shape(300, 300), &Limits::DEFAULT);
        assert!(square < 301 * 301 * 20 + (16 << 20), "{square}");
    }

    /// The pool orders AVIF transforms by the encoder in use: libaom at its default speed (9)
    /// is cheaper than rav1e at its fastest (10), as measured (docs/design.md "AVIF
    /// encoding"; the estimate used to rank them the other way round); a slower speed never
    /// costs less, and libaom's default is at least ten JPEG transforms of the same picture.
    #[test]
    fn avif_cost_follows_the_encoder_and_its_speed() {
        use crate::config::AvifEncoder::{Aom, Rav1e};
        let probe = Probe {
            format: ImageFormat::Jpeg,
            width: 1000,
            height: 872,
            frames: 1,
            orientation: 1,
            cmyk: false,
        };
        let shape = |format| Shape {
            need: (500, 436),
            out: (500, 436),
            encoded: (500, 436),
            gray: false,
            format,
            reoriented: false,
            extra: 0,
            encodes: 1,
        };
        let cost = |avif_encoder, avif_speed| {
            let limits = Limits {
                avif_encoder,
                avif_speed,
                ..Limits::DEFAULT
            };
            estimate(&probe, &shape(ImageFormat::Avif), &limits).1
        };
        assert!(cost(Aom, 9) < cost(Rav1e, 10));
        for encoder in [Aom, Rav1e] {
            for speed in 1..10 {
                assert!(cost(encoder, speed) >= cost(encoder, speed + 1), "{speed}");
            }
            assert!(cost(encoder, 1) > 50 * cost(encoder, 10));
        }
        let jpeg = estimate(&probe, &shape(ImageFormat::Jpeg), &Limits::DEFAULT).1;
        assert!(cost(Aom, 9) >= 10 * jpeg, "{} vs {jpeg}", cost(Aom, 9));
    }

    #[test]
    fn plans_every_mode() {
        let out = |q: &str| plan(640, 856, &resolved(q), 4096, 1.0).unwrap().out;
        assert_eq!(out("w=100&h=100&p=0"), (100, 100));
        assert_eq!(out("w=100&h=100&p=1"), (100, 100));
        assert_eq!(out("w=100&p=1"), (100, 134));
        assert_eq!(out("w=100&h=50&p=2&x=10&y=20"), (100, 50));
        assert_eq!(out("w=700&h=50&p=2&x=600"), (40, 50));
        assert_eq!(out("w=50&p=3"), (320, 428));
        assert_eq!(out("w=100&h=100&p=4"), (75, 100));
        assert!(matches!(
            plan(640, 856, &resolved("w=5000"), 4096, 1.0),
            Err(TransformError::Param("w", _))
        ));
        assert!(matches!(
            plan(640, 856, &resolved("p=2&x=700"), 4096, 1.0),
            Err(TransformError::Param("x", _))
        ));
    }

    /// #12 item 9: `w=4096&h=4096` of a 200×150 source planned a 4096×4096 result (and, as
    /// AVIF, seconds of CPU).
    #[test]
    fn regression_upscale_is_bounded() {
        let out = |q: &str, up: f64| plan(200, 150, &resolved(q), 4096, up).unwrap().out;
        // Never enlarged by default; the requested aspect ratio is kept.
        assert_eq!(out("w=4096&h=4096", 1.0), (150, 150));
        assert_eq!(out("w=1000&h=300&p=0", 1.0), (200, 60));
        assert_eq!(out("w=400", 1.0), (200, 150));
        assert_eq!(out("w=1000&h=1000&p=4", 1.0), (200, 150));
        assert_eq!(out("w=300&p=3", 1.0), (200, 150));
        assert_eq!(out("w=1000&p=2", 1.0), (200, 150));
        // Shrinking is untouched; a larger factor allows up to it.
        assert_eq!(out("w=100&h=100", 1.0), (100, 100));
        assert_eq!(out("w=4096&h=4096", 2.0), (300, 300));
        assert_eq!(out("w=300", 2.0), (300, 225));
    }

    #[test]
    fn tabled_lanczos3_is_the_kernel() {
        assert!(matches!(lanczos3(), fr::FilterType::Custom(_)));
        let exact = |x: f64| {
            let s = |x: f64| {
                if x == 0.0 {
                    1.0
                } else {
                    (x * std::f64::consts::PI).sin() / (x * std::f64::consts::PI)
                }
            };
            if x.abs() < 3.0 {
                s(x) * s(x / 3.0)
            } else {
                0.0
            }
        };
        for i in -3500..=3500 {
            let x = f64::from(i) / 997.0;
            let (t, e) = (lanczos3_tabled(x), exact(x));
            assert!((t - e).abs() < 4e-6, "x {x}: {t} vs {e}");
        }
    }

    #[test]
    fn right_angle_rotation_moves_pixels() {
        let img = Raster {
            width: 2,
            height: 1,
            channels: 1,
            data: vec![1, 2],
        };
        let r = rotate(&img, 90);
        assert_eq!((r.width, r.height, r.data.clone()), (1, 2, vec![1, 2]));
        let r = rotate(&img, 270);
        assert_eq!(r.data, vec![2, 1]);
        assert_eq!(rotate(&img, 180).data, vec![2, 1]);
        assert_eq!(rotated_size(100, 100, 45), (141, 141));
    }

    fn limits() -> Limits {
        Limits {
            max_pixels: 1 << 24,
            max_frames: 1,
            max_avif_pixels: 1 << 20,
            max_animation_pixels: 500_000_000,
            ..Limits::DEFAULT
        }
    }

    /// A 16×16 JPEG of one colour with a Display P3 profile.
    fn p3_jpeg(rgb: [u8; 3]) -> (Vec<u8>, Vec<u8>) {
        let icc = moxcms::ColorProfile::new_display_p3().encode().unwrap();
        let px = rgb.repeat(256);
        let mut c = turbojpeg::Compressor::new().unwrap();
        c.set_quality(100).unwrap();
        c.set_subsamp(turbojpeg::Subsamp::None).unwrap();
        let jpeg = c
            .compress_to_owned(turbojpeg::Image {
                pixels: px.as_slice(),
                width: 16,
                pitch: 48,
                height: 16,
                format: turbojpeg::PixelFormat::RGB,
            })
            .unwrap();
        (super::super::colour::embed_jpeg(&jpeg, &icc), icc)
    }

    /// Pixels as stored (a profile is kept, not applied) and the profile, if any.
    fn decoded(bytes: &[u8]) -> (Raster, Option<Vec<u8>>) {
        let p = crate::images::sniff::probe(bytes).unwrap();
        let whole = (p.width, p.height);
        let d = codec::decode_colour(bytes, &p, whole, false, (0.0, 1.0), &limits(), true);
        let d = d.unwrap();
        (d.raster, d.icc)
    }

    #[test]
    fn a_kept_profile_travels_with_untouched_pixels() {
        let (src, icc) = p3_jpeg([200, 60, 40]);
        let probe = crate::images::sniff::probe(&src).unwrap();
        for f in ["jpeg", "png", "webp"] {
            let mut r = resolved(&format!("w=8&f={f}&q=100"));
            r.keep_icc = true;
            let (out, _) = run(&src, &probe, &r, &limits()).unwrap();
            let (img, kept) = decoded(&out);
            assert_eq!(kept.as_deref(), Some(icc.as_slice()), "{f}");
            let px = &img.data[..3];
            assert!(
                px.iter()
                    .zip([200u8, 60, 40])
                    .all(|(a, b)| a.abs_diff(b) <= 6),
                "{f}: {px:?}"
            );
        }
        // Not where the format has no profile (AVIF), nor for a gray output: converted.
        let mut r = resolved("w=8&f=avif&q=100");
        r.keep_icc = true;
        let (out, _) = run(&src, &probe, &r, &limits()).unwrap();
        let (img, kept) = decoded(&out);
        assert_eq!(kept, None);
        assert!(img.data[0] > 210, "converted: {:?}", &img.data[..3]);
        // The default: converted, no profile.
        let (out, _) = run(&src, &probe, &resolved("w=8&q=100"), &limits()).unwrap();
        let (img, kept) = decoded(&out);
        assert_eq!(kept, None);
        assert!(img.data[0] > 210, "converted: {:?}", &img.data[..3]);
    }

    #[test]
    fn alpha_is_flattened_onto_bg_for_jpeg() {
        // Left half transparent, right half opaque green.
        let mut px = Vec::new();
        for _ in 0..8 {
            for x in 0..8 {
                px.extend_from_slice(if x < 4 {
                    &[0, 0, 0, 0]
                } else {
                    &[0, 200, 0, 255]
                });
            }
        }
        let img = Raster {
            width: 8,
            height: 8,
            channels: 4,
            data: px,
        };
        let png = codec::encode(&img, ImageFormat::Png, 75).unwrap();
        let probe = crate::images::sniff::probe(&png).unwrap();
        let mut r = resolved("f=jpeg&q=100");
        r.format = ImageFormat::Jpeg;
        r.bg = [0, 0, 255];
        let (out, _) = run(&png, &probe, &r, &limits()).unwrap();
        let (img, _) = decoded(&out);
        let at = |x: usize| &img.data[(4 * 8 + x) * 3..(4 * 8 + x) * 3 + 3];
        assert!(at(0)[2] > 240 && at(0)[0] < 15, "blue: {:?}", at(0));
        assert!(at(7)[1] > 185 && at(7)[2] < 15, "green: {:?}", at(7));
        // The default background is white.
        r.bg = codec::WHITE;
        let (out, _) = run(&png, &probe, &r, &limits()).unwrap();
        assert!(decoded(&out).0.data[32 * 3..32 * 3 + 3]
            .iter()
            .all(|&v| v > 240));
    }

    #[test]
    fn a_smart_crop_keeps_the_subject_a_centre_crop_cuts() {
        // A flat background with a striped, saturated square in the top-left corner.
        let (w, h) = (300u32, 200u32);
        let mut data = Vec::new();
        for y in 0..h {
            for x in 0..w {
                let inside = (5..45).contains(&x) && (5..45).contains(&y);
                let px = match (inside, (x / 3 + y / 3) % 2) {
                    (false, _) => [120, 130, 140],
                    (true, 0) => [230, 20, 20],
                    (true, _) => [20, 20, 230],
                };
                data.extend_from_slice(&px);
            }
        }
        let img = Raster {
            width: w,
            height: h,
            channels: 3,
            data,
        };
        let png = codec::encode(&img, ImageFormat::Png, 75).unwrap();
        let probe = crate::images::sniff::probe(&png).unwrap();
        let saturated = |out: &[u8]| {
            let (img, _) = decoded(out);
            img.data
                .chunks_exact(3)
                .filter(|p| p.iter().max().unwrap() - p.iter().min().unwrap() > 80)
                .count()
        };
        // A 100×100 cover crop (of 200×200 source pixels): the centre one, x 50..250, misses
        // the square entirely.
        let mut r = resolved("w=100&h=100&f=png");
        r.format = ImageFormat::Png;
        let (centre, _) = run(&png, &probe, &r, &limits()).unwrap();
        assert_eq!(saturated(&centre), 0);
        r.smart = true;
        assert!(r.key().ends_with("&smart=1"), "{}", r.key());
        let (smart, _) = run(&png, &probe, &r, &limits()).unwrap();
        let (out, _) = decoded(&smart);
        assert_eq!((out.width, out.height), (100, 100));
        // The whole square, halved: 20×20 pixels (less the stripes' blended edges).
        assert!(saturated(&smart) >= 350, "{}", saturated(&smart));
    }
}
