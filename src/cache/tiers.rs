//! The tiers below memory, as the [`Cache`](super::Cache) façade uses them: where a memory miss
//! looks next (disk, then shared), what a fill writes down, and how a purge reaches them.
//!
//! A record read from below is decoded ([`Entry::decode`]), checked against the purges made
//! since it was stored (`bans.rs`) and against the request's selecting fields (a tier
//! keeps one record per URL), and promoted: stored in memory, and on disk when it came from the
//! shared tier. Its age counts from when the origin answered, across restarts and nodes
//! (the record keeps wall-clock times).

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use tokio::sync::mpsc;

use super::bans::{Ban, Bans};
use super::disk::Disk;
use super::entry::Entry;
use super::key::CacheKey;
use super::shared::{Leasing, Shared, Unavailable};
use super::Purge;
use crate::clock::Clock;
use crate::config::{CacheConfig, DiskWrite};

pub use super::shared::Lease;

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

/// A write to the shared tier, waiting in its queue.
struct SharedWrite {
    key: CacheKey,
    record: Bytes,
    ttl: Duration,
    tags: Box<[Box<str>]>,
    /// Released once the record is written.
    lease: Option<Lease>,
}

/// Queues of shared-tier writes, and writes waiting in each at most (beyond, a write is
/// dropped: it is a cache).
const WRITE_QUEUES: usize = 8;
const WRITE_QUEUE: usize = 1024;

/// What a memory miss found below.
pub enum Below {
    /// A stored response that answers the request (already promoted to memory).
    Found(Arc<Entry>, Tier),
    /// Nothing; this node holds the URL's lease in the shared tier until the guard drops.
    Leased(Lease),
    /// Nothing (and no lease: no shared tier, or it is unavailable).
    Miss,
}

/// What reading the shared tier gave.
pub(super) enum SharedRead {
    Found(Box<Entry>),
    /// No record that answers the request (none, or one not whole, purged, or refused).
    Absent,
    /// The tier did not answer (not connected, or the read failed): a miss asks it nothing
    /// more, so that it waits at most one `timeout` for it.
    Unavailable,
}

/// What asking for a lease gave.
pub(super) enum Leased {
    Held(Lease),
    /// The node holding it filled the URL: its entry.
    Filled(Box<Entry>),
    No,
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
    /// Whether the client is connected now (shared).
    pub connected: Option<bool>,
}

/// What a tier did, counted as it happens (read by [`Tiers::counts`]).
#[derive(Default)]
pub(super) struct Stats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub writes: AtomicU64,
    pub errors: AtomicU64,
    pub lease_waits: AtomicU64,
    pub purges_sent: AtomicU64,
    pub purges_received: AtomicU64,
    pub refused: AtomicU64,
}

impl Stats {
    fn snapshot(&self, tier: Tier) -> TierCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        TierCounts {
            tier,
            hits: get(&self.hits),
            misses: get(&self.misses),
            writes: get(&self.writes),
            errors: get(&self.errors),
            lease_waits: get(&self.lease_waits),
            purges_sent: get(&self.purges_sent),
            purges_received: get(&self.purges_received),
            refused: get(&self.refused),
            connected: None,
        }
    }
}

/// Why a tier could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Disk(#[from] super::disk::OpenError),
    #[error(transparent)]
    Shared(#[from] super::shared::OpenError),
}

/// The tiers below memory.
pub(super) struct Tiers {
    pub(super) disk: Option<Disk>,
    pub(super) shared: Option<Arc<Shared>>,
    /// Queues of writes to the shared tier, by the key's hash: one URL's writes land in the
    /// order they were made (a record written before its variants were built never lands
    /// after the complete one), different URLs' in parallel.
    writes: Vec<mpsc::Sender<SharedWrite>>,
    pub(super) bans: Bans,
    /// Whether the disk tier gets every stored response (else only the evicted).
    pub(super) disk_all: bool,
    /// The longest a stale response may still be served, by the cache settings.
    grace: Duration,
    /// Which disk hits go into memory.
    pub(super) doorkeeper: Doorkeeper,
    /// The cache-status field every delivery of a record adds ([`Entry::reserve_stamp`]).
    status_header: http::HeaderName,
    /// The cache's wall clock (records' lifetimes, bans' times).
    clock: Clock,
}

/// Which disk hits are promoted to memory: a record read from the disk goes into memory on its
/// second read within a while, not on its first (TinyLFU's doorkeeper, the CDNs' "cache on
/// second hit"). An object read once (a crawler, a scan) then costs a disk read, not the eviction
/// of something memory holds for a reason, nor the insert and the eviction's free; an object read
/// again goes in on that read. A direct-mapped table of recent keys' hashes, about one slot per
/// 8 KiB of memory: a key whose slot another key took since is read from disk once more.
pub(super) struct Doorkeeper {
    hasher: RandomState,
    slots: Box<[AtomicU64]>,
}

