//! AV1 still pictures through libaom, loaded at run time ([`super::dynlib`]): one 8-bit YUV
//! 4:2:0 or monochrome picture in, one AV1 keyframe (OBUs, reduced still-picture header) out, at
//! the all-intra usage, one thread, at the fast speeds with its least rewarding searches cut
//! ([`LEAN`]). `avif_encode` converts the pixels and writes the container;
//! this file is only the C calls, in one unsafe block whose invariants are commented.
//!
//! Why libaom beside rav1e: on the bench's 500×436 photo at q80 it is several times faster at
//! the same SSIM and writes fewer bytes (docs/design.md "AVIF encoding"). Why loaded at run
//! time: linking it would make libaom-dev (and nasm, to build it) a build requirement; without
//! libaom.so.3 `avif_encoder = "auto"` uses rav1e. The declarations below are libaom's C API
//! (`aom/aom_encoder.h`, `aomcx.h`, `aom_image.h`, `aom_codec.h`) as of 3.x, for the calls used;
//! the encoder ABI version passed to `aom_codec_enc_init_ver` (29) has been frozen for all of 3.x
//! (aom_encoder.h: the external-partition part of it is pinned to 3.2's value), and a library
//! answering another is refused when it loads, so the structs below match the library's.

use std::ffi::{c_char, c_int, c_long, c_uint, c_ulong, c_void, CStr};

use super::dynlib::{self, Symbols};
use super::raster::CodecError;

/// One plane of 8-bit samples: `stride` bytes a row, `rows` rows at least.
#[derive(Clone, Copy)]
pub struct Plane<'a> {
    pub data: &'a [u8],
    pub stride: usize,
}

/// CICP colour description written into the sequence header (H.273 code points).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cicp {
    pub primaries: u8,
    pub transfer: u8,
    pub matrix: u8,
}

/// What one AV1 picture is made of: luma, and chroma at half size each way (4:2:0) or none
/// (monochrome: gray pixels, or an alpha plane). Samples are full range.
pub struct Picture<'a> {
    pub width: u32,
    pub height: u32,
    pub y: Plane<'a>,
    pub uv: Option<(Plane<'a>, Plane<'a>)>,
    /// None: unspecified (an alpha plane).
    pub cicp: Option<Cicp>,
}

/// libaom's settings for one picture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// cq-level, 0 (best) to 63 ([`cq_level`]).
    pub cq_level: u8,
    /// cpu-used, 0 (slowest) to 9 ([`cpu_used`]).
    pub cpu_used: u8,
    /// Whether the searches in [`LEAN`] are cut ([`lean`]: at cpu-used 8 and 9).
    pub lean: bool,
}

/// The controls (aomcx.h id, value) that cut what libaom's all-intra cpu-used 8 spends least
/// well on one still picture. Measured on the bench photo's 500×436 resize and three others
/// (docs/design.md "AVIF encoding"): ~0.8× the encode's CPU for 0.8-2.1% more bytes, SSIM and
/// each plane's PSNR unchanged or higher. At cpu-used 9 (no rate-distortion search) they change
/// nothing.
pub const LEAN: &[(c_int, c_int)] = &[
    // Trellis quantization (av1_optimize_txb, a fifth of the CPU) in the final coding only,
    // not for each candidate of the rate-distortion search.
    (DISABLE_TRELLIS_QUANT, 2),
    // Coefficient and mode costs from the frame's starting probabilities, not re-derived after
    // each superblock: one frame has little to learn from.
    (COEFF_COST_UPD_FREQ, 3),
    (MODE_COST_UPD_FREQ, 3),
    // Two intra predictors the search tries on small blocks, rarely chosen in photos. (Not
    // CfL: it keeps chroma's PSNR, which luma's SSIM does not see; not smooth or angle deltas:
    // +2-6% bytes on smooth pictures.)
    (ENABLE_FILTER_INTRA, 0),
    (ENABLE_PAETH_INTRA, 0),
];

/// Whether cpu-used `cpu_used` runs [`LEAN`]: at 8 (the default `avif_speed`, 9) and 9 (where
/// it is a no-op); slower speeds are asked for smaller files, and keep libaom's searches.
pub fn lean(cpu_used: u8) -> bool {
    cpu_used >= 8
}

