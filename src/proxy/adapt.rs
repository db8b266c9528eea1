//! Response adaptation: a response that is not delivered from the store (passed, or not
//! stored) on its way to the client: larder's private fields removed, Via added, one range cut
//! from a full 200, a coding the client does not accept decoded, an identity body compressed on
//! the fly.

use http::header::{self, HeaderValue};
use http::{Method, Response, StatusCode};

use super::Inner;
use crate::body::Body;
use crate::deliver::CacheStatus;
use crate::http::fields::VIA;

/// What the client asked of a response that is passed on rather than delivered from the store,
/// taken before its request goes upstream: the method, and the fields the response is adapted
/// to.
pub(super) struct Asked {
    head: bool,
    accept: Option<HeaderValue>,
    range: Option<HeaderValue>,
    if_range: Option<HeaderValue>,
}

impl Asked {
    pub(super) fn of(method: &Method, headers: &http::HeaderMap) -> Asked {
        let get = |name| headers.get(name).cloned();
        Asked {
            head: *method == Method::HEAD,
            accept: get(header::ACCEPT_ENCODING),
            range: (*method == Method::GET)
                .then(|| get(header::RANGE))
                .flatten(),
            if_range: get(header::IF_RANGE),
        }
    }
}

impl Inner {
    /// A response that is not delivered from the store, on its way to the client: larder's
    /// private fields removed, Via added, then adapted to what the client asked: one range cut
    /// from a full 200 the origin sent despite the client's Range (the upstream dropped once it
    /// is sent), or else a coding the client does not accept decoded, an identity body
    /// compressed on the fly.
    pub(super) fn pass_on(
        &self,
        mut rparts: http::response::Parts,
        body: Body,
        asked: &Asked,
        status: CacheStatus,
    ) -> Response<Body> {
        use crate::range::{self, Decision};
        self.strip_private_fields(&mut rparts.headers);
        rparts.headers.append(header::VIA, VIA);
        let body = if asked.head { Body::empty() } else { body };
        match range_to_cut(&rparts, asked) {
            (Decision::Partial(ranges), Some(len)) if ranges.len() == 1 => {
                rparts.status = StatusCode::PARTIAL_CONTENT;
                let body = range::slice_stream(ranges[0], len, &mut rparts.headers, body);
                return self.tag(Response::from_parts(rparts, body), status);
            }
            (Decision::Unsatisfiable, Some(len)) => {
                return self.tag(range::unsatisfiable(len), status);
            }
            // Several ranges get the whole 200 (a server may ignore Range, RFC 9110 §14.2).
            _ => {}
        }
        let body = self.recode(&mut rparts, body, asked);
        self.tag(Response::from_parts(rparts, body), status)
    }

    /// Adapts the content coding of a response passed on to the client's Accept-Encoding: a
    /// coding it does not accept (RFC 9110 §12.5.3; no Accept-Encoding counts as identity only,
    /// as for stored responses) is decoded while streaming; an identity body is compressed on
    /// the fly if it accepts a coding. Never under `no-transform` (§7.7), never a partial body,
    /// and a coding larder does not know is passed as sent. The headers are set even for HEAD.
    fn recode(&self, rparts: &mut http::response::Parts, body: Body, asked: &Asked) -> Body {
        use crate::compress::{AcceptEncoding, Encoding};
        let h = &rparts.headers;
        let Some(coded) = h.get(header::CONTENT_ENCODING) else {
            return if asked.head {
                body
            } else {
                self.compress_on_the_fly(rparts, body, asked.accept.as_ref())
            };
        };
        let decodable = coded
            .to_str()
            .ok()
            .and_then(Encoding::from_content_encoding)
            .filter(|e| {
                *e != Encoding::Identity
                    && !AcceptEncoding::parse(asked.accept.as_ref()).accepts(*e)
                    && !matches!(rparts.status.as_u16(), 100..=199 | 204 | 206 | 304)
                    && !h.contains_key(header::CONTENT_RANGE)
                    && !crate::cache::policy::CacheControl::from_headers(h, &header::CACHE_CONTROL)
                        .no_transform
            });
        let Some(enc) = decodable else {
            return body;
        };
        let empty = content_length(h) == Some(0);
        mark_recoded(&mut rparts.headers, Encoding::Identity);
        if asked.head || empty {
            body
        } else {
            crate::compress::decode_stream(body, enc)
        }
    }

