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

use std::any::Any;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use http::{request, response, Request, Response};

use crate::body::{Body, RequestBody};
use crate::clock::Clock;

/// What a request carries through the phases of a route with steps: who sent it, which of the
/// route's steps apply to it (decided at ①, in order), what they found (a path's captures, a
/// request id, a token's claims) and what must live as long as the request (an in-flight
/// count). Made at ① (mutable there), then kept by the router for ④; shared only when
/// something else needs it: the request carries it to the handler when a step acts at ② or ③
/// (in its extensions, as `Arc<Cx>`; the proxy reads it there), the response to ⑤ when
/// something logs it.
pub struct Cx {
    /// The client's address (the real one, when the listener trusts a proxy's word for it).
    pub client: SocketAddr,
    /// Bit i: step i applies to this request (its conditions matched at ①).
    applies: u64,
    /// The captures of the last path pattern that matched (`$1`, `${name}`): index 0 is the
    /// whole match.
    pub captures: Vec<(Option<Box<str>>, Box<str>)>,
    /// The request's id (`$request_id`), when a step gave it one.
    pub request_id: Option<http::HeaderValue>,
    /// The claims of a verified token (JWT), when a step verified one.
    pub claims: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
    /// Named values steps leave for later ones (`$name`-free: e.g. the API key's name, the
    /// authenticated user), as (name, value).
    pub notes: Vec<(&'static str, Arc<str>)>,
    /// Held until the response is complete (an in-flight count's guard): dropped with the
    /// last holder of this context.
    pub holds: Vec<Box<dyn Send + Sync>>,
    /// What a step keeps for its own later phases (values rendered at ① for ④), by the step's
    /// address.
    stash: Vec<(usize, Box<dyn Any + Send + Sync>)>,
    /// The clock's monotonic reading for ①'s steps, read by the first that asks (None: not
    /// yet; again after a step waited): one clock read a request, however many steps look at
    /// the time.
    now_ns: Option<u64>,
}

impl Cx {
    /// A request's context before its steps ran.
    pub fn new(client: SocketAddr) -> Cx {
        Cx {
            client,
            applies: 0,
            captures: Vec::new(),
            request_id: None,
            claims: None,
            notes: Vec::new(),
            holds: Vec::new(),
            stash: Vec::new(),
            now_ns: None,
        }
    }

    /// [`Clock::monotonic_ns`] of `clock` (the server's, which every step holds) at ①: read
    /// once for the request, by the first step that asks.
    pub fn monotonic_ns(&mut self, clock: &Clock) -> u64 {
        *self.now_ns.get_or_insert_with(|| clock.monotonic_ns())
    }

    /// Keeps `value` for the step `owner` (its address) until its later phases.
    pub fn stash<T: Any + Send + Sync>(&mut self, owner: usize, value: T) {
        self.stash.push((owner, Box::new(value)));
    }

    /// What step `owner` kept, if it kept a `T`.
    pub fn stashed<T: Any>(&self, owner: usize) -> Option<&T> {
        (self.stash.iter())
            .find(|(o, _)| *o == owner)
            .and_then(|(_, v)| v.downcast_ref())
    }

    /// The context a request carries (its extensions), if its route has steps.
    pub fn of(req: &request::Parts) -> Option<&Arc<Cx>> {
        req.extensions.get::<Arc<Cx>>()
    }

    /// Whether step `i` applies to this request.
    fn applies(&self, i: usize) -> bool {
        self.applies & (1 << i) != 0
    }

    /// A note a step left (the first with this name).
    pub fn note(&self, name: &str) -> Option<&str> {
        self.notes
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| &**v)
    }
}

/// A change a step that waited makes to the request before the next step runs.
pub type Edit = Box<dyn FnOnce(&mut Request<RequestBody>, &mut Cx) + Send>;

/// The future of a step that must wait at ① (a subrequest to an auth service, the fleet's
/// Redis): an edit to apply, or an answer that ends the request.
pub type Waiting = Pin<Box<dyn Future<Output = Result<Option<Edit>, Response<Body>>> + Send>>;

/// What a step decides at ①.
pub enum Verdict {
    /// Go on with the next step (the request may have been changed).
    Next,
    /// Answer now; the handler never sees the request (the answer still goes through ④ and ⑤).
    Answer(Response<Body>),
    /// Wait for this future, then go on (or answer) as it says.
    Wait(Waiting),
}

