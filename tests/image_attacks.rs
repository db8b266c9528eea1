//! Hostile inputs to the image proxy, each through a real larder: originals crafted to break a
//! decoder (an animated WebP with a damaged frame), sources crafted to leave what the route
//! allows (an `allow_sources` prefix left through a percent-encoded `/`, a NUL in a path under
//! `root`). Each test is a regression test of a defect found by trying it: it failed before
//! the fix it names.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine as _;
use common::{one_route, Got, Larder, Origin, Reply};
use larder::images::animation::{self, Animation, Frame};
use larder::images::codec::Raster;
use larder::images::sniff::ImageFormat;

/// larder with one image route reading originals from `root` (`extra`: more route keys).
async fn start(root: &std::path::Path, extra: &str) -> Larder {
    let keys = format!("root = \"{}\"\n{extra}", root.display());
    Larder::start(&one_route("", "images", &keys)).await
}

async fn get(addr: SocketAddr, path: &str) -> Got {
    let url = format!("http://{addr}{path}");
    common::send(&common::client(), "GET", &url, &[], b"").await
}

/// A 3-frame animated WebP, every frame different (libwebp keeps each one).
fn animated_webp() -> Vec<u8> {
    let frame = |i: u8| {
        let data = (0..64u32 * 48)
            .flat_map(|p| [(p % 64) as u8 * 4, i * 80, (p / 64) as u8 * 5, 255])
            .collect();
        Frame {
            image: Raster {
                width: 64,
                height: 48,
                channels: 4,
                data,
            },
            delay_ms: 100,
        }
    };
    let a = Animation {
        frames: (0..3).map(frame).collect(),
        plays: None,
    };
    animation::encode(&a, ImageFormat::Webp, 80).unwrap()
}

/// RIFF chunks of `b` (fourcc, payload), from `at`.
fn chunks(b: &[u8], mut at: usize) -> Vec<([u8; 4], Vec<u8>)> {
    let mut out = Vec::new();
    while at + 8 <= b.len() {
        let id: [u8; 4] = b[at..at + 4].try_into().unwrap();
        let len = u32::from_le_bytes(b[at + 4..at + 8].try_into().unwrap()) as usize;
        out.push((id, b[at + 8..at + 8 + len].to_vec()));
        at += 8 + len + (len & 1);
    }
    out
}

fn put_chunk(out: &mut Vec<u8>, id: &[u8; 4], payload: &[u8]) {
    out.extend_from_slice(id);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    if payload.len() % 2 == 1 {
        out.push(0);
    }
}

/// `webp` (animated) with the image data of its second frame cut to half: every chunk size
/// still right (the demuxer accepts the file), the frame's bitstream ends early (its decode
/// fails).
fn with_a_cut_frame(webp: &[u8]) -> Vec<u8> {
    let mut body = b"WEBP".to_vec();
    let mut frames = 0;
    for (id, payload) in chunks(webp, 12) {
        if &id != b"ANMF" {
            put_chunk(&mut body, &id, &payload);
            continue;
        }
        frames += 1;
        if frames != 2 {
            put_chunk(&mut body, &id, &payload);
            continue;
        }
        // ANMF: 16 bytes of frame header, then the frame's chunks (ALPH, VP8 or VP8L).
        let mut anmf = payload[..16].to_vec();
        for (sub, data) in chunks(&payload, 16) {
            let kept = match &sub {
                b"VP8 " | b"VP8L" => &data[..data.len() / 2],
                _ => &data[..],
            };
            put_chunk(&mut anmf, &sub, kept);
        }
        put_chunk(&mut body, b"ANMF", &anmf);
    }
    assert_eq!(frames, 3, "the encoder kept every frame");
    let mut out = b"RIFF".to_vec();
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// An animated WebP whose second frame cannot be decoded, asked for as JPEG (an output that
/// takes the first frame): its first frame is served. It spun forever on a pool worker before
/// (the `webp` crate's animation decoder retried the failing frame without end, and held
/// every frame decoded beyond what the pool reserved); now the first frame is decoded alone.
#[tokio::test(flavor = "multi_thread")]
async fn an_animated_webp_with_a_damaged_frame_is_refused_not_spun_on() {
    let root = tempfile::tempdir().unwrap();
    let good = animated_webp();
    std::fs::write(root.path().join("anim.webp"), &good).unwrap();
    std::fs::write(root.path().join("cut.webp"), with_a_cut_frame(&good)).unwrap();
    let l = start(root.path(), "").await;
    let r = get(l.addr, "/insecure/w:32/plain/anim.webp@jpg").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("image/jpeg"));
    // A guard, not a speed: before the fix this never answered.
    let r = tokio::time::timeout(
        Duration::from_secs(120),
        get(l.addr, "/insecure/w:32/plain/cut.webp@jpg"),
    )
    .await
    .expect("an answer (the damaged frame was retried forever)");
    assert_eq!(r.status, 200, "{}", r.text());
    // Kept as an animation, the damaged frame is an error.
    let r = get(l.addr, "/insecure/w:32/plain/cut.webp@webp").await;
    assert_eq!(r.status, 422, "{}", r.text());
    l.shutdown().await;
}

