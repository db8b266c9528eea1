//! Delivery: turning a stored [`Entry`] into a response. This is the hot path of a cache hit:
//! negotiate the encoding, answer conditionals and ranges, clone the prepared header block, add
//! Age and the cache-status header, hand out the shared body (ranges are zero-copy slices of it).
//! Nothing here parses stored headers or touches body bytes.

use std::time::SystemTime;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};

use crate::body::Body;
use crate::cache::Entry;
use crate::compress::AcceptEncoding;
use crate::range::{self, Decision};

/// What the cache-status header says about a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStatus {
    Hit,
    Miss,
    Bypass,
    Expired,
    Revalidated,
    Stale,
}

impl CacheStatus {
    pub fn header_value(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            CacheStatus::Hit => "HIT",
            CacheStatus::Miss => "MISS",
            CacheStatus::Bypass => "BYPASS",
            CacheStatus::Expired => "EXPIRED",
            CacheStatus::Revalidated => "REVALIDATED",
            CacheStatus::Stale => "STALE",
        })
    }
}

/// Builds the response for `entry` to a request with `method` and `req_headers`, stamped with
/// Age and the cache-status header (the caching proxy, the image server).
#[inline]
pub fn from_entry(
    entry: &Entry,
    method: &Method,
    req_headers: &HeaderMap,
    status: CacheStatus,
    status_header: &HeaderName,
) -> Response<Body> {
    respond(entry, method, req_headers, Some((status, status_header)))
}

/// Builds the response for `entry` as its origin would send it: no Age, no cache-status header
/// (static files held in memory).
#[inline]
pub fn as_origin(entry: &Entry, method: &Method, req_headers: &HeaderMap) -> Response<Body> {
    respond(entry, method, req_headers, None)
}

#[inline]
fn respond(
    entry: &Entry,
    method: &Method,
    req_headers: &HeaderMap,
    stamp: Option<(CacheStatus, &HeaderName)>,
) -> Response<Body> {
    let fields = RequestFields::scan(req_headers);
    let accept = AcceptEncoding::parse(fields.accept_encoding);
    let enc = accept.choose(entry.by_size());
    let variant = entry
        .variant(enc)
        .or_else(|| entry.by_size().first().and_then(|e| entry.variant(*e)))
        .expect("an entry has at least one variant");
    let mark = |h: &mut HeaderMap| {
        if let Some((status, name)) = stamp {
            h.insert(
                header::AGE,
                age_value(entry.freshness.current_age(SystemTime::now()).as_secs()),
            );
            h.insert(name.clone(), status.header_value());
        }
    };

    match evaluate_conditionals(entry, &variant.head, method, &fields) {
        Conditional::Proceed => {}
        Conditional::NotModified => {
            let mut r = not_modified(&variant.head);
            mark(r.headers_mut());
            return r;
        }
        Conditional::PreconditionFailed => {
            let mut r = Response::new(Body::empty());
            *r.status_mut() = StatusCode::PRECONDITION_FAILED;
            mark(r.headers_mut());
            return r;
        }
    }

    // Range requests are answered from the complete stored body (RFC 9110 §14).
    if *method == Method::GET && entry.status == StatusCode::OK && fields.range {
        let len = variant.body.len() as u64;
        match range::evaluate(
            req_headers,
            len,
            variant.head.get(header::ETAG),
            entry.last_modified,
        ) {
            Decision::Full => {}
            Decision::Unsatisfiable => {
                let mut r = range::unsatisfiable(len);
                mark(r.headers_mut());
                return r;
            }
            Decision::Partial(ranges) => {
                let mut head = variant.head.clone();
                mark(&mut head);
                return range::partial(
                    &ranges,
                    len,
                    head,
                    range::Source::Bytes(variant.body.clone()),
                    false,
                );
            }
        }
    }

    let body = if *method == Method::HEAD {
        Body::empty()
    } else {
        Body::Full(Some(variant.body.clone()))
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = entry.status;
    let headers = resp.headers_mut();
    *headers = variant.head.clone();
    mark(headers);
    resp
}

/// The Age header value; the first hour's values are prepared once, so a hit does not allocate.
#[inline]
fn age_value(secs: u64) -> HeaderValue {
    const PREPARED: u64 = 3600;
    static TABLE: std::sync::OnceLock<Box<[HeaderValue]>> = std::sync::OnceLock::new();
    if secs > PREPARED {
        return HeaderValue::from(secs);
    }
    let table = TABLE.get_or_init(|| {
        (0..=PREPARED)
            .map(|n| HeaderValue::from_static(Box::leak(n.to_string().into_boxed_str())))
            .collect()
    });
    table[secs as usize].clone()
}

/// The outcome of a request's preconditions against a stored response (RFC 9110 §13.2.2).
enum Conditional {
    Proceed,
    NotModified,
    PreconditionFailed,
}

/// The request fields a delivery looks at, found in one pass over the request's fields: most
/// requests carry none of them, and a hashed lookup for each would cost more than the pass.
/// A repeated field counts by its first line, as `HeaderMap::get` would.
#[derive(Default)]
struct RequestFields<'a> {
    accept_encoding: Option<&'a HeaderValue>,
    if_match: Option<&'a HeaderValue>,
    if_none_match: Option<&'a HeaderValue>,
    if_modified_since: Option<&'a HeaderValue>,
    if_unmodified_since: Option<&'a HeaderValue>,
    range: bool,
}

