//! Filling the cache, in phases:
//!
//! 1. **fetch**: the request goes upstream (conditional when a stale entry has validators);
//! 2. **revalidate** (a stale entry only): a 304, or a 200 to a HEAD that matches, refreshes the
//!    stored entry ([`Fill::refresh`], both ways); a server error may be answered stale;
//! 3. **admit**: storability (the policy), the size bound, buffering, decoding once; what is
//!    not admitted is answered without being stored, its [`NoStoreReason`] noted for the
//!    access log's `no_store` field, in the response's outcome ([`crate::metrics::Outcome`]).
//!    When the client
//!    asked for a range of it, it is dropped for the client's own request;
//! 4. **store and respond**: the entry built, stored, its compressed variants started, the
//!    client answered.
//!
//! The route's phases ([`crate::phases`]) run around the exchange: ② on the request just before
//! it goes upstream (phase 1), ③ on the response head as it arrives, before phase 2.
//!
//! The fill guard is completed with the stored entry, failed with the upstream's error (waiters
//! answer it too), or dropped when nothing is stored (waiters fetch for themselves).

use std::future::Future;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use http::header::{self, HeaderMap, HeaderName};
use http::{request, response, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, BodyStream, StreamBody};

use super::Proxy;
use crate::body::Body;
use crate::cache::coalesce::FillGuard;
use crate::cache::policy::{self, FetchContext, NoStoreReason, Storable};
use crate::cache::{CacheKey, Entry, Lease, Pending, Selection};
use crate::compress::Encoding;
use crate::deliver::CacheStatus;
use crate::http::fetch::Upstreamed;
use crate::http::fields::{self, VIA};
use crate::phases::Cx;
use crate::upstream::{FetchError, UpstreamBody};

/// Conditional request fields a fill never forwards (the fill must get a full response).
const CONDITIONALS: [HeaderName; 6] = [
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
    header::RANGE,
];

/// What a fill is asked to do.
pub(super) struct FillRequest {
    /// The client's request as it came: answers are built for it, and it goes upstream as is
    /// when the client wants a range of a response that will not be stored.
    pub client: request::Parts,
    pub peer: SocketAddr,
    pub key: CacheKey,
    /// The lead of a coalesced fill (None for a fill of the request's own).
    pub guard: Option<FillGuard>,
    /// What the client is told when its answer comes from this fetch: MISS or EXPIRED.
    pub status: CacheStatus,
    /// The stored response this fill revalidates.
    pub stale: Option<Arc<Entry>>,
    /// The request said `no-store` (§5.2.1.5): nothing is stored.
    pub request_no_store: bool,
    /// The shared tier's lease of the URL, held by this fill: released once the response is
    /// written there, or when the fill ends without storing one.
    pub lease: Option<Lease>,
}

/// A fill on its way through the phases.
struct Fill<'p> {
    proxy: &'p Proxy,
    req: FillRequest,
}

/// The outcome of admission.
enum Admission {
    /// To be stored.
    Store(Admitted),
    /// Not stored: passed on, adapted to the client.
    Pass(NoStoreReason, response::Parts, Body),
    /// Not stored, the body not decodable: passed on exactly as the origin sent it.
    AsSent(response::Parts, Bytes),
    /// The upstream body failed.
    Failed(FetchError),
}

/// A response admitted to the cache: its head, what the policy decided, and its body per
/// encoding (identity first when larder could decode the origin's coding).
struct Admitted {
    rparts: response::Parts,
    storable: Storable,
    /// The coding the origin sent, if larder knows it.
    coding: Option<Encoding>,
    bodies: Vec<(Encoding, Bytes)>,
}

