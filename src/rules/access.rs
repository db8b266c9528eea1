//! Access by the client's address (nginx's `allow`/`deny`, pingap's `ip_restriction`): a
//! client outside an `allow` list, or inside a `deny` list, is answered 403.

use http::{Request, StatusCode};

use crate::body::RequestBody;
use crate::config::Cidr;
use crate::http::text_response;
use crate::phases::{Cx, Step, Verdict};

/// `allow = [...]` (`allow: true`) or `deny = [...]`.
pub struct ByAddress {
    pub nets: Vec<Cidr>,
    pub allow: bool,
}

impl Step for ByAddress {
    fn request(&self, _req: &mut Request<RequestBody>, cx: &mut Cx) -> Verdict {
        let inside = self.nets.iter().any(|n| n.contains(cx.client.ip()));
        if inside == self.allow {
            Verdict::Next
        } else {
            Verdict::Answer(text_response(StatusCode::FORBIDDEN, "forbidden\n"))
        }
    }
}
