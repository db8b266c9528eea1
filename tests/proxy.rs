//! The caching proxy end to end: a test origin, larder in front of it, a client, all over
//! loopback sockets. Each test asserts on the wire and on what the origin was asked.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;

const JSON: &str = "{\"k\": \"value value value value value value value value value value\"}";

fn big_json() -> String {
    let mut s = String::from("[");
    for i in 0..400 {
        s.push_str(&format!(
            "{{\"id\":{i},\"name\":\"repository-{i}\",\"stars\":{}}},",
            i * 7
        ));
    }
    s.push_str("{}]");
    s
}

#[tokio::test(flavor = "multi_thread")]
async fn miss_then_hit_with_age() {
    let origin = Origin::start(|_, _| {
        Reply::ok(JSON)
            .header("cache-control", "max-age=60")
            .header("content-type", "application/json")
    })
    .await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    let url = format!("http://{}/a", larder.addr);
    let first = get(&c, &url, &[]).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.cache(), "MISS");
    assert_eq!(first.body, JSON);
    let second = get(&c, &url, &[]).await;
    assert_eq!(second.cache(), "HIT");
    assert_eq!(second.body, JSON);
    assert!(second.header("age").is_some());
    assert_eq!(origin.hits(), 1);
    // A different query string is a different key.
    let other = get(&c, &format!("{url}?x=1"), &[]).await;
    assert_eq!(other.cache(), "MISS");
    assert_eq!(origin.hits(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn age_from_origin_is_added() {
    // RFC 9111 §4.2.3: the Age the origin (or an upstream cache) reports counts.
    let origin = Origin::start(|_, _| {
        Reply::ok("x")
            .header("cache-control", "max-age=600")
            .header("age", "100")
    })
    .await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    let url = format!("http://{}/", larder.addr);
    get(&c, &url, &[]).await;
    let hit = get(&c, &url, &[]).await;
    let age: u64 = hit.header("age").unwrap().parse().unwrap();
    assert!((100..=102).contains(&age), "age {age}");
}

#[tokio::test(flavor = "multi_thread")]
async fn expiry_by_max_age_s_maxage_and_expires() {
    // One clock for the origin's Date and Expires and larder's cache, moved past the lifetimes.
    let clock = larder::clock::Clock::adjustable();
    let origin_clock = clock.clone();
    let origin = Origin::start_at(&clock, move |seen, _| {
        let r = Reply::ok("body");
        match seen.path.as_str() {
            // Lifetimes of 2-3 s: Date has whole seconds, so up to 1 s of apparent age is
            // counted from the start (§4.2.3) and a 1 s lifetime could already be spent.
            "/max-age" => r.header("cache-control", "max-age=2"),
            // s-maxage wins over max-age in a shared cache (§5.2.2.10).
            "/s-maxage" => r.header("cache-control", "max-age=600, s-maxage=2"),
            _ => {
                let now = origin_clock.now();
                r.header("date", &httpdate::fmt_http_date(now)).header(
                    "expires",
                    &httpdate::fmt_http_date(now + Duration::from_secs(3)),
                )
            }
        }
    })
    .await;
    let larder = Larder::start_at(&PROXY.replace("{origin}", &origin.url()), clock).await;
    let c = client();
    for path in ["/max-age", "/s-maxage", "/expires"] {
        let url = format!("http://{}{path}", larder.addr);
        assert_eq!(get(&c, &url, &[]).await.cache(), "MISS", "{path}");
        assert_eq!(get(&c, &url, &[]).await.cache(), "HIT", "{path}");
    }
    larder.advance(Duration::from_millis(3100));
    for path in ["/max-age", "/s-maxage", "/expires"] {
        let url = format!("http://{}{path}", larder.addr);
        assert_eq!(get(&c, &url, &[]).await.cache(), "EXPIRED", "{path}");
    }
    assert_eq!(origin.hits(), 6);
}

#[tokio::test(flavor = "multi_thread")]
async fn no_store_and_private_are_never_served_from_cache() {
    let origin = Origin::start(|seen, n| {
        let cc = if seen.path == "/no-store" {
            "no-store, max-age=60"
        } else {
            "private, max-age=60"
        };
        Reply::ok(format!("response {n}")).header("cache-control", cc)
    })
    .await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    for path in ["/no-store", "/private"] {
        let url = format!("http://{}{path}", larder.addr);
        let a = get(&c, &url, &[]).await;
        let b = get(&c, &url, &[]).await;
        assert_ne!(a.body, b.body, "{path} was served from cache");
        assert_ne!(b.cache(), "HIT");
    }
    assert_eq!(origin.hits(), 4);
    assert_eq!(larder.cache_entries(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn no_cache_is_revalidated_every_time() {
    // §5.2.2.4: stored, but never reused without a successful validation.
    let origin = Origin::start(|seen, _| {
        if seen.headers.get("if-none-match").map(|v| v.as_bytes()) == Some(b"\"v1\"") {
            Reply::ok("").status(304).header("etag", "\"v1\"")
        } else {
            Reply::ok("the body")
                .header("cache-control", "no-cache")
                .header("etag", "\"v1\"")
        }
    })
    .await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    let url = format!("http://{}/nc", larder.addr);
    assert_eq!(get(&c, &url, &[]).await.cache(), "MISS");
    let second = get(&c, &url, &[]).await;
    assert_eq!(second.cache(), "REVALIDATED");
    assert_eq!(second.body, "the body");
    let seen = origin.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].headers["if-none-match"], "\"v1\"");
}

#[tokio::test(flavor = "multi_thread")]
async fn authorization_rule() {
    // §3.5: a response to a request with Authorization is stored only when explicitly shareable.
    let origin = Origin::start(|seen, n| {
        let cc = if seen.path == "/public" {
            "public, max-age=60"
        } else {
            "max-age=60"
        };
        Reply::ok(format!("r{n}")).header("cache-control", cc)
    })
    .await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    let auth = [("authorization", "Bearer secret")];
    let plain = format!("http://{}/plain", larder.addr);
    get(&c, &plain, &auth).await;
    let again = get(&c, &plain, &auth).await;
    assert_ne!(again.cache(), "HIT");
    // Nothing fetched with credentials leaked to an anonymous client either.
    let anon = get(&c, &plain, &[]).await;
    assert_eq!(anon.cache(), "MISS");
    let public = format!("http://{}/public", larder.addr);
    get(&c, &public, &auth).await;
    assert_eq!(get(&c, &public, &auth).await.cache(), "HIT");
    assert_eq!(origin.hits(), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn set_cookie_responses_are_not_shared() {
    let origin = Origin::start(|_, n| {
        Reply::ok(format!("user {n}"))
            .header("cache-control", "max-age=60")
            .header("set-cookie", &format!("session={n}"))
    })
    .await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    let url = format!("http://{}/me", larder.addr);
    let a = get(&c, &url, &[]).await;
    let b = get(&c, &url, &[]).await;
    assert_eq!(a.header("set-cookie"), Some("session=0"));
    assert_eq!(b.header("set-cookie"), Some("session=1"));
    assert_eq!(origin.hits(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn set_cookie_stored_without_the_cookie_when_configured() {
    let origin = Origin::start(|_, n| {
        Reply::ok("shared body")
            .header("cache-control", "max-age=60")
            .header("set-cookie", &format!("session={n}"))
    })
    .await;
    let cfg = format!("[cache]\nstore_set_cookie = true\n{PROXY}");
    let larder = larder(&cfg, &origin.url()).await;
    let c = client();
    let url = format!("http://{}/page", larder.addr);
    let first = get(&c, &url, &[]).await;
    assert_eq!(first.header("set-cookie"), Some("session=0"));
    let hit = get(&c, &url, &[]).await;
    assert_eq!(hit.cache(), "HIT");
    assert_eq!(
        hit.header("set-cookie"),
        None,
        "a cookie leaked to another client"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn coalesces_100_concurrent_misses_into_one_fetch() {
    let origin = Origin::start(|_, _| {
        Reply::ok(big_json())
            .header("cache-control", "max-age=60")
            .header("content-type", "application/json")
            .delay(Duration::from_millis(300))
    })
    .await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    let url = Arc::new(format!("http://{}/cold", larder.addr));
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let (c, url) = (c.clone(), url.clone());
        tasks.push(tokio::spawn(async move { get(&c, &url, &[]).await }));
    }
    let expected = big_json();
    for t in tasks {
        let g = t.await.unwrap();
        assert_eq!(g.status, 200);
        assert_eq!(g.body, expected.as_bytes());
    }
    assert_eq!(origin.hits(), 1);
}

/// A URL whose response may not be stored (no-store) is marked for a while (hit-for-miss, as
/// Varnish): its next misses reach the origin together instead of each waiting on another
/// request's fill only to be released by it. Once the origin's answer may be stored, it is,
/// and the URL is served from the cache again.
#[tokio::test(flavor = "multi_thread")]
async fn misses_of_a_url_answered_no_store_do_not_wait_on_each_other() {
    let cacheable = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = Arc::clone(&cacheable);
    let origin = Origin::start(move |_, _| {
        if flag.load(std::sync::atomic::Ordering::SeqCst) {
            Reply::ok("now cacheable").header("cache-control", "max-age=60")
        } else {
            Reply::ok("not stored")
                .header("cache-control", "no-store")
                .delay(Duration::from_millis(1200))
        }
    })
    .await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    let url = Arc::new(format!("http://{}/live", larder.addr));
    assert_eq!(get(&c, &url, &[]).await.body, "not stored");
    assert_eq!(origin.hits(), 1);
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let (c, url) = (c.clone(), url.clone());
        tasks.push(tokio::spawn(async move { get(&c, &url, &[]).await }));
    }
    // Well within the origin's 1.2 s: all five are there (waiting on a leader, four would
    // not have left yet).
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        origin.hits(),
        6,
        "the five misses went to the origin together"
    );
    for t in tasks {
        let g = t.await.unwrap();
        assert_eq!((g.status.as_u16(), &g.body[..]), (200, &b"not stored"[..]));
    }
    // The origin's answer may be stored now: stored, then served from the cache.
    cacheable.store(true, std::sync::atomic::Ordering::SeqCst);
    let g = get(&c, &url, &[]).await;
    assert_eq!((g.cache(), &g.body[..]), ("MISS", &b"now cacheable"[..]));
    let g = get(&c, &url, &[]).await;
    assert_eq!((g.cache(), &g.body[..]), ("HIT", &b"now cacheable"[..]));
    assert_eq!(origin.hits(), 7);
}

#[tokio::test(flavor = "multi_thread")]
async fn regression_followers_of_a_failed_fill_get_its_error() {
    // The leader's fetch (marked by a request header larder forwards) sends half its body and
    // dies, also when larder sends it again; every other fetch succeeds. The requests waiting
    // on the leader get its error at once instead of each sending its own request upstream;
    // nothing is cached and the key is not poisoned.
    let origin = Origin::start(|seen, _| {
        let r = Reply::ok("complete and correct body").header("cache-control", "max-age=60");
        if seen.headers.contains_key("x-leader") {
            r.delay(Duration::from_millis(300)).abort()
        } else {
            r
        }
    })
    .await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    let url = Arc::new(format!("http://{}/flaky", larder.addr));
    let leader = {
        let (c, url) = (c.clone(), url.clone());
        tokio::spawn(async move { get(&c, &url, &[("x-leader", "1")]).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut waiters = Vec::new();
    for _ in 0..20 {
        let (c, url) = (c.clone(), url.clone());
        waiters.push(tokio::spawn(async move { get(&c, &url, &[]).await }));
    }
    let l = leader.await.unwrap();
    assert_eq!(l.status, 502, "{:?}", String::from_utf8_lossy(&l.body));
    for w in waiters {
        let g = w.await.unwrap();
        assert_eq!(g.status, 502, "{:?}", String::from_utf8_lossy(&g.body));
    }
    let fetched_alone = origin
        .seen()
        .iter()
        .filter(|s| !s.headers.contains_key("x-leader"))
        .count();
    assert_eq!(fetched_alone, 0, "waiters fetched on their own");
    // The key is not poisoned: the next request fills and the one after hits.
    let next = get(&c, &url, &[]).await;
    assert_eq!(next.cache(), "MISS");
    assert_eq!(next.body, "complete and correct body");
    assert_eq!(get(&c, &url, &[]).await.cache(), "HIT");
}

#[tokio::test(flavor = "multi_thread")]
async fn regression_stalled_upstream_body_times_out() {
    // The origin sends 100 of 1,000 bytes and goes silent for 20 s.
    let origin = Origin::start(|seen, _| {
        let cc = if seen.path == "/stored" {
            "max-age=60"
        } else {
            "no-store"
        };
        Reply::ok(vec![b'x'; 1000])
            .header("cache-control", cc)
            .stall(Duration::from_secs(20))
    })
    .await;
    let larder = larder(&proxy_with(r#"body_timeout = "300ms""#), &origin.url()).await;
    let c = client();
    let base = format!("http://{}", larder.addr);
    let bound = Duration::from_secs(5);

    // A fill: its client and a request waiting on it both get 504, nothing is stored, and the
    // waiter did not fetch on its own.
    let leader = {
        let (c, url) = (c.clone(), format!("{base}/stored"));
        tokio::spawn(async move { get(&c, &url, &[]).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let waiter = {
        let (c, url) = (c.clone(), format!("{base}/stored"));
        tokio::spawn(async move { get(&c, &url, &[]).await })
    };
    let l = tokio::time::timeout(bound, leader)
        .await
        .expect("the fill gave up")
        .unwrap();
    let w = tokio::time::timeout(bound, waiter)
        .await
        .expect("the waiter got an answer")
        .unwrap();
    assert_eq!((l.status.as_u16(), w.status.as_u16()), (504, 504));
    assert_eq!(origin.hits(), 1);
    assert_eq!(larder.cache_entries(), 0);

    // Streamed (not stored): the head went out with Content-Length 1000; the body then fails,
    // so the client sees a truncated response, never a complete one.
    let url = format!("{base}/streamed");
    let resp = tokio::time::timeout(bound, request(&c, "GET", &url, &[], b""))
        .await
        .expect("head");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-length"], "1000");
    let body = tokio::time::timeout(bound, http_body_util::BodyExt::collect(resp.into_body()))
        .await
        .expect("the body was cut off, not left hanging");
    assert!(body.is_err(), "a truncated body ended cleanly");
}

#[tokio::test(flavor = "multi_thread")]
async fn regression_coalesced_followers_respect_vary_cookie() {
    coalesced_requests_get_their_own_variant("cookie", "session=alice", "session=bob").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn regression_coalesced_followers_respect_vary_accept_language() {
    coalesced_requests_get_their_own_variant("accept-language", "en", "fr").await;
}

/// A slow origin answers with `Vary: <field>` and echoes the field. A request with value `a`
/// leads the fill; requests with `b` arriving meanwhile must not get `a`'s variant: they get
/// their own, fetched once for both; another `a` gets the leader's.
async fn coalesced_requests_get_their_own_variant(field: &'static str, a: &str, b: &str) {
    let origin = Origin::start(move |seen, _| {
        let v = seen
            .headers
            .get(field)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        Reply::ok(format!("for {v}"))
            .header("cache-control", "max-age=60")
            .header("vary", field)
            .delay(Duration::from_millis(300))
    })
    .await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    let url = Arc::new(format!("http://{}/varies", larder.addr));
    let ask = |value: &str| {
        let (c, url, value) = (c.clone(), url.clone(), value.to_string());
        tokio::spawn(async move { get(&c, &url, &[(field, &value)]).await })
    };
    let first = ask(a);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let others = [ask(b), ask(b), ask(a)];
    assert_eq!(first.await.unwrap().body, format!("for {a}"));
    let [b1, b2, a2] = others;
    let (b1, b2, a2) = (b1.await.unwrap(), b2.await.unwrap(), a2.await.unwrap());
    assert_eq!(b1.body, format!("for {b}"), "{}", b1.cache());
    assert_eq!(b2.body, format!("for {b}"), "{}", b2.cache());
    assert_eq!(a2.body, format!("for {a}"));
    assert_eq!(a2.cache(), "HIT");
    assert_eq!(origin.hits(), 2, "one fetch per variant");
    // Both variants are stored.
    assert_eq!(get(&c, &url, &[(field, a)]).await.body, format!("for {a}"));
    assert_eq!(get(&c, &url, &[(field, b)]).await.body, format!("for {b}"));
    assert_eq!(origin.hits(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn accept_encoding_matrix_decodes_to_identity() {
    let body = big_json();
    let b2 = body.clone();
    let origin = Origin::start(move |_, _| {
        Reply::ok(b2.clone())
            .header("cache-control", "max-age=60")
            .header("content-type", "application/json")
    })
    .await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    let url = format!("http://{}/data.json", larder.addr);
    get(&c, &url, &[]).await;
    wait_for_encoding(&c, &url, "br").await;
    let cases: &[(Option<&str>, Option<&str>)] = &[
        (None, None),
        (Some("gzip"), Some("gzip")),
        (Some("br"), Some("br")),
        (Some("zstd"), Some("zstd")),
        (Some("identity"), None),
        (Some("gzip;q=0, identity"), None),
        (Some("br;q=0, gzip, zstd;q=0"), Some("gzip")),
        (Some("*"), Some("br")),
        (Some("*;q=0, zstd"), Some("zstd")),
        (Some("identity;q=0, gzip"), Some("gzip")),
        (Some("gzip, deflate, br, zstd"), Some("br")),
        (Some("%%garbage;;q=x, ,"), None),
        (Some("GZIP;Q=0.5"), Some("gzip")),
    ];
    for (ae, want) in cases {
        let headers: Vec<(&str, &str)> = ae.iter().map(|v| ("accept-encoding", *v)).collect();
        let g = get(&c, &url, &headers).await;
        assert_eq!(g.cache(), "HIT");
        assert_eq!(
            g.header("content-encoding"),
            *want,
            "accept-encoding {ae:?}"
        );
        assert_eq!(g.header("vary"), Some("Accept-Encoding"));
        assert_eq!(
            g.header("content-length")
                .unwrap()
                .parse::<usize>()
                .unwrap(),
            g.body.len()
        );
        assert_eq!(
            decode(&g.body, *want),
            body.as_bytes(),
            "accept-encoding {ae:?}"
        );
    }
    assert_eq!(origin.hits(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn origin_gzip_is_decoded_once_and_reencoded() {
    let body = big_json();
    let gz = {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(body.as_bytes()).unwrap();
        e.finish().unwrap()
    };
    let origin = Origin::start(move |_, _| {
        Reply::ok(gz.clone())
            .header("cache-control", "max-age=60")
            .header("content-type", "application/json")
            .header("content-encoding", "gzip")
    })
    .await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    let url = format!("http://{}/z", larder.addr);
    let first = get(&c, &url, &[]).await;
    assert_eq!(first.header("content-encoding"), None);
    assert_eq!(first.body, body.as_bytes());
    wait_for_encoding(&c, &url, "zstd").await;
    for enc in ["gzip", "br", "zstd"] {
        let g = get(&c, &url, &[("accept-encoding", enc)]).await;
        assert_eq!(decode(&g.body, Some(enc)), body.as_bytes(), "{enc}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn origin_down_gives_502_and_caches_nothing() {
    // A port nobody listens on.
    let port = free_port();
    let larder = larder(PROXY, &format!("http://{port}")).await;
    let c = client();
    let url = format!("http://{}/x", larder.addr);
    let g = get(&c, &url, &[]).await;
    assert_eq!(g.status, 502);
    assert!(String::from_utf8_lossy(&g.body).contains("connect"));
    assert_eq!(get(&c, &url, &[]).await.status, 502);
    assert_eq!(larder.cache_entries(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_origin_gives_504() {
    let origin = Origin::start(|_, _| Reply::ok("late").delay(Duration::from_secs(4))).await;
    let larder = larder(PROXY, &origin.url()).await;
    let g = get(&client(), &format!("http://{}/slow", larder.addr), &[]).await;
    assert_eq!(g.status, 504);
    assert_eq!(larder.cache_entries(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn eviction_keeps_store_under_its_byte_bound() {
    let origin = Origin::start(|seen, _| {
        Reply::ok(
            vec![b'x'; 8192]
                .repeat(1)
                .into_iter()
                .chain(seen.path.bytes())
                .collect::<Vec<u8>>(),
        )
        .header("cache-control", "max-age=600")
    })
    .await;
    let cfg = format!("[cache]\nmax_size = \"256KiB\"\nmax_object_size = \"64KiB\"\n{PROXY}");
    let larder = larder(&cfg, &origin.url()).await;
    let c = client();
    for i in 0..200 {
        let g = get(&c, &format!("http://{}/obj/{i}", larder.addr), &[]).await;
        assert_eq!(g.status, 200);
        assert!(larder.cache_bytes() <= 256 * 1024);
    }
    assert!(larder.cache_entries() < 200);
    assert!(larder.cache_entries() > 5);
}

#[tokio::test(flavor = "multi_thread")]
async fn head_is_answered_from_the_get_entry() {
    let origin = Origin::start(|_, _| Reply::ok(JSON).header("cache-control", "max-age=60")).await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    let url = format!("http://{}/h", larder.addr);
    // A HEAD miss fills with a GET so later GETs hit.
    let head = send(&c, "HEAD", &url, &[], b"").await;
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    assert_eq!(
        head.header("content-length"),
        Some(JSON.len().to_string().as_str())
    );
    assert_eq!(origin.seen()[0].method, "GET");
    let got = get(&c, &url, &[]).await;
    assert_eq!(got.cache(), "HIT");
    assert_eq!(got.body, JSON);
    let head2 = send(&c, "HEAD", &url, &[], b"").await;
    assert_eq!(head2.cache(), "HIT");
    assert!(head2.body.is_empty());
    assert_eq!(origin.hits(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn conditional_requests_get_304_from_a_fresh_entry() {
    let lm = "Tue, 01 Sep 2026 10:00:00 GMT";
    let origin = Origin::start(move |_, _| {
        Reply::ok(JSON)
            .header("cache-control", "max-age=60")
            .header("etag", "\"abc\"")
            .header("last-modified", lm)
    })
    .await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    let url = format!("http://{}/c", larder.addr);
    get(&c, &url, &[]).await;
    let inm = get(&c, &url, &[("if-none-match", "\"abc\"")]).await;
    assert_eq!(inm.status, 304);
    assert!(inm.body.is_empty());
    assert_eq!(inm.header("etag"), Some("\"abc\""));
    let other = get(&c, &url, &[("if-none-match", "\"zzz\"")]).await;
    assert_eq!(other.status, 200);
    let ims = get(
        &c,
        &url,
        &[("if-modified-since", "Wed, 02 Sep 2026 10:00:00 GMT")],
    )
    .await;
    assert_eq!(ims.status, 304);
    let older = get(
        &c,
        &url,
        &[("if-modified-since", "Mon, 31 Aug 2026 10:00:00 GMT")],
    )
    .await;
    assert_eq!(older.status, 200);
    let im = get(&c, &url, &[("if-match", "\"nope\"")]).await;
    assert_eq!(im.status, 412);
    assert_eq!(origin.hits(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn forwards_methods_bodies_and_proxy_headers() {
    let origin = Origin::start(|seen, _| {
        Reply::ok(format!(
            "{} {}",
            seen.method,
            String::from_utf8_lossy(&seen.body)
        ))
        .header("cache-control", "max-age=60")
        .header("connection", "x-hop")
        .header("x-hop", "should not pass")
    })
    .await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    let url = format!("http://{}/submit", larder.addr);
    // A plain-text client claiming HTTPS is not believed.
    let posted = send(
        &c,
        "POST",
        &url,
        &[
            ("content-type", "text/plain"),
            ("x-forwarded-proto", "https"),
        ],
        b"payload",
    )
    .await;
    assert_eq!(posted.body, "POST payload");
    assert_eq!(posted.cache(), "BYPASS");
    assert!(posted.headers.get("x-hop").is_none());
    assert_eq!(posted.header("via"), Some("1.1 larder"));
    let seen = &origin.seen()[0];
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen.headers["x-forwarded-proto"], "http");
    assert_eq!(seen.headers["via"], "1.1 larder");
    assert!(seen.headers["x-forwarded-host"]
        .to_str()
        .unwrap()
        .starts_with("127.0.0.1:"));
}

#[tokio::test(flavor = "multi_thread")]
async fn request_directives_no_cache_and_only_if_cached() {
    let origin =
        Origin::start(|_, n| Reply::ok(format!("v{n}")).header("cache-control", "max-age=60"))
            .await;
    let cfg = proxy_with(r#"request_cache_control = "honour""#);
    let larder = larder(&cfg, &origin.url()).await;
    let c = client();
    let url = format!("http://{}/d", larder.addr);
    let miss = get(
        &c,
        &format!("{url}?cold"),
        &[("cache-control", "only-if-cached")],
    )
    .await;
    assert_eq!(miss.status, 504);
    get(&c, &url, &[]).await;
    // Reload: goes to the origin and refreshes the stored copy.
    let reload = get(&c, &url, &[("cache-control", "no-cache")]).await;
    assert_eq!(reload.body, "v1");
    let pragma = get(&c, &url, &[("pragma", "no-cache")]).await;
    assert_eq!(pragma.body, "v2");
    assert_eq!(get(&c, &url, &[]).await.body, "v2");
    assert_eq!(
        get(&c, &url, &[("cache-control", "only-if-cached")])
            .await
            .status,
        200
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn h2c_prior_knowledge_on_the_same_port() {
    let origin = Origin::start(|_, _| Reply::ok(JSON).header("cache-control", "max-age=60")).await;
    let larder = larder(PROXY, &origin.url()).await;
    let h2 = h2_client();
    let url = format!("http://{}/h2", larder.addr);
    let a = get(&h2, &url, &[]).await;
    let b = get(&h2, &url, &[]).await;
    assert_eq!(a.body, JSON);
    assert_eq!(b.cache(), "HIT");
    // The HTTP/1.1 client shares the entry.
    assert_eq!(get(&client(), &url, &[]).await.cache(), "HIT");
}

#[tokio::test(flavor = "multi_thread")]
async fn pipelined_requests_are_answered_in_order() {
    let origin =
        Origin::start(|seen, _| Reply::ok(seen.path.clone()).header("cache-control", "max-age=60"))
            .await;
    let larder = larder(PROXY, &origin.url()).await;
    let mut s = Raw::connect(larder.addr).await;
    let reqs = "GET /one HTTP/1.1\r\nHost: t\r\n\r\nGET /two HTTP/1.1\r\nHost: t\r\n\r\nGET /three HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    s.write(reqs).await;
    let out = String::from_utf8(s.read_to_end(Duration::from_secs(5)).await).unwrap();
    let one = out.find("\r\n\r\n/one").expect("first");
    let two = out.find("\r\n\r\n/two").expect("second");
    let three = out.find("\r\n\r\n/three").expect("third");
    assert!(one < two && two < three);
    assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 3);
}

/// An origin answering "x", larder before it with one `[server]` setting, and a raw client
/// connection to larder.
async fn raw_client_with_server_setting(setting: &str) -> (Origin, Larder, Raw) {
    let origin = Origin::start(|_, _| Reply::ok("x")).await;
    let larder = larder(&proxy_with_server(setting), &origin.url()).await;
    let s = Raw::connect(larder.addr).await;
    (origin, larder, s)
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_header_gets_431_and_malformed_gets_400() {
    let (origin, larder, mut s) =
        raw_client_with_server_setting("max_header_size = \"8KiB\"").await;
    let big = "a".repeat(12_000);
    let req = format!("GET / HTTP/1.1\r\nHost: t\r\nX-Big: {big}\r\n\r\n");
    let _ = s.try_write(req).await;
    let five = Duration::from_secs(5);
    // The head is read whole (the read buffer may exceed the limit a little), so the 431
    // reaches the client instead of being lost to a reset.
    let out = s.read_some(five).await.expect("an answer").unwrap();
    let head = String::from_utf8_lossy(&out).to_string();
    assert!(head.starts_with("HTTP/1.1 431"), "got {head:?}");
    let mut s = Raw::connect(larder.addr).await;
    s.write(b"GARBAGE\x01\x02 / HTTP/9\r\n\r\n").await;
    let out = s.read_some(five).await.expect("an answer").unwrap();
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 400"));
    assert_eq!(origin.hits(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn slowloris_is_cut_off_by_the_header_timeout() {
    let (_origin, _larder, mut s) =
        raw_client_with_server_setting("header_read_timeout = \"300ms\"").await;
    s.write(b"GET / HTTP/1.1\r\nHost: t\r\n").await;
    // The server answers 408 or just closes; either way the read ends well before 5 s.
    assert!(
        s.closes_within(Duration::from_secs(5)).await,
        "connection was held open"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_head_dripped_byte_by_byte_is_cut_off_by_the_header_timeout() {
    let (origin, _larder, mut s) =
        raw_client_with_server_setting("header_read_timeout = \"300ms\"").await;
    // A byte every 50 ms keeps the connection busy, but the head never completes in time.
    let head = b"GET / HTTP/1.1\r\nHost: t\r\nX-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut cut = false;
    for b in head.iter() {
        if s.try_write([*b]).await.is_err() {
            cut = true;
            break;
        }
        match s.read_some(Duration::from_millis(50)).await {
            None => continue,
            Some(Ok(got)) => {
                // A 408 or a close: either way the head was refused before it was complete.
                assert!(
                    got.is_empty() || got.starts_with(b"HTTP/1.1 408"),
                    "{got:?}"
                );
                cut = true;
                break;
            }
            Some(Err(_)) => {
                cut = true;
                break;
            }
        }
    }
    assert!(cut, "a head taking {} ms was let through", head.len() * 50);
    assert_eq!(origin.hits(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn graceful_shutdown_finishes_in_flight_requests() {
    let origin =
        Origin::start(|_, _| Reply::ok("finished").delay(Duration::from_millis(500))).await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    let url = format!("http://{}/slow", larder.addr);
    let addr = larder.addr;
    let inflight = tokio::spawn(async move { get(&c, &url, &[]).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let left = larder.shutdown().await;
    assert_eq!(left, 0);
    let g = inflight.await.unwrap();
    assert_eq!(g.body, "finished");
    // No longer accepting.
    assert!(Raw::try_connect(addr).await.is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn vary_selects_variants_and_vary_star_never_matches() {
    let origin = Origin::start(|seen, n| {
        let vary = if seen.path == "/star" {
            "*"
        } else {
            "Accept-Language"
        };
        Reply::ok(format!("v{n}"))
            .header("cache-control", "max-age=60")
            .header("vary", vary)
    })
    .await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    for path in ["/star", "/lang"] {
        let url = format!("http://{}{path}", larder.addr);
        let a = get(&c, &url, &[("accept-language", "en")]).await;
        let b = get(&c, &url, &[("accept-language", "fr")]).await;
        assert_ne!(a.body, b.body, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn uncacheable_responses_are_compressed_on_the_fly() {
    let text = "on the fly ".repeat(2400);
    let t2 = text.clone();
    let origin = Origin::start(move |seen, _| {
        let r = Reply::ok(t2.clone())
            .header("content-type", "text/html")
            .header("etag", "\"x\"");
        match seen.path.as_str() {
            "/no-transform" => r.header("cache-control", "no-store, no-transform"),
            "/image" => Reply::ok(vec![0u8; 5000])
                .header("cache-control", "no-store")
                .header("content-type", "image/png"),
            _ => r.header("cache-control", "no-store"),
        }
    })
    .await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    let url = format!("http://{}/dyn", larder.addr);
    for (ae, want) in [
        ("gzip", Some("gzip")),
        ("br", Some("br")),
        ("zstd", Some("zstd")),
        ("gzip, br, zstd", Some("zstd")),
        ("gzip;q=1, br;q=0.5", Some("gzip")),
    ] {
        let g = get(&c, &url, &[("accept-encoding", ae)]).await;
        assert_eq!(g.header("content-encoding"), want, "{ae}");
        assert_eq!(g.header("vary"), Some("Accept-Encoding"));
        assert_eq!(g.header("etag"), Some("W/\"x\""));
        assert!(g.body.len() < text.len() / 4);
        assert_eq!(decode(&g.body, want), text.as_bytes(), "{ae}");
    }
    let plain = get(&c, &url, &[]).await;
    assert_eq!(plain.header("content-encoding"), None);
    assert_eq!(plain.body, text.as_bytes());
    let nt = get(
        &c,
        &format!("http://{}/no-transform", larder.addr),
        &[("accept-encoding", "gzip")],
    )
    .await;
    assert_eq!(nt.header("content-encoding"), None);
    let img = get(
        &c,
        &format!("http://{}/image", larder.addr),
        &[("accept-encoding", "gzip")],
    )
    .await;
    assert_eq!(img.header("content-encoding"), None);
    assert_eq!(larder.cache_entries(), 0);
}

/// An origin whose keep-alive connections close when the next request arrives, without an
/// answer (what an origin's idle timeout racing larder's reuse of a pooled connection looks
/// like): idempotent bodiless requests are sent again on a new connection; a POST is not.
#[tokio::test(flavor = "multi_thread")]
async fn a_pooled_connection_closed_by_the_origin_is_retried_for_idempotent_requests() {
    let addr = one_answer_per_connection(false).await;
    let larder = larder(PROXY, &format!("http://{addr}")).await;
    let base = format!("http://{}", larder.addr);
    let c = client();
    let first = get(&c, &format!("{base}/a"), &[]).await;
    assert_eq!(
        (first.status.as_u16(), &first.body[..]),
        (200, &b"answer 0"[..])
    );
    // The pooled connection is reused, closed by the origin, and the GET sent again.
    let second = get(&c, &format!("{base}/a"), &[]).await;
    assert_eq!(
        (second.status.as_u16(), &second.body[..]),
        (200, &b"answer 1"[..])
    );
    // A POST is never sent twice: the origin's close is a 502.
    let post = send(&c, "POST", &format!("{base}/a"), &[], b"x").await;
    assert_eq!(post.status, 502);
}

/// RFC 9110 §15.2: a proxy forwards 1xx interim responses. The origin sends `103 Early Hints`
/// before its final answer; the HTTP/1.1 client gets the 103 first, then the 200, on a fill
/// (cacheable) and on a pass (not cacheable). A hit answers from the cache, with no 103.
#[tokio::test(flavor = "multi_thread")]
async fn interim_1xx_responses_are_forwarded_before_the_final_response() {
    use tokio::io::AsyncWriteExt;
    let addr = raw_origin(|mut s| async move {
        loop {
            let Some(got) = read_head(&mut s).await else {
                return;
            };
            let cc = if got.starts_with(b"GET /cached") {
                "max-age=60"
            } else {
                "no-store"
            };
            let _ = s
                .write_all(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n")
                .await;
            tokio::time::sleep(Duration::from_millis(30)).await;
            let _ = s
                .write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\ncache-control: {cc}\r\ncontent-length: 5\r\n\r\nfinal"
                    )
                    .as_bytes(),
                )
                .await;
        }
    })
    .await;
    let larder = larder(PROXY, &format!("http://{addr}")).await;
    let mut c = Raw::connect(larder.addr).await;
    async fn exchange(c: &mut Raw, path: &str) -> String {
        c.write(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n"))
            .await;
        let got = c.read_until(|got| got.ends_with(b"final")).await;
        String::from_utf8(got).unwrap()
    }
    for path in ["/cached", "/passed"] {
        let text = exchange(&mut c, path).await;
        assert!(
            text.starts_with("HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\n"),
            "{path}: {text}"
        );
    }
    // A hit is answered from the cache: no interim response, on the same connection.
    let hit = exchange(&mut c, "/cached").await;
    assert!(hit.starts_with("HTTP/1.1 200 OK\r\n"), "{hit}");
    assert!(hit.to_ascii_lowercase().contains("x-cache: hit"), "{hit}");
}

/// An origin that answers each path with the Host it was asked for (cacheable), and larder in
/// front of it with a route for `internal.example` alone and one for every other host.
async fn host_echo() -> (Origin, Larder) {
    let origin = Origin::start(|seen, _| {
        let host = seen.headers.get("host").map_or("", |v| v.to_str().unwrap());
        Reply::ok(format!("for {host}")).header("cache-control", "max-age=60")
    })
    .await;
    let cfg = r#"
[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  host = "internal.example"
  respond = { body = "internal route" }
  [[listener.route]]
  path = "/"
  proxy = { upstream = "{origin}", response_timeout = "2s", connect_timeout = "1s" }
"#;
    let larder = larder(cfg, &origin.url()).await;
    (origin, larder)
}

/// Item 1: the cache key and the route came from the absolute-form target, the forwarded Host
/// from the client's Host field. RFC 9112 §3.2.2: the target's authority wins and replaces Host,
/// so key, route and the origin's Host agree.
#[tokio::test(flavor = "multi_thread")]
async fn regression_absolute_form_authority_decides_key_route_and_host() {
    let (origin, larder) = host_echo().await;
    let addr = larder.addr;
    let poison = raw_exchange(
        addr,
        b"GET http://victim.example/p HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(poison.starts_with("HTTP/1.1 200"), "{poison}");
    assert!(poison.ends_with("for victim.example"), "{poison}");
    let seen = origin.seen();
    assert_eq!(seen[0].headers["host"], "victim.example");
    assert_eq!(seen[0].headers["x-forwarded-host"], "victim.example");
    // The victim's own request is a hit on the victim's answer.
    let normal = raw_exchange(
        addr,
        b"GET /p HTTP/1.1\r\nHost: victim.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(normal.ends_with("for victim.example"), "{normal}");
    assert!(
        normal.to_ascii_lowercase().contains("x-cache: hit"),
        "{normal}"
    );
    assert!(larder.has_entry("victim.example", "/p"));
    assert!(!larder.has_entry("attacker.example", "/p"));
    // Routed by the target's authority, and forwarded with it: the Host field does not reach
    // the origin behind another host's route.
    let routed = raw_exchange(
        addr,
        b"GET http://public.example/r HTTP/1.1\r\nHost: internal.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(routed.ends_with("for public.example"), "{routed}");
    assert_eq!(origin.seen()[1].headers["host"], "public.example");
    // And the other way round: the internal route answers for its own authority.
    let internal = raw_exchange(
        addr,
        b"GET http://internal.example/r HTTP/1.1\r\nHost: public.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(internal.ends_with("internal route"), "{internal}");
    assert_eq!(origin.hits(), 2);
}

/// One h2 request with a `host` field; (status, x-cache, body).
async fn ask_h2(
    h2: &mut hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    uri: &str,
    host: &str,
) -> (u16, String, String) {
    use http_body_util::BodyExt;
    let req = http::Request::get(uri)
        .header("host", host)
        .body(http_body_util::Empty::new())
        .unwrap();
    let resp = h2.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let cache = resp
        .headers()
        .get("x-cache")
        .map_or(String::new(), |v| v.to_str().unwrap().to_string());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, cache, String::from_utf8_lossy(&body).into_owned())
}

/// Item 1 over h2c: `:authority` (the URI's authority in hyper) and a `host` field that differs.
#[tokio::test(flavor = "multi_thread")]
async fn regression_h2_authority_decides_key_route_and_host() {
    let (origin, larder) = host_echo().await;
    let mut h2 = h2_connection(larder.addr).await;
    let (status, _, body) = ask_h2(&mut h2, "http://victim.example/p", "attacker.example").await;
    assert_eq!((status, body.as_str()), (200, "for victim.example"));
    assert_eq!(origin.seen()[0].headers["host"], "victim.example");
    let (_, cache, body) = ask_h2(&mut h2, "http://victim.example/p", "victim.example").await;
    assert_eq!(body, "for victim.example");
    assert_eq!(cache, "HIT");
    let (_, _, body) = ask_h2(&mut h2, "http://public.example/r", "internal.example").await;
    assert_eq!(body, "for public.example");
    assert_eq!(origin.seen()[1].headers["host"], "public.example");
    let (_, _, body) = ask_h2(&mut h2, "http://internal.example/r", "public.example").await;
    assert_eq!(body, "internal route");
    assert_eq!(origin.hits(), 2);
}

/// Item 1: RFC 9112 §3.2: two Host fields, an HTTP/1.1 request without Host, or a Host that is
/// no authority get 400 and reach nothing; HTTP/1.0 without Host is still served.
#[tokio::test(flavor = "multi_thread")]
async fn regression_host_field_must_be_one_valid_authority() {
    let (origin, larder) = host_echo().await;
    let addr = larder.addr;
    for bad in [
        &b"GET /p HTTP/1.1\r\nHost: victim.example\r\nHost: attacker.example\r\nConnection: close\r\n\r\n"[..],
        b"GET /p HTTP/1.1\r\nConnection: close\r\n\r\n",
        b"GET http://victim.example/p HTTP/1.1\r\nConnection: close\r\n\r\n",
        b"GET /p HTTP/1.1\r\nHost: victim.example/x\r\nConnection: close\r\n\r\n",
        b"GET /p HTTP/1.1\r\nHost: a@victim.example\r\nConnection: close\r\n\r\n",
        b"GET http://user@victim.example/p HTTP/1.1\r\nHost: victim.example\r\nConnection: close\r\n\r\n",
    ] {
        let got = raw_exchange(addr, bad).await;
        assert!(
            got.starts_with("HTTP/1.1 400"),
            "{}: {got}",
            String::from_utf8_lossy(bad)
        );
    }
    assert_eq!(origin.hits(), 0);
    let old = raw_exchange(addr, b"GET /p HTTP/1.0\r\n\r\n").await;
    assert!(old.starts_with("HTTP/1.0 200"), "{old}");
    assert_eq!(origin.hits(), 1);
    // No authority at all: the origin is asked with its own.
    assert_eq!(
        origin.seen()[0].headers["host"],
        origin.addr.to_string().as_str()
    );
}

/// Item 3: an origin streaming 103s to a client that does not read grew the interim queue
/// without bound. A few interim responses per response go on; the rest are dropped and counted.
#[tokio::test(flavor = "multi_thread")]
async fn regression_interim_responses_are_bounded() {
    use tokio::io::AsyncWriteExt;
    const SENT: usize = 2000;
    let done = Arc::new(tokio::sync::Notify::new());
    let signal = Arc::clone(&done);
    let addr = raw_origin(move |mut s| {
        let done = Arc::clone(&signal);
        async move {
            if read_head(&mut s).await.is_none() {
                return;
            }
            let hint = format!(
                "HTTP/1.1 103 Early Hints\r\nLink: </{}.css>; rel=preload\r\n\r\n",
                "a".repeat(1000)
            );
            for _ in 0..SENT {
                if s.write_all(hint.as_bytes()).await.is_err() {
                    return;
                }
            }
            let _ = s
                .write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncache-control: no-store\r\n\r\nfinal",
                )
                .await;
            done.notify_one();
            let _ = read_head(&mut s).await;
        }
    })
    .await;
    let (larder, mut c) = asking_for_hints(addr).await;
    // The client reads nothing until the origin has sent everything.
    tokio::time::timeout(Duration::from_secs(10), done.notified())
        .await
        .expect("the origin wrote all its interim responses");
    let got = tokio::time::timeout(Duration::from_secs(10), read_to_final(&mut c))
        .await
        .expect("the final response arrives");
    let text = String::from_utf8_lossy(&got);
    let forwarded = text.matches("HTTP/1.1 103 Early Hints\r\n").count();
    assert!(
        (1..=16).contains(&forwarded),
        "{forwarded} interim responses forwarded"
    );
    // The framing survived: the interim blocks, then the final response.
    let last = text.rfind("HTTP/1.1 200 OK\r\n").expect("final head");
    assert!(text[..last].ends_with("\r\n\r\n"));
    assert_eq!(larder.interim_dropped(), (SENT - forwarded) as u64);
}

/// The sink queues a 103 and wakes the client's connection, which writes it through the same
/// writer as hyper's bytes: it reaches the client while the origin still holds the final answer
/// (here, until the client has the 103).
#[tokio::test(flavor = "multi_thread")]
async fn early_hints_reach_the_client_before_the_origin_answers() {
    use tokio::io::AsyncWriteExt;
    let hints_arrived = Arc::new(tokio::sync::Notify::new());
    let heard = Arc::clone(&hints_arrived);
    let addr = raw_origin(move |mut s| {
        let heard = Arc::clone(&heard);
        async move {
            if read_head(&mut s).await.is_none() {
                return;
            }
            let _ = s
                .write_all(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n")
                .await;
            let _ = tokio::time::timeout(Duration::from_secs(5), heard.notified()).await;
            let _ = s
                .write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncache-control: no-store\r\n\r\nfinal",
                )
                .await;
        }
    })
    .await;
    let (_larder, mut c) = asking_for_hints(addr).await;
    let hints = tokio::time::timeout(Duration::from_millis(1500), c.response())
        .await
        .expect("the 103 arrives while the origin waits");
    assert_eq!(
        hints.head,
        "HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n"
    );
    hints_arrived.notify_one();
    assert!(read_to_final(&mut c)
        .await
        .starts_with(b"HTTP/1.1 200 OK\r\n"));
}

/// An origin that answers a POST at its head, reading none of its body (a 413): the answer
/// reaches the client while it is still uploading. The upstream connection is driven by the
/// request's task until the head comes, whatever the upload is doing; nothing waits for the
/// rest of the body.
#[tokio::test]
async fn an_answer_before_the_request_body_is_read_reaches_the_client() {
    use tokio::io::AsyncWriteExt;
    let addr = raw_origin(|mut s| async move {
        if read_head(&mut s).await.is_none() {
            return;
        }
        let _ = s
            .write_all(
                b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 7\r\nconnection: close\r\n\r\ntoo big",
            )
            .await;
        // Keeps the connection open, reading nothing more.
        tokio::time::sleep(Duration::from_secs(5)).await;
    })
    .await;
    let larder = larder(PROXY, &format!("http://{addr}")).await;
    let mut c = Raw::connect(larder.addr).await;
    c.write(b"POST /upload HTTP/1.1\r\nHost: t\r\ncontent-length: 1000000\r\n\r\n")
        .await;
    c.write(vec![b'a'; 65536]).await;
    let got = tokio::time::timeout(
        Duration::from_secs(3),
        c.read_until(|got| got.ends_with(b"too big")),
    )
    .await
    .expect("the origin's early answer reaches the client");
    assert!(
        got.starts_with(b"HTTP/1.1 413"),
        "{}",
        String::from_utf8_lossy(&got)
    );
}

/// larder in front of the origin at `addr`, and a raw client connection that has asked it for
/// `/hints`.
async fn asking_for_hints(addr: std::net::SocketAddr) -> (Larder, Raw) {
    let larder = larder(PROXY, &format!("http://{addr}")).await;
    let mut c = Raw::connect(larder.addr).await;
    c.write(b"GET /hints HTTP/1.1\r\nHost: t\r\n\r\n").await;
    (larder, c)
}

/// What `c` receives up to the body `final`.
async fn read_to_final(c: &mut Raw) -> Vec<u8> {
    c.read_until(|got| got.ends_with(b"final")).await
}

/// Item 7: an origin that resets its keep-alive connection as larder reuses it (it closes with
/// the next request unread: the kernel answers with a reset, "connection reset by peer").
/// Back-to-back GETs alternated 200 and 502; the reset is retried like a close.
#[tokio::test(flavor = "multi_thread")]
async fn regression_reset_pooled_connection_is_retried() {
    let addr = one_answer_per_connection(true).await;
    let larder = larder(PROXY, &format!("http://{addr}")).await;
    let c = client();
    let url = format!("http://{}/r", larder.addr);
    for i in 0..6 {
        let g = get(&c, &url, &[]).await;
        assert_eq!(
            (
                g.status.as_u16(),
                String::from_utf8_lossy(&g.body).into_owned()
            ),
            (200, format!("answer {i}")),
            "request {i}"
        );
    }
}

/// Item 6: `response_timeout` ran from the start of the exchange, so a large upload to an origin
/// that reads slowly got a 504 mid-upload. It counts from the end of the upload now (and while
/// uploading, time without progress); a silent origin after the upload still gets a 504.
#[tokio::test(flavor = "multi_thread")]
async fn regression_response_timeout_counts_from_the_end_of_the_upload() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const TOTAL: usize = 12 << 20;
    const SLOW: usize = 8 << 20;
    // A small receive buffer, so that the origin's slow reads hold the upload back.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(64 * 1024).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = raw_origin_on(socket.listen(64).unwrap(), |mut s| async move {
        let Some(head) = read_head(&mut s).await else {
            return;
        };
        let end = head.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
        let len: usize = text
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let mut read = head.len() - end;
        let mut buf = vec![0u8; 256 * 1024];
        // About 3 s for the first 8 MiB (64 KiB every 25 ms), then the rest at once: the upload
        // takes three times response_timeout, while no gap in it comes near (a loaded machine
        // stretches the gaps, hence the margin).
        while read < len {
            let want = if read < SLOW { 64 * 1024 } else { buf.len() };
            let n = s.read(&mut buf[..want.min(len - read)]).await.unwrap();
            assert!(n > 0);
            read += n;
            if read < SLOW {
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
        if text.starts_with("post /silent") {
            // Everything read, nothing answered.
            tokio::time::sleep(Duration::from_secs(5)).await;
            return;
        }
        let body = format!("got {read}");
        let _ = s
            .write_all(
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )
            .await;
    });
    let cfg = PROXY.replace("response_timeout = \"2s\"", "response_timeout = \"1s\"");
    let larder = larder(&cfg, &format!("http://{addr}")).await;
    let c = client();
    let upload = send(&c, "POST", &larder.url("/upload"), &[], vec![b'x'; TOTAL]).await;
    assert_eq!(
        (upload.status.as_u16(), upload.text()),
        (200, format!("got {TOTAL}"))
    );
    let silent = request(&c, "POST", &larder.url("/silent"), &[], vec![b'x'; 1000]).await;
    assert_eq!(silent.status(), 504);
}

/// Item 14b: hyper's error text ("error from user's Body stream", "client error (Connect)")
/// reached clients in 502 bodies. Clients get a short fixed text; the detail goes to the log.
#[tokio::test(flavor = "multi_thread")]
async fn regression_upstream_errors_answer_a_short_text() {
    let origin = Origin::start(|_, _| Reply::ok("x")).await;
    let up = larder(PROXY, &origin.url()).await;
    // The client's chunked body breaks off (an invalid chunk size) while it is being forwarded.
    let broken = raw_exchange(
        up.addr,
        b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\nZZ\r\n\r\n",
    )
    .await;
    assert!(broken.starts_with("HTTP/1.1 400"), "{broken}");
    assert!(
        broken.ends_with("\r\n\r\nrequest body broken off\n"),
        "{broken}"
    );
    let port = free_port();
    let down = larder(PROXY, &format!("http://{port}")).await;
    let g = get(&client(), &format!("http://{}/x", down.addr), &[]).await;
    assert_eq!(g.status, 502);
    assert_eq!(g.body, "cannot connect to the upstream\n");
}

/// Item 14c: more than 100 request fields always got 431 (hyper's default). `max_headers` sets
/// the count, for HTTP/1.1 (hyper's parser) and h2c alike.
#[tokio::test(flavor = "multi_thread")]
async fn regression_max_headers_is_a_setting() {
    use http_body_util::BodyExt;
    /// The head of larder's answer to a request with `n` more fields, on a kept-alive socket.
    async fn answer(s: &mut Raw, n: usize) -> String {
        let fields: String = (0..n).map(|i| format!("x-f{i}: v\r\n")).collect();
        s.write(format!("GET / HTTP/1.1\r\nHost: t\r\n{fields}\r\n"))
            .await;
        s.response().await.head
    }
    let (_origin, larder, mut s) = raw_client_with_server_setting("max_headers = 200").await;
    for (n, want) in [(150, "HTTP/1.1 200"), (250, "HTTP/1.1 431")] {
        let head = answer(&mut s, n).await;
        assert!(head.starts_with(want), "{n} fields: {head}");
    }
    let mut h2 = h2_connection(larder.addr).await;
    for (n, want) in [(150, 200), (250, 431)] {
        let mut req = http::Request::get(format!("http://{}/", larder.addr));
        for i in 0..n {
            req = req.header(format!("x-f{i}"), "v");
        }
        let req = req.body(http_body_util::Empty::new()).unwrap();
        let resp = h2.send_request(req).await.unwrap();
        assert_eq!(resp.status(), want, "{n} fields over h2c");
        let _ = resp.into_body().collect().await;
    }
    // The default stays hyper's 100.
    let (_origin, _larder, mut s) = raw_client_with_server_setting("").await;
    let head = answer(&mut s, 150).await;
    assert!(head.starts_with("HTTP/1.1 431"), "{head}");
}

/// A body the origin codes whatever the client accepts, on a response that is not stored, was
/// passed on coded to clients that do not accept that coding (`identity`, none, another one).
/// Now it is decoded for them (Content-Length dropped, ETag weakened, Vary: Accept-Encoding);
/// a client that accepts the coding gets it as sent, and so does everyone under no-transform.
#[tokio::test(flavor = "multi_thread")]
async fn regression_identity_client_gets_a_pass_through_decoded() {
    let text = "decoded for you ".repeat(3000);
    let t2 = text.clone();
    let cfg = larder::config::CompressionConfig::default();
    let origin = Origin::start(move |seen, _| {
        let coding = seen.path.trim_start_matches('/').split('/').next().unwrap();
        let enc = larder::compress::Encoding::from_content_encoding(coding).unwrap();
        let coded = larder::compress::encode(t2.as_bytes(), enc, &cfg);
        let r = Reply::ok(coded)
            .header("content-type", "text/plain")
            .header("content-encoding", coding)
            .header("etag", "\"x\"");
        if seen.path.ends_with("/no-transform") {
            r.header("cache-control", "no-store, no-transform")
        } else {
            r.header("cache-control", "no-store")
        }
    })
    .await;
    let larder = larder(PROXY, &origin.url()).await;
    let c = client();
    let base = format!("http://{}", larder.addr);
    for coding in ["gzip", "br", "zstd"] {
        let url = format!("{base}/{coding}/doc");
        let other = if coding == "gzip" { "br" } else { "gzip" };
        for ae in [Some("identity"), None, Some(other), Some("*;q=0, identity")] {
            let headers: Vec<(&str, &str)> = ae.iter().map(|v| ("accept-encoding", *v)).collect();
            for method in ["GET", "POST"] {
                let g = send(&c, method, &url, &headers, b"").await;
                assert_eq!(g.status, 200, "{coding} {ae:?} {method}");
                assert_eq!(
                    g.header("content-encoding"),
                    None,
                    "{coding} {ae:?} {method}"
                );
                assert_eq!(g.body, text.as_bytes(), "{coding} {ae:?} {method}");
                assert_eq!(g.header("content-length"), None, "{coding} {ae:?} {method}");
                assert_eq!(
                    g.header("etag"),
                    Some("W/\"x\""),
                    "{coding} {ae:?} {method}"
                );
                assert!(
                    g.header("vary")
                        .is_some_and(|v| v.to_ascii_lowercase().contains("accept-encoding")),
                    "{coding} {ae:?} {method}"
                );
            }
        }
        // HEAD says what GET would send.
        let h = send(&c, "HEAD", &url, &[("accept-encoding", "identity")], b"").await;
        assert_eq!(h.header("content-encoding"), None);
        assert_eq!(h.header("etag"), Some("W/\"x\""));
        // A client that accepts the coding gets the origin's bytes as they are.
        let g = get(&c, &url, &[("accept-encoding", coding)]).await;
        assert_eq!(g.header("content-encoding"), Some(coding));
        assert_eq!(g.header("etag"), Some("\"x\""));
        assert_eq!(decode(&g.body, Some(coding)), text.as_bytes());
        // no-transform: larder may not decode; the coding the origin chose is passed on.
        let nt = get(
            &c,
            &format!("{base}/{coding}/no-transform"),
            &[("accept-encoding", "identity")],
        )
        .await;
        assert_eq!(nt.header("content-encoding"), Some(coding));
        assert_eq!(decode(&nt.body, Some(coding)), text.as_bytes());
    }
    assert_eq!(larder.cache_entries(), 0);
}

/// A large JSON body, ~140 KB.
fn json_140k() -> String {
    let mut s = String::from("[");
    for i in 0..2000 {
        s.push_str(&format!(
            "{{\"id\":{i},\"name\":\"repository-{i}\",\"owner\":\"user-{}\",\"stars\":{}}},",
            i % 97,
            i * 7
        ));
    }
    s.push_str("{}]");
    s
}

/// The compressed variants were built after a fill and published all together, so for a third
/// of a second (longer with a large body) every client accepting gzip got identity, including
/// the client that caused the fill and those coalesced behind it. Now each coding is published
/// as soon as it is ready (the fast ones first) and a delivery that would give identity to a
/// client accepting a coding still being built waits for it.
#[tokio::test(flavor = "multi_thread")]
async fn regression_gzip_client_never_gets_identity_after_a_fill() {
    let body = json_140k();
    let b2 = body.clone();
    let origin = Origin::start(move |seen, _| {
        let r = Reply::ok(b2.clone())
            .header("cache-control", "max-age=60")
            .header("content-type", "application/json");
        if seen.path == "/coalesced" {
            r.delay(Duration::from_millis(200))
        } else {
            r
        }
    })
    .await;
    // brotli 9 on this body takes a while (a debug build makes it longer).
    let cfg = PROXY.replace("brotli_level = 5", "brotli_level = 9");
    let larder = larder(&cfg, &origin.url()).await;
    let c = client();
    let url = format!("http://{}/data.json", larder.addr);
    let gzip = [("accept-encoding", "gzip")];
    // The client that causes the fill, then clients right after it.
    let first = get(&c, &url, &gzip).await;
    assert_eq!(first.cache(), "MISS");
    assert_eq!(first.header("content-encoding"), Some("gzip"));
    assert_eq!(decode(&first.body, Some("gzip")), body.as_bytes());
    for i in 0..6 {
        let g = get(&c, &url, &gzip).await;
        assert_eq!(g.cache(), "HIT");
        assert_eq!(g.header("content-encoding"), Some("gzip"), "request {i}");
        assert_eq!(decode(&g.body, Some("gzip")), body.as_bytes());
    }
    // A client that accepts no coding is never held back.
    let plain = get(&c, &url, &[]).await;
    assert_eq!(plain.header("content-encoding"), None);
    assert_eq!(plain.body, body.as_bytes());
    // The last coding comes too; then no compression is running.
    wait_for_encoding(&c, &url, "br").await;
    // Clients coalesced behind a fill.
    let url = Arc::new(format!("http://{}/coalesced", larder.addr));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (c, url) = (c.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            get(&c, &url, &[("accept-encoding", "gzip, deflate")]).await
        }));
    }
    for t in tasks {
        let g = t.await.unwrap();
        assert_eq!(g.header("content-encoding"), Some("gzip"));
        assert_eq!(decode(&g.body, Some("gzip")), body.as_bytes());
    }
    assert_eq!(origin.hits(), 2);
}

/// An HTTP/1.0 origin (as Python's http.server is): each answer in HTTP/1.0, with no
/// Content-Length (its body ends at the close), the connection closed after it. larder answers
/// its HTTP/1.1 client in HTTP/1.1, whether the response is stored or not, and the client's
/// connection stays open for the next request.
#[tokio::test(flavor = "multi_thread")]
async fn an_http_1_0_origin_is_answered_for_in_http_1_1_on_a_kept_connection() {
    use tokio::io::AsyncWriteExt;
    let addr = raw_origin(|mut s| async move {
        let Some(got) = read_head(&mut s).await else {
            return;
        };
        let (status, cc) = if got.starts_with(b"GET /missing") {
            ("404 Not Found", "")
        } else if got.starts_with(b"GET /cached") {
            ("200 OK", "cache-control: max-age=60\r\n")
        } else {
            ("200 OK", "cache-control: no-store\r\n")
        };
        let reply = format!("HTTP/1.0 {status}\r\nserver: SimpleHTTP/0.6\r\n{cc}\r\nbody of it");
        let _ = s.write_all(reply.as_bytes()).await;
        // The body ends at the close.
    })
    .await;
    let larder = larder(PROXY, &format!("http://{addr}")).await;
    let mut c = Raw::connect(larder.addr).await;
    for (path, status) in [
        ("/missing", 404),
        ("/cached", 200),
        ("/passed", 200),
        ("/missing", 404),
        ("/cached", 200),
    ] {
        c.write(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n"))
            .await;
        let r = c.response().await;
        assert!(
            r.head.starts_with(&format!("HTTP/1.1 {status} ")),
            "{path}: {}",
            r.head
        );
        assert_eq!(r.text(), "body of it", "{path}");
        assert_ne!(r.header("connection"), Some("close"), "{path}: {}", r.head);
    }
    assert!(larder.has_entry("t", "/cached"));
}
