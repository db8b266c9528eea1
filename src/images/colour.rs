//! Colour: the ICC profile a source embeds (JPEG APP2 chunks, PNG iCCP, WebP ICCP, AVIF `colr`
//! prof, located by `sniff`) read from its container, pixels converted to sRGB with moxcms
//! (Display P3 from phones, Adobe RGB, CMYK with its LUT profile), CMYK without a profile
//! converted naively, and the profile written back into an output (JPEG APP2, PNG iCCP, WebP
//! ICCP) when the caller keeps it.
//!
//! ```text
//! source ─▶ embedded(): no profile ─▶ nothing to do (the common case pays a header walk)
//!                       profile ─▶ SHA-256 ─▶ cache (bounded) ─hit─▶ sRGB? nothing : transform
//!                                                 └miss─▶ parse, build the transform, probe a
//!                                                         grid of colours: sRGB-equivalent
//!                                                         profiles are remembered as such
//! ```
//!
//! A profile that cannot be parsed or used is ignored (the pixels are taken as sRGB, as
//! browsers do), never an error.

use std::io::Read;
use std::sync::{Arc, OnceLock};

use moxcms::{
    ColorProfile, DataColorSpace, Layout, RenderingIntent, Transform16BitExecutor,
    Transform8BitExecutor, TransformOptions,
};

use super::raster::{CodecError, Raster};
use super::sniff::ImageFormat;

/// The largest profile read from a source (CMYK profiles with LUTs reach a few MB).
pub const MAX_PROFILE: usize = 4 << 20;
/// Profiles whose transforms are kept, by their SHA-256.
const CACHED_TRANSFORMS: usize = 32;

/// What a source's container says about its colour.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Embedded {
    /// The ICC profile, reassembled.
    pub icc: Option<Vec<u8>>,
    /// A JPEG with Adobe's APP14 marker: its CMYK samples are stored inverted (255 = no ink).
    pub adobe: bool,
}

/// Reads the embedded profile (and, for JPEG, Adobe's marker) from the headers, without
/// decoding pixels. Malformed or oversized profile data is ignored.
pub fn embedded(src: &[u8], format: ImageFormat) -> Embedded {
    match format {
        ImageFormat::Jpeg => jpeg(src),
        ImageFormat::Png => Embedded {
            icc: png(src),
            adobe: false,
        },
        ImageFormat::Webp => Embedded {
            icc: webp(src),
            adobe: false,
        },
        // Both HEIF: the primary item's `colr` property.
        ImageFormat::Avif | ImageFormat::Heic => Embedded {
            icc: super::sniff::avif_header(src)
                .ok()
                .and_then(|h| h.icc)
                .and_then(|(start, end)| src.get(start..end))
                .filter(|p| p.len() <= MAX_PROFILE)
                .map(<[u8]>::to_vec),
            adobe: false,
        },
        // JPEG XL: jxl-oxide renders to sRGB itself, through its own profile handling.
        ImageFormat::Gif | ImageFormat::Jxl => Embedded::default(),
    }
}

fn be16(b: &[u8], at: usize) -> Option<usize> {
    Some(usize::from(u16::from_be_bytes(
        b.get(at..at + 2)?.try_into().ok()?,
    )))
}

