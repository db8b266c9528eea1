//! The shared tier: entry records ([`super::record`]) in the fleet's Redis or Valkey
//! ([`crate::fleet`]: the connection, signatures, the purge stream), read by every node on a
//! miss of its own tiers. Only the [`Cache`](super::Cache) façade reaches it, through
//! [`super::tiers`].
//!
//! Keys, under the configured namespace `ns`:
//!
//! - `ns:e:<url key>`: an entry record (signed with the fleet key, if any), expiring when the
//!   entry is of no more use (its remaining lifetime, its stale windows, longer when it can be
//!   revalidated);
//! - `ns:l:<url key>`: the lease of the node fetching the URL (SET NX PX), so that misses for
//!   one URL on several nodes make one origin fetch; released (compare and delete) once the
//!   record is written, expiring on its own if that node dies;
//! - `ns:t:<tag>`: the keys of the records carrying a tag (purge by tag).
//!
//! A purge made here removes the records it names and is announced on the fleet's purge stream;
//! the purges other nodes announce come back as bans ([`super::bans`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fred::prelude::*;

use super::bans::Ban;
use super::key::CacheKey;
use super::purge::Purge;
use super::storage::{Reading, Stats, Storage, Tier, TierCounts, Unavailable};
use crate::fleet::{Fleet, Kind, StreamEntry};

/// The shared tier: the fleet's connection, and what this tier counts of its own.
pub(super) struct Shared {
    fleet: Arc<Fleet>,
    leases: AtomicU64,
    stats: Stats,
}

/// What asking for a URL's lease gave.
pub(super) enum Leasing {
    /// This node fetches; others wait until the lease is released or expires.
    Held(Lease),
    /// Another node filled the URL meanwhile: its record.
    Filled(Bytes),
    /// No lease (Redis unavailable, or the wait ran out): fetch without one.
    None,
}

/// A URL's lease, held while this node fetches it. Released when dropped.
pub struct Lease {
    shared: Arc<Shared>,
    key: String,
    token: String,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let shared = Arc::clone(&self.shared);
        let (key, token) = (
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.token),
        );
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { shared.release(&key, &token).await });
        }
    }
}

impl Shared {
    pub(super) fn new(fleet: Arc<Fleet>) -> Shared {
        Shared {
            fleet,
            leases: AtomicU64::new(0),
            stats: Stats::default(),
        }
    }
}

impl Storage for Shared {
    fn tier(&self) -> Tier {
        Tier::Shared
    }

    fn read<'a>(&'a self, key: &'a CacheKey) -> Reading<'a> {
        Box::pin(Shared::read(self, key))
    }

    fn remove(&self, key: &CacheKey) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (fleet, k) = (Arc::clone(&self.fleet), self.fleet.key("e", key.as_str()));
            rt.spawn(async move {
                let _ = fleet.run("DEL", fleet.client().del::<i64, _>(k)).await;
            });
        }
    }

    /// What this tier did since start (the connection's errors, refusals and purges with it).
    fn counts(&self) -> TierCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let f = &self.fleet.counts;
        TierCounts {
            errors: get(&f.errors),
            refused: get(&f.refused),
            purges_sent: get(&f.purges_sent),
            purges_received: get(&f.purges_received),
            local_decisions: get(&f.local_decisions),
            connected: Some(self.fleet.is_connected()),
            ..self.stats.snapshot(Tier::Shared)
        }
    }
}

