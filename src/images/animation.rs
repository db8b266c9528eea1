//! Animated GIF, WebP and PNG (APNG): every frame decoded onto a full canvas (GIF's disposal
//! and transparency and APNG's blending and disposal composited here, from the `gif` and
//! `png` crates' frames; WebP's by libwebp's animation decoder),
//! each canvas handed to the caller as it is made (the pipeline applies one geometry to every
//! frame: a frame is never transformed on its own), and the results encoded again as an
//! animated GIF or WebP keeping each frame's delay and the loop count.
//!
//! Used when the source has more than one frame and the output can animate (GIF, WebP,
//! [`animates`]; larder writes no APNG); other outputs take the first frame
//! ([`super::codec`]; an APNG's default image), as imgproxy does. The
//! frame and pixel limits (`max_frames`, `max_animation_pixels`) are checked from the header
//! before anything is decoded ([`super::codec::check_limits`]) and again while decoding (a
//! header may lie); [`memory`] is what the pool reserves for all frames.

use std::io::Cursor;

use super::raster::{CodecError, Limits, Raster};
use super::sniff::{ImageFormat, Probe};

/// One frame of an animation: a full canvas, and how long it shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub image: Raster,
    pub delay_ms: u32,
}

/// Frames of one size, and how many times they play (None: forever).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Animation {
    pub frames: Vec<Frame>,
    pub plays: Option<u32>,
}

/// Whether a source probed as `probe` keeps its animation in `out`.
pub fn animates(probe: &Probe, out: ImageFormat) -> bool {
    probe.frames > 1
        && matches!(
            probe.format,
            ImageFormat::Gif | ImageFormat::Webp | ImageFormat::Png
        )
        && matches!(out, ImageFormat::Gif | ImageFormat::Webp)
}

/// Peak bytes an animation of `probe`'s frames transformed to `out`-sized frames holds beyond
/// one frame's transform: the decoder's canvases (current and saved, RGBA) and every result
/// frame twice (kept for encoding, and the encoder's copy: libwebp's ARGB pictures, gif's
/// indexed frames and palette work).
pub fn memory(probe: &Probe, out: (u32, u32)) -> u64 {
    let canvas = 4 * probe.pixels();
    let frame = 4 * u64::from(out.0) * u64::from(out.1);
    3 * canvas + 2 * frame * u64::from(probe.frames)
}

/// Decodes every frame of `src` (an animated GIF or WebP) onto full RGBA canvases, hands each
/// to `each` as it is made and keeps what it returns, with the frame's delay.
pub fn map_frames<E: From<CodecError>>(
    src: &[u8],
    probe: &Probe,
    limits: &Limits,
    mut each: impl FnMut(Raster) -> Result<Raster, E>,
) -> Result<Animation, E> {
    let mut frames = Vec::with_capacity(probe.frames.min(limits.max_frames) as usize);
    let mut add = |image: Raster, delay_ms: u32| -> Result<(), E> {
        if frames.len() >= limits.max_frames as usize {
            return Err(CodecError::TooManyFrames {
                frames: limits.max_frames + 1,
                limit: limits.max_frames,
            }
            .into());
        }
        let image = each(image)?;
        frames.push(Frame { image, delay_ms });
        Ok(())
    };
    let plays = match probe.format {
        ImageFormat::Gif => gif_frames(src, probe, limits, &mut add)?,
        ImageFormat::Webp => webp_frames(src, limits, false, &mut add)?,
        ImageFormat::Png => png_frames(src, limits, &mut add)?,
        _ => return Err(CodecError::Unsupported("animated non-GIF, non-WebP, non-PNG").into()),
    };
    if frames.is_empty() {
        return Err(CodecError::Decode("animation", "no frame".into()).into());
    }
    Ok(Animation { frames, plays })
}

