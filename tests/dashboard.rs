//! The dashboard (and the push demo page) in a real browser: headless Chromium (Debian's
//! package) driven by playwright-core (npm), both installed by tests/provision. It logs in with
//! the admin token, sees the counters move when requests are sent to larder, and purges an
//! entry from the cache browser.

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

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_logs_in_shows_live_counters_and_purges() {
    let origin = Origin::start(|seen, _| {
        // Compressible pages: hits of the gzip variants save bandwidth.
        Reply::ok(format!("<p>page {}</p>\n", seen.path).repeat(100))
            .header("content-type", "text/html")
            .header("cache-control", "max-age=600")
    })
    .await;
    let l = Larder::start(&format!(
        r#"
[admin]
token = "s3cret"
listen = "127.0.0.1:0"

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  proxy = {{ upstream = "{}" }}
"#,
        origin.url()
    ))
    .await;
    let admin = l.admin_url("");
    let site = l.url("");
    let shot = std::env::var("LARDER_DASHBOARD_SCREENSHOT").unwrap_or_default();
    let seen = browser("dashboard.mjs", vec![admin, site, "s3cret".into(), shot]).await;
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
