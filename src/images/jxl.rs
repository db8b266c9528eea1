//! JPEG XL. Decoding through jxl-oxide (pure Rust, on the calling pool thread, its buffers
//! capped by an allocation tracker sized from the probed header, embedded profiles converted to
//! sRGB by its moxcms integration). Encoding through libjxl, loaded at run time (`dlopen`, see
//! [`super::dynlib`]): a machine without it builds and runs larder, and answers JPEG XL output
//! with 415 naming the library. The FFI declarations below are libjxl's encoder API
//! (`jxl/encode.h`, stable since 0.7) for the few calls used.

use std::ffi::{c_int, c_void};

use super::dynlib::{self, Symbols};
use super::raster::{CodecError, Raster};
use super::sniff::Probe;

/// Bytes a pixel of jxl-oxide's own buffers may take while decoding: its planes are `f32`
/// (colour, alpha, and the group and upsampling buffers besides), and the rendered frame is
/// copied once to 8-bit samples. The tracker refuses allocations beyond this; the pool's
/// estimate (`transform::estimate`) counts the same.
pub const DECODE_BYTES_PER_PIXEL: u64 = 48;
/// Bytes besides the pixels: the decoder's tables and a small image's fixed buffers.
pub const DECODE_FIXED_BYTES: u64 = 4 << 20;

/// Decodes the first frame, oriented (jxl-oxide applies the header's orientation; the probe
/// reports the displayed size) and converted to sRGB.
pub fn decode(src: &[u8], p: &Probe) -> Result<Raster, CodecError> {
    let err =
        |e: Box<dyn std::error::Error + Send + Sync>| CodecError::Decode("JPEG XL", e.to_string());
    let budget = p
        .pixels()
        .saturating_mul(DECODE_BYTES_PER_PIXEL)
        .saturating_add(DECODE_FIXED_BYTES);
    let mut image = jxl_oxide::JxlImage::builder()
        .pool(jxl_oxide::JxlThreadPool::none())
        .alloc_tracker(jxl_oxide::AllocTracker::with_limit(
            usize::try_from(budget).unwrap_or(usize::MAX),
        ))
        .read(src)
        .map_err(err)?;
    // The probe read the same header; the limits were checked against it.
    if (image.width(), image.height()) != (p.width, p.height) {
        return Err(CodecError::Decode(
            "JPEG XL",
            "the header changed between reads".into(),
        ));
    }
    image.request_color_encoding(jxl_oxide::EnumColourEncoding::srgb(
        jxl_oxide::RenderingIntent::Relative,
    ));
    let render = image.render_frame(0).map_err(err)?;
    let mut stream = render.stream();
    let (w, h, c) = (stream.width(), stream.height(), stream.channels());
    let mut data = vec![0u8; w as usize * h as usize * c as usize];
    stream.write_to_buffer(&mut data);
    let (channels, data) = match c {
        1 | 3 | 4 => (c as u8, data),
        // Gray with alpha: RGBA, as the other decoders give it.
        2 => (
            4,
            data.chunks_exact(2)
                .flat_map(|p| [p[0], p[0], p[0], p[1]])
                .collect(),
        ),
        n => {
            return Err(CodecError::Decode(
                "JPEG XL",
                format!("{n} channels (CMYK or spot colours) are not supported"),
            ))
        }
    };
    Ok(Raster {
        width: w,
        height: h,
        channels,
        data,
    })
}

// libjxl's types (jxl/codestream_header.h, color_encoding.h, types.h), as declared in C.
type JxlBool = c_int;

#[repr(C)]
struct BasicInfo {
    have_container: JxlBool,
    xsize: u32,
    ysize: u32,
    bits_per_sample: u32,
    exponent_bits_per_sample: u32,
    intensity_target: f32,
    min_nits: f32,
    relative_to_max_display: JxlBool,
    linear_below: f32,
    uses_original_profile: JxlBool,
    have_preview: JxlBool,
    have_animation: JxlBool,
    orientation: c_int,
    num_color_channels: u32,
    num_extra_channels: u32,
    alpha_bits: u32,
    alpha_exponent_bits: u32,
    alpha_premultiplied: JxlBool,
    preview: [u32; 2],
    animation: [u32; 4],
    intrinsic_xsize: u32,
    intrinsic_ysize: u32,
    padding: [u8; 100],
}

#[repr(C)]
struct ColorEncoding {
    color_space: c_int,
    white_point: c_int,
    white_point_xy: [f64; 2],
    primaries: c_int,
    primaries_red_xy: [f64; 2],
    primaries_green_xy: [f64; 2],
    primaries_blue_xy: [f64; 2],
    transfer_function: c_int,
    gamma: f64,
    rendering_intent: c_int,
}

#[repr(C)]
struct PixelFormat {
    num_channels: u32,
    data_type: c_int,
    endianness: c_int,
    align: usize,
}

