//! AVIF output: a [`Raster`] to an AVIF file. RGB becomes 8-bit full-range BT.601 YUV 4:2:0
//! (the `yuv` crate, SIMD), gray becomes monochrome 4:0:0, and alpha, where some pixel is not
//! opaque, a second monochrome item; each is encoded by libaom ([`super::aom`], loaded at run
//! time) or by rav1e (one tile, on the calling thread, at a quantizer read from the 1-100
//! quality, [`quantizer`], and speed settings from the configured preset, [`speed_settings`]),
//! as the route's `avif_encoder` says ([`resolve`]: `auto` is libaom where it loads), and
//! `avif-serialize` writes the container (with the EXIF kept, an Exif item; it writes no ICC
//! profile, so a kept profile never reaches AVIF: [`super::metadata`]; its av1C told the Main
//! profile the encoders write).
//!
//! Why not ravif, which did this before: it encodes 10-bit 4:4:4 only, three times the samples
//! of 4:2:0 and most of them spent on chroma, which the eye (and SSIM on luma) barely sees;
//! 8-bit 4:2:0 is what libheif and libavif write by default at this quality. Measured on the
//! 1000×872 photo fitted to 500 wide, q80 (docs/design.md "AVIF encoding").

use rav1e::prelude::*;

use super::aom::{self, Cicp, Picture, Plane};
use super::raster::{CodecError, Raster};
use crate::config::AvifEncoder;

fn failed(reason: impl std::fmt::Display) -> CodecError {
    CodecError::Encode("AVIF", reason.to_string())
}

/// rav1e's quantizer (0-255, AV1's qindex) for a quality of 1-100: linear from 255 at quality
/// 1 down to 0 at 100, with q80 at 92, where rav1e at preset 10 matches the SSIM of imgproxy's
/// q80 (libheif + libaom) on the bench photo, with 1.2× its bytes (docs/design.md "AVIF
/// encoding").
pub fn quantizer(quality: u8) -> u8 {
    let q = f32::from(quality.clamp(1, 100));
    let x = if q >= 80.0 {
        // 80 → 92, 100 → 0
        92.0 * (100.0 - q) / 20.0
    } else {
        // 1 → 255, 80 → 92
        92.0 + (255.0 - 92.0) * (80.0 - q) / 79.0
    };
    x.round() as u8
}

/// rav1e's speed settings for a preset of 1 (slowest, smallest) to 10 (fastest), tuned for one
/// still picture: no lookahead, reference or scene-change work (there is one frame), and the
/// loop restoration filter on at every preset (rav1e drops it from 8 up; on the bench photo it
/// is +0.014 SSIM for +0.3% bytes and ~35% more time). At 10, 16×16 blocks only (rav1e's 10
/// uses 32×32: 0.009 less SSIM at the same bytes) and the rate estimated in the transform
/// domain (30% faster, 2% larger).
pub fn speed_settings(speed: u8) -> SpeedSettings {
    let speed = speed.clamp(1, 10);
    let mut s = SpeedSettings::from_preset(speed);
    s.multiref = false;
    s.rdo_lookahead_frames = 1;
    s.scene_detection_mode = SceneDetectionSpeed::None;
    s.motion.include_near_mvs = false;
    s.lrf = true;
    if speed == 10 {
        s.partition.partition_range =
            PartitionRange::new(BlockSize::BLOCK_16X16, BlockSize::BLOCK_16X16);
        s.transform.tx_domain_rate = true;
    }
    s
}

/// Whether `choice` encodes through libaom: `auto` when it loads, `aom` always (refused with
/// 415 naming libaom when it does not load), `rav1e` never.
fn through_aom(choice: AvifEncoder) -> bool {
    match choice {
        AvifEncoder::Auto => aom::available().is_ok(),
        AvifEncoder::Aom => true,
        AvifEncoder::Rav1e => false,
    }
}

/// The encoder `choice` comes to in this process (`auto`: `aom` when libaom loads, else
/// `rav1e`), logged for the route at `prefix`: which encoder, or why AVIF output will be
/// refused (`aom` without libaom).
pub fn resolve(choice: AvifEncoder, prefix: &str) -> AvifEncoder {
    let encoder = describe(choice);
    let resolved = match choice {
        AvifEncoder::Auto if through_aom(choice) => AvifEncoder::Aom,
        AvifEncoder::Auto => AvifEncoder::Rav1e,
        other => other,
    };
    if resolved == AvifEncoder::Aom && aom::available().is_err() {
        tracing::error!(
            prefix,
            encoder,
            "avif_encoder = \"aom\" without libaom: AVIF output gets 415"
        );
    } else {
        tracing::info!(prefix, encoder, "AVIF output");
    }
    resolved
}