/// An `allow_sources` prefix (`/img/`) is not left through a percent-encoded `/` beside a dot
/// segment: `/img/..%2Fsecret.jpg` is `/secret.jpg` to a server that decodes before it resolves
/// dot segments (nginx does). It was fetched before (the dot-segment check split the path on
/// `/` before decoding it); now refused with 403 and never asked of the origin.
#[tokio::test(flavor = "multi_thread")]
async fn an_allowed_prefix_is_not_left_through_an_encoded_slash() {
    let origin = Origin::start(|_, _| Reply::ok("not an image")).await;
    let base = origin.url();
    let root = tempfile::tempdir().unwrap();
    let l = start(root.path(), &format!("allow_sources = [\"{base}/img/\"]")).await;
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    for path in [
        "/img/..%2Fsecret.jpg",
        "/img/..%2fsecret.jpg",
        "/img/a/..%2F..%2Fsecret.jpg",
        "/img/%2E%2E%2Fsecret.jpg",
        "/img/..%5Csecret.jpg",
        "/img/..\\secret.jpg",
    ] {
        let r = get(
            l.addr,
            &format!("/insecure/w:10/{}", b64(&format!("{base}{path}"))),
        )
        .await;
        assert_eq!(r.status, 403, "{path}: {}", r.text());
    }
    assert_eq!(origin.hits(), 0, "{:?}", origin.seen());
    // Under the prefix, an encoded `/` inside a name is fetched as written.
    let r = get(
        l.addr,
        &format!("/insecure/w:10/{}", b64(&format!("{base}/img/a%2Fb.jpg"))),
    )
    .await;
    assert_eq!(r.status, 415, "{}", r.text());
    assert_eq!(origin.seen()[0].path, "/img/a%2Fb.jpg");
    l.shutdown().await;
}

/// A NUL in a thumbor path under `root` (percent-encoded: imgproxy's grammar refuses control
/// characters itself), or a name or a path longer than a file's can be, is a missing image,
/// 404; they were 502 (the file system's error for the path was taken for a failing origin).
#[tokio::test(flavor = "multi_thread")]
async fn a_nul_in_a_root_path_is_not_found() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("a.jpg"), common::photo()).unwrap();
    let l = start(root.path(), "").await;
    assert_eq!(get(l.addr, "/unsafe/20x20/a.jpg").await.status, 200);
    let long = format!("/unsafe/20x20/{}.jpg", "a".repeat(300));
    let deep = format!(
        "/unsafe/20x20/{}a.jpg",
        format!("{}/", "d".repeat(200)).repeat(25)
    );
    for path in [
        "/unsafe/20x20/a.jpg%00",
        "/unsafe/20x20/a%00/b.jpg",
        &long,
        &deep,
    ] {
        let r = get(l.addr, path).await;
        assert_eq!(r.status, 404, "{path}: {}", r.text());
    }
    l.shutdown().await;
}

/// HEIC grids (the tiled images phones make): an honest 2×2 grid is decoded (it was refused
/// with 422: libheif refuses a grid whose side is *at* its size limit, and the limit given was
/// the probed side); one whose `ispe` says 320×240 while its grid makes 16000×12000 (10,000
/// tiles) is refused before libheif allocates it (the probe's size is what the limits and the
/// pool's memory see).
#[tokio::test(flavor = "multi_thread")]
async fn heic_grids_are_decoded_and_one_larger_than_its_header_is_refused() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(
        root.path().join("grid.heic"),
        common::heic_grid(2, 2, (320, 240), (320, 240)),
    )
    .unwrap();
    std::fs::write(
        root.path().join("lie.heic"),
        common::heic_grid(100, 100, (16000, 12000), (320, 240)),
    )
    .unwrap();
    let l = start(root.path(), "").await;
    let r = get(l.addr, "/insecure/w:32/plain/grid.heic@png").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let p = larder::images::sniff::probe(&r.body).unwrap();
    assert_eq!((p.format, p.width, p.height), (ImageFormat::Png, 32, 24));
    let r = get(l.addr, "/insecure/w:32/plain/lie.heic@png").await;
    assert_eq!(r.status, 422, "{}", r.text());
    l.shutdown().await;
}

/// imgproxy's signature of `path` (from its `/`) with key "secret" and salt "hello".
fn imgproxy_signed(path: &str) -> String {
    let sig = larder::images::imgproxy::sign(b"secret", b"hello", path, 32);
    format!("/{sig}{path}")
}

/// A key configured for one grammar is not walked around through the other: on a route whose
/// imgproxy URLs must be signed, thumbor's `unsafe` URLs are refused (403), and the other way
/// round. Before, the grammar without a key served unsigned URLs on a signed route.
#[tokio::test(flavor = "multi_thread")]
async fn a_signed_route_takes_no_unsigned_url_in_either_grammar() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("a.jpg"), common::photo()).unwrap();
    // "secret" and "hello" in hex.
    let keys = "imgproxy = { keys = [{ key = \"736563726574\", salt = \"68656c6c6f\" }] }";
    let l = start(root.path(), keys).await;
    let signed = imgproxy_signed("/w:20/plain/a.jpg");
    assert_eq!(get(l.addr, &signed).await.status, 200);
    assert_eq!(get(l.addr, "/insecure/w:20/plain/a.jpg").await.status, 403);
    let r = get(l.addr, "/unsafe/20x20/a.jpg").await;
    assert_eq!(r.status, 403, "{}", r.text());
    l.shutdown().await;

    let l = start(root.path(), "thumbor = { key = \"k\" }").await;
    let r = get(l.addr, "/insecure/w:20/plain/a.jpg").await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(get(l.addr, "/unsafe/20x20/a.jpg").await.status, 403);
    l.shutdown().await;

    // Neither grammar keyed: both serve unsigned URLs, as before.
    let l = start(root.path(), "").await;
    assert_eq!(get(l.addr, "/insecure/w:20/plain/a.jpg").await.status, 200);
    assert_eq!(get(l.addr, "/unsafe/20x20/a.jpg").await.status, 200);
    l.shutdown().await;
}

