//! Static files over real sockets: larder started in-process on 127.0.0.1:0, files in a temp
//! directory, requests written as raw bytes.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::*;

/// larder serving the files under `root` with two workers; `static_keys` are more lines of the
/// route's `static` table.
async fn start_with(root: &Path, static_keys: &str) -> (Larder, SocketAddr) {
    let larder = Larder::start(&static_files(root, static_keys, "workers = 2")).await;
    let addr = larder.addr;
    (larder, addr)
}

async fn start(root: &Path) -> (Larder, SocketAddr) {
    start_with(root, "").await
}

#[tokio::test(flavor = "multi_thread")]
async fn mime_types_and_charset() {
    let dir = tempfile::tempdir().unwrap();
    for (name, body) in [
        ("a.html", "<p>hi</p>"),
        ("b.css", "p{}"),
        ("c.js", "1"),
        ("d.json", "{}"),
        ("e.png", "png"),
        ("f.svg", "<svg/>"),
        ("g.unknownext", "x"),
        ("h.txt", "t"),
    ] {
        std::fs::write(dir.path().join(name), body).unwrap();
    }
    let (_h, addr) = start(dir.path()).await;
    let ct = |r: RawResponse| r.header("content-type").unwrap_or("").to_string();
    assert_eq!(
        ct(raw_request(addr, "GET", "/a.html", &[]).await),
        "text/html; charset=utf-8"
    );
    assert_eq!(
        ct(raw_request(addr, "GET", "/b.css", &[]).await),
        "text/css; charset=utf-8"
    );
    assert!(ct(raw_request(addr, "GET", "/c.js", &[]).await).ends_with("javascript; charset=utf-8"));
    assert_eq!(
        ct(raw_request(addr, "GET", "/d.json", &[]).await),
        "application/json; charset=utf-8"
    );
    assert_eq!(
        ct(raw_request(addr, "GET", "/e.png", &[]).await),
        "image/png"
    );
    assert_eq!(
        ct(raw_request(addr, "GET", "/f.svg", &[]).await),
        "image/svg+xml; charset=utf-8"
    );
    assert_eq!(
        ct(raw_request(addr, "GET", "/g.unknownext", &[]).await),
        "application/octet-stream"
    );
    let r = raw_request(addr, "GET", "/h.txt", &[]).await;
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    assert!(r.header("etag").unwrap().starts_with('"'));
    assert!(r.header("last-modified").is_some());
    assert_eq!(r.body, b"t");

    // HEAD: same headers, no body.
    let r = raw_request(addr, "HEAD", "/a.html", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("9"));
    assert!(r.body.is_empty());

    // Index file and directory redirect.
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/index.html"), "idx").unwrap();
    let r = raw_request(addr, "GET", "/sub", &[]).await;
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("/sub/"));
    let r = raw_request(addr, "GET", "/sub/", &[]).await;
    assert_eq!((r.status, r.text().as_str()), (200, "idx"));
    assert_eq!(raw_request(addr, "GET", "/a.html/", &[]).await.status, 404);
    assert_eq!(raw_request(addr, "POST", "/a.html", &[]).await.status, 405);
}

#[tokio::test(flavor = "multi_thread")]
async fn cache_control_per_route_and_extension() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.css"), "p{}").unwrap();
    std::fs::write(dir.path().join("b.html"), "x").unwrap();
    let h = Larder::start(&format!(
            r#"
[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  static = {{ root = "{}", cache_control = "no-cache", charset = "", cache_control_by_extension = {{ css = "public, max-age=31536000, immutable" }} }}
"#,
        dir.path().display()
    ))
    .await;
    let addr = h.addr;
    let r = raw_request(addr, "GET", "/a.css", &[]).await;
    assert_eq!(
        r.header("cache-control"),
        Some("public, max-age=31536000, immutable")
    );
    assert_eq!(r.header("content-type"), Some("text/css"));
    let r = raw_request(addr, "GET", "/b.html", &[]).await;
    assert_eq!(r.header("cache-control"), Some("no-cache"));

    let bad = larder::config::Config::parse(
        "[[listener]]\naddr = \"127.0.0.1:0\"\n  [[listener.route]]\n  static = { root = \"/\", cache_control = \"a\\nb\" }\n",
        "test",
    );
    assert!(bad.unwrap_err().to_string().contains("line 4"));
}

