//! Upstream pools end to end: real origins on loopback behind one larder route. Balancing
//! (weighted round-robin, least in flight, consistent hashing), failover when a backend dies
//! (passive ejection, retries of idempotent requests only, backups), active health checks
//! taking a backend out and back, backends that hang or answer garbage, and HTTPS and HTTP/2
//! to backends.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

/// A listener whose one route proxies (uncached) to `[pool.app]`, holding `pool` keys.
fn pooled(pool: &str) -> String {
    format!(
        r#"
[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  proxy = {{ pool = "app", cache = false, response_timeout = "500ms" }}

[pool.app]
{pool}
"#
    )
}

/// Origins answering with their own name.
async fn named_origins(n: usize) -> Vec<Origin> {
    let mut v = Vec::new();
    for i in 0..n {
        v.push(Origin::start(move |_, _| Reply::ok(format!("o{i}"))).await);
    }
    v
}

fn backends(origins: &[Origin]) -> String {
    let urls: Vec<String> = origins.iter().map(|o| format!("{:?}", o.url())).collect();
    format!("backends = [{}]", urls.join(", "))
}

/// Who answered each of `n` GETs of `path`.
async fn answers(l: &Larder, n: usize, path: &str, headers: &[(&str, &str)]) -> Vec<String> {
    let c = client();
    let mut v = Vec::new();
    for _ in 0..n {
        let g = get(&c, &l.url(path), headers).await;
        assert_eq!(g.status, 200, "{}", g.text());
        v.push(g.text());
    }
    v
}

fn counts(v: &[String]) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for s in v {
        *m.entry(s.clone()).or_default() += 1;
    }
    m
}

#[tokio::test]
async fn round_robin_follows_the_weights() {
    let o = named_origins(3).await;
    let pool = format!(
        "backends = [{:?}, {:?}, {{ url = {:?}, weight = 2 }}]",
        o[0].url(),
        o[1].url(),
        o[2].url()
    );
    let l = Larder::start(&pooled(&pool)).await;
    let c = counts(&answers(&l, 40, "/x", &[]).await);
    assert_eq!((c["o0"], c["o1"], c["o2"]), (10, 10, 20), "{c:?}");
}

#[tokio::test]
async fn a_dead_backend_loses_no_get_and_is_ejected() {
    let o = named_origins(3).await;
    let l = Larder::start(&pooled(&backends(&o))).await;
    answers(&l, 6, "/warm", &[]).await;
    o[1].kill();
    // Every GET still succeeds: those sent to the dead one are retried on another.
    let got = answers(&l, 30, "/x", &[]).await;
    assert!(!got.contains(&"o1".to_string()));
    let states = l.backend_states("app");
    assert_eq!(states[1], "ejected", "{states:?}");
    assert_eq!((states[0].as_str(), states[2].as_str()), ("up", "up"));
    let c = counts(&got);
    assert_eq!(c["o0"] + c["o2"], 30);
    assert!(c["o0"] >= 10 && c["o2"] >= 10, "{c:?}");
}

#[tokio::test]
async fn a_post_is_never_retried() {
    let o = named_origins(2).await;
    // No ejection: round-robin keeps sending every other request to the dead backend.
    let pool = format!("{}\npassive = {{ max_fails = 0 }}", backends(&o));
    let l = Larder::start(&pooled(&pool)).await;
    o[0].kill();
    let c = client();
    let (mut ok, mut failed) = (0, 0);
    for _ in 0..6 {
        let g = send(&c, "POST", &l.url("/form"), &[], b"a=1").await;
        match g.status.as_u16() {
            200 => ok += 1,
            502 => failed += 1,
            s => panic!("status {s}"),
        }
    }
    assert_eq!((ok, failed), (3, 3));
    assert_eq!(o[1].seen().iter().filter(|s| s.method == "POST").count(), 3);
    // The same GETs all succeed.
    assert_eq!(answers(&l, 6, "/page", &[]).await, vec!["o1"; 6]);
}

