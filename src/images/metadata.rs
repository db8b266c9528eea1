//! The metadata an image proxy result carries over from its original: imgproxy's
//! `strip_metadata` (`sm`), `keep_copyright` (`kcr`) and `strip_color_profile` (`scp`), thumbor's
//! `strip_exif()` and `strip_icc()` (docs/images.md, "Metadata").
//!
//! ```text
//! original ─▶ EXIF (kamadak-exif reads it from JPEG, PNG, WebP, AVIF) ─▶ fields kept:
//!               sm:0 every field of the image (IFD0, Exif, GPS) but the thumbnail's and the
//!                    pixel sizes, Orientation written as 1 (the pixels are turned already)
//!               sm:1 kcr:1 (the default) Copyright and Artist only; sm:1 kcr:0 none
//!             ─▶ a new TIFF block (kamadak-exif's writer: no hand-made bytes)
//!          ─▶ JPEG to JPEG with sm:0: its XMP and IPTC (APP1 XMP, APP13) segments too, the
//!             first of each
//! result  ─▶ img-parts puts the EXIF block, the segments and the ICC profile kept by the
//!            decoder (scp:0) into the JPEG, PNG (eXIf, iCCP) or WebP (EXIF, ICCP) container;
//!            AVIF: the EXIF block goes to its encoder (`codec::Output::exif`), which writes
//!            it as the container's Exif item
//! ```
//!
//! AVIF results carry the EXIF only, as imgproxy's (libheif) do, but no ICC profile and no
//! XMP: avif-serialize writes neither, so with `scp:0` an AVIF result is converted to sRGB as
//! without it (the pipeline keeps no profile for AVIF). GIF results carry none of it, as
//! imgproxy's (libvips' GIF writer keeps no metadata). Whatever cannot be read or written (a
//! malformed EXIF block, an unknown field type, an EXIF block larger than a JPEG
//! segment: [`MAX_EXIF`]) is left out, never an error: the result is
//! still the image asked for.

use bytes::Bytes;
use img_parts::jpeg::{markers, Jpeg, JpegSegment};
use img_parts::{DynImage, ImageEXIF, ImageICC};

use crate::config::image_options::Options;

use super::sniff::ImageFormat;

/// XMP's APP1 signature.
const XMP: &[u8] = b"http://ns.adobe.com/xap/1.0/\0";

/// The largest EXIF block kept: what one JPEG APP1 segment holds after `Exif\0\0` (so every
/// camera's). A larger one (PNG and WebP allow any size; only a crafted file has one) is left
/// out before its fields are copied: it was copied several times over, outside the memory
/// the pool reserves, into a thumbnail many times smaller than it.
pub const MAX_EXIF: usize = 65_533 - 6;

/// What a result keeps of its original's metadata.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Kept {
    /// A TIFF block (EXIF without the `Exif\0\0` prefix).
    pub exif: Option<Vec<u8>>,
    /// The ICC profile the pixels are still in (kept by the decoder: `scp:0`).
    pub icc: Option<Vec<u8>>,
    /// JPEG segments carried over whole (XMP, IPTC), for a JPEG result.
    pub segments: Vec<(u8, Bytes)>,
}

impl Kept {
    pub fn is_empty(&self) -> bool {
        self.exif.is_none() && self.icc.is_none() && self.segments.is_empty()
    }
}

/// Whether the options keep the ICC profile (`scp:0`; the default strips it, converting the
/// pixels to sRGB).
pub fn keeps_icc(o: &Options) -> bool {
    o.strip_color_profile == Some(false)
}

/// What `o` keeps of the metadata of `src` (in `format`); `icc` is the profile the decoder
/// kept, if any.
pub fn keep(src: &[u8], format: ImageFormat, o: &Options, icc: Option<Vec<u8>>) -> Kept {
    let strip = o.strip_metadata.unwrap_or(true);
    let copyright = o.keep_copyright.unwrap_or(true);
    let exif = if strip && !copyright {
        None
    } else {
        exif(src, !strip)
    };
    let segments = match (strip, format) {
        (false, ImageFormat::Jpeg) => jpeg_segments(src),
        _ => Vec::new(),
    };
    Kept {
        exif,
        icc,
        segments,
    }
}