/// A GIF decoder giving RGBA frames, each frame's buffer bounded by the pixel limit.
pub(super) fn gif_decoder<'a>(
    src: &'a [u8],
    limits: &Limits,
) -> Result<gif::Decoder<Cursor<&'a [u8]>>, CodecError> {
    let mut opts = gif::DecodeOptions::new();
    opts.set_color_output(gif::ColorOutput::RGBA);
    let bytes = limits.max_pixels.saturating_mul(4).min(u64::from(u32::MAX));
    opts.set_memory_limit(gif::MemoryLimit::Bytes(
        std::num::NonZeroU64::new(bytes).unwrap_or(std::num::NonZeroU64::MIN),
    ));
    opts.read_info(Cursor::new(src)).map_err(gif_error)
}

fn gif_error(e: gif::DecodingError) -> CodecError {
    CodecError::Decode("GIF", e.to_string())
}

/// The GIF's logical screen, bounded by the probed size.
pub(super) fn gif_screen(d: &gif::Decoder<Cursor<&[u8]>>, probe: &Probe) -> (u32, u32) {
    let (sw, sh) = (u32::from(d.width()), u32::from(d.height()));
    (sw.max(1).min(probe.width), sh.max(1).min(probe.height))
}

/// Draws `frame` on a `w`-pixel-wide RGBA `canvas`: its opaque pixels replace the canvas's,
/// its transparent ones (alpha 0, the GIF's transparent index) leave them; clipped to the
/// canvas.
pub(super) fn gif_draw(canvas: &mut [u8], (w, h): (u32, u32), frame: &gif::Frame<'_>) {
    for_rect(frame, (w, h), |y, x0, x1, s| {
        let t = (y * w as usize + x0) * 4;
        let row = &mut canvas[t..t + (x1 - x0) * 4];
        let src = &frame.buffer[s..s + (x1 - x0) * 4];
        for (d, p) in row.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
            if p[3] != 0 {
                d.copy_from_slice(p);
            }
        }
    });
}

/// Calls `f(canvas row, first x, end x, offset in the frame's buffer)` for each row of
/// `frame`'s rectangle inside the `(w, h)` canvas.
fn for_rect(
    frame: &gif::Frame<'_>,
    (w, h): (u32, u32),
    mut f: impl FnMut(usize, usize, usize, usize),
) {
    let (fl, ft) = (usize::from(frame.left), usize::from(frame.top));
    let (fw, fh) = (usize::from(frame.width), usize::from(frame.height));
    let x1 = (fl + fw).min(w as usize);
    if fl >= x1 || frame.buffer.len() < fw * fh * 4 {
        return;
    }
    for y in 0..fh {
        let ty = ft + y;
        if ty >= h as usize {
            break;
        }
        f(ty, fl, x1, y * fw * 4);
    }
}

/// The frames of an animated GIF, composited: each frame drawn over what the previous one's
/// disposal left (kept, cleared to transparent, or restored to before it).
fn gif_frames<E: From<CodecError>>(
    src: &[u8],
    probe: &Probe,
    limits: &Limits,
    add: &mut impl FnMut(Raster, u32) -> Result<(), E>,
) -> Result<Option<u32>, E> {
    let mut d = gif_decoder(src, limits)?;
    let (w, h) = gif_screen(&d, probe);
    let mut canvas = vec![0u8; w as usize * h as usize * 4];
    let mut saved = Vec::new();
    while let Some(frame) = d.read_next_frame().map_err(gif_error)? {
        if frame.dispose == gif::DisposalMethod::Previous {
            saved.clone_from(&canvas);
        }
        gif_draw(&mut canvas, (w, h), frame);
        let delay_ms = u32::from(frame.delay) * 10;
        match frame.dispose {
            gif::DisposalMethod::Background => {
                let shown = canvas.clone();
                for_rect(frame, (w, h), |y, x0, x1, _| {
                    let t = (y * w as usize + x0) * 4;
                    canvas[t..t + (x1 - x0) * 4].fill(0);
                });
                add(raster(w, h, shown), delay_ms)?;
            }
            gif::DisposalMethod::Previous => {
                let shown = std::mem::replace(&mut canvas, saved.clone());
                add(raster(w, h, shown), delay_ms)?;
            }
            _ => add(raster(w, h, canvas.clone()), delay_ms)?,
        }
    }
    // Without a NETSCAPE block a GIF plays once; with one, `n` repeats after the first.
    Ok(match d.repeat() {
        gif::Repeat::Infinite => None,
        gif::Repeat::Finite(n) => Some(u32::from(n) + 1),
    })
}

