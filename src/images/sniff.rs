//! What an image really is, from its bytes alone: the format (JPEG, PNG, GIF, WebP, AVIF, JPEG
//! XL, HEIC), its dimensions, frame count and orientation, read from headers without decoding
//! pixels. This is what refuses pixel bombs and frame bombs before any large allocation.

/// The image formats larder stores and produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageFormat {
    Jpeg,
    Png,
    Gif,
    Webp,
    Avif,
    /// JPEG XL: a bare codestream or the ISOBMFF container.
    Jxl,
    /// HEIF with an HEVC primary image (HEIC); read only (no output).
    Heic,
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
            ImageFormat::Jxl => "jxl",
            ImageFormat::Heic => "heic",
        }
    }

    /// The file name extension (imgproxy's: `jpg` for JPEG).
    pub fn extension(self) -> &'static str {
        match self {
            ImageFormat::Jpeg => "jpg",
            f => f.name(),
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
            ImageFormat::Jxl => "image/jxl",
            ImageFormat::Heic => "image/heic",
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
    /// EXIF orientation 1-8: JPEG's EXIF tag, or AVIF's `irot`/`imir` properties; 1 when absent.
    pub orientation: u8,
    /// A JPEG with four components (CMYK or YCCK): decoded as CMYK, then converted to RGB.
    pub cmyk: bool,
}

impl Probe {
    pub fn pixels(&self) -> u64 {
        u64::from(self.width) * u64::from(self.height)
    }
}

/// Why bytes are not an image larder handles.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SniffError {
    #[error("not a JPEG, PNG, GIF, WebP, AVIF, JPEG XL or HEIC image")]
    Unknown,
    /// SVG is refused rather than rasterized (no rasterizer is built in) or passed through
    /// (an SVG may carry scripts: serving it from the image route's origin would need a
    /// sanitiser, an XSS risk of its own).
    #[error(
        "SVG sources are not served: larder does not rasterize SVG, and does not pass it \
         through (an SVG may carry scripts)"
    )]
    Svg,
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
    } else if b.starts_with(&[0xFF, 0x0A]) || b.starts_with(JXL_CONTAINER) {
        Some(ImageFormat::Jxl)
    } else if b.len() >= 12 && &b[4..8] == b"ftyp" && is_heic(b) {
        Some(ImageFormat::Heic)
    } else {
        None
    }
}

/// The first box of a JPEG XL container (`JXL `); a bare codestream starts FF 0A.
const JXL_CONTAINER: &[u8] = b"\0\0\0\x0cJXL \r\n\x87\n";

