//! HEIC sources, decoded by libheif (with libde265 for HEVC) loaded at run time ([`super::dynlib`]):
//! no maintained HEVC decoder exists in Rust, and linking libheif would make its -dev package a
//! build requirement. Without the library a HEIC source is answered 415 naming it. The primary
//! image is decoded to interleaved 8-bit RGB(A) with its transformations ignored: the header
//! probe reads `irot`/`imir` as an EXIF orientation (as for AVIF) and the pipeline applies it,
//! so `ar:0` and the size checks see the same stored size libheif decodes. libheif is told the
//! probed longer side as its limit for each side, so a file whose image is wider or taller than
//! its header said (a grid making more than its `ispe`) is refused before libheif allocates it.
//! Not its area: libheif (1.15) decodes the coded picture at the size its HEVC stream says, up
//! to that side squared, whatever a non-square `ispe` says (an `ispe` of 160×1 over a 160×120
//! picture is decoded, then refused here for its size): so the pool reserves the decode's
//! memory for that side squared ([`decode_side`]; a transform over the route's `decode_memory`
//! is refused before decoding), not for the `ispe`'s area. Reading the HEVC stream's coded
//! size before decoding would reserve less for panoramas.
//! Grids are decoded tile by tile on the calling thread (libheif's own tile threads are turned
//! off: the pool bounds the CPU transforms take).
//! The FFI declarations below are libheif's C API (`libheif/heif.h`, 1.x) for the calls used.

use std::ffi::{c_char, c_int, c_void, CStr};

use super::dynlib::{self, Symbols};
use super::raster::{CodecError, Raster};
use super::sniff::Probe;

/// Bytes a pixel while decoding: libde265's picture (4:2:0 or 4:4:4 planes, 8-bit, with its
/// reference copy), libheif's converted RGBA image, and the raster copied out of it.
pub const DECODE_BYTES_PER_PIXEL: u64 = 16;
/// Bytes besides the pixels (libde265's context and threads' stacks).
pub const DECODE_FIXED_BYTES: u64 = 8 << 20;

#[repr(C)]
struct HeifError {
    code: c_int,
    subcode: c_int,
    message: *const c_char,
}

const HEIF_COLORSPACE_RGB: c_int = 1;
const HEIF_CHROMA_INTERLEAVED_RGB: c_int = 10;
const HEIF_CHROMA_INTERLEAVED_RGBA: c_int = 11;
const HEIF_CHANNEL_INTERLEAVED: c_int = 10;

type Ctx = *mut c_void;
type Handle = *mut c_void;
type Image = *mut c_void;

/// libheif's entry points.
struct Api {
    ctx_alloc: unsafe extern "C" fn() -> Ctx,
    ctx_free: unsafe extern "C" fn(Ctx),
    read: unsafe extern "C" fn(Ctx, *const c_void, usize, *const c_void) -> HeifError,
    max_size: unsafe extern "C" fn(Ctx, c_int),
    max_threads: unsafe extern "C" fn(Ctx, c_int),
    primary: unsafe extern "C" fn(Ctx, *mut Handle) -> HeifError,
    handle_release: unsafe extern "C" fn(Handle),
    has_alpha: unsafe extern "C" fn(Handle) -> c_int,
    options_alloc: unsafe extern "C" fn() -> *mut u8,
    options_free: unsafe extern "C" fn(*mut u8),
    decode: unsafe extern "C" fn(Handle, *mut Image, c_int, c_int, *const u8) -> HeifError,
    image_release: unsafe extern "C" fn(Image),
    image_width: unsafe extern "C" fn(Image, c_int) -> c_int,
    image_height: unsafe extern "C" fn(Image, c_int) -> c_int,
    plane: unsafe extern "C" fn(Image, c_int, *mut c_int) -> *const u8,
    _lib: libloading::Library,
}

/// Sonames tried: libheif 1.x keeps its C API compatible.
pub const LIBHEIF: &[&str] = &["libheif.so.1"];

