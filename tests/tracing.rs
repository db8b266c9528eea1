//! Request spans exported to OpenTelemetry: a collector written here receives OTLP/HTTP
//! (protobuf, decoded with the OTLP messages of opentelemetry-proto) from a real larder.
//! Each request gets a server span with the cache decision among its attributes; a request
//! carrying a sampled `traceparent` joins that trace, and what larder sends upstream carries
//! larder's own span as the parent; an unsampled `traceparent` is followed (no span); with
//! `sample = 0`, requests without one make no span.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, Span};
use prost::Message;

/// The spans a collector received, with their resource's `service.name`.
fn received(collector: &Origin) -> Vec<(String, Span)> {
    let mut spans = Vec::new();
    for seen in collector.seen() {
        assert_eq!(seen.path, "/v1/traces");
        assert_eq!(
            seen.headers["content-type"], "application/x-protobuf",
            "{seen:?}"
        );
        assert_eq!(seen.headers["x-api-key"], "k3y");
        let req = ExportTraceServiceRequest::decode(seen.body.as_ref()).expect("OTLP protobuf");
        for rs in req.resource_spans {
            let service = (rs.resource.iter())
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                spans.extend(ss.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
    }
    spans
}

/// A span's attributes, as text.
fn attributes(span: &Span) -> HashMap<String, String> {
    span.attributes
        .iter()
        .map(|a| {
            let v = match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                other => format!("{other:?}"),
            };
            (a.key.clone(), v)
        })
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

async fn wait_for_spans(collector: &Origin, n: usize) -> Vec<(String, Span)> {
    for _ in 0..100 {
        let spans = received(collector);
        if spans.len() >= n {
            return spans;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} spans received, {n} expected", received(collector).len());
}

fn config(collector: &Origin, app: &Origin, sample: &str) -> String {
    format!(
        r#"
[tracing]
otlp_endpoint = "{}"
service_name = "larder-test"
sample = {sample}
flush_interval = "100ms"
headers = {{ "x-api-key" = "k3y" }}

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/app/"
  proxy = {{ upstream = "{}" }}
"#,
        collector.url(),
        app.url()
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn each_request_is_a_span_that_joins_its_callers_trace() {
    let collector = Origin::start(|_, _| Reply::ok("")).await;
    let app = Origin::start(|seen, _| {
        if seen.path.ends_with("/broken") {
            return Reply::ok("down").status(503);
        }
        Reply::ok("hello").header("cache-control", "max-age=60")
    })
    .await;
    let larder = Larder::start(&config(&collector, &app, "1.0")).await;
    let c = client();
    assert_eq!(get(&c, &larder.url("/app/a"), &[]).await.cache(), "MISS");
    assert_eq!(get(&c, &larder.url("/app/a"), &[]).await.cache(), "HIT");
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let traceparent = format!("00-{caller_trace}-{caller_span}-01");
    let joined = get(
        &c,
        &larder.url("/app/b"),
        &[("traceparent", &traceparent), ("user-agent", "tester/1")],
    )
    .await;
    assert_eq!(joined.status, 200);
    assert_eq!(get(&c, &larder.url("/app/broken"), &[]).await.status, 503);

    let spans = wait_for_spans(&collector, 4).await;
    assert_eq!(spans.len(), 4, "{spans:?}");
    let by_path = |p: &str| -> Vec<&Span> {
        (spans.iter())
            .filter(|(_, s)| attributes(s).get("url.path").map(String::as_str) == Some(p))
            .map(|(_, s)| s)
            .collect()
    };
    for (service, s) in &spans {
        assert_eq!(service, "larder-test");
        assert_eq!(s.kind, SpanKind::Server as i32);
        assert_eq!(s.name, "GET /app/", "{s:?}");
        let a = attributes(s);
        assert_eq!(a["http.request.method"], "GET");
        assert_eq!(a["http.route"], "/app/");
        assert!(a["larder.route"].ends_with(" */app/"), "{a:?}");
        assert!(s.end_time_unix_nano >= s.start_time_unix_nano);
    }
    let a = by_path("/app/a");
    let caches: Vec<String> = a
        .iter()
        .map(|s| attributes(s)["larder.cache"].clone())
        .collect();
    assert_eq!(caches, ["MISS", "HIT"], "{a:?}");
    assert_eq!(attributes(a[1])["http.response.status_code"], "200");
    assert_eq!(attributes(a[1])["http.response.body.size"], "5");
    let broken = attributes(by_path("/app/broken")[0]);
    assert_eq!(broken["http.response.status_code"], "503");
    assert_eq!(
        by_path("/app/broken")[0].status.as_ref().map(|s| s.code),
        Some(2),
        "a 5xx is an error"
    );

    // The caller's trace: larder's span is its child, and the origin's request names
    // larder's span as its parent.
    let b = by_path("/app/b")[0];
    assert_eq!(hex(&b.trace_id), caller_trace);
    assert_eq!(hex(&b.parent_span_id), caller_span);
    assert_eq!(attributes(b)["user_agent.original"], "tester/1");
    let upstream: HashMap<String, String> = (app.seen().iter())
        .map(|s| {
            let tp = s
                .headers
                .get("traceparent")
                .map(|v| v.to_str().unwrap().to_string());
            (s.path.clone(), tp.unwrap_or_default())
        })
        .collect();
    assert_eq!(
        upstream["/app/b"],
        format!("00-{caller_trace}-{}-01", hex(&b.span_id))
    );
    // A trace larder started: the miss's fetch carries the miss's span.
    let miss = a[0];
    assert!(miss.parent_span_id.is_empty());
    assert_eq!(
        upstream["/app/a"],
        format!("00-{}-{}-01", hex(&miss.trace_id), hex(&miss.span_id))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sampling_follows_the_callers_decision_and_the_ratio() {
    let collector = Origin::start(|_, _| Reply::ok("")).await;
    let app = Origin::start(|_, _| Reply::ok("hello").header("cache-control", "no-store")).await;
    let larder = Larder::start(&config(&collector, &app, "0")).await;
    let c = client();
    let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    get(&c, &larder.url("/app/none"), &[]).await;
    get(&c, &larder.url("/app/no"), &[("traceparent", unsampled)]).await;
    let sampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    get(&c, &larder.url("/app/yes"), &[("traceparent", sampled)]).await;
    let spans = wait_for_spans(&collector, 1).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let spans = if received(&collector).len() > spans.len() {
        received(&collector)
    } else {
        spans
    };
    let paths: Vec<String> = spans
        .iter()
        .map(|(_, s)| attributes(s)["url.path"].clone())
        .collect();
    assert_eq!(paths, ["/app/yes"]);
    // Unsampled: the caller's header goes upstream as it came.
    let seen = app.seen();
    let no = seen.iter().find(|s| s.path == "/app/no").unwrap();
    assert_eq!(no.headers["traceparent"], unsampled);
    let none = seen.iter().find(|s| s.path == "/app/none").unwrap();
    assert!(none.headers.get("traceparent").is_none());
}
