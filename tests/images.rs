//! The image server over real sockets: upload (raw, multipart, dedup, 415, 413), every `p` mode,
//! rotation, grayscale, each output format, `f=auto`, the normalized cache key, coalescing,
//! pixel bombs, presets, parameter errors, DELETE purging cached variants, AVIF sources.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{encode_png, exif_oriented, one_route, photo, Got, Larder};
use http::HeaderMap;
use larder::images::sniff;

const TOKEN: &str = "test-token";

/// larder with one image route storing under `dir`.
struct Images {
    addr: SocketAddr,
    dir: tempfile::TempDir,
    larder: Larder,
}

async fn start(extra: &str) -> Images {
    let dir = tempfile::tempdir().unwrap();
    let keys = format!(
        "dir = \"{}\"\n{extra}\n[listener.route.images.presets]\nthumb = \"w=100&h=100&p=1\"",
        dir.path().display()
    );
    let tables = format!("[admin]\ntoken = \"{TOKEN}\"");
    let larder = Larder::start(&one_route(&tables, "images", &keys)).await;
    Images {
        addr: larder.addr,
        dir,
        larder,
    }
}

/// A request to the image server at `addr`, on a new connection.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl AsRef<[u8]>,
) -> Got {
    let url = format!("http://{addr}{path}");
    common::send(&common::client(), method, &url, headers, body).await
}

async fn get(addr: SocketAddr, path: &str) -> Got {
    send(addr, "GET", path, &[], b"").await
}

async fn upload(addr: SocketAddr, data: impl AsRef<[u8]>, ctype: &str) -> Got {
    send(addr, "POST", "/upload", &[("content-type", ctype)], data).await
}

/// An RGB PNG where each pixel is (x, y, 128): crops can be checked by their corner.
fn coords_png(w: u32, h: u32) -> Vec<u8> {
    let mut px = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            px.extend_from_slice(&[x as u8, y as u8, 128]);
        }
    }
    encode_png(w, h, png::ColorType::Rgb, png::BitDepth::Eight, &px)
}

/// (width, height, color type, pixels) of a PNG.
fn decode_png(b: &[u8]) -> (u32, u32, png::ColorType, Vec<u8>) {
    let mut r = png::Decoder::new(std::io::Cursor::new(b))
        .read_info()
        .unwrap();
    let mut buf = vec![0; r.output_buffer_size().unwrap()];
    let info = r.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    (info.width, info.height, info.color_type, buf)
}

fn dims(b: &[u8]) -> (u32, u32) {
    let p = sniff::probe(b).unwrap();
    (p.width, p.height)
}

/// An AVIF decoded by larder's own decoder.
fn decode_avif(b: &[u8]) -> larder::images::codec::Raster {
    let p = sniff::probe(b).unwrap();
    let limits = larder::images::codec::Limits {
        max_frames: 1,
        max_animation_pixels: 500_000_000,
        ..larder::images::codec::Limits::DEFAULT
    };
    larder::images::codec::decode(b, &p, (p.width, p.height), false, (0.0, 1.0), &limits)
        .unwrap()
        .0
}

async fn upload_photo(l: &Images) -> String {
    let r = upload(l.addr, photo(), "image/jpeg").await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.field("md5")
}

