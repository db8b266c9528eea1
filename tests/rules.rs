//! Rules (docs/rules.md), through a real larder in front of a real origin: conditions
//! (method, path glob and regex with captures, header, query, cookie, client address),
//! policies used by routes, and each kind of action, as a client and the origin see them.

mod common;

use common::*;

/// An origin that echoes what it was sent in its body: `METHOD PATH` and the headers the
/// test asks about.
async fn echo() -> Origin {
    Origin::start(|req, _| {
        let mut body = format!("{} {}", req.method, req.path);
        for name in ["x-client", "x-route", "x-gone", "x-added"] {
            if let Some(v) = req.headers.get(name) {
                body.push_str(&format!("\n{name}: {}", v.to_str().unwrap()));
            }
        }
        Reply::ok(body)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn conditions_policies_and_the_simple_actions() {
    let origin = echo().await;
    let larder = Larder::start(&format!(
        r#"
[[policy.tagged]]
response_headers = {{ set = {{ "x-policy" = "tagged", "x-path" = "$uri" }} }}

[[policy.office]]
allow = ["10.0.0.0/8"]

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = "{origin}" }}
    [[listener.route.rule]]
    use = "tagged"
    [[listener.route.rule]]
    when = {{ path = "/internal/**" }}
    use = "office"
    [[listener.route.rule]]
    when = {{ client = ["192.0.2.0/24"] }}
    deny = ["0.0.0.0/0"]
    [[listener.route.rule]]
    when = {{ path_regex = "^/v1/(?<rest>.*)$" }}
    request_headers = {{ set = {{ "x-client" = "$remote_addr", "x-route" = "v1:${{rest}}" }}, remove = ["x-gone"], add = {{ "x-added" = "$arg_who" }} }}
    [[listener.route.rule]]
    when = {{ method = ["DELETE"] }}
    respond = {{ status = 405, body = "no deletes here\n" }}
    [[listener.route.rule]]
    name = "maintenance"
    when = {{ cookie = {{ beta = "on" }}, header = {{ "x-mode" = "~^maint" }} }}
    respond = {{ status = 503, body = "back soon\n", content_type = "text/html" }}
"#,
        origin = origin.url()
    ))
    .await;
    let c = client();

    // A policy's response headers on every response, with a variable read at ①.
    let r = get(&c, &larder.url("/a"), &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-policy"), Some("tagged"));
    assert_eq!(r.header("x-path"), Some("/a"));

    // The office policy under a path condition: the test's client (127.0.0.1) is not in it.
    let r = get(&c, &larder.url("/internal/x/y"), &[]).await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.header("x-policy"),
        Some("tagged"),
        "④ runs on ①'s answers too"
    );
    assert_eq!(get(&c, &larder.url("/internalx"), &[]).await.status, 200);

    // Request headers with captures, the client's address and a query parameter; a removed
    // field does not reach the origin.
    let r = get(
        &c,
        &larder.url("/v1/items/7?who=ann"),
        &[("x-gone", "secret"), ("x-client", "forged")],
    )
    .await;
    let body = r.text();
    assert!(body.contains("x-client: 127.0.0.1"), "{body}");
    assert!(body.contains("x-route: v1:items/7"), "{body}");
    assert!(body.contains("x-added: ann"), "{body}");
    assert!(!body.contains("x-gone"), "{body}");

    // Method conditions and fixed answers; the origin is not asked.
    let before = origin.hits();
    let r = send(&c, "DELETE", &larder.url("/a"), &[], b"").await;
    assert_eq!(
        (r.status.as_u16(), r.text().as_str()),
        (405, "no deletes here\n")
    );
    // Both conditions (a cookie and a header regex) must hold.
    let r = get(
        &c,
        &larder.url("/a"),
        &[("cookie", "a=1; beta=on"), ("x-mode", "maintenance")],
    )
    .await;
    assert_eq!(r.status, 503);
    assert_eq!(r.header("content-type"), Some("text/html"));
    let r = get(&c, &larder.url("/a"), &[("cookie", "beta=on")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(origin.hits(), before + 1);
}

#[test]
fn a_bad_rule_is_named_with_its_line() {
    let base =
        "[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\npath = \"/\"\nrespond = {}\n";
    for (rule, says) in [
        ("[[listener.route.rule]]\nuse = \"nope\"\n", "line 7"),
        (
            "[[listener.route.rule]]\nuse = \"nope\"\n",
            "`nope`, which is not defined",
        ),
        (
            "[[listener.route.rule]]\nwhen = { path_regex = \"(\" }\ndeny = []\n",
            "not a valid regular expression",
        ),
        (
            "[[listener.route.rule]]\nwhen = { path_regex = \"(\" }\ndeny = []\n",
            "line 7",
        ),
        (
            "[[listener.route.rule]]\nrequest_headers = { set = { a = \"$nope-x\" } }\n",
            "`$nope` is neither a variable",
        ),
        (
            "[[listener.route.rule]]\nallow = []\ndeny = []\n",
            "exactly one action",
        ),
        (
            "[[listener.route.rule]]\nwhen = { path = \"old/*\" }\ndeny = []\n",
            "starts with `/`",
        ),
    ] {
        let e = larder::config::Config::parse(&format!("{base}{rule}"), "t")
            .expect_err(rule)
            .to_string();
        assert!(e.contains(says), "{rule}: {e}");
    }
    let cyc = format!("[[policy.a]]\nuse = \"b\"\n[[policy.b]]\nuse = \"a\"\n{base}");
    let e = larder::config::Config::parse(&cyc, "t")
        .unwrap_err()
        .to_string();
    assert!(e.contains("uses itself"), "{e}");
}

/// Address rules read the client's real address: behind a trusted proxy, the one its
/// X-Forwarded-For names, not the proxy's.
#[tokio::test(flavor = "multi_thread")]
async fn address_rules_use_the_real_client_address() {
    let origin = echo().await;
    let larder = Larder::start(&format!(
        r#"
[[listener]]
addr = "127.0.0.1:0"
  [listener.real_ip]
  from = ["127.0.0.1"]
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = "{origin}" }}
    [[listener.route.rule]]
    when = {{ path = "/internal/**" }}
    allow = ["10.0.0.0/8"]
    [[listener.route.rule]]
    request_headers = {{ set = {{ "x-client" = "$remote_addr" }} }}
"#,
        origin = origin.url()
    ))
    .await;
    let c = client();
    let inside = [("x-forwarded-for", "198.51.100.1, 10.1.2.3")];
    let r = get(&c, &larder.url("/internal/a"), &inside).await;
    assert_eq!(
        r.status, 200,
        "10.1.2.3 is the client the trusted proxy names"
    );
    assert!(r.text().contains("x-client: 10.1.2.3"), "{}", r.text());
    let outside = [("x-forwarded-for", "10.1.2.3, 198.51.100.1")];
    assert_eq!(
        get(&c, &larder.url("/internal/a"), &outside).await.status,
        403
    );
    assert_eq!(get(&c, &larder.url("/internal/a"), &[]).await.status, 403);
}

/// A rule's answer at ① (a 403, a 429) still gets the response rules written after it whose
/// conditions hold (nginx's `add_header ... always`): their header fields, CORS's allow fields,
/// with the values they read from the request; rules whose conditions do not hold add nothing.
#[tokio::test(flavor = "multi_thread")]
async fn response_rules_after_an_answer_act_on_it() {
    let origin = echo().await;
    let larder = Larder::start(&format!(
        r#"
[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = "{origin}" }}
    [[listener.route.rule]]
    when = {{ path = "/internal/**" }}
    allow = ["10.0.0.0/8"]
    [[listener.route.rule]]
    response_headers = {{ set = {{ "x-frame-options" = "DENY", "x-path" = "$uri" }} }}
    [[listener.route.rule]]
    cors = {{ origins = ["https://app.example"] }}
    [[listener.route.rule]]
    when = {{ path = "/elsewhere/**" }}
    response_headers = {{ set = {{ "x-elsewhere" = "1" }} }}
"#,
        origin = origin.url()
    ))
    .await;
    let c = client();
    let r = get(
        &c,
        &larder.url("/internal/a"),
        &[("origin", "https://app.example")],
    )
    .await;
    assert_eq!(r.status, 403);
    assert_eq!(r.header("x-frame-options"), Some("DENY"));
    assert_eq!(
        r.header("x-path"),
        Some("/internal/a"),
        "read from the request at ①"
    );
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(r.header("x-elsewhere"), None, "its condition does not hold");
    assert_eq!(origin.hits(), 0);
}