/// The EXIF of `src` rewritten: every field of the image (`all`), or its copyright and artist.
fn exif(src: &[u8], all: bool) -> Option<Vec<u8>> {
    use exif::{In, Tag, Value};
    let read = exif::Reader::new()
        .read_from_container(&mut std::io::Cursor::new(src))
        .ok()?;
    if read.buf().len() > MAX_EXIF {
        tracing::debug!(
            bytes = read.buf().len(),
            "the original's EXIF is too large to keep"
        );
        return None;
    }
    let dropped = [
        Tag::ImageWidth,
        Tag::ImageLength,
        Tag::PixelXDimension,
        Tag::PixelYDimension,
    ];
    let fields: Vec<exif::Field> = read
        .fields()
        .filter(|f| f.ifd_num == In::PRIMARY && !matches!(f.value, Value::Unknown(..)))
        .filter(|f| match all {
            true => !dropped.contains(&f.tag),
            false => f.tag == Tag::Copyright || f.tag == Tag::Artist,
        })
        .map(|f| match f.tag {
            Tag::Orientation => exif::Field {
                value: Value::Short(vec![1]),
                ..f.clone()
            },
            _ => f.clone(),
        })
        .collect();
    if fields.is_empty() {
        return None;
    }
    let mut w = exif::experimental::Writer::new();
    for f in &fields {
        w.push_field(f);
    }
    let mut out = std::io::Cursor::new(Vec::new());
    match w.write(&mut out, read.little_endian()) {
        Ok(()) => Some(out.into_inner()),
        Err(e) => {
            tracing::debug!(error = %e, "the original's EXIF could not be written back");
            None
        }
    }
}

/// The XMP and IPTC segments of the JPEG `src`: the first of each, as libvips (imgproxy) keeps
/// one XMP and one IPTC block (every one was kept: 200 of them made a 20-pixel thumbnail of
/// 12 MB).
fn jpeg_segments(src: &[u8]) -> Vec<(u8, Bytes)> {
    let Ok(jpeg) = Jpeg::from_bytes(Bytes::copy_from_slice(src)) else {
        return Vec::new();
    };
    let segments = jpeg.segments();
    let first = |marker: u8, is: fn(&Bytes) -> bool| {
        (segments.iter())
            .find(|s| s.marker() == marker && is(s.contents()))
            .map(|s| (marker, s.contents().clone()))
    };
    let xmp = first(markers::APP1, |c| c.starts_with(XMP));
    let iptc = first(markers::APP13, |_| true);
    xmp.into_iter().chain(iptc).collect()
}