/// Walks the markers before the first scan: APP2 `ICC_PROFILE` chunks (numbered, possibly out
/// of order) and APP14 `Adobe`.
fn jpeg(b: &[u8]) -> Embedded {
    let mut chunks: Vec<(u8, &[u8])> = Vec::new();
    let mut count = 0u8;
    let mut adobe = false;
    let mut i = 2;
    while b.get(i) == Some(&0xFF) {
        let Some(&marker) = b.get(i + 1) else { break };
        if marker == 0xFF {
            i += 1;
            continue;
        }
        if marker == 0xD8 || (0xD0..=0xD7).contains(&marker) || marker == 0x01 {
            i += 2;
            continue;
        }
        let Some(len) = be16(b, i + 2).filter(|&l| l >= 2) else {
            break;
        };
        let Some(seg) = b.get(i + 4..i + 2 + len) else {
            break;
        };
        match marker {
            0xE2 if seg.len() > 14 && seg.starts_with(b"ICC_PROFILE\0") => {
                count = seg[13];
                chunks.push((seg[12], &seg[14..]));
            }
            0xEE if seg.starts_with(b"Adobe") => adobe = true,
            0xDA | 0xD9 => break,
            _ => {}
        }
        i += 2 + len;
    }
    chunks.sort_by_key(|c| c.0);
    // Every chunk 1..=count, once each.
    let complete = count > 0
        && chunks.len() == usize::from(count)
        && chunks
            .iter()
            .enumerate()
            .all(|(n, c)| usize::from(c.0) == n + 1);
    let icc = complete
        .then(|| {
            chunks
                .iter()
                .flat_map(|c| c.1.iter().copied())
                .collect::<Vec<u8>>()
        })
        .filter(|p| p.len() <= MAX_PROFILE);
    Embedded { icc, adobe }
}

/// The iCCP chunk before the first IDAT: a name, a compression byte, zlib data.
fn png(b: &[u8]) -> Option<Vec<u8>> {
    let mut i = 8;
    loop {
        let len = u32::from_be_bytes(b.get(i..i + 4)?.try_into().ok()?) as usize;
        let kind = b.get(i + 4..i + 8)?;
        if kind == b"IDAT" || kind == b"IEND" {
            return None;
        }
        if kind == b"iCCP" {
            let data = b.get(i + 8..i + 8 + len)?;
            let name_end = data.iter().take(80).position(|&c| c == 0)?;
            let z = data.get(name_end + 2..)?;
            let mut out = Vec::new();
            flate2::read::ZlibDecoder::new(z)
                .take(MAX_PROFILE as u64 + 1)
                .read_to_end(&mut out)
                .ok()?;
            return (out.len() <= MAX_PROFILE).then_some(out);
        }
        i = i.checked_add(12 + len)?;
    }
}

/// The ICCP chunk of an extended (VP8X) WebP.
fn webp(b: &[u8]) -> Option<Vec<u8>> {
    let mut i = 12;
    loop {
        let kind = b.get(i..i + 4)?;
        let len = u32::from_le_bytes(b.get(i + 4..i + 8)?.try_into().ok()?) as usize;
        if kind == b"ICCP" {
            return b
                .get(i + 8..i + 8 + len)
                .filter(|p| p.len() <= MAX_PROFILE)
                .map(<[u8]>::to_vec);
        }
        if kind == b"VP8 " || kind == b"VP8L" {
            return None;
        }
        i = i.checked_add(8 + len + (len & 1))?;
    }
}

/// The pixel layouts a transform is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Rgb8,
    Rgba8,
    Rgb16,
    Rgba16,
    /// CMYK (ICC convention: 0 is no ink) to RGB, 8 bits.
    Cmyk8,
}

#[derive(Clone)]
enum Exec {
    U8(Arc<Transform8BitExecutor>),
    U16(Arc<Transform16BitExecutor>),
}

/// A transform to sRGB, or `None` when there is nothing to do (an sRGB-equivalent profile, or
/// one that cannot be used).
type Cached = Option<Exec>;

fn cache() -> &'static quick_cache::sync::Cache<([u8; 32], Kind), Cached> {
    static CACHE: OnceLock<quick_cache::sync::Cache<([u8; 32], Kind), Cached>> = OnceLock::new();
    CACHE.get_or_init(|| quick_cache::sync::Cache::new(CACHED_TRANSFORMS))
}

fn transform(icc: &[u8], kind: Kind) -> Cached {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, icc);
    let mut key = [0u8; 32];
    key.copy_from_slice(digest.as_ref());
    cache()
        .get_or_insert_with(&(key, kind), || Ok::<_, ()>(build(icc, kind)))
        .unwrap_or(None)
}

fn options() -> TransformOptions {
    TransformOptions {
        rendering_intent: RenderingIntent::RelativeColorimetric,
        ..TransformOptions::default()
    }
}