impl Shared {
    /// The record stored under `key`: `Ok(None)` when there is none (or none that passes its
    /// signature), `Err` when the tier is unavailable (not connected, or the command failed).
    pub(super) async fn read(&self, key: &CacheKey) -> Result<Option<Bytes>, Unavailable> {
        let found = self.read_quiet(key).await;
        let counter = match found {
            Ok(Some(_)) => &self.stats.hits,
            _ => &self.stats.misses,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Writes `record` under `key` for `ttl`, and indexes it under its tags.
    pub(super) async fn write(
        &self,
        key: &CacheKey,
        record: Bytes,
        ttl: Duration,
        tags: &[Box<str>],
    ) {
        let fleet = &self.fleet;
        if record.len() as u64 > fleet.config().max_object_size.0 {
            return;
        }
        let record = fleet.seal(Kind::Entry, key.as_str(), record);
        let k = fleet.key("e", key.as_str());
        let ms = ttl.as_millis().clamp(1, i64::MAX as u128) as i64;
        let set = fleet.client().set::<(), _, _>(
            k.clone(),
            record,
            Some(Expiration::PX(ms)),
            None,
            false,
        );
        if fleet.run("SET", set).await.is_some() {
            self.stats.writes.fetch_add(1, Ordering::Relaxed);
        }
        for tag in tags {
            let t = fleet.key("t", tag);
            let _ = fleet
                .run(
                    "SADD",
                    fleet.client().sadd::<(), _, _>(t.clone(), k.clone()),
                )
                .await;
            // The index lives as long as its longest record (GT: never shortened).
            let expire = fleet.client().expire::<(), _>(t, ms / 1000 + 1, None);
            let _ = fleet.run("EXPIRE", expire).await;
        }
    }

    /// A record found while taking the lease (another node had just written it): a hit of
    /// this tier, as a read that finds one is, and a lease wait. (Counted only as a wait, a node
    /// that got every answer this way showed no hit of the tier.)
    fn found_after_lease(&self) {
        self.stats.hits.fetch_add(1, Ordering::Relaxed);
        self.stats.lease_waits.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes the lease of `key` or, when another node holds it, waits (at most the lease's
    /// duration) for that node's record.
    pub(super) async fn lease(self: &Arc<Self>, key: &CacheKey) -> Leasing {
        let fleet = &self.fleet;
        let lk = fleet.key("l", key.as_str());
        let token = format!(
            "{}/{}",
            fleet.node(),
            self.leases.fetch_add(1, Ordering::Relaxed)
        );
        let duration = fleet.config().lease.0;
        let deadline = Instant::now() + duration;
        let mut waited = false;
        loop {
            let ms = duration.as_millis() as i64;
            let take = fleet.client().set::<Option<String>, _, _>(
                lk.clone(),
                token.clone(),
                Some(Expiration::PX(ms)),
                Some(SetOptions::NX),
                false,
            );
            match fleet.run("SET NX", take).await {
                None => return Leasing::None,
                Some(Some(_)) => {
                    let lease = Lease {
                        shared: Arc::clone(self),
                        key: lk,
                        token,
                    };
                    // The node that held the lease may have written its record and let the
                    // lease go between this node's read and its SET: look once more, so that
                    // a record written is never fetched again (the lease is let go at once).
                    if let Ok(Some(record)) = self.read_quiet(key).await {
                        self.found_after_lease();
                        return Leasing::Filled(record);
                    }
                    return Leasing::Held(lease);
                }
                Some(None) => {} // held by another node
            }
            // Wait for the holder's record, polling; take the lease if it goes without one.
            loop {
                if Instant::now() >= deadline {
                    return Leasing::None;
                }
                tokio::time::sleep(Duration::from_millis(if waited { 20 } else { 5 })).await;
                waited = true;
                if let Ok(Some(record)) = self.read_quiet(key).await {
                    self.found_after_lease();
                    return Leasing::Filled(record);
                }
                let held: Option<Option<String>> =
                    fleet.run("GET", fleet.client().get(lk.clone())).await;
                match held {
                    None => return Leasing::None,
                    Some(None) => break, // released without a record: try to take it
                    Some(Some(_)) => {}
                }
            }
        }
    }

    /// A read, not counted (waiting on a lease, each poll is not a miss).
    async fn read_quiet(&self, key: &CacheKey) -> Result<Option<Bytes>, Unavailable> {
        let fleet = &self.fleet;
        let k = fleet.key("e", key.as_str());
        let value: Option<Bytes> = fleet
            .run("GET", fleet.client().get(k))
            .await
            .ok_or(Unavailable)?;
        Ok(value.and_then(|v| fleet.open(Kind::Entry, key.as_str(), v)))
    }

    async fn release(&self, key: &str, token: &str) {
        const RELEASE: &str =
            "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
        let eval = self
            .fleet
            .client()
            .eval::<i64, _, _, _>(RELEASE, key, token);
        let _ = self.fleet.run("EVAL", eval).await;
    }

    /// Removes what `target` names from the shared tier, and tells every node (through the
    /// purge stream) to remove it from its memory and disk.
    pub(super) async fn purge(&self, target: &Purge, ban: &Ban) {
        let fleet = &self.fleet;
        fleet
            .announce_purge(vec![
                ("kind", ban.kind.clone()),
                ("target", ban.target.clone()),
                ("at", ban.at_ms.to_string()),
            ])
            .await;
        let keys: Vec<String> = match target {
            Purge::Url(k) => vec![fleet.key("e", k.as_str())],
            Purge::Tag(tag) => {
                let t = fleet.key("t", tag);
                let members: Option<Vec<String>> = fleet
                    .run("SMEMBERS", fleet.client().smembers(t.clone()))
                    .await;
                let mut keys = members.unwrap_or_default();
                keys.push(t);
                keys
            }
            Purge::Prefix(prefix) => fleet.scan(&fleet.key("e", prefix)).await,
        };
        // One key per command: in a cluster, keys of one DEL must share a slot.
        for k in keys {
            let _ = fleet.run("DEL", fleet.client().del::<i64, _>(k)).await;
        }
    }

    /// Every purge the stream holds (what was purged while this node was away), and the id
    /// of the last: read at start, before serving. `None` when Redis did not answer.
    pub(super) async fn purges_so_far(&self) -> Option<(String, Vec<Ban>)> {
        let (last, entries) = self.fleet.purges_so_far().await?;
        Some((last, entries.iter().map(ban_of).collect()))
    }

    /// Follows the purge stream after the entry `from`, calling `apply` with the purges other
    /// nodes made, a batch at a time, until the process ends.
    pub(super) fn follow(&self, from: String, apply: impl Fn(Vec<Ban>) + Send + Sync + 'static) {
        self.fleet.follow_purges(from, move |entries| {
            apply(entries.iter().map(ban_of).collect())
        });
    }
}

/// The ban a purge stream entry announces.
fn ban_of(e: &StreamEntry) -> Ban {
    Ban {
        kind: e.field("kind").into(),
        target: e.field("target").into(),
        at_ms: e.field("at").parse().unwrap_or(0),
    }
}