#[tokio::test]
async fn backups_serve_only_when_every_primary_is_down() {
    let o = named_origins(2).await;
    let pool = format!(
        "backends = [{:?}, {{ url = {:?}, backup = true }}]",
        o[0].url(),
        o[1].url()
    );
    let l = Larder::start(&pooled(&pool)).await;
    assert_eq!(answers(&l, 5, "/x", &[]).await, vec!["o0"; 5]);
    o[0].kill();
    assert_eq!(answers(&l, 5, "/x", &[]).await, vec!["o1"; 5]);
}

#[tokio::test]
async fn consistent_hashing_keeps_a_key_on_its_backend() {
    let o = named_origins(3).await;
    let pool = format!(
        "{}\nbalance = \"hash\"\nhash_on = \"header:x-user\"",
        backends(&o)
    );
    let l = Larder::start(&pooled(&pool)).await;
    let mut owner = HashMap::new();
    for u in 0..30 {
        let user = format!("user-{u}");
        let got = answers(&l, 3, "/x", &[("x-user", &user)]).await;
        assert!(got.iter().all(|g| *g == got[0]), "{user}: {got:?}");
        owner.insert(user, got[0].clone());
    }
    let used: std::collections::HashSet<_> = owner.values().collect();
    assert_eq!(used.len(), 3, "30 keys over 3 backends use them all");
    // A backend goes: only its keys move.
    o[0].kill();
    for (user, before) in &owner {
        let now = answers(&l, 1, "/x", &[("x-user", user)]).await.remove(0);
        if before != "o0" {
            assert_eq!(&now, before, "{user} moved though its backend lives");
        } else {
            assert_ne!(now, "o0");
        }
    }
}

