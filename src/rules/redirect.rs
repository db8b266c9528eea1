//! Redirects (nginx's `return 301 URL` and `rewrite ... permanent`, pingap's `redirect`):
//! answered at ① with the rule's status (301 by default) and a `Location` rendered from its
//! template (a path, or an absolute URL; `$1`, `${name}`, `$host`, `$request_uri`, ...). The
//! request's query is appended (`query = "keep"`, the default) unless the template names
//! `$request_uri` or `$args`, which hold it already; `query = "drop"` leaves it out. Bytes
//! outside visible ASCII in the rendered target (a raw UTF-8 path captured, a space, a control
//! byte) are percent-encoded, as a URI wants them: the `Location` is always a valid field, and
//! no variable can end its line. (Should one still not be, it is never sent: a 500.)

use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};

use super::rewrite::with_query;
use super::vars::{render, Seen};
use crate::body::{Body, RequestBody};
use crate::config::rules::{Piece, QueryMode, RedirectRule, Template, Var};
use crate::http::text_response;
use crate::phases::{Cx, Step, Verdict};

/// What a `Location` carries percent-encoded: controls, space, DEL (and every non-ASCII byte).
const OUTSIDE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b' ');

/// `redirect = { to, status, query }`.
pub struct Redirect {
    to: Template,
    status: StatusCode,
    query: QueryMode,
}

impl Redirect {
    pub fn new(cfg: &RedirectRule) -> Redirect {
        let has_query = cfg
            .to
            .parts
            .iter()
            .any(|p| matches!(p, Piece::Var(Var::RequestUri | Var::Args)));
        Redirect {
            to: cfg.to.clone(),
            status: StatusCode::from_u16(cfg.status.0).expect("a redirect status"),
            query: if has_query {
                QueryMode::Drop
            } else {
                cfg.query
            },
        }
    }
}

impl Step for Redirect {
    fn request(&self, req: &mut Request<RequestBody>, cx: &mut Cx) -> Verdict {
        let mut to = String::new();
        render(&self.to, Some(Seen::of(req)), cx, &mut to);
        let to = with_query(to, req.uri().query(), self.query);
        let to = percent_encoding::percent_encode(to.as_bytes(), OUTSIDE).to_string();
        let Ok(location) = HeaderValue::from_str(&to) else {
            tracing::warn!(
                template = self.to.source.as_str(),
                "a redirect's Location is not a valid field value: not sent"
            );
            return Verdict::Answer(text_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the redirect's target is not valid\n",
            ));
        };
        let mut r = Response::new(Body::empty());
        *r.status_mut() = self.status;
        r.headers_mut().insert(header::LOCATION, location);
        r.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        Verdict::Answer(r)
    }
}
