//! The request phases (`larder::phases`): a step registered on a route runs at each of its
//! points, in order, for every kind of handler: a proxy's miss, hit and pass (the upstream
//! phases too, and what they change reaching the origin and the store), static files (the
//! resolved file and the synchronous hit), images and push. Requests go through the router as
//! the server sends them (observed, routed, served, completed), to a real origin over loopback.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use common::{Origin, Reply};
use http::{HeaderValue, Request, Response};
use http_body_util::BodyExt;
use larder::body::{Body, RequestBody};
use larder::phases::{Applies, Cx, Guarded, Step, Verdict};
use larder::route::Router;

/// A test step: notes each phase it runs at, and marks what it may change there.
struct Recorder(Arc<Mutex<Vec<&'static str>>>);

impl Recorder {
    fn note(&self, phase: &'static str) {
        self.0.lock().unwrap().push(phase);
    }
}

impl Step for Recorder {
    fn request(&self, req: &mut Request<RequestBody>, _cx: &mut Cx) -> Verdict {
        self.note("request");
        req.headers_mut()
            .insert("x-step-request", HeaderValue::from_static("1"));
        Verdict::Next
    }
    fn upstream_request(&self, req: &mut http::request::Parts, _cx: &Cx) {
        self.note("upstream_request");
        // What ① added is still on the request the proxy sends.
        assert!(req.headers.contains_key("x-step-request"));
        req.headers
            .insert("x-step-upstream", HeaderValue::from_static("1"));
    }
    fn upstream_response(&self, resp: &mut http::response::Parts, _cx: &Cx) {
        self.note("upstream_response");
        resp.headers
            .insert("x-step-upstream-response", HeaderValue::from_static("1"));
    }
    fn deliver(&self, resp: &mut Response<Body>, _cx: &Cx) {
        self.note("deliver");
        resp.headers_mut()
            .insert("x-step-deliver", HeaderValue::from_static("1"));
    }
    fn logs(&self) -> bool {
        true
    }
    fn log(&self, resp: &Response<Body>, _cx: &Cx) {
        assert!(resp.headers().contains_key("x-step-deliver"), "④ before ⑤");
        self.note("log");
    }
}

/// Sends one request through `router` the way the server does, and returns the response and
/// the phases the step ran at.
async fn through(
    router: &Router,
    seen: &Mutex<Vec<&'static str>>,
    method: &str,
    path: &str,
) -> (Response<Body>, Vec<&'static str>) {
    seen.lock().unwrap().clear();
    let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "t")
        .body(RequestBody::Stream(
            http_body_util::Empty::new()
                .map_err(|e: std::convert::Infallible| -> larder::body::BoxError { match e {} })
                .boxed(),
        ))
        .unwrap();
    let mut observed = router.observe(&mut req, peer);
    assert!(observed.is_some(), "a router with phases observes requests");
    let (serving, route) = router.dispatch_route(req, peer, None);
    if let Some(o) = &mut observed {
        o.routed(route, router);
    }
    let mut resp = serving.await;
    if let Some(o) = observed {
        o.finish(&mut resp, router.metrics());
    }
    let phases = seen.lock().unwrap().clone();
    (resp, phases)
}