/// HEIF brands of HEVC-coded images (ISO/IEC 23008-12 annex B): the major brand, or a
/// compatible one when the major brand is HEIF's generic `mif1`/`msf1`.
fn is_heic(b: &[u8]) -> bool {
    const BRANDS: [&[u8]; 6] = [b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx"];
    let size = be32(b, 0).unwrap_or(0) as usize;
    let end = size.min(b.len());
    BRANDS.contains(&&b[8..12])
        || (16..end)
            .step_by(4)
            .any(|i| b.get(i..i + 4).is_some_and(|x| BRANDS.contains(&x)))
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
    let format = format(b).ok_or_else(|| {
        if is_svg(b) {
            SniffError::Svg
        } else {
            SniffError::Unknown
        }
    })?;
    let mut p = Probe {
        format,
        width: 0,
        height: 0,
        frames: 1,
        orientation: 1,
        cmyk: false,
    };
    match format {
        ImageFormat::Jpeg => jpeg(b, &mut p)?,
        ImageFormat::Png => {
            if b.get(12..16) != Some(b"IHDR".as_slice()) {
                return Err(SniffError::Malformed("PNG"));
            }
            p.width = be32(b, 16).ok_or(SniffError::Malformed("PNG"))?;
            p.height = be32(b, 20).ok_or(SniffError::Malformed("PNG"))?;
            p.frames = png_frames(b);
        }
        ImageFormat::Gif => gif(b, &mut p)?,
        ImageFormat::Webp => webp(b, &mut p)?,
        ImageFormat::Avif | ImageFormat::Heic => avif(b, &mut p)?,
        ImageFormat::Jxl => jxl(b, &mut p)?,
    }
    if p.width == 0 || p.height == 0 {
        return Err(SniffError::Malformed(format.name()));
    }
    Ok(p)
}

/// Whether `b` is SVG text: `<svg` after an optional BOM, XML declaration, comments,
/// processing instructions, a doctype and white space, looked for in the first 64 KiB.
pub fn is_svg(b: &[u8]) -> bool {
    let mut t = &b[..b.len().min(64 << 10)];
    t = t.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(t);
    // The length of `t` up to and past `close`; None when unterminated.
    let skip = |t: &[u8], close: &[u8]| -> Option<usize> {
        t.windows(close.len())
            .position(|w| w == close)
            .map(|i| i + close.len())
    };
    loop {
        let start = t.iter().position(|c| !c.is_ascii_whitespace());
        t = &t[start.unwrap_or(t.len())..];
        let past = if t.starts_with(b"<?") {
            skip(t, b"?>")
        } else if t.starts_with(b"<!--") {
            skip(t, b"-->")
        } else if t.len() >= 9 && t[..9].eq_ignore_ascii_case(b"<!DOCTYPE") {
            // An internal subset ends with `]>`.
            match (
                t.iter().position(|&c| c == b'['),
                t.iter().position(|&c| c == b'>'),
            ) {
                (Some(open), Some(end)) if open < end => skip(t, b"]>"),
                (_, end) => end.map(|e| e + 1),
            }
        } else {
            return t.starts_with(b"<svg")
                && t.get(4)
                    .is_some_and(|&c| c.is_ascii_whitespace() || c == b'>' || c == b'/');
        };
        match past {
            Some(n) => t = &t[n..],
            None => return false,
        }
    }
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
                p.cmyk = seg.get(5) == Some(&4);
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

/// An APNG's frames, from its `acTL` chunk (before the image data; chunks walked by their
/// lengths, nothing inflated): 1 for a still PNG. The default image is not counted.
fn png_frames(b: &[u8]) -> u32 {
    let mut at = 8;
    while let (Some(len), Some(kind)) = (be32(b, at), b.get(at + 4..at + 8)) {
        match kind {
            b"acTL" => return be32(b, at + 8).unwrap_or(1).max(1),
            b"IDAT" => break,
            _ => at = at.saturating_add(12).saturating_add(len as usize),
        }
    }
    1
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

/// The colour description of an AVIF `colr` box of type `nclx` (ITU-T H.273 code points).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nclx {
    pub primaries: u16,
    pub transfer: u16,
    pub matrix: u16,
    pub full_range: bool,
}

/// What an AVIF's `meta` box says of its primary item: its size (`ispe`), its colour
/// description (`colr` nclx), where its ICC profile is (`colr` prof or rICC) and the EXIF
/// orientation equivalent of its `irot`/`imir`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AvifHeader {
    pub width: u32,
    pub height: u32,
    pub nclx: Option<Nclx>,
    /// The ICC profile's bytes in the file: start and end offsets.
    pub icc: Option<(usize, usize)>,
    pub orientation: u8,
}

/// One ISOBMFF box: its type and the range of its payload in the buffer.
struct Bmff {
    kind: [u8; 4],
    body: std::ops::Range<usize>,
}

/// The boxes in `b[range]`, in order; `None` at the first one that does not fit.
fn boxes(b: &[u8], range: std::ops::Range<usize>) -> impl Iterator<Item = Option<Bmff>> + '_ {
    let end = range.end.min(b.len());
    let mut at = range.start;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let parsed = (|| {
            let size = be32(b, at)?;
            let kind: [u8; 4] = b.get(at + 4..at + 8)?.try_into().ok()?;
            let (head, len) = match size {
                0 => (8, end - at),
                1 => {
                    let large = (u64::from(be32(b, at + 8)?) << 32) | u64::from(be32(b, at + 12)?);
                    (16, usize::try_from(large).ok()?)
                }
                n => (8, n as usize),
            };
            let stop = at.checked_add(len)?;
            if len < head || stop > end {
                return None;
            }
            Some((
                Bmff {
                    kind,
                    body: at + head..stop,
                },
                stop,
            ))
        })();
        match parsed {
            Some((bx, next)) => {
                at = next;
                Some(Some(bx))
            }
            None => {
                at = end;
                Some(None)
            }
        }
    })
}