/// Every TOML example in docs/rules.md is a configuration larder reads (alone, or as the rules
/// of a route, or as a route of a listener): the reference shows no syntax larder refuses.
#[test]
fn every_example_in_the_rules_reference_parses() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/rules.md")).unwrap();
    let listener = "[[listener]]\naddr = \"127.0.0.1:1\"\n";
    let route = "[[listener.route]]\npath = \"/\"\nproxy = { upstream = \"http://127.0.0.1:1\" }\n";
    let pools = "[pool.blue]\nbackends = [\"http://127.0.0.1:2\"]\n[pool.green]\nbackends = [\"http://127.0.0.1:3\"]\n[pool.shadow]\nbackends = [\"http://127.0.0.1:4\"]\n[cache.shared]\nurl = \"redis://127.0.0.1:1\"\n";
    let mut n = 0;
    for block in doc.split("```toml\n").skip(1) {
        let example = &block[..block.find("```").unwrap()];
        n += 1;
        // The pools and shared tier the examples' splits, mirrors and fleet limits name,
        // unless an example defines its own.
        let pools = if example.contains("[pool.") {
            ""
        } else {
            pools
        };
        let tries = [
            format!("{pools}{example}"),
            format!("{pools}{listener}{example}"),
            format!("{pools}{listener}{route}{example}"),
        ];
        let errors: Vec<String> = tries
            .iter()
            .map(|t| larder::config::Config::parse(t, "docs/rules.md"))
            .filter_map(Result::err)
            .map(|e| e.to_string())
            .collect();
        // An example may name a file of the reader's (an error page): reading it is the one
        // thing that may fail here.
        let file_only = errors.len() == tries.len()
            && (errors.iter()).any(|e| e.contains("No such file or directory"));
        assert!(
            errors.len() < tries.len() || file_only,
            "docs/rules.md example {n}:\n{example}\n{errors:#?}"
        );
    }
    assert!(n >= 10, "{n} examples");
}
