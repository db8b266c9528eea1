//! JPEG decoding through libjpeg-turbo 3's TurboJPEG API (the `turbojpeg` crate's bundled
//! library, called through its `raw` bindings because its safe wrapper has no cropping): DCT
//! scaling (shrink on load) and a band of rows, so that a cover or crop transform decodes only
//! the rows it keeps. Rows below the band are never entropy-decoded; rows above it are skipped
//! without IDCT or colour conversion. CMYK and YCCK sources decode to CMYK samples (4 a pixel,
//! as stored), which the caller converts (`colour::cmyk_to_rgb`).
//!
//! One handle per pool thread is reused from image to image; a handle that failed is dropped.

use std::cell::RefCell;
use std::ffi::CStr;

use turbojpeg::raw;

/// Errors come back as libjpeg-turbo's message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct JpegError(String);

/// A decompression handle.
struct Handle(raw::tjhandle);

impl Handle {
    fn new() -> Result<Handle, JpegError> {
        // SAFETY: tj3Init has no preconditions; a null result is checked.
        let h = unsafe { raw::tj3Init(raw::TJINIT_TJINIT_DECOMPRESS as libc::c_int) };
        if h.is_null() {
            return Err(JpegError("cannot initialise libjpeg-turbo".into()));
        }
        Ok(Handle(h))
    }

    fn error(&self) -> JpegError {
        // SAFETY: the handle is valid; the string is NUL-terminated and owned by the handle.
        let msg = unsafe { CStr::from_ptr(raw::tj3GetErrorStr(self.0)) };
        JpegError(msg.to_string_lossy().into_owned())
    }

    fn check(&self, rc: libc::c_int) -> Result<(), JpegError> {
        if rc == 0 {
            Ok(())
        } else {
            Err(self.error())
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed once.
        unsafe { raw::tj3Destroy(self.0) }
    }
}

thread_local! {
    static HANDLE: RefCell<Option<Handle>> = const { RefCell::new(None) };
}

fn header(h: &Handle, src: &[u8]) -> Result<(u32, u32), JpegError> {
    // SAFETY: the pointer and length describe `src`, which outlives the call.
    h.check(unsafe { raw::tj3DecompressHeader(h.0, src.as_ptr(), src.len() as raw::size_t) })?;
    // SAFETY: valid handle; plain integer getters.
    let (w, hgt) = unsafe {
        (
            raw::tj3Get(h.0, raw::TJPARAM_TJPARAM_JPEGWIDTH as libc::c_int),
            raw::tj3Get(h.0, raw::TJPARAM_TJPARAM_JPEGHEIGHT as libc::c_int),
        )
    };
    if w <= 0 || hgt <= 0 {
        return Err(JpegError("no image size in the header".into()));
    }
    Ok((w as u32, hgt as u32))
}

/// What to decode.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    /// The smallest size the caller needs: the decoder shrinks on load (DCT scaling, num/8) to
    /// the smallest scale keeping both sides at or above it.
    pub need: (u32, u32),
    /// One channel (luma) instead of RGB.
    pub gray: bool,
    /// Rows to keep, as fractions of the height (top, bottom); (0, 1) is the whole image.
    pub band: (f64, f64),
}

/// A decoded band: `top` is the band's first row in the scaled image of `full_height` rows.
pub struct Decoded {
    pub width: u32,
    pub height: u32,
    pub top: u32,
    pub full_height: u32,
    pub channels: u8,
    /// The samples are CMYK, as stored (4 channels), whatever `gray` asked.
    pub cmyk: bool,
    pub data: Vec<u8>,
}

/// The DCT scale (in eighths) a `w`×`h` image decodes at for `need`: the smallest keeping both
/// sides at or above it.
pub fn scale_eighths(w: u32, h: u32, need: (u32, u32)) -> u32 {
    let fits = |n: u32, d: u32, need: u32| eighths(d, n) >= need.min(d);
    (1..=8)
        .find(|&n| fits(n, w, need.0) && fits(n, h, need.1))
        .unwrap_or(8)
}

/// The size a `w`×`h` image decodes to for `need` (before any band is cut).
pub fn scaled_size(w: u32, h: u32, need: (u32, u32)) -> (u32, u32) {
    let n = scale_eighths(w, h, need);
    (eighths(w, n), eighths(h, n))
}

/// `d` scaled by `n`/8, as libjpeg-turbo rounds it.
fn eighths(d: u32, n: u32) -> u32 {
    (d * n).div_ceil(8)
}

