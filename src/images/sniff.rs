//! What an image really is, from its bytes alone: the format (JPEG, PNG, GIF, WebP, AVIF), its
//! dimensions, frame count and EXIF orientation, read from headers without decoding pixels. This
//! is what refuses pixel bombs and frame bombs before any large allocation.

/// The image formats larder stores and produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageFormat {
    Jpeg,
    Png,
    Gif,
    Webp,
    Avif,
}

impl ImageFormat {
    /// The name used in URLs and JSON replies.
    pub fn name(self) -> &'static str {
        match self {
            ImageFormat::Jpeg => "jpeg",
            ImageFormat::Png => "png",
            ImageFormat::Gif => "gif",
            ImageFormat::Webp => "webp",
            ImageFormat::Avif => "avif",
        }
    }

    /// The Content-Type.
    pub fn mime(self) -> &'static str {
        match self {
            ImageFormat::Jpeg => "image/jpeg",
            ImageFormat::Png => "image/png",
            ImageFormat::Gif => "image/gif",
            ImageFormat::Webp => "image/webp",
            ImageFormat::Avif => "image/avif",
        }
    }
}

/// What the headers of an image say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    pub format: ImageFormat,
    pub width: u32,
    pub height: u32,
    /// Frames (1 for still images; counted without decoding for GIF and WebP).
    pub frames: u32,
    /// EXIF orientation 1-8 (JPEG only; 1 when absent).
    pub orientation: u8,
}

impl Probe {
    pub fn pixels(&self) -> u64 {
        u64::from(self.width) * u64::from(self.height)
    }
}

/// Why bytes are not an image larder handles.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SniffError {
    #[error("not a JPEG, PNG, GIF, WebP or AVIF image")]
    Unknown,
    #[error("truncated or malformed {0} header")]
    Malformed(&'static str),
}

/// The format from the magic bytes.
pub fn format(b: &[u8]) -> Option<ImageFormat> {
    if b.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some(ImageFormat::Jpeg)
    } else if b.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some(ImageFormat::Png)
    } else if b.starts_with(b"GIF87a") || b.starts_with(b"GIF89a") {
        Some(ImageFormat::Gif)
    } else if b.len() >= 12 && &b[0..4] == b"RIFF" && &b[8..12] == b"WEBP" {
        Some(ImageFormat::Webp)
    } else if b.len() >= 12
        && &b[4..8] == b"ftyp"
        && (&b[8..12] == b"avif" || &b[8..12] == b"avis" || is_avif_compatible(b))
    {
        Some(ImageFormat::Avif)
    } else {
        None
    }
}

fn is_avif_compatible(b: &[u8]) -> bool {
    let size = be32(b, 0).unwrap_or(0) as usize;
    let end = size.min(b.len());
    (16..end)
        .step_by(4)
        .any(|i| b.get(i..i + 4) == Some(b"avif".as_slice()))
}

/// Format, dimensions, frames and orientation from the headers.
pub fn probe(b: &[u8]) -> Result<Probe, SniffError> {
    let format = format(b).ok_or(SniffError::Unknown)?;
    let mut p = Probe {
        format,
        width: 0,
        height: 0,
        frames: 1,
        orientation: 1,
    };
    match format {
        ImageFormat::Jpeg => jpeg(b, &mut p)?,
        ImageFormat::Png => {
            if b.get(12..16) != Some(b"IHDR".as_slice()) {
                return Err(SniffError::Malformed("PNG"));
            }
            p.width = be32(b, 16).ok_or(SniffError::Malformed("PNG"))?;
            p.height = be32(b, 20).ok_or(SniffError::Malformed("PNG"))?;
        }
        ImageFormat::Gif => gif(b, &mut p)?,
        ImageFormat::Webp => webp(b, &mut p)?,
        ImageFormat::Avif => avif(b, &mut p)?,
    }
    if p.width == 0 || p.height == 0 {
        return Err(SniffError::Malformed(format.name()));
    }
    Ok(p)
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn le16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn le24(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at + 3)?;
    Some(u32::from(s[0]) | u32::from(s[1]) << 8 | u32::from(s[2]) << 16)
}
fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Walks JPEG markers up to the first SOF, reading the EXIF orientation on the way.
fn jpeg(b: &[u8], p: &mut Probe) -> Result<(), SniffError> {
    let err = SniffError::Malformed("JPEG");
    let mut i = 2;
    loop {
        // Skip fill bytes.
        while b.get(i) == Some(&0xFF) && b.get(i + 1) == Some(&0xFF) {
            i += 1;
        }
        if b.get(i) != Some(&0xFF) {
            return Err(err);
        }
        let marker = *b.get(i + 1).ok_or(err.clone())?;
        if marker == 0xD8 || (0xD0..=0xD7).contains(&marker) || marker == 0x01 {
            i += 2;
            continue;
        }
        let len = be16(b, i + 2).ok_or(err.clone())? as usize;
        if len < 2 {
            return Err(err);
        }
        let seg = b.get(i + 4..i + 2 + len).ok_or(err.clone())?;
        match marker {
            0xE1 if seg.starts_with(b"Exif\0\0") => {
                p.orientation = exif_orientation(&seg[6..]).unwrap_or(1);
            }
            0xC0..=0xCF if marker != 0xC4 && marker != 0xC8 && marker != 0xCC => {
                p.height = u32::from(be16(seg, 1).ok_or(err.clone())?);
                p.width = u32::from(be16(seg, 3).ok_or(err)?);
                return Ok(());
            }
            0xD9 | 0xDA => return Err(err),
            _ => {}
        }
        i += 2 + len;
    }
}

