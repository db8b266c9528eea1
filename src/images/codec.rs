//! Decoding and encoding, one function per format: JPEG through libjpeg-turbo (DCT-scaled,
//! band-limited decode in [`super::jpeg`], i.e. shrink-on-load, and fast encode), PNG and GIF through the pure-Rust `png` and `gif`
//! crates, WebP through libwebp, AVIF decoding in [`super::avif`] (rav1d) and encoding through
//! rav1e (`ravif`). Every decoder is guarded by the header probe (pixel and frame limits) and has
//! its own memory limit where it offers one; a bad image is an error, never a panic. Output never
//! carries the source's metadata. The pixels, limits and errors they share are in
//! [`super::raster`] (re-exported here), which avif imports rather than this file.

use std::io::Cursor;

pub use super::raster::{CodecError, Limits, Raster};
use super::sniff::{ImageFormat, Probe};

/// Refuses sources over the pixel or frame limits, from the header alone.
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
    Ok(())
}

/// Rows of a decoded image that were really decoded: `top` is the first row kept, in an image
/// `full_height` rows tall (the raster holds rows `top..top + height`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Band {
    pub top: u32,
    pub full_height: u32,
}

/// Decodes the first frame. `need` is the smallest size (unoriented) the pipeline needs: a JPEG
/// decoder may shrink to it. `gray` lets the JPEG decoder skip chroma. `rows` (fractions of the
/// unoriented height, top and bottom) is the band the pipeline keeps: a JPEG decoder may decode
/// only it; other decoders return the whole image.
pub fn decode(
    src: &[u8],
    p: &Probe,
    need: (u32, u32),
    gray: bool,
    rows: (f64, f64),
    limits: &Limits,
) -> Result<(Raster, Band), CodecError> {
    let whole = |r: Raster| {
        let band = Band {
            top: 0,
            full_height: r.height,
        };
        (r, band)
    };
    match p.format {
        ImageFormat::Jpeg => decode_jpeg(src, p, need, gray, rows),
        ImageFormat::Png => decode_png(src, limits).map(whole),
        ImageFormat::Gif => decode_gif(src, p, limits).map(whole),
        ImageFormat::Webp => decode_webp(src, p).map(whole),
        ImageFormat::Avif => super::avif::decode(src, p, limits).map(whole),
    }
}

fn decode_jpeg(
    src: &[u8],
    p: &Probe,
    need: (u32, u32),
    gray: bool,
    rows: (f64, f64),
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
    Ok((
        Raster {
            width: d.width,
            height: d.height,
            channels: d.channels,
            data: d.data,
        },
        Band {
            top: d.top,
            full_height: d.full_height,
        },
    ))
}

fn decode_png(src: &[u8], limits: &Limits) -> Result<Raster, CodecError> {
    let err = |e: png::DecodingError| CodecError::Decode("PNG", e.to_string());
    let mut dec = png::Decoder::new_with_limits(
        Cursor::new(src),
        png::Limits {
            bytes: (limits.max_pixels as usize).saturating_mul(8),
        },
    );
    dec.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = dec.read_info().map_err(err)?;
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| CodecError::Decode("PNG", "image too large".into()))?;
    let mut buf = vec![0u8; size];
    let info = reader.next_frame(&mut buf).map_err(err)?;
    buf.truncate(info.buffer_size());
    let (w, h) = (info.width, info.height);
    let raster = |channels: u8, data: Vec<u8>| Raster {
        width: w,
        height: h,
        channels,
        data,
    };
    Ok(match info.color_type {
        png::ColorType::Grayscale => raster(1, buf),
        png::ColorType::Rgb => raster(3, buf),
        png::ColorType::Rgba => raster(4, buf),
        png::ColorType::GrayscaleAlpha => raster(
            4,
            buf.chunks_exact(2)
                .flat_map(|p| [p[0], p[0], p[0], p[1]])
                .collect(),
        ),
        png::ColorType::Indexed => {
            return Err(CodecError::Decode("PNG", "palette not expanded".into()))
        }
    })
}

