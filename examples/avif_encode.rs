//! The CPU time of one AVIF encode, as the bench's `imgproxy-fit-avif` cell asks for it:
//! bench/data/photo-1000x872.jpg decoded (shrink-on-load) and resized to 500×436, then encoded
//! `N` times at quality `Q` (80) and speed `SPEED` (the route's default) through `ENCODER` (`aom`, `rav1e`;
//! unset: libaom when it loads, as `avif_encoder = "auto"`); prints the thread's CPU time per
//! encode (getrusage) and the bytes, with the ratio to a JPEG encode of the same picture (the
//! unit of the pool's cost estimate), and writes the last output (and, with `PNG=path`, the
//! resized pixels losslessly, for other encoders) so bench/lib/quality.py can judge it.
//!
//!   cargo build --release --example avif_encode [--features asm]
//!   target/release/examples/avif_encode out.avif
//!
//! docs/design.md "AVIF encoding" has the figures; build it as bench/run does (with `asm`) to
//! compare with them.

use std::env;

use larder::config::AvifEncoder;
use larder::images::avif_encode;
use larder::images::codec::{self, Output};
use larder::images::sniff::{self, ImageFormat};
use larder::images::transform;

fn var(name: &str, default: u8) -> u8 {
    env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU time of the calling thread, in milliseconds.
fn thread_cpu_ms() -> f64 {
    // SAFETY: getrusage writes the struct it is given; zeroed is a valid rusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn main() {
    let out_path = env::args().nth(1).expect("usage: avif_encode OUT.avif");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/data/photo-1000x872.jpg");
    let src = std::fs::read(path).expect("bench/data photo");
    let probe = sniff::probe(&src).expect("a JPEG");
    let limits = codec::Limits {
        max_dim: 8192,
        max_frames: 1,
        max_animation_pixels: 50_000_000,
        ..codec::Limits::DEFAULT
    };
    let out = (500, 436);
    let (img, _) = codec::decode(&src, &probe, out, false, (0.0, 1.0), &limits).expect("decode");
    let (w, h) = (f64::from(img.width), f64::from(img.height));
    let img = transform::resize(img, (0.0, 0.0, w, h), out).expect("resize");
    if let Ok(png) = env::var("PNG") {
        let bytes = codec::encode(&img, ImageFormat::Png, 100).expect("PNG");
        std::fs::write(png, bytes).expect("write the PNG");
    }
    let encoder = match env::var("ENCODER").as_deref() {
        Ok("aom") => AvifEncoder::Aom,
        Ok("rav1e") => AvifEncoder::Rav1e,
        _ => AvifEncoder::Auto,
    };
    let speed = var("SPEED", avif_encode::default_speed(encoder));
    let (n, quality) = (var("N", 5).max(1), var("Q", 80));
    let o = Output {
        quality,
        avif_speed: speed,
        avif_encoder: encoder,
        bg: codec::WHITE,
        icc: None,
        progressive: false,
        exif: None,
    };
    let start = thread_cpu_ms();
    let mut avif = Vec::new();
    for _ in 0..n {
        avif = codec::encode_with(&img, ImageFormat::Avif, &o).expect("AVIF");
    }
    let ms = (thread_cpu_ms() - start) / f64::from(n);
    std::fs::write(&out_path, &avif).expect("write the AVIF");
    // JPEG's encode of the same picture: the unit of the pool's cost estimates
    // (`transform::estimate`), 10 times as many encodes to be measurable.
    let start = thread_cpu_ms();
    for _ in 0..10 * n {
        codec::encode(&img, ImageFormat::Jpeg, quality).expect("JPEG");
    }
    let jpeg = (thread_cpu_ms() - start) / f64::from(10 * n);
    println!(
        "{}, q{quality} speed {speed}: {ms:.1} ms CPU per encode, {} bytes; JPEG {jpeg:.2} ms: {:.0}x",
        avif_encode::describe(encoder),
        avif.len(),
        ms / jpeg
    );
}
