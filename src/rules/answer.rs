//! Fixed answers (nginx's `return`, pingap's `mock`): a rule that answers at ① with a set
//! status, content type, fields and body; the handler never sees the request. With a `switch`
//! (a maintenance page), it answers only while the admin API has that switch on, else the
//! request goes on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::{Request, Response};

use crate::admin::Switches;
use crate::body::{Body, RequestBody};
use crate::config::RespondConfig;
use crate::phases::{Cx, Step, Verdict};
use crate::respond::Respond;

/// `respond = { status, body, content_type, headers, switch }`.
pub struct Answer {
    respond: Respond,
    /// The switch's flag, when the answer has one.
    switch: Option<Arc<AtomicBool>>,
}

impl Answer {
    pub fn new(cfg: &RespondConfig, switches: &Switches) -> Answer {
        Answer {
            respond: Respond::new(cfg),
            // A full registry (names from the admin API) leaves the rule on a flag of its own,
            // off: it then never answers (and says so).
            switch: cfg.switch.as_ref().map(|s| {
                switches.flag(&s.0).unwrap_or_else(|| {
                    tracing::error!(
                        switch = s.0.as_str(),
                        "too many switches: this one stays off"
                    );
                    Arc::default()
                })
            }),
        }
    }

    /// The answer to `req` (HEAD: without its body).
    pub fn to<B>(&self, req: &Request<B>) -> Response<Body> {
        self.respond.handle(req)
    }
}

impl Step for Answer {
    fn request(&self, req: &mut Request<RequestBody>, _cx: &mut Cx) -> Verdict {
        match &self.switch {
            Some(on) if !on.load(Ordering::Relaxed) => Verdict::Next,
            _ => Verdict::Answer(self.to(req)),
        }
    }
}