fn decode_gif(src: &[u8], p: &Probe, limits: &Limits) -> Result<Raster, CodecError> {
    let err = |e: gif::DecodingError| CodecError::Decode("GIF", e.to_string());
    let mut opts = gif::DecodeOptions::new();
    opts.set_color_output(gif::ColorOutput::RGBA);
    let bytes = limits.max_pixels.saturating_mul(4).min(u64::from(u32::MAX));
    opts.set_memory_limit(gif::MemoryLimit::Bytes(
        std::num::NonZeroU64::new(bytes).unwrap_or(std::num::NonZeroU64::MIN),
    ));
    let mut d = opts.read_info(Cursor::new(src)).map_err(err)?;
    let (sw, sh) = (u32::from(d.width()), u32::from(d.height()));
    let (w, h) = (sw.max(1).min(p.width), sh.max(1).min(p.height));
    let frame = d
        .read_next_frame()
        .map_err(err)?
        .ok_or_else(|| CodecError::Decode("GIF", "no frame".into()))?;
    // Compose the first frame onto a transparent screen.
    let mut data = vec![0u8; w as usize * h as usize * 4];
    let (fl, ft) = (usize::from(frame.left), usize::from(frame.top));
    let (fw, fh) = (usize::from(frame.width), usize::from(frame.height));
    for y in 0..fh {
        let ty = ft + y;
        if ty >= h as usize {
            break;
        }
        for x in 0..fw {
            let tx = fl + x;
            if tx >= w as usize {
                break;
            }
            let s = (y * fw + x) * 4;
            let t = (ty * w as usize + tx) * 4;
            if let Some(px) = frame.buffer.get(s..s + 4) {
                data[t..t + 4].copy_from_slice(px);
            }
        }
    }
    Ok(Raster {
        width: w,
        height: h,
        channels: 4,
        data,
    })
}

fn decode_webp(src: &[u8], p: &Probe) -> Result<Raster, CodecError> {
    if p.frames > 1 {
        let anim = webp::AnimDecoder::new(src)
            .decode()
            .map_err(|e| CodecError::Decode("WebP", e))?;
        let frame = anim
            .get_frame(0)
            .ok_or_else(|| CodecError::Decode("WebP", "no frame".into()))?;
        let channels = if frame.get_layout().is_alpha() { 4 } else { 3 };
        return Ok(Raster {
            width: frame.width(),
            height: frame.height(),
            channels,
            data: frame.get_image().to_vec(),
        });
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
/// WebP and AVIF.
pub fn encode(img: &Raster, format: ImageFormat, quality: u8) -> Result<Vec<u8>, CodecError> {
    encode_at(img, format, quality, 10)
}

/// [`encode`] with AVIF at rav1e's speed preset `avif_speed` (1 slowest to 10 fastest).
pub fn encode_at(
    img: &Raster,
    format: ImageFormat,
    quality: u8,
    avif_speed: u8,
) -> Result<Vec<u8>, CodecError> {
    match format {
        ImageFormat::Jpeg => encode_jpeg(img, quality),
        ImageFormat::Png => encode_png(img),
        ImageFormat::Gif => encode_gif(img),
        ImageFormat::Webp => encode_webp(img, quality),
        ImageFormat::Avif => encode_avif(img, quality, avif_speed),
    }
}

fn encode_jpeg(img: &Raster, quality: u8) -> Result<Vec<u8>, CodecError> {
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
        rgb = img.to_rgb();
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

fn encode_png(img: &Raster) -> Result<Vec<u8>, CodecError> {
    let err = |e: png::EncodingError| CodecError::Encode("PNG", e.to_string());
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, img.width, img.height);
    enc.set_color(match img.channels {
        1 => png::ColorType::Grayscale,
        3 => png::ColorType::Rgb,
        _ => png::ColorType::Rgba,
    });
    enc.set_depth(png::BitDepth::Eight);
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
    cfg.method = 2; // fast; 4 is libwebp's default
    let mem = enc
        .encode_advanced(&cfg)
        .map_err(|e| CodecError::Encode("WebP", format!("{e:?}")))?;
    Ok(mem.to_vec())
}

fn encode_avif(img: &Raster, quality: u8, speed: u8) -> Result<Vec<u8>, CodecError> {
    use rgb::FromSlice;
    let enc = ravif::Encoder::new()
        .with_quality(f32::from(quality))
        .with_alpha_quality(f32::from(quality))
        .with_speed(speed.clamp(1, 10))
        .with_num_threads(Some(1));
    let (w, h) = (img.width as usize, img.height as usize);
    let res = if img.has_alpha() {
        let px = img.to_rgba();
        enc.encode_rgba(imgref::Img::new(px.as_rgba(), w, h))
    } else {
        let px = img.to_rgb();
        enc.encode_rgb(imgref::Img::new(px.as_rgb(), w, h))
    };
    res.map(|e| e.avif_file)
        .map_err(|e| CodecError::Encode("AVIF", e.to_string()))
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
            max_pixels: 50_000_000,
            max_dim: 4096,
            max_frames: 1,
            max_upscale: 1.0,
            avif_speed: 10,
            max_avif_pixels: 2_073_600,
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

    #[test]
    fn corrupt_data_is_an_error_not_a_panic() {
        let limits = Limits {
            max_pixels: 1 << 20,
            max_dim: 4096,
            max_frames: 10,
            max_upscale: 1.0,
            avif_speed: 10,
            max_avif_pixels: 2_073_600,
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
