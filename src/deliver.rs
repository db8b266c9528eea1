//! Delivery: turning a stored [`Entry`] into a response. This is the hot path of a cache hit:
//! negotiate the encoding, answer conditionals ([`crate::http::conditional`]) and ranges, clone
//! the prepared header block, add Age and the cache-status header, hand out the shared body
//! (ranges are zero-copy slices of it). Nothing here parses stored headers or touches body bytes.
//! The response's body carries its outcome for the metrics and the access log: the cache
//! result stamped, the coding sent and the bytes it saved ([`crate::metrics::Outcome`]).

use std::time::SystemTime;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};

use crate::body::Body;
use crate::cache::Entry;
use crate::compress::{AcceptEncoding, Encoding};
use crate::http::conditional::{self, Preconditions};
use crate::metrics::CacheResult;
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
    /// The result the metrics and the access log count the response under.
    #[inline]
    pub fn result(self) -> CacheResult {
        match self {
            CacheStatus::Hit => CacheResult::Hit,
            CacheStatus::Miss => CacheResult::Miss,
            CacheStatus::Bypass => CacheResult::Bypass,
            CacheStatus::Expired => CacheResult::Expired,
            CacheStatus::Revalidated => CacheResult::Revalidated,
            CacheStatus::Stale => CacheResult::Stale,
        }
    }

    /// The field value.
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
/// Age (its age at `now`, by the cache's clock) and the cache-status header (the caching proxy,
/// the image server).
#[inline]
pub fn from_entry(
    entry: &Entry,
    method: &Method,
    req_headers: &HeaderMap,
    status: CacheStatus,
    status_header: &HeaderName,
    now: SystemTime,
) -> Response<Body> {
    respond(
        entry,
        method,
        req_headers,
        Some((status, status_header, now)),
    )
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
    stamp: Option<(CacheStatus, &HeaderName, SystemTime)>,
) -> Response<Body> {
    let fields = RequestFields::scan(req_headers);
    let accept = AcceptEncoding::parse(fields.accept_encoding);
    let mut enc = accept.choose(entry.by_size());
    let variant = match entry.variant(enc) {
        Some(v) => v,
        None => {
            enc = *entry
                .by_size()
                .first()
                .expect("an entry has at least one variant");
            entry.variant(enc).expect("by_size names stored variants")
        }
    };
    let mark = |h: &mut HeaderMap| {
        if let Some((status, name, now)) = stamp {
            let age = age_value(entry.freshness.current_age(now).as_secs());
            set(h, &header::AGE, age);
            set(h, name, status.header_value());
        }
    };
    let result = stamp.map_or(CacheResult::None, |(status, _, _)| status.result());
    let noted = |mut r: Response<Body>| {
        r.body_mut().outcome_mut().set_cache(result);
        r
    };

    let decided = conditional::evaluate(&fields.pre, method, &variant.head, entry.last_modified);
    if let Some(mut r) = decided.response(&variant.head) {
        mark(r.headers_mut());
        return noted(r);
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
                return noted(r);
            }
            Decision::Partial(ranges) => {
                let mut head = variant.head.clone();
                mark(&mut head);
                return noted(range::partial(
                    &ranges,
                    len,
                    head,
                    range::Source::Bytes(variant.body.clone()),
                    false,
                ));
            }
        }
    }

    let mut body = if *method == Method::HEAD {
        Body::empty()
    } else {
        let sent = variant.body.len();
        let saved = entry
            .variant(Encoding::Identity)
            .map_or(0, |i| i.body.len().saturating_sub(sent));
        // A coding larder does not know is stored as the identity body, as it came.
        let coding = match entry.opaque {
            true => crate::metrics::OTHER_CODING,
            false => enc as usize,
        };
        let mut body = Body::full(variant.body.clone());
        body.outcome_mut().set_delivered(coding, saved as u64);
        body
    };
    body.outcome_mut().set_cache(result);
    let mut resp = Response::new(body);
    *resp.status_mut() = entry.status;
    let headers = resp.headers_mut();
    *headers = variant.head.clone();
    mark(headers);
    resp
}