#[tokio::test]
async fn a_step_runs_at_every_phase_for_every_handler() {
    let origin =
        Origin::start(|_, _| Reply::ok("hello").header("cache-control", "max-age=60")).await;
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    // The route's prefix is not stripped: /s/a.txt is <root>/s/a.txt.
    std::fs::create_dir_all(files.join("s")).unwrap();
    std::fs::write(files.join("s/a.txt"), "static").unwrap();
    let text = format!(
        r#"
[[listener]]
addr = "127.0.0.1:1"
  [[listener.route]]
  path = "/p/"
  proxy = {{ upstream = "{}" }}
  [[listener.route]]
  path = "/s/"
  static = {{ root = {:?} }}
  [[listener.route]]
  path = "/img/"
  images = {{ dir = {:?} }}
  [[listener.route]]
  path = "/push/"
  push = {{ dir = {:?}, token = "t" }}
  [[listener.route]]
  path = "/plain/"
  respond = {{ body = "plain" }}
"#,
        origin.url(),
        files.display().to_string(),
        dir.path().join("img").display().to_string(),
        dir.path().join("push").display().to_string(),
    );
    let cfg = larder::config::Config::parse(&text, "t").unwrap();
    let cache = larder::cache::Cache::new(cfg.cache.clone(), cfg.compression.clone());
    let pools = larder::upstream::Pools::build(&cfg.pools, None).unwrap();
    let _stores = larder::push::open_all(&cfg).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let step: Arc<dyn Step> = Arc::new(Recorder(Arc::clone(&seen)));
    // Every route but /plain/ gets the step.
    let router = Router::with_steps(&cfg.listeners[0], &cfg.admin, &cache, None, &pools, |r| {
        if r.path.0 == "/plain/" {
            Vec::new()
        } else {
            vec![Arc::clone(&step).into()]
        }
    });

    let around = ["request", "deliver", "log"];
    let upstream = [
        "request",
        "upstream_request",
        "upstream_response",
        "deliver",
        "log",
    ];

    // Proxy: a miss goes upstream (② and ③), a hit does not, a pass does.
    let (miss, phases) = through(&router, &seen, "GET", "/p/a").await;
    assert_eq!(phases, upstream, "proxy miss");
    assert_eq!(miss.headers()["x-cache"], "MISS");
    let (hit, phases) = through(&router, &seen, "GET", "/p/a").await;
    assert_eq!(phases, around, "proxy hit");
    assert_eq!(hit.headers()["x-cache"], "HIT");
    // ③ ran before the response was stored: the hit carries what it added.
    assert!(hit.headers().contains_key("x-step-upstream-response"));
    let (pass, phases) = through(&router, &seen, "POST", "/p/a").await;
    assert_eq!(phases, upstream, "proxy pass");
    assert!(pass.headers().contains_key("x-step-upstream-response"));
    for r in [&miss, &hit, &pass] {
        assert!(r.headers().contains_key("x-step-deliver"));
    }
    // ① and ② changed what the origin was sent, on the fill and on the pass.
    let sent = origin.seen();
    assert_eq!(sent.len(), 2, "the hit did not go upstream");
    for s in &sent {
        assert_eq!(s.headers["x-step-request"], "1", "{} {}", s.method, s.path);
        assert_eq!(s.headers["x-step-upstream"], "1", "{} {}", s.method, s.path);
    }

    // Static files: the first request resolves the file, the second is the synchronous hit.
    for round in ["resolved", "hit"] {
        let (r, phases) = through(&router, &seen, "GET", "/s/a.txt").await;
        assert_eq!(r.status(), 200, "static {round}");
        assert_eq!(phases, around, "static {round}");
        assert!(r.headers().contains_key("x-step-deliver"));
    }

    // Images and push: the answer does not matter (nothing is stored there), the phases do.
    for path in ["/img/info?md5=00000000000000000000000000000000", "/push/r1"] {
        let (r, phases) = through(&router, &seen, "GET", path).await;
        assert_eq!(phases, around, "{path}");
        assert!(r.headers().contains_key("x-step-deliver"), "{path}");
    }

    // A route without steps runs none.
    let (r, phases) = through(&router, &seen, "GET", "/plain/").await;
    assert!(phases.is_empty());
    assert!(!r.headers().contains_key("x-step-deliver"));
}

