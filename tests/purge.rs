//! Purge: the PURGE method on proxy routes and the admin API (by URL, prefix and tag), with the
//! access rules (token, allowed addresses), against a real origin over real sockets.

mod common;

use common::*;

fn config(admin: &str) -> String {
    format!("[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"s3cret\"\n{admin}\n{PROXY}")
}

async fn setup(admin: &str) -> (Origin, Larder, Client, String, String) {
    let origin = Origin::start(|seen, n| {
        let lang = seen
            .headers
            .get("accept-language")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let tags = if seen.path.starts_with("/products/") {
            "product all"
        } else {
            "all"
        };
        Reply::ok(format!("{} {lang} {n}", seen.path))
            .header("cache-control", "max-age=600")
            .header("vary", "Accept-Language")
            .header("surrogate-key", tags)
    })
    .await;
    let larder = larder(&config(admin), &origin.url()).await;
    let base = larder.url("");
    let admin = larder.admin_url("");
    (origin, larder, client(), base, admin)
}

async fn warm(c: &Client, url: &str) {
    for lang in ["en", "fr"] {
        get(c, url, &[("accept-language", lang)]).await;
        assert_eq!(
            get(c, url, &[("accept-language", lang)]).await.cache(),
            "HIT"
        );
    }
}

/// PURGE with the admin token.
async fn purge_with_token(c: &Client, url: &str) -> Got {
    send(c, "PURGE", url, &[("authorization", "Bearer s3cret")], b"").await
}

async fn is_cached(c: &Client, url: &str, lang: &str) -> bool {
    // only-if-cached answers 504 instead of fetching, so probing does not refill.
    get(
        c,
        url,
        &[
            ("accept-language", lang),
            ("cache-control", "only-if-cached"),
        ],
    )
    .await
    .status
        == 200
}

