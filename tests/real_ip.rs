//! The client's real address (issue #41 item 2): a PROXY protocol header (v1, v2; from a real
//! haproxy with `send-proxy-v2`, and hand-built ones naming chosen addresses) on a listener
//! with `proxy_protocol`, over HTTP/1.1, h2c and TLS; a connection without one is closed; the
//! fields of trusted proxies (`[listener.real_ip]`: X-Forwarded-For, Forwarded) and what the
//! origin is then told. The address is read where every address-based part reads it: the access
//! log's `{remote}`, and the X-Forwarded-For the origin sees.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;

/// The lines of `path` once it has at least `n` (waits up to 5 s).
async fn lines(path: &Path, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let l: Vec<String> = text.lines().map(String::from).collect();
        if l.len() >= n || Instant::now() > deadline {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The log's lines (`{remote} {uri} {status}`) once it has `n`, each URI as its path (an
/// HTTP/2 request's target is absolute).
async fn logged(path: &Path, n: usize) -> Vec<String> {
    let path_of = |uri: &str| match uri.split_once("://") {
        Some((_, rest)) => rest[rest.find('/').unwrap_or(rest.len())..].to_string(),
        None => uri.to_string(),
    };
    (lines(path, n).await.iter())
        .map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            format!("{} {} {}", w[0], path_of(w[1]), w[2])
        })
        .collect()
}

/// One listener proxying to `origin`, each request logged as `{remote} {uri} {status}` in
/// `log`; `listener` holds more keys of the `[[listener]]` table and its subtables.
fn config(origin: &str, log: &Path, listener: &str) -> String {
    format!(
        r#"
[access_log]
path = {:?}
format = "{{remote}} {{uri}} {{status}}"

[[listener]]
addr = "127.0.0.1:0"
{listener}
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = "{origin}" }}
"#,
        log.display().to_string()
    )
}

/// A v2 PROXY header (command 1: PROXY, 0: LOCAL) from `source` to `destination`, built by
/// the `ppp` crate.
fn v2(command: u8, source: &str, destination: SocketAddr) -> Vec<u8> {
    let source: SocketAddr = source.parse().unwrap();
    ppp::v2::Builder::with_addresses(
        0x20 | command,
        ppp::v2::Protocol::Stream,
        (source, destination),
    )
    .build()
    .unwrap()
}

/// The X-Forwarded-For the origin saw for `path`.
fn forwarded_for(origin: &Origin, path: &str) -> String {
    let seen = origin.seen();
    let s = seen
        .iter()
        .find(|s| s.path == path)
        .unwrap_or_else(|| panic!("{path} never reached the origin"));
    s.headers["x-forwarded-for"].to_str().unwrap().to_string()
}

/// A GET of `path` written on `raw` (after whatever was written before), its response's text.
async fn get_on(raw: &mut Raw, path: &str, fields: &str) -> RawResponse {
    raw.write(format!("GET {path} HTTP/1.1\r\nHost: t\r\n{fields}\r\n"))
        .await;
    raw.response().await
}

async fn origin() -> Origin {
    Origin::start(|_, _| Reply::ok("hello")).await
}

/// A connection from `source` (a loopback address) to `to`.
async fn tcp_from(source: &str, to: SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(source.parse().unwrap(), 0))
        .unwrap();
    socket.connect(to).await.unwrap()
}

