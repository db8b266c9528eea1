//! Image formats over real sockets, through every grammar: animated GIF and WebP kept animated
//! (frames, each frame's colour, delays, loop count) when resized, their first frame for
//! outputs that cannot animate, frame bombs and animations over `max_animation_pixels` refused
//! before decoding, a negotiated AVIF of an animation made WebP (imgproxy's AUTO_AVIF), a
//! still source made into a GIF, progressive JPEG in and out
//! (`jpeg_progressive`), and SVG refused with 415.

mod common;

use std::net::SocketAddr;

use common::{encode_png, image_route, Got, ImageRoute};
use larder::images::sniff::{self, ImageFormat};

const RED: [u8; 4] = [255, 0, 0, 255];
const GREEN: [u8; 4] = [0, 255, 0, 255];
const BLUE: [u8; 4] = [0, 0, 255, 255];
const COLOURS: [[u8; 4]; 3] = [RED, GREEN, BLUE];
/// Each frame's delay in the sources, milliseconds. The last is the mean of the others: the
/// `webp` crate's encoder, which makes the WebP source, gives the last frame that (it ends
/// its stream with a timestamp libwebp refuses); larder's own keeps any delay.
const DELAYS: [u32; 3] = [100, 300, 200];

/// A 100×80 animated GIF: red, green, blue frames (each drawn whole), playing forever.
fn anim_gif() -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut enc = gif::Encoder::new(&mut out, 100, 80, &[]).unwrap();
        enc.set_repeat(gif::Repeat::Infinite).unwrap();
        for (c, d) in COLOURS.iter().zip(DELAYS) {
            let mut px = c.repeat(100 * 80);
            let mut f = gif::Frame::from_rgba(100, 80, &mut px);
            f.delay = (d / 10) as u16;
            enc.write_frame(&f).unwrap();
        }
    }
    out
}

/// A 100×80 animated WebP of the same frames, made with libwebp's encoder (the `webp` crate).
fn anim_webp() -> Vec<u8> {
    let config = webp::WebPConfig::new().unwrap();
    let mut enc = webp::AnimEncoder::new(100, 80, &config);
    enc.set_loop_count(0);
    let frames: Vec<Vec<u8>> = COLOURS.iter().map(|c| c.repeat(100 * 80)).collect();
    let mut t = 0;
    for (px, d) in frames.iter().zip(DELAYS) {
        enc.add_frame(webp::AnimFrame::from_rgba(px, 100, 80, t));
        t += d as i32;
    }
    enc.try_encode().unwrap().to_vec()
}

/// A GIF of `n` 1×1 frames.
fn frame_bomb(n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut enc = gif::Encoder::new(&mut out, 1, 1, &[0, 0, 0, 255, 255, 255]).unwrap();
        for i in 0..n {
            let f = gif::Frame {
                width: 1,
                height: 1,
                buffer: std::borrow::Cow::Owned(vec![(i % 2) as u8]),
                ..Default::default()
            };
            enc.write_frame(&f).unwrap();
        }
    }
    out
}

/// A 64×48 progressive JPEG, left half red, right half blue.
fn progressive_jpeg() -> Vec<u8> {
    let mut px = Vec::with_capacity(64 * 48 * 3);
    for _ in 0..48 {
        for x in 0..64 {
            px.extend_from_slice(if x < 32 { &[255, 0, 0] } else { &[0, 0, 255] });
        }
    }
    let mut c = turbojpeg::Compressor::new().unwrap();
    c.set_quality(95).unwrap();
    c.set_progressive(true).unwrap();
    let img = turbojpeg::Image {
        pixels: px.as_slice(),
        width: 64,
        pitch: 64 * 3,
        height: 48,
        format: turbojpeg::PixelFormat::RGB,
    };
    c.compress_to_owned(img).unwrap().to_vec()
}

const SVG: &str = "<?xml version=\"1.0\"?>\n<!-- icon -->\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"10\" height=\"10\"><script>alert(1)</script></svg>\n";

async fn start(extra: &str) -> ImageRoute {
    let files: [(&str, Vec<u8>); 6] = [
        ("anim.gif", anim_gif()),
        ("anim.webp", anim_webp()),
        ("bomb.gif", frame_bomb(1000)),
        ("prog.jpg", progressive_jpeg()),
        ("icon.svg", SVG.as_bytes().to_vec()),
        (
            "still.png",
            encode_png(
                40,
                40,
                png::ColorType::Rgb,
                png::BitDepth::Eight,
                &[0, 200, 0].repeat(1600),
            ),
        ),
    ];
    image_route(&files, extra, None).await
}

