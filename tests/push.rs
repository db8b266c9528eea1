//! Push routes: records written over HTTP (PUT, PATCH, member PUT, DELETE, preconditions),
//! read like cached objects, listed and subscribed to with filters over SSE (init, live events,
//! resume with Last-Event-ID, a gap, heartbeats, a slow subscriber's overflow) and WebSocket;
//! access by token and JWT, CORS, groups, durability across kill -9, and writes the log refuses
//! (a full file system) leaving no trace; two nodes sharing a route through a real redis-server
//! (the fleet ends on the value committed last; a write whose request was cancelled is shared).

mod common;

use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use common::*;

const TOKEN: &str = "s3cret";

fn push_config(dir: &std::path::Path, keys: &str) -> String {
    one_route(
        "",
        "push",
        &format!("dir = \"{}\"\ntoken = \"{TOKEN}\"\n{keys}", dir.display()),
    )
}

async fn push_larder(keys: &str) -> (Larder, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let l = Larder::start(&push_config(dir.path(), keys)).await;
    (l, dir)
}

const AUTH: (&str, &str) = ("authorization", "Bearer s3cret");

async fn put(c: &Client, url: &str, body: &str) -> Got {
    send(c, "PUT", url, &[AUTH], body).await
}

fn json_of(g: &Got) -> Value {
    serde_json::from_slice(&g.body).unwrap_or_else(|_| panic!("JSON: {}", g.text()))
}

/// An SSE stream being read: events as (id, event, data).
struct Sse {
    body: hyper::body::Incoming,
    buf: String,
}

#[derive(Debug, PartialEq)]
struct Ev {
    id: Option<u64>,
    event: String,
    data: String,
}

impl Ev {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap()
    }
}

impl Sse {
    async fn open(c: &Client, url: &str, headers: &[(&str, &str)]) -> Sse {
        let r = request(c, "GET", url, headers, b"").await;
        Sse::of(r, url)
    }

    fn of(r: http::Response<hyper::body::Incoming>, url: &str) -> Sse {
        assert_eq!(r.status(), 200, "{url}");
        assert_eq!(
            r.headers()["content-type"],
            "text/event-stream",
            "subscriptions are event streams"
        );
        Sse {
            body: r.into_body(),
            buf: String::new(),
        }
    }

    /// The next event (comments, `retry:` lines and heartbeats skipped), or None if the stream
    /// ended or nothing came within `wait`.
    async fn next_within(&mut self, wait: Duration) -> Option<Ev> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            while let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut ev = Ev {
                    id: None,
                    event: String::new(),
                    data: String::new(),
                };
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        ev.id = Some(v.parse().unwrap());
                    } else if let Some(v) = line.strip_prefix("event: ") {
                        ev.event = v.to_string();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        ev.data = v.to_string();
                    }
                }
                if !ev.event.is_empty() {
                    return Some(ev);
                }
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .ok()??;
            if let Ok(d) = frame.ok()?.into_data() {
                self.buf.push_str(std::str::from_utf8(&d).unwrap());
            }
        }
    }

    async fn next(&mut self) -> Ev {
        self.next_within(Duration::from_secs(5))
            .await
            .expect("an event within 5 s")
    }

    /// Whether a heartbeat comment comes within `wait`.
    async fn heartbeat_within(&mut self, wait: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if self.buf.contains(":\n\n") {
                return true;
            }
            let Ok(Some(Ok(frame))) = tokio::time::timeout_at(deadline, self.body.frame()).await
            else {
                return false;
            };
            if let Ok(d) = frame.into_data() {
                self.buf.push_str(std::str::from_utf8(&d).unwrap());
            }
        }
    }
}

