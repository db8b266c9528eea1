//! AVIF sources, decoded to a [`Raster`]: the container is read by `avif-parse` (the primary
//! item's AV1 data and its alpha item; for an image sequence, its primary item: the first frame),
//! each item is decoded by rav1d (the pure-Rust port of dav1d, called through its dav1d API: the
//! only `unsafe` here), and 8-, 10- or 12-bit YUV becomes 8-bit RGB, RGBA or gray through the
//! `yuv` crate. Before any pixel is decoded the AV1 sequence headers' largest frame size is held
//! to the pixel limit, rav1d is told the same limit, and the decoded picture must be the size
//! its `ispe` header announced (the size the probe checked). Any failure is a [`CodecError`].

use std::io::Read;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use rav1d::include::dav1d::data::Dav1dData;
use rav1d::include::dav1d::dav1d::{Dav1dContext, Dav1dLogger, Dav1dSettings};
use rav1d::include::dav1d::headers::{
    DAV1D_PIXEL_LAYOUT_I400, DAV1D_PIXEL_LAYOUT_I420, DAV1D_PIXEL_LAYOUT_I422,
    DAV1D_PIXEL_LAYOUT_I444,
};
use rav1d::include::dav1d::picture::Dav1dPicture;
use rav1d::src::lib::{
    dav1d_close, dav1d_data_create, dav1d_data_unref, dav1d_default_settings, dav1d_get_picture,
    dav1d_open, dav1d_picture_unref, dav1d_send_data,
};
use rav1d::Dav1dResult;
use yuv::{YuvPlanarImage, YuvRange, YuvStandardMatrix};

use super::raster::{CodecError, Limits, Raster};
use super::sniff::{self, Probe};

fn bad(reason: impl Into<String>) -> CodecError {
    CodecError::Decode("AVIF", reason.into())
}

/// Decodes the primary image (with its alpha, if it has one).
pub fn decode(src: &[u8], p: &Probe, limits: &Limits) -> Result<Raster, CodecError> {
    let header = sniff::avif_header(src).map_err(|e| bad(e.to_string()))?;
    let items = read_items(src)?;
    // No frame of an AV1 sequence is larger than its sequence header says: the limit holds
    // before anything is decoded.
    let within = |meta: avif_parse::AV1Metadata| {
        let pixels = u64::from(meta.max_frame_width.get()) * u64::from(meta.max_frame_height.get());
        if pixels > limits.max_pixels {
            return Err(CodecError::TooManyPixels {
                pixels,
                limit: limits.max_pixels,
            });
        }
        Ok(())
    };
    let av1_err = |e: avif_parse::Error| bad(format!("AV1 sequence header: {e}"));
    within(items.primary_item_metadata().map_err(av1_err)?)?;
    if let Some(meta) = items.alpha_item_metadata().map_err(av1_err)? {
        within(meta)?;
    }
    let frame_limit = u32::try_from(limits.max_pixels).unwrap_or(u32::MAX);

    let color = Av1Decoder::open(frame_limit)?.decode(&items.primary_item)?;
    if (color.width(), color.height()) != (p.width, p.height) {
        return Err(bad(format!(
            "the AV1 image is {}x{}, its header says {}x{}",
            color.width(),
            color.height(),
            p.width,
            p.height
        )));
    }
    // The matrix from the container's colour description first, as libavif does; then the AV1
    // stream's. The range is always the stream's: it is how its samples are coded.
    let matrix = header
        .nclx
        .map(|n| n.matrix)
        .filter(|&m| m != MC_UNSPECIFIED)
        .or(color.matrix().filter(|&m| m != MC_UNSPECIFIED))
        .unwrap_or(MC_BT601);
    let alpha = items.alpha_item.as_deref();
    let mut raster = to_raster(&color, matrix, alpha.is_some())?;
    drop(color);
    if let Some(data) = alpha {
        let alpha = Av1Decoder::open(frame_limit)?.decode(data)?;
        if (alpha.width(), alpha.height()) != (raster.width, raster.height) {
            return Err(bad("the alpha image is not the size of the colour image"));
        }
        let (depth, full) = (alpha.depth(), alpha.full_range());
        match alpha.planes()? {
            Planes::Eight(y, ..) => put_alpha(&mut raster, &y, |v| luma8(u16::from(v), 8, full)),
            Planes::Deep(y, ..) => put_alpha(&mut raster, &y, |v| luma8(v, depth, full)),
        }
        if items.premultiplied_alpha {
            unpremultiply(&mut raster.data);
        }
    }
    Ok(raster)
}

/// The primary item's AV1 data and its alpha item's, if any.
fn read_items(src: &[u8]) -> Result<avif_parse::AvifData, CodecError> {
    // avif-parse reserves what a box claims: no box may claim more than the file holds.
    if !sniff::boxes_fit(src) {
        return Err(bad("truncated: a box runs past the end of the file"));
    }
    // avif-parse wants the major brand `avif`. The sniffer accepted this file as AVIF from its
    // brands, and an image sequence (`avis`) carries its first frame as the primary item, which
    // is what is read here (the `moov` box of the sequence is skipped).
    let mut head = src.get(..12).ok_or_else(|| bad("truncated"))?.to_vec();
    head[8..12].copy_from_slice(b"avif");
    let mut reader = head.as_slice().chain(&src[12..]);
    avif_parse::read_avif(&mut reader).map_err(|e| bad(e.to_string()))
}

