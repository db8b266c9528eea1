//! Traffic rules (docs/rules.md, "Traffic"), through a real larder in front of real origins:
//! a weighted split between pools, sticky by a cookie (each client stays on its side) or by
//! weight alone, passed by default and cached per pool when asked; a mirror to a shadow pool
//! that sees the requests, whose hung answers never hold up the client, and whose bound drops
//! the extras.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;

/// An origin that says who it is and how many requests it had.
async fn named(name: &'static str) -> Origin {
    Origin::start(move |_, n| {
        Reply::ok(format!("{name} #{n}")).header("cache-control", "max-age=600")
    })
    .await
}

/// Waits (at most 10 s) until `done` holds.
async fn until(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

#[tokio::test(flavor = "multi_thread")]
async fn a_split_by_weight_sticky_by_cookie_passed_or_cached_per_pool() {
    let (blue, green) = (named("blue").await, named("green").await);
    let larder = Larder::start(&format!(
        r#"
[pool.blue]
backends = ["{}"]
[pool.green]
backends = ["{}"]

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  proxy = {{ pool = "blue" }}
    [[listener.route.rule]]
    name = "ab"
    when = {{ path = "/sticky/**" }}
    split = {{ pools = {{ blue = 50, green = 50 }}, sticky = "cookie:uid" }}
    [[listener.route.rule]]
    when = {{ path = "/weighted/**" }}
    split = {{ pools = {{ blue = 90, green = 10 }}, sticky = "none" }}
    [[listener.route.rule]]
    when = {{ path = "/per-pool/**" }}
    split = {{ pools = {{ blue = 50, green = 50 }}, sticky = "cookie:uid", cache = "per-pool" }}
"#,
        blue.url(),
        green.url()
    ))
    .await;
    let c = client();
    let side = |r: &Got| r.text().split(' ').next().unwrap().to_string();

    // Sticky: each client (its cookie) on one side, every time; both sides get clients. Not
    // cached by default: each request reaches its side.
    let mut sides: HashMap<String, String> = HashMap::new();
    for round in 0..2 {
        for u in 0..40 {
            let cookie = format!("uid=u{u}");
            let r = get(&c, &larder.url("/sticky/page"), &[("cookie", &cookie)]).await;
            assert_eq!((r.status.as_u16(), r.cache()), (200, "BYPASS"));
            let s = side(&r);
            match round {
                0 => {
                    sides.insert(cookie, s);
                }
                _ => assert_eq!(sides[&cookie], s, "{cookie} changed sides"),
            }
        }
    }
    let on_green = sides.values().filter(|s| *s == "green").count();
    assert!((5..=35).contains(&on_green), "{on_green} of 40 on green");
    assert_eq!(blue.hits() + green.hits(), 80);

    // By weight alone: about one in ten to green.
    let before = green.hits();
    for _ in 0..200 {
        get(&c, &larder.url("/weighted/x"), &[]).await;
    }
    let to_green = green.hits() - before;
    assert!((5..=45).contains(&to_green), "{to_green} of 200 to green");

    // Cached per pool: each side fills and hits its own entry of one URL (the same weights,
    // the same sides).
    let cookie_of = |want: &str| {
        let (c, _) = (sides.iter()).find(|(_, s)| *s == want).unwrap();
        c.clone()
    };
    let (b, g) = (cookie_of("blue"), cookie_of("green"));
    let r = get(&c, &larder.url("/per-pool/x"), &[("cookie", &b)]).await;
    assert_eq!((r.cache(), side(&r).as_str()), ("MISS", "blue"));
    let r = get(&c, &larder.url("/per-pool/x"), &[("cookie", &g)]).await;
    assert_eq!((r.cache(), side(&r).as_str()), ("MISS", "green"));
    let r = get(&c, &larder.url("/per-pool/x"), &[("cookie", &b)]).await;
    assert_eq!((r.cache(), side(&r).as_str()), ("HIT", "blue"));
    let r = get(&c, &larder.url("/per-pool/x"), &[("cookie", &g)]).await;
    assert_eq!((r.cache(), side(&r).as_str()), ("HIT", "green"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mirror_sees_the_requests_never_slows_the_client_and_is_bounded() {
    let origin = named("origin").await;
    let shadow = Origin::start(|_, _| Reply::ok("shadow")).await;
    // A shadow that answers nothing for a minute (the test is over long before).
    let hung = Origin::start(|_, _| Reply::ok("late").delay(Duration::from_secs(60))).await;
    let larder = Larder::start(&format!(
        r#"
[admin]
token = "a-metrics-token"
listen = "127.0.0.1:0"

[pool.shadow]
backends = ["{}"]
[pool.hung]
backends = ["{}"]

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = "{}" }}
    [[listener.route.rule]]
    when = {{ path = "/seen/**" }}
    mirror = {{ pool = "shadow", body = true, max_body = 8 }}
    [[listener.route.rule]]
    when = {{ path = "/hung/**" }}
    mirror = {{ pool = "hung", max_in_flight = 2, timeout = "5m" }}
"#,
        shadow.url(),
        hung.url(),
        origin.url()
    ))
    .await;
    let c = client();

    // What goes upstream goes to the shadow too (a miss and a pass; a hit goes nowhere).
    let r = get(&c, &larder.url("/seen/a?q=1"), &[("x-trace", "t1")]).await;
    assert_eq!((r.status.as_u16(), r.cache()), (200, "MISS"));
    assert_eq!(
        get(&c, &larder.url("/seen/a?q=1"), &[]).await.cache(),
        "HIT"
    );
    let r = send(&c, "POST", &larder.url("/seen/form"), &[], b"x=1").await;
    assert_eq!(r.status, 200);
    assert!(until(|| shadow.hits() == 2).await, "{:?}", shadow.seen());
    // A body over `max_body`: the head alone.
    let r = send(&c, "POST", &larder.url("/seen/big"), &[], b"0123456789").await;
    assert_eq!(r.status, 200);
    assert!(until(|| shadow.hits() == 3).await, "{:?}", shadow.seen());
    let seen = shadow.seen();
    assert_eq!(seen[0].path, "/seen/a?q=1");
    assert_eq!(seen[0].headers["x-trace"], "t1");
    assert_eq!(
        (seen[1].method.as_str(), seen[1].path.as_str()),
        ("POST", "/seen/form")
    );
    assert_eq!(&seen[1].body[..], b"x=1", "a small body goes along");
    assert_eq!(
        (seen[2].path.as_str(), seen[2].body.len()),
        ("/seen/big", 0)
    );
    let to_origin = (origin.seen().into_iter()).find(|s| s.path == "/seen/big");
    assert_eq!(
        &to_origin.unwrap().body[..],
        b"0123456789",
        "the origin gets it whole"
    );

    // A hung shadow: every client is answered while its mirrors hang, and no more than 2 are
    // in flight (the rest dropped).
    for i in 0..5 {
        let r = get(&c, &larder.url(&format!("/hung/{i}")), &[]).await;
        assert_eq!(r.status, 200);
        assert!(r.text().starts_with("origin #"), "{}", r.text());
    }
    assert!(
        until(|| hung.hits() == 2).await,
        "{} mirrors arrived",
        hung.hits()
    );
    assert_eq!(
        hung.open_connections(),
        2,
        "the 2 mirrors still hang while every client has its answer"
    );
    // Another request: still answered, still no third mirror. The shadow pool counts the
    // drops (counted before each client was answered).
    assert_eq!(get(&c, &larder.url("/hung/last"), &[]).await.status, 200);
    let dropped = |pool: &str| {
        let pools = larder.pools();
        let p = (pools.as_array().unwrap().iter())
            .find(|p| p["name"] == pool)
            .unwrap()
            .clone();
        p["mirrors_dropped"].as_u64().unwrap()
    };
    assert_eq!((dropped("hung"), dropped("shadow")), (4, 0));
    // And in /metrics, per pool.
    let text = larder.metrics_text().expect("an admin listener counts");
    assert!(
        text.contains("larder_upstream_mirrors_dropped_total{pool=\"hung\"} 4"),
        "{text}"
    );
    assert!(
        text.contains("larder_upstream_mirrors_dropped_total{pool=\"shadow\"} 0"),
        "{text}"
    );
    assert_eq!(origin.hits(), 3 + 6);
    // A mirror sent after those (to the answering shadow) has arrived: the dropped ones would
    // have been sent before it.
    get(&c, &larder.url("/seen/sync"), &[]).await;
    assert!(until(|| shadow.hits() == 4).await);
    assert_eq!(hung.hits(), 2, "mirrors past the bound are dropped");
}
