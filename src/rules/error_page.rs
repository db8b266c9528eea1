//! Custom error pages (nginx's `error_page`, pingap's error template): at ④, a response of
//! the route whose status is listed gets the page as its body (and its content type and
//! length) whatever gave it: the origin (its body dropped, even a streamed one), larder itself
//! (a 502 when the origin is down, a 504), or another rule's answer at ① (a 403, a 429:
//! `error_page` rules run first so that ④ reaches them). The status and the other fields stay;
//! those describing the old body (its coding, validators, range) go. A HEAD gets the fields
//! without the body. The page is read when the configuration is (a file of at most 1 MiB).

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response};

use crate::body::{Body, RequestBody};
use crate::config::rules::ErrorPageConfig;
use crate::phases::{Cx, Step, Verdict};

/// `error_page = { status, file | body, content_type }`.
pub struct ErrorPage {
    status: Vec<u16>,
    page: Bytes,
    content_type: HeaderValue,
    length: HeaderValue,
}

/// ① saw a HEAD.
struct Head;

impl ErrorPage {
    pub fn new(cfg: &ErrorPageConfig) -> ErrorPage {
        ErrorPage {
            status: cfg.status.clone(),
            page: Bytes::from(cfg.body.clone()),
            content_type: cfg.content_type.0.clone(),
            length: HeaderValue::from(cfg.body.len()),
        }
    }

    fn id(&self) -> usize {
        self as *const Self as usize
    }
}

impl Step for ErrorPage {
    fn request(&self, req: &mut Request<RequestBody>, cx: &mut Cx) -> Verdict {
        if req.method() == Method::HEAD {
            cx.stash(self.id(), Head);
        }
        Verdict::Next
    }

    fn deliver(&self, resp: &mut Response<Body>, cx: &Cx) {
        if !self.status.contains(&resp.status().as_u16()) {
            return;
        }
        let outcome = resp.body().outcome();
        let mut body = match cx.stashed::<Head>(self.id()) {
            Some(_) => Body::empty(),
            None => Body::full(self.page.clone()),
        };
        *body.outcome_mut() = outcome;
        // The old body (a streamed one included) is dropped here.
        *resp.body_mut() = body;
        let h = resp.headers_mut();
        for gone in [
            header::CONTENT_ENCODING,
            header::CONTENT_RANGE,
            header::ETAG,
            header::LAST_MODIFIED,
            header::ACCEPT_RANGES,
            header::TRANSFER_ENCODING,
        ] {
            h.remove(gone);
        }
        h.insert(header::CONTENT_TYPE, self.content_type.clone());
        h.insert(header::CONTENT_LENGTH, self.length.clone());
    }
}
