//! The access log: one line per request in the configured format, written by a thread of its
//! own; sampling; reopened on SIGUSR1 after the file was moved (logrotate); a bad template is
//! a config error naming its line.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

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

async fn origin() -> Origin {
    Origin::start(|_, _| Reply::ok("hello").header("cache-control", "max-age=60")).await
}

fn config(origin: &str, log: &Path, keys: &str) -> String {
    format!(
        "[access_log]\npath = {:?}\n{keys}\n{}",
        log.display().to_string(),
        PROXY.replace("{origin}", origin)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn combined_json_and_template_lines() {
    let dir = tempfile::tempdir().unwrap();
    let origin = origin().await;
    let c = client();
    for (format, check) in [
        ("combined", 0),
        ("json", 1),
        (
            "{method} {uri} {status} {cache} {bytes} {user_agent} {upstream_addr}",
            2,
        ),
    ] {
        let log = dir.path().join(format!("{check}.log"));
        let larder = Larder::start(&config(
            &origin.url(),
            &log,
            &format!("format = {format:?}"),
        ))
        .await;
        let headers = [
            ("user-agent", "test-agent/1 \"quoted\""),
            ("referer", "http://ref/"),
        ];
        get(&c, &larder.url("/a?x=1"), &headers).await;
        get(&c, &larder.url("/a?x=1"), &headers).await;
        send(&c, "POST", &larder.url("/b"), &[], b"body").await;
        let got = lines(&log, 3).await;
        assert_eq!(got.len(), 3, "{got:?}");
        match check {
            0 => {
                assert!(got[0].starts_with("127.0.0.1 - - ["), "{}", got[0]);
                assert!(
                    got[0].ends_with("\"GET /a?x=1 HTTP/1.1\" 200 5 \"http://ref/\" \"test-agent/1 \\\"quoted\\\"\""),
                    "{}",
                    got[0]
                );
                assert!(got[2].contains("\"POST /b HTTP/1.1\" 200"), "{}", got[2]);
            }
            1 => {
                let v: Vec<serde_json::Value> = got
                    .iter()
                    .map(|l| serde_json::from_str(l).unwrap())
                    .collect();
                assert_eq!(v[0]["cache"], "MISS");
                assert_eq!(v[1]["cache"], "HIT");
                assert_eq!(v[2]["cache"], "BYPASS");
                assert_eq!(v[1]["status"], 200);
                assert_eq!(v[1]["uri"], "/a?x=1");
                assert_eq!(v[1]["user_agent"], "test-agent/1 \"quoted\"");
                assert!(v[1]["duration_us"].as_u64().is_some());
                assert_eq!(v[1]["route"], format!("{} */", larder.addr));
                // ISO 8601 in UTC to the millisecond: 2026-11-28T01:05:02.123Z.
                let t = v[0]["time"].as_str().unwrap();
                assert_eq!(t.len(), 24, "{t}");
                assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T' && t.as_bytes()[19] == b'.');
                // The miss and the pass name the backend that answered and its time; the hit
                // none.
                let backend = origin.url().trim_start_matches("http://").to_string();
                for i in [0, 2] {
                    assert_eq!(v[i]["upstream_addr"], backend.as_str(), "{}", got[i]);
                    assert!(v[i]["upstream_time"].as_f64().unwrap() >= 0.0);
                }
                assert!(v[1]["upstream_addr"].is_null(), "{}", got[1]);
                assert!(v[1]["upstream_time"].is_null());
            }
            _ => {
                let backend = origin.url().trim_start_matches("http://").to_string();
                assert_eq!(
                    got[0],
                    format!("GET /a?x=1 200 MISS 5 test-agent/1 \"quoted\" {backend}")
                );
                assert_eq!(got[1], "GET /a?x=1 200 HIT 5 test-agent/1 \"quoted\" -");
            }
        }
        assert_eq!(larder_dropped(&larder), Some(0));
    }
}

/// A response the cache fetched but did not store is logged with the reason (`no_store`); a
/// stored one and a hit with none.
#[tokio::test(flavor = "multi_thread")]
async fn the_reason_a_response_was_not_stored_is_logged() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(|seen, _| match seen.path.as_str() {
        "/nostore" => Reply::ok("n").header("cache-control", "no-store"),
        "/cookie" => Reply::ok("c")
            .header("cache-control", "max-age=60")
            .header("set-cookie", "s=1"),
        _ => Reply::ok("k").header("cache-control", "max-age=60"),
    })
    .await;
    let c = client();
    for (format, json) in [("json", true), ("{uri} {cache} {no_store}", false)] {
        let log = dir.path().join(format!("{json}.log"));
        let cfg = config(&origin.url(), &log, &format!("format = {format:?}"));
        let larder = Larder::start(&cfg).await;
        for path in ["/nostore", "/cookie", "/kept", "/kept"] {
            assert_eq!(get(&c, &larder.url(path), &[]).await.status, 200);
        }
        let got = lines(&log, 4).await;
        assert_eq!(got.len(), 4, "{got:?}");
        if json {
            let v: Vec<serde_json::Value> = got
                .iter()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            assert_eq!(v[0]["no_store"], "no-store");
            assert_eq!(v[1]["no_store"], "set-cookie");
            assert!(v[2]["no_store"].is_null(), "{}", got[2]);
            assert_eq!(v[3]["cache"], "HIT");
            assert!(v[3]["no_store"].is_null(), "{}", got[3]);
        } else {
            assert_eq!(got[0], "/nostore MISS no-store");
            assert_eq!(got[1], "/cookie MISS set-cookie");
            assert_eq!(got[2], "/kept MISS -");
            assert_eq!(got[3], "/kept HIT -");
        }
    }
}

/// A response is logged with its own outcome, not with what ran on its thread meanwhile: on
/// one thread (larder, its origin and the clients share the test's), a push write waiting for
/// its body while a stale-while-revalidate refresh completes (storing the refreshed response as
/// EXPIRED) is logged with no cache result. Before the outcome travelled with the response
/// (thread-local notes) the write was logged EXPIRED.
#[tokio::test(flavor = "current_thread")]
async fn a_background_refresh_does_not_lend_its_outcome_to_another_response() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(|_, n| match n {
        0 => Reply::ok("old")
            .header("content-type", "application/octet-stream")
            .header("cache-control", "max-age=0, stale-while-revalidate=60"),
        _ => Reply::ok("refreshed, and longer")
            .header("content-type", "application/octet-stream")
            .header("cache-control", "max-age=60"),
    })
    .await;
    let log = dir.path().join("outcome.log");
    let larder = Larder::start(&format!(
        r#"
[server]
workers = 1

[access_log]
path = {:?}
format = "{{method}} {{uri}} {{status}} {{cache}} {{no_store}}"

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/p/"
  proxy = {{ upstream = "{}" }}
  [[listener.route]]
  path = "/"
  push = {{ dir = {:?}, token = "s3cret" }}
"#,
        log.display().to_string(),
        origin.url(),
        dir.path().join("push").display().to_string(),
    ))
    .await;
    let c = client();
    assert_eq!(get(&c, &larder.url("/p/x"), &[]).await.cache(), "MISS");
    let stored = larder.cache_bytes();
    // The write's head is in (the 100 Continue says its handler reads the body); its body
    // waits.
    let mut write = Raw::connect(larder.addr).await;
    write
        .write(
            "PUT /cars/1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n\
             Expect: 100-continue\r\nContent-Length: 7\r\n\r\n",
        )
        .await;
    assert_eq!(write.response().await.status, 100);
    // Answered stale; the refresh runs in the background on the same thread.
    assert_eq!(get(&c, &larder.url("/p/x"), &[]).await.cache(), "STALE");
    let deadline = Instant::now() + Duration::from_secs(5);
    while larder.cache_bytes() == stored {
        assert!(Instant::now() < deadline, "the refresh stored nothing");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    write.write("{\"a\":1}").await;
    let written = write.response().await;
    assert!((200..300).contains(&written.status), "{}", written.head);
    let got = lines(&log, 3).await;
    assert_eq!(
        got,
        [
            "GET /p/x 200 MISS -",
            "GET /p/x 200 STALE -",
            format!("PUT /cars/1 {} none -", written.status).as_str(),
        ]
    );
}

/// With metrics on (an admin listener), route ids are the metrics' own, numbered across
/// listeners: a request on the second listener is still logged with its own route.
#[tokio::test(flavor = "multi_thread")]
async fn routes_are_named_on_every_listener_with_metrics_on() {
    let dir = tempfile::tempdir().unwrap();
    let origin = origin().await;
    let log = dir.path().join("routes.log");
    let larder = Larder::start(&format!(
        r#"
[admin]
token = "t"
listen = "127.0.0.1:0"

[access_log]
path = {:?}
format = "{{route}} {{status}}"

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/one/"
  respond = {{ body = "1" }}
  [[listener.route]]
  path = "/"
  respond = {{ body = "root" }}

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/two/"
  proxy = {{ upstream = "{}" }}
"#,
        log.display().to_string(),
        origin.url()
    ))
    .await;
    let c = client();
    let second = larder.addr_of(1);
    get(&c, &format!("http://{second}/two/x"), &[]).await;
    get(&c, &larder.url("/one/x"), &[]).await;
    let got = lines(&log, 2).await;
    assert_eq!(
        got,
        [
            format!("{second} */two/ 200"),
            format!("{} */one/ 200", larder.addr)
        ]
    );
}

fn larder_dropped(l: &Larder) -> Option<u64> {
    l.access_log_dropped()
}

#[tokio::test(flavor = "multi_thread")]
async fn sampling_logs_a_share_of_requests() {
    let dir = tempfile::tempdir().unwrap();
    let origin = origin().await;
    let log = dir.path().join("sampled.log");
    let larder = Larder::start(&config(&origin.url(), &log, "sample = 0.25")).await;
    let c = client();
    for _ in 0..40 {
        get(&c, &larder.url("/a"), &[]).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let got = lines(&log, 0).await;
    // Each worker thread logs every fourth request it completes.
    assert!((7..=10).contains(&got.len()), "{} lines", got.len());
}

#[test]
fn a_bad_template_is_named_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("larder.toml");
    let log = dir.path().join("x.log");
    std::fs::write(
        &file,
        config("http://127.0.0.1:9", &log, "format = \"{method} {nope}\""),
    )
    .unwrap();
    let out = larder_command().arg("check").arg(&file).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("line 3") && err.contains("{nope}"), "{err}");
}