/// H.273 matrix coefficients that have a meaning of their own here.
const MC_IDENTITY: u16 = 0;
const MC_UNSPECIFIED: u16 = 2;
const MC_BT601: u16 = 6;
const MC_YCGCO: u16 = 8;

/// What the three planes mean.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Matrix {
    /// G, B, R (identity); 4:4:4 only.
    Gbr,
    YCgCo,
    YCbCr(YuvStandardMatrix),
}

fn matrix(code: u16) -> Result<Matrix, CodecError> {
    Ok(match code {
        MC_IDENTITY => Matrix::Gbr,
        1 => Matrix::YCbCr(YuvStandardMatrix::Bt709),
        4 => Matrix::YCbCr(YuvStandardMatrix::Fcc),
        // BT.470 B/G, BT.601 and SMPTE 170M share one matrix.
        5 | MC_BT601 => Matrix::YCbCr(YuvStandardMatrix::Bt601),
        7 => Matrix::YCbCr(YuvStandardMatrix::Smpte240),
        MC_YCGCO => Matrix::YCgCo,
        // The constant-luminance variant is rare; its non-constant matrix is close.
        9 | 10 => Matrix::YCbCr(YuvStandardMatrix::Bt2020),
        m => return Err(bad(format!("matrix coefficients {m} are not supported"))),
    })
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Subsampling {
    S420,
    S422,
    S444,
}

/// One plane of a decoded picture: `height` rows of `stride` samples, `width` of them used.
struct Plane<'a, T> {
    data: &'a [T],
    stride: usize,
    width: usize,
    height: usize,
}

impl<T: Copy> Plane<'_, T> {
    fn rows(&self) -> impl Iterator<Item = &[T]> {
        self.data
            .chunks(self.stride)
            .take(self.height)
            .map(|r| &r[..self.width])
    }
}

/// The planes of a picture: Y, then U and V (none for a monochrome picture).
enum Planes<'a> {
    Eight(Plane<'a, u8>, Option<[Plane<'a, u8>; 2]>),
    Deep(Plane<'a, u16>, Option<[Plane<'a, u16>; 2]>),
}

/// A picture as 8-bit gray, RGB, or RGBA (alpha left opaque, for the alpha item to fill).
fn to_raster(pic: &Picture, matrix_code: u16, alpha: bool) -> Result<Raster, CodecError> {
    let (w, h) = (pic.width(), pic.height());
    let pixels = w as usize * h as usize;
    let (depth, full) = (pic.depth(), pic.full_range());
    let gray = |data: Vec<u8>| {
        let data = if alpha {
            data.iter().flat_map(|&l| [l, l, l, 255]).collect()
        } else {
            data
        };
        Raster {
            width: w,
            height: h,
            channels: if alpha { 4 } else { 1 },
            data,
        }
    };
    let Some(subsampling) = pic.subsampling()? else {
        let mut data = Vec::with_capacity(pixels);
        match pic.planes()? {
            Planes::Eight(y, _) => {
                for row in y.rows() {
                    data.extend(row.iter().map(|&v| luma8(u16::from(v), 8, full)));
                }
            }
            Planes::Deep(y, _) => {
                for row in y.rows() {
                    data.extend(row.iter().map(|&v| luma8(v, depth, full)));
                }
            }
        }
        return Ok(gray(data));
    };
    let matrix = matrix(matrix_code)?;
    if matrix == Matrix::Gbr && subsampling != Subsampling::S444 {
        return Err(bad("identity matrix with subsampled chroma"));
    }
    let range = if full {
        YuvRange::Full
    } else {
        YuvRange::Limited
    };
    // Always RGBA from the converter (it has RGBA for every layout and depth); an opaque image
    // is packed to RGB afterwards, in place.
    let mut data = vec![0u8; pixels * 4];
    match (pic.planes()?, matrix) {
        (Planes::Eight(y, Some([u, v])), _) => rgba8(
            &planar(&y, &u, &v, w, h),
            &mut data,
            subsampling,
            matrix,
            range,
        )?,
        (Planes::Deep(y, Some([u, v])), Matrix::YCbCr(m)) => rgba_deep(
            &planar(&y, &u, &v, w, h),
            &mut data,
            subsampling,
            depth,
            m,
            range,
        )?,
        // No high-depth path for these in the converter: shift to 8 bits first.
        (Planes::Deep(y, Some([u, v])), _) => {
            let (y8, u8_, v8) = (to_8bit(&y, depth), to_8bit(&u, depth), to_8bit(&v, depth));
            let img = planar(&y8.borrowed(), &u8_.borrowed(), &v8.borrowed(), w, h);
            rgba8(&img, &mut data, subsampling, matrix, range)?
        }
        _ => return Err(bad("colour planes missing")),
    }
    if alpha {
        Ok(Raster {
            width: w,
            height: h,
            channels: 4,
            data,
        })
    } else {
        Ok(Raster {
            width: w,
            height: h,
            channels: 3,
            data: rgba_to_rgb(data),
        })
    }
}

fn planar<'a, T: Copy + std::fmt::Debug>(
    y: &Plane<'a, T>,
    u: &Plane<'a, T>,
    v: &Plane<'a, T>,
    w: u32,
    h: u32,
) -> YuvPlanarImage<'a, T> {
    YuvPlanarImage {
        y_plane: y.data,
        y_stride: y.stride as u32,
        u_plane: u.data,
        u_stride: u.stride as u32,
        v_plane: v.data,
        v_stride: v.stride as u32,
        width: w,
        height: h,
    }
}