#[tokio::test(flavor = "multi_thread")]
async fn conditional_requests() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "hello").unwrap();
    let (_h, addr) = start(dir.path()).await;
    let r = raw_request(addr, "GET", "/a.txt", &[]).await;
    let etag = r.header("etag").unwrap().to_string();
    let lm = r.header("last-modified").unwrap().to_string();

    let inm = format!("If-None-Match: {etag}");
    let r = raw_request(addr, "GET", "/a.txt", &[&inm]).await;
    assert_eq!(r.status, 304);
    assert_eq!(r.header("etag"), Some(etag.as_str()));
    assert!(r.body.is_empty());
    let r = raw_request(
        addr,
        "GET",
        "/a.txt",
        &[&format!("If-None-Match: \"x\", W/{etag}")],
    )
    .await;
    assert_eq!(r.status, 304, "weak comparison for If-None-Match");
    let r = raw_request(addr, "GET", "/a.txt", &["If-None-Match: \"other\""]).await;
    assert_eq!(r.status, 200);
    let r = raw_request(
        addr,
        "GET",
        "/a.txt",
        &[&format!("If-Modified-Since: {lm}")],
    )
    .await;
    assert_eq!(r.status, 304);
    let r = raw_request(
        addr,
        "GET",
        "/a.txt",
        &["If-Modified-Since: Thu, 01 Jan 1970 00:00:01 GMT"],
    )
    .await;
    assert_eq!(r.status, 200);
    // If-None-Match wins over If-Modified-Since.
    let r = raw_request(
        addr,
        "GET",
        "/a.txt",
        &[
            "If-None-Match: \"other\"",
            &format!("If-Modified-Since: {lm}"),
        ],
    )
    .await;
    assert_eq!(r.status, 200);

    let r = raw_request(addr, "GET", "/a.txt", &["If-Match: \"other\""]).await;
    assert_eq!(r.status, 412);
    let r = raw_request(addr, "GET", "/a.txt", &[&format!("If-Match: {etag}")]).await;
    assert_eq!(r.status, 200);
    let r = raw_request(addr, "GET", "/a.txt", &[&format!("If-Match: W/{etag}")]).await;
    assert_eq!(r.status, 412, "strong comparison for If-Match");
    let r = raw_request(addr, "GET", "/a.txt", &["If-Match: *"]).await;
    assert_eq!(r.status, 200);
    let r = raw_request(
        addr,
        "GET",
        "/a.txt",
        &["If-Unmodified-Since: Thu, 01 Jan 1970 00:00:01 GMT"],
    )
    .await;
    assert_eq!(r.status, 412);
    let r = raw_request(
        addr,
        "GET",
        "/a.txt",
        &[&format!("If-Unmodified-Since: {lm}")],
    )
    .await;
    assert_eq!(r.status, 200);
    let r = raw_request(addr, "HEAD", "/a.txt", &[&inm]).await;
    assert_eq!(r.status, 304);
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + from)
}

