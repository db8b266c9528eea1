//! The smart crop's analysis (`larder::images::smart::attention`) on a 12-megapixel source and
//! a small one: its cost is bounded by the analysed copy, not the source's size.
//!
//! `cargo bench --bench smartcrop`

use criterion::{black_box, criterion_group, criterion_main, Criterion};

use larder::images::raster::Raster;
use larder::images::smart;

/// A noisy gradient (an xorshift's bits over a ramp): edges and colour everywhere.
fn source(w: u32, h: u32) -> Raster {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut data = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let n = (state & 0x3F) as u32;
            data.extend_from_slice(&[
                ((x * 255 / w + n) & 0xFF) as u8,
                ((y * 255 / h + n) & 0xFF) as u8,
                (n * 3) as u8,
            ]);
        }
    }
    Raster {
        width: w,
        height: h,
        channels: 3,
        data,
    }
}

fn attention(c: &mut Criterion) {
    let big = source(4000, 3000);
    c.bench_function("attention 4000x3000 to 1200x1200", |b| {
        b.iter(|| smart::attention(black_box(&big), 1200, 1200))
    });
    let small = source(640, 480);
    c.bench_function("attention 640x480 to 300x300", |b| {
        b.iter(|| smart::attention(black_box(&small), 300, 300))
    });
}

criterion_group!(benches, attention);
criterion_main!(benches);