/// cq-level for a 1-100 quality: libheif's mapping (`((100 - q) * 63 + 50) / 100`), so a `q`
/// means what it means to imgproxy (libvips → libheif → libaom). q80 is 13.
pub fn cq_level(quality: u8) -> u8 {
    let q = u32::from(quality.clamp(1, 100));
    (((100 - q) * 63 + 50) / 100) as u8
}

/// cpu-used for `avif_speed` 1-10: 1 is libaom's slowest (0), 10 its fastest all-intra preset
/// (9), one step each.
pub fn cpu_used(avif_speed: u8) -> u8 {
    avif_speed.clamp(1, 10) - 1
}

// libaom's types, as declared in its headers.

/// `aom_codec_ctx_t` (aom_codec.h).
#[repr(C)]
struct CodecCtx {
    name: *const c_char,
    iface: *const c_void,
    err: c_int,
    err_detail: *const c_char,
    init_flags: c_long,
    config: *const c_void,
    private: *mut c_void,
}

/// `aom_codec_enc_cfg_t` (aom_encoder.h), every field in order.
#[repr(C)]
struct EncCfg {
    g_usage: c_uint,
    g_threads: c_uint,
    g_profile: c_uint,
    g_w: c_uint,
    g_h: c_uint,
    g_limit: c_uint,
    g_forced_max_frame_width: c_uint,
    g_forced_max_frame_height: c_uint,
    g_bit_depth: c_int,
    g_input_bit_depth: c_uint,
    g_timebase: [c_int; 2],
    g_error_resilient: u32,
    g_pass: c_int,
    g_lag_in_frames: c_uint,
    rc_dropframe_thresh: c_uint,
    rc_resize_mode: c_uint,
    rc_resize_denominator: c_uint,
    rc_resize_kf_denominator: c_uint,
    rc_superres_mode: c_int,
    rc_superres_denominator: c_uint,
    rc_superres_kf_denominator: c_uint,
    rc_superres_qthresh: c_uint,
    rc_superres_kf_qthresh: c_uint,
    rc_end_usage: c_int,
    rc_twopass_stats_in: [usize; 2],
    rc_firstpass_mb_stats_in: [usize; 2],
    rc_target_bitrate: c_uint,
    rc_min_quantizer: c_uint,
    rc_max_quantizer: c_uint,
    rc_undershoot_pct: c_uint,
    rc_overshoot_pct: c_uint,
    rc_buf_sz: c_uint,
    rc_buf_initial_sz: c_uint,
    rc_buf_optimal_sz: c_uint,
    rc_2pass_vbr_bias_pct: c_uint,
    rc_2pass_vbr_minsection_pct: c_uint,
    rc_2pass_vbr_maxsection_pct: c_uint,
    fwd_kf_enabled: c_int,
    kf_mode: c_int,
    kf_min_dist: c_uint,
    kf_max_dist: c_uint,
    sframe_dist: c_uint,
    sframe_mode: c_uint,
    large_scale_tile: c_uint,
    monochrome: c_uint,
    full_still_picture_hdr: c_uint,
    save_as_annexb: c_uint,
    tile_width_count: c_int,
    tile_height_count: c_int,
    tile_widths: [c_int; 64],
    tile_heights: [c_int; 64],
    use_fixed_qp_offsets: c_uint,
    fixed_qp_offsets: [c_int; 5],
    /// `cfg_options_t`: 35 `unsigned int` flags.
    encoder_cfg: [c_uint; 35],
}

// The sizes libaom 3.x's headers give (checked against them with a C compiler on x86-64).
const _: () = assert!(std::mem::size_of::<EncCfg>() == 904);
const _: () = assert!(std::mem::size_of::<CodecCtx>() == 56);
const _: () = assert!(std::mem::size_of::<Image>() == 168);

/// `aom_image_t` (aom_image.h).
#[repr(C)]
struct Image {
    fmt: c_int,
    cp: c_int,
    tc: c_int,
    mc: c_int,
    monochrome: c_int,
    csp: c_int,
    range: c_int,
    w: c_uint,
    h: c_uint,
    bit_depth: c_uint,
    d_w: c_uint,
    d_h: c_uint,
    r_w: c_uint,
    r_h: c_uint,
    x_chroma_shift: c_uint,
    y_chroma_shift: c_uint,
    planes: [*mut u8; 3],
    stride: [c_int; 3],
    sz: usize,
    bps: c_int,
    temporal_id: c_int,
    spatial_id: c_int,
    user_priv: *mut c_void,
    img_data: *mut u8,
    img_data_owner: c_int,
    self_allocd: c_int,
    metadata: *mut c_void,
    fb_priv: *mut c_void,
}

