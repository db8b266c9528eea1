//! Forward auth (nginx's `auth_request`, Traefik's ForwardAuth): the request waits at ① while
//! an auth service is asked (a GET of its URL with the chosen request headers and
//! `X-Forwarded-Method`, `-Proto`, `-Host`, `-Uri`, `-For`). A 2xx lets it through, the chosen
//! answer headers copied onto it (replacing what the client sent under those names); a 401 or
//! 403 is the client's answer (with the service's `WWW-Authenticate`, `Location`, content type
//! and body); another status is answered 403. When the service cannot be asked (a connection
//! error, a timeout, a 5xx) the request is answered 503, or let through with `fail_open`.
//!
//! An allow is remembered for `cache_for`, keyed by the SHA-256 of the `cache_by` headers'
//! values (in a bounded map: the oldest go first), so a client with the same credentials does
//! not cost a subrequest each time; a refusal is never remembered.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{header, HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};

use super::subrequest::{self, Got};
use crate::body::{Body, RequestBody};
use crate::clock::Clock;
use crate::config::rules_auth::ForwardAuthConfig;
use crate::http::text_response;
use crate::phases::{Cx, Edit, Step, Verdict};
use crate::upstream::connect::Client;

/// The most of the auth service's answer body read (what a 401/403 shows the client).
const MAX_ANSWER: usize = 64 << 10;

/// The headers copied on an allow: (name, value) for each present in the service's answer.
type Copied = Arc<[(HeaderName, HeaderValue)]>;

/// `forward_auth = { ... }`.
pub struct ForwardAuth {
    inner: Arc<Inner>,
}

struct Inner {
    url: http::Uri,
    client: Option<Client>,
    request_headers: Vec<HeaderName>,
    response_headers: Vec<HeaderName>,
    cache_for: Duration,
    cache_by: Vec<HeaderName>,
    /// Allows remembered: key -> (until, headers to copy).
    allowed: quick_cache::sync::Cache<[u8; 32], (SystemTime, Copied)>,
    fail_open: bool,
    timeout: Duration,
    clock: Clock,
}

impl ForwardAuth {
    pub fn new(cfg: &ForwardAuthConfig, clock: &Clock) -> ForwardAuth {
        let client = subrequest::client_for(&cfg.url)
            .inspect_err(
                |e| tracing::warn!(url = %cfg.url, error = %e, "an auth service cannot be asked"),
            )
            .ok();
        let names = |v: &[crate::config::HeaderNameCfg]| v.iter().map(|f| f.0.clone()).collect();
        ForwardAuth {
            inner: Arc::new(Inner {
                url: cfg.url.clone(),
                client,
                request_headers: names(&cfg.request_headers),
                response_headers: names(&cfg.response_headers),
                cache_for: cfg.cache_for.0,
                cache_by: names(cfg.cache_by.as_deref().unwrap_or(&cfg.request_headers)),
                allowed: quick_cache::sync::Cache::new(cfg.cache_entries.as_usize().max(1)),
                fail_open: cfg.fail_open,
                timeout: cfg.timeout.0,
                clock: clock.clone(),
            }),
        }
    }
}

