//! Request ids (pingap's `request_id`, nginx's `$request_id`): each request gets one at ①,
//! kept from the client when it comes from a trusted address and is a sane token, made
//! otherwise (a UUIDv7: time-ordered, so ids sort by arrival). The id is `$request_id` for
//! later rules, is set on the request (so it goes upstream in the same field), is returned on
//! every response of the route (④, ①'s answers included: `request_id` rules run first), and
//! is written in the access log and the request's span (`route::Observed::finish`).

use http::{HeaderName, HeaderValue, Request, Response};

use crate::body::{Body, RequestBody};
use crate::config::rules::{RequestIdConfig, Trust};
use crate::phases::{Cx, Step, Verdict};

/// The longest id kept from a client.
pub const MAX_ID: usize = 128;

/// `request_id = { header, trust }`.
pub struct RequestId {
    header: HeaderName,
    trust: Trust,
}

impl RequestId {
    pub fn new(cfg: &RequestIdConfig) -> RequestId {
        RequestId {
            header: cfg.header.header(),
            trust: cfg.trust.clone(),
        }
    }
}

/// A client's id worth keeping: 1 to [`MAX_ID`] bytes of visible ASCII (no space, no quote, no
/// backslash: it goes in log lines and JSON as it is).
pub fn sane(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_ID
        && b.iter()
            .all(|c| c.is_ascii_graphic() && !b"\"\\".contains(c))
}

/// A new id: a UUIDv7 in its hyphenated lower-case form.
pub fn make() -> HeaderValue {
    let id = uuid::Uuid::now_v7();
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    HeaderValue::from_str(id.hyphenated().encode_lower(&mut buf)).expect("a UUID is ASCII")
}

impl Step for RequestId {
    fn request(&self, req: &mut Request<RequestBody>, cx: &mut Cx) -> Verdict {
        if cx.request_id.is_none() {
            let kept = (self.trust.trusts(cx.client.ip()))
                .then(|| req.headers().get(&self.header))
                .flatten()
                .filter(|v| sane(v))
                .cloned();
            cx.request_id = Some(kept.unwrap_or_else(make));
        }
        if let Some(id) = &cx.request_id {
            req.headers_mut().insert(self.header.clone(), id.clone());
        }
        Verdict::Next
    }

    fn deliver(&self, resp: &mut Response<Body>, cx: &Cx) {
        if let Some(id) = &cx.request_id {
            resp.headers_mut().insert(self.header.clone(), id.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_ids_are_uuid_v7_and_kept_ones_sane() {
        let a = make();
        let s = a.to_str().unwrap();
        assert_eq!(s.len(), 36);
        assert_eq!(&s[14..15], "7", "version 7: {s}");
        assert!(sane(&a));
        assert!(sane(&HeaderValue::from_static("abc-123_x.y")));
        assert!(!sane(&HeaderValue::from_static("has space")));
        assert!(!sane(&HeaderValue::from_static("a\"b")));
        assert!(!sane(&HeaderValue::from_str(&"x".repeat(129)).unwrap()));
        assert!(sane(&HeaderValue::from_str(&"x".repeat(128)).unwrap()));
        assert!(!sane(&HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap()));
    }
}