    /// Compresses a response that is not stored, per request, when the client accepts a coding,
    /// the origin sent none, the type is compressible and `no-transform` does not forbid it.
    fn compress_on_the_fly(
        &self,
        rparts: &mut http::response::Parts,
        body: Body,
        accept: Option<&http::HeaderValue>,
    ) -> Body {
        let compressor = self.cache.compressor();
        let h = &rparts.headers;
        let len = content_length(h).map_or(usize::MAX, |n| n as usize);
        let eligible = compressor.config().dynamic
            && accept.is_some()
            && matches!(rparts.status.as_u16(), 200..=203)
            && !h.contains_key(header::CONTENT_ENCODING)
            && !h.contains_key(header::CONTENT_RANGE)
            && compressor.wants(h.get(header::CONTENT_TYPE), len)
            && !h
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
            && !crate::cache::policy::CacheControl::from_headers(h, &header::CACHE_CONTROL)
                .no_transform;
        if !eligible {
            return body;
        }
        let Some(enc) = crate::compress::AcceptEncoding::parse(accept).dynamic_choice() else {
            return body;
        };
        mark_recoded(&mut rparts.headers, enc);
        crate::compress::encode_stream(body, enc, compressor.config())
    }

    /// Fields meant for larder alone (targeted cache-control, tags) never go on.
    pub(super) fn strip_private_fields(&self, headers: &mut http::HeaderMap) {
        let cfg = self.cache.config();
        for f in &cfg.targeted_cache_control {
            // CDN-Cache-Control speaks to every CDN on the path (RFC 9213 §3): forwarded unless
            // configured otherwise. A field of larder's own naming is consumed here.
            if !(cfg.forward_cdn_cache_control && f.0 == "cdn-cache-control") {
                headers.remove(&f.0);
            }
        }
        headers.remove(&cfg.tag_header.0);
    }
}

/// The fields of a response whose body larder codes into `enc` (Identity: decodes) on the way:
/// Content-Encoding set, Content-Length gone (the new length is not known before the end), the
/// ETag weakened (another representation), Vary: Accept-Encoding (the body now depends on it).
fn mark_recoded(h: &mut http::HeaderMap, enc: crate::compress::Encoding) {
    h.remove(header::CONTENT_LENGTH);
    match enc.header_value() {
        Some(v) => h.insert(header::CONTENT_ENCODING, v),
        None => h.remove(header::CONTENT_ENCODING),
    };
    if !crate::cache::entry::vary_lists(h, "accept-encoding") {
        h.append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    }
    if let Some(weak) = h.get(header::ETAG).and_then(crate::http::etag::weakened) {
        h.insert(header::ETAG, weak);
    }
}

/// What to do with the client's Range on a response passed on, and the length it counts in:
/// only a 200 of known length whose bytes go to the client as they are (not decoded for it).
fn range_to_cut(
    rparts: &http::response::Parts,
    asked: &Asked,
) -> (crate::range::Decision, Option<u64>) {
    use crate::compress::{AcceptEncoding, Encoding};
    if asked.range.is_none() {
        // Nothing to cut (most requests): no header of the response is read.
        return (crate::range::Decision::Full, None);
    }
    let h = &rparts.headers;
    let decoded = h
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .and_then(Encoding::from_content_encoding)
        .is_some_and(|e| {
            e != Encoding::Identity && !AcceptEncoding::parse(asked.accept.as_ref()).accepts(e)
        });
    match content_length(h) {
        Some(len) if rparts.status == StatusCode::OK && !decoded => (
            range_against(asked.range.as_ref(), asked.if_range.as_ref(), h, len),
            Some(len),
        ),
        _ => (crate::range::Decision::Full, None),
    }
}

/// A request's Range and If-Range against a response with these headers, `len` bytes long.
pub(super) fn range_against(
    range: Option<&HeaderValue>,
    if_range: Option<&HeaderValue>,
    response: &http::HeaderMap,
    len: u64,
) -> crate::range::Decision {
    // Only If-Range compares dates.
    let last_modified = if_range
        .and(response.get(header::LAST_MODIFIED))
        .and_then(|v| v.to_str().ok())
        .and_then(crate::http::date::parse_lenient);
    crate::range::decide(
        range,
        if_range,
        len,
        response.get(header::ETAG),
        last_modified,
    )
}

/// A response's Content-Length, when it has a valid one.
pub(super) fn content_length(h: &http::HeaderMap) -> Option<u64> {
    h.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}
