//! Decoding and encoding, one function per format: JPEG through libjpeg-turbo (DCT-scaled,
//! band-limited decode in [`super::jpeg`], i.e. shrink-on-load, and fast encode, progressive
//! when the route asks), PNG and GIF through the pure-Rust `png` and `gif` crates, WebP through
//! libwebp (an animation's first frame here; every frame in [`super::animation`]), AVIF
//! decoding in [`super::avif`] (rav1d) and encoding in [`super::avif_encode`] (libaom loaded at
//! run time, else rav1e), JPEG XL in
//! [`super::jxl`] (jxl-oxide decoding, libjxl encoding loaded at run time), HEIC decoding in
//! [`super::heif`] (libheif loaded at run time; no HEIC output). Every decoder is guarded by
//! the header probe (pixel, frame and animation limits) and has its own memory limit where it
//! offers one; a bad image is an error, never a panic. Decoded pixels are sRGB: an embedded ICC
//! profile is converted ([`super::colour`]) unless the caller keeps it, CMYK JPEGs are
//! converted to RGB, 16-bit PNGs are rounded to 8 bits after their conversion. Output never
//! carries the source's metadata, except its ICC profile when kept; alpha is flattened onto a
//! background colour where the format has none (JPEG). The pixels, limits and errors they
//! share are in [`super::raster`] (re-exported here), which avif imports rather than this file.

use std::io::Cursor;

use super::colour::{self, Embedded};
pub use super::raster::{CodecError, Limits, Raster};
use super::sniff::{ImageFormat, Probe};
use crate::config::AvifEncoder;

/// The background transparent pixels are flattened onto by default: white.
pub const WHITE: [u8; 3] = [255, 255, 255];

/// Refuses sources over the pixel, frame or animation limits, from the header alone.
pub fn check_limits(p: &Probe, limits: &Limits) -> Result<(), CodecError> {
    if p.pixels() > limits.max_pixels {
        return Err(CodecError::TooManyPixels {
            pixels: p.pixels(),
            limit: limits.max_pixels,
        });
    }
    if p.frames > limits.max_frames {
        return Err(CodecError::TooManyFrames {
            frames: p.frames,
            limit: limits.max_frames,
        });
    }
    let all = p.pixels().saturating_mul(u64::from(p.frames));
    if p.frames > 1 && all > limits.max_animation_pixels {
        return Err(CodecError::TooManyAnimationPixels {
            pixels: all,
            limit: limits.max_animation_pixels,
        });
    }
    Ok(())
}

/// Rows of a decoded image that were really decoded: `top` is the first row kept, in an image
/// `full_height` rows tall (the raster holds rows `top..top + height`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Band {
    pub top: u32,
    pub full_height: u32,
}

/// Decodes the first frame, converted to sRGB. `need` is the smallest size (unoriented) the
/// pipeline needs: a JPEG decoder may shrink to it. `gray` lets the JPEG decoder skip chroma.
/// `rows` (fractions of the unoriented height, top and bottom) is the band the pipeline keeps:
/// a JPEG decoder may decode only it; other decoders return the whole image.
pub fn decode(
    src: &[u8],
    p: &Probe,
    need: (u32, u32),
    gray: bool,
    rows: (f64, f64),
    limits: &Limits,
) -> Result<(Raster, Band), CodecError> {
    decode_colour(src, p, need, gray, rows, limits, false).map(|d| (d.raster, d.band))
}

/// A decoded image and the colour profile its pixels are still in.
pub struct Decoded {
    pub raster: Raster,
    pub band: Band,
    /// The source's ICC profile when it was kept (`keep_icc`) and fits the pixels (an RGB
    /// profile for RGB pixels, a gray one for gray pixels): the output should carry it.
    pub icc: Option<Vec<u8>>,
}

