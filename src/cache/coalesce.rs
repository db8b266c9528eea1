//! Miss coalescing: concurrent misses for one key make one upstream request.
//!
//! The first request for a missing key becomes the leader and holds a [`FillGuard`]; later ones
//! become followers holding a receiver. The leader either completes the guard with the stored
//! entry (followers serve it) or drops it (fetch failed, response not storable, client went away):
//! dropping releases the followers, who then fetch for themselves. Nothing is ever marked
//! uncacheable by a failed fill.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::entry::Entry;
use super::CacheKey;

/// What a follower learns from the leader's fill.
#[derive(Clone)]
pub enum FillOutcome {
    /// The fill stored this entry: serve it.
    Filled(Arc<Entry>),
    /// The fill stored nothing: fetch for yourself.
    Released,
}

type Slot = watch::Receiver<Option<FillOutcome>>;

/// Fills in flight, by key.
#[derive(Default)]
pub struct Inflight {
    map: Mutex<HashMap<CacheKey, Slot>>,
}

/// A request's role for a missing key.
pub enum Join {
    Leader(FillGuard),
    Follower(Follower),
}

impl Inflight {
    /// Joins the fill of `key`, becoming its leader if none is in flight.
    pub fn join(self: &Arc<Self>, key: &CacheKey) -> Join {
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

    /// Fills in flight now.
    pub fn len(&self) -> usize {
        self.map.lock().expect("inflight lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn finish(&self, key: &CacheKey) {
        self.map.lock().expect("inflight lock").remove(key);
    }
}

/// Held by the leader of a fill; dropping it without [`FillGuard::complete`] releases waiters.
pub struct FillGuard {
    key: CacheKey,
    tx: watch::Sender<Option<FillOutcome>>,
    inflight: Arc<Inflight>,
}

impl FillGuard {
    /// The fill stored `entry`: followers serve it.
    pub fn complete(self, entry: Arc<Entry>) {
        self.inflight.finish(&self.key);
        self.tx.send_replace(Some(FillOutcome::Filled(entry)));
        // Drop runs next and finds the outcome already set.
    }
}

impl Drop for FillGuard {
    fn drop(&mut self) {
        self.inflight.finish(&self.key);
        if self.tx.borrow().is_none() {
            self.tx.send_replace(Some(FillOutcome::Released));
        }
    }
}

/// Waits on another request's fill.
pub struct Follower {
    rx: Slot,
}

impl Follower {
    /// The leader's outcome, or `Released` on timeout.
    pub async fn wait(mut self, timeout: Duration) -> FillOutcome {
        match tokio::time::timeout(timeout, self.rx.wait_for(|v| v.is_some())).await {
            Ok(Ok(v)) => v.clone().unwrap_or(FillOutcome::Released),
            _ => FillOutcome::Released,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dropped_leader_releases_followers() {
        let inflight = Arc::new(Inflight::default());
        let key = CacheKey::from_parts("http", "h", "/x");
        let Join::Leader(guard) = inflight.join(&key) else {
            panic!("first is leader")
        };
        let Join::Follower(f) = inflight.join(&key) else {
            panic!("second is follower")
        };
        let waiter = tokio::spawn(f.wait(Duration::from_secs(5)));
        drop(guard);
        assert!(matches!(waiter.await.unwrap(), FillOutcome::Released));
        assert!(inflight.is_empty());
        // The key is not poisoned: the next request leads a new fill.
        assert!(matches!(inflight.join(&key), Join::Leader(_)));
    }

    #[tokio::test]
    async fn follower_times_out() {
        let inflight = Arc::new(Inflight::default());
        let key = CacheKey::from_parts("http", "h", "/y");
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