fn yuv_err(e: yuv::YuvError) -> CodecError {
    bad(format!("colour conversion: {e}"))
}

fn rgba8(
    img: &YuvPlanarImage<u8>,
    out: &mut [u8],
    subsampling: Subsampling,
    matrix: Matrix,
    range: YuvRange,
) -> Result<(), CodecError> {
    use Subsampling::*;
    let stride = img.width * 4;
    match (matrix, subsampling) {
        (Matrix::YCbCr(m), S420) => yuv::yuv420_to_rgba(img, out, stride, range, m),
        (Matrix::YCbCr(m), S422) => yuv::yuv422_to_rgba(img, out, stride, range, m),
        (Matrix::YCbCr(m), S444) => yuv::yuv444_to_rgba(img, out, stride, range, m),
        (Matrix::YCgCo, S420) => yuv::ycgco420_to_rgba(img, out, stride, range),
        (Matrix::YCgCo, S422) => yuv::ycgco422_to_rgba(img, out, stride, range),
        (Matrix::YCgCo, S444) => yuv::ycgco444_to_rgba(img, out, stride, range),
        (Matrix::Gbr, _) => yuv::gbr_to_rgba(img, out, stride, range),
    }
    .map_err(yuv_err)
}

fn rgba_deep(
    img: &YuvPlanarImage<u16>,
    out: &mut [u8],
    subsampling: Subsampling,
    depth: u8,
    m: YuvStandardMatrix,
    range: YuvRange,
) -> Result<(), CodecError> {
    use Subsampling::*;
    let stride = img.width * 4;
    match (depth, subsampling) {
        (10, S420) => yuv::i010_to_rgba(img, out, stride, range, m),
        (10, S422) => yuv::i210_to_rgba(img, out, stride, range, m),
        (10, S444) => yuv::i410_to_rgba(img, out, stride, range, m),
        (12, S420) => yuv::i012_to_rgba(img, out, stride, range, m),
        (12, S422) => yuv::i212_to_rgba(img, out, stride, range, m),
        (12, S444) => yuv::i412_to_rgba(img, out, stride, range, m),
        (d, _) => return Err(bad(format!("{d}-bit samples"))),
    }
    .map_err(yuv_err)
}

/// An 8-bit copy of a high-depth plane, rows packed.
struct Owned8 {
    data: Vec<u8>,
    width: usize,
    height: usize,
}

impl Owned8 {
    fn borrowed(&self) -> Plane<'_, u8> {
        Plane {
            data: &self.data,
            stride: self.width.max(1),
            width: self.width,
            height: self.height,
        }
    }
}

fn to_8bit(p: &Plane<u16>, depth: u8) -> Owned8 {
    let shift = u32::from(depth.saturating_sub(8));
    let half = (1u32 << shift) >> 1;
    let mut data = Vec::with_capacity(p.width * p.height);
    for row in p.rows() {
        data.extend(
            row.iter()
                .map(|&v| ((u32::from(v) + half) >> shift).min(255) as u8),
        );
    }
    Owned8 {
        data,
        width: p.width,
        height: p.height,
    }
}

/// A luma (or alpha) sample of `depth` bits as 0-255: full range scales `0..=2^depth-1`,
/// limited range stretches `16..=235` (scaled to the depth) and clamps.
fn luma8(v: u16, depth: u8, full: bool) -> u8 {
    let shift = u32::from(depth.saturating_sub(8));
    if full {
        if shift == 0 {
            return v.min(255) as u8;
        }
        let max = (1u32 << (shift + 8)) - 1;
        ((u32::from(v).min(max) * 255 + max / 2) / max) as u8
    } else {
        let (lo, span) = (16i32 << shift, 219i32 << shift);
        ((i32::from(v) - lo) * 255 + span / 2)
            .div_euclid(span)
            .clamp(0, 255) as u8
    }
}

/// Writes alpha into channel 3 of an RGBA raster.
fn put_alpha<T: Copy>(img: &mut Raster, a: &Plane<T>, to8: impl Fn(T) -> u8) {
    let row_len = img.width as usize * 4;
    for (row, src) in img.data.chunks_exact_mut(row_len).zip(a.rows()) {
        for (px, &v) in row.chunks_exact_mut(4).zip(src) {
            px[3] = to8(v);
        }
    }
}

/// Colour divided by alpha (the `prem` reference: colour was stored multiplied by alpha).
fn unpremultiply(rgba: &mut [u8]) {
    for px in rgba.chunks_exact_mut(4) {
        let a = u32::from(px[3]);
        if a != 0 && a != 255 {
            for c in &mut px[..3] {
                *c = ((u32::from(*c) * 255 + a / 2) / a).min(255) as u8;
            }
        }
    }
}

/// RGBA packed to RGB in the same buffer.
fn rgba_to_rgb(mut data: Vec<u8>) -> Vec<u8> {
    let n = data.len() / 4;
    for i in 0..n {
        let (s, d) = (i * 4, i * 3);
        data[d] = data[s];
        data[d + 1] = data[s + 1];
        data[d + 2] = data[s + 2];
    }
    data.truncate(n * 3);
    data
}

/// The errno rav1d returns (negated) when it needs the other call first.
const EAGAIN: i32 = -libc::EAGAIN;