async fn send(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> Got {
    let url = format!("http://{addr}{path}");
    common::send(&common::client(), method, &url, &[], body).await
}

async fn get(addr: SocketAddr, path: &str) -> Got {
    send(addr, "GET", path, b"").await
}

/// An animation's frames as RGBA canvases, with their delays and how often it plays.
struct Frames {
    size: (u32, u32),
    frames: Vec<(Vec<u8>, u32)>,
    plays: Option<u32>,
}

impl Frames {
    /// The colour at the middle of frame `i`.
    fn middle(&self, i: usize) -> [u8; 4] {
        let (w, h) = self.size;
        let at = (((h / 2) * w + w / 2) * 4) as usize;
        self.frames[i].0[at..at + 4].try_into().unwrap()
    }
}

/// Decodes a GIF or WebP with the crates' own decoders (not larder's).
fn frames(b: &[u8]) -> Frames {
    match sniff::probe(b).unwrap().format {
        ImageFormat::Gif => {
            let mut o = gif::DecodeOptions::new();
            o.set_color_output(gif::ColorOutput::RGBA);
            let mut d = o.read_info(b).unwrap();
            let size = (u32::from(d.width()), u32::from(d.height()));
            let mut frames = Vec::new();
            while let Some(f) = d.read_next_frame().unwrap() {
                // Every frame larder writes is a full canvas.
                assert_eq!((u32::from(f.width), u32::from(f.height)), size);
                frames.push((f.buffer.to_vec(), u32::from(f.delay) * 10));
            }
            let plays = match d.repeat() {
                gif::Repeat::Infinite => None,
                gif::Repeat::Finite(n) => Some(u32::from(n) + 1),
            };
            Frames {
                size,
                frames,
                plays,
            }
        }
        ImageFormat::Webp => {
            let a = webp::AnimDecoder::new(b).decode().unwrap();
            let mut end = 0;
            let mut frames = Vec::new();
            let mut size = (0, 0);
            for f in a.get_frames(0..a.len()).unwrap() {
                size = (f.width(), f.height());
                let rgba: Vec<u8> = if f.get_layout().is_alpha() {
                    f.get_image().to_vec()
                } else {
                    f.get_image()
                        .chunks_exact(3)
                        .flat_map(|p| [p[0], p[1], p[2], 255])
                        .collect()
                };
                frames.push((rgba, (f.get_time_ms() - end) as u32));
                end = f.get_time_ms();
            }
            Frames {
                size,
                frames,
                plays: match a.loop_count {
                    0 => None,
                    n => Some(n),
                },
            }
        }
        f => panic!("not an animation format: {f:?}"),
    }
}

/// The pixel at (`x`, `y`) of an 8-bit RGB or RGBA PNG, as RGBA.
fn png_pixel(b: &[u8], x: usize, y: usize) -> [u8; 4] {
    let mut d = png::Decoder::new(std::io::Cursor::new(b))
        .read_info()
        .unwrap();
    let mut buf = vec![0; d.output_buffer_size().unwrap()];
    let info = d.next_frame(&mut buf).unwrap();
    let c = info.color_type.samples();
    let i = (y * info.width as usize + x) * c;
    [
        buf[i],
        buf[i + 1],
        buf[i + 2],
        if c == 4 { buf[i + 3] } else { 255 },
    ]
}

fn near(a: [u8; 4], b: [u8; 4]) -> bool {
    a.iter().zip(b).all(|(x, y)| x.abs_diff(y) <= 16)
}

/// Checks `r` is a 50×50 animation of `format` with the sources' three frames and colours;
/// the GIF's delays are exact (hundredths of a second), WebP's the same.
fn assert_animated(r: &Got, format: ImageFormat) {
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some(format.mime()));
    let p = sniff::probe(&r.body).unwrap();
    assert_eq!((p.format, p.width, p.height, p.frames), (format, 50, 50, 3));
    let f = frames(&r.body);
    assert_eq!(f.frames.len(), 3);
    for (i, c) in COLOURS.iter().enumerate() {
        assert!(
            near(f.middle(i), *c),
            "frame {i}: {:?} not {c:?}",
            f.middle(i)
        );
    }
    let delays: Vec<u32> = f.frames.iter().map(|(_, d)| *d).collect();
    assert_eq!(delays, DELAYS);
    assert_eq!(f.plays, None, "plays forever, as the source");
}