#[tokio::test]
async fn least_conn_avoids_the_busy_backend() {
    let slow = Origin::start(|_, _| Reply::ok("slow").delay(Duration::from_millis(400))).await;
    let fast = Origin::start(|_, _| Reply::ok("fast")).await;
    let pool = format!(
        "backends = [{:?}, {:?}]\nbalance = \"least_conn\"",
        slow.url(),
        fast.url()
    );
    let l = Arc::new(Larder::start(&pooled(&pool).replace("500ms", "2s")).await);
    // Hold two requests on the slow backend, then see the rest go to the fast one.
    let mut held = Vec::new();
    for _ in 0..2 {
        let url = l.url("/held");
        held.push(tokio::spawn(async move { get(&client(), &url, &[]).await }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let got = answers(&l, 6, "/x", &[]).await;
    assert_eq!(got, vec!["fast"; 6]);
    for h in held {
        assert_eq!(h.await.unwrap().status, 200);
    }
}

#[tokio::test]
async fn active_checks_take_a_backend_out_and_bring_it_back() {
    let sick = Arc::new(AtomicBool::new(false));
    let s = Arc::clone(&sick);
    let a = Origin::start(move |seen, _| {
        if seen.path == "/healthz" && s.load(Ordering::SeqCst) {
            Reply::ok("no").status(503)
        } else {
            Reply::ok("a")
        }
    })
    .await;
    let b = Origin::start(|_, _| Reply::ok("b")).await;
    let pool = format!(
        "backends = [{:?}, {:?}]\n[pool.app.health]\npath = \"/healthz\"\ninterval = \"100ms\"\nfall = 2\nrise = 2",
        a.url(),
        b.url()
    );
    let l = Larder::start(&pooled(&pool)).await;
    assert_eq!(counts(&answers(&l, 4, "/x", &[]).await).len(), 2);
    sick.store(true, Ordering::SeqCst);
    let t = Instant::now();
    while l.backend_states("app")[0] != "down" {
        assert!(t.elapsed() < Duration::from_secs(3), "not taken out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(answers(&l, 6, "/x", &[]).await, vec!["b"; 6]);
    // The checks saw it: health requests carry their own User-Agent.
    assert!(a
        .seen()
        .iter()
        .any(|s| s.path == "/healthz" && s.headers["user-agent"] == "larder-health-check"));
    sick.store(false, Ordering::SeqCst);
    let t = Instant::now();
    while l.backend_states("app")[0] != "up" {
        assert!(t.elapsed() < Duration::from_secs(3), "not brought back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(answers(&l, 6, "/x", &[]).await.contains(&"a".to_string()));
}

#[tokio::test]
async fn tcp_checks_notice_a_closed_port() {
    let o = named_origins(2).await;
    let pool = format!(
        "{}\n[pool.app.health]\ncheck = \"tcp\"\ninterval = \"100ms\"\nfall = 1",
        backends(&o)
    );
    let l = Larder::start(&pooled(&pool)).await;
    o[0].kill();
    let t = Instant::now();
    while l.backend_states("app")[0] != "down" {
        assert!(t.elapsed() < Duration::from_secs(3), "not taken out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A backend that accepts and never answers, and one that answers garbage: GETs go on to the
/// good backend within the response timeout, and both bad ones get ejected.
#[tokio::test]
async fn hanging_and_garbage_backends_never_take_down_the_pool() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let hang = raw_origin(|mut s| async move {
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf).await;
        tokio::time::sleep(Duration::from_secs(30)).await;
    })
    .await;
    let garbage = raw_origin(|mut s| async move {
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf).await;
        let _ = s.write_all(b"SMTP ready\r\n\r\n").await;
    })
    .await;
    let good = Origin::start(|_, _| Reply::ok("good")).await;
    let pool = format!(
        "backends = [\"http://{hang}\", \"http://{garbage}\", {:?}]\nretries = 2",
        good.url()
    );
    let l = Larder::start(&pooled(&pool)).await;
    let t = Instant::now();
    let got = answers(&l, 12, "/x", &[]).await;
    assert_eq!(got, vec!["good"; 12]);
    // Each hanging try costs one response timeout (500ms), and only until it is ejected.
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let states = l.backend_states("app");
    assert_eq!(&states[..2], ["ejected", "ejected"], "{states:?}");
}

/// With no backend able to answer, the client gets a 502 or 504 within the configured time.
#[tokio::test]
async fn a_pool_with_nothing_alive_answers_502() {
    let o = named_origins(2).await;
    let l = Larder::start(&pooled(&backends(&o))).await;
    o[0].kill();
    o[1].kill();
    let t = Instant::now();
    let g = get(&client(), &l.url("/x"), &[]).await;
    assert_eq!(g.status, 502);
    assert!(t.elapsed() < Duration::from_secs(2));
}

/// HTTPS to a backend: verified against the pool's CA, refused without it, accepted
/// unverified only when the pool says `insecure`. The backend is larder itself on TLS.
#[tokio::test]
async fn https_backends_are_verified() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.issue(dir.path(), "backend", &["backend.test", "localhost"]);
    let backend = Larder::start(&format!(
        r#"
[[listener]]
addr = "127.0.0.1:0"
  [listener.tls]
  cert = {:?}
  key = {:?}
  [[listener.route]]
  path = "/"
  respond = {{ body = "over tls" }}
"#,
        cert.display().to_string(),
        key.display().to_string()
    ))
    .await;
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let url = format!("https://localhost:{}", backend.addr.port());
    let with = |tls: &str| format!("backends = [{url:?}]\n[pool.app.tls]\n{tls}");
    let ca_line = format!("ca = {:?}", ca_file.display().to_string());
    for (tls, status, body) in [
        (ca_line.clone(), 200, "over tls"),
        (String::new(), 502, ""),
        ("insecure = true".to_string(), 200, "over tls"),
        // The name verified is the one configured, not the URL's host.
        (
            format!("{ca_line}\nsni = \"backend.test\""),
            200,
            "over tls",
        ),
        (format!("{ca_line}\nsni = \"other.test\""), 502, ""),
    ] {
        let l = Larder::start(&pooled(&with(&tls))).await;
        let g = get(&client(), &l.url("/x"), &[]).await;
        assert_eq!(g.status, status, "{tls}: {}", g.text());
        if status == 200 {
            assert_eq!(g.text(), body);
        }
    }
    // HTTP/2 chosen by ALPN: the connection tells the client so (on an h2 connection an
    // HTTP/1.1 request would fail with 502).
    let l = Larder::start(&pooled(&format!(
        "backends = [{url:?}]\nhttp2 = true\n[pool.app.tls]\n{ca_line}"
    )))
    .await;
    for _ in 0..3 {
        let g = get(&client(), &l.url("/x"), &[]).await;
        assert_eq!(g.status, 200, "{}", g.text());
        assert_eq!(g.text(), "over tls");
    }
}

/// `http2 = true` speaks HTTP/2 to the backends (h2c here; ALPN with https).
#[tokio::test]
async fn http2_to_backends() {
    use http_body_util::Full;
    use hyper::service::service_fn;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let svc = service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                    let v = format!("{:?}", req.version());
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                        bytes::Bytes::from(v),
                    )))
                });
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                        .await;
            });
        }
    });
    let pool = format!("backends = [\"http://{addr}\"]\nhttp2 = true");
    let l = Larder::start(&pooled(&pool)).await;
    assert_eq!(answers(&l, 3, "/x", &[]).await, vec!["HTTP/2.0"; 3]);
}