/// The frames of an animated PNG (APNG), composited as its `fcTL` chunks say: each frame's
/// region replacing the canvas's pixels (`blend_op` source) or blended over them (over), then
/// disposed of (kept, cleared to transparent, or restored to before it). The default image
/// (`IDAT`) is skipped when it is not a frame of the animation. Samples of 16 bits are cut to
/// 8 and no profile is applied (as GIF and WebP frames).
fn png_frames<E: From<CodecError>>(
    src: &[u8],
    limits: &Limits,
    add: &mut impl FnMut(Raster, u32) -> Result<(), E>,
) -> Result<Option<u32>, E> {
    let err = |e: png::DecodingError| CodecError::Decode("PNG", e.to_string());
    let mut dec = png::Decoder::new_with_limits(
        Cursor::new(src),
        png::Limits {
            bytes: (limits.max_pixels as usize).saturating_mul(8),
        },
    );
    dec.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = dec.read_info().map_err(err)?;
    let (w, h) = (reader.info().width, reader.info().height);
    let pixels = u64::from(w) * u64::from(h);
    if pixels > limits.max_pixels {
        return Err(CodecError::TooManyPixels {
            pixels,
            limit: limits.max_pixels,
        }
        .into());
    }
    let Some(actl) = reader.info().animation_control else {
        return Err(CodecError::Decode("PNG", "no animation".into()).into());
    };
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| CodecError::Decode("PNG", "image too large".into()))?;
    let mut buf = vec![0u8; size];
    if reader.info().frame_control.is_none() {
        // The default image, for decoders without APNG: not a frame.
        reader.next_frame(&mut buf).map_err(err)?;
    }
    let (wu, hu) = (w as usize, h as usize);
    let mut canvas = vec![0u8; wu * hu * 4];
    let mut saved = Vec::new();
    for n in 0..actl.num_frames {
        let out = reader.next_frame(&mut buf).map_err(err)?;
        let Some(fc) = reader.info().frame_control else {
            return Err(CodecError::Decode("PNG", "a frame without fcTL".into()).into());
        };
        let samples = out.color_type.samples();
        let (x0, y0) = (fc.x_offset as usize, fc.y_offset as usize);
        let (fw, fh) = (out.width as usize, out.height as usize);
        // The APNG spec: a first frame disposed to "previous" is disposed to the background.
        let dispose = match fc.dispose_op {
            png::DisposeOp::Previous if n == 0 => png::DisposeOp::Background,
            d => d,
        };
        if dispose == png::DisposeOp::Previous {
            saved.clone_from(&canvas);
        }
        let over = fc.blend_op == png::BlendOp::Over;
        for y in 0..fh.min(hu.saturating_sub(y0)) {
            let row = &buf[y * out.line_size..][..fw * samples];
            for x in 0..fw.min(wu.saturating_sub(x0)) {
                let p = &row[x * samples..][..samples];
                let px = match samples {
                    1 => [p[0], p[0], p[0], 255],
                    2 => [p[0], p[0], p[0], p[1]],
                    3 => [p[0], p[1], p[2], 255],
                    _ => [p[0], p[1], p[2], p[3]],
                };
                let t = ((y0 + y) * wu + x0 + x) * 4;
                let d = &mut canvas[t..t + 4];
                if over {
                    blend_over(d, px);
                } else {
                    d.copy_from_slice(&px);
                }
            }
        }
        let den = if fc.delay_den == 0 { 100 } else { fc.delay_den };
        let delay_ms = (u32::from(fc.delay_num) * 1000) / u32::from(den);
        match dispose {
            png::DisposeOp::Background => {
                let shown = canvas.clone();
                let (xa, xb) = (x0.min(wu), (x0 + fw).min(wu));
                for y in y0..(y0 + fh).min(hu) {
                    canvas[(y * wu + xa) * 4..(y * wu + xb) * 4].fill(0);
                }
                add(raster(w, h, shown), delay_ms)?;
            }
            png::DisposeOp::Previous => {
                let shown = std::mem::replace(&mut canvas, saved.clone());
                add(raster(w, h, shown), delay_ms)?;
            }
            png::DisposeOp::None => add(raster(w, h, canvas.clone()), delay_ms)?,
        }
    }
    Ok(match actl.num_plays {
        0 => None,
        n => Some(n),
    })
}