fn build(icc: &[u8], kind: Kind) -> Cached {
    let src = ColorProfile::new_from_slice(icc)
        .map_err(|e| tracing::debug!("ignoring an ICC profile: {e}"))
        .ok()?;
    let srgb = ColorProfile::new_srgb();
    let (from, to) = match kind {
        Kind::Rgb8 | Kind::Rgb16 => (Layout::Rgb, Layout::Rgb),
        Kind::Rgba8 | Kind::Rgba16 => (Layout::Rgba, Layout::Rgba),
        Kind::Cmyk8 => (Layout::Rgba, Layout::Rgb),
    };
    let wanted = if kind == Kind::Cmyk8 {
        DataColorSpace::Cmyk
    } else {
        DataColorSpace::Rgb
    };
    if src.color_space != wanted {
        return None;
    }
    // Before the transform: a 16-bit one takes ~20 ms to build, an 8-bit probe ~0.5 ms.
    if kind != Kind::Cmyk8 && is_srgb(&src, &srgb) {
        return None;
    }
    let built = match kind {
        Kind::Rgb16 | Kind::Rgba16 => src
            .create_transform_16bit(from, &srgb, to, options())
            .map(Exec::U16),
        _ => src
            .create_transform_8bit(from, &srgb, to, options())
            .map(Exec::U8),
    };
    built
        .map_err(|e| tracing::debug!("ignoring an ICC profile: {e}"))
        .ok()
}

/// Whether an RGB profile maps every colour of a 9×9×9 grid to itself within one level: sRGB
/// itself, whichever of its many encodings (v2, v4, compact) a source carries.
fn is_srgb(src: &ColorProfile, srgb: &ColorProfile) -> bool {
    let Ok(t) = src.create_transform_8bit(Layout::Rgb, srgb, Layout::Rgb, options()) else {
        return false;
    };
    let levels = [0u8, 32, 64, 96, 128, 160, 192, 224, 255];
    let mut grid = Vec::with_capacity(levels.len().pow(3) * 3);
    for r in levels {
        for g in levels {
            for b in levels {
                grid.extend_from_slice(&[r, g, b]);
            }
        }
    }
    let mut out = vec![0u8; grid.len()];
    t.transform(&grid, &mut out).is_ok() && grid.iter().zip(&out).all(|(a, b)| a.abs_diff(*b) <= 1)
}

/// Whether `icc` describes something other than sRGB that [`to_srgb`] would convert (an RGB
/// profile; CMYK sources are converted by [`cmyk_to_rgb`] whatever their profile).
pub fn needs_conversion(icc: &[u8]) -> bool {
    transform(icc, Kind::Rgb8).is_some()
}

/// Converts RGB or RGBA pixels described by `icc` to sRGB, in place, a row at a time (alpha
/// untouched). Gray images, sRGB profiles and unusable profiles are left as they are.
pub fn to_srgb(img: &mut Raster, icc: &[u8]) -> Result<(), CodecError> {
    let kind = match img.channels {
        3 => Kind::Rgb8,
        4 => Kind::Rgba8,
        _ => return Ok(()),
    };
    if let Some(Exec::U8(t)) = transform(icc, kind) {
        let row = img.width as usize * usize::from(img.channels);
        rows_in_place(&mut img.data, row, |src, dst| t.transform(src, dst))?;
    }
    Ok(())
}

