//! The memory a transform is admitted with (`transform::prepare`'s estimate, held from the
//! route's `decode_memory` budget) bounds the heap it really uses: the peak of live Rust heap
//! bytes during `transform::run`, counted by a wrapping global allocator, for every source
//! format, resizing up and down, rotation, orientation, grayscale, every output format and
//! animations (every frame).
//! (libjpeg-turbo's and libwebp's own buffers are C allocations and not counted; their pixel
//! buffers are counted where they are copied into Rust.)

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use common::{encode_png, exif_oriented, photo};
use http::HeaderMap;
use larder::images::animation::{self, Animation, Frame};
use larder::images::codec::{self, Limits, Raster};
use larder::images::params::{FormatChoice, Params, Resolved};
use larder::images::sniff::{self, ImageFormat};
use larder::images::transform;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

fn grew(by: isize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        grew(l.size() as isize);
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        grew(l.size() as isize);
        System.alloc_zeroed(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        grew(new as isize - l.size() as isize);
        System.realloc(p, l, new)
    }
}

#[global_allocator]
static A: Counting = Counting;

const LIMITS: Limits = Limits {
    max_upscale: 2.0,
    max_animation_pixels: 500_000_000,
    ..Limits::DEFAULT
};

fn gradient(w: u32, h: u32, channels: u8) -> Raster {
    let mut data = Vec::with_capacity((w * h) as usize * usize::from(channels));
    for y in 0..h {
        for x in 0..w {
            let px = [(x * 255 / w) as u8, (y * 255 / h) as u8, 90, 200];
            data.extend_from_slice(&px[..usize::from(channels)]);
        }
    }
    Raster {
        width: w,
        height: h,
        channels,
        data,
    }
}

/// A 16-bit RGBA PNG (the kind that took 570 MB at 7000×7000).
fn png16(w: u32, h: u32) -> Vec<u8> {
    let px: Vec<u8> = (0..w * h)
        .flat_map(|i| [(i % w) * 9, (i / w) * 7, i % 60_000, 60_000])
        .flat_map(|v| (v as u16).to_be_bytes())
        .collect();
    encode_png(w, h, png::ColorType::Rgba, png::BitDepth::Sixteen, &px)
}

/// A CMYK JPEG (decoded as CMYK, then converted to RGB).
fn cmyk_jpeg(w: usize, h: usize) -> Vec<u8> {
    let px: Vec<u8> = (0..w * h)
        .flat_map(|i| [(i % w) as u8, (i / w) as u8, (i % 7 * 30) as u8, 40])
        .collect();
    let mut c = turbojpeg::Compressor::new().unwrap();
    c.set_quality(90).unwrap();
    c.compress_to_owned(turbojpeg::Image {
        pixels: px.as_slice(),
        width: w,
        pitch: w * 4,
        height: h,
        format: turbojpeg::PixelFormat::CMYK,
    })
    .unwrap()
    .to_vec()
}

/// A gray + alpha PNG (decoded through a 2-byte buffer, then expanded to RGBA).
fn png_gray_alpha(w: u32, h: u32) -> Vec<u8> {
    let px: Vec<u8> = (0..w * h).flat_map(|i| [(i % 251) as u8, 128]).collect();
    encode_png(
        w,
        h,
        png::ColorType::GrayscaleAlpha,
        png::BitDepth::Eight,
        &px,
    )
}

/// Runs `query` on `src`: (estimated bytes, peak live bytes above what was live before).
fn measure(src: &[u8], query: &str) -> (u64, u64) {
    let probe = sniff::probe(src).unwrap();
    let p = Params::parse(query).unwrap();
    let r = Resolved::new(&p, FormatChoice::Keep, 75, &HeaderMap::new()).for_source(probe.format);
    let estimate = transform::prepare(&probe, &r, &LIMITS).unwrap().memory;
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let (out, _) = transform::run(src, &probe, &r, &LIMITS).unwrap();
    let peak = PEAK.load(Ordering::Relaxed) - before;
    drop(out);
    (estimate, peak.max(0) as u64)
}

