//! Edge rules (docs/rules.md, "Edge"; issue #41 items 5 and 6), through a real larder in front
//! of a real origin and, for switches, its admin listener: request ids (made, kept from a
//! trusted client, returned on every answer, sent upstream, logged), CORS (preflights answered,
//! actual requests' fields, a cached answer served to two origins), rewrites, prefix strips and
//! an upstream with a path prefix, redirects with captures, fixed answers with fields behind a
//! switch of the admin API (kept across a reload), custom error pages for the origin's errors
//! and larder's own; and examples/edge.toml as it ships.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

/// An origin that answers `METHOD PATH?QUERY` and the request id it was sent; `/missing`
/// is a 404, every answer cacheable for a minute, with a CORS field of its own.
async fn echo() -> Origin {
    Origin::start(|req, _| {
        let mut body = format!("{} {}", req.method, req.path);
        if let Some(v) = req.headers.get("x-request-id") {
            body.push_str(&format!("\nx-request-id: {}", v.to_str().unwrap()));
        }
        let reply = Reply::ok(body)
            .header("cache-control", "max-age=60")
            .header("access-control-allow-origin", "*");
        if req.path.starts_with("/missing") {
            reply.status(404)
        } else {
            reply
        }
    })
    .await
}

/// The lines of `path` once it has at least `n` (the access log's writer is a thread of its
/// own; waits up to 5 s).
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

/// A UUIDv7 in its hyphenated form.
fn is_uuid_v7(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.iter().map(|g| g.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12]
        && s.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit())
        && groups[2].starts_with('7')
}

