//! Filling the cache: fetch from the upstream (conditionally when a stale entry has validators),
//! refresh on 304, fall back to stale on errors when allowed, decide storability, buffer, decode
//! once, store, and answer the client that caused the fill. A response that will not be stored
//! is passed on, or, when the client asked for a range of it, dropped for the client's own
//! request. The fill guard is completed with the stored entry, failed with the upstream's error
//! (waiters answer it too), or dropped when nothing is stored (waiters fetch for themselves).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use futures_util::StreamExt;
use http::header::{self, HeaderMap, HeaderName};
use http::{request, response, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, BodyStream, StreamBody};

use super::upstream::{self, FetchError, UpstreamBody};
use super::Proxy;
use crate::body::Body;
use crate::cache::coalesce::FillGuard;
use crate::cache::policy::{self, FetchContext};
use crate::cache::{CacheKey, Entry, Pending, Selection};
use crate::compress::Encoding;
use crate::deliver::CacheStatus;
use crate::http::fields::{self, VIA};

/// Conditional request fields a fill never forwards (the fill must get a full response).
const CONDITIONALS: [HeaderName; 6] = [
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
    header::RANGE,
];

impl Proxy {
    /// Fetches for the cache and answers the request described by `parts`.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn fill(
        &self,
        mut parts: request::Parts,
        peer: SocketAddr,
        key: CacheKey,
        guard: Option<FillGuard>,
        status: CacheStatus,
        stale: Option<Arc<Entry>>,
        request_no_store: bool,
    ) -> Response<Body> {
        let me = &self.0;
        // The client's request as it came: answers are built for it, and it goes upstream as is
        // when the client wants a range of a response that will not be stored.
        let client = super::clone_parts(&parts);
        let (client_method, client_headers) = (&client.method, &client.headers);
        let has_authorization = client_headers.contains_key(header::AUTHORIZATION);

        upstream::prepare_request(&mut parts, &me.cfg.upstream, peer);
        for h in CONDITIONALS {
            parts.headers.remove(h);
        }
        if let Some(e) = &stale {
            // §4.3.1: validate with the stored validators.
            if let Some(tag) = &e.etag {
                parts.headers.insert(header::IF_NONE_MATCH, tag.clone());
            }
            if let Some(lm) = e.headers.get(header::LAST_MODIFIED) {
                parts.headers.insert(header::IF_MODIFIED_SINCE, lm.clone());
            }
        }
        // A HEAD with nothing stored fetches the GET response so the body can be stored and
        // served. A HEAD revalidating a stored response goes through as HEAD: its answer updates
        // or invalidates the stored GET response (§4.3.5).
        let head_through = *client_method == Method::HEAD && stale.is_some();
        if !head_through {
            parts.method = Method::GET;
        }
        let request_time = SystemTime::now();
        let sent = upstream::send(
            &me.client,
            Request::from_parts(parts, Body::empty()),
            me.cfg.response_timeout.0,
            me.cfg.body_timeout.0,
        )
        .await;
        let respond = |entry: &Entry, status| {
            crate::deliver::from_entry(
                entry,
                client_method,
                client_headers,
                status,
                &me.status_header,
            )
        };
        // The origin could not be reached, timed out or broke off: nothing is stored, and the
        // waiters get the same error at once.
        let failed = |guard: Option<FillGuard>, e: FetchError| {
            if let Some(g) = guard {
                g.fail(e.clone());
            }
            me.failure(&e, stale.as_deref(), client_method, client_headers, status)
        };
        let resp = match sent {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(key = key.as_str(), error = %e, "fill failed");
                return failed(guard, e);
            }
        };
        let ctx = FetchContext {
            method: Method::GET,
            has_authorization,
            request_time,
            response_time: SystemTime::now(),
            response_instant: Instant::now(),
            request_no_store,
        };
        let (mut rparts, rbody) = resp.into_parts();
        fields::strip_hop_by_hop(&mut rparts.headers);

        if let Some(old) = &stale {
            // Revalidated: refresh the stored headers, serve the stored body (§4.3.4).
            if rparts.status == StatusCode::NOT_MODIFIED {
                let headers = refresh_headers(&old.headers, &rparts.headers);
                if let Ok(storable) = policy::storability(&ctx, old.status, &headers, &me.cache.cfg)
                {
                    let entry = Arc::new(old.refreshed(headers, storable.freshness));
                    me.cache.store.upgrade(&key, old, Arc::clone(&entry));
                    if let Some(g) = guard {
                        g.complete(Arc::clone(&entry));
                    }
                    return respond(&entry, CacheStatus::Revalidated);
                }
            }
            // §4.3.3 and RFC 5861 §4: a server error may be answered with the stale response.
            if rparts.status.is_server_error() && old.freshness.serve_on_error(Instant::now()) {
                return respond(old, CacheStatus::Stale);
            }
            if head_through {
                // §4.3.5: a 200 to the HEAD whose validators match the stored response freshens
                // it like a 304; one that does not match means the stored body is outdated.
                if rparts.status == StatusCode::OK {
                    if head_matches(old, &rparts.headers) {
                        let headers = refresh_headers(&old.headers, &rparts.headers);
                        if let Ok(storable) =
                            policy::storability(&ctx, old.status, &headers, &me.cache.cfg)
                        {
                            let entry = Arc::new(old.refreshed(headers, storable.freshness));
                            me.cache.store.upgrade(&key, old, Arc::clone(&entry));
                            if let Some(g) = guard {
                                g.complete(Arc::clone(&entry));
                            }
                            return respond(&entry, CacheStatus::Revalidated);
                        }
                    }
                    me.cache.store.remove(&key);
                }
                drop(guard);
                me.strip_private_fields(&mut rparts.headers);
                return me.tag(Response::from_parts(rparts, Body::empty()), status);
            }
        }

        let storable =
            match policy::storability(&ctx, rparts.status, &rparts.headers, &me.cache.cfg) {
                Ok(s) => s,
                Err(reason) => {
                    tracing::debug!(key = key.as_str(), reason = reason.as_str(), "not stored");
                    drop(guard);
                    if stale.is_some() {
                        me.cache.store.remove(&key);
                    }
                    return self
                        .not_stored(client, peer, rparts, Body::stream(rbody), status)
                        .await;
                }
            };

        // Buffer the body, up to the object size limit.
        let max = me.cache.store.max_object_size;
        let declared = rparts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max) {
            drop(guard);
            return self
                .not_stored(client, peer, rparts, Body::stream(rbody), status)
                .await;
        }
        let body = match buffer_up_to(rbody, max).await {
            Buffered::Complete(b) => b,
            Buffered::TooLarge(streamed) => {
                drop(guard);
                me.cache.store.remove(&key);
                return self
                    .not_stored(client, peer, rparts, streamed, status)
                    .await;
            }
            Buffered::Failed(e) => {
                tracing::debug!(key = key.as_str(), error = %e, "upstream body failed; nothing stored");
                return failed(guard, e);
            }
        };

        // Decode once if the origin sent a coding; a no-transform body keeps only its own coding.
        let coding = match rparts.headers.get(header::CONTENT_ENCODING) {
            None => Some(Encoding::Identity),
            Some(v) => v.to_str().ok().and_then(Encoding::from_content_encoding),
        };
        let mut bodies = Vec::with_capacity(4);
        match coding {
            Some(Encoding::Identity) => bodies.push((Encoding::Identity, body)),
            Some(enc) if storable.no_transform => bodies.push((enc, body)),
            Some(enc) => match me
                .cache
                .compressor
                .decode(body.clone(), enc, max as usize)
                .await
            {
                Ok(identity) => {
                    bodies.push((Encoding::Identity, identity));
                    bodies.push((enc, body));
                }
                Err(e) => {
                    tracing::debug!(key = key.as_str(), error = %e, "cannot decode; not stored");
                    drop(guard);
                    me.strip_private_fields(&mut rparts.headers);
                    return me.tag(Response::from_parts(rparts, Body::full(body)), status);
                }
            },
            // An unknown or stacked coding is stored and served exactly as the origin sent it
            // (its Content-Encoding kept, nothing re-encoded), like a no-transform body.
            None => bodies.push((Encoding::Identity, body)),
        }

        let mut headers = rparts.headers.clone();
        for name in &storable.strip {
            headers.remove(name);
        }
        let tags = parse_tags(&headers, &me.cache.cfg.tag_header.0);
        me.strip_private_fields(&mut headers);
        headers.append(header::VIA, VIA);
        let negotiated = !storable.no_transform
            && coding.is_some()
            && bodies[0].0 == Encoding::Identity
            && me
                .cache
                .compressor
                .wants(headers.get(header::CONTENT_TYPE), bodies[0].1.len());
        let mut entry = Entry::build(
            rparts.status,
            headers,
            bodies,
            storable.freshness,
            negotiated,
        );
        entry.auth_ok = storable.auth_ok;
        entry.tags = tags;
        if negotiated {
            entry.pending = Some(Pending::new());
        }
        // The requests this response answers: followers of the fill check theirs against it.
        // `Vary: *` has none (and the policy refused it already): never stored.
        let selection = Selection::of(&entry.headers, client_headers);
        let answers_anyone = selection.is_some();
        entry.selection = selection.unwrap_or_default();
        let entry = Arc::new(entry);
        if answers_anyone {
            me.cache.store.store(key.clone(), Arc::clone(&entry));
            if let Some(g) = guard {
                g.complete(Arc::clone(&entry));
            }
            if negotiated {
                me.cache.spawn_variants(key, Arc::clone(&entry));
            }
        } else if let Some(p) = &entry.pending {
            p.finish(); // not stored: no variants will come
        }
        let mut resp = me
            .deliver_settled(&entry, client_method, client_headers, status)
            .await;
        // The client that caused the fill still gets the fields not stored for others.
        for name in &storable.strip {
            for v in rparts.headers.get_all(name) {
                resp.headers_mut().append(name.clone(), v.clone());
            }
        }
        resp
    }

    /// Answers the client with a response that will not be stored. It is passed on as it
    /// comes, unless the client asked for a range of it: fetching it whole to cut a part out
    /// would pull the whole body (gigabytes for one byte, and everything before the offset when
    /// resuming), so it is dropped unread and the client's own request, Range and If-Range
    /// included, goes upstream; the origin's 206 is passed on. Not when the origin says
    /// `Accept-Ranges: none`: then the range is cut from this response's stream.
    async fn not_stored(
        &self,
        client: request::Parts,
        peer: SocketAddr,
        rparts: response::Parts,
        body: Body,
        status: CacheStatus,
    ) -> Response<Body> {
        if wants_part(&client, &rparts) {
            drop(body);
            let req = Request::from_parts(client, Body::empty());
            return Box::pin(self.forward(req, peer, status)).await;
        }
        let asked = super::Asked::of(&client.method, &client.headers);
        self.0.pass_on(rparts, body, &asked, status)
    }
}

