//! Traffic rules: a weighted split of a proxy route's requests between pools (nginx's
//! `split_clients`), sticky by a cookie or the client's address, and a mirror of what goes
//! upstream to a shadow pool (nginx's `mirror`), its answers discarded.
//!
//! The split decides at ① and leaves its pool in the request ([`Steer`]) for the proxy's fill
//! and pass; how the cache treats a split request is the rule's `cache` (by default the
//! request is passed: each side answers for itself). The mirror acts at ②: a copy of the
//! request's head, spawned, bounded in flight (one more is dropped and counted), never awaited
//! by the client's request. With `body = true` it installs at ① a tee on the request's body
//! ([`Tee`]) that copies what the upstream exchange reads, up to `max_body`; the mirror waits
//! for the copy to be complete, and goes with the head alone when it is not (too large, the
//! body abandoned). Its bound belongs to the compiled rule: a reload starts a new bound
//! (mirrors still in flight finish under the old one); the drops are counted by the shadow pool
//! (its status: `mirrors_dropped`), which a reload keeps when its configuration is unchanged.

use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, request, Request};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::oneshot;

use crate::body::{Body, RequestBody};
use crate::config::rules_cache::{MirrorConfig, SplitCache, SplitConfig, Sticky};
use crate::phases::{Cx, Step, Verdict};
use crate::proxy::Steer;
use crate::upstream::{Pool, Pools};

/// `split`: the pools with their cumulative weights.
pub struct Split {
    /// (pool, the sum of the weights up to and including it).
    pools: Vec<(Arc<Pool>, u64)>,
    total: u64,
    sticky: Sticky,
    cache: SplitCache,
    /// Requests split without stickiness, spread by weight.
    turn: AtomicU64,
}

impl Split {
    /// The split of `cfg` over the running pools (those of the configuration, checked at load).
    pub fn new(cfg: &SplitConfig, pools: &Pools) -> Split {
        let mut sum = 0;
        let pools = (cfg.pools.iter())
            .filter_map(|(name, w)| {
                let p = pools.get(name)?;
                sum += u64::from(*w);
                Some((Arc::clone(p), sum))
            })
            .collect();
        Split {
            pools,
            total: sum,
            sticky: cfg.sticky.clone(),
            cache: cfg.cache,
            turn: AtomicU64::new(0),
        }
    }

    /// The pool for a point on the weights' line (`point` hashed over 0..2^64).
    fn pick(&self, point: u64) -> Option<&Arc<Pool>> {
        let at = point % self.total.max(1);
        (self.pools.iter())
            .find(|(_, upto)| at < *upto)
            .map(|(p, _)| p)
    }
}

/// A stable hash (std's SipHash with its fixed keys: the same on every node and across
/// restarts of one build).
fn hash(v: impl Hash) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

impl Step for Split {
    fn request(&self, req: &mut Request<RequestBody>, cx: &mut Cx) -> Verdict {
        let by_client = || hash(cx.client.ip());
        let point = match &self.sticky {
            Sticky::Client => by_client(),
            Sticky::Cookie(name) => match super::vars::Seen::of(req).cookie(name) {
                Some(v) => hash(v),
                None => by_client(),
            },
            Sticky::None => hash(self.turn.fetch_add(1, Ordering::Relaxed)),
        };
        let Some(pool) = self.pick(point) else {
            return Verdict::Next;
        };
        cx.notes.push(("split", pool.name().into()));
        let steer = req.extensions_mut().get_or_insert_default::<Steer>();
        steer.pool = Some(Arc::clone(pool));
        match self.cache {
            SplitCache::Pass => steer.bypass = true,
            SplitCache::PerPool => steer.pool_in_key = true,
            SplitCache::Shared => {}
        }
        Verdict::Next
    }
}

/// `mirror`: a copy of each upstream request's head to the shadow pool.
pub struct Mirror {
    pool: Arc<Pool>,
    max: usize,
    timeout: Duration,
    in_flight: Arc<AtomicUsize>,
    /// `body = true`: the largest body copied.
    max_body: Option<usize>,
}

impl Mirror {
    pub fn new(cfg: &MirrorConfig, pools: &Pools) -> Option<Mirror> {
        Some(Mirror {
            pool: Arc::clone(pools.get(&cfg.pool)?),
            max: cfg.max_in_flight.0,
            timeout: cfg.timeout.0,
            in_flight: Arc::new(AtomicUsize::new(0)),
            max_body: cfg
                .body
                .then(|| usize::try_from(cfg.max_body.0).unwrap_or(usize::MAX)),
        })
    }