impl Proxy {
    /// Fetches for the cache and answers the client's request.
    pub(super) async fn fill(&self, req: FillRequest) -> Response<Body> {
        let mut fill = Fill { proxy: self, req };
        let (ctx, resp) = match fill.fetch().await {
            Ok(fetched) => fetched,
            Err(e) => {
                tracing::debug!(key = fill.req.key.as_str(), error = %e, "fill failed");
                return fill.failed(e);
            }
        };
        let (mut rparts, rbody) = resp.into_parts();
        fields::strip_hop_by_hop(&mut rparts.headers);
        if let Some(p) = &fill.proxy.0.phases {
            p.upstream_response(&mut rparts, Cx::of(&fill.req.client));
        }
        // Who answered, for the access log, on whichever response the client gets.
        let upstreamed = rparts.extensions.get::<Upstreamed>().cloned();
        let with_upstream = move |mut r: Response<Body>| {
            if let Some(u) = upstreamed {
                r.extensions_mut().insert(u);
            }
            r
        };
        if let Some(old) = fill.req.stale.clone() {
            match fill.revalidate(&old, rparts, &ctx) {
                ControlFlow::Break(answer) => return with_upstream(answer),
                ControlFlow::Continue(full) => rparts = full,
            }
        }
        // What the policy refuses is passed on from here; what it admits is read, decoded and
        // stored by a boxed future (the larger one, kept out of every uncacheable fetch's).
        with_upstream(match fill.decide(&rparts, &ctx) {
            Ok(storable) => Box::pin(fill.read_and_store(rparts, rbody, storable)).await,
            Err(reason) => fill.pass(reason, rparts, Body::stream(rbody)).await,
        })
    }
}

impl<'p> Fill<'p> {
    /// A HEAD revalidating a stored response goes through as HEAD: its answer updates or
    /// invalidates the stored GET response (§4.3.5). Any other fill fetches the GET response
    /// (also for a HEAD with nothing stored, so the body can be stored and served).
    fn head_through(&self) -> bool {
        self.req.client.method == Method::HEAD && self.req.stale.is_some()
    }

    /// Phase 1: sends the request upstream and waits for the response head.
    async fn fetch(&self) -> Result<(FetchContext, Response<UpstreamBody>), FetchError> {
        let me = &self.proxy.0;
        let req = &self.req;
        let method = if self.head_through() {
            Method::HEAD
        } else {
            Method::GET
        };
        // One pass over the request's few fields instead of a lookup per conditional.
        let conditional = req.client.headers.keys().any(|k| CONDITIONALS.contains(k));
        // The client's head is lent as it is when the fill changes nothing in it (a GET without
        // conditionals, nothing stored to validate: every plain miss); else a copy is edited.
        let phases = me.phases.as_deref();
        let edited =
            (conditional || req.stale.is_some() || req.client.method != method || phases.is_some())
                .then(|| {
                    let mut parts = clone_parts(&req.client);
                    for h in CONDITIONALS.iter().filter(|_| conditional) {
                        parts.headers.remove(h);
                    }
                    if let Some(e) = &req.stale {
                        // §4.3.1: validate with the stored validators.
                        if let Some(tag) = &e.etag {
                            parts.headers.insert(header::IF_NONE_MATCH, tag.clone());
                        }
                        if let Some(lm) = e.headers.get(header::LAST_MODIFIED) {
                            parts.headers.insert(header::IF_MODIFIED_SINCE, lm.clone());
                        }
                    }
                    parts.method = method;
                    if let Some(p) = phases {
                        p.upstream_request(&mut parts);
                    }
                    parts
                });
        let request_time = me.cache.clock().now();
        let steer = super::Steer::of(me, &req.client.extensions);
        let pool = me.pool_for(&req.client.extensions);
        let resp = pool
            .send(
                edited.as_ref().unwrap_or(&req.client),
                Body::empty(),
                req.peer,
                me.cfg.response_timeout.0,
                me.cfg.body_timeout.0,
            )
            .await?;
        let ctx = FetchContext {
            method: Method::GET,
            has_authorization: req.client.headers.contains_key(header::AUTHORIZATION),
            request_time,
            response_time: me.cache.clock().now(),
            request_no_store: req.request_no_store,
            ttl: steer.and_then(|s| s.ttl.clone()),
            force: steer.and_then(|s| s.force),
        };
        Ok((ctx, resp))
    }