/// `src` (straight RGBA) drawn over the pixel `d` (straight RGBA): PNG's alpha compositing.
fn blend_over(d: &mut [u8], src: [u8; 4]) {
    let sa = u32::from(src[3]);
    if sa == 255 || d[3] == 0 {
        d.copy_from_slice(&src);
        return;
    }
    if sa == 0 {
        return;
    }
    // Out alpha and colours, in 255ths: a = sa + da(1 - sa).
    let da = u32::from(d[3]) * (255 - sa) / 255;
    let a = sa + da;
    for i in 0..3 {
        d[i] = ((u32::from(src[i]) * sa + u32::from(d[i]) * da + a / 2) / a) as u8;
    }
    d[3] = a as u8;
}

fn raster(width: u32, height: u32, data: Vec<u8>) -> Raster {
    Raster {
        width,
        height,
        channels: 4,
        data,
    }
}

/// libwebp's animation decoder, deleted when dropped.
struct WebpDecoder(*mut libwebp_sys::WebPAnimDecoder);

impl Drop for WebpDecoder {
    fn drop(&mut self) {
        // SAFETY: made by WebPAnimDecoderNew, deleted once.
        unsafe { libwebp_sys::WebPAnimDecoderDelete(self.0) }
    }
}

/// Whether `src` (a WebP) is an animation, by libwebp's reading of its header: one of a single
/// frame too (its `ANMF` chunk is not a still's bitstream).
pub(super) fn webp_is_animation(src: &[u8]) -> bool {
    // SAFETY: libwebp reads at most `src.len()` bytes of `src` and fills the zeroed struct.
    unsafe {
        let mut f: libwebp_sys::WebPBitstreamFeatures = std::mem::zeroed();
        let status = libwebp_sys::WebPGetFeatures(src.as_ptr(), src.len(), &mut f);
        status == libwebp_sys::VP8StatusCode::VP8_STATUS_OK && f.has_animation != 0
    }
}

/// The first frame of an animated WebP on its full RGBA canvas, decoded alone (what an output
/// that cannot animate takes): the other frames are neither decoded nor held.
pub(super) fn webp_first_frame(src: &[u8], limits: &Limits) -> Result<Raster, CodecError> {
    let mut first = None;
    webp_frames::<CodecError>(src, limits, true, &mut |image, _| {
        first = Some(image);
        Ok(())
    })?;
    first.ok_or_else(|| CodecError::Decode("WebP", "no frame".into()))
}

/// The frames of an animated WebP as libwebp composes them (blending, disposal), one at a
/// time (only the first with `first_only`); timestamps are each frame's end. A frame that
/// fails to decode ends it with an error: libwebp does not move past it, so it is never asked
/// again (the `webp` crate's decoder did, forever).
fn webp_frames<E: From<CodecError>>(
    src: &[u8],
    limits: &Limits,
    first_only: bool,
    add: &mut impl FnMut(Raster, u32) -> Result<(), E>,
) -> Result<Option<u32>, E> {
    use libwebp_sys as w;
    let err = |m: &str| CodecError::Decode("WebP", m.into());
    // SAFETY: `src` outlives the decoder (dropped at the end of this function); the options
    // and info are plain C structs initialised by libwebp; a frame's buffer is the canvas
    // (width × height × 4 bytes in RGBA mode), valid until the next call, copied at once.
    unsafe {
        let mut opts: w::WebPAnimDecoderOptions = std::mem::zeroed();
        if w::WebPAnimDecoderOptionsInit(&mut opts) == 0 {
            return Err(err("libwebp version mismatch").into());
        }
        opts.color_mode = w::WEBP_CSP_MODE::MODE_RGBA;
        opts.use_threads = 0;
        let data = w::WebPData {
            bytes: src.as_ptr(),
            size: src.len(),
        };
        let dec = w::WebPAnimDecoderNew(&data, &opts);
        if dec.is_null() {
            return Err(err("invalid animation").into());
        }
        let dec = WebpDecoder(dec);
        let mut info: w::WebPAnimInfo = std::mem::zeroed();
        if w::WebPAnimDecoderGetInfo(dec.0, &mut info) == 0 {
            return Err(err("invalid animation").into());
        }
        let (cw, ch) = (info.canvas_width, info.canvas_height);
        let pixels = u64::from(cw) * u64::from(ch);
        if pixels == 0 || pixels > limits.max_pixels {
            return Err(CodecError::TooManyPixels {
                pixels,
                limit: limits.max_pixels,
            }
            .into());
        }
        let len = pixels as usize * 4;
        let mut end = 0;
        while w::WebPAnimDecoderHasMoreFrames(dec.0) != 0 {
            let mut buf: *mut u8 = std::ptr::null_mut();
            let mut ts = 0;
            if w::WebPAnimDecoderGetNext(dec.0, &mut buf, &mut ts) == 0 || buf.is_null() {
                return Err(err("corrupt frame").into());
            }
            let px = std::slice::from_raw_parts(buf, len).to_vec();
            let delay = u32::try_from(ts.saturating_sub(end)).unwrap_or(0);
            end = ts;
            add(raster(cw, ch, px), delay)?;
            if first_only {
                break;
            }
        }
        Ok(match info.loop_count {
            0 => None,
            n => Some(n),
        })
    }
}