/// Whether every top-level box of an ISOBMFF file lies within it: none claims more bytes than
/// the file has (a parser that sizes buffers by what boxes claim is then bounded by the file).
pub fn boxes_fit(b: &[u8]) -> bool {
    boxes(b, 0..b.len()).all(|bx| bx.is_some())
}

/// The primary item's properties: `meta` → `pitm` (which item), `iprp` → `ipma` (its property
/// indices) → `ipco` (the properties). Reads headers only; every offset is checked.
pub fn avif_header(b: &[u8]) -> Result<AvifHeader, SniffError> {
    let err = SniffError::Malformed("AVIF");
    let find =
        |range: std::ops::Range<usize>, kind: &[u8; 4]| -> Result<Option<Bmff>, SniffError> {
            for bx in boxes(b, range) {
                let bx = bx.ok_or(err.clone())?;
                if &bx.kind == kind {
                    return Ok(Some(bx));
                }
            }
            Ok(None)
        };
    let meta = find(0..b.len(), b"meta")?.ok_or(err.clone())?;
    // `meta` is a full box: version and flags before its children.
    let children = meta.body.start + 4..meta.body.end;
    // Each box's payload: every read below stays inside the box it belongs to.
    let body = |bx: &Bmff| &b[bx.body.clone()];
    let pitm = find(children.clone(), b"pitm")?.ok_or(err.clone())?;
    let pitm = body(&pitm);
    let primary = match pitm.first() {
        Some(0) => u32::from(be16(pitm, 4).ok_or(err.clone())?),
        Some(_) => be32(pitm, 4).ok_or(err.clone())?,
        None => return Err(err),
    };
    let iprp = find(children, b"iprp")?.ok_or(err.clone())?;
    let ipco = find(iprp.body.clone(), b"ipco")?.ok_or(err.clone())?;

    // The 1-based property indices associated with the primary item, in order.
    let mut indices = Vec::new();
    for bx in boxes(b, iprp.body.clone()) {
        let bx = bx.ok_or(err.clone())?;
        if &bx.kind != b"ipma" {
            continue;
        }
        let ipma = body(&bx);
        let version = *ipma.first().ok_or(err.clone())?;
        let wide_index = ipma.get(3).ok_or(err.clone())? & 1 == 1;
        let count = be32(ipma, 4).ok_or(err.clone())?;
        let mut at = 8;
        // Each entry takes at least 3 bytes: a count past the box's end fails on reading.
        for _ in 0..count {
            let item = if version < 1 {
                at += 2;
                u32::from(be16(ipma, at - 2).ok_or(err.clone())?)
            } else {
                at += 4;
                be32(ipma, at - 4).ok_or(err.clone())?
            };
            let n = usize::from(*ipma.get(at).ok_or(err.clone())?);
            at += 1;
            let width = if wide_index { 2 } else { 1 };
            let associations = ipma.get(at..at + n * width).ok_or(err.clone())?;
            if item == primary {
                indices.extend(associations.chunks_exact(width).map(|a| match a {
                    [hi, lo] => usize::from(u16::from_be_bytes([*hi, *lo]) & 0x7FFF),
                    _ => usize::from(a[0] & 0x7F),
                }));
            }
            at += n * width;
        }
    }
    let props: Vec<Bmff> = boxes(b, ipco.body)
        .collect::<Option<_>>()
        .ok_or(err.clone())?;

    let mut header = AvifHeader {
        width: 0,
        height: 0,
        nclx: None,
        icc: None,
        orientation: 1,
    };
    let (mut sized, mut rotation, mut mirror) = (false, 0u8, None);
    for i in indices {
        // Index 0 means "no property".
        let Some(p) = i.checked_sub(1).and_then(|i| props.get(i)) else {
            continue;
        };
        let v = body(p);
        match &p.kind {
            // A full box: version and flags, then the size.
            b"ispe" if !sized => {
                header.width = be32(v, 4).ok_or(err.clone())?;
                header.height = be32(v, 8).ok_or(err.clone())?;
                sized = true;
            }
            b"colr" if header.nclx.is_none() && v.starts_with(b"nclx") => {
                header.nclx = Some(Nclx {
                    primaries: be16(v, 4).ok_or(err.clone())?,
                    transfer: be16(v, 6).ok_or(err.clone())?,
                    matrix: be16(v, 8).ok_or(err.clone())?,
                    full_range: v.get(10).ok_or(err.clone())? & 0x80 != 0,
                });
            }
            b"colr"
                if header.icc.is_none() && (v.starts_with(b"prof") || v.starts_with(b"rICC")) =>
            {
                header.icc = Some((p.body.start + 4, p.body.end));
            }
            b"irot" => rotation = v.first().ok_or(err.clone())? & 3,
            b"imir" => mirror = Some(v.first().ok_or(err.clone())? & 1),
            _ => {}
        }
    }
    if !sized {
        return Err(err);
    }
    header.orientation = orientation(rotation, mirror);
    Ok(header)
}

