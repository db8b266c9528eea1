//! Fixed responses: a status and body from the config (health checks, `/ping`), prepared once
//! (serving one clones a header block and a `Bytes` handle); and the permanent redirect of a
//! plain-HTTP route to HTTPS.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};

use crate::body::Body;
use crate::config::{RedirectConfig, RespondConfig};

#[derive(Clone)]
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
        for (k, v) in &cfg.headers.0 {
            headers.insert(k.clone(), v.clone());
        }
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

/// A route's `redirect_https`: 308 to the same host, path and query over HTTPS.
#[derive(Clone)]
pub struct RedirectHttps {
    /// `:port` after the host, when the HTTPS port is not 443.
    port: String,
}

impl RedirectHttps {
    pub fn new(cfg: &RedirectConfig) -> RedirectHttps {
        let port = match cfg.port {
            Some(p) if p != 443 => format!(":{p}"),
            _ => String::new(),
        };
        RedirectHttps { port }
    }

    /// The redirect for a request to `host` (without its port) and `uri`.
    pub fn handle(&self, host: &str, uri: &http::Uri) -> Response<Body> {
        let pq = uri.path_and_query().map_or("/", |p| p.as_str());
        let location = format!("https://{host}{}{pq}", self.port);
        let location = HeaderValue::from_str(&location).ok();
        let Some(location) = location.filter(|_| !host.is_empty()) else {
            let mut r = Response::new(Body::full(Bytes::from_static(b"no host to redirect to\n")));
            *r.status_mut() = StatusCode::BAD_REQUEST;
            return r;
        };
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::PERMANENT_REDIRECT;
        r.headers_mut().insert(header::LOCATION, location);
        r.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        r
    }

    pub fn describe(&self) -> String {
        format!("redirect to https://<host>{}", self.port)
    }
}