/// The start of `aom_codec_cx_pkt_t` (aom_encoder.h): its kind, then (a union at offset 8)
/// a frame packet's `buf` and `sz`. Only read through libaom's pointer, never made here.
#[repr(C)]
struct CxPkt {
    kind: c_int,
    buf: *const u8,
    sz: usize,
}

const ENCODER_ABI_VERSION: c_int = 29;
const USAGE_ALL_INTRA: c_uint = 2;
const IMG_FMT_I420: c_int = 0x102;
const RC_Q: c_int = 3;
const BITS_8: c_int = 8;
const CX_FRAME_PKT: c_int = 0;
const CR_FULL_RANGE: c_int = 1;
// Control ids (aomcx.h).
const SET_CPUUSED: c_int = 13;
const SET_TUNING: c_int = 24;
const SET_CQ_LEVEL: c_int = 25;
const SET_COLOR_PRIMARIES: c_int = 45;
const SET_TRANSFER_CHARACTERISTICS: c_int = 46;
const SET_MATRIX_COEFFICIENTS: c_int = 47;
const SET_COLOR_RANGE: c_int = 52;
const DISABLE_TRELLIS_QUANT: c_int = 62;
const ENABLE_FILTER_INTRA: c_int = 98;
const ENABLE_PAETH_INTRA: c_int = 100;
const COEFF_COST_UPD_FREQ: c_int = 126;
const MODE_COST_UPD_FREQ: c_int = 127;
const TUNE_SSIM: c_int = 1;

type Iface = *const c_void;

/// libaom's entry points.
struct Api {
    av1_cx: unsafe extern "C" fn() -> Iface,
    config_default: unsafe extern "C" fn(Iface, *mut EncCfg, c_uint) -> c_int,
    init: unsafe extern "C" fn(*mut CodecCtx, Iface, *const EncCfg, c_long, c_int) -> c_int,
    control: unsafe extern "C" fn(*mut CodecCtx, c_int, ...) -> c_int,
    encode: unsafe extern "C" fn(*mut CodecCtx, *const Image, i64, c_ulong, c_long) -> c_int,
    get_cx_data: unsafe extern "C" fn(*mut CodecCtx, *mut *const c_void) -> *const CxPkt,
    destroy: unsafe extern "C" fn(*mut CodecCtx) -> c_int,
    error_detail: unsafe extern "C" fn(*const CodecCtx) -> *const c_char,
    error: unsafe extern "C" fn(*const CodecCtx) -> *const c_char,
    /// `aom_codec_version_str()`, read once.
    version: String,
    _lib: libloading::Library,
}

/// Sonames tried: libaom 3.x (Debian 12: libaom3, 3.6).
pub const LIBAOM: &[&str] = &["libaom.so.3"];

/// What is named when libaom is missing.
pub const LIBRARY: &str = "libaom (Debian: libaom3)";

fn api() -> Result<&'static Api, CodecError> {
    static LIB: dynlib::Once<Api> = dynlib::Once::new();
    load(&LIB, LIBAOM)
}

