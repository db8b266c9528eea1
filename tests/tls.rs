//! HTTPS end to end: larder's TLS listeners with certificates from a test CA, a rustls client
//! trusting only that CA. ALPN (HTTP/2 and HTTP/1.1), certificates by SNI, re-reading changed
//! certificate files, resumption, the cache over TLS, the 400 to plain HTTP, stalled
//! handshakes, the redirect to HTTPS and HSTS, and the errors `larder check` gives.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

const BODY: &str = "hello over TLS, hello over TLS, hello over TLS, hello over TLS, hello.";

async fn origin() -> Origin {
    Origin::start(|seen, _| {
        if seen.path.starts_with("/private") {
            return Reply::ok("mine").header("cache-control", "private");
        }
        Reply::ok(BODY.repeat(20))
            .header("cache-control", "max-age=60")
            .header("content-type", "text/plain")
            .header("etag", "\"v1\"")
    })
    .await
}

/// A TLS listener proxying to `origin`, with `tls` keys in its `[listener.tls]` table.
fn tls_proxy(origin: &str, tls: &str) -> String {
    tls_proxy_with(origin, tls, "")
}

/// [`tls_proxy`] with `server` lines in its `[server]` table.
fn tls_proxy_with(origin: &str, tls: &str, server: &str) -> String {
    format!(
        r#"
[server]
{server}

[[listener]]
addr = "127.0.0.1:0"
  [listener.tls]
  watch_interval = "50ms"
{tls}
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = "{origin}" }}
"#
    )
}

