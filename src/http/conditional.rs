//! Conditional requests (RFC 9110 §13): a request's preconditions evaluated in the order of
//! §13.2.2 against the representation a handler would send, and the 304 or 412 that answers
//! them. Every handler that answers conditionals (cache hits, static files in memory or on
//! disk, image results) goes through [`evaluate`] and [`Outcome::response`].

use std::time::SystemTime;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};

use super::{date, etag};
use crate::body::Body;

/// A request's four precondition fields (§13.1), each by its first line, as `HeaderMap::get`
/// would take it.
#[derive(Debug, Default, Clone, Copy)]
pub struct Preconditions<'a> {
    pub if_match: Option<&'a HeaderValue>,
    pub if_none_match: Option<&'a HeaderValue>,
    pub if_modified_since: Option<&'a HeaderValue>,
    pub if_unmodified_since: Option<&'a HeaderValue>,
}

impl<'a> Preconditions<'a> {
    /// The preconditions of a request with these fields, found in one pass.
    pub fn of(req: &'a HeaderMap) -> Preconditions<'a> {
        let mut p = Preconditions::default();
        for (name, value) in req {
            if let Some(slot) = p.slot(name) {
                slot.get_or_insert(value);
            }
        }
        p
    }

    /// Where a field named `name` goes, if it is a precondition: lets a caller that scans the
    /// request's fields for more than these (a cache hit) fill them in its own single pass.
    #[inline]
    pub fn slot(&mut self, name: &HeaderName) -> Option<&mut Option<&'a HeaderValue>> {
        if name == header::IF_MATCH {
            Some(&mut self.if_match)
        } else if name == header::IF_NONE_MATCH {
            Some(&mut self.if_none_match)
        } else if name == header::IF_MODIFIED_SINCE {
            Some(&mut self.if_modified_since)
        } else if name == header::IF_UNMODIFIED_SINCE {
            Some(&mut self.if_unmodified_since)
        } else {
            None
        }
    }
}

/// What the preconditions decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Serve the request as if it had none.
    Proceed,
    /// 304: the client's copy is current.
    NotModified,
    /// 412.
    PreconditionFailed,
}

/// Evaluates `pre` for a `method` request against the representation whose header block is
/// `head` (its ETag is looked up only if an entity-tag precondition needs it) and whose
/// modification time is `last_modified`, in the order of RFC 9110 §13.2.2. Dates compare at
/// the one-second resolution of HTTP-dates.
#[inline]
pub fn evaluate(
    pre: &Preconditions<'_>,
    method: &Method,
    head: &HeaderMap,
    last_modified: Option<SystemTime>,
) -> Outcome {
    let etag = || head.get(header::ETAG);
    // 1. If-Match (strong comparison).
    if let Some(im) = pre.if_match {
        if !etag::list_matches(im, etag(), true) {
            return Outcome::PreconditionFailed;
        }
    } else if let Some(ius) = pre.if_unmodified_since {
        // 2. If-Unmodified-Since, only without If-Match.
        if let (Some(since), Some(lm)) = (date::parse(ius), last_modified) {
            if date::secs(lm) > date::secs(since) {
                return Outcome::PreconditionFailed;
            }
        }
    }
    let safe = *method == Method::GET || *method == Method::HEAD;
    // 3. If-None-Match (weak comparison).
    if let Some(inm) = pre.if_none_match {
        if etag::list_matches(inm, etag(), false) {
            return if safe {
                Outcome::NotModified
            } else {
                Outcome::PreconditionFailed
            };
        }
        return Outcome::Proceed;
    }
    // 4. If-Modified-Since, only without If-None-Match, GET/HEAD only.
    if safe {
        if let Some(ims) = pre.if_modified_since {
            if let (Some(since), Some(lm)) = (date::parse(ims), last_modified) {
                if date::secs(lm) <= date::secs(since) {
                    return Outcome::NotModified;
                }
            }
        }
    }
    Outcome::Proceed
}

impl Outcome {
    /// The response that answers the request when a precondition decided it (None: proceed),
    /// for a representation whose 200 would carry `head`.
    #[inline]
    pub fn response(self, head: &HeaderMap) -> Option<Response<Body>> {
        match self {
            Outcome::Proceed => None,
            Outcome::NotModified => Some(not_modified(head)),
            Outcome::PreconditionFailed => {
                let mut r = Response::new(Body::empty());
                *r.status_mut() = StatusCode::PRECONDITION_FAILED;
                Some(r)
            }
        }
    }
}

/// The fields a 304 copies from the 200 it stands for. RFC 9110 §15.4.5: Content-Location,
/// Date, ETag and Vary, Cache-Control and Expires, when the 200 would send them. Last-Modified
/// too: the RFC allows metadata that guides cache updates, and a cache uses the 304's validators
/// to find the stored responses it refreshes (RFC 9111 §4.3.4), the only validator when a
/// response has no ETag. Nothing else (no Content-Type, no Content-Length).
const NOT_MODIFIED_FIELDS: [HeaderName; 7] = [
    header::CACHE_CONTROL,
    header::CONTENT_LOCATION,
    header::DATE,
    header::ETAG,
    header::EXPIRES,
    header::VARY,
    header::LAST_MODIFIED,
];