impl<'a> RequestFields<'a> {
    #[inline]
    fn scan(req: &'a HeaderMap) -> RequestFields<'a> {
        let mut f = RequestFields::default();
        for (name, value) in req {
            let slot = if name == header::ACCEPT_ENCODING {
                &mut f.accept_encoding
            } else if name == header::IF_MATCH {
                &mut f.if_match
            } else if name == header::IF_NONE_MATCH {
                &mut f.if_none_match
            } else if name == header::IF_MODIFIED_SINCE {
                &mut f.if_modified_since
            } else if name == header::IF_UNMODIFIED_SINCE {
                &mut f.if_unmodified_since
            } else {
                f.range |= name == header::RANGE;
                continue;
            };
            slot.get_or_insert(value);
        }
        f
    }
}

fn evaluate_conditionals(
    entry: &Entry,
    head: &HeaderMap,
    method: &Method,
    req: &RequestFields<'_>,
) -> Conditional {
    let etag = || head.get(header::ETAG);
    // 1. If-Match (strong comparison).
    if let Some(im) = req.if_match {
        if !etag_list_matches(im, etag(), true) {
            return Conditional::PreconditionFailed;
        }
    } else if let Some(ius) = req.if_unmodified_since {
        // 2. If-Unmodified-Since, only without If-Match.
        if let (Some(since), Some(lm)) = (parse_date(ius), entry.last_modified) {
            if lm > since {
                return Conditional::PreconditionFailed;
            }
        }
    }
    let safe = *method == Method::GET || *method == Method::HEAD;
    // 3. If-None-Match (weak comparison).
    if let Some(inm) = req.if_none_match {
        if etag_list_matches(inm, etag(), false) {
            return if safe {
                Conditional::NotModified
            } else {
                Conditional::PreconditionFailed
            };
        }
        return Conditional::Proceed;
    }
    // 4. If-Modified-Since, only without If-None-Match, GET/HEAD only.
    if safe {
        if let Some(ims) = req.if_modified_since {
            if let (Some(since), Some(lm)) = (parse_date(ims), entry.last_modified) {
                if lm <= since {
                    return Conditional::NotModified;
                }
            }
        }
    }
    Conditional::Proceed
}

fn parse_date(v: &HeaderValue) -> Option<SystemTime> {
    httpdate::parse_http_date(v.to_str().ok()?).ok()
}

/// Whether an If-Match / If-None-Match list matches `etag` (RFC 9110 §8.8.3.2).
pub fn etag_list_matches(list: &HeaderValue, etag: Option<&HeaderValue>, strong: bool) -> bool {
    let Ok(list) = list.to_str() else {
        return false;
    };
    if list.trim() == "*" {
        return etag.is_some();
    }
    let Some(etag) = etag.and_then(|e| e.to_str().ok()) else {
        return false;
    };
    let (etag_weak, etag_opaque) = split_etag(etag);
    if strong && etag_weak {
        return false;
    }
    list.split(',').any(|candidate| {
        let (weak, opaque) = split_etag(candidate.trim());
        opaque == etag_opaque && !(strong && weak)
    })
}

fn split_etag(tag: &str) -> (bool, &str) {
    match tag.strip_prefix("W/") {
        Some(rest) => (true, rest),
        None => (false, tag),
    }
}

/// A 304 carrying the fields RFC 9110 §15.4.5 requires from the 200 it stands for.
fn not_modified(head: &HeaderMap) -> Response<Body> {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::NOT_MODIFIED;
    let h = r.headers_mut();
    for name in [
        header::CACHE_CONTROL,
        header::CONTENT_LOCATION,
        header::DATE,
        header::ETAG,
        header::EXPIRES,
        header::VARY,
        header::LAST_MODIFIED,
    ] {
        for v in head.get_all(&name) {
            h.append(name.clone(), v.clone());
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    #[test]
    fn request_fields_are_found_in_one_pass_first_line_first() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, hv("x"));
        h.append(header::IF_NONE_MATCH, hv("\"a\""));
        h.append(header::IF_NONE_MATCH, hv("\"b\""));
        h.insert(header::ACCEPT_ENCODING, hv("br"));
        h.insert(header::RANGE, hv("bytes=0-1"));
        h.insert(
            header::IF_MODIFIED_SINCE,
            hv("Sat, 21 Nov 2026 13:53:30 GMT"),
        );
        let f = RequestFields::scan(&h);
        assert_eq!(f.if_none_match.unwrap(), "\"a\"");
        assert_eq!(f.accept_encoding.unwrap(), "br");
        assert!(f.range);
        assert!(f.if_modified_since.is_some());
        assert!(f.if_match.is_none() && f.if_unmodified_since.is_none());
        let empty = HeaderMap::new();
        let f = RequestFields::scan(&empty);
        assert!(!f.range && f.accept_encoding.is_none() && f.if_none_match.is_none());
    }

    #[test]
    fn age_values() {
        assert_eq!(age_value(0), "0");
        assert_eq!(age_value(3600), "3600");
        assert_eq!(age_value(3601), "3601");
    }

    #[test]
    fn etag_comparison() {
        let strong = hv("\"a\"");
        let weak = hv("W/\"a\"");
        assert!(etag_list_matches(&hv("\"a\""), Some(&strong), true));
        assert!(etag_list_matches(&hv("W/\"a\""), Some(&strong), false));
        assert!(!etag_list_matches(&hv("W/\"a\""), Some(&strong), true));
        assert!(!etag_list_matches(&hv("\"a\""), Some(&weak), true));
        assert!(etag_list_matches(&hv("\"b\", \"a\""), Some(&weak), false));
        assert!(etag_list_matches(&hv("*"), Some(&weak), false));
        assert!(!etag_list_matches(&hv("*"), None, false));
    }
}