fn check(r: Dav1dResult, what: &str) -> Result<(), CodecError> {
    match r.0 {
        0 => Ok(()),
        e => Err(bad(format!(
            "{what}: {}",
            std::io::Error::from_raw_os_error(-e)
        ))),
    }
}

/// One rav1d decoder, closed on drop.
struct Av1Decoder {
    ctx: Option<Dav1dContext>,
}

impl Av1Decoder {
    fn open(frame_size_limit: u32) -> Result<Av1Decoder, CodecError> {
        let mut s = MaybeUninit::<Dav1dSettings>::uninit();
        // SAFETY: dav1d_default_settings writes a whole `Dav1dSettings` through the pointer,
        // which points to memory of that type.
        let mut s = unsafe {
            dav1d_default_settings(NonNull::from(&mut s).cast());
            s.assume_init()
        };
        // Two frame contexts, not one: with a single one, rav1d 1.1.0 panics on its error path
        // (memorysafety/rav1d#1497) and, its API being `extern "C"`, the panic aborts the whole
        // process. Two frame contexts need two worker threads; the picture is drained below.
        s.n_threads = 2;
        s.max_frame_delay = 2;
        // Of a layered image, only the highest spatial layer.
        s.all_layers = 0;
        s.apply_grain = 1;
        // rav1d refuses frames over this many pixels before allocating them.
        s.frame_size_limit = frame_size_limit;
        // SAFETY: no callback, so nothing is ever called with the cookie: logging is off.
        s.logger = unsafe { Dav1dLogger::new(None, None) };
        let mut ctx = None;
        // SAFETY: both pointers are valid for the call; `s` is fully initialized.
        let r = unsafe { dav1d_open(Some(NonNull::from(&mut ctx)), Some(NonNull::from(&mut s))) };
        check(r, "opening the AV1 decoder")?;
        if ctx.is_none() {
            return Err(CodecError::Internal("rav1d opened no context".into()));
        }
        Ok(Av1Decoder { ctx })
    }

    /// Decodes one AVIF item (one AV1 temporal unit) to its picture.
    fn decode(&mut self, av1: &[u8]) -> Result<Picture, CodecError> {
        if av1.is_empty() {
            return Err(bad("empty AV1 item"));
        }
        let mut data = Dav1dData::default();
        // SAFETY: `data` is valid to write; on success the returned pointer is the start of a
        // buffer of `av1.len()` bytes that `data` owns, which the copy fills exactly.
        unsafe {
            let buf = dav1d_data_create(Some(NonNull::from(&mut data)), av1.len());
            if buf.is_null() {
                return Err(CodecError::Internal("rav1d could not allocate".into()));
            }
            std::ptr::copy_nonoverlapping(av1.as_ptr(), buf, av1.len());
        }
        let result = self.feed(&mut data);
        // SAFETY: `data` came from dav1d_data_create; unref releases what the decoder did not
        // take (nothing, when it took it all).
        unsafe { dav1d_data_unref(Some(NonNull::from(&mut data))) };
        result
    }

    /// Sends `data` and takes its pictures out, as dav1d's own tools loop: a send the decoder
    /// cannot take yet (EAGAIN) waits for a picture to be taken out, and once all data is in,
    /// asking again drains the frames in flight (a second EAGAIN then means there are no more).
    /// The last picture is the image: a layered (progressive) item refines it layer by layer.
    /// Bounded: an item of many frames, or one that never gives a picture, is an error.
    fn feed(&mut self, data: &mut Dav1dData) -> Result<Picture, CodecError> {
        const MAX_PICTURES: usize = 8;
        let ctx = self.ctx;
        let (mut last, mut pictures, mut drained) = (None, 0, 0);
        for _ in 0..64 {
            if data.sz > 0 {
                // SAFETY: `ctx` is open; `data` is a valid Dav1dData from dav1d_data_create.
                let r = unsafe { dav1d_send_data(ctx, Some(NonNull::from(&mut *data))) };
                if r.0 != EAGAIN {
                    check(r, "AV1 data")?;
                }
            }
            let mut pic = Picture(Dav1dPicture::default());
            // SAFETY: `ctx` is open; `pic.0` is valid to write. From here `pic` owns whatever
            // the call put in it, and unrefs it on drop (an empty picture unrefs to nothing).
            let r = unsafe { dav1d_get_picture(ctx, Some(NonNull::from(&mut pic.0))) };
            match r.0 {
                0 => {
                    pictures += 1;
                    if pictures > MAX_PICTURES {
                        return Err(bad("more than one image in the AV1 data"));
                    }
                    last = Some(pic);
                    drained = 0;
                }
                EAGAIN if data.sz > 0 => {}
                EAGAIN => {
                    drained += 1;
                    if drained == 2 {
                        return last.ok_or_else(|| bad("no picture in the AV1 data"));
                    }
                }
                _ => check(r, "AV1 data")?,
            }
        }
        Err(bad("the AV1 data does not come to an end"))
    }
}

impl Drop for Av1Decoder {
    fn drop(&mut self) {
        // SAFETY: `ctx` came from dav1d_open and is closed once (dav1d_close sets it to None).
        unsafe { dav1d_close(Some(NonNull::from(&mut self.ctx))) };
    }
}

/// A decoded picture, released on drop. Reading it never writes it.
struct Picture(Dav1dPicture);

impl Drop for Picture {
    fn drop(&mut self) {
        // SAFETY: the picture is either default (nothing to release) or was filled by
        // dav1d_get_picture and is released once here.
        unsafe { dav1d_picture_unref(Some(NonNull::from(&mut self.0))) };
    }
}