    fn id(&self) -> usize {
        self as *const Self as usize
    }
}

/// The copy of a request's body a tee will hand over once complete (kept in the request's
/// context from ① to ②).
struct Copying(Mutex<Option<oneshot::Receiver<Bytes>>>);

/// A request body that copies what is read of it, up to `max` bytes, and hands the copy over
/// when the body is complete; past `max`, or when the body fails or is dropped unfinished, the
/// copy is abandoned (its receiver then sees the sender gone).
pub struct Tee {
    inner: RequestBody,
    copy: Vec<u8>,
    max: usize,
    done: Option<oneshot::Sender<Bytes>>,
}

impl Tee {
    fn finish(&mut self) {
        if let Some(tx) = self.done.take() {
            let _ = tx.send(Bytes::from(std::mem::take(&mut self.copy)));
        }
    }
}

impl http_body::Body for Tee {
    type Data = Bytes;
    type Error = crate::body::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), true) = (frame.data_ref(), this.done.is_some()) {
                    if this.copy.len() + data.len() > this.max {
                        this.done = None;
                        this.copy = Vec::new();
                    } else {
                        this.copy.extend_from_slice(data);
                    }
                }
                // A reader may stop at a body that says it has ended.
                if this.inner.is_end_stream() {
                    this.finish();
                }
            }
            Poll::Ready(None) => this.finish(),
            Poll::Ready(Some(Err(_))) => this.done = None,
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A mirror's place in flight, given back when it ends however it ends.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Step for Mirror {
    fn request(&self, req: &mut Request<RequestBody>, cx: &mut Cx) -> Verdict {
        use http_body::Body as _;
        let Some(max) = self.max_body else {
            return Verdict::Next;
        };
        let declared = req.body().size_hint().exact();
        if req.body().is_end_stream() || declared.is_some_and(|n| n > max as u64) {
            return Verdict::Next; // nothing to copy, or too much: the head alone
        }
        let (tx, rx) = oneshot::channel();
        let empty = http_body_util::Empty::<Bytes>::new()
            .map_err(|never| match never {})
            .boxed();
        let inner = std::mem::replace(req.body_mut(), RequestBody::Stream(empty));
        let tee = Tee {
            inner,
            copy: Vec::new(),
            max,
            done: Some(tx),
        };
        *req.body_mut() = RequestBody::Stream(tee.boxed());
        cx.stash(self.id(), Copying(Mutex::new(Some(rx))));
        Verdict::Next
    }

    fn upstream_request(&self, req: &mut request::Parts, cx: &Cx) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.in_flight.fetch_add(1, Ordering::Relaxed) >= self.max {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            // Counted by the shadow pool (its status in the admin API: `mirrors_dropped`).
            let dropped = self.pool.mirror_dropped();
            tracing::debug!(
                pool = self.pool.name(),
                dropped,
                "mirror dropped: bound reached"
            );
            return;
        }
        let slot = Slot(Arc::clone(&self.in_flight));
        let mut copy = Request::builder()
            .method(req.method.clone())
            .uri(req.uri.clone())
            .version(req.version);
        if let Some(h) = copy.headers_mut() {
            *h = req.headers.clone();
            // The head alone unless the body's copy completes.
            h.remove(header::CONTENT_LENGTH);
            h.remove(header::TRANSFER_ENCODING);
        }
        let Ok(copy) = copy.body(()) else {
            return;
        };
        let (mut parts, ()) = copy.into_parts();
        let body = (cx.stashed::<Copying>(self.id()))
            .and_then(|c| c.0.lock().map(|mut rx| rx.take()).ok().flatten());
        let (pool, peer, timeout) = (Arc::clone(&self.pool), cx.client, self.timeout);
        runtime.spawn(async move {
            let _slot = slot;
            let exchange = async {
                // The body's copy, once the upstream exchange has read it all.
                let body = match body {
                    Some(rx) => rx.await.ok(),
                    None => None,
                };
                let body = match body {
                    Some(b) => {
                        parts.headers.insert(header::CONTENT_LENGTH, b.len().into());
                        Body::full(b)
                    }
                    None => Body::empty(),
                };
                let resp = pool.send(parts, body, peer, timeout, timeout).await;
                // The answer is read and discarded (the connection may then be reused).
                if let Ok(resp) = resp {
                    let mut body = resp.into_body();
                    while let Some(Ok(_)) = body.frame().await {}
                }
            };
            let _ = tokio::time::timeout(timeout, exchange).await;
        });
    }
}

/// A rule that does nothing (a mirror whose pool is not running).
pub struct Nothing;

impl Step for Nothing {}