impl Inner {
    /// The key of a remembered allow: every `cache_by` header's values, in order.
    fn key(&self, headers: &HeaderMap) -> [u8; 32] {
        let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
        for name in &self.cache_by {
            ctx.update(name.as_str().as_bytes());
            for v in headers.get_all(name) {
                ctx.update(b"\0");
                ctx.update(v.as_bytes());
            }
            ctx.update(b"\n");
        }
        let mut out = [0; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        out
    }

    /// The subrequest's header fields for `req` from `client`.
    fn ask(&self, req: &Request<RequestBody>, cx: &Cx) -> HeaderMap {
        let mut h = HeaderMap::new();
        for name in &self.request_headers {
            for v in req.headers().get_all(name) {
                h.append(name.clone(), v.clone());
            }
        }
        let seen = super::vars::Seen::of(req);
        let fields = [
            ("x-forwarded-method", req.method().as_str().to_string()),
            (
                "x-forwarded-proto",
                crate::http::fields::scheme(req.extensions()).to_string(),
            ),
            ("x-forwarded-host", seen.host().to_string()),
            (
                "x-forwarded-uri",
                req.uri()
                    .path_and_query()
                    .map_or("/", |p| p.as_str())
                    .to_string(),
            ),
            ("x-forwarded-for", cx.client.ip().to_string()),
        ];
        for (name, value) in fields {
            if let Ok(v) = HeaderValue::from_str(&value) {
                h.insert(HeaderName::from_static(name), v);
            }
        }
        h
    }

    /// The headers to copy from an allowing answer.
    fn copied(&self, answer: &HeaderMap) -> Copied {
        (self.response_headers.iter())
            .filter_map(|n| answer.get(n).map(|v| (n.clone(), v.clone())))
            .collect()
    }

    /// Refused or failed: the client's answer, unless `fail_open` lets a failure through.
    /// (An answer as the error, as the phases' own `Waiting` has it.)
    #[allow(clippy::result_large_err)]
    fn decide(&self, got: Result<Got, String>) -> Result<Option<Copied>, Response<Body>> {
        let got = match got {
            Ok(g) if g.status.is_server_error() => Err(format!("answered {}", g.status)),
            other => other,
        };
        match got {
            Ok(g) if g.status.is_success() => Ok(Some(self.copied(&g.headers))),
            Ok(g) if g.status == StatusCode::UNAUTHORIZED || g.status == StatusCode::FORBIDDEN => {
                let mut r = Response::new(Body::full(g.body));
                *r.status_mut() = g.status;
                for name in [
                    header::WWW_AUTHENTICATE,
                    header::CONTENT_TYPE,
                    header::LOCATION,
                    header::SET_COOKIE,
                ] {
                    for v in g.headers.get_all(&name) {
                        r.headers_mut().append(name.clone(), v.clone());
                    }
                }
                Err(r)
            }
            Ok(g) => {
                tracing::debug!(status = %g.status, url = %self.url, "an auth service answered neither allow nor refusal: denied");
                Err(text_response(StatusCode::FORBIDDEN, "forbidden\n"))
            }
            Err(e) => {
                tracing::warn!(url = %self.url, error = %e, fail_open = self.fail_open, "an auth service could not be asked");
                if self.fail_open {
                    Ok(None)
                } else {
                    Err(text_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "authentication is not available\n",
                    ))
                }
            }
        }
    }
}

/// Sets the copied headers on the request (the client's own under those names removed first).
fn apply(
    names: &[HeaderName],
    copied: &[(HeaderName, HeaderValue)],
    req: &mut Request<RequestBody>,
) {
    for n in names {
        req.headers_mut().remove(n);
    }
    for (n, v) in copied {
        req.headers_mut().append(n.clone(), v.clone());
    }
}

impl Step for ForwardAuth {
    fn request(&self, req: &mut Request<RequestBody>, cx: &mut Cx) -> Verdict {
        let me = &self.inner;
        let key = (!me.cache_for.is_zero()).then(|| me.key(req.headers()));
        if let Some((until, copied)) = key.and_then(|k| me.allowed.get(&k)) {
            if me.clock.now() < until {
                apply(&me.response_headers, &copied, req);
                return Verdict::Next;
            }
        }
        let headers = me.ask(req, cx);
        let me = Arc::clone(me);
        Verdict::Wait(Box::pin(async move {
            let got = match &me.client {
                Some(c) => subrequest::get(c, &me.url, headers, me.timeout, MAX_ANSWER).await,
                None => Err("no client for its URL".to_string()),
            };
            let copied = me.decide(got)?;
            let Some(copied) = copied else {
                // Let through by `fail_open`: nothing copied, nothing remembered.
                let names = me.response_headers.clone();
                return Ok(Some(
                    Box::new(move |req: &mut Request<RequestBody>, _: &mut Cx| {
                        apply(&names, &[], req)
                    }) as Edit,
                ));
            };
            if let Some(k) = key {
                let until = me.clock.now() + me.cache_for;
                me.allowed.insert(k, (until, Arc::clone(&copied)));
            }
            let names = me.response_headers.clone();
            Ok(Some(
                Box::new(move |req: &mut Request<RequestBody>, _: &mut Cx| {
                    apply(&names, &copied, req)
                }) as Edit,
            ))
        }))
    }
}