/// libaom's entry points from the first of `sonames` that loads, once per `cell`.
fn load(cell: &'static dynlib::Once<Api>, sonames: &[&str]) -> Result<&'static Api, CodecError> {
    let symbols = |lib: libloading::Library| {
        let s = Symbols(&lib);
        // SAFETY: each symbol is declared above with its C signature from libaom's headers.
        let api = unsafe {
            let version: unsafe extern "C" fn() -> *const c_char =
                s.get(b"aom_codec_version_str\0")?;
            Api {
                av1_cx: s.get(b"aom_codec_av1_cx\0")?,
                config_default: s.get(b"aom_codec_enc_config_default\0")?,
                init: s.get(b"aom_codec_enc_init_ver\0")?,
                control: s.get(b"aom_codec_control\0")?,
                encode: s.get(b"aom_codec_encode\0")?,
                get_cx_data: s.get(b"aom_codec_get_cx_data\0")?,
                destroy: s.get(b"aom_codec_destroy\0")?,
                error_detail: s.get(b"aom_codec_error_detail\0")?,
                error: s.get(b"aom_codec_error\0")?,
                // A static NUL-terminated string ("v3.6.0").
                version: CStr::from_ptr(version())
                    .to_string_lossy()
                    .trim_start_matches('v')
                    .to_owned(),
                _lib: lib,
            }
        };
        // An encoder of another ABI (or one without the all-intra usage, before 3.2, or one
        // refusing a control of LEAN) is refused here, so `auto` falls back to rav1e rather
        // than failing every request.
        let probe = Settings {
            cq_level: 63,
            cpu_used: 8,
            lean: true,
        };
        Encoder::new(&api, 16, 16, false, probe)
            .map(drop)
            .map_err(|e| format!("libaom {}: {e}", api.version))?;
        Ok(api)
    };
    dynlib::load(
        cell,
        sonames,
        symbols,
        "AVIF output through libaom",
        LIBRARY,
    )
}

/// Whether libaom loads and its encoder starts (the libaom path is possible).
pub fn available() -> Result<(), CodecError> {
    api().map(drop)
}

/// libaom's version ("3.6.0"), when it loads.
pub fn version() -> Option<&'static str> {
    api().ok().map(|a| a.version.as_str())
}

/// A `aom_codec_ctx_t` on the heap (libaom keeps pointers into it, so it must not move), freed
/// on drop.
struct Ctx(*mut CodecCtx);

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: made by Box::into_raw in `Encoder::new`, freed once.
        drop(unsafe { Box::from_raw(self.0) });
    }
}

/// An initialised encoder, destroyed however encoding ends.
struct Encoder<'a> {
    api: &'a Api,
    ctx: Ctx,
}

impl Drop for Encoder<'_> {
    fn drop(&mut self) {
        // SAFETY: an Encoder exists only once aom_codec_enc_init_ver succeeded on `ctx`; it
        // is destroyed once, before `ctx` is freed (fields drop after this).
        unsafe { (self.api.destroy)(self.ctx.0) };
    }
}

impl<'a> Encoder<'a> {
    /// An all-intra encoder for one `width`×`height` picture, 8-bit, full range, at `s`.
    fn new(
        api: &'a Api,
        width: u32,
        height: u32,
        monochrome: bool,
        s: Settings,
    ) -> Result<Self, String> {
        // SAFETY: `cfg` is a zeroed `aom_codec_enc_cfg_t` of the size libaom's ABI 29 has (the
        // assertion above), which config_default overwrites whole; the context is zeroed, as
        // init expects, and owned by `Ctx`; it becomes an Encoder (which destroys it) only
        // once init succeeded.
        unsafe {
            let iface = (api.av1_cx)();
            let mut cfg: EncCfg = std::mem::zeroed();
            if (api.config_default)(iface, &mut cfg, USAGE_ALL_INTRA) != 0 {
                return Err("no all-intra usage (libaom 3.2 or later is needed)".into());
            }
            cfg.g_w = width;
            cfg.g_h = height;
            cfg.g_threads = 1;
            cfg.g_limit = 1;
            cfg.g_lag_in_frames = 0;
            cfg.g_bit_depth = BITS_8;
            cfg.g_input_bit_depth = 8;
            cfg.rc_end_usage = RC_Q;
            cfg.rc_min_quantizer = 0;
            cfg.rc_max_quantizer = 63;
            cfg.monochrome = c_uint::from(monochrome);
            cfg.full_still_picture_hdr = 0;
            let ctx = Ctx(Box::into_raw(Box::new(std::mem::zeroed())));
            if (api.init)(ctx.0, iface, &cfg, 0, ENCODER_ABI_VERSION) != 0 {
                return Err(describe(api, ctx.0));
            }
            let enc = Encoder { api, ctx };
            enc.control(SET_CPUUSED, c_int::from(s.cpu_used))?;
            enc.control(SET_CQ_LEVEL, c_int::from(s.cq_level))?;
            enc.control(SET_TUNING, TUNE_SSIM)?;
            enc.control(SET_COLOR_RANGE, CR_FULL_RANGE)?;
            if s.lean {
                for &(id, value) in LEAN {
                    enc.control(id, value)?;
                }
            }
            Ok(enc)
        }
    }