/// The speed when `avif_speed` is unset: 9 with libaom (cpu-used 8, the fastest that meets
/// imgproxy's SSIM and bytes on the bench photo; 9 writes 1.19× the bytes), 10 with rav1e (its
/// fastest preset; docs/design.md "AVIF encoding").
pub fn default_speed(encoder: AvifEncoder) -> u8 {
    if through_aom(encoder) {
        9
    } else {
        10
    }
}

/// The CPU of an AVIF encode per pixel through `choice` (resolved as [`encode`] does) at
/// `speed`, in JPEG encodes of the same picture: the pool orders transforms by such costs
/// ([`super::transform::estimate`]). Measured on the bench's 500×436 picture at q80
/// (`examples/avif_encode.rs`, which prints the ratio; docs/design.md "AVIF encoding"):
/// [`AOM_COST`] and [`RAV1E_COST`] by speed, rav1e's for its assembly (the `asm` feature),
/// without which it is about 3.4 times slower.
pub fn cost_per_pixel(choice: AvifEncoder, speed: u8) -> u64 {
    let i = usize::from(speed.clamp(1, 10)) - 1;
    if through_aom(choice) {
        AOM_COST[i]
    } else if cfg!(feature = "asm") {
        RAV1E_COST[i]
    } else {
        RAV1E_COST[i] * 34 / 10
    }
}

/// libaom's cost (JPEG encodes a pixel) at speed 1 to 10 (cpu-used 0 to 9): 7.7 s, 2.5 s,
/// 2.0 s, 1.26 s, 647 ms, 521 ms, 106 ms, 57 ms, 31 ms (lean, [`aom::LEAN`]; 41 ms without)
/// and 15 ms for the 500×436 picture, whose JPEG encode is ~1.1 ms.
const AOM_COST: [u64; 10] = [7000, 2300, 1900, 1100, 590, 470, 96, 52, 28, 13];

/// rav1e's (with its assembly) at speed 1 to 10 (its presets, with [`speed_settings`]):
/// 9.6 s, 5.5 s, 3.4-3.5 s from 3 to 5, 633 ms, 359 ms at 7 and 8, 236 ms and 128 ms.
const RAV1E_COST: [u64; 10] = [8700, 5000, 3200, 3200, 3100, 580, 330, 330, 210, 120];

/// Which encoder `choice` uses in this process: "libaom 3.6.0", or "rav1e" with why libaom
/// is not used.
pub fn describe(choice: AvifEncoder) -> String {
    match (choice, aom::available()) {
        (AvifEncoder::Rav1e, _) => "rav1e (avif_encoder = \"rav1e\")".into(),
        (_, Ok(())) => format!("libaom {}", aom::version().unwrap_or("?")),
        (AvifEncoder::Auto, Err(e)) => format!("rav1e ({e})"),
        (AvifEncoder::Aom, Err(e)) => format!("none: AVIF output is refused ({e})"),
    }
}

