//! JPEG XL and HEIC through the image proxy over real sockets: JPEG XL sources (a bare codestream
//! and the container, made by cjxl) and HEIC sources (made by heif-enc; tests/data/README.md)
//! resized to JPEG, WebP and PNG with their colour kept; JPEG XL output (`@jxl`, `f:jxl`,
//! lossless at `q:100`) decoded by jxl-oxide to the right size and colour; the pixel limit
//! refusing a JPEG XL source from its header. libjxl and libheif are loaded at run time:
//! tests/provision installs them.

mod common;

use std::net::SocketAddr;

use common::{encode_png, Got};
use larder::images::sniff;

const FLAT: [u8; 3] = [32, 96, 200];
const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");

type Proxy = common::ImageRoute;

/// A 120×80 PNG: left half red, right half `FLAT`.
fn halves_png() -> Vec<u8> {
    let px: Vec<u8> = (0..80)
        .flat_map(|_| (0..120).flat_map(|x| if x < 60 { [255, 0, 0] } else { FLAT }))
        .collect();
    encode_png(120, 80, png::ColorType::Rgb, png::BitDepth::Eight, &px)
}

async fn start(extra: &str) -> Proxy {
    let mut files: Vec<(&str, Vec<u8>)> = [
        "flat-160x120.jxl",
        "flat-160x120-container.jxl",
        "flat-160x120.heic",
    ]
    .into_iter()
    .map(|f| (f, std::fs::read(format!("{DATA}/{f}")).unwrap()))
    .collect();
    files.push(("halves.png", halves_png()));
    common::image_route(&files, extra, None).await
}

async fn get(addr: SocketAddr, path: &str) -> Got {
    let url = format!("http://{addr}{path}");
    common::send(&common::client(), "GET", &url, &[], b"").await
}

/// RGB pixels (width, height, samples) of a PNG, JPEG or WebP body, each decoded by its own
/// library (not larder's pipeline).
fn pixels(b: &[u8]) -> (u32, u32, Vec<u8>) {
    match sniff::format(b) {
        Some(sniff::ImageFormat::Png) => {
            let mut r = png::Decoder::new(std::io::Cursor::new(b))
                .read_info()
                .unwrap();
            let mut buf = vec![0; r.output_buffer_size().unwrap()];
            let info = r.next_frame(&mut buf).unwrap();
            let c = info.color_type.samples();
            let px = buf[..info.buffer_size()]
                .chunks_exact(c)
                .flat_map(|p| [p[0], p[1], p[2]])
                .collect();
            (info.width, info.height, px)
        }
        Some(sniff::ImageFormat::Jpeg) => {
            let img = turbojpeg::decompress(b, turbojpeg::PixelFormat::RGB).unwrap();
            (img.width as u32, img.height as u32, img.pixels)
        }
        Some(sniff::ImageFormat::Webp) => {
            let img = webp::Decoder::new(b).decode().unwrap();
            let c = if img.is_alpha() { 4 } else { 3 };
            let px = img
                .chunks_exact(c)
                .flat_map(|p| [p[0], p[1], p[2]])
                .collect();
            (img.width(), img.height(), px)
        }
        Some(sniff::ImageFormat::Jxl) => jxl_pixels(b),
        other => panic!("unexpected output {other:?}"),
    }
}

/// RGB pixels of a JPEG XL, decoded by jxl-oxide.
fn jxl_pixels(b: &[u8]) -> (u32, u32, Vec<u8>) {
    let image = jxl_oxide::JxlImage::builder().read(b).unwrap();
    let render = image.render_frame(0).unwrap();
    let mut stream = render.stream();
    let (w, h, c) = (stream.width(), stream.height(), stream.channels());
    let mut buf = vec![0u8; (w * h * c) as usize];
    stream.write_to_buffer(&mut buf);
    let px = match c {
        1 => buf.iter().flat_map(|&l| [l, l, l]).collect(),
        c => buf
            .chunks_exact(c as usize)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect(),
    };
    (w, h, px)
}

fn at(px: &[u8], w: u32, x: u32, y: u32) -> [u8; 3] {
    let i = ((y * w + x) * 3) as usize;
    [px[i], px[i + 1], px[i + 2]]
}

/// Within `tolerance` levels a channel (lossy coding and 4:2:0 chroma move a flat colour).
fn near(a: [u8; 3], b: [u8; 3], tolerance: u8) -> bool {
    a.iter().zip(b).all(|(x, y)| x.abs_diff(y) <= tolerance)
}

