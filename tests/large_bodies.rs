//! Large stored bodies (1 MiB and 10 MiB) end to end, from a real origin through larder's
//! cache: kept in memory files and sent with `sendfile` to plain HTTP/1.1 clients (issue #44,
//! src/mapped.rs, src/socket.rs), the same bytes over every other way out: keep-alive and
//! pipelined responses in sequence, HEAD, Range requests, gzip, a client that reads slowly or
//! goes away mid-body, a purge while a body is being sent, TLS (HTTP/1.1 and HTTP/2) and h2c.

mod common;

use std::time::Duration;

use common::*;

const MIB: u64 = 1 << 20;

/// The origin: `/1m` and `/10m` a MiB and ten of bytes larder does not compress, `/1m.txt` a
/// MiB of text (whose gzip variant, above 64 KiB too, larder builds), all cacheable.
async fn origin() -> Origin {
    Origin::start(|seen, _| {
        let reply = match seen.path.as_str() {
            "/1m.txt" => Reply::ok(text(MIB)).header("content-type", "text/plain"),
            "/10m" => Reply::ok(pattern(0, 10 * MIB - 1)),
            _ => Reply::ok(pattern(0, MIB - 1)),
        };
        let reply = if seen.path.ends_with(".txt") {
            reply
        } else {
            reply.header("content-type", "application/octet-stream")
        };
        reply.header("cache-control", "max-age=600")
    })
    .await
}

/// Deterministic text of `len` bytes that compresses.
fn text(len: u64) -> Vec<u8> {
    let line = b"larder sends large bodies without a copy: line ";
    let mut out = Vec::with_capacity(len as usize);
    let mut n = 0u64;
    while (out.len() as u64) < len {
        out.extend_from_slice(line);
        out.extend_from_slice(format!("{n}\n").as_bytes());
        n += 1;
    }
    out.truncate(len as usize);
    out
}

/// One plain listener and one TLS listener, proxying to the same origin (one cache); PURGE
/// allowed from loopback.
fn config(origin: &str, cert: &std::path::Path, key: &std::path::Path) -> String {
    format!(
        r#"
# Debug builds compress slowly: the fastest levels.
[compression]
gzip_level = 1
brotli_level = 0
zstd_level = 1

[admin]
purge_allow = ["127.0.0.0/8"]

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = "{origin}" }}

[[listener]]
addr = "127.0.0.1:0"
  [listener.tls]
  cert = {cert:?}
  key = {key:?}
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = "{origin}" }}
"#,
        cert = cert.display().to_string(),
        key = key.display().to_string(),
    )
}

struct Bed {
    _dir: tempfile::TempDir,
    ca: TestCa,
    origin: Origin,
    larder: Larder,
}

async fn bed() -> Bed {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.issue(dir.path(), "site", &["localhost", "site.test"]);
    let origin = origin().await;
    let larder = Larder::start(&config(&origin.url(), &cert, &key)).await;
    Bed {
        _dir: dir,
        ca,
        origin,
        larder,
    }
}

/// The host every request names (the TLS listener's certificate's): one cache key whatever the
/// listener.
const HOST: &str = "site.test";

/// GET `path` from the plain listener, for host [`HOST`].
async fn get_site(larder: &Larder, path: &str, headers: &[(&str, &str)]) -> Got {
    let mut headers = headers.to_vec();
    headers.push(("host", HOST));
    get(&client(), &larder.url(path), &headers).await
}