/// [`decode`], converting an embedded ICC profile to sRGB unless `keep_icc` (then the pixels
/// are untouched and the profile comes back in [`Decoded::icc`]). CMYK sources are converted
/// to RGB whatever `keep_icc` says (no output format here carries CMYK).
pub fn decode_colour(
    src: &[u8],
    p: &Probe,
    need: (u32, u32),
    gray: bool,
    rows: (f64, f64),
    limits: &Limits,
    keep_icc: bool,
) -> Result<Decoded, CodecError> {
    let whole = |r: Raster| {
        let band = Band {
            top: 0,
            full_height: r.height,
        };
        (r, band)
    };
    let embedded = colour::embedded(src, p.format);
    // Whether the decoder already applied the profile (CMYK, 16-bit PNG).
    let mut applied = false;
    let convert = if keep_icc {
        None
    } else {
        embedded.icc.as_deref()
    };
    let (mut raster, band) = match p.format {
        ImageFormat::Jpeg => decode_jpeg(src, p, need, gray, rows, &embedded, &mut applied)?,
        ImageFormat::Png => decode_png(src, limits, convert, &mut applied).map(whole)?,
        ImageFormat::Gif => decode_gif(src, p, limits).map(whole)?,
        ImageFormat::Webp => decode_webp(src, p, limits).map(whole)?,
        ImageFormat::Avif => super::avif::decode(src, p, limits).map(whole)?,
        // Converted to sRGB by jxl-oxide itself (`embedded` finds no profile for JPEG XL).
        ImageFormat::Jxl => super::jxl::decode(src, p).map(whole)?,
        ImageFormat::Heic => super::heif::decode(src, p).map(whole)?,
    };
    let mut icc = None;
    if let Some(profile) = embedded.icc.filter(|_| !applied) {
        // A profile kept must fit the pixels; one that does not is converted as usual.
        if keep_icc && colour::fits(&profile, raster.channels) {
            icc = Some(profile);
        } else {
            colour::to_srgb(&mut raster, &profile)?;
        }
    }
    Ok(Decoded { raster, band, icc })
}

fn decode_jpeg(
    src: &[u8],
    p: &Probe,
    need: (u32, u32),
    gray: bool,
    rows: (f64, f64),
    embedded: &Embedded,
    applied: &mut bool,
) -> Result<(Raster, Band), CodecError> {
    let err = |e: super::jpeg::JpegError| CodecError::Decode("JPEG", e.to_string());
    // The probed pixel count bounds the frame libjpeg really decodes: a second, larger SOF is
    // refused rather than decoded.
    let d = super::jpeg::decode(
        src,
        super::jpeg::Request {
            need,
            gray,
            band: rows,
        },
        p.pixels(),
    )
    .map_err(err)?;
    let mut raster = Raster {
        width: d.width,
        height: d.height,
        channels: d.channels,
        data: d.data,
    };
    if d.cmyk {
        // Through the CMYK profile (the only one a CMYK JPEG can have) or naively.
        raster.data = colour::cmyk_to_rgb(
            std::mem::take(&mut raster.data),
            raster.width,
            embedded.icc.as_deref(),
            embedded.adobe,
        );
        raster.channels = 3;
        *applied = true;
        if gray {
            raster = raster.to_gray();
        }
    }
    Ok((
        raster,
        Band {
            top: d.top,
            full_height: d.full_height,
        },
    ))
}

/// PNG with palettes, low bit depths and tRNS expanded. 16-bit samples are converted through
/// `icc` (when given) at 16 bits, then rounded to 8 (`applied` is set); 8-bit ones are left to
/// the caller.
fn decode_png(
    src: &[u8],
    limits: &Limits,
    icc: Option<&[u8]>,
    applied: &mut bool,
) -> Result<Raster, CodecError> {
    let err = |e: png::DecodingError| CodecError::Decode("PNG", e.to_string());
    let mut dec = png::Decoder::new_with_limits(
        Cursor::new(src),
        png::Limits {
            bytes: (limits.max_pixels as usize).saturating_mul(8),
        },
    );
    dec.set_transformations(png::Transformations::EXPAND);
    let mut reader = dec.read_info().map_err(err)?;
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| CodecError::Decode("PNG", "image too large".into()))?;
    let mut buf = vec![0u8; size];
    let info = reader.next_frame(&mut buf).map_err(err)?;
    buf.truncate(info.buffer_size());
    let (w, h) = (info.width, info.height);
    let samples: u8 = match info.color_type {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        png::ColorType::Indexed => {
            return Err(CodecError::Decode("PNG", "palette not expanded".into()))
        }
    };
    if info.bit_depth == png::BitDepth::Sixteen {
        let colour = if samples >= 3 { icc } else { None };
        colour::srgb_8bit_from_16(&mut buf, samples, w, colour);
        *applied = colour.is_some();
    }
    let raster = |channels: u8, data: Vec<u8>| Raster {
        width: w,
        height: h,
        channels,
        data,
    };
    Ok(match samples {
        2 => raster(
            4,
            buf.chunks_exact(2)
                .flat_map(|p| [p[0], p[0], p[0], p[1]])
                .collect(),
        ),
        n => raster(n, buf),
    })
}