/// Asserts `r` is a `mime` image of `w`×`h` whose every corner and middle is `colour`.
fn assert_flat(r: &Got, mime: &str, (w, h): (u32, u32), colour: [u8; 3], tolerance: u8) {
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("content-type"), Some(mime));
    let (gw, gh, px) = pixels(&r.body);
    assert_eq!((gw, gh), (w, h));
    for (x, y) in [
        (0, 0),
        (w - 1, 0),
        (0, h - 1),
        (w - 1, h - 1),
        (w / 2, h / 2),
    ] {
        let got = at(&px, w, x, y);
        assert!(
            near(got, colour, tolerance),
            "{mime} at ({x}, {y}): {got:?}, not {colour:?}"
        );
    }
}

fn need(available: bool, library: &str, package: &str) {
    assert!(
        available,
        "{library} cannot be loaded: run tests/provision (it installs Debian's {package})"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn jxl_sources_become_jpeg_webp_and_png_in_their_colour() {
    let l = start("").await;
    for source in ["flat-160x120.jxl", "flat-160x120-container.jxl"] {
        let base = format!("/insecure/rs:fill:100:100/plain/{source}");
        let r = get(l.addr, &format!("{base}@jpg")).await;
        assert_flat(&r, "image/jpeg", (100, 100), FLAT, 6);
        let r = get(l.addr, &format!("{base}@webp")).await;
        assert_flat(&r, "image/webp", (100, 100), FLAT, 6);
        let r = get(
            l.addr,
            &format!("/insecure/rs:fit:80:80/plain/{source}@png"),
        )
        .await;
        assert_flat(&r, "image/png", (80, 60), FLAT, 3);
    }
    // No format asked and none in Accept: a JPEG XL source is answered in JPEG XL.
    need(larder::images::jxl::can_encode(), "libjxl", "libjxl0.7");
    let r = get(l.addr, "/insecure/rs:fit:40:40/plain/flat-160x120.jxl").await;
    assert_eq!(r.header("content-type"), Some("image/jxl"));
}

#[tokio::test(flavor = "multi_thread")]
async fn jxl_output_decodes_to_the_size_and_colours_asked() {
    need(larder::images::jxl::can_encode(), "libjxl", "libjxl0.7");
    let l = start("").await;
    // `@jxl`, lossy: the red half and the blue half where they were.
    let r = get(l.addr, "/insecure/rs:fill:60:40/plain/halves.png@jxl").await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("content-type"), Some("image/jxl"));
    assert_eq!(
        sniff::probe(&r.body).unwrap().format,
        sniff::ImageFormat::Jxl
    );
    let (w, h, px) = jxl_pixels(&r.body);
    assert_eq!((w, h), (60, 40));
    assert!(near(at(&px, w, 5, 20), [255, 0, 0], 8));
    assert!(near(at(&px, w, 55, 20), FLAT, 8));
    // `f:jxl` at q:100 is lossless: the colours exactly.
    let r = get(
        l.addr,
        "/insecure/f:jxl/q:100/rs:fill:60:40/plain/halves.png",
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let (w, h, px) = jxl_pixels(&r.body);
    assert_eq!((w, h), (60, 40));
    assert_eq!(at(&px, w, 5, 20), [255, 0, 0]);
    assert_eq!(at(&px, w, 55, 20), FLAT);
    // A JPEG XL source back out as JPEG XL, resized.
    let r = get(l.addr, "/insecure/rs:fill:50:50/plain/flat-160x120.jxl@jxl").await;
    assert_flat(&r, "image/jxl", (50, 50), FLAT, 6);
}

#[tokio::test(flavor = "multi_thread")]
async fn heic_sources_become_jpeg() {
    need(larder::images::heif::can_decode(), "libheif", "libheif1");
    let l = start("").await;
    let r = get(
        l.addr,
        "/insecure/rs:fill:100:100/plain/flat-160x120.heic@jpg",
    )
    .await;
    assert_flat(&r, "image/jpeg", (100, 100), FLAT, 8);
    let r = get(l.addr, "/insecure/rs:fit:80:80/plain/flat-160x120.heic@png").await;
    assert_flat(&r, "image/png", (80, 60), FLAT, 6);
    // No format asked: there is no HEIC encoder, so JPEG (as imgproxy answers).
    let r = get(l.addr, "/insecure/rs:fit:80:80/plain/flat-160x120.heic").await;
    assert_flat(&r, "image/jpeg", (80, 60), FLAT, 8);
}

#[tokio::test(flavor = "multi_thread")]
async fn pixel_limits_refuse_new_formats_from_their_header() {
    // 160×120 is 19,200 pixels.
    let l = start("max_pixels = 19000").await;
    for source in ["flat-160x120.jxl", "flat-160x120.heic"] {
        let r = get(
            l.addr,
            &format!("/insecure/rs:fit:10:10/plain/{source}@png"),
        )
        .await;
        assert_eq!(r.status, 422, "{source}");
        let body = String::from_utf8_lossy(&r.body);
        assert!(body.contains("19200 pixels"), "{source}: {body}");
    }
}

/// A 16×16 GIF of two frames (red, then `FLAT`).
fn two_frame_gif() -> Vec<u8> {
    let mut out = Vec::new();
    {
        let palette = [255, 0, 0, FLAT[0], FLAT[1], FLAT[2]];
        let mut e = gif::Encoder::new(&mut out, 16, 16, &palette).unwrap();
        for index in [0u8, 1] {
            let mut f = gif::Frame::from_indexed_pixels(16, 16, vec![index; 256], None);
            f.delay = 10;
            e.write_frame(&f).unwrap();
        }
    }
    out
}

/// imgproxy's AUTO_JXL (`auto_jxl`): `auto` answers JPEG XL to `Accept: image/jxl` before
/// AVIF and WebP, with `Vary: Accept`; without the setting the same request gets WebP, and an
/// animated source never gets JPEG XL (its first frame only): it keeps what it had.
#[tokio::test(flavor = "multi_thread")]
async fn auto_jxl_answers_jpeg_xl_to_clients_that_list_it() {
    need(larder::images::jxl::can_encode(), "libjxl", "libjxl0.7");
    let fetch = |addr: SocketAddr, path: &'static str| async move {
        let url = format!("http://{addr}{path}");
        let accept = [("accept", "image/jxl,image/webp,*/*")];
        common::send(&common::client(), "GET", &url, &accept, b"").await
    };
    let path = "/insecure/rs:fill:60:40/plain/halves.png";
    let off = start("default_format = \"auto\"").await;
    let r = fetch(off.addr, path).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("image/webp"));

    let on = start("default_format = \"auto\"\nauto_jxl = true").await;
    std::fs::write(on.root.path().join("anim.gif"), two_frame_gif()).unwrap();
    let r = fetch(on.addr, path).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("image/jxl"));
    assert_eq!(r.header("vary"), Some("Accept"));
    let (w, h, px) = jxl_pixels(&r.body);
    assert_eq!((w, h), (60, 40));
    assert!(near(at(&px, w, 55, 20), FLAT, 8));
    // Another Accept, another answer (not the JPEG XL result cached under the same URL).
    let plain = get(on.addr, path).await;
    assert_eq!(plain.header("content-type"), Some("image/png"));
    let r = fetch(on.addr, "/insecure/rs:fit:8:8/plain/anim.gif").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("image/webp"));
}