impl Picture {
    fn width(&self) -> u32 {
        u32::try_from(self.0.p.w).unwrap_or(0)
    }

    fn height(&self) -> u32 {
        u32::try_from(self.0.p.h).unwrap_or(0)
    }

    fn depth(&self) -> u8 {
        u8::try_from(self.0.p.bpc).unwrap_or(0)
    }

    /// `None` for monochrome.
    fn subsampling(&self) -> Result<Option<Subsampling>, CodecError> {
        Ok(match self.0.p.layout {
            DAV1D_PIXEL_LAYOUT_I400 => None,
            DAV1D_PIXEL_LAYOUT_I420 => Some(Subsampling::S420),
            DAV1D_PIXEL_LAYOUT_I422 => Some(Subsampling::S422),
            DAV1D_PIXEL_LAYOUT_I444 => Some(Subsampling::S444),
            l => return Err(bad(format!("pixel layout {l}"))),
        })
    }

    fn sequence_header(&self) -> Option<&rav1d::include::dav1d::headers::Dav1dSequenceHeader> {
        // SAFETY: a picture from dav1d_get_picture holds a reference to its sequence header,
        // valid while the picture is.
        self.0.seq_hdr.map(|h| unsafe { h.as_ref() })
    }

    /// H.273 matrix coefficients from the AV1 sequence header.
    fn matrix(&self) -> Option<u16> {
        self.sequence_header()
            .and_then(|h| u16::try_from(h.mtrx).ok())
    }

    fn full_range(&self) -> bool {
        self.sequence_header().is_some_and(|h| h.color_range != 0)
    }