/// Encodes `a` as an animated `format` (GIF or WebP; `quality` for WebP).
pub fn encode(a: &Animation, format: ImageFormat, quality: u8) -> Result<Vec<u8>, CodecError> {
    match format {
        ImageFormat::Gif => encode_gif(a),
        ImageFormat::Webp => encode_webp(a, quality),
        _ => Err(CodecError::Internal(format!(
            "{} cannot animate",
            format.name()
        ))),
    }
}

fn size(a: &Animation) -> Result<(u32, u32), CodecError> {
    let first = a
        .frames
        .first()
        .ok_or_else(|| CodecError::Encode("animation", "no frame".into()))?;
    let (w, h) = (first.image.width, first.image.height);
    if a.frames
        .iter()
        .any(|f| (f.image.width, f.image.height) != (w, h))
    {
        return Err(CodecError::Internal(
            "animation frames differ in size".into(),
        ));
    }
    Ok((w, h))
}

/// An animated GIF: one palette per frame (NeuQuant), each frame replacing the last
/// (disposal to background, so transparent pixels show the page, not the previous frame);
/// delays in GIF's hundredths of a second.
fn encode_gif(a: &Animation) -> Result<Vec<u8>, CodecError> {
    let err = |e: gif::EncodingError| CodecError::Encode("GIF", e.to_string());
    let (w, h) = size(a)?;
    let (w, h) = (
        u16::try_from(w).map_err(|_| CodecError::Encode("GIF", "too wide".into()))?,
        u16::try_from(h).map_err(|_| CodecError::Encode("GIF", "too tall".into()))?,
    );
    let mut out = Vec::new();
    {
        let mut enc = gif::Encoder::new(&mut out, w, h, &[]).map_err(err)?;
        let repeat = match a.plays {
            None => gif::Repeat::Infinite,
            Some(n) => gif::Repeat::Finite(u16::try_from(n.saturating_sub(1)).unwrap_or(u16::MAX)),
        };
        enc.set_repeat(repeat).map_err(err)?;
        for f in &a.frames {
            let mut rgba = f.image.to_rgba();
            let mut frame = gif::Frame::from_rgba_speed(w, h, &mut rgba, 10);
            frame.delay = u16::try_from(f.delay_ms.div_ceil(10)).unwrap_or(u16::MAX);
            frame.dispose = gif::DisposalMethod::Background;
            enc.write_frame(&frame).map_err(err)?;
        }
    }
    Ok(out)
}

/// The largest loop count a WebP holds (16 bits; libwebp's `MAX_LOOP_COUNT` - 1).
const MAX_WEBP_PLAYS: u32 = 65_535;

/// libwebp's animation encoder, deleted when dropped.
struct WebpEncoder(*mut libwebp_sys::WebPAnimEncoder);