/// haproxy in TCP mode in front of larder, sending PROXY v2: the client haproxy saw (from
/// 127.0.0.2 and 127.0.0.3, while haproxy itself connects from 127.0.0.1) is the one larder logs
/// and tells the origin, over HTTP/1.1 and over h2c alike.
#[tokio::test(flavor = "multi_thread")]
async fn haproxy_send_proxy_v2_names_its_client() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let origin = origin().await;
    let larder = Larder::start(&config(&origin.url(), &log, "proxy_protocol = true")).await;
    let haproxy = Haproxy::start(&format!(
        "global\n  maxconn 64\n\
         defaults\n  mode tcp\n  timeout connect 2s\n  timeout client 10s\n  timeout server 10s\n\
         frontend front\n  bind {{listen}}\n  default_backend larder\n\
         backend larder\n  server l {} send-proxy-v2\n",
        larder.addr
    ));
    let mut raw = Raw::from(tcp_from("127.0.0.2", haproxy.addr).await);
    let r = get_on(&mut raw, "/h1", "").await;
    assert_eq!((r.status, r.text().as_str()), (200, "hello"));
    // HTTP/2 with prior knowledge through the same haproxy, from another address.
    let stream = tcp_from("127.0.0.3", haproxy.addr).await;
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get(format!("http://{}/h2", larder.addr))
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let resp = h2.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let l = logged(&log, 2).await;
    assert_eq!(l, ["127.0.0.2 /h1 200", "127.0.0.3 /h2 200"]);
    assert_eq!(forwarded_for(&origin, "/h1"), "127.0.0.2");
    assert_eq!(forwarded_for(&origin, "/h2"), "127.0.0.3");
}

/// Hand-built headers name addresses no loopback client could have: v2 and v1, IPv4 and IPv6;
/// a v2 LOCAL header (a health check) keeps the socket's peer; a connection that begins
/// without a header is closed unanswered.
#[tokio::test(flavor = "multi_thread")]
async fn proxy_headers_name_the_client_and_a_connection_without_one_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let origin = origin().await;
    let admin = "[admin]\ntoken = \"metrics-token\"\nlisten = \"127.0.0.1:0\"\n";
    let proxied = config(&origin.url(), &log, "proxy_protocol = true");
    let larder = Larder::start(&format!("{admin}{proxied}")).await;
    let mut raw = Raw::connect(larder.addr).await;
    raw.write(v2(1, "203.0.113.7:4711", larder.addr)).await;
    // Two requests on the connection: the header is read once, at its start.
    for path in ["/v2", "/v2-again"] {
        assert_eq!(get_on(&mut raw, path, "").await.status, 200);
    }
    let mut raw = Raw::connect(larder.addr).await;
    // The header and the request in one write, as a proxy sends them.
    raw.write(format!(
        "PROXY TCP4 198.51.100.20 127.0.0.1 5555 {}\r\nGET /v1 HTTP/1.1\r\nHost: t\r\n\r\n",
        larder.addr.port()
    ))
    .await;
    assert_eq!(raw.response().await.status, 200);
    let mut raw = Raw::connect(larder.addr).await;
    raw.write(v2(1, "[2001:db8::7]:4711", "[::1]:80".parse().unwrap()))
        .await;
    assert_eq!(get_on(&mut raw, "/v2-ipv6", "").await.status, 200);
    let mut raw = Raw::connect(larder.addr).await;
    raw.write(v2(0, "203.0.113.99:1", larder.addr)).await;
    assert_eq!(get_on(&mut raw, "/local", "").await.status, 200);
    // No header: closed, nothing answered, nothing logged.
    let mut raw = Raw::connect(larder.addr).await;
    raw.write("GET /no-header HTTP/1.1\r\nHost: t\r\n\r\n")
        .await;
    assert!(raw.read_to_end(Duration::from_secs(5)).await.is_empty());
    // A header that is not valid: the same.
    let mut raw = Raw::connect(larder.addr).await;
    raw.write("PROXY TCP4 not-an-address 127.0.0.1 1 2\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .await;
    assert!(raw.read_to_end(Duration::from_secs(5)).await.is_empty());
    // Both counted (each before its connection was closed).
    let metrics = larder.metrics_text().unwrap();
    assert!(
        metrics.contains("larder_proxy_protocol_refused_total 2"),
        "{metrics}"
    );
    let l = logged(&log, 5).await;
    assert_eq!(
        l,
        [
            "203.0.113.7 /v2 200",
            "203.0.113.7 /v2-again 200",
            "198.51.100.20 /v1 200",
            "2001:db8::7 /v2-ipv6 200",
            "127.0.0.1 /local 200",
        ]
    );
    assert_eq!(forwarded_for(&origin, "/v2"), "203.0.113.7");
    assert_eq!(forwarded_for(&origin, "/v1"), "198.51.100.20");
    assert!(!origin.seen().iter().any(|s| s.path == "/no-header"));
}