    fn planes(&self) -> Result<Planes<'_>, CodecError> {
        let chroma = self.subsampling()?.is_some();
        Ok(match self.depth() {
            8 => Planes::Eight(
                self.plane(0)?,
                if chroma {
                    Some([self.plane(1)?, self.plane(2)?])
                } else {
                    None
                },
            ),
            10 | 12 => Planes::Deep(
                self.plane(0)?,
                if chroma {
                    Some([self.plane(1)?, self.plane(2)?])
                } else {
                    None
                },
            ),
            d => return Err(bad(format!("{d}-bit samples"))),
        })
    }

    /// Plane `index` (0 Y, 1 U, 2 V) as samples of `T` (u8 at 8 bits, u16 above).
    fn plane<T>(&self, index: usize) -> Result<Plane<'_, T>, CodecError> {
        let (ss_x, ss_y) = match (index, self.subsampling()?) {
            (0, _) | (_, Some(Subsampling::S444)) => (0, 0),
            (_, Some(Subsampling::S422)) => (1, 0),
            (_, Some(Subsampling::S420)) => (1, 1),
            (_, None) => return Err(bad("chroma plane of a monochrome picture")),
        };
        let width = (self.width() as usize + ss_x) >> ss_x;
        let height = (self.height() as usize + ss_y) >> ss_y;
        let size = std::mem::size_of::<T>();
        let ptr = self.0.data[index].ok_or_else(|| bad("picture without pixels"))?;
        let stride_bytes = usize::try_from(self.0.stride[usize::from(index > 0)])
            .map_err(|_| bad("negative stride"))?;
        if width == 0
            || height == 0
            || stride_bytes % size != 0
            || stride_bytes / size < width
            || ptr.as_ptr() as usize % std::mem::align_of::<T>() != 0
        {
            return Err(CodecError::Internal(
                "unexpected rav1d picture layout".into(),
            ));
        }
        let stride = stride_bytes / size;
        // SAFETY: rav1d allocates each plane as at least `height` whole rows of `stride` samples
        // (rows rounded up to 128 luma lines), aligned for `T` (checked above), and keeps them
        // alive and unchanged while this picture holds its reference.
        let data = unsafe { std::slice::from_raw_parts(ptr.as_ptr().cast::<T>(), stride * height) };
        Ok(Plane {
            data,
            stride,
            width,
            height,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::codec;
    use crate::images::sniff::ImageFormat;

    const LIMITS: Limits = Limits {
        max_pixels: 1 << 20,
        max_frames: 1,
        max_animation_pixels: 500_000_000,
        ..Limits::DEFAULT
    };

    /// A `w`×`h` raster of (x·k, y·k, 200[, alpha by column]) pixels.
    fn gradient(w: u32, h: u32, alpha: bool) -> Raster {
        let c = if alpha { 4 } else { 3 };
        let mut data = Vec::new();
        for y in 0..h {
            for x in 0..w {
                data.extend_from_slice(&[(x * 255 / w) as u8, (y * 255 / h) as u8, 200]);
                if alpha {
                    data.push(if x < w / 2 { 255 } else { 0 });
                }
            }
        }
        Raster {
            width: w,
            height: h,
            channels: c,
            data,
        }
    }

    fn close(a: &[u8], b: &[u8], tolerance: u8) -> bool {
        a.iter().zip(b).all(|(x, y)| x.abs_diff(*y) <= tolerance)
    }

    #[test]
    fn round_trips_through_the_encoder() {
        for alpha in [false, true] {
            let src = gradient(48, 32, alpha);
            let bytes = codec::encode(&src, ImageFormat::Avif, 95).unwrap();
            let p = sniff::probe(&bytes).unwrap();
            assert_eq!((p.format, p.width, p.height), (ImageFormat::Avif, 48, 32));
            let img = decode(&bytes, &p, &LIMITS).unwrap();
            assert_eq!((img.width, img.height), (48, 32));
            assert_eq!(img.channels, if alpha { 4 } else { 3 });
            let c = usize::from(img.channels);
            // A pixel well inside each half: colour close, alpha exact where it was 0 or 255.
            for x in [8usize, 40] {
                let at = (16 * 48 + x) * c;
                let (got, want) = (&img.data[at..at + c], &src.data[at..at + c]);
                if alpha && want[3] == 0 {
                    assert!(got[3] < 8, "{x}: {got:?}");
                } else {
                    assert!(close(got, want, 12), "{alpha} {x}: {got:?} vs {want:?}");
                }
            }
        }
    }

    #[test]
    fn odd_sizes_and_gray_round_trip_through_the_encoder() {
        // 4:2:0 chroma of an odd width and height covers the last column and row.
        let src = gradient(33, 17, false);
        let bytes = codec::encode(&src, ImageFormat::Avif, 90).unwrap();
        let p = sniff::probe(&bytes).unwrap();
        let img = decode(&bytes, &p, &LIMITS).unwrap();
        assert_eq!((img.width, img.height, img.channels), (33, 17, 3));
        for (x, y) in [(4usize, 4usize), (32, 16), (16, 8)] {
            let at = (y * 33 + x) * 3;
            let (got, want) = (&img.data[at..at + 3], &src.data[at..at + 3]);
            assert!(close(got, want, 16), "({x}, {y}): {got:?} vs {want:?}");
        }
        // Gray is coded as monochrome (no chroma planes) and decodes as gray.
        let gray = src.to_gray();
        let bytes = codec::encode(&gray, ImageFormat::Avif, 90).unwrap();
        let p = sniff::probe(&bytes).unwrap();
        let img = decode(&bytes, &p, &LIMITS).unwrap();
        assert_eq!((img.width, img.height, img.channels), (33, 17, 1));
        assert!(close(&img.data, &gray.data, 12));
        // Gray with alpha (RGBA of equal channels) keeps its alpha.
        let rgba = gradient(33, 17, true).to_gray();
        let bytes = codec::encode(&rgba, ImageFormat::Avif, 90).unwrap();
        let p = sniff::probe(&bytes).unwrap();
        let img = decode(&bytes, &p, &LIMITS).unwrap();
        assert_eq!(img.channels, 4);
        assert!(img.data[(8 * 33 + 30) * 4 + 3] < 8);
        assert!(img.data[(8 * 33 + 2) * 4 + 3] > 247);
    }

    #[test]
    fn a_frame_larger_than_the_limit_is_refused_before_decoding() {
        let bytes = codec::encode(&gradient(64, 64, false), ImageFormat::Avif, 50).unwrap();
        let p = sniff::probe(&bytes).unwrap();
        let small = Limits {
            max_pixels: 64 * 63,
            ..LIMITS
        };
        assert!(matches!(
            decode(&bytes, &p, &small),
            Err(CodecError::TooManyPixels { pixels: 4096, .. })
        ));
    }

    #[test]
    fn corrupt_and_truncated_data_are_errors() {
        let bytes = codec::encode(&gradient(32, 32, true), ImageFormat::Avif, 50).unwrap();
        let p = sniff::probe(&bytes).unwrap();
        for cut in [bytes.len() - 1, bytes.len() / 2, bytes.len() * 3 / 4] {
            assert!(decode(&bytes[..cut], &p, &LIMITS).is_err(), "cut at {cut}");
        }
        // The AV1 payload is the mdat box's (last): scramble all of it, OBU headers included
        // (AV1 has no checksums: scrambled tile data alone may well decode to other pixels).
        let mut bad = bytes.clone();
        let start = bad.windows(4).position(|w| w == b"mdat").unwrap() + 4;
        for (i, b) in bad[start..].iter_mut().enumerate() {
            *b ^= 0x5A ^ i as u8;
        }
        assert!(decode(&bad, &p, &LIMITS).is_err());
    }

    /// An AVIF of four flat quadrants (`QUADRANTS`), encoded by rav1e as `depth`-bit YUV with
    /// the given layout, H.273 matrix and range, as an encoder other than ravif would.
    fn encoded(cs: rav1e::prelude::ChromaSampling, depth: u8, mc: u16, full: bool) -> Vec<u8> {
        use rav1e::prelude::*;
        let (w, h) = (32usize, 24usize);
        let mono = cs == ChromaSampling::Cs400;
        let cfg = Config::new()
            .with_threads(1)
            .with_encoder_config(EncoderConfig {
                width: w,
                height: h,
                bit_depth: usize::from(depth),
                chroma_sampling: cs,
                pixel_range: if full {
                    PixelRange::Full
                } else {
                    PixelRange::Limited
                },
                color_description: Some(ColorDescription {
                    color_primaries: ColorPrimaries::BT709,
                    transfer_characteristics: TransferCharacteristics::SRGB,
                    matrix_coefficients: match mc {
                        0 => MatrixCoefficients::Identity,
                        1 => MatrixCoefficients::BT709,
                        8 => MatrixCoefficients::YCgCo,
                        _ => MatrixCoefficients::BT601,
                    },
                }),
                still_picture: true,
                quantizer: 8,
                min_quantizer: 8,
                speed_settings: SpeedSettings::from_preset(10),
                ..Default::default()
            });
        fn run<P: Pixel>(cfg: Config, fill: impl Fn(usize, usize, usize) -> u16) -> Vec<u8> {
            let mut ctx: Context<P> = cfg.new_context().unwrap();
            let mut f = ctx.new_frame();
            for (i, plane) in f.planes.iter_mut().enumerate() {
                let (xd, yd) = (plane.cfg.xdec, plane.cfg.ydec);
                let (pw, ph) = (plane.cfg.width, plane.cfg.height);
                for (y, row) in plane
                    .mut_slice(Default::default())
                    .rows_iter_mut()
                    .enumerate()
                {
                    if y >= ph {
                        break;
                    }
                    for (x, px) in row[..pw].iter_mut().enumerate() {
                        *px = P::cast_from(fill(i, x << xd, y << yd));
                    }
                }
            }
            ctx.send_frame(f).unwrap();
            ctx.flush();
            let mut out = Vec::new();
            loop {
                match ctx.receive_packet() {
                    Ok(mut p) => out.append(&mut p.data),
                    Err(EncoderStatus::Encoded) => {}
                    Err(_) => break,
                }
            }
            out
        }
        let fill = |plane: usize, x: usize, y: usize| {
            let rgb = QUADRANTS[usize::from(x >= w / 2) + 2 * usize::from(y >= h / 2)];
            yuv_of(rgb, depth, mc, full)[plane]
        };
        let av1 = if depth == 8 {
            run::<u8>(cfg, fill)
        } else {
            run::<u16>(cfg, fill)
        };
        let (xd, yd) = match cs {
            ChromaSampling::Cs420 | ChromaSampling::Cs400 => (true, true),
            ChromaSampling::Cs422 => (true, false),
            ChromaSampling::Cs444 => (false, false),
        };
        let mut a = avif_serialize::Aviffy::new();
        a.set_chroma_subsampling((xd, yd))
            .set_monochrome(mono)
            .set_full_color_range(full)
            .set_seq_profile(match (depth, cs) {
                (12, _) | (_, ChromaSampling::Cs422) => 2,
                (_, ChromaSampling::Cs444) => 1,
                _ => 0,
            });
        let a = match mc {
            0 => a.set_matrix_coefficients(avif_serialize::constants::MatrixCoefficients::Rgb),
            1 => a.set_matrix_coefficients(avif_serialize::constants::MatrixCoefficients::Bt709),
            8 => a.set_matrix_coefficients(avif_serialize::constants::MatrixCoefficients::Ycgco),
            _ => a.set_matrix_coefficients(avif_serialize::constants::MatrixCoefficients::Bt601),
        };
        a.to_vec(&av1, None, w as u32, h as u32, depth)
    }

    const QUADRANTS: [[u8; 3]; 4] = [[200, 40, 40], [40, 170, 60], [20, 30, 160], [245, 245, 245]];

    /// Y, U, V of an RGB colour (reference formulas of H.273, in floating point).
    fn yuv_of([r, g, b]: [u8; 3], depth: u8, mc: u16, full: bool) -> [u16; 3] {
        let (r, g, b) = (
            f64::from(r) / 255.0,
            f64::from(g) / 255.0,
            f64::from(b) / 255.0,
        );
        let max = f64::from((1u32 << depth) - 1);
        let scale = f64::from(1u32 << (depth - 8));
        let q = |v: f64| v.round().clamp(0.0, max) as u16;
        // (Y, Cb-like, Cr-like) in [0, 1] and [-0.5, 0.5], then coded.
        let (y, u, v) = match mc {
            0 => return [q(g * max), q(b * max), q(r * max)],
            8 => (
                r / 4.0 + g / 2.0 + b / 4.0,
                -r / 4.0 + g / 2.0 - b / 4.0,
                r / 2.0 - b / 2.0,
            ),
            _ => {
                let (kr, kb) = if mc == 1 {
                    (0.2126, 0.0722)
                } else {
                    (0.299, 0.114)
                };
                let y = kr * r + (1.0 - kr - kb) * g + kb * b;
                (
                    y,
                    (b - y) / (2.0 * (1.0 - kb)),
                    (r - y) / (2.0 * (1.0 - kr)),
                )
            }
        };
        let half = f64::from(1u32 << (depth - 1));
        if full {
            [q(y * max), q(u * max + half), q(v * max + half)]
        } else {
            [
                q((16.0 + 219.0 * y) * scale),
                q((128.0 + 224.0 * u) * scale),
                q((128.0 + 224.0 * v) * scale),
            ]
        }
    }

    #[test]
    fn every_layout_depth_matrix_and_range_decodes_to_its_colours() {
        use rav1e::prelude::ChromaSampling::*;
        for (cs, depth, mc, full) in [
            (Cs420, 8, 1, false),
            (Cs420, 10, 6, true),
            (Cs420, 8, 8, true),
            (Cs422, 8, 6, true),
            (Cs422, 10, 1, false),
            (Cs444, 8, 1, true),
            (Cs444, 12, 6, false),
            (Cs444, 8, 0, true),
            (Cs444, 10, 0, true),
            (Cs444, 10, 8, true),
            (Cs420, 12, 1, true),
            (Cs400, 8, 6, true),
            (Cs400, 10, 1, false),
        ] {
            let case = format!("{cs:?} {depth}-bit matrix {mc} full {full}");
            let bytes = encoded(cs, depth, mc, full);
            let p = sniff::probe(&bytes).unwrap();
            let img = decode(&bytes, &p, &LIMITS).unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!((img.width, img.height), (32, 24), "{case}");
            let c = usize::from(img.channels);
            assert_eq!(c, if cs == Cs400 { 1 } else { 3 }, "{case}");
            for (i, want) in QUADRANTS.iter().enumerate() {
                let (x, y) = (8 + 16 * (i % 2), 6 + 12 * (i / 2));
                let got = &img.data[(y * 32 + x) * c..][..c];
                let want: Vec<u8> = if c == 1 {
                    // Monochrome was coded from the colour's luma.
                    let l = yuv_of(*want, 8, mc, true)[0] as u8;
                    vec![l]
                } else {
                    want.to_vec()
                };
                assert!(
                    close(got, &want, 6),
                    "{case}: quadrant {i}: {got:?}, want {want:?}"
                );
            }
        }
    }

    /// Hostile bytes, mostly in the AV1 data (the `mdat` box, last): each decode returns an
    /// error or a picture and never panics. A panic inside rav1d would abort this whole test
    /// binary, not just fail the test: with one frame context (see [`Av1Decoder::open`]) this
    /// aborts within the first few hundred inputs.
    #[test]
    fn mutated_files_never_panic() {
        let seeds = [
            codec::encode(&gradient(40, 24, false), ImageFormat::Avif, 60).unwrap(),
            codec::encode(&gradient(24, 40, true), ImageFormat::Avif, 60).unwrap(),
        ];
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        };
        let mut decoded = 0;
        for i in 0..400 {
            let mut b = seeds[i % 2].clone();
            let mdat = b.windows(4).rposition(|w| w == b"mdat").unwrap() + 4;
            for _ in 0..=next() % 6 {
                if b.len() <= mdat {
                    break;
                }
                let at = if next() % 5 == 0 {
                    (next() % b.len() as u64) as usize
                } else {
                    mdat + (next() % (b.len() - mdat) as u64) as usize
                };
                match next() % 5 {
                    0 => b[at] ^= 1 << (next() % 8),
                    1 => b[at] = next() as u8,
                    2 => b[at] = b[at].wrapping_add(1),
                    3 => b.insert(at, next() as u8),
                    _ => b.truncate(at.max(mdat)),
                }
            }
            if let Ok(p) = sniff::probe(&b) {
                decoded += usize::from(decode(&b, &p, &LIMITS).is_ok());
            }
        }
        // Many still decode (flipped bits in tile data): rav1d was reached.
        assert!(decoded > 20, "{decoded}");
    }

    #[test]
    fn luma_scales_each_depth_and_range_to_8_bits() {
        for depth in [8u8, 10, 12] {
            let s = depth - 8;
            let max = (1u16 << depth) - 1;
            assert_eq!(luma8(0, depth, true), 0, "{depth}");
            assert_eq!(luma8(max, depth, true), 255, "{depth}");
            assert_eq!(luma8(128 << s, depth, true), 128, "{depth}");
            // Limited: 16 is black, 235 white, outside clamps.
            assert_eq!(luma8(16 << s, depth, false), 0, "{depth}");
            assert_eq!(luma8(235 << s, depth, false), 255, "{depth}");
            assert_eq!(luma8(0, depth, false), 0, "{depth}");
            assert_eq!(luma8(max, depth, false), 255, "{depth}");
            assert_eq!(luma8(((16 + 235) / 2) << s, depth, false), 127, "{depth}");
        }
        // 10-bit full range keeps its precision until the last rounding.
        assert_eq!(luma8(1023 / 2, 10, true), 127);
        assert_eq!(luma8(514, 10, true), 128);
    }

    #[test]
    fn alpha_is_written_and_unpremultiplied() {
        let mut img = Raster {
            width: 2,
            height: 1,
            channels: 4,
            data: vec![100, 50, 0, 255, 64, 32, 0, 255],
        };
        let a = [255u8, 128];
        let plane = Plane {
            data: &a,
            stride: 2,
            width: 2,
            height: 1,
        };
        put_alpha(&mut img, &plane, |v| v);
        unpremultiply(&mut img.data);
        assert_eq!(img.data, vec![100, 50, 0, 255, 128, 64, 0, 128]);
    }

    #[test]
    fn rgba_packs_to_rgb_in_place() {
        let v = rgba_to_rgb(vec![1, 2, 3, 255, 4, 5, 6, 255, 7, 8, 9, 0]);
        assert_eq!(v, vec![1, 2, 3, 4, 5, 6, 7, 8, 9]);
    }

    #[test]
    fn matrices_follow_h273() {
        assert_eq!(matrix(1).unwrap(), Matrix::YCbCr(YuvStandardMatrix::Bt709));
        assert_eq!(matrix(6).unwrap(), Matrix::YCbCr(YuvStandardMatrix::Bt601));
        assert_eq!(matrix(5).unwrap(), Matrix::YCbCr(YuvStandardMatrix::Bt601));
        assert_eq!(matrix(0).unwrap(), Matrix::Gbr);
        assert!(matrix(14).is_err());
    }

    #[test]
    fn high_depth_planes_shift_to_8_bits_with_rounding() {
        let s = [0u16, 1, 2, 1023, 512, 0];
        let p = Plane {
            data: &s,
            stride: 3,
            width: 2,
            height: 2,
        };
        let o = to_8bit(&p, 10);
        assert_eq!(o.data, vec![0, 0, 255, 128]);
    }
}
