//! The image proxy's kept decoded originals (`decoded_cache`) over real sockets, results not
//! cached (every request transforms): a variant made from a kept raster is the image a fresh
//! decode makes (bytes equal), a changed original is decoded again, the bytes kept stay within
//! the setting, and the whole-frame decode a keeping route makes differs from the band decode
//! of a route keeping nothing only within a stated bound.

mod common;

use std::time::Duration;

use common::{encode_png, one_route, photo, Larder};
use larder::images::sniff;

const TOKEN: &str = "decoded-test-token";

/// larder with one image route (results not cached) reading originals from `root`, with
/// `keys` more; an admin listener, so that `/metrics` counts.
async fn start(root: &std::path::Path, keys: &str, clock: larder::clock::Clock) -> Larder {
    let tables = format!("[admin]\ntoken = \"{TOKEN}\"\nlisten = \"127.0.0.1:0\"\n");
    let keys = format!(
        "root = {:?}\ncache_results = false\n{keys}",
        root.display().to_string()
    );
    Larder::start_at(&one_route(&tables, "images", &keys), clock).await
}

async fn body(larder: &Larder, path: &str) -> Vec<u8> {
    let got = common::send(&common::client(), "GET", &larder.url(path), &[], b"").await;
    assert_eq!(got.status, 200, "{path}: {}", got.text());
    got.body.to_vec()
}

/// A sample's value in `/metrics` text (0 when absent).
fn sample(larder: &Larder, series: &str) -> u64 {
    let text = larder.metrics_text().expect("metrics are counted");
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
}

fn hits(l: &Larder) -> u64 {
    sample(l, "larder_image_decoded_cache_hits_total")
}

fn misses(l: &Larder) -> u64 {
    sample(l, "larder_image_decoded_cache_misses_total")
}

/// Three variants at one JPEG scale (1/4 of the 640×856 photo: a fill's crops differ, so do
/// their bands of rows), in three formats.
const VARIANTS: [&str; 3] = [
    "/insecure/rs:fill:100:100/q:80/plain/photo.jpg@jpg",
    "/insecure/rs:fill:100:100/q:80/plain/photo.jpg@webp",
    "/insecure/rs:fill:100:60/g:no/plain/photo.jpg@png",
];

/// Every variant, asked for first (decoded afresh) on one larder and after the others (from
/// the kept raster) on the others, is the same bytes.
#[tokio::test(flavor = "multi_thread")]
async fn a_kept_raster_makes_the_bytes_a_fresh_decode_makes() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("photo.jpg"), photo()).unwrap();
    let mut made: Vec<Vec<Vec<u8>>> = Vec::new();
    for first in 0..VARIANTS.len() {
        let larder = start(root.path(), "", larder::clock::Clock::adjustable()).await;
        let mut got = vec![Vec::new(); VARIANTS.len()];
        for k in 0..VARIANTS.len() {
            let i = (first + k) % VARIANTS.len();
            got[i] = body(&larder, VARIANTS[i]).await;
        }
        assert_eq!((misses(&larder), hits(&larder)), (1, 2), "one decode");
        assert!(sample(&larder, "larder_image_decoded_cache_bytes") >= 160 * 214 * 3);
        made.push(got);
    }
    for (i, v) in VARIANTS.iter().enumerate() {
        for m in &made[1..] {
            assert!(m[i] == made[0][i], "{v}: bytes differ between hit and miss");
        }
    }
    // Another scale is another decode.
    let larder = start(root.path(), "", larder::clock::Clock::adjustable()).await;
    body(&larder, VARIANTS[0]).await;
    body(&larder, "/insecure/rs:fit:300:0/plain/photo.jpg@jpg").await;
    assert_eq!((misses(&larder), hits(&larder)), (2, 0));
}

/// A solid `rgb` PNG, 64×64.
fn solid(rgb: [u8; 3]) -> Vec<u8> {
    let px: Vec<u8> = rgb.repeat(64 * 64);
    encode_png(64, 64, png::ColorType::Rgb, png::BitDepth::Eight, &px)
}

/// The first pixel of a PNG result.
fn first_pixel(png_bytes: &[u8]) -> [u8; 3] {
    let d = png::Decoder::new(std::io::Cursor::new(png_bytes));
    let mut r = d.read_info().unwrap();
    let mut buf = vec![0; r.output_buffer_size().unwrap()];
    r.next_frame(&mut buf).unwrap();
    [buf[0], buf[1], buf[2]]
}