/// The Orientation tag (0x0112) of IFD0 in a TIFF-structured EXIF block.
fn exif_orientation(t: &[u8]) -> Option<u8> {
    let le = match t.get(0..2)? {
        b"II" => true,
        b"MM" => false,
        _ => return None,
    };
    let r16 = |at: usize| if le { le16(t, at) } else { be16(t, at) };
    let r32 = |at: usize| if le { le32(t, at) } else { be32(t, at) };
    let ifd = r32(4)? as usize;
    let count = r16(ifd)? as usize;
    for n in 0..count.min(512) {
        let e = ifd + 2 + n * 12;
        if r16(e)? == 0x0112 {
            let v = r16(e + 8)?;
            return (1..=8).contains(&v).then_some(v as u8);
        }
    }
    None
}

/// Logical screen size, and frames counted by walking the blocks (no LZW decoding).
fn gif(b: &[u8], p: &mut Probe) -> Result<(), SniffError> {
    let err = SniffError::Malformed("GIF");
    p.width = u32::from(le16(b, 6).ok_or(err.clone())?);
    p.height = u32::from(le16(b, 8).ok_or(err.clone())?);
    let flags = *b.get(10).ok_or(err.clone())?;
    let mut i = 13;
    if flags & 0x80 != 0 {
        i += 3 << ((flags & 7) + 1);
    }
    let mut frames = 0u32;
    let skip_sub_blocks = |mut i: usize| -> Option<usize> {
        loop {
            let n = *b.get(i)? as usize;
            i += 1;
            if n == 0 {
                return Some(i);
            }
            i += n;
        }
    };
    loop {
        match b.get(i) {
            Some(0x21) => {
                i = skip_sub_blocks(i + 2).ok_or(err.clone())?;
            }
            Some(0x2C) => {
                frames += 1;
                let fw = u32::from(le16(b, i + 5).ok_or(err.clone())?);
                let fh = u32::from(le16(b, i + 7).ok_or(err.clone())?);
                // A frame larger than the screen would make the decoder allocate more.
                p.width = p.width.max(fw);
                p.height = p.height.max(fh);
                let f = *b.get(i + 9).ok_or(err.clone())?;
                i += 10;
                if f & 0x80 != 0 {
                    i += 3 << ((f & 7) + 1);
                }
                i = skip_sub_blocks(i + 1).ok_or(err.clone())?;
            }
            // Trailer, or truncated data after at least one frame (decoders tolerate it).
            Some(0x3B) | None if frames > 0 => break,
            _ => return Err(err),
        }
    }
    p.frames = frames;
    Ok(())
}

/// VP8 / VP8L / VP8X headers; frames are the ANMF chunks.
fn webp(b: &[u8], p: &mut Probe) -> Result<(), SniffError> {
    let err = SniffError::Malformed("WebP");
    let mut i = 12;
    let mut frames = 0u32;
    let mut sized = false;
    while i + 8 <= b.len() {
        let id = &b[i..i + 4];
        let len = le32(b, i + 4).ok_or(err.clone())? as usize;
        let d = i + 8;
        match id {
            b"VP8X" => {
                p.width = le24(b, d + 4).ok_or(err.clone())? + 1;
                p.height = le24(b, d + 7).ok_or(err.clone())? + 1;
                sized = true;
            }
            b"VP8 " if !sized => {
                p.width = u32::from(le16(b, d + 6).ok_or(err.clone())? & 0x3FFF);
                p.height = u32::from(le16(b, d + 8).ok_or(err.clone())? & 0x3FFF);
                sized = true;
            }
            b"VP8L" if !sized => {
                let bits = le32(b, d + 1).ok_or(err.clone())?;
                p.width = (bits & 0x3FFF) + 1;
                p.height = ((bits >> 14) & 0x3FFF) + 1;
                sized = true;
            }
            b"ANMF" => frames += 1,
            _ => {}
        }
        i = d.saturating_add(len).saturating_add(len & 1);
    }
    if !sized {
        return Err(err);
    }
    p.frames = frames.max(1);
    Ok(())
}

/// The first `ispe` (image spatial extents) property.
fn avif(b: &[u8], p: &mut Probe) -> Result<(), SniffError> {
    let window = &b[..b.len().min(1 << 20)];
    let at = window
        .windows(4)
        .position(|w| w == b"ispe")
        .ok_or(SniffError::Malformed("AVIF"))?;
    p.width = be32(b, at + 8).ok_or(SniffError::Malformed("AVIF"))?;
    p.height = be32(b, at + 12).ok_or(SniffError::Malformed("AVIF"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn png_header_is_read_without_decoding() {
        let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        b.extend_from_slice(&100_000u32.to_be_bytes());
        b.extend_from_slice(&100_000u32.to_be_bytes());
        b.extend_from_slice(&[8, 2, 0, 0, 0]);
        let p = probe(&b).unwrap();
        assert_eq!((p.width, p.height), (100_000, 100_000));
        assert_eq!(p.pixels(), 10_000_000_000);
    }

    #[test]
    fn sample_photo() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../shared/bench-data/photo-640x856.jpg"
        );
        let Ok(b) = std::fs::read(path) else { return };
        let p = probe(&b).unwrap();
        assert_eq!((p.width, p.height, p.format), (640, 856, ImageFormat::Jpeg));
    }

    #[test]
    fn garbage_is_unknown() {
        assert_eq!(
            probe(b"hello world, not an image"),
            Err(SniffError::Unknown)
        );
        assert!(probe(b"\xFF\xD8\xFF").is_err());
    }
}