/// 16-bit big-endian samples (as PNG stores them; `channels` a pixel) to 8 bits rounded to
/// nearest, in place (`buf` ends half as long), RGB and RGBA converted through `icc` (when
/// given and usable) at 16 bits first: the conversion has the precision the source has. A row
/// at a time: no second image-sized buffer.
pub fn srgb_8bit_from_16(buf: &mut Vec<u8>, channels: u8, width: u32, icc: Option<&[u8]>) {
    let kind = match channels {
        3 => Some(Kind::Rgb16),
        4 => Some(Kind::Rgba16),
        _ => None,
    };
    let exec = match icc.zip(kind).and_then(|(icc, kind)| transform(icc, kind)) {
        Some(Exec::U16(t)) => Some(t),
        _ => None,
    };
    let row = (width as usize * usize::from(channels)).max(1);
    let (mut src, mut dst) = (vec![0u16; row], vec![0u16; row]);
    let rows = buf.len() / 2 / row;
    // Row r is read from bytes 2r·row.. and written to r·row..: never ahead of what is read,
    // and the row is copied out before it is written.
    for r in 0..rows {
        let from = &buf[2 * r * row..2 * (r + 1) * row];
        for (s, b) in src.iter_mut().zip(from.chunks_exact(2)) {
            *s = u16::from_be_bytes([b[0], b[1]]);
        }
        let converted = exec
            .as_ref()
            .is_some_and(|t| t.transform(&src, &mut dst).is_ok());
        let samples = if converted { &dst } else { &src };
        for (o, &v) in buf[r * row..(r + 1) * row].iter_mut().zip(samples) {
            *o = to_8bit(v);
        }
    }
    buf.truncate(rows * row);
    buf.shrink_to_fit();
}

/// Whether a profile's colour space (its header's, bytes 16-19) is the pixels': RGB for 3 or 4
/// channels, gray for 1. Only such a profile may be written into an output.
pub fn fits(icc: &[u8], channels: u8) -> bool {
    match icc.get(16..20) {
        Some(b"RGB ") => channels >= 3,
        Some(b"GRAY") => channels == 1,
        _ => false,
    }
}

/// A 16-bit sample to 8 bits, rounded to nearest (v × 255 / 65535).
pub fn to_8bit(v: u16) -> u8 {
    ((u32::from(v) * 255 + 32767) / 65535) as u8
}

/// Runs `f` (src row → dst row) over each `row`-long row of `data`, writing back in place.
fn rows_in_place<T: Copy + Default>(
    data: &mut [T],
    row: usize,
    f: impl Fn(&[T], &mut [T]) -> Result<(), moxcms::CmsError>,
) -> Result<(), CodecError> {
    if row == 0 {
        return Ok(());
    }
    let mut tmp = vec![T::default(); row];
    for r in data.chunks_exact_mut(row) {
        f(r, &mut tmp).map_err(|e| CodecError::Internal(format!("colour conversion: {e}")))?;
        r.copy_from_slice(&tmp);
    }
    Ok(())
}

/// CMYK samples (4 a pixel) to RGB: through `icc` when it is a usable CMYK profile, else
/// naively (R = (1 − C)(1 − K) …). `adobe`: the samples are stored inverted, as Adobe writes
/// them (and as a JPEG with its APP14 marker is read by libvips and browsers).
pub fn cmyk_to_rgb(mut cmyk: Vec<u8>, width: u32, icc: Option<&[u8]>, adobe: bool) -> Vec<u8> {
    if adobe {
        cmyk.iter_mut().for_each(|v| *v = 255 - *v);
    }
    let pixels = cmyk.len() / 4;
    let mut rgb = vec![0u8; pixels * 3];
    if let Some(Exec::U8(t)) = icc.and_then(|icc| transform(icc, Kind::Cmyk8)) {
        let w = width.max(1) as usize;
        let ok = cmyk
            .chunks(w * 4)
            .zip(rgb.chunks_mut(w * 3))
            .all(|(s, d)| t.transform(s, d).is_ok());
        if ok {
            return rgb;
        }
        tracing::debug!("CMYK profile conversion failed; converting naively");
    }
    for (p, out) in cmyk.chunks_exact(4).zip(rgb.chunks_exact_mut(3)) {
        let k = 255 - u32::from(p[3]);
        for (o, &c) in out.iter_mut().zip(&p[..3]) {
            *o = (((255 - u32::from(c)) * k + 127) / 255) as u8;
        }
    }
    rgb
}