fn api() -> Result<&'static Api, CodecError> {
    static LIB: dynlib::Once<Api> = dynlib::Once::new();
    let symbols = |lib: libloading::Library| {
        let s = Symbols(&lib);
        // SAFETY: each symbol is declared above with its C signature from libheif/heif.h.
        unsafe {
            Ok(Api {
                ctx_alloc: s.get(b"heif_context_alloc\0")?,
                ctx_free: s.get(b"heif_context_free\0")?,
                read: s.get(b"heif_context_read_from_memory_without_copy\0")?,
                max_size: s.get(b"heif_context_set_maximum_image_size_limit\0")?,
                max_threads: s.get(b"heif_context_set_max_decoding_threads\0")?,
                primary: s.get(b"heif_context_get_primary_image_handle\0")?,
                handle_release: s.get(b"heif_image_handle_release\0")?,
                has_alpha: s.get(b"heif_image_handle_has_alpha_channel\0")?,
                options_alloc: s.get(b"heif_decoding_options_alloc\0")?,
                options_free: s.get(b"heif_decoding_options_free\0")?,
                decode: s.get(b"heif_decode_image\0")?,
                image_release: s.get(b"heif_image_release\0")?,
                image_width: s.get(b"heif_image_get_width\0")?,
                image_height: s.get(b"heif_image_get_height\0")?,
                plane: s.get(b"heif_image_get_plane_readonly\0")?,
                _lib: lib,
            })
        }
    };
    let library = "libheif (Debian: libheif1)";
    dynlib::load(&LIB, LIBHEIF, symbols, "decoding HEIC", library)
}

/// Whether libheif can be loaded (HEIC sources can be decoded).
pub fn can_decode() -> bool {
    api().is_ok()
}

/// Frees what libheif allocated, in reverse order, however decoding ends.
struct Owned<'a> {
    api: &'a Api,
    ctx: Ctx,
    handle: Handle,
    options: *mut u8,
    image: Image,
}

impl Drop for Owned<'_> {
    fn drop(&mut self) {
        // SAFETY: each pointer is null or was returned by its allocator, and is freed once.
        unsafe {
            if !self.image.is_null() {
                (self.api.image_release)(self.image);
            }
            if !self.options.is_null() {
                (self.api.options_free)(self.options);
            }
            if !self.handle.is_null() {
                (self.api.handle_release)(self.handle);
            }
            if !self.ctx.is_null() {
                (self.api.ctx_free)(self.ctx);
            }
        }
    }
}

fn check(e: HeifError) -> Result<(), CodecError> {
    if e.code == 0 {
        return Ok(());
    }
    let message = if e.message.is_null() {
        String::new()
    } else {
        // SAFETY: libheif's messages are static NUL-terminated strings.
        unsafe { CStr::from_ptr(e.message) }
            .to_string_lossy()
            .into_owned()
    };
    Err(CodecError::Decode(
        "HEIC",
        format!("{message} (libheif error {}.{})", e.code, e.subcode),
    ))
}

/// Decodes the primary image, unoriented, as RGB or RGBA.
/// The limit libheif is given on each side of what it decodes: one more than the probed longer
/// side (libheif refuses a grid, the tiled images phones make, whose width or height is *at*
/// its limit). What it may decode is this side squared, whatever the header's area.
pub fn decode_side(p: &Probe) -> u64 {
    u64::from(p.width.max(p.height)) + 1
}

