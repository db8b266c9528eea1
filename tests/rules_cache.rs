//! Cache rules (docs/rules.md, "Cache"), through a real larder in front of a real origin: the
//! cache key's parts (query dropped, kept or sorted; a header and a cookie added) and PURGE of
//! a shaped key, lifetimes by status (negative caching of a 404) and clamps on the larder's
//! clock, bypass under a condition, forced caching (Set-Cookie never shared, `private`
//! refused), and the `Cache-Status` and access log naming the rule that decided.

mod common;

use std::time::Duration;

use common::*;

/// A larder on an adjustable clock in front of `origin` (dated by the same clock), one proxy
/// route with `rules`; PURGE allowed from 127.0.0.1; `extra` tables before the listener.
async fn with_rules(
    handler: impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static,
    extra: &str,
    rules: &str,
) -> (Origin, Larder, Client) {
    let clock = larder::clock::Clock::adjustable();
    let origin = Origin::start_at(&clock, handler).await;
    let toml = format!(
        r#"
[admin]
purge_allow = ["127.0.0.0/8"]
{extra}
[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = "{}" }}
{rules}
"#,
        origin.url()
    );
    let larder = Larder::start_at(&toml, clock).await;
    (origin, larder, client())
}

/// The origin's answer: the path and query it was asked, and its count.
fn counted(seen: &Seen, n: usize) -> Reply {
    Reply::ok(format!("{} #{n}", seen.path)).header("cache-control", "max-age=600")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_key_drops_sorts_and_adds_parts_and_purge_finds_it() {
    let (origin, larder, c) = with_rules(
        counted,
        "",
        r#"
    [[listener.route.rule]]
    name = "catalogue"
    when = { path = "/list/**" }
    cache_key = { query = "sort", drop = ["utm_*"], headers = ["x-tenant"], cookies = ["lang"] }
    [[listener.route.rule]]
    name = "paging"
    when = { path = "/page/**" }
    cache_key = { keep = ["page"] }
"#,
    )
    .await;

    // Tracking parameters dropped, order ignored: one entry. The origin got the query as sent.
    let r = get(&c, &larder.url("/list/a?b=1&a=2&utm_source=mail"), &[]).await;
    assert_eq!((r.status.as_u16(), r.cache()), (200, "MISS"));
    assert_eq!(r.text(), "/list/a?b=1&a=2&utm_source=mail #0");
    assert_eq!(
        r.header("cache-status"),
        Some("larder; fwd=miss; stored; detail=\"rule=catalogue\"")
    );
    let r = get(&c, &larder.url("/list/a?a=2&b=1&utm_medium=x"), &[]).await;
    assert_eq!(
        (r.cache(), r.text().as_str()),
        ("HIT", "/list/a?b=1&a=2&utm_source=mail #0")
    );
    assert_eq!(
        r.header("cache-status"),
        Some("larder; hit; detail=\"rule=catalogue\"")
    );
    // A kept parameter's value still counts.
    assert_eq!(
        get(&c, &larder.url("/list/a?a=3&b=1"), &[]).await.cache(),
        "MISS"
    );

    // A header and a cookie added: each tenant and language has its own entry.
    let acme = [("x-tenant", "acme"), ("cookie", "lang=fr; other=1")];
    let beta = [("x-tenant", "beta"), ("cookie", "lang=fr")];
    assert_eq!(get(&c, &larder.url("/list/t"), &acme).await.cache(), "MISS");
    assert_eq!(get(&c, &larder.url("/list/t"), &beta).await.cache(), "MISS");
    assert_eq!(get(&c, &larder.url("/list/t"), &acme).await.cache(), "HIT");
    let en = [("x-tenant", "acme"), ("cookie", "lang=en")];
    assert_eq!(get(&c, &larder.url("/list/t"), &en).await.cache(), "MISS");

    // Only `page` is kept: anything else shares the page's entry.
    assert_eq!(
        get(&c, &larder.url("/page/x?page=2&sort=up"), &[])
            .await
            .cache(),
        "MISS"
    );
    assert_eq!(
        get(&c, &larder.url("/page/x?sort=down&page=2"), &[])
            .await
            .cache(),
        "HIT"
    );
    assert_eq!(
        get(&c, &larder.url("/page/x?page=3"), &[]).await.cache(),
        "MISS"
    );

    // PURGE goes through the same rules: a URL whose key drops a parameter purges the entry
    // every URL of that key shares.
    let hits = origin.hits();
    let purged = send(
        &c,
        "PURGE",
        &larder.url("/list/a?utm_campaign=z&b=1&a=2"),
        &[],
        b"",
    )
    .await;
    assert_eq!(purged.status, 200, "{}", purged.text());
    let r = get(&c, &larder.url("/list/a?a=2&b=1"), &[]).await;
    assert_eq!(r.cache(), "MISS");
    assert_eq!(origin.hits(), hits + 1);
    // With a header in the key, PURGE purges the entry of the header it carries.
    let purged = send(&c, "PURGE", &larder.url("/list/t"), &acme, b"").await;
    assert_eq!(purged.status, 200);
    assert_eq!(get(&c, &larder.url("/list/t"), &acme).await.cache(), "MISS");
    assert_eq!(get(&c, &larder.url("/list/t"), &beta).await.cache(), "HIT");

    // Off the rule's paths: the plain key, no Cache-Status.
    let r = get(&c, &larder.url("/other?b=1&utm_x=1"), &[]).await;
    assert_eq!(r.cache(), "MISS");
    assert_eq!(r.header("cache-status"), None);
    assert_eq!(
        get(&c, &larder.url("/other?b=1"), &[]).await.cache(),
        "MISS"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn lifetimes_by_status_negative_caching_and_clamps() {
    let (origin, larder, c) = with_rules(
        |seen, n| match seen.path.as_str() {
            // Nothing about freshness: neither heuristically fresh (no Last-Modified).
            "/missing" => Reply::ok(format!("gone #{n}")).status(404),
            "/plain" => Reply::ok(format!("plain #{n}")),
            "/error" => Reply::ok(format!("oops #{n}")).status(500),
            // The origin's own lifetimes, one too long and one too short for the clamps.
            "/long" => Reply::ok(format!("long #{n}")).header("cache-control", "max-age=86400"),
            _ => Reply::ok(format!("short #{n}")).header("cache-control", "max-age=5"),
        },
        "",
        r#"
    [[listener.route.rule]]
    name = "ttl"
    cache_ttl = { status = { "200" = "10m", "404" = "30s", "5xx" = "5s" }, min = "1m", max = "1h" }
"#,
    )
    .await;
    let origin_hits = |p: &str| per_path(&origin.seen()).get(p).copied().unwrap_or(0);
    for p in ["/missing", "/plain", "/error", "/long", "/short"] {
        let r = get(&c, &larder.url(p), &[]).await;
        assert_eq!(r.cache(), "MISS", "{p}");
        assert_eq!(get(&c, &larder.url(p), &[]).await.cache(), "HIT", "{p}");
    }
    let r = get(&c, &larder.url("/missing"), &[]).await;
    assert_eq!((r.status.as_u16(), r.text().as_str()), (404, "gone #0"));
    assert_eq!(
        r.header("cache-status"),
        Some("larder; hit; detail=\"rule=ttl\"")
    );

    // The 5xx's 5 s (by status: not raised to the minimum).
    larder.advance(Duration::from_secs(6));
    assert_ne!(get(&c, &larder.url("/error"), &[]).await.cache(), "HIT");
    assert_eq!(origin_hits("/error"), 2);
    for p in ["/missing", "/plain", "/long", "/short"] {
        assert_eq!(
            get(&c, &larder.url(p), &[]).await.cache(),
            "HIT",
            "{p} at 6 s"
        );
    }
    // The 404's 30 s: asked again.
    larder.advance(Duration::from_secs(25));
    assert_ne!(get(&c, &larder.url("/missing"), &[]).await.cache(), "HIT");
    assert_eq!(origin_hits("/missing"), 2);
    for p in ["/plain", "/long", "/short"] {
        assert_eq!(
            get(&c, &larder.url(p), &[]).await.cache(),
            "HIT",
            "{p} at 31 s"
        );
    }
    // The origin's max-age=5 raised to the 1 min minimum.
    larder.advance(Duration::from_secs(30));
    assert_ne!(get(&c, &larder.url("/short"), &[]).await.cache(), "HIT");
    assert_eq!(origin_hits("/short"), 2);
    for p in ["/plain", "/long"] {
        assert_eq!(
            get(&c, &larder.url(p), &[]).await.cache(),
            "HIT",
            "{p} at 61 s"
        );
    }
    // The 200's 10 min by status; the origin's day cut to the 1 h maximum.
    larder.advance(Duration::from_secs(10 * 60));
    assert_ne!(get(&c, &larder.url("/plain"), &[]).await.cache(), "HIT");
    assert_eq!(get(&c, &larder.url("/long"), &[]).await.cache(), "HIT");
    larder.advance(Duration::from_secs(50 * 60));
    assert_ne!(get(&c, &larder.url("/long"), &[]).await.cache(), "HIT");
    assert_eq!((origin_hits("/plain"), origin_hits("/long")), (2, 2));
}

#[tokio::test(flavor = "multi_thread")]
async fn bypass_under_a_condition_and_forced_caching() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let (origin, larder, c) = with_rules(
        |seen, n| match seen.path.as_str() {
            "/forced/nostore" => Reply::ok(format!("forced #{n}"))
                .header("cache-control", "no-store, no-cache")
                .header("set-cookie", format!("sid={n}").as_str()),
            "/forced/private" => {
                Reply::ok(format!("mine #{n}")).header("cache-control", "private, max-age=60")
            }
            _ => counted(seen, n),
        },
        &format!(
            "[access_log]\npath = {:?}\nformat = \"json\"\n",
            log.display().to_string()
        ),
        r#"
    [[listener.route.rule]]
    name = "sessions"
    when = { cookie = { session = "*" } }
    cache_bypass = true
    [[listener.route.rule]]
    name = "force"
    when = { path = "/forced/**" }
    cache_force = { ttl = "5m" }
"#,
    )
    .await;

    // Cached without the cookie; with it, every request goes to the origin and nothing is
    // stored from it.
    assert_eq!(get(&c, &larder.url("/a"), &[]).await.cache(), "MISS");
    assert_eq!(get(&c, &larder.url("/a"), &[]).await.cache(), "HIT");
    let session = [("cookie", "session=abc")];
    for _ in 0..2 {
        let r = get(&c, &larder.url("/a"), &session).await;
        assert_eq!(r.cache(), "BYPASS");
        assert_eq!(
            r.header("cache-status"),
            Some("larder; fwd=bypass; detail=\"rule=sessions\"")
        );
    }
    assert_eq!(get(&c, &larder.url("/b"), &session).await.cache(), "BYPASS");
    assert_eq!(get(&c, &larder.url("/b"), &[]).await.cache(), "MISS");
    assert_eq!(origin.hits(), 5);

    // Forced: a no-store response stored for 5 min; the client that caused the fill gets its
    // Set-Cookie, nobody else does.
    let r = get(&c, &larder.url("/forced/nostore"), &[]).await;
    assert_eq!((r.cache(), r.header("set-cookie")), ("MISS", Some("sid=5")));
    let r = get(&c, &larder.url("/forced/nostore"), &[]).await;
    assert_eq!((r.cache(), r.text().as_str()), ("HIT", "forced #5"));
    assert_eq!(
        r.header("set-cookie"),
        None,
        "a forced entry never shares Set-Cookie"
    );
    assert_eq!(
        r.header("cache-status"),
        Some("larder; hit; detail=\"rule=force\"")
    );
    larder.advance(Duration::from_secs(301));
    assert_ne!(
        get(&c, &larder.url("/forced/nostore"), &[]).await.cache(),
        "HIT"
    );
    // `private` is never stored, forced or not.
    for n in [7, 8] {
        let r = get(&c, &larder.url("/forced/private"), &[]).await;
        assert_eq!((r.cache(), r.text()), ("MISS", format!("mine #{n}")));
    }
    // Both rules at once: the bypass wins (nothing looked up), both are named.
    let r = get(&c, &larder.url("/forced/nostore"), &session).await;
    assert_eq!(r.cache(), "BYPASS");
    assert_eq!(
        r.header("cache-status"),
        Some("larder; fwd=bypass; detail=\"rule=sessions,force\"")
    );

    // The access log names the rules that decided (`cache_rule`), null elsewhere.
    // 12 requests; the writer thread appends their lines soon after.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let lines: Vec<serde_json::Value> = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().count() >= 12 || std::time::Instant::now() > deadline {
            break text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let rule_of = |uri: &str, i: usize| {
        let of_uri: Vec<_> = lines.iter().filter(|l| l["uri"] == uri).collect();
        of_uri[i]["cache_rule"].clone()
    };
    assert_eq!(rule_of("/a", 0), serde_json::Value::Null);
    assert_eq!(rule_of("/a", 2), "sessions");
    assert_eq!(rule_of("/forced/nostore", 0), "force");
    assert_eq!(rule_of("/forced/nostore", 3), "sessions,force");
}

#[test]
fn a_bad_cache_or_traffic_rule_is_named_with_its_line() {
    let base =
        "[pool.blue]\nbackends = [\"http://127.0.0.1:1\"]\n[[listener]]\naddr = \"127.0.0.1:1\"\n\
                [[listener.route]]\npath = \"/\"\nproxy = { upstream = \"http://127.0.0.1:1\" }\n";
    for (rule, says) in [
        (
            "[[listener.route.rule]]\ncache_ttl = { status = { \"6xx\" = \"1s\" } }\n",
            "line 9",
        ),
        (
            "[[listener.route.rule]]\ncache_ttl = { status = { \"6xx\" = \"1s\" } }\n",
            "a class (\"5xx\")",
        ),
        (
            "[[listener.route.rule]]\ncache_ttl = { min = \"1h\", max = \"1m\" }\n",
            "longer than `max`",
        ),
        ("[[listener.route.rule]]\ncache_key = {}\n", "names no part"),
        (
            "[[listener.route.rule]]\ncache_key = { query = \"some\" }\n",
            "line 9",
        ),
        (
            "[[listener.route.rule]]\ncache_bypass = false\n",
            "does nothing",
        ),
        (
            "[[listener.route.rule]]\ncache_force = { ttl = \"0s\" }\n",
            "line 9",
        ),
        (
            "[[listener.route.rule]]\nsplit = { pools = { blue = 1, red = 1 } }\n",
            "no [pool.red]",
        ),
        (
            "[[listener.route.rule]]\nsplit = { pools = { blue = 1, red = 1 } }\n",
            "line 9",
        ),
        (
            "[[listener.route.rule]]\nsplit = { pools = { blue = 0 } }\n",
            "weight above 0",
        ),
        (
            "[[listener.route.rule]]\nsplit = { pools = { blue = 1 }, sticky = \"ip\" }\n",
            "\"cookie:NAME\"",
        ),
        (
            "[[listener.route.rule]]\nmirror = { pool = \"shadow\" }\n",
            "`mirror` names the pool `shadow`",
        ),
        (
            "[[listener.route.rule]]\nmirror = { pool = \"blue\", body = true, max_body = \"1GiB\" }\n",
            "line 9",
        ),
        (
            "[[listener.route.rule]]\nmirror = { pool = \"blue\", max_in_flight = 0 }\n",
            "from 1 to 10000",
        ),
    ] {
        let e = larder::config::Config::parse(&format!("{base}{rule}"), "t")
            .expect_err(rule)
            .to_string();
        assert!(e.contains(says), "{rule}: {e}");
    }
    // In a policy: the policy's rule is named.
    let policy = format!("[[policy.shadowed]]\nmirror = {{ pool = \"shadow\" }}\n{base}");
    let e = larder::config::Config::parse(&policy, "t")
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 2"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reload_applies_a_changed_cache_rule() {
    let origin = Origin::start(counted).await;
    let toml = |rules: &str| {
        format!(
            "[[listener]]\naddr = \"127.0.0.1:0\"\n  [[listener.route]]\n  path = \"/\"\n  \
             proxy = {{ upstream = \"{}\" }}\n{rules}",
            origin.url()
        )
    };
    let larder = Larder::start(&toml("")).await;
    let c = client();
    assert_eq!(get(&c, &larder.url("/x"), &[]).await.cache(), "MISS");
    assert_eq!(
        get(&c, &larder.url("/x?utm_source=a"), &[]).await.cache(),
        "MISS"
    );

    let rule = "    [[listener.route.rule]]\n    name = \"tracking\"\n    \
                cache_key = { drop = [\"utm_*\"] }\n";
    let restart = larder.reload(&toml(rule)).unwrap();
    assert!(restart.is_empty(), "{restart:?}");
    // The entry stored before the reload is the one the new key names.
    let r = get(&c, &larder.url("/x?utm_source=b"), &[]).await;
    assert_eq!((r.cache(), r.text().as_str()), ("HIT", "/x #0"));
    assert_eq!(
        r.header("cache-status"),
        Some("larder; hit; detail=\"rule=tracking\"")
    );

    larder.reload(&toml("")).unwrap();
    let r = get(&c, &larder.url("/x?utm_source=c"), &[]).await;
    assert_eq!((r.cache(), r.header("cache-status")), ("MISS", None));
}