    fn control(&self, id: c_int, value: c_int) -> Result<(), String> {
        // SAFETY: an initialised encoder; every control used takes one `int` or `unsigned
        // int`, as aomcx.h types them (passed alike).
        match unsafe { (self.api.control)(self.ctx.0, id, value) } {
            0 => Ok(()),
            _ => Err(describe(self.api, self.ctx.0)),
        }
    }
}

/// libaom's last error on `ctx`, with its detail where it has one.
fn describe(api: &Api, ctx: *const CodecCtx) -> String {
    let text = |p: *const c_char| {
        // SAFETY: libaom's error strings are NUL-terminated and live as long as `ctx`.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    // SAFETY: `ctx` was given to init (which fills `err` even when it fails).
    let (error, detail) = unsafe { (text((api.error)(ctx)), text((api.error_detail)(ctx))) };
    match (error, detail) {
        (Some(e), Some(d)) => format!("{e}: {d}"),
        (Some(e), None) => e,
        (None, Some(d)) => d,
        (None, None) => "libaom failed".into(),
    }
}

/// Encodes `pic` as one AV1 keyframe (a temporal unit of OBUs) at `s`.
pub fn encode(pic: &Picture<'_>, s: Settings) -> Result<Vec<u8>, CodecError> {
    let api = api()?;
    let fail = |why: String| CodecError::Encode("AVIF", format!("libaom: {why}"));
    let (w, h) = (pic.width as usize, pic.height as usize);
    let (cw, ch) = (w.div_ceil(2), h.div_ceil(2));
    let fits = |p: &Plane<'_>, pw: usize, ph: usize| {
        pw > 0 && ph > 0 && p.stride >= pw && p.data.len() >= p.stride * (ph - 1) + pw
    };
    // Monochrome pictures still hand libaom chroma planes (it takes I420 only); neutral gray.
    let gray;
    let (u, v) = match pic.uv {
        Some(uv) => uv,
        None => {
            gray = vec![128u8; cw * ch];
            let p = Plane {
                data: &gray,
                stride: cw,
            };
            (p, p)
        }
    };
    if !fits(&pic.y, w, h) || !fits(&u, cw, ch) || !fits(&v, cw, ch) {
        return Err(fail("planes smaller than the picture".into()));
    }
    let stride = |p: &Plane<'_>| c_int::try_from(p.stride).map_err(|_| fail("too wide".into()));
    let enc = Encoder::new(api, pic.width, pic.height, pic.uv.is_none(), s).map_err(fail)?;
    if let Some(c) = pic.cicp {
        enc.control(SET_COLOR_PRIMARIES, c_int::from(c.primaries))
            .and_then(|()| enc.control(SET_TRANSFER_CHARACTERISTICS, c_int::from(c.transfer)))
            .and_then(|()| enc.control(SET_MATRIX_COEFFICIENTS, c_int::from(c.matrix)))
            .map_err(fail)?;
    }
    let cicp = pic.cicp.unwrap_or(Cicp {
        primaries: 2,
        transfer: 2,
        matrix: 2,
    });
    let img = Image {
        fmt: IMG_FMT_I420,
        cp: c_int::from(cicp.primaries),
        tc: c_int::from(cicp.transfer),
        mc: c_int::from(cicp.matrix),
        monochrome: c_int::from(pic.uv.is_none()),
        csp: 0,
        range: CR_FULL_RANGE,
        w: pic.width,
        h: pic.height,
        bit_depth: 8,
        d_w: pic.width,
        d_h: pic.height,
        r_w: 0,
        r_h: 0,
        x_chroma_shift: 1,
        y_chroma_shift: 1,
        // libaom reads the planes only (`const aom_image_t *`), the pointers are not written.
        planes: [
            pic.y.data.as_ptr().cast_mut(),
            u.data.as_ptr().cast_mut(),
            v.data.as_ptr().cast_mut(),
        ],
        stride: [stride(&pic.y)?, stride(&u)?, stride(&v)?],
        sz: 0,
        bps: 12,
        temporal_id: 0,
        spatial_id: 0,
        user_priv: std::ptr::null_mut(),
        img_data: std::ptr::null_mut(),
        img_data_owner: 0,
        self_allocd: 0,
        metadata: std::ptr::null_mut(),
        fb_priv: std::ptr::null_mut(),
    };
    let mut out = Vec::new();
    let ctx = enc.ctx.0;
    // SAFETY: `img` describes planes checked above to hold `d_w`×`d_h` luma and half-size
    // chroma at their strides, alive until this returns; libaom copies them during the encode
    // call. Packets are read before the next libaom call on `ctx`, within the `sz` bytes
    // libaom gives; a null image flushes. The encoder is used from this thread only.
    unsafe {
        for frame in [&img as *const Image, std::ptr::null()] {
            if (api.encode)(ctx, frame, 0, 1, 0) != 0 {
                return Err(fail(describe(api, ctx)));
            }
            let mut iter: *const c_void = std::ptr::null();
            loop {
                let pkt = (api.get_cx_data)(ctx, &mut iter);
                if pkt.is_null() {
                    break;
                }
                if (*pkt).kind == CX_FRAME_PKT && !(*pkt).buf.is_null() {
                    out.extend_from_slice(std::slice::from_raw_parts((*pkt).buf, (*pkt).sz));
                }
            }
        }
    }
    if out.is_empty() {
        return Err(fail("no frame was written".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quality_maps_as_libheif_does() {
        assert_eq!((cq_level(100), cq_level(80), cq_level(1)), (0, 13, 62));
        assert_eq!(cq_level(0), 62);
        let all: Vec<u8> = (1..=100).map(cq_level).collect();
        assert!(all.windows(2).all(|w| w[0] >= w[1]), "{all:?}");
        assert_eq!(
            (cpu_used(1), cpu_used(10), cpu_used(0), cpu_used(11)),
            (0, 9, 0, 9)
        );
    }

    #[test]
    fn lean_searches_at_the_two_fastest_speeds_only() {
        let lean_at: Vec<u8> = (1..=10).filter(|&s| lean(cpu_used(s))).collect();
        assert_eq!(lean_at, [9, 10]);
    }

    /// What the load's probe relies on for an older libaom lacking one of [`LEAN`]'s controls
    /// (or a value of one): libaom answers an error, so the probe's encoder fails, the library
    /// is refused and `avif_encoder = "auto"` comes to rav1e. A libaom 3.x taking an unknown
    /// control id silently would keep an encoder that ignores it (the lean searches lost,
    /// nothing broken).
    #[test]
    fn a_control_the_library_lacks_fails_the_probe() {
        let Ok(api) = api() else { return };
        let s = Settings {
            cq_level: 63,
            cpu_used: 8,
            lean: true,
        };
        let enc = Encoder::new(api, 16, 16, false, s).unwrap();
        assert!(enc.control(99_999, 0).is_err(), "an unknown control id");
        assert!(
            enc.control(DISABLE_TRELLIS_QUANT, 99).is_err(),
            "a value out of the control's range"
        );
        for &(id, value) in LEAN {
            assert!(enc.control(id, value).is_ok(), "{id} = {value}");
        }
    }

    #[test]
    fn a_missing_library_is_named() {
        static NONE: dynlib::Once<Api> = dynlib::Once::new();
        let e = load(&NONE, &["libaom-not-here.so.3"]).err().unwrap();
        assert!(matches!(e, CodecError::Unavailable { .. }), "{e:?}");
        let e = e.to_string();
        assert!(
            e.starts_with("AVIF output through libaom needs libaom (Debian: libaom3)")
                && e.contains("libaom-not-here.so.3"),
            "{e}"
        );
    }

    #[test]
    fn planes_too_small_are_refused_not_read() {
        if available().is_err() {
            return;
        }
        let y = vec![0u8; 10];
        let pic = Picture {
            width: 4,
            height: 4,
            y: Plane {
                data: &y,
                stride: 4,
            },
            uv: None,
            cicp: None,
        };
        let s = Settings {
            cq_level: 13,
            cpu_used: 9,
            lean: true,
        };
        let e = encode(&pic, s).unwrap_err();
        assert!(e.to_string().contains("smaller"), "{e}");
    }
}