/// The EXIF orientation that displays an image stored with `irot` (quarter turns
/// anticlockwise) then `imir` (0: about the vertical axis, left↔right; 1: about the horizontal
/// axis, top↔bottom) applied, as ISO/IEC 23008-12 orders them.
fn orientation(quarter_turns_ccw: u8, mirror: Option<u8>) -> u8 {
    // Clockwise degrees, then a left↔right flip: what `transform::orient` does for 1-8.
    let mut cw = (4 - u32::from(quarter_turns_ccw & 3)) % 4 * 90;
    let flip = match mirror {
        None => false,
        Some(0) => true,
        // Top↔bottom is a left↔right flip of the image turned half a turn more.
        Some(_) => {
            cw = (cw + 180) % 360;
            true
        }
    };
    match (cw, flip) {
        (0, false) => 1,
        (90, false) => 6,
        (180, false) => 3,
        (270, false) => 8,
        (0, true) => 2,
        (90, true) => 5,
        (180, true) => 4,
        _ => 7,
    }
}

/// AVIF and HEIC: both HEIF, whose primary item's properties say size and orientation.
fn avif(b: &[u8], p: &mut Probe) -> Result<(), SniffError> {
    let h = avif_header(b).map_err(|e| match p.format {
        ImageFormat::Heic => SniffError::Malformed("HEIC"),
        _ => e,
    })?;
    p.width = h.width;
    p.height = h.height;
    p.orientation = h.orientation;
    Ok(())
}

/// Codestream bytes collected from a container for its header: the size header and image
/// metadata take a few hundred bytes at most (an ICC profile, which follows them, is not read).
const JXL_HEADER_BYTES: usize = 64 << 10;

/// JPEG XL's image header (size, orientation, animation), parsed by jxl-oxide's own header
/// parser (bit-packed fields: not hand-written here). The container's boxes are walked by its
/// container parser; only the first bytes of the codestream are kept. The size reported is the
/// displayed one: jxl-oxide applies the orientation as it renders, so none is left to apply.
/// An animation counts as one frame: only its first is decoded.
fn jxl(b: &[u8], p: &mut Probe) -> Result<(), SniffError> {
    let err = SniffError::Malformed("JPEG XL");
    let header = jxl_header(b).ok_or(err)?;
    p.width = header.width_with_orientation();
    p.height = header.height_with_orientation();
    Ok(())
}

