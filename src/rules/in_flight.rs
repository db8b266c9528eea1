//! Requests in flight per key (nginx's `limit_conn`): `in_flight = { max = 10, key }`. At ①
//! a request takes a place under its key, or is answered (429 unless `status` says otherwise)
//! when `max` are taken; the place is held by a guard that ④ moves into the response's body, so
//! it is given back when the body is done (sent whole, failed, or dropped with its connection),
//! not when the head leaves. A request that ends before ④ gives it back with its context.
//!
//! Only keys with requests in flight are held (a count of 0 is removed), so the map is bounded
//! by the requests being served, which the server's connection limits bound.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::HeaderValue;
use http::{Request, Response, StatusCode};
use http_body::{Frame, SizeHint};

use super::limit_key::KeyOf;
use crate::body::{Body, BoxError, RequestBody};
use crate::config::rules::InFlightConfig;
use crate::http::text_response;
use crate::phases::{Cx, Step, Verdict};

/// Shards of the counts (a lock each), by the key's hash.
const SHARDS: usize = 16;

/// `in_flight = { ... }`.
pub struct InFlight {
    max: u32,
    key: KeyOf,
    status: StatusCode,
    /// Its `RateLimit-Policy` field, on its answers.
    policy: HeaderValue,
    counts: Arc<Counts>,
}

struct Counts {
    shards: Vec<Mutex<HashMap<u64, u32, Identity>>>,
}

/// The keys are SipHash values already.
#[derive(Clone, Copy, Default)]
struct Identity;

impl BuildHasher for Identity {
    type Hasher = IdentityHasher;
    fn build_hasher(&self) -> IdentityHasher {
        IdentityHasher(0)
    }
}

struct IdentityHasher(u64);

impl std::hash::Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A place taken under a key: given back when dropped.
pub struct Place {
    counts: Arc<Counts>,
    key: u64,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut shard = self.counts.shard(self.key).lock().expect("not poisoned");
        if let Some(n) = shard.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                shard.remove(&self.key);
            }
        }
    }
}

impl Counts {
    fn shard(&self, key: u64) -> &Mutex<HashMap<u64, u32, Identity>> {
        &self.shards[(key >> 59) as usize % SHARDS]
    }
}

/// The place a request holds, until ④ moves it into the body.
struct Held(Mutex<Option<Place>>);

impl InFlight {
    pub fn new(name: &str, cfg: &InFlightConfig) -> InFlight {
        InFlight {
            max: u32::try_from(cfg.max.get()).unwrap_or(u32::MAX),
            key: KeyOf::new(&cfg.key, cfg.missing),
            status: StatusCode::from_u16(cfg.status.0).unwrap_or(StatusCode::TOO_MANY_REQUESTS),
            policy: super::rate::concurrent_policy(
                name,
                u32::try_from(cfg.max.get()).unwrap_or(u32::MAX),
            ),
            counts: Arc::new(Counts {
                shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            }),
        }
    }

    fn id(&self) -> usize {
        self as *const Self as usize
    }

    /// Requests in flight under all keys now.
    pub fn in_flight(&self) -> u64 {
        (self.counts.shards.iter())
            .map(|s| {
                let s = s.lock().expect("not poisoned");
                s.values().map(|n| u64::from(*n)).sum::<u64>()
            })
            .sum()
    }

    fn take(&self, key: u64) -> Option<Place> {
        let mut shard = self.counts.shard(key).lock().expect("not poisoned");
        let n = shard.entry(key).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(Place {
            counts: Arc::clone(&self.counts),
            key,
        })
    }
}

impl Step for InFlight {
    fn request(&self, req: &mut Request<RequestBody>, cx: &mut Cx) -> Verdict {
        let Some(key) = self.key.of(req, cx) else {
            return Verdict::Next;
        };
        let key = self.key.hash(&key);
        match self.take(key) {
            Some(place) => {
                cx.stash(self.id(), Held(Mutex::new(Some(place))));
                Verdict::Next
            }
            None => {
                let mut r = text_response(self.status, "too many requests in flight\n");
                r.headers_mut()
                    .append(super::rate::RATELIMIT_POLICY, self.policy.clone());
                Verdict::Answer(r)
            }
        }
    }

    fn deliver(&self, resp: &mut Response<Body>, cx: &Cx) {
        let Some(held) = cx.stashed::<Held>(self.id()) else {
            return;
        };
        let Some(place) = held.0.lock().expect("not poisoned").take() else {
            return;
        };
        let body = std::mem::replace(resp.body_mut(), Body::empty());
        let outcome = body.outcome();
        let mut wrapped = Body::stream(Holding {
            body,
            place: Some(place),
        });
        *wrapped.outcome_mut() = outcome;
        *resp.body_mut() = wrapped;
    }
}

/// A response body that holds a place until it ends (or is dropped).
struct Holding {
    body: Body,
    place: Option<Place>,
}

impl http_body::Body for Holding {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.place = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::rules::LimitKey;
    use crate::config::rules_limits::{LimitStatus, Missing};
    use crate::config::Bounded;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_place_is_held_until_the_body_ends() {
        let step = InFlight::new(
            "f",
            &InFlightConfig {
                max: Bounded(1),
                key: LimitKey::Client,
                missing: Missing::Client,
                status: LimitStatus(503),
            },
        );
        let mut req = Request::new(RequestBody::Stream(
            http_body_util::Empty::new().map_err(Into::into).boxed(),
        ));
        let mut cx = Cx::new("192.0.2.1:1".parse().unwrap());
        assert!(matches!(step.request(&mut req, &mut cx), Verdict::Next));
        assert_eq!(step.in_flight(), 1);
        let mut cx2 = Cx::new("192.0.2.1:2".parse().unwrap());
        match step.request(&mut req, &mut cx2) {
            Verdict::Answer(r) => assert_eq!(r.status(), 503),
            _ => panic!("a second request in flight passed"),
        }
        let mut other = Cx::new("192.0.2.2:1".parse().unwrap());
        assert!(matches!(step.request(&mut req, &mut other), Verdict::Next));
        drop(other);
        let mut resp = Response::new(Body::full("abc"));
        step.deliver(&mut resp, &cx);
        drop(cx);
        assert_eq!(step.in_flight(), 1, "the body holds it");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"abc");
        assert_eq!(step.in_flight(), 0);
    }
}