#[tokio::test(flavor = "multi_thread")]
async fn animated_gif_resized_keeps_its_frames() {
    let l = start("").await;
    // imgproxy's grammar: the source's format, and WebP.
    let r = get(l.addr, "/insecure/rs:fill:50:50/plain/anim.gif").await;
    assert_animated(&r, ImageFormat::Gif);
    let r = get(l.addr, "/insecure/rs:fill:50:50/plain/anim.gif@webp").await;
    assert_animated(&r, ImageFormat::Webp);
    // thumbor's grammar.
    let r = get(l.addr, "/unsafe/50x50/anim.gif").await;
    assert_animated(&r, ImageFormat::Gif);
    // Outputs that cannot animate get the first frame, as imgproxy's.
    let r = get(l.addr, "/insecure/rs:fill:50:50/plain/anim.gif@png").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let p = sniff::probe(&r.body).unwrap();
    assert_eq!((p.format, p.frames, p.width), (ImageFormat::Png, 1, 50));
    assert!(near(png_pixel(&r.body, 25, 25), RED), "the first frame");
}

#[tokio::test(flavor = "multi_thread")]
async fn animated_webp_resized_keeps_its_frames() {
    let l = start("").await;
    let r = get(l.addr, "/insecure/rs:fill:50:50/plain/anim.webp").await;
    assert_animated(&r, ImageFormat::Webp);
    let r = get(l.addr, "/unsafe/50x50/filters:format(gif)/anim.webp").await;
    assert_animated(&r, ImageFormat::Gif);
    let r = get(l.addr, "/insecure/rs:fill:50:50/plain/anim.webp@jpg").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(sniff::probe(&r.body).unwrap().format, ImageFormat::Jpeg);
}

/// imgproxy's AUTO_AVIF skips animations (AVIF cannot animate): a negotiated format for an
/// animated source is WebP where Accept lists it, else what a client listing neither gets (an
/// animated WebP as GIF, imgproxy's first preferred format that animates); `@avif` asked for
/// is the first frame, as imgproxy's. Each asked twice: the route's index of cached results
/// tells AVIF-and-WebP from AVIF-only clients apart.
#[tokio::test(flavor = "multi_thread")]
async fn negotiated_avif_of_an_animation_is_webp() {
    let l = start("default_format = \"auto\"").await;
    for round in 0..2 {
        for (source, accept, want, first) in [
            (
                "anim.gif",
                "image/avif,image/webp,*/*",
                ImageFormat::Webp,
                "MISS",
            ),
            (
                "anim.webp",
                "image/avif,image/webp,*/*",
                ImageFormat::Webp,
                "MISS",
            ),
            ("anim.gif", "image/avif,*/*", ImageFormat::Gif, "MISS"),
            ("anim.webp", "image/avif,*/*", ImageFormat::Gif, "MISS"),
            // The same GIF as the AVIF-only client's: one cached result.
            ("anim.webp", "*/*", ImageFormat::Gif, "HIT"),
        ] {
            let cache = if round == 0 { first } else { "HIT" };
            let path = format!("/insecure/rs:fill:50:50/plain/{source}");
            let url = format!("http://{}{path}", l.addr);
            let r = common::send(&common::client(), "GET", &url, &[("accept", accept)], b"").await;
            assert_animated(&r, want);
            assert_eq!(r.header("vary"), Some("Accept"), "{source} {accept}");
            assert_eq!(r.cache(), cache, "{source} {accept}");
        }
    }
    // A still source is AVIF as before, and an AVIF asked for is the first frame.
    let url = format!("http://{}/insecure/rs:fill:50:50/plain/still.png", l.addr);
    let r = common::send(
        &common::client(),
        "GET",
        &url,
        &[("accept", "image/avif")],
        b"",
    )
    .await;
    assert_eq!(r.header("content-type"), Some("image/avif"));
    let r = get(l.addr, "/insecure/rs:fill:50:50/plain/anim.gif@avif").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let p = sniff::probe(&r.body).unwrap();
    assert_eq!((p.format, p.frames, p.width), (ImageFormat::Avif, 1, 50));
    assert!(r.header("vary").is_none());
}