fn jxl_header(b: &[u8]) -> Option<jxl_oxide::ImageHeader> {
    use jxl_bitstream::{Bitstream, ContainerParser, ParseEvent};
    use jxl_oxide_common::Bundle;
    let mut parser = ContainerParser::new();
    let mut code = Vec::new();
    for event in parser.feed_bytes(b) {
        if let ParseEvent::Codestream(c) = event.ok()? {
            let room = JXL_HEADER_BYTES - code.len();
            code.extend_from_slice(&c[..c.len().min(room)]);
            if code.len() == JXL_HEADER_BYTES {
                break;
            }
        }
    }
    jxl_oxide::ImageHeader::parse(&mut Bitstream::new(&code), ()).ok()
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
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/data/photo-640x856.jpg");
        let b = std::fs::read(path).expect("bench/data photo in the repository");
        let p = probe(&b).unwrap();
        assert_eq!((p.width, p.height, p.format), (640, 856, ImageFormat::Jpeg));
    }

    fn bx(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
        let mut b = ((body.len() + 8) as u32).to_be_bytes().to_vec();
        b.extend_from_slice(kind);
        b.extend_from_slice(body);
        b
    }

    /// An AVIF header: item 1 (a 4000×3000 thumbnail-like item listed first) and item 2, the
    /// primary, 640×480 with an nclx colour box and the given `irot`/`imir` properties.
    fn avif_header_with(extra: &[Vec<u8>]) -> Vec<u8> {
        let ispe = |w: u32, h: u32| {
            let mut b = vec![0u8; 4];
            b.extend_from_slice(&w.to_be_bytes());
            b.extend_from_slice(&h.to_be_bytes());
            bx(b"ispe", &b)
        };
        let mut ipco = ispe(4000, 3000);
        ipco.extend(ispe(640, 480));
        ipco.extend(bx(b"colr", b"nclx\0\x01\0\x0d\0\x01\x80"));
        for e in extra {
            ipco.extend_from_slice(e);
        }
        // Version 0, flags 0: 16-bit item ids, 7-bit property indices (high bit: essential).
        let mut ipma = vec![0, 0, 0, 0, 0, 0, 0, 2, 0, 1, 1, 0x81, 0, 2];
        ipma.push(2 + extra.len() as u8);
        ipma.extend_from_slice(&[0x82, 3]);
        ipma.extend((0..extra.len() as u8).map(|i| 0x84 + i));
        let mut iprp = bx(b"ipco", &ipco);
        iprp.extend(bx(b"ipma", &ipma));
        let mut meta = vec![0u8; 4];
        meta.extend(bx(b"hdlr", &[0u8; 24]));
        meta.extend(bx(b"pitm", &[0, 0, 0, 0, 0, 2]));
        meta.extend(bx(b"iprp", &iprp));
        let mut file = bx(b"ftyp", b"avif\0\0\0\0mif1miafavif");
        file.extend(bx(b"meta", &meta));
        file.extend(bx(b"mdat", b"not looked at"));
        file
    }

    #[test]
    fn avif_properties_are_the_primary_items() {
        let b = avif_header_with(&[]);
        let h = avif_header(&b).unwrap();
        assert_eq!((h.width, h.height, h.orientation), (640, 480, 1));
        assert_eq!(
            h.nclx,
            Some(Nclx {
                primaries: 1,
                transfer: 13,
                matrix: 1,
                full_range: true
            })
        );
        assert_eq!(h.icc, None);
        let p = probe(&b).unwrap();
        assert_eq!((p.format, p.width, p.height), (ImageFormat::Avif, 640, 480));
        // An ICC profile beside the nclx box.
        let with_icc = avif_header_with(&[bx(b"colr", b"profICC bytes")]);
        let (start, end) = avif_header(&with_icc).unwrap().icc.unwrap();
        assert_eq!(&with_icc[start..end], b"ICC bytes");
        // A quarter turn anticlockwise is EXIF's "rotate 270° clockwise" (8); then a
        // left-right mirror makes it 7. A top-bottom mirror alone is 4.
        let irot = bx(b"irot", &[1]);
        assert_eq!(
            avif_header(&avif_header_with(std::slice::from_ref(&irot)))
                .unwrap()
                .orientation,
            8
        );
        let mirror_lr = bx(b"imir", &[0]);
        assert_eq!(
            avif_header(&avif_header_with(&[irot, mirror_lr]))
                .unwrap()
                .orientation,
            7
        );
        let mirror_tb = bx(b"imir", &[1]);
        assert_eq!(
            avif_header(&avif_header_with(&[mirror_tb]))
                .unwrap()
                .orientation,
            4
        );
        for cut in [20, 60, b.len() - 40] {
            assert!(probe(&b[..cut]).is_err(), "cut at {cut}");
        }
        // Cut in `mdat`: the header is whole, the file is not.
        assert!(probe(&b[..b.len() - 4]).is_ok());
        assert!(boxes_fit(&b) && !boxes_fit(&b[..b.len() - 4]));
    }

    #[test]
    fn orientations_compose_like_exif() {
        assert_eq!(orientation(0, None), 1);
        assert_eq!(orientation(3, None), 6);
        assert_eq!(orientation(2, None), 3);
        assert_eq!(orientation(0, Some(0)), 2);
        assert_eq!(orientation(3, Some(0)), 5);
        assert_eq!(orientation(2, Some(1)), 2);
    }

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(path).expect("tests/data fixture in the repository")
    }

    #[test]
    fn jxl_size_from_codestream_and_container() {
        for name in ["flat-160x120.jxl", "flat-160x120-container.jxl"] {
            let b = fixture(name);
            let p = probe(&b).unwrap();
            assert_eq!(
                (p.format, p.width, p.height, p.frames),
                (ImageFormat::Jxl, 160, 120, 1)
            );
            // Cut inside the signature and size header: malformed, not a panic.
            for cut in [2, 3] {
                // The container's codestream (its `jxlc` box's payload) starts at byte 40.
                let head = if b[0] == 0xFF { cut } else { 40 + cut };
                assert_eq!(
                    probe(&b[..head.min(b.len())]),
                    Err(SniffError::Malformed("JPEG XL")),
                    "{name} cut at {head}"
                );
            }
        }
    }

    #[test]
    fn heic_is_heif_with_an_hevc_brand() {
        let b = fixture("flat-160x120.heic");
        let p = probe(&b).unwrap();
        assert_eq!((p.format, p.width, p.height), (ImageFormat::Heic, 160, 120));
        assert_eq!(p.format.mime(), "image/heic");
        // The generic brand alone (`mif1`, compatible `heic`) is HEIC too; without the HEVC
        // brand it is no format of ours.
        let mut generic = b.clone();
        generic[8..12].copy_from_slice(b"mif1");
        assert_eq!(format(&generic), Some(ImageFormat::Heic));
        let mut other = generic.clone();
        for i in (16..28).step_by(4) {
            if &other[i..i + 4] == b"heic" {
                other[i..i + 4].copy_from_slice(b"xxxx");
            }
        }
        assert_eq!(format(&other), None);
        assert_eq!(probe(&b[..40]), Err(SniffError::Malformed("HEIC")));
    }

    #[test]
    fn svg_text_is_recognised_and_refused() {
        for svg in [
            "<svg xmlns=\"http://www.w3.org/2000/svg\"/>",
            "\u{FEFF}<?xml version=\"1.0\"?>\n<!-- made by hand -->\n<svg>",
            "<?xml version=\"1.0\" standalone=\"no\"?>\n<!DOCTYPE svg PUBLIC \"-//W3C//DTD SVG 1.1//EN\" \"http://www.w3.org/Graphics/SVG/1.1/DTD/svg11.dtd\">\n<svg width=\"10\">",
            "<!DOCTYPE svg [ <!ENTITY a \"b\"> ]>\r\n  <svg\tviewBox=\"0 0 1 1\"></svg>",
        ] {
            assert!(is_svg(svg.as_bytes()), "{svg}");
            assert_eq!(probe(svg.as_bytes()), Err(SniffError::Svg), "{svg}");
        }
        for not in [
            "<html><svg></svg></html>",
            "<svgfoo>",
            "<!-- unterminated <svg>",
            "<?xml version=\"1.0\"?><rss/>",
            "",
        ] {
            assert!(!is_svg(not.as_bytes()), "{not}");
        }
        assert!(SniffError::Svg.to_string().contains("SVG"));
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