/// A PNG carrying `tiff` (an EXIF block) in its `eXIf` chunk.
fn png_with_exif(tiff: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, 64, 48);
        enc.set_color(png::ColorType::Rgb);
        let mut w = enc.write_header().unwrap();
        w.write_chunk(png::chunk::ChunkType(*b"eXIf"), tiff)
            .unwrap();
        w.write_image_data(&[90u8; 64 * 48 * 3]).unwrap();
    }
    out
}

/// An EXIF block with only a Copyright of `len` bytes.
fn copyright_exif(len: usize) -> Vec<u8> {
    let mut w = exif::experimental::Writer::new();
    let field = exif::Field {
        tag: exif::Tag::Copyright,
        ifd_num: exif::In::PRIMARY,
        value: exif::Value::Ascii(vec![vec![b'c'; len]]),
    };
    w.push_field(&field);
    let mut out = std::io::Cursor::new(Vec::new());
    w.write(&mut out, false).unwrap();
    out.into_inner()
}

/// The EXIF kept (`kcr`, the default, keeps the Copyright) is at most what one JPEG segment
/// holds: an original whose EXIF block is larger (only a crafted file's is) keeps none in its
/// result. Before, a 4 MB Copyright was read, copied, written again and put into a 20×15
/// thumbnail (PNG and WebP carry any size; JPEG dropped it), several copies of it held
/// outside what the pool reserved.
#[tokio::test(flavor = "multi_thread")]
async fn an_exif_block_larger_than_a_jpeg_segment_is_not_kept() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(
        root.path().join("small.png"),
        png_with_exif(&copyright_exif(100)),
    )
    .unwrap();
    let big = png_with_exif(&copyright_exif(4 << 20));
    std::fs::write(root.path().join("big.png"), big).unwrap();
    let l = start(root.path(), "").await;
    let read = |b: &[u8]| {
        exif::Reader::new()
            .read_from_container(&mut std::io::Cursor::new(b))
            .ok()
    };
    for ext in ["png", "webp"] {
        let r = get(l.addr, &format!("/insecure/w:20/plain/small.png@{ext}")).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(read(&r.body).is_some(), "{ext}: a small Copyright is kept");
        let r = get(l.addr, &format!("/insecure/w:20/plain/big.png@{ext}")).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.body.len() < 64 << 10, "{ext}: {} bytes", r.body.len());
        assert!(read(&r.body).is_none(), "{ext}");
    }
    l.shutdown().await;
}

/// `pix` over a block larger than 4096×4096 white pixels: the block's sum passes a `u32`
/// (4200² × 255). It overflowed (a panic, 500, in a debug build; wrong colours in a release
/// one) on a route whose `max_output_dimension` allows such a result; now the block is white.
#[tokio::test(flavor = "multi_thread")]
async fn pixelating_a_block_of_more_than_sixteen_million_pixels_keeps_its_colour() {
    let root = tempfile::tempdir().unwrap();
    let side = 4200u32;
    let white = common::encode_png(
        side,
        side,
        png::ColorType::Grayscale,
        png::BitDepth::Eight,
        &vec![255; (side * side) as usize],
    );
    std::fs::write(root.path().join("white.png"), white).unwrap();
    // The whole default budget: kept decodes (decoded_cache) would take an eighth of it.
    let l = start(
        root.path(),
        "max_output_dimension = 4200\ndecoded_cache = \"0\"",
    )
    .await;
    let r = get(l.addr, "/insecure/pix:4200/plain/white.png@png").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let mut d = png::Decoder::new(std::io::Cursor::new(&r.body[..]))
        .read_info()
        .unwrap();
    let mut px = vec![0; d.output_buffer_size().unwrap()];
    d.next_frame(&mut px).unwrap();
    assert!(px.iter().all(|&v| v == 255), "{:?}", &px[..8]);
    l.shutdown().await;
}

/// `jpeg` with `n` APP13 (IPTC) segments of `len` bytes each and `n` XMP segments, after its
/// SOI marker.
fn with_segments(jpeg: &[u8], n: usize, len: usize) -> Vec<u8> {
    let mut out = jpeg[..2].to_vec();
    let mut segment = |marker: u8, body: &[u8]| {
        out.extend_from_slice(&[0xFF, marker]);
        out.extend_from_slice(&(body.len() as u16 + 2).to_be_bytes());
        out.extend_from_slice(body);
    };
    for i in 0..n {
        let mut iptc = b"Photoshop 3.0\0".to_vec();
        iptc.resize(len, i as u8);
        segment(0xED, &iptc);
        let mut xmp = b"http://ns.adobe.com/xap/1.0/\0<x:xmpmeta/>".to_vec();
        xmp.resize(len, b' ');
        segment(0xE1, &xmp);
    }
    out.extend_from_slice(&jpeg[2..]);
    out
}

