//! The test client: hyper's pooled client over HTTP/1.1 (or h2c), requests built in one place
//! ([`request`]), responses read whole into a [`Got`]; a bare h2c connection for requests the
//! pooled client will not send; and decoding of compressed bodies.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};

/// A response as the test client received it.
#[derive(Debug)]
pub struct Got {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Got {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The X-Cache field ("HIT", "MISS"...), "" when absent.
    pub fn cache(&self) -> &str {
        self.header("x-cache").unwrap_or("")
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A field of a flat JSON object body, as text (quotes removed).
    pub fn field(&self, name: &str) -> String {
        let t = self.text();
        let at = t.find(&format!("\"{name}\":")).expect(name) + name.len() + 3;
        t[at..]
            .trim_start_matches('"')
            .split(['"', ',', '}'])
            .next()
            .unwrap()
            .to_string()
    }
}

pub type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

/// An HTTP/1.1 client with a pool large enough for the tests' bursts.
pub fn client() -> Client {
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(200)
        .build_http()
}

/// A client speaking HTTP/2 with prior knowledge (h2c).
pub fn h2_client() -> Client {
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// Sends a request and returns the response as soon as its head arrived (the body unread).
pub async fn request(
    client: &Client,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl AsRef<[u8]>,
) -> Response<Incoming> {
    let mut b = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let body = Full::new(Bytes::copy_from_slice(body.as_ref()));
    client
        .request(b.body(body).unwrap())
        .await
        .expect("larder answers")
}

/// Sends a request and reads the whole response.
pub async fn send(
    client: &Client,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl AsRef<[u8]>,
) -> Got {
    let (parts, body) = request(client, method, url, headers, body)
        .await
        .into_parts();
    Got {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.expect("body").to_bytes(),
    }
}

pub async fn get(client: &Client, url: &str, headers: &[(&str, &str)]) -> Got {
    send(client, "GET", url, headers, b"").await
}

/// Polls `url` until a response with `Content-Encoding: enc` comes (variants are built in the
/// background after a fill).
pub async fn wait_for_encoding(client: &Client, url: &str, enc: &str) {
    for _ in 0..200 {
        let g = get(client, url, &[("accept-encoding", enc)]).await;
        if g.header("content-encoding") == Some(enc) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no {enc} variant of {url} appeared");
}

/// Decodes a body of the given Content-Encoding.
pub fn decode(body: &[u8], encoding: Option<&str>) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    match encoding {
        None | Some("identity") => out.extend_from_slice(body),
        Some("gzip") => {
            flate2::read::GzDecoder::new(body)
                .read_to_end(&mut out)
                .unwrap();
        }
        Some("br") => {
            brotli::Decompressor::new(body, 4096)
                .read_to_end(&mut out)
                .unwrap();
        }
        Some("zstd") => out = zstd::stream::decode_all(body).unwrap(),
        Some(other) => panic!("unexpected encoding {other}"),
    }
    out
}

/// An HTTP/2 (prior knowledge) connection to `addr`, for requests the pooled client will not
/// send (an `:authority` other than the address, a `host` field of its own).
pub async fn h2_connection(
    addr: SocketAddr,
) -> hyper::client::conn::http2::SendRequest<http_body_util::Empty<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    h2
}