const JXL_TYPE_UINT8: c_int = 2;
const JXL_NATIVE_ENDIAN: c_int = 0;
const JXL_ENC_SUCCESS: c_int = 0;
const JXL_ENC_NEED_MORE_OUTPUT: c_int = 2;
const JXL_ENC_FRAME_SETTING_EFFORT: c_int = 0;

/// libjxl's encoder entry points.
struct Encoder {
    create: unsafe extern "C" fn(*const c_void) -> *mut c_void,
    destroy: unsafe extern "C" fn(*mut c_void),
    init_basic_info: unsafe extern "C" fn(*mut BasicInfo),
    set_basic_info: unsafe extern "C" fn(*mut c_void, *const BasicInfo) -> c_int,
    color_srgb: unsafe extern "C" fn(*mut ColorEncoding, JxlBool),
    set_color_encoding: unsafe extern "C" fn(*mut c_void, *const ColorEncoding) -> c_int,
    settings_create: unsafe extern "C" fn(*mut c_void, *const c_void) -> *mut c_void,
    set_option: unsafe extern "C" fn(*mut c_void, c_int, i64) -> c_int,
    set_distance: unsafe extern "C" fn(*mut c_void, f32) -> c_int,
    set_lossless: unsafe extern "C" fn(*mut c_void, JxlBool) -> c_int,
    add_frame: unsafe extern "C" fn(*mut c_void, *const PixelFormat, *const c_void, usize) -> c_int,
    close_input: unsafe extern "C" fn(*mut c_void),
    process_output: unsafe extern "C" fn(*mut c_void, *mut *mut u8, *mut usize) -> c_int,
    _lib: libloading::Library,
}

/// Sonames tried, newest first: the calls used are the same from 0.7 (Debian 12) on.
pub const LIBJXL: &[&str] = &[
    "libjxl.so.0.11",
    "libjxl.so.0.10",
    "libjxl.so.0.9",
    "libjxl.so.0.8",
    "libjxl.so.0.7",
];

fn encoder() -> Result<&'static Encoder, CodecError> {
    static LIB: dynlib::Once<Encoder> = dynlib::Once::new();
    let symbols = |lib: libloading::Library| {
        let s = Symbols(&lib);
        // SAFETY: each symbol is declared above with its C signature from jxl/encode.h.
        unsafe {
            Ok(Encoder {
                create: s.get(b"JxlEncoderCreate\0")?,
                destroy: s.get(b"JxlEncoderDestroy\0")?,
                init_basic_info: s.get(b"JxlEncoderInitBasicInfo\0")?,
                set_basic_info: s.get(b"JxlEncoderSetBasicInfo\0")?,
                color_srgb: s.get(b"JxlColorEncodingSetToSRGB\0")?,
                set_color_encoding: s.get(b"JxlEncoderSetColorEncoding\0")?,
                settings_create: s.get(b"JxlEncoderFrameSettingsCreate\0")?,
                set_option: s.get(b"JxlEncoderFrameSettingsSetOption\0")?,
                set_distance: s.get(b"JxlEncoderSetFrameDistance\0")?,
                set_lossless: s.get(b"JxlEncoderSetFrameLossless\0")?,
                add_frame: s.get(b"JxlEncoderAddImageFrame\0")?,
                close_input: s.get(b"JxlEncoderCloseInput\0")?,
                process_output: s.get(b"JxlEncoderProcessOutput\0")?,
                _lib: lib,
            })
        }
    };
    let library = "libjxl (Debian: libjxl0.7 or later)";
    dynlib::load(&LIB, LIBJXL, symbols, "JPEG XL output", library)
}

/// Whether libjxl can be loaded (JPEG XL output is possible).
pub fn can_encode() -> bool {
    encoder().is_ok()
}

/// Butteraugli distance for a 1-100 quality: libjxl's own mapping (cjxl's `-q`, and
/// `JxlEncoderDistanceFromQuality` from 0.9); 100 is lossless.
fn distance(quality: u8) -> f32 {
    let q = f32::from(quality.clamp(1, 100));
    if q >= 30.0 {
        0.1 + (100.0 - q) * 0.09
    } else {
        53.0 / 3000.0 * q * q - 23.0 / 20.0 * q + 25.0
    }
}

/// libjxl's effort (1 fastest to 9): 4, imgproxy's default (`IMGPROXY_JXL_EFFORT`); libjxl's
/// own default, 7, costs several times the CPU for a few per cent of size.
const EFFORT: i64 = 4;

/// An encoder handle, destroyed however encoding ends.
struct Handle<'a>(&'a Encoder, *mut c_void);

impl Drop for Handle<'_> {
    fn drop(&mut self) {
        // SAFETY: created by JxlEncoderCreate, destroyed once.
        unsafe { (self.0.destroy)(self.1) }
    }
}

