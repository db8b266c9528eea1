//! Why an upstream exchange failed ([`FetchError`]), and the short answer a client gets for it.
//! It lives here, below the cache and the proxy, because a failed fill hands it to the requests
//! that waited on it (`cache::coalesce`).

use std::time::Duration;

use http::{Response, StatusCode};

use super::text_response;
use crate::body::Body;

/// Which backend answered a request and how long its response head took, carried in the
/// extensions of the response larder passes on or builds from it (the access log's
/// `upstream_addr` and `upstream_time`, nginx's `$upstream_addr` and
/// `$upstream_response_time`). Only responses fetched carry it: a hit has none.
#[derive(Debug, Clone)]
pub struct Upstreamed {
    /// The backend's `host:port`.
    pub addr: std::sync::Arc<str>,
    /// From sending the request (the first try's, when it was retried) to the response head.
    pub time: Duration,
}

/// Why an upstream exchange failed. The text (for the log) carries the detail: hyper's error
/// chain, addresses. The client gets [`FetchError::response`], a short fixed text. Cloned for
/// every request waiting on a failed fill.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FetchError {
    #[error("cannot connect to upstream {0}")]
    Connect(String),
    #[error("upstream did not answer within {0:?}")]
    Timeout(Duration),
    #[error("upstream failed: {0}")]
    Upstream(String),
    #[error("upstream body failed: {0}")]
    Body(String),
    #[error("upstream body stalled: nothing received for {0:?}")]
    BodyTimeout(Duration),
    /// The client's request body broke off (malformed chunks, the client gone) while it was
    /// being forwarded.
    #[error("request body broke off: {0}")]
    RequestBody(String),
    /// The client's request body went past the route's `max_body` while it was being
    /// forwarded (a body without a length, counted as it streamed).
    #[error("request body larger than the route's max_body")]
    RequestTooLarge,
}

impl FetchError {
    /// 504 for a timeout, 400 for the client's broken body, 413 for one too large, 502 for everything else, with a
    /// short text that names the failure and nothing of hyper's or the network's.
    pub fn response(&self) -> Response<Body> {
        let (status, text) = match self {
            FetchError::Connect(_) => (StatusCode::BAD_GATEWAY, "cannot connect to the upstream\n"),
            FetchError::Timeout(_) => (
                StatusCode::GATEWAY_TIMEOUT,
                "the upstream did not answer in time\n",
            ),
            FetchError::Upstream(_) => (StatusCode::BAD_GATEWAY, "the upstream exchange failed\n"),
            FetchError::Body(_) => (
                StatusCode::BAD_GATEWAY,
                "the upstream's response broke off\n",
            ),
            FetchError::BodyTimeout(_) => (
                StatusCode::GATEWAY_TIMEOUT,
                "the upstream's response stalled\n",
            ),
            FetchError::RequestBody(_) => (StatusCode::BAD_REQUEST, "request body broken off\n"),
            FetchError::RequestTooLarge => {
                (StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n")
            }
        };
        text_response(status, text)
    }
}