fn cert_keys(cert: &Path, key: &Path) -> String {
    format!(
        "  cert = {:?}\n  key = {:?}\n",
        cert.display().to_string(),
        key.display().to_string()
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn alpn_chooses_h2_or_http1_and_the_cache_works_the_same_over_both() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.issue(dir.path(), "site", &["localhost", "site.test"]);
    let origin = origin().await;
    let larder = Larder::start(&tls_proxy(&origin.url(), &cert_keys(&cert, &key))).await;

    let h2 = Tls::connect(
        larder.addr,
        "site.test",
        ca.client_config(&[b"h2", b"http/1.1"]),
    )
    .await
    .unwrap();
    assert_eq!(h2.alpn(), "h2");
    let got = h2.get_all("site.test", &["/a", "/a"], &[]).await;
    assert_eq!((got[0].status.as_u16(), got[0].cache()), (200, "MISS"));
    assert_eq!((got[1].status.as_u16(), got[1].cache()), (200, "HIT"));
    assert_eq!(got[1].body, BODY.repeat(20));

    let h1 = Tls::connect(larder.addr, "site.test", ca.client_config(&[b"http/1.1"]))
        .await
        .unwrap();
    assert_eq!(h1.alpn(), "http/1.1");
    let got = h1
        .get_all("site.test", &["/a", "/a"], &[("accept-encoding", "br")])
        .await;
    assert_eq!(got[0].cache(), "HIT", "the entry filled over h2 serves h1");
    // No ALPN at all: HTTP/1.1.
    let none = Tls::connect(larder.addr, "site.test", ca.client_config(&[]))
        .await
        .unwrap();
    assert_eq!(none.alpn(), "");
    let got = none.get_all("site.test", &["/a"], &[]).await;
    assert_eq!((got[0].status.as_u16(), got[0].cache()), (200, "HIT"));

    // Negotiated encodings, 304 and Range behave as over plain HTTP.
    for alpn in [&b"h2"[..], b"http/1.1"] {
        let br = https_get(
            larder.addr,
            "site.test",
            &ca,
            &[alpn],
            "/a",
            &[("accept-encoding", "br")],
        )
        .await;
        if br.header("content-encoding") == Some("br") {
            assert_eq!(decode(&br.body, Some("br")), BODY.repeat(20).as_bytes());
        }
        let not_modified = https_get(
            larder.addr,
            "site.test",
            &ca,
            &[alpn],
            "/a",
            &[("if-none-match", "\"v1\"")],
        )
        .await;
        assert_eq!(not_modified.status, 304);
        let range = https_get(
            larder.addr,
            "site.test",
            &ca,
            &[alpn],
            "/a",
            &[("range", "bytes=0-4")],
        )
        .await;
        assert_eq!(range.status, 206);
        assert_eq!(range.body, "hello");
    }
    // Private responses are not shared over TLS either.
    let p1 = https_get(larder.addr, "site.test", &ca, &[b"h2"], "/private", &[]).await;
    let p2 = https_get(larder.addr, "site.test", &ca, &[b"h2"], "/private", &[]).await;
    assert_ne!(p2.cache(), "HIT", "{:?} {:?}", p1.cache(), p2.cache());
    assert_eq!(origin.hits(), 3, "one fill of /a, two of /private");
    // The origin is told the client came over HTTPS, whichever HTTP version it spoke.
    for seen in origin.seen() {
        assert_eq!(seen.headers["x-forwarded-proto"], "https", "{}", seen.path);
    }
    assert!(larder.tls_counts().handshakes >= 9);
}

#[tokio::test(flavor = "multi_thread")]
async fn sni_chooses_the_certificate_exact_then_wildcard_then_default() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (dc, dk) = ca.issue(dir.path(), "default", &["default.test"]);
    let (ac, ak) = ca.issue(dir.path(), "api", &["api.example.test"]);
    let (wc, wk) = ca.issue(dir.path(), "wild", &["*.example.test"]);
    let (nc, nk) = ca.issue(dir.path(), "named", &["configured.test", "left-out.test"]);
    let tls = format!(
        "{}\n  [[listener.tls.certificates]]\n{}\n  [[listener.tls.certificates]]\n{}\n  [[listener.tls.certificates]]\n{}  names = [\"configured.test\"]\n",
        cert_keys(&dc, &dk),
        cert_keys(&ac, &ak),
        cert_keys(&wc, &wk),
        cert_keys(&nc, &nk)
    );
    let origin = origin().await;
    let larder = Larder::start(&tls_proxy(&origin.url(), &tls)).await;
    let leaf_of = |pem: &Path| {
        use rustls::pki_types::pem::PemObject;
        rustls::pki_types::CertificateDer::from_pem_file(pem)
            .unwrap()
            .to_vec()
    };
    let served = |sni: &'static str| {
        let cfg = ca.client_config(&[b"http/1.1"]);
        let addr = larder.addr;
        async move {
            // The client checks the name too: a certificate not valid for `sni` fails.
            let insecure_ok = Tls::connect(addr, sni, cfg).await;
            insecure_ok.map(|t| t.peer_leaf())
        }
    };
    assert_eq!(served("api.example.test").await.unwrap(), leaf_of(&ac));
    assert_eq!(served("www.example.test").await.unwrap(), leaf_of(&wc));
    assert_eq!(served("default.test").await.unwrap(), leaf_of(&dc));
    assert_eq!(served("configured.test").await.unwrap(), leaf_of(&nc));
    // `names` replaces the certificate's own list: left-out.test gets the default.
    assert!(served("left-out.test").await.is_err());
    // A name no certificate is for gets the default, which the client rejects for that name.
    assert!(
        served("a.b.example.test").await.is_err(),
        "a wildcard covers one label"
    );
    assert!(served("other.test").await.is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn changed_certificate_files_are_re_read_and_open_connections_keep_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.issue(dir.path(), "site", &["site.test"]);
    let origin = origin().await;
    let larder = Larder::start(&tls_proxy(&origin.url(), &cert_keys(&cert, &key))).await;
    let old = Tls::connect(larder.addr, "site.test", ca.client_config(&[b"http/1.1"]))
        .await
        .unwrap();
    let old_leaf = old.peer_leaf();

    // A broken key is refused: the certificate in use stays.
    std::fs::write(&key, "not a key").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Tls::connect(larder.addr, "site.test", ca.client_config(&[b"http/1.1"]))
        .await
        .unwrap();
    assert_eq!(t.peer_leaf(), old_leaf);

    // A new certificate and key: new connections get it within the watch interval.
    ca.issue(dir.path(), "site", &["site.test"]);
    let mut new_leaf = old_leaf.clone();
    for _ in 0..100 {
        let t = Tls::connect(larder.addr, "site.test", ca.client_config(&[b"http/1.1"]))
            .await
            .unwrap();
        new_leaf = t.peer_leaf();
        if new_leaf != old_leaf {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_ne!(new_leaf, old_leaf, "the new certificate is served");
    // The connection opened before still works, on its own session.
    let got = old.get_all("site.test", &["/a", "/b"], &[]).await;
    assert!(got.iter().all(|g| g.status == 200));

    // Re-reading on demand (what a reload does) works too.
    ca.issue(dir.path(), "site", &["site.test"]);
    larder.reload_certificates().unwrap();
    let t = Tls::connect(larder.addr, "site.test", ca.client_config(&[b"http/1.1"]))
        .await
        .unwrap();
    assert_ne!(t.peer_leaf(), new_leaf);
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_resume() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.issue(dir.path(), "site", &["site.test"]);
    let origin = origin().await;
    let larder = Larder::start(&tls_proxy(&origin.url(), &cert_keys(&cert, &key))).await;
    // One client configuration keeps its session store across connections.
    for tls13 in [true, false] {
        let mut cfg = (*ca.client_config(&[b"http/1.1"])).clone();
        if !tls13 {
            let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
            let roots = cfg.clone();
            cfg = rustls::ClientConfig::builder_with_provider(provider)
                .with_protocol_versions(&[&rustls::version::TLS12])
                .unwrap()
                .with_root_certificates({
                    let mut r = rustls::RootCertStore::empty();
                    use rustls::pki_types::pem::PemObject;
                    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca.pem.as_bytes()) {
                        r.add(c.unwrap()).unwrap();
                    }
                    r
                })
                .with_no_client_auth();
            cfg.alpn_protocols = roots.alpn_protocols;
        }
        let cfg = std::sync::Arc::new(cfg);
        let first = Tls::connect(larder.addr, "site.test", cfg.clone())
            .await
            .unwrap();
        assert!(!first.resumed());
        // TLS 1.3 tickets come after the handshake: let the client read them.
        let _ = first.get_all("site.test", &["/a"], &[]).await;
        let second = Tls::connect(larder.addr, "site.test", cfg).await.unwrap();
        assert!(
            second.resumed(),
            "TLS 1.{} session resumed",
            if tls13 { 3 } else { 2 }
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_http_gets_400_and_a_stalled_handshake_is_closed_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.issue(dir.path(), "site", &["site.test"]);
    let origin = origin().await;
    let larder = Larder::start(&tls_proxy_with(
        &origin.url(),
        &cert_keys(&cert, &key),
        "header_read_timeout = \"300ms\"",
    ))
    .await;

    let mut raw = Raw::connect(larder.addr).await;
    raw.write(b"GET / HTTP/1.1\r\nHost: site.test\r\n\r\n")
        .await;
    let r = raw.response().await;
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("HTTPS"));
    assert!(
        raw.closes_within(Duration::from_secs(2)).await,
        "closed after the 400"
    );

    // Connected, silent: closed within the header timeout (300ms), counted.
    let mut silent = Raw::connect(larder.addr).await;
    let t = std::time::Instant::now();
    assert!(silent.closes_within(Duration::from_secs(3)).await);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // Half a ClientHello, then silence: the same.
    let mut half = Raw::connect(larder.addr).await;
    half.write(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).await;
    assert!(half.closes_within(Duration::from_secs(3)).await);
    // Garbage after a handshake record byte: a failed handshake.
    let mut bad = Raw::connect(larder.addr).await;
    bad.write(&[0x16, 0xff, 0xff, 0x00, 0x05, 1, 2, 3, 4, 5])
        .await;
    assert!(bad.closes_within(Duration::from_secs(3)).await);
    let counts = larder.tls_counts();
    assert_eq!(counts.plain_http, 1, "{counts:?}");
    assert_eq!(counts.timed_out, 2, "{counts:?}");
    assert_eq!(counts.failed, 1, "{counts:?}");
    // The listener still serves.
    let ok = https_get(larder.addr, "site.test", &ca, &[b"h2"], "/a", &[]).await;
    assert_eq!(ok.status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_listener_redirects_to_https_and_tls_routes_send_hsts() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.issue(dir.path(), "site", &["site.test"]);
    let origin = origin().await;
    let config = format!(
        r#"
[[listener]]
addr = "127.0.0.1:0"
  [listener.tls]
{}
  [[listener.route]]
  path = "/"
  hsts = "max-age=63072000; includeSubDomains"
  proxy = {{ upstream = "{}" }}

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  redirect_https = {{ port = 8443 }}
  [[listener.route]]
  path = "/standard/"
  redirect_https = true
"#,
        cert_keys(&cert, &key),
        origin.url()
    );
    let larder = Larder::start(&config).await;
    let got = https_get(larder.addr, "site.test", &ca, &[b"http/1.1"], "/a", &[]).await;
    assert_eq!(
        got.header("strict-transport-security"),
        Some("max-age=63072000; includeSubDomains")
    );
    let plain = larder.addr_of(1);
    let c = client();
    let r = get(
        &c,
        &format!("http://{plain}/x/y?q=1"),
        &[("host", "site.test:80")],
    )
    .await;
    assert_eq!(r.status, 308);
    assert_eq!(r.header("location"), Some("https://site.test:8443/x/y?q=1"));
    assert_eq!(
        r.header("strict-transport-security"),
        None,
        "never over plain HTTP"
    );
    let r = get(
        &c,
        &format!("http://{plain}/standard/z"),
        &[("host", "site.test")],
    )
    .await;
    assert_eq!(r.header("location"), Some("https://site.test/standard/z"));
    assert_eq!(origin.hits(), 1);
}

#[test]
fn check_names_the_certificate_file_that_cannot_be_served() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.issue(dir.path(), "site", &["site.test"]);
    let (_, other_key) = ca.issue(dir.path(), "other", &["other.test"]);
    let check = |tls: &str| {
        let file = dir.path().join("larder.toml");
        std::fs::write(&file, tls_proxy("http://127.0.0.1:9", tls)).unwrap();
        let out = larder_command().arg("check").arg(&file).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = check(&cert_keys(&cert, &key));
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = check(&cert_keys(&dir.path().join("missing.pem"), &key));
    assert_eq!(code, Some(2));
    assert!(err.contains("missing.pem"), "{err}");
    let (code, err) = check(&cert_keys(&cert, &other_key));
    assert_eq!(code, Some(2));
    assert!(
        err.contains("other.key") && err.contains("does not match"),
        "{err}"
    );
    std::fs::write(dir.path().join("unreadable.key"), "").unwrap();
    let (code, err) = check(&cert_keys(&cert, &dir.path().join("unreadable.key")));
    assert_eq!(code, Some(2));
    assert!(err.contains("unreadable.key"), "{err}");
    let (code, err) = check(&format!("  cert = {:?}\n", cert.display().to_string()));
    assert_eq!(code, Some(2));
    assert!(err.contains("line") && err.contains("key"), "{err}");
}

/// The quick start: `--tls-self-signed` makes a certificate for localhost once, prints where
/// it is, and serves HTTPS with it; a client trusting that file connects. `--tls-cert` and
/// `--tls-key` serve a given certificate.
#[tokio::test(flavor = "multi_thread")]
async fn quick_start_flags_serve_https() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "hello").unwrap();
    let state = dir.path().join("state");
    let run = |extra: &[&str]| {
        let addr = free_port();
        let mut cmd = larder_command();
        cmd.args([
            "--root",
            dir.path().to_str().unwrap(),
            "--listen",
            &addr.to_string(),
        ])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
        (addr, Child(cmd.spawn().unwrap()))
    };
    let (addr, mut child) = run(&["--tls-self-signed", "--state-dir", state.to_str().unwrap()]);
    let out = child.0.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    // Log lines go to stdout too: find larder's note.
    let said = (lines.by_ref().map_while(Result::ok))
        .find(|l| l.starts_with("TLS:"))
        .expect("where the certificate is");
    let cert = state.join("tls/self-signed.pem");
    assert!(said.contains(cert.to_str().unwrap()), "{said}");
    let hint = lines.next().unwrap().unwrap();
    assert!(hint.contains("curl --cacert"), "{hint}");
    let pem = std::fs::read_to_string(&cert).unwrap();
    let trusting = |pem: &str| client_trusting(pem, &[b"h2"]);
    let connect = |addr, sni: &'static str, cfg| async move {
        for _ in 0..200 {
            match Tls::connect(addr, sni, std::sync::Arc::clone(&cfg)).await {
                Ok(t) => return t,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("{e}"),
            }
        }
        panic!("larder did not start");
    };
    let t = connect(addr, "localhost", trusting(&pem)).await;
    assert_eq!(t.alpn(), "h2");
    let got = t.get_all("localhost", &["/a.txt"], &[]).await;
    assert_eq!(got[0].body, "hello");
    drop(child);
    // A second start keeps the certificate the client was told to trust.
    let (addr, _child) = run(&["--tls-self-signed", "--state-dir", state.to_str().unwrap()]);
    let t = connect(addr, "localhost", trusting(&pem)).await;
    assert_eq!(
        t.get_all("localhost", &["/a.txt"], &[]).await[0].status,
        200
    );

    let ca = TestCa::new();
    let (c, k) = ca.issue(dir.path(), "given", &["localhost"]);
    let (addr, _child) = run(&[
        "--tls-cert",
        c.to_str().unwrap(),
        "--tls-key",
        k.to_str().unwrap(),
    ]);
    let t = connect(addr, "localhost", ca.client_config(&[b"http/1.1"])).await;
    assert_eq!(t.alpn(), "http/1.1");
    assert_eq!(
        t.get_all("localhost", &["/a.txt"], &[]).await[0].body,
        "hello"
    );
    // The key alone is refused by the command line.
    let out = larder_command()
        .args(["--root", ".", "--tls-key", "k.pem"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// HTTP/3 on the TLS listener's port over UDP: advertised by Alt-Svc on TCP, the same routes
/// and cache (an object filled over HTTP/1.1 is a HIT over HTTP/3, same bytes, and the other
/// way round), request bodies reach the origin, HEAD has no body, 304 and Range work.
#[tokio::test(flavor = "multi_thread")]
async fn http3_serves_the_same_cache_on_the_same_port() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.issue(dir.path(), "site", &["site.test"]);
    let origin = Origin::start(|seen, _| {
        if seen.method == "POST" {
            return Reply::ok(format!("got {} bytes", seen.body.len()));
        }
        Reply::ok(BODY.repeat(20))
            .header("cache-control", "max-age=60")
            .header("etag", "\"v1\"")
    })
    .await;
    let larder = Larder::start(&tls_proxy(
        &origin.url(),
        &format!("{}  http3 = true\n", cert_keys(&cert, &key)),
    ))
    .await;
    let tcp = https_get(larder.addr, "site.test", &ca, &[b"http/1.1"], "/a", &[]).await;
    assert_eq!(tcp.cache(), "MISS");
    let alt = format!("h3=\":{}\"; ma=86400", larder.addr.port());
    assert_eq!(tcp.header("alt-svc"), Some(alt.as_str()));

    let mut h3 = H3::connect(larder.addr, "site.test", &ca).await;
    // The same authority as the TCP requests' Host (the cache key has it).
    let url = |p: &str| format!("https://site.test{p}");
    let got = h3.send("GET", &url("/a"), &[], b"").await;
    assert_eq!((got.status.as_u16(), got.cache()), (200, "HIT"));
    assert_eq!(got.body, tcp.body);
    // Filled over HTTP/3, a hit over HTTP/2.
    let miss = h3.send("GET", &url("/b"), &[], b"").await;
    assert_eq!(miss.cache(), "MISS");
    let h2 = https_get(larder.addr, "site.test", &ca, &[b"h2"], "/b", &[]).await;
    assert_eq!((h2.cache(), &h2.body), ("HIT", &miss.body));
    // Conditionals, ranges, HEAD.
    let not_modified = h3
        .send("GET", &url("/a"), &[("if-none-match", "\"v1\"")], b"")
        .await;
    assert_eq!(not_modified.status, 304);
    let range = h3
        .send("GET", &url("/a"), &[("range", "bytes=0-4")], b"")
        .await;
    assert_eq!(
        (range.status.as_u16(), &range.body[..]),
        (206, &b"hello"[..])
    );
    let head = h3.send("HEAD", &url("/a"), &[], b"").await;
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    // A request body goes through to the origin.
    let upload = vec![7u8; 100_000];
    let posted = h3.send("POST", &url("/upload"), &[], &upload).await;
    assert_eq!(posted.text(), "got 100000 bytes");
    assert_eq!(origin.hits(), 3, "a, b, the POST");
    // Filled over TCP (a), HTTP/3 (b) and the POST over HTTP/3: every one said HTTPS.
    for seen in origin.seen() {
        assert_eq!(seen.headers["x-forwarded-proto"], "https", "{}", seen.path);
    }
    drop(h3);
    assert_eq!(
        larder.shutdown().await,
        0,
        "QUIC connections close on shutdown"
    );
}

/// Static files, images and purge behave the same over HTTP/1.1 and HTTP/2 over TLS and over
/// HTTP/3.
#[tokio::test(flavor = "multi_thread")]
async fn static_files_images_and_purge_work_the_same_over_h1_h2_and_h3() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.issue(dir.path(), "site", &["site.test"]);
    let files = dir.path().join("files");
    std::fs::create_dir(&files).unwrap();
    std::fs::write(files.join("a.txt"), "static text, static text").unwrap();
    let images = dir.path().join("images");
    let origin = origin().await;
    let config = format!(
        r#"
[admin]
token = "s3cret"

[[listener]]
addr = "127.0.0.1:0"
  [listener.tls]
{}  http3 = true
  [[listener.route]]
  path = "/static/"
  static = {{ root = {:?}, strip_prefix = true }}
  [[listener.route]]
  path = "/img/"
  images = {{ dir = {:?} }}
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = "{}" }}
"#,
        cert_keys(&cert, &key),
        files.display().to_string(),
        images.display().to_string(),
        origin.url()
    );
    let larder = Larder::start(&config).await;
    let mut h3 = H3::connect(larder.addr, "site.test", &ca).await;
    let over = |alpn: &'static [u8], reqs: Vec<(&'static str, String, Vec<u8>)>| {
        let (addr, cfg) = (larder.addr, ca.client_config(&[alpn]));
        async move {
            let t = Tls::connect(addr, "site.test", cfg).await.unwrap();
            let reqs: Vec<(&str, &str, &[u8])> = reqs
                .iter()
                .map(|(m, p, b)| (*m, p.as_str(), &b[..]))
                .collect();
            t.send_all("site.test", &reqs, &[]).await
        }
    };
    let url = |p: &str| format!("https://site.test{p}");

    // Static files, with Range.
    for alpn in [&b"h2"[..], b"http/1.1"] {
        let got = over(alpn, vec![("GET", "/static/a.txt".into(), vec![])]).await;
        assert_eq!(got[0].body, "static text, static text");
    }
    let got = h3.send("GET", &url("/static/a.txt"), &[], b"").await;
    assert_eq!(got.body, "static text, static text");
    let got = h3
        .send("GET", &url("/static/a.txt"), &[("range", "bytes=0-5")], b"")
        .await;
    assert_eq!((got.status.as_u16(), &got.body[..]), (206, &b"static"[..]));

    // Images: uploaded over HTTP/3, transformed over HTTP/2 and HTTP/3 alike.
    let up = h3
        .send(
            "POST",
            &url("/img/upload"),
            &[("content-type", "image/jpeg")],
            &photo(),
        )
        .await;
    assert_eq!(up.status, 200, "{}", up.text());
    let md5 = up.field("md5");
    let path = format!("/img/{md5}?w=40&h=40&f=png");
    let via_h2 = over(b"h2", vec![("GET", path.clone(), vec![])])
        .await
        .remove(0);
    let via_h3 = h3.send("GET", &url(&path), &[], b"").await;
    assert_eq!(via_h2.status, 200);
    assert_eq!(via_h2.header("content-type"), Some("image/png"));
    assert_eq!(via_h2.body, via_h3.body);

    // Purge over HTTP/3 empties what HTTP/1.1 filled.
    let got = over(
        b"http/1.1",
        vec![("GET", "/p".into(), vec![]), ("GET", "/p".into(), vec![])],
    )
    .await;
    assert_eq!((got[0].cache(), got[1].cache()), ("MISS", "HIT"));
    let purged = h3
        .send(
            "PURGE",
            &url("/p"),
            &[("authorization", "Bearer s3cret")],
            b"",
        )
        .await;
    assert_eq!(purged.body, "{\"purged\":1}");
    let got = over(b"h2", vec![("GET", "/p".into(), vec![])]).await;
    assert_eq!(got[0].cache(), "MISS");
}