#[tokio::test(flavor = "multi_thread")]
async fn request_ids_are_made_or_kept_returned_on_every_answer_sent_upstream_and_logged() {
    let origin = echo().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let larder = Larder::start(&format!(
        r#"
[access_log]
path = {log:?}
format = "{{request_id}} {{status}} {{uri}}"

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/trusted/"
  proxy = {{ upstream = "{origin}" }}
    [[listener.route.rule]]
    request_id = {{ trust = ["127.0.0.0/8"] }}
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = "{origin}" }}
    # Before the request_id rule: its 403 still carries the id (request_id runs first).
    [[listener.route.rule]]
    when = {{ path = "/internal/**" }}
    allow = ["10.0.0.0/8"]
    [[listener.route.rule]]
    response_headers = {{ set = {{ "x-seen-id" = "$request_id" }} }}
    [[listener.route.rule]]
    request_id = {{ header = "x-request-id", trust = ["10.0.0.0/8"] }}
"#,
        log = log.display().to_string(),
        origin = origin.url()
    ))
    .await;
    let c = client();

    // Made: a UUIDv7, returned, sent upstream, and `$request_id` for other rules.
    let a = get(&c, &larder.url("/a"), &[]).await;
    assert_eq!(a.status, 200);
    let id_a = a.header("x-request-id").expect("an id").to_string();
    assert!(is_uuid_v7(&id_a), "{id_a}");
    assert!(
        a.text().contains(&format!("x-request-id: {id_a}")),
        "{}",
        a.text()
    );
    assert_eq!(a.header("x-seen-id"), Some(id_a.as_str()));

    // A client outside the trusted networks has its id replaced; each request gets its own.
    let b = get(&c, &larder.url("/b"), &[("x-request-id", "client-made-1")]).await;
    let id_b = b.header("x-request-id").unwrap().to_string();
    assert!(is_uuid_v7(&id_b) && id_b != id_a, "{id_b}");
    assert!(!b.text().contains("client-made-1"), "{}", b.text());

    // Another rule's answer at ① carries the id too.
    let denied = get(&c, &larder.url("/internal/x"), &[]).await;
    assert_eq!(denied.status, 403);
    let id_denied = denied
        .header("x-request-id")
        .expect("an id on a 403")
        .to_string();
    assert!(is_uuid_v7(&id_denied));

    // A trusted client's sane id is kept; one too long (or with a space) is replaced.
    let kept = get(
        &c,
        &larder.url("/trusted/k"),
        &[("x-request-id", "edge-7f3a.b_9")],
    )
    .await;
    assert_eq!(kept.header("x-request-id"), Some("edge-7f3a.b_9"));
    assert!(kept.text().contains("x-request-id: edge-7f3a.b_9"));
    let long = "x".repeat(129);
    let replaced = get(&c, &larder.url("/trusted/l"), &[("x-request-id", &long)]).await;
    assert!(is_uuid_v7(replaced.header("x-request-id").unwrap()));
    let spaced = get(&c, &larder.url("/trusted/s"), &[("x-request-id", "a b")]).await;
    assert!(is_uuid_v7(spaced.header("x-request-id").unwrap()));

    // Written in the access log, each with its request.
    let l = lines(&log, 6).await;
    for (id, line) in [
        (&id_a, "200 /a"),
        (&id_b, "200 /b"),
        (&id_denied, "403 /internal/x"),
    ] {
        let want = format!("{id} {line}");
        assert!(l.contains(&want), "{want} in {l:?}");
    }
    assert!(
        l.contains(&"edge-7f3a.b_9 200 /trusted/k".to_string()),
        "{l:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cors_preflights_are_answered_and_actual_requests_get_the_fields() {
    let origin = echo().await;
    let larder = Larder::start(&format!(
        r#"
[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  proxy = {{ upstream = "{origin}" }}
    [[listener.route.rule]]
    cors = {{ origins = ["https://app.example", "https://other.example"], methods = ["GET", "POST", "PUT"], headers = ["content-type", "authorization"], expose = ["x-total"], credentials = true, max_age = "10m" }}
"#,
        origin = origin.url()
    ))
    .await;
    let c = client();
    let preflight = |origin: &'static str, method: &'static str, headers: &'static str| {
        let c = c.clone();
        let url = larder.url("/api/items");
        async move {
            let mut h = vec![
                ("origin", origin),
                ("access-control-request-method", method),
            ];
            if !headers.is_empty() {
                h.push(("access-control-request-headers", headers));
            }
            send(&c, "OPTIONS", &url, &h, b"").await
        }
    };

    // An allowed preflight: 204 with every field, answered by larder alone.
    let p = preflight("https://app.example", "PUT", "content-type, Authorization").await;
    assert_eq!(p.status, 204);
    assert_eq!(
        p.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(
        p.header("access-control-allow-methods"),
        Some("GET, POST, PUT")
    );
    assert_eq!(
        p.header("access-control-allow-headers"),
        Some("content-type, authorization")
    );
    assert_eq!(p.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(p.header("access-control-max-age"), Some("600"));
    assert_eq!(p.header("vary"), Some("Origin"));
    assert!(p.body.is_empty());
    assert_eq!(origin.hits(), 0, "a preflight never reaches the origin");

    // Refused: another origin, a method or a header not allowed: 403 without any allow field.
    for (o, m, h) in [
        ("https://evil.example", "GET", ""),
        ("https://app.example", "DELETE", ""),
        ("https://app.example", "POST", "x-other"),
    ] {
        let p = preflight(o, m, h).await;
        assert_eq!(p.status, 403, "{o} {m} {h}");
        assert_eq!(p.header("access-control-allow-origin"), None);
        assert_eq!(p.header("access-control-allow-methods"), None);
    }
    assert_eq!(origin.hits(), 0);

    // An actual request from an allowed origin: its origin echoed (never `*` with
    // credentials), Vary: Origin appended.
    let r = get(
        &c,
        &larder.url("/api/items"),
        &[("origin", "https://app.example")],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(r.header("access-control-expose-headers"), Some("x-total"));
    let vary: Vec<&str> = r
        .headers
        .get_all("vary")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert!(vary.iter().any(|v| v.contains("Origin")), "{vary:?}");

    // The same stored answer to the other allowed origin: its own origin, not the first's.
    let r = get(
        &c,
        &larder.url("/api/items"),
        &[("origin", "https://other.example")],
    )
    .await;
    assert_eq!(r.cache(), "HIT");
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://other.example")
    );
    assert_eq!(origin.hits(), 1);

    // A disallowed origin, or none: no allow fields (the origin's own `*` removed), Vary still.
    for h in [&[("origin", "https://evil.example")][..], &[]] {
        let r = get(&c, &larder.url("/api/items"), h).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("access-control-allow-origin"), None, "{h:?}");
        assert_eq!(r.header("access-control-allow-credentials"), None);
        let vary: Vec<&str> = r
            .headers
            .get_all("vary")
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert!(vary.iter().any(|v| v.contains("Origin")), "{vary:?}");
    }

    // A plain OPTIONS (no Access-Control-Request-Method) is no preflight: the origin answers.
    let r = send(
        &c,
        "OPTIONS",
        &larder.url("/api/x"),
        &[("origin", "https://app.example")],
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(origin.hits(), 2);
}

#[test]
fn cors_any_origin_with_credentials_is_a_config_error() {
    let e = larder::config::Config::parse(
        r#"
[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  respond = { status = 200 }
    [[listener.route.rule]]
    cors = { origins = "*", credentials = true }
"#,
        "test",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("line 7") && e.contains("credentials"), "{e}");
    let e = larder::config::Config::parse(
        "[[listener]]\naddr = \"127.0.0.1:0\"\n[[listener.route]]\nrespond = {}\n\
         [[listener.route.rule]]\ncors = { origins = [\"https://app.example/path\"] }\n",
        "test",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("line 6") && e.contains("not an origin"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn rewrites_prefix_strips_and_an_upstream_path_prefix_change_what_the_origin_is_asked() {
    let origin = echo().await;
    let o = origin.url();
    let larder = Larder::start(&format!(
        r#"
[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = "{o}" }}
    [[listener.route.rule]]
    when = {{ path_regex = "^/v1/(.*)$" }}
    rewrite = {{ to = "/v2/$1" }}
    [[listener.route.rule]]
    when = {{ path = "/search/*" }}
    rewrite = {{ to = "/find?q=$1", query = "drop" }}
  [[listener.route]]
  path = "/api/"
  proxy = {{ upstream = "{o}" }}
    [[listener.route.rule]]
    strip_prefix = "/api"
  [[listener.route]]
  path = "/svc/"
  proxy = {{ upstream = "{o}/backend/" }}
    [[listener.route.rule]]
    strip_prefix = "/svc/"
  [[listener.route]]
  path = "/p/"
  proxy = {{ upstream = "{o}/up" }}
"#
    ))
    .await;
    let c = client();
    let asked = |r: &Got| r.text().lines().next().unwrap_or("").to_string();

    // A regex rewrite with its capture, the query kept.
    let r = get(&c, &larder.url("/v1/items?x=1"), &[]).await;
    assert_eq!(asked(&r), "GET /v2/items?x=1");
    // The cache key follows the rewritten URI: /v2/items?x=1 is now stored.
    let r = get(&c, &larder.url("/v2/items?x=1"), &[]).await;
    assert_eq!(
        (r.cache(), asked(&r).as_str()),
        ("HIT", "GET /v2/items?x=1")
    );
    assert_eq!(origin.hits(), 1);

    // A target with its own query; the request's dropped.
    let r = get(&c, &larder.url("/search/shoes?page=2"), &[]).await;
    assert_eq!(asked(&r), "GET /find?q=shoes");

    // Prefix strips: whole segments only, the query kept.
    assert_eq!(
        asked(&get(&c, &larder.url("/api/users?id=3"), &[]).await),
        "GET /users?id=3"
    );
    assert_eq!(asked(&get(&c, &larder.url("/api/"), &[]).await), "GET /");

    // An upstream with a path prefix: it goes before the (stripped) path.
    assert_eq!(
        asked(&get(&c, &larder.url("/svc/x?q=1"), &[]).await),
        "GET /backend/x?q=1"
    );
    // Without a trailing `/` the same: one `/` between prefix and path.
    assert_eq!(
        asked(&get(&c, &larder.url("/p/z"), &[]).await),
        "GET /up/p/z"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn redirects_render_captures_keep_or_drop_the_query_and_never_send_a_bad_location() {
    let origin = echo().await;
    let larder = Larder::start(&format!(
        r#"
[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  proxy = {{ upstream = "{origin}" }}
    [[listener.route.rule]]
    when = {{ path = "/old/**" }}
    redirect = {{ to = "/new/$1" }}
    [[listener.route.rule]]
    when = {{ path = "/go/*" }}
    redirect = {{ to = "https://other.example$request_uri", status = 308 }}
    [[listener.route.rule]]
    when = {{ path_regex = "^/drop/(?<what>[^/]+)$" }}
    redirect = {{ to = "/kept/${{what}}", status = 302, query = "drop" }}
"#,
        origin = origin.url()
    ))
    .await;
    let c = client();

    let r = get(&c, &larder.url("/old/a/b?x=1"), &[]).await;
    assert_eq!(r.status, 301, "301 by default");
    assert_eq!(r.header("location"), Some("/new/a/b?x=1"));
    // `$request_uri` holds the query: not appended twice.
    let r = get(&c, &larder.url("/go/x?y=2"), &[]).await;
    assert_eq!(r.status, 308);
    assert_eq!(r.header("location"), Some("https://other.example/go/x?y=2"));
    let r = get(&c, &larder.url("/drop/z?y=2"), &[]).await;
    assert_eq!(r.status, 302);
    assert_eq!(r.header("location"), Some("/kept/z"));
    assert_eq!(origin.hits(), 0);

    // A capture of raw UTF-8 in the path: percent-encoded in the Location, as a URI wants.
    let r = raw_request(larder.addr, "GET", "/old/caf\u{e9}", &[]).await;
    assert_eq!(r.status, 301, "{}", r.head);
    assert_eq!(r.header("location"), Some("/new/caf%C3%A9"), "{}", r.head);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_maintenance_answer_follows_its_switch_through_the_admin_api_and_a_reload() {
    let origin = echo().await;
    let config = |extra: &str| {
        format!(
            r#"
[admin]
token = "s3cret"
listen = "127.0.0.1:0"

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  proxy = {{ upstream = "{origin}" }}
    {extra}
    [[listener.route.rule]]
    respond = {{ status = 503, body = "back soon\n", content_type = "text/html", headers = {{ "retry-after" = "120" }}, switch = "maintenance" }}
"#,
            origin = origin.url()
        )
    };
    let larder = Larder::start(&config("")).await;
    let c = client();
    let token = [("authorization", "Bearer s3cret")];
    let switch = larder.admin_url("/_larder/switches/maintenance");

    assert_eq!(get(&c, &larder.url("/page"), &[]).await.status, 200);
    let list = get(&c, &larder.admin_url("/_larder/switches"), &token).await;
    assert_eq!(list.text(), r#"{"maintenance":false}"#);

    // Without the token: refused, and the switch stays off.
    assert_eq!(send(&c, "PUT", &switch, &[], b"").await.status, 401);
    assert_eq!(get(&c, &larder.url("/page"), &[]).await.status, 200);

    let on = send(&c, "PUT", &switch, &token, b"").await;
    assert_eq!(
        (on.status.as_u16(), on.text().as_str()),
        (200, r#"{"on":true,"switch":"maintenance"}"#)
    );
    let r = get(&c, &larder.url("/page"), &[]).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.text(), "back soon\n");
    assert_eq!(r.header("retry-after"), Some("120"));
    assert_eq!(r.header("content-type"), Some("text/html"));

    // A reload (rules compiled again) keeps the switch on.
    larder
        .reload(&config(
            "[[listener.route.rule]]\n    response_headers = { set = { \"x-v\" = \"2\" } }",
        ))
        .expect("reloads");
    let r = get(&c, &larder.url("/page"), &[]).await;
    assert_eq!((r.status.as_u16(), r.header("x-v")), (503, Some("2")));
    let list = get(&c, &larder.admin_url("/_larder/switches"), &token).await;
    assert_eq!(list.text(), r#"{"maintenance":true}"#);

    assert_eq!(send(&c, "DELETE", &switch, &token, b"").await.status, 200);
    assert_eq!(get(&c, &larder.url("/page"), &[]).await.status, 200);
    let bad = send(
        &c,
        "PUT",
        &larder.admin_url("/_larder/switches/no%20way"),
        &token,
        b"",
    )
    .await;
    assert_eq!(bad.status, 400);

    // A route's own `respond` has no switch: a config error naming it.
    let e = larder::config::Config::parse(
        "[[listener]]\naddr = \"127.0.0.1:0\"\n[[listener.route]]\nrespond = { switch = \"m\" }\n",
        "test",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("line 4") && e.contains("switch"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn error_pages_replace_the_origins_errors_and_larders_own() {
    let origin = echo().await;
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("50x.html");
    std::fs::write(&page, "<h1>we are on it</h1>\n").unwrap();
    let dead = free_port();
    let larder = Larder::start(&format!(
        r#"
[[policy.pages]]
error_page = {{ status = [404, 403], body = "<h1>not here</h1>\n" }}
[[policy.pages]]
error_page = {{ status = [502, 503, 504], file = {page:?} }}

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = "{origin}" }}
    [[listener.route.rule]]
    when = {{ path = "/internal/**" }}
    allow = ["10.0.0.0/8"]
    [[listener.route.rule]]
    use = "pages"
  [[listener.route]]
  path = "/down/"
  proxy = {{ upstream = "http://{dead}" }}
    [[listener.route.rule]]
    use = "pages"
"#,
        page = page.display().to_string(),
        origin = origin.url()
    ))
    .await;
    let c = client();

    // The origin's 404: its body replaced, its status kept.
    let r = get(&c, &larder.url("/missing"), &[]).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.text(), "<h1>not here</h1>\n");
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert_eq!(r.header("content-length"), Some("18"));
    // HEAD: the page's fields, no body.
    let r = send(&c, "HEAD", &larder.url("/missing"), &[], b"").await;
    assert_eq!(
        (r.status.as_u16(), r.header("content-length")),
        (404, Some("18"))
    );
    assert!(r.body.is_empty());
    // Another rule's answer (a 403 at ①, before the error_page rules in the list).
    let r = get(&c, &larder.url("/internal/x"), &[]).await;
    assert_eq!(
        (r.status.as_u16(), r.text().as_str()),
        (403, "<h1>not here</h1>\n")
    );
    // Larder's own 502 (the origin is down), from the file.
    let r = get(&c, &larder.url("/down/x"), &[]).await;
    assert_eq!(r.status, 502);
    assert_eq!(r.text(), "<h1>we are on it</h1>\n");
    // Other statuses untouched.
    let r = get(&c, &larder.url("/fine"), &[]).await;
    assert_eq!((r.status.as_u16(), r.text().as_str()), (200, "GET /fine"));

    // A missing file is an error naming the key and its line.
    let e = larder::config::Config::parse(
        "[[listener]]\naddr = \"127.0.0.1:0\"\n[[listener.route]]\nrespond = {}\n\
         [[listener.route.rule]]\nerror_page = { status = 404, file = \"/nonexistent/404.html\" }\n",
        "test",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("line 6") && e.contains("error_page") && e.contains("/nonexistent/404.html"),
        "{e}"
    );
}

/// examples/edge.toml as it ships (its addresses moved to free ports): the parts of issue #41
/// it shows that are in place.
#[tokio::test(flavor = "multi_thread")]
async fn the_edge_example_redirects_ids_denies_and_answers_preflights() {
    let origin = echo().await;
    let text = std::fs::read_to_string("examples/edge.toml").unwrap();
    assert!(text.contains("127.0.0.1:8480") && text.contains("127.0.0.1:8481"));
    let text = (text.replace("127.0.0.1:8480", "127.0.0.1:0"))
        .replace("http://127.0.0.1:8481", &origin.url());
    let larder = Larder::start(&text).await;
    let c = client();

    let r = get(&c, &larder.url("/old/a/b"), &[]).await;
    assert_eq!(
        (r.status.as_u16(), r.header("location")),
        (301, Some("/new/a/b"))
    );
    assert!(r.header("x-request-id").is_some_and(is_uuid_v7));

    let r = get(&c, &larder.url("/internal/x"), &[]).await;
    assert_eq!(r.status, 403);
    assert!(r.header("x-request-id").is_some_and(is_uuid_v7));

    let r = send(
        &c,
        "OPTIONS",
        &larder.url("/api/items"),
        &[
            ("origin", "https://app.example"),
            ("access-control-request-method", "GET"),
        ],
        b"",
    )
    .await;
    assert_eq!(r.status, 204);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert!(r.header("x-request-id").is_some_and(is_uuid_v7));

    let r = get(
        &c,
        &larder.url("/api/items"),
        &[("origin", "https://app.example")],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    let r = get(&c, &larder.url("/"), &[]).await;
    assert_eq!(r.status, 200);
    assert!(r.header("x-request-id").is_some_and(is_uuid_v7));
}

/// The request's id is an attribute of its span (`larder.request_id`), as a collector of OTLP
/// receives it.
#[tokio::test(flavor = "multi_thread")]
async fn the_request_id_is_an_attribute_of_the_span() {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use prost::Message;

    let collector = Origin::start(|_, _| Reply::ok("")).await;
    let origin = echo().await;
    let larder = Larder::start(&format!(
        r#"
[tracing]
otlp_endpoint = "{collector}"
sample = 1.0
flush_interval = "100ms"

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  proxy = {{ upstream = "{origin}" }}
    [[listener.route.rule]]
    request_id = {{}}
"#,
        collector = collector.url(),
        origin = origin.url()
    ))
    .await;
    let r = get(&client(), &larder.url("/traced"), &[]).await;
    let id = r.header("x-request-id").expect("an id").to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    let found = loop {
        let ids: Vec<String> = (collector.seen().iter())
            .filter_map(|s| ExportTraceServiceRequest::decode(s.body.as_ref()).ok())
            .flat_map(|req| req.resource_spans)
            .flat_map(|rs| rs.scope_spans)
            .flat_map(|ss| ss.spans)
            .flat_map(|span| span.attributes)
            .filter(|a| a.key == "larder.request_id")
            .filter_map(|a| match a.value?.value? {
                Value::StringValue(s) => Some(s),
                _ => None,
            })
            .collect();
        if !ids.is_empty() || Instant::now() > deadline {
            break ids;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(found, vec![id]);
}