/// A step that answers at ① ends the request there: the handler never runs, and the answer
/// still goes through ④ and ⑤.
#[tokio::test]
async fn an_answer_at_the_request_phase_skips_the_handler() {
    struct Refuse(Arc<Mutex<Vec<&'static str>>>);
    impl Step for Refuse {
        fn request(&self, _req: &mut Request<RequestBody>, _cx: &mut Cx) -> Verdict {
            self.0.lock().unwrap().push("request");
            let mut r = Response::new(Body::empty());
            *r.status_mut() = http::StatusCode::FORBIDDEN;
            Verdict::Answer(r)
        }
        fn deliver(&self, _resp: &mut Response<Body>, _cx: &Cx) {
            self.0.lock().unwrap().push("deliver");
        }
        fn logs(&self) -> bool {
            true
        }
        fn log(&self, _resp: &Response<Body>, _cx: &Cx) {
            self.0.lock().unwrap().push("log");
        }
    }
    let origin = Origin::start(|_, _| Reply::ok("hello")).await;
    let text = format!(
        "[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\npath = \"/\"\nproxy = {{ upstream = \"{}\" }}\n",
        origin.url()
    );
    let cfg = larder::config::Config::parse(&text, "t").unwrap();
    let cache = larder::cache::Cache::new(cfg.cache.clone(), cfg.compression.clone());
    let pools = larder::upstream::Pools::build(&cfg.pools, None).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let step: Arc<dyn Step> = Arc::new(Refuse(Arc::clone(&seen)));
    let router = Router::with_steps(&cfg.listeners[0], &cfg.admin, &cache, None, &pools, |_| {
        vec![Arc::clone(&step).into()]
    });
    let (r, phases) = through(&router, &seen, "GET", "/a").await;
    assert_eq!(r.status(), 403);
    assert_eq!(phases, ["request", "deliver", "log"]);
    assert_eq!(origin.hits(), 0);
}

/// A step that must wait at ① (a subrequest, the fleet's Redis) makes the rest of ① and the
/// handler one future: its edit reaches the later steps and the origin; its answer ends the
/// request. Steps whose conditions do not hold run at no phase.
#[tokio::test]
async fn a_waiting_step_and_conditions() {
    struct Later;
    impl Step for Later {
        fn request(&self, req: &mut Request<RequestBody>, _cx: &mut Cx) -> Verdict {
            let refuse = req.uri().path() == "/refused";
            Verdict::Wait(Box::pin(async move {
                tokio::task::yield_now().await;
                if refuse {
                    let mut r = Response::new(Body::empty());
                    *r.status_mut() = http::StatusCode::UNAUTHORIZED;
                    return Err(r);
                }
                let edit: larder::phases::Edit = Box::new(|req, cx| {
                    req.headers_mut()
                        .insert("x-waited", HeaderValue::from_static("yes"));
                    cx.notes.push(("user", "ann".into()));
                });
                Ok(Some(edit))
            }))
        }
    }
    /// Applies to paths under /only/.
    struct Only;
    impl Applies for Only {
        fn applies(&self, req: &Request<RequestBody>, _cx: &mut Cx) -> bool {
            req.uri().path().starts_with("/only/")
        }
    }
    let origin = Origin::start(|_, _| Reply::ok("hello")).await;
    let text = format!(
        "[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\npath = \"/\"\nproxy = {{ upstream = \"{}\" }}\n",
        origin.url()
    );
    let cfg = larder::config::Config::parse(&text, "t").unwrap();
    let cache = larder::cache::Cache::new(cfg.cache.clone(), cfg.compression.clone());
    let pools = larder::upstream::Pools::build(&cfg.pools, None).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorder: Arc<dyn Step> = Arc::new(Recorder(Arc::clone(&seen)));
    let router = Router::with_steps(&cfg.listeners[0], &cfg.admin, &cache, None, &pools, |_| {
        vec![
            Guarded::from(Arc::new(Later) as Arc<dyn Step>),
            Guarded {
                when: Some(Box::new(Only)),
                step: Arc::clone(&recorder),
            },
        ]
    });
    let (r, phases) = through(&router, &seen, "GET", "/only/a").await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        phases,
        [
            "request",
            "upstream_request",
            "upstream_response",
            "deliver",
            "log"
        ]
    );
    let sent = origin.seen();
    assert_eq!(
        sent[0].headers["x-waited"], "yes",
        "the waited edit reached the origin"
    );
    assert_eq!(sent[0].headers["x-step-request"], "1");
    // The recorder's conditions do not hold: it runs at no phase.
    let (r, phases) = through(&router, &seen, "GET", "/elsewhere").await;
    assert_eq!(r.status(), 200);
    assert!(phases.is_empty(), "{phases:?}");
    assert!(!r.headers().contains_key("x-step-deliver"));
    // The waiting step's answer ends the request.
    let (r, _) = through(&router, &seen, "GET", "/refused").await;
    assert_eq!(r.status(), 401);
    assert_eq!(origin.hits(), 2);
}
