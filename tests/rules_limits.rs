//! Limits (issue #41 item 4, docs/rules.md "Limits"), through a real larder in front of a real
//! origin: `rate_limit` per key with the IETF RateLimit fields, on a clock the test moves;
//! with `delay`; shared by two nodes through a real redis-server (`fleet = true`), and decided
//! locally once Redis is gone; `in_flight` held until the response's body is done (a slow
//! streaming origin); `limit_rate` delivering whole; `max_body` by length and while a chunked
//! body streams (413, not 502); and examples/edge.toml's `/api/` limit as it is written.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;

/// An origin answering `ok PATH`, never cacheable (each request reaches it).
async fn plain() -> Origin {
    Origin::start(|req, _| {
        Reply::ok(format!("ok {}", req.path)).header("cache-control", "no-store")
    })
    .await
}

fn route(origin: &Origin, rules: &str) -> String {
    format!(
        r#"
[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = "{}" }}
{rules}
"#,
        origin.url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_a_second_per_client_then_429_with_the_ratelimit_fields() {
    let clock = larder::clock::Clock::manual();
    let origin = plain().await;
    let larder = Larder::start_at(
        &route(
            &origin,
            r#"
    [[listener.route.rule]]
    name = "api"
    when = { path = "/api/**" }
    rate_limit = { rate = "5/s" }
    [[listener.route.rule]]
    name = "keyed"
    when = { path = "/keyed/**" }
    rate_limit = { rate = "2/m", key = "header:x-api-key", status = 503 }
"#,
        ),
        clock.clone(),
    )
    .await;
    let c = client();

    for left in (0..5).rev() {
        let r = get(&c, &larder.url("/api/a"), &[]).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("ratelimit-policy"), Some(r#""api";q=5;w=1"#));
        assert_eq!(
            r.header("ratelimit"),
            Some(format!(r#""api";r={left};t=1"#).as_str())
        );
    }
    let r = get(&c, &larder.url("/api/b"), &[]).await;
    assert_eq!(r.status, 429, "the sixth within the second");
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("ratelimit"), Some(r#""api";r=0;t=1"#));
    assert_eq!(r.header("ratelimit-policy"), Some(r#""api";q=5;w=1"#));
    assert_eq!(
        origin.hits(),
        5,
        "a rejected request never reaches the origin"
    );
    // Paths outside the rule are not limited.
    assert_eq!(get(&c, &larder.url("/other"), &[]).await.status, 200);

    // 200 ms later one more fits; a second later, five again.
    larder.advance(Duration::from_millis(200));
    assert_eq!(get(&c, &larder.url("/api/c"), &[]).await.status, 200);
    assert_eq!(get(&c, &larder.url("/api/c"), &[]).await.status, 429);
    larder.advance(Duration::from_secs(1));
    for _ in 0..5 {
        assert_eq!(get(&c, &larder.url("/api/d"), &[]).await.status, 200);
    }
    assert_eq!(get(&c, &larder.url("/api/d"), &[]).await.status, 429);

    // By API key: each key its own bucket; no key: the client's address.
    let key = |k: &'static str| [("x-api-key", k)];
    for _ in 0..2 {
        assert_eq!(
            get(&c, &larder.url("/keyed/x"), &key("one")).await.status,
            200
        );
    }
    let r = get(&c, &larder.url("/keyed/x"), &key("one")).await;
    assert_eq!(r.status, 503, "the rule's status");
    assert_eq!(r.header("retry-after"), Some("30"));
    assert_eq!(r.header("ratelimit-policy"), Some(r#""keyed";q=2;w=60"#));
    assert_eq!(
        get(&c, &larder.url("/keyed/x"), &key("two")).await.status,
        200
    );
    assert_eq!(get(&c, &larder.url("/keyed/x"), &[]).await.status, 200);
    assert_eq!(get(&c, &larder.url("/keyed/x"), &[]).await.status, 200);
    assert_eq!(get(&c, &larder.url("/keyed/x"), &[]).await.status, 503);
    larder.advance(Duration::from_secs(30));
    assert_eq!(
        get(&c, &larder.url("/keyed/x"), &key("one")).await.status,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_an_unchanged_limit_and_starts_a_changed_one_afresh() {
    let origin = plain().await;
    let config = |rate: &str, header: &str| {
        route(
            &origin,
            &format!(
                r#"
    [[listener.route.rule]]
    response_headers = {{ set = {{ x-version = "{header}" }} }}
    [[listener.route.rule]]
    name = "api"
    rate_limit = {{ rate = "{rate}" }}
"#
            ),
        )
    };
    let larder = Larder::start_at(&config("3/s", "1"), larder::clock::Clock::manual()).await;
    let c = client();
    for _ in 0..3 {
        assert_eq!(get(&c, &larder.url("/a"), &[]).await.status, 200);
    }
    assert_eq!(get(&c, &larder.url("/a"), &[]).await.status, 429);

    // Another rule changed, this one not: its bucket is still empty.
    larder.reload(&config("3/s", "2")).unwrap();
    let r = get(&c, &larder.url("/a"), &[]).await;
    assert_eq!(r.status, 429, "a reload is not a way around a limit");
    assert_eq!(r.header("x-version"), Some("2"), "the reload took effect");

    // The limit itself changed: a new bucket, full.
    larder.reload(&config("4/s", "2")).unwrap();
    for _ in 0..4 {
        assert_eq!(get(&c, &larder.url("/a"), &[]).await.status, 200);
    }
    assert_eq!(get(&c, &larder.url("/a"), &[]).await.status, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_delay_the_burst_waits_its_turn() {
    let origin = plain().await;
    let larder = Larder::start_at(
        &route(
            &origin,
            r#"
    [[listener.route.rule]]
    rate_limit = { rate = "20/s", burst = 2, delay = true }
"#,
        ),
        larder::clock::Clock::manual(),
    )
    .await;
    let c = client();
    let mut tasks = Vec::new();
    for i in 0..23 {
        let (c, url) = (c.clone(), larder.url(&format!("/d/{i}")));
        tasks.push(tokio::spawn(async move {
            let start = std::time::Instant::now();
            let r = get(&c, &url, &[]).await;
            (r.status.as_u16(), start.elapsed())
        }));
    }
    let mut statuses = Vec::new();
    let mut longest = Duration::ZERO;
    for t in tasks {
        let (status, took) = t.await.unwrap();
        statuses.push(status);
        if status == 200 {
            longest = longest.max(took);
        }
    }
    statuses.sort();
    // Twenty at once, the burst's two delayed (50 and 100 ms: the interval is 50 ms), the
    // one beyond the burst rejected.
    let mut expected = vec![200; 22];
    expected.push(429);
    assert_eq!(statuses, expected);
    assert!(longest >= Duration::from_millis(100), "{longest:?}");
    assert_eq!(origin.hits(), 22);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_rate_is_named_with_its_line() {
    let toml = r#"
[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  respond = { status = 200 }
    [[listener.route.rule]]
    rate_limit = { rate = "5/fortnight" }
"#;
    let refused = |toml: &str| match larder::config::Config::parse(toml, "t.toml") {
        Ok(_) => panic!("accepted: {toml}"),
        Err(e) => e.to_string(),
    };
    let e = refused(toml);
    assert!(e.contains("line 8"), "{e}");
    assert!(e.contains("5/fortnight"), "{e}");
    let toml = toml.replace(
        "rate = \"5/fortnight\"",
        "rate = \"5/s\", key = \"nonsense\"",
    );
    let e = refused(&toml);
    assert!(e.contains("not a limit key"), "{e}");
    let toml = toml.replace("key = \"nonsense\"", "fleet = true");
    let e = refused(&toml);
    assert!(
        e.contains("line 8") && e.contains("needs [cache.shared]"),
        "{e}"
    );
}

/// An origin whose answers stream: the head and a first chunk at once, the end only when the
/// test says so; it counts the requests it has begun answering.
async fn slow_streams(
    release: tokio::sync::watch::Receiver<bool>,
    begun: Arc<AtomicUsize>,
) -> String {
    use tokio::io::AsyncWriteExt;
    let addr = raw_origin(move |mut s| {
        let (mut release, begun) = (release.clone(), Arc::clone(&begun));
        async move {
            if read_head(&mut s).await.is_none() {
                return;
            }
            let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncache-control: no-store\r\nconnection: close\r\n\r\n5\r\nhello\r\n";
            if s.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            begun.fetch_add(1, Ordering::SeqCst);
            let _ = release.wait_for(|r| *r).await;
            let _ = s.write_all(b"6\r\n world\r\n0\r\n\r\n").await;
        }
    })
    .await;
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_holds_a_place_until_the_body_is_done() {
    let (release, waiting) = tokio::sync::watch::channel(false);
    let begun = Arc::new(AtomicUsize::new(0));
    let origin = slow_streams(waiting, Arc::clone(&begun)).await;
    let config = format!(
        r#"
[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = "{origin}" }}
    [[listener.route.rule]]
    name = "streams"
    in_flight = {{ max = 10 }}
"#
    );
    let larder = Larder::start(&config).await;
    let c = client();
    let mut streams = Vec::new();
    for i in 0..10 {
        let (c, url) = (c.clone(), larder.url(&format!("/s/{i}")));
        streams.push(tokio::spawn(async move { get(&c, &url, &[]).await }));
    }
    // Until the origin has begun all ten (a condition, not a time).
    for _ in 0..1000 {
        if begun.load(Ordering::SeqCst) == 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(begun.load(Ordering::SeqCst), 10);
    // A reload keeps the places the ten hold (the rule unchanged), as nginx's limit_conn zone.
    larder.reload(&config).unwrap();
    let r = get(&c, &larder.url("/s/eleventh"), &[]).await;
    assert_eq!(
        r.status, 429,
        "the eleventh while ten stream, after a reload"
    );
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""streams";q=10;qu="concurrent-requests""#)
    );
    assert_eq!(
        begun.load(Ordering::SeqCst),
        10,
        "it never reached the origin"
    );

    release.send(true).unwrap();
    for s in streams {
        let r = s.await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), "hello world");
    }
    // Their bodies done, their places are free.
    for i in 0..10 {
        let r = get(&c, &larder.url(&format!("/s/after{i}")), &[]).await;
        assert_eq!(r.status, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_rate_delivers_the_whole_body() {
    let body: Vec<u8> = (0..96 * 1024).map(|i| (i % 251) as u8).collect();
    let sent = body.clone();
    let origin =
        Origin::start(move |_, _| Reply::ok(sent.clone()).header("cache-control", "max-age=60"))
            .await;
    let larder = Larder::start(&route(
        &origin,
        r#"
    [[listener.route.rule]]
    limit_rate = { rate = "256KiB/s", after = "32KiB" }
"#,
    ))
    .await;
    let c = client();
    let r = get(&c, &larder.url("/big"), &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), body.len());
    assert!(
        r.body[..] == body[..],
        "the paced body arrives whole and in order"
    );
    // From the cache, paced too.
    let r = get(&c, &larder.url("/big"), &[]).await;
    assert_eq!(r.cache(), "HIT");
    assert!(r.body[..] == body[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_body_answers_413_by_length_and_while_streaming() {
    let origin = Origin::start(|req, _| Reply::ok(format!("got {}", req.body.len()))).await;
    let larder = Larder::start(&route(
        &origin,
        r#"
    [[listener.route.rule]]
    max_body = "1KiB"
"#,
    ))
    .await;
    let c = client();
    // By Content-Length: answered before the body is read; the origin sees nothing.
    let r = send(&c, "POST", &larder.url("/up"), &[], vec![b'x'; 2000]).await;
    assert_eq!(r.status, 413);
    assert_eq!(origin.hits(), 0);
    let r = send(&c, "POST", &larder.url("/up"), &[], vec![b'x'; 1024]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "got 1024");

    // Chunked, within the limit: forwarded whole.
    let mut raw = Raw::connect(larder.addr).await;
    raw.write(
        "POST /up HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n12c\r\n".to_string()
            + &"y".repeat(300)
            + "\r\n12c\r\n"
            + &"y".repeat(300)
            + "\r\n0\r\n\r\n",
    )
    .await;
    let r = raw.response().await;
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "got 600");

    // Chunked, past it: 413 (not the 502 or 400 of a broken upload).
    let mut raw = Raw::connect(larder.addr).await;
    let chunk = format!("258\r\n{}\r\n", "z".repeat(600));
    raw.write(
        "POST /up HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n".to_string()
            + &chunk
            + &chunk
            + "0\r\n\r\n",
    )
    .await;
    let r = raw.response().await;
    assert_eq!(r.status, 413, "{}", r.head);
    assert_eq!(r.text(), "request body too large\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_one_fleet_limit_and_decide_alone_without_redis() {
    let mut redis = RedisServer::start();
    let clock = larder::clock::Clock::manual();
    let origin = plain().await;
    let toml = |admin: u16| {
        format!(
            r#"
[admin]
listen = "127.0.0.1:{admin}"
token = "s3cret"

[cache.shared]
url = "{}"
timeout = "3s"

{}"#,
            redis.url(),
            route(
                &origin,
                r#"
    [[listener.route.rule]]
    name = "fleet"
    rate_limit = { rate = "5/s", fleet = true }
"#
            )
        )
    };
    let a = Larder::start_at(&toml(free_port().port()), clock.clone()).await;
    let b = Larder::start_at(&toml(free_port().port()), clock.clone()).await;
    let c = client();
    let statuses = |r: Vec<Got>| r.iter().map(|g| g.status.as_u16()).collect::<Vec<_>>();
    let mut got = Vec::new();
    for node in [&a, &b, &a, &b, &a] {
        got.push(get(&c, &node.url("/f"), &[]).await);
    }
    assert_eq!(statuses(got), vec![200; 5]);
    let r = get(&c, &b.url("/f"), &[]).await;
    assert_eq!(r.status, 429, "the sixth across both nodes");
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("ratelimit"), Some(r#""fleet";r=0;t=1"#));
    assert_eq!(get(&c, &a.url("/f"), &[]).await.status, 429);
    let keys = redis.cli(&["--scan", "--pattern", "larder:rl:fleet:*"]);
    assert_eq!(keys.lines().count(), 1, "one key for this client: {keys}");

    // A second later, the fleet's bucket is full again.
    clock.advance(Duration::from_secs(1));
    for node in [&b, &b, &a, &a, &b] {
        assert_eq!(get(&c, &node.url("/f"), &[]).await.status, 200);
    }
    assert_eq!(get(&c, &a.url("/f"), &[]).await.status, 429);

    // Twenty at once on both nodes: the script decides each atomically, five pass.
    clock.advance(Duration::from_secs(1));
    let mut racing = Vec::new();
    for i in 0..20 {
        let (c, url) = (c.clone(), [&a, &b][i % 2].url("/f"));
        racing.push(tokio::spawn(async move { get(&c, &url, &[]).await.status }));
    }
    let mut passed = 0;
    for r in racing {
        passed += usize::from(r.await.unwrap() == 200);
    }
    assert_eq!(passed, 5);

    // Redis gone: each node decides alone, with its own bucket.
    redis.kill();
    clock.advance(Duration::from_secs(1));
    for _ in 0..5 {
        assert_eq!(get(&c, &a.url("/f"), &[]).await.status, 200);
    }
    assert_eq!(get(&c, &a.url("/f"), &[]).await.status, 429);
    assert_eq!(get(&c, &b.url("/f"), &[]).await.status, 200);
    let metrics = get(
        &c,
        &a.admin_url("/metrics"),
        &[("authorization", "Bearer s3cret")],
    )
    .await
    .text();
    let local = (metrics.lines())
        .find_map(|l| l.strip_prefix("larder_rate_limit_local_decisions_total{tier=\"shared\"} "))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert_eq!(local, "6", "counted: {metrics}");
}

/// examples/edge.toml as it is written (its addresses aside): `/api/` takes 5 requests a
/// second per client address, no burst; the sixth within the second gets 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_example_limits_api_to_five_a_second() {
    let clock = larder::clock::Clock::manual();
    let origin = plain().await;
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/edge.toml"))
            .unwrap();
    assert!(example.contains("127.0.0.1:8480") && example.contains("http://127.0.0.1:8481"));
    let toml = example
        .replace("127.0.0.1:8480", "127.0.0.1:0")
        .replace("http://127.0.0.1:8481", &origin.url());
    let larder = Larder::start_at(&toml, clock).await;
    let c = client();
    for _ in 0..5 {
        assert_eq!(get(&c, &larder.url("/api/items"), &[]).await.status, 200);
    }
    let r = get(&c, &larder.url("/api/items"), &[]).await;
    assert_eq!(r.status, 429);
    assert!(r.header("retry-after").is_some());
    larder.advance(Duration::from_secs(1));
    assert_eq!(get(&c, &larder.url("/api/items"), &[]).await.status, 200);
}