    /// Phase 2, when a stored response was validated: answers the client if the response
    /// settles it (the stored response refreshed, served stale on a server error, or the answer
    /// to a HEAD sent through); otherwise the response is a full one, for admission.
    fn revalidate(
        &mut self,
        old: &Arc<Entry>,
        mut rparts: response::Parts,
        ctx: &FetchContext,
    ) -> ControlFlow<Response<Body>, response::Parts> {
        let me = &self.proxy.0;
        // §4.3.4: not modified.
        if rparts.status == StatusCode::NOT_MODIFIED {
            if let Some(answer) = self.refresh(old, &rparts.headers, ctx) {
                return ControlFlow::Break(answer);
            }
        }
        // §4.3.3 and RFC 5861 §4: a server error may be answered with the stale response.
        if rparts.status.is_server_error() && old.freshness.serve_on_error(me.cache.clock().now()) {
            return ControlFlow::Break(me.deliver_parts(old, &self.req.client, CacheStatus::Stale));
        }
        if self.head_through() {
            // §4.3.5: a 200 to the HEAD whose validators match the stored response freshens
            // it like a 304; one that does not match means the stored body is outdated.
            if rparts.status == StatusCode::OK {
                if head_matches(old, &rparts.headers) {
                    if let Some(answer) = self.refresh(old, &rparts.headers, ctx) {
                        return ControlFlow::Break(answer);
                    }
                }
                me.cache.remove(&self.req.key);
            }
            drop(self.req.guard.take());
            me.strip_private_fields(&mut rparts.headers);
            let head = Response::from_parts(rparts, Body::empty());
            return ControlFlow::Break(me.tag(head, self.req.status));
        }
        ControlFlow::Continue(rparts)
    }

    /// The stored response confirmed current by `fresh` (a 304's fields, or a matching HEAD
    /// answer's): its headers updated (§3.2), stored in its place, handed to the waiters and
    /// delivered. None if the refreshed response may not be stored.
    fn refresh(
        &mut self,
        old: &Arc<Entry>,
        fresh: &HeaderMap,
        ctx: &FetchContext,
    ) -> Option<Response<Body>> {
        let me = &self.proxy.0;
        let headers = refresh_headers(&old.headers, fresh);
        let storable = policy::storability(ctx, old.status, &headers, me.cache.config()).ok()?;
        let entry = Arc::new(old.refreshed(headers, storable.freshness));
        me.cache.upgrade(&self.req.key, old, Arc::clone(&entry));
        if let Some(g) = self.req.guard.take() {
            g.complete(Arc::clone(&entry));
        }
        Some(me.deliver_parts(&entry, &self.req.client, CacheStatus::Revalidated))
    }

    /// Phase 3, the policy's decision: whether the response may be stored (§3), and within the
    /// size bound it declares. What is refused releases the waiters.
    fn decide(
        &mut self,
        rparts: &response::Parts,
        ctx: &FetchContext,
    ) -> Result<Storable, NoStoreReason> {
        let me = &self.proxy.0;
        let cfg = me.cache.config();
        let storable = match policy::storability(ctx, rparts.status, &rparts.headers, cfg) {
            Ok(s) => s,
            Err(reason) => {
                // A coalesced fill the response refuses: the URL's next misses need not wait
                // on each other (hit-for-miss). Fills without a guard (requests with
                // credentials or no-store) say nothing of the URL.
                if let Some(guard) = self.req.guard.take() {
                    me.cache.mark_uncacheable(&self.req.key);
                    drop(guard);
                }
                if self.req.stale.is_some() {
                    me.cache.remove(&self.req.key);
                }
                return Err(reason);
            }
        };
        if super::content_length(&rparts.headers).is_some_and(|n| n > cfg.max_object_size.0) {
            drop(self.req.guard.take());
            return Err(NoStoreReason::TooLarge);
        }
        Ok(storable)
    }