impl Drop for WebpEncoder {
    fn drop(&mut self) {
        // SAFETY: made by WebPAnimEncoderNewInternal, deleted once.
        unsafe { libwebp_sys::WebPAnimEncoderDelete(self.0) }
    }
}

/// An animated WebP through libwebp's animation encoder (lossy at `quality`, its fast method
/// as for still WebP; frames it finds unchanged are merged), with the loop count and the
/// last frame's own delay (the end timestamp is given).
fn encode_webp(a: &Animation, quality: u8) -> Result<Vec<u8>, CodecError> {
    use libwebp_sys as w;
    let err = |m: String| CodecError::Encode("WebP", m);
    let (width, height) = size(a)?;
    let (iw, ih) = (
        i32::try_from(width).map_err(|_| err("too wide".into()))?,
        i32::try_from(height).map_err(|_| err("too tall".into()))?,
    );
    // SAFETY: options, config and pictures are C structs initialised by libwebp before use;
    // each picture imports (copies) its frame's pixels, which outlive the call, and is freed
    // after it is added; the assembled bytes are copied, then freed by WebPDataClear.
    unsafe {
        let mut opts: w::WebPAnimEncoderOptions = std::mem::zeroed();
        if w::WebPAnimEncoderOptionsInitInternal(&mut opts, w::WebPGetMuxABIVersion()) == 0 {
            return Err(err("libwebp version mismatch".into()));
        }
        // WebP's count is 16 bits (0: forever); a GIF's NETSCAPE count of 65,535 is 65,536
        // plays, which libwebp refuses to assemble: its largest, 65,535, instead.
        opts.anim_params.loop_count = a.plays.map_or(0, |n| n.min(MAX_WEBP_PLAYS) as i32);
        let enc = w::WebPAnimEncoderNewInternal(iw, ih, &opts, w::WebPGetMuxABIVersion());
        if enc.is_null() {
            return Err(err("encoder not created".into()));
        }
        let enc = WebpEncoder(enc);
        let mut config: w::WebPConfig = std::mem::zeroed();
        if !w::WebPInitConfig(&mut config) {
            return Err(err("config".into()));
        }
        config.quality = f32::from(quality);
        config.method = 2; // fast; as still WebP (codec.rs)
        let failed = |enc: &WebpEncoder| {
            let e = w::WebPAnimEncoderGetError(enc.0);
            let m = if e.is_null() {
                "unknown error".to_string()
            } else {
                std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned()
            };
            err(m)
        };
        let mut ts: i32 = 0;
        for f in &a.frames {
            let rgba = f.image.to_rgba();
            let mut pic: w::WebPPicture = std::mem::zeroed();
            if !w::WebPPictureInit(&mut pic) {
                return Err(err("picture".into()));
            }
            pic.use_argb = 1;
            pic.width = iw;
            pic.height = ih;
            if w::WebPPictureImportRGBA(&mut pic, rgba.as_ptr(), iw * 4) == 0 {
                w::WebPPictureFree(&mut pic);
                return Err(err("out of memory".into()));
            }
            let ok = w::WebPAnimEncoderAdd(enc.0, &mut pic, ts, &config);
            w::WebPPictureFree(&mut pic);
            if ok == 0 {
                return Err(failed(&enc));
            }
            ts = ts.saturating_add(i32::try_from(f.delay_ms).unwrap_or(i32::MAX));
        }
        if w::WebPAnimEncoderAdd(enc.0, std::ptr::null_mut(), ts, std::ptr::null()) == 0 {
            return Err(failed(&enc));
        }
        let mut data: w::WebPData = std::mem::zeroed();
        if w::WebPAnimEncoderAssemble(enc.0, &mut data) == 0 {
            return Err(failed(&enc));
        }
        let out = std::slice::from_raw_parts(data.bytes, data.size).to_vec();
        w::WebPDataClear(&mut data);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::sniff;

    const LIMITS: Limits = Limits {
        max_pixels: 1 << 20,
        max_frames: 10,
        max_avif_pixels: 1 << 20,
        max_animation_pixels: 1 << 24,
        ..Limits::DEFAULT
    };

    fn solid(w: u32, h: u32, c: [u8; 4]) -> Raster {
        raster(w, h, c.repeat((w * h) as usize))
    }

    fn anim(colours: &[[u8; 4]], delays: &[u32], plays: Option<u32>) -> Animation {
        Animation {
            frames: colours
                .iter()
                .zip(delays)
                .map(|(c, d)| Frame {
                    image: solid(8, 6, *c),
                    delay_ms: *d,
                })
                .collect(),
            plays,
        }
    }

    fn decode_all(b: &[u8]) -> Animation {
        let p = sniff::probe(b).unwrap();
        map_frames::<CodecError>(b, &p, &LIMITS, Ok).unwrap()
    }

    fn near(a: &[u8], b: [u8; 4]) -> bool {
        a.iter().zip(b).all(|(x, y)| x.abs_diff(y) <= 12)
    }

    #[test]
    fn gif_and_webp_round_trip_frames_delays_and_loops() {
        let colours = [[255, 0, 0, 255], [0, 255, 0, 255], [0, 0, 255, 255]];
        let delays = [100, 250, 40];
        for (format, plays) in [
            (ImageFormat::Gif, None),
            (ImageFormat::Gif, Some(3)),
            (ImageFormat::Webp, None),
            (ImageFormat::Webp, Some(2)),
        ] {
            let bytes = encode(&anim(&colours, &delays, plays), format, 90).unwrap();
            let p = sniff::probe(&bytes).unwrap();
            assert_eq!((p.format, p.frames, p.width, p.height), (format, 3, 8, 6));
            let back = decode_all(&bytes);
            assert_eq!(back.plays, plays, "{format:?}");
            let got: Vec<u32> = back.frames.iter().map(|f| f.delay_ms).collect();
            assert_eq!(got, delays, "{format:?}");
            for (f, c) in back.frames.iter().zip(colours) {
                assert!(
                    near(&f.image.data[..4], c),
                    "{format:?} {:?}",
                    &f.image.data[..4]
                );
            }
        }
    }

    /// A GIF whose second frame covers only a corner and is disposed to the background, and
    /// whose third is drawn over what that left.
    #[test]
    fn gif_disposal_is_composited() {
        let mut out = Vec::new();
        {
            let mut enc = gif::Encoder::new(&mut out, 4, 4, &[]).unwrap();
            let mut full = [200u8, 0, 0, 255].repeat(16);
            let f = gif::Frame::from_rgba(4, 4, &mut full);
            enc.write_frame(&f).unwrap();
            let mut corner = [0u8, 200, 0, 255].repeat(4);
            let mut f = gif::Frame::from_rgba(2, 2, &mut corner);
            f.dispose = gif::DisposalMethod::Background;
            enc.write_frame(&f).unwrap();
            let mut other = [0u8, 0, 200, 255];
            let mut f = gif::Frame::from_rgba(1, 1, &mut other);
            (f.left, f.top) = (3, 3);
            enc.write_frame(&f).unwrap();
        }
        let a = decode_all(&out);
        assert_eq!(a.frames.len(), 3);
        let px = |f: usize, x: usize, y: usize| {
            let i = (y * 4 + x) * 4;
            a.frames[f].image.data[i..i + 4].to_vec()
        };
        assert_eq!(px(1, 0, 0), [0, 200, 0, 255]);
        assert_eq!(px(1, 3, 3), [200, 0, 0, 255]);
        // The corner was cleared after frame 2; the rest of frame 1 stays under frame 3.
        assert_eq!(px(2, 0, 0), [0, 0, 0, 0]);
        assert_eq!(px(2, 2, 2), [200, 0, 0, 255]);
        assert_eq!(px(2, 3, 3), [0, 0, 200, 255]);
    }

    /// An APNG of 4×4: a red default image that is not a frame, then a half-transparent
    /// green frame replacing the canvas (disposed to the background), a blue corner blended
    /// over what that left, and a 2×2 white patch at (2, 2) disposed to the previous canvas.
    fn apng() -> Vec<u8> {
        let mut out = Vec::new();
        {
            let mut e = png::Encoder::new(&mut out, 4, 4);
            e.set_color(png::ColorType::Rgba);
            e.set_animated(3, 2).unwrap();
            e.set_sep_def_img(true).unwrap();
            let mut w = e.write_header().unwrap();
            w.write_image_data(&[255, 0, 0, 255].repeat(16)).unwrap();
            w.set_frame_delay(1, 10).unwrap();
            w.set_dispose_op(png::DisposeOp::None).unwrap();
            w.write_image_data(&[0, 200, 0, 128].repeat(16)).unwrap();
            w.set_frame_dimension(1, 1).unwrap();
            w.set_frame_position(0, 0).unwrap();
            w.set_blend_op(png::BlendOp::Over).unwrap();
            w.set_frame_delay(0, 0).unwrap();
            w.set_dispose_op(png::DisposeOp::Previous).unwrap();
            w.write_image_data(&[0, 0, 255, 255]).unwrap();
            w.set_frame_dimension(2, 2).unwrap();
            w.set_frame_position(2, 2).unwrap();
            w.set_frame_delay(3, 100).unwrap();
            w.set_blend_op(png::BlendOp::Source).unwrap();
            w.set_dispose_op(png::DisposeOp::Background).unwrap();
            w.write_image_data(&[255; 16]).unwrap();
            w.finish().unwrap();
        }
        out
    }

    #[test]
    fn apng_frames_are_blended_and_disposed() {
        let bytes = apng();
        let p = sniff::probe(&bytes).unwrap();
        assert_eq!((p.format, p.frames), (ImageFormat::Png, 3));
        assert!(animates(&p, ImageFormat::Webp) && !animates(&p, ImageFormat::Png));
        let a = decode_all(&bytes);
        assert_eq!(a.plays, Some(2));
        let delays: Vec<u32> = a.frames.iter().map(|f| f.delay_ms).collect();
        assert_eq!(delays, [100, 0, 30]);
        let px = |f: usize, x: usize, y: usize| {
            let i = (y * 4 + x) * 4;
            a.frames[f].image.data[i..i + 4].to_vec()
        };
        // Not the default image's red: the first frame replaced nothing but an empty canvas.
        assert_eq!(px(0, 3, 3), [0, 200, 0, 128]);
        // Opaque blue over it at (0, 0); the rest as it was.
        assert_eq!(px(1, 0, 0), [0, 0, 255, 255]);
        assert_eq!(px(1, 1, 1), [0, 200, 0, 128]);
        // Frame 2 was disposed to the previous canvas: frame 3 is drawn on frame 1's.
        assert_eq!(px(2, 0, 0), [0, 200, 0, 128]);
        assert_eq!(px(2, 3, 3), [255, 255, 255, 255]);
        // A still PNG is one frame.
        let still = crate::images::codec::encode(&a.frames[0].image, ImageFormat::Png, 75).unwrap();
        assert_eq!(sniff::probe(&still).unwrap().frames, 1);
    }

    #[test]
    fn over_blends_straight_alpha() {
        let mut d = [0, 0, 255, 255];
        blend_over(&mut d, [255, 0, 0, 128]);
        assert_eq!(d, [128, 0, 127, 255]);
        let mut d = [0, 0, 0, 0];
        blend_over(&mut d, [10, 20, 30, 40]);
        assert_eq!(d, [10, 20, 30, 40]);
        let mut d = [9, 9, 9, 200];
        blend_over(&mut d, [1, 2, 3, 0]);
        assert_eq!(d, [9, 9, 9, 200]);
    }

    #[test]
    fn frames_beyond_the_limit_are_refused_while_decoding() {
        let bytes = encode(
            &anim(&[[9, 9, 9, 255]; 4], &[10; 4], None),
            ImageFormat::Gif,
            75,
        )
        .unwrap();
        let mut p = sniff::probe(&bytes).unwrap();
        p.frames = 2; // a header that lied
        let limits = Limits {
            max_frames: 2,
            ..LIMITS
        };
        let e = map_frames::<CodecError>(&bytes, &p, &limits, Ok).unwrap_err();
        assert!(matches!(e, CodecError::TooManyFrames { .. }), "{e}");
    }
}