/// Fills `path` and waits for its gzip variant when `gzip` (built in the background).
async fn warm(larder: &Larder, path: &str, gzip: bool) {
    assert_eq!(get_site(larder, path, &[]).await.status, 200);
    if gzip {
        let mut built = false;
        for _ in 0..500 {
            let g = get_site(larder, path, &[("accept-encoding", "gzip")]).await;
            if g.header("content-encoding") == Some("gzip") {
                built = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(built, "no gzip variant of {path}");
    }
    assert_eq!(get_site(larder, path, &[]).await.cache(), "HIT");
}

fn request(path: &str, method: &str, extra: &str) -> String {
    format!("{method} {path} HTTP/1.1\r\nhost: {HOST}\r\n{extra}\r\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn hits_are_byte_exact_in_sequence_pipelined_and_head_over_plain_http1() {
    let b = bed().await;
    warm(&b.larder, "/1m", false).await;
    warm(&b.larder, "/10m", false).await;
    warm(&b.larder, "/1m.txt", true).await;
    let one = pattern(0, MIB - 1);
    let ten = pattern(0, 10 * MIB - 1);
    let sent_before = larder::socket::sent_zero_copy();

    // Keep-alive: one request after another on one connection.
    let mut raw = Raw::connect(b.larder.addr).await;
    for _ in 0..2 {
        raw.write(request("/1m", "GET", "")).await;
        let r = raw.response().await;
        assert_eq!((r.status, r.header("x-cache")), (200, Some("HIT")));
        assert!(r.body == one, "1 MiB byte-exact");
    }
    // Pipelined: every request written at once, the responses read in order.
    let mut all = String::new();
    for (path, method, extra) in [
        ("/10m", "GET", ""),
        ("/1m", "HEAD", ""),
        ("/1m", "GET", ""),
        ("/1m.txt", "GET", "accept-encoding: gzip\r\n"),
        ("/1m", "GET", "range: bytes=100-199\r\n"),
    ] {
        all.push_str(&request(path, method, extra));
    }
    raw.write(all).await;
    let r = raw.response().await;
    assert!(r.status == 200 && r.body == ten, "10 MiB byte-exact");
    let r = raw.head_response().await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("1048576"));
    let r = raw.response().await;
    assert!(r.body == one, "1 MiB after a HEAD");
    let r = raw.response().await;
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert!(
        decode(&r.body, Some("gzip")) == text(MIB),
        "the gzip variant decodes to the body"
    );
    let r = raw.response().await;
    assert_eq!((r.status, &r.body[..]), (206, &one[100..200]));

    // The bodies went with sendfile: at least the identity bodies' bytes (the gzip variant,
    // above 64 KiB too, adds its own).
    let sent = larder::socket::sent_zero_copy() - sent_before;
    assert!(sent >= 3 * MIB + 10 * MIB, "sent with sendfile: {sent}");
    assert_eq!(b.origin.hits(), 3, "every response above was a hit");
}

#[tokio::test(flavor = "multi_thread")]
async fn ranges_of_a_large_entry_are_right() {
    let b = bed().await;
    warm(&b.larder, "/1m", false).await;
    let one = pattern(0, MIB - 1);
    let mut raw = Raw::connect(b.larder.addr).await;
    for (range, first, last) in [
        ("bytes=0-0", 0, 0),
        ("bytes=1000-200999", 1000, 200_999),
        ("bytes=65536-", 65_536, MIB - 1),
        ("bytes=-300000", MIB - 300_000, MIB - 1),
    ] {
        raw.write(request("/1m", "GET", &format!("range: {range}\r\n")))
            .await;
        let r = raw.response().await;
        assert_eq!(r.status, 206, "{range}");
        assert_eq!(
            r.header("content-range"),
            Some(&*format!("bytes {first}-{last}/{MIB}"))
        );
        assert!(
            r.body == one[first as usize..=last as usize],
            "{range}: the right bytes"
        );
    }
    // Two ranges: a multipart body holding both parts.
    raw.write(request(
        "/1m",
        "GET",
        "range: bytes=10-19, 500000-599999\r\n",
    ))
    .await;
    let r = raw.response().await;
    assert_eq!(r.status, 206);
    let body = &r.body;
    let find = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
    assert!(find(&one[10..20]) && find(&one[500_000..600_000]));
    // Past the end: 416.
    raw.write(request("/1m", "GET", &format!("range: bytes={MIB}-\r\n")))
        .await;
    assert_eq!(raw.response().await.status, 416);
}

/// A client that reads slowly, and clients that go away mid-body (one after a part of the
/// body, one at once): no panic, their connections are freed, the entry serves the next
/// client whole. A purge while a body is on its way does not change the bytes being sent.
#[tokio::test(flavor = "multi_thread")]
async fn slow_and_vanishing_readers_and_a_purge_mid_body() {
    let b = bed().await;
    warm(&b.larder, "/10m", false).await;
    let ten = pattern(0, 10 * MIB - 1);

    // Slow: reads in small pieces with pauses while larder meets a full socket again and again.
    let mut slow = Raw::connect(b.larder.addr).await;
    slow.write(request("/10m", "GET", "")).await;
    let mut got = Vec::new();
    while got.len() < 2 * MIB as usize {
        let part = slow
            .read_some(Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        assert!(!part.is_empty(), "closed early");
        got.extend_from_slice(&part);
        tokio::task::yield_now().await;
    }
    // Purged while the rest is on its way: the stored body goes from the cache, the bytes
    // being sent stay what they were.
    let purged = send(
        &client(),
        "PURGE",
        &b.larder.url("/10m"),
        &[("host", HOST)],
        b"",
    )
    .await;
    assert_eq!(purged.status, 200, "{}", purged.text());
    let head_end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let rest = slow
        .read_until(|buf| got.len() + buf.len() >= head_end + ten.len())
        .await;
    got.extend_from_slice(&rest);
    assert!(
        got[head_end..] == ten[..],
        "the slow reader's body is byte-exact"
    );
    drop(slow);

    // Refilled; then readers that leave mid-body.
    warm(&b.larder, "/10m", false).await;
    for read_first in [MIB as usize, 0] {
        let mut gone = Raw::connect(b.larder.addr).await;
        gone.write(request("/10m", "GET", "")).await;
        if read_first > 0 {
            gone.read_until(|buf| buf.len() >= read_first).await;
        }
        drop(gone);
    }
    // Their connections are freed (larder's write fails, the connection ends), as are the
    // others' (closed by their clients).
    let mut freed = false;
    for _ in 0..500 {
        if b.larder.open_connections() == 0 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(freed, "open: {}", b.larder.open_connections());
    // The entry is intact for the next client.
    let r = get_site(&b.larder, "/10m", &[]).await;
    assert_eq!(r.cache(), "HIT");
    assert!(r.body == ten);
    assert_eq!(
        b.origin.hits(),
        2,
        "filled twice: before and after the purge"
    );
}

/// The same entries over TLS (HTTP/1.1 and HTTP/2, which copy) and h2c: the same bytes.
#[tokio::test(flavor = "multi_thread")]
async fn tls_and_http2_send_the_same_bytes() {
    let b = bed().await;
    warm(&b.larder, "/1m", false).await;
    warm(&b.larder, "/10m", false).await;
    warm(&b.larder, "/1m.txt", true).await;
    let one = pattern(0, MIB - 1);
    let ten = pattern(0, 10 * MIB - 1);
    let tls_addr = b.larder.addr_of(1);
    for alpn in [&b"h2"[..], b"http/1.1"] {
        let tls = Tls::connect(tls_addr, "site.test", b.ca.client_config(&[alpn]))
            .await
            .unwrap();
        let got = tls.get_all("site.test", &["/1m", "/10m", "/1m"], &[]).await;
        let what = String::from_utf8_lossy(alpn);
        assert!(got.iter().all(|g| g.cache() == "HIT"), "{what}");
        assert!(got[0].body == one && got[2].body == one, "{what}: 1 MiB");
        assert!(got[1].body == ten, "{what}: 10 MiB");
        let gz = https_get(
            tls_addr,
            "site.test",
            &b.ca,
            &[alpn],
            "/1m.txt",
            &[("accept-encoding", "gzip")],
        )
        .await;
        assert!(decode(&gz.body, Some("gzip")) == text(MIB), "{what}: gzip");
    }
    let mut h2c = h2_connection(b.larder.addr).await;
    for (path, range, want) in [
        ("/10m", None, &ten[..]),
        ("/1m", Some("bytes=5-"), &one[5..]),
    ] {
        let mut req = http::Request::get(format!("http://{HOST}{path}"));
        if let Some(r) = range {
            req = req.header("range", r);
        }
        let resp = h2c
            .send_request(req.body(Default::default()).unwrap())
            .await;
        let (parts, body) = resp.expect("h2c response").into_parts();
        let body = http_body_util::BodyExt::collect(body)
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(parts.headers["x-cache"], "HIT", "h2c {path}");
        assert!(body == want, "h2c {path} {range:?}");
    }
    assert_eq!(b.origin.hits(), 3);
}

/// A disk tier's counter, from the Prometheus text (`larder_cache_tier_{what}_total`).
fn disk_count(larder: &Larder, what: &str) -> u64 {
    let text = larder.metrics_text().expect("metrics (an admin listener)");
    let name = format!("larder_cache_tier_{what}_total{{tier=\"disk\"}} ");
    (text.lines())
        .find_map(|l| l.strip_prefix(name.as_str()))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// Large bodies read back from the disk tier, byte for byte: read once, the record is sent
/// from where it was read (a memory file would cost more than the copy into the socket it
/// saves, for one response); kept in memory (its second read, the doorkeeper), the body is put
/// in a memory file then, and its hits go out with `sendfile`.
#[tokio::test(flavor = "multi_thread")]
async fn a_large_disk_hit_is_mapped_once_memory_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let origin = origin().await;
    let toml = format!(
        r#"
[admin]
token = "large-bodies-admin-token"
listen = "127.0.0.1:0"

[cache]
max_size = "4MiB"
max_object_size = "2MiB"

[cache.disk]
dir = "{disk}"
max_size = "64MiB"
write = "evicted"

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = "{origin}" }}
"#,
        disk = dir.path().join("disk").display(),
        origin = origin.url(),
    );
    let larder = Larder::start(&toml).await;
    // `/1m`, then bodies of a MiB enough for memory to let it go, to the disk.
    assert_eq!(get_site(&larder, "/1m", &[]).await.cache(), "MISS");
    for i in 0..12 {
        let g = get_site(&larder, &format!("/other/{i}"), &[]).await;
        assert_eq!(g.status, 200);
    }
    assert!(!larder.has_entry(HOST, "/1m"), "memory let /1m go");
    let mut written = false;
    for _ in 0..500 {
        if disk_count(&larder, "writes") > 0 {
            written = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(written, "what memory let go is written to the disk");

    let fetched = origin.hits();
    let disk_hits = disk_count(&larder, "hits");
    for n in 1..=2 {
        let g = get_site(&larder, "/1m", &[]).await;
        assert_eq!(g.status, 200);
        assert_eq!(g.cache(), "HIT", "read {n}");
        assert!(g.body == pattern(0, MIB - 1), "byte-exact, read {n}");
        assert_eq!(disk_count(&larder, "hits"), disk_hits + n, "from the disk");
        assert_eq!(
            larder.has_entry(HOST, "/1m"),
            n == 2,
            "kept after read {n}?"
        );
    }
    let sent = larder::socket::sent_zero_copy();
    let g = get_site(&larder, "/1m", &[]).await;
    assert_eq!(g.cache(), "HIT");
    assert!(g.body == pattern(0, MIB - 1), "byte-exact from memory");
    assert_eq!(disk_count(&larder, "hits"), disk_hits + 2, "from memory");
    assert!(
        larder::socket::sent_zero_copy() - sent >= MIB,
        "sent with sendfile"
    );
    assert_eq!(origin.hits(), fetched, "never fetched again");
}
