//! CORS at the edge (pingap's `cors`, nginx's `add_header Access-Control-...` recipes), as
//! the Fetch standard's CORS protocol asks of a server:
//!
//! - a preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) is answered at
//!   ① and never reaches the handler: 204 with `Access-Control-Allow-Methods`, `-Headers`,
//!   `-Max-Age` when the origin, the method and every requested header are allowed; else 403
//!   without any `Access-Control-Allow-*` field (a browser fails the preflight either way; a
//!   403 says why in logs);
//! - every other response of the route (④) gets `Access-Control-Allow-Origin` (the request's
//!   origin echoed; `*` only for `origins = "*"` without credentials),
//!   `-Allow-Credentials` and `-Expose-Headers` when its `Origin` is allowed, and none of
//!   them (the origin server's own removed) when it is not: the edge's policy is the one in
//!   force. With a list of origins, `Vary: Origin` is appended to every response, with or
//!   without `Origin`, so that no cache hands one origin's answer to another.
//!
//! The cache stores the origin's answer without these fields (④ runs after it), so one stored
//! response serves every origin.

use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};

use crate::body::{Body, RequestBody};
use crate::config::rules::CorsConfig;
use crate::phases::{Cx, Step, Verdict};

/// `cors = { origins, methods, headers, expose, credentials, max_age }`, compiled.
pub struct Cors {
    /// None: any origin.
    origins: Option<Vec<String>>,
    methods: Vec<Method>,
    headers: Vec<HeaderName>,
    allow_methods: HeaderValue,
    allow_headers: Option<HeaderValue>,
    expose: Option<HeaderValue>,
    credentials: bool,
    max_age: Option<HeaderValue>,
}

/// What ① found, for ④: the value of `Access-Control-Allow-Origin` to send.
struct Allowed(HeaderValue);

fn joined<T: AsRef<str>>(items: &[T]) -> Option<HeaderValue> {
    let s: Vec<&str> = items.iter().map(AsRef::as_ref).collect();
    (!s.is_empty()).then(|| HeaderValue::from_str(&s.join(", ")).expect("tokens, checked at load"))
}

impl Cors {
    pub fn new(cfg: &CorsConfig) -> Cors {
        let methods: Vec<Method> = cfg.methods.iter().map(|m| m.0.clone()).collect();
        let headers: Vec<HeaderName> = cfg.headers.iter().map(|h| h.header()).collect();
        let expose: Vec<&str> = cfg.expose.iter().map(|h| h.0.as_str()).collect();
        Cors {
            origins: cfg.origins.clone(),
            allow_methods: joined(&methods.iter().map(Method::as_str).collect::<Vec<_>>())
                .expect("at least one, checked at load"),
            allow_headers: joined(&headers.iter().map(HeaderName::as_str).collect::<Vec<_>>()),
            expose: joined(&expose),
            methods,
            headers,
            credentials: cfg.credentials,
            max_age: cfg.max_age.map(|d| HeaderValue::from(d.0.as_secs())),
        }
    }

    fn id(&self) -> usize {
        self as *const Self as usize
    }

    /// The `Access-Control-Allow-Origin` for a request from `origin`, if it is allowed.
    fn allow(&self, origin: &HeaderValue) -> Option<HeaderValue> {
        match &self.origins {
            None if !self.credentials => Some(HeaderValue::from_static("*")),
            None => Some(origin.clone()),
            Some(list) => {
                let o = origin.to_str().ok()?;
                list.iter()
                    .any(|a| a.eq_ignore_ascii_case(o))
                    .then(|| origin.clone())
            }
        }
    }

    /// Whether a preflight's method and requested headers are allowed (the CORS-safelisted
    /// methods always are).
    fn permits(&self, req: &Request<RequestBody>) -> bool {
        let h = req.headers();
        let method = h
            .get(header::ACCESS_CONTROL_REQUEST_METHOD)
            .and_then(|m| Method::from_bytes(m.as_bytes()).ok());
        let Some(method) = method else { return false };
        let safelisted = matches!(method, Method::GET | Method::HEAD | Method::POST);
        if !safelisted && !self.methods.contains(&method) {
            return false;
        }
        (h.get_all(header::ACCESS_CONTROL_REQUEST_HEADERS).iter()).all(|v| {
            v.to_str().is_ok_and(|v| {
                (v.split(','))
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .all(|n| {
                        self.headers
                            .iter()
                            .any(|a| a.as_str().eq_ignore_ascii_case(n))
                    })
            })
        })
    }
}

impl Step for Cors {
    /// An earlier rule's answer (a 401, a 429) still carries the allow fields for an allowed
    /// origin, so that the page's script can read it.
    fn answered(&self, req: &Request<RequestBody>, cx: &mut Cx) {
        if let Some(a) = req
            .headers()
            .get(header::ORIGIN)
            .and_then(|o| self.allow(o))
        {
            cx.stash(self.id(), Allowed(a));
        }
    }

    fn request(&self, req: &mut Request<RequestBody>, cx: &mut Cx) -> Verdict {
        let allowed = req
            .headers()
            .get(header::ORIGIN)
            .and_then(|o| self.allow(o));
        let preflight = req.method() == Method::OPTIONS
            && req.headers().contains_key(header::ORIGIN)
            && req
                .headers()
                .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
        if preflight && (allowed.is_none() || !self.permits(req)) {
            // Refused: ④ adds no allow field (nothing stashed).
            return Verdict::Answer(crate::http::text_response(
                StatusCode::FORBIDDEN,
                "CORS preflight refused: origin, method or headers not allowed\n",
            ));
        }
        if let Some(a) = allowed {
            cx.stash(self.id(), Allowed(a));
        }
        if !preflight {
            return Verdict::Next;
        }
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::NO_CONTENT;
        let h = r.headers_mut();
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            self.allow_methods.clone(),
        );
        if let Some(v) = &self.allow_headers {
            h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, v.clone());
        }
        if let Some(v) = &self.max_age {
            h.insert(header::ACCESS_CONTROL_MAX_AGE, v.clone());
        }
        Verdict::Answer(r)
    }

    fn deliver(&self, resp: &mut Response<Body>, cx: &Cx) {
        let h = resp.headers_mut();
        match cx.stashed::<Allowed>(self.id()) {
            Some(Allowed(origin)) => {
                h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
                if self.credentials {
                    h.insert(
                        header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                        HeaderValue::from_static("true"),
                    );
                } else {
                    h.remove(header::ACCESS_CONTROL_ALLOW_CREDENTIALS);
                }
                match &self.expose {
                    Some(v) => {
                        h.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, v.clone());
                    }
                    None => {
                        h.remove(header::ACCESS_CONTROL_EXPOSE_HEADERS);
                    }
                }
            }
            None => {
                h.remove(header::ACCESS_CONTROL_ALLOW_ORIGIN);
                h.remove(header::ACCESS_CONTROL_ALLOW_CREDENTIALS);
                h.remove(header::ACCESS_CONTROL_EXPOSE_HEADERS);
            }
        }
        if self.origins.is_some() || self.credentials {
            let varies = (h.get_all(header::VARY).iter())
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .any(|t| matches!(t.trim(), "*") || t.trim().eq_ignore_ascii_case("origin"));
            if !varies {
                h.append(header::VARY, HeaderValue::from_static("Origin"));
            }
        }
    }
}