/// The inline form: `upstream` with several URLs is a round-robin pool with a TCP check,
/// named after its backends.
#[tokio::test]
async fn an_upstream_list_is_a_pool() {
    let o = named_origins(2).await;
    let l = Larder::start(&format!(
        r#"
[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = [{:?}, {:?}], cache = false }}
"#,
        o[0].url(),
        o[1].url()
    ))
    .await;
    let c = counts(&answers(&l, 10, "/x", &[]).await);
    assert_eq!((c["o0"], c["o1"]), (5, 5));
    let name = format!("upstream {} {}", o[0].url(), o[1].url());
    assert_eq!(l.backend_states(&name), ["up", "up"]);
    let pools = l.pools();
    assert_eq!(pools[0]["health_checks"], "Tcp");
}

/// Backends' health and counts are in /metrics.
#[tokio::test]
async fn backends_are_in_the_metrics() {
    let o = named_origins(2).await;
    let text = format!(
        "[admin]\ntoken = \"t\"\nlisten = \"127.0.0.1:0\"\n{}",
        pooled(&backends(&o))
    );
    let l = Larder::start(&text).await;
    answers(&l, 4, "/x", &[]).await;
    o[1].kill();
    answers(&l, 10, "/x", &[]).await;
    let m = l.metrics_text().unwrap();
    let (a, b) = (o[0].url(), o[1].url());
    for line in [
        format!("larder_upstream_up{{pool=\"app\",backend=\"{a}\"}} 1"),
        format!("larder_upstream_up{{pool=\"app\",backend=\"{b}\"}} 0"),
        format!("larder_upstream_requests_total{{pool=\"app\",backend=\"{a}\"}} 12"),
        format!("larder_upstream_failures_total{{pool=\"app\",backend=\"{b}\"}} 3"),
    ] {
        assert!(m.contains(&line), "{line} not in\n{m}");
    }
}

/// Keep-alive to backends: sequential requests reuse one connection, whatever their answer
/// (a body read to its end, a HEAD's, a 304's); a backend that closes gets a new one.
#[tokio::test]
async fn backend_connections_are_reused() {
    let o = Origin::start(|seen, _| match seen.path.as_str() {
        "/304" => Reply::ok("").status(304),
        "/close" => Reply::ok("bye").header("connection", "close"),
        _ => Reply::ok("x".repeat(20_000)),
    })
    .await;
    let l = Larder::start(&pooled(&backends(std::slice::from_ref(&o)))).await;
    let c = client();
    for path in ["/a", "/b", "/304", "/c"] {
        for _ in 0..5 {
            let g = get(&c, &l.url(path), &[]).await;
            assert!(g.status == 200 || g.status == 304, "{path}: {}", g.status);
        }
    }
    for _ in 0..5 {
        assert_eq!(send(&c, "HEAD", &l.url("/h"), &[], b"").await.status, 200);
    }
    assert_eq!(
        o.connections(),
        1,
        "one keep-alive connection for 25 requests"
    );
    for _ in 0..3 {
        assert_eq!(get(&c, &l.url("/close"), &[]).await.text(), "bye");
    }
    // The first used the open connection; each close makes the next request open one.
    assert_eq!(o.connections(), 3, "a new connection after each close");
    assert_eq!(get(&c, &l.url("/a"), &[]).await.status, 200);
    assert_eq!(o.connections(), 4);
}