/// zimg's API transforms uploaded animations the same way.
#[tokio::test(flavor = "multi_thread")]
async fn zimg_api_keeps_animation() {
    let l = start("").await;
    let r = send(l.addr, "POST", "/upload", &anim_gif()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let md5 = r.field("md5");
    let r = get(l.addr, &format!("/{md5}?w=50&h=50&p=1")).await;
    assert_animated(&r, ImageFormat::Gif);
    let r = get(l.addr, &format!("/{md5}?w=50&h=50&p=1&f=webp")).await;
    assert_animated(&r, ImageFormat::Webp);
}

/// Limits come from the header, before any decoding: a thousand 1×1 frames are over
/// `max_frames` (100), and 3 frames of 100×80 over a `max_animation_pixels` of 20,000.
#[tokio::test(flavor = "multi_thread")]
async fn frame_bombs_and_large_animations_are_refused() {
    let l = start("max_animation_pixels = 20000").await;
    for path in [
        "/insecure/rs:fill:50:50/plain/bomb.gif",
        "/unsafe/50x50/bomb.gif",
    ] {
        let r = get(l.addr, path).await;
        assert_eq!(r.status, 422, "{path}: {}", r.text());
        assert!(r.text().contains("1000 frames"), "{}", r.text());
    }
    let r = get(l.addr, "/insecure/rs:fill:50:50/plain/anim.gif").await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(
        r.text().contains("24000 pixels in all its frames"),
        "{}",
        r.text()
    );
    let r = send(l.addr, "POST", "/upload", &frame_bomb(1000)).await;
    assert_eq!(r.status, 422, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread")]
async fn still_source_to_gif() {
    let l = start("").await;
    let r = get(l.addr, "/insecure/rs:fit:20:20/plain/still.png@gif").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("image/gif"));
    let f = frames(&r.body);
    assert_eq!((f.size, f.frames.len()), ((20, 20), 1));
    assert!(near(f.middle(0), [0, 200, 0, 255]), "{:?}", f.middle(0));
}

/// The start-of-frame markers of a JPEG: 0xC0 baseline, 0xC2 progressive.
fn sof_markers(b: &[u8]) -> Vec<u8> {
    let d = turbojpeg::read_header(b).unwrap();
    let mut found = Vec::new();
    let mut i = 2;
    while i + 4 <= b.len() && b[i] == 0xFF {
        let m = b[i + 1];
        if m == 0xDA {
            break;
        }
        if matches!(m, 0xC0..=0xC3) {
            found.push(m);
        }
        i += 2 + usize::from(u16::from_be_bytes([b[i + 2], b[i + 3]]));
    }
    assert!(d.width > 0);
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn progressive_jpeg_in_and_out() {
    // In: a progressive source decodes (shrunk on load) with its colours where they were.
    let l = start("").await;
    assert_eq!(sof_markers(&progressive_jpeg()), [0xC2]);
    let r = get(l.addr, "/insecure/rs:force:32:24/plain/prog.jpg@png").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(sniff::probe(&r.body).unwrap().width, 32);
    assert!(near(png_pixel(&r.body, 4, 12), RED));
    assert!(near(png_pixel(&r.body, 28, 12), BLUE));
    // Out: baseline by default, progressive with the route's setting.
    let r = get(l.addr, "/insecure/rs:fit:50:50/plain/still.png@jpg").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(sof_markers(&r.body), [0xC0]);
    let l = start("jpeg_progressive = true").await;
    for path in [
        "/insecure/rs:fit:50:50/plain/still.png@jpg",
        "/unsafe/50x50/filters:format(jpeg)/still.png",
    ] {
        let r = get(l.addr, path).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(sof_markers(&r.body), [0xC2], "{path}");
    }
    let r = send(
        l.addr,
        "POST",
        "/upload",
        &encode_png(8, 8, png::ColorType::Rgb, png::BitDepth::Eight, &[9; 192]),
    )
    .await;
    let md5 = r.field("md5");
    let r = get(l.addr, &format!("/{md5}?w=4&f=jpeg")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(sof_markers(&r.body), [0xC2]);
}

#[tokio::test(flavor = "multi_thread")]
async fn svg_is_refused_naming_the_format() {
    let l = start("").await;
    for path in [
        "/insecure/rs:fit:50:50/plain/icon.svg",
        "/unsafe/50x50/icon.svg",
        "/insecure/plain/icon.svg",
    ] {
        let r = get(l.addr, path).await;
        assert_eq!(r.status, 415, "{path}: {}", r.text());
        assert!(
            r.text().contains("SVG sources are not served"),
            "{}",
            r.text()
        );
    }
    let r = send(l.addr, "POST", "/upload", SVG.as_bytes()).await;
    assert_eq!(r.status, 415, "{}", r.text());
    assert!(r.text().contains("SVG"), "{}", r.text());
}