/// `sm:0` JPEG to JPEG keeps the original's XMP and IPTC as libvips (imgproxy) does: the first
/// segment of each. Every one was kept: an original of 200 such segments (12 MB) made a 20-pixel
/// thumbnail of 12 MB.
#[tokio::test(flavor = "multi_thread")]
async fn sm0_keeps_one_xmp_and_one_iptc_segment() {
    let root = tempfile::tempdir().unwrap();
    let jpeg = with_segments(&common::photo(), 100, 60_000);
    std::fs::write(root.path().join("meta.jpg"), jpeg).unwrap();
    let l = start(root.path(), "").await;
    let r = get(l.addr, "/insecure/w:20/sm:0/plain/meta.jpg@jpg").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.body.len() < 150_000, "{} bytes", r.body.len());
    let count = |needle: &[u8]| {
        r.body
            .windows(needle.len())
            .filter(|w| *w == needle)
            .count()
    };
    assert_eq!(count(b"Photoshop 3.0\0"), 1);
    assert_eq!(count(b"http://ns.adobe.com/xap/1.0/\0"), 1);
    l.shutdown().await;
}

/// An animated GIF repeating 65,535 times (NETSCAPE's largest count: 65,536 plays) made an
/// animated WebP: WebP's loop count is 16 bits, so libwebp refused 65,536 and the request
/// failed with 500; now the count is WebP's largest, 65,535.
#[tokio::test(flavor = "multi_thread")]
async fn a_gif_looping_65535_times_becomes_a_webp() {
    let mut gif_bytes = Vec::new();
    {
        let mut enc = gif::Encoder::new(&mut gif_bytes, 8, 8, &[]).unwrap();
        enc.set_repeat(gif::Repeat::Finite(u16::MAX)).unwrap();
        for c in [[200u8, 0, 0, 255], [0, 0, 200, 255]] {
            let mut px = c.repeat(64);
            let mut f = gif::Frame::from_rgba(8, 8, &mut px);
            f.delay = 10;
            enc.write_frame(&f).unwrap();
        }
    }
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("loops.gif"), gif_bytes).unwrap();
    let l = start(root.path(), "").await;
    let r = get(l.addr, "/insecure/w:8/plain/loops.gif@webp").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let p = larder::images::sniff::probe(&r.body).unwrap();
    assert_eq!((p.format, p.frames), (ImageFormat::Webp, 2));
    let limits = larder::images::codec::Limits {
        max_pixels: 64,
        max_dim: 8,
        max_frames: 2,
        max_avif_pixels: 64,
        max_animation_pixels: 128,
        ..larder::images::codec::Limits::DEFAULT
    };
    let a = animation::map_frames::<larder::images::codec::CodecError>(&r.body, &p, &limits, Ok)
        .unwrap();
    assert_eq!(a.plays, Some(65_535));
    l.shutdown().await;
}

/// An animated WebP of one frame (one `ANMF` chunk, as some converters write a still) is an
/// image like any other. It was 422: taken for a still, its decoder (libwebp's still decoder)
/// refuses animations.
#[tokio::test(flavor = "multi_thread")]
async fn an_animation_of_one_frame_is_decoded() {
    let mut body = b"WEBP".to_vec();
    let mut frames = 0;
    for (id, payload) in chunks(&animated_webp(), 12) {
        if &id == b"ANMF" {
            frames += 1;
            if frames > 1 {
                continue;
            }
        }
        put_chunk(&mut body, &id, &payload);
    }
    let mut one = b"RIFF".to_vec();
    one.extend_from_slice(&(body.len() as u32).to_le_bytes());
    one.extend_from_slice(&body);
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("one.webp"), one).unwrap();
    let l = start(root.path(), "").await;
    for ext in ["jpg", "png", "webp"] {
        let r = get(l.addr, &format!("/insecure/w:32/plain/one.webp@{ext}")).await;
        assert_eq!(r.status, 200, "{ext}: {}", r.text());
    }
    l.shutdown().await;
}

/// A `w`×`h` RGB PNG of one colour.
fn flat_png(w: u32, h: u32, rgb: [u8; 3]) -> Vec<u8> {
    let px = rgb.repeat((w * h) as usize);
    common::encode_png(w, h, png::ColorType::Rgb, png::BitDepth::Eight, &px)
}

/// The first pixel of a PNG (RGB or RGBA).
fn first_pixel(png_bytes: &[u8]) -> [u8; 3] {
    let mut r = png::Decoder::new(std::io::Cursor::new(png_bytes))
        .read_info()
        .unwrap();
    let mut buf = vec![0; r.output_buffer_size().unwrap()];
    r.next_frame(&mut buf).unwrap();
    [buf[0], buf[1], buf[2]]
}

/// Uploads the photo to the route at `addr` (zimg's API): its MD5.
async fn upload_photo(addr: SocketAddr) -> String {
    let url = format!("http://{addr}/upload");
    let ctype = [("content-type", "image/jpeg")];
    let up = common::send(&common::client(), "POST", &url, &ctype, common::photo()).await;
    assert_eq!(up.status, 200, "{}", up.text());
    up.field("md5")
}

async fn get_accepting(addr: SocketAddr, path: &str, accept: &str) -> Got {
    let url = format!("http://{addr}{path}");
    common::send(&common::client(), "GET", &url, &[("accept", accept)], b"").await
}