#[test]
fn estimate_bounds_the_heap_a_transform_uses() {
    let photo = photo();
    let gif = codec::encode(&gradient(300, 200, 4), ImageFormat::Gif, 75).unwrap();
    let webp = codec::encode(&gradient(300, 200, 3), ImageFormat::Webp, 75).unwrap();
    let avif = codec::encode(&gradient(300, 200, 4), ImageFormat::Avif, 75).unwrap();
    // Five frames, every one decoded, transformed and held for the encoder.
    let anim = Animation {
        frames: (0..5)
            .map(|i| {
                let mut image = gradient(300, 200, 4);
                image
                    .data
                    .iter_mut()
                    .for_each(|v| *v = v.wrapping_add(i * 40));
                Frame {
                    image,
                    delay_ms: 100,
                }
            })
            .collect(),
        plays: None,
    };
    let anim_gif = animation::encode(&anim, ImageFormat::Gif, 75).unwrap();
    let anim_webp = animation::encode(&anim, ImageFormat::Webp, 75).unwrap();
    // Forty frames taken as a still: only the first is decoded (every frame was held).
    let long = Animation {
        frames: (0..40).map(|i| anim.frames[i % 5].clone()).collect(),
        plays: None,
    };
    let anim_webp_long = animation::encode(&long, ImageFormat::Webp, 75).unwrap();
    // libjxl, loaded at run time (tests/provision installs it).
    let jxl = codec::encode(&gradient(300, 200, 4), ImageFormat::Jxl, 75).unwrap();
    let jxl_large = codec::encode(&gradient(1200, 900, 3), ImageFormat::Jxl, 75).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("jpeg thumb", photo.clone(), "w=100&h=100"),
        ("jpeg gray", photo.clone(), "w=100&h=100&g=1"),
        ("jpeg full to png", photo.clone(), "q=90&f=png"),
        ("jpeg enlarged", photo.clone(), "w=1280&p=4&f=jpeg"),
        ("jpeg rotated 45", photo.clone(), "w=300&r=45&f=webp"),
        ("jpeg to avif", photo.clone(), "w=200&h=200&f=avif"),
        ("jpeg to gif", photo.clone(), "w=320&f=gif"),
        ("jpeg oriented", exif_oriented(&photo, 6), "q=80"),
        ("jpeg cmyk", cmyk_jpeg(1200, 900), "w=300&f=png"),
        ("png 16-bit", png16(1200, 900), "w=300&f=jpeg"),
        ("png 16-bit full", png16(600, 400), "f=webp"),
        ("png gray+alpha", png_gray_alpha(800, 600), "q=80&f=png"),
        ("gif", gif, "w=150&f=gif"),
        ("webp", webp, "w=100&f=jpeg"),
        ("avif", avif, "f=png"),
        ("gif animated", anim_gif.clone(), "w=150"),
        ("gif anim to webp", anim_gif, "w=200&f=webp"),
        ("webp animated", anim_webp.clone(), "w=100&h=100&p=1"),
        ("webp anim to gif", anim_webp, "f=gif"),
        ("webp anim to jpeg", anim_webp_long, "w=100&f=jpeg"),
        ("jxl", jxl.clone(), "f=png"),
        ("jxl to jxl", jxl, "w=100&f=jxl"),
        ("jxl large", jxl_large, "w=300&f=jpeg"),
    ];
    let mut over = Vec::new();
    for (name, src, q) in &cases {
        let (estimate, peak) = measure(src, q);
        println!(
            "{name:18} {q:22} estimate {:>10} peak {:>10} ({:.0}%)",
            estimate,
            peak,
            peak as f64 * 100.0 / estimate as f64
        );
        if peak > estimate {
            over.push(format!("{name} ({q}): peak {peak} > estimate {estimate}"));
        }
    }
    assert!(over.is_empty(), "{over:#?}");
}
