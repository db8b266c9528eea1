//! The dashboard (and the push demo page) in a real browser: headless Chromium (Debian's
//! package) driven by playwright-core (npm), both installed by tests/provision. It logs in with
//! the admin token, sees the counters move when requests are sent to larder, sees 4xx/5xx per
//! route and upstream failures per backend, charts with axes and units, purges an entry from
//! the cache browser, and edits the configuration file (a refused file's error at its line, an
//! apply, a rollback). The configuration API's guards are tested without the browser.

mod common;

use common::*;

/// Runs `tests/browser/<script>` with node, Chromium and playwright-core (from tests/provision),
/// off the runtime's threads (larder serves the browser meanwhile); the one JSON line it prints.
async fn browser(script: &'static str, args: Vec<String>) -> serde_json::Value {
    let chromium = apt("chromium", "chromium");
    let playwright = npm("playwright-core", "1.64.1");
    let path = format!("{}/tests/browser/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("node")
            .arg(path)
            .args(args)
            .env("PLAYWRIGHT_DIR", &playwright)
            .env("CHROMIUM", &chromium)
            .output()
            .expect("node runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).expect("one JSON line")
}

/// Larder started from a file (`--config`, as the editor needs), the file's directory kept.
async fn from_file(toml: &str) -> (Larder, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("larder.toml");
    let toml = format!(
        "[server]\nstate_dir = \"{}\"\n{toml}",
        dir.path().join("state").display()
    );
    std::fs::write(&path, toml).unwrap();
    let cfg = larder::config::Config::load(&path).expect("loads");
    (Larder::from_config(cfg).await, dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_logs_in_shows_live_counters_errors_and_purges() {
    let origin = Origin::start(|seen, _| match seen.path.as_str() {
        "/missing" => Reply::ok("no\n").status(404),
        "/boom" => Reply::ok("boom\n").status(500),
        // Compressible pages: hits of the gzip variants save bandwidth.
        _ => Reply::ok(format!("<p>page {}</p>\n", seen.path).repeat(100))
            .header("content-type", "text/html")
            .header("cache-control", "max-age=600"),
    })
    .await;
    // A backend that refuses connections: a port bound, then closed.
    let dead = free_port();
    let (l, _dir) = from_file(&format!(
        r#"
[admin]
token = "s3cret"
listen = "127.0.0.1:0"

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  proxy = {{ upstream = "{}" }}

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  proxy = {{ upstream = "http://{dead}" }}
"#,
        origin.url()
    ))
    .await;
    let admin = l.admin_url("");
    let site = l.url("");
    let bad = format!("http://{}", l.addr_of(1));
    let shots = std::env::var("LARDER_DASHBOARD_SCREENSHOTS").unwrap_or_default();
    let seen = browser(
        "dashboard.mjs",
        vec![admin, site, "s3cret".into(), shots, bad],
    )
    .await;
    assert_eq!(seen["wrong_token"], "wrong token");
    let (before, after) = (
        seen["total_before"].as_f64().unwrap(),
        seen["total_after"].as_f64().unwrap(),
    );
    assert!(after >= before + 30.0, "{seen}");
    // 30 requests over 3 URLs: 27 hits.
    assert!(seen["hits"].as_f64().unwrap() >= 27.0, "{seen}");
    assert!(
        seen["pools"].as_str().unwrap().contains(&origin.url()),
        "{seen}"
    );
    assert!(
        seen["bw_saved"].as_str().unwrap().contains("% · "),
        "{seen}"
    );
    assert!(seen["bw_out"].as_str().unwrap().ends_with("/s"), "{seen}");
    assert_eq!(seen["listed"], 3, "{seen}");
    assert_eq!(seen["after_purge"], 2, "{seen}");
    // The purge happened in larder, not only on the page.
    let host = l.addr.to_string();
    assert!(!l.has_entry(&host, "/page1"));
    assert!(l.has_entry(&host, "/page0"));

    // Errors: 4 404s and 4 500s on the first route, 4 502s on the second; 4 connection
    // failures and 4 5xx answers from backends.
    assert_eq!(seen["err4_total"], "4", "{seen}");
    assert_eq!(seen["err5_total"], "8", "{seen}");
    assert_eq!(seen["uperr"], "8", "{seen}");
    assert_eq!(seen["uperr_kinds"], "connect 4 · 5xx 4", "{seen}");
    let routes = seen["routes"].as_array().unwrap();
    let row = |port: u16| {
        routes
            .iter()
            .find(|r| r[0].as_str().unwrap().contains(&format!(":{port}")))
            .unwrap_or_else(|| panic!("route of port {port} in {seen}"))
    };
    assert_eq!(row(l.addr.port())[3], "4", "{seen}");
    assert_eq!(row(l.addr.port())[4], "4", "{seen}");
    assert_eq!(row(l.addr_of(1).port())[4], "4", "{seen}");
    let pools = seen["pools_rows"].as_array().unwrap();
    let dead_row = (pools.iter())
        .find(|r| r[1].as_str().unwrap().contains(&dead.to_string()))
        .unwrap();
    assert_eq!(dead_row[5], "4", "connect errors: {seen}");
    let origin_row = (pools.iter())
        .find(|r| r[1] == origin.url().trim_end_matches('/'))
        .unwrap_or_else(|| panic!("{seen}"));
    assert_eq!(origin_row[7], "4", "5xx: {seen}");
    // One hit ratio, said on the page.
    assert!(
        seen["hit_def"]
            .as_str()
            .unwrap()
            .contains("HIT + STALE + REVALIDATED"),
        "{seen}"
    );
    // The charts' axes: units on the values, the clock on the time.
    let drawn: Vec<&str> = (seen["drawn"].as_array().unwrap().iter())
        .map(|d| d.as_str().unwrap())
        .collect();
    for label in [" req/s", "100%", "B/s", "p99", "5xx"] {
        assert!(
            drawn.iter().any(|d| d.contains(label)),
            "{label} in {drawn:?}"
        );
    }
    assert!(
        drawn
            .iter()
            .any(|d| d.len() >= 5 && d.as_bytes()[2] == b':'),
        "a time of day on the x axis: {drawn:?}"
    );
    // Interpolated within the bucket, not its bound.
    assert!(
        (seen["p50"].as_f64().unwrap() - 0.0015).abs() < 1e-9,
        "{seen}"
    );
    assert_eq!(seen["rates"][0].as_f64(), Some(10.0), "{seen}");
    assert!(seen["rates"][1].is_null(), "{seen}");
    assert!(seen["p99_inf"].is_null(), "beyond the last bound: {seen}");
    assert_eq!(seen["image_tiles"], 0, "no image route: {seen}");
    // At 1400 px every tile holds its lines: all of one height.
    let heights: Vec<f64> = (seen["tile_heights"].as_array().unwrap().iter())
        .map(|h| h.as_f64().unwrap())
        .collect();
    assert!(
        heights.iter().all(|h| (h - heights[0]).abs() < 0.5),
        "{heights:?}"
    );

    // The configuration editor: redacted, a refused file's error at its line, an apply, a
    // rollback to the file before it.
    assert!(
        seen["config_note"]
            .as_str()
            .unwrap()
            .starts_with("editing "),
        "{seen}"
    );
    assert_eq!(seen["config_redacted"], true, "{seen}");
    let error = seen["config_error"].as_str().unwrap();
    assert!(error.contains("key cache.max_size"), "{error}");
    assert!(error.starts_with("line "), "{error}");
    let versions = seen["config_versions"].as_array().unwrap();
    assert_eq!(versions.len(), 2, "{seen}");
    assert!(!seen["config_after_rollback"]
        .as_str()
        .unwrap()
        .contains("# edited from the dashboard"));
    let file = std::fs::read_to_string(_dir.path().join("larder.toml")).unwrap();
    assert!(!file.contains("# edited"), "{file}");
    assert!(
        file.contains("token = \"s3cret\""),
        "the secret kept: {file}"
    );
}

/// The page needs no token (it holds no data); everything it reads does.
#[tokio::test]
async fn the_events_need_the_token() {
    let l = Larder::start(
        "[admin]\ntoken = \"s3cret\"\nlisten = \"127.0.0.1:0\"\n[[listener]]\naddr = \"127.0.0.1:0\"\n  [[listener.route]]\n  respond = { body = \"x\" }\n",
    )
    .await;
    let c = client();
    let page = get(&c, &l.admin_url("/_larder/dashboard"), &[]).await;
    assert_eq!(page.status, 200);
    assert!(page.text().contains("larder"));
    assert!(page
        .header("content-security-policy")
        .unwrap()
        .contains("default-src 'none'"));
    assert_eq!(
        get(&c, &l.admin_url("/_larder/events"), &[]).await.status,
        401
    );
    let r = request(
        &c,
        "GET",
        &l.admin_url("/_larder/events"),
        &[("authorization", "Bearer s3cret")],
        b"",
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let mut body = r.into_body();
    use http_body_util::BodyExt;
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    let text = String::from_utf8_lossy(&first);
    assert!(
        text.starts_with("data: {") && text.ends_with("\n\n"),
        "{text}"
    );
    let status: serde_json::Value = serde_json::from_str(&text[6..text.len() - 2]).unwrap();
    assert!(status["latency"]["counts"].is_array(), "{status}");
    assert!(status["unix_ms"].as_u64().unwrap() > 0, "{status}");
    // The history's first sample is taken as the server starts.
    let auth = [("authorization", "Bearer s3cret")];
    let h = get(&c, &l.admin_url("/_larder/history"), &auth).await;
    assert_eq!(h.status, 200);
    let h: serde_json::Value = serde_json::from_str(&h.text()).unwrap();
    assert_eq!(h["every_seconds"], 10);
    assert!(!h["samples"].as_array().unwrap().is_empty(), "{h}");
    // Without a file, the editor is read-only and says why.
    let f = get(&c, &l.admin_url("/_larder/config/file"), &auth).await;
    let f: serde_json::Value = serde_json::from_str(&f.text()).unwrap();
    assert_eq!(f["editable"], false);
    assert!(f["why"].as_str().unwrap().contains("--config"), "{f}");
}

/// The configuration API: the token, same-origin only, errors at their line, an atomic write,
/// rollback, and a reload that refuses the file leaves the previous one in place.
#[tokio::test]
async fn the_configuration_is_checked_applied_and_rolled_back() {
    let (l, dir) = from_file(
        "[admin]\ntoken = \"s3cret\"\nlisten = \"127.0.0.1:0\"\n[[listener]]\naddr = \"127.0.0.1:0\"\n  [[listener.route]]\n  respond = { body = \"one\" }\n",
    )
    .await;
    let path = dir.path().join("larder.toml");
    let before = std::fs::read_to_string(&path).unwrap();
    let c = client();
    let url = |p: &str| l.admin_url(p);
    let post = |p: String, body: String, extra: Vec<(&'static str, String)>| {
        let c = c.clone();
        async move {
            let mut h: Vec<(&str, &str)> = vec![("authorization", "Bearer s3cret")];
            h.extend(extra.iter().map(|(k, v)| (*k, v.as_str())));
            let r = request(&c, "POST", &p, &h, body.as_bytes()).await;
            let status = r.status().as_u16();
            use http_body_util::BodyExt;
            let b = r.into_body().collect().await.unwrap().to_bytes();
            (
                status,
                serde_json::from_slice::<serde_json::Value>(&b).unwrap_or_default(),
            )
        }
    };
    // No token, no check.
    let r = request(
        &c,
        "POST",
        &url("/_larder/config/check"),
        &[],
        before.as_bytes(),
    )
    .await;
    assert_eq!(r.status(), 401);
    // Another site's page cannot post, even with the token.
    let (status, _) = post(
        url("/_larder/config/apply"),
        before.clone(),
        vec![("origin", "http://evil.example".into())],
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = post(
        url("/_larder/config/apply"),
        before.clone(),
        vec![("sec-fetch-site", "cross-site".into())],
    )
    .await;
    assert_eq!(status, 403);
    // A bad value: its line and key, as `larder check` says.
    let bad = format!("{before}[cache]\nmax_size = 12x\n");
    let (status, v) = post(url("/_larder/config/check"), bad.clone(), vec![]).await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["line"], before.lines().count() + 2, "{v}");
    let (status, _) = post(url("/_larder/config/apply"), bad, vec![]).await;
    assert_eq!(status, 422);
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        before,
        "not written"
    );
    // Applied: the file replaced, the route answers the new body; no temporary file left.
    let two = before.replace("\"one\"", "\"two\"");
    let (status, v) = post(
        url("/_larder/config/apply"),
        two.clone(),
        vec![("origin", l.admin_url(""))],
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), two);
    assert_eq!(get(&c, &l.url("/"), &[]).await.text(), "two");
    let left: Vec<String> = (std::fs::read_dir(dir.path()).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!left.iter().any(|n| n.contains("candidate")), "{left:?}");
    // A file that passes the check but the reload refuses (a new listener on an address
    // taken): the file that runs is put back.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let unreadable = format!(
        "{two}[[listener]]\naddr = \"{}\"\n  [[listener.route]]\n  respond = {{ body = \"x\" }}\n",
        taken.local_addr().unwrap()
    );
    let (status, v) = post(url("/_larder/config/check"), unreadable.clone(), vec![]).await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = post(url("/_larder/config/apply"), unreadable, vec![]).await;
    assert_eq!(status, 422, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the reload refused it"),
        "{v}"
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), two, "put back");
    assert_eq!(get(&c, &l.url("/"), &[]).await.text(), "two");
    // A pool's CA file that cannot be read: refused by the check, as `larder check` does.
    let no_ca = format!(
        "{two}[pool.app]\nbackends = [\"https://127.0.0.1:1\"]\n[pool.app.tls]\nca = \"{}\"\n",
        dir.path().join("no-such-ca.pem").display()
    );
    let (status, v) = post(url("/_larder/config/check"), no_ca, vec![]).await;
    assert_eq!(status, 422, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("pool.app"),
        "{v}"
    );
    // Versions: the file before, then the one applied; roll back to the first.
    let f = get(
        &c,
        &url("/_larder/config/file"),
        &[("authorization", "Bearer s3cret")],
    )
    .await;
    let f: serde_json::Value = serde_json::from_str(&f.text()).unwrap();
    assert_eq!(f["editable"], true);
    assert!(!f["text"].as_str().unwrap().contains("s3cret"), "redacted");
    let versions = f["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 2, "{f}");
    let first = versions[1]["id"].as_str().unwrap();
    let (status, v) = post(
        url(&format!("/_larder/config/rollback?version={first}")),
        String::new(),
        vec![],
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), before);
    assert_eq!(get(&c, &l.url("/"), &[]).await.text(), "one");
    let (status, _) = post(
        url("/_larder/config/rollback?version=../../etc/passwd"),
        String::new(),
        vec![],
    )
    .await;
    assert_eq!(status, 404);

    // The file grown past what a configuration may be (or gone): said, not read whole.
    let big = format!(
        "# {}\n",
        "x".repeat(larder::config::MAX_CONFIG_BYTES as usize)
    );
    std::fs::write(&path, big).unwrap();
    let auth = [("authorization", "Bearer s3cret")];
    let f = get(&c, &url("/_larder/config/file"), &auth).await;
    assert_eq!(f.status, 500, "{}", f.text());
    assert!(f.text().contains("larger than 16 MiB"), "{}", f.text());
    std::fs::remove_file(&path).unwrap();
    let f = get(&c, &url("/_larder/config/file"), &auth).await;
    assert_eq!(f.status, 500, "{}", f.text());
    assert!(f.text().contains("larder.toml"), "{}", f.text());
}

/// A push route's demo page in the browser: EventSource over the handed-over HTTP/1.1 stream,
/// and a WebSocket subscription with a filter, as docs/push.md shows them.
#[tokio::test(flavor = "multi_thread")]
async fn the_push_demo_page_shows_records_live_and_a_websocket_subscribes() {
    let dir = tempfile::tempdir().unwrap();
    let l = Larder::start(&format!(
        "[[listener]]\naddr = \"127.0.0.1:0\"\n  [[listener.route]]\n  path = \"/records/\"\n  push = {{ dir = \"{}\", token = \"t0k\", demo = true }}\n",
        dir.path().display()
    ))
    .await;
    let site = l.url("/records");
    let seen = browser("push.mjs", vec![site, "t0k".into()]).await;
    assert_eq!(seen["initial"], r#"{"color":"red","price":42}"#, "{seen}");
    assert_eq!(seen["changed"], r#"{"color":"blue","price":40}"#, "{seen}");
    assert_eq!(seen["rows"], 2, "{seen}");
    assert_eq!(seen["after_delete"], 1, "{seen}");
    let ws = seen["ws"].as_array().unwrap();
    let set = ws.iter().find(|m| m["event"] == "set").unwrap();
    assert_eq!(set["id"], "cars/4", "{seen}");
    assert_eq!(set["sub"], "cheap");
    assert!(!ws.iter().any(|m| m["id"] == "cars/3"), "{seen}");
}

/// An image route adds its tiles: transforms per second and in total, their p50 / p99 (a
/// time), the queue (empty) and refusals, the originals fetched · cached · failed (here read
/// from `root`, one missing).
#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_shows_image_transforms_queue_and_sources() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("photo.jpg"), photo()).unwrap();
    let (l, _dir) = from_file(&format!(
        r#"
[admin]
token = "s3cret"
listen = "127.0.0.1:0"

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  [listener.route.images]
  root = "{}"
"#,
        root.path().display()
    ))
    .await;
    let seen = browser(
        "dashboard_images.mjs",
        vec![l.admin_url(""), l.url(""), "s3cret".into()],
    )
    .await;
    assert_eq!(seen["tiles"], 4, "{seen}");
    assert_eq!(seen["img-total"], "4", "{seen}");
    let rate: f64 = seen["img-rate"].as_str().unwrap().parse().unwrap();
    assert!(rate > 0.0, "{seen}");
    let lat = seen["img-lat"].as_str().unwrap();
    assert!(lat.contains(" / ") && lat.contains('s'), "{seen}");
    assert_eq!(seen["img-queue"], "0", "{seen}");
    assert_eq!(seen["img-rejected"], "0", "{seen}");
    // 4 loads of photo.jpg from root, 1 missing: the cached result asked again is answered
    // from the route's index of requests (images::hits), without loading its original.
    assert_eq!(seen["img-src"], "0 · 4 · 1", "{seen}");
}