/// Encodes `img` at a quality of 1-100 and speed 1-10 (rav1e's preset, or libaom's cpu-used
/// plus one), through the encoder `choice` names; `exif` (a TIFF block) goes into the
/// container as its Exif item.
pub fn encode(
    img: &Raster,
    quality: u8,
    speed: u8,
    exif: Option<&[u8]>,
    choice: AvifEncoder,
) -> Result<Vec<u8>, CodecError> {
    let (w, h) = (img.width, img.height);
    let av1 = |pic: &Picture<'_>| {
        if through_aom(choice) {
            let cpu_used = aom::cpu_used(speed);
            let s = aom::Settings {
                cq_level: aom::cq_level(quality),
                cpu_used,
                lean: aom::lean(cpu_used),
            };
            aom::encode(pic, s)
        } else {
            av1(pic, quantizer(quality), speed_settings(speed))
        }
    };
    fn plane(data: &[u8], stride: u32) -> Plane<'_> {
        Plane {
            data,
            stride: stride as usize,
        }
    }
    let gray = img.channels == 1 || (img.channels == 4 && is_gray_rgba(&img.data));
    let color = if gray {
        let luma: Vec<u8> = match img.channels {
            1 => img.data.clone(),
            _ => img.data.chunks_exact(4).map(|p| p[0]).collect(),
        };
        av1(&Picture {
            width: w,
            height: h,
            y: plane(&luma, w),
            uv: None,
            cicp: Some(SRGB_CICP),
        })?
    } else {
        let rgb;
        let (pixels, stride, rgba) = match img.channels {
            3 => (&img.data, w * 3, false),
            4 => (&img.data, w * 4, true),
            _ => {
                rgb = img.to_rgb();
                (&rgb, w * 3, false)
            }
        };
        let mut yuv = yuv::YuvPlanarImageMut::<u8>::alloc(w, h, yuv::YuvChromaSubsampling::Yuv420);
        let convert = if rgba {
            yuv::rgba_to_yuv420
        } else {
            yuv::rgb_to_yuv420
        };
        convert(
            &mut yuv,
            pixels,
            stride,
            yuv::YuvRange::Full,
            yuv::YuvStandardMatrix::Bt601,
            yuv::YuvConversionMode::Balanced,
        )
        .map_err(failed)?;
        av1(&Picture {
            width: w,
            height: h,
            y: plane(yuv.y_plane.borrow(), yuv.y_stride),
            uv: Some((
                plane(yuv.u_plane.borrow(), yuv.u_stride),
                plane(yuv.v_plane.borrow(), yuv.v_stride),
            )),
            cicp: Some(SRGB_CICP),
        })?
    };
    let alpha = if img.channels == 4 && img.data.chunks_exact(4).any(|p| p[3] != 255) {
        let a: Vec<u8> = img.data.chunks_exact(4).map(|p| p[3]).collect();
        Some(av1(&Picture {
            width: w,
            height: h,
            y: plane(&a, w),
            uv: None,
            cicp: None,
        })?)
    } else {
        None
    };
    let mut a = avif_serialize::Aviffy::new();
    // 8-bit 4:2:0 and 4:0:0 are AV1's Main profile, what both encoders write in the sequence
    // header; the av1C must say the same (avif-serialize says High, 1, unless told).
    a.set_seq_profile(0)
        .set_matrix_coefficients(avif_serialize::constants::MatrixCoefficients::Bt601)
        .set_full_color_range(true)
        .set_chroma_subsampling((true, true))
        .set_monochrome(gray);
    if let Some(exif) = exif {
        a.set_exif(exif.to_vec());
    }
    Ok(a.to_vec(&color, alpha.as_deref(), w, h, 8))
}

/// Whether every pixel of RGBA data has R = G = B (a gray image with alpha).
fn is_gray_rgba(data: &[u8]) -> bool {
    data.chunks_exact(4).all(|p| p[0] == p[1] && p[1] == p[2])
}

/// sRGB: BT.709 primaries, the sRGB curve, the BT.601 matrix the samples were made with.
const SRGB: ColorDescription = ColorDescription {
    color_primaries: ColorPrimaries::BT709,
    transfer_characteristics: TransferCharacteristics::SRGB,
    matrix_coefficients: MatrixCoefficients::BT601,
};

/// [`SRGB`] as H.273 code points, for libaom.
const SRGB_CICP: Cicp = Cicp {
    primaries: 1,
    transfer: 13,
    matrix: 6,
};