/// A `root` file replaced (its id: path, size, modification time) is decoded again: the old
/// raster is never served for the new original.
#[tokio::test(flavor = "multi_thread")]
async fn a_changed_original_is_decoded_again() {
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("solid.png");
    std::fs::write(&file, solid([255, 0, 0])).unwrap();
    let clock = larder::clock::Clock::adjustable();
    let larder = start(root.path(), "", clock).await;
    let path = "/insecure/rs:fit:32:32/plain/solid.png@png";
    assert_eq!(first_pixel(&body(&larder, path).await), [255, 0, 0]);
    assert_eq!(
        first_pixel(&body(&larder, "/insecure/rs:fit:16:16/plain/solid.png@png").await),
        [255, 0, 0]
    );
    assert_eq!((misses(&larder), hits(&larder)), (1, 1));
    // The same size, a later modification time: only the id tells them apart.
    std::fs::write(&file, solid([0, 0, 255])).unwrap();
    let f = std::fs::File::options().write(true).open(&file).unwrap();
    f.set_modified(std::time::SystemTime::now() + Duration::from_secs(10))
        .unwrap();
    drop(f);
    // Past the second a root file's read is trusted for.
    larder.advance(Duration::from_secs(2));
    assert_eq!(first_pixel(&body(&larder, path).await), [0, 0, 255]);
    assert_eq!((misses(&larder), hits(&larder)), (2, 1));
}

/// Many originals through a small `decoded_cache`: the bytes kept never pass it.
#[tokio::test(flavor = "multi_thread")]
async fn the_kept_bytes_stay_within_the_setting() {
    let root = tempfile::tempdir().unwrap();
    let n = 30;
    for i in 0..n {
        std::fs::write(root.path().join(format!("p{i}.jpg")), photo()).unwrap();
    }
    let larder = start(
        root.path(),
        "decoded_cache = \"512KiB\"",
        larder::clock::Clock::adjustable(),
    )
    .await;
    let mut most = 0;
    for i in 0..n {
        // 1/8 scale: 80×107 pixels, about 26 KB a frame; 30 of them are 770 KB.
        body(
            &larder,
            &format!("/insecure/rs:fill:50:50/plain/p{i}.jpg@jpg"),
        )
        .await;
        let held = sample(&larder, "larder_image_decoded_cache_bytes");
        assert!(held <= 512 << 10, "{held} bytes kept after {i}");
        most = most.max(held);
    }
    assert_eq!(misses(&larder), n);
    assert!(most > 256 << 10, "kept {most} at most");
}

/// The decoded pixels of a PNG result.
fn pixels(png_bytes: &[u8]) -> (u32, u32, Vec<u8>) {
    let probe = sniff::probe(png_bytes).unwrap();
    let d = png::Decoder::new(std::io::Cursor::new(png_bytes));
    let mut r = d.read_info().unwrap();
    let mut buf = vec![0; r.output_buffer_size().unwrap()];
    r.next_frame(&mut buf).unwrap();
    (probe.width, probe.height, buf)
}

/// A keeping route decodes a fill's whole frame where `decoded_cache = 0` decodes the band of
/// rows the crop keeps (and two more each side): the results differ only in the rows where the
/// resize's filter reaches past the band, and there by a few levels.
#[tokio::test(flavor = "multi_thread")]
async fn the_whole_frame_differs_from_the_band_only_at_its_edges() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("photo.jpg"), photo()).unwrap();
    let clock = larder::clock::Clock::adjustable;
    let strict = start(root.path(), "decoded_cache = \"0\"", clock()).await;
    let kept = start(root.path(), "", clock()).await;
    let path = "/insecure/rs:fill:100:100/plain/photo.jpg@png";
    let (w, h, band) = pixels(&body(&strict, path).await);
    let (_, _, whole) = pixels(&body(&kept, path).await);
    assert_eq!((misses(&strict), misses(&kept)), (0, 1));
    let row = w as usize * 3;
    let mut worst_inner = 0u8;
    let mut worst_edge = 0u8;
    let mut differing_rows = 0;
    for y in 0..h as usize {
        let a = &band[y * row..(y + 1) * row];
        let b = &whole[y * row..(y + 1) * row];
        let d = a.iter().zip(b).map(|(x, y)| x.abs_diff(*y)).max().unwrap();
        if d > 0 {
            differing_rows += 1;
        }
        if y < 3 || y >= h as usize - 3 {
            worst_edge = worst_edge.max(d);
        } else {
            worst_inner = worst_inner.max(d);
        }
    }
    // Measured: 2 rows of 100 differ, by 3 levels at most; the rest are equal.
    assert_eq!(worst_inner, 0, "rows inside differ");
    assert!(worst_edge <= 8, "edge rows differ by {worst_edge}");
    assert!(differing_rows <= 4, "{differing_rows} rows differ");
}