/// The first frame, composited onto the GIF's screen ([`super::animation`]'s drawing).
fn decode_gif(src: &[u8], p: &Probe, limits: &Limits) -> Result<Raster, CodecError> {
    let mut d = super::animation::gif_decoder(src, limits)?;
    let (w, h) = super::animation::gif_screen(&d, p);
    let frame = d
        .read_next_frame()
        .map_err(|e| CodecError::Decode("GIF", e.to_string()))?
        .ok_or_else(|| CodecError::Decode("GIF", "no frame".into()))?;
    // Onto a transparent screen.
    let mut data = vec![0u8; w as usize * h as usize * 4];
    super::animation::gif_draw(&mut data, (w, h), frame);
    Ok(Raster {
        width: w,
        height: h,
        channels: 4,
        data,
    })
}

fn decode_webp(src: &[u8], p: &Probe, limits: &Limits) -> Result<Raster, CodecError> {
    // An animation of one frame too: libwebp's still decoder refuses animations.
    if p.frames > 1 || super::animation::webp_is_animation(src) {
        return super::animation::webp_first_frame(src, limits);
    }
    let img = webp::Decoder::new(src)
        .decode()
        .ok_or_else(|| CodecError::Decode("WebP", "invalid bitstream".into()))?;
    Ok(Raster {
        width: img.width(),
        height: img.height(),
        channels: if img.is_alpha() { 4 } else { 3 },
        data: img.to_vec(),
    })
}

/// Encodes with fast settings (AVIF at rav1e's fastest speed); `quality` 1-100 applies to JPEG,
/// WebP, AVIF and JPEG XL.
pub fn encode(img: &Raster, format: ImageFormat, quality: u8) -> Result<Vec<u8>, CodecError> {
    encode_at(img, format, quality, 10)
}

/// [`encode`] with AVIF at speed `avif_speed` (1 slowest to 10 fastest), through libaom when it
/// loads, else rav1e.
pub fn encode_at(
    img: &Raster,
    format: ImageFormat,
    quality: u8,
    avif_speed: u8,
) -> Result<Vec<u8>, CodecError> {
    encode_with(
        img,
        format,
        &Output {
            quality,
            avif_speed,
            avif_encoder: AvifEncoder::Auto,
            bg: WHITE,
            icc: None,
            progressive: false,
            exif: None,
        },
    )
}

/// How an image is encoded, besides its format.
#[derive(Debug, Clone, Copy)]
pub struct Output<'a> {
    /// 1-100, for JPEG, WebP, AVIF and JPEG XL (100: lossless).
    pub quality: u8,
    /// AVIF's speed (1 slowest to 10 fastest): rav1e's preset, libaom's cpu-used plus one.
    pub avif_speed: u8,
    /// The AV1 encoder for AVIF.
    pub avif_encoder: AvifEncoder,
    /// What transparent pixels are flattened onto where the format has no alpha (JPEG).
    pub bg: [u8; 3],
    /// An ICC profile the output carries (JPEG, PNG and WebP; the others have none).
    pub icc: Option<&'a [u8]>,
    /// JPEG is progressive (SOF2, several scans).
    pub progressive: bool,
    /// A TIFF (EXIF) block written by the encoder into its container: AVIF's Exif item. The
    /// other formats get theirs from [`super::metadata::embed`].
    pub exif: Option<&'a [u8]>,
}

/// Encodes as `out` says.
pub fn encode_with(
    img: &Raster,
    format: ImageFormat,
    out: &Output<'_>,
) -> Result<Vec<u8>, CodecError> {
    let bytes = match format {
        ImageFormat::Jpeg => encode_jpeg(img, out.quality, out.bg, out.progressive)?,
        ImageFormat::Png => return encode_png(img, out.icc),
        ImageFormat::Gif => encode_gif(img)?,
        ImageFormat::Webp => encode_webp(img, out.quality)?,
        ImageFormat::Avif => super::avif_encode::encode(
            img,
            out.quality,
            out.avif_speed,
            out.exif,
            out.avif_encoder,
        )?,
        ImageFormat::Jxl => super::jxl::encode(img, out.quality)?,
        ImageFormat::Heic => return Err(CodecError::Unsupported("HEIC output")),
    };
    Ok(match (format, out.icc) {
        (ImageFormat::Jpeg, Some(icc)) => colour::embed_jpeg(&bytes, icc),
        (ImageFormat::Webp, Some(icc)) => colour::embed_webp(&bytes, icc),
        _ => bytes,
    })
}