#[tokio::test]
async fn records_are_written_read_and_conditioned() {
    let (l, _dir) = push_larder("").await;
    let c = client();
    let created = put(&c, &l.url("/cars/1"), r#"{"price": 42, "color": "red"}"#).await;
    assert_eq!(created.status, 201);
    assert_eq!(created.header("location"), Some("/cars/1"));
    let etag1 = created.header("etag").unwrap().to_string();
    let got = get(&c, &l.url("/cars/1"), &[]).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.header("content-type"), Some("application/json"));
    assert_eq!(json_of(&got), json!({"price": 42, "color": "red"}));
    assert_eq!(got.header("etag"), Some(etag1.as_str()));
    let again = get(&c, &l.url("/cars/1"), &[("if-none-match", &etag1)]).await;
    assert_eq!(again.status, 304);

    // Replace, merge-patch, one member.
    let replaced = put(&c, &l.url("/cars/1"), r#"{"price": 40, "color": "red"}"#).await;
    assert_eq!(replaced.status, 200);
    assert_ne!(replaced.header("etag"), Some(etag1.as_str()));
    let patched = send(
        &c,
        "PATCH",
        &l.url("/cars/1"),
        &[AUTH],
        r#"{"price": null, "km": 7}"#,
    )
    .await;
    assert_eq!(patched.status, 200);
    let member = put(&c, &l.url("/cars/1/owner/city"), r#""Oslo""#).await;
    assert_eq!(member.status, 200, "{}", member.text());
    assert_eq!(
        json_of(&get(&c, &l.url("/cars/1"), &[]).await),
        json!({"color": "red", "km": 7, "owner": {"city": "Oslo"}})
    );
    // A member through a scalar is a conflict; nothing changes.
    let conflict = put(&c, &l.url("/cars/1/km/x"), "1").await;
    assert_eq!(conflict.status, 409);
    assert_eq!(
        json_of(&conflict)["error"],
        "cannot set member `km/x` of record `cars/1`: its member `km` is not an object"
    );
    // Through a record that is itself a number: the message names the member path (it
    // named an empty one).
    assert_eq!(put(&c, &l.url("/num"), "1").await.status, 201);
    let conflict = put(&c, &l.url("/num/a/b"), "2").await;
    assert_eq!(conflict.status, 409);
    assert_eq!(
        json_of(&conflict)["error"],
        "cannot set member `a/b` of record `num`: the record is not an object"
    );
    // A prefix asked as a path (the route is at /): the answer says how to ask for it.
    for url in ["/cars/?subscribe", "/cars/"] {
        let prefix = get(&c, &l.url(url), &[]).await;
        assert_eq!(prefix.status, 400);
        assert_eq!(
            json_of(&prefix)["error"],
            "`cars/` is not an id (an id does not end in /): for the records under it, ask \
             `/?match=cars/*` (with `&subscribe` to follow them)",
            "{url}"
        );
    }

    // Preconditions for safe concurrent writers.
    let now = get(&c, &l.url("/cars/1"), &[]).await;
    let etag = now.header("etag").unwrap().to_string();
    let stale = send(
        &c,
        "PUT",
        &l.url("/cars/1"),
        &[AUTH, ("if-match", &etag1)],
        "{}",
    )
    .await;
    assert_eq!(stale.status, 412);
    let fresh = send(
        &c,
        "PUT",
        &l.url("/cars/1"),
        &[AUTH, ("if-match", &etag)],
        r#"{"v":1}"#,
    )
    .await;
    assert_eq!(fresh.status, 200);
    let create_only = send(
        &c,
        "PUT",
        &l.url("/cars/1"),
        &[AUTH, ("if-none-match", "*")],
        "{}",
    )
    .await;
    assert_eq!(create_only.status, 412);
    let created2 = send(
        &c,
        "PUT",
        &l.url("/cars/2"),
        &[AUTH, ("if-none-match", "*")],
        "[1]",
    )
    .await;
    assert_eq!(created2.status, 201);

    // Bad input changes nothing.
    assert_eq!(put(&c, &l.url("/cars/1"), "{not json").await.status, 400);
    assert_eq!(
        send(&c, "PATCH", &l.url("/cars/9"), &[AUTH], "{}")
            .await
            .status,
        404
    );
    assert_eq!(
        put(&c, &l.url("/cars/9/x"), "1").await.status,
        201,
        "no record at cars/9: a new id"
    );
    assert_eq!(put(&c, &l.url("/a%20b"), "1").await.status, 400);
    assert_eq!(put(&c, &l.url("/a/../b"), "1").await.status, 400);
    assert_eq!(
        send(&c, "PUT", &l.url("/cars/1"), &[], "{}").await.status,
        401
    );
    let wrong = send(
        &c,
        "PUT",
        &l.url("/cars/1"),
        &[("authorization", "Bearer nope")],
        "{}",
    )
    .await;
    assert_eq!(wrong.status, 401);
    assert_eq!(
        json_of(&get(&c, &l.url("/cars/1"), &[]).await),
        json!({"v": 1})
    );

    // Delete.
    assert_eq!(
        send(&c, "DELETE", &l.url("/cars/1"), &[AUTH], "")
            .await
            .status,
        204
    );
    assert_eq!(get(&c, &l.url("/cars/1"), &[]).await.status, 404);
    assert_eq!(
        send(&c, "DELETE", &l.url("/cars/1"), &[AUTH], "")
            .await
            .status,
        404
    );
    assert_eq!(
        send(&c, "POST", &l.url("/cars/1"), &[AUTH], "")
            .await
            .status,
        405
    );
}

#[tokio::test]
async fn limits_are_enforced_before_the_body_is_read() {
    let (l, _dir) = push_larder("max_record_size = \"1KiB\"").await;
    let c = client();
    let big = format!("\"{}\"", "x".repeat(2000));
    let r = put(&c, &l.url("/big"), &big).await;
    assert_eq!(r.status, 413);
    // Streamed without a length: cut off while reading.
    let (tx, body) =
        tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, std::io::Error>>(4);
    let body = http_body_util::StreamBody::new(tokio_stream_from(body));
    let req = http::Request::put(l.url("/big"))
        .header("authorization", "Bearer s3cret")
        .body(http_body_util::combinators::BoxBody::new(body))
        .unwrap();
    let sender = tokio::spawn(async move {
        for _ in 0..100 {
            if tx
                .send(Ok(http_body::Frame::data(Bytes::from(vec![b' '; 100]))))
                .await
                .is_err()
            {
                break;
            }
        }
    });
    let raw = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::combinators::BoxBody<Bytes, std::io::Error>>();
    let resp = raw.request(req).await.unwrap();
    assert_eq!(resp.status(), 413);
    sender.abort();
    assert_eq!(get(&c, &l.url("/big"), &[]).await.status, 404);
}

fn tokio_stream_from<T>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[tokio::test]
async fn large_records_are_sent_compressed() {
    let (l, _dir) = push_larder("").await;
    let c = client();
    let items: Vec<Value> = (0..300).map(|i| json!({"n": i, "name": "item"})).collect();
    let value = json!({ "items": items });
    assert_eq!(
        put(&c, &l.url("/big"), &value.to_string()).await.status,
        201
    );
    for enc in ["gzip", "br", "zstd"] {
        // Compressed once, off the workers, after the first request that could use it.
        wait_for_encoding(&c, &l.url("/big"), enc).await;
        let g = get(&c, &l.url("/big"), &[("accept-encoding", enc)]).await;
        assert_eq!(g.header("content-encoding"), Some(enc));
        assert_eq!(g.header("vary"), Some("accept-encoding"));
        let plain = decode(&g.body, Some(enc));
        assert_eq!(serde_json::from_slice::<Value>(&plain).unwrap(), value);
    }
    let g = get(&c, &l.url("/big"), &[]).await;
    assert_eq!(g.header("content-encoding"), None);
    assert_eq!(json_of(&g), value);
}

#[tokio::test]
async fn lists_and_subscriptions_filter_by_pattern_and_members() {
    let (l, _dir) = push_larder("").await;
    let c = client();
    put(&c, &l.url("/cars/1"), r#"{"price": 90, "color": "red"}"#).await;
    put(&c, &l.url("/cars/2"), r#"{"price": 200, "color": "blue"}"#).await;
    put(&c, &l.url("/bikes/1"), r#"{"price": 50}"#).await;
    let list = json_of(&get(&c, &l.url("/?match=cars/*&filter=price%20%3C%20100"), &[]).await);
    assert_eq!(
        list["records"],
        json!({"cars/1": {"price": 90, "color": "red"}})
    );
    assert_eq!(list["seq"], 3);
    let all = json_of(&get(&c, &l.url("/"), &[]).await);
    assert_eq!(all["records"].as_object().unwrap().len(), 3);
    let bad = get(&c, &l.url("/?filter=price%20%3C"), &[]).await;
    assert_eq!(bad.status, 400);
    assert!(bad.text().contains("filter"), "{}", bad.text());

    // A subscription: the matching records first, then `init`, then live changes.
    let url = l.url("/?subscribe&match=cars/*&filter=price%20%3C%20100");
    let mut sub = Sse::open(&c, &url, &[]).await;
    let first = sub.next().await;
    assert_eq!(
        (first.event.as_str(), first.json()["id"].as_str()),
        ("set", Some("cars/1"))
    );
    let init = sub.next().await;
    assert_eq!((init.event.as_str(), init.id), ("init", Some(3)));
    // Another subscriber with the same filter spelled differently shares its topic.
    let mut twin = Sse::open(
        &c,
        &l.url(
            "/?subscribe&match=cars/*&filter=price<100"
                .replace('<', "%3C")
                .as_str(),
        ),
        &[("accept", "text/event-stream")],
    )
    .await;
    twin.next().await;
    twin.next().await;

    put(&c, &l.url("/cars/2"), r#"{"price": 80, "color": "blue"}"#).await; // enters
    put(&c, &l.url("/bikes/2"), r#"{"price": 10}"#).await; // other pattern
    put(&c, &l.url("/cars/1"), r#"{"price": 120, "color": "red"}"#).await; // leaves
    send(&c, "DELETE", &l.url("/cars/2"), &[AUTH], "").await; // removed
    for s in [&mut sub, &mut twin] {
        let e = s.next().await;
        assert_eq!((e.event.as_str(), e.id), ("set", Some(4)));
        assert_eq!(
            e.json(),
            json!({"id": "cars/2", "value": {"price": 80, "color": "blue"}})
        );
        let e = s.next().await;
        assert_eq!((e.event.as_str(), e.id), ("remove", Some(6)));
        assert_eq!(e.json(), json!({"id": "cars/1"}));
        let e = s.next().await;
        assert_eq!((e.event.as_str(), e.id), ("remove", Some(7)));
    }
    assert!(sub.next_within(Duration::from_millis(300)).await.is_none());

    // One record by its URL.
    let mut one = Sse::open(&c, &l.url("/bikes/2?subscribe&init=0"), &[]).await;
    assert_eq!(one.next().await.event, "init");
    send(&c, "PATCH", &l.url("/bikes/2"), &[AUTH], r#"{"price": 11}"#).await;
    put(&c, &l.url("/bikes/1"), "{}").await;
    let e = one.next().await;
    assert_eq!(e.json(), json!({"id": "bikes/2", "value": {"price": 11}}));
    assert!(one.next_within(Duration::from_millis(300)).await.is_none());
}

#[tokio::test]
async fn subscriptions_work_over_http2_and_http1_0() {
    let (l, _dir) = push_larder("").await;
    let c = client();
    put(&c, &l.url("/a"), "1").await;
    // HTTP/2 (h2c): a streamed body, no hand-over.
    let mut h2 = h2_connection(l.addr).await;
    let req = http::Request::get(l.url("/?subscribe"))
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let mut s = Sse::of(h2.send_request(req).await.unwrap(), "h2");
    assert_eq!(s.next().await.json(), json!({"id": "a", "value": 1}));
    assert_eq!(s.next().await.event, "init");
    put(&c, &l.url("/a"), "2").await;
    assert_eq!(s.next().await.json(), json!({"id": "a", "value": 2}));

    // HTTP/1.0: the events follow the head as they are, the body ends with the connection.
    let mut raw = Raw::connect(l.addr).await;
    raw.write(b"GET /?subscribe&init=0 HTTP/1.0\r\nHost: x\r\n\r\n")
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    put(&c, &l.url("/a"), "3").await;
    let done = |b: &[u8]| String::from_utf8_lossy(b).contains("\"value\":3}\n\n");
    let text = tokio::time::timeout(Duration::from_secs(5), raw.read_until(done))
        .await
        .expect("the event within 5 s");
    let text = String::from_utf8_lossy(&text).to_string();
    assert!(
        text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200"),
        "{text}"
    );
    assert!(
        !text.to_ascii_lowercase().contains("transfer-encoding"),
        "{text}"
    );
    assert!(
        text.contains("event: init") && text.contains("id: 3\nevent: set"),
        "{text}"
    );
}

#[tokio::test]
async fn a_subscriber_counts_as_a_connection_until_it_hangs_up() {
    let (l, _dir) = push_larder("").await;
    let c = client();
    let mut subs = Vec::new();
    for _ in 0..3 {
        let mut raw = Raw::connect(l.addr).await;
        raw.write(b"GET /?subscribe HTTP/1.1\r\nHost: x\r\n\r\n")
            .await;
        let head = raw
            .read_until(|b| String::from_utf8_lossy(b).contains("event: init"))
            .await;
        assert!(String::from_utf8_lossy(&head).contains("transfer-encoding: chunked"));
        subs.push(raw);
    }
    assert_eq!(
        l.open_connections(),
        3,
        "handed-over subscribers hold their connection permit"
    );
    drop(subs);
    // No event is written to them: they go because they hung up.
    let mut open = usize::MAX;
    for _ in 0..50 {
        open = l.open_connections();
        if open == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(open, 0, "subscribers that hung up are dropped at once");
    assert_eq!(put(&c, &l.url("/a"), "1").await.status, 201);
}

#[tokio::test]
async fn subscribers_resume_after_a_reconnect_or_are_told_to_start_over() {
    let (l, _dir) = push_larder("history = 5\nheartbeat = \"200ms\"").await;
    let c = client();
    for i in 1..=4 {
        put(&c, &l.url(&format!("/k/{i}")), &i.to_string()).await;
    }
    // Resume after change 2: changes 3 and 4, no init.
    let mut s = Sse::open(&c, &l.url("/?subscribe"), &[("last-event-id", "2")]).await;
    let e = s.next().await;
    assert_eq!(
        (e.event.as_str(), e.id, e.json()["id"].as_str()),
        ("set", Some(3), Some("k/3"))
    );
    assert_eq!(s.next().await.id, Some(4));
    put(&c, &l.url("/k/5"), "5").await;
    assert_eq!(s.next().await.id, Some(5));
    // Heartbeats keep an idle stream alive.
    assert!(s.heartbeat_within(Duration::from_secs(2)).await);
    drop(s);

    // The query form, for clients that cannot set the header.
    let mut q = Sse::open(&c, &l.url("/?subscribe&last-event-id=4"), &[]).await;
    assert_eq!(q.next().await.id, Some(5));
    drop(q);

    // Ten more changes: the history (5) no longer reaches change 2.
    for i in 6..=15 {
        put(&c, &l.url(&format!("/k/{i}")), &i.to_string()).await;
    }
    let mut old = Sse::open(&c, &l.url("/?subscribe"), &[("last-event-id", "2")]).await;
    let reset = old.next().await;
    assert_eq!(reset.event, "reset");
    assert_eq!(reset.json(), json!({"reason": "gap"}));
    let mut sets = 0;
    loop {
        let e = old.next().await;
        if e.event == "init" {
            assert_eq!(e.id, Some(15));
            break;
        }
        assert_eq!(e.event, "set");
        sets += 1;
    }
    assert_eq!(sets, 15, "the whole current state follows the reset");
    let bad = get(&c, &l.url("/?subscribe&last-event-id=x"), &[]).await;
    assert_eq!(bad.status, 400);
}

#[tokio::test]
async fn a_slow_subscriber_is_cut_off_and_the_others_get_everything() {
    let (l, _dir) = push_larder("queue = 8\nmax_record_size = \"1MiB\"").await;
    let c = client();
    // The slow one never reads: its socket buffers fill, then its ring slots run out.
    let slow = request(&c, "GET", &l.url("/?subscribe&init=0"), &[], b"").await;
    let mut fast = Sse::open(&c, &l.url("/?subscribe&init=0"), &[]).await;
    assert_eq!(fast.next().await.event, "init");
    let chunk = format!("\"{}\"", "z".repeat(256 * 1024));
    let reader = tokio::spawn(async move {
        let mut got = 0;
        while got < 40 {
            let e = fast
                .next_within(Duration::from_secs(10))
                .await
                .expect("every event");
            assert_eq!(e.event, "set");
            got += 1;
        }
        got
    });
    for i in 0..40 {
        assert_eq!(
            put(&c, &l.url(&format!("/big/{i}")), &chunk).await.status,
            201
        );
    }
    assert_eq!(reader.await.unwrap(), 40);
    // Reading now, the slow one finds its stream ends with a reset.
    let mut body = slow.into_body();
    let mut tail = Vec::new();
    let read_all = async {
        while let Some(Ok(f)) = body.frame().await {
            if let Ok(d) = f.into_data() {
                tail.extend_from_slice(&d);
                if tail.len() > 4096 {
                    tail.drain(..tail.len() - 4096);
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read_all)
        .await
        .expect("the slow subscriber's stream ends");
    let tail = String::from_utf8_lossy(&tail);
    assert!(
        tail.ends_with("event: reset\ndata: {\"reason\":\"overflow\"}\n\n"),
        "{tail}"
    );
}

/// The next text message of a WebSocket, as JSON (within 5 s).
async fn next(
    ws: &mut (impl StreamExt<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin),
) -> Value {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .expect("a message")
            .unwrap()
            .unwrap();
        if let Message::Text(t) = m {
            return serde_json::from_str(&t).unwrap();
        }
    }
}

#[tokio::test]
async fn websocket_clients_get_subscribe_and_unsubscribe() {
    let (l, _dir) = push_larder("ws_max_message = \"1KiB\"").await;
    let c = client();
    put(&c, &l.url("/cars/1"), r#"{"price": 90}"#).await;
    let (mut ws, resp) = tokio_tungstenite::connect_async(format!("ws://{}/", l.addr))
        .await
        .unwrap();
    assert_eq!(resp.status(), 101);
    ws.send(Message::text(r#"{"op":"get","id":"cars/1"}"#))
        .await
        .unwrap();
    assert_eq!(
        next(&mut ws).await,
        json!({"op": "get", "id": "cars/1", "value": {"price": 90}})
    );
    ws.send(Message::text(r#"{"op":"get","id":"cars/9"}"#))
        .await
        .unwrap();
    assert!(next(&mut ws).await["error"].is_string());
    ws.send(Message::text(
        r#"{"op":"subscribe","name":"cheap","match":"cars/*","filter":"price < 100"}"#,
    ))
    .await
    .unwrap();
    assert_eq!(
        next(&mut ws).await,
        json!({"op": "subscribe", "name": "cheap"})
    );
    let e = next(&mut ws).await;
    assert_eq!(
        e,
        json!({"sub": "cheap", "event": "set", "seq": 0, "id": "cars/1", "value": {"price": 90}})
    );
    assert_eq!(next(&mut ws).await["event"], "init");
    ws.send(Message::text(
        r#"{"op":"subscribe","name":"all","init":false}"#,
    ))
    .await
    .unwrap();
    assert_eq!(next(&mut ws).await["op"], "subscribe");
    assert_eq!(next(&mut ws).await["event"], "init");
    ws.send(Message::text(
        r#"{"op":"subscribe","name":"x","filter":"price <"}"#,
    ))
    .await
    .unwrap();
    assert!(next(&mut ws).await["error"]
        .as_str()
        .unwrap()
        .contains("filter"));

    put(&c, &l.url("/cars/2"), r#"{"price": 5}"#).await;
    let mut got = [next(&mut ws).await, next(&mut ws).await];
    got.sort_by_key(|v| v["sub"].as_str().unwrap().to_string());
    assert_eq!(
        got[0],
        json!({"sub": "all", "event": "set", "seq": 2, "id": "cars/2", "value": {"price": 5}})
    );
    assert_eq!(got[1]["sub"], "cheap");

    ws.send(Message::text(r#"{"op":"unsubscribe","name":"cheap"}"#))
        .await
        .unwrap();
    assert_eq!(
        next(&mut ws).await,
        json!({"op": "unsubscribe", "name": "cheap"})
    );
    send(&c, "DELETE", &l.url("/cars/2"), &[AUTH], "").await;
    let e = next(&mut ws).await;
    assert_eq!(
        (e["sub"].as_str(), e["event"].as_str()),
        (Some("all"), Some("remove"))
    );

    // A message over the limit closes the socket with 1009.
    ws.send(Message::text("x".repeat(4096))).await.unwrap();
    let close = loop {
        match tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .unwrap()
        {
            Some(Ok(Message::Close(f))) => break f,
            Some(Ok(_)) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    };
    assert_eq!(u16::from(close.unwrap().code), 1009);
}

#[tokio::test]
async fn json_web_tokens_grant_the_ids_they_name() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "a-long-enough-shared-secret";
    let cfg = one_route(
        "",
        "push",
        &format!(
            "dir = \"{}\"\nread_needs_jwt = true\ncors_origins = [\"https://app.example\"]\n[listener.route.push.jwt]\nsecret = \"{secret}\"",
            dir.path().display()
        ),
    );
    let l = Larder::start(&cfg).await;
    let c = client();
    let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes());
    let jwt = |claims: Value| {
        jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap()
    };
    let writer = format!(
        "Bearer {}",
        jwt(json!({"larder": {"publish": ["cars/*"], "subscribe": ["cars/*"]}}))
    );
    let ok = send(
        &c,
        "PUT",
        &l.url("/cars/1"),
        &[("authorization", &writer)],
        "1",
    )
    .await;
    assert_eq!(ok.status, 201);
    let no = send(
        &c,
        "PUT",
        &l.url("/bikes/1"),
        &[("authorization", &writer)],
        "1",
    )
    .await;
    assert_eq!(no.status, 403);
    let expired = format!(
        "Bearer {}",
        jwt(json!({"larder": {"publish": ["*"]}, "exp": 1_000_000}))
    );
    assert_eq!(
        send(&c, "PUT", &l.url("/x"), &[("authorization", &expired)], "1")
            .await
            .status,
        401
    );
    let forged = {
        let k = jsonwebtoken::EncodingKey::from_secret(b"another secret entirely");
        jsonwebtoken::encode(
            &jsonwebtoken::Header::default(),
            &json!({"larder": {"publish": ["*"]}}),
            &k,
        )
        .unwrap()
    };
    let r = send(
        &c,
        "PUT",
        &l.url("/x"),
        &[("authorization", &format!("Bearer {forged}"))],
        "1",
    )
    .await;
    assert_eq!(r.status, 401);

    // Reads need a token covering them.
    assert_eq!(get(&c, &l.url("/cars/1"), &[]).await.status, 401);
    assert_eq!(
        get(&c, &l.url("/cars/1"), &[("authorization", &writer)])
            .await
            .status,
        200
    );
    assert_eq!(
        get(&c, &l.url("/?subscribe"), &[("authorization", &writer)])
            .await
            .status,
        403
    );
    let token = writer.trim_start_matches("Bearer ");
    let mut s = Sse::open(
        &c,
        &l.url(&format!("/?subscribe&match=cars/*&authorization={token}")),
        &[],
    )
    .await;
    assert_eq!(s.next().await.event, "set");

    // CORS for the allowed origin only.
    let pre = send(
        &c,
        "OPTIONS",
        &l.url("/cars/1"),
        &[
            ("origin", "https://app.example"),
            ("access-control-request-method", "PUT"),
        ],
        "",
    )
    .await;
    assert_eq!(pre.status, 204);
    assert_eq!(
        pre.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert!(pre
        .header("access-control-allow-methods")
        .unwrap()
        .contains("PUT"));
    let other = get(
        &c,
        &l.url("/cars/1"),
        &[
            ("origin", "https://evil.example"),
            ("authorization", &writer),
        ],
    )
    .await;
    assert_eq!(other.header("access-control-allow-origin"), None);
    let same = get(
        &c,
        &l.url("/cars/1"),
        &[
            ("origin", "https://app.example"),
            ("authorization", &writer),
        ],
    )
    .await;
    assert_eq!(
        same.header("access-control-allow-origin"),
        Some("https://app.example")
    );
}

#[tokio::test]
async fn metrics_count_records_subscriptions_and_changes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = one_route(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"adm\"",
        "push",
        &format!("dir = \"{}\"\ntoken = \"{TOKEN}\"", dir.path().display()),
    );
    let l = Larder::start(&cfg).await;
    let c = client();
    put(&c, &l.url("/a"), "1").await;
    put(&c, &l.url("/b"), "2").await;
    put(&c, &l.url("/a"), "3").await;
    let _s1 = Sse::open(&c, &l.url("/?subscribe"), &[]).await;
    let _s2 = Sse::open(&c, &l.url("/?subscribe&filter=x"), &[]).await;
    let text = l.metrics_text().expect("metrics with an admin listener");
    let d = dir.path().canonicalize().unwrap().display().to_string();
    for (name, v) in [
        ("larder_push_records", 2),
        ("larder_push_subscriptions", 2),
        ("larder_push_topics", 2),
        ("larder_push_changes_total", 3),
        ("larder_push_history_changes", 3),
        // Each change's id and values before and after: a:"1", b:"2", a:"1"->"3".
        ("larder_push_history_bytes", 2 + 2 + 3),
        ("larder_push_queued_bytes", 0),
    ] {
        let line = format!("{name}{{dir=\"{d}\"}} {v}");
        assert!(text.contains(&line), "{line} in\n{text}");
    }
    // The same in the status document (and the dashboard that reads it).
    let status = get(
        &c,
        &l.admin_url("/_larder/status"),
        &[("authorization", "Bearer adm")],
    )
    .await;
    let status: Value = serde_json::from_slice(&status.body).unwrap();
    let push = status["push"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["dir"] == d.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("no push route in {status}"));
    assert_eq!(
        (
            &push["records"],
            &push["subscriptions"],
            &push["changes"],
            &push["shared"]
        ),
        (&json!(2), &json!(2), &json!(3), &json!(false))
    );
}

/// Two servers in one process, each with its own push route and admin listener: each one's
/// `/metrics` and status show its own push store and count its own requests only (each
/// server hands its own registries to its routers; a process-wide list of stores showed both).
#[tokio::test(flavor = "multi_thread")]
async fn two_servers_in_one_process_each_show_only_their_own() {
    let c = client();
    let (mut servers, mut dirs) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        let cfg = one_route(
            "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"adm\"",
            "push",
            &format!("dir = \"{}\"\ntoken = \"{TOKEN}\"", dir.path().display()),
        );
        servers.push(Larder::start(&cfg).await);
        dirs.push(dir);
    }
    // Server 0 gets one record and one read, server 1 three records.
    put(&c, &servers[0].url("/a"), "1").await;
    assert_eq!(get(&c, &servers[0].url("/a"), &[]).await.status, 200);
    for id in ["a", "b", "c"] {
        put(&c, &servers[1].url(&format!("/{id}")), "2").await;
    }
    let admin = [("authorization", "Bearer adm")];
    for (i, (l, dir)) in servers.iter().zip(&dirs).enumerate() {
        let (other, other_dir) = (&servers[1 - i], &dirs[1 - i]);
        let d = dir.path().canonicalize().unwrap().display().to_string();
        let od = other_dir
            .path()
            .canonicalize()
            .unwrap()
            .display()
            .to_string();
        let text = get(&c, &l.admin_url("/metrics"), &admin).await.text();
        let records = if i == 0 { 1 } else { 3 };
        let line = format!("larder_push_records{{dir=\"{d}\"}} {records}\n");
        assert!(text.contains(&line), "{line} in\n{text}");
        assert!(
            !text.contains(&od),
            "server {i} shows the other's store:\n{text}"
        );
        // Requests: its own route's, as many as it answered.
        let requests: Vec<&str> = (text.lines())
            .filter(|l| l.starts_with("larder_requests_total{"))
            .collect();
        assert!(!requests.is_empty(), "{text}");
        let own = format!("route=\"{} */\"", l.addr);
        assert!(requests.iter().all(|r| r.contains(&own)), "{requests:?}");
        let counted: u64 = (requests.iter())
            .map(|r| r.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(counted, if i == 0 { 2 } else { 3 }, "{requests:?}");
        assert!(!text.contains(&other.addr.to_string()), "{text}");
        let status = get(&c, &l.admin_url("/_larder/status"), &admin).await;
        let status: Value = serde_json::from_slice(&status.body).unwrap();
        let dirs_shown: Vec<&str> = (status["push"].as_array().unwrap().iter())
            .map(|p| p["dir"].as_str().unwrap())
            .collect();
        assert_eq!(dirs_shown, [d.as_str()], "server {i}: {status}");
        assert_eq!(status["push"][0]["records"], records);
    }
}

#[tokio::test]
async fn a_route_without_credentials_refuses_every_write() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = one_route("", "push", &format!("dir = \"{}\"", dir.path().display()));
    let l = Larder::start(&cfg).await;
    let r = send(
        &client(),
        "PUT",
        &l.url("/a"),
        &[("authorization", "Bearer x")],
        "1",
    )
    .await;
    assert_eq!(r.status, 403);
}

#[tokio::test]
async fn groups_keep_a_maximum_count_and_expire() {
    let (l, _dir) = push_larder(
        "[[listener.route.push.group]]\nmatch = \"recent/*\"\nmax = 3\n[[listener.route.push.group]]\nmatch = \"tmp/*\"\nttl = \"1s\"",
    )
    .await;
    let c = client();
    let mut s = Sse::open(&c, &l.url("/?subscribe&match=recent/*&init=0"), &[]).await;
    assert_eq!(s.next().await.event, "init");
    for i in 1..=4 {
        put(&c, &l.url(&format!("/recent/{i}")), "1").await;
    }
    let mut events = Vec::new();
    for _ in 0..5 {
        let e = s.next().await;
        events.push(format!("{} {}", e.event, e.json()["id"].as_str().unwrap()));
    }
    assert_eq!(
        events,
        [
            "set recent/1",
            "set recent/2",
            "set recent/3",
            "set recent/4",
            "remove recent/1"
        ]
    );
    assert_eq!(get(&c, &l.url("/recent/1"), &[]).await.status, 404);
    let list = json_of(&get(&c, &l.url("/?match=recent/*"), &[]).await);
    assert_eq!(list["records"].as_object().unwrap().len(), 3);

    put(&c, &l.url("/tmp/a"), "1").await;
    assert_eq!(get(&c, &l.url("/tmp/a"), &[]).await.status, 200);
    let mut gone = false;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if get(&c, &l.url("/tmp/a"), &[]).await.status == 404 {
            gone = true;
            break;
        }
    }
    assert!(
        gone,
        "a record of a group with ttl = 1s is removed within 4 s"
    );
}

#[test]
fn acknowledged_writes_survive_kill_9_and_the_log_is_compacted() {
    let dir = tempfile::tempdir().unwrap();
    let cfg_path = dir.path().join("larder.toml");
    let addr = free_port();
    let records = dir.path().join("records");
    std::fs::write(
        &cfg_path,
        format!(
            "[[listener]]\naddr = \"{addr}\"\n  [[listener.route]]\n  path = \"/r/\"\n  push = {{ dir = \"{}\", token = \"{TOKEN}\", max_record_size = \"2MiB\" }}\n",
            records.display()
        ),
    )
    .unwrap();
    let start = || start_child(&cfg_path, addr);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut child = start();
    let acked: Vec<(String, Value)> = rt.block_on(async {
        let c = client();
        // Writers in parallel; each answer that came is an acknowledged write.
        let mut tasks = Vec::new();
        for w in 0..8 {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                let mut acked = Vec::new();
                for i in 0..40 {
                    let id = format!("w{w}/{i}");
                    let v = json!({"writer": w, "i": i});
                    let r = put(&c, &format!("http://{addr}/r/{id}"), &v.to_string()).await;
                    assert_eq!(r.status, 201);
                    acked.push((id, v));
                }
                acked
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    });
    // kill -9 while a second round is being written: what was acknowledged must be there.
    let in_flight = rt.spawn(async move {
        let c = client();
        let mut acked = Vec::new();
        for i in 0..100_000 {
            let id = format!("late/{i}");
            let v = json!(i);
            let req = http::Request::put(format!("http://{addr}/r/{id}"))
                .header("authorization", "Bearer s3cret")
                .body(http_body_util::Full::new(Bytes::from(v.to_string())))
                .unwrap();
            match tokio::time::timeout(Duration::from_secs(2), c.request(req)).await {
                Ok(Ok(r)) if r.status() == 201 => {}
                _ => break,
            }
            acked.push((id, v));
        }
        acked
    });
    std::thread::sleep(Duration::from_millis(300));
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let late = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), in_flight)
            .await
            .unwrap_or_else(|_| panic!("the writer stops when larder dies"))
            .unwrap_or_default()
    });
    assert!(
        !late.is_empty(),
        "some writes were acknowledged before the kill"
    );
    let _child = start();
    rt.block_on(async {
        let c = client();
        for (id, v) in acked.iter().chain(&late) {
            let g = get(&c, &format!("http://{addr}/r/{id}"), &[]).await;
            assert_eq!(g.status, 200, "{id} was acknowledged");
            assert_eq!(json_of(&g), *v);
        }
        // Rewriting one record past twice the live size compacts the log.
        let big = json!("y".repeat(1024 * 1024)).to_string();
        for _ in 0..12 {
            let st = put(&c, &format!("http://{addr}/r/big"), &big).await.status;
            assert!(st == 200 || st == 201, "{st}");
        }
    });
    drop(_child);
    let log_len = std::fs::metadata(records.join("changes.log"))
        .unwrap()
        .len();
    // Twelve 1 MiB versions were written: without compaction the log would hold them all.
    assert!(
        log_len < 10 << 20,
        "the log was compacted ({log_len} bytes)"
    );
    let _child = start();
    rt.block_on(async {
        let c = client();
        let g = get(&c, &format!("http://{addr}/r/big"), &[]).await;
        assert_eq!(g.body.len(), 1024 * 1024 + 2);
        let g = get(&c, &format!("http://{addr}/r/{}", acked[0].0), &[]).await;
        assert_eq!(json_of(&g), acked[0].1);
    });
}

/// A larder child process on `cfg`, once it listens on `addr`.
fn start_child(cfg: &std::path::Path, addr: std::net::SocketAddr) -> Child {
    let child = Child(
        larder_command()
            .arg("--config")
            .arg(cfg)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    for _ in 0..100 {
        if std::net::TcpStream::connect(addr).is_ok() {
            return child;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("larder did not start");
}

/// A tmpfs of `size` mounted on `dir` (the test runs as root: it fails, not skips, if the
/// mount is refused), unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &std::path::Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("mount runs");
        assert!(
            st.success(),
            "mounting a tmpfs on {} failed (the test needs root)",
            dir.display()
        );
        Tmpfs(dir.to_path_buf())
    }

    /// Fills the file system with a file `name`, to the last byte it takes.
    fn fill(&self, name: &str) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.0.join(name)).unwrap();
        let block = [0u8; 4096];
        while f.write(&block).is_ok_and(|n| n > 0) {}
        let byte = [0u8; 1];
        while f.write(&byte).is_ok_and(|n| n > 0) {}
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: a log a writer thread still holds open does not keep it mounted.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// With the change log on a full file system, a write gets 503 and leaves no trace: not in
/// reads, lists or subscriptions, not after a restart; once there is room again the next
/// write succeeds without a restart (issue #39, item 4).
#[test]
fn a_write_the_log_refused_leaves_no_trace_and_writing_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("records");
    let fs = Tmpfs::mount(&records, "200k");
    let cfg = dir.path().join("larder.toml");
    let addr = free_port();
    std::fs::write(
        &cfg,
        format!(
            "[[listener]]\naddr = \"{addr}\"\n  [[listener.route]]\n  path = \"/r/\"\n  push = {{ dir = \"{}\", token = \"{TOKEN}\" }}\n",
            records.display()
        ),
    )
    .unwrap();
    let url = |p: &str| format!("http://{addr}/r/{p}");
    let big = json!({"blob": "b".repeat(50_000)});
    let rt = tokio::runtime::Runtime::new().unwrap();
    let child = start_child(&cfg, addr);
    rt.block_on(async {
        let c = client();
        assert_eq!(put(&c, &url("a"), "1").await.status, 201);
        let mut sub = Sse::open(&c, &url("?subscribe&init=0"), &[]).await;
        assert_eq!(sub.next().await.event, "init");

        fs.fill("filler");
        let refused = put(&c, &url("b"), &big.to_string()).await;
        assert_eq!(refused.status, 503, "{}", refused.text());
        assert_eq!(put(&c, &url("a"), &big.to_string()).await.status, 503);
        let patch = send(&c, "PATCH", &url("a"), &[AUTH], &big.to_string()).await;
        assert_eq!(patch.status, 503);
        assert_eq!(
            get(&c, &url("b"), &[]).await.status,
            404,
            "the failed create is not read"
        );
        let a = get(&c, &url("a"), &[]).await;
        assert_eq!(
            (a.status, json_of(&a)),
            (http::StatusCode::OK, json!(1)),
            "the failed replace is not read"
        );
        let list = json_of(&get(&c, &url(""), &[]).await);
        assert_eq!(list["records"], json!({"a": 1}), "nor listed");

        // Room again: the next write succeeds, and it is the subscriber's next event (it saw
        // nothing of the failed ones).
        std::fs::remove_file(records.join("filler")).unwrap();
        assert_eq!(put(&c, &url("c"), "3").await.status, 201);
        let e = sub.next().await;
        assert_eq!(
            (e.event.as_str(), e.json()["id"].as_str()),
            ("set", Some("c"))
        );
        assert_eq!(put(&c, &url("b"), &big.to_string()).await.status, 201);
        assert_eq!(sub.next().await.json()["id"], "b");
    });
    drop(child);
    let _child = start_child(&cfg, addr);
    rt.block_on(async {
        let c = client();
        let list = json_of(&get(&c, &url(""), &[]).await);
        assert_eq!(
            list["records"],
            json!({"a": 1, "b": big, "c": 3}),
            "after a restart: what was acknowledged, nothing that failed"
        );
    });
}

#[test]
fn the_quick_start_generates_and_prints_a_write_token() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let addr = free_port();
    let mut child = Child(
        larder_command()
            .arg("--push")
            .arg(dir.path().join("records"))
            .arg("--listen")
            .arg(addr.to_string())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Kept open to the end: larder prints more after the token.
    let mut lines = std::io::BufReader::new(child.0.stdout.take().unwrap()).lines();
    let token = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| {
            l.split_once("generated write token ")
                .map(|(_, t)| t.trim().to_string())
        })
        .expect("the token is printed");
    assert_eq!(token.len(), 48);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = client();
        let url = format!("http://{addr}/cars/1");
        let auth = format!("Bearer {token}");
        assert_eq!(send(&c, "PUT", &url, &[], "1").await.status, 401);
        assert_eq!(
            send(&c, "PUT", &url, &[("authorization", &auth)], "1")
                .await
                .status,
            201
        );
        let page = get(&c, &format!("http://{addr}/"), &[("accept", "text/html")]).await;
        assert_eq!(
            page.header("content-type"),
            Some("text/html; charset=utf-8")
        );
        assert!(page.text().contains("EventSource"));
    });
    drop(lines);
}

/// A reload applies the settings of a store it keeps open: a lower group maximum removes the
/// oldest records at once (subscribers see the removes), a shorter history, a smaller record
/// limit and a faster heartbeat.
#[tokio::test]
async fn a_reload_applies_the_store_settings() {
    let dir = tempfile::tempdir().unwrap();
    let before =
        "heartbeat = \"60s\"\n[[listener.route.push.group]]\nmatch = \"recent/*\"\nmax = 5";
    let l = Larder::start(&push_config(dir.path(), before)).await;
    let c = client();
    for i in 1..=5 {
        assert_eq!(
            put(&c, &l.url(&format!("/recent/{i}")), "1").await.status,
            201
        );
    }
    let big = format!("\"{}\"", "x".repeat(300));
    assert_eq!(put(&c, &l.url("/big"), &big).await.status, 201);
    let mut s = Sse::open(&c, &l.url("/?subscribe&match=recent/*&init=0"), &[]).await;
    assert_eq!(s.next().await.event, "init");

    let after = "history = 3\nmax_record_size = \"200B\"\nheartbeat = \"200ms\"\n[[listener.route.push.group]]\nmatch = \"recent/*\"\nmax = 2";
    let restart = l.reload(&push_config(dir.path(), after)).unwrap();
    assert!(restart.is_empty(), "{restart:?}");
    let mut removed = Vec::new();
    while removed.len() < 3 {
        let e = s.next().await;
        assert_eq!(e.event, "remove");
        removed.push(e.json()["id"].as_str().unwrap().to_string());
    }
    assert_eq!(removed, ["recent/1", "recent/2", "recent/3"]);
    assert_eq!(get(&c, &l.url("/recent/3"), &[]).await.status, 404);
    assert_eq!(get(&c, &l.url("/recent/4"), &[]).await.status, 200);
    // The record limit: the same body is refused now, a small one still goes.
    assert_eq!(put(&c, &l.url("/big2"), &big).await.status, 413);
    assert_eq!(put(&c, &l.url("/small"), "1").await.status, 201);
    // The heartbeat: an idle stream hears one within 2 s (60 s before the reload).
    assert!(s.heartbeat_within(Duration::from_secs(2)).await);
    // The history: changes 1-6 were the sets, 7-9 the removes, 10 the small set; three are
    // kept, so a resume after 7 works and one after 6 is told to start over.
    let mut ok = Sse::open(&c, &l.url("/?subscribe&init=0"), &[("last-event-id", "7")]).await;
    assert_eq!(ok.next().await.id, Some(8));
    let mut old = Sse::open(&c, &l.url("/?subscribe"), &[("last-event-id", "6")]).await;
    assert_eq!(old.next().await.event, "reset");
}

/// WebSocket over HTTP/2 (RFC 8441): a listener whose routes serve it (push, no proxy) says so
/// in its SETTINGS, and an extended CONNECT gets a session with the same messages as HTTP/1.1.
/// A listener with a proxy route does not offer it (its WebSockets go over HTTP/1.1).
#[tokio::test]
async fn websocket_over_http2() {
    use http_body_util::Empty;
    use hyper_util::rt::TokioIo;
    use tokio_tungstenite::tungstenite::protocol::Role;

    fn connect(url: &str, version: &str) -> http::Request<Empty<Bytes>> {
        let mut req = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri(url)
            .header("sec-websocket-version", version)
            .body(Empty::new())
            .unwrap();
        req.extensions_mut()
            .insert(hyper::ext::Protocol::from_static("websocket"));
        req
    }

    let (l, _dir) = push_larder("").await;
    let c = client();
    put(&c, &l.url("/cars/1"), r#"{"price": 90}"#).await;
    let mut send = h2_connection(l.addr).await;
    // A first exchange: its answer follows the server's SETTINGS, which enable extended CONNECT.
    let first = http::Request::get(l.url("/cars/1"))
        .body(Empty::new())
        .unwrap();
    assert_eq!(send.send_request(first).await.unwrap().status(), 200);
    let refused = send.send_request(connect(&l.url("/"), "8")).await.unwrap();
    assert_eq!(refused.status(), 400);
    let resp = send.send_request(connect(&l.url("/"), "13")).await.unwrap();
    assert_eq!(resp.status(), 200);
    let stream = hyper::upgrade::on(resp).await.unwrap();
    let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
        TokioIo::new(stream),
        Role::Client,
        None,
    )
    .await;
    ws.send(Message::text(
        r#"{"op":"subscribe","name":"cars","match":"cars/*","init":false}"#,
    ))
    .await
    .unwrap();
    assert_eq!(
        next(&mut ws).await,
        json!({"op": "subscribe", "name": "cars"})
    );
    assert_eq!(next(&mut ws).await["event"], "init");
    put(&c, &l.url("/cars/2"), r#"{"price": 70}"#).await;
    assert_eq!(
        next(&mut ws).await,
        json!({"sub": "cars", "event": "set", "seq": 2, "id": "cars/2", "value": {"price": 70}})
    );

    // A listener that also proxies does not offer WebSocket over HTTP/2.
    let dir = tempfile::tempdir().unwrap();
    let both = Larder::start(&format!(
        "[[listener]]\naddr = \"127.0.0.1:0\"\n  [[listener.route]]\n  path = \"/records/\"\n  push = {{ dir = \"{}\", token = \"{TOKEN}\" }}\n  [[listener.route]]\n  path = \"/\"\n  proxy = {{ upstream = \"http://127.0.0.1:9\" }}\n",
        dir.path().display()
    ))
    .await;
    let mut send = h2_connection(both.addr).await;
    let first = http::Request::get(both.url("/records/x"))
        .body(Empty::new())
        .unwrap();
    assert_eq!(send.send_request(first).await.unwrap().status(), 404);
    assert!(send
        .send_request(connect(&both.url("/records/"), "13"))
        .await
        .is_err());
}

/// Two nodes whose push route shares its records through one redis-server.
async fn shared_pair(redis: &RedisServer) -> (Larder, Larder, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let shared = format!(
        "[cache.shared]\nurl = \"{}\"\ntimeout = \"3s\"\nlease = \"10s\"\n",
        redis.url()
    );
    let node = |name: &str| {
        one_route(
            &shared,
            "push",
            &format!(
                "dir = \"{}\"\ntoken = \"{TOKEN}\"\nshare = true\n",
                dir.path().join(name).display()
            ),
        )
    };
    let a = Larder::start(&node("a")).await;
    let b = Larder::start(&node("b")).await;
    (a, b, dir)
}

/// The text of record `url`, if there is one.
async fn value_at(c: &Client, url: String) -> Option<String> {
    let g = get(c, &url, &[]).await;
    (g.status == 200).then(|| g.text())
}

/// Polls `check` (every 20 ms) until it holds, at most `within`.
async fn eventually(within: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check().await
}

/// Two writes of one record at once on one node, 50 times (a record each): the fleet gets the
/// changes in the order they were committed, so both nodes end on the value committed last
/// (the higher sequence number), whichever handler woke first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_ends_on_the_value_committed_last() {
    let redis = RedisServer::start();
    let (a, b, _dir) = shared_pair(&redis).await;
    let c = client();
    let rounds = 50;
    let mut last = Vec::new();
    for i in 0..rounds {
        let url = a.url(&format!("/race/{i}"));
        let (x, y) = (
            format!("{{\"i\":{i},\"w\":1}}"),
            format!("{{\"i\":{i},\"w\":2}}"),
        );
        let (gx, gy) = tokio::join!(put(&c, &url, &x), put(&c, &url, &y));
        assert!(gx.status.is_success() && gy.status.is_success());
        let seq = |g: &Got| json_of(g)["seq"].as_u64().unwrap();
        last.push(if seq(&gx) > seq(&gy) { x } else { y });
    }
    let on = |n: &Larder, i: usize| value_at(&c, n.url(&format!("/race/{i}")));
    let settled = eventually(Duration::from_secs(10), async || {
        for (i, want) in last.iter().enumerate() {
            let (va, vb) = (on(&a, i).await, on(&b, i).await);
            if va.as_ref() != Some(want) || vb.as_ref() != Some(want) {
                return false;
            }
        }
        true
    })
    .await;
    let mut wrong = Vec::new();
    for (i, want) in last.iter().enumerate() {
        let (va, vb) = (on(&a, i).await, on(&b, i).await);
        if va.as_ref() != Some(want) || vb.as_ref() != Some(want) {
            wrong.push(format!(
                "race/{i}: last committed {want}, A {va:?}, B {vb:?}"
            ));
        }
    }
    assert!(
        settled,
        "{} of {rounds} records off:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// Writes whose client resets the stream (HTTP/2) while they commit: every change a node
/// committed reaches the other node, whether or not its request was still there to answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_write_still_reaches_the_fleet() {
    use http_body_util::Full;
    let redis = RedisServer::start();
    let (a, b, _dir) = shared_pair(&redis).await;
    let c = client();
    let connect = || async {
        let stream = tokio::net::TcpStream::connect(a.addr).await.unwrap();
        let (h2, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        h2
    };
    let mut h2 = connect().await;
    let n = 60;
    for i in 0..n {
        let req = http::Request::put(a.url(&format!("/gone/{i}")))
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(Full::new(Bytes::from(format!("{{\"i\":{i}}}"))))
            .unwrap();
        // The server may end a connection whose client resets many streams (its defence
        // against reset floods): go on over a new one.
        if h2.ready().await.is_err() {
            h2 = connect().await;
            h2.ready().await.unwrap();
        }
        let answer = h2.send_request(req);
        // Reset at times spread over a commit (the request may not have been read yet, or be
        // answered already: some of each is expected).
        let _ = tokio::time::timeout(Duration::from_micros(50 * (i % 40)), answer).await;
    }
    // Every record A holds reaches B.
    let on = |n: &Larder, i: usize| value_at(&c, n.url(&format!("/gone/{i}")));
    let same = eventually(Duration::from_secs(10), async || {
        for i in 0..n as usize {
            let va = on(&a, i).await;
            if va.is_some() && on(&b, i).await != va {
                return false;
            }
        }
        true
    })
    .await;
    let (mut missing, mut held) = (Vec::new(), 0);
    for i in 0..n as usize {
        let va = on(&a, i).await;
        held += va.is_some() as usize;
        if va.is_some() && on(&b, i).await != va {
            missing.push(i);
        }
    }
    assert!(held > 0, "no write was committed");
    assert!(
        same,
        "committed on A, never shared with B: {missing:?} (of {held} held)"
    );
}

/// A reload that moves the push route to another directory: the server's status and
/// `/metrics` show the new route's store, not the one the reload left.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_replaces_the_stores_the_server_shows() {
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let cfg = |dir: &tempfile::TempDir| {
        one_route(
            "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"adm\"",
            "push",
            &format!("dir = \"{}\"\ntoken = \"{TOKEN}\"", dir.path().display()),
        )
    };
    let l = Larder::start(&cfg(&first)).await;
    let c = client();
    put(&c, &l.url("/a"), "1").await;
    l.reload(&cfg(&second)).expect("reloads");
    let shown = |d: &tempfile::TempDir| d.path().canonicalize().unwrap().display().to_string();
    let admin = [("authorization", "Bearer adm")];
    let status = get(&c, &l.admin_url("/_larder/status"), &admin).await;
    let status: Value = serde_json::from_slice(&status.body).unwrap();
    let dirs: Vec<&str> = (status["push"].as_array().unwrap().iter())
        .map(|p| p["dir"].as_str().unwrap())
        .collect();
    assert_eq!(dirs, [shown(&second).as_str()], "{status}");
    let text = get(&c, &l.admin_url("/metrics"), &admin).await.text();
    assert!(!text.contains(&shown(&first)), "{text}");
    assert!(
        text.contains(&format!(
            "larder_push_records{{dir=\"{}\"}} 0\n",
            shown(&second)
        )),
        "{text}"
    );
}