/// Whether a client asked for part of this full response, which the origin can send alone: a
/// GET with a byte Range that applies to it (its If-Range, if any, names this response).
fn wants_part(client: &request::Parts, rparts: &response::Parts) -> bool {
    let h = &rparts.headers;
    client.method == Method::GET
        && rparts.status == StatusCode::OK
        && !h
            .get(header::ACCEPT_RANGES)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"none"))
        && super::range_against(
            client.headers.get(header::RANGE),
            client.headers.get(header::IF_RANGE),
            h,
            super::content_length(h).unwrap_or(u64::MAX),
        ) != crate::range::Decision::Full
}

/// Tags listed in the tag header (space or comma separated).
fn parse_tags(headers: &HeaderMap, name: &HeaderName) -> Box<[Box<str>]> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(|c: char| c == ',' || c.is_ascii_whitespace()))
        .filter(|t| !t.is_empty())
        .map(Box::from)
        .collect()
}

/// Headers of a stored response updated by a 304 (RFC 9111 §3.2): every field in the 304
/// replaces the stored one, except those describing the body.
/// Whether a 200 answer to a HEAD describes the stored response (§4.3.5): each validator it
/// carries (ETag, Last-Modified) equals the stored one, and its Content-Length, if any, is the
/// stored length.
fn head_matches(stored: &Entry, fresh: &HeaderMap) -> bool {
    let same = |name: HeaderName| match fresh.get(&name) {
        None => true,
        Some(v) => stored.headers.get(&name) == Some(v),
    };
    let length_ok = match fresh.get(header::CONTENT_LENGTH) {
        None => true,
        Some(v) => stored
            .variant(Encoding::Identity)
            .is_some_and(|i| v.as_bytes() == i.body.len().to_string().as_bytes()),
    };
    same(header::ETAG) && same(header::LAST_MODIFIED) && length_ok
}