/// `out` (a result in `format`) with `kept` written into its container; `out` unchanged when
/// nothing is kept or the format carries none of it.
pub fn embed(out: Vec<u8>, format: ImageFormat, kept: &Kept) -> Vec<u8> {
    if kept.is_empty()
        || !matches!(
            format,
            ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::Webp
        )
    {
        return out;
    }
    let bytes = Bytes::from(out);
    let mut img = match DynImage::from_bytes(bytes.clone()) {
        Ok(Some(img)) => img,
        _ => return bytes.to_vec(),
    };
    if let Some(icc) = &kept.icc {
        img.set_icc_profile(Some(Bytes::copy_from_slice(icc)));
    }
    if let Some(exif) = &kept.exif {
        img.set_exif(Some(Bytes::copy_from_slice(exif)));
    }
    if let DynImage::Jpeg(jpeg) = &mut img {
        // After the EXIF (APP1) and ICC (APP2) segments, before the frame.
        let at = (jpeg.segments().iter())
            .position(|s| !matches!(s.marker(), markers::APP0..=markers::APP2))
            .unwrap_or(jpeg.segments().len());
        for (n, (marker, contents)) in kept.segments.iter().enumerate() {
            let segment = JpegSegment::new_with_contents(*marker, contents.clone());
            jpeg.segments_mut().insert(at + n, segment);
        }
    }
    img.encoder().bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use exif::{Field, In, Tag, Value};

    /// A TIFF block of `fields`.
    fn tiff(fields: &[Field]) -> Vec<u8> {
        let mut w = exif::experimental::Writer::new();
        for f in fields {
            w.push_field(f);
        }
        let mut out = std::io::Cursor::new(Vec::new());
        w.write(&mut out, false).unwrap();
        out.into_inner()
    }

    fn ascii(tag: Tag, v: &str) -> Field {
        Field {
            tag,
            ifd_num: In::PRIMARY,
            value: Value::Ascii(vec![v.as_bytes().to_vec()]),
        }
    }

    fn read(data: &[u8]) -> Option<exif::Exif> {
        exif::Reader::new()
            .read_from_container(&mut std::io::Cursor::new(data))
            .ok()
    }

    fn text(e: &exif::Exif, tag: Tag) -> Option<String> {
        let f = e.get_field(tag, In::PRIMARY)?;
        Some(f.display_value().to_string())
    }

    fn opts(s: &str) -> Options {
        let mut o = Options::default();
        for part in s.split('/').filter(|p| !p.is_empty()) {
            let mut it = part.split(':');
            let name = it.next().unwrap();
            let args: Vec<&str> = it.collect();
            o.apply(name, &args).unwrap();
        }
        o
    }

    /// A small JPEG with EXIF (copyright, artist, a description, orientation 6) and XMP.
    fn source() -> Vec<u8> {
        let img = super::super::raster::Raster {
            data: vec![128; 8 * 8 * 3],
            width: 8,
            height: 8,
            channels: 3,
        };
        let plain = super::super::codec::encode_at(&img, ImageFormat::Jpeg, 80, 6).unwrap();
        let mut jpeg = Jpeg::from_bytes(plain.into()).unwrap();
        jpeg.set_exif(Some(
            tiff(&[
                ascii(Tag::Copyright, "(c) larder"),
                ascii(Tag::Artist, "Ada"),
                ascii(Tag::ImageDescription, "a custom note"),
                Field {
                    tag: Tag::Orientation,
                    ifd_num: In::PRIMARY,
                    value: Value::Short(vec![6]),
                },
            ])
            .into(),
        ));
        let mut xmp = XMP.to_vec();
        xmp.extend_from_slice(b"<x:xmpmeta/>");
        jpeg.segments_mut()
            .insert(2, JpegSegment::new_with_contents(markers::APP1, xmp.into()));
        jpeg.encoder().bytes().to_vec()
    }

    #[test]
    fn copyright_is_kept_by_default_everything_with_sm0_nothing_with_kcr0() {
        let src = source();
        let result = |o: &str, format| {
            let img = super::super::raster::Raster {
                data: vec![60; 4 * 4 * 3],
                width: 4,
                height: 4,
                channels: 3,
            };
            let out = super::super::codec::encode_at(&img, format, 80, 6).unwrap();
            let kept = keep(&src, ImageFormat::Jpeg, &opts(o), None);
            embed(out, format, &kept)
        };
        for format in [ImageFormat::Jpeg, ImageFormat::Png, ImageFormat::Webp] {
            let e = read(&result("", format)).expect("EXIF kept");
            assert_eq!(text(&e, Tag::Copyright).as_deref(), Some("\"(c) larder\""));
            assert_eq!(text(&e, Tag::Artist).as_deref(), Some("\"Ada\""));
            assert_eq!(text(&e, Tag::ImageDescription), None, "{format:?}");

            let all = read(&result("sm:0", format)).expect("EXIF kept");
            assert_eq!(
                text(&all, Tag::ImageDescription).as_deref(),
                Some("\"a custom note\"")
            );
            let turned = all.get_field(Tag::Orientation, In::PRIMARY).unwrap();
            assert_eq!(turned.value.get_uint(0), Some(1), "the pixels are turned");

            assert!(read(&result("kcr:0", format)).is_none(), "{format:?}");
        }
        // XMP goes along JPEG to JPEG with sm:0 only.
        let has_xmp = |b: &[u8]| b.windows(XMP.len()).any(|w| w == XMP);
        assert!(has_xmp(&result("sm:0", ImageFormat::Jpeg)));
        assert!(!has_xmp(&result("", ImageFormat::Jpeg)));
        // AVIF's encoder writes it (an Exif item), not `embed`: unchanged there.
        let kept = keep(&src, ImageFormat::Jpeg, &opts("sm:0"), None);
        assert_eq!(
            embed(vec![1, 2, 3], ImageFormat::Avif, &kept),
            vec![1, 2, 3]
        );
        let img = super::super::raster::Raster {
            data: vec![60; 4 * 4 * 3],
            width: 4,
            height: 4,
            channels: 3,
        };
        let out = super::super::codec::Output {
            quality: 80,
            avif_speed: 10,
            bg: super::super::codec::WHITE,
            icc: None,
            progressive: false,
            exif: kept.exif.as_deref(),
            avif_encoder: crate::config::AvifEncoder::Auto,
        };
        let avif = super::super::codec::encode_with(&img, ImageFormat::Avif, &out).unwrap();
        let all = read(&avif).expect("an Exif item");
        assert_eq!(
            text(&all, Tag::ImageDescription).as_deref(),
            Some("\"a custom note\"")
        );
        let turned = all.get_field(Tag::Orientation, In::PRIMARY).unwrap();
        assert_eq!(turned.value.get_uint(0), Some(1));
        assert_eq!(super::super::sniff::probe(&avif).unwrap().width, 4);
        // A source without EXIF keeps nothing.
        let bare = keep(b"not an image", ImageFormat::Jpeg, &opts("sm:0"), None);
        assert!(bare.is_empty());
    }
}