/// A 304 carrying [`NOT_MODIFIED_FIELDS`] from `head`, every line of each.
#[cold]
fn not_modified(head: &HeaderMap) -> Response<Body> {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::NOT_MODIFIED;
    let h = r.headers_mut();
    for name in NOT_MODIFIED_FIELDS {
        for v in head.get_all(&name) {
            h.append(name.clone(), v.clone());
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    fn req(fields: &[(HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in fields {
            h.append(n.clone(), hv(v));
        }
        h
    }

    /// A representation with ETag "a", modified at 1000s past the epoch plus a fraction.
    fn head() -> (HeaderMap, Option<SystemTime>) {
        let mut h = HeaderMap::new();
        h.insert(header::ETAG, hv("\"a\""));
        h.insert(header::CONTENT_TYPE, hv("text/plain"));
        h.insert(header::CACHE_CONTROL, hv("max-age=60"));
        h.append(header::VARY, hv("Accept-Encoding"));
        h.append(header::VARY, hv("Cookie"));
        let lm = SystemTime::UNIX_EPOCH + Duration::from_millis(1_000_400);
        h.insert(header::LAST_MODIFIED, date::value(lm));
        (h, Some(lm))
    }

    fn outcome(method: Method, fields: &[(HeaderName, &str)]) -> Outcome {
        let (h, lm) = head();
        let r = req(fields);
        evaluate(&Preconditions::of(&r), &method, &h, lm)
    }

    const AT: &str = "Thu, 01 Jan 1970 00:16:40 GMT"; // 1000s: Last-Modified's second
    const BEFORE: &str = "Thu, 01 Jan 1970 00:16:39 GMT";

    #[test]
    fn preconditions_in_the_order_of_13_2_2() {
        use header::{IF_MATCH, IF_MODIFIED_SINCE, IF_NONE_MATCH, IF_UNMODIFIED_SINCE};
        use Outcome::*;
        assert_eq!(outcome(Method::GET, &[]), Proceed);
        assert_eq!(
            outcome(Method::GET, &[(IF_MATCH, "\"b\"")]),
            PreconditionFailed
        );
        assert_eq!(
            outcome(Method::GET, &[(IF_MATCH, "W/\"a\"")]),
            PreconditionFailed
        );
        assert_eq!(outcome(Method::GET, &[(IF_MATCH, "\"a\"")]), Proceed);
        // If-Unmodified-Since only without If-Match; compared by the second.
        assert_eq!(outcome(Method::GET, &[(IF_UNMODIFIED_SINCE, AT)]), Proceed);
        assert_eq!(
            outcome(Method::GET, &[(IF_UNMODIFIED_SINCE, BEFORE)]),
            PreconditionFailed
        );
        assert_eq!(
            outcome(
                Method::GET,
                &[(IF_MATCH, "\"a\""), (IF_UNMODIFIED_SINCE, BEFORE)]
            ),
            Proceed
        );
        // If-None-Match: weak comparison; 412 for an unsafe method; it overrides IMS.
        assert_eq!(
            outcome(Method::GET, &[(IF_NONE_MATCH, "W/\"a\"")]),
            NotModified
        );
        assert_eq!(outcome(Method::HEAD, &[(IF_NONE_MATCH, "*")]), NotModified);
        assert_eq!(
            outcome(Method::POST, &[(IF_NONE_MATCH, "\"a\"")]),
            PreconditionFailed
        );
        assert_eq!(
            outcome(
                Method::GET,
                &[(IF_NONE_MATCH, "\"x\""), (IF_MODIFIED_SINCE, AT)]
            ),
            Proceed
        );
        // If-Modified-Since: GET and HEAD only, by the second, a bad date ignored.
        assert_eq!(
            outcome(Method::GET, &[(IF_MODIFIED_SINCE, AT)]),
            NotModified
        );
        assert_eq!(
            outcome(Method::GET, &[(IF_MODIFIED_SINCE, BEFORE)]),
            Proceed
        );
        assert_eq!(outcome(Method::POST, &[(IF_MODIFIED_SINCE, AT)]), Proceed);
        assert_eq!(
            outcome(Method::GET, &[(IF_MODIFIED_SINCE, "yesterday")]),
            Proceed
        );
    }

    #[test]
    fn first_line_of_a_repeated_field_counts() {
        let r = req(&[
            (header::HOST, "x"),
            (header::IF_NONE_MATCH, "\"a\""),
            (header::IF_NONE_MATCH, "\"b\""),
        ]);
        let p = Preconditions::of(&r);
        assert_eq!(p.if_none_match.unwrap(), "\"a\"");
        assert!(p.if_match.is_none() && p.if_modified_since.is_none());
    }

    #[test]
    fn a_304_carries_the_fields_of_15_4_5_and_nothing_else() {
        let (h, _) = head();
        let r = Outcome::NotModified.response(&h).unwrap();
        assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
        let got = r.headers();
        assert_eq!(got[header::ETAG], "\"a\"");
        assert_eq!(got[header::CACHE_CONTROL], "max-age=60");
        assert_eq!(got.get_all(header::VARY).iter().count(), 2);
        assert!(got.contains_key(header::LAST_MODIFIED));
        assert!(!got.contains_key(header::CONTENT_TYPE));
        let r = Outcome::PreconditionFailed.response(&h).unwrap();
        assert_eq!(r.status(), StatusCode::PRECONDITION_FAILED);
        assert!(r.headers().is_empty());
        assert!(Outcome::Proceed.response(&h).is_none());
    }
}