/// One AV1 still picture through rav1e (one tile, on the calling thread). The only colour
/// description written is [`SRGB`]; an alpha plane has none.
fn av1(
    pic: &Picture<'_>,
    quantizer: u8,
    speed_settings: SpeedSettings,
) -> Result<Vec<u8>, CodecError> {
    let enc = EncoderConfig {
        width: pic.width as usize,
        height: pic.height as usize,
        bit_depth: 8,
        chroma_sampling: match pic.uv {
            Some(_) => ChromaSampling::Cs420,
            None => ChromaSampling::Cs400,
        },
        chroma_sample_position: ChromaSamplePosition::Unknown,
        pixel_range: PixelRange::Full,
        color_description: pic.cicp.map(|_| SRGB),
        still_picture: true,
        quantizer: usize::from(quantizer),
        min_quantizer: quantizer,
        // One tile, one thread: the pool runs one transform per worker.
        tiles: 1,
        speed_settings,
        ..EncoderConfig::default()
    };
    let mut ctx: Context<u8> = Config::new()
        .with_encoder_config(enc)
        .with_threads(1)
        .new_context()
        .map_err(failed)?;
    let mut frame = ctx.new_frame();
    frame.planes[0].copy_from_raw_u8(pic.y.data, pic.y.stride, 1);
    if let Some((u, v)) = pic.uv {
        frame.planes[1].copy_from_raw_u8(u.data, u.stride, 1);
        frame.planes[2].copy_from_raw_u8(v.data, v.stride, 1);
    }
    ctx.send_frame(frame).map_err(failed)?;
    ctx.flush();
    let mut out = Vec::new();
    loop {
        match ctx.receive_packet() {
            Ok(mut packet) => out.append(&mut packet.data),
            Err(EncoderStatus::Encoded) => continue,
            Err(EncoderStatus::LimitReached) => break,
            Err(e) => return Err(failed(e)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::{avif, sniff};

    /// Pixels of `channels` samples, a deterministic noise (no encoder finds it easy).
    fn noise(w: u32, h: u32, channels: u8, seed: u32) -> Raster {
        let mut x = seed.wrapping_mul(2_654_435_761) | 1;
        let data = (0..w * h * u32::from(channels))
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 24) as u8
            })
            .collect();
        Raster {
            width: w,
            height: h,
            channels,
            data,
        }
    }

    fn decoded(b: &[u8]) -> Raster {
        let p = sniff::probe(b).expect("an AVIF header");
        let limits = crate::images::raster::Limits {
            max_dim: 8192,
            max_frames: 1,
            max_avif_pixels: 50_000_000,
            max_animation_pixels: 50_000_000,
            ..crate::images::raster::Limits::DEFAULT
        };
        avif::decode(b, &p, &limits).expect("larder decodes its own AVIF")
    }

    #[test]
    fn libaom_writes_odd_sizes_gray_and_alpha_that_decode() {
        assert!(
            aom::available().is_ok(),
            "libaom: run tests/provision (Debian's libaom3)"
        );
        for (w, h) in [(1, 1), (1, 2), (2, 1), (3, 5), (17, 9), (65, 33)] {
            for channels in [1, 3, 4] {
                let mut img = noise(w, h, channels, w * 31 + h);
                if channels == 4 {
                    // Half the pixels transparent, half opaque.
                    for (i, p) in img.data.chunks_exact_mut(4).enumerate() {
                        p[3] = if i % 2 == 0 { 0 } else { 255 };
                    }
                }
                let b = encode(&img, 80, 10, None, AvifEncoder::Aom).unwrap();
                let r = decoded(&b);
                assert_eq!((r.width, r.height), (w, h), "{channels} channels");
                if channels == 4 {
                    assert_eq!(r.channels, 4, "{w}x{h}: alpha kept");
                    let alpha: Vec<u8> = r.data.chunks_exact(4).map(|p| p[3]).collect();
                    assert!(alpha[0] < 128, "{w}x{h}: {alpha:?}");
                    if w * h > 1 {
                        assert!(alpha.iter().any(|&a| a > 128), "{w}x{h}: {alpha:?}");
                    }
                }
            }
        }
    }

    /// A gray picture with what a photo has (gradients, edges, fine texture), deterministic.
    fn textured(w: u32, h: u32) -> Vec<u8> {
        let grain = noise(w, h, 1, 7).data;
        (0..h)
            .flat_map(|y| (0..w).map(move |x| (x, y)))
            .zip(grain)
            .map(|((x, y), g)| {
                let (fx, fy) = (f64::from(x), f64::from(y));
                let v = 60.0
                    + fx * 0.8
                    + 40.0 * (fx / 5.0 + fy / 9.0).sin()
                    + if (x / 24 + y / 16) % 2 == 0 {
                        30.0
                    } else {
                        0.0
                    }
                    + f64::from(g) / 16.0;
                v.clamp(0.0, 255.0) as u8
            })
            .collect()
    }

    #[test]
    fn libaom_lean_searches_change_the_bitstream_not_the_picture() {
        assert!(aom::available().is_ok(), "libaom: run tests/provision");
        let (w, h) = (128, 96);
        let y = textured(w, h);
        let pic = Picture {
            width: w,
            height: h,
            y: Plane {
                data: &y,
                stride: w as usize,
            },
            uv: None,
            cicp: Some(SRGB_CICP),
        };
        // The default speed's cpu-used, with and without LEAN's controls (which the encoder
        // refuses, failing the encode, if one is unknown to it).
        let cpu_used = aom::cpu_used(default_speed(AvifEncoder::Aom));
        let at = |lean| aom::Settings {
            cq_level: aom::cq_level(80),
            cpu_used,
            lean,
        };
        assert!(aom::lean(cpu_used), "the default speed runs LEAN");
        let (plain, lean) = (
            aom::encode(&pic, at(false)).unwrap(),
            aom::encode(&pic, at(true)).unwrap(),
        );
        assert_ne!(plain, lean, "LEAN's controls changed nothing");
        assert!(
            lean.len() * 10 <= plain.len() * 11,
            "{} {}",
            lean.len(),
            plain.len()
        );
        for obu in [plain, lean] {
            let mut a = avif_serialize::Aviffy::new();
            a.set_full_color_range(true)
                .set_chroma_subsampling((true, true))
                .set_monochrome(true);
            let d = decoded(&a.to_vec(&obu, None, w, h, 8));
            assert_eq!((d.width, d.height), (w, h));
            let luma = d.data.iter().step_by(d.channels.into());
            let se: f64 = luma
                .zip(&y)
                .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
                .sum();
            let psnr = 10.0 * (255.0f64.powi(2) * f64::from(w * h) / se).log10();
            assert!(psnr > 35.0, "PSNR {psnr:.1} dB");
        }
    }

    #[test]
    fn both_encoders_keep_a_flat_colour_and_differ() {
        let img = Raster {
            width: 48,
            height: 32,
            channels: 3,
            data: [40u8, 120, 200].repeat(48 * 32),
        };
        let a = encode(&img, 80, 10, None, AvifEncoder::Aom).unwrap();
        let r = encode(&img, 80, 10, None, AvifEncoder::Rav1e).unwrap();
        assert_ne!(a, r, "avif_encoder chose the same encoder");
        for b in [a, r] {
            let d = decoded(&b);
            assert_eq!((d.width, d.height), (48, 32));
            for (got, want) in d
                .data
                .chunks_exact(d.channels.into())
                .zip([[40, 120, 200]].iter().cycle())
            {
                assert!(
                    got.iter().zip(want).all(|(g, w)| g.abs_diff(*w) <= 3),
                    "{got:?}"
                );
            }
        }
        assert!(describe(AvifEncoder::Auto).starts_with("libaom 3."));
        assert!(describe(AvifEncoder::Rav1e).starts_with("rav1e"));
    }

    /// The fields of each av1C box in `file` (colour item first, then alpha): seq_profile,
    /// seq_level_idx_0, and the byte of tier, bit depth, monochrome, subsampling flags.
    fn av1c_boxes(file: &[u8]) -> Vec<(u8, u8, u8)> {
        file.windows(4)
            .enumerate()
            .filter(|(_, w)| *w == b"av1C")
            .map(|(i, _)| {
                let c = &file[i + 4..i + 8];
                assert_eq!(c[0], 0x81, "av1C marker and version");
                (c[1] >> 5, c[1] & 31, c[2] & !3)
            })
            .collect()
    }

    /// The same fields from the sequence header OBU of an item's AV1 data (a reduced still
    /// picture header, or a full one without timing info: what both encoders write).
    fn sequence_header(av1: &[u8]) -> (u8, u8, u8) {
        let mut at = 0;
        loop {
            let header = av1[at];
            let kind = (header >> 3) & 15;
            at += 1 + usize::from(header & 4 != 0);
            assert!(header & 2 != 0, "OBUs carry their size");
            let (mut size, mut shift) = (0usize, 0);
            loop {
                let b = av1[at];
                at += 1;
                size |= usize::from(b & 127) << shift;
                shift += 7;
                if b & 128 == 0 {
                    break;
                }
            }
            if kind == 1 {
                break;
            }
            at += size;
        }
        let p = &av1[at..];
        let profile = p[0] >> 5;
        let reduced = p[0] & 8 != 0;
        let (level, tier) = if reduced {
            (((p[0] & 7) << 2) | (p[1] >> 6), 0)
        } else {
            // timing_info_present_flag (0 here), initial_display_delay_present_flag,
            // operating_points_cnt_minus_1 (0 here), operating_point_idc (12 bits), level.
            assert_eq!(p[0] & 4, 0, "no timing info");
            let bits = u32::from_be_bytes([p[0], p[1], p[2], p[3]]);
            let level = ((bits >> (32 - 5 - 2 - 5 - 12 - 5)) & 31) as u8;
            let tier = if level > 7 {
                ((bits >> (32 - 5 - 2 - 5 - 12 - 5 - 1)) & 1) as u8
            } else {
                0
            };
            (level, tier)
        };
        let meta = avif_parse::AV1Metadata::parse_av1_bitstream(av1).expect("a sequence header");
        assert_eq!(meta.seq_profile, profile);
        let flags = tier << 7
            | u8::from(meta.bit_depth >= 10) << 6
            | u8::from(meta.bit_depth >= 12) << 5
            | u8::from(meta.monochrome) << 4
            // AV1 sets both subsampling flags for monochrome (avif-parse reports neither).
            | u8::from(meta.monochrome || meta.chroma_subsampling.0) << 3
            | u8::from(meta.monochrome || meta.chroma_subsampling.1) << 2;
        (profile, level, flags)
    }

    /// Each item's av1C says what its sequence header says (AV1-ISOBMFF requires it; a
    /// decoder may configure itself from either): 8-bit 4:2:0 and monochrome are the Main
    /// profile (0), from both encoders, for colour, gray and alpha items (avif-serialize
    /// wrote High, 1, for the colour item).
    #[test]
    fn av1c_matches_the_sequence_header() {
        for choice in [AvifEncoder::Aom, AvifEncoder::Rav1e] {
            for channels in [1, 3, 4] {
                let mut img = noise(40, 24, channels, 7);
                if channels == 4 {
                    img.data.chunks_exact_mut(4).for_each(|p| p[3] = p[0] / 2);
                }
                let b = encode(&img, 80, 10, None, choice).unwrap();
                let file = avif_parse::read_avif(&mut &b[..]).expect("an AVIF");
                let items: Vec<&[u8]> = std::iter::once(&file.primary_item[..])
                    .chain(file.alpha_item.as_deref())
                    .collect();
                let boxes = av1c_boxes(&b);
                assert_eq!(boxes.len(), items.len(), "{choice:?} {channels}");
                for (i, (item, av1c)) in items.iter().zip(&boxes).enumerate() {
                    let seq = sequence_header(item);
                    let at = format!("{choice:?} {channels} channels, item {i}");
                    assert_eq!(seq.0, 0, "{at}: Main");
                    assert_eq!((av1c.0, av1c.2), (seq.0, seq.2), "{at}");
                    // The level: avif-serialize always writes 31 (unconstrained), as rav1e
                    // does; libaom writes its picture size's (2.0 here), which the av1C
                    // cannot say through avif-serialize: not checked (left open).
                    if choice == AvifEncoder::Rav1e {
                        assert_eq!(av1c.1, seq.1, "{at}");
                    }
                }
            }
        }
    }

    #[test]
    fn quality_maps_onto_the_whole_quantizer_range_in_order() {
        assert_eq!((quantizer(1), quantizer(80), quantizer(100)), (255, 92, 0));
        assert_eq!(quantizer(0), 255);
        let all: Vec<u8> = (1..=100).map(quantizer).collect();
        assert!(all.windows(2).all(|w| w[0] > w[1]), "{all:?}");
    }

    #[test]
    fn a_still_picture_needs_no_lookahead_and_keeps_loop_restoration() {
        for speed in [0, 1, 8, 10, 11] {
            let s = speed_settings(speed);
            assert_eq!(s.rdo_lookahead_frames, 1);
            assert!(s.lrf && !s.multiref, "speed {speed}");
        }
        // (PartitionRange has no PartialEq.)
        let sixteen = PartitionRange::new(BlockSize::BLOCK_16X16, BlockSize::BLOCK_16X16);
        assert_eq!(
            format!("{:?}", speed_settings(10).partition.partition_range),
            format!("{sixteen:?}")
        );
    }
}