/// Whether a step applies to a request: its conditions, if it has any.
pub trait Applies: Send + Sync {
    /// Checked once at ①, just before the step's `request` runs (so that what an earlier step
    /// changed, a rewritten path, is what it sees); may leave captures in `cx`.
    fn applies(&self, req: &Request<RequestBody>, cx: &mut Cx) -> bool;
}

/// One rule's behaviour at the phases: each method does nothing unless the rule acts there.
/// Only steps that apply to a request (their conditions matched at ①) run at its later phases.
pub trait Step: Send + Sync {
    /// ① The request has arrived and its route is found; the handler has not seen it (no cache
    /// lookup yet). The request may be changed (a rewrite, a header); an answer ends it (it
    /// still goes through ④ and ⑤).
    fn request(&self, _req: &mut Request<RequestBody>, _cx: &mut Cx) -> Verdict {
        Verdict::Next
    }

    /// ① was answered by an earlier step, and this step's conditions hold: it does not run at
    /// ① (it neither checks nor counts), but it runs at ④ and ⑤ on that answer, as nginx's
    /// `add_header ... always` acts on a 403. A step whose ④ reads the request (a response
    /// header with `$uri`, CORS's origin) takes what it needs here.
    fn answered(&self, _req: &Request<RequestBody>, _cx: &mut Cx) {}

    /// ② The proxy is about to send a request upstream (a fill, a revalidation, a pass).
    fn upstream_request(&self, _req: &mut request::Parts, _cx: &Cx) {}

    /// ③ The upstream's response head has arrived (hop-by-hop fields removed), before the cache
    /// decides whether to store it and before it is passed on.
    fn upstream_response(&self, _resp: &mut response::Parts, _cx: &Cx) {}

    /// ④ The response is about to go to the client, wherever it came from.
    fn deliver(&self, _resp: &mut Response<Body>, _cx: &Cx) {}

    /// ⑤ The request is complete (its response head is ready), where it is counted and logged.
    /// Runs only for a step whose [`Step::logs`] says so.
    fn log(&self, _resp: &Response<Body>, _cx: &Cx) {}

    /// Whether the step acts at ⑤: only then (or when the access log or tracing reads it) is
    /// the request's context kept in the response until it is logged.
    fn logs(&self) -> bool {
        false
    }

    /// Whether the step may act at ② or ③, or must have the request's context live as long as
    /// the handler's request (an in-flight count's guard): only then does the request carry its
    /// context to the handler (one allocation for the `Arc`, another for the request's
    /// extension map). True unless a step knows it does nothing there.
    fn upstream(&self) -> bool {
        true
    }

    /// About how many fields the step adds to a response at ④: room for all the steps' is made
    /// at once, before ④ (a cached response's header map is a clone with no room to spare).
    fn fields(&self) -> usize {
        0
    }
}

/// A step and its conditions (None: it applies to every request).
pub struct Guarded {
    pub when: Option<Box<dyn Applies>>,
    pub step: Arc<dyn Step>,
}

impl From<Arc<dyn Step>> for Guarded {
    fn from(step: Arc<dyn Step>) -> Guarded {
        Guarded { when: None, step }
    }
}

/// The most steps one route may have (a request's `Cx` holds one bit for each).
pub const MAX_STEPS: usize = 64;

/// A route's steps, in the order they run at each phase. Built only for a route that has some.
pub struct Phases {
    steps: Box<[Guarded]>,
    /// Some step acts at ⑤ ([`Step::logs`]).
    logs: bool,
    /// Some step acts at ② or ③ ([`Step::upstream`]): the request carries its context.
    upstream: bool,
    /// The fields the steps may add at ④ ([`Step::fields`]).
    fields: usize,
}

/// The end of ① on a request: go on to the handler, or answer.
pub type Decided = Result<(), Response<Body>>;

/// ① when a step had to wait: the request, its context and what was decided, later.
pub type Deciding = Pin<Box<dyn Future<Output = (Request<RequestBody>, Cx, Decided)> + Send>>;

impl Phases {
    /// The phases of a route with these steps: None when there are none (the route then pays
    /// nothing for phases). At most [`MAX_STEPS`] (the configuration checks it).
    pub fn of(steps: Vec<Guarded>) -> Option<Arc<Phases>> {
        assert!(
            steps.len() <= MAX_STEPS,
            "at most {MAX_STEPS} steps a route"
        );
        (!steps.is_empty()).then(|| {
            Arc::new(Phases {
                logs: steps.iter().any(|g| g.step.logs()),
                upstream: steps.iter().any(|g| g.step.upstream()),
                fields: steps.iter().map(|g| g.step.fields()).sum(),
                steps: steps.into_boxed_slice(),
            })
        })
    }