/// The index of cached results (`images::hits`) keyed a request by the one format its Accept
/// negotiated, JPEG XL first: but zimg's API never answers JPEG XL, nor does imgproxy's for an
/// animation, so `image/jxl,image/webp` (WebP made) and `image/jxl` alone (JPEG or the
/// source's format) shared an entry, and the second client was sent the WebP it never listed.
#[tokio::test(flavor = "multi_thread")]
async fn a_known_request_is_not_answered_in_a_format_its_accept_does_not_list() {
    assert!(
        larder::images::jxl::can_encode(),
        "libjxl (tests/provision installs libjxl0.7)"
    );
    let files = [("anim.webp", animated_webp())];
    let l = common::image_route(&files, "default_format = \"auto\"\nauto_jxl = true", None).await;
    let zimg = format!("/{}?w=40", upload_photo(l.addr).await);
    // Without WebP listed, the animation is GIF (imgproxy's preferred format for one) and the
    // zimg result JPEG: neither is the WebP made for the request listing it.
    let anim = "/insecure/rs:fit:16:16/plain/anim.webp";
    for (path, alone) in [(anim, "image/gif"), (zimg.as_str(), "image/jpeg")] {
        let r = get_accepting(l.addr, path, "image/jxl,image/webp").await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(r.header("content-type"), Some("image/webp"), "{path}");
        let r = get_accepting(l.addr, path, "image/jxl,image/webp").await;
        assert_eq!(r.cache(), "HIT", "{path}");
        let r = get_accepting(l.addr, path, "image/jxl").await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(r.header("content-type"), Some(alone), "{path}");
    }
    l.larder.shutdown().await;
}

/// A fetched original's id (the MD5 of its bytes, which names its results and its kept
/// decode) was read from a field of its stored entry that a revalidating origin's 304 could
/// replace: an origin answering `x-larder-original-id: <MD5 of another image>` had its own
/// pixels made and cached under the other image's results, served to that image's URLs.
#[tokio::test(flavor = "multi_thread")]
async fn a_304_cannot_give_its_original_another_originals_id() {
    let victim = flat_png(16, 16, [255, 0, 0]);
    let forged = larder::images::storage::Md5Hex::of(&victim)
        .as_str()
        .to_string();
    let clock = larder::clock::Clock::adjustable();
    let v = victim.clone();
    let origin = Origin::start_at(&clock, move |seen, _| match seen.path.as_str() {
        "/v.png" => Reply::ok(v.clone()).header("cache-control", "max-age=600"),
        _ if seen.headers.contains_key("if-none-match") => Reply::ok("")
            .status(304)
            .header("cache-control", "max-age=600")
            .header("x-larder-original-id", &forged),
        _ => Reply::ok(flat_png(16, 16, [0, 0, 255]))
            .header("cache-control", "max-age=1")
            .header("etag", "\"x1\""),
    })
    .await;
    let keys = format!("origin = \"{}\"", origin.url());
    let l = Larder::start_at(&one_route("", "images", &keys), clock).await;
    let r = get(l.addr, "/insecure/rs:fill:8:8/plain/x.png@png").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(first_pixel(&r.body), [0, 0, 255]);
    l.advance(Duration::from_secs(5));
    // Revalidated: the 304 names the red original's id.
    let r = get(l.addr, "/insecure/rs:fill:10:10/plain/x.png@png").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(first_pixel(&r.body), [0, 0, 255]);
    assert_eq!(origin.hits(), 2);
    let r = get(l.addr, "/insecure/rs:fill:10:10/plain/v.png@png").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        first_pixel(&r.body),
        [255, 0, 0],
        "the red original's own pixels"
    );
    l.shutdown().await;
}