    /// Phases 3 and 4 for a response the policy admits: read, then stored and answered, or
    /// passed on if it was not what it declared (too large, undecodable, failed).
    async fn read_and_store(
        mut self,
        rparts: response::Parts,
        rbody: UpstreamBody,
        storable: Storable,
    ) -> Response<Body> {
        match self.admit(rparts, rbody, storable).await {
            Admission::Store(admitted) => self.store_and_respond(admitted).await,
            Admission::Pass(reason, rparts, body) => self.pass(reason, rparts, body).await,
            Admission::AsSent(rparts, body) => self.pass_as_sent(rparts, body),
            Admission::Failed(e) => {
                let key = self.req.key.as_str();
                tracing::debug!(key, error = %e, "upstream body failed; nothing stored");
                self.failed(e)
            }
        }
    }

    /// Phase 3, reading: the body buffered up to the size bound, one decoding of the origin's
    /// coding. Whatever is not stored releases the waiters.
    async fn admit(
        &mut self,
        rparts: response::Parts,
        rbody: UpstreamBody,
        storable: Storable,
    ) -> Admission {
        let me = &self.proxy.0;
        let cfg = me.cache.config();
        // Buffer the body, up to the object size limit.
        let max = cfg.max_object_size.0;
        let body = match buffer_up_to(rbody, max).await {
            Buffered::Complete(b) => b,
            Buffered::TooLarge(streamed) => {
                drop(self.req.guard.take());
                me.cache.remove(&self.req.key);
                return Admission::Pass(NoStoreReason::TooLarge, rparts, streamed);
            }
            Buffered::Failed(e) => return Admission::Failed(e),
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
                .compressor()
                .decode(body.clone(), enc, max as usize)
                .await
            {
                Ok(identity) => {
                    bodies.push((Encoding::Identity, identity));
                    bodies.push((enc, body));
                }
                Err(e) => {
                    let key = self.req.key.as_str();
                    tracing::debug!(key, error = %e, "cannot decode; not stored");
                    drop(self.req.guard.take());
                    return Admission::AsSent(rparts, body);
                }
            },
            // An unknown or stacked coding is stored and served exactly as the origin sent it
            // (its Content-Encoding kept, nothing re-encoded), like a no-transform body.
            None => bodies.push((Encoding::Identity, body)),
        }
        Admission::Store(Admitted {
            rparts,
            storable,
            coding,
            bodies,
        })
    }

    /// Phase 4: builds the entry, stores it (unless it answers no request: `Vary: *`), hands it
    /// to the waiters, starts its compressed variants, and answers the client.
    async fn store_and_respond(self, admitted: Admitted) -> Response<Body> {
        let me = &self.proxy.0;
        let Admitted {
            rparts,
            storable,
            coding,
            bodies,
        } = admitted;
        let FillRequest {
            client,
            key,
            guard,
            status,
            lease,
            ..
        } = self.req;
        let mut headers = rparts.headers.clone();
        for name in &storable.strip {
            headers.remove(name);
        }
        let tags = parse_tags(&headers, &me.cache.config().tag_header.0);
        me.strip_private_fields(&mut headers);
        headers.append(header::VIA, VIA);
        let negotiated = !storable.no_transform
            && coding.is_some()
            && bodies[0].0 == Encoding::Identity
            && me
                .cache
                .compressor()
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
        entry.reserve_stamp(&me.status_header);
        if negotiated {
            entry.pending = Some(Pending::new());
        }
        // The requests this response answers: followers of the fill check theirs against it.
        // `Vary: *` has none (and the policy refused it already): never stored.
        let selection = Selection::of(&entry.headers, &client.headers);
        let answers_anyone = selection.is_some();
        entry.selection = selection.unwrap_or_default();
        let entry = Arc::new(entry);
        // Dropped (releasing the waiters) only once the client is answered, if not completed.
        let mut guard = guard;
        if answers_anyone {
            me.cache
                .store_filled(key.clone(), Arc::clone(&entry), lease);
            if let Some(g) = guard.take() {
                g.complete(Arc::clone(&entry));
            }
            if negotiated {
                me.cache.spawn_variants(key, Arc::clone(&entry));
            }
        } else if let Some(p) = &entry.pending {
            p.finish(); // not stored: no variants will come
        }
        let mut resp = me
            .deliver_settled(&entry, &client.method, &client.headers, status)
            .await;
        // The client that caused the fill still gets the fields not stored for others.
        for name in &storable.strip {
            for v in rparts.headers.get_all(name) {
                resp.headers_mut().append(name.clone(), v.clone());
            }
        }
        if !answers_anyone {
            (resp.body_mut().outcome_mut()).set_not_stored(NoStoreReason::VaryStar.code());
        }
        drop(guard);
        resp
    }