/// A 16×12 APNG of two frames, red then `FLAT`, with a green default image that is no frame.
fn two_frame_apng() -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut e = png::Encoder::new(&mut out, 16, 12);
        e.set_color(png::ColorType::Rgb);
        e.set_animated(2, 0).unwrap();
        e.set_sep_def_img(true).unwrap();
        let mut w = e.write_header().unwrap();
        w.write_image_data(&[0, 255, 0].repeat(16 * 12)).unwrap();
        for colour in [[255, 0, 0], FLAT] {
            w.set_frame_delay(1, 5).unwrap();
            w.write_image_data(&colour.repeat(16 * 12)).unwrap();
        }
        w.finish().unwrap();
    }
    out
}

/// An animated PNG keeps its frames into GIF and WebP (composited, resized alike), and gives
/// its default image to a still output, as imgproxy (which reads no APNG frames) does.
#[tokio::test(flavor = "multi_thread")]
async fn apng_frames_are_kept_into_gif_and_webp() {
    let l = start("").await;
    std::fs::write(l.root.path().join("anim.png"), two_frame_apng()).unwrap();
    for (ext, mime) in [("webp", "image/webp"), ("gif", "image/gif")] {
        let r = get(
            l.addr,
            &format!("/insecure/rs:fit:8:8/plain/anim.png@{ext}"),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("content-type"), Some(mime));
        let p = sniff::probe(&r.body).unwrap();
        assert_eq!((p.width, p.height, p.frames), (8, 6, 2), "{ext}");
    }
    let r = get(l.addr, "/insecure/rs:fit:8:8/plain/anim.png@png").await;
    assert_flat(&r, "image/png", (8, 6), [0, 255, 0], 0);
}