/// logrotate moves the file and sends SIGUSR1: the running binary writes to a new file.
#[tokio::test(flavor = "multi_thread")]
async fn sigusr1_reopens_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let origin = origin().await;
    let log = dir.path().join("access.log");
    let addr = free_port();
    let file = dir.path().join("larder.toml");
    let text = config(&origin.url(), &log, "").replace("127.0.0.1:0", &addr.to_string());
    std::fs::write(&file, text).unwrap();
    let child = Child(
        larder_command()
            .arg("--config")
            .arg(&file)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let c = client();
    let url = format!("http://{addr}/a");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Raw::try_connect(addr).await.is_err() {
        assert!(Instant::now() < deadline, "larder did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    get(&c, &url, &[]).await;
    assert_eq!(lines(&log, 1).await.len(), 1);
    let rotated = dir.path().join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.0.id() as i32, libc::SIGUSR1) }, 0);
    tokio::time::sleep(Duration::from_millis(400)).await;
    get(&c, &url, &[]).await;
    let new = lines(&log, 1).await;
    assert_eq!(new.len(), 1, "a new file after SIGUSR1");
    assert_eq!(
        lines(&rotated, 1).await.len(),
        1,
        "the moved file keeps its line"
    );
}

/// An image request's line says which URL grammar served it and the presets applied (zimg's
/// `t=`, imgproxy's `pr:` and `default`, none for thumbor here), a refused one too (the presets
/// once its URL parsed: before, a 400 or 404 said neither), a cached result asked again too
/// (answered from the route's memory of requests); other routes' lines say neither.
#[tokio::test(flavor = "multi_thread")]
async fn image_requests_name_their_grammar_and_presets() {
    let dir = tempfile::tempdir().unwrap();
    let (root, store) = (dir.path().join("root"), dir.path().join("store"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("photo.jpg"), photo()).unwrap();
    let (json, template) = (dir.path().join("json.log"), dir.path().join("t.log"));
    let c = client();
    for (log, format) in [
        (&json, "json"),
        (&template, "{uri} {image_grammar} {image_presets}"),
    ] {
        let larder = Larder::start(&format!(
            r#"
[access_log]
path = {log:?}
format = {format:?}

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/ping"
  respond = {{ body = "pong" }}
  [[listener.route]]
  path = "/"
  [listener.route.images]
  dir = {store:?}
  root = {root:?}
  [listener.route.images.presets]
  small = "w=40"
  [listener.route.images.imgproxy.presets]
  default = "q:70"
  thumb = "rs:fill:50:50"
"#,
            log = log.display().to_string(),
            store = store.display().to_string(),
            root = root.display().to_string(),
        ))
        .await;
        let up = send(
            &c,
            "POST",
            &larder.url("/upload"),
            &[("content-type", "image/jpeg")],
            photo(),
        )
        .await;
        assert_eq!(up.status, 200, "{}", up.text());
        let md5: serde_json::Value = serde_json::from_slice(&up.body).unwrap();
        let md5 = md5["md5"].as_str().unwrap().to_string();
        for (path, status) in [
            (format!("/{md5}?t=small"), 200),
            ("/insecure/pr:thumb/plain/photo.jpg".to_string(), 200),
            ("/unsafe/30x30/photo.jpg".to_string(), 200),
            ("/ping".to_string(), 200),
            // Refused ones name theirs too: presets once the URL parsed.
            (format!("/{md5}?t=small&w=x"), 400),
            ("/insecure/pr:thumb/plain/missing.jpg".to_string(), 404),
            ("/insecure/nope:1/plain/photo.jpg".to_string(), 400),
            ("/unsafe/30x30/missing.jpg".to_string(), 404),
            // A cached result asked again: answered from the route's memory of requests.
            ("/insecure/pr:thumb/plain/photo.jpg".to_string(), 200),
        ] {
            let r = get(&c, &larder.url(&path), &[]).await;
            assert_eq!(r.status, status, "{path}: {}", r.text());
        }
        let got = lines(log, 10).await;
        assert_eq!(got.len(), 10, "{got:?}");
        if format == "json" {
            let v: Vec<serde_json::Value> = got
                .iter()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            let said = |i: usize| (v[i]["image_grammar"].clone(), v[i]["image_presets"].clone());
            use serde_json::Value::Null;
            assert_eq!(said(0), (Null, Null), "the upload: {}", got[0]);
            assert_eq!(said(1), ("zimg".into(), "small".into()), "{}", got[1]);
            assert_eq!(
                said(2),
                ("imgproxy".into(), "default,thumb".into()),
                "{}",
                got[2]
            );
            assert_eq!(said(3), ("thumbor".into(), Null), "{}", got[3]);
            assert_eq!(said(4), (Null, Null), "{}", got[4]);
            assert_eq!(said(5), ("zimg".into(), Null), "{}", got[5]);
            assert_eq!(
                said(6),
                ("imgproxy".into(), "default,thumb".into()),
                "{}",
                got[6]
            );
            assert_eq!(said(7), ("imgproxy".into(), Null), "{}", got[7]);
            assert_eq!(said(8), ("thumbor".into(), Null), "{}", got[8]);
            assert_eq!(said(9), said(2), "{}", got[9]);
        } else {
            assert_eq!(
                got[1..],
                [
                    format!("/{md5}?t=small zimg small"),
                    "/insecure/pr:thumb/plain/photo.jpg imgproxy default,thumb".to_string(),
                    "/unsafe/30x30/photo.jpg thumbor -".to_string(),
                    "/ping - -".to_string(),
                    format!("/{md5}?t=small&w=x zimg -"),
                    "/insecure/pr:thumb/plain/missing.jpg imgproxy default,thumb".to_string(),
                    "/insecure/nope:1/plain/photo.jpg imgproxy -".to_string(),
                    "/unsafe/30x30/missing.jpg thumbor -".to_string(),
                    "/insecure/pr:thumb/plain/photo.jpg imgproxy default,thumb".to_string(),
                ]
            );
        }
    }
}