/// Idle keep-alive connections to a backend are bounded by `max_idle` and closed after
/// `idle_timeout` (the backend sees them close); the next request opens a new one.
#[tokio::test]
async fn idle_backend_connections_are_bounded_and_closed_at_the_idle_timeout() {
    let o = Origin::start(|_, _| Reply::ok("x").delay(Duration::from_millis(100))).await;
    let pool = format!(
        "{}
max_idle = 2
idle_timeout = \"400ms\"",
        backends(std::slice::from_ref(&o))
    );
    let l = Larder::start(&pooled(&pool)).await;
    let c = client();
    // Four at once: four connections; two are kept when they are done.
    let url = l.url("/a");
    let all = (0..4).map(|_| get(&c, &url, &[]));
    for g in futures_util::future::join_all(all).await {
        assert_eq!(g.status, 200);
    }
    assert_eq!(o.connections(), 4);
    let t = Instant::now();
    while o.open_connections() > 2 && t.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(o.open_connections(), 2, "max_idle = 2");
    while o.open_connections() > 0 && t.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(o.open_connections(), 0, "closed after idle_timeout");
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(get(&c, &l.url("/a"), &[]).await.status, 200);
    assert_eq!(o.connections(), 5);
}

/// A pooled connection the backend closes as the next request arrives (its idle timeout
/// racing the reuse) gets that GET sent again to the same backend on a new connection, and
/// the close is not counted against the backend: with `max_fails = 1` it stays up.
#[tokio::test]
async fn a_closed_pooled_connection_is_resent_without_counting_a_failure() {
    let addr = one_answer_per_connection(false).await;
    let text = format!(
        "[admin]\ntoken = \"t\"\nlisten = \"127.0.0.1:0\"\n{}",
        pooled(&format!(
            "backends = [\"http://{addr}\"]\npassive = {{ max_fails = 1 }}"
        ))
    );
    let l = Larder::start(&text).await;
    let c = client();
    for n in 0..4 {
        let g = get(&c, &l.url("/a"), &[]).await;
        assert_eq!((g.status.as_u16(), g.text()), (200, format!("answer {n}")));
    }
    let m = l.metrics_text().unwrap();
    let url = format!("http://{addr}");
    for line in [
        format!("larder_upstream_up{{pool=\"app\",backend=\"{url}\"}} 1"),
        format!("larder_upstream_failures_total{{pool=\"app\",backend=\"{url}\"}} 0"),
        // Four answered, three of them resent after a close.
        format!("larder_upstream_requests_total{{pool=\"app\",backend=\"{url}\"}} 7"),
    ] {
        assert!(m.contains(&line), "{line} not in\n{m}");
    }
}

/// The admin API drains a backend (no new request goes to it, not even when the others fail)
/// and brings it back.
#[tokio::test]
async fn the_admin_api_drains_and_undrains_a_backend() {
    let o = named_origins(3).await;
    let text = format!(
        "[admin]\ntoken = \"t\"\nlisten = \"127.0.0.1:0\"\n{}",
        pooled(&backends(&o))
    );
    let l = Larder::start(&text).await;
    let c = client();
    let auth = [("authorization", "Bearer t")];
    let call = |what: &str, backend: &str| {
        l.admin_url(&format!("/_larder/{what}?pool=app&backend={backend}"))
    };
    assert_eq!(
        send(&c, "POST", &call("drain", &o[1].url()), &[], b"")
            .await
            .status,
        401
    );
    let g = send(&c, "POST", &call("drain", &o[1].url()), &auth, b"").await;
    assert_eq!(g.status, 200, "{}", g.text());
    assert_eq!(l.backend_states("app"), ["up", "drained", "up"]);
    let got = answers(&l, 12, "/x", &[]).await;
    assert!(!got.contains(&"o1".to_string()), "{got:?}");
    // Drained stays drained when everything else is down.
    o[0].kill();
    o[2].kill();
    let g = get(&c, &l.url("/x"), &[]).await;
    assert_eq!(g.status, 502);
    assert_eq!(o[1].hits(), 0, "nothing went to the drained backend");
    let g = send(&c, "POST", &call("undrain", &o[1].url()), &auth, b"").await;
    assert_eq!(g.status, 200);
    assert_eq!(get(&c, &l.url("/x"), &[]).await.text(), "o1");
    let g = send(&c, "POST", &call("drain", "http://127.0.0.1:1"), &auth, b"").await;
    assert_eq!(g.status, 404);
    assert!(g.text().contains("no backend"), "{}", g.text());
}