/// On a TLS listener the header comes before the handshake.
#[tokio::test(flavor = "multi_thread")]
async fn a_proxy_header_precedes_the_tls_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let origin = origin().await;
    let ca = TestCa::new();
    let (cert, key) = ca.issue(dir.path(), "site", &["localhost"]);
    let tls = format!(
        "proxy_protocol = true\n  [listener.tls]\n  cert = {:?}\n  key = {:?}\n",
        cert.display().to_string(),
        key.display().to_string()
    );
    let larder = Larder::start(&config(&origin.url(), &log, &tls)).await;
    for (alpn, source) in [
        (&b"http/1.1"[..], "203.0.113.8:1"),
        (b"h2", "203.0.113.9:1"),
    ] {
        let mut tcp = tokio::net::TcpStream::connect(larder.addr).await.unwrap();
        tcp.write_all(&v2(1, source, larder.addr)).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let stream = tokio_rustls::TlsConnector::from(ca.client_config(&[alpn]))
            .connect(name, tcp)
            .await
            .unwrap();
        let got = Tls { stream }.get_all("localhost", &["/tls"], &[]).await;
        assert_eq!(got[0].status, 200);
    }
    assert_eq!(
        logged(&log, 2).await,
        ["203.0.113.8 /tls 200", "203.0.113.9 /tls 200"]
    );
}

/// Over HTTP/3 (QUIC has no PROXY header) a trusted peer's X-Forwarded-For names the client as
/// over TCP, and the origin is told the scheme was https.
#[tokio::test(flavor = "multi_thread")]
async fn http3_reads_a_trusted_proxys_fields() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let origin = origin().await;
    let ca = TestCa::new();
    let (cert, key) = ca.issue(dir.path(), "site", &["site.test"]);
    let listener = format!(
        "  [listener.tls]\n  cert = {:?}\n  key = {:?}\n  http3 = true\n  [listener.real_ip]\n  from = [\"127.0.0.1\"]\n",
        cert.display().to_string(),
        key.display().to_string()
    );
    let larder = Larder::start(&config(&origin.url(), &log, &listener)).await;
    let mut h3 = H3::connect(larder.addr, "site.test", &ca).await;
    let xff = [("x-forwarded-for", "198.51.100.30")];
    let got = h3.send("GET", "https://site.test/h3", &xff, b"").await;
    assert_eq!(got.status, 200);
    assert_eq!(logged(&log, 1).await, ["198.51.100.30 /h3 200"]);
    assert_eq!(forwarded_for(&origin, "/h3"), "198.51.100.30, 127.0.0.1");
    let seen = origin.seen();
    assert_eq!(seen[0].headers["x-forwarded-proto"], "https");
}