    /// ①, from step `from` on: each step whose conditions match runs in order; the first
    /// answer ends the phase. `Err` when a step must wait: the rest runs in the future.
    pub fn request(
        self: &Arc<Self>,
        mut req: Request<RequestBody>,
        mut cx: Cx,
    ) -> Result<(Request<RequestBody>, Cx, Decided), Deciding> {
        match self.run_from(0, &mut req, &mut cx) {
            Ok(decided) => Ok((req, cx, decided)),
            Err((wait, next)) => {
                let me = Arc::clone(self);
                Err(Box::pin(async move {
                    let mut wait = wait;
                    let mut next = next;
                    loop {
                        let waited = wait.await;
                        // Time went by: the steps after the wait read the clock again.
                        cx.now_ns = None;
                        match waited {
                            Err(answer) => return (req, cx, Err(answer)),
                            Ok(edit) => {
                                if let Some(edit) = edit {
                                    edit(&mut req, &mut cx);
                                }
                            }
                        }
                        match me.run_from(next, &mut req, &mut cx) {
                            Ok(decided) => return (req, cx, decided),
                            Err((w, n)) => (wait, next) = (w, n),
                        }
                    }
                }))
            }
        }
    }

    /// Runs ① from step `from`; a step that must wait stops it: its future and the step after.
    fn run_from(
        &self,
        from: usize,
        req: &mut Request<RequestBody>,
        cx: &mut Cx,
    ) -> Result<Decided, (Waiting, usize)> {
        for (i, g) in self.steps.iter().enumerate().skip(from) {
            if let Some(when) = &g.when {
                if !when.applies(req, cx) {
                    continue;
                }
            }
            cx.applies |= 1 << i;
            match g.step.request(req, cx) {
                Verdict::Next => {}
                Verdict::Answer(r) => {
                    self.after_answer(i + 1, req, cx);
                    return Ok(Err(r));
                }
                Verdict::Wait(w) => return Err((w, i + 1)),
            }
        }
        Ok(Ok(()))
    }

    /// ① was answered before step `from`: the later steps whose conditions hold apply to the
    /// answer at ④ and ⑤ ([`Step::answered`]).
    fn after_answer(&self, from: usize, req: &Request<RequestBody>, cx: &mut Cx) {
        for (i, g) in self.steps.iter().enumerate().skip(from) {
            if g.when.as_ref().is_none_or(|w| w.applies(req, cx)) {
                cx.applies |= 1 << i;
                g.step.answered(req, cx);
            }
        }
    }

    /// The steps that apply to the request of `cx`.
    fn applying<'a>(&'a self, cx: &'a Cx) -> impl Iterator<Item = &'a Arc<dyn Step>> + 'a {
        (self.steps.iter().enumerate())
            .filter(|(i, _)| cx.applies(*i))
            .map(|(_, g)| &g.step)
    }

    /// ②.
    pub fn upstream_request(&self, req: &mut request::Parts) {
        let Some(cx) = Cx::of(req).cloned() else {
            return;
        };
        self.applying(&cx)
            .for_each(|s| s.upstream_request(req, &cx));
    }

    /// ③, for the request `cx` (the one the exchange was for).
    pub fn upstream_response(&self, resp: &mut response::Parts, cx: Option<&Arc<Cx>>) {
        if let Some(cx) = cx {
            self.applying(cx)
                .for_each(|s| s.upstream_response(resp, cx));
        }
    }

    /// ④ (room made first for the fields the steps add: one growth of the header map, not one
    /// for each step's).
    pub fn deliver(&self, resp: &mut Response<Body>, cx: &Cx) {
        resp.headers_mut().reserve(self.fields);
        self.applying(cx).for_each(|s| s.deliver(resp, cx));
    }

    /// Whether some step acts at ⑤.
    pub fn logs(&self) -> bool {
        self.logs
    }

    /// Whether some step acts at ② or ③ (the request carries its context to the handler).
    pub fn upstream(&self) -> bool {
        self.upstream
    }

    /// ⑤, for the request whose context ④ left in the response's extensions.
    pub fn log(&self, resp: &Response<Body>) {
        if let Some(cx) = resp.extensions().get::<Arc<Cx>>() {
            self.applying(cx).for_each(|s| s.log(resp, cx));
        }
    }
}
