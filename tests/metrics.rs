//! Metrics on the admin listener: `/metrics` needs the token, counts requests by route,
//! method, status class and cache result where they complete (on any worker thread), has a
//! duration histogram and the server's gauges, and its text passes the OpenMetrics parser of
//! Prometheus's own Python client (from PyPI, installed by tests/provision).

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::*;

const TOKEN: &str = "s3cret";

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_requests_by_route_method_status_and_cache_result() {
    let origin = Origin::start(|seen, _| {
        if seen.path.starts_with("/private") {
            return Reply::ok("mine").header("cache-control", "no-store");
        }
        Reply::ok("cacheable body").header("cache-control", "max-age=60")
    })
    .await;
    let config = format!(
        r#"
[admin]
token = "{TOKEN}"
listen = "127.0.0.1:0"

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/ping"
  respond = {{ body = "pong" }}
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = "{}" }}
"#,
        origin.url()
    );
    let larder = Larder::start(&config).await;
    let c = client();
    let url = |p: &str| larder.url(p);
    assert_eq!(get(&c, &url("/a"), &[]).await.cache(), "MISS");
    for _ in 0..3 {
        assert_eq!(get(&c, &url("/a"), &[]).await.cache(), "HIT");
    }
    assert_eq!(send(&c, "HEAD", &url("/a"), &[], b"").await.cache(), "HIT");
    assert_eq!(
        send(&c, "POST", &url("/b"), &[], b"x").await.cache(),
        "BYPASS"
    );
    get(&c, &url("/private"), &[]).await;
    get(&c, &url("/ping"), &[]).await;
    // Over HTTP/2 too (hyper runs each stream on a task of its own).
    let h2 = h2_client();
    assert_eq!(get(&h2, &url("/a"), &[]).await.cache(), "HIT");

    let denied = get(&c, &larder.admin_url("/metrics"), &[]).await;
    assert_eq!(denied.status, 401);
    let auth = format!("Bearer {TOKEN}");
    let got = get(
        &c,
        &larder.admin_url("/metrics"),
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(got.status, 200);
    assert!(got
        .header("content-type")
        .unwrap()
        .starts_with("application/openmetrics-text; version=1.0.0"));
    let text = got.text();
    let route = format!("{} */", larder.addr);
    let line = |method: &str, status: &str, cache: &str, n: u32| {
        format!(
            "larder_requests_total{{route=\"{route}\",method=\"{method}\",status=\"{status}\",cache=\"{cache}\"}} {n}\n"
        )
    };
    for want in [
        // /a once, and /private (no-store: a miss each time)
        line("GET", "2xx", "MISS", 2),
        line("GET", "2xx", "HIT", 4),
        line("HEAD", "2xx", "HIT", 1),
        line("POST", "2xx", "BYPASS", 1),
    ] {
        assert!(text.contains(&want), "missing {want:?} in:\n{text}");
    }
    assert!(
        text.contains(&format!(
            "larder_requests_total{{route=\"{} */ping\",method=\"GET\",status=\"2xx\",cache=\"none\"}} 1",
            larder.addr
        )),
        "{text}"
    );
    assert!(text.contains(&format!(
        "larder_request_duration_seconds_count{{route=\"{route}\",cache=\"HIT\"}} 5"
    )));
    assert!(text.contains("larder_cache_entries 1\n"), "{text}");
    assert!(text.contains("larder_connections_open "), "{text}");

    // Prometheus's own OpenMetrics parser reads it whole (it is strict: `# EOF`, one block
    // per family, counters' `_total`).
    let said = parsed_families(&text);
    for family in [
        "larder_requests",
        "larder_request_duration_seconds",
        "larder_cache_entries",
        "larder_connections_open",
        "larder_sent_bytes",
    ] {
        assert!(said.split_whitespace().any(|w| w == family), "{said}");
    }
}