    /// A response that is not stored, to the client, why it was not noted. It is passed on
    /// as it comes, unless the client asked for a range of it: fetching it whole to cut a part
    /// out would pull the whole body (gigabytes for one byte, and everything before the offset
    /// when resuming), so it is dropped unread and the client's own request, Range and If-Range
    /// included, goes upstream; the origin's 206 is passed on. Not when the origin says
    /// `Accept-Ranges: none`: then the range is cut from this response's stream.
    ///
    /// A plain fn: only the range's new fetch waits (boxed), every other answer is ready.
    fn pass(
        self,
        reason: NoStoreReason,
        rparts: response::Parts,
        body: Body,
    ) -> impl Future<Output = Response<Body>> + 'p {
        use futures_util::future::{ready, Either};
        tracing::debug!(
            key = self.req.key.as_str(),
            reason = reason.as_str(),
            "not stored"
        );
        let proxy = self.proxy;
        let FillRequest {
            client,
            peer,
            status,
            ..
        } = self.req;
        let with_reason = move |mut resp: Response<Body>| {
            resp.body_mut().outcome_mut().set_not_stored(reason.code());
            resp
        };
        if wants_part(&client, &rparts) {
            drop(body);
            let req = Request::from_parts(client, Body::empty());
            let refetch = Box::pin(proxy.forward(req, peer, status));
            return Either::Right(futures_util::FutureExt::map(refetch, with_reason));
        }
        let asked = super::Asked::of(&client.method, &client.headers);
        Either::Left(ready(with_reason(
            proxy.0.pass_on(rparts, body, &asked, status),
        )))
    }

    /// A response whose body could not be decoded, to the client exactly as the origin sent it
    /// (not adapted: its coding is the one thing about it that is known to be broken).
    fn pass_as_sent(self, mut rparts: response::Parts, body: Bytes) -> Response<Body> {
        let me = &self.proxy.0;
        me.strip_private_fields(&mut rparts.headers);
        let mut resp = Response::from_parts(rparts, Body::full(body));
        (resp.body_mut().outcome_mut()).set_not_stored(NoStoreReason::Undecodable.code());
        me.tag(resp, self.req.status)
    }

    /// The fetch failed: nothing is stored, the waiters get the same error at once, and the
    /// client the stale response where allowed, else the error.
    fn failed(&mut self, e: FetchError) -> Response<Body> {
        if let Some(g) = self.req.guard.take() {
            g.fail(e.clone());
        }
        let client = &self.req.client;
        self.proxy.0.failure(
            &e,
            self.req.stale.as_deref(),
            &client.method,
            &client.headers,
            self.req.status,
        )
    }
}

/// Whether a client asked for part of this full response, which the origin can send alone: a
/// GET with a byte Range that applies to it (its If-Range, if any, names this response).
fn wants_part(client: &request::Parts, rparts: &response::Parts) -> bool {
    let h = &rparts.headers;
    client.method == Method::GET
        && client.headers.contains_key(header::RANGE)
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

/// Headers of a stored response updated by a 304 (RFC 9111 §3.2): every field in the 304
/// replaces the stored one, except those describing the body.
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
        // A copy: the chunk is a slice of the upstream connection's read buffer, which a
        // stored slice would keep alive whole (see `Entry::build`).
        1 => Bytes::copy_from_slice(&chunks[0]),
        _ => {
            let mut v = Vec::with_capacity(total as usize);
            for c in chunks {
                v.extend_from_slice(&c);
            }
            Bytes::from(v)
        }
    })
}