/// `jpeg` with `icc` embedded as APP2 `ICC_PROFILE` chunks (up to 65 519 bytes each), placed
/// after the SOI and any APP0 (JFIF) segment.
pub fn embed_jpeg(jpeg: &[u8], icc: &[u8]) -> Vec<u8> {
    const CHUNK: usize = 65_519;
    let chunks: Vec<&[u8]> = icc.chunks(CHUNK).collect();
    if chunks.is_empty() || chunks.len() > 255 || !jpeg.starts_with(&[0xFF, 0xD8]) {
        return jpeg.to_vec();
    }
    let mut at = 2;
    if jpeg.get(2..4) == Some(&[0xFF, 0xE0]) {
        at = be16(jpeg, 4).map_or(2, |len| 4 + len).min(jpeg.len());
    }
    let mut out = Vec::with_capacity(jpeg.len() + icc.len() + 18 * chunks.len());
    out.extend_from_slice(&jpeg[..at]);
    for (n, c) in chunks.iter().enumerate() {
        out.extend_from_slice(&[0xFF, 0xE2]);
        out.extend_from_slice(&((c.len() + 16) as u16).to_be_bytes());
        out.extend_from_slice(b"ICC_PROFILE\0");
        out.extend_from_slice(&[(n + 1) as u8, chunks.len() as u8]);
        out.extend_from_slice(c);
    }
    out.extend_from_slice(&jpeg[at..]);
    out
}

