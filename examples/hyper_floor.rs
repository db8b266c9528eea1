//! The least a server built on hyper and tokio does per request: one thread, one
//! current-thread runtime, hyper's HTTP/1.1 connection per socket as hyper's own examples
//! write it, and a fixed 100-byte answer with the headers larder's static route sends for
//! bench/data/small.html. No routing, no cache, no parking, no watchdog. A benchmark anchor
//! beside `bench/ceiling.c` (the kernel's floor): what hyper and tokio cost on their own
//! (docs/benchmarks.md, "How it measures").
//!
//!   cargo build --release --example hyper_floor
//!   taskset -c 0 target/release/examples/hyper_floor 127.0.0.1:18101

use std::convert::Infallible;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::Response;
use hyper_util::rt::TokioIo;

/// The allocator larder's binary runs on.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const BODY: &[u8] = include_bytes!("../bench/data/small.html");

/// The fields larder's static route sends with it (Content-Length and Date are hyper's).
const HEADERS: [(HeaderName, &str); 4] = [
    (header::CONTENT_TYPE, "text/html; charset=utf-8"),
    (header::ETAG, "\"6b08c0a8.371549b9-64\""),
    (header::LAST_MODIFIED, "Thu, 26 Nov 2026 23:28:40 GMT"),
    (header::ACCEPT_RANGES, "bytes"),
];

fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:18101".into());
    // As larder does at start: 10,000 connections need more than the usual 1,024 files.
    larder::server::raise_nofile_limit();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = service_fn(|_req| async {
                    let mut r = Response::new(Full::new(Bytes::from_static(BODY)));
                    for (name, value) in HEADERS {
                        r.headers_mut()
                            .insert(name, HeaderValue::from_static(value));
                    }
                    Ok::<_, Infallible>(r)
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}