/// Answered from the index of cached results, an `exp` URL still expires: its original stays
/// fresh (fetched, a max-age of 600 s), the URL is refused (403) once past its `exp`; the
/// route's key rotated out by a reload refuses it too.
#[tokio::test(flavor = "multi_thread")]
async fn a_known_request_expires_and_its_key_rotates_out() {
    let clock = larder::clock::Clock::adjustable();
    let origin = Origin::start_at(&clock, |_, _| {
        Reply::ok(flat_png(16, 16, [0, 128, 0])).header("cache-control", "max-age=600")
    })
    .await;
    let now = clock.now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let path = format!("/exp:{}/rs:fill:8:8/plain/a.png@png", now.as_secs() + 10);
    // "secret" and "hello" in hex; then "other" and "hello".
    let route = |key: &str| {
        let keys = format!(
            "origin = \"{}\"\nimgproxy = {{ keys = [{{ key = \"{key}\", salt = \"68656c6c6f\" }}] }}",
            origin.url()
        );
        one_route("", "images", &keys)
    };
    let l = Larder::start_at(&route("736563726574"), clock.clone()).await;
    let signed = imgproxy_signed;
    for _ in 0..2 {
        let r = get(l.addr, &signed(&path)).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(get(l.addr, &signed(&path)).await.cache(), "HIT");
    l.reload(&route("6f74686572")).unwrap();
    assert_eq!(get(l.addr, &signed(&path)).await.status, 403);
    l.reload(&route("736563726574")).unwrap();
    assert_eq!(get(l.addr, &signed(&path)).await.status, 200);
    assert_eq!(get(l.addr, &signed(&path)).await.status, 200);
    l.advance(Duration::from_secs(11));
    let r = get(l.addr, &signed(&path)).await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(origin.hits(), 1);
    l.shutdown().await;
}

/// An AVIF body decoded by larder's own decoder.
fn avif_decoded(b: &[u8]) -> Raster {
    let p = larder::images::sniff::probe(b).unwrap();
    assert_eq!(p.format, ImageFormat::Avif);
    let limits = larder::images::codec::Limits {
        max_dim: 65_535,
        max_frames: 1,
        max_avif_pixels: 50_000_000,
        max_animation_pixels: 50_000_000,
        ..larder::images::codec::Limits::DEFAULT
    };
    larder::images::codec::decode(b, &p, (p.width, p.height), false, (0.0, 1.0), &limits)
        .unwrap()
        .0
}

/// A `w`×`h` 16-bit RGBA PNG: opaque red left of `w / 2`, transparent right of it.
fn half_clear_png16(w: u32, h: u32) -> Vec<u8> {
    let px: Vec<u8> = (0..w * h)
        .flat_map(|i| {
            if i % w < w / 2 {
                [255, 255, 0, 0, 0, 0, 255, 255]
            } else {
                [0; 8]
            }
        })
        .collect();
    common::encode_png(w, h, png::ColorType::Rgba, png::BitDepth::Sixteen, &px)
}

/// AVIF through libaom at the sizes 4:2:0 handles worst (one pixel wide or high, odd sides:
/// chroma planes of half a pixel), from 16-bit sources with alpha and from gray ones (a
/// monochrome picture), up to a 4000-pixel side: each a picture of the size asked, its alpha
/// kept. What was tried for defects; none found.
#[tokio::test(flavor = "multi_thread")]
async fn libaom_takes_lines_odd_sides_alpha_and_16_bit_sources() {
    assert!(
        larder::images::aom::available().is_ok(),
        "libaom (tests/provision installs libaom3)"
    );
    let gray: Vec<u8> = (0..64u32 * 64).map(|i| (i % 251) as u8).collect();
    let files = [
        ("wide.png", half_clear_png16(4000, 3)),
        ("tall.png", half_clear_png16(2, 4000)),
        (
            "gray.png",
            common::encode_png(
                64,
                64,
                png::ColorType::Grayscale,
                png::BitDepth::Eight,
                &gray,
            ),
        ),
    ];
    let l = common::image_route(&files, "avif_encoder = \"aom\"", None).await;
    for (path, size, alpha) in [
        ("rs:force:4000:1/plain/wide.png", (4000, 1), true),
        ("rs:force:1:1/plain/wide.png", (1, 1), false),
        ("rs:force:2:1/plain/wide.png", (2, 1), true),
        ("rs:force:3:3/plain/wide.png", (3, 3), true),
        ("rs:force:1:4000/plain/tall.png", (1, 4000), false),
        ("rs:force:2:3999/plain/tall.png", (2, 3999), true),
        ("rs:force:1:9/plain/gray.png", (1, 9), false),
        ("rs:force:9:1/plain/gray.png", (9, 1), false),
        ("rs:force:33:17/plain/gray.png", (33, 17), false),
    ] {
        let r = get(l.addr, &format!("/insecure/{path}@avif")).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        let got = avif_decoded(&r.body);
        assert_eq!((got.width, got.height), size, "{path}");
        if alpha {
            assert_eq!(got.channels, 4, "{path}");
            let a = |x: u32| got.data[(x * 4 + 3) as usize];
            // A resampling filter's support crosses the edge at 2 and 3 pixels wide.
            assert!(a(0) > 200, "{path}: alpha {} at 0", a(0));
            let right = a(got.width - 1);
            assert!(right < 55, "{path}: alpha {right} at the right edge");
        }
    }
    l.larder.shutdown().await;
}

/// A result longer than its format's encoder writes (WebP's 16,383 pixels, libjpeg-turbo's
/// 65,500, GIF's 65,535, libaom's 65,536), which `mrd` (up to 1,000,000) or a route's
/// `max_output_dimension` (up to 65,535) allows, is refused before work with 400 naming the
/// format's limit; a negotiated WebP falls back to the format a client without it gets. Each
/// was decoded and resized, then failed in its encoder with 500.
#[tokio::test(flavor = "multi_thread")]
async fn a_result_longer_than_its_format_allows_is_refused_before_work() {
    let line = |w: u32| {
        let px: Vec<u8> = (0..w).flat_map(|i| [(i % 256) as u8, 0, 0]).collect();
        common::encode_png(w, 1, png::ColorType::Rgb, png::BitDepth::Eight, &px)
    };
    let files = [("line.png", line(70_000)), ("short.png", line(20_000))];
    let extra = "imgproxy = { allow_security_options = true }";
    let l = common::image_route(&files, extra, None).await;
    for (ext, max) in [
        ("jpg", "65500"),
        ("webp", "16383"),
        ("avif", "65536"),
        ("gif", "65535"),
    ] {
        let path = format!("/insecure/mrd:1000000/rs:force:70000:1/plain/line.png@{ext}");
        let r = get(l.addr, &path).await;
        assert_eq!(r.status, 400, "{ext}: {}", r.text());
        assert!(r.text().contains(max), "{ext}: {}", r.text());
    }
    for ext in ["png", "jxl"] {
        let path = format!("/insecure/mrd:1000000/rs:force:70000:1/plain/line.png@{ext}");
        assert_eq!(get(l.addr, &path).await.status, 200, "{ext}");
    }
    // Negotiated: WebP listed, the PNG a client without WebP gets.
    let r = get_accepting(
        l.addr,
        "/insecure/mrd:1000000/rs:force:20000:1/f:auto/plain/short.png",
        "image/webp",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("image/png"));
    l.larder.shutdown().await;
}

/// A reload changing how a route makes its results (here `default_quality`) makes new ones:
/// results are keyed by the route's options and the original, not by its settings, so the
/// results made under the old quality were served (HIT, the same bytes) for a year.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_changing_the_default_quality_makes_new_results() {
    let files = [("photo.jpg", common::photo())];
    let l = common::image_route(&files, "default_quality = 90", None).await;
    let toml = |quality: u32| {
        let keys = format!(
            "dir = \"{}\"\nroot = \"{}\"\ndefault_quality = {quality}",
            l.dir.path().display(),
            l.root.path().display()
        );
        one_route("", "images", &keys)
    };
    let zimg = format!("/{}?w=100&f=webp", upload_photo(l.addr).await);
    for path in [
        "/insecure/rs:fit:100:100/plain/photo.jpg@jpg",
        zimg.as_str(),
    ] {
        let fine = get(l.addr, path).await;
        assert_eq!(fine.status, 200, "{path}: {}", fine.text());
        l.larder.reload(&toml(20)).unwrap();
        let coarse = get(l.addr, path).await;
        assert_eq!(coarse.status, 200, "{path}: {}", coarse.text());
        assert_eq!(coarse.cache(), "MISS", "{path}");
        assert!(coarse.body.len() < fine.body.len(), "{path}");
        // Back to 90: the results made at 90.
        l.larder.reload(&toml(90)).unwrap();
        let again = get(l.addr, path).await;
        assert_eq!((again.cache(), &again.body), ("HIT", &fine.body), "{path}");
    }
    l.larder.shutdown().await;
}