fn encode_jpeg(
    img: &Raster,
    quality: u8,
    bg: [u8; 3],
    progressive: bool,
) -> Result<Vec<u8>, CodecError> {
    let err = |e: turbojpeg::Error| CodecError::Encode("JPEG", e.to_string());
    let rgb;
    let (pixels, format, channels, subsamp) = if img.channels == 1 {
        (
            img.data.as_slice(),
            turbojpeg::PixelFormat::GRAY,
            1,
            turbojpeg::Subsamp::Gray,
        )
    } else {
        rgb = img.to_rgb_over(bg);
        (
            rgb.as_slice(),
            turbojpeg::PixelFormat::RGB,
            3,
            turbojpeg::Subsamp::Sub2x2,
        )
    };
    thread_local! {
        /// One compressor per pool thread, reused (its setup allocates).
        static COMPRESSOR: std::cell::RefCell<Option<turbojpeg::Compressor>> =
            const { std::cell::RefCell::new(None) };
    }
    COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let mut c = match slot.take() {
            Some(c) => c,
            None => turbojpeg::Compressor::new().map_err(err)?,
        };
        c.set_quality(i32::from(quality)).map_err(err)?;
        c.set_subsamp(subsamp).map_err(err)?;
        c.set_progressive(progressive).map_err(err)?;
        // Huffman tables made for the image (libvips's `optimize_coding`, which imgproxy
        // sets): 640x856 -> 100x100 fill q80 is 3,136 bytes instead of 3,440 (imgproxy's
        // 3,269), the same pixels, ~20 µs more a request.
        c.set_optimize(true).map_err(err)?;
        let out = c
            .compress_to_owned(turbojpeg::Image {
                pixels,
                width: img.width as usize,
                pitch: img.width as usize * channels,
                height: img.height as usize,
                format,
            })
            .map_err(err)?
            .to_vec();
        // A handle is kept only after a success.
        *slot = Some(c);
        Ok(out)
    })
}

fn encode_png(img: &Raster, icc: Option<&[u8]>) -> Result<Vec<u8>, CodecError> {
    let err = |e: png::EncodingError| CodecError::Encode("PNG", e.to_string());
    let mut out = Vec::new();
    let mut info = png::Info::with_size(img.width, img.height);
    info.color_type = match img.channels {
        1 => png::ColorType::Grayscale,
        3 => png::ColorType::Rgb,
        _ => png::ColorType::Rgba,
    };
    info.bit_depth = png::BitDepth::Eight;
    info.icc_profile = icc.map(std::borrow::Cow::Borrowed);
    let mut enc = png::Encoder::with_info(&mut out, info).map_err(err)?;
    enc.set_compression(png::Compression::Fast);
    let mut w = enc.write_header().map_err(err)?;
    w.write_image_data(&img.data).map_err(err)?;
    w.finish().map_err(err)?;
    Ok(out)
}

fn encode_gif(img: &Raster) -> Result<Vec<u8>, CodecError> {
    let err = |e: gif::EncodingError| CodecError::Encode("GIF", e.to_string());
    let (w, h) = (
        u16::try_from(img.width).map_err(|_| CodecError::Encode("GIF", "too wide".into()))?,
        u16::try_from(img.height).map_err(|_| CodecError::Encode("GIF", "too tall".into()))?,
    );
    let mut rgba = img.to_rgba();
    let frame = gif::Frame::from_rgba_speed(w, h, &mut rgba, 10);
    let mut out = Vec::new();
    {
        let mut enc = gif::Encoder::new(&mut out, w, h, &[]).map_err(err)?;
        enc.write_frame(&frame).map_err(err)?;
    }
    Ok(out)
}