/// Decodes `src` as `req` asks. `max_pixels` bounds the full-size image (checked by the caller's
/// probe already; enforced here again from the real header).
pub fn decode(src: &[u8], req: Request, max_pixels: u64) -> Result<Decoded, JpegError> {
    with_handle(|h| {
        let (w, hgt) = header(h, src)?;
        if u64::from(w) * u64::from(hgt) > max_pixels {
            return Err(JpegError("image has too many pixels".into()));
        }
        let n = scale_eighths(w, hgt, req.need);
        let (sw, sh) = (eighths(w, n), eighths(hgt, n));
        // libjpeg-turbo lists its factors in lowest terms (2/8 is 1/4).
        let g = [8u32, 4, 2, 1]
            .into_iter()
            .find(|g| n % g == 0)
            .unwrap_or(1);
        let f = raw::tjscalingfactor {
            num: (n / g) as libc::c_int,
            denom: (8 / g) as libc::c_int,
        };
        // SAFETY: valid handle; the scaling factor is one libjpeg-turbo offers (n/8).
        h.check(unsafe { raw::tj3SetScalingFactor(h.0, f) })?;
        // The band, widened by two rows each side for the resampling filter's support.
        let top = ((req.band.0 * f64::from(sh)).floor() as i64 - 2).clamp(0, i64::from(sh)) as u32;
        let bottom = ((req.band.1 * f64::from(sh)).ceil() as i64 + 2)
            .clamp(i64::from(top) + 1, i64::from(sh)) as u32;
        let region = if top == 0 && bottom == sh {
            raw::tjregion {
                x: 0,
                y: 0,
                w: 0,
                h: 0,
            }
        } else {
            raw::tjregion {
                x: 0,
                y: top as libc::c_int,
                w: sw as libc::c_int,
                h: (bottom - top) as libc::c_int,
            }
        };
        // SAFETY: valid handle; the region lies within the scaled image and starts at x = 0.
        h.check(unsafe { raw::tj3SetCroppingRegion(h.0, region) })?;
        // SAFETY: valid handle after a header was read; a plain integer getter.
        let space = unsafe { raw::tj3Get(h.0, raw::TJPARAM_TJPARAM_COLORSPACE as libc::c_int) };
        let cmyk = space == raw::TJCS_TJCS_CMYK as libc::c_int
            || space == raw::TJCS_TJCS_YCCK as libc::c_int;
        let (format, channels) = if cmyk {
            // libjpeg converts CMYK to nothing else.
            (raw::TJPF_TJPF_CMYK, 4u8)
        } else if req.gray {
            (raw::TJPF_TJPF_GRAY, 1u8)
        } else {
            (raw::TJPF_TJPF_RGB, 3u8)
        };
        let rows = bottom - top;
        let pitch = sw as usize * usize::from(channels);
        let mut data = vec![0u8; pitch * rows as usize];
        // SAFETY: `data` holds `rows` rows of `pitch` bytes, exactly what libjpeg-turbo writes
        // for this scaling factor, cropping region and pixel format; `src` outlives the call.
        h.check(unsafe {
            raw::tj3Decompress8(
                h.0,
                src.as_ptr(),
                src.len() as raw::size_t,
                data.as_mut_ptr(),
                pitch as libc::c_int,
                format as libc::c_int,
            )
        })?;
        Ok(Decoded {
            width: sw,
            height: rows,
            top,
            full_height: sh,
            channels,
            cmyk,
            data,
        })
    })
}

/// Runs `f` with this thread's handle; a handle that failed is dropped, not reused.
fn with_handle<T>(f: impl FnOnce(&Handle) -> Result<T, JpegError>) -> Result<T, JpegError> {
    HANDLE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let h = match slot.take() {
            Some(h) => h,
            None => Handle::new()?,
        };
        let out = f(&h);
        if out.is_ok() {
            *slot = Some(h);
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(w: u32, h: u32) -> Vec<u8> {
        // Rows of increasing brightness: row y has value y (mod 256) in every channel.
        let mut px = Vec::with_capacity((w * h * 3) as usize);
        for y in 0..h {
            for _ in 0..w {
                let v = (y * 255 / h.max(1)) as u8;
                px.extend_from_slice(&[v, v, v]);
            }
        }
        let mut c = turbojpeg::Compressor::new().unwrap();
        c.set_quality(95).unwrap();
        c.compress_to_owned(turbojpeg::Image {
            pixels: px.as_slice(),
            width: w as usize,
            pitch: w as usize * 3,
            height: h as usize,
            format: turbojpeg::PixelFormat::RGB,
        })
        .unwrap()
        .to_vec()
    }

    #[test]
    fn scaled_band_is_the_matching_slice_of_the_whole() {
        let jpg = sample(64, 200);
        let whole = decode(
            &jpg,
            Request {
                need: (32, 100),
                gray: true,
                band: (0.0, 1.0),
            },
            u64::MAX,
        )
        .unwrap();
        assert_eq!((whole.width, whole.height, whole.top), (32, 100, 0));
        let band = decode(
            &jpg,
            Request {
                need: (32, 100),
                gray: true,
                band: (0.25, 0.75),
            },
            u64::MAX,
        )
        .unwrap();
        assert_eq!((band.top, band.full_height), (23, 100));
        assert_eq!(band.height, 77 - 23);
        // The band's rows are the whole image's rows (a smooth gradient: equal within rounding).
        for r in [0u32, 10, band.height - 1] {
            let a = band.data[(r * 32) as usize];
            let b = whole.data[((r + band.top) * 32) as usize];
            assert!(a.abs_diff(b) <= 2, "row {r}: {a} vs {b}");
        }
    }

    #[test]
    fn garbage_and_pixel_bombs_are_errors() {
        let jpg = sample(64, 64);
        let req = Request {
            need: (64, 64),
            gray: false,
            band: (0.0, 1.0),
        };
        assert!(decode(b"not a jpeg", req, u64::MAX).is_err());
        assert!(decode(&jpg, req, 100).is_err());
        let _ = decode(&jpg[..jpg.len() / 2], req, u64::MAX);
        // The handle survives errors: a good decode still works afterwards.
        assert_eq!(decode(&jpg, req, u64::MAX).unwrap().data.len(), 64 * 64 * 3);
    }
}