/// Sets `name` to `value` in `h`: in place when the field is there (the placeholders a cached
/// entry's block holds, see `Entry::reserve_stamp`), which costs a lookup where `insert` also
/// makes room, takes the old value out and clears repeated lines.
#[inline]
fn set(h: &mut HeaderMap, name: &HeaderName, value: HeaderValue) {
    match h.get_mut(name) {
        Some(v) => *v = value,
        None => {
            h.insert(name.clone(), value);
        }
    }
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

/// The request fields a delivery looks at, found in one pass over the request's fields: most
/// requests carry none of them, and a hashed lookup for each would cost more than the pass.
/// A repeated field counts by its first line, as `HeaderMap::get` would.
#[derive(Default)]
struct RequestFields<'a> {
    accept_encoding: Option<&'a HeaderValue>,
    pre: Preconditions<'a>,
    range: bool,
}

impl<'a> RequestFields<'a> {
    #[inline]
    fn scan(req: &'a HeaderMap) -> RequestFields<'a> {
        let mut f = RequestFields::default();
        for (name, value) in req {
            let slot = if name == header::ACCEPT_ENCODING {
                &mut f.accept_encoding
            } else if let Some(slot) = f.pre.slot(name) {
                slot
            } else {
                f.range |= name == header::RANGE;
                continue;
            };
            slot.get_or_insert(value);
        }
        f
    }
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
        assert_eq!(f.pre.if_none_match.unwrap(), "\"a\"");
        assert_eq!(f.accept_encoding.unwrap(), "br");
        assert!(f.range);
        assert!(f.pre.if_modified_since.is_some());
        assert!(f.pre.if_match.is_none() && f.pre.if_unmodified_since.is_none());
        let empty = HeaderMap::new();
        let f = RequestFields::scan(&empty);
        assert!(!f.range && f.accept_encoding.is_none() && f.pre.if_none_match.is_none());
    }

    /// An entry with room made for the stamp ([`Entry::reserve_stamp`]) is delivered with one
    /// Age and one cache-status field holding this delivery's values, in every response shape,
    /// and its copy of the header block never grows; a file entry (no stamp) gets neither.
    #[test]
    fn stamped_delivery_fills_the_reserved_fields_once() {
        use crate::cache::entry::tests_support::fresh;
        use bytes::Bytes;
        let xc = HeaderName::from_static("x-cache");
        let mut h = HeaderMap::new();
        h.insert(header::ETAG, hv("\"v\""));
        h.insert(header::CONTENT_TYPE, hv("text/plain"));
        let build = || {
            Entry::build(
                StatusCode::OK,
                h.clone(),
                vec![
                    (Encoding::Identity, Bytes::from_static(b"0123456789")),
                    (Encoding::Gzip, Bytes::from_static(b"0123")),
                ],
                fresh(),
                true,
            )
        };
        let mut stamped = build();
        stamped.reserve_stamp(&xc);
        let reserved = stamped.variant(Encoding::Gzip).unwrap().head.len();
        let derived = stamped.with_bodies(stamped.bodies());
        assert_eq!(
            derived.variant(Encoding::Gzip).unwrap().head.len(),
            reserved
        );
        let get = Method::GET;
        let cases: [&[(&str, &str)]; 4] = [
            &[],
            &[("accept-encoding", "gzip")],
            &[("if-none-match", "\"v\"")],
            &[("range", "bytes=0-1")],
        ];
        for req in cases {
            let mut rh = HeaderMap::new();
            for (k, v) in req {
                rh.insert(HeaderName::from_static(k), hv(v));
            }
            for e in [&stamped, &derived] {
                let r = from_entry(e, &get, &rh, CacheStatus::Stale, &xc, SystemTime::now());
                let h = r.headers();
                assert_eq!(h.get_all(&xc).iter().count(), 1, "{req:?}");
                assert_eq!(h[&xc], "STALE", "{req:?}");
                assert_eq!(h.get_all(header::AGE).iter().count(), 1, "{req:?}");
                if r.status() == StatusCode::OK {
                    assert!(h.len() <= reserved, "{req:?}: {h:?}");
                }
            }
        }
        let plain = as_origin(&build(), &get, &HeaderMap::new());
        assert!(plain.headers().get(&xc).is_none());
        assert!(plain.headers().get(header::AGE).is_none());
    }

    #[test]
    fn age_values() {
        assert_eq!(age_value(0), "0");
        assert_eq!(age_value(3600), "3600");
        assert_eq!(age_value(3601), "3601");
    }
}