fn refresh_headers(stored: &HeaderMap, fresh: &HeaderMap) -> HeaderMap {
    let mut out = stored.clone();
    let keep: [HeaderName; 4] = [
        header::CONTENT_LENGTH,
        header::CONTENT_ENCODING,
        header::CONTENT_RANGE,
        header::TRANSFER_ENCODING,
    ];
    let mut replaced: Vec<&HeaderName> = Vec::new();
    for (name, value) in fresh.iter() {
        if keep.contains(name) {
            continue;
        }
        if !replaced.contains(&name) {
            out.remove(name);
            replaced.push(name);
        }
        out.append(name.clone(), value.clone());
    }
    out
}

enum Buffered {
    Complete(Bytes),
    /// Larger than the limit: the part read so far followed by the rest, streamed.
    TooLarge(Body),
    Failed(FetchError),
}

/// Reads `body` whole if it fits in `max` bytes.
async fn buffer_up_to(mut body: UpstreamBody, max: u64) -> Buffered {
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut total: u64 = 0;
    loop {
        match body.frame().await {
            None => break,
            Some(Err(e)) => return Buffered::Failed(e),
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue; // trailers are not stored
                };
                total += data.len() as u64;
                chunks.push(data);
                if total > max {
                    let head = futures_util::stream::iter(
                        chunks
                            .into_iter()
                            .map(|c| Ok::<_, FetchError>(http_body::Frame::data(c))),
                    );
                    let rest = BodyStream::new(body);
                    return Buffered::TooLarge(Body::stream(StreamBody::new(head.chain(rest))));
                }
            }
        }
    }
    Buffered::Complete(match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.pop().expect("one chunk"),
        _ => {
            let mut v = Vec::with_capacity(total as usize);
            for c in chunks {
                v.extend_from_slice(&c);
            }
            Bytes::from(v)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn refresh_keeps_body_fields_and_replaces_others() {
        let mut stored = HeaderMap::new();
        stored.insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
        stored.insert(header::CACHE_CONTROL, HeaderValue::from_static("max-age=1"));
        stored.insert("x-old", HeaderValue::from_static("kept"));
        let mut fresh = HeaderMap::new();
        fresh.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        fresh.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("max-age=60"),
        );
        fresh.append("x-new", HeaderValue::from_static("a"));
        fresh.append("x-new", HeaderValue::from_static("b"));
        let out = refresh_headers(&stored, &fresh);
        assert_eq!(out[header::CONTENT_LENGTH], "10");
        assert_eq!(out[header::CACHE_CONTROL], "max-age=60");
        assert_eq!(out["x-old"], "kept");
        assert_eq!(out.get_all("x-new").iter().count(), 2);
    }

    #[test]
    fn tags_split_on_space_and_comma() {
        let mut h = HeaderMap::new();
        h.insert("surrogate-key", HeaderValue::from_static("a b,c  d"));
        let t = parse_tags(&h, &HeaderName::from_static("surrogate-key"));
        assert_eq!(t.len(), 4);
    }
}