/// The parts of a multipart/byteranges body: (Content-Range, bytes).
fn boundary_parts(r: &RawResponse) -> Vec<(String, Vec<u8>)> {
    let ct = r.header("content-type").unwrap();
    let boundary = ct.split("boundary=").nth(1).unwrap();
    let delim = format!("--{boundary}");
    let b = &r.body;
    let mut parts = Vec::new();
    let mut at = find(b, delim.as_bytes(), 0).unwrap();
    loop {
        let start = at + delim.len();
        if b[start..].starts_with(b"--") {
            break;
        }
        let head_end = find(b, b"\r\n\r\n", start).unwrap();
        let head = String::from_utf8_lossy(&b[start..head_end]).into_owned();
        let range = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Range: "))
            .unwrap()
            .to_string();
        let next = find(b, format!("\r\n{delim}").as_bytes(), head_end + 4).unwrap();
        parts.push((range, b[head_end + 4..next].to_vec()));
        at = next + 2;
    }
    parts
}

async fn check_ranges(addr: SocketAddr, path: &str, data: &[u8]) {
    let len = data.len();
    let r = raw_request(addr, "GET", path, &["Range: bytes=0-9"]).await;
    assert_eq!(r.status, 206);
    assert_eq!(
        r.header("content-range").unwrap(),
        format!("bytes 0-9/{len}")
    );
    assert_eq!(r.body, &data[..10]);

    let r = raw_request(addr, "GET", path, &["Range: bytes=-5"]).await;
    assert_eq!(r.status, 206);
    assert_eq!(
        r.header("content-range").unwrap(),
        format!("bytes {}-{}/{len}", len - 5, len - 1)
    );
    assert_eq!(r.body, &data[len - 5..]);

    let r = raw_request(addr, "GET", path, &["Range: bytes=10-"]).await;
    assert_eq!(r.body, &data[10..]);

    let r = raw_request(addr, "GET", path, &["Range: bytes=0-1, 20-24"]).await;
    assert_eq!(r.status, 206);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("multipart/byteranges; boundary="));
    assert_eq!(
        r.header("content-length").unwrap(),
        r.body.len().to_string()
    );
    let parts = boundary_parts(&r);
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0].0, format!("bytes 0-1/{len}"));
    assert_eq!(parts[0].1, &data[0..2]);
    assert_eq!(parts[1].0, format!("bytes 20-24/{len}"));
    assert_eq!(parts[1].1, &data[20..25]);

    // Overlapping ranges are merged into one.
    let r = raw_request(addr, "GET", path, &["Range: bytes=0-5,3-8"]).await;
    assert_eq!(r.status, 206);
    assert_eq!(
        r.header("content-range").unwrap(),
        format!("bytes 0-8/{len}")
    );
    assert_eq!(r.body, &data[..9]);

    let r = raw_request(addr, "GET", path, &[&format!("Range: bytes={len}-")]).await;
    assert_eq!(r.status, 416);
    assert_eq!(r.header("content-range").unwrap(), format!("bytes */{len}"));

    // An unknown unit or bad syntax is ignored.
    let r = raw_request(addr, "GET", path, &["Range: lines=1-2"]).await;
    assert_eq!((r.status, r.body.len()), (200, len));

    // If-Range with the current ETag applies the range; with an old one sends everything.
    let etag = raw_request(addr, "HEAD", path, &[])
        .await
        .header("etag")
        .unwrap()
        .to_string();
    let r = raw_request(
        addr,
        "GET",
        path,
        &["Range: bytes=0-3", &format!("If-Range: {etag}")],
    )
    .await;
    assert_eq!(r.status, 206);
    let r = raw_request(
        addr,
        "GET",
        path,
        &["Range: bytes=0-3", "If-Range: \"old\""],
    )
    .await;
    assert_eq!((r.status, r.body.as_slice()), (200, data));

    // HEAD with Range: no body.
    let r = raw_request(addr, "HEAD", path, &["Range: bytes=0-3"]).await;
    assert!(r.body.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn ranges_in_memory_and_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let small: Vec<u8> = (0..200u32).map(|i| b'a' + (i % 26) as u8).collect();
    let large: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(dir.path().join("small.bin"), &small).unwrap();
    std::fs::write(dir.path().join("large.bin"), &large).unwrap();
    let (_h, addr) = start_with(dir.path(), "max_memory_file_size = 100000").await;
    check_ranges(addr, "/small.bin", &small).await;
    check_ranges(addr, "/large.bin", &large).await;
    let r = raw_request(addr, "GET", "/large.bin", &["Range: bytes=100000-299999"]).await;
    assert_eq!(r.body, &large[100_000..]);
}

