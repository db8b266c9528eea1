//! Miss coalescing: concurrent misses for one key make one upstream request (or, for static
//! files, one stat and one read of a file).
//!
//! The first request for a missing key becomes the leader and holds a [`FillGuard`]; later ones
//! become followers holding a receiver. The leader ends the fill one of three ways, and the
//! followers learn it at once: it completes the guard with the stored entry (followers serve
//! it), fails it with the upstream's error (followers answer that error, or a stale response
//! they may serve, without a request of their own), or drops it (response not storable, client
//! went away): dropping releases the followers, who then fetch for themselves. Nothing is ever
//! marked uncacheable by a failed fill: the key is free for the next request.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::entry::Entry;
use super::key::FillKey;
use crate::http::FetchError;

/// What a follower learns from the leader's fill (`V`: what a fill produces; for the cache, the
/// stored entry).
#[derive(Clone)]
pub enum FillOutcome<V = Arc<Entry>> {
    /// The fill stored this entry: serve it (if it answers the follower's request).
    Filled(V),
    /// The upstream could not be reached, timed out or broke off (proxy fills): answer this
    /// error, as the leader did, rather than ask the upstream again.
    Failed(FetchError),
    /// The fill stored nothing: fetch for yourself.
    Released,
}

type Slot<V> = watch::Receiver<Option<FillOutcome<V>>>;

/// Fills in flight, by key.
pub struct Inflight<K = FillKey, V = Arc<Entry>> {
    map: Mutex<HashMap<K, Slot<V>>>,
}

impl<K, V> Default for Inflight<K, V> {
    fn default() -> Self {
        Inflight {
            map: Mutex::new(HashMap::new()),
        }
    }
}

/// A request's role for a missing key.
pub enum Join<K: Hash + Eq + Clone = FillKey, V: Clone = Arc<Entry>> {
    Leader(FillGuard<K, V>),
    Follower(Follower<V>),
}

impl<K: Hash + Eq + Clone, V: Clone> Inflight<K, V> {
    /// Joins the fill of `key`, becoming its leader if none is in flight.
    pub fn join(self: &Arc<Self>, key: &K) -> Join<K, V> {
        let mut map = self.map.lock().expect("inflight lock");
        if let Some(rx) = map.get(key) {
            return Join::Follower(Follower { rx: rx.clone() });
        }
        let (tx, rx) = watch::channel(None);
        map.insert(key.clone(), rx);
        Join::Leader(FillGuard {
            key: key.clone(),
            tx,
            inflight: Arc::clone(self),
        })
    }

    /// Produces the value for `key` once for all concurrent callers: the leader takes what
    /// `existing` finds (a fill may have finished between the caller's lookup and the join)
    /// or runs `fill` and hands its result to the followers; a follower waits for it and runs
    /// `fill` itself if the leader produced nothing or took longer than `timeout`.
    pub async fn once<F, Fut>(
        self: &Arc<Self>,
        key: &K,
        timeout: Duration,
        existing: impl FnOnce() -> Option<V>,
        fill: F,
    ) -> Option<V>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Option<V>>,
    {
        match self.join(key) {
            Join::Leader(guard) => {
                let v = match existing() {
                    Some(v) => v,
                    None => fill().await?,
                };
                guard.complete(v.clone());
                Some(v)
            }
            Join::Follower(f) => match f.wait(timeout).await {
                FillOutcome::Filled(v) => Some(v),
                FillOutcome::Failed(_) | FillOutcome::Released => fill().await,
            },
        }
    }

    /// Fills in flight now.
    pub fn len(&self) -> usize {
        self.map.lock().expect("inflight lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn finish(&self, key: &K) {
        self.map.lock().expect("inflight lock").remove(key);
    }
}

/// Held by the leader of a fill; dropping it without [`FillGuard::complete`] or
/// [`FillGuard::fail`] releases waiters.
pub struct FillGuard<K: Hash + Eq + Clone = FillKey, V: Clone = Arc<Entry>> {
    key: K,
    tx: watch::Sender<Option<FillOutcome<V>>>,
    inflight: Arc<Inflight<K, V>>,
}

impl<K: Hash + Eq + Clone, V: Clone> FillGuard<K, V> {
    /// The fill stored `entry`: followers serve it.
    pub fn complete(self, entry: V) {
        self.inflight.finish(&self.key);
        self.tx.send_replace(Some(FillOutcome::Filled(entry)));
        // Drop runs next and finds the outcome already set.
    }