#[tokio::test(flavor = "multi_thread")]
async fn purge_method_needs_token_or_allowed_address() {
    let (_o, _l, c, base, _) = setup("").await;
    let url = format!("{base}/page");
    warm(&c, &url).await;
    let denied = send(&c, "PURGE", &url, &[], b"").await;
    assert_eq!(denied.status, 403);
    assert!(is_cached(&c, &url, "en").await);
    let ok = purge_with_token(&c, &url).await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.body, "{\"purged\":1}");
    // Every variant of the URL is gone.
    assert!(!is_cached(&c, &url, "en").await);
    assert!(!is_cached(&c, &url, "fr").await);
    let again = purge_with_token(&c, &url).await;
    assert_eq!(again.status, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn purge_method_from_an_allowed_address() {
    let (_o, _l, c, base, _) = setup("purge_allow = [\"127.0.0.0/8\"]").await;
    let url = format!("{base}/page");
    warm(&c, &url).await;
    assert_eq!(send(&c, "PURGE", &url, &[], b"").await.status, 200);
    assert!(!is_cached(&c, &url, "en").await);
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_api_requires_the_token() {
    let (_o, _l, c, _base, admin) = setup("").await;
    let g = get(&c, &format!("{admin}/_larder/status"), &[]).await;
    assert_eq!(g.status, 401);
    let g = get(
        &c,
        &format!("{admin}/_larder/status"),
        &[("authorization", "Bearer wrong")],
    )
    .await;
    assert_eq!(g.status, 401);
    let g = get(
        &c,
        &format!("{admin}/_larder/status"),
        &[("authorization", "Bearer s3cret")],
    )
    .await;
    assert_eq!(g.status, 200);
    assert!(String::from_utf8_lossy(&g.body).contains("\"urls\":0"));
    // RFC 9110 §11.1: the scheme's name is case-insensitive.
    for scheme in ["bearer", "BEARER"] {
        let auth = format!("{scheme} s3cret");
        let g = get(
            &c,
            &format!("{admin}/_larder/status"),
            &[("authorization", &auth)],
        )
        .await;
        assert_eq!(g.status, 200, "{scheme}");
    }
}

/// The dashboard's page may not be framed by another site (clickjacking): CSP
/// `frame-ancestors 'none'`, and X-Frame-Options for older browsers.
#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_refuses_to_be_framed() {
    let (_o, _l, c, _base, admin) = setup("").await;
    for path in ["/", "/_larder/dashboard"] {
        let g = get(&c, &format!("{admin}{path}"), &[]).await;
        assert_eq!(g.status, 200, "{path}");
        let csp = g.header("content-security-policy").unwrap_or_default();
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert_eq!(g.header("x-frame-options"), Some("DENY"), "{path}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_purge_by_url_prefix_and_tag() {
    let (_o, larder, c, base, admin) = setup("").await;
    let host = larder.addr;
    let urls: Vec<String> = ["/products/1", "/products/2", "/about", "/blog/x"]
        .iter()
        .map(|p| format!("{base}{p}"))
        .collect();
    for u in &urls {
        warm(&c, u).await;
    }
    let auth = [("authorization", "Bearer s3cret")];
    let post = |q: String| {
        let c = c.clone();
        let admin = admin.clone();
        async move {
            send(
                &c,
                "POST",
                &format!("{admin}/_larder/purge?{q}"),
                &auth,
                b"",
            )
            .await
        }
    };
    // By URL.
    let r = post(format!("url=http://{host}/about")).await;
    assert_eq!(
        (r.status.as_u16(), &r.body[..]),
        (200, &b"{\"purged\":1}"[..])
    );
    assert!(!is_cached(&c, &urls[2], "en").await);
    assert!(is_cached(&c, &urls[3], "en").await);
    // By tag: both products, with all their variants.
    let r = post("tag=product".into()).await;
    assert_eq!(r.body, "{\"purged\":2}");
    for u in &urls[..2] {
        assert!(!is_cached(&c, u, "en").await && !is_cached(&c, u, "fr").await);
    }
    assert!(is_cached(&c, &urls[3], "fr").await);
    // By prefix.
    let r = post(format!("prefix=http://{host}/blog/")).await;
    assert_eq!(r.body, "{\"purged\":1}");
    assert!(!is_cached(&c, &urls[3], "en").await);
    // Tags are larder's business: never sent on.
    let g = get(&c, &urls[0], &[]).await;
    assert_eq!(g.header("surrogate-key"), None);
    // Bad requests.
    assert_eq!(post("nothing=1".into()).await.status, 400);
    assert_eq!(post("url=/relative".into()).await.status, 400);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_revalidated_entry_keeps_its_tags() {
    // Every request revalidates (no-cache); the origin answers 304 to a matching validator.
    let origin = Origin::start(|seen, n| {
        if seen.headers.get("if-none-match").is_some() {
            return Reply::ok("").status(304).header("etag", "\"v1\"");
        }
        Reply::ok(format!("body {n}"))
            .header("cache-control", "no-cache")
            .header("etag", "\"v1\"")
            .header("surrogate-key", "rev")
    })
    .await;
    let larder = larder(&config(""), &origin.url()).await;
    let c = client();
    let url = format!("http://{}/rev", larder.addr);
    let first = get(&c, &url, &[]).await;
    assert_eq!((first.status.as_u16(), first.cache()), (200, "MISS"));
    let again = get(&c, &url, &[]).await;
    assert_eq!(again.cache(), "REVALIDATED");
    assert_eq!(again.body, first.body);
    // The refreshed entry answers with larder's stamp, once each.
    assert_eq!(again.header("age"), Some("0"));
    for name in ["age", "x-cache"] {
        assert_eq!(again.headers.get_all(name).iter().count(), 1, "{name}");
    }
    let third = get(&c, &url, &[]).await;
    assert_eq!(third.cache(), "REVALIDATED");
    // ...and is still found by its tag.
    let admin = larder.admin_url("");
    let r = send(
        &c,
        "POST",
        &format!("{admin}/_larder/purge?tag=rev"),
        &[("authorization", "Bearer s3cret")],
        b"",
    )
    .await;
    assert_eq!(r.body, "{\"purged\":1}");
    assert_eq!(get(&c, &url, &[]).await.cache(), "MISS");
}

#[test]
fn admin_listener_without_token_is_a_config_error() {
    let text = format!("[admin]\nlisten = \"127.0.0.1:0\"\n{PROXY}")
        .replace("{origin}", "http://127.0.0.1:1");
    let e = larder::config::Config::parse(&text, "t")
        .unwrap_err()
        .to_string();
    assert!(e.contains("token"), "{e}");
}

/// A configuration built without a file (the command line's quick starts) once left the admin
/// token with `[admin]`: it was handed to the routes only while parsing a file, so a proxy route
/// refused every PURGE. Handlers now get it where they are built.
#[tokio::test(flavor = "multi_thread")]
async fn regression_quick_start_routes_get_the_admin_token() {
    use larder::config::{Config, HandlerConfig, ProxyConfig};
    let origin =
        Origin::start(|_, n| Reply::ok(format!("{n}")).header("cache-control", "max-age=600"))
            .await;
    let upstream = origin.url().parse().expect("origin URL");
    let mut cfg = Config::single_route(
        "127.0.0.1:0".parse().unwrap(),
        HandlerConfig::Proxy(ProxyConfig::new(upstream)),
    );
    cfg.admin.token = Some("s3cret".into());
    let larder = Larder::from_config(cfg).await;
    let c = client();
    let url = larder.url("/page");
    get(&c, &url, &[]).await;
    assert_eq!(get(&c, &url, &[]).await.cache(), "HIT");
    assert_eq!(send(&c, "PURGE", &url, &[], b"").await.status, 403);
    let ok = purge_with_token(&c, &url).await;
    assert_eq!(ok.status, 200);
    assert_eq!(get(&c, &url, &[]).await.cache(), "MISS");
}

/// `GET /_larder/entries?prefix=`: the URLs under a prefix with each variant's size per
/// encoding, age, time to live and tags.
#[tokio::test(flavor = "multi_thread")]
async fn admin_lists_the_entries_under_a_prefix() {
    let origin = Origin::start(|seen, _| {
        Reply::ok("listed body, listed body, listed body, listed body, listed body".repeat(20))
            .header("cache-control", "max-age=600")
            .header("content-type", "text/plain")
            .header(
                "surrogate-key",
                if seen.path.starts_with("/blog/") {
                    "blog"
                } else {
                    "other"
                },
            )
    })
    .await;
    let larder = larder(&config(""), &origin.url()).await;
    let c = client();
    for p in ["/blog/1", "/blog/2", "/shop/1"] {
        get(&c, &larder.url(p), &[("host", "site.test")]).await;
    }
    wait_for_encoding(&c, &larder.url("/blog/1"), "br").await;
    let auth = [("authorization", "Bearer s3cret")];
    let got = get(
        &c,
        &larder.admin_url("/_larder/entries?prefix=http://site.test/blog/"),
        &auth,
    )
    .await;
    assert_eq!(got.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
    let mut keys: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["key"].as_str().unwrap())
        .collect();
    keys.sort();
    assert_eq!(keys, ["http://site.test/blog/1", "http://site.test/blog/2"]);
    let one = v
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["key"] == "http://site.test/blog/1")
        .unwrap();
    let variant = &one["variants"][0];
    assert_eq!(variant["bytes"]["identity"], 1260);
    assert!(variant["bytes"]["br"].as_u64().unwrap() < 1260, "{variant}");
    assert!(variant["ttl_seconds"].as_u64().unwrap() > 500);
    assert_eq!(variant["tags"][0], "blog");
    let limited = get(
        &c,
        &larder.admin_url("/_larder/entries?prefix=http://site.test/&limit=1"),
        &auth,
    )
    .await;
    let v: serde_json::Value = serde_json::from_slice(&limited.body).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1);
}

/// Lookups per entry, and `GET /_larder/top`: the most looked-up URLs first.
#[tokio::test(flavor = "multi_thread")]
async fn admin_counts_hits_per_entry_and_lists_the_top_keys() {
    let origin = Origin::start(|_, _| Reply::ok("x").header("cache-control", "max-age=600")).await;
    let larder = larder(&config(""), &origin.url()).await;
    let c = client();
    for (path, n) in [("/a", 3), ("/b", 7), ("/c", 1)] {
        for _ in 0..n {
            get(&c, &larder.url(path), &[("host", "site.test")]).await;
        }
    }
    let auth = [("authorization", "Bearer s3cret")];
    let got = get(&c, &larder.admin_url("/_larder/top?limit=2"), &auth).await;
    assert_eq!(got.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
    let top: Vec<(&str, u64)> = (v.as_array().unwrap().iter())
        .map(|t| (t["key"].as_str().unwrap(), t["hits"].as_u64().unwrap()))
        .collect();
    // The first request of each URL was its miss (the fill's own lookups found nothing).
    assert_eq!(top, [("http://site.test/b", 6), ("http://site.test/a", 2)]);
    let got = get(
        &c,
        &larder.admin_url("/_larder/entries?prefix=http://site.test/c"),
        &auth,
    )
    .await;
    let v: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(v[0]["variants"][0]["hits"], 0);
    assert_eq!(
        get(&c, &larder.admin_url("/_larder/top"), &[]).await.status,
        401
    );
}