#[tokio::test(flavor = "multi_thread")]
async fn precompressed_siblings_by_accept_encoding() {
    let dir = tempfile::tempdir().unwrap();
    let plain = "p".repeat(1000);
    std::fs::write(dir.path().join("a.txt"), &plain).unwrap();
    std::fs::write(dir.path().join("a.txt.br"), "BR").unwrap();
    std::fs::write(dir.path().join("a.txt.zst"), "ZSTD").unwrap();
    std::fs::write(dir.path().join("a.txt.gz"), "GZIP!").unwrap();
    // The same set as a large file (streamed from disk).
    let big = "q".repeat(200_000);
    std::fs::write(dir.path().join("big.txt"), &big).unwrap();
    std::fs::write(dir.path().join("big.txt.gz"), "BIGGZ").unwrap();
    let (_h, addr) = start_with(dir.path(), "max_memory_file_size = 100000").await;

    let cases: [(&[&str], Option<&str>, &str); 7] = [
        (&[], None, plain.as_str()),
        (&["Accept-Encoding: gzip"], Some("gzip"), "GZIP!"),
        (
            &["Accept-Encoding: gzip, deflate, br, zstd"],
            Some("br"),
            "BR",
        ),
        (
            &["Accept-Encoding: br;q=0, gzip;q=0.5, zstd;q=0.1"],
            Some("zstd"),
            "ZSTD",
        ),
        (
            &["Accept-Encoding: br;q=0, zstd;q=0, gzip;q=1.0"],
            Some("gzip"),
            "GZIP!",
        ),
        (&["Accept-Encoding: *;q=0, identity"], None, plain.as_str()),
        (&["Accept-Encoding: deflate"], None, plain.as_str()),
    ];
    for (hdrs, enc, body) in cases {
        let r = raw_request(addr, "GET", "/a.txt", hdrs).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-encoding"), enc, "{hdrs:?}");
        assert_eq!(r.text(), body, "{hdrs:?}");
        assert_eq!(r.header("vary"), Some("Accept-Encoding"));
        assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
        if enc.is_some() {
            assert!(
                r.header("etag").unwrap().starts_with("W/"),
                "encoded ETag is weak"
            );
        }
    }
    let r = raw_request(addr, "GET", "/big.txt", &["Accept-Encoding: br, gzip"]).await;
    assert_eq!(
        (r.header("content-encoding"), r.text().as_str()),
        (Some("gzip"), "BIGGZ")
    );
    let r = raw_request(addr, "GET", "/big.txt", &[]).await;
    assert_eq!(
        (r.header("content-encoding"), r.body.len()),
        (None, 200_000)
    );

    // A compressible file without siblings gets its variants computed once, in the background.
    std::fs::write(
        dir.path().join("c.html"),
        "<p>compress me</p>\n".repeat(100),
    )
    .unwrap();
    let mut got = None;
    for _ in 0..100 {
        let r = raw_request(addr, "GET", "/c.html", &["Accept-Encoding: gzip"]).await;
        if r.header("content-encoding").is_some() {
            got = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = got.expect("gzip variant computed");
    assert!(r.body.len() < 1900);
}

#[tokio::test(flavor = "multi_thread")]
async fn changed_file_is_served_fresh_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.txt");
    std::fs::write(&p, "version one").unwrap();
    let (_h, addr) = start(dir.path()).await;
    let first = raw_request(addr, "GET", "/a.txt", &[]).await;
    assert_eq!(first.text(), "version one");
    std::fs::write(&p, "version two, longer").unwrap();
    std::fs::write(dir.path().join("new.txt"), "new").unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = raw_request(addr, "GET", "/a.txt", &[]).await;
    assert_eq!(r.text(), "version two, longer");
    assert_ne!(r.header("etag"), first.header("etag"));
    assert_eq!(raw_request(addr, "GET", "/new.txt", &[]).await.status, 200);
    std::fs::remove_file(&p).unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(raw_request(addr, "GET", "/a.txt", &[]).await.status, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn large_file_streams_with_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..24 * 1024 * 1024u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(dir.path().join("big.bin"), &data).unwrap();
    let (h, addr) = start(dir.path()).await;

    // Read slowly: the server must not buffer the file while the client lags.
    let mut s = Raw::connect(addr).await;
    s.write(b"GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n").await;
    let mut got = Vec::with_capacity(data.len() + 1024);
    let rss_before = rss_kib();
    let mut rss_peak = rss_before;
    let mut header_end = None;
    loop {
        let more = s
            .read_some(Duration::from_secs(30))
            .await
            .expect("bytes in time");
        let more = more.unwrap();
        let n = more.len();
        assert!(n > 0);
        got.extend_from_slice(&more);
        if header_end.is_none() {
            header_end = got.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
        }
        if let Some(e) = header_end {
            if got.len() - e >= data.len() {
                break;
            }
        }
        if got.len() % (4 * 1024 * 1024) < n {
            tokio::time::sleep(Duration::from_millis(20)).await;
            rss_peak = rss_peak.max(rss_kib());
        }
    }
    let e = header_end.unwrap();
    assert_eq!(&got[e..], &data[..]);
    // Nothing of it went into the memory cache.
    assert!(h.cache_bytes() < 1024 * 1024, "{}", h.cache_bytes());
    // The process (client buffer included, which holds the whole file) grew by little more
    // than what the client itself holds.
    let grown = rss_peak.saturating_sub(rss_before);
    assert!(grown < 24 * 1024 + 16 * 1024, "RSS grew by {grown} KiB");
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn traversal_corpus_is_refused() {
    let top = tempfile::tempdir().unwrap();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(top.path().join("secret.txt"), "TOPSECRET").unwrap();
    std::fs::write(root.join("public.txt"), "public").unwrap();
    std::fs::write(root.join(".hidden"), "TOPSECRET").unwrap();
    std::fs::create_dir(root.join(".git")).unwrap();
    std::fs::write(root.join(".git/config"), "TOPSECRET").unwrap();
    std::fs::create_dir(root.join("sub")).unwrap();
    std::os::unix::fs::symlink(top.path().join("secret.txt"), root.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(top.path(), root.join("linkdir")).unwrap();
    std::os::unix::fs::symlink(root.join("public.txt"), root.join("alias.txt")).unwrap();
    let (_h, addr) = start(&root).await;

    let attacks = [
        "/../secret.txt",
        "/sub/../../secret.txt",
        "/%2e%2e/secret.txt",
        "/%2E%2E/secret.txt",
        "/.%2e/secret.txt",
        "/%2e./secret.txt",
        "/sub/%2e%2e/%2e%2e/secret.txt",
        "/..%2fsecret.txt",
        "/..%2Fsecret.txt",
        "/sub%2f..%2f..%2fsecret.txt",
        "/%252e%252e/secret.txt",
        "/%252e%252e%252fsecret.txt",
        "/..%252fsecret.txt",
        "/%25252e%25252e/secret.txt",
        "/..%5csecret.txt",
        "/..%5Csecret.txt",
        "/sub\\..\\..\\secret.txt",
        "/..\\secret.txt",
        "/%5c..%5csecret.txt",
        "/..%255csecret.txt",
        "/%c0%ae%c0%ae/secret.txt",
        "/%c0%ae%c0%ae%c0%afsecret.txt",
        "/%e0%80%ae%e0%80%ae/secret.txt",
        "/..%c0%afsecret.txt",
        "/..%c1%9csecret.txt",
        "/%ef%bc%8e%ef%bc%8e/secret.txt",
        "/public.txt%00.html",
        "/%00",
        "/..%00/secret.txt",
        "/link.txt",
        "/linkdir/secret.txt",
        "/linkdir/",
        "/linkdir",
        "/.hidden",
        "/%2ehidden",
        "/.git/config",
        "/sub/../.git/config",
        "/./../secret.txt",
        "//secret.txt",
        "/secret.txt",
        "http://127.0.0.1/../secret.txt",
        "../secret.txt",
        "/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "/....//....//secret.txt",
        "/sub/",
    ];
    assert!(attacks.len() >= 30);
    // Targets go out as written: no client library normalizes them.
    for a in attacks {
        let r = raw_request(addr, "GET", a, &[]).await;
        assert!(
            matches!(r.status, 400 | 403 | 404),
            "{a}: status {}",
            r.status
        );
        assert!(!r.text().contains("TOPSECRET"), "{a} leaked");
    }
    // What is inside the root still works, through an inside symlink too.
    assert_eq!(
        raw_request(addr, "GET", "/public.txt", &[]).await.text(),
        "public"
    );
    assert_eq!(
        raw_request(addr, "GET", "/alias.txt", &[]).await.text(),
        "public"
    );
    assert_eq!(
        raw_request(addr, "GET", "/sub/../public.txt", &[])
            .await
            .status,
        400
    );

    // With follow_symlinks, links out are followed; dotfiles when allowed.
    let keys = "follow_symlinks = true\ndotfiles = true\ndirectory_listing = true";
    let (_h2, addr2) = start_with(&root, keys).await;
    assert_eq!(
        raw_request(addr2, "GET", "/link.txt", &[]).await.text(),
        "TOPSECRET"
    );
    assert_eq!(raw_request(addr2, "GET", "/.hidden", &[]).await.status, 200);
    assert_eq!(
        raw_request(addr2, "GET", "/../secret.txt", &[])
            .await
            .status,
        400
    );
    let listing = raw_request(addr2, "GET", "/", &[]).await;
    assert_eq!(listing.status, 200);
    assert!(listing.text().contains("public.txt"));
}

#[tokio::test(flavor = "multi_thread")]
async fn directory_listing_escapes_names() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("d")).unwrap();
    std::fs::write(dir.path().join("d/<script>alert(1)<script>.txt"), "x").unwrap();
    std::fs::write(dir.path().join("d/.secret"), "x").unwrap();
    let (_h, addr) = start(dir.path()).await;
    assert_eq!(
        raw_request(addr, "GET", "/d/", &[]).await.status,
        403,
        "listing is off by default"
    );
    let (_h2, addr2) = start_with(dir.path(), "directory_listing = true").await;
    let r = raw_request(addr2, "GET", "/d/", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let t = r.text();
    assert!(t.contains("&lt;script&gt;alert(1)&lt;script&gt;.txt"));
    assert!(t.contains("href=\"%3Cscript%3Ealert(1)%3Cscript%3E.txt\""));
    assert!(!t.contains("<script>"));
    assert!(!t.contains(".secret"));
}

#[tokio::test(flavor = "multi_thread")]
async fn two_thousand_keepalive_connections() {
    // Client and server share this process: two descriptors per connection.
    let limit = raise_open_files_limit();
    assert!(
        limit >= 4200,
        "open-files hard limit {limit} is too low for 2,000 connections in one process"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.html"), "<p>a</p>").unwrap();
    std::fs::write(dir.path().join("b.txt"), "b".repeat(5000)).unwrap();
    // Per-core layout with two workers (SO_REUSEPORT): connections land on both threads.
    let per_core = "workers = 2\nthreading = \"per-core\"";
    let h = Larder::start(&static_files(dir.path(), "", per_core)).await;
    let addr = h.addr;
    const N: usize = 2000;
    let mut conns = Vec::with_capacity(N);
    for _ in 0..N {
        conns.push(Raw::connect(addr).await);
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(N));
    let mut tasks = Vec::with_capacity(N);
    for mut s in conns {
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..3 {
                let path = if round == 1 { "/b.txt" } else { "/a.html" };
                s.write(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n"))
                    .await;
                let r = s.response().await;
                assert_eq!(r.status, 200);
                assert_eq!(r.body.len(), if round == 1 { 5000 } else { 8 });
                if round == 0 {
                    // Every connection is open at once before the next requests.
                    barrier.wait().await;
                }
            }
            s
        }));
    }
    let mut open = Vec::new();
    for t in tasks {
        open.push(
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    assert!(h.open_connections() >= N, "{}", h.open_connections());
    drop(open);
}

/// Counts the opens of files watched with inotify, to see how often larder reads them. Closes
/// are watched too: inotify merges identical successive events, and an open-close-open
/// sequence keeps the opens apart.
struct OpenCounter(std::os::fd::OwnedFd);

impl OpenCounter {
    fn watch(paths: &[&Path]) -> (OpenCounter, Vec<i32>) {
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: plain syscalls; the descriptor is owned by the returned OwnedFd.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify_init1");
        let counter = OpenCounter(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
        let wds = paths
            .iter()
            .map(|p| {
                let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
                let wd = unsafe {
                    libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_OPEN | libc::IN_CLOSE)
                };
                assert!(wd >= 0, "inotify_add_watch {}", p.display());
                wd
            })
            .collect();
        (counter, wds)
    }

    /// Opens seen so far, per watch descriptor.
    fn drain(&self) -> HashMap<i32, usize> {
        use std::os::fd::AsRawFd;
        let mut seen = HashMap::new();
        let mut buf = [0u8; 8192];
        loop {
            // SAFETY: reads into a local buffer of the given length.
            let n = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return seen;
            }
            let mut at = 0;
            while at + 16 <= n as usize {
                let wd = i32::from_ne_bytes(buf[at..at + 4].try_into().unwrap());
                let mask = u32::from_ne_bytes(buf[at + 4..at + 8].try_into().unwrap());
                let len = u32::from_ne_bytes(buf[at + 12..at + 16].try_into().unwrap()) as usize;
                if mask & libc::IN_OPEN != 0 {
                    *seen.entry(wd).or_default() += 1;
                }
                at += 16 + len;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_requests_share_one_read_of_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let text = "<p>cold page</p>\n".repeat(200);
    for name in ["one.html", "many.html"] {
        std::fs::write(dir.path().join(name), &text).unwrap();
    }
    let (_h, addr) = start(dir.path()).await;
    let (opens, wds) =
        OpenCounter::watch(&[&dir.path().join("one.html"), &dir.path().join("many.html")]);
    // What one first request costs in opens of its file...
    assert_eq!(raw_request(addr, "GET", "/one.html", &[]).await.status, 200);
    // ...200 first requests at once cost the same: they wait for one resolution and one read
    // (and one compression) instead of each doing their own.
    // All connections open first, then every request written at once, so that they reach
    // larder together.
    let mut conns = Vec::new();
    for _ in 0..200 {
        conns.push(Raw::connect(addr).await);
    }
    for s in &mut conns {
        s.write(b"GET /many.html HTTP/1.1\r\nHost: t\r\n\r\n").await;
    }
    for mut s in conns {
        let r = s.response().await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body.len(), text.len());
    }
    let seen = opens.drain();
    let one = seen.get(&wds[0]).copied().unwrap_or(0);
    let many = seen.get(&wds[1]).copied().unwrap_or(0);
    assert!(one >= 1, "the read of one.html was not seen");
    assert_eq!(
        many, one,
        "200 concurrent first requests opened the file {many} times"
    );
}