    /// The fetch failed: followers answer `error` too.
    pub fn fail(self, error: FetchError) {
        self.inflight.finish(&self.key);
        self.tx.send_replace(Some(FillOutcome::Failed(error)));
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Drop for FillGuard<K, V> {
    fn drop(&mut self) {
        self.inflight.finish(&self.key);
        if self.tx.borrow().is_none() {
            self.tx.send_replace(Some(FillOutcome::Released));
        }
    }
}

/// Waits on another request's fill.
pub struct Follower<V = Arc<Entry>> {
    rx: Slot<V>,
}

impl<V: Clone> Follower<V> {
    /// The leader's outcome, or `Released` on timeout.
    pub async fn wait(mut self, timeout: Duration) -> FillOutcome<V> {
        match tokio::time::timeout(timeout, self.rx.wait_for(|v| v.is_some())).await {
            Ok(Ok(v)) => v.clone().unwrap_or(FillOutcome::Released),
            _ => FillOutcome::Released,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CacheKey;

    /// A fill of `path`: its leader's guard and one follower waiting on it.
    fn fill_with_a_waiter(
        path: &str,
    ) -> (
        Arc<Inflight>,
        FillKey,
        FillGuard,
        tokio::task::JoinHandle<FillOutcome>,
    ) {
        let inflight: Arc<Inflight> = Arc::new(Inflight::default());
        let key = FillKey::from(CacheKey::from_parts("http", "h", path));
        let Join::Leader(guard) = inflight.join(&key) else {
            panic!("first is leader")
        };
        let Join::Follower(f) = inflight.join(&key) else {
            panic!("second is follower")
        };
        let waiter = tokio::spawn(f.wait(Duration::from_secs(5)));
        (inflight, key, guard, waiter)
    }

    #[tokio::test]
    async fn dropped_leader_releases_followers() {
        let (inflight, key, guard, waiter) = fill_with_a_waiter("/x");
        drop(guard);
        assert!(matches!(waiter.await.unwrap(), FillOutcome::Released));
        assert!(inflight.is_empty());
        // The key is not poisoned: the next request leads a new fill.
        assert!(matches!(inflight.join(&key), Join::Leader(_)));
    }

    #[tokio::test]
    async fn failed_leader_hands_its_error_to_followers() {
        let (inflight, key, guard, waiter) = fill_with_a_waiter("/f");
        guard.fail(FetchError::Timeout(Duration::from_secs(1)));
        assert!(matches!(
            waiter.await.unwrap(),
            FillOutcome::Failed(FetchError::Timeout(_))
        ));
        assert!(inflight.is_empty());
        assert!(matches!(inflight.join(&key), Join::Leader(_)));
    }

    #[tokio::test]
    async fn once_fills_once_for_concurrent_callers() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let inflight: Arc<Inflight<u32, u32>> = Arc::new(Inflight::default());
        let fills = Arc::new(AtomicUsize::new(0));
        let call = |inflight: Arc<Inflight<u32, u32>>, fills: Arc<AtomicUsize>| async move {
            inflight
                .once(
                    &7,
                    Duration::from_secs(5),
                    || None,
                    || async {
                        fills.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Some(42)
                    },
                )
                .await
        };
        let a = tokio::spawn(call(Arc::clone(&inflight), Arc::clone(&fills)));
        let b = tokio::spawn(call(Arc::clone(&inflight), Arc::clone(&fills)));
        assert_eq!((a.await.unwrap(), b.await.unwrap()), (Some(42), Some(42)));
        assert_eq!(fills.load(Ordering::SeqCst), 1);
        assert!(inflight.is_empty());
    }

    #[tokio::test]
    async fn follower_times_out() {
        let inflight: Arc<Inflight> = Arc::new(Inflight::default());
        let key = FillKey::from(CacheKey::from_parts("http", "h", "/y"));
        let _guard = inflight.join(&key);
        let Join::Follower(f) = inflight.join(&key) else {
            panic!()
        };
        assert!(matches!(
            f.wait(Duration::from_millis(10)).await,
            FillOutcome::Released
        ));
    }
}