fn stored_files(dir: &std::path::Path) -> usize {
    fn walk(p: &std::path::Path) -> usize {
        std::fs::read_dir(p)
            .map(|rd| {
                rd.flatten()
                    .map(|e| {
                        if e.path().is_dir() {
                            walk(&e.path())
                        } else {
                            1
                        }
                    })
                    .sum()
            })
            .unwrap_or(0)
    }
    walk(dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn upload_raw_and_multipart_dedup() {
    let l = start("").await;
    let data = photo();
    let r = upload(l.addr, data.clone(), "image/jpeg").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let md5 = r.field("md5");
    assert_eq!(md5, larder::images::storage::Md5Hex::of(&data).as_str());
    assert_eq!(r.field("width"), "640");
    assert_eq!(r.field("height"), "856");
    assert_eq!(r.field("format"), "jpeg");
    assert_eq!(r.field("size"), data.len().to_string());

    // zimg's bare type, same bytes: same MD5, still one file.
    let r = upload(l.addr, data.clone(), "jpeg").await;
    assert_eq!(r.field("md5"), md5);

    // Multipart with two files: an array, one of them the same image.
    let png = coords_png(20, 10);
    let mut form = Vec::new();
    for (name, bytes, ct) in [("a.jpg", &data, "image/jpeg"), ("b.png", &png, "image/png")] {
        form.extend_from_slice(
            format!("--XyZ\r\nContent-Disposition: form-data; name=\"userfile\"; filename=\"{name}\"\r\nContent-Type: {ct}\r\n\r\n").as_bytes(),
        );
        form.extend_from_slice(bytes);
        form.extend_from_slice(b"\r\n");
    }
    form.extend_from_slice(b"--XyZ--\r\n");
    let r = upload(l.addr, form, "multipart/form-data; boundary=XyZ").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let t = r.text();
    assert!(t.starts_with('[') && t.contains(&md5), "{t}");
    assert!(
        t.contains("\"width\":20,\"height\":10,\"format\":\"png\""),
        "{t}"
    );
    assert_eq!(stored_files(l.dir.path()), 2);

    // info
    let r = get(l.addr, &format!("/info?md5={md5}")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.field("width"), "640");
    // The original, untouched.
    let r = get(l.addr, &format!("/{md5}")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("image/jpeg"));
    assert_eq!(&r.body[..], &data[..]);
    l.larder.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn non_image_is_415_and_not_stored() {
    let l = start("").await;
    let r = upload(l.addr, &b"<html>not an image</html>"[..], "image/jpeg").await;
    assert_eq!(r.status, 415, "{}", r.text());
    let r = upload(l.addr, &b"\xFF\xD8\xFF\xE0 truncated"[..], "image/jpeg").await;
    assert_eq!(r.status, 415, "{}", r.text());
    assert_eq!(stored_files(l.dir.path()), 0);
    l.larder.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn oversize_upload_is_413() {
    let l = start("max_upload_size = \"16KiB\"").await;
    let r = upload(l.addr, photo(), "image/jpeg").await;
    assert_eq!(r.status, 413, "{}", r.text());
    // Without a Content-Length (chunked): cut off while reading, before the body ends.
    let mut c = common::Raw::connect(l.addr).await;
    c.write(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await;
    for chunk in photo().chunks(4096).take(5) {
        let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
        framed.extend_from_slice(chunk);
        framed.extend_from_slice(b"\r\n");
        if c.try_write(&framed).await.is_err() {
            break;
        }
    }
    // The body never ended; the answer came anyway.
    let got = c
        .read_some(Duration::from_secs(5))
        .await
        .expect("an answer");
    let got = got.unwrap();
    let head = String::from_utf8_lossy(&got);
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert_eq!(stored_files(l.dir.path()), 0);
    l.larder.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_mode_has_the_expected_size() {
    let l = start("").await;
    let md5 = upload_photo(&l).await;
    for (q, want) in [
        ("w=100&h=50&p=0", (100, 50)),
        ("w=100&h=100&p=1", (100, 100)),
        ("w=100&h=100", (100, 100)),
        ("w=100", (100, 134)),
        ("h=107", (80, 107)),
        ("w=100&h=50&p=2&x=10&y=20", (100, 50)),
        ("w=700&h=50&p=2&x=600&y=0", (40, 50)),
        ("w=50&p=3", (320, 428)),
        ("w=25&h=50&p=3", (160, 428)),
        ("w=100&h=100&p=4", (75, 100)),
        // Never enlarged (max_upscale 1.0): the source's size.
        ("w=1000&h=1000&p=4", (640, 856)),
    ] {
        let r = get(l.addr, &format!("/{md5}?{q}")).await;
        assert_eq!(r.status, 200, "{q}: {}", r.text());
        assert_eq!(r.header("content-type"), Some("image/jpeg"), "{q}");
        assert_eq!(dims(&r.body), want, "{q}");
    }
    l.larder.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn crop_takes_the_asked_region() {
    let l = start("").await;
    let r = upload(l.addr, coords_png(200, 100), "image/png").await;
    let md5 = r.field("md5");
    let r = get(l.addr, &format!("/{md5}?p=2&x=30&y=40&w=20&h=10&f=png")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let (w, h, _, px) = decode_png(&r.body);
    assert_eq!((w, h), (20, 10));
    assert_eq!(&px[0..3], &[30, 40, 128]);
    let last = px.len() - 3;
    assert_eq!(&px[last..], &[49, 49, 128]);
    // Centered when no offsets are given.
    let r = get(l.addr, &format!("/{md5}?p=2&w=20&h=10&f=png")).await;
    let (_, _, _, px) = decode_png(&r.body);
    assert_eq!(&px[0..3], &[90, 45, 128]);
    l.larder.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rotation() {
    let l = start("").await;
    let r = upload(l.addr, coords_png(40, 20), "image/png").await;
    let md5 = r.field("md5");
    for (deg, want) in [
        ("90", (20, 40)),
        ("180", (40, 20)),
        ("270", (20, 40)),
        ("45", (42, 42)),
        ("-90", (20, 40)),
    ] {
        let r = get(l.addr, &format!("/{md5}?r={deg}&f=png")).await;
        assert_eq!(r.status, 200, "{deg}: {}", r.text());
        let (w, h, _, px) = decode_png(&r.body);
        assert_eq!((w, h), want, "r={deg}");
        if deg == "90" {
            // Clockwise: the source's bottom-left corner (0, 19) is now top-left.
            assert_eq!(&px[0..2], &[0, 19]);
        }
        if deg == "180" {
            assert_eq!(&px[0..2], &[39, 19]);
        }
    }
    l.larder.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn grayscale_is_gray() {
    let l = start("").await;
    let md5 = upload_photo(&l).await;
    let r = get(l.addr, &format!("/{md5}?w=100&h=100&g=1&f=png")).await;
    let (w, h, color, _) = decode_png(&r.body);
    assert_eq!((w, h, color), (100, 100, png::ColorType::Grayscale));
    let r = get(l.addr, &format!("/{md5}?w=100&h=100&g=1&f=jpeg")).await;
    let img = turbojpeg::decompress(&r.body, turbojpeg::PixelFormat::RGB).unwrap();
    assert!(img.pixels.chunks(3).all(|p| p[0] == p[1] && p[1] == p[2]));
    // PNG sources (not decoded gray) too.
    let r = upload(l.addr, coords_png(30, 30), "image/png").await;
    let r = get(l.addr, &format!("/{}?g=1&f=jpeg", r.field("md5"))).await;
    let img = turbojpeg::decompress(&r.body, turbojpeg::PixelFormat::RGB).unwrap();
    assert!(img.pixels.chunks(3).all(|p| p[0] == p[1] && p[1] == p[2]));
    l.larder.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_output_format_decodes_at_the_asked_size() {
    let l = start("").await;
    let md5 = upload_photo(&l).await;
    for f in ["jpeg", "png", "webp", "gif", "avif"] {
        let r = get(l.addr, &format!("/{md5}?w=64&h=48&f={f}")).await;
        assert_eq!(r.status, 200, "{f}: {}", r.text());
        let want = format!("image/{f}");
        assert_eq!(r.header("content-type"), Some(want.as_str()));
        let size = match f {
            "jpeg" => {
                let i = turbojpeg::decompress(&r.body, turbojpeg::PixelFormat::RGB).unwrap();
                (i.width as u32, i.height as u32)
            }
            "png" => {
                let (w, h, _, _) = decode_png(&r.body);
                (w, h)
            }
            "webp" => {
                let i = webp::Decoder::new(&r.body).decode().unwrap();
                (i.width(), i.height())
            }
            "gif" => {
                let mut d = gif::DecodeOptions::new()
                    .read_info(std::io::Cursor::new(&r.body[..]))
                    .unwrap();
                let fr = d.read_next_frame().unwrap().unwrap();
                (u32::from(fr.width), u32::from(fr.height))
            }
            _ => {
                let i = decode_avif(&r.body);
                (i.width, i.height)
            }
        };
        assert_eq!(size, (64, 48), "{f}");
        assert_eq!(sniff::probe(&r.body).unwrap().format.name(), f);
    }
    l.larder.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn auto_format_follows_accept() {
    let l = start("").await;
    let md5 = upload_photo(&l).await;
    for (accept, want) in [
        ("image/avif,image/webp,*/*", "image/avif"),
        ("image/webp,*/*;q=0.8", "image/webp"),
        ("image/avif;q=0,image/webp", "image/webp"),
        ("*/*", "image/jpeg"),
        ("", "image/jpeg"),
    ] {
        let r = send(
            l.addr,
            "GET",
            &format!("/{md5}?w=50&f=auto"),
            &[("accept", accept)],
            b"",
        )
        .await;
        assert_eq!(r.status, 200, "{accept}");
        assert_eq!(r.header("content-type"), Some(want), "{accept}");
        assert_eq!(r.header("vary"), Some("Accept"));
        assert_eq!(sniff::probe(&r.body).unwrap().format.mime(), want);
    }
    l.larder.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn route_default_format_auto() {
    let l = start("default_format = \"auto\"").await;
    let md5 = upload_photo(&l).await;
    let r = send(
        l.addr,
        "GET",
        &format!("/{md5}?w=50"),
        &[("accept", "image/webp")],
        b"",
    )
    .await;
    assert_eq!(r.header("content-type"), Some("image/webp"));
    assert_eq!(r.header("vary"), Some("Accept"));
    l.larder.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn parameter_order_shares_one_entry_and_304() {
    let l = start("").await;
    let md5 = upload_photo(&l).await;
    let a = get(l.addr, &format!("/{md5}?w=100&h=100")).await;
    assert_eq!(a.cache(), "MISS");
    let b = get(l.addr, &format!("/{md5}?h=100&w=100&unknown=1")).await;
    assert_eq!(b.cache(), "HIT");
    assert_eq!(a.body, b.body);
    let etag = a.header("etag").unwrap_or_default().to_string();
    assert!(etag.starts_with(&format!("\"{md5}-")), "{etag}");
    assert_eq!(
        a.header("cache-control"),
        Some("public, max-age=31536000, immutable")
    );
    let c = send(
        l.addr,
        "GET",
        &format!("/{md5}?h=100&w=100"),
        &[("if-none-match", &etag)],
        b"",
    )
    .await;
    assert_eq!(c.status, 304);
    assert!(c.body.is_empty());
    l.larder.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_identical_transforms_are_coalesced() {
    let l = start("").await;
    let md5 = upload_photo(&l).await;
    let path = format!("/{md5}?w=120&h=90&f=webp");
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (addr, path) = (l.addr, path.clone());
        tasks.push(tokio::spawn(async move { get(addr, &path).await }));
    }
    let mut misses = 0;
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200);
        if r.cache() == "MISS" {
            misses += 1;
        }
    }
    assert_eq!(misses, 1);
    l.larder.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn uncached_mode_transforms_every_time() {
    let l = start("cache_results = false").await;
    let md5 = upload_photo(&l).await;
    for _ in 0..2 {
        let r = get(l.addr, &format!("/{md5}?w=100&h=100&g=1&f=jpeg")).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.cache(), "BYPASS");
    }
    assert_eq!(l.larder.cache_entries(), 0);
    l.larder.shutdown().await;
}

/// A valid PNG header declaring 100,000 × 100,000 pixels, and almost nothing else.
fn pixel_bomb() -> Vec<u8> {
    let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
    b.extend_from_slice(&100_000u32.to_be_bytes());
    b.extend_from_slice(&100_000u32.to_be_bytes());
    b.extend_from_slice(&[8, 2, 0, 0, 0, 0, 0, 0, 0]);
    b.extend_from_slice(b"\0\0\0\0IEND\xAE\x42\x60\x82");
    b
}

#[tokio::test(flavor = "multi_thread")]
async fn pixel_bomb_is_refused_before_decoding() {
    let l = start("").await;
    let r = upload(l.addr, pixel_bomb(), "image/png").await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(r.text().contains("pixels"), "{}", r.text());
    assert_eq!(stored_files(l.dir.path()), 0);
    // Planted directly in storage (e.g. stored under a looser limit): refused on transform.
    planted_bomb_is_refused_quickly(&l, &pixel_bomb()).await;
    l.larder.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_parameters_are_400_naming_them() {
    let l = start("max_output_dimension = 2000").await;
    let md5 = upload_photo(&l).await;
    for (q, name) in [
        ("w=abc", "`w`"),
        ("h=-5", "`h`"),
        ("p=9", "`p`"),
        ("q=101", "`q`"),
        ("f=bmp", "`f`"),
        ("g=yes", "`g`"),
        ("r=1000", "`r`"),
        ("w=3000", "`w`"),
        ("w=50&p=3&h=400", "`h`"),
        ("t=nope", "`t`"),
        ("p=2&x=5000&w=10&h=10", "`x`"),
    ] {
        let r = get(l.addr, &format!("/{md5}?{q}")).await;
        assert_eq!(r.status, 400, "{q}: {}", r.text());
        assert!(r.text().contains(name), "{q}: {}", r.text());
    }
    // A preset, overridable.
    let r = get(l.addr, &format!("/{md5}?t=thumb")).await;
    assert_eq!(dims(&r.body), (100, 100));
    let r = get(l.addr, &format!("/{md5}?t=thumb&w=50")).await;
    assert_eq!(dims(&r.body), (50, 100));
    assert_eq!(
        get(l.addr, "/0123456789abcdef0123456789abcdef")
            .await
            .status,
        404
    );
    l.larder.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exif_orientation_is_applied() {
    let l = start("").await;
    // A 40×20 JPEG tagged orientation 6 (rotate 90° clockwise to display): upright it is 20×40.
    let px = vec![200u8; 40 * 20 * 3];
    let jpeg = turbojpeg::compress(
        turbojpeg::Image {
            pixels: &px[..],
            width: 40,
            pitch: 120,
            height: 20,
            format: turbojpeg::PixelFormat::RGB,
        },
        90,
        turbojpeg::Subsamp::Sub2x2,
    )
    .unwrap();
    let r = upload(l.addr, exif_oriented(&jpeg, 6), "image/jpeg").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(l.addr, &format!("/{}?q=80", r.field("md5"))).await;
    assert_eq!(dims(&r.body), (20, 40));
    assert_eq!(
        sniff::probe(&r.body).unwrap().orientation,
        1,
        "metadata stripped"
    );
    l.larder.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_needs_the_token_and_purges_variants() {
    let l = start("").await;
    let md5 = upload_photo(&l).await;
    for q in ["w=10", "w=20", "w=30&f=png"] {
        assert_eq!(get(l.addr, &format!("/{md5}?{q}")).await.cache(), "MISS");
    }
    assert_eq!(get(l.addr, &format!("/{md5}?w=10")).await.cache(), "HIT");
    let before = l.larder.cache_entries();
    assert!(before >= 3);
    let path = format!("/{md5}");
    let r = send(l.addr, "DELETE", &path, &[], b"").await;
    assert_eq!(r.status, 401);
    let r = send(
        l.addr,
        "DELETE",
        &path,
        &[("authorization", "Bearer wrong")],
        b"",
    )
    .await;
    assert_eq!(r.status, 401);
    let auth = format!("Bearer {TOKEN}");
    let r = send(l.addr, "DELETE", &path, &[("authorization", &auth)], b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(l.larder.cache_entries(), before - 3);
    assert_eq!(get(l.addr, &format!("/{md5}?w=10")).await.status, 404);
    assert_eq!(stored_files(l.dir.path()), 0);
    // Uploaded again: variants are made afresh, not served from before.
    upload_photo(&l).await;
    assert_eq!(get(l.addr, &format!("/{md5}?w=10")).await.cache(), "MISS");
    l.larder.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn upload_restrictions() {
    let l = start("upload_allow = [\"10.0.0.0/8\"]").await;
    let r = upload(l.addr, photo(), "image/jpeg").await;
    assert_eq!(r.status, 403);
    l.larder.shutdown().await;
    let l = start("upload_token = true").await;
    assert_eq!(upload(l.addr, photo(), "image/jpeg").await.status, 401);
    let auth = format!("Bearer {TOKEN}");
    let r = send(
        l.addr,
        "POST",
        "/upload",
        &[("content-type", "image/jpeg"), ("authorization", &auth)],
        photo(),
    )
    .await;
    assert_eq!(r.status, 200);
    l.larder.shutdown().await;
}

/// Runs the transform `params` on `data` `n` times on this thread: (wall time, summed steps).
fn time_transform(
    data: &[u8],
    params: &str,
    n: u32,
) -> (Duration, larder::images::transform::Timing) {
    use larder::images::codec::Limits;
    use larder::images::params::{FormatChoice, Params, Resolved};
    use larder::images::transform;
    let probe = sniff::probe(data).unwrap();
    let p = Params::parse(params).unwrap();
    let r = Resolved::new(&p, FormatChoice::Keep, 75, &HeaderMap::new()).for_source(probe.format);
    let limits = Limits {
        max_animation_pixels: 500_000_000,
        ..Limits::DEFAULT
    };
    let mut total = transform::Timing::default();
    let start = std::time::Instant::now();
    for _ in 0..n {
        let (out, t) = transform::run(data, &probe, &r, &limits).unwrap();
        assert!(!out.is_empty());
        total.decode += t.decode;
        total.resize += t.resize;
        total.encode += t.encode;
    }
    (start.elapsed(), total)
}

/// Single-threaded timing of the benchmark's transform (640×856 JPEG → 100×100 gray JPEG).
/// `cargo test --release --test images -- --ignored --nocapture transform_timing`
#[test]
#[ignore]
fn transform_timing() {
    let n = 500;
    let (wall, total) = time_transform(&photo(), "w=100&h=100&g=1&f=jpeg", n);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0 / f64::from(n);
    println!(
        "640x856 jpeg -> 100x100 gray jpeg: {:.3} ms/image (decode {:.3}, resize+ops {:.3}, encode {:.3})",
        ms(wall),
        ms(total.decode),
        ms(total.resize),
        ms(total.encode)
    );
}

/// Plants `bomb` straight into storage (as if stored under a looser limit) and checks that a
/// transform of it is refused with 422 before any decoding work.
async fn planted_bomb_is_refused_quickly(l: &Images, bomb: &[u8]) {
    let md5 = larder::images::storage::Md5Hex::of(bomb);
    let s = md5.as_str();
    let d = l.dir.path().join(&s[0..2]).join(&s[2..4]);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join(s), bomb).unwrap();
    let start = std::time::Instant::now();
    let r = get(l.addr, &format!("/{s}?w=10&h=10")).await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(start.elapsed() < Duration::from_secs(2));
}

/// An AVIF made by larder itself: `src` uploaded, then asked for as `f=avif` with `query`.
async fn avif_of(l: &Images, src: Vec<u8>, ctype: &str, query: &str) -> Vec<u8> {
    let r = upload(l.addr, src, ctype).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(l.addr, &format!("/{}?{query}&f=avif", r.field("md5"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("image/avif"));
    r.body.to_vec()
}

/// A 60×40 RGB PNG: the left half red, the right half blue.
fn two_colours_png() -> Vec<u8> {
    let mut px = Vec::new();
    for _y in 0..40 {
        for x in 0..60 {
            px.extend_from_slice(if x < 30 {
                &[220, 40, 40]
            } else {
                &[30, 60, 200]
            });
        }
    }
    encode_png(60, 40, png::ColorType::Rgb, png::BitDepth::Eight, &px)
}

fn near(got: &[u8], want: &[u8], tolerance: u8) -> bool {
    got.iter()
        .zip(want)
        .all(|(g, w)| g.abs_diff(*w) <= tolerance)
}

#[tokio::test(flavor = "multi_thread")]
async fn avif_sources_are_decoded() {
    let l = start("").await;
    // A photo: the JPEG made into a 200×268 AVIF, uploaded as an original of its own.
    let jpeg_md5 = upload_photo(&l).await;
    let avif = avif_of(&l, photo(), "image/jpeg", "w=200").await;
    let r = upload(l.addr, avif.clone(), "image/avif").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.field("format"), "avif");
    assert_eq!(
        (r.field("width"), r.field("height")),
        ("200".into(), "268".into())
    );
    let md5 = r.field("md5");

    let r = get(l.addr, &format!("/{md5}?w=100&h=134&f=jpeg")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("image/jpeg"));
    let from_avif = turbojpeg::decompress(&r.body, turbojpeg::PixelFormat::RGB).unwrap();
    assert_eq!((from_avif.width, from_avif.height), (100, 134));
    // Roughly the colours of the same transform of the JPEG itself.
    let r = get(l.addr, &format!("/{jpeg_md5}?w=100&h=134&f=jpeg")).await;
    let from_jpeg = turbojpeg::decompress(&r.body, turbojpeg::PixelFormat::RGB).unwrap();
    let mean = |px: &[u8], c: usize| {
        px.iter()
            .skip(c)
            .step_by(3)
            .map(|&v| f64::from(v))
            .sum::<f64>()
            / (px.len() / 3) as f64
    };
    for c in 0..3 {
        let (a, j) = (mean(&from_avif.pixels, c), mean(&from_jpeg.pixels, c));
        assert!(
            (a - j).abs() < 6.0,
            "channel {c}: {a:.1} from AVIF, {j:.1} from JPEG"
        );
    }

    let r = get(l.addr, &format!("/{md5}?w=50&f=png")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let (w, h, color, _) = decode_png(&r.body);
    assert_eq!((w, h, color), (50, 67, png::ColorType::Rgb));

    // Flat colours come back as they were.
    let avif = avif_of(&l, two_colours_png(), "image/png", "q=90").await;
    let r = upload(l.addr, avif.clone(), "image/avif").await;
    let r = get(l.addr, &format!("/{}?w=30&f=png", r.field("md5"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let (w, h, _, px) = decode_png(&r.body);
    assert_eq!((w, h), (30, 20));
    let at = |x: usize, y: usize| &px[(y * 30 + x) * 3..(y * 30 + x) * 3 + 3];
    assert!(near(at(3, 10), &[220, 40, 40], 10), "{:?}", at(3, 10));
    assert!(near(at(26, 10), &[30, 60, 200], 10), "{:?}", at(26, 10));

    // Branded as an image sequence (`avis`): its primary image is what is decoded.
    let mut avis = avif;
    avis[8..12].copy_from_slice(b"avis");
    let r = upload(l.addr, avis, "image/avif").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(l.addr, &format!("/{}?w=30&f=png", r.field("md5"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(dims(&r.body), (30, 20));
    l.larder.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn avif_alpha_is_kept_in_png() {
    let l = start("").await;
    // 40×20: the left half opaque green, the right half fully transparent.
    let mut px = Vec::new();
    for _y in 0..20 {
        for x in 0..40 {
            px.extend_from_slice(if x < 20 {
                &[40, 180, 60, 255]
            } else {
                &[0, 0, 0, 0]
            });
        }
    }
    let src = encode_png(40, 20, png::ColorType::Rgba, png::BitDepth::Eight, &px);
    let avif = avif_of(&l, src, "image/png", "q=90").await;
    let r = upload(l.addr, avif, "image/avif").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(l.addr, &format!("/{}?w=40&f=png", r.field("md5"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let (w, h, color, px) = decode_png(&r.body);
    assert_eq!((w, h, color), (40, 20, png::ColorType::Rgba));
    let at = |x: usize, y: usize| &px[(y * 40 + x) * 4..(y * 40 + x) * 4 + 4];
    assert!(near(at(5, 10), &[40, 180, 60, 255], 10), "{:?}", at(5, 10));
    assert!(at(35, 10)[3] < 10, "{:?}", at(35, 10));
    l.larder.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn avif_pixel_bomb_is_refused_before_decoding() {
    let l = start("").await;
    let avif = avif_of(&l, two_colours_png(), "image/png", "q=50").await;
    // The same file declaring 100,000 × 100,000 pixels in its `ispe`.
    let mut bomb = avif.clone();
    let at = bomb.windows(4).position(|w| w == b"ispe").unwrap();
    bomb[at + 8..at + 12].copy_from_slice(&100_000u32.to_be_bytes());
    bomb[at + 12..at + 16].copy_from_slice(&100_000u32.to_be_bytes());
    let r = upload(l.addr, bomb.clone(), "image/avif").await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(r.text().contains("pixels"), "{}", r.text());
    let files = stored_files(l.dir.path());
    // Planted directly in storage: refused on transform, from the header.
    planted_bomb_is_refused_quickly(&l, &bomb).await;
    assert_eq!(stored_files(l.dir.path()), files + 1);
    l.larder.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn corrupt_avif_is_4xx() {
    let l = start("").await;
    let avif = avif_of(&l, two_colours_png(), "image/png", "q=50").await;
    // Cut short: the header is whole (the upload is stored), the AV1 data is not.
    let cut = avif[..avif.len() * 3 / 4].to_vec();
    let r = upload(l.addr, cut, "image/avif").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(l.addr, &format!("/{}?w=10&f=png", r.field("md5"))).await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(r.text().contains("AVIF"), "{}", r.text());
    // The AV1 data scrambled where it starts (its OBU headers): a scrambled tail can still
    // decode to some picture, as AV1 decoders are built to.
    let mut scrambled = avif.clone();
    let mdat = scrambled
        .windows(4)
        .position(|w| w == b"mdat")
        .expect("an mdat box")
        + 4;
    for (i, b) in scrambled[mdat..mdat + 40].iter_mut().enumerate() {
        *b ^= 0x5A ^ i as u8;
    }
    let r = upload(l.addr, scrambled, "image/avif").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(l.addr, &format!("/{}?w=10&f=png", r.field("md5"))).await;
    assert!(r.status.is_client_error(), "{}: {}", r.status, r.text());
    // Its header cut: not an image.
    let r = upload(l.addr, avif[..40].to_vec(), "image/avif").await;
    assert_eq!(r.status, 415, "{}", r.text());
    // The server lives on.
    let r = upload(l.addr, avif, "image/avif").await;
    let r = get(l.addr, &format!("/{}?w=10&f=png", r.field("md5"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    l.larder.shutdown().await;
}

/// Single-threaded timing of AVIF decoding: the 1000×872 photo as an AVIF source, to a 100×100
/// JPEG. `cargo test --release --test images -- --ignored --nocapture avif_decode_timing`
#[test]
#[ignore]
fn avif_decode_timing() {
    use larder::images::codec::{self, Raster};
    use larder::images::sniff::ImageFormat;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/data/photo-1000x872.jpg");
    let jpeg = std::fs::read(path).expect("bench/data photo in the repository");
    let i = turbojpeg::decompress(&jpeg, turbojpeg::PixelFormat::RGB).unwrap();
    let img = Raster {
        width: i.width as u32,
        height: i.height as u32,
        channels: 3,
        data: i.pixels,
    };
    let data = codec::encode(&img, ImageFormat::Avif, 75).unwrap();
    let probe = sniff::probe(&data).unwrap();
    let n = 20;
    let (_, total) = time_transform(&data, "w=100&h=100&f=jpeg", n);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0 / f64::from(n);
    println!(
        "{}x{} avif ({} bytes, 10-bit 4:4:4) -> 100x100 jpeg: decode {:.2} ms, resize {:.2}, encode {:.2}",
        probe.width,
        probe.height,
        data.len(),
        ms(total.decode),
        ms(total.resize),
        ms(total.encode)
    );
}

/// A cover crop decodes only the band of rows it keeps (libjpeg-turbo cropping): the result
/// must show exactly the middle rows. A vertical gradient makes a misplaced band visible.
#[test]
fn cover_crop_of_a_jpeg_keeps_the_right_rows() {
    use larder::images::codec::Limits;
    use larder::images::params::{FormatChoice, Params, Resolved};
    use larder::images::transform;
    let (w, h) = (64usize, 400usize);
    let mut px = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        let v = (y * 255 / (h - 1)) as u8;
        for _ in 0..w {
            px.extend_from_slice(&[v, v, v]);
        }
    }
    let jpeg = turbojpeg::compress(
        turbojpeg::Image {
            pixels: px.as_slice(),
            width: w,
            pitch: w * 3,
            height: h,
            format: turbojpeg::PixelFormat::RGB,
        },
        95,
        turbojpeg::Subsamp::Sub2x2,
    )
    .unwrap();
    let probe = sniff::probe(&jpeg).unwrap();
    let limits = Limits {
        max_animation_pixels: 500_000_000,
        ..Limits::DEFAULT
    };
    let p = Params::parse("w=32&h=32&p=1&g=1&f=png").unwrap();
    let r = Resolved::new(&p, FormatChoice::Keep, 75, &HeaderMap::new()).for_source(probe.format);
    let (out, _) = transform::run(&jpeg, &probe, &r, &limits).unwrap();
    let dec = png::Decoder::new(std::io::Cursor::new(out));
    let mut reader = dec.read_info().unwrap();
    let mut buf = vec![0u8; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (32, 32));
    let row = |y: usize| buf[y * info.line_size];
    // The middle 64 of 400 rows (168..232): brightness about 107 at the top, 148 at the bottom.
    assert!(row(0).abs_diff(108) <= 4, "top row {}", row(0));
    assert!(row(31).abs_diff(147) <= 4, "bottom row {}", row(31));
}

/// #12 item 9: a 200×150 upload asked for `w=4096&h=4096` was enlarged to 4096×4096 (as AVIF,
/// 14 s of CPU). Now never enlarged by default, and at most `max_upscale` times when set.
#[tokio::test(flavor = "multi_thread")]
async fn regression_small_upload_is_not_enlarged() {
    for (extra, want) in [("", (150, 150)), ("max_upscale = 2", (300, 300))] {
        let l = start(extra).await;
        let md5 = upload(l.addr, coords_png(200, 150), "image/png")
            .await
            .field("md5");
        let r = get(l.addr, &format!("/{md5}?w=1000&h=1000&f=png")).await;
        assert_eq!(r.status, 200, "{extra}: {}", r.text());
        assert_eq!(dims(&r.body), want, "{extra}");
        l.larder.shutdown().await;
    }
}

/// #12 item 9: AVIF output had no size bound of its own (its encoder costs far more per pixel
/// than the others). Over `max_avif_pixels`, `f=avif` is a 400 naming `f`; `f=auto` falls back
/// to the format a client without AVIF gets.
#[tokio::test(flavor = "multi_thread")]
async fn regression_avif_output_is_capped() {
    let l = start("max_avif_pixels = 10000\navif_speed = 8").await;
    let md5 = upload_photo(&l).await;
    let r = get(l.addr, &format!("/{md5}?w=200&h=200&f=avif")).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("`f`"), "{}", r.text());
    let r = get(l.addr, &format!("/{md5}?w=100&h=100&f=avif")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("image/avif"));
    let auto = |q: &'static str| {
        let path = format!("/{md5}?{q}&f=auto");
        async move {
            send(
                l.addr,
                "GET",
                &path,
                &[("accept", "image/avif,image/webp")],
                b"",
            )
            .await
        }
    };
    let r = auto("w=200&h=200").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("image/jpeg"));
    assert_eq!(sniff::probe(&r.body).unwrap().format.name(), "jpeg");
    assert_eq!(r.header("vary"), Some("Accept"));
    let r = auto("w=100&h=100").await;
    assert_eq!(r.header("content-type"), Some("image/avif"));
    l.larder.shutdown().await;
}

/// #12 item 9: decoding had no memory bound (a 16-bit 7000×7000 PNG took 570 MB per request,
/// whatever the other workers held). A transform whose estimate can never fit `decode_memory`
/// is refused with 422 before any decoding; smaller ones run.
#[tokio::test(flavor = "multi_thread")]
async fn regression_decode_memory_is_bounded() {
    let l = start("decode_memory = \"1MiB\"").await;
    let big = upload(l.addr, coords_png(1000, 1000), "image/png").await;
    let r = get(l.addr, &format!("/{}?w=10&h=10", big.field("md5"))).await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(r.text().contains("decode_memory"), "{}", r.text());
    let small = upload(l.addr, coords_png(100, 100), "image/png").await;
    let r = get(l.addr, &format!("/{}?w=10&h=10", small.field("md5"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    l.larder.shutdown().await;
}

/// #12 item 9: with transforms run first come, first served, four expensive transforms made a
/// 1 ms one wait 27 s. On one worker, expensive transforms are queued, then a cheap one: it
/// completes before they all do (ordering only: nothing here is timed).
#[tokio::test(flavor = "multi_thread")]
async fn regression_cheap_transform_is_not_queued_behind_expensive_ones() {
    let l = start("workers = 1\nqueue_timeout = \"120s\"").await;
    let md5 = upload_photo(&l).await;
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let mut request = |name: String, path: String| {
        let (addr, order) = (l.addr, order.clone());
        tasks.push(tokio::spawn(async move {
            let r = get(addr, &path).await;
            assert_eq!(r.status, 200, "{name}: {}", r.text());
            order.lock().unwrap().push(name);
        }));
    };
    // Full-size re-encodes of a 2-megapixel PNG (each takes over a second in a debug build,
    // far longer than the pauses below), distinct (q) so they are not coalesced.
    let big = upload(l.addr, coords_png(1600, 1200), "image/png")
        .await
        .field("md5");
    for q in 1..=4 {
        request(format!("expensive {q}"), format!("/{big}?q={q}&f=png"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let them reach the queue (the first one is still running when the cheap one comes).
    tokio::time::sleep(Duration::from_millis(200)).await;
    request("cheap".into(), format!("/{md5}?w=8&h=8&g=1&f=jpeg"));
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    let cheap = order.iter().position(|n| n == "cheap").unwrap();
    assert!(cheap < 4, "the cheap transform completed last: {order:?}");
    l.larder.shutdown().await;
}

/// Display P3 to sRGB from the published matrices (P3 and sRGB share the sRGB transfer curve
/// and D65 white): the reference the server's conversion is checked against, computed without
/// colour-management code.
fn p3_to_srgb(p: [u8; 3]) -> [f64; 3] {
    let lin = |v: u8| {
        let v = f64::from(v) / 255.0;
        if v <= 0.04045 {
            v / 12.92
        } else {
            ((v + 0.055) / 1.055).powf(2.4)
        }
    };
    let enc = |v: f64| {
        let v = v.clamp(0.0, 1.0);
        255.0
            * if v <= 0.003_130_8 {
                12.92 * v
            } else {
                1.055 * v.powf(1.0 / 2.4) - 0.055
            }
    };
    let m = [
        [1.224_940, -0.224_940, 0.0],
        [-0.042_057, 1.042_057, 0.0],
        [-0.019_638, -0.078_636, 1.098_274],
    ];
    let l = p.map(lin);
    m.map(|row| enc(row[0] * l[0] + row[1] * l[1] + row[2] * l[2]))
}

/// A JPEG (4:4:4, quality 100) of `w`×`h` pixels `px` in `format`.
fn jpeg_of(px: &[u8], w: usize, h: usize, format: turbojpeg::PixelFormat) -> Vec<u8> {
    let mut c = turbojpeg::Compressor::new().unwrap();
    c.set_quality(100).unwrap();
    c.set_subsamp(turbojpeg::Subsamp::None).unwrap();
    let image = turbojpeg::Image {
        pixels: px,
        width: w,
        pitch: w * format.size(),
        height: h,
        format,
    };
    c.compress_to_owned(image).unwrap().to_vec()
}

/// A `w`×`h` JPEG of one colour, with `icc` embedded when given.
fn flat_jpeg(w: u32, h: u32, rgb: [u8; 3], icc: Option<&[u8]>) -> Vec<u8> {
    let px = rgb.repeat((w * h) as usize);
    let jpeg = jpeg_of(&px, w as usize, h as usize, turbojpeg::PixelFormat::RGB);
    match icc {
        Some(icc) => larder::images::colour::embed_jpeg(&jpeg, icc),
        None => jpeg,
    }
}

fn centre_rgb(jpeg: &[u8]) -> [u8; 3] {
    let img = turbojpeg::decompress(jpeg, turbojpeg::PixelFormat::RGB).unwrap();
    let i = (img.height / 2 * img.width + img.width / 2) * 3;
    [img.pixels[i], img.pixels[i + 1], img.pixels[i + 2]]
}

fn assert_near(got: [u8; 3], want: [f64; 3], tolerance: f64, what: &str) {
    for (g, w) in got.iter().zip(want) {
        assert!(
            (f64::from(*g) - w).abs() <= tolerance,
            "{what}: got {got:?}, want {want:?}"
        );
    }
}

/// Issue #42 item 4: a phone's Display P3 JPEG came out with its P3 numbers read as sRGB (dull
/// colours) and no profile; now its pixels are converted and the output carries no profile.
#[tokio::test(flavor = "multi_thread")]
async fn display_p3_jpeg_comes_out_srgb() {
    let l = start("").await;
    let p3 = moxcms::ColorProfile::new_display_p3().encode().unwrap();
    let colour = [200u8, 60, 40];
    let want = p3_to_srgb(colour);
    // The conversion moves this colour far more than the tolerance.
    assert!((want[0] - 200.0).abs() > 10.0, "{want:?}");
    let md5 = upload(l.addr, flat_jpeg(64, 64, colour, Some(&p3)), "image/jpeg")
        .await
        .field("md5");
    for f in ["jpeg", "png", "webp"] {
        let r = get(l.addr, &format!("/{md5}?w=32&h=32&f={f}&q=100")).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let format = sniff::format(&r.body).unwrap();
        let embedded = larder::images::colour::embedded(&r.body, format);
        assert_eq!(embedded.icc, None, "{f} output carries no profile");
        let got = match f {
            "png" => {
                let (_, _, _, px) = decode_png(&r.body);
                [px[0], px[1], px[2]]
            }
            "webp" => {
                let img = webp::Decoder::new(&r.body).decode().unwrap();
                [img[0], img[1], img[2]]
            }
            _ => centre_rgb(&r.body),
        };
        // WebP's lossy chroma is coarser than JPEG's at q=100.
        assert_near(got, want, if f == "webp" { 6.0 } else { 4.0 }, f);
    }

    // An sRGB profile changes nothing: the same bytes as the same source without a profile.
    let srgb = moxcms::ColorProfile::new_srgb().encode().unwrap();
    let tagged = upload(l.addr, flat_jpeg(64, 64, colour, Some(&srgb)), "image/jpeg")
        .await
        .field("md5");
    let bare = upload(l.addr, flat_jpeg(64, 64, colour, None), "image/jpeg")
        .await
        .field("md5");
    let a = get(l.addr, &format!("/{tagged}?w=32&h=32&f=png")).await;
    let b = get(l.addr, &format!("/{bare}?w=32&h=32&f=png")).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body, b.body);
    l.larder.shutdown().await;
}

/// A CMYK JPEG as Adobe writes it (APP14, inverted samples) decodes to its colours; it was
/// refused (libjpeg converts CMYK to nothing else).
#[tokio::test(flavor = "multi_thread")]
async fn cmyk_jpeg_decodes_to_its_colours() {
    let l = start("").await;
    // Left half red (magenta + yellow ink), right half 50 % black; stored inverted.
    let (w, h) = (32usize, 16usize);
    let mut px = Vec::with_capacity(w * h * 4);
    for _ in 0..h {
        for x in 0..w {
            let ink = if x < w / 2 {
                [0u8, 255, 255, 0]
            } else {
                [0, 0, 0, 128]
            };
            px.extend(ink.map(|v| 255 - v));
        }
    }
    let jpeg = jpeg_of(&px, w, h, turbojpeg::PixelFormat::CMYK);
    // What the decoder asked of libjpeg before: refused.
    assert!(turbojpeg::decompress(&jpeg, turbojpeg::PixelFormat::RGB).is_err());
    let r = upload(l.addr, &jpeg, "image/jpeg").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(l.addr, &format!("/{}?p=2&w=32&h=16&f=png", r.field("md5"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let (_, _, color, px) = decode_png(&r.body);
    assert_eq!(color, png::ColorType::Rgb);
    let at = |x: usize| {
        [
            px[(8 * w + x) * 3],
            px[(8 * w + x) * 3 + 1],
            px[(8 * w + x) * 3 + 2],
        ]
    };
    assert_near(at(4), [255.0, 0.0, 0.0], 3.0, "red");
    assert_near(at(28), [127.0, 127.0, 127.0], 3.0, "grey");
    l.larder.shutdown().await;
}

/// 16-bit PNGs: converted from their profile at 16 bits, rounded (not truncated) to 8.
#[tokio::test(flavor = "multi_thread")]
async fn sixteen_bit_png_decodes() {
    let l = start("").await;
    let (w, h) = (8u32, 8u32);
    // Rounded: 0x00FF is 0.99 of a level (1), 0xFF00 254.01 (254); their high bytes, what
    // truncation keeps, are 0 and 255.
    let px: Vec<u8> = [0x00FFu16, 0xFF00, 0xFFFF]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect::<Vec<u8>>()
        .repeat((w * h) as usize);
    let plain = encode_png(w, h, png::ColorType::Rgb, png::BitDepth::Sixteen, &px);
    let r = upload(l.addr, &plain, "image/png").await;
    let r = get(l.addr, &format!("/{}?w=4&f=png", r.field("md5"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let (_, _, _, out) = decode_png(&r.body);
    assert_eq!(&out[..3], &[1, 254, 255]);

    // With a Display P3 profile (iCCP).
    let p3 = moxcms::ColorProfile::new_display_p3().encode().unwrap();
    let mut tagged = Vec::new();
    let mut info = png::Info::with_size(w, h);
    info.color_type = png::ColorType::Rgb;
    info.bit_depth = png::BitDepth::Sixteen;
    info.icc_profile = Some(p3.into());
    let px: Vec<u8> = [200u16 * 257, 60 * 257, 40 * 257]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect::<Vec<u8>>()
        .repeat((w * h) as usize);
    let mut wr = png::Encoder::with_info(&mut tagged, info)
        .unwrap()
        .write_header()
        .unwrap();
    wr.write_image_data(&px).unwrap();
    wr.finish().unwrap();
    let r = upload(l.addr, &tagged, "image/png").await;
    let r = get(l.addr, &format!("/{}?w=4&f=png", r.field("md5"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let (_, _, _, out) = decode_png(&r.body);
    assert_near(
        [out[0], out[1], out[2]],
        p3_to_srgb([200, 60, 40]),
        2.0,
        "P3 16-bit",
    );
    l.larder.shutdown().await;
}