/// The file name imgproxy's responses offer (`Content-Disposition`: `fn`, else the source's
/// name; `att`) is the request's: two sources of the same bytes (one id, fetched) and `raw`
/// or `skp` results (keyed `skp` alone) shared one entry, and the second URL was offered the
/// first one's name and disposition.
#[tokio::test(flavor = "multi_thread")]
async fn each_url_is_offered_its_own_file_name() {
    let origin =
        Origin::start(|_, _| Reply::ok(common::photo()).header("cache-control", "max-age=600"))
            .await;
    let keys = format!("origin = \"{}\"", origin.url());
    let l = Larder::start(&one_route("", "images", &keys)).await;
    for (path, offered) in [
        (
            "/insecure/rs:fit:50:50/plain/a.jpg@png",
            "inline; filename=\"a.png\"",
        ),
        (
            "/insecure/rs:fit:50:50/plain/b.jpg@png",
            "inline; filename=\"b.png\"",
        ),
        (
            "/insecure/raw:1/fn:one/plain/a.jpg",
            "inline; filename=\"one.jpg\"",
        ),
        (
            "/insecure/raw:1/fn:two/att:1/plain/a.jpg",
            "attachment; filename=\"two.jpg\"",
        ),
        (
            "/insecure/skp:jpg/plain/b.jpg",
            "inline; filename=\"b.jpg\"",
        ),
        (
            "/insecure/skp:jpg/plain/c.jpg",
            "inline; filename=\"c.jpg\"",
        ),
    ] {
        let r = get(l.addr, path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(r.header("content-disposition"), Some(offered), "{path}");
    }
    l.shutdown().await;
}

/// Two image routes of one origin keep its originals under one cache key: a route's
/// `max_source_size` held only for its own fetches, so an original another route (with a
/// larger limit) had fetched was served to it whatever its size. Refused (422) now.
#[tokio::test(flavor = "multi_thread")]
async fn a_routes_max_source_size_holds_for_an_original_another_route_fetched() {
    let origin =
        Origin::start(|_, _| Reply::ok(common::photo()).header("cache-control", "max-age=600"))
            .await;
    let toml = format!(
        r#"
[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/big/"
  [listener.route.images]
  origin = "{0}"
  [[listener.route]]
  path = "/small/"
  [listener.route.images]
  origin = "{0}"
  max_source_size = "1KiB"
"#,
        origin.url()
    );
    let l = Larder::start(&toml).await;
    let r = get(l.addr, "/small/insecure/w:20/plain/photo.jpg").await;
    assert_eq!(r.status, 422, "{}", r.text());
    let r = get(l.addr, "/big/insecure/w:20/plain/photo.jpg").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(l.addr, "/small/insecure/w:20/plain/photo.jpg").await;
    assert_eq!(r.status, 422, "{}", r.text());
    l.shutdown().await;
}

/// `larder_image_decoded_cache_bytes` adds up what every route's kept decoded originals hold:
/// a route a reload replaced (its kept originals freed with it) left its bytes in the gauge,
/// which grew with every reload. A route gone takes its bytes out.
#[tokio::test(flavor = "multi_thread")]
async fn a_replaced_route_takes_its_kept_originals_out_of_the_gauge() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("photo.jpg"), common::photo()).unwrap();
    let toml = |quality: u32| {
        let tables = "[admin]\ntoken = \"t\"\nlisten = \"127.0.0.1:0\"\n";
        let keys = format!(
            "root = {:?}\ndefault_quality = {quality}",
            root.path().display().to_string()
        );
        one_route(tables, "images", &keys)
    };
    let l = Larder::start(&toml(80)).await;
    let held = |l: &Larder| {
        let text = l.metrics_text().expect("metrics are counted");
        text.lines()
            .find_map(|l| l.strip_prefix("larder_image_decoded_cache_bytes "))
            .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
    };
    let r = get(l.addr, "/insecure/rs:fill:100:100/plain/photo.jpg@png").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(held(&l) > 100 * 100 * 3, "{}", held(&l));
    l.reload(&toml(81)).unwrap();
    // The old route goes once its last connection has: polled, not timed.
    for _ in 0..500 {
        if held(&l) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(held(&l), 0);
    l.shutdown().await;
}

/// `imgproxy.only_presets` leaves a URL no way to choose its own options: thumbor's grammar on
/// the same route (options by design, `unsafe/500x500/...`) is refused (403), and an empty
/// preset name (`//`, `:`, `thumb:`) is 400 as imgproxy answers it. Before, thumbor's URLs
/// were served any size and filter, and `/insecure//plain/SOURCE` served the original at its
/// full size though the route names only thumbnails.
#[tokio::test(flavor = "multi_thread")]
async fn only_presets_takes_no_options_through_thumbor_or_an_empty_name() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("a.jpg"), common::photo()).unwrap();
    let keys = "[listener.route.images.imgproxy]\nonly_presets = true\n\
                [listener.route.images.imgproxy.presets]\nthumb = \"rs:fill:50:50\"";
    let l = start(root.path(), keys).await;
    let r = get(l.addr, "/insecure/thumb/plain/a.jpg@png").await;
    assert_eq!(r.status, 200, "{}", r.text());
    for path in [
        "/insecure//plain/a.jpg@png",
        "/insecure/:/plain/a.jpg@png",
        "/insecure/thumb:/plain/a.jpg@png",
        "/insecure/:thumb/plain/a.jpg@png",
    ] {
        let r = get(l.addr, path).await;
        assert_eq!(r.status, 400, "{path}: {}", r.text());
    }
    for path in ["/unsafe/500x500/a.jpg", "/unsafe/a.jpg"] {
        let r = get(l.addr, path).await;
        assert_eq!(r.status, 403, "{path}: {}", r.text());
        assert!(r.text().contains("only_presets"), "{path}: {}", r.text());
    }
    l.shutdown().await;
}

