//! Requests rules make of their own: forward auth's subrequest to the auth service, a JWT
//! rule's fetch of a JWKS URL. Through larder's upstream client (`upstream::connect`: its own
//! HTTP/1.1 connections, or hyper-util's client with rustls for `https://`), with a deadline and
//! a bounded answer: no other HTTP client.

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Request, StatusCode, Uri};
use http_body_util::BodyExt;

use crate::body::Body;
use crate::config::pool::{BackendConfig, PoolConfig};
use crate::upstream::connect::Client;

/// A client for the origin of `url` (keep-alive connections to it, a few kept idle).
pub fn client_for(url: &Uri) -> Result<Client, String> {
    let origin = format!(
        "{}://{}",
        url.scheme_str().unwrap_or("http"),
        url.authority().map_or("", |a| a.as_str())
    );
    let mut pool = PoolConfig::of(vec![BackendConfig::new(
        origin.parse().map_err(|e| format!("{url}: {e}"))?,
    )]);
    pool.max_idle = 16;
    Client::new(&pool)
}

/// What a subrequest got back: status, header fields and the body (at most the bytes asked).
pub struct Got {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// GETs `url` with `headers` within `timeout`, reading at most `max_body` bytes of the answer
/// (a longer one is an error).
pub async fn get(
    client: &Client,
    url: &Uri,
    headers: HeaderMap,
    timeout: Duration,
    max_body: usize,
) -> Result<Got, String> {
    let mut req = Request::get(url.clone())
        .body(Body::empty())
        .map_err(|e| e.to_string())?;
    *req.headers_mut() = headers;
    if let Some(host) = url
        .authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    {
        req.headers_mut().insert(header::HOST, host);
    }
    let exchange = async {
        let answer = client.request(req).await.map_err(|e| e.to_string())?;
        // The connection goes back to the pool once the body is read.
        let (response, _conn) = answer.into_parts();
        let (parts, body) = response.into_parts();
        let body = http_body_util::Limited::new(body, max_body)
            .collect()
            .await
            .map_err(|e| format!("its answer's body: {e}"))?
            .to_bytes();
        Ok(Got {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(got) => got,
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}