/// `[listener.real_ip]` as nginx's realip with `real_ip_recursive on`: from a trusted peer the
/// field is walked right to left past the trusted proxies, and the origin gets the chain with
/// the peer appended; from a peer not trusted the field is ignored, and not passed on.
#[tokio::test(flavor = "multi_thread")]
async fn trusted_proxies_fields_name_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let origin = origin().await;
    let real_ip = "  [listener.real_ip]\n  from = [\"10.0.0.0/8\", \"127.0.0.1/32\"]\n";
    let larder = Larder::start(&config(&origin.url(), &log, real_ip)).await;
    let xff = "X-Forwarded-For: 198.51.100.9, 10.1.2.3\r\nX-Forwarded-Proto: https\r\n";
    let mut trusted = Raw::connect(larder.addr).await;
    assert_eq!(get_on(&mut trusted, "/trusted", xff).await.status, 200);
    // A conditional request: the proxy fetches with a copy of its head (without the
    // conditionals), which keeps the hop to append.
    let conditional = format!("{xff}If-None-Match: \"v1\"\r\n");
    assert_eq!(
        get_on(&mut trusted, "/conditional", &conditional)
            .await
            .status,
        200
    );
    let mut untrusted = Raw::connect_from("127.0.0.2".parse().unwrap(), larder.addr).await;
    assert_eq!(get_on(&mut untrusted, "/untrusted", xff).await.status, 200);
    assert_eq!(
        logged(&log, 3).await,
        [
            "198.51.100.9 /trusted 200",
            "198.51.100.9 /conditional 200",
            "127.0.0.2 /untrusted 200"
        ]
    );
    for path in ["/trusted", "/conditional"] {
        assert_eq!(
            forwarded_for(&origin, path),
            "198.51.100.9, 10.1.2.3, 127.0.0.1"
        );
    }
    assert_eq!(forwarded_for(&origin, "/untrusted"), "127.0.0.2");
    // The scheme a trusted proxy's client used is kept; an untrusted peer's claim is not.
    let proto = |path: &str| {
        let seen = origin.seen();
        let s = seen.iter().find(|s| s.path == path).unwrap();
        s.headers["x-forwarded-proto"].to_str().unwrap().to_string()
    };
    assert_eq!(proto("/trusted"), "https");
    assert_eq!(proto("/conditional"), "https");
    assert_eq!(proto("/untrusted"), "http");
}

/// RFC 7239's Forwarded, its IPv6 node quoted with a port; from a peer not trusted, dropped.
#[tokio::test(flavor = "multi_thread")]
async fn a_forwarded_field_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let origin = origin().await;
    let real_ip = "  [listener.real_ip]\n  from = [\"127.0.0.1\"]\n  header = \"forwarded\"\n";
    let larder = Larder::start(&config(&origin.url(), &log, real_ip)).await;
    let mut raw = Raw::connect(larder.addr).await;
    let field = "Forwarded: for=\"[2001:db8::1]:4711\";proto=https\r\n";
    assert_eq!(get_on(&mut raw, "/fwd", field).await.status, 200);
    // From a peer not trusted the field is ignored, and not passed on.
    let mut untrusted = Raw::connect_from("127.0.0.2".parse().unwrap(), larder.addr).await;
    assert_eq!(
        get_on(&mut untrusted, "/fwd-untrusted", field).await.status,
        200
    );
    assert_eq!(
        logged(&log, 2).await,
        ["2001:db8::1 /fwd 200", "127.0.0.2 /fwd-untrusted 200"]
    );
    assert_eq!(forwarded_for(&origin, "/fwd"), "2001:db8::1, 127.0.0.1");
    assert_eq!(forwarded_for(&origin, "/fwd-untrusted"), "127.0.0.2");
    let seen = origin.seen();
    let forwarded = |path: &str| {
        let s = seen.iter().find(|s| s.path == path).unwrap();
        s.headers
            .get("forwarded")
            .map(|v| v.to_str().unwrap().to_string())
    };
    assert_eq!(
        forwarded("/fwd").as_deref(),
        Some("for=\"[2001:db8::1]:4711\";proto=https")
    );
    assert_eq!(forwarded("/fwd-untrusted"), None);
}