impl Doorkeeper {
    fn new(memory_bytes: u64) -> Doorkeeper {
        let n = (memory_bytes / 8192)
            .clamp(1024, 1 << 20)
            .next_power_of_two();
        Doorkeeper {
            hasher: RandomState::new(),
            slots: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Whether `key` was read recently (it is let in now); otherwise notes that it was.
    pub(super) fn admit(&self, key: &CacheKey) -> bool {
        let h = self.hasher.hash_one(key.as_str()) | 1; // never 0, an empty slot
        let slot = &self.slots[h as usize & (self.slots.len() - 1)];
        if slot.load(Ordering::Relaxed) == h {
            slot.store(0, Ordering::Relaxed);
            true
        } else {
            slot.store(h, Ordering::Relaxed);
            false
        }
    }
}

impl Tiers {
    /// The tiers `cfg` sets up; `None` when it sets up none.
    pub(super) async fn open(cfg: &CacheConfig, clock: Clock) -> Result<Option<Tiers>, OpenError> {
        if cfg.disk.is_none() && cfg.shared.is_none() {
            return Ok(None);
        }
        let disk = match &cfg.disk {
            Some(d) => Some(Disk::open(d).await?),
            None => None,
        };
        let shared = match &cfg.shared {
            Some(s) => {
                let shared = Arc::new(Shared::connect(s)?);
                // A Redis that is down delays the start by this much at most.
                if !shared.connected(Duration::from_secs(2)).await {
                    tracing::warn!(
                        server = shared.shown_url(),
                        "shared tier not reachable at start; serving without it until it is \
                         (connecting in the background)"
                    );
                }
                Some(shared)
            }
            None => None,
        };
        let writes = match &shared {
            None => Vec::new(),
            Some(shared) => (0..WRITE_QUEUES)
                .map(|_| {
                    let (tx, mut rx) = mpsc::channel::<SharedWrite>(WRITE_QUEUE);
                    let shared = Arc::clone(shared);
                    tokio::spawn(async move {
                        while let Some(w) = rx.recv().await {
                            shared.write(&w.key, w.record, w.ttl, &w.tags).await;
                            drop(w.lease);
                        }
                    });
                    tx
                })
                .collect(),
        };
        let bans = Bans::load(
            cfg.disk.as_ref().map(|d| d.dir.join("bans.json")),
            clock.now(),
        );
        let grace = [
            cfg.stale_while_revalidate.0,
            cfg.stale_if_error.0,
            cfg.stale_if_disconnected.0,
        ]
        .into_iter()
        .max()
        .unwrap_or_default();
        Ok(Some(Tiers {
            disk,
            shared,
            writes,
            bans,
            disk_all: cfg.disk.as_ref().is_some_and(|d| d.write == DiskWrite::All),
            grace,
            doorkeeper: Doorkeeper::new(cfg.max_size.0),
            status_header: cfg.status_header.0.clone(),
            clock,
        }))
    }

    /// What each tier did since start.
    pub(super) fn counts(&self) -> Vec<TierCounts> {
        let disk = self.disk.as_ref().map(|d| d.stats.snapshot(Tier::Disk));
        let shared = self.shared.as_ref().map(|s| TierCounts {
            connected: Some(s.is_connected()),
            ..s.stats.snapshot(Tier::Shared)
        });
        disk.into_iter().chain(shared).collect()
    }

    /// The disk's record of `key`, if it answers `request`.
    pub(super) async fn read_disk(&self, key: &CacheKey, request: &HeaderMap) -> Option<Entry> {
        let disk = self.disk.as_ref()?;
        let record = disk.read(key).await?;
        let entry = self.usable(key, record, request);
        if entry.is_none() {
            disk.remove(key);
        }
        entry
    }

    /// The shared tier's record of `key`, if it answers `request`.
    pub(super) async fn read_shared(&self, key: &CacheKey, request: &HeaderMap) -> SharedRead {
        let Some(shared) = &self.shared else {
            return SharedRead::Unavailable;
        };
        match shared.read(key).await {
            Err(Unavailable) => SharedRead::Unavailable,
            Ok(None) => SharedRead::Absent,
            Ok(Some(record)) => match self.usable(key, record, request) {
                Some(entry) => SharedRead::Found(Box::new(entry)),
                None => SharedRead::Absent,
            },
        }
    }

    /// Takes the shared tier's lease of `key`, or the record of the node that held it.
    pub(super) async fn lease(&self, key: &CacheKey, request: &HeaderMap) -> Leased {
        let Some(shared) = &self.shared else {
            return Leased::No;
        };
        match shared.lease(key).await {
            Leasing::Held(lease) => Leased::Held(lease),
            Leasing::Filled(record) => match self.usable(key, record, request) {
                Some(entry) => Leased::Filled(Box::new(entry)),
                None => Leased::No,
            },
            Leasing::None => Leased::No,
        }
    }

    /// A record, decoded, if it is whole, not purged since, and answers `request`.
    fn usable(&self, key: &CacheKey, record: Bytes, request: &HeaderMap) -> Option<Entry> {
        let mut entry = match Entry::decode(record) {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!(key = key.as_str(), error = %e, "stored record not read");
                return None;
            }
        };
        if self.bans.bans(key, &entry) || !entry.selection.matches(request) {
            return None;
        }
        entry.reserve_stamp(&self.status_header);
        Some(entry)
    }

    /// Writes `entry` down: to the shared tier, then releases `lease` (so that the nodes waiting
    /// on it find the record); to the disk when `complete` (its compressed variants built) and
    /// the disk takes every response. In the background.
    pub(super) fn write(
        &self,
        key: &CacheKey,
        entry: &Arc<Entry>,
        complete: bool,
        lease: Option<Lease>,
    ) {
        let to_disk = complete && self.disk_all && self.disk.is_some();
        if !to_disk && self.writes.is_empty() {
            return;
        }
        let Ok(record) = entry.encode() else {
            return;
        };
        if let (true, Some(disk)) = (to_disk, &self.disk) {
            disk.write(key, record.clone());
        }
        if !self.writes.is_empty() {
            let mut h = std::hash::DefaultHasher::new();
            std::hash::Hash::hash(key, &mut h);
            let queue = &self.writes[std::hash::Hasher::finish(&h) as usize % self.writes.len()];
            let _ = queue.try_send(SharedWrite {
                key: key.clone(),
                record,
                ttl: self.ttl(entry),
                tags: entry.tags.clone(),
                lease,
            });
        }
    }

    /// Writes an entry to the disk: one read from the shared tier, or, with `evicted`, one
    /// memory let go of (`write = "evicted"`); the disk takes each only in its own mode.
    pub(super) fn write_disk(&self, key: &CacheKey, entry: &Entry, evicted: bool) {
        if let (Some(disk), true) = (&self.disk, self.disk_all != evicted) {
            if let Ok(record) = entry.encode() {
                disk.write(key, record);
            }
        }
    }

    /// Drops `key`'s records here and in the shared tier (an invalidation by this node).
    pub(super) fn forget(&self, key: &CacheKey) {
        if let Some(disk) = &self.disk {
            disk.remove(key);
        }
        if let (Some(shared), Ok(rt)) = (&self.shared, tokio::runtime::Handle::try_current()) {
            let (shared, key) = (Arc::clone(shared), key.clone());
            rt.spawn(async move { shared.delete(&key).await });
        }
    }

    /// How long a record of `entry` is of use: its remaining lifetime, then its stale windows,
    /// and, when it can be revalidated, as long again as its lifetime (a 304 is cheaper than a
    /// full fetch).
    fn ttl(&self, entry: &Entry) -> Duration {
        let f = &entry.freshness;
        let now = self.clock.now();
        let stale = [f.stale_while_revalidate, f.stale_if_error, self.grace]
            .into_iter()
            .max()
            .unwrap_or_default();
        let revalidatable = entry.etag.is_some() || entry.last_modified.is_some();
        let keep = f.lifetime.saturating_sub(f.current_age(now))
            + stale
            + if revalidatable {
                f.lifetime
            } else {
                Duration::ZERO
            };
        keep.max(Duration::from_secs(1))
    }

    /// Applies a purge made on this node: kept as a ban, dropped from the disk (a URL), and sent
    /// to the shared tier and every other node.
    pub(super) fn purge(&self, target: &Purge) {
        let ban = Ban::of(target, self.clock.now());
        if let (Some(disk), Purge::Url(key)) = (&self.disk, target) {
            disk.remove(key);
        }
        self.bans.add(ban.clone());
        if let Some(shared) = &self.shared {
            let (shared, target) = (Arc::clone(shared), target.clone());
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move { shared.purge(&target, &ban).await });
            }
        }
    }

    /// Applies purges other nodes made (from the purge stream): kept as bans, dropped from the
    /// disk; the purges themselves are returned for the memory tier.
    pub(super) fn purged_elsewhere(&self, bans: Vec<Ban>) -> Vec<Purge> {
        let purges: Vec<Purge> = bans.iter().filter_map(Ban::purge).collect();
        if let Some(disk) = &self.disk {
            for p in &purges {
                if let Purge::Url(key) = p {
                    disk.remove(key);
                }
            }
        }
        self.bans.add_all(bans);
        purges
    }
}
