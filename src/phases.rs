//! Request phases: the fixed points of every request's journey where a route's rules run, the
//! same for every handler (proxy, static files, images, push, fixed responses).
//!
//! ```text
//! request ─▶ route found ─▶ ① request ─▶ handler ─────────────────────────▶ ④ deliver ─▶ ⑤ log
//!                           (may answer:   │ proxy, miss or pass:               ▲
//!                            auth, limits) │ ② upstream_request ─▶ origin        │
//!                                          │ ③ upstream_response (before stored / passed on)
//!                                          └ hit, static, images, push ─────────┘
//! ```
//!
//! ① [`Step::request`] runs in `route.rs` once the route is found, before the handler sees the
//! request (before the cache lookup); an answer there ends the request. ② and ③ run in the
//! proxy, wherever a request goes upstream: the fill (`proxy/fill.rs`, before storing) and the
//! pass (`proxy/pass.rs`). ④ [`Step::deliver`] runs in `route.rs` on every response the
//! handler gives (a hit, a fill, a pass, a file, an image, a push answer, ①'s own). ⑤
//! [`Step::log`] runs where the request's completion is counted and its access-log line is
//! written (`route::Observed::finish`).
//!
//! A route's steps are compiled at load into [`Phases`]; a route with none holds `None` (an
//! `Option<Arc<Phases>>`), so a request on it checks that one `Option` at routing (and a proxy
//! route one more before each upstream exchange), never a branch per kind of rule (nginx's
//! phase handlers, pingora's `ProxyHttp` filters with do-nothing defaults, pingap's plugin
//! steps: docs/design.md, "Request phases").

use std::sync::Arc;

use http::{request, response, Request, Response};

use crate::body::{Body, RequestBody};

/// One rule's behaviour at the phases: each method does nothing unless the rule acts there.
pub trait Step: Send + Sync {
    /// ① The request has arrived and its route is found; the handler has not seen it (no cache
    /// lookup yet). The request may be changed (a rewrite, a header); an answer ends it (it
    /// still goes through ④ and ⑤).
    fn request(&self, _req: &mut Request<RequestBody>) -> Option<Response<Body>> {
        None
    }

    /// ② The proxy is about to send a request upstream (a fill, a revalidation, a pass).
    fn upstream_request(&self, _req: &mut request::Parts) {}

    /// ③ The upstream's response head has arrived (hop-by-hop fields removed), before the cache
    /// decides whether to store it and before it is passed on.
    fn upstream_response(&self, _resp: &mut response::Parts) {}

    /// ④ The response is about to go to the client, wherever it came from.
    fn deliver(&self, _resp: &mut Response<Body>) {}

    /// ⑤ The request is complete (its response head is ready), where it is counted and logged.
    fn log(&self, _resp: &Response<Body>) {}
}

/// A route's steps, in the order they run at each phase. Built only for a route that has some.
pub struct Phases {
    steps: Box<[Arc<dyn Step>]>,
}

impl Phases {
    /// The phases of a route with these steps: None when there are none (the route then pays
    /// nothing for phases).
    pub fn of(steps: Vec<Arc<dyn Step>>) -> Option<Arc<Phases>> {
        (!steps.is_empty()).then(|| {
            Arc::new(Phases {
                steps: steps.into_boxed_slice(),
            })
        })
    }

    /// ①: the first answer a step gives ends the phase.
    pub fn request(&self, req: &mut Request<RequestBody>) -> Option<Response<Body>> {
        self.steps.iter().find_map(|s| s.request(req))
    }

    /// ②.
    pub fn upstream_request(&self, req: &mut request::Parts) {
        self.steps.iter().for_each(|s| s.upstream_request(req));
    }

    /// ③.
    pub fn upstream_response(&self, resp: &mut response::Parts) {
        self.steps.iter().for_each(|s| s.upstream_response(resp));
    }

    /// ④.
    pub fn deliver(&self, resp: &mut Response<Body>) {
        self.steps.iter().for_each(|s| s.deliver(resp));
    }

    /// ⑤.
    pub fn log(&self, resp: &Response<Body>) {
        self.steps.iter().for_each(|s| s.log(resp));
    }
}