fn encode_webp(img: &Raster, quality: u8) -> Result<Vec<u8>, CodecError> {
    let alpha = img.has_alpha();
    let px = if alpha { img.to_rgba() } else { img.to_rgb() };
    let enc = if alpha {
        webp::Encoder::from_rgba(&px, img.width, img.height)
    } else {
        webp::Encoder::from_rgb(&px, img.width, img.height)
    };
    let mut cfg =
        webp::WebPConfig::new().map_err(|()| CodecError::Encode("WebP", "config".into()))?;
    cfg.quality = f32::from(quality);
    // libwebp's fastest method (imgproxy uses libvips's default, 4): 1000x872 -> 500 wide q80
    // encodes in 5.1 ms instead of method 2's 8.1 (4: 18.5). The loop filter at its strongest
    // costs no bytes and lifts SSIM against a float reference (0.9206 -> 0.9214 there; 34,016
    // bytes; imgproxy 0.9254, 32,432 bytes): within scenario imgproxy's quality bound.
    cfg.method = 0;
    cfg.filter_strength = 100;
    let mem = enc
        .encode_advanced(&cfg)
        .map_err(|e| CodecError::Encode("WebP", format!("{e:?}")))?;
    Ok(mem.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::sniff;

    #[test]
    fn jpeg_shrinks_on_load_to_the_nearest_size_above() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/data/photo-640x856.jpg");
        let b = std::fs::read(path).expect("bench/data photo in the repository");
        let p = sniff::probe(&b).unwrap();
        let limits = Limits {
            max_frames: 1,
            max_animation_pixels: 500_000_000,
            ..Limits::DEFAULT
        };
        // 100×134 needed: 2/8 (160×214) is the smallest scale at or above it.
        let (r, band) = decode(&b, &p, (100, 134), true, (0.0, 1.0), &limits).unwrap();
        assert_eq!((r.width, r.height, r.channels), (160, 214, 1));
        assert_eq!(
            band,
            Band {
                top: 0,
                full_height: 214
            }
        );
        let (r, _) = decode(&b, &p, (640, 856), false, (0.0, 1.0), &limits).unwrap();
        assert_eq!((r.width, r.height, r.channels), (640, 856, 3));
        // A cover crop to 100×100 keeps the middle rows: only they (plus two each side) decode.
        let (r, band) = decode(&b, &p, (100, 134), true, (0.1262, 0.8738), &limits).unwrap();
        assert_eq!(
            band,
            Band {
                top: 25,
                full_height: 214
            }
        );
        assert_eq!((r.width, r.height), (160, 189 - 25));
    }

    /// JPEG output carries Huffman tables made for the image (as imgproxy's): smaller than
    /// libjpeg's standard tables, the same pixels once decoded.
    #[test]
    fn jpeg_output_has_optimized_huffman_tables() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/data/photo-640x856.jpg");
        let src = std::fs::read(path).expect("bench/data photo in the repository");
        let img = turbojpeg::decompress(&src, turbojpeg::PixelFormat::RGB).unwrap();
        let raster = Raster {
            width: img.width as u32,
            height: img.height as u32,
            channels: 3,
            data: img.pixels.clone(),
        };
        let ours = encode(&raster, ImageFormat::Jpeg, 80).unwrap();
        let mut c = turbojpeg::Compressor::new().unwrap();
        c.set_quality(80).unwrap();
        c.set_subsamp(turbojpeg::Subsamp::Sub2x2).unwrap();
        let standard = c
            .compress_to_vec(turbojpeg::Image {
                pixels: raster.data.as_slice(),
                width: img.width,
                pitch: img.width * 3,
                height: img.height,
                format: turbojpeg::PixelFormat::RGB,
            })
            .unwrap();
        // Smaller (2.5% at this size; 9% for a 100x100 thumbnail); with the standard tables
        // the two would be the same bytes.
        assert!(
            ours.len() < standard.len(),
            "{} bytes against the standard tables' {}",
            ours.len(),
            standard.len()
        );
        let decode = |b: &[u8]| turbojpeg::decompress(b, turbojpeg::PixelFormat::RGB).unwrap();
        assert_eq!(decode(&ours).pixels, decode(&standard).pixels);
    }

    #[test]
    fn corrupt_data_is_an_error_not_a_panic() {
        let limits = Limits {
            max_pixels: 1 << 20,
            max_frames: 10,
            max_animation_pixels: 500_000_000,
            ..Limits::DEFAULT
        };
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\0\0\x10\0\0\0\x10\x08\x02\0\0\0".to_vec();
        png.extend_from_slice(b"garbage garbage garbage");
        let p = sniff::probe(&png).unwrap();
        assert!(decode(&png, &p, (1, 1), false, (0.0, 1.0), &limits).is_err());
        let jpeg =
            b"\xFF\xD8\xFF\xC0\0\x11\x08\0\x10\0\x10\x03\x01\x22\0\x02\x11\x01\x03\x11\x01junk";
        let p = sniff::probe(jpeg).unwrap();
        assert!(decode(jpeg, &p, (1, 1), false, (0.0, 1.0), &limits).is_err());
    }
}