/// The names of the families in `text`, as Prometheus's own OpenMetrics parser reads them (it
/// is strict: `# EOF`, one block per family, counters' `_total`); fails when it refuses them.
fn parsed_families(text: &str) -> String {
    let python = pip(PIP_PACKAGES);
    let mut parse = Command::new(python)
        .arg("-c")
        .arg(
            "import sys\n\
             from prometheus_client.openmetrics.parser import text_string_to_metric_families\n\
             fams = list(text_string_to_metric_families(sys.stdin.read()))\n\
             print(' '.join(sorted(f.name for f in fams)))\n",
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    parse
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = parse.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "parser refused:\n{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of the sample `series` (name and labels, as printed) in a scrape, 0 if absent.
fn sample(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

/// Bytes sent by route and content coding, counted where each response completes: a stored
/// body by its length, a streamed body of unknown length chunk by chunk as it goes; bytes saved
/// are the identity body's length less the compressed variant's, per response that sent one.
/// The status JSON (what the dashboard reads) has the same totals.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_bytes_sent_by_coding_and_bytes_saved() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let page = "<p>larder keeps one copy per encoding</p>\n".repeat(500);
    let produced = std::sync::Arc::new(AtomicU64::new(0));
    let (body, made) = (page.clone(), std::sync::Arc::clone(&produced));
    let origin = Origin::start(move |seen, _| {
        if seen.path == "/stream" {
            return Reply::generated(300_000, false, &made).header("cache-control", "no-store");
        }
        Reply::ok(body.clone())
            .header("content-type", "text/html")
            .header("cache-control", "max-age=600")
    })
    .await;
    let config = format!(
        r#"
[admin]
token = "{TOKEN}"
listen = "127.0.0.1:0"

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  proxy = {{ upstream = "{}" }}
"#,
        origin.url()
    );
    let larder = Larder::start(&config).await;
    let c = client();
    let url = larder.url("/page");
    get(&c, &url, &[]).await;
    wait_for_encoding(&c, &url, "gzip").await;
    let auth = format!("Bearer {TOKEN}");
    let scrape = || async {
        get(
            &c,
            &larder.admin_url("/metrics"),
            &[("authorization", &auth)],
        )
        .await
        .text()
    };
    let route = format!("{} */", larder.addr);
    let gzip = format!("larder_sent_bytes_total{{route=\"{route}\",encoding=\"gzip\"}}");
    let identity = format!("larder_sent_bytes_total{{route=\"{route}\",encoding=\"identity\"}}");
    let saved = format!("larder_saved_bytes_total{{route=\"{route}\"}}");
    let before = scrape().await;

    let mut gz_len = 0;
    for _ in 0..5 {
        let g = get(&c, &url, &[("accept-encoding", "gzip")]).await;
        assert_eq!(g.header("content-encoding"), Some("gzip"));
        assert_eq!(decode(&g.body, Some("gzip")), page.as_bytes());
        gz_len = g.body.len() as u64;
    }
    for _ in 0..2 {
        let g = get(&c, &url, &[]).await;
        assert_eq!(g.body.len(), page.len());
    }
    let streamed = get(&c, &larder.url("/stream"), &[]).await;
    assert_eq!(streamed.body.len(), 300_000);
    assert!(streamed.header("content-length").is_none(), "streamed");
    assert_eq!(produced.load(Ordering::Relaxed), 300_000);

    let after = scrape().await;
    let delta = |series: &str| sample(&after, series) - sample(&before, series);
    assert!(gz_len > 0 && gz_len < page.len() as u64 / 4, "{gz_len}");
    assert_eq!(delta(&gzip), 5 * gz_len, "{after}");
    assert_eq!(delta(&identity), 2 * page.len() as u64 + 300_000, "{after}");
    assert_eq!(delta(&saved), 5 * (page.len() as u64 - gz_len), "{after}");

    let status: serde_json::Value = serde_json::from_str(
        &get(
            &c,
            &larder.admin_url("/_larder/status"),
            &[("authorization", &auth)],
        )
        .await
        .text(),
    )
    .unwrap();
    assert_eq!(status["bytes"]["saved"], sample(&after, &saved), "{status}");
    assert_eq!(
        status["bytes"]["sent_by_encoding"]["gzip"],
        sample(&after, &gzip),
        "{status}"
    );
}

/// Without an admin listener nothing is counted, and the admin API has no `/metrics`.
#[tokio::test(flavor = "multi_thread")]
async fn no_admin_listener_counts_nothing() {
    let origin = Origin::start(|_, _| Reply::ok("x")).await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    assert_eq!(get(&c, &larder.url("/a"), &[]).await.status, 200);
    assert!(larder.metrics_text().is_none());
}

/// The quick start: `--admin ADDR` beside other flags serves the admin API with a generated
/// token, printed at start (or the one `--admin-token` gives).
#[tokio::test(flavor = "multi_thread")]
async fn admin_flag_with_a_generated_or_given_token() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "hello").unwrap();
    for given in [None, Some("given-token")] {
        let (listen, admin) = (free_port(), free_port());
        let mut cmd = larder_command();
        cmd.args(["--root", dir.path().to_str().unwrap()])
            .args([
                "--listen",
                &listen.to_string(),
                "--admin",
                &admin.to_string(),
            ])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if let Some(t) = given {
            cmd.args(["--admin-token", t]);
        }
        let mut child = Child(cmd.spawn().unwrap());
        let token = match given {
            Some(t) => t.to_string(),
            None => {
                let out = child.0.stdout.take().unwrap();
                let said = (BufReader::new(out).lines().map_while(Result::ok))
                    .find(|l| l.starts_with("admin API on"))
                    .expect("the generated token is printed");
                let token = said.rsplit(' ').next().unwrap().to_string();
                assert_eq!(token.len(), 48, "{said}");
                token
            }
        };
        let c = client();
        let url = format!("http://{admin}/metrics");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while Raw::try_connect(admin).await.is_err() {
            assert!(std::time::Instant::now() < deadline, "admin did not start");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(
            get(&c, &format!("http://{listen}/a.txt"), &[]).await.body,
            "hello"
        );
        assert_eq!(get(&c, &url, &[]).await.status, 401);
        let auth = format!("Bearer {token}");
        let got = get(&c, &url, &[("authorization", &auth)]).await;
        assert_eq!(got.status, 200);
        assert!(
            got.text().contains("larder_requests_total{"),
            "{}",
            got.text()
        );
    }
}

/// The admin API's status (JSON) and the running configuration with its secrets redacted.
#[tokio::test(flavor = "multi_thread")]
async fn admin_status_and_redacted_config() {
    let origin = Origin::start(|_, _| Reply::ok("x").header("cache-control", "max-age=60")).await;
    let config = format!(
        "[admin]\ntoken = \"{TOKEN}\"\nlisten = \"127.0.0.1:0\"\n{}",
        PROXY.replace("{origin}", &origin.url())
    );
    let larder = Larder::start(&config).await;
    let c = client();
    get(&c, &larder.url("/a"), &[]).await;
    let auth = format!("Bearer {TOKEN}");
    let status = get(
        &c,
        &larder.admin_url("/_larder/status"),
        &[("authorization", &auth)],
    )
    .await;
    let v: serde_json::Value = serde_json::from_slice(&status.body).unwrap();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["cache"]["urls"], 1);
    assert!(v["connections"]["open"].as_u64().unwrap() >= 1, "{v}");
    assert!(v["uptime_seconds"].as_u64().is_some());
    let cfg = get(
        &c,
        &larder.admin_url("/_larder/config"),
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(cfg.status, 200);
    let text = cfg.text();
    assert!(text.contains("token = \"<redacted>\""), "{text}");
    assert!(!text.contains(TOKEN), "{text}");
    assert!(text.contains("[[listener]]"), "{text}");
    let denied = get(&c, &larder.admin_url("/_larder/config"), &[]).await;
    assert_eq!(denied.status, 401);
}

/// `larder stats --once --json` prints the admin API's status for scripts; `--once` alone, the
/// table; a wrong token is a clear error.
#[tokio::test(flavor = "multi_thread")]
async fn larder_stats_once() {
    let origin = Origin::start(|_, _| Reply::ok("x").header("cache-control", "max-age=60")).await;
    let config = format!(
        "[admin]\ntoken = \"{TOKEN}\"\nlisten = \"127.0.0.1:0\"\n{}",
        PROXY.replace("{origin}", &origin.url())
    );
    let larder = Larder::start(&config).await;
    let c = client();
    for _ in 0..3 {
        get(&c, &larder.url("/a"), &[]).await;
    }
    let admin = larder
        .admin_url("")
        .trim_start_matches("http://")
        .to_string();
    let stats = |args: &[&str]| {
        let mut cmd = larder_command();
        cmd.args(["stats", "--admin", &admin]).args(args);
        cmd.output().unwrap()
    };
    let out = stats(&["--token", TOKEN, "--once", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["requests"]["total"], 3);
    assert_eq!(v["requests"]["by_cache"]["HIT"], 2);
    let out = stats(&["--token", TOKEN, "--once"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("hit ratio              66.7%"), "{table}");
    assert!(table.contains("sent                     3 B"), "{table}");
    let out = stats(&["--token", "wrong", "--once"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"));
}

/// A reload registers the new routers' routes with the metrics: requests on them are counted
/// on worker threads that counted requests before it, and a scrape reads every thread's
/// counts whatever routes they knew.
#[tokio::test(flavor = "multi_thread")]
async fn routes_added_by_a_reload_are_counted() {
    let config = |body: &str| {
        format!(
            r#"
[admin]
token = "{TOKEN}"
listen = "127.0.0.1:0"

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  respond = {{ body = "{body}" }}
"#
        )
    };
    let larder = Larder::start(&config("before")).await;
    let c = client();
    for _ in 0..5 {
        assert_eq!(get(&c, &larder.url("/"), &[]).await.text(), "before");
    }
    larder.reload(&config("after")).unwrap();
    for _ in 0..7 {
        assert_eq!(get(&c, &larder.url("/"), &[]).await.text(), "after");
    }
    let text = larder.metrics_text().unwrap();
    let counted: u64 = text
        .lines()
        .filter(|l| l.starts_with("larder_requests_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(counted, 12, "{text}");
    let auth = format!("Bearer {TOKEN}");
    let status = get(
        &c,
        &larder.admin_url("/_larder/status"),
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(status.status, 200);
    let status: serde_json::Value = serde_json::from_str(&status.text()).unwrap();
    assert_eq!(status["requests"]["total"], 12, "{status}");
}

/// docs/metrics.md lists every family `/metrics` exposes (a larder with a pool, push, a disk
/// tier and TLS: most families show), and Grafana's hit ratio is the one the server states.
#[tokio::test(flavor = "multi_thread")]
async fn every_family_exposed_is_listed_in_docs_metrics_md() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(|_, _| Reply::ok("x").status(503)).await;
    let dead = free_port();
    let larder = Larder::start(&format!(
        r#"
[admin]
token = "{TOKEN}"
listen = "127.0.0.1:0"

[access_log]
path = "{log}"

[cache.disk]
dir = "{disk}"
max_size = "64MiB"

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/records/"
  push = {{ dir = "{push}", token = "t" }}
  [[listener.route]]
  path = "/dead/"
  proxy = {{ upstream = "http://{dead}" }}
  [[listener.route]]
  proxy = {{ upstream = "{origin}" }}
"#,
        log = dir.path().join("access.log").display(),
        disk = dir.path().join("disk").display(),
        push = dir.path().join("push").display(),
        origin = origin.url(),
    ))
    .await;
    let c = client();
    get(&c, &larder.url("/a"), &[]).await;
    get(&c, &larder.url("/dead/a"), &[]).await;
    let text = larder.metrics_text().unwrap();
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md")).unwrap();
    let mut seen = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        let exposed = if kind == "counter" {
            format!("`{name}_total`")
        } else {
            format!("`{name}`")
        };
        assert!(
            docs.contains(&exposed),
            "{exposed} is not in docs/metrics.md"
        );
        seen.push(name.to_string());
    }
    for family in [
        "larder_upstream_errors",
        "larder_push_records",
        "larder_cache_tier_hits",
    ] {
        assert!(seen.iter().any(|s| s == family), "{family} in {seen:?}");
    }
    // One kind per failure: a refused connection, a 503 answer.
    assert!(text.contains("kind=\"connect\"} 1"), "{text}");
    assert!(text.contains("kind=\"5xx\"} 1"), "{text}");
    // Grafana's hit ratio: the cache results the server counts as hits over lookups.
    let grafana = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/dist/grafana-dashboard.json"
    ))
    .unwrap();
    let names = |of: &[usize]| {
        (of.iter())
            .map(|i| larder::metrics::CACHE[*i])
            .collect::<Vec<_>>()
            .join("|")
    };
    let hits = format!(
        "cache=~\\\"{}\\\"}}[5m])) / sum(rate(larder_requests_total{{instance=~\\\"$instance\\\",cache=~\\\"{}\\\"",
        names(&larder::metrics::HIT_RESULTS),
        names(&larder::metrics::LOOKUP_RESULTS)
    );
    assert!(
        grafana.contains(&hits),
        "{hits} in dist/grafana-dashboard.json"
    );
    let ops = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .unwrap();
    let alert = format!(
        "cache=~\"{}\"}}[15m])) / sum(rate(larder_requests_total{{cache=~\"{}\"",
        names(&larder::metrics::HIT_RESULTS).replace('|', "\\|"),
        names(&larder::metrics::LOOKUP_RESULTS).replace('|', "\\|")
    );
    assert!(ops.contains(&alert), "{alert} in docs/operations.md");
}

/// An image route's figures: transforms by grammar and output format (a cached result is not
/// one), their time and their stages' (decode, resize, encode), the pool's queue, originals by outcome, bytes saved; Prometheus's parser
/// reads them and docs/metrics.md lists each. A server without image routes exposes none.
#[tokio::test(flavor = "multi_thread")]
async fn image_routes_count_transforms_sources_and_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("photo.jpg"), photo()).unwrap();
    let larder = Larder::start(&format!(
        r#"
[admin]
token = "{TOKEN}"
listen = "127.0.0.1:0"

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  [listener.route.images]
  root = {root:?}
"#,
        root = root.display().to_string(),
    ))
    .await;
    let c = client();
    for (path, status) in [
        ("/insecure/rs:fit:50:50/plain/photo.jpg@webp", 200),
        ("/insecure/rs:fit:50:50/plain/photo.jpg@webp", 200),
        ("/unsafe/40x40/filters:format(png)/photo.jpg", 200),
        ("/insecure/rs:fit:50:50/plain/missing.jpg", 404),
    ] {
        let r = get(&c, &larder.url(path), &[]).await;
        assert_eq!(r.status, status, "{path}: {}", r.text());
    }
    let text = larder.metrics_text().unwrap();
    for (series, want) in [
        (
            "larder_image_transforms_total{grammar=\"imgproxy\",format=\"webp\"}",
            1,
        ),
        (
            "larder_image_transforms_total{grammar=\"thumbor\",format=\"png\"}",
            1,
        ),
        ("larder_image_transform_duration_seconds_count", 2),
        // Each transform's stages, timed on the pool.
        (
            "larder_image_stage_duration_seconds_count{stage=\"decode\"}",
            2,
        ),
        (
            "larder_image_stage_duration_seconds_count{stage=\"resize\"}",
            2,
        ),
        (
            "larder_image_stage_duration_seconds_count{stage=\"encode\"}",
            2,
        ),
        ("larder_image_queue_depth", 0),
        // The cached result asked again is answered from the route's memory of results
        // (images::hits): no original loaded for it.
        ("larder_image_sources_total{outcome=\"local\"}", 2),
        ("larder_image_sources_total{outcome=\"not_found\"}", 1),
        ("larder_image_rejections_total{reason=\"queue_full\"}", 0),
        // Both transforms decode the photo at 1/8: the second finds the first's raster kept.
        ("larder_image_decoded_cache_misses_total", 1),
        ("larder_image_decoded_cache_hits_total", 1),
    ] {
        assert_eq!(sample(&text, series), want, "{series} in {text}");
    }
    let (source, output) = (
        sample(&text, "larder_image_source_bytes_total"),
        sample(&text, "larder_image_output_bytes_total"),
    );
    assert_eq!(source, 2 * photo().len() as u64);
    assert!(output > 0 && output < source, "{output}");
    assert_eq!(
        sample(&text, "larder_image_saved_bytes_total"),
        source - output
    );
    let said = parsed_families(&text);
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md")).unwrap();
    let mut images = 0;
    for line in text.lines() {
        let Some((name, kind)) =
            (line.strip_prefix("# TYPE larder_image_")).and_then(|rest| rest.split_once(' '))
        else {
            continue;
        };
        images += 1;
        let name = format!("larder_image_{name}");
        assert!(said.split_whitespace().any(|w| w == name), "{said}");
        let exposed = match kind {
            "counter" => format!("`{name}_total`"),
            _ => format!("`{name}`"),
        };
        assert!(
            docs.contains(&exposed),
            "{exposed} is not in docs/metrics.md"
        );
    }
    assert!(sample(&text, "larder_image_decoded_cache_bytes") >= 80 * 107 * 3);
    assert_eq!(images, 13, "{text}");

    // Without an image route: no image families.
    let plain = Larder::start(&format!(
        "[admin]\ntoken = \"{TOKEN}\"\nlisten = \"127.0.0.1:0\"\n[[listener]]\naddr = \"127.0.0.1:0\"\n  [[listener.route]]\n  respond = {{ body = \"x\" }}\n"
    ))
    .await;
    get(&c, &plain.url("/"), &[]).await;
    assert!(!plain.metrics_text().unwrap().contains("larder_image"));
}
