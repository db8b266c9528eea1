//! What every tier below memory is to the walk ([`super::Cache::find`]): a [`Storage`] of
//! records by key (pingora's `Storage`, foyer's engines), which [`super::tiers`] reads in order,
//! disk then shared; and what each tier counts ([`Stats`], shown as [`TierCounts`]). The memory
//! tier is not one: a hit is a hash probe with no dyn call (`memory.rs`), and only a memory miss
//! reaches a `Storage`.
//!
//! Imported by the tiers (`disk.rs`, `shared.rs`) and by `tiers.rs`, which imports them: the
//! traits and counters sit below both, so that no file of the folder imports one that imports it
//! back.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use super::key::CacheKey;

/// Which tier an entry came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Disk,
    Shared,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Disk => "disk",
            Tier::Shared => "shared",
        }
    }
}

/// The tier did not answer (not connected, or the read failed): a miss asks it nothing more, so
/// that it waits at most one `timeout` for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Unavailable;

/// A read in flight (boxed: tiers below memory are read behind `dyn`, a disk read or a round
/// trip costs more than the allocation).
pub(super) type Reading<'a> =
    Pin<Box<dyn Future<Output = Result<Option<Bytes>, Unavailable>> + Send + 'a>>;

/// A tier below memory: records (an entry's encoding, [`super::record`]) by key.
pub(super) trait Storage: Send + Sync {
    /// Which tier this is.
    fn tier(&self) -> Tier;

    /// The record stored under `key`: `Ok(None)` when there is none, `Err` when the tier did not
    /// answer. Counted as a hit or a miss.
    fn read<'a>(&'a self, key: &'a CacheKey) -> Reading<'a>;

    /// A record read from it that the walk could not use (not whole, purged since, or not
    /// answering the request): the disk drops it, the shared tier keeps it (other nodes' own
    /// bans and requests decide there).
    fn unusable(&self, _key: &CacheKey) {}

    /// Drops the record under `key` (invalidated here), in the background.
    fn remove(&self, key: &CacheKey);

    /// What the tier did since start.
    fn counts(&self) -> TierCounts;
}

/// What one tier did since start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierCounts {
    pub tier: Tier,
    pub hits: u64,
    pub misses: u64,
    pub writes: u64,
    /// Reads that failed (disk), commands that failed or timed out (shared).
    pub errors: u64,
    /// Misses answered by another node's fill after waiting on its lease (shared).
    pub lease_waits: u64,
    /// Purges sent to and received from the other nodes (shared).
    pub purges_sent: u64,
    pub purges_received: u64,
    /// Values refused for their signature (shared, with `shared_key`).
    pub refused: u64,
    /// Fleet-wide rate limits decided on this node alone, Redis away (shared).
    pub local_decisions: u64,
    /// Whether the client is connected now (shared).
    pub connected: Option<bool>,
}

/// What a tier did, counted as it happens (read as [`TierCounts`]).
#[derive(Default)]
pub(super) struct Stats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub writes: AtomicU64,
    pub errors: AtomicU64,
    pub lease_waits: AtomicU64,
}

impl Stats {
    pub(super) fn snapshot(&self, tier: Tier) -> TierCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        TierCounts {
            tier,
            hits: get(&self.hits),
            misses: get(&self.misses),
            writes: get(&self.writes),
            errors: get(&self.errors),
            lease_waits: get(&self.lease_waits),
            purges_sent: 0,
            purges_received: 0,
            refused: 0,
            local_decisions: 0,
            connected: None,
        }
    }
}
