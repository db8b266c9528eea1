//! Fixed answers (nginx's `return`, pingap's `mock`): a rule that answers at ① with a set
//! status, content type and body; the handler never sees the request.

use http::{Request, Response};

use crate::body::{Body, RequestBody};
use crate::config::RespondConfig;
use crate::phases::{Cx, Step, Verdict};
use crate::respond::Respond;

/// `respond = { status, body, content_type }`.
pub struct Answer(Respond);

impl Answer {
    pub fn new(cfg: &RespondConfig) -> Answer {
        Answer(Respond::new(cfg))
    }

    /// The answer to `req` (HEAD: without its body).
    pub fn to<B>(&self, req: &Request<B>) -> Response<Body> {
        self.0.handle(req)
    }
}

impl Step for Answer {
    fn request(&self, req: &mut Request<RequestBody>, _cx: &mut Cx) -> Verdict {
        Verdict::Answer(self.to(req))
    }
}