pub fn decode(src: &[u8], p: &Probe) -> Result<Raster, CodecError> {
    let api = api()?;
    let err = |why: &str| CodecError::Decode("HEIC", why.into());
    // SAFETY: `src` outlives the context (freed by `Owned` before this returns); pointers
    // given to libheif are live locals; every error is checked before a result is used; the
    // plane is read within `stride * height` bytes libheif reports for it.
    unsafe {
        let mut o = Owned {
            api,
            ctx: (api.ctx_alloc)(),
            handle: std::ptr::null_mut(),
            options: std::ptr::null_mut(),
            image: std::ptr::null_mut(),
        };
        if o.ctx.is_null() {
            return Err(err("libheif could not allocate"));
        }
        let side = c_int::try_from(decode_side(p)).map_err(|_| err("too large"))?;
        (api.max_size)(o.ctx, side);
        // A grid's tiles on this (the pool's) thread: libheif's default is up to four threads
        // of its own a grid, a new one for each tile, beyond what `transform_workers` bounds.
        (api.max_threads)(o.ctx, 0);
        check((api.read)(
            o.ctx,
            src.as_ptr().cast(),
            src.len(),
            std::ptr::null(),
        ))?;
        check((api.primary)(o.ctx, &mut o.handle))?;
        let alpha = (api.has_alpha)(o.handle) != 0;
        o.options = (api.options_alloc)();
        if o.options.is_null() {
            return Err(err("libheif could not allocate"));
        }
        // `struct heif_decoding_options` starts `uint8_t version; uint8_t
        // ignore_transformations;` in every version.
        *o.options.add(1) = 1;
        let chroma = if alpha {
            HEIF_CHROMA_INTERLEAVED_RGBA
        } else {
            HEIF_CHROMA_INTERLEAVED_RGB
        };
        check((api.decode)(
            o.handle,
            &mut o.image,
            HEIF_COLORSPACE_RGB,
            chroma,
            o.options,
        ))?;
        let w = (api.image_width)(o.image, HEIF_CHANNEL_INTERLEAVED);
        let h = (api.image_height)(o.image, HEIF_CHANNEL_INTERLEAVED);
        let mut stride: c_int = 0;
        let plane = (api.plane)(o.image, HEIF_CHANNEL_INTERLEAVED, &mut stride);
        let channels: u8 = if alpha { 4 } else { 3 };
        let (w, h, stride) = (
            usize::try_from(w).map_err(|_| err("bad width"))?,
            usize::try_from(h).map_err(|_| err("bad height"))?,
            usize::try_from(stride).map_err(|_| err("bad stride"))?,
        );
        let row = w * usize::from(channels);
        // The stored size (transformations ignored) is the `ispe` size the probe read.
        if plane.is_null() || (w, h) != (p.width as usize, p.height as usize) || stride < row {
            return Err(err("the primary image is not the size its header says"));
        }
        let rows = std::slice::from_raw_parts(plane, stride * (h - 1) + row);
        let mut data = Vec::with_capacity(row * h);
        for y in 0..h {
            data.extend_from_slice(&rows[y * stride..y * stride + row]);
        }
        Ok(Raster {
            width: p.width,
            height: p.height,
            channels,
            data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::sniff;

    #[test]
    fn damaged_files_are_errors() {
        assert!(
            can_decode(),
            "libheif: run tests/provision (Debian's libheif1)"
        );
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/flat-160x120.heic");
        let good = std::fs::read(path).expect("tests/data fixture in the repository");
        let p = sniff::probe(&good).unwrap();
        let r = decode(&good, &p).unwrap();
        assert_eq!((r.width, r.height, r.channels), (160, 120, 3));
        // Every truncation and every byte changed: decoded at the header's size, or refused.
        let mut damaged: Vec<Vec<u8>> = (1..good.len()).map(|n| good[..n].to_vec()).collect();
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0x55;
            damaged.push(b);
        }
        let mut refused = 0;
        for b in &damaged {
            let Ok(p) = sniff::probe(b) else { continue };
            if p.pixels() > 1 << 20 {
                continue;
            }
            match decode(b, &p) {
                Ok(r) => assert_eq!((r.width, r.height), (p.width, p.height)),
                Err(_) => refused += 1,
            }
        }
        assert!(refused > 0);
    }

    #[test]
    fn a_missing_library_is_named() {
        let e = dynlib::open(&["libnot-here.so.9"]).unwrap_err();
        assert!(e.contains("libnot-here.so.9"), "{e}");
        let e = CodecError::Unavailable {
            format: "decoding HEIC",
            library: "libheif (Debian: libheif1)",
            why: e,
        };
        assert!(e
            .to_string()
            .starts_with("decoding HEIC needs libheif (Debian: libheif1)"));
    }
}