/// A copy of a request's head (method, URI, version, fields) without its extensions but the
/// ones the origin's request reads ([`crate::http::fields::Hop`], [`fields::Secure`]): what a background refresh or
/// a retried fetch sends again.
pub(super) fn clone_parts(p: &request::Parts) -> request::Parts {
    let mut b = Request::builder()
        .method(p.method.clone())
        .uri(p.uri.clone())
        .version(p.version);
    if let Some(h) = b.headers_mut() {
        *h = p.headers.clone();
    }
    // The extensions the origin's request is built from: X-Forwarded-For's last hop, and the
    // request's context on a route with steps (for ② and ③, and what its rules decided).
    if let Some(hop) = p.extensions.get::<fields::Hop>() {
        b = b.extension(*hop);
    }
    if let Some(secure) = p.extensions.get::<fields::Secure>() {
        b = b.extension(*secure);
    }
    if let Some(cx) = Cx::of(p) {
        b = b.extension(Arc::clone(cx));
        if let Some(s) = p.extensions.get::<super::Steer>() {
            b = b.extension(s.clone());
        }
    }
    b.body(()).expect("parts are valid").into_parts().0
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An origin answering each request on its own connection: `/no-store`, `/private`,
    /// `/large` (64 bytes, declared), `/chunked` (64 bytes, undeclared), anything else a small
    /// response fresh for a minute.
    async fn origin() -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head);
                    let path = head.split(' ').nth(1).unwrap_or("/").to_string();
                    let big = "x".repeat(64);
                    let (cc, framing, body) = match path.as_str() {
                        "/no-store" => ("no-store", "Content-Length: 2", "ok".to_string()),
                        "/private" => ("private, max-age=60", "Content-Length: 2", "ok".into()),
                        "/large" => ("max-age=60", "Content-Length: 64", big),
                        "/chunked" => (
                            "max-age=60",
                            "Transfer-Encoding: chunked",
                            format!("40\r\n{big}\r\n0\r\n\r\n"),
                        ),
                        _ => ("max-age=60", "Content-Length: 2", "ok".into()),
                    };
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\nCache-Control: {cc}\r\n{framing}\r\n\
                         Connection: close\r\n\r\n{body}"
                    );
                    let _ = s.write_all(resp.as_bytes()).await;
                });
            }
        });
        addr
    }

    fn request(path: &str) -> FillRequest {
        let (client, ()) = Request::get(path)
            .header(header::HOST, "example.com")
            .body(())
            .unwrap()
            .into_parts();
        FillRequest {
            client,
            peer: "127.0.0.1:9".parse().unwrap(),
            key: CacheKey::from_parts("http", "example.com", path),
            guard: None,
            status: CacheStatus::Miss,
            stale: None,
            request_no_store: false,
            lease: None,
        }
    }

    /// Why a response was not stored travels with it (its outcome), for the access log; a
    /// stored response carries none.
    #[tokio::test]
    async fn the_reason_a_response_was_not_stored_is_carried() {
        let origin = origin().await;
        let cache = crate::cache::Cache::new(
            crate::config::CacheConfig {
                max_object_size: crate::config::ByteSize(32),
                ..Default::default()
            },
            Default::default(),
        );
        let upstream = format!("http://{origin}").parse().unwrap();
        let proxy = Proxy::for_test(
            crate::config::ProxyConfig::new(upstream),
            Arc::clone(&cache),
        );
        for (path, reason) in [
            ("/no-store", Some(NoStoreReason::NoStore)),
            ("/private", Some(NoStoreReason::Private)),
            ("/large", Some(NoStoreReason::TooLarge)),
            ("/chunked", Some(NoStoreReason::TooLarge)),
            ("/fresh", None),
        ] {
            let resp = proxy.fill(request(path)).await;
            assert_eq!(resp.status(), StatusCode::OK, "{path}");
            let noted = resp.body().outcome().no_store();
            assert_eq!(noted, reason.map(NoStoreReason::code), "{path}");
        }
        let mut request_no_store = request("/fresh-too");
        request_no_store.request_no_store = true;
        let resp = proxy.fill(request_no_store).await;
        let noted = resp.body().outcome().no_store();
        assert_eq!(noted, Some(NoStoreReason::NoStore.code()));
        assert_eq!(cache.len(), 1, "only /fresh is stored");
    }

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