/// Encodes 8-bit sRGB pixels: gray stays gray, alpha is kept where some pixel is not opaque.
/// `quality` 100 is lossless, below it lossy (VarDCT) at libjxl's distance for it.
pub fn encode(img: &Raster, quality: u8) -> Result<Vec<u8>, CodecError> {
    let api = encoder()?;
    let fail = |what: &str| CodecError::Encode("JPEG XL", format!("libjxl refused {what}"));
    let (pixels, channels): (std::borrow::Cow<[u8]>, u32) = match img.channels {
        1 => (img.data.as_slice().into(), 1),
        _ if img.has_alpha() => (img.to_rgba().into(), 4),
        _ => (img.to_rgb().into(), 3),
    };
    let lossless = quality >= 100;
    // SAFETY: the encoder is used from this thread only, with pointers to live locals; every
    // status is checked; the handle is destroyed by `Handle`'s drop.
    unsafe {
        let enc = (api.create)(std::ptr::null());
        if enc.is_null() {
            return Err(fail("to allocate an encoder"));
        }
        let enc = Handle(api, enc);
        let mut info: BasicInfo = std::mem::zeroed();
        (api.init_basic_info)(&mut info);
        info.xsize = img.width;
        info.ysize = img.height;
        info.bits_per_sample = 8;
        info.num_color_channels = if channels < 3 { 1 } else { 3 };
        info.uses_original_profile = JxlBool::from(lossless);
        if channels == 4 {
            info.num_extra_channels = 1;
            info.alpha_bits = 8;
        }
        if (api.set_basic_info)(enc.1, &info) != JXL_ENC_SUCCESS {
            return Err(fail("the image's size"));
        }
        let mut colour: ColorEncoding = std::mem::zeroed();
        (api.color_srgb)(&mut colour, JxlBool::from(channels < 3));
        if (api.set_color_encoding)(enc.1, &colour) != JXL_ENC_SUCCESS {
            return Err(fail("sRGB"));
        }
        let settings = (api.settings_create)(enc.1, std::ptr::null());
        if settings.is_null()
            || (api.set_option)(settings, JXL_ENC_FRAME_SETTING_EFFORT, EFFORT) != JXL_ENC_SUCCESS
        {
            return Err(fail("the effort"));
        }
        let status = if lossless {
            (api.set_lossless)(settings, 1)
        } else {
            (api.set_distance)(settings, distance(quality))
        };
        if status != JXL_ENC_SUCCESS {
            return Err(fail("the quality"));
        }
        let format = PixelFormat {
            num_channels: channels,
            data_type: JXL_TYPE_UINT8,
            endianness: JXL_NATIVE_ENDIAN,
            align: 0,
        };
        if (api.add_frame)(settings, &format, pixels.as_ptr().cast(), pixels.len())
            != JXL_ENC_SUCCESS
        {
            return Err(fail("the pixels"));
        }
        (api.close_input)(enc.1);
        // Output grows until libjxl has written it all (a compressed image is rarely more
        // than its 8-bit pixels; the buffer doubles when it is).
        let mut out = vec![0u8; (pixels.len() / 4).max(4096)];
        let mut written = 0;
        loop {
            let mut next = out.as_mut_ptr().add(written);
            let mut avail = out.len() - written;
            let status = (api.process_output)(enc.1, &mut next, &mut avail);
            written = out.len() - avail;
            match status {
                JXL_ENC_SUCCESS => break,
                JXL_ENC_NEED_MORE_OUTPUT => out.resize(out.len() * 2, 0),
                _ => return Err(fail("to encode")),
            }
        }
        out.truncate(written);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::sniff;

    #[test]
    fn damaged_files_are_errors_not_panics() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/flat-160x120.jxl");
        let good = std::fs::read(path).expect("tests/data fixture in the repository");
        let p = sniff::probe(&good).unwrap();
        let r = decode(&good, &p).unwrap();
        assert_eq!((r.width, r.height, r.channels), (160, 120, 3));
        // Every byte changed three ways, and every truncation: decoded or refused, never a
        // panic, and never larger than the header said.
        let mut damaged: Vec<Vec<u8>> = (1..good.len()).map(|n| good[..n].to_vec()).collect();
        for i in 0..good.len() {
            for x in [0x01, 0x80, 0xFF] {
                let mut b = good.clone();
                b[i] ^= x;
                damaged.push(b);
            }
        }
        for b in &damaged {
            let Ok(p) = sniff::probe(b) else { continue };
            if p.pixels() > 1 << 20 {
                continue;
            }
            let run = std::panic::catch_unwind(|| decode(b, &p));
            let r = run.unwrap_or_else(|_| panic!("jxl-oxide panicked on {b:02x?}"));
            if let Ok(r) = r {
                assert_eq!((r.width, r.height), (p.width, p.height));
            }
        }
    }

    #[test]
    fn quality_maps_to_libjxl_distance() {
        assert!((distance(90) - 1.0).abs() < 1e-6);
        assert!((distance(30) - 6.4).abs() < 1e-5);
        // Continuous where the two pieces meet, and falling as quality rises.
        assert!((distance(29) - 6.4).abs() < 0.6);
        assert!(distance(1) > distance(50) && distance(50) > distance(99));
    }
}