/// imgproxy's security options at 0 keep the route's limits where the route lets URLs redefine
/// them: `msfs:0` ("no limit of its own") still meets `max_source_size` (422), `mrd:0`
/// `max_output_dimension` (400), and `maf:0` is refused (400), not read as no limit.
#[tokio::test(flavor = "multi_thread")]
async fn security_options_at_zero_keep_the_routes_limits() {
    let root = tempfile::tempdir().unwrap();
    let photo = common::photo();
    std::fs::write(root.path().join("a.jpg"), &photo).unwrap();
    let keys = format!(
        "max_source_size = {}\nmax_output_dimension = 100\n\
         imgproxy = {{ allow_security_options = true }}",
        photo.len() - 1
    );
    let l = start(root.path(), &keys).await;
    for (path, status) in [
        ("/insecure/msfs:0/rs:fit:50:50/plain/a.jpg", 422),
        ("/insecure/maf:0/rs:fit:50:50/plain/a.jpg", 400),
    ] {
        let r = get(l.addr, path).await;
        assert_eq!(r.status, status, "{path}: {}", r.text());
    }
    l.shutdown().await;
    let keys = "max_output_dimension = 100\nimgproxy = { allow_security_options = true }";
    let l = start(root.path(), keys).await;
    let r = get(l.addr, "/insecure/mrd:0/rs:fit:50:50/plain/a.jpg").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(l.addr, "/insecure/mrd:0/rs:fit:500:500/plain/a.jpg").await;
    assert_eq!(r.status, 400, "{}", r.text());
    l.shutdown().await;
}

/// A watermark file replaced on disk is seen at the next reload: the results carrying the old
/// mark are not served for the new one (the mark's pixels are part of the results' keys).
#[tokio::test(flavor = "multi_thread")]
async fn a_watermark_replaced_on_disk_makes_new_results_at_a_reload() {
    let files = [("photo.jpg", common::photo())];
    let l = common::image_route(&files, "", None).await;
    let mark = l.root.path().join("mark.png");
    std::fs::write(&mark, flat_png(32, 32, [255, 0, 0])).unwrap();
    let toml = format!(
        "root = \"{}\"\nwatermark = \"{}\"",
        l.root.path().display(),
        mark.display()
    );
    let toml = one_route("", "images", &toml);
    l.larder.reload(&toml).unwrap();
    let path = "/insecure/rs:fit:64:64/wm:1:ce/plain/photo.jpg@png";
    let red = get(l.addr, path).await;
    assert_eq!(red.status, 200, "{}", red.text());
    std::fs::write(&mark, flat_png(32, 32, [0, 0, 255])).unwrap();
    l.larder.reload(&toml).unwrap();
    let blue = get(l.addr, path).await;
    assert_eq!(blue.status, 200, "{}", blue.text());
    assert_eq!(blue.cache(), "MISS");
    assert_ne!(blue.body, red.body);
    l.larder.shutdown().await;
}
