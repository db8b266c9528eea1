//! HTTP caching conformance, one module per area of RFC 9111 (and RFC 5861, RFC 9213), each
//! test against a real origin and real sockets, citing the section it checks.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;

async fn setup(
    extra: &str,
    handler: impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static,
) -> (Origin, Larder, Client, String) {
    setup_route(extra, "", handler).await
}

/// [`setup`] with more keys in the proxy route's table (`request_cache_control = "honour"`).
/// The origin and larder share one clock, which a test moves with [`Larder::advance`] rather
/// than sleep past a max-age.
async fn setup_route(
    extra: &str,
    route_keys: &str,
    handler: impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static,
) -> (Origin, Larder, Client, String) {
    let clock = larder::clock::Clock::adjustable();
    let origin = Origin::start_at(&clock, handler).await;
    let proxy = if route_keys.is_empty() {
        PROXY.to_string()
    } else {
        proxy_with(route_keys)
    };
    let toml = format!("{extra}\n{proxy}").replace("{origin}", &origin.url());
    let larder = Larder::start_at(&toml, clock).await;
    let base = larder.url("");
    (origin, larder, client(), base)
}

mod freshness {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn s4_2_1_cache_control_parsing_corner_cases() {
        let (origin, _l, c, base) = setup("", |seen, n| {
            let cc = match seen.path.as_str() {
                "/quoted" => "max-age=\"60\"",
                "/upper" => "MAX-AGE=60, Public",
                "/negative" => "max-age=-1",
                "/huge" => "max-age=99999999999999999999999",
                "/conflict" => "max-age=60, max-age=0",
                "/dup-lines" => "max-age=60",
                _ => "max-age=abc",
            };
            let r = Reply::ok(format!("{n}")).header("cache-control", cc);
            if seen.path == "/dup-lines" {
                r.header("cache-control", "no-store")
            } else {
                r
            }
        })
        .await;
        let mut expect_hit = vec![];
        for (path, hit) in [
            ("/quoted", true),
            ("/upper", true),
            ("/negative", false),
            ("/huge", true),
            ("/conflict", false),
            ("/dup-lines", false),
            ("/invalid", false),
        ] {
            get(&c, &format!("{base}{path}"), &[]).await;
            let second = get(&c, &format!("{base}{path}"), &[]).await;
            expect_hit.push((path, second.cache() == "HIT", hit));
        }
        for (path, got, want) in expect_hit {
            assert_eq!(got, want, "{path}");
        }
        assert!(origin.hits() >= 7);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn s5_3_expires_formats_and_invalid_dates() {
        let (_o, _l, c, base) = setup("", |seen, _| {
            let now = std::time::SystemTime::now();
            let later = now + Duration::from_secs(3600);
            let imf = httpdate::fmt_http_date(later);
            // RFC 850 and asctime forms of the same instant.
            let t: httpdate::HttpDate = later.into();
            let s = t.to_string(); // "Sun, 06 Nov 1994 08:49:37 GMT"
            let parts: Vec<&str> = s.split(' ').collect();
            let weekday_long = match parts[0] {
                "Mon," => "Monday",
                "Tue," => "Tuesday",
                "Wed," => "Wednesday",
                "Thu," => "Thursday",
                "Fri," => "Friday",
                "Sat," => "Saturday",
                _ => "Sunday",
            };
            let rfc850 = format!(
                "{weekday_long}, {}-{}-{} {} GMT",
                parts[1],
                parts[2],
                &parts[3][2..],
                parts[4]
            );
            let asctime = format!(
                "{} {} {:>2} {} {}",
                &parts[0][..3],
                parts[2],
                parts[1].trim_start_matches('0'),
                parts[4],
                parts[3]
            );
            let expires = match seen.path.as_str() {
                "/imf" => imf,
                "/rfc850" => rfc850,
                "/asctime" => asctime,
                "/zero" => "0".into(),
                _ => "not a date".into(),
            };
            Reply::ok("x")
                .header("date", &httpdate::fmt_http_date(now))
                .header("expires", &expires)
        })
        .await;
        for (path, hit) in [
            ("/imf", true),
            ("/rfc850", true),
            ("/asctime", true),
            ("/zero", false),
            ("/garbage", false),
        ] {
            get(&c, &format!("{base}{path}"), &[]).await;
            let g = get(&c, &format!("{base}{path}"), &[]).await;
            assert_eq!(g.cache() == "HIT", hit, "{path}");
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn s4_2_2_heuristic_freshness_from_last_modified() {
        let (origin, _l, c, base) = setup("", |seen, _| {
            let now = std::time::SystemTime::now();
            let r = Reply::ok("x").header("date", &httpdate::fmt_http_date(now));
            match seen.path.as_str() {
                // 10% of 1000 s: fresh for ~100 s.
                "/lm" => r.header(
                    "last-modified",
                    &httpdate::fmt_http_date(now - Duration::from_secs(1000)),
                ),
                // 10% of 5 s rounds to 0: stale at once.
                "/recent" => r.header(
                    "last-modified",
                    &httpdate::fmt_http_date(now - Duration::from_secs(5)),
                ),
                // No validator, no lifetime: not stored.
                _ => r,
            }
        })
        .await;
        get(&c, &format!("{base}/lm"), &[]).await;
        assert_eq!(get(&c, &format!("{base}/lm"), &[]).await.cache(), "HIT");
        get(&c, &format!("{base}/none"), &[]).await;
        assert_eq!(get(&c, &format!("{base}/none"), &[]).await.cache(), "MISS");
        assert_eq!(origin.hits(), 3);
    }
}

mod request_directives {
    use super::*;

    /// The route setting that makes larder obey these advisory directives (§5.2.1).
    const HONOUR: &str = r#"request_cache_control = "honour""#;

    #[tokio::test(flavor = "multi_thread")]
    async fn s5_2_1_max_age_min_fresh_max_stale() {
        let (_o, l, c, base) = setup_route("", HONOUR, |_, n| {
            Reply::ok(format!("{n}"))
                .header("cache-control", "max-age=2")
                .header("age", "1")
        })
        .await;
        let url = format!("{base}/r");
        get(&c, &url, &[]).await; // age 1 of 2
        assert_eq!(
            get(&c, &url, &[("cache-control", "max-age=0")])
                .await
                .cache(),
            "EXPIRED"
        );
        assert_eq!(get(&c, &url, &[]).await.cache(), "HIT");
        // min-fresh=5: the response will not stay fresh for 5 more seconds.
        assert_ne!(
            get(&c, &url, &[("cache-control", "min-fresh=5")])
                .await
                .cache(),
            "HIT"
        );
        l.advance(Duration::from_millis(1600)); // now stale
        assert_eq!(
            get(&c, &url, &[("cache-control", "max-stale=60")])
                .await
                .cache(),
            "HIT"
        );
        assert_eq!(
            get(&c, &url, &[("cache-control", "max-stale")])
                .await
                .cache(),
            "HIT"
        );
        assert_eq!(get(&c, &url, &[]).await.cache(), "EXPIRED");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn regression_request_reload_directives_are_ignored_by_default() {
        // §5.2.1: request directives are advisory. By default a client cannot make larder
        // fetch from the origin on every request: no-cache, max-age=0, min-fresh and Pragma
        // are answered from the cache, and max-stale does not stretch a lifetime.
        let (o, l, c, base) = setup("", |_, n| {
            Reply::ok(format!("{n}")).header("cache-control", "max-age=2")
        })
        .await;
        let url = format!("{base}/reload");
        assert_eq!(get(&c, &url, &[]).await.cache(), "MISS");
        for _ in 0..5 {
            for h in [
                ("cache-control", "no-cache"),
                ("cache-control", "max-age=0"),
                ("cache-control", "min-fresh=600"),
                ("pragma", "no-cache"),
            ] {
                let g = get(&c, &url, &[h]).await;
                assert_eq!((g.cache(), &g.body[..]), ("HIT", &b"0"[..]), "{h:?}");
            }
        }
        assert_eq!(o.hits(), 1);
        l.advance(Duration::from_millis(2100)); // now stale
        let g = get(&c, &url, &[("cache-control", "max-stale=600")]).await;
        assert_eq!((g.cache(), &g.body[..]), ("EXPIRED", &b"1"[..]));
        // only-if-cached is still honoured: it never costs the origin anything.
        let cold = get(
            &c,
            &format!("{base}/cold"),
            &[("cache-control", "only-if-cached")],
        )
        .await;
        assert_eq!(cold.status, 504);
        assert_eq!(o.hits(), 2);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn request_directives_are_honoured_from_trusted_addresses_only() {
        // larder listens on 127.0.0.1; loopback lets a client connect from 127.0.0.2 too.
        let (o, l, c, base) = setup_route(
            "",
            r#"request_cache_control_trusted = ["127.0.0.2"]"#,
            |_, n| Reply::ok(format!("{n}")).header("cache-control", "max-age=60"),
        )
        .await;
        let url = format!("{base}/t");
        get(&c, &url, &[]).await;
        assert_eq!(
            get(&c, &url, &[("cache-control", "no-cache")])
                .await
                .cache(),
            "HIT"
        );
        let from_trusted = raw_get_from("127.0.0.2", l.addr, "/t", "Cache-Control: no-cache").await;
        assert!(from_trusted.contains("x-cache: expired"), "{from_trusted}");
        assert_eq!(o.hits(), 2);
    }

    /// One GET over a socket bound to `source`, answered whole (Connection: close).
    async fn raw_get_from(
        source: &str,
        to: std::net::SocketAddr,
        path: &str,
        field: &str,
    ) -> String {
        let mut s = Raw::connect_from(source.parse().unwrap(), to).await;
        let req =
            format!("GET {path} HTTP/1.1\r\nHost: {to}\r\n{field}\r\nConnection: close\r\n\r\n");
        s.write(req).await;
        let out = s.read_to_end(Duration::from_secs(5)).await;
        String::from_utf8_lossy(&out).to_lowercase()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn regression_concurrent_no_cache_revalidations_coalesce() {
        // With request directives honoured, 20 concurrent reloads revalidate once.
        let (o, _l, c, base) = setup_route("", HONOUR, |seen, n| {
            if seen.headers.contains_key("if-none-match") {
                Reply::ok("")
                    .status(304)
                    .header("etag", "\"v\"")
                    .header("cache-control", "max-age=60")
                    .delay(Duration::from_millis(300))
            } else {
                Reply::ok(format!("{n}"))
                    .header("etag", "\"v\"")
                    .header("cache-control", "max-age=60")
            }
        })
        .await;
        let url = Arc::new(format!("{base}/rv"));
        get(&c, &url, &[]).await;
        let mut reloads = Vec::new();
        for _ in 0..20 {
            let (c, url) = (c.clone(), url.clone());
            reloads.push(tokio::spawn(async move {
                get(&c, &url, &[("cache-control", "no-cache")]).await
            }));
        }
        for r in reloads {
            let g = r.await.unwrap();
            assert_eq!((g.status.as_u16(), &g.body[..]), (200, &b"0"[..]));
        }
        assert_eq!(o.hits(), 2, "one fill, one revalidation");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn s5_2_1_5_request_no_store_is_not_stored() {
        let (o, _l, c, base) = setup("", |_, _| {
            Reply::ok("x").header("cache-control", "max-age=60")
        })
        .await;
        let url = format!("{base}/ns");
        get(&c, &url, &[("cache-control", "no-store")]).await;
        assert_eq!(get(&c, &url, &[]).await.cache(), "MISS");
        assert_eq!(o.hits(), 2);
    }
}

mod response_directives {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn s5_2_2_2_must_revalidate_never_serves_stale_when_origin_fails() {
        let (_o, l, c, base) = setup("[cache]\nstale_if_error = \"60s\"", |seen, n| {
            let cc = if seen.path == "/mr" {
                "max-age=1, must-revalidate"
            } else {
                "max-age=1"
            };
            if n >= 2 {
                Reply::ok("down").status(503)
            } else {
                Reply::ok("good").header("cache-control", cc)
            }
        })
        .await;
        get(&c, &format!("{base}/mr"), &[]).await;
        get(&c, &format!("{base}/sie"), &[]).await;
        l.advance(Duration::from_millis(1100));
        let mr = get(&c, &format!("{base}/mr"), &[]).await;
        assert_eq!(mr.status, 503);
        // Without must-revalidate, the configured stale-if-error grace serves the stale copy.
        let sie = get(&c, &format!("{base}/sie"), &[]).await;
        assert_eq!(sie.status, 200);
        assert_eq!(sie.body, "good");
        assert_eq!(sie.cache(), "STALE");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn s5_2_2_4_and_7_qualified_no_cache_and_private_fields_are_not_shared() {
        let (_o, _l, c, base) = setup("", |_, n| {
            Reply::ok("shared")
                .header(
                    "cache-control",
                    "max-age=60, private=\"x-user\", no-cache=\"x-session\"",
                )
                .header("x-user", &format!("user{n}"))
                .header("x-session", &format!("s{n}"))
        })
        .await;
        let url = format!("{base}/q");
        let first = get(&c, &url, &[]).await;
        assert_eq!(first.header("x-user"), Some("user0"));
        let hit = get(&c, &url, &[]).await;
        assert_eq!(hit.cache(), "HIT");
        assert_eq!(hit.header("x-user"), None);
        assert_eq!(hit.header("x-session"), None);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn s5_2_2_6_no_transform_keeps_the_origin_coding_only() {
        let body = "text ".repeat(2000);
        let gz = {
            use std::io::Write;
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(body.as_bytes()).unwrap();
            e.finish().unwrap()
        };
        let plain = body.clone();
        let (_o, l, c, base) = setup("", move |seen, _| {
            if seen.path == "/gz" {
                Reply::ok(gz.clone())
                    .header("cache-control", "max-age=60, no-transform")
                    .header("content-type", "text/plain")
                    .header("content-encoding", "gzip")
            } else {
                Reply::ok(plain.clone())
                    .header("cache-control", "max-age=60, no-transform")
                    .header("content-type", "text/plain")
            }
        })
        .await;
        get(&c, &format!("{base}/plain"), &[]).await;
        // Stored as it came, and no variant on its way: nothing will re-encode it later.
        let host = l.addr.to_string();
        let mut stored = None;
        for _ in 0..500 {
            stored = l.stored_encodings(&host, "/plain");
            if stored.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let stored = stored.expect("the response is stored");
        assert_eq!(
            stored,
            (vec!["identity"], false),
            "no-transform body to be re-encoded"
        );
        let g = get(
            &c,
            &format!("{base}/plain"),
            &[("accept-encoding", "br, gzip")],
        )
        .await;
        assert_eq!(g.cache(), "HIT");
        assert_eq!(
            g.header("content-encoding"),
            None,
            "no-transform body was re-encoded"
        );
        assert_eq!(g.body, body.as_bytes());
        get(&c, &format!("{base}/gz"), &[("accept-encoding", "gzip")]).await;
        let g = get(&c, &format!("{base}/gz"), &[("accept-encoding", "gzip")]).await;
        assert_eq!(g.cache(), "HIT");
        assert_eq!(g.header("content-encoding"), Some("gzip"));
        assert_eq!(decode(&g.body, Some("gzip")), body.as_bytes());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn s5_2_2_3_must_understand_overrides_no_store_for_understood_codes() {
        let (_o, _l, c, base) = setup("", |_, _| {
            Reply::ok("x").header("cache-control", "max-age=60, must-understand, no-store")
        })
        .await;
        get(&c, &format!("{base}/mu"), &[]).await;
        assert_eq!(get(&c, &format!("{base}/mu"), &[]).await.cache(), "HIT");
    }
}

mod vary {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn s4_1_one_variant_per_selecting_value_with_normalization() {
        let (origin, _l, c, base) = setup("", |seen, _| {
            let lang = seen
                .headers
                .get("accept-language")
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default();
            Reply::ok(format!("lang={lang}"))
                .header("cache-control", "max-age=60")
                .header("vary", "Accept-Language")
        })
        .await;
        let url = format!("{base}/v");
        assert_eq!(
            get(&c, &url, &[("accept-language", "en")]).await.cache(),
            "MISS"
        );
        assert_eq!(
            get(&c, &url, &[("accept-language", "fr")]).await.cache(),
            "MISS"
        );
        let en = get(&c, &url, &[("accept-language", "en")]).await;
        assert_eq!((en.cache(), &en.body[..]), ("HIT", &b"lang=en"[..]));
        let fr = get(&c, &url, &[("accept-language", "fr")]).await;
        assert_eq!((fr.cache(), &fr.body[..]), ("HIT", &b"lang=fr"[..]));
        // Case and whitespace differences select the same variant.
        get(&c, &url, &[("accept-language", "en-US, de;q=0.5")]).await;
        let same = get(&c, &url, &[("accept-language", "EN-us ,  de ; q=0.5")]).await;
        assert_eq!(same.cache(), "HIT");
        // An absent field is its own variant.
        assert_eq!(get(&c, &url, &[]).await.cache(), "MISS");
        assert_eq!(origin.hits(), 4);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn s4_1_vary_star_never_matches() {
        let (origin, _l, c, base) = setup("", |_, _| {
            Reply::ok("x")
                .header("cache-control", "max-age=60")
                .header("vary", "*")
        })
        .await;
        get(&c, &format!("{base}/s"), &[]).await;
        assert_ne!(get(&c, &format!("{base}/s"), &[]).await.cache(), "HIT");
        assert_eq!(origin.hits(), 2);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn s4_1_vary_accept_encoding_does_not_split_the_cache() {
        let (origin, _l, c, base) = setup("", |_, _| {
            Reply::ok("x".repeat(1000))
                .header("cache-control", "max-age=60")
                .header("content-type", "text/plain")
                .header("vary", "Accept-Encoding")
        })
        .await;
        let url = format!("{base}/ae");
        get(&c, &url, &[("accept-encoding", "gzip")]).await;
        wait_for_encoding(&c, &url, "br").await;
        assert_eq!(
            get(&c, &url, &[("accept-encoding", "zstd")]).await.cache(),
            "HIT"
        );
        assert_eq!(origin.hits(), 1);
    }
}

mod validation {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn s4_3_4_a_304_updates_stored_headers_but_not_content_length() {
        let (origin, l, c, base) = setup("", |seen, n| {
            if seen.headers.contains_key("if-none-match") {
                Reply::ok("")
                    .status(304)
                    .header("etag", "\"e1\"")
                    .header("cache-control", "max-age=60")
                    .header("x-version", &format!("refreshed{n}"))
            } else {
                Reply::ok("original body")
                    .header("etag", "\"e1\"")
                    .header("cache-control", "max-age=1")
                    .header("x-version", "first")
            }
        })
        .await;
        let url = format!("{base}/val");
        get(&c, &url, &[]).await;
        l.advance(Duration::from_millis(1100));
        let r = get(&c, &url, &[]).await;
        assert_eq!(r.cache(), "REVALIDATED");
        assert_eq!(r.body, "original body");
        assert_eq!(r.header("x-version"), Some("refreshed1"));
        assert_eq!(r.header("content-length"), Some("13"));
        // The refreshed freshness (max-age=60) now applies.
        let hit = get(&c, &url, &[]).await;
        assert_eq!(hit.cache(), "HIT");
        assert_eq!(hit.header("x-version"), Some("refreshed1"));
        assert_eq!(origin.seen()[1].headers["if-none-match"], "\"e1\"");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn s4_3_4_the_right_variant_is_refreshed() {
        let (_o, l, c, base) = setup("", |seen, _| {
            let lang = seen
                .headers
                .get("accept-language")
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default();
            if seen.headers.contains_key("if-none-match") {
                Reply::ok("")
                    .status(304)
                    .header("etag", &format!("\"{lang}\""))
                    .header("cache-control", "max-age=60")
            } else {
                Reply::ok(format!("body-{lang}"))
                    .header("etag", &format!("\"{lang}\""))
                    .header("cache-control", "max-age=1")
                    .header("vary", "Accept-Language")
            }
        })
        .await;
        let url = format!("{base}/vv");
        get(&c, &url, &[("accept-language", "en")]).await;
        get(&c, &url, &[("accept-language", "fr")]).await;
        l.advance(Duration::from_millis(1100));
        let fr = get(&c, &url, &[("accept-language", "fr")]).await;
        assert_eq!((fr.cache(), &fr.body[..]), ("REVALIDATED", &b"body-fr"[..]));
        let fr = get(&c, &url, &[("accept-language", "fr")]).await;
        assert_eq!((fr.cache(), &fr.body[..]), ("HIT", &b"body-fr"[..]));
        // The other variant is still stale and still its own body.
        let en = get(&c, &url, &[("accept-language", "en")]).await;
        assert_eq!((en.cache(), &en.body[..]), ("REVALIDATED", &b"body-en"[..]));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn s4_3_5_a_head_updates_or_invalidates_the_stored_get_response() {
        let (origin, l, c, base) = setup("", |seen, n| {
            let tag = if seen.path == "/changed" && n >= 3 {
                "\"v2\""
            } else {
                "\"v1\""
            };
            let body = if seen.method == "HEAD" {
                ""
            } else {
                "the body"
            };
            let mut r = Reply::ok(body);
            if seen.path != "/plain" {
                r = r.header("etag", tag);
            }
            if seen.method == "HEAD" {
                r.header("cache-control", "max-age=100")
                    .header("x-meta", "2")
            } else {
                r.header("cache-control", "max-age=1").header("x-meta", "1")
            }
        })
        .await;
        for p in ["/same", "/changed", "/plain"] {
            get(&c, &format!("{base}{p}"), &[]).await;
        }
        l.advance(Duration::from_millis(1100));
        // No validators on either side: the HEAD's fields and freshness are taken over too.
        let head = send(&c, "HEAD", &format!("{base}/plain"), &[], b"").await;
        assert_eq!(head.header("x-meta"), Some("2"));
        let hit = get(&c, &format!("{base}/plain"), &[]).await;
        assert_eq!((hit.cache(), &hit.body[..]), ("HIT", &b"the body"[..]));
        // Same validator: the HEAD goes through as HEAD and freshens the stored GET response.
        let head = send(&c, "HEAD", &format!("{base}/same"), &[], b"").await;
        assert_eq!(
            (head.status.as_u16(), head.header("x-meta")),
            (200, Some("2"))
        );
        let hit = get(&c, &format!("{base}/same"), &[]).await;
        assert_eq!(hit.cache(), "HIT");
        assert_eq!(hit.header("x-meta"), Some("2"));
        assert_eq!(hit.body, "the body");
        // Another validator: the stored body is outdated and dropped.
        let head = send(&c, "HEAD", &format!("{base}/changed"), &[], b"").await;
        assert_eq!(head.header("etag"), Some("\"v2\""));
        assert_eq!(
            get(&c, &format!("{base}/changed"), &[]).await.cache(),
            "MISS"
        );
        let methods: Vec<String> = origin.seen().iter().map(|s| s.method.clone()).collect();
        assert_eq!(
            methods,
            ["GET", "GET", "GET", "HEAD", "HEAD", "HEAD", "GET"]
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn s4_3_3_a_200_replaces_the_stored_response() {
        let (_o, l, c, base) = setup("", |_, n| {
            Reply::ok(format!("version {n}"))
                .header("etag", &format!("\"{n}\""))
                .header("cache-control", "max-age=1")
        })
        .await;
        let url = format!("{base}/rep");
        get(&c, &url, &[]).await;
        l.advance(Duration::from_millis(1100));
        let r = get(&c, &url, &[]).await;
        assert_eq!((r.cache(), &r.body[..]), ("EXPIRED", &b"version 1"[..]));
        assert_eq!(get(&c, &url, &[]).await.body, "version 1");
    }
}

mod stale {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn rfc5861_stale_while_revalidate_race_makes_one_background_fetch() {
        let (origin, l, c, base) = setup("", |_, n| {
            let cc = if n == 0 {
                "max-age=1, stale-while-revalidate=30"
            } else {
                "max-age=60"
            };
            Reply::ok(format!("v{n}"))
                .header("cache-control", cc)
                .delay(if n > 0 {
                    Duration::from_millis(200)
                } else {
                    Duration::ZERO
                })
        })
        .await;
        let url = Arc::new(format!("{base}/swr"));
        get(&c, &url, &[]).await;
        l.advance(Duration::from_millis(1100));
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (c, url) = (c.clone(), url.clone());
            tasks.push(tokio::spawn(async move { get(&c, &url, &[]).await }));
        }
        for t in tasks {
            let g = t.await.unwrap();
            assert_eq!(g.body, "v0", "stale answer expected at once");
            assert_eq!(g.cache(), "STALE");
        }
        // Until the background refresh lands, answers stay stale (and start no other refresh).
        for i in 0.. {
            if get(&c, &url, &[]).await.cache() == "HIT" {
                break;
            }
            assert!(i < 500, "the background refresh never landed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(origin.hits(), 2, "exactly one background refresh");
        let fresh = get(&c, &url, &[]).await;
        assert_eq!((fresh.cache(), &fresh.body[..]), ("HIT", &b"v1"[..]));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn rfc5861_stale_if_error_when_origin_is_down() {
        // After the first response the origin breaks every response mid-body.
        let (_origin, l, c, base) = setup("", |_, n| {
            let r = Reply::ok("kept").header("cache-control", "max-age=1, stale-if-error=60");
            if n == 0 {
                r
            } else {
                r.abort()
            }
        })
        .await;
        let url = format!("{base}/sie");
        get(&c, &url, &[]).await;
        l.advance(Duration::from_millis(1100));
        let g = get(&c, &url, &[]).await;
        assert_eq!(
            (g.status.as_u16(), g.cache(), &g.body[..]),
            (200, "STALE", &b"kept"[..])
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn s4_2_4_stale_when_disconnected_unless_a_directive_forbids_it() {
        // After the first response per path, the origin breaks off every response: larder is
        // "disconnected" and may serve stale (default grace 60 s), except where must-revalidate,
        // proxy-revalidate, s-maxage or no-cache forbid it (§5.2.2.2, .8, .10, .4).
        let (_o, l, c, base) = setup("", |seen, n| {
            let cc = match seen.path.as_str() {
                "/mr" => "max-age=1, must-revalidate",
                "/pr" => "max-age=1, proxy-revalidate",
                "/sm" => "max-age=1, s-maxage=1",
                "/nc" => "max-age=1, no-cache",
                _ => "max-age=1",
            };
            let r = Reply::ok("old").header("cache-control", cc);
            if n < 5 {
                r
            } else {
                r.abort()
            }
        })
        .await;
        let paths = ["/ok", "/mr", "/pr", "/sm", "/nc"];
        for p in paths {
            get(&c, &format!("{base}{p}"), &[]).await;
        }
        l.advance(Duration::from_millis(1100));
        let ok = get(&c, &format!("{base}/ok"), &[]).await;
        assert_eq!((ok.status.as_u16(), ok.cache()), (200, "STALE"));
        assert_eq!(ok.body, "old");
        for p in &paths[1..] {
            let g = get(&c, &format!("{base}{p}"), &[]).await;
            assert_eq!(g.status, 502, "{p} must not be served stale");
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn s4_2_4_no_stale_without_permission() {
        let (origin, l, c, base) = setup("", |_, n| {
            if n == 0 {
                Reply::ok("old").header("cache-control", "max-age=1")
            } else {
                Reply::ok("err").status(500)
            }
        })
        .await;
        let url = format!("{base}/nostale");
        get(&c, &url, &[]).await;
        l.advance(Duration::from_millis(1100));
        assert_eq!(get(&c, &url, &[]).await.status, 500);
        assert_eq!(origin.hits(), 2);
    }
}

mod invalidation {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn s4_4_unsafe_methods_invalidate_target_and_locations() {
        let (origin, _l, c, base) = setup("", |seen, n| match seen.method.as_str() {
            "POST" => Reply::ok("created")
                .status(201)
                .header("location", "/items/2")
                .header("content-location", "http://elsewhere.example/items/1"),
            "DELETE" => Reply::ok("").status(500),
            _ => Reply::ok(format!("{} {n}", seen.path)).header("cache-control", "max-age=60"),
        })
        .await;
        for p in ["/items", "/items/2"] {
            get(&c, &format!("{base}{p}"), &[]).await;
            assert_eq!(get(&c, &format!("{base}{p}"), &[]).await.cache(), "HIT");
        }
        let post = send(&c, "POST", &format!("{base}/items"), &[], b"{}").await;
        assert_eq!(post.status, 201);
        assert_eq!(get(&c, &format!("{base}/items"), &[]).await.cache(), "MISS");
        assert_eq!(
            get(&c, &format!("{base}/items/2"), &[]).await.cache(),
            "MISS"
        );
        // An error response invalidates nothing.
        send(&c, "DELETE", &format!("{base}/items"), &[], b"").await;
        assert_eq!(get(&c, &format!("{base}/items"), &[]).await.cache(), "HIT");
        assert!(origin.hits() >= 6);
    }
}

mod headers {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn s3_1_connection_listed_fields_are_not_stored() {
        let (_o, _l, c, base) = setup("", |_, _| {
            Reply::ok("x")
                .header("cache-control", "max-age=60")
                .header("connection", "x-private-hop")
                .header("x-private-hop", "1")
                .header("x-end-to-end", "kept")
        })
        .await;
        get(&c, &format!("{base}/h"), &[]).await;
        let hit = get(&c, &format!("{base}/h"), &[]).await;
        assert_eq!(hit.cache(), "HIT");
        assert_eq!(hit.header("x-private-hop"), None);
        assert_eq!(hit.header("x-end-to-end"), Some("kept"));
    }
}

mod stored_fields {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn s3_1_unknown_content_coding_and_content_range_on_a_200_are_stored_as_sent() {
        let (origin, _l, c, base) = setup("", |seen, _| {
            let r = Reply::ok("opaque-bytes").header("cache-control", "max-age=3600");
            match seen.path.as_str() {
                "/ce" => r.header("content-encoding", "x-custom"),
                _ => r.header("content-range", "meaningless"),
            }
        })
        .await;
        for (p, name, value) in [
            ("/ce", "content-encoding", "x-custom"),
            ("/cr", "content-range", "meaningless"),
        ] {
            get(&c, &format!("{base}{p}"), &[]).await;
            let hit = get(
                &c,
                &format!("{base}{p}"),
                &[("accept-encoding", "gzip, br")],
            )
            .await;
            assert_eq!(hit.cache(), "HIT", "{p}");
            assert_eq!(hit.header(name), Some(value), "{p}");
            assert_eq!(hit.body, "opaque-bytes", "{p}: body as the origin sent it");
        }
        assert_eq!(origin.hits(), 2);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn s4_2_3_an_age_list_is_read_by_its_first_member() {
        let (origin, _l, c, base) = setup("", |_, _| {
            Reply::ok("aged")
                .header("cache-control", "max-age=3600")
                .header("age", "7200, 0")
        })
        .await;
        let first = get(&c, &format!("{base}/age"), &[]).await;
        let age: u64 = first.header("age").unwrap().parse().unwrap();
        assert!(age >= 7200, "age {age}");
        // Older than its lifetime: stale at once, fetched again.
        assert_eq!(
            get(&c, &format!("{base}/age"), &[]).await.cache(),
            "EXPIRED"
        );
        assert_eq!(origin.hits(), 2);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn s4_2_3_age_counts_the_time_stored_on_larders_clock() {
        // Age is the stored response's current age when it is sent: the resident time counts
        // on the clock the cache is handed, the one freshness is read on.
        let (origin, l, c, base) = setup("", |_, n| {
            Reply::ok(format!("{n}")).header("cache-control", "max-age=600")
        })
        .await;
        let url = format!("{base}/aging");
        get(&c, &url, &[]).await;
        l.advance(Duration::from_secs(300));
        let hit = get(&c, &url, &[]).await;
        assert_eq!((hit.cache(), &hit.body[..]), ("HIT", &b"0"[..]));
        let age: u64 = hit.header("age").unwrap().parse().unwrap();
        // 300 s moved, and under 2 s of the Date's whole seconds and of the test's own time.
        assert!((300..302).contains(&age), "age {age}");
        l.advance(Duration::from_secs(300));
        assert_eq!(get(&c, &url, &[]).await.cache(), "EXPIRED");
        assert_eq!(origin.hits(), 2);
    }
}

mod cdn_cache_control {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn rfc9213_targeted_field_wins_and_is_passed_on() {
        let (origin, _l, c, base) = setup("", |seen, _| {
            let r = Reply::ok("x");
            match seen.path.as_str() {
                "/cdn-store" => r
                    .header("cache-control", "no-store")
                    .header("cdn-cache-control", "max-age=60"),
                _ => r
                    .header("cache-control", "max-age=60")
                    .header("cdn-cache-control", "no-store"),
            }
        })
        .await;
        get(&c, &format!("{base}/cdn-store"), &[]).await;
        let hit = get(&c, &format!("{base}/cdn-store"), &[]).await;
        assert_eq!(hit.cache(), "HIT");
        assert_eq!(hit.header("cdn-cache-control"), Some("max-age=60"));
        assert_eq!(hit.header("cache-control"), Some("no-store"));
        get(&c, &format!("{base}/cdn-nostore"), &[]).await;
        let miss = get(&c, &format!("{base}/cdn-nostore"), &[]).await;
        assert_eq!(miss.cache(), "MISS");
        assert_eq!(miss.header("cdn-cache-control"), Some("no-store"));
        assert_eq!(origin.hits(), 3);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn rfc9213_s2_1_an_invalid_structured_field_is_ignored_whole() {
        let (origin, _l, c, base) = setup("", |seen, _| {
            let cdn = match seen.path.as_str() {
                "/wrong-type" => "max-age=\"10000\"",
                "/unparseable" => "max-age=10000, &&&&&",
                "/space" => "max-age =100",
                "/flag-value" => "max-age=100, no-store=1",
                _ => "max-age=100, private=(\"x-user\"), x-unknown;p=1",
            };
            Reply::ok("x")
                .header("cache-control", "no-store")
                .header("x-user", "u1")
                .header("cdn-cache-control", cdn)
        })
        .await;
        for p in ["/wrong-type", "/unparseable", "/space", "/flag-value"] {
            get(&c, &format!("{base}{p}"), &[]).await;
            let again = get(&c, &format!("{base}{p}"), &[]).await;
            assert_eq!(again.cache(), "MISS", "{p}: Cache-Control no-store applies");
        }
        // A valid Dictionary with a qualified private and an unknown member is honoured.
        get(&c, &format!("{base}/valid"), &[]).await;
        let hit = get(&c, &format!("{base}/valid"), &[]).await;
        assert_eq!(hit.cache(), "HIT");
        assert_eq!(hit.header("x-user"), None, "private=(x-user) is not shared");
        assert_eq!(origin.hits(), 9);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn rfc9213_cdn_cache_control_can_be_kept_from_clients() {
        let (_o, _l, c, base) = setup("[cache]\nforward_cdn_cache_control = false", |_, _| {
            Reply::ok("x")
                .header("cache-control", "no-store")
                .header("cdn-cache-control", "max-age=60")
        })
        .await;
        assert_eq!(
            get(&c, &format!("{base}/k"), &[])
                .await
                .header("cdn-cache-control"),
            None
        );
        let hit = get(&c, &format!("{base}/k"), &[]).await;
        assert_eq!(hit.cache(), "HIT");
        assert_eq!(hit.header("cdn-cache-control"), None);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn rfc9213_field_name_is_configurable() {
        let (_o, _l, c, base) = setup(
            "[cache]\ntargeted_cache_control = [\"Larder-Cache-Control\"]",
            |_, _| {
                Reply::ok("x")
                    .header("cache-control", "no-store")
                    .header("larder-cache-control", "max-age=60")
            },
        )
        .await;
        get(&c, &format!("{base}/t"), &[]).await;
        let hit = get(&c, &format!("{base}/t"), &[]).await;
        assert_eq!(hit.cache(), "HIT");
        assert_eq!(hit.header("larder-cache-control"), None);
    }
}

mod partial_content {
    use super::*;

    fn body() -> String {
        (0..2000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn rfc9110_s14_ranges_are_answered_from_the_stored_entry() {
        let b = body();
        let (origin, _l, c, base) = setup("", move |seen, _| {
            assert!(
                !seen.headers.contains_key("range"),
                "a fill must fetch the whole body"
            );
            Reply::ok(b.clone())
                .header("cache-control", "max-age=60")
                .header("etag", "\"r1\"")
                .header("content-type", "text/plain")
        })
        .await;
        let url = format!("{base}/r");
        let b = body();
        // Even the miss is answered with the range (the fill fetched everything).
        let first = get(&c, &url, &[("range", "bytes=0-9")]).await;
        assert_eq!(first.status, 206);
        assert_eq!(first.body, b[0..10]);
        assert_eq!(first.header("content-range"), Some("bytes 0-9/2000"));
        let suffix = get(&c, &url, &[("range", "bytes=-5")]).await;
        assert_eq!((suffix.status.as_u16(), suffix.cache()), (206, "HIT"));
        assert_eq!(suffix.body, b[1995..]);
        let multi = get(&c, &url, &[("range", "bytes=0-1, 10-11")]).await;
        assert_eq!(multi.status, 206);
        assert!(multi
            .header("content-type")
            .unwrap()
            .starts_with("multipart/byteranges; boundary="));
        let text = String::from_utf8_lossy(&multi.body);
        assert!(
            text.contains("Content-Range: bytes 0-1/2000")
                && text.contains("Content-Range: bytes 10-11/2000")
        );
        let bad = get(&c, &url, &[("range", "bytes=5000-6000")]).await;
        assert_eq!(bad.status, 416);
        assert_eq!(bad.header("content-range"), Some("bytes */2000"));
        // If-Range with an old validator: the whole body.
        let old = get(&c, &url, &[("range", "bytes=0-9"), ("if-range", "\"old\"")]).await;
        assert_eq!(old.status, 200);
        assert_eq!(old.body.len(), 2000);
        let current = get(&c, &url, &[("range", "bytes=0-9"), ("if-range", "\"r1\"")]).await;
        assert_eq!(current.status, 206);
        assert_eq!(origin.hits(), 1);
    }

    /// The one range `bytes=a-b` of a request, as a test origin that honours Range reads it.
    fn asked_range(seen: &Seen) -> Option<(u64, u64)> {
        let v = seen.headers.get("range")?.to_str().ok()?;
        let (a, b) = v.strip_prefix("bytes=")?.split_once('-')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    }

    /// A 206 of a generated body of `len` bytes for the range asked, or None without one.
    fn part_of(seen: &Seen, len: u64) -> Option<Reply> {
        let (first, last) = asked_range(seen)?;
        Some(
            Reply::ok(pattern(first, last))
                .status(206)
                .header("content-range", &format!("bytes {first}-{last}/{len}")),
        )
    }

    /// GET `url` with `range`, reading the body only when it is a 206 (a regression would
    /// otherwise read gigabytes).
    async fn get_part(c: &Client, url: &str, headers: &[(&str, &str)]) -> Got {
        let (parts, body) = request(c, "GET", url, headers, b"").await.into_parts();
        let body = if parts.status == 206 || parts.status == 416 {
            use http_body_util::BodyExt;
            body.collect().await.expect("body").to_bytes()
        } else {
            bytes::Bytes::new()
        };
        Got {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    /// Range on responses that are not stored (private, no-store, a request with
    /// Authorization, a body over max_object_size, declared or not) was dropped: the fill
    /// fetched the whole body without Range and the client got all of it as a 200. Now the
    /// origin is asked for the range and its 206 is passed on; what the first, whole, fetch
    /// pulled is bounded by socket buffers (or max_object_size when the length is not declared).
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_range_on_responses_not_stored() {
        const LEN: u64 = 256 << 20;
        let produced = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let p = Arc::clone(&produced);
        let (origin, _l, c, base) = setup("[cache]\nmax_object_size = \"1MiB\"", move |seen, _| {
            if let Some(part) = part_of(seen, LEN) {
                return part;
            }
            let cache_control = match seen.path.as_str() {
                "/private" => "private, max-age=60",
                "/no-store" => "no-store",
                _ => "max-age=60", // not stored: too large, or asked with Authorization
            };
            Reply::generated(LEN, seen.path != "/chunked", &p)
                .header("content-type", "application/octet-stream")
                .header("etag", "\"g1\"")
                .header("cache-control", cache_control)
        })
        .await;
        for path in ["/private", "/no-store", "/auth", "/big", "/chunked"] {
            for (first, last) in [(0, 0), (1000, 1999), (LEN - 10, LEN - 1)] {
                produced.store(0, std::sync::atomic::Ordering::SeqCst);
                let range = format!("bytes={first}-{last}");
                let mut headers = vec![("range", range.as_str())];
                if path == "/auth" {
                    headers.push(("authorization", "Bearer t"));
                }
                let g = get_part(&c, &format!("{base}{path}"), &headers).await;
                assert_eq!(g.status, 206, "{path} {range}");
                assert_eq!(
                    g.header("content-range"),
                    Some(format!("bytes {first}-{last}/{LEN}").as_str()),
                    "{path} {range}"
                );
                assert_eq!(g.body, pattern(first, last), "{path} {range}");
                let last_seen = origin.seen().pop().unwrap();
                assert_eq!(
                    last_seen.headers.get("range").and_then(|v| v.to_str().ok()),
                    Some(range.as_str()),
                    "{path}: the origin was asked for the range"
                );
                let pulled = produced.load(std::sync::atomic::Ordering::SeqCst);
                assert!(pulled < 48 << 20, "{path} {range}: {pulled} bytes pulled");
            }
        }
    }

    /// An origin that ignores Range on a response that is not stored: the range is cut from
    /// the stream and the origin's connection dropped once it is sent.
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_range_cut_from_a_pass_through_200() {
        const LEN: u64 = 256 << 20;
        let produced = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let p = Arc::clone(&produced);
        let (origin, _l, c, base) = setup("", move |seen, _| {
            let r = Reply::generated(LEN, true, &p)
                .header("cache-control", "no-store")
                .header("etag", "\"g1\"");
            if seen.path == "/says-none" {
                r.header("accept-ranges", "none")
            } else {
                r
            }
        })
        .await;
        let url = format!("{base}/ignores-range");
        let g = get_part(&c, &url, &[("range", "bytes=10-19")]).await;
        assert_eq!(g.status, 206);
        assert_eq!(g.header("content-range"), Some("bytes 10-19/268435456"));
        assert_eq!(g.body, pattern(10, 19));
        let pulled = produced.load(std::sync::atomic::Ordering::SeqCst);
        assert!(pulled < 48 << 20, "{pulled} bytes pulled");
        // If-Range that does not match: the whole representation, as a 200.
        let g = get_part(
            &c,
            &url,
            &[("range", "bytes=10-19"), ("if-range", "\"old\"")],
        )
        .await;
        assert_eq!(g.status, 200);
        assert_eq!(g.header("content-length"), Some("268435456"));
        // Past the end: 416.
        let g = get_part(&c, &url, &[("range", &format!("bytes={LEN}-"))]).await;
        assert_eq!(g.status, 416);
        assert_eq!(g.header("content-range"), Some("bytes */268435456"));
        // An origin that says it takes no ranges is not asked again: one request, cut.
        let before = origin.hits();
        let g = get_part(&c, &format!("{base}/says-none"), &[("range", "bytes=5-6")]).await;
        assert_eq!(g.status, 206);
        assert_eq!(g.body, pattern(5, 6));
        assert_eq!(origin.hits(), before + 1);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_206_from_the_origin_is_passed_through_and_not_stored() {
        let (origin, _l, c, base) = setup("", |_, _| {
            Reply::ok("abc")
                .status(206)
                .header("content-range", "bytes 0-2/10")
                .header("cache-control", "max-age=60")
        })
        .await;
        let url = format!("{base}/p");
        let g = get(&c, &url, &[]).await;
        assert_eq!(g.status, 206);
        assert_eq!(g.body, "abc");
        get(&c, &url, &[]).await;
        assert_eq!(origin.hits(), 2);
    }
}
