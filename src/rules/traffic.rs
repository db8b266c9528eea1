//! Traffic rules: a weighted split of a proxy route's requests between pools (nginx's
//! `split_clients`), sticky by a cookie or the client's address, and a mirror of what goes
//! upstream to a shadow pool (nginx's `mirror`), its answers discarded.
//!
//! The split decides at ① and leaves its pool in the request ([`Steer`]) for the proxy's fill
//! and pass; how the cache treats a split request is the rule's `cache` (by default the
//! request is passed: each side answers for itself). The mirror acts at ②: a copy of the
//! request's head, spawned, bounded in flight (one more is dropped and counted), never awaited
//! by the client's request. Its bound belongs to the compiled rule: a reload starts a new bound
//! (mirrors still in flight finish under the old one); the drops are counted by the shadow pool
//! (its status: `mirrors_dropped`), which a reload keeps when its configuration is unchanged.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{request, Request};
use http_body_util::BodyExt;

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
}

impl Mirror {
    pub fn new(cfg: &MirrorConfig, pools: &Pools) -> Option<Mirror> {
        Some(Mirror {
            pool: Arc::clone(pools.get(&cfg.pool)?),
            max: cfg.max_in_flight.0,
            timeout: cfg.timeout.0,
            in_flight: Arc::new(AtomicUsize::new(0)),
        })
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
            // The head only: no body follows it.
            h.remove(http::header::CONTENT_LENGTH);
            h.remove(http::header::TRANSFER_ENCODING);
        }
        let Ok(copy) = copy.body(()) else {
            return;
        };
        let (parts, ()) = copy.into_parts();
        let (pool, peer, timeout) = (Arc::clone(&self.pool), cx.client, self.timeout);
        runtime.spawn(async move {
            let _slot = slot;
            let exchange = async {
                let resp = pool
                    .send(parts, Body::empty(), peer, timeout, timeout)
                    .await;
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
