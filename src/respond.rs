//! The fixed-response handler: a status and body from the config (health checks, `/ping`).
//! The whole response is prepared once; serving it clones a header block and a `Bytes` handle.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};

use crate::body::Body;
use crate::config::RespondConfig;

pub struct Respond {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Respond {
    pub fn new(cfg: &RespondConfig) -> Respond {
        let status = StatusCode::from_u16(cfg.status.get() as u16).unwrap_or(StatusCode::OK);
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, cfg.content_type.0.clone());
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(cfg.body.len()));
        Respond {
            status,
            headers,
            body: Bytes::from(cfg.body.clone()),
        }
    }

    pub fn handle<B>(&self, req: &Request<B>) -> Response<Body> {
        let body = if req.method() == Method::HEAD {
            Body::empty()
        } else {
            Body::full(self.body.clone())
        };
        let mut r = Response::new(body);
        *r.status_mut() = self.status;
        *r.headers_mut() = self.headers.clone();
        r
    }

    /// The configured body, as text (for diagnostics and tests).
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}