/// Both at once: the PROXY header's source is the immediate peer the trust is decided on; and
/// haproxy in HTTP mode adding X-Forwarded-For (`option forwardfor`) is read as any trusted
/// proxy's field.
#[tokio::test(flavor = "multi_thread")]
async fn the_proxy_headers_source_is_the_peer_trusted_and_haproxys_forwardfor_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let origin = origin().await;
    let keys = "proxy_protocol = true\n  [listener.real_ip]\n  from = [\"10.0.0.0/8\"]\n";
    let larder = Larder::start(&config(&origin.url(), &log, keys)).await;
    let mut raw = Raw::connect(larder.addr).await;
    raw.write(v2(1, "10.0.0.7:1", larder.addr)).await;
    let xff = "X-Forwarded-For: 198.51.100.30\r\n";
    assert_eq!(get_on(&mut raw, "/both", xff).await.status, 200);
    // The socket's peer (127.0.0.1) is not trusted, but it is not the peer here.
    let mut raw = Raw::connect(larder.addr).await;
    raw.write(v2(1, "192.0.2.77:1", larder.addr)).await;
    assert_eq!(get_on(&mut raw, "/untrusted-source", xff).await.status, 200);
    assert_eq!(
        logged(&log, 2).await,
        [
            "198.51.100.30 /both 200",
            "192.0.2.77 /untrusted-source 200"
        ]
    );
    assert_eq!(forwarded_for(&origin, "/both"), "198.51.100.30, 10.0.0.7");
    assert_eq!(forwarded_for(&origin, "/untrusted-source"), "192.0.2.77");

    let log2 = dir.path().join("access2.log");
    let keys = "  [listener.real_ip]\n  from = [\"127.0.0.1/32\"]\n";
    let plain = Larder::start(&config(&origin.url(), &log2, keys)).await;
    let haproxy = Haproxy::start(&format!(
        "global\n  maxconn 64\n\
         defaults\n  mode http\n  option forwardfor\n  timeout connect 2s\n  timeout client 10s\n  timeout server 10s\n\
         frontend front\n  bind {{listen}}\n  default_backend larder\n\
         backend larder\n  server l {}\n",
        plain.addr
    ));
    let mut raw = Raw::from(tcp_from("127.0.0.4", haproxy.addr).await);
    assert_eq!(get_on(&mut raw, "/http-mode", "").await.status, 200);
    assert_eq!(logged(&log2, 1).await, ["127.0.0.4 /http-mode 200"]);
    assert_eq!(forwarded_for(&origin, "/http-mode"), "127.0.0.4, 127.0.0.1");
}

/// The settings are the listener's router's: a reload turns the PROXY protocol and the trusted
/// proxies on for connections and requests from then on.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_turns_them_on() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let origin = origin().await;
    let larder = Larder::start(&config(&origin.url(), &log, "")).await;
    let xff = "X-Forwarded-For: 198.51.100.9\r\n";
    let mut before = Raw::connect(larder.addr).await;
    assert_eq!(get_on(&mut before, "/before", xff).await.status, 200);
    // The same configured address: the same listener, its router replaced.
    let keys = "proxy_protocol = true\n  [listener.real_ip]\n  from = [\"203.0.113.0/24\"]\n";
    larder.reload(&config(&origin.url(), &log, keys)).unwrap();
    // A connection opened before the reload was not asked for a header, and is not now.
    assert_eq!(get_on(&mut before, "/before-again", "").await.status, 200);
    let mut after = Raw::connect(larder.addr).await;
    after.write(v2(1, "203.0.113.10:1", larder.addr)).await;
    assert_eq!(get_on(&mut after, "/after", xff).await.status, 200);
    let mut bare = Raw::connect(larder.addr).await;
    bare.write("GET /bare HTTP/1.1\r\nHost: t\r\n\r\n").await;
    assert!(bare.read_to_end(Duration::from_secs(5)).await.is_empty());
    assert_eq!(
        logged(&log, 3).await,
        [
            "127.0.0.1 /before 200",
            "127.0.0.1 /before-again 200",
            "198.51.100.9 /after 200"
        ]
    );
    assert_eq!(
        forwarded_for(&origin, "/after"),
        "198.51.100.9, 203.0.113.10"
    );
}