/// HTTP/2 over TLS writes the responses of one poll of a connection together (larder holds
/// rustls's records and flushes at the task's next poll): many concurrent streams, with bodies
/// on both sides of rustls's 64 KiB send buffer and more in all than the client's connection
/// window (so larder waits for window updates midway), each arrive whole; and a lone request
/// on a connection gone quiet is answered, not left in the buffer waiting for company.
#[tokio::test(flavor = "multi_thread")]
async fn http2_responses_written_together_arrive_whole() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.issue(dir.path(), "site", &["site.test"]);
    let files = dir.path().join("files");
    std::fs::create_dir(&files).unwrap();
    let bodies: Vec<(String, Vec<u8>)> = [100usize, 8 * 1024, 300 * 1024]
        .iter()
        .map(|&n| {
            let body: Vec<u8> = (0..n).map(|i| (i * 7 + n) as u8).collect();
            (format!("/f/{n}.bin"), body)
        })
        .collect();
    for (path, body) in &bodies {
        std::fs::write(files.join(&path[3..]), body).unwrap();
    }
    let config = format!(
        r#"
[[listener]]
addr = "127.0.0.1:0"
  [listener.tls]
{}
  [[listener.route]]
  path = "/f/"
  static = {{ root = {:?}, strip_prefix = true }}
"#,
        cert_keys(&cert, &key),
        files.display().to_string()
    );
    let larder = Larder::start(&config).await;
    let tls = Tls::connect(larder.addr, "site.test", ca.client_config(&[b"h2"]))
        .await
        .unwrap();
    // 60 streams at once (20 of each size, 6 MB in all), then a lone request after a pause.
    let many: Vec<String> = (0..60).map(|i| bodies[i % 3].0.clone()).collect();
    let rounds = [many.clone(), vec![bodies[0].0.clone()], many];
    let got = tokio::time::timeout(
        Duration::from_secs(20),
        tls.h2_rounds("site.test", &rounds, Duration::from_millis(300)),
    )
    .await
    .expect("every response arrives");
    for (round, paths) in got.iter().zip(&rounds) {
        assert_eq!(round.len(), paths.len());
        for (g, path) in round.iter().zip(paths) {
            let want = &bodies.iter().find(|(p, _)| p == path).unwrap().1;
            assert_eq!(g.status, 200, "{path}");
            assert!(g.body[..] == want[..], "{path}: {} bytes", g.body.len());
        }
    }
}