/// A simple (VP8 or VP8L) or extended WebP file with `icc` in an ICCP chunk: the file becomes
/// extended (a VP8X chunk with the ICC flag) if it was not.
pub fn embed_webp(webp: &[u8], icc: &[u8]) -> Vec<u8> {
    let le32 = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    let (Some(kind), Ok(icc_len)) = (webp.get(12..16), u32::try_from(icc.len())) else {
        return webp.to_vec();
    };
    let body = &webp[12..];
    let mut vp8x: Vec<u8>;
    let rest: &[u8];
    if kind == b"VP8X" {
        let Some(head) = body.get(..18) else {
            return webp.to_vec();
        };
        vp8x = head.to_vec();
        vp8x[8] |= 0x20;
        rest = &body[18..];
    } else {
        // Canvas size and alpha from the bitstream's own header.
        let dims = match kind {
            b"VP8 " => (|| {
                let w = u32::from(u16::from_le_bytes(webp.get(26..28)?.try_into().ok()?)) & 0x3FFF;
                let h = u32::from(u16::from_le_bytes(webp.get(28..30)?.try_into().ok()?)) & 0x3FFF;
                Some((w, h, false))
            })(),
            b"VP8L" => le32(webp, 21).map(|bits| {
                (
                    (bits & 0x3FFF) + 1,
                    ((bits >> 14) & 0x3FFF) + 1,
                    bits >> 28 & 1 == 1,
                )
            }),
            _ => None,
        };
        let Some((w, h, alpha)) = dims else {
            return webp.to_vec();
        };
        vp8x = b"VP8X\x0a\0\0\0".to_vec();
        vp8x.push(0x20 | if alpha { 0x10 } else { 0 });
        vp8x.extend_from_slice(&[0, 0, 0]);
        vp8x.extend_from_slice(&(w - 1).to_le_bytes()[..3]);
        vp8x.extend_from_slice(&(h - 1).to_le_bytes()[..3]);
        rest = body;
    }
    let mut chunks = vp8x;
    chunks.extend_from_slice(b"ICCP");
    chunks.extend_from_slice(&icc_len.to_le_bytes());
    chunks.extend_from_slice(icc);
    if icc.len() % 2 == 1 {
        chunks.push(0);
    }
    chunks.extend_from_slice(rest);
    let mut out = b"RIFF".to_vec();
    out.extend_from_slice(&((chunks.len() + 4) as u32).to_le_bytes());
    out.extend_from_slice(b"WEBP");
    out.extend_from_slice(&chunks);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p3() -> Vec<u8> {
        ColorProfile::new_display_p3().encode().unwrap()
    }

    /// Display P3 colours and their sRGB values from the published P3-to-sRGB matrix (both
    /// spaces have the sRGB transfer curve and a D65 white): an independent reference, computed
    /// without colour-management code (tests/images.rs has the formula).
    const P3_TO_SRGB: [([u8; 3], [f64; 3]); 5] = [
        ([200, 60, 40], [217.5, 41.6, 22.7]),
        ([30, 180, 90], [0.0, 183.3, 78.0]),
        ([120, 120, 220], [120.0, 120.0, 226.9]),
        ([128, 128, 128], [128.0, 128.0, 128.0]),
        ([250, 240, 10], [252.2, 239.6, 0.0]),
    ];

    #[test]
    fn p3_pixels_match_the_published_conversion() {
        let icc = p3();
        assert!(needs_conversion(&icc));
        let mut img = Raster {
            width: P3_TO_SRGB.len() as u32,
            height: 1,
            channels: 3,
            data: P3_TO_SRGB.iter().flat_map(|c| c.0).collect(),
        };
        to_srgb(&mut img, &icc).unwrap();
        for ((c, want), got) in P3_TO_SRGB.iter().zip(img.data.chunks_exact(3)) {
            for (g, w) in got.iter().zip(want) {
                assert!(
                    (f64::from(*g) - w).abs() <= 2.0,
                    "{c:?}: got {got:?}, want {want:?}"
                );
            }
        }
    }

    #[test]
    fn srgb_profiles_are_recognised_and_cost_nothing() {
        let srgb = ColorProfile::new_srgb().encode().unwrap();
        assert!(!needs_conversion(&srgb));
        let before = vec![200u8, 60, 40, 128];
        let mut img = Raster {
            width: 1,
            height: 1,
            channels: 4,
            data: before.clone(),
        };
        to_srgb(&mut img, &srgb).unwrap();
        assert_eq!(img.data, before);
        // Garbage is ignored, not an error.
        assert!(!needs_conversion(b"not a profile"));
        assert!(to_srgb(&mut img, b"not a profile").is_ok());
        assert!(needs_conversion(
            &ColorProfile::new_adobe_rgb().encode().unwrap()
        ));
    }

    #[test]
    fn profiles_round_trip_through_every_container() {
        let icc = p3();
        // JPEG, with a profile split over three chunks given out of order.
        let mut jpeg = vec![0xFF, 0xD8];
        let parts: Vec<&[u8]> = icc.chunks(icc.len().div_ceil(3)).collect();
        for n in [2usize, 0, 1] {
            jpeg.extend_from_slice(&[0xFF, 0xE2]);
            jpeg.extend_from_slice(&((parts[n].len() + 16) as u16).to_be_bytes());
            jpeg.extend_from_slice(b"ICC_PROFILE\0");
            jpeg.extend_from_slice(&[n as u8 + 1, 3]);
            jpeg.extend_from_slice(parts[n]);
        }
        jpeg.extend_from_slice(&[0xFF, 0xEE, 0, 14]);
        jpeg.extend_from_slice(b"Adobe\0\x64\0\0\0\0\x02");
        jpeg.extend_from_slice(&[0xFF, 0xDA, 0, 2, 0xFF, 0xD9]);
        let e = embedded(&jpeg, ImageFormat::Jpeg);
        assert_eq!(e.icc.as_deref(), Some(icc.as_slice()));
        assert!(e.adobe);
        // A missing chunk: no profile.
        let cut = embedded(&jpeg[..jpeg.len() / 2], ImageFormat::Jpeg);
        assert_eq!(cut.icc, None);
        // Written and read back.
        let plain = [0xFF, 0xD8, 0xFF, 0xE0, 0, 4, 1, 2, 0xFF, 0xD9];
        let with = embed_jpeg(&plain, &icc);
        assert_eq!(embedded(&with, ImageFormat::Jpeg).icc, Some(icc.clone()));
        assert_eq!(&with[..8], &plain[..8]);
        // PNG.
        let mut png = Vec::new();
        let mut info = png::Info::with_size(1, 1);
        info.icc_profile = Some(icc.clone().into());
        let mut w = png::Encoder::with_info(&mut png, info)
            .unwrap()
            .write_header()
            .unwrap();
        w.write_image_data(&[0]).unwrap();
        w.finish().unwrap();
        assert_eq!(embedded(&png, ImageFormat::Png).icc, Some(icc.clone()));
        // WebP: a simple lossy file made extended.
        let rgb = [10u8, 20, 30].repeat(16);
        let simple = webp::Encoder::from_rgb(&rgb, 4, 4).encode(80.0).to_vec();
        assert_eq!(embedded(&simple, ImageFormat::Webp).icc, None);
        let ext = embed_webp(&simple, &icc);
        assert_eq!(embedded(&ext, ImageFormat::Webp).icc, Some(icc.clone()));
        let back = webp::Decoder::new(&ext).decode().expect("libwebp reads it");
        assert_eq!((back.width(), back.height()), (4, 4));
    }

    #[test]
    fn cmyk_converts_naively_and_inverted() {
        // Red (no cyan, full magenta and yellow, no black), a 50 % grey of black only.
        let ink = [0u8, 255, 255, 0, 0, 0, 0, 128];
        let rgb = cmyk_to_rgb(ink.to_vec(), 2, None, false);
        assert_eq!(rgb, vec![255, 0, 0, 127, 127, 127]);
        let adobe: Vec<u8> = ink.iter().map(|v| 255 - v).collect();
        assert_eq!(cmyk_to_rgb(adobe, 2, None, true), rgb);
        // An RGB profile given for CMYK samples is not used.
        assert_eq!(cmyk_to_rgb(ink.to_vec(), 2, Some(&p3()), false), rgb);
    }

    #[test]
    fn sixteen_bit_samples_round_to_nearest() {
        assert_eq!(to_8bit(0), 0);
        assert_eq!(to_8bit(65535), 255);
        assert_eq!(to_8bit(0x80FF), 128);
        assert_eq!(to_8bit(0x7F7F), 127);
        let be = |s: &[u16]| s.iter().flat_map(|v| v.to_be_bytes()).collect::<Vec<u8>>();
        // Two rows of two pixels; 0x00FF and 0xFF00 round to 1 and 254 (their high bytes,
        // what truncation keeps, are 0 and 255).
        let mut s = be(&[0x8080, 0xFFFF, 0, 0x7F7F, 1, 2, 0x00FF, 0xFF00, 9, 9, 9, 9]);
        srgb_8bit_from_16(&mut s, 3, 2, None);
        assert_eq!(s, vec![128, 255, 0, 127, 0, 0, 1, 254, 0, 0, 0, 0]);
        let mut got = be(&[51400, 15420, 10280]);
        srgb_8bit_from_16(&mut got, 3, 1, Some(&p3()));
        let want = P3_TO_SRGB[0].1;
        for (g, w) in got.iter().zip(want) {
            assert!((f64::from(*g) - w).abs() <= 2.0, "{got:?} vs {want:?}");
        }
    }

    /// Profiles come from uploads: mutated ones are ignored or used, never a panic.
    #[test]
    fn mutated_profiles_never_panic() {
        let seeds = [
            p3(),
            ColorProfile::new_adobe_rgb().encode().unwrap(),
            ColorProfile::new_srgb().encode().unwrap(),
        ];
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        };
        for i in 0..150 {
            let mut icc = seeds[i % 3].clone();
            for _ in 0..=next() % 4 {
                let at = (next() % icc.len() as u64) as usize;
                match next() % 3 {
                    0 => icc[at] = next() as u8,
                    1 => icc.truncate(at),
                    _ => icc[at] ^= 0x80,
                }
                if icc.is_empty() {
                    break;
                }
            }
            let mut img = Raster {
                width: 2,
                height: 1,
                channels: 4,
                data: vec![10, 200, 30, 255, 250, 5, 128, 0],
            };
            let _ = to_srgb(&mut img, &icc);
            let _ = cmyk_to_rgb(vec![0, 255, 255, 0], 1, Some(&icc), true);
            let mut s16 = vec![0x12, 0x34, 0x56, 0x78, 0x9A, 0xBC];
            srgb_8bit_from_16(&mut s16, 3, 1, Some(&icc));
        }
    }

    /// A CMYK output profile (ICC v2, lut16 to Lab) written by hand: every corner of its 2⁴
    /// grid is white, black where there is black ink, except magenta + yellow, which is a
    /// neutral grey of L* 50 (sRGB 119): unlike the naive conversion's red.
    fn grey_red_cmyk_profile() -> Vec<u8> {
        let be16 = |v: u16| v.to_be_bytes();
        let mut lut = b"mft2\0\0\0\0".to_vec();
        lut.extend_from_slice(&[4, 3, 2, 0]);
        for i in 0..9 {
            let one: i32 = if i % 4 == 0 { 0x1_0000 } else { 0 };
            lut.extend_from_slice(&one.to_be_bytes());
        }
        lut.extend(be16(2));
        lut.extend(be16(2));
        for _ in 0..4 {
            lut.extend(be16(0));
            lut.extend(be16(0xFFFF));
        }
        for c in 0..2 {
            for m in 0..2 {
                for y in 0..2 {
                    for k in 0..2 {
                        let l: u16 = match (c, m, y, k) {
                            (_, _, _, 1) => 0,
                            (0, 1, 1, 0) => 0x7F80,
                            _ => 0xFF00,
                        };
                        for v in [l, 0x8000, 0x8000] {
                            lut.extend(be16(v));
                        }
                    }
                }
            }
        }
        for _ in 0..3 {
            lut.extend(be16(0));
            lut.extend(be16(0xFFFF));
        }
        let s15 = |v: f64| ((v * 65536.0).round() as i32).to_be_bytes();
        let mut wtpt = b"XYZ \0\0\0\0".to_vec();
        for v in [0.9642, 1.0, 0.8249] {
            wtpt.extend(s15(v));
        }
        let tags: [(&[u8; 4], &[u8]); 3] = [(b"A2B0", &lut), (b"A2B1", &lut), (b"wtpt", &wtpt)];
        let table = 4 + 12 * tags.len();
        let mut body = Vec::new();
        let mut entries = (tags.len() as u32).to_be_bytes().to_vec();
        for (sig, data) in tags {
            entries.extend_from_slice(sig);
            entries.extend(((128 + table + body.len()) as u32).to_be_bytes());
            entries.extend((data.len() as u32).to_be_bytes());
            body.extend_from_slice(data);
            while body.len() % 4 != 0 {
                body.push(0);
            }
        }
        let mut header = vec![0u8; 128];
        let size = (128 + table + body.len()) as u32;
        header[0..4].copy_from_slice(&size.to_be_bytes());
        header[8..12].copy_from_slice(&[2, 0x10, 0, 0]);
        header[12..16].copy_from_slice(b"prtr");
        header[16..20].copy_from_slice(b"CMYK");
        header[20..24].copy_from_slice(b"Lab ");
        header[36..40].copy_from_slice(b"acsp");
        for (i, v) in [0.9642, 1.0, 0.8249].into_iter().enumerate() {
            header[68 + 4 * i..72 + 4 * i].copy_from_slice(&s15(v));
        }
        [header, entries, body].concat()
    }

    #[test]
    fn cmyk_converts_through_its_profile() {
        let icc = grey_red_cmyk_profile();
        // Magenta + yellow, no ink, black ink only; stored inverted (Adobe).
        let ink = [0u8, 255, 255, 0, 0, 0, 0, 0, 0, 0, 0, 255];
        let adobe: Vec<u8> = ink.iter().map(|v| 255 - v).collect();
        let rgb = cmyk_to_rgb(adobe, 3, Some(&icc), true);
        let near = |got: &[u8], want: u8| got.iter().all(|v| v.abs_diff(want) <= 3);
        assert!(near(&rgb[0..3], 119), "grey, not red: {rgb:?}");
        assert!(near(&rgb[3..6], 255), "white: {rgb:?}");
        assert!(near(&rgb[6..9], 0), "black: {rgb:?}");
    }
}
