//! What a proxy route passes through without caching: WebSocket (an HTTP/1.1 upgrade, then
//! bytes both ways between the client and the backend), and gRPC-style HTTP/2 exchanges with
//! trailers.

mod common;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use common::*;

/// A WebSocket backend that echoes every message, prefixed with the path it was opened on.
async fn echo_backend() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut path = String::new();
                #[allow(clippy::result_large_err)] // tungstenite's callback type.
                let cb = |req: &tokio_tungstenite::tungstenite::handshake::server::Request,
                          resp| {
                    path = req.uri().path().to_string();
                    Ok(resp)
                };
                let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(s, cb).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    let reply = match m {
                        Message::Text(t) => Message::text(format!("{path}: {t}")),
                        Message::Binary(b) => Message::Binary(b),
                        Message::Close(_) => return,
                        _ => continue,
                    };
                    if ws.send(reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn websockets_pass_through_a_caching_route() {
    let backend = echo_backend().await;
    let l = larder(PROXY, &format!("http://{backend}")).await;
    let tcp = tokio::net::TcpStream::connect(l.addr).await.unwrap();
    let url = format!("ws://{}/chat/room1", l.addr);
    let (mut ws, resp) = tokio_tungstenite::client_async(url, tcp).await.unwrap();
    assert_eq!(resp.status(), 101);
    for i in 0..20 {
        ws.send(Message::text(format!("hello {i}"))).await.unwrap();
        let m = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(m, Message::text(format!("/chat/room1: hello {i}")));
    }
    // A large binary message crosses intact, both ways.
    let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    ws.send(Message::binary(big.clone())).await.unwrap();
    let m = ws.next().await.unwrap().unwrap();
    assert_eq!(m.into_data().as_ref(), &big[..]);
    ws.close(None).await.unwrap();
    // Nothing of it is cached; the route still serves plain requests on new connections.
    assert_eq!(l.cache_entries(), 0);
}

#[tokio::test]
async fn an_upgrade_the_backend_refuses_is_an_ordinary_answer() {
    let origin = Origin::start(|_, _| Reply::ok("no websockets here").status(400)).await;
    let l = larder(PROXY, &origin.url()).await;
    let mut raw = Raw::connect(l.addr).await;
    raw.write(
        "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await;
    let r = raw.response().await;
    assert_eq!(r.status, 400);
    // The backend was asked for the upgrade, and the connection goes on serving HTTP.
    assert_eq!(origin.seen()[0].headers["upgrade"], "websocket");
    raw.write("GET /next HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(raw.response().await.status, 400);
    assert_eq!(origin.hits(), 2);
}

/// A gRPC-style exchange: HTTP/2 from the client, HTTP/2 to the backend (`http2 = true`), a
/// streamed request body, `te: trailers` passed on, and the response's trailers
/// (`grpc-status`) reaching the client.
#[tokio::test]
async fn grpc_style_trailers_pass_through() {
    use http_body_util::{BodyExt, Full, StreamBody};
    use hyper::body::Frame;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |req: http::Request<hyper::body::Incoming>| async move {
                        let te = req
                            .headers()
                            .get("te")
                            .map(|v| v.to_str().unwrap().to_string());
                        let version = req.version();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let reply = format!("{version:?} te={te:?} got {} bytes", body.len());
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", "0".parse().unwrap());
                        trailers.insert("grpc-message", "fine".parse().unwrap());
                        let frames = futures_util::stream::iter(vec![
                            Ok::<_, std::convert::Infallible>(Frame::data(bytes::Bytes::from(
                                reply,
                            ))),
                            Ok(Frame::trailers(trailers)),
                        ]);
                        let mut resp = http::Response::new(StreamBody::new(frames));
                        resp.headers_mut()
                            .insert("content-type", "application/grpc".parse().unwrap());
                        Ok::<_, std::convert::Infallible>(resp)
                    },
                );
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                        .await;
            });
        }
    });
    let l = Larder::start(&format!(
        "[[listener]]\naddr = \"127.0.0.1:0\"\n  [[listener.route]]\n  proxy = {{ pool = \"grpc\" }}\n[pool.grpc]\nbackends = [\"http://{addr}\"]\nhttp2 = true\n"
    ))
    .await;
    let c = h2_client();
    let req = http::Request::post(l.url("/pkg.Service/Method"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(bytes::Bytes::from(vec![7u8; 5000])))
        .unwrap();
    let resp = c.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/grpc");
    let collected = resp.into_body().collect().await.unwrap();
    let trailers = collected
        .trailers()
        .cloned()
        .expect("trailers reached the client");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(trailers["grpc-message"], "fine");
    assert_eq!(
        String::from_utf8_lossy(&collected.to_bytes()),
        "HTTP/2.0 te=Some(\"trailers\") got 5000 bytes"
    );
}