/// `kill -HUP` makes the running binary re-read its certificates (a long watch interval keeps
/// the file watcher out of it); the process keeps serving.
#[tokio::test(flavor = "multi_thread")]
async fn sighup_re_reads_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.issue(dir.path(), "site", &["site.test"]);
    let addr = free_port();
    let config = dir.path().join("larder.toml");
    std::fs::write(
        &config,
        format!(
            "[[listener]]\naddr = \"{addr}\"\n  [listener.tls]\n{}  watch_interval = \"1h\"\n  [[listener.route]]\n  respond = {{ body = \"ok\" }}\n",
            cert_keys(&cert, &key)
        ),
    )
    .unwrap();
    let child = Child(
        larder_command()
            .arg("--config")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let connect = || async {
        for _ in 0..200 {
            if let Ok(t) = Tls::connect(addr, "site.test", ca.client_config(&[b"h2"])).await {
                return t.peer_leaf();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("larder did not serve TLS");
    };
    let before = connect().await;
    ca.issue(dir.path(), "site", &["site.test"]);
    assert_eq!(connect().await, before, "not re-read before the signal");
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.0.id() as i32, libc::SIGHUP) }, 0);
    let mut after = before.clone();
    for _ in 0..100 {
        after = connect().await;
        if after != before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_ne!(after, before, "re-read after SIGHUP");
}
